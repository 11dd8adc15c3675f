/* SPDX-License-Identifier: MIT */
/*
 * chime.h - the client library of chime, a shared-memory timer broker.
 *
 * A process connects to the host's broker (chimed) with chime_open(), arms,
 * resets and cancels timers with no system call (a store into a shared ring),
 * and collects expirations with chime_poll(), chime_wait() or chime_dispatch(),
 * or by watching chime_fd() in its own event loop.
 *
 * Conventions: every call that can fail returns 0 (or a count) on success and
 * a negative errno on failure. The library never prints, logs or raises
 * signals (no SIGPIPE). Times are uint64_t nanoseconds of CLOCK_MONOTONIC:
 * *_ns deadlines are absolute.
 *
 * -ENOTCONN, "the broker is gone": from every call but chime_fd() and
 * chime_close(), from the first call after the broker
 * said it is stopping (a clean stop, or a restart for a connection with no
 * session). A broker that died without saying so (SIGKILL, a crash) is
 * noticed by chime_wait() at once, by chime_poll() and chime_dispatch()
 * within about a second (its heartbeat stops), and by a thread that only
 * arms, resets or cancels when the ring it writes to fills (the calls that
 * write records do not look at its heartbeat). A session's connection reconnects instead
 * (chime_open()).
 *
 * -ECHILD: a chime_t belongs to the process that opened it; in a child after
 * fork() every call on the parent's returns it (chime_close() frees only
 * the child's copies). The child opens its own.
 */
#ifndef CHIME_H
#define CHIME_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHIME_VERSION_MAJOR 0
#define CHIME_VERSION_MINOR 1
#define CHIME_VERSION_PATCH 0

typedef struct chime chime_t;   /* one connection to a broker */
typedef uint64_t chime_id_t;    /* a timer handle; never 0 */

struct chime_opts {
	const char *socket_path;    /* NULL: $CHIME_SOCKET if set and not empty, else the default path */
	unsigned    flags;          /* 0, or CHIME_OPEN_RECORD_RESETS */
	const char *session;        /* NULL: anonymous; else a session name (chime_open()) */
};

struct chime_event {
	chime_id_t id;
	uint64_t   key;
	uint64_t   user_data;
	uint64_t   deadline_ns;     /* the deadline that fired, in the timer's clock: CLOCK_MONOTONIC,
				     * or CLOCK_REALTIME for a chime_arm_realtime() timer */
	uint64_t   fired_ns;        /* when the broker fired it (held for want of room: handed over), CLOCK_MONOTONIC */
};

/*
 * chime_opts.flags: every chime_reset() of this connection is a record in
 * a ring, as a session's are. Without it, an anonymous connection's reset
 * of a one-shot timer to a later deadline, once the broker has applied a
 * reset of that timer, is a compare-and-swap on a word the broker reads
 * when the earlier deadline comes (see chime_reset()); this flag is for
 * comparing the two, or for a broker whose 12 bytes of address space per
 * timer node for the table are too many.
 */
#define CHIME_OPEN_RECORD_RESETS 1u

typedef void (*chime_cb)(const struct chime_event *event, void *arg);

/*
 * Connect to the broker. The socket is opts->socket_path, else $CHIME_SOCKET,
 * else /run/chime/chime.sock (for every user: one broker per host).
 *
 * opts->session NULL (or opts NULL) is an anonymous connection: its timers
 * go when it closes or its process exits. A session name (1..63 bytes of
 * [A-Za-z0-9._-]) opens that session of the caller's uid, or re-attaches it:
 * a session's timers stay armed when its process exits or dies (SIGKILL
 * included), what fires meanwhile is held (a periodic timer holds one event)
 * and delivered in order to the next process that opens the session, and
 * ids from the earlier process stay valid for chime_reset()/chime_cancel().
 * An event the earlier process had not taken yet is delivered again; one it
 * took is not. chime_close() of a session detaches it the same way (the
 * timers stay). The broker reclaims a session nobody re-attached to within
 * its --session-linger (default 1 hour); `chimectl drop-session` does at once.
 * Thread-safe: any thread may open connections at any time (a chime_t per
 * thread included).
 *
 * Returns 0 and sets *out, or:
 *   -EINVAL        out is NULL, opts->flags has a bit other than
 *                  CHIME_OPEN_RECORD_RESETS, the path is empty or
 *                  too long, or opts->session is not a valid name
 *   -ENOENT        no broker listens at the socket path
 *   -EACCES        the broker's policy refused this user (or the socket's permissions
 *                  did), or the session belongs, or its name is reserved, to another user
 *   -EPERM         what listens at the path runs as a user that is not root, not
 *                  this process's, and does not own the socket's directory: not
 *                  trusted with the session and the timers
 *   -EBUSY         the session is attached to another process (or to another
 *                  chime_t of this one)
 *   -EPROTO        the broker speaks another shared-memory layout version
 *   -EXDEV         this process's CLOCK_MONOTONIC is not the broker's (a time
 *                  namespace with another offset): its deadlines would be off
 *   -EUSERS        the broker's client table is full (or this user's share of
 *                  it, or all but its last sixteenth, kept for users holding
 *                  none), or the broker has no descriptor left for a client
 *   -ENOMEM        out of memory (or mapping the segments failed)
 *   -EMFILE, -ENFILE  no descriptor left in this process (or the system) for the
 *                  socket, the welcome's descriptors or chime_fd()'s
 *   -ECONNREFUSED  the broker is stopping (or restarting) and takes no new client
 *   -ECONNRESET    the broker hung up during the handshake
 *   -ETIMEDOUT     the broker did not take the connection (its queue full) and
 *                  answer within 10 s
 *   -EBADMSG       the broker's reply or segments were malformed
 * or another negative errno of socket(2), connect(2), send(2), recvmsg(2),
 * eventfd(2), timerfd_create(2) (a session's), epoll_create1(2), epoll_ctl(2),
 * getsockopt(2) or stat(2). (A failed mmap(2) or fstat(2) of a segment is
 * -ENOMEM or -EBADMSG, as above.)
 */
int chime_open(chime_t **out, const struct chime_opts *opts);

/*
 * Disconnect: the broker cancels every timer of an anonymous connection; a
 * session's stay armed for its next process (see chime_open()), and its
 * close first waits until the broker has applied everything the process
 * submitted, so that a broker crash right after loses none of it (for a
 * broker being restarted: up to 1 s for it to listen, then its restore,
 * within the handshake's 10 s; for one that is there but applies nothing,
 * stopped or stuck: up to 10 s, and its successor's second if it is killed
 * meanwhile; see chime_close(3)). NULL-safe. Not
 * thread-safe: no other thread may use c during or after the call (a
 * thread in chime_wait() must be woken and have returned first). c is
 * freed: any call with it afterwards, in any thread (a second
 * chime_close() included), is undefined. From a chime_dispatch() callback
 * of c, it ends the dispatch, which frees c as it returns.
 */
void chime_close(chime_t *c);

/*
 * End the session opts->session at once: the broker cancels its timers,
 * drops the events it holds and frees the name (what `chimectl
 * drop-session` does, and what --session-linger does in the end). The
 * session must be detached, or its process have exited: a process ends its
 * own session with chime_close() first, then this. opts->socket_path picks
 * the broker as for chime_open(); opts->flags may be what chime_open() took.
 * Thread-safe.
 *
 * Returns 0 (the session is gone; its timers are being reclaimed), or:
 *   -EINVAL        opts or opts->session is NULL, the name is not a session
 *                  name, opts->flags is not one chime_open() takes, or the
 *                  path is empty or too long
 *   -ESRCH         no session of that name
 *   -EBUSY         a live process has it attached (or is taking it over); or
 *                  the broker is stopping (it hands its sessions to the next)
 *                  and the session was not detached yet
 *   -EACCES        the session belongs to another user (root and the broker's
 *                  user may drop any), or the broker's policy (or the socket's
 *                  permissions) refused this user
 *   -ENOENT, -EPERM, -EPROTO, -ETIMEDOUT, -ECONNRESET, -EBADMSG, -ENOMEM, -EMFILE,
 *   -ENFILE, -EUSERS
 *                  as chime_open(): no broker, an untrusted one, another layout,
 *                  no answer within 10 s, a hang-up, a malformed answer, no memory,
 *                  no descriptor here, none in the broker
 * or another negative errno of socket(2), connect(2), send(2), recvmsg(2),
 * getsockopt(2) or stat(2).
 */
int chime_drop_session(const struct chime_opts *opts);

/* CLOCK_MONOTONIC in nanoseconds (the clock of every chime deadline but chime_arm_realtime()'s). */
uint64_t chime_now(void);

/* The library's version as "MAJOR.MINOR.PATCH". */
const char *chime_version(void);

/*
 * Arm a timer at absolute deadline_ns, repeating every period_ns if that is
 * not 0 (it fires at deadline_ns + k * period_ns for every k, never drifting;
 * a period under the broker's resolution, 100 us by default, is taken as it).
 * A deadline in the past fires at once; a periodic timer then fires once for
 * every period already missed (deadline 0 with a 1 s period: one event per
 * second of uptime), as it does when its events are collected late; one at a
 * time: a timer has at most one event waiting, and its next is delivered once
 * the broker has seen that one taken (so a drain on the program's own
 * schedule takes one per drain; chime_wait() takes each as it comes). To
 * start one now, arm it at chime_now(). A deadline of
 * UINT64_MAX never comes, and a periodic timer whose next deadline would
 * pass it stays armed there after its last firing (until cancelled, counted
 * in the quotas). key groups timers for
 * chime_cancel_key(); user_data comes back in the event. Sets *id (never 0)
 * before returning: no round trip. Thread-safe. If the submission ring is
 * full, waits for room (never drops; the broker frees slots whatever its
 * limits); a named session's call also waits while it reconnects to a
 * broker that went (up to $CHIME_RECONNECT_S, 30 s: chime_arm(3); so do
 * its resets, cancels and submits). Returns 0, or:
 *   -EINVAL    c or id is NULL
 *   -ENOMEM    no shard of the broker has a free timer node (its --capacity
 *              is reached, or its filesystem is full); nothing was armed
 *   -EDQUOT    this connection holds its quota of timers (chimed
 *              --max-timers-per-client), or its user's connections and
 *              sessions together hold theirs (--max-timers-per-uid);
 *              nothing was armed
 *   -ENOTCONN  the broker is gone
 * Both refusals are immediate (no broker round trip) and counted, each in
 * a submission slot (a full ring of them waits for room, as arms do, with
 * a broker that applies nothing: stopped, frozen); arms
 * succeed again once timers have fired, or the shard has applied their
 * cancels (a cancel rings no doorbell: a sleeping shard applies it when it
 * wakes, within a heartbeat, or at once after chime_flush()).
 */
int chime_arm(chime_t *c, uint64_t key, uint64_t deadline_ns, uint64_t period_ns,
	      uint64_t user_data, chime_id_t *id);

/*
 * Arm a wall-clock timer: chime_arm(), but deadline_ns is CLOCK_REALTIME
 * nanoseconds since the Epoch ("the reminder at 9:00"), and periods are
 * counted in wall-clock time. It fires when the wall clock reaches
 * deadline_ns + k * period_ns, never earlier by the wall clock, as a
 * timerfd with TFD_TIMER_ABSTIME does: when the wall clock is stepped
 * forward, what is due then fires at once (a periodic timer once per
 * period missed); stepped back, it waits for the wall clock. The broker
 * follows a step within about a heartbeat (at once, in practice), and a
 * slew to within 1 ms. chime_reset() of it takes a CLOCK_REALTIME deadline
 * (always a record: never the record-less path). Its events' deadline_ns
 * is the CLOCK_REALTIME deadline that fired (fired_ns stays
 * CLOCK_MONOTONIC). A deadline before the machine booted (0 included) is
 * in the past: it fires at once, and its event says the boot time instead.
 * Returns what chime_arm() returns, or -EOPNOTSUPP: the broker is older
 * than wall-clock timers (nothing was armed).
 */
int chime_arm_realtime(chime_t *c, uint64_t key, uint64_t deadline_ns, uint64_t period_ns,
		       uint64_t user_data, chime_id_t *id);

/*
 * Move a timer to a new absolute deadline in its clock (CLOCK_MONOTONIC, or
 * CLOCK_REALTIME for a chime_arm_realtime() timer): the keepalive "touch". After this
 * returns, the timer fires at deadline_ns and an earlier firing still in
 * flight is never returned; if the application had already received a
 * one-shot's event, the timer is gone and this changes nothing. A periodic
 * timer keeps its period from the new deadline. Thread-safe. Returns 0, or
 * -EINVAL (c NULL, or id malformed: 0, or not in the form of this broker's
 * ids: one naming a shard it does not have, or generation 0) or -ENOTCONN. A
 * well-formed id that names no live timer of this connection (another
 * connection's, a stale one) is accepted and ignored; a stale id is told
 * from its node's later timers by a 24-bit generation, so do not keep ids
 * of timers that have ended (chime_cancel(3)).
 *
 * On an anonymous connection (not CHIME_OPEN_RECORD_RESETS), once the
 * broker has applied one reset of a one-shot timer (not a wall-clock one:
 * its resets are all records), a reset of it to a
 * deadline no earlier than its last one writes no record: it is a
 * compare-and-swap on a word of the connection's table in shared memory,
 * which the broker reads when the timer's previous deadline comes. The
 * promises above are the same. Two differ: a deadline past 2^63 - 1 ns (292
 * years) is kept as 2^63 - 1, and a reset of a timer that has ended (its
 * event taken, or cancelled) racing with the reuse of its slot by a new
 * timer of this connection armed meanwhile could, in a window of a few
 * instructions, move the new timer if it had been reset to the very
 * deadline the old reset read: reset ids you still hold, not stale ones.
 */
int chime_reset(chime_t *c, chime_id_t id, uint64_t deadline_ns);

/*
 * Cancel a timer. After this returns, no event for id is ever returned, even
 * one the broker had already fired. Cancelling a timer that already fired or
 * was cancelled is not an error, nor is an id that names no timer of this
 * connection (but an id kept long after its timer ended may name a later
 * timer on its node: chime_reset()'s 24-bit generation). Thread-safe. Returns 0, -EINVAL (as chime_reset()) or -ENOTCONN.
 */
int chime_cancel(chime_t *c, chime_id_t id);

/*
 * Cancel every timer this connection armed with `key`, with the same
 * guarantee as chime_cancel() for each. Thread-safe. Returns 0, -EINVAL or
 * -ENOTCONN.
 */
int chime_cancel_key(chime_t *c, uint64_t key);

/* One operation of a chime_submit() batch. */
enum chime_op_code {
	CHIME_ARM = 1,              /* uses key, deadline_ns, period_ns, user_data; sets id */
	CHIME_RESET = 2,            /* uses id, deadline_ns */
	CHIME_CANCEL = 3,           /* uses id */
	CHIME_CANCEL_KEY = 4,       /* uses key */
	CHIME_ARM_REALTIME = 5      /* as CHIME_ARM, deadline_ns CLOCK_REALTIME (chime_arm_realtime()) */
};

struct chime_op {
	uint32_t   op;              /* enum chime_op_code */
	int32_t    result;          /* out: 0, or this operation's negative errno */
	chime_id_t id;              /* CHIME_ARM: out (0 if refused); RESET, CANCEL: in */
	uint64_t   key;
	uint64_t   deadline_ns;     /* in the timer's clock (CLOCK_REALTIME: ARM_REALTIME, and a RESET of one) */
	uint64_t   period_ns;
	uint64_t   user_data;
};

/*
 * Submit n operations at once, for bursts (the timers of 1000 new
 * connections): each does what chime_arm(), chime_reset(), chime_cancel()
 * or chime_cancel_key() would, with the same guarantees once this returns,
 * but the records bound for one shard are reserved with one atomic
 * operation, published with one barrier and followed by at most one
 * doorbell. The arms of one call go to one shard (this thread's home
 * shard, as chime_arm()'s; to others only if it refuses them, and those go
 * out after the call's other operations, then cancelled if a CANCEL_KEY of
 * their key follows them in the call). Operations on one shard take effect
 * in array order.
 * Thread-safe; like chime_arm(), waits
 * for room if a submission ring is full. Sets every ops[i].result and
 * returns how many operations succeeded (0..n), or:
 *   -EINVAL    c is NULL, ops is NULL and n is not 0, or n is above INT_MAX
 *              (no result is set)
 *   -ENOTCONN  the broker is gone and no operation succeeded
 *   -ECHILD    c was opened by the parent process (every result says so too,
 *              but an operation's that is -EINVAL in itself)
 * Per operation, result is 0 or:
 *   -EINVAL    op is not an enum chime_op_code, or the id of a RESET or
 *              CANCEL is one chime_reset() refuses
 *   -ENOMEM, -EDQUOT  an ARM refused, as by chime_arm(); nothing was armed
 *   -EOPNOTSUPP  an ARM_REALTIME to a broker older than wall-clock timers
 *   -ENOTCONN  the broker died before this operation was submitted (or, in a
 *              named session, stopped as it went out: it may still have
 *              been applied, chime_arm(3))
 */
int chime_submit(chime_t *c, struct chime_op *ops, unsigned n);

/*
 * Have the broker apply now what this process has submitted. An operation
 * whose effect can wait (a cancel, a reset or arm due no earlier than its
 * shard's next planned wake-up or a second or more ahead, a burst of up to
 * half a ring) does not wake
 * a sleeping shard: the shard applies it when it wakes, and within about
 * 100 ms in any case (half a second once the broker has been at rest for
 * a second). This wakes every sleeping shard with records of this
 * chime_t waiting, for an application about to read the broker's counters
 * (chimestat) or otherwise needing them applied at once. It does not wait
 * for the shards. Thread-safe; covers every operation that returned before
 * the call. Returns 0, -EINVAL (c is NULL), -ECHILD (after fork) or
 * -ENOTCONN (the broker stopped, or died a second or more ago; a session
 * only once reconnecting has failed: 0 meanwhile, the flush making the
 * attempts that are due).
 */
int chime_flush(chime_t *c);

/*
 * A file descriptor that is readable whenever events are pending, for an
 * application's own epoll, io_uring, libuv or libevent loop (watch it for
 * reading, level-triggered): when it is readable, call chime_poll() until
 * it returns 0, or chime_dispatch() once (it asks for the next wake-up
 * itself). It is also readable within 1 s (at
 * once, in practice) of the broker dying, SIGKILL included; chime_poll() and
 * chime_dispatch() then return -ENOTCONN, and the fd stays readable, so stop
 * watching it. It is an epoll fd owned by the library: do not read or close
 * it; it is closed by chime_close(). The first call switches the drains to
 * arming the fd: make it from the thread that drains (or before draining
 * starts); later calls return the same fd from any thread. Drain until
 * chime_poll()/chime_dispatch() return 0, not merely fewer than asked for:
 * only an empty drain asks for the next wake-up. Returns the fd, -EINVAL or
 * -ECHILD.
 */
int chime_fd(const chime_t *c);

/*
 * Copy up to max pending events into events; never blocks. Returns how many
 * (0..max), -EINVAL (c or events NULL, max 0), or -ENOTCONN once the broker is
 * gone and nothing is left to return. An event whose timer this connection
 * has just reset waits until the shard has applied the reset (microseconds;
 * as long as a stopped broker stays stopped), and so do the events behind
 * it: a poll that finds only such events returns 0, and leaves chime_fd()
 * readable (chime_poll(3)). One thread at a time drains a chime_t
 * (chime_poll, chime_wait, chime_dispatch): any thread, but never two at
 * once; overlapping drains are not checked and are undefined (they lose
 * events: chime_poll(3)), but for one from a chime_dispatch() callback of
 * c, in its thread: -EDEADLK (chime_wait() and chime_dispatch() too).
 */
int chime_poll(chime_t *c, struct chime_event *events, unsigned max);

/*
 * Like chime_poll(), but if nothing is pending, block up to timeout_ms
 * (-1: forever, 0: do not block) for events: it watches the rings for up to
 * 50 us first (yielding the CPU after 5 us; 6 us while events come further
 * apart than that), then sleeps in io_uring on its
 * connection to the broker, so a steady stream of events costs no system call.
 * Returns how many events (0 on timeout), -EINVAL, -ENOTCONN, -ECHILD (see
 * above), -EDEADLK (called from a chime_dispatch() callback of c), -EINTR if a signal interrupted the wait (only a sleep: one handled
 * while the call watches the rings, or before the call, does not end it),
 * or another negative errno of io_uring_enter(2) or ppoll(2). Not beside
 * another drain of c (chime_poll()). chime_close() must not run while
 * another thread waits here: wake that thread first and let it return (a
 * timer armed at deadline 0 always does; a signal only if the thread is
 * asleep when it comes, chime_wait(3)).
 */
int chime_wait(chime_t *c, struct chime_event *events, unsigned max, int timeout_ms);

/*
 * Drain up to max pending events (0: all that are pending now) and call
 * cb(event, arg) for each, in order; never blocks. The callback may arm,
 * reset and cancel timers, but must not drain c (poll, wait, dispatch:
 * -EDEADLK there). It may close c: no event is called back after that
 * callback, and c is closed as chime_dispatch() returns (with the count),
 * not to be used after. Each event is taken just before its callback,
 * so a timer that a callback cancels or resets is never dispatched after
 * it (a connection's callback may free its siblings). Returns how many were
 * dispatched, -EINVAL (c or cb NULL), -ENOTCONN (only if none was), -ECHILD,
 * or -EDEADLK: called from a callback of a chime_dispatch() of c (a drain of
 * c there, chime_poll() or chime_wait() too, says so and takes nothing).
 */
int chime_dispatch(chime_t *c, chime_cb cb, void *arg, unsigned max);

#ifdef __cplusplus
}
#endif

#endif /* CHIME_H */
