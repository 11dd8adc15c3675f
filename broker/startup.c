/* SPDX-License-Identifier: MIT */
/*
 * startup.c - chimed's start-up, in the order broker_start() takes it: the
 * lock file, a stale socket, the listening socket, an earlier broker's
 * sessions (restart.c), the control and public segments, the io_uring and
 * signal descriptors, and the shards (each shard's restore in a thread of
 * its own). broker_stop() (control.c) undoes any prefix of it.
 */
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "chime_config.h"
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

/* Linux 6.16's; glibc headers before 2.42 lack it (alpha, mips, parisc and sparc number it otherwise). */
#if !defined(SO_PASSRIGHTS) && !defined(__alpha__) && !defined(__mips__) && !defined(__hppa__) && !defined(__sparc__)
#define SO_PASSRIGHTS 83
#endif

#define LISTEN_BACKLOG 64

static pid_t lock_owner(int fd)
{
	char buf[32] = { 0 };
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	return n > 0 ? (pid_t)atoi(buf) : 0;
}

/*
 * A lock file that is not ours: another user put it in a socket directory
 * others can write (a shared /tmp), before us. Whoever has it open can
 * flock() it at will (now, or after our crash, the file staying) and keep
 * every broker on this socket out; its pid inside is its owner's to write.
 * Refused, named with its owner, as shard and sessions files are.
 */
static int lock_not_ours(const struct broker *b, const struct stat *st)
{
	if (!S_ISREG(st->st_mode)) {
		log_msg(LOG_ERR, "lock file '%s' is not a regular file (uid %u's): not using it; remove it",
			b->lock_path, (unsigned)st->st_uid);
		return -EPERM;
	}
	return log_file_not_ours("lock file", b->lock_path, st,
				 "remove it, or put the socket in a directory only the broker's user can write");
}

/*
 * Why the lock file or the socket could not be created (or the lock file
 * written). Nothing of an earlier broker's was read or written yet: a
 * sessions file there keeps its sessions and their timers for a start
 * that can write the directory, and the refusal says so, as the sessions
 * file's own refusals do. No room (or no inode) is what a restart on a
 * full filesystem finds once another writer took what the stop freed
 * (the lock file, the socket, the control segment).
 */
static const char *dir_hint(const struct broker *b, int e)
{
	char sess[PATH_MAX + 16];
	struct stat st;
	bool kept;

	if (e == ENOENT)
		return "does the directory exist?";
	if (e != EACCES && e != EROFS && e != ENOSPC && e != EDQUOT)
		return NULL;
	snprintf(sess, sizeof(sess), "%s.sessions", b->o.socket_path);
	kept = lstat(sess, &st) == 0;
	if (e == ENOSPC || e == EDQUOT)
		return kept ? SEG_NO_ROOM_HINT "; not started: the sessions and their timers stay in the files, for "
			      "a start once there is room" : SEG_NO_ROOM_HINT;
	if (!kept)
		return "is the directory writable?";
	return e == EROFS ? "not started: the sessions and their timers stay in the files, for a start once the "
			    "filesystem is mounted read-write" :
	       "is the directory writable? not started: the sessions and their timers stay in the files, for a "
	       "start that can write there";
}

/*
 * "<socket>.lock", flock()ed for the broker's life: two brokers starting on
 * one path race safely, and the loser learns the winner's pid. A lock file
 * unlinked by a stopping broker between our open and our flock is detected
 * (inode changed) and retried, so two brokers never each hold a lock.
 * Mode 0600: flock() needs only a descriptor open for reading, and any
 * user who could open it (it was 0644) could hold it from a broker's crash
 * on (the file stays) and keep every later broker out. For the same
 * reason one that is there is used only if it is a regular file of ours
 * or root's (chime_seg_ours()): it is checked before it is opened, and
 * again, by its descriptor, after (swapped in between).
 */
static int take_lock(struct broker *b)
{
	const char *sock = b->o.socket_path;

	for (int tries = 0; tries < 10; tries++) {
		struct stat a, p;
		char pid[32];
		int fd = open(b->lock_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);

		if (fd < 0 && errno == EEXIST) {
			if (lstat(b->lock_path, &p) == 0 && (!S_ISREG(p.st_mode) || !chime_seg_ours(&p)))
				return lock_not_ours(b, &p);
			/* No O_CREAT: fs.protected_regular would refuse it on a file of another's. */
			fd = open(b->lock_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
			if (fd < 0 && errno == ENOENT)
				continue;       /* removed by a stopping broker in between: again */
		}
		if (fd < 0) {
			int e = errno;  /* dir_hint() looks for the sessions file */

			return log_errno_hint(LOG_ERR, e, dir_hint(b, e), "cannot create lock file '%s'", b->lock_path);
		}
		if (fstat(fd, &a) < 0) {
			int e = errno;

			close(fd);
			return log_errno(LOG_ERR, e, "fstat('%s')", b->lock_path);
		}
		if (!S_ISREG(a.st_mode) || !chime_seg_ours(&a)) {
			close(fd);
			return lock_not_ours(b, &a);
		}
		/* One an earlier version left 0644: ours again (a failure here shows at the flock). */
		(void)fchmod(fd, 0600);
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			pid_t owner = lock_owner(fd);

			close(fd);
			if (e == EWOULDBLOCK) {
				if (owner > 0)
					log_msg(LOG_ERR, "socket '%s' is in use by a running broker (pid %d)",
						sock, (int)owner);
				else
					log_msg(LOG_ERR, "socket '%s' is in use by a running broker", sock);
				return -EADDRINUSE;
			}
			return log_errno(LOG_ERR, e, "flock('%s')", b->lock_path);
		}
		if (stat(b->lock_path, &p) < 0 || a.st_ino != p.st_ino || a.st_dev != p.st_dev) {
			close(fd);      /* unlinked under us by a stopping broker: again */
			continue;
		}
		snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
		if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, strlen(pid), 0) < 0) {
			int e = errno;

			/* Ours and locked (checked just above): remove it, as a stop does, so nothing is left. */
			(void)unlink(b->lock_path);
			close(fd);
			return log_errno_hint(LOG_ERR, e, dir_hint(b, e), "cannot write lock file '%s'", b->lock_path);
		}
		b->lock_fd = fd;
		return 0;
	}
	return log_errno(LOG_ERR, EAGAIN, "lock file '%s' keeps changing", b->lock_path);
}

/* With the lock held: a live socket is an error, a dead one is taken over. */
#define STALE_SOCKET_WAIT_MS 2000
static int clear_stale_socket(struct broker *b)
{
	const char *path = b->o.socket_path;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		return log_errno(LOG_ERR, errno, "cannot stat socket '%s'", path);
	}
	if (!S_ISSOCK(st.st_mode)) {
		log_msg(LOG_ERR, "'%s' exists and is not a socket (remove it or choose another --socket)", path);
		return -EEXIST;
	}
	memcpy(sa.sun_path, path, strlen(path));
	/*
	 * A broker that has just died can leave its socket accepting for a
	 * moment: its io_uring, which holds the listening socket, is torn down
	 * after the process is gone. We hold the lock, so no broker runs here:
	 * give it STALE_SOCKET_WAIT_MS to go.
	 */
	for (int tries = 0;; tries++) {
		fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return log_errno(LOG_ERR, errno, "socket(AF_UNIX)");
		r = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno == EAGAIN ? 0 : errno;
		close(fd);
		/* A stream or datagram socket bound there: another program's, live. */
		if (r == EPROTOTYPE) {
			log_msg(LOG_ERR, "socket '%s' is in use by another process (a socket of another type, not "
				"chimed's: choose another --socket)", path);
			return -EADDRINUSE;
		}
		if (r)
			break;
		if (tries * 10 >= STALE_SOCKET_WAIT_MS) {
			log_msg(LOG_ERR, "socket '%s' is in use by another process", path);
			return -EADDRINUSE;
		}
		usleep(10 * 1000);
	}
	if (r != ECONNREFUSED && r != ENOENT)
		return log_errno(LOG_ERR, r, "cannot probe socket '%s'", path);
	if (unlink(path) < 0 && errno != ENOENT)
		return log_errno(LOG_ERR, errno, "cannot remove stale socket '%s'", path);
	log_msg(LOG_INFO, "took over stale socket '%s'", path);
	return 0;
}

/*
 * The control and shard segments hold every client's counters, pids and
 * timers: readable by the broker's user, root and --stats-group only. Clients
 * never need them by name: what they use is handed to them by descriptor.
 */
static mode_t seg_mode(const struct broker *b)
{
	return b->o.stats_gid != (gid_t)-1 ? 0640 : 0600;
}

/*
 * The public segment: state, heartbeat and the shards' sleep numbers, the
 * only broker state a client reads by itself. A sealed memfd handed to
 * clients read-only: they can neither write it nor read anyone's counters.
 */
static int pub_setup(struct broker *b)
{
	uint64_t size = chime_pub_size(b->o.nr_shards);
	int r = chime_seg_memfd("chime-public", size, &b->pub_fd, &b->pub_map);

	if (r < 0)
		return log_errno(LOG_ERR, r, "public segment (%llu bytes)", (unsigned long long)size);
	b->pub = b->pub_map.base;
	b->pub->state = CHIME_BROKER_STARTING;
	b->pub->nr_shards = b->o.nr_shards;
	b->pub->heartbeat_ns = now_ns();
	b->pub->shards_off = sizeof(struct chime_pub);
	/* The wall clock's offset, before any shard bases a timer on it (wall.h). */
	(void)wall_hook_read();
	wall_publish(wall_offset_now());
	b->pub->wall_off = wall_published();
	/* Its clock, for clients to compare theirs with (a time namespace's is shifted). */
	b->pub->mono_off = chime_timens_monotonic();
	chime_seg_publish(&b->pub->hdr, CHIME_SEG_PUBLIC, size);
	r = chime_seg_seal(b->pub_fd, CHIME_SEAL_WRITES);
	if (r < 0)
		return log_errno(LOG_ERR, r, "sealing the public segment");
	return 0;
}

static int ctl_setup(struct broker *b)
{
	struct chime_ctl_geom g = { .nr_shards = b->o.nr_shards, .max_clients = b->o.max_clients };
	struct chime_ctl *c;
	int r;

	r = chime_ctl_layout(&g);
	if (r < 0)
		return log_errno(LOG_ERR, r, "control segment layout (%u shards, %u clients)",
				 g.nr_shards, g.max_clients);
	if (!g.client_stats_off) {
		/* A segment.c that predates the per-client stats table: place it after the clients. */
		uint64_t off = g.clients_off + (uint64_t)g.max_clients * sizeof(struct chime_client_ctl);

		off = (off + 127) & ~(uint64_t)127;
		g.client_stats_off = off;
		off += (uint64_t)g.max_clients * g.nr_shards * sizeof(struct chime_client_stats);
		g.size = (off + 4095) & ~(uint64_t)4095;
	}
	/* Reserved whole (it is small): no page of it can SIGBUS us on a full filesystem. */
	r = chime_seg_file(b->ctl_path, g.size, g.size, seg_mode(b), &b->ctl_fd, &b->ctl_map);
	if (r == 0 && b->o.stats_gid != (gid_t)-1 && fchown(b->ctl_fd, (uid_t)-1, b->o.stats_gid) < 0)
		return log_errno_hint(LOG_ERR, errno, GROUP_HINT(errno), "cannot give '%s' to group %u (--stats-group)",
				      b->ctl_path, (unsigned)b->o.stats_gid);
	if (r == -ENOSPC || r == -EDQUOT)
		return log_errno_hint(LOG_ERR, r, SEG_NO_ROOM_HINT, "cannot reserve %llu KiB for the control segment '%s'",
				      (unsigned long long)(g.size >> 10), b->ctl_path);
	if (r < 0)
		return log_errno(LOG_ERR, r, "cannot create control segment '%s' (%llu bytes)",
				 b->ctl_path, (unsigned long long)g.size);
	r = pub_setup(b);
	if (r < 0)
		return r;
	c = b->ctl = b->ctl_map.base;
	c->state = CHIME_BROKER_STARTING;
	c->wall_off = wall_published();
	c->pid = (int32_t)getpid();
	c->nr_shards = b->o.nr_shards;
	c->max_clients = b->o.max_clients;
	c->start_ns = now_ns();
	c->heartbeat_ns = c->start_ns;
	c->resolution_ns = b->o.resolution_ns;
	c->spin_us = b->o.spin_us;
	c->spin_share = b->o.spin_share;
	c->sq_size = b->o.sq_size;
	c->cq_size = b->o.cq_size;
	c->shard_capacity = b->o.capacity;
	snprintf(c->version, sizeof(c->version), "%s", CHIME_VERSION);
	c->shards_off = g.shards_off;
	c->clients_off = g.clients_off;
	c->client_stats_off = g.client_stats_off;
	/* wall_now_ns(): pub_setup() above has read the test hook's shift already. */
	c->start_realtime_ns = wall_now_ns();
	c->mono_off = b->pub->mono_off;         /* for the tools, as the public segment's for clients */
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		((struct chime_shard_ctl *)chime_at(&b->ctl_map, g.shards_off))[i].stats.next_deadline_ns = UINT64_MAX;
	b->ctl_clients = chime_at(&b->ctl_map, g.clients_off);
	/* Magic last (release): a reader that sees it sees a laid-out segment. */
	chime_seg_publish(&c->hdr, CHIME_SEG_CONTROL, g.size);
	return 0;
}

/* Linux 6.6's; older headers (Debian 12's) lack it. Its number on these, not on alpha or mips. */
#if !defined(SYS_fchmodat2) && (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__) || \
				defined(__arm__) || defined(__riscv))
#define SYS_fchmodat2 452
#endif

/*
 * Set the mode of the inode an O_PATH descriptor names, whatever its path
 * names now: through the descriptor's /proc/self/fd link (as glibc's
 * fchmodat(AT_SYMLINK_NOFOLLOW) does), else (no /proc mounted) with
 * fchmodat2(AT_EMPTY_PATH), Linux 6.6. Neither: -ENOSYS.
 */
static int fd_chmod(int fd, mode_t mode)
{
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (chmod(proc, mode) == 0)
		return 0;
	if (errno != ENOENT)
		return -errno;
#ifdef SYS_fchmodat2
	if (syscall(SYS_fchmodat2, fd, "", mode, AT_EMPTY_PATH) == 0)
		return 0;
	if (errno != ENOSYS && errno != EINVAL)
		return -errno;
#endif
	return -ENOSYS;
}

/*
 * A socket whose mode admits other users is no use to them if a directory
 * above it does not let them search it (a private mktemp -d is 0700):
 * their chime_open() fails EACCES, which reads as the policy's refusal.
 * Said, not refused: the operator may mean to open the directory later.
 * A directory others may search, or, with --socket-group, its group,
 * passes; ACLs are not read.
 */
static void socket_reach_warn(const struct broker *b, mode_t mode)
{
	char dir[PATH_MAX], *cut;
	struct stat st;

	/* Only root and the broker's user admitted (whatever --socket-group gives the mode): none to warn of. */
	if (mode == 0600 || !policy_is_open(&b->policy) || !realpath(b->o.socket_path, dir))
		return;
	while ((cut = strrchr(dir, '/')) != NULL) {
		cut[cut == dir] = '\0';        /* "/a/b" -> "/a", "/a" -> "/" */
		if (stat(dir, &st) == 0 && !(st.st_mode & S_IXOTH) &&
		    !(b->o.socket_gid != (gid_t)-1 && st.st_gid == b->o.socket_gid && (st.st_mode & S_IXGRP))) {
			log_msg(LOG_WARNING, "users the policy admits cannot reach socket '%s': directory '%s' "
				"(mode %04o, uid %u) does not let them search it, and their chime_open() fails "
				"EACCES; chmod o+x it%s", b->o.socket_path, dir, (unsigned)(st.st_mode & 07777),
				(unsigned)st.st_uid, b->o.socket_gid != (gid_t)-1 ? " (or g+x for --socket-group)" : "");
			return;
		}
		if (cut == dir)
			return;
	}
}

/*
 * Who may connect at all is the policy's to decide (hello_answer()), but the
 * socket's mode keeps out those it would refuse anyway: 0660 and its group
 * with --socket-group, 0666 when other users may be admitted, else 0600.
 * Set at the bind and at every reload (SIGHUP), on the socket this broker
 * bound (b->sock_st) and nothing else: in a directory others may write
 * (not sticky), one can remove the socket and put a link to any file
 * there, and a chown() and chmod() of the path followed it at the next
 * reload (a root broker gave root's files to --socket-group, or to
 * everyone 0666; a service's broker its own live shard file, every
 * user's timers). So the path is opened O_PATH | O_NOFOLLOW, checked, and
 * changed through that descriptor. Without /proc on a kernel before 6.6,
 * the mode is set by the path after the check (a window of microseconds).
 */
int socket_access(struct broker *b)
{
	const char *path = b->o.socket_path;
	mode_t mode = b->o.socket_gid != (gid_t)-1 ? 0660 : policy_is_open(&b->policy) ? 0666 : 0600;
	int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC), r = 0;
	struct stat st;

	if (fd < 0 && errno != ENOENT && errno != ELOOP)
		return log_errno(LOG_ERR, errno, "cannot open socket '%s' to set its mode", path);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) || !b->sock_st.st_ino ||
	    st.st_dev != b->sock_st.st_dev || st.st_ino != b->sock_st.st_ino) {
		if (fd >= 0)
			close(fd);
		log_msg(LOG_ERR, "'%s' is not the socket this broker bound (removed or replaced): its group and "
			"mode are left as they are", path);
		return -ESTALE;
	}
	if (b->o.socket_gid != (gid_t)-1 && fchownat(fd, "", (uid_t)-1, b->o.socket_gid, AT_EMPTY_PATH) < 0) {
		r = log_errno_hint(LOG_ERR, errno, GROUP_HINT(errno), "cannot give socket '%s' to group %u (--socket-group)",
				   path, (unsigned)b->o.socket_gid);
	} else if ((r = fd_chmod(fd, mode)) == -ENOSYS) {
		r = chmod(path, mode) < 0 ? log_errno(LOG_ERR, errno, "chmod('%s', %04o)", path, (unsigned)mode) : 0;
	} else if (r < 0) {
		r = log_errno(LOG_ERR, -r, "chmod('%s', %04o)", path, (unsigned)mode);
	}
	close(fd);
	if (r == 0)
		socket_reach_warn(b, mode);
	return r;
}

/*
 * The socket file, unless it is another one now: this broker's files were
 * removed while it ran and another broker listens at the path (a socket's
 * descriptor does not name its file: its inode, taken at the bind, does).
 */
void socket_unlink(struct broker *b)
{
	struct stat st;

	if (lstat(b->o.socket_path, &st) == 0 && st.st_dev == b->sock_st.st_dev && st.st_ino == b->sock_st.st_ino)
		unlink(b->o.socket_path);
}

static int listen_setup(struct broker *b)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = b->o.socket_path;
	int r;

	memcpy(sa.sun_path, path, strlen(path));
	b->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (b->listen_fd < 0)
		return log_errno(LOG_ERR, errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
	/*
	 * No descriptors from clients, before anyone can connect: the option
	 * is copied to each connection as it is queued, and a sender's
	 * SCM_RIGHTS is EPERM. A descriptor in a message we read (the hello,
	 * whose recv drops what came with it) or in one left unread when we
	 * close the connection is put by the control thread, its last
	 * reference often: the close runs there. A TCP socket with SO_LINGER,
	 * its peer never reading, held the control thread in tcp_close() for
	 * as long as the sender chose, heartbeat and every handshake with it
	 * (a stall audit: the whole 5 s linger; a longer one is the
	 * watchdog's kill). Linux 6.16 and later; before, what a client
	 * sends is received with room for it and closed on the closer's
	 * threads, and so is every client socket, whose queue may hold more
	 * (close_sent_fds(), close_aside() in control.c): what waits there
	 * is a thread of ours, which nothing waits for.
	 */
#ifdef SO_PASSRIGHTS
	if (setsockopt(b->listen_fd, SOL_SOCKET, SO_PASSRIGHTS, &(int){ 0 }, sizeof(int)) < 0)
		log_errno(LOG_INFO, errno, "setsockopt(SO_PASSRIGHTS) (Linux 6.16): descriptors clients send are "
			  "taken and closed on the closer threads instead");
#endif
	if (bind(b->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;  /* dir_hint() looks for the sessions file */

		return log_errno_hint(LOG_ERR, e, dir_hint(b, e), "cannot bind socket '%s'", path);
	}
	b->listening = true;    /* from here on, stop unlinks it (socket_unlink()) */
	if (stat(path, &b->sock_st) < 0)
		memset(&b->sock_st, 0, sizeof(b->sock_st));
	r = socket_access(b);
	if (r < 0)
		return r;
	/*
	 * A short queue: it is one for every user, in arrival order, and one
	 * user connecting and closing in a loop keeps it full. Each queued
	 * connection costs the control thread an accept and a refusal (tens
	 * of us), so with SOMAXCONN (4096) another user's chime_open() waited
	 * ~110 ms. A connect that finds it full blocks until there is room,
	 * within chime_open()'s 10 s: a burst of opens waits, none fails.
	 */
	if (listen(b->listen_fd, LISTEN_BACKLOG) < 0)
		return log_errno(LOG_ERR, errno, "listen('%s')", path);
	b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return 0;
}

static int ring_setup(struct broker *b)
{
	sigset_t set;
	int r;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR2);
	b->sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (b->sig_fd < 0)
		return log_errno(LOG_ERR, errno, "signalfd");
	b->notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (b->notify_fd < 0)
		return log_errno(LOG_ERR, errno, "eventfd");
	b->wall_fd = timerfd_create(CLOCK_REALTIME, TFD_CLOEXEC | TFD_NONBLOCK);
	if (b->wall_fd < 0)
		return log_errno(LOG_ERR, errno, "timerfd_create(CLOCK_REALTIME)");
	r = io_uring_queue_init(RING_ENTRIES, &b->ring, 0);
	if (r < 0)
		return log_errno_hint(LOG_ERR, r, URING_HINT(r), "io_uring setup (%u entries)", RING_ENTRIES);
	b->ring_ok = true;
	r = aside_start(&b->closer, "chimed-closer", -1, CLOSER_THREADS);
	if (r < 0)
		log_errno(LOG_WARNING, r, "no thread for closing client descriptors: the control thread closes them");
	return 0;
}

/* One shard's shard_init(), in a thread of its own (shards_setup()). */
struct shard_setup {
	struct broker *b;
	struct shard_cfg cfg;
	struct shard_session *sessions;         /* cfg.sessions, ours to free */
	pthread_t thr;
	bool threaded;
	int r;
};

static void *shard_setup_main(void *arg)
{
	struct shard_setup *ss = arg;

	ss->r = shard_init(&ss->b->shards[ss->cfg.idx], &ss->cfg, ss->b->o.socket_path);
	return NULL;
}

/*
 * Wait for a shard's setup thread, pinging systemd's watchdog every
 * heartbeat meanwhile. `chimectl restart` is a reload to systemd, whose
 * watchdog runs on through it, and the restore it ends with (about 0.4 s
 * per 4M timers here) sent no ping: a big enough --capacity would outlast
 * WatchdogSec= and have the broker killed halfway through. The pings stop
 * after SETUP_PING_NS in all (*watched_hb counts heartbeats), so that a
 * setup that hangs is still the watchdog's to catch.
 */
#define SETUP_PING_NS (UINT64_C(300) * 1000000000u)

static void setup_join(struct shard_setup *ss, uint32_t *watched_hb)
{
	uint64_t ping_at = now_ns() + HEARTBEAT_NS;

	/*
	 * Polled with pthread_tryjoin_np() in 1 ms naps, as shard.c's
	 * join_by(): TSan knows that join, and not pthread_clockjoin_np(),
	 * whose return it does not take for one: every start of a TSan chimed
	 * reported the setup's results read below as a race (tests/tsan_*).
	 */
	while (pthread_tryjoin_np(ss->thr, NULL) == EBUSY) {
		uint64_t now = now_ns();

		if (now >= ping_at) {
			ping_at = now + HEARTBEAT_NS;
			if ((uint64_t)++*watched_hb * HEARTBEAT_NS <= SETUP_PING_NS)
				notify_watchdog(now, HEARTBEAT_NS);
		}
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
}

int broker_cpus(cpu_set_t *set)
{
	long n;

	if (sched_getaffinity(0, sizeof(*set), set) == 0 && CPU_COUNT(set) > 0)
		return CPU_COUNT(set);
	n = sysconf(_SC_NPROCESSORS_ONLN);
	n = n < 1 ? 1 : n > CPU_SETSIZE ? CPU_SETSIZE : n;
	CPU_ZERO(set);
	for (long i = 0; i < n; i++)
		CPU_SET((int)i, set);
	return (int)n;
}

/* The (i mod count)-th CPU of set, which holds count of them. */
static int nth_cpu(const cpu_set_t *set, int count, uint32_t i)
{
	int want = (int)(i % (uint32_t)count);

	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, set) && want-- == 0)
			return cpu;
	return -1;
}

static int shards_setup(struct broker *b)
{
	cpu_set_t cpus;
	int ncpu = broker_cpus(&cpus);
	struct shard_setup *su;
	int r = 0;

	b->shards = calloc(b->o.nr_shards, sizeof(*b->shards));
	b->reserve_failed_logged = calloc(b->o.nr_shards, sizeof(*b->reserve_failed_logged));
	su = calloc(b->o.nr_shards, sizeof(*su));
	if (!b->shards || !b->reserve_failed_logged || !su) {
		free(su);
		return log_errno(LOG_ERR, ENOMEM, "shards");
	}
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		b->shards[i].seg_fd = b->shards[i].doorbell = -1;
	for (uint32_t i = 0; i < b->o.nr_shards; i++) {
		struct shard_session *sessions = restart_shard_sessions(b, i);

		su[i] = (struct shard_setup){
			.b = b,
			.sessions = sessions,
			.cfg = {
				.idx = i,
				.capacity = b->o.capacity,
				.max_clients = b->o.max_clients,
				.quota = shard_share(b->o.max_timers_per_client, b->o.nr_shards),
				.resolution_ns = b->o.resolution_ns,
				.spin_us = b->o.spin_us,
				.spin_share = b->o.spin_share,
				.seg_mode = seg_mode(b),
				.seg_gid = b->o.stats_gid,
				.ctl = b->ctl,
				.pub = b->pub,
				.notify_fd = b->notify_fd,
				.resting = &b->resting,
				.sessions = sessions,
				.sq_size = b->o.sq_size,
			},
		};
		if (b->restoring && !sessions) {
			r = log_errno(LOG_ERR, ENOMEM, "sessions of shard %u", i);
			goto out;
		}
	}
	/*
	 * Every shard sets itself up (and restores what an earlier broker
	 * left: about 0.4 s per 4M timers here) at once, each in a thread:
	 * they share nothing but the control segment's blocks, one each.
	 * Shard after shard, a host with many full shards kept its clients
	 * waiting for the sum. A thread that cannot be had runs inline.
	 */
	notify_watchdog(now_ns(), HEARTBEAT_NS);        /* after an exec, the new process's first */
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		su[i].threaded = pthread_create(&su[i].thr, NULL, shard_setup_main, &su[i]) == 0;
	for (uint32_t i = 0, watched = 0; i < b->o.nr_shards; i++) {
		if (su[i].threaded)
			setup_join(&su[i], &watched);
		else
			shard_setup_main(&su[i]);
		if (su[i].r < 0 && r == 0)
			r = su[i].r;
	}
out:
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		free(su[i].sessions);
	free(su);
	if (r < 0)
		return r;       /* each shard said why; broker_start() says what is kept */
	b->ctl->sessions_unadmitted = b->sessions_unadmitted;
	b->ctl->sessions_damaged = b->sessions_damaged;
	restart_watch_holders(b);       /* the shards' threads not started: their carried counts are still ours */
	for (uint32_t i = 0; i < b->o.nr_shards; i++) {
		b->ctl->shards_lost += b->shards[i].file_lost;
		r = shard_start(&b->shards[i], nth_cpu(&cpus, ncpu, i));
		if (r < 0)
			return r;
	}
	/* Leftovers of an earlier broker with more shards would confuse the tools. */
	(void)restart_remove_shard_files(b, b->o.nr_shards, false);
	return 0;
}

int broker_start(struct broker **out, const struct broker_opts *o)
{
	struct broker *b = calloc(1, sizeof(*b));
	struct chime_client_geom *g;
	int r;

	if (!b)
		return log_errno(LOG_ERR, ENOMEM, "broker");
	b->o = *o;
	b->lock_fd = b->listen_fd = b->ctl_fd = b->pub_fd = b->sig_fd = b->notify_fd = b->spare_fd = -1;
	b->wall_fd = -1;
	b->sess.fd = -1;
	b->scan.fd = -1;
	snprintf(b->lock_path, sizeof(b->lock_path), "%s.lock", o->socket_path);
	snprintf(b->ctl_path, sizeof(b->ctl_path), "%s.ctl", o->socket_path);

	g = &b->geom;
	g->nr_shards = o->nr_shards;
	g->sq_size = o->sq_size;
	g->cq_size = o->cq_size;
	r = chime_client_layout(g);
	if (r < 0) {
		log_errno(LOG_ERR, r, "client segment layout (%u shards, sq %u, cq %u)",
			  o->nr_shards, o->sq_size, o->cq_size);
		goto fail;
	}
	b->clients = calloc(o->max_clients, sizeof(*b->clients));
	b->acking = calloc(o->max_clients, sizeof(*b->acking));
	b->rec_stale = calloc(o->max_clients, sizeof(*b->rec_stale));
	if (!b->clients || !b->acking || !b->rec_stale) {
		r = log_errno(LOG_ERR, ENOMEM, "client table");
		goto fail;
	}
	for (uint32_t i = 0; i < o->max_clients; i++)
		b->clients[i].held_fd = b->clients[i].holder_pidfd = -1;
	r = discard_start(&b->discard, o->helper_exe);
	if (r < 0) {
		r = log_errno(LOG_ERR, -r, "cannot start the segment discard helper (chimed-discard)");
		goto fail;
	}
	if (o->mkdir_parent) {
		char dir[sizeof(o->socket_path)];
		char *slash;

		snprintf(dir, sizeof(dir), "%s", o->socket_path);
		slash = strrchr(dir, '/');
		if (slash && slash != dir) {
			*slash = 0;
			if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
				int err = errno;

				/* The default path: a user other than root tried chimed without --socket. */
				r = log_errno_hint(LOG_ERR, err, err == EACCES ? "only root may create the default "
						   "socket's directory, as chime.tmpfiles does for the service: give "
						   "--socket PATH in a directory of your own" : NULL,
						   "cannot create directory '%s'", dir);
				goto fail;
			}
		}
	}
	{
		char buf[32];
		const char *fs;

		/*
		 * The shard files hold every timer and sit next to the socket. On
		 * a disk filesystem the kernel writes them back to it, and each
		 * chunk the slab grows by costs more (1M first arms at 229-254 ns
		 * against 113-208 on tmpfs here): worth a word, not a refusal.
		 */
		if (chime_seg_dir_in_memory(o->socket_path, &fs, buf, sizeof(buf)) == 0)
			log_msg(LOG_WARNING, "the directory of '%s' is on %s, not tmpfs: the timers' segment files "
				"there are written back to disk and grow slower; a socket on a tmpfs "
				"(such as /dev/shm, or /run where it is one) avoids both",
				o->socket_path, fs);
		/*
		 * mincore() tells a shard which pages of a client's touch table
		 * the client wrote; a system call filter that refuses it (systemd
		 * 252's @system-service does not hold it) made every keepalive
		 * reset a ring record, silently (a packaging audit).
		 */
		{
			static unsigned char probe[2];
			int res = chime_seg_resident(probe, 1, probe + 1);

			if (res < 0)
				log_msg(LOG_WARNING, "mincore() is refused: %s (a system call filter?): the shards "
					"cannot tell which pages of a client's touch table it wrote, so every "
					"keepalive reset is sent as a ring record", strerror(-res));
		}
		/* Clients of other users trust a broker that is root or owns the socket's directory. */
		if (chime_broker_trusted(o->socket_path, geteuid(), (uid_t)-1) == 0)
			log_msg(LOG_WARNING, "the directory of '%s' is not this broker's user's (uid %u): other "
				"users' clients will not trust it (chime_open() gives them EPERM), since anyone "
				"who can write there could listen in its place; put the socket in a directory "
				"its user owns (the service's /run/chime is)", o->socket_path, (unsigned)geteuid());
	}
	{
		char err[512], desc[512];

		r = policy_load(&b->policy, &o->policy, err, sizeof(err));
		if (r < 0) {
			log_msg(LOG_ERR, "%s", err);
			goto fail;
		}
		policy_describe(&b->policy, desc, sizeof(desc));
		log_msg(LOG_INFO, "admitting %s", desc);
	}
	/*
	 * The socket listens before the shards take over what an earlier
	 * broker left: a restore of full shards takes a while (about 0.4 s
	 * per 4M timers here, the shards at once), and a client that connects
	 * meanwhile waits in the queue, its hello answered once it is done,
	 * instead of finding no socket. A session's chime_close() reconnects
	 * within 1 s to hand its last records over (chime_close(3)): before,
	 * that second had to hold the restore too, and a slower one lost them.
	 */
	if ((r = take_lock(b)) < 0 || (r = clear_stale_socket(b)) < 0 || (r = listen_setup(b)) < 0 ||
	    (r = restart_load(b)) < 0 || (r = ctl_setup(b)) < 0 || (r = ring_setup(b)) < 0 ||
	    (r = shards_setup(b)) < 0)
		goto fail;
	if ((r = restart_save(b)) < 0) {
		broker_stop(b);         /* it said what is kept */
		return r;
	}
	at_store_rel(&b->ctl->state, CHIME_BROKER_RUNNING);
	at_store_rel(&b->pub->state, CHIME_BROKER_RUNNING);
	*out = b;
	return 0;
fail:
	/*
	 * The lines before said what was taken over, and that is not lost:
	 * said after a failure of any step, not only of the shards' (a full
	 * filesystem refused the control segment after "taking over", and
	 * nothing said the sessions were kept: a storage audit).
	 */
	if (b->restoring)
		log_msg(LOG_ERR, "not started: the sessions taken over and their timers stay in the files, for a "
			"broker that can start");
	broker_stop(b);
	return r;
}
