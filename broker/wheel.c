/* SPDX-License-Identifier: MIT */
/*
 * wheel.c - hierarchical, tickless timing wheel over a slab of 64-byte nodes.
 *
 * Region: struct chime_wheel, then `capacity` struct chime_node. Everything
 * is named by 32-bit index (CHIME_NIL = none): the region lives in shared
 * memory mapped at a different address in every reader.
 *
 * Time is cut into ticks of resolution_ns: t = floor(ns / resolution_ns).
 * T = now_tick, the tick of the last advance (now_ns).
 *
 * Levels and slots (6 bits per level, 11 levels: every uint64 tick fits).
 * An ARMED node with tick t lives at
 *
 *	level L = highest 6-bit digit where t and T differ (0 if t == T)
 *	        = fls(t ^ T) / 6
 *	slot  s = digit L of t = (t >> 6L) & 63
 *
 * so its slot follows from its deadline and node.level (unless it was reset
 * lazily, below): unlink is O(1) and needs the slot only when the node is
 * the first or last of its list. This is tokio's
 * placement (level_for(): the highest differing digit of t ^ T); wahern's
 * timeout.c places by distance instead (fls(t - T)), which puts a timer
 * due just across a digit boundary on a higher level. Because t > T (or t == T at level 0), t and T share
 * every digit above L and digit L of t is above T's: occupied slots of level
 * L > 0 are all strictly after T's own digit, those of level 0 at or after
 * it, and every slot of level L starts before every slot of level L + 1.
 * The earliest pending slot is therefore the lowest set bit of the lowest
 * non-empty level: no rotation, no scan.
 *
 * Lazy reset: wheel_reset() to a later deadline (a keepalive touch) only
 * stores the deadline and leaves the node in its slot, which starts no later
 * than the new tick (on level 0 it also marks the slot's maximum unknown,
 * I7, so that the slot is walked, not taken whole, when it comes due). Whoever processes that slot (fire_slot(),
 * fire_slot_partial(), cascade_one()) compares each deadline with the slot
 * and re-places the nodes that are not due, as a cascade does. So a slot
 * holds nodes of its own ticks and lazily reset later ones: a slot's first
 * tick is a lower bound of its deadlines, not the range, and unlinking the
 * first or last node of a list may have to find its slot among the level's
 * 64 (end_slot()). wheel_next_deadline() may then be earlier than needed
 * (still never late, and the advance processes that slot: progress);
 * wheel_earliest() walks slots in order until one starts after the minimum
 * found.
 *
 * Invariants (wheel_check() verifies all of them):
 *  I1 ARMED <=> on a slot list, or on the raw list; on a slot list, its
 *     level and slot are as above for the current T, or (lazily reset) a
 *     slot of that level starting earlier but ahead of T, and
 *     deadline_ns > now_ns. The raw list (wh->raw_head, private) is a level-0
 *     slot the advance made due whole, its nodes still ARMED, level 0, all
 *     due: popped after the expired list's due nodes, each marked as it is
 *     popped, or all marked into the expired list (raw_flush()) before
 *     anything else is made due or now_tick moves past their tick. That
 *     is "exact": every timer at or before now_ns is EXPIRED or raw.
 *  I2 occupied[L] bit s <=> slot[L][s] != CHIME_NIL; wh->tail[L][s] (private
 *     memory) is the list's last node. Slot lists are doubly linked, not
 *     circular: an insert touches only the old head, and only unlinking a
 *     list's first or last node needs its slot (one tick computation).
 *  I3 EXPIRED <=> on the expired list, and deadline_ns <= now_ns. The list is
 *     [front...][due...][pending...]: level 2 = in the front (due, gone
 *     ahead of a backlog; wh->fresh_tail is its last), level 0 = due
 *     (poppable), level 1 = pending (armed with a past deadline since the
 *     last advance; wheel_advance() makes them due, so a periodic timer that
 *     is behind fires once per advance). wh->due_n counts the front and due
 *     nodes, wh->front_n the front's, wh->owner_due[o] those of the owners
 *     o modulo WHEEL_JUMP_OWNERS, wh->group_front[g] the front's of the
 *     groups g modulo WHEEL_JUMP_OWNERS.
 *  I4 FREE <=> its bit set in the free map (wh->free_bits), index <
 *     high_water; each upper level's bit set <=> the word below non-zero. Nodes at or beyond
 *     high_water are not in use: never touched (the slab costs no RSS until used), or
 *     given back (wheel_shrink()) and grown into again as new ones.
 *  I5 armed == number of ARMED + EXPIRED nodes.
 *  I6 every deadline in the level-0 slot of tick T is >= cur_min_ns.
 *  I7 every deadline in slot [L][s] is >= wh->slot_min[L][s] (private): a
 *     lower bound, lowered by every insert, never raised while the slot is
 *     occupied (removals and lazy resets leave it low), reset when the slot
 *     is emptied whole. On level 0, every deadline is also <=
 *     wh->slot_max[0][s], raised by every insert, UINT64_MAX (unknown)
 *     once a lazy reset raised one there, 0 when the slot is emptied
 *     whole: a slot with a known maximum at or before now is taken whole
 *     (raw) instead of walked.
 *  I8 staging (wheel_stage()): while wh->staging, slot (stage_level,
 *     stage_slot) starts at tick stage_base and stays occupied even if its
 *     own list is empty; the staged lists hold levels below stage_level
 *     only, each node placed as I1 says relative to stage_base instead of
 *     T (a node's level and deadline still give its slot, so unlinking one
 *     checks which set's list it ends); otherwise the staged lists are
 *     empty. An ARMED node is on exactly one list of either set.
 *
 * Never fire early: a node is made due only where `deadline_ns <= now` is
 * compared (fire_slot_partial(), cascade_slot() for tick == now_tick,
 * wheel_arm()) or where its whole tick is before now's tick (then every
 * deadline in it is < now). Rounding to ticks happens only in choosing where
 * a node waits, and in wheel_next_deadline(), which rounds UP to the end of a
 * tick: at most resolution_ns - 1 late, never early.
 *
 * Staging: cascading a slot walks every node in it, and a slot of a high
 * level holds the timers of a long span: a million 30-second timers put
 * most of themselves in one level-3 slot (26 s at 100 us), and its cascade
 * took 20 ms on this VM, during which nothing due fired. So an idle caller
 * moves such a slot's nodes ahead of time, a few at a time (wheel_stage()),
 * into a second set of lists placed relative to the slot's first tick;
 * when the advance reaches the slot, every level below it is empty, and
 * the staged lists become the wheel's own in O(levels x slots) without
 * touching a node. Only the cascade's timing changes, never a node's
 * deadline or when it fires.
 *
 * Advance to now (tick T'): repeat { find the earliest pending slot (lowest
 * non-empty level, lowest set bit); its first tick e; if e > T' stop; move T
 * to e; a level-0 slot fires (all of it if e < T', else only deadlines <= now);
 * a higher slot cascades: each node is re-placed relative to e, landing
 * strictly lower, or fires if its tick is e; in either, a lazily reset node
 * of a later tick is re-placed relative to e }. Stepping from one occupied slot
 * to the next, never tick by tick, makes the cost independent of the time
 * elapsed (a broker that slept for hours), and fires timers in tick order.
 *
 * Costs (n = nodes, honest):
 *  arm, cancel, reset, alloc, free: O(1); one tick computation (a multiply
 *     and shifts, or a shift), touch the node and its list neighbours; a
 *     reset to a later deadline touches only the node; unlinking a lazily
 *     reset node at an end of its list scans up to 64 slot ends.
 *  advance: O(cascaded + due node by node) node visits (a level-0 slot all
 *     due goes over in O(1), marked as it is popped), each node cascading at most once
 *     per level (<= 10 times in its life, ~2-3 for deadlines minutes away at
 *     1 ms resolution), plus O(levels) bitmap work per non-empty slot reached;
 *     on a wheel larger than the cache each visit is a miss, so a cascade
 *     walks its list from both ends (two misses in flight);
 *     plus a scan of the current tick's slot when now falls inside a tick that
 *     holds later timers (O(timers in that tick), skipped while now <
 *     cur_min_ns). Never O(ticks elapsed).
 *  pop: O(popped). next_deadline: O(levels). earliest: O(levels + the
 *     timers of the earliest slot, and of the next ones while lazily reset
 *     timers leave the minimum beyond their start; at most max_scan). check: O(capacity). rebuild:
 *     O(high_water).
 * A timer far away wakes a tickless sleeper up to once per level on its way
 * down (each wake-up cascades it): wheel_next_deadline() reads bitmaps only,
 * it does not know the minimum inside a coarse slot.
 */
#include "wheel.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BITS   CHIME_WHEEL_BITS
#define SLOTS  CHIME_WHEEL_SLOTS
#define LEVELS CHIME_WHEEL_LEVELS
#define NIL    CHIME_NIL

/* node.level of an EXPIRED node: where it sits in the expired list (I3) */
#define EXP_DUE     0u
#define EXP_PENDING 1u
#define EXP_FRONT   2u  /* due, in the front: ahead of a backlog (wheel_pop_expired()) */

__extension__ typedef unsigned __int128 u128;

static inline uint64_t tick_of(const struct wheel *wh, uint64_t ns)
{
	uint64_t q;

	/* predictable branch: the resolution never changes */
	if (wh->div_magic == 0)
		return ns >> wh->div_shift;
	/* libdivide's branch-free u64 divide: q = mulhi(n, m); (q + (n - q) / 2) >> s */
	q = (uint64_t)(((u128)ns * wh->div_magic) >> 64);
	return (((ns - q) >> 1) + q) >> wh->div_shift;
}

/* Level of tick t relative to now_tick T: fls(t ^ T) / 6, 0 when t == T. */
static inline unsigned level_of(uint64_t t, uint64_t T)
{
	return (unsigned)(63 - __builtin_clzll((t ^ T) | 1)) / BITS;
}

static inline unsigned slot_of(uint64_t t, unsigned level)
{
	return (unsigned)(t >> (level * BITS)) & (SLOTS - 1);
}

/* First tick of slot s of `level`, in the group of ticks T lies in. */
static inline uint64_t slot_base(uint64_t T, unsigned level, unsigned s)
{
	unsigned hi = (level + 1) * BITS;
	uint64_t group = hi >= 64 ? 0 : T & ~((UINT64_C(1) << hi) - 1);

	return group | ((uint64_t)s << (level * BITS));
}

/* Last ns of tick t (saturating): the wake-up time that covers all of it. */
static inline uint64_t tick_end_ns(const struct wheel *wh, uint64_t t)
{
	if (t >= wh->max_tick)
		return UINT64_MAX;
	return (t + 1) * wh->w->resolution_ns - 1;
}

static void div_init(struct wheel *wh, uint64_t d)
{
	unsigned lg = 63u - (unsigned)__builtin_clzll(d);
	uint64_t m, rem, twice;

	if ((d & (d - 1)) == 0) {
		wh->div_magic = 0;
		wh->div_shift = lg;
		return;
	}
	/* libdivide_u64_branchfree_gen(): m = 2^64 + ceil-ish(2^(64+lg) / d) */
	m = (uint64_t)(((u128)1 << (64 + lg)) / d);
	rem = (uint64_t)(((u128)1 << (64 + lg)) % d);
	m += m;
	twice = rem + rem;
	if (twice >= d || twice < rem)
		m += 1;
	wh->div_magic = m + 1;
	wh->div_shift = lg;
}

static void handle_init(struct wheel *wh, void *mem)
{
	struct chime_wheel *w = mem;

	wh->w = w;
	wh->nodes = (struct chime_node *)((char *)mem + w->slab_off);
	div_init(wh, w->resolution_ns);
	wh->max_tick = tick_of(wh, UINT64_MAX);
	wh->cur_min_ns = 0;
	wh->reserved = w->capacity;     /* the caller lowers it if it reserves storage in steps */
	wh->gen_base = 0;
	/* kept in the file: an id the last broker gave back is still stale to the next, not malformed */
	wh->shrunk_from = w->shrunk_from < w->capacity ? w->shrunk_from : w->capacity;
	wh->stage_wake_min = WHEEL_STAGE_WAKE_TIMERS;
	wh->jump_backlog = WHEEL_JUMP_BACKLOG;
	wh->jump_max = WHEEL_JUMP_MAX;
	wh->jump_owner = WHEEL_JUMP_OWNER;
	wh->jump_group = WHEEL_JUMP_GROUP;
	wh->group_of = NULL;
}

size_t wheel_region_size(uint32_t capacity)
{
	return sizeof(struct chime_wheel) + (size_t)capacity * sizeof(struct chime_node);
}

/* Empty the lists of levels [0, levels) of one set. */
static void lists_clear(uint64_t *occupied, uint32_t (*head)[SLOTS], uint32_t (*tail)[SLOTS],
			uint64_t (*min)[SLOTS], uint64_t (*max)[SLOTS], unsigned levels)
{
	for (unsigned l = 0; l < levels; l++) {
		occupied[l] = 0;
		for (unsigned s = 0; s < SLOTS; s++) {
			head[l][s] = NIL;
			tail[l][s] = NIL;
			min[l][s] = UINT64_MAX;
			max[l][s] = 0;
		}
	}
}

/* No staging under way: the staged lists empty (those of `levels` and up are). */
static void stage_clear(struct wheel *wh, unsigned levels)
{
	wh->staging = false;
	wh->stage_level = wh->stage_slot = 0;
	wh->stage_base = 0;
	lists_clear(wh->st_occupied, wh->st_head, wh->st_tail, wh->st_min, wh->st_max, levels);
}

static void clear_lists(struct wheel *wh, struct chime_wheel *w)
{
	lists_clear(w->occupied, w->slot, wh->tail, wh->slot_min, wh->slot_max, LEVELS);
	w->expired_head = NIL;
	w->expired_tail = NIL;
	wh->raw_head = wh->raw_tail = NIL;
	wh->fresh_tail = NIL;
	wh->jump_left = 0;
	wh->jump_on = false;
	wh->due_n = wh->front_n = 0;
	memset(wh->owner_due, 0, sizeof(wh->owner_due));
	memset(wh->group_front, 0, sizeof(wh->group_front));
	w->free_head = NIL;     /* unused: the free map (I4) is private */
	w->armed = 0;           /* unused: the count is private (wheel_armed()) */
	wh->armed = 0;
	stage_clear(wh, LEVELS);
}

static int free_map(struct wheel *wh, uint32_t capacity);

int wheel_init(struct wheel *wh, void *mem, size_t len, uint32_t capacity,
	       uint64_t resolution_ns, uint64_t now_ns)
{
	struct chime_wheel *w = mem;

	if (!wh || !mem || (uintptr_t)mem % CHIME_CACHELINE || capacity == 0 ||
	    capacity == NIL || resolution_ns == 0 || len < wheel_region_size(capacity))
		return -EINVAL;
	if (free_map(wh, capacity) < 0)
		return -ENOMEM;
	/* header only: the slab's pages stay untouched until wheel_alloc() */
	*w = (struct chime_wheel){ 0 };
	w->resolution_ns = resolution_ns;
	w->now_ns = now_ns;
	w->capacity = capacity;
	w->high_water = 0;
	w->slab_off = sizeof(struct chime_wheel);
	clear_lists(wh, w);
	handle_init(wh, mem);
	w->now_tick = tick_of(wh, now_ns);
	wh->cur_min_ns = UINT64_MAX;
	return 0;
}

/* ---- lists ---------------------------------------------------------------- */

/* Push node idx at the head of the list with these ends, bounds and occupancy word. */
static inline void list_push(struct wheel *wh, uint32_t *head, uint32_t *tail, uint64_t *min,
			     uint64_t *max, uint64_t *occupied, struct chime_node *n, uint32_t idx,
			     unsigned level, unsigned s)
{
	uint32_t old = *head;

	n->next = old;
	n->prev = NIL;
	n->level = (uint8_t)level;
	n->state = CHIME_NODE_ARMED;
	/* a store to the old head's line: it does not stall the arm */
	if (old != NIL)
		wh->nodes[old].prev = idx;
	else
		*tail = idx;
	if (n->deadline_ns < *min)
		*min = n->deadline_ns;
	if (old == NIL || n->deadline_ns > *max)
		*max = n->deadline_ns;
	*head = idx;
	*occupied |= UINT64_C(1) << s;
}

static inline void slot_push(struct wheel *wh, struct chime_node *n, uint32_t idx,
			     unsigned level, unsigned s)
{
	list_push(wh, &wh->w->slot[level][s], &wh->tail[level][s], &wh->slot_min[level][s],
		  &wh->slot_max[level][s], &wh->w->occupied[level], n, idx, level, s);
}

/* slot_push() on the staged lists */
static inline void stage_push(struct wheel *wh, struct chime_node *n, uint32_t idx,
			      unsigned level, unsigned s)
{
	list_push(wh, &wh->st_head[level][s], &wh->st_tail[level][s], &wh->st_min[level][s],
		  &wh->st_max[level][s], &wh->st_occupied[level], n, idx, level, s);
}

/*
 * Slot of level l whose list end (head or tail, in ends[]) is idx. From the
 * node's deadline if it was placed there; a lazily reset node (see
 * wheel_reset()) can sit in an earlier slot of its level: then a scan of the
 * level's 64 ends finds it. O(64), only for a list's first or last node.
 */
static unsigned end_slot(const struct wheel *wh, const struct chime_node *n, uint32_t idx,
			 unsigned l, const uint32_t *ends)
{
	unsigned s = slot_of(tick_of(wh, n->deadline_ns), l);

	if (ends[s] == idx)
		return s;
	for (s = 0; s < SLOTS; s++)
		if (ends[s] == idx)
			break;
	return s;       /* SLOTS: not an end of this set's lists */
}

/* Unlink a node from the list with these ends; true if that emptied it. */
static inline bool list_remove(struct wheel *wh, uint32_t *head, uint32_t *tail, struct chime_node *n)
{
	uint32_t next = n->next, prev = n->prev;

	if (next != NIL)
		wh->nodes[next].prev = prev;
	else
		*tail = prev;
	if (prev != NIL) {
		wh->nodes[prev].next = next;
		return false;
	}
	*head = next;
	return next == NIL;
}

static inline bool is_staged_slot(const struct wheel *wh, unsigned l, unsigned s)
{
	return wh->staging && l == wh->stage_level && s == wh->stage_slot;
}

/* The same on the wheel's own lists; the slot being staged stays occupied (I8). */
static inline void slot_remove(struct wheel *wh, struct chime_node *n, unsigned l, unsigned s)
{
	if (list_remove(wh, &wh->w->slot[l][s], &wh->tail[l][s], n) && !is_staged_slot(wh, l, s))
		wh->w->occupied[l] &= ~(UINT64_C(1) << s);
}

static inline void slot_unlink(struct wheel *wh, struct chime_node *n, uint32_t idx)
{
	uint32_t next = n->next, prev = n->prev;
	unsigned l, s;

	if (next != NIL && prev != NIL) {
		wh->nodes[next].prev = prev;
		wh->nodes[prev].next = next;
		return;
	}
	/* an end of its list: only now is the slot needed, and which set it is in */
	l = n->level;
	s = end_slot(wh, n, idx, l, prev == NIL ? wh->w->slot[l] : wh->tail[l]);
	if (s < SLOTS) {
		slot_remove(wh, n, l, s);
		return;
	}
	s = end_slot(wh, n, idx, l, prev == NIL ? wh->st_head[l] : wh->st_tail[l]);
	if (s < SLOTS) {
		if (list_remove(wh, &wh->st_head[l][s], &wh->st_tail[l][s], n))
			wh->st_occupied[l] &= ~(UINT64_C(1) << s);
		return;
	}
	/* on no slot list: an end of the raw list (a slot made due whole, not yet marked) */
	assert(l == 0 && (prev == NIL ? wh->raw_head : wh->raw_tail) == idx);
	(void)list_remove(wh, &wh->raw_head, &wh->raw_tail, n);
}

static inline void exp_append(struct wheel *wh, struct chime_node *n, uint32_t idx, unsigned kind)
{
	struct chime_wheel *w = wh->w;
	uint32_t tail = w->expired_tail;

	n->next = NIL;
	n->prev = tail;
	n->level = (uint8_t)kind;
	n->state = CHIME_NODE_EXPIRED;
	if (tail != NIL)
		wh->nodes[tail].next = idx;
	else
		w->expired_head = idx;
	w->expired_tail = idx;
}

/* Put node idx (EXPIRED, due, off the list) at the expired list's front, after the earlier ones there. */
static inline void exp_jump(struct wheel *wh, struct chime_node *n, uint32_t idx)
{
	struct chime_wheel *w = wh->w;
	uint32_t p = wh->fresh_tail, next = p != NIL ? wh->nodes[p].next : w->expired_head;

	n->level = EXP_FRONT;
	wh->front_n++;          /* due_n: the caller's, once per tick */
	n->prev = p;
	n->next = next;
	if (next != NIL)
		wh->nodes[next].prev = idx;
	else
		w->expired_tail = idx;
	if (p != NIL)
		wh->nodes[p].next = idx;
	else
		w->expired_head = idx;
	wh->fresh_tail = idx;
}

/* How many due timers n's owner has (WHEEL_JUMP_OWNER). */
static inline uint32_t *owner_due(struct wheel *wh, const struct chime_node *n)
{
	return &wh->owner_due[n->owner % WHEEL_JUMP_OWNERS];
}

/* How many places in the front n's owner's group holds (WHEEL_JUMP_GROUP). */
static inline uint32_t *group_front(struct wheel *wh, const struct chime_node *n)
{
	uint32_t g = wh->group_of ? wh->group_of[n->owner] : n->owner;

	return &wh->group_front[g % WHEEL_JUMP_OWNERS];
}

/*
 * A node made due by the advance: at the front while this advance may jump
 * a backlog, its owner has few due and its group few places there; else
 * last.
 */
static inline void exp_due(struct wheel *wh, struct chime_node *n, uint32_t idx)
{
	uint32_t *od = owner_due(wh, n), *gf;

	(*od)++;
	if (!wh->jump_on || !wh->jump_left || *od > wh->jump_owner ||
	    *(gf = group_front(wh, n)) >= wh->jump_group) {
		exp_append(wh, n, idx, EXP_DUE);
		return;
	}
	(*gf)++;
	wh->jump_left--;
	n->state = CHIME_NODE_EXPIRED;
	exp_jump(wh, n, idx);
}

/*
 * About to make one tick's timers due: may they go ahead of what waits?
 * Yes behind a backlog, WHEEL_JUMP_BACKLOG due timers or more, and within
 * the advance's WHEEL_JUMP_MAX (wheel.h).
 */
static inline void jump_open(struct wheel *wh)
{
	wh->jump_on = wh->due_n - wh->front_n >= wh->jump_backlog;
}

static inline void exp_unlink(struct wheel *wh, struct chime_node *n)
{
	struct chime_wheel *w = wh->w;
	unsigned due = n->level != EXP_PENDING;

	if (wh->fresh_tail != NIL && n == &wh->nodes[wh->fresh_tail])
		wh->fresh_tail = n->prev;       /* the front's last goes: the one before it is */
	wh->due_n -= due;
	*owner_due(wh, n) -= due;
	if (n->level == EXP_FRONT) {
		wh->front_n--;
		(*group_front(wh, n))--;
	}

	if (n->next != NIL)
		wh->nodes[n->next].prev = n->prev;
	else
		w->expired_tail = n->prev;
	if (n->prev != NIL)
		wh->nodes[n->prev].next = n->next;
	else
		w->expired_head = n->next;
}

/* Put an off-list node on the wheel relative to the current now (I1, I3). */
static inline void place(struct wheel *wh, struct chime_node *n, uint32_t idx)
{
	struct chime_wheel *w = wh->w;
	uint64_t d = n->deadline_ns, t, T = w->now_tick;
	unsigned l;

	if (d <= w->now_ns) {
		/* already due: never left ARMED (I1), poppable after the next advance */
		exp_append(wh, n, idx, EXP_PENDING);
		return;
	}
	t = tick_of(wh, d);
	l = level_of(t, T);
	slot_push(wh, n, idx, l, slot_of(t, l));
	if (t == T && d < wh->cur_min_ns)
		wh->cur_min_ns = d;
}

/* ---- allocation ----------------------------------------------------------- */

/*
 * Zeroed memory for bitmaps over the nodes, touched only as used:
 * NORESERVE anonymous pages. Shared, not private: a private page read
 * first maps the zero page, and the write after it replaces that with a
 * TLB flush on every CPU the broker has run on, waiting for each to take
 * it; a CPU with interrupts off (a user's million-watch eventfd_write(),
 * 300 ms) held the shard that long in wheel_free_unlisted() (perf,
 * tlb:tlb_flush, 2026-12-08). A shared page is allocated on its first
 * touch, read or write. NULL if it cannot be had.
 */
void *wheel_bits_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

void wheel_bits_unmap(void *bits, size_t len)
{
	if (bits)
		munmap(bits, len);
}

/*
 * The free map's memory for `capacity` nodes, all taken (zero): a 4M-node
 * shard's first level is 512 KiB, an eighth of a bit per node above it.
 */
static int free_map(struct wheel *wh, uint32_t capacity)
{
	size_t words[WHEEL_FREE_LEVELS], total = 0;
	uint64_t n = capacity;
	unsigned l = 0;
	char *p;

	do {
		n = (n + 63) / 64;
		words[l] = (size_t)n;
		total += (size_t)n;
		l++;
	} while (n > 1);
	p = wheel_bits_map(total * sizeof(uint64_t));
	if (!p)
		return -ENOMEM;
	wh->free_levels = l;
	wh->free_len = total * sizeof(uint64_t);
	for (unsigned k = 0; k < WHEEL_FREE_LEVELS; k++) {
		wh->free_bits[k] = k < l ? (uint64_t *)p : NULL;
		p += k < l ? words[k] * sizeof(uint64_t) : 0;
	}
	return 0;
}

void wheel_fini(struct wheel *wh)
{
	wheel_bits_unmap(wh->free_bits[0], wh->free_len);
	memset(wh->free_bits, 0, sizeof(wh->free_bits));
	wh->free_levels = 0;
}

/* The lowest free node; NIL if none. */
static inline uint32_t free_lowest(const struct wheel *wh)
{
	unsigned top = wh->free_levels - 1;
	uint64_t i = 0;

	if (!wh->free_bits[top][0])
		return NIL;
	for (unsigned l = top + 1; l-- > 0;)
		i = i * 64 + (uint64_t)__builtin_ctzll(wh->free_bits[l][i]);
	return (uint32_t)i;
}

/* The lowest free node, taken off the map; NIL if none. */
static inline uint32_t free_take_lowest(struct wheel *wh)
{
	uint64_t i = free_lowest(wh);

	if (i == NIL)
		return NIL;
	{
		/* the next alloc most likely takes the next free node of this word: start its miss now */
		uint64_t word = wh->free_bits[0][i / 64], rest = word & (word - 1);     /* i's is its lowest bit */

		if (rest)
			__builtin_prefetch(&wh->nodes[(i & ~UINT64_C(63)) + (uint64_t)__builtin_ctzll(rest)], 1);
	}
	for (unsigned l = 0, j = 0; l < wh->free_levels; l++) {
		uint64_t *word = &wh->free_bits[l][(i >> j) / 64];

		*word &= ~(UINT64_C(1) << ((i >> j) % 64));
		if (*word)
			break;
		j += 6;
	}
	return (uint32_t)i;
}

uint32_t wheel_lowest_free(const struct wheel *wh)
{
	return free_lowest(wh);
}

uint32_t wheel_slab_end(const struct wheel *wh)
{
	uint32_t end = wh->w->high_water;

	while (end > 0) {
		uint32_t base = (end - 1) / 64 * 64, bits = end - base;
		uint64_t mask = bits == 64 ? ~UINT64_C(0) : (UINT64_C(1) << bits) - 1;
		uint64_t used = ~wh->free_bits[0][base / 64] & mask;

		if (used)
			return base + (uint32_t)(64 - __builtin_clzll(used));
		end = base;
	}
	return 0;
}

void wheel_shrink(struct wheel *wh, uint32_t end)
{
	uint64_t lo = end, hi = wh->w->high_water;

	assert(end >= wheel_slab_end(wh));
	if (end >= hi)
		return;
	if (hi > wh->shrunk_from)
		wh->w->shrunk_from = wh->shrunk_from = (uint32_t)hi;
	/* Level 0: the nodes' bits; each level above: a bit per word below, set while that word is non-zero. */
	for (unsigned l = 0; l < wh->free_levels; l++) {
		for (uint64_t j = lo; j < hi;) {
			uint64_t *word = &wh->free_bits[l][j / 64], bit = UINT64_C(1) << (j % 64);

			if (l == 0 && j % 64 == 0 && hi - j >= 64) {
				*word = 0;      /* a whole word of nodes at once */
				j += 64;
				continue;
			}
			if (l == 0 || !wh->free_bits[l - 1][j])
				*word &= ~bit;
			else
				*word |= bit;
			j++;
		}
		lo /= 64;
		hi = (hi - 1) / 64 + 1;
	}
	at_store(&wh->w->high_water, end);
}

uint32_t wheel_alloc(struct wheel *wh)
{
	struct chime_wheel *w = wh->w;
	struct chime_node *n;
	uint32_t idx = free_take_lowest(wh), gen;

	if (idx == NIL) {
		if (w->high_water >= wh->reserved)
			return NIL;
		/* bump: first touch of this node's page happens here; the
		 * control thread's timers scan reads the mark (at_load) */
		idx = w->high_water;
		at_store(&w->high_water, idx + 1);
		wh->nodes[idx].gen = wh->gen_base;
	}
	n = &wh->nodes[idx];
	gen = (n->gen + 1) & CHIME_ID_GEN_MASK;
	*n = (struct chime_node){
		.cq_pos = CHIME_POS_NONE,
		.next = NIL,
		.prev = NIL,
		.key_next = NIL,
		.key_prev = NIL,
		.gen = gen ? gen : 1,
		.state = CHIME_NODE_ALLOC,
	};
	return idx;
}

void wheel_free(struct wheel *wh, uint32_t idx)
{
	struct chime_node *n = &wh->nodes[idx];

	assert(idx < wh->w->high_water && n->state != CHIME_NODE_FREE);
	wheel_cancel(wh, idx);
	n->state = CHIME_NODE_FREE;
	wheel__free_mark(wh, idx);
}

/* ---- arm / cancel / reset --------------------------------------------------- */

void wheel_arm(struct wheel *wh, uint32_t idx, uint64_t deadline_ns)
{
	struct chime_node *n = &wh->nodes[idx];

	wheel_hot_assert(idx < wh->w->high_water);
	wheel_hot_assert(n->state != CHIME_NODE_FREE && n->state != CHIME_NODE_ARMED &&
	       n->state != CHIME_NODE_EXPIRED);
	n->deadline_ns = deadline_ns;
	wh->armed++;
	place(wh, n, idx);
}

/* Off whichever wheel list the node is on; true if it was on one. */
static inline int take_off(struct wheel *wh, struct chime_node *n, uint32_t idx)
{
	if (n->state == CHIME_NODE_ARMED)
		slot_unlink(wh, n, idx);
	else if (n->state == CHIME_NODE_EXPIRED)
		exp_unlink(wh, n);
	else
		return 0;
	return 1;
}

/*
 * cancel and reset: the common case (an ARMED node inside its list) inline
 * and the rest out of line, so the common case saves no registers: on a
 * wheel larger than the cache these calls wait on misses, and how many run
 * ahead is bounded by the instructions and stores in flight, not by the
 * misses. wheel_cancel()'s common case is in wheel.h, inlined in the caller.
 */
void wheel__cancel_slow(struct wheel *wh, uint32_t idx)
{
	struct chime_node *n = &wh->nodes[idx];

	if (!take_off(wh, n, idx))
		return;
	n->state = CHIME_NODE_ALLOC;
	wh->armed--;
}

static void __attribute__((noinline)) reset_slow(struct wheel *wh, uint32_t idx,
						 uint64_t deadline_ns)
{
	struct chime_node *n = &wh->nodes[idx];

	if (!take_off(wh, n, idx))
		wh->armed++;
	n->deadline_ns = deadline_ns;
	place(wh, n, idx);
}

/*
 * An earlier deadline for an ARMED node inside its list (or on the raw
 * list), landing in a non-empty slot ahead of the current tick: unlink and
 * push with nothing else to maintain. Anything else goes to reset_slow().
 */
static void __attribute__((noinline)) reset_move(struct wheel *wh, uint32_t idx,
						 uint64_t deadline_ns)
{
	struct chime_wheel *w = wh->w;
	struct chime_node *nodes = wh->nodes, *n = &nodes[idx];
	uint32_t next = n->next, prev = n->prev, head;
	uint64_t t, T = w->now_tick;
	unsigned l, s;

	if (next == NIL || prev == NIL || deadline_ns <= w->now_ns)
		goto slow;
	t = tick_of(wh, deadline_ns);
	if (t == T)
		goto slow;      /* the current tick's slot: cur_min_ns */
	l = level_of(t, T);
	s = slot_of(t, l);
	head = w->slot[l][s];
	if (head == NIL)
		goto slow;      /* occupancy bit and tail */
	nodes[next].prev = prev;
	nodes[prev].next = next;
	n->deadline_ns = deadline_ns;
	n->next = head;
	n->prev = NIL;
	n->level = (uint8_t)l;
	nodes[head].prev = idx;
	w->slot[l][s] = idx;
	if (deadline_ns < wh->slot_min[l][s])
		wh->slot_min[l][s] = deadline_ns;       /* I7 */
	if (deadline_ns > wh->slot_max[l][s])
		wh->slot_max[l][s] = deadline_ns;
	return;
slow:
	reset_slow(wh, idx, deadline_ns);
}

/*
 * A level-0 node's deadline is about to be raised in place: its slot (the
 * one its deadline gives, as no lazy reset has moved it yet, or else one
 * already marked) no longer has a known maximum, so it is walked, not
 * taken whole, when it comes due (I7). While staging, in the staged set
 * too: the node may be on a staged list, whose maximum becomes the slot's
 * at the join.
 */
static inline void lazy_on_level0(struct wheel *wh, struct chime_node *n)
{
	unsigned s = slot_of(tick_of(wh, n->deadline_ns), 0);

	wh->slot_max[0][s] = UINT64_MAX;
	if (wh->staging)
		wh->st_max[0][s] = UINT64_MAX;
}

void wheel_reset(struct wheel *wh, uint32_t idx, uint64_t deadline_ns)
{
	struct chime_node *n = &wh->nodes[idx];

	wheel_hot_assert(idx < wh->w->high_water && n->state != CHIME_NODE_FREE);
	if (n->state != CHIME_NODE_ARMED) {
		reset_slow(wh, idx, deadline_ns);
		return;
	}
	/*
	 * Lazy: a later deadline leaves the node where it is, in a slot that is
	 * processed no later than its new tick; that processing re-places it
	 * (fire_slot*(), cascade_one()). A keepalive touch is one store.
	 */
	if (deadline_ns < n->deadline_ns) {
		reset_move(wh, idx, deadline_ns);
		return;
	}
	if (n->level == 0) {
		/* due already: on the raw list, where a node not due must not stay (I1) */
		if (wh->raw_head != NIL && n->deadline_ns <= wh->w->now_ns) {
			reset_move(wh, idx, deadline_ns);
			return;
		}
		lazy_on_level0(wh, n);
	}
	n->deadline_ns = deadline_ns;
}

void wheel_rearm_periodic(struct wheel *wh, uint32_t idx)
{
	struct chime_node *n = &wh->nodes[idx];
	uint64_t d;

	assert(n->period_ns > 0);
	/* from the deadline, not from now: no drift; saturate rather than wrap */
	d = n->deadline_ns + n->period_ns;
	if (d < n->deadline_ns)
		d = UINT64_MAX;
	wheel_reset(wh, idx, d);
}

/* ---- advance ---------------------------------------------------------------- */

/*
 * Move T to tick t. The new current tick's slot minimum is its slot's lower
 * bound (I7) if it holds nodes already, else exact (none yet; place()
 * lowers it): an advance inside the tick before its first deadline does
 * not scan the slot (a million timers due at one instant: 7 ms of
 * scanning, and again once they were due, before the first one went out).
 */
static inline void set_now_tick(struct wheel *wh, uint64_t t)
{
	unsigned s = slot_of(t, 0);

	wh->w->now_tick = t;
	wh->cur_min_ns = wh->w->occupied[0] >> s & 1 ? wh->slot_min[0][s] : UINT64_MAX;
}

/* ---- raw: a level-0 slot made due whole, marked as it is popped ---- */

/*
 * Level-0 slot s, all of whose timers are due (its maximum is known, I7,
 * and at or before now), becomes the raw list in O(1). The raw list is
 * empty: wheel_advance() flushes it before it processes a slot.
 */
static void raw_splice(struct wheel *wh, unsigned s)
{
	struct chime_wheel *w = wh->w;

	assert(wh->raw_head == NIL);
	wh->raw_head = w->slot[0][s];
	wh->raw_tail = wh->tail[0][s];
	w->slot[0][s] = NIL;
	wh->tail[0][s] = NIL;
	wh->slot_min[0][s] = UINT64_MAX;
	wh->slot_max[0][s] = 0;
	w->occupied[0] &= ~(UINT64_C(1) << s);
}

/* The expired list's first pending node (they are its last ones), or NIL. O(pending). */
static uint32_t pending_first(const struct wheel *wh)
{
	const struct chime_node *nodes = wh->nodes;
	uint32_t i = wh->w->expired_tail, first = NIL;

	while (i != NIL && nodes[i].level == EXP_PENDING) {
		first = i;
		i = nodes[i].prev;
	}
	return first;
}

/* A node of the raw list made due: EXPIRED, counted for its owner's jump decisions. */
static inline void raw_mark(struct wheel *wh, struct chime_node *n)
{
	n->state = CHIME_NODE_EXPIRED;
	n->level = EXP_DUE;
	(*owner_due(wh, n))++;
}

/*
 * Mark the raw list EXPIRED and count it (I3), on the expired list before
 * its pending nodes (it was due first): before anything else is made due,
 * so that the jump decisions see every due timer counted, and the order
 * they became due stays the order they pop. O(raw + pending).
 */
static void raw_flush(struct wheel *wh)
{
	struct chime_wheel *w = wh->w;
	struct chime_node *nodes = wh->nodes;
	uint32_t first = wh->raw_head, last = wh->raw_tail, pend = pending_first(wh);
	uint32_t before = pend != NIL ? nodes[pend].prev : w->expired_tail;
	uint64_t cnt = 0;

	/*
	 * From both ends at once, as cascade_slot(): on a wheel larger than
	 * the cache every node is a miss, and two chains keep two in flight.
	 */
	for (uint32_t i = first, j = last;;) {
		uint32_t ni = nodes[i].next, pj = nodes[j].prev;

		raw_mark(wh, &nodes[i]);
		cnt++;
		if (i == j)
			break;
		raw_mark(wh, &nodes[j]);
		cnt++;
		if (ni == j)
			break;
		i = ni;
		j = pj;
	}
	nodes[first].prev = before;
	nodes[last].next = pend;
	if (before != NIL)
		nodes[before].next = first;
	else
		w->expired_head = first;
	if (pend != NIL)
		nodes[pend].prev = last;
	else
		w->expired_tail = last;
	wh->due_n += cnt;
	wh->raw_head = wh->raw_tail = NIL;
}

/* Make every pending node due (I3). O(pending), and the raw list's first if both are there. */
static void promote_pending(struct wheel *wh)
{
	uint32_t i = wh->w->expired_tail;
	uint64_t cnt = 0;

	if (i == NIL || wh->nodes[i].level != EXP_PENDING)
		return;
	if (wh->raw_head != NIL)
		raw_flush(wh);  /* due before them: they stay ahead */
	for (i = wh->w->expired_tail; i != NIL && wh->nodes[i].level == EXP_PENDING; i = wh->nodes[i].prev) {
		wh->nodes[i].level = EXP_DUE;
		(*owner_due(wh, &wh->nodes[i]))++;
		cnt++;
	}
	wh->due_n += cnt;
}

/*
 * Fire slot s's deadlines <= now node by node (each may go ahead of a
 * backlog, exp_due()); re-place those lazily reset past the slot's tick;
 * the rest stay. *min: the least deadline left.
 */
static void fire_each(struct wheel *wh, unsigned s, uint64_t now, uint64_t *min)
{
	struct chime_node *nodes = wh->nodes;
	uint32_t i = wh->w->slot[0][s];
	uint64_t cnt = 0, e_end = tick_end_ns(wh, wh->w->now_tick);

	*min = UINT64_MAX;
	while (i != NIL) {
		struct chime_node *n = &nodes[i];
		uint32_t next = n->next;

		__builtin_prefetch(&nodes[next]);
		if (n->deadline_ns <= now) {
			slot_remove(wh, n, 0, s);
			exp_due(wh, n, i);
			cnt++;
		} else if (n->deadline_ns > e_end) {
			/* lazily reset to a later tick: re-place it */
			slot_remove(wh, n, 0, s);
			place(wh, n, i);
		} else if (n->deadline_ns < *min) {
			*min = n->deadline_ns;
		}
		i = next;
	}
	wh->due_n += cnt;
}

/*
 * Fire a whole level-0 slot (its tick is before now's): it becomes the raw
 * list, unwalked. Behind a backlog, node by node instead: each one's owner
 * decides whether it goes ahead; and so if a lazy reset may have put a
 * later deadline there.
 */
static void fire_slot(struct wheel *wh, unsigned s)
{
	uint64_t e_end = tick_end_ns(wh, wh->w->now_tick), min;

	jump_open(wh);
	if (wh->jump_on || wh->slot_max[0][s] == UINT64_MAX) {
		fire_each(wh, s, e_end, &min);  /* leaves the slot empty (lazily reset ones re-placed) */
		wh->slot_min[0][s] = UINT64_MAX;
		wh->slot_max[0][s] = 0;
		return;
	}
	raw_splice(wh, s);
}

/*
 * The level-0 slot of now's own tick: only deadlines <= now fire (exact);
 * the rest stay, and their minimum lets the next advance inside this tick
 * skip the scan. A slot all due (timers due at one instant, the shard
 * awake for them) goes over whole, as above.
 */
static void fire_slot_partial(struct wheel *wh, unsigned s, uint64_t now)
{
	/* a cascade or a staged slot may just have put timers there: its minimum bounds them too (I7) */
	if (wh->slot_min[0][s] < wh->cur_min_ns)
		wh->cur_min_ns = wh->slot_min[0][s];
	if (now < wh->cur_min_ns)
		return;         /* nothing in it due yet */
	jump_open(wh);
	if (!wh->jump_on && wh->slot_max[0][s] <= now) {
		raw_splice(wh, s);
		wh->cur_min_ns = UINT64_MAX;
		return;
	}
	fire_each(wh, s, now, &wh->cur_min_ns);
}

/* Re-place one node of a cascading slot whose first tick e is now_tick. */
static inline uint64_t cascade_one(struct wheel *wh, struct chime_node *n, uint32_t i,
				   uint64_t T_end, uint64_t now)
{
	uint64_t e = wh->w->now_tick, t = tick_of(wh, n->deadline_ns);
	unsigned nl;

	if (t == e && (e < T_end || n->deadline_ns <= now)) {
		/* never early: tick e is wholly before now, or this deadline is <= now */
		exp_due(wh, n, i);
		return 1;
	}
	nl = level_of(t, e);
	slot_push(wh, n, i, nl, slot_of(t, nl));
	return 0;
}

/*
 * Cascade slot s of level l (> 0), whose first tick e is now now_tick: each
 * node lands strictly lower, or fires if its tick is e and it is due. Nodes
 * of later ticks are not fired here even if due, so that the advance loop
 * fires them in tick order. The list is walked from both ends at once: on a
 * large wheel every node is a cache miss, and two independent chains keep
 * two misses in flight.
 */
static void cascade_slot(struct wheel *wh, unsigned l, unsigned s, uint64_t T_end, uint64_t now)
{
	struct chime_wheel *w = wh->w;
	struct chime_node *nodes = wh->nodes;
	uint32_t i = w->slot[l][s], j = wh->tail[l][s];
	uint64_t cnt = 0;

	jump_open(wh);
	w->slot[l][s] = NIL;
	wh->tail[l][s] = NIL;
	wh->slot_min[l][s] = UINT64_MAX;
	wh->slot_max[l][s] = 0;
	w->occupied[l] &= ~(UINT64_C(1) << s);
	while (i != NIL) {
		struct chime_node *a = &nodes[i], *b = &nodes[j];
		uint32_t ni = a->next, pj = b->prev;

		if (i == j) {
			cnt += cascade_one(wh, a, i, T_end, now);
			break;
		}
		__builtin_prefetch(&nodes[ni]);
		__builtin_prefetch(&nodes[pj]);
		cnt += cascade_one(wh, a, i, T_end, now);
		cnt += cascade_one(wh, b, j, T_end, now);
		if (ni == j)
			break;
		i = ni;
		j = pj;
	}
	wh->due_n += cnt;
}

/* ---- staging ---------------------------------------------------------------- */

/*
 * The advance has reached the staged slot: levels below it are empty (it is
 * the earliest pending slot), so the staged lists, placed relative to its
 * first tick, become the wheel's own as they are. No node is touched.
 */
static void stage_join(struct wheel *wh)
{
	struct chime_wheel *w = wh->w;

	for (unsigned l = 0; l < wh->stage_level; l++) {
		assert(w->occupied[l] == 0);
		w->occupied[l] = wh->st_occupied[l];
		memcpy(w->slot[l], wh->st_head[l], sizeof(w->slot[l]));
		memcpy(wh->tail[l], wh->st_tail[l], sizeof(wh->tail[l]));
		memcpy(wh->slot_min[l], wh->st_min[l], sizeof(wh->slot_min[l]));
		memcpy(wh->slot_max[l], wh->st_max[l], sizeof(wh->slot_max[l]));
	}
	stage_clear(wh, wh->stage_level);
}

/* Take node i off the staged slot's own list, to where its cascade will put it. */
static inline void stage_one(struct wheel *wh, uint32_t i)
{
	struct chime_node *n = &wh->nodes[i];
	uint64_t t = tick_of(wh, n->deadline_ns);
	unsigned nl = level_of(t, wh->stage_base);

	slot_remove(wh, n, wh->stage_level, wh->stage_slot);
	if (nl < wh->stage_level)
		stage_push(wh, n, i, nl, slot_of(t, nl));
	else
		place(wh, n, i);        /* lazily reset past the slot: where it belongs now */
}

/*
 * How far ahead a slot is staged: just under a level-2 slot's span, so that
 * each level-2 slot is staged before its cascade and a level-3 slot (most
 * of the timers of a 30-second workload) after the last level-2 slot before
 * it has joined: one slot at a time, and the biggest one when they meet.
 */
#define STAGE_HORIZON ((uint64_t)SLOTS * SLOTS - 1)

unsigned wheel_stage(struct wheel *wh, unsigned budget)
{
	struct chime_wheel *w = wh->w;
	struct chime_node *nodes = wh->nodes;
	unsigned l, s, moved = 0;
	uint64_t E;
	uint32_t i;

	if (!wh->staging) {
		/*
		 * The highest level's first slot within the horizon: the
		 * larger a slot's span, the more timers it holds (one slot at a
		 * time, and a level-1 slot is 1/64 of a level-2 one).
		 */
		for (l = LEVELS - 1; l > 0; l--) {
			if (w->occupied[l] == 0)
				continue;
			s = (unsigned)__builtin_ctzll(w->occupied[l]);
			E = slot_base(w->now_tick, l, s);
			if (E - w->now_tick <= STAGE_HORIZON)
				break;
		}
		if (l == 0)
			return 0;
		wh->staging = true;
		wh->stage_level = (uint8_t)l;
		wh->stage_slot = (uint8_t)s;
		wh->stage_base = E;
	}
	l = wh->stage_level;
	s = wh->stage_slot;
	/* from both ends at once, as cascade_slot(): two chains of misses in flight */
	while (moved < budget && (i = w->slot[l][s]) != NIL) {
		uint32_t j = wh->tail[l][s];

		__builtin_prefetch(&nodes[nodes[i].next]);
		__builtin_prefetch(&nodes[nodes[j].prev]);
		stage_one(wh, i);
		moved++;
		if (j != i) {
			stage_one(wh, j);
			moved++;
		}
	}
	return moved;
}

/*
 * Levels from which a coming slot is worth a wake-up of its own to stage:
 * a level-2 slot spans 409.6 ms at 100 us, and cascading one that held
 * 500k timers held a timer due 1 ms after its start back 41-42 ms.
 * Level-1 slots (6.4 ms) come too often for a wake-up each; they are
 * staged when the shard is awake anyway.
 */
#define STAGE_WAKE_LEVEL 2u

uint64_t wheel_stage_at(const struct wheel *wh)
{
	const struct chime_wheel *w = wh->w;
	uint64_t at = UINT64_MAX;

	if (wh->staging)        /* until its slot is joined: nodes left, or nothing */
		return w->slot[wh->stage_level][wh->stage_slot] != NIL ? w->now_ns : UINT64_MAX;
	/* a few thousand nodes cascade in well under a millisecond: not worth a wake-up */
	if (wh->armed < wh->stage_wake_min)
		return UINT64_MAX;
	for (unsigned l = STAGE_WAKE_LEVEL; l < LEVELS; l++) {
		uint64_t E, t;

		if (w->occupied[l] == 0)
			continue;
		/* wheel_stage()'s own test: E - now_tick <= STAGE_HORIZON */
		E = slot_base(w->now_tick, l, (unsigned)__builtin_ctzll(w->occupied[l]));
		if (E - w->now_tick <= STAGE_HORIZON)
			return w->now_ns;
		t = E - STAGE_HORIZON;
		if (t < wh->max_tick && t * w->resolution_ns < at)
			at = t * w->resolution_ns;
	}
	return at;
}

/* ---- advance (continued) ------------------------------------------------------ */

void wheel_advance(struct wheel *wh, uint64_t now_ns)
{
	struct chime_wheel *w = wh->w;
	uint64_t now = now_ns < w->now_ns ? w->now_ns : now_ns;
	uint64_t T_end = tick_of(wh, now);

	promote_pending(wh);
	/* an advance inside one tick below the current tick's known minimum: done */
	if (T_end == w->now_tick && now < wh->cur_min_ns) {
		w->now_ns = now;
		return;
	}
	wh->jump_left = wh->jump_max;
	for (;;) {
		unsigned l = 0, s;
		uint64_t e;

		while (l < LEVELS && w->occupied[l] == 0)
			l++;
		if (l == LEVELS)
			break;
		s = (unsigned)__builtin_ctzll(w->occupied[l]);
		e = slot_base(w->now_tick, l, s);
		if (e > T_end)
			break;
		/* the last slot made due whole, judged before another one is processed (raw_flush()) */
		if (wh->raw_head != NIL)
			raw_flush(wh);
		if (l > 0 && is_staged_slot(wh, l, s)) {
			/* from its first tick, where the staged lists are placed */
			stage_join(wh);
		} else if (l > 0) {
			/*
			 * Cascading: start from the slot's lowest deadline's tick
			 * (I7), not its first tick, if later (not past T_end).
			 * Nothing in the wheel is earlier (levels below are empty,
			 * later slots and levels start after this one ends), and
			 * that tick shares every digit from l up with e, so the
			 * other slots stay where they are. Timers due at one
			 * instant then fire from here, in one pass, instead of a
			 * pass per level on their way down (1M timers: 4 passes).
			 */
			uint64_t m = tick_of(wh, wh->slot_min[l][s]);

			if (m > e)
				e = m < T_end ? m : T_end;
		}
		if (e != w->now_tick)
			set_now_tick(wh, e);
		if (l > 0) {
			cascade_slot(wh, l, s, T_end, now);
		} else if (e < T_end) {
			fire_slot(wh, s);
		} else {
			fire_slot_partial(wh, s, now);
			break;
		}
	}
	if (w->now_tick != T_end)
		set_now_tick(wh, T_end);
	w->now_ns = now;
	wh->jump_left = 0;
	wh->jump_on = false;
}

/* Take node i, at the head of its list, off it (ALLOC); returns the next. */
static inline uint32_t pop_node(struct chime_node *nodes, uint32_t i)
{
	struct chime_node *n = &nodes[i];
	uint32_t next = n->next;

	__builtin_prefetch(&nodes[next]);
	n->state = CHIME_NODE_ALLOC;
	n->prev = NIL;
	n->next = NIL;
	return next;
}

/* pop_node() of a counted due node, off the expired list */
static inline uint32_t pop_one(struct wheel *wh, struct chime_node *nodes, uint32_t i)
{
	(*owner_due(wh, &nodes[i]))--;
	return pop_node(nodes, i);
}

/* The list with these ends now starts at i (its nodes before i are gone). */
static inline void list_behead(struct chime_node *nodes, uint32_t *head, uint32_t *tail, uint32_t i)
{
	*head = i;
	if (i != NIL)
		nodes[i].prev = NIL;
	else
		*tail = NIL;
}

/*
 * After the expired list's due nodes: up to max raw ones into out (all
 * due). Returns how many. From both ends at once, as raw_flush(): the raw
 * list is one tick made due whole, whose order is no deadline order (a
 * slot's list is in the order its nodes were pushed), and two chains keep
 * two misses in flight where one walk waits for each node's link.
 */
static unsigned pop_raw(struct wheel *wh, uint32_t *out, unsigned max)
{
	struct chime_node *nodes = wh->nodes;
	uint32_t i = wh->raw_head, j = wh->raw_tail;
	unsigned cnt = 0;

	while (cnt + 2 <= max && i != NIL) {
		uint32_t ni = nodes[i].next, pj = nodes[j].prev;     /* stale if i == j: not followed */

		wheel_hot_assert(nodes[i].state == CHIME_NODE_ARMED && nodes[i].deadline_ns <= wh->w->now_ns);
		wheel_hot_assert(nodes[j].state == CHIME_NODE_ARMED && nodes[j].deadline_ns <= wh->w->now_ns);
		out[cnt++] = i;
		(void)pop_node(nodes, i);
		if (i == j) {
			i = j = NIL;
			break;
		}
		out[cnt++] = j;
		(void)pop_node(nodes, j);
		if (ni == j) {
			i = j = NIL;
			break;
		}
		i = ni;
		j = pj;
	}
	if (cnt < max && i != NIL) {
		/* room for one more: from the front */
		uint32_t ni = nodes[i].next;

		out[cnt++] = i;
		(void)pop_node(nodes, i);
		/* the last one: its links may name nodes popped from the other end */
		if (i == j)
			i = j = NIL;
		else
			i = ni;
	}
	wh->raw_head = i;
	wh->raw_tail = j;
	if (i != NIL) {
		nodes[i].prev = NIL;
		nodes[j].next = NIL;
	}
	wh->armed -= cnt;
	return cnt;
}

unsigned wheel_pop_expired(struct wheel *wh, uint32_t *out, unsigned max)
{
	struct chime_wheel *w = wh->w;
	struct chime_node *nodes = wh->nodes;
	uint32_t i = w->expired_head;
	unsigned cnt = 0, from_front = 0;

	if (i == NIL || nodes[i].level == EXP_PENDING)
		return wh->raw_head == NIL ? 0 : pop_raw(wh, out, max);   /* the common call: nothing due */
	/* The front first (due: no pending node there), up to its last node. */
	while (wh->fresh_tail != NIL && cnt < max) {
		if (i == wh->fresh_tail)
			wh->fresh_tail = NIL;
		out[cnt++] = i;
		(*group_front(wh, &nodes[i]))--;
		i = pop_one(wh, nodes, i);
		from_front++;
	}
	while (cnt < max && i != NIL && nodes[i].level != EXP_PENDING) {
		out[cnt++] = i;
		i = pop_one(wh, nodes, i);
	}
	list_behead(nodes, &w->expired_head, &w->expired_tail, i);
	wh->armed -= cnt;
	wh->due_n -= cnt;
	wh->front_n -= from_front;
	/* the raw list was made due after every due node there (raw_flush() keeps it so) */
	if (cnt < max && wh->raw_head != NIL)
		cnt += pop_raw(wh, out + cnt, max - cnt);
	return cnt;
}

uint64_t wheel_due(const struct wheel *wh)
{
	const struct chime_node *nodes = wh->nodes;
	uint64_t n = 0;

	for (uint32_t i = wh->w->expired_head; i != NIL && nodes[i].level != EXP_PENDING; i = nodes[i].next)
		n++;
	for (uint32_t i = wh->raw_head; i != NIL; i = nodes[i].next)
		n++;
	return n;
}

void wheel_group_owners(struct wheel *wh, const uint16_t *group_of)
{
	uint32_t i = wh->w->expired_head;

	wh->group_of = group_of;
	memset(wh->group_front, 0, sizeof(wh->group_front));
	for (; i != NIL && wh->nodes[i].level == EXP_FRONT; i = wh->nodes[i].next)
		(*group_front(wh, &wh->nodes[i]))++;
}

uint64_t wheel_next_deadline(const struct wheel *wh)
{
	const struct chime_wheel *w = wh->w;

	if (w->expired_head != NIL || wh->raw_head != NIL)
		return w->now_ns;
	if (wh->armed == 0)
		return UINT64_MAX;      /* a staged slot stays occupied (I8), its nodes all gone */
	for (unsigned l = 0; l < LEVELS; l++) {
		if (w->occupied[l]) {
			unsigned s = (unsigned)__builtin_ctzll(w->occupied[l]);

			/*
			 * Round UP to the end of the slot's first tick: never early,
			 * at most resolution_ns - 1 after the earliest deadline (which
			 * is in that tick or later), and advancing there fires that
			 * tick or cascades that slot: progress.
			 */
			return tick_end_ns(wh, slot_base(w->now_tick, l, s));
		}
	}
	return UINT64_MAX;
}

struct scan {
	uint64_t min;
	uint32_t n, max;
};

static uint64_t slot_base_ns(const struct wheel *wh, uint64_t T, unsigned l, unsigned s)
{
	uint64_t base = slot_base(T, l, s);

	return base > wh->max_tick ? UINT64_MAX - 1 : base * wh->w->resolution_ns;
}

/* Fold one list's deadlines into sc->min; false if max_scan ran out. */
static bool scan_list(const struct wheel *wh, uint32_t i, struct scan *sc)
{
	for (; i != NIL; i = wh->nodes[i].next, sc->n++) {
		if (sc->n == sc->max)
			return false;
		if (wh->nodes[i].deadline_ns < sc->min)
			sc->min = wh->nodes[i].deadline_ns;
	}
	return true;
}

/*
 * Occupied slots of a set in order of their first tick relative to T
 * (levels up, slots up), below `levels`. A node's deadline is at or after
 * its slot's first ns (I1), so once a slot starts at or after the minimum
 * found, no later one of the set can hold a smaller deadline. Without
 * lazily reset nodes that stops at the second slot. The staged slot's own
 * lists are walked where that slot comes, before its remaining nodes.
 * Returns false if max_scan ran out (*cut: a lower bound of the rest).
 */
static bool scan_set(const struct wheel *wh, const uint32_t (*head)[SLOTS], const uint64_t *occupied,
		     unsigned levels, uint64_t T, struct scan *sc, uint64_t *cut)
{
	bool own = head == (const uint32_t (*)[SLOTS])wh->w->slot;

	for (unsigned l = 0; l < levels; l++) {
		for (uint64_t occ = occupied[l]; occ; occ &= occ - 1) {
			unsigned s = (unsigned)__builtin_ctzll(occ);
			uint64_t base_ns = slot_base_ns(wh, T, l, s), ignored;

			if (base_ns >= sc->min)
				return true;
			*cut = base_ns;
			if (own && is_staged_slot(wh, l, s) &&
			    !scan_set(wh, (const uint32_t (*)[SLOTS])wh->st_head, wh->st_occupied,
				      wh->stage_level, wh->stage_base, sc, &ignored))
				return false;   /* the staged slot's first ns: a lower bound of all it holds */
			if (!scan_list(wh, head[l][s], sc))
				return false;
		}
	}
	return true;
}

uint64_t wheel_earliest(const struct wheel *wh, uint32_t max_scan, int *inexact)
{
	const struct chime_wheel *w = wh->w;
	struct scan sc = { .min = UINT64_MAX, .max = max_scan };
	uint64_t cut = 0;

	*inexact = 0;
	if (w->expired_head != NIL)
		return wh->nodes[w->expired_head].deadline_ns;  /* due already (<= now_ns) */
	if (wh->raw_head != NIL)
		return wh->nodes[wh->raw_head].deadline_ns;     /* due already too */
	if (!scan_set(wh, (const uint32_t (*)[SLOTS])w->slot, w->occupied, LEVELS, w->now_tick, &sc, &cut)) {
		*inexact = 1;
		return cut;
	}
	return sc.min;
}

/* ---- rebuild and check ------------------------------------------------------ */

/* A node state rebuild can judge: one of CHIME_NODE_*, and a generation ids can carry. */
static bool node_sane(const struct chime_node *n)
{
	if (n->state > CHIME_NODE_ACKWAIT)
		return false;
	return n->state == CHIME_NODE_FREE ||
	       ((n->gen & CHIME_ID_GEN_MASK) != 0 &&
		(n->gen & ~(CHIME_ID_GEN_MASK | CHIME_NODE_FLAGS)) == 0);
}

int wheel_rebuild(struct wheel *wh, void *mem, size_t len, uint32_t capacity,
		  uint64_t resolution_ns, uint64_t now_ns, struct wheel_rebuild_stats *st)
{
	struct chime_wheel *w = mem;
	struct wheel_rebuild_stats local;

	if (!st)
		st = &local;
	*st = (struct wheel_rebuild_stats){ 0 };
	/* the caller's geometry, not the header's, says how much to read */
	if (!wh || !mem || (uintptr_t)mem % CHIME_CACHELINE || capacity == 0 || capacity == NIL ||
	    resolution_ns == 0 || len < wheel_region_size(capacity) ||
	    w->slab_off != sizeof(*w) || w->capacity != capacity ||
	    w->resolution_ns != resolution_ns || w->high_water > capacity)
		return -EINVAL;
	if (free_map(wh, capacity) < 0)
		return -ENOMEM;
	clear_lists(wh, w);
	handle_init(wh, mem);
	w->now_ns = now_ns;
	w->now_tick = tick_of(wh, now_ns);
	wh->cur_min_ns = UINT64_MAX;
	for (uint32_t i = w->high_water; i-- > 0;) {
		struct chime_node *n = &wh->nodes[i];

		if (!node_sane(n)) {
			st->dropped++;
			n->state = CHIME_NODE_FREE;
		}
		switch (n->state) {
		case CHIME_NODE_FREE:
			n->gen &= CHIME_ID_GEN_MASK;
			wheel__free_mark(wh, i);
			break;
		case CHIME_NODE_ARMED:
		case CHIME_NODE_EXPIRED:
			wh->armed++;
			st->due += n->deadline_ns <= now_ns;
			place(wh, n, i);
			break;
		default:
			break;
		}
	}
	return 0;
}

static void __attribute__((noreturn, format(printf, 1, 2))) check_fail(const char *fmt, ...);
static uint64_t check_free_map(const struct wheel *wh);

static void check_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("wheel_check: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

#define CHECK(cond, ...) do { if (!(cond)) check_fail(__VA_ARGS__); } while (0)

/*
 * One set of slot lists, placed relative to tick T (the wheel's own: now;
 * the staged ones: the staged slot's first tick). Returns the nodes on it.
 */
static uint64_t check_set(const struct wheel *wh, const uint32_t (*head)[SLOTS],
			  const uint32_t (*tail)[SLOTS], const uint64_t (*min)[SLOTS],
			  const uint64_t (*max)[SLOTS], const uint64_t *occupied, unsigned levels,
			  uint64_t T, const char *set)
{
	const struct chime_wheel *w = wh->w;
	const struct chime_node *nodes = wh->nodes;
	bool own = head == (const uint32_t (*)[SLOTS])w->slot;
	uint64_t on = 0;

	for (unsigned l = 0; l < levels; l++) {
		for (unsigned s = 0; s < SLOTS; s++) {
			uint32_t i = head[l][s], prev = NIL;
			int bit = (int)(occupied[l] >> s & 1);

			/* I2, I8: the slot being staged stays occupied while it is */
			CHECK(bit == (i != NIL) || (own && bit && is_staged_slot(wh, l, s)),
			      "%s level %u slot %u: bit %d, head %u", set, l, s, bit, i);
			/* occupied slots lie ahead of T: level 0 at or after its digit, above: after */
			CHECK(!bit || s > slot_of(T, l) || (l == 0 && s == slot_of(T, 0)),
			      "%s level %u slot %u occupied, behind tick %llu", set, l, s,
			      (unsigned long long)T);
			for (uint64_t k = 0; i != NIL; k++) {
				const struct chime_node *n;
				uint64_t t;

				CHECK(i < w->high_water, "%s slot %u/%u: index %u", set, l, s, i);
				CHECK(k < w->capacity, "%s slot %u/%u: cycle", set, l, s);
				n = &nodes[i];
				t = tick_of(wh, n->deadline_ns);
				CHECK(n->state == CHIME_NODE_ARMED, "node %u on %s slot %u/%u in state %u",
				      i, set, l, s, n->state);
				CHECK(n->prev == prev, "node %u: prev %u, expected %u", i, n->prev, prev);
				/* where place() puts it, or (lazily reset) an earlier slot */
				CHECK(n->level == l && slot_base(T, l, s) <= t &&
				      (level_of(t, T) > l || (level_of(t, T) == l && slot_of(t, l) >= s)),
				      "node %u (tick %llu, level %u) on %s slot %u/%u at tick %llu", i,
				      (unsigned long long)t, n->level, set, l, s, (unsigned long long)T);
				CHECK(n->deadline_ns > w->now_ns, "node %u armed but due", i);
				CHECK(t >= T, "node %u behind its set's tick", i);
				if (own && l == 0 && s == slot_of(T, 0))
					CHECK(n->deadline_ns >= wh->cur_min_ns, "node %u below cur_min", i);
				CHECK(n->deadline_ns >= min[l][s], "node %u below its slot's minimum", i);
				/* level 0: its own tick's slot, under the slot's maximum, unless a lazy reset made that unknown */
				CHECK(l > 0 || max[0][s] == UINT64_MAX ||
				      (level_of(t, T) == 0 && slot_of(t, 0) == s && n->deadline_ns <= max[0][s]),
				      "node %u (tick %llu) on %s level-0 slot %u, maximum %llu", i,
				      (unsigned long long)t, set, s, (unsigned long long)max[0][s]);
				on++;
				prev = i;
				i = n->next;
			}
			CHECK(tail[l][s] == prev, "%s level %u slot %u: tail %u, last %u", set, l, s,
			      tail[l][s], prev);
		}
	}
	return on;
}

/* I4: the map's bits are the FREE nodes, and each level sums the one below. Returns the FREE count. */
static uint64_t check_free_map(const struct wheel *wh)
{
	const struct chime_wheel *w = wh->w;
	uint64_t words = (w->capacity + UINT64_C(63)) / 64, on = 0;

	CHECK(wh->free_levels >= 1 && wh->free_levels <= WHEEL_FREE_LEVELS, "free map: %u levels",
	      wh->free_levels);
	for (uint64_t i = 0; i < words * 64; i++) {
		bool bit = wh->free_bits[0][i / 64] >> (i % 64) & 1;

		CHECK(bit == (i < w->high_water && wh->nodes[i].state == CHIME_NODE_FREE),
		      "free map: node %llu bit %d", (unsigned long long)i, bit);
		on += bit;
	}
	for (unsigned l = 1; l < wh->free_levels; l++) {
		uint64_t below = words;

		words = (words + 63) / 64;
		for (uint64_t j = 0; j < below; j++)
			CHECK((wh->free_bits[l][j / 64] >> (j % 64) & 1) == (wh->free_bits[l - 1][j] != 0),
			      "free map: level %u bit %llu", l, (unsigned long long)j);
	}
	CHECK(words == 1, "free map: %u levels leave %llu top words", wh->free_levels,
	      (unsigned long long)words);
	return on;
}

void wheel_check(const struct wheel *wh)
{
	const struct chime_wheel *w = wh->w;
	const struct chime_node *nodes = wh->nodes;
	uint64_t T = w->now_tick, cnt[256] = { 0 }, on_slots, on_exp = 0, on_raw = 0, on_free = 0;

	CHECK(w->slab_off == sizeof(*w), "slab_off %llu", (unsigned long long)w->slab_off);
	CHECK(w->high_water <= w->capacity, "high_water %u > capacity %u", w->high_water, w->capacity);
	CHECK(T == tick_of(wh, w->now_ns), "now_tick %llu is not the tick of now_ns",
	      (unsigned long long)T);
	CHECK(tick_of(wh, w->now_ns) == w->now_ns / w->resolution_ns, "tick math is wrong");

	on_slots = check_set(wh, (const uint32_t (*)[SLOTS])w->slot, (const uint32_t (*)[SLOTS])wh->tail,
			     (const uint64_t (*)[SLOTS])wh->slot_min, (const uint64_t (*)[SLOTS])wh->slot_max,
			     w->occupied, LEVELS, T, "own");
	if (wh->staging) {
		/* I8 */
		CHECK(wh->stage_level >= 1 && wh->stage_level < LEVELS && wh->stage_slot < SLOTS,
		      "staging level %u slot %u", wh->stage_level, wh->stage_slot);
		CHECK(w->occupied[wh->stage_level] >> wh->stage_slot & 1, "staged slot not occupied");
		CHECK(wh->stage_base == slot_base(T, wh->stage_level, wh->stage_slot),
		      "staged slot's first tick %llu", (unsigned long long)wh->stage_base);
	}
	for (unsigned l = wh->staging ? wh->stage_level : 0; l < LEVELS; l++)
		CHECK(wh->st_occupied[l] == 0, "staged lists at level %u", l);
	on_slots += check_set(wh, (const uint32_t (*)[SLOTS])wh->st_head, (const uint32_t (*)[SLOTS])wh->st_tail,
			      (const uint64_t (*)[SLOTS])wh->st_min, (const uint64_t (*)[SLOTS])wh->st_max,
			      wh->st_occupied,
			      wh->staging ? wh->stage_level : 0, wh->stage_base, "staged");

	{
		uint32_t i = w->expired_head, prev = NIL;
		unsigned seen_pending = 0;
		bool in_front = wh->fresh_tail != NIL;
		uint64_t due = 0, front = 0;
		uint32_t owner_n[WHEEL_JUMP_OWNERS] = { 0 }, group_n[WHEEL_JUMP_OWNERS] = { 0 };

		for (uint64_t k = 0; i != NIL; k++) {
			const struct chime_node *n;

			CHECK(i < w->high_water && k < w->capacity, "expired list: index %u", i);
			n = &nodes[i];
			CHECK(n->state == CHIME_NODE_EXPIRED, "node %u expired list, state %u", i, n->state);
			CHECK(n->prev == prev, "expired node %u: prev %u, expected %u", i, n->prev, prev);
			CHECK(n->deadline_ns <= w->now_ns, "expired node %u not due", i);
			CHECK(n->level == EXP_DUE || n->level == EXP_PENDING || n->level == EXP_FRONT,
			      "expired node %u level", i);
			if (n->level == EXP_PENDING)
				seen_pending = 1;
			else
				CHECK(!seen_pending, "due node %u after a pending one", i);
			/* the front (wheel_pop_expired()) is a run of EXP_FRONT nodes from the head */
			CHECK(in_front == (n->level == EXP_FRONT), "expired node %u: level %u, %s the front", i,
			      n->level, in_front ? "in" : "not in");
			due += n->level != EXP_PENDING;
			owner_n[n->owner % WHEEL_JUMP_OWNERS] += n->level != EXP_PENDING;
			front += n->level == EXP_FRONT;
			group_n[(wh->group_of ? wh->group_of[n->owner] : n->owner) % WHEEL_JUMP_OWNERS] +=
				n->level == EXP_FRONT;
			if (i == wh->fresh_tail)
				in_front = false;
			on_exp++;
			prev = i;
			i = n->next;
		}
		CHECK(w->expired_tail == prev, "expired_tail %u, last %u", w->expired_tail, prev);
		CHECK(!in_front, "the expired list's front ends at %u, not on the list", wh->fresh_tail);
		CHECK(due == wh->due_n && front == wh->front_n, "%llu due, %llu in front; counted %llu and %llu",
		      (unsigned long long)due, (unsigned long long)front, (unsigned long long)wh->due_n,
		      (unsigned long long)wh->front_n);
		for (unsigned o = 0; o < WHEEL_JUMP_OWNERS; o++)
			CHECK(owner_n[o] == wh->owner_due[o], "owners %u mod %u: %u due, counted %u", o,
			      WHEEL_JUMP_OWNERS, owner_n[o], wh->owner_due[o]);
		for (unsigned g = 0; g < WHEEL_JUMP_OWNERS; g++)
			CHECK(group_n[g] == wh->group_front[g], "groups %u mod %u: %u in front, counted %u", g,
			      WHEEL_JUMP_OWNERS, group_n[g], wh->group_front[g]);
	}

	{
		/* raw: ARMED level-0 nodes of a slot made due whole, all due */
		uint32_t i = wh->raw_head, prev = NIL;

		for (uint64_t k = 0; i != NIL; k++) {
			const struct chime_node *n;

			CHECK(i < w->high_water && k < w->capacity, "raw list: index %u", i);
			n = &nodes[i];
			CHECK(n->state == CHIME_NODE_ARMED && n->level == 0, "raw node %u: state %u level %u", i,
			      n->state, n->level);
			CHECK(n->prev == prev, "raw node %u: prev %u, expected %u", i, n->prev, prev);
			CHECK(n->deadline_ns <= w->now_ns, "raw node %u not due", i);
			on_raw++;
			prev = i;
			i = n->next;
		}
		CHECK(wh->raw_tail == prev, "raw_tail %u, last %u", wh->raw_tail, prev);
	}

	on_free = check_free_map(wh);

	for (uint32_t i = 0; i < w->high_water; i++) {
		cnt[nodes[i].state]++;
		if (nodes[i].state != CHIME_NODE_FREE)
			CHECK((nodes[i].gen & CHIME_ID_GEN_MASK) != 0 &&
			      (nodes[i].gen & ~(CHIME_ID_GEN_MASK | CHIME_NODE_FLAGS)) == 0,
			      "node %u gen %u", i, nodes[i].gen);
	}
	CHECK(cnt[CHIME_NODE_ARMED] == on_slots + on_raw, "%llu ARMED, %llu on slots, %llu raw",
	      (unsigned long long)cnt[CHIME_NODE_ARMED], (unsigned long long)on_slots,
	      (unsigned long long)on_raw);
	CHECK(cnt[CHIME_NODE_EXPIRED] == on_exp, "%llu EXPIRED, %llu on expired list",
	      (unsigned long long)cnt[CHIME_NODE_EXPIRED], (unsigned long long)on_exp);
	CHECK(cnt[CHIME_NODE_FREE] == on_free, "%llu FREE, %llu in the free map",
	      (unsigned long long)cnt[CHIME_NODE_FREE], (unsigned long long)on_free);
	CHECK(wh->armed == on_slots + on_raw + on_exp, "armed %llu, ARMED+EXPIRED %llu",
	      (unsigned long long)wh->armed, (unsigned long long)(on_slots + on_raw + on_exp));
}
