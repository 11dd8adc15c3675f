/* SPDX-License-Identifier: MIT */
/*
 * compare.h - `chime-bench compare` (what users would pick instead) and
 * `chime-bench rest` (the broker's cost with timers armed and nothing due).
 *
 *   compare.c        the driver: options, the contenders in order
 *   compare_report.c the table, --json, the lateness CSVs
 *   compare_run.c    the contenders that live in this process behind one
 *                    interface (chime's wheel, libuv, libev), their timing
 *                    harness; chime end to end and timerfd through e2e's phases
 *   compare_uv.c     libuv uv_timer_t (built when libuv1-dev is there)
 *   compare_ev.c     libev ev_timer (built when libev-dev is there)
 *   rest.c           `chime-bench rest`
 */
#ifndef CHIME_BENCH_COMPARE_H
#define CHIME_BENCH_COMPARE_H

#include "bench.h"
#include "e2e.h"

int bench_compare(int argc, char **argv);
int bench_rest(int argc, char **argv);

/* The contenders, in the table's column order. */
enum { C_CHIME, C_WHEEL, C_TFD, C_UV, C_EV, NR_C };
/*
 * Their figures at one size: ns per op (in e2e's OP_ order), ns per expired
 * timer (deadline to last), us from the deadline to the first (the wake-up
 * inside that figure: at small N it is most of it), bytes per timer.
 */
enum { F_ARM, F_RESET, F_TOUCH, F_CANCEL, F_EXPIRE, F_FIRST, F_MEM, NR_F };

extern const char *const contender_name[NR_C];
extern const char *const fig_name[NR_F];

struct size_res {
	size_t n;               /* timers it ran with (timerfd: at most what RLIMIT_NOFILE allows) */
	double fig[NR_F];       /* arm, reset, touch, cancel: the median of batch means */
	double mean[NR_OPS];    /* arm, reset, touch, cancel: all ops / their time (stalls included) */
	int ran;                /* 1 measured, 0 not built or not run */
};

/*
 * An in-process contender. Timer i of n is armed at base_ns + i, reset to
 * base_ns + NS_PER_S + i, then touched: reset again, to 2 s after base_ns
 * (absolute CLOCK_MONOTONIC; a library with relative timeouts converts).
 * Return 0 or -errno.
 */
struct inproc {
	int (*setup)(size_t n);                 /* handles for n timers, none armed */
	int (*arm)(size_t lo, size_t hi, uint64_t base_ns);
	int (*reset)(size_t lo, size_t hi, uint64_t base_ns);
	int (*cancel)(size_t lo, size_t hi);
	/* Arm all n at d_ns (untimed: the harness checks it ended before d_ns). */
	int (*arm_at)(size_t n, uint64_t d_ns);
	/* Run until every callback ran: how many ran, when the first and the last did. */
	long (*expire)(size_t n, uint64_t *first_ns, uint64_t *last_ns);
	void (*teardown)(void);
};

extern const struct inproc inproc_wheel;
extern uint64_t inproc_wheel_resolution_ns;   /* the broker's, so both wheels tick alike */

/* The seed workload: conns timers of idle_ns, `rate` touches per second for wall_ns. */
struct seed_res {
	double cpu_client;      /* CPU s per wall s, this process (getrusage) */
	double cpu_broker;      /* CPU s per wall s, the broker (schedstat of its threads); 0 in-process */
	double touches_per_s;   /* achieved */
	int ran;
};

#define SEED_CONNS     100000u
#define SEED_IDLE_NS   (30 * NS_PER_S)
#define SEED_TICK_NS   (10 * NS_PER_MS)   /* every contender touches in 10 ms ticks */
/*
 * SEED_WARM: before the measured window every contender touches each
 * connection once, untimed: connections that have lived a while (chime's
 * first reset of a timer is a record, its later ones a word in the touch
 * table; at 3,000 touches/s a 5 s window would touch no connection twice).
 */

/* Touches owed at time t since t0 at `rate`/s, minus those done. */
static inline uint64_t seed_owed(uint64_t t0, uint64_t t, double rate, uint64_t done)
{
	uint64_t due = (uint64_t)((double)(t - t0) * rate / 1e9);

	return due > done ? due - done : 0;
}

#define MAX_SIZES 8
#define NR_RATES 2
#define NR_LAT 3                /* chime, timerfd, libuv */

extern const double seed_rates[NR_RATES];     /* touches per second */
extern const int lat_c[NR_LAT];                /* the contenders with a lateness figure */

/* One run of `compare`: its settings and every figure (compare.c fills, compare_report.c prints). */
struct run {
	int quick, json, built[NR_C];
	const char *socket, *csv_dir;
	char cmd[512];          /* how it was run, for the report */
	size_t sizes[MAX_SIZES], nsizes, tfd_max, n_lat;
	unsigned lat_rounds;     /* lateness: rounds of every contender in turn, pooled */
	size_t added;           /* a size added for timerfd's sake (0: none) */
	uint64_t seed_wall_ns, gap_ns, span_ns;
	struct bench_machine m;
	struct size_res sz[MAX_SIZES][NR_C];
	struct seed_res seed[NR_RATES][NR_C];
	struct seed_res seed_records[NR_RATES];  /* chime opened with CHIME_OPEN_RECORD_RESETS */
	struct lat_result lat[NR_LAT];  /* recv: every round's, sorted; got: n_lat x lat_rounds if it ran */
	int lat_ran[NR_LAT];
};


/* compare_report.c */
int compare_csv_prepare(const struct run *R);
int compare_csv(const struct run *R);
void compare_table(const struct run *R, const struct broker *b);
void compare_json(const struct run *R, const struct broker *b);

double seed_cpu_self(void);     /* this process's user+system CPU, seconds */

int run_inproc_ops(const struct inproc *c, size_t n, unsigned batch, struct size_res *r);
int run_inproc_expire(const struct inproc *c, size_t n, uint64_t gap_ns, struct size_res *r);
int run_chime_mem(const struct broker *b, size_t n, double *bytes);
int run_tfd_mem(size_t n, double *bytes);
/* flags: chime_opts.flags (CHIME_OPEN_RECORD_RESETS: every reset a record, as before touch tables) */
int run_chime_seed(const struct broker *b, unsigned flags, double rate, uint64_t wall_ns, struct seed_res *r);

#if HAVE_LIBUV
extern const struct inproc inproc_uv;
int run_uv_seed(double rate, uint64_t wall_ns, struct seed_res *r);
int run_uv_lat(size_t n, uint64_t span_ns, struct lat_result *res);
#endif
#if HAVE_LIBEV
extern const struct inproc inproc_ev;
int run_ev_seed(double rate, uint64_t wall_ns, struct seed_res *r);
#endif

#endif /* CHIME_BENCH_COMPARE_H */
