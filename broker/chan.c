/* SPDX-License-Identifier: MIT */
/*
 * chan.c - one client's channel on one shard. See chan.h and ARCHITECTURE.md.
 *
 * Node life cycle of a client's timer in this shard (states from chime_shm.h):
 *
 *   FREE -alloc-> GRANTED -ARM-> ARMED -advance-> EXPIRED -pop-> ALLOC
 *   ALLOC -deliver-> ACKWAIT (one-shot) | ARMED (periodic, re-armed: cq_pos
 *   CHAN_POS_AT | the event's deadline until the node is back on the wheel,
 *   then the event's position; each step in the shard file reads as that event)
 *   ALLOC -ring full, or backlog non-empty, or periodic's event unconsumed-> BACKLOG
 *   BACKLOG -room-> deliver;  ACKWAIT -client consumed-> FREE
 *   CANCEL: any of these -> FREE (voiding an unconsumed event)
 *   PARK (a session's process gone): GRANTED -> FREE; ACKWAIT -> BACKLOG if
 *   its event is voided, else FREE (across the CAS: cq_pos CHAN_POS_OLD |
 *   CHAN_POS_UNSURE | pos, settled by the claim word if killed there);
 *   whatever fires -> BACKLOG until REATTACH
 *   PARK for a broker stop (handover), restore: GRANTED -> carried (GRANTED,
 *   cq_pos CARRIED, on ch->carried) -re-submitted ARM-> ARMED; -RESUMED-> FREE
 *   PARK, restore: a periodic's untaken event in the old ring: ARMED (the
 *   park's CAS as above) -tag cq_pos CHAN_POS_AT-> ALLOC -> BACKLOG
 *   (chan_hold_at(): each step in the shard file reads as that held event);
 *   a periodic held (BACKLOG) behind its untaken event: the same CAS (cq_pos
 *   | CHAN_POS_BEHIND across it), then held at that event's deadline
 *   REATTACH of a resuming library: nothing delivered until its word (the
 *   old ring's head and claim words, in the new ring's): settle() by it
 *
 * Invariants:
 * - a node owned by a client has node.owner == its slot, and ch->owned counts
 *   them exactly (so reclaim can stop early); ch->user->owned is the sum of
 *   owned over the channels of that user in the shard (chan_own/disown);
 * - GRANTED nodes are exactly the entries of ch->grants[] that are ids (not
 *   no-grant markers), and ch->marked counts the markers;
 * - armed/held nodes (not GRANTED) are in the key index;
 * - a node has at most one unconsumed event (node.cq_pos), so a client that
 *   does not drain holds back only its own events, in order (the backlog);
 * - the backlog is strictly FIFO: while it is non-empty, new expirations join
 *   its tail, so the client sees events in firing order.
 *
 * Cost: every operation is O(1) except CANCEL_KEY (the bucket's chain) and
 * reclaim (O(high_water) in the worst case, done in budgeted steps).
 */
#include "chan.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "atomics.h"
#include "clock.h"
#include "segment.h"
#include "wall.h"

#define NODE(sc, i) wheel_node(&(sc)->wh, (i))
#define CQ_AHEAD 8u             /* completion slots prefetched ahead of the one being written */
#define unlikely(x) __builtin_expect(!!(x), 0)

/* ---- node lists (backlog, ackwait) through node.next/prev ---- */

static void nl_push(struct shard_core *sc, struct nlist *l, uint32_t idx)
{
	struct chime_node *n = NODE(sc, idx);

	n->next = CHIME_NIL;
	n->prev = l->tail;
	if (l->tail != CHIME_NIL)
		NODE(sc, l->tail)->next = idx;
	else
		l->head = idx;
	l->tail = idx;
}

static void nl_del(struct shard_core *sc, struct nlist *l, uint32_t idx)
{
	struct chime_node *n = NODE(sc, idx);

	if (n->prev != CHIME_NIL)
		NODE(sc, n->prev)->next = n->next;
	else
		l->head = n->next;
	if (n->next != CHIME_NIL)
		NODE(sc, n->next)->prev = n->prev;
	else
		l->tail = n->prev;
	n->next = n->prev = CHIME_NIL;
}

/*
 * nl_del() of a list's first node, inline: chan_service() frees every
 * consumed one-shot this way, one per event (nl_del()'s call and its
 * middle-of-list case cost 16 instructions each, callgrind).
 */
static inline uint32_t nl_pop_front(struct shard_core *sc, struct nlist *l)
{
	uint32_t idx = l->head;
	struct chime_node *n = NODE(sc, idx);

	l->head = n->next;
	if (n->next != CHIME_NIL)
		NODE(sc, n->next)->prev = CHIME_NIL;
	else
		l->tail = CHIME_NIL;
	n->next = n->prev = CHIME_NIL;
	return idx;
}

/* ---- node ownership ---- */

/*
 * A fresh node granted to this client; returns its id, or 0 if the slab is
 * full. Its reserved part running out is not full: a pass can grant more
 * nodes than the shard reserves ahead (every client attaching at once,
 * each with sq-size grants), and refusing them would be an -ENOMEM with
 * capacity to spare.
 */
static inline void touch_want(const struct shard_core *sc, struct chan *ch, uint32_t idx);

static uint64_t grant_new(struct shard_core *sc, struct chan *ch)
{
	uint32_t idx = wheel_alloc(&sc->wh);
	struct chime_node *n;

	if (idx == CHIME_NIL && sc->grow && sc->grow(sc))
		idx = wheel_alloc(&sc->wh);
	if (idx == CHIME_NIL)
		return 0;
	n = NODE(sc, idx);
	n->owner = ch->slot;
	n->state = CHIME_NODE_GRANTED;
	n->cq_pos = CHIME_POS_NONE;     /* never CHIME_POS_CARRIED: only the slot's record may arm it */
	keyidx_leave_out(n);
	chan_own(ch);
	if (ch->touch_ready)
		touch_want(sc, ch, idx);
	return chime_id_make(n->gen, sc->shard, idx);
}

static void grant_free(struct shard_core *sc, struct chan *ch, uint64_t id)
{
	wheel_free(&sc->wh, chime_id_index(id));
	chan_disown(ch);
}

/*
 * Free an armed or held node (on no wheel or channel list any more). Inline
 * everywhere: GCC left it a call, and one-shot expiry frees a node per event
 * (with nl_pop_front(): 295 -> 264 shard instructions per expired event,
 * callgrind of chime-bench apply). FREE
 * first, then out of its key chain (a cache miss or two) if it is in one:
 * a broker killed in between leaves a FREE node (the next one rebuilds
 * the free map and leaves every node out of the index), never one in a
 * passing state that restore.c would have to guess about (an ALLOC node
 * due was being fired, not freed).
 */
static inline __attribute__((always_inline)) void node_release(struct shard_core *sc, struct chan *ch,
								  uint32_t idx)
{
	wheel_free_unlisted(&sc->wh, idx);
	if (keyidx_linked(NODE(sc, idx)))
		keyidx_remove(&sc->ki, idx);
	else
		ch->unindexed--;
	chan_disown(ch);
}

/* ---- grants carried over for a reconnecting library ---- */

/* In a GRANTED node's cq_pos (unused otherwise): kept from old rings, on ch->carried. */
#define CHIME_POS_CARRIED (CHIME_POS_NONE - 1)

void chan_carry(struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	struct chime_node *n = NODE(sc, idx);

	n->state = CHIME_NODE_GRANTED;
	n->cq_pos = CHIME_POS_CARRIED;
	/*
	 * A grant has no flags. An ARM the old shard was applying when it
	 * was killed had set its own (a wall-clock one's base among them);
	 * left, its re-submission kept a base a walk had since moved off,
	 * and fired a whole step early (a review).
	 */
	n->gen &= CHIME_ID_GEN_MASK;
	keyidx_leave_out(n);
	nl_push(sc, &ch->carried, idx);
	ch->nr_carried++;
}

static void carried_free(struct shard_core *sc, struct chan *ch)
{
	uint32_t idx;

	while ((idx = ch->carried.head) != CHIME_NIL) {
		nl_del(sc, &ch->carried, idx);
		NODE(sc, idx)->cq_pos = CHIME_POS_NONE;
		wheel_free(&sc->wh, idx);
		chan_disown(ch);
	}
	ch->nr_carried = 0;
	ch->resuming = 0;
}

void chan_forget_carried(struct shard_core *sc, struct chan *ch)
{
	carried_free(sc, ch);
}

/* The carried node a re-submitted ARM names, taken off the list; else CHIME_NIL. */
static uint32_t carried_take(struct shard_core *sc, struct chan *ch, uint64_t id)
{
	uint32_t idx = chime_id_index(id);
	struct chime_node *n;

	if (!ch->nr_carried || chime_id_shard(id) != sc->shard || idx >= sc->capacity ||
	    idx >= sc->wh.w->high_water)
		return CHIME_NIL;
	n = NODE(sc, idx);
	if (n->state != CHIME_NODE_GRANTED || n->owner != ch->slot || n->cq_pos != CHIME_POS_CARRIED ||
	    (n->gen & CHIME_ID_GEN_MASK) != chime_id_gen(id) || chime_id_gen(id) == 0)
		return CHIME_NIL;
	nl_del(sc, &ch->carried, idx);
	ch->nr_carried--;
	return idx;
}

/*
 * Counters (stats.h definitions): "armed" counts timers on the wheel plus
 * periodic timers in a backlog (chan_counts_as_armed()); a one-shot leaves
 * it when it fires. These two cover what stats.h has no call for: a fired
 * one-shot that a reset brings back to the wheel, and the cancel of one
 * that already fired.
 */
static void stats_rearmed(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	st->sh.armed++;
	if (c)
		c->armed++;
}

static void stats_cancel_fired(struct stats *st, uint32_t slot, uint64_t n)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	st->sh.cancels += n;
	if (c)
		c->cancels += n;
}

/* A node about to be freed: if it was an armed wall-clock timer, one fewer (armed_realtime). */
static void wall_disarm(struct shard_core *sc, const struct chime_node *n)
{
	if ((n->gen & CHIME_NODE_REALTIME) && chan_counts_as_armed(n))
		stats_disarmed_realtime(sc->st, 1);
}

static void backlog_del(struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	nl_del(sc, &ch->backlog, idx);
	ch->nr_backlog--;
	sc->backlog--;
}

/*
 * Void the node's unconsumed event, if any: true if the client will skip it,
 * false if it had taken it already (or there was none). The claim CAS in
 * chime_cq_void() decides; the position check only spares it when the
 * client is known to be past it.
 */
static bool event_void_at(struct chan *ch, uint64_t pos)
{
	/* An old ring's position (CHAN_POS_OLD) names no slot of this one. */
	if (pos == CHIME_POS_NONE || chan_pos_old(pos) || chime_cq_consumed(&ch->cq, pos))
		return false;
	return chime_cq_void(&ch->cq, pos);
}

static bool event_void(struct chan *ch, struct chime_node *n)
{
	uint64_t pos = n->cq_pos;

	n->cq_pos = CHIME_POS_NONE;
	return event_void_at(ch, pos);
}

/* Positions the client consumed that periodics_taken() has not looked at yet. */
static inline bool periodics_behind(const struct chan *ch)
{
	return ch->taken_seen < ch->periodic_end && ch->taken_seen < ch->cq.head;
}

/*
 * The process took the events below the head it published: each periodic
 * among them forgets that event's position in its node (a one-shot's node
 * is freed, chan_service_n()), so that the shard file says so at once.
 * Before, the node kept it until the timer's next firing, and a broker and
 * process both killed meanwhile had the session's next process get that
 * event again. Slots from taken_seen on are intact: room_refresh() keeps
 * the shard from writing over them until this has passed them.
 * At most *budget positions (taken from it): a user's 64 connections
 * moving their heads past 30000 periodic events each at once held the
 * shard 9.9 ms in one pass (--cq-size 65536); the rest waits for the
 * next call.
 */
static void periodics_taken(struct shard_core *sc, struct chan *ch, uint32_t *budget)
{
	uint64_t end = ch->cq.head < ch->periodic_end ? ch->cq.head : ch->periodic_end;
	bool all = end - ch->taken_seen <= *budget;

	if (!all)
		end = ch->taken_seen + *budget;
	*budget -= (uint32_t)(end - ch->taken_seen);
	for (uint64_t pos = ch->taken_seen; pos < end; pos++) {
		const struct chime_cqe *e = &ch->cq.slots[pos & ch->cq.mask];
		uint32_t idx = chime_id_index(e->id);     /* our own slot, in the client's read-only segment */
		struct chime_node *n;

		if (!(e->flags & CHIME_CQE_PERIODIC) || idx >= sc->wh.w->high_water)
			continue;
		n = NODE(sc, idx);
		if (n->owner == ch->slot && n->cq_pos == pos)
			n->cq_pos = CHIME_POS_NONE;
	}
	ch->taken_seen = all ? ch->cq.head : end;
}

/*
 * Free completion slots, the head read again (every read of it goes
 * through here): none whose position periodics_taken() has yet to read.
 */
static uint32_t room_refresh(struct shard_core *sc, struct chan *ch)
{
	uint32_t room = chime_cq_room(&ch->cq);

	(void)sc;
	/* Written over already: no periodic's position there was left unread (no room was given for it). */
	if (ch->cq.tail - ch->taken_seen > ch->cq.size)
		ch->taken_seen = ch->cq.tail - ch->cq.size;
	if (periodics_behind(ch) && ch->taken_seen + ch->cq.size - ch->cq.tail < room)
		room = (uint32_t)(ch->taken_seen + ch->cq.size - ch->cq.tail);
	return room;
}

/* True if the node's previous event is still in the client's hands (refreshes the head once). */
static bool event_unconsumed(struct shard_core *sc, struct chan *ch, struct chime_node *n)
{
	if (n->cq_pos == CHIME_POS_NONE || chan_pos_old(n->cq_pos))
		return false;
	if (chime_cq_consumed(&ch->cq, n->cq_pos))
		return false;
	ch->room = room_refresh(sc, ch);
	return !chime_cq_consumed(&ch->cq, n->cq_pos);
}

/*
 * A deadline already past when armed (0 is allowed): its "lateness" would be
 * the age of the deadline, not the broker's delay, so it is counted apart.
 * The wheel's clock is the last advance: at most an iteration old.
 */
static void mark_immediate(struct shard_core *sc, struct chime_node *n, uint64_t deadline_ns)
{
	if (deadline_ns < sc->wh.w->now_ns)
		n->gen |= CHIME_NODE_IMMEDIATE;
	else
		n->gen &= ~CHIME_NODE_IMMEDIATE;
}

/* ---- wall-clock timers (ARCHITECTURE.md, "Wall-clock timers") ---- */

/* d + off, kept within [1, UINT64_MAX]: 0 would read as "armed at 0" to restore.c. */
static inline uint64_t wall_add(uint64_t d, int64_t off)
{
	if (off >= 0)
		return d > UINT64_MAX - (uint64_t)off ? UINT64_MAX : d + (uint64_t)off;
	return d <= -(uint64_t)off ? 1 : d + (uint64_t)off;
}

/*
 * wall_add() for a node's own deadline: a periodic's that would fall
 * before the boot (below 1: CLOCK_MONOTONIC cannot hold it) goes whole
 * periods ahead instead, to the first after the boot, so that its events
 * keep deadline + k x period. Clamped to the boot, as a one-shot is, it
 * fired at boot + k x period for good (an "on the hour" timer of a device
 * that booted with its clock behind, stepped forward by NTP: off the hour
 * ever after). The periods before the boot are skipped: no deadline of
 * this clock can stand for them. Not for an event's deadline (a held one,
 * CHAN_POS_AT): that is the event's own, and stays as wall_add() has it.
 */
static uint64_t wall_add_node(const struct chime_node *n, uint64_t d, int64_t off)
{
	__extension__ typedef __int128 i128;
	i128 v = (i128)d + off;

	if (v >= 1 || !n->period_ns)
		return wall_add(d, off);
	v += (1 - v + (i128)n->period_ns - 1) / (i128)n->period_ns * (i128)n->period_ns;
	return (uint64_t)v;     /* in [1, period_ns] */
}

/* The offset wall-clock node n's deadline is based on. */
static inline int64_t wall_base(const struct shard_core *sc, const struct chime_node *n)
{
	return sc->wall_off[(n->gen & CHIME_NODE_WALL_B) != 0];
}

/* A deadline of node n's (CLOCK_MONOTONIC) in its own clock: an event's deadline_ns. */
static inline uint64_t clock_deadline(const struct shard_core *sc, const struct chime_node *n, uint64_t d)
{
	return unlikely(n->gen & CHIME_NODE_REALTIME) ? wall_add(d, wall_base(sc, n)) : d;
}

/* A deadline in node n's clock (an event's) as the wheel's CLOCK_MONOTONIC. */
static inline uint64_t wheel_deadline(const struct shard_core *sc, const struct chime_node *n, uint64_t d)
{
	return unlikely(n->gen & CHIME_NODE_REALTIME) ? wall_add(d, -wall_base(sc, n)) : d;
}

/* The same for a deadline the node takes (a record's): a periodic's keeps its phase (wall_add_node()). */
static inline uint64_t node_deadline(const struct shard_core *sc, const struct chime_node *n, uint64_t d)
{
	return unlikely(n->gen & CHIME_NODE_REALTIME) ? wall_add_node(n, d, -wall_base(sc, n)) : d;
}

/* The deadline of node n's event at pos in the ring (the broker's own slot), as the wheel's. */
static inline uint64_t event_deadline(const struct shard_core *sc, const struct chan *ch,
				      const struct chime_node *n, uint64_t pos)
{
	return wheel_deadline(sc, n, ch->cq.slots[pos & ch->cq.mask].deadline_ns);
}

/* Persist the offsets: offset `i` now (before any node is based on it), or wall_cur. */
static void wall_file_off(struct shard_core *sc, uint32_t i)
{
	if (sc->wall_file)
		at_store(&sc->wall_file->wall_off[i], sc->wall_off[i]);
}

static void wall_file_cur(struct shard_core *sc)
{
	if (sc->wall_file)
		at_store(&sc->wall_file->wall_cur, sc->wall_cur);
}

/*
 * Node idx, based on `from`, now on `to`: the same wall deadline, whatever
 * its state. Made due by a step of the wall clock, its lateness is the
 * step's, not the broker's: counted as armed already due (mark_immediate()).
 */
static void wall_move(struct shard_core *sc, uint32_t idx, int64_t from, int64_t to)
{
	struct chime_node *n = NODE(sc, idx);
	/* not yet fired (a popped one's fire checks the wall clock again): its phase kept; a held event is that event */
	bool unfired = n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED || n->state == CHIME_NODE_ALLOC;
	uint64_t d = unfired ? wall_add_node(n, n->deadline_ns, from - to) : wall_add(n->deadline_ns, from - to);

	if (d < sc->wh.w->now_ns && n->deadline_ns >= sc->wh.w->now_ns)
		n->gen |= CHIME_NODE_IMMEDIATE;

	/* A periodic's event being held again: its deadline is in the tag too (chan.h). */
	if (chan_pos_at(n->cq_pos)) {
		uint64_t at = wall_add(chan_pos_at_deadline(n->cq_pos), from - to);

		n->cq_pos = CHAN_POS_AT | (at < CHAN_POS_AT ? at : CHAN_POS_AT - 1);
	}
	if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED)
		wheel_reset(&sc->wh, idx, d);
	else
		n->deadline_ns = d;
}

/* wall_listed's bytes: a bit per node of the slab. */
static size_t wall_listed_len(const struct shard_core *sc)
{
	return ((size_t)sc->capacity + 63) / 64 * sizeof(uint64_t);
}

/*
 * No list from now on: walks scan the used slab. A walk under way over the
 * list starts again over the slab (a node it moved already moves no more,
 * wall_rebase()): going on, it read list positions as node indices and
 * left the nodes it missed on the old offset, which the next walk then
 * overwrote (a review: 200 of 1024 timers 100 ms late).
 */
static void wall_to_scan(struct shard_core *sc)
{
	sc->wall_scan = true;
	if (sc->wall_walking) {
		sc->wall_walk_i = 0;
		sc->wall_walk_end = sc->wh.w->high_water;
		sc->wall_walk_count = 0;
		sc->wall_walk_nodes0 = sc->wall_nodes;  /* the arm in hand counted already */
	}
}

void chan_wall_note(struct shard_core *sc, uint32_t idx)
{
	if (sc->wall_scan)
		return;
	if (idx >= sc->capacity) {
		wall_to_scan(sc);       /* cannot happen: a node of the slab */
		return;
	}
	if (!sc->wall_listed && !(sc->wall_listed = wheel_bits_map(wall_listed_len(sc)))) {
		wall_to_scan(sc);
		return;
	}
	if (sc->wall_listed[idx / 64] >> (idx % 64) & 1)
		return;
	if (sc->wall_len == sc->wall_cap) {
		uint32_t cap = sc->wall_cap ? sc->wall_cap * 2 : 1024;
		uint32_t *list = realloc(sc->wall_list, (size_t)cap * sizeof(*list));

		if (!list) {
			wall_to_scan(sc);
			return;
		}
		sc->wall_list = list;
		sc->wall_cap = cap;
	}
	sc->wall_list[sc->wall_len++] = idx;
	sc->wall_listed[idx / 64] |= UINT64_C(1) << (idx % 64);
}

void chan_wall_fini(struct shard_core *sc)
{
	free(sc->wall_list);
	wheel_bits_unmap(sc->wall_listed, wall_listed_len(sc));
	sc->wall_list = NULL;
	sc->wall_listed = NULL;
	sc->wall_len = sc->wall_cap = 0;
}

/* A node a walk visits still a wall-clock timer's. */
static inline bool wall_node(const struct chime_node *n)
{
	return n->state != CHIME_NODE_FREE && (n->gen & CHIME_NODE_REALTIME);
}

/*
 * Node idx of the list (or of a scan's end taken before it) still a
 * wall-clock timer's. The list keeps freed nodes until a walk comes, and
 * a give-back may have lowered the high-water mark past them since
 * (slab_give_back()): their storage is a hole, and reading one took it
 * from the filesystem again, or, on a full one, was a SIGBUS (a review,
 * `limits/a_wall_clock_step_after_a_give_back_reads_no_node_given_back`).
 */
static inline bool wall_listed_node(const struct shard_core *sc, uint32_t idx)
{
	return idx < sc->wh.w->high_water && wall_node(NODE(sc, idx));
}

/*
 * How many nodes a walk visits, wall_at(sc, 0..n-1): the list, what is no
 * longer a wall-clock timer's dropped first; without it, the used slab
 * (the caller skips what wall_node() refuses).
 */
static uint32_t wall_walk_len(struct shard_core *sc)
{
	uint32_t kept = 0;

	if (sc->wall_scan)
		return sc->wh.w->high_water;
	for (uint32_t i = 0; i < sc->wall_len; i++) {
		uint32_t idx = sc->wall_list[i];

		if (wall_listed_node(sc, idx))
			sc->wall_list[kept++] = idx;
		else
			sc->wall_listed[idx / 64] &= ~(UINT64_C(1) << (idx % 64));
	}
	sc->wall_len = kept;
	return kept;
}

static inline uint32_t wall_at(const struct shard_core *sc, uint32_t i)
{
	return sc->wall_scan ? i : sc->wall_list[i];
}

/*
 * Every wall-clock node on wall_cur's offset, before a walk overwrites the
 * other one: after a restore, a walk the last broker was killed in may have
 * left some on it. Neither offset changes meanwhile, so a kill here leaves
 * each node's base known too.
 */
static void wall_unmix(struct shard_core *sc)
{
	uint32_t end = wall_walk_len(sc);

	for (uint32_t i = 0; i < end; i++) {
		uint32_t idx = wall_at(sc, i);
		struct chime_node *n = NODE(sc, idx);

		if (!wall_node(n) || !(n->gen & CHIME_NODE_WALL_B) == !sc->wall_cur)
			continue;
		wall_move(sc, idx, wall_base(sc, n), sc->wall_off[sc->wall_cur]);
		at_crash_order();       /* the deadline, then its base */
		n->gen ^= CHIME_NODE_WALL_B;
	}
	sc->wall_mixed = false;
}

/* Node idx moved onto offset `to` (0 or 1): the deadline first, then its base, as a walk does. */
static void wall_rebase(struct shard_core *sc, uint32_t idx, uint32_t to)
{
	struct chime_node *n = NODE(sc, idx);

	if (wall_base(sc, n) != sc->wall_off[to])
		wall_move(sc, idx, wall_base(sc, n), sc->wall_off[to]);
	at_crash_order();       /* the deadline, then its base */
	n->gen = to ? n->gen | CHIME_NODE_WALL_B : n->gen & ~CHIME_NODE_WALL_B;
}

bool chan_wall_step(struct shard_core *sc, uint32_t budget)
{
	uint32_t to = sc->wall_cur ^ 1u, stop;

	if (!sc->wall_walking)
		return false;
	stop = sc->wall_walk_end - sc->wall_walk_i > budget ? sc->wall_walk_i + budget : sc->wall_walk_end;
	for (; sc->wall_walk_i < stop; sc->wall_walk_i++) {
		uint32_t idx = wall_at(sc, sc->wall_walk_i);

		if (!wall_listed_node(sc, idx)) {
			if (!sc->wall_scan)     /* off the list: what is no longer a wall-clock timer's */
				sc->wall_listed[idx / 64] &= ~(UINT64_C(1) << (idx % 64));
			continue;
		}
		if (!sc->wall_scan)
			sc->wall_list[sc->wall_walk_kept++] = idx;
		wall_rebase(sc, idx, to);
		sc->wall_walk_count++;
	}
	if (sc->wall_walk_i < sc->wall_walk_end)
		return true;
	if (!sc->wall_scan) {
		/* the list's tail: arms since the walk began */
		memmove(&sc->wall_list[sc->wall_walk_kept], &sc->wall_list[sc->wall_walk_end],
			(size_t)(sc->wall_len - sc->wall_walk_end) * sizeof(*sc->wall_list));
		sc->wall_len = sc->wall_walk_kept + (sc->wall_len - sc->wall_walk_end);
	}
	/* wall_cur last: a broker killed before it leaves each node's base known */
	at_crash_order();
	sc->wall_cur = to;
	wall_file_cur(sc);
	sc->wall_nodes = sc->wall_walk_count + (sc->wall_nodes - sc->wall_walk_nodes0);
	sc->wall_walking = false;
	if (sc->wall_next_set) {
		/* a step came during this one: the next walk, to the latest offset, from the next step on */
		sc->wall_next_set = false;
		chan_wall_begin(sc, sc->wall_next);
	}
	return sc->wall_walking;
}

void chan_wall_begin(struct shard_core *sc, int64_t off)
{
	uint32_t to;

	if (sc->wall_walking) {
		/*
		 * The other offset is the walk's under way: it goes on in its
		 * steps, and this one is the next walk's (chan_wall_step()).
		 * Ending it here held the shard for the rest of it in one pass.
		 */
		sc->wall_next_set = off != sc->wall_off[sc->wall_cur ^ 1u];
		sc->wall_next = off;
		return;
	}
	if (!sc->wall_nodes) {
		sc->wall_off[sc->wall_cur] = off;
		wall_file_off(sc, sc->wall_cur);
		sc->wall_mixed = false;
		return;
	}
	if (sc->wall_mixed)
		wall_unmix(sc);
	else if (off == sc->wall_off[sc->wall_cur])
		return;
	/* The new base first, the nodes next, wall_cur last: a broker killed in between leaves each node's base known. */
	to = sc->wall_cur ^ 1u;
	sc->wall_off[to] = off;
	wall_file_off(sc, to);
	at_crash_order();
	/* the list as it is, each node looked at once (wall_walk_len() would look at all of them now) */
	sc->wall_walk_end = sc->wall_scan ? sc->wh.w->high_water : sc->wall_len;
	sc->wall_walk_i = sc->wall_walk_kept = 0;
	sc->wall_walk_count = 0;
	sc->wall_walk_nodes0 = sc->wall_nodes;
	sc->wall_walking = true;
}

void chan_wall_follow(struct shard_core *sc, int64_t off)
{
	chan_wall_begin(sc, off);
	while (chan_wall_step(sc, UINT32_MAX))
		;
}

/*
 * A wall-clock node is due by the wheel: is it by the wall clock? If not,
 * it goes back, and true (not fired). Early by a slew the shard has not
 * followed (under WALL_FOLLOW_NS: the control thread follows a slow wall
 * clock by WALL_FOLLOW_BACK_NS, plus what a beat's slew adds), it waits on
 * the expired list, looked at again at each advance, until the wall clock
 * is there: microseconds, and no walk. Early by more (a step not yet
 * followed), the shard begins a walk to the offset it measures now, in
 * steps as any (after the one under way, if that one moved this node
 * already), and the node, if the walk under way has not moved it yet,
 * goes back on the wheel at its moved deadline at once; else it waits,
 * as for a slew, until a walk moves it. A walk at every early firing
 * cost, under a wall clock slewed slower, a walk of the slab per
 * wall-clock timer fired; a whole walk here, in one go, held the shard
 * for all of it at a step back (a hostile-client audit, 2026-12-07).
 */
static __attribute__((noinline)) bool wall_early(struct shard_core *sc, uint32_t idx)
{
	struct chime_node *n = NODE(sc, idx);
	uint64_t due = wall_add(n->deadline_ns, wall_base(sc, n)), now = wall_now_ns();

	if (now >= due)
		return false;
	/*
	 * Back on the wheel first: moved while popped (ALLOC) and the broker
	 * killed before it was armed, its later deadline read as an ARM not
	 * yet applied, a grant, and the timer was lost (a review). Armed, it
	 * moves as any walk moves one: wheel_reset(), the deadline, then the
	 * base.
	 */
	wheel_arm(&sc->wh, idx, n->deadline_ns);
	if (due - now >= (sc->wall_wait_ns ? sc->wall_wait_ns : WALL_FOLLOW_NS)) {
		if (!sc->wall_walking || !(n->gen & CHIME_NODE_WALL_B) != !sc->wall_cur)
			chan_wall_begin(sc, wall_offset_now());
		if (sc->wall_walking && !(n->gen & CHIME_NODE_WALL_B) == !sc->wall_cur)
			wall_rebase(sc, idx, sc->wall_cur ^ 1u);        /* the walk under way has not moved it yet */
	}
	return true;
}

/* ---- touch tables (chime_shm.h, CHIME_TOUCH_BYTES) ---- */

/* Nodes whose words fill a page: their words span at most 2 pages, their tags at most 2. */
#define TOUCH_RUN (4096u / sizeof(uint64_t))
/* Nodes whose words fill the 64 KiB the library allocates at once: mapped in one go (touch_words_check()). */
#define TOUCH_WORD_BLOCK (16u * TOUCH_RUN)
/* Nodes whose tags fill those 64 KiB (chan_touch_check()). */
#define TOUCH_BLOCK 16384u

/* The page of node idx's tag, and whether it was found resident (chan_touch_check(), a bit a page). */
static inline uint64_t touch_tag_page(const struct chan *ch, uint32_t idx)
{
	return ((uintptr_t)&ch->touch_tag[idx] >> ch->touch_page_shift) -
	       ((uintptr_t)ch->touch_tag >> ch->touch_page_shift);
}

static inline bool touch_ready_page(const struct chan *ch, uint32_t idx)
{
	uint64_t p = touch_tag_page(ch, idx);

	return ch->touch_ready[p / 64] >> (p % 64) & 1;
}

/*
 * May the shard read and write node idx's word and tag in the client's
 * table? Only in pages it has mapped itself, having found them resident:
 * the shard never allocates a page of the table (every page is the
 * client's, sealed against punching before it was attached). Found
 * resident is not enough: a page the client alone maps it may page out
 * (MADV_PAGEOUT, on a host with swap), and the shard's next access would
 * wait for the disk; once the broker maps it too, the kernel passes it
 * by. So a run's pages are looked at and mapped off this path, on the
 * shard's aside thread (chan_touch_check(), shard.c, aside.h), and the
 * run is usable once that is done: the RESET_TOUCH that wanted it waits at the head of
 * its ring meanwhile (touch_hold()), and one naming a run with nothing
 * resident to map is a plain reset. At most one run mapped per 128 nodes
 * the client owns, plus 16, so that records naming runs it never wrote
 * cost the shard no syscall each.
 */
static inline bool touch_budget_left(const struct chan *ch)
{
	return ch->touch_runs < ch->owned / 128 + 16 && !ch->touch_failed;
}

static bool touch_page_ok(const struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	uint32_t run = idx / TOUCH_RUN, first = run * TOUCH_RUN;
	uint32_t last = first + TOUCH_RUN > sc->capacity ? sc->capacity - 1 : first + TOUCH_RUN - 1;
	uint32_t block;

	if (!(ch->touch_seen[run / 64] & UINT64_C(1) << (run % 64))) {
		block = idx / TOUCH_WORD_BLOCK;
		if (touch_budget_left(ch))
			ch->touch_word_wants[block / 64] |= UINT64_C(1) << (block % 64);
		return false;
	}
	if (!touch_ready_page(ch, first) || !touch_ready_page(ch, last)) {
		block = first / TOUCH_BLOCK;
		if (touch_budget_left(ch))
			ch->touch_tag_wants[block / 64] |= UINT64_C(1) << (block % 64);
		return false;
	}
	return true;
}

/*
 * A flagged node's deadline came. Its word is the client's latest
 * deadline: later, the timer goes back on the wheel there and nothing is
 * delivered (the touches since the shard last looked cost this one
 * re-arm, counted as a reset); not later, FIRED goes into the word, which
 * sends the client's next resets through the ring, and it fires. Between
 * the load and the fetch-or the client may have moved it: then it is
 * re-armed and FIRED taken back (a failed CAS there: the client wrote the
 * word since, through the ring, whose record follows).
 */
static bool touch_moved(struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	struct chime_node *n = NODE(sc, idx);
	uint64_t *word = &ch->touch_word[idx];
	uint64_t w = at_load(word), now = sc->wh.w->now_ns;

	/*
	 * Later but come already (the shard late, or a client writing past
	 * deadlines): it fires now, for the word's deadline. Put back on the
	 * wheel, it was due again at the next pass, where a word moved again
	 * put it back again: a re-arm a pass, the shard kept awake, and the
	 * timer never fired while its client went on.
	 */
	if ((w & CHIME_TOUCH_FIRED) || w <= n->deadline_ns || w <= now) {
		uint64_t fired;

		w = at_fetch_or(word, CHIME_TOUCH_FIRED);
		if ((w & CHIME_TOUCH_FIRED) || w <= n->deadline_ns)
			return false;
		if (w <= now) {
			mark_immediate(sc, n, w);
			n->deadline_ns = w;
			stats_reset(sc->st, ch->slot);
			return false;
		}
		fired = w | CHIME_TOUCH_FIRED;
		(void)at_cas(word, &fired, w);
	}
	mark_immediate(sc, n, w);
	wheel_arm(&sc->wh, idx, w);
	stats_reset(sc->st, ch->slot);
	return true;
}

/*
 * A one-shot of a client with a table, reset by RESET_TOUCH: flagged, and
 * the tag tells the client so (release: after the deadline the shard
 * took), whose next resets to a later deadline are then a CAS on the word
 * alone. Not at the arm: a flagged node's fire reads its word, a second
 * cache miss at random deadlines (+100-150 ns of broker CPU per fire),
 * which timers that are never reset should not pay. Not past the
 * client's pages (touch_page_ok()): its resets stay records.
 */
static void touch_flag(const struct shard_core *sc, struct chan *ch, struct chime_node *n, uint32_t idx)
{
	if ((n->gen & CHIME_NODE_TOUCH) || !touch_page_ok(sc, ch, idx))
		return;
	n->gen |= CHIME_NODE_TOUCH;
	at_store_rel(&ch->touch_tag[idx], (n->gen & CHIME_ID_GEN_MASK) | CHIME_TOUCH_ON);
}

/* A plain RESET of a flagged node (a client mixing them hurts only itself): the word is not read again. */
static void touch_unflag(struct chan *ch, struct chime_node *n, uint32_t idx)
{
	n->gen &= ~CHIME_NODE_TOUCH;
	at_store_rel(&ch->touch_tag[idx], n->gen & CHIME_ID_GEN_MASK);
}

/*
 * The tags the shard writes at the grant (slot_set()), in pages of the
 * client's table it has mapped only (touch_page_ok() says why): the
 * client allocates its own (libclient: touch_ahead(), a 64 KiB window at
 * a time once it arms many), and the shard learns which are, when idle,
 * with one mincore of the 64 KiB of tags from a grant's on that it found
 * not mapped, and has the resident ones mapped (the check is wanted again
 * by the next such grant, not retried in a loop). Pages found resident
 * stay allocated: the client sealed the table against punching before it
 * was attached.
 */

/*
 * Node idx was granted: if its tag's page, or the one half a block ahead
 * (where the client allocates next), is not mapped yet, look at the
 * block from it on (both), once idle. Not for a client with fewer nodes
 * than a quarter of a block (libclient allocates none ahead for it), and
 * not within TOUCH_CHECK_GRANTS grants of the last look: a page not
 * resident then is looked at again later, not at every idle moment (a
 * mincore every few grants slowed a client's arms at the shard's pace
 * from 21 to 53 ns in `chime-bench e2e`).
 */
#define TOUCH_CHECK_GRANTS 1024u
/* A RESET_TOUCH of a timer due within this is not held for its run (touch_hold()). */
#define TOUCH_HOLD_DUE_NS UINT64_C(10000000)

static inline void touch_want(const struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	uint32_t ahead = idx + TOUCH_BLOCK / 2;

	if (ch->owned < TOUCH_BLOCK / 4 || (ch->touch_wait && --ch->touch_wait))
		return;
	if (!touch_ready_page(ch, idx) || (ahead < sc->capacity && !touch_ready_page(ch, ahead)))
		ch->touch_want = idx + 1;
}

/* First set bit of bits[0, n): its index, or n. */
static uint64_t first_bit(const uint64_t *bits, uint64_t n)
{
	for (uint64_t w = 0; w < (n + 63) / 64; w++)
		if (bits[w])
			return w * 64 + (uint64_t)__builtin_ctzll(bits[w]);
	return n;
}

/*
 * The words of block b: the resident pages' stretch that starts first (or,
 * `from_start`, only one that starts at the block's first page), as the
 * nodes [*lo, *hi) whose words lie wholly in it. False: none. True with
 * *whole: the stretch reaches the block's end.
 */
static bool words_resident(const struct shard_core *sc, const struct chan *ch, uint64_t b, bool from_start,
			   uint64_t *lo, uint64_t *hi, bool *whole)
{
	unsigned char vec[TOUCH_WORD_BLOCK * sizeof(uint64_t) / 4096 + 2];
	uint64_t page = UINT64_C(1) << ch->touch_page_shift, base = (uintptr_t)ch->touch_word, pb;
	uint64_t first = b * TOUCH_WORD_BLOCK;
	uint32_t n = sc->capacity - first < TOUCH_WORD_BLOCK ? (uint32_t)(sc->capacity - first) : TOUCH_WORD_BLOCK;
	int pages = chime_seg_resident(&ch->touch_word[first], (size_t)n * sizeof(uint64_t), vec), i, j;

	for (i = 0; i < pages && !(vec[i] & 1) && !from_start; i++)
		;
	for (j = i; j < pages && (vec[j] & 1); j++)
		;
	if (i == j)
		return false;
	pb = (base + first * sizeof(uint64_t)) & ~(page - 1);
	*lo = (pb + (uint64_t)i * page - base + sizeof(uint64_t) - 1) / sizeof(uint64_t);
	*hi = (pb + (uint64_t)j * page - base) / sizeof(uint64_t);
	*lo = *lo < first ? first : *lo;
	*hi = *hi > first + n ? first + n : *hi;
	*whole = j == pages;
	return *hi > *lo;
}

/*
 * The words of the first blocks a RESET_TOUCH wanted (touch_page_ok()):
 * the runs not yet mapped in the first stretch of resident pages there,
 * through the next wanted blocks while it goes on (a burst of first resets
 * over a client's timers: one populate), as many runs as the budget has
 * left, into *p. A block is what the library allocates at a first reset
 * in it: a 64 KiB window of words.
 */
#define TOUCH_WORD_BLOCKS_MAX 64u       /* 4 MiB of words a populate at most */

static bool touch_words_check(const struct shard_core *sc, struct chan *ch, struct chan_populate *p)
{
	uint64_t blocks = ((uint64_t)sc->capacity + TOUCH_WORD_BLOCK - 1) / TOUCH_WORD_BLOCK, b, lo, hi, l2, h2;
	uint64_t page = UINT64_C(1) << ch->touch_page_shift, base = (uintptr_t)ch->touch_word;
	uint64_t budget = ch->owned / 128 + 16, r_lo, r_hi, unseen = 0;
	bool whole;

	b = first_bit(ch->touch_word_wants, blocks);
	if (b == blocks)
		return false;
	/* Wanted until a look finds nothing more to map there (a stretch at a time) */
	ch->touch_word_wants[b / 64] &= ~(UINT64_C(1) << (b % 64));
	if (ch->touch_runs >= budget)
		return false;
	if (!words_resident(sc, ch, b, false, &lo, &hi, &whole)) {
		ch->touch_runs++;       /* a look at nothing counts as a run: a client naming runs it never wrote */
		return false;
	}
	ch->touch_word_wants[b / 64] |= UINT64_C(1) << (b % 64);
	for (uint64_t k = b + 1; whole && k < blocks && k < b + TOUCH_WORD_BLOCKS_MAX &&
	     (ch->touch_word_wants[k / 64] >> (k % 64) & 1); k++) {
		if (!words_resident(sc, ch, k, true, &l2, &h2, &whole))
			break;
		hi = h2;
	}
	r_lo = (lo + TOUCH_RUN - 1) / TOUCH_RUN;
	r_hi = hi == sc->capacity ? (hi + TOUCH_RUN - 1) / TOUCH_RUN : hi / TOUCH_RUN;
	while (r_lo < r_hi && ch->touch_seen[r_lo / 64] >> (r_lo % 64) & 1)
		r_lo++;         /* mapped by an earlier look */
	for (uint64_t r = r_lo; r < r_hi; r++) {
		if (ch->touch_seen[r / 64] >> (r % 64) & 1)
			continue;
		if (ch->touch_runs + unseen == budget) {
			r_hi = r;
			break;
		}
		unseen++;
	}
	if (!unseen) {
		/* all mapped already: done with these blocks */
		for (uint64_t k = lo / TOUCH_WORD_BLOCK; k <= (hi - 1) / TOUCH_WORD_BLOCK; k++)
			ch->touch_word_wants[k / 64] &= ~(UINT64_C(1) << (k % 64));
		return false;
	}
	ch->touch_runs += unseen;
	lo = r_lo * TOUCH_RUN;
	hi = r_hi * TOUCH_RUN < sc->capacity ? r_hi * TOUCH_RUN : sc->capacity;
	lo = (base + lo * sizeof(uint64_t)) & ~(page - 1);
	hi = (base + hi * sizeof(uint64_t) + page - 1) & ~(page - 1);
	*p = (struct chan_populate){ (void *)lo, (size_t)(hi - lo) };
	ch->touch_pop = TOUCH_POP_WORDS;
	ch->touch_pop_first = (uint32_t)r_lo;
	ch->touch_pop_n = (uint32_t)(r_hi - r_lo);
	return true;
}

/*
 * The first run of resident tag pages not yet mapped, in the block a
 * RESET_TOUCH wanted (touch_page_ok()), else in the one from the node a
 * grant wanted (touch_want()): into *p.
 */
static bool touch_tags_check(struct shard_core *sc, struct chan *ch, struct chan_populate *p)
{
	unsigned char vec[TOUCH_BLOCK * sizeof(uint32_t) / 4096 + 2];
	uintptr_t page = (uintptr_t)1 << ch->touch_page_shift;
	uint64_t blocks = ((uint64_t)sc->capacity + TOUCH_BLOCK - 1) / TOUCH_BLOCK, b;
	uint32_t idx, n;
	int pages, i, j;
	uint64_t p0;

	b = first_bit(ch->touch_tag_wants, blocks);
	if (b < blocks) {
		idx = (uint32_t)b * TOUCH_BLOCK;        /* wanted until a look finds nothing more to map there */
	} else if (ch->touch_want) {
		idx = ch->touch_want - 1;
		ch->touch_want = 0;
		ch->touch_wait = TOUCH_CHECK_GRANTS;
	} else {
		return false;
	}
	n = sc->capacity - idx < TOUCH_BLOCK ? sc->capacity - idx : TOUCH_BLOCK;
	pages = chime_seg_resident(&ch->touch_tag[idx], (size_t)n * sizeof(uint32_t), vec);
	p0 = touch_tag_page(ch, idx);
	for (i = 0; i < pages; i++)
		if ((vec[i] & 1) && !(ch->touch_ready[(p0 + (uint64_t)i) / 64] >> ((p0 + (uint64_t)i) % 64) & 1))
			break;
	for (j = i; j < pages; j++)
		if (!(vec[j] & 1) || ch->touch_ready[(p0 + (uint64_t)j) / 64] >> ((p0 + (uint64_t)j) % 64) & 1)
			break;
	if (i == j) {
		if (b < blocks) {
			ch->touch_tag_wants[b / 64] &= ~(UINT64_C(1) << (b % 64));
			ch->touch_runs++;       /* as a look at words that finds nothing */
		}
		return false;
	}
	*p = (struct chan_populate){
		(void *)(((uintptr_t)&ch->touch_tag[idx] & ~(page - 1)) + (uintptr_t)i * page),
		(size_t)(j - i) * page
	};
	ch->touch_pop = TOUCH_POP_TAGS;
	ch->touch_pop_first = (uint32_t)(p0 + (uint64_t)i);
	ch->touch_pop_n = (uint32_t)(j - i);
	return true;
}

bool chan_touch_check(struct shard_core *sc, struct chan *ch, struct chan_populate *p)
{
	if (!ch->touch_ready || ch->touch_pop)
		return false;
	return touch_words_check(sc, ch, p) || touch_tags_check(sc, ch, p);
}

void chan_touch_populated(struct chan *ch, int res)
{
	/* Not mapped (an old kernel without MADV_POPULATE_WRITE, a fault): its resets stay records. */
	if (res < 0 && res != -EAGAIN)
		ch->touch_failed = 1;
	if (res == 0 && ch->touch_pop == TOUCH_POP_WORDS) {
		for (uint64_t r = ch->touch_pop_first; r < (uint64_t)ch->touch_pop_first + ch->touch_pop_n; r++)
			ch->touch_seen[r / 64] |= UINT64_C(1) << (r % 64);
	} else if (res == 0 && ch->touch_pop == TOUCH_POP_TAGS) {
		for (uint64_t q = ch->touch_pop_first; q < (uint64_t)ch->touch_pop_first + ch->touch_pop_n; q++)
			ch->touch_ready[q / 64] |= UINT64_C(1) << (q % 64);
	}
	ch->touch_pop = 0;
}

/* ---- delivery ---- */

/* Write node idx's event into the ring (room > 0). The caller counts it (stats_deliver_n()). Inline: per event. */
static inline __attribute__((always_inline)) void deliver(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t now_ns)
{
	struct chime_node *n = NODE(sc, idx);
	struct chime_cqe *e = chime_cq_slot(&ch->cq);

	assert(ch->room > 0);
	/*
	 * The slots ahead, for writing: the client read them last, on its own
	 * core. Only slots it has released (room): a line it is still reading
	 * would be pulled away from it. Claim words: a line of eight at a time.
	 */
	if (ch->room > CQ_AHEAD + 8) {
		uint64_t ahead = ch->cq.tail + CQ_AHEAD;

		at_prefetch_w(&ch->cq.slots[ahead & ch->cq.mask]);
		if ((ahead & 7) == 0)
			at_prefetch_w(&ch->cq.claim[ahead & ch->cq.mask]);
	}
	e->id = chime_id_make(n->gen, sc->shard, idx);
	e->key = n->key;
	e->user_data = n->user_data;
	e->deadline_ns = clock_deadline(sc, n, n->deadline_ns);
	e->fired_ns = now_ns;
	e->flags = n->period_ns ? CHIME_CQE_PERIODIC : 0;
	e->_pad = 0;
	e->_reserved[0] = e->_reserved[1] = 0;
	if (n->period_ns) {
		uint64_t pos = chime_cq_push(&ch->cq);

		ch->room--;
		ch->periodic_end = pos + 1;
		/*
		 * F4: the event's deadline in the tag before the next period's
		 * replaces it (wheel_rearm_periodic()), its position after (F5):
		 * a broker killed in between leaves a node that restore.c holds
		 * at this event's deadline (unpublished yet: delivered once).
		 * Before, the position came first, and a node killed with the
		 * next deadline stored but not yet on the wheel read as that
		 * event, fired: a periodic already due again lost this event.
		 */
		n->cq_pos = CHAN_POS_AT | n->deadline_ns;
		at_crash_order();
		n->state = CHIME_NODE_ALLOC;
		wheel_rearm_periodic(&sc->wh, idx);
		/*
		 * Its next period due already (catching up: armed long ago, or
		 * its events taken late): that fire's lateness would be the
		 * schedule's age, not the broker's delay (one client's periodic
		 * at deadline 0 put the uptime in every lateness figure).
		 */
		mark_immediate(sc, n, n->deadline_ns);
		at_crash_order();       /* F5 */
		n->cq_pos = pos;
	} else {
		n->cq_pos = chime_cq_push(&ch->cq);
		ch->room--;
		n->state = CHIME_NODE_ACKWAIT;
		nl_push(sc, &ch->ackwait, idx);
	}
}

/*
 * The counters of a run of expirations alike (one channel, one deadline,
 * the same flags), counted once when the run ends: timers due at one
 * instant come out of the wheel together, and counting each one (a
 * lateness bucket, two histograms, the window) was ~60 instructions per
 * event of ~500.
 */
struct fire_run {
	struct chan *ch;
	uint64_t deadline_ns;
	uint32_t fired;
	uint32_t delivered;
	bool periodic;
	bool immediate;
};

static void run_flush(struct shard_core *sc, struct fire_run *r, uint64_t now_ns)
{
	if (r->fired)
		stats_fire_n(sc->st, r->ch->slot, r->deadline_ns, now_ns, r->periodic, r->immediate, r->fired);
	if (r->delivered)
		stats_deliver_n(sc->st, r->ch->slot, r->delivered);
	r->fired = r->delivered = 0;
}

/* chan_fire(), counted in run r (flushed by the caller). Inline: per event. */
static inline __attribute__((always_inline)) void fire(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t now_ns, struct fire_run *r)
{
	struct chime_node *n = NODE(sc, idx);
	bool periodic = n->period_ns != 0, immediate;

	if (ch->dying) {
		/* Reclaim is under way: the client is gone, so is its timer (popped: it was armed). */
		if (n->gen & CHIME_NODE_REALTIME)
			stats_disarmed_realtime(sc->st, 1);
		node_release(sc, ch, idx);
		return;
	}
	/*
	 * The client's records wait behind a RESET_TOUCH for its run
	 * (touch_hold()), and one of them may move or cancel this timer: fired
	 * now, its event would be voided when that record is applied (two
	 * fires counted and two events delivered for one). The wait ends at
	 * the next drain (that reset applied plain), and the timer, with the
	 * client's others due in this pass, is due again in the next, which
	 * drains first.
	 */
	if (unlikely(ch->touch_hold)) {
		ch->touch_plain_pos = ch->sq.head + 1;
		wheel_arm(&sc->wh, idx, n->deadline_ns);
		return;
	}
	if (unlikely(n->gen & CHIME_NODE_TOUCH) && touch_moved(sc, ch, idx))
		return;
	if (unlikely(n->gen & CHIME_NODE_REALTIME)) {
		if (wall_early(sc, idx))
			return;
		if (!periodic)
			stats_disarmed_realtime(sc->st, 1);     /* fires: no longer armed, as stats_fire_n() counts it */
	}
	immediate = (n->gen & CHIME_NODE_IMMEDIATE) != 0;     /* after touch_moved(), which may move the deadline */
	if (r->ch != ch || r->deadline_ns != n->deadline_ns || r->periodic != periodic ||
	    r->immediate != immediate) {
		run_flush(sc, r, now_ns);
		r->ch = ch;
		r->deadline_ns = n->deadline_ns;
		r->periodic = periodic;
		r->immediate = immediate;
	}
	r->fired++;
	n->gen &= ~CHIME_NODE_IMMEDIATE;        /* a periodic's later periods are on time */
	/* Parked: no process, no ring to look at; held for the next one. */
	if (!ch->parked && ch->room == 0)
		ch->room = room_refresh(sc, ch);
	/*
	 * The room after event_unconsumed(), which refreshes it: the walk of
	 * the taken periodics still to come can bring it down to 0 from what
	 * the last pass left (test_chan: ..._that_fills_the_room_holds_it).
	 */
	if ((ch->parked | ch->word_wait) || ch->backlog.head != CHIME_NIL ||
	    (periodic && event_unconsumed(sc, ch, n)) || ch->room == 0) {
		/* Held, never dropped: delivered in order when the client makes room. */
		chan_hold(sc, ch, idx);
		return;
	}
	deliver(sc, ch, idx, now_ns);
	r->delivered++;
}

void chan_fire(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t now_ns)
{
	struct fire_run r = { .ch = NULL };

	fire(sc, ch, idx, now_ns, &r);
	run_flush(sc, &r, now_ns);
}

void chan_fire_batch(struct shard_core *sc, const uint32_t *idx, unsigned n, uint64_t now_ns)
{
	struct fire_run r = { .ch = NULL };

	for (unsigned i = 0; i < n; i++) {
		struct chime_node *nd = NODE(sc, idx[i]);
		struct chan *ch = nd->owner < sc->max_clients ? sc->by_slot[nd->owner] : NULL;

		if (ch)
			fire(sc, ch, idx[i], now_ns, &r);
		else
			wheel_free(&sc->wh, idx[i]);    /* cannot happen: every armed node has a channel */
	}
	run_flush(sc, &r, now_ns);
}

#define POP_BATCH 256u

unsigned chan_fire_due(struct shard_core *sc, uint64_t now_ns, unsigned budget)
{
	uint32_t buf[POP_BATCH];
	unsigned total = 0, n;

	/* Cheap when nothing is due (the wheel's own fast path), exact when something is. */
	wheel_advance(&sc->wh, now_ns);
	while (total < budget && (n = wheel_pop_expired(&sc->wh, buf, POP_BATCH)) > 0) {
		chan_fire_batch(sc, buf, n, now_ns);
		total += n;
	}
	return total;
}

void chan_hold(struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	NODE(sc, idx)->state = CHIME_NODE_BACKLOG;
	nl_push(sc, &ch->backlog, idx);
	ch->nr_backlog++;
	sc->backlog++;
	if (ch->parked)         /* no chan_service() to publish it: the tools show what is held */
		stats_client_depth(sc->st, ch->slot, 0, ch->nr_backlog);
}

/* ---- events restored as "delivered, maybe taken" (restore.c) ---- */

void chan_settle_set(struct chan *ch, struct chan_settle *settle, uint32_t n)
{
	free(ch->settle);
	ch->settle = settle;
	ch->nr_settle = n;
}

/*
 * Whether the process took the event at old-ring position pos (its word,
 * `known`): its claim word there, if the library copied them (resume_claims)
 * and the word is that position's: TAKEN, or not (FRESH, VOID); else the
 * head: below it, consumed, which is taken unless a park was voiding it
 * (CHAN_POS_UNSURE: skipped as voided looks the same) - then not.
 */
static bool settle_taken(const struct chan *ch, bool claims, uint64_t head, uint64_t pos)
{
	uint64_t p = pos & ~CHAN_POS_UNSURE, w;

	if (claims) {
		w = at_load(&ch->cq.claim[p & ch->cq.mask]);   /* the client's: a lie costs it its own events only */
		if (w >> 2 == p)
			return (w & 3) == CHIME_CLAIM_TAKEN;
	}
	return p < head && !(pos & CHAN_POS_UNSURE);
}

/*
 * Settle them: with `known`, those the process took (settle_taken(): by
 * its claim words, else below the old ring's consumer head `head`), before
 * the old broker could see it, are dropped (a periodic goes on with its
 * next period); the others, and all of them without `known`, are
 * delivered again, and lose their old position (CHAN_POS_OLD). An entry
 * whose node has moved on (cancelled, reset, reused: another state,
 * generation or position) is skipped. Called before any event of the new
 * ring is delivered: its claim words are still the old ring's.
 */
static void settle(struct shard_core *sc, struct chan *ch, bool known, uint64_t head)
{
	bool claims = known && at_load(&ch->crw->resume_claims) == 1;

	for (uint32_t i = 0; i < ch->nr_settle; i++) {
		const struct chan_settle *e = &ch->settle[i];
		struct chime_node *n = NODE(sc, e->idx);

		if (n->state != CHIME_NODE_BACKLOG || n->owner != ch->slot ||
		    (n->gen & CHIME_ID_GEN_MASK) != e->gen || n->cq_pos != (CHAN_POS_OLD | e->pos))
			continue;
		if (!known || !settle_taken(ch, claims, head, e->pos)) {
			n->cq_pos = CHIME_POS_NONE;     /* delivered again, as any held event */
			continue;
		}
		/*
		 * Taken. It keeps its old position until it is FREE or ARMED
		 * (never ALLOC, which restore.c would take for fired), so a
		 * broker killed meanwhile settles it the same way.
		 */
		backlog_del(sc, ch, e->idx);
		if (n->period_ns) {
			wheel_rearm_periodic(&sc->wh, e->idx);  /* its next period, saturated: never wraps early */
			n->cq_pos = CHIME_POS_NONE;
		} else {
			node_release(sc, ch, e->idx);
		}
	}
	chan_settle_set(ch, NULL, 0);
	ch->word_wait = 0;
}

/*
 * True once nothing waits for the process's word (reading it if it came).
 * A resuming library's new ring gets no event before it: the library
 * copies its old ring's claim words into this ring's, where an event
 * delivered before would have its word overwritten (and be skipped).
 */
static bool settled(struct shard_core *sc, struct chan *ch)
{
	if (!ch->nr_settle && !ch->word_wait)
		return true;
	/* R1: pairs with the library's release of resume_set after resume_cq_head. */
	if (at_load_acq(&ch->crw->resume_set) != 1)
		return false;
	settle(sc, ch, true, at_load(&ch->crw->resume_cq_head));
	return true;
}

/* ---- submissions ---- */

/*
 * The marker of a user's quota, in the shard's own copy of the grants
 * only: the client is told CHIME_GRANT_QUOTA (-EDQUOT) for both quotas
 * (grant_public()), and the counters and the log say which it was when
 * the marker was set. Read off the quotas when the arm came instead, a
 * client's own quota, full at the marker and no longer, was logged as its
 * user's (found by a restart soak).
 */
#define GRANT_USER_QUOTA UINT64_C(3)
_Static_assert(GRANT_USER_QUOTA != CHIME_GRANT_NOMEM && GRANT_USER_QUOTA != CHIME_GRANT_QUOTA &&
	       (GRANT_USER_QUOTA >> 40) == 0, "a marker of its own (generation 0)");

static inline uint64_t grant_public(uint64_t g)
{
	return g == GRANT_USER_QUOTA ? CHIME_GRANT_QUOTA : g;
}

/* A node for one of the client's slots, or a no-grant marker saying why not. */
static uint64_t grant_slot(struct shard_core *sc, struct chan *ch)
{
	uint64_t g;

	if (ch->owned >= sc->quota)
		return CHIME_GRANT_QUOTA;
	if (ch->user->owned >= ch->user->quota)
		return GRANT_USER_QUOTA;
	g = grant_new(sc, ch);
	return g ? g : CHIME_GRANT_NOMEM;
}

/* Why an arm that found marker g was refused (the quota full when the marker was set). */
static enum stats_refusal refusal(uint64_t g)
{
	return g == CHIME_GRANT_QUOTA ? STATS_REFUSED_QUOTA :
	       g == GRANT_USER_QUOTA ? STATS_REFUSED_USER_QUOTA : STATS_REFUSED_NOMEM;
}

/* Slot s counted in ch->marked, or not (what markers_replace() looks for). */
static inline void marked_bit(struct chan *ch, uint32_t s, bool on)
{
	uint64_t b = UINT64_C(1) << (s & 63);

	ch->marked_bits[s >> 6] = on ? ch->marked_bits[s >> 6] | b : ch->marked_bits[s >> 6] & ~b;
}

/* The first slot from s on (below the ring's size) counted in ch->marked, or the ring's size. */
static uint32_t marked_next(const struct chan *ch, uint32_t s)
{
	uint32_t size = ch->sq_mask + 1, w = s >> 6, words = (size + 63) / 64;
	uint64_t word;

	if (s >= size)
		return size;
	word = ch->marked_bits[w] & (~UINT64_C(0) << (s & 63));
	while (!word) {
		if (++w >= words)
			return size;
		word = ch->marked_bits[w];
	}
	return w * 64 + (uint32_t)__builtin_ctzll(word);
}

/*
 * The least k' >= k whose slot, k' after `first` (the ring's order, from
 * first round to it), is counted in ch->marked; the ring's size if none.
 */
static uint32_t marked_ahead(const struct chan *ch, uint32_t first, uint32_t k)
{
	uint32_t size = ch->sq_mask + 1, s, n;

	if (k >= size)
		return size;
	s = (first + k) & ch->sq_mask;
	if (s >= first) {
		n = marked_next(ch, s);
		if (n < size)
			return n - first;
		s = 0;
	}
	n = marked_next(ch, s);
	return n < first ? size - first + n : size;
}

/*
 * Give slot s the grant g, counting markers. Where the page of the
 * client's table that g's tag is in is known resident
 * (chan_touch_check()), the shard writes the tag now (and says so in the
 * slot: CHIME_GRANT_F_TAGGED), a lap before the client's ARM takes the
 * grant; elsewhere the ARM writes it, as it must before the id is
 * returned. The store is the shard's, in a page the client allocated: on
 * the client's thread the tag's line was a miss that its publication's
 * barrier waited for (`perf annotate` of chime_arm(): 20% of its samples
 * on the tag's store, 31% on the exchange after it).
 */
static void slot_set(struct shard_core *sc, struct chan *ch, uint32_t s, uint64_t g)
{
	uint32_t idx = chime_id_index(g);
	uint8_t flags = 0;

	ch->marked += (uint32_t)chime_grant_is_marker(g) - (uint32_t)chime_grant_is_marker(ch->grants[s]);
	marked_bit(ch, s, chime_grant_is_marker(g));
	ch->grants[s] = g;
	if (!chime_grant_is_marker(g) && ch->touch_ready && touch_ready_page(ch, idx)) {
		at_store(&ch->touch_tag[idx], chime_id_gen(g));
		flags = CHIME_GRANT_F_TAGGED;
	}
	ch->grant_flags[s] = flags;
}

/*
 * Free the slot of the record consumed at pos for the client's next one,
 * with the grant it holds: an unused one, or a marker. A marker is not
 * retried here: this slot is the one the client reaches last, a lap away,
 * and a node freed now would sit in it while the arms before it fail.
 * markers_replace() gives room back in the order the client reserves.
 */
static void slot_free(struct chan *ch, uint64_t pos)
{
	uint32_t s = (uint32_t)pos & ch->sq_mask;

	chime_sq_free(&ch->sq, pos, grant_public(ch->grants[s]), ch->grant_flags[s]);
}

/*
 * slot_free(), the slot's unused grant swapped first for the lowest free
 * node when it lies in the slab's top GRANT_LOWER_NODES and that node is
 * at least as far below it. A connection's grants, taken as it armed a
 * burst, sat at the top of the slab until it armed a lap of its ring or
 * went, and no storage above them could be given back once the burst's
 * timers were gone (slab_give_back(), shard.c). The slot is the shard's
 * until chime_sq_free(): the client reads its grant only after that.
 */
#define GRANT_LOWER_NODES 65536u        /* a chunk of the slab (shard.c's RESERVE_CHUNK) */
static void slot_free_lower(struct shard_core *sc, struct chan *ch, uint64_t pos)
{
	uint32_t s = (uint32_t)pos & ch->sq_mask;
	uint64_t g = ch->grants[s], idx = chime_id_index(g), far = sc->grant_lower ? sc->grant_lower : GRANT_LOWER_NODES;

	if (!chime_grant_is_marker(g) && idx + far >= sc->wh.w->high_water &&
	    (uint64_t)wheel_lowest_free(&sc->wh) + far <= idx) {
		uint64_t low = grant_new(sc, ch);

		if (low) {
			grant_free(sc, ch, g);
			slot_set(sc, ch, s, low);
		}
	}
	slot_free(ch, pos);
}

/*
 * Nodes are free again (or the client below its quota): replace the markers
 * at once rather than when the client next uses each slot, so its arms stop
 * failing as soon as there is room. The slot may be free, reserved or
 * published: the client reads its grant only after reserving it, and an
 * arm with a marker cannot be published (the client sends a NOP), so a
 * grant written now is either seen and used or not seen and kept.
 */
static bool markers_replace(struct shard_core *sc, struct chan *ch)
{
	uint64_t g = grant_slot(sc, ch);
	/* From the client's next reservation on (its tail: a hint only, any value is safe). */
	uint32_t first = (uint32_t)at_load(ch->sq_tail);
	bool did = false;

	/*
	 * The marked slots from first on, then from 0 up to it, found by their
	 * bits (marked_bits), 64 slots a word: a walk of the grants themselves
	 * read up to --sq-size (1M) slots per call for each channel with a
	 * marker, and one user's 16 connections at their quotas, each freeing
	 * a node a pass, made another user's timers 17-20 ms late at the
	 * median (hostile/refused_slots_given_room_back_...); 55-58 us now.
	 */
	first &= ch->sq_mask;
	for (uint32_t k = marked_ahead(ch, first, 0), s; k <= ch->sq_mask && ch->marked;
	     k = marked_ahead(ch, first, k + 1)) {
		s = (first + k) & ch->sq_mask;
		if (chime_grant_is_marker(g))
			return did;
		if (!chime_grant_is_marker(ch->grants[s]))
			continue;
		slot_set(sc, ch, s, g);
		/*
		 * A marker's flags were 0: a client that reads the new grant
		 * with those writes the tag itself (the same value); one that
		 * reads F_TAGGED (acquire) sees the tag.
		 */
		at_store_rel(&ch->sq.slots[s].grant_flags, (uint32_t)ch->grant_flags[s]);
		at_store(&ch->sq.slots[s].grant, g);  /* not a marker (above) */
		did = true;
		g = ch->marked ? grant_slot(sc, ch) : CHIME_GRANT_NOMEM;
	}
	if (!chime_grant_is_marker(g))
		grant_free(sc, ch, g);
	return did;
}

/* ARM, or ARM_REALTIME (wall: r->deadline_ns is CLOCK_REALTIME, based on the shard's current offset). */
static void op_arm(struct shard_core *sc, struct chan *ch, const struct chime_sqe *r, uint64_t pos, bool wall)
{
	uint32_t s = (uint32_t)pos & ch->sq_mask;
	uint64_t grant = ch->grants[s];
	uint32_t idx = CHIME_NIL;
	uint64_t deadline_ns;
	struct chime_node *n;
	bool carried = false;

	if (chime_grant_is_marker(grant) || r->id != grant) {
		/* Only the private grant counts (the shared copy may be scribbled), or a carried one. */
		idx = carried_take(sc, ch, r->id);
		if (idx == CHIME_NIL) {
			/* A re-submitted ARM the old broker had applied (its node armed): nothing to do. */
			if (!ch->resuming)
				stats_malformed(sc->st, ch->slot);
			slot_free(ch, pos);
			return;
		}
		carried = true;
	} else {
		idx = chime_id_index(grant);
	}
	n = NODE(sc, idx);
	assert(n->state == CHIME_NODE_GRANTED && n->owner == ch->slot);
	n->key = r->key;
	n->user_data = r->user_data;
	/*
	 * Not below one tick: a 1 ns period is due again at every advance,
	 * and a client that moves its cq_head far ahead "consumes" at once, so
	 * two such timers kept both shards busy firing for nobody.
	 */
	n->period_ns = r->period_ns && r->period_ns < sc->wh.w->resolution_ns ? sc->wh.w->resolution_ns : r->period_ns;
	n->cq_pos = CHIME_POS_NONE;
	n->state = CHIME_NODE_ALLOC;
	if (unlikely(wall)) {
		/* during a walk, on the offset it moves the others to */
		n->gen = (n->gen & ~CHIME_NODE_WALL_B) | CHIME_NODE_REALTIME |
			 ((sc->wall_cur ^ sc->wall_walking) ? CHIME_NODE_WALL_B : 0);
		sc->wall_nodes++;
		chan_wall_note(sc, idx);
		stats_armed_realtime(sc->st, 1);
	}
	deadline_ns = node_deadline(sc, n, r->deadline_ns);
	mark_immediate(sc, n, deadline_ns);
	if (ch->keyed)
		keyidx_insert(&sc->ki, idx);
	else
		ch->unindexed++;        /* left out (grant_new()) until the client's first CANCEL_KEY */
	wheel_arm(&sc->wh, idx, deadline_ns);
	stats_arm(sc->st, ch->slot);

	if (carried) {
		slot_free(ch, pos);         /* the slot keeps its own grant */
		return;
	}
	/* The slot's next grant: a fresh node, or a marker the client will see at once. */
	slot_set(sc, ch, s, grant_slot(sc, ch));
	chime_sq_free(&ch->sq, pos, grant_public(ch->grants[s]), ch->grant_flags[s]);
}

/*
 * The node an id names, if this client may act on it; else CHIME_NIL, counted
 * as stale (the timer is gone: its node was freed or reused, a normal race
 * for a cancel after the event) or malformed (an id this client was never given).
 */
static uint32_t lookup_malformed(struct shard_core *sc, const struct chan *ch)
{
	stats_malformed(sc->st, ch->slot);
	return CHIME_NIL;
}

static uint32_t lookup(struct shard_core *sc, struct chan *ch, uint64_t id)
{
	uint32_t idx = chime_id_index(id), gen = chime_id_gen(id);
	const struct chime_node *n;

	if (chime_id_shard(id) != sc->shard || gen == 0 || idx >= sc->capacity)
		goto malformed;
	if (idx >= sc->wh.w->high_water)
		return idx < sc->wh.shrunk_from ? CHIME_NIL : lookup_malformed(sc, ch);      /* given back: stale */
	n = NODE(sc, idx);
	if ((n->gen & CHIME_ID_GEN_MASK) != gen || n->state == CHIME_NODE_FREE)
		return CHIME_NIL;       /* stale: not an error, counts nothing */
	if (n->owner != ch->slot)
		goto malformed;
	switch (n->state) {
	case CHIME_NODE_ARMED:
	case CHIME_NODE_EXPIRED:
	case CHIME_NODE_BACKLOG:
	case CHIME_NODE_ACKWAIT:
		return idx;
	default:
		break;          /* GRANTED: an id not armed yet cannot be named */
	}
malformed:
	return lookup_malformed(sc, ch);
}

/* Remove a client's timer whatever its state; true if it counted as armed. */
static bool node_cancel(struct shard_core *sc, struct chan *ch, uint32_t idx)
{
	struct chime_node *n = NODE(sc, idx);
	bool armed = chan_counts_as_armed(n);

	wall_disarm(sc, n);
	/*
	 * Its event still in the ring (a periodic's, or a fired one-shot's):
	 * the client must skip it. Voided first: a periodic off the wheel
	 * with a ring position is, to restore.c, one deliver() is re-arming.
	 * And no ALLOC step before node_release(): a cancelled held event
	 * left ALLOC, its deadline past, would be taken for one that fired.
	 * A periodic's voided event stays in the node by its deadline
	 * (CHAN_POS_AT, F9) until the node is free: a broker killed in
	 * between leaves the cancel not applied, that event and the timer
	 * kept, as if killed before it. Before, a kill there lost the event
	 * and kept the timer: neither.
	 */
	if (n->period_ns && n->cq_pos >> 62 == 0 && n->cq_pos < ch->cq.tail &&
	    !chime_cq_consumed(&ch->cq, n->cq_pos)) {
		uint64_t pos = n->cq_pos;

		n->cq_pos = chime_cq_void(&ch->cq, pos) ? CHAN_POS_AT | event_deadline(sc, ch, n, pos) :
							  CHIME_POS_NONE;
		at_crash_order();       /* F9 */
	} else {
		event_void(ch, n);
	}
	switch (n->state) {
	case CHIME_NODE_ARMED:
	case CHIME_NODE_EXPIRED:
		wheel_cancel(&sc->wh, idx);
		break;
	case CHIME_NODE_BACKLOG:
		backlog_del(sc, ch, idx);
		break;
	case CHIME_NODE_ACKWAIT:
		nl_del(sc, &ch->ackwait, idx);
		break;
	default:
		assert(0);
		return false;
	}
	node_release(sc, ch, idx);
	return armed;
}

/*
 * A periodic reset while its event is in the ring, the client not past
 * it: on the wheel, or held (BACKLOG) behind that event. The event is
 * voided, and the timer moves. If the void wins, the event is held in the
 * node by its deadline (the broker's own completion slot; CHAN_POS_AT, F6)
 * until the new deadline is stored, and only then dropped (F7): a broker
 * killed in between leaves the event held and the timer where it was (the
 * reset not applied, as if killed before it), never the event gone and
 * the timer not moved. Before, the void cleared the position first, and a
 * kill before the deadline store did just that: with its process gone
 * too, the reset was lost and so was the event (a held one's too, until
 * it came here). True if it took the path; if it did not, the event's
 * position is cleared when the client took it, and the caller moves the
 * timer.
 */
static bool reset_voiding(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t deadline_ns)
{
	struct chime_node *n = NODE(sc, idx);
	uint64_t pos = n->cq_pos, at;

	if (!n->period_ns || pos >> 62 != 0 || pos >= ch->cq.tail || chime_cq_consumed(&ch->cq, pos))
		return false;
	if (!chime_cq_void(&ch->cq, pos)) {
		n->cq_pos = CHIME_POS_NONE;     /* the client took it: only the timer moves */
		return false;
	}
	at = event_deadline(sc, ch, n, pos);  /* fired: below now */
	n->cq_pos = CHAN_POS_AT | at;
	at_crash_order();       /* F6: the event held before the deadline moves */
	if (n->state == CHIME_NODE_BACKLOG) {
		backlog_del(sc, ch, idx);
		wheel_arm(&sc->wh, idx, deadline_ns);
	} else {
		wheel_reset(&sc->wh, idx, deadline_ns);
	}
	at_crash_order();       /* F7: the new deadline before the event goes */
	n->cq_pos = CHIME_POS_NONE;
	return true;
}

static void node_reset(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t deadline_ns)
{
	struct chime_node *n = NODE(sc, idx);
	bool was_armed = chan_counts_as_armed(n);

	mark_immediate(sc, n, deadline_ns);
	switch (n->state) {
	case CHIME_NODE_ARMED:
	case CHIME_NODE_EXPIRED:
		/* A periodic's earlier firing still in flight is never returned. */
		if (n->cq_pos == CHIME_POS_NONE || !reset_voiding(sc, ch, idx, deadline_ns)) {
			event_void(ch, n);
			wheel_reset(&sc->wh, idx, deadline_ns);
		}
		break;
	case CHIME_NODE_BACKLOG:
		/* Fired but not delivered: it simply was not due after all. */
		if (n->cq_pos != CHIME_POS_NONE && reset_voiding(sc, ch, idx, deadline_ns))
			break;  /* a periodic held behind its event */
		backlog_del(sc, ch, idx);
		event_void(ch, n);
		/*
		 * Straight from BACKLOG (or ACKWAIT) to the wheel: a kill in
		 * between leaves a held node with a deadline ahead, which
		 * restore.c puts back on the wheel. An ALLOC step there read
		 * as a cancel in progress: the timer was freed.
		 */
		wheel_arm(&sc->wh, idx, deadline_ns);
		break;
	case CHIME_NODE_ACKWAIT:
		nl_del(sc, &ch->ackwait, idx);
		/*
		 * The event's position stays in the node until the outcome is
		 * stored (F10): a broker killed between clearing it and the free left
		 * a taken one-shot ACKWAIT with no position, which restore.c
		 * delivers again, and the process's RESET, submitted again to
		 * the next broker, put it back on the wheel: it fired twice
		 * (tsan_api; restart/a_reset_of_a_taken_one_shot_killed_...).
		 */
		if (event_void_at(ch, n->cq_pos)) {
			/* We beat the client to the event: the timer lives on, at the new deadline. */
			n->cq_pos = CHIME_POS_NONE;
			wheel_arm(&sc->wh, idx, deadline_ns);
		} else {
			/* The application has the event: the timer is gone, reset changes nothing. */
			node_release(sc, ch, idx);
			n->cq_pos = CHIME_POS_NONE;
			return;
		}
		break;
	default:
		assert(0);
		return;
	}
	stats_reset(sc->st, ch->slot);
	if (!was_armed) {
		stats_rearmed(sc->st, ch->slot);
		if (n->gen & CHIME_NODE_REALTIME)
			stats_armed_realtime(sc->st, 1);
	}
}

/*
 * A RESET_TOUCH of node idx at pos: wait for its run to be mapped? Only a
 * one-shot the shard would flag (node_touch()) whose run is not mapped
 * yet and not given up on (chan_touch_unhold()). Holding it, rather than
 * applying it as a plain reset, keeps the client's next resets of the
 * timer to the word alone: the first reset of each timer flags it, as
 * when the shard looked at the run on this path itself (a mincore each).
 */
static bool touch_hold(const struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t pos)
{
	const struct chime_node *n = NODE(sc, idx);

	if (!ch->touch_word || (n->gen & (CHIME_NODE_TOUCH | CHIME_NODE_REALTIME)) || n->period_ns ||
	    n->state != CHIME_NODE_ARMED || pos + 1 == ch->touch_plain_pos || !touch_budget_left(ch))
		return false;
	if (touch_page_ok(sc, ch, idx))
		return false;
	/*
	 * Its run is asked for either way. A timer due before the run is
	 * likely mapped is reset plain now: held, it fired at the deadline
	 * the reset moved, and the reset then voided that event (a reset
	 * made 50 ms ahead of a sleeping shard's wake-up counted two fires,
	 * two events delivered and a wake-up for one timer).
	 */
	return n->deadline_ns > now_ns() + TOUCH_HOLD_DUE_NS;
}

/* The RESET_TOUCH at the ring's head waits for its run's populate, and no timer of the client came due meanwhile (fire()). */
static inline bool touch_waits(const struct chan *ch)
{
	return ch->touch_hold && ch->touch_pop && ch->touch_plain_pos != ch->sq.head + 1;
}

void chan_touch_unhold(struct chan *ch)
{
	ch->touch_hold = 0;
	ch->touch_plain_pos = ch->sq.head + 1;
}

/*
 * RESET_TOUCH: a reset whose deadline is the word of the client's table
 * (the client wrote it before the record; a later write of its wins).
 * A one-shot still armed after it is flagged (touch_flag()). A client
 * with no table, or past its pages (touch_page_ok()), gets the record's
 * deadline, as a RESET.
 */
static void node_touch(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t deadline_ns)
{
	struct chime_node *n = NODE(sc, idx);
	uint64_t *word, w;

	/* A wall-clock timer: never flagged, so that its resets stay records (its word is the client's only). */
	if (n->gen & CHIME_NODE_REALTIME) {
		node_reset(sc, ch, idx, node_deadline(sc, n, deadline_ns));
		return;
	}
	if (!ch->touch_word || !touch_page_ok(sc, ch, idx)) {
		if (n->gen & CHIME_NODE_TOUCH)
			n->gen &= ~CHIME_NODE_TOUCH;    /* no table: cannot happen */
		node_reset(sc, ch, idx, deadline_ns);
		return;
	}
	word = &ch->touch_word[idx];
	w = at_load(word);
	node_reset(sc, ch, idx, w & ~CHIME_TOUCH_FIRED);
	if (n->state == CHIME_NODE_FREE || n->period_ns)
		return;         /* gone (its event was taken), or periodic: never flagged */
	/* fired after the client wrote the word, and the event voided: the fast path again */
	if (w & CHIME_TOUCH_FIRED)
		(void)at_cas(word, &w, w & ~CHIME_TOUCH_FIRED);
	touch_flag(sc, ch, n, idx);
}

/* ---- CANCEL_KEY, in steps ---- */

/*
 * Its cursor is set now, or once the client's timers are indexed (the
 * channel's first CANCEL_KEY, index_step()): the walk sees what was armed
 * before the record, whenever it steps (the channel's later records wait
 * for it, so nothing of its own is armed in between).
 */
static void walk_enqueue(struct shard_core *sc, struct chan *ch, uint64_t key, uint64_t pos)
{
	if (!ch->keyed) {
		ch->keyed = 1;          /* its arms go in the index from now on */
		ch->index_pos = 0;
	}
	ch->walk_begun = ch->unindexed == 0;
	if (ch->walk_begun)
		keyidx_walk_begin(&sc->ki, &ch->walk, ch->slot, key);
	else
		ch->walk.key = key;     /* keyidx_walk_begin() takes it from here */
	ch->walk_queued = 1;
	ch->walk_stepped = 0;
	ch->walk_pos = pos;
	ch->walk_armed = ch->walk_fired = 0;
	ch->walk_next = NULL;
	if (sc->walk_tail)
		sc->walk_tail->walk_next = ch;
	else
		sc->walk_head = ch;
	sc->walk_tail = ch;
}

/* Off the list, done or abandoned (a detach). */
static void walk_dequeue(struct shard_core *sc, struct chan *ch)
{
	struct chan **p = &sc->walk_head, *prev = NULL;

	if (!ch->walk_queued)
		return;
	while (*p != ch) {
		prev = *p;
		p = &(*p)->walk_next;
	}
	*p = ch->walk_next;
	if (sc->walk_tail == ch)
		sc->walk_tail = prev;
	if (ch->walk_begun)
		keyidx_walk_end(&sc->ki, &ch->walk);
	ch->walk_queued = 0;
	ch->walk_begun = 0;
	ch->walk_next = NULL;
}

/*
 * A step of indexing the channel's timers, left out until its first
 * CANCEL_KEY: up to `scan` slab nodes, in order, and up to *links of them
 * linked (each a bucket and a chain head at random addresses, as a walk's
 * step: taken off the walk's budget). True once none is left out. The slab
 * has no list per client, so this reads it from the start until it has
 * found them all (the high-water mark at most), as a reclaim does: in
 * steps, one per pass, the shard applying and firing everyone else's
 * between them.
 */
static bool index_step(struct shard_core *sc, struct chan *ch, unsigned scan, unsigned *links)
{
	uint32_t end = sc->wh.w->high_water;

	while (ch->unindexed && ch->index_pos < end && scan-- && *links) {
		uint32_t idx = ch->index_pos++;
		struct chime_node *n = NODE(sc, idx);

		if (n->owner == ch->slot && !keyidx_linked(n) && n->state != CHIME_NODE_FREE &&
		    n->state != CHIME_NODE_GRANTED) {
			keyidx_insert(&sc->ki, idx);
			ch->unindexed--;
			(*links)--;
		}
	}
	if (ch->unindexed && ch->index_pos < end)
		return false;
	/* 0 here; if not, the count is corrupt: the walk goes on with what the index holds. */
	assert(ch->unindexed == 0);
	ch->unindexed = 0;
	return true;
}

/* The walk at the head of the list to its back. */
static void walk_rotate(struct shard_core *sc)
{
	struct chan *h = sc->walk_head;

	sc->walk_head = h->walk_next;
	sc->walk_tail->walk_next = h;
	sc->walk_tail = h;
	h->walk_next = NULL;
}

/*
 * The first walk of the user whose walks stepped longest ago to the head,
 * the others keeping their order.
 */
static void walk_pick(struct shard_core *sc)
{
	struct chan *c, *prev = NULL, *next = NULL, *next_prev = NULL;

	for (c = sc->walk_head; c; prev = c, c = c->walk_next)
		if (!next || c->user->walk_turn < next->user->walk_turn) {
			next = c;
			next_prev = prev;
		}
	if (next_prev) {
		next_prev->walk_next = next->walk_next;
		if (sc->walk_tail == next)
			sc->walk_tail = next_prev;
		next->walk_next = sc->walk_head;
		sc->walk_head = next;
	}
}

/*
 * One step of this channel's CANCEL_KEY, if it is its turn. True once the
 * walk is over: the record is applied and its slot the caller's to free.
 * Each matching node is cancelled as it is met, as chime_cancel() would.
 * A channel that took the last step goes to the back of the list at its
 * next call (and with it its user's walks at the head, if another user's
 * waits), so the next walk steps in the next call of its own channel:
 * one step per pass, whoever's, as the shard drains each channel once.
 */
static bool walk_step(struct shard_core *sc, struct chan *ch)
{
	unsigned budget = sc->walk_budget ? sc->walk_budget : CHAN_WALK_BUDGET;
	uint32_t i;

	if (sc->walk_head != ch)
		return false;
	if (ch->walk_stepped) {
		ch->walk_stepped = 0;
		if (ch->walk_next) {
			walk_rotate(sc);
			/*
			 * Users in turn: the first walk of the user whose walks
			 * stepped longest ago goes to the head, the others keeping
			 * their order. In turn by connection, one user's many
			 * walks held another's single one back for all of them (a
			 * security audit: an arm after a chime_cancel_key() up to
			 * 462 ms late); reviews of the first two versions found a
			 * user's short walk waiting for its own long one, and a
			 * user with two walks taking every other step beside two
			 * users with one.
			 */
			ch->user->walk_turn = ++sc->walk_turns;
			walk_pick(sc);
			return false;
		}
	}
	if (!ch->walk_begun) {
		if (!index_step(sc, ch, sc->index_budget ? sc->index_budget : CHAN_INDEX_BUDGET, &budget)) {
			ch->walk_stepped = 1;
			return false;
		}
		keyidx_walk_begin(&sc->ki, &ch->walk, ch->slot, ch->walk.key);
		ch->walk_begun = 1;
	}
	while ((i = keyidx_walk_next(&sc->ki, &ch->walk, &budget)) != CHIME_NIL) {
		if (node_cancel(sc, ch, i))
			ch->walk_armed++;
		else
			ch->walk_fired++;
	}
	if (!keyidx_walk_over(&sc->ki, &ch->walk)) {
		ch->walk_stepped = 1;
		return false;
	}
	stats_cancel_key(sc->st, ch->slot, ch->walk_armed);
	if (ch->walk_fired)
		stats_cancel_fired(sc->st, ch->slot, ch->walk_fired);
	/* its last step is a turn too: a walk that ends hands the head to the user served longest ago */
	ch->user->walk_turn = ++sc->walk_turns;
	walk_dequeue(sc, ch);
	walk_pick(sc);
	return true;
}

/*
 * Applying a record costs cache misses in the slab, in two rounds: its own
 * node (and, for an ARM, its key bucket), then what that node leads to: a
 * CANCEL unlinks it from its wheel list and its key chain (four neighbours
 * and a bucket, all at random addresses), an ARM links it in front of its
 * bucket's first node. So the drain loads ahead in two stages: the record
 * PREFETCH_NODE positions on gets its node, and the one PREFETCH_LINKS
 * positions on, whose node has arrived by then, its neighbours (cancel at
 * 1M armed, one shard: 160 -> see ARCHITECTURE.md). Not the first node of
 * an ARM's wheel slot: that is the slot's latest arm, one of at most 704
 * (11 levels x 64 slots), nearly always cached; its hint cost each arm 37
 * instructions of about 430 and saved no miss.
 * Hints only: the slot may be unpublished or scribbled, so nothing read
 * here is trusted or written, and an address is formed only from an index
 * checked against the capacity.
 */
#define PREFETCH_NODE  16u
#define PREFETCH_LINKS 8u

/*
 * Branch-free, an out-of-range index clamped to node 0: GCC 12 drops a
 * prefetch guarded by `if (idx < capacity)` here (checked in the object
 * code), and an unguarded address could lie outside the slab.
 */
static inline void prefetch_node(const struct shard_core *sc, uint32_t idx)
{
	__builtin_prefetch(&sc->wh.nodes[idx < sc->capacity ? idx : 0], 1);
}

static inline void prefetch_record(struct shard_core *sc, struct chan *ch, uint64_t pos)
{
	const struct chime_sqe *s = &ch->sq.slots[pos & ch->sq.mask];
	uint64_t g;

	if (at_load(&s->seq) != pos + 1)
		return;
	switch (at_load(&s->op)) {
	case CHIME_OP_ARM:
		g = ch->grants[pos & ch->sq_mask];
		if (chime_grant_is_marker(g))
			return;
		__builtin_prefetch(NODE(sc, chime_id_index(g)), 1);
		if (ch->keyed)
			__builtin_prefetch(&sc->ki.heads[keyidx_bucket(&sc->ki, ch->slot, at_load(&s->key))], 1);
		return;
	case CHIME_OP_RESET:
	case CHIME_OP_RESET_TOUCH:
	case CHIME_OP_CANCEL:
		prefetch_node(sc, chime_id_index(at_load(&s->id)));
		return;
	default:
		return;
	}
}

static inline void prefetch_links(struct shard_core *sc, struct chan *ch, uint64_t pos)
{
	const struct chime_sqe *s = &ch->sq.slots[pos & ch->sq.mask];
	const struct chime_node *n;
	uint32_t idx;

	if (at_load(&s->seq) != pos + 1)
		return;
	switch (at_load(&s->op)) {
	case CHIME_OP_ARM:
		if (!ch->keyed || chime_grant_is_marker(ch->grants[pos & ch->sq_mask]))
			return;
		prefetch_node(sc, sc->ki.heads[keyidx_bucket(&sc->ki, ch->slot, at_load(&s->key))] - 1);
		return;
	case CHIME_OP_CANCEL:
		idx = chime_id_index(at_load(&s->id));
		/*
		 * A load, not a prefetch: below the high-water mark only, as
		 * lookup() checks. Past it the slab may be a hole of the file,
		 * and reading one on a full tmpfs is a SIGBUS.
		 */
		if (idx >= sc->capacity || idx >= sc->wh.w->high_water)
			return;
		n = NODE(sc, idx);
		prefetch_node(sc, n->next);
		prefetch_node(sc, n->prev);
		if (!keyidx_linked(n))
			return;
		prefetch_node(sc, n->key_next);
		if (n->key_prev != CHIME_NIL)
			prefetch_node(sc, n->key_prev);
		else
			__builtin_prefetch(&sc->ki.heads[keyidx_bucket(&sc->ki, n->owner, n->key)], 1);
		return;
	default:
		return;
	}
}

unsigned chan_drain(struct shard_core *sc, struct chan *ch, unsigned budget)
{
	struct chime_sqe r;
	uint64_t pos, applied;
	unsigned n = 0;
	uint32_t idx;

	/*
	 * A resuming process's records wait for its word on the events the
	 * old broker delivered (settled(); the library releases resume_set
	 * before it publishes its first record here, R1), and are applied
	 * after that settle. Before it, a RESET the old broker never read, of
	 * a one-shot whose event the process had taken, found the node held
	 * (BACKLOG, "not due after all") and put it back on the wheel: the
	 * event came twice (tests/tsan_api.c: taken, reset, chimed killed).
	 */
	if (unlikely(ch->word_wait) && !settled(sc, ch))
		return 0;
	if (ch->walk_queued) {
		if (!walk_step(sc, ch))
			return 0;
		slot_free(ch, ch->walk_pos);
	}
	if (ch->touch_hold) {
		if (touch_waits(ch))
			return 0;       /* its run is being mapped, and no timer of the client came due meanwhile */
		ch->touch_hold = 0;     /* mapped, or plain now: the record decides again */
	}
	for (; n < budget; n++) {
		if (!chime_sq_pop(&ch->sq, &r, &pos))
			break;
		prefetch_record(sc, ch, pos + PREFETCH_NODE);
		prefetch_links(sc, ch, pos + PREFETCH_LINKS);
		switch (r.op) {
		case CHIME_OP_ARM:
			op_arm(sc, ch, &r, pos, false);
			continue;       /* op_arm frees the slot itself */
		case CHIME_OP_ARM_REALTIME:
			op_arm(sc, ch, &r, pos, true);
			continue;
		case CHIME_OP_RESET:
			idx = lookup(sc, ch, r.id);
			if (idx == CHIME_NIL)
				break;
			if (unlikely(NODE(sc, idx)->gen & CHIME_NODE_TOUCH))
				touch_unflag(ch, NODE(sc, idx), idx);
			node_reset(sc, ch, idx, node_deadline(sc, NODE(sc, idx), r.deadline_ns));
			break;
		case CHIME_OP_RESET_TOUCH:
			idx = lookup(sc, ch, r.id);
			if (idx != CHIME_NIL && touch_hold(sc, ch, idx, pos)) {
				ch->sq.head = pos;      /* not taken: applied once its run is mapped */
				ch->touch_hold = 1;
				goto waiting;
			}
			if (idx != CHIME_NIL)
				node_touch(sc, ch, idx, r.deadline_ns);
			break;
		case CHIME_OP_CANCEL:
			idx = lookup(sc, ch, r.id);
			if (idx == CHIME_NIL)
				break;
			if (node_cancel(sc, ch, idx))
				stats_cancel(sc->st, ch->slot);
			else
				stats_cancel_fired(sc->st, ch->slot, 1);
			break;
		case CHIME_OP_CANCEL_KEY:
			walk_enqueue(sc, ch, r.key, pos);
			if (!walk_step(sc, ch)) {
				n++;
				goto waiting;   /* the rest of the ring waits for it */
			}
			break;
		case CHIME_OP_RESUMED:
			carried_free(sc, ch);
			break;
		case CHIME_OP_NOP:
			/* A NOP in a marked slot is an arm the client could not make. */
			if (chime_grant_is_marker(ch->grants[pos & ch->sq_mask]))
				stats_refused(sc->st, ch->slot, refusal(ch->grants[pos & ch->sq_mask]));
			break;
		default:
			stats_malformed(sc->st, ch->slot);
			break;
		}
		/* The slot keeps its unused grant (or a lower one), or tries again if it held a marker. */
		slot_free_lower(sc, ch, pos);
	}
waiting:
	applied = ch->walk_queued ? ch->walk_pos : ch->sq.head;
	if (applied != ch->sq_head_pub) {
		/* V1: every record below it applied, VOIDs included; pairs with D2 (the drainer's acquire of sq_head). */
		at_store_rel(&ch->ro->sq_head, applied);
		ch->sq_head_pub = applied;
	}
	return n;
}

/* ---- catching up with the client ---- */

/*
 * Each wake-up is a send(), a syscall on the shard, and any client can ask
 * for one per pass by storing want_wakeup itself: a user's 64 connections
 * doing so (with a periodic timer each) made every pass 64 sends longer,
 * and another user's timers 30-50 times later at the median (the trust
 * audit of 2026-12-02; hostile/forced_wakeups_...). So a user's wake-ups
 * come out of *wakes (its share for this pass, shard.c); one past it is
 * owed: the flag stays set and the next pass sends it.
 *
 * And a send can be long: the kernel wakes every waiter of the client's
 * end inside it, one callback per epoll watch the client put there (up to
 * fs.epoll.max_user_watches; a million cost 75 ms, with interrupts off).
 * A send that took CHAN_WAKE_SLOW_NS by the clock is timed by this thread's
 * CPU time too, which a preemption does not inflate: one that took
 * CHAN_WAKE_SLOW_NS of it holds the user's wake-ups back (held: sent in the
 * first pass after) for CHAN_WAKE_QUIET_FACTOR times as long. The walks
 * made for that user are then at most 1 in CHAN_WAKE_QUIET_FACTOR of the
 * shard's time, the first one included; a user could make the same walk on
 * any CPU itself, no broker involved.
 *
 * The CPU time is read once a pass before its first send (a system call
 * as dear as a send), and again after a send slow by the clock. What the
 * thread did between the marks and the send took at most the clock's time
 * between them: what is left of the CPU time is the send's, at least.
 */
static void wake_send(struct shard_core *sc, struct chan *ch, uint64_t now)
{
	struct chan_user *u = ch->user;
	uint64_t t0, t1, cpu;

	if (!sc->wake_clock_ns) {
		sc->wake_clock_ns = now_ns();   /* first: the CPU time after it is bounded by the clock's */
		sc->wake_cpu_ns = thread_cpu_ns();
	}
	t0 = now_ns();
	/*
	 * Our own end of the client's connection, never a file the client
	 * shares: nothing it does can make this block. MSG_DONTWAIT: a full
	 * socket (EAGAIN) means wake-ups are unread already; a client gone
	 * (EPIPE) is the control thread's to notice.
	 */
	(void)send(ch->wake_fd, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	t1 = now_ns();
	if (t1 - t0 < CHAN_WAKE_SLOW_NS)
		return;
	cpu = thread_cpu_ns();
	if ((int64_t)(cpu - sc->wake_cpu_ns) - (int64_t)(t0 - sc->wake_clock_ns) >= (int64_t)CHAN_WAKE_SLOW_NS) {
		/* held for as long as it took by the clock, if longer (a VM's host took its part); now: the pass's */
		u->wake_quiet_until = now + (CHAN_WAKE_QUIET_FACTOR + 1) * (t1 - t0);
		stats_slow_wake(sc->st, ch->slot);
	}
	sc->wake_clock_ns = t1;
	sc->wake_cpu_ns = cpu;
}

/* True if the wake-up is owed to the next pass (its user's share for this one is spent). */
static bool wake_client(struct shard_core *sc, struct chan *ch, uint32_t *wakes, uint64_t now)
{
	uint32_t *w = ch->want_wakeup;

	/*
	 * W1: full barrier between publishing cq_tail (chime_cq_flush) and the
	 * load of want_wakeup; pairs with the client's store of want_wakeup,
	 * full barrier, re-check of cq_tail. Either it sees our tail or we see
	 * its flag. The CAS makes it one wake-up per sleep.
	 */
	uint32_t one = 1;

	at_fence();
	ch->wake_owed = 0;
	ch->wake_held = 0;
	if (at_load(w) != 1)
		return false;
	if (!*wakes) {
		ch->wake_owed = 1;
		return true;
	}
	if (now < ch->user->wake_quiet_until) {
		ch->wake_held = 1;
		if (ch->user->wake_quiet_until < sc->wake_retry_ns)
			sc->wake_retry_ns = ch->user->wake_quiet_until;
		return false;
	}
	if (!at_cas(w, &one, 0))
		return false;
	(*wakes)--;
	ch->wakes++;
	stats_wake_client(sc->st, ch->slot);
	if (ch->wake_fd >= 0)
		wake_send(sc, ch, now);
	return false;
}

static void head_watch_publish(struct shard_core *sc, struct chan *ch)
{
	bool waiting = ch->ackwait.head != CHIME_NIL || ch->taken_seen < ch->periodic_end;
	uint64_t w = waiting ? ch->cq.head : UINT64_MAX;

	if (w != ch->head_watch) {
		sc->watch_started |= ch->session && ch->head_watch == UINT64_MAX;
		at_store(&ch->head_watch, w);   /* B1: read by clients_beat() (control.c), a hint */
	}
}

bool chan_service_n(struct shard_core *sc, struct chan *ch, uint64_t now_ns, uint32_t *budget, uint32_t *wakes)
{
	uint32_t idx, delivered = 0, left = *budget;
	bool did = false;

	if (ch->cq.tail != ch->cq.head || ch->ackwait.head != CHIME_NIL) {
		/* Something is (or was) in the client's hands: see how far it got. */
		ch->room = room_refresh(sc, ch);
		while ((idx = ch->ackwait.head) != CHIME_NIL &&
		       chime_cq_consumed(&ch->cq, NODE(sc, idx)->cq_pos)) {
			if (!left) {
				did = true;     /* more to free: the next pass */
				break;
			}
			left--;
			/* from ACKWAIT: ALLOC, its deadline past, reads as fired */
			node_release(sc, ch, nl_pop_front(sc, &ch->ackwait));
			did = true;
		}
	}
	if (periodics_behind(ch)) {
		periodics_taken(sc, ch, &left);
		ch->room = room_refresh(sc, ch);
		did = true;
	}
	if (ch->marked)
		did |= markers_replace(sc, ch);
	/*
	 * A resuming process's events the old broker delivered wait for its
	 * word on them (and the rest behind), and for the records it submitted
	 * with it: chan_drain() settles and applies them in one call. Settled
	 * here, between this pass's drain and the next, an event judged
	 * untaken went out before the RESET or CANCEL behind it was applied.
	 */
	while (!ch->word_wait && settled(sc, ch) && (idx = ch->backlog.head) != CHIME_NIL && ch->room) {
		struct chime_node *n = NODE(sc, idx);

		/* strict FIFO: it waits, and so does everything after it; the room as refreshed (fire()) */
		if ((n->period_ns && event_unconsumed(sc, ch, n)) || !ch->room)
			break;
		if (!left) {
			did = true;     /* more to move: the next pass */
			break;
		}
		left--;
		backlog_del(sc, ch, idx);
		n->state = CHIME_NODE_ALLOC;
		deliver(sc, ch, idx, now_ns);
		delivered++;
	}
	*budget = left;
	if (delivered) {
		stats_deliver_n(sc->st, ch->slot, delivered);
		did = true;
	}
	head_watch_publish(sc, ch);
	if (ch->ro->backlog != ch->nr_backlog)
		at_store(&ch->ro->backlog, ch->nr_backlog);
	stats_client_depth(sc->st, ch->slot, ch->cq.tail - ch->cq.head, ch->nr_backlog);
	if (ch->cq.tail != ch->flushed) {
		chime_cq_flush(&ch->cq);
		ch->flushed = ch->cq.tail;
		(void)wake_client(sc, ch, wakes, now_ns);
		did = true;
	} else if (ch->wake_owed || ch->wake_held) {
		/* held: no work of its own, the shard wakes at sc->wake_retry_ns for it */
		did |= ch->wake_owed;
		did |= wake_client(sc, ch, wakes, now_ns);
	}
	return did;
}

uint64_t chan_sq_waiting(const struct chan *ch)
{
	/* The client writes sq_tail: one load, bounded to [0, size] before use. */
	uint64_t d = at_load(ch->sq_tail) - ch->sq.head;

	if ((int64_t)d < 0)
		return 0;
	return d > (uint64_t)ch->sq_mask + 1 ? (uint64_t)ch->sq_mask + 1 : d;
}

bool chan_pending(struct shard_core *sc, struct chan *ch)
{
	const struct chime_sqe *s = &ch->sq.slots[ch->sq.head & ch->sq.mask];
	uint32_t idx = ch->backlog.head;

	/*
	 * S-CHECK: pairs with S1/S2 (the producer's publish of seq is a full
	 * barrier). A resuming process's records wait for its word
	 * (chan_drain()): till then they are nothing to stay awake for, or a
	 * client that published without its word would keep the shard from
	 * ever sleeping (nor does the heartbeat ring it for them:
	 * word_awaited(), control.c). Nor do records behind a RESET_TOUCH
	 * whose run is being mapped (touch_hold()): the aside thread rings the
	 * shard's doorbell when done, and a shard that counted them stayed
	 * awake, spinning outright once its spin share was spent, for as long
	 * as the populate took.
	 */
	if (at_load(&s->seq) == ch->sq.head + 1 && !touch_waits(ch) &&
	    !(ch->word_wait && at_load_acq(&ch->crw->resume_set) != 1))     /* R1 */
		return true;
	if (ch->cq.tail != ch->flushed || ch->wake_owed || periodics_behind(ch))
		return true;
	/*
	 * Held events that could move now. Not "backlog non-empty": a periodic
	 * waiting for the client to consume its previous event cannot move, and
	 * spinning on it would burn the core for a client that does not drain.
	 * Its client rings our doorbell when it consumes (chan_ro.backlog).
	 */
	if (idx == CHIME_NIL)
		return false;
	if (ch->nr_settle || ch->word_wait)
		return at_load_acq(&ch->crw->resume_set) == 1;     /* R1 */
	ch->room = room_refresh(sc, ch);
	return ch->room > 0 && !(NODE(sc, idx)->period_ns && event_unconsumed(sc, ch, NODE(sc, idx)));
}

/* ---- attach and reclaim ---- */

/* The rings of m, and a grant (or a marker) in every submission slot. */
static void rings_init(struct shard_core *sc, struct chan *ch, const struct chan_mem *m)
{
	/*
	 * Completion positions go on from the channel's last ring (0 for a new
	 * channel): a node may keep the position of an event its last process
	 * took (a park that finds every event taken does not sweep for them),
	 * and in a ring counted from 0 again that position would name another
	 * timer's event, which a cancel or reset of the node then voided. Below
	 * the new ring's start it reads as consumed. libchime starts from the
	 * segment's cq_head.
	 */
	uint64_t cq_base = ch->cq.tail;

	ch->wake_fd = m->wake_fd;
	ch->bell_fd = m->bell_fd;
	ch->bell_state = 0;
	ch->ro = m->ro;
	ch->crw = m->rw;
	ch->want_wakeup = m->want_wakeup;
	ch->sq_tail = &m->rw->sq_tail;
	ch->sq_mask = m->sq_size - 1;
	ch->marked = 0;
	ch->flushed = cq_base;
	ch->taken_seen = ch->periodic_end = cq_base;
	at_store(&ch->head_watch, UINT64_MAX);  /* B1: nothing of the new ring to watch yet */
	ch->sq_head_pub = m->sq_base;
	/*
	 * The client has mapped (and sealed) the writable segment already, but
	 * has no welcome yet: what it writes meanwhile is its own loss, and
	 * every later read of these is one load, checked (single atomic
	 * stores, so that even a hostile writer is no data race of ours).
	 */
	at_store(&m->rw->sq_tail, m->sq_base);
	at_store(&m->ro->sq_head, m->sq_base);
	at_store(&m->rw->cq_head, cq_base);
	at_store(&m->ro->cq_tail, cq_base);
	/* Formats the slots (seq = position); the grants follow below. */
	chime_sq_cons_init(&ch->sq, m->sq_slots, m->sq_size, m->sq_base);
	chime_cq_prod_init(&ch->cq, m->cq_slots, m->claim, &m->ro->cq_tail, &m->rw->cq_head,
			   m->cq_size);
	ch->cq.tail = ch->cq.head = cq_base;
	ch->room = m->cq_size;
	for (uint32_t i = 0; i < m->sq_size; i++) {
		/* A full slab or a zero quota leaves markers: the client connects, its arms fail fast. */
		ch->grants[i] = grant_slot(sc, ch);
		ch->grant_flags[i] = 0;         /* its tag is the client's to write: no block faulted in yet */
		ch->marked += (uint32_t)chime_grant_is_marker(ch->grants[i]);
		marked_bit(ch, i, chime_grant_is_marker(ch->grants[i]));
		/* As above: before the welcome, which follows our hand-back. */
		at_store(&m->sq_slots[i].grant, grant_public(ch->grants[i]));
		at_store(&m->sq_slots[i].grant_flags, 0);
	}
}

/*
 * The share of user uid in this shard, for one more channel, now `quota`
 * nodes (a reload may have moved it). A linear scan, at attach only: at
 * most one entry per channel, and the first free one is reused.
 */
static struct chan_user *user_get(struct shard_core *sc, uint32_t uid, uint64_t quota)
{
	struct chan_user *u = NULL;

	for (uint32_t i = 0; i < sc->nr_users; i++) {
		struct chan_user *e = &sc->users[i];

		if (e->chans && e->uid == uid) {
			e->chans++;
			e->quota = quota;
			return e;
		}
		if (!e->chans && !u)
			u = e;
	}
	if (!u) {
		assert(sc->nr_users < sc->max_clients);
		u = &sc->users[sc->nr_users++];
	}
	*u = (struct chan_user){ .uid = uid, .chans = 1, .quota = quota };
	return u;
}

void chan_mem_layout(struct chan_mem *m, void *rw, void *ro, const struct chime_client_geom *g, uint32_t s)
{
	*m = (struct chan_mem){
		.sq_slots = (struct chime_sqe *)((char *)rw + g->rw_sq_off) + (size_t)s * g->sq_size,
		.claim = (uint64_t *)((char *)rw + g->rw_claim_off) + (size_t)s * g->cq_size,
		.rw = (struct chime_chan_rw *)((char *)rw + g->rw_chan_off) + s,
		.ro = (struct chime_chan_ro *)((char *)ro + g->ro_chan_off) + s,
		.cq_slots = (struct chime_cqe *)((char *)ro + g->ro_cq_off) + (size_t)s * g->cq_size,
		.want_wakeup = &((struct chime_client_rw *)rw)->want_wakeup,
		.sq_size = g->sq_size,
		.cq_size = g->cq_size,
		.wake_fd = -1,
		.bell_fd = -1,
	};
}

/* A channel with no records, grants or lists yet, for slot and uid. */
static int chan_init(struct shard_core *sc, struct chan *ch, uint16_t slot, uint32_t uid, uint64_t user_quota,
		     uint32_t sq_size)
{
	memset(ch, 0, sizeof(*ch));
	ch->grants = calloc(sq_size, sizeof(*ch->grants));
	ch->grant_flags = calloc(sq_size, sizeof(*ch->grant_flags));
	ch->marked_bits = calloc((sq_size + 63) / 64, sizeof(*ch->marked_bits));
	if (!ch->grants || !ch->grant_flags || !ch->marked_bits) {
		free(ch->grants);
		free(ch->grant_flags);
		free(ch->marked_bits);
		ch->grants = NULL;
		ch->grant_flags = NULL;
		ch->marked_bits = NULL;
		return -ENOMEM;
	}
	ch->slot = slot;
	ch->user = user_get(sc, uid, user_quota);
	if (sc->user_of_slot)   /* the slot has no timer in the wheel: reclaimed, or never used */
		sc->user_of_slot[slot] = (uint16_t)(ch->user - sc->users);
	ch->backlog.head = ch->backlog.tail = CHIME_NIL;
	ch->ackwait.head = ch->ackwait.tail = CHIME_NIL;
	ch->carried.head = ch->carried.tail = CHIME_NIL;
	return 0;
}

int chan_attach(struct shard_core *sc, struct chan *ch, const struct chan_mem *m, uint16_t slot,
		uint64_t generation, uint32_t uid, uint64_t user_quota)
{
	int r = chan_init(sc, ch, slot, uid, user_quota, m->sq_size);

	if (r < 0)
		return r;
	if (m->touch_word) {
		uint64_t runs = ((uint64_t)sc->capacity + TOUCH_RUN - 1) / TOUCH_RUN;
		uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
		uint64_t pages = ((uint64_t)sc->capacity * sizeof(uint32_t) + page - 1) / page + 1;
		uint64_t blocks = ((uint64_t)sc->capacity + TOUCH_WORD_BLOCK - 1) / TOUCH_WORD_BLOCK;

		ch->touch_page_shift = (uint8_t)__builtin_ctzll(page);
		ch->touch_seen = calloc((runs + 63) / 64, sizeof(*ch->touch_seen));
		ch->touch_ready = calloc((pages + 63) / 64, sizeof(*ch->touch_ready));
		ch->touch_word_wants = calloc((blocks + 63) / 64, sizeof(*ch->touch_word_wants));
		ch->touch_tag_wants = calloc((blocks + 63) / 64, sizeof(*ch->touch_tag_wants));    /* blocks of tags: fewer */
		if (!ch->touch_seen || !ch->touch_ready || !ch->touch_word_wants || !ch->touch_tag_wants) {
			/*
			 * Never attached here, so no detach will end it (run_cmds():
			 * "never attached"): give the user's share chan_init() took
			 * back now, or each failure keeps an entry of sc->users
			 * for good, until user_get() finds none free.
			 */
			ch->user->chans--;
			chan_fini(ch);
			return -ENOMEM;
		}
		ch->touch_word = m->touch_word;
		ch->touch_tag = m->touch_tag;
	}
	rings_init(sc, ch, m);
	sc->by_slot[slot] = ch;
	stats_client_attach(sc->st, slot, generation);
	return 0;
}

/*
 * The grants of unused slots, from ch->grants_pos on: freed (their ids were
 * never armed: nobody can name them), or carried if the broker stops under
 * a live process (they stay valid for what it publishes next). A slot a
 * unit of *budget; false if it ran out first. In steps: a 1M-slot ring
 * (--sq-size) let go in one call held every timer of the shard back for
 * all of it.
 */
static bool grants_let_go(struct shard_core *sc, struct chan *ch, bool carry, uint32_t *budget)
{
	/* None owned, none granted: the slots left hold markers, which every walk skips. */
	for (; ch->grants_pos <= ch->sq_mask && ch->owned; ch->grants_pos++) {
		uint64_t g = ch->grants[ch->grants_pos];

		if (!*budget)
			return false;
		(*budget)--;
		ch->grants[ch->grants_pos] = 0;
		ch->grant_flags[ch->grants_pos] = 0;
		if (chime_grant_is_marker(g))
			continue;
		if (carry)
			chan_carry(sc, ch, chime_id_index(g));
		else
			grant_free(sc, ch, g);
	}
	ch->marked = 0;
	memset(ch->marked_bits, 0, (ch->sq_mask + 64) / 64 * sizeof(*ch->marked_bits));
	return true;
}

void chan_hold_at(struct shard_core *sc, uint32_t idx, uint64_t deadline_ns)
{
	struct chime_node *n = NODE(sc, idx);

	assert(deadline_ns < CHAN_POS_AT);
	n->cq_pos = CHAN_POS_AT | deadline_ns;
	/*
	 * F1: the tag before anything else moves. Without it, wheel_cancel()
	 * left an ALLOC node at the next period's deadline, which restore.c
	 * takes for a cancel in progress (ALLOC, not due) and frees.
	 */
	at_crash_order();
	wheel_cancel(&sc->wh, idx);
	n->deadline_ns = deadline_ns;
	n->state = CHIME_NODE_BACKLOG;
	/* F2: all of it before the caller's next cq_pos, which ends the move. */
	at_crash_order();
}

/*
 * The park's void of the event at pos in the process's ring: true if it
 * won (the process never took the event, and never will). Across the CAS
 * the node says "delivered, maybe taken, maybe voided" (CHAN_POS_OLD |
 * CHAN_POS_UNSURE | pos, F3): a broker killed then leaves an event its
 * process's word settles, by the claim word it copies from that ring
 * (restore.c, settle()): taken, dropped; voided, delivered again; without
 * the word, or a word without claim words, delivered again. The caller
 * ends the tag: the node held (won), or freed or left to go on (lost).
 * Before, a one-shot's position was cleared before the CAS and a
 * periodic's tagged with its deadline to be held, so a kill after a lost
 * CAS (the process had just taken it) delivered it once more to a process
 * that lived on, through a stop's park as through a crash.
 */
static bool park_void(struct chan *ch, struct chime_node *n, uint64_t pos)
{
	n->cq_pos = CHAN_POS_OLD | CHAN_POS_UNSURE | pos;
	at_crash_order();       /* F3: the tag before the CAS */
	return chime_cq_void(&ch->cq, pos);
}

/*
 * A periodic whose next firing is held (BACKLOG) behind its event at pos,
 * which the process has not been seen to take: one event at most, as
 * always. If the process never took it, it is voided and the held firing
 * goes back to its deadline (delivering it re-arms the timer where it was,
 * as park_periodic() holds one), so that no period is lost; if it took
 * it, the held firing stays as it is. Before, the void came first and the
 * deadline after: a broker killed between them lost that event's period.
 *
 * Crash order (restore.c): F8, CHAN_POS_BEHIND with the position before
 * the claim CAS, so that a broker killed across it leaves that event,
 * maybe taken, for the process's word to settle; then, won, the move
 * under chan_hold_at()'s tag (F1, F2). A held periodic with a plain
 * position already reads as held behind its event, so nothing moves
 * before the tag. A slot whose deadline is not the period before the
 * held one (never, from this broker) is only voided.
 */
static void park_held_periodic(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t pos)
{
	struct chime_node *n = NODE(sc, idx);
	uint64_t event = event_deadline(sc, ch, n, pos);

	if (n->deadline_ns < n->period_ns || event != n->deadline_ns - n->period_ns) {
		event_void(ch, n);
		return;
	}
	n->cq_pos = CHAN_POS_OLD | CHAN_POS_UNSURE | CHAN_POS_BEHIND | pos;
	at_crash_order();       /* F8 */
	if (chime_cq_void(&ch->cq, pos))
		chan_hold_at(sc, idx, event);
	n->cq_pos = CHIME_POS_NONE;
}

/*
 * A periodic's event at pos in the old ring: if the process never took it,
 * off the wheel, held at that event's deadline (delivering it re-arms the
 * timer where it was), and true; if it took it, the timer goes on.
 */
static bool park_periodic(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t pos)
{
	struct chime_node *n = NODE(sc, idx);
	uint64_t deadline_ns;

	if (chan_pos_old(pos) || pos >= ch->cq.tail || chime_cq_consumed(&ch->cq, pos)) {
		n->cq_pos = CHIME_POS_NONE;
		return false;
	}
	deadline_ns = event_deadline(sc, ch, n, pos);     /* fired: below now */
	if (!park_void(ch, n, pos)) {
		n->cq_pos = CHIME_POS_NONE;
		return false;
	}
	chan_hold_at(sc, idx, deadline_ns);
	n->cq_pos = CHIME_POS_NONE;
	return true;
}

/*
 * An event of node idx at cq position pos, voided by us: it comes back.
 * Kept by position (park_order) so that they return in ring order, or
 * straight onto the list if that array could not be had.
 */
static void park_keep(struct shard_core *sc, struct chan *ch, struct nlist *back, uint32_t idx,
		      uint64_t pos)
{
	uint32_t *slot = ch->park_order ? &ch->park_order[pos & ch->cq.mask] : NULL;

	NODE(sc, idx)->state = CHIME_NODE_BACKLOG;
	if (slot && !*slot)
		*slot = idx + 1;
	else
		nl_push(sc, back, idx);
}

/*
 * What a node of a list walk costs of a park's or reclaim's budget, where
 * a node of the sweep costs 1: the sweep reads the slab in order, a list
 * is walked by its links, and each of its nodes is a miss or more at 1M
 * (the node, its event's slot and claim word, its place in park_order).
 * At 1 a node, a pass of RECLAIM_BUDGET (16384) walked a parking session's
 * 1M delivered events for 3.7-4.4 ms, and another user's timers were up to
 * that late, at p99 3.9-4.7 ms; at 16, 0.5-1.9 ms at p99
 * (hostile/a_session_that_goes_with_a_full_ring_..., 2026-12-07).
 */
#define WALK_COST 16u

/* One walked node's cost taken from *budget; false if none is left. A budget under one node's cost still moves one. */
static inline bool budget_walk(uint32_t *budget)
{
	if (!*budget)
		return false;
	*budget = *budget > WALK_COST ? *budget - WALK_COST : 0;
	return true;
}

/* chan_park(); taken_only: the ring's last look and its delivered one-shots only (chan_park_cut()). */
static bool park_n(struct shard_core *sc, struct chan *ch, uint32_t budget, bool taken_only)
{
	struct nlist back = { CHIME_NIL, CHIME_NIL };
	uint32_t idx, end;
	uint64_t nback = 0;

	if (!ch->parked) {
		if (!ch->park_lap_end)
			ch->park_lap_end = ch->sq.head + ch->sq_mask + 1;
		/*
		 * What the process published before it went is applied, as if it
		 * had lived a little longer.
		 * Also what its other threads published behind a slot that one
		 * of them reserved and never published (killed in between): the
		 * head stops at that slot, and the arms after it, whose ids their
		 * threads had returned, would be lost. At a handover too: the
		 * process may be gone already (its hang-up not seen yet), or go
		 * before its library reconnects, and the next broker never sees
		 * these rings; one that lives publishes the slot later, and its
		 * library re-submits it as any record we did not apply (its seq
		 * says so: a stepped-over slot is never freed). Up to a lap from
		 * where the park began: a writer still alive (the segment passed
		 * to another process) cannot keep the shard here.
		 * In steps, a record costing what a walked node does: a ring
		 * (--sq-size, up to 1M) applied in one call held every timer of
		 * the shard back for all of it.
		 */
		for (;;) {
			uint64_t left = ch->park_lap_end > ch->sq.head ? ch->park_lap_end - ch->sq.head : 0;
			uint32_t want = budget / WALK_COST ? budget / WALK_COST : 1, n;

			if (want > left)
				want = (uint32_t)left;  /* 0: a CANCEL_KEY's step only */
			n = chan_drain(sc, ch, want);
			budget = budget > n * WALK_COST ? budget - n * WALK_COST : 0;
			if (want && n == want) {
				if (!budget)
					return false;   /* more may be published: the next call's */
				continue;
			}
			if (!want || ch->walk_queued || !chime_sq_skip_unpublished(&ch->sq))
				break;
		}
		/*
		 * A CANCEL_KEY in steps: the rest once it is done. Not for a
		 * stop's cut, which settles what the process took now (the
		 * shard stops right after): it returned here, settled nothing,
		 * and the restore gave back events the process had taken (a
		 * review). A process that lives re-submits the CANCEL_KEY from
		 * its ring (sq_head stayed at it); one that died loses the
		 * rest of its walk, as a crash does.
		 */
		if (ch->walk_queued && !taken_only)
			return false;
		/*
		 * Restored events still waiting for the process's word: by the
		 * word if it came (a stop before the shard read it); else they
		 * keep waiting, their old positions in their nodes (so in the
		 * shard file). This connection's going says nothing of the
		 * process: a library whose welcome came too late (10 s) hangs
		 * up and resumes again, with the words of the ring it still
		 * has; settled as untaken, the events it took came twice. The
		 * next attach settles them: by its word if it resumes, else as
		 * untaken (chan_reattach()).
		 */
		if (!settled(sc, ch))
			ch->word_wait = 0;
		/* At once: a 1M-slot ring's took 20-36 ms of one pass (2026-12-07), within what one may take. */
		ch->grants_pos = 0;
		(void)grants_let_go(sc, ch, ch->handover, &(uint32_t){ UINT32_MAX });
		/*
		 * Node + 1 by position, 0 for none: zeroed pages from calloc(),
		 * faulted in as the walk writes them, in ring order, a page a
		 * step. Filled with CHIME_NIL here, a 1M-slot ring's 4 MiB took
		 * 10.3 ms of page faults in one pass (another user's timers
		 * waited that long: hostile/a_session_that_goes_with_a_full_ring_...).
		 */
		ch->park_order = calloc(ch->cq.size, sizeof(*ch->park_order));
		/*
		 * The claim word decides who has a delivered one-shot: the
		 * process, or the next one. One known taken keeps its position
		 * until it is freed (a restore reads it taken by the head).
		 */
		ch->room = room_refresh(sc, ch);
		ch->parked = 1;
		ch->park_lap_end = 0;
		/*
		 * A periodic with an event in the old ring is at a position in
		 * [head, tail): with none there, nothing is left to find, and
		 * the sweep of the slab (all of its high-water mark) is skipped.
		 * A process that closes with its events taken parks at once.
		 */
		ch->sweep_pos = ch->cq.head == ch->cq.tail ? sc->wh.w->high_water : 0;
		ch->park_pos = ch->cq.head;
		ch->park_last = CHIME_NIL;
	}
	/*
	 * The ring's last look, then its delivered one-shots, then the sweep,
	 * then the ring order: `budget` in all per call, each part done before
	 * the next begins. The ring's head and tail are the shard's own copies,
	 * read for the last time above: nothing moves them while it parks.
	 * Before, the first call did the first two whole, up to a ring's worth
	 * each (--cq-size, up to 1M), and the last the ring order: a session
	 * gone with a full 1M-slot ring of delivered events made another
	 * user's timers 174-208 ms late, 5-15 ms after
	 * (hostile/a_session_that_goes_with_a_full_ring_...).
	 */
	if (periodics_behind(ch))
		periodics_taken(sc, ch, &budget);
	while (!periodics_behind(ch) && (idx = ch->ackwait.head) != CHIME_NIL) {
		struct chime_node *n = NODE(sc, idx);
		uint64_t pos = n->cq_pos;

		/* Without park_order those coming back go on `back` in this order: all in one call, as they were. */
		if (ch->park_order && !budget_walk(&budget))
			break;
		nl_del(sc, &ch->ackwait, idx);
		if (pos >> 62 == 0 && !chime_cq_consumed(&ch->cq, pos) && park_void(ch, n, pos)) {
			park_keep(sc, ch, &back, idx, pos);
			n->cq_pos = CHIME_POS_NONE;
			nback++;
		} else {
			node_release(sc, ch, idx);      /* from ACKWAIT, as in chan_service() */
		}
	}
	/*
	 * A cut: the periodics with an event in the old ring, found by the
	 * ring's own slots (written by this shard; a ring's worth at most),
	 * not by the sweep, which it skips. Left to the restore, an event the
	 * process took came again (a review).
	 */
	for (uint64_t pos = ch->cq.head; taken_only && !periodics_behind(ch) && ch->ackwait.head == CHIME_NIL &&
	     pos != ch->cq.tail; pos++) {
		const struct chime_cqe *e = &ch->cq.slots[pos & ch->cq.mask];
		struct chime_node *n;

		idx = chime_id_index(e->id);
		if (!(e->flags & CHIME_CQE_PERIODIC) || idx >= sc->wh.w->high_water)
			continue;
		n = NODE(sc, idx);
		if (n->owner != ch->slot || n->cq_pos != pos)
			continue;
		if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED) {
			if (park_periodic(sc, ch, idx, pos)) {
				park_keep(sc, ch, &back, idx, pos);
				nback++;
			}
		} else if (n->state == CHIME_NODE_BACKLOG && n->period_ns && !chime_cq_consumed(&ch->cq, pos)) {
			park_held_periodic(sc, ch, idx, pos);
		}
	}
	/* Periodic timers with an event in the old ring: the claim word decides for them too. */
	end = sc->wh.w->high_water;
	while (!taken_only && !periodics_behind(ch) && ch->ackwait.head == CHIME_NIL && ch->sweep_pos < end &&
	       budget) {
		struct chime_node *n = NODE(sc, idx = ch->sweep_pos++);
		uint64_t pos = n->cq_pos;

		budget--;
		if (n->owner != ch->slot || pos == CHIME_POS_NONE)
			continue;
		if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED) {
			if (!park_periodic(sc, ch, idx, pos))
				continue;
			park_keep(sc, ch, &back, idx, pos);
			nback++;
		} else if (n->state == CHIME_NODE_BACKLOG) {
			if (chan_pos_old(pos))
				continue;       /* waiting for the process's word, above */
			if (n->period_ns && pos >> 62 == 0 && pos < ch->cq.tail && !chime_cq_consumed(&ch->cq, pos))
				park_held_periodic(sc, ch, idx, pos);
			else
				event_void(ch, n);
		}
	}
	if (!taken_only && !periodics_behind(ch) && ch->ackwait.head == CHIME_NIL && ch->sweep_pos >= end &&
	    ch->park_order) {
		struct nlist ring = { CHIME_NIL, CHIME_NIL };

		/*
		 * Done: what the ring held comes back in ring order, right after
		 * what the calls before put back in ring order (earlier in the
		 * ring), or, the first, at the head of the backlog.
		 */
		for (; ch->park_pos != ch->cq.tail && budget; ch->park_pos++) {
			idx = ch->park_order[ch->park_pos & ch->cq.mask];
			if (!idx)
				budget--;
			else if (budget_walk(&budget))
				nl_push(sc, &ring, idx - 1);
		}
		if (ring.head != CHIME_NIL && ch->park_last == CHIME_NIL) {
			if (back.head == CHIME_NIL) {
				back = ring;
			} else {
				NODE(sc, back.tail)->next = ring.head;
				NODE(sc, ring.head)->prev = back.tail;
				back.tail = ring.tail;
			}
		} else if (ring.head != CHIME_NIL) {
			/* Still in the backlog: nothing takes a parking channel's nodes out of it. */
			uint32_t next = NODE(sc, ch->park_last)->next;

			NODE(sc, ch->park_last)->next = ring.head;
			NODE(sc, ring.head)->prev = ch->park_last;
			NODE(sc, ring.tail)->next = next;
			if (next != CHIME_NIL)
				NODE(sc, next)->prev = ring.tail;
			else
				ch->backlog.tail = ring.tail;
		}
		if (ring.head != CHIME_NIL)
			ch->park_last = ring.tail;
		if (ch->park_pos == ch->cq.tail) {
			free(ch->park_order);
			ch->park_order = NULL;
		}
	}
	/* Those fired before anything in the backlog: they go first. */
	if (back.head != CHIME_NIL) {
		if (ch->backlog.head != CHIME_NIL) {
			NODE(sc, back.tail)->next = ch->backlog.head;
			NODE(sc, ch->backlog.head)->prev = back.tail;
			back.tail = ch->backlog.tail;
		}
		ch->backlog = back;
	}
	ch->nr_backlog += nback;
	sc->backlog += nback;
	if (periodics_behind(ch) || ch->ackwait.head != CHIME_NIL || ch->sweep_pos < end || ch->park_order)
		return false;
	stats_client_depth(sc->st, ch->slot, 0, ch->nr_backlog);
	/* Its rings went with its process, and the shard measures active channels only (publish()). */
	stats_client_sq(sc->st, ch->slot, 0);
	return true;
}

bool chan_park(struct shard_core *sc, struct chan *ch, uint32_t budget)
{
	return park_n(sc, ch, budget, false);
}

void chan_park_cut(struct shard_core *sc, struct chan *ch)
{
	(void)park_n(sc, ch, UINT32_MAX, true);
}

/* A user's last sweep turn; a channel without one (never one chan_init() made) goes last. */
static inline uint64_t sweep_user_turn(const struct chan *ch)
{
	return ch->user ? ch->user->reclaim_turn : UINT64_MAX;
}

bool chan_sweeps_before(const struct chan *a, const struct chan *b)
{
	uint64_t ua = sweep_user_turn(a), ub = sweep_user_turn(b);

	return ua != ub ? ua < ub : a->sweep_turn < b->sweep_turn;
}

void chan_sweep_served(struct chan *ch, uint64_t turn)
{
	ch->sweep_turn = turn;
	if (ch->user)
		ch->user->reclaim_turn = turn;
}

int chan_restore_init(struct shard_core *sc, struct chan *ch, uint16_t slot, uint64_t generation,
		      uint32_t uid, uint64_t user_quota, uint32_t sq_size)
{
	int r = chan_init(sc, ch, slot, uid, user_quota, sq_size);

	if (r < 0)
		return r;
	ch->sq_mask = sq_size - 1;      /* grants_let_go() walks the (empty) grants on a reclaim */
	ch->parked = 1;
	ch->session = 1;
	ch->wake_fd = ch->bell_fd = -1;
	sc->by_slot[slot] = ch;
	stats_client_attach(sc->st, slot, generation);
	return 0;
}

void chan_reattach(struct shard_core *sc, struct chan *ch, const struct chan_mem *m, bool resume)
{
	if (!resume) {
		carried_free(sc, ch);
		settle(sc, ch, false, 0);
	}
	rings_init(sc, ch, m);
	ch->parked = 0;
	ch->handover = 0;
	ch->resuming = resume;
	ch->word_wait = resume;
}

/*
 * Arms the client could not make that are still in its ring (NOPs in
 * marked slots): counted now, when it goes, or a client refused and gone
 * at once would be in neither the counters nor the log. Nothing else of the
 * ring is applied; at most a ring's worth from its head, published or not,
 * a slot a unit of *budget from ch->refused_pos on (false if it ran out
 * first): a 1M-slot ring read in one call held the shard that long.
 */
static bool refused_left(struct shard_core *sc, struct chan *ch, uint32_t *budget)
{
	struct chime_sqe r;

	for (; ch->refused_pos - ch->sq.head <= ch->sq_mask; ch->refused_pos++) {
		uint64_t g = ch->grants[ch->refused_pos & ch->sq_mask];

		if (!*budget)
			return false;
		if (!chime_sq_peek(ch->sq.slots, ch->sq.mask, ch->refused_pos, &r))
			break;
		(*budget)--;
		if (r.op == CHIME_OP_NOP && chime_grant_is_marker(g))
			stats_refused(sc->st, ch->slot, refusal(g));
	}
	ch->refused_pos = ch->sq.head + ch->sq_mask + 1;       /* done: the next calls read nothing */
	return true;
}

bool chan_reclaim(struct shard_core *sc, struct chan *ch, uint32_t budget)
{
	uint32_t end, idx;

	if (!ch->dying) {
		ch->dying = 1;
		/* A parked channel's rings went with its process: none to read. */
		ch->refused_pos = ch->sq.head + (!ch->parked && ch->sq.slots ? 0 : (uint64_t)ch->sq_mask + 1);
		ch->grants_pos = 0;
		if (sc->walk_head == ch) {
			/*
			 * Its CANCEL_KEY goes too (every node of the client
			 * goes), and the head with it to the user served
			 * longest ago, as when a walk ends: in list order, a
			 * user detaching its connections one by one kept the
			 * head (a review).
			 */
			if (ch->walk_stepped)
				ch->user->walk_turn = ++sc->walk_turns;
			walk_dequeue(sc, ch);
			walk_pick(sc);
		} else {
			walk_dequeue(sc, ch);
		}
		carried_free(sc, ch);
		settle(sc, ch, false, 0);
		ch->sweep_pos = 0;
	}
	/* Its ring's refused arms read before its grants go (a marker says refused), both in steps. */
	if (!refused_left(sc, ch, &budget) || !grants_let_go(sc, ch, false, &budget))
		return false;
	/*
	 * Its held events (up to its quota: a client that never drained) and
	 * its delivered ones, in steps as the sweep: all at once, a client
	 * with 900k held held the shard 40-50 ms as it went (2026-12-07).
	 * Dying, its timers that fire are freed, never held (fire()).
	 */
	while ((idx = ch->backlog.head) != CHIME_NIL && budget_walk(&budget)) {
		wall_disarm(sc, NODE(sc, idx));
		backlog_del(sc, ch, idx);
		node_release(sc, ch, idx);
	}
	while ((idx = ch->ackwait.head) != CHIME_NIL && budget_walk(&budget)) {
		nl_del(sc, &ch->ackwait, idx);
		node_release(sc, ch, idx);
	}
	if (ch->backlog.head != CHIME_NIL || ch->ackwait.head != CHIME_NIL)
		return false;
	/* What is left is on the wheel: find it by owner. O(high_water), in steps. */
	end = sc->wh.w->high_water;
	while (ch->owned && ch->sweep_pos < end && budget--) {
		struct chime_node *n;

		idx = ch->sweep_pos++;
		n = NODE(sc, idx);
		if (n->owner != ch->slot)
			continue;
		if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED) {
			wall_disarm(sc, n);
			n->cq_pos = CHIME_POS_NONE;     /* off the wheel with one, it would read as re-arming */
			wheel_cancel(&sc->wh, idx);
			node_release(sc, ch, idx);
		}
	}
	if (ch->owned && ch->sweep_pos < end)
		return false;
	/* owned must be 0 here; if not, private state is corrupt and we leak rather than crash. */
	assert(ch->owned == 0);
	if (sc->by_slot[ch->slot] == ch)
		sc->by_slot[ch->slot] = NULL;
	ch->user->chans--;
	stats_client_detach(sc->st, ch->slot);
	return true;
}

void chan_fini(struct chan *ch)
{
	free(ch->grants);
	ch->grants = NULL;
	free(ch->grant_flags);
	ch->grant_flags = NULL;
	free(ch->marked_bits);
	ch->marked_bits = NULL;
	free(ch->touch_seen);
	ch->touch_seen = NULL;
	free(ch->touch_ready);
	ch->touch_ready = NULL;
	free(ch->touch_word_wants);
	ch->touch_word_wants = NULL;
	free(ch->touch_tag_wants);
	ch->touch_tag_wants = NULL;
	ch->touch_want = 0;
	ch->touch_word = NULL;
	ch->touch_tag = NULL;
	free(ch->park_order);
	ch->park_order = NULL;
	chan_settle_set(ch, NULL, 0);
}
