/* SPDX-License-Identifier: MIT */
/* discard.c - see discard.h. */
#include "discard.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "clock.h"

#define DISCARD_SEGS 3u         /* a connection's: rw, ro, touch */

struct discard_job {
	struct discard_job *next;
	uint32_t uid;           /* the user the connection counted against (discard_waiting()) */
	unsigned max;           /* that user's jobs that may wait for the thread */
	unsigned n;
	struct chime_map maps[DISCARD_SEGS];    /* ours, unmapped by discard_step() before the thread sees it */
	int fds[DISCARD_SEGS];
	size_t sizes[DISCARD_SEGS];
};

struct discard {
	pthread_t thr;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct discard_job *head, **tail;   /* under lock */
	bool running;                       /* under lock: a job is being run (counted as waiting) ... */
	uint32_t running_uid;               /* ... for this user */
	bool stop;                          /* under lock: close what is left, no punch, and exit */
	struct discard_job *pend, **pend_tail;  /* the caller's thread only: still mapped (discard_step()) */
};

static void fds_close(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/*
 * Descriptors only, no mapping of ours: nothing here takes the broker's
 * mmap_lock, which this thread, at idle priority, would hold while
 * starved of CPU (see discard.h).
 */
static void job_run(struct discard_job *j, bool punch)
{
	for (unsigned i = 0; i < j->n && punch; i++)
		(void)chime_seg_discard(j->fds[i], j->sizes[i]);
	fds_close(j->fds, j->n);
	free(j);
}

static void *discard_main(void *arg)
{
	struct discard *d = arg;
	struct sched_param idle = { .sched_priority = 0 };

	/* Memory comes back a little later under load; nothing waits for it. */
	(void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
	pthread_mutex_lock(&d->lock);
	for (;;) {
		struct discard_job *j = d->head;

		if (!j) {
			if (d->stop)
				break;
			pthread_cond_wait(&d->cond, &d->lock);
			continue;
		}
		d->head = j->next;
		if (!d->head)
			d->tail = &d->head;
		d->running = true;
		d->running_uid = j->uid;
		{
			bool punch = !d->stop;

			pthread_mutex_unlock(&d->lock);
			job_run(j, punch);
			pthread_mutex_lock(&d->lock);
		}
		d->running = false;
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

int discard_start(struct discard **out)
{
	struct discard *d = calloc(1, sizeof(*d));
	int r;

	if (!d)
		return -ENOMEM;
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	d->tail = &d->head;
	d->pend_tail = &d->pend;
	r = pthread_create(&d->thr, NULL, discard_main, d);
	if (r) {
		pthread_cond_destroy(&d->cond);
		pthread_mutex_destroy(&d->lock);
		free(d);
		return -r;
	}
	pthread_setname_np(d->thr, "chimed-discard");
	*out = d;
	return 0;
}

/* Jobs of user uid waiting, the one being run included (under lock). */
static unsigned waiting(const struct discard *d, uint32_t uid)
{
	unsigned n = d->running && d->running_uid == uid;

	for (const struct discard_job *j = d->head; j; j = j->next)
		n += j->uid == uid;
	return n;
}

void discard_post(struct discard *d, struct chime_map *maps, int *fds, const size_t *sizes, unsigned n,
		  uint32_t uid, unsigned max)
{
	struct discard_job *j = d ? calloc(1, sizeof(*j)) : NULL;

	if (n > DISCARD_SEGS)
		n = DISCARD_SEGS;
	if (!j) {
		for (unsigned i = 0; i < n; i++)
			chime_seg_unmap(&maps[i]);
		fds_close(fds, n);
	}
	for (unsigned i = 0; j && i < n; i++) {
		j->maps[i] = maps[i];
		j->fds[i] = fds[i];
		j->sizes[i] = sizes[i];
	}
	for (unsigned i = 0; i < n; i++) {
		memset(&maps[i], 0, sizeof(maps[i]));
		fds[i] = -1;
	}
	if (!j)
		return;
	j->uid = uid;
	j->max = max;
	j->n = n;
	*d->pend_tail = j;
	d->pend_tail = &j->next;
}

/* Our mappings of it go, then its descriptors to the thread (or closed: the user's share waits already). */
static void job_hand_over(struct discard *d, struct discard_job *j)
{
	for (unsigned i = 0; i < j->n; i++)
		chime_seg_unmap(&j->maps[i]);
	j->next = NULL;
	pthread_mutex_lock(&d->lock);
	if (waiting(d, j->uid) >= j->max) {
		pthread_mutex_unlock(&d->lock);
		job_run(j, false);
		return;
	}
	*d->tail = j;
	d->tail = &j->next;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

bool discard_step(struct discard *d, uint64_t budget_ns)
{
	uint64_t t0 = now_ns();

	while (d && d->pend) {
		struct discard_job *j = d->pend;

		d->pend = j->next;
		if (!d->pend)
			d->pend_tail = &d->pend;
		job_hand_over(d, j);
		if (now_ns() - t0 >= budget_ns)
			break;
	}
	return d && d->pend;
}

void discard_stop(struct discard *d)
{
	if (!d)
		return;
	while (d->pend) {
		struct discard_job *j = d->pend;

		d->pend = j->next;
		for (unsigned i = 0; i < j->n; i++)
			chime_seg_unmap(&j->maps[i]);
		job_run(j, false);
	}
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
	pthread_join(d->thr, NULL);
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
	free(d);
}
