/* SPDX-License-Identifier: MIT */
/* aside.c - see aside.h. */
#include "aside.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"
#include "clock.h"
#include "segment.h"

struct aside_node {
	struct aside_node *next;
	struct aside_job job;
};

struct aside {
	int wake_fd;
	unsigned max_threads;
	char name[16];
	pthread_mutex_t lock;
	pthread_cond_t work;            /* a job queued, or stopping */
	pthread_cond_t idle;            /* the queue ran empty (aside_drain()), or the last thread ended */
	struct aside_node *head, **tail;        /* under lock: to run */
	struct aside_node *done, **done_tail;   /* under lock: run, results for aside_reap() */
	unsigned threads;               /* under lock: alive */
	unsigned waiting;               /* under lock: of those, waiting for work */
	unsigned running;               /* under lock: of those, in a job */
	uint64_t taken, taken_seen;     /* under lock: jobs taken; as aside_unstick() last saw it */
	bool stopping;                  /* under lock */
	bool orphan;                    /* under lock: aside_stop() gave up; the last thread frees everything */
	uint64_t finished;              /* results put on done; atomic, for aside_reap()'s look */
	uint64_t reaped;                /* the owner's: results taken */
};

static int run(struct aside_job *j)
{
	switch (j->op) {
	case ASIDE_RESERVE:
		if (fallocate(j->fd, 0, (off_t)j->off, (off_t)j->len) < 0)
			return -errno;
		/* fall through */
	case ASIDE_POPULATE:
		/*
		 * Again on EINTR: taken as a failure, a signal that came in the
		 * call turned a client's touch table off for good (every reset
		 * a record) and a slab's growth in line.
		 */
		return chime_seg_populate_write(j->addr, j->plen);
	case ASIDE_CLOSE:
		(void)close(j->fd);
		return 0;
	case ASIDE_PUNCH:
		return chime_seg_punch(j->fd, j->off, j->len);
	default:
		return -EINVAL;
	}
}

static void aside_free(struct aside *a)
{
	while (a->done) {
		struct aside_node *n = a->done;

		a->done = n->next;
		free(n);
	}
	pthread_cond_destroy(&a->idle);
	pthread_cond_destroy(&a->work);
	pthread_mutex_destroy(&a->lock);
	free(a);
}

/* Run one job taken off the queue, with the lock dropped; then put its result on done. */
static void run_job(struct aside *a, struct aside_node *n)
{
	bool result;

	a->running++;
	a->taken++;
	pthread_mutex_unlock(&a->lock);

	n->job.res = run(&n->job);
	result = n->job.op != ASIDE_CLOSE;

	pthread_mutex_lock(&a->lock);
	if (result) {
		n->next = NULL;
		*a->done_tail = n;
		a->done_tail = &n->next;
		at_store_rel(&a->finished, a->finished + 1);
		if (a->wake_fd >= 0) {
			/* before the job counts as done: aside_drain() returns with the owner rung */
			pthread_mutex_unlock(&a->lock);
			(void)eventfd_write(a->wake_fd, 1);
			pthread_mutex_lock(&a->lock);
		}
	} else {
		free(n);
	}
	a->running--;
	if (!a->head && !a->running)
		pthread_cond_broadcast(&a->idle);
}

static void *aside_main(void *arg)
{
	struct aside *a = arg;

	pthread_mutex_lock(&a->lock);
	for (;;) {
		struct aside_node *n;

		/* Past the first, a thread that finds no work ends: one waits, and it never wakes idle. */
		while (!a->head && !a->stopping && a->threads == 1) {
			a->waiting++;
			pthread_cond_wait(&a->work, &a->lock);
			a->waiting--;
		}
		n = a->head;
		if (!n)
			break;
		a->head = n->next;
		if (!a->head)
			a->tail = &a->head;
		run_job(a, n);
	}
	if (--a->threads == 0) {
		pthread_cond_broadcast(&a->idle);
		if (a->orphan) {
			pthread_mutex_unlock(&a->lock);
			aside_free(a);
			return NULL;
		}
	}
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

/* One more thread, under lock; false if none could be made. */
static bool add_thread(struct aside *a)
{
	sigset_t all, old;
	pthread_attr_t at;
	pthread_t thr;
	int r;

	/* Signals are the control thread's (signalfd): none may land here. */
	sigfillset(&all);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = pthread_create(&thr, &at, aside_main, a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&at);
	if (r)
		return false;
	a->threads++;
	(void)pthread_setname_np(thr, a->name);         /* for ps, top, perf and gdb */
	return true;
}

int aside_start(struct aside **out, const char *name, int wake_fd, unsigned max_threads)
{
	struct aside *a = calloc(1, sizeof(*a));
	bool ok;

	if (!a)
		return -ENOMEM;
	a->wake_fd = wake_fd;
	a->max_threads = max_threads ? max_threads : 1;
	snprintf(a->name, sizeof(a->name), "%s", name);
	a->tail = &a->head;
	a->done_tail = &a->done;
	pthread_mutex_init(&a->lock, NULL);
	pthread_cond_init(&a->work, NULL);
	(void)cond_init_monotonic(&a->idle);       /* aside_stop()'s timed wait */
	pthread_mutex_lock(&a->lock);
	ok = add_thread(a);
	pthread_mutex_unlock(&a->lock);
	if (!ok) {
		aside_free(a);
		return -EAGAIN;
	}
	*out = a;
	return 0;
}

bool aside_post(struct aside *a, const struct aside_job *j)
{
	struct aside_node *n;

	if (!a || !(n = malloc(sizeof(*n))))
		return false;
	n->next = NULL;
	n->job = *j;
	pthread_mutex_lock(&a->lock);
	*a->tail = n;
	a->tail = &n->next;
	pthread_cond_signal(&a->work);
	pthread_mutex_unlock(&a->lock);
	return true;
}

int aside_unstick(struct aside *a)
{
	int r = 0;

	if (!a)
		return 0;
	pthread_mutex_lock(&a->lock);
	if (a->head && !a->waiting && a->taken == a->taken_seen && !a->stopping) {
		if (a->threads >= a->max_threads)
			r = -EBUSY;
		else
			r = add_thread(a) ? 1 : -EAGAIN;
	}
	a->taken_seen = a->taken;
	pthread_mutex_unlock(&a->lock);
	return r;
}

unsigned aside_reap(struct aside *a, struct aside_job *out, unsigned max)
{
	unsigned got = 0;

	/* The owner looks on every pass: one load while nothing has finished. */
	if (!a || at_load_acq(&a->finished) == a->reaped)
		return 0;
	pthread_mutex_lock(&a->lock);
	while (got < max && a->done) {
		struct aside_node *n = a->done;

		a->done = n->next;
		if (!a->done)
			a->done_tail = &a->done;
		out[got++] = n->job;
		free(n);
	}
	pthread_mutex_unlock(&a->lock);
	a->reaped += got;
	return got;
}

void aside_drain(struct aside *a)
{
	if (!a)
		return;
	pthread_mutex_lock(&a->lock);
	while ((a->head && a->threads) || a->running)
		pthread_cond_wait(&a->idle, &a->lock);
	pthread_mutex_unlock(&a->lock);
}

bool aside_stop(struct aside *a, uint64_t wait_ns)
{
	struct timespec until;

	if (!a)
		return true;
	until = deadline_ts_after(wait_ns == UINT64_MAX ? 0 : wait_ns);
	pthread_mutex_lock(&a->lock);
	a->stopping = true;
	pthread_cond_broadcast(&a->work);
	while (a->threads) {
		if (wait_ns == UINT64_MAX)
			pthread_cond_wait(&a->idle, &a->lock);
		else if (pthread_cond_timedwait(&a->idle, &a->lock, &until) == ETIMEDOUT)
			break;
	}
	if (a->threads) {
		a->orphan = true;
		pthread_mutex_unlock(&a->lock);
		return false;
	}
	pthread_mutex_unlock(&a->lock);
	aside_free(a);
	return true;
}
