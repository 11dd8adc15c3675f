/* SPDX-License-Identifier: MIT */
/*
 * compare_run.c - chime-bench compare: the timing harness of the in-process
 * contenders, chime's wheel as one of them, and what e2e's phases do not
 * measure for chime and timerfd (memory, the seed workload). See compare.h.
 */
#include <chime.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "compare.h"
#include "wheel.h"

const char *const contender_name[NR_C] = { "chime", "wheel", "timerfd", "libuv", "libev" };
const char *const fig_name[NR_F] = { "arm_ns", "reset_ns", "touch_ns", "cancel_ns", "expire_ns", "expire_first_us", "mem_bytes" };

double seed_cpu_self(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* ---- the harness ------------------------------------------------------------ */

/*
 * Timed in batches on this thread, as e2e's client operations are: arm grows
 * 0 -> n, reset and touch run at n, cancel shrinks n -> 0; the figures are the median
 * of the batch means and the mean of all (e2e's two). Memory: this process's RSS grown by setup and arming, / n.
 */
int run_inproc_ops(const struct inproc *c, size_t n, unsigned batch, struct size_res *r)
{
	double *m = xcalloc((n + batch - 1) / batch, sizeof(double));
	uint64_t rss0 = bench_rss_bytes(0), rss1, base;
	int err = c->setup(n);

	r->n = n;
	if (err) {
		free(m);
		return err;
	}
	base = now_ns() + FAR_NS;
	for (int op = 0; op < NR_OPS && !err; op++) {
		uint64_t busy = 0;
		size_t k = 0;

		for (size_t i = 0; i < n && !err; i += batch, k++) {
			size_t e = i + batch < n ? i + batch : n;
			uint64_t t = now_ns(), dt;

			err = op == OP_ARM ? c->arm(i, e, base) : op == OP_RESET ? c->reset(i, e, base) :
			      op == OP_TOUCH ? c->reset(i, e, base + NS_PER_S) : c->cancel(i, e);
			dt = now_ns() - t;
			busy += dt;
			m[k] = (double)dt / (double)(e - i);
		}
		r->fig[F_ARM + op] = bench_median(m, k);
		r->mean[op] = (double)busy / (double)n;
		if (op == OP_ARM) {
			rss1 = bench_rss_bytes(0);
			r->fig[F_MEM] = rss1 > rss0 ? (double)(rss1 - rss0) / (double)n : 0;
		}
	}
	c->teardown();
	free(m);
	return err;
}

/*
 * All n due at one instant (a whole ms, for the libraries that count in ms):
 * ns per timer delivered. Armed before the deadline, or the figure would
 * count arming: a gap too short is doubled, as for chime and timerfd.
 */
int run_inproc_expire(const struct inproc *c, size_t n, uint64_t gap_ns, struct size_res *r)
{
	uint64_t d, first = 0, last = 0;
	long got;
	int err;

	for (int attempt = 0;; attempt++) {
		if ((err = c->setup(n)) < 0)
			return err;
		d = (now_ns() + gap_ns + NS_PER_MS - 1) / NS_PER_MS * NS_PER_MS;
		if ((err = c->arm_at(n, d)) < 0) {
			c->teardown();
			return err;
		}
		if (now_ns() + NS_PER_MS < d)
			break;
		c->teardown();
		if (attempt == 2) {
			PROBLEM("could not arm %zu timers within %.1f s; expiry not measured\n", n, (double)gap_ns / 1e9);
			return -ETIME;
		}
		gap_ns *= 2;
	}
	got = c->expire(n, &first, &last);
	c->teardown();
	if (got < 0)
		return (int)got;
	if ((size_t)got != n) {
		PROBLEM("%zu timers due, %ld callbacks ran\n", n, got);
		return -EIO;
	}
	r->fig[F_EXPIRE] = last > d ? (double)(last - d) / (double)n : 0;
	r->fig[F_FIRST] = first > d ? (double)(first - d) / 1e3 : 0;
	return 0;
}

/* ---- chime's wheel, in this process (broker/wheel.c, as `chime-bench wheel` runs it) ---- */

/*
 * As the broker applies the records: an arm takes a node from the slab
 * (wheel_alloc) and a cancel gives it back (wheel_free), as libuv's and
 * libev's figures include uv_timer_init / ev_timer_init; w_ids[] holds the
 * nodes, as an application holds chime's ids and libuv's handles.
 */
uint64_t inproc_wheel_resolution_ns = 100000;
static struct wheel W;
static void *w_mem;
static size_t w_len;
static uint32_t *w_ids;

static int w_setup(size_t n)
{
	w_len = wheel_region_size((uint32_t)n);
	w_mem = bench_map(w_len);
	if (wheel_init(&W, w_mem, w_len, (uint32_t)n, inproc_wheel_resolution_ns, now_ns())) {
		bench_unmap(w_mem, w_len);
		return -EINVAL;
	}
	/* the broker populates its slab ahead of the high-water mark (ARCHITECTURE.md, "Slab pages") */
	(void)madvise(w_mem, w_len, MADV_POPULATE_WRITE);
	w_ids = xcalloc(n, sizeof(*w_ids));
	return 0;
}

static int w_arm(size_t lo, size_t hi, uint64_t base)
{
	for (size_t i = lo; i < hi; i++) {
		if ((w_ids[i] = wheel_alloc(&W)) == CHIME_NIL)
			return -ENOMEM;
		wheel_arm(&W, w_ids[i], base + i);
	}
	return 0;
}

static int w_reset(size_t lo, size_t hi, uint64_t base)
{
	for (size_t i = lo; i < hi; i++)
		wheel_reset(&W, w_ids[i], base + NS_PER_S + i);
	return 0;
}

static int w_cancel(size_t lo, size_t hi)
{
	for (size_t i = lo; i < hi; i++)
		wheel_free(&W, w_ids[i]);       /* off its list, and back to the slab */
	return 0;
}

static uint64_t w_due;

static int w_arm_at(size_t n, uint64_t d)
{
	for (size_t i = 0; i < n; i++) {
		if ((w_ids[i] = wheel_alloc(&W)) == CHIME_NIL)
			return -ENOMEM;
		wheel_arm(&W, w_ids[i], d);
	}
	w_due = d;
	return 0;
}

/* The broker's loop without the rings: sleep to the deadline, advance, pop. */
static long w_expire(size_t n, uint64_t *first, uint64_t *last)
{
	uint32_t buf[512];
	size_t got = 0;
	unsigned k;

	sleep_until(w_due);
	while (got < n) {
		wheel_advance(&W, now_ns());
		while ((k = wheel_pop_expired(&W, buf, 512)) > 0) {
			if (!got)
				*first = now_ns();
			got += k;
		}
	}
	*last = now_ns();
	return (long)got;
}

static void w_teardown(void)
{
	wheel_fini(&W);
	bench_unmap(w_mem, w_len);
	free(w_ids);
	w_ids = NULL;
}

const struct inproc inproc_wheel = {
	.setup = w_setup, .arm = w_arm, .reset = w_reset, .cancel = w_cancel,
	.arm_at = w_arm_at, .expire = w_expire, .teardown = w_teardown,
};

/* ---- chime end to end, and timerfd: what e2e's phases do not measure ---- */

/*
 * Client RSS grown while arming n (its id array included, as an application
 * keeps ids), / n, plus the broker's bytes per node: its slab as the wheel
 * sizes it (wheel_region_size over the shard's capacity). The broker
 * allocates nothing else per timer (ARCHITECTURE.md).
 */
int run_chime_mem(const struct broker *b, size_t n, double *bytes)
{
	uint32_t cap = b->ctl->shard_capacity;
	uint64_t rss0, rss1, base;
	uint64_t *ids;
	chime_t *c;
	int r = 0;

	if (broker_open((struct broker *)b, 0, &c) < 0)
		return -1;
	rss0 = bench_rss_bytes(0);
	ids = xcalloc(n, sizeof(*ids));
	base = now_ns() + FAR_NS;
	for (size_t i = 0; i < n && r == 0; i++)
		r = chime_arm(c, i, base + i, 0, i, &ids[i]);
	rss1 = bench_rss_bytes(0);
	if (r == 0 && wait_armed(b, n, 60 * NS_PER_S) < 0)
		r = -ETIMEDOUT;
	*bytes = (rss1 > rss0 ? (double)(rss1 - rss0) / (double)n : 0) +
		 (double)wheel_region_size(cap) / cap;
	chime_close(c);         /* the broker reclaims them all */
	free(ids);
	wait_armed(b, 0, 60 * NS_PER_S);
	if (r < 0)
		PROBLEM("chime memory at %zu timers: %s\n", n, strerror(-r));
	return r;
}

/*
 * The kernel's slab memory in use, bytes, system-wide: the objects in use
 * (active_objs x objsize) of /proc/slabinfo where it is readable (root),
 * else "Slab:" of /proc/meminfo (pages, so freed objects still cached in
 * a slab hide a new allocation: a coarser figure).
 */
static uint64_t slab_bytes(void)
{
	char line[512], name[64];
	unsigned long long kb = 0, act, num, size, sum = 0;
	FILE *f = fopen("/proc/slabinfo", "r");

	if (f) {
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "%63s %llu %llu %llu", name, &act, &num, &size) == 4)
				sum += act * size;
		fclose(f);
		if (sum)
			return sum;
	}
	if (!(f = fopen("/proc/meminfo", "r")))
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Slab: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* One timerfd per timer in an epoll set: our RSS plus the kernel's slab growth (system-wide), / n. */
int run_tfd_mem(size_t n, double *bytes)
{
	int *fds = xcalloc(n, sizeof(int)), ep = epoll_create1(EPOLL_CLOEXEC), r = 0;
	uint64_t s0 = slab_bytes(), rss0 = bench_rss_bytes(0), s1, rss1, base = now_ns() + FAR_NS;
	size_t made = 0;

	for (; made < n; made++) {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = made };

		fds[made] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (fds[made] < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fds[made], &e) < 0 ||
		    tfd_set(fds[made], base + made) < 0) {
			r = -errno;
			if (fds[made] >= 0)
				close(fds[made]);
			break;
		}
	}
	s1 = slab_bytes();
	rss1 = bench_rss_bytes(0);
	*bytes = ((rss1 > rss0 ? (double)(rss1 - rss0) : 0) + (s1 > s0 ? (double)(s1 - s0) : 0)) / (double)n;
	for (size_t i = 0; i < made; i++)
		close(fds[i]);
	close(ep);
	free(fds);
	return r;
}

/*
 * The seed workload through libchime: SEED_CONNS timers SEED_IDLE_NS ahead,
 * then `rate` chime_reset()s a second, round robin, in SEED_TICK_NS ticks
 * (sleeping between), for wall_ns. CPU of this process and of the broker.
 */
int run_chime_seed(const struct broker *b, unsigned flags, double rate, uint64_t wall_ns, struct seed_res *res)
{
	uint64_t *ids = xcalloc(SEED_CONNS, sizeof(*ids)), t0, t, t1, next, done = 0;
	struct bench_proc p0, p1;
	double c0, c1;
	size_t i = 0;
	chime_t *c;
	int r = 0;

	memset(res, 0, sizeof(*res));
	if (broker_open((struct broker *)b, flags, &c) < 0) {
		free(ids);
		return -1;
	}
	t = now_ns();
	for (size_t k = 0; k < SEED_CONNS && r == 0; k++)
		r = chime_arm(c, k, t + SEED_IDLE_NS, 0, k, &ids[k]);
	if (r == 0 && wait_armed(b, SEED_CONNS, 60 * NS_PER_S) < 0)
		r = -ETIMEDOUT;
	/* SEED_WARM: each connection touched once (a first reset is a record; later ones, the word) */
	t = now_ns();
	for (size_t k = 0; k < SEED_CONNS && r == 0; k++)
		r = chime_reset(c, ids[k], t + SEED_IDLE_NS);
	if (r == 0 && chime_flush(c) < 0)
		r = -ENOTCONN;
	sleep_ns(200 * NS_PER_MS);      /* applied; the shards back asleep */
	c0 = seed_cpu_self();
	if (r == 0 && bench_proc_sample(b->ctl->pid, &p0) < 0)
		r = -ESRCH;     /* the broker's /proc: no CPU figure without it */
	t0 = next = now_ns();
	while (r == 0 && (t = now_ns()) < t0 + wall_ns) {
		uint64_t k = seed_owed(t0, t, rate, done), dl = t + SEED_IDLE_NS;

		for (; k && r == 0; k--, done++) {
			r = chime_reset(c, ids[i], dl);
			if (++i == SEED_CONNS)
				i = 0;
		}
		next += SEED_TICK_NS;
		if (next > now_ns())
			sleep_until(next);
	}
	t1 = now_ns();
	c1 = seed_cpu_self();
	if (r == 0 && bench_proc_sample(b->ctl->pid, &p1) < 0)
		r = -ESRCH;
	res->cpu_client = (c1 - c0) / ((double)(t1 - t0) / 1e9);
	res->cpu_broker = (double)(p1.sched_ns - p0.sched_ns) / (double)(p1.t_ns - p0.t_ns);
	res->touches_per_s = (double)done / ((double)(t1 - t0) / 1e9);
	res->ran = r == 0;
	chime_close(c);
	free(ids);
	wait_armed(b, 0, 60 * NS_PER_S);
	if (r < 0)
		PROBLEM("chime seed workload: %s\n", strerror(-r));
	return r;
}
