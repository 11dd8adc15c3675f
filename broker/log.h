/* SPDX-License-Identifier: MIT */
/*
 * log.h - chimed's one-line messages: on stderr in the foreground (with
 * "<level>" prefixes when stderr is systemd's journal), to syslog (ident
 * "chimed", facility daemon) once daemonized.
 *
 * Format: "chimed: [level: ]what failed 'object': strerror (hint)". Errors
 * and warnings carry their level; info lines carry none; lines above
 * --log-level (default info; -v: debug) are dropped. Each line is formatted
 * into a private buffer and written with one write(2) (or one datagram to
 * /dev/log), so lines from different threads never interleave. Lines a client can provoke
 * go through log_ratelimit().
 *
 * The shard loop never logs (../shared/STYLE.md 6): its counters live in
 * the control segment. Only start-up and shutdown of a shard thread may log.
 */
#ifndef CHIMED_LOG_H
#define CHIMED_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

/* Messages above this syslog level are dropped (LOG_INFO by default). */
extern int log_max_level;

/*
 * "err", "warning", "notice", "info" or "debug" to a syslog level; -EINVAL
 * for anything else.
 */
int log_parse_level(const char *name);

/*
 * From now on send lines to syslog (ident "chimed", LOG_PID, LOG_DAEMON),
 * never waiting for it: a line /dev/log has no room for is dropped and
 * counted, and the next one sent says how many. If nothing listens at
 * /dev/log, a warning says so first, where lines went until now (stderr).
 */
void log_use_syslog(void);

/*
 * At the start, before the first line: from now on, a line stderr has no
 * room for (its reader is not reading) is dropped and counted, never waited
 * for; the next line written says how many. When stderr is systemd's
 * journal stream ($JOURNAL_STREAM names it), lines are prefixed with
 * "<level>" so the journal keeps their priority.
 */
void log_stderr_setup(void);

/* Back to plain stderr (log_stderr_setup() again to redo it): before closing every inherited descriptor. */
void log_stderr_reset(void);

/* Reopen the log (SIGHUP): connect to /dev/log anew when logging to syslog, else nothing. */
void log_reopen(void);

/*
 * Rate limit for lines a client can provoke: true at most once per
 * `interval_s` seconds per `*last` (a per-key CLOCK_MONOTONIC stamp in
 * seconds, 0 initially). Not atomic: one thread per key.
 */
bool log_ratelimit(uint64_t *last, unsigned interval_s);

/*
 * A budget for routine lines any client can cause at will (connects,
 * disconnects, sessions parked): up to `per_s` lines a second, the rest
 * dropped and counted; the first line let through after a drop is
 * preceded by one saying how many were dropped, and of what (`what`).
 * One client opening and closing in a loop would otherwise write
 * megabytes a minute to the journal, which then drops this service's
 * warnings too. Not atomic: one thread per budget.
 */
struct log_budget {
	uint64_t sec;           /* the second `used` counts in (CLOCK_MONOTONIC) */
	uint32_t used;
	uint64_t dropped;       /* since the last line let through */
};

bool log_budget_take(struct log_budget *b, unsigned per_s, const char *what);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Log "<fmt>: strerror(err)" and return -|err|, so a caller can write
 * `return log_errno(LOG_ERR, r, "mmap('%s')", path);`.
 */
int log_errno(int level, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The same with a hint after the error text: "...: strerror (hint)". */
int log_errno_hint(int level, int err, const char *hint, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

struct stat;

/*
 * A state file chime_seg_ours() refused (what: "lock file", "sessions
 * file", "shard file"; remedy: what to do): another uid's, or one with a
 * second name (a hard link someone made to a file of theirs or root's);
 * else one that is ours and that open(2) or fchmod(2) refused EPERM (an
 * immutable or append-only file). Returns -EPERM.
 */
int log_file_not_ours(const char *what, const char *path, const struct stat *st, const char *remedy);

/* A new state file refused ENOSPC: the space, or the inodes (a tmpfs's nr_inodes), ran out. */
#define SEG_NO_ROOM_HINT "no room for it on its filesystem, or no free inode: see df and df -i"

/* A --socket-group or --stats-group refused EPERM: only root, or a member, may give a file to a group. */
#define GROUP_HINT(err) ((err) == EPERM ? "chimed's user must be a member of that group, or root; under " \
			 "chimed.service, add SupplementaryGroups= in a drop-in" : NULL)

/*
 * io_uring_setup() refused (a negative errno): chimed cannot run without
 * io_uring. EPERM is io_uring turned off for this process, by sysctl
 * kernel.io_uring_disabled (Linux 6.6) or by a seccomp filter (a container
 * runtime's profile may refuse it); ENOSYS a kernel built without it.
 */
#define URING_HINT(r) ((r) == -ENOMEM ? "RLIMIT_MEMLOCK too low?" : \
		       (r) == -EPERM ? "io_uring is disabled for this process: sysctl " \
				       "kernel.io_uring_disabled, or a seccomp filter such as a container's" : \
		       (r) == -ENOSYS ? "this kernel has no io_uring" : NULL)

#endif /* CHIMED_LOG_H */
