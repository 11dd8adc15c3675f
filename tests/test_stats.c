/* SPDX-License-Identifier: MIT */
/*
 * test_stats.c - broker/stats.c (private counters published under seqlocks),
 * the lateness histogram of chime_shm.h, and the tools' reading side
 * (tools/statsread.c: percentiles, torn-free snapshots).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "chime_shm.h"
#include "helpers.h"
#include "stats.h"
#include "statsread.h"

/* ---- histogram bucket math ---- */

Test(stats, lat_bucket_edges)
{
	cr_assert_eq(chime_lat_bucket(0), 0);
	cr_assert_eq(chime_lat_bucket(1023), 0);
	cr_assert_eq(chime_lat_bucket(1024), 1);
	cr_assert_eq(chime_lat_bucket(1279), 1);
	cr_assert_eq(chime_lat_bucket(1280), 2);
	cr_assert_eq(chime_lat_bucket(1535), 2);
	cr_assert_eq(chime_lat_bucket(1536), 3);
	cr_assert_eq(chime_lat_bucket(1792), 4);
	cr_assert_eq(chime_lat_bucket(2047), 4);
	cr_assert_eq(chime_lat_bucket(2048), 5);
	cr_assert_eq(chime_lat_bucket((UINT64_C(1) << 30) - 1), CHIME_LAT_BUCKETS - 2);
	cr_assert_eq(chime_lat_bucket(UINT64_C(1) << 30), CHIME_LAT_BUCKETS - 1);
	cr_assert_eq(chime_lat_bucket(UINT64_MAX), CHIME_LAT_BUCKETS - 1);
}

Test(stats, lat_upper_bounds_partition_the_line)
{
	uint64_t lower = 0;
	uint32_t b;

	for (b = 0; b + 1 < CHIME_LAT_BUCKETS; b++) {
		uint64_t up = chime_lat_upper_ns(b);

		cr_assert_gt(up, lower, "bucket %u is empty", b);
		cr_assert_eq(chime_lat_bucket(lower), b, "lower edge of %u", b);
		cr_assert_eq(chime_lat_bucket(up - 1), b, "upper edge of %u", b);
		cr_assert_eq(chime_lat_bucket(up), b + 1, "past the edge of %u", b);
		lower = up;
	}
	cr_assert_eq(lower, UINT64_C(1) << 30);
	cr_assert_eq(chime_lat_upper_ns(CHIME_LAT_BUCKETS - 1), UINT64_MAX);
	/* 4 buckets per power of two: at most 25 % relative error above 1 us. */
	for (b = 2; b + 1 < CHIME_LAT_BUCKETS; b++) {
		uint64_t lo = chime_lat_upper_ns(b - 1), up = chime_lat_upper_ns(b);

		cr_assert_leq((up - lo) * 4, lo, "bucket %u wider than 25 %%", b);
	}
}

Test(stats, lat_bucket_random_values_fit)
{
	uint64_t seed = 42;
	int i;

	for (i = 0; i < 100000; i++) {
		uint64_t v = splitmix64(&seed) >> (splitmix64(&seed) % 64);
		uint32_t b = chime_lat_bucket(v);

		cr_assert_lt(v, chime_lat_upper_ns(b));
		if (b)
			cr_assert_geq(v, chime_lat_upper_ns(b - 1));
	}
}

/* ---- percentiles ---- */

static void hist_add(uint64_t *h, uint64_t *max, uint64_t v)
{
	h[chime_lat_bucket(v)]++;
	if (v > *max)
		*max = v;
}

Test(stats, percentile_of_empty_histogram_is_zero)
{
	uint64_t h[CHIME_LAT_BUCKETS] = { 0 };

	cr_assert_eq(sr_hist_count(h), 0);
	cr_assert_eq(sr_percentile(h, 0, 0.5), 0);
	cr_assert_eq(sr_percentile(h, 0, 0.999), 0);
}

Test(stats, percentile_single_sample_is_capped_at_max)
{
	uint64_t h[CHIME_LAT_BUCKETS] = { 0 }, max = 0;

	hist_add(h, &max, 1500);
	cr_assert_eq(sr_percentile(h, max, 0.5), 1500);
	cr_assert_eq(sr_percentile(h, max, 1.0), 1500);
	hist_add(h, &max, 3);
	/* Two samples: p50 is the smaller (nearest rank 1), reported as its bucket's top. */
	cr_assert_eq(sr_percentile(h, max, 0.5), 1024);
	cr_assert_eq(sr_percentile(h, max, 0.51), 1500);
}

Test(stats, percentile_within_one_bucket_of_exact)
{
	enum { N = 10007 };
	static uint64_t v[N];
	uint64_t h[CHIME_LAT_BUCKETS] = { 0 }, max = 0, seed = 7;
	const double ps[] = { 0.5, 0.9, 0.99, 0.999, 1.0 };
	size_t i, j;

	for (i = 0; i < N; i++) {
		v[i] = splitmix64(&seed) % 5000000;
		hist_add(h, &max, v[i]);
	}
	for (j = 0; j < sizeof(ps) / sizeof(ps[0]); j++) {
		uint64_t rep = sr_percentile(h, max, ps[j]), rank = (uint64_t)((double)N * ps[j]);
		uint64_t below = 0, at_or_below_lo = 0, lo;
		uint32_t b = chime_lat_bucket(rep - 1);

		if ((double)rank < (double)N * ps[j])
			rank++;
		lo = b ? chime_lat_upper_ns(b - 1) : 0;
		for (i = 0; i < N; i++) {
			below += v[i] < rep;
			at_or_below_lo += v[i] < lo;
		}
		/* The true nearest-rank value x lies in [lo, rep]: fewer than rank samples below lo,
		 * at least rank samples at or below rep. */
		cr_assert_lt(at_or_below_lo, rank, "p%g: too high", ps[j] * 100);
		cr_assert_geq(below + (rep == max), rank, "p%g: too low", ps[j] * 100);
	}
	cr_assert_eq(sr_percentile(h, max, 1.0), max);
}

Test(stats, rate_handles_restart_and_zero_interval)
{
	cr_assert_float_eq(sr_rate(100, 300, 2000000000u), 100.0, 1e-9);
	cr_assert_float_eq(sr_rate(300, 100, 1000000000u), 0.0, 1e-9);
	cr_assert_float_eq(sr_rate(0, 100, 0), 0.0, 1e-9);
}

/* ---- stats_publish ---- */

enum { SHARDS = 3, CLIENTS = 5 };

struct fixture {
	struct chime_shard_stats shard[SHARDS];
	struct chime_client_stats cs[CLIENTS][SHARDS];
};

static void read_shard(struct chime_shard_stats *dst, const struct chime_shard_stats *src)
{
	cr_assert_eq(chime_stats_read(dst, src, sizeof(*dst), 100), 0);
}

Test(stats, publish_writes_private_counters_under_even_seq)
{
	static struct fixture fx;
	struct chime_shard_stats s;
	struct stats st;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[1], &fx.cs[0][0], CLIENTS, SHARDS, 1), 0);
	stats_client_attach(&st, 2, 77);
	stats_arm(&st, 2);
	stats_arm(&st, 2);
	stats_arm(&st, 2);
	stats_reset(&st, 2);
	stats_cancel(&st, 2);
	stats_fire_n(&st, 2, 1000, 1000 + 1500, 0, 0, 1);
	stats_fire_n(&st, 2, 1000, 1000 + 5, 1, 0, 1);
	stats_deliver_n(&st, 2, 1);
	stats_wake_client(&st, 2);
	stats_client_depth(&st, 2, 1, 0);
	stats_malformed(&st, 2);
	stats_sq(&st, 9, 12);
	stats_sq(&st, 4, 5);
	stats_client_sq(&st, 2, 7);
	stats_client_sq(&st, 2, 3);
	stats_shard_gauges(&st, 0, 123456, 1, 0);
	stats_loop(&st, 500);
	stats_sleep(&st, false);

	/* Nothing is visible before the publish: the hot path touches private memory only. */
	cr_assert_eq(fx.shard[1].arms, 0);
	cr_assert_eq(fx.cs[2][1].arms, 0);
	stats_publish(&st);

	read_shard(&s, &fx.shard[1]);
	cr_assert_eq(s.seq % 2, 0);
	cr_assert_eq(s.arms, 3);
	cr_assert_eq(s.resets, 1);
	cr_assert_eq(s.cancels, 1);
	cr_assert_eq(s.fires, 2);
	/* 3 armed, 1 cancelled, 1 one-shot fired; the periodic one stays armed. */
	cr_assert_eq(s.armed, 1);
	cr_assert_eq(s.delivered, 1);
	cr_assert_eq(s.wakeups, 1);
	cr_assert_eq(s.malformed, 1);
	cr_assert_eq(s.sq_depth, 4);
	cr_assert_eq(s.sq_depth_max, 9);
	cr_assert_eq(s.sq_waiting, 5);
	cr_assert_eq(s.next_deadline_ns, 123456);
	cr_assert_eq(s.next_inexact, 1);
	cr_assert_eq(s.loops, 1);
	cr_assert_eq(s.sleeps, 1);
	cr_assert_eq(s.busy_ns, 500);
	cr_assert_eq(s.lat[chime_lat_bucket(1500)], 1);
	cr_assert_eq(s.lat[0], 1);
	cr_assert_eq(s.lat_sum_ns, 1505);
	cr_assert_eq(s.lat_max_ns, 1500);

	cr_assert_eq(fx.cs[2][1].seq % 2, 0);
	cr_assert_eq(fx.cs[2][1].generation, 77);
	cr_assert_eq(fx.cs[2][1].arms, 3);
	cr_assert_eq(fx.cs[2][1].armed, 1);
	cr_assert_eq(fx.cs[2][1].cancels, 1);
	cr_assert_eq(fx.cs[2][1].fires, 2);
	cr_assert_eq(fx.cs[2][1].malformed, 1, "the client's count of what it sent malformed");
	cr_assert_eq(fx.cs[2][1].cq_depth, 1);
	cr_assert_eq(fx.cs[2][1].cq_depth_max, 1);
	cr_assert_eq(fx.cs[2][1].sq_depth, 3);
	cr_assert_eq(fx.cs[2][1].sq_depth_max, 7);
	cr_assert_eq(fx.cs[2][1].wakeups, 1);
	/* The client's own histogram: 1500 ns and 5 ns. */
	cr_assert_eq(fx.cs[2][1].lat[chime_lat_bucket(1500)], 1);
	cr_assert_eq(fx.cs[2][1].lat[0], 1);
	cr_assert_eq(fx.cs[2][1].lat_max_ns, 1500);
	/* Other shards' columns and other clients are untouched. */
	cr_assert_eq(fx.cs[2][0].arms, 0);
	cr_assert_eq(fx.cs[2][2].arms, 0);
	cr_assert_eq(fx.cs[1][1].seq, 0);
	stats_fini(&st);
}

Test(stats, publish_skips_clean_clients_and_reattach_zeroes)
{
	static struct fixture fx;
	struct stats st;
	uint64_t seq;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[0], &fx.cs[0][0], CLIENTS, SHARDS, 0), 0);
	stats_client_attach(&st, 4, 1);
	stats_arm(&st, 4);
	stats_publish(&st);
	seq = fx.cs[4][0].seq;
	stats_arm(&st, 3);
	stats_publish(&st);
	cr_assert_eq(fx.cs[4][0].seq, seq, "an unchanged client is not rewritten");
	/* A gauge set to the value it has is no change either. */
	stats_client_depth(&st, 4, 0, 0);
	stats_publish(&st);
	cr_assert_eq(fx.cs[4][0].seq, seq);

	stats_client_detach(&st, 4);
	stats_publish(&st);
	cr_assert_eq(fx.cs[4][0].armed, 0);
	cr_assert_eq(fx.cs[4][0].arms, 1, "totals survive the detach");
	cr_assert_eq(fx.shard[0].armed, 1, "only client 3's timer is left");
	stats_client_attach(&st, 4, 2);
	stats_publish(&st);
	cr_assert_eq(fx.cs[4][0].generation, 2);
	cr_assert_eq(fx.cs[4][0].arms, 0, "a reused slot starts from zero");
	stats_fini(&st);
}

Test(stats, cancel_key_counts_victims_and_one_request)
{
	static struct fixture fx;
	struct stats st;
	int i;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[2], &fx.cs[0][0], CLIENTS, SHARDS, 2), 0);
	stats_client_attach(&st, 0, 1);
	for (i = 0; i < 10; i++)
		stats_arm(&st, 0);
	stats_cancel_key(&st, 0, 4);
	stats_cancel_key(&st, 0, 0);
	stats_publish(&st);
	cr_assert_eq(fx.shard[2].cancel_keys, 2);
	cr_assert_eq(fx.shard[2].cancels, 4);
	cr_assert_eq(fx.shard[2].armed, 6);
	cr_assert_eq(fx.cs[0][2].cancels, 4);
	cr_assert_eq(fx.cs[0][2].armed, 6);
	stats_fini(&st);
}

Test(stats, out_of_range_slot_touches_no_client_block)
{
	static struct fixture fx, zero;
	struct stats st;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[0], &fx.cs[0][0], CLIENTS, SHARDS, 0), 0);
	stats_arm(&st, CLIENTS);
	stats_fire_n(&st, 1000, 0, 10, 0, 0, 1);
	stats_client_attach(&st, CLIENTS + 7, 3);
	stats_publish(&st);
	cr_assert_eq(memcmp(fx.cs, zero.cs, sizeof(fx.cs)), 0);
	cr_assert_eq(fx.shard[0].arms, 1);
	cr_assert_eq(fx.shard[0].fires, 1);
	cr_assert_eq(stats_init_blocks(&st, &fx.shard[0], &fx.cs[0][0], CLIENTS, SHARDS, SHARDS), -EINVAL);
	stats_fini(&st);
}

Test(stats, init_from_control_segment_geometry)
{
	size_t size = sizeof(struct chime_ctl) + SHARDS * sizeof(struct chime_shard_ctl) +
		      CLIENTS * sizeof(struct chime_client_ctl) +
		      CLIENTS * SHARDS * sizeof(struct chime_client_stats);
	struct chime_ctl *ctl = aligned_alloc(64, size);
	struct chime_shard_ctl *sc;
	struct chime_client_stats *cs;
	struct stats st;

	cr_assert_not_null(ctl);
	memset(ctl, 0, size);
	ctl->nr_shards = SHARDS;
	ctl->max_clients = CLIENTS;
	ctl->shards_off = sizeof(*ctl);
	ctl->clients_off = ctl->shards_off + SHARDS * sizeof(*sc);
	ctl->client_stats_off = ctl->clients_off + CLIENTS * sizeof(struct chime_client_ctl);
	cr_assert_eq(stats_init(&st, ctl, 1), 0);
	stats_client_attach(&st, 3, 9);
	stats_arm(&st, 3);
	stats_publish(&st);
	sc = (struct chime_shard_ctl *)((char *)ctl + ctl->shards_off);
	cs = (struct chime_client_stats *)((char *)ctl + ctl->client_stats_off);
	cr_assert_eq(sc[1].stats.arms, 1);
	cr_assert_eq(sc[0].stats.arms, 0);
	cr_assert_eq(cs[3 * SHARDS + 1].arms, 1);
	cr_assert_eq(stats_init(&st, ctl, SHARDS), -EINVAL);
	stats_fini(&st);
	free(ctl);
}

/* ---- the recent window and reset-stats ---- */

#define SEC UINT64_C(1000000000)

static uint64_t win_count(const struct chime_shard_stats *s, uint64_t now, uint64_t *max)
{
	uint64_t h[CHIME_LAT_BUCKETS] = { 0 }, sum = 0;

	*max = 0;
	sr_window(s, now, h, &sum, max);
	return sr_hist_count(h);
}

Test(stats, window_keeps_the_last_ten_seconds_and_skips_stale_slots)
{
	static struct fixture fx;
	struct stats st;
	uint64_t max;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[0], &fx.cs[0][0], CLIENTS, SHARDS, 0), 0);
	stats_client_attach(&st, 1, 1);
	stats_fire_n(&st, 1, 100 * SEC, 100 * SEC + SEC / 2 + 0, 0, 0, 1);         /* t=100.5: 0.5 s late */
	stats_fire_n(&st, 1, 105 * SEC, 105 * SEC + 2000, 0, 0, 1);                 /* t=105: 2 us */
	stats_fire_n(&st, 1, 112 * SEC, 112 * SEC + 9000, 0, 0, 1);                 /* t=112: 9 us */
	stats_publish(&st);
	/* At 112.5 s the window is seconds 103..112. */
	cr_assert_eq(win_count(&fx.shard[0], 112 * SEC + SEC / 2, &max), 2);
	cr_assert_eq(max, 9000);
	cr_assert_eq(win_count(&fx.shard[0], 114 * SEC + SEC - 1, &max), 2);
	cr_assert_eq(win_count(&fx.shard[0], 115 * SEC, &max), 1, "105 left the window");
	cr_assert_eq(win_count(&fx.shard[0], 200 * SEC, &max), 0, "all stale");
	cr_assert_eq(win_count(&fx.shard[0], 101 * SEC, &max), 1, "a reader back then saw the first");
	/* Second 120 reuses the slot of 100: cleared first, never mixed. */
	stats_fire_n(&st, 1, 120 * SEC, 120 * SEC + 3000, 0, 0, 1);
	stats_publish(&st);
	cr_assert_eq(fx.shard[0].win[0].sec, 120);
	cr_assert_eq(fx.shard[0].win[0].max_ns, 3000);
	cr_assert_eq(win_count(&fx.shard[0], 120 * SEC + 5, &max), 2, "112 and 120");
	cr_assert_eq(max, 9000);
	/* The lifetime histogram has all four. */
	cr_assert_eq(sr_hist_count(fx.shard[0].lat), 4);
	cr_assert_eq(fx.shard[0].lat_max_ns, SEC / 2);
	stats_fini(&st);
}

Test(stats, reset_restarts_lateness_and_marks_but_no_counter)
{
	static struct fixture fx;
	struct chime_shard_stats s;
	struct stats st;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[0], &fx.cs[0][0], CLIENTS, SHARDS, 0), 0);
	stats_client_attach(&st, 3, 5);
	for (int i = 0; i < 4; i++) {
		stats_arm(&st, 3);
		stats_fire_n(&st, 3, 1000, 1000 + 50000, 0, 0, 1);
	}
	stats_sq(&st, 30, 30);
	stats_sq(&st, 2, 2);
	stats_client_sq(&st, 3, 40);
	stats_client_sq(&st, 3, 1);
	stats_client_depth(&st, 3, 9, 0);
	stats_client_depth(&st, 3, 0, 0);
	stats_publish(&st);
	cr_assert_eq(fx.cs[3][0].sq_depth_max, 40);
	cr_assert_eq(fx.cs[3][0].cq_depth_max, 9);

	stats_reset_figures(&st, 1);
	stats_publish(&st);
	read_shard(&s, &fx.shard[0]);
	cr_assert_eq(s.reset_gen, 1);
	cr_assert_eq(s.arms, 4, "counters are not reset");
	cr_assert_eq(s.fires, 4);
	cr_assert_eq(sr_hist_count(s.lat), 4, "lat[] stays monotonic (Prometheus)");
	cr_assert_eq(memcmp(s.lat, s.lat_base, sizeof(s.lat)), 0, "since the reset: nothing");
	cr_assert_eq(s.lat_sum_base_ns, s.lat_sum_ns);
	cr_assert_eq(s.lat_max_ns, 0);
	cr_assert_eq(s.sq_depth_max, 2, "the high-water mark restarts from now");
	cr_assert_eq(sr_hist_count(fx.cs[3][0].lat), 0);
	cr_assert_eq(fx.cs[3][0].lat_max_ns, 0);
	cr_assert_eq(fx.cs[3][0].sq_depth_max, 1);
	cr_assert_eq(fx.cs[3][0].cq_depth_max, 0);
	cr_assert_eq(fx.cs[3][0].arms, 4);
	cr_assert_eq(fx.cs[3][0].fires, 4);

	/* After the reset, only new samples count. */
	stats_fire_n(&st, 3, 1000, 1000 + 7000, 0, 0, 1);
	stats_publish(&st);
	cr_assert_eq(fx.shard[0].lat[chime_lat_bucket(7000)] - fx.shard[0].lat_base[chime_lat_bucket(7000)], 1);
	cr_assert_eq(fx.shard[0].lat_max_ns, 7000);
	cr_assert_eq(sr_hist_count(fx.cs[3][0].lat), 1);
	cr_assert_eq(fx.cs[3][0].lat_max_ns, 7000);
	stats_fini(&st);
}

/* ---- seqlock: a reader never sees a torn block ---- */

struct torn_arg {
	struct chime_shard_stats *pub;
	struct chime_client_stats *cpub;
	volatile int stop;
};

static void *torn_writer(void *p)
{
	struct torn_arg *a = p;
	struct stats st;
	uint64_t i;

	if (stats_init_blocks(&st, a->pub, a->cpub, 1, 1, 0) < 0)
		return NULL;
	stats_client_attach(&st, 0, 1);
	for (i = 1; !__atomic_load_n(&a->stop, __ATOMIC_RELAXED); i++) {
		/* Every field the same value i: any mix of two publishes is visible. */
		uint64_t *w = &st.sh.armed;
		size_t k, n = (sizeof(st.sh) - 8 - sizeof(st.sh._reserved)) / 8;

		stats_arm(&st, 0);      /* marks the client dirty */
		for (k = 0; k < n; k++)
			w[k] = i;
		st.lat_dirty = st.base_dirty = 1;
		st.win_dirty = (UINT32_C(1) << CHIME_LAT_WINDOW) - 1;
		st.cl[0].c.fires = st.cl[0].c.cancels = i;
		st.cl[0].c.arms = i + 1;
		stats_publish(&st);
		/* A shard loop does some work between publishes; without any,
		 * the reader is starved (by design it retries, it never blocks
		 * the writer). */
		for (uint64_t t = now_ns(); now_ns() - t < 2000;)
			;
	}
	stats_fini(&st);
	return NULL;
}

Test(stats, seqlock_reader_never_sees_a_torn_block, .timeout = 60)
{
	static struct chime_shard_stats pub;
	static struct chime_client_stats cpub;
	struct torn_arg a = { .pub = &pub, .cpub = &cpub };
	uint64_t t0 = now_ns(), reads = 0, last = 0, changes = 0;
	pthread_t th;

	cr_assert_eq(pthread_create(&th, NULL, torn_writer, &a), 0);
	/* At least 0.3 s and 1000 publishes seen (the writer may start late on a busy machine). */
	while (now_ns() - t0 < 300000000u || (changes < 1000 && now_ns() - t0 < UINT64_C(20000000000))) {
		struct chime_shard_stats s;
		struct chime_client_stats c;
		const uint64_t *w = &s.armed;
		size_t k, n = (sizeof(s) - 8 - sizeof(s._reserved)) / 8;

		/* -EAGAIN only says the writer was inside the block every time
		 * (preempted there on a loaded machine): retry; never torn. */
		while (chime_stats_read(&s, &pub, sizeof(s), 1000) < 0)
			sched_yield();
		for (k = 1; k < n; k++)
			cr_assert_eq(w[k], w[0], "torn shard block: field %zu = %lu, field 0 = %lu",
				     k, (unsigned long)w[k], (unsigned long)w[0]);
		cr_assert_geq(w[0], last, "went backwards");
		changes += w[0] != last;
		last = w[0];
		while (chime_stats_read(&c, &cpub, sizeof(c), 1000) < 0)
			sched_yield();
		if (c.seq) {   /* 0: not published yet */
			cr_assert_eq(c.fires, c.cancels);
			cr_assert_eq(c.arms, c.fires + 1, "torn client block");
		}
		reads++;
	}
	__atomic_store_n(&a.stop, 1, __ATOMIC_RELAXED);
	pthread_join(th, NULL);
	cr_assert_gt(reads, 1000);
	cr_assert_gt(changes, 10, "the writer must actually have raced the reader");
}

/* The rate limit is the shard's (shard.c PUBLISH_NS): stats_publish() itself always publishes. */
Test(stats, publish_always_publishes)
{
	static struct fixture fx;
	struct stats st;

	cr_assert_eq(stats_init_blocks(&st, &fx.shard[0], &fx.cs[0][0], CLIENTS, SHARDS, 0), 0);
	stats_loop(&st, 0);
	stats_publish(&st);
	cr_assert_eq(fx.shard[0].loops, 1);
	stats_loop(&st, 0);
	stats_publish(&st);
	cr_assert_eq(fx.shard[0].loops, 2, "no limit of its own");
	stats_fini(&st);
}

Test(stats, read_of_a_block_left_odd_gives_eagain)
{
	struct chime_shard_stats pub = { .seq = 3, .arms = 5 }, s;

	cr_assert_eq(chime_stats_read(&s, &pub, sizeof(s), 10), -EAGAIN);
	cr_assert_eq(s.arms, 5, "the best copy there is");
}
