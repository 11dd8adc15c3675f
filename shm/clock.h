/* SPDX-License-Identifier: MIT */
/*
 * clock.h - chime's one clock and one PRNG, for the broker, libchime, the
 * tools and the tests alike.
 *
 * Time is uint64_t nanoseconds of CLOCK_MONOTONIC (../shared/STYLE.md):
 * every deadline a client arms, every timestamp in shared memory. Never
 * wall-clock time.
 */
#ifndef CHIME_CLOCK_H
#define CHIME_CLOCK_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/timerfd.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns (vDSO: ~20 ns; time batches, not single operations). */
static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/*
 * Arm fd, a CLOCK_REALTIME timerfd, to watch for sets of the wall clock
 * (by anyone: an NTP step, date(1), a test): at 2100-01-01 with
 * TFD_TIMER_CANCEL_ON_SET, its read fails with ECANCELED once the clock is
 * set, and it must be armed again after. 0, or -errno.
 */
static inline int clock_set_watch_arm(int fd)
{
	const struct itimerspec far = { .it_value = { .tv_sec = (time_t)4102444800 } };

	return timerfd_settime(fd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &far, NULL) < 0 ? -errno : 0;
}

/* now_ns() + ns as a timespec: a deadline for pthread_cond_timedwait() on a CLOCK_MONOTONIC condition. */
static inline struct timespec deadline_ts_after(uint64_t ns)
{
	uint64_t t = now_ns() + ns;

	return (struct timespec){ .tv_sec = (time_t)(t / 1000000000u), .tv_nsec = (long)(t % 1000000000u) };
}

/* A condition whose timed waits take deadline_ts_after()'s deadlines: 0, or an errno. */
static inline int cond_init_monotonic(pthread_cond_t *cond)
{
	pthread_condattr_t ca;
	int r = pthread_condattr_init(&ca);

	if (r)
		return r;
	r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(cond, &ca);
	pthread_condattr_destroy(&ca);
	return r;
}

/*
 * CLOCK_MONOTONIC_COARSE in ns: the same clock as now_ns() at the last
 * tick, so up to a tick (1-10 ms) behind it, for a third of its cost (no
 * TSC read: 11 against 33 ns here). Only for a decision that an error of
 * a tick, always early, cannot change.
 */
static inline uint64_t now_coarse_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/*
 * The calling thread's CPU time in ns, spinning included: what busy% shows
 * (it matches top and /proc). A system call, not the vDSO: not per event.
 */
static inline uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/*
 * splitmix64: fast, deterministic from its seed (a failing test's seed
 * replays it), good enough for deadlines, indices and spreading keys.
 * Not for anything secret.
 */
static inline uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

#endif /* CHIME_CLOCK_H */
