/* SPDX-License-Identifier: MIT */
/*
 * tsan_harness.h - what the plain tsan_* programs share (tsan_dispatch.c,
 * tsan_api.c): their TSan options, a private chimed in a temporary
 * directory, the ways a run ends or reports, and the relaxed words their
 * bookkeeping is kept in (below: TSan must see no edge of theirs).
 *
 * A program sets `prog` (the messages' prefix) and `chimed_path`, calls
 * start_broker(), names each scenario in `scenario_name` while no other of
 * its threads runs, and ends with stop_broker() and cleanup(). fail() may
 * be called from any thread.
 */
#ifndef CHIME_TSAN_HARNESS_H
#define CHIME_TSAN_HARNESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The test's own (harness.c's __tsan_default_options()), and chimed's and chimectl's by environment. */
#define TSAN_OPTS "halt_on_error=1 exitcode=66 second_deadlock_stack=1"
#define MAX_REPORT 20u                  /* violations reported; the rest only counted */

extern const char *prog;                /* "tsan_api" */
extern const char *chimed_path;
extern const char *scenario_name;
extern char dir[64], sock_path[128], log_path[128], ctl_log_path[128];   /* dir/chimectl.log: for a program's chimectl */
extern pid_t broker;                    /* atomic: fail() may run in any thread */
extern pthread_mutex_t broker_lock;     /* broker_alive() against a crash the program makes */
extern uint64_t violations;             /* atomic */

/*
 * The programs' own bookkeeping (their records of what each thread did,
 * which another thread's checks read) must not give TSan happens-before
 * edges between the threads: a release here and an acquire there would
 * order everything the library did before and after them, and TSan would
 * take its races for ordered accesses (the first versions of tsan_api and
 * tsan_dispatch, with a seq_cst stamp counter and release/acquire records,
 * ordered every producer's calls before the drainer's next ones). So every
 * shared word of a program's bookkeeping is a relaxed atomic (RD, WR), and
 * where one publishes others (a record, then its count: pub32(), sub32())
 * the order comes from the hardware and the compiler: on x86 (TSO) stores
 * are seen in program order and loads are not reordered with loads, and a
 * compiler barrier (a signal fence, which TSan does not take for
 * synchronization) keeps the compiler's order; every locked instruction
 * (the stamp, an ownership CAS) is a full barrier. Elsewhere the real
 * orders are used, and TSan sees less there. The harness itself orders
 * threads only when a run ends (fail(), broker_alive()'s lock).
 */
#if defined(__x86_64__) || defined(__i386__)
#define ORD_REL   __ATOMIC_RELAXED
#define ORD_ACQ   __ATOMIC_RELAXED
#define ORD_STAMP __ATOMIC_RELAXED
#else
#define ORD_REL   __ATOMIC_RELEASE
#define ORD_ACQ   __ATOMIC_ACQUIRE
#define ORD_STAMP __ATOMIC_SEQ_CST
#endif
#define CC_BARRIER() __atomic_signal_fence(__ATOMIC_SEQ_CST)
#define RD(x)        __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define WR(x, v)     __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* Publish a word after the records it counts or names (stored before it). */
static inline void pub32(uint32_t *p, uint32_t v)
{
	CC_BARRIER();
	__atomic_store_n(p, v, ORD_REL);
}

static inline void pub64(uint64_t *p, uint64_t v)
{
	CC_BARRIER();
	__atomic_store_n(p, v, ORD_REL);
}

/* Read such a word before the records it counts or names. */
static inline uint32_t sub32(const uint32_t *p)
{
	uint32_t v = __atomic_load_n(p, ORD_ACQ);

	CC_BARRIER();
	return v;
}

static inline uint64_t sub64(const uint64_t *p)
{
	uint64_t v = __atomic_load_n(p, ORD_ACQ);

	CC_BARRIER();
	return v;
}

/*
 * Real-time order of calls across threads: one counter, one locked add (a
 * full barrier on x86). A stamp taken after a call returned is below one
 * another thread takes later.
 */
uint64_t stamp(void);

void pause_ns(long ns);

/* Kill the broker, remove the directory (chimed's files too). Idempotent. */
void cleanup(void);

/* Stop at once, from any thread: the logs are shown, the broker goes too. */
__attribute__((noreturn, format(printf, 1, 2))) void fail(const char *fmt, ...);

/* A violated check: reported (the first MAX_REPORT), counted, and the run goes on. */
__attribute__((format(printf, 1, 2))) void violation(const char *fmt, ...);

/* chimed exited (a race report, with halt_on_error): fail() saying so. */
void broker_alive(void);

/* A call failed: if it is because chimed exited, say that instead. */
#define fail_op(r, ...)							\
	do {								\
		if ((r) == -ENOTCONN) {					\
			pause_ns(100000000);				\
			broker_alive();					\
		}							\
		fail(__VA_ARGS__);					\
	} while (0)

/* chimed --foreground --shards 2 on sock_path, its stderr appended to log_path (posix_spawn: threads run). */
pid_t spawn_broker(void);

/* A new directory (/tmp/chime-PROG-XXXXXX), its paths, and chimed listening there. */
void start_broker(void);

/* SIGTERM; fail() unless chimed exited 0 and no log there reported a race. */
void stop_broker(void);

/* Lines of the file at path that hold `what` and `and` (NULL: any). */
unsigned log_lines(const char *path, const char *what, const char *and);
bool log_says(const char *path, const char *what);

#endif /* CHIME_TSAN_HARNESS_H */
