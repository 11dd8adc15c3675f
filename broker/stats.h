/* SPDX-License-Identifier: MIT */
/*
 * stats.h - a shard thread's counters: kept in private memory on the hot path,
 * published into the control segment's seqlock blocks by stats_publish()
 * (struct chime_shard_stats for the shard, struct chime_client_stats for each
 * (client, shard) pair). No threads, no I/O, no clock: pure functions over the
 * structs, so tests drive them directly.
 *
 * Why private copies: a counter in shared memory that a tool reads would turn
 * every increment into a store to a line another core may hold; here an
 * increment is a private add, and publishing costs a copy of the counters
 * (~1 KiB of an 8 KiB block: the histograms, the reset base and the window
 * slots only when they changed) plus ~130 B per client whose counters
 * changed (and the lateness buckets that moved), at most once a
 * millisecond, not per timer.
 *
 * Call sites (shard thread k; `st` is its struct stats; `slot` the client's
 * slot in the control segment's client table):
 *
 *   start         stats_init(&st, ctl, k) after the control segment is laid
 *                 out (struct chime_ctl geometry filled); stats_fini(&st) at exit.
 *   new channel   stats_client_attach(&st, slot, generation) when the shard
 *                 adopts a client's channel (generation = chime_client_ctl's).
 *   dropped       stats_client_detach(&st, slot) when the shard has freed all
 *                 of a dead client's timers (zeroes its gauges and takes its
 *                 armed timers off the shard's).
 *   ring depths   stats_client_sq(&st, slot, n) for each channel and then
 *                 stats_sq(&st, deepest, waiting) before publishing: records
 *                 waiting in the submission rings (sq_tail - sq_head as the
 *                 shard sees them, bounded to the ring's size).
 *   ARM applied   stats_arm(&st, slot)        (armed gauges +1)
 *   wall clock    stats_armed_realtime(&st, n) when n wall-clock timers
 *                 come among the armed ones (an arm, a reset of a fired
 *                 one-shot, a restore), stats_disarmed_realtime(&st, n)
 *                 when they leave them (fired one-shot, cancel, a gone
 *                 client's reclaim): chan.c, at the node, whose flag says
 *                 its clock; the shard's armed_realtime, no client's.
 *   RESET applied stats_reset(&st, slot)      (only when it hit a live timer)
 *   CANCEL        stats_cancel(&st, slot)     per timer actually removed
 *                 (armed gauges -1); a stale id counts nothing
 *   CANCEL_KEY    stats_cancel_key(&st, slot, victims): one record, `victims`
 *                 timers removed (armed gauges -victims)
 *   malformed     stats_malformed(&st, slot): a record dropped by validation
 *   refused       stats_refused(&st, slot, why): an arm the client could not
 *                 make (it found a no-grant marker and published a NOP)
 *   reserve       stats_reserve_failed(&st): the filesystem refused a slab chunk
 *                 stats_slab_given_back(&st, bytes): the slab's free top given back
 *                 stats_slab_bytes(&st, bytes): the slab's storage now (at each publish)
 *   fire          stats_fire_n(&st, slot, deadline_ns, fired_ns, periodic,
 *                 immediate, n) once for n expirations alike popped from
 *                 the wheel (each period of a periodic timer counts), with
 *                 the same two values the completion record carries;
 *                 records the lateness, unless
 *                 `immediate` (armed already due, or a periodic's period
 *                 due when the one before went out: counted apart), in the
 *                 shard's and the client's histograms and in the shard's
 *                 one-second slot of fired_ns (the recent window). A one-shot
 *                 that fires leaves the armed gauges: it is no longer armed,
 *                 whether delivered or held in the backlog.
 *   deliver       stats_deliver_n(&st, slot, n): n events written into the
 *                 client's completion ring.
 *   wake client   stats_wake_client(&st, slot): a wake-up message to it.
 *   gauges        stats_client_depth(&st, slot, cq_depth, backlog) whenever
 *                 they change (after delivering or seeing cq_head move);
 *                 stats_shard_gauges(&st, backlog, next_deadline_ns, inexact,
 *                 cpu_ns) before publishing (cpu_ns: the thread's CPU time;
 *                 next_deadline_ns the earliest armed deadline, a lower bound
 *                 if `inexact`).
 *   reset         stats_reset_figures(&st, gen) when the control segment's
 *                 stats_reset_gen moved (the shard checks before publishing):
 *                 lifetime lateness and high-water marks restart, counters
 *                 do not (see the definitions below).
 *   loop end      stats_loop(&st, busy_ns) once per iteration (busy_ns: time
 *                 spent with work this iteration, 0 if idle); before
 *                 sleeping, stats_sleep(&st). stats_publish(&st) always
 *                 publishes: the shard (shard.c publish(), PUBLISH_NS) calls
 *                 it at most once a millisecond while awake (a busy-poll
 *                 shard spinning idle would otherwise rewrite the block
 *                 every ~100 ns and starve readers), and before a sleep
 *                 that may last longer than that, so that tools see the
 *                 sleep, the next deadline and every counter while it sleeps.
 *   exit          stats_publish(&st) once more, then stats_fini(&st).
 *
 * Definitions (what chimestat and the tests expect):
 *   armed    timers in the wheel (ARMED, EXPIRED) plus periodic timers held
 *            back in a backlog; not granted-but-unused nodes, not delivered
 *            one-shots waiting to be consumed. armed_realtime: those of
 *            them that are wall-clock timers.
 *   cancels  timers removed by CANCEL or CANCEL_KEY (shard and client alike:
 *            the sum over clients equals the shard's); cancel_keys counts
 *            CANCEL_KEY records.
 *   fires    expirations; delivered: events written to completion rings;
 *   wakeups  eventfd writes to wake clients (shard = sum over its clients).
 *   reset    restarts: the shard's lateness since reset (lat_base takes a
 *            copy of lat, lat_max_ns 0), sq_depth_max, and per client its
 *            lateness histogram and max, sq_depth_max and cq_depth_max. Not
 *            reset: every counter (they stay monotonic for Prometheus), the
 *            shard's lat[] itself, the gauges and the recent window.
 */
#ifndef CHIME_STATS_H
#define CHIME_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "chime_config.h"
#include "chime_shm.h"

/*
 * meson -Dcounters=false compiles every counter update below out (and
 * publishes nothing): only for measuring what the counters cost
 * (tools/bench-counters.sh). chimestat then shows zeros.
 */
#ifndef CHIME_COUNTERS
#define CHIME_COUNTERS 1
#endif

/* Private counters of one (client, shard) pair. */
struct stats_client {
	struct chime_client_stats c;    /* c.seq unused: the shared block has its own */
	uint8_t dirty;                  /* changed since the last publish */
	uint8_t attached;
	uint8_t lat_lo, lat_hi;         /* histogram buckets changed since the last publish
					 * (lat_lo > lat_hi: none): only those are copied */
};

struct stats {
	struct chime_shard_stats sh;    /* private copy; sh.seq unused */
	struct chime_shard_stats *pub;  /* the shard's block in the control segment */
	struct chime_client_stats *cpub;/* [slot * nr_shards + shard] */
	struct stats_client *cl;        /* [max_clients] */
	uint32_t *dirty;                /* slots to publish, max_clients entries */
	uint32_t nr_dirty;
	uint32_t max_clients;
	uint32_t nr_shards;
	uint32_t shard;
	uint8_t  lat_dirty;             /* histogram changed since the last publish */
	uint8_t  base_dirty;            /* lat_base changed (a reset) since the last publish */
	uint32_t win_cur;               /* the window slot of the current second */
	uint32_t win_dirty;             /* window slots changed since the last publish (bits) */
	uint64_t win_end_ns;            /* first ns after the current slot's second */
};

#define STATS_NS_PER_S UINT64_C(1000000000)

/*
 * Resolve shard `shard`'s blocks in the (writable) control segment whose
 * header geometry is already set, and zero the private counters.
 * Returns 0, -EINVAL (shard out of range), -ENOMEM.
 */
int stats_init(struct stats *st, struct chime_ctl *ctl, uint32_t shard);

/*
 * The same over explicit blocks (tests): pub is the shard's block, cpub the
 * client stats array [max_clients][nr_shards].
 */
int stats_init_blocks(struct stats *st, struct chime_shard_stats *pub,
		      struct chime_client_stats *cpub, uint32_t max_clients,
		      uint32_t nr_shards, uint32_t shard);

void stats_fini(struct stats *st);

/* Write the private counters into the shared blocks under their seqlocks. */
void stats_publish(struct stats *st);

void stats_client_attach(struct stats *st, uint32_t slot, uint64_t generation);
void stats_client_detach(struct stats *st, uint32_t slot);

/*
 * Move the recent window to the second of now_ns: that second's slot is
 * cleared if it holds an older second. Called by stats_lateness() when a
 * sample falls past the current second: at most once a second.
 */
void stats_window_roll(struct stats *st, uint64_t now_ns);

/* Restart the figures `chimectl reset-stats` resets (stats.h top) and record gen. */
void stats_reset_figures(struct stats *st, uint64_t gen);

/*
 * Record n equal lateness samples (fired_ns - deadline_ns): the lifetime
 * histogram and the window slot of fired_ns's second. Returns their bucket.
 */
static inline uint32_t stats_lateness(struct stats *st, uint64_t lat_ns, uint64_t fired_ns, uint64_t n)
{
	uint32_t b = chime_lat_bucket(lat_ns);
	struct chime_lat_second *w;

	st->sh.lat[b] += n;
	st->sh.lat_sum_ns += lat_ns * n;
	if (lat_ns > st->sh.lat_max_ns)
		st->sh.lat_max_ns = lat_ns;
	st->lat_dirty = 1;
	/* One compare per fire; the slot is cleared only when the second changes. */
	if (fired_ns >= st->win_end_ns)
		stats_window_roll(st, fired_ns);
	w = &st->sh.win[st->win_cur];
	w->lat[b] += n;
	w->sum_ns += lat_ns * n;
	if (lat_ns > w->max_ns)
		w->max_ns = lat_ns;
	st->win_dirty |= UINT32_C(1) << st->win_cur;
	return b;
}

static inline struct chime_client_stats *stats__cl(struct stats *st, uint32_t slot)
{
	struct stats_client *c;

	/* Internal code asserts, but an out-of-range slot must not scribble. */
	if (slot >= st->max_clients)
		return NULL;
	c = &st->cl[slot];
	if (!c->dirty) {
		c->dirty = 1;
		st->dirty[st->nr_dirty++] = slot;
	}
	return &c->c;
}

static inline void stats_arm(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;

	st->sh.arms++;
	st->sh.armed++;
	if (c) {
		c->arms++;
		c->armed++;
	}
}

/* n wall-clock timers among the armed ones (stats.h top): armed_realtime. */
static inline void stats_armed_realtime(struct stats *st, uint64_t n)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.armed_realtime += n;
}

/* n wall-clock timers no longer armed. */
static inline void stats_disarmed_realtime(struct stats *st, uint64_t n)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.armed_realtime = st->sh.armed_realtime >= n ? st->sh.armed_realtime - n : 0;
}

/* What the shard took over from an earlier broker's file (restore.h), once at start-up. */
void stats_restore(struct stats *st, uint64_t kept, uint64_t dropped, uint64_t redelivered);

/* Timers an earlier broker left to this client (restore.c): armed, but not new arms. */
static inline void stats_restored(struct stats *st, uint32_t slot, uint64_t armed)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;
	st->sh.armed += armed;
	if (c)
		c->armed += armed;
}

static inline void stats_reset(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;

	st->sh.resets++;
	if (c)
		c->resets++;
}

static inline void stats__disarm(struct stats *st, struct chime_client_stats *c, uint64_t n)
{
	st->sh.armed = st->sh.armed >= n ? st->sh.armed - n : 0;
	if (c)
		c->armed = c->armed >= n ? c->armed - n : 0;
}

static inline void stats_cancel(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;

	st->sh.cancels++;
	if (c)
		c->cancels++;
	stats__disarm(st, c, 1);
}

static inline void stats_cancel_key(struct stats *st, uint32_t slot, uint64_t victims)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;

	st->sh.cancel_keys++;
	st->sh.cancels += victims;
	if (c)
		c->cancels += victims;
	stats__disarm(st, c, victims);
}

static inline void stats_malformed(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;
	st->sh.malformed++;
	if (c)
		c->malformed++;
}

/* Why an arm was refused: no free node, the client's quota, or its user's. */
enum stats_refusal {
	STATS_REFUSED_NOMEM,
	STATS_REFUSED_QUOTA,
	STATS_REFUSED_USER_QUOTA,       /* counted as a quota refusal too (EDQUOT either way) */
};

static inline void stats_refused(struct stats *st, uint32_t slot, enum stats_refusal why)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;
	if (why == STATS_REFUSED_NOMEM) {
		st->sh.refused_nomem++;
		if (c)
			c->refused_nomem++;
		return;
	}
	st->sh.refused_quota++;
	if (c) {
		c->refused_quota++;
		c->refused_user_quota += why == STATS_REFUSED_USER_QUOTA;
	}
}

/* A slab chunk the filesystem would not reserve (always counted: operators need it). */
static inline void stats_reserve_failed(struct stats *st)
{
	st->sh.reserve_failed++;
}

/* Bytes of the slab given back to its filesystem (always counted, as reserve_failed). */
static inline void stats_slab_given_back(struct stats *st, uint64_t bytes)
{
	st->sh.slab_given_back += bytes;
}

/* The slab's storage reserved now (a gauge: grown a chunk at a time, its free top given back). */
static inline void stats_slab_bytes(struct stats *st, uint64_t bytes)
{
	st->sh.slab_bytes = bytes;
}

/*
 * n expirations of one client with the same deadline and flags, fired at
 * fired_ns: counted as n calls with n = 1 would count them. The shard
 * counts a batch of expirations by runs (chan_fire_batch()): one update per
 * run instead of one per event. `periodic`: the timers stay armed (re-armed
 * from their deadline, or held in the backlog), so the armed gauges do not
 * move.
 */
static inline void stats_fire_n(struct stats *st, uint32_t slot, uint64_t deadline_ns,
				uint64_t fired_ns, int periodic, int immediate, uint64_t n)
{
	struct chime_client_stats *c = stats__cl(st, slot);
	uint64_t lat;
	uint32_t b;

	if (!CHIME_COUNTERS)
		return;

	st->sh.fires += n;
	if (c)
		c->fires += n;
	if (!periodic)
		stats__disarm(st, c, n);
	if (immediate) {
		/* Armed already due (deadline 0, say): fired - deadline is the age of its deadline. */
		st->sh.immediate += n;
		return;
	}
	/* Never early, so fired >= deadline; clamp anyway rather than wrap. */
	lat = fired_ns > deadline_ns ? fired_ns - deadline_ns : 0;
	b = stats_lateness(st, lat, fired_ns, n);
	if (c) {
		struct stats_client *p = &st->cl[slot];

		c->lat[b] += n;
		if (lat > c->lat_max_ns)
			c->lat_max_ns = lat;
		if (b < p->lat_lo)
			p->lat_lo = (uint8_t)b;
		if (b > p->lat_hi)
			p->lat_hi = (uint8_t)b;
	}
}

/* n events written into the client's completion ring. */
static inline void stats_deliver_n(struct stats *st, uint32_t slot, uint64_t n)
{
	if (!CHIME_COUNTERS)
		return;
	(void)stats__cl(st, slot);
	st->sh.delivered += n;
}

static inline void stats_wake_client(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;

	st->sh.wakeups++;
	if (c)
		c->wakeups++;
}

/* A wake-up's send slow by CPU time: its user's next ones are held back (wake_send(), chan.c). */
static inline void stats_slow_wake(struct stats *st, uint32_t slot)
{
	struct chime_client_stats *c = stats__cl(st, slot);

	if (!CHIME_COUNTERS)
		return;
	st->sh.slow_wakeups++;
	if (c)
		c->slow_wakeups++;
}

static inline void stats_client_depth(struct stats *st, uint32_t slot, uint64_t cq_depth,
				      uint64_t backlog)
{
	struct stats_client *p = slot < st->max_clients ? &st->cl[slot] : NULL;
	struct chime_client_stats *c;

	if (!CHIME_COUNTERS)
		return;

	/* Gauges are set often with the same value: publish only a change. */
	if (!p || (p->c.cq_depth == cq_depth && p->c.backlog == backlog))
		return;
	c = stats__cl(st, slot);
	c->cq_depth = cq_depth;
	c->backlog = backlog;
	if (cq_depth > c->cq_depth_max)
		c->cq_depth_max = cq_depth;
}

/* The client's ids this shard counts against the quotas (chan.owned): armed and handed ahead. */
static inline void stats_client_owned(struct stats *st, uint32_t slot, uint64_t owned)
{
	struct stats_client *p = slot < st->max_clients ? &st->cl[slot] : NULL;

	if (!CHIME_COUNTERS || !p || p->c.owned == owned)
		return;
	stats__cl(st, slot)->owned = owned;
}

/* Records waiting in the client's submission ring on this shard (bounded by the caller). */
static inline void stats_client_sq(struct stats *st, uint32_t slot, uint64_t depth)
{
	struct stats_client *p = slot < st->max_clients ? &st->cl[slot] : NULL;
	struct chime_client_stats *c;

	if (!CHIME_COUNTERS)
		return;
	if (!p || (p->c.sq_depth == depth && depth <= p->c.sq_depth_max))
		return;
	c = stats__cl(st, slot);
	c->sq_depth = depth;
	if (depth > c->sq_depth_max)
		c->sq_depth_max = depth;
}

static inline void stats_shard_gauges(struct stats *st, uint64_t backlog, uint64_t next_deadline_ns,
				      int inexact, uint64_t cpu_ns)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.backlog = backlog;
	st->sh.next_deadline_ns = next_deadline_ns;
	st->sh.next_inexact = inexact != 0;
	st->sh.cpu_ns = cpu_ns;
}

/* The shard's submission rings: the fullest one's waiting records, and all of them. */
static inline void stats_sq(struct stats *st, uint64_t deepest, uint64_t waiting)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.sq_depth = deepest;
	st->sh.sq_waiting = waiting;
	if (deepest > st->sh.sq_depth_max)
		st->sh.sq_depth_max = deepest;
}

static inline void stats_loop(struct stats *st, uint64_t busy_ns)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.loops++;
	st->sh.busy_ns += busy_ns;
}

static inline void stats_sleep(struct stats *st, bool capped)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.sleeps++;
	st->sh.spin_capped += capped;
}

static inline void stats_spin_busy(struct stats *st)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.spin_busy++;
}

static inline void stats_spin(struct stats *st, uint64_t ns)
{
	if (!CHIME_COUNTERS)
		return;
	st->sh.spin_ns += ns;
}

#endif /* CHIME_STATS_H */
