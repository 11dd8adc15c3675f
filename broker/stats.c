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
}

void stats_client_detach(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c;

	if (slot >= st->max_clients)
		return;
	c = stats__cl(st, slot);
	stats__disarm(st, NULL, c->armed);
	c->armed = 0;
	c->cq_depth = 0;
	c->backlog = 0;
	st->cl[slot].attached = 0;
}

/* Everything after seq up to the histogram, then the histogram if it moved. */
#define SHARD_HEAD_OFF offsetof(struct chime_shard_stats, armed)
#define SHARD_HEAD_LEN (offsetof(struct chime_shard_stats, lat) - SHARD_HEAD_OFF)
#define SHARD_TAIL_OFF offsetof(struct chime_shard_stats, refused_nomem)
#define SHARD_TAIL_LEN (offsetof(struct chime_shard_stats, _reserved) - SHARD_TAIL_OFF)
#define CLIENT_OFF offsetof(struct chime_client_stats, generation)
#define CLIENT_LEN (sizeof(struct chime_client_stats) - CLIENT_OFF)

void stats_publish(struct stats *st)
{
	uint32_t i;

	if (!CHIME_COUNTERS)
		return;

	chime_stats_begin(&st->pub->seq);
	memcpy((char *)st->pub + SHARD_HEAD_OFF, (char *)&st->sh + SHARD_HEAD_OFF, SHARD_HEAD_LEN);
	memcpy((char *)st->pub + SHARD_TAIL_OFF, (char *)&st->sh + SHARD_TAIL_OFF, SHARD_TAIL_LEN);
	/* The histogram is a third of the block: skip it when no timer fired. */
	if (st->lat_dirty)
		memcpy(st->pub->lat, st->sh.lat, sizeof(st->sh.lat));
	chime_stats_end(&st->pub->seq);
	st->lat_dirty = 0;

	/* Only clients whose counters changed: an idle client costs nothing. */
	for (i = 0; i < st->nr_dirty; i++) {
		uint32_t slot = st->dirty[i];
		struct chime_client_stats *dst = &st->cpub[(uint64_t)slot * st->nr_shards + st->shard];

		chime_stats_begin(&dst->seq);
		memcpy((char *)dst + CLIENT_OFF, (char *)&st->cl[slot].c + CLIENT_OFF, CLIENT_LEN);
		chime_stats_end(&dst->seq);
		st->cl[slot].dirty = 0;
	}
	st->nr_dirty = 0;
}
