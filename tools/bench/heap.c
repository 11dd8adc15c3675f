/* SPDX-License-Identifier: MIT */
/* heap.c - index-tracking binary min-heap: the baseline for chime-bench wheel. */
#include "heap.h"

#include <stdlib.h>

#include "bench.h"

size_t heap_bytes(uint32_t cap)
{
	return (size_t)cap * (sizeof(struct heap_ent) + sizeof(uint32_t));
}

int heap_init(struct heap *h, uint32_t cap)
{
	h->a = bench_map((size_t)cap * sizeof(*h->a));
	h->pos = bench_map((size_t)cap * sizeof(*h->pos));
	for (uint32_t i = 0; i < cap; i++)
		h->pos[i] = HEAP_NONE;
	h->n = 0;
	h->cap = cap;
	return 0;
}

void heap_fini(struct heap *h)
{
	bench_unmap(h->a, (size_t)h->cap * sizeof(*h->a));
	bench_unmap(h->pos, (size_t)h->cap * sizeof(*h->pos));
}

/* Move the hole at i up until e fits, then place e. */
static void sift_up(struct heap *h, uint32_t i, struct heap_ent e)
{
	while (i > 0) {
		uint32_t p = (i - 1) / 2;

		if (h->a[p].deadline_ns <= e.deadline_ns)
			break;
		h->a[i] = h->a[p];
		h->pos[h->a[i].id] = i;
		i = p;
	}
	h->a[i] = e;
	h->pos[e.id] = i;
}

static void sift_down(struct heap *h, uint32_t i, struct heap_ent e)
{
	uint32_t n = h->n;

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && h->a[c + 1].deadline_ns < h->a[c].deadline_ns)
			c++;
		if (e.deadline_ns <= h->a[c].deadline_ns)
			break;
		h->a[i] = h->a[c];
		h->pos[h->a[i].id] = i;
		i = c;
	}
	h->a[i] = e;
	h->pos[e.id] = i;
}

/* Put e at i (a hole), restoring heap order in whichever direction it needs. */
static void fix(struct heap *h, uint32_t i, struct heap_ent e)
{
	if (i > 0 && h->a[(i - 1) / 2].deadline_ns > e.deadline_ns)
		sift_up(h, i, e);
	else
		sift_down(h, i, e);
}

void heap_arm(struct heap *h, uint32_t id, uint64_t deadline_ns)
{
	sift_up(h, h->n++, (struct heap_ent){ .deadline_ns = deadline_ns, .id = id });
}

void heap_cancel(struct heap *h, uint32_t id)
{
	uint32_t i = h->pos[id];

	if (i == HEAP_NONE)
		return;
	h->pos[id] = HEAP_NONE;
	if (i == --h->n)
		return;
	fix(h, i, h->a[h->n]);
}

void heap_reset(struct heap *h, uint32_t id, uint64_t deadline_ns)
{
	uint32_t i = h->pos[id];

	if (i == HEAP_NONE) {
		heap_arm(h, id, deadline_ns);
		return;
	}
	fix(h, i, (struct heap_ent){ .deadline_ns = deadline_ns, .id = id });
}

unsigned heap_pop_due(struct heap *h, uint64_t now_ns, uint32_t *out, unsigned max)
{
	unsigned k = 0;

	while (k < max && h->n > 0 && h->a[0].deadline_ns <= now_ns) {
		uint32_t id = h->a[0].id;

		out[k++] = id;
		h->pos[id] = HEAP_NONE;
		if (--h->n > 0)
			sift_down(h, 0, h->a[h->n]);
	}
	return k;
}
