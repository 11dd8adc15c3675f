/* SPDX-License-Identifier: MIT */
/*
 * keyidx.c - see keyidx.h.
 *
 * Invariants: a linked node's key_prev is CHIME_NIL iff it is its bucket's
 * head; every node in bucket b hashes to b.
 */
#include "keyidx.h"

#include <assert.h>

void keyidx_init(struct keyidx *ki, uint32_t *heads, uint32_t nbuckets, struct chime_node *nodes,
		 uint64_t seed)
{
	assert(nbuckets && !(nbuckets & (nbuckets - 1)));
	ki->heads = heads;
	ki->nodes = nodes;
	ki->mask = nbuckets - 1;
	ki->seed = seed;
	ki->cursor = CHIME_NIL;
}

uint32_t keyidx_buckets_for(uint32_t capacity)
{
	uint32_t want = capacity / 4, n = 1024;

	while (n < want && n < (UINT32_C(1) << 30))
		n <<= 1;
	return n;
}

void keyidx_insert(struct keyidx *ki, uint32_t idx)
{
	struct chime_node *n = &ki->nodes[idx];
	uint32_t b = keyidx_bucket(ki, n->owner, n->key);
	uint32_t head = ki->heads[b] - 1;   /* 0 - 1 == CHIME_NIL */

	n->key_prev = CHIME_NIL;
	n->key_next = head;
	if (head != CHIME_NIL)
		ki->nodes[head].key_prev = idx;
	ki->heads[b] = idx + 1;
}

void keyidx_walk_begin(struct keyidx *ki, uint16_t owner, uint64_t key)
{
	ki->walk_owner = owner;
	ki->walk_key = key;
	ki->cursor = ki->heads[keyidx_bucket(ki, owner, key)] - 1;  /* 0 - 1 == CHIME_NIL */
}

uint32_t keyidx_walk_next(struct keyidx *ki, unsigned *budget)
{
	while (ki->cursor != CHIME_NIL && *budget > 0) {
		uint32_t i = ki->cursor;
		const struct chime_node *n = &ki->nodes[i];

		(*budget)--;
		ki->cursor = n->key_next;       /* first: i may be removed once returned */
		if (n->owner == ki->walk_owner && n->key == ki->walk_key)
			return i;
	}
	return CHIME_NIL;
}
