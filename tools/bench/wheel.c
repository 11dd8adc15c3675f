/* SPDX-License-Identifier: MIT */
/*
 * wheel.c - `chime-bench wheel`: chime's timing wheel against a binary
 * min-heap baseline (heap.c), at 1k .. 10M armed timers.
 *
 * Method (printed with the table): N timers armed at deadlines uniform over
 * 60 s. Each of arm, cancel and reset is timed in batches of B operations on
 * random distinct timers while N stay armed (the untimed half of each round
 * restores N); the figure is the median over batches of the batch mean. Then
 * simulated time advances from the start over the 60 s in 1 ms steps; each
 * step advances and pops everything due; steps are grouped into batches of
 * at least B expired timers, and the figure is the median of ns per expired
 * timer over those batches (so it includes the cost of empty steps).
 * Both structures run the same code (the RUN() macro), same seeds.
 * Then the stalls of the wheel alone: see stall_run(); and its expiry
 * after churn: see churn_run().
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "heap.h"
#include "wheel.h"

#define SPAN_NS   (60ull * 1000000000ull)
#define STEP_NS   1000000ull
#define RES_NS    1000000ull
#define T0_NS     (1000ull * 1000000000ull)
#define ROUNDS    200u
#define POP_MAX   1024u

struct result {
	double arm, cancel, reset, expire, bytes;
};

/* ---- chime's wheel ---------------------------------------------------------- */

static struct wheel W;
static void *w_mem;
static size_t w_len;

static void w_setup(uint32_t n)
{
	w_len = wheel_region_size(n);
	w_mem = bench_map(w_len);
	if (wheel_init(&W, w_mem, w_len, n, RES_NS, T0_NS)) {
		fprintf(stderr, "%s: wheel_init(%u timers) failed\n", bench_prog, n);
		exit(1);
	}
	for (uint32_t i = 0; i < n; i++)
		wheel_alloc(&W); /* ids 0..n-1 */
}

static inline void w_arm(uint32_t id, uint64_t d) { wheel_arm(&W, id, d); }
static inline void w_cancel(uint32_t id) { wheel_cancel(&W, id); }
static inline void w_reset(uint32_t id, uint64_t d) { wheel_reset(&W, id, d); }

static inline uint64_t w_expire(uint64_t now, uint32_t *buf)
{
	uint64_t total = 0;
	unsigned k;

	wheel_advance(&W, now);
	while ((k = wheel_pop_expired(&W, buf, POP_MAX)) > 0)
		total += k;
	return total;
}

static double w_bytes(uint32_t n) { return (double)wheel_region_size(n) / n; }
static void w_teardown(void)
{
	wheel_fini(&W);
	bench_unmap(w_mem, w_len);
}

/* ---- binary heap -------------------------------------------------------------- */

static struct heap H;

static void h_setup(uint32_t n) { heap_init(&H, n); }
static inline void h_arm(uint32_t id, uint64_t d) { heap_arm(&H, id, d); }
static inline void h_cancel(uint32_t id) { heap_cancel(&H, id); }
static inline void h_reset(uint32_t id, uint64_t d) { heap_reset(&H, id, d); }

static inline uint64_t h_expire(uint64_t now, uint32_t *buf)
{
	uint64_t total = 0;
	unsigned k;

	while ((k = heap_pop_due(&H, now, buf, POP_MAX)) > 0)
		total += k;
	return total;
}

static double h_bytes(uint32_t n) { return (double)heap_bytes(n) / n; }
static void h_teardown(void) { heap_fini(&H); }

/* ---- the method, once for both -------------------------------------------------- */

struct plan {
	uint32_t n, batch;
	uint32_t *ids;          /* ROUNDS * batch timer ids, distinct within a batch */
	uint64_t *dl;           /* ROUNDS * batch new deadlines */
	uint64_t *init_dl;      /* n initial deadlines */
	double *samples;
};

#define RUN(P, res, x)                                                                    \
	do {                                                                              \
		uint32_t n_ = (P)->n, b_ = (P)->batch, buf_[POP_MAX];                     \
		size_t ns_ = 0;                                                           \
		uint64_t t0_, acc_t = 0, acc_n = 0;                                       \
                                                                                          \
		x##_setup(n_);                                                            \
		for (uint32_t i = 0; i < n_; i++)                                         \
			x##_arm(i, (P)->init_dl[i]);                                      \
		/* cancel: timed; re-arm: untimed */                                      \
		for (uint32_t r = 0; r < ROUNDS; r++) {                                   \
			const uint32_t *id = (P)->ids + (size_t)r * b_;                   \
			const uint64_t *d = (P)->dl + (size_t)r * b_;                     \
                                                                                          \
			t0_ = now_ns();                                             \
			for (uint32_t k = 0; k < b_; k++)                                 \
				x##_cancel(id[k]);                                        \
			(P)->samples[r] = (double)(now_ns() - t0_) / b_;            \
			for (uint32_t k = 0; k < b_; k++)                                 \
				x##_arm(id[k], d[k]);                                     \
		}                                                                         \
		(res)->cancel = bench_median((P)->samples, ROUNDS);                       \
		/* arm: cancel untimed, arm timed */                                      \
		for (uint32_t r = 0; r < ROUNDS; r++) {                                   \
			const uint32_t *id = (P)->ids + (size_t)((r + 7) % ROUNDS) * b_;  \
			const uint64_t *d = (P)->dl + (size_t)r * b_;                     \
                                                                                          \
			for (uint32_t k = 0; k < b_; k++)                                 \
				x##_cancel(id[k]);                                        \
			t0_ = now_ns();                                             \
			for (uint32_t k = 0; k < b_; k++)                                 \
				x##_arm(id[k], d[k]);                                     \
			(P)->samples[r] = (double)(now_ns() - t0_) / b_;            \
		}                                                                         \
		(res)->arm = bench_median((P)->samples, ROUNDS);                          \
		/* reset: move to a new random deadline */                                \
		for (uint32_t r = 0; r < ROUNDS; r++) {                                   \
			const uint32_t *id = (P)->ids + (size_t)((r + 13) % ROUNDS) * b_; \
			const uint64_t *d = (P)->dl + (size_t)((r + 3) % ROUNDS) * b_;    \
                                                                                          \
			t0_ = now_ns();                                             \
			for (uint32_t k = 0; k < b_; k++)                                 \
				x##_reset(id[k], d[k]);                                   \
			(P)->samples[r] = (double)(now_ns() - t0_) / b_;            \
		}                                                                         \
		(res)->reset = bench_median((P)->samples, ROUNDS);                        \
		/* expiry: 1 ms steps over the 60 s */                                    \
		t0_ = now_ns();                                                     \
		for (uint64_t now = T0_NS + STEP_NS; now <= T0_NS + SPAN_NS + STEP_NS;    \
		     now += STEP_NS) {                                                    \
			acc_n += x##_expire(now, buf_);                                   \
			if (acc_n >= b_) {                                                \
				acc_t = now_ns();                                   \
				(P)->samples[ns_++] = (double)(acc_t - t0_) / (double)acc_n; \
				t0_ = acc_t;                                              \
				acc_n = 0;                                                \
			}                                                                 \
		}                                                                         \
		if (acc_n > 0)                                                            \
			(P)->samples[ns_++] = (double)(now_ns() - t0_) / (double)acc_n; \
		(res)->expire = bench_median((P)->samples, ns_);                          \
		(res)->bytes = x##_bytes(n_);                                             \
		x##_teardown();                                                           \
	} while (0)

static void plan_make(struct plan *p, uint32_t n, uint64_t seed)
{
	uint64_t rng = seed;
	uint32_t *perm = malloc((size_t)n * sizeof(*perm));
	size_t used = n;

	p->n = n;
	p->batch = n >= 10000 ? 1000 : n / 10;
	p->ids = malloc((size_t)ROUNDS * p->batch * sizeof(*p->ids));
	p->dl = malloc((size_t)ROUNDS * p->batch * sizeof(*p->dl));
	p->init_dl = malloc((size_t)n * sizeof(*p->init_dl));
	/* enough for the expiry batches: at most one per step */
	p->samples = malloc((SPAN_NS / STEP_NS + 2 + ROUNDS) * sizeof(*p->samples));
	if (!perm || !p->ids || !p->dl || !p->init_dl || !p->samples) {
		fprintf(stderr, "%s: out of memory for %u timers\n", bench_prog, n);
		exit(1);
	}
	for (uint32_t i = 0; i < n; i++) {
		perm[i] = i;
		p->init_dl[i] = T0_NS + splitmix64(&rng) % SPAN_NS;
	}
	for (size_t r = 0; r < (size_t)ROUNDS * p->batch; r++) {
		/* consecutive runs of a shuffled permutation: distinct within a batch */
		if (used + p->batch > n && r % p->batch == 0) {
			bench_shuffle(perm, n, &rng);
			used = 0;
		}
		p->ids[r] = perm[used++];
		p->dl[r] = T0_NS + splitmix64(&rng) % SPAN_NS;
	}
	free(perm);
}

static void plan_free(struct plan *p)
{
	free(p->ids);
	free(p->dl);
	free(p->init_dl);
	free(p->samples);
}

/* ---- stalls: the longest advance of an awake shard ------------------------------ */

#define STALL_RES_NS   100000ull        /* chimed's default resolution */
#define STALL_SLOW_NS  200000ull
#define STAGE_PASSES   50u              /* wheel_stage() calls between advances, at most */
#define STAGE_BUDGET   32u              /* nodes per call, as chimed's shard */

struct stall {
	uint64_t max_ns, max_at_ns;     /* longest advance (+ pops) and when, from the start */
	uint64_t slow;                  /* advances longer than STALL_SLOW_NS */
	double advance_ms, stage_ms;    /* all advances, all staging */
};

/*
 * n timers at deadlines uniform over span_ns, then simulated time advanced
 * every resolution, as a shard that stays awake (a deadline every few
 * microseconds) does, popping and freeing what is due; with `stage`,
 * wheel_stage() between advances as the shard calls it when idle. Every
 * advance is timed: a long one holds back every timer due meanwhile.
 */
static void stall_run(uint32_t n, uint64_t span_ns, bool stage, struct stall *r)
{
	static struct wheel sw;
	size_t len = wheel_region_size(n);
	void *mem = bench_map(len);
	uint64_t rng = 0x57a11, t_adv = 0, t_stage = 0;
	uint32_t buf[POP_MAX];

	memset(r, 0, sizeof(*r));
	if (wheel_init(&sw, mem, len, n, STALL_RES_NS, T0_NS)) {
		fprintf(stderr, "%s: wheel_init(%u timers) failed\n", bench_prog, n);
		exit(1);
	}
	for (uint32_t i = 0; i < n; i++)
		wheel_arm(&sw, wheel_alloc(&sw), T0_NS + 1 + splitmix64(&rng) % span_ns);
	for (uint64_t t = T0_NS; wheel_armed(&sw) > 0; t += STALL_RES_NS) {
		uint64_t a = now_ns(), d;
		unsigned k;

		wheel_advance(&sw, t);
		while ((k = wheel_pop_expired(&sw, buf, POP_MAX)) > 0)
			for (unsigned j = 0; j < k; j++)
				wheel_free(&sw, buf[j]);
		d = now_ns() - a;
		t_adv += d;
		if (d > r->max_ns) {
			r->max_ns = d;
			r->max_at_ns = t - T0_NS;
		}
		r->slow += d > STALL_SLOW_NS;
		if (stage) {
			a = now_ns();
			for (unsigned q = 0; q < STAGE_PASSES && wheel_stage(&sw, STAGE_BUDGET) > 0; q++)
				;
			t_stage += now_ns() - a;
		}
	}
	r->advance_ms = (double)t_adv / 1e6;
	r->stage_ms = (double)t_stage / 1e6;
	wheel_fini(&sw);
	bench_unmap(mem, len);
}

static void stalls(bool quick)
{
	uint32_t n = quick ? 100000 : 1000000;
	uint64_t span = (quick ? 2 : 30) * 1000000000ull;

	printf("\nstalls: %u timers due uniformly over %llu s, resolution %llu us, advanced every\n"
	       "  resolution as an awake shard does (pops and frees included); staged: up to %u\n"
	       "  calls of wheel_stage(%u) between advances, as the shard calls it when idle.\n",
	       n, (unsigned long long)(span / 1000000000ull), STALL_RES_NS / 1000, STAGE_PASSES, STAGE_BUDGET);
	printf("  %-12s | %12s %10s | %9s | %11s %11s\n", "", "longest us", "at s", "> 200 us",
	       "advance ms", "staging ms");
	for (int stage = 0; stage <= 1; stage++) {
		struct stall r;

		stall_run(n, span, stage, &r);
		printf("  %-12s | %12.1f %10.2f | %9llu | %11.1f %11.1f\n", stage ? "staged" : "not staged",
		       (double)r.max_ns / 1e3, (double)r.max_at_ns / 1e9, (unsigned long long)r.slow,
		       r.advance_ms, r.stage_ms);
		fflush(stdout);
	}
}

/*
 * n timers due at one instant: the advance that makes them due, and their
 * pops, timed; with `churn`, after 2n timers were armed and cancelled in
 * random order, as a broker that has run a while has done. Where a freed
 * node is reused decides where timers armed together lie in the slab.
 */
static void churn_run(uint32_t n, bool churn, double *advance_ms, double *pop_ns)
{
	static struct wheel cw;
	uint32_t cap = 3 * n, buf[POP_MAX], *idx = NULL;
	size_t len = wheel_region_size(cap);
	void *mem = bench_map(len);
	uint64_t rng = 0xc4u, d = T0_NS + 500 * RES_NS, a, popped = 0;
	unsigned k;

	if (wheel_init(&cw, mem, len, cap, RES_NS, T0_NS)) {
		fprintf(stderr, "%s: wheel_init(%u timers) failed\n", bench_prog, cap);
		exit(1);
	}
	if (churn) {
		idx = malloc(2 * (size_t)n * sizeof(*idx));
		if (!idx) {
			fprintf(stderr, "%s: out of memory\n", bench_prog);
			exit(1);
		}
		for (uint32_t i = 0; i < 2 * n; i++)
			wheel_arm(&cw, idx[i] = wheel_alloc(&cw), d + 1 + splitmix64(&rng) % SPAN_NS);
		for (uint32_t i = 2 * n - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(splitmix64(&rng) % (i + 1)), x = idx[i];

			idx[i] = idx[j];
			idx[j] = x;
		}
		for (uint32_t i = 0; i < 2 * n; i++)
			wheel_free(&cw, idx[i]);
		free(idx);
	}
	for (uint32_t i = 0; i < n; i++)
		wheel_arm(&cw, wheel_alloc(&cw), d);
	a = now_ns();
	wheel_advance(&cw, d);
	*advance_ms = (double)(now_ns() - a) / 1e6;
	a = now_ns();
	while ((k = wheel_pop_expired(&cw, buf, POP_MAX)) > 0)
		popped += k;
	*pop_ns = (double)(now_ns() - a) / (double)(popped ? popped : 1);
	wheel_fini(&cw);
	bench_unmap(mem, len);
}

static void churned(bool quick)
{
	uint32_t n = quick ? 100000 : 1000000;

	printf("\nexpiry after churn: %u timers due at one instant, made due by one advance and\n"
	       "  popped; on a fresh wheel, and after %u timers were armed and cancelled in random\n"
	       "  order (a broker that has run a while). One run each.\n", n, 2 * n);
	printf("  %-12s | %11s | %11s\n", "", "advance ms", "pop ns/timer");
	for (int churn = 0; churn <= 1; churn++) {
		double adv, pop;

		churn_run(n, churn, &adv, &pop);
		printf("  %-12s | %11.1f | %11.1f\n", churn ? "after churn" : "fresh", adv, pop);
		fflush(stdout);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: chime-bench wheel [--quick]\n"
		   "chime's timing wheel against a binary heap, in-process, one thread: arm, cancel,\n"
		   "reset and expiry at 1k, 100k, 1M and 10M timers; stalls and expiry after churn.\n\n"
		   "  -q, --quick   only 1k and 100k timers, stalls and churn at 100k (a smoke test)\n"
		   "  -h, --help    show this help\n");
}

int bench_wheel(int argc, char **argv)
{
	static const uint32_t sizes[] = { 1000, 100000, 1000000, 10000000 };
	static const struct option opts[] = {
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool help = false;
	unsigned nsizes = 4;
	int o;

	while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
		switch (o) {
		case 'q':
			nsizes = 2;
			break;
		case 'h':
			help = true;    /* after the check for what is left over, as chime-bench -h does */
			break;
		default:
			return bench_usage_error("wheel", NULL);
		}
	}
	if (optind != argc)
		return bench_usage_error("wheel", argv[optind]);
	if (help) {
		usage(stdout);
		return 0;
	}

	printf("chime-bench wheel: N timers armed at random deadlines uniform over 60 s;\n"
	       "  wheel: chime's (11 levels x 64 slots, 64 B nodes, resolution %llu ns);\n"
	       "  heap:  binary min-heap with index tracking (16 B entry + 4 B index, no payload).\n"
	       "  arm/cancel/reset: %u rounds of a batch of min(1000, N/10) random distinct\n"
	       "  timers, N kept armed; median over batches of the batch mean.\n"
	       "  expire: advance simulated time over the 60 s in %llu ms steps, pop all due;\n"
	       "  median over batches of >= min(1000, N/10) expired timers of ns per timer\n"
	       "  (includes empty steps). Clock: CLOCK_MONOTONIC around each batch.\n\n",
	       RES_NS, ROUNDS, STEP_NS / 1000000);
	printf("%9s | %15s | %15s | %15s | %15s | %15s\n", "timers", "arm ns", "cancel ns",
	       "reset ns", "expire ns/timer", "bytes/timer");
	printf("%9s | %7s %7s | %7s %7s | %7s %7s | %7s %7s | %7s %7s\n", "", "wheel", "heap",
	       "wheel", "heap", "wheel", "heap", "wheel", "heap", "wheel", "heap");
	for (unsigned s = 0; s < nsizes; s++) {
		struct plan p;
		struct result rw, rh;

		plan_make(&p, sizes[s], 0x5eed + s);
		RUN(&p, &rw, w);
		RUN(&p, &rh, h);
		printf("%9u | %7.1f %7.1f | %7.1f %7.1f | %7.1f %7.1f | %7.1f %7.1f | %7.1f %7.1f\n",
		       sizes[s], rw.arm, rh.arm, rw.cancel, rh.cancel, rw.reset, rh.reset,
		       rw.expire, rh.expire, rw.bytes, rh.bytes);
		fflush(stdout);
		plan_free(&p);
	}
	stalls(nsizes == 2);
	churned(nsizes == 2);
	return 0;
}
