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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define MS 1000000ull

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

/*
 * Wait (up to 5 s) until the broker lists session `name` (chimectl
 * sessions), or (listed false) no longer does: whether it came to that.
 */
static bool session_listed(const char *name, bool listed)
{
	char cmd[700];

	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' sessions 2>/dev/null | grep -q '^%s '", getenv("CHIMECTL"),
		 t_session_sock, name);
	for (int i = 0; i < 100; i++, usleep(50 * 1000))
		if ((system(cmd) == 0) == listed)
			return true;
	return false;
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

#ifdef CHIME_CLIENT_H /* white box: a slot reserved by hand */
/*
 * A session's process ("holes", one shard) with a slot one thread reserved
 * and never published (killed in between), and two arms other threads
 * published behind it, due at x->dl, whose ids (in x->ids) their calls
 * returned. Ready once both are published; waits to be killed.
 */
struct hole_x {
	uint64_t dl;
	chime_id_t ids[2];
};

static void hole_child(int wfd, void *arg)
{
	struct hole_x *x = arg;
	chime_t *c = sopen_ok("holes");
	uint64_t pos;

	if (!chime_sq_reserve(&c->chan[0].sq, &pos))
		_exit(1);
	if (chime_arm(c, 1, x->dl, 0, 1, &x->ids[0]) || chime_arm(c, 1, x->dl, 0, 2, &x->ids[1]))
		_exit(1);
	(void)!write(wfd, "r", 1);
	pause();
}
#endif

/*
 * A session's thousand timers (t1_*), for a test that kills the process
 * holding them, or the broker under it, and checks what the next process
 * of the session gets. A child (t1_child) arms them with keys i % 7, every
 * 100th periodic (100 ms), at t0 + arm_ms + (i % 250) ms; then moves every
 * 10th + 1 one-shot to t0 + reset_ms + (i % 50) ms and cancels every 10th
 * + 2; then says it is ready and waits to be killed. The struct is shared
 * memory (t1_new()): the child writes what it did, the test reads it.
 */
enum { T1_N = 1000 };

struct t1 {
	uint64_t t0, arm_ms, reset_ms;
	chime_id_t id[T1_N];
	uint64_t deadline[T1_N];    /* the last deadline it was given */
	uint8_t cancelled[T1_N];
};

static struct t1 *t1_new(uint64_t arm_ms, uint64_t reset_ms)
{
	struct t1 *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	cr_assert_neq(s, MAP_FAILED);
	s->t0 = now_ns();
	s->arm_ms = arm_ms;
	s->reset_ms = reset_ms;
	return s;
}

static bool t1_periodic(unsigned i)
{
	return i % 100 == 0;
}

static void t1_child(int wfd, void *arg)
{
	struct t1 *s = arg;
	chime_t *c = NULL;

	if (sopen(&c, "jobs") < 0)
		_exit(1);
	for (unsigned i = 0; i < T1_N; i++) {
		s->deadline[i] = s->t0 + (s->arm_ms + i % 250) * MS;
		if (chime_arm(c, i % 7, s->deadline[i], t1_periodic(i) ? 100 * MS : 0, i, &s->id[i]) < 0)
			_exit(2);
	}
	for (unsigned i = 0; i < T1_N; i++) {
		if (t1_periodic(i))
			continue;
		if (i % 10 == 1) {
			s->deadline[i] = s->t0 + (s->reset_ms + i % 50) * MS;
			if (chime_reset(c, s->id[i], s->deadline[i]) < 0)
				_exit(3);
		} else if (i % 10 == 2) {
			s->cancelled[i] = 1;
			if (chime_cancel(c, s->id[i]) < 0)
				_exit(4);
		}
	}
	(void)!write(wfd, "r", 1);
	pause();        /* killed here, with records maybe still unread by the shard */
}

/*
 * The next process of the session ("jobs"): the old ids work, so it moves
 * every 10th + 3 one-shot to t0 + reset_ms and cancels every 10th + 5;
 * then, until t0 + until_ms, each live one-shot comes once, with its id,
 * key and last deadline, no cancelled one comes, and the periodic ones
 * fire; they stop by their old ids too, and nothing comes after that.
 */
static void t1_next_process(struct t1 *s, uint64_t reset_ms, uint64_t until_ms)
{
	static struct chime_event ev[4 * T1_N];
	static unsigned seen[T1_N];
	unsigned n, oneshots = 0, live = 0, periodic = 0;
	chime_t *c = sopen_ok("jobs");

	memset(seen, 0, sizeof(seen));
	for (unsigned i = 0; i < T1_N; i++) {
		if (t1_periodic(i) || s->cancelled[i])
			continue;
		if (i % 10 == 3) {
			s->deadline[i] = s->t0 + reset_ms * MS;
			cr_assert_eq(chime_reset(c, s->id[i], s->deadline[i]), 0);
		} else if (i % 10 == 5) {
			s->cancelled[i] = 1;
			cr_assert_eq(chime_cancel(c, s->id[i]), 0);
		}
	}
	for (unsigned i = 0; i < T1_N; i++)
		live += !t1_periodic(i) && !s->cancelled[i];
	n = collect(c, ev, 4 * T1_N, s->t0 + until_ms * MS);
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (unsigned)ev[k].user_data;

		cr_assert_lt(i, T1_N);
		cr_assert_eq(ev[k].id, s->id[i], "timer %u came back with another id", i);
		cr_assert_eq(ev[k].key, i % 7);
		cr_assert_not(s->cancelled[i], "cancelled timer %u fired", i);
		if (t1_periodic(i)) {
			periodic++;
			continue;
		}
		oneshots++;
		cr_assert_eq(seen[i]++, 0, "timer %u delivered twice", i);
		cr_assert_eq(ev[k].deadline_ns, s->deadline[i], "timer %u fired at another deadline", i);
	}
	cr_assert_eq(oneshots, live, "%u of %u live one-shots delivered", oneshots, live);
	cr_assert_geq(periodic, 10 * 5, "periodic timers: %u events", periodic);
	for (unsigned i = 0; i < T1_N; i += 100)
		cr_assert_eq(chime_cancel(c, s->id[i]), 0);
	usleep(100 * 1000);
	while (chime_poll(c, ev, 64) > 0)
		;
	cr_assert_eq(collect(c, ev, 64, now_ns() + 300 * MS), 0, "an event after every timer was cancelled");
	chime_close(c);
	munmap(s, sizeof(*s));
}

#endif /* CHIME_T_SESSION_H */
