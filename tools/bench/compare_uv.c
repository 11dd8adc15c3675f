/* SPDX-License-Identifier: MIT */
/*
 * compare_uv.c - chime-bench compare: libuv's uv_timer_t, one per timer, in
 * this process (Debian's libuv1-dev). See compare.h.
 *
 * libuv counts in milliseconds of its loop time (uv_now(), CLOCK_MONOTONIC,
 * or CLOCK_MONOTONIC_COARSE where that clock ticks at least every ms): an
 * absolute deadline becomes the timeout that makes it due no earlier than
 * asked, ceil((deadline - uv_now) / 1 ms). Lateness is measured from the
 * deadline asked for, as the application sees it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "compare.h"

static uv_loop_t L;
static uv_timer_t *T;
static size_t T_n;
static size_t fired;
static uint64_t first_ns, last_ns;

/* ms timeout from loop time for an absolute CLOCK_MONOTONIC deadline */
static inline uint64_t ms_until(uint64_t d)
{
	uint64_t now = uv_now(&L) * NS_PER_MS;

	return d > now ? (d - now + NS_PER_MS - 1) / NS_PER_MS : 0;
}

static void on_fire(uv_timer_t *h)
{
	last_ns = now_ns();
	if (!fired++)
		first_ns = last_ns;
}

static int u_setup(size_t n)
{
	int r = uv_loop_init(&L);

	if (r < 0)
		return r;
	T = xcalloc(n, sizeof(*T));
	T_n = n;
	fired = 0;
	uv_update_time(&L);
	return 0;
}

/* uv_timer_init + uv_timer_start: what an application does for a new timer */
static int u_arm(size_t lo, size_t hi, uint64_t base)
{
	for (size_t i = lo; i < hi; i++) {
		int r = uv_timer_init(&L, &T[i]);

		if (r < 0 || (r = uv_timer_start(&T[i], on_fire, ms_until(base + i), 0)) < 0)
			return r;
	}
	return 0;
}

/* uv_timer_start on a started timer moves it (libuv stops it first) */
static int u_reset(size_t lo, size_t hi, uint64_t base)
{
	for (size_t i = lo; i < hi; i++) {
		int r = uv_timer_start(&T[i], on_fire, ms_until(base + NS_PER_S + i), 0);

		if (r < 0)
			return r;
	}
	return 0;
}

static int u_cancel(size_t lo, size_t hi)
{
	for (size_t i = lo; i < hi; i++)
		uv_timer_stop(&T[i]);
	return 0;
}

static int u_arm_at(size_t n, uint64_t d)
{
	int r;

	uv_update_time(&L);
	for (size_t i = 0; i < n; i++) {
		if ((r = uv_timer_init(&L, &T[i])) < 0 ||
		    (r = uv_timer_start(&T[i], on_fire, ms_until(d), 0)) < 0)
			return r;
	}
	return 0;
}

static long u_expire(size_t n, uint64_t *first, uint64_t *last)
{
	(void)n;
	uv_run(&L, UV_RUN_DEFAULT);     /* returns when no timer is left */
	*first = first_ns;
	*last = last_ns;
	return (long)fired;
}

static void u_teardown(void)
{
	for (size_t i = 0; i < T_n; i++)
		if (T[i].loop)          /* initialised */
			uv_close((uv_handle_t *)&T[i], NULL);
	uv_run(&L, UV_RUN_DEFAULT);
	if (uv_loop_close(&L) < 0)
		PROBLEM("libuv: uv_loop_close: handles left open\n");
	free(T);
	T = NULL;
	T_n = 0;
}

const struct inproc inproc_uv = {
	.setup = u_setup, .arm = u_arm, .reset = u_reset, .cancel = u_cancel,
	.arm_at = u_arm_at, .expire = u_expire, .teardown = u_teardown,
};

/* ---- the seed workload: a 10 ms pacer timer touches with uv_timer_start ---- */

static struct {
	uint64_t t0, end, done, t1;
	double rate, c0, c1;
	size_t i;
	int err;
} S;

static void on_idle(uv_timer_t *h)
{
	PROBLEM("libuv seed: a connection's 30 s idle timeout fired\n");
}

static void on_tick(uv_timer_t *h)
{
	uint64_t t = now_ns(), k, ms = SEED_IDLE_NS / NS_PER_MS;

	if (t >= S.end) {
		S.t1 = t;
		S.c1 = seed_cpu_self();
		uv_stop(&L);
		return;
	}
	for (k = seed_owed(S.t0, t, S.rate, S.done); k && !S.err; k--, S.done++) {
		int r = uv_timer_start(&T[S.i], on_idle, ms, 0);

		if (r < 0)
			S.err = r;      /* libuv's errors are negative errno */
		if (++S.i == T_n)
			S.i = 0;
	}
}

int run_uv_seed(double rate, uint64_t wall_ns, struct seed_res *res)
{
	uv_timer_t pacer;
	int r;

	memset(res, 0, sizeof(*res));
	memset(&S, 0, sizeof(S));
	if ((r = u_setup(SEED_CONNS)) < 0) {
		PROBLEM("libuv seed workload: uv_loop_init: %s\n", uv_strerror(r));
		return r;
	}
	for (size_t i = 0; i < SEED_CONNS; i++) {
		uv_timer_init(&L, &T[i]);
		uv_timer_start(&T[i], on_idle, SEED_IDLE_NS / NS_PER_MS, 0);
	}
	for (size_t i = 0; i < SEED_CONNS; i++)     /* SEED_WARM, as chime's */
		uv_timer_start(&T[i], on_idle, SEED_IDLE_NS / NS_PER_MS, 0);
	uv_timer_init(&L, &pacer);
	S.rate = rate;
	S.c0 = seed_cpu_self();
	S.t0 = now_ns();
	S.end = S.t0 + wall_ns;
	uv_update_time(&L);
	uv_timer_start(&pacer, on_tick, SEED_TICK_NS / NS_PER_MS, SEED_TICK_NS / NS_PER_MS);
	uv_run(&L, UV_RUN_DEFAULT);
	uv_timer_stop(&pacer);
	uv_close((uv_handle_t *)&pacer, NULL);
	res->cpu_client = (S.c1 - S.c0) / ((double)(S.t1 - S.t0) / 1e9);
	res->touches_per_s = (double)S.done / ((double)(S.t1 - S.t0) / 1e9);
	res->ran = S.err == 0 && S.t1 > S.t0;
	u_teardown();
	if (S.err)
		PROBLEM("libuv seed workload: uv_timer_start: %s\n", uv_strerror(S.err));
	return S.err;
}

/* ---- lateness: the same deadlines as e2e's run_lat_chime (same seed) ---- */

static uint64_t *lat_dl, *lat_out;
static size_t lat_got;

static void on_lat(uv_timer_t *h)
{
	uint64_t t = now_ns(), idx = (uint64_t)(uintptr_t)h->data;

	if (t < lat_dl[idx])
		PROBLEM("libuv: timer %llu fired %llu ns early\n", (unsigned long long)idx,
			(unsigned long long)(lat_dl[idx] - t));
	lat_out[lat_got++] = t > lat_dl[idx] ? t - lat_dl[idx] : 0;
}

int run_uv_lat(size_t n, uint64_t span_ns, struct lat_result *res)
{
	uint64_t rng = 0x9e3779b97f4a7c15u, t0;
	int r;

	memset(res, 0, sizeof(*res));
	res->n = n;
	res->recv = lat_out = xcalloc(n, sizeof(uint64_t));
	lat_dl = xcalloc(n, sizeof(uint64_t));
	lat_got = 0;
	if ((r = u_setup(n)) < 0) {
		free(lat_dl);
		return r;
	}
	uv_update_time(&L);
	t0 = now_ns() + LAT_LEAD_NS(n);
	for (size_t i = 0; i < n; i++) {
		lat_dl[i] = t0 + splitmix64(&rng) % span_ns;
		uv_timer_init(&L, &T[i]);
		T[i].data = (void *)(uintptr_t)i;
		uv_timer_start(&T[i], on_lat, ms_until(lat_dl[i]), 0);
	}
	if (!lat_armed_late(t0, n, "libuv"))
		uv_run(&L, UV_RUN_DEFAULT);
	res->got = lat_got;
	qsort(res->recv, lat_got, sizeof(uint64_t), cmp_u64);
	u_teardown();
	free(lat_dl);
	return lat_got == n ? 0 : -EIO;
}
