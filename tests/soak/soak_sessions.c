/* SPDX-License-Identifier: MIT */
/*
 * soak_sessions.c - a reliability soak of named sessions across broker
 * restarts and crashes (not a unit test: run by hand, see usage()).
 *
 * A supervisor starts a private chimed, keeps NSESS session processes
 * alive (each arms, resets, cancels and submits from 1-2 threads, drains
 * with chime_wait, chime_poll, chime_dispatch or chime_fd + poll, pauses
 * long enough for the broker to rest, then bursts; and ends with
 * chime_close, _exit or SIGKILL, to be followed by the session's next
 * process), and restarts the broker at random moments (chimectl restart,
 * SIGTERM, SIGKILL; SIGKILL and then each next broker killed, or stopped,
 * 0-40 ms into its start, its restore, 1-3 times; a SIGKILL 0-150 ms into
 * a chimectl restart's handover; two chimectl restarts in a row; two
 * SIGUSR2 0-60 ms apart; during its rest, just after a burst, or anywhere).
 * Every call and every event taken goes into one log in shared memory,
 * numbered by one atomic counter (so its order agrees with real time);
 * at the end a final process of each session cancels its periodics and
 * drains, and the log is checked against chime's promises:
 *   - a returned arm is never lost; a refused arm never fires;
 *   - nothing fires early;
 *   - no event for an id is taken by a drain that began after its
 *     cancel (or a cancel_key of its key) returned;
 *   - a one-shot comes once, at its last deadline (a drain overlapping a
 *     reset may see either); a periodic gives each period once;
 *   - except where chime_open(3) allows it: an event taken shortly before
 *     a broker SIGKILL by a process that did not live to resume may come
 *     again, and a process that died without chime_close() may lose its
 *     last calls to a broker SIGKILL.
 * On a violation the directory in /dev/shm is kept with the broker's log
 * and the call log (log.txt, ev.txt).
 *
 * Build (from the top of the tree, after ninja -C build):
 *   gcc -O1 -g -std=gnu11 -Wall -Wextra -I libclient/include -I libclient -I shm \
 *       -o /tmp/soak_sessions tests/soak/soak_sessions.c -L build/libclient -lchime -lpthread
 * Run: CHIMED=build/broker/chimed CHIMECTL=build/tools/chimectl LD_LIBRARY_PATH=build/libclient \
 *       nice /tmp/soak_sessions 300 [SEED]
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"
#include "client.h"         /* c->reconnects: did this process resume after a crash */

#define MS       1000000ull
#define NSESS    3
#define MAXU     (1u << 20)         /* timers per session */
#define MAXLOG   (1u << 25)
#define MAXPROC  100000
#define MAXP_TH  8                  /* live periodics per thread */
#define INF      UINT64_MAX

enum {
	L_ARM_B = 1, L_ARM_E, L_RESET_B, L_RESET_E, L_CANCEL_B, L_CANCEL_E, L_CK_B, L_CK_E,
	L_SUB_B, L_SUBOP, L_SUB_E, L_SUBRES, L_DRAIN_B, L_EV, L_PROC_START, L_PROC_OPEN,
	L_PROC_END, L_RESUMED, L_BROKER_DOWN, L_BROKER_GONE, L_BROKER_UP, L_ERR, L_BURST_END,
};
enum { END_CLOSE, END_EXIT, END_KILL };
/*
 * How the broker goes: chimectl restart, SIGTERM, SIGKILL; SIGKILL, then
 * each next broker killed (or stopped) during its start-up 1-3 times;
 * chimectl restart with a SIGKILL during its handover (the park, the
 * exec or the new broker's restore); two chimectl restarts in a row; a
 * SIGUSR2 and a second one 0-60 ms later, which cuts the park short or
 * restarts the new broker.
 */
enum { K_CTL, K_TERM, K_KILL, K_KILL_START, K_CTL_KILL, K_CTL_TWICE, K_USR2_TWICE, NKIND };

struct ent {
	_Atomic uint32_t type;
	uint16_t sess;
	uint16_t pad;
	uint32_t pidx;
	int32_t res;
	uint64_t u, id, a, b, tok, ns;
};
_Static_assert(sizeof(struct ent) == 64, "64 B");

struct tinfo {
	uint64_t key, d0, period;
	_Atomic uint64_t id;
};

struct shared {
	_Atomic uint64_t nlog;
	_Atomic uint64_t next_u[NSESS];
	_Atomic uint64_t next_pidx;
	_Atomic uint64_t last_burst_ns;
	_Atomic int final;
	_Atomic uint64_t quiet_until;       /* the supervisor wants the broker at rest */
	char sock[256];
	struct tinfo tab[NSESS][MAXU];
	struct ent log[MAXLOG];
};

static struct shared *G;
static uint32_t my_pidx;
static int my_sess;
static uint64_t seed0;

static uint64_t rnd(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rr(uint64_t *s, uint64_t lo, uint64_t hi)  /* [lo, hi] */
{
	return lo + rnd(s) % (hi - lo + 1);
}

static uint64_t L(uint32_t type, uint64_t u, uint64_t id, uint64_t a, uint64_t b, uint64_t tok, int32_t res)
{
	uint64_t seq = atomic_fetch_add(&G->nlog, 1);
	struct ent *e;

	if (seq >= MAXLOG)
		return seq;
	e = &G->log[seq];
	e->sess = (uint16_t)my_sess;
	e->pidx = my_pidx;
	e->res = res;
	e->u = u;
	e->id = id;
	e->a = a;
	e->b = b;
	e->tok = tok;
	e->ns = chime_now();
	atomic_store_explicit(&e->type, type, memory_order_release);
	return seq;
}

/* ------------------------------------------------------------------ worker */

struct worker {
	chime_t *c;
	int sess;
	_Atomic int stop;
	int nthreads;
};

struct prod {
	struct worker *w;
	int tid;
	uint64_t rng;
	uint64_t group;                 /* current one-shot key group */
	uint64_t groups[64];            /* groups armed, not yet cancelled by key */
	unsigned ngroups;
	uint64_t per[MAXP_TH];          /* live periodics (u) */
	unsigned nper;
};

static uint64_t pkey(int sess)
{
	return 0xfeed000000000000ull | (uint64_t)sess;
}

static uint64_t group_key(struct prod *p, uint64_t g)
{
	return 1 + (((uint64_t)my_pidx << 24) | ((uint64_t)p->tid << 20) | (g & 0xfffff));
}

static uint64_t new_u(int sess)
{
	uint64_t u = atomic_fetch_add(&G->next_u[sess], 1);

	if (u >= MAXU) {
		fprintf(stderr, "soak: out of timer slots\n");
		_exit(9);
	}
	return u;
}

static void bad(const char *what, int r)
{
	L(L_ERR, 0, 0, 0, 0, 0, r);
	fprintf(stderr, "soak[%u]: %s: %s\n", my_pidx, what, strerror(-r));
}

static bool arm_ok(int r)
{
	return r == 0 || r == -ENOMEM || r == -EDQUOT;
}

static uint64_t oneshot_deadline(struct prod *p)
{
	uint64_t x = rnd(&p->rng) % 100;
	uint64_t now = chime_now();

	if (x < 40)
		return now + rr(&p->rng, 1, 50) * MS;
	if (x < 80)
		return now + rr(&p->rng, 50, 1000) * MS;
	if (x < 97)
		return now + rr(&p->rng, 1000, 6000) * MS;
	return now - rr(&p->rng, 0, 50) * MS;    /* in the past: fires at once */
}

static void do_arm(struct prod *p, bool periodic)
{
	int sess = p->w->sess;
	uint64_t u = new_u(sess), seq;
	struct tinfo *t = &G->tab[sess][u];
	chime_id_t id = 0;
	int r;

	if (periodic) {
		t->key = pkey(sess);
		t->period = rr(&p->rng, 20, 400) * MS;
		t->d0 = chime_now() + rr(&p->rng, 0, 200) * MS;
	} else {
		t->key = group_key(p, p->group);
		t->period = 0;
		t->d0 = oneshot_deadline(p);
	}
	seq = L(L_ARM_B, u, 0, 0, 0, 0, 0);
	r = chime_arm(p->w->c, t->key, t->d0, t->period, u, &id);
	L(L_ARM_E, u, r ? 0 : id, 0, 0, seq, r);
	if (!arm_ok(r)) {
		bad("chime_arm", r);
		return;
	}
	if (r == 0) {
		atomic_store(&t->id, id);
		if (periodic)
			p->per[p->nper++] = u;
	}
}

/* A known timer of this session, any process's (ids from earlier processes too). */
static bool pick(struct prod *p, uint64_t *u, chime_id_t *id)
{
	uint64_t n = atomic_load(&G->next_u[p->w->sess]);

	if (!n)
		return false;
	for (int tries = 0; tries < 4; tries++) {
		uint64_t back = rnd(&p->rng) % 4 ? rr(&p->rng, 1, 300) : rr(&p->rng, 1, 5000);

		*u = back > n ? 0 : n - back;
		*id = atomic_load(&G->tab[p->w->sess][*u].id);
		if (*id && G->tab[p->w->sess][*u].key != pkey(p->w->sess))
			return true;
	}
	return false;
}

static void do_reset(struct prod *p, uint64_t u, chime_id_t id, uint64_t d)
{
	uint64_t seq = L(L_RESET_B, u, id, d, 0, 0, 0);
	int r = chime_reset(p->w->c, id, d);

	L(L_RESET_E, u, id, d, 0, seq, r);
	if (r)
		bad("chime_reset", r);
}

static void do_cancel(struct prod *p, uint64_t u, chime_id_t id)
{
	uint64_t seq = L(L_CANCEL_B, u, id, 0, 0, 0, 0);
	int r = chime_cancel(p->w->c, id);

	L(L_CANCEL_E, u, id, 0, 0, seq, r);
	if (r)
		bad("chime_cancel", r);
}

static void do_cancel_key(struct prod *p)
{
	unsigned i;
	uint64_t key, seq;
	int r;

	if (!p->ngroups)
		return;
	i = (unsigned)(rnd(&p->rng) % p->ngroups);
	key = group_key(p, p->groups[i]);
	p->groups[i] = p->groups[--p->ngroups];
	seq = L(L_CK_B, 0, 0, key, 0, 0, 0);
	r = chime_cancel_key(p->w->c, key);
	L(L_CK_E, 0, 0, key, 0, seq, r);
	if (r)
		bad("chime_cancel_key", r);
}

static void new_group(struct prod *p)
{
	if (p->ngroups == 64)
		p->groups[rnd(&p->rng) % 64] = p->group;
	else
		p->groups[p->ngroups++] = p->group;
	p->group++;
}

/* A batch: arms of a fresh key, maybe its CANCEL_KEY and arms after it, resets and cancels of others. */
static void do_submit(struct prod *p)
{
	struct chime_op ops[40];
	uint64_t us[40];
	unsigned n = 0, n1 = (unsigned)rr(&p->rng, 1, 12), n2 = 0;
	bool ck = rnd(&p->rng) % 2;
	int sess = p->w->sess;
	uint64_t key, seq;
	int r;

	p->group++;
	key = group_key(p, p->group);
	if (ck)
		n2 = (unsigned)rr(&p->rng, 0, 8);
	for (unsigned k = 0; k < n1 + n2 + (ck ? 1 : 0); k++) {
		struct chime_op *o = &ops[n];

		memset(o, 0, sizeof(*o));
		us[n] = 0;
		if (ck && k == n1) {
			o->op = CHIME_CANCEL_KEY;
			o->key = key;
		} else {
			uint64_t u = new_u(sess);
			struct tinfo *t = &G->tab[sess][u];

			t->key = key;
			t->period = 0;
			t->d0 = oneshot_deadline(p);
			o->op = CHIME_ARM;
			o->key = key;
			o->deadline_ns = t->d0;
			o->user_data = u;
			us[n] = u;
		}
		n++;
		if (rnd(&p->rng) % 4 == 0 && n < 38) {
			uint64_t u;
			chime_id_t id;

			if (pick(p, &u, &id)) {
				o = &ops[n];
				memset(o, 0, sizeof(*o));
				o->id = id;
				us[n] = u;
				if (rnd(&p->rng) % 2) {
					o->op = CHIME_RESET;
					o->deadline_ns = chime_now() + rr(&p->rng, 1, 3000) * MS;
				} else {
					o->op = CHIME_CANCEL;
				}
				n++;
			}
		}
	}
	seq = L(L_SUB_B, 0, 0, n, 0, 0, 0);
	for (unsigned i = 0; i < n; i++)
		L(L_SUBOP, us[i], ops[i].id, ops[i].op == CHIME_CANCEL_KEY ? ops[i].key : ops[i].deadline_ns,
		  ((uint64_t)ops[i].op << 32) | i, seq, 0);
	r = chime_submit(p->w->c, ops, n);
	L(L_SUB_E, 0, 0, n, 0, seq, r);
	for (unsigned i = 0; i < n; i++) {
		if (ops[i].op == CHIME_ARM && ops[i].result == 0)
			atomic_store(&G->tab[sess][us[i]].id, ops[i].id);
		L(L_SUBRES, us[i], ops[i].op == CHIME_ARM ? ops[i].id : 0, 0, ((uint64_t)ops[i].op << 32) | i, seq,
		  ops[i].result);
		if (ops[i].result && !(ops[i].op == CHIME_ARM && arm_ok(ops[i].result)))
			bad("chime_submit op", ops[i].result);
	}
	if (r < 0)
		bad("chime_submit", r);
	if (!ck) {
		/* a later cancel_key of it may come */
		p->group--;
		new_group(p);
	} else {
		p->group++;
	}
}

static void sleep_ms(uint64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static void *producer(void *arg)
{
	struct prod *p = arg;

	while (!atomic_load(&p->w->stop)) {
		if (chime_now() < atomic_load(&G->quiet_until)) {
			while (p->nper) {
				uint64_t u = p->per[--p->nper];

				do_cancel(p, u, atomic_load(&G->tab[p->w->sess][u].id));
			}
			while (chime_now() < atomic_load(&G->quiet_until) && !atomic_load(&p->w->stop))
				sleep_ms(20);
			continue;
		}
		unsigned nops = (unsigned)(rnd(&p->rng) % 3 ? rr(&p->rng, 5, 60) : rr(&p->rng, 60, 400));

		for (unsigned i = 0; i < nops && !atomic_load(&p->w->stop); i++) {
			uint64_t x = rnd(&p->rng) % 100, u;
			chime_id_t id;

			if (x < 40) {
				do_arm(p, false);
				if (rnd(&p->rng) % 16 == 0)
					new_group(p);
			} else if (x < 44) {
				if (p->nper < MAXP_TH)
					do_arm(p, true);
			} else if (x < 62) {
				if (pick(p, &u, &id))
					do_reset(p, u, id, chime_now() + rr(&p->rng, 1, 3000) * MS);
			} else if (x < 64) {
				if (p->nper) {  /* a periodic: its reset starts a new series */
					unsigned k = (unsigned)(rnd(&p->rng) % p->nper);

					u = p->per[k];
					do_reset(p, u, atomic_load(&G->tab[p->w->sess][u].id),
						 chime_now() + rr(&p->rng, 0, 300) * MS);
				}
			} else if (x < 76) {
				if (pick(p, &u, &id))
					do_cancel(p, u, id);
			} else if (x < 79) {
				if (p->nper) {
					unsigned k = (unsigned)(rnd(&p->rng) % p->nper);

					u = p->per[k];
					p->per[k] = p->per[--p->nper];
					do_cancel(p, u, atomic_load(&G->tab[p->w->sess][u].id));
				}
			} else if (x < 83) {
				do_cancel_key(p);
			} else if (x < 93) {
				do_submit(p);
			} else {
				sleep_ms(rr(&p->rng, 0, 3));
			}
		}
		atomic_store(&G->last_burst_ns, chime_now());
		L(L_BURST_END, 0, 0, 0, 0, 0, 0);
		if (rnd(&p->rng) % 3 == 0) {
			uint64_t u;

			/* a long pause: maybe without periodics, so that the broker rests */
			if (rnd(&p->rng) % 2)
				while (p->nper) {
					u = p->per[--p->nper];
					do_cancel(p, u, atomic_load(&G->tab[p->w->sess][u].id));
				}
			for (uint64_t t = rr(&p->rng, 1200, 3500); t && !atomic_load(&p->w->stop); t -= t > 50 ? 50 : t)
				sleep_ms(t > 50 ? 50 : t);
		} else {
			sleep_ms(rr(&p->rng, 0, 300));
		}
	}
	return NULL;
}

struct drainer {
	struct worker *w;
	uint64_t tok;
	uint64_t reconnects;
};

static void on_event(const struct chime_event *ev, void *arg)
{
	struct drainer *d = arg;

	L(L_EV, ev->user_data, ev->id, ev->deadline_ns, ev->fired_ns, d->tok, 0);
}

/* One drain in the given mode; returns its result (events, or a negative errno). */
static int drain_once(struct drainer *d, int mode, uint64_t *rng)
{
	struct chime_event ev[64];
	unsigned max = (unsigned)rr(rng, 1, 64);
	chime_t *c = d->w->c;
	uint64_t rc = __atomic_load_n(&c->reconnects, __ATOMIC_RELAXED);
	int r;

	/*
	 * A producer thread's call may have reconnected since the last drain:
	 * logged after this drain's events, that resume looked like one that
	 * told the next broker they were taken, and the dead one's events
	 * taken here, again from the broker after, a violation.
	 */
	if (rc != d->reconnects) {
		d->reconnects = rc;
		L(L_RESUMED, 0, 0, rc, 0, 0, 0);
	}
	d->tok = L(L_DRAIN_B, 0, 0, 0, 0, 0, 0);
	switch (mode) {
	case 0:
		r = chime_wait(c, ev, max, (int)rr(rng, 0, 60));
		break;
	case 1:
		r = chime_poll(c, ev, max);
		break;
	case 2:
		return chime_dispatch(c, on_event, d, max);
	default: {
		struct pollfd pfd = { .fd = chime_fd(c), .events = POLLIN };

		(void)poll(&pfd, 1, (int)rr(rng, 0, 60));
		d->tok = L(L_DRAIN_B, 0, 0, 0, 0, 0, 0);
		r = chime_poll(c, ev, max);
		break;
	}
	}
	for (int i = 0; i < r; i++)
		L(L_EV, ev[i].user_data, ev[i].id, ev[i].deadline_ns, ev[i].fired_ns, d->tok, 0);
	return r;
}

static void worker_run(int sess, bool final)
{
	struct worker w = { .sess = sess };
	struct chime_opts o = { .socket_path = G->sock };
	char name[16];
	uint64_t rng = seed0 ^ ((uint64_t)my_pidx << 32) ^ chime_now();
	uint64_t life_ns, t0, until_pause = 0;
	int end = (int)(rnd(&rng) % 3), mode = (int)(rnd(&rng) % 4), r;
	struct prod prods[2];
	pthread_t th[2];
	struct drainer d = { .w = &w };

	snprintf(name, sizeof(name), "soak%d", sess);
	o.session = name;
	L(L_PROC_START, 0, 0, (uint64_t)getpid(), final, 0, 0);
	t0 = chime_now();
	for (;;) {
		r = chime_open(&w.c, &o);
		if (r == 0)
			break;
		if (r != -EBUSY && r != -ECONNREFUSED && r != -ENOENT && r != -ETIMEDOUT && r != -ECONNRESET) {
			bad("chime_open", r);
			_exit(3);
		}
		if (chime_now() - t0 > 60000 * MS) {
			bad("chime_open for 60 s", r);
			_exit(3);
		}
		sleep_ms(rr(&rng, 1, 30));
	}
	L(L_PROC_OPEN, 0, 0, (uint64_t)mode, (uint64_t)end, 0, 0);
	if (mode == 3 && chime_fd(w.c) < 0)
		mode = 1;
	if (final) {
		uint64_t seq = L(L_CK_B, 0, 0, pkey(sess), 0, 0, 0);

		r = chime_cancel_key(w.c, pkey(sess));
		L(L_CK_E, 0, 0, pkey(sess), 0, seq, r);
		if (r)
			bad("final cancel_key", r);
		t0 = chime_now();
		while (chime_now() - t0 < 9000 * MS) {
			r = drain_once(&d, (int)(rnd(&rng) % 4), &rng);
			if (r < 0) {
				bad("final drain", r);
				_exit(4);
			}
		}
		chime_close(w.c);
		L(L_PROC_END, 0, 0, END_CLOSE, 0, 0, 0);
		_exit(0);
	}
	w.nthreads = 1 + (int)(rnd(&rng) % 2);
	for (int i = 0; i < w.nthreads; i++) {
		memset(&prods[i], 0, sizeof(prods[i]));
		prods[i].w = &w;
		prods[i].tid = i;
		prods[i].rng = rng ^ (uint64_t)(i + 1) * 0x1234567ull;
		pthread_create(&th[i], NULL, producer, &prods[i]);
	}
	life_ns = rr(&rng, 1000, 15000) * MS;
	t0 = chime_now();
	d.reconnects = __atomic_load_n(&w.c->reconnects, __ATOMIC_RELAXED);
	for (;;) {
		uint64_t now = chime_now(), rc;

		if (now - t0 > life_ns || atomic_load(&G->final))
			break;
		if (now < until_pause) {
			sleep_ms(5);
			continue;
		}
		if (rnd(&rng) % 500 == 0)      /* leave events in the ring for a while */
			until_pause = now + rr(&rng, 50, 700) * MS;
		r = drain_once(&d, mode, &rng);
		if (r < 0) {
			bad("drain", r);
			_exit(5);
		}
		rc = __atomic_load_n(&w.c->reconnects, __ATOMIC_RELAXED);
		if (rc != d.reconnects) {
			d.reconnects = rc;
			L(L_RESUMED, 0, 0, rc, 0, 0, 0);
		}
		if (r == 0 && (mode == 1 || mode == 2))
			sleep_ms(rr(&rng, 0, 3));
	}
	if (atomic_load(&G->final))
		end = END_CLOSE;
	if (end == END_CLOSE) {
		atomic_store(&w.stop, 1);
		for (int i = 0; i < w.nthreads; i++)
			pthread_join(th[i], NULL);
		if (rnd(&rng) % 2) {    /* take what is there first, or leave it for the next process */
			while ((r = drain_once(&d, 1, &rng)) > 0)
				;
		}
		chime_close(w.c);
		L(L_PROC_END, 0, 0, END_CLOSE, 0, 0, 0);
		_exit(0);
	}
	L(L_PROC_END, 0, 0, (uint64_t)end, 0, 0, 0);
	if (end == END_EXIT)
		_exit(0);
	kill(getpid(), SIGKILL);
	_exit(0);
}

/* -------------------------------------------------------------- supervisor */

static const char *chimed_path, *chimectl_path, *chimestat_path, *extra_args;
static char dir[128];
static pid_t broker_pid;
static unsigned broker_n;

static const struct chime_ctl *ctl_map(void)
{
	static struct chime_ctl c;
	char path[300];
	int fd;

	snprintf(path, sizeof(path), "%s.ctl", G->sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (pread(fd, &c, sizeof(c), 0) != (ssize_t)sizeof(c)) {
		close(fd);
		return NULL;
	}
	close(fd);
	return &c;
}

static bool broker_running(pid_t pid)
{
	const struct chime_ctl *c = ctl_map();

	return c && c->pid == pid && c->state == CHIME_BROKER_RUNNING;
}

static pid_t broker_spawn(void)
{
	char cmd[1024], logp[300];
	pid_t p;

	snprintf(logp, sizeof(logp), "%s/broker.log", dir);
	snprintf(cmd, sizeof(cmd), "exec nice '%s' --foreground --socket '%s' %s 2>>'%s'", chimed_path, G->sock,
		 extra_args, logp);
	p = fork();
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	return p;
}

static void broker_start(void)
{
	uint64_t t0 = chime_now();
	pid_t p = broker_spawn();

	broker_pid = p;
	broker_n++;
	while (!broker_running(p)) {
		int st;

		if (waitpid(p, &st, WNOHANG) == p) {
			fprintf(stderr, "soak: chimed exited during start-up (%#x); see %s/broker.log\n", st, dir);
			exit(2);
		}
		if (chime_now() - t0 > 20000 * MS) {
			fprintf(stderr, "soak: chimed did not start in 20 s\n");
			exit(2);
		}
		usleep(1000);
	}
	my_pidx = 0;
	L(L_BROKER_UP, 0, 0, (uint64_t)p, 0, 0, 0);
}

static void chimectl_restart(void)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' restart >/dev/null 2>>'%s/chimectl.log'", chimectl_path,
		 G->sock, dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "soak: chimectl restart failed (see %s/chimectl.log)\n", dir);
		L(L_ERR, 0, 0, 1, 0, 0, -EIO);
	}
}

/* SIGKILL (or SIGTERM) the broker, logged first (the checker's allowances count from a kill), and reap it. */
static void broker_kill(int sig)
{
	int kind = sig == SIGKILL ? K_KILL : K_TERM, st;

	L(L_BROKER_DOWN, 0, 0, (uint64_t)kind, 0, 0, 0);
	kill(broker_pid, sig);
	waitpid(broker_pid, &st, 0);
	L(L_BROKER_GONE, 0, 0, (uint64_t)kind, 0, 0, 0);
}

static unsigned n_kind[NKIND], n_when[3], n_start_kills, n_start_kills_early;

static void broker_bounce(uint64_t *rng, uint64_t end_ns)
{
	int kind = (int)(rnd(rng) % NKIND), when = (int)(rnd(rng) % 3), st;
	uint64_t t0 = chime_now();

	if (when == 1 && end_ns - t0 < 12000 * MS)
		when = 0;       /* waiting for a rest would overrun the run */
	if (when == 1) {        /* during its rest */
		const struct chime_ctl *c;

		atomic_store(&G->quiet_until, chime_now() + 12000 * MS);
		while ((c = ctl_map()) && c->beat_ms != 450 && chime_now() - t0 < 11000 * MS)
			usleep(2000);
		if (!c || c->beat_ms != 450)
			when = 0;
		else
			usleep((useconds_t)rr(rng, 0, 400) * 1000);
		atomic_store(&G->quiet_until, 0);
	} else if (when == 2) { /* just after a burst */
		uint64_t b = atomic_load(&G->last_burst_ns);

		while (atomic_load(&G->last_burst_ns) == b && chime_now() - t0 < 6000 * MS)
			usleep(200);
		usleep((useconds_t)rr(rng, 0, 20000));
	}
	n_kind[kind]++;
	n_when[when]++;
	if (kind == K_KILL_START) {
		/*
		 * Each next broker killed 0-40 ms into its start (its restore, or
		 * just after), or stopped then (SIGTERM, which it takes once
		 * running): a crash loop, a stop right after a start.
		 */
		broker_kill(SIGKILL);
		for (unsigned k = 0, nk = (unsigned)rr(rng, 1, 3); k < nk; k++) {
			int sig = rnd(rng) % 4 ? SIGKILL : SIGTERM;

			broker_pid = broker_spawn();
			broker_n++;
			usleep((useconds_t)rr(rng, 0, 40000));
			n_start_kills++;
			n_start_kills_early += !broker_running(broker_pid);
			broker_kill(sig);
		}
		broker_start();
		return;
	}
	if (kind == K_CTL_KILL) {
		/* chimectl restart, and a SIGKILL somewhere in the handover */
		pid_t ctl = fork();

		if (ctl == 0) {
			int null = open("/dev/null", O_WRONLY);

			dup2(null, 1);
			dup2(null, 2);
			execl(chimectl_path, "chimectl", "--socket", G->sock, "restart", (char *)NULL);
			_exit(127);
		}
		usleep((useconds_t)rr(rng, 0, 150000));
		broker_kill(SIGKILL);
		/*
		 * Not its wait for a new broker (10 s): the session processes'
		 * events would be held that long, past the checker's bounds.
		 */
		kill(ctl, SIGKILL);
		waitpid(ctl, &st, 0);
		broker_start();
		return;
	}
	L(L_BROKER_DOWN, 0, 0, (uint64_t)(kind == K_CTL_TWICE || kind == K_USR2_TWICE ? K_CTL : kind), (uint64_t)when,
	  0, 0);
	if (kind == K_USR2_TWICE) {
		/* the second signal cuts the restart's park short (chimed(8)), or restarts the new broker */
		const struct chime_ctl *c = ctl_map();
		uint64_t start = c ? c->start_ns : 0;

		kill(broker_pid, SIGUSR2);
		usleep((useconds_t)(rnd(rng) % 2 ? rr(rng, 0, 3000) : rr(rng, 0, 60000)));
		kill(broker_pid, SIGUSR2);
		while (!broker_running(broker_pid) || !(c = ctl_map()) || c->start_ns == start) {
			if (waitpid(broker_pid, &st, WNOHANG) == broker_pid) {
				fprintf(stderr, "soak: chimed exited in a restart (%#x); see %s/broker.log\n", st, dir);
				exit(2);
			}
			if (chime_now() - t0 > 30000 * MS) {
				fprintf(stderr, "soak: no new chimed runs 30 s after two SIGUSR2; see %s/broker.log\n", dir);
				exit(2);
			}
			usleep(1000);
		}
		broker_n++;
		L(L_BROKER_UP, 0, 0, (uint64_t)broker_pid, 0, 0, 0);
		return;
	}
	if (kind == K_CTL || kind == K_CTL_TWICE) {
		chimectl_restart();
		if (kind == K_CTL_TWICE) {
			/* the second as the sessions reconnect to the first's new broker */
			usleep((useconds_t)rr(rng, 0, 30000));
			chimectl_restart();
		}
		while (!broker_running(broker_pid))
			usleep(1000);
		broker_n++;
		L(L_BROKER_UP, 0, 0, (uint64_t)broker_pid, 0, 0, 0);
		return;
	}
	kill(broker_pid, kind == K_TERM ? SIGTERM : SIGKILL);
	waitpid(broker_pid, &st, 0);
	L(L_BROKER_GONE, 0, 0, (uint64_t)kind, 0, 0, 0);
	if (kind == K_KILL && rnd(rng) % 3 == 0)
		usleep((useconds_t)rr(rng, 0, 2500) * 1000);    /* no broker for a while: the back-off */
	broker_start();
}

static pid_t spawn(int sess, bool final)
{
	uint32_t pidx = (uint32_t)atomic_fetch_add(&G->next_pidx, 1);
	pid_t p = fork();

	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		my_pidx = pidx;
		my_sess = sess;
		worker_run(sess, final);
		_exit(0);
	}
	return p;
}

/* ----------------------------------------------------------------- checker */

struct sop {            /* an arm or a reset: a deadline from `begin` on */
	uint64_t begin, end, d;
};
struct cop {
	uint64_t begin, end;
	uint32_t pidx;
};
struct take {
	uint64_t drain_b, seq, d, fired, ns;
	uint32_t pidx;
};
struct tstate {
	struct sop *s;
	unsigned ns, cs;
	struct cop *c;
	unsigned nc, cc;
	struct take *t;
	unsigned nt, ct;
	uint64_t arm_b, arm_e, arm_e_ns, batch;
	int arm_res, armed_known;
	uint32_t pidx, batch_pos;
};

#define PUSH(arr, n, cap, v) do { \
	if ((n) == (cap)) { (cap) = (cap) ? 2 * (cap) : 4; (arr) = realloc((arr), (cap) * sizeof(*(arr))); } \
	(arr)[(n)++] = (v); } while (0)

struct ck {
	uint64_t key, begin, end, batch;
	uint32_t pos;
	int sess;
	uint32_t pidx;          /* the process that called it (loss_allowed()) */
};

struct proc {
	int sess, end_mode;
	bool final;             /* the session's final process (its cancel_key is the one rule 1215 counts from) */
	uint64_t end_ns, end_seq;
	uint64_t *resumed;      /* seqs of L_RESUMED */
	unsigned nres, cres;
};

static struct tstate *T[NSESS];
static struct ck *cks;
static unsigned ncks, ccks;
static struct proc procs[MAXPROC];
static uint64_t kills[4096], kill_ns[4096];
static unsigned nkills;
static uint64_t downs[8192], down_ns[8192], up_ns[8192];
static unsigned ndowns;
static unsigned violations, counter_violations, allowed_dups, allowed_losses;
static uint64_t refused_arms, retried_arms;
static uint64_t checked_oneshot, checked_periodic, events_total, ops_total;

static __attribute__((format(printf, 1, 2))) void viol(const char *fmt, ...)
{
	va_list ap;

	violations++;
	if (violations > 60)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "VIOLATION: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

/* Did process pidx resume with a broker after the kill at seq k? */
static bool resumed_after(uint32_t pidx, uint64_t k)
{
	for (unsigned i = 0; i < procs[pidx].nres; i++)
		if (procs[pidx].resumed[i] > k)
			return true;
	return false;
}

/* An event first taken by pidx at take_ns (seq) may come again: a broker SIGKILL soon after, and pidx never resumed. */
static bool dup_allowed(const struct take *t1, uint64_t *gap_ms)
{
	/*
	 * Taken up to ~100 ms before the kill (not yet seen taken), or after
	 * it from the dead broker's ring, before the library noticed (up to
	 * a stale heartbeat, about 1 s): either way the next broker cannot
	 * know, unless this process resumed with it.
	 */
	for (unsigned i = 0; i < nkills; i++)
		if (kill_ns[i] + 1500 * MS > t1->ns && kill_ns[i] < t1->ns + 1000 * MS &&
		    !resumed_after(t1->pidx, kills[i] > t1->seq ? kills[i] : t1->seq)) {
			*gap_ms = kill_ns[i] > t1->ns ? (kill_ns[i] - t1->ns) / MS : 0;
			return true;
		}
	return false;
}

/* A call of pidx that returned at seq may be lost: pidx died without chime_close and a broker SIGKILL came first. */
static bool loss_allowed(uint32_t pidx, uint64_t seq)
{
	const struct proc *p = &procs[pidx];

	if (p->end_mode == END_CLOSE) {
		/*
		 * chime_close() waits 1 s for a broker to listen (chime_close(3)): one
		 * that came later may lack its calls, made before the broker went down
		 * or after it, into its rings before the process noticed (it never
		 * resumed after that down). Calls after the down once were not
		 * allowed for: a 600 s run (seed 11) had a broker back 1.47 s after
		 * its kill, 0.24 s after the close gave up, and 24 such arms "lost".
		 */
		for (unsigned i = 0; i < ndowns; i++)
			if (down_ns[i] < p->end_ns && up_ns[i] > p->end_ns - 50 * MS &&
			    (downs[i] > seq || !resumed_after(pidx, downs[i])))
				return true;
		return false;
	}
	/* The kill after the call, or before it (a call into the dead broker's ring, not noticed yet). */
	for (unsigned i = 0; i < nkills; i++)
		if (kill_ns[i] < p->end_ns + 2000 * MS && kill_ns[i] + 1500 * MS > G->log[seq].ns &&
		    !resumed_after(pidx, kills[i] > seq ? kills[i] : seq))
			return true;
	return false;
}

static struct tstate *ts(int sess, uint64_t u)
{
	return &T[sess][u];
}

static void check(void)
{
	uint64_t n = atomic_load(&G->nlog);

	if (n > MAXLOG) {
		fprintf(stderr, "soak: log overflow, checking the first %u entries\n", MAXLOG);
		n = MAXLOG;
	}
	if (getenv("SOAK_MUTATE")) {      /* the checker's own test: forget every 5000th event */
		for (uint64_t i = 0, k = 0; i < n; i++)
			if (atomic_load(&G->log[i].type) == L_EV && ++k % 5000 == 0)
				atomic_store(&G->log[i].type, 0);
	}
	for (int s = 0; s < NSESS; s++)
		T[s] = calloc(atomic_load(&G->next_u[s]) + 1, sizeof(struct tstate));
	/* pass 1: the ops */
	for (uint64_t i = 0; i < n; i++) {
		struct ent *e = &G->log[i];
		uint32_t ty = atomic_load_explicit(&e->type, memory_order_acquire);
		struct tstate *t;

		if (!ty)
			continue;
		t = e->u < MAXU ? ts(e->sess, e->u) : NULL;
		switch (ty) {
		case L_ARM_B:
			t->arm_b = i;
			t->pidx = e->pidx;
			PUSH(t->s, t->ns, t->cs, ((struct sop){ i, INF, G->tab[e->sess][e->u].d0 }));
			ops_total++;
			break;
		case L_ARM_E:
			refused_arms += e->res != 0;
			t->arm_e = i;
			t->arm_e_ns = e->ns;
			t->arm_res = e->res;
			t->armed_known = 1;
			t->s[0].end = i;
			break;
		case L_RESET_B:
			PUSH(t->s, t->ns, t->cs, ((struct sop){ i, INF, e->a }));
			ops_total++;
			break;
		case L_RESET_E:
			for (unsigned k = 0; k < t->ns; k++)
				if (t->s[k].begin == e->tok)
					t->s[k].end = i;
			break;
		case L_CANCEL_B:
			PUSH(t->c, t->nc, t->cc, ((struct cop){ i, INF, e->pidx }));
			ops_total++;
			break;
		case L_CANCEL_E:
			for (unsigned k = 0; k < t->nc; k++)
				if (t->c[k].begin == e->tok)
					t->c[k].end = i;
			break;
		case L_CK_B:
			PUSH(cks, ncks, ccks, ((struct ck){ e->a, i, INF, 0, 0, e->sess, e->pidx }));
			ops_total++;
			break;
		case L_CK_E:
			for (unsigned k = ncks; k-- > 0;)
				if (cks[k].begin == e->tok)
					cks[k].end = i;
			break;
		case L_SUBOP: {
			uint32_t op = (uint32_t)(e->b >> 32), pos = (uint32_t)e->b;

			ops_total++;
			if (op == CHIME_ARM) {
				t->arm_b = e->tok;
				t->batch = e->tok;
				t->batch_pos = pos;
				t->pidx = e->pidx;
				PUSH(t->s, t->ns, t->cs, ((struct sop){ e->tok, INF, e->a }));
			} else if (op == CHIME_RESET) {
				PUSH(t->s, t->ns, t->cs, ((struct sop){ e->tok, INF, e->a }));
			} else if (op == CHIME_CANCEL) {
				PUSH(t->c, t->nc, t->cc, ((struct cop){ e->tok, INF, e->pidx }));
			} else {
				PUSH(cks, ncks, ccks, ((struct ck){ e->a, e->tok, INF, e->tok, pos, e->sess, e->pidx }));
			}
			break;
		}
		case L_SUB_E:
			break;
		case L_SUBRES: {
			uint32_t op = (uint32_t)(e->b >> 32);
			uint64_t end = 0;

			/* the batch's end: its L_SUB_E, just before these */
			for (uint64_t j = i; j-- > e->tok;)
				if (atomic_load(&G->log[j].type) == L_SUB_E && G->log[j].tok == e->tok) {
					end = j;
					break;
				}
			if (op == CHIME_ARM) {
				if (e->res)
					refused_arms++;
				else if (e->id) {
					/* retried on another shard: not the shard of the batch's first accepted arm */
					for (uint64_t j = e->tok + 1; j < i; j++) {
						struct ent *f = &G->log[j];

						if (atomic_load(&f->type) == L_SUBRES && f->tok == e->tok && f->id &&
						    (uint32_t)(f->b >> 32) == CHIME_ARM && !f->res) {
							retried_arms += chime_id_shard(f->id) != chime_id_shard(e->id);
							break;
						}
					}
				}
				t->arm_e = end;
				t->arm_e_ns = e->ns;
				t->arm_res = e->res;
				t->armed_known = 1;
				for (unsigned k = 0; k < t->ns; k++)
					if (t->s[k].begin == e->tok)
						t->s[k].end = end;
			} else if (op == CHIME_RESET) {
				for (unsigned k = 0; k < t->ns; k++)
					if (t->s[k].begin == e->tok)
						t->s[k].end = end;
			} else if (op == CHIME_CANCEL) {
				for (unsigned k = 0; k < t->nc; k++)
					if (t->c[k].begin == e->tok)
						t->c[k].end = end;
			} else {
				for (unsigned k = ncks; k-- > 0;)
					if (cks[k].begin == e->tok && cks[k].pos == (uint32_t)e->b)
						cks[k].end = end;
			}
			break;
		}
		case L_EV:
			if (e->u >= atomic_load(&G->next_u[e->sess])) {
				viol("an event with user_data %llu no arm gave (sess %u)", (unsigned long long)e->u,
				     e->sess);
				break;
			}
			PUSH(t->t, t->nt, t->ct, ((struct take){ e->tok, i, e->a, e->b, e->ns, e->pidx }));
			events_total++;
			if (e->id != atomic_load(&G->tab[e->sess][e->u].id) && atomic_load(&G->tab[e->sess][e->u].id))
				viol("timer %u/%llu came with id %llx, armed as %llx", e->sess, (unsigned long long)e->u,
				     (unsigned long long)e->id,
				     (unsigned long long)atomic_load(&G->tab[e->sess][e->u].id));
			break;
		case L_PROC_START:
			procs[e->pidx].sess = e->sess;
			procs[e->pidx].final = e->b != 0;
			break;
		case L_PROC_END:
			procs[e->pidx].end_mode = (int)e->a;
			procs[e->pidx].end_ns = e->ns;
			procs[e->pidx].end_seq = i;
			break;
		case L_RESUMED:
			PUSH(procs[e->pidx].resumed, procs[e->pidx].nres, procs[e->pidx].cres, i);
			break;
		case L_BROKER_UP:
			if (ndowns && !up_ns[ndowns - 1])
				up_ns[ndowns - 1] = e->ns;
			break;
		case L_BROKER_DOWN:
			if (ndowns < 8192) {
				downs[ndowns] = i;
				down_ns[ndowns] = e->ns;
				up_ns[ndowns++] = 0;
			}
			if (e->a == K_KILL && nkills < 4096) {
				kills[nkills] = i;
				kill_ns[nkills++] = e->ns;
			}
			break;
		case L_ERR:
			viol("a call failed in process %u: %s (%d)", e->pidx, strerror(-e->res), e->res);
			break;
		}
	}
	/* A process that died by SIGKILL or _exit logged its end just before: fine. */
	/*
	 * When the session's last process before the final one ended. A
	 * periodic due only after that was held for the final process, whose
	 * cancel_key before its first drain discards the held event
	 * (chime_cancel(3): "even one the broker had already fired and not yet
	 * delivered"): never taken, by design. A session's processes come one
	 * at a time, so one that ended after d0 + 1.5 s was attached after d0.
	 */
	uint64_t last_end[NSESS] = { 0 };

	for (uint32_t i = 1; i < MAXPROC; i++)
		if (procs[i].end_ns && !procs[i].final && procs[i].sess >= 0 && procs[i].sess < NSESS &&
		    procs[i].end_ns > last_end[procs[i].sess])
			last_end[procs[i].sess] = procs[i].end_ns;
	/* pass 2: each timer */
	for (int s = 0; s < NSESS; s++) {
		uint64_t nu = atomic_load(&G->next_u[s]);

		for (uint64_t u = 0; u < nu; u++) {
			struct tstate *t = ts(s, u);
			const struct tinfo *ti = &G->tab[s][u];
			bool periodic = ti->period != 0;
			/* per series: the ks taken */
			unsigned *kcount[64] = { 0 };
			uint64_t kmax[64] = { 0 };
			int first_take[64];
			unsigned ncover = 0;

			if (!t->arm_b)
				continue;
			if (periodic)
				checked_periodic++;
			else
				checked_oneshot++;
			for (int k = 0; k < 64; k++)
				first_take[k] = -1;
			for (unsigned k = 0; k < t->nt; k++) {
				const struct take *tk = &t->t[k];
				uint64_t maxb = 0;
				bool match = false;

				if (tk->fired < tk->d || tk->ns < tk->d)
					viol("timer %d/%llu fired early: deadline %llu fired %llu taken %llu", s,
					     (unsigned long long)u, (unsigned long long)tk->d, (unsigned long long)tk->fired,
					     (unsigned long long)tk->ns);
				if (t->armed_known && t->arm_res != 0)
					viol("timer %d/%llu was refused (%d) and fired", s, (unsigned long long)u, t->arm_res);
				for (unsigned c = 0; c < t->nc; c++)
					if (t->c[c].end < tk->drain_b && !loss_allowed(t->c[c].pidx, t->c[c].end))
						viol("timer %d/%llu taken (proc %u, drain from seq %llu) after its cancel returned "
						     "(proc %u, seq %llu-%llu)%s", s, (unsigned long long)u, tk->pidx,
						     (unsigned long long)tk->drain_b, t->c[c].pidx,
						     (unsigned long long)t->c[c].begin, (unsigned long long)t->c[c].end,
						     t->batch ? " [armed in a batch]" : "");
				for (unsigned c = 0; c < ncks; c++) {
					const struct ck *x = &cks[c];

					/* a cancel_key lost as a cancel may be (chime_open(3), loss_allowed()) */
					if (x->sess != s || x->key != ti->key || x->end >= tk->drain_b ||
					    loss_allowed(x->pidx, x->end))
						continue;
					if ((t->arm_e && t->arm_e < x->begin) ||
					    (t->batch && x->batch == t->batch && t->batch_pos < x->pos))
						viol("timer %d/%llu (key %llx%s) taken (proc %u) after a cancel_key of its key "
						     "returned (seq %llu-%llu%s)", s, (unsigned long long)u,
						     (unsigned long long)ti->key, t->batch ? ", batch" : "", tk->pidx,
						     (unsigned long long)x->begin, (unsigned long long)x->end,
						     x->batch == t->batch && t->batch ? ", same batch" : "");
				}
				/* which deadline: the last one applied, or one in flight */
				for (unsigned j = 0; j < t->ns; j++)
					if (t->s[j].end < tk->drain_b && t->s[j].begin > maxb)
						maxb = t->s[j].begin;
				for (unsigned j = 0; j < t->ns && j < 64; j++) {
					const struct sop *o = &t->s[j];
					bool cand = o->begin < tk->seq &&
						    (o->end >= tk->drain_b || o->end >= maxb);

					if (!cand)
						continue;
					if (!periodic ? o->d == tk->d :
					    (tk->d >= o->d && (tk->d - o->d) % ti->period == 0)) {
						uint64_t kk = periodic ? (tk->d - o->d) / ti->period : 0;

						if (!kcount[j]) {
							kcount[j] = calloc(4096, sizeof(unsigned));
						}
						if (kk < 4096)
							kcount[j][kk]++;
						if (kk > kmax[j])
							kmax[j] = kk;
						if (first_take[j] < 0)
							first_take[j] = (int)k;
						match = true;
						break;
					}
				}
				if (!match) {
					bool lossok = false;

					for (unsigned j = 0; j < t->ns; j++)
						if (t->s[j].end < tk->drain_b && t->s[j].begin == maxb)
							lossok = loss_allowed(t->pidx, t->s[j].end);
					if (!lossok)
						viol("timer %d/%llu (%s) taken at deadline %llu, not its last one (proc %u)", s,
						     (unsigned long long)u, periodic ? "periodic" : "one-shot",
						     (unsigned long long)tk->d, tk->pidx);
				}
			}
			/* duplicates and gaps */
			if (!periodic) {
				for (unsigned k = 1; k < t->nt; k++) {
					uint64_t gap;

					if (dup_allowed(&t->t[0], &gap)) {
						allowed_dups++;
						fprintf(stderr, "allowed: one-shot %d/%llu taken again (first by proc %u, %llu ms "
							"before a broker SIGKILL; it did not resume)\n", s, (unsigned long long)u,
							t->t[0].pidx, (unsigned long long)gap);
					} else {
						viol("one-shot %d/%llu taken %u times (procs %u, %u; seqs %llu, %llu)", s,
						     (unsigned long long)u, t->nt, t->t[0].pidx, t->t[k].pidx,
						     (unsigned long long)t->t[0].seq, (unsigned long long)t->t[k].seq);
					}
				}
			}
			for (unsigned j = 0; j < t->ns && j < 64; j++) {
				if (!kcount[j])
					continue;
				for (uint64_t kk = 0; periodic && kk <= kmax[j] && kk < 4096; kk++) {
					if (kcount[j][kk] == 0)
						viol("periodic %d/%llu series %u missed period %llu (of 0..%llu)", s,
						     (unsigned long long)u, j, (unsigned long long)kk, (unsigned long long)kmax[j]);
					else if (kcount[j][kk] > 1) {
						uint64_t gap;
						/* the first take of that period */
						const struct take *t1 = NULL;

						for (unsigned k = 0; k < t->nt; k++)
							if (t->t[k].d == t->s[j].d + kk * ti->period) {
								t1 = &t->t[k];
								break;
							}
						if (t1 && dup_allowed(t1, &gap)) {
							allowed_dups++;
							fprintf(stderr, "allowed: periodic %d/%llu period %llu taken again (%llu ms "
								"before a broker SIGKILL)\n", s, (unsigned long long)u,
								(unsigned long long)kk, (unsigned long long)gap);
						} else {
							viol("periodic %d/%llu series %u period %llu taken %u times", s,
							     (unsigned long long)u, j, (unsigned long long)kk, kcount[j][kk]);
						}
					}
				}
				free(kcount[j]);
			}
			/* lost? */
			for (unsigned c = 0; c < t->nc; c++)
				ncover += 1;    /* any cancel, returned or not, may explain no event */
			for (unsigned c = 0; c < ncks; c++)
				if (cks[c].sess == s && cks[c].key == ti->key &&
				    (t->batch && cks[c].batch == t->batch ? t->batch_pos < cks[c].pos :
				     cks[c].end > t->arm_b))
					ncover++;
			if (!periodic && t->nt == 0 && t->armed_known && t->arm_res == 0 && !ncover) {
				if (loss_allowed(t->pidx, t->arm_e)) {
					allowed_losses++;
				} else {
					viol("one-shot %d/%llu lost: armed by proc %u (seq %llu%s), last deadline %llu, never "
					     "taken", s, (unsigned long long)u, t->pidx, (unsigned long long)t->arm_e,
					     t->batch ? ", batch" : "", (unsigned long long)t->s[t->ns - 1].d);
				}
			}
			if (periodic && t->armed_known && t->arm_res == 0 && t->nt == 0 && t->nc == 0 && t->ns == 1) {
				/* armed, never cancelled by id, never taken: only the final cancel_key may excuse it */
				uint64_t fin = INF;

				for (unsigned c = 0; c < ncks; c++)
					if (cks[c].sess == s && cks[c].key == ti->key)
						fin = G->log[cks[c].begin].ns;
				if (fin != INF && last_end[s] < fin)
					fin = last_end[s];      /* held for the final process only: see last_end */
				if (fin != INF && ti->d0 + 1500 * MS < fin && !loss_allowed(t->pidx, t->arm_e))
					viol("periodic %d/%llu never fired (armed at seq %llu, d0 %llu)", s,
					     (unsigned long long)u, (unsigned long long)t->arm_e, (unsigned long long)ti->d0);
			}
		}
	}
}

/* Sum of the numbers after every `key` in the output of cmd (-1: it failed). */
static long long sum_of(const char *cmd, const char *key, unsigned *n)
{
	static char out[1 << 16];
	long long sum = 0;
	size_t len;
	FILE *f = popen(cmd, "r");

	if (!f)
		return -1;
	len = fread(out, 1, sizeof(out) - 1, f);
	out[len] = 0;
	if (pclose(f) != 0)
		return -1;
	*n = 0;
	for (const char *p = strstr(out, key); p; p = strstr(p + 1, key)) {
		sum += strtoll(p + strlen(key), NULL, 10);
		(*n)++;
	}
	return sum;
}

/*
 * After the final processes (every periodic cancelled, every one-shot due
 * and taken): what the broker says it holds, through chimectl and chimestat,
 * must be nothing: no timer, no held event, in no session and no shard.
 */
static void counters_check(void)
{
	static const char *keys[] = { "\"timers\":", "\"held\":" };
	char cmd[600];
	unsigned n;
	long long v;

	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --json sessions", chimectl_path, G->sock);
	for (int k = 0; k < 2; k++) {
		v = sum_of(cmd, keys[k], &n);
		if (v != 0 || n != NSESS) {
			fprintf(stderr, "VIOLATION: after the final drain, chimectl sessions says %lld %s in %u "
				"sessions (0 in %d expected)\n", v, keys[k], n, NSESS);
			counter_violations++;
		}
	}
	if (!chimestat_path)
		return;
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --once --field 'shard.*.armed' --field 'shard.*.backlog'",
		 chimestat_path, G->sock);
	for (int k = 0; k < 2; k++) {
		const char *key = k ? ".backlog " : ".armed ";

		v = sum_of(cmd, key, &n);
		if (v != 0 || n == 0) {
			fprintf(stderr, "VIOLATION: after the final drain, chimestat says shard.*%s= %lld in %u "
				"shards (0 expected)\n", key, v, n);
			counter_violations++;
		}
	}
}

static void usage(void)
{
	fprintf(stderr, "usage: soak_sessions SECONDS [SEED]  (env: CHIMED, CHIMECTL; CHIMESTAT, to check its\n"
		"  counters at the end; SOAK_CHIMED_ARGS, the\n"
		"  broker's options; SOAK_GAP_MS, the longest time between broker restarts (7000); SOAK_KEEP=1\n"
		"  keeps the directory; SOAK_MUTATE=1 drops every 5000th event, to see the checker fail)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	uint64_t secs, rng, t0, next_bounce;
	pid_t wpid[NSESS] = { 0 };
	uint64_t respawn_at[NSESS] = { 0 };
	unsigned spawned = 0, bounces = 0;
	uint64_t max_gap_ms = getenv("SOAK_GAP_MS") ? strtoull(getenv("SOAK_GAP_MS"), NULL, 10) : 7000;

	if (argc < 2)
		usage();
	secs = strtoull(argv[1], NULL, 10);
	seed0 = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
	rng = seed0;
	chimed_path = getenv("CHIMED");
	chimectl_path = getenv("CHIMECTL");
	chimestat_path = getenv("CHIMESTAT");
	extra_args = getenv("SOAK_CHIMED_ARGS");
	if (!extra_args)
		extra_args = "-n 2 --sq-size 128 --cq-size 128 --max-timers-per-client 700";
	if (!chimed_path || !chimectl_path)
		usage();
	G = mmap(NULL, sizeof(*G), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (G == MAP_FAILED)
		return 2;
	snprintf(dir, sizeof(dir), "/dev/shm/chime-soak-%d-XXXXXX", (int)getpid());
	if (!mkdtemp(dir))
		return 2;
	snprintf(G->sock, sizeof(G->sock), "%s/chime.sock", dir);
	atomic_store(&G->next_pidx, 1);
	fprintf(stderr, "soak: seed %llu, dir %s, %llu s, chimed %s\n", (unsigned long long)seed0, dir,
		(unsigned long long)secs, extra_args);
	broker_start();
	t0 = chime_now();
	next_bounce = t0 + rr(&rng, 1000, 6000) * MS;
	while (chime_now() - t0 < secs * 1000 * MS) {
		int st;

		for (int s = 0; s < NSESS; s++) {
			if (wpid[s] && waitpid(wpid[s], &st, WNOHANG) == wpid[s]) {
				if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
					fprintf(stderr, "soak: session %d's process ended with %#x\n", s, st);
				wpid[s] = 0;
				respawn_at[s] = chime_now() + rr(&rng, 0, 2000) * MS;
			}
			if (!wpid[s] && chime_now() >= respawn_at[s]) {
				wpid[s] = spawn(s, false);
				spawned++;
			}
		}
		if (chime_now() >= next_bounce) {
			broker_bounce(&rng, t0 + secs * 1000 * MS);
			bounces++;
			next_bounce = chime_now() + rr(&rng, 200, max_gap_ms) * MS;
		}
		usleep(5000);
	}
	/* the end: every process closes; then a final one per session cancels its periodics and drains */
	atomic_store(&G->final, 1);
	for (int s = 0; s < NSESS; s++)
		if (wpid[s]) {
			int st;

			waitpid(wpid[s], &st, 0);
			if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
				fprintf(stderr, "soak: session %d's process ended with %#x\n", s, st);
		}
	for (int s = 0; s < NSESS; s++)
		wpid[s] = spawn(s, true);
	for (int s = 0; s < NSESS; s++) {
		int st;

		waitpid(wpid[s], &st, 0);
		if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
			fprintf(stderr, "soak: session %d's final process ended with %#x\n", s, st);
	}
	counters_check();
	kill(broker_pid, SIGTERM);
	waitpid(broker_pid, NULL, 0);
	fprintf(stderr, "soak: %u processes, %u broker bounces (ctl %u, term %u, kill %u, kill in start-up %u, kill "
		"in a ctl restart %u, restart twice %u; anytime %u, at rest %u, after a burst %u), %u brokers killed "
		"in their start-up (%u before running), %llu log entries\n", spawned, bounces, n_kind[K_CTL],
		n_kind[K_TERM], n_kind[K_KILL], n_kind[K_KILL_START], n_kind[K_CTL_KILL],
		n_kind[K_CTL_TWICE] + n_kind[K_USR2_TWICE], n_when[0], n_when[1], n_when[2], n_start_kills,
		n_start_kills_early, (unsigned long long)atomic_load(&G->nlog));
	check();
	fprintf(stderr, "soak: %llu arms refused (quota), %llu batch arms on another shard than the batch's first\n",
		(unsigned long long)refused_arms, (unsigned long long)retried_arms);
	fprintf(stderr, "soak: checked %llu one-shots, %llu periodics, %llu ops, %llu events: %u violations, "
		"%u allowed re-deliveries, %u allowed losses\n", (unsigned long long)checked_oneshot,
		(unsigned long long)checked_periodic, (unsigned long long)ops_total,
		(unsigned long long)events_total, violations, allowed_dups, allowed_losses);
	if (!violations && !counter_violations && !getenv("SOAK_KEEP")) {
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		(void)!system(cmd);
	} else {
		static const char *names[] = { "?", "ARM_B", "ARM_E", "RESET_B", "RESET_E", "CANCEL_B", "CANCEL_E",
			"CK_B", "CK_E", "SUB_B", "SUBOP", "SUB_E", "SUBRES", "DRAIN_B", "EV", "PROC_START",
			"PROC_OPEN", "PROC_END", "RESUMED", "BROKER_DOWN", "BROKER_GONE", "BROKER_UP", "ERR",
			"BURST_END" };
		char path[300];
		FILE *f;

		snprintf(path, sizeof(path), "%s/log.txt", dir);
		f = fopen(path, "w");
		for (uint64_t i = 0; f && i < atomic_load(&G->nlog) && i < MAXLOG; i++) {
			struct ent *e = &G->log[i];
			uint32_t ty = atomic_load(&e->type);

			if (ty == L_EV || ty == L_DRAIN_B || ty == L_BURST_END)
				continue;       /* the events: in ev.txt */
			fprintf(f, "%llu %s s%u p%u r%d u%llu id%llx a%llu b%llx tok%llu ns%llu\n", (unsigned long long)i,
				ty < sizeof(names) / sizeof(names[0]) ? names[ty] : "?", e->sess, e->pidx, e->res,
				(unsigned long long)e->u, (unsigned long long)e->id, (unsigned long long)e->a,
				(unsigned long long)e->b, (unsigned long long)e->tok, (unsigned long long)e->ns);
		}
		if (f)
			fclose(f);
		snprintf(path, sizeof(path), "%s/ev.txt", dir);
		f = fopen(path, "w");
		for (uint64_t i = 0; f && i < atomic_load(&G->nlog) && i < MAXLOG; i++) {
			struct ent *e = &G->log[i];

			if (atomic_load(&e->type) == L_EV)
				fprintf(f, "%llu EV s%u p%u u%llu id%llx d%llu fired%llu tok%llu ns%llu\n",
					(unsigned long long)i, e->sess, e->pidx, (unsigned long long)e->u,
					(unsigned long long)e->id, (unsigned long long)e->a, (unsigned long long)e->b,
					(unsigned long long)e->tok, (unsigned long long)e->ns);
		}
		if (f)
			fclose(f);
		fprintf(stderr, "soak: kept %s (broker.log, log.txt, ev.txt)\n", dir);
	}
	return violations || counter_violations ? 1 : 0;
}
