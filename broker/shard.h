/* SPDX-License-Identifier: MIT */
/*
 * shard.h - a shard thread: one timing wheel in its own shard segment, one
 * io_uring, one private command doorbell, and a channel per client (chan.h)
 * with that client's own doorbell eventfd, polled through io_uring.
 *
 * The control thread talks to a shard only through its command queue (SPSC,
 * lock-free) followed by a write to the shard's private doorbell (no client
 * holds it, so no client can stall or drain it); the shard answers
 * through the command's ack (an atomic countdown; the last shard to finish
 * writes the control thread's eventfd). No lock is taken on the hot path.
 */
#ifndef CHIMED_SHARD_H
#define CHIMED_SHARD_H

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>

#include <liburing.h>

#include "aside.h"
#include "chan.h"
#include "segment.h"
#include "spin.h"
#include "stats.h"

#define SHARD_CMD_ATTACH 1u     /* adopt a client's channel (allocates its grants) */
#define SHARD_CMD_DETACH 2u     /* drop a channel and reclaim every node of that client */
#define SHARD_CMD_STOP   3u
#define SHARD_CMD_PARK   4u     /* a session's process is gone: keep its timers, drop its rings (chan_park) */
#define SHARD_CMD_REATTACH 5u   /* a parked session's new process: its new rings (chan_reattach) */
#define SHARD_CMD_FORGET 6u     /* a parked session's carried grants: their process is gone (no ack) */

/* chan.bell_state: the io_uring multishot poll on a client's doorbell. */
#define SHARD_BELL_IDLE       0u  /* none outstanding */
#define SHARD_BELL_ARMED      1u  /* a poll is outstanding */
#define SHARD_BELL_CANCELLING 2u  /* detached: its poll is being cancelled; the detach waits */

/* Shared by all shards for one client request; lives in the control thread's client. */
struct shard_ack {
	uint32_t pending;       /* shards still working; atomic */
	int32_t err;            /* first error (negative errno); atomic */
};

#define SHARD_CMD_F_RESUME   1u /* REATTACH: the library re-submits; keep the carried grants */
#define SHARD_CMD_F_HANDOVER 2u /* PARK: the broker stops; the process lives on and re-submits */
#define SHARD_CMD_F_SESSION  4u /* ATTACH: a named session's (chan.session) */

struct shard_cmd {
	uint32_t op;
	uint16_t slot;
	uint16_t flags;         /* SHARD_CMD_F_* */
	uint32_t uid;           /* ATTACH: the client's user (the per-user quota) */
	uint64_t user_quota;    /* ATTACH, REATTACH: that user's quota in this shard (UINT64_MAX: none) */
	uint64_t generation;
	struct chan *ch;
	const struct chan_mem *mem;
	struct shard_ack *ack;
};

/* A session an earlier broker left: its channel in this shard (the control thread's) and its slot's generation. */
struct shard_session {
	struct chan *ch;        /* NULL: no session in this slot */
	uint64_t generation;
	uint32_t uid;
	uint64_t user_quota;    /* nodes its user may own in each shard (UINT64_MAX: no limit) */
};

struct shard_cfg {
	uint32_t idx;
	uint32_t capacity;
	uint32_t max_clients;
	uint64_t quota;         /* nodes per client in this shard (UINT64_MAX: no limit) */
	uint64_t resolution_ns;
	int64_t spin_us;        /* -1: busy-poll, never sleep */
	uint32_t spin_share;    /* percent of its time it may spin with no work (1..100) */
	mode_t seg_mode;        /* of the segment file */
	gid_t seg_gid;          /* its group, or (gid_t)-1: the broker's */
	struct chime_ctl *ctl;  /* the control segment (its geometry set) */
	struct chime_pub *pub;  /* the public segment: our sleep number */
	int notify_fd;          /* the control thread's eventfd for acks */
	uint32_t *resting;      /* the control thread's word: it beats at IDLE_BEAT_NS (rest_end()) */
	/* [max_clients]: restore the timers of these sessions from the shard
	 * file an earlier broker left, if there is one; NULL: start empty */
	const struct shard_session *sessions;
	uint32_t sq_size;       /* of every client's rings (a restored channel's grants) */
};

struct shard {
	struct shard_cfg cfg;
	uint32_t *sleeping;             /* the public segment's word for this shard */
	uint64_t *wake_ns;              /* and when its sleep ends */
	struct chime_map seg;
	int seg_fd;
	int doorbell;                   /* private eventfd: the control thread's commands */
	uint64_t slab_off;              /* where the slab starts in the segment file */
	uint64_t reserved_bytes;        /* [0, reserved_bytes) of the file is reserved */
	uint64_t reserve_retry_ns;      /* after a failed reservation: not before this */
	uint64_t reserve_pending;       /* reserve_async(): the chunk on its way ends here (0: none) */
	uint32_t touch_pops;            /* clients' touch-table pages being mapped aside (touch_populate()) */
	uint32_t punches;               /* slab storage given back, its hole being punched aside (one at most) */
	uint64_t punch_bytes;           /* what that punch gives back (counted once it has) */
	/*
	 * Atomic, SH1-SH4: a timers query reads this shard's slab
	 * (`scanning`, the control thread's) / a give-back's punch is under
	 * way (`shrinking`, the shard's).
	 */
	uint32_t scanning;
	uint32_t shrinking;
	uint64_t give_back_at;          /* the slab's free top looked for again not before this */
	uint64_t armed_peak;            /* the wheel's armed count at its peak since: fewer now, a look is due */
	uint64_t grown_ns;              /* the reserved part last grew then (reserve_note()) */
	uint64_t given_back_ns;         /* the last give-back, until the slab grows again (0: none since) */
	uint64_t give_back_hold_ns;     /* what grew is given back no sooner than this after its growth */
	struct aside *aside;            /* runs those (aside.h); NULL: the reserves are made in line */
	bool reserve_async_off;         /* chunks reserved in line only (not possible here) */
	bool reserve_inline;            /* the next one in line (the last one failed) */
	bool give_back_off;             /* the filesystem cannot punch holes: the slab is not given back */
	bool give_back_due;             /* a pass came before give_back_at: the sleep ends there */
	char path[4096];

	/* command queue: control thread -> shard */
	struct shard_cmd *q;
	uint32_t q_mask;
	uint64_t q_head;                /* shard; atomic */
	uint64_t q_tail;                /* control thread; atomic */

	/* the shard thread's own */
	struct shard_core core;
	struct stats st;
	struct chan **active;
	uint32_t nr_active;
	struct shard_cmd *dying;        /* detaches and parks in progress */
	uint32_t nr_dying;
	uint64_t reclaim_turns;         /* sweep turns given (chan_user.reclaim_turn, chan.sweep_turn) */
	struct io_uring ring;
	uint64_t bell_buf;
	int bell_armed;
	uint32_t sleep_no;              /* stored in *sleeping while asleep; never 0 */
	int64_t spin_credit;            /* ns the shard may still spin without work (shard.c) */
	uint64_t spin_credit_at;        /* when it was last refilled */
	uint64_t wake_lead_ns;          /* how early it wakes for a deadline and spins the rest (shard.c) */
	struct spin_watch spin;         /* spinning off while its yields give the core away (spin.h) */
	uint64_t passes;                /* loop passes; atomic: the control thread checks it moves */
	/*
	 * 1 while the shard may hold wall-clock nodes (core.wall_nodes), as of
	 * its last sleep; atomic: a step of the wall clock wakes only those
	 * shards (W1/W2: wall_check() in control.c, the S-SLEEP re-check).
	 */
	uint32_t wall_any;

	/* the control thread's liveness check (control.c, shards_alive()) */
	uint64_t seen_passes;
	uint32_t still_beats;           /* heartbeats since it last moved or slept on time */
	bool rung;                      /* the heartbeat rang it (clients_beat()): it must move by the next */
	bool file_gone;                 /* path names seg_fd's file no more, said (restart_watch()) */
	bool file_lost;                 /* missing at start with sessions to take over (shard_init()) */

	pthread_t thr;
	int started;
	sem_t ready;
	int start_err;
};

/*
 * Create the shard's segment file "<socket_path>.shard<idx>" (cfg->seg_mode),
 * lay out the key index and the wheel, create its doorbell and command
 * queue. With cfg->sessions and a file an earlier broker left, keep the file
 * and restore those sessions' timers from it instead (restore.h): a file of
 * another geometry, or whose header or wheel is damaged, is refused
 * (-EMEDIUMTYPE, -EBADMSG) with a message saying what to do. Logs and
 * returns a negative errno on failure.
 */
int shard_init(struct shard *s, const struct shard_cfg *cfg, const char *socket_path);

/*
 * Whether the shard's slab has storage reserved short of its --capacity
 * (any thread, once the shard started): a node refused then is the
 * filesystem's doing, not --capacity's.
 */
bool shard_slab_short(const struct shard *s);

/*
 * A shard file of `capacity` nodes: the bytes before its slab (*fixed), and
 * what a start takes of it whatever the room (that and the slab's first
 * chunk, shard_init()); 0 if the layout fails.
 */
uint64_t shard_start_bytes(uint32_t capacity, uint64_t *fixed);

/* Wake the shard for a pass (a new wall-clock offset to follow: wall.h). Control thread. */
void shard_poke(struct shard *s);

/* Start the thread, pin it to cpu (a failure to pin logs one warning), wait until it runs. */
int shard_start(struct shard *s, int cpu);

/*
 * Post a command (control thread only) and ring the doorbell. The queue holds
 * 2 * max_clients + 2 commands; a client has at most one acknowledged command
 * outstanding, and one FORGET (holder_watch(), not acknowledged).
 */
void shard_post(struct shard *s, const struct shard_cmd *cmd);

/*
 * Stop and join the thread (if started), then release everything; unlink the
 * segment file unless `keep` (sessions' timers in it, for the next broker).
 * With `keep`, a file removed while the broker ran is written again
 * (chime_seg_relink()). 0; 1 if that failed (logged: the next broker will
 * not have this shard's timers); -ETIMEDOUT (logged) if the thread did not
 * stop within 2 s: its memory is then left mapped, and the caller should
 * exit.
 */
int shard_fini(struct shard *s, bool keep);

/*
 * A stop keeping file `fd` for the next broker (a shard file, the sessions
 * file), once nothing writes it: if `path` no longer names it, write it
 * there again (chime_seg_relink(): `keep`, n ranges, or the whole file if
 * NULL) and say so, or say why not and that `lost`. True if the file is at
 * `path`.
 */
bool keep_file(int fd, const char *path, const char *lost, const struct chime_seg_range *keep, unsigned n);

#endif /* CHIMED_SHARD_H */
