/* SPDX-License-Identifier: MIT */
/*
 * test_recon_fork.c - a child forked while a session's reconnect attempt
 * is between steps keeps no copy of the new connection's socket, as a
 * child forked during chime_open() keeps none (fork_child()): held by a
 * child, it kept the session attached after its parent died (EBUSY for
 * its next process). Before, the attempt's socket was in a local from
 * socket() until connect_broker() returned, and again from dial_end()
 * until it was closed, and a child forked then held it (found by a
 * review). mremap() and connect() are wrapped (-Wl,--wrap) so that the
 * fork lands in each of those windows: in attempt() as it maps the new
 * segments, and in connect_broker() right after the connect. And
 * epoll_ctl(), to fail the last step of a reconnect.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"
#include "client.h"
#include "helpers.h"

#define MS 1000000ull

static struct t_chimed tb;
static volatile int hook_mremap, hook_connect;
static volatile int child_saw = -1;     /* sockets to the broker in the child; -1: no fork made */

/* In a fresh child: how many sockets whose peer is the broker's process it holds. */
static void fork_and_count(void)
{
	pid_t pid = fork();
	int st;

	if (pid == 0) {
		DIR *d = opendir("/proc/self/fd");
		struct dirent *e;
		int n = 0;

		while (d && (e = readdir(d))) {
			int fd = atoi(e->d_name);
			struct ucred cr;
			socklen_t len = sizeof(cr);
			struct stat sb;

			if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &sb) < 0 || !S_ISSOCK(sb.st_mode))
				continue;
			if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid == tb.pid)
				n++;
		}
		_exit(n);
	}
	if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st))
		child_saw = WEXITSTATUS(st);
}

void *__real_mremap(void *old, size_t old_size, size_t new_size, int flags, ...);
void *__wrap_mremap(void *old, size_t old_size, size_t new_size, int flags, ...);
void *__wrap_mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
	va_list ap;
	void *to;

	va_start(ap, flags);
	to = va_arg(ap, void *);
	va_end(ap);
	if (hook_mremap) {
		hook_mremap = 0;
		fork_and_count();       /* attempt(), past dial_end(): the new socket not yet on c->sock */
	}
	return __real_mremap(old, old_size, new_size, flags, to);
}

int __real_connect(int fd, const struct sockaddr *sa, socklen_t len);
int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len);
int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int r = __real_connect(fd, sa, len);

	if (r == 0 && hook_connect) {
		hook_connect = 0;
		fork_and_count();       /* connect_broker(), before it returned the socket */
	}
	return r;
}

static volatile int fail_epoll_add_of = -1;   /* the descriptor whose EPOLL_CTL_ADD fails, once */

int __real_epoll_ctl(int ep, int op, int fd, struct epoll_event *ev);
int __wrap_epoll_ctl(int ep, int op, int fd, struct epoll_event *ev);
int __wrap_epoll_ctl(int ep, int op, int fd, struct epoll_event *ev)
{
	if (op == EPOLL_CTL_ADD && fd == fail_epoll_add_of) {
		fail_epoll_add_of = -1;
		errno = ENOMEM;
		return -1;
	}
	return __real_epoll_ctl(ep, op, fd, ev);
}

/* A session on the test's broker. */
static chime_t *sopen_ok(const char *session)
{
	struct chime_opts o = { .socket_path = tb.sock, .session = session };
	chime_t *c = NULL;
	int r = chime_open(&c, &o);

	cr_assert_eq(r, 0, "chime_open(session '%s'): %s", session, strerror(-r));
	return c;
}

static void stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(recon_fork, .fini = stop, .timeout = 60);

static void fork_during_reconnect(volatile int *hook)
{
	struct chime_event ev[4];
	chime_id_t id;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 1"), 0);
	c = sopen_ok("forkrecon");
	cr_assert_eq(chime_arm(c, 0, now_ns() + 3600000 * MS, 0, 1, &id), 0);
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, "-n 1"), 0);
	*hook = 1;
	for (uint64_t end = now_ns() + 8000 * MS; c->reconnects == 0 && now_ns() < end;) {
		cr_assert_geq(chime_poll(c, ev, 4), 0);
		usleep(2000);
	}
	cr_assert_eq(c->reconnects, 1, "no reconnect: nothing tested");
	cr_assert_neq(child_saw, -1, "the hook never forked");
	cr_assert_eq(child_saw, 0, "a child forked during the reconnect holds %d socket(s) to the broker", child_saw);
	chime_close(c);
}

Test(recon_fork, a_child_forked_while_the_attempt_maps_holds_no_socket_of_it)
{
	fork_during_reconnect(&hook_mremap);
}

Test(recon_fork, a_child_forked_while_the_attempt_connects_holds_no_socket_of_it)
{
	fork_during_reconnect(&hook_connect);
}

/* The control: a child forked once the reconnect is done holds none (fork_child() closes c->sock). */
Test(recon_fork, control_a_child_forked_after_the_reconnect_holds_none)
{
	struct chime_event ev[4];
	chime_t *c;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 1"), 0);
	c = sopen_ok("forkrecon");
	fork_and_count();
	cr_assert_eq(child_saw, 0, "before: %d", child_saw);
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, "-n 1"), 0);
	for (uint64_t end = now_ns() + 8000 * MS; c->reconnects == 0 && now_ns() < end;) {
		cr_assert_geq(chime_poll(c, ev, 4), 0);
		usleep(2000);
	}
	cr_assert_eq(c->reconnects, 1);
	child_saw = -1;
	fork_and_count();
	cr_assert_eq(child_saw, 0, "after: %d", child_saw);
	chime_close(c);
}

/*
 * A reconnect that attached, then could not put its socket in chime_fd()'s
 * set (ENOMEM), gives the session up (-ENOTCONN) and must hang up: before,
 * its connection stayed attached, and the session's next process got
 * EBUSY (after the broker's 1 s wait) until this chime_t was closed
 * (found by a review of the reconnect).
 */
Test(recon_fork, a_reconnect_given_up_after_it_attached_hangs_up)
{
	struct chime_event ev[4];
	struct chime_opts o = { 0 };
	chime_t *c, *next = NULL;
	int r = 0;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 1"), 0);
	c = sopen_ok("givenup");
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, "-n 1"), 0);
	fail_epoll_add_of = c->sock;            /* a reconnect dup3()s its socket onto this number */
	for (uint64_t end = now_ns() + 8000 * MS; !c->dead && now_ns() < end;) {
		r = chime_poll(c, ev, 4);
		usleep(2000);
	}
	cr_assert_eq(fail_epoll_add_of, -1, "the reconnect never came to the epoll_ctl()");
	cr_assert(c->dead, "not given up: %s", strerror(-r));
	cr_assert_eq(chime_poll(c, ev, 4), -ENOTCONN);
	o.socket_path = tb.sock;
	o.session = "givenup";
	r = chime_open(&next, &o);
	cr_assert_eq(r, 0, "the session's next open, the given-up chime_t still open: %s", strerror(-r));
	chime_close(next);
	chime_close(c);
}
