/* SPDX-License-Identifier: MIT */
/*
 * keyidx.c - see keyidx.h.
 *
 * Invariants: a linked node's key_prev is CHIME_NIL iff it is its bucket's
 * head; every node in bucket b hashes to b.
 */
#include "keyidx.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

void keyidx_init(struct keyidx *ki, uint32_t *heads, uint32_t nbuckets, struct chime_node *nodes,
		 uint64_t seed)
{
	assert(nbuckets && !(nbuckets & (nbuckets - 1)));
	ki->heads = heads;
	ki->nodes = nodes;
	ki->mask = nbuckets - 1;
	ki->seed = seed;
	ki->nr_walks = 0;
}

int keyidx_walks_init(struct keyidx *ki, uint32_t max_walks)
{
	ki->cursor = calloc(max_walks, sizeof(*ki->cursor));
	ki->walk = calloc(max_walks, sizeof(*ki->walk));
	ki->nr_walks = 0;
	ki->max_walks = max_walks;
	if (!ki->cursor || !ki->walk) {
		keyidx_walks_fini(ki);
		return -ENOMEM;
	}
	return 0;
}

void keyidx_walks_fini(struct keyidx *ki)
{
	free(ki->cursor);
	free(ki->walk);
	ki->cursor = NULL;
	ki->walk = NULL;
	ki->nr_walks = ki->max_walks = 0;
}

void keyidx_walks_skip(struct keyidx *ki, uint32_t idx, uint32_t next)
{
	for (uint32_t i = 0; i < ki->nr_walks; i++)
		if (ki->cursor[i] == idx)
			ki->cursor[i] = next;
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

void keyidx_walk_begin(struct keyidx *ki, struct keyidx_walk *w, uint16_t owner, uint64_t key)
{
	assert(ki->nr_walks < ki->max_walks);
	w->owner = owner;
	w->key = key;
	w->at = ki->nr_walks++;
	ki->walk[w->at] = w;
	ki->cursor[w->at] = ki->heads[keyidx_bucket(ki, owner, key)] - 1;  /* 0 - 1 == CHIME_NIL */
}

uint32_t keyidx_walk_next(struct keyidx *ki, struct keyidx_walk *w, unsigned *budget)
{
	uint32_t *cursor = &ki->cursor[w->at];

	while (*cursor != CHIME_NIL && *budget > 0) {
		uint32_t i = *cursor;
		const struct chime_node *n = &ki->nodes[i];

		(*budget)--;
		*cursor = n->key_next;          /* first: i may be removed once returned */
		if (n->owner == w->owner && n->key == w->key)
			return i;
	}
	return CHIME_NIL;
}

void keyidx_walk_end(struct keyidx *ki, struct keyidx_walk *w)
{
	uint32_t last = --ki->nr_walks;

	/* The last one takes its place: the array stays packed. */
	ki->cursor[w->at] = ki->cursor[last];
	ki->walk[w->at] = ki->walk[last];
	ki->walk[w->at]->at = w->at;
}
