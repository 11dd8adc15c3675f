/* SPDX-License-Identifier: MIT */
/*
 * test_broker.c - libchime against a real chimed, end to end.
 *
 * Each test starts its own chimed (path in $CHIMED) on a private socket in a
 * fresh temporary directory, runs client processes and threads against it,
 * and judges forked children by their exit status (a child never uses
 * cr_assert: it prints what failed and exits non-zero). .fini kills the
 * broker and removes its files. $CHIME_STRESS=1 scales every workload up
 * (the 'stress' suite runs the same binary that way).
 *
 * Two executables are built from this file (tests/meson.build), and the
 * default suite runs each in one build: test_broker_release has the cases
 * declared ReleaseTest(), test_broker those declared AsanTest() (helpers.h,
 * T_RELEASE_CASES). A new case picks one of the two.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>

#include "chime.h"
#include "chime_shm.h"
#include "helpers.h"
#include "client.h"      /* a chime_t's wait spin (white box) */
#include "segment.h"
#include "statsread.h"

#ifndef T_RELEASE_CASES
#error "tests/meson.build builds this file with -DT_RELEASE_CASES=0 and with -DT_RELEASE_CASES=1"
#endif

#define MS 1000000ull
#define LATE_MAX_NS (200 * MS)   /* generous: a noisy 2-core machine */

static struct t_chimed tb;
static const char *sock = tb.sock;
static pid_t broker = -1;       /* tb.pid, or -1 once a test has reaped it itself */
static int stress;

/* In children: report and exit non-zero. */
#define CHECK(cond, ...) do {                                                   \
	if (!(cond)) {                                                          \
		fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
		fprintf(stderr, __VA_ARGS__);                                   \
		fputc('\n', stderr);                                            \
		_exit(1);                                                       \
	}                                                                       \
} while (0)

static void msleep(unsigned ms)
{
	nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 }, NULL);
}

static int scale(int n, int stress_n)
{
	return stress ? stress_n : n;
}

static chime_t *copen(void)
{
	return t_open(sock);
}

static void broker_start(void)
{
	stress = getenv("CHIME_STRESS") && atoi(getenv("CHIME_STRESS")) > 0;
	cr_assert_eq(t_chimed_start(&tb, NULL, "--shards 2"), 0, "chimed did not come up");
	broker = tb.pid;
}

static void broker_stop(void)
{
	if (broker < 0)
		tb.pid = 0;     /* the test reaped it */
	t_chimed_stop(&tb, SIGKILL);
	broker = -1;
}

TestSuite(broker, .init = broker_start, .fini = broker_stop, .timeout = 120);

/* ---- helpers ---- */

/* Fork n children running fn(i); true if all exited 0. */
static bool run_children(int n, int (*fn)(int), pid_t *pids_out)
{
	pid_t pids[64];
	bool ok = true;

	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		cr_assert_geq(pids[i], 0);
		if (pids[i] == 0)
			_exit(fn(i));
	}
	if (pids_out) {
		memcpy(pids_out, pids, sizeof(pid_t) * (size_t)n);
		return true;
	}
	for (int i = 0; i < n; i++) {
		int st;

		cr_assert_eq(waitpid(pids[i], &st, 0), pids[i]);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			cr_log_error("child %d: %s %d", i, WIFEXITED(st) ? "exit" : "signal",
				     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			ok = false;
		}
	}
	return ok;
}

/* Sum of one counter over the shard blocks of the control segment. */
static uint64_t ctl_sum(size_t field_off)
{
	char path[PATH_MAX + 8];
	struct chime_map m;
	const struct chime_ctl *ctl;
	uint64_t sum = 0;

	snprintf(path, sizeof(path), "%s.ctl", sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0, "cannot map '%s'", path);
	ctl = m.base;
	for (uint32_t s = 0; s < ctl->nr_shards; s++) {
		const char *b = (const char *)m.base + ctl->shards_off + s * sizeof(struct chime_shard_ctl);

		sum += __atomic_load_n((const uint64_t *)(b + field_off), __ATOMIC_RELAXED);
	}
	chime_seg_unmap(&m);
	return sum;
}

static uint32_t ctl_u32(size_t off)
{
	char path[PATH_MAX + 8];
	struct chime_map m;
	uint32_t v;

	snprintf(path, sizeof(path), "%s.ctl", sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	v = *(const uint32_t *)((const char *)m.base + off);
	chime_seg_unmap(&m);
	return v;
}

/* Wait until fn() == want (or give up after ms). */
static bool wait_sum(size_t off, uint64_t want, unsigned ms)
{
	for (uint64_t t0 = now_ns(); now_ns() - t0 < ms * MS; msleep(10))
		if (ctl_sum(off) == want)
			return true;
	return ctl_sum(off) == want;
}

/* ---- exactly once, never early, lateness bounded: processes x threads ---- */

#define EO_PROCS 3
#define EO_THREADS 3

struct eo {
	chime_t *c;
	int per;
	int t;
	uint64_t *deadline;     /* [t * per + i] */
	chime_id_t *ids;
	int rc;
};

static void *eo_arm(void *arg)
{
	struct eo *e = arg;
	uint64_t seed = (uint64_t)getpid() * 1000 + (uint64_t)e->t;

	for (int i = 0; i < e->per; i++) {
		int k = e->t * e->per + i;
		uint64_t d = chime_now() + splitmix64(&seed) % (300 * MS);

		e->deadline[k] = d;
		__atomic_thread_fence(__ATOMIC_RELEASE);
		if (chime_arm(e->c, (uint64_t)e->t, d, 0, (uint64_t)k, &e->ids[k]) != 0 || e->ids[k] == 0)
			e->rc = 1;
		if (i % 64 == 0)
			sched_yield();
	}
	return NULL;
}

static int eo_child(int idx)
{
	int per = scale(2000, 40000), n = EO_THREADS * per, got = 0;
	struct eo e[EO_THREADS];
	pthread_t th[EO_THREADS];
	uint64_t *deadline = calloc((size_t)n, 8);
	chime_id_t *ids = calloc((size_t)n, 8);
	uint8_t *seen = calloc((size_t)n, 1);
	struct chime_event ev[128];
	uint64_t t0 = chime_now(), worst = 0;
	chime_t *c = copen();

	CHECK(c && deadline && ids && seen, "setup");
	for (int t = 0; t < EO_THREADS; t++) {
		e[t] = (struct eo){ .c = c, .per = per, .t = t, .deadline = deadline, .ids = ids };
		pthread_create(&th[t], NULL, eo_arm, &e[t]);
	}
	/* Drain while the threads arm. */
	while (got < n) {
		int r = chime_wait(c, ev, 128, 100);

		CHECK(r >= 0, "chime_wait: %s", strerror(-r));
		CHECK(chime_now() - t0 < 30000 * MS, "only %d of %d events after 30 s", got, n);
		for (int i = 0; i < r; i++) {
			uint64_t k = ev[i].user_data, now = chime_now();

			CHECK(k < (uint64_t)n, "bad user_data %llu", (unsigned long long)k);
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			CHECK(seen[k] == 0, "event %llu returned twice", (unsigned long long)k);
			seen[k] = 1;
			CHECK(ev[i].deadline_ns == deadline[k], "deadline changed");
			CHECK(ev[i].id == ids[k] || ids[k] == 0, "id mismatch");
			CHECK(ev[i].fired_ns >= ev[i].deadline_ns, "fired %lld ns early",
			      (long long)(ev[i].deadline_ns - ev[i].fired_ns));
			CHECK(now >= ev[i].deadline_ns, "received early");
			CHECK(ev[i].fired_ns - ev[i].deadline_ns < LATE_MAX_NS, "late by %llu us",
			      (unsigned long long)(ev[i].fired_ns - ev[i].deadline_ns) / 1000);
			if (ev[i].fired_ns - ev[i].deadline_ns > worst)
				worst = ev[i].fired_ns - ev[i].deadline_ns;
			got++;
		}
	}
	for (int t = 0; t < EO_THREADS; t++) {
		pthread_join(th[t], NULL);
		CHECK(e[t].rc == 0, "chime_arm failed");
	}
	/* Nothing more may come. */
	CHECK(chime_wait(c, ev, 128, 150) == 0, "an extra event");
	fprintf(stderr, "exactly_once[%d]: %d events, worst lateness %llu us\n", idx, n,
		(unsigned long long)worst / 1000);
	chime_close(c);
	return 0;
}

AsanTest(broker, exactly_once_never_early_procs_threads)
{
	cr_assert(run_children(EO_PROCS, eo_child, NULL));
}

/* ---- cancel: no event after chime_cancel() returns, even one in flight ---- */

static int cancel_child(int idx)
{
	int reps = scale(3000, 60000), controls = 0, got = 0;
	uint64_t seed = 77 + (uint64_t)idx;
	struct chime_event ev[64];
	chime_t *c = copen();

	CHECK(c, "open");
	for (int i = 0; i < reps; i++) {
		chime_id_t id, ctl;
		unsigned spin = (unsigned)(splitmix64(&seed) % 3000);

		/* Due at once: the shard fires it immediately; the cancel races with that. */
		CHECK(chime_arm(c, 1, chime_now() - MS, 0, 0xdead, &id) == 0, "arm");
		for (volatile unsigned s = 0; s < spin; s++)
			;
		CHECK(chime_cancel(c, id) == 0, "cancel");
		if (i % 10 == 0) {
			CHECK(chime_arm(c, 2, chime_now(), 0, 0xc0de, &ctl) == 0, "arm control");
			controls++;
		}
		if (i % 7 == 0) {
			int r = chime_poll(c, ev, 64);

			CHECK(r >= 0, "poll");
			for (int k = 0; k < r; k++)
				CHECK(ev[k].user_data == 0xc0de, "cancelled timer %#llx returned",
				      (unsigned long long)ev[k].id);
			got += r;
		}
	}
	for (uint64_t t0 = chime_now(); chime_now() - t0 < 400 * MS;) {
		int r = chime_wait(c, ev, 64, 50);

		CHECK(r >= 0, "wait");
		for (int k = 0; k < r; k++)
			CHECK(ev[k].user_data == 0xc0de, "cancelled timer returned");
		got += r;
	}
	CHECK(got == controls, "%d control events of %d", got, controls);
	chime_close(c);
	return 0;
}

AsanTest(broker, cancel_in_flight_never_returned)
{
	cr_assert(run_children(2, cancel_child, NULL));
}

/* ---- reset: fires at the new deadline only, even with a firing in flight ---- */

static int reset_child(int idx)
{
	int reps = scale(2000, 40000), got = 0;
	uint64_t seed = 99 + (uint64_t)idx;
	uint64_t *newd = calloc((size_t)reps, 8);
	uint8_t *seen = calloc((size_t)reps, 1);
	struct chime_event ev[64];
	chime_t *c = copen();

	CHECK(c && newd && seen, "setup");
	for (int i = 0; i < reps || got < reps;) {
		if (i < reps) {
			chime_id_t id;
			unsigned spin = (unsigned)(splitmix64(&seed) % 3000);

			CHECK(chime_arm(c, 0, chime_now() - MS, 0, (uint64_t)i, &id) == 0, "arm");
			for (volatile unsigned s = 0; s < spin; s++)
				;
			newd[i] = chime_now() + 20 * MS + splitmix64(&seed) % (30 * MS);
			CHECK(chime_reset(c, id, newd[i]) == 0, "reset");
			i++;
		}
		if (i % 8 == 0 || i >= reps) {
			int r = i >= reps ? chime_wait(c, ev, 64, 100) : chime_poll(c, ev, 64);

			CHECK(r >= 0, "poll");
			for (int k = 0; k < r; k++) {
				uint64_t u = ev[k].user_data;

				CHECK(u < (uint64_t)i, "bad user_data");
				CHECK(!seen[u], "timer %llu fired twice (reset did not void the first)",
				      (unsigned long long)u);
				seen[u] = 1;
				CHECK(ev[k].deadline_ns == newd[u], "returned the firing before the reset");
				CHECK(ev[k].fired_ns >= newd[u], "fired early");
				got++;
			}
		}
	}
	CHECK(chime_wait(c, ev, 64, 100) == 0, "extra event");
	chime_close(c);
	return 0;
}

AsanTest(broker, reset_in_flight_fires_at_new_deadline_once)
{
	cr_assert(run_children(2, reset_child, NULL));
}

/* ---- cancel_key ---- */

AsanTest(broker, cancel_key_cancels_only_that_key)
{
	chime_t *c = copen();
	struct chime_event ev[64];
	int got = 0;

	cr_assert_not_null(c);
	for (int i = 0; i < 300; i++) {
		chime_id_t id;

		cr_assert_eq(chime_arm(c, 7, chime_now() + 50 * MS, 0, 7, &id), 0);
		cr_assert_eq(chime_arm(c, 8, chime_now() + 50 * MS, 0, 8, &id), 0);
	}
	cr_assert_eq(chime_cancel_key(c, 7), 0);
	for (uint64_t t0 = chime_now(); chime_now() - t0 < 300 * MS;) {
		int r = chime_wait(c, ev, 64, 50);

		cr_assert_geq(r, 0);
		for (int k = 0; k < r; k++)
			cr_assert_eq(ev[k].key, 8, "key %llu survived cancel_key", (unsigned long long)ev[k].key);
		got += r;
	}
	cr_assert_eq(got, 300);
	chime_close(c);
}

/* The usual pattern: drop all timeouts of an object, then arm a new one with the same key. */
AsanTest(broker, cancel_key_then_rearm_same_key_delivers_new_ones)
{
	int rounds = scale(300, 5000);
	chime_t *c = copen();
	struct chime_event ev[64];

	cr_assert_not_null(c);
	for (int round = 0; round < rounds; round++) {
		chime_id_t old[4], fresh[4];
		int got = 0;

		for (int i = 0; i < 4; i++)
			cr_assert_eq(chime_arm(c, 9, chime_now() - MS, 0, 1, &old[i]), 0);
		cr_assert_eq(chime_cancel_key(c, 9), 0);
		for (int i = 0; i < 4; i++)
			cr_assert_eq(chime_arm(c, 9, chime_now() - MS, 0, 2, &fresh[i]), 0);
		for (uint64_t t0 = chime_now(); got < 4;) {
			int r = chime_wait(c, ev, 64, 20);

			cr_assert_geq(r, 0);
			for (int k = 0; k < r; k++)
				cr_assert_eq(ev[k].user_data, 2, "round %d: a cancelled timer came back", round);
			got += r;
			cr_assert_lt(chime_now() - t0, 2000 * MS, "round %d: new timers lost (%d of 4)", round, got);
		}
	}
	cr_assert_eq(chime_wait(c, ev, 64, 50), 0);
	chime_close(c);
}

/* ---- periodic ---- */

AsanTest(broker, periodic_fires_at_deadline_plus_k_period_without_drift)
{
	chime_t *c = copen();
	struct chime_event ev[8];
	uint64_t p = 15 * MS, d0 = chime_now() + 20 * MS;
	chime_id_t id;
	int k = 0;

	cr_assert_not_null(c);
	cr_assert_eq(chime_arm(c, 1, d0, p, 42, &id), 0);
	while (k < 12) {
		int r = chime_wait(c, ev, 8, 1000);

		cr_assert_gt(r, 0, "periodic timer stopped after %d firings", k);
		for (int i = 0; i < r; i++, k++) {
			cr_assert_eq(ev[i].id, id);
			cr_assert_eq(ev[i].deadline_ns, d0 + (uint64_t)k * p, "firing %d drifted", k);
			cr_assert_geq(ev[i].fired_ns, ev[i].deadline_ns);
			cr_assert_lt(ev[i].fired_ns - ev[i].deadline_ns, LATE_MAX_NS);
		}
	}
	cr_assert_eq(chime_cancel(c, id), 0);
	cr_assert_eq(chime_wait(c, ev, 8, 100), 0, "fired after cancel");
	chime_close(c);
}

/* A period under one tick (100 us here) is one tick: a 1 ns one fired at every advance of the shard. */
AsanTest(broker, a_period_shorter_than_a_tick_is_a_tick)
{
	chime_t *c = copen();
	struct chime_event ev[64];
	uint64_t d0 = chime_now() + 10 * MS, end, n = 0;
	chime_id_t id;

	cr_assert_not_null(c);
	cr_assert_eq(chime_arm(c, 1, d0, 1, 0, &id), 0);
	end = d0 + 200 * MS;
	while (chime_now() < end) {
		int r = chime_wait(c, ev, 64, 10);

		cr_assert_geq(r, 0);
		for (int i = 0; i < r; i++, n++)
			cr_assert_eq(ev[i].deadline_ns, d0 + n * 100000, "firing %llu", (unsigned long long)n);
	}
	/* 200 ms of 100 us ticks: 2000 at most, a few more for the 10 ms before the first. */
	cr_assert_leq(n, 2100, "%llu firings in 200 ms", (unsigned long long)n);
	cr_assert_geq(n, 10);
	cr_assert_eq(chime_cancel(c, id), 0);
	chime_close(c);
}

/*
 * A sleeping shard wakes for the exact earliest deadline, not at the end of
 * its tick: with 100 ms ticks, timers 150 ms apart (the shard sleeps between
 * them) at random points inside their ticks all fire well before their
 * ticks end. Waking at the tick's end made each 50 ms late on average, up
 * to 100: all 16 under 40 ms would have had a chance of 0.4^16.
 */
ReleaseTest(broker, sleeping_shard_wakes_for_the_exact_deadline)
{
	struct t_chimed b2 = { 0 };
	struct chime_event ev[4];
	uint64_t rng = 7, d[16], base, worst = 0;
	unsigned got = 0;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1 --resolution-us 100000"), 0);
	c = t_open(b2.sock);
	cr_assert_not_null(c);
	base = chime_now() + 150 * MS;
	for (unsigned i = 0; i < 16; i++) {
		chime_id_t id;

		d[i] = base + i * 150 * MS + splitmix64(&rng) % (100 * MS);
		cr_assert_eq(chime_arm(c, 0, d[i], 0, i, &id), 0);
	}
	while (got < 16) {
		int r = chime_wait(c, ev, 4, 2000);

		cr_assert_gt(r, 0, "only %u of 16 timers fired", got);
		for (int i = 0; i < r; i++, got++) {
			uint64_t u = ev[i].user_data;

			cr_assert_lt(u, 16);
			cr_assert_eq(ev[i].deadline_ns, d[u]);
			cr_assert_geq(ev[i].fired_ns, d[u], "timer %llu fired early", (unsigned long long)u);
			if (ev[i].fired_ns - d[u] > worst)
				worst = ev[i].fired_ns - d[u];
		}
	}
	cr_assert_lt(worst, 40 * MS, "a timer fired %.1f ms late: the shard slept to its tick's end?",
		     (double)worst / 1e6);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/* Shard 0's counters, read from the control segment. */
static struct chime_shard_stats shard0(const char *s)
{
	struct chime_shard_stats st = { 0 };
	struct sr r;
	struct sr_snap sn;

	cr_assert_eq(sr_open(&r, s), 0);
	cr_assert_eq(sr_snapshot(&r, &sn), 0);
	st = sn.shards[0];
	sr_snap_free(&sn);
	sr_close(&r);
	return st;
}

/* Wait (up to 2 s) until shard 0 counts `resets` resets and `armed` timers. */
static struct chime_shard_stats shard0_until(const char *s, uint64_t resets, uint64_t armed)
{
	uint64_t end = chime_now() + 2000 * MS;
	struct chime_shard_stats st;

	do {
		st = shard0(s);
		if (st.resets >= resets && st.armed == armed)
			return st;
		usleep(2000);
	} while (chime_now() < end);
	cr_assert_fail("shard 0: %llu resets (want %llu), %llu armed (want %llu) after 2 s",
		       (unsigned long long)st.resets, (unsigned long long)resets,
		       (unsigned long long)st.armed, (unsigned long long)armed);
	return st;
}

/*
 * chime_arm(3): the deadlines past the clock's end. A periodic timer whose
 * next deadline would pass 2^64 - 1 ns fires its first and stays armed at
 * 2^64 - 1 (the broker saturates its next deadline rather than wrap it),
 * never to fire again: it holds its node and its quota until cancelled.
 * So does a one-shot armed at UINT64_MAX.
 */
AsanTest(broker, a_periodic_whose_next_deadline_passes_the_clocks_end_fires_once_and_stays_armed)
{
	struct t_chimed b2 = { 0 };
	struct chime_event ev[4];
	chime_id_t per, never;
	uint64_t d0;
	chime_t *c;
	int n = 0;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	c = t_open(b2.sock);
	cr_assert_not_null(c);
	d0 = chime_now();
	cr_assert_eq(chime_arm(c, 1, d0, UINT64_MAX - d0 / 2, 5, &per), 0);
	cr_assert_eq(chime_arm(c, 2, UINT64_MAX, 0, 6, &never), 0);
	for (uint64_t end = chime_now() + 300 * MS; chime_now() < end;) {
		int r = chime_wait(c, ev + n, 4 - (unsigned)n, 50);

		cr_assert_geq(r, 0);
		n += r;
		cr_assert_leq(n, 1, "a periodic at the clock's end fired again");
	}
	cr_assert_eq(n, 1);
	cr_assert_eq(ev[0].id, per);
	cr_assert_eq(ev[0].deadline_ns, d0);
	(void)shard0_until(b2.sock, 0, 2);      /* both still armed */
	cr_assert_eq(chime_cancel(c, per), 0);
	cr_assert_eq(chime_cancel(c, never), 0);
	cr_assert_eq(chime_flush(c), 0);
	(void)shard0_until(b2.sock, 0, 0);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * Four 100 us periodic timers a quarter period apart put a deadline every
 * 25 us, always closer than the 50 us a shard spins into one: the shard
 * spun outright (one CPU each for a client's four timers, which the client
 * does not pay for). Now spinning without work is capped at --spin-share
 * of the time (12% by default) plus 2 us per timer fired, in a 20 ms
 * bucket, and past it the shard sleeps to each deadline.
 *
 * `k` periodic timers of `period`, spread over it; the client waits for
 * their events (a periodic timer whose event is not taken yet does not
 * fire again, so it must take them to keep them coming). On a private
 * one-shard broker started with `extra`; *spun, *cpu, *fires and *sleeps
 * are the shard's spin_ns, cpu_ns, fires and sleeps over *elapsed.
 */
static void run_periodic_timers(const char *extra, unsigned k, uint64_t period, uint64_t *spun, uint64_t *cpu,
				uint64_t *elapsed, uint64_t *fires, uint64_t *sleeps)
{
	struct t_chimed b2 = { 0 };
	struct chime_shard_stats st0, st;
	struct chime_event ev[256];
	uint64_t d0, t0, t1, fired = 0;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b2, NULL, extra), 0);
	c = t_open(b2.sock);
	cr_assert_not_null(c);
	d0 = chime_now() + 10 * MS;
	for (unsigned i = 0; i < k; i++) {
		chime_id_t id;

		cr_assert_eq(chime_arm(c, 1, d0 + i * (period / k), period, i, &id), 0);
	}
	t0 = chime_now();
	while (chime_now() - t0 < 200 * MS)     /* past the start-up's full bucket */
		cr_assert_geq(chime_wait(c, ev, 256, 10), 0);
	st0 = shard0(b2.sock);
	t0 = chime_now();
	while (chime_now() - t0 < 1500 * MS) {
		int r = chime_wait(c, ev, 256, 10);

		cr_assert_geq(r, 0);
		fired += (uint64_t)r;
	}
	st = shard0(b2.sock);
	t1 = chime_now();
	*spun = st.spin_ns - st0.spin_ns;
	*fires = st.fires - st0.fires;
	*cpu = st.cpu_ns - st0.cpu_ns;
	*sleeps = st.sleeps - st0.sleeps;
	*elapsed = t1 - t0;
	cr_log_info("%s: %llu events; the shard spun %.0f ms, ran %.0f ms and slept %llu times in %.0f ms", extra,
		    (unsigned long long)fired, (double)*spun / 1e6, (double)*cpu / 1e6,
		    (unsigned long long)*sleeps, (double)*elapsed / 1e6);
	/* They did fire (a noisy host takes some: this is not what is tested). */
	cr_assert_geq(fired, 1500 * MS / period * k / 4, "%llu events in 1.5 s", (unsigned long long)fired);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

ReleaseTest(broker, short_periodic_timers_cannot_keep_a_shard_spinning)
{
	uint64_t spun, cpu, elapsed, fires, sleeps, spun_all, cpu_all, elapsed_all, sleeps_all;

	run_periodic_timers("--shards 1", 4, 100000, &spun, &cpu, &elapsed, &fires, &sleeps);
	cr_assert_leq(spun, elapsed * 12 / 100 + fires * 2000 + 25 * MS, "spun %.0f ms of %.0f, %llu fires",
		      (double)spun / 1e6, (double)elapsed / 1e6, (unsigned long long)fires);
	cr_assert_lt(spun, elapsed * 2 / 5, "spun %.0f ms of %.0f", (double)spun / 1e6, (double)elapsed / 1e6);
	/*
	 * The operator's share: all of it, as before the limit. Measured
	 * against the limited run, not the clock: with other work on both
	 * cores the shard spins less either way (329 ms of 1504 seen at
	 * --spin-share 100 while two test suites ran beside it, against 750
	 * and more on a quiet host), but always well beyond its capped self.
	 */
	run_periodic_timers("--shards 1 --spin-share 100", 4, 100000, &spun_all, &cpu_all, &elapsed_all, &fires,
			    &sleeps_all);
	/*
	 * Or, on a host too busy to let it spin (390 ms against 299 capped in a
	 * CI run), it slept a tenth as often or less: what spinning to each
	 * deadline does whatever the CPU it gets (6-460 sleeps uncapped against
	 * 10-50k capped, below).
	 */
	cr_assert(spun_all >= spun * 3 / 2 + 10 * MS || sleeps_all * 10 <= sleeps,
		  "--spin-share 100: spun %.0f ms of %.0f, against %.0f capped, and slept %llu times against %llu",
		  (double)spun_all / 1e6, (double)elapsed_all / 1e6, (double)spun / 1e6,
		  (unsigned long long)sleeps_all, (unsigned long long)sleeps);
	/*
	 * What is left of the shard's CPU is the work, a sleep and a wake-up
	 * per few deadlines: it sleeps (10-50k times for 60k fires here,
	 * against 6-460 with --spin-share 100). Its CPU is not bounded here:
	 * it is what this host charges for ~35k exact wake-ups a second, 39-65%
	 * of the core on most days and 79-98% on others (2026-11-30, the same
	 * build within half an hour, and the commit before alike), so a bound
	 * below the whole core failed whole stress runs for the host's sake.
	 * Not compared with --spin-share 100's either: a spin into a deadline
	 * yields its core until the last 3 us, so what spinning costs in CPU
	 * depends on who else wants the core (569-1490 ms of 1500 seen). What
	 * the limit decides, the spin (above) and the sleeps, is asserted.
	 */
	cr_assert_geq(sleeps, fires / 30, "the shard slept %llu times for %llu fires (%llu with --spin-share 100)",
		      (unsigned long long)sleeps, (unsigned long long)fires, (unsigned long long)sleeps_all);
	fprintf(stderr, "the shard used %.0f ms of CPU in %.0f ms (%.0f with --spin-share 100)\n", (double)cpu / 1e6,
		(double)elapsed / 1e6, (double)cpu_all / 1e6);
}

/*
 * A shard woke --spin-us (50 us) before each deadline and spun the rest,
 * and then spun on after firing as if a client's records would follow: 45
 * us of spinning per timer where a wake-up is late by 5-10 us, so timers
 * tens of microseconds apart spent the spin share on a fraction of them
 * and the rest fired a wake-up late. It now wakes about as early as its
 * sleeps have been late (their 90th percentile), and spins after a
 * doorbell or records, not after a timed wake-up or firing alone.
 */
ReleaseTest(broker, a_shard_spins_into_a_deadline_only_as_long_as_a_wake_up_is_late)
{
	uint64_t spun, cpu, elapsed, fires, sleeps;

	run_periodic_timers("--shards 1", 1, MS, &spun, &cpu, &elapsed, &fires, &sleeps);
	cr_assert_gt(fires, 0);
	cr_assert_lt(spun / fires, 20000, "the shard spun %.1f us per timer fired (%llu fired)",
		     (double)spun / (double)fires / 1e3, (unsigned long long)fires);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* A child that spins until this process dies: another user's CPU-bound work. */
static pid_t start_cpu_hog(void)
{
	pid_t pid = fork();

	if (pid == 0) {
		(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (volatile unsigned long i = 0;; i++)
			;
	}
	return pid;
}

/*
 * A busy host: a CPU-bound process on every CPU, and 20k timers due over a
 * second (one every 50 us: the shards never sleep long). A shard and a
 * waiting client both spin (and sched_yield()) a while before they sleep;
 * a yield on a busy core hands it to the hog for a whole time slice, and
 * every timer that came due meanwhile waited for the slice to end: half
 * of them fired 1.5-1.8 ms late and were taken 1.8-2.5 ms late (here, and
 * in chime-bench e2e --only lat beside two hogs, where a timerfd in epoll
 * was 64-122 us late). A yield that gives the core away that long now
 * turns spinning off (shm/spin.h): they sleep, and the kernel wakes them
 * into the core (p50 50-70 us at the shard, 120-170 taken, here). The
 * bounds are on the medians, 1 ms: between the two. And the rule must have
 * taken effect on both sides: the shards' spin_busy, the client's watch.
 */
ReleaseTest(broker, a_busy_host_does_not_hold_timers_for_a_time_slice, .timeout = 60)
{
	enum { N = 20000 };
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	struct t_chimed b2 = { 0 };
	static uint64_t d[N], fired[N], got_at[N];
	uint64_t rng = 11, base;
	pid_t hogs[64];
	unsigned got = 0, nh = 0;
	uint64_t busy = 0, client_off;
	struct sr stats;
	struct sr_snap sn;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b2, NULL, ""), 0);
	c = t_open(b2.sock);
	cr_assert_not_null(c);
	for (long i = 0; i < cpus && nh < 64; i++) {
		hogs[nh] = start_cpu_hog();
		cr_assert_gt(hogs[nh], 0, "fork: %s", strerror(errno));
		nh++;
	}
	msleep(100);    /* the hogs running, and the scheduler used to them */
	base = chime_now() + 50 * MS;
	for (unsigned i = 0; i < N; i++) {
		chime_id_t id;

		d[i] = base + splitmix64(&rng) % (1000 * MS);
		cr_assert_eq(chime_arm(c, 0, d[i], 0, i, &id), 0);
	}
	while (got < N) {
		struct chime_event ev[64];
		int r = chime_wait(c, ev, 64, 5000);
		uint64_t now = chime_now();

		cr_assert_gt(r, 0, "only %u of %u timers fired", got, N);
		for (int i = 0; i < r; i++, got++) {
			uint64_t u = ev[i].user_data;

			cr_assert_lt(u, N);
			cr_assert_geq(ev[i].fired_ns, d[u], "timer %llu fired early", (unsigned long long)u);
			fired[got] = ev[i].fired_ns - d[u];
			got_at[got] = now - d[u];
		}
	}
	for (unsigned i = 0; i < nh; i++) {
		kill(hogs[i], SIGKILL);
		waitpid(hogs[i], NULL, 0);
	}
	cr_assert_eq(sr_open(&stats, b2.sock), 0);
	cr_assert_eq(sr_snapshot(&stats, &sn), 0);
	for (uint32_t i = 0; i < sn.hdr.nr_shards; i++)
		busy += sn.shards[i].spin_busy;
	sr_snap_free(&sn);
	sr_close(&stats);
	client_off = c->wait_spin.off_ns;   /* white box: chime_wait()'s side of the rule */
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
	/* the rule took effect on both sides, the shards' as chimestat shows it */
	cr_assert_gt(busy, 0, "no shard turned its spinning off beside %u CPU hogs", nh);
	cr_assert_gt(client_off, 0, "chime_wait() never turned its watch off beside %u CPU hogs", nh);
	qsort(fired, N, sizeof(fired[0]), cmp_u64);
	qsort(got_at, N, sizeof(got_at[0]), cmp_u64);
	cr_log_info("beside %u CPU hogs, lateness p50/p90: fired %.0f/%.0f us, taken %.0f/%.0f us; spinning "
		    "turned off %llu times", nh,
		    (double)fired[N / 2] / 1e3, (double)fired[N * 9 / 10] / 1e3, (double)got_at[N / 2] / 1e3,
		    (double)got_at[N * 9 / 10] / 1e3, (unsigned long long)busy);
	cr_assert_lt(fired[N / 2], MS, "half the timers fired %.0f us late or more beside %u CPU hogs",
		     (double)fired[N / 2] / 1e3, nh);
	cr_assert_lt(got_at[N / 2], MS, "half the events were taken %.0f us late or more beside %u CPU hogs",
		     (double)got_at[N / 2] / 1e3, nh);
}

/*
 * A neighbour (one client, taking none of its events) arms `burst` timers
 * due at t and, if spread_ms, as many again spread over the spread_ms
 * after it; the victim (another client) has `victims` timers 1 ms apart
 * from t + 0.5 ms, armed in the middle of the spread ones (not first or
 * last in a slot). When each victim's event arrives, the shard must have
 * fired fewer than `limit` of the neighbour's, or the victim must have
 * fired less late than half the time the whole burst took to fire: this
 * thread reads the count only once it has the event, later on a busy host
 * (315k of 600k seen once, against 300k), while the victim's lateness is
 * the shard's own. Behind the whole burst, as before, both fail. One round:
 * true if it passed, else false with why.
 */
static bool victim_beside_a_burst_once(unsigned burst, unsigned spread_ms, unsigned victims, uint64_t limit,
				       char *why, size_t why_len)
{
	unsigned n = spread_ms ? 2 * burst : burst;
	struct t_chimed b2 = { 0 };
	struct chime_shard_stats st;
	struct chime_event ev;
	chime_t *a, *v;
	chime_id_t id;
	uint64_t t, all, late[8], fires[8];

	cr_assert_leq(victims, 8);
	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	a = t_open(b2.sock);
	v = t_open(b2.sock);
	cr_assert(a && v);
	t = chime_now() + 3000 * MS;
	for (unsigned i = 0; i <= n; i++) {
		uint64_t d = i < burst ? t : t + 1 + (uint64_t)(i - burst) * spread_ms * MS / burst;
		int r;

		if (i == (n + burst) / 2)
			for (unsigned k = 0; k < victims; k++)
				cr_assert_eq(chime_arm(v, 2, t + k * MS + MS / 2, 0, k, &id), 0);
		if (i == n)
			break;
		while ((r = chime_arm(a, 1, d, 0, i, &id)) == -EAGAIN)
			usleep(100);
		cr_assert_eq(r, 0, "arm %u: %s", i, strerror(-r));
	}
	for (unsigned k = 0; k < victims; k++) {
		cr_assert_eq(chime_wait(v, &ev, 1, 10000), 1, "the victim's timer %u did not fire", k);
		st = shard0(b2.sock);
		late[k] = ev.fired_ns - ev.deadline_ns;
		cr_log_info("the victim's timer %llu fired %.1f ms late; the shard had fired %llu of the "
			    "neighbour's %u when this thread looked", (unsigned long long)ev.user_data,
			    (double)late[k] / 1e6, (unsigned long long)st.fires, n);
		fires[k] = st.fires;
	}
	/* Until the shard has fired all of the neighbour's: how long its burst takes here, now. */
	do {
		st = shard0(b2.sock);
		cr_assert_lt(chime_now() - t, 20000 * MS, "the shard fired %llu of %u in 20 s",
			     (unsigned long long)st.fires, n + victims);
		usleep(1000);
	} while (st.fires < n + victims);
	all = chime_now() - t;
	cr_log_info("the neighbour's %u fired within %.1f ms", n, (double)all / 1e6);
	chime_close(v);
	chime_close(a);
	t_chimed_stop(&b2, SIGTERM);
	for (unsigned k = 0; k < victims; k++)
		if (!(late[k] < all / 2 || fires[k] < limit)) {
			snprintf(why, why_len, "the victim's timer %u fired %.1f ms late, and the neighbour's %u all "
				 "fired within %.1f ms (%llu of them when this thread had the victim's event): it "
				 "waited behind them", k, (double)late[k] / 1e6, n, (double)all / 1e6,
				 (unsigned long long)fires[k]);
			return false;
		}
	return true;
}

/*
 * A stall of the host's CPU under the shard (a stress run on this VM: the
 * burst took 53 ms where it takes 17-36) adds to both figures at once, and
 * failed the test once in a stress run. A second round on a new broker
 * tells a stall from a victim that waits behind the burst, which fails
 * every round.
 */
static void victim_beside_a_burst(unsigned burst, unsigned spread_ms, unsigned victims, uint64_t limit)
{
	char why[512];

	if (victim_beside_a_burst_once(burst, spread_ms, victims, limit, why, sizeof(why)))
		return;
	/* Not cr_log_warn(): criterion 2.4 then exits 1 although every test passed. */
	fprintf(stderr, "test_broker: round 1: %s; a second round\n", why);
	cr_assert(victim_beside_a_burst_once(burst, spread_ms, victims, limit, why, sizeof(why)), "%s", why);
}

/*
 * One client's 500k timers due at one instant take a shard tens of
 * milliseconds to fire (here its client takes none, so most are held), and
 * another client's timer due half a millisecond later waited behind all of
 * them: a victim's lateness was the size of a neighbour's burst (41-72 ms
 * behind 1M). It now goes ahead of what is left of the burst: when its
 * event arrives, the shard has fired a fraction of the burst, not all of it.
 */
ReleaseTest(broker, a_timer_due_after_a_neighbours_burst_does_not_wait_behind_it, .timeout = 120)
{
	victim_beside_a_burst(500000, 0, 1, 250000);
}

/*
 * A neighbour's burst, and more of its timers due in every tick after it
 * (6000 a tick): the timers an advance makes due went ahead of the burst's
 * backlog first come, first served, up to WHEEL_JUMP_MAX an advance, and
 * the neighbour's took those places. Only a client with few due goes ahead
 * now, so the victim's timers do, and the neighbour's wait behind its own
 * burst. Each is due while most of the burst waits: before, each came
 * after all of it.
 */
ReleaseTest(broker, a_neighbours_timers_after_its_burst_do_not_take_the_places_ahead_of_it, .timeout = 120)
{
	victim_beside_a_burst(300000, 5, 5, 300000);
}

/*
 * The start of a level-2 slot (409.6 ms at 100 us) 2.5-2.9 s ahead, in the
 * level-3 slot of now (waited for, if this one ends before it): its
 * timers are placed on level 2, and staged 409.5 ms before it starts.
 */
static uint64_t level2_slot_ahead(void)
{
	const uint64_t span2 = 4096 * 100000ull, span3 = 64 * span2;

	for (;;) {
		uint64_t now = chime_now(), base = (now / span2 + 7) * span2;

		if (base / span3 == now / span3)
			return base;
		usleep((useconds_t)((base / span3 * span3 - now) / 1000 + 1000));
	}
}

/*
 * A million timers due late in a level-2 slot (409.6 ms at 100 us): a
 * shard asleep when the slot came within its staging horizon woke only at
 * the slot's start, and moved them all down a level there, so a timer due
 * 1 ms into the slot fired 6-45 ms late (after that walk). The shard now
 * wakes when the slot comes within the horizon and stages it in the time
 * before, so the probe fires as any timer does (0.1-0.8 ms late, against
 * 41-42 ms before, 3 runs each). Judged against 10 ms, or half the time
 * the crowd itself takes to fire here, now, on a slow host (26-32 ms).
 */
ReleaseTest(broker, a_timer_due_as_a_crowded_slot_starts_is_not_held_back_by_its_cascade, .timeout = 120)
{
	const uint64_t crowd = 500000;
	struct t_chimed b2 = { 0 };
	struct chime_shard_stats st;
	struct chime_event ev;
	chime_t *a, *v;
	chime_id_t id;
	uint64_t base, late, all;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	a = t_open(b2.sock);
	v = t_open(b2.sock);
	cr_assert(a && v);
	base = level2_slot_ahead();
	for (uint64_t i = 0; i < crowd; i++)
		cr_assert_eq(chime_arm(a, 1, base + 300 * MS, 0, i, &id), 0);
	cr_assert_eq(chime_arm(v, 2, base + MS, 0, 0, &id), 0);
	cr_assert_eq(chime_wait(v, &ev, 1, 10000), 1, "the probe did not fire");
	late = ev.fired_ns - ev.deadline_ns;
	do {
		st = shard0(b2.sock);
		cr_assert_lt(chime_now(), base + 20000 * MS, "the shard fired %llu of %llu in 20 s",
			     (unsigned long long)st.fires, (unsigned long long)crowd + 1);
		usleep(1000);
	} while (st.fires < crowd + 1);
	all = chime_now() - (base + 300 * MS);
	cr_log_info("the probe fired %.2f ms late; the crowd of %llu fired within %.1f ms",
		    (double)late / 1e6, (unsigned long long)crowd, (double)all / 1e6);
	cr_assert(late < 10 * MS || late < all / 2, "the probe fired %.2f ms late, and the crowd of %llu within %.1f ms: "
		     "it waited for the crowd's cascade", (double)late / 1e6, (unsigned long long)crowd,
		     (double)all / 1e6);
	chime_close(v);
	chime_close(a);
	t_chimed_stop(&b2, SIGTERM);
}

/* Resets of one far timer, as fast as one thread sends them, until *stop. */
struct reset_flood {
	chime_t *c;
	atomic_bool stop;
};

static void *reset_flood(void *arg)
{
	struct reset_flood *f = arg;
	uint64_t far = chime_now() + 3600 * 1000 * MS;
	chime_id_t id;

	if (chime_arm(f->c, 9, far, 0, 0, &id) != 0)
		return NULL;
	for (uint64_t n = 0; !atomic_load(&f->stop); n++)
		chime_reset(f->c, id, far + (n & 1023) * 1000);
	return NULL;
}

/*
 * Two million timers spread over a level-3 slot (26.2 s at 100 us), while
 * another connection keeps the shard applying records (resets of one timer
 * of its own, without pause): the shard staged a coming cascade only when
 * idle or firing, so the flood kept it from staging, and the advance that
 * reached the slot moved all of it down a level at once: a timer due just
 * after the slot's first deadline fired 9.9-48 ms late (3 runs; 0-0.4 ms
 * without the flood). The shard now stages in every pass, a node more per
 * record it applied: 0-0.02 ms (8 runs). Judged against 8 ms, this
 * shared host's own noise staying below it: 3 of 4 runs failed before
 * (40-104 ms), the flood's thread sharing two cores with the shard.
 * The default suite crowds a level-2 slot (409.6 ms) instead, which comes
 * every 0.4 s, where a level-3 slot's boundary was waited for up to 32 s
 * (26 s of the release tests' 290 in CI): the same staging, the same
 * cascade of two million, in 2.8 s. It fails as the level-3 case did
 * with the shard staging only when idle or firing (4 of 4 runs, the
 * probe 12.1-21.7 ms late) and passed 8 of 8 without (2026-12-05). The
 * stress suite crowds the level-3 slot.
 */
ReleaseTest(broker, a_record_flood_does_not_keep_a_crowded_slot_from_being_staged, .timeout = 120)
{
	const uint64_t span2 = 4096 * 100000ull, span3 = 64 * span2, crowd = 1000000;
	const uint64_t spread = stress ? 20000 * MS : 300 * MS;
	struct t_chimed b2 = { 0 };
	struct reset_flood f = { 0 };
	struct chime_opts fo = { .flags = CHIME_OPEN_RECORD_RESETS };
	struct chime_event ev;
	pthread_t th;
	chime_t *a, *a2, *v;
	chime_id_t id;
	uint64_t now, base, late;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	a = t_open(b2.sock);
	a2 = t_open(b2.sock);
	v = t_open(b2.sock);
	fo.socket_path = b2.sock;
	cr_assert(a && a2 && v);
	cr_assert_eq(chime_open(&f.c, &fo), 0);
	if (stress) {
		/* The next level-3 slot at least 6 s away (at most 32.2 s): its cascade, not the arms, is measured. */
		now = chime_now();
		base = (now / span3 + 1) * span3;
		if (base - now < 6000 * MS)
			base += span3;
	} else {
		base = level2_slot_ahead();
	}
	/* two clients' million each: one client's quota is a million, a uid's two */
	for (uint64_t i = 0; i < 2 * crowd; i++)
		cr_assert_eq(chime_arm(i % 2 ? a2 : a, 1, base + 2 * MS + i * spread / (2 * crowd), 0, i, &id), 0);
	cr_assert_eq(chime_arm(v, 2, base + 3 * MS, 0, 0, &id), 0);
	cr_assert_lt(chime_now(), base - span2 / 4096 * 4095, "the arms took until the slot was staged: not measured");
	cr_assert_eq(pthread_create(&th, NULL, reset_flood, &f), 0);
	cr_assert_eq(chime_wait(v, &ev, 1, (int)((base - chime_now()) / MS) + 10000), 1, "the probe did not fire");
	atomic_store(&f.stop, true);
	pthread_join(th, NULL);
	late = ev.fired_ns - ev.deadline_ns;
	cr_log_info("beside a flood of resets, the probe fired %.2f ms late", (double)late / 1e6);
	cr_assert_lt(late, 8 * MS, "beside a flood of resets, the probe fired %.2f ms late: it waited for the "
		     "cascade of %llu timers the flood kept from being staged", (double)late / 1e6,
		     (unsigned long long)(2 * crowd));
	chime_close(f.c);
	chime_close(v);
	chime_close(a2);
	chime_close(a);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * chime_wait() watches the rings before it sleeps, for events a few
 * microseconds apart. It watched 50 us before every sleep, so a thread
 * waiting for a timer every millisecond or two paid 50 us of CPU per event,
 * spinning for nothing (58 us per event in all, against 28 now, in a probe
 * of a 2 ms timer). The watch halves each time it catches nothing, and is
 * whole again once events come close. The CPU it saves is too noisy to
 * test on a shared host, so this reads the library's own state. A host
 * stall delivers two periodic events together, which makes the watch
 * whole again, as it should: so the 2 ms timer runs on (up to 100 events)
 * until the watch has shrunk; a watch that never shrinks still fails
 * (once, after exactly 10 events, it was whole).
 */
ReleaseTest(broker, a_waiter_watches_briefly_for_sparse_events_and_long_for_dense_ones)
{
	chime_t *c = copen();
	struct chime_event ev[64];
	uint64_t n = 0, d0;
	bool whole = false;
	chime_id_t id;

	cr_assert_not_null(c);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 2 * MS, 2 * MS, 0, &id), 0);
	while (n < 10 || (n < 100 && (WAIT_SPIN_NS >> c->wait_spin_shift) > 10000)) {
		int r = chime_wait(c, ev, 64, 100);

		cr_assert_gt(r, 0);
		n += (uint64_t)r;
	}
	cr_assert_leq(WAIT_SPIN_NS >> c->wait_spin_shift, 10000, "a 2 ms timer, %llu events: the watch is %u ns",
		      (unsigned long long)n, WAIT_SPIN_NS >> c->wait_spin_shift);
	cr_assert_eq(chime_cancel(c, id), 0);
	/*
	 * 2000 timers 20 us apart. Up to three times: on a busy host (an ASan
	 * CI run) the events can reach this thread in clumps further apart
	 * than the whole watch, which then has nothing to catch; a watch that
	 * never comes back fails all three.
	 */
	for (unsigned attempt = 0; attempt < 3 && !whole; attempt++) {
		d0 = chime_now() + 5 * MS;
		for (unsigned i = 0; i < 2000; i++)
			cr_assert_eq(chime_arm(c, 2, d0 + i * 20000u, 0, i, &id), 0);
		for (n = 0; n < 2000;) {
			int r = chime_wait(c, ev, 64, 1000);

			cr_assert_gt(r, 0, "%llu of 2000 events", (unsigned long long)n);
			n += (uint64_t)r;
			whole |= c->wait_spin_shift == 0;
		}
	}
	cr_assert(whole, "events 20 us apart, three times, and the watch stayed at %u ns",
		  WAIT_SPIN_NS >> c->wait_spin_shift);
	chime_close(c);
}

/*
 * The next event within 1 s, which must be `id`: how long after its
 * deadline, or after `since` if that is later, it fired.
 */
static uint64_t fired_late_since(chime_t *c, chime_id_t id, uint64_t since)
{
	struct chime_event ev;

	cr_assert_eq(chime_wait(c, &ev, 1, 1000), 1, "no event within 1 s");
	cr_assert_eq(ev.id, id);
	cr_assert_geq(ev.fired_ns, ev.deadline_ns, "fired early");
	if (since < ev.deadline_ns)
		since = ev.deadline_ns;
	return ev.fired_ns > since ? ev.fired_ns - since : 0;
}

static uint64_t fired_late(chime_t *c, chime_id_t id)
{
	return fired_late_since(c, id, 0);
}

/*
 * A broker of one shard (extra options appended) and a client whose timer
 * `key`, due in an hour, is what the shard plans to wake for: records due
 * after that can wait for it. Returns the client; *far is the timer.
 */
/*
 * These tests are about records: the client resets through the ring, as
 * a session does (no touch table: test_touch.c has those).
 */
static chime_t *one_sleeping_shard(struct t_chimed *b, const char *extra, uint64_t key, chime_id_t *far)
{
	struct chime_opts o = { .flags = CHIME_OPEN_RECORD_RESETS };
	char opts[128];
	chime_t *c = NULL;

	snprintf(opts, sizeof(opts), "--shards 1 %s", extra);
	cr_assert_eq(t_chimed_start(b, NULL, opts), 0);
	o.socket_path = b->sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, key, chime_now() + 3600000 * MS, 0, key, far), 0);
	return c;
}

/*
 * A sleeping shard is not woken for what can wait for its planned wake-up
 * (cl_doorbell_by()): keepalive resets to later deadlines and cancels cost
 * no doorbell, and the control thread's heartbeat has them applied within
 * about 100 ms (half a second at rest); a reset or an arm due before the shard's wake-up still
 * rings, and fires on time. 40 resets 10 ms apart to a sleeping shard were
 * 40 wake-ups with a doorbell each; now the heartbeat's few. An urgent
 * record left to the heartbeat (no doorbell) would fire 0-90 ms late: five
 * of them all under 15 ms would be luck of about 0.2^5.
 */
/* The public segment as this process mapped it (every client does): found by its memfd's name. */
static const struct chime_pub *mapped_public_segment(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	const struct chime_pub *pub = NULL;

	cr_assert_not_null(f);
	while (!pub && fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:chime-public"))
			pub = (const struct chime_pub *)(uintptr_t)strtoull(line, NULL, 16);
	fclose(f);
	cr_assert_not_null(pub, "no chime-public mapping");
	return pub;
}

/* A sleeping shard's planned wake-up is public: rounded, it does not give away whose deadline it is. */
AsanTest(broker, the_public_wake_up_does_not_tell_another_users_deadline)
{
	struct t_chimed b2 = { 0 };
	const struct chime_pub_shard *ps;
	uint64_t deadline, wake = 0;
	chime_id_t far;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 1, &far);
	ps = (const struct chime_pub_shard *)((const char *)mapped_public_segment() + mapped_public_segment()->shards_off);
	deadline = chime_now() + 2000 * MS + 12345;
	cr_assert_eq(chime_reset(c, far, deadline), 0);
	cr_assert_eq(chime_flush(c), 0);
	/*
	 * Until the shard sleeps for the reset timer: not for its old deadline,
	 * an hour ahead, where a shard that applied the arm before the reset
	 * (at a heartbeat between the two) sleeps until the reset is applied.
	 */
	for (int i = 0; i < 150; i++, usleep(10000)) {
		wake = __atomic_load_n(&ps->wake_ns, __ATOMIC_RELAXED);
		if (wake >= deadline && wake < deadline + 1800000 * MS)
			break;
	}
	cr_assert_geq(wake, deadline, "the shard never planned to wake for the reset timer");
	cr_assert_eq(wake & ((UINT64_C(1) << 24) - 1), (UINT64_C(1) << 24) - 1,
		     "wake-up %llu for a deadline of %llu: not rounded", (unsigned long long)wake,
		     (unsigned long long)deadline);
	cr_assert_lt(wake - deadline, UINT64_C(1) << 24, "wake-up %llu, deadline %llu", (unsigned long long)wake, (unsigned long long)deadline);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

ReleaseTest(broker, records_that_can_wait_do_not_wake_a_sleeping_shard)
{
	struct t_chimed b2 = { 0 };
	struct chime_shard_stats st0, st;
	struct t_misses late_ones = { 0 };
	chime_id_t far, id;
	uint64_t far_dl;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 1, &far);
	far_dl = chime_now() + 3600000 * MS;    /* just after far's deadline */
	st0 = shard0_until(b2.sock, 0, 1);
	usleep(50000);          /* the shard sleeps until far_dl */
	st0 = shard0(b2.sock);
	for (unsigned i = 1; i <= 40; i++) {
		cr_assert_eq(chime_reset(c, far, far_dl + i * MS), 0);
		usleep(10000);
	}
	st = shard0_until(b2.sock, st0.resets + 40, 1);
	cr_assert_leq(st.sleeps - st0.sleeps, 15, "40 keepalive resets woke the sleeping shard %llu times",
		      (unsigned long long)(st.sleeps - st0.sleeps));

	/* Due before the shard's wake-up: a doorbell, on time (one of the ten may be late). */
	for (unsigned i = 0; i < 5; i++) {
		uint64_t late;

		usleep(50000);
		cr_assert_eq(chime_arm(c, 2, chime_now() + 20 * MS, 0, 2, &id), 0);
		if ((late = fired_late(c, id)) >= 15 * MS)
			t_missed(&late_ones, "round %u: an arm %.1f ms late", i, (double)late / 1e6);
		usleep(50000);
		cr_assert_eq(chime_reset(c, far, chime_now() + 20 * MS), 0);
		if ((late = fired_late(c, far)) >= 15 * MS)
			t_missed(&late_ones, "round %u: a reset %.1f ms late", i, (double)late / 1e6);
		cr_assert_eq(chime_arm(c, 1, far_dl, 0, 1, &far), 0);
	}
	cr_assert_leq(late_ones.n, 1, "%u of 10 timers due before the sleeping shard's wake-up fired 15 ms or "
		      "more late%s", late_ones.n, late_ones.what);

	/* A cancel waits too, and is applied within a heartbeat or so: no event, the node freed. */
	st0 = shard0_until(b2.sock, 0, 1);
	usleep(50000);
	cr_assert_eq(chime_cancel(c, far), 0);
	st = shard0_until(b2.sock, 0, 0);
	cr_assert_eq(chime_poll(c, &(struct chime_event){ 0 }, 1), 0, "an event after the cancel");
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * A record that can wait rings no doorbell (cl_doorbell_by()), but one
 * that cannot may lie behind it: thread A reserves a slot for a keepalive
 * reset, thread B arms a timer due soon in the next slot and rings; the
 * shard wakes, finds its head (A's slot) not published yet and sleeps
 * again. A publishes at last, sees that its own record can wait, and
 * rings nothing: B's timer, applicable now, waited for the heartbeat (up
 * to 90 ms). White box: this thread plays A, holding its slot between
 * the reserve and the publication, and B. Found by a concurrency audit.
 */
ReleaseTest(broker, a_record_that_can_wait_rings_for_those_published_behind_it)
{
	struct t_chimed b2 = { 0 };
	chime_id_t far, id;
	uint64_t far_dl;
	unsigned nlate = 0;
	char lates[128];
	size_t o = 0;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 1, &far);
	far_dl = chime_now() + 3600000 * MS;
	for (unsigned i = 1; i <= 5; i++) {
		struct chime_chan *ch = &c->chan[0];
		struct chime_sqe *held;
		uint64_t pos, late;

		usleep(50000);          /* the shard sleeps until far's deadline */
		/* A: its slot reserved, not published yet */
		held = chime_sq_reserve(&ch->sq, &pos);
		cr_assert_not_null(held);
		/* B: due before the shard's wake-up, so it rings */
		cr_assert_eq(chime_arm(c, 2, chime_now() + 25 * MS, 0, 2, &id), 0);
		usleep(15000);          /* the shard woke, found A's slot empty, sleeps again */
		/* A: a keepalive reset, which can wait for far's deadline */
		at_store(&held->id, far);
		at_store(&held->key, 0);
		at_store(&held->deadline_ns, far_dl + i * MS);
		at_store(&held->period_ns, 0);
		at_store(&held->user_data, 0);
		at_store(&held->op, CHIME_OP_RESET);
		chime_sq_publish(held, pos);
		cl_doorbell_by(ch, far_dl + i * MS, pos, 1);
		/*
		 * From A's publication when that is after B's deadline: on a busy
		 * host the usleep() above can overrun B's 25 ms, and B cannot be
		 * applied before A. Left to the heartbeat, B waits up to 90 ms.
		 */
		late = fired_late_since(c, id, chime_now());
		if (late >= 8 * MS)
			nlate++;
		o += (size_t)snprintf(lates + o, sizeof(lates) - o, " %.1f", (double)late / 1e6);
	}
	/*
	 * One round in five may be late on a busy host (an ASan CI run); the
	 * missing doorbell makes every round late (about 15 ms here).
	 */
	cr_assert_leq(nlate, 1, "the arm behind a record that could wait fired late (ms):%s", lates);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/* Milliseconds until shard 0 counts `arms` arms and `armed` timers (UINT64_MAX: any; at most 2 s). */
static double ms_until(const char *s, uint64_t arms, uint64_t armed)
{
	uint64_t t0 = chime_now(), end = t0 + 2000 * MS;
	struct chime_shard_stats st;

	do {
		st = shard0(s);
		if (st.arms >= arms && (st.armed == armed || armed == UINT64_MAX))
			return (double)(chime_now() - t0) / 1e6;
		usleep(500);
	} while (chime_now() < end);
	cr_assert_fail("shard 0: %llu arms (want %llu), %llu armed (want %llu) after 2 s",
		       (unsigned long long)st.arms, (unsigned long long)arms,
		       (unsigned long long)st.armed, (unsigned long long)armed);
	return 0;
}

/* Arms from..n-1 of a burst, due in two hours, through chime_submit() 64 at a time; their ids in ops[]. */
static void arm_far_from(chime_t *c, struct chime_op *ops, unsigned from, unsigned n)
{
	uint64_t dl = chime_now() + 7200000 * MS;

	for (unsigned i = from; i < n; i++)
		ops[i] = (struct chime_op){ .op = CHIME_ARM, .key = 7, .deadline_ns = dl + i };
	for (unsigned i = from; i < n; i += 64) {
		unsigned k = n - i < 64 ? n - i : 64;

		cr_assert_eq(chime_submit(c, ops + i, k), (int)k);
	}
}

static void arm_far(chime_t *c, struct chime_op *ops, unsigned n)
{
	arm_far_from(c, ops, 0, n);
}

/* Shard 0's sleep number, in the public segment as c mapped it (0: awake). */
static uint32_t shard0_sleep_no(const chime_t *c)
{
	const struct chime_pub_shard *ps = (const struct chime_pub_shard *)((const char *)c->pub + c->pub->shards_off);

	return __atomic_load_n(&ps->sleeping, __ATOMIC_SEQ_CST);
}

/*
 * A burst that can wait does not wake a sleeping shard either, up to half
 * its ring (default 1024 slots): 400 arms wait for the shard's next wake-up
 * (the heartbeat's, 0-90 ms away); 700 wake it at the 513th (in the call
 * of the 513th to 576th); and chime_flush() wakes it for the 400 at once.
 * Luck would pass this test with odds of about (5/90)^5 (no burst waits)
 * or (15/90)^5 (no doorbell from the fill, or from chime_flush).
 *
 * What the doorbell promises is the 576 published when it rang: the 124
 * after it are applied at once if the shard is still awake, and else, fewer
 * than half a ring, wait for the heartbeat as any burst that small does (a
 * test process preempted in the middle of its burst, under ASan, saw that,
 * 62 ms). And the heartbeat rings a sleeping shard with records waiting:
 * one that comes before the 513th has the shard apply what is there, and
 * what is left never waits for more than half a ring. Such a round (the
 * shard's sleep number changed before the 513th) says nothing of the
 * doorbell and is run again; five rounds must be left.
 *
 * Of the ten doorbells of the five rounds, one may come late (a test
 * process or shard preempted for 15 ms on a loaded host): a missing
 * doorbell would leave most of its five late, each with odds of about 5/6.
 */
ReleaseTest(broker, a_burst_waits_for_the_shard_up_to_half_a_ring_or_chime_flush)
{
	struct t_chimed b2 = { 0 };
	static struct chime_op ops[700];
	struct t_misses slow = { 0 };
	double lazy_max = 0;
	unsigned rounds = 0, tries = 0;
	uint64_t arms;
	chime_id_t anchor;
	chime_t *c;

	/* the shard's planned wake-up: an hour away, before the burst's deadlines */
	c = one_sleeping_shard(&b2, "--sq-size 1024", 1, &anchor);
	arms = 1;
	for (; rounds < 5; tries++) {
		unsigned n[3] = { 400, 400, 700 };
		bool woken = false;

		cr_assert_lt(tries, 10, "the heartbeat came in the middle of the burst in %u of %u rounds",
			     tries - rounds, tries);
		for (unsigned k = 0; k < 3; k++) {
			uint32_t asleep;
			double ms;

			usleep(50000);          /* the shard sleeps: nothing armed is due */
			asleep = shard0_sleep_no(c);
			if (k < 2) {
				arm_far(c, ops, n[k]);
			} else {
				arm_far_from(c, ops, 0, 512);
				woken = asleep == 0 || shard0_sleep_no(c) != asleep;
				arm_far_from(c, ops, 512, n[k]);
			}
			if (k == 1)
				cr_assert_eq(chime_flush(c), 0);
			ms = k < 2 ? ms_until(b2.sock, arms + n[k], n[k] + 1) : ms_until(b2.sock, arms + 576, UINT64_MAX);
			arms += n[k];
			if (k == 0 && ms > lazy_max)
				lazy_max = ms;
			if (k > 0 && !woken && ms >= 15.0)
				t_missed(&slow, "try %u: %s, %.1f ms", tries,
				       k == 1 ? "400 arms and chime_flush()" : "the first 576 arms of 700", ms);
			(void)ms_until(b2.sock, arms, n[k] + 1);
			cr_assert_eq(chime_cancel_key(c, 7), 0);
			cr_assert_eq(chime_flush(c), 0);
			(void)ms_until(b2.sock, arms, 1);
		}
		rounds += !woken;
	}
	cr_assert_leq(slow.n, 1, "doorbells that came 15 ms or more late, %u of 10%s", slow.n, slow.what);
	cr_assert_gt(lazy_max, 5.0, "400 arms to a sleeping shard were applied within %.1f ms in every round: "
		     "they woke it", lazy_max);
	cr_assert_eq(chime_flush(NULL), -EINVAL);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * Every drain that finds events scans the records its shard has not applied
 * (for cancels and resets that void them); a burst that waits for a
 * sleeping shard would be scanned again on every drain until the shard
 * wakes, so a drain that scans 64 or more wakes it. Left to the
 * heartbeat, the rounds after the first would wait about 85 ms each.
 *
 * A heartbeat that comes in the middle of the burst has the shard apply
 * what is there, and the drain may then find fewer than 64 waiting: such
 * a round (the shard's sleep number changed during the burst) is run
 * again; five rounds must be left, and one of them may be late (preempted
 * for 15 ms on a loaded host): left to the heartbeat, all five would be.
 */
ReleaseTest(broker, a_drain_that_scans_many_waiting_records_wakes_the_shard)
{
	struct t_chimed b2 = { 0 };
	static struct chime_op ops[400];
	struct chime_event ev;
	struct t_misses slow = { 0 };
	uint64_t arms = 1;
	unsigned rounds = 0;
	chime_id_t anchor, x;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 1, &anchor);
	for (unsigned round = 0; rounds < 5; round++) {
		uint32_t before, asleep, later;
		double ms;

		cr_assert_lt(round, 10, "the heartbeat came in the middle of the burst in %u of %u rounds",
			     round - rounds, round);

		cr_assert_eq(chime_arm(c, 2, chime_now() + 20 * MS, 0, 2, &x), 0);
		arms++;
		/*
		 * x fires, its event waits, the shard sleeps again. 95 ms: a
		 * round that waited for the heartbeat (90 ms) ends on one, and
		 * the next round's burst then comes 5 ms after the next
		 * heartbeat, not just before one.
		 */
		usleep(95000);
		before = shard0_sleep_no(c);
		arm_far(c, ops, 400);
		arms += 400;
		/* What a failure needs to say: was the shard asleep when the drain looked, and did it wake. */
		asleep = shard0_sleep_no(c);
		cr_assert_eq(chime_poll(c, &ev, 1), 1);
		cr_assert_eq(ev.id, x);
		usleep(2000);
		later = shard0_sleep_no(c);
		ms = ms_until(b2.sock, arms, 401);
		if (before != 0 && asleep == before) {
			rounds++;
			if (ms >= 15.0)
				t_missed(&slow, "round %u: %.1f ms after it (+2), the shard's sleep number before "
				       "the drain %u, 2 ms after it %u (0: awake)", round, ms, asleep, later);
		}
		cr_assert_eq(chime_cancel_key(c, 7), 0);
		cr_assert_eq(chime_flush(c), 0);
		(void)ms_until(b2.sock, arms, 1);
	}
	cr_assert_leq(slow.n, 1, "drains that scanned 400 waiting records, and the records were applied "
		      "15 ms or more after, in %u of 5 rounds%s", slow.n, slow.what);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/* The control thread's last heartbeat pass (broker_run() stores it before the pass's work). */
static uint64_t heartbeat_of(const chime_t *c)
{
	return __atomic_load_n(&c->pub->heartbeat_ns, __ATOMIC_SEQ_CST);
}

/* Wait (up to 1 s) for a heartbeat pass after `after`; return its time. */
static uint64_t next_heartbeat(const chime_t *c, uint64_t after)
{
	uint64_t end = chime_now() + 1000 * MS, hb;

	while ((hb = heartbeat_of(c)) == after) {
		cr_assert_lt(chime_now(), end, "no heartbeat in 1 s");
		usleep(200);
	}
	return hb;
}

/*
 * An arm a second or more ahead does not wake a shard that sleeps with
 * nothing armed: the control thread's heartbeat pass (every 90 ms) has it
 * applied, and it fires on time. Told by cause, not by the clock: an arm
 * is lazy when the heartbeat read just after it had moved on by the time
 * the arm was seen applied (a doorbell applies it at once, within the same
 * heartbeat but for 1 round in about 90). 3 of 4 rounds must be lazy, so
 * that one round on a loaded machine cannot fail the test.
 *
 * The last arm's deadline falls halfway between two heartbeat passes (they
 * come every 90 ms and a little more): a shard that did not set its own
 * wake-up for it would fire it at the next pass, some 45 ms late.
 */
ReleaseTest(broker, an_arm_a_second_ahead_waits_for_the_heartbeat_not_a_doorbell)
{
	struct t_chimed b2 = { 0 };
	struct chime_event ev;
	char ms_of[160] = "";
	unsigned lazy = 0, measured = 0;
	uint64_t arms = 0, hb = 0;
	chime_id_t x;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	c = t_open(b2.sock);
	cr_assert_not_null(c);
	for (unsigned round = 0; round < 5; round++) {
		uint64_t deadline, t0, hb_arm;
		size_t len = strlen(ms_of);
		double ms;

		usleep(20000);          /* nothing armed: the shard sleeps with no timeout */
		hb = next_heartbeat(c, heartbeat_of(c));
		t0 = chime_now();
		/* 12 passes on, and half of one (HEARTBEAT_NS is 90 ms): 1.125 s ahead. */
		deadline = round == 4 ? hb + 12 * 90 * MS + 45 * MS : t0 + 1500 * MS;
		cr_assert_eq(chime_arm(c, 1, deadline, 0, 1, &x), 0);
		hb_arm = heartbeat_of(c);
		ms = ms_until(b2.sock, ++arms, 1);
		if (round > 0) {
			measured++;
			lazy += heartbeat_of(c) != hb_arm;
			snprintf(ms_of + len, sizeof(ms_of) - len, " %.1f%s", ms,
				 heartbeat_of(c) != hb_arm ? "" : " (no heartbeat between)");
		}
		if (round < 4) {
			cr_assert_eq(chime_cancel(c, x), 0);
			cr_assert_eq(chime_flush(c), 0);
			(void)ms_until(b2.sock, arms, 0);
		}
	}
	cr_assert_geq(lazy, measured - 1, "arms 1 s or more ahead applied after (ms):%s; "
		      "with no heartbeat between, a doorbell woke the shard", ms_of);
	cr_assert_eq(chime_wait(c, &ev, 1, 3000), 1, "no event within 3 s");
	cr_assert_eq(ev.id, x);
	cr_assert_geq(ev.fired_ns, ev.deadline_ns, "fired early");
	cr_assert_lt(ev.fired_ns - ev.deadline_ns, 25 * MS,
		     "the arm that waited for the heartbeat fired %.1f ms late, as at a heartbeat pass",
		     (double)(ev.fired_ns - ev.deadline_ns) / 1e6);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/* Heartbeats seen over `ms` (polled every 200 us), and the longest gap between two. */
static unsigned beats_over(const chime_t *c, unsigned ms, double *longest_ms)
{
	uint64_t end = chime_now() + ms * MS, hb = heartbeat_of(c), prev = hb;
	unsigned n = 0;

	*longest_ms = 0;
	while (chime_now() < end) {
		uint64_t now = heartbeat_of(c);

		if (now != prev) {
			if (n > 0 && (double)(now - prev) / 1e6 > *longest_ms)
				*longest_ms = (double)(now - prev) / 1e6;
			n++;
			prev = now;
		}
		usleep(200);
	}
	return n;
}

/*
 * A broker at rest (its shard asleep with nothing due for an hour, no
 * record waiting, no client coming or going) beats every 450 ms after a
 * second of quiet, not every 90 ms: 2.2 wake-ups a second instead of 11
 * (IDLE_BEAT_NS, broker/broker.h). Within what the library allows: no gap
 * of a second (a broker taken for dead), and an arm due 1.5 s ahead, which
 * rings no doorbell, is applied at the next beat, well before its deadline,
 * and fires on time. Anything to do has it beat every 90 ms again at once.
 * Counts with generous bounds: 2 s at 90 ms is 22 beats, at 450 ms 4 or 5.
 */
ReleaseTest(broker, a_broker_at_rest_beats_slower_and_picks_up_at_once)
{
	struct t_chimed b2 = { 0 };
	struct chime_event ev;
	double longest, ms;
	unsigned idle, busy;
	uint64_t deadline;
	chime_id_t far, x;
	chime_t *c;
	int clock_watch = t_clock_watch();

	c = one_sleeping_shard(&b2, "", 1, &far);
	(void)ms_until(b2.sock, 1, 1);
	t_at_rest_within(b2.sock, 1500);  /* QUIET_BEATS: a second of heartbeats with nothing to do */
	idle = beats_over(c, 2000, &longest);
	t_clock_set_skips(clock_watch, &b2);
	cr_assert_leq(idle, 8, "%u heartbeats in 2 s at rest: not the idle beat", idle);
	cr_assert_geq(idle, 2, "%u heartbeats in 2 s at rest", idle);
	cr_assert_lt(longest, 900.0, "%.0f ms between two heartbeats: a client takes a second for a dead broker",
		     longest);
	cr_assert_eq(t_beat_ms_becomes(b2.sock, 450, 200), 450, "the period chimestat shows at rest");

	deadline = chime_now() + 1500 * MS;
	cr_assert_eq(chime_arm(c, 1, deadline, 0, 1, &x), 0);
	ms = ms_until(b2.sock, 2, 2);
	cr_assert_lt(ms, 1000.0, "the arm 1.5 s ahead was applied after %.0f ms", ms);
	cr_assert_eq(t_beat_ms_becomes(b2.sock, 90, 200), 90, "the period chimestat shows once busy again");
	busy = beats_over(c, 450, &longest);
	cr_assert_geq(busy, 3, "%u heartbeats in the 450 ms after a record was applied: still the idle beat", busy);

	cr_assert_eq(chime_wait(c, &ev, 1, 3000), 1, "no event within 3 s");
	cr_assert_eq(ev.id, x);
	cr_assert_geq(ev.fired_ns, ev.deadline_ns, "fired early");
	cr_assert_lt(ev.fired_ns - ev.deadline_ns, 25 * MS, "fired %.1f ms late",
		     (double)(ev.fired_ns - ev.deadline_ns) / 1e6);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * What the broker must not wait for on a shard or the control thread (a
 * slab chunk reserved and mapped, a client's touch-table pages mapped, a
 * client's descriptors closed) runs on threads of its own that wait for
 * work with no timeout (broker/aside.h), not on io_uring's workers: io-wq
 * keeps the last worker of each thread that used one for good and wakes
 * it every 5 s, which were the broker's only wake-ups at rest beyond its
 * heartbeat (chime-bench rest: 0.6 a second, two shards). After a slab
 * grown by several chunks, resets to later deadlines (the touch table)
 * and a client's hang-up, no io_uring worker is left.
 */
ReleaseTest(broker, growth_touches_and_closes_leave_no_io_uring_worker_behind, .timeout = 90)
{
	enum { N = 200000 };
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { 0 };
	chime_id_t *ids = calloc(N, sizeof(*ids));
	uint64_t far = chime_now() + 3600000 * MS;
	unsigned workers;
	chime_t *c;

	cr_assert_not_null(ids);
	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1 --max-timers-per-client 0"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	for (unsigned i = 0; i < N; i++) {
		int r;

		while ((r = chime_arm(c, i, far, 0, i, &ids[i])) == -EAGAIN)
			usleep(100);
		cr_assert_eq(r, 0, "arm %u: %s", i, strerror(-r));
	}
	cr_assert_eq(chime_flush(c), 0);
	for (unsigned i = 0; i < N; i++) {
		int r;

		while ((r = chime_reset(c, ids[i], far + (1 + i % 1000) * MS)) == -EAGAIN)
			usleep(100);
		cr_assert_eq(r, 0, "reset %u: %s", i, strerror(-r));
	}
	cr_assert_eq(chime_flush(c), 0);
	t_at_rest_within(b2.sock, 3000);
	chime_close(c);
	usleep(300 * 1000);     /* the hang-up's closes */
	workers = t_threads_prefixed(b2.pid, "iou-wrk");
	fprintf(stderr, "after %u arms and resets and a hang-up: %u io_uring workers, %u aside, %u closer threads\n",
		N, workers, t_threads_prefixed(b2.pid, "chimed-aside"), t_threads_prefixed(b2.pid, "chimed-closer"));
	cr_assert_eq(workers, 0, "%u io_uring workers in the broker", workers);
	cr_assert_eq(t_threads_prefixed(b2.pid, "chimed-aside0"), 1, "the shard's aside thread");
	cr_assert_eq(t_threads_prefixed(b2.pid, "chimed-closer"), 1, "the closer thread, and no more at rest");
	cr_assert_eq(t_chimed_stop(&b2, SIGTERM), 0);
	free(ids);
}

/*
 * A session's process attached with nothing in hand rests like any client
 * (450 ms beats). Once a shard gives it events, the beat is back at 90 ms
 * at once, until the shard has seen them taken: the beat is what has a
 * sleeping shard see what that process took (taken_unseen(), control.c),
 * and a crash delivers again what it had not seen taken, so that window
 * stays ~100 ms at rest too. The shard wakes the control thread
 * (rest_end(), shard.c): left to the idle beat, the first take after a
 * rest went unseen up to 450 ms. 1 s at 90 ms is 11 beats, at 450 ms 2 or 3.
 */
ReleaseTest(broker, a_session_process_at_rest_has_the_90_ms_beat_while_it_has_events_to_take)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { .session = "beat" };
	struct chime_event ev;
	double longest;
	unsigned n;
	chime_id_t far, soon;
	uint64_t due;
	chime_t *c;
	int clock_watch = t_clock_watch();

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	due = chime_now() + 4500 * MS;
	cr_assert_eq(chime_arm(c, 1, chime_now() + 3600000 * MS, 0, 1, &far), 0);
	cr_assert_eq(chime_arm(c, 2, due, 0, 2, &soon), 0);
	cr_assert_eq(chime_flush(c), 0);
	/* past QUIET_BEATS: about 1.2 s, longer on a loaded host (a fresh CI run's 1.5 s sleep was short once) */
	t_at_rest_within(b2.sock, 2500);
	cr_assert_lt(chime_now() + 1000 * MS, due, "at rest only %.0f ms before the deadline",
		     (double)(due - chime_now()) / 1e6);
	n = beats_over(c, 1000, &longest);
	t_clock_set_skips(clock_watch, &b2);
	cr_assert_leq(n, 5, "%u heartbeats in 1 s with a session's process attached and nothing in hand: not at rest", n);

	cr_assert_eq(chime_wait(c, &ev, 1, 4500), 1, "no event within 4.5 s");
	cr_assert_eq(ev.id, soon);
	cr_assert_lt(chime_now() - due, 100 * MS, "taken %.0f ms after it was due", (double)(chime_now() - due) / 1e6);
	n = beats_over(c, 450, &longest);
	cr_assert_geq(n, 4, "%u heartbeats in the 450 ms after a session's process got an event: still the idle beat", n);

	t_at_rest_within(b2.sock, 1500);  /* seen taken, then a second of quiet */
	n = beats_over(c, 1000, &longest);
	t_clock_set_skips(clock_watch, &b2);
	cr_assert_leq(n, 5, "%u heartbeats in 1 s once the take was seen: not at rest again", n);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * A session's process with an event it never takes (stopped, draining on a
 * schedule of its own, or hostile) kept the 90 ms beat for good, for every
 * user's broker: 11 beats a second where a broker at rest has 2 or 3. The
 * beat stays at 90 ms for a second after its last take (WATCH_WAIT_NS,
 * takes_awake() in control.c); then the broker rests, and its next take is
 * seen at the next idle beat, which brings the 90 ms beat back.
 */
ReleaseTest(broker, a_session_process_that_takes_nothing_lets_the_broker_rest)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { .session = "untaken" };
	struct chime_event ev;
	double longest;
	unsigned n;
	chime_id_t far, soon;
	chime_t *c;
	int clock_watch = t_clock_watch();

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 3600000 * MS, 0, 1, &far), 0);
	cr_assert_eq(chime_arm(c, 2, chime_now() + 200 * MS, 0, 2, &soon), 0);
	cr_assert_eq(chime_flush(c), 0);
	/* delivered into the ring at 200 ms, never taken: a second of watching, then a second of quiet */
	t_at_rest_within(b2.sock, 2600);
	n = beats_over(c, 1000, &longest);
	t_clock_set_skips(clock_watch, &b2);
	cr_assert_leq(n, 5, "%u heartbeats in 1 s with a session's event untaken for 2.4 s: not at rest", n);

	cr_assert_eq(chime_poll(c, &ev, 1), 1, "the event was not in the ring");
	cr_assert_eq(ev.id, soon);
	n = beats_over(c, 1000, &longest);
	cr_assert_geq(n, 6, "%u heartbeats in the second after the take: the take was not seen, or not at once", n);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * The period the tools show (beat_ms) is the one in force from the beat
 * that changes it: whenever it says 90 ms, the heartbeat is no older than
 * about a 90 ms beat. Before, it was stored after the wait that followed
 * that beat, so through a rest's whole first beat chimestat said "every
 * 90 ms" beside a heartbeat 450 ms old (found by a review).
 */
ReleaseTest(broker, the_period_shown_is_in_force_from_the_beat_that_changes_it)
{
	struct t_chimed b2 = { 0 };
	struct chime_map m;
	const struct chime_ctl *ctl;
	uint64_t end, worst = 0;
	char path[300];
	chime_id_t far;
	chime_t *c;
	int clock_watch = t_clock_watch();

	c = one_sleeping_shard(&b2, "", 1, &far);
	(void)ms_until(b2.sock, 1, 1);
	snprintf(path, sizeof(path), "%s.ctl", b2.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	ctl = m.base;
	/* Until the rest's first beat is over: it begins after a second of quiet. */
	end = chime_now() + 2500 * MS;
	while (chime_now() < end) {
		uint32_t ms = at_load(&ctl->beat_ms);
		uint64_t hb = at_load(&ctl->heartbeat_ns), now = chime_now();

		if (ms == 90 && now > hb && now - hb > worst)
			worst = now - hb;
		if (ms == 450 && end > now + 600 * MS)
			end = now + 600 * MS;
		usleep(1000);
	}
	if (at_load(&ctl->beat_ms) != 450)
		t_clock_set_skips(clock_watch, &b2);
	cr_assert_eq(at_load(&ctl->beat_ms), 450, "not at rest after 2.5 s");
	chime_seg_unmap(&m);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
	cr_assert_lt(worst, 200 * MS, "the tools read 'every 90 ms' beside a heartbeat %.0f ms old",
		     (double)worst / 1e6);
}

/*
 * A hello whose welcome is never read, its socket shut down and kept open:
 * the slot is HELD for as long as the peer keeps the socket (handshake.c).
 * Counted as "coming or going" for good, that one socket, which costs its
 * owner nothing, kept every user's broker at the 90 ms beat (found by a
 * review). Now it keeps it so for HELD_WAIT_NS (1 s) at most.
 */
ReleaseTest(broker, a_welcome_never_read_keeps_the_broker_from_resting_a_second_at_most)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	struct t_chimed b2 = { 0 };
	struct chime_map m;
	const struct chime_ctl *ctl;
	char path[300];
	double longest;
	unsigned n;
	chime_id_t far;
	chime_t *c;
	int fd, clock_watch = t_clock_watch();

	c = one_sleeping_shard(&b2, "", 1, &far);
	snprintf(path, sizeof(path), "%s.ctl", b2.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	ctl = m.base;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	memcpy(sa.sun_path, b2.sock, strlen(b2.sock) + 1);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
	for (int k = 0; k < 2000 && at_load(&ctl->clients_total) < 2; k++)
		usleep(1000);
	shutdown(fd, SHUT_RDWR);        /* the broker sees it go; the welcome stays unread */
	for (int k = 0; k < 2000 && at_load(&ctl->clients_now) != 1; k++)
		usleep(1000);
	cr_assert_eq(at_load(&ctl->clients_now), 1, "the broker did not see the client go");
	t_at_rest_within(b2.sock, 2600);  /* HELD_WAIT_NS, then QUIET_BEATS, and a margin */
	n = beats_over(c, 1000, &longest);
	close(fd);
	chime_seg_unmap(&m);
	chime_close(c);
	t_clock_set_skips(clock_watch, &b2);
	t_chimed_stop(&b2, SIGTERM);
	/* 1 s at 90 ms is 11 beats, at 450 ms 2 or 3 */
	cr_assert_leq(n, 5, "%u heartbeats in 1 s with one welcome unread and nothing to do: not at rest", n);
}

/*
 * A process resumes its own detached session (CHIME_HELLO_RESUME) and
 * publishes a record at the head of its ring but never its word
 * (resume_set). The shard applies nothing until the word (chan.c,
 * word_wait) and sleeps; the beat saw a record waiting at every beat, rang
 * the shard and counted itself busy: one store, for as long as that
 * connection lived, kept the control thread at 11 beats a second and the
 * shard at 11 wake-ups, for everyone (found by a review).
 */
ReleaseTest(broker, a_resume_that_never_gives_its_word_does_not_keep_the_broker_from_resting)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { .session = "hog" };
	struct chime_welcome w;
	struct chime_map maps[3];
	struct cl_own own;
	struct chime_client_geom g;
	struct chime_shard_stats s0, s1;
	const struct chime_pub *pub;
	struct chime_sqe *slot;
	uint64_t base = UINT64_C(1) << 40, end, hb, prev;
	unsigned nfds = 0, beats = 0;
	int fds[CHIME_MAX_FDS], sk = -1, clock_watch = t_clock_watch();
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	chime_close(c);         /* detached */
	cr_assert_eq(cl_dial(b2.sock, "hog", CHIME_HELLO_RESUME, base, 0, &sk, &w, fds, &nfds, &own), 0);
	cr_assert_eq(cl_map(&w, fds, &own, maps, &g), 0);
	pub = maps[0].base;
	slot = chime_at(&maps[1], g.rw_sq_off);         /* shard 0's ring; base is a multiple of its size */
	slot[base & (g.sq_size - 1)].op = CHIME_OP_NOP;
	at_store_rel(&slot[base & (g.sq_size - 1)].seq, base + 1);
	t_at_rest_within(b2.sock, 1500);  /* QUIET_BEATS, and a margin */
	s0 = shard0(b2.sock);
	end = chime_now() + 1000 * MS;
	prev = at_load(&pub->heartbeat_ns);
	while (chime_now() < end) {
		hb = at_load(&pub->heartbeat_ns);
		beats += hb != prev;
		prev = hb;
		usleep(200);
	}
	s1 = shard0(b2.sock);
	for (int i = 0; i < 3; i++)
		chime_seg_unmap(&maps[i]);
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	close(sk);
	t_clock_set_skips(clock_watch, &b2);
	t_chimed_stop(&b2, SIGTERM);
	/* 1 s at 90 ms is 11 beats, at 450 ms 2 or 3 */
	cr_assert_leq(beats, 5, "%u heartbeats in 1 s with one resumed session that never gave its word: "
		      "not at rest", beats);
	cr_assert_leq(s1.sleeps - s0.sleeps, 2, "shard 0 slept %llu times in 1 s: woken for a record it cannot apply",
		      (unsigned long long)(s1.sleeps - s0.sleeps));
}

/*
 * Records that ring no doorbell while the broker beats at rest, published
 * together after 1.6 s of rest (the idle beat, 450 ms): a reset of the far
 * timer to a second ahead, an arm 20 ms after it, a burst of 64 arms
 * (chime_submit) 20 ms after that. Each must still fire on time: the beat
 * applies them at least half a second before they are due. Staggered, so
 * that each kind is the earliest when it falls due and must set the
 * shard's wake-up itself: one applied without would fire 20 ms late with
 * the next, or an hour late. Two rounds; one of the six may be late on a
 * loaded host.
 */
ReleaseTest(broker, lazy_records_a_second_ahead_at_rest_fire_on_time, .timeout = 60)
{
	struct t_chimed b2 = { 0 };
	struct t_misses late_ones = { 0 };
	struct chime_op ops[64];
	struct chime_event ev[64];
	chime_id_t far, x;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 1, &far);
	for (unsigned i = 0; i < 2; i++) {
		static const char *const kind[] = { "a reset", "an arm", "a burst" };
		uint64_t due, late[3] = { 0 };
		unsigned got = 0;

		t_at_rest_within(b2.sock, 1600);  /* at rest: the idle beat */
		due = chime_now() + 1000 * MS + 500000;
		cr_assert_eq(chime_reset(c, far, due), 0);
		cr_assert_eq(chime_arm(c, 2, due + 20 * MS, 0, 2, &x), 0);
		for (unsigned k = 0; k < 64; k++)
			ops[k] = (struct chime_op){ .op = CHIME_ARM, .key = 100 + k, .user_data = 100 + k,
						    .deadline_ns = due + 40 * MS };
		cr_assert_eq(chime_submit(c, ops, 64), 64);
		while (got < 66) {
			int r = chime_wait(c, ev, 64, 3000);

			cr_assert_gt(r, 0, "round %u: no event within 3 s (%u of 66)", i, got);
			for (int k = 0; k < r; k++) {
				unsigned which = ev[k].user_data == 1 ? 0 : ev[k].user_data == 2 ? 1 : 2;

				cr_assert_geq(ev[k].fired_ns, ev[k].deadline_ns, "fired early");
				if (ev[k].fired_ns - ev[k].deadline_ns > late[which])
					late[which] = ev[k].fired_ns - ev[k].deadline_ns;
			}
			got += (unsigned)r;
		}
		for (unsigned k = 0; k < 3; k++)
			if (late[k] >= 15 * MS)
				t_missed(&late_ones, "round %u: %s %.1f ms late", i, kind[k], (double)late[k] / 1e6);
		cr_assert_eq(chime_arm(c, 1, chime_now() + 3600000 * MS, 0, 1, &far), 0);
	}
	cr_assert_leq(late_ones.n, 1, "late at rest in %u of 6%s", late_ones.n, late_ones.what);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * The touch that races with the timeout: an idle timer fired and its event
 * waits in the ring when a keepalive resets it to a later deadline. That
 * reset rings no doorbell (the sleeping shard's wake-up comes first), but
 * the drainer must hold the event until the shard has applied it, and the
 * events behind it too: so the drainer wakes the shard. Left to the
 * heartbeat, the next event would come 0-90 ms late; four rounds of five
 * under 20 ms (one may be late on a loaded host) would be luck of about
 * 5 x 0.2^4.
 */
ReleaseTest(broker, a_reset_racing_its_event_does_not_hold_the_drainer_for_a_heartbeat)
{
	struct t_chimed b2 = { 0 };
	struct t_misses late_ones = { 0 };
	chime_id_t far, x, v;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 0, &far);
	for (unsigned round = 0; round < 5; round++) {
		struct chime_event ev;
		uint64_t t0, t;

		cr_assert_eq(chime_arm(c, 1, chime_now() + 20 * MS, 0, 1, &x), 0);
		cr_assert_eq(chime_arm(c, 2, chime_now() + 25 * MS, 0, 2, &v), 0);
		usleep(100000);         /* both fired; the shard sleeps until `far` */
		cr_assert_eq(chime_reset(c, x, chime_now() + 7200000 * MS), 0);
		t0 = chime_now();
		cr_assert_eq(chime_wait(c, &ev, 1, 1000), 1, "no event within 1 s");
		t = chime_now() - t0;
		cr_assert_eq(ev.id, v, "the event of the reset timer was returned");
		if (t >= 20 * MS)
			t_missed(&late_ones, "round %u: %.1f ms", round, (double)t / 1e6);
		cr_assert_eq(chime_cancel(c, x), 0);
	}
	cr_assert_leq(late_ones.n, 1, "the next event waited 20 ms or more for the reset to be applied in %u of "
		      "5 rounds%s", late_ones.n, late_ones.what);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

AsanTest(broker, periodic_reset_restarts_period_from_new_deadline)
{
	chime_t *c = copen();
	struct chime_event ev[8];
	uint64_t p = 20 * MS, d1;
	chime_id_t id;
	int k = 0;

	cr_assert_not_null(c);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 10 * MS, p, 0, &id), 0);
	cr_assert_gt(chime_wait(c, ev, 1, 1000), 0);
	d1 = chime_now() + 33 * MS;
	cr_assert_eq(chime_reset(c, id, d1), 0);
	while (k < 4) {
		int r = chime_wait(c, ev, 8, 1000);

		cr_assert_gt(r, 0);
		for (int i = 0; i < r; i++, k++)
			cr_assert_eq(ev[i].deadline_ns, d1 + (uint64_t)k * p, "firing %d after reset", k);
	}
	chime_close(c);
}

/* ---- a client killed with SIGKILL ---- */

static int pipe_fd[2];

static int idle_armer(int idx)
{
	chime_t *c = copen();
	chime_id_t id;

	CHECK(c, "open");
	for (int i = 0; i < 5000; i++)
		CHECK(chime_arm(c, 0, chime_now() + 60000 * MS, 0, 0, &id) == 0, "arm");
	CHECK(write(pipe_fd[1], "x", 1) == 1, "pipe");
	for (;;)
		pause();
}

static int small_worker(int idx)
{
	chime_t *c = copen();
	struct chime_event ev[64];
	chime_id_t id;
	int got = 0;

	CHECK(c, "open");
	for (int i = 0; i < 500; i++)
		CHECK(chime_arm(c, 0, chime_now() + (uint64_t)(i % 100) * 3 * MS, 0, 0, &id) == 0, "arm");
	while (got < 500) {
		int r = chime_wait(c, ev, 64, 2000);

		CHECK(r > 0, "worker starved: %d of 500 (r=%d)", got, r);
		got += r;
	}
	CHECK(chime_wait(c, ev, 64, 50) == 0, "extra");
	chime_close(c);
	return 0;
}

AsanTest(broker, client_sigkill_reclaims_its_timers)
{
	size_t armed = offsetof(struct chime_shard_ctl, stats.armed);
	uint64_t base;
	pid_t victim, worker;
	char x;
	int st;

	(void)wait_sum(armed, 0, 2000);        /* earlier cases' timers gone, or counted in base */
	base = ctl_sum(armed);
	cr_assert_eq(pipe(pipe_fd), 0);
	run_children(1, idle_armer, &victim);
	cr_assert_eq(read(pipe_fd[0], &x, 1), 1);
	for (uint64_t t0 = now_ns(); ctl_sum(armed) < base + 5000; msleep(5))
		cr_assert_lt(now_ns() - t0, 5000 * MS, "the broker never counted the victim's timers");
	run_children(1, small_worker, &worker);
	kill(victim, SIGKILL);
	waitpid(victim, NULL, 0);
	cr_assert_eq(waitpid(worker, &st, 0), worker);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a neighbour suffered");
	cr_assert(wait_sum(armed, base, 5000), "armed %llu, was %llu before the victim",
		  (unsigned long long)ctl_sum(armed), (unsigned long long)base);
	cr_assert_eq(waitpid(broker, NULL, WNOHANG), 0, "the broker died");
	cr_assert_eq(small_worker(0), 0);
}

/* ---- the broker killed with SIGKILL ---- */

AsanTest(broker, broker_sigkill_gives_enotconn_without_hanging)
{
	chime_t *waiter = copen(), *armer = copen(), *poller = copen(), *flusher = copen();
	struct chime_event ev[8];
	chime_id_t id = 0;
	uint64_t t0;
	int r;

	cr_assert(waiter && armer && poller && flusher);
	cr_assert_eq(chime_arm(waiter, 0, chime_now() + 10000 * MS, 0, 0, &id), 0);
	kill(broker, SIGKILL);
	waitpid(broker, NULL, 0);
	broker = -1;

	t0 = chime_now();
	r = chime_wait(waiter, ev, 8, 5000);
	cr_assert_eq(r, -ENOTCONN, "chime_wait: %d", r);
	cr_assert_lt(chime_now() - t0, 1000 * MS, "chime_wait noticed late");
	cr_assert_eq(chime_arm(waiter, 0, 0, 0, 0, &id), -ENOTCONN);
	cr_assert_eq(chime_reset(waiter, id, 0), -ENOTCONN);
	cr_assert_eq(chime_cancel(waiter, id), -ENOTCONN);
	cr_assert_eq(chime_cancel_key(waiter, 0), -ENOTCONN);
	cr_assert_eq(chime_poll(waiter, ev, 8), -ENOTCONN);

	/* A producer that only arms: the ring fills, and the wait for room notices. */
	t0 = chime_now();
	do
		r = chime_arm(armer, 0, chime_now(), 0, 0, &id);
	while (r == 0 && chime_now() - t0 < 5000 * MS);
	cr_assert_eq(r, -ENOTCONN);
	cr_assert_lt(chime_now() - t0, 3000 * MS);

	/* A client that only polls notices within a couple of seconds. */
	t0 = chime_now();
	do
		r = chime_poll(poller, ev, 8);
	while (r == 0 && chime_now() - t0 < 5000 * MS);
	cr_assert_eq(r, -ENOTCONN);

	/*
	 * A client that only flushes: told within a couple of seconds too.
	 * (It returned 0 for as long as it was called, until a drain noticed.)
	 */
	t0 = chime_now();
	do
		r = chime_flush(flusher);
	while (r == 0 && chime_now() - t0 < 5000 * MS);
	cr_assert_eq(r, -ENOTCONN, "chime_flush: %d", r);
	cr_assert_lt(chime_now() - t0, 3000 * MS, "chime_flush noticed late");
	chime_close(waiter);
	chime_close(armer);
	chime_close(poller);
	chime_close(flusher);
}

AsanTest(broker, broker_sigterm_stops_cleanly)
{
	chime_t *c = copen();
	struct chime_event ev[8];
	uint64_t t0;
	int st;

	cr_assert_not_null(c);
	kill(broker, SIGTERM);
	t0 = chime_now();
	cr_assert_eq(chime_wait(c, ev, 8, 5000), -ENOTCONN);
	cr_assert_lt(chime_now() - t0, 2000 * MS);
	cr_assert_eq(waitpid(broker, &st, 0), broker);
	broker = -1;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chimed exit status %#x", st);
	cr_assert_neq(access(sock, F_OK), 0, "socket left behind");
	chime_close(c);
}

/* A client that only arms, resets, cancels and flushes: the broker's stop is final for it at once. */
AsanTest(broker, operations_after_a_clean_stop_say_enotconn)
{
	chime_t *c = copen();
	chime_id_t id = 0, id2 = 0;
	struct chime_op op = { .op = CHIME_ARM, .deadline_ns = 0 };
	int st;

	cr_assert_not_null(c);
	cr_assert_eq(chime_arm(c, 0, chime_now() + 10000 * MS, 0, 0, &id), 0);
	kill(broker, SIGTERM);
	cr_assert_eq(waitpid(broker, &st, 0), broker);
	broker = -1;
	/* No drain, no wait: nothing has told this connection, but the broker said it stopped. */
	cr_assert_eq(chime_arm(c, 0, chime_now() + 10000 * MS, 0, 0, &id2), -ENOTCONN);
	cr_assert_eq(id2, 0, "no id for a timer nobody holds");
	cr_assert_eq(chime_reset(c, id, chime_now()), -ENOTCONN);
	cr_assert_eq(chime_cancel(c, id), -ENOTCONN);
	cr_assert_eq(chime_cancel_key(c, 0), -ENOTCONN);
	cr_assert_eq(chime_flush(c), -ENOTCONN);
	cr_assert_eq(chime_submit(c, &op, 1), -ENOTCONN);
	cr_assert_eq(op.result, -ENOTCONN);
	chime_close(c);
}

static void on_alarm(int sig)
{
	(void)sig;
}

/*
 * chime_wait(..., timeout) under a signal that fires in ms milliseconds,
 * and every 100 ms after, its handler installed with sa_flags: its result
 * and how long it took. Again and again, as chime_wait(3) says to send it:
 * one that comes while the call is not asleep (a reconnect attempt, under
 * load) is gone by the time it sleeps, and a suite's run under load had
 * one wait go to its timeout so.
 */
static int wait_under_signal_flags(chime_t *c, int timeout_ms, unsigned ms, int sa_flags, uint64_t *took)
{
	struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = sa_flags }, old;
	struct itimerval it = { .it_value = { .tv_usec = (suseconds_t)ms * 1000 },
				.it_interval = { .tv_usec = 100 * 1000 } };
	struct chime_event ev[4];
	uint64_t t0 = chime_now();
	int r;

	cr_assert_eq(sigaction(SIGALRM, &sa, &old), 0);
	cr_assert_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
	r = chime_wait(c, ev, 4, timeout_ms);
	*took = chime_now() - t0;
	it.it_value.tv_usec = 0;
	it.it_interval.tv_usec = 0;
	(void)setitimer(ITIMER_REAL, &it, NULL);
	(void)sigaction(SIGALRM, &old, NULL);
	return r;
}

static int wait_under_signal(chime_t *c, int timeout_ms, unsigned ms, uint64_t *took)
{
	return wait_under_signal_flags(c, timeout_ms, ms, 0, took);       /* no SA_RESTART */
}

AsanTest(broker, a_signal_interrupts_chime_wait_every_time)
{
	chime_t *c = copen();
	struct chime_event ev[4];
	chime_id_t id;
	uint64_t took;
	int r;

	cr_assert_not_null(c);
	/* The first sleep of a connection (its polls go in with the wait). */
	r = wait_under_signal(c, 3000, 100, &took);
	cr_assert_eq(r, -EINTR, "first wait: %d after %llu ms", r, (unsigned long long)(took / MS));
	/* After an event (the poll it used is queued again). */
	cr_assert_eq(chime_arm(c, 1, chime_now(), 0, 7, &id), 0);
	cr_assert_eq(chime_wait(c, ev, 4, 3000), 1);
	r = wait_under_signal(c, 3000, 100, &took);
	cr_assert_eq(r, -EINTR, "wait after an event: %d after %llu ms", r, (unsigned long long)(took / MS));
	cr_assert_lt(took, 2000 * MS);
	/* And once the polls are outstanding. */
	r = wait_under_signal(c, 3000, 100, &took);
	cr_assert_eq(r, -EINTR, "third wait: %d", r);
	chime_close(c);
}

/*
 * chime_wait(3): SA_RESTART does not resume the wait either (io_uring_enter(2)
 * and ppoll(2) are not restarted): -EINTR, well before the timeout, asleep
 * in io_uring as in ppoll() (a session's wait for its broker).
 */
AsanTest(broker, a_signal_under_sa_restart_interrupts_chime_wait_too)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { .session = "sigrestart" };
	chime_t *c = copen();
	uint64_t took;
	int r;

	cr_assert_not_null(c);
	r = wait_under_signal_flags(c, 3000, 100, SA_RESTART, &took);
	cr_assert_eq(r, -EINTR, "asleep on the broker: %d after %llu ms", r, (unsigned long long)(took / MS));
	cr_assert_lt(took, 2000 * MS);
	chime_close(c);

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	t_chimed_stop(&b2, SIGKILL);
	r = wait_under_signal_flags(c, 3000, 300, SA_RESTART, &took);
	cr_assert_eq(r, -EINTR, "waiting for a broker to reconnect to: %d after %llu ms", r,
		     (unsigned long long)(took / MS));
	cr_assert_lt(took, 2000 * MS);
	chime_close(c);
}

/*
 * chime_flush(3): a broker killed without a word a second ago is -ENOTCONN
 * for an anonymous connection, and for a session whose reconnecting is
 * turned off (CHIME_RECONNECT_S=0); a session that reconnects says 0 while
 * it does, its records bound for the next broker.
 */
AsanTest(broker, a_flush_after_a_silent_death_is_enotconn_but_for_a_session_that_reconnects)
{
	struct t_chimed b2 = { 0 };
	chime_t *anon, *sess, *off;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	anon = t_open(b2.sock);
	cr_assert_not_null(anon);
	cr_assert_eq(chime_open(&sess, &(struct chime_opts){ .socket_path = b2.sock, .session = "fl1" }), 0);
	cr_assert_eq(setenv("CHIME_RECONNECT_S", "0", 1), 0);
	cr_assert_eq(chime_open(&off, &(struct chime_opts){ .socket_path = b2.sock, .session = "fl2" }), 0);
	cr_assert_eq(unsetenv("CHIME_RECONNECT_S"), 0);
	cr_assert_eq(chime_arm(sess, 1, chime_now() + 3600000 * MS, 0, 0, &(chime_id_t){ 0 }), 0);
	t_chimed_stop(&b2, SIGKILL);
	usleep(1200000);        /* its heartbeat a second old */
	cr_assert_eq(chime_flush(anon), -ENOTCONN);
	cr_assert_eq(chime_flush(off), -ENOTCONN);
	cr_assert_eq(chime_flush(sess), 0, "a session reconnecting");
	chime_close(off);
	chime_close(anon);
	chime_close(sess);
}

/*
 * A session's wait while no broker answers sleeps between reconnect
 * attempts: a signal ends that sleep with -EINTR too, as chime_wait(3)
 * says. Before, it was swallowed and the wait went on to its timeout
 * (found by an audit).
 */
AsanTest(broker, a_signal_interrupts_a_sessions_wait_for_its_broker)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { .session = "sig" };
	uint64_t took;
	chime_t *c;
	int r;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	t_chimed_stop(&b2, SIGKILL);    /* no broker comes back: the library waits between attempts */
	r = wait_under_signal(c, 3000, 300, &took);
	cr_assert_eq(r, -EINTR, "a wait for a broker being reconnected to: %d after %llu ms", r,
		     (unsigned long long)(took / MS));
	cr_assert_lt(took, 2000 * MS);
	chime_close(c);
}

/* ---- arguments against a live connection ---- */

/* Resident memory of this process, in bytes (/proc/self/statm). */
static uint64_t rss_bytes(void)
{
	unsigned long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	cr_assert_not_null(f);
	cr_assert_eq(fscanf(f, "%lu %lu", &size, &resident), 2);
	fclose(f);
	return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/*
 * The broker holds the timers: arming 200k more (after a warm-up that
 * touches every ring page once) must not grow a client that resets
 * through records. 200k timers at even 8 bytes each would be 1.6 MB; the
 * bound is 1 MiB. One with a touch table grows by the 4-byte tags its
 * arms write (shared with the broker: their words are written only by
 * resets) and by nothing else.
 */
AsanTest(broker, client_memory_does_not_grow_with_armed_timers)
{
	int n = scale(200000, 1000000);

	for (unsigned flags = 0; flags < 2; flags++) {
		struct chime_opts o = { .socket_path = sock, .flags = flags ? 0 : CHIME_OPEN_RECORD_RESETS };
		uint64_t far = chime_now() + 3600ull * 1000000000ull, before, grew, table;
		chime_t *c = NULL;
		chime_id_t id;

		cr_assert_eq(chime_open(&c, &o), 0);
		for (int i = 0; i < 20000; i++)
			cr_assert_eq(chime_arm(c, (uint64_t)i, far, 0, 0, &id), 0);
		before = rss_bytes();
		for (int i = 0; i < n; i++)
			cr_assert_eq(chime_arm(c, (uint64_t)i, far, 0, 0, &id), 0);
		grew = rss_bytes() - before;
		table = c->touch ? (uint64_t)n * sizeof(*c->touch_tag) : 0;
		cr_assert_eq(c->touch != NULL, flags == 1);
		cr_assert_lt(grew, table + (1u << 20), "client (%s) grew by %llu bytes for %d armed timers",
			     c->touch ? "touch table" : "records", (unsigned long long)grew, n);
		chime_close(c);
	}
}

/*
 * Threads that arm one timer each (a thread per request) spread over the
 * shards: each thread's home shard is one after the home of the thread
 * that armed before it. They all started at shard 0 once.
 */
struct one_arm {
	chime_t *c;
	chime_id_t id;
	int rc;
};

static void *arm_one(void *arg)
{
	struct one_arm *a = arg;

	a->rc = chime_arm(a->c, 0, chime_now() + 3600 * 1000 * MS, 0, 0, &a->id);
	return NULL;
}

AsanTest(broker, threads_arming_one_timer_each_spread_over_the_shards)
{
	chime_t *c = copen();
	unsigned on[2] = { 0, 0 };

	cr_assert_not_null(c);
	for (int t = 0; t < 8; t++) {
		struct one_arm a = { .c = c };
		pthread_t th;

		cr_assert_eq(pthread_create(&th, NULL, arm_one, &a), 0);
		cr_assert_eq(pthread_join(th, NULL), 0);
		cr_assert_eq(a.rc, 0, "arm in thread %d: %s", t, strerror(-a.rc));
		cr_assert_lt(chime_id_shard(a.id), 2u);
		on[chime_id_shard(a.id)]++;
	}
	cr_assert_eq(on[0], 4, "8 threads arming one timer each: %u on shard 0, %u on shard 1", on[0], on[1]);
	chime_close(c);
}

/*
 * Each thread arms on its own home shard, so that threads arming and
 * resetting their own timers write separate rings: two threads, 200 arms
 * each, every id of one thread on one shard, the two threads' on the two
 * shards (each thread's home is one after the home of the thread that
 * armed before it).
 */
#define HOME_ARMS 200

struct home_arms {
	chime_t *c;
	chime_id_t id[HOME_ARMS];
	int rc;
};

static void *arm_many(void *arg)
{
	struct home_arms *a = arg;

	for (int i = 0; i < HOME_ARMS && !a->rc; i++)
		a->rc = chime_arm(a->c, 0, chime_now() + 3600 * 1000 * MS, 0, 0, &a->id[i]);
	return NULL;
}

AsanTest(broker, each_thread_arms_on_its_own_home_shard)
{
	static struct home_arms a[2];
	chime_t *c = copen();
	unsigned home[2];

	cr_assert_not_null(c);
	for (int t = 0; t < 2; t++) {
		pthread_t th;

		a[t].c = c;
		cr_assert_eq(pthread_create(&th, NULL, arm_many, &a[t]), 0);
		cr_assert_eq(pthread_join(th, NULL), 0);
		cr_assert_eq(a[t].rc, 0, "arms in thread %d: %s", t, strerror(-a[t].rc));
		home[t] = chime_id_shard(a[t].id[0]);
		for (int i = 0; i < HOME_ARMS; i++)
			cr_assert_eq(chime_id_shard(a[t].id[i]), home[t], "thread %d's arm %d on shard %u, its first on %u",
				     t, i, chime_id_shard(a[t].id[i]), home[t]);
	}
	cr_assert_neq(home[0], home[1], "both threads' homes are shard %u", home[0]);
	chime_close(c);
}

/*
 * A thread whose home shard falls behind moves its arms to the next shard
 * instead of waiting for room; one whose home shard is asleep does not
 * (the doorbell is waking it). The home shard's thread is stopped
 * (ptrace) after the thread's first arm, and 999 more arms go into its
 * 1024-slot ring. Awake (a busy-polling broker, whose shards never sleep):
 * they move at the first check with 15/16 of the ring waiting, and stay on
 * the other shard. Asleep: they all stay, and fit.
 */
struct behind_arms {
	chime_t *c;
	int pid;
	int tid;                /* the home shard's thread, held */
	chime_id_t id[1000];
	int rc, held, released;
	bool busy_poll;         /* its shards never sleep */
	uint64_t took_ns;
};

static void *arm_behind(void *arg)
{
	struct behind_arms *a = arg;
	char name[32];
	uint64_t t0;

	if ((a->rc = chime_arm(a->c, 0, chime_now() + 3600 * 1000 * MS, 0, 0, &a->id[0])) < 0)
		return NULL;
	snprintf(name, sizeof(name), "chimed-shard%u", chime_id_shard(a->id[0]));
	a->tid = t_thread_named(a->pid, name);
	msleep(100);            /* applied: the shard has room for a whole ring again */
	for (t0 = now_ns(); !a->busy_poll && a->tid > 0 && !t_thread_asleep(a->pid, a->tid) &&
			    now_ns() - t0 < 2000 * MS;)
		msleep(1);      /* asleep within its spin */
	if (a->tid <= 0 || (a->held = t_thread_hold(a->tid)) < 0)
		return NULL;
	t0 = now_ns();
	for (int i = 1; i < 1000 && !a->rc; i++)
		a->rc = chime_arm(a->c, 0, chime_now() + 3600 * 1000 * MS, 0, 0, &a->id[i]);
	a->took_ns = now_ns() - t0;
	a->released = t_thread_release(a->tid);        /* the tracer's own thread */
	return NULL;
}

/* Returns the first arm off the home shard (0: none), having checked that none came back. */
static unsigned arms_behind(bool busy_poll)
{
	static struct behind_arms a;
	struct t_chimed b = { 0 };
	pthread_t th;
	unsigned home, moved = 0;

	cr_assert_eq(t_chimed_start(&b, NULL, busy_poll ? "--shards 2 --spin-us -1" : "--shards 2"), 0);
	memset(&a, 0, sizeof(a));
	a.pid = b.pid;
	a.busy_poll = busy_poll;
	a.c = t_open(b.sock);
	cr_assert_not_null(a.c);
	cr_assert_eq(pthread_create(&th, NULL, arm_behind, &a), 0);     /* a thread with no home yet */
	cr_assert_eq(pthread_join(th, NULL), 0);
	if (a.held == -EPERM || a.held == -EACCES) {
		t_chimed_stop(&b, SIGKILL);
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-a.held));
	}
	cr_assert_gt(a.tid, 0, "no shard thread for shard %u", chime_id_shard(a.id[0]));
	cr_assert_eq(a.held, 0, "the shard thread did not stop: %s", strerror(-a.held));
	cr_assert_eq(a.released, 0, "release the shard thread: %s", strerror(-a.released));
	cr_assert_eq(a.rc, 0, "arm: %s", strerror(-a.rc));
	cr_assert_lt(a.took_ns, 2000 * MS, "999 arms with the home shard stopped took %llu ms",
		     (unsigned long long)(a.took_ns / MS));
	home = chime_id_shard(a.id[0]);
	for (int i = 1; i < 1000; i++) {
		unsigned s = chime_id_shard(a.id[i]);

		if (moved)
			cr_assert_neq(s, home, "arm %d back on the stopped shard %u after the move at %u", i, s, moved);
		else if (s != home)
			moved = (unsigned)i;
	}
	for (int i = 0; i < 1000; i++)  /* all there to cancel once the shard runs again */
		cr_assert_eq(chime_cancel(a.c, a.id[i]), 0);
	chime_close(a.c);
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
	return moved;
}

AsanTest(broker, a_thread_whose_home_shard_falls_behind_arms_on_the_next, .timeout = 60)
{
	unsigned moved = arms_behind(true);

	/* 15/16 of 1024 waiting is checked at position 960: arm 960 is the last on the stopped shard */
	cr_assert_eq(moved, 961, "the arms moved off the stopped shard at arm %u", moved);
}

AsanTest(broker, a_burst_into_an_asleep_home_shard_stays_there, .timeout = 60)
{
	unsigned moved = arms_behind(false);

	cr_assert_eq(moved, 0, "the arms moved off the asleep shard at arm %u", moved);
}

AsanTest(broker, bad_arguments)
{
	chime_t *c = copen();
	struct chime_event ev[4];
	chime_id_t id;

	cr_assert_not_null(c);
	cr_assert_eq(chime_arm(c, 0, 0, 0, 0, NULL), -EINVAL);
	cr_assert_eq(chime_reset(c, 0, 0), -EINVAL);
	cr_assert_eq(chime_cancel(c, 0), -EINVAL);
	cr_assert_eq(chime_cancel(c, chime_id_make(0, 0, 5)), -EINVAL, "generation 0");
	cr_assert_eq(chime_cancel(c, chime_id_make(1, 200, 5)), -EINVAL, "no such shard");
	cr_assert_eq(chime_reset(c, chime_id_make(1, 200, 5), 0), -EINVAL);
	cr_assert_eq(chime_poll(c, NULL, 4), -EINVAL);
	cr_assert_eq(chime_poll(c, ev, 0), -EINVAL);
	cr_assert_eq(chime_wait(c, ev, 0, 0), -EINVAL);
	cr_assert_eq(chime_wait(c, ev, 4, -2), -EINVAL);
	cr_assert_eq(chime_dispatch(c, NULL, NULL, 0), -EINVAL);
	cr_assert_geq(chime_fd(c), 0);

	/* A cancel or reset of a timer that already fired is harmless. */
	cr_assert_eq(chime_arm(c, 0, chime_now(), 0, 0, &id), 0);
	cr_assert_eq(chime_wait(c, ev, 4, 1000), 1);
	cr_assert_eq(chime_cancel(c, id), 0);
	cr_assert_eq(chime_cancel(c, id), 0);
	cr_assert_eq(chime_reset(c, id, chime_now()), 0);
	/* An id of a node this client never armed (forged): ignored by the broker. */
	cr_assert_eq(chime_cancel(c, chime_id_make(3, 0, 1000000)), 0);
	cr_assert_eq(chime_wait(c, ev, 4, 100), 0, "a fired one-shot came back after reset");
	chime_close(c);
}

/*
 * chime_reset(3), chime_cancel(3): another connection's id is accepted and
 * changes nothing, whichever way it goes (a reset twice, the second of
 * which a connection's own timer would take by its touch word; a cancel;
 * a batch), nor does a cancel_key of the same key: the owner's timer fires
 * on time, once.
 */
AsanTest(broker, another_connections_id_is_accepted_and_moves_nothing)
{
	chime_t *a = copen(), *b = copen();
	struct chime_event ev[4];
	uint64_t d = chime_now() + 150 * MS;
	chime_id_t id;

	cr_assert_not_null(a);
	cr_assert_not_null(b);
	cr_assert_eq(chime_arm(a, 9, d, 0, 1, &id), 0);
	cr_assert_eq(chime_reset(b, id, chime_now() + 10000 * MS), 0);
	cr_assert_eq(chime_flush(b), 0);
	usleep(20000);
	cr_assert_eq(chime_reset(b, id, chime_now() + 20000 * MS), 0);
	cr_assert_eq(chime_cancel(b, id), 0);
	cr_assert_eq(chime_cancel_key(b, 9), 0);
	cr_assert_eq(chime_submit(b, (struct chime_op[]){ { .op = CHIME_RESET, .id = id, .deadline_ns = UINT64_MAX },
							  { .op = CHIME_CANCEL, .id = id } }, 2), 2);
	cr_assert_eq(chime_flush(b), 0);
	cr_assert_eq(chime_wait(a, ev, 4, 2000), 1, "the owner's timer did not fire");
	cr_assert_eq(ev[0].id, id);
	cr_assert_eq(ev[0].deadline_ns, d, "moved by another connection");
	cr_assert_geq(ev[0].fired_ns, d);
	cr_assert_eq(chime_wait(a, ev, 4, 100), 0);
	cr_assert_eq(chime_poll(b, ev, 4), 0, "the other connection got an event");
	chime_close(b);
	chime_close(a);
}

/* ---- a client that does not drain: held, then delivered exactly once ---- */

AsanTest(broker, non_draining_client_events_held_then_delivered_once)
{
	chime_t *c = copen();
	uint32_t cq = ctl_u32(offsetof(struct chime_ctl, cq_size));
	int n = (int)(3 * cq * 2), got = 0;
	uint8_t *seen = calloc((size_t)n, 1);
	struct chime_event ev[256];
	uint64_t t0;

	cr_assert(c && seen);
	for (int i = 0; i < n; i++) {
		chime_id_t id;

		cr_assert_eq(chime_arm(c, 0, chime_now(), 0, (uint64_t)i, &id), 0);
	}
	for (t0 = now_ns(); ctl_sum(offsetof(struct chime_shard_ctl, stats.backlog)) == 0; msleep(10))
		cr_assert_lt(now_ns() - t0, 3000 * MS, "no backlog with %d events for a %u-slot ring", n, cq);
	msleep(100);
	for (t0 = chime_now(); got < n;) {
		int r = chime_wait(c, ev, 256, 1000);

		cr_assert_gt(r, 0, "held events lost: %d of %d", got, n);
		for (int k = 0; k < r; k++) {
			cr_assert_lt(ev[k].user_data, (uint64_t)n);
			cr_assert_eq(seen[ev[k].user_data], 0, "delivered twice");
			seen[ev[k].user_data] = 1;
		}
		got += r;
	}
	cr_assert_eq(chime_wait(c, ev, 256, 100), 0);
	cr_assert(wait_sum(offsetof(struct chime_shard_ctl, stats.backlog), 0, 2000));
	free(seen);
	chime_close(c);
}

/* ---- chime_fd in an application's epoll loop ---- */

static void count_cb(const struct chime_event *e, void *arg)
{
	(*(int *)arg)++;
}

/* epoll_wait() that retries when a signal (the test's own children) interrupts it. */
static int epoll_wait_nointr(int ep, struct epoll_event *ee, int timeout_ms)
{
	int r;

	do
		r = epoll_wait(ep, ee, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	cr_assert_geq(r, 0, "epoll_wait: %s", strerror(errno));
	return r;
}

AsanTest(broker, fd_readable_when_events_pending)
{
	chime_t *c = copen();
	struct epoll_event ee = { .events = EPOLLIN };
	int ep = epoll_create1(EPOLL_CLOEXEC), n = scale(20000, 50000), got = 0, idle = 0, wakes = 0;
	uint64_t seed = 5;
	chime_id_t id;

	cr_assert(c && ep >= 0);
	cr_assert_eq(epoll_ctl(ep, EPOLL_CTL_ADD, chime_fd(c), &ee), 0);
	/* Nothing armed: not readable. */
	cr_assert_eq(chime_dispatch(c, count_cb, &got, 0), 0);
	if (epoll_wait_nointr(ep, &ee, 50) != 0) {
		uint64_t v = 0;
		ssize_t k = read(chime_fd(c), &v, sizeof(v));

		cr_assert_fail("readable with nothing pending (events %#x, read %zd, value %llu, %s)",
			       ee.events, k, (unsigned long long)v, k < 0 ? strerror(errno) : "-");
	}
	cr_assert_eq(chime_arm(c, 0, chime_now() + 30 * MS, 0, 0, &id), 0);
	cr_assert_eq(epoll_wait_nointr(ep, &ee, 2000), 1, "not readable with an event pending");
	cr_assert_eq(chime_dispatch(c, count_cb, &got, 0), 1);
	got = 0;
	for (int i = 0; i < n; i++)
		cr_assert_eq(chime_arm(c, 0, chime_now() + splitmix64(&seed) % (300 * MS), 0, 0, &id), 0);
	while (got < n) {
		int r = epoll_wait_nointr(ep, &ee, 2000), d;

		cr_assert_eq(r, 1, "lost wake-up: %d of %d delivered", got, n);
		wakes++;
		d = chime_dispatch(c, count_cb, &got, 0);
		cr_assert_geq(d, 0);
		idle += d == 0;
	}
	cr_assert_eq(got, n);
	cr_assert_leq(idle, wakes / 2 + 2, "%d of %d wake-ups found nothing", idle, wakes);
	/* Drained: the fd settles (at most one stray wake-up). */
	if (epoll_wait_nointr(ep, &ee, 50) == 1)
		cr_assert_eq(chime_dispatch(c, count_cb, &got, 0), 0);
	cr_assert_eq(epoll_wait_nointr(ep, &ee, 50), 0, "fd stays readable with nothing pending");
	close(ep);
	chime_close(c);
}

/*
 * A dispatch that takes every event pending (it stops at that count, not
 * at an empty round) leaves chime_fd() quiet: the wake-up that announced
 * them is read with them. Left unread, it woke the application again for
 * nothing, every other wake-up of the case above (47-50% of them).
 */
AsanTest(broker, fd_quiet_after_a_dispatch_took_everything_pending)
{
	chime_t *c = copen();
	struct epoll_event ee = { .events = EPOLLIN };
	int ep = epoll_create1(EPOLL_CLOEXEC), got = 0;
	chime_id_t id;

	cr_assert(c && ep >= 0);
	cr_assert_eq(epoll_ctl(ep, EPOLL_CTL_ADD, chime_fd(c), &ee), 0);
	cr_assert_eq(chime_dispatch(c, count_cb, &got, 0), 0);  /* arms the fd's wake-up */
	for (int round = 0; round < 5; round++) {
		cr_assert_eq(chime_arm(c, 0, chime_now() + 20 * MS, 0, 0, &id), 0);
		cr_assert_eq(epoll_wait_nointr(ep, &ee, 2000), 1, "round %d: not readable with an event due", round);
		cr_assert_eq(chime_dispatch(c, count_cb, &got, 0), 1, "round %d", round);
		cr_assert_eq(epoll_wait_nointr(ep, &ee, 100), 0,
			     "round %d: readable after the dispatch took the one event pending", round);
	}
	cr_assert_eq(got, 5);
	close(ep);
	chime_close(c);
}

/*
 * chime_poll() with fewer slots than events pending keeps chime_fd()
 * readable for a level-triggered loop, with one kick: the fd is readable
 * until the kick is read. It wrote the eventfd on every such call, a
 * system call each (5029 writes for 5000 polls of one event, strace of the
 * Python binding's async for).
 */
AsanTest(broker, polls_of_one_event_at_a_time_kick_chime_fd_once)
{
	enum { N = 200 };
	chime_t *c = copen();
	struct chime_event ev;
	uint64_t kicks = 0, t0;
	int got = 0;
	chime_id_t id;

	cr_assert_not_null(c);
	for (int i = 0; i < N; i++)
		cr_assert_eq(chime_arm(c, 0, chime_now(), 0, (uint64_t)i, &id), 0);
	cr_assert_eq(chime_flush(c), 0);
	/* A level-triggered loop: wait for the fd, take one event. */
	for (t0 = now_ns(); got < N; ) {
		struct pollfd p = { .fd = chime_fd(c), .events = POLLIN };
		int n;

		cr_assert_eq(poll(&p, 1, 2000), 1, "chime_fd() not readable for 2 s with %d events left", N - got);
		n = chime_poll(c, &ev, 1);
		cr_assert_geq(n, 0, "chime_poll: %s", strerror(-n));
		got += n;
		cr_assert_lt(now_ns() - t0, 5000 * MS, "%d of %d events in 5 s", got, N);
	}
	/* What is left in the kick eventfd: the writes no drain has read back. */
	(void)!read(c->kick_fd, &kicks, sizeof(kicks));
	cr_assert_leq(kicks, 2, "%llu kicks written for %d polls of one event", (unsigned long long)kicks, N);
	chime_close(c);
}

struct other_arm {
	chime_t *c;
	uint64_t deadline_ns;
	chime_id_t ids[2];
	int rc;
};

/* A second thread arms: its home is the other shard. */
static void *other_arm(void *arg)
{
	struct other_arm *a = arg;

	for (int i = 0; i < 2; i++)
		a->rc |= chime_arm(a->c, 10 + (uint64_t)i, a->deadline_ns, 0, 10 + (uint64_t)i, &a->ids[i]);
	return NULL;
}

/*
 * A dispatch that reaches its count with another shard's events held (a
 * reset the stopped shard has not applied) leaves chime_fd() readable: the
 * held events are the application's once the shard applies the record,
 * and nothing else wakes it then (the reset voids its event, and the
 * events behind it wake no one). Before, the dispatch armed the wake-up
 * only, and an event loop slept until the reset timer fired 10 s later.
 */
ReleaseTest(broker, fd_readable_after_a_dispatch_that_held_events_at_its_count)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { 0 };
	struct epoll_event ee = { .events = EPOLLIN };
	struct other_arm oa = { 0 };
	int ep = epoll_create1(EPOLL_CLOEXEC), got = 0, d = 0, rounds = 0, st;
	uint64_t deadline = chime_now() + 20 * MS;
	chime_id_t a[2];
	pthread_t th;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 2"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert(ep >= 0);
	cr_assert_eq(epoll_ctl(ep, EPOLL_CTL_ADD, chime_fd(c), &ee), 0);
	/* a[0] first in its ring: a drain of that shard holds at once */
	for (int i = 0; i < 2; i++)
		cr_assert_eq(chime_arm(c, (uint64_t)i, deadline + (uint64_t)i * 20 * MS, 0, (uint64_t)i, &a[i]), 0);
	oa = (struct other_arm){ .c = c, .deadline_ns = deadline };
	cr_assert_eq(pthread_create(&th, NULL, other_arm, &oa), 0);
	pthread_join(th, NULL);
	cr_assert_eq(oa.rc, 0);
	cr_assert_neq(chime_id_shard(a[0]), chime_id_shard(oa.ids[0]), "both threads armed on one shard");
	usleep(200 * 1000);     /* fired: four events in the rings, none taken */
	cr_assert_eq(kill(b2.pid, SIGSTOP), 0);
	cr_assert_eq(waitpid(b2.pid, &st, WUNTRACED), b2.pid);  /* stopped before the reset is published */
	cr_assert(WIFSTOPPED(st));
	cr_assert_eq(chime_reset(c, a[0], chime_now() + 10000 * MS), 0);
	/*
	 * One event a dispatch: one starting at a[0]'s shard holds there and
	 * takes one of the other's; one starting at the other takes one
	 * there, and the next starts at a[0]'s.
	 */
	while (got < 2 && rounds++ < 2) {
		d = chime_dispatch(c, count_cb, &got, 1);
		cr_assert_eq(d, 1);
	}
	kill(b2.pid, SIGCONT);
	/* The reset applied, a[0]'s event voided: a[1]'s is left, and the fd says so. */
	cr_assert_eq(epoll_wait_nointr(ep, &ee, 1000), 1, "not readable with a held event pending (%d taken)", got);
	for (int i = 0; i < 2000 && got < 3; i++) {     /* the shard applies the reset first: 2 s on a loaded host */
		d = chime_dispatch(c, count_cb, &got, 0);
		cr_assert_geq(d, 0);
		if (got < 3)
			usleep(1000);
	}
	cr_assert_eq(got, 3, "a[1]'s event not delivered (%d taken)", got);
	close(ep);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/* The effects of an arming thread's reconnect giving up (reconnect.c), at this point of the drain. */
static void give_up_cb(const struct chime_event *e, void *arg)
{
	struct chime *m = arg;
	uint64_t one = 1;

	(void)e;
	at_store(&m->dead, 1);
	cr_assert_eq(write(m->kick_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
	m->kicks++;
}

/*
 * A session's reconnect given up by an arming thread leaves the fd
 * readable (a kick: the old socket left its set), so that an event loop
 * learns the connection is dead. A dispatch that stopped at its count
 * just then (between its last round and its re-arm: simulated from the
 * last callback, white box) read the kick away as a stale wake-up, and
 * the loop slept for good.
 */
AsanTest(broker, fd_stays_readable_when_a_session_dies_as_a_dispatch_ends)
{
	struct epoll_event ee = { .events = EPOLLIN };
	int ep = epoll_create1(EPOLL_CLOEXEC);
	chime_id_t id;
	chime_t *c;

	cr_assert_eq(chime_open(&c, &(struct chime_opts){ .socket_path = sock, .session = "givenup" }), 0);
	cr_assert(ep >= 0);
	cr_assert_eq(epoll_ctl(ep, EPOLL_CTL_ADD, chime_fd(c), &ee), 0);
	cr_assert_eq(chime_arm(c, 0, chime_now() + 10 * MS, 0, 0, &id), 0);
	cr_assert_eq(epoll_wait_nointr(ep, &ee, 2000), 1, "not readable with an event due");
	cr_assert_eq(chime_dispatch(c, give_up_cb, c, 1), 1);
	cr_assert_eq(epoll_wait_nointr(ep, &ee, 100), 1, "quiet after the connection died");
	cr_assert_eq(chime_poll(c, &(struct chime_event){ 0 }, 1), -ENOTCONN);
	close(ep);
	chime_close(c);
}

/* ---- one drainer at a time, in any thread ---- */

/*
 * chime_poll(3): one thread at a time drains a chime_t, and it may be
 * another thread at every call, also once the last one has exited. Here
 * each turn is a new thread, started once the last one was joined (the
 * application's order between them): it arms a baton due 1 ms ahead and
 * drains, by chime_wait(), by chime_fd() with chime_poll() or with
 * chime_dispatch() in turn, until the baton comes, taking whatever else is
 * pending, while another thread arms 3000 timers due over 300 ms. Every
 * event exactly once, never early, and each baton in its own turn: a
 * drain in a new thread that found nothing, or a wait there that slept
 * through its event, gets the baton late (after 1 s) or never. Anonymous, then a
 * session (whose drains take its lock, naming the thread that holds it).
 */
#define TURN_BG      3000
#define TURN_BATON   (UINT64_C(1) << 40)
#define TURN_LATE_NS (1000 * MS)  /* the baton later than this: a wake-up was lost (it is due in 1) */
#define TURN_WAIT_NS (2000 * MS)  /* the turn's waits give up */

struct turns {
	chime_t *c;
	int ep;                         /* epoll on chime_fd(c) */
	uint32_t bg_armed;              /* atomic: the arming thread is done */
	int arm_rc;
	/* the turns' (each ordered after the last by pthread_join) */
	int turn, got_bg, baton;
	uint8_t seen[TURN_BG];
	char why[256];                  /* the first failure */
};

static __attribute__((format(printf, 2, 3))) void turn_fail(struct turns *t, const char *fmt, ...)
{
	va_list ap;

	if (t->why[0])
		return;
	va_start(ap, fmt);
	vsnprintf(t->why, sizeof(t->why), fmt, ap);
	va_end(ap);
}

static void turn_event(const struct chime_event *e, void *arg)
{
	struct turns *t = arg;
	uint64_t now = chime_now(), k = e->user_data;

	if (e->fired_ns < e->deadline_ns || now < e->deadline_ns)
		turn_fail(t, "turn %d: event %#llx early (deadline %llu, fired %llu, received %llu)", t->turn,
			  (unsigned long long)k, (unsigned long long)e->deadline_ns,
			  (unsigned long long)e->fired_ns, (unsigned long long)now);
	if (k & TURN_BATON) {
		if (k != (TURN_BATON | (uint64_t)t->turn) || t->baton)
			turn_fail(t, "turn %d: the baton of turn %llu", t->turn,
				  (unsigned long long)(k & ~TURN_BATON));
		t->baton = 1;
	} else if (k >= TURN_BG) {
		turn_fail(t, "turn %d: an event with user_data %llu, no timer of ours", t->turn,
			  (unsigned long long)k);
	} else if (t->seen[k]++) {
		turn_fail(t, "turn %d: timer %llu returned twice", t->turn, (unsigned long long)k);
	} else {
		t->got_bg++;
	}
}

/* Milliseconds until end, rounded up; 0 once it has passed. */
static int turn_ms_left(uint64_t end)
{
	uint64_t now = chime_now();

	return now >= end ? 0 : (int)((end - now + MS - 1) / MS);
}

static void *turn_main(void *arg)
{
	struct turns *t = arg;
	struct chime_event ev[16];
	struct epoll_event ee;
	uint64_t start = chime_now(), end = start + TURN_WAIT_NS;
	chime_id_t id;
	int kind = t->turn % 3, r;

	t->baton = 0;
	if ((r = chime_arm(t->c, 0, chime_now() + MS, 0, TURN_BATON | (uint64_t)t->turn, &id)) != 0) {
		turn_fail(t, "turn %d: chime_arm: %s", t->turn, strerror(-r));
		return NULL;
	}
	while (!t->why[0]) {
		if (kind == 0) {
			/* Its whole time left: a wake-up lost in this thread sleeps past the limit. */
			r = chime_wait(t->c, ev, 16, turn_ms_left(end));
			for (int i = 0; i < r; i++)
				turn_event(&ev[i], t);
		} else {
			/* chime_fd(3): drained until 0, then it is readable when events are pending. */
			do {
				if (kind == 1) {
					r = chime_poll(t->c, ev, 16);
					for (int i = 0; i < r; i++)
						turn_event(&ev[i], t);
				} else {
					r = chime_dispatch(t->c, turn_event, t, 0);
				}
			} while (r > 0);
		}
		if (r < 0) {
			turn_fail(t, "turn %d: draining: %s", t->turn, strerror(-r));
			break;
		}
		if (t->baton || chime_now() >= end)
			break;
		if (kind != 0 && epoll_wait(t->ep, &ee, 1, turn_ms_left(end)) < 0 && errno != EINTR) {
			turn_fail(t, "turn %d: epoll_wait: %s", t->turn, strerror(errno));
			break;
		}
	}
	/*
	 * A wait that slept through its wake-up still returns the baton, at
	 * its timeout (it drains before giving up): the time tells.
	 */
	if (!t->why[0] && (!t->baton || chime_now() - start > TURN_LATE_NS))
		turn_fail(t, "turn %d (%s): its baton, due 1 ms after the turn began, %s", t->turn,
			  kind == 0 ? "chime_wait" : kind == 1 ? "chime_fd + chime_poll" : "chime_fd + chime_dispatch",
			  t->baton ? "came only after more than 1 s" : "did not come in 2 s");
	return NULL;
}

static void *turns_arm(void *arg)
{
	struct turns *t = arg;
	uint64_t seed = 41;
	chime_id_t id;

	for (int k = 0; k < TURN_BG && !t->arm_rc; k++) {
		t->arm_rc = chime_arm(t->c, 1, chime_now() + splitmix64(&seed) % (300 * MS), 0, (uint64_t)k, &id);
		if (k % 16 == 0)
			msleep(1);      /* over about 200 ms: the turns drain as the timers come due */
	}
	__atomic_store_n(&t->bg_armed, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void drain_in_turns(const char *session)
{
	struct chime_opts o = { .socket_path = sock, .session = session };
	struct turns *t = calloc(1, sizeof(*t));
	struct epoll_event ee = { .events = EPOLLIN };
	struct chime_event ev[16];
	uint64_t t0 = chime_now(), give_up = t0 + 10000 * MS;
	pthread_t arm, th;
	int r;

	cr_assert_not_null(t);
	cr_assert_eq(chime_open(&t->c, &o), 0);
	/* Before draining starts (chime_fd(3)): the turns share it. */
	t->ep = epoll_create1(EPOLL_CLOEXEC);
	cr_assert(t->ep >= 0 && epoll_ctl(t->ep, EPOLL_CTL_ADD, chime_fd(t->c), &ee) == 0);
	cr_assert_eq(pthread_create(&arm, NULL, turns_arm, t), 0);
	for (t->turn = 0; !t->why[0]; t->turn++) {
		if (__atomic_load_n(&t->bg_armed, __ATOMIC_ACQUIRE) && t->got_bg == TURN_BG)
			break;
		if (chime_now() >= give_up) {
			turn_fail(t, "after %d turns (10 s), %d of %d timers came", t->turn, t->got_bg, TURN_BG);
			break;
		}
		cr_assert_eq(pthread_create(&th, NULL, turn_main, t), 0);
		cr_assert_eq(pthread_join(th, NULL), 0);
	}
	pthread_join(arm, NULL);
	cr_assert_eq(t->arm_rc, 0, "chime_arm: %s", strerror(-t->arm_rc));
	cr_assert_eq(t->why[0], 0, "%s: %s", session ? "session" : "anonymous", t->why);
	/* And this thread after them: nothing more (nothing twice). */
	r = chime_wait(t->c, ev, 16, 100);
	cr_assert_eq(r, 0, "%s: %d more events after every timer came once", session ? "session" : "anonymous", r);
	cr_log_info("%s: %d timers in %d turns, %llu ms", session ? "session" : "anonymous", TURN_BG, t->turn,
		    (unsigned long long)((chime_now() - t0) / MS));
	close(t->ep);
	chime_close(t->c);
	if (session)
		cr_assert_eq(chime_drop_session(&o), 0);
	free(t);
}

AsanTest(broker, a_drain_may_move_to_another_thread_between_calls)
{
	drain_in_turns(NULL);
	drain_in_turns("turns");
}

/* ---- a callback that cancels or resets its siblings ---- */

#define SIBLINGS 96

/*
 * 96 timers fire together; the first callback cancels a third of the
 * others (a third of those by key) and resets another third an hour
 * ahead, as a connection's callback frees its siblings. None of those may
 * reach a callback after that, and the reset ones must still be armed.
 */
struct siblings {
	chime_t *c;
	chime_id_t id[SIBLINGS];
	int calls, first, stale;
	uint8_t dropped[SIBLINGS];
};

static void sibling_cb(const struct chime_event *e, void *arg)
{
	struct siblings *s = arg;
	int me = (int)e->user_data;

	if (s->calls++ == 0) {
		s->first = me;
		for (int i = 0; i < SIBLINGS; i++) {
			if (i == me)
				continue;
			if (i % 3 == 0)
				cr_assert_eq(i % 2 ? chime_cancel(s->c, s->id[i]) : chime_cancel_key(s->c, 1000 + (uint64_t)i), 0);
			else if (i % 3 == 1)
				cr_assert_eq(chime_reset(s->c, s->id[i], chime_now() + 3600000 * MS), 0);
			s->dropped[i] = i % 3 != 2;
		}
		return;
	}
	s->stale += s->dropped[me];
}

static void dispatch_siblings(const char *session)
{
	struct chime_opts o = { .socket_path = sock, .session = session };
	struct siblings s = { 0 };
	struct chime_event ev[SIBLINGS];
	uint64_t due = chime_now() + 20 * MS;
	unsigned long long late;
	int r;

	cr_assert_eq(chime_open(&s.c, &o), 0);
	for (int i = 0; i < SIBLINGS; i++)
		cr_assert_eq(chime_arm(s.c, 1000 + (uint64_t)i, due, 0, (uint64_t)i, &s.id[i]), 0);
	cr_assert_eq(chime_flush(s.c), 0);
	msleep(150);    /* all fired, waiting in the completion rings */
	/* Until a second has passed: a drain may hold back an event whose reset the shard has not applied. */
	for (uint64_t end = chime_now() + 1000 * MS; chime_now() < end;)
		cr_assert_geq(chime_dispatch(s.c, sibling_cb, &s, 0), 0);
	cr_assert_eq(s.stale, 0, "%s: %d callbacks for timers an earlier callback cancelled or reset",
		     session ? "session" : "anonymous", s.stale);
	cr_assert_eq(s.calls, 1 + SIBLINGS / 3 - (s.first % 3 == 2), "%d callbacks", s.calls);
	/* The reset ones are armed, an hour ahead: bring them in and they fire. */
	late = 0;
	for (int i = 0; i < SIBLINGS; i++)
		if (i != s.first && i % 3 == 1)
			cr_assert_eq(chime_reset(s.c, s.id[i], chime_now()), 0);
	for (uint64_t end = chime_now() + 2000 * MS; late < SIBLINGS / 3 - (s.first % 3 == 1) && chime_now() < end;) {
		r = chime_wait(s.c, ev, SIBLINGS, 100);
		cr_assert_geq(r, 0);
		for (int k = 0; k < r; k++) {
			cr_assert_eq(ev[k].user_data % 3, 1, "timer %llu fired", (unsigned long long)ev[k].user_data);
			late++;
		}
	}
	cr_assert_eq(late, SIBLINGS / 3 - (s.first % 3 == 1), "%llu of the reset timers fired", late);
	chime_close(s.c);
}

AsanTest(broker, a_dispatch_callback_never_sees_a_timer_it_cancelled_or_reset)
{
	dispatch_siblings(NULL);
	dispatch_siblings("siblings");
}

/*
 * The same, when the callback that cancels and resets is another
 * connection's, dispatched from inside the first's callback: the first
 * connection's drain must still judge its next events against them. It
 * did not: all 9 siblings were called back after their cancels returned.
 */
#define NESTED 10

struct nested {
	chime_t *c1, *c2;
	chime_id_t id[NESTED];
	int calls1, calls2;
};

static void nested_inner_cb(const struct chime_event *e, void *arg)
{
	struct nested *n = arg;

	(void)e;
	n->calls2++;
	for (int i = 0; i < NESTED; i++)
		cr_assert_eq(i % 2 ? chime_cancel(n->c1, n->id[i]) : chime_reset(n->c1, n->id[i], chime_now() + 3600000 * MS),
			     0);
}

static void nested_outer_cb(const struct chime_event *e, void *arg)
{
	struct nested *n = arg;

	(void)e;
	if (n->calls1++ == 0)
		cr_assert_eq(chime_dispatch(n->c2, nested_inner_cb, n, 0), 1);
}

AsanTest(broker, a_callback_dispatching_another_connection_still_voids_what_that_cancels)
{
	struct chime_opts o = { .socket_path = sock };
	struct nested n = { 0 };
	uint64_t due = chime_now() + 20 * MS;

	cr_assert_eq(chime_open(&n.c1, &o), 0);
	cr_assert_eq(chime_open(&n.c2, &o), 0);
	for (int i = 0; i < NESTED; i++)
		cr_assert_eq(chime_arm(n.c1, 0, due, 0, (uint64_t)i, &n.id[i]), 0);
	cr_assert_eq(chime_arm(n.c2, 0, due, 0, 0, &(chime_id_t){ 0 }), 0);
	msleep(150);    /* all fired, waiting in the completion rings */
	for (uint64_t end = chime_now() + 1000 * MS; chime_now() < end;)
		cr_assert_geq(chime_dispatch(n.c1, nested_outer_cb, &n, 0), 0);
	cr_assert_eq(n.calls2, 1);
	cr_assert_eq(n.calls1, 1, "%d callbacks: the timers the nested callback cancelled or reset came after it",
		     n.calls1);
	chime_close(n.c2);
	chime_close(n.c1);
}

/*
 * A callback that drains its own connection (chime_dispatch(3): it must
 * not) is refused with -EDEADLK, a load of what the dispatch stores
 * anyway: its drain would overlap the one it runs in. It did: with
 * events still coming (a periodic timer), the nested drain took the ring
 * past the outer one's snapshot of its tail, and the outer one ran on
 * past it, through the ring, and did not return (killed by the test's
 * timeout). Every event goes to the outer dispatch, once.
 */
struct own_drain {
	chime_t *c;
	int calls, once[5];
	int dispatch, poll, wait;
};

static void own_drain_cb(const struct chime_event *e, void *arg)
{
	struct own_drain *d = arg;
	struct chime_event ev[4];

	if (e->key == 1)
		d->once[e->user_data]++;
	if (d->calls++)
		return;
	msleep(20);     /* the periodic timer fires meanwhile */
	d->dispatch = chime_dispatch(d->c, own_drain_cb, d, 0);
	d->poll = chime_poll(d->c, ev, 4);
	d->wait = chime_wait(d->c, ev, 4, 10);
}

static void own_drain_cb_count(const struct chime_event *e, void *arg)
{
	(void)e;
	((struct own_drain *)arg)->calls++;
}

AsanTest(broker, a_callback_that_drains_its_own_connection_is_refused, .timeout = 20)
{
	struct own_drain d = { 0 };
	chime_id_t per;
	int r;

	d.c = copen();
	cr_assert_not_null(d.c);
	for (uint64_t i = 0; i < 5; i++)
		cr_assert_eq(chime_arm(d.c, 1, chime_now(), 0, i, &(chime_id_t){ 0 }), 0);
	cr_assert_eq(chime_arm(d.c, 2, chime_now() + 10 * MS, 100000, 0, &per), 0);
	/*
	 * Once the shard has fired them: 5 ms was taken for enough, and once,
	 * in CI's ASan build beside another test program, nothing was there yet.
	 */
	for (uint64_t end = chime_now() + 5000 * MS; (r = chime_dispatch(d.c, own_drain_cb, &d, 0)) == 0 &&
	     chime_now() < end;)
		msleep(1);
	cr_assert_gt(r, 0, "nothing dispatched in 5 s: %d", r);
	cr_assert_eq(d.dispatch, -EDEADLK);
	cr_assert_eq(d.poll, -EDEADLK);
	cr_assert_eq(d.wait, -EDEADLK);
	cr_assert_eq(chime_cancel(d.c, per), 0);
	for (uint64_t end = chime_now() + 300 * MS; chime_now() < end;)
		cr_assert_geq(chime_dispatch(d.c, own_drain_cb, &d, 0), 0);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(d.once[i], 1, "one-shot %d dispatched %d times", i, d.once[i]);
	chime_close(d.c);
}

/*
 * A callback that closes its own connection: the dispatch ends after it
 * (no later event is called back) and the connection is closed as
 * chime_dispatch() returns, with the count. Before, chime_close() freed
 * the connection, and unmapped its rings, under the drain, which went on
 * reading them: a crash.
 */
static void closing_cb(const struct chime_event *e, void *arg)
{
	struct own_drain *d = arg;

	(void)e;
	if (d->calls++ == 0)
		chime_close(d->c);
}

/* Five one-shots due now, armed by a thread of its own: on its home shard, the next one after the caller's. */
static void *arm_five(void *arg)
{
	for (uint64_t i = 0; i < 5; i++)
		cr_assert_eq(chime_arm(arg, 1, chime_now(), 0, i, &(chime_id_t){ 0 }), 0);
	return NULL;
}

AsanTest(broker, a_callback_that_closes_its_own_connection_ends_the_dispatch)
{
	struct own_drain d = { 0 };
	struct chime_opts o = { .socket_path = sock, .session = "closed-in-a-callback" };

	for (int k = 0; k < 2; k++) {       /* anonymous, then a session */
		d = (struct own_drain){ 0 };
		pthread_t t;

		cr_assert_eq(chime_open(&d.c, k ? &o : &(struct chime_opts){ .socket_path = sock }), 0);
		/* on both shards: the drain must not go on to the other one either */
		for (int j = 0; j < 2; j++) {
			cr_assert_eq(pthread_create(&t, NULL, arm_five, d.c), 0);
			cr_assert_eq(pthread_join(t, NULL), 0);
		}
		msleep(20);
		cr_assert_eq(chime_dispatch(d.c, closing_cb, &d, 0), 1, "%s", k ? "session" : "anonymous");
		cr_assert_eq(d.calls, 1, "called back after the close");
	}
	/* The session's 9 events not called back are held for its next process. */
	cr_assert_eq(chime_open(&d.c, &o), 0);
	d.calls = 0;
	for (uint64_t end = chime_now() + 1000 * MS; chime_now() < end && d.calls < 9;)
		cr_assert_geq(chime_dispatch(d.c, own_drain_cb_count, &d, 0), 0);
	cr_assert_eq(d.calls, 9);
	chime_close(d.c);
}

/*
 * libchime(3), FORK: a child's copy of its parent's chime_t takes none of
 * the parent's events, also a child forked by a dispatch callback, which
 * returns from the callback into the parent's drain: that drain ends
 * there in the child. Before, it went on claiming the parent's events:
 * the parent got 1 of 10 (the child the other 9, lost to the parent).
 */
struct fork_cb {
	int calls;
	pid_t pid;      /* the child's, in the parent; 0 in the child; -1 before the fork */
};

static void forking_cb(const struct chime_event *e, void *arg)
{
	struct fork_cb *f = arg;

	(void)e;
	f->calls++;
	if (f->pid < 0) {
		f->pid = fork();
		cr_assert_geq(f->pid, 0);
		if (f->pid > 0)
			msleep(50);     /* the child's drain goes on first */
	}
}

AsanTest(broker, a_child_forked_in_a_dispatch_callback_takes_none_of_its_parents_events)
{
	struct fork_cb f = { 0, -1 };
	struct chime_event ev[16];
	chime_t *c = copen();
	int r, st;

	cr_assert_not_null(c);
	for (uint64_t i = 0; i < 10; i++)
		cr_assert_eq(chime_arm(c, 1, chime_now(), 0, i, &(chime_id_t){ 0 }), 0);
	msleep(30);
	r = chime_dispatch(c, forking_cb, &f, 0);
	if (f.pid == 0)
		_exit(f.calls == 1 && r == 1 ? 0 : f.calls > 100 ? 100 : f.calls);     /* the child */
	cr_assert_eq(waitpid(f.pid, &st, 0), f.pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child called back %d events of its parent's",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	while ((r = chime_wait(c, ev, 16, 100)) > 0)
		f.calls += r;
	cr_assert_eq(f.calls, 10, "the parent got %d of its 10 events", f.calls);
	chime_close(c);
}

/*
 * chime_dispatch(..., 0) delivers what was pending when it started: a
 * callback that re-arms its timer at once (here at deadline 0, and slow)
 * cannot keep the call going. It did, for up to every ring's size of
 * callbacks: 16384 of them, 4 s at 200 us each.
 */
static void rearm_now_cb(const struct chime_event *e, void *arg)
{
	uint64_t until = chime_now() + 50000;

	(void)e;
	cr_assert_eq(chime_arm(arg, 0, 0, 0, 0, &(chime_id_t){ 0 }), 0);
	while (chime_now() < until)
		;
}

AsanTest(broker, a_dispatch_of_what_is_pending_is_not_stretched_by_callbacks_rearming)
{
	struct chime_opts o = { .socket_path = sock };
	chime_t *c;
	int r;

	cr_assert_eq(chime_open(&c, &o), 0);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(chime_arm(c, 0, 0, 0, (uint64_t)i, &(chime_id_t){ 0 }), 0);
	msleep(100);    /* fired, in the rings */
	r = chime_dispatch(c, rearm_now_cb, c, 0);
	cr_assert(r >= 1 && r <= 100, "one call dispatched %d events, 100 were pending", r);
	chime_close(c);
}

/*
 * chime_wait() from a thread that has exited leaves its io_uring polls
 * outstanding; their completion then comes from the kernel's fallback
 * work, a tick late. The next waiter, another thread, got every event
 * 4.2-4.8 ms late (HZ=250) where 0.1-0.2 ms is usual (an API audit).
 */
static void *wait_once(void *arg)
{
	(void)chime_wait(arg, (struct chime_event[1]){ 0 }, 1, 5);
	return NULL;
}

ReleaseTest(broker, a_waiter_after_a_waiting_thread_exited_is_woken_on_time)
{
	struct chime_opts o = { .socket_path = sock };
	uint64_t best = UINT64_MAX;
	chime_t *c;

	cr_assert_eq(chime_open(&c, &o), 0);
	for (int i = 0; i < 5; i++) {
		struct chime_event ev;
		uint64_t due;
		pthread_t t;

		cr_assert_eq(pthread_create(&t, NULL, wait_once, c), 0);
		cr_assert_eq(pthread_join(t, NULL), 0);
		due = chime_now() + 30 * MS;
		cr_assert_eq(chime_arm(c, 0, due, 0, 0, &(chime_id_t){ 0 }), 0);
		cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1);
		if (chime_now() - due < best)
			best = chime_now() - due;
	}
	/* A tick is 1-10 ms (HZ 1000-100); on time is a fraction of one. The best of five: noise aside. */
	cr_assert_lt(best, 2500000, "the best of five waits received its event %.2f ms late", (double)best / 1e6);
	chime_close(c);
}

/* ---- the examples run against the broker ---- */

/*
 * Run example `name` against the broker; it must exit 0. `stops`: stopped
 * and continued that many times, 10 ms apart (^Z and fg, a debugger), which
 * ends a sleep in chime_wait() with -EINTR.
 */
static void run_example_stopped(const char *name, const char *const *args, int stops)
{
	const char *exdir = getenv("CHIME_EXAMPLES");
	char path[PATH_MAX];
	const char *argv[8] = { name };
	pid_t pid, done = 0;
	int st;

	cr_assert_not_null(exdir, "$CHIME_EXAMPLES must name the examples' build dir");
	snprintf(path, sizeof(path), "%s/example_%s", exdir, name);
	for (int i = 0; args && args[i] && i < 6; i++)
		argv[i + 1] = args[i];
	setenv("CHIME_SOCKET", sock, 1);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		execv(path, (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < stops && (done = waitpid(pid, &st, WNOHANG)) == 0; i++) {
		usleep(10000);
		kill(pid, SIGSTOP);
		usleep(1000);
		kill(pid, SIGCONT);
	}
	if (done != pid)
		cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed: status %#x", name, st);
}

static void run_example(const char *name, const char *const *args)
{
	run_example_stopped(name, args, 0);
}

AsanTest(broker, example_timeout_tasks)
{
	run_example("timeout_tasks", NULL);
}

AsanTest(broker, example_delayed_jobs)
{
	run_example("delayed_jobs", NULL);
}

AsanTest(broker, example_unpaid_orders)
{
	run_example("unpaid_orders", NULL);
}

AsanTest(broker, example_heartbeat)
{
	const char *quick[] = { "-n", "20000", "-t", "300", "-d", "900", NULL };
	const char *full[] = { NULL };
	/* ended before the silent ones are due: the live ones hang up (they were reported wrongly, exit 1) */
	const char *short_run[] = { "-n", "1000", "-t", "300", "-d", "50", NULL };

	run_example("heartbeat", stress ? full : quick);
	run_example("heartbeat", short_run);
}

/*
 * The examples that sleep in chime_wait() go on when stopped and continued
 * (^Z and fg): its -EINTR (chime_wait(3)) ended timeout_tasks and heartbeat
 * with exit 1, "Interrupted system call".
 */
AsanTest(broker, the_examples_go_on_when_stopped_and_continued)
{
	const char *quick[] = { "-n", "2000", "-t", "100", "-d", "300", NULL };

	run_example_stopped("timeout_tasks", NULL, 15);
	run_example_stopped("heartbeat", quick, 30);
	run_example_stopped("unpaid_orders", NULL, 30);
	run_example_stopped("delayed_jobs", NULL, 10);
}

/*
 * In a child without CAP_IPC_LOCK that calls mlockall(MCL_FUTURE) under an
 * RLIMIT_MEMLOCK of `kib`: chime_open()'s result (the child exits with its
 * errno; 255: the set-up failed).
 */
static int open_memlocked(const char *path, unsigned kib, uint32_t flags)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2];
	pid_t pid = fork();
	int st;

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct rlimit rl = { .rlim_cur = (rlim_t)kib << 10, .rlim_max = (rlim_t)kib << 10 };
		chime_t *c;
		int r;

		if (syscall(SYS_capget, &h, d) < 0)
			_exit(255);
		d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
		d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
		if (syscall(SYS_capset, &h, d) < 0 || setrlimit(RLIMIT_MEMLOCK, &rl) < 0 || mlockall(MCL_FUTURE) < 0)
			_exit(255);
		r = chime_open(&c, &(struct chime_opts){ .socket_path = path, .flags = flags });
		if (r == 0)
			chime_close(c);
		_exit(-r);      /* an errno, 0 if opened */
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "the child died: status %d", st);
	cr_assert_neq(WEXITSTATUS(st), 255, "the child could not drop CAP_IPC_LOCK or lock its memory");
	return -WEXITSTATUS(st);
}

/*
 * A process that locks its memory (mlockall(MCL_FUTURE)) maps the broker's
 * segments locked, within its RLIMIT_MEMLOCK. Past it mmap says EAGAIN,
 * which chime_open() returned as it was (for the touch table) or took for
 * "a segment handed over unfinished" (EBADMSG), found by an audit; it is
 * memory: -ENOMEM, as chime_open(3) says. The touch table (12 bytes per
 * node of every shard) is what an anonymous connection needs most of;
 * CHIME_OPEN_RECORD_RESETS maps none. A ReleaseTest(): it skips under the
 * sanitizers, whose mlockall() does nothing.
 */
ReleaseTest(broker, a_process_over_its_memlock_limit_gets_enomem)
{
	struct t_chimed b2 = { 0 };
	int r;

#if defined(__SANITIZE_ADDRESS__)
	cr_skip_test("the sanitizers' mlockall() is a no-op");
#endif
	/* 2 shards of 1M nodes: a 24 MiB touch table, a few hundred KiB of rings. */
	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 2 --capacity 1048576"), 0);
	r = open_memlocked(b2.sock, 8192, 0);
	cr_assert_eq(r, -ENOMEM, "the touch table over RLIMIT_MEMLOCK: %d (%s)", r, strerror(-r));
	r = open_memlocked(b2.sock, 8192, CHIME_OPEN_RECORD_RESETS);
	cr_assert_eq(r, 0, "no touch table, the rings fit: %d (%s)", r, strerror(-r));
	r = open_memlocked(b2.sock, 64, CHIME_OPEN_RECORD_RESETS);
	cr_assert_eq(r, -ENOMEM, "the rings over RLIMIT_MEMLOCK: %d (%s)", r, strerror(-r));
	t_chimed_stop(&b2, SIGTERM);
}

/*
 * An event whose timer this process reset after it fired waits for the
 * shard to apply the reset (drain() holds it back): chime_wait() looked
 * again every 20 us, for as long as the shard took, which is a moment
 * unless the broker is stopped (SIGSTOP, a debugger, a frozen cgroup):
 * then it burned the CPU the whole wait (a review): 339 ms of 700 here.
 * The looks now back off, up to a millisecond apart (51-71 ms: each
 * look's drain still spun ~100 us for the record), and a drain that held
 * at the same record last time looks once (7-9 ms).
 */
ReleaseTest(broker, a_wait_on_an_event_held_for_a_stopped_shard_does_not_burn_the_cpu)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts o = { 0 };
	struct chime_event ev;
	chime_id_t id;
	uint64_t cpu;
	chime_t *c;
	int n;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1"), 0);
	o.socket_path = b2.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 20 * MS, 0, 1, &id), 0);
	usleep(200 * 1000);     /* fired: its event in the ring, not taken */
	kill(b2.pid, SIGSTOP);
	cr_assert_eq(chime_reset(c, id, chime_now() + 10000 * MS), 0);
	cpu = thread_cpu_ns();
	n = chime_wait(c, &ev, 1, 700);
	cpu = thread_cpu_ns() - cpu;
	kill(b2.pid, SIGCONT);
	fprintf(stderr, "a wait of 700 ms on an event held for a stopped shard: %d, %.1f ms of CPU\n", n,
		(double)cpu / 1e6);
	cr_assert_eq(n, 0, "chime_wait() returned %d beside a stopped broker", n);
	cr_assert_lt(cpu, 35 * MS, "the wait burned %.1f ms of CPU in 700 ms", (double)cpu / 1e6);
	chime_close(c);
	t_chimed_stop(&b2, SIGTERM);
}

/* ---- clocks ---- */

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/*
 * A process in a time namespace of its own, CLOCK_MONOTONIC off the
 * broker's by off_s seconds, arms a timer 300 ms ahead by chime_now() and
 * waits for it. Exit status: 0 (fired on time by its clock), 3 (refused:
 * -EXDEV), 1 (what went wrong on stderr), 77 (no time namespaces here).
 */
static int timens_client(long off_s)
{
	pid_t p = fork(), q;
	int st;

	if (p < 0)
		return 1;
	if (p == 0) {
		char line[64];
		int fd, n;

		/* the offsets can be set only before a process enters the namespace: the child below */
		if (unshare(CLONE_NEWTIME) < 0)
			_exit(77);
		n = snprintf(line, sizeof(line), "monotonic %ld 0\n", off_s);
		fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, line, (size_t)n) != n)
			_exit(77);
		close(fd);
		q = fork();
		if (q == 0) {
			struct chime_opts o = { .socket_path = sock };
			struct chime_event ev;
			chime_t *c = NULL;
			chime_id_t id;
			uint64_t t0, d;
			int r = chime_open(&c, &o);

			if (r == -EXDEV)
				_exit(3);       /* refused: its clock is not the broker's (chime_open(3)) */
			CHECK(r == 0, "chime_open: %s", strerror(-r));
			t0 = chime_now();
			d = t0 + 300 * MS;
			CHECK(chime_arm(c, 1, d, 0, 7, &id) == 0, "arm");
			r = chime_wait(c, &ev, 1, 5000);
			CHECK(r == 1, "a timer 300 ms ahead (its own clock): no event after %.3f s",
			      (double)(chime_now() - t0) / 1e9);
			CHECK(chime_now() >= d, "fired %.3f s early by its own clock (event deadline %llu, fired %llu)",
			      (double)(d - chime_now()) / 1e9, (unsigned long long)ev.deadline_ns,
			      (unsigned long long)ev.fired_ns);
			chime_close(c);
			_exit(0);
		}
		if (q < 0 || waitpid(q, &st, 0) != q)
			_exit(1);
		_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
	}
	if (waitpid(p, &st, 0) != p)
		return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/*
 * A client whose CLOCK_MONOTONIC is not the broker's (a time namespace:
 * unshare --time, a container restored by CRIU) computes its deadlines on
 * its clock, which the broker fires by its own: 20 s behind, a timer
 * 300 ms ahead fired at once; 100 s ahead, 100 s late. It is refused
 * (-EXDEV) or its timers fire on time by its clock, never early; one in
 * a time namespace of its own on the broker's clock (offset 0) is served.
 */
ReleaseTest(broker, a_client_in_another_time_namespace_gets_no_timer_early_or_late)
{
	long offs[] = { -20, 100, 0 };

	for (unsigned i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
		int r = timens_client(offs[i]);

		if (r == 77)
			cr_skip_test("no time namespaces here (unshare(CLONE_NEWTIME) as root, Linux 5.6)");
		if (offs[i] == 0)
			cr_assert_eq(r, 0, "a client on the broker's clock in a namespace of its own: %s",
				     r == 3 ? "refused" : "see its stderr");
		else
			cr_assert(r == 0 || r == 3, "a client %+ld s off the broker's clock: see its stderr", offs[i]);
	}
}

/* The thread of the case below: cancel itself pending, it dispatches; the callback acts on the cancel. */
static void cancel_in_callback_cb(const struct chime_event *ev, void *arg)
{
	(void)ev;
	(*(int *)arg)++;
	pthread_testcancel();
}

static void *dispatch_cancelled_in_callback(void *arg)
{
	chime_t *c = arg;
	static int calls;

	(void)pthread_cancel(pthread_self());   /* deferred: acted on at the callback's testcancel */
	(void)chime_dispatch(c, cancel_in_callback_cb, &calls, 0);
	return NULL;
}

/* The drains and the close after it, on a new thread: glibc gives it the cancelled one's cached stack, and TLS. */
static void *after_the_cancel(void *arg)
{
	struct chime_event ev[4];
	chime_t *c = arg;
	chime_id_t id;
	intptr_t bad = 0;
	int n = chime_wait(c, ev, 4, 1000);

	if (n != 1) {
		fprintf(stderr, "the drain after the cancel: %d (%s), not the other event\n", n,
			n < 0 ? strerror(-n) : "");
		bad |= 1;
	}
	if (chime_arm(c, 1, 0, 0, 3, &id) != 0 || chime_wait(c, ev, 4, 1000) != 1)
		bad |= 2;
	chime_close(c);
	return (void *)bad;
}

/*
 * A thread cancelled in a dispatch callback (an anonymous connection's,
 * whose callbacks run with cancellation on) leaves the connection usable:
 * it stayed marked as dispatching, every later drain returned -EDEADLK and
 * chime_close() took the "waits for the dispatch" path and freed nothing
 * (an API audit). Released here: drains work, the close hangs up.
 * Release build only: under ASan the cancellation's unwinding trips the
 * sanitizer's own CHECK (asan_thread.cpp, from __asan_handle_no_return).
 */
ReleaseTest(broker, a_thread_cancelled_in_a_dispatch_callback_leaves_the_connection_usable)
{
	chime_t *c = copen();
	chime_id_t id;
	pthread_t t;
	void *ret;
	int fds;

	cr_assert_not_null(c);
	fds = t_open_fds(getpid());
	cr_assert_eq(chime_arm(c, 1, 0, 0, 1, &id), 0);
	cr_assert_eq(chime_arm(c, 1, 0, 0, 2, &id), 0);
	usleep(50 * 1000);      /* both due, in the ring */
	cr_assert_eq(pthread_create(&t, NULL, dispatch_cancelled_in_callback, c), 0);
	cr_assert_eq(pthread_join(t, &ret), 0);
	cr_assert_eq(ret, PTHREAD_CANCELED);
	cr_assert_eq(pthread_create(&t, NULL, after_the_cancel, c), 0);
	cr_assert_eq(pthread_join(t, &ret), 0);
	cr_assert_eq((intptr_t)ret, 0, "after the cancel: %s", (intptr_t)ret & 1 ? "the drain failed" : "an arm's event");
	cr_assert_lt(t_open_fds(getpid()), fds, "chime_close() freed nothing");
}

/*
 * The same, with a periodic timer alone on its shard: the events the
 * cancelled dispatch took up to its callback's are handed back to the
 * shard, which sees the periodic's event taken and fires its next periods.
 * They stayed unreleased until another event came to that ring, and the
 * periodic timer fired no more (a review). Release build only, as above.
 */
ReleaseTest(broker, a_periodic_timer_fires_on_after_a_thread_cancelled_in_its_dispatch_callback)
{
	struct t_chimed b2 = { 0 };
	struct chime_event ev[4];
	chime_id_t far, id;
	uint64_t start;
	pthread_t t;
	void *ret;
	chime_t *c;
	int got = 0, n;

	c = one_sleeping_shard(&b2, "", 9, &far);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 10 * MS, 20 * MS, 1, &id), 0);
	usleep(30 * 1000);      /* its first event in the ring */
	cr_assert_eq(pthread_create(&t, NULL, dispatch_cancelled_in_callback, c), 0);
	cr_assert_eq(pthread_join(t, &ret), 0);
	cr_assert_eq(ret, PTHREAD_CANCELED);
	for (start = chime_now(); chime_now() - start < 500 * MS; got += n)
		cr_assert_geq(n = chime_wait(c, ev, 4, 100), 0);
	cr_assert_geq(got, 10, "%d events of a 20 ms periodic timer in 500 ms after the cancel", got);
	chime_close(c);
	t_chimed_stop(&b2, SIGKILL);
}

/* A callback that closes its connection, then reaches a cancellation point with a cancel pending. */
static void close_then_cancelled_cb(const struct chime_event *ev, void *arg)
{
	(void)ev;
	chime_close(arg);
	pthread_testcancel();
}

static void *dispatch_closed_then_cancelled(void *arg)
{
	(void)pthread_cancel(pthread_self());
	(void)chime_dispatch(arg, close_then_cancelled_cb, arg, 0);
	return NULL;
}

/*
 * A callback that closes its connection and is then cancelled: the close
 * is done all the same. It was put off until the dispatch returned, which
 * a cancelled one never does, and the connection stayed open (its
 * descriptors, its slot in the broker, its timers) for the life of the
 * process (a review). Release build only, as above.
 */
ReleaseTest(broker, a_close_from_a_callback_is_done_when_the_thread_is_then_cancelled)
{
	chime_t *c = copen();
	chime_id_t id;
	pthread_t t;
	void *ret;
	int fds;

	cr_assert_not_null(c);
	fds = t_open_fds(getpid());
	cr_assert_eq(chime_arm(c, 1, 0, 0, 1, &id), 0);
	usleep(50 * 1000);      /* due, in the ring */
	cr_assert_eq(pthread_create(&t, NULL, dispatch_closed_then_cancelled, c), 0);
	cr_assert_eq(pthread_join(t, &ret), 0);
	cr_assert_eq(ret, PTHREAD_CANCELED);
	cr_assert_lt(t_open_fds(getpid()), fds, "the close in the callback freed nothing");
}

/* Arm with a cancel pending: the thread is cancelled at the first cancellation point of chime_arm(). */
static void *arm_with_a_cancel_pending(void *arg)
{
	chime_id_t id;

	pthread_cancel(pthread_self());
	(void)chime_arm(arg, 1, chime_now() + 2 * MS, 0, 1, &id);
	return NULL;
}

/*
 * A thread cancelled in chime_arm() at the doorbell of a sleeping shard
 * does not keep the others' arms from waking it: it had claimed that
 * sleep's ring (one write per sleep and client) and was cancelled at the
 * write(2), and another thread's arm 2 ms ahead fired 426 ms late, at the
 * broker's heartbeat at rest (a review). Release build only, as above.
 */
ReleaseTest(broker, a_thread_cancelled_at_a_doorbell_does_not_keep_others_from_ringing)
{
	struct t_chimed b2 = { 0 };
	struct chime_event ev;
	chime_id_t far, id;
	uint64_t deadline;
	pthread_t t;
	chime_t *c;

	c = one_sleeping_shard(&b2, "", 9, &far);
	t_at_rest_within(b2.sock, 2000);
	cr_assert_eq(pthread_create(&t, NULL, arm_with_a_cancel_pending, c), 0);
	cr_assert_eq(pthread_join(t, NULL), 0);        /* cancelled later, or not at all: its arm is made */
	deadline = chime_now() + 2 * MS;
	cr_assert_eq(chime_arm(c, 1, deadline, 0, 2, &id), 0);
	do
		cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1, "no event within 2 s");
	while (ev.user_data != 2);
	cr_assert_lt(ev.fired_ns - deadline, 50 * MS, "fired %llu ms late: the shard slept on",
		     (unsigned long long)(ev.fired_ns - deadline) / MS);
	chime_close(c);
	t_chimed_stop(&b2, SIGKILL);
}

/*
 * A process whose chime_open() returned is in the control segment's table
 * as active: a tool it runs next (chimectl clients, chimestat, as root
 * from the segment) lists it. The table was set after the ready went out,
 * so an open could return before it (the test of a tool's UTF-8 names
 * missed one of three clients so, under load).
 */
Test(broker, an_open_that_returned_is_in_the_table)
{
	char path[PATH_MAX + 8];
	struct chime_map m;
	const struct chime_ctl *ctl;
	const struct chime_client_ctl *tab;
	unsigned missed = 0;

	snprintf(path, sizeof(path), "%s.ctl", sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	ctl = m.base;
	tab = (const struct chime_client_ctl *)((const char *)m.base + ctl->clients_off);
	for (int i = 0; i < 300; i++) {
		chime_t *c = copen();
		bool found = false;

		for (uint32_t s = 0; s < ctl->max_clients && !found; s++)
			found = at_load(&tab[s].state) == CHIME_CLIENT_ACTIVE && at_load(&tab[s].pid) == getpid();
		missed += !found;
		chime_close(c);
	}
	chime_seg_unmap(&m);
	cr_assert_eq(missed, 0, "%u of 300 opens had returned before the table showed them", missed);
}
