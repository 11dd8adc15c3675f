/* SPDX-License-Identifier: MIT */
/*
 * compare_report.c - chime-bench compare: what a run measured, as the
 * table, as JSON (--json), and the lateness CSVs (--lateness-csv). See
 * compare.c for the method.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "compare.h"

/*
 * The --lateness-csv directory, made and checked before the runs: a path
 * that cannot hold the files fails at once, not after minutes of benchmark.
 */
int compare_csv_prepare(const struct run *R)
{
	struct stat st;

	if (mkdir(R->csv_dir, 0755) < 0 && errno != EEXIST) {
		bench_error("--lateness-csv: cannot make directory '%s': %s", R->csv_dir, strerror(errno));
		return -1;
	}
	if (stat(R->csv_dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
		bench_error("--lateness-csv: '%s' is not a directory", R->csv_dir);
		return -1;
	}
	if (access(R->csv_dir, W_OK | X_OK) < 0) {
		bench_error("--lateness-csv: cannot write in '%s': %s", R->csv_dir, strerror(errno));
		return -1;
	}
	/* An earlier run's CSV of a contender this run leaves out would be plotted beside this run's */
	for (int k = 0; k < NR_LAT; k++) {
		char path[4096];

		snprintf(path, sizeof(path), "%s/%s.csv", R->csv_dir, contender_name[lat_c[k]]);
		if (unlink(path) < 0 && errno != ENOENT) {
			bench_error("--lateness-csv: cannot remove the earlier '%s': %s", path, strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* One CSV per contender: the sorted lateness in us and its cumulative fraction. */
int compare_csv(const struct run *R)
{
	char path[4096];

	for (int k = 0; k < NR_LAT; k++) {
		const struct lat_result *l = &R->lat[k];
		FILE *f;

		if (!R->lat_ran[k])
			continue;
		snprintf(path, sizeof(path), "%s/%s.csv", R->csv_dir, contender_name[lat_c[k]]);
		if (!(f = fopen(path, "w"))) {
			PROBLEM("cannot write %s: %s\n", path, strerror(errno));
			return -1;
		}
		fprintf(f, "lateness_us,cdf\n");
		for (size_t i = 0; i < l->got; i++)
			fprintf(f, "%.3f,%.6f\n", (double)l->recv[i] / 1e3, (double)(i + 1) / (double)l->got);
		if (ferror(f) | fclose(f)) {    /* both: fclose() always closes */
			PROBLEM("cannot write %s: %s\n", path, strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* ---- the report ------------------------------------------------------------ */

static const char *const col_title[NR_C] = { "chime e2e", "chime wheel", "timerfd", "libuv", "libev" };
static const char *const row_title[NR_F] = { "arm      ns/op", "reset    ns/op", "touch    ns/op", "cancel   ns/op",
					     "expiry   ns/timer", "  first after  us", "memory   B/timer" };

void compare_table(const struct run *R, const struct broker *b)
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
		if (R->seed_records[k].ran)
			printf("  %-20s %13.2f (%.2f+%.2f; chime with CHIME_OPEN_RECORD_RESETS: a record per touch)\n",
			       "  records instead", (R->seed_records[k].cpu_client + R->seed_records[k].cpu_broker) * 100,
			       R->seed_records[k].cpu_client * 100, R->seed_records[k].cpu_broker * 100);
	}
	printf("lateness: %s timers, random deadlines over %.1f s, received - deadline (us); %u round%s of the\n"
	       "  contenders in turn, pooled\n", fmt_count(cnt, sizeof(cnt), R->n_lat), (double)R->span_ns / 1e9,
	       R->lat_rounds, R->lat_rounds == 1 ? "" : "s");
	for (int q = 0; q < 3; q++) {
		static const char *const qn[3] = { "p50", "p99", "max" };

		printf("  %-20s", qn[q]);
		for (int c = 0; c < NR_C; c++) {
			char cell[32] = "-";

			for (int k = 0; k < NR_LAT; k++) {
				const struct lat_result *l = &R->lat[k];

				if (lat_c[k] != c)
					continue;
				if (c == C_TFD && R->built[c] && R->n_lat > R->tfd_max) {
					snprintf(cell, sizeof(cell), "- *");
					tfd_short = 1;
				}
				if (!R->lat_ran[k])
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
	printf("arm/reset/touch/cancel: one thread, batches of 1000, deadlines 1 h ahead: mean of all ops (their\n"
	       "  total time / N: waits on a full ring included) and, in parentheses, the median of the batch\n"
	       "  means. reset: each timer's first, 1 s later; touch: its second, 1 s later still (a keepalive's;\n"
	       "  chime: the first is a record, which flags the timer, the second a word in the touch table).\n"
	       "  chime e2e: chime_arm/reset/cancel (the broker applies them on its own cores); wheel:\n"
	       "  wheel_alloc+wheel_arm / wheel_reset / wheel_free (its slab populated ahead, as the broker's);\n"
	       "  timerfd: create+settime / settime / close; libuv: uv_timer_init+\n"
	       "  uv_timer_start / uv_timer_start / uv_timer_stop; libev: ev_timer_init+start / ev_timer_again\n"
	       "  / ev_timer_stop.\n"
	       "expiry: N timers due at one instant; deadline -> last callback (chime: drained through chime_wait;\n"
	       "  timerfd: epoll_wait + read each), / N. It includes the wake-up, deadline -> first callback, the\n"
	       "  row below it (libuv and libev wait in epoll_wait's whole ms): at small N it is most of it.\n"
	       "memory: RSS grown by arming N, / N; chime e2e adds the broker's node (its slab has nothing else\n"
	       "  per timer); timerfd adds the kernel's slab objects grown (/proc/slabinfo, system-wide).\n"
	       "seed CPU: %% of one core over the wall time: client getrusage, broker schedstat of all its threads.\n"
	       "lateness: chime_wait / read(2) of the timerfd / uv_run callback time - the deadline asked for\n"
	       "  (libuv: the deadline rounded up to a whole ms of its loop clock, then epoll_wait's timeout in\n"
	       "  whole ms from a loop time up to a ms old: never early, 0.5-2 ms late by design).\n");
}

static json_t *jfig(double v)
{
	return json_real(v);
}

void compare_json(const struct run *R, const struct broker *b)
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
		if (R->seed_records[k].ran) {
			const struct seed_res *r = &R->seed_records[k];

			json_object_set_new(res, "chime_records", json_pack("{s:f, s:f, s:f, s:f}",
					    "cpu_total", r->cpu_client + r->cpu_broker, "cpu_client", r->cpu_client,
					    "cpu_broker", r->cpu_broker, "touches_per_s_done", r->touches_per_s));
		}
		json_object_set_new(s, "results", res);
		json_array_append_new(seeds, s);
	}
	json_object_set_new(o, "seed", seeds);
	json_object_set_new(lat, "timers", json_integer((json_int_t)R->n_lat));
	json_object_set_new(lat, "rounds", json_integer((json_int_t)R->lat_rounds));
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
	bench_json_done = 1;
	json_decref(o);
}
