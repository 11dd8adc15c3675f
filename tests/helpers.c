/* SPDX-License-Identifier: MIT */
#include "helpers.h"

#include "chime_shm.h"
#include "segment.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int t_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	int r;

	if (!f)
		return -1;
	r = fputs(text, f) < 0 ? -1 : 0;
	if (fclose(f) != 0)
		r = -1;
	return r;
}

/* Up to len - 1 bytes of the file at path into buf, NUL-terminated: how many, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, len - 1) : -1;

	if (fd >= 0)
		close(fd);
	if (n >= 0)
		buf[n] = 0;
	return n;
}

bool t_file_has(const char *path, const char *needle)
{
	static char buf[65536];

	return read_small(path, buf, sizeof(buf)) >= 0 && strstr(buf, needle) != NULL;
}

void t_rmdir_files(const char *dir)
{
	char p[PATH_MAX];
	struct dirent *e;
	DIR *d = opendir(dir);

	if (d) {
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
				snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
				unlink(p);
			}
		closedir(d);
	}
	rmdir(dir);
}

int t_count_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

int t_fds(pid_t pid, unsigned *pidfds)
{
	char dir[64], path[320], to[64];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	*pidfds = 0;
	if (!(d = opendir(dir)))
		return -1;
	while ((e = readdir(d))) {
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		len = readlink(path, to, sizeof(to) - 1);
		to[len > 0 ? len : 0] = 0;
		if (!strcmp(to, "anon_inode:[pidfd]"))
			++*pidfds;
		else
			n++;
	}
	closedir(d);
	return n;
}

/*
 * /dev/shm when it is a tmpfs this process can write and run programs from
 * (t_tool_copy() puts programs in a broker's directory), as chime-bench
 * picks it; else /tmp. Not $XDG_RUNTIME_DIR: it is 0700, and some tests
 * have another user reach into a broker's directory.
 */
static const char *scratch_parent(void)
{
	static const char *parent;
	struct statvfs v;
	const char *fs;
	char buf[32];

	if (!parent)
		parent = chime_seg_dir_in_memory("/dev/shm/.", &fs, buf, sizeof(buf)) == 1 &&
			 statvfs("/dev/shm", &v) == 0 && !(v.f_flag & ST_NOEXEC) &&
			 access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
	return parent;
}

int t_mkdtemp(char *dir, size_t len, const char *prefix)
{
	if ((size_t)snprintf(dir, len, "%s/%s-XXXXXX", scratch_parent(), prefix) >= len) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return mkdtemp(dir) ? 0 : -1;
}

/* The tmpfs mounted last and not yet unmounted: a failed assertion skips t_unmount_tmpfs(). */
static char tmpfs_mounted[PATH_MAX];

static void tmpfs_unmount_at_exit(void)
{
	if (tmpfs_mounted[0])
		t_unmount_tmpfs(tmpfs_mounted);
}

int t_mount_tmpfs(char *dir, size_t len, const char *size)
{
	static bool registered;
	char opts[64];

	snprintf(dir, len, "/tmp/chime-tmpfs-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(opts, sizeof(opts), "size=%s,mode=0755", size);
	if (mount("tmpfs", dir, "tmpfs", 0, opts) < 0) {
		rmdir(dir);
		return -1;
	}
	snprintf(tmpfs_mounted, sizeof(tmpfs_mounted), "%s", dir);
	if (!registered)
		registered = atexit(tmpfs_unmount_at_exit) == 0;
	return 0;
}

void t_unmount_tmpfs(const char *dir)
{
	t_rmdir_files(dir);     /* its rmdir fails while mounted: the one below does it */
	(void)umount2(dir, MNT_DETACH);
	rmdir(dir);
	if (strcmp(dir, tmpfs_mounted) == 0)
		tmpfs_mounted[0] = 0;
}

int64_t t_fill(const char *dir, const char *name, uint64_t bytes)
{
	static char buf[65536];
	char path[PATH_MAX];
	uint64_t n = 0;
	ssize_t w = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	while ((!bytes || n < bytes) && (w = write(fd, buf, sizeof(buf))) > 0)
		n += (uint64_t)w;
	close(fd);
	if (w < 0 && !(bytes == 0 && errno == ENOSPC))
		return -1;
	return (int64_t)n;
}

const char *t_tool_copy(const char *dir, const char *env)
{
	static char path[2][400];
	static int next;
	char cmd[1400], *p = path[next++ % 2];
	const char *src = getenv(env), *base;

	if (!src || !(base = strrchr(src, '/'))) {
		fprintf(stderr, "t_tool_copy: $%s must name the program by its path\n", env);
		return NULL;
	}
	snprintf(p, sizeof(path[0]), "%s%s", dir, base);
	snprintf(cmd, sizeof(cmd),
		 "cp '%s' '%s' && cp -L \"$(dirname '%s')/../libclient/libchime.so.0\" '%s/' && "
		 "chmod a+rx '%s' '%s/libchime.so.0'", src, p, src, dir, p, dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "t_tool_copy: '%s' failed\n", cmd);
		return NULL;
	}
	return p;
}

int t_sock_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

int t_raw_hello(const char *path, const char *session, uint32_t flags, uint64_t limit)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
				 .flags = CHIME_HELLO_SEALS | flags, .limit = limit };
	int fd = t_sock_connect(path), e;

	if (fd < 0)
		return -1;
	if (session)
		snprintf(h.session, sizeof(h.session), "%s", session);
	if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h)) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

#define T_MAX_FDS (CHIME_WELCOME_FIXED_FDS + CHIME_MAX_SHARDS + 1)    /* and the touch table */

int t_answer_offer_as(int fd, enum t_answer how, int *kept, int *nkept)
{
	struct chime_welcome w = { 0 };
	union {
		char buf[CMSG_SPACE(sizeof(int) * T_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct chime_mapped m = { .magic = how == T_ANSWER_MALFORMED ? 0 : CHIME_MAPPED_MAGIC };
	struct cmsghdr *cm;
	int fds[T_MAX_FDS], nfds = 0, r = 0;

	if (recvmsg(fd, &mh, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(w))
		return -EBADMSG;
	cm = CMSG_FIRSTHDR(&mh);
	if (cm && cm->cmsg_type == SCM_RIGHTS) {
		nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		memcpy(fds, CMSG_DATA(cm), (size_t)nfds * sizeof(int));
	}
	if (w.status < 0)
		r = w.status;
	else if (nfds < (int)(CHIME_WELCOME_FIXED_FDS + w.nr_shards))
		r = -EBADMSG;
	for (int i = 1; r == 0 && i < nfds; i++) {
		struct chime_map map;

		/* rw (1), and the touch table (the last, after the doorbells) */
		if (i != 1 && !((w.features & CHIME_WELCOME_F_TOUCH) && i == nfds - 1))
			continue;
		r = chime_seg_map_file(fds[i], true, &map);
		if (r < 0)
			break;
		if (i == 1 && how != T_ANSWER_UNFAULTED)
			(void)chime_seg_populate(map.base, map.size);
		chime_seg_unmap(&map);          /* its pages stay in the memfd */
		if (how == T_ANSWER_SEALED_OPEN)
			r = fcntl(fds[i], F_ADD_SEALS, F_SEAL_SEAL) < 0 ? -errno : 0;
		else if (how != T_ANSWER_UNSEALED)
			r = chime_seg_seal(fds[i], CHIME_SEAL_WRITES);
	}
	if (r == 0 && send(fd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
		r = -errno;
	if (kept) {
		memcpy(kept, fds, (size_t)nfds * sizeof(int));
		*nkept = nfds;
	} else {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
	}
	/* The broker's answer comes once the shards attached it: then it is here, unread. */
	if (r == 0 && poll(&(struct pollfd){ .fd = fd, .events = POLLIN }, 1, 10000) != 1)
		r = -ETIMEDOUT;
	return r;
}

int t_answer_offer(int fd)
{
	return t_answer_offer_as(fd, T_ANSWER_HONEST, NULL, NULL);
}

int t_attach_answer(int fd)
{
	struct chime_welcome w;
	ssize_t n;

	do
		n = recv(fd, &w, sizeof(w), 0);
	while (n == 1);         /* wake-ups */
	if (n <= 0)
		return -ECONNRESET;
	return n == (ssize_t)sizeof(w) && w.magic == CHIME_HELLO_MAGIC ? w.status : -EBADMSG;
}

bool t_sock_accepts(const char *path)
{
	int fd = t_sock_connect(path);

	if (fd >= 0)
		close(fd);
	return fd >= 0;
}

/*
 * Broker pid at `sock` has started: its control segment says RUNNING. The
 * socket alone does not say it: it listens before the shards take over an
 * earlier broker's files, and a client that connects then waits for them.
 */
bool t_broker_running(const char *sock, int pid)
{
	struct chime_ctl ctl;
	char path[PATH_MAX];
	bool ok;
	int fd;

	snprintf(path, sizeof(path), "%s.ctl", sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ok = pread(fd, &ctl, sizeof(ctl), 0) == (ssize_t)sizeof(ctl) && ctl.pid == pid &&
	     ctl.state == CHIME_BROKER_RUNNING;
	close(fd);
	return ok;
}

/*
 * The directories t_chimed_start() made and no t_chimed_stop() removed yet:
 * a failed assertion ends the test before its stop, and each left a
 * directory (t_mkdtemp()) with a shard file, sparse, up to hundreds of MB.
 * The test process removes them as it exits; not a child it forked.
 */
#define T_DIRS 16
static char t_dirs[T_DIRS][sizeof(((struct t_chimed *)0)->dir)];
static pid_t t_dirs_pid;

static void t_dirs_remove(void)
{
	if (getpid() != t_dirs_pid)
		return;
	for (unsigned i = 0; i < T_DIRS; i++)
		if (t_dirs[i][0]) {
			t_rmdir_files(t_dirs[i]);
			t_dirs[i][0] = 0;
		}
}

static void t_dirs_note(const char *dir, bool made)
{
	if (t_dirs_pid != getpid()) {
		memset(t_dirs, 0, sizeof(t_dirs));     /* a forked child's copy: not its own */
		if (!t_dirs_pid)
			atexit(t_dirs_remove);
		t_dirs_pid = getpid();
	}
	for (unsigned i = 0; i < T_DIRS; i++)
		if (made ? !t_dirs[i][0] : !strcmp(t_dirs[i], dir)) {
			if (made)
				snprintf(t_dirs[i], sizeof(t_dirs[i]), "%s", dir);
			else
				t_dirs[i][0] = 0;
			return;
		}
}

int t_chimed_start(struct t_chimed *b, const char *sock, const char *extra)
{
	const char *chimed = getenv("CHIMED");
	char cmd[1024], prefix[32];
	uint64_t t0;
	pid_t p;

	memset(b, 0, sizeof(*b));
	if (!chimed) {
		fprintf(stderr, "t_chimed_start: $CHIMED must name the chimed binary\n");
		return -1;
	}
	if (sock) {
		snprintf(b->sock, sizeof(b->sock), "%s", sock);
	} else {
		snprintf(prefix, sizeof(prefix), "chime-t-%d", (int)getpid());
		if (t_mkdtemp(b->dir, sizeof(b->dir), prefix) < 0) {
			perror("t_chimed_start: mkdtemp");
			return -1;
		}
		b->own_dir = 1;
		t_dirs_note(b->dir, true);
		snprintf(b->sock, sizeof(b->sock), "%s/chime.sock", b->dir);
	}
	snprintf(cmd, sizeof(cmd), "exec '%s' --foreground --socket '%s' %s %s", chimed, b->sock,
		 T_SUBUIDS_NONE(extra), extra ? extra : "");
	p = fork();
	if (p < 0) {
		perror("t_chimed_start: fork");
		return -1;
	}
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);       /* never outlive the test */
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	b->pid = p;
	for (t0 = now_ns(); !t_broker_running(b->sock, p) || !t_sock_accepts(b->sock); usleep(1000)) {
		int st;

		if (waitpid(p, &st, WNOHANG) == p) {
			b->pid = 0;
			fprintf(stderr, "t_chimed_start: '%s' exited during start-up (status %#x)\n", cmd, st);
			t_chimed_stop(b, 0);
			return -1;
		}
		if (now_ns() - t0 > UINT64_C(10000000000)) {
			fprintf(stderr, "t_chimed_start: '%s' did not listen within 10 s\n", cmd);
			t_chimed_stop(b, SIGKILL);
			return -1;
		}
	}
	return 0;
}

int t_chimed_restart(struct t_chimed *b, int sig, const char *extra)
{
	struct t_chimed keep = *b;
	char sock[sizeof(b->sock)];
	int r;

	if (b->pid > 0) {
		int st;

		if (sig)
			kill(b->pid, sig);
		(void)waitpid(b->pid, &st, 0);
		b->pid = 0;
	}
	snprintf(sock, sizeof(sock), "%s", b->sock);
	/* A dead broker's socket can accept for a moment (its io_uring goes after it): not the new one's. */
	for (int i = 0; i < 2000 && t_sock_accepts(sock); i++)
		usleep(1000);
	r = t_chimed_start(b, sock, extra);
	/* The directory is still ours: the last stop removes it. */
	b->own_dir = keep.own_dir;
	memcpy(b->dir, keep.dir, sizeof(b->dir));
	return r;
}

int t_chimed_stop(struct t_chimed *b, int sig)
{
	int st = -1;

	if (b->pid > 0) {
		if (sig)
			kill(b->pid, sig);
		if (waitpid(b->pid, &st, 0) != b->pid)
			st = -1;
		b->pid = 0;
	}
	if (b->own_dir) {
		t_rmdir_files(b->dir);
		t_dirs_note(b->dir, false);
		b->own_dir = 0;
	}
	return st;
}

/* The state letter of a /proc/.../stat file (after "PID (COMM)", which may hold anything), or 0. */
static char proc_state(const char *path)
{
	char buf[512], *p;

	if (read_small(path, buf, sizeof(buf)) <= 0)
		return 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : 0;
}

bool t_alive(int pid)
{
	siginfo_t si = { 0 };
	char path[64], st;

	if (pid <= 0)
		return false;
	if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0)
		return si.si_pid == 0;  /* ours: nothing to reap yet */
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	st = proc_state(path);
	return st && st != 'Z' && st != 'X';
}

uint64_t t_nodes(const char *sock, unsigned states)
{
	uint64_t n = 0;

	for (unsigned k = 0;; k++) {
		char path[PATH_MAX];
		struct stat st;
		const struct chime_shard_seg *h;
		const struct chime_wheel *w;
		const struct chime_node *nodes;
		void *m;
		int fd;

		snprintf(path, sizeof(path), "%s.shard%u", sock, k);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			break;
		if (fstat(fd, &st) < 0 || st.st_size < (off_t)sizeof(*h)) {
			close(fd);
			break;
		}
		m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (m == MAP_FAILED)
			break;
		h = m;
		w = (const struct chime_wheel *)((const char *)m + h->wheel_off);
		nodes = (const struct chime_node *)((const char *)w + w->slab_off);
		for (uint32_t i = 0; i < __atomic_load_n(&w->high_water, __ATOMIC_ACQUIRE) && i < w->capacity; i++)
			n += states >> __atomic_load_n(&nodes[i].state, __ATOMIC_RELAXED) & 1u;
		munmap(m, (size_t)st.st_size);
	}
	return n;
}

uint64_t t_nodes_settle(const char *sock, unsigned states, uint64_t want)
{
	uint64_t n = 0;

	for (int i = 0; i < 600 && (n = t_nodes(sock, states)) != want; i++)
		usleep(5000);
	return n;
}

uint32_t t_beat_ms_becomes(const char *sock, uint32_t want, unsigned within_ms)
{
	uint64_t end = now_ns() + within_ms * UINT64_C(1000000);
	char path[PATH_MAX];
	uint32_t ms = 0;
	int fd;

	snprintf(path, sizeof(path), "%s.ctl", sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	while (pread(fd, &ms, sizeof(ms), (off_t)offsetof(struct chime_ctl, beat_ms)) == (ssize_t)sizeof(ms) &&
	       ms != want && now_ns() < end)
		usleep(1000);
	close(fd);
	return ms;
}

void t_at_rest_within(const char *sock, unsigned within_ms)
{
	(void)t_beat_ms_becomes(sock, 450, within_ms);
}

int t_clock_watch(void)
{
	int fd = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);

	if (fd >= 0 && clock_set_watch_arm(fd) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

bool t_clock_was_set(int fd)
{
	uint64_t n;

	if (fd < 0 || read(fd, &n, sizeof(n)) >= 0 || errno != ECANCELED)
		return false;
	(void)clock_set_watch_arm(fd);  /* armed again: ready for the next set */
	return true;
}

int t_thread_named(int pid, const char *comm)
{
	char path[320], name[64];
	struct dirent *e;
	DIR *d;
	int tid = -1;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	while (d && tid < 0 && (e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;       /* "..": /proc/PID/comm, the main thread's name, and tid "0" */
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", pid, e->d_name);
		f = fopen(path, "r");
		if (f && fgets(name, sizeof(name), f) && strncmp(name, comm, strlen(comm)) == 0 &&
		    name[strlen(comm)] == '\n')
			tid = atoi(e->d_name);
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	return tid;
}

int t_child_named(int ppid, const char *comm)
{
	char path[320], buf[512], *p;
	struct dirent *e;
	DIR *d = opendir("/proc");
	int pid = -1;

	while (d && pid < 0 && (e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		/* "PID (COMM) S PPID": COMM may hold anything, ")" included */
		if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) && atoi(p + 4) == ppid &&
		    (p = strchr(buf, '(')) && strncmp(p + 1, comm, strlen(comm)) == 0 && p[1 + strlen(comm)] == ')')
			pid = atoi(e->d_name);
		fclose(f);
	}
	if (d)
		closedir(d);
	return pid;
}

unsigned t_threads_prefixed(int pid, const char *prefix)
{
	char path[320], comm[64];
	struct dirent *e;
	unsigned n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	while (d && (e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", pid, e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, prefix, strlen(prefix)))
			n++;
		fclose(f);
	}
	if (d)
		closedir(d);
	return n;
}

int t_lingering_tcp_socket(int linger_s, int *peer, int *listener)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct linger lg = { .l_onoff = 1, .l_linger = linger_s };
	static char fill[65536];
	socklen_t al = sizeof(a);
	int t;

	*listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*listener < 0 || bind(*listener, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(*listener, 1) < 0 ||
	    getsockname(*listener, (struct sockaddr *)&a, &al) < 0)
		return -1;
	t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (t < 0 || (connect(t, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS))
		return -1;
	*peer = accept(*listener, NULL, NULL);
	if (*peer < 0)
		return -1;
	/* Until both buffers are full: the FIN waits behind the data, which waits for a window. */
	for (int k = 0; k < 50; k++) {
		while (write(t, fill, sizeof(fill)) > 0)
			;
		usleep(2000);
	}
	return setsockopt(t, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0 ? t : -1;
}

bool t_thread_asleep(int pid, int tid)
{
	char path[96];

	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", pid, tid);
	return proc_state(path) == 'S';
}

int t_thread_hold(int tid)
{
	int st;

	if (ptrace(PTRACE_SEIZE, tid, 0, 0) < 0 || ptrace(PTRACE_INTERRUPT, tid, 0, 0) < 0)
		return -errno;
	if (waitpid(tid, &st, __WALL) != tid)
		return -errno;
	return WIFSTOPPED(st) ? 0 : -ECHILD;
}

int t_thread_release(int tid)
{
	return ptrace(PTRACE_DETACH, tid, 0, 0) < 0 ? -errno : 0;
}

/* SIGRTMIN + 3, caught by a no-op without SA_RESTART: ends t_thread_step()'s wait. */
static void step_timeout(int sig)
{
	(void)sig;
}

/* This thread's (the tracer's) timer for t_thread_step(): made once per thread; false if it cannot be. */
static bool step_timer(timer_t *out)
{
	static __thread timer_t timer;
	static __thread int made;       /* 1 made, -1 failed */
	struct sigevent ev = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGRTMIN + 3 };
	struct sigaction sa = { .sa_handler = step_timeout };

	if (!made) {
		ev._sigev_un._tid = (pid_t)syscall(SYS_gettid);     /* sigev_notify_thread_id, before glibc 2.35 names it */
		sigemptyset(&sa.sa_mask);
		made = sigaction(SIGRTMIN + 3, &sa, NULL) == 0 && timer_create(CLOCK_MONOTONIC, &ev, &timer) == 0 ? 1 : -1;
	}
	*out = timer;
	return made == 1;
}

/*
 * The tracer waits for the step blocked in waitpid(), woken by the
 * tracee's stop, not polling: its loop of sched_yield() and 100 us sleeps
 * took a CPU from the tracee it waited for, and on a loaded host (the CI,
 * four such cases at once) a step took 1.5 ms instead of 33 us, so a stop
 * reached its 5 s bound before the park it stepped through stored
 * anything. A timer of 2 s (a signal to this thread) ends the wait on a
 * tracee asleep in a system call.
 */
int t_thread_step(int tid)
{
	static __thread int pending;
	const struct itimerspec two = { .it_value = { .tv_sec = 2 } }, off = { 0 };
	int st, sig = pending;
	uint64_t t0 = now_ns();
	timer_t timer;
	bool timed = step_timer(&timer);
	pid_t w;

	pending = 0;
	if (ptrace(PTRACE_SINGLESTEP, tid, 0, (void *)(long)sig) < 0)
		return -errno;
	for (;;) {
		int e;

		if (timed)
			(void)timer_settime(timer, 0, &two, NULL);
		w = timed ? waitpid(tid, &st, __WALL) : waitpid(tid, &st, __WALL | WNOHANG);
		e = errno;
		if (timed)
			(void)timer_settime(timer, 0, &off, NULL);
		if (w == tid)
			break;
		if (w < 0 && e != EINTR)
			return -e;
		if (now_ns() - t0 >= UINT64_C(2000000000)) {
			/* Asleep in a system call: stop it there, as t_thread_hold() does. */
			if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) < 0 || waitpid(tid, &st, __WALL) != tid)
				return -errno;
			return -ETIMEDOUT;
		}
		if (!timed)
			usleep(100);    /* no timer here: polled, as before */
	}
	if (!WIFSTOPPED(st))
		return -ECHILD;
	/* A signal for the thread (not our trap, nor a ptrace event stop): it goes with the next step. */
	if (WSTOPSIG(st) != SIGTRAP && (st >> 16) == 0)
		pending = WSTOPSIG(st);
	return 0;
}

void t_missed(struct t_misses *m, const char *fmt, ...)
{
	size_t len = strlen(m->what);
	va_list ap;

	m->n++;
	if (len + 2 >= sizeof(m->what))
		return;
	snprintf(m->what + len, sizeof(m->what) - len, "; ");
	va_start(ap, fmt);
	vsnprintf(m->what + len + 2, sizeof(m->what) - len - 2, fmt, ap);
	va_end(ap);
}

FILE *t_next_anon_fdinfo(int pid, DIR *d, const char *kind, int *fd)
{
	char path[320], target[64], want[64];
	struct dirent *e;

	snprintf(want, sizeof(want), "anon_inode:%s", kind);
	while ((e = readdir(d))) {
		ssize_t len;
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/fd/%s", pid, e->d_name);
		len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		if (strcmp(target, want) != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/fdinfo/%s", pid, e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		*fd = atoi(e->d_name);
		return f;
	}
	return NULL;
}

int t_ring_polls(int pid)
{
	char path[64], line[256];
	int n = 0, rings = 0, fd;
	FILE *f;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((f = t_next_anon_fdinfo(pid, d, "[io_uring]", &fd))) {
		bool in_list = false;

		rings++;
		/* "PollList:", then one indented "op=N, ..." line per armed poll. */
		while (fgets(line, sizeof(line), f)) {
			if (!strncmp(line, "PollList:", 9))
				in_list = true;
			else if (in_list && strstr(line, "op="))
				n++;
			else if (in_list)
				in_list = false;
		}
		fclose(f);
	}
	closedir(d);
	return rings ? n : -1;
}

int t_open_fds(int pid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	return t_count_files(path);
}

int t_open_fds_settled(int pid)
{
	int n = t_open_fds(pid), same = 0;

	for (int i = 0; i < 200 && same < 5; i++) {
		int m;

		usleep(20 * 1000);
		m = t_open_fds(pid);
		same = m == n ? same + 1 : 0;
		n = m;
	}
	return n;
}

int t_kill_after_syscall(int pid, int tid, long nr, unsigned ms)
{
	uint64_t t0 = now_ns();
	long last = -1;
	int st, sig = 0, r = t_thread_hold(tid);

	if (r < 0)
		return r;
	if (ptrace(PTRACE_SETOPTIONS, tid, 0, (void *)(long)PTRACE_O_TRACESYSGOOD) < 0) {
		r = -errno;
		(void)t_thread_release(tid);
		return r;
	}
	for (;;) {
		struct __ptrace_syscall_info si;

		if (now_ns() - t0 > (uint64_t)ms * 1000000u) {
			(void)t_thread_release(tid);
			return -ETIMEDOUT;
		}
		if (ptrace(PTRACE_SYSCALL, tid, 0, (void *)(long)sig) < 0 || waitpid(tid, &st, __WALL) != tid)
			return -errno;
		sig = 0;
		if (!WIFSTOPPED(st))
			return -ECHILD;
		if (WSTOPSIG(st) != (SIGTRAP | 0x80)) {
			/* A signal for the thread (not a ptrace event stop): it goes with the next resume. */
			if (WSTOPSIG(st) != SIGTRAP && (st >> 16) == 0)
				sig = WSTOPSIG(st);
			continue;
		}
		if (ptrace(PTRACE_GET_SYSCALL_INFO, tid, (void *)sizeof(si), &si) <= 0)
			return -errno;
		if (si.op == PTRACE_SYSCALL_INFO_ENTRY) {
			last = (long)si.entry.nr;
		} else if (si.op == PTRACE_SYSCALL_INFO_EXIT && last == nr && si.exit.rval >= 0) {
			kill(pid, SIGKILL);
			return 0;
		}
	}
}

/* The NUL-terminated string at addr in traced process pid, cut at len - 1 bytes. */
static void peek_string(int pid, uint64_t addr, char *buf, size_t len)
{
	size_t n = 0;

	while (n + 1 < len) {
		long w;

		errno = 0;
		w = ptrace(PTRACE_PEEKDATA, pid, (void *)(uintptr_t)(addr + n), 0);
		if (errno)
			break;
		for (size_t i = 0; i < sizeof(w) && n + 1 < len; i++, n++) {
			buf[n] = (char)((unsigned long)w >> (8 * i));
			if (!buf[n])
				return;
		}
	}
	buf[n] = 0;
}

int t_chimed_killed_at(struct t_chimed *b, const char *sock, const char *extra, long nr, const char *suffix)
{
	const char *chimed = getenv("CHIMED");
	size_t sl = strlen(suffix);
	bool creating = false;
	char cmd[1024], prefix[32];
	uint64_t t0;
	int st, sig = 0;
	pid_t p;

	memset(b, 0, sizeof(*b));
	if (!chimed)
		return -EINVAL;
	if (sock) {
		snprintf(b->sock, sizeof(b->sock), "%s", sock);
	} else {
		snprintf(prefix, sizeof(prefix), "chime-t-%d", (int)getpid());
		if (t_mkdtemp(b->dir, sizeof(b->dir), prefix) < 0)
			return -errno;
		b->own_dir = 1;
		t_dirs_note(b->dir, true);
		snprintf(b->sock, sizeof(b->sock), "%s/chime.sock", b->dir);
	}
	snprintf(cmd, sizeof(cmd), "exec '%s' --foreground --socket '%s' %s", chimed, b->sock, extra ? extra : "");
	p = fork();
	if (p < 0)
		return -errno;
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (ptrace(PTRACE_TRACEME, 0, 0, 0) < 0)
			_exit(126);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	/* The exec's SIGTRAP: traced from here, every system call of the main thread. */
	if (waitpid(p, &st, 0) != p || !WIFSTOPPED(st) ||
	    ptrace(PTRACE_SETOPTIONS, p, 0, (void *)(long)(PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACEEXEC |
							   PTRACE_O_EXITKILL)) < 0) {
		kill(p, SIGKILL);
		waitpid(p, &st, 0);
		return -EPERM;
	}
	for (t0 = now_ns();;) {
		struct __ptrace_syscall_info si;

		if (now_ns() - t0 > UINT64_C(10000000000) || ptrace(PTRACE_SYSCALL, p, 0, (void *)(long)sig) < 0 ||
		    waitpid(p, &st, __WALL) != p || !WIFSTOPPED(st))
			break;
		sig = 0;
		if (WSTOPSIG(st) != (SIGTRAP | 0x80)) {
			/* An event stop (the exec) goes on; a signal is passed on. */
			if (WSTOPSIG(st) != SIGTRAP && (st >> 16) == 0)
				sig = WSTOPSIG(st);
			continue;
		}
		if (ptrace(PTRACE_GET_SYSCALL_INFO, p, (void *)sizeof(si), &si) <= 0)
			break;
		if (si.op == PTRACE_SYSCALL_INFO_ENTRY) {
			char path[PATH_MAX];
			size_t pl;

			creating = false;
			if (nr != SYS_openat && (long)si.entry.nr == nr) {
				/* Before it is done: the path is its first argument (unlink, truncate). */
				peek_string(p, si.entry.args[0], path, sizeof(path));
				pl = strlen(path);
				if (pl >= sl && !strcmp(path + pl - sl, suffix)) {
					kill(p, SIGKILL);
					waitpid(p, &st, __WALL);
					return 0;
				}
				continue;
			}
			if (si.entry.nr != SYS_openat || nr != SYS_openat)
				continue;
			/* An unnamed file, named later (O_TMPFILE: its path is the directory's), is that file too. */
			if ((si.entry.args[2] & O_TMPFILE) == O_TMPFILE) {
				creating = true;
				continue;
			}
			if (!(si.entry.args[2] & O_CREAT))
				continue;
			peek_string(p, si.entry.args[1], path, sizeof(path));
			pl = strlen(path);
			creating = pl >= sl && !strcmp(path + pl - sl, suffix);
		} else if (si.op == PTRACE_SYSCALL_INFO_EXIT && creating && si.exit.rval >= 0) {
			kill(p, SIGKILL);
			waitpid(p, &st, __WALL);
			return 0;
		}
	}
	kill(p, SIGKILL);
	waitpid(p, &st, __WALL);
	return -ETIMEDOUT;
}

int t_pin_threads(int pid, int cpu)
{
	char path[64];
	struct dirent *e;
	cpu_set_t set;
	int n = 0;
	DIR *d;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && sched_setaffinity(atoi(e->d_name), sizeof(set), &set) == 0)
			n++;
	closedir(d);
	return n;
}

#if defined(__SANITIZE_ADDRESS__)
/*
 * LeakSanitizer asks for these once it checks. Criterion's runner, with
 * --jobs above 1, leaks a 48-byte block per worker it starts
 * (libcriterion.so.3+0x1a332, the only frame: the library has no frame
 * pointers), and the run aborts at its exit. The runner runs no test: a
 * test runs in a worker, a new image of this executable that BoxFort
 * starts with BXFI_MAP in its environment. So the suppression is the
 * runner's alone; in a worker, whose leaks are the tests' own and have
 * criterion in every stack, it would hide them.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
	return getenv("BXFI_MAP") ? "" : "leak:libcriterion.so.3\n";
}
#endif
