/* SPDX-License-Identifier: MIT */
/*
 * tsan_dispatch.c CHIMED - chime_dispatch() under ThreadSanitizer, with
 * other threads arming, resetting and cancelling while it calls back.
 *
 * A plain program (criterion cannot run under TSan, ../shared/STYLE.md section 9):
 * exit 0 on success, 1 on a violated check; TSan exits 66 on a report
 * (halt_on_error, as tests/tsan_broker.sh sets it; the broker gets the same
 * options, and a race in it fails the test too).
 *
 * It starts its own chimed (argv[1], else $CHIMED) on a private socket in a
 * temporary directory, then runs one scenario on an anonymous connection
 * and one on a named session, each with one chime_t:
 *
 *  - 3 threads arm one-shot timers due 1-30 ms ahead and now and then
 *    cancel one they armed, or reset it to a later deadline (each timer
 *    has a key of its own, and a quarter of the cancels are
 *    chime_cancel_key());
 *  - the main thread drains with chime_fd() + epoll_wait() + chime_dispatch(),
 *    and its callback sometimes cancels or resets another live timer,
 *    picked from the shared table.
 *
 * Every timer's operations are serialized by a per-timer flag (the
 * callback only tries it), and each one is recorded before it is made,
 * with a stamp from one global counter taken when it started and when it
 * returned. user_data is the timer's index: an event can come before
 * chime_arm() has returned its id.
 *
 * The test orders nothing between the threads for TSan (tsan_harness.h):
 * its records, stamps and per-timer flags are relaxed atomics, so every
 * happens-before edge TSan sees between the arming threads' calls and the
 * drainer's is the library's own (or a thread's creation). The first
 * version kept them in a seq_cst counter and release/acquire records,
 * which ordered every arming thread's call before the drainer's next
 * stamp: a missing edge in the library was hidden behind the test's own.
 *
 * What is checked, as each event comes (the callback):
 *  - no timer fires twice, none early (fired_ns and the delivery both at or
 *    after deadline_ns), and the event's id is the one chime_arm() gave;
 *  - an operation counts as done before the event if the callback's own
 *    thread made it (always, in an earlier callback: chime.h promises it
 *    inside a callback), or if another thread's returned before the
 *    chime_dispatch() call began (its claim comes later). Another thread's
 *    operation that returned while a dispatch was under way may or may not
 *    have been seen by that event's claim, and is not judged;
 *  - if the last operation done before the event is a cancel, the event is
 *    a violation; else its deadline_ns must be that of the last operation
 *    done before it (the arm or a reset), or of an operation made after it
 *    that had started before the callback did: never an older deadline.
 * And once everything is due: every timer never cancelled fired exactly once.
 *
 * Each thread arms for 1.5 s per scenario ($TSAN_DISPATCH_MS to change it:
 * the tsan suite sets 6 s, so that chimed lives past its 10 s report of
 * refusals, which reads counters the shards write).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
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

#define NTHREADS   3u
#define MAXOPS     6u                   /* the arm and up to 5 resets or cancels per timer */
#define RUN_MS     1500u                /* how long each thread arms ($TSAN_DISPATCH_MS) */
#define PER_MS     20u                  /* timers a thread can arm per ms, at most */
#define MS         UINT64_C(1000000)
#define SETTLE_NS  (UINT64_C(10000) * 1000000u) /* after the last deadline: give up waiting */
#define GRACE_NS   (UINT64_C(150) * 1000000u)   /* then drain this long for late or double events */

enum { OP_ARM = 1, OP_RESET, OP_CANCEL };

/* One operation on a timer: filled before it is made, `ret` stamped once it returned. */
struct op {
	uint64_t deadline_ns;           /* ARM, RESET: the deadline asked for */
	uint64_t start;                 /* stamp before the call */
	uint64_t ret;                   /* atomic: stamp after the call returned; 0 meanwhile */
	uint32_t kind;
	uint32_t by_drainer;            /* made by the dispatch callback (the draining thread) */
};

/*
 * One timer. ops[0 .. nops) are written by whoever holds `busy`, then nops
 * (pub32(); readers sub32() it). Every field another thread reads is a
 * relaxed atomic (tsan_harness.h).
 */
struct tmr {
	uint64_t id;                    /* atomic: chime_arm()'s id; 0 until it returned */
	uint32_t busy;                  /* atomic: an operation on this timer is being made */
	uint32_t nops;                  /* atomic */
	uint32_t cancelled;             /* atomic: a cancel was made (no operation follows it) */
	uint32_t fired;                 /* atomic, written by the drainer: events received */
	struct op ops[MAXOPS];
};

static uint64_t run_ns;                 /* how long each thread arms */
static uint32_t cap;                    /* timers per thread and scenario, at most */
static struct tmr *tab;                 /* NTHREADS * cap */
static uint32_t armed[NTHREADS];        /* atomic: timers thread t armed (indices t * cap + i) */
static uint32_t workers_done;           /* atomic */
static uint64_t last_deadline;          /* atomic: the latest deadline asked for */
static uint64_t n_ops[2][4];            /* atomic: [by_drainer][kind] */
static uint64_t n_key_cancels;          /* atomic: cancels made as chime_cancel_key() */

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

static bool try_own(struct tmr *t)
{
	uint32_t zero = 0;
	bool got = __atomic_compare_exchange_n(&t->busy, &zero, 1, false, ORD_ACQ, __ATOMIC_RELAXED);

	CC_BARRIER();
	return got;
}

static void disown(struct tmr *t)
{
	pub32(&t->busy, 0);
}

/* Each timer has a key of its own: chime_cancel_key() cancels it alone. */
static uint64_t key_of(const struct tmr *t)
{
	return (uint64_t)(t - tab) + 1;
}

/*
 * Reset (to a later deadline) or cancel timer t (a quarter of the cancels
 * by its key), which the caller owns (`busy`): record, call, stamp. False
 * if nothing was done: not armed yet, cancelled, or enough operations.
 */
static bool operate(chime_t *c, struct tmr *t, uint64_t *seed, bool drainer)
{
	/* id first: it is published after the arm's record (ops[0], nops). */
	chime_id_t id = sub64(&t->id);
	uint32_t n = sub32(&t->nops);
	uint64_t now = chime_now();
	bool by_key = false;
	struct op *o;
	int r;

	if (!id || n >= MAXOPS || __atomic_load_n(&t->cancelled, __ATOMIC_RELAXED))
		return false;
	o = &t->ops[n];
	if (rnd(seed) % 3 == 0) {
		by_key = rnd(seed) % 4 == 0;
		WR(o->kind, (uint32_t)OP_CANCEL);
		WR(o->deadline_ns, 0);
		__atomic_store_n(&t->cancelled, 1, __ATOMIC_RELAXED);
	} else {
		uint64_t prev = RD(t->ops[n - 1].deadline_ns);

		WR(o->kind, (uint32_t)OP_RESET);
		WR(o->deadline_ns, (prev > now ? prev : now) + MS + rnd(seed) % (29 * MS));
		note_deadline(RD(o->deadline_ns));
	}
	WR(o->by_drainer, (uint32_t)drainer);
	WR(o->ret, 0);
	WR(o->start, stamp());
	pub32(&t->nops, n + 1);
	if (RD(o->kind) == OP_RESET)
		r = chime_reset(c, id, RD(o->deadline_ns));
	else if (by_key)
		r = chime_cancel_key(c, key_of(t));
	else
		r = chime_cancel(c, id);
	if (r < 0)
		fail_op(r, "chime_%s(%#llx) from the %s: %s",
			RD(o->kind) == OP_RESET ? "reset" : by_key ? "cancel_key" : "cancel",
			(unsigned long long)id, drainer ? "callback" : "arming thread", strerror(-r));
	__atomic_fetch_add(&n_key_cancels, by_key, __ATOMIC_RELAXED);
	WR(o->ret, stamp());
	__atomic_fetch_add(&n_ops[drainer][RD(o->kind)], 1, __ATOMIC_RELAXED);
	return true;
}

struct worker {
	chime_t *c;
	uint32_t t;
	uint64_t seed;
	pthread_t thread;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t end = chime_now() + run_ns;

	for (uint32_t i = 0; i < cap && chime_now() < end; i++) {
		uint32_t idx = w->t * cap + i;
		struct tmr *t = &tab[idx];
		chime_id_t id;
		uint64_t d;
		int r;

		/* Arm: recorded first (its event may come before chime_arm() returns). */
		d = chime_now() + MS + rnd(&w->seed) % (29 * MS);
		WR(t->ops[0].kind, (uint32_t)OP_ARM);
		WR(t->ops[0].deadline_ns, d);
		WR(t->ops[0].by_drainer, 0);
		WR(t->ops[0].ret, 0);
		WR(t->ops[0].start, stamp());
		note_deadline(d);
		pub32(&t->nops, 1);
		pub32(&armed[w->t], i + 1);
		r = chime_arm(w->c, key_of(t), d, 0, idx, &id);
		if (r < 0)
			fail_op(r, "chime_arm() in thread %u: %s", w->t, strerror(-r));
		pub64(&t->id, id);
		WR(t->ops[0].ret, stamp());
		__atomic_fetch_add(&n_ops[0][OP_ARM], 1, __ATOMIC_RELAXED);

		/* Now and then reset or cancel one of its own recent timers (fired or not). */
		if (rnd(&w->seed) % 2 == 0) {
			uint32_t back = (uint32_t)(rnd(&w->seed) % 64);
			struct tmr *o = &tab[w->t * cap + (back > i ? i : i - back)];

			while (!try_own(o))
				sched_yield();  /* the callback holds it for one call */
			(void)operate(w->c, o, &w->seed, false);
			disown(o);
		}
		if (rnd(&w->seed) % 4 == 0)
			pause_ns((long)(rnd(&w->seed) % 400000));
	}
	CC_BARRIER();
	__atomic_fetch_add(&workers_done, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* The draining thread's state (only it touches this). */
struct drain {
	chime_t *c;
	uint64_t seed;
	uint64_t dispatch_start;        /* stamp before the current chime_dispatch() call */
	uint64_t events, dispatches;
};

static const char *kind_name(uint32_t k)
{
	return k == OP_ARM ? "arm" : k == OP_RESET ? "reset" : "cancel";
}

static void judge(struct drain *d, const struct chime_event *e)
{
	uint64_t now = chime_now(), cb_start = stamp(), idx = e->user_data;
	struct tmr *t;
	chime_id_t id;
	uint32_t n, j = 0;
	bool ok = false;

	if (idx >= (uint64_t)NTHREADS * cap)
		fail("event for id %#llx carries user_data %llu, no timer of ours",
		     (unsigned long long)e->id, (unsigned long long)idx);
	t = &tab[idx];
	n = sub32(&t->nops);
	if (n == 0)
		fail("event for timer %llu, which was never armed", (unsigned long long)idx);
	id = sub64(&t->id);
	if (id && id != e->id)
		violation("timer %llu: event for id %#llx, but chime_arm() gave %#llx",
			  (unsigned long long)idx, (unsigned long long)e->id, (unsigned long long)id);
	if (__atomic_load_n(&t->fired, __ATOMIC_RELAXED))
		violation("timer %llu (id %#llx): a second event (deadline %llu)", (unsigned long long)idx,
			  (unsigned long long)e->id, (unsigned long long)e->deadline_ns);
	__atomic_store_n(&t->fired, __atomic_load_n(&t->fired, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	if (e->fired_ns < e->deadline_ns || now < e->deadline_ns)
		violation("timer %llu: early: deadline %llu, fired %llu, delivered %llu",
			  (unsigned long long)idx, (unsigned long long)e->deadline_ns,
			  (unsigned long long)e->fired_ns, (unsigned long long)now);

	/* The last operation done before this event's claim, as far as we can tell. */
	for (uint32_t i = 1; i < n; i++) {
		uint64_t r = RD(t->ops[i].ret);

		if (RD(t->ops[i].by_drainer) || (r && r < d->dispatch_start))
			j = i;
	}
	if (RD(t->ops[j].kind) == OP_CANCEL) {
		violation("timer %llu (id %#llx): event (deadline %llu) after chime_cancel() returned %s",
			  (unsigned long long)idx, (unsigned long long)e->id,
			  (unsigned long long)e->deadline_ns,
			  RD(t->ops[j].by_drainer) ? "in an earlier callback of this thread"
					       : "in another thread before this chime_dispatch() began");
		return;
	}
	for (uint32_t k = j; k < n && !ok; k++)
		ok = RD(t->ops[k].kind) != OP_CANCEL && RD(t->ops[k].start) < cb_start &&
		     RD(t->ops[k].deadline_ns) == e->deadline_ns;
	if (!ok) {
		char hist[512];
		int len = 0;

		for (uint32_t k = 0; k < n && len < (int)sizeof(hist) - 80; k++)
			len += snprintf(hist + len, sizeof(hist) - (size_t)len, " %s%s(%llu)[%llu..%llu]",
					RD(t->ops[k].by_drainer) ? "cb:" : "", kind_name(RD(t->ops[k].kind)),
					(unsigned long long)RD(t->ops[k].deadline_ns),
					(unsigned long long)RD(t->ops[k].start),
					(unsigned long long)RD(t->ops[k].ret));
		violation("timer %llu (id %#llx): event with deadline %llu, but the last operation done "
			  "before it was %s(%llu) (dispatch began at stamp %llu, callback at %llu; "
			  "history, [started..returned]:%s)",
			  (unsigned long long)idx, (unsigned long long)e->id,
			  (unsigned long long)e->deadline_ns, kind_name(RD(t->ops[j].kind)),
			  (unsigned long long)RD(t->ops[j].deadline_ns), (unsigned long long)d->dispatch_start,
			  (unsigned long long)cb_start, hist);
	}
}

/* Now and then cancel or reset another live timer, from inside the callback. */
static void meddle(struct drain *d)
{
	uint32_t w = (uint32_t)(rnd(&d->seed) % NTHREADS);
	uint32_t na = sub32(&armed[w]), back;
	struct tmr *t;

	if (na == 0)
		return;
	back = (uint32_t)(rnd(&d->seed) % 128);
	t = &tab[w * cap + (back >= na ? 0 : na - 1 - back)];
	if (__atomic_load_n(&t->fired, __ATOMIC_RELAXED) || !try_own(t))
		return;         /* fired (we know: we are the drainer), or an arming thread is at it */
	(void)operate(d->c, t, &d->seed, true);
	disown(t);
}

static void on_event(const struct chime_event *e, void *arg)
{
	struct drain *d = arg;

	d->events++;
	judge(d, e);
	if (rnd(&d->seed) % 3 == 0)
		meddle(d);
}

/* How many timers never cancelled have not fired; the first one in *missing. */
static uint32_t unfired(uint32_t *missing)
{
	uint32_t n = 0;

	for (uint32_t w = 0; w < NTHREADS; w++) {
		uint32_t na = sub32(&armed[w]);

		for (uint32_t i = 0; i < na; i++) {
			struct tmr *t = &tab[w * cap + i];

			if (!__atomic_load_n(&t->cancelled, __ATOMIC_RELAXED) &&
			    !__atomic_load_n(&t->fired, __ATOMIC_RELAXED) && n++ == 0)
				*missing = w * cap + i;
		}
	}
	return n;
}

/* epoll_wait() on chime_fd(), then chime_dispatch() until it returns 0. */
static void drain_once(struct drain *d, int ep, int timeout_ms)
{
	struct epoll_event ev;
	int n = epoll_wait(ep, &ev, 1, timeout_ms), r;

	if (n < 0 && errno != EINTR)
		fail("epoll_wait: %s", strerror(errno));
	if (n <= 0)
		return;
	do {
		d->dispatch_start = stamp();
		r = chime_dispatch(d->c, on_event, d, 0);
		if (r < 0)
			fail_op(r, "chime_dispatch: %s", strerror(-r));
		d->dispatches++;
	} while (r > 0);
}

static void scenario(const char *session)
{
	struct chime_opts opts = { .socket_path = sock_path, .session = session };
	struct worker w[NTHREADS];
	struct drain d = { .seed = (uint64_t)chime_now() | 1 };
	struct epoll_event ev = { .events = EPOLLIN };
	uint64_t give_up = 0, quiet_until = 0, next_check = 0;
	uint64_t fired = 0, cancelled = 0, cancelled_fired = 0, armed_n = 0;
	uint32_t missing = 0, left;
	int ep, fd, r;

	scenario_name = session ? "session" : "anonymous";
	memset(tab, 0, sizeof(*tab) * NTHREADS * cap);
	memset(armed, 0, sizeof(armed));
	memset(n_ops, 0, sizeof(n_ops));
	n_key_cancels = 0;
	workers_done = 0;
	last_deadline = 0;
	if ((r = chime_open(&d.c, &opts)) < 0)
		fail("chime_open(%s%s): %s", session ? "session " : "anonymous", session ? session : "",
		     strerror(-r));
	if ((fd = chime_fd(d.c)) < 0)
		fail("chime_fd: %s", strerror(-fd));
	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		fail("epoll on chime_fd(): %s", strerror(errno));
	for (uint32_t t = 0; t < NTHREADS; t++) {
		w[t] = (struct worker){ .c = d.c, .t = t, .seed = d.seed * (t + 7) | 1 };
		if ((r = pthread_create(&w[t].thread, NULL, worker_main, &w[t])) != 0)
			fail("pthread_create: %s", strerror(r));
	}
	for (;;) {
		uint64_t now;

		drain_once(&d, ep, 5);
		now = chime_now();
		if (now >= next_check) {
			broker_alive();
			next_check = now + 50 * MS;
		}
		if (sub32(&workers_done) < NTHREADS)
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

			violation("%u timers never cancelled did not fire; the first: timer %u (id %#llx, "
				  "last %s to %llu, now %llu)", left, missing,
				  (unsigned long long)RD(t->id), kind_name(RD(t->ops[n - 1].kind)),
				  (unsigned long long)RD(t->ops[n - 1].deadline_ns), (unsigned long long)now);
			break;
		}
	}
	for (uint32_t t = 0; t < NTHREADS; t++)
		pthread_join(w[t].thread, NULL);
	close(ep);
	chime_close(d.c);

	for (uint32_t t = 0; t < NTHREADS; t++) {
		armed_n += armed[t];
		for (uint32_t i = 0; i < armed[t]; i++) {
			struct tmr *tm = &tab[t * cap + i];

			fired += tm->fired != 0;
			cancelled += tm->cancelled;
			cancelled_fired += tm->cancelled && tm->fired;
		}
	}
	printf("tsan_dispatch: %s: %llu timers armed by %u threads; resets %llu (callback %llu), "
	       "cancels %llu (callback %llu, by key %llu); %llu fired, %llu cancelled (%llu of them fired: "
	       "the cancel came too late); %llu dispatches, %llu events\n",
	       session ? "session" : "anonymous", (unsigned long long)armed_n, NTHREADS,
	       (unsigned long long)(n_ops[0][OP_RESET] + n_ops[1][OP_RESET]),
	       (unsigned long long)n_ops[1][OP_RESET],
	       (unsigned long long)(n_ops[0][OP_CANCEL] + n_ops[1][OP_CANCEL]),
	       (unsigned long long)n_ops[1][OP_CANCEL], (unsigned long long)n_key_cancels,
	       (unsigned long long)fired,
	       (unsigned long long)cancelled, (unsigned long long)cancelled_fired,
	       (unsigned long long)d.dispatches, (unsigned long long)d.events);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char *chimed = argc > 1 ? argv[1] : getenv("CHIMED");
	const char *ms = getenv("TSAN_DISPATCH_MS");
	unsigned long run_ms = ms && *ms ? strtoul(ms, NULL, 10) : RUN_MS;
	char session[32];

	prog = "tsan_dispatch";
	if (!chimed || !*chimed) {
		fprintf(stderr, "usage: tsan_dispatch CHIMED (or $CHIMED)\n");
		return 2;
	}
	/* Nothing here restarts chimed: a session that lost it need not try for 30 s. */
	setenv("CHIME_RECONNECT_S", "2", 0);
	if (run_ms == 0 || run_ms > 600000)
		run_ms = RUN_MS;
	run_ns = (uint64_t)run_ms * MS;
	cap = (uint32_t)run_ms * PER_MS;
	signal(SIGPIPE, SIG_IGN);
	if (!(tab = calloc((size_t)NTHREADS * cap, sizeof(*tab))))
		fail("calloc: out of memory");
	chimed_path = chimed;
	start_broker();
	scenario(NULL);
	snprintf(session, sizeof(session), "tsan-dispatch-%d", (int)getpid());
	scenario(session);
	stop_broker();
	cleanup();
	free(tab);
	if (violations) {
		fprintf(stderr, "tsan_dispatch: %llu violation(s)\n", (unsigned long long)violations);
		return 1;
	}
	printf("tsan_dispatch: ok, no race reported (this process and chimed)\n");
	return 0;
}
