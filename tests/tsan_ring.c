/* SPDX-License-Identifier: MIT */
/*
 * tsan_ring.c - the rings under ThreadSanitizer.
 *
 * Criterion cannot run under TSan (../shared/STYLE.md section 9), so this is a plain
 * program: exit 0 on success, 1 on a failed check; TSan itself exits 66 on
 * a report. Everything runs as threads over ONE mapping of a memfd: TSan
 * tracks addresses, and two mappings of the same page look like two
 * unrelated objects to it.
 *
 * What it exercises: MPSC with three producers and one consumer (record
 * fields written by producers with plain stores, read by the consumer after
 * C1, grants written by the consumer and read by the producers after S3), a
 * drainer peeking at published slots while they are being consumed and
 * reused (K1), and the completion ring with a void/take race on every event
 * (Q1-Q5). In a TSan build, ring.c maps its ordering helpers onto C11
 * builtins, so TSan checks exactly the acquire/release pairs ring.c claims.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "segment.h"

#define FAIL(...)							\
	do {								\
		fprintf(stderr, "tsan_ring: " __VA_ARGS__);		\
		fputc('\n', stderr);					\
		exit(1);						\
	} while (0)

#define NPROD 3u
#define PER   200000u
#define CQN   200000u

static struct chime_client_geom g = { .nr_shards = 1, .sq_size = 64, .cq_size = 64 };
static struct chime_map rw, ro;
static struct chime_chan_rw *crw;
static struct chime_chan_ro *cro;
static struct chime_sqe *sq;
static uint64_t *claim;
static struct chime_cqe *cq;
static uint64_t done;           /* consumer finished (atomic) */
static uint8_t voided[CQN], taken[CQN];

static void relax(unsigned *n)
{
	if (++*n > 64) {
		*n = 0;
		sched_yield();
	}
}

static void *producer(void *arg)
{
	uint64_t t = (uint64_t)(uintptr_t)arg;
	struct chime_sq_prod p;
	unsigned spins = 0;

	chime_sq_prod_init(&p, sq, &crw->sq_tail, g.sq_size);
	for (uint64_t i = 0; i < PER;) {
		/* The last producer submits runs of 1..8 (chime_submit's path), the others one by one. */
		uint32_t want = t == NPROD - 1 ? 1 + (uint32_t)(i % 8) : 1, got;
		uint64_t pos;

		if (want > PER - i)
			want = (uint32_t)(PER - i);
		while (!(got = t == NPROD - 1 ? chime_sq_reserve_n(&p, want, &pos)
					      : chime_sq_reserve(&p, &pos) != NULL))
			relax(&spins);
		for (uint32_t k = 0; k < got; k++, i++) {
			struct chime_sqe *s = &p.slots[(pos + k) & p.mask];

			if (s->grant != pos + k)
				FAIL("grant %llu at pos %llu", (unsigned long long)s->grant,
				     (unsigned long long)(pos + k));
			/*
			 * Atomic (relaxed) field stores only because the peeking drainer
			 * below reads slots that may be refilled under it (a seqlock
			 * read); chime_sq_pop() alone would be race-free with plain ones.
			 */
			__atomic_store_n(&s->id, s->grant, __ATOMIC_RELAXED);
			__atomic_store_n(&s->key, t, __ATOMIC_RELAXED);
			__atomic_store_n(&s->user_data, i, __ATOMIC_RELAXED);
			__atomic_store_n(&s->op, CHIME_OP_ARM, __ATOMIC_RELAXED);
		}
		if (got == 1)
			chime_sq_publish(&p.slots[pos & p.mask], pos);
		else
			chime_sq_publish_n(&p, pos, got);
	}
	return NULL;
}

static void *consumer(void *arg)
{
	struct chime_sq_cons c = { .slots = sq, .head = 0, .mask = g.sq_size - 1 };
	uint64_t next[NPROD] = { 0 }, got = 0;
	unsigned spins = 0;

	(void)arg;
	while (got < (uint64_t)NPROD * PER) {
		struct chime_sqe e;
		uint64_t pos;

		if (!chime_sq_pop(&c, &e, &pos)) {
			relax(&spins);
			continue;
		}
		if (e.id != pos || e.key >= NPROD || e.user_data != next[e.key])
			FAIL("record %llu out of order", (unsigned long long)pos);
		next[e.key]++;
		chime_sq_free(&c, pos, pos + g.sq_size, 0);
		got++;
	}
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *peeker(void *arg)
{
	struct chime_sqe e;
	uint64_t seen = 0;

	(void)arg;
	while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
		uint64_t tail = __atomic_load_n(&crw->sq_tail, __ATOMIC_RELAXED);

		for (uint64_t pos = tail > g.sq_size ? tail - g.sq_size : 0; pos < tail; pos++) {
			if (chime_sq_peek(sq, g.sq_size - 1, pos, &e)) {
				if (e.id != pos || e.key >= NPROD)
					FAIL("peek %llu: inconsistent record", (unsigned long long)pos);
				seen++;
			}
		}
		sched_yield();
	}
	return (void *)(uintptr_t)seen;
}

static void *cq_broker(void *arg)
{
	struct chime_cq_prod p;
	unsigned spins = 0;

	(void)arg;
	chime_cq_prod_init(&p, cq, claim, &cro->cq_tail, &crw->cq_head, g.cq_size);
	for (uint64_t i = 0; i <= CQN; i++) {
		struct chime_cqe *e;

		while (chime_cq_room(&p) == 0)
			relax(&spins);
		e = chime_cq_slot(&p);
		memset(e, 0, sizeof(*e));
		e->id = i;
		e->key = i * 3;
		chime_cq_push(&p);
		chime_cq_flush(&p);
		if (i < CQN && (i & 1))
			voided[i] = chime_cq_void(&p, i);
	}
	return NULL;
}

static void *cq_client(void *arg)
{
	struct chime_cq_cons c;
	unsigned spins = 0;

	(void)arg;
	chime_cq_cons_init(&c, cq, claim, &cro->cq_tail, &crw->cq_head, g.cq_size);
	for (;;) {
		struct chime_cqe e;

		if (!chime_cq_take(&c, &e)) {
			chime_cq_release(&c);
			relax(&spins);
			continue;
		}
		chime_cq_release(&c);
		if (e.id == CQN)
			return NULL;
		if (e.key != e.id * 3 || e.id > CQN)
			FAIL("cqe %llu corrupt", (unsigned long long)e.id);
		taken[e.id] = 1;
	}
}

int main(void)
{
	pthread_t prod[NPROD], cons, peek, cb, cc;
	struct chime_sq_cons init;
	int fd_rw, fd_ro, r;
	void *seen;

	if ((r = chime_client_layout(&g)) < 0 ||
	    (r = chime_seg_memfd("tsan-rw", g.rw_size, &fd_rw, &rw)) < 0 ||
	    (r = chime_seg_memfd("tsan-ro", g.ro_size, &fd_ro, &ro)) < 0)
		FAIL("setup: %s", strerror(-r));
	crw = chime_at(&rw, g.rw_chan_off);
	cro = chime_at(&ro, g.ro_chan_off);
	sq = chime_at(&rw, g.rw_sq_off);
	claim = chime_at(&rw, g.rw_claim_off);
	cq = chime_at(&ro, g.ro_cq_off);
	chime_sq_cons_init(&init, sq, g.sq_size, 0);
	for (uint32_t i = 0; i < g.sq_size; i++)
		sq[i].grant = i;

	pthread_create(&cons, NULL, consumer, NULL);
	pthread_create(&peek, NULL, peeker, NULL);
	for (uintptr_t t = 0; t < NPROD; t++)
		pthread_create(&prod[t], NULL, producer, (void *)t);
	pthread_create(&cb, NULL, cq_broker, NULL);
	pthread_create(&cc, NULL, cq_client, NULL);
	for (unsigned t = 0; t < NPROD; t++)
		pthread_join(prod[t], NULL);
	pthread_join(cons, NULL);
	pthread_join(peek, &seen);
	pthread_join(cb, NULL);
	pthread_join(cc, NULL);

	for (uint64_t i = 0; i < CQN; i++) {
		if (voided[i] + taken[i] != 1)
			FAIL("event %llu: voided %u taken %u", (unsigned long long)i, voided[i], taken[i]);
	}
	printf("tsan_ring: ok (%u records, %llu peeks, %u events)\n", NPROD * PER,
	       (unsigned long long)(uintptr_t)seen, CQN);
	chime_seg_unmap(&rw);
	chime_seg_unmap(&ro);
	return 0;
}
