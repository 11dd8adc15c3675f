/* SPDX-License-Identifier: MIT */
/*
 * wheel.h - a hierarchical, tickless timing wheel over a slab of 64-byte
 * nodes (struct chime_node) in a memory region the caller provides, so it can
 * live in a shard segment. Nodes are named by 32-bit indices, never pointers.
 *
 * The wheel does no I/O, shared-memory setup or threading: it takes now_ns and
 * hands back the timers that are due (like wahern's timeouts_update/get).
 * One thread owns a wheel.
 *
 * Contract:
 * - never early: wheel_advance(now) makes a timer due only if deadline_ns <= now;
 * - exact: every timer with deadline_ns <= now is due after wheel_advance(now)
 *   (a deadline in the past is due at the next advance; any uint64_t deadline
 *   works, the levels cover the whole range);
 * - O(1) arm, cancel and reset;
 * - wheel_next_deadline() is at most one resolution unit after the earliest
 *   deadline, so a caller that sleeps until it is late by at most one unit.
 */
#ifndef CHIME_WHEEL_H
#define CHIME_WHEEL_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chime_shm.h"

/*
 * The preconditions of arm, cancel and reset that every caller checks
 * before the call (the broker's lookup() and op_arm(): an index below the
 * high-water mark, a node in use): asserted in sanitizer builds only. In
 * the others their loads and compares were 5-7% of a cancel at 1M timers
 * (the wheel against wahern/timeout, side by side: 1.10x its time with
 * the check, 1.03x without).
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WHEEL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WHEEL_SANITIZED 1
#endif
#endif
#ifdef WHEEL_SANITIZED
#define wheel_hot_assert(x) assert(x)
#else
#define wheel_hot_assert(x) ((void)0)
#endif

/* wheel_pop_expired() below; the table size before struct wheel needs it */
#define WHEEL_JUMP_OWNERS 1024u
/* levels of 64-bit words that index 2^32 nodes: 64^6 > 2^32 */
#define WHEEL_FREE_LEVELS 6u

/*
 * Private handle: the shared state and the slab, resolved once, plus what
 * is derived from the shared state and kept out of shared memory (rebuilt by
 * wheel_init() and wheel_rebuild()).
 */
struct wheel {
	struct chime_wheel *w;
	struct chime_node *nodes;
	/* tick = ns / resolution_ns without a divide: a shift, or libdivide's
	 * branch-free multiply-shift when div_magic != 0 */
	uint64_t div_magic;
	uint32_t div_shift;
	/* nodes [0, reserved) have storage reserved on the filesystem (the
	 * shard grows it ahead of high_water); wheel_alloc() never goes beyond */
	uint32_t reserved;
	/* generation a node gets when first used: random per broker run, so
	 * ids are not guessable from one run to the next (0 in tests) */
	uint32_t gen_base;
	/* the highest high_water a wheel_shrink() lowered: an id of a node
	 * from there down to high_water is a given-back node's, stale */
	uint32_t shrunk_from;
	/* wheel_stage_at() asks for no wake-up below this many timers
	 * (WHEEL_STAGE_WAKE_TIMERS; tests lower it) */
	uint32_t stage_wake_min;
	/* timers ARMED or EXPIRED: private, beside the handle's other hot
	 * fields, not in the shared header one pointer further */
	uint64_t armed;
	uint64_t max_tick;      /* tick of UINT64_MAX ns */
	/* lower bound of the deadlines in the current tick's level-0 slot:
	 * lets an advance inside one tick skip rescanning it */
	uint64_t cur_min_ns;
	/* the expired list's front: the last of the timers that went ahead of
	 * a backlog (CHIME_NIL: none), and how many more this advance may put
	 * there (wheel_pop_expired()) */
	uint32_t fresh_tail;
	uint32_t jump_left;
	bool jump_on;           /* the tick being made due may go there */
	uint64_t due_n;         /* due timers on the expired list, the front's included */
	uint64_t front_n;       /* timers in the front */
	/* due timers by owner (client slot) modulo WHEEL_JUMP_OWNERS: who may jump */
	uint32_t owner_due[WHEEL_JUMP_OWNERS];
	/* timers in the front by owners' group (wheel_group_owners()), modulo
	 * WHEEL_JUMP_OWNERS too; the group of owner o: group_of[o] (NULL: o) */
	uint32_t group_front[WHEEL_JUMP_OWNERS];
	const uint16_t *group_of;
	/* WHEEL_JUMP_BACKLOG, _MAX, _OWNER and _GROUP, set by init and
	 * rebuild; tests lower them to make backlogs and jumps common */
	uint32_t jump_backlog, jump_max, jump_owner, jump_group;
	/* tail of each slot list: a cascade walks a list from both ends at once,
	 * two independent chains of cache misses instead of one */
	uint32_t tail[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	/* a lower bound of the deadlines in each slot (I7): an advance that
	 * cascades a slot first moves now_tick up to it, so timers due at one
	 * instant fire from the slot they are in instead of passing through
	 * every lower level first */
	uint64_t slot_min[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	/* an upper bound of the deadlines in each slot (kept on level 0:
	 * raised by every insert, UINT64_MAX once a lazy reset raised one,
	 * reset when the slot empties whole): a slot all due goes over whole
	 * (raw, below) */
	uint64_t slot_max[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	/*
	 * A level-0 slot made due whole becomes this list as it is, its nodes
	 * still ARMED ("raw"), marked one by one as they are popped after the
	 * expired list's due ones: a million timers due at one instant go out
	 * from the first pop instead of after a walk over all of them.
	 */
	uint32_t raw_head, raw_tail;
	/*
	 * Staging (wheel_stage()): the next cascade, done ahead of time. Its
	 * slot is (stage_level, stage_slot), starting at tick stage_base; the
	 * nodes taken from it so far wait in these lists of the levels below,
	 * placed where the cascade would put them, and become the wheel's own
	 * lists (empty by then) in one O(levels x slots) step when the advance
	 * reaches the slot. Private: a rebuild re-places every node anyway.
	 */
	bool staging;
	uint8_t stage_level, stage_slot;
	uint64_t stage_base;
	uint64_t st_occupied[CHIME_WHEEL_LEVELS];
	uint32_t st_head[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	uint32_t st_tail[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	uint64_t st_min[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	uint64_t st_max[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];
	/*
	 * The free nodes below high_water, lowest first (wheel_alloc()): bit i
	 * of free_bits[0] is node i, bit j of free_bits[l] says word j of
	 * free_bits[l - 1] is non-zero; the top level is one word. Private
	 * (NORESERVE anonymous memory, wheel_fini()), rebuilt from the nodes.
	 */
	uint64_t *free_bits[WHEEL_FREE_LEVELS];
	unsigned free_levels;
	size_t free_len;
};

/* Bytes of region wheel_init() needs for `capacity` nodes. */
size_t wheel_region_size(uint32_t capacity);

/*
 * Lay a fresh wheel over [mem, mem + len): header, then `capacity` nodes, all
 * free. resolution_ns > 0; now_ns is the wheel's starting time.
 * -EINVAL on a bad argument or a region too small, -ENOMEM if the handle's
 * private memory cannot be had. Pages of the slab are not touched until
 * nodes are first allocated. wheel_fini() releases the handle, before
 * it is initialised or rebuilt again.
 */
int wheel_init(struct wheel *wh, void *mem, size_t len, uint32_t capacity,
	       uint64_t resolution_ns, uint64_t now_ns);

/* Release the private memory of a handle wheel_init() or wheel_rebuild() set up (the region stays). */
void wheel_fini(struct wheel *wh);

/* Zeroed bitmap memory over the nodes, never the zero page (wheel.c says why); NULL if none. */
void *wheel_bits_map(size_t len);
void wheel_bits_unmap(void *bits, size_t len);

/* What wheel_rebuild() found. */
struct wheel_rebuild_stats {
	uint32_t dropped;       /* nodes in no known state, or with a bad generation: freed */
	uint32_t due;           /* ARMED or EXPIRED nodes already due at now_ns */
};

/*
 * Re-attach to a wheel an earlier broker left in [mem, mem + len) and
 * rebuild every derived structure (slot lists, occupancy bits, expired
 * list, free map, counters) from the nodes alone. The region may have been
 * scribbled on, so nothing in it is trusted unchecked:
 * - the geometry must be the caller's own (capacity, resolution_ns), the
 *   slab where this code puts it and high_water <= capacity, else -EINVAL;
 * - the clock is the caller's now_ns, never the header's: a scribbled clock
 *   must not fire anything early;
 * - links are never followed, only rewritten;
 * - a node in no CHIME_NODE_* state, or not FREE with a generation outside
 *   CHIME_ID_GEN_MASK (plus CHIME_NODE_FLAGS), is freed and counted in
 *   st->dropped.
 * ARMED and EXPIRED nodes are re-armed at their deadline (one already due
 * fires at the next advance, late, never lost); FREE nodes are freed; the
 * broker's own states (ALLOC, GRANTED, BACKLOG, ACKWAIT) are left as they
 * are, links included, for the caller to judge. st may be NULL. -ENOMEM
 * if the handle's private memory cannot be had.
 */
int wheel_rebuild(struct wheel *wh, void *mem, size_t len, uint32_t capacity,
		  uint64_t resolution_ns, uint64_t now_ns, struct wheel_rebuild_stats *st);

static inline struct chime_node *wheel_node(const struct wheel *wh, uint32_t idx)
{
	return &wh->nodes[idx];
}

/*
 * Take the lowest free node (so that timers armed together lie together
 * in the slab, however long the broker has run): state ALLOC, gen bumped (never 0 within
 * CHIME_ID_GEN_MASK), every other field zeroed, cq_pos = CHIME_POS_NONE.
 * Returns its index, or CHIME_NIL if the slab is full (or its reserved part:
 * wh->reserved, set by the caller; capacity after init and rebuild).
 */
uint32_t wheel_alloc(struct wheel *wh);

/* The lowest free node below high_water (the next wheel_alloc()'s), CHIME_NIL if none. */
uint32_t wheel_lowest_free(const struct wheel *wh);

/*
 * One past the highest node in use (not FREE), 0 if none: the nodes from
 * there to high_water are free, and may be given back (wheel_shrink()).
 * O(those nodes / 64).
 */
uint32_t wheel_slab_end(const struct wheel *wh);

/*
 * Give back the free nodes [end, high_water), end >= wheel_slab_end(): out
 * of the free map, and high_water lowered to end. Their storage is the
 * caller's to release, and wh->reserved to lower. wheel_alloc() grows into
 * them again as into new nodes, their generations from gen_base: the
 * caller draws a new one, since gen_base + 1 was the first generation of
 * each, and an id of it may still be held (a client cancelling a timer
 * that fired). O(high_water - end).
 */
void wheel_shrink(struct wheel *wh, uint32_t end);

/* Return a node in state ALLOC (or any broker state) to the free nodes. */
void wheel_free(struct wheel *wh, uint32_t idx);

/*
 * Arm a node that is on no wheel list (ALLOC or a broker state) at deadline_ns.
 * A deadline at or before the last advance's now_ns puts the node straight on
 * the expired list (state EXPIRED), poppable after the next wheel_advance().
 */
void wheel_arm(struct wheel *wh, uint32_t idx, uint64_t deadline_ns);

/*
 * Take an ARMED or EXPIRED node off its list; it becomes ALLOC. No-op in any
 * other state. The node's next/prev links are left stale, not reset to
 * CHIME_NIL: every list that takes the node next (a slot, the expired
 * list, the broker's backlog and ackwait lists) writes both (a free node
 * is on no list), and on a
 * wheel larger than the cache one store fewer per cancel is measurable
 * (stores wait in the store queue behind the neighbours' misses).
 */
void wheel__cancel_slow(struct wheel *wh, uint32_t idx);

static inline void wheel_cancel(struct wheel *wh, uint32_t idx)
{
	struct chime_node *nodes = wh->nodes, *n;
	uint32_t next, prev;

	wheel_hot_assert(idx < wh->w->high_water);
	n = &nodes[idx];
	next = n->next;
	prev = n->prev;
	/*
	 * Inline, the common case (ARMED, inside its list) is two neighbour
	 * stores, the state and the count: no call, so no return address
	 * stored either. On a slab larger than the cache each cancel waits on
	 * three misses and the stores queue behind them; fewer stores per
	 * cancel, more cancels overlap. Ends of lists, the expired list and
	 * no list at all go out of line.
	 */
	if (n->state != CHIME_NODE_ARMED || next == CHIME_NIL || prev == CHIME_NIL) {
		wheel__cancel_slow(wh, idx);
		return;
	}
	nodes[next].prev = prev;
	nodes[prev].next = next;
	n->state = CHIME_NODE_ALLOC;
	wh->armed--;
}

/*
 * wheel_free() for a node known to be on no wheel list (ALLOC or a broker
 * state: it was popped, or taken off with wheel_cancel()): the free mark
 * alone, inline. The broker frees every consumed one-shot this way;
 * wheel_free()'s call and its wheel_cancel() (a no-op there, but out of
 * line for any state but ARMED) cost ~30 instructions per event.
 */
/* Mark node idx free (wheel_alloc()'s map): its word, and the words above that were empty. */
static inline void wheel__free_mark(struct wheel *wh, uint64_t idx)
{
	for (unsigned l = 0; l < wh->free_levels; l++, idx /= 64) {
		uint64_t *word = &wh->free_bits[l][idx / 64], was = *word;

		*word = was | UINT64_C(1) << (idx % 64);
		if (was)
			break;
	}
}

static inline void wheel_free_unlisted(struct wheel *wh, uint32_t idx)
{
	struct chime_node *n = &wh->nodes[idx];

	assert(idx < wh->w->high_water && n->state != CHIME_NODE_FREE &&
	       n->state != CHIME_NODE_ARMED && n->state != CHIME_NODE_EXPIRED);
	n->state = CHIME_NODE_FREE;
	wheel__free_mark(wh, idx);
}

/*
 * Move an ARMED or EXPIRED node to a new deadline (the keepalive "touch"). O(1).
 * On a node on no wheel list it is wheel_arm(). An ARMED node reset to a
 * later deadline only stores it and stays in its slot (lazy reset); the
 * advance that reaches that slot files it again. Only the wheel reads slots:
 * the stored deadline is always the timer's.
 */
void wheel_reset(struct wheel *wh, uint32_t idx, uint64_t deadline_ns);

/*
 * Re-arm a periodic node from its deadline, not from now: deadline_ns +=
 * period_ns (saturating). If that is already past, it is due at the next
 * advance (every period fires; none is skipped: one period per advance).
 * The node may be in any state but FREE; period_ns must be > 0.
 */
void wheel_rearm_periodic(struct wheel *wh, uint32_t idx);

/*
 * Advance to now_ns (which never goes backwards; an earlier value is treated
 * as the last one) and make every timer with deadline_ns <= now_ns poppable
 * (wheel_pop_expired()), none other. Cost: O(cascaded timers) plus O(levels)
 * per non-empty slot processed, independent of the time elapsed; a level-0
 * slot that is all due goes over whole in O(1), its timers judged as they
 * are popped; else a scan of that tick's timers (when now_ns falls inside a
 * tick holding later ones too, skipped while now_ns is below their known
 * minimum; and behind a backlog, where each timer's owner decides its place).
 */
void wheel_advance(struct wheel *wh, uint64_t now_ns);

/*
 * Whether node idx is due (poppable now, or at the next advance if it was
 * armed in the past): EXPIRED, or ARMED on the raw list (an ARMED node on
 * a slot list is never at or before now_ns, I1). For tests and checks.
 */
static inline bool wheel_node_due(const struct wheel *wh, uint32_t idx)
{
	const struct chime_node *n = &wh->nodes[idx];

	return n->state == CHIME_NODE_EXPIRED || (n->state == CHIME_NODE_ARMED && n->deadline_ns <= wh->w->now_ns);
}

/*
 * How many timers are poppable now: O(timers on the expired list). For
 * tests and checks (wheel_advance() no longer counts what it makes due: a
 * slot made due whole is not walked).
 */
uint64_t wheel_due(const struct wheel *wh);

/*
 * Do part of the next cascade now, while the caller has nothing else to do:
 * move up to `budget` nodes of the next slot to cascade, of the highest
 * level whose next slot starts within 4095 ticks (409.5 ms at 100 us), to
 * where its cascade will put them. The advance that reaches the slot then
 * cascades only what is left, instead of every timer of a span at once: a
 * level-3 slot (26 s at 100 us) can hold most of a million 30-second
 * timers, and moving them all in one advance held every due timer back for
 * tens of milliseconds. Returns how many nodes it moved (0: nothing to
 * stage). Never fires, never changes a deadline; the contract above holds
 * with or without it.
 */
unsigned wheel_stage(struct wheel *wh, unsigned budget);

/*
 * When wheel_stage() next has work that is worth waking for: the start of
 * the tick from which the next slot of level 2 or above is within its
 * horizon (now_ns if already; UINT64_MAX if none, or while a staged slot
 * waits, moved whole, for the advance to reach it; and none while the
 * wheel holds fewer than WHEEL_STAGE_WAKE_TIMERS timers: no slot can then
 * hold enough for its walk to matter). A caller that sleeps
 * until the earlier of this and wheel_next_deadline(), and stages while
 * awake, moves a big cascade in its idle time before the slot starts,
 * instead of holding back the timers due when it starts. O(levels).
 */
#define WHEEL_STAGE_WAKE_TIMERS 4096u
uint64_t wheel_stage_at(const struct wheel *wh);

/*
 * Pop up to `max` due timers into `out` (they become ALLOC). Returns how many.
 * Order: the order they became due. One advance makes timers due in deadline
 * tick order (floor(deadline_ns / resolution_ns)), within one tick in no
 * particular order, after the timers armed in the past before that advance
 * (in arming order). Except behind a backlog: while WHEEL_JUMP_BACKLOG or
 * more due timers wait to be popped (a million due at one instant take
 * tens of milliseconds to deliver), up to WHEEL_JUMP_MAX timers an advance
 * makes due for later ticks than theirs go ahead of them, in the order
 * they became due, after those that went ahead before: one client's burst
 * does not hold back the timers of everyone else that come due after it.
 * Only timers whose owner (chime_node.owner) has fewer than
 * WHEEL_JUMP_OWNER due go ahead: a client's own timers stay behind its own
 * burst, and a client that keeps a backlog up (a flood of short periodic
 * timers) cannot take the places ahead of it from the others. Owners are
 * counted modulo WHEEL_JUMP_OWNERS: beyond that many clients, two may share
 * a count. And only while their owner's group (wheel_group_owners(): the
 * shard's are users) holds fewer than WHEEL_JUMP_GROUP places there: many
 * clients of one user, each with few due, cannot together take all the
 * places an advance has. A caller that pops more than WHEEL_JUMP_MAX
 * between advances still moves the backlog on.
 */
#define WHEEL_JUMP_BACKLOG 4096u        /* a shard's FIRE_BUDGET: more than one pass pops */
#define WHEEL_JUMP_MAX     1024u
#define WHEEL_JUMP_OWNER   256u
#define WHEEL_JUMP_GROUP   256u
unsigned wheel_pop_expired(struct wheel *wh, uint32_t *out, unsigned max);

/*
 * Owners in groups for wheel_pop_expired()'s WHEEL_JUMP_GROUP: owner o is
 * in group_of[o] (NULL, as after wheel_init() and wheel_rebuild(): each
 * owner its own group). The table is the caller's; an owner's entry may
 * change only while it has no timer in the wheel.
 */
void wheel_group_owners(struct wheel *wh, const uint16_t *group_of);

/*
 * The time the caller should next call wheel_advance(): CHIME's tickless
 * sleep. UINT64_MAX if nothing is armed; now_ns or earlier if timers are
 * already due. Never more than one resolution unit after the earliest armed
 * deadline, and advancing to it always makes progress (fires or cascades).
 */
uint64_t wheel_next_deadline(const struct wheel *wh);

/*
 * The earliest armed deadline, exact: what `chimestat` shows as "next"
 * (wheel_next_deadline() is when to wake, the end of a tick). UINT64_MAX if
 * nothing is armed; a deadline <= the last advance's now if timers are due.
 * Cost: O(levels) plus a walk of the earliest non-empty slots in order, at
 * most max_scan nodes in all (each a cache miss on a large wheel): the
 * earliest slot alone unless a lazily reset timer (wheel_reset() to a later
 * deadline) waits in it, then on until a slot starts after the minimum
 * found. If max_scan runs out it returns the first nanosecond of the slot
 * being read, a lower bound, and sets *inexact. For the counters and the
 * shard's sleep: not the hot path.
 */
uint64_t wheel_earliest(const struct wheel *wh, uint32_t max_scan, int *inexact);

/* Timers in state ARMED or EXPIRED. */
static inline uint64_t wheel_armed(const struct wheel *wh)
{
	return wh->armed;
}

/*
 * Check every internal invariant (slot lists consistent with occupancy bits
 * and node levels, counts, free map); abort()s with a message on the first
 * violation. O(capacity): for tests.
 */
void wheel_check(const struct wheel *wh);

#endif /* CHIME_WHEEL_H */
