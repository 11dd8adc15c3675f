/* SPDX-License-Identifier: MIT */
/*
 * e2e_floor.c - chime-bench e2e, the floor under a client operation: what
 * this machine charges for handing one 64-byte record to a thread on another
 * CPU through a ring, with no chime code at all. See e2e.h.
 *
 * A submission slot is one cache line that the shard wrote last (it frees
 * the slot a lap earlier), so every record a client writes takes the line
 * back from the shard's CPU. The three ways measured are libchime's two
 * publications and the cheapest possible one:
 *
 *   plain    the slot's fields, then seq with a release store (what a single
 *            producer with no doorbell handshake would need);
 *   xchg     the same, seq by an exchange: the full barrier libchime's
 *            chime_sq_publish() needs before it reads the shard's sleep word;
 *   cas+xchg the position claimed by a CAS on the shared tail first, as
 *            chime_sq_reserve() does for many producer threads;
 *   ahead    the same, and each record fetches the slot CHIME_SQ_AHEAD on
 *            for writing, as chime_sq_reserve() does (shm/ring.h);
 *   batch    FLOOR_BATCH records at a time, as chime_submit() writes them:
 *            every slot's seq checked, one CAS for all, the fields, then
 *            seq by release stores and one exchange after the last;
 *   batch ahead  the same, the run's slots fetched for writing first: the
 *            seq loads of the batch way take each line shared and its
 *            stores take it again, which costs it half its time here
 *            (8.0 against 3.9 ns a record, 2026-12-03). libchime does not
 *            fetch so: chime_submit() gained nothing by it (its time is
 *            its instructions, docs/BENCHMARKS.md).
 *
 * Each burst of B records goes into slots the consumer wrote last and is
 * not touching now (it drains between bursts, untimed), as a burst reaches
 * a shard that has gone idle.
 */

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atomics.h"
#include "bench.h"
#include "e2e.h"
#include "ring.h"       /* CHIME_SQ_AHEAD */

#define FLOOR_SLOTS 1024u
#define FLOOR_REPS  400u
#define FLOOR_BATCH 64u         /* records per CAS in the batch way (chime-bench's op/64) */

struct floor_slot {
	uint64_t seq, grant, id, key, deadline_ns, period_ns, user_data;
	uint32_t op, _pad;
} __attribute__((aligned(64)));

struct floor_ring {
	struct floor_slot slot[FLOOR_SLOTS];
	uint64_t tail __attribute__((aligned(64)));
	uint64_t want __attribute__((aligned(64)));    /* drain up to here; UINT64_MAX: stop */
	uint64_t head __attribute__((aligned(64)));    /* drained up to here */
	int cpu;
};

int e2e_pin_to(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return 0;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return -pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* The consumer: drains to `want`, freeing each slot as a shard does (grant, then seq). */
static void *floor_consumer(void *arg)
{
	struct floor_ring *r = arg;
	uint64_t h = 0;

	(void)e2e_pin_to(r->cpu);
	for (;;) {
		uint64_t want = at_load_acq(&r->want);

		if (want == UINT64_MAX)
			return NULL;
		while (h < want) {
			struct floor_slot *s = &r->slot[h % FLOOR_SLOTS];

			if (at_load_acq(&s->seq) != h + 1) {
				at_relax();
				continue;
			}
			at_store(&s->grant, at_load(&s->id) + at_load(&s->key));
			at_store_rel(&s->seq, h + FLOOR_SLOTS);
			h++;
		}
		at_store_rel(&r->head, h);
		at_relax();
	}
}

static inline void floor_fill(struct floor_slot *s, uint64_t p)
{
	at_store(&s->id, p);
	at_store(&s->key, p);
	at_store(&s->deadline_ns, p);
	at_store(&s->period_ns, 0);
	at_store(&s->user_data, p);
	at_store(&s->op, 2u);
}

/* n records as chime_submit() writes a run of them: reserve all, fill, publish. */
static void floor_batch(struct floor_ring *r, unsigned n, bool ahead)
{
	uint64_t p = at_load(&r->tail), cur = p;

	for (unsigned k = 0; ahead && k < n; k++)
		at_prefetch_w(&r->slot[(p + k) % FLOOR_SLOTS]);
	for (unsigned k = 0; k < n; k++)
		while (at_load_acq(&r->slot[(p + k) % FLOOR_SLOTS].seq) != p + k)
			at_relax();
	(void)at_cas(&r->tail, &cur, p + n);
	for (unsigned k = 0; k < n; k++)
		floor_fill(&r->slot[(p + k) % FLOOR_SLOTS], p + k);
	for (unsigned k = 0; k + 1 < n; k++)
		at_store_rel(&r->slot[(p + k) % FLOOR_SLOTS].seq, p + k + 1);
	(void)at_xchg(&r->slot[(p + n - 1) % FLOOR_SLOTS].seq, p + n);
}

/* ns per record of one way, median over FLOOR_REPS bursts of `burst`. */
static double floor_way(struct floor_ring *r, enum floor_way way, unsigned burst)
{
	double *v = xcalloc(FLOOR_REPS, sizeof(*v)), med;

	for (unsigned rep = 0; rep < FLOOR_REPS; rep++) {
		uint64_t a, z;

		/* The consumer has freed every slot: they are its lines now. */
		while (at_load_acq(&r->head) != r->tail)
			at_relax();
		a = now_ns();
		for (unsigned i = 0; (way == FLOOR_BATCH || way == FLOOR_BATCH_AHEAD) && i < burst; i += FLOOR_BATCH)
			floor_batch(r, burst - i < FLOOR_BATCH ? burst - i : FLOOR_BATCH, way == FLOOR_BATCH_AHEAD);
		for (unsigned i = 0; way != FLOOR_BATCH && way != FLOOR_BATCH_AHEAD && i < burst; i++) {
			uint64_t p = at_load(&r->tail);
			struct floor_slot *s = &r->slot[p % FLOOR_SLOTS];

			while (at_load_acq(&s->seq) != p)
				at_relax();
			if (way == FLOOR_CAS_XCHG || way == FLOOR_CAS_XCHG_AHEAD) {
				uint64_t cur = p;

				(void)at_cas(&r->tail, &cur, p + 1);
				if (way == FLOOR_CAS_XCHG_AHEAD)
					at_prefetch_w(&r->slot[(p + CHIME_SQ_AHEAD) % FLOOR_SLOTS]);
			} else {
				at_store(&r->tail, p + 1);
			}
			floor_fill(s, p);
			if (way == FLOOR_PLAIN)
				at_store_rel(&s->seq, p + 1);
			else
				(void)at_xchg(&s->seq, p + 1);
		}
		z = now_ns();
		v[rep] = (double)(z - a) / burst;
		at_store_rel(&r->want, at_load(&r->tail));
	}
	med = bench_median(v, FLOOR_REPS);
	free(v);
	return med;
}

int run_floor(unsigned burst, struct floor_result *res)
{
	struct floor_ring *r;
	pthread_t th;
	cpu_set_t set;
	int cpus[2] = { -1, -1 }, k = 0;

	memset(res, 0, sizeof(*res));
	if (burst == 0 || burst > FLOOR_SLOTS)
		return -1;
	/* The first two CPUs this process may use: producer and consumer apart. */
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
			if (CPU_ISSET(c, &set))
				cpus[k++] = c;
	if (k < 2)
		return -1;
	if (posix_memalign((void **)&r, 64, sizeof(*r)))
		return -1;
	memset(r, 0, sizeof(*r));
	for (unsigned i = 0; i < FLOOR_SLOTS; i++)
		r->slot[i].seq = i;
	r->cpu = cpus[1];
	if (pthread_create(&th, NULL, floor_consumer, r)) {
		free(r);
		return -1;
	}
	(void)e2e_pin_to(cpus[0]);
	for (int w = 0; w < NR_FLOOR; w++)
		res->ns[w] = floor_way(r, (enum floor_way)w, burst);
	while (at_load_acq(&r->head) != r->tail)
		at_relax();
	at_store_rel(&r->want, UINT64_MAX);
	pthread_join(th, NULL);
	/* Back to every CPU this process had, for the phases after. */
	(void)sched_setaffinity(0, sizeof(set), &set);
	res->cpu[0] = cpus[0];
	res->cpu[1] = cpus[1];
	free(r);
	return 0;
}
