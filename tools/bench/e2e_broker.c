/* SPDX-License-Identifier: MIT */
/*
 * e2e_broker.c - chime-bench e2e: the broker under test and its counters,
 * and the helpers every phase uses. See e2e.h.
 */
#include <chime.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chime_shm.h"
#include "client.h"        /* wait_applied(): the connection's rings (white box) */
#include "e2e.h"
#include "segment.h"

/* ------------------------------------------------------------------------ */
/* small helpers                                                              */
/* ------------------------------------------------------------------------ */

void sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / NS_PER_S), .tv_nsec = (long)(ns % NS_PER_S) };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

void sleep_until(uint64_t t_ns)
{
	struct timespec ts = { .tv_sec = (time_t)(t_ns / NS_PER_S), .tv_nsec = (long)(t_ns % NS_PER_S) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Percentile q (0..1) of a sorted array: the smallest value >= a fraction q of the samples. */
uint64_t pct(const uint64_t *a, size_t n, double q)
{
	double x = q * (double)n;
	size_t i = (size_t)x;

	if (n == 0)
		return 0;
	/* nearest rank, ceil(q n): floor(q n) + 1 made the p99 of 100 values their max */
	if ((double)i < x)
		i++;
	i = i ? i - 1 : 0;
	return a[i < n ? i : n - 1];
}

const char *fmt_count(char *buf, size_t len, uint64_t n)
{
	if (n >= 1000000 && n % 1000000 == 0)
		snprintf(buf, len, "%" PRIu64 "M", n / 1000000);
	else if (n >= 1000 && n % 1000 == 0)
		snprintf(buf, len, "%" PRIu64 "k", n / 1000);
	else
		snprintf(buf, len, "%" PRIu64, n);
	return buf;
}

/*
 * Zeroed, and its pages faulted in now: a big calloc is fresh mmap'ed
 * memory, and the timed loops that fill the bench's own arrays (ids,
 * timers, figures) would otherwise pay its first touches, which are the
 * bench's cost, not the contender's (a chime_arm() writes 8 bytes of ids,
 * a fault every 512 arms). Memory figures are unchanged: each reads its
 * RSS before it allocates.
 */
void *xcalloc(size_t n, size_t sz)
{
	unsigned char *p = calloc(n ? n : 1, sz);
	size_t len = (n ? n : 1) * sz;

	if (!p) {
		fprintf(stderr, "%s: out of memory (%zu x %zu bytes)\n", bench_prog, n, sz);
		exit(1);
	}
	for (size_t off = 0; off < len; off += 4096)
		((volatile unsigned char *)p)[off] = 0;
	return p;
}

/* Arm a timerfd at an absolute CLOCK_MONOTONIC deadline (the baseline's arm and re-arm). */
int tfd_set(int fd, uint64_t deadline_ns)
{
	struct itimerspec its = {
		.it_value = { .tv_sec = (time_t)(deadline_ns / NS_PER_S), .tv_nsec = (long)(deadline_ns % NS_PER_S) },
	};

	return timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, NULL) < 0 ? -errno : 0;
}

/* Raise RLIMIT_NOFILE to hold `want` fds; returns how many timerfds fit. */
size_t fd_room(size_t want)
{
	struct rlimit rl;
	rlim_t need = (rlim_t)want + 256;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	if (rl.rlim_cur < need) {
		struct rlimit nl = { .rlim_cur = need, .rlim_max = rl.rlim_max > need ? rl.rlim_max : need };

		if (setrlimit(RLIMIT_NOFILE, &nl) < 0) {
			nl.rlim_cur = nl.rlim_max = rl.rlim_max;
			(void)setrlimit(RLIMIT_NOFILE, &nl);
		}
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	return rl.rlim_cur > 256 + 64 ? (size_t)(rl.rlim_cur - 256 - 64) : 0;
}

int g_problems;

/* ------------------------------------------------------------------------ */
/* the broker: a private chimed, or the one at --socket; its counters         */
/* ------------------------------------------------------------------------ */

/* Sums over the shards of the counters this bench reads. */
static int find_chimed(char *out, size_t len)
{
	static const char *const rel[] = { "../broker/chimed", "chimed", "../sbin/chimed" };
	char exe[PATH_MAX];
	const char *env = getenv("CHIMED");
	ssize_t n;
	char *slash;

	if (env && *env) {
		snprintf(out, len, "%s", env);
		return access(out, X_OK) == 0 ? 0 : -errno;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n < 0)
		return -errno;
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (!slash)
		return -ENOENT;
	*slash = '\0';
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		if ((size_t)snprintf(out, len, "%s/%s", exe, rel[i]) >= len)
			continue;
		if (access(out, X_OK) == 0)
			return 0;
	}
	return -ENOENT;
}

/*
 * The header copied, not read where it is used: the segment's file may
 * shrink under the mapping (an external broker's directory is anyone's),
 * and only reads through sr_guard() survive that.
 */
int broker_map_ctl(struct broker *b)
{
	struct sr_snap snap;
	int r = sr_open(&b->sr, b->sock);

	if (r == 0) {
		r = sr_snapshot(&b->sr, &snap);
		if (r < 0)
			sr_close(&b->sr);
	}
	if (r < 0) {
		char msg[PATH_MAX + 256];

		sr_strerror(&b->sr, r, msg, sizeof(msg));
		bench_error("%s", msg);
		return -1;
	}
	b->hdr = snap.hdr;
	sr_snap_free(&snap);
	b->ctl = &b->hdr;
	b->armed_base = 0;
	if (!b->pid) {
		struct shard_sum s;

		/* timers of others (a session kept, a service): counted apart, and said */
		shards_read(b, &s);
		b->armed_base = s.armed;
		if (s.armed)
			fprintf(stderr, "chime-bench: note: the broker at '%s' holds %" PRIu64 " timers of other clients: "
				"counted apart, but its CPU and wake-ups include their work (an idle broker gives "
				"clean figures)\n", b->sock, s.armed);
	}
	b->nr_shards = b->sr.nr_shards;
	return 0;
}

void shards_read(const struct broker *b, struct shard_sum *s)
{
	struct sr_snap snap;

	memset(s, 0, sizeof(*s));
	if (sr_snapshot(&b->sr, &snap) == 0) {
		for (uint32_t i = 0; i < snap.hdr.nr_shards; i++) {
			const struct chime_shard_stats *st = &snap.shards[i];

			s->armed += st->armed;
			s->arms += st->arms;
			s->resets += st->resets;
			s->cancels += st->cancels;
			s->fires += st->fires;
			s->delivered += st->delivered;
			s->busy_ns += st->busy_ns;
			s->malformed += st->malformed;
			s->backlog += st->backlog;
			s->cpu_ns += st->cpu_ns;
			if (st->lat_max_ns > s->lat_max_ns)
				s->lat_max_ns = st->lat_max_ns;
		}
		sr_snap_free(&snap);
	}
	s->ops = s->arms + s->resets + s->cancels;
	s->t_ns = now_ns();
}

/* Wait until the shards' sums (published at least every ms) report `armed` == want, besides others'. */
int wait_armed(const struct broker *b, uint64_t want, uint64_t timeout_ns)
{
	uint64_t end = now_ns() + timeout_ns;

	want += b->armed_base;
	for (;;) {
		struct shard_sum s;

		shards_read(b, &s);
		if (s.armed == want)
			return 0;
		if (s.t_ns > end) {
			if (b->armed_base)
				PROBLEM("broker reports %" PRIu64 " timers armed, expected %" PRIu64 " with the %" PRIu64
					" of other clients it held at the start (waited %.1f s: did theirs change?)\n",
					s.armed, want, b->armed_base, (double)timeout_ns / 1e9);
			else
				PROBLEM("broker reports %" PRIu64 " timers armed, expected %" PRIu64 " (waited %.1f s)\n",
					s.armed, want, (double)timeout_ns / 1e9);
			return -1;
		}
		sleep_ns(200000);
	}
}

/*
 * Wait until the broker has applied every record c published: each of its
 * submission rings' sq_head (which a shard moves once the records below
 * are applied) at the ring's tail. Records, not operations: a reset
 * through the touch table is none, and the broker counts nothing for it.
 */
int wait_applied(chime_t *c, uint64_t timeout_ns)
{
	uint64_t end = now_ns() + timeout_ns;

	for (uint32_t s = 0; s < c->nr_shards; s++) {
		const struct chime_chan *ch = &c->chan[s];

		while (__atomic_load_n(ch->sq_head, __ATOMIC_ACQUIRE) < __atomic_load_n(ch->sq.tail, __ATOMIC_RELAXED)) {
			if (now_ns() > end) {
				PROBLEM("shard %u has not applied this client's records (waited %.1f s)\n", s,
					(double)timeout_ns / 1e9);
				return -1;
			}
			sleep_ns(20000);
		}
	}
	return 0;
}

int broker_open(struct broker *b, unsigned flags, chime_t **c)
{
	struct chime_opts o = { .socket_path = b->sock, .flags = flags };
	int r = chime_open(c, &o);

	if (r < 0)
		bench_error("chime_open('%s') failed: %s", b->sock, strerror(-r));
	return r;
}

/* ------------------------------------------------------------------------ */
/* an interrupted run: stop the private chimed, remove its directory          */
/* ------------------------------------------------------------------------ */

/*
 * SIGINT, SIGTERM or SIGHUP during a run would otherwise kill this process
 * and leave the private chimed's directory behind (its log at least, and
 * with it the chimed too if the signal was ours alone). The benchmark loops
 * must not check a flag (they are what is measured), and they can run for
 * minutes: a handler that only records the signal would wait for them. So
 * the handler does the cleanup itself and _exits(128 + signal), strictly
 * with async-signal-safe calls (kill, waitpid, poll as a sleep, unlink,
 * rmdir, write, _exit; strlen and memcpy) on paths computed by
 * broker_start() before the fork, under a flag set last, with the signals
 * blocked while they are written. It never returns, so nothing it
 * interrupted (malloc, stdio) is touched again; stdout's unflushed lines are
 * lost. broker_stop() blocks the signals while it stops the broker and
 * disarms this before unblocking them: a signal meanwhile waits for the stop
 * (at most 10 s), and then only exits, so the two never reap the same child.
 * One private broker at a time (each mode starts at most one).
 */
static const int cleanup_sig[] = { SIGINT, SIGTERM, SIGHUP };
#define NR_CLEANUP_SIG (sizeof(cleanup_sig) / sizeof(cleanup_sig[0]))

static struct {
	volatile sig_atomic_t armed;    /* the paths below are complete */
	volatile sig_atomic_t pid;      /* the chimed to stop; 0 none (not yet forked, or reaped) */
	char dir[PATH_MAX], log[PATH_MAX + 16], sock[PATH_MAX];
	char scratch[PATH_MAX + 32];    /* the handler's: sock + a suffix */
	int installed;
} g_private;
static atomic_flag g_cleaning = ATOMIC_FLAG_INIT;

static void unlink_suffixed(const char *suffix, size_t sfx_len)
{
	size_t n = strlen(g_private.sock);

	memcpy(g_private.scratch, g_private.sock, n);
	memcpy(g_private.scratch + n, suffix, sfx_len);
	g_private.scratch[n + sfx_len] = '\0';
	(void)unlink(g_private.scratch);
}

static void on_interrupt(int sig)
{
	static const char msg[] = "chime-bench: interrupted: stopped the private chimed, removed its directory\n";

	/* A second signal on another thread: the first one's _exit ends us both. */
	if (atomic_flag_test_and_set(&g_cleaning))
		for (;;)
			pause();
	if (g_private.armed) {
		pid_t pid = (pid_t)g_private.pid;

		if (pid > 0) {
			int st, waited = 0;
			pid_t w;

			kill(pid, SIGTERM);     /* chimed then removes its socket and segments */
			while ((w = waitpid(pid, &st, WNOHANG)) == 0 && waited < 5000) {
				(void)poll(NULL, 0, 10);
				waited += 10;
			}
			if (w == 0) {
				kill(pid, SIGKILL);
				(void)waitpid(pid, &st, 0);
			}
		}
		/* What a chimed that could not clean up leaves (ENOENT otherwise). */
		unlink_suffixed("", 0);
		unlink_suffixed(".lock", 5);
		unlink_suffixed(".ctl", 4);
		unlink_suffixed(".sessions", 9);
		for (unsigned i = 0; i < CHIME_MAX_SHARDS; i++) {
			char num[12];
			size_t k = sizeof(num);
			unsigned v = i;

			do
				num[--k] = (char)('0' + v % 10);
			while ((v /= 10) != 0 && k > 6);
			memcpy(num + k - 6, ".shard", 6);
			unlink_suffixed(num + k - 6, sizeof(num) - (k - 6));
		}
		(void)unlink(g_private.log);
		(void)rmdir(g_private.dir);
		(void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
	}
	_exit(128 + sig);
}

static void cleanup_block(sigset_t *old)
{
	sigset_t set;

	sigemptyset(&set);
	for (size_t i = 0; i < NR_CLEANUP_SIG; i++)
		sigaddset(&set, cleanup_sig[i]);
	pthread_sigmask(SIG_BLOCK, &set, old);
}

/* With the signals blocked: the handler for each one not ignored (nohup keeps its SIG_IGN). */
static void cleanup_install(void)
{
	struct sigaction sa, cur;

	if (g_private.installed)
		return;
	g_private.installed = 1;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_interrupt;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < NR_CLEANUP_SIG; i++)
		sigaddset(&sa.sa_mask, cleanup_sig[i]);
	for (size_t i = 0; i < NR_CLEANUP_SIG; i++)
		if (sigaction(cleanup_sig[i], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN)
			sigaction(cleanup_sig[i], &sa, NULL);
}

/* In the child before exec: chimed gets the default dispositions and the caller's mask. */
static void cleanup_child(const sigset_t *old)
{
	struct sigaction dfl;

	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	sigemptyset(&dfl.sa_mask);
	for (size_t i = 0; i < NR_CLEANUP_SIG; i++) {
		struct sigaction cur;

		if (sigaction(cleanup_sig[i], NULL, &cur) == 0 && cur.sa_handler == on_interrupt)
			sigaction(cleanup_sig[i], &dfl, NULL);
	}
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Nothing for the handler to do any more (with the signals blocked). */
static void cleanup_disarm(void)
{
	g_private.armed = 0;
	g_private.pid = 0;
}

int broker_start(struct broker *b, int shards, const char *spin_us)
{
	sigset_t old;
	char log[PATH_MAX + 16], nshards[16], cap[24], fsbuf[32];
	const char *tmp = getenv("TMPDIR"), *fs;
	uint64_t end;
	int r;

	/*
	 * The broker's segment files on a tmpfs, as a service's /run is on
	 * most hosts, not on a disk /tmp may be (chimed warns then, and
	 * measures slower): /dev/shm, unless $TMPDIR says otherwise.
	 */
	if ((!tmp || !*tmp) && chime_seg_dir_in_memory("/dev/shm/.", &fs, fsbuf, sizeof(fsbuf)) == 1 &&
	    access("/dev/shm", W_OK) == 0)
		tmp = "/dev/shm";

	r = find_chimed(b->bin, sizeof(b->bin));
	if (r < 0) {
		bench_error("cannot find chimed (set $CHIMED, or pass --socket): %s", strerror(-r));
		return -1;
	}
	snprintf(b->dir, sizeof(b->dir), "%s/chime-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(b->dir)) {
		bench_error("mkdtemp('%s') failed: %s", b->dir, strerror(errno));
		b->dir[0] = '\0';
		return -1;
	}
	snprintf(b->sock, sizeof(b->sock), "%s/chime.sock", b->dir);
	snprintf(log, sizeof(log), "%s/chimed.log", b->dir);
	snprintf(nshards, sizeof(nshards), "%d", shards);
	snprintf(cap, sizeof(cap), "%" PRIu64, b->capacity);

	/* From here an interrupt removes the directory, and from the fork on stops chimed too. */
	cleanup_block(&old);
	cleanup_install();
	snprintf(g_private.dir, sizeof(g_private.dir), "%s", b->dir);
	snprintf(g_private.log, sizeof(g_private.log), "%s", log);
	snprintf(g_private.sock, sizeof(g_private.sock), "%s", b->sock);
	g_private.pid = 0;
	atomic_signal_fence(memory_order_seq_cst);
	g_private.armed = 1;

	fflush(NULL);
	b->pid = fork();
	if (b->pid < 0) {
		bench_error("fork failed: %s", strerror(errno));
		b->pid = 0;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return -1;
	}
	if (b->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		const char *argv[16] = { "chimed", "--foreground", "--socket", b->sock };
		int argc = 4;

		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		if (shards > 0) {
			argv[argc++] = "--shards";
			argv[argc++] = nshards;
		}
		if (spin_us) {
			argv[argc++] = "--spin-us";
			argv[argc++] = spin_us;
		}
		if (b->capacity) {
			argv[argc++] = "--capacity";
			argv[argc++] = cap;
			argv[argc++] = "--max-timers-per-client";
			argv[argc++] = "0";
			argv[argc++] = "--max-timers-per-uid";
			argv[argc++] = "0";
		}
		cleanup_child(&old);
		execv(b->bin, (char *const *)argv);
		fprintf(stderr, "%s: exec('%s') failed: %s\n", bench_prog, b->bin, strerror(errno));
		_exit(127);
	}
	g_private.pid = b->pid;
	pthread_sigmask(SIG_SETMASK, &old, NULL);

	/* Ready when a client can connect and the control segment is there. */
	end = now_ns() + 10 * NS_PER_S;
	for (;;) {
		struct chime_opts o = { .socket_path = b->sock, .flags = 0 };
		chime_t *c;
		int st;

		if (waitpid(b->pid, &st, WNOHANG) == b->pid) {
			bench_error("chimed exited at start-up (status %d); its log: %s",
				    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log);
			/* reaped: the handler must not signal its pid; the log is kept, as said */
			cleanup_block(&old);
			cleanup_disarm();
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			b->pid = 0;
			return -1;
		}
		if (chime_open(&c, &o) == 0) {
			chime_close(c);
			break;
		}
		if (now_ns() > end) {
			bench_error("chimed did not accept clients within 10 s; its log: %s", log);
			return -1;
		}
		sleep_ns(10 * NS_PER_MS);
	}
	return broker_map_ctl(b);
}

/* Stop our broker (if we started one); 0 if it stopped cleanly. */
static int broker_stop_blocked(struct broker *b)
{
	char log[PATH_MAX + 16];
	int st = 0, r = 0;
	uint64_t end;

	if (b->ctl)
		sr_close(&b->sr);
	b->ctl = NULL;
	if (!b->pid)
		return 0;
	kill(b->pid, SIGTERM);
	end = now_ns() + 10 * NS_PER_S;
	while (waitpid(b->pid, &st, WNOHANG) == 0) {
		if (now_ns() > end) {
			fprintf(stderr, "%s: chimed ignored SIGTERM for 10 s; killing it\n", bench_prog);
			kill(b->pid, SIGKILL);
			waitpid(b->pid, &st, 0);
			r = -1;
			break;
		}
		sleep_ns(5 * NS_PER_MS);
	}
	b->pid = 0;
	snprintf(log, sizeof(log), "%s/chimed.log", b->dir);
	if (r == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		PROBLEM("chimed did not stop cleanly on SIGTERM (%s %d); its log is kept: %s\n",
			WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log);
		return -1;
	}
	if (r == 0) {
		unlink(log);
		rmdir(b->dir);
	}
	return r;
}

int broker_stop(struct broker *b)
{
	sigset_t old;
	int r;

	cleanup_block(&old);
	r = broker_stop_blocked(b);
	cleanup_disarm();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return r;
}
