/* SPDX-License-Identifier: MIT */
/*
 * spin.h - when spinning for work stops paying: the one rule for the
 * shards' idle spin (broker/shard.c) and chime_wait()'s (libclient/poll.c).
 *
 * Both spin a few microseconds and then sched_yield() until their budget is
 * spent, so that a thread of ours on the same core (a client, a shard) runs
 * meanwhile and hands the core back soon. A yield that returns only after
 * YIELD_CONTENDED_NS gave the core to something that ran that long without
 * yielding or sleeping: a busy host, where a thread that stays runnable
 * waits out another task's whole time slice each time it yields, with its
 * work (a timer due, an event in) undone meanwhile, where a thread that
 * sleeps is woken into the core at once (docs/BENCHMARKS.md, "Lateness on
 * a busy host").
 *
 * So such a yield turns spinning off for SPIN_OFF_MIN_NS, and one again
 * within one more such period after it ends for twice as long as the last
 * (up to SPIN_OFF_MAX_NS): a host kept busy stops the spinning within a few
 * periods, where one long slice of a client of ours (a flood of arms) costs
 * a few milliseconds of sleeping with doorbells. The owner keeps one struct
 * spin_watch and touches it from one thread at a time.
 */
#ifndef CHIME_SPIN_H
#define CHIME_SPIN_H

#include <stdbool.h>
#include <stdint.h>

#define YIELD_CONTENDED_NS (1000u * 1000u)
#define SPIN_OFF_MIN_NS    (UINT64_C(2) * 1000 * 1000)
#define SPIN_OFF_MAX_NS    (UINT64_C(100) * 1000 * 1000)

struct spin_watch {
	uint64_t off_until;     /* no spinning before this (CLOCK_MONOTONIC ns) */
	uint64_t off_ns;        /* how long the last contended yield turned it off; 0: none yet */
};

/* May the owner spin (and yield) at now? */
static inline bool spin_allowed(const struct spin_watch *w, uint64_t now)
{
	return now >= w->off_until;
}

/* A sched_yield() took yield_ns, ending at now. */
static inline void spin_yielded(struct spin_watch *w, uint64_t yield_ns, uint64_t now)
{
	bool again;

	if (yield_ns < YIELD_CONTENDED_NS)
		return;
	again = w->off_ns && (now < w->off_until || now - w->off_until <= w->off_ns);
	w->off_ns = !again ? SPIN_OFF_MIN_NS : w->off_ns * 2 < SPIN_OFF_MAX_NS ? w->off_ns * 2 : SPIN_OFF_MAX_NS;
	w->off_until = now + w->off_ns;
}

#endif /* CHIME_SPIN_H */
