/* SPDX-License-Identifier: MIT */
/*
 * compare.c - `chime-bench compare`: what users would pick instead, in one
 * run, on one machine, on the same workload, in one table (or --json).
 *
 * Contenders (columns): chime end to end (libchime + chimed), chime's wheel
 * in this process (broker/wheel.c without the rings), one timerfd per timer
 * (epoll), libuv uv_timer_t and libev ev_timer (when built). At each size:
 *
 *   arm, reset, cancel  ns per op on one thread, median of the means of
 *                       batches of 1000 (e2e's method; deadlines 1 h ahead,
 *                       timer i at base + i, reset to base + 1 s + i)
 *   expiry              all N due at one instant: ns from the deadline to the
 *                       last callback (or drained event), / N
 *   memory              bytes per timer (compare_run.c says what each counts)
 *
 * Then the seed workload (100k connections, 30 s idle timeout, touched in
 * 10 ms ticks at 3,000/s and 1M/s): CPU seconds per wall second of client
 * and broker; and lateness of a few thousand timers over a second or two.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "compare.h"

#define MAX_SIZES 8
#define NR_RATES 2
#define NR_LAT 3                /* chime, timerfd, libuv */

static const double seed_rates[NR_RATES] = { 3000, 1000000 };
static const int lat_c[NR_LAT] = { C_CHIME, C_TFD, C_UV };

struct run {
	int quick, json, built[NR_C];
	const char *socket, *csv_dir;
	char cmd[512];          /* how it was run, for the report */
	size_t sizes[MAX_SIZES], nsizes, tfd_max, n_lat;
	size_t added;           /* a size added for timerfd's sake (0: none) */
	uint64_t seed_wall_ns, gap_ns, span_ns;
	struct bench_machine m;
	struct size_res sz[MAX_SIZES][NR_C];
	struct seed_res seed[NR_RATES][NR_C];
	struct lat_result lat[NR_LAT];
	int lat_ran[NR_LAT];
};

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
				ok = (c == C_CHIME ? run_expire_chime(b, nt, R->gap_ns, &er) :
				      run_expire_tfd(nt, R->gap_ns, &er)) == 0 && er.ok;
			if (ok)
				r->fig[F_EXPIRE] = (double)er.drain_ns / (double)nt;
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
		run_chime_seed(b, seed_rates[k], R->seed_wall_ns, &R->seed[k][C_CHIME]);
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

static void run_lat(struct run *R, const struct broker *b)
{
	for (int k = 0; k < NR_LAT; k++) {
		int c = lat_c[k];

		if (!R->built[c])
			continue;
		progress(R, "lateness", R->n_lat, c);
		if (c == C_CHIME) {
			R->lat_ran[k] = run_lat_chime(b, R->n_lat, R->span_ns, &R->lat[k]) == 0;
			free(R->lat[k].fired);
		} else if (c == C_TFD) {
			R->lat_ran[k] = R->n_lat <= R->tfd_max && run_lat_tfd(R->n_lat, R->span_ns, &R->lat[k]) == 0;
#if HAVE_LIBUV
		} else {
			R->lat_ran[k] = run_uv_lat(R->n_lat, R->span_ns, &R->lat[k]) == 0;
#endif
		}
		if (R->lat_ran[k] && R->lat[k].got != R->n_lat)
			R->lat_ran[k] = 0;
	}
}

/* One CSV per contender: the sorted lateness in us and its cumulative fraction. */
static int write_csv(const struct run *R)
{
	char path[4096];

	if (mkdir(R->csv_dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "chime-bench: mkdir('%s'): %s\n", R->csv_dir, strerror(errno));
		return -1;
	}
	for (int k = 0; k < NR_LAT; k++) {
		const struct lat_result *l = &R->lat[k];
		FILE *f;

		if (!R->lat_ran[k])
			continue;
		snprintf(path, sizeof(path), "%s/%s.csv", R->csv_dir, contender_name[lat_c[k]]);
		if (!(f = fopen(path, "w"))) {
			fprintf(stderr, "chime-bench: %s: %s\n", path, strerror(errno));
			return -1;
		}
		fprintf(f, "lateness_us,cdf\n");
		for (size_t i = 0; i < l->got; i++)
			fprintf(f, "%.3f,%.6f\n", (double)l->recv[i] / 1e3, (double)(i + 1) / (double)l->got);
		fclose(f);
	}
	return 0;
}

/* ---- the report ------------------------------------------------------------ */

static const char *const col_title[NR_C] = { "chime e2e", "chime wheel", "timerfd", "libuv", "libev" };
static const char *const row_title[NR_F] = { "arm      ns/op", "reset    ns/op", "cancel   ns/op",
					     "expiry   ns/timer", "memory   B/timer" };

static void print_table(const struct run *R, const struct broker *b)
{
	char cnt[24];
	int tfd_short = 0;

	printf("chime-bench compare (%s): what users would pick instead; one run, one machine, same workload\n",
	       R->quick ? "--quick" : "full");
	printf("command: %s\n", R->cmd);
	printf("date:    %s\n", R->m.date);
	printf("machine: %ld CPUs online, %s, Linux %s; load average %.2f %.2f %.2f at start\n",
	       R->m.cpus, R->m.model, R->m.kernel, R->m.load[0], R->m.load[1], R->m.load[2]);
	printf("broker:  %s chimed (pid %d), %u shard(s), resolution %llu us; the in-process wheel uses the same\n",
	       b->pid ? "private" : "external", (int)b->ctl->pid, b->nr_shards,
	       (unsigned long long)(b->ctl->resolution_ns / 1000));
	printf("built:  ");
	for (int c = 0; c < NR_C; c++)
		printf(" %s%s", contender_name[c], R->built[c] ? "" : " (not built)");
	printf("\n\n");
	printf("%-22s", "");
	for (int c = 0; c < NR_C; c++)
		printf(" %13s", col_title[c]);
	printf("\n");
	for (size_t si = 0; si < R->nsizes; si++) {
		printf("%s timers\n", fmt_count(cnt, sizeof(cnt), R->sizes[si]));
		for (int f = 0; f < NR_F; f++) {
			printf("  %-20s", row_title[f]);
			for (int c = 0; c < NR_C; c++) {
				const struct size_res *r = &R->sz[si][c];
				char cell[32] = "-";

				if (r->ran && f <= F_CANCEL)    /* mean (median) */
					snprintf(cell, sizeof(cell), r->mean[f] >= 100 ? "%.0f (%.0f)" : "%.1f (%.1f)",
						 r->mean[f], r->fig[f]);
				else if (r->ran)
					snprintf(cell, sizeof(cell), "%.1f", r->fig[f]);
				else if (c == C_TFD && R->built[c] && R->sizes[si] > R->tfd_max)
					snprintf(cell, sizeof(cell), "- *");
				tfd_short |= c == C_TFD && R->sizes[si] > R->tfd_max;
				printf(" %13s", cell);
			}
			printf("\n");
		}
	}
	printf("seed: %uk connections, %llu s idle timeout, touched round robin in %llu ms ticks, %.0f s each\n",
	       SEED_CONNS / 1000, (unsigned long long)(SEED_IDLE_NS / NS_PER_S),
	       (unsigned long long)(SEED_TICK_NS / NS_PER_MS), (double)R->seed_wall_ns / 1e9);
	for (int k = 0; k < NR_RATES; k++) {
		printf("  %-20s", seed_rates[k] >= 1e6 ? "1M touches/s  CPU %" : "3k touches/s  CPU %");
		for (int c = 0; c < NR_C; c++) {
			const struct seed_res *s = &R->seed[k][c];
			char cell[32] = "-";

			if (s->ran)
				snprintf(cell, sizeof(cell), "%.2f", (s->cpu_client + s->cpu_broker) * 100);
			printf(" %13s", cell);
		}
		printf("\n  %-20s", "  client+broker");
		for (int c = 0; c < NR_C; c++) {
			const struct seed_res *s = &R->seed[k][c];
			char cell[32] = "-";

			if (s->ran && c == C_CHIME)
				snprintf(cell, sizeof(cell), "%.2f+%.2f", s->cpu_client * 100, s->cpu_broker * 100);
			else if (s->ran)
				snprintf(cell, sizeof(cell), "%.2f+0", s->cpu_client * 100);
			printf(" %13s", cell);
		}
		printf("\n  %-20s", "  touches done/s");
		for (int c = 0; c < NR_C; c++) {
			const struct seed_res *s = &R->seed[k][c];
			char cell[32] = "-";

			if (s->ran)
				snprintf(cell, sizeof(cell), "%.0f", s->touches_per_s);
			printf(" %13s", cell);
		}
		printf("\n");
	}
	printf("lateness: %s timers, random deadlines over %.1f s, received - deadline (us)\n",
	       fmt_count(cnt, sizeof(cnt), R->n_lat), (double)R->span_ns / 1e9);
	for (int q = 0; q < 3; q++) {
		static const char *const qn[3] = { "p50", "p99", "max" };

		printf("  %-20s", qn[q]);
		for (int c = 0; c < NR_C; c++) {
			char cell[32] = "-";

			for (int k = 0; k < NR_LAT; k++) {
				const struct lat_result *l = &R->lat[k];

				if (lat_c[k] != c || !R->lat_ran[k])
					continue;
				snprintf(cell, sizeof(cell), "%.1f", (q == 0 ? pct(l->recv, l->got, .5) :
					 q == 1 ? pct(l->recv, l->got, .99) : l->recv[l->got - 1]) / 1e3);
			}
			printf(" %13s", cell);
		}
		printf("\n");
	}
	printf("\n");
	if (tfd_short)
		printf("* timerfd needs a descriptor per timer and RLIMIT_NOFILE allows %zu here (its hard limit):\n"
		       "  no figure above that%s\n", R->tfd_max,
		       R->added ? "; the row of the most it allows was added so it has one like for like" : "");
	printf("arm/reset/cancel: one thread, batches of 1000, deadlines 1 h ahead: mean of all ops (their total\n"
	       "  time / N: waits on a full ring included) and, in parentheses, the median of the batch means.\n"
	       "  chime e2e: chime_arm/reset/cancel (the broker applies them on its own cores); wheel:\n"
	       "  wheel_arm/reset/cancel; timerfd: create+settime / settime / close; libuv: uv_timer_init+\n"
	       "  uv_timer_start / uv_timer_start / uv_timer_stop; libev: ev_timer_init+start / ev_timer_again\n"
	       "  / ev_timer_stop.\n"
	       "expiry: N timers due at one instant; deadline -> last callback (chime: chime_poll drain; timerfd:\n"
	       "  epoll_wait + read each), / N.\n"
	       "memory: RSS grown by arming N, / N; chime e2e adds the broker's node (its slab has nothing else\n"
	       "  per timer); timerfd adds the kernel's slab objects grown (/proc/slabinfo, system-wide).\n"
	       "seed CPU: %% of one core over the wall time: client getrusage, broker schedstat of all its threads.\n"
	       "lateness: chime_wait / epoll_wait / uv_run callback time - the deadline asked for (libuv rounds to\n"
	       "  whole ms of its loop clock, so it is never early and up to a ms late by design).\n");
}

static json_t *jfig(double v)
{
	return json_real(v);
}

static void print_json(const struct run *R, const struct broker *b)
{
	json_t *o = json_object(), *cs = json_array(), *sizes = json_array(), *seeds = json_array();
	json_t *lat = json_object(), *lres = json_object();

	json_object_set_new(o, "mode", json_string("compare"));
	json_object_set_new(o, "quick", json_boolean(R->quick));
	json_object_set_new(o, "command", json_string(R->cmd));
	json_object_set_new(o, "machine", json_pack("{s:s, s:s, s:s, s:i, s:[f,f,f]}", "date", R->m.date,
			    "cpu", R->m.model, "kernel", R->m.kernel, "cpus", (int)R->m.cpus,
			    "loadavg", R->m.load[0], R->m.load[1], R->m.load[2]));
	json_object_set_new(o, "broker", json_pack("{s:b, s:i, s:i, s:I, s:I}", "private", b->pid != 0,
			    "pid", (int)b->ctl->pid, "shards", (int)b->nr_shards,
			    "resolution_ns", (json_int_t)b->ctl->resolution_ns, "spin_us", (json_int_t)b->ctl->spin_us));
	for (int c = 0; c < NR_C; c++)
		if (R->built[c])
			json_array_append_new(cs, json_string(contender_name[c]));
	json_object_set_new(o, "contenders", cs);
	json_object_set_new(o, "tfd_max", json_integer((json_int_t)R->tfd_max));
	json_object_set_new(o, "size_added_for_timerfd", json_integer((json_int_t)R->added));
	for (size_t si = 0; si < R->nsizes; si++) {
		json_t *s = json_object(), *res = json_object();

		json_object_set_new(s, "timers", json_integer((json_int_t)R->sizes[si]));
		for (int c = 0; c < NR_C; c++) {
			const struct size_res *r = &R->sz[si][c];
			json_t *x;

			if (!r->ran)
				continue;
			x = json_object();
			json_object_set_new(x, "timers_run", json_integer((json_int_t)r->n));
			for (int f = 0; f < NR_F; f++)
				json_object_set_new(x, fig_name[f], jfig(r->fig[f]));
			for (int k = 0; k < NR_OPS; k++) {
				char name[32];

				snprintf(name, sizeof(name), "%s_mean_ns", op_name[k]);
				json_object_set_new(x, name, jfig(r->mean[k]));
			}
			json_object_set_new(res, contender_name[c], x);
		}
		json_object_set_new(s, "results", res);
		json_array_append_new(sizes, s);
	}
	json_object_set_new(o, "sizes", sizes);
	for (int k = 0; k < NR_RATES; k++) {
		json_t *s = json_object(), *res = json_object();

		json_object_set_new(s, "touches_per_s", json_real(seed_rates[k]));
		json_object_set_new(s, "connections", json_integer(SEED_CONNS));
		json_object_set_new(s, "idle_timeout_s", json_integer((json_int_t)(SEED_IDLE_NS / NS_PER_S)));
		json_object_set_new(s, "tick_ms", json_integer((json_int_t)(SEED_TICK_NS / NS_PER_MS)));
		json_object_set_new(s, "wall_s", json_real((double)R->seed_wall_ns / 1e9));
		for (int c = 0; c < NR_C; c++) {
			const struct seed_res *r = &R->seed[k][c];

			if (r->ran)
				json_object_set_new(res, contender_name[c], json_pack("{s:f, s:f, s:f, s:f}",
						    "cpu_total", r->cpu_client + r->cpu_broker, "cpu_client", r->cpu_client,
						    "cpu_broker", r->cpu_broker, "touches_per_s_done", r->touches_per_s));
		}
		json_object_set_new(s, "results", res);
		json_array_append_new(seeds, s);
	}
	json_object_set_new(o, "seed", seeds);
	json_object_set_new(lat, "timers", json_integer((json_int_t)R->n_lat));
	json_object_set_new(lat, "span_s", json_real((double)R->span_ns / 1e9));
	for (int k = 0; k < NR_LAT; k++) {
		const struct lat_result *l = &R->lat[k];

		if (R->lat_ran[k])
			json_object_set_new(lres, contender_name[lat_c[k]], json_pack("{s:f, s:f, s:f, s:I}",
					    "p50_us", pct(l->recv, l->got, .5) / 1e3, "p99_us", pct(l->recv, l->got, .99) / 1e3,
					    "max_us", l->recv[l->got - 1] / 1e3, "events", (json_int_t)l->got));
	}
	json_object_set_new(lat, "results", lres);
	json_object_set_new(o, "lateness", lat);
	json_object_set_new(o, "problems", json_integer(g_problems));
	json_dumpf(o, stdout, JSON_INDENT(2));
	printf("\n");
	json_decref(o);
}

/* ---- options ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chime-bench compare [--quick] [--json] [--socket PATH] [--sizes N,N...]\n"
		"                           [--lateness-csv DIR]\n"
		"chime end to end, chime's wheel in-process, a timerfd per timer, libuv and libev:\n"
		"arm, reset, cancel, expiry and memory per timer at each size; the seed workload's CPU\n"
		"(100k connections, 30 s idle timeout, 3,000 and 1M touches/s); lateness.\n"
		"\n"
		"  -s, --socket PATH        use the chimed at PATH (default: a private one)\n"
		"  -q, --quick              10k and 50k timers, 1 s seed runs (a smoke test)\n"
		"  -j, --json               the figures and the run's context as JSON on stdout\n"
		"  -S, --sizes LIST         timer counts (default 100000,1000000)\n"
		"  -L, --lateness-csv DIR   one CSV per contender's lateness (tools/bench/plot-lateness.sh)\n"
		"  -h, --help               show this help\n");
}

static int parse_sizes(struct run *R, const char *s)
{
	char *end;

	R->nsizes = 0;
	while (*s) {
		unsigned long long v = strtoull(s, &end, 10);

		if (end == s || v < 1000 || v > 4000000 || R->nsizes == MAX_SIZES)
			return -1;
		R->sizes[R->nsizes++] = (size_t)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return R->nsizes ? 0 : -1;
}

int bench_compare(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "json", no_argument, NULL, 'j' },
		{ "sizes", required_argument, NULL, 'S' },
		{ "lateness-csv", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct run R;
	const char *sizes = NULL;
	struct broker b;
	int opt, saved_out = -1;

	signal(SIGPIPE, SIG_IGN);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:qjS:L:h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's': R.socket = optarg; break;
		case 'q': R.quick = 1; break;
		case 'j': R.json = 1; break;
		case 'S': sizes = optarg; break;
		case 'L': R.csv_dir = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || parse_sizes(&R, sizes ? sizes : R.quick ? "10000,50000" : "100000,1000000") < 0) {
		usage(stderr);
		return 2;
	}
	R.seed_wall_ns = R.quick ? NS_PER_S : 5 * NS_PER_S;
	R.gap_ns = R.quick ? 500 * NS_PER_MS : 2 * NS_PER_S;
	R.span_ns = R.quick ? 500 * NS_PER_MS : 1500 * NS_PER_MS;
	R.n_lat = R.quick ? 2000 : 5000;
	R.built[C_CHIME] = R.built[C_WHEEL] = R.built[C_TFD] = 1;
	R.built[C_UV] = HAVE_LIBUV;
	R.built[C_EV] = HAVE_LIBEV;
	/* Fixed, so every large array is a fresh mapping and RSS deltas count it */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	bench_machine(&R.m);
	snprintf(R.cmd, sizeof(R.cmd), "chime-bench");
	for (int i = 0; i < argc; i++) {
		size_t l = strlen(R.cmd);

		snprintf(R.cmd + l, sizeof(R.cmd) - l, " %s", argv[i]);
	}

	memset(&b, 0, sizeof(b));
	if (R.socket) {
		snprintf(b.sock, sizeof(b.sock), "%s", R.socket);
		if (broker_map_ctl(&b) < 0)
			return 1;
	} else if (broker_start(&b, 0) < 0) {
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
	if (R.csv_dir && write_csv(&R) < 0)
		g_problems++;
	if (saved_out >= 0) {
		fflush(stdout);
		dup2(saved_out, STDOUT_FILENO);
		close(saved_out);
	}
	if (R.json)
		print_json(&R, &b);
	else
		print_table(&R, &b);
	for (int k = 0; k < NR_LAT; k++)
		free(R.lat[k].recv);
	if (broker_stop(&b) < 0)
		g_problems++;
	if (g_problems)
		fprintf(stderr, "chime-bench compare: %d problem(s) seen (lines marked !!)\n", g_problems);
	return g_problems ? 1 : 0;
}
