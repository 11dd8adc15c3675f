/* SPDX-License-Identifier: MIT */
/*
 * e2e_ops.c - chime-bench e2e, phases 1 and 2: client operations (chime and
 * timerfd), and the broker's throughput under a flood of resets. See e2e.c.
 */
#include <chime.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
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

/* ------------------------------------------------------------------------ */
/* 1. client operations, chime and timerfd                                    */
/* ------------------------------------------------------------------------ */

const char *const op_name[NR_OPS] = { "arm", "reset", "touch", "cancel" };
const char *const tfd_op_name[NR_OPS] = { "create+settime", "settime", "settime", "close" };



struct op_shared {
	int impl;
	int cold;               /* paced: the caches flushed before the first resets */
	chime_t *c;
	const struct broker *b;
	int paced;              /* each batch into rings the broker has emptied, all threads together */
	size_t paced_batches;   /* paced: batches per thread, the same for all (some may be empty) */
	int paced_err;          /* paced: thread 0 could not pace the next batch */
	pthread_barrier_t bbar; /* paced: the threads, twice per batch */
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
	int stop;               /* a phase failed: the threads leave at the next phase start */
};

struct op_thread {
	struct op_shared *sh;
	unsigned idx;
	pthread_t tid;
};

/* Timer i's deadline after op: armed at base + i, reset 1 s later, touched 1 s later still. */
static inline uint64_t op_deadline(const struct op_shared *sh, int op, size_t i)
{
	return sh->base_ns + (op == OP_RESET ? NS_PER_S : op == OP_TOUCH ? 2 * NS_PER_S : 0) + i;
}

/* ids[lo, hi) through chime_submit, SUBMIT_BATCH operations a call: 0 or the first -errno. */
static int op_submit(struct op_shared *sh, int op, size_t lo, size_t hi)
{
	struct chime_op ops[SUBMIT_BATCH];

	for (size_t i = lo; i < hi; i += SUBMIT_BATCH) {
		unsigned n = hi - i < SUBMIT_BATCH ? (unsigned)(hi - i) : SUBMIT_BATCH;
		int r;

		for (unsigned k = 0; k < n; k++) {
			size_t j = i + k;

			ops[k] = (struct chime_op){ .op = op == OP_ARM ? CHIME_ARM : op == OP_CANCEL ? CHIME_CANCEL : CHIME_RESET,
						    .id = sh->ids[j], .key = j, .user_data = j,
						    .deadline_ns = op_deadline(sh, op, j) };
		}
		r = chime_submit(sh->c, ops, n);
		if (r != (int)n) {
			for (unsigned k = 0; k < n; k++)
				if (ops[k].result < 0)
					return ops[k].result;
			return r < 0 ? r : -EIO;
		}
		if (op == OP_ARM)
			for (unsigned k = 0; k < n; k++)
				sh->ids[i + k] = ops[k].id;
	}
	return 0;
}

/* One batch of op over ids[lo, hi): returns 0 or the first -errno. */
static int op_batch(struct op_shared *sh, int op, size_t lo, size_t hi)
{
	uint64_t *ids = sh->ids;
	int r;

	if (sh->impl == IMPL_SUBMIT)
		return op_submit(sh, op, lo, hi);

	if (sh->impl == IMPL_CHIME) {
		switch (op) {
		case OP_ARM:
			for (size_t i = lo; i < hi; i++)
				if ((r = chime_arm(sh->c, i, op_deadline(sh, op, i), 0, i, &ids[i])) < 0)
					return r;
			break;
		case OP_RESET:
		case OP_TOUCH:
			for (size_t i = lo; i < hi; i++)
				if ((r = chime_reset(sh->c, ids[i], op_deadline(sh, op, i))) < 0)
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
			if ((r = tfd_set(fd, op_deadline(sh, op, i))) < 0)
				return r;
		}
		break;
	case OP_RESET:
	case OP_TOUCH:
		for (size_t i = lo; i < hi; i++)
			if ((r = tfd_set((int)ids[i], op_deadline(sh, op, i))) < 0)
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

/*
 * Paced: before each batch, untimed, every thread's earlier batches have
 * been applied by the broker (its rings are empty) and then all threads
 * start theirs together. Returns 0 or why the pacing failed (the same for
 * every thread, so that they leave the loop together).
 */
static int pace(struct op_thread *t)
{
	struct op_shared *sh = t->sh;

	pthread_barrier_wait(&sh->bbar);
	if (t->idx == 0 && !sh->paced_err) {
		/* a batch that can wait rang no doorbell */
		if (sh->impl != IMPL_TFD && chime_flush(sh->c) < 0)
			sh->paced_err = -ENOTCONN;
		else if (sh->impl != IMPL_TFD && wait_applied(sh->c, 60 * NS_PER_S) < 0)
			sh->paced_err = -ETIMEDOUT;
	}
	pthread_barrier_wait(&sh->bbar);
	return sh->paced_err;
}

static void *op_thread_main(void *arg)
{
	struct op_thread *t = arg;
	struct op_shared *sh = t->sh;
	size_t per = sh->n / sh->nthr;
	size_t lo = per * t->idx, hi = t->idx + 1 == sh->nthr ? sh->n : lo + per;
	size_t nb = sh->paced ? sh->paced_batches : (hi - lo + sh->batch - 1) / sh->batch;

	for (int op = 0; op < NR_OPS; op++) {
		int r = 0;

		/* Phase start: every thread and the main thread (which waited for the broker). */
		pthread_barrier_wait(&sh->bar);
		if (sh->stop)
			break;
		sh->t0[op][t->idx] = now_ns();
		if (sh->paced && t->idx == 0)
			sh->paced_err = 0;
		for (size_t b = 0; b < nb; b++) {
			size_t i = lo + b * sh->batch, e = i + sh->batch < hi ? i + sh->batch : hi;
			uint64_t a, z;

			if (sh->paced) {
				int pr = pace(t);

				if (pr < 0) {
					if (!r)
						r = pr;
					break;
				}
			} else if (r) {
				break;
			}
			if (r || i >= hi)
				continue;       /* paced: still at every barrier */
			a = now_ns();
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

/* Each CPU's share of the flush: more than its caches hold, written a line at a time. */
#define FLUSH_BYTES (64u << 20)
#define FLUSH_MAX_CPUS 256u

struct flush_cpu {
	int cpu;
	pthread_t tid;
};

static void *flush_main(void *arg)
{
	struct flush_cpu *f = arg;
	volatile uint8_t *buf;

	if (e2e_pin_to(f->cpu) < 0)
		return NULL;
	buf = malloc(FLUSH_BYTES);
	if (!buf)
		return NULL;
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < FLUSH_BYTES; i += 64)
			buf[i] = (uint8_t)(i + (size_t)pass);
	free((void *)buf);
	return NULL;
}

/*
 * Evict what every CPU this process may use has cached (the shards' CPUs
 * too: a shard is preempted meanwhile), as an interval of other work
 * would: a keepalive's first reset comes seconds after its arm.
 */
static void flush_caches(void)
{
	struct flush_cpu f[FLUSH_MAX_CPUS];
	cpu_set_t set;
	unsigned n = 0;

	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return;
	for (int c = 0; c < CPU_SETSIZE && n < FLUSH_MAX_CPUS; c++)
		if (CPU_ISSET(c, &set)) {
			f[n].cpu = c;
			if (pthread_create(&f[n].tid, NULL, flush_main, &f[n]) == 0)
				n++;
		}
	for (unsigned i = 0; i < n; i++)
		pthread_join(f[i].tid, NULL);
}

/*
 * n timers, nthr threads: arm, reset, cancel. For chime, `b` is the broker
 * whose counters the phases wait for. res[op] gets the figures.
 */
static int ops_run(int impl, const struct broker *b, size_t n, unsigned nthr, unsigned batch, int paced,
		   int cold, struct op_result res[NR_OPS])
{
	struct op_shared sh;
	struct op_thread th[MAX_THR];
	chime_t *c = NULL;
	int ret = 0;

	memset(&sh, 0, sizeof(sh));
	memset(res, 0, sizeof(*res) * NR_OPS);
	if (impl != IMPL_TFD && (ret = broker_open((struct broker *)b, 0, &c)) < 0) {
		for (int op = 0; op < NR_OPS; op++)
			res[op].err = ret;      /* no figure: zeros would read as fast ops */
		return -1;
	}
	sh.impl = impl;
	sh.c = c;
	sh.b = b;
	sh.paced = paced;
	sh.cold = cold;
	sh.n = n;
	sh.batch = batch;
	sh.nthr = nthr;
	sh.ids = xcalloc(n, sizeof(*sh.ids));
	sh.nb_per_thr = (n / nthr + batch - 1) / batch + 1;
	/* the last thread has the most: n - (n / nthr) * (nthr - 1) */
	sh.paced_batches = (n - n / nthr * (nthr - 1) + batch - 1) / batch;
	for (int op = 0; op < NR_OPS; op++)
		sh.bmeans[op] = xcalloc(sh.nb_per_thr * nthr, sizeof(double));
	sh.base_ns = now_ns() + FAR_NS;
	pthread_barrier_init(&sh.bar, NULL, nthr + 1);
	pthread_barrier_init(&sh.bbar, NULL, nthr);
	for (unsigned i = 0; i < nthr; i++) {
		th[i].sh = &sh;
		th[i].idx = i;
		pthread_create(&th[i].tid, NULL, op_thread_main, &th[i]);
	}

	for (int op = 0; op < NR_OPS; op++) {
		if (cold && op == OP_RESET && !sh.stop)
			flush_caches();
		pthread_barrier_wait(&sh.bar);      /* go */
		if (sh.stop) {
			/* after a failed phase the ids are not what the next one needs: no figure */
			for (int k = op; k < NR_OPS; k++)
				res[k].err = -ECANCELED;
			break;
		}
		pthread_barrier_wait(&sh.bar);      /* done */
		for (unsigned i = 0; i < nthr; i++)
			if (sh.err[op][i])
				sh.stop = 1;
		if (sh.stop)
			continue;       /* not waiting minutes for counts a failed phase never reaches */
		/*
		 * Every record applied before the next phase: the armed count
		 * shows the arms and cancels, the rings the resets, which the
		 * touches must find applied (the shard flags a timer at its
		 * first reset); a burst that can wait rang no doorbell.
		 */
		if (impl != IMPL_TFD &&
		    (wait_armed(b, op == OP_CANCEL ? 0 : n, 60 * NS_PER_S) < 0 || chime_flush(c) < 0 ||
		     wait_applied(c, 60 * NS_PER_S) < 0)) {
			/* every call returned 0, but the broker did not apply the phase: not a figure */
			res[op].err = -ETIMEDOUT;
			sh.stop = 1;
		}
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
		res[op].median_ns = bench_median(m, nb);
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
	pthread_barrier_destroy(&sh.bbar);
	free(sh.ids);
	chime_close(c);
	return ret;
}
int run_ops(int impl, const struct broker *b, size_t n, unsigned nthr, unsigned batch,
	    struct op_result res[NR_OPS])
{
	return ops_run(impl, b, n, nthr, batch, 0, 0, res);
}

int run_ops_bursts(int impl, const struct broker *b, size_t n, unsigned nthr, unsigned batch, int cold,
		   struct op_result res[NR_OPS])
{
	return ops_run(impl, b, n, nthr, batch, 1, cold, res);
}

int run_sporadic(const struct broker *b, size_t n, uint64_t idle_ns, struct sporadic_result *res)
{
	uint64_t far = now_ns() + FAR_NS;
	chime_id_t keep, id;
	chime_t *c;
	int r = 0, tfd;

	memset(res, 0, sizeof(*res));
	if (broker_open((struct broker *)b, 0, &c) < 0)
		return -1;
	res->reset_ns = xcalloc(n, sizeof(uint64_t));
	res->arm_ns = xcalloc(n, sizeof(uint64_t));
	res->arm_far_ns = xcalloc(n, sizeof(uint64_t));
	res->tfd_ns = xcalloc(n, sizeof(uint64_t));
	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (tfd < 0) {
		r = -errno;
		goto out;
	}
	if ((r = chime_arm(c, 0, far, 0, 0, &keep)) < 0 || (r = tfd_set(tfd, far)) < 0)
		goto out;
	for (size_t i = 0; i < n && r == 0; i++) {
		/* each after idle_ns asleep, timed on this thread; r is its result */
#define AFTER_IDLE(dst, op) do { uint64_t a_; sleep_ns(idle_ns); a_ = now_ns(); r = (op); (dst) = now_ns() - a_; } while (0)
		AFTER_IDLE(res->reset_ns[i], chime_reset(c, keep, far + i));
		if (r < 0)
			break;
		AFTER_IDLE(res->arm_ns[i], chime_arm(c, 1, chime_now() + 50 * NS_PER_MS, 0, i, &id));
		if (r < 0)
			break;
		AFTER_IDLE(res->arm_far_ns[i], chime_arm(c, 2, chime_now() + 5 * NS_PER_S, 0, i, &id));
		/* untimed: gone again, so that the next one is the shard's earliest */
		if (r < 0 || (r = chime_cancel(c, id)) < 0 || (r = chime_flush(c)) < 0)
			break;
		AFTER_IDLE(res->tfd_ns[i], tfd_set(tfd, far + i));
#undef AFTER_IDLE
	}
	res->n = n;
	qsort(res->reset_ns, n, sizeof(uint64_t), cmp_u64);
	qsort(res->arm_ns, n, sizeof(uint64_t), cmp_u64);
	qsort(res->arm_far_ns, n, sizeof(uint64_t), cmp_u64);
	qsort(res->tfd_ns, n, sizeof(uint64_t), cmp_u64);
out:
	if (r < 0)
		PROBLEM("sporadic operations: %s\n", strerror(-r));
	if (tfd >= 0)
		close(tfd);
	chime_close(c);
	return r < 0 ? -1 : 0;
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

	while (!at_load(&f->stop)) {
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

int run_flood(const struct broker *b, size_t n, uint64_t dur_ns, struct flood_result *res)
{
	struct flood f;
	struct flood_thread th[MAX_THR];
	struct shard_sum s0, s1;
	uint64_t t_start, t_end, issued = 0;
	int ret = 0;

	memset(&f, 0, sizeof(f));
	memset(res, 0, sizeof(*res));
	/* the shards' pace at applying records: resets as records, not through the touch table */
	if (broker_open((struct broker *)b, CHIME_OPEN_RECORD_RESETS, &f.c) < 0)
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
	at_store(&f.stop, 1);
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
	int err[MAX_THR];       /* the first -errno: a failed call is no op done */
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

	while (!at_load(&f->stop)) {
		for (unsigned j = 0; j < 256; j++, k++) {
			int r = tfd_set(f->fds[i], f->base_ns + (k & 0xffffff) * 1000);

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

double run_tflood(size_t n, uint64_t dur_ns)
{
	struct tflood f;
	struct tflood_thread th[MAX_THR];
	uint64_t t0, t1, k = 0;
	size_t made = 0;
	int err = 0;

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
		fprintf(stderr, "%s: timerfd flood: timerfd %zu of %zu: %s\n", bench_prog, made, n, strerror(errno));
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
	at_store(&f.stop, 1);
	for (unsigned i = 0; i < MAX_THR; i++) {
		pthread_join(th[i].tid, NULL);
		k += f.done[i];
		if (f.err[i] && !err)
			err = f.err[i];
	}
	t1 = now_ns();
	for (size_t i = 0; i < n; i++)
		close(f.fds[i]);
	free(f.fds);
	if (err) {
		PROBLEM("timerfd flood: timerfd_settime: %s\n", strerror(-err));
		return -1;
	}
	return (double)k / (double)(t1 - t0) * 1e3;
}
