/* SPDX-License-Identifier: MIT */
/*
 * compare_ev.c - chime-bench compare: libev's ev_timer, one per timer, in
 * this process (Debian's libev-dev). See compare.h.
 *
 * libev's timers are relative, in seconds (a double) from the loop's
 * monotonic time: an absolute deadline d becomes d - (CLOCK_MONOTONIC read
 * just before ev_now_update()), which can only make it due later. A reset
 * is libev's own idiom for idle timeouts: set `repeat`, ev_timer_again().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "compare.h"

static struct ev_loop *L;
static ev_timer *T;
static size_t T_n;
static size_t fired;
static uint64_t first_ns, last_ns, ref_ns;        /* ref_ns: CLOCK_MONOTONIC at or before the loop's now */

static inline ev_tstamp after(uint64_t d)
{
	return d > ref_ns ? (ev_tstamp)(d - ref_ns) / 1e9 : 0.;
}

static void sync_now(void)
{
	ref_ns = now_ns();
	ev_now_update(L);
}

static void on_fire(struct ev_loop *l, ev_timer *w, int revents)
{
	last_ns = now_ns();
	if (!fired++)
		first_ns = last_ns;
}

static int e_setup(size_t n)
{
	L = ev_loop_new(EVFLAG_AUTO);
	if (!L)
		return -ENOMEM;
	T = xcalloc(n, sizeof(*T));
	T_n = n;
	fired = 0;
	sync_now();
	return 0;
}

static int e_arm(size_t lo, size_t hi, uint64_t base)
{
	for (size_t i = lo; i < hi; i++) {
		ev_timer_init(&T[i], on_fire, after(base + i), 0.);
		ev_timer_start(L, &T[i]);
	}
	return 0;
}

static int e_reset(size_t lo, size_t hi, uint64_t base)
{
	for (size_t i = lo; i < hi; i++) {
		T[i].repeat = after(base + NS_PER_S + i);
		ev_timer_again(L, &T[i]);
	}
	return 0;
}

static int e_cancel(size_t lo, size_t hi)
{
	for (size_t i = lo; i < hi; i++)
		ev_timer_stop(L, &T[i]);
	return 0;
}

static int e_arm_at(size_t n, uint64_t d)
{
	sync_now();
	for (size_t i = 0; i < n; i++) {
		ev_timer_init(&T[i], on_fire, after(d), 0.);
		ev_timer_start(L, &T[i]);
	}
	return 0;
}

static long e_expire(size_t n, uint64_t *first, uint64_t *last)
{
	(void)n;
	ev_run(L, 0);           /* returns when no watcher is active */
	*first = first_ns;
	*last = last_ns;
	return (long)fired;
}

static void e_teardown(void)
{
	for (size_t i = 0; i < T_n; i++)
		ev_timer_stop(L, &T[i]);
	ev_loop_destroy(L);
	L = NULL;
	free(T);
	T = NULL;
	T_n = 0;
}

const struct inproc inproc_ev = {
	.setup = e_setup, .arm = e_arm, .reset = e_reset, .cancel = e_cancel,
	.arm_at = e_arm_at, .expire = e_expire, .teardown = e_teardown,
};

/* ---- the seed workload: a 10 ms pacer timer touches with ev_timer_again ---- */

static struct {
	uint64_t t0, end, done, t1;
	double rate, c0, c1;
	size_t i;
} S;

static void on_idle(struct ev_loop *l, ev_timer *w, int revents)
{
	PROBLEM("libev seed: a connection's 30 s idle timeout fired\n");
}

static void on_tick(struct ev_loop *l, ev_timer *w, int revents)
{
	uint64_t t = now_ns(), k;

	if (t >= S.end) {
		S.t1 = t;
		S.c1 = seed_cpu_self();
		ev_break(l, EVBREAK_ALL);
		return;
	}
	for (k = seed_owed(S.t0, t, S.rate, S.done); k; k--, S.done++) {
		ev_timer_again(l, &T[S.i]);     /* repeat is the idle timeout */
		if (++S.i == T_n)
			S.i = 0;
	}
}

int run_ev_seed(double rate, uint64_t wall_ns, struct seed_res *res)
{
	ev_timer pacer;
	int r;

	memset(res, 0, sizeof(*res));
	memset(&S, 0, sizeof(S));
	if ((r = e_setup(SEED_CONNS)) < 0)
		return r;
	for (size_t i = 0; i < SEED_CONNS; i++) {
		ev_timer_init(&T[i], on_idle, 0., (ev_tstamp)SEED_IDLE_NS / 1e9);
		ev_timer_again(L, &T[i]);
	}
	for (size_t i = 0; i < SEED_CONNS; i++)     /* SEED_WARM, as chime's */
		ev_timer_again(L, &T[i]);
	S.rate = rate;
	S.c0 = seed_cpu_self();
	S.t0 = now_ns();
	S.end = S.t0 + wall_ns;
	ev_timer_init(&pacer, on_tick, (ev_tstamp)SEED_TICK_NS / 1e9, (ev_tstamp)SEED_TICK_NS / 1e9);
	ev_now_update(L);
	ev_timer_start(L, &pacer);
	ev_run(L, 0);
	ev_timer_stop(L, &pacer);
	res->cpu_client = (S.c1 - S.c0) / ((double)(S.t1 - S.t0) / 1e9);
	res->touches_per_s = (double)S.done / ((double)(S.t1 - S.t0) / 1e9);
	res->ran = S.t1 > S.t0;
	e_teardown();
	return 0;
}
