/* SPDX-License-Identifier: MIT */
/*
 * restore.h - a new broker adopts the timers an earlier one left in a shard
 * file (ARCHITECTURE.md, "Broker restart"). Called once per shard at
 * start-up, after wheel_rebuild() has re-laid the wheel from the nodes.
 *
 * What it trusts: the geometry (checked by the caller and wheel_rebuild()),
 * each node's own fields once checked (state, owner, generation), and the
 * sessions file's verdict on which slots hold a session (sc->by_slot). What
 * it does not: every link (backlog and ACKWAIT lists, key-index chains) is
 * rewritten from the nodes, never followed.
 */
#ifndef CHIMED_RESTORE_H
#define CHIMED_RESTORE_H

#include <stdint.h>

#include "chan.h"

struct restore_stats {
	uint64_t kept;          /* timers of sessions kept: armed or held */
	uint64_t anonymous;     /* timers of anonymous clients: freed */
	uint64_t anonymous_grants;      /* their grants (a node set aside per submission slot): freed */
	uint64_t grants;        /* a session's grants (or ARMs caught half-way): carried for its process */
	uint64_t dropped;       /* damaged (bad state, generation or owner): freed */
	uint64_t redelivered;   /* events the old broker delivered that may not have been taken: held again */
	uint64_t due;           /* came due while no broker ran: they fire at the first advance, late */
	uint64_t sessions;      /* sessions with at least one timer here */
};

/*
 * Adopt the nodes [0, high_water) of sc->wh after wheel_rebuild(): a node
 * whose owner slot has a channel in sc->by_slot (chan_restore_init()) is
 * kept; every other one is freed. Kept nodes:
 *   - ARMED, EXPIRED: stay on the wheel (due ones fire at the next advance);
 *     a periodic whose event was in the old ring (cq_pos set) is held with
 *     that event's deadline instead, as chan_park() does;
 *   - ACKWAIT (a one-shot delivered, its claim word out of reach): held again,
 *     its old position kept in cq_pos (CHAN_POS_OLD, and CHAN_POS_UNSURE if a
 *     park was voiding it) until its process's word;
 *   - BACKLOG: held (with such a position if a broker before us held it so);
 *   - ALLOC due at the old wheel's last advance (old_now_ns, read before
 *     wheel_rebuild() set the clock): popped as due and not yet held or
 *     delivered: held; any other ALLOC (a grant being made, an ARM half
 *     applied, a cancel): carried, as GRANTED nodes are;
 *   - ALLOC periodic with an old-ring position, due or not: its event
 *     there delivered, its next deadline stored (deliver() re-arming it,
 *     or popped while that event waited), read as ARMED;
 *   - whatever its state, a node tagged CHAN_POS_AT (a periodic's event
 *     that a park or a restore was holding again, or that deliver() was
 *     writing): held at the tagged deadline.
 * Held events go back in the order they fired: old-ring events by ring
 * position, then the backlog by deadline. The key index is rebuilt from
 * scratch (its heads zeroed here). Returns 0, or -ENOMEM for the ordering
 * array (then they are held in slab order).
 */
int restore_nodes(struct shard_core *sc, uint64_t old_now_ns, struct restore_stats *rs);

#endif /* CHIMED_RESTORE_H */
