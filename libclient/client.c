/* SPDX-License-Identifier: MIT */
/*
 * client.c - connecting to chimed, and knowing when it is gone.
 *
 * chime_open(): connect a SOCK_SEQPACKET socket, send struct chime_hello,
 * receive struct chime_welcome with the segments and doorbells (SCM_RIGHTS),
 * then map and validate everything before trusting a single offset: the
 * headers (chime_seg_check), the sizes the welcome announced against the
 * files themselves, and the client geometry recomputed on our side
 * (chime_client_layout) against what the broker wrote.
 *
 * Invariants:
 * - every fd libchime owns is O_CLOEXEC; no send can raise SIGPIPE;
 * - on any error path of chime_open() nothing stays open or mapped;
 * - the broker's death is learnt from the socket (hang-up): chime_wait()
 *   watches it in io_uring, the other paths probe it rarely (see
 *   cl_broker_check()). For an anonymous connection it is final: every
 *   call returns -ENOTCONN. A named session reconnects (reconnect.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "chime_config.h"
#include "client.h"
#include "clock.h"
#include "paths.h"        /* chime_socket_path() */
#include "segment.h"      /* chime_broker_trusted() */

#define CHIME_OPEN_TIMEOUT_S 10    /* a broker that accepts but never answers */

CHIME_PUBLIC uint64_t chime_now(void)
{
	return now_ns();
}

CHIME_PUBLIC const char *chime_version(void)
{
	return CHIME_VERSION;
}

/* ---- socket path ---- */

/* The socket chime_open() connects to, kept for a reconnect: the option, $CHIME_SOCKET, the default. */
static int resolve_path(const char *path, char out[CHIME_PATH_MAX])
{
	if (path && !*path)
		return -EINVAL;
	path = chime_socket_path(path, NULL);
	if (strlen(path) >= CHIME_PATH_MAX)
		return -EINVAL;
	strcpy(out, path);
	return 0;
}

/*
 * The socket a session reconnects to (reconnect.c): a relative path as the
 * absolute one it named at chime_open(), so that a later chdir() (a
 * daemon's to "/") does not send the attempts elsewhere; they never came
 * back to the restarted broker (found by an API audit). Kept relative if
 * the absolute one does not fit a socket address, or the working
 * directory cannot be named.
 */
static void path_keep(char out[CHIME_PATH_MAX], const char *path)
{
	char cwd[PATH_MAX];
	int n;

	strcpy(out, path);
	if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		return;
	n = snprintf(out, CHIME_PATH_MAX, "%s/%s", strcmp(cwd, "/") ? cwd : "", path);
	if (n < 0 || n >= CHIME_PATH_MAX)
		strcpy(out, path);
}

/*
 * Who listens at path hears our session's name and hands us the memory our
 * timers live in: root, our own user, or the owner of the socket's
 * directory (chime_broker_trusted()). Anyone else may have bound the path
 * in a directory all may write while no broker ran: -EPERM.
 */
static int peer_trusted(int fd, const char *path)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	int r;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return -errno;
	r = chime_broker_trusted(path, cr.uid, geteuid());
	return r < 0 ? r : r ? 0 : -EPERM;
}

/* When a handshake that starts now must be over. */
static uint64_t handshake_until(void)
{
	return now_ns() + CHIME_OPEN_TIMEOUT_S * UINT64_C(1000000000);
}

/*
 * The socket's send and receive timeouts: what is left of the handshake's
 * CHIME_OPEN_TIMEOUT_S, counted from `until`. False: nothing is left.
 */
static bool handshake_timeout(int fd, uint64_t until)
{
	uint64_t now = now_ns(), left = until > now ? until - now : 1000;
	struct timeval tv = { .tv_sec = (time_t)(left / 1000000000u), .tv_usec = (suseconds_t)(left % 1000000000u / 1000u) };

	if (!tv.tv_sec && !tv.tv_usec)
		tv.tv_usec = 1;         /* 0 would be no timeout at all */
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return until > now;
}

/*
 * A signal cut a blocking send or receive of the handshake short. With a
 * socket timeout set, the call fails with EINTR even under SA_RESTART
 * (signal(7)), and calling it again waited the whole timeout again: a
 * process with a periodic signal (an interval timer, a profiler) never
 * timed out on a broker that took the connection and never answered. Go
 * on with what is left of the handshake's time; false: none is.
 */
static bool handshake_resume(int fd, uint64_t until)
{
	return handshake_timeout(fd, until);
}

/*
 * The socket of each chime_open() under way, until its chime_t is on the
 * open list (below): a child forked meanwhile closes its copy
 * (fork_child()). Kept, a worker forked during its parent's open held the
 * parent's connection as long as it lived, and a parent killed with a
 * wake-up byte unread on it left its session busy for its next process
 * (EBUSY after a second's wait, the broker's HELD socket). The inode tells
 * the child that the number still names that socket, not one reused since.
 */
struct opening {
	int sock;                       /* -1 until the dial made it */
	ino_t ino;
	/* The welcome's descriptors, held while the broker's last answer is awaited. */
	int fds[CHIME_MAX_FDS];
	ino_t fd_inos[CHIME_MAX_FDS];
	unsigned nfds;
	struct opening *next, **prev;
};

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct opening *openings;
static __thread struct opening *my_opening;    /* this thread's chime_open(), if in one */

/*
 * socket(), into *out, under the lock the fork handlers take, and noted in
 * this thread's opening if it is in one: a child forked at any point
 * finds it where fork_child() looks (a reconnect's *out is c->recon_sock).
 */
static int socket_noted(int *out)
{
	struct opening *op = my_opening;
	struct stat st;
	int fd;

	pthread_mutex_lock(&open_lock);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	*out = fd;
	if (op && fd >= 0 && fstat(fd, &st) == 0) {
		op->sock = fd;
		op->ino = st.st_ino;
	}
	pthread_mutex_unlock(&open_lock);
	return fd;
}

void cl_sock_close(int *fd)
{
	pthread_mutex_lock(&open_lock);
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
	pthread_mutex_unlock(&open_lock);
}

void cl_sock_hang_up(int sock)
{
	char bytes[64];

	(void)shutdown(sock, SHUT_RD);
	while (recv(sock, bytes, sizeof(bytes), MSG_DONTWAIT) > 0)
		;
	(void)shutdown(sock, SHUT_RDWR);
}

/* The welcome's descriptors, noted as socket_noted() notes the socket. */
static void fds_noted(const int *fds, unsigned n)
{
	struct opening *op = my_opening;
	struct stat st;

	if (!op)
		return;
	pthread_mutex_lock(&open_lock);
	op->nfds = 0;
	for (unsigned i = 0; i < n; i++)
		if (fstat(fds[i], &st) == 0) {
			op->fds[op->nfds] = fds[i];
			op->fd_inos[op->nfds++] = st.st_ino;
		}
	pthread_mutex_unlock(&open_lock);
}

static int connect_broker(const char *path, bool wait, uint64_t until, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
	int fd, r;

	_Static_assert(CHIME_PATH_MAX == sizeof(sa.sun_path), "a path libchime keeps fits sun_path");
	strcpy(sa.sun_path, path);
	fd = socket_noted(out);
	if (fd < 0)
		return errno == ENOBUFS ? -ENOMEM : -errno;
	/*
	 * The whole handshake must not hang on a wedged broker, the connect
	 * included: with the broker's queue full (LISTEN_BACKLOG) a connect
	 * waits for room, up to the send timeout (then EAGAIN). Without it,
	 * a stopped broker held chime_open() for good (found by an audit).
	 */
	handshake_timeout(fd, until);
	/* Not waiting: a full queue is EAGAIN at once (a unix connect never is in progress). */
	if (!wait)
		(void)fcntl(fd, F_SETFL, O_NONBLOCK);
	while (connect(fd, (struct sockaddr *)&sa, len) < 0) {
		r = errno;
		if (r == EINTR && handshake_resume(fd, until))
			continue;
		cl_sock_close(out);
		switch (r) {
		case ENOENT: case ECONNREFUSED: case ENOTDIR:
			return -ENOENT;              /* nothing listens there (or a stale socket) */
		case EACCES: case EPERM:
			return -EACCES;
		case EAGAIN: case EINTR:
			return -ETIMEDOUT;           /* its queue stayed full */
		default:
			return -r;
		}
	}
	if (!wait)
		(void)fcntl(fd, F_SETFL, 0);
	if ((r = peer_trusted(fd, path)) < 0) {
		cl_sock_close(out);
		return r;
	}
	(void)handshake_timeout(fd, until);
	return 0;
}

static int send_hello(int fd, const char *session, uint32_t flags, uint64_t sq_base, uint64_t limit, uint64_t until)
{
	struct chime_hello hello = {
		.magic = CHIME_HELLO_MAGIC,
		.layout = CHIME_SHM_LAYOUT,
		.flags = flags,
		.limit = limit,         /* CHIME_HELLO_TOUCH, or a resume's session token */
		.sq_base = sq_base,
	};
	ssize_t n;

	if (session)    /* checked by the caller; the rest of the field stays NUL */
		memcpy(hello.session, session, strlen(session));
	do
		n = send(fd, &hello, sizeof(hello), MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR && handshake_resume(fd, until));
	if (n < 0 && errno == EINTR)
		return -ETIMEDOUT;
	if (n < 0)      /* EAGAIN: SO_SNDTIMEO ran out, as recv_welcome()'s ETIMEDOUT */
		return errno == EPIPE || errno == ECONNRESET ? -ECONNRESET : errno == EAGAIN ? -ETIMEDOUT : -errno;
	return n == sizeof(hello) ? 0 : -ECONNRESET;
}

static void close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/*
 * Receive the welcome and its fds. On success *nfds fds are in fds[] and
 * owned by the caller; on failure none are open.
 */
static int recv_welcome(int sock, bool wait, uint64_t until, struct chime_welcome *w, int *fds, unsigned *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * CHIME_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = w, .iov_len = sizeof(*w) };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = u.buf, .msg_controllen = sizeof(u.buf),
	};
	unsigned n = 0;
	ssize_t len;
	int r = 0;

	memset(w, 0, sizeof(*w));
	do
		len = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (wait ? 0 : MSG_DONTWAIT));
	while (len < 0 && errno == EINTR && (!wait || handshake_resume(sock, until)));
	if (len < 0 && errno == ECONNRESET)
		len = chime_recv_behind_reset(sock, &msg, MSG_CMSG_CLOEXEC);
	if (len < 0 && errno == EAGAIN && !wait)
		return -EINPROGRESS;
	if (len < 0)
		return errno == EAGAIN || errno == EINTR ? -ETIMEDOUT : errno == ECONNRESET ? -ECONNRESET : -errno;

	/* Collect every fd we were sent first, so that no error path leaks one. */
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		const unsigned char *p = CMSG_DATA(cm);

		for (unsigned i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, p + i * sizeof(int), sizeof(int));
			if (n < CHIME_MAX_FDS) {
				fds[n++] = fd;
			} else {
				close(fd);
				r = -EBADMSG;
			}
		}
	}
	if (len == 0)
		r = -ECONNRESET;
	else if (r == 0 && (msg.msg_flags & MSG_CTRUNC) && n < CHIME_MAX_FDS)
		r = -EMFILE;    /* room for them all in the buffer: the kernel had no descriptor left for some */
	else if (r == 0 && ((msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || len != sizeof(*w)))
		r = -EBADMSG;
	else if (r == 0 && w->magic != CHIME_HELLO_MAGIC)
		r = -EBADMSG;
	else if (r == 0 && w->status < 0)
		/* A refusal (-EACCES, -EPROTO, -EUSERS, -ENOMEM) carries no fds. */
		r = w->status >= -4095 ? w->status : -EBADMSG;
	else if (r == 0 && w->layout != CHIME_SHM_LAYOUT)
		r = -EPROTO;
	else if (r == 0 && (w->status != 0 || w->nr_shards == 0 || w->nr_shards > CHIME_MAX_SHARDS ||
			    w->nr_fds != CHIME_WELCOME_FIXED_FDS + w->nr_shards +
					 ((w->features & CHIME_WELCOME_F_TOUCH) != 0) || n != w->nr_fds))
		r = -EBADMSG;
	if (r < 0) {
		close_fds(fds, n);
		return r;
	}
	*nfds = n;
	return 0;
}

/*
 * What mapping a descriptor the broker handed us returns to chime_open():
 * out of memory or descriptors is ours (-ENOMEM), a version's layout
 * -EPROTO; anything else is the broker's (a file unsized or unfinished, a
 * directory, one sealed or opened against the mapping we need: mmap's
 * EPERM or EACCES), -EBADMSG, not an errno chime_open(3) gives another
 * meaning (-EPERM: an untrusted broker).
 */
static int map_errno(int r)
{
	switch (r) {
	case 0:
	case -ENOMEM:
	case -EPROTO:
	case -EBADMSG:
		return r;
	case -ENFILE:
	case -EMFILE:
		return -ENOMEM;
	default:
		return -EBADMSG;
	}
}

/* Map one segment fd, check its header and that it is exactly `size` bytes. */
static int map_seg(int fd, uint32_t kind, bool writable, uint64_t size, struct chime_map *map)
{
	struct stat st;
	int r;

	if (fstat(fd, &st) < 0)
		return map_errno(-errno);
	if (!S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof(struct chime_seg_hdr) ||
	    (uint64_t)st.st_size != size)
		return -EBADMSG;
	r = map_errno(chime_seg_map_fd(fd, kind, writable, map));
	if (r == 0 && map->size != size) {
		chime_seg_unmap(map);
		r = -EBADMSG;
	}
	return r;
}

/*
 * The broker fires every CLOCK_MONOTONIC deadline by its own clock, and
 * fired_ns is read off it: a process in a time namespace whose offset
 * is not the broker's (unshare --time, a container CRIU restored) reads
 * another clock, and its timers fired early or late by the difference
 * (20 s behind, a timer 300 ms ahead fired at once). Refused instead.
 * The broker's offset is in its sealed public segment; a broker before
 * it (no CHIME_WELCOME_F_CLOCK) is not judged: it may be in this
 * namespace itself.
 */
static int check_clock(const struct chime_welcome *w, const struct chime_pub *pub)
{
	if (!(w->features & CHIME_WELCOME_F_CLOCK))
		return 0;
	return pub->mono_off == chime_timens_monotonic() ? 0 : -EXDEV;
}

/* Check the mapped segments against each other and against our own arithmetic. */
static int check_geometry(const struct chime_welcome *w, const struct chime_map *pub_map,
			  const struct chime_client_rw *rw, const struct chime_client_ro *ro,
			  struct chime_client_geom *g)
{
	const struct chime_pub *pub = pub_map->base;
	uint32_t nr = w->nr_shards;

	if (pub_map->size < sizeof(*pub) || pub->nr_shards != nr ||
	    pub->shards_off % 8 || pub->shards_off > pub_map->size ||
	    (pub_map->size - pub->shards_off) / sizeof(struct chime_pub_shard) < nr)
		return -EBADMSG;
	if (rw->nr_shards != nr || ro->nr_shards != nr ||
	    rw->sq_size != ro->sq_size || rw->cq_size != ro->cq_size)
		return -EBADMSG;
	*g = (struct chime_client_geom){ .nr_shards = nr, .sq_size = rw->sq_size, .cq_size = rw->cq_size };
	if (chime_client_layout(g) < 0)
		return -EBADMSG;
	if (g->rw_size != w->rw_size || g->ro_size != w->ro_size ||
	    rw->chan_off != g->rw_chan_off || rw->sq_off != g->rw_sq_off ||
	    rw->claim_off != g->rw_claim_off ||
	    ro->chan_off != g->ro_chan_off || ro->cq_off != g->ro_cq_off)
		return -EBADMSG;
	return check_clock(w, pub);
}

static int dial_start(const char *path, const char *session, uint32_t flags, uint64_t sq_base, uint64_t limit,
		      bool wait, uint64_t until, int *sock)
{
	int r = connect_broker(path, wait, until, sock);

	if (r < 0)
		return r;
	r = send_hello(*sock, session, flags | CHIME_HELLO_SEALS, sq_base, limit, until);
	/*
	 * Hung up on: a broker out of descriptors refuses before our hello
	 * (EUSERS), and its refusal may be waiting; the peer is gone, so the
	 * read of the welcome returns at once, with it or with end of file.
	 */
	if (r < 0 && r != -ECONNRESET)
		cl_sock_close(sock);
	return r < 0 && r != -ECONNRESET ? r : 0;
}

int cl_dial_start(const char *path, const char *session, uint32_t flags, uint64_t sq_base, uint64_t limit,
		  bool wait, int *sock)
{
	return dial_start(path, session, flags, sq_base, limit, wait, handshake_until(), sock);
}

int cl_dial_finish(int sock, bool wait, struct chime_welcome *w, int *fds, unsigned *nfds)
{
	int r;

	/* Waiting: the handshake's time runs from now. */
	if (wait)
		return recv_welcome(sock, true, handshake_until(), w, fds, nfds);
	/*
	 * A reconnect's (it never waits): under the lock the fork handlers
	 * take, so that a child forked meanwhile finds the descriptors it
	 * received counted in *nfds (c->recon_nfds), and closes them.
	 */
	pthread_mutex_lock(&open_lock);
	r = recv_welcome(sock, false, 0, w, fds, nfds);
	pthread_mutex_unlock(&open_lock);
	return r;
}

/*
 * A broker holding as many of our user's connections as it lets wait for
 * their hellos to be read (8) answers -EAGAIN at once: a burst of opens
 * (workers forked together), not a refusal. Each is asked again after
 * a random pause of up to 1, 2, 4 .. 32 ms, so that the burst spreads out,
 * until the handshake's time runs out (-ETIMEDOUT). Before, the broker hung
 * up, and 5 of 64 workers opening together failed with -ECONNRESET.
 */
static bool dial_again(uint64_t until, unsigned attempt)
{
	static _Thread_local uint64_t seed;
	uint64_t cap = UINT64_C(1000000) << (attempt < 5 ? attempt : 5), pause;

	if (!seed)
		seed = now_ns() ^ (uint64_t)getpid() << 32;
	pause = splitmix64(&seed) % cap + 1;
	if (now_ns() + pause >= until)
		return false;
	nanosleep(&(struct timespec){ .tv_sec = 0, .tv_nsec = (long)pause }, NULL);
	return true;
}

void cl_own_unmap(struct cl_own *own)
{
	chime_seg_unmap(&own->rw);
	chime_seg_unmap(&own->touch);
}

/* Map memfd fd writable, of `size` bytes (0: whatever it has), its pages faulted in if `populate`. */
static int map_own(int fd, uint64_t size, bool populate, struct chime_map *map)
{
	int r = map_errno(chime_seg_map_file(fd, true, map));

	if (r == 0 && size && map->size != size) {
		chime_seg_unmap(map);
		r = -EBADMSG;
	}
	/*
	 * Every page, or the broker refuses the attach as unfaulted (-EPROTO,
	 * which says "another handshake"): out of memory is said as such.
	 */
	if (r == 0 && populate && (r = chime_seg_populate(map->base, map->size)) < 0) {
		chime_seg_unmap(map);
		r = r == -ENOMEM ? -ENOMEM : -EBADMSG;
	}
	return r;
}

int cl_take_offer(int sock, const struct chime_welcome *w, const int *fds, struct cl_own *own)
{
	struct chime_mapped m = { .magic = CHIME_MAPPED_MAGIC };
	int touch_fd = (w->features & CHIME_WELCOME_F_TOUCH) ? fds[CHIME_WELCOME_FIXED_FDS + w->nr_shards] : -1;
	ssize_t n;
	int r;

	memset(own, 0, sizeof(*own));
	/* A size we can check it against, before we fault it in (0 would take whatever the memfd has). */
	if (w->rw_size == 0)
		return -EBADMSG;
	/* Faulted in by us, so that they are ours, not the broker's (it checks). */
	r = map_own(fds[1], w->rw_size, true, &own->rw);
	if (r == 0 && touch_fd >= 0)
		r = map_own(touch_fd, 0, false, &own->touch);
	/* EPERM: a broker that sealed them itself (F_SEAL_SEAL): not one we speak to. */
	if (r == 0)
		r = chime_seg_seal(fds[1], CHIME_SEAL_WRITES) < 0 ? -EPROTO : 0;
	if (r == 0 && touch_fd >= 0)
		r = chime_seg_seal(touch_fd, CHIME_SEAL_WRITES) < 0 ? -EPROTO : 0;
	if (r == 0) {
		n = send(sock, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0)
			r = errno == EPIPE || errno == ECONNRESET || errno == EAGAIN ? -ECONNRESET : -errno;
	}
	if (r < 0)
		cl_own_unmap(own);
	return r;
}

int cl_await_ready(int sock, bool wait, uint64_t until)
{
	struct chime_welcome w;
	ssize_t n;

	/* What is left of the handshake's time, not the timeout the connect set (the welcome took some). */
	if (wait && !handshake_timeout(sock, until))
		return -ETIMEDOUT;
	for (;;) {
		n = recv(sock, &w, sizeof(w), wait ? 0 : MSG_DONTWAIT);
		if (n < 0 && errno == EINTR && (!wait || handshake_resume(sock, until)))
			continue;
		if (n < 0 && errno == ECONNRESET)
			n = recv(sock, &w, sizeof(w), MSG_DONTWAIT);    /* a refusal behind the reset */
		if (n == 1)
			continue;       /* a wake-up: the channels are attached already */
		break;
	}
	if (n < 0 && errno == EAGAIN && !wait)
		return -EINPROGRESS;
	/* Another errno is this process's (ENOMEM), not a hang-up: as recv_welcome() says it. */
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? -ETIMEDOUT :
		       errno == ECONNRESET || errno == ENOTCONN || errno == EPIPE ? -ECONNRESET : -errno;
	if (n == 0)
		return -ECONNRESET;
	if (n != (ssize_t)sizeof(w) || w.magic != CHIME_HELLO_MAGIC)
		return -EBADMSG;
	if (w.status < 0)
		return w.status >= -4095 ? w.status : -EBADMSG;
	return w.status == 0 && w.nr_fds == 0 && w.layout == CHIME_SHM_LAYOUT ? 0 : -EBADMSG;
}

int cl_dial(const char *path, const char *session, uint32_t flags, uint64_t sq_base, uint64_t limit, int *sock,
	    struct chime_welcome *w, int *fds, unsigned *nfds, struct cl_own *own)
{
	uint64_t until = handshake_until();

	for (unsigned attempt = 0;; attempt++) {
		int r = dial_start(path, session, flags, sq_base, limit, true, until, sock);

		if (r < 0)
			return r;
		r = recv_welcome(*sock, true, until, w, fds, nfds);
		if (r == 0) {
			fds_noted(fds, *nfds);
			r = cl_take_offer(*sock, w, fds, own);
			if (r == 0)
				r = cl_await_ready(*sock, true, until);
			if (r == 0)
				return 0;
			cl_own_unmap(own);
			fds_noted(NULL, 0);
			close_fds(fds, *nfds);
			*nfds = 0;
		}
		close(*sock);
		*sock = -1;
		if (r != -EAGAIN)
			return r;
		if (!dial_again(until, attempt))
			return -ETIMEDOUT;
	}
}

int cl_map(const struct chime_welcome *w, const int *fds, struct cl_own *own, struct chime_map maps[3],
	   struct chime_client_geom *g)
{
	int r;

	memset(maps, 0, 3 * sizeof(maps[0]));
	maps[1] = own->rw;
	memset(&own->rw, 0, sizeof(own->rw));
	/* Written by the broker once we sealed it: checked only now. */
	r = chime_seg_check(&maps[1], CHIME_SEG_CLIENT_RW, NULL);
	if (r == -EAGAIN)
		r = -EBADMSG;
	if (r == 0)
		r = map_seg(fds[0], CHIME_SEG_PUBLIC, false, w->pub_size, &maps[0]);
	if (r == 0)
		r = map_seg(fds[2], CHIME_SEG_CLIENT_RO, false, w->ro_size, &maps[2]);
	if (r == 0)
		r = check_geometry(w, &maps[0], maps[1].base, maps[2].base, g);
	if (r < 0)
		for (int i = 0; i < 3; i++)
			chime_seg_unmap(&maps[i]);
	return r;
}

/*
 * After fork(), a child holds copies of its parent's descriptors and shared
 * rings: were it to use them, it would take its parent's events and break
 * the single-drainer rule. So every open chime_t is on a list, and the
 * child's handler marks each dead and forked: every call in the child then
 * says -ECHILD, at no cost to the calls' fast path (they check `dead`
 * already), and chime_close() there only frees the child's copies.
 */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static struct chime *open_list;

static void fork_prepare(void)
{
	pthread_mutex_lock(&open_lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&open_lock);
}

static void fork_child(void)
{
	for (struct chime *c = open_list; c; c = c->next_open) {
		at_store(&c->forked, 1);
		at_store(&c->dead, 1);
		/*
		 * The broker learns that the parent is gone from its connection's
		 * hang-up, which does not come while any process holds the
		 * socket: the child's copy, or its copy of the io_uring whose
		 * polls hold it. A worker that never calls chime_close() would
		 * keep a dead parent's session attached (-EBUSY for its next
		 * process) and its anonymous timers armed. Drop both now (close
		 * and munmap: no lock, nothing the parent shares changes); no
		 * call in the child uses them (every one says -ECHILD first).
		 * The fd numbers stay fixed for the parent (a reconnect dup3()s
		 * onto them), so these are this connection's.
		 */
		if (c->sock >= 0) {
			close(c->sock);
			c->sock = -1;
		}
		if (c->recon_sock >= 0) {      /* a reconnect's handshake under way: the broker's hello is the parent's */
			close(c->recon_sock);
			c->recon_sock = -1;
		}
		cl_recon_offer_drop(c);
		if (c->has_ring) {
			io_uring_queue_exit(&c->ring);
			c->has_ring = false;
		}
	}
	for (struct opening *op = openings; op; op = op->next) {
		struct stat st;

		if (op->sock >= 0 && fstat(op->sock, &st) == 0 && st.st_ino == op->ino)
			close(op->sock);
		for (unsigned i = 0; i < op->nfds; i++)
			if (fstat(op->fds[i], &st) == 0 && st.st_ino == op->fd_inos[i])
				close(op->fds[i]);
	}
	pthread_mutex_unlock(&open_lock);
}

static void atfork_register(void)
{
	(void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void open_list_add(struct chime *c)
{
	pthread_mutex_lock(&open_lock);
	c->next_open = open_list;
	c->prev_open = &open_list;
	if (open_list)
		open_list->prev_open = &c->next_open;
	open_list = c;
	pthread_mutex_unlock(&open_lock);
}

/* prev_open is read under the lock too: another thread's open_list_add() rewrites the head's. */
static void open_list_del(struct chime *c)
{
	pthread_mutex_lock(&open_lock);
	if (c->prev_open) {     /* NULL: a failed chime_open(), never on the list */
		*c->prev_open = c->next_open;
		if (c->next_open)
			c->next_open->prev_open = c->prev_open;
	}
	pthread_mutex_unlock(&open_lock);
}

static void chime_free(struct chime *c)
{
	if (!c)
		return;
	open_list_del(c);
	if (c->has_ring)
		io_uring_queue_exit(&c->ring);
	if (c->timer_fd >= 0)
		close(c->timer_fd);
	cl_sock_close(&c->recon_sock);
	cl_recon_offer_drop(c);
	if (c->session[0])
		pthread_mutex_destroy(&c->lock);
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		if (c->chan[s].doorbell >= 0)
			close(c->chan[s].doorbell);
	}
	free(c->pend);
	free(c->pend_used);
	chime_seg_unmap(&c->pub_map);
	chime_seg_unmap(&c->rw_map);
	chime_seg_unmap(&c->ro_map);
	chime_seg_unmap(&c->touch_map);
	free(c->touch_mapped);
	if (c->ep_fd >= 0)
		close(c->ep_fd);
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	if (c->sock >= 0)
		close(c->sock);
	free(c);
}

/* chime_fd()'s epoll set: wake-ups and hang-up on the socket, our own kicks. */
static int wake_fds(struct chime *c)
{
	struct epoll_event ev = { .events = EPOLLIN };

	c->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->kick_fd < 0)
		return -errno;
	c->ep_fd = epoll_create1(EPOLL_CLOEXEC);
	if (c->ep_fd < 0)
		return -errno;
	if (epoll_ctl(c->ep_fd, EPOLL_CTL_ADD, c->kick_fd, &ev) < 0)
		return -errno;
	ev.events = EPOLLIN | EPOLLRDHUP;
	if (epoll_ctl(c->ep_fd, EPOLL_CTL_ADD, c->sock, &ev) < 0)
		return -errno;
	return 0;
}

/*
 * The touch table: capacity words and tags per shard, all shards' capacity
 * alike. A size that is not that is refused (-EBADMSG), as a malformed
 * segment is.
 */
static int map_touch(struct chime *c, struct chime_map *touch)
{
	uint64_t per_shard = (uint64_t)c->nr_shards * CHIME_TOUCH_BYTES, size = touch->size;
	void *p = touch->base;

	if (!size || size % per_shard || size / per_shard > UINT32_MAX)
		return -EBADMSG;
	c->touch_map = *touch;
	memset(touch, 0, sizeof(*touch));
	c->touch_cap = (uint32_t)(size / per_shard);
	c->touch_mapped = calloc((size / TOUCH_WINDOW + 2 + 63) / 64, sizeof(uint64_t));
	if (!c->touch_mapped)
		return -ENOMEM;         /* touch_map is unmapped with the connection */
	c->touch = chime_touch_words(p, 0, c->touch_cap);
	c->touch_tag = chime_touch_tags(p, c->nr_shards, 0, c->touch_cap);
	return 0;
}

static int setup(struct chime *c, const struct chime_welcome *w, int *fds, struct cl_own *own)
{
	struct chime_map maps[3];
	struct chime_client_geom g;
	int r;

	r = cl_map(w, fds, own, maps, &g);
	if (r == 0 && (w->features & CHIME_WELCOME_F_TOUCH))
		r = map_touch(c, &own->touch);
	if (r < 0) {
		for (int i = 0; i < 3; i++)
			chime_seg_unmap(&maps[i]);
		return r;
	}
	c->pub_map = maps[0];
	c->rw_map = maps[1];
	c->ro_map = maps[2];
	c->pub = c->pub_map.base;
	c->rw = c->rw_map.base;
	c->sq_size = g.sq_size;
	c->cq_size = g.cq_size;
	c->slot = w->slot;
	at_store(&c->realtime, (w->features & CHIME_WELCOME_F_REALTIME) != 0);

	for (uint32_t s = 0; s < c->nr_shards; s++) {
		struct chime_chan *ch = &c->chan[s];
		struct chime_chan_rw *crw = chime_at(&c->rw_map, g.rw_chan_off + s * sizeof(*crw));
		const struct chime_chan_ro *cro = chime_at(&c->ro_map, g.ro_chan_off + s * sizeof(*cro));
		const struct chime_pub_shard *ps =
			chime_at(&c->pub_map, c->pub->shards_off + s * sizeof(*ps));

		ch->sq.slots = chime_at(&c->rw_map, g.rw_sq_off + (uint64_t)s * g.sq_size * sizeof(struct chime_sqe));
		ch->sq.tail = &crw->sq_tail;
		ch->sq.mask = g.sq_size - 1;
		ch->sleeping = &ps->sleeping;
		ch->wake_ns = &ps->wake_ns;
		ch->doorbell = fds[CHIME_WELCOME_FIXED_FDS + s];
		fds[CHIME_WELCOME_FIXED_FDS + s] = -1;
		chime_cq_cons_init(&ch->cq,
				   chime_at(&c->ro_map, g.ro_cq_off + (uint64_t)s * g.cq_size * sizeof(struct chime_cqe)),
				   chime_at(&c->rw_map, g.rw_claim_off + (uint64_t)s * g.cq_size * sizeof(uint64_t)),
				   &cro->cq_tail, &crw->cq_head, g.cq_size);
		ch->sq_head = &cro->sq_head;
		ch->backlog = &cro->backlog;
		/* Resume where the segment says (0 for a fresh one). */
		ch->cq.head = ch->cq.tail = at_load(&crw->cq_head);
		ch->seen = ch->cq.head;
	}
	/* The drainer's cancel set: bounded by the ring size, whatever is armed. */
	c->pend = calloc(2 * (size_t)g.sq_size, sizeof(*c->pend));
	c->pend_used = calloc(g.sq_size, sizeof(*c->pend_used));
	if (!c->pend || !c->pend_used)
		return -ENOMEM;
	c->pend_mask = 2 * g.sq_size - 1;
	r = wake_fds(c);
	if (r < 0)
		return r;
	/*
	 * A small ring for chime_wait(); without io_uring, chime_wait() uses
	 * poll(2). No IORING_SETUP_SINGLE_ISSUER: the waiting thread may change
	 * from call to call (chime_wait(3)). A poll the last one left
	 * outstanding completes for the next, also once its thread has exited
	 * (with -ECANCELED when its fd becomes ready), but then a tick late:
	 * a thread sleeps in ppoll() while another thread's polls are
	 * outstanding (poll.c, sleep_uring()).
	 */
	c->has_ring = io_uring_queue_init(4, &c->ring, 0) == 0;
	return 0;
}

static int drop_session(const char *path, const char *name);

/*
 * Failed after a welcome that created the session (no descriptor left for
 * the segments, no memory): drop it again, rather than leave it, empty,
 * under the user's name and quota for its linger. The socket is closed by
 * then, so the broker sees the session's process gone. Best effort: a
 * process that attached meanwhile keeps it (-EBUSY).
 */
static void drop_if_created(const struct chime_welcome *w, const char *path, const char *session)
{
	if (session && w->magic == CHIME_HELLO_MAGIC && w->layout == CHIME_SHM_LAYOUT && w->status == 0 &&
	    (w->features & CHIME_WELCOME_F_NEW_SESSION))
		(void)drop_session(path, session);
}

/*
 * chime_open@@CHIME_0.3 reads the whole struct chime_opts (session included);
 * chime_open@CHIME_0.1 is what programs built against the first header call:
 * their struct ends after flags, so it reads only those two fields.
 */
static void opening_begin(struct opening *op)
{
	*op = (struct opening){ .sock = -1 };
	pthread_mutex_lock(&open_lock);
	op->next = openings;
	op->prev = &openings;
	if (openings)
		openings->prev = &op->next;
	openings = op;
	pthread_mutex_unlock(&open_lock);
	my_opening = op;
}

static void opening_end(struct opening *op)
{
	my_opening = NULL;
	pthread_mutex_lock(&open_lock);
	*op->prev = op->next;
	if (op->next)
		op->next->prev = op->prev;
	pthread_mutex_unlock(&open_lock);
}

static int open_dialled(chime_t **out, const char *path, unsigned flags, const char *session);

static int open_session(chime_t **out, const char *socket_path, unsigned flags, const char *session)
{
	char path[CHIME_PATH_MAX];
	struct opening op;
	int r, cancel;

	/* A session name as the broker accepts it: 1..63 bytes of [A-Za-z0-9._-]. */
	if (!out || (flags & ~CHIME_OPEN_RECORD_RESETS) || (session && chime_session_len(session) <= 0))
		return -EINVAL;
	r = resolve_path(socket_path, path);
	if (r < 0)
		return r;
	/* Before the dial: a fork during a process's first open must find its socket too. */
	(void)pthread_once(&atfork_once, atfork_register);
	/*
	 * Not cancelled in between (pthread_cancel(3)): `op` is on this stack and
	 * in the process's list of opens, and a cancel at the handshake's
	 * connect() or recvmsg() left it there, for fork_child() and the next
	 * open to write into whatever reused the stack (an API audit: every fork
	 * after such a cancel crashed its child), and its socket open.
	 */
	cl_cancel_off(&cancel);
	opening_begin(&op);
	r = open_dialled(out, path, flags, session);
	opening_end(&op);
	cl_cancel_restore(cancel);
	return r;
}

static int open_dialled(chime_t **out, const char *path, unsigned flags, const char *session)
{
	int fds[CHIME_MAX_FDS];
	struct chime_welcome w = { 0 };      /* drop_if_created() reads it whatever failed */
	struct cl_own own;
	struct chime *c;
	unsigned nfds = 0;
	int sock = -1, r;

	r = cl_dial(path, session, 0, 0, !session && !(flags & CHIME_OPEN_RECORD_RESETS) ? CHIME_HELLO_TOUCH : 0,
		    &sock, &w, fds, &nfds, &own);
	if (r < 0) {
		drop_if_created(&w, path, session);     /* the descriptors for the welcome ran out */
		return r;
	}
	c = calloc(1, sizeof(*c) + w.nr_shards * sizeof(c->chan[0]));
	if (!c || (session && pthread_mutex_init(&c->lock, NULL) != 0)) {
		free(c);
		cl_own_unmap(&own);
		fds_noted(NULL, 0);
		close_fds(fds, nfds);
		close(sock);
		drop_if_created(&w, path, session);
		return -ENOMEM;
	}
	c->sock = sock;
	c->kick_fd = c->ep_fd = c->timer_fd = c->recon_sock = -1;
	c->nr_shards = w.nr_shards;
	path_keep(c->path, path);
	if (session)
		memcpy(c->session, session, strlen(session) + 1);
	c->session_token = w.session_token;
	c->recon_window_ns = cl_reconnect_window();
	for (uint32_t s = 0; s < c->nr_shards; s++)
		c->chan[s].doorbell = -1;
	r = setup(c, &w, fds, &own);
	/* The segments stay mapped; their fds are not needed any more. */
	cl_own_unmap(&own);     /* what setup() did not take */
	fds_noted(NULL, 0);
	close_fds(fds, nfds);
	if (r == 0 && session && c->recon_window_ns)
		r = cl_reconnect_prepare(c);
	if (r < 0) {
		chime_free(c);
		drop_if_created(&w, path, session);
		return r;
	}
	cl_sock_ready(sock);
	open_list_add(c);
	*out = c;
	return 0;
}

void cl_cancel_off(int *old)
{
	(void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, old);
}

void cl_cancel_restore(int old)
{
	(void)pthread_setcancelstate(old, NULL);
}

bool cl_lock_try(struct chime *c)
{
	int old;

	cl_cancel_off(&old);
	if (pthread_mutex_trylock(&c->lock) != 0) {
		cl_cancel_restore(old);
		return false;
	}
	c->lock_cancel = old;   /* the holder's alone: a callback's nested lock is another session's */
	return true;
}

void cl_unlock(struct chime *c)
{
	int old = c->lock_cancel;

	pthread_mutex_unlock(&c->lock);
	cl_cancel_restore(old);
}

void cl_sock_ready(int sock)
{
	/* Back to blocking without timeouts: only non-blocking probes use the socket now. */
	(void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){ 0 }, sizeof(struct timeval));
	(void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &(struct timeval){ 0 }, sizeof(struct timeval));
}

/* The first ABI's struct chime_opts (CHIME_0.1, CHIME_0.2). */
struct chime_opts_0_1 {
	const char *socket_path;
	unsigned    flags;
};

CHIME_PUBLIC int chime_open_0_1(chime_t **out, const struct chime_opts_0_1 *opts);
CHIME_PUBLIC int chime_open_0_3(chime_t **out, const struct chime_opts *opts);
/*
 * GCC's attribute survives link-time optimization (distributions build with
 * -flto), where a top-level .symver names a symbol that LTO may have renamed
 * or moved to another partition; clang has only the directive.
 */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#define SYMVER(impl, versioned) extern __typeof__(impl) impl __attribute__((symver(versioned)))
#else
#define SYMVER(impl, versioned) __asm__(".symver " #impl ", " versioned)
#endif
SYMVER(chime_open_0_1, "chime_open@CHIME_0.1");
SYMVER(chime_open_0_3, "chime_open@@CHIME_0.3");

CHIME_PUBLIC int chime_open_0_1(chime_t **out, const struct chime_opts_0_1 *opts)
{
	return open_session(out, opts ? opts->socket_path : NULL, opts ? opts->flags : 0, NULL);
}

CHIME_PUBLIC int chime_open_0_3(chime_t **out, const struct chime_opts *opts)
{
	return open_session(out, opts ? opts->socket_path : NULL, opts ? opts->flags : 0,
			    opts ? opts->session : NULL);
}

/* ---- ending a session ---- */

/*
 * The answer to a drop: a query head with its status, or the welcome of a
 * refused hello (not admitted: -EACCES; another layout: -EPROTO).
 */
static int recv_drop_answer(int sock, uint64_t until)
{
	union {
		struct chime_query_head q;
		struct chime_welcome w;
	} u;
	struct iovec iov = { .iov_base = &u, .iov_len = sizeof(u) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	do
		n = recvmsg(sock, &msg, 0);
	while (n < 0 && errno == EINTR && handshake_resume(sock, until));
	if (n < 0 && errno == ECONNRESET)
		n = chime_recv_behind_reset(sock, &msg, 0);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? -ETIMEDOUT : errno == ECONNRESET ? -ECONNRESET : -errno;
	if (n == 0)
		return -ECONNRESET;
	if (n == (ssize_t)sizeof(u.w) && u.w.magic == CHIME_HELLO_MAGIC)
		return u.w.status < 0 && u.w.status >= -4095 ? u.w.status : -EBADMSG;
	if (n != (ssize_t)sizeof(u.q) || u.q.magic != CHIME_HELLO_MAGIC || u.q.status > 0 || u.q.status < -4095)
		return -EBADMSG;
	return u.q.status;
}

/* Drop session `name` of the broker at `path` (resolved): what `chimectl drop-session` asks. */
static int drop_session(const char *path, const char *name)
{
	uint64_t until = handshake_until();

	for (unsigned attempt = 0;; attempt++) {
		int sock, r = connect_broker(path, true, until, &sock);

		if (r < 0)
			return r;
		r = send_hello(sock, name, CHIME_HELLO_DROP_SESSION, 0, false, until);
		/* Hung up on before the hello: its refusal may be waiting (as cl_dial()). */
		if (r == 0 || r == -ECONNRESET) {
			int why = recv_drop_answer(sock, until);

			r = r == 0 || why != -ECONNRESET ? why : r;
		}
		close(sock);
		if (r != -EAGAIN)
			return r;
		if (!dial_again(until, attempt))        /* a burst of our user's opens */
			return -ETIMEDOUT;
	}
}

/* chime_drop_session(3), from the library's trusted connection. */
CHIME_PUBLIC int chime_drop_session(const struct chime_opts *opts)
{
	char path[CHIME_PATH_MAX];
	int r, cancel;

	if (!opts || !opts->session || chime_session_len(opts->session) <= 0 ||
	    (opts->flags & ~CHIME_OPEN_RECORD_RESETS))
		return -EINVAL;
	r = resolve_path(opts->socket_path, path);
	if (r < 0)
		return r;
	cl_cancel_off(&cancel);    /* its socket closed whatever happens (chime_open()'s reason) */
	r = drop_session(path, opts->session);
	cl_cancel_restore(cancel);
	return r;
}

#define COMMIT_WAIT_NS   (UINT64_C(1000) * 1000000u)   /* chime_close(3): a gone broker's successor */
#define COMMIT_STUCK_NS  (UINT64_C(10000) * 1000000u)  /* and a broker there that applies nothing */
#define COMMIT_PAUSE_NS  20000                         /* looked again after this, doubling, */
#define COMMIT_PAUSE_MAX_NS (UINT64_C(5) * 1000000u)   /* up to this */
#define COMMIT_RETRY_NS  (UINT64_C(50) * 1000000u)     /* a gone broker's successor, tried this often */
#define COMMIT_AFTER_NS  (UINT64_C(100) * 1000000u)    /* for it to apply them, after a late welcome */
#define COMMIT_ANSWER_NS (UINT64_C(5) * 1000000u)      /* a hello taken: its welcome looked for this often */

/*
 * A session's close commits what the process submitted: the shards apply
 * it into their slabs, which outlive a broker crash, before the process
 * goes. Left in the rings, it would be lost if the broker crashed before
 * reading them (an arm an hour ahead does not wake a sleeping shard), and
 * the next process to open the session frees the grants those arms held.
 * A broker that is gone (crashed, or stopped by a restart) never reads
 * them: the close reconnects, as any call would, so that they go to the
 * next broker, and waits for that one. Bounded: 1 s for a broker to take
 * the connection, whatever it does, from when it is found gone; 10 s
 * for one that is there and applies nothing (stopped, frozen, stuck: the
 * shipped unit's watchdog kills it after 5 s, and the close then hands the
 * records to the next one; with 1 s the close returned first, and the
 * crash lost them: an API audit). It tries every 50 ms, not on the
 * reconnect's back-off, whose attempts (10 ms doubling) left the last
 * 370 ms of that second untried: a broker back then was missed and the
 * arms lost. A broker that has taken it answers once its shards have taken
 * over the files (a restore: it listens first), and the close waits for
 * that answer (the attempt's DIAL_WAIT_NS, reconnect.c); a welcome after
 * the second leaves 100 ms for the records to be applied. Before, the restore had to fit in
 * the second too, and a broker restoring full shards lost them.
 */
static bool session_applied(struct chime *c)
{
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		const struct chime_chan *ch = &c->chan[s];

		if (at_load_acq(ch->sq_head) < at_load(ch->sq.tail))
			return false;
	}
	return true;
}

static void session_commit(struct chime *c)
{
	uint64_t until = now_ns() + COMMIT_STUCK_NS, answer_by = 0, now, wait, pause = COMMIT_PAUSE_NS;
	bool gone = false;

	/*
	 * New attempts until `until`; past it, only the answer to a hello a
	 * broker has taken (answer_by, each attempt's own): extending `until`
	 * by it had every hello a broker took and refused, or hung up on,
	 * stretch the close by 10 s more, up to the reconnect's whole window
	 * (found by a review).
	 */
	while (!cl_is_dead(c) && ((now = now_ns()) < until || now < answer_by)) {
		if (cl_reconnecting(c) || cl_broker_gone(c, true)) {
			if (!gone) {
				gone = true;    /* a second for a successor from now, not the stuck one's ten */
				until = now + COMMIT_WAIT_NS;
			}
			if (now < until)
				cl_reconnect_hurry(c);
			else if (!cl_reconnect_answer_by(c))
				break;  /* past the second, no attempt is begun: only a pending answer is taken */
			if (!cl_reconnect(c, false)) {
				/* Connected again: the old rings' records are in the new ones. */
				now = now_ns();
				if (!cl_is_dead(c) && until < now + COMMIT_AFTER_NS)
					until = now + COMMIT_AFTER_NS;
				answer_by = 0;
				continue;
			}
			/* A broker took the hello: its answer comes once it has restored (DIAL_WAIT_NS at most). */
			answer_by = cl_reconnect_answer_by(c);
			if (now >= until && !answer_by)
				break;
			wait = COMMIT_RETRY_NS;
			if (now < until && until - now < wait)
				wait = until - now;
			wait = wait > COMMIT_PAUSE_NS ? wait : COMMIT_PAUSE_NS;
			if (answer_by && wait > COMMIT_ANSWER_NS)
				wait = COMMIT_ANSWER_NS;        /* looked for more often than a retry */
		} else {
			if (chime_flush(c) < 0 || session_applied(c))
				return;
			/* doubling: a stuck broker's ten seconds are not spent polling every 20 us */
			wait = pause;
			pause = pause < COMMIT_PAUSE_MAX_NS / 2 ? pause * 2 : COMMIT_PAUSE_MAX_NS;
		}
		nanosleep(&(struct timespec){ .tv_sec = (time_t)(wait / 1000000000u),
					      .tv_nsec = (long)(wait % 1000000000u) }, NULL);
	}
}

CHIME_PUBLIC void chime_close(chime_t *c)
{
	/*
	 * From a callback of its own dispatch: freed under the drain, c was read
	 * on (a crash). The dispatch stops after that callback, and closes c as
	 * it returns (poll.c).
	 */
	int cancel;

	if (c && cl_in_own_dispatch(c)) {
		c->close_deferred = 1;
		return;
	}
	/*
	 * Whole or not at all: a cancel at the commit's nanosleep() or the
	 * hang-up's recv() left c unfreed and its session attached (EBUSY to
	 * the next open) for as long as the process lived (an API audit).
	 */
	cl_cancel_off(&cancel);
	if (c && c->session[0] && !at_load(&c->forked))
		session_commit(c);
	/*
	 * Closing the socket is the rest of the protocol: the broker sees the
	 * hang-up, and frees an anonymous connection's timers or parks a
	 * session's. Shut down first: a close alone hangs up only when the
	 * io_uring's poll on it is torn down, after io_uring_queue_exit()
	 * returns (up to 13 ms here), and a session opened again meanwhile was
	 * still attached (-EBUSY). Not in a forked child: the socket is its
	 * parent's. And the wake-up bytes read first (cl_sock_hang_up()): a
	 * user may hold a quarter of its share of slots HELD, and sessions
	 * opened and closed in a row got EUSERS.
	 */
	if (c && !at_load(&c->forked) && c->sock >= 0)
		cl_sock_hang_up(c->sock);
	chime_free(c);
	cl_cancel_restore(cancel);
}

/* ---- doorbells ---- */

/* Ring for sleep number sleep_no (non-zero), once per sleep and client. */
static void ring(struct chime_chan *ch, uint32_t sleep_no)
{
	uint64_t one = 1;
	uint32_t last;
	int cancel;

	/*
	 * The shard stays "asleep" until it is scheduled again, and every
	 * publish in that window lands here: ring once per sleep (per client),
	 * not once per record. Whoever moves `rung` to this sleep number
	 * writes; the others know the write is done or under way, and one
	 * write is all a sleeping shard needs.
	 */
	last = at_load(&ch->rung);
	if (last == sleep_no || !at_cas_relaxed(&ch->rung, &last, sleep_no))
		return;
	/*
	 * Not cancelled at the write(2), a cancellation point: a thread
	 * cancelled there had claimed this sleep's ring and never written it,
	 * and every other thread's records waited for the heartbeat.
	 */
	cl_cancel_off(&cancel);
	(void)!write(ch->doorbell, &one, sizeof(one));
	cl_cancel_restore(cancel);
}

void cl_ring_doorbell(struct chime_chan *ch)
{
	/*
	 * S2: load the shard's sleep number after our publication (the
	 * caller's full barrier, S1); pairs with the shard's store of a new
	 * non-zero sleep number, full barrier, re-check of the rings. Either it
	 * sees our record or we see it asleep. seq_cst so that the load cannot
	 * pass the exchange on arm64.
	 */
	uint32_t sleep_no = at_load_sc(ch->sleeping);

	if (__builtin_expect(sleep_no != 0, 0))
		ring(ch, sleep_no);
}

/*
 * A record due at least this far ahead can wait for the control thread
 * instead: its heartbeat pass (every 90 ms, 450 ms at rest: clients_beat()) rings a sleeping
 * shard with records waiting, and a broker whose heartbeat is a second old
 * is taken for dead (cl_broker_gone()).
 */
#define LAZY_HORIZON_NS UINT64_C(1000000000)

/*
 * True if a record needed by by_ns can wait for a shard that sleeps until
 * wake_ns. The clock only when the shard's own wake-up comes too late (a
 * shard with nothing earlier armed: every arm of a new service), and the
 * coarse one: a tick behind, it takes a record due 1 s less a tick from now
 * for one a second ahead, which the heartbeat still applies 550 ms early
 * (at rest it beats every 450 ms).
 * The full clock cost each such arm 30-35 ns, as much as the rest of it.
 */
static inline bool can_wait(uint64_t by_ns, uint64_t wake_ns)
{
	return by_ns >= wake_ns || (by_ns >= LAZY_HORIZON_NS && by_ns - LAZY_HORIZON_NS >= now_coarse_ns());
}

void cl_doorbell_asleep(struct chime_chan *ch, uint32_t sleep_no, uint64_t by_ns, uint64_t from, uint32_t n)
{
	uint64_t half = ((uint64_t)ch->sq.mask + 1) / 2, every = cl_lazy_every(&ch->sq), end = from + n;

	/*
	 * N2: the end of that sleep (or of a later one), stored before its
	 * number; pairs with N1 in the shard's loop. A shard drains before it
	 * fires, so a record needed no earlier than the sleep's end, or a
	 * second from now or later (the heartbeat's pass), can wait: a
	 * keepalive reset, a cancel, an arm a second ahead or a burst of up to
	 * half a ring costs no system call and no wake-up of the shard (an
	 * eventfd write to a sleeping shard costs 13-27 us on this VM). Unless
	 * the records reach a multiple of `every` with more than half the ring
	 * waiting (the one half a ring and one back not yet consumed; half ==
	 * every for a ring of 128 slots or fewer, where the look is skipped),
	 * or another thread's record published behind ours was waiting for
	 * ours (S4): then ring all the same.
	 */
	if (can_wait(by_ns, at_load(ch->wake_ns)) &&
	    (((from + every - 1) & ~(every - 1)) >= end ||
	     (half > every && (end <= half || !chime_sq_waiting(&ch->sq, end - half - 1)))) &&
	    !cl_behind_published(&ch->sq, end))
		return;
	ring(ch, sleep_no);
}

/* ---- broker liveness ---- */

bool cl_broker_gone(struct chime *c, bool probe)
{
	struct pollfd pfd = { .fd = c->sock, .events = POLLRDHUP };
	uint64_t link = at_load_acq(&c->link);  /* L1: the connection this evidence is about */
	int n;

	if (cl_is_dead(c) || (link & 1))
		return true;
	/* H1: plain status word of the control thread; a stop is final. */
	if (at_load_acq(&c->pub->state) == CHIME_BROKER_STOPPED)
		goto gone;
	if (!probe)
		return false;
	/*
	 * After the welcome the broker sends only wake-up bytes, which the
	 * drainer reads; the peer's hang-up (its process gone, fds closed)
	 * shows as POLLRDHUP even with wake-ups still queued ahead of it.
	 */
	n = poll(&pfd, 1, 0);
	if (n <= 0 || !(pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		return false;
gone:
	cl_lost(c, link);
	return true;
}

bool cl_broker_check(struct chime *c, uint64_t now)
{
	/* H2: the control thread stores heartbeat_ns at least every 100 ms (500 ms at rest). */
	uint64_t hb = at_load(&c->pub->heartbeat_ns);
	bool stale = now > hb + 1000000000u;

	/* Relaxed: chime_flush() checks from any thread beside the drainer; a probe more or less is harmless. */
	if (!stale || now - at_load(&c->last_sock_check_ns) < 1000000000u)
		return cl_broker_gone(c, false);
	at_store(&c->last_sock_check_ns, now);
	return cl_broker_gone(c, true);
}
