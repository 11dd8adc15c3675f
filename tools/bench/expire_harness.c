/* SPDX-License-Identifier: MIT */
/*
 * expire_harness.c - what one expiration costs, in one thread: chimed's
 * wheel, chan.c and counters on private memory (as tests/test_chan.c drives
 * them), one client with the broker's default ring sizes, N one-shots armed
 * through its submission ring with one key and one deadline, then the
 * shard's steps as shard.c runs them (advance, pops of 256 into
 * chan_fire_batch(), up to 4096 per iteration, chan_service()) and a ring
 * consumer taking 512 at a time between iterations (ring.h's
 * chime_cq_take(), not libchime's drainer).
 *
 * It prints ns per event, which on this single thread says little (no
 * second core, no lines crossing between cores); what it is for is the
 * instruction count per event, under callgrind, of exactly the expiry:
 *
 *   valgrind --tool=callgrind '--toggle-collect=expire_phase*' \
 *       build/tools/expire-harness 200000
 *   callgrind_annotate --inclusive=yes callgrind.out.<pid>
 *
 * and divide by N (ARCHITECTURE.md, "Expiry throughput"). Not installed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chan.h"
#include "keyidx.h"
#include "ring.h"
#include "segment.h"
#include "stats.h"
#include "wheel.h"

#define RES        100000u      /* the broker's default resolution, 100 us */
#define SQ         1024u        /* its default ring sizes */
#define CQ         8192u
#define POP_BATCH  256u         /* shard.c's */
#define FIRE_BUDGET 4096u
#define TAKE_BATCH 512u         /* chime-bench e2e's EV_BATCH */
#define T0         UINT64_C(1000000000)
#define MAXCL      4u

static struct {
	struct shard_core sc;
	struct stats st;
	struct chime_shard_stats pub;
	struct chime_client_stats cpub[MAXCL];
	struct chan *by_slot[MAXCL];
	struct chime_client_geom g;
	struct chan_mem m;
	struct chan ch;
	struct chime_sq_prod prod;
	struct chime_cq_cons cons;
} H;

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* shard.c's fire_due() */
static __attribute__((noinline)) unsigned fire_due(uint64_t now)
{
	uint32_t buf[POP_BATCH];
	unsigned total = 0, n;

	wheel_advance(&H.sc.wh, now);
	while (total < FIRE_BUDGET && (n = wheel_pop_expired(&H.sc.wh, buf, POP_BATCH)) > 0) {
		chan_fire_batch(&H.sc, buf, n, now);
		total += n;
	}
	return total;
}

/* The client's side: take up to TAKE_BATCH events, then release them. */
static __attribute__((noinline)) size_t take(uint64_t *sum)
{
	struct chime_cqe e;
	size_t k = 0;

	while (k < TAKE_BATCH && chime_cq_take(&H.cons, &e) == 1) {
		*sum += e.user_data;
		k++;
	}
	chime_cq_release(&H.cons);
	return k;
}

/* Everything callgrind counts (gcc may name it expire_phase.constprop.0: hence the '*'). */
static __attribute__((noinline)) size_t expire_phase(size_t n, uint64_t now, uint64_t *sum)
{
	size_t got = 0;

	while (got < n) {
		(void)fire_due(now);
		(void)chan_service(&H.sc, &H.ch, now);
		for (int j = 0; j < (int)(FIRE_BUDGET / TAKE_BATCH); j++)
			got += take(sum);
	}
	return got;
}

static void *region(size_t len)
{
	void *p = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);

	if (!p) {
		fprintf(stderr, "expire-harness: out of memory (%zu bytes)\n", len);
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : 500000, got;
	uint32_t cap = (uint32_t)n + 2 * SQ, nb = keyidx_buckets_for(cap);
	size_t wsz = wheel_region_size(cap);
	uint64_t d = T0 + 2 * UINT64_C(1000000000), sum = 0, t;
	void *rw, *ro;

	if (n == 0 || n > UINT32_MAX / 2) {
		fprintf(stderr, "usage: expire-harness [TIMERS]   (1 .. 2^31, default 500000)\n");
		return 2;
	}
	if (wheel_init(&H.sc.wh, region(wsz), wsz, cap, RES, T0) < 0 ||
	    stats_init_blocks(&H.st, &H.pub, H.cpub, MAXCL, 1, 0) < 0)
		return 1;
	keyidx_init(&H.sc.ki, region((size_t)nb * sizeof(uint32_t)), nb, H.sc.wh.nodes);
	H.sc.st = &H.st;
	H.sc.by_slot = H.by_slot;
	H.sc.capacity = cap;
	H.sc.max_clients = MAXCL;
	H.sc.quota = UINT64_MAX;
	H.g.nr_shards = 1;
	H.g.sq_size = SQ;
	H.g.cq_size = CQ;
	if (chime_client_layout(&H.g) < 0)
		return 1;
	rw = region(H.g.rw_size);
	ro = region(H.g.ro_size);
	H.m.sq_slots = (struct chime_sqe *)((char *)rw + H.g.rw_sq_off);
	H.m.claim = (uint64_t *)((char *)rw + H.g.rw_claim_off);
	H.m.rw = (struct chime_chan_rw *)((char *)rw + H.g.rw_chan_off);
	H.m.ro = (struct chime_chan_ro *)((char *)ro + H.g.ro_chan_off);
	H.m.cq_slots = (struct chime_cqe *)((char *)ro + H.g.ro_cq_off);
	H.m.want_wakeup = &((struct chime_client_rw *)rw)->want_wakeup;
	H.m.sq_size = SQ;
	H.m.cq_size = CQ;
	H.m.wake_fd = -1;
	H.m.bell_fd = -1;
	if (chan_attach(&H.sc, &H.ch, &H.m, 0, 1) < 0)
		return 1;
	chime_sq_prod_init(&H.prod, H.m.sq_slots, &H.m.rw->sq_tail, SQ);
	chime_cq_cons_init(&H.cons, H.m.cq_slots, H.m.claim, &H.m.ro->cq_tail, &H.m.rw->cq_head, CQ);

	/* Armed as chime-bench e2e arms them: one key, one deadline, in slab order. */
	for (size_t i = 0; i < n; i++) {
		struct chime_sqe *s;
		uint64_t pos;

		while (!(s = chime_sq_reserve(&H.prod, &pos)))
			(void)chan_drain(&H.sc, &H.ch, 256);
		s->op = CHIME_OP_ARM;
		s->id = s->grant;
		s->key = 7;
		s->deadline_ns = d;
		s->period_ns = 0;
		s->user_data = i;
		chime_sq_publish(s, pos);
	}
	while (chan_drain(&H.sc, &H.ch, 256) > 0)
		;

	t = mono_ns();
	got = expire_phase(n, d, &sum);
	t = mono_ns() - t;
	if (got != n || sum != (uint64_t)n * (n - 1) / 2) {
		fprintf(stderr, "expire-harness: %zu of %zu events, or the wrong ones\n", got, n);
		return 1;
	}
	printf("%zu events due at one instant: %.1f ns per event (one thread: shard and ring consumer)\n",
	       n, (double)t / (double)n);
	return 0;
}
