/* SPDX-License-Identifier: MIT */
/*
 * apply.c - `chime-bench apply`: what a shard spends applying one record of
 * a client's submission ring (broker/chan.c's chan_drain(): the grant, the
 * key index, the wheel, the counters), in this process, on one thread.
 *
 * A shard's cost per record bounds what one client can sustain end to end
 * (`e2e` measures that, with the client and the shards on shared cores and
 * the tail of every run at the mercy of the host's scheduler). Here nothing
 * else runs: the same code as chimed's shard, over malloc'd memory laid out
 * as a client's segments, with one channel; the producer (libchime's ring
 * code, uncontended) fills the ring, then chan_drain() applies it, and only
 * the drain is timed. The producer's own cost per record is printed beside
 * it: the floor of a client's operation on a ring nobody else touches.
 *
 * The same world then measures one expiration (shard.c's steps:
 * chan_fire_due(), chan_service(); a ring consumer
 * taking TAKE_BATCH at a time between them, ring.h's chime_cq_take(), not
 * libchime's drainer): N one-shots with one key and one deadline, armed in
 * slab order as `e2e` arms them. On one thread the time says little (no
 * second core, no line crossing between cores); its use is the instruction
 * count per event under callgrind, of exactly the expiry:
 *
 *   valgrind --tool=callgrind '--toggle-collect=expire_phase*' \
 *       build/tools/chime-bench apply --quick
 *   callgrind_annotate --inclusive=yes callgrind.out.<pid>
 *
 * divided by the timers expired (both sizes; ARCHITECTURE.md, "Expiry
 * throughput").
 *
 * Method (printed with the table): N timers (100k, 1M; --quick 10k, 100k)
 * armed in order at deadlines uniform over 60 s ahead, then each reset once
 * to a later deadline and then cancelled, both in a random order; deadlines
 * at the broker's default 100 us resolution, keys = the arm's index. Ring of
 * 1024 records, drained whole each time. Figure: ns per record over the
 * whole phase (total drain time / N); 3 runs, the median printed with the
 * range. The slab is written once before (chimed maps it ahead of use);
 * the key index's buckets are left to fault in, as in chimed.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "chan.h"
#include "keyidx.h"
#include "ring.h"
#include "segment.h"
#include "stats.h"
#include "wheel.h"

#define SQ        1024u        /* the broker's default ring sizes */
#define CQ        8192u
#define FIRE_BUDGET 4096u       /* shard.c's */
#define TAKE_BATCH 512u         /* chime-bench e2e's EV_BATCH */
#define RES_NS    100000ull
#define SPAN_NS   (60ull * 1000000000ull)
#define T0_NS     (1000ull * 1000000000ull)
#define RUNS      3u

enum { PH_ARM, PH_RESET, PH_CANCEL, NR_PH };
static const char *const ph_name[NR_PH] = { "arm", "reset", "cancel" };

struct world {
	struct shard_core sc;
	struct stats st;
	struct chime_shard_stats pub;
	struct chime_client_stats cpub[1];
	struct chan *by_slot[1];
	struct chan_user users[1];
	struct chime_client_geom g;
	void *wmem, *rw, *ro;
	size_t wlen;
	uint32_t *heads;
	uint32_t nb;
	struct chan_mem m;
	struct chan ch;
	struct chime_sq_prod prod;
	struct chime_cq_cons cons;
};

static void world_fail(const char *what)
{
	fprintf(stderr, "chime-bench apply: %s failed\n", what);
	exit(1);
}

static void world_init(struct world *w, uint32_t cap)
{
	memset(w, 0, sizeof(*w));
	w->wlen = wheel_region_size(cap);
	w->wmem = bench_map(w->wlen);
	/* chimed maps its slab ahead of use (MADV_POPULATE_WRITE): no page faults in the drain here either */
	memset(w->wmem, 0, w->wlen);
	w->nb = keyidx_buckets_for(cap);
	w->heads = bench_map((size_t)w->nb * sizeof(uint32_t));
	w->g = (struct chime_client_geom){ .nr_shards = 1, .sq_size = SQ, .cq_size = CQ };
	if (chime_client_layout(&w->g))
		world_fail("chime_client_layout");
	w->rw = bench_map(w->g.rw_size);
	w->ro = bench_map(w->g.ro_size);
	if (wheel_init(&w->sc.wh, w->wmem, w->wlen, cap, RES_NS, T0_NS))
		world_fail("wheel_init");
	keyidx_init(&w->sc.ki, w->heads, w->nb, w->sc.wh.nodes, 0);
	if (keyidx_walks_init(&w->sc.ki, 1))
		world_fail("keyidx_walks_init");
	if (stats_init_blocks(&w->st, &w->pub, w->cpub, 1, 1, 0))
		world_fail("stats_init_blocks");
	w->sc.st = &w->st;
	w->sc.by_slot = w->by_slot;
	w->sc.capacity = cap;
	w->sc.max_clients = 1;
	w->sc.quota = UINT64_MAX;
	w->sc.users = w->users;
	chan_mem_layout(&w->m, w->rw, w->ro, &w->g, 0);
	if (chan_attach(&w->sc, &w->ch, &w->m, 0, 1, 0, UINT64_MAX))
		world_fail("chan_attach");
	chime_sq_prod_init(&w->prod, w->m.sq_slots, &w->m.rw->sq_tail, SQ);
	chime_cq_cons_init(&w->cons, w->m.cq_slots, w->m.claim, &w->m.ro->cq_tail, &w->m.rw->cq_head, CQ);
}

static void world_fini(struct world *w)
{
	chan_fini(&w->ch);
	stats_fini(&w->st);
	keyidx_walks_fini(&w->sc.ki);
	bench_unmap(w->rw, w->g.rw_size);
	bench_unmap(w->ro, w->g.ro_size);
	bench_unmap(w->heads, (size_t)w->nb * sizeof(uint32_t));
	wheel_fini(&w->sc.wh);
	bench_unmap(w->wmem, w->wlen);
}

/* What one phase cost: ns per record in the drain, and in the producer. */
struct cost {
	double drain, fill;
};

/*
 * Records order[0..n) of phase ph: fill the ring, drain it, until all are
 * applied. The phase's ids and deadlines are gathered into order first, and
 * an ARM's granted ids scattered back after, untimed: at 1M timers the
 * random reads of ids[] and dl[] were two cache misses per record of the
 * bench's own, counted as the producer's (an application has its timer's
 * id in hand where it touches its connection anyway).
 */
static struct cost run_phase(struct world *w, int ph, uint64_t *ids, uint64_t *dl, const uint32_t *order,
			     uint32_t n, uint64_t *p_id, uint64_t *p_dl)
{
	uint64_t drain_ns = 0, fill_ns = 0;
	uint32_t i = 0;

	for (uint32_t k = 0; k < n; k++) {
		p_id[k] = ids[order[k]];
		p_dl[k] = dl[order[k]];
	}
	while (i < n) {
		uint64_t a = now_ns(), b, c;
		uint32_t k = 0, applied = 0;

		for (; i < n; i++, k++) {
			uint64_t pos;
			struct chime_sqe *s = chime_sq_reserve(&w->prod, &pos);

			if (!s)
				break;
			s->op = ph == PH_ARM ? CHIME_OP_ARM : ph == PH_RESET ? CHIME_OP_RESET : CHIME_OP_CANCEL;
			s->id = ph == PH_ARM ? s->grant : p_id[i];
			s->key = order[i];
			s->deadline_ns = p_dl[i];
			s->period_ns = 0;
			s->user_data = order[i];
			if (ph == PH_ARM)
				p_id[i] = s->id;
			chime_sq_publish(s, pos);
		}
		b = now_ns();
		while (applied < k)
			applied += chan_drain(&w->sc, &w->ch, SQ);
		c = now_ns();
		fill_ns += b - a;
		drain_ns += c - b;
	}
	if (ph == PH_ARM)
		for (uint32_t k = 0; k < n; k++)
			ids[order[k]] = p_id[k];
	return (struct cost){ .drain = (double)drain_ns / n, .fill = (double)fill_ns / n };
}

/* ---- one expiration ---- */

/* The client's side: take up to TAKE_BATCH events, then release them. */
static __attribute__((noinline)) size_t take(struct world *w, uint64_t *sum)
{
	struct chime_cqe e;
	size_t k = 0;

	while (k < TAKE_BATCH && chime_cq_take(&w->cons, &e) == 1) {
		*sum += e.user_data;
		k++;
	}
	chime_cq_release(&w->cons);
	return k;
}

/* Everything callgrind counts (gcc may name it expire_phase.constprop.0: hence the '*'). */
static __attribute__((noinline)) size_t expire_phase(struct world *w, size_t n, uint64_t now, uint64_t *sum)
{
	size_t got = 0;

	while (got < n) {
		(void)chan_fire_due(&w->sc, now, FIRE_BUDGET);     /* as shard.c's loop */
		(void)chan_service(&w->sc, &w->ch, now);
		for (unsigned j = 0; j < FIRE_BUDGET / TAKE_BATCH; j++)
			got += take(w, sum);
	}
	return got;
}

/* ns per event of n one-shots due at one instant; exits on a wrong outcome. */
static double run_expire(uint32_t n)
{
	struct world *w = malloc(sizeof(*w));
	uint64_t d = T0_NS + 2 * UINT64_C(1000000000), sum = 0, t;
	size_t got;

	if (!w)
		world_fail("malloc");
	world_init(w, n + 2 * SQ);
	/* Armed as chime-bench e2e arms them: one key, one deadline, in slab order. */
	for (uint32_t i = 0; i < n; i++) {
		struct chime_sqe *s;
		uint64_t pos;

		while (!(s = chime_sq_reserve(&w->prod, &pos)))
			(void)chan_drain(&w->sc, &w->ch, SQ);
		s->op = CHIME_OP_ARM;
		s->id = s->grant;
		s->key = 7;
		s->deadline_ns = d;
		s->period_ns = 0;
		s->user_data = i;
		chime_sq_publish(s, pos);
	}
	while (chan_drain(&w->sc, &w->ch, SQ) > 0)
		;
	t = now_ns();
	got = expire_phase(w, n, d, &sum);
	t = now_ns() - t;
	if (got != n || sum != (uint64_t)n * (n - 1) / 2) {
		fprintf(stderr, "chime-bench apply: %zu of %u events expired, or the wrong ones\n", got, n);
		exit(1);
	}
	world_fini(w);
	free(w);
	return (double)t / n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void run_size(uint32_t n, uint64_t seed)
{
	double drain[NR_PH][RUNS], fill[NR_PH][RUNS];
	uint64_t *ids = malloc(n * sizeof(*ids)), *dl = malloc(n * sizeof(*dl));
	uint64_t *p_id = malloc(n * sizeof(*p_id)), *p_dl = malloc(n * sizeof(*p_dl));
	uint32_t *order = malloc(n * sizeof(*order)), *inorder = malloc(n * sizeof(*inorder));

	if (!ids || !dl || !p_id || !p_dl || !order || !inorder)
		world_fail("malloc");
	for (unsigned r = 0; r < RUNS; r++) {
		struct world *w = malloc(sizeof(*w));
		uint64_t rng = seed + r;

		if (!w)
			world_fail("malloc");
		/* Room for the ring's grants beyond the N armed. */
		world_init(w, n + 2 * SQ);
		for (uint32_t i = 0; i < n; i++) {
			inorder[i] = order[i] = i;
			dl[i] = T0_NS + RES_NS + splitmix64(&rng) % SPAN_NS;
		}
		for (int ph = 0; ph < NR_PH; ph++) {
			struct cost c;

			if (ph == PH_RESET) {
				/* Keepalive: a later deadline, in no particular order. */
				for (uint32_t i = 0; i < n; i++)
					dl[i] += 1 + splitmix64(&rng) % (SPAN_NS / 2);
				bench_shuffle(order, n, &rng);
			} else if (ph == PH_CANCEL) {
				bench_shuffle(order, n, &rng);
			}
			c = run_phase(w, ph, ids, dl, ph == PH_ARM ? inorder : order, n, p_id, p_dl);
			drain[ph][r] = c.drain;
			fill[ph][r] = c.fill;
			/* Every record applied as meant: all armed after the arms, none after the cancels. */
			if (wheel_armed(&w->sc.wh) != (ph == PH_CANCEL ? 0 : n) || w->st.sh.malformed) {
				fprintf(stderr, "chime-bench apply: after the %ss, %llu of %u timers armed, %llu malformed\n",
					ph_name[ph], (unsigned long long)wheel_armed(&w->sc.wh), n,
					(unsigned long long)w->st.sh.malformed);
				exit(1);
			}
		}
		world_fini(w);
		free(w);
	}
	for (int ph = 0; ph < NR_PH; ph++) {
		qsort(drain[ph], RUNS, sizeof(double), cmp_double);
		qsort(fill[ph], RUNS, sizeof(double), cmp_double);
		printf("  %-6s %-7s | %8.1f  (%5.1f-%5.1f) | %8.1f  (%5.1f-%5.1f)\n",
		       ph == PH_ARM ? (n >= 1000000 ? "1M" : n >= 100000 ? "100k" : "10k") : "",
		       ph_name[ph], drain[ph][RUNS / 2], drain[ph][0], drain[ph][RUNS - 1],
		       fill[ph][RUNS / 2], fill[ph][0], fill[ph][RUNS - 1]);
	}
	{
		double ex[RUNS];

		for (unsigned r = 0; r < RUNS; r++)
			ex[r] = run_expire(n);
		qsort(ex, RUNS, sizeof(double), cmp_double);
		printf("  %-6s %-7s | %8.1f  (%5.1f-%5.1f) | %s\n", "", "expire", ex[RUNS / 2], ex[0], ex[RUNS - 1],
		       "(a ring consumer in the same thread)");
	}
	free(ids);
	free(dl);
	free(p_id);
	free(p_dl);
	free(order);
	free(inorder);
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: chime-bench apply [--quick]\n"
		"The shard's cost per record of a client's submission ring (chan_drain: grant,\n"
		"key index, wheel, counters), in this process, on one thread, beside the\n"
		"producer's cost per record on an uncontended ring; and of one expiration\n"
		"(N due at one instant, shard.c's steps and a ring consumer in this thread).\n\n"
		"  -q, --quick   10k and 100k timers instead of 100k and 1M\n"
		"  -h, --help    show this help\n");
}

int bench_apply(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool help = false;
	struct bench_machine mc;
	int quick = 0, o;

	while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
		switch (o) {
		case 'q':
			quick = 1;
			break;
		case 'h':
			help = true;    /* after the check for what is left over, as chime-bench -h does */
			break;
		default:
			return bench_usage_error("apply", NULL);
		}
	}
	if (optind != argc)
		return bench_usage_error("apply", argv[optind]);
	if (help) {
		usage(stdout);
		return 0;
	}
	bench_machine(&mc);
	printf("chime-bench apply: the shard's cost per submission record, in-process, one thread\n"
	       "date:    %s\nmachine: %ld CPUs online, %s, Linux %s; load average %.2f %.2f %.2f at start\n"
	       "method:  N timers armed in order at deadlines uniform over 60 s (100 us resolution), then\n"
	       "         each reset once to a later deadline, then cancelled, both in random order;\n"
	       "         the client's ring (%u records) filled by libchime's producer code, then\n"
	       "         applied by chimed's chan_drain(); ns per record = phase's drain time / N\n"
	       "         (producer: filling time / N, ids and deadlines gathered in order beforehand).\n"
	       "         expire: N one-shots due at one instant (one key, armed in slab order), shard.c's\n"
	       "         steps and a ring consumer taking %u at a time, in this thread; ns per event.\n"
	       "         %u runs: median (min-max).\n\n",
	       mc.date, mc.cpus, mc.model, mc.kernel, mc.load[0], mc.load[1], mc.load[2], SQ, TAKE_BATCH, RUNS);
	printf("  timers op      | shard ns/record          | producer ns/record\n");
	run_size(quick ? 10000 : 100000, 42);
	run_size(quick ? 100000 : 1000000, 4242);
	return 0;
}
