/* SPDX-License-Identifier: MIT */
/*
 * ring.c - chime's submission (MPSC) and completion (SPSC) rings.
 *
 * Invariants (the reasons for everything below):
 *
 * 1. The broker side (chime_sq_pop/free, inline in ring.h; chime_cq_room/push/flush/void) never
 *    reads or writes outside its rings, whatever a client writes into its
 *    segment. It indexes only with its private geometry (slots pointer, mask,
 *    size in struct chime_sq_cons / chime_cq_prod) and a private position:
 *    every slot address is `slots + (private_pos & private_mask)`. A shared
 *    word (slot seq, cq_head, claim word) is loaded exactly once into a local,
 *    and is only ever compared, never used as an index or a length.
 * 2. A shared value a client can scribble changes only what that client gets:
 *    a wrong seq stalls or feeds garbage records to its own channel (the
 *    broker validates every record after copying it), a wrong cq_head is
 *    clamped to [last head, tail] so the broker never sees more room than the
 *    ring has, and a wrong claim word makes the broker treat the event as
 *    taken.
 * 3. The broker copies a record with one load per field into private memory
 *    (no double fetch: validation and use see the same bytes).
 * 4. Positions are uint64_t and never wrap in practice (2^64 records); a slot
 *    is pos & mask. The submission ring holds `size` records (Vyukov's queue
 *    has no wasted slot); the completion ring holds `size` events.
 *
 * Memory ordering: every edge is labelled and names its partner.
 *
 *   S1  producer: record fields, then seq = pos + 1 (release, inside a full
 *       barrier)                          pairs with C1
 *   S2  producer publish: full barrier before the caller's next load (the
 *       shard's sleep number)             pairs with the shard's own full
 *                                         barrier after storing it (S-SLEEP)
 *   C1  consumer: acquire-load seq, then the fields     pairs with S1
 *   C2  consumer free: grant and the copied record's loads, then
 *       seq = pos + size (release)        pairs with S3
 *   S3  producer reserve: acquire-load seq, then CAS tail, then read grant
 *                                         pairs with C2
 *   K1  drainer peek: seqlock re-check of seq after the copy
 *                                         pairs with S1 (publish) and C2 (free)
 *   Q1  cq push/flush: event and claim word, then cq_tail (release)
 *                                         pairs with Q2
 *   Q2  cq take: acquire-load cq_tail, then claim word and event  pairs with Q1
 *   Q3  cq release: event copies done, then cq_head (release)     pairs with Q4
 *   Q4  cq room: acquire-load cq_head, then reuse its slots       pairs with Q3
 *   Q5  claim CASes (client FRESH->TAKEN, broker FRESH->VOID): one location,
 *       so coherence alone picks exactly one winner.
 *
 * Atomics: shm/atomics.h (C11 builtins, which TSan models edge by edge).
 */
#include "ring.h"

#include <assert.h>
#include <string.h>

#include "atomics.h"

/* ------------------------------------------------------------------------ */
/* Submission ring                                                            */
/* ------------------------------------------------------------------------ */

void chime_sq_prod_init(struct chime_sq_prod *p, struct chime_sqe *slots, uint64_t *tail, uint32_t size)
{
	assert(size && !(size & (size - 1)));
	p->slots = slots;
	p->tail = tail;
	p->mask = size - 1;
}

/* Before the segment is shared: plain stores; the fd hand-over publishes them. */
void chime_sq_cons_init(struct chime_sq_cons *c, struct chime_sqe *slots, uint32_t size, uint64_t base)
{
	assert(size && !(size & (size - 1)) && !(base & (size - 1)));
	memset(slots, 0, (size_t)size * sizeof(*slots));
	for (uint32_t i = 0; i < size; i++)
		slots[i].seq = base + i;
	c->slots = slots;
	c->head = base;
	c->mask = size - 1;
}

/*
 * Like chime_sq_reserve(), for up to `want` consecutive slots at once (one
 * CAS for the lot): each free slot after the tail is checked (S3) before
 * the CAS claims the run; a producer that took one of them first moved the
 * tail, and the CAS fails. Lock-free.
 */
uint32_t chime_sq_reserve_n(struct chime_sq_prod *p, uint32_t want, uint64_t *pos)
{
	uint64_t cur = at_load(p->tail);

	if (want == 0)
		return 0;
	for (;;) {
		/* S3: each slot's grant before our read of it; pairs with C2. */
		int64_t diff = (int64_t)(at_load_acq(&p->slots[cur & p->mask].seq) - cur);

		if (diff == 0) {
			uint32_t k = 1;

			/*
			 * Each slot, not only the run's last: a park frees the
			 * records behind a hole it stepped over (chan_park()),
			 * and a live thread still owns the hole's slot.
			 */
			while (k < want && k <= p->mask &&
			       at_load_acq(&p->slots[(cur + k) & p->mask].seq) == cur + k)
				k++;
			if (at_cas(p->tail, &cur, cur + k)) {
				*pos = cur;
				return k;
			}
		} else if (diff < 0) {
			return 0;
		} else {
			cur = at_load(p->tail);
		}
	}
}

/*
 * The reserving thread only. Wait-free. S1 for each record (release: plain
 * moves on x86, and the consumer reads them in order anyway), and the last
 * one an exchange: S2 once for the whole run. For the records before the
 * last that is the hardware's ordering (x86 xchg, arm64 stlr before ldar,
 * POWER's sync), not C11's, which orders a release store before a later
 * load only through a seq_cst fence.
 */
void chime_sq_publish_n(struct chime_sq_prod *p, uint64_t pos, uint32_t n)
{
	for (uint32_t i = 0; i + 1 < n; i++)
		/* S1: pairs with C1. */
		at_store_rel(&p->slots[(pos + i) & p->mask].seq, pos + i + 1);
	/* S1 + S2: pairs with C1, and with the shard's barrier after its sleep number (S-SLEEP). */
	(void)at_xchg(&p->slots[(pos + n - 1) & p->mask].seq, pos + n);
}

uint32_t chime_sq_skip_unpublished(struct chime_sq_cons *c)
{
	if (at_load(&c->slots[c->head & c->mask].seq) == c->head + 1)
		return 0;       /* the head is published: nothing to step over */
	for (uint32_t k = 1; k <= c->mask; k++) {
		uint64_t pos = c->head + k;

		/* C1's acquire: chime_sq_pop() reads the record next. */
		if (at_load_acq(&c->slots[pos & c->mask].seq) == pos + 1) {
			c->head = pos;
			return k;
		}
	}
	return 0;
}

/*
 * Any thread, concurrently with everything: a seqlock read. Wait-free. The
 * copy may race with a producer refilling the slot after the consumer freed
 * it; the second load of seq detects that (seq only grows), so a true
 * return is a consistent record of position pos. Fields are relaxed
 * atomics on both sides. That a copy of the next lap's fields comes with
 * the next lap's seq is the hardware's (multi-copy atomic x86 and arm64,
 * POWER's sync in the tail CAS), not C11's: the refilling producer has no
 * release between the seq it acquired and its field stores.
 */
bool chime_sq_peek(const struct chime_sqe *slots, uint32_t mask, uint64_t pos, struct chime_sqe *out)
{
	const struct chime_sqe *s = &slots[pos & mask];
	/* K1: seq, then the fields; pairs with S1. */
	uint64_t seq = at_load_acq(&s->seq);

	if (seq != pos + 1)
		return false;
	chime_sqe_copy(out, s, seq);
	/* K1: the fields, then seq again; pairs with C2 (a free moves seq on). */
	at_fence_acq();
	return at_load(&s->seq) == seq;
}

/* ------------------------------------------------------------------------ */
/* Completion ring                                                            */
/* ------------------------------------------------------------------------ */

void chime_cq_prod_init(struct chime_cq_prod *p, struct chime_cqe *slots, uint64_t *claim,
			uint64_t *tail_pub, const uint64_t *head_pub, uint32_t size)
{
	assert(size && !(size & (size - 1)));
	p->slots = slots;
	p->claim = claim;
	p->tail_pub = tail_pub;
	p->head_pub = head_pub;
	p->tail = 0;
	p->head = 0;
	p->size = size;
	p->mask = size - 1;
}

void chime_cq_cons_init(struct chime_cq_cons *c, const struct chime_cqe *slots, uint64_t *claim,
			const uint64_t *tail_pub, uint64_t *head_pub, uint32_t size)
{
	assert(size && !(size & (size - 1)));
	c->slots = slots;
	c->claim = claim;
	c->tail_pub = tail_pub;
	c->head_pub = head_pub;
	c->head = 0;
	c->tail = 0;
	c->mask = size - 1;
}

/*
 * Producer (the shard) only; concurrent with the consumer. Wait-free.
 * The shared head is loaded once and clamped (invariant 2): below our last
 * head it cannot be (the client never un-consumes), above our tail it
 * cannot be (it cannot consume what we did not write). The clamp keeps
 * tail - head in [0, size], so the room is in [0, size].
 */
uint32_t chime_cq_room(struct chime_cq_prod *p)
{
	/* Q4: the client's reads of slots below h, then our reuse; pairs with Q3. */
	uint64_t h = at_load_acq(p->head_pub);

	if (h < p->head)
		h = p->head;
	if (h > p->tail)
		h = p->tail;
	p->head = h;
	return p->size - (uint32_t)(p->tail - h);
}

/*
 * Producer only; wait-free. A release store: the caller that then checks
 * the client's want_wakeup needs its own full barrier first.
 */
void chime_cq_flush(struct chime_cq_prod *p)
{
	/* Q1: events and claim words, then the tail; pairs with Q2. */
	at_store_rel(p->tail_pub, p->tail);
}

/*
 * Producer only; concurrent with the client's chime_cq_take(). Wait-free.
 * Q5: one CAS on the claim word, found with the private mask; only a
 * position still in the ring (pushed, not overwritten) is tried. A
 * scribbled word fails the CAS: the event counts as taken. The VOID is
 * ordered before the caller's next release store (sq_head) by that store.
 */
bool chime_cq_void(struct chime_cq_prod *p, uint64_t pos)
{
	uint64_t cur = pos << 2 | CHIME_CLAIM_FRESH;

	if (pos >= p->tail || p->tail - pos > p->size)
		return false;
	/* Q5: pairs with the client's CAS in chime_cq_claim() (ring.h). */
	return at_cas(&p->claim[pos & p->mask], &cur, pos << 2 | CHIME_CLAIM_VOID);
}

/* The client's one draining thread; wait-free. The broker is trusted here. */
uint64_t chime_cq_tail(struct chime_cq_cons *c)
{
	/* Q2: the tail, then claim words and events; pairs with Q1. */
	c->tail = at_load_acq(c->tail_pub);
	return c->tail;
}

/* The draining thread; wait-free. */
bool chime_cq_peek(const struct chime_cq_cons *c, struct chime_cqe *out)
{
	uint64_t pos = c->head;

	*out = c->slots[pos & c->mask];
	/* Q2 (continued): the claim word, read after the tail like the event. */
	return at_load_acq(&c->claim[pos & c->mask]) == (pos << 2 | CHIME_CLAIM_FRESH);
}

/* The draining thread; wait-free per event (bounded by the events published). */
int chime_cq_take(struct chime_cq_cons *c, struct chime_cqe *out)
{
	for (;;) {
		if (c->head == c->tail && c->head == chime_cq_tail(c))
			return 0;
		if (!chime_cq_peek(c, out))
			chime_cq_skip(c);
		else if (chime_cq_claim(c))
			return 1;
	}
}

/* The draining thread; wait-free. */
void chime_cq_release(struct chime_cq_cons *c)
{
	/* Q3: our copies of the events below head, then head; pairs with Q4. */
	at_store_rel(c->head_pub, c->head);
}

/* The draining thread; wait-free. */
bool chime_cq_pending(struct chime_cq_cons *c)
{
	return c->head != c->tail || c->head != chime_cq_tail(c);
}
