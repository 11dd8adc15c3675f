/* SPDX-License-Identifier: MIT */
/*
 * chan.h - one client's channel on one shard: applying its submissions to
 * the shard's wheel, delivering its expirations, its backlog and its ACKWAIT
 * list (ARCHITECTURE.md: grants, claim words, backlog, ackwait, doorbells).
 *
 * No threads, sockets or clocks in here: the shard thread (shard.c) calls
 * these with the time it read, and tests call them directly on malloc'd
 * memory. Every function is called by the shard thread that owns `sc` only.
 *
 * Trust (DESIGN invariant 4): everything a client can write (its submission
 * slots and their seq, its cq_head, its claim words, want_wakeup) is read
 * once into a local and checked against the broker's private state below
 * (ring geometry, grants, node owner and generation) before it is used.
 */
#ifndef CHIMED_CHAN_H
#define CHIMED_CHAN_H

#include <stdbool.h>
#include <stdint.h>

#include "chime_shm.h"
#include "keyidx.h"
#include "ring.h"
#include "segment.h"
#include "stats.h"
#include "wheel.h"

/*
 * One user's share of a shard's nodes (the per-user quota): every channel of
 * that uid in the shard counts into it, attached, parked or dying, so
 * neither many connections nor sessions kept past their process give one
 * user more of the slab than --max-timers-per-uid. Its quota comes with
 * each attach (the user's, from the control thread's policy: users differ),
 * the latest one's kept.
 */
/*
 * A wake-up's send() this long is slow; one slow by CPU time holds its
 * user's next ones back this many times as long (wake_send(), chan.c).
 */
#define CHAN_WAKE_SLOW_NS      (500u * 1000u)
#define CHAN_WAKE_QUIET_FACTOR 16u

struct chan_user {
	uint32_t uid;
	uint32_t chans;                 /* its channels in this shard; 0: the entry is free */
	uint64_t owned;                 /* nodes they own here, any state */
	uint64_t quota;                 /* nodes they may own here together (UINT64_MAX: no limit) */
	uint64_t drain_pass;            /* the shard pass drain_left is for (shard.c) */
	uint32_t drain_left;            /* records its channels may still apply in that pass */
	uint32_t service_left;          /* events and nodes chan_service_n() may still move in it */
	uint32_t wake_left;             /* wake-ups (sends) chan_service_n() may still make in it */
	uint64_t reclaim_turn;          /* when its channels' sweeps last had a turn (chan_sweep_served()) */
	uint64_t walk_turn;             /* when its CANCEL_KEY walks last stepped (chan.c, walk_step()) */
	uint64_t wake_quiet_until;      /* its wake-ups are held till then: the last walked its watches (wake_send()) */
};

/* What the channel logic needs of its shard. Owned by the shard thread. */
struct shard_core {
	struct wheel wh;
	struct keyidx ki;
	struct stats *st;               /* this shard's counters (private, published per loop) */
	struct chan **by_slot;          /* client slot -> its channel here (NULL: none) */
	uint32_t shard;
	uint32_t capacity;              /* private copy of the slab size */
	uint32_t max_clients;
	uint64_t quota;                 /* nodes one client may own here (UINT64_MAX: no limit) */
	/* [max_clients]: each channel holds one entry, so [0, nr_users) never outgrows it */
	struct chan_user *users;
	uint32_t nr_users;              /* entries ever used, free ones (chans 0) among them */
	/* [max_clients]: client slot -> its user's entry in users (the wheel's
	 * owner groups: WHEEL_JUMP_GROUP); NULL in tests that need none */
	uint16_t *user_of_slot;
	uint64_t backlog;               /* events held in backlogs, all channels */
	/* the earliest end of a hold on a wake-up owed (chan_service_n()); the shard sleeps no later */
	uint64_t wake_retry_ns;
	/* wake_send()'s marks: the clock, then this thread's CPU time, read before the pass's first send (0: none yet) */
	uint64_t wake_clock_ns, wake_cpu_ns;
	/*
	 * A session's channel started to wait for its process to take events
	 * (head_watch no longer UINT64_MAX) since the shard last looked: a
	 * broker at rest must beat faster again (shard.c, rest_end()).
	 */
	bool watch_started;
	/*
	 * The slab's usable part (wh.reserved) is used up: make more of it
	 * usable now and return true, or false if it cannot (capacity reached,
	 * the filesystem refuses). Set by the shard thread; NULL in tests.
	 */
	bool (*grow)(struct shard_core *sc);
	/*
	 * CANCEL_KEYs applied in steps, in turn: the first channel of this
	 * list walks the key index (at most walk_budget nodes per chan_drain()
	 * call; 0: CHAN_WALK_BUDGET), then goes to the back. Each walk has its
	 * cursor from the start, so a short one is not held up by long ones
	 * queued before it: it waits a step of each, not their whole walks.
	 * A channel's first walk indexes its timers first (index_budget slab
	 * nodes per call; 0: CHAN_INDEX_BUDGET).
	 */
	struct chan *walk_head, *walk_tail;
	uint64_t walk_turns;            /* walk turns given (chan_user.walk_turn) */
	unsigned walk_budget, index_budget;
	/* a grant this near the slab's top and this far above its lowest free node is swapped (0: GRANT_LOWER_NODES) */
	uint32_t grant_lower;
	/*
	 * Wall-clock timers (ARCHITECTURE.md, "Wall-clock timers"): the two
	 * offsets their deadlines may be based on (CHIME_NODE_WALL_B picks
	 * one; new ones take wall_cur), the published offset last followed,
	 * and how many this shard may hold (each follow counts them, each
	 * wall-clock arm adds one: 0, no walk). wall_file: where the offsets
	 * persist (the shard file's header; NULL in tests).
	 */
	int64_t wall_off[2];
	uint32_t wall_cur;
	int64_t wall_seen;
	uint64_t wall_nodes;
	struct chime_shard_seg *wall_file;
	/*
	 * Restored from a file: a walk killed midway may have left nodes on
	 * the offset it was moving them to; the next follow moves those back
	 * to wall_cur's first (chan.c, wall_unmix()).
	 */
	bool wall_mixed;
	/*
	 * A walk under way (chan_wall_step()): the nodes of [wall_walk_i,
	 * wall_walk_end) of it are still on wall_cur's offset; those before,
	 * and every wall-clock arm since, on the other one, which it moves them
	 * to. wall_walk_count: the nodes it found still wall-clock timers;
	 * wall_walk_nodes0: wall_nodes at its start; wall_walk_kept: where
	 * the list's next kept entry goes (it drops the others as it goes).
	 */
	bool wall_walking;
	/*
	 * An offset given while a walk was under way (wall_next_set): the
	 * next walk's, begun as that one ends. Ending it at once instead held
	 * the shard for the rest of it (steps closer than a walk lasts).
	 */
	bool wall_next_set;
	int64_t wall_next;
	uint32_t wall_walk_i, wall_walk_end, wall_walk_kept;
	uint64_t wall_walk_count, wall_walk_nodes0;
	/*
	 * The nodes a walk visits: every node a wall-clock timer took since
	 * the last walk, or before it and still one (each once: wall_listed,
	 * a bit per node; a walk drops what is no longer one). wall_scan: no
	 * memory for them, walks scan the used slab instead.
	 */
	uint32_t *wall_list;
	uint32_t wall_len, wall_cap;
	uint64_t *wall_listed;
	bool wall_scan;
	/* A wall-clock timer early by less waits at firing, by more is followed (0: WALL_FOLLOW_NS; tests raise it). */
	uint64_t wall_wait_ns;
};

/*
 * Nodes of the key index a CANCEL_KEY looks at per chan_drain() call: its
 * chain can hold a million of one client's timers under one key, and the
 * shard fires everyone's timers between steps. ~100 us at a cache miss each.
 */
#define CHAN_WALK_BUDGET 1024u

/*
 * Slab nodes a client's first CANCEL_KEY looks at per chan_drain() call
 * while it indexes that client's timers: read in order (the hardware
 * prefetches them), each a fraction of a chain step's cache miss. Those it
 * links count against the walk's budget (CHAN_WALK_BUDGET), as chain steps.
 */
#define CHAN_INDEX_BUDGET 16384u

/* Where a channel lives in a client's two segments (set up by the control thread). */
struct chan_mem {
	struct chime_sqe *sq_slots;     /* rw: this shard's submission slots */
	uint64_t *claim;                /* rw: this shard's claim words */
	struct chime_chan_rw *rw;       /* rw: sq_tail, cq_head */
	struct chime_chan_ro *ro;       /* ro: cq_tail, sq_head, backlog */
	struct chime_cqe *cq_slots;     /* ro: this shard's completion slots */
	uint32_t *want_wakeup;          /* rw header */
	uint32_t sq_size;               /* powers of two */
	uint32_t cq_size;
	uint64_t sq_base;               /* the submission rings' first position (a multiple of sq_size) */
	int wake_fd;                    /* broker's end of the client's socket; -1: count only (tests) */
	int bell_fd;                    /* this client's doorbell for this shard; -1: none (tests) */
	uint64_t *touch_word;           /* rw: this shard's words of the client's touch table, or NULL */
	uint32_t *touch_tag;            /* rw: and its tags (chime_shm.h) */
};

/*
 * Shard s's channel in a client's segments rw and ro, laid out by g
 * (chime_client_layout()): the one place that knows it on the broker's
 * side. sq_base 0, no socket, no doorbell: the caller sets those it has.
 */
void chan_mem_layout(struct chan_mem *m, void *rw, void *ro, const struct chime_client_geom *g, uint32_t s);

/*
 * In a held (BACKLOG) node's cq_pos, with the position of its event in the
 * ring of the process's previous connection: restored as "delivered, maybe
 * taken" and waiting for the process's word (chan_settle_set()). Kept in
 * the node, so in the shard file: a broker that goes before the word came
 * leaves them to the next one as they were left to it. Positions are below
 * 2^62, so the top two bits (10) tell it from CHIME_POS_NONE and a carried
 * grant's marker (11), and from CHAN_POS_AT (01, below).
 */
#define CHAN_POS_OLD (UINT64_C(1) << 63)

static inline bool chan_pos_old(uint64_t pos)
{
	return pos >> 62 == 2;
}

/*
 * With CHAN_POS_OLD, in a node a park was voiding the event of (a CAS on
 * the claim word whose outcome the node does not show yet): the event may
 * have been taken, or voided and skipped, and the consumer head passes
 * both. Only the claim word tells (resume_claims); without it the event
 * is delivered again.
 */
#define CHAN_POS_UNSURE (UINT64_C(1) << 61)

/*
 * With CHAN_POS_OLD (and CHAN_POS_UNSURE), in a held periodic's cq_pos: a
 * park voiding its event at the position, which is the period before the
 * node's deadline (its next firing was held behind that event). Restored
 * as that event, maybe taken: the process's word settles it (taken: the
 * held firing comes; not: that event, then the held firing). Only in a
 * shard file a park was killed over; positions stay below 2^60.
 */
#define CHAN_POS_BEHIND (UINT64_C(1) << 60)

static inline bool chan_pos_behind(uint64_t pos)
{
	return chan_pos_old(pos) && (pos & CHAN_POS_BEHIND);
}

/*
 * In a periodic's cq_pos, tag 01 instead of a position: its event of the
 * deadline in the low 62 bits is being held again (off the wheel, to the
 * backlog) by a park or a restore, and deadline_ns and state may still be
 * what they were. A broker killed at any store of that move leaves the
 * tag, and the next one holds that event whatever the rest says (restore.c).
 * The deadline fired, so it is below now, far below 2^62 ns.
 */
#define CHAN_POS_AT (UINT64_C(1) << 62)

static inline bool chan_pos_at(uint64_t pos)
{
	return pos >> 62 == 1;
}

static inline uint64_t chan_pos_at_deadline(uint64_t pos)
{
	return pos & (CHAN_POS_AT - 1);
}

/*
 * A node the counters take for armed (stats.h): on the wheel, or a periodic
 * held in a backlog; a fired one-shot is not.
 */
static inline bool chan_counts_as_armed(const struct chime_node *n)
{
	return n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED ||
	       (n->state == CHIME_NODE_BACKLOG && n->period_ns);
}

/*
 * Base every wall-clock node of the shard on offset `off` (CLOCK_REALTIME -
 * CLOCK_MONOTONIC): each moves by the difference from its own base, on the
 * wheel or off it, so that its wall deadline stays where it was. A walk of
 * the slab's used range, unless the shard holds none (sc->wall_nodes 0).
 * Persists the offsets in sc->wall_file as it goes (chime_shm.h).
 */
void chan_wall_follow(struct shard_core *sc, int64_t off);

/*
 * The same in steps: chan_wall_begin() starts a walk to `off` (or, with no
 * wall-clock node or nothing to move, just takes it); with one under way,
 * that one goes on and the next one, to the latest offset given meanwhile,
 * begins as it ends. chan_wall_step() moves up to `budget` nodes, true
 * while more are left. The shard walks so, a step a pass: one user's
 * wall-clock timers held each shard 42-56 ms per step of the wall clock,
 * every other timer with them (a security audit, 2.1M a shard); and a step
 * during a walk, or a node found early at firing, ended or made a whole
 * walk in one pass (a hostile-client audit, 2026-12-07). A node the wheel
 * pops before the walk reaches it is moved then (chan.c, wall_early()).
 */
void chan_wall_begin(struct shard_core *sc, int64_t off);
bool chan_wall_step(struct shard_core *sc, uint32_t budget);

/* Node idx is a wall-clock timer's: on the list walks visit (restore.c; op_arm()). */
void chan_wall_note(struct shard_core *sc, uint32_t idx);

/* Free what the walks' list holds. */
void chan_wall_fini(struct shard_core *sc);

/*
 * Take periodic idx off the wheel (if on it) and hold its event of
 * deadline_ns (fired: at or before the wheel's now): state BACKLOG on no
 * list, deadline_ns that event's, cq_pos CHAN_POS_AT | deadline_ns from the
 * first store on. The caller sets cq_pos next (the node on no list yet).
 */
void chan_hold_at(struct shard_core *sc, uint32_t idx, uint64_t deadline_ns);

/* An event the old broker had delivered at old-ring position pos (restore.c; CHAN_POS_UNSURE in it too). */
struct chan_settle {
	uint64_t pos;
	uint32_t idx;
	uint32_t gen;
};

/* A list of nodes through node.next/prev (BACKLOG or ACKWAIT). */
struct nlist {
	uint32_t head, tail;
};

struct chan {
	struct chime_sq_cons sq;        /* private head and mask */
	struct chime_cq_prod cq;        /* private tail, clamped head, mask */
	struct chime_chan_ro *ro;
	uint32_t *want_wakeup;
	const uint64_t *sq_tail;        /* the client's sq_tail (rw): read for the depth only, bounded */
	uint64_t *grants;               /* private: each submission slot's grant (an id, or a marker) */
	uint64_t *marked_bits;          /* private: a bit per slot whose grant is a marker counted in marked */
	uint8_t  *grant_flags;          /* private: and its CHIME_GRANT_F_* (the shard wrote its tag) */
	uint32_t marked;                /* slots whose grant is a no-grant marker */
	uint32_t sq_mask;
	uint32_t room;                  /* free completion slots, as last computed */
	uint16_t slot;                  /* the client's slot; node.owner of its nodes */
	uint8_t  dying;                 /* detached: its nodes are being reclaimed */
	uint8_t  parked;                /* a session with no process: its timers run, events are held */
	uint8_t  bell_state;            /* shard.c: its doorbell's poll in io_uring (SHARD_BELL_*) */
	uint8_t  handover;              /* parked for the next broker: the grants are carried, not freed */
	uint8_t  resuming;              /* re-attached by a reconnecting library, until its RESUMED */
	uint8_t  word_wait;             /* re-attached so: nothing delivered until its word (settled()) */
	uint8_t  session;               /* a named session's: its takes are watched (head_watch) */
	uint8_t  wake_owed;             /* its client asked for a wake-up its user's share had no room for */
	uint8_t  wake_held;             /* ... or one while its user's wake-ups are held (wake_quiet_until) */
	int wake_fd;
	int bell_fd;
	struct nlist backlog;           /* fired, not yet in the ring, in firing order */
	struct nlist ackwait;           /* one-shots delivered, by cq position */
	struct nlist carried;           /* GRANTED nodes of old rings, for ARMs the library re-submits */
	uint32_t nr_carried;
	uint32_t nr_settle;             /* restored events "delivered, maybe taken", in settle[] */
	struct chan_settle *settle;     /* held back (at the backlog's head) until settled, see chan.c */
	const struct chime_chan_rw *crw; /* the client's rw half of this channel (resume_*) */
	/*
	 * The client's touch table (capacity words and tags), or NULL; and the
	 * runs of TOUCH_RUN nodes whose entries this shard may read and write,
	 * found resident (one bit per run), and how many runs it has checked:
	 * a client cannot make the shard check more than its timers need
	 * (touch_page_ok()).
	 */
	uint64_t *touch_word;
	uint32_t *touch_tag;
	uint64_t *touch_seen;
	uint64_t touch_runs;
	/*
	 * The pages of this shard's tags (from the one holding tag 0) found
	 * resident, where it writes a grant's tag (a bit each), and the node
	 * + 1 from whose tag on the next check looks (0: none): see
	 * chan_touch_check() and touch_want().
	 */
	uint64_t *touch_ready;
	uint32_t touch_want;
	uint32_t touch_wait;            /* grants before the next check may be wanted */
	uint64_t *touch_word_wants;     /* blocks of TOUCH_WORD_BLOCK nodes whose words a RESET_TOUCH wants mapped */
	uint64_t *touch_tag_wants;      /* and blocks of TOUCH_BLOCK nodes whose tags it does */
	/*
	 * The pages being mapped (chan_touch_check()) on the shard's aside
	 * thread, until chan_touch_populated(): TOUCH_POP_TAGS, touch_pop_n of them
	 * from touch_pop_first (as touch_ready numbers them), or
	 * TOUCH_POP_WORDS, the words of touch_pop_n runs from touch_pop_first; 0: none. The
	 * channel is not let go while one is on its way (shard.c).
	 */
	uint8_t touch_pop;
	uint32_t touch_pop_first;
	uint32_t touch_pop_n;
	/*
	 * The RESET_TOUCH at the ring's head waits for its run to be mapped
	 * (chan_drain(), touch_hold()): the client's records behind it wait
	 * with it, for a populate's round trip; touch_plain_pos - 1 is one
	 * applied without waiting, nothing being there to map.
	 */
	uint8_t touch_hold;
	uint8_t touch_failed;           /* a populate of the table failed: no fast path for this client */
	uint64_t touch_plain_pos;
	uint8_t touch_page_shift;
	uint64_t nr_backlog;
	uint64_t owned;                 /* nodes of this shard owned by this client, any state */
	struct chan_user *user;         /* its user's share: owned counts into user->owned too */
	uint64_t flushed;               /* cq tail last published */
	/*
	 * Taken periodic events, recorded in their nodes (room_refresh()):
	 * positions below taken_seen are done; periodic_end is one past the
	 * last periodic event delivered.
	 */
	uint64_t taken_seen;
	uint64_t periodic_end;
	/*
	 * For the control thread's heartbeat (relaxed; written by the shard):
	 * the consumer head as the shard last saw it while events of this ring
	 * wait to be seen taken (ACKWAIT one-shots, periodics), else
	 * UINT64_MAX. A client head past it on a sleeping shard: the shard
	 * file still holds events its process took; it is rung to record them.
	 */
	uint64_t head_watch;
	uint64_t sq_head_pub;           /* sq_head last published */
	uint32_t sweep_pos;             /* reclaim, park: next slab index to look at */
	uint64_t sweep_turn;            /* when its sweep last had a turn (chan_sweep_served()) */
	uint32_t *park_order;           /* park: by cq position, node + 1 of the events that come back (0: none) */
	uint64_t park_pos;              /* park: next cq position of park_order to put in the backlog */
	uint32_t park_last;             /* park: the last node put back in ring order so far, or CHIME_NIL */
	uint64_t park_lap_end;          /* park: its records applied up to here at most (0: not begun) */
	uint32_t grants_pos;            /* reclaim: the slots below let go of their grants (grants_let_go()) */
	uint64_t refused_pos;           /* reclaim: its ring read for refused arms up to here (refused_left()) */
	uint64_t wakes;                 /* client wake-ups done (socket messages) */
	/* A CANCEL_KEY being applied in steps: its record, at walk_pos, is consumed last. */
	struct chan *walk_next;         /* shard_core's list */
	struct keyidx_walk walk;
	uint64_t walk_pos;
	uint64_t walk_armed, walk_fired;
	uint8_t  walk_queued;
	uint8_t  walk_stepped;          /* took the last step: the others' turn before its next */
	uint8_t  walk_begun;            /* its cursor is set: the index holds every node of ours */
	/*
	 * The key index holds this client's nodes only once it sent a
	 * CANCEL_KEY (ARCHITECTURE.md, "Key index"): until then its arms skip
	 * it (about half an arm's shard cost), `unindexed` counting the nodes
	 * left out. Its first CANCEL_KEY sets `keyed` and, before its walk
	 * begins, indexes them in steps of the slab (index_pos: the next
	 * node to look at), stopping once none is left out.
	 */
	uint8_t  keyed;
	uint32_t unindexed;
	uint32_t index_pos;
};

/*
 * Attach: set up private state, give every submission slot a grant (a node,
 * or a no-grant marker when the slab is full or the client or its user
 * (uid) at its quota, user_quota nodes in this shard) and write it with
 * seq = slot (free for position slot). The client must not see the segment
 * before this returns. -ENOMEM only if private memory runs out: a full slab
 * does not keep a client out.
 */
int chan_attach(struct shard_core *sc, struct chan *ch, const struct chan_mem *m, uint16_t slot,
		uint64_t generation, uint32_t uid, uint64_t user_quota);

/*
 * Apply up to `budget` published submissions. Returns how many records were
 * consumed. Publishes sq_head (release) after the VOIDs they caused. A
 * CANCEL_KEY is applied in steps (CHAN_WALK_BUDGET), the channels' in
 * turn, one step per call at most: until it is done the channel's later
 * records wait, and sq_head stays at it.
 */
unsigned chan_drain(struct shard_core *sc, struct chan *ch, unsigned budget);

/* A CANCEL_KEY is being applied in steps: the shard has work even with no records. */
static inline bool chan_walking(const struct shard_core *sc)
{
	return sc->walk_head != NULL;
}

/* A timer of this channel that the wheel popped (state ALLOC): deliver it or hold it. */
void chan_fire(struct shard_core *sc, struct chan *ch, uint32_t idx, uint64_t now_ns);

/*
 * chan_fire() for n timers the wheel popped, each for its owner's channel
 * (sc->by_slot[node.owner]); the counters are updated once per run of
 * timers alike (channel, deadline, flags), not once per timer.
 */
void chan_fire_batch(struct shard_core *sc, const uint32_t *idx, unsigned n, uint64_t now_ns);

/*
 * Advance the wheel to now_ns and fire what is due, at most `budget`
 * timers (the rest stays on the expired list for the next call), popped
 * in batches into chan_fire_batch(). Returns how many fired.
 */
unsigned chan_fire_due(struct shard_core *sc, uint64_t now_ns, unsigned budget);

/*
 * Catch up with the client: free consumed ACKWAIT nodes, move the backlog
 * into free completion slots, replace no-grant markers once nodes are free
 * again, publish cq_tail, and wake the client if it asked for it. Returns
 * true if it did anything. At most *budget nodes freed and events moved,
 * and *wakes wake-ups sent (taken from them): the rest waits for the next
 * call, and the call says it did something, so the shard does not sleep on
 * it.
 */
bool chan_service_n(struct shard_core *sc, struct chan *ch, uint64_t now_ns, uint32_t *budget, uint32_t *wakes);

/* chan_service_n() with no budgets. */
static inline bool chan_service(struct shard_core *sc, struct chan *ch, uint64_t now_ns)
{
	uint32_t budget = UINT32_MAX, wakes = UINT32_MAX;

	return chan_service_n(sc, ch, now_ns, &budget, &wakes);
}

#define TOUCH_POP_TAGS  1u
#define TOUCH_POP_WORDS 2u

/* Pages of a client's memory to map into the broker: MADV_POPULATE_WRITE over [addr, addr + len). */
struct chan_populate {
	void *addr;
	size_t len;
};

/*
 * In the shard's idle moments: the next pages of the client's table the
 * shard wants to use (the words of a run a RESET_TOUCH named, or the
 * tags its grants reach next) that are resident (mincore, never a fault:
 * every page of the table is the client's to allocate) and not yet
 * mapped by the broker. True: *p is set, for the caller to populate off
 * the shard's thread (an access there waits for the disk if the client
 * paged one out meanwhile); chan_touch_populated() with its result makes
 * them usable. False: nothing to do now.
 */
bool chan_touch_check(struct shard_core *sc, struct chan *ch, struct chan_populate *p);
void chan_touch_populated(struct chan *ch, int res);

/*
 * chan_drain() stopped at a RESET_TOUCH whose run of the table is not
 * mapped yet (ch->touch_hold): the caller has the wanted pages mapped
 * (chan_touch_check()) and drains again once that is done, or, if there
 * is nothing to map, calls this: the record is then applied as a plain
 * reset.
 */
void chan_touch_unhold(struct chan *ch);

/*
 * Records waiting in the submission ring: the client's sq_tail (positions
 * reserved, published or about to be) minus our head, bounded to [0, size]
 * since the client writes sq_tail. One load of a line the producers write:
 * the shard calls it when it publishes its counters, not per drain.
 */
uint64_t chan_sq_waiting(const struct chan *ch);

/* For the sleep re-check: a submission is published, or held events could move now. */
bool chan_pending(struct shard_core *sc, struct chan *ch);

/*
 * Reclaim: free every node this client owns in the shard: the refused arms
 * left in its ring counted and its grants freed, a slot each, the backlog
 * and ACKWAIT lists (a backlog holds up to the client's quota) and then the
 * armed ones, by sweeping the slab [sweep_pos, high_water), up to `budget`
 * in all per call (the sweep stops as soon as the client owns nothing). Returns true when done. Must not be followed by
 * chan_drain/chan_service on this channel.
 */
bool chan_reclaim(struct shard_core *sc, struct chan *ch, uint32_t budget);

/*
 * A named session's process is gone (ARCHITECTURE.md, "Sessions"): keep its
 * timers, stop using its rings. The first call applies what the process
 * published and we had not read yet (one ring's worth at most), frees the
 * unused grants (carries them instead if ch->handover: the broker stops and
 * the live process will re-submit what it publishes later). Then, up to
 * `budget` nodes per call in all, it reads what the process took
 * (periodics_taken()) and settles every delivered one-shot by the claim word:
 * an event the process never took (the shard wins FRESH -> VOID) will be
 * held again; one it took (or consumed) is freed. Then it sweeps the slab
 * [sweep_pos, high_water) up to `budget` nodes per call for periodic
 * timers with an event in the old ring, settled the same way (untaken: off
 * the wheel, held again with the deadline of that event). When the sweep
 * is done, the events coming back go to the head of the backlog in ring
 * order, `budget` positions per call (out of memory for that order: in no
 * particular order, and the one-shots settled in one call), and no
 * node keeps a position in the old ring. Returns true when done (false:
 * call again); from then on the channel touches no client memory and
 * holds what fires in its backlog, until chan_reattach() or
 * chan_reclaim().
 */
bool chan_park(struct shard_core *sc, struct chan *ch, uint32_t budget);
/*
 * A stop cuts a park in its steps short (the shard stops, the park left
 * where it is): first, in one call, what the park does before its sweep,
 * so that no event its process took comes back. What the steps left (the
 * sweep, the ring order) the next broker's restore settles, as after a
 * crash. Up to a ring's worth of events and its periodics' positions.
 */
void chan_park_cut(struct shard_core *sc, struct chan *ch);

/*
 * Sweeps (chan_reclaim(), chan_park()) take turns by user, then by channel:
 * true if a's sweep goes before b's, a's user having had a turn longer ago
 * (a channel without a user last), or the same user and a's own turn
 * longer ago. chan_sweep_served() says one had its turn (`turn`: a counter
 * of the shard's, always growing). In turn by channel, one user's many
 * sweeps held another user's single one back for all of theirs.
 */
bool chan_sweeps_before(const struct chan *a, const struct chan *b);
void chan_sweep_served(struct chan *ch, uint64_t turn);

/*
 * A parked session's new process: fresh rings (m), fresh grants, the same
 * slot, nodes, backlog and counters. The next chan_service() moves the
 * backlog into the new completion ring in order. Cannot fail: the grant
 * array is the one attach allocated (the ring size is the broker's).
 * `resume`: the library reconnects and re-submits its old rings' records,
 * so the carried grants stay until its CHIME_OP_RESUMED; otherwise they
 * are freed now.
 */
void chan_reattach(struct shard_core *sc, struct chan *ch, const struct chan_mem *m, bool resume);

/*
 * Keep GRANTED node idx, owned by ch already, for an ARM a reconnecting
 * library re-submits from its old rings (ARCHITECTURE.md, "libchime's
 * reconnect"): such an ARM names it instead of its slot's grant. Carried
 * nodes are freed by the session's CHIME_OP_RESUMED, by a re-attach that
 * does not resume (a new process cannot name them) and by a reclaim.
 */
void chan_carry(struct shard_core *sc, struct chan *ch, uint32_t idx);

/*
 * Free the carried nodes of parked channel ch: the process that would
 * re-submit ARMs naming them is gone (it exited before it resumed).
 */
void chan_forget_carried(struct shard_core *sc, struct chan *ch);

/*
 * After restore: the held events of ch the old broker had delivered (at
 * old-ring positions), in order; the array is the channel's now. A process
 * that resumes tells which it took (resume_cq_head): those are dropped, the
 * rest delivered; any other attach gets them all again.
 */
void chan_settle_set(struct chan *ch, struct chan_settle *settle, uint32_t n);

/*
 * Hold node idx (on no wheel or channel list) in the backlog: state
 * BACKLOG, delivered in order once the client has room (or a process).
 */
void chan_hold(struct shard_core *sc, struct chan *ch, uint32_t idx);

/*
 * A session an earlier broker left (restore.c): a parked channel with no
 * rings and no nodes yet, in sc->by_slot[slot]; restore adopts its nodes,
 * chan_reattach() gives it rings when its process comes. -ENOMEM only.
 */
int chan_restore_init(struct shard_core *sc, struct chan *ch, uint16_t slot, uint64_t generation,
		      uint32_t uid, uint64_t user_quota, uint32_t sq_size);

/* Node ownership: a node becomes, or stops being, one of ch's (and its user's). */
static inline void chan_own(struct chan *ch)
{
	ch->owned++;
	ch->user->owned++;
}

static inline void chan_disown(struct chan *ch)
{
	ch->owned--;
	ch->user->owned--;
}

/* Free the private memory of a channel (after attach failed or reclaim finished). */
void chan_fini(struct chan *ch);

#endif /* CHIMED_CHAN_H */
