/* SPDX-License-Identifier: MIT */
/*
 * timer.c - chime_arm/reset/cancel/cancel_key: the submission fast path.
 *
 * Each call is one record in one shard's submission ring: reserve a slot
 * (a CAS on sq_tail), fill it, publish it (an atomic exchange: a full
 * barrier), then load the shard's sleep number and write its doorbell
 * only if it sleeps, once per sleep. No system call while the shard is
 * awake; no lock; any number of threads.
 *
 * - ARM takes its id from the slot's grant (a node the broker set aside for
 *   whoever writes this slot), so the id is known before the broker has
 *   seen anything. The shard is the calling thread's home shard (below), so
 *   that threads arming and resetting their own timers write different
 *   rings instead of contending for one ring's tail.
 * - RESET and CANCEL go to the shard named in the id; CANCEL_KEY to every
 *   shard (a key's timers are spread over all of them).
 * - A full ring is waited out (spin, then yield, then short sleeps), never
 *   dropped; the wait gives up with -ENOTCONN if the broker dies meanwhile
 *   (a named session's: once reconnecting has failed, reconnect.c).
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "clock.h"       /* splitmix64() */

#define likely(x)   __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/*
 * This thread's home shard + 1 (0 before its first ARM). A thread arms on
 * its home shard until that shard refuses an arm (no free node, or the
 * client's share of its quota used): it then moves home to the shard that
 * took the arm; or until the shard falls behind (arm_backlog()). Sticky,
 * as the kernel keeps a timer on the CPU that armed
 * it: a timer's RESET and CANCEL go to the timer's shard, so threads that
 * arm and reset their own timers (an event loop per thread) each write
 * their own ring. Round-robin per call made every thread write every ring,
 * and two threads on one chime_t paid 2.5-3.5 times one thread's cost per
 * call in the CAS on the shared ring tail (ARCHITECTURE.md, "Which shard an
 * ARM goes to"). Homes are spread: each thread starts one shard after the
 * thread that armed before it, counted from the connection's client-table
 * slot, so that single-threaded clients, and threads that arm a timer each
 * (a thread per request), do not all land on shard 0.
 */
static __thread uint32_t tl_home __attribute__((tls_model("initial-exec")));  /* no __tls_get_addr() call */
/* This thread's single ARMs, counted for touch_ahead()'s look (every TOUCH_LOOK_EVERY-th). */
static __thread uint32_t tl_arms __attribute__((tls_model("initial-exec")));
static uint32_t threads_arming;            /* atomic: threads that have armed, for their start */

/*
 * The ring is full: the shard is behind (or asleep, or dead). Wait for room:
 * spin first, then yield, then sleep in short steps; ring the doorbell in
 * case the shard sleeps, and check at most once a millisecond that the
 * broker is still there. A running shard frees a slot every 20-100 ns, so a
 * spin that sees none for a few microseconds means the shard is not
 * running, most likely waiting for this very CPU (a host with fewer cores
 * than shards plus clients): spinning on is what keeps it out. With 50 us
 * of spin, one thread arming through 2 shards on this 2-core VM waited
 * 2-3 times longer (e2e means: arm 100-132 -> 54-84 ns, cancel 62-113 ->
 * 30-52 at 100k-1M; ARCHITECTURE.md).
 */
#define ROOM_SPIN_NS  2000u       /* pure spinning before the first syscall */
#define ROOM_YIELD_NS 1000000u    /* sched_yield until then, then 50 us naps */

static __attribute__((noinline)) struct chime_sqe *
wait_room(struct chime *c, struct chime_chan *ch, uint64_t *pos)
{
	uint64_t start = chime_now(), probed = start;
	struct chime_sqe *sqe;

	for (unsigned i = 1;; i++) {
		uint64_t now, waited;

		at_relax();
		sqe = chime_sq_reserve(&ch->sq, pos);
		if (sqe)
			return sqe;
		if (cl_is_dead(c))
			return NULL;
		if (unlikely(cl_reconnecting(c))) {
			/*
			 * A session's broker is gone and its rings closed: reconnect,
			 * or wait for whoever does. From a dispatch callback too (the
			 * drain let the lock go for it): the drain it is in then stops.
			 */
			if (cl_reconnect(c, false))
				nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
			continue;
		}
		if (i % 64)
			continue;
		now = chime_now();      /* vDSO: no syscall */
		waited = now - start;
		if (waited < ROOM_SPIN_NS)
			continue;
		/* S2 again: full barrier before the sleep-number load, as after a publish. */
		at_fence();
		cl_ring_doorbell(ch);
		if (now - probed >= ROOM_YIELD_NS) {
			probed = now;
			if (cl_broker_gone(c, true) && cl_is_dead(c))
				return NULL;
		}
		if (waited < ROOM_YIELD_NS)
			sched_yield();
		else
			nanosleep(&(struct timespec){ .tv_nsec = 50000 }, NULL);
	}
}

/*
 * Fill a reserved slot with one record. An ARM takes the slot's grant as
 * its id; a slot that carries a no-grant marker instead gets a NOP (the
 * ring keeps moving) and the refusal is returned: -ENOMEM or -EDQUOT.
 * *tagged: the broker wrote the grant's tag in the touch table (ARM only).
 */
static inline bool is_arm(uint32_t op)
{
	return op == CHIME_OP_ARM || op == CHIME_OP_ARM_REALTIME;
}

static inline int fill(struct chime_sqe *sqe, uint32_t shard, uint32_t op, uint64_t *id, uint64_t key,
		       uint64_t deadline_ns, uint64_t period_ns, uint64_t user_data, bool *tagged)
{
	int refused = 0;

	if (is_arm(op)) {
		/*
		 * The grant was stored before the slot's seq freed it for this
		 * position (broker: release); the reserve acquire-loaded that
		 * seq, so the grant is the one meant for us. Its flags: the
		 * same, or (a marker replaced in place) acquire-loaded after
		 * the broker's tag.
		 */
		*id = at_load(&sqe->grant);
		*tagged = at_load_acq(&sqe->grant_flags) & CHIME_GRANT_F_TAGGED;
		if (unlikely(chime_grant_is_marker(*id) || chime_id_shard(*id) != shard)) {
			refused = *id == CHIME_GRANT_QUOTA ? -EDQUOT : -ENOMEM;
			op = CHIME_OP_NOP;
		}
	}
	/*
	 * Relaxed atomic stores (plain moves on x86): the drainer may peek at
	 * this slot meanwhile (chime_sq_peek: a seqlock read that discards a
	 * torn copy), and a plain store racing with it is undefined in C11.
	 */
	at_store(&sqe->id, *id);
	at_store(&sqe->key, key);
	at_store(&sqe->deadline_ns, deadline_ns);
	at_store(&sqe->period_ns, period_ns);
	at_store(&sqe->user_data, user_data);
	at_store(&sqe->op, op);
	return refused;
}

/*
 * When the shard must have applied a record (CLOCK_MONOTONIC, as the
 * shard's wake_ns): an arm or reset by its deadline; a cancel whenever
 * (the shard drains before it fires, and the drainer drops an event the
 * cancel beat); RESUMED at once (reconnect.c waits for it). A wall-clock
 * deadline is moved by the broker's published offset; a reset's clock is
 * the timer's, which only the broker knows: a deadline at or past the
 * offset (the wall-clock time of boot; as a monotonic deadline, 56 years
 * of uptime or more) is taken as a wall-clock one, which errs only towards
 * ringing (ARCHITECTURE.md, "Wall-clock timers"). One from half the offset
 * on (28 years of uptime) may be a wall-clock time before the boot,
 * already past: taken as due now, or it waited for the heartbeat.
 */
static inline uint64_t need_by(const struct chime *c, uint32_t op, uint64_t deadline_ns)
{
	uint64_t off;

	switch (op) {
	case CHIME_OP_ARM:
		return deadline_ns;
	case CHIME_OP_ARM_REALTIME:
		off = (uint64_t)at_load(&c->pub->wall_off);
		return deadline_ns > off ? deadline_ns - off : 0;
	case CHIME_OP_RESET:
	case CHIME_OP_RESET_TOUCH:
		off = (uint64_t)at_load(&c->pub->wall_off);
		if (!off || deadline_ns < off / 2)
			return deadline_ns;
		return deadline_ns >= off ? deadline_ns - off : 0;
	case CHIME_OP_RESUMED:
		return 0;
	default:
		return UINT64_MAX;
	}
}

/*
 * After this thread published ARMs at [from, from + n) on its home shard s:
 * if 15/16 of that ring still wait for the shard (checked once per 64
 * positions, one load of a slot the shard has written), the shard is
 * behind this thread, and its next arms go to the next shard instead of
 * waiting for room. One thread arming faster than a shard applies so
 * spreads its arms over the shards in runs of most of a ring, which the
 * shards apply side by side (each run while the thread writes the next);
 * threads arming at a pace their home keeps up with never move, nor do
 * bursts into the ring of a shard still waking up (two threads bursting in
 * step would otherwise end up writing one ring).
 */
static inline void arm_backlog(struct chime *c, uint32_t s, uint64_t from, uint32_t n)
{
	const struct chime_sq_prod *sq = &c->chan[s].sq;
	uint64_t size = (uint64_t)sq->mask + 1, behind, end = from + n;
	uint64_t every = size >= 256 ? 64 : size >= 4 ? size / 4 : 1;     /* a power of two */

	/* no multiple of `every` in [from, end) (first: 63 calls of 64 end here), */
	if (((from + every - 1) & ~(every - 1)) >= end)
		return;
	/* or not that many positions yet */
	behind = size - size / 16;
	if (c->nr_shards == 1 || end <= behind)
		return;
	/* An asleep shard is not behind: the doorbell (at half a ring) is waking it. */
	if (chime_sq_waiting(sq, end - behind) && at_load(c->chan[s].sleeping) == 0)
		tl_home = s + 1 < c->nr_shards ? s + 2 : 1;
}

static inline bool id_ok(const struct chime *c, chime_id_t id)
{
	return id != 0 && chime_id_gen(id) != 0 && chime_id_shard(id) < c->nr_shards;
}

/* ---- touch table (chime_shm.h, CHIME_TOUCH_BYTES) ---- */

/* The id's entry: its word at c->touch[e] and its tag at c->touch_tag[e]; false: none. */
static inline bool touch_entry(const struct chime *c, chime_id_t id, uint64_t *e)
{
	uint32_t idx = chime_id_index(id);

	*e = (uint64_t)chime_id_shard(id) * c->touch_cap + idx;
	return idx < c->touch_cap;
}

/*
 * The table's pages are the client's to allocate: the broker only writes
 * into pages already resident (broker/chan.c, chan_touch_check()), so
 * that, the table sealed before it is attached (cl_take_offer()), nothing
 * of the broker's waits on it or is charged for it. A channel that has carried TOUCH_POPULATE_FROM
 * records allocates its tags a 64 KiB window at a time, in one call, half
 * a window before its arms reach it (and its words, the window of a first
 * reset there): one call, not a page fault per page on an arm (1.6-1.8 us
 * a page populated here, 1.9-2.1 faulted), and a window of tags resident
 * ahead is where the shard writes the next grants' tags itself
 * (CHIME_GRANT_F_TAGGED), which takes the tag's store off the arm. A
 * channel with fewer records writes its tags a page fault at a time (a
 * client with a few timers holds no 64 KiB it does not use).
 */
#define TOUCH_POPULATE_FROM 4096u
#define TOUCH_AHEAD         (uint32_t)(TOUCH_WINDOW / 2 / sizeof(uint32_t))     /* tags */
/*
 * A thread's single ARMs look ahead once per this many (a batch once per
 * run): half a window is 8192 tags, far more than the grants 16 arms
 * take, and the look was a tenth of an arm's instructions (callgrind).
 */
#define TOUCH_LOOK_EVERY    16u

static inline bool touch_window_done(const struct chime *c, const void *p, uint64_t *bit)
{
	*bit = (uintptr_t)p / TOUCH_WINDOW - (uintptr_t)c->touch_map.base / TOUCH_WINDOW;
	return at_load(&c->touch_mapped[*bit / 64]) >> (*bit % 64) & 1;
}

/* Allocate p's window, within [lo, hi) (this shard's tags, or words), and say so in its bit. */
static __attribute__((noinline, cold)) void touch_populate(struct chime *c, const void *p, uint64_t bit,
							 uintptr_t lo, uintptr_t hi)
{
	uintptr_t from = (uintptr_t)p & ~(uintptr_t)(TOUCH_WINDOW - 1), to = from + TOUCH_WINDOW;

	from = from < lo ? lo : from;
	to = to > hi ? hi : to;
	if (to > from)
		(void)chime_seg_populate((void *)from, to - from);
	(void)at_fetch_or(&c->touch_mapped[bit / 64], UINT64_C(1) << (bit % 64));
}

/*
 * An ARM's id, before it is returned: its tag names this generation, so
 * that a reset of an earlier timer of that node (a stale id) writes its
 * word no more (touch_reset()). Not if the shard wrote it (tagged:
 * CHIME_GRANT_F_TAGGED).
 */
static inline void touch_tag_armed(struct chime *c, chime_id_t id, bool tagged)
{
	uint64_t e;

	if (!tagged && touch_entry(c, id, &e))
		at_store(&c->touch_tag[e], chime_id_gen(id));
}

/*
 * After ARMs up to id (pos: its record's position in the ring): the tags'
 * window half a window ahead of it (within its shard's tags) resident
 * before the grants reach it. For speed only (the shard tags a grant in a
 * resident page, else the arm does, touch_tag_armed()): a batch looks
 * once, for the last ARM of each run (callgrind: 23 of 138 instructions
 * an ARM in chime_submit(), when each looked).
 */
static inline void touch_ahead(struct chime *c, chime_id_t id, uint64_t pos)
{
	const uint32_t *ahead;
	uint64_t e, bit;
	uint32_t idx;

	if (!touch_entry(c, id, &e))
		return;
	idx = chime_id_index(id);
	ahead = &c->touch_tag[e - idx + (c->touch_cap - idx > TOUCH_AHEAD ? idx + TOUCH_AHEAD : c->touch_cap - 1)];
	if (__builtin_expect(!touch_window_done(c, ahead, &bit), 0) && pos >= TOUCH_POPULATE_FROM) {
		const uint32_t *lo = &c->touch_tag[e - idx];

		touch_populate(c, ahead, bit, (uintptr_t)lo, (uintptr_t)(lo + c->touch_cap));
	}
}

/*
 * A reset with a table. True: done by the word alone (the shard flagged
 * the timer, the word is not FIRED and deadline_ns is no earlier than
 * it). False: the caller publishes a RESET_TOUCH for deadline_ns, which
 * is now in the word too (cut to CHIME_TOUCH_MAX_NS: its top bit is
 * FIRED; the record is not, a wall-clock timer's deadline is the
 * record's and 2^63 - 1 ns of CLOCK_REALTIME is 2262), unless the tag
 * names another generation (the id is stale: the shard ignores the
 * record, and the word is another timer's). Every CAS that fails
 * re-reads the tag: the node may have been reused meanwhile. Inline in
 * both callers: out of line (GCC's choice), a first reset cost 21 more
 * instructions and a touch 17 (callgrind).
 */
static inline __attribute__((always_inline)) bool touch_reset(struct chime *c, chime_id_t id, uint64_t deadline_ns)
{
	uint32_t gen = chime_id_gen(id), *tagp;
	uint64_t d = deadline_ns, *word, e, bit, tbit;

	if (unlikely(d > CHIME_TOUCH_MAX_NS))
		d = CHIME_TOUCH_MAX_NS;
	if (unlikely(!touch_entry(c, id, &e)))
		return false;
	word = &c->touch[e];
	tagp = &c->touch_tag[e];
	for (;;) {
		/* acquire: pairs with the shard's release of ON, after its read of the word */
		uint32_t tag = at_load_acq(tagp);
		uint64_t w = at_load_acq(word);

		/*
		 * The tag again, after the word: still ours, so w was read
		 * before a new timer on the node could write its tag, and so
		 * before it wrote the word. A stale id's CAS then succeeds on
		 * the new timer's word only if that word equals w (the ABA
		 * chime_reset(3) names). Without it, a thread stalled between
		 * the two loads could read the new timer's word and CAS it.
		 */
		if ((tag & CHIME_ID_GEN_MASK) != gen)
			return false;
		if (at_load(tagp) != tag)
			continue;       /* flagged or unflagged meanwhile, or the node reused: look again */
		if (tag == (gen | CHIME_TOUCH_ON) && !(w & CHIME_TOUCH_FIRED) && d >= w) {
			if (at_cas(word, &w, d))
				return true;
			continue;
		}
		/* a first reset: its window of words allocated at once, on a channel that populates its tags */
		if (__builtin_expect(!touch_window_done(c, word, &bit), 0) && touch_window_done(c, tagp, &tbit)) {
			const uint64_t *lo = &c->touch[e - chime_id_index(id)];

			touch_populate(c, word, bit, (uintptr_t)lo, (uintptr_t)(lo + c->touch_cap));
		}
		if (at_cas(word, &w, d))
			return false;
	}
}

/*
 * A record was published, and then the broker's public segment said it is
 * stopping (CHIME_BROKER_STOPPING, stored with a full barrier before it
 * parks any session; our publication was one too, so had the park missed
 * the record, we see the state). The park may have read the ring before
 * the record was in it: then only this process holds it, until a reconnect
 * hands the old ring's unread records to the next broker (reconnect.c),
 * and a process that died first lost records whose calls had returned (a
 * reliability audit: up to a ring of arms, resets and cancels). A
 * session's call waits for that, as on a full ring: until the segment at
 * c->pub (remapped onto the same address by a reconnect) is a running
 * broker's again, or reconnecting failed (-ENOTCONN). An anonymous
 * connection's records end with its broker anyway: 0.
 */
static __attribute__((noinline)) int stop_wait(struct chime *c)
{
	if (!c->session[0])
		return 0;
	for (;;) {
		if (cl_is_dead(c))
			return cl_dead_errno(c);
		if (!cl_reconnecting(c) && at_load_acq(&c->pub->state) == CHIME_BROKER_RUNNING)
			return 0;
		if (cl_reconnecting(c)) {
			/* A dispatch callback runs with the lock let go (poll.c, run_callback()): it may take it. */
			if (!cl_reconnect(c, false))
				continue;
		} else {
			(void)cl_broker_gone(c, true);  /* it hangs up once its sessions are parked */
		}
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
}

/*
 * After a publication (a full barrier): is the broker stopping (S-STOP in
 * broker/control.c), or has this process found it gone (a crash: its state
 * still says running)? Either way the record may be in rings no broker
 * reads, and the call waits for the reconnect that hands them over
 * (stop_wait()). Without the second look a session's calls after a crash
 * returned 0 at once into the dead broker's rings, and a process that died
 * before anything drained lost them (an API audit).
 */
static inline bool broker_stopping(const struct chime *c)
{
	return __builtin_expect(at_load_sc(&c->pub->state) != CHIME_BROKER_RUNNING || cl_reconnecting(c), 0);
}

static inline __attribute__((always_inline)) int submit(struct chime *c, uint32_t shard, uint32_t op, uint64_t id, uint64_t key,
			 uint64_t deadline_ns, uint64_t period_ns, uint64_t user_data, chime_id_t *out)
{
	struct chime_chan *ch = &c->chan[shard];
	struct chime_sqe *sqe;
	bool tagged = false;
	uint64_t pos;
	int refused;

	if (unlikely(cl_gone_for_ops(c)))
		return cl_dead_errno(c);
	sqe = chime_sq_reserve(&ch->sq, &pos);
	if (unlikely(!sqe)) {
		sqe = wait_room(c, ch, &pos);
		if (!sqe)
			return cl_dead_errno(c);
	}
	refused = fill(sqe, shard, op, &id, key, deadline_ns, period_ns, user_data, &tagged);
	if (c->touch && is_arm(op) && !refused) {
		if ((++tl_arms & (TOUCH_LOOK_EVERY - 1)) == 0)
			touch_ahead(c, id, pos);
		touch_tag_armed(c, id, tagged);
	}
	/* S1: the record, then seq (full barrier); pairs with the shard's acquire of seq. */
	chime_sq_publish(sqe, pos);
	cl_doorbell_by(ch, need_by(c, op, deadline_ns), pos, 1);
	if (is_arm(op))
		arm_backlog(c, shard, pos, 1);
	else
		cl_note_void(c);
	if (unlikely(refused))
		return refused;
	if (broker_stopping(c)) {
		int r = stop_wait(c);

		if (r < 0)
			return r;
	}
	if (out)
		*out = id;
	return 0;
}

int cl_submit_op(struct chime *c, uint32_t s, uint32_t op)
{
	return submit(c, s, op, 0, 0, 0, 0, 0, NULL);
}

/*
 * Shard `s` refused an ARM or ARM_REALTIME (op; r: -ENOMEM or -EDQUOT): any
 * other one may have room or quota left. Returns 0 (armed, *id set),
 * -ENOMEM, -EDQUOT (only if every shard said quota) or -ENOTCONN.
 */
static int arm_elsewhere(struct chime *c, uint32_t op, uint32_t s, int r, uint64_t key, uint64_t deadline_ns,
			 uint64_t period_ns, uint64_t user_data, chime_id_t *id)
{
	for (uint32_t k = 1; k < c->nr_shards; k++) {
		int r2;

		if (++s == c->nr_shards)
			s = 0;
		r2 = submit(c, s, op, 0, key, deadline_ns, period_ns, user_data, id);
		if (r2 == 0)
			tl_home = s + 1;        /* this thread's arms go here from now on */
		if (r2 != -ENOMEM && r2 != -EDQUOT)
			return r2;
		if (r2 == -ENOMEM)
			r = -ENOMEM;
	}
	return r;
}

/* The shard for this thread's next ARM (or batch of them): its home. */
static inline uint32_t home_shard(const struct chime *c)
{
	uint32_t s = tl_home - 1;

	/* 0 - 1: no home yet; beyond the shards: a home on a broker with more (another chime_t) */
	if (unlikely(s >= c->nr_shards)) {
		if (s == UINT32_MAX)
			/* the first thread: the slot's shard (atomic: a session's reconnect moves it) */
			s = at_add(&threads_arming, 1) - 1 + at_load(&c->slot);
		s %= c->nr_shards;
		tl_home = s + 1;        /* stored reduced: no division on the next call */
	}
	return s;
}

/* An ARM or ARM_REALTIME (op) on this thread's home shard, else on any other with room. */
static inline __attribute__((always_inline)) int arm(chime_t *c, uint32_t op, uint64_t key, uint64_t deadline_ns,
						     uint64_t period_ns, uint64_t user_data, chime_id_t *id)
{
	uint32_t s = home_shard(c);
	int r = submit(c, s, op, 0, key, deadline_ns, period_ns, user_data, id);

	if (likely(r != -ENOMEM && r != -EDQUOT))
		return r;
	return arm_elsewhere(c, op, s, r, key, deadline_ns, period_ns, user_data, id);
}

CHIME_PUBLIC int chime_arm(chime_t *c, uint64_t key, uint64_t deadline_ns, uint64_t period_ns,
			   uint64_t user_data, chime_id_t *id)
{
	if (unlikely(!c || !id))
		return -EINVAL;
	return arm(c, CHIME_OP_ARM, key, deadline_ns, period_ns, user_data, id);
}

CHIME_PUBLIC int chime_arm_realtime(chime_t *c, uint64_t key, uint64_t deadline_ns, uint64_t period_ns,
				    uint64_t user_data, chime_id_t *id)
{
	if (unlikely(!c || !id))
		return -EINVAL;
	if (unlikely(!at_load(&c->realtime)))
		return cl_gone_for_ops(c) ? cl_dead_errno(c) : -EOPNOTSUPP;
	return arm(c, CHIME_OP_ARM_REALTIME, key, deadline_ns, period_ns, user_data, id);
}

CHIME_PUBLIC int chime_reset(chime_t *c, chime_id_t id, uint64_t deadline_ns)
{
	if (unlikely(!c || !id_ok(c, id)))
		return -EINVAL;
	if (c->touch) {
		if (unlikely(cl_gone_for_ops(c)))
			return cl_dead_errno(c);
		if (touch_reset(c, id, deadline_ns))
			return 0;
		return submit(c, chime_id_shard(id), CHIME_OP_RESET_TOUCH, id, 0, deadline_ns, 0, 0, NULL);
	}
	return submit(c, chime_id_shard(id), CHIME_OP_RESET, id, 0, deadline_ns, 0, 0, NULL);
}

CHIME_PUBLIC int chime_cancel(chime_t *c, chime_id_t id)
{
	if (unlikely(!c || !id_ok(c, id)))
		return -EINVAL;
	return submit(c, chime_id_shard(id), CHIME_OP_CANCEL, id, 0, 0, 0, 0, NULL);
}

CHIME_PUBLIC int chime_cancel_key(chime_t *c, uint64_t key)
{
	if (unlikely(!c))
		return -EINVAL;
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		int r = submit(c, s, CHIME_OP_CANCEL_KEY, 0, key, 0, 0, 0, NULL);

		if (r < 0)
			return r;
	}
	return 0;
}

CHIME_PUBLIC int chime_flush(chime_t *c)
{
	if (unlikely(!c))
		return -EINVAL;
	/*
	 * Unlike an operation, a flush reads the clock: a broker killed
	 * without a word (its heartbeat stale for a second) is found here,
	 * by a probe of the socket at most once a second, not only by a drain.
	 */
	if (unlikely(cl_gone_for_ops(c) || cl_broker_check(c, chime_now()))) {
		/*
		 * Dead, or a child's copy (dead too): no attempt. A child's was its
		 * parent's, made through the descriptors they share (an API audit).
		 */
		if (cl_is_dead(c))
			return cl_dead_errno(c);
		/*
		 * A session reconnecting: the flush makes the attempts that are
		 * due, as a drain or an arm waiting for room does. Without them a
		 * process that only flushed neither reconnected nor ever gave up:
		 * 0 for good (an adopter audit).
		 */
		(void)cl_reconnect(c, false);
		if (cl_is_dead(c))
			return cl_dead_errno(c);
	}
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		struct chime_chan *ch = &c->chan[s];

		/*
		 * The newest position reserved: if the shard has not freed it,
		 * something is waiting for it. The caller's earlier publishes
		 * ended in full barriers (S2), so they are visible before the
		 * load of `sleeping` in cl_ring_doorbell().
		 */
		if (chime_sq_waiting(&ch->sq, at_load(ch->sq.tail) - 1))
			cl_ring_doorbell(ch);
	}
	return 0;
}

/* ---- chime_submit: batches ---- */

_Static_assert(CHIME_ARM == CHIME_OP_ARM && CHIME_RESET == CHIME_OP_RESET && CHIME_CANCEL == CHIME_OP_CANCEL &&
	       CHIME_CANCEL_KEY == CHIME_OP_CANCEL_KEY, "public op codes are the wire's");

/* The wire's op for a public one: the same, but CHIME_ARM_REALTIME (5 is the wire's CHIME_OP_RESUMED). */
static inline uint32_t wire_op(uint32_t op)
{
	return op == CHIME_ARM_REALTIME ? CHIME_OP_ARM_REALTIME : op;
}

static inline bool is_public_arm(uint32_t op)
{
	return op == CHIME_ARM || op == CHIME_ARM_REALTIME;
}

#define TO_ALL   CHIME_MAX_SHARDS      /* a CANCEL_KEY: every shard */
#define TO_NONE  (CHIME_MAX_SHARDS + 1) /* invalid: nowhere */
/*
 * ops[i].result while not yet submitted everywhere: PENDING + where it goes
 * (a shard, or TO_ALL), so that each operation is classified once.
 */
#define PENDING  1

/* Where an operation goes. */
static inline uint32_t op_shard(const struct chime *c, const struct chime_op *o, uint32_t arm_shard)
{
	switch (o->op) {
	case CHIME_ARM:
	case CHIME_ARM_REALTIME:
		return arm_shard;
	case CHIME_RESET:
	case CHIME_CANCEL:
		return id_ok(c, o->id) ? chime_id_shard(o->id) : TO_NONE;
	case CHIME_CANCEL_KEY:
		return TO_ALL;
	default:
		return TO_NONE;
	}
}

/* What submit_shard() did. */
struct batch_tally {
	unsigned ok;            /* operations done (0 results set) */
	unsigned refused;       /* ARMs the shard refused (-ENOMEM, -EDQUOT) */
};

/*
 * The run of ops[first, end) just published to shard s was lost with a
 * stopping broker (stop_wait() failed): the operations it counted done
 * (result 0) are not, they get err. Only the ones that went to s: the
 * range holds other shards' operations too.
 */
static void unpublish(const struct chime *c, uint32_t s, uint32_t arm_to, struct chime_op *ops, unsigned first,
		      unsigned end, int err, struct batch_tally *t)
{
	for (unsigned k = first; k < end; k++) {
		uint32_t to = op_shard(c, &ops[k], arm_to);

		if (ops[k].result == 0 && (to == s || to == TO_ALL)) {
			ops[k].result = err;
			if (is_public_arm(ops[k].op))
				ops[k].id = 0;  /* no id for a timer nobody holds, as chime_arm() */
			t->ok--;
		}
	}
}

/*
 * The `count` pending operations bound for shard s, in array order, in runs
 * of as many consecutive slots as the ring has free: one reserve, one
 * publish barrier and at most one doorbell per run. A full ring is waited
 * out one slot at a time, as chime_arm() does. `arm_to` is the shard this
 * call's ARMs go to: a backlog there moves the thread's home (arm_backlog).
 * Returns 0 or -ENOTCONN.
 */
static int submit_shard(struct chime *c, uint32_t s, uint32_t arm_to, struct chime_op *ops, uint32_t count,
			struct batch_tally *t)
{
	struct chime_chan *ch = &c->chan[s];
	const int32_t mine = (int32_t)(PENDING + s), all = (int32_t)(PENDING + TO_ALL);
	bool last_shard = s + 1 == c->nr_shards, voids = false;
	/*
	 * Read once: the records' atomic stores keep the compiler from
	 * holding anything it loads through a pointer across them, and it
	 * loaded these again for every record (callgrind).
	 */
	struct chime_sqe *const slots = ch->sq.slots;
	const uint32_t mask = ch->sq.mask;
	const bool touch = c->touch != NULL;
	unsigned i = 0, first;

	while (count) {
		uint64_t pos, by = UINT64_MAX, last_arm = 0, last_arm_pos = 0;
		uint32_t got = chime_sq_reserve_n(&ch->sq, count, &pos);

		if (unlikely(!got)) {
			if (!wait_room(c, ch, &pos))
				return cl_dead_errno(c);
			got = 1;
		}
		first = i;
		for (uint32_t k = 0; k < got; i++) {
			struct chime_op *o = &ops[i];
			struct chime_sqe *sqe;
			uint64_t id = o->id;
			bool tagged = false;

			if (o->result != mine && o->result != all)
				continue;
			sqe = &slots[(pos + k++) & mask];
			if (need_by(c, wire_op(o->op), o->deadline_ns) < by)
				by = need_by(c, wire_op(o->op), o->deadline_ns);
			if (is_public_arm(o->op)) {
				o->result = fill(sqe, s, wire_op(o->op), &id, o->key, o->deadline_ns, o->period_ns,
						 o->user_data, &tagged);
				if (likely(!o->result)) {
					o->id = id;
					if (touch) {
						touch_tag_armed(c, id, tagged);
						last_arm = id;
						last_arm_pos = pos + k - 1;
					}
					t->ok++;
				} else {
					t->refused++;
				}
			} else if (o->op == CHIME_RESET && touch) {
				/* its word written by chime_submit() */
				(void)fill(sqe, s, CHIME_OP_RESET_TOUCH, &id, 0, o->deadline_ns, 0, 0, &tagged);
				voids = true;
				o->result = 0;
				t->ok++;
			} else {
				(void)fill(sqe, s, o->op, &id, o->key, o->deadline_ns, 0, 0, &tagged);
				voids = true;
				if (o->result == mine || last_shard) {
					o->result = 0;
					t->ok++;
				}
			}
		}
		if (last_arm)
			touch_ahead(c, last_arm, last_arm_pos);
		/* S1 for each record, S2 once after the last; pairs with C1 and the shard's sleep barrier. */
		chime_sq_publish_n(&ch->sq, pos, got);
		cl_doorbell_by(ch, by, pos, got);
		if (s == arm_to)
			arm_backlog(c, s, pos, got);
		if (voids)
			cl_note_void(c);
		count -= got;
		if (broker_stopping(c)) {
			int r = stop_wait(c);

			if (r < 0) {
				unpublish(c, s, arm_to, ops, first, i, r, t);
				return r;
			}
		}
	}
	return 0;
}

/*
 * A call of ARMs only (the timers of a burst of new connections), all to
 * shard s: submit_shard()'s work without what a mixed call needs (each
 * operation classified first, then picked out of the array again for its
 * shard). Results as there: 0 with the id, or the shard's refusal for the
 * retry in chime_submit(); those never sent get the dead broker's errno.
 */
static int submit_arms(struct chime *c, uint32_t s, struct chime_op *ops, uint32_t n, struct batch_tally *t)
{
	struct chime_chan *ch = &c->chan[s];
	struct chime_sqe *const slots = ch->sq.slots;
	const uint32_t mask = ch->sq.mask;
	const bool touch = c->touch != NULL;
	uint32_t i = 0;
	int r = 0;

	while (i < n && !r) {
		uint64_t pos, by = UINT64_MAX, last_arm = 0, last_arm_pos = 0;
		uint32_t got = chime_sq_reserve_n(&ch->sq, n - i, &pos), first = i;

		if (unlikely(!got)) {
			if (!wait_room(c, ch, &pos)) {
				r = cl_dead_errno(c);
				break;
			}
			got = 1;
		}
		for (uint32_t k = 0; k < got; k++, i++) {
			struct chime_op *o = &ops[i];
			uint64_t id = 0;
			bool tagged = false;

			if (o->deadline_ns < by)
				by = o->deadline_ns;    /* need_by() of an ARM */
			o->result = fill(&slots[(pos + k) & mask], s, CHIME_OP_ARM, &id, o->key, o->deadline_ns,
					 o->period_ns, o->user_data, &tagged);
			if (unlikely(o->result)) {
				o->id = 0;
				t->refused++;
				continue;
			}
			o->id = id;
			t->ok++;
			if (touch) {
				touch_tag_armed(c, id, tagged);
				last_arm = id;
				last_arm_pos = pos + k;
			}
		}
		if (last_arm)
			touch_ahead(c, last_arm, last_arm_pos);
		/* S1 for each record, S2 once after the last, as in submit_shard(). */
		chime_sq_publish_n(&ch->sq, pos, got);
		cl_doorbell_by(ch, by, pos, got);
		arm_backlog(c, s, pos, got);
		if (broker_stopping(c) && (r = stop_wait(c)) < 0) {
			/* lost with the stopping broker, as unpublish() says */
			for (uint32_t k = first; k < i; k++)
				if (ops[k].result == 0) {
					ops[k].result = r;
					ops[k].id = 0;
					t->ok--;
				}
		}
	}
	/* never sent: the broker died first */
	for (; i < n; i++) {
		ops[i].result = cl_dead_errno(c);
		ops[i].id = 0;
	}
	return r;
}

/* An open-addressing set of the keys of a call's CANCEL_KEYs (cancel_retried()). */
struct key_set {
	uint64_t *keys;
	uint8_t *used;
	size_t mask;
};

static size_t key_slot(const struct key_set *ks, uint64_t key)
{
	uint64_t h = key;
	size_t i = (size_t)splitmix64(&h) & ks->mask;

	while (ks->used[i] && ks->keys[i] != key)
		i = (i + 1) & ks->mask;
	return i;
}

/*
 * The ARMs retried on another shard went out after the call's other
 * records (every ARM of a call goes to one shard, but those), so a
 * CANCEL_KEY of their key later in the call reached that shard first. One
 * by one, that CANCEL_KEY would have cancelled them: cancel each now, as it
 * would have. Walked backwards with the keys of the CANCEL_KEYs done so far
 * in a set: linear in the call, and nothing at all without a CANCEL_KEY.
 */
static void cancel_retried(struct chime *c, const struct chime_op *ops, unsigned n, uint32_t arm_shard)
{
	struct key_set ks;
	size_t size = 2, k = 0;

	for (unsigned j = 0; j < n; j++)
		k += ops[j].op == CHIME_CANCEL_KEY && ops[j].result == 0;
	if (!k)
		return;
	while (size < 2 * k)
		size <<= 1;
	ks.mask = size - 1;
	ks.keys = malloc(size * sizeof(*ks.keys));
	ks.used = calloc(size, 1);
	for (unsigned i = n; ks.keys && ks.used && i-- > 0;) {
		const struct chime_op *o = &ops[i];

		if (o->op == CHIME_CANCEL_KEY && o->result == 0) {
			size_t at = key_slot(&ks, o->key);

			ks.keys[at] = o->key;
			ks.used[at] = 1;
		} else if (is_public_arm(o->op) && o->result == 0 && chime_id_shard(o->id) != arm_shard &&
			   ks.used[key_slot(&ks, o->key)]) {
			(void)submit(c, chime_id_shard(o->id), CHIME_OP_CANCEL, o->id, 0, 0, 0, 0, NULL);
		}
	}
	if (!ks.keys || !ks.used) {
		/* No memory for the set: the same, one scan per retried ARM. */
		for (unsigned i = 0; i < n; i++) {
			if (!is_public_arm(ops[i].op) || ops[i].result != 0 || chime_id_shard(ops[i].id) == arm_shard)
				continue;
			for (unsigned j = i + 1; j < n; j++)
				if (ops[j].op == CHIME_CANCEL_KEY && ops[j].key == ops[i].key && ops[j].result == 0) {
					(void)submit(c, chime_id_shard(ops[i].id), CHIME_OP_CANCEL, ops[i].id, 0, 0, 0,
						     0, NULL);
					break;
				}
		}
	}
	free(ks.keys);
	free(ks.used);
}

static inline bool arms_only(const struct chime_op *ops, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (ops[i].op != CHIME_ARM)
			return false;
	return true;
}

CHIME_PUBLIC int chime_submit(chime_t *c, struct chime_op *ops, unsigned n)
{
	uint32_t count[CHIME_MAX_SHARDS];
	struct batch_tally t = { 0, 0 };
	uint32_t arm_shard;
	bool live;
	int r = 0;

	/* n > INT_MAX: a count the return value cannot hold */
	if (unlikely(!c || (!ops && n) || n > INT_MAX))
		return -EINVAL;
	memset(count, 0, c->nr_shards * sizeof(count[0]));
	arm_shard = home_shard(c);
	live = !cl_gone_for_ops(c);
	if (live && n && arms_only(ops, n)) {
		r = submit_arms(c, arm_shard, ops, n, &t);
		goto sent;
	}
	for (unsigned i = 0; i < n; i++) {
		uint32_t to = op_shard(c, &ops[i], arm_shard);

		/* A reset with a table: by its word alone, or its word written now, its record below. */
		if (ops[i].op == CHIME_RESET && c->touch && to != TO_NONE && live) {
			if (touch_reset(c, ops[i].id, ops[i].deadline_ns)) {
				ops[i].result = 0;
				t.ok++;
				continue;
			}
		}
		if (ops[i].op == CHIME_ARM_REALTIME && !at_load(&c->realtime)) {
			ops[i].id = 0;
			ops[i].result = live ? -EOPNOTSUPP : cl_dead_errno(c);
			continue;
		}
		ops[i].result = to == TO_NONE ? -EINVAL : (int32_t)(PENDING + to);
		if (is_public_arm(ops[i].op))
			ops[i].id = 0;
		if (to == TO_ALL) {
			for (uint32_t s = 0; s < c->nr_shards; s++)
				count[s]++;
		} else if (to != TO_NONE) {
			count[to]++;
		}
	}
	if (cl_gone_for_ops(c))
		r = cl_dead_errno(c);
	for (uint32_t s = 0; s < c->nr_shards && !r; s++)
		if (count[s])
			r = submit_shard(c, s, arm_shard, ops, count[s], &t);
sent:
	if (likely(!r && !t.refused))
		return (int)t.ok;
	/* the rare end: a dead broker, or arms to retry on other shards */
	for (unsigned i = 0; i < n; i++) {
		struct chime_op *o = &ops[i];

		if (o->result >= PENDING)
			o->result = cl_dead_errno(c);   /* the broker died before it went out (everywhere) */
		else if (is_public_arm(o->op) && (o->result == -ENOMEM || o->result == -EDQUOT) &&
			 (o->result = arm_elsewhere(c, wire_op(o->op), arm_shard, o->result, o->key,
						    o->deadline_ns, o->period_ns, o->user_data, &o->id)) == 0)
			t.ok++;
	}
	/* After all of them: a cancel now takes a slot, with its grant, that a later retry could use. */
	if (t.refused)
		cancel_retried(c, ops, n, arm_shard);
	return t.ok == 0 && r < 0 ? r : (int)t.ok;
}
