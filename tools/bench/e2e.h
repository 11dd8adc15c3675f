/* SPDX-License-Identifier: MIT */
/*
 * e2e.h - chime-bench's end-to-end mode: libchime + a real chimed, beside one
 * timerfd per timer. The mode is split by phase:
 *
 *   e2e.c         the driver: options, the table's header, the phases in order
 *   e2e_broker.c  the broker (a private chimed, or --socket) and its counters,
 *                 read through tools/statsread (the one control-segment reader),
 *                 and the small helpers the phases share
 *   e2e_ops.c     1. client operations, 2. broker throughput
 *   e2e_fire.c    3. expirations per second, 4. lateness
 */
#ifndef CHIME_BENCH_E2E_H
#define CHIME_BENCH_E2E_H

#include <chime.h>

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench.h"     /* bench_prog */
#include "clock.h"
#include "statsread.h"

/*
 * `chime-bench e2e [--socket PATH] [--quick] [--shards N] [--only PARTS] ...`.
 * argv[0] is the mode's name. Prints one table; returns the process exit
 * status (0 ok, 1 failure or a correctness problem seen, 2 usage).
 */
int bench_e2e(int argc, char **argv);

/* ---- shared by the phases ---- */

#define NS_PER_S   UINT64_C(1000000000)
#define NS_PER_MS  UINT64_C(1000000)
#define FAR_NS     (3600 * NS_PER_S)        /* "never fires during the run" */
#define MAX_THR    2u
#define EV_BATCH   512u

/* Set when a correctness problem was seen: the exit status says so. */
extern int g_problems;

#define PROBLEM(...) do { g_problems++; printf("  !! " __VA_ARGS__); } while (0)

void sleep_ns(uint64_t ns);
void sleep_until(uint64_t t_ns);
int cmp_u64(const void *a, const void *b);
/* The q quantile of sorted a[0..n), nearest rank (the ceil(q n)-th value); 0 if n is 0. */
uint64_t pct(const uint64_t *a, size_t n, double q);
const char *fmt_count(char *buf, size_t len, uint64_t n);
void *xcalloc(size_t n, size_t sz);
int tfd_set(int fd, uint64_t deadline_ns);
/* Raise RLIMIT_NOFILE to hold `want` fds; returns how many timerfds fit. */
size_t fd_room(size_t want);

struct broker {
	pid_t pid;                      /* 0: not ours */
	char dir[PATH_MAX - 64];        /* our private directory, "" if none */
	char sock[PATH_MAX];
	char bin[PATH_MAX];
	struct sr sr;                   /* its control segment, read-only */
	struct chime_ctl hdr;           /* its header as broker_map_ctl() read it (sr_snapshot()) */
	const struct chime_ctl *ctl;    /* &hdr: what a broker sets once (pid, sizes), never the live segment */
	uint32_t nr_shards;
	uint64_t capacity;              /* broker_start(): if not 0, --capacity this, no per-client quota */
	uint64_t armed_base;            /* others' timers on an external broker when mapped: wait_armed() counts past them */
};

struct shard_sum {
	uint64_t t_ns;
	uint64_t armed, ops, arms, resets, cancels, fires, delivered, busy_ns, malformed, backlog;
	uint64_t lat_max_ns;
	uint64_t cpu_ns;        /* the shard threads' CPU time */
};

/* Map the control segment of the broker at b->sock (an external one: --socket). */
int broker_map_ctl(struct broker *b);
/* chime_open() of the private broker, with chime_opts.flags. */
int broker_open(struct broker *b, unsigned flags, chime_t **c);
/* spin_us: chimed's --spin-us (NULL: its default) */
int broker_start(struct broker *b, int shards, const char *spin_us);
int broker_stop(struct broker *b);
/* Wait until the broker holds `want` armed timers besides b->armed_base; -1 (said) after timeout_ns. */
int wait_armed(const struct broker *b, uint64_t want, uint64_t timeout_ns);
/* Wait until the broker has applied every record c published (its rings empty). */
int wait_applied(chime_t *c, uint64_t timeout_ns);
void shards_read(const struct broker *b, struct shard_sum *s);

/*
 * OP_RESET is each timer's first reset (with a touch table, a record: the
 * shard flags the timer); OP_TOUCH its second, to a later deadline still:
 * a keepalive's, the word alone.
 */
enum { OP_ARM, OP_RESET, OP_TOUCH, OP_CANCEL, NR_OPS };
enum { IMPL_CHIME, IMPL_TFD, IMPL_SUBMIT };  /* IMPL_SUBMIT: chime_submit, SUBMIT_BATCH ops a call */
#define SUBMIT_BATCH 64u
extern const char *const op_name[NR_OPS];
extern const char *const tfd_op_name[NR_OPS];

struct op_result {
	double median_ns;       /* median of batch means */
	double mean_ns;         /* all ops / all time on the calling threads */
	double mops;            /* aggregate: N ops / wall time of the phase, M/s */
	int err;                /* first error (-errno) */
};

struct flood_result {
	double ops_per_shard;   /* M/s, wall */
	double busy_share;      /* busy_ns / (window * shards) */
	double ops_per_busy;    /* M/s per shard-busy-second */
	double client_mops;     /* resets issued by the clients, M/s */
	int err;
};

struct expire_result {
	size_t n;
	uint64_t drain_ns;      /* deadline -> last event */
	uint64_t first_ns;      /* deadline -> first event */
	double per_s;
	double client_cpu;      /* the draining thread's CPU ns per event, first event to last */
	double shard_cpu;       /* the shards' CPU ns per event, deadline to last event (all shards) */
	int ok;
};

struct lat_result {
	size_t n, got;
	uint64_t *fired;        /* sorted, fired_ns - deadline (chime only) */
	uint64_t *recv;         /* sorted, receive time - deadline */
};

int run_ops(int impl, const struct broker *b, size_t n, unsigned nthr, unsigned batch,
	    struct op_result res[NR_OPS]);
/*
 * The same in bursts: before each batch (untimed) the bench waits until the
 * broker has applied every earlier one, of every thread, so each batch goes
 * into empty rings, to a broker that may have gone to sleep meanwhile; then
 * the nthr threads start theirs together. What the application's thread
 * pays for a burst (the timers of a thousand new connections), without the
 * waits on a full ring a sustained flood has; with 2 threads, beside
 * another thread doing the same on the same chime_t. cold: every CPU's
 * caches flushed (untimed) between the arms and the first resets, as the
 * interval before a keepalive's first reset would.
 */
int run_ops_bursts(int impl, const struct broker *b, size_t n, unsigned nthr, unsigned batch, int cold,
		   struct op_result res[NR_OPS]);
int run_flood(const struct broker *b, size_t n, uint64_t dur_ns, struct flood_result *res);

/*
 * Sporadic operations: one at a time after `idle_ns` asleep, so the shard
 * has gone to sleep too. ns on the calling thread, sorted: a keepalive
 * reset (no doorbell: the shard's planned wake-up is earlier), an arm due
 * in 50 ms (before it: a doorbell wakes the shard), an arm due in 5 s (a
 * second or more ahead: no doorbell, the heartbeat has it applied), and the
 * same reset of one timerfd (timerfd_settime), taking turns in one loop.
 */
struct sporadic_result {
	size_t n;
	uint64_t *reset_ns, *arm_ns, *arm_far_ns, *tfd_ns;      /* n each, sorted */
};
int run_sporadic(const struct broker *b, size_t n, uint64_t idle_ns, struct sporadic_result *res);
/* timerfd_settime from 2 threads over n timerfds for dur_ns: M calls/s in all, or -1 (a failure, reported). */
double run_tflood(size_t n, uint64_t dur_ns);
/*
 * busy_poll: drain with chime_poll() in a loop, spinning on a CPU the shards
 * may need; else block in chime_wait(), as a client that waits for its
 * timers does (and as the timerfd row blocks in epoll_wait())
 */
int run_expire_chime(const struct broker *b, size_t n, uint64_t gap_ns, int busy_poll,
		     struct expire_result *res);
int run_expire_tfd(size_t n, uint64_t gap_ns, struct expire_result *res);
/* busy_poll: drain with chime_poll() in a loop instead of blocking in chime_wait() */
int run_lat_chime(const struct broker *b, size_t n, uint64_t span_ns, int busy_poll,
		  struct lat_result *res);
int run_lat_tfd(size_t n, uint64_t span_ns, struct lat_result *res);
/*
 * The lateness runs' earliest deadline is this far after the clock read
 * before arming (every contender the same: 100 ms, plus 3 us a timer for
 * timerfd_settime's worst here). Arming that ends after it would count as
 * lateness: lat_armed_late() then reports a problem and returns 1.
 */
#define LAT_LEAD_NS(n) (100 * NS_PER_MS + (uint64_t)(n) * 3000)
int lat_armed_late(uint64_t t0, size_t n, const char *who);
/*
 * The floor under a client operation (e2e_floor.c): ns to hand one 64-byte
 * record to a thread on another CPU through a ring, in bursts of `burst`
 * into slots the consumer wrote last, published in the ways e2e_floor.c names.
 */
enum floor_way { FLOOR_PLAIN, FLOOR_XCHG, FLOOR_CAS_XCHG, FLOOR_CAS_XCHG_AHEAD, FLOOR_BATCH, FLOOR_BATCH_AHEAD, NR_FLOOR };
struct floor_result {
	double ns[NR_FLOOR];    /* median over bursts, ns per record */
	int cpu[2];             /* producer, consumer */
};
int run_floor(unsigned burst, struct floor_result *res);
/* The calling thread onto CPU cpu (none if negative): 0 or -errno. */
int e2e_pin_to(int cpu);

/* The floor under busy-poll lateness here: a bare loop reading the clock, same deadlines. */
int run_lat_spin(size_t n, uint64_t span_ns, struct lat_result *res);

#endif /* CHIME_BENCH_E2E_H */
