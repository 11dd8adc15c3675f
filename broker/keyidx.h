/* SPDX-License-Identifier: MIT */
/*
 * keyidx.h - per-shard key index: which nodes of this shard belong to
 * (client slot, key), for CHIME_OP_CANCEL_KEY.
 *
 * A chained hash table that lives in the shard segment: `key_buckets` uint32
 * bucket heads at chime_shard_seg.key_off, and the chains run through
 * chime_node.key_next/key_prev (doubly linked, so removal is O(1)).
 *
 * Bucket encoding: a head holds (node index + 1), and 0 means "empty". Not
 * CHIME_NIL, so that a fresh (zero-filled, sparse) shard segment is already
 * an empty index and its bucket pages are only touched when used: 1M buckets
 * cost no memory until timers arrive. Inside a chain, key_next/key_prev use
 * CHIME_NIL as usual.
 *
 * A node a client armed (ARMED, EXPIRED, ALLOC, BACKLOG, ACKWAIT) is in
 * the index once its client has sent a CANCEL_KEY on that shard (chan.c:
 * the first one indexes what the client armed before it); until then it is
 * left out, its key_prev KEYIDX_OUT. GRANTED and FREE nodes are not in it.
 * Single writer: the shard thread. Tools may walk it racily.
 */
#ifndef CHIMED_KEYIDX_H
#define CHIMED_KEYIDX_H

#include <stdbool.h>
#include <stdint.h>

#include "chime_shm.h"

/*
 * key_prev of a node left out of the index. Never a node index: the
 * capacity is at most CHIME_NIL - 1 (chimed --capacity), so the highest
 * index is CHIME_NIL - 2.
 */
#define KEYIDX_OUT (CHIME_NIL - 1)

static inline bool keyidx_linked(const struct chime_node *n)
{
	return n->key_prev != KEYIDX_OUT;
}

/* Leave node n out of the index (a fresh grant; a restored node, until its client keys). */
static inline void keyidx_leave_out(struct chime_node *n)
{
	n->key_next = CHIME_NIL;
	n->key_prev = KEYIDX_OUT;
}

/* A walk over the nodes of (owner, key), in steps: a CANCEL_KEY's (below). */
struct keyidx_walk {
	uint64_t key;
	uint16_t owner;
	uint32_t at;                /* private: its cursor's place in keyidx.cursor[] */
};

struct keyidx {
	uint32_t *heads;            /* shard segment; index + 1, 0 = empty */
	struct chime_node *nodes;   /* the shard's slab */
	uint32_t mask;              /* private: key_buckets - 1 */
	uint64_t seed;              /* private: mixed into every bucket, random per broker run */
	/*
	 * Private: the walks in progress, packed, so that keyidx_remove()
	 * looks at nr_walks words: each one's cursor (the next node of its
	 * chain to look at; CHIME_NIL: over) and the walk it belongs to.
	 */
	uint32_t *cursor;
	struct keyidx_walk **walk;
	uint32_t nr_walks, max_walks;
};

/*
 * Attach to `nbuckets` (a power of two) zero-filled heads (walks in
 * progress, none at a re-attach, keep their arrays). `seed` picks the
 * hash: chimed draws it at random each run, so a client cannot compute keys
 * that all land in one bucket and make another client's cancel_key walk
 * its timers (insert and remove are O(1) whatever the chain; only a
 * cancel_key walks one). The heads only mean something under the seed that
 * filled them: a broker that reuses a shard file clears and refills them.
 */
void keyidx_init(struct keyidx *ki, uint32_t *heads, uint32_t nbuckets, struct chime_node *nodes,
		 uint64_t seed);

/* Buckets for a slab of `capacity` nodes: one per 4 nodes, at least 1024. */
uint32_t keyidx_buckets_for(uint32_t capacity);

/* Inline: the shard hashes each record's key ahead (prefetch stages) and again to link it. */
static inline uint32_t keyidx_bucket(const struct keyidx *ki, uint16_t owner, uint64_t key)
{
	/* splitmix64's finaliser: keys are often small integers or pointers. */
	uint64_t z = key ^ ki->seed ^ ((uint64_t)owner * UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	z ^= z >> 31;
	return (uint32_t)z & ki->mask;
}

/* Room for max_walks walks at once (one per client of the shard): 0, or -ENOMEM. */
int keyidx_walks_init(struct keyidx *ki, uint32_t max_walks);
void keyidx_walks_fini(struct keyidx *ki);

/* Walks whose cursor is node idx go on from next (idx is being removed). */
void keyidx_walks_skip(struct keyidx *ki, uint32_t idx, uint32_t next);

/* Link node idx by its own owner and key. O(1). */
void keyidx_insert(struct keyidx *ki, uint32_t idx);

/*
 * Unlink node idx (which must be linked: keyidx_linked()) and leave it
 * out. O(1). Inline: the shard frees every consumed one-shot through it.
 */
static inline void keyidx_remove(struct keyidx *ki, uint32_t idx)
{
	struct chime_node *n = &ki->nodes[idx];

	if (__builtin_expect(ki->nr_walks != 0, 0))
		keyidx_walks_skip(ki, idx, n->key_next);  /* a walk stopped here goes on from the next one */
	if (n->key_next != CHIME_NIL)
		ki->nodes[n->key_next].key_prev = n->key_prev;
	if (n->key_prev != CHIME_NIL)
		ki->nodes[n->key_prev].key_next = n->key_next;
	else
		ki->heads[keyidx_bucket(ki, n->owner, n->key)] = n->key_next + 1;
	keyidx_leave_out(n);
}

/*
 * A walk over the nodes of (owner, key) that can stop when its budget is
 * spent and go on later, with nodes inserted and removed meanwhile: a
 * CANCEL_KEY's. Several at once (up to max_walks), each with its cursor:
 * the next node of the bucket's chain to look at. keyidx_remove() of that
 * node moves it on (at the cost of a look at every walk's cursor while
 * any walk is in progress), and keyidx_insert() links new nodes at the
 * chain's head, behind it, so a walk never sees a node inserted after it
 * began.
 *
 * keyidx_walk_next() returns the walk's next node of (owner, key), having
 * looked at no more than *budget nodes of the chain (each one counted,
 * whoever's it is, and taken off *budget), or CHIME_NIL: the walk is over
 * (keyidx_walk_over()) or the budget is spent. The node it returns may be
 * removed at once. keyidx_walk_end() ends a walk, over or not. Cost: the
 * chain's length in all, in steps of the budget.
 */
void keyidx_walk_begin(struct keyidx *ki, struct keyidx_walk *w, uint16_t owner, uint64_t key);
uint32_t keyidx_walk_next(struct keyidx *ki, struct keyidx_walk *w, unsigned *budget);
void keyidx_walk_end(struct keyidx *ki, struct keyidx_walk *w);

static inline bool keyidx_walk_over(const struct keyidx *ki, const struct keyidx_walk *w)
{
	return ki->cursor[w->at] == CHIME_NIL;
}

#endif /* CHIMED_KEYIDX_H */
