/* SPDX-License-Identifier: MIT */
/*
 * restore.c - adopt what an earlier broker left in a shard. See restore.h.
 */
#include "restore.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "keyidx.h"
#include "wheel.h"

/* A node coming back as a held event, and where it goes in its channel's order. */
struct back {
	uint16_t owner;
	uint8_t  cls;           /* 0: its event was in the old ring (by position); 1: backlog (by deadline) */
	uint64_t key;
	uint32_t idx;
};

static int back_cmp(const void *pa, const void *pb)
{
	const struct back *a = pa, *b = pb;

	if (a->owner != b->owner)
		return a->owner < b->owner ? -1 : 1;
	if (a->cls != b->cls)
		return a->cls < b->cls ? -1 : 1;
	if (a->key != b->key)
		return a->key < b->key ? -1 : 1;
	return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/*
 * An ALLOC node was between two states of the old shard's. Due at the old
 * wheel's last advance (old_now_ns) with a deadline (or armed already due,
 * at deadline 0), it was popped as due and not yet held or delivered (up to
 * a batch of them while a burst fires), or a held event being delivered:
 * it fired. Otherwise it was becoming a grant, an ARM caught before its
 * deadline was stored (its process re-submits it), or a timer not yet due
 * being cancelled: carried, as GRANTED nodes are (then freed). Not one
 * tagged CHAN_POS_AT: a periodic's event being held again, not a cancel.
 */
static bool alloc_fired(const struct chime_node *n, uint64_t old_now_ns)
{
	return n->deadline_ns <= old_now_ns && (n->deadline_ns != 0 || (n->gen & CHIME_NODE_IMMEDIATE));
}

/*
 * An ALLOC periodic with a position in the old ring: the event there was
 * delivered, and the deadline is the timer's next one (deadline - period
 * is that event's). Read as ARMED, due or not. Left by deliver()
 * re-arming the timer whose event it had written, by a broker before
 * this one (deliver() now tags the node CHAN_POS_AT until the position is
 * stored, F4-F5, chan.c), and by a periodic popped while its previous
 * event waited in the ring (chan_fire() is about to hold it). Before, one
 * due was read as fired at that deadline: a periodic already due again
 * when its delivery was interrupted lost the delivered event into the
 * next one. Nothing else leaves it: a cancel voids the event before the
 * node leaves the wheel (chan.c), and a held periodic is delivered only
 * once its previous event was seen taken (its position forgotten).
 * Any state: a held (BACKLOG) periodic with a position is the same case,
 * its next firing held behind that event (chan_fire()); a park voiding
 * that event tags it CHAN_POS_BEHIND, and moves it back only under
 * chan_hold_at()'s tag (park_held_periodic()).
 */
static bool alloc_rearming(const struct chime_node *n)
{
	return n->period_ns && n->cq_pos >> 62 == 0;
}

static void node_drop(struct wheel *wh, uint32_t idx)
{
	struct chime_node *n = wheel_node(wh, idx);

	if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED)
		wheel_cancel(wh, idx);
	wheel_free(wh, idx);
}

int restore_nodes(struct shard_core *sc, uint64_t old_now_ns, struct restore_stats *rs)
{
	struct wheel *wh = &sc->wh;
	uint32_t end = wh->w->high_water, nback = 0, cap = 0;
	uint64_t now = wh->w->now_ns, armed_realtime = 0;
	uint64_t *armed = calloc(sc->max_clients, sizeof(*armed));
	struct back *back = NULL;
	int r = 0;

	memset(rs, 0, sizeof(*rs));
	if (!armed)
		return -ENOMEM;
	/*
	 * The chains are the old broker's, under its seed: start an empty
	 * index, and leave what we keep out of it until its client's first
	 * CANCEL_KEY indexes it (chan.c), as a new client's timers.
	 */
	memset(sc->ki.heads, 0, ((size_t)sc->ki.mask + 1) * sizeof(*sc->ki.heads));
	for (uint32_t idx = 0; idx < end; idx++) {
		struct chime_node *n = wheel_node(wh, idx);
		struct chan *ch = n->owner < sc->max_clients ? sc->by_slot[n->owner] : NULL;
		uint8_t cls = 1;
		uint64_t key;

		if (n->state == CHIME_NODE_FREE)
			continue;
		if ((n->gen & CHIME_ID_GEN_MASK) == 0) {
			/* No id can name it (generation 0 is a no-grant marker). */
			node_drop(wh, idx);
			rs->dropped++;
			continue;
		}
		if (!ch) {
			/* its grants apart: a connection holds one a submission slot, not a timer */
			if (n->state == CHIME_NODE_GRANTED)
				rs->anonymous_grants++;
			else
				rs->anonymous++;
			node_drop(wh, idx);
			continue;
		}
		if (n->state == CHIME_NODE_GRANTED ||
		    (n->state == CHIME_NODE_ALLOC && !alloc_fired(n, old_now_ns) && !chan_pos_at(n->cq_pos) &&
		     !alloc_rearming(n))) {
			/*
			 * A grant (or an ARM caught between two steps of the old
			 * shard): its process may still arm it, re-submitting what
			 * the old broker never read. Carried until that process
			 * says it is done, or a new process comes (chan.h).
			 */
			chan_carry(sc, ch, idx);
			chan_own(ch);
			rs->grants++;
			continue;
		}
		/*
		 * The deadline was the broker's: if it fires late, that is
		 * lateness, not "immediate". No touch flag: only anonymous
		 * clients have tables, and their timers are not kept. A
		 * wall-clock timer stays one, based on the offset its flag
		 * names: the shard's first pass follows the offset of now.
		 */
		n->gen &= ~(CHIME_NODE_IMMEDIATE | CHIME_NODE_TOUCH);
		key = n->deadline_ns;
		if (chan_pos_at(n->cq_pos)) {
			/*
			 * A periodic's event being held again when the broker
			 * went (chan_hold_at(), by a park or a restore): held at
			 * that event's deadline, whatever state and deadline the
			 * move had reached.
			 */
			chan_hold_at(sc, idx, chan_pos_at_deadline(n->cq_pos));
			n->cq_pos = CHIME_POS_NONE;
			key = n->deadline_ns;
		} else if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED ||
			   alloc_rearming(n) || (n->state == CHIME_NODE_BACKLOG && chan_pos_behind(n->cq_pos))) {
			if (n->cq_pos == CHIME_POS_NONE || !n->period_ns || n->deadline_ns < n->period_ns ||
			    (n->deadline_ns - n->period_ns > now &&
			     (!(n->gen & CHIME_NODE_REALTIME) || n->deadline_ns - n->period_ns >= CHAN_POS_AT))) {
				/*
				 * On the wheel, and no event of it in a ring anyone can still
				 * read. Not on it yet (ALLOC, BACKLOG; ACKWAIT, which only a
				 * damaged periodic can be in here: it stayed ACKWAIT on no
				 * list, counted armed and never fired), it goes on it.
				 */
				n->cq_pos = CHIME_POS_NONE;
				if (n->state != CHIME_NODE_ARMED && n->state != CHIME_NODE_EXPIRED) {
					n->state = CHIME_NODE_ALLOC;
					wheel_arm(wh, idx, n->deadline_ns);
				}
				rs->due += n->deadline_ns <= now;
				armed[n->owner]++;
				goto keep;
			}
			/* A periodic whose last event was in the old ring: it comes back with that deadline
			 * (or, still with an old position, a settle re-armed it as the broker went;
			 * or, CHAN_POS_UNSURE, a park was voiding it; CHAN_POS_BEHIND, held behind it).
			 * A wall-clock one's may be ahead: a step back since it fired (below). */
			key = n->cq_pos & ~(CHAN_POS_OLD | CHAN_POS_BEHIND);
			chan_hold_at(sc, idx, n->deadline_ns - n->period_ns);
			n->cq_pos = CHAN_POS_OLD | key;
			key &= ~CHAN_POS_UNSURE;
			cls = 0;
			rs->redelivered++;
		} else if (n->state == CHIME_NODE_ACKWAIT ||
			   (n->state == CHIME_NODE_BACKLOG && chan_pos_old(n->cq_pos))) {
			/*
			 * Delivered; whether it was taken is in a claim word we
			 * cannot read: again, unless the process tells. Or held so
			 * by a broker before us that went before the process did,
			 * or being voided by a park (CHAN_POS_UNSURE, kept).
			 */
			key = n->cq_pos & ~CHAN_POS_OLD;
			n->cq_pos = CHAN_POS_OLD | key;
			key &= ~CHAN_POS_UNSURE;
			cls = 0;
			rs->redelivered++;
		} else {
			/* BACKLOG, or ALLOC: fired (popped) and not yet held or delivered. */
			n->cq_pos = CHIME_POS_NONE;
			if (n->state == CHIME_NODE_ALLOC && (n->gen & CHIME_NODE_REALTIME)) {
				/*
				 * Popped by the wheel, not yet judged by the wall
				 * clock (wall_early()): early by a step back the
				 * old shard had not followed, it was held and
				 * delivered at once (a review). Back on the wheel,
				 * due: its first firing judges it. It has no event
				 * in a ring, so it cannot come twice.
				 */
				wheel_arm(wh, idx, n->deadline_ns);
				rs->due++;
				armed[n->owner]++;
				goto keep;
			}
		}
		/*
		 * A wall-clock timer's event in the old ring keeps its wall
		 * deadline through a step of the wall clock back (wall_move()),
		 * which leaves its deadline here ahead: delivered all the same,
		 * it waits for its process's word (on the wheel, a process that
		 * took it got it again once the wall clock came back there, and
		 * one that had not waited for that).
		 */
		if (n->deadline_ns > now && !(cls == 0 && (n->gen & CHIME_NODE_REALTIME) && chan_pos_old(n->cq_pos))) {
			/* Held with a deadline still ahead: not what a held event can be (a damaged
			 * node, or one the old broker was putting back on the wheel). Never early: it
			 * goes back on the wheel. */
			n->cq_pos = CHIME_POS_NONE;
			n->state = CHIME_NODE_ALLOC;
			wheel_arm(wh, idx, n->deadline_ns);
			rs->redelivered -= cls == 0;
			armed[n->owner]++;
			goto keep;
		}
		/*
		 * BACKLOG, or coming back: held, in firing order (sorted below).
		 * BACKLOG already in the file, position and all: a broker killed
		 * before the end leaves to the next one what was left to it.
		 */
		if (n->period_ns)
			armed[n->owner]++;      /* a held periodic still counts as armed (stats.h) */
		n->state = CHIME_NODE_BACKLOG;
		if (nback == cap) {
			uint32_t ncap = cap ? cap * 2 : 1024;
			struct back *nb = back ? realloc(back, (size_t)ncap * sizeof(*back)) : malloc((size_t)ncap * sizeof(*back));

			if (!nb) {
				/* No memory to order them: held in slab order, still all of them. */
				r = -ENOMEM;
				n->cq_pos = CHIME_POS_NONE;
				chan_hold(sc, ch, idx);
				goto keep;
			}
			back = nb;
			cap = ncap;
		}
		back[nback++] = (struct back){ .owner = n->owner, .cls = cls, .key = key, .idx = idx };
keep:
		if (n->gen & CHIME_NODE_REALTIME) {
			sc->wall_nodes++;
			chan_wall_note(sc, idx);
			armed_realtime += chan_counts_as_armed(n);
		}
		keyidx_leave_out(n);
		ch->unindexed++;
		chan_own(ch);
		rs->kept++;
	}
	if (nback)
		qsort(back, nback, sizeof(*back), back_cmp);
	for (uint32_t i = 0, first = 0; i < nback; i++) {
		const struct back *b = &back[i];
		struct chan *ch = sc->by_slot[b->owner];

		chan_hold(sc, ch, b->idx);
		if (b->cls != 0)
			continue;
		if (i == 0 || back[i - 1].owner != b->owner || back[i - 1].cls != 0)
			first = i;
		if (i + 1 < nback && back[i + 1].owner == b->owner && back[i + 1].cls == 0)
			continue;
		/* back[first..i]: this channel's events from the old ring; its process may say which it took. */
		struct chan_settle *st = malloc((size_t)(i + 1 - first) * sizeof(*st));

		for (uint32_t k = first; k <= i; k++) {
			struct chime_node *n = wheel_node(wh, back[k].idx);

			/* Without memory: all delivered again, and the next broker must not wait for a word. */
			if (!st)
				n->cq_pos = CHIME_POS_NONE;
			else
				st[k - first] = (struct chan_settle){ .pos = n->cq_pos & ~CHAN_POS_OLD, .idx = back[k].idx,
								      .gen = n->gen & CHIME_ID_GEN_MASK };
		}
		if (st)
			chan_settle_set(ch, st, i + 1 - first);
	}
	free(back);
	for (uint32_t slot = 0; slot < sc->max_clients; slot++) {
		struct chan *ch = sc->by_slot[slot];

		if (!ch)
			continue;
		if (ch->owned)
			rs->sessions++;
		stats_restored(sc->st, slot, armed[slot]);
		stats_client_depth(sc->st, slot, 0, ch->nr_backlog);
		/*
		 * What the quotas count: a parked channel is not active, and the
		 * shard publishes `owned` for active ones only (chimectl users
		 * showed 0 of a quota the restored sessions' timers and held
		 * events were using: an operator audit).
		 */
		stats_client_owned(sc->st, slot, ch->owned);
	}
	stats_armed_realtime(sc->st, armed_realtime);
	free(armed);
	return r;
}
