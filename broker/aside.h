/* SPDX-License-Identifier: MIT */
/*
 * aside.h - blocking calls run on a thread of the caller's own, one after
 * the other, while the caller goes on.
 *
 * A shard grows its slab (fallocate, then MADV_POPULATE_WRITE: 3-4 ms a
 * chunk here), punches its free top back out, and maps its clients'
 * touch-table pages, and the control
 * thread closes descriptors whose last close can run a client's work (a
 * doorbell's epoll watches: 600 ms for 1.9 million), without waiting for
 * them. They were io_uring requests punted to the kernel's workers
 * (IOSQE_ASYNC), and io-wq keeps the last worker of every task that used
 * it for good, waking it every 5 s to look for work: with two shards,
 * 0.6 wake-ups a second at rest, the broker's only ones beyond its
 * heartbeat (chime-bench rest). An aside thread waits on a condition
 * variable with no timeout: an idle one never runs.
 *
 * One set per owner: a client that makes its closes slow holds up a
 * thread of the control thread's set, never a shard's growth. A shard's has one
 * thread, whose jobs run in posting order. The control thread's closes
 * may wait as long as a client likes (a TCP socket it sent, set to
 * linger), so its set grows: aside_unstick(), at each heartbeat, adds a
 * thread while jobs wait and none was taken since the last beat, up to a
 * bound; past the first, a thread that finds nothing to do ends.
 */
#ifndef CHIME_ASIDE_H
#define CHIME_ASIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct aside;

enum aside_op {
	ASIDE_RESERVE = 1,      /* fallocate(fd, 0, off, len), then populate (addr, plen) */
	ASIDE_POPULATE = 2,     /* madvise(addr, plen, MADV_POPULATE_WRITE) */
	ASIDE_CLOSE = 3,        /* close(fd); no result comes back */
	ASIDE_PUNCH = 4         /* a hole punched in fd at [off, off + len) (chime_seg_punch()) */
};

struct aside_job {
	uint32_t op;            /* enum aside_op */
	int fd;
	uint64_t off, len;
	void *addr;
	size_t plen;
	uint64_t ud;            /* the owner's, returned with the result */
	int res;                /* out: 0, or the first failing call's -errno */
};

/*
 * Start the first thread, named `name` (15 characters at most), with every
 * signal blocked; up to max_threads in all (aside_unstick(); 1: results in
 * posting order). After each job with a result, 1 is added to wake_fd (an
 * eventfd; -1: none) so that a sleeping owner wakes and reaps it. Returns
 * 0, or -errno (-EAGAIN: no thread; the owner then makes its calls itself).
 */
int aside_start(struct aside **out, const char *name, int wake_fd, unsigned max_threads);

/* Queue a job; false if it could not be (a is NULL, or no memory): the caller makes the call itself. */
bool aside_post(struct aside *a, const struct aside_job *j);

/*
 * Called by the owner now and then (each heartbeat): if jobs wait, no
 * thread waits for work and none took a job since the last call, one more
 * thread starts, up to max_threads. Returns 1 if one did, 0 if none was
 * needed (or a is NULL), -EBUSY if jobs wait behind max_threads held-up
 * threads, -EAGAIN if a thread could not be made.
 */
int aside_unstick(struct aside *a);

/* Up to max finished jobs with results, in the order they finished; 0 at once if there are none. */
unsigned aside_reap(struct aside *a, struct aside_job *out, unsigned max);

/* Wait until every job posted so far has run (its result then waits for aside_reap()). */
void aside_drain(struct aside *a);

/*
 * Have the threads run what is queued and end, waiting up to wait_ns for
 * them (UINT64_MAX: for good): then everything is freed, unreaped results
 * included, and true is returned. Past wait_ns (a close a client holds
 * up: a TCP socket it sent, lingering), false: the last thread to end
 * frees it all, or the process's exit ends them. NULL: true.
 */
bool aside_stop(struct aside *a, uint64_t wait_ns);

#endif
