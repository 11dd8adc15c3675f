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

static uint32_t match_from(const struct keyidx *ki, uint32_t i, uint16_t owner, uint64_t key)
{
	while (i != CHIME_NIL) {
		const struct chime_node *n = &ki->nodes[i];

		if (n->owner == owner && n->key == key)
			return i;
		i = n->key_next;
	}
	return CHIME_NIL;
}

uint32_t keyidx_first(const struct keyidx *ki, uint16_t owner, uint64_t key)
{
	return match_from(ki, ki->heads[keyidx_bucket(ki, owner, key)] - 1, owner, key);
}

uint32_t keyidx_next(const struct keyidx *ki, uint32_t idx)
{
	const struct chime_node *n = &ki->nodes[idx];

	return match_from(ki, n->key_next, n->owner, n->key);
}
