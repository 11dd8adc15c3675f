/* SPDX-License-Identifier: MIT */
/*
 * statsread.h - what chimestat and chimectl share: find the broker's control
 * segment, map it read-only, take consistent snapshots of its blocks, and
 * derive liveness, rates and lateness percentiles.
 *
 * Nothing here writes to shared memory or asks the broker anything, so it
 * works from any user allowed to read "<socket>.ctl" (mode 0640: the broker's
 * group) and after the broker died. Functions return 0 or -errno and print
 * nothing, except sr_perror().
 */
#ifndef CHIME_STATSREAD_H
#define CHIME_STATSREAD_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/types.h>

#include "chime_shm.h"
#include "clock.h"
#include "segment.h"

/* Exit codes shared by chimestat and chimectl (documented in their man pages). */
#define SR_EXIT_OK          0
#define SR_EXIT_NOSHM       1   /* cannot read the broker's shared memory, or another failure */
#define SR_EXIT_USAGE       2
#define SR_EXIT_NOT_RUNNING 3   /* the broker is not running (chimectl: nor listening, nor its segment there) */
#define SR_EXIT_DENIED      4   /* chimectl: not for this user (reset-stats, shutdown, restart, drop-session) */

/* A heartbeat older than this means the broker is not running (it beats every 90 ms, 450 ms at rest). */
#define SR_HEARTBEAT_STALE_NS UINT64_C(1000000000)
/* The period of a busy broker's heartbeat (chimed's HEARTBEAT_NS): a longer one (beat_ms) is its rest. */
#define SR_HEARTBEAT_MS 90u

struct sr {
	char sock[PATH_MAX];
	char ctl_path[PATH_MAX + 8];
	struct chime_map map;
	const struct chime_ctl *ctl;
	uint32_t nr_shards;
	uint32_t max_clients;
	/* The geometry as sr_open() checked it: the segment's own copy may change after. */
	uint64_t shards_off, clients_off, client_stats_off;
	uint32_t layout_seen;           /* after -EPROTO: the segment's layout version */
	dev_t dev;                      /* the file mapped, to tell a new broker's from it */
	ino_t ino;
	uid_t uid;                      /* its owner: the broker's user, if chimed wrote it */
};

/*
 * One client slot in use (ACTIVE or DYING), its counters summed over shards
 * (only blocks of id.generation; seq unused): counters, cq_depth, backlog
 * and lat[] are sums; sq_depth, sq_depth_max, cq_depth_max and lat_max_ns
 * the largest of its shards' (one ring's depth, of sq_size or cq_size).
 */
struct sr_client {
	uint32_t slot;
	struct chime_client_ctl id;
	struct chime_client_stats sum;
};

/* What a shard's block says once derived: lateness since the reset, and over the recent window. */
struct sr_shard {
	uint64_t lat[CHIME_LAT_BUCKETS];        /* since the last reset (lat - lat_base) */
	uint64_t lat_sum_ns;
	uint64_t win[CHIME_LAT_BUCKETS];        /* the last CHIME_LAT_WINDOW seconds */
	uint64_t win_sum_ns, win_max_ns;
};

struct sr_snap {
	uint64_t now_ns;                /* CLOCK_MONOTONIC when taken, on the broker's clock (clock_off) */
	/*
	 * The broker's CLOCK_MONOTONIC minus ours: not 0 when one of us runs in
	 * a time namespace the other does not (its clients here get EXDEV).
	 * now_ns, and sr_now(), are moved by it, so that ages come out right.
	 */
	int64_t clock_off;
	struct chime_ctl hdr;
	struct chime_shard_stats *shards;   /* [hdr.nr_shards] */
	struct sr_shard *sh;            /* [hdr.nr_shards], derived from shards[] */
	struct sr_client *clients;      /* [nr_clients], by slot */
	uint32_t nr_clients;
	uint32_t torn;                  /* blocks whose seq stayed odd (writer died mid-update) */
	uint64_t lat[CHIME_LAT_BUCKETS];/* all shards, since the last reset */
	uint64_t lat_sum_ns, lat_max_ns;
	uint64_t win[CHIME_LAT_BUCKETS];/* all shards, the last CHIME_LAT_WINDOW seconds */
	uint64_t win_sum_ns, win_max_ns;
	uint32_t reset_pending;         /* shards that have not applied the last reset yet */
};

/* CLOCK_MONOTONIC now, on the clock of the broker snap was taken of. */
uint64_t sr_now(const struct sr_snap *snap);

enum sr_state {
	SR_RUNNING,     /* RUNNING, fresh heartbeat, pid alive */
	SR_STARTING,    /* STARTING, fresh heartbeat */
	SR_STOPPED,     /* the broker said it stopped cleanly */
	SR_DEAD,        /* RUNNING or STARTING, but stale heartbeat or pid gone */
};

/*
 * Reading a segment's mapping. A mapping of a file holds only as much of it
 * as the file still has: a read past its end now is SIGBUS, and whoever owns
 * the socket's directory may truncate the files in it (chimed never does: it
 * replaces them). Every read of a segment by the tools runs in sr_guard():
 * such a read ends it with -ENODATA, where the tool died of "Bus error".
 */

/*
 * Run reader(arg), which reads the mapping m (and nothing else that could
 * fault), and return what it returns; or -ENODATA if a read of m faulted
 * (SIGBUS): the file is shorter than m now. reader() may be cut short at any
 * load of m, so it only copies into memory the caller owns and keeps
 * nothing else half done: no allocation, stdio, curses or locks. A SIGBUS
 * elsewhere, or while no read runs, is left to what handled it before (it
 * kills the tool). Not nested.
 */
int sr_guard(const struct chime_map *m, int (*reader)(void *arg), void *arg);

/* Copy [off, off + len) of m into dst under sr_guard(): 0, -ENODATA, or -EBADMSG (not inside m). */
int sr_copy(const struct chime_map *m, void *dst, uint64_t off, size_t len);

/*
 * Open and map the segment file `path` of `kind` read-only, as
 * chime_seg_open() does, its check under sr_guard(), but never through a
 * symlink; *st (if not NULL) the file mapped, *layout (if not NULL) the
 * segment's layout after -EPROTO. -errno of open (-ELOOP: a symlink),
 * fstat, mmap; -EAGAIN, -EBADMSG, -EPROTO as chime_seg_check(); -ENODATA.
 */
int sr_map(const char *path, uint32_t kind, struct chime_map *m, struct stat *st, uint32_t *layout);

/* Why a read ended in -ENODATA, after "cannot read 'PATH': ". */
#define SR_SHRANK_WHY "the file shrank while it was read (truncated in place, still named: chimed never " \
	"does that, whoever owns it or its directory did)"

/* Why an open ended in -ELOOP, after "cannot open 'PATH': ". */
#define SR_SYMLINK_WHY "a symbolic link (chimed's segments never are: not followed)"

/* The socket path: `arg` if not NULL, else $CHIME_SOCKET (if set and not empty), else the default.
 * -EINVAL: arg is "" (chimed refuses it too); -ENAMETOOLONG: does not fit buf, or is longer than
 * a unix socket's path may be (SR_SOCKET_PATH_MAX: no broker can listen there). */
#define SR_SOCKET_PATH_MAX 107
int sr_socket_path(char *buf, size_t len, const char *arg);

/*
 * Map "<sock>.ctl" read-only and check its geometry. -errno (open, mmap),
 * -EAGAIN (not published yet: a broker starting), -ESRCH (not published, and
 * no broker holds the lock file: one died starting), -EBADMSG, -EPROTO,
 * -ENODATA (it shrank as it was read).
 */
int sr_open(struct sr *s, const char *sock);
void sr_close(struct sr *s);

/*
 * For a view that runs on: if PATH.ctl now names another file than the one
 * mapped (the broker was restarted, or stopped and another started) and it
 * opens, map that one instead and return 1; else 0, the old one kept (a
 * broker that died, or one still starting, goes on showing its last state).
 */
int sr_follow(struct sr *s);

/* The segment mapped is no longer the one at PATH.ctl, or is empty: its broker stopped. */
bool sr_segment_gone(const struct sr *s);

/* Print the standard message for an sr_open() or sr_snapshot() failure: "prog: cannot open 'path': ... (hint)". */
void sr_perror(const char *prog, const struct sr *s, int err);
/* The same message, without "prog: ", in buf (chimestat -j's "error"). */
void sr_strerror(const struct sr *s, int err, char *buf, size_t len);

/*
 * 0, -ENOMEM, -ESTALE (its broker stopped: it emptied and removed the file)
 * or -ENODATA (the file shrank otherwise); no snapshot then, the mapping
 * unusable.
 */
int sr_snapshot(const struct sr *s, struct sr_snap *snap);
void sr_snap_free(struct sr_snap *snap);

/*
 * What the broker's state files have lost while it runs (chime_ctl's
 * socket_gone, sessions_file_gone, shard_files_gone and
 * session_records_unwritten), as one sentence in buf, for the views to
 * show: false (buf empty) if nothing.
 */
bool sr_files_warning(const struct chime_ctl *h, char *buf, size_t len);

/* Liveness from the snapshot: state, heartbeat age and whether the pid exists. why: a reason. */
enum sr_state sr_liveness(const struct sr_snap *snap, const char **why);

/*
 * Does a broker hold the socket's lock file (the pid it names is there)?
 * true too for a lock file this user cannot read: alive, as far as we know.
 */
bool sr_broker_alive(const char *sock);
/* Process pid's state letter in /proc/PID/stat ('R', 'S', 'Z'...), or 0 if it cannot be read (gone, no /proc). */
char sr_pid_state(pid_t pid);
const char *sr_state_name(uint32_t state);
/* A client table entry's state: "active", "dying" or "detached" (a named session with no process). */
const char *sr_client_state(uint32_t state);

/* Lateness: sum of buckets, and the p-quantile (0 < p <= 1) by nearest rank, reported as
 * the exclusive upper bound of its bucket capped at max_ns (so it is >= the true value
 * and within one bucket of it); 0 if the histogram is empty. */
uint64_t sr_hist_count(const uint64_t *hist);
uint64_t sr_percentile(const uint64_t *hist, uint64_t max_ns, double p);

/*
 * Add a shard block's recent window, as seen at now_ns (CLOCK_MONOTONIC), to
 * hist/sum/max: the slots stamped with the current second and the
 * CHIME_LAT_WINDOW - 1 before it; older (stale) slots are skipped.
 */
void sr_window(const struct chime_shard_stats *s, uint64_t now_ns, uint64_t *hist,
	       uint64_t *sum_ns, uint64_t *max_ns);

/*
 * deadline_ns - now_ns, signed, within +-INT64_MAX: a client may arm any
 * uint64_t deadline, and one 2^63 ns or more ahead is ahead, not due.
 */
int64_t sr_rel_ns(uint64_t deadline_ns, uint64_t now_ns);

/* (b - a) per second over dt_ns; 0 if dt_ns is 0 or the counter went backwards (a restart). */
double sr_rate(uint64_t a, uint64_t b, uint64_t dt_ns);

/*
 * Standard output flushed and never failed: SR_EXIT_OK; else SR_EXIT_NOSHM,
 * said on stderr unless the reader went away (EPIPE, as `| head -1` does
 * with SIGPIPE ignored): a tool's figures that did not arrive are no success.
 */
int sr_stdout_check(const char *prog);

/* "1h02m03s"-style duration for humans. */
const char *sr_fmt_dur(char *buf, size_t len, uint64_t ns);
/* "12.3us"-style short duration. */
const char *sr_fmt_ns(char *buf, size_t len, uint64_t ns);

#endif /* CHIME_STATSREAD_H */
