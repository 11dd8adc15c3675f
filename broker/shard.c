/* SPDX-License-Identifier: MIT */
/*
 * shard.c - the shard thread. See shard.h, chan.h and ARCHITECTURE.md.
 *
 * One loop iteration:
 *   1. run control commands (attach, detach, park, reattach, stop);
 *   2. drain every channel's submission ring, DRAIN_BUDGET records each and
 *      USER_DRAIN_BUDGET for all of a user's channels, starting one channel
 *      further each pass (fairness: a flooding client, or a user's many
 *      flooding clients, cannot starve the others);
 *   3. advance the wheel to CLOCK_MONOTONIC now and deliver what is due,
 *      FIRE_BUDGET at most (the rest stays on the expired list);
 *   4. service every channel: free consumed ACKWAIT nodes, move backlogs,
 *      forget taken periodic events (USER_SERVICE_BUDGET of those for all
 *      of a user's channels, in the same turn as the drain), publish
 *      cq_tail, wake clients that asked for it (USER_WAKE_BUDGET sends per
 *      user, the rest in the next pass);
 *   5. a step of each client reclaim or session park in progress (RECLAIM_BUDGET nodes);
 *   6. publish the counters; then spin, or sleep.
 *
 * Sleeping (the doorbell handshake, ARCHITECTURE.md): after --spin-us with
 * nothing to do, store a new sleep number, full barrier, re-check
 * everything, and only then wait in io_uring for a doorbell or the
 * wheel's next deadline. With nothing armed there is no timeout at all: an idle shard
 * costs no CPU. Nothing here logs once the loop runs: counters go to shm.
 *
 * Doorbells: each client has its own eventfd per shard, and the shard keeps
 * one io_uring multishot POLL on it, never a read: a completion comes with
 * each write (the kernel's wake-up of the eventfd's waiters, in the
 * writer's call), and the counter is never reset. A read would wake the
 * eventfd's EPOLLOUT waiters, every epoll watch the client put on it (up to
 * fs.epoll.max_user_watches), one callback each on this thread: a million
 * made another user's timers up to 54-105 ms late. io_uring never blocks
 * the thread on a file (a client that clears O_NONBLOCK or saturates the
 * counter stops only its own rings), and a client that reads its doorbell
 * itself steals nothing: the completion came with the write. The control
 * thread's commands use a doorbell no client holds. A detach cancels the
 * poll and waits for its last completion before it is acknowledged: the
 * completion names the channel by its slot, which the next client reuses.
 */
#include "shard.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>


#include "aside.h"
#include "atomics.h"
#include "clock.h"
#include "keyidx.h"
#include "log.h"
#include "paths.h"
#include "restore.h"
#include "wall.h"
#include "wheel.h"

#define DRAIN_BUDGET    256u    /* records per channel per iteration */
/*
 * Records per user (its channels together) per iteration. Per channel
 * alone, a user with 64 connections (--max-clients-per-uid) flooding their
 * rings made each pass 64 budgets long, and another user's timers waited
 * for it: median 2.4-3.0 ms late against 1-3 us beside one connection, and
 * 39-42 us with this budget (hostile/one_users_many_connections_...). The
 * start moves one channel each pass, so none of a user's is always last.
 */
#define USER_DRAIN_BUDGET (4u * DRAIN_BUDGET)
#define FIRE_BUDGET     4096u   /* expirations per iteration */
/*
 * Held events moved into completion rings, consumed ones freed and consumed
 * positions walked for periodics, per user per iteration (chan_service_n()).
 * With a completion ring's room each for every channel, a user's 64
 * connections with events held, consuming as fast as they could, held every
 * timer of the shard up for a pass of 94-108 ms (--cq-size 65536;
 * hostile/held_events_handed_over_...). Twice FIRE_BUDGET: an event fired
 * may need a move and a free.
 */
#define USER_SERVICE_BUDGET (2u * FIRE_BUDGET)
/*
 * Wake-ups (a send() each, 1-2 us here) per user per iteration: bounds what
 * a user's connections asking for one every pass cost the others (chan.c,
 * wake_client()). An honest process asks once per sleep of a thread; 64
 * threads asleep with a connection each, woken by one pass, are woken over
 * 8 passes.
 */
#define USER_WAKE_BUDGET 8u
#define RECLAIM_BUDGET  16384u  /* slab nodes swept per iteration, one dying client at a time */
#define IDLE_PURE_SPIN_NS (5u * 1000u)    /* idle spin before the shard starts yielding its core */
#define WAKE_EARLY_MAX_NS (200u * 1000u)  /* the longest a shard spins into a deadline */
#define WAKE_SCAN         64u             /* nodes read to find the exact next deadline */
#define WAKE_GRAIN_NS     (UINT64_C(1) << 24) /* the published wake-up is rounded up to this: 16.8 ms */
/*
 * Spinning without work, idle or into a deadline, is at most --spin-share
 * percent of the shard's time, plus SPIN_PER_FIRE_NS for each timer fired
 * (a bucket of SPIN_BURST_NS): one client's four 100 us periodic timers
 * otherwise kept both shards of a 2-CPU host spinning outright, a cost the
 * client does not pay itself. Past it the shard sleeps as soon as it is
 * idle and wakes at the deadline itself, a wake-up's lateness as with a
 * timerfd. The per-timer part keeps timers a few microseconds apart exact
 * (they keep the shard busy anyway), where timers tens of microseconds
 * apart spin only in part (ARCHITECTURE.md, "Doorbells and sleeping").
 * --spin-us -1 is not limited.
 */
#define SPIN_BURST_NS     (20 * 1000 * 1000)
#define SPIN_PER_FIRE_NS  2000
#define SPIN_CHARGE_MAX_NS (20u * 1000u)  /* a longer pass was a yield that gave the core away */
/*
 * How early a shard wakes for a deadline, to spin the rest: about the 90th
 * percentile of how late its timed sleeps end (a step up of 9 for a late
 * sleep, a step down for one on time), at most --spin-us. Waking --spin-us
 * early spun some 40 us into every deadline where a wake-up is 5-10 us
 * late, and timers tens of microseconds apart then spent the spin share on
 * a fraction of them.
 */
#define WAKE_LEAD_STEP_NS 250u
#define WAKE_LEAD_MIN_NS  2000u
#define YIELD_BEFORE_NS   3000u  /* spinning into a deadline yields the core until this close */
/*
 * Idle or firing, the shard moves the next cascade's timers ahead of time
 * (wheel_stage()), this many per pass: 1-2 us, the most a due timer waits
 * behind a pass. A level-3 slot with a million timers takes tens of
 * milliseconds of idle time, and has up to 409.5 ms at 100 us resolution.
 */
#define STAGE_BUDGET      32u
#define PREFAULT_CLEAR_NS (1000u * 1000u)   /* nothing due this soon when checking a touch table (chan_touch_check()) */
#define PUBLISH_NS      (1000u * 1000u)   /* counters published at most and at least this often while awake */
#define NEXT_SCAN_MAX   256u    /* timers of the earliest wheel slot scanned for the exact "next" */
/* Wall-clock nodes a pass moves to a new offset (chan_wall_step()): 0.1-0.3 ms here. */
#define WALL_STEP_NODES 8192u

/* io_uring user_data: the low two bits say what completed. */
#define RESERVE_CHUNK   (UINT64_C(4) << 20)  /* slab storage reserved at a time */
#define RESERVE_MIN     (UINT64_C(256) << 10) /* ... or as little as this on a nearly full filesystem */
#define RESERVE_AHEAD_NODES 32768u           /* reserve more when high_water is this close */
#define RESERVE_RETRY_NS (UINT64_C(1000000000))
#define GIVE_BACK_MIN   (2 * RESERVE_CHUNK)   /* the least of the slab's free top given back */
#define GIVE_BACK_EVERY_NS (UINT64_C(1000000000))
/*
 * A slab grown again within GIVE_BACK_SOON holds of its give-back doubles
 * its hold, up to GIVE_BACK_HOLD_MAX_NS: bursts that come back every few
 * seconds keep their room instead of giving it back and growing it again.
 */
#define GIVE_BACK_SOON  8u
/* A look that met a timers query reading the slab looks again this much later (SH1). */
#define GIVE_BACK_SCAN_WAIT_NS (UINT64_C(10) * 1000000u)
#define GIVE_BACK_HOLD_MAX_NS (UINT64_C(64) * 1000000000u)
#define UD_BELL   1u    /* the command doorbell */
#define UD_CANCEL 2u    /* a cancel request (its own completion means nothing) */
#define UD_CHAN   3u    /* a client doorbell: slot << 2 | UD_CHAN */
/* The aside thread's jobs (aside.h), by what they were for: */
#define UD_RESERVE        (2u << 2)     /* the slab's next chunk reserved and mapped */
#define UD_TOUCH          (3u << 2)     /* slot << 8 | UD_TOUCH: a client's touch-table pages mapped */
#define UD_PUNCH          (4u << 2)     /* the slab's free top given back (slab_give_back()) */
#define UD_TAG(ud) ((ud) & 3u)
#define RING_SQ_ENTRIES 64u
#define SHARD_STOP_TIMEOUT_S 2

/* ---- the slab's storage, reserved ahead of use (no SIGBUS on a full filesystem) ---- */

/* [0, bytes) of the file is reserved and mapped: the wheel may allocate nodes up to there. */
static void reserve_note(struct shard *s, uint64_t bytes)
{
	uint64_t nodes = bytes > s->slab_off ? (bytes - s->slab_off) / sizeof(struct chime_node) : 0;

	if (bytes <= s->reserved_bytes)
		return;
	s->grown_ns = now_ns();
	if (s->given_back_ns && s->grown_ns - s->given_back_ns < GIVE_BACK_SOON * s->give_back_hold_ns &&
	    s->give_back_hold_ns < GIVE_BACK_HOLD_MAX_NS)
		s->give_back_hold_ns *= 2;
	s->given_back_ns = 0;   /* one doubling a give-back, however many chunks grow after it */
	s->reserved_bytes = bytes;
	/* Atomic: the control thread reads it (shard_slab_short()). */
	at_store(&s->core.wh.reserved, nodes < s->cfg.capacity ? (uint32_t)nodes : s->cfg.capacity);
}

bool shard_slab_short(const struct shard *s)
{
	return at_load(&s->core.wh.reserved) < s->cfg.capacity;
}

uint64_t shard_start_bytes(uint32_t capacity, uint64_t *fixed)
{
	struct chime_shard_geom g = { .capacity = capacity, .key_buckets = keyidx_buckets_for(capacity),
				      .wheel_size = wheel_region_size(capacity) };

	*fixed = 0;
	if (chime_shard_layout(&g) < 0)
		return 0;
	*fixed = g.wheel_off + sizeof(struct chime_wheel);
	return *fixed + RESERVE_CHUNK < g.size ? *fixed + RESERVE_CHUNK : g.size;
}

/* The first byte of a new chunk's population: the page holding the reserve's end. */
static uint64_t reserve_populate_from(const struct shard *s)
{
	return s->reserved_bytes & ~(uint64_t)4095;
}

/*
 * Map the reserve's new part, up to bytes, now: not one page fault at a
 * time on the path that arms timers, and not at all where the kernel
 * refuses it. On tmpfs the fallocate before it holds the pages; on a disk
 * filesystem it holds blocks, but a full one can still refuse the write
 * through the mapping (ext4: -EFAULT here), and those pages, touched by an
 * arm, were the broker's SIGBUS (a storage audit). 0, or the populate's
 * -errno: nothing of it counts as reserved then.
 */
static int reserve_map(struct shard *s, uint64_t bytes)
{
	uint64_t from = reserve_populate_from(s);

	return bytes > from ? chime_seg_populate((char *)s->seg.base + from, bytes - from) : 0;
}

/*
 * What the slab may still take from its filesystem past byte `from` of its
 * file: the room chime_fs_room() leaves, and the blocks the file holds
 * there already (an earlier broker's reserve ahead, taken over by a
 * restart), which take none (a review: restarted at the keep line, new
 * arms got ENOMEM with 5.6 MiB of the file's own blocks unused).
 */
static uint64_t slab_room(const struct shard *s, uint64_t from)
{
	uint64_t room = chime_fs_room(s->seg_fd, NULL), held;
	struct stat st;

	if (room == UINT64_MAX || fstat(s->seg_fd, &st) < 0)
		return room;
	held = (uint64_t)st.st_blocks * 512;
	if (held <= from)
		return room;
	return room + (held - from) < room ? UINT64_MAX - 1 : room + (held - from);
}

static void reap_aside(struct shard *s);
static void reserve_settle(struct shard *s);

/*
 * Reserve the next chunk of the slab now, or as much of it as the
 * filesystem has room for, down to RESERVE_MIN (a nearly full filesystem
 * still gives its last megabytes to timers). When it refuses even that,
 * the wheel stops at what is reserved (arms get -ENOMEM), the failure is
 * counted (the control thread logs it) and retried at most once a second.
 * Returns true if the reserved part grew.
 */
static bool reserve_chunk(struct shard *s, uint64_t now)
{
	uint64_t want, chunk = RESERVE_CHUNK, room;
	int r;

	if (s->core.wh.reserved == s->cfg.capacity || now < s->reserve_retry_ns)
		return false;
	/* A hole still being punched where this chunk goes would take it back after us. */
	if (s->punches)
		reserve_settle(s);
	room = slab_room(s, s->reserved_bytes);
	do {
		want = s->reserved_bytes + chunk < s->seg.size ? s->reserved_bytes + chunk : s->seg.size;
		if (want - s->reserved_bytes > room) {
			r = -ENOSPC;    /* the filesystem's last tenth is its other writers' */
		} else {
			r = chime_seg_reserve(s->seg_fd, s->reserved_bytes, want - s->reserved_bytes);
			/* the pages refused for want of room: a smaller chunk may still map */
			if (r == 0 && (r = reserve_map(s, want)) == -EFAULT)
				r = -ENOSPC;
		}
		chunk /= 2;
	} while ((r == -ENOSPC || r == -EDQUOT) && chunk >= RESERVE_MIN);
	if (r < 0) {
		stats_reserve_failed(&s->st);
		s->reserve_retry_ns = now + RESERVE_RETRY_NS;
		return false;
	}
	reserve_note(s, want);
	return true;
}

/*
 * The next chunk reserved and mapped on the shard's aside thread
 * (fallocate, then MADV_POPULATE_WRITE), while this thread goes on
 * applying records: done here, each chunk held the pass up for 3-4 ms
 * on this VM, a client arming meanwhile waiting on a full ring
 * (ARCHITECTURE.md, "Limits"). reserve_async_done() takes the result;
 * until then the reserve is what it was, and a pass that uses it up
 * reserves the same chunk itself (slab_grow(): both are idempotent).
 * False: not sent (no aside thread, or asynchronous reserves found not
 * to work here): the caller reserves in line.
 */
static bool reserve_async(struct shard *s)
{
	uint64_t want = s->reserved_bytes + RESERVE_CHUNK < s->seg.size ? s->reserved_bytes + RESERVE_CHUNK :
		s->seg.size, from = reserve_populate_from(s);
	struct aside_job j = { .op = ASIDE_RESERVE, .fd = s->seg_fd, .off = s->reserved_bytes,
			       .len = want - s->reserved_bytes, .addr = (char *)s->seg.base + from,
			       .plen = want - from, .ud = UD_RESERVE };

	/* Short of room (chime_fs_room()): in line, in halves that fit. */
	if (s->reserve_async_off || j.len > slab_room(s, s->reserved_bytes) || !aside_post(s->aside, &j))
		return false;
	s->reserve_pending = want;
	return true;
}

/* The completion of reserve_async()'s chunk: 0, or its fallocate's or populate's -errno. */
static void reserve_async_done(struct shard *s, int res)
{
	uint64_t want = s->reserve_pending;

	s->reserve_pending = 0;
	if (res == 0) {
		reserve_note(s, want);
		return;
	}
	/*
	 * A full filesystem (its fallocate failed): the next chunk is
	 * reserved in line, in halves, a failure counted and retried a second
	 * later (reserve_chunk()). A kernel without MADV_POPULATE_WRITE
	 * (-EINVAL) or a filesystem without fallocate (-EOPNOTSUPP;
	 * posix_fallocate writes zeros there): in line from now on.
	 */
	s->reserve_inline = true;
	if (res == -EINVAL || res == -EOPNOTSUPP)
		s->reserve_async_off = true;
}

/* Keep the reserved part of the slab a chunk ahead of its high-water mark. */
static void reserve_ahead(struct shard *s, uint64_t now)
{
	struct wheel *wh = &s->core.wh;

	if (s->reserve_pending || s->touch_pops)
		reap_aside(s);
	if (s->reserve_pending)
		return;
	if (wh->w->high_water + RESERVE_AHEAD_NODES < wh->reserved || wh->reserved == s->cfg.capacity ||
	    now < s->reserve_retry_ns)
		return;
	if (s->reserve_inline || !reserve_async(s)) {
		s->reserve_inline = false;
		(void)reserve_chunk(s, now);
	}
}

/* A generation for nodes grown into (wheel_alloc()): random, so that ids are not guessable. */
static void draw_gen_base(struct shard *s, uint64_t now)
{
	uint32_t g;

	if (getrandom(&g, sizeof(g), GRND_NONBLOCK) != sizeof(g))
		g = (uint32_t)(now ^ (now >> 32)) ^ s->core.wh.gen_base * 2654435761u;
	s->core.wh.gen_base = g;
}

/*
 * The storage of the slab's free top given back to its filesystem (true:
 * a look is now due at give_back_at, the sleep to end there). The
 * slab grows a chunk at a time as timers are armed and hands out its
 * lowest free node first, so once a burst of timers has gone the top of
 * it is free again; kept, the room it held (on /run, shared with the
 * host's other services) stayed the broker's until a restart. What stays:
 * the nodes up to the highest in use, the reserve that reserve_ahead()
 * keeps ahead of them, and a chunk more, so that it is not grown again at
 * once; at least GIVE_BACK_MIN goes, or nothing. Looked for at most once
 * a second, by a pass that runs anyway, or, after passes in which timers
 * went, by one wake-up a second after the last look: none at rest. Not
 * until the slab has gone a hold without growing (a second, doubled each
 * time it grows again soon after a give-back: a workload's bursts that
 * come back keep their room, a once-only burst's goes a second on). The
 * hole is punched aside, after any chunk on its way there (jobs run in
 * order); a growth in line waits for it (reserve_chunk()). The nodes
 * given back are grown into again as new ones, under a new generation
 * base (wheel_shrink()).
 */
static void give_back_done(struct shard *s, int res);

static bool slab_give_back(struct shard *s, uint64_t now)
{
	struct wheel *wh = &s->core.wh;
	uint64_t keep, was = s->reserved_bytes, nodes;
	uint32_t end;

	/*
	 * The count's peak since the last look, as the passes saw it: the
	 * count then, it missed a burst armed after a look and gone again
	 * (down to the count it had) before the next, and that room stayed.
	 */
	if (wh->armed > s->armed_peak)
		s->armed_peak = wh->armed;
	if (s->give_back_off) {
		s->give_back_due = false;       /* else a look due that never comes keeps the loop from sleeping */
		return false;
	}
	/* A chunk or a punch on its way: its completion rings the shard, and the pass then looks. */
	if (was < s->slab_off + GIVE_BACK_MIN || s->reserve_pending || s->punches)
		return false;
	/*
	 * Not yet: if timers have gone since that peak (fired, cancelled,
	 * reclaimed), the pass at give_back_at looks, a sleep ending there
	 * for it (next_wake()). Arms alone (a broker filling up, then at
	 * rest) ask for none.
	 */
	if (now < s->give_back_at) {
		if (s->give_back_due || wh->armed >= s->armed_peak)
			return false;
		s->give_back_due = true;
		return true;
	}
	s->armed_peak = wh->armed;
	/* Grown lately (a burst, maybe one that comes back): looked at again once its hold is over. */
	if (now < s->grown_ns + s->give_back_hold_ns) {
		s->give_back_at = s->grown_ns + s->give_back_hold_ns;
		return s->give_back_due = true;
	}
	s->give_back_due = false;
	s->give_back_at = now + GIVE_BACK_EVERY_NS;
	end = wheel_slab_end(wh);
	keep = s->slab_off + ((uint64_t)end + RESERVE_AHEAD_NODES) * sizeof(struct chime_node) + RESERVE_CHUNK;
	keep = (keep + 4095) & ~(uint64_t)4095;
	if (keep + GIVE_BACK_MIN > was)
		return false;
	/*
	 * SH1: no punch while the control thread reads the slab up to a
	 * high-water mark it loaded before the shrink (a timers query,
	 * query_step()): on a full filesystem its read of a hole is a SIGBUS.
	 * Pairs with SH2 there: `shrinking` stored, a full barrier, `scanning`
	 * loaded, against the reverse; one of the two sees the other's store.
	 * Until the punch is done, no step of the query begins, and the next
	 * loads the lowered mark.
	 */
	at_store(&s->shrinking, 1);
	at_fence();
	if (at_load_acq(&s->scanning)) {      /* and the reads of a step that ended (SH5) before the punch */
		at_store_rel(&s->shrinking, 0);
		s->give_back_at = now + GIVE_BACK_SCAN_WAIT_NS;
		return s->give_back_due = true;
	}
	wheel_shrink(wh, end);
	s->given_back_ns = now;
	draw_gen_base(s, now);
	nodes = (keep - s->slab_off) / sizeof(struct chime_node);
	s->punch_bytes = was - keep;
	s->reserved_bytes = keep;
	at_store(&wh->reserved, nodes < s->cfg.capacity ? (uint32_t)nodes : s->cfg.capacity);
	/* To the file's end: blocks a reader faulted in past the reserve go too. */
	{
		struct aside_job j = { .op = ASIDE_PUNCH, .fd = s->seg_fd, .off = keep, .len = s->seg.size - keep,
				       .ud = UD_PUNCH };

		s->punches++;
		if (!aside_post(s->aside, &j))
			give_back_done(s, chime_seg_punch(s->seg_fd, keep, s->seg.size - keep));
	}
	return false;
}

/*
 * The completion of slab_give_back()'s punch: counted given back once it
 * is. A filesystem that cannot punch gives nothing back, now or again.
 * Either way the reserve stays lowered: a punch that failed may have made
 * holes all the same, and the slab grows there again as anywhere, its
 * blocks reserved and mapped first (the file's own blocks take no room).
 */
static void give_back_done(struct shard *s, int res)
{
	s->punches--;
	if (res == 0)
		stats_slab_given_back(&s->st, s->punch_bytes);
	else if (res == -EOPNOTSUPP)
		s->give_back_off = true;
	at_store_rel(&s->shrinking, 0);         /* SH3: the punch done; pairs with SH4 (query_step()) */
}

/* Before the thread goes: no chunk or client's page on its way into a mapping about to be unmapped. */
static void reserve_settle(struct shard *s)
{
	aside_drain(s->aside);
	reap_aside(s);
}

/* shard_core.grow: the pass has used up the reserve (chan.c grant_new()). */
static bool slab_grow(struct shard_core *sc)
{
	struct shard *s = (struct shard *)((char *)sc - offsetof(struct shard, core));

	return reserve_chunk(s, now_ns());
}

/* ---- set-up (main thread) ---- */

/* Empty, and ours: created, and killed before chime_seg_file() sized it (a file of another --capacity is not). */
static bool never_sized(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0 && chime_seg_ours(&st);
}

/*
 * A shard file whose creation never finished: empty, or its magic never
 * stored (0, "not ready": chime_seg_file() creates and sizes it,
 * shard_init() publishes it last). Nothing in it: as if missing (0; the
 * caller makes it anew). Refused (another --capacity, a damaged header), a
 * broker killed while it re-created a missing file kept the next one from
 * starting.
 */
static int never_finished(struct shard *s)
{
	log_msg(LOG_WARNING, "shard file '%s' was never finished (a broker was killed while it created it): "
		"taken as missing", s->path);
	return 0;
}

/*
 * The file an earlier broker left, if cfg->sessions asks for it: 1 if it is
 * mapped and its header matches our geometry, 0 if there is none, or a
 * negative errno (logged). Its wheel is not looked at yet.
 */
static int seg_reopen(struct shard *s, const struct chime_shard_geom *g)
{
	const struct chime_shard_seg *hdr;
	uint32_t layout = 0;
	int r;

	r = chime_seg_file_reopen(s->path, g->size, s->cfg.seg_mode, &s->seg_fd, &s->seg);
	if (r == -ENOENT)
		return 0;
	if (r == -EMEDIUMTYPE && never_sized(s->path))
		return never_finished(s);
	if (r == -EMEDIUMTYPE)
		return log_errno_hint(LOG_ERR, r, "start with the options it was written with, or --fresh to discard it",
				      "shard file '%s' is not %llu bytes (another --capacity?)",
				      s->path, (unsigned long long)g->size);
	if (r == -EPERM) {
		struct stat st = { .st_uid = (uid_t)-1 };

		(void)lstat(s->path, &st);
		return log_file_not_ours("shard file", s->path, &st, "remove it, or start with --fresh");
	}
	if (r < 0)
		return log_errno(LOG_ERR, r, "cannot open shard file '%s'", s->path);
	hdr = s->seg.base;
	r = chime_seg_check(&s->seg, CHIME_SEG_SHARD, &layout);
	if (r == -EAGAIN) {
		chime_seg_unmap(&s->seg);
		close(s->seg_fd);
		s->seg_fd = -1;
		return never_finished(s);
	}
	if (r == -EPROTO)
		return log_errno_hint(LOG_ERR, r, "--fresh discards it",
				      "shard file '%s' has layout %u, this chimed %u", s->path, layout,
				      CHIME_SHM_LAYOUT);
	if (r == 0 && (hdr->shard != s->cfg.idx || hdr->key_buckets != g->key_buckets ||
		       hdr->key_off != g->key_off || hdr->wheel_off != g->wheel_off))
		r = -EBADMSG;
	if (r < 0)
		return log_errno_hint(LOG_ERR, -EBADMSG, "--fresh discards it",
				      "shard file '%s': damaged header", s->path);
	return 1;
}

/* Sessions' timers from the file an earlier broker left (restore.h). Logs what it found. */
static int restore(struct shard *s, uint64_t now)
{
	const struct chime_wheel *w = chime_at(&s->seg, s->slab_off - sizeof(struct chime_wheel));
	uint64_t hw = w->high_water <= s->cfg.capacity ? w->high_water : s->cfg.capacity;
	uint64_t must = s->slab_off + hw * sizeof(struct chime_node);
	uint64_t want = s->slab_off + (hw + RESERVE_AHEAD_NODES) * sizeof(struct chime_node);
	uint64_t old_now = w->now_ns;  /* the old wheel's last advance: restore_nodes() */
	struct wheel_rebuild_stats ws;
	struct restore_stats rs;
	int r;

	/*
	 * Before the rebuild reads the slab: every page it may touch has
	 * storage. Up to the high-water mark the earlier broker had it
	 * already; room ahead is only wanted: on a full filesystem the broker
	 * starts with what it had (new arms get ENOMEM until the loop's
	 * reserve_ahead() gets room) rather than not at all.
	 */
	must = must < s->seg.size ? must : s->seg.size;
	want = want < s->seg.size ? want : s->seg.size;
	r = chime_seg_reserve(s->seg_fd, 0, must);
	if (r < 0)
		return log_errno(LOG_ERR, r, "cannot reserve %llu KiB for shard file '%s'",
				 (unsigned long long)(must >> 10), s->path);
	if (want > must && (want - must > slab_room(s, must) ||
			    chime_seg_reserve(s->seg_fd, must, want - must) < 0)) {
		log_msg(LOG_WARNING, "shard file '%s': no room on its filesystem beyond its %llu KiB: new "
			"timers get ENOMEM until it has", s->path, (unsigned long long)(must >> 10));
		want = must;
	}
	r = wheel_rebuild(&s->core.wh, chime_at(&s->seg, s->slab_off - sizeof(struct chime_wheel)),
			  wheel_region_size(s->cfg.capacity), s->cfg.capacity, s->cfg.resolution_ns, now, &ws);
	if (r < 0)
		return log_errno_hint(LOG_ERR, -EBADMSG, "--fresh discards it",
				      "shard file '%s': damaged wheel header", s->path);
	r = reserve_map(s, want);
	if (r < 0 && want > must) {
		log_msg(LOG_WARNING, "shard file '%s': its filesystem will not map it beyond its %llu KiB: new "
			"timers get ENOMEM until it does", s->path, (unsigned long long)(must >> 10));
		want = must;
		r = reserve_map(s, want);
	}
	if (r < 0)
		return log_errno_hint(LOG_ERR, r, SEG_NO_ROOM_HINT, "cannot map shard file '%s' (%llu KiB): its "
				      "filesystem refused the pages", s->path, (unsigned long long)(want >> 10));
	reserve_note(s, want);
	/* The index's chains run through the slab the rebuild has just mapped. */
	keyidx_init(&s->core.ki, s->core.ki.heads, s->core.ki.mask + 1, s->core.wh.nodes, s->core.ki.seed);
	r = restore_nodes(&s->core, old_now, &rs);
	if (r < 0)
		log_errno(LOG_WARNING, r, "shard %u: held events restored in slab order, not firing order",
			  s->cfg.idx);
	rs.dropped += ws.dropped;
	stats_restore(&s->st, rs.kept, rs.dropped, rs.redelivered);
	if (rs.kept || rs.anonymous || rs.anonymous_grants || rs.grants || rs.dropped)
		log_msg(LOG_NOTICE, "shard %u: kept %llu timer%s of %llu session%s (%llu due while no broker ran, "
			"%llu delivered events to redeliver, %llu grants kept for their processes); freed %llu "
			"timer%s and %llu grant%s of anonymous clients, %llu damaged", s->cfg.idx,
			(unsigned long long)rs.kept, rs.kept == 1 ? "" : "s", (unsigned long long)rs.sessions,
			rs.sessions == 1 ? "" : "s", (unsigned long long)rs.due,
			(unsigned long long)rs.redelivered, (unsigned long long)rs.grants,
			(unsigned long long)rs.anonymous, rs.anonymous == 1 ? "" : "s",
			(unsigned long long)rs.anonymous_grants, rs.anonymous_grants == 1 ? "" : "s",
			(unsigned long long)rs.dropped);
	return 0;
}

/*
 * The offsets wall-clock nodes are based on: the file's (an earlier
 * broker's, which restore() keeps the nodes on; the shard's first pass
 * follows the offset of now), or, in a new file or one of a broker before
 * wall-clock timers (0: no such node in it), the one of now.
 */
static void wall_init(struct shard *s, bool reopened)
{
	struct chime_shard_seg *hdr = s->seg.base;
	struct shard_core *sc = &s->core;

	sc->wall_file = hdr;
	if (reopened && hdr->wall_cur <= 1 && hdr->wall_off[hdr->wall_cur] != 0) {
		sc->wall_off[0] = hdr->wall_off[0];
		sc->wall_off[1] = hdr->wall_off[1];
		sc->wall_cur = hdr->wall_cur;
		sc->wall_mixed = true;
	} else {
		sc->wall_off[0] = sc->wall_off[1] = wall_published();
		sc->wall_cur = 0;
		hdr->wall_off[0] = hdr->wall_off[1] = sc->wall_off[0];
		hdr->wall_cur = 0;
	}
	sc->wall_seen = 0;      /* never published: the first pass follows */
}

int shard_init(struct shard *s, const struct shard_cfg *cfg, const char *socket_path)
{
	struct chime_shard_geom g = { 0 };
	struct chime_shard_seg *hdr;
	uint32_t qsize = 4;
	uint64_t now = now_ns(), reserve, seed;
	int r, reopened = 0;

	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->seg_fd = -1;
	s->doorbell = -1;
	s->give_back_hold_ns = GIVE_BACK_EVERY_NS;
	s->sleeping = &((struct chime_pub_shard *)((char *)cfg->pub + cfg->pub->shards_off))[cfg->idx].sleeping;
	s->wake_ns = &((struct chime_pub_shard *)((char *)cfg->pub + cfg->pub->shards_off))[cfg->idx].wake_ns;
	if (!chime_shard_path(s->path, sizeof(s->path), socket_path, cfg->idx))
		return log_errno(LOG_ERR, ENAMETOOLONG, "shard segment path for '%s'", socket_path);

	g.capacity = cfg->capacity;
	g.key_buckets = keyidx_buckets_for(cfg->capacity);
	g.wheel_size = wheel_region_size(cfg->capacity);
	r = chime_shard_layout(&g);
	if (r < 0)
		return log_errno(LOG_ERR, r, "shard layout (capacity %u)", cfg->capacity);
	s->slab_off = g.wheel_off + sizeof(struct chime_wheel);
	if (cfg->sessions) {
		uint32_t sessions = 0;

		reopened = seg_reopen(s, &g);
		if (reopened < 0)
			return reopened;
		for (uint32_t slot = 0; slot < cfg->max_clients; slot++)
			sessions += cfg->sessions[slot].ch != NULL;
		/* Said here, and counted for chimectl restart (chime_ctl.shards_lost): else the shard starts empty unsaid. */
		if (!reopened && sessions) {
			s->file_lost = true;
			log_msg(LOG_ERR, "shard file '%s' is missing: the %u session%s taken over %s lost %s "
				"timers on shard %u (it was removed, and the last stop could not write it again, or "
				"a crash came first)", s->path, sessions, sessions == 1 ? "" : "s",
				sessions == 1 ? "has" : "have", sessions == 1 ? "its" : "their", cfg->idx);
		}
	}
	if (!reopened) {
		/*
		 * The file is sparse: reserve what is touched now (header, key
		 * index, wheel header) and a first slab chunk; the loop reserves
		 * the rest a chunk ahead of the slab's high-water mark
		 * (reserve_ahead()).
		 */
		reserve = s->slab_off + RESERVE_CHUNK < g.size ? s->slab_off + RESERVE_CHUNK : g.size;
		r = chime_seg_file(s->path, g.size, reserve, cfg->seg_mode, &s->seg_fd, &s->seg);
		if (r == -ENOSPC || r == -EDQUOT)
			return log_errno_hint(LOG_ERR, r, SEG_NO_ROOM_HINT, "cannot reserve %llu KiB for shard segment '%s'",
					      (unsigned long long)(reserve >> 10), s->path);
		if (r < 0)
			return log_errno(LOG_ERR, r, "cannot create shard segment '%s' (%llu bytes)",
					 s->path, (unsigned long long)g.size);
		hdr = s->seg.base;
		hdr->shard = cfg->idx;
		hdr->key_buckets = g.key_buckets;
		hdr->key_off = g.key_off;
		hdr->wheel_off = g.wheel_off;
		r = wheel_init(&s->core.wh, chime_at(&s->seg, g.wheel_off), g.wheel_size,
			       cfg->capacity, cfg->resolution_ns, now);
		if (r < 0)
			return log_errno(LOG_ERR, r, "wheel_init(capacity %u, resolution %llu ns)",
					 cfg->capacity, (unsigned long long)cfg->resolution_ns);
		r = reserve_map(s, reserve);
		if (r < 0)
			return log_errno_hint(LOG_ERR, r, SEG_NO_ROOM_HINT, "cannot map shard segment '%s' (%llu KiB): "
					      "its filesystem refused the pages", s->path,
					      (unsigned long long)(reserve >> 10));
		reserve_note(s, reserve);
	}
	if (cfg->seg_gid != (gid_t)-1 && fchown(s->seg_fd, (uid_t)-1, cfg->seg_gid) < 0)
		return log_errno_hint(LOG_ERR, errno, GROUP_HINT(errno), "cannot give '%s' to group %u (--stats-group)",
				      s->path, (unsigned)cfg->seg_gid);

	s->core.shard = cfg->idx;
	s->core.capacity = cfg->capacity;
	s->core.max_clients = cfg->max_clients;
	s->core.quota = cfg->quota;
	s->core.wake_retry_ns = UINT64_MAX;
	s->core.grow = slab_grow;
	s->core.st = &s->st;
	s->core.by_slot = calloc(cfg->max_clients, sizeof(*s->core.by_slot));
	s->core.users = calloc(cfg->max_clients, sizeof(*s->core.users));
	s->core.user_of_slot = calloc(cfg->max_clients, sizeof(*s->core.user_of_slot));
	s->active = calloc(cfg->max_clients, sizeof(*s->active));
	s->dying = calloc(cfg->max_clients, sizeof(*s->dying));
	/* a client's command and its unacknowledged FORGET (holder_watch()), and STOP */
	while (qsize < 2 * cfg->max_clients + 2)
		qsize <<= 1;
	s->q = calloc(qsize, sizeof(*s->q));
	s->q_mask = qsize - 1;
	if (!s->core.by_slot || !s->core.users || !s->core.user_of_slot || !s->active || !s->dying || !s->q)
		return log_errno(LOG_ERR, ENOMEM, "shard %u state", cfg->idx);
	r = stats_init(&s->st, cfg->ctl, cfg->idx);
	if (r < 0)
		return log_errno(LOG_ERR, r, "shard %u counters", cfg->idx);

	/*
	 * Zero-filled buckets are an empty index (keyidx.h): no page is touched
	 * here. Its hash is new every run (restore() refills it), so clients
	 * cannot aim their keys at one bucket.
	 */
	if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		seed = now * UINT64_C(0x9e3779b97f4a7c15);
	keyidx_init(&s->core.ki, chime_at(&s->seg, g.key_off), g.key_buckets, s->core.wh.nodes, seed);
	if (keyidx_walks_init(&s->core.ki, cfg->max_clients) < 0)
		return log_errno(LOG_ERR, ENOMEM, "shard %u state", cfg->idx);
	/* Sessions an earlier broker left have a channel here, timers or not (a missing file: none). */
	for (uint32_t slot = 0; cfg->sessions && slot < cfg->max_clients; slot++) {
		const struct shard_session *ss = &cfg->sessions[slot];

		if (ss->ch && chan_restore_init(&s->core, ss->ch, (uint16_t)slot, ss->generation, ss->uid,
						ss->user_quota, cfg->sq_size) < 0)
			return log_errno(LOG_ERR, ENOMEM, "shard %u: restoring sessions", cfg->idx);
	}
	wall_init(s, reopened);
	if (reopened) {
		r = restore(s, now);
		if (r < 0)
			return r;
	}
	/* Who may go ahead of a backlog is counted per user too. */
	wheel_group_owners(&s->core.wh, s->core.user_of_slot);
	/* Ids differ from one broker run to the next: a client cannot guess another's. */
	draw_gen_base(s, now);
	chime_seg_publish(&((struct chime_shard_seg *)s->seg.base)->hdr, CHIME_SEG_SHARD, g.size);

	s->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->doorbell < 0)
		return log_errno(LOG_ERR, errno, "eventfd for shard %u", cfg->idx);
	if (sem_init(&s->ready, 0, 0) < 0)
		return log_errno(LOG_ERR, errno, "sem_init");
	return 0;
}

/* ---- commands ---- */

void shard_post(struct shard *s, const struct shard_cmd *cmd)
{
	uint64_t t = s->q_tail;

	/*
	 * The control thread never has more than 2 * max_clients + 1 commands
	 * out: one acknowledged command a client, a FORGET (not acknowledged,
	 * once a restore) a client, and STOP.
	 */
	s->q[t & s->q_mask] = *cmd;
	/* M1: the command before the tail; pairs with M2 in run_cmds(). */
	at_store_rel(&s->q_tail, t + 1);
	/* Always ring: commands are rare, and an awake shard reads the count and moves on. */
	(void)eventfd_write(s->doorbell, 1);
}

void shard_poke(struct shard *s)
{
	(void)eventfd_write(s->doorbell, 1);
}

static void ack(struct shard *s, struct shard_ack *a, int err)
{
	if (err)
		(void)at_cas_relaxed(&a->err, &(int32_t){ 0 }, err);
	/* M3: our work (grants in the client's segment, freed nodes) before the
	 * count; pairs with the control thread's acquire load of pending. */
	if (at_sub(&a->pending, 1) == 0)
		(void)eventfd_write(s->cfg.notify_fd, 1);
}

/*
 * A session's process was given events to take while the broker beats at
 * rest (IDLE_BEAT_NS): what it takes must be seen taken within a 90 ms
 * beat (clients_beat(), control.c), or a crash delivers more of it again.
 * So the control thread is woken to beat at that pace until it is. One
 * eventfd write per rest, whoever clears the word first.
 */
static void rest_end(struct shard *s)
{
	s->core.watch_started = false;
	/* REST2: head_watch stored before resting is read; pairs with REST1 in broker_run(). */
	at_fence();
	if (at_load(s->cfg.resting) && at_xchg(s->cfg.resting, 0))
		(void)eventfd_write(s->cfg.notify_fd, 1);
}

static bool cmds_pending(struct shard *s)
{
	return at_load(&s->q_tail) != s->q_head;
}

static void active_del(struct shard *s, struct chan *ch)
{
	for (uint32_t i = 0; i < s->nr_active; i++) {
		if (s->active[i] == ch) {
			s->active[i] = s->active[--s->nr_active];
			return;
		}
	}
}

/* ---- client doorbells (io_uring multishot polls) ---- */

static struct io_uring_sqe *sqe_get(struct shard *s)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);

	if (!sqe) {
		/* A full submission queue: hand it to the kernel and take a fresh one. */
		(void)io_uring_submit(&s->ring);
		sqe = io_uring_get_sqe(&s->ring);
	}
	return sqe;
}

/* A poll on each client doorbell that has none (before sleeping; submitted by the wait). */
static void bells_arm(struct shard *s)
{
	for (uint32_t i = 0; i < s->nr_active; i++) {
		struct chan *ch = s->active[i];
		struct io_uring_sqe *sqe;

		if (ch->bell_fd < 0 || ch->bell_state != SHARD_BELL_IDLE)
			continue;
		sqe = sqe_get(s);
		if (!sqe)
			return;         /* the ring is wedged: the loop's timeout still wakes us */
		io_uring_prep_poll_multishot(sqe, ch->bell_fd, POLLIN);
		io_uring_sqe_set_data64(sqe, (uint64_t)ch->slot << 2 | UD_CHAN);
		ch->bell_state = SHARD_BELL_ARMED;
	}
}

static void bell_cancel(struct shard *s, struct chan *ch)
{
	struct io_uring_sqe *sqe;

	if (ch->bell_state != SHARD_BELL_ARMED)
		return;
	ch->bell_state = SHARD_BELL_CANCELLING;
	sqe = sqe_get(s);
	if (!sqe)
		return;         /* retried by reap() until it goes through */
	io_uring_prep_cancel64(sqe, (uint64_t)ch->slot << 2 | UD_CHAN, 0);
	io_uring_sqe_set_data64(sqe, UD_CANCEL);
	(void)io_uring_submit(&s->ring);
}

/* The channel of a client slot, active or dying; NULL if none. */
static struct chan *chan_of_slot(struct shard *s, uint64_t slot)
{
	if (slot < s->core.max_clients && s->core.by_slot[slot])
		return s->core.by_slot[slot];
	return NULL;
}

/* The channel a doorbell's poll belongs to. */
static struct chan *bell_owner(struct shard *s, uint64_t ud)
{
	return chan_of_slot(s, ud >> 2);
}

/* Take the aside thread's results: a chunk reserved, a client's pages mapped. */
static void reap_aside(struct shard *s)
{
	struct aside_job done[8];
	unsigned n;

	while ((n = aside_reap(s->aside, done, 8)) > 0) {
		for (unsigned i = 0; i < n; i++) {
			uint64_t ud = done[i].ud;

			if (ud == UD_RESERVE) {
				reserve_async_done(s, done[i].res);
			} else if (ud == UD_PUNCH) {
				give_back_done(s, done[i].res);
			} else if ((ud & 0xffu) == UD_TOUCH) {
				struct chan *ch = chan_of_slot(s, ud >> 8);

				s->touch_pops--;
				if (ch)
					chan_touch_populated(ch, done[i].res);
			}
		}
	}
}

/* Take every completion: doorbells rung, polls ended; and the aside thread's. */
static void reap(struct shard *s)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;

	reap_aside(s);
	io_uring_for_each_cqe(&s->ring, head, cqe) {
		uint64_t ud = cqe->user_data;

		if (ud == UD_BELL) {
			s->bell_armed = 0;
		} else if (UD_TAG(ud) == UD_CHAN) {
			struct chan *ch = bell_owner(s, ud);

			/*
			 * A ring (F_MORE: the poll goes on), or its end (cancelled,
			 * an error, a completion queue that overflowed): re-armed
			 * before the next sleep, when it at once reports the
			 * counter never reset, a spurious pass at most.
			 */
			if (ch && !(cqe->flags & IORING_CQE_F_MORE))
				ch->bell_state = SHARD_BELL_IDLE;
		}
		seen++;
	}
	io_uring_cq_advance(&s->ring, seen);
}

/* While a detach waits for its poll to end: collect completions without sleeping. */
static void reap_cancelled(struct shard *s)
{
	for (uint32_t i = 0; i < s->nr_dying; i++) {
		struct chan *ch = s->dying[i].ch;

		if (ch->bell_state == SHARD_BELL_CANCELLING) {
			/* A cancel lost to a full queue: ask again. */
			ch->bell_state = SHARD_BELL_ARMED;
			bell_cancel(s, ch);
		}
	}
	/* Completions are posted only when this thread enters the kernel (DEFER_TASKRUN). */
	(void)io_uring_get_events(&s->ring);
	reap(s);
}

/*
 * Pages of a client's touch table the shard wants to use, found resident
 * (chan_touch_check()), mapped into the broker on the aside thread
 * (MADV_POPULATE_WRITE): a page the client paged out meanwhile comes
 * back from swap there, not on this thread. True if one was sent.
 */
static bool touch_populate(struct shard *s, struct chan *ch)
{
	struct chan_populate p;
	struct aside_job j = { .op = ASIDE_POPULATE, .fd = -1 };

	if (!chan_touch_check(&s->core, ch, &p))
		return false;
	j.addr = p.addr;
	j.plen = p.len;
	j.ud = (uint64_t)ch->slot << 8 | UD_TOUCH;
	if (!aside_post(s->aside, &j)) {
		chan_touch_populated(ch, -EAGAIN);
		return false;
	}
	s->touch_pops++;
	return true;
}

/* Returns true on STOP. */
static bool run_cmds(struct shard *s, bool *work)
{
	/* M2: the tail, then the commands; pairs with M1. */
	uint64_t tail = at_load_acq(&s->q_tail);

	while (s->q_head != tail) {
		struct shard_cmd c = s->q[s->q_head & s->q_mask];
		int r;

		s->q_head++;
		*work = true;
		switch (c.op) {
		case SHARD_CMD_ATTACH:
			r = chan_attach(&s->core, c.ch, c.mem, c.slot, c.generation, c.uid, c.user_quota);
			if (!r) {
				c.ch->session = (c.flags & SHARD_CMD_F_SESSION) != 0;
				s->active[s->nr_active++] = c.ch;  /* its doorbell is polled from the next sleep on */
			}
			ack(s, c.ack, r);
			break;
		case SHARD_CMD_REATTACH:
			chan_reattach(&s->core, c.ch, c.mem, c.flags & SHARD_CMD_F_RESUME);
			c.ch->user->quota = c.user_quota;       /* the latest attach's, as chan_attach() keeps it */
			s->active[s->nr_active++] = c.ch;
			ack(s, c.ack, 0);
			break;
		case SHARD_CMD_PARK:
		case SHARD_CMD_DETACH:
			if (s->core.by_slot[c.slot] != c.ch) {
				ack(s, c.ack, 0);       /* never attached here */
				break;
			}
			if (c.op == SHARD_CMD_PARK)
				c.ch->handover = (c.flags & SHARD_CMD_F_HANDOVER) != 0;
			active_del(s, c.ch);
			bell_cancel(s, c.ch);
			s->dying[s->nr_dying++] = c;
			break;
		case SHARD_CMD_FORGET:
			if (s->core.by_slot[c.slot] != c.ch || !c.ch->parked)
				break;
			chan_forget_carried(&s->core, c.ch);
			/* a parked channel's count is published by whoever changes it (reclaim_step()) */
			stats_client_owned(&s->st, c.ch->slot, c.ch->owned);
			break;
		case SHARD_CMD_STOP:
			/*
			 * Parks still in their steps (the stop gave up on them
			 * after STOP_PARK_NS): what their processes took, settled
			 * now, or the next process gets it again.
			 */
			for (uint32_t i = 0; i < s->nr_dying; i++)
				if (s->dying[i].op == SHARD_CMD_PARK)
					chan_park_cut(&s->core, s->dying[i].ch);
			return true;
		}
	}
	return false;
}

/*
 * The dying channel whose sweep goes next: by user, then by channel
 * (chan_sweeps_before()). In turn by channel, one user's many reclaims held
 * another user's single park back for all of them: with 60-120 of them over
 * 1.8M nodes, a session's reopen took 1.3-1.4 s, 8-19 ms before (a security
 * audit).
 */
static uint32_t reclaim_pick(struct shard *s)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < s->nr_dying; i++)
		if (chan_sweeps_before(s->dying[i].ch, s->dying[best].ch))
			best = i;
	chan_sweep_served(s->dying[best].ch, ++s->reclaim_turns);
	return best;
}

static void reclaim_step(struct shard *s, bool *work)
{
	for (uint32_t i = 0; i < s->nr_dying; i++) {
		if (s->dying[i].ch->bell_state != SHARD_BELL_IDLE || s->dying[i].ch->touch_pop) {
			reap_cancelled(s);
			break;
		}
	}
	/*
	 * One channel's sweep per pass (RECLAIM_BUDGET nodes), users in turn: a
	 * budget each for every channel going at once (a user closing sixty
	 * sessions together) held every timer of the shard back for tens to
	 * hundreds of milliseconds per pass.
	 */
	if (s->nr_dying) {
		uint32_t i = reclaim_pick(s);
		struct shard_cmd *c = &s->dying[i];

		*work = true;
		/*
		 * The poll's completions name the slot, the next client's after
		 * the ack, and a populate maps the client's table, which the
		 * control thread unmaps after the ack: acknowledge only once
		 * neither is left.
		 */
		if (c->ch->bell_state != SHARD_BELL_IDLE || c->ch->touch_pop ||
		    !(c->op == SHARD_CMD_PARK ? chan_park(&s->core, c->ch, RECLAIM_BUDGET) :
					        chan_reclaim(&s->core, c->ch, RECLAIM_BUDGET)))
			return;
		/*
		 * What a parked session holds still counts against its user's
		 * quota: its count as the park left it (only active channels'
		 * are published, publish()), 0 for a channel that is gone.
		 */
		stats_client_owned(&s->st, c->ch->slot, c->op == SHARD_CMD_PARK ? c->ch->owned : 0);
		if (c->op == SHARD_CMD_DETACH)
			chan_fini(c->ch);
		/* Its last counts (refused_left()) published before the ack: the control thread logs them then. */
		stats_publish(&s->st);
		ack(s, c->ack, 0);
		s->dying[i] = s->dying[--s->nr_dying];
	}
}

/* ---- the counters ---- */

/*
 * Publish the counters (at most once per PUBLISH_NS, and before sleeping),
 * with what is measured only here, not on the hot path: a reset asked for
 * since the last time, the ring depths (one load of each client's sq_tail),
 * the exact earliest deadline (a walk of the earliest wheel slots, at most
 * NEXT_SCAN_MAX nodes in all: up to ~25 us on a cold 256-node slot, once a
 * ms at most) and the thread's CPU time.
 */
static void publish(struct shard *s)
{
	struct shard_core *sc = &s->core;
	uint64_t deepest = 0, waiting = 0, next, gen;
	int inexact;

	if (!CHIME_COUNTERS)
		return;
	/*
	 * RS2: acquire of the reset generation; pairs with RS1 (reset_stats(),
	 * handshake.c), so stats_reset_ns of that generation happens before our
	 * reset_gen, which R-STAT2 publishes to the tools.
	 */
	gen = at_load_acq(&s->cfg.ctl->stats_reset_gen);
	if (gen != s->st.sh.reset_gen)
		stats_reset_figures(&s->st, gen);
	for (uint32_t i = 0; i < s->nr_active; i++) {
		uint64_t d = chan_sq_waiting(s->active[i]);

		stats_client_sq(&s->st, s->active[i]->slot, d);
		stats_client_owned(&s->st, s->active[i]->slot, s->active[i]->owned);
		waiting += d;
		if (d > deepest)
			deepest = d;
	}
	stats_sq(&s->st, deepest, waiting);
	next = wheel_earliest(&sc->wh, NEXT_SCAN_MAX, &inexact);
	/* UINT64_MAX says "none" to the tools; chime_arm() takes it as a deadline too. */
	if (next == UINT64_MAX && wheel_armed(&sc->wh))
		next = UINT64_MAX - 1;
	stats_shard_gauges(&s->st, sc->backlog, next, inexact, thread_cpu_ns());
	stats_slab_bytes(&s->st, s->reserved_bytes > s->slab_off ? s->reserved_bytes - s->slab_off : 0);
	stats_publish(&s->st);
}

/* ---- the loop ---- */

/* ch's user's budgets, as they are for this pass. */
static struct chan_user *user_budgets(struct shard *s, struct chan *ch)
{
	struct chan_user *u = ch->user;

	if (u->drain_pass != s->passes) {
		u->drain_pass = s->passes;
		u->drain_left = USER_DRAIN_BUDGET;
		u->service_left = USER_SERVICE_BUDGET;
		u->wake_left = USER_WAKE_BUDGET;
	}
	return u;
}

/* Drain ch within what its user has left of USER_DRAIN_BUDGET this pass. */
static unsigned drain_shared(struct shard *s, struct chan *ch)
{
	struct chan_user *u = user_budgets(s, ch);
	unsigned n;

	/* With 0 left it still takes a CANCEL_KEY's step, if its turn: walks are budgeted apart. */
	n = chan_drain(&s->core, ch, u->drain_left < DRAIN_BUDGET ? u->drain_left : DRAIN_BUDGET);
	u->drain_left -= n;
	return n;
}

static unsigned fire_due(struct shard *s, uint64_t now)
{
	return chan_fire_due(&s->core, now, FIRE_BUDGET);
}

/*
 * When the next timer is due: the exact earliest deadline when it is found
 * within WAKE_SCAN nodes of the earliest slots (more than one only when a
 * lazily reset timer waits in a slot before its deadline), else the first
 * nanosecond of the slot where the walk stopped (a lower bound: waking early
 * is never wrong; that wake-up re-files the lazily reset timers it finds
 * there). Not wheel_next_deadline(), the
 * end of the earliest tick: a shard that slept until then fired every timer
 * up to one resolution late (50 us on average at 100 us), although the wheel
 * fires exactly while the shard is awake.
 *
 * Or earlier, to stage a coming cascade of level 2 or above in idle time
 * (wheel_stage_at()): 500k timers due 300 ms into a level-2 slot held a
 * timer due 1 ms into it back 41-42 ms, the walk of the whole slot when
 * the shard woke at its start (ARCHITECTURE.md, "Staging the next cascade").
 */
static uint64_t next_wake(struct shard *s)
{
	uint64_t due, stage = wheel_stage_at(&s->core.wh);
	int inexact;

	due = wheel_earliest(&s->core.wh, WAKE_SCAN, &inexact);
	due = s->core.wake_retry_ns < due ? s->core.wake_retry_ns : due;
	/* not while a chunk or a punch is on its way: its completion wakes the shard for the look */
	if (s->give_back_due && !s->reserve_pending && !s->punches && s->give_back_at < due)
		due = s->give_back_at;
	return stage < due ? stage : due;
}

/* The re-check after S-SLEEP: is there anything the sleep could miss? */
static bool anything_pending(struct shard *s, uint64_t wake_at)
{
	if (cmds_pending(s) || s->nr_dying || chan_walking(&s->core) || s->core.wall_walking)
		return true;
	/* W2: a step published after the top of the pass, by a control thread that read wall_any 0 */
	if (wall_published() != s->core.wall_seen)
		return true;
	for (uint32_t i = 0; i < s->nr_active; i++)
		if (chan_pending(&s->core, s->active[i]))
			return true;
	return wake_at <= now_ns();
}

/* next_wake(), read again only after work, or once it has passed: it scans nodes. */
static uint64_t wake_time(struct shard *s, uint64_t *at, bool *known, uint64_t now)
{
	if (!*known || *at <= now) {
		*at = next_wake(s);
		*known = true;
	}
	return *at;
}

static void arm_bell(struct shard *s)
{
	struct io_uring_sqe *sqe;

	if (s->bell_armed)
		return;
	sqe = io_uring_get_sqe(&s->ring);
	if (!sqe)
		return;         /* 8 entries, one in use at most: cannot happen */
	io_uring_prep_read(sqe, s->doorbell, &s->bell_buf, sizeof(s->bell_buf), 0);
	io_uring_sqe_set_data64(sqe, UD_BELL);
	s->bell_armed = 1;
}

/* The bucket's credit at now (it refills at --spin-share of the time); false when spent. */
static bool spin_credit_left(struct shard *s, uint64_t now)
{
	uint64_t gone = now - s->spin_credit_at;

	/* Capped first: the product cannot overflow after any sleep. */
	gone = gone < 100u * SPIN_BURST_NS ? gone : 100u * SPIN_BURST_NS;
	s->spin_credit += (int64_t)(gone * s->cfg.spin_share / 100u);
	if (s->spin_credit > SPIN_BURST_NS)
		s->spin_credit = SPIN_BURST_NS;
	s->spin_credit_at = now;
	return s->spin_credit > 0;
}

/* A pass spent spinning: counted always, taken from the bucket unless busy-polling (not limited). */
static void spin_charge(struct shard *s, uint64_t ns)
{
	ns = ns < SPIN_CHARGE_MAX_NS ? ns : SPIN_CHARGE_MAX_NS;
	if (s->cfg.spin_us >= 0)
		s->spin_credit -= (int64_t)ns;
	stats_spin(&s->st, ns);
}

/* One timed sleep ended `late` after it was due: move the lead towards the 90th percentile. */
static void wake_lead_learn(struct shard *s, uint64_t late, uint64_t max)
{
	uint64_t lead = s->wake_lead_ns;

	lead = late > lead ? lead + 9 * WAKE_LEAD_STEP_NS : lead - WAKE_LEAD_STEP_NS;
	s->wake_lead_ns = lead < WAKE_LEAD_MIN_NS ? WAKE_LEAD_MIN_NS : lead > max ? max : lead;
}

/* Sleep until a doorbell, or until `early_ns` before `deadline` (UINT64_MAX: none). True: the time came. */
static bool sleep_once(struct shard *s, uint64_t deadline, uint64_t early_ns, uint64_t lead_max)
{
	struct io_uring_cqe *cqe;
	bool timed_out = false;
	uint64_t now;

	reap(s);                /* doorbells that rang while we were awake are idle again */
	arm_bell(s);
	bells_arm(s);
	if (deadline == UINT64_MAX) {
		(void)io_uring_submit_and_wait(&s->ring, 1);
	} else {
		struct __kernel_timespec ts;
		uint64_t rel;

		now = now_ns();
		/* Early by early_ns: the loop spins the rest (it only sleeps if the
		 * deadline is further away than that). */
		rel = deadline > now + early_ns ? deadline - now - early_ns : 0;
		ts.tv_sec = (long long)(rel / 1000000000u);
		ts.tv_nsec = (long long)(rel % 1000000000u);
		timed_out = io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL) == -ETIME;
		if (timed_out && lead_max)
			wake_lead_learn(s, now_ns() - (now + rel), lead_max);
	}
	reap(s);
	return timed_out;
}

static void loop(struct shard *s)
{
	uint64_t now = now_ns(), last_work = now, last_pub = 0, t0, wake_at = 0;
	bool wake_known = false;
	int64_t spin_ns = s->cfg.spin_us < 0 ? -1 : s->cfg.spin_us * 1000;
	/*
	 * The idle spin actually used: --spin-us while spinning pays (a client's
	 * records arrive during it), halved by every spin that ended in a sleep
	 * anyway, down to IDLE_PURE_SPIN_NS. Batches of work that come further
	 * apart than the spin (keepalive touches every 10 ms) then cost a
	 * wake-up each, not a wake-up plus --spin-us of spinning.
	 */
	int64_t idle_spin_ns = spin_ns;
	/* Wake at most this much before a deadline and spin into it: --spin-us, at most WAKE_EARLY_MAX_NS. */
	uint64_t early_max = spin_ns < 0 ? 0 : (uint64_t)spin_ns < WAKE_EARLY_MAX_NS ? (uint64_t)spin_ns : WAKE_EARLY_MAX_NS;
	struct shard_core *sc = &s->core;

	s->wake_lead_ns = early_max;
	s->spin_credit = SPIN_BURST_NS;
	s->spin_credit_at = now;
	for (;;) {
		bool work = false, staged, want_spin, may_spin, spin_ok, timed_out = false;
		unsigned drained = 0, fired;
		uint64_t early_ns = s->wake_lead_ns < early_max ? s->wake_lead_ns : early_max;
		int64_t wall;

		t0 = now;
		at_store(&s->passes, s->passes + 1);
		if (cmds_pending(s) && run_cmds(s, &work))
			return;
		/* Before firing: a step of the wall clock may have made wall-clock timers due, or not yet. */
		wall = wall_published();
		if (__builtin_expect(wall != sc->wall_seen, 0)) {
			sc->wall_seen = wall;
			chan_wall_begin(sc, wall);
		}
		if (__builtin_expect(sc->wall_walking, 0)) {
			(void)chan_wall_step(sc, WALL_STEP_NODES);
			work = true;
		}
		for (uint32_t k = 0, i = s->nr_active ? (uint32_t)(s->passes % s->nr_active) : 0; k < s->nr_active; k++) {
			struct chan *ch = s->active[i];

			i = i + 1 == s->nr_active ? 0 : i + 1;
			drained += drain_shared(s, ch);
			/* A RESET_TOUCH waits for its run: mapped now, off this thread; or, nothing to map, plain. */
			if (ch->touch_hold && !ch->touch_pop && !touch_populate(s, ch))
				chan_touch_unhold(ch);
		}
		/* a CANCEL_KEY in steps goes on in the next pass, records or not */
		if (drained || chan_walking(sc))
			work = true;
		now = now_ns();
		reserve_ahead(s, now);
		if (slab_give_back(s, now))
			wake_known = false;     /* the sleep's end moves to give_back_at */
		fired = fire_due(s, now);
		if (fired) {
			work = true;
			s->spin_credit += (int64_t)fired * SPIN_PER_FIRE_NS;
			if (s->spin_credit > SPIN_BURST_NS)
				s->spin_credit = SPIN_BURST_NS;
		}
		sc->wake_retry_ns = UINT64_MAX;        /* found again by every held wake-up */
		sc->wake_clock_ns = 0;                 /* wake_send() reads the CPU time afresh */
		for (uint32_t k = 0, i = s->nr_active ? (uint32_t)(s->passes % s->nr_active) : 0; k < s->nr_active; k++) {
			struct chan *ch = s->active[i];
			struct chan_user *u = user_budgets(s, ch);

			i = i + 1 == s->nr_active ? 0 : i + 1;
			work |= chan_service_n(sc, ch, now, &u->service_left, &u->wake_left);
		}
		if (sc->watch_started)
			rest_end(s);
		if (s->nr_dying)
			reclaim_step(s, &work);

		if (work) {
			now = now_ns();
			/* a client's records caught by the spin after a gap: the spin paid */
			if (drained && spin_ns > 0 && now - last_work >= IDLE_PURE_SPIN_NS)
				idle_spin_ns = spin_ns;
			/* Records, not firing alone, are what more records tend to follow. */
			if (drained || !fired)
				last_work = now;
			wake_known = false;
			stats_loop(&s->st, now - t0);
		} else {
			stats_loop(&s->st, 0);
		}
		/* At most once per PUBLISH_NS (and before a sleep that may be longer,
		 * below): the block is 8 KiB (its histograms copied only when they
		 * moved), and readers retry while it is being written. */
		if (now - last_pub >= PUBLISH_NS) {
			publish(s);
			last_pub = now;
		}
		/*
		 * Every pass: part of the next cascade, so that the advance that
		 * reaches it does not stop while it moves every timer of a span
		 * (20 ms for a million 30-second timers on this VM). Applying
		 * records too: only idle or firing, a client that kept the shard
		 * applying its records (a reset flood) kept the slot unstaged,
		 * and another user's timer due as it started fired 64-65 ms
		 * late; and a node more per record applied, or passes long with
		 * records staged too little in the horizon (2M timers: a probe
		 * still 13-18 ms late with a node per four). The work is the
		 * cascade's, done earlier: nothing is staged but a slot within
		 * the horizon. Keeps the shard awake until done, as the cascade
		 * would.
		 */
		staged = wheel_stage(&sc->wh, STAGE_BUDGET + drained) > 0;
		/*
		 * Idle, and nothing due for a while: which pages of the clients'
		 * touch tables the shard wants next are resident, one client's a
		 * pass (chan.c: one mincore), to be mapped on the aside thread.
		 */
		if (!work && wake_time(s, &wake_at, &wake_known, now) > now + PREFAULT_CLEAR_NS)
			for (uint32_t i = 0, done = 0; i < s->nr_active && !done; i++)
				done = touch_populate(s, s->active[i]);
		/*
		 * Keep spinning while there is work, while the idle spin lasts, and
		 * when the next deadline is closer than a wake-up would be: a sleep
		 * ends tens to hundreds of microseconds late on a busy host, a spin
		 * does not. Never early all the same: the wheel fires only what is due.
		 */
		spin_ok = spin_allowed(&s->spin, now);
		want_spin = !work && !staged && spin_ns >= 0 && spin_ok &&
			    ((int64_t)(now - last_work) < idle_spin_ns ||
			     wake_time(s, &wake_at, &wake_known, now) <= now + early_ns);
		may_spin = want_spin && spin_credit_left(s, now);
		if (work || staged || spin_ns < 0 || may_spin ||
		    wake_time(s, &wake_at, &wake_known, now) <= now) {
			/*
			 * Idle: spin a few microseconds, then yield. A shard that
			 * yields stays awake for producers (no doorbell, no
			 * syscall for them) yet gives the core to any runnable
			 * client thread, which spinning outright would starve on
			 * a host with few cores. Busy-poll mode (--spin-us -1)
			 * spins outright: it is for dedicated cores.
			 */
			if (!work && !staged) {
				/*
				 * Into a deadline, only while it is more than
				 * YIELD_BEFORE_NS away: a yield there can hand the core
				 * away for a time slice, but spinning outright on both
				 * CPUs of a small host kept the client thread that takes
				 * the events from running (its lateness p99 doubled).
				 */
				bool into_deadline = wake_known && wake_at <= now + early_ns;
				bool may_yield = !into_deadline || wake_at > now + YIELD_BEFORE_NS;

				if (spin_ns >= 0 && now - last_work > IDLE_PURE_SPIN_NS && may_yield) {
					uint64_t before = now_ns();

					sched_yield();
					now = now_ns();
					spin_yielded(&s->spin, now - before, now);
					if (!spin_allowed(&s->spin, now))
						stats_spin_busy(&s->st);
				} else {
					at_relax();
				}
				now = now_ns();
				spin_charge(s, now - t0);
				continue;
			}
			now = now_ns();
			continue;
		}

		/*
		 * S-SLEEP: sleeping = non-zero, full barrier, re-check; pairs with S2
		 * in chime_sq_publish(). The value numbers this sleep, so a producer
		 * may ring once per sleep rather than once per record while we are
		 * runnable but not yet running (a loaded machine).
		 */
		if (idle_spin_ns / 2 >= (int64_t)IDLE_PURE_SPIN_NS)
			idle_spin_ns /= 2;      /* this spin did not pay */
		s->sleep_no = s->sleep_no + 1 ? s->sleep_no + 1 : 1;  /* never 0: 0 is "awake" */
		/*
		 * N1: when this sleep ends, before its number; pairs with N2 in
		 * cl_doorbell_by(). A producer that sees the number sees this
		 * wake_at or a later sleep's, and records it publishes that are
		 * due no earlier wait for it: we drain before we fire. Rounded
		 * up (records due just after it ring, which is never wrong): the
		 * public segment is every client's, and the exact earliest
		 * deadline would be another user's timer, to the nanosecond.
		 */
		at_store(s->wake_ns, wake_at | (WAKE_GRAIN_NS - 1));
		/*
		 * W1: whether a step must wake us, before the fence and the
		 * re-check of wall_published(); pairs with W0 in wall_check().
		 * Either the control thread sees 1 and rings, or we see its step.
		 */
		if (s->wall_any != (sc->wall_nodes != 0))
			at_store(&s->wall_any, sc->wall_nodes != 0);
		at_store_rel(s->sleeping, s->sleep_no);
		at_fence();
		if (!anything_pending(s, wake_at)) {
			stats_sleep(&s->st, want_spin);
			/*
			 * Not before a sleep shorter than PUBLISH_NS (timers a few
			 * tens of us apart, past the spin share): the counters are
			 * then at most that much older, and its CPU-time syscall
			 * cost 7% of the broker's CPU there.
			 */
			if (wake_at - now > PUBLISH_NS || now - last_pub >= PUBLISH_NS) {
				publish(s);
				last_pub = now;
			}
			/* Out of spinning, or not spinning at all (a busy host): wake at the deadline itself. */
			timed_out = sleep_once(s, wake_at, want_spin || !spin_ok ? 0 : early_ns, early_max);
		}
		at_store(s->sleeping, 0);
		/*
		 * S-WAKE: awake, full barrier, then drain; pairs with S2. A producer
		 * that still saw our sleep number (and skipped ringing) published
		 * before this, so the drain below sees its record.
		 */
		at_fence();
		now = now_ns();
		if (!timed_out)
			last_work = now;        /* spin again after a doorbell: more work tends to follow */
		wake_known = false;
	}
}

static void *shard_main(void *arg)
{
	struct shard *s = arg;
	struct io_uring_params p = { 0 };
	int r;

	/* Timer slack would add up to 50 us to every timed sleep: we want our deadline. */
	(void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	/*
	 * One read per client doorbell can be outstanding, so size the
	 * completion queue for all of them (kernels with NODROP would keep an
	 * overflow anyway, at a cost).
	 */
	p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
		  IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
	p.cq_entries = s->cfg.max_clients + RING_SQ_ENTRIES;
	r = io_uring_queue_init_params(RING_SQ_ENTRIES, &s->ring, &p);
	if (r == -EINVAL) {
		memset(&p, 0, sizeof(p));
		p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
		p.cq_entries = s->cfg.max_clients + RING_SQ_ENTRIES;
		r = io_uring_queue_init_params(RING_SQ_ENTRIES, &s->ring, &p);
	}
	s->start_err = r;
	sem_post(&s->ready);
	if (r < 0)
		return NULL;
	loop(s);
	reserve_settle(s);
	io_uring_queue_exit(&s->ring);
	return NULL;
}

int shard_start(struct shard *s, int cpu)
{
	char name[16];
	cpu_set_t set;
	int r;

	snprintf(name, sizeof(name), "chimed-aside%u", s->cfg.idx);
	r = aside_start(&s->aside, name, s->doorbell, 1);
	if (r < 0)
		log_errno(LOG_WARNING, r, "no aside thread for shard %u: its slab grows on its own thread",
			  s->cfg.idx);
	r = pthread_create(&s->thr, NULL, shard_main, s);
	if (r)
		return log_errno(LOG_ERR, r, "pthread_create for shard %u", s->cfg.idx);
	s->started = 1;
	if (cpu >= 0) {
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		r = pthread_setaffinity_np(s->thr, sizeof(set), &set);
		if (r)
			log_errno(LOG_WARNING, r, "pinning shard %u to CPU %d failed, ignoring",
				  s->cfg.idx, cpu);
	}
	snprintf(name, sizeof(name), "chimed-shard%u", s->cfg.idx);   /* for ps, top, perf and gdb */
	(void)pthread_setname_np(s->thr, name);
	while (sem_wait(&s->ready) < 0 && errno == EINTR)
		;
	if (s->start_err < 0)
		return log_errno_hint(LOG_ERR, s->start_err, URING_HINT(s->start_err),
				      "io_uring setup for shard %u (%u entries)", s->cfg.idx, RING_SQ_ENTRIES);
	return 0;
}

/*
 * Without this, a file removed meanwhile (rm, systemd-tmpfiles) was closed
 * with its timers, and the next broker started empty without a word.
 */
bool keep_file(int fd, const char *path, const char *lost, const struct chime_seg_range *keep, unsigned n)
{
	int r = chime_seg_relink(fd, path, keep, n);

	if (r == 1)
		log_msg(LOG_WARNING, "'%s' had been removed while the broker ran: written again for the next "
			"broker", path);
	else if (r == -EEXIST)
		log_msg(LOG_ERR, "'%s' had been removed while the broker ran and another file is there now: not "
			"writing over it (%s)", path, lost);
	else if (r < 0)
		log_errno_hint(LOG_ERR, r, lost, "cannot write '%s' again (removed while the broker ran)", path);
	return r >= 0;
}

/* Join thr if it ends by `until` (CLOCK_MONOTONIC). */
static bool join_by(pthread_t thr, const struct timespec *until)
{
	for (;;) {
		struct timespec now;

		if (pthread_tryjoin_np(thr, NULL) == 0)
			return true;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec > until->tv_sec || (now.tv_sec == until->tv_sec && now.tv_nsec >= until->tv_nsec))
			return false;
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
}

int shard_fini(struct shard *s, bool keep)
{
	struct chime_seg_range used[2];
	const struct chime_seg_range *copy = NULL;      /* NULL: the whole file */
	int lost = 0;

	if (s->started) {
		struct timespec until;

		if (s->start_err == 0) {
			struct shard_cmd stop = { .op = SHARD_CMD_STOP };

			shard_post(s, &stop);
		}
		/*
		 * A shard stuck in a bug must not turn SIGTERM into a hang: give it
		 * a bounded time, then leave its memory alone (it may still touch
		 * it) and let the caller exit.
		 */
		/*
		 * Polled on CLOCK_MONOTONIC: a step of the wall clock must not
		 * stretch it (pthread_timedjoin_np's deadline is CLOCK_REALTIME),
		 * and TSan knows tryjoin (not pthread_clockjoin_np: a join it
		 * does not see leaves every later free a "race").
		 */
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += SHARD_STOP_TIMEOUT_S;
		if (!join_by(s->thr, &until)) {
			log_msg(LOG_ERR, "shard %u did not stop within %d s; exiting without it",
				s->cfg.idx, SHARD_STOP_TIMEOUT_S);
			if (!keep)
				(void)chime_seg_unlink_named(s->seg_fd, s->path);
			return -ETIMEDOUT;
		}
		s->started = 0;
		sem_destroy(&s->ready);
	}
	(void)aside_stop(s->aside, UINT64_MAX);        /* reserve_settle() ran its jobs: none left */
	s->aside = NULL;
	stats_fini(&s->st);
	free(s->core.by_slot);
	free(s->core.users);
	free(s->core.user_of_slot);
	wheel_fini(&s->core.wh);
	keyidx_walks_fini(&s->core.ki);
	chan_wall_fini(&s->core);
	free(s->active);
	free(s->dying);
	free(s->q);
	s->core.by_slot = NULL;
	s->core.users = NULL;
	s->active = NULL;
	s->dying = NULL;
	s->q = NULL;
	if (s->doorbell >= 0)
		close(s->doorbell);
	s->doorbell = -1;
	if (s->seg.base) {
		/*
		 * What the next broker reads: the header, and the wheel up to the
		 * slab's high-water mark. Not the key index (rebuilt), nor the
		 * reserve beyond the mark: a copy of a removed file needs room
		 * while the old one still holds its own, and a tmpfs counts
		 * reserved pages as data (5 MiB copied for 150 KiB of timers).
		 */
		const struct chime_shard_seg *hdr = s->seg.base;
		const struct chime_wheel *w = chime_at(&s->seg, s->slab_off - sizeof(struct chime_wheel));
		uint64_t hw = w->high_water <= s->cfg.capacity ? w->high_water : s->cfg.capacity;

		used[0] = (struct chime_seg_range){ 0, hdr->key_off };
		used[1] = (struct chime_seg_range){ hdr->wheel_off,
						    s->slab_off + hw * sizeof(struct chime_node) - hdr->wheel_off };
		copy = used;
	}
	chime_seg_unmap(&s->seg);
	if (s->seg_fd >= 0) {
		/* The thread is gone: nothing writes the slab while it is copied. */
		lost = keep && !keep_file(s->seg_fd, s->path, "the next broker will not have this shard's timers",
					  copy, 2);
		if (!keep)
			(void)chime_seg_unlink_named(s->seg_fd, s->path);
		close(s->seg_fd);
	}
	s->seg_fd = -1;
	return lost;
}
