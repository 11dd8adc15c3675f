/* SPDX-License-Identifier: MIT */
/*
 * compare.c - `chime-bench compare`: what users would pick instead, in one
 * run, on one machine, on the same workload, in one table (or --json).
 *
 * Contenders (columns): chime end to end (libchime + chimed), chime's wheel
 * in this process (broker/wheel.c without the rings), one timerfd per timer
 * (epoll), libuv uv_timer_t and libev ev_timer (when built). At each size:
 *
 *   arm, reset, touch,  ns per op on one thread, median of the means of
 *   cancel              batches of 1000 (e2e's method; deadlines 1 h ahead,
 *                       timer i at base + i, reset to base + 1 s + i, then
 *                       touched: reset again, to base + 2 s + i)
 *   expiry              all N due at one instant: ns from the deadline to the
 *                       last callback (or drained event), / N
 *   memory              bytes per timer (compare_run.c says what each counts)
 *
 * Then the seed workload (100k connections, 30 s idle timeout, touched in
 * 10 ms ticks at 3,000/s and 1M/s): CPU seconds per wall second of client
 * and broker; and lateness of a few thousand timers over a second or two.
 */
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare.h"

const double seed_rates[NR_RATES] = { 3000, 1000000 };
const int lat_c[NR_LAT] = { C_CHIME, C_TFD, C_UV };

static const struct inproc *inproc_of(int c)
{
	switch (c) {
	case C_WHEEL: return &inproc_wheel;
#if HAVE_LIBUV
	case C_UV: return &inproc_uv;
#endif
#if HAVE_LIBEV
	case C_EV: return &inproc_ev;
#endif
	default: return NULL;
	}
}

static void progress(const struct run *R, const char *what, size_t n, int c)
{
	(void)R;
	fprintf(stderr, "chime-bench compare: %s %zu %s\n", what, n, contender_name[c]);
}

static void run_size(struct run *R, const struct broker *b, size_t si)
{
	size_t n = R->sizes[si];
	unsigned batch = 1000;

	for (int c = 0; c < NR_C; c++) {
		struct size_res *r = &R->sz[si][c];
		struct op_result op[NR_OPS];
		struct expire_result er;
		size_t nt = n;
		int ok = 1;

		r->n = n;
		if (!R->built[c])
			continue;
		if (c == C_TFD && n > R->tfd_max)
			continue;
		progress(R, "size", n, c);       /* not like for like at fewer: see the size added in main */
		if (c == C_CHIME || c == C_TFD) {
			ok = run_ops(c == C_CHIME ? IMPL_CHIME : IMPL_TFD, b, nt, 1, batch, op) == 0;
			for (int k = 0; k < NR_OPS; k++) {
				r->fig[F_ARM + k] = op[k].median_ns;
				r->mean[k] = op[k].mean_ns;
			}
			if (ok)
				ok = (c == C_CHIME ? run_chime_mem(b, nt, &r->fig[F_MEM]) :
				      run_tfd_mem(nt, &r->fig[F_MEM])) == 0;
			if (ok)
				ok = (c == C_CHIME ? run_expire_chime(b, nt, R->gap_ns, 0, &er) :
				      run_expire_tfd(nt, R->gap_ns, &er)) == 0 && er.ok;
			if (ok) {
				r->fig[F_EXPIRE] = (double)er.drain_ns / (double)nt;
				r->fig[F_FIRST] = (double)er.first_ns / 1e3;
			}
		} else {
			ok = run_inproc_ops(inproc_of(c), nt, batch, r) == 0 &&
			     run_inproc_expire(inproc_of(c), nt, R->gap_ns, r) == 0;
		}
		if (!ok)
			PROBLEM("%s at %zu timers: not measured\n", contender_name[c], nt);
		r->ran = ok;
	}
}

static void run_seed(struct run *R, const struct broker *b)
{
	for (int k = 0; k < NR_RATES; k++) {
		progress(R, "seed", (size_t)seed_rates[k], C_CHIME);
		run_chime_seed(b, 0, seed_rates[k], R->seed_wall_ns, &R->seed[k][C_CHIME]);
		progress(R, "seed, resets as records", (size_t)seed_rates[k], C_CHIME);
		run_chime_seed(b, CHIME_OPEN_RECORD_RESETS, seed_rates[k], R->seed_wall_ns, &R->seed_records[k]);
#if HAVE_LIBUV
		progress(R, "seed", (size_t)seed_rates[k], C_UV);
		run_uv_seed(seed_rates[k], R->seed_wall_ns, &R->seed[k][C_UV]);
#endif
#if HAVE_LIBEV
		progress(R, "seed", (size_t)seed_rates[k], C_EV);
		run_ev_seed(seed_rates[k], R->seed_wall_ns, &R->seed[k][C_EV]);
#endif
	}
}

/*
 * Lateness: every contender in turn, lat_rounds times, the samples of its
 * rounds pooled: one contender's noisy second is not another's quiet one
 * (issue 9: compared over repeated alternating runs). A round that fails
 * or loses a timer leaves the contender with no figure.
 */
static void run_lat(struct run *R, const struct broker *b)
{
	int failed[NR_LAT] = { 0 };

	for (unsigned round = 0; round < R->lat_rounds; round++) {
		for (int k = 0; k < NR_LAT; k++) {
			int c = lat_c[k], ok = 0;
			struct lat_result one;
			struct lat_result *all = &R->lat[k];

			if (!R->built[c] || failed[k] || (c == C_TFD && R->n_lat > R->tfd_max))
				continue;
			progress(R, "lateness", R->n_lat, c);
			memset(&one, 0, sizeof(one));
			if (c == C_CHIME) {
				ok = run_lat_chime(b, R->n_lat, R->span_ns, 0, &one) == 0;
				free(one.fired);
			} else if (c == C_TFD) {
				ok = run_lat_tfd(R->n_lat, R->span_ns, &one) == 0;
#if HAVE_LIBUV
			} else {
				ok = run_uv_lat(R->n_lat, R->span_ns, &one) == 0;
#endif
			}
			if (!ok || one.got != R->n_lat) {
				failed[k] = 1;
				free(one.recv);
				continue;
			}
			all->recv = realloc(all->recv, (all->got + one.got) * sizeof(uint64_t));
			if (!all->recv) {
				fprintf(stderr, "chime-bench compare: out of memory for the lateness samples\n");
				exit(1);
			}
			memcpy(all->recv + all->got, one.recv, one.got * sizeof(uint64_t));
			all->got += one.got;
			all->n += one.n;
			free(one.recv);
		}
	}
	for (int k = 0; k < NR_LAT; k++) {
		R->lat_ran[k] = !failed[k] && R->lat[k].got == (size_t)R->n_lat * R->lat_rounds;
		if (R->lat[k].got)
			qsort(R->lat[k].recv, R->lat[k].got, sizeof(uint64_t), cmp_u64);
	}
}

/* ---- options ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chime-bench compare [--quick] [--json] [--socket PATH] [--sizes N,N...]\n"
		"                           [--lateness-csv DIR] [--lateness-rounds N]\n"
		"chime end to end, chime's wheel in-process, a timerfd per timer, libuv and\n"
		"libev: arm, reset, cancel, expiry and memory per timer at each size; the seed\n"
		"workload's CPU (100k connections, 30 s idle timeout, 3,000 and 1M touches/s);\n"
		"lateness.\n"
		"\n"
		"  -s, --socket PATH        use the chimed at PATH (default: a private one)\n"
		"  -q, --quick              10k and 50k timers, 1 s seed runs (a smoke test)\n"
		"  -j, --json               the figures and the run's context as JSON on stdout\n"
		"  -S, --sizes LIST         timer counts, 1000..4000000, at most 8 (default\n"
		"                           100000,1000000)\n"
		"  -L, --lateness-csv DIR   one CSV per contender's lateness, DIR made if need\n"
		"                           be (tools/bench/plot-lateness.sh)\n"
		"  -R, --lateness-rounds N  rounds of the lateness contenders in turn, pooled\n"
		"                           (1..100, default 3, --quick 1)\n"
		"  -h, --help               show this help\n");
}

/* --sizes (or the default list): 1000..4000000 each, at most MAX_SIZES of them */
static int parse_sizes(struct run *R, const char *s)
{
	uint64_t v[MAX_SIZES];
	size_t n;

	if (bench_opt_u64_list("compare", "--sizes", s, 1000, 4000000, v, MAX_SIZES, &n) < 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		R->sizes[i] = (size_t)v[i];
	R->nsizes = n;
	return 0;
}

int bench_compare(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "json", no_argument, NULL, 'j' },
		{ "sizes", required_argument, NULL, 'S' },
		{ "lateness-csv", required_argument, NULL, 'L' },
		{ "lateness-rounds", required_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool help = false;
	static struct run R;
	const char *sizes = NULL;
	struct broker b;
	int opt, saved_out = -1;
	uint64_t rounds = 0;

	signal(SIGPIPE, SIG_IGN);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:qjS:L:R:h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (bench_opt_socket("compare", optarg, &R.socket) < 0)
				return 2;
			break;
		case 'q': R.quick = 1; break;
		case 'j': R.json = bench_json = 1; break;
		case 'S': sizes = optarg; break;
		case 'L':
			if (!*optarg) {
				fprintf(stderr, "chime-bench compare: --lateness-csv needs a directory (empty given)\n");
				return 2;
			}
			R.csv_dir = optarg;
			break;
		case 'R':
			if (bench_opt_u64("compare", "--lateness-rounds", optarg, 1, 100, &rounds) < 0)
				return 2;
			break;
		case 'h': help = true; break;   /* after the check for what is left over */
		default: return bench_usage_error("compare", NULL);
		}
	}
	if (optind < argc)
		return bench_usage_error("compare", argv[optind]);
	if (help) {
		usage(stdout);
		return 0;
	}
	if (parse_sizes(&R, sizes ? sizes : R.quick ? "10000,50000" : "100000,1000000") < 0)
		return 2;
	if (R.csv_dir && compare_csv_prepare(&R) < 0)
		return 1;
	R.seed_wall_ns = R.quick ? NS_PER_S : 5 * NS_PER_S;
	R.gap_ns = R.quick ? 500 * NS_PER_MS : 2 * NS_PER_S;
	R.span_ns = R.quick ? 500 * NS_PER_MS : 1500 * NS_PER_MS;
	R.n_lat = R.quick ? 2000 : 5000;
	R.lat_rounds = rounds ? (unsigned)rounds : R.quick ? 1 : 3;
	R.built[C_CHIME] = R.built[C_WHEEL] = R.built[C_TFD] = 1;
	R.built[C_UV] = HAVE_LIBUV;
	R.built[C_EV] = HAVE_LIBEV;
	/* Fixed, so every large array is a fresh mapping and RSS deltas count it */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	bench_machine(&R.m);
	snprintf(R.cmd, sizeof(R.cmd), "%s", argv[0]);       /* "chime-bench compare" (main.c) */
	for (int i = 1; i < argc; i++) {
		size_t l = strlen(R.cmd);

		snprintf(R.cmd + l, sizeof(R.cmd) - l, " %s", argv[i]);
	}

	memset(&b, 0, sizeof(b));
	if (R.socket) {
		snprintf(b.sock, sizeof(b.sock), "%s", R.socket);
		if (broker_map_ctl(&b) < 0)
			return 1;
	} else if (broker_start(&b, 0, NULL) < 0) {
		broker_stop(&b);
		return 1;
	}
	inproc_wheel_resolution_ns = b.ctl->resolution_ns;
	{
		size_t mx = 0;

		for (size_t i = 0; i < R.nsizes; i++)
			mx = R.sizes[i] > mx ? R.sizes[i] : mx;
		R.tfd_max = fd_room(mx > R.n_lat ? mx : R.n_lat);
		/* Too few fds for timerfd at some size: add the most it can do, for every contender */
		mx = R.tfd_max / 1000 * 1000;
		if (mx >= 1000 && R.nsizes < MAX_SIZES) {
			size_t i = 0;

			while (i < R.nsizes && R.sizes[i] < mx)
				i++;
			if (i < R.nsizes && R.sizes[i] != mx) {
				memmove(R.sizes + i + 1, R.sizes + i, (R.nsizes - i) * sizeof(R.sizes[0]));
				R.sizes[i] = mx;
				R.nsizes++;
				R.added = mx;
			}
		}
	}
	/* PROBLEM() prints on stdout: with --json it goes to stderr, stdout keeps the JSON alone */
	if (R.json) {
		fflush(stdout);
		saved_out = dup(STDOUT_FILENO);
		dup2(STDERR_FILENO, STDOUT_FILENO);
	}
	for (size_t si = 0; si < R.nsizes; si++)
		run_size(&R, &b, si);
	run_seed(&R, &b);
	run_lat(&R, &b);
	if (R.csv_dir)
		(void)compare_csv(&R);  /* a failure is a PROBLEM() */
	if (saved_out >= 0) {
		fflush(stdout);
		dup2(saved_out, STDOUT_FILENO);
		close(saved_out);
	}
	if (R.json)
		compare_json(&R, &b);
	else
		compare_table(&R, &b);
	for (int k = 0; k < NR_LAT; k++)
		free(R.lat[k].recv);
	if (broker_stop(&b) < 0)
		g_problems++;
	if (g_problems)
		fprintf(stderr, "chime-bench compare: %d problem(s) seen (lines marked !!)\n", g_problems);
	return g_problems ? 1 : 0;
}
