/* SPDX-License-Identifier: MIT */
/*
 * broker.h - the control thread's state, private to control.c (the
 * io_uring loop, client life cycle, stop), startup.c (start-up),
 * handshake.c (who gets in) and restart.c (what the next broker gets).
 * main.c sees only control.h.
 */
#ifndef CHIMED_BROKER_H
#define CHIMED_BROKER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <liburing.h>

#include "control.h"
#include "log.h"
#include "policy.h"
#include "segment.h"
#include "sessfile.h"
#include "shard.h"

/*
 * Connections between accept and hello, and how many of them one uid
 * (SO_PEERCRED at accept) may hold: eight uids together fill them, and
 * others' opens then wait up to HELLO_TIMEOUT_S (a bound, documented in
 * chimed(8) and ARCHITECTURE.md, "What a client can touch").
 */
#define MAX_HANDSHAKES   64
#define MAX_HANDSHAKES_PER_UID 8
#define SEND_HOLDS       32     /* users held back at once (struct broker.send_holds) */
#define HELLO_TIMEOUT_S  2
#define HEARTBEAT_NS     (90u * 1000000u)  /* the promise is 100 ms; 10 ms of slack */
/*
 * A broker with nothing to do (every shard asleep with nothing due within
 * an idle beat, no record waiting, no client coming or going, no session's
 * events in hand not seen taken) for
 * QUIET_BEATS heartbeats in a row beats every IDLE_BEAT_NS instead, until
 * anything happens: 2.2 wake-ups a second at rest instead of 11. Below
 * half of what a client allows for both things that wait for a beat: a
 * heartbeat a second old is taken for a dead broker (cl_broker_check()),
 * and a record due a second or more ahead rings no doorbell
 * (LAZY_HORIZON_NS in libclient/client.c). Under a systemd watchdog, at
 * most a quarter of WATCHDOG_USEC (idle_beat_ns() in control.c).
 */
#define IDLE_BEAT_NS     (5u * HEARTBEAT_NS)
#define QUIET_BEATS      11u               /* a second of heartbeats */
#define RING_ENTRIES     256u

/* io_uring user_data: a tag in the low 3 bits, a pointer or a slot above. */
#define TAG_FIXED   0u      /* UD_ACCEPT, UD_SIGNAL, UD_NOTIFY */
#define TAG_HELLO   1u      /* struct conn *: the hello recv */
#define TAG_HTIMER  2u      /* struct conn *: its linked timeout */
#define TAG_HUP     3u      /* hup_seq << 32 | slot << 3: a client's hang-up poll; | HUP_EXIT: its process's */
#define HUP_EXIT    (1u << 31)
#define HUP_MAPPED  (1u << 30)   /* the poll for its struct chime_mapped (on_mapped()) */
#define HUP_SLOT    0x07ffffffu  /* the slot's bits, below HUP_MAPPED */
#define UD_ACCEPT   (1u << 3)
#define UD_SIGNAL   (2u << 3)
#define UD_NOTIFY   (3u << 3)
#define UD_QUIET    (4u << 3)    /* nothing to do: the removal of an exit poll */
#define UD_WALL     (5u << 3)    /* the wall clock's timerfd: a step of CLOCK_REALTIME (wall_watch()) */
#define UD_DISCARD  (6u << 3)    /* the discard helper's socket: answers to read (discard_poll_fd()) */

/*
 * PARKING: a named session's process hung up, the shards are parking its
 * channels (chan_park); DETACHED: parked, no process, timers running, until
 * a re-attach (ATTACHING again), --session-linger or drop-session (DETACHING).
 * HELD: released, but its peer has not read what the broker sent on its
 * socket (held_fd), the welcome's descriptors maybe: the slot waits for it.
 */
enum { CL_FREE, CL_ATTACHING, CL_ACTIVE, CL_DETACHING, CL_PARKING, CL_DETACHED, CL_HELD };

/*
 * A QUERY_TIMERS being answered (handshake.c): the shards' slabs are read
 * QUERY_SCAN_STEP nodes per loop iteration, not all at once, so that a
 * query of a broker holding millions of timers does not hold up every
 * other client's handshake for tens of milliseconds.
 */
struct timers_scan {
	int fd;                 /* the asker's connection; -1: no scan */
	uid_t uid;              /* the user the asker counts as (policy_account_uid()) */
	uint32_t slot;          /* the client whose timers are listed */
	uint64_t generation;    /* its slot's: the client gone, the scan ends */
	bool session;           /* asked for by session name: attached or not, the scan goes on */
	uint32_t shard, next;   /* where the scan is */
	uint64_t limit;
	size_t n;
	struct chime_query_head head;
	struct chime_query_timer *out;  /* [limit] */
};

/*
 * Users owed a turn (handshake.c: the queries' turns, query_turn(), and the
 * timers scan, scan_turn()), in the order they were first refused: the
 * head's turn lasts until until_ns, then it passes to the next. A single
 * owed user let two who asked in a loop take it in alternation, and no
 * third one was ever the first refused: one user can be two (its own uid
 * and its subordinate uids, counted apart). OWED_MAX users wait at most:
 * as many users asking together can still keep one more waiting.
 */
#define OWED_MAX 16
struct owed {
	uid_t uid[OWED_MAX];    /* users as counted (policy_account_uid()), [0] first */
	uint32_t n;
	uint64_t until_ns;      /* the head's turn ends then (UINT64_MAX: not begun) */
};

/* A connection that has not said hello yet. */
struct conn {
	struct conn *next, *prev;  /* all handshakes, so stop can free them */
	int fd;
	uid_t uid;              /* SO_PEERCRED at accept, as counted (policy_account_uid()):
				 * handshakes are capped per user */
	uint8_t inflight;       /* recv + timeout completions still to come (or its held hello's answer) */
	uint8_t closed;
	uint8_t released;       /* read after a hold: answered whatever its user's hold (hellos_held_run()) */
	int held_res;           /* a hello held back (hello_dispatch()): its recvmsg's result, or HELD_UNREAD */
	struct conn *held_next; /* the hellos held back after it */
	uint8_t buf[128] __attribute__((aligned(8)));  /* larger than a hello (96 B): a longer one is garbage */
	/* The hello's recvmsg: room for every descriptor sent with it (SCM_MAX_FD), closed aside. */
	struct msghdr msg;
	struct iovec iov;
	char ctl[CMSG_SPACE(sizeof(int) * 253)] __attribute__((aligned(8)));
} __attribute__((aligned(8)));

struct client {
	uint32_t state;
	uint16_t slot;
	int fd;                 /* its socket */
	/*
	 * An ended connection's socket whose peer has not read everything the
	 * broker sent (SIOCOUTQ), or -1. Descriptors sent with SCM_RIGHTS count
	 * against the sender's user until received (the kernel's unix_inflight,
	 * capped at RLIMIT_NOFILE): welcomes that a client never reads, its
	 * socket kept open, once made every later welcome fail (ETOOMANYREFS).
	 * Held, the slot is not free: at most one per slot, counted against
	 * its user as a client being reclaimed is (uid_full()).
	 */
	int held_fd;
	uint64_t held_since_ns;         /* when held_fd was kept: a rest waits HELD_WAIT_NS for it */
	/* a session's takes watched (head_watch) since then, the shards' watches then (takes_awake()) */
	uint64_t watch_since_ns, watch_fp;
	int pidfd;              /* ACTIVE: its process (SO_PEERPIDFD, else pidfd_open()), or -1 */
	int *bells;             /* [nr_shards]: its own doorbell eventfd per shard (we only read them) */
	/*
	 * The memfds, writable, kept until the connection ends for the punch
	 * (conn_release(), discard.h); ro_fd is the read-only one the client
	 * gets, closed once sent (ro_wfd -1: no /proc, ro_fd is sealed instead).
	 */
	int rw_fd, ro_fd, ro_wfd;
	struct chime_map rw, ro;
	int touch_fd;           /* its touch table (an anonymous client that asked), or -1 */
	struct chime_map touch;
	bool want_touch;        /* its hello asked for the table (CHIME_HELLO_TOUCH) */
	struct chan *chans;     /* [nr_shards], each owned by its shard while attached */
	struct chan_mem *mems;
	struct shard_ack ack;
	int refuse;             /* status to send once the detach is done (failed attach) */
	struct ucred cred;
	uid_t acct_uid;         /* whose share it counts against: cred.uid's (policy_account_uid()) */
	uint64_t timer_quota;   /* what its user's clients may own together, then (uid_timer_quota()) */
	/*
	 * What its latest attach or re-attach posted to the shards (they keep
	 * the user's latest one's), and when (broker.quota_orders then; 0:
	 * none yet): timer_quota is set before the handshake ends, and a
	 * re-attach that fails then never reaches them.
	 */
	uint64_t quota_held;
	uint64_t quota_order;
	uint64_t user_quota;    /* what the shards hold its user to: its account's latest quota_held */
	char comm[16];
	uint64_t refused_logged[3];     /* nomem, quota, of which the user's: the counts last logged */
	uint64_t no_room_seen;          /* reserve_failed_total() then, or at its attach */
	char session[CHIME_SESSION_MAX];  /* "" anonymous; else validated [A-Za-z0-9._-], NUL-terminated */
	uint64_t linger_until_ns;       /* DETACHED: reclaimed then */
	bool unadmitted;                /* DETACHED, and no process can attach under the policy
					 * (restart_say_unattachable(); a detach clears it) */
	/*
	 * A process waiting to re-attach (its socket), or -1: PARKING, until
	 * the park ends; DETACHED with held_fd, until that drains (heartbeat)
	 * or next_until_ns passes (EBUSY).
	 */
	int next_fd;
	struct ucred next_cred;
	bool next_resume;               /* the waiting process's hello (CHIME_HELLO_RESUME) */
	uint64_t next_sq_base;
	uint64_t next_until_ns;
	bool drop_parked;               /* PARKING: chimectl drop-session came meanwhile: detach once parked */
	bool resume;                    /* this attach is libchime reconnecting: it re-submits (chan.c) */
	bool created;                   /* this attach opened its session anew (CHIME_WELCOME_F_NEW_SESSION) */
	/*
	 * ATTACHING: the descriptors went out, nothing is attached, and the
	 * client's struct chime_mapped is awaited (a HUP_MAPPED poll), until
	 * connected_ns + HELLO_TIMEOUT_S. Of a session's detached record:
	 * reattaching, which a failure leaves parked (offer_failed()).
	 */
	bool offered;
	bool reattaching;
	uint64_t sq_base;               /* this attach's first submission position (0, or the hello's) */
	uint64_t generation;
	/*
	 * A session's last process (its sessions-file record's pid): the one
	 * library that may resume it. Another process's attach frees what the
	 * library would re-submit against (the carried grants, chan.c). 0: any.
	 */
	pid_t holder_pid;
	uint64_t holder_start;          /* its start time (chime_proc_start()): a pid reused since is another's; 0: unknown */
	uint32_t token;                 /* chime_welcome.session_token of the last attach; 0: unknown */
	/*
	 * Restored holding grants carried for holder_pid (the process that
	 * was attached when the last broker went): its exit before it resumes
	 * frees them (holder_watch() in control.c). holder_lost: it did, and
	 * its resume is refused (ESTALE): what it would re-submit against is gone.
	 */
	bool holder_watched;
	bool holder_lost;
	int holder_pidfd;               /* the holder watched, its start time checked (holder_watch()); -1: none yet */
	/*
	 * Both as they were before this re-attach: one that fails before the
	 * shards attach it (offer_failed()) freed nothing of the last holder's,
	 * which may still resume, so they come back.
	 */
	pid_t last_holder_pid;
	uint64_t last_holder_start;
	uint32_t last_token;
	uint32_t hup_seq;               /* tags its hang-up poll: a stale one of an earlier attach is ignored */
	uint64_t connected_ns;
	bool acking;                    /* in broker.acking (after generation: client_admit() keeps it) */
};

/* Connect, disconnect, park and drop lines, all clients together (log_budget_take() on conn_log). */
#define CONN_LOG_PER_S 20u
#define CONN_LOG_WHAT "connect and disconnect"

/*
 * The closer's threads at most (aside_unstick()): each a close a client
 * holds up (a lingering TCP socket it sent, before Linux 6.16) and the
 * rest go on. The io_uring workers that closed them before were bound
 * to min(ring entries, 4 per CPU): 8 here.
 */
#define CLOSER_THREADS 16u

struct broker {
	struct broker_opts o;
	struct discard *discard;        /* empties ended connections' segments (discard.h) */
	unsigned discard_lost;          /* its helpers lost, as last logged */
	bool discard_polled;            /* a poll of discard_poll_fd() is in the control ring */
	struct aside *closer;           /* closes descriptors a client may hang work on (close_aside()) */
	uint64_t closer_log;            /* log_ratelimit(): the closer held up (closer_beat()) */
	char ctl_path[PATH_MAX];
	char lock_path[PATH_MAX];
	int lock_fd, listen_fd, ctl_fd, pub_fd, sig_fd, notify_fd;
	int wall_fd;                    /* CLOCK_REALTIME timerfd far ahead, cancelled by a step (control.c) */
	uint64_t wall_buf;
	uint64_t wall_log;              /* log_ratelimit() of the steps' lines (wall_step_log()) */
	uint32_t wall_steps_held;       /* steps since the last line, and what they moved in all (ns) */
	int64_t wall_moved_held;
	struct stat sock_st;            /* the socket file as bound: a stop unlinks only that one */
	struct chime_map ctl_map;
	struct chime_map pub_map;       /* the public segment (clients read it) */
	struct chime_pub *pub;
	struct chime_ctl *ctl;
	struct chime_client_ctl *ctl_clients;
	struct chime_client_geom geom;
	struct shard *shards;
	struct client *clients;
	uint32_t nr_handshakes;
	/*
	 * One past the highest client slot that is not CL_FREE, or more: the
	 * heartbeat's pass (clients_beat) walks only up to it and shrinks it,
	 * so a broker started with --max-clients 65536 and a few clients does
	 * not walk 65536 cold entries every 90 ms.
	 */
	uint32_t clients_hi;
	/*
	 * The slots whose commands the shards have yet to be seen answering
	 * (post_all() adds one, on_notify() takes it off once all have), in
	 * no order: on_notify() runs at every shard's acknowledgement and
	 * walks these, not the table. It walked all --max-clients slots: at
	 * 65536, a user opening and closing in a loop doubled what the control
	 * thread spent per open (ARCHITECTURE.md, "What a client can touch").
	 */
	uint32_t *acking;               /* [max_clients]: a slot is in it at most once */
	uint32_t nr_acking;
	struct conn *conns;
	/*
	 * Users whose last answers cost the control thread SEND_SLOW_NS of CPU
	 * time or more (the kernel wakes every epoll watch on the client's end
	 * inside the send): their next hellos wait in held, in arrival order,
	 * until the hold ends (hello_dispatch(), handshake.c).
	 */
	struct send_hold {
		uid_t uid;
		bool reading;   /* not slow (yet): one connection of it read, the rest wait for its answer */
		uint64_t until;
	} send_holds[SEND_HOLDS];
	struct conn *held;
	uint64_t send_hold_log;         /* log_ratelimit() of "... holding its connections back" */
	bool accept_armed;
	uint32_t quiet_beats;           /* heartbeats in a row that found nothing to do (IDLE_BEAT_NS) */
	uint32_t resting;               /* 1: beating at IDLE_BEAT_NS, or about to; a shard may clear it (rest_end()) */
	int spare_fd;                   /* /dev/null, given up to refuse a connection when out of descriptors */
	uint64_t refuse_log;            /* log_ratelimit() of those refusals */
	uint64_t table_full_log;        /* log_ratelimit() of "the client table is full" */
	uint64_t reopen_log;            /* log_ratelimit() of chime_seg_reopen_ro() failing */
	uint64_t segments_log;          /* log_ratelimit() of "cannot create segments" (client_segments()) */
	bool listening;
	bool stopping;
	struct io_uring ring;
	bool ring_ok;
	uint64_t notify_buf;
	struct signalfd_siginfo sig_buf;
	uint64_t clients_now, clients_total;
	uint64_t quota_orders;          /* attaches and re-attaches posted (client.quota_order) */
	uint64_t last_report_ns;
	struct policy policy;
	uint64_t refused_logged_ns;     /* last "refusing" line: at most one a second */
	struct log_budget conn_log;     /* connects, disconnects, parks, drops: a few a second (log.h) */
	uint64_t last_query_ns[2];      /* [privileged asker]: other users cannot starve root's queries */
	struct owed query_owed;         /* unprivileged users refused: the next turns are theirs */
	uid_t query_last_uid;           /* the last unprivileged user answered */
	struct timers_scan scan;
	struct owed scan_owed;          /* other users refused while a scan ran: the next scans */
	uint32_t refused_quiet;         /* refusals not logged since */
	uint64_t *reserve_failed_logged;   /* [nr_shards] */
	struct sessfile sess;           /* "<socket>.sessions" (restart.c) */
	char sess_path[PATH_MAX];
	bool sess_gone;                 /* its path names it no more, said (restart_watch()) */
	bool sock_gone;                 /* the socket's path names it no more, said (restart_watch()) */
	bool sess_lost;                 /* a stop could not write it again (restart_keep()) */
	/*
	 * [max_clients]: a slot whose record the sessions file does not hold
	 * as it should (its write failed): written again at every heartbeat
	 * and before a stop keeps the file (restart_retry()).
	 */
	bool *rec_stale;
	uint32_t recs_stale;            /* how many */
	uint64_t watched_ns;            /* restart_watch() last looked */
	bool restoring;                 /* start-up: sessions of an earlier broker are being taken over */
	uint32_t sessions_unadmitted;   /* of those, none can attach to under the policy (chime_ctl's) */
	uint32_t sessions_damaged;      /* records of the sessions file dropped at start (chime_ctl's) */
	bool restart;                   /* SIGUSR2: stop, then main() executes chimed again */
};

/* startup.c */
/* The socket's owner and mode from --socket-group and the policy (again at a reload). */
int socket_access(struct broker *b);
/* Remove the socket file, unless the path names another one now. */
void socket_unlink(struct broker *b);

/* control.c */
struct io_uring_sqe *get_sqe(struct broker *b);
void arm_accept(struct broker *b);
void send_status(int fd, int32_t status);
void read_comm(pid_t pid, char comm[16]);
/* Has the process of this pidfd exited (a zombie's is readable too)? */
bool pidfd_exited(int fd);
/* The session's holder no longer watched (holder_watch()): its pidfd closed. */
void holder_unwatch(struct client *c);
void client_admit(struct broker *b, struct conn *cn, const struct ucred *cred, const char *session,
		  bool want_touch);
void client_park(struct broker *b, struct client *c);
void client_reattach(struct broker *b, struct client *c, int fd, const struct ucred *cred, bool resume,
		     uint64_t sq_base);
void client_detach(struct broker *b, struct client *c, int refuse);

void table_set(struct broker *b, struct client *c, uint32_t state);

/* restart.c */
/* Start-up, before the shards: --fresh, or the earlier broker's sessions as DETACHED clients. */
int restart_load(struct broker *b);
/*
 * Say (LOG_WARNING, the first 16 by name) each detached session no process
 * can attach to under the policy: its user not admitted, or its name
 * reserved for another. At the restore (reload false) and after a reload.
 * Returns how many.
 */
uint32_t restart_say_unattachable(struct broker *b, uint64_t now, bool reload);
/* Shard `shard`'s share of them for shard_init() (calloc'd; NULL: nothing to restore). */
struct shard_session *restart_shard_sessions(struct broker *b, uint32_t shard);
/* After the shards: a new sessions file holding the sessions taken over. */
int restart_save(struct broker *b);
/*
 * Remove the shard files (chime_shard_path()) from shard `from` on, up to
 * the first missing one past nr_shards + 8. Returns the timers in them if
 * `count` (for --fresh's message), else 0.
 */
uint64_t restart_remove_shard_files(const struct broker *b, uint32_t from, bool count);
/*
 * After the shards restored, before they run: each restored session that
 * holds grants carried for its process is watched for that process's exit
 * (holder_watched; control.c, holder_watch()).
 */
void restart_watch_holders(struct broker *b);
/* Record a session's slot (opened, detached) or clear it (reclaimed). */
void restart_put(struct broker *b, const struct client *c);
void restart_clear(struct broker *b, const struct client *c);
/* The records whose writes failed, written again (the heartbeat; restart_keep()). */
void restart_retry(struct broker *b);
/* What a stop leaves for the next broker: sessions that are not being reclaimed, nor created by an open not yet welcomed. */
bool restart_session_kept(const struct client *c);
uint32_t restart_sessions(const struct broker *b);
/*
 * A stop that keeps sessions, before the shards stop: the sessions file
 * written again if it was removed while the broker ran (logged; sess_lost
 * if that failed).
 */
void restart_keep(struct broker *b);
/* A stop's timers (the shards stopped): those of the sessions it keeps, and the rest, which end with it. */
struct stop_timers {
	uint64_t kept;
	uint64_t kept_events;   /* events of those sessions fired and not consumed (a periodic's: its timer too) */
	uint64_t dropped;
	uint64_t dropped_events; /* of those clients, fired and not consumed (the next broker's restore frees them too) */
	uint32_t anonymous;     /* clients whose timers those are (anonymous, or sessions being reclaimed) */
};

/*
 * Close the sessions file; remove it if it is ours and no session is left.
 * `lost_shards`: shard files a stop keeping sessions could not write again.
 * `t`: what to say of the timers (NULL: nothing).
 */
void restart_close(struct broker *b, uint32_t sessions, uint32_t lost_shards, const struct stop_timers *t);
/* At the heartbeat: say once (LOG_ERR) if a file the next broker needs was removed or replaced. */
void restart_watch(struct broker *b, uint64_t now);

/* How long a session's next process waits for its last connection's socket to drain (held_fd). */
#define HELD_WAIT_NS (1000u * 1000000u)
/*
 * How long a restored session waits for a process at least, from the end
 * of the restore, whatever --session-linger: its process may be alive and
 * reconnecting, and libchime's attempts come a second apart at most.
 */
#define RESTART_LINGER_NS (3000u * 1000000u)
/* How long a session's process that takes none of its events keeps the 90 ms beat (takes_awake()). */
#define WATCH_WAIT_NS (1000u * 1000000u)

/* control.c: can a client still punch holes in this memfd of its own (not sealed against writes)? */
bool punchable(int fd);
/* control.c: close c->held_fd once its peer has read or dropped what we sent; true if none is held. */
bool held_drained(struct broker *b, struct client *c);
/* control.c: held_drained(), and a HELD slot whose socket drained is free again; true if it was freed. */
bool held_free_if_drained(struct broker *b, struct client *c);
/*
 * The broker's last close of a file a client could have chosen or holds
 * (a socket, whose queue may hold descriptors it sent; a doorbell), on a
 * closer thread: see control.c. And every descriptor received in mh, so.
 */
void close_aside(struct broker *b, int fd);
void close_sent_fds(struct broker *b, struct msghdr *mh);

/* handshake.c */
/* "refusing pid ... (uid ...): why", at most once a second (anyone may make the broker refuse). */
void refuse_log(struct broker *b, const struct ucred *cred, const char *why);

/* The table's last 1/TABLE_RESERVE_DIV is for users holding no slot: may cred's user not take one? */
#define TABLE_RESERVE_DIV 16u
bool table_kept_from(const struct broker *b, const struct ucred *cred);
/* The policy part of broker_reload(): re-read it, log the outcome, say it in *out (if not NULL). */
void policy_reload(struct broker *b, struct chime_query_reload *out);

void arm_hello(struct broker *b, struct conn *cn);
/* A connection accepted: its hello read from now on, or (its user held back) once the hold ends. */
void hello_arm(struct broker *b, struct conn *cn);
/*
 * A hello's completion: its descriptors closed, then answered now, or held
 * back while its user's are (then answered by hellos_held_run()).
 */
void hello_dispatch(struct broker *b, struct conn *cn, int res);
/*
 * Check a hello and its peer, answer it, start the attach. The peer's
 * credentials given (NULL: SO_PEERCRED): tests/fuzz/fuzz_hello.c speaks
 * for users it is not.
 */
void hello_answer(struct broker *b, struct conn *cn, int res, const struct ucred *peer);
/*
 * Answer the held hellos whose user's hold has ended, and read one held
 * connection of each such user; the earliest end of the rest (UINT64_MAX: none).
 */
uint64_t hellos_held_run(struct broker *b);
/* The sends to clients since the last call: if slow, uid's next hellos are held back. */
void sends_judge(struct broker *b, uid_t uid);
/*
 * send() and sendmsg() (MSG_NOSIGNAL | MSG_DONTWAIT) to a client's socket,
 * their CPU time counted for sends_judge(): -1 and errno as theirs.
 */
ssize_t client_send(int fd, const void *buf, size_t len);
ssize_t client_sendmsg(int fd, const struct msghdr *mh);
bool handshake_allowed(struct broker *b, struct conn *cn);
void conn_put(struct broker *b, struct conn *cn);
/* Scan on for the pending timers query (answering it when done); true while one is left. */
bool query_step(struct broker *b);
/* Drop the pending timers query unanswered (the broker stops). */
void query_abort(struct broker *b);

/* A CL_FREE slot is being taken: keep clients_hi above it. */
/* The timers the clients of account `as` may own together, by the policy now (0: no limit). */
static inline uint64_t uid_timer_quota(const struct broker *b, uid_t as)
{
	return policy_has_subuids(&b->policy, as) ? b->o.max_timers_with_subuids : b->o.max_timers_per_uid;
}

static inline void client_taken(struct broker *b, const struct client *c)
{
	if (c->slot >= b->clients_hi)
		b->clients_hi = c->slot + 1u;
}

#endif /* CHIMED_BROKER_H */
