/* SPDX-License-Identifier: MIT */
/*
 * client.h - libchime's private state, shared by client.c (connect, close,
 * doorbells, broker liveness), timer.c (the submission side) and poll.c (the
 * drainer, chime_fd). The files form a DAG: timer.c -> client.c <- poll.c;
 * client.c calls neither. Internal functions are cl_*; only the functions of
 * chime.h are exported (libchime.map).
 *
 * Who touches what:
 *   - everything set by chime_open() is read-only afterwards (any thread);
 *   - struct chime_chan.sq and the submission slots: any number of threads
 *     (lock-free, see shm/ring.h);
 *   - the drainer fields (marked "drainer"): the one thread draining at a
 *     time (chime_poll/wait/dispatch), plain loads and stores;
 *   - `dead`: any thread, atomic; once set it stays set.
 *
 * Atomics: shm/atomics.h, as the broker's side uses them: every edge states
 * its own ordering (acquire/release/seq_cst) and carries a label naming its
 * partner on the broker's side.
 */
#ifndef CHIME_CLIENT_H
#define CHIME_CLIENT_H

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "chime.h"
#include "atomics.h"
#include "chime_shm.h"
#include "ring.h"
#include "segment.h"
#include "spin.h"

#define CHIME_PUBLIC __attribute__((visibility("default")))
#define CHIME_MAX_FDS (CHIME_WELCOME_FIXED_FDS + CHIME_MAX_SHARDS + 1)  /* and the touch table */
#define CHIME_PATH_MAX 108              /* sizeof(sockaddr_un.sun_path) */
#define TOUCH_WINDOW (UINT64_C(64) << 10)  /* what the library allocates of its touch table at once: touch_mapped */

/*
 * The drainer's private set of RESET/CANCEL/CANCEL_KEY records it found still
 * unconsumed in one shard's submission ring (see poll.c): an open-addressing
 * hash table of 2 * sq_size entries, so at most half full.
 */
#define CHIME_PEND_ID   1u      /* kind: `what` is a timer id */
#define CHIME_PEND_KEY  2u      /* kind: `what` is a key */
#define CHIME_PEND_CANCEL 1u    /* flags: a CANCEL (or CANCEL_KEY) is pending */
#define CHIME_PEND_RESET  2u    /* flags: a RESET is pending, at position reset_pos */

struct chime_pend {
	uint64_t what;
	uint64_t reset_pos;         /* the first pending RESET's ring position */
	uint32_t kind;              /* 0: empty slot */
	uint32_t flags;
};

/* One channel: this client's pair of rings with one shard. */
struct chime_chan {
	/* submission side: any thread */
	struct chime_sq_prod sq;
	const uint32_t *sleeping;           /* public segment: the shard's sleep number, 0 awake */
	const uint64_t *wake_ns;            /* public segment: while it sleeps, when it wakes */
	int doorbell;                       /* our own doorbell eventfd for this shard */
	uint32_t rung;                      /* atomic, any thread: the sleep number we last rang */
	/* completion side: the drainer */
	struct chime_cq_cons cq;            /* the ring's consumer (shm/ring.h), as the tests use it */
	const uint64_t *sq_head;            /* chime_chan_ro.sq_head (broker) */
	const uint64_t *backlog;            /* chime_chan_ro.backlog (broker) */
	uint64_t seen;                      /* drainer: the cq_tail the last drain worked to */
	uint32_t held;                      /* drainer: head waits for a RESET the shard has not applied */
	uint64_t held_at;                   /* drainer: 1 + the record position the last drain held at, 0: none */
	/* reconnect (under struct chime.lock) */
	uint64_t closed_from;               /* the tail when the ring was closed: records below it count */
	uint64_t closed_at;                 /* the tail we moved it to (no slot is free there); 0: open */
	uint32_t resumed_owed;              /* atomic: the new ring had no room for RESUMED (cl_resume_flush) */
};

/*
 * What the client maps writable of what the broker offers, before it seals
 * it (chime_shm.h, struct chime_mapped): no writable mapping can be made
 * after the seal, so these are the ones used for good.
 */
struct cl_own {
	struct chime_map rw;            /* every page faulted in */
	struct chime_map touch;         /* the touch table, if offered */
};

struct chime {
	int sock;                           /* the connection; the broker reclaims everything on hang-up,
					     * and sends a 1-byte message on it for each wake-up */
	int kick_fd;                        /* our own eventfd: "come back, events are left" */
	int ep_fd;                          /* chime_fd(): an epoll set of sock and kick_fd */
	uint32_t nr_shards;
	uint32_t sq_size;
	uint32_t cq_size;
	uint32_t slot;                      /* atomic: our entry in the control segment's client table; a
					     * session's reconnect changes it (under `lock`), and any thread's
					     * first arm reads it (timer.c, home_shard()) */
	int dead;                           /* atomic: 1 once the broker is known to be gone for good,
					     * or in a child after fork() (then `forked` too) */
	int forked;                         /* atomic: this is a copy in a child of the process that opened it */
	const char *dispatcher;             /* atomic: &cl_thread_token of the thread in a chime_dispatch()
					     * of this connection, or NULL (see cl_note_void()) */
	struct chime *next_open;            /* every open chime_t of the process (client.c, fork) */
	struct chime **prev_open;
	uint64_t link;                      /* atomic: (connection number << 1) | 1 while a session reconnects */
	const char *drainer;                /* atomic: &cl_thread_token of the thread holding `lock` as
					     * the drainer (poll.c), NULL while nobody does */

	/* reconnect (named sessions only, reconnect.c); all but `link` under `lock` */
	char session[CHIME_SESSION_MAX];    /* "" anonymous: never reconnects */
	uint32_t session_token;             /* from the last welcome: a resume sends it back (reconnect.c) */
	char path[CHIME_PATH_MAX];          /* the socket chime_open() connected to */
	pthread_mutex_t lock;               /* sessions: the drainer and a reconnect exclude each other */
	int lock_cancel;                    /* the holder's cancel state before it took `lock` (cl_lock_try()) */
	int timer_fd;                       /* in chime_fd()'s set: readable when an attempt is due; -1 */
	bool timer_on;                      /* timer_fd is set (it may have fired: read it); off, it is not readable */
	int recon_sock;                     /* an attempt's hello sent, its welcome awaited (in the set); -1 */
	/* Its welcome taken and answered (cl_take_offer()): the broker's ready awaited (cl_recon_offer_drop()). */
	bool recon_offered;
	struct chime_welcome recon_w;
	int recon_fds[CHIME_MAX_FDS];
	unsigned recon_nfds;
	struct cl_own recon_own;
	uint64_t recon_base;                /* that hello's sq_base */
	uint64_t recon_dial_until_ns;       /* and when its wait ends (DIAL_WAIT_NS) */
	bool recon_begun;                   /* rings closed, old socket gone */
	uint64_t recon_window_ns;           /* $CHIME_RECONNECT_S at chime_open(); 0: never reconnect */
	uint64_t recon_give_up_ns;
	uint64_t recon_next_ns;
	uint64_t recon_backoff_ns;
	uint64_t reconnects;                /* done, for the tests */
	uint32_t resumed_owed;              /* atomic: some chan's RESUMED waits for cl_resume_flush() */

	struct chime_map pub_map;           /* the broker's public segment: state, heartbeat, sleep numbers */
	struct chime_map rw_map;
	struct chime_map ro_map;
	const struct chime_pub *pub;
	struct chime_client_rw *rw;
	/*
	 * The touch table (an anonymous connection's, if the broker gave one:
	 * CHIME_WELCOME_F_TOUCH): its words and its tags, shard s's at
	 * s * touch_cap in each (chime_shm.h); NULL: every reset is a record.
	 */
	uint64_t *touch;
	uint32_t *touch_tag;
	uint32_t touch_cap;
	struct chime_map touch_map;
	/* The broker takes wall-clock arms (CHIME_WELCOME_F_REALTIME); atomic: a reconnect sets it again. */
	uint32_t realtime;
	/*
	 * The table's 64 KiB windows of address space (from the one holding
	 * its base) that the library has allocated at once (timer.c,
	 * touch_populate()): the broker allocates none of the table. Atomic
	 * bits, set once.
	 */
	uint64_t *touch_mapped;

	/* drainer state */
	uint32_t rr;                        /* first shard of the next drain (fairness) */
	uint32_t ww_armed;                  /* we stored want_wakeup = 1 and have not taken it back */
	uint32_t fd_used;                   /* atomic: chime_fd() was called: keep the fd's promise in
					     * chime_poll; set by the drainer's first call, read by later
					     * calls from any thread (chime_fd(3)) */
	uint32_t empty_streak;              /* consecutive chime_poll()s that returned 0 */
	uint64_t kicks;                     /* writes to kick_fd not read back yet */
	uint64_t last_sock_check_ns;        /* atomic (relaxed): cl_broker_check()'s last probe */
	uint32_t held;                      /* the last drain stopped at an event awaiting a RESET */
	uint32_t wait_spin_shift;           /* chime_wait's spin is WAIT_SPIN_NS >> this (poll.c) */
	struct spin_watch wait_spin;        /* chime_wait's spin off while its yields give the core away */
#define WAIT_SPIN_NS        50000u
#define WAIT_SPIN_MAX_SHIFT 3u
	uint32_t close_deferred;            /* a dispatch callback closed c: the dispatch ends, then closes it */
	uint32_t voided;                    /* a dispatch callback sent a RESET/CANCEL/CANCEL_KEY: the
					     * drain judges the events after it afresh (that thread only) */
	struct chime_pend *pend;            /* 2 * sq_size entries */
	uint32_t *pend_used;                /* sq_size: the occupied entries, to clear them */
	uint32_t npend;
	uint32_t npend_keys;
	uint32_t pend_mask;

	/* chime_wait: io_uring (or poll(2) if io_uring is unavailable) */
	struct io_uring ring;
	bool has_ring;
	bool kick_polled;                   /* a POLL_ADD on kick_fd is outstanding in the ring */
	bool sock_polled;                   /* a POLL_ADD on sock is outstanding in the ring */
	uint64_t polls_by;                  /* the waiter number (poll.c) of the thread that submitted them */

	struct chime_chan chan[];
};

/* client.c */
/*
 * True if this connection cannot be used now: the broker is known gone (for
 * good, or a session reconnecting). Checks the socket (a syscall) only if
 * `probe`; what it learns goes to cl_lost().
 */
bool cl_broker_gone(struct chime *c, bool probe);
/* Cheap liveness check for idle paths: probes the socket at most once a second,
 * and only when the broker's heartbeat is stale or it announced a stop. */
bool cl_broker_check(struct chime *c, uint64_t now);
void cl_own_unmap(struct cl_own *own);
/*
 * connect(), hello, welcome, the client's mapped, the broker's ready: the
 * welcome's fds in fds[0..*nfds), *own and *sock are the caller's. limit:
 * CHIME_HELLO_TOUCH asks for a touch table (anonymous only).
 */
int cl_dial(const char *path, const char *session, uint32_t flags, uint64_t sq_base, uint64_t limit, int *sock,
	    struct chime_welcome *w, int *fds, unsigned *nfds, struct cl_own *own);
/*
 * cl_dial() in two: connect and send the hello (not `wait`: a full queue is
 * -ETIMEDOUT at once), then receive the welcome (not `wait`: -EINPROGRESS
 * while none has come). The handshake's 10 s run from the start. A start
 * that fails leaves no socket; after it, the socket is the caller's to
 * close, whatever the finish says.
 */
int cl_dial_start(const char *path, const char *session, uint32_t flags, uint64_t sq_base, uint64_t limit,
		  bool wait, int *sock);
int cl_dial_finish(int sock, bool wait, struct chime_welcome *w, int *fds, unsigned *nfds);
/*
 * Close *fd (if >= 0) and set it to -1, under the lock the fork handlers
 * take: a socket cl_dial_start() put in c->recon_sock stays there, for
 * fork_child() to close in a child, until it is closed this way.
 */
void cl_sock_close(int *fd);
/*
 * Hang up a connection to the broker, the descriptor kept: what it sent
 * read first, with nothing more let in. A hang-up with the broker's bytes
 * unread is, to it, a peer that keeps them in flight (control.c, CL_HELD):
 * the slot stays taken until a heartbeat sees them gone, and a session's
 * next process waits for that.
 */
void cl_sock_hang_up(int sock);
/*
 * After cl_dial_finish(): map what is ours to write (*own), seal it, and
 * say so; nothing stays mapped on error. Then the broker's answer (not
 * `wait`: -EINPROGRESS while none has come; `wait`: until `until`, the
 * handshake's end, then -ETIMEDOUT): 0 once attached, or its refusal.
 */
int cl_take_offer(int sock, const struct chime_welcome *w, const int *fds, struct cl_own *own);
int cl_await_ready(int sock, bool wait, uint64_t until);
/*
 * Map and check the welcome's public and ro segments, and check own->rw,
 * which goes into maps[1] (public, rw, ro); nothing stays mapped on error.
 */
int cl_map(const struct chime_welcome *w, const int *fds, struct cl_own *own, struct chime_map maps[3],
	   struct chime_client_geom *g);
/* The handshake is over: the socket blocks again, with no timeouts. */
void cl_sock_ready(int sock);
/*
 * Try a session's lock, with the thread's cancellation (pthread_cancel(3))
 * put off while it holds it; cl_unlock() gives both back. The drain's
 * recv(2), a reconnect's connect(2), a dispatch callback's write(2) are
 * cancellation points: a thread cancelled there left the lock held for
 * good, and every later drain of the session returned nothing. A cancel is
 * acted on at the thread's next cancellation point after it.
 */
bool cl_lock_try(struct chime *c);
void cl_unlock(struct chime *c);
/* Cancellation (pthread_cancel(3)) put off, *old the state before; and given back. */
void cl_cancel_off(int *old);
void cl_cancel_restore(int old);

static inline bool cl_is_dead(const struct chime *c)
{
	return at_load(&c->dead) != 0;
}

/* What a call on a dead connection returns: a child's copy is its parent's connection. */
static inline int cl_dead_errno(const struct chime *c)
{
	return at_load(&c->forked) ? -ECHILD : -ENOTCONN;
}

/*
 * Before writing records: true if they would go to no broker. The
 * connection is dead, or the broker has said it is stopping (one load of a
 * word that changes once; final for an anonymous connection, while a
 * session reconnects in wait_room()). A broker that died without saying so
 * (SIGKILL) is found when its ring fills or by a drain's heartbeat check:
 * the operations read no clock.
 */
static inline bool cl_gone_for_ops(struct chime *c)
{
	if (__builtin_expect(!cl_is_dead(c) && at_load_acq(&c->pub->state) != CHIME_BROKER_STOPPED, 1))
		return false;
	(void)cl_broker_gone(c, false);
	return cl_is_dead(c);
}

/*
 * Its address names the thread (poll.c), for `dispatcher` and `drainer`.
 * Initial-exec, as timer.c's tl_home: in the default model GCC took its
 * address with a __tls_get_addr() call on every reset and cancel record,
 * before the test that the connection has a dispatcher at all.
 */
extern __thread char cl_thread_token __attribute__((tls_model("initial-exec")));

/*
 * A RESET, CANCEL or CANCEL_KEY was published. A chime_dispatch() under way
 * claims each event just before its callback, and a callback that cancels
 * or resets a timer whose event is next must never see that event: the
 * drain stops and scans the ring again (poll.c). Only the callbacks' own
 * operations count (another thread's is concurrent with the drain, which
 * may or may not honour it, as for chime_poll()), whatever the callback
 * does first: a callback that dispatches another connection, whose own
 * callback cancels this one's timers, counts too. One load otherwise.
 */
static inline void cl_note_void(struct chime *c)
{
	const char *d = at_load(&c->dispatcher);

	/* NULL first: the thread's token may cost a __tls_get_addr() call */
	if (__builtin_expect(d != NULL, 0) && d == &cl_thread_token)
		c->voided = 1;
}

/*
 * This thread is in a chime_dispatch() of c (a callback of it, or deeper):
 * one load of the word the dispatch stores anyway, NULL first as in
 * cl_note_void(). A drain of c there would overlap the one the callback
 * runs in (poll.c: -EDEADLK; nested, the inner drain took the ring past
 * the outer one's snapshot of its tail, and the outer one ran on through
 * the ring and never returned), and a close would free c under it
 * (chime_close(): put off until the dispatch returns). Another thread's
 * overlapping drain is not checked (an atomic read-modify-write per drain).
 */
static inline bool cl_in_own_dispatch(const struct chime *c)
{
	const char *d = at_load(&c->dispatcher);

	return __builtin_expect(d != NULL, 0) && d == &cl_thread_token;
}


/*
 * Whether a drain of c may start here: -ECHILD in a child its parent's fork
 * left c to, tested first (a child forked from a callback is inside that
 * dispatch too, and got -EDEADLK where chime_poll(3) promises -ECHILD: an
 * API audit), -EDEADLK inside its own dispatch, else 0.
 */
static inline int cl_drain_refused(const struct chime *c)
{
	if (__builtin_expect(at_load(&c->forked) != 0, 0))
		return -ECHILD;
	return cl_in_own_dispatch(c) ? -EDEADLK : 0;
}

static inline bool cl_reconnecting(const struct chime *c)
{
	return (at_load(&c->link) & 1) != 0;
}

/* reconnect.c */
/*
 * The broker of connection `link` (c->link read before the evidence was
 * looked at) is gone: final for an anonymous connection; a session starts
 * reconnecting, unless that connection has been replaced meanwhile (any
 * thread, any number of times).
 */
void cl_lost(struct chime *c, uint64_t link);
/*
 * Move a reconnect on: close the old rings the first time, then try the
 * broker when an attempt is due. `locked`: the caller holds c->lock (the
 * drainer); else it is tried, and a busy lock means someone else is at it.
 * Returns true while the connection is still being re-made.
 */
bool cl_reconnect(struct chime *c, bool locked);
/* A broker took an attempt's hello: when its answer is given up on (0: no attempt waits for one). */
uint64_t cl_reconnect_answer_by(struct chime *c);
/* How long a session tries to reconnect: $CHIME_RECONNECT_S (0..86400), else 30 s. */
uint64_t cl_reconnect_window(void);
/*
 * Submit the RESUMED records a reconnect could not fit (its old ring was
 * full of records to re-submit), waiting for room as an arm does. Call
 * without c->lock: the wait may have to drive another reconnect.
 */
void cl_resume_flush(struct chime *c);
/* timer.c: one record to shard s, waiting for room; 0 or -ENOTCONN. */
int cl_submit_op(struct chime *c, uint32_t s, uint32_t op);
/* Nanoseconds until the next attempt is due (0: now), for a sleeping drainer. */
uint64_t cl_reconnect_wait_ns(struct chime *c);
/* The next attempt is due now, whatever the back-off (a session's close; no other thread uses c). */
void cl_reconnect_hurry(struct chime *c);
/*
 * chime_fd()'s timer for the attempts, made by chime_open() of a session
 * that may reconnect: made only once reconnecting began, it failed in a
 * process out of descriptors, and the fd never woke an event loop for an
 * attempt again. 0 or -errno (timerfd_create(2), epoll_ctl(2)).
 */
int cl_reconnect_prepare(struct chime *c);
/* An attempt's offer given up: its descriptors closed, its mappings gone. */
void cl_recon_offer_drop(struct chime *c);

/* Write our doorbell for a shard if it sleeps (after a full barrier by the caller). */
void cl_ring_doorbell(struct chime_chan *ch);
/*
 * Records that need no doorbell still ring once half the ring waits for a
 * sleeping shard: a burst that big wakes it while there is room left to
 * drain into, and a ring never fills up unrung. Half the ring's fill is
 * looked at only at every cl_lazy_every()-th position (64, or half a
 * smaller ring), so the look costs one load (of a slot this producer side
 * wrote) per that many records.
 */
#define LAZY_EVERY 64u

static inline uint64_t cl_lazy_every(const struct chime_sq_prod *p)
{
	uint64_t half = ((uint64_t)p->mask + 1) / 2;

	return half < LAZY_EVERY ? half : LAZY_EVERY;
}

/*
 * S4: the record at pos (just after ours) is published already. Another
 * thread published it while our slot, reserved, held the shard's head:
 * the shard could not apply it, and its doorbell (or the shard's re-check,
 * if it saw the shard awake) was spent on a sleep that ended with the head
 * still at our slot. Only our publication makes it applicable, so its
 * urgency is ours now. seq_cst: after our exchange (S1), so that either we
 * see its seq or it was published after ours and saw the sleep (S2).
 *
 * The tail first: if it is still pos, nobody has reserved pos yet, so its
 * record will be published after ours (seq_cst: the reserve's CAS, and the
 * publication after it, come after this load, which comes after our
 * exchange), and it sees the sleep itself. The tail is a line this
 * producer has just written, where the slot at pos is one the shard wrote
 * a lap ago: a read of it on every record of a burst into a sleeping shard
 * cost a transfer from the shard's CPU, and another for the stores when
 * the next record reserved it (chime_arm in bursts of 1000 into a sleeping
 * shard: 25.0-26.3 -> 23.4-23.9 ns a call, 3 rounds each).
 */
static inline bool cl_behind_published(const struct chime_sq_prod *p, uint64_t pos)
{
	return at_load_sc(p->tail) != pos && at_load_sc(&p->slots[pos & p->mask].seq) == pos + 1;
}

/*
 * The same after publishing the n records at positions [from, from + n)
 * that need applying by by_ns (their earliest deadline; UINT64_MAX: no
 * hurry, cancels): no doorbell if the shard's sleep ends by then anyway.
 * Inline for the common cases: an awake shard (one load), and each record
 * of a burst into an asleep one that its sleep's end covers, short of a
 * look position (client.c's cl_doorbell_asleep() says why these need no
 * doorbell, and judges the rest). Out of line, the second case cost each
 * such record 46 instructions (callgrind), a third of an arm's.
 */
void cl_doorbell_asleep(struct chime_chan *ch, uint32_t sleep_no, uint64_t by_ns, uint64_t from, uint32_t n);

static inline void cl_doorbell_by(struct chime_chan *ch, uint64_t by_ns, uint64_t from, uint32_t n)
{
	/* S2, as in cl_ring_doorbell(). */
	uint32_t sleep_no = at_load_sc(ch->sleeping);
	uint64_t every, end = from + n;

	if (__builtin_expect(sleep_no == 0, 1))
		return;
	every = cl_lazy_every(&ch->sq);
	if (by_ns >= at_load(ch->wake_ns) && ((from + every - 1) & ~(every - 1)) >= end &&
	    !cl_behind_published(&ch->sq, end))
		return;
	cl_doorbell_asleep(ch, sleep_no, by_ns, from, n);
}

#endif /* CHIME_CLIENT_H */
