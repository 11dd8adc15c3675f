/* SPDX-License-Identifier: MIT */
/* discard.c - see discard.h. */
#include "discard.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define DISCARD_MAPS 3u         /* a connection's: rw, ro, touch */

struct discard_job {
	struct discard_job *next;
	uint32_t uid;           /* the user the connection counted against (discard_waiting()) */
	unsigned n;
	struct chime_map maps[DISCARD_MAPS];
};

struct discard {
	pthread_t thr;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct discard_job *head, **tail;   /* under lock */
	bool running;                       /* under lock: a job is being run (counted as waiting) ... */
	uint32_t running_uid;               /* ... for this user */
	bool stop;                          /* under lock: unmap what is left, no punch, and exit */
};

static void job_run(struct discard_job *j, bool punch)
{
	for (unsigned i = 0; i < j->n; i++) {
		if (punch)
			(void)chime_seg_discard(&j->maps[i]);
		chime_seg_unmap(&j->maps[i]);
	}
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

void discard_post(struct discard *d, struct chime_map *maps, unsigned n, uint32_t uid, unsigned max)
{
	struct discard_job *j = d ? malloc(sizeof(*j)) : NULL;

	if (n > DISCARD_MAPS)
		n = DISCARD_MAPS;
	if (j) {
		pthread_mutex_lock(&d->lock);
		if (waiting(d, uid) >= max) {
			free(j);
			j = NULL;
		}
		pthread_mutex_unlock(&d->lock);
	}
	if (!j) {
		for (unsigned i = 0; i < n; i++)
			chime_seg_unmap(&maps[i]);
		return;
	}
	j->next = NULL;
	j->uid = uid;
	j->n = n;
	for (unsigned i = 0; i < n; i++) {
		j->maps[i] = maps[i];
		memset(&maps[i], 0, sizeof(maps[i]));
	}
	pthread_mutex_lock(&d->lock);
	*d->tail = j;
	d->tail = &j->next;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

void discard_stop(struct discard *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
	pthread_join(d->thr, NULL);
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
	free(d);
}
