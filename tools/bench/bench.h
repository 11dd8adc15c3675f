/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what chime-bench's modes share: a clock, a PRNG, medians, and
 * the mode entry points (one per file: wheel.c, e2e.c, ...).
 */
#ifndef CHIME_BENCH_H
#define CHIME_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "clock.h"     /* now_ns(), splitmix64() */

/*
 * What chime-bench's messages begin with: "chime-bench MODE" once main()
 * has picked a mode, "chime-bench" before (defined in bench.c, which every
 * build of a mode links, tools/bench's own and bench-ref's).
 */
extern const char *bench_prog;

/*
 * --json (compare, rest): bench_json once the mode took it, bench_json_done
 * once its document is printed. A run that fails before that gets one from
 * main() with the message of the last bench_error(), as chimectl -j's: an
 * empty stdout told a script nothing.
 */
extern int bench_json, bench_json_done;
extern char bench_last_error[1024];
/* A failure: "bench_prog: MESSAGE" on stderr, the message kept for that document. */
void bench_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A mode: argv[0] is the mode's name. Returns the exit status (2: usage). */
typedef int (*bench_mode_fn)(int argc, char **argv);

int bench_wheel(int argc, char **argv);
int bench_apply(int argc, char **argv);

/*
 * Every numeric option of every mode goes through these (the one parser of
 * chime-bench's options; chime-demo's parse_uint is the model). Strict: the
 * whole of s is a decimal number (no sign, space or 0x prefix) in min..max.
 * Otherwise they print "chime-bench MODE: OPT 'S': not a number (MIN..MAX)"
 * (or "out of range", for a negative or too large number) on stderr and
 * return -1, and the mode exits 2 before starting anything.
 */
int bench_opt_u64(const char *mode, const char *opt, const char *s, uint64_t min, uint64_t max,
		  uint64_t *out);
/* A comma list of such numbers, 1 to cap of them, into out[0..*n). */
int bench_opt_u64_list(const char *mode, const char *opt, const char *s, uint64_t min, uint64_t max,
		       uint64_t *out, size_t cap, size_t *n);
/*
 * A comma list of names, each exactly one of names[0..nnames) (at most 32):
 * bit i of *mask set for names[i]. An unknown or empty name is printed with
 * the valid ones, and -1 returned.
 */
int bench_opt_names(const char *mode, const char *opt, const char *s, const char *const *names,
		    unsigned nnames, uint32_t *mask);

/* --socket PATH: an empty PATH, or one too long for a unix socket, is a usage error, as for chimed; -1 then. */
int bench_opt_socket(const char *mode, const char *s, const char **out);
/*
 * The end of a mode's options: getopt_long() returned '?' (it printed what
 * was wrong), or arguments are left over. Prints one line saying so and
 * where the help is; returns 2 (a usage error), for the mode to return.
 */
int bench_usage_error(const char *mode, const char *unexpected);

/* Median of v[0..n) (sorts v). 0 if n == 0. */
double bench_median(double *v, size_t n);

/* Fisher-Yates shuffle of idx[0..n). */
void bench_shuffle(uint32_t *idx, size_t n, uint64_t *rng);

/* Anonymous mapping, NORESERVE; exits with a message on failure. */
void *bench_map(size_t len);
void bench_unmap(void *p, size_t len);

#define BENCH_MAX_THREADS 64

/* A process seen through /proc: CPU (both ways) and context switches, all threads. */
struct bench_thread {
	int tid;
	char comm[16];
	uint64_t sched_ns, vol, nonvol;
};

struct bench_proc {
	uint64_t t_ns;          /* CLOCK_MONOTONIC when read */
	uint64_t stat_ns;       /* utime+stime of /proc/PID/stat (and its children's), clock ticks as ns */
	uint64_t sched_ns;      /* sum over /proc/PID/task/x/schedstat: ns on a CPU, exact */
	uint64_t vol, nonvol;   /* sum over /proc/PID/task/x/status of the ctxt_switches */
	unsigned threads;
	struct bench_thread thr[BENCH_MAX_THREADS];    /* the first BENCH_MAX_THREADS, by /proc order */
};

/*
 * Process pid and its children (chimed's discard helper), their threads
 * in one table: 0, or -errno if /proc/PID cannot be read (the process
 * gone, or not readable): no sample then.
 */
int bench_proc_sample(pid_t pid, struct bench_proc *s);
/* Resident set of pid (0: this process), bytes, from /proc/PID/statm. */
uint64_t bench_rss_bytes(pid_t pid);

/* The machine and the moment, for a report's header. */
struct bench_machine {
	char model[128], kernel[80], date[32];
	long cpus;
	double load[3];
};

void bench_machine(struct bench_machine *m);

#endif /* CHIME_BENCH_H */
