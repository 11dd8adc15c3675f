/* SPDX-License-Identifier: MIT */
/*
 * tsan_harness.h - what the plain tsan_* programs share (tsan_dispatch.c,
 * tsan_api.c): their TSan options, a private chimed in a temporary
 * directory, and the ways a run ends or reports.
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
