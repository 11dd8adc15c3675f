/* SPDX-License-Identifier: MIT */
/*
 * e2e.c - `chime-bench e2e`: what a timer costs an application end to end,
 * through libchime and a real chimed, beside one timerfd per timer.
 *
 * One run prints one table:
 *
 *   1. client operations: ns per chime_arm / chime_reset / chime_cancel on
 *      the calling thread, 1 and 2 threads sharing one chime_t, with N timers
 *      armed (arm grows 0 -> N, reset runs at N, cancel shrinks N -> 0).
 *      Deadlines are an hour ahead, so nothing fires. Each thread times
 *      batches of BATCH calls with clock_gettime(CLOCK_MONOTONIC); the figure
 *      is the median of the batch means (over all threads' batches), with the
 *      plain mean beside it (the mean includes stalls on a full ring).
 *      Between phases the bench waits for the broker's `armed` counter, so a
 *      phase never measures the broker still digesting the previous one.
 *      Baseline: timerfd_create + timerfd_settime per arm, timerfd_settime
 *      per reset, close per cancel, same batches.
 *   2. broker throughput: 2 threads flood chime_reset over N armed timers for
 *      FLOOD seconds; the shards' arms+resets+cancels counters (control
 *      segment "<socket>.ctl", chime_stats_read) over a window, divided by
 *      the window and the shard count. Also the shards' busy share (busy_ns)
 *      and the ops per busy second (what a shard does when it has work).
 *   3. expirations/s: N timers due at one instant, drained with chime_poll()
 *      in a loop; time from the deadline to the last event. Baseline: N
 *      timerfds in one epoll, epoll_wait + read(2) each.
 *   4. lateness: N timers with random deadlines over a few seconds, drained
 *      with chime_wait() (blocking, as applications do); fired_ns - deadline
 *      (the broker's view) and receive time - deadline (the application's).
 *      Baseline: timerfds in epoll, receive time - deadline.
 *
 * Correctness is checked on the side: every expiration must arrive exactly
 * once, with its own deadline, never early. Anything else is printed and
 * makes the exit status 1.
 *
 * Without --socket, a private chimed is started (from $CHIMED, else next to
 * this executable in the build tree: ../broker/chimed, ./chimed, ../sbin/chimed)
 * on a socket in a fresh directory under $TMPDIR, and stopped at the end.
 */
#include <chime.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
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
#include "e2e.h"

#define NS_PER_S   UINT64_C(1000000000)
#define NS_PER_MS  UINT64_C(1000000)
#define FAR_NS     (3600 * NS_PER_S)        /* "never fires during the run" */
#define MAX_THR    2u
#define EV_BATCH   512u

/* ------------------------------------------------------------------------ */
/* small helpers                                                              */
/* ------------------------------------------------------------------------ */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / NS_PER_S), .tv_nsec = (long)(ns % NS_PER_S) };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = { .tv_sec = (time_t)(t_ns / NS_PER_S), .tv_nsec = (long)(t_ns % NS_PER_S) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: plenty for spreading deadlines. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(2685821657736338717);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Percentile q (0..1) of a sorted array: the smallest value >= a fraction q of the samples. */
static uint64_t pct(const uint64_t *a, size_t n, double q)
{
	size_t i;

	if (n == 0)
		return 0;
	i = (size_t)(q * (double)n);
	if (i >= n)
		i = n - 1;
	return a[i];
}

static const char *fmt_count(char *buf, size_t len, uint64_t n)
{
	if (n >= 1000000 && n % 1000000 == 0)
		snprintf(buf, len, "%" PRIu64 "M", n / 1000000);
	else if (n >= 1000 && n % 1000 == 0)
		snprintf(buf, len, "%" PRIu64 "k", n / 1000);
	else
		snprintf(buf, len, "%" PRIu64, n);
	return buf;
}

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz);

	if (!p) {
		fprintf(stderr, "chime-bench: out of memory (%zu x %zu bytes)\n", n, sz);
		exit(1);
	}
	return p;
}

/* Set when a correctness problem was seen: the exit status says so. */
static int g_problems;

#define PROBLEM(...) do { g_problems++; printf("  !! " __VA_ARGS__); } while (0)

/* ------------------------------------------------------------------------ */
/* the broker: a private chimed, or the one at --socket; its counters         */
/* ------------------------------------------------------------------------ */

struct broker {
	pid_t pid;                      /* 0: not ours */
	char dir[PATH_MAX - 64];        /* our private directory, "" if none */
	char sock[PATH_MAX];
	char bin[PATH_MAX];
	const struct chime_ctl *ctl;
	size_t ctl_len;
	uint32_t nr_shards;
};

/* Sums over the shards of the counters this bench reads. */
struct shard_sum {
	uint64_t t_ns;
	uint64_t armed, ops, arms, resets, cancels, fires, delivered, busy_ns, malformed, backlog;
	uint64_t lat_max_ns;
};

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

static int broker_map_ctl(struct broker *b)
{
	char path[PATH_MAX + 8];
	struct stat st;
	void *p;
	int fd;

	snprintf(path, sizeof(path), "%s.ctl", b->sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "chime-bench: open('%s') failed: %s\n", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct chime_ctl)) {
		fprintf(stderr, "chime-bench: '%s' is not a control segment\n", path);
		close(fd);
		return -1;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		fprintf(stderr, "chime-bench: mmap('%s') failed: %s\n", path, strerror(errno));
		return -1;
	}
	b->ctl = p;
	b->ctl_len = (size_t)st.st_size;
	/* A-E2E1: magic last (the broker's release store); then the geometry. */
	if (__atomic_load_n(&b->ctl->hdr.magic, __ATOMIC_ACQUIRE) != CHIME_SHM_MAGIC ||
	    b->ctl->hdr.layout != CHIME_SHM_LAYOUT || b->ctl->hdr.kind != CHIME_SEG_CONTROL ||
	    b->ctl->nr_shards == 0 ||
	    b->ctl->shards_off + (uint64_t)b->ctl->nr_shards * sizeof(struct chime_shard_ctl) > b->ctl_len) {
		fprintf(stderr, "chime-bench: '%s': bad magic, layout or geometry\n", path);
		return -1;
	}
	b->nr_shards = b->ctl->nr_shards;
	return 0;
}

static void shards_read(const struct broker *b, struct shard_sum *s)
{
	const struct chime_shard_ctl *sc =
		(const struct chime_shard_ctl *)((const char *)b->ctl + b->ctl->shards_off);

	memset(s, 0, sizeof(*s));
	for (uint32_t i = 0; i < b->nr_shards; i++) {
		struct chime_shard_stats st;

		(void)chime_stats_read(&st, &sc[i].stats, sizeof(st), 1000);
		s->armed += st.armed;
		s->arms += st.arms;
		s->resets += st.resets;
		s->cancels += st.cancels;
		s->fires += st.fires;
		s->delivered += st.delivered;
		s->busy_ns += st.busy_ns;
		s->malformed += st.malformed;
		s->backlog += st.backlog;
		if (st.lat_max_ns > s->lat_max_ns)
			s->lat_max_ns = st.lat_max_ns;
	}
	s->ops = s->arms + s->resets + s->cancels;
	s->t_ns = now_ns();
}

/* Wait until the shards report `armed` == want (published at least every ms). */
static int wait_armed(const struct broker *b, uint64_t want, uint64_t timeout_ns)
{
	uint64_t end = now_ns() + timeout_ns;
	struct shard_sum s;

	for (;;) {
		shards_read(b, &s);
		if (s.armed == want)
			return 0;
		if (s.t_ns > end) {
			PROBLEM("broker reports %" PRIu64 " timers armed, expected %" PRIu64 " (waited %.1f s)\n",
				s.armed, want, (double)timeout_ns / 1e9);
			return -1;
		}
		sleep_ns(200000);
	}
}

static int broker_open(struct broker *b, chime_t **c)
{
	struct chime_opts o = { .socket_path = b->sock, .flags = 0 };
	int r = chime_open(c, &o);

	if (r < 0)
		fprintf(stderr, "chime-bench: chime_open('%s') failed: %s\n", b->sock, strerror(-r));
	return r;
}

static int broker_start(struct broker *b, int shards)
{
	char log[PATH_MAX + 16], nshards[16];
	const char *tmp = getenv("TMPDIR");
	uint64_t end;
	int r;

	r = find_chimed(b->bin, sizeof(b->bin));
	if (r < 0) {
		fprintf(stderr, "chime-bench: cannot find chimed (set $CHIMED, or pass --socket): %s\n",
			strerror(-r));
		return -1;
	}
	snprintf(b->dir, sizeof(b->dir), "%s/chime-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(b->dir)) {
		fprintf(stderr, "chime-bench: mkdtemp('%s') failed: %s\n", b->dir, strerror(errno));
		b->dir[0] = '\0';
		return -1;
	}
	snprintf(b->sock, sizeof(b->sock), "%s/chime.sock", b->dir);
	snprintf(log, sizeof(log), "%s/chimed.log", b->dir);
	snprintf(nshards, sizeof(nshards), "%d", shards);

	fflush(NULL);
	b->pid = fork();
	if (b->pid < 0) {
		fprintf(stderr, "chime-bench: fork failed: %s\n", strerror(errno));
		b->pid = 0;
		return -1;
	}
	if (b->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		if (shards > 0)
			execl(b->bin, "chimed", "--foreground", "--socket", b->sock, "--shards", nshards,
			      (char *)NULL);
		else
			execl(b->bin, "chimed", "--foreground", "--socket", b->sock, (char *)NULL);
		fprintf(stderr, "chime-bench: exec('%s') failed: %s\n", b->bin, strerror(errno));
		_exit(127);
	}

	/* Ready when a client can connect and the control segment is there. */
	end = now_ns() + 10 * NS_PER_S;
	for (;;) {
		struct chime_opts o = { .socket_path = b->sock, .flags = 0 };
		chime_t *c;
		int st;

		if (waitpid(b->pid, &st, WNOHANG) == b->pid) {
			fprintf(stderr, "chime-bench: chimed exited at start-up (status %d); its log: %s\n",
				WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log);
			b->pid = 0;
			return -1;
		}
		if (chime_open(&c, &o) == 0) {
			chime_close(c);
			break;
		}
		if (now_ns() > end) {
			fprintf(stderr, "chime-bench: chimed did not accept clients within 10 s; its log: %s\n", log);
			return -1;
		}
		sleep_ns(10 * NS_PER_MS);
	}
	return broker_map_ctl(b);
}

/* Stop our broker (if we started one); 0 if it stopped cleanly. */
static int broker_stop(struct broker *b)
{
	char log[PATH_MAX + 16];
	int st = 0, r = 0;
	uint64_t end;

	if (b->ctl)
		munmap((void *)(uintptr_t)b->ctl, b->ctl_len);
	b->ctl = NULL;
	if (!b->pid)
		return 0;
	kill(b->pid, SIGTERM);
	end = now_ns() + 10 * NS_PER_S;
	while (waitpid(b->pid, &st, WNOHANG) == 0) {
		if (now_ns() > end) {
			fprintf(stderr, "chime-bench: chimed ignored SIGTERM for 10 s; killing it\n");
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

/* ------------------------------------------------------------------------ */
/* 1. client operations, chime and timerfd                                    */
/* ------------------------------------------------------------------------ */

enum { OP_ARM, OP_RESET, OP_CANCEL, NR_OPS };
static const char *const op_name[NR_OPS] = { "arm", "reset", "cancel" };
static const char *const tfd_op_name[NR_OPS] = { "create+settime", "settime", "close" };

enum { IMPL_CHIME, IMPL_TFD };

struct op_result {
	double median_ns;       /* median of batch means */
	double mean_ns;         /* all ops / all time on the calling threads */
	double mops;            /* aggregate: N ops / wall time of the phase, M/s */
	int err;                /* first error (-errno) */
};

struct op_shared {
	int impl;
	chime_t *c;
	uint64_t *ids;          /* chime ids, or timerfd fds */
	size_t n;
	unsigned batch;
	unsigned nthr;
	uint64_t base_ns;       /* deadlines: base_ns + i */
	pthread_barrier_t bar;
	double *bmeans[NR_OPS]; /* [nthr * batches_per_thread] */
	size_t nb_per_thr;
	uint64_t busy[NR_OPS][MAX_THR];
	uint64_t t0[NR_OPS][MAX_THR], t1[NR_OPS][MAX_THR];
	int err[NR_OPS][MAX_THR];
};

struct op_thread {
	struct op_shared *sh;
	unsigned idx;
	pthread_t tid;
};

static int tfd_set(int fd, uint64_t deadline_ns)
{
	struct itimerspec its = {
		.it_value = { .tv_sec = (time_t)(deadline_ns / NS_PER_S), .tv_nsec = (long)(deadline_ns % NS_PER_S) },
	};

	return timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, NULL) < 0 ? -errno : 0;
}

/* One batch of op over ids[lo, hi): returns 0 or the first -errno. */
static int op_batch(struct op_shared *sh, int op, size_t lo, size_t hi)
{
	uint64_t *ids = sh->ids;
	int r;

	if (sh->impl == IMPL_CHIME) {
		switch (op) {
		case OP_ARM:
			for (size_t i = lo; i < hi; i++)
				if ((r = chime_arm(sh->c, i, sh->base_ns + i, 0, i, &ids[i])) < 0)
					return r;
			break;
		case OP_RESET:
			for (size_t i = lo; i < hi; i++)
				if ((r = chime_reset(sh->c, ids[i], sh->base_ns + NS_PER_S + i)) < 0)
					return r;
			break;
		default:
			for (size_t i = lo; i < hi; i++)
				if ((r = chime_cancel(sh->c, ids[i])) < 0)
					return r;
			break;
		}
		return 0;
	}
	switch (op) {
	case OP_ARM:
		for (size_t i = lo; i < hi; i++) {
			int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);

			if (fd < 0)
				return -errno;
			ids[i] = (uint64_t)fd;
			if ((r = tfd_set(fd, sh->base_ns + i)) < 0)
				return r;
		}
		break;
	case OP_RESET:
		for (size_t i = lo; i < hi; i++)
			if ((r = tfd_set((int)ids[i], sh->base_ns + NS_PER_S + i)) < 0)
				return r;
		break;
	default:
		for (size_t i = lo; i < hi; i++) {
			if (close((int)ids[i]) < 0)
				return -errno;
			ids[i] = (uint64_t)-1;
		}
		break;
	}
	return 0;
}

static void *op_thread_main(void *arg)
{
	struct op_thread *t = arg;
	struct op_shared *sh = t->sh;
	size_t per = sh->n / sh->nthr;
	size_t lo = per * t->idx, hi = t->idx + 1 == sh->nthr ? sh->n : lo + per;

	for (int op = 0; op < NR_OPS; op++) {
		size_t b = 0;
		int r = 0;

		/* Phase start: every thread and the main thread (which waited for the broker). */
		pthread_barrier_wait(&sh->bar);
		sh->t0[op][t->idx] = now_ns();
		for (size_t i = lo; i < hi && r == 0; i += sh->batch, b++) {
			size_t e = i + sh->batch < hi ? i + sh->batch : hi;
			uint64_t a = now_ns(), z;

			r = op_batch(sh, op, i, e);
			z = now_ns();
			sh->busy[op][t->idx] += z - a;
			if (b < sh->nb_per_thr)
				sh->bmeans[op][t->idx * sh->nb_per_thr + b] = (double)(z - a) / (double)(e - i);
		}
		sh->t1[op][t->idx] = now_ns();
		sh->err[op][t->idx] = r;
		pthread_barrier_wait(&sh->bar);
	}
	return NULL;
}

/*
 * n timers, nthr threads: arm, reset, cancel. For chime, `b` is the broker
 * whose counters the phases wait for. res[op] gets the figures.
 */
static int run_ops(int impl, const struct broker *b, size_t n, unsigned nthr, unsigned batch,
		   struct op_result res[NR_OPS])
{
	struct op_shared sh;
	struct op_thread th[MAX_THR];
	chime_t *c = NULL;
	int ret = 0;

	memset(&sh, 0, sizeof(sh));
	memset(res, 0, sizeof(*res) * NR_OPS);
	if (impl == IMPL_CHIME && broker_open((struct broker *)b, &c) < 0)
		return -1;
	sh.impl = impl;
	sh.c = c;
	sh.n = n;
	sh.batch = batch;
	sh.nthr = nthr;
	sh.ids = xcalloc(n, sizeof(*sh.ids));
	sh.nb_per_thr = (n / nthr + batch - 1) / batch + 1;
	for (int op = 0; op < NR_OPS; op++)
		sh.bmeans[op] = xcalloc(sh.nb_per_thr * nthr, sizeof(double));
	sh.base_ns = now_ns() + FAR_NS;
	pthread_barrier_init(&sh.bar, NULL, nthr + 1);
	for (unsigned i = 0; i < nthr; i++) {
		th[i].sh = &sh;
		th[i].idx = i;
		pthread_create(&th[i].tid, NULL, op_thread_main, &th[i]);
	}

	for (int op = 0; op < NR_OPS; op++) {
		pthread_barrier_wait(&sh.bar);      /* go */
		pthread_barrier_wait(&sh.bar);      /* done */
		if (impl == IMPL_CHIME && wait_armed(b, op == OP_CANCEL ? 0 : n, 60 * NS_PER_S) < 0)
			ret = -1;
	}
	for (unsigned i = 0; i < nthr; i++)
		pthread_join(th[i].tid, NULL);

	for (int op = 0; op < NR_OPS; op++) {
		size_t nb = 0;
		uint64_t busy = 0, t0 = UINT64_MAX, t1 = 0;
		double *m = sh.bmeans[op];

		for (unsigned i = 0; i < nthr; i++) {
			size_t per = n / nthr, cnt = (i + 1 == nthr ? n - per * i : per);
			size_t batches = (cnt + batch - 1) / batch;

			if (batches > sh.nb_per_thr)
				batches = sh.nb_per_thr;
			/* compact thread i's batches after the previous threads' */
			memmove(m + nb, m + i * sh.nb_per_thr, batches * sizeof(double));
			nb += batches;
			busy += sh.busy[op][i];
			if (sh.t0[op][i] < t0)
				t0 = sh.t0[op][i];
			if (sh.t1[op][i] > t1)
				t1 = sh.t1[op][i];
			if (sh.err[op][i] && !res[op].err)
				res[op].err = sh.err[op][i];
		}
		qsort(m, nb, sizeof(double), cmp_dbl);
		res[op].median_ns = nb ? (nb % 2 ? m[nb / 2] : (m[nb / 2 - 1] + m[nb / 2]) / 2) : 0;
		res[op].mean_ns = (double)busy / (double)n;
		res[op].mops = t1 > t0 ? (double)n / (double)(t1 - t0) * 1e3 : 0;
		if (res[op].err)
			ret = -1;
		free(m);
	}
	if (impl == IMPL_TFD)       /* after an error, close what is left */
		for (size_t i = 0; i < n; i++)
			if (sh.ids[i] != (uint64_t)-1 && sh.ids[i] != 0)
				close((int)sh.ids[i]);
	pthread_barrier_destroy(&sh.bar);
	free(sh.ids);
	chime_close(c);
	return ret;
}

/* ------------------------------------------------------------------------ */
/* 2. broker throughput: 2 threads flood chime_reset                          */
/* ------------------------------------------------------------------------ */

struct flood {
	chime_t *c;
	uint64_t *ids;
	size_t n;
	unsigned nthr;
	uint64_t base_ns;
	int stop;               /* atomic */
	uint64_t done[MAX_THR];
	int err[MAX_THR];
};

struct flood_thread {
	struct flood *f;
	unsigned idx;
	pthread_t tid;
};

static void *flood_main(void *arg)
{
	struct flood_thread *t = arg;
	struct flood *f = t->f;
	size_t per = f->n / f->nthr, lo = per * t->idx, hi = lo + per, i = lo;
	uint64_t k = 0;

	while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
		for (unsigned j = 0; j < 1024; j++) {
			int r = chime_reset(f->c, f->ids[i], f->base_ns + (k++ & 0xffffff) * 1000);

			if (r < 0) {
				f->err[t->idx] = r;
				goto out;
			}
			if (++i == hi)
				i = lo;
		}
	}
out:
	f->done[t->idx] = k;
	return NULL;
}

struct flood_result {
	double ops_per_shard;   /* M/s, wall */
	double busy_share;      /* busy_ns / (window * shards) */
	double ops_per_busy;    /* M/s per shard-busy-second */
	double client_mops;     /* resets issued by the clients, M/s */
	int err;
};

static int run_flood(const struct broker *b, size_t n, uint64_t dur_ns, struct flood_result *res)
{
	struct flood f;
	struct flood_thread th[MAX_THR];
	struct shard_sum s0, s1;
	uint64_t t_start, t_end, issued = 0;
	int ret = 0;

	memset(&f, 0, sizeof(f));
	memset(res, 0, sizeof(*res));
	if (broker_open((struct broker *)b, &f.c) < 0)
		return -1;
	f.n = n;
	f.nthr = MAX_THR;
	f.ids = xcalloc(n, sizeof(*f.ids));
	f.base_ns = now_ns() + FAR_NS;
	for (size_t i = 0; i < n; i++) {
		int r = chime_arm(f.c, i, f.base_ns + i, 0, i, &f.ids[i]);

		if (r < 0) {
			PROBLEM("chime_arm failed while arming %zu timers: %s\n", n, strerror(-r));
			res->err = r;
			goto done;
		}
	}
	if (wait_armed(b, n, 60 * NS_PER_S) < 0) {
		ret = -1;
		goto done;
	}
	t_start = now_ns();
	for (unsigned i = 0; i < f.nthr; i++) {
		th[i].f = &f;
		th[i].idx = i;
		pthread_create(&th[i].tid, NULL, flood_main, &th[i]);
	}
	sleep_ns(dur_ns / 10);          /* warm-up: rings full, shards busy */
	shards_read(b, &s0);
	sleep_ns(dur_ns);
	shards_read(b, &s1);
	__atomic_store_n(&f.stop, 1, __ATOMIC_RELAXED);
	for (unsigned i = 0; i < f.nthr; i++) {
		pthread_join(th[i].tid, NULL);
		issued += f.done[i];
		if (f.err[i] && !res->err)
			res->err = f.err[i];
	}
	t_end = now_ns();
	{
		double win = (double)(s1.t_ns - s0.t_ns);

		res->ops_per_shard = (double)(s1.ops - s0.ops) / win * 1e3 / b->nr_shards;
		res->busy_share = (double)(s1.busy_ns - s0.busy_ns) / (win * b->nr_shards);
		res->ops_per_busy = s1.busy_ns > s0.busy_ns ?
			(double)(s1.ops - s0.ops) / (double)(s1.busy_ns - s0.busy_ns) * 1e3 : 0;
		res->client_mops = (double)issued / (double)(t_end - t_start) * 1e3;
		if (s1.malformed != s0.malformed)
			PROBLEM("%" PRIu64 " submissions counted as malformed during the flood\n",
				s1.malformed - s0.malformed);
	}
	for (size_t i = 0; i < n; i++)
		if (chime_cancel(f.c, f.ids[i]) < 0)
			break;
	if (wait_armed(b, 0, 60 * NS_PER_S) < 0)
		ret = -1;
done:
	chime_close(f.c);
	free(f.ids);
	return res->err ? -1 : ret;
}

/* Baseline for the flood: timerfd_settime from 2 threads over n timerfds. */
struct tflood {
	int *fds;
	size_t n;
	uint64_t base_ns;
	int stop;
	uint64_t done[MAX_THR];
};

struct tflood_thread {
	struct tflood *f;
	unsigned idx;
	pthread_t tid;
};

static void *tflood_main(void *arg)
{
	struct tflood_thread *t = arg;
	struct tflood *f = t->f;
	size_t per = f->n / MAX_THR, lo = per * t->idx, hi = lo + per, i = lo;
	uint64_t k = 0;

	while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
		for (unsigned j = 0; j < 256; j++, k++) {
			(void)tfd_set(f->fds[i], f->base_ns + (k & 0xffffff) * 1000);
			if (++i == hi)
				i = lo;
		}
	}
	f->done[t->idx] = k;
	return NULL;
}

static double run_tflood(size_t n, uint64_t dur_ns)
{
	struct tflood f;
	struct tflood_thread th[MAX_THR];
	uint64_t t0, t1, k = 0;
	size_t made = 0;

	memset(&f, 0, sizeof(f));
	f.n = n;
	f.fds = xcalloc(n, sizeof(int));
	f.base_ns = now_ns() + FAR_NS;
	for (; made < n; made++) {
		f.fds[made] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (f.fds[made] < 0 || tfd_set(f.fds[made], f.base_ns + made) < 0)
			break;
	}
	if (made < n) {
		for (size_t i = 0; i < made; i++)
			close(f.fds[i]);
		free(f.fds);
		return -1;
	}
	t0 = now_ns();
	for (unsigned i = 0; i < MAX_THR; i++) {
		th[i].f = &f;
		th[i].idx = i;
		pthread_create(&th[i].tid, NULL, tflood_main, &th[i]);
	}
	sleep_ns(dur_ns);
	__atomic_store_n(&f.stop, 1, __ATOMIC_RELAXED);
	for (unsigned i = 0; i < MAX_THR; i++) {
		pthread_join(th[i].tid, NULL);
		k += f.done[i];
	}
	t1 = now_ns();
	for (size_t i = 0; i < n; i++)
		close(f.fds[i]);
	free(f.fds);
	return (double)k / (double)(t1 - t0) * 1e3;
}

/* ------------------------------------------------------------------------ */
/* 3. expirations per second, 4. lateness                                     */
/* ------------------------------------------------------------------------ */

struct expire_result {
	size_t n;
	uint64_t drain_ns;      /* deadline -> last event */
	uint64_t first_ns;      /* deadline -> first event */
	double per_s;
	int ok;
};

/*
 * Count one event for timer `idx` of `n`. seen[] guards exactly-once.
 * Returns 1 if new, 0 if a duplicate (reported).
 */
static int seen_once(uint8_t *seen, size_t n, uint64_t idx, const char *who)
{
	if (idx >= n) {
		PROBLEM("%s: event with user_data %" PRIu64 " (only %zu armed)\n", who, idx, n);
		return 0;
	}
	if (seen[idx]) {
		if (seen[idx] == 1)
			PROBLEM("%s: timer %" PRIu64 " delivered more than once\n", who, idx);
		seen[idx] = 2;
		return 0;
	}
	seen[idx] = 1;
	return 1;
}

/* Report the first few timers never delivered. */
static void report_missing(const uint8_t *seen, size_t n, size_t got, const char *who)
{
	size_t shown = 0;

	if (got == n)
		return;
	PROBLEM("%s: %zu of %zu expirations never arrived; first missing:", who, n - got, n);
	for (size_t i = 0; i < n && shown < 8; i++)
		if (!seen[i]) {
			printf(" #%zu", i);
			shown++;
		}
	printf("\n");
}

static int run_expire_chime(const struct broker *b, size_t n, uint64_t gap_ns, struct expire_result *res)
{
	struct chime_event ev[EV_BATCH];
	uint8_t *seen = xcalloc(n, 1);
	chime_t *c;
	uint64_t d, t_last = 0, t_first = 0, idle_since;
	size_t got = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	for (int attempt = 0;; attempt++) {
		int r = 0;

		if (broker_open((struct broker *)b, &c) < 0) {
			free(seen);
			return -1;
		}
		d = now_ns() + gap_ns;
		for (size_t i = 0; i < n && r == 0; i++) {
			chime_id_t id;

			r = chime_arm(c, 7, d, 0, i, &id);
		}
		if (r < 0) {
			PROBLEM("chime_arm failed: %s\n", strerror(-r));
			chime_close(c);
			free(seen);
			return -1;
		}
		/* The broker must hold them all before the deadline, or this measures arming. */
		for (;;) {
			struct shard_sum s;

			shards_read(b, &s);
			if (s.armed >= n || s.t_ns >= d)
				break;
			sleep_ns(100000);
		}
		if (now_ns() + NS_PER_MS < d)
			break;
		chime_close(c);
		if (attempt == 2) {
			PROBLEM("could not arm %zu timers within %.1f s; expiration rate not measured\n",
				n, (double)gap_ns / 1e9);
			free(seen);
			return -1;
		}
		wait_armed(b, 0, 60 * NS_PER_S);
		gap_ns *= 2;
	}

	sleep_until(d - NS_PER_MS);
	idle_since = now_ns();
	while (got < n) {
		int k = chime_poll(c, ev, EV_BATCH);
		uint64_t t = now_ns();

		if (k < 0) {
			PROBLEM("chime_poll: %s\n", strerror(-k));
			break;
		}
		if (k == 0) {
			if (t - idle_since > 5 * NS_PER_S)
				break;
			continue;
		}
		idle_since = t;
		if (!t_first)
			t_first = t;
		for (int i = 0; i < k; i++) {
			if (ev[i].fired_ns < ev[i].deadline_ns || t < d)
				PROBLEM("chime: timer %" PRIu64 " fired early\n", ev[i].user_data);
			got += (size_t)seen_once(seen, n, ev[i].user_data, "chime expire");
		}
		t_last = t;
	}
	report_missing(seen, n, got, "chime expire");
	res->ok = got == n;
	res->drain_ns = t_last > d ? t_last - d : 0;
	res->first_ns = t_first > d ? t_first - d : 0;
	res->per_s = res->drain_ns ? (double)got / (double)res->drain_ns * 1e9 : 0;
	chime_close(c);
	free(seen);
	wait_armed(b, 0, 60 * NS_PER_S);
	return 0;
}

static int run_expire_tfd(size_t n, uint64_t gap_ns, struct expire_result *res)
{
	struct epoll_event ev[EV_BATCH];
	int *fds = xcalloc(n, sizeof(int));
	uint8_t *seen = xcalloc(n, 1);
	uint64_t d, t_last = 0, t_first = 0, idle_since;
	size_t got = 0, made = 0;
	int ep = epoll_create1(EPOLL_CLOEXEC), ret = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	for (; made < n; made++) {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = made };

		fds[made] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (fds[made] < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fds[made], &e) < 0) {
			fprintf(stderr, "chime-bench: timerfd %zu: %s\n", made, strerror(errno));
			if (fds[made] >= 0)
				close(fds[made]);
			ret = -1;
			goto out;
		}
	}
	d = now_ns() + gap_ns;
	for (size_t i = 0; i < n; i++)
		tfd_set(fds[i], d);
	if (now_ns() >= d)
		printf("  (timerfd: arming took longer than the %.1f s gap)\n", (double)gap_ns / 1e9);
	sleep_until(d - NS_PER_MS);
	idle_since = now_ns();
	while (got < n) {
		int k = epoll_wait(ep, ev, EV_BATCH, 100);
		uint64_t t;

		if (k < 0 && errno == EINTR)
			continue;
		t = now_ns();
		if (k <= 0) {
			if (t - idle_since > 5 * NS_PER_S)
				break;
			continue;
		}
		idle_since = t;
		if (!t_first)
			t_first = t;
		for (int i = 0; i < k; i++) {
			uint64_t cnt;

			if (read(fds[ev[i].data.u64], &cnt, sizeof(cnt)) == sizeof(cnt))
				got += (size_t)seen_once(seen, n, ev[i].data.u64, "timerfd expire");
		}
		t_last = now_ns();
	}
	report_missing(seen, n, got, "timerfd expire");
	res->ok = got == n;
	res->drain_ns = t_last > d ? t_last - d : 0;
	res->first_ns = t_first > d ? t_first - d : 0;
	res->per_s = res->drain_ns ? (double)got / (double)res->drain_ns * 1e9 : 0;
out:
	for (size_t i = 0; i < made; i++)
		close(fds[i]);
	close(ep);
	free(fds);
	free(seen);
	return ret;
}

struct lat_result {
	size_t n, got;
	uint64_t *fired;        /* sorted, fired_ns - deadline (chime only) */
	uint64_t *recv;         /* sorted, receive time - deadline */
};

static int run_lat_chime(const struct broker *b, size_t n, uint64_t span_ns, struct lat_result *res)
{
	struct chime_event ev[EV_BATCH];
	uint64_t *dl = xcalloc(n, sizeof(uint64_t)), rng = 0x9e3779b97f4a7c15u, t0, end;
	uint8_t *seen = xcalloc(n, 1);
	chime_t *c;
	size_t got = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	res->fired = xcalloc(n, sizeof(uint64_t));
	res->recv = xcalloc(n, sizeof(uint64_t));
	if (broker_open((struct broker *)b, &c) < 0)
		return -1;
	t0 = now_ns() + 100 * NS_PER_MS;
	for (size_t i = 0; i < n; i++) {
		chime_id_t id;
		int r;

		dl[i] = t0 + rng_next(&rng) % span_ns;
		r = chime_arm(c, 9, dl[i], 0, i, &id);
		if (r < 0) {
			PROBLEM("chime_arm failed: %s\n", strerror(-r));
			break;
		}
	}
	end = t0 + span_ns + 5 * NS_PER_S;
	while (got < n && now_ns() < end) {
		int k = chime_wait(c, ev, EV_BATCH, 100);
		uint64_t t = now_ns();

		if (k == -EINTR)
			continue;
		if (k < 0) {
			PROBLEM("chime_wait: %s\n", strerror(-k));
			break;
		}
		for (int i = 0; i < k; i++) {
			uint64_t idx = ev[i].user_data;

			if (!seen_once(seen, n, idx, "chime lateness"))
				continue;
			if (ev[i].deadline_ns != dl[idx])
				PROBLEM("chime: timer %" PRIu64 " came back with deadline %" PRIu64 ", armed %" PRIu64 "\n",
					idx, ev[i].deadline_ns, dl[idx]);
			if (ev[i].fired_ns < dl[idx] || t < dl[idx])
				PROBLEM("chime: timer %" PRIu64 " fired early (fired %" PRId64 " ns, received %" PRId64
					" ns after its deadline)\n", idx, (int64_t)(ev[i].fired_ns - dl[idx]),
					(int64_t)(t - dl[idx]));
			res->fired[got] = ev[i].fired_ns > dl[idx] ? ev[i].fired_ns - dl[idx] : 0;
			res->recv[got] = t > dl[idx] ? t - dl[idx] : 0;
			got++;
		}
	}
	report_missing(seen, n, got, "chime lateness");
	res->got = got;
	qsort(res->fired, got, sizeof(uint64_t), cmp_u64);
	qsort(res->recv, got, sizeof(uint64_t), cmp_u64);
	chime_close(c);
	free(dl);
	free(seen);
	wait_armed(b, 0, 60 * NS_PER_S);
	return 0;
}

static int run_lat_tfd(size_t n, uint64_t span_ns, struct lat_result *res)
{
	struct epoll_event ev[EV_BATCH];
	uint64_t *dl = xcalloc(n, sizeof(uint64_t)), rng = 0x9e3779b97f4a7c15u, t0, end;
	int *fds = xcalloc(n, sizeof(int));
	uint8_t *seen = xcalloc(n, 1);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	size_t got = 0, made = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	res->recv = xcalloc(n, sizeof(uint64_t));
	t0 = now_ns() + 300 * NS_PER_MS;    /* creating 100k timerfds takes ~0.2 s */
	for (; made < n; made++) {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = made };

		dl[made] = t0 + rng_next(&rng) % span_ns;
		fds[made] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (fds[made] < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fds[made], &e) < 0 ||
		    tfd_set(fds[made], dl[made]) < 0) {
			fprintf(stderr, "chime-bench: timerfd %zu: %s\n", made, strerror(errno));
			if (fds[made] >= 0)
				close(fds[made]);
			break;
		}
	}
	end = t0 + span_ns + 5 * NS_PER_S;
	while (got < made && now_ns() < end) {
		int k = epoll_wait(ep, ev, EV_BATCH, 100);
		uint64_t t = now_ns();

		for (int i = 0; i < k; i++) {
			uint64_t idx = ev[i].data.u64, cnt;

			if (read(fds[idx], &cnt, sizeof(cnt)) != sizeof(cnt) || !seen_once(seen, n, idx, "timerfd"))
				continue;
			res->recv[got++] = t > dl[idx] ? t - dl[idx] : 0;
		}
	}
	res->got = got;
	qsort(res->recv, got, sizeof(uint64_t), cmp_u64);
	for (size_t i = 0; i < made; i++)
		close(fds[i]);
	close(ep);
	free(fds);
	free(dl);
	free(seen);
	return made == n ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* the table                                                                  */
/* ------------------------------------------------------------------------ */

/* Raise RLIMIT_NOFILE to hold `want` fds; returns how many timerfds fit. */
static size_t fd_room(size_t want)
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

static void print_header(const struct broker *b, const char *mode, size_t tfd_max)
{
	struct utsname u;
	char model[128] = "?", line[256];
	double la[3] = { 0, 0, 0 };
	FILE *f = fopen("/proc/cpuinfo", "r");

	if (f) {
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
				snprintf(model, sizeof(model), "%s", strchr(line, ':') + 2);
				model[strcspn(model, "\n")] = '\0';
				break;
			}
		fclose(f);
	}
	uname(&u);
	getloadavg(la, 3);
	printf("chime-bench e2e (%s): libchime + chimed end to end, beside one timerfd per timer\n", mode);
	printf("machine: %ld CPUs online (nproc), %s, Linux %s; load average %.2f %.2f %.2f at start\n",
	       sysconf(_SC_NPROCESSORS_ONLN), model, u.release, la[0], la[1], la[2]);
	printf("broker:  %s chimed, socket %s: %u shard(s), spin %" PRId64 " us, resolution %" PRIu64
	       " us, sq %u / cq %u slots per client and shard\n",
	       b->pid ? "private" : "external", b->sock, b->nr_shards, b->ctl->spin_us,
	       b->ctl->resolution_ns / 1000, b->ctl->sq_size, b->ctl->cq_size);
	printf("method:  client ops: clock_gettime(CLOCK_MONOTONIC) around batches of calls on the calling\n"
	       "         thread; figure = median of batch means (mean of all ops beside it; Mops/s = all\n"
	       "         threads' ops / wall time of the phase). Deadlines 1 h ahead (nothing fires). arm grows\n"
	       "         0->N, reset runs at N, cancel shrinks N->0; T threads share one chime_t, N/T each; the\n"
	       "         bench waits for the broker's `armed` counter between phases. timerfd: create+settime\n"
	       "         (ABSTIME) per arm, settime per reset, close per cancel.\n");
	printf("targets: <= 20 ns per client op; >= 10 M ops/s per shard at 1M armed.\n"
	       "         reference on this VM: timerfd create+arm 1.3-1.8 us, re-arm 0.6-1.4 us.\n");
	if (tfd_max)
		printf("fds:     RLIMIT_NOFILE allows %zu timerfds\n", tfd_max);
	printf("\n");
}

struct cfg {
	const char *socket;
	int quick;
	int shards;
	const char *only;
};

static int want(const struct cfg *cf, const char *part)
{
	return !cf->only || strstr(cf->only, part) != NULL;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chime-bench e2e [--socket PATH] [--quick] [--shards N] [--only PARTS]\n"
		"End to end: ns per chime_arm/reset/cancel (1 and 2 threads, 100k and 1M armed),\n"
		"the broker's ops/s per shard, expirations/s to a draining client and lateness,\n"
		"beside one timerfd per timer.\n"
		"\n"
		"  -s, --socket PATH   use the chimed at PATH (default: start a private one, from\n"
		"                      $CHIMED or next to this program, and stop it at the end)\n"
		"  -q, --quick         small sizes (a smoke test, a few seconds)\n"
		"  -n, --shards N      shards of the private chimed (default: its default, one per CPU)\n"
		"      --only PARTS    comma list of ops,flood,expire,lat,timerfd (default: all)\n"
		"  -h, --help          show this help\n");
}

int bench_e2e(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "shards", required_argument, NULL, 'n' },
		{ "only", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cfg cf = { .socket = NULL, .quick = 0, .shards = 0, .only = NULL };
	struct broker b;
	size_t sizes_full[] = { 100000, 1000000 }, sizes_quick[] = { 10000, 50000 };
	size_t *sizes, tfd_max, nsizes = 2;
	unsigned batch;
	uint64_t flood_ns, span_ns, t_run = now_ns();
	size_t n_expire, n_lat, n_expire_tfd, n_lat_tfd;
	int opt;

	signal(SIGPIPE, SIG_IGN);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:qn:h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's': cf.socket = optarg; break;
		case 'q': cf.quick = 1; break;
		case 'n': cf.shards = atoi(optarg); break;
		case 'o': cf.only = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || cf.shards < 0) {
		usage(stderr);
		return 2;
	}
	sizes = cf.quick ? sizes_quick : sizes_full;
	batch = cf.quick ? 100 : 1000;
	flood_ns = cf.quick ? 300 * NS_PER_MS : 2 * NS_PER_S;
	span_ns = cf.quick ? 500 * NS_PER_MS : 2 * NS_PER_S;
	n_expire = cf.quick ? 50000 : 1000000;
	n_expire_tfd = cf.quick ? 10000 : 100000;
	n_lat = cf.quick ? 10000 : 100000;
	n_lat_tfd = n_lat;

	memset(&b, 0, sizeof(b));
	if (cf.socket) {
		snprintf(b.sock, sizeof(b.sock), "%s", cf.socket);
		if (broker_map_ctl(&b) < 0)
			return 1;
	} else if (broker_start(&b, cf.shards) < 0) {
		broker_stop(&b);
		return 1;
	}
	tfd_max = want(&cf, "timerfd") ? fd_room(sizes[nsizes - 1]) : 0;
	print_header(&b, cf.quick ? "--quick" : "full", tfd_max);
	if (n_expire_tfd > tfd_max)
		n_expire_tfd = tfd_max / 1000 * 1000;
	if (n_lat_tfd > tfd_max)
		n_lat_tfd = tfd_max / 1000 * 1000;

	/* 1. client operations */
	if (want(&cf, "ops") || want(&cf, "timerfd")) {
		printf("client operations: ns per op on the calling thread, median of batches of %u (mean) | Mops/s all threads\n",
		       batch);
		printf("  %-6s %3s %-7s | %-31s | %-44s\n", "armed", "thr", "op", "chime",
		       "timerfd (op)");
		for (size_t si = 0; si < nsizes; si++) {
			for (unsigned nthr = 1; nthr <= MAX_THR; nthr++) {
				struct op_result rc[NR_OPS], rt[NR_OPS];
				size_t nt = sizes[si] <= tfd_max ? sizes[si] : tfd_max / 1000 * 1000;
				int have_c = 0, have_t = 0;
				char cnt[24], tcnt[24];

				if (want(&cf, "ops") && run_ops(IMPL_CHIME, &b, sizes[si], nthr, batch, rc) == 0)
					have_c = 1;
				else if (want(&cf, "ops"))
					have_c = -1;
				/* Above the fd limit: as many timerfds as it allows, and say so. */
				if (want(&cf, "timerfd") && nt >= 1000)
					have_t = run_ops(IMPL_TFD, NULL, nt, nthr, batch, rt) == 0 ? 1 : -1;
				fmt_count(tcnt, sizeof(tcnt), nt);
				for (int op = 0; op < NR_OPS; op++) {
					char cs[96] = "-", ts[96] = "-";

					if (have_c)
						snprintf(cs, sizeof(cs), "%7.1f (%7.1f) %6.2f %s", rc[op].median_ns,
							 rc[op].mean_ns, rc[op].mops,
							 rc[op].err ? "ERR" : rc[op].median_ns <= 20 ? "ok  " : "MISS");
					if (have_t)
						snprintf(ts, sizeof(ts), "%7.1f (%7.1f) %6.2f %-14s%s%s%s", rt[op].median_ns,
							 rt[op].mean_ns, rt[op].mops, tfd_op_name[op],
							 rt[op].err ? " ERR" : "", nt < sizes[si] ? " at " : "",
							 nt < sizes[si] ? tcnt : "");
					else if (want(&cf, "timerfd"))
						snprintf(ts, sizeof(ts), "not run: RLIMIT_NOFILE allows %zu", tfd_max);
					printf("  %-6s %3u %-7s | %-31s | %-44s\n",
					       fmt_count(cnt, sizeof(cnt), sizes[si]), nthr, op_name[op], cs, ts);
					if (have_c && rc[op].err)
						PROBLEM("chime %s: %s\n", op_name[op], strerror(-rc[op].err));
					if (have_t && rt[op].err)
						printf("  (timerfd %s: %s)\n", tfd_op_name[op], strerror(-rt[op].err));
				}
				fflush(stdout);
			}
		}
		printf("  (ok/MISS: median against the 20 ns target)\n");
		if (want(&cf, "timerfd") && tfd_max < sizes[nsizes - 1])
			printf("  (timerfd \"at N\": RLIMIT_NOFILE could not be raised above %zu fds here (hard\n"
			       "   limit, no CAP_SYS_RESOURCE), so those rows ran with N timerfds armed)\n",
			       tfd_max + 256 + 64);
		printf("\n");
	}

	/* 2. broker throughput */
	if (want(&cf, "flood")) {
		printf("broker: sustained ops/s per shard, %u threads flooding chime_reset for %.1f s\n"
		       "        (shards' arms+resets+cancels from %s.ctl over the window / window / %u shards)\n",
		       MAX_THR, (double)flood_ns / 1e9, b.sock, b.nr_shards);
		printf("  %-6s | %-17s | %-10s | %-22s | %-17s | %s\n", "armed", "M ops/s per shard",
		       "shard busy", "M ops/s per busy shard", "client M resets/s", "target >= 10 M");
		for (size_t si = 0; si < nsizes; si++) {
			struct flood_result fr;
			char cnt[24];

			if (run_flood(&b, sizes[si], flood_ns, &fr) < 0) {
				if (fr.err)
					PROBLEM("flood: %s\n", strerror(-fr.err));
				printf("  %-6s | not measured\n", fmt_count(cnt, sizeof(cnt), sizes[si]));
				continue;
			}
			printf("  %-6s | %17.2f | %9.0f%% | %22.2f | %17.2f | %s\n",
			       fmt_count(cnt, sizeof(cnt), sizes[si]), fr.ops_per_shard, fr.busy_share * 100,
			       fr.ops_per_busy, fr.client_mops,
			       si == nsizes - 1 ? (fr.ops_per_shard >= 10 ? "ok" : "MISS") : "");
			fflush(stdout);
		}
		if (want(&cf, "timerfd") && tfd_max >= 1000) {
			double t = run_tflood(sizes[0] <= tfd_max ? sizes[0] : tfd_max / 1000 * 1000, flood_ns);
			char cnt[24];

			printf("  timerfd: %u threads timerfd_settime over %s timerfds: %.2f M/s in all (the kernel's\n"
			       "           timers have no shard; that is the whole machine)\n",
			       MAX_THR, fmt_count(cnt, sizeof(cnt), sizes[0] <= tfd_max ? sizes[0] : tfd_max / 1000 * 1000), t);
		}
		printf("  counters' own cost: chimed has no switch to turn its counters off, so no with/without\n"
		       "  run is possible at run time; see the perf sample share in the report.\n\n");
	}

	/* 3. expirations */
	if (want(&cf, "expire")) {
		struct expire_result er;
		char cnt[24];

		printf("expirations delivered to a draining client (N timers due at the same instant)\n");
		printf("  %-34s %6s | %-21s | %-21s | %s\n", "", "N", "deadline->first (ms)",
		       "deadline->last (ms)", "M events/s");
		if (run_expire_chime(&b, n_expire, cf.quick ? 500 * NS_PER_MS : 2 * NS_PER_S, &er) == 0)
			printf("  %-34s %6s | %21.2f | %21.2f | %.2f%s\n", "chime (chime_poll loop)",
			       fmt_count(cnt, sizeof(cnt), er.n), (double)er.first_ns / 1e6,
			       (double)er.drain_ns / 1e6, er.per_s / 1e6, er.ok ? "" : "  INCOMPLETE");
		if (want(&cf, "timerfd")) {
			if (n_expire_tfd >= 1000 && run_expire_tfd(n_expire_tfd, NS_PER_S, &er) == 0)
				printf("  %-34s %6s | %21.2f | %21.2f | %.2f%s\n", "timerfd (epoll_wait + read each)",
				       fmt_count(cnt, sizeof(cnt), er.n), (double)er.first_ns / 1e6,
				       (double)er.drain_ns / 1e6, er.per_s / 1e6, er.ok ? "" : "  INCOMPLETE");
			else if (n_expire_tfd < 1000)
				printf("  timerfd: not run, RLIMIT_NOFILE allows %zu fds\n", tfd_max);
		}
		printf("\n");
	}

	/* 4. lateness */
	if (want(&cf, "lat")) {
		struct lat_result lc, lt;
		char cnt[24];
		int have_t = 0;

		printf("lateness: %s timers, random deadlines over %.1f s, drained blocking (us)\n",
		       fmt_count(cnt, sizeof(cnt), n_lat), (double)span_ns / 1e9);
		printf("  %-40s | %9s %9s %9s %9s | %s\n", "", "p50", "p99", "p99.9", "max", "events");
		if (run_lat_chime(&b, n_lat, span_ns, &lc) == 0) {
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", "chime fired_ns - deadline (broker)",
			       pct(lc.fired, lc.got, .5) / 1e3, pct(lc.fired, lc.got, .99) / 1e3,
			       pct(lc.fired, lc.got, .999) / 1e3, (lc.got ? lc.fired[lc.got - 1] : 0) / 1e3,
			       lc.got, lc.n);
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", "chime received - deadline (chime_wait)",
			       pct(lc.recv, lc.got, .5) / 1e3, pct(lc.recv, lc.got, .99) / 1e3,
			       pct(lc.recv, lc.got, .999) / 1e3, (lc.got ? lc.recv[lc.got - 1] : 0) / 1e3,
			       lc.got, lc.n);
		}
		if (want(&cf, "timerfd") && n_lat_tfd >= 1000 && run_lat_tfd(n_lat_tfd, span_ns, &lt) == 0) {
			have_t = 1;
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", "timerfd received - deadline (epoll)",
			       pct(lt.recv, lt.got, .5) / 1e3, pct(lt.recv, lt.got, .99) / 1e3,
			       pct(lt.recv, lt.got, .999) / 1e3, (lt.got ? lt.recv[lt.got - 1] : 0) / 1e3,
			       lt.got, lt.n);
		}
		free(lc.fired);
		free(lc.recv);
		if (have_t)
			free(lt.recv);
		printf("\n");
	}

	{
		double la[3] = { 0, 0, 0 };

		getloadavg(la, 3);
		printf("done in %.1f s; load average %.2f %.2f %.2f at the end\n",
		       (double)(now_ns() - t_run) / 1e9, la[0], la[1], la[2]);
	}
	if (broker_stop(&b) < 0)
		g_problems++;
	if (g_problems)
		printf("%d correctness problem(s) seen: see the lines marked !! above\n", g_problems);
	return g_problems ? 1 : 0;
}
