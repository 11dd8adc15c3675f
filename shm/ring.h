/* SPDX-License-Identifier: MIT */
/*
 * ring.h - the submission (MPSC) and completion (SPSC) rings over chime's
 * shared-memory slots (struct chime_sqe, struct chime_cqe in chime_shm.h).
 *
 * Why not ck_ring itself: ck_ring keeps both indices and the ring geometry in
 * one shared struct, and its consumer reads `mask` from it. chime's rings
 * split their indices across a client-writable and a read-only segment, and
 * the broker must never index with a value a client can write. So the rings
 * are chime's own, built on shm/atomics.h, and every side keeps the
 * geometry it indexes with in its own private struct (below).
 *
 * Positions are 64-bit and never wrap in practice; slot = pos & mask.
 */
#ifndef CHIME_RING_H
#define CHIME_RING_H

#include <stdbool.h>
#include <stdint.h>

#include <assert.h>

#include "atomics.h"
#include "chime_shm.h"

/*
 * Ring sizes chime_client_layout() accepts (powers of two). A submission
 * ring has at least 2 slots: with one, a slot's "published at pos" sequence
 * (pos + 1) is its "free for pos + 1" one, and producers would overwrite
 * records the shard never read. A completion ring has at least 8 slots so
 * that each shard's claim words fill whole cache lines: two shards never
 * write the same line.
 */
#define CHIME_SQ_MIN 2u
#define CHIME_CQ_MIN 8u
#define CHIME_RING_MAX (UINT32_C(1) << 24)

/* ---- submission ring: any number of client threads -> one shard ---- */

/* Producer view (client). Several threads share one. */
struct chime_sq_prod {
	struct chime_sqe *slots;
	uint64_t *tail;            /* chime_chan_rw.sq_tail */
	uint32_t mask;
};

/* Consumer view (broker). Private memory: slots pointer and mask are the broker's own. */
struct chime_sq_cons {
	struct chime_sqe *slots;
	uint64_t head;             /* next position to consume */
	uint32_t mask;
};

/*
 * Set up the views. chime_sq_cons_init() also formats the shared slots
 * (zeroes them, seq = base + index: free for the positions from base on):
 * the broker calls it on a segment no client has seen yet, then writes each
 * slot's first grant with plain stores before it sends the segment. `size`
 * is a power of two and `base` a multiple of it: 0 for a new client, the
 * position a reconnecting library closed its old ring at (so that a
 * producer still holding an old position can never claim a new slot).
 */
void chime_sq_prod_init(struct chime_sq_prod *p, struct chime_sqe *slots, uint64_t *tail, uint32_t size);
void chime_sq_cons_init(struct chime_sq_cons *c, struct chime_sqe *slots, uint32_t size, uint64_t base);

/*
 * A reserve fetches the slot CHIME_SQ_AHEAD positions on for writing
 * (at_prefetch_w()), for the calls that follow. The shard wrote each slot
 * last (its seq and next grant, when it freed it), so a slot otherwise
 * comes shared on the seq's load and the record's stores then take it in
 * a second transaction, on the caller's time. A hint only: a slot still
 * in use (a ring nearly full, or another thread's) is unharmed by it.
 * 8 rather than 4 or 2: the shortest arms and cancels on this VM
 * (docs/BENCHMARKS.md, "What the application's thread pays").
 */
#define CHIME_SQ_AHEAD 8u

/*
 * Claim the next free slot. Returns the slot and sets *pos, or NULL if the
 * ring is full (the consumer has not freed the slot yet). The caller fills
 * the record (reading ->grant for an ARM) and then calls chime_sq_publish().
 * Any number of concurrent producers, and concurrent with the consumer.
 * Lock-free: a failed CAS means another producer advanced the tail. The
 * producer trusts its own segment (a client scribbling it harms itself).
 * Inline, as chime_sq_publish(): every call of libchime's runs both.
 */
static inline struct chime_sqe *chime_sq_reserve(struct chime_sq_prod *p, uint64_t *pos)
{
	uint64_t cur = at_load(p->tail);

	for (;;) {
		struct chime_sqe *s = &p->slots[cur & p->mask];
		/* S3: the consumer's grant before our read of it; pairs with C2. */
		uint64_t seq = at_load_acq(&s->seq);
		int64_t diff = (int64_t)(seq - cur);

		if (diff == 0) {
			/* Claims position cur; on failure cur is the tail now. */
			if (at_cas(p->tail, &cur, cur + 1)) {
				*pos = cur;
				at_prefetch_w(&p->slots[(cur + CHIME_SQ_AHEAD) & p->mask]);
				return s;
			}
		} else if (diff < 0) {
			/* The slot still holds cur - size: the ring is full. */
			return NULL;
		} else {
			/* Another producer took cur: retry at the tail now. */
			cur = at_load(p->tail);
		}
	}
}


/*
 * Publish a reserved slot. The reserving thread only. Wait-free. S1 and
 * S2 in one exchange: the record (and the grant we read) before seq, and
 * seq before whatever the caller loads next -- the sleeping flag of the
 * doorbell handshake, which without the store-load barrier could be read
 * before seq is visible while the shard, having set sleeping, re-checks
 * and misses the record.
 */
static inline void chime_sq_publish(struct chime_sqe *sqe, uint64_t pos)
{
	/* S1 + S2: pairs with C1, and with the shard's barrier after its sleep number (S-SLEEP). */
	(void)at_xchg(&sqe->seq, pos + 1);
}


/*
 * Claim up to `want` consecutive free slots, for a batch. Returns how many
 * (0 if the ring is full, or want is 0) and sets *pos to the first. Fill
 * them (slot = p->slots[(pos + i) & p->mask]), then chime_sq_publish_n().
 */
uint32_t chime_sq_reserve_n(struct chime_sq_prod *p, uint32_t want, uint64_t *pos);

/*
 * Publish n >= 1 slots reserved together, in order, with one full barrier
 * after the last (as chime_sq_publish()).
 */
void chime_sq_publish_n(struct chime_sq_prod *p, uint64_t pos, uint32_t n);

/*
 * True if the consumer has not freed position pos yet: it is reserved, or
 * published and not consumed. A hint (relaxed load), for a producer that
 * wants to know how full the ring is without reading the consumer's head:
 * the consumer frees in order, so every position from pos on is waiting too
 * (but behind a hole a park stepped over: a ring no shard reads again).
 */
static inline bool chime_sq_waiting(const struct chime_sq_prod *p, uint64_t pos)
{
	/* freed for the next lap: seq = pos + size */
	return at_load(&p->slots[pos & p->mask].seq) - pos <= 1;
}

/* One load per field of a slot into private memory (ring.c, invariant 3). */
static inline void chime_sqe_copy(struct chime_sqe *out, const struct chime_sqe *s, uint64_t seq)
{
	out->seq = seq;
	out->grant = at_load(&s->grant);
	out->id = at_load(&s->id);
	out->key = at_load(&s->key);
	out->deadline_ns = at_load(&s->deadline_ns);
	out->period_ns = at_load(&s->period_ns);
	out->user_data = at_load(&s->user_data);
	out->op = at_load(&s->op);
	out->grant_flags = 0;   /* the broker's own, never read back */
}

/*
 * Copy the record at the consumer's head into *out if it is published.
 * Returns true and sets *pos; false if the slot is not ready. Reads exactly
 * one slot, chosen by the private head and mask, whatever the client wrote
 * (ring.c, invariant 1). Single consumer; wait-free. Inline: the shard
 * calls it for every record (7% of chan_drain()'s instructions as a call).
 */
static inline bool chime_sq_pop(struct chime_sq_cons *c, struct chime_sqe *out, uint64_t *pos)
{
	uint64_t head = c->head;
	const struct chime_sqe *s = &c->slots[head & c->mask];
	/* C1: seq, then the fields; pairs with S1. */
	uint64_t seq = at_load_acq(&s->seq);

	if (seq != head + 1)
		return false;
	chime_sqe_copy(out, s, seq);
	c->head = head + 1;
	*pos = head;
	return true;
}

/*
 * Free the slot just popped for the producer of pos + size, writing `grant`
 * and its flags into it first (release). Must follow each successful
 * chime_sq_pop(), in pop order or not: the slot is found by pos & private
 * mask, so any pos stays in bounds. Wait-free.
 */
static inline void chime_sq_free(struct chime_sq_cons *c, uint64_t pos, uint64_t grant, uint32_t flags)
{
	struct chime_sqe *s = &c->slots[pos & c->mask];

	at_store(&s->grant, grant);
	at_store(&s->grant_flags, flags);
	/* C2: the grant and our copy's loads, then the slot is free; pairs with S3. */
	at_store_rel(&s->seq, pos + (uint64_t)c->mask + 1);
}

/*
 * For a ring read for the last time (a named session's park: its process
 * died, or a broker's stop hands it over): step the head over the positions a producer reserved and never
 * published (a thread killed between its reserve and its publish), up to
 * the next published record, so that what other threads published after
 * them is applied too. Returns how many positions were stepped over: 0 if
 * the head is published, or if no record is published within a ring of it
 * (nothing behind a hole). Reads at most one ring of slots, by the private
 * head and mask;
 * the stepped-over slots are left as they are (the ring is not used
 * again, and never freed: a producer that lives publishes its slot later,
 * and libchime's reconnect re-submits it as a record the broker never
 * applied). Never for a ring the broker goes on reading: its reserved
 * slot is not a hole yet.
 */
uint32_t chime_sq_skip_unpublished(struct chime_sq_cons *c);

/*
 * Read the record at position pos without consuming it, if published:
 * returns true and copies it. For the client's drainer, which scans its own
 * not-yet-consumed submissions for cancels and resets.
 */
bool chime_sq_peek(const struct chime_sqe *slots, uint32_t mask, uint64_t pos, struct chime_sqe *out);

/* ---- completion ring: one shard -> one client ---- */

/* Producer view (broker, private). */
struct chime_cq_prod {
	struct chime_cqe *slots;   /* client ro segment */
	uint64_t *claim;           /* client rw segment, one word per slot */
	uint64_t *tail_pub;        /* chime_chan_ro.cq_tail */
	const uint64_t *head_pub;  /* chime_chan_rw.cq_head: client-written, never trusted */
	uint64_t tail;             /* private: next position to write */
	uint64_t head;             /* private: last consumer head seen, clamped to [head, tail] */
	uint32_t size;
	uint32_t mask;
};

/* Consumer view (client). One draining thread at a time. */
struct chime_cq_cons {
	const struct chime_cqe *slots;
	uint64_t *claim;
	const uint64_t *tail_pub;
	uint64_t *head_pub;
	uint64_t head;             /* private: next position to read */
	uint64_t tail;             /* private: last tail seen */
	uint32_t mask;
};

/*
 * Set up the views; both sides start at position 0 on a zero-filled segment
 * (claim words need no formatting: a word is read only for a position the
 * broker has pushed, and it writes the word before publishing the position).
 */
void chime_cq_prod_init(struct chime_cq_prod *p, struct chime_cqe *slots, uint64_t *claim,
			uint64_t *tail_pub, const uint64_t *head_pub, uint32_t size);
void chime_cq_cons_init(struct chime_cq_cons *c, const struct chime_cqe *slots, uint64_t *claim,
			const uint64_t *tail_pub, uint64_t *head_pub, uint32_t size);

/*
 * Re-read the consumer's head (acquire), clamp it to [previous head, tail]
 * and return how many slots are free now (0..size).
 */
uint32_t chime_cq_room(struct chime_cq_prod *p);

/* The slot for the next event; valid only if chime_cq_room() said there is room. */
static inline struct chime_cqe *chime_cq_slot(struct chime_cq_prod *p)
{
	return &p->slots[p->tail & p->mask];
}

/*
 * Finish the event written into chime_cq_slot(): set its claim word FRESH and
 * advance the private tail. Returns its position. Not visible to the client
 * until chime_cq_flush(). Producer only, wait-free; inline (per event). The
 * claim word is ours to write: the slot was consumed (room said so), and
 * the word we write names the new position, so a stale CAS for the slot's
 * previous position can no longer succeed.
 */
static inline uint64_t chime_cq_push(struct chime_cq_prod *p)
{
	uint64_t pos = p->tail;

	assert(p->tail - p->head < p->size);
	/* Ordered before cq_tail by Q1 in chime_cq_flush(). */
	at_store(&p->claim[pos & p->mask], pos << 2 | CHIME_CLAIM_FRESH);
	p->tail = pos + 1;
	return pos;
}

/* Publish every pushed event (release store of the tail). */
void chime_cq_flush(struct chime_cq_prod *p);

/*
 * Try to void the event at pos (a cancel or reset beat the client to it).
 * Returns true if voided: the client will skip it. False if the client
 * already took it (or pos is no longer in the ring).
 */
bool chime_cq_void(struct chime_cq_prod *p, uint64_t pos);

/* True if the client has consumed the event at pos (uses the clamped head; call chime_cq_room() to refresh). */
static inline bool chime_cq_consumed(const struct chime_cq_prod *p, uint64_t pos)
{
	return pos < p->head;
}

/*
 * The consumer's steps, for a drainer that judges each event before taking
 * it (libchime's, which must not take an event a cancel it has not seen
 * applied yet is about to void) and for chime_cq_take() below. One thread.
 */

/* Q2: acquire-load the published tail; remembered in c->tail and returned. */
uint64_t chime_cq_tail(struct chime_cq_cons *c);

/*
 * Copy the event at c->head into *out; true if its claim word is FRESH for
 * that position (false: the broker voided it). Does not move head.
 */
bool chime_cq_peek(const struct chime_cq_cons *c, struct chime_cqe *out);

/*
 * The event at c->head, in place, and whether its claim word is FRESH for
 * that position (chime_cq_peek() without the copy, inline: the drainer
 * judges the event where it lies and copies only what it returns). The
 * slot stays the client's to read until chime_cq_release() passes it,
 * voided or not: the broker writes a slot only after the consumer head
 * has passed it, and voiding writes the claim word only.
 */
static inline const struct chime_cqe *chime_cq_head_slot(const struct chime_cq_cons *c)
{
	return &c->slots[c->head & c->mask];
}

static inline bool chime_cq_fresh(const struct chime_cq_cons *c)
{
	uint64_t pos = c->head;

	/* Q2 (continued): the claim word, read after the tail like the event. */
	return at_load_acq(&c->claim[pos & c->mask]) == (pos << 2 | CHIME_CLAIM_FRESH);
}

/*
 * Q5: claim the event at c->head (FRESH -> TAKEN) and move past it. True if
 * the client won; false if the broker voided it first (skip it). Inline:
 * the drainer's per-event path. The draining thread; wait-free (one CAS).
 */
static inline bool chime_cq_claim(struct chime_cq_cons *c)
{
	uint64_t pos = c->head++;
	uint64_t cur = pos << 2 | CHIME_CLAIM_FRESH;

	/* Q5: pairs with chime_cq_void(). A lost CAS: voided. */
	return at_cas(&c->claim[pos & c->mask], &cur, pos << 2 | CHIME_CLAIM_TAKEN);
}

/* Move past the event at c->head without taking it (voided, or judged away). */
static inline void chime_cq_skip(struct chime_cq_cons *c)
{
	c->head++;
}

/*
 * Take the next event the client may return: copies it into *out and claims
 * it (CAS FRESH -> TAKEN), skipping voided slots. Returns 1 if an event was
 * taken, 0 if the ring is empty. Does not publish the head: call
 * chime_cq_release() after a batch, also after a 0 (the voided events it
 * skipped are consumed, and the broker needs their slots back).
 */
int chime_cq_take(struct chime_cq_cons *c, struct chime_cqe *out);

/* Publish the consumer head (release): the broker may reuse the slots. */
void chime_cq_release(struct chime_cq_cons *c);

/* True if an event (possibly a voided one) is waiting (acquire-loads the tail). */
bool chime_cq_pending(struct chime_cq_cons *c);

#endif /* CHIME_RING_H */
