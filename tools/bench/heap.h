/* SPDX-License-Identifier: MIT */
/*
 * heap.h - the baseline chime's wheel is measured against: a binary min-heap
 * of (deadline, id) with a position index per id, so cancel and reset are
 * O(log n) instead of a search. 16 B per heap entry + 4 B per id. It stores
 * no payload: a real timer would add its own (chime's 64 B node includes
 * key, user data, period and links).
 */
#ifndef CHIME_BENCH_HEAP_H
#define CHIME_BENCH_HEAP_H

#include <stddef.h>
#include <stdint.h>

#define HEAP_NONE UINT32_MAX

struct heap_ent {
	uint64_t deadline_ns;
	uint32_t id;
	uint32_t _pad;
};

struct heap {
	struct heap_ent *a;     /* a[0] is the earliest */
	uint32_t *pos;          /* pos[id]: index in a, or HEAP_NONE */
	uint32_t n;
	uint32_t cap;           /* ids are < cap */
};

int heap_init(struct heap *h, uint32_t cap);
void heap_fini(struct heap *h);
/* Bytes the heap uses for `cap` timers. */
size_t heap_bytes(uint32_t cap);

/* O(log n) each. arm: id must not be in the heap; cancel: no-op if absent. */
void heap_arm(struct heap *h, uint32_t id, uint64_t deadline_ns);
void heap_cancel(struct heap *h, uint32_t id);
void heap_reset(struct heap *h, uint32_t id, uint64_t deadline_ns);

/* Pop up to max ids with deadline <= now_ns, earliest first. O(log n) each. */
unsigned heap_pop_due(struct heap *h, uint64_t now_ns, uint32_t *out, unsigned max);

#endif /* CHIME_BENCH_HEAP_H */
