/* SPDX-License-Identifier: MIT */
/*
 * main.c - chimed: options, signals, daemonizing. The work is in startup.c,
 * control.c (the control thread, which is this main thread) and shard.c.
 *
 * Exit codes: 0 clean stop, 1 start-up or runtime failure, 2 usage error.
 * Without --foreground the process closes what it inherited, forks (before
 * any thread exists) and the parent waits on a pipe: it exits 0 only once
 * the child listens, or with the child's exit code once the child has
 * printed why it failed. The child then logs to syslog and lets go of the
 * starter's stdio, so `chimed 2>&1 | cat` ends when the parent does.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/close_range.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime_config.h"
#include "chime_shm.h"
#include "cliarg.h"
#include "control.h"
#include "discard.h"
#include "log.h"
#include "paths.h"
#include "policy.h"
#include "ring.h"
#include "segment.h"
#include "shard.h"

#define EXIT_USAGE 2

#define MAX_SHARDS_DEFAULT 128u  /* also the SCM_RIGHTS limit: 4 + shards fds <= 253 */

static const char usage_text[] =
"Usage: chimed [OPTION]...\n"
"The chime timer broker: serves timers to local processes through shared memory.\n"
"\n"
"  -s, --socket PATH       listen on PATH (default: $CHIME_SOCKET, else\n"
"                          /run/chime/chime.sock, creating /run/chime)\n"
"  -n, --shards N          shard threads, one timing wheel each (1..128;\n"
"                          default: the CPUs it may run on, at most 128)\n"
"      --spin-us N         stay awake up to N us without work before sleeping\n"
"                          (less while spinning does not pay, none for a while\n"
"                          once a yield gave the CPU away for 1 ms: a busy\n"
"                          host), and wake before a deadline as early as\n"
"                          wake-ups are late, at most N us (max 200)\n"
"                          (-1..10000000, default 50; -1: busy-poll, never\n"
"                          sleep, for dedicated cores)\n"
"      --spin-share PCT    spin with no work at most PCT% of a shard's time\n"
"                          plus 2 us per timer fired (1..100, default 12);\n"
"                          past it, sleep to each deadline\n"
"  -f, --foreground        do not daemonize; log to stderr (systemd runs it so).\n"
"                          Without it chimed forks, returns once it listens,\n"
"                          and logs to syslog (facility daemon)\n"
"      --resolution-us N   wheel resolution in us (1..1000000, default 100)\n"
"      --capacity N        timer nodes per shard (1024..4294967294, default\n"
"                          4194304, at least twice --sq-size; memory is only\n"
"                          touched when used, 64 bytes per timer)\n"
"      --max-clients N     connected clients at most (1..65536, default 256)\n"
"      --max-clients-per-uid N\n"
"                          connected clients of one user at most (0..65536,\n"
"                          default 64; 0: no limit; one being reclaimed\n"
"                          does not count); beyond it chime_open() gets\n"
"                          EUSERS\n"
"      --session-linger S  seconds a named session with no process keeps its\n"
"                          timers before they are reclaimed (0..31536000,\n"
"                          default 3600; 0: at once)\n"
"      --fresh             discard the sessions and timers an earlier broker left\n"
"                          on this socket (by default they are taken over)\n"
"\n";

/* In two: ISO C limits one string literal to 4095 bytes. */
static const char usage_text_more[] =
"Access (root and the broker's own user are always admitted):\n"
"      --allow-uid LIST    also admit these users (names or numbers, commas)\n"
"      --allow-gid LIST    also admit members of these groups (primary or\n"
"                          supplementary)\n"
"      --allow-all         admit any local user (like timerfd)\n"
"      --policy-file FILE  more allow-uid/allow-gid/allow-all lines, and\n"
"                          'session NAME USER' lines reserving session names\n"
"                          (NAME* a prefix) for a user; re-read on SIGHUP\n"
"      --subuid-file FILE  subordinate uids (subuid(5), default /etc/subuid;\n"
"                          '' for none): each owner's count as one user for\n"
"                          the per-uid limits, not as a user each; re-read\n"
"                          on SIGHUP\n"
"      --socket-group NAME the socket is mode 0660 in this group (default: 0666\n"
"                          when others may be admitted, else 0600)\n"
"      --stats-group NAME  the PATH.ctl and PATH.shardN segments (counters,\n"
"                          every client's timers) are readable by this group\n"
"                          (mode 0640); default: the broker's user only (0600)\n"
"\n"
"      --max-timers-per-client N\n"
"                          timers one client may hold (armed or not yet\n"
"                          consumed), counted per shard and rounded up to a\n"
"                          multiple of the shards; beyond it chime_arm() fails\n"
"                          with EDQUOT (default 1048576; 0: no limit)\n"
"      --max-timers-per-uid N\n"
"                          timers the clients of one user may hold together,\n"
"                          named sessions kept for later included, counted the\n"
"                          same way; beyond it chime_arm() fails with EDQUOT\n"
"                          (default: half of --capacity times --shards, or of\n"
"                          what the socket's filesystem holds if less, so that\n"
"                          one user cannot take every timer; a quarter for a\n"
"                          user owning subordinate uids and for each range;\n"
"                          0: no limit)\n"
"      --sq-size N         submission ring slots per client and shard\n"
"                          (power of two, 2..1048576, default 1024)\n"
"      --cq-size N         completion ring slots per client and shard\n"
"                          (power of two, 8..1048576, default 8192)\n"
"      --log-level LEVEL   log messages up to LEVEL: err, warning, notice,\n"
"                          info (default) or debug\n"
"  -v, --verbose           the same as --log-level debug\n"
"  -h, --help              show this help and exit\n"
"  -V, --version           show the version and exit\n"
"\n"
"Files next to the socket: PATH.lock (the running broker's pid), PATH.ctl\n"
"(counters, read by chimestat), PATH.shardN (each shard's wheel) and\n"
"PATH.sessions (the named sessions). SIGTERM or SIGINT stop the broker\n"
"cleanly: attached sessions are parked, and if any session is left, its\n"
"shard files and PATH.sessions stay for the next broker, which takes them\n"
"over (after a crash too); otherwise they are removed. SIGHUP never stops\n"
"it: it reopens the log and re-reads the policy (--allow-*, --policy-file,\n"
"--subuid-file).\n"
"SIGUSR2 restarts it in place, as chimectl restart does.\n"
"\n"
"Exit status: 0 clean stop, 1 start-up or runtime failure, 2 usage error.\n";

enum {
	OPT_SPIN = 256,
	OPT_SPIN_SHARE,
	OPT_RESOLUTION,
	OPT_CAPACITY,
	OPT_MAX_CLIENTS,
	OPT_SQ_SIZE,
	OPT_CQ_SIZE,
	OPT_MAX_TIMERS,
	OPT_MAX_TIMERS_PER_UID,
	OPT_MAX_PER_UID,
	OPT_SESSION_LINGER,
	OPT_ALLOW_UID,
	OPT_ALLOW_GID,
	OPT_ALLOW_ALL,
	OPT_POLICY_FILE,
	OPT_SUBUID_FILE,
	OPT_SOCKET_GROUP,
	OPT_STATS_GROUP,
	OPT_LOG_LEVEL,
	OPT_FRESH,
};

static const struct option long_opts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "shards", required_argument, NULL, 'n' },
	{ "spin-us", required_argument, NULL, OPT_SPIN },
	{ "spin-share", required_argument, NULL, OPT_SPIN_SHARE },
	{ "foreground", no_argument, NULL, 'f' },
	{ "resolution-us", required_argument, NULL, OPT_RESOLUTION },
	{ "capacity", required_argument, NULL, OPT_CAPACITY },
	{ "max-clients", required_argument, NULL, OPT_MAX_CLIENTS },
	{ "sq-size", required_argument, NULL, OPT_SQ_SIZE },
	{ "cq-size", required_argument, NULL, OPT_CQ_SIZE },
	{ "max-timers-per-client", required_argument, NULL, OPT_MAX_TIMERS },
	{ "max-timers-per-uid", required_argument, NULL, OPT_MAX_TIMERS_PER_UID },
	{ "max-clients-per-uid", required_argument, NULL, OPT_MAX_PER_UID },
	{ "session-linger", required_argument, NULL, OPT_SESSION_LINGER },
	{ "allow-uid", required_argument, NULL, OPT_ALLOW_UID },
	{ "allow-gid", required_argument, NULL, OPT_ALLOW_GID },
	{ "allow-all", no_argument, NULL, OPT_ALLOW_ALL },
	{ "policy-file", required_argument, NULL, OPT_POLICY_FILE },
	{ "subuid-file", required_argument, NULL, OPT_SUBUID_FILE },
	{ "socket-group", required_argument, NULL, OPT_SOCKET_GROUP },
	{ "stats-group", required_argument, NULL, OPT_STATS_GROUP },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "fresh", no_argument, NULL, OPT_FRESH },
	{ "verbose", no_argument, NULL, 'v' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ 0 }
};

static void __attribute__((noreturn)) usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void usage_error(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	log_msg(LOG_ERR, "%s (see 'chimed --help')", buf);
	exit(EXIT_USAGE);
}

/*
 * arg is a whole decimal number, an optional '-' (--spin-us -1) and then
 * chime_parse_u64()'s digits, in *v. Not "-0": a sign where the option
 * takes none, which the range check alone let through as 0.
 */
static bool whole_number(const char *arg, long long *v)
{
	bool neg = arg[0] == '-';
	uint64_t u;

	if (chime_parse_u64(arg + neg, &u) < 0 || u > (uint64_t)LLONG_MAX || (neg && u == 0))
		return false;
	*v = neg ? -(long long)u : (long long)u;
	return true;
}

/* A whole decimal number in [lo, hi], or a usage error naming the option. */
static int64_t parse_num(const char *opt, const char *arg, int64_t lo, int64_t hi)
{
	long long v;

	if (!whole_number(arg, &v) || v < lo || v > hi)
		usage_error("invalid value '%.200s' for --%s: expected an integer in %" PRId64 "..%" PRId64,
			    arg, opt, lo, hi);
	return v;
}

static uint32_t parse_pow2(const char *opt, const char *arg, uint32_t lo, uint32_t hi)
{
	long long v;

	if (!whole_number(arg, &v) || v < lo || v > hi || (v & (v - 1)))
		usage_error("invalid value '%.200s' for --%s: expected a power of two in %u..%u",
			    arg, opt, lo, hi);
	return (uint32_t)v;
}

/*
 * --help, --version: their text arrived whole (0), or not (1), said unless
 * the reader went away (EPIPE), as the tools judge it (sr_stdout_check()).
 */
static int stdout_status(void)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return 0;
	if (errno != EPIPE)
		log_errno(LOG_ERR, errno ? errno : EIO, "write to stdout failed");
	return EXIT_FAILURE;
}

/* --allow-uid a --allow-uid b: "a,b" (repeatable options add up). */
static const char *join_list(const char *have, const char *more)
{
	char *j;

	if (!have)
		return more;
	if (asprintf(&j, "%s,%s", have, more) < 0) {
		log_msg(LOG_ERR, "out of memory");
		exit(EXIT_FAILURE);
	}
	return j;       /* lives as long as the process */
}

/* Default socket path; sets *mkdir_parent for the default. */
static void default_socket(char *out, size_t len, bool *mkdir_parent)
{
	/* One host socket for everyone, root or not (its directory made if need be): every client finds it. */
	const char *p = chime_socket_path(NULL, mkdir_parent);

	if ((size_t)snprintf(out, len, "%s", p) >= len)
		usage_error("$CHIME_SOCKET '%.200s' is too long (at most %zu bytes)", p, len - 1);
}

/*
 * `path` made absolute in out: its directory resolved now (realpath(), so
 * that "sub/../f" still names the file once "sub" is removed), its last
 * component kept as it is (a symlink swapped later is followed then). A
 * directory that cannot be resolved: joined to the working directory.
 */
static int absolute_path(const char *path, char *out, size_t len)
{
	char dir[PATH_MAX], real[PATH_MAX], cwd[PATH_MAX];
	const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
	size_t dlen = slash ? (size_t)(slash - path) : 0;
	int n;

	if (slash && dlen < sizeof(dir)) {
		memcpy(dir, path, dlen);
		dir[dlen] = 0;
	} else {
		snprintf(dir, sizeof(dir), "%s", slash ? path : ".");
	}
	if (!*base || !strcmp(base, ".") || !strcmp(base, "..") || !realpath(dlen || !slash ? dir : "/", real)) {
		if (path[0] == '/')
			n = snprintf(out, len, "%s", path);
		else if (getcwd(cwd, sizeof(cwd)))
			n = snprintf(out, len, "%s/%s", cwd, path);
		else
			return -errno;
	} else {
		n = snprintf(out, len, "%s/%s", strcmp(real, "/") ? real : "", base);
	}
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/*
 * Timer nodes the socket's filesystem can hold: its room (a tenth of it
 * kept for its other writers, chime_fs_room()) with what the shard files
 * an earlier broker left hold already, less the shard files' fixed parts
 * (header, key index: --capacity bytes each), but at least the first chunk
 * each start takes whatever the room; UINT64_MAX if it gives no size. The
 * default per-user quota is a share of this where it is less than the
 * slab: half of --capacity x --shards let one user take every node a
 * smaller filesystem (the service's /run on a small host) could give the
 * others (a security audit: 3.1M timers filled a 200 MiB /run).
 */
static uint64_t slab_fits(const struct broker_opts *o)
{
	char dir[sizeof(o->socket_path)], path[sizeof(o->socket_path) + 16];
	uint64_t room = UINT64_MAX, held = 0, fixed, start = shard_start_bytes(o->capacity, &fixed), nodes, least;
	bool found = false;
	struct stat st;
	char *slash;

	/* The socket's directory, or (not made yet: /run/chime) the one it goes in. */
	snprintf(dir, sizeof(dir), "%s", o->socket_path);
	for (int up = 0; up < 2 && !found && (slash = strrchr(dir, '/')); up++) {
		slash[slash == dir] = 0;
		found = stat(dir, &st) == 0;
		if (found)
			room = chime_fs_room(-1, dir);
	}
	if (room == UINT64_MAX || !start)
		return UINT64_MAX;
	for (uint32_t k = 0; k < o->nr_shards; k++)
		if (chime_shard_path(path, sizeof(path), o->socket_path, k) && lstat(path, &st) == 0 &&
		    S_ISREG(st.st_mode))
			held += (uint64_t)st.st_blocks * 512;
	room = room + held < room ? UINT64_MAX - 1 : room + held;
	nodes = room > fixed * o->nr_shards ? (room - fixed * o->nr_shards) / sizeof(struct chime_node) : 0;
	/* a start on a filesystem at its keep line still has this much (shard_init()) */
	least = (start - fixed) / sizeof(struct chime_node) * o->nr_shards;
	return nodes > least ? nodes : least;
}

/* Absolute, so that the daemon can chdir("/") and messages name the real file. */
static void absolutize(char *path, size_t len)
{
	char tmp[PATH_MAX];
	int r = absolute_path(path, tmp, sizeof(tmp));

	if (r == -ENAMETOOLONG || (r == 0 && strlen(tmp) >= len))
		usage_error("socket path '%.200s' is too long as an absolute path (at most %zu bytes)", path, len - 1);
	if (r < 0) {
		log_errno(LOG_ERR, -r, "getcwd");
		exit(EXIT_FAILURE);
	}
	memcpy(path, tmp, strlen(tmp) + 1);
}

/*
 * --policy-file is re-read on SIGHUP, after the daemon's chdir("/"): a
 * relative path is made absolute now (absolute_path()).
 */
static const char *absolute_file(const char *opt, const char *path)
{
	char tmp[PATH_MAX], *abs;
	int r = absolute_path(path, tmp, sizeof(tmp));

	if (r == -ENAMETOOLONG)
		usage_error("--%s: path '%.200s' is too long as an absolute path (at most %d bytes)", opt, path,
			    PATH_MAX - 1);
	if (r < 0) {
		log_errno(LOG_ERR, -r, "--%s '%.200s': cannot make it an absolute path", opt, path);
		exit(EXIT_FAILURE);
	}
	abs = strdup(tmp);
	if (!abs) {
		log_msg(LOG_ERR, "out of memory");
		exit(EXIT_FAILURE);
	}
	return abs;     /* lives as long as the process */
}

/*
 * The discard helper is this file run again (discard.c): "/proc/self/exe"
 * while /proc shows it, which stays this file even once an upgrade has
 * replaced the path; without /proc, the path we were run by, absolute
 * before the daemon's chdir("/").
 */
static const char *helper_exe(void)
{
	static char abs[PATH_MAX];
	const char *run_as = (const char *)getauxval(AT_EXECFN);

	if (access("/proc/self/exe", X_OK) == 0 || !run_as)
		return "/proc/self/exe";
	return absolute_path(run_as, abs, sizeof(abs)) == 0 ? abs : run_as;
}

/*
 * Started with stdin, stdout or stderr closed, our own descriptors (the
 * verdict pipe, the socket) would take those numbers and later be hit by a
 * log line or by detach_stdio()'s dup2. Fill the holes with /dev/null.
 */
static void open_stdio(void)
{
	int fd;

	do {
		fd = open("/dev/null", O_RDWR);
	} while (fd >= 0 && fd <= STDERR_FILENO);
	if (fd > STDERR_FILENO)
		close(fd);
}

/*
 * Close every descriptor above stderr: a daemon must not keep its starter's
 * pipes, sockets or locks alive. Before we open any of ours.
 */
static void close_inherited(void)
{
	if (syscall(SYS_close_range, 3u, ~0u, 0u) == 0)
		return;
	/* Kernels before 5.9: the descriptors a default limit allows. */
	for (int fd = 3; fd < 65536; fd++)
		close(fd);
}

/*
 * Fork; the parent waits for the child's verdict on a pipe and exits with it.
 * Returns the write end of the pipe in the child. `parent_mask`: the signal
 * mask the waiting parent goes back to (so ^C still stops it).
 */
/*
 * The descriptors --max-clients needs: 5 + nr_shards a client (socket, its
 * process's pidfd, three memfds kept for the punch at its end, a doorbell
 * per shard) and 128 of our own.
 */
static uint64_t fds_needed(const struct broker_opts *o)
{
	return (uint64_t)o->max_clients * (5 + o->nr_shards) + 128;
}

/*
 * Grow the descriptor table to `want` entries (at most RLIMIT_NOFILE) now,
 * while the process has one thread. The kernel grows it by doubling when
 * a descriptor lands past its end, and once threads share the table it
 * first waits for an RCU grace period (expand_fdtable()). Any user's busy
 * loops can hold that grace period up: a task at idle priority (the
 * discard thread was one) preempted inside an RCU read section of a punch
 * or a close is not run again for up to a second (until RCU boosts it). The control
 * thread's memfd_create() for the next client waited that long, heartbeat
 * and all: opens of 1.0-10 s in 1 of 47 rounds (3 of 17 under ASan) of
 * hostile/a_starved_discard_helper_does_not_stall_the_control_thread,
 * their stacks in synchronize_rcu() under expand_files(). A table never
 * shrinks: grown here, it is not grown again while the broker keeps
 * within twice what --max-clients needs (the memfds of ended connections
 * wait for the discard helper besides the live ones).
 */
static void fd_table_presize(uint64_t want)
{
	struct rlimit rl;
	int any, fd;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && want > rl.rlim_cur)
		want = rl.rlim_cur;
	if (want < 2 || want > INT_MAX)
		return;
	any = open("/", O_PATH | O_CLOEXEC);
	if (any < 0)
		return;
	/* The lowest free descriptor from want - 1 on: the table grows to hold it. */
	fd = fcntl(any, F_DUPFD_CLOEXEC, (int)(want - 1));
	if (fd >= 0)
		close(fd);
	close(any);
}

static int daemonize(const sigset_t *parent_mask)
{
	int p[2];
	pid_t pid;

	log_stderr_reset();     /* its own descriptor would go with the inherited ones */
	close_inherited();
	log_stderr_setup();
	if (pipe2(p, O_CLOEXEC) < 0) {
		log_errno(LOG_ERR, errno, "pipe");
		exit(EXIT_FAILURE);
	}
	pid = fork();
	if (pid < 0) {
		log_errno(LOG_ERR, errno, "fork");
		exit(EXIT_FAILURE);
	}
	if (pid > 0) {
		unsigned char code = EXIT_FAILURE;
		ssize_t n;

		pthread_sigmask(SIG_SETMASK, parent_mask, NULL);
		close(p[1]);
		do {
			n = read(p[0], &code, 1);
		} while (n < 0 && errno == EINTR);
		if (n != 1) {
			/* Died without a verdict: reap it so its exit code speaks. */
			int st;

			code = EXIT_FAILURE;
			if (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st))
				code = (unsigned char)WEXITSTATUS(st);
		}
		_exit(code);
	}
	close(p[0]);
	if (setsid() < 0)
		log_errno(LOG_WARNING, errno, "setsid");
	/* Segments and the socket get their modes explicitly; nothing else wants group/other write. */
	umask(022);
	return p[1];
}

/*
 * The child listens: tell the parent, then let go of the starter's stdio
 * (a terminal, a pipe someone reads to EOF) and log to syslog from now on.
 */
static void detach_stdio(int verdict_fd)
{
	unsigned char ok = 0;
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);

	if (chdir("/") < 0)
		log_errno(LOG_WARNING, errno, "chdir('/')");
	if (null < 0)
		log_errno(LOG_WARNING, errno, "open('/dev/null'): keeping the starter's stdio");
	log_use_syslog();
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	/* Last: once the parent exits, its starter may look for our lines in syslog. */
	if (write(verdict_fd, &ok, 1) < 0)
		log_errno(LOG_WARNING, errno, "cannot tell the parent process we started");
	close(verdict_fd);
}

/*
 * chimectl restart (SIGUSR2): the broker has stopped, leaving its sessions'
 * files; run chimed again, from the path it was started from (an upgraded
 * binary there is the one that runs), with the same arguments and the
 * signal mask it was started with. It keeps this pid in the foreground;
 * without --foreground it forks again, as any start does.
 */
#define RESTART_ENV "CHIMED_RESTARTED"    /* set by reexec() for the broker it executes */

/*
 * The directory chimed was started in: the daemon has chdir'ed to "/",
 * and the arguments reexec() passes on may name files relative to it
 * (--socket, --policy-file, $CHIME_SOCKET). A path, not a descriptor: a
 * daemon must not hold its starter's file system busy.
 */
static char start_dir[PATH_MAX];

/* The signals the control loop's signalfd takes: blocked in every thread, and across a restart's exec. */
static void loop_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
	sigaddset(set, SIGUSR2);
}

static void __attribute__((noreturn)) reexec(char **argv, const struct broker_opts *o, const sigset_t *mask)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	const char *del = " (deleted)";
	char **args = argv;
	sigset_t exec_mask = *mask, loop;
	int argc = 0;

	if (n <= 0) {
		log_msg(LOG_ERR, "cannot restart: readlink('/proc/self/exe'): %s; stopped instead", strerror(errno));
		exit(EXIT_FAILURE);
	}
	self[n] = 0;
	/* Replaced on disk (an upgrade): the new file at the same path. */
	if ((size_t)n > strlen(del) && !strcmp(self + n - strlen(del), del))
		self[n - strlen(del)] = 0;
	log_msg(LOG_INFO, "executing '%s' again", self);
	/*
	 * The mask it was started with, but the loop's signals stay blocked
	 * through the exec: pending, the new broker's signalfd reads them.
	 * Unblocked, a SIGHUP (systemctl reload) or SIGTERM that came before
	 * the new main() blocked them again took its default action, and the
	 * broker died.
	 */
	loop_signals(&loop);
	sigorset(&exec_mask, &exec_mask, &loop);
	pthread_sigmask(SIG_SETMASK, &exec_mask, NULL);
	if (!start_dir[0] || chdir(start_dir) < 0) {
		/*
		 * Removed since? From "/", with the files this broker uses by
		 * their absolute paths after its own arguments (the last of an
		 * option wins). Its getcwd() would fail in a removed directory.
		 */
		log_msg(LOG_WARNING, "cannot go back to the directory chimed was started in ('%s': %s): "
			"executing it from '/' with the absolute paths of its socket and files",
			start_dir[0] ? start_dir : "unknown", start_dir[0] ? strerror(errno) : "getcwd failed");
		if (chdir("/") < 0)
			log_msg(LOG_WARNING, "chdir('/'): %s", strerror(errno));
		while (argv[argc])
			argc++;
		args = calloc((size_t)argc + 7, sizeof(*args));
		if (args) {
			int k = argc;

			memcpy(args, argv, (size_t)argc * sizeof(*args));
			args[k++] = "--socket";
			args[k++] = (char *)o->socket_path;
			if (o->policy.file) {
				args[k++] = "--policy-file";
				args[k++] = (char *)o->policy.file;
			}
			if (o->policy.subuid_file) {
				args[k++] = "--subuid-file";
				args[k++] = (char *)o->policy.subuid_file;
			}
		} else {
			args = argv;
		}
	}
	/* Same arguments, but a restart hands the sessions over: --fresh was for the first start. */
	setenv(RESTART_ENV, "1", 1);
	execv(self, args);
	log_msg(LOG_ERR, "cannot restart: execv('%s'): %s; stopped instead", self, strerror(errno));
	exit(EXIT_FAILURE);
}

int main(int argc, char **argv)
{
	/* Static: what the options point to (absolute_file(), the lists) lives as long as the process, reachable. */
	static struct broker_opts o = {
		.spin_us = 50,
		.spin_share = 12,
		.resolution_ns = 100000,
		.capacity = 4194304,
		.max_clients = 256,
		.sq_size = 1024,
		.cq_size = 8192,
		.max_timers_per_client = 1048576,
		.max_timers_per_uid = UINT64_MAX,       /* half the capacity, once it is known */
		.max_clients_per_uid = 64,
		.session_linger_s = 3600,
		.socket_gid = (gid_t)-1,
		.stats_gid = (gid_t)-1,
		.policy.subuid_file = "/etc/subuid",
	};
	char err[512];
	bool foreground = false, have_socket = false, restarted;
	size_t subuid_ranges = 0;
	sigset_t old_mask;
	struct broker *b = NULL;
	int c, r, verdict_fd = -1;
	long ncpu;
	sigset_t set;

	/* The segment discard helper: chimed run again by itself (discard.c), and nothing else. */
	if (argc == 2 && strcmp(argv[0], DISCARD_HELPER_NAME) == 0)
		discard_helper_main(argv[1]);
	open_stdio();
	log_stderr_setup();
	{
		cpu_set_t cpus;

		ncpu = broker_cpus(&cpus);
	}
	o.nr_shards = ncpu > MAX_SHARDS_DEFAULT ? MAX_SHARDS_DEFAULT : (uint32_t)ncpu;

	/* getopt's own messages start with argv[0]: "chimed", not the path it was run by. */
	if (argc > 0)
		argv[0] = (char *)"chimed";
	while ((c = getopt_long(argc, argv, "s:n:fvhV", long_opts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!*optarg)
				usage_error("--socket needs a path");
			if (strlen(optarg) >= sizeof(o.socket_path))
				usage_error("socket path '%.200s' is too long (at most %zu bytes)",
					    optarg, sizeof(o.socket_path) - 1);
			snprintf(o.socket_path, sizeof(o.socket_path), "%s", optarg);
			have_socket = true;
			break;
		case 'n':
			o.nr_shards = (uint32_t)parse_num("shards", optarg, 1, MAX_SHARDS_DEFAULT);
			break;
		case OPT_SPIN:
			o.spin_us = parse_num("spin-us", optarg, -1, 10000000);
			break;
		case 'f':
			foreground = true;
			break;
		case OPT_SPIN_SHARE:
			o.spin_share = (uint32_t)parse_num("spin-share", optarg, 1, 100);
			break;
		case OPT_RESOLUTION:
			o.resolution_ns = (uint64_t)parse_num("resolution-us", optarg, 1, 1000000) * 1000u;
			break;
		case OPT_CAPACITY:
			o.capacity = (uint32_t)parse_num("capacity", optarg, 1024, CHIME_NIL - 1);
			break;
		case OPT_MAX_CLIENTS:
			o.max_clients = (uint32_t)parse_num("max-clients", optarg, 1, CHIME_CLIENTS_MAX);
			break;
		case OPT_SQ_SIZE:
			o.sq_size = parse_pow2("sq-size", optarg, CHIME_SQ_MIN, 1u << 20);
			break;
		case OPT_CQ_SIZE:
			o.cq_size = parse_pow2("cq-size", optarg, CHIME_CQ_MIN, 1u << 20);
			break;
		case OPT_MAX_PER_UID:
			o.max_clients_per_uid = (uint32_t)parse_num("max-clients-per-uid", optarg, 0, CHIME_CLIENTS_MAX);
			break;
		case OPT_SESSION_LINGER:
			o.session_linger_s = (uint32_t)parse_num("session-linger", optarg, 0, 365u * 86400u);
			break;
		case OPT_FRESH:
			o.fresh = true;
			break;
		case OPT_ALLOW_UID:
			o.policy.allow_uid = join_list(o.policy.allow_uid, optarg);
			break;
		case OPT_ALLOW_GID:
			o.policy.allow_gid = join_list(o.policy.allow_gid, optarg);
			break;
		case OPT_ALLOW_ALL:
			o.policy.allow_all = true;
			break;
		case OPT_POLICY_FILE:
			if (!*optarg)
				usage_error("--policy-file needs a path");
			o.policy.file = absolute_file("policy-file", optarg);
			break;
		case OPT_SUBUID_FILE:
			o.policy.subuid_file = *optarg ? absolute_file("subuid-file", optarg) : NULL;
			break;
		case OPT_SOCKET_GROUP:
			if (policy_group(optarg, &o.socket_gid, err, sizeof(err)) < 0)
				usage_error("--socket-group: %s", err);
			o.socket_group = optarg;
			break;
		case OPT_STATS_GROUP:
			if (policy_group(optarg, &o.stats_gid, err, sizeof(err)) < 0)
				usage_error("--stats-group: %s", err);
			o.stats_group = optarg;
			break;
		case OPT_MAX_TIMERS:
			o.max_timers_per_client = (uint64_t)parse_num("max-timers-per-client", optarg, 0,
								       INT64_MAX);
			break;
		case OPT_MAX_TIMERS_PER_UID:
			o.max_timers_per_uid = (uint64_t)parse_num("max-timers-per-uid", optarg, 0, INT64_MAX);
			break;
		case OPT_LOG_LEVEL:
			r = log_parse_level(optarg);
			if (r < 0)
				usage_error("invalid value '%.200s' for --log-level: expected err, warning, notice, info or debug",
					    optarg);
			log_max_level = r;
			break;
		case 'v':
			log_max_level = LOG_DEBUG;
			break;
		case 'h':
			fputs(usage_text, stdout);
			fputs(usage_text_more, stdout);
			return stdout_status();
		case 'V':
			printf("chimed %s (shm layout %u)\n", CHIME_VERSION, CHIME_SHM_LAYOUT);
			return stdout_status();
		default:
			/* getopt printed what was wrong. */
			fprintf(stderr, "chimed: see 'chimed --help'\n");
			return EXIT_USAGE;
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%.200s'", argv[optind]);
	restarted = getenv(RESTART_ENV) != NULL;
	if (restarted) {
		/* chimectl restart: its --fresh would discard every session it just handed over. */
		o.fresh = false;
		unsetenv(RESTART_ENV);
	}
	if ((uint64_t)o.sq_size * 2 > o.capacity)
		usage_error("--capacity %u is too small for --sq-size %u (each client holds sq-size nodes per shard)",
			    o.capacity, o.sq_size);
	{
		/*
		 * Unknown users and groups, a bad policy file: a usage error now,
		 * not at the first client. Not a file that could not be read for
		 * want of memory or descriptors, or a disk's error: a start-up
		 * failure (1), as chimed(8) says.
		 */
		r = policy_check(&o.policy, err, sizeof(err), &subuid_ranges);
		if (r == -ENOMEM || r == -EMFILE || r == -ENFILE || r == -EIO) {
			log_msg(LOG_ERR, "%s", err);
			return EXIT_FAILURE;
		}
		if (r < 0)
			usage_error("%s", err);
	}
	if (!have_socket)
		default_socket(o.socket_path, sizeof(o.socket_path), &o.mkdir_parent);
	absolutize(o.socket_path, sizeof(o.socket_path));
	if (o.max_timers_per_uid == UINT64_MAX) {
		uint64_t slab = (uint64_t)o.capacity * o.nr_shards, fits = slab_fits(&o);

		if (fits < slab)
			o.slab_fits = slab = fits;
		/*
		 * Half, and a quarter for a user owning subordinate uids and for
		 * each range: the owner's uid and its range are two users
		 * (policy_account_uid()), and with half each, one person held
		 * every node (a security audit). Decided per user at its attach
		 * (uid_timer_quota()), so a range a reload adds counts too.
		 */
		o.quota_derived = true;
		o.max_timers_per_uid = slab / 2 ? slab / 2 : 1;
		o.max_timers_with_subuids = slab / 4 ? slab / 4 : 1;
	} else {
		o.max_timers_with_subuids = o.max_timers_per_uid;
	}

	/*
	 * Signals: SIGTERM, SIGINT and SIGHUP are taken by the control loop's
	 * signalfd, so they are blocked here, before the fork and before any
	 * thread exists (threads inherit the mask): their default action, death
	 * with files left behind, never runs. A vanished client must never kill
	 * us with SIGPIPE.
	 */
	signal(SIGPIPE, SIG_IGN);
	/* A file-size limit below a shard file (LimitFSIZE=): EFBIG and a message, not death by SIGXFSZ. */
	signal(SIGXFSZ, SIG_IGN);
	/*
	 * Each client costs 5 + nr_shards descriptors (socket, its process's
	 * pidfd, three memfds kept for the punch at its end, a doorbell per
	 * shard; a connection that ended holds its memfds until discard.c's
	 * helper punches them, at most --max-clients-per-uid per user): the
	 * default soft limit of 1024 is too few. Say so at start rather than
	 * refusing clients later with EMFILE.
	 */
	{
		uint64_t need = fds_needed(&o);
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			(void)setrlimit(RLIMIT_NOFILE, &rl);
		}
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
			log_msg(LOG_WARNING, "RLIMIT_NOFILE is %llu, but --max-clients %u with %u shards needs "
				"about %llu descriptors: connections beyond that will be refused "
				"(raise the limit, e.g. LimitNOFILE= in the unit)",
				(unsigned long long)rl.rlim_cur, o.max_clients, o.nr_shards,
				(unsigned long long)need);
	}
	/*
	 * Busy-poll shards on every CPU leave none for clients or the kernel's
	 * own threads, which then take a shard's CPU away for whole time
	 * slices (on a 2-CPU VM, 2 spinning shards and a polling client: p50
	 * 1.5 ms late at the client, against 0.3-0.7 us with one shard).
	 */
	if (o.spin_us < 0 && ncpu > 0 && o.nr_shards >= (uint32_t)ncpu)
		log_msg(LOG_WARNING, "--spin-us -1 with %u shards on the %ld CPUs chimed may run on: a shard spins on "
			"every CPU, so client threads and the kernel take CPU time from the shards and "
			"timers fire late when they do; busy-poll is for dedicated CPUs (--shards %ld "
			"or fewer leaves one free)", o.nr_shards, ncpu, ncpu > 1 ? ncpu - 1 : 1);
	/*
	 * Every connection holds a node per submission slot and shard, armed
	 * or not (the grants its arms take), as far as its own quota's share
	 * of the shard goes (grant_slot()), and they count against its user's
	 * share of the shard: below what --max-clients-per-uid of them hold,
	 * a user's idle connections alone use it up, and the next ones can
	 * arm nothing. Where users have subordinate uids, theirs is the
	 * smaller quota.
	 */
	if (o.max_timers_per_uid && o.max_clients_per_uid) {
		uint64_t quota = subuid_ranges ? o.max_timers_with_subuids : o.max_timers_per_uid;
		uint64_t held = o.sq_size, user_share = shard_share(quota, o.nr_shards);
		uint64_t client_share = (o.max_timers_per_client + o.nr_shards - 1) / o.nr_shards, idle;

		if (o.max_timers_per_client && client_share < held)
			held = client_share;
		idle = (user_share + held - 1) / held;
		if (user_share < o.max_clients_per_uid * held)
			log_msg(LOG_WARNING, "--max-timers-per-uid %llu%s is less than --max-clients-per-uid %u times "
				"what one connection holds: a user's connections hold %llu nodes each before "
				"arming any timer (%s %llu per shard, %u shard%s), so %llu of them use%s up its "
				"quota; %s",
				(unsigned long long)quota,
				!o.quota_derived ? "" : subuid_ranges ? " (the default for a user with "
				"subordinate uids: a quarter of the slab)" : o.slab_fits ? " (the default: half of "
				"what the socket's filesystem holds)" : " (the default: half of --capacity times --shards)",
				o.max_clients_per_uid, (unsigned long long)(held * o.nr_shards),
				held < o.sq_size ? "their share of --max-timers-per-client," : "--sq-size",
				(unsigned long long)held, o.nr_shards, o.nr_shards == 1 ? "" : "s",
				(unsigned long long)idle, idle == 1 ? "s" : "",
				o.quota_derived ? "raise --capacity, set --max-timers-per-uid, or lower "
				"--max-clients-per-uid" : "raise it or lower --max-clients-per-uid");
	}
	loop_signals(&set);
	pthread_sigmask(SIG_BLOCK, &set, &old_mask);
	/* Blocked by the broker that executed us (reexec()), not by whoever started the first. */
	for (int sig = 1; restarted && sig < NSIG; sig++)
		if (sigismember(&set, sig) == 1)
			sigdelset(&old_mask, sig);

	if (!getcwd(start_dir, sizeof(start_dir)))
		start_dir[0] = 0;
	o.helper_exe = helper_exe();
	if (!foreground)
		verdict_fd = daemonize(&old_mask);
	/*
	 * A daemon's restart has the /dev/null its predecessor detached to
	 * for stderr: why it cannot start goes to syslog, or nowhere.
	 */
	if (restarted && verdict_fd >= 0)
		log_use_syslog();
	fd_table_presize(2 * fds_needed(&o));
	/*
	 * Our one child is the discard helper (discard.c), killed and never
	 * waited for: the kernel reaps it. Inherited by a restart's execv(),
	 * so a helper of the broker before it that dies after is reaped too.
	 */
	signal(SIGCHLD, SIG_IGN);

	r = broker_start(&b, &o);
	if (r < 0) {
		if (verdict_fd >= 0) {
			unsigned char code = EXIT_FAILURE;

			(void)!write(verdict_fd, &code, 1);
		}
		return EXIT_FAILURE;
	}
	if (verdict_fd >= 0)
		detach_stdio(verdict_fd);
	r = broker_run(b);
	broker_stop(b);
	if (r < 0)
		return EXIT_FAILURE;
	if (r == 1)
		reexec(argv, &o, &old_mask);
	log_msg(LOG_INFO, "stopped");
	return 0;
}
