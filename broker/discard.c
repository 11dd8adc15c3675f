/* SPDX-License-Identifier: MIT */
/* discard.c - see discard.h. */
#include "discard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <unistd.h>

#include "clock.h"

#define DISCARD_SEGS 3u         /* a connection's: rw, ro, touch */
/* Jobs that wait for a step while the thread holds the lock; past these, closed without the punch. */
#define DISCARD_PEND_HELD 64u
/* The thread's stack, ours (discard_start()); reserved, not committed: TSan wants ~0.9 MiB of one. */
#define DISCARD_STACK (UINT64_C(2) * 1024 * 1024)
/* A seal under way this long is held up by its client (see sealer_step()): another sealer takes the rest. */
#define SEAL_STUCK_NS (UINT64_C(1000) * 1000000u)
/* Sealers at most, held up or not: past them the jobs wait for one to be let go. */
#define SEALERS_MAX 16u
/* How long a stop waits for the sealers under way (discard_stop()). */
#define SEAL_STOP_WAIT_NS (UINT64_C(1000) * 1000000u)

struct discard_job {
	struct discard_job *next;
	uint32_t uid;           /* the user the connection counted against (waiting()) */
	unsigned max;           /* that user's jobs that may wait for the thread */
	unsigned n;
	struct chime_map maps[DISCARD_SEGS];    /* ours, unmapped by discard_step() before the thread sees it */
	int fds[DISCARD_SEGS];
	size_t sizes[DISCARD_SEGS];
	unsigned unsealed;                      /* segments to seal before the unmap (discard_post()) */
	int seal_err[DISCARD_SEGS];             /* the sealer's: 0, or why segment i could not be sealed */
	uint64_t seal_t0;                       /* under slock: when a sealer began it; 0 while none has */
	struct discard_job *snext;              /* the caller's thread only: on d->sealing until sealed */
};

/* A segment its client sealed for good, unsealed against writes: ours stays mapped (discard_post()). */
struct discard_kept {
	struct discard_kept *next;
	uint32_t uid;
	struct chime_map map;
};

struct discard {
	pthread_t thr;
	bool thr_joinable;                  /* the caller's thread only: thr started and not joined */
	pthread_attr_t attr;                /* every thread's: our stack below */
	void *stack;                        /* mapped with a guard page below it */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct discard_job *head, **tail;   /* under lock */
	struct discard_job *done;           /* under lock: run, for the caller's thread to free */
	bool leaving;                       /* under lock: thr has run jobs at idle priority and exits */
	bool running;                       /* under lock: a job is being run (counted as waiting) ... */
	uint32_t running_uid;               /* ... for this user */
	bool stop;                          /* under lock: close what is left, no punch, and exit */
	struct discard_job *pend, **pend_tail;  /* the caller's thread only: not handed over yet (discard_step()) */
	unsigned npend;                         /* the caller's thread only: how many */

	/*
	 * Sealers: threads at normal priority, started while jobs wait for
	 * one, each gone once none waits. A seal costs no CPU, but waits for
	 * the memfd's inode lock, which its client can hold for as long as it
	 * likes (a write() from a buffer whose page fault it serves: FUSE,
	 * userfaultfd): never on the caller's thread, not on the one above
	 * (joined at a stop), and one held up holds up nobody else's
	 * (sealer_step()).
	 */
	pthread_mutex_t slock;
	pthread_cond_t scond;               /* a sealer left: discard_stop() waits for the last */
	struct discard_job *shead, **stail; /* under slock: to seal */
	struct discard_job *sdone;          /* under slock: sealed (or not), for the caller's thread */
	unsigned sealers;                   /* under slock: sealers running */
	uint32_t sealing_uid[SEALERS_MAX];  /* under slock: the users whose seal is under way ... */
	unsigned nsealing;                  /* ... one per sealer at most (sjob_take()) */
	bool sstop;                         /* under slock: take no more jobs */
	struct discard_job *spend;          /* the caller's thread only: not handed to the sealer yet */
	struct discard_job *sealing;        /* the caller's thread only: every job not back from it (snext) */
	struct discard_kept *kept;          /* the caller's thread only */
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
 * starved of CPU (see discard.h). Nor malloc() or free(): the caller's
 * thread frees the job (d->done), since a thread's first free() can map
 * an arena and its exit hands its cache back.
 */
static void job_run(struct discard_job *j, bool punch)
{
	for (unsigned i = 0; i < j->n && punch; i++)
		if (j->fds[i] >= 0 && j->sizes[i])
			(void)chime_seg_discard(j->fds[i], j->sizes[i]);
	fds_close(j->fds, j->n);
}

/*
 * A thread waits for work at the priority it was created with, and only
 * the one that takes a job goes to idle priority ("Memory comes back a
 * little later under load; nothing waits for it"), for good: an
 * unprivileged process cannot come back from SCHED_IDLE. Once it has no
 * job left it exits, and discard_step() starts the next one. A thread at
 * idle priority is the last of the broker to get a CPU when it is
 * killed, and the broker is reaped only once all of its threads are
 * gone: one always there held every exit for as long as any busy loop
 * starved it (discard.h).
 */
static void *discard_main(void *arg)
{
	struct discard *d = arg;
	struct sched_param idle = { .sched_priority = 0 };
	bool at_idle = false;

	pthread_mutex_lock(&d->lock);
	for (;;) {
		struct discard_job *j = d->head;

		if (!j) {
			if (d->stop || at_idle)
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
			if (!at_idle)
				(void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
			at_idle = true;
			job_run(j, punch);
			pthread_mutex_lock(&d->lock);
		}
		j->next = d->done;
		d->done = j;
		d->running = false;
	}
	d->leaving = at_idle;
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/*
 * Seal each unsealed segment against writes through our descriptor. Once
 * that returns no punch is under way (a seal is added under the inode
 * lock, which a punch holds from its start to its end) and none can
 * start: the caller's munmap, which takes the lock a punch holds while it
 * tears the pages out of every mapping, no longer waits for the client.
 * A memfd its client sealed for good (F_SEAL_SEAL) refuses the seal: kept
 * mapped, unless the client sealed it against writes itself.
 */
static void job_seal(struct discard_job *j)
{
	for (unsigned i = 0; i < j->n; i++) {
		int seals;

		if (!(j->unsealed & (1u << i)))
			continue;
		if (fcntl(j->fds[i], F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0) {
			j->seal_err[i] = 0;
			continue;
		}
		j->seal_err[i] = -errno;
		seals = fcntl(j->fds[i], F_GET_SEALS);
		if (seals >= 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
			j->seal_err[i] = 0;
	}
}

/* Under slock: is a seal of user uid's under way? */
static bool sealing_for(const struct discard *d, uint32_t uid)
{
	for (unsigned i = 0; i < d->nsealing; i++)
		if (d->sealing_uid[i] == uid)
			return true;
	return false;
}

/* Under slock: the oldest job to seal whose user has no seal under way, or NULL. */
static struct discard_job **sjob_next(struct discard *d)
{
	for (struct discard_job **pp = &d->shead; *pp; pp = &(*pp)->next)
		if (!sealing_for(d, (*pp)->uid))
			return pp;
	return NULL;
}

/*
 * Under slock: that job, off the list, its user's seal under way. One at a
 * time per user: a client holding its memfd's inode lock holds up one
 * sealer, and its own user's later jobs behind it, never another user's
 * (processes of one user can ptrace one another: no boundary to keep
 * between them). With any number of seals held up, SEALERS_MAX users'
 * clients are needed to hold up everyone's.
 */
static struct discard_job *sjob_take(struct discard *d, struct discard_job **pp)
{
	struct discard_job *j = *pp;

	*pp = j->next;
	if (!*pp)
		d->stail = pp;
	d->sealing_uid[d->nsealing++] = j->uid;
	return j;
}

/* Under slock: user uid's seal is over. */
static void sjob_done(struct discard *d, uint32_t uid)
{
	for (unsigned i = 0; i < d->nsealing; i++)
		if (d->sealing_uid[i] == uid) {
			d->sealing_uid[i] = d->sealing_uid[--d->nsealing];
			return;
		}
}

/* Detached: one held up by its client may never end, and nothing joins it. */
static void *sealer_main(void *arg)
{
	struct discard *d = arg;
	struct discard_job **pp, *j;

	pthread_mutex_lock(&d->slock);
	while (!d->sstop && (pp = sjob_next(d))) {
		j = sjob_take(d, pp);
		j->seal_t0 = now_ns();
		pthread_mutex_unlock(&d->slock);
		job_seal(j);
		pthread_mutex_lock(&d->slock);
		sjob_done(d, j->uid);
		j->seal_t0 = 0;
		j->next = d->sdone;
		d->sdone = j;
	}
	d->sealers--;
	pthread_cond_signal(&d->scond);
	pthread_mutex_unlock(&d->slock);
	return NULL;
}

/* A thread to wait for jobs, on our stack (the last one joined): 0, or -errno. */
static int thread_start(struct discard *d)
{
	int r = pthread_create(&d->thr, &d->attr, discard_main, d);

	if (r)
		return -r;
	d->thr_joinable = true;
	pthread_setname_np(d->thr, "chimed-discard");
	return 0;
}

/*
 * Free the jobs run, and once the thread at idle priority has exited,
 * start the next one at ours. One still exiting (starved) is joined at a
 * later step: its jobs wait meanwhile, as for a thread that is starved.
 * Never waits for the lock: the thread may hold it, starved.
 */
static void thread_renew(struct discard *d)
{
	struct discard_job *done;
	bool leaving;

	if (pthread_mutex_trylock(&d->lock) != 0)
		return;
	done = d->done;
	d->done = NULL;
	leaving = d->leaving;
	pthread_mutex_unlock(&d->lock);
	while (done) {
		struct discard_job *j = done;

		done = j->next;
		free(j);
	}
	if (d->thr_joinable && leaving && pthread_tryjoin_np(d->thr, NULL) == 0) {
		d->thr_joinable = false;
		d->leaving = false;     /* no thread: nobody else writes it */
	}
	if (!d->thr_joinable)
		(void)thread_start(d);  /* else at a later step */
}

int discard_start(struct discard **out)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct discard *d = calloc(1, sizeof(*d));
	char *m;
	int r;

	if (!d)
		return -ENOMEM;
	/*
	 * Our own stack, so that glibc does not madvise() it away as the
	 * thread exits (its own stacks' unused part): that takes the
	 * mmap_lock, at idle priority. One thread at a time uses it.
	 */
	m = mmap(NULL, DISCARD_STACK + page, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
	if (m == MAP_FAILED) {
		free(d);
		return -errno;
	}
	(void)mprotect(m, page, PROT_NONE);     /* the guard */
	d->stack = m;
	pthread_attr_init(&d->attr);
	pthread_attr_setstack(&d->attr, m + page, DISCARD_STACK);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	pthread_mutex_init(&d->slock, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);        /* discard_stop()'s timed wait */
		pthread_cond_init(&d->scond, &ca);
		pthread_condattr_destroy(&ca);
	}
	d->tail = &d->head;
	d->stail = &d->shead;
	d->pend_tail = &d->pend;
	r = thread_start(d);
	if (r < 0) {
		pthread_cond_destroy(&d->scond);
		pthread_mutex_destroy(&d->slock);
		pthread_cond_destroy(&d->cond);
		pthread_mutex_destroy(&d->lock);
		pthread_attr_destroy(&d->attr);
		munmap(m, DISCARD_STACK + page);
		free(d);
		return r;
	}
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
		  uint32_t uid, unsigned max, unsigned unsealed)
{
	struct discard_job *j = d ? calloc(1, sizeof(*j)) : NULL;

	if (n > DISCARD_SEGS)
		n = DISCARD_SEGS;
	unsealed &= (1u << n) - 1;
	if (!j) {
		/* An unsealed one stays mapped, uncounted: its munmap could wait for the client. */
		for (unsigned i = 0; i < n; i++)
			if (!(unsealed & (1u << i)))
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
	j->unsealed = unsealed;
	for (unsigned i = 0; i < n; i++)
		j->seal_err[i] = -EAGAIN;       /* until the sealer says otherwise */
	if (unsealed) {
		j->next = d->spend;
		d->spend = j;
		j->snext = d->sealing;
		d->sealing = j;
		return;
	}
	*d->pend_tail = j;
	d->pend_tail = &j->next;
	d->npend++;
}

unsigned discard_unsealed(const struct discard *d, uint32_t uid)
{
	unsigned n = 0;

	if (!d)
		return 0;
	for (const struct discard_job *j = d->sealing; j; j = j->snext)
		if (j->uid == uid)
			n += (unsigned)__builtin_popcount(j->unsealed);
	for (const struct discard_kept *k = d->kept; k; k = k->next)
		n += k->uid == uid;
	return n;
}

/*
 * Back from the sealer (or never sealed: the broker stops): what was
 * sealed is unmapped and punched as any segment, what was not stays
 * mapped, kept, and its descriptor goes (the mapping holds the memfd).
 */
static void job_sealed(struct discard *d, struct discard_job *j)
{
	struct discard_job **pp = &d->sealing;

	while (*pp != j)
		pp = &(*pp)->snext;
	*pp = j->snext;
	for (unsigned i = 0; i < j->n; i++) {
		struct discard_kept *k;

		if (!(j->unsealed & (1u << i)) || !j->seal_err[i])
			continue;
		k = calloc(1, sizeof(*k));
		if (k) {        /* else left mapped, uncounted */
			k->uid = j->uid;
			k->map = j->maps[i];
			k->next = d->kept;
			d->kept = k;
		}
		memset(&j->maps[i], 0, sizeof(j->maps[i]));
		close(j->fds[i]);
		j->fds[i] = -1;
	}
	j->unsealed = 0;
	j->next = NULL;
	*d->pend_tail = j;
	d->pend_tail = &j->next;
	d->npend++;
}

/* Under slock: is every sealer running held up in one seal (SEAL_STUCK_NS)? */
static bool sealers_held_up(const struct discard *d, uint64_t now)
{
	unsigned held = 0;

	for (const struct discard_job *j = d->sealing; j; j = j->snext)
		held += j->seal_t0 && now - j->seal_t0 >= SEAL_STUCK_NS;
	return held >= d->sealers;
}

/* Under slock: one more sealer, detached; if none can be had, at a later step. */
static void sealer_start(struct discard *d)
{
	pthread_attr_t attr;
	pthread_t thr;

	if (pthread_attr_init(&attr) != 0)
		return;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&thr, &attr, sealer_main, d) == 0) {
		pthread_setname_np(thr, "chimed-seal");
		d->sealers++;
	}
	pthread_attr_destroy(&attr);
}

/*
 * Jobs to the sealers, and those they are done with back, never waiting
 * for their lock (they hold it for a few instructions at a time, but may
 * be preempted there): at a later step if one holds it. A sealer is
 * started while a job waits that one could take (sjob_next(): a user
 * with no seal under way) and none runs, or every one running has been
 * held up by its client for SEAL_STUCK_NS (its job stays with it, its
 * segments mapped and counted for their user: discard_unsealed()), up to
 * SEALERS_MAX: one client holding its inode lock held up every other
 * user's refused segments, mapped and counted for them until it let go.
 */
static void sealer_step(struct discard *d)
{
	struct discard_job *done;

	if (!d->sealing || pthread_mutex_trylock(&d->slock) != 0)
		return;
	while (d->spend) {
		struct discard_job *j = d->spend;

		d->spend = j->next;
		j->next = NULL;
		*d->stail = j;
		d->stail = &j->next;
	}
	/* a job none running may take (another user's): no sealer started for nothing */
	if (sjob_next(d) && (d->sealers == 0 || (d->sealers < SEALERS_MAX && sealers_held_up(d, now_ns()))))
		sealer_start(d);
	done = d->sdone;
	d->sdone = NULL;
	pthread_mutex_unlock(&d->slock);
	while (done) {
		struct discard_job *j = done;

		done = j->next;
		job_sealed(d, j);
	}
}

/* The oldest job not handed over yet, off the list. */
static struct discard_job *pend_pop(struct discard *d)
{
	struct discard_job *j = d->pend;

	d->pend = j->next;
	if (!d->pend)
		d->pend_tail = &d->pend;
	d->npend--;
	return j;
}

/*
 * Our mappings of the oldest pending job go, then its descriptors to the
 * thread (or closed: the user's share waits already). False if the
 * thread holds the lock: the job stays first. Never waits for the lock:
 * the thread takes it at idle priority, and busy loops of any user can
 * starve it inside its few instructions under the lock for seconds,
 * which every handshake and heartbeat would wait out behind it.
 */
static bool job_hand_over(struct discard *d)
{
	struct discard_job *j = d->pend;

	for (unsigned i = 0; i < j->n; i++)
		chime_seg_unmap(&j->maps[i]);
	if (pthread_mutex_trylock(&d->lock) != 0)
		return false;
	(void)pend_pop(d);
	j->next = NULL;
	if (waiting(d, j->uid) >= j->max) {
		pthread_mutex_unlock(&d->lock);
		job_run(j, false);
		free(j);
		return true;
	}
	*d->tail = j;
	d->tail = &j->next;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
	return true;
}

bool discard_step(struct discard *d, uint64_t budget_ns)
{
	uint64_t t0 = now_ns();
	bool held = false;

	if (!d)
		return false;
	sealer_step(d);
	while (d->pend) {
		if (!job_hand_over(d)) {
			held = true;
			break;
		}
		if (now_ns() - t0 >= budget_ns)
			break;
	}
	/*
	 * The thread holds the lock: the rest wait for a later step (the next
	 * loop iteration, a heartbeat at most), not a spin of this one; but no
	 * more than DISCARD_PEND_HELD of them, each keeping its descriptors:
	 * past that, the oldest are closed here without the punch.
	 */
	while (held && d->npend > DISCARD_PEND_HELD) {
		struct discard_job *j = pend_pop(d);

		for (unsigned i = 0; i < j->n; i++)
			chime_seg_unmap(&j->maps[i]);
		job_run(j, false);
		free(j);
	}
	thread_renew(d);        /* the thread may have left as these came */
	return d->pend && !held;
}

void discard_stop(struct discard *d)
{
	struct discard_job *queued;
	unsigned sealers_left;
	size_t page;

	if (!d)
		return;
	/*
	 * The sealers end the seals they are in, for SEAL_STOP_WAIT_NS at
	 * most: one its client holds up may never end, and the sessions file
	 * and the lock file wait for this. Those left keep their jobs (their
	 * segments stay mapped, for the exit) and this struct, lock and all.
	 */
	pthread_mutex_lock(&d->slock);
	d->sstop = true;
	for (struct timespec until = deadline_ts_after(SEAL_STOP_WAIT_NS); d->sealers;)
		if (pthread_cond_timedwait(&d->scond, &d->slock, &until) == ETIMEDOUT)
			break;
	sealers_left = d->sealers;
	while (d->spend || d->shead || d->sdone) {
		struct discard_job **from = d->spend ? &d->spend : d->shead ? &d->shead : &d->sdone;
		struct discard_job *j = *from;

		*from = j->next;
		job_sealed(d, j);
	}
	pthread_mutex_unlock(&d->slock);
	while (d->kept) {
		struct discard_kept *k = d->kept;

		d->kept = k->next;
		free(k);
	}
	while (d->pend) {
		struct discard_job *j = pend_pop(d);

		for (unsigned i = 0; i < j->n; i++)
			chime_seg_unmap(&j->maps[i]);
		job_run(j, false);
		free(j);
	}
	/* What waits is closed here: the thread, at idle priority, ends the job it runs, if any. */
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	queued = d->head;
	d->head = NULL;
	d->tail = &d->head;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
	while (queued) {
		struct discard_job *j = queued;

		queued = j->next;
		job_run(j, false);
		free(j);
	}
	if (d->thr_joinable)
		pthread_join(d->thr, NULL);
	while (d->done) {
		struct discard_job *j = d->done;

		d->done = j->next;
		free(j);
	}
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
	pthread_attr_destroy(&d->attr);
	page = (size_t)sysconf(_SC_PAGESIZE);
	munmap(d->stack, DISCARD_STACK + page);
	if (sealers_left)
		return;         /* theirs until the exit */
	pthread_cond_destroy(&d->scond);
	pthread_mutex_destroy(&d->slock);
	free(d);
}
