/* SPDX-License-Identifier: MIT */
/*
 * A broker whose own calls fail: each call chimed makes to start and to
 * stop (opening and locking its files, the segments' memfds, sizes,
 * reservations and mappings, its sockets, descriptors, threads and helper
 * process, the sessions file's writes, syncs and renames) fails in turn,
 * its first time, then its second, and so on (tests/failcall_preload.c),
 * with the kernel's errno for want of a resource or for a failed disk.
 * Starting where an earlier broker left a named session's timers, every
 * such broker either runs and stops cleanly or exits 1 saying why
 * ("error:"), never crashes, and never loses the session: a broker started
 * after it, with nothing failing, holds every one of its timers.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "helpers.h"

#define TIMERS 1000

static char dir[64], sock[96], log_path[128], fired[128];

static void setup(void)
{
	cr_assert_eq(t_mkdtemp(dir, sizeof(dir), "chime-failstart"), 0);
	snprintf(sock, sizeof(sock), "%s/s", dir);
	snprintf(log_path, sizeof(log_path), "%s/log", dir);
	snprintf(fired, sizeof(fired), "%s/fired", dir);
}

static void teardown(void)
{
	t_rmdir_files(dir);
}

TestSuite(failstart, .init = setup, .fini = teardown, .timeout = 600);

/* The failing broker's log (its last 4 KiB). */
static const char *log_text(void)
{
	static char text[4096];
	FILE *f = fopen(log_path, "r");
	size_t n = 0;

	text[0] = '\0';
	if (f) {
		if (fseek(f, -(long)(sizeof(text) - 1), SEEK_END) < 0)
			rewind(f);
		n = fread(text, 1, sizeof(text) - 1, f);
		fclose(f);
	}
	text[n] = '\0';
	return text;
}

/* A broker's first life: session "keep" with TIMERS timers an hour ahead, stopped with them in its files. */
static void leave_a_session(void)
{
	struct chime_opts o = { .socket_path = sock, .session = "keep" };
	struct t_chimed b;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0);
	cr_assert_eq(chime_open(&c, &o), 0);
	for (int i = 0; i < TIMERS; i++) {
		chime_id_t id;

		cr_assert_eq(chime_arm(c, (uint64_t)i, chime_now() + 3600 * UINT64_C(1000000000), 0, 0, &id), 0);
	}
	chime_close(c);         /* detached, once the broker has applied them */
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
	cr_assert_eq(t_nodes(sock, T_NODES_TIMERS), TIMERS);
}

/*
 * chimed with call `name`'s nth call failing with err: started, stopped
 * with SIGTERM if it came up (within 10 s). Its wait status; *did_fail
 * says whether the call was made that often.
 */
static int run_failing(const char *name, unsigned nth, int err, bool *did_fail)
{
	const char *chimed = getenv("CHIMED"), *so = getenv("CHIME_FAILCALL_SO");
	char spec[96], cmd[1024];
	uint64_t t0 = chime_now();
	int st = 0;
	pid_t p;

	unlink(fired);
	snprintf(spec, sizeof(spec), "%s:%u:%d", name, nth, err);
	snprintf(cmd, sizeof(cmd), "exec env ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" "
		 "LD_PRELOAD='%s' CHIME_FAILCALL='%s' CHIME_FAILCALL_FIRED='%s' '%s' --foreground --socket '%s' "
		 "--shards 2 2>'%s'", so, spec, fired, chimed, sock, log_path);
	p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	for (;;) {
		if (waitpid(p, &st, WNOHANG) == p)
			break;
		if (t_sock_accepts(sock)) {
			usleep(20 * 1000);      /* a start-up step after listening (the restore) may fail too */
			kill(p, SIGTERM);
			cr_assert_eq(waitpid(p, &st, 0), p);
			break;
		}
		if (chime_now() - t0 > 10 * UINT64_C(1000000000)) {
			kill(p, SIGKILL);
			waitpid(p, &st, 0);
			cr_assert_fail("%s #%u failing: chimed neither listened nor exited in 10 s", name, nth);
		}
		usleep(1000);
	}
	*did_fail = access(fired, F_OK) == 0;
	return st;
}

static const struct {
	const char *name;
	int err;
} calls[] = {
	{ "open", EMFILE },      { "openat", EMFILE },   { "flock", ENOLCK },       { "mkdir", ENOSPC },
	{ "socket", EMFILE },    { "socketpair", EMFILE }, { "bind", EADDRINUSE },  { "listen", ENOBUFS },
	{ "memfd_create", EMFILE }, { "ftruncate", ENOSPC }, { "fallocate", ENOSPC }, { "mmap", ENOMEM },
	{ "madvise", ENOMEM },   { "eventfd", EMFILE },  { "timerfd_create", EMFILE }, { "signalfd", EMFILE },
	{ "pthread_create", EAGAIN }, { "fork", EAGAIN }, { "pwrite", ENOSPC },     { "fsync", EIO },
	{ "fdatasync", EIO },    { "rename", EIO },      { "unlink", EIO },
};

/* At most this many of a call's times are failed, each its own start (the default suite's share). */
static unsigned cap(void)
{
	const char *s = getenv("CHIME_STRESS");

	return s && *s == '1' ? 400 : 24;
}

Test(failstart, no_call_failing_at_start_or_stop_crashes_the_broker_or_loses_a_session)
{
	const char *so = getenv("CHIME_FAILCALL_SO");
	unsigned runs = 0, exited = 0;

	if (!so || !*so || access(so, R_OK) != 0)
		cr_skip("$CHIME_FAILCALL_SO names no failcall_preload.so (meson test sets it)");
	leave_a_session();
	for (size_t k = 0; k < sizeof(calls) / sizeof(calls[0]); k++) {
		unsigned n;

		for (n = 1; n <= cap(); n++) {
			bool did_fail;
			int st = run_failing(calls[k].name, n, calls[k].err, &did_fail);
			struct t_chimed b;
			uint64_t held;

			runs++;
			cr_assert(!WIFSIGNALED(st), "%s #%u failing (%s): chimed killed by signal %d:\n%s", calls[k].name,
				  n, strerror(calls[k].err), WTERMSIG(st), log_text());
			cr_assert(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 1),
				  "%s #%u failing: status %#x:\n%s", calls[k].name, n, st, log_text());
			if (WEXITSTATUS(st) == 1) {
				exited++;
				cr_assert(t_file_has(log_path, "chimed: error: "), "%s #%u failing: exit 1, no error "
					  "said:\n%s", calls[k].name, n, log_text());
				if (getenv("FAILSTART_VERBOSE"))
					fprintf(stderr, "failstart: %s #%u: %s", calls[k].name, n,
						strstr(log_text(), "chimed: error: "));
			}
			/* The next broker, nothing failing, holds the session's every timer. */
			cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0, "%s #%u failing: the next "
				     "broker did not start", calls[k].name, n);
			held = t_nodes_settle(sock, T_NODES_TIMERS, TIMERS);
			cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
			cr_assert_eq(held, TIMERS, "%s #%u failing (%s, exit %d): the next broker holds %llu of the "
				     "session's %d timers", calls[k].name, n, strerror(calls[k].err),
				     WIFEXITED(st) ? WEXITSTATUS(st) : -1, (unsigned long long)held, TIMERS);
			if (!did_fail)
				break;          /* made fewer than n times: every one has failed */
		}
		if (getenv("FAILSTART_VERBOSE"))
			fprintf(stderr, "failstart: %s failed %u times in turn\n", calls[k].name, n - 1);
	}
	fprintf(stderr, "failstart: %u starts, %u of them exited 1 saying why\n", runs, exited);
}
