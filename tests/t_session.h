/* SPDX-License-Identifier: MIT */
/*
 * t_session.h - what test_session.c and test_restart.c share: opening a
 * (named) session on the test's broker, collecting events (never early),
 * and child processes that hold a session. Static functions with criterion
 * asserts: include it once, after criterion and chime.h, and set
 * t_session_sock to the broker's socket before use.
 */
#ifndef CHIME_T_SESSION_H
#define CHIME_T_SESSION_H

#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static const char *t_session_sock;

static int sopen(chime_t **c, const char *session)
{
	struct chime_opts o = { .socket_path = t_session_sock, .session = session };

	return chime_open(c, &o);
}

static chime_t *sopen_ok(const char *session)
{
	chime_t *c = NULL;
	int r = sopen(&c, session);

	cr_assert_eq(r, 0, "chime_open(session '%s'): %s", session ? session : "(none)", strerror(-r));
	return c;
}

/* Every event until `until_ns` (or max), appended to ev, never early; returns how many. */
static unsigned collect(chime_t *c, struct chime_event *ev, unsigned max, uint64_t until_ns)
{
	unsigned n = 0;

	while (n < max && now_ns() < until_ns) {
		int ms = (int)((until_ns - now_ns()) / 1000000u) + 1;
		int r = chime_wait(c, ev + n, max - n, ms);

		cr_assert_geq(r, 0, "chime_wait: %s", strerror(-r));
		for (int i = 0; i < r; i++) {
			uint64_t now = chime_now();

			cr_assert_geq(ev[n + i].fired_ns, ev[n + i].deadline_ns, "an event fired early");
			cr_assert_geq(now, ev[n + i].deadline_ns, "an event arrived before its deadline");
		}
		n += (unsigned)r;
	}
	return n;
}

/* Fork a child running fn(arg) with the pipe's write end; returns its pid once it wrote one byte. */
static pid_t child(void (*fn)(int wfd, void *arg), void *arg)
{
	int p[2];
	char b;
	pid_t pid;

	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(p[0]);
		fn(p[1], arg);
		_exit(0);
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &b, 1), 1, "the child failed before it was ready");
	close(p[0]);
	return pid;
}

static inline void kill_child(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
}

#endif /* CHIME_T_SESSION_H */
