/* SPDX-License-Identifier: MIT */
/*
 * tsan_api.c CHIMED CHIMECTL - the whole of libchime's thread-safety promise
 * on ONE chime_t, under ThreadSanitizer.
 *
 * A plain program (criterion cannot run under TSan, ../shared/STYLE.md section 9):
 * exit 0 on success, 1 on a violated check; TSan exits 66 on a report
 * (halt_on_error; chimed and chimectl get the same options by environment,
 * and a race reported in either fails the test too).
 *
 * It starts its own chimed (argv[1], else $CHIMED) on a private socket in a
 * temporary directory and runs two scenarios, each on one chime_t:
 * an anonymous connection, then a named session (opts.session) that goes
 * through `chimectl restart` (argv[2], else $CHIMECTL) and then a crash
 * of chimed while every thread runs. In each:
 *
 *  - 3 producer threads, each on timers of its own: chime_arm() of
 *    one-shots (1-30 ms ahead) and now and then of a periodic timer (2-10
 *    ms; at most 4 live a thread, the oldest cancelled to make room);
 *    chime_submit() batches of arms mixed with resets and cancels of
 *    earlier timers, or with a CHIME_CANCEL_KEY; chime_reset(),
 *    chime_cancel(), chime_cancel_key() of a group of 4 timers sharing a
 *    key (all of whose members it owns then); chime_flush(); and
 *    chime_fd(), which must return what the drainer's first call did
 *    (chime_fd(3): "later calls return the same descriptor from any
 *    thread");
 *  - a spawner thread, which calls nothing of libchime itself, starts
 *    short-lived threads one after another that arm 3 one-shots each and
 *    exit: a thread's first arm picks its home shard from the
 *    connection's client slot, which a session's reconnect changes;
 *  - two threads drain, taking turns (one at a time, any thread:
 *    chime_poll(3)): the main thread's first chime_fd() comes once the
 *    others run, then it and a second draining thread alternate, each
 *    turn one of, at random, chime_wait() (3 ms), epoll_wait() on
 *    chime_fd() + chime_poll() until it returns 0, and chime_dispatch()
 *    with a random max (0: all); the dispatch callback now and then arms a
 *    new one-shot, or resets or cancels (by id, or by key for its own
 *    arms) a live timer of any thread, picked from the shared table;
 *  - in the session, a thread runs `chimectl restart` 30% into the run,
 *    then at 65% stops chimed (SIGSTOP) for 80 ms, kills it (SIGKILL) and
 *    starts another on the same socket: the library reconnects under every thread (a producer
 *    waiting for room, the drainer, or a callback's arm makes the
 *    attempts), having noticed the crash wherever it did (the hang-up in
 *    chime_wait(), a producer's probe, a stale heartbeat).
 *
 * The harness orders nothing between the threads for TSan (tsan_harness.h):
 * what it records is relaxed atomics, so every happens-before edge TSan
 * sees between two threads' libchime calls is the library's own (or a
 * thread's creation), but for the one the contract asks of the
 * application: the two drainers' turns (turn_lock). Release/acquire
 * bookkeeping would order each thread's calls before the others' next
 * ones, and TSan would take the library's races for ordered accesses.
 *
 * Each timer's operations are serialized by a per-timer flag (a producer
 * waits for it, the callback only tries it), and each operation is
 * recorded before it is made, with a stamp from one global counter taken
 * when it started and when it returned. user_data is the timer's index: an
 * event can come before chime_arm()/chime_submit() has returned its id.
 *
 * What is checked, as each event is received:
 *  - it names a timer of ours, with the id chime_arm()/chime_submit() gave
 *    (once known) and the key it was armed with;
 *  - never early: fired_ns and the delivery both at or after deadline_ns;
 *  - a one-shot fires at most once; a periodic's events of one schedule
 *    (an arm or a reset) come in increasing deadline order, each
 *    deadline_ns its start plus a whole number of periods;
 *  - an operation counts as done before the event if a dispatch callback
 *    made it (chime_dispatch(3): always, in an earlier callback; or in the
 *    other drainer's, whose turn ended before this call began) or if
 *    another thread's returned before the draining call began. Another
 *    thread's operation that returned while the call was under way may or
 *    may not have been seen, and is not judged (chime_cancel(3): "After it
 *    returns, no event for id is ever returned");
 *  - if the last operation done before the event is a cancel (by id, by
 *    key, alone or in a batch), the event is a violation; else its
 *    deadline must be (for a periodic: on the schedule of) that of the last
 *    operation done before it, or of one made after it that had started
 *    before the event was received: never an older one (chime_reset(3)).
 * And once everything is due: every one-shot never cancelled fired exactly
 * once, every chime_submit() operation succeeded, the restart was seen
 * by no call (none failed; a session's calls wait for the next broker),
 * and each drainer got events in its turns (a drain that works in one
 * thread only would leave the other's empty).
 * Then crash_after_take() checks in one thread, and every time, the case
 * of a crash the scenarios hit only by chance.
 *
 * Each producer runs for 2.5 s per scenario ($TSAN_API_MS): about 8 s in
 * all under TSan on a 2-core host.
 *
 * Found by this test (and fixed): a reconnect's store of the new client
 * slot raced with a new thread's first arm reading it (home_shard()); the
 * drainer's first chime_fd() raced with a later call from another thread
 * (fd_used); after a crash, a one-shot the process had taken and then
 * reset fired again (chimed applied the reset before the claim words).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chime.h"
#include "tsan_harness.h"

extern char **environ;

#define NPROD      3u                   /* producer threads */
#define NREG       (NPROD + 2)          /* table regions: the producers', the callback's, the helpers' */
#define CB_REG     NPROD
#define HELP_REG   (NPROD + 1)
#define MAXOPS     8u                   /* the arm and up to 7 resets or cancels per timer */
#define GROUP      4u                   /* a producer's timers share a key in groups of this many */
#define MAX_PERIODIC 4u                 /* live periodic timers per producer */
#define MAX_BATCH  12u
#define RUN_MS     2500u                /* how long each producer runs ($TSAN_API_MS) */
#define PER_MS     25u                  /* table room per region and ms */
#define MS         UINT64_C(1000000)
#define SETTLE_NS  (UINT64_C(10000) * MS) /* after the last deadline: give up waiting */
#define GRACE_NS   (UINT64_C(150) * MS)   /* then drain this long for late or double events */

enum { OP_ARM = 1, OP_RESET, OP_CANCEL, OP_KINDS };
enum { VIA_CALL, VIA_KEY, VIA_BATCH, VIA_N };   /* how an operation was made, for the counts */

/* One operation on a timer: filled before it is made, `ret` stamped once it returned. */
struct op {
	uint64_t deadline_ns;           /* ARM, RESET: the deadline asked for */
	uint64_t start;                 /* stamp before the call */
	uint64_t ret;                   /* atomic: stamp after the call returned; 0 meanwhile */
	uint32_t kind;
	uint32_t by_drainer;            /* made by a dispatch callback (a draining thread's turn) */
};

/*
 * One timer. key, period_ns and ops[0 .. nops) are written by whoever
 * holds `busy` (the arming thread for the arm), then nops (pub32(); readers
 * sub32() it). Every field another thread reads is a relaxed atomic
 * (tsan_harness.h).
 */
struct tmr {
	uint64_t id;                    /* atomic: the id; 0 until chime_arm()/chime_submit() returned */
	uint64_t key;
	uint64_t period_ns;             /* 0: a one-shot */
	uint32_t busy;                  /* atomic: an operation on this timer is being made */
	uint32_t nops;                  /* atomic */
	uint32_t cancelled;             /* atomic: a cancel was made (no operation follows it) */
	uint32_t fired;                 /* atomic, written by the drainers (in turns): events received */
	uint32_t last_op;               /* drainer: a periodic's schedule (op index) of its last event */
	uint64_t last_deadline;         /* drainer: that event's deadline */
	uint64_t first_deadline;        /* drainer: the first event's deadline_ns, fired_ns, when received */
	uint64_t first_fired, first_seen;
	struct op ops[MAXOPS];
};

static uint64_t run_ns;                 /* how long each producer runs */
static uint32_t cap;                    /* timers per region and scenario, at most */
static struct tmr *tab;                 /* NREG * cap */
static uint32_t armed[NREG];            /* atomic: timers region r has started arming (r * cap + i) */
static uint32_t workers_done;           /* atomic */
static uint64_t last_deadline;          /* atomic: the latest one-shot deadline asked for */
static uint64_t n_ops[2][OP_KINDS][VIA_N]; /* atomic: [by_drainer][kind][via] */
static uint64_t n_batches, n_batch_ops, n_flushes, n_periodic, n_helpers; /* atomic */
static uint64_t n_periodic_events;      /* drainer */
static uint32_t cb_next;                /* drainer: the callback's next arm (region CB_REG) */
static int drainer_fd = -1;             /* atomic: the drainer's first chime_fd() had returned this */
static uint64_t restart_ns[4];          /* atomic: chimectl restart began, returned; SIGKILL; new chimed */

static const char *chimectl_path;

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void note_deadline(uint64_t d)
{
	uint64_t old = __atomic_load_n(&last_deadline, __ATOMIC_RELAXED);

	while (old < d && !__atomic_compare_exchange_n(&last_deadline, &old, d, true,
						       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static void count_op(bool drainer, uint32_t kind, uint32_t via)
{
	__atomic_fetch_add(&n_ops[drainer][kind][via], 1, __ATOMIC_RELAXED);
}

static bool try_own(struct tmr *t)
{
	uint32_t zero = 0;

	bool got = __atomic_compare_exchange_n(&t->busy, &zero, 1, false, ORD_ACQ, __ATOMIC_RELAXED);

	CC_BARRIER();
	return got;
}

static void own(struct tmr *t)
{
	while (!try_own(t))
		sched_yield();  /* the callback holds it for one call */
}

static void disown(struct tmr *t)
{
	pub32(&t->busy, 0);
}

static uint32_t idx_of(const struct tmr *t)
{
	return (uint32_t)(t - tab);
}

/*
 * A producer's timers share a key with the GROUP - 1 next to them (its
 * chime_cancel_key() ends the group); the callback's arms have keys of
 * their own. Keys of different scenarios differ (the session's earlier
 * timers stay armed until it is dropped).
 */
static uint64_t scenario_no;

static uint64_t key_for(uint32_t reg, uint32_t i)
{
	uint64_t k = reg == CB_REG ? (uint64_t)i : (uint64_t)(i / GROUP);

	return (scenario_no << 48) | ((uint64_t)(reg + 1) << 32) | (k + 1);
}

/*
 * Record the arm of timer t (not yet published to any other thread but
 * through nops): its event may come before the call returns.
 */
static void record_arm(struct tmr *t, uint32_t reg, uint32_t i, uint64_t deadline, uint64_t period, bool drainer)
{
	WR(t->key, key_for(reg, i));
	WR(t->period_ns, period);
	WR(t->ops[0].kind, (uint32_t)OP_ARM);
	WR(t->ops[0].deadline_ns, deadline);
	WR(t->ops[0].by_drainer, (uint32_t)drainer);
	WR(t->ops[0].ret, 0);
	WR(t->ops[0].start, stamp());
	if (!period)
		note_deadline(deadline);
	pub32(&t->nops, 1);
}

static void armed_as(struct tmr *t, chime_id_t id)
{
	if (!id)
		fail("timer %u: armed with id 0", idx_of(t));
	pub64(&t->id, id);
	WR(t->ops[0].ret, stamp());
}

/*
 * Record a reset (to a later deadline) or a cancel of t, which the caller
 * owns; false if no operation can be made: not armed yet (id unknown),
 * cancelled, or out of room for more. Returns the op to stamp.
 */
static struct op *record_op(struct tmr *t, uint32_t kind, uint64_t *seed, bool drainer, uint64_t *id)
{
	uint32_t n = sub32(&t->nops);
	struct op *o;

	*id = sub64(&t->id);
	if (!*id || n == 0 || n >= MAXOPS || __atomic_load_n(&t->cancelled, __ATOMIC_RELAXED))
		return NULL;
	o = &t->ops[n];
	WR(o->kind, kind);
	if (kind == OP_CANCEL) {
		WR(o->deadline_ns, 0);
		__atomic_store_n(&t->cancelled, 1, __ATOMIC_RELAXED);
	} else {
		uint64_t prev = RD(t->ops[n - 1].deadline_ns), now = chime_now();

		WR(o->deadline_ns, (prev > now ? prev : now) + MS + rnd(seed) % (29 * MS));
		if (!RD(t->period_ns))
			note_deadline(RD(o->deadline_ns));
	}
	WR(o->by_drainer, (uint32_t)drainer);
	WR(o->ret, 0);
	WR(o->start, stamp());
	pub32(&t->nops, n + 1);
	return o;
}

static void done(struct op *o)
{
	WR(o->ret, stamp());
}

/* Reset or cancel (by id) timer t, which the caller owns. False if nothing was done. */
static bool operate(chime_t *c, struct tmr *t, uint64_t *seed, bool drainer)
{
	uint32_t kind = rnd(seed) % 3 == 0 ? OP_CANCEL : OP_RESET;
	bool by_key = kind == OP_CANCEL && drainer && idx_of(t) / cap == CB_REG && rnd(seed) % 2;
	uint64_t id;
	struct op *o = record_op(t, kind, seed, drainer, &id);
	int r;

	if (!o)
		return false;
	if (kind == OP_RESET)
		r = chime_reset(c, id, RD(o->deadline_ns));
	else if (by_key)
		r = chime_cancel_key(c, RD(t->key));       /* a key of its own: the callback's arms */
	else
		r = chime_cancel(c, id);
	if (r < 0)
		fail_op(r, "chime_%s(%#llx) from the %s: %s",
			kind == OP_RESET ? "reset" : by_key ? "cancel_key" : "cancel",
			(unsigned long long)id, drainer ? "callback" : "producer", strerror(-r));
	done(o);
	count_op(drainer, kind, by_key ? VIA_KEY : VIA_CALL);
	return true;
}

/* ---- producers ---- */

struct worker {
	chime_t *c;
	uint32_t reg;
	uint32_t next;                  /* the next index of its region to arm */
	uint32_t nper;                  /* live periodic timers it armed: their indices */
	uint32_t per[MAX_PERIODIC];
	uint64_t seed;
	pthread_t thread;
};

static struct tmr *slot_of(uint32_t reg, uint32_t i)
{
	return &tab[reg * cap + i];
}

/* A timer of region reg, picked among its last `span` arms; NULL if none. */
static struct tmr *recent(uint32_t reg, uint32_t upto, uint64_t *seed, uint32_t span)
{
	uint32_t back;

	if (upto == 0)
		return NULL;
	back = (uint32_t)(rnd(seed) % span);
	return slot_of(reg, back >= upto ? 0 : upto - 1 - back);
}

static uint64_t oneshot_deadline(uint64_t *seed)
{
	return chime_now() + MS + rnd(seed) % (29 * MS);
}

/* One chime_arm(): a one-shot, or (periodic) a periodic timer. */
static void arm_one(struct worker *w, bool periodic)
{
	uint32_t i = w->next;
	struct tmr *t = slot_of(w->reg, i);
	uint64_t period = periodic ? 2 * MS + rnd(&w->seed) % (8 * MS) : 0;
	uint64_t d = periodic ? chime_now() + MS + rnd(&w->seed) % (9 * MS) : oneshot_deadline(&w->seed);
	chime_id_t id;
	int r;

	own(t);
	record_arm(t, w->reg, i, d, period, false);
	pub32(&armed[w->reg], i + 1);
	r = chime_arm(w->c, key_for(w->reg, i), d, period, w->reg * cap + i, &id);
	if (r < 0)
		fail_op(r, "chime_arm() in producer %u: %s", w->reg, strerror(-r));
	armed_as(t, id);
	disown(t);
	count_op(false, OP_ARM, VIA_CALL);
	w->next++;
	if (periodic) {
		w->per[w->nper++] = i;
		__atomic_fetch_add(&n_periodic, 1, __ATOMIC_RELAXED);
	}
}

/* Drop the periodic at per[k] from the live list (it was cancelled, by us or by the callback). */
static void per_drop(struct worker *w, uint32_t k)
{
	w->per[k] = w->per[--w->nper];
}

/* Cancel the oldest live periodic, to make room (or all, at the end). */
static void cancel_periodic(struct worker *w, uint32_t k)
{
	struct tmr *t = slot_of(w->reg, w->per[k]);

	own(t);
	if (!__atomic_load_n(&t->cancelled, __ATOMIC_RELAXED)) {
		uint64_t id;
		struct op *o = record_op(t, OP_CANCEL, &w->seed, false, &id);
		int r;

		/* Every other operation on a periodic leaves room for this one (MAXOPS - 1). */
		if (!o)
			fail("periodic timer %u: no room to record its cancel", idx_of(t));
		r = chime_cancel(w->c, id);
		if (r < 0)
			fail_op(r, "chime_cancel(%#llx) of a periodic: %s", (unsigned long long)id, strerror(-r));
		done(o);
		count_op(false, OP_CANCEL, VIA_CALL);
	}
	disown(t);
	per_drop(w, k);
}

/*
 * chime_cancel_key() of one of its groups, all of whose members were armed
 * (their ids known): owned all, each recorded as cancelled. Skipped if a
 * member has no room left for the record.
 */
static bool group_own(struct worker *w, uint32_t g, struct tmr **m)
{
	for (uint32_t k = 0; k < GROUP; k++) {
		m[k] = slot_of(w->reg, g * GROUP + k);
		own(m[k]);
	}
	for (uint32_t k = 0; k < GROUP; k++)
		if (!__atomic_load_n(&m[k]->cancelled, __ATOMIC_RELAXED) &&
		    __atomic_load_n(&m[k]->nops, __ATOMIC_RELAXED) >= MAXOPS) {
			for (uint32_t j = 0; j < GROUP; j++)
				disown(m[j]);
			return false;
		}
	return true;
}

static void group_record(struct worker *w, struct tmr **m, struct op **o)
{
	for (uint32_t k = 0; k < GROUP; k++) {
		uint64_t id;

		o[k] = record_op(m[k], OP_CANCEL, &w->seed, false, &id);
	}
}

static void group_done(struct worker *w, struct tmr **m, struct op **o, uint32_t via)
{
	for (uint32_t k = 0; k < GROUP; k++) {
		if (o[k]) {
			done(o[k]);
			count_op(false, OP_CANCEL, via);
		}
		disown(m[k]);
	}
	/* Its periodics among them are cancelled now. */
	for (uint32_t k = 0; k < w->nper;)
		if (__atomic_load_n(&slot_of(w->reg, w->per[k])->cancelled, __ATOMIC_RELAXED))
			per_drop(w, k);
		else
			k++;
}

static void cancel_group(struct worker *w)
{
	struct tmr *m[GROUP];
	struct op *o[GROUP];
	uint32_t groups = w->next / GROUP, g;
	int r;

	if (groups == 0)
		return;
	g = groups - 1 - (uint32_t)(rnd(&w->seed) % (groups < 16 ? groups : 16));
	if (!group_own(w, g, m))
		return;
	group_record(w, m, o);
	r = chime_cancel_key(w->c, RD(m[0]->key));
	if (r < 0)
		fail_op(r, "chime_cancel_key(%#llx): %s", (unsigned long long)RD(m[0]->key), strerror(-r));
	group_done(w, m, o, VIA_KEY);
}

/* Reset or cancel one of its own recent timers (fired or not, periodic or not). */
static void touch_own(struct worker *w)
{
	struct tmr *t = recent(w->reg, w->next, &w->seed, 64);

	if (!t)
		return;
	own(t);
	/* A periodic keeps room for its last cancel (cancel_periodic()). */
	if (!RD(t->period_ns) || RD(t->nops) < MAXOPS - 1)
		(void)operate(w->c, t, &w->seed, false);
	disown(t);
	for (uint32_t k = 0; k < w->nper;)
		if (__atomic_load_n(&slot_of(w->reg, w->per[k])->cancelled, __ATOMIC_RELAXED))
			per_drop(w, k);
		else
			k++;
}

/*
 * One chime_submit(): 1-6 new one-shot arms, with either up to 3 resets
 * or cancels of distinct earlier timers of its own, or one CANCEL_KEY of
 * an earlier group, in a shuffled order.
 */
static void batch(struct worker *w)
{
	struct chime_op ops[MAX_BATCH];
	struct tmr *tm[MAX_BATCH], *grp[GROUP];
	struct op *rec[MAX_BATCH], *grec[GROUP];
	uint32_t n = 0, narm = 1 + (uint32_t)(rnd(&w->seed) % 6), nold = 0, start = w->next;
	uint32_t groups = start / GROUP;
	bool by_key = groups > 1 && rnd(&w->seed) % 3 == 0;
	int r;

	if (start + narm > cap)
		return;
	memset(ops, 0, sizeof(ops));
	memset(rec, 0, sizeof(rec));
	/* The earlier timers first: owned before anything is recorded. */
	if (by_key) {
		uint32_t g = groups - 1 - (uint32_t)(rnd(&w->seed) % (groups < 16 ? groups : 16));

		by_key = group_own(w, g, grp);
	} else {
		uint32_t want = (uint32_t)(rnd(&w->seed) % 4);

		for (uint32_t k = 0; k < want && start; k++) {
			struct tmr *t = recent(w->reg, start, &w->seed, 64);
			bool dup = false;

			for (uint32_t j = 0; j < nold; j++)
				dup |= tm[j] == t;
			if (dup)
				continue;
			own(t);
			/* A periodic keeps room for its last cancel (cancel_periodic()). */
			if (RD(t->period_ns) && RD(t->nops) >= MAXOPS - 1) {
				disown(t);
				continue;
			}
			tm[nold++] = t;
		}
	}
	for (uint32_t k = 0; k < narm; k++) {
		struct tmr *t = slot_of(w->reg, start + k);
		uint64_t d = oneshot_deadline(&w->seed);

		own(t);
		record_arm(t, w->reg, start + k, d, 0, false);
		ops[n++] = (struct chime_op){ .op = CHIME_ARM, .key = key_for(w->reg, start + k), .deadline_ns = d,
					      .user_data = w->reg * cap + start + k };
	}
	pub32(&armed[w->reg], start + narm);
	w->next += narm;
	if (by_key) {
		group_record(w, grp, grec);
		ops[n++] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = RD(grp[0]->key) };
	}
	for (uint32_t k = 0; k < nold; k++) {
		uint64_t id;
		uint32_t kind = rnd(&w->seed) % 3 == 0 ? OP_CANCEL : OP_RESET;
		struct op *o = record_op(tm[k], kind, &w->seed, false, &id);

		if (!o)
			continue;
		rec[n] = o;
		ops[n++] = (struct chime_op){ .op = kind == OP_CANCEL ? CHIME_CANCEL : CHIME_RESET, .id = id,
					      .deadline_ns = RD(o->deadline_ns) };
	}
	/* Shuffled: arms, resets and cancels interleave (each timer appears once). */
	for (uint32_t k = n; k > 1; k--) {
		uint32_t j = (uint32_t)(rnd(&w->seed) % k);
		struct chime_op tmp = ops[k - 1];
		struct op *tr = rec[k - 1];

		ops[k - 1] = ops[j];
		rec[k - 1] = rec[j];
		ops[j] = tmp;
		rec[j] = tr;
	}
	r = chime_submit(w->c, ops, n);
	if (r != (int)n) {
		for (uint32_t k = 0; k < n; k++)
			if (ops[k].result)
				fail_op(ops[k].result, "chime_submit() in producer %u: %d of %u done; op %u (%u): %s",
					w->reg, r, n, k, ops[k].op, strerror(-ops[k].result));
		fail_op(r < 0 ? r : -EIO, "chime_submit() in producer %u returned %d of %u, every result 0",
			w->reg, r, n);
	}
	for (uint32_t k = 0; k < n; k++) {
		if (ops[k].op == CHIME_ARM) {
			struct tmr *t = &tab[ops[k].user_data];

			armed_as(t, ops[k].id);
			disown(t);
			count_op(false, OP_ARM, VIA_BATCH);
		} else if (rec[k]) {
			done(rec[k]);
			count_op(false, RD(rec[k]->kind), VIA_BATCH);
		}
	}
	for (uint32_t k = 0; k < nold; k++)
		disown(tm[k]);
	if (by_key)
		group_done(w, grp, grec, VIA_KEY);
	__atomic_fetch_add(&n_batches, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&n_batch_ops, n, __ATOMIC_RELAXED);
	for (uint32_t k = 0; k < w->nper;)
		if (__atomic_load_n(&slot_of(w->reg, w->per[k])->cancelled, __ATOMIC_RELAXED))
			per_drop(w, k);
		else
			k++;
}

/*
 * A short-lived thread arming a few one-shots in its starter's place (the
 * starter waits for it): its first arm picks a home shard from the
 * connection's client slot, which a session's reconnect changes.
 */
static void *helper_main(void *arg)
{
	struct worker *w = arg;

	for (int k = 0; k < 3 && w->next < cap; k++)
		arm_one(w, false);
	return NULL;
}

/*
 * Starts the short-lived arming threads one after another, and calls
 * nothing of libchime itself: what a new thread knows of the connection
 * is only what the library gives it (a thread per request).
 */
static void *spawner_main(void *arg)
{
	struct worker *w = arg;
	uint64_t end = chime_now() + run_ns;

	while (w->next + 3 < cap && chime_now() < end) {
		pthread_t h;
		int r = pthread_create(&h, NULL, helper_main, w);

		if (r != 0)
			fail("pthread_create (helper): %s", strerror(r));
		pthread_join(h, NULL);
		__atomic_fetch_add(&n_helpers, 1, __ATOMIC_RELAXED);
		pause_ns(1000000 + (long)(rnd(&w->seed) % 2000000));
	}
	CC_BARRIER();
	__atomic_fetch_add(&workers_done, 1, __ATOMIC_RELAXED);
	return NULL;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t end = chime_now() + run_ns;

	while (w->next + MAX_BATCH < cap && chime_now() < end) {
		uint64_t what = rnd(&w->seed) % 100;

		if (what < 40) {
			arm_one(w, false);
		} else if (what < 43) {
			if (w->nper == MAX_PERIODIC)
				cancel_periodic(w, 0);
			arm_one(w, true);
		} else if (what < 58) {
			batch(w);
		} else if (what < 80) {
			touch_own(w);
		} else if (what < 86) {
			cancel_group(w);
		} else if (what < 90) {
			int r = chime_flush(w->c);

			if (r < 0)
				fail_op(r, "chime_flush() in producer %u: %s", w->reg, strerror(-r));
			__atomic_fetch_add(&n_flushes, 1, __ATOMIC_RELAXED);
		} else if (what < 92 && RD(drainer_fd) >= 0) {
			/* chime_fd(3): "later calls return the same descriptor from any thread". */
			int r = chime_fd(w->c);

			if (r != RD(drainer_fd))
				fail("chime_fd() in producer %u: %d, the drainer's first call gave %d", w->reg, r,
				     RD(drainer_fd));
		}
		if (rnd(&w->seed) % 4 == 0)
			pause_ns((long)(rnd(&w->seed) % 400000));
	}
	/* Its periodics end with the run: none fires after the cancel returned. */
	while (w->nper)
		cancel_periodic(w, 0);
	CC_BARRIER();
	__atomic_fetch_add(&workers_done, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* ---- the drainer ---- */

struct drain {
	chime_t *c;
	uint64_t seed;
	uint64_t call_start;            /* stamp before the current draining call */
	uint64_t call_end;              /* chime_poll/chime_wait: stamp after it returned; 0 in a dispatch */
	uint64_t events, waits, polls, dispatches, cb_arms;
};

static const char *kind_name(uint32_t k)
{
	return k == OP_ARM ? "arm" : k == OP_RESET ? "reset" : "cancel";
}

/* e's deadline is on the schedule op o started (a one-shot: o's deadline itself). */
static bool on_schedule(const struct tmr *t, const struct op *o, const struct chime_event *e)
{
	uint64_t p = RD(t->period_ns), d = RD(o->deadline_ns);

	if (!p)
		return d == e->deadline_ns;
	return e->deadline_ns >= d && (e->deadline_ns - d) % p == 0;
}

/* The operations on t, for a report: kind(deadline)[started..returned] each. */
static void history(const struct tmr *t, uint32_t n, char *hist, size_t size)
{
	int len = 0;

	hist[0] = 0;
	for (uint32_t k = 0; k < n && len < (int)size - 80; k++)
		len += snprintf(hist + len, size - (size_t)len, " %s%s(%llu)[%llu..%llu]",
				RD(t->ops[k].by_drainer) ? "cb:" : "", kind_name(RD(t->ops[k].kind)),
				(unsigned long long)RD(t->ops[k].deadline_ns),
				(unsigned long long)RD(t->ops[k].start),
				(unsigned long long)RD(t->ops[k].ret));
}

static void judge(struct drain *d, const struct chime_event *e)
{
	uint64_t now = chime_now(), seen = d->call_end ? d->call_end : stamp(), idx = e->user_data;
	uint64_t period, key;
	struct tmr *t;
	chime_id_t id;
	uint32_t n, j = 0, k, fired;
	bool ok = false;

	d->events++;
	if (idx >= (uint64_t)NREG * cap)
		fail("event for id %#llx carries user_data %llu, no timer of ours",
		     (unsigned long long)e->id, (unsigned long long)idx);
	t = &tab[idx];
	n = sub32(&t->nops);
	if (n == 0)
		fail("event for timer %llu, which was never armed", (unsigned long long)idx);
	id = sub64(&t->id);
	period = RD(t->period_ns);
	key = RD(t->key);
	fired = RD(t->fired);
	if (id && id != e->id)
		violation("timer %llu: event for id %#llx, but the arm gave %#llx",
			  (unsigned long long)idx, (unsigned long long)e->id, (unsigned long long)id);
	if (e->key != key)
		violation("timer %llu: event with key %#llx, armed with %#llx", (unsigned long long)idx,
			  (unsigned long long)e->key, (unsigned long long)key);
	if (!period && fired) {
		char hist[640];

		history(t, n, hist, sizeof(hist));
		violation("timer %llu (id %#llx): a second event (deadline %llu, fired %llu, received %llu; "
			  "the first: deadline %llu, fired %llu, received %llu; restart %llu..%llu, SIGKILL %llu, "
			  "new chimed %llu; call began at stamp %llu; history, [started..returned]:%s)",
			  (unsigned long long)idx, (unsigned long long)e->id, (unsigned long long)e->deadline_ns,
			  (unsigned long long)e->fired_ns, (unsigned long long)now,
			  (unsigned long long)t->first_deadline, (unsigned long long)t->first_fired,
			  (unsigned long long)t->first_seen, (unsigned long long)RD(restart_ns[0]),
			  (unsigned long long)RD(restart_ns[1]), (unsigned long long)RD(restart_ns[2]),
			  (unsigned long long)RD(restart_ns[3]), (unsigned long long)d->call_start, hist);
	} else if (!fired) {
		t->first_deadline = e->deadline_ns;
		t->first_fired = e->fired_ns;
		t->first_seen = now;
	}
	WR(t->fired, fired + 1);
	n_periodic_events += period != 0;
	if (e->fired_ns < e->deadline_ns || now < e->deadline_ns)
		violation("timer %llu: early: deadline %llu, fired %llu, delivered %llu",
			  (unsigned long long)idx, (unsigned long long)e->deadline_ns,
			  (unsigned long long)e->fired_ns, (unsigned long long)now);

	/* The last operation done before this event was taken, as far as we can tell. */
	for (uint32_t i = 1; i < n; i++) {
		uint64_t r = RD(t->ops[i].ret);

		if (RD(t->ops[i].by_drainer) || (r && r < d->call_start))
			j = i;
	}
	if (RD(t->ops[j].kind) == OP_CANCEL) {
		violation("timer %llu (id %#llx, %s): event (deadline %llu) after its cancel returned %s",
			  (unsigned long long)idx, (unsigned long long)e->id,
			  period ? "periodic" : "one-shot", (unsigned long long)e->deadline_ns,
			  RD(t->ops[j].by_drainer) ? "in an earlier callback (this drainer's, or the other's turn)"
						   : "in another thread before this draining call began");
		return;
	}
	for (k = j; k < n && !ok; k++)
		ok = RD(t->ops[k].kind) != OP_CANCEL && RD(t->ops[k].start) < seen && on_schedule(t, &t->ops[k], e);
	if (ok && period) {
		/* One schedule's events in order, none twice. */
		k--;
		if (fired && k == t->last_op && e->deadline_ns <= t->last_deadline)
			violation("periodic timer %llu (id %#llx): event for deadline %llu after one for %llu",
				  (unsigned long long)idx, (unsigned long long)e->id,
				  (unsigned long long)e->deadline_ns, (unsigned long long)t->last_deadline);
		t->last_op = k;
		t->last_deadline = e->deadline_ns;
	}
	if (!ok) {
		char hist[640];

		history(t, n, hist, sizeof(hist));
		violation("timer %llu (id %#llx, period %llu): event with deadline %llu, but the last "
			  "operation done before it was %s(%llu) (call began at stamp %llu, event seen at %llu; "
			  "history, [started..returned]:%s)",
			  (unsigned long long)idx, (unsigned long long)e->id, (unsigned long long)period,
			  (unsigned long long)e->deadline_ns, kind_name(RD(t->ops[j].kind)),
			  (unsigned long long)RD(t->ops[j].deadline_ns), (unsigned long long)d->call_start,
			  (unsigned long long)seen, hist);
	}
}

/* From the callback: arm a new one-shot of the callback's own (a key of its own). */
static void cb_arm(struct drain *d)
{
	uint32_t i = cb_next;
	struct tmr *t;
	chime_id_t id;
	uint64_t dl;
	int r;

	if (i >= cap)
		return;
	t = slot_of(CB_REG, i);
	dl = oneshot_deadline(&d->seed);
	own(t);
	record_arm(t, CB_REG, i, dl, 0, true);
	pub32(&armed[CB_REG], i + 1);
	r = chime_arm(d->c, key_for(CB_REG, i), dl, 0, CB_REG * cap + i, &id);
	if (r < 0)
		fail_op(r, "chime_arm() from the callback: %s", strerror(-r));
	armed_as(t, id);
	disown(t);
	count_op(true, OP_ARM, VIA_CALL);
	cb_next++;
	d->cb_arms++;
}

/* From the callback: reset or cancel another live timer, of any thread. */
static void meddle(struct drain *d)
{
	uint32_t reg = (uint32_t)(rnd(&d->seed) % NREG);
	uint32_t na = sub32(&armed[reg]);
	struct tmr *t = recent(reg, na, &d->seed, 128);

	if (!t || !try_own(t))
		return;         /* its producer is at it */
	if (!sub32(&t->nops) || (!RD(t->period_ns) && RD(t->fired))) {
		disown(t);      /* not recorded yet, or fired (we know: we are the drainer) */
		return;
	}
	/* A periodic keeps room for its producer's last cancel. */
	if (!RD(t->period_ns) || RD(t->nops) < MAXOPS - 1)
		(void)operate(d->c, t, &d->seed, true);
	disown(t);
}

static void on_event(const struct chime_event *e, void *arg)
{
	struct drain *d = arg;
	uint64_t what;

	judge(d, e);
	what = rnd(&d->seed) % 8;
	if (what < 2)
		meddle(d);
	else if (what < 3)
		cb_arm(d);
}

/* How many one-shots never cancelled have not fired; the first one in *missing. */
static uint32_t unfired(uint32_t *missing)
{
	uint32_t n = 0;

	for (uint32_t r = 0; r < NREG; r++) {
		uint32_t na = sub32(&armed[r]);

		for (uint32_t i = 0; i < na; i++) {
			struct tmr *t = slot_of(r, i);

			/* nops 0: its arm is not recorded yet (armed[] is bumped first in a batch) */
			if (sub32(&t->nops) && !RD(t->period_ns) && !__atomic_load_n(&t->cancelled, __ATOMIC_RELAXED) &&
			    !__atomic_load_n(&t->fired, __ATOMIC_RELAXED) && n++ == 0)
				*missing = r * cap + i;
		}
	}
	return n;
}

/*
 * One drainer's turn: a draining call, of the three kinds at random, and
 * for chime_poll() and chime_dispatch() more until one returns 0, or
 * TURN_CALLS of them: on a loaded host events can come faster than a TSan
 * drainer takes them, and the other drainer would wait for its turn for
 * good (chime_poll() leaves the fd readable when it stops at max, and
 * the next epoll_wait() gives up after 3 ms anyway).
 */
#define TURN_CALLS 64

static void drain_once(struct drain *d, int ep)
{
	struct chime_event ev[32];
	uint32_t kind = (uint32_t)(rnd(&d->seed) % 3), calls = 0;
	unsigned max = 1 + (unsigned)(rnd(&d->seed) % 32);
	int r;

	if (kind == 0) {
		d->call_start = stamp();
		r = chime_wait(d->c, ev, max, 3);
		d->call_end = stamp();
		d->waits++;
		if (r < 0)
			fail_op(r, "chime_wait: %s", strerror(-r));
		for (int i = 0; i < r; i++)
			judge(d, &ev[i]);
	} else if (kind == 1) {
		struct epoll_event ee;

		/* chime_fd()'s promise: readable while events are pending, if drained until 0. */
		if (epoll_wait(ep, &ee, 1, 3) < 0 && errno != EINTR)
			fail("epoll_wait: %s", strerror(errno));
		do {
			d->call_start = stamp();
			r = chime_poll(d->c, ev, max);
			d->call_end = stamp();
			d->polls++;
			if (r < 0)
				fail_op(r, "chime_poll: %s", strerror(-r));
			for (int i = 0; i < r; i++)
				judge(d, &ev[i]);
		} while (r > 0 && ++calls < TURN_CALLS);
	} else {
		unsigned dmax = rnd(&d->seed) % 2 ? 0 : max;

		do {
			d->call_start = stamp();
			d->call_end = 0;
			r = chime_dispatch(d->c, on_event, d, dmax);
			d->dispatches++;
			if (r < 0)
				fail_op(r, "chime_dispatch: %s", strerror(-r));
		} while (r > 0 && ++calls < TURN_CALLS);
	}
}

/* ---- the restart ---- */

struct restarter {
	const char *session;
	uint64_t at_ns;                 /* when to run chimectl restart (after the producers started) */
	uint64_t crash_ns;              /* when to kill chimed (SIGKILL) and start another */
	uint64_t took_ns;               /* how long chimectl restart took */
	pthread_t thread;
};

static void *restart_main(void *arg)
{
	struct restarter *rs = arg;
	char *argv[] = { (char *)chimectl_path, (char *)"--socket", sock_path, (char *)"restart", NULL };
	posix_spawn_file_actions_t fa;
	char quoted[64];
	uint64_t t0;
	pid_t pid;
	int r, st;

	pause_ns((long)rs->at_ns);
	if (posix_spawn_file_actions_init(&fa) ||
	    posix_spawn_file_actions_addopen(&fa, 1, ctl_log_path, O_WRONLY | O_CREAT | O_APPEND, 0600) ||
	    posix_spawn_file_actions_adddup2(&fa, 1, 2))
		fail("posix_spawn_file_actions: out of memory");
	t0 = chime_now();
	WR(restart_ns[0], t0);
	if ((r = posix_spawn(&pid, chimectl_path, &fa, NULL, argv, environ)) != 0)
		fail("posix_spawn %s: %s", chimectl_path, strerror(r));
	posix_spawn_file_actions_destroy(&fa);
	if (waitpid(pid, &st, 0) != pid)
		fail("waitpid(chimectl): %s", strerror(errno));
	rs->took_ns = chime_now() - t0;
	WR(restart_ns[1], chime_now());
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail("chimectl restart %s %d", WIFEXITED(st) ? "exited" : "killed by signal",
		     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));

	/*
	 * Then a crash: SIGKILL, and a new chimed on the same socket at once
	 * (as tests/tsan_broker.sh does). The library notices by itself (the
	 * hang-up, a stale heartbeat, a full ring) and reconnects to it.
	 * Not before the session is on the restarted broker: on a loaded host
	 * the restart can take seconds, and a crash of a broker the session
	 * never reached tests neither hand-over (3 runs in 10 under two CPU
	 * hogs: "2 connections of session").
	 */
	snprintf(quoted, sizeof(quoted), "session '%s'", rs->session);
	for (uint64_t until = chime_now() + 20000 * MS;
	     log_lines(log_path, " connected: ", quoted) < 2 && chime_now() < until;)
		pause_ns(10000000);
	if (rs->crash_ns > chime_now() - t0 + rs->at_ns)
		pause_ns((long)(rs->crash_ns - rs->at_ns - (chime_now() - t0)));
	/*
	 * Stopped first for a moment, as a broker that hangs and then dies:
	 * the drainer takes the events chimed had delivered, and the producers
	 * reset and cancel timers (some of them just taken), all of which the
	 * dead broker never sees; the next one learns them from the library
	 * (the claim words it copies, the records it submits again).
	 */
	pid = __atomic_load_n(&broker, __ATOMIC_RELAXED);
	if (pid > 0 && kill(pid, SIGSTOP) == 0)
		pause_ns(80000000);
	pthread_mutex_lock(&broker_lock);
	pid = __atomic_exchange_n(&broker, -1, __ATOMIC_RELAXED);
	if (pid > 0) {
		WR(restart_ns[2], chime_now());
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	pthread_mutex_unlock(&broker_lock);
	if (pid <= 0)
		return NULL;    /* fail() is under way */
	pid = spawn_broker();
	WR(restart_ns[3], chime_now());
	__atomic_store_n(&broker, pid, __ATOMIC_RELAXED);
	return NULL;
}

/* ---- two drainers taking turns ---- */

/*
 * chime_poll(3): one thread at a time drains a chime_t, and it may be any
 * thread. The main thread and a second draining thread take turns, one
 * drain_once() each, strictly alternating under turn_lock: the
 * application's own order between two drainers, which the contract asks
 * for, and the one edge this test makes between threads (it orders the
 * two drainers only, never a producer). The drainers' state (struct
 * drain's, cb_next, the tmr fields marked "drainer") is theirs by turns.
 */
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cond = PTHREAD_COND_INITIALIZER;
static uint32_t turn;                   /* under turn_lock: whose turn, 0 the main thread's */
static bool turns_over;                 /* under turn_lock: the second drainer stops */

/* Wait for this drainer's turn; false once the turns are over. */
static bool turn_begin(uint32_t me)
{
	bool go;

	pthread_mutex_lock(&turn_lock);
	while (turn != me && !turns_over)
		pthread_cond_wait(&turn_cond, &turn_lock);
	go = !turns_over;
	pthread_mutex_unlock(&turn_lock);
	return go;
}

static void turn_end(uint32_t me)
{
	pthread_mutex_lock(&turn_lock);
	turn = !me;
	pthread_cond_broadcast(&turn_cond);
	pthread_mutex_unlock(&turn_lock);
}

struct drainer2 {
	struct drain d;
	int ep;
	pthread_t thread;
};

static void *drainer2_main(void *arg)
{
	struct drainer2 *d2 = arg;

	while (turn_begin(1)) {
		drain_once(&d2->d, d2->ep);
		turn_end(1);
	}
	return NULL;
}

/* ---- a scenario ---- */

static void scenario(const char *session)
{
	struct chime_opts opts = { .socket_path = sock_path, .session = session };
	struct worker w[NPROD + 1];     /* the producers, then the spawner */
	struct drain d = { .seed = (uint64_t)chime_now() | 1 };
	struct drainer2 d2 = { .d.seed = d.seed * 3 | 1 };
	struct restarter rs = { .session = session, .at_ns = run_ns * 3 / 10, .crash_ns = run_ns * 13 / 20 };
	struct epoll_event ev = { .events = EPOLLIN };
	uint64_t give_up = 0, quiet_until = 0, next_check = 0, t0 = chime_now();
	uint64_t fired = 0, cancelled = 0, cancelled_fired = 0, armed_n = 0, oneshots = 0;
	uint64_t resets[2] = { 0, 0 }, cancels[2] = { 0, 0 }, by_key = 0;
	uint32_t missing = 0, left;
	int ep, fd, r;

	scenario_name = session ? "session" : "anonymous";
	scenario_no++;
	memset(tab, 0, sizeof(*tab) * NREG * cap);
	memset(armed, 0, sizeof(armed));
	memset(restart_ns, 0, sizeof(restart_ns));
	memset(n_ops, 0, sizeof(n_ops));
	n_batches = n_batch_ops = n_flushes = n_periodic = n_helpers = n_periodic_events = 0;
	cb_next = 0;
	turn = 0;
	turns_over = false;
	workers_done = 0;
	last_deadline = 0;
	if ((r = chime_open(&d.c, &opts)) < 0)
		fail("chime_open(%s%s): %s", session ? "session " : "anonymous", session ? session : "",
		     strerror(-r));
	for (uint32_t t = 0; t <= NPROD; t++) {
		w[t] = (struct worker){ .c = d.c, .reg = t < NPROD ? t : HELP_REG,
					.seed = d.seed * (t + 7) | 1 };
		if ((r = pthread_create(&w[t].thread, NULL, t < NPROD ? worker_main : spawner_main, &w[t])) != 0)
			fail("pthread_create: %s", strerror(r));
	}
	if (session && (r = pthread_create(&rs.thread, NULL, restart_main, &rs)) != 0)
		fail("pthread_create: %s", strerror(r));
	/*
	 * The first chime_fd() from the draining thread, the producers running
	 * (chime_fd(3)); they call it again once it has returned, told so by
	 * a relaxed store: "later", with nothing ordering it for TSan.
	 */
	if ((fd = chime_fd(d.c)) < 0)
		fail("chime_fd: %s", strerror(-fd));
	WR(drainer_fd, fd);
	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		fail("epoll on chime_fd(): %s", strerror(errno));
	d2.d.c = d.c;
	d2.ep = ep;
	if ((r = pthread_create(&d2.thread, NULL, drainer2_main, &d2)) != 0)
		fail("pthread_create: %s", strerror(r));
	for (;;) {
		uint64_t now;

		turn_begin(0);
		drain_once(&d, ep);
		turn_end(0);
		now = chime_now();
		if (now >= next_check) {
			broker_alive();
			next_check = now + 50 * MS;
		}
		if (sub32(&workers_done) < NPROD + 1)
			continue;
		if (!give_up)
			give_up = __atomic_load_n(&last_deadline, __ATOMIC_RELAXED) + SETTLE_NS;
		if (quiet_until) {
			if (now >= quiet_until)
				break;
		} else if ((left = unfired(&missing)) == 0) {
			quiet_until = now + GRACE_NS;   /* a little longer: nothing more may come */
		} else if (now >= give_up) {
			struct tmr *t = &tab[missing];
			uint32_t n = sub32(&t->nops);

			violation("%u one-shots never cancelled did not fire; the first: timer %u (id %#llx, "
				  "last %s to %llu, now %llu)", left, missing,
				  (unsigned long long)RD(t->id), kind_name(RD(t->ops[n - 1].kind)),
				  (unsigned long long)RD(t->ops[n - 1].deadline_ns), (unsigned long long)now);
			break;
		}
	}
	pthread_mutex_lock(&turn_lock);
	turns_over = true;
	pthread_cond_broadcast(&turn_cond);
	pthread_mutex_unlock(&turn_lock);
	pthread_join(d2.thread, NULL);
	for (uint32_t t = 0; t <= NPROD; t++)
		pthread_join(w[t].thread, NULL);
	if (session)
		pthread_join(rs.thread, NULL);
	close(ep);
	WR(drainer_fd, -1);
	chime_close(d.c);
	if (session && (r = chime_drop_session(&opts)) < 0)
		fail("chime_drop_session(%s): %s", session, strerror(-r));

	for (uint32_t reg = 0; reg < NREG; reg++) {
		armed_n += armed[reg];
		for (uint32_t i = 0; i < armed[reg]; i++) {
			struct tmr *tm = slot_of(reg, i);

			if (tm->period_ns)
				continue;
			oneshots++;
			fired += tm->fired != 0;
			cancelled += tm->cancelled;
			cancelled_fired += tm->cancelled && tm->fired;
		}
	}
	for (uint32_t dr = 0; dr < 2; dr++) {
		for (uint32_t via = 0; via < VIA_N; via++) {
			resets[dr] += n_ops[dr][OP_RESET][via];
			cancels[dr] += n_ops[dr][OP_CANCEL][via];
		}
		by_key += n_ops[dr][OP_CANCEL][VIA_KEY];
	}
	printf("tsan_api: %s: %llu timers armed (%llu periodic; %llu by the callback, %llu in batches%s), "
	       "%llu chime_submit() of %llu ops, resets %llu (callback %llu), cancels %llu (callback %llu, "
	       "by key %llu), %llu flushes; one-shots: %llu fired, %llu cancelled (%llu of them fired first); "
	       "%llu periodic events; %llu waits, %llu polls, %llu dispatches, %llu events (the second "
	       "drainer's turns: %llu calls, %llu events)",
	       scenario_name, (unsigned long long)armed_n, (unsigned long long)n_periodic,
	       (unsigned long long)(d.cb_arms + d2.d.cb_arms),
	       (unsigned long long)(n_ops[0][OP_ARM][VIA_BATCH]), "",
	       (unsigned long long)n_batches, (unsigned long long)n_batch_ops,
	       (unsigned long long)(resets[0] + resets[1]), (unsigned long long)resets[1],
	       (unsigned long long)(cancels[0] + cancels[1]), (unsigned long long)cancels[1],
	       (unsigned long long)by_key, (unsigned long long)n_flushes,
	       (unsigned long long)fired, (unsigned long long)cancelled, (unsigned long long)cancelled_fired,
	       (unsigned long long)n_periodic_events, (unsigned long long)(d.waits + d2.d.waits),
	       (unsigned long long)(d.polls + d2.d.polls), (unsigned long long)(d.dispatches + d2.d.dispatches),
	       (unsigned long long)(d.events + d2.d.events),
	       (unsigned long long)(d2.d.waits + d2.d.polls + d2.d.dispatches), (unsigned long long)d2.d.events);
	printf("; %llu short-lived arming threads", (unsigned long long)n_helpers);
	if (session)
		printf("; chimectl restart at %llu ms took %llu ms, SIGKILL and a new chimed at %llu ms",
		       (unsigned long long)(rs.at_ns / MS), (unsigned long long)(rs.took_ns / MS),
		       (unsigned long long)(rs.crash_ns / MS));
	printf("; %.1f s\n", (double)(chime_now() - t0) / 1e9);
	fflush(stdout);
	if (fired + cancelled - cancelled_fired != oneshots)
		violation("%llu one-shots: %llu fired and %llu cancelled without firing",
			  (unsigned long long)oneshots, (unsigned long long)fired,
			  (unsigned long long)(cancelled - cancelled_fired));
	if (n_periodic && !n_periodic_events)
		violation("%llu periodic timers armed, not one event", (unsigned long long)n_periodic);
	if (!d2.d.events || !d.events)
		violation("the %s drainer got no event in its turns (%llu and %llu): draining must work in any "
			  "thread, one at a time", d.events ? "second" : "main", (unsigned long long)d.events,
			  (unsigned long long)d2.d.events);
}

/*
 * The exactly-once promise through a crash, in one thread and made
 * certain: a one-shot whose event the process took and then reset (which
 * changes nothing then, chime_reset(3)), chimed stopped before it saw
 * either (it sleeps: a reset due later rings no doorbell), then killed. The
 * next broker learns of the take from the claim words the library copies,
 * and gets the reset again from the library: the timer must not fire
 * again. A witness armed after the kill says when the next broker has
 * delivered what it fires. (The scenarios above hit this case by chance,
 * seldom: the reset has to come between the take and the crash.)
 */
static void crash_after_take(const char *session)
{
	struct chime_opts opts = { .socket_path = sock_path, .session = session };
	struct chime_event ev[8];
	chime_id_t id, witness;
	uint64_t until = 0, give_up;
	chime_t *c;
	int r, n;
	unsigned again = 0;
	uint64_t armed_for, reset_to = 0, again_deadline = 0, again_fired = 0;
	pid_t pid;

	scenario_name = "crash after a take";
	if ((r = chime_open(&c, &opts)) < 0)
		fail("chime_open(session %s): %s", session, strerror(-r));
	armed_for = chime_now() + 2 * MS;
	if ((r = chime_arm(c, 1, armed_for, 0, 1, &id)) < 0)
		fail_op(r, "chime_arm: %s", strerror(-r));
	n = chime_wait(c, ev, 8, 10000);
	if (n != 1 || ev[0].id != id)
		fail("chime_wait: %d (%s), not the one event of the timer armed", n, n < 0 ? strerror(-n) : "");
	pthread_mutex_lock(&broker_lock);
	pid = __atomic_exchange_n(&broker, -1, __ATOMIC_RELAXED);
	kill(pid, SIGSTOP);
	reset_to = chime_now() + 20 * MS;
	if ((r = chime_reset(c, id, reset_to)) < 0)
		fail_op(r, "chime_reset after the take: %s", strerror(-r));
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	__atomic_store_n(&broker, spawn_broker(), __ATOMIC_RELAXED);
	pthread_mutex_unlock(&broker_lock);
	if ((r = chime_arm(c, 2, chime_now() + 40 * MS, 0, 2, &witness)) < 0)
		fail_op(r, "chime_arm of the witness: %s", strerror(-r));
	/* Until the witness came, and 100 ms more: 10 s at most (a TSan chimed starts in about 1). */
	for (give_up = chime_now() + SETTLE_NS; !until || chime_now() < until;) {
		if (chime_now() >= give_up)
			fail("the witness timer (armed after chimed was killed) did not fire within 10 s");
		if ((n = chime_wait(c, ev, 8, 20)) < 0)
			fail_op(n, "chime_wait after the crash: %s", strerror(-n));
		for (int i = 0; i < n; i++) {
			if (ev[i].id == witness && !until)
				until = chime_now() + 100 * MS;
			else if (ev[i].id == id && !again++) {
				again_deadline = ev[i].deadline_ns;
				again_fired = ev[i].fired_ns;
			}
			else
				violation("an event for id %#llx, which is neither timer", (unsigned long long)ev[i].id);
		}
	}
	if (again)
		violation("a one-shot taken, then reset (which changes nothing then), fired again (%u time%s) "
			  "after chimed was stopped and killed, with the deadline %s (fired %.3f ms after it): "
			  "the next broker %s", again, again == 1 ? "" : "s",
			  again_deadline == armed_for ? "it was armed for" : again_deadline == reset_to ?
			  "of the reset" : "of neither", (double)(again_fired - again_deadline) / 1e6,
			  again_deadline == reset_to ? "applied the reset the old one never read before it settled "
			  "the events taken" : "delivered again an event the process had taken");
	chime_close(c);
	if ((r = chime_drop_session(&opts)) < 0)
		fail("chime_drop_session(%s): %s", session, strerror(-r));
	printf("tsan_api: crash after a take: the one-shot taken and then reset %s after the crash\n",
	       again ? "FIRED AGAIN" : "did not fire again");
}

int main(int argc, char **argv)
{
	const char *chimed = argc > 1 ? argv[1] : getenv("CHIMED");
	const char *ms = getenv("TSAN_API_MS");
	unsigned long run_ms = ms && *ms ? strtoul(ms, NULL, 10) : RUN_MS;
	uint64_t t0 = chime_now();
	char session[32], take_session[40], quoted[48];
	unsigned brokers, attached;

	prog = "tsan_api";
	chimectl_path = argc > 2 ? argv[2] : getenv("CHIMECTL");
	chimed_path = chimed;
	if (!chimed || !*chimed || !chimectl_path || !*chimectl_path) {
		fprintf(stderr, "usage: tsan_api CHIMED CHIMECTL (or $CHIMED, $CHIMECTL)\n");
		return 2;
	}
	/* The restart takes a TSan chimed a second or two; a session may try for 20. */
	setenv("CHIME_RECONNECT_S", "20", 0);
	if (run_ms == 0 || run_ms > 600000)
		run_ms = RUN_MS;
	run_ns = (uint64_t)run_ms * MS;
	cap = (uint32_t)run_ms * PER_MS;
	signal(SIGPIPE, SIG_IGN);
	if (!(tab = calloc((size_t)NREG * cap, sizeof(*tab))))
		fail("calloc: out of memory");
	start_broker();
	scenario(NULL);
	snprintf(session, sizeof(session), "tsan-api-%d", (int)getpid());
	scenario(session);
	snprintf(take_session, sizeof(take_session), "%s-take", session);
	crash_after_take(take_session);
	stop_broker();
	/*
	 * The session's connections: the first, then one to the broker after
	 * the restart and one to the broker after the crash (at least: a
	 * reconnect that failed its handshake tries again). Four brokers: the
	 * last after crash_after_take()'s kill.
	 */
	snprintf(quoted, sizeof(quoted), "session '%s'", session);
	brokers = log_lines(log_path, "listening on '", NULL);
	attached = log_lines(log_path, " connected: ", quoted);
	if (brokers != 4 || attached < 3)
		fail("chimed's log shows %u brokers and %u connections of %s: the restarts did not happen as "
		     "meant", brokers, attached, quoted);
	cleanup();
	free(tab);
	if (violations) {
		fprintf(stderr, "tsan_api: %llu violation(s)\n", (unsigned long long)violations);
		return 1;
	}
	printf("tsan_api: ok in %.1f s, no race reported (this process, chimed, chimectl): one chime_t, "
	       "%u producers, a spawner and two drainers taking turns; anonymous, then a session attached %u times to %u "
	       "brokers (chimectl restart, SIGKILL); a one-shot taken and reset, then SIGKILL: not fired again\n",
	       (double)(chime_now() - t0) / 1e9, NPROD, attached, brokers);
	return 0;
}
