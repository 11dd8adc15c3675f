/* SPDX-License-Identifier: MIT */
/*
 * control.c - the control thread. See control.h and ARCHITECTURE.md
 * ("Client lifecycle").
 *
 * One io_uring loop, never blocked by a client:
 *   accept        one outstanding accept on the listening socket (re-armed
 *                 while fewer than MAX_HANDSHAKES handshakes are under way);
 *   hello         a recv linked to a HELLO_TIMEOUT: a silent client is
 *                 dropped, one that sends anything but a hello is closed;
 *                 the checks (policy, per-user caps, queries) are
 *                 handshake.c's, which hands an admitted client back to
 *                 client_admit();
 *   attach        segments created and sealed, an ATTACH command to every
 *                 shard (they allocate the grants); the last shard to finish
 *                 writes our notify eventfd, and only then is the welcome
 *                 (with the fds) sent;
 *   hang-up       a POLLRDHUP poll on every client's socket: death is seen at
 *                 once; then DETACH to every shard, and when all have
 *                 reclaimed the client's nodes, its slot is freed (nothing
 *                 comes from a client after its attach, and nothing is read
 *                 then: what a hostile one sends waits in its socket, its
 *                 own send buffer's worth);
 *   signals       a signalfd read (SIGTERM, SIGINT: stop; SIGHUP: reload);
 *   heartbeat     the wait times out so heartbeat_ns moves every 90 ms (every
 *                 450 ms at rest: IDLE_BEAT_NS in broker.h).
 *
 * Client slot states (private): FREE -> ATTACHING -> ACTIVE -> DETACHING -> FREE;
 * an attach that fails goes ATTACHING -> DETACHING (refused with -ENOMEM).
 * A slot is reused only after every shard has let go of it.
 */
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>
#include <linux/sockios.h>      /* SIOCOUTQ */

#include "broker.h"
#include "atomics.h"
#include "chime_shm.h"
#include "clock.h"
#include "discard.h"
#include "log.h"
#include "notify.h"
#include "segment.h"
#include "shard.h"
#include "wall.h"

/* ------------------------------------------------------------------------ */
/* The client table in the control segment (seqlock: we are its only writer)   */
/* ------------------------------------------------------------------------ */

void table_set(struct broker *b, struct client *c, uint32_t state)
{
	struct chime_client_ctl *e = &b->ctl_clients[c->slot];

	chime_stats_begin(&e->seq);
	e->state = state;
	/*
	 * DYING too: a slot can go there without ever being ACTIVE (a welcome
	 * never answered, then HELD), and it showed its last occupant's pid,
	 * uid and comm (root's, say) while chimectl users counted it for its
	 * real user.
	 */
	if (state != CHIME_CLIENT_EMPTY) {
		e->pid = c->cred.pid;
		e->uid = c->cred.uid;
		e->gid = c->cred.gid;
		memcpy(e->comm, c->comm, sizeof(e->comm));
		e->connected_ns = c->connected_ns;
		e->generation = c->generation;
		memcpy(e->session, c->session, sizeof(e->session));
	}
	e->linger_until_ns = state == CHIME_CLIENT_DETACHED ? c->linger_until_ns : 0;
	chime_stats_end(&e->seq);
	/* Plain stores: tools read these racily, as the header table allows. */
	b->ctl->clients_now = b->clients_now;
	b->ctl->clients_total = b->clients_total;
}

void read_comm(pid_t pid, char comm[16])
{
	char path[64];
	ssize_t n;
	int fd;

	memset(comm, 0, 16);
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, comm, 15);
	close(fd);
	if (n > 0 && comm[n - 1] == '\n')
		comm[--n] = 0;
	/*
	 * Any process names itself (prctl PR_SET_NAME): a newline would forge
	 * a log line (at any priority, in the journal), an escape sequence
	 * would reach an operator's terminal through chimectl and chimestat.
	 * Printable characters only, here, where every reader gets it from;
	 * anything else, byte by byte, is '?'.
	 */
	chime_printable(comm, 16);
}

/* ------------------------------------------------------------------------ */
/* The loop                                                                    */
/* ------------------------------------------------------------------------ */

struct io_uring_sqe *get_sqe(struct broker *b)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);

	if (!sqe) {
		/* Full: hand what we have to the kernel and take a fresh one. */
		io_uring_submit(&b->ring);
		sqe = io_uring_get_sqe(&b->ring);
	}
	return sqe;
}

/*
 * Armed while stopping too: a stop lasts as long as the attached sessions
 * take to park (up to STOP_PARK_NS), and the hellos that come meanwhile are
 * answered ECONNREFUSED at once (client_admit(), session_open()). Not
 * re-armed then, the one accept outstanding took one connection and the
 * rest waited in the queue for the broker to exit, each chime_open() up
 * to 5 s for an ECONNRESET (restart/opens_during_a_stop_are_refused_with_econnrefused).
 */
void arm_accept(struct broker *b)
{
	struct io_uring_sqe *sqe;

	if (b->accept_armed || b->nr_handshakes >= MAX_HANDSHAKES)
		return;
	sqe = get_sqe(b);
	if (!sqe)
		return;
	io_uring_prep_accept(sqe, b->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, UD_ACCEPT);
	b->accept_armed = true;
}

static void arm_read(struct broker *b, int fd, void *buf, unsigned len, uint64_t ud)
{
	struct io_uring_sqe *sqe = get_sqe(b);

	if (!sqe)
		return;
	io_uring_prep_read(sqe, fd, buf, len, 0);
	io_uring_sqe_set_data64(sqe, ud);
}

/*
 * While the discard helper owes answers, a poll for them: a step reads
 * them at once, and the jobs waiting behind a full socket go on to it
 * without waiting for a heartbeat.
 */
static void discard_poll(struct broker *b)
{
	struct io_uring_sqe *sqe;
	int fd = discard_poll_fd(b->discard);

	if (b->discard_polled || fd < 0 || !(sqe = get_sqe(b)))
		return;
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	io_uring_sqe_set_data64(sqe, UD_DISCARD);
	b->discard_polled = true;
}

static uint64_t hup_ud(const struct client *c, uint32_t exit)
{
	return (uint64_t)c->hup_seq << 32 | exit | ((uint64_t)c->slot << 3) | TAG_HUP;
}

/* Older headers (Debian 12's) lack it; its number is the generic one on these. */
#if !defined(SO_PEERPIDFD) && (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__) || \
			      defined(__arm__) || defined(__riscv))
#define SO_PEERPIDFD 77
#endif

/*
 * The client's process, as a pidfd: the one that connected (SO_PEERPIDFD,
 * Linux 6.5), else the pid SO_PEERCRED gave (pidfd_open(); a pid reused
 * since would be watched instead, and the socket's hang-up still ends the
 * client). -ESRCH: the process is gone already. Another -errno (no
 * descriptor left, a pid from another namespace): the hang-up alone then.
 */
static int peer_pidfd(const struct client *c)
{
	int fd = -1;
#ifdef SO_PEERPIDFD
	socklen_t len = sizeof(int);

	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0)
		return fd;      /* close-on-exec, as every pidfd */
	if (fd < 0 && errno == ESRCH)
		return -ESRCH;
#endif
	if (c->cred.pid <= 0)
		return -EINVAL;
	fd = pidfd_open(c->cred.pid, 0);
	return fd >= 0 ? fd : -errno;
}

/*
 * Watch an ACTIVE client's end: the hang-up of its socket, and the exit of
 * its process. The hang-up alone came 8-13 ms after the exit of a process
 * that had waited in chime_wait(): the poll its io_uring left holds the
 * socket open until the kernel tears the ring down. Meanwhile the client
 * counted as attached: its session -EBUSY to a restarted worker, its slot
 * in its user's --max-clients-per-uid (-EUSERS). A pidfd is readable at
 * the exit itself. False: the process is gone already (its pid with it).
 */
static bool arm_hup(struct broker *b, struct client *c)
{
	struct io_uring_sqe *sqe = get_sqe(b);
	int fd;

	if (!sqe)
		return true;
	io_uring_prep_poll_add(sqe, c->fd, POLLRDHUP);
	io_uring_sqe_set_data64(sqe, hup_ud(c, 0));
	fd = peer_pidfd(c);
	if (fd == -ESRCH)
		return false;
	c->pidfd = fd >= 0 ? fd : -1;
	if (c->pidfd < 0 || !(sqe = get_sqe(b)))
		return true;
	io_uring_prep_poll_add(sqe, c->pidfd, POLLIN);
	io_uring_sqe_set_data64(sqe, hup_ud(c, HUP_EXIT));
	return true;
}

/*
 * The exit poll goes with the pidfd: closing the descriptor does not end a
 * poll the ring holds, and a process that lives on after closing its
 * connection would keep one per connection it ever made.
 */
static void exit_watch_end(struct broker *b, struct client *c)
{
	struct io_uring_sqe *sqe;

	if (c->pidfd < 0)
		return;
	if (b->ring_ok && (sqe = get_sqe(b))) {
		io_uring_prep_poll_remove(sqe, hup_ud(c, HUP_EXIT));
		io_uring_sqe_set_data64(sqe, UD_QUIET);
	}
	close(c->pidfd);
	c->pidfd = -1;
}

/*
 * Our last descriptor for a file the client shares, closed on the closer
 * thread (aside.h): the close runs what the client hung on the file (a
 * doorbell's epoll watches; a socket's queued descriptors, close_sent_fds()),
 * and only its own thread should wait for that. A client's epoll instances
 * may watch its doorbell under as many descriptors as it likes (each
 * dup() a watch of its own, kept after the client closes them all, up to
 * fs.epoll.max_user_watches), and each close of the file's last
 * reference removes them one by one (eventpoll_release_file()): in a
 * stall audit, 1.9 million watches cost the control thread 620-670 ms of
 * CPU at the client's hang-up, heartbeats 753-900 ms old and opens of
 * 557-599 ms (4 runs). The worker's wait and CPU are the client's, on a
 * thread of ours that nothing waits for; no such thread: closed here.
 */
void close_aside(struct broker *b, int fd)
{
	struct aside_job j = { .op = ASIDE_CLOSE, .fd = fd };

	if (!aside_post(b->closer, &j))
		close(fd);
}

/*
 * At each heartbeat: closes waiting behind one held up for a beat get
 * another closer thread; all CLOSER_THREADS held up (lingering sockets
 * clients sent, before Linux 6.16), the operator is told, the broker's
 * descriptors for the closes behind them open until one ends.
 */
static void closer_beat(struct broker *b)
{
	int r = aside_unstick(b->closer);

	if (r < 0 && log_ratelimit(&b->closer_log, 60))
		log_msg(LOG_WARNING, r == -EBUSY ?
			"closes of client descriptors wait behind %u closer threads all held up (sockets set to linger, "
			"sent by a client?): the broker keeps those descriptors open until one ends" :
			"closes of client descriptors wait, and no closer thread could be added (%u at most)",
			CLOSER_THREADS);
}

/*
 * Before Linux 6.16 (SO_PASSRIGHTS, startup.c) a client can send
 * descriptors with any message, and one the broker drops unread has its
 * last close where the broker drops it: a TCP socket set to linger holds
 * that thread for as long as the client chose. So every message is
 * received with room for them (SCM_MAX_FD), and each goes to
 * close_aside(); and so does every client socket, whose queue may hold
 * more (the kernel closes them as it frees the socket).
 */
void close_sent_fds(struct broker *b, struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			close_aside(b, fd);
		}
	}
}

/* A refusal: status only, no fds; then the connection is closed. */
void send_status(int fd, int32_t status)
{
	struct chime_welcome w = {
		.magic = CHIME_HELLO_MAGIC,
		.layout = CHIME_SHM_LAYOUT,
		.status = status,
	};

	/* A fresh SEQPACKET socket has room for one 64-byte message: this never blocks. */
	(void)client_send(fd, &w, sizeof(w));
}

static struct chime_welcome welcome_of(const struct broker *b, const struct client *c, uint32_t nfds)
{
	return (struct chime_welcome){
		.magic = CHIME_HELLO_MAGIC,
		.layout = CHIME_SHM_LAYOUT,
		.status = 0,
		.nr_shards = b->o.nr_shards,
		.slot = c->slot,
		.nr_fds = nfds,
		.rw_size = c->rw.size,
		.ro_size = c->ro.size,
		.pub_size = b->pub_map.size,
		/* chan.c: word_wait; the touch table if it asked */
		.features = CHIME_WELCOME_F_CLAIMS | CHIME_WELCOME_F_REALTIME | CHIME_WELCOME_F_CLOCK |
			    (c->touch_fd >= 0 ? CHIME_WELCOME_F_TOUCH : 0) | (c->created ? CHIME_WELCOME_F_NEW_SESSION : 0),
		.session_token = c->session[0] ? c->token : 0,
	};
}

/* The attach's first message: the descriptors, before anything is attached (struct chime_mapped). */
static int send_offer(struct broker *b, struct client *c)
{
	uint32_t nfds = CHIME_WELCOME_FIXED_FDS + b->o.nr_shards + (c->touch_fd >= 0);
	struct chime_welcome w = welcome_of(b, c, nfds);
	size_t clen = CMSG_SPACE(sizeof(int) * nfds);
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	int *fds, r = 0;
	char *cbuf = calloc(1, clen);

	if (!cbuf)
		return -ENOMEM;
	mh.msg_control = cbuf;
	mh.msg_controllen = clen;
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
	fds = (int *)CMSG_DATA(cm);
	fds[0] = b->pub_fd;
	fds[1] = c->rw_fd;
	fds[2] = c->ro_fd;
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		fds[CHIME_WELCOME_FIXED_FDS + i] = c->bells[i];
	if (c->touch_fd >= 0)
		fds[CHIME_WELCOME_FIXED_FDS + b->o.nr_shards] = c->touch_fd;
	if (client_sendmsg(c->fd, &mh) < 0)
		r = -errno;
	free(cbuf);
	return r;
}

/* Its last: attached. The client has read the offer (it mapped what came with it): there is room. */
static int send_ready(struct broker *b, struct client *c)
{
	struct chime_welcome w = welcome_of(b, c, 0);

	return client_send(c->fd, &w, sizeof(w)) < 0 ? -errno : 0;
}

/* Has the peer of socket fd not read everything we sent on it? (SIOCOUTQ: our messages in its queue) */
static bool unread_by_peer(int fd)
{
	int n = 0;

	return ioctl(fd, SIOCOUTQ, &n) == 0 && n > 0;
}

/* Slab reservations the shards' filesystem refused so far, summed (a counter: only grows). */
static uint64_t reserve_failed_total(const struct broker *b)
{
	const struct chime_shard_ctl *sc = (const struct chime_shard_ctl *)((const char *)b->ctl + b->ctl->shards_off);
	uint64_t n = 0;

	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		n += at_load(&sc[i].stats.reserve_failed);
	return n;
}

/* Some shard's slab is reserved short of --capacity (shard_slab_short()). */
static bool any_slab_short(const struct broker *b)
{
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		if (shard_slab_short(&b->shards[i]))
			return true;
	return false;
}

/*
 * A client's refused arms not logged yet, one line per cause: from the
 * report every LIMITS_REPORT_NS, and when its connection ends (`at_end`,
 * on the connection lines' budget: a loop of clients refused once each
 * cannot flood the log). Before the second, a client that was refused and
 * went before the next report was never logged.
 */
static void refusals_log(struct broker *b, struct client *c, bool at_end)
{
	const char *base = (const char *)b->ctl;
	const struct chime_client_stats *cs =
		(const struct chime_client_stats *)(base + b->ctl->client_stats_off);
	uint64_t sum[3] = { 0, 0, 0 }, no_room = reserve_failed_total(b), own, user, nomem;
	/*
	 * Reservations that failed since the last look (its attach, or at most
	 * LIMITS_REPORT_NS ago): the filesystem's doing, not --capacity. The
	 * lifetime total said so for every refusal after the first failure.
	 * Nor is a refusal by a shard whose slab is still reserved short of
	 * its capacity after a failure: a shard retries at most once a second,
	 * and a client refused in between, no failure counted since its
	 * attach, was said to be at --capacity on a full filesystem.
	 */
	bool fs_full = no_room != c->no_room_seen || (no_room && any_slab_short(b));

	c->no_room_seen = no_room;
	for (uint32_t i = 0; i < b->o.nr_shards; i++) {
		const struct chime_client_stats *e = &cs[(uint64_t)c->slot * b->o.nr_shards + i];

		if (at_load(&e->generation) != c->generation)
			continue;
		sum[0] += at_load(&e->refused_nomem);
		sum[1] += at_load(&e->refused_quota);
		sum[2] += at_load(&e->refused_user_quota);
	}
	if (!memcmp(sum, c->refused_logged, sizeof(sum)))
		return;
	if (at_end && !log_budget_take(&b->conn_log, CONN_LOG_PER_S, CONN_LOG_WHAT)) {
		memcpy(c->refused_logged, sum, sizeof(sum));
		return;
	}
	/* refused_user_quota is a part of refused_quota: the rest is the client's own. */
	own = (sum[1] - sum[2]) - (c->refused_logged[1] - c->refused_logged[2]);
	user = sum[2] - c->refused_logged[2];
	nomem = sum[0] - c->refused_logged[0];
	/*
	 * Each shard enforces its share of a quota, and libchime takes an arm
	 * a shard refused to the next: with shards, a refusal is a shard's (the
	 * arm may have been made on another), not the whole quota full.
	 */
	if (sum[1] - sum[2] > c->refused_logged[1] - c->refused_logged[2] && b->o.nr_shards == 1)
		log_msg(LOG_WARNING, "client pid %d '%s' uid %u: %llu arm%s refused: it holds its "
			"quota of %llu timers (--max-timers-per-client; armed, fired and not consumed, "
			"and one set aside per submission slot)",
			(int)c->cred.pid, c->comm, (unsigned)c->cred.uid,
			(unsigned long long)own, own == 1 ? "" : "s",
			(unsigned long long)b->o.max_timers_per_client);
	else if (sum[1] - sum[2] > c->refused_logged[1] - c->refused_logged[2])
		log_msg(LOG_WARNING, "client pid %d '%s' uid %u: %llu arm%s refused by a shard: it holds "
			"its share of its quota there (%llu of --max-timers-per-client %llu on each of %u "
			"shards; armed, fired and not consumed, and one set aside per submission slot); "
			"libchime tries the other shards, and the arm fails only if they all refuse",
			(int)c->cred.pid, c->comm, (unsigned)c->cred.uid,
			(unsigned long long)own, own == 1 ? "" : "s",
			(unsigned long long)b->shards[0].cfg.quota,
			(unsigned long long)b->o.max_timers_per_client, b->o.nr_shards);
	if (sum[2] > c->refused_logged[2] && b->o.nr_shards == 1)
		log_msg(LOG_WARNING, "client pid %d '%s' uid %u: %llu arm%s refused: the clients of "
			"uid %u together hold its quota of %llu timers (--max-timers-per-uid; armed, "
			"fired and not consumed, and one set aside per submission slot of each)",
			(int)c->cred.pid, c->comm, (unsigned)c->cred.uid,
			(unsigned long long)user, user == 1 ? "" : "s", (unsigned)c->cred.uid,
			(unsigned long long)c->user_quota);
	else if (sum[2] > c->refused_logged[2])
		log_msg(LOG_WARNING, "client pid %d '%s' uid %u: %llu arm%s refused by a shard: the "
			"clients of uid %u together hold its share of their quota there (%llu of "
			"%llu on each of %u shards, --max-timers-per-uid; armed, fired and not consumed, "
			"and one set aside per submission slot of each); libchime tries the other shards, "
			"and the arm fails only if they all refuse",
			(int)c->cred.pid, c->comm, (unsigned)c->cred.uid,
			(unsigned long long)user, user == 1 ? "" : "s", (unsigned)c->cred.uid,
			(unsigned long long)shard_share(c->user_quota, b->o.nr_shards),
			(unsigned long long)c->user_quota, b->o.nr_shards);
	/* The shard's own warning says more. */
	if (sum[0] > c->refused_logged[0] && fs_full)
		log_msg(LOG_WARNING, "client pid %d '%s' uid %u: %llu arm%s refused: the filesystem of "
			"'%s' has no room for more timers",
			(int)c->cred.pid, c->comm, (unsigned)c->cred.uid,
			(unsigned long long)nomem, nomem == 1 ? "" : "s", b->o.socket_path);
	else if (sum[0] > c->refused_logged[0])
		log_msg(LOG_WARNING, "client pid %d '%s' uid %u: %llu arm%s refused: the shards are "
			"full (--capacity %u per shard)",
			(int)c->cred.pid, c->comm, (unsigned)c->cred.uid,
			(unsigned long long)nomem, nomem == 1 ? "" : "s", b->o.capacity);
	memcpy(c->refused_logged, sum, sizeof(sum));
}

/*
 * Can the client still punch holes in this writable memfd of its own (not
 * sealed against writes: an attach that failed before it sealed)? Our
 * munmap of it would wait for a punch under way (discard_post()).
 * F_GET_SEALS takes no lock a punch holds.
 */
bool punchable(int fd)
{
	int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : F_SEAL_WRITE;

	return seals < 0 || !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
}

/*
 * What belongs to one process's connection: its segments, doorbells and
 * socket (a parked session keeps its channels, the shards' private state).
 */
static void conn_release(struct broker *b, struct client *c)
{
	/* rw and the touch table, as discard_post() numbers them */
	unsigned unsealed = (punchable(c->rw_fd) ? 1u : 0) | (punchable(c->touch_fd) ? 4u : 0);

	if (b->ctl && c->mems)
		refusals_log(b, c, true);       /* every shard is done with it: its counts are final */
	exit_watch_end(b, c);
	free(c->mems);
	c->mems = NULL;
	/*
	 * The connection is over, but its process may keep the memfds (a
	 * descriptor, a mapping) as long as it likes: punch their pages out,
	 * most of which the broker faulted (rings formatted, events written)
	 * and so were charged to it, in no process's RSS. Kept, an audit's
	 * client held 1.28 MiB of the broker's memory per connection, 250 MiB
	 * in 2.5 s. Not when stopping: a session's library resumes from its
	 * old rings with the next broker (reconnect.c).
	 */
	if (!b->stopping) {
		/*
		 * On a thread of its own: a client can make the punch slow
		 * (discard.h). At most --max-clients-per-uid of a user's
		 * connections wait for it (--max-clients with no such limit),
		 * the others are closed without it: the thread runs at idle
		 * priority, and while any user starved it of CPU (busy loops
		 * beside the broker) or held it up with a slow punch, a user
		 * opening and closing in a loop queued every connection's
		 * pages (up to 96 MiB of its own touch table each, in no
		 * process once it exits), without bound: an audit queued 80 a
		 * second with one busy loop on the broker's CPU (mappings then,
		 * towards vm.max_map_count). Closed, an honest client's pages
		 * go with its own close; a hostile one keeps what it holds.
		 */
		struct chime_map maps[3] = { c->rw, c->ro, c->touch };
		int fds[3] = { c->rw_fd, c->ro_wfd, c->touch_fd };
		/*
		 * Only ro is punched: rw's and the touch table's pages are the
		 * client's, and a punch would wait for their inode lock, which a
		 * client can hold for good (a write() to them from a buffer whose
		 * page fault it serves; sealed ones too on a kernel whose write
		 * faults the buffer in before it checks the seals: 6.18 checks
		 * first). It cannot write ro.
		 */
		size_t sizes[3] = { 0, c->ro.size, 0 };
		uint32_t max = b->o.max_clients_per_uid ? b->o.max_clients_per_uid : b->o.max_clients;

		/*
		 * Our mappings go first, in steps (discard_step()), an unsealed
		 * one once it is sealed: punches go after, through the descriptors.
		 */
		discard_post(b->discard, maps, fds, sizes, 3, c->acct_uid, max, unsealed);
		memset(&c->rw, 0, sizeof(c->rw));
		memset(&c->ro, 0, sizeof(c->ro));
		memset(&c->touch, 0, sizeof(c->touch));
		c->rw_fd = c->ro_wfd = c->touch_fd = -1;
	}
	/* Stopping: an unsealed one stays mapped, for the exit to unmap (discard_stop()). */
	if (unsealed & 1u)
		memset(&c->rw, 0, sizeof(c->rw));
	if (unsealed & 4u)
		memset(&c->touch, 0, sizeof(c->touch));
	chime_seg_unmap(&c->rw);
	chime_seg_unmap(&c->ro);
	chime_seg_unmap(&c->touch);
	if (c->rw_fd >= 0)
		close(c->rw_fd);
	if (c->ro_fd >= 0)
		close(c->ro_fd);
	if (c->ro_wfd >= 0)
		close(c->ro_wfd);
	if (c->touch_fd >= 0)
		close(c->touch_fd);
	c->touch_fd = c->ro_wfd = -1;
	for (uint32_t i = 0; c->bells && i < b->o.nr_shards; i++)
		if (c->bells[i] >= 0)
			close_aside(b, c->bells[i]);
	free(c->bells);
	c->bells = NULL;
	/*
	 * Only now: a shard may send wake-ups on it until its detach is
	 * acknowledged. Kept while its peer has not read what we sent (held_fd).
	 */
	if (c->fd >= 0 && !b->stopping && c->held_fd < 0 && unread_by_peer(c->fd)) {
		c->held_fd = c->fd;
		c->held_since_ns = now_ns();
	} else if (c->fd >= 0)
		close_aside(b, c->fd);
	if (b->stopping && c->held_fd >= 0) {
		close_aside(b, c->held_fd);
		c->held_fd = -1;
	}
	c->rw_fd = c->ro_fd = c->fd = -1;
}

/* A held socket whose peer has read, or dropped, what we sent is closed: true if none is held now. */
bool held_drained(struct broker *b, struct client *c)
{
	if (c->held_fd >= 0 && !unread_by_peer(c->held_fd)) {
		close_aside(b, c->held_fd);
		c->held_fd = -1;
	}
	return c->held_fd < 0;
}

bool held_free_if_drained(struct broker *b, struct client *c)
{
	if (c->held_fd < 0 || !held_drained(b, c) || c->state != CL_HELD)
		return false;
	c->state = CL_FREE;
	table_set(b, c, CHIME_CLIENT_EMPTY);
	return true;
}

static void client_release(struct broker *b, struct client *c)
{
	holder_unwatch(c);
	for (uint32_t i = 0; c->chans && i < b->o.nr_shards; i++)
		chan_fini(&c->chans[i]);
	free(c->chans);
	c->chans = NULL;
	conn_release(b, c);
	if (c->next_fd >= 0) {
		send_status(c->next_fd, -ECONNREFUSED);
		close_aside(b, c->next_fd);
	}
	c->next_fd = -1;
	c->state = c->held_fd >= 0 ? CL_HELD : CL_FREE;        /* clients_beat() frees a HELD one */
}

/*
 * An anonymous client's touch table (chime_shm.h, CHIME_TOUCH_BYTES): 12
 * bytes per node of every shard, address space only until the client
 * writes an entry (the shards fault in no more of it than its timers need,
 * chan.c). Sealed, as its segments are.
 */
static int touch_table(struct broker *b, struct client *c)
{
	size_t size = (size_t)b->o.capacity * b->o.nr_shards * CHIME_TOUCH_BYTES;
	int r = chime_seg_memfd("chime-client-touch", size, &c->touch_fd, &c->touch);

	if (r < 0)
		return r;
	for (uint32_t s = 0; s < b->o.nr_shards; s++) {
		c->mems[s].touch_word = chime_touch_words(c->touch.base, s, b->o.capacity);
		c->mems[s].touch_tag = chime_touch_tags(c->touch.base, b->o.nr_shards, s, b->o.capacity);
	}
	return chime_seg_seal(c->touch_fd, CHIME_SEAL_SIZE);        /* the client seals the rest */
}

/* Build the client's segments and channel descriptions. */
static int client_segments(struct broker *b, struct client *c)
{
	const struct chime_client_geom *g = &b->geom;
	struct chime_client_ro *ro;
	int r;

	if (!c->chans)          /* a re-attach keeps them */
		c->chans = calloc(g->nr_shards, sizeof(*c->chans));
	c->mems = calloc(g->nr_shards, sizeof(*c->mems));
	c->bells = malloc(g->nr_shards * sizeof(*c->bells));
	if (!c->chans || !c->mems || !c->bells)
		return -ENOMEM;
	for (uint32_t s = 0; s < g->nr_shards; s++)
		c->bells[s] = -1;
	r = chime_seg_memfd("chime-client-rw", g->rw_size, &c->rw_fd, &c->rw);
	if (r < 0)
		return r;
	r = chime_seg_memfd("chime-client-ro", g->ro_size, &c->ro_fd, &c->ro);
	if (r < 0)
		return r;
	/*
	 * A doorbell per shard made for this client alone: whatever it does
	 * to it (drain it, saturate it, make it blocking) concerns only its
	 * own wake-ups, and the shard reads it through io_uring, which never
	 * blocks the thread.
	 */
	for (uint32_t s = 0; s < g->nr_shards; s++) {
		c->bells[s] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (c->bells[s] < 0)
			return -errno;
	}

	ro = c->ro.base;
	ro->nr_shards = g->nr_shards;
	ro->sq_size = g->sq_size;
	ro->cq_size = g->cq_size;
	ro->slot = c->slot;
	ro->chan_off = g->ro_chan_off;
	ro->cq_off = g->ro_cq_off;
	for (uint32_t s = 0; s < g->nr_shards; s++) {
		struct chan_mem *m = &c->mems[s];

		chan_mem_layout(m, c->rw.base, c->ro.base, g, s);     /* the socket: once the client owns it (hello_answer) */
		m->sq_base = c->sq_base;
		m->bell_fd = c->bells[s];
	}
	chime_seg_publish(&ro->hdr, CHIME_SEG_CLIENT_RO, g->ro_size);
	/*
	 * Sealed: a client's ftruncate cannot SIGBUS us. Not a byte of rw is
	 * written until the client has sealed it too (on_mapped()). ro goes to
	 * the client as a descriptor that can only read (not a
	 * F_SEAL_FUTURE_WRITE seal, which would keep conn_release() from
	 * punching its pages out).
	 */
	r = chime_seg_seal(c->rw_fd, CHIME_SEAL_SIZE);
	if (r < 0)
		return r;
	r = chime_seg_reopen_ro(c->ro_fd);
	if (r >= 0) {
		int ro_only = r;

		r = chime_seg_seal(c->ro_fd, CHIME_SEAL_FINAL);    /* through our descriptor: a read-only one may not */
		c->ro_wfd = c->ro_fd;                   /* kept for the punch (conn_release()) */
		c->ro_fd = ro_only;
	} else if (r == -EMFILE || r == -ENFILE) {
		return r;       /* out of descriptors, not of /proc: the client is refused (EUSERS) */
	} else {
		/* No /proc (or an LSM says no): the seal, and its pages stay until the client lets go. */
		if (log_ratelimit(&b->reopen_log, 3600))
			log_errno(LOG_WARNING, -r, "cannot reopen a client's ro segment read-only through "
				  "/proc/self/fd (is /proc mounted?): sealing it instead, so its pages are not "
				  "freed when the connection ends, only when the client lets go of them");
		r = chime_seg_seal(c->ro_fd, CHIME_SEAL_WRITES);
	}
	if (r < 0)
		return r;
	return c->want_touch ? touch_table(b, c) : 0;
}

/* The rw segment's header, once the client has sealed it (on_mapped()): its pages are the client's. */
static void rw_publish(struct broker *b, struct client *c)
{
	const struct chime_client_geom *g = &b->geom;
	struct chime_client_rw *rw = c->rw.base;

	rw->nr_shards = g->nr_shards;
	rw->sq_size = g->sq_size;
	rw->cq_size = g->cq_size;
	rw->chan_off = g->rw_chan_off;
	rw->sq_off = g->rw_sq_off;
	rw->claim_off = g->rw_claim_off;
	chime_seg_publish(&rw->hdr, CHIME_SEG_CLIENT_RW, g->rw_size);
}

static void post_all(struct broker *b, struct client *c, uint32_t op)
{
	/* M4: pending before the commands; the shards' acks count it down. */
	at_store(&c->ack.err, 0);
	at_store_rel(&c->ack.pending, b->o.nr_shards);
	if (!c->acking) {
		c->acking = true;
		b->acking[b->nr_acking++] = c->slot;
	}
	if (op == SHARD_CMD_ATTACH || op == SHARD_CMD_REATTACH) {
		c->quota_held = c->timer_quota;
		c->quota_order = ++b->quota_orders;
		/*
		 * The shards hold all of the user's connections to it from now
		 * on (chan_user.quota): their refusals are said with it, not with
		 * the one each came with (a review). O(clients_hi), as uid_full()
		 * at each admit.
		 */
		for (uint32_t i = 0; i < b->clients_hi; i++)
			if (b->clients[i].state != CL_FREE && b->clients[i].acct_uid == c->acct_uid)
				b->clients[i].user_quota = c->timer_quota;
		c->user_quota = c->timer_quota;
	}
	for (uint32_t s = 0; s < b->o.nr_shards; s++) {
		struct shard_cmd cmd = {
			.op = op,
			.slot = c->slot,
			.flags = (uint16_t)((op == SHARD_CMD_REATTACH && c->resume ? SHARD_CMD_F_RESUME : 0) |
					    (op == SHARD_CMD_PARK && b->stopping ? SHARD_CMD_F_HANDOVER : 0) |
					    (op == SHARD_CMD_ATTACH && c->session[0] ? SHARD_CMD_F_SESSION : 0)),
			.uid = c->acct_uid,
			.user_quota = shard_share(c->timer_quota, b->o.nr_shards),
			.generation = c->generation,
			.ch = &c->chans[s],
			.mem = c->mems ? &c->mems[s] : NULL,    /* a detached session has none */
			.ack = &c->ack,
		};

		shard_post(&b->shards[s], &cmd);
	}
}

void client_detach(struct broker *b, struct client *c, int refuse)
{
	if (c->session[0])
		restart_clear(b, c);
	c->refuse = refuse;
	c->state = CL_DETACHING;
	table_set(b, c, CHIME_CLIENT_DYING);
	if (refuse) {
		send_status(c->fd, refuse);
	} else if (c->fd >= 0) {
		/* Whatever is left of the connection goes now: the client sees EOF. */
		shutdown(c->fd, SHUT_RDWR);
	}
	post_all(b, c, SHARD_CMD_DETACH);
}

/*
 * A named session's process hung up (or never took its welcome): the shards
 * park its channels (chan_park); its timers stay, and so does its slot.
 */
void client_park(struct broker *b, struct client *c)
{
	c->state = CL_PARKING;
	if (c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR);
	post_all(b, c, SHARD_CMD_PARK);
}

/* Every shard parked it: the process's memory and fds go, the session stays. */
static void parked(struct broker *b, struct client *c)
{
	conn_release(b, c);
	c->state = CL_DETACHED;
	c->unadmitted = false;  /* its process was admitted (a reload since is not judged again) */
	c->linger_until_ns = now_ns() + (uint64_t)b->o.session_linger_s * 1000000000u;
	table_set(b, c, CHIME_CLIENT_DETACHED);
	if (c->drop_parked) {
		/*
		 * Dropped while it parked (handshake.c): reclaimed now. A broker
		 * stopping meanwhile leaves it out of the sessions file, and the
		 * next one frees its nodes as no session's.
		 */
		if (!b->stopping) {
			c->drop_parked = false;
			client_detach(b, c, 0);
		}
		return;
	}
	restart_put(b, c);
	if (b->stopping)
		log_msg(LOG_INFO, "session '%s' (uid %u, pid %d) parked for the next broker",
			c->session, (unsigned)c->cred.uid, (int)c->cred.pid);
	else if (log_budget_take(&b->conn_log, CONN_LOG_PER_S, CONN_LOG_WHAT))
		log_msg(LOG_INFO, "session '%s' (uid %u) detached: pid %d closed it or exited, timers kept for %u s",
			c->session, (unsigned)c->cred.uid, (int)c->cred.pid, b->o.session_linger_s);
	if (c->next_fd >= 0) {
		int fd = c->next_fd;

		if (b->stopping) {
			c->next_fd = -1;
			send_status(fd, -ECONNREFUSED);
			close_aside(b, fd);
			return;
		}
		if (!held_drained(b, c)) {
			/* The last connection left something unread: wait for it as a DETACHED one's does. */
			c->next_until_ns = now_ns() + HELD_WAIT_NS;
			return;
		}
		c->next_fd = -1;
		client_reattach(b, c, fd, &c->next_cred, c->next_resume, c->next_sq_base);
	}
}

/*
 * Writable segments sealed by their client (ARCHITECTURE.md): the
 * descriptors go out before anything is attached, and the channels are
 * attached once the client says it has mapped and sealed them
 * (on_mapped()). Until then nothing of ours reads or writes a page the
 * client could punch a hole in: a shard touching such a page waits in the
 * kernel for as long as the punch takes, which the client decides.
 */
static void offer_failed(struct broker *b, struct client *c, int status)
{
	c->offered = false;
	if (!c->reattaching) {
		client_detach(b, c, status);    /* nothing attached: each shard acknowledges at once */
		return;
	}
	if (status)
		send_status(c->fd, status);
	/*
	 * No shard re-attached it, so the last holder's carried grants are
	 * still there and its library may still resume: the holder and token
	 * go back (parked() writes them to the sessions file). Kept, the
	 * failed process's made that resume -ESTALE.
	 */
	c->holder_pid = c->last_holder_pid;
	c->holder_start = c->last_holder_start;
	c->token = c->last_token;
	parked(b, c);                           /* the session as it was: detached, its timers kept */
}

/* Given up before the client answered (its time ran out, or the broker stops). */
static void offer_withdraw(struct broker *b, struct client *c, int status)
{
	struct io_uring_sqe *sqe;

	if (b->ring_ok && (sqe = get_sqe(b))) {
		io_uring_prep_poll_remove(sqe, hup_ud(c, HUP_MAPPED));
		io_uring_sqe_set_data64(sqe, UD_QUIET);
	}
	offer_failed(b, c, status);
}

static void offer(struct broker *b, struct client *c, bool reattach)
{
	struct io_uring_sqe *sqe = NULL;
	int r = send_offer(b, c);

	/* The read-only descriptor was only for the client; the others wait for the punch. */
	close(c->ro_fd);
	c->ro_fd = -1;
	c->reattaching = reattach;
	if (r == 0 && !(sqe = get_sqe(b)))
		r = -EBUSY;
	if (r < 0) {
		log_errno(LOG_DEBUG, r, "client %u (pid %d) left during the handshake", c->slot, (int)c->cred.pid);
		offer_failed(b, c, 0);
		return;
	}
	io_uring_prep_poll_add(sqe, c->fd, POLLIN | POLLRDHUP);
	io_uring_sqe_set_data64(sqe, hup_ud(c, HUP_MAPPED));
	c->offered = true;
}

/*
 * The client's struct chime_mapped, or its hang-up (res: the poll's). Its
 * seals and pages are checked through our descriptors, with calls that
 * take no lock a punch holds: a client punching meanwhile cannot hold the
 * control thread up.
 */
/*
 * The answer; a descriptor sent with it is not the protocol (below: the
 * answer is refused as malformed).
 */
static ssize_t recv_mapped(struct broker *b, int fd, struct chime_mapped *m)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 253)];       /* SCM_MAX_FD: none left for the kernel to close */
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n >= 0 && mh.msg_controllen) {
		close_sent_fds(b, &mh);
		m->magic = 0;
	}
	return n;
}

static void on_mapped(struct broker *b, struct client *c, int res)
{
	struct chime_mapped m;
	ssize_t n = -1;
	int r;

	c->offered = false;
	if (res > 0 && (res & POLLIN))
		n = recv_mapped(b, c->fd, &m);
	if (n <= 0) {
		log_msg(LOG_DEBUG, "client %u (pid %d) left during the handshake", c->slot, (int)c->cred.pid);
		offer_failed(b, c, 0);
		return;
	}
	if (n != (ssize_t)sizeof(m) || m.magic != CHIME_MAPPED_MAGIC) {
		refuse_log(b, &c->cred, "a malformed answer to its welcome (struct chime_mapped)");
		offer_failed(b, c, -EPROTO);
		return;
	}
	r = chime_seg_client_sealed(c->rw_fd, c->rw.size);
	if (r == 0 && c->touch_fd >= 0)
		r = chime_seg_client_sealed(c->touch_fd, 0);
	if (r < 0 && r != -EPERM && r != -ENODATA) {
		/* Our own fcntl() or fstat() failed: not the client's doing, nor said to be. */
		log_errno(LOG_ERR, -r, "cannot check the seals of client %u's segments (pid %d)", c->slot,
			  (int)c->cred.pid);
		offer_failed(b, c, -ENOMEM);
		return;
	}
	if (r < 0) {
		refuse_log(b, &c->cred, r == -ENODATA ? "its rw segment sealed before every page of it was faulted in"
			   : "its segments not sealed against writes (F_SEAL_FUTURE_WRITE)");
		offer_failed(b, c, -EPROTO);
		return;
	}
	if (b->stopping && c->session[0]) {
		offer_failed(b, c, -ECONNREFUSED);      /* as every open of a session during a stop */
		return;
	}
	/*
	 * Every page of rw in our page tables before a shard touches one. A
	 * page only the client maps is its own to page out (MADV_PAGEOUT, on
	 * a host with swap), and a shard's first access of it would wait for
	 * the disk; mapped here too, the kernel passes it by. Its pages are
	 * the client's, allocated already (checked above): nothing is
	 * allocated, and a page it paged out before answering comes back on
	 * this thread, not a shard's.
	 */
	(void)chime_seg_populate(c->rw.base, c->rw.size);
	rw_publish(b, c);
	/*
	 * It resumes, or its attach frees them: only now. An attach that
	 * failed before this (offer_failed()) left the last holder's grants
	 * carried, and they stay watched for its exit.
	 */
	if (c->reattaching) {
		holder_unwatch(c);
		c->holder_lost = false;
	}
	post_all(b, c, c->reattaching ? SHARD_CMD_REATTACH : SHARD_CMD_ATTACH);
}

/*
 * Every shard has answered some client's request: find which, among the
 * slots waiting for answers (O(those), not O(--max-clients)). What is
 * handled here may post again (a failed attach detaches): that slot goes
 * back on the list, at its end.
 */
static void on_notify(struct broker *b)
{
	for (uint32_t i = 0; i < b->nr_acking;) {
		struct client *c = &b->clients[b->acking[i]];
		int r;

		/* M5: pairs with M3 in the shards' ack(). */
		if (at_load_acq(&c->ack.pending) != 0) {
			i++;
			continue;
		}
		/* Off the list (the last one takes its place, looked at next) before anything posts again. */
		b->acking[i] = b->acking[--b->nr_acking];
		c->acking = false;
		if (c->state != CL_ATTACHING && c->state != CL_DETACHING && c->state != CL_PARKING)
			continue;
		if (c->state == CL_ATTACHING) {
			r = at_load(&c->ack.err);
			if (r < 0) {
				log_errno(LOG_WARNING, r, "refusing pid %d: no room for its %u grants per shard (see --capacity)",
					  (int)c->cred.pid, b->o.sq_size);
				client_detach(b, c, -ENOMEM);
				continue;
			}
			/*
			 * Stopping: refused, as every open during a stop is. A
			 * session this open created holds nothing yet and goes
			 * (handed over, it lingered empty in the next broker);
			 * another goes to the next broker parked.
			 */
			if (b->stopping && c->session[0] && c->created) {
				client_detach(b, c, -ECONNREFUSED);
				continue;
			}
			if (b->stopping && c->session[0])
				send_status(c->fd, -ECONNREFUSED);
			else
				/*
				 * Before the ready: its chime_open() returns on it, and
				 * a tool run next must list it (set after, 49-88 opens
				 * in 300 returned before the table showed them).
				 */
				table_set(b, c, CHIME_CLIENT_ACTIVE);
			r = b->stopping && c->session[0] ? -ESHUTDOWN : send_ready(b, c);
			if (r < 0) {
				log_errno(LOG_DEBUG, r, "client %u (pid %d) left during the handshake",
					  c->slot, (int)c->cred.pid);
				/*
				 * A session this open created holds nothing and goes:
				 * parked, it lingered empty under its user's name and
				 * quota for --session-linger. One that existed keeps
				 * its timers.
				 */
				if (c->session[0] && !c->created)
					client_park(b, c);
				else
					client_detach(b, c, 0);
				continue;
			}
			c->state = CL_ACTIVE;
			/* A session's record says so already: client_admit(), client_reattach(). */
			if (!arm_hup(b, c)) {
				/* Exited between its hello and now: as if the exit poll had said so. */
				if (c->session[0])
					client_park(b, c);
				else
					client_detach(b, c, 0);
				continue;
			}
			if (!log_budget_take(&b->conn_log, CONN_LOG_PER_S, CONN_LOG_WHAT))
				continue;
			if (c->session[0])
				log_msg(LOG_INFO, "client %u connected: pid %d uid %u '%s', session '%s'",
					c->slot, (int)c->cred.pid, (unsigned)c->cred.uid, c->comm, c->session);
			else
				log_msg(LOG_INFO, "client %u connected: pid %d uid %u '%s'",
					c->slot, (int)c->cred.pid, (unsigned)c->cred.uid, c->comm);
			continue;
		}
		if (c->state == CL_PARKING) {
			parked(b, c);
			continue;
		}
		/* DETACHING, and every shard has reclaimed its nodes. */
		if (c->refuse || !log_budget_take(&b->conn_log, CONN_LOG_PER_S, CONN_LOG_WHAT))
			;
		else if (c->session[0] && c->cred.pid == 0)     /* restored, and no process of ours had it */
			log_msg(LOG_INFO, "client %u freed: session '%s' (taken over from the previous broker)",
				c->slot, c->session);
		else if (c->session[0])
			log_msg(LOG_INFO, "client %u freed: session '%s', last pid %d '%s'", c->slot, c->session,
				(int)c->cred.pid, c->comm);
		else
			log_msg(LOG_INFO, "client %u disconnected: pid %d '%s'", c->slot, (int)c->cred.pid, c->comm);
		client_release(b, c);
		b->clients_now--;
		/* A HELD slot shows as still going (DYING) until its socket drains: tools see the slot taken. */
		table_set(b, c, c->state == CL_HELD ? CHIME_CLIENT_DYING : CHIME_CLIENT_EMPTY);
	}
}

/*
 * Out of descriptors, accept fails and leaves the connection queued: its
 * chime_open() waited 10 s for ETIMEDOUT, and nothing retried the accept
 * once descriptors were back. Refuse what is queued at once (EUSERS), with
 * the descriptor kept spare for it, and say whether the queue is empty
 * (the accept can be armed again without spinning on the same failure).
 * REFUSE_BATCH at most a call, then the same is said: clients connecting
 * as fast as they are refused would keep the control thread here, its
 * heartbeat with it; the accept armed again comes back through the ring.
 */
#define REFUSE_BATCH 64u
#define REFUSE_DRAIN 8u         /* messages read from each before its close */

static bool refuse_queued(struct broker *b, int why)
{
	struct pollfd p = { .fd = b->listen_fd, .events = POLLIN };
	unsigned n = 0;
	int fd;

	if (b->spare_fd < 0 && (b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
		return false;
	close(b->spare_fd);
	/* The listening socket blocks: accept only what poll says is there. */
	while (n < REFUSE_BATCH && poll(&p, 1, 0) == 1 && (p.revents & POLLIN) &&
	       (fd = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
		struct chime_hello hello;
		union {
			char buf[CMSG_SPACE(sizeof(int) * 253)];
			struct cmsghdr align;
		} u;
		struct iovec iov = { .iov_base = &hello, .iov_len = sizeof(hello) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		unsigned m = 0;

		send_status(fd, -EUSERS);
		/*
		 * A hello left unread would make the close a reset, which the
		 * client reads first. A few messages at most: a peer that sent
		 * as fast as they were read would keep this loop, and the
		 * control thread, going.
		 */
		do {
			mh.msg_control = u.buf;
			mh.msg_controllen = sizeof(u.buf);
		} while (m++ < REFUSE_DRAIN && recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) > 0 &&
			 (close_sent_fds(b, &mh), true));
		close_aside(b, fd);
		n++;
	}
	b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (n && log_ratelimit(&b->refuse_log, 10))
		log_msg(LOG_WARNING, "refused %u connection%s at once: %s (RLIMIT_NOFILE; chimed --max-clients)",
			n, n == 1 ? "" : "s", strerror(-why));
	return b->spare_fd >= 0 && (n == REFUSE_BATCH || poll(&p, 1, 0) == 0);
}

/* "TERM" for SIGTERM: an operator greps for the name kill(1) and systemd use, not strsignal()'s text. */
static const char *sig_name(int sig)
{
	const char *n = sigabbrev_np(sig);

	return n ? n : "?";
}

/* " from pid N" for a signal's sender; none from the kernel (a terminal's ^C, pid 0). */
static const char *sig_sender(uint32_t pid, char buf[32])
{
	if (!pid)
		return "";
	snprintf(buf, 32, " from pid %u", (unsigned)pid);
	return buf;
}

/*
 * SIGUSR2: the new broker reads its options and policy file again and
 * exits on what it refuses (a user deleted since, a file edited badly),
 * leaving none. Checked first: a restart that would fail is not begun.
 */
static bool restart_refused(struct broker *b)
{
	char err[512], msg[400], from[32];
	int r = policy_check(&b->o.policy, err, sizeof(err), NULL);
	gid_t gid;

	/* --socket-group and --stats-group too: a group deleted since is the new broker's usage error */
	if (r == 0 && b->o.socket_group && (r = policy_group(b->o.socket_group, &gid, msg, sizeof(msg))) < 0)
		snprintf(err, sizeof(err), "--socket-group: %s", msg);
	if (r == 0 && b->o.stats_group && (r = policy_group(b->o.stats_group, &gid, msg, sizeof(msg))) < 0)
		snprintf(err, sizeof(err), "--stats-group: %s", msg);

	/*
	 * This broker's own want of descriptors or memory (one at its
	 * RLIMIT_NOFILE with every client's segments open) is not the new
	 * broker's: it starts with none of them open. Restarted, as before.
	 */
	if (r == -EMFILE || r == -ENFILE || r == -ENOMEM) {
		log_msg(LOG_WARNING, "SIGUSR2 received%s: the policy could not be read again to check it (%s): "
			"restarting all the same", sig_sender(b->sig_buf.ssi_pid, from), err);
		return false;
	}
	if (r < 0)
		log_msg(LOG_ERR, "SIGUSR2 received%s: not restarting, since the new broker would not start: %s "
			"(still running, sessions kept: fix it, then restart again; chimectl reload checks the "
			"policy)", sig_sender(b->sig_buf.ssi_pid, from), err);
	return r < 0;
}

/* ---- the wall clock (ARCHITECTURE.md, "Wall-clock timers") ---- */

/* Steps of the wall clock after the first: one line per this many seconds (wall_step_log()). */
#define WALL_LOG_S 60u

/*
 * Watch for steps of the wall clock (clock_set_watch_arm(): its read
 * completes with -ECANCELED when the clock is set). A failure, or a wall
 * clock past 2100 (the timer expired: not armed again, or it would expire
 * at once, and again), leaves the heartbeat's comparison (wall_check()) to
 * find steps, a beat later.
 */
static void wall_watch(struct broker *b)
{
	if (clock_set_watch_arm(b->wall_fd) < 0)
		return;
	arm_read(b, b->wall_fd, &b->wall_buf, sizeof(b->wall_buf), UD_WALL);
}

/*
 * A step's line: the first at once, the next ones at most once per
 * WALL_LOG_S, as a count and a sum (some VMs' agents set the clock ten
 * times a second: a line each was 864,000 a day). Called at every beat
 * too (moved 0), to say what was held back once the minute is up, and at
 * the stop (`now`), so that no step goes unsaid.
 */
static void wall_step_log(struct broker *b, int64_t moved, bool now)
{
	if (moved) {
		b->wall_steps_held++;
		b->wall_moved_held += moved;
	}
	if (!b->wall_steps_held || !(log_ratelimit(&b->wall_log, WALL_LOG_S) || now))
		return;
	if (b->wall_steps_held == 1 && moved)
		log_msg(LOG_INFO, "the wall clock was set, %+.6f s: wall-clock timers follow it",
			(double)b->wall_moved_held / 1e9);
	else if (b->wall_steps_held == 1)
		log_msg(LOG_INFO, "the wall clock was set once more since the last such line, %+.6f s: "
			"wall-clock timers follow it (a line a minute at most)", (double)b->wall_moved_held / 1e9);
	else
		log_msg(LOG_INFO, "the wall clock was set %u more times since the last such line, %+.6f s in "
			"all: wall-clock timers follow it (a line a minute at most)", b->wall_steps_held,
			(double)b->wall_moved_held / 1e9);
	b->wall_steps_held = 0;
	b->wall_moved_held = 0;
}

/*
 * Why wall_check() looks: the heartbeat's look (a slew past the bounds
 * below), a set the watch reported, or a look after one may have gone
 * unreported (start-up, before the watch was armed).
 */
enum wall_look { WALL_BEAT, WALL_SET, WALL_MAYBE_SET };

/*
 * At each heartbeat, and at a step: if the wall clock's offset from the
 * monotonic one moved by more than WALL_FOLLOW_NS ahead or
 * WALL_FOLLOW_BACK_NS behind since the shards last followed it (a slew),
 * or stepped (the timerfd, the test hook), the shards follow the new one
 * (wall.h): published, and the shards that may hold wall-clock timers
 * woken for it. The others follow at their next pass, before they apply
 * a record: nothing of theirs moves, so a step costs them no wake-up.
 */
static void wall_check(struct broker *b, enum wall_look why)
{
	bool set = why == WALL_SET || wall_hook_read(), stepped = set || why == WALL_MAYBE_SET;
	int64_t off, moved;

	off = wall_offset_now();
	moved = off - wall_published();
	if (moved == 0 || (!stepped && moved <= WALL_FOLLOW_NS && moved >= -WALL_FOLLOW_BACK_NS)) {
		wall_step_log(b, 0, false);
		return;
	}
	/*
	 * A look for a set that may have gone unreported follows any move,
	 * but says only one past what two reads of the offset differ by
	 * anyway: it said "set, +0.000000 s" at every start.
	 */
	set |= why == WALL_MAYBE_SET && (moved > WALL_PAIR_NS || moved < -(int64_t)WALL_PAIR_NS);
	wall_step_log(b, set ? moved : 0, false);
	wall_publish(off);
	at_store(&b->pub->wall_off, off);
	at_store(&b->ctl->wall_off, off);
	/* W0: the new offset, full barrier, then wall_any; pairs with W1 before a shard's sleep. */
	at_fence();
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		if (at_load(&b->shards[i].wall_any))
			shard_poke(&b->shards[i]);
}

void broker_reload(struct broker *b, struct chime_query_reload *out)
{
	log_reopen();
	policy_reload(b, out);
	wall_check(b, WALL_BEAT);
}

static int on_cqe(struct broker *b, struct io_uring_cqe *cqe)
{
	uint64_t ud = cqe->user_data;
	int res = cqe->res;

	switch (ud & 7u) {
	case TAG_FIXED:
		if (ud == UD_ACCEPT) {
			struct conn *cn;

			b->accept_armed = false;
			if (res < 0) {
				/* Out of descriptors or memory: refuse what waits, retry at the heartbeat. */
				if ((res == -EMFILE || res == -ENFILE) && refuse_queued(b, res))
					arm_accept(b);
				else if (res == -EMFILE || res == -ENFILE || res == -ENOMEM) {
					if (log_ratelimit(&b->refuse_log, 10))
						log_errno(LOG_WARNING, res, "accept on '%s' (retried every heartbeat)",
							  b->o.socket_path);
				}
				else if (res == -EINTR || res == -ECONNABORTED)
					arm_accept(b);
				else {
					log_errno(LOG_WARNING, res, "accept on '%s'", b->o.socket_path);
					arm_accept(b);
				}
				return 0;
			}
			cn = calloc(1, sizeof(*cn));
			if (!cn) {
				close_aside(b, res);
				arm_accept(b);
				return 0;
			}
			cn->fd = res;
			if (!handshake_allowed(b, cn)) {
				close_aside(b, cn->fd);
				free(cn);
				arm_accept(b);
				return 0;
			}
			cn->next = b->conns;
			if (cn->next)
				cn->next->prev = cn;
			b->conns = cn;
			b->nr_handshakes++;
			hello_arm(b, cn);
			arm_accept(b);
		} else if (ud == UD_SIGNAL) {
			char from[32];

			if (res == (int)sizeof(b->sig_buf) && b->sig_buf.ssi_signo == SIGHUP) {
				broker_reload(b, NULL);        /* never a stop */
			} else if (res == (int)sizeof(b->sig_buf) && b->sig_buf.ssi_signo == SIGUSR2 && !b->stopping &&
				   restart_refused(b)) {
				/* logged: it keeps running, its sessions attached */
			} else if (res == (int)sizeof(b->sig_buf) && b->sig_buf.ssi_signo == SIGUSR2 && !b->stopping) {
				/* chimectl restart: stop as for SIGTERM, then main() executes chimed again. */
				log_msg(LOG_NOTICE, "SIGUSR2 received from pid %u: restarting; sessions are handed over",
					(unsigned)b->sig_buf.ssi_pid);
				b->restart = true;
				arm_read(b, b->sig_fd, &b->sig_buf, sizeof(b->sig_buf), UD_SIGNAL);
				return 1;
			} else if (res == (int)sizeof(b->sig_buf) && b->restart && b->sig_buf.ssi_signo == SIGUSR2) {
				/* A second chimectl restart (a retry): not a second stop signal, which cuts the park short. */
				log_msg(LOG_NOTICE, "SIGUSR2 received%s while restarting already: the restart goes on",
					sig_sender(b->sig_buf.ssi_pid, from));
			} else if (res == (int)sizeof(b->sig_buf) && b->restart) {
				/* A stop asked for while a restart parks (systemctl stop): a stop, not a restart. */
				log_msg(LOG_NOTICE, "SIG%s received%s while restarting: stopping instead",
					sig_name((int)b->sig_buf.ssi_signo), sig_sender(b->sig_buf.ssi_pid, from));
				b->restart = false;
				notify_stopping();
				arm_read(b, b->sig_fd, &b->sig_buf, sizeof(b->sig_buf), UD_SIGNAL);
				return 1;
			} else if (res == (int)sizeof(b->sig_buf)) {
				/* Who stopped it is the first question. */
				log_msg(LOG_NOTICE, "SIG%s received%s: stopping",
					sig_name((int)b->sig_buf.ssi_signo), sig_sender(b->sig_buf.ssi_pid, from));
				arm_read(b, b->sig_fd, &b->sig_buf, sizeof(b->sig_buf), UD_SIGNAL);
				return 1;
			}
			arm_read(b, b->sig_fd, &b->sig_buf, sizeof(b->sig_buf), UD_SIGNAL);
		} else if (ud == UD_NOTIFY) {
			on_notify(b);
			arm_read(b, b->notify_fd, &b->notify_buf, sizeof(b->notify_buf), UD_NOTIFY);
		} else if (ud == UD_DISCARD) {
			b->discard_polled = false;      /* the loop's next step reads the answers */
		} else if (ud == UD_WALL) {
			/*
			 * Armed again before the offset is read: a set between
			 * the two is then in the offset, and one after cancels
			 * the new watch. The other way round, a set right after
			 * the publish (a test setting the clock as soon as it
			 * saw the last one followed) was missed until the next
			 * step: under 1 ms, no heartbeat follows it.
			 */
			if (res <= 0)
				wall_watch(b);
			wall_check(b, res == -ECANCELED ? WALL_SET : WALL_BEAT);
		}
		return 0;
	case TAG_HELLO:
		hello_dispatch(b, (struct conn *)(uintptr_t)(ud & ~(uint64_t)7), res);
		return 0;
	case TAG_HTIMER: {
		struct conn *cn = (struct conn *)(uintptr_t)(ud & ~(uint64_t)7);

		if (res == -ETIME)
			log_msg(LOG_DEBUG, "closing a connection silent for %d s", HELLO_TIMEOUT_S);
		conn_put(b, cn);
		return 0;
	}
	case TAG_HUP: {
		uint32_t slot = (uint32_t)(ud >> 3) & HUP_SLOT;
		bool exited = (ud & HUP_EXIT) != 0;
		struct client *c;

		if (slot >= b->o.max_clients)
			return 0;
		c = &b->clients[slot];
		if ((ud & HUP_MAPPED) && c->state == CL_ATTACHING && c->offered &&
		    (uint32_t)(ud >> 32) == c->hup_seq) {
			uid_t uid = c->acct_uid;

			sends_judge(b, (uid_t)-1);      /* what came before is not this client's */
			on_mapped(b, c, res);
			sends_judge(b, uid);
			return 0;
		}
		if (c->state != CL_ACTIVE || (ud & HUP_MAPPED) || (uint32_t)(ud >> 32) != c->hup_seq)
			return 0;
		if (exited && !(res > 0 && (res & POLLIN))) {
			/* Not an exit: the socket's hang-up still ends the client. */
			if (res != -ECANCELED)
				log_errno(LOG_WARNING, res < 0 ? res : -EIO, "exit poll on client %u (pid %d)", slot,
					  (int)c->cred.pid);
			return 0;
		}
		if (exited) {
			log_msg(LOG_DEBUG, "client %u: pid %d exited", slot, (int)c->cred.pid);
		} else if (res < 0 && res != -ECANCELED) {
			log_errno(LOG_WARNING, res, "poll on client %u", slot);
		} else if (res >= 0 && !(res & (POLLRDHUP | POLLHUP | POLLERR))) {
			/* Not a hang-up, which is all this poll asks for: said, and the client ends anyway. */
			log_msg(LOG_DEBUG, "client %u: its hang-up poll returned %#x, closing", slot, (unsigned)res);
		}
		if (c->session[0])
			client_park(b, c);
		else
			client_detach(b, c, 0);
		return 0;
	}
	}
	return 0;
}

/*
 * Limits that bit since the last report, at most once per LIMITS_REPORT_NS:
 * refused arms per client and slab storage the filesystem would not give.
 * The shards only count (they never log); this reads their published
 * counters, so a flood of refusals costs one line per client per period.
 */
#define LIMITS_REPORT_NS (UINT64_C(10) * 1000000000u)

static void limits_report(struct broker *b, uint64_t now)
{
	const char *base = (const char *)b->ctl;
	const struct chime_shard_ctl *sc = (const struct chime_shard_ctl *)(base + b->ctl->shards_off);

	if (now - b->last_report_ns < LIMITS_REPORT_NS)
		return;
	b->last_report_ns = now;
	for (uint32_t i = 0; i < b->o.nr_shards && b->reserve_failed_logged; i++) {
		uint64_t n = at_load(&sc[i].stats.reserve_failed);

		if (n != b->reserve_failed_logged[i])
			log_msg(LOG_WARNING, "shard %u: the filesystem of '%s' has no room for more timers "
				"(%llu reservations failed so far): arms get ENOMEM until it has",
				i, b->o.socket_path, (unsigned long long)n);
		b->reserve_failed_logged[i] = n;
	}
	for (uint32_t slot = 0; slot < b->clients_hi; slot++)
		if (b->clients[slot].state == CL_ACTIVE)
			refusals_log(b, &b->clients[slot], false);
}

/*
 * Once a heartbeat, one pass over the client table (cold by then: one pass,
 * not one per purpose, or per shard):
 * - a detached session nobody came back for within --session-linger is
 *   reclaimed, as a hang-up is (not by a stopping broker: it hands the
 *   session over, and the linger goes on in the next one);
 * - a record that rang no doorbell (it could wait for the shard's planned
 *   wake-up, cl_doorbell_by()) waits at most a heartbeat more: a sleeping
 *   shard with a published record at the head of a client's ring is rung,
 *   on its private doorbell. So resets, cancels and far arms are applied
 *   (and counted, and their nodes freed) within about 100 ms (about 500
 *   ms once the broker is at rest, IDLE_BEAT_NS) even when the
 *   shard has nothing due for an hour, and a shard with nothing published
 *   is not woken. The slot is the client's to scribble on: a hint only,
 *   which at worst wakes the shard once a heartbeat, less than a client
 *   ringing its own doorbell can;
 * - a session's process took events a sleeping shard has not seen taken
 *   (its consumer head is past the channel's head_watch, chan.h): the shard
 *   is rung the same way, so that within about 100 ms its file says so
 *   and a crash that takes the process too does not bring them back. At
 *   most a wake-up per heartbeat and shard, after a session took events.
 * True if it found nothing to do: no shard rung, no client coming, going
 * or held, no session's process with events it has not been seen to take
 * (the slow beat of a broker at rest, IDLE_BEAT_NS).
 */
static bool taken_unseen(const struct client *c, uint32_t s)
{
	/* B1: pairs with head_watch_publish() in chan.c; here both words are hints, any value is safe. */
	return c->session[0] && at_load(&c->mems[s].rw->cq_head) > at_load(&c->chans[s].head_watch);
}

/*
 * A session's process has events in hand that a shard has not seen taken
 * (or not yet taken), and has taken some within WATCH_WAIT_NS: a shard's
 * watch moves each time it sees a take. One that takes none for that
 * long (stopped, draining on a schedule of its own, or hostile: an event
 * never taken kept every user's broker from resting, for good) lets the
 * broker rest: its next take is then seen at the next idle beat, ~450 ms,
 * where taken_unseen() rings the shard and the 90 ms beat is back.
 */
static bool takes_awake(const struct broker *b, struct client *c, uint64_t now)
{
	uint64_t fp = 0;
	bool watched = false;

	for (uint32_t s = 0; s < b->o.nr_shards; s++) {
		uint64_t w = at_load(&c->chans[s].head_watch);  /* B1; a stale "none" is ruled out by REST1/2 */

		watched |= w != UINT64_MAX;
		fp = fp * 0x100000001b3u + w;
	}
	if (!watched) {
		c->watch_since_ns = 0;
		return false;
	}
	if (!c->watch_since_ns || fp != c->watch_fp) {
		c->watch_since_ns = now;
		c->watch_fp = fp;
	}
	return now - c->watch_since_ns < WATCH_WAIT_NS;
}

/*
 * A resumed process's records wait for its word (resume_set; chan.c,
 * word_wait): ringing the shard for them wakes it for nothing, at every
 * beat, for as long as a process publishes a record and never the word.
 * libchime stores the word before its first record.
 */
static bool word_awaited(const struct client *c, const struct chan_mem *m)
{
	return c->resume && at_load(&m->rw->resume_set) != 1;
}

bool pidfd_exited(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

void holder_unwatch(struct client *c)
{
	if (c->holder_pidfd >= 0)
		close(c->holder_pidfd);
	c->holder_pidfd = -1;
	c->holder_watched = false;
}

/*
 * A session restored with the process that was attached when the last
 * broker went keeps that process's unused grants (carried, chan.c) for
 * the ARMs its library re-submits when it resumes. Had it exited first,
 * nothing freed them before the linger ran out: sq-size nodes per shard
 * counted against its user's quota for an hour, past restarts (an
 * accounting audit). Its exit (looked for once a beat, only for such
 * sessions, until they are attached or gone) frees them now, and its
 * resume, should a process of that pid try one, is refused.
 *
 * The holder is its pid and its start time: a pid reused meanwhile is
 * another start time, and gone too (a kill(pid, 0), which the newcomer
 * passed, kept them to the linger before). The first look reads the start
 * time and keeps a pidfd of the process it names, opened before the read
 * so that it is that process's; each look after is a poll of that pidfd,
 * which no reuse can fool (12 us a /proc read here, against 1.5 for a
 * kill). A holder of unknown start time (a sessions file of a broker
 * before it), or one this broker may not read (/proc's hidepid), or no
 * pidfd to be had: gone once its pid is, as before.
 */
static bool holder_gone(struct client *c)
{
	uint64_t start;
	int fd;

	if (c->holder_pidfd >= 0)
		return pidfd_exited(c->holder_pidfd);
	fd = pidfd_open(c->holder_pid, 0);
	if (fd < 0 && errno == ESRCH)
		return true;
	start = c->holder_start ? chime_proc_start(c->holder_pid) : 0;
	if (start && start != c->holder_start) {
		if (fd >= 0)
			close(fd);
		return true;
	}
	if (fd >= 0 && (start || !c->holder_start)) {
		c->holder_pidfd = fd;
		return pidfd_exited(fd);
	}
	if (fd >= 0)
		close(fd);
	return kill(c->holder_pid, 0) < 0 && errno == ESRCH;
}

static void holder_watch(struct broker *b, struct client *c)
{
	if (!holder_gone(c))
		return;
	for (uint32_t s = 0; c->chans && s < b->o.nr_shards; s++) {
		struct shard_cmd cmd = {
			.op = SHARD_CMD_FORGET,
			.slot = c->slot,
			.generation = c->generation,
			.ch = &c->chans[s],
		};

		shard_post(&b->shards[s], &cmd);
	}
	log_msg(LOG_DEBUG, "session '%s': pid %d exited before it resumed: the ids it held for its next arms are freed",
		c->session, (int)c->holder_pid);
	holder_unwatch(c);
	c->holder_lost = true;
}

static bool clients_beat(struct broker *b, uint64_t now)
{
	bool asleep[CHIME_MAX_SHARDS], quiet = true;
	uint32_t nr_asleep = 0, hi = 0, unadmitted = 0;

	for (uint32_t s = 0; s < b->o.nr_shards; s++)
		nr_asleep += asleep[s] = at_load(b->shards[s].sleeping) != 0;
	for (uint32_t i = 0; i < b->clients_hi; i++) {
		struct client *c = &b->clients[i];

		if (c->state != CL_FREE)
			hi = i + 1;     /* a slot freed later in this pass keeps it: an upper bound */
		/* counted before a reclaim below: the next beat counts it gone */
		unadmitted += c->state == CL_DETACHED && c->unadmitted;
		/*
		 * Coming, going or waiting for the beat: not a broker at rest
		 * (IDLE_BEAT_NS). Nor is one whose session's process has events
		 * to take: what it takes must be seen taken within a 90 ms beat
		 * (taken_unseen() below), or a crash delivers more of it again;
		 * for a second after its last take (takes_awake()). A shard
		 * that gives it events while the broker rests wakes us
		 * (rest_end(), shard.c). A HELD slot, whose peer keeps a welcome
		 * unread for as long as it likes, only for HELD_WAIT_NS: past
		 * that, one such socket kept the broker from resting for good.
		 */
		if (c->state != CL_FREE && c->state != CL_ACTIVE && (c->state != CL_DETACHED || c->next_fd >= 0) &&
		    (c->state != CL_HELD || now - c->held_since_ns < HELD_WAIT_NS))
			quiet = false;
		if (c->state == CL_ACTIVE && c->session[0] && takes_awake(b, c, now))
			quiet = false;
		if (c->state == CL_ATTACHING && c->offered &&
		    now - c->connected_ns >= (uint64_t)HELLO_TIMEOUT_S * 1000000000u) {
			log_msg(LOG_DEBUG, "client %u (pid %d): no answer to its welcome in %d s, closing",
				c->slot, (int)c->cred.pid, HELLO_TIMEOUT_S);
			offer_withdraw(b, c, -ETIMEDOUT);
			continue;
		}
		if (held_free_if_drained(b, c))
			continue;
		if (c->state == CL_DETACHED && c->next_fd >= 0) {
			/* A process waits to re-attach until the last connection is drained (handshake.c). */
			int fd = c->next_fd;

			if (b->stopping) {
				c->next_fd = -1;
				send_status(fd, -ECONNREFUSED);
				close_aside(b, fd);
			} else if (held_drained(b, c)) {
				c->next_fd = -1;
				client_reattach(b, c, fd, &c->next_cred, c->next_resume, c->next_sq_base);
			} else if (now >= c->next_until_ns) {
				c->next_fd = -1;
				refuse_log(b, &c->next_cred, "the session's last connection left a message unread, "
					   "its socket still open");
				send_status(fd, -EBUSY);
				close_aside(b, fd);
			}
			continue;
		}
		if (c->state == CL_DETACHED && c->holder_watched && !b->stopping)
			holder_watch(b, c);
		/* A stop hands detached sessions over too: their lingers go on in the next broker. */
		if (c->state == CL_DETACHED && !b->stopping && now >= c->linger_until_ns) {
			if (log_budget_take(&b->conn_log, CONN_LOG_PER_S, CONN_LOG_WHAT))
				log_msg(LOG_INFO, "session '%s' (uid %u) reclaimed: nobody re-attached within %u s%s",
					c->session, (unsigned)c->cred.uid, b->o.session_linger_s,
					c->cred.pid == 0 ? " (at least 3 s after the restore)" : "");
			client_detach(b, c, 0);
			continue;
		}
		if (c->state != CL_ACTIVE || !nr_asleep)
			continue;
		for (uint32_t s = 0; s < b->o.nr_shards; s++) {
			const struct chan_mem *m = &c->mems[s];
			uint64_t head;

			if (!asleep[s])
				continue;
			/* V2: what the shard has applied; pairs with V1 in chan_drain(). */
			head = at_load_acq(&m->ro->sq_head);
			if ((at_load(&m->sq_slots[head & (m->sq_size - 1)].seq) == head + 1 && !word_awaited(c, m)) ||
			    taken_unseen(c, s)) {
				(void)eventfd_write(b->shards[s].doorbell, 1);
				b->shards[s].rung = true;
				asleep[s] = false;      /* rung: once is enough */
				nr_asleep--;
				quiet = false;
			}
		}
	}
	b->clients_hi = hi;
	/* as they reattach (a policy put right), are reclaimed or dropped, or a reload judges them */
	if (unadmitted != b->sessions_unadmitted) {
		b->sessions_unadmitted = unadmitted;
		at_store(&b->ctl->sessions_unadmitted, unadmitted);
	}
	return quiet;
}

/*
 * A stop hands every attached session to the next broker: parked, so the
 * claim words settle what is in their completion rings (exactly once) and
 * what their processes published is applied. Bounded: a second signal, or
 * STOP_PARK_NS, and the broker stops with what is parked by then: a park
 * still in its steps settles what its process took first, when its shard
 * stops (chan_park_cut()); the rest is restored as after a crash.
 */
#define STOP_PARK_NS (UINT64_C(5) * 1000000000u)

static void stop_begin(struct broker *b)
{
	b->stopping = true;
	/* S-STOP: before any park reads a ring; pairs with the library's load after its publish. */
	at_store_sc(&b->pub->state, CHIME_BROKER_STOPPING);
	at_fence();
	if (b->restart)
		notify_reloading("restarting: handing sessions over");
	else
		notify_stopping();
	for (uint32_t i = 0; i < b->o.max_clients; i++) {
		struct client *c = &b->clients[i];

		if (c->state == CL_ACTIVE && c->session[0])
			client_park(b, c);
		else if (c->state == CL_ATTACHING && c->offered && c->session[0])
			offer_withdraw(b, c, -ECONNREFUSED);
	}
}

static bool stop_parking(const struct broker *b)
{
	for (uint32_t i = 0; i < b->o.max_clients; i++) {
		const struct client *c = &b->clients[i];

		if (c->state == CL_PARKING || (c->state == CL_ATTACHING && c->session[0]))
			return true;
	}
	return false;
}

/*
 * A shard is stuck (a bug, or a thread stopped under a debugger), and its
 * clients' timers and records go nowhere, when for SHARD_STUCK_NS it
 * finished no pass and was neither asleep with its wake-up still ahead
 * nor, if asleep, woken by the doorbell the last heartbeat rang
 * (clients_beat()). The heartbeat then withholds systemd's watchdog ping,
 * so that systemd restarts the broker (the timers are kept), and says
 * which shard. Counted in heartbeats, not by the clock, so that a stopped
 * and continued broker is not "stuck". False: some shard is stuck.
 */
#define SHARD_STUCK_NS (UINT64_C(3) * 1000000000u)

/*
 * Every shard asleep, not rung by the last heartbeat and with its own
 * wake-up still ahead: nothing for the heartbeat to watch, so a broker at
 * rest may beat at IDLE_BEAT_NS. A shard awake, or asleep past its wake-up,
 * has the heartbeat back at once, which counts towards SHARD_STUCK_NS in
 * HEARTBEAT_NS beats as before. Before shards_alive(), which clears `rung`.
 */
static bool shards_quiet(const struct broker *b, uint64_t now)
{
	for (uint32_t i = 0; i < b->o.nr_shards; i++) {
		const struct shard *s = &b->shards[i];

		if (at_load(s->sleeping) == 0 || s->rung || now > at_load(s->wake_ns))
			return false;
	}
	return true;
}

static bool shards_alive(struct broker *b, uint64_t now)
{
	const uint32_t stuck = (uint32_t)(SHARD_STUCK_NS / HEARTBEAT_NS);
	bool alive = true;

	for (uint32_t i = 0; i < b->o.nr_shards; i++) {
		struct shard *s = &b->shards[i];
		uint64_t passes = at_load(&s->passes), wake = at_load(s->wake_ns);
		bool asleep = at_load(s->sleeping) != 0, rung = s->rung;

		s->rung = false;
		if (passes != s->seen_passes ||
		    (asleep && !rung && (now <= wake || now - wake < SHARD_STUCK_NS))) {
			if (s->still_beats >= stuck)
				log_msg(LOG_NOTICE, "shard %u is making progress again", i);
			s->seen_passes = passes;
			s->still_beats = 0;
			continue;
		}
		if (++s->still_beats == stuck)
			log_msg(LOG_ERR, "shard %u has made no progress for %llu s (%s): its timers do not fire; "
				"withholding the watchdog ping", i, (unsigned long long)(SHARD_STUCK_NS / 1000000000u),
				!asleep ? "awake, in one pass" : rung ? "asleep through its doorbell" :
				"asleep past its wake-up");
		alive &= s->still_beats < stuck;
	}
	return alive;
}

/*
 * The beat at rest: IDLE_BEAT_NS, but at least two beats to each half of
 * WATCHDOG_USEC, so that a broker at rest still pings in time (chimed(8));
 * under a watchdog that tight the beat stays at HEARTBEAT_NS, as before.
 */
static uint64_t idle_beat_ns(void)
{
	uint64_t half = notify_watchdog_half_ns();

	if (!half || half / 2 >= IDLE_BEAT_NS)
		return IDLE_BEAT_NS;
	return half / 2 > HEARTBEAT_NS ? half / 2 : HEARTBEAT_NS;
}

/*
 * The limits clients meet (EUSERS, EDQUOT), once at start: the control
 * segment has none of them, and --max-timers-per-uid's default is worked
 * out from two other options.
 */
static void limits_say(const struct broker_opts *o)
{
	char per_uid[32], client[80], uid[200];

	if (o->max_clients_per_uid)
		snprintf(per_uid, sizeof(per_uid), "%u per uid", o->max_clients_per_uid);
	else
		snprintf(per_uid, sizeof(per_uid), "any number per uid");
	if (o->max_timers_per_client && o->max_timers_per_client % o->nr_shards)
		/* each shard enforces its share, rounded up: say what is enforced */
		snprintf(client, sizeof(client), "%llu timers per client (%llu per shard)",
			 (unsigned long long)o->max_timers_per_client,
			 (unsigned long long)shard_share(o->max_timers_per_client, o->nr_shards));
	else if (o->max_timers_per_client)
		snprintf(client, sizeof(client), "%llu timers per client",
			 (unsigned long long)o->max_timers_per_client);
	else
		snprintf(client, sizeof(client), "any number of timers per client");
	if (!o->max_timers_per_uid)
		snprintf(uid, sizeof(uid), "any number per uid");
	else if (o->quota_derived && o->slab_fits)
		snprintf(uid, sizeof(uid), "%llu per uid (half of the %llu its filesystem holds; %llu, a quarter, for "
			 "a user with subordinate uids and for each range)", (unsigned long long)o->max_timers_per_uid,
			 (unsigned long long)o->slab_fits, (unsigned long long)o->max_timers_with_subuids);
	else if (o->quota_derived)
		snprintf(uid, sizeof(uid), "%llu per uid (half of %u shard%s x %u; %llu, a quarter, for a user with "
			 "subordinate uids and for each range)", (unsigned long long)o->max_timers_per_uid,
			 o->nr_shards, o->nr_shards == 1 ? "" : "s", o->capacity,
			 (unsigned long long)o->max_timers_with_subuids);
	else
		snprintf(uid, sizeof(uid), "%llu per uid", (unsigned long long)o->max_timers_per_uid);
	log_msg(LOG_INFO, "limits: %u clients (%s); %s, %s; a detached session is kept %u s", o->max_clients,
		per_uid, client, uid, o->session_linger_s);
}

int broker_run(struct broker *b)
{
	const uint64_t idle_beat = idle_beat_ns();
	uint64_t last_hb = 0, stop_by = 0, beat_shown = 0;
	int stop = 0;
	char spin[64];

	if (b->o.spin_us < 0)
		snprintf(spin, sizeof(spin), "busy-poll");
	else
		snprintf(spin, sizeof(spin), "spin %lld us, at most %u%% of the time", (long long)b->o.spin_us,
			 b->o.spin_share);
	log_msg(LOG_INFO, "listening on '%s' (%u shard%s, resolution %llu us, %u timers per shard, %s)",
		b->o.socket_path, b->o.nr_shards, b->o.nr_shards == 1 ? "" : "s",
		(unsigned long long)(b->o.resolution_ns / 1000), b->o.capacity, spin);
	limits_say(&b->o);
	notify_ready("listening");
	arm_read(b, b->sig_fd, &b->sig_buf, sizeof(b->sig_buf), UD_SIGNAL);
	arm_read(b, b->notify_fd, &b->notify_buf, sizeof(b->notify_buf), UD_NOTIFY);
	/*
	 * The offset was read at start-up, before the watch: a set since then
	 * (once it listens, a client may set the clock) cancelled nothing, and
	 * under WALL_FOLLOW_NS no heartbeat follows it. Read again once the
	 * watch is armed, as on_cqe() does after each cancel (a TSan broker,
	 * slow to get here, missed a test's first set 2 times in 3).
	 */
	wall_watch(b);
	wall_check(b, WALL_MAYBE_SET);
	arm_accept(b);
	for (;;) {
		struct io_uring_cqe *cqe;
		struct __kernel_timespec ts;
		uint64_t now = now_ns(), wait, held_end;
		unsigned head, seen = 0, woke = 0;
		bool busy;
		int r;

		uint64_t beat = b->quiet_beats >= QUIET_BEATS ? idle_beat : HEARTBEAT_NS;

		if (now - last_hb >= beat) {
			bool quiet;

			/*
			 * REST1: a beat that may put the broker to rest says so before
			 * it looks at the sessions' head_watch, full barrier: pairs
			 * with REST2 in rest_end() (shard.c). Either it sees a shard's
			 * new watch, or that shard sees the word and wakes us.
			 */
			if (b->quiet_beats + 1 >= QUIET_BEATS) {
				at_store(&b->resting, 1);
				at_fence();
			}
			quiet = !b->stopping && shards_quiet(b, now);

			at_store(&b->ctl->heartbeat_ns, now);
			at_store(&b->pub->heartbeat_ns, now);
			if (b->stopping || shards_alive(b, now))
				notify_watchdog(now, idle_beat);
			last_hb = now;
			quiet &= b->accept_armed;       /* else a failed accept, retried at each beat */
			arm_accept(b);  /* after a failed accept (out of descriptors): a no-op when armed */
			limits_report(b, now);
			wall_check(b, WALL_BEAT);
			quiet &= clients_beat(b, now);
			restart_retry(b);
			quiet &= !b->recs_stale;        /* a record to write again: no rest meanwhile */
			restart_watch(b, now);
			closer_beat(b);
			b->quiet_beats = quiet ? b->quiet_beats + 1 : 0;
			if (!quiet)
				at_store(&b->resting, 0);
			beat = b->quiet_beats >= QUIET_BEATS ? idle_beat : HEARTBEAT_NS;
		}
		if (beat != beat_shown) {
			/* for the tools, before the wait: a rest's first beat is 450 ms long already */
			at_store(&b->ctl->beat_ms, (uint32_t)(beat / 1000000u));
			beat_shown = beat;
		}
		/* Both steps in every iteration: a scan under way must not keep segments mapped. */
		busy = query_step(b);
		busy |= discard_step(b->discard, DISCARD_STEP_NS);
		discard_poll(b);
		if (discard_helpers_lost(b->discard) != b->discard_lost) {
			b->discard_lost = discard_helpers_lost(b->discard);
			log_msg(LOG_WARNING, "the segment discard helper (chimed-discard) is gone, %u so far: "
				"another starts within a second; ended connections' pages wait for their "
				"clients' close meanwhile", b->discard_lost);
		}
		wait = busy ? 0 : beat - (now - last_hb);
		held_end = hellos_held_run(b);
		if (held_end != UINT64_MAX) {
			now = now_ns();
			wait = held_end <= now ? 0 : held_end - now < wait ? held_end - now : wait;
		}
		ts.tv_sec = 0;
		ts.tv_nsec = (long long)wait;
		r = io_uring_submit_and_wait_timeout(&b->ring, &cqe, 1, &ts, NULL);
		if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY)
			return log_errno(LOG_ERR, r, "io_uring_enter on the control ring");
		io_uring_for_each_cqe(&b->ring, head, cqe) {
			seen++;
			/* A step of the wall clock is followed in full at once: no reason to end a rest. */
			woke += cqe->user_data != UD_WALL;
			stop += on_cqe(b, cqe);
		}
		io_uring_cq_advance(&b->ring, seen);
		if (woke) {
			/*
			 * A client came, went or asked, or a shard woke us:
			 * heartbeats at HEARTBEAT_NS. Ending a rest, from the next
			 * point of the last beat's HEARTBEAT_NS grid, not at once:
			 * the heartbeat is in the public segment, and a client
			 * watching it at rest saw another user's connect or
			 * hang-up to the millisecond (a hostile-client audit).
			 * Nothing needs that beat sooner: at 90 ms it would come
			 * as late.
			 */
			if (b->quiet_beats >= QUIET_BEATS) {
				uint64_t since = now_ns() - last_hb;

				last_hb += since / HEARTBEAT_NS * HEARTBEAT_NS;
			}
			b->quiet_beats = 0;
			at_store(&b->resting, 0);
		}
		if (stop && !b->stopping) {
			stop_begin(b);
			stop_by = now_ns() + STOP_PARK_NS;
		}
		if (b->stopping && (stop > 1 || !stop_parking(b) || now_ns() >= stop_by)) {
			if (stop_parking(b))
				log_msg(LOG_WARNING, "stopping with sessions still parking or attaching (%s): what their "
					"processes took is settled, the rest as after a crash (restored, their "
					"events held again)", stop > 1 ? "a second signal" : "5 s passed");
			break;
		}
	}
	wall_step_log(b, 0, true);
	return b->restart ? 1 : 0;
}

/* A session's next token (never 0, which is "none"): an attach that does not resume it. */
static void token_next(struct client *c)
{
	c->token = c->token + 1 ? c->token + 1 : 1;
}

/*
 * An admitted client: a slot in the table, its segments, and the attach
 * posted to every shard (the welcome follows their acks, on_notify()).
 */
void client_admit(struct broker *b, struct conn *cn, const struct ucred *cred, const char *session,
		  bool want_touch)
{
	struct client *c = NULL;
	int r;

	if (b->stopping) {
		send_status(cn->fd, -ECONNREFUSED);
		return;
	}
	for (uint32_t i = 0; i < b->o.max_clients; i++) {
		if (b->clients[i].state == CL_FREE) {
			c = &b->clients[i];
			break;
		}
	}
	if (!c) {
		/* A warning of its own, at most once a second: other users' refusals must not hide it. */
		if (log_ratelimit(&b->table_full_log, 1))
			log_msg(LOG_WARNING, "refusing pid %d (uid %u): the client table is full (%u slots; see "
				"--max-clients)", (int)cred->pid, (unsigned)cred->uid, b->o.max_clients);
		send_status(cn->fd, -EUSERS);
		return;
	}
	if (table_kept_from(b, cred)) {
		refuse_log(b, cred, "the last sixteenth of the client table is kept for users that hold none of it "
			   "(see --max-clients)");
		send_status(cn->fd, -EUSERS);
		return;
	}
	/* generation survives: it counts the slot's reuses. */
	memset(c, 0, offsetof(struct client, generation));
	c->slot = (uint16_t)(c - b->clients);
	c->rw_fd = c->ro_fd = c->ro_wfd = c->touch_fd = -1;
	c->fd = c->next_fd = c->pidfd = c->held_fd = -1;
	c->want_touch = want_touch && !session[0];      /* a session's timers outlive the table */
	c->hup_seq++;
	snprintf(c->session, sizeof(c->session), "%s", session);
	c->sq_base = 0;
	c->cred = *cred;
	c->holder_pid = session[0] ? cred->pid : 0;
	c->holder_start = session[0] ? chime_proc_start(cred->pid) : 0;
	holder_unwatch(c);
	c->holder_lost = false;
	c->created = session[0] != 0;
	c->no_room_seen = reserve_failed_total(b);
	if (session[0])
		token_next(c);
	c->acct_uid = policy_account_uid(&b->policy, cred->uid);
	c->timer_quota = uid_timer_quota(b, c->acct_uid);
	c->generation++;
	c->connected_ns = now_ns();
	read_comm(cred->pid, c->comm);
	r = client_segments(b, c);
	if (r < 0) {
		/* Any user can open in a loop while the broker is short of descriptors: once a second. */
		if (log_ratelimit(&b->segments_log, 1))
			log_errno(LOG_ERR, r, "cannot create segments for pid %d", (int)cred->pid);
		send_status(cn->fd, r == -EMFILE || r == -ENFILE ? -EUSERS : -ENOMEM);
		client_release(b, c);
		return;
	}
	c->fd = cn->fd;
	cn->fd = -1;            /* the client owns the socket now */
	for (uint32_t s = 0; s < b->o.nr_shards; s++)
		c->mems[s].wake_fd = c->fd;
	c->state = CL_ATTACHING;
	client_taken(b, c);
	b->clients_now++;
	b->clients_total++;
	if (c->session[0])
		restart_put(b, c);      /* before any timer: the next broker knows whose they are */
	offer(b, c, false);
}

/*
 * A detached session's new process (fd, cred: same uid, checked by the
 * caller): new segments and doorbells, the same slot, generation and
 * channels, so the ids it had stay valid; the shards hand the backlog to
 * the new rings. A failure leaves the session detached.
 */
void client_reattach(struct broker *b, struct client *c, int fd, const struct ucred *cred, bool resume,
		     uint64_t sq_base)
{
	int r;

	c->cred = *cred;
	c->resume = resume;
	c->created = false;
	c->sq_base = sq_base;
	/*
	 * Its user's quota by the policy now, brought to the shards by the
	 * reattach as an attach brings it: a session taken over by one
	 * process after another kept the quota of its first attach across
	 * any reload, half where a range added since made it a quarter (a
	 * review). Its account stays the channels' (they are that user's).
	 */
	c->timer_quota = uid_timer_quota(b, c->acct_uid);
	c->connected_ns = now_ns();
	c->hup_seq++;
	read_comm(cred->pid, c->comm);
	r = client_segments(b, c);
	if (r < 0) {
		if (log_ratelimit(&b->segments_log, 1))    /* as client_admit()'s */
			log_errno(LOG_ERR, r, "cannot create segments for pid %d (session '%s')",
				  (int)cred->pid, c->session);
		send_status(fd, r == -EMFILE || r == -ENFILE ? -EUSERS : -ENOMEM);
		close_aside(b, fd);
		conn_release(b, c);
		return;
	}
	c->fd = fd;
	c->last_holder_pid = c->holder_pid;     /* back if this attach fails before the shards' (offer_failed()) */
	c->last_holder_start = c->holder_start;
	c->last_token = c->token;
	c->holder_pid = cred->pid;
	c->holder_start = chime_proc_start(cred->pid);
	c->no_room_seen = reserve_failed_total(b);
	if (!resume)
		token_next(c);
	for (uint32_t s = 0; s < b->o.nr_shards; s++)
		c->mems[s].wake_fd = c->fd;
	c->state = CL_ATTACHING;
	/*
	 * The new holder and token (the process resumes with them after a
	 * crash), and no linger, before the shards free the last holder's
	 * carried grants. Written once welcomed, a broker killed after the
	 * welcome left the last process's token, and the next refused this
	 * one's resume (ENOTCONN); with the last park's deadline, a broker
	 * that crashed after it had passed reclaimed the session at once.
	 */
	restart_put(b, c);
	offer(b, c, true);
}

/* ------------------------------------------------------------------------ */
/* Stop                                                                         */
/* ------------------------------------------------------------------------ */

/*
 * Opens a stop cut short before their welcome (a second signal,
 * STOP_PARK_NS): refused as every open during a stop is (on_notify()), and
 * a session one of them created, which holds nothing, is not handed over
 * (restart_sessions() leaves it out).
 */
static void stop_refuse_attaching(struct broker *b)
{
	for (uint32_t i = 0; b->clients && i < b->o.max_clients; i++) {
		struct client *c = &b->clients[i];

		if (c->state != CL_ATTACHING)
			continue;
		if (c->fd >= 0)
			send_status(c->fd, -ECONNREFUSED);
		if (c->session[0] && c->created) {
			restart_clear(b, c);
		} else if (c->offered && c->reattaching) {
			/* Not withdrawn by stop_begin() (the loop failed): as offer_failed() leaves it. */
			c->holder_pid = c->last_holder_pid;
			c->holder_start = c->last_holder_start;
			c->token = c->last_token;
			restart_put(b, c);
		}
	}
}

/*
 * The stop's tail (the shards' joins, and the copies of files removed while
 * the broker ran: 256 MB of slab for 4M timers) comes after the control
 * loop's last beat, and a restart's (a reload to systemd, whose watchdog
 * runs on through it) sent no ping until the next broker's start-up: 0.3-0.8
 * s here for one such shard, so a few big ones, or a slow disk, outlasted
 * WatchdogSec= and systemd killed the broker halfway through a copy. A
 * thread pings for it, for STOP_PING_NS at most: a tail that hangs is still
 * the watchdog's to catch (as startup.c's SETUP_PING_NS).
 */
/* How long a stop waits for the closer thread's last closes (broker_stop()). */
#define CLOSER_STOP_WAIT_NS (UINT64_C(250) * 1000000u)
#define STOP_PING_NS (UINT64_C(300) * 1000000000u)

struct stop_pinger {
	pthread_t thr;
	int done;               /* atomic: the tail is over */
	bool started;
};

static void *stop_ping_main(void *arg)
{
	struct stop_pinger *p = arg;
	uint64_t until = now_ns() + STOP_PING_NS;

	/*
	 * The control loop has ended: nothing else calls notify_watchdog() now.
	 * PING1: done; pairs with PING2 in stop_ping_end() (the join orders the rest).
	 */
	for (uint64_t now = now_ns(); !at_load_acq(&p->done) && now < until; now = now_ns()) {
		notify_watchdog(now, HEARTBEAT_NS);
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000000 }, NULL);
	}
	return NULL;
}

static void stop_ping_begin(struct stop_pinger *p)
{
	p->done = 0;
	p->started = notify_watchdog_half_ns() && pthread_create(&p->thr, NULL, stop_ping_main, p) == 0;
}

static void stop_ping_end(struct stop_pinger *p)
{
	if (!p->started)
		return;
	at_store_rel(&p->done, 1);    /* PING2: pairs with PING1 */
	pthread_join(p->thr, NULL);
}

/*
 * The timers the stopped shards hold, by what becomes of them: a client's
 * are the `armed` of its stats blocks of its generation (a block of an
 * earlier client of the slot is not its).
 */
static struct stop_timers stop_timers(const struct broker *b)
{
	const char *base = (const char *)b->ctl;
	const struct chime_client_stats *cs;
	struct stop_timers t = { 0 };

	if (!b->ctl || !b->clients)
		return t;
	cs = (const struct chime_client_stats *)(base + b->ctl->client_stats_off);
	for (uint32_t i = 0; i < b->o.max_clients; i++) {
		const struct client *c = &b->clients[i];
		uint64_t n = 0, events = 0;

		if (c->state == CL_FREE)
			continue;
		for (uint32_t s = 0; s < b->o.nr_shards; s++) {
			const struct chime_client_stats *e = &cs[(uint64_t)i * b->o.nr_shards + s];

			if (at_load(&e->generation) == c->generation) {
				n += at_load(&e->armed);
				events += at_load(&e->cq_depth) + at_load(&e->backlog);
			}
		}
		if (restart_session_kept(c)) {
			t.kept += n;
			t.kept_events += events;
		} else if (n || events) {
			t.dropped += n;
			t.dropped_events += events;
			t.anonymous++;
		}
	}
	return t;
}

void broker_stop(struct broker *b)
{
	uint32_t sessions, lost_shards = 0;
	struct stop_pinger pinger;
	struct stop_timers timers;
	bool keep;

	if (!b)
		return;
	stop_ping_begin(&pinger);
	stop_refuse_attaching(b);
	sessions = restart_sessions(b);
	keep = sessions > 0;
	if (!b->stopping && !b->restart)
		notify_stopping();
	b->stopping = true;
	/* H0: STOPPED, a final state; pairs with H1 (the library's load, client.c). */
	if (b->ctl)
		at_store_rel(&b->ctl->state, CHIME_BROKER_STOPPED);
	if (b->pub)
		at_store_rel(&b->pub->state, CHIME_BROKER_STOPPED);
	/* No new clients: the socket goes first. */
	if (b->listen_fd >= 0)
		close(b->listen_fd);
	if (b->spare_fd >= 0)
		close(b->spare_fd);
	if (b->listening)
		socket_unlink(b);
	if (keep)
		restart_keep(b);
	/* Shards stop before anything they use goes away. */
	for (uint32_t i = 0; b->shards && i < b->o.nr_shards; i++) {
		int r = shard_fini(&b->shards[i], keep);

		lost_shards += r > 0;
		if (r < 0) {
			/* A wedged shard may still use every mapping: remove the files and go. */
			for (uint32_t j = i + 1; j < b->o.nr_shards && !keep; j++)
				(void)chime_seg_unlink_named(b->shards[j].seg_fd, b->shards[j].path);
			if (!keep)
				restart_close(b, 0, 0, NULL);   /* the sessions file too: it holds none */
			(void)chime_seg_unlink_named(b->ctl_fd, b->ctl_path);
			(void)chime_seg_unlink_named(b->lock_fd, b->lock_path);
			_exit(EXIT_FAILURE);
		}
	}
	timers = stop_timers(b);        /* the shards stopped: their counts are final */
	/* Clients see EOF now: shutdown() even while the ring still holds a reference. */
	for (uint32_t i = 0; b->clients && i < b->o.max_clients; i++) {
		struct client *c = &b->clients[i];

		if (c->state != CL_FREE) {
			if (c->fd >= 0)
				shutdown(c->fd, SHUT_RDWR);
		}
	}
	if (b->ring_ok)
		io_uring_queue_exit(&b->ring);
	b->ring_ok = false;     /* the clients' releases below have no ring to post to */
	query_abort(b);
	while (b->conns) {
		struct conn *cn = b->conns;

		b->conns = cn->next;
		if (cn->fd >= 0)
			close(cn->fd);
		free(cn);
	}
	for (uint32_t i = 0; b->clients && i < b->o.max_clients; i++)
		if (b->clients[i].state != CL_FREE)
			client_release(b, &b->clients[i]);
	/*
	 * The clients' last descriptors, released above: a close a client
	 * holds up (a TCP socket it sent, lingering) is not waited for. The
	 * exit ends that wait (a fatal signal), and closes what is left.
	 */
	if (!aside_stop(b->closer, CLOSER_STOP_WAIT_NS))
		log_msg(LOG_INFO, "descriptors still closing after %llu ms: left to the exit",
			(unsigned long long)(CLOSER_STOP_WAIT_NS / 1000000u));
	b->closer = NULL;
	discard_stop(b->discard);
	b->discard = NULL;
	free(b->clients);
	free(b->rec_stale);
	free(b->acking);
	policy_free(&b->policy);
	free(b->shards);
	free(b->reserve_failed_logged);
	if (b->sig_fd >= 0)
		close(b->sig_fd);
	if (b->notify_fd >= 0)
		close(b->notify_fd);
	if (b->wall_fd >= 0)
		close(b->wall_fd);
	if (b->pub_fd >= 0)
		close(b->pub_fd);
	chime_seg_unmap(&b->pub_map);
	chime_seg_unmap(&b->ctl_map);
	if (b->ctl_fd >= 0) {
		/*
		 * Emptied, not only unlinked: a reader still mapping it (a
		 * chimestat left running) kept its pages, and the next broker
		 * on a full filesystem found no room for its own (a storage
		 * audit). The readers see it shrink and wait for the next one.
		 */
		(void)ftruncate(b->ctl_fd, 0);
		(void)chime_seg_unlink_named(b->ctl_fd, b->ctl_path);
		close(b->ctl_fd);
	}
	restart_close(b, sessions, lost_shards, &timers);
	if (b->lock_fd >= 0) {
		/* Unlink while still holding it: a starter that opened it re-checks the inode. */
		(void)chime_seg_unlink_named(b->lock_fd, b->lock_path);
		close(b->lock_fd);
	}
	free(b);
	stop_ping_end(&pinger);
}
