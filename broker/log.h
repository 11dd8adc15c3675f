/* SPDX-License-Identifier: MIT */
/*
 * log.h - chimed's one-line messages on stderr.
 *
 * Format: "chimed: [level: ]what failed 'object': strerror (hint)". Errors
 * and warnings carry their level; info lines carry none; debug lines are
 * dropped unless --verbose. Each line is formatted into a private buffer and
 * written with one write(2), so lines from different threads never interleave.
 *
 * The shard loop never logs (STYLE.md 6): its counters live in the control
 * segment. Only start-up and shutdown of a shard thread may log.
 */
#ifndef CHIMED_LOG_H
#define CHIMED_LOG_H

#include <syslog.h>

/* Messages above this syslog level are dropped (LOG_INFO by default). */
extern int log_max_level;

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Log "<fmt>: strerror(err)" and return -|err|, so a caller can write
 * `return log_errno(LOG_ERR, r, "mmap('%s')", path);`.
 */
int log_errno(int level, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The same with a hint after the error text: "...: strerror (hint)". */
int log_errno_hint(int level, int err, const char *hint, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif /* CHIMED_LOG_H */
