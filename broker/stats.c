/* SPDX-License-Identifier: MIT */
/*
 * stats.c - publish a shard's private counters into the control segment.
 *
 * Invariants:
 * - one writer per shared block: shard k alone writes shard block k and
 *   column k of the client stats table, so the seqlock needs no atomic RMW;
 * - the shared blocks are written only inside chime_stats_begin/end, so a
 *   reader that copies a block between two equal even seqs has a consistent
 *   snapshot (chime_stats_read());
 * - the hot path touches only private memory (see stats.h).
 */
#include "stats.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int stats_init_blocks(struct stats *st, struct chime_shard_stats *pub,
		      struct chime_client_stats *cpub, uint32_t max_clients,
		      uint32_t nr_shards, uint32_t shard)
{
	if (!pub || (max_clients && !cpub) || shard >= nr_shards)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->cl = calloc(max_clients ? max_clients : 1, sizeof(*st->cl));
	st->dirty = calloc(max_clients ? max_clients : 1, sizeof(*st->dirty));
	if (!st->cl || !st->dirty) {
		stats_fini(st);
		return -ENOMEM;
	}
	st->pub = pub;
	st->cpub = cpub;
	st->max_clients = max_clients;
	st->nr_shards = nr_shards;
	st->shard = shard;
	st->sh.next_deadline_ns = UINT64_MAX;
	st->lat_dirty = 1;
	st->base_dirty = 1;
	st->win_dirty = (UINT32_C(1) << CHIME_LAT_WINDOW) - 1;
	for (uint32_t i = 0; i < st->max_clients; i++)
		st->cl[i].lat_lo = UINT8_MAX;
	return 0;
}

int stats_init(struct stats *st, struct chime_ctl *ctl, uint32_t shard)
{
	char *base = (char *)ctl;
	struct chime_shard_ctl *sc;

	if (!ctl || shard >= ctl->nr_shards)
		return -EINVAL;
	sc = (struct chime_shard_ctl *)(base + ctl->shards_off) + shard;
	return stats_init_blocks(st, &sc->stats,
				 (struct chime_client_stats *)(base + ctl->client_stats_off),
				 ctl->max_clients, ctl->nr_shards, shard);
}

void stats_fini(struct stats *st)
{
	free(st->cl);
	free(st->dirty);
	st->cl = NULL;
	st->dirty = NULL;
}

void stats_client_attach(struct stats *st, uint32_t slot, uint64_t generation)
{
	struct chime_client_stats *c;

	if (slot >= st->max_clients)
		return;
	c = stats__cl(st, slot);
	/* A reused slot starts from zero: the tools match counters to the
	 * client by generation, so old totals never leak into a new client. */
	memset(c, 0, sizeof(*c));
	c->generation = generation;
	st->cl[slot].attached = 1;
	st->cl[slot].lat_lo = 0;        /* the whole histogram: it was another client's */
	st->cl[slot].lat_hi = CHIME_LAT_BUCKETS - 1;
}

void stats_window_roll(struct stats *st, uint64_t now_ns)
{
	uint64_t sec = now_ns / STATS_NS_PER_S;
	uint32_t i = (uint32_t)(sec % CHIME_LAT_WINDOW);
	struct chime_lat_second *w = &st->sh.win[i];

	/* The slot last held sec - k * CHIME_LAT_WINDOW (or nothing): start it afresh. */
	if (w->sec != sec) {
		memset(w, 0, sizeof(*w));
		w->sec = sec;
	}
	st->win_cur = i;
	st->win_end_ns = (sec + 1) * STATS_NS_PER_S;
	st->win_dirty |= UINT32_C(1) << i;
}

void stats_reset_figures(struct stats *st, uint64_t gen)
{
	if (!CHIME_COUNTERS)
		return;
	/* Since-reset = lat - lat_base: lat itself stays monotonic (Prometheus). */
	memcpy(st->sh.lat_base, st->sh.lat, sizeof(st->sh.lat_base));
	st->sh.lat_sum_base_ns = st->sh.lat_sum_ns;
	st->sh.lat_max_ns = 0;
	st->sh.sq_depth_max = st->sh.sq_depth;
	st->sh.reset_gen = gen;
	st->base_dirty = 1;
	for (uint32_t slot = 0; slot < st->max_clients; slot++) {
		struct chime_client_stats *c;

		if (!st->cl[slot].c.generation)
			continue;       /* never held a client here */
		c = stats__cl(st, slot);
		memset(c->lat, 0, sizeof(c->lat));
		c->lat_max_ns = 0;
		c->sq_depth_max = c->sq_depth;
		c->cq_depth_max = c->cq_depth;
		st->cl[slot].lat_lo = 0;
		st->cl[slot].lat_hi = CHIME_LAT_BUCKETS - 1;
	}
}

void stats_client_detach(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c;

	if (slot >= st->max_clients)
		return;
	c = stats__cl(st, slot);
	stats__disarm(st, NULL, c->armed);
	c->armed = 0;
	c->owned = 0;
	c->cq_depth = 0;
	c->sq_depth = 0;
	c->backlog = 0;
	st->cl[slot].attached = 0;
}

/*
 * Everything after seq up to the histogram and from the histogram to the
 * reset base (a client's: up to its histogram and what follows it); then the histogram if it moved, the base after a reset, and
 * the window slots that changed (one a second, or two when it rolls).
 */
#define SHARD_HEAD_OFF offsetof(struct chime_shard_stats, armed)
#define SHARD_HEAD_LEN (offsetof(struct chime_shard_stats, lat) - SHARD_HEAD_OFF)
#define SHARD_TAIL_OFF offsetof(struct chime_shard_stats, refused_nomem)
#define SHARD_TAIL_LEN (offsetof(struct chime_shard_stats, lat_base) - SHARD_TAIL_OFF)
#define SHARD_END_OFF offsetof(struct chime_shard_stats, restored)
#define SHARD_END_LEN (offsetof(struct chime_shard_stats, _reserved) - SHARD_END_OFF)
#define CLIENT_OFF offsetof(struct chime_client_stats, generation)
#define CLIENT_LEN (offsetof(struct chime_client_stats, lat) - CLIENT_OFF)
#define CLIENT_END_OFF offsetof(struct chime_client_stats, refused_user_quota)
#define CLIENT_END_LEN (offsetof(struct chime_client_stats, _reserved) - CLIENT_END_OFF)
_Static_assert(SHARD_HEAD_OFF % 8 == 0 && SHARD_HEAD_LEN % 8 == 0 && SHARD_TAIL_OFF % 8 == 0 &&
	       SHARD_TAIL_LEN % 8 == 0 && SHARD_END_OFF % 8 == 0 && SHARD_END_LEN % 8 == 0 &&
	       CLIENT_OFF % 8 == 0 && CLIENT_LEN % 8 == 0 && CLIENT_END_OFF % 8 == 0 && CLIENT_END_LEN % 8 == 0 &&
	       sizeof(((struct chime_shard_stats *)0)->win[0]) % 8 == 0 &&
	       sizeof(((struct chime_client_stats *)0)->lat[0]) == 8, "chime_stats_put() copies whole words");

void stats_restore(struct stats *st, uint64_t kept, uint64_t dropped, uint64_t redelivered)
{
	st->sh.restored = kept;
	st->sh.restore_dropped = dropped;
	st->sh.redelivered = redelivered;
}

void stats_publish(struct stats *st)
{
	uint32_t i;

	if (!CHIME_COUNTERS)
		return;

	chime_stats_begin(&st->pub->seq);
	chime_stats_put((char *)st->pub + SHARD_HEAD_OFF, (char *)&st->sh + SHARD_HEAD_OFF, SHARD_HEAD_LEN);
	chime_stats_put((char *)st->pub + SHARD_TAIL_OFF, (char *)&st->sh + SHARD_TAIL_OFF, SHARD_TAIL_LEN);
	/* The histogram is a third of the block: skip it when no timer fired. */
	if (st->lat_dirty)
		chime_stats_put(st->pub->lat, st->sh.lat, sizeof(st->sh.lat));
	if (st->base_dirty)
		chime_stats_put(st->pub->lat_base, st->sh.lat_base, sizeof(st->sh.lat_base));
	for (uint32_t d = st->win_dirty; d; d &= d - 1) {
		uint32_t w = (uint32_t)__builtin_ctz(d);

		chime_stats_put(&st->pub->win[w], &st->sh.win[w], sizeof(st->sh.win[w]));
	}
	chime_stats_put((char *)st->pub + SHARD_END_OFF, (char *)&st->sh + SHARD_END_OFF, SHARD_END_LEN);
	chime_stats_end(&st->pub->seq);
	st->lat_dirty = 0;
	st->base_dirty = 0;
	st->win_dirty = 0;

	/* Only clients whose counters changed: an idle client costs nothing. */
	for (i = 0; i < st->nr_dirty; i++) {
		uint32_t slot = st->dirty[i];
		struct chime_client_stats *dst = &st->cpub[(uint64_t)slot * st->nr_shards + st->shard];
		struct stats_client *p = &st->cl[slot];

		chime_stats_begin(&dst->seq);
		chime_stats_put((char *)dst + CLIENT_OFF, (char *)&p->c + CLIENT_OFF, CLIENT_LEN);
		/* Only the buckets that moved: a busy client touches a few of 82. */
		if (p->lat_lo <= p->lat_hi)
			chime_stats_put(&dst->lat[p->lat_lo], &p->c.lat[p->lat_lo],
			       (size_t)(p->lat_hi - p->lat_lo + 1) * sizeof(p->c.lat[0]));
		chime_stats_put((char *)dst + CLIENT_END_OFF, (char *)&p->c + CLIENT_END_OFF, CLIENT_END_LEN);
		chime_stats_end(&dst->seq);
		p->dirty = 0;
		p->lat_lo = UINT8_MAX;
		p->lat_hi = 0;
	}
	st->nr_dirty = 0;
}
