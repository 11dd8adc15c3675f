/* SPDX-License-Identifier: MIT */
/*
 * A client's system calls failing one at a time: every call libchime
 * makes from chime_open() to chime_close() (socket, connect, the
 * handshake's sends and receives, the segments' mappings and seals, the
 * descriptors of chime_fd(), the waits) is failed in turn, the first time
 * it is made, then the second, and so on, with the errno the kernel gives
 * for want of a resource (or EINTR, for the calls a signal interrupts).
 * Whatever fails, the client gets a negative errno or carries on, never
 * crashes or hangs, leaks no descriptor of its own, and loses no event:
 * a lifecycle whose calls all succeeded received its timer. The broker
 * keeps no descriptor of the connections that failed half way (its count
 * settles where it began), and takes the next client as the first.
 *
 * The calls are wrapped at link time (-Wl,--wrap=NAME, tests/meson.build),
 * in libchime's static archive and this file alike, and fail only while a
 * lifecycle runs (armed).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "chime.h"
#include "helpers.h"

/* ---- the wrapped calls ---- */

/* Each one a lifecycle makes (its waits are io_uring's, liburing's raw system calls, not here). */
enum call {
	C_SOCKET, C_CONNECT, C_SETSOCKOPT, C_SEND, C_RECV, C_RECVMSG, C_FSTAT64, C_MMAP64, C_MADVISE,
	C_EPOLL_CREATE1, C_EPOLL_CTL, C_EVENTFD, C_TIMERFD_CREATE, C_WRITE, C_READ, NR_CALLS
};

static const struct {
	const char *name;
	int err;                /* what the kernel says for want of a resource, or a signal */
} calls[NR_CALLS] = {
	[C_SOCKET] = { "socket", EMFILE },             [C_CONNECT] = { "connect", EINTR },
	[C_SETSOCKOPT] = { "setsockopt", ENOMEM },     [C_SEND] = { "send", ENOBUFS },
	[C_RECV] = { "recv", EINTR },                  [C_RECVMSG] = { "recvmsg", EINTR },
	[C_FSTAT64] = { "fstat", ENOMEM },             [C_MMAP64] = { "mmap", ENOMEM },
	[C_MADVISE] = { "madvise", ENOMEM },           [C_EPOLL_CREATE1] = { "epoll_create1", EMFILE },
	[C_EPOLL_CTL] = { "epoll_ctl", ENOMEM },       [C_EVENTFD] = { "eventfd", EMFILE },
	[C_TIMERFD_CREATE] = { "timerfd_create", EMFILE }, [C_WRITE] = { "write", EAGAIN },
	[C_READ] = { "read", EINTR },
};

static volatile int armed;             /* inject only while a lifecycle runs */
static int open_err;                    /* what chime_open() returned, the last lifecycle */
static int target = -1;                 /* the call to fail, */
static unsigned nth;                    /* its nth time (1-based) since armed */
static unsigned seen[NR_CALLS];         /* calls made while armed */
static int fail_err;                    /* not 0: the errno to fail with, instead of calls[].err */

/* True if this call is the one to fail (errno set). */
static bool fail_now(enum call k)
{
	if (!armed)
		return false;
	seen[k]++;
	if ((int)k != target || seen[k] != nth)
		return false;
	errno = fail_err ? fail_err : calls[k].err;
	return true;
}

#define WRAP(ret, name, k, params, args, fail_ret)                               \
	ret __real_##name params;                                                \
	ret __wrap_##name params;                                                \
	ret __wrap_##name params                                                 \
	{                                                                        \
		if (fail_now(k))                                                 \
			return fail_ret;                                         \
		return __real_##name args;                                       \
	}

WRAP(int, socket, C_SOCKET, (int d, int t, int p), (d, t, p), -1)
WRAP(int, connect, C_CONNECT, (int fd, const struct sockaddr *a, socklen_t l), (fd, a, l), -1)
WRAP(int, setsockopt, C_SETSOCKOPT, (int fd, int lv, int o, const void *v, socklen_t l), (fd, lv, o, v, l), -1)
WRAP(ssize_t, send, C_SEND, (int fd, const void *b, size_t n, int f), (fd, b, n, f), -1)
WRAP(ssize_t, recv, C_RECV, (int fd, void *b, size_t n, int f), (fd, b, n, f), -1)
WRAP(ssize_t, recvmsg, C_RECVMSG, (int fd, struct msghdr *m, int f), (fd, m, f), -1)
/* With _FILE_OFFSET_BITS=64 (meson.build) glibc's headers name these fstat64 and mmap64. */
WRAP(int, fstat64, C_FSTAT64, (int fd, struct stat *st), (fd, st), -1)
WRAP(void *, mmap64, C_MMAP64, (void *a, size_t l, int p, int f, int fd, off_t o), (a, l, p, f, fd, o), MAP_FAILED)
WRAP(int, madvise, C_MADVISE, (void *a, size_t l, int adv), (a, l, adv), -1)
WRAP(int, epoll_create1, C_EPOLL_CREATE1, (int f), (f), -1)
WRAP(int, epoll_ctl, C_EPOLL_CTL, (int ep, int op, int fd, struct epoll_event *ev), (ep, op, fd, ev), -1)
WRAP(int, eventfd, C_EVENTFD, (unsigned v, int f), (v, f), -1)
WRAP(int, timerfd_create, C_TIMERFD_CREATE, (int c, int f), (c, f), -1)
WRAP(ssize_t, write, C_WRITE, (int fd, const void *b, size_t n), (fd, b, n), -1)
WRAP(ssize_t, read, C_READ, (int fd, void *b, size_t n), (fd, b, n), -1)

/* ---- a client's lifecycle ---- */

static char dir[64], sock[96];
static struct t_chimed broker;

static void setup(void)
{
	cr_assert_eq(t_mkdtemp(dir, sizeof(dir), "chime-failcall"), 0);
	snprintf(sock, sizeof(sock), "%s/s", dir);
	cr_assert_eq(t_chimed_start(&broker, sock, "--shards 2"), 0, "chimed did not come up");
}

static void teardown(void)
{
	t_chimed_stop(&broker, SIGTERM);
	t_rmdir_files(dir);
}

static int count_fds(void)
{
	return t_count_files("/proc/self/fd") - 1;      /* the DIR's own */
}

enum outcome { ALL_DONE, A_CALL_FAILED };

/*
 * Open, arm a timer 20 ms ahead, wait for it (3 s at most), close, the
 * call to fail armed throughout. What a failed call returned is named in
 * *what. A failure anywhere is fine, said with a negative errno; a leak
 * of a descriptor, a lost event, or a crash (the test's) is not.
 */
static enum outcome lifecycle(const char *session, char *what, size_t len)
{
	struct chime_opts o = { .socket_path = sock, .session = session };
	struct chime_event ev[4];
	chime_t *c = NULL;
	chime_id_t id = 0;
	int fds = count_fds(), r, n = 0;
	enum outcome out = ALL_DONE;

	memset(seen, 0, sizeof(seen));
	what[0] = '\0';
	armed = 1;
	r = open_err = chime_open(&c, &o);
	if (r < 0) {
		armed = 0;
		snprintf(what, len, "chime_open: %d (%s)", r, strerror(-r));
		cr_assert_null(c, "%s, and a chime_t set", what);
		cr_assert_eq(count_fds(), fds, "%s, leaving %d descriptors open", what, count_fds() - fds);
		return A_CALL_FAILED;
	}
	r = chime_arm(c, 1, chime_now() + 20 * 1000000ull, 0, 7, &id);
	if (r < 0) {
		snprintf(what, len, "chime_arm: %d (%s)", r, strerror(-r));
		out = A_CALL_FAILED;
	} else {
		uint64_t end = chime_now() + 3000 * 1000000ull;

		/* A signal (EINTR) ends a wait: another, as an application would. */
		while (n == 0 && chime_now() < end) {
			n = chime_wait(c, ev, 4, 3000);
			if (n < 0 && n != -EINTR) {
				snprintf(what, len, "chime_wait: %d (%s)", n, strerror(-n));
				out = A_CALL_FAILED;
				break;
			}
			n = n < 0 ? 0 : n;
		}
	}
	chime_close(c);
	armed = 0;
	cr_assert_eq(count_fds(), fds, "%s%sclosed, %d descriptors still open", what, *what ? "; " : "",
		     count_fds() - fds);
	if (out == ALL_DONE) {
		cr_assert_eq(n, 1, "every call succeeded, and the timer's event did not come in 3 s");
		cr_assert(ev[0].id == id && ev[0].user_data == 7, "another event than the timer's");
	}
	return out;
}

/*
 * A named session dropped between lifecycles, so that none begins with an
 * event an earlier one armed and never waited for (held for the next
 * opener). Its last process may still be detaching: EBUSY a moment.
 */
static void session_drop(const char *session)
{
	struct chime_opts o = { .socket_path = sock, .session = session };
	int r = -EBUSY;

	for (int i = 0; i < 200 && r == -EBUSY; i++) {
		r = chime_drop_session(&o);
		if (r == -EBUSY)
			usleep(10 * 1000);
	}
	cr_assert(r == 0 || r == -ESRCH, "dropping session '%s': %d", session, r);
}

/* The broker's descriptors once it has let go of every client (what failed half way included): no more than want. */
static int broker_fds_settled(int want)
{
	int n = t_open_fds(broker.pid);

	for (int i = 0; i < 300 && n > want; i++) {
		usleep(10 * 1000);
		n = t_open_fds(broker.pid);
	}
	return n;
}

TestSuite(failcall, .init = setup, .fini = teardown, .timeout = 240);

/*
 * Each call in turn, each time it is made: the first lifecycle counts how
 * many times that is; each later one fails the next of them.
 */
static void every_call_failing(const char *session)
{
	char what[128];
	int base, runs = 0, failed = 0, absorbed = 0;
	unsigned made[NR_CALLS];

	target = -1;
	cr_assert_eq(lifecycle(session, what, sizeof(what)), ALL_DONE, "no failure injected: %s", what);
	if (session)
		session_drop(session);
	memcpy(made, seen, sizeof(made));
	/*
	 * Each listed call is one the lifecycle makes: a session's alone makes
	 * the timerfd, and the doorbell's write() and the eventfd's read() come
	 * only when a shard sleeps (CI once had none).
	 */
	for (int k = 0; k < NR_CALLS; k++)
		cr_assert(made[k] > 0 || (k == C_TIMERFD_CREATE && !session) || k == C_WRITE || k == C_READ,
			  "%s: never called (not wrapped?)", calls[k].name);
	base = t_open_fds_settled(broker.pid);         /* the first client let go of */
	cr_assert_gt(base, 0);
	for (int k = 0; k < NR_CALLS; k++) {
		for (nth = 1; nth <= made[k] + 1; nth++) {
			enum outcome o;

			target = k;
			o = lifecycle(session, what, sizeof(what));
			runs++;
			if (session)
				session_drop(session);
			if (seen[k] < nth)
				break;          /* made fewer times this run: none failed */
			if (o == A_CALL_FAILED)
				failed++;
			else
				absorbed++;
			/*
			 * A call of ours that failed is not the broker's doing: not
			 * a malformed or refused handshake, an untrusted broker, or
			 * a policy's refusal (a populate's ENOMEM was the broker's
			 * EPROTO, "another handshake").
			 */
			cr_assert(open_err != -EPROTO && open_err != -EBADMSG && open_err != -EPERM &&
				  open_err != -EACCES && open_err != -ECONNRESET, "%s #%u failing (%s): %s",
				  calls[k].name, nth, strerror(calls[k].err), what);
			if (getenv("FAILCALL_VERBOSE"))
				fprintf(stderr, "failcall: %s%s%s #%u of %u: %s\n", session ? session : "",
					session ? ": " : "", calls[k].name, nth, made[k], *what ? what : "absorbed");
			/* A failure half way through a handshake costs the broker nothing it keeps. */
			cr_assert_leq(broker_fds_settled(base), base, "%s #%u failing (%s): the broker keeps %d "
				      "descriptors more", calls[k].name, nth, *what ? what : "absorbed",
				      t_open_fds(broker.pid) - base);
		}
	}
	target = -1;
	cr_assert_eq(lifecycle(session, what, sizeof(what)), ALL_DONE, "after them: %s", what);
	fprintf(stderr, "failcall%s%s: %d lifecycles, %d with a call failed to the caller, %d absorbed "
		"(retried, or not needed)\n", session ? ", session " : "", session ? session : "", runs, failed,
		absorbed);
	cr_assert_gt(failed + absorbed, NR_CALLS, "the wraps saw too few calls: not linked with --wrap?");
}

Test(failcall, every_call_failing_once_leaves_the_client_whole_and_the_broker_clean)
{
	every_call_failing(NULL);
}

/* The same for a named session: its reconnect's timerfd, its close's wait for the broker to apply. */
Test(failcall, every_call_of_a_sessions_failing_once_leaves_it_whole)
{
	every_call_failing("failcall");
}

/*
 * A read of the connection that fails for a reason of this process's (no
 * memory for the recv(2)) is no hang-up: the broker is still there, and
 * an anonymous connection taken for gone returned -ENOTCONN from every
 * call after, its timers lost with a broker that ran on (an API audit).
 */
Test(failcall, a_failed_read_of_the_connection_is_not_the_broker_gone)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_event ev[4];
	chime_t *c = NULL;
	chime_id_t id = 0;
	int n = 0;

	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 50 * 1000000ull, 0, 7, &id), 0);
	/* The first recv(2) a drain makes: the wait's, once its rings are empty. */
	memset(seen, 0, sizeof(seen));
	target = C_RECV;
	nth = 1;
	fail_err = ENOMEM;
	armed = 1;
	for (int i = 0; i < 10 && n == 0; i++)
		n = chime_wait(c, ev, 4, 300);
	armed = 0;
	fail_err = 0;
	target = -1;
	cr_assert_geq(seen[C_RECV], 1, "the wait read nothing: no failure injected");
	cr_assert_eq(n, 1, "the wait said %d (%s) with the broker running", n, n < 0 ? strerror(-n) : "");
	cr_assert(ev[0].id == id && ev[0].user_data == 7);
	cr_assert_eq(chime_arm(c, 1, chime_now(), 0, 8, &id), 0);
	n = chime_wait(c, ev, 4, 1000);
	cr_assert_eq(n, 1, "the next wait said %d (%s)", n, n < 0 ? strerror(-n) : "");
	chime_close(c);
}

/*
 * The same in the handshake: the read of the broker's last answer failing
 * here said -ECONNRESET, "the broker hung up" (chime_open(3)), for this
 * process's own want of memory.
 */
Test(failcall, a_failed_read_of_the_handshake_is_ours_not_a_hang_up)
{
	struct chime_opts o = { .socket_path = sock };
	chime_t *c = NULL;
	int fds = count_fds(), r;

	memset(seen, 0, sizeof(seen));
	target = C_RECV;        /* the handshake's only recv(2): the broker's ready (its welcome is a recvmsg) */
	nth = 1;
	fail_err = ENOMEM;
	armed = 1;
	r = chime_open(&c, &o);
	armed = 0;
	fail_err = 0;
	target = -1;
	cr_assert_eq(seen[C_RECV], 1, "the handshake made %u recv(2) calls, not 1", seen[C_RECV]);
	cr_assert_eq(r, -ENOMEM, "chime_open said %d (%s)", r, strerror(-r));
	cr_assert_null(c);
	cr_assert_eq(count_fds(), fds, "a descriptor leaked");
	/* And the broker let go of it: the next open is served. */
	cr_assert_eq(chime_open(&c, &o), 0);
	chime_close(c);
}
