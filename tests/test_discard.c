/* SPDX-License-Identifier: MIT */
/*
 * test_discard.c - broker/discard.c: a finished connection's segments,
 * handed to a thread at idle priority that punches their pages out.
 *
 * The control thread must never wait for that thread's lock: the thread
 * takes it at idle priority, and busy loops of any user can starve it
 * inside its few instructions under the lock. The test stands in for that
 * moment: linked with --wrap (tests/meson.build), pthread_mutex_trylock()
 * fails on this thread (the control thread's stand-in) while `held` is
 * set, and pthread_mutex_lock() on this thread is counted (it would wait).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "discard.h"
#include "segment.h"

#define SEG_BYTES (256u * 1024u)
#define SEC UINT64_C(1000000000)

int __real_pthread_mutex_trylock(pthread_mutex_t *m);
int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_trylock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);

static pthread_t control;               /* the thread that plays the control thread */
static atomic_bool held;                /* the discard thread "holds" its lock, for `control` */
static atomic_uint control_locks;       /* pthread_mutex_lock() calls on `control`: waits */

int __wrap_pthread_mutex_trylock(pthread_mutex_t *m)
{
	if (pthread_equal(pthread_self(), control) && atomic_load(&held))
		return EBUSY;
	return __real_pthread_mutex_trylock(m);
}

int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
	if (pthread_equal(pthread_self(), control))
		atomic_fetch_add(&control_locks, 1);
	return __real_pthread_mutex_lock(m);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* A connection's one segment, its pages written; `watch`: our own descriptor of the memfd. */
struct seg {
	struct chime_map map;
	int fd, watch;
};

static void seg_make(struct seg *s)
{
	cr_assert_eq(chime_seg_memfd("test-discard", SEG_BYTES, &s->fd, &s->map), 0);
	memset(s->map.base, 0xab, SEG_BYTES);
	s->watch = dup(s->fd);
	cr_assert_geq(s->watch, 0);
}

/* Bytes of the memfd still in memory. */
static uint64_t seg_bytes(const struct seg *s)
{
	struct stat st;

	cr_assert_eq(fstat(s->watch, &st), 0);
	return (uint64_t)st.st_blocks * 512;
}

/* Our descriptors of the memfd, `watch` included: 2 while a job keeps its own. */
static unsigned seg_refs(const struct seg *s)
{
	struct stat want, st;
	struct dirent *e;
	unsigned n = 0;
	DIR *dir;

	cr_assert_eq(fstat(s->watch, &want), 0);
	dir = opendir("/proc/self/fd");
	cr_assert_not_null(dir);
	while ((e = readdir(dir))) {
		int fd = atoi(e->d_name);

		if (e->d_name[0] == '.' || fd == dirfd(dir) || fstat(fd, &st) < 0)
			continue;
		n += st.st_dev == want.st_dev && st.st_ino == want.st_ino;
	}
	closedir(dir);
	return n;
}

/*
 * Until its pages are punched out, or 2 s (the thread runs at idle
 * priority), stepping as the control loop does: a thread that has left
 * is replaced at a step.
 */
static bool seg_punched(struct discard *d, const struct seg *s)
{
	uint64_t end = now_ns() + 2 * SEC;

	while (seg_bytes(s) != 0 && now_ns() < end) {
		(void)discard_step(d, SEC);
		usleep(2000);
	}
	return seg_bytes(s) == 0;
}

static void post(struct discard *d, struct seg *s)
{
	size_t size = SEG_BYTES;

	discard_post(d, &s->map, &s->fd, &size, 1, 1000, 1000, 0);
	cr_assert_null(s->map.base, "the caller forgets its mapping");
	cr_assert_eq(s->fd, -1, "and its descriptor");
}

static void setup(void)
{
	control = pthread_self();
	atomic_store(&held, false);
	atomic_store(&control_locks, 0);
}

TestSuite(discard, .init = setup, .timeout = 30);

Test(discard, a_job_is_punched_and_closed_by_the_thread)
{
	struct discard *d;
	struct seg s;

	cr_assert_eq(discard_start(&d), 0);
	seg_make(&s);
	cr_assert_geq(seg_bytes(&s), SEG_BYTES, "the pages are in memory");
	post(d, &s);
	(void)discard_step(d, SEC);
	cr_assert(seg_punched(d, &s), "%llu bytes left after 2 s", (unsigned long long)seg_bytes(&s));
	close(s.watch);
	discard_stop(d);
}

/*
 * The thread "holds" the lock: a step hands nothing over, returns at once
 * without asking to be called again at once (no spin), and never waits
 * for the lock; the job goes at the first step after it is free.
 */
Test(discard, a_step_never_waits_for_the_threads_lock)
{
	struct discard *d;
	struct seg s;
	uint64_t t0;
	bool again;

	cr_assert_eq(discard_start(&d), 0);
	seg_make(&s);
	post(d, &s);
	atomic_store(&held, true);
	t0 = now_ns();
	again = discard_step(d, SEC);
	cr_assert_lt(now_ns() - t0, SEC / 10, "a step took %llu ms", (unsigned long long)((now_ns() - t0) / 1000000));
	cr_assert_not(again, "a step asks to be called again at once while the lock is held: a spin");
	cr_assert_eq(atomic_load(&control_locks), 0, "the step waited for the lock");
	usleep(100 * 1000);
	cr_assert_geq(seg_bytes(&s), SEG_BYTES, "punched, but never handed over");
	atomic_store(&held, false);
	(void)discard_step(d, SEC);
	cr_assert(seg_punched(d, &s), "not handed over once the lock was free: %llu bytes left",
		  (unsigned long long)seg_bytes(&s));
	cr_assert_eq(atomic_load(&control_locks), 0, "a step waited for the lock");
	close(s.watch);
	discard_stop(d);
}

/*
 * While the lock is held, at most 64 jobs wait for a later step with their
 * descriptors; the oldest past that are closed at once, without the punch
 * (as for a user past its share), so that a held lock cannot pile up the
 * broker's descriptors.
 */
Test(discard, jobs_waiting_on_a_held_lock_are_bounded)
{
	enum { N = 70, KEPT = 64 };
	static struct seg s[N];
	struct discard *d;

	cr_assert_eq(discard_start(&d), 0);
	atomic_store(&held, true);
	for (int i = 0; i < N; i++) {
		seg_make(&s[i]);
		post(d, &s[i]);
		(void)discard_step(d, SEC);
	}
	/* The oldest closed without the punch (only our descriptor left), the rest kept, whole. */
	for (int i = 0; i < N; i++) {
		cr_assert_eq(seg_refs(&s[i]), i < N - KEPT ? 1u : 2u, "job %d: %u descriptors", i, seg_refs(&s[i]));
		cr_assert_geq(seg_bytes(&s[i]), SEG_BYTES, "job %d was punched", i);
	}
	atomic_store(&held, false);
	for (int i = 0; i < N; i++)
		(void)discard_step(d, SEC);
	for (int i = N - KEPT; i < N; i++)
		cr_assert(seg_punched(d, &s[i]), "job %d of those kept was not punched", i);
	for (int i = 0; i < N - KEPT; i++)
		cr_assert_geq(seg_bytes(&s[i]), SEG_BYTES, "job %d, closed at once, was punched later", i);
	cr_assert_eq(atomic_load(&control_locks), 0, "a step waited for the lock");
	for (int i = 0; i < N; i++)
		close(s[i].watch);
	discard_stop(d);
}

/* Is [p, p + len) mapped in this process? (mincore fails with ENOMEM where it is not) */
static bool mapped(void *p, size_t len)
{
	unsigned char v[SEG_BYTES / 4096];

	return mincore(p, len, v) == 0;
}

static int seals_of(const struct seg *s)
{
	return fcntl(s->watch, F_GET_SEALS);
}

/* Post s as a segment its client may still punch (user 1000); our mapping's address, which the caller forgot. */
static void *post_unsealed(struct discard *d, struct seg *s)
{
	size_t size = SEG_BYTES;
	void *base = s->map.base;

	discard_post(d, &s->map, &s->fd, &size, 1, 1000, 1000, 1u);
	cr_assert_null(s->map.base, "the caller forgets its mapping");
	return base;
}

/*
 * A segment its client may still punch holes in (an attach that failed
 * before the client sealed it): our munmap would wait for a punch under
 * way. Sealed against writes first, on the sealer thread; unmapped only
 * after, and counted for its user until then.
 */
Test(discard, an_unsealed_segment_is_sealed_before_it_is_unmapped)
{
	struct discard *d;
	struct seg s;
	uint64_t end;
	void *base;

	cr_assert_eq(discard_start(&d), 0);
	seg_make(&s);
	cr_assert_eq(seals_of(&s) & F_SEAL_FUTURE_WRITE, 0);
	base = post_unsealed(d, &s);
	cr_assert(mapped(base, SEG_BYTES), "unmapped before its seal");
	cr_assert_eq(discard_unsealed(d, 1000), 1u);
	cr_assert_eq(discard_unsealed(d, 1001), 0u, "counted for another user");
	for (end = now_ns() + 2 * SEC; mapped(base, SEG_BYTES) && now_ns() < end;) {
		(void)discard_step(d, SEC);
		cr_assert(!mapped(base, SEG_BYTES) ? (seals_of(&s) & F_SEAL_FUTURE_WRITE) != 0 : true,
			  "unmapped, but not sealed: %#x", seals_of(&s));
		usleep(1000);
	}
	cr_assert_not(mapped(base, SEG_BYTES), "still mapped after 2 s");
	cr_assert_neq(seals_of(&s) & F_SEAL_FUTURE_WRITE, 0, "not sealed: %#x", seals_of(&s));
	cr_assert_eq(discard_unsealed(d, 1000), 0u, "still counted once let go");
	cr_assert_eq(atomic_load(&control_locks), 0, "a step waited for a lock");
	close(s.watch);
	discard_stop(d);
}

/*
 * A client that sealed its memfd for good (F_SEAL_SEAL) without sealing
 * it against writes leaves nobody a way to stop its punches: our mapping
 * stays, counted for its user, and not even a stop unmaps it (the exit
 * does). Its descriptor goes.
 */
Test(discard, a_segment_sealed_for_good_but_writable_stays_mapped_and_counted)
{
	struct discard *d;
	struct seg s;
	void *base;

	cr_assert_eq(discard_start(&d), 0);
	seg_make(&s);
	cr_assert_eq(fcntl(s.watch, F_ADD_SEALS, F_SEAL_SEAL), 0);
	base = post_unsealed(d, &s);
	for (int i = 0; i < 200 && seg_refs(&s) > 1; i++) {
		(void)discard_step(d, SEC);
		usleep(1000);
	}
	cr_assert_eq(seg_refs(&s), 1u, "the job's descriptor was not closed");
	cr_assert(mapped(base, SEG_BYTES), "unmapped, though its client can still punch it");
	cr_assert_eq(discard_unsealed(d, 1000), 1u, "not counted for its user");
	cr_assert_geq(seg_bytes(&s), SEG_BYTES, "punched: the pages are its client's");
	discard_stop(d);
	cr_assert(mapped(base, SEG_BYTES), "unmapped at the stop");
	munmap(base, SEG_BYTES);
	close(s.watch);
}

/* A stop while a segment waits for its seal (the sealer's lock "held" meanwhile): left mapped, its descriptor closed. */
Test(discard, a_stop_leaves_a_segment_waiting_for_its_seal_mapped)
{
	struct discard *d;
	struct seg s;
	void *base;

	cr_assert_eq(discard_start(&d), 0);
	atomic_store(&held, true);
	seg_make(&s);
	base = post_unsealed(d, &s);
	(void)discard_step(d, SEC);
	cr_assert_eq(seals_of(&s) & F_SEAL_FUTURE_WRITE, 0, "sealed though never handed over");
	atomic_store(&held, false);
	discard_stop(d);
	cr_assert(mapped(base, SEG_BYTES), "unmapped unsealed at the stop");
	cr_assert_eq(seg_refs(&s), 1u, "its descriptor was not closed");
	munmap(base, SEG_BYTES);
	close(s.watch);
}
