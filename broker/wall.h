/* SPDX-License-Identifier: MIT */
/*
 * wall.h - the broker's one source of wall-clock time, and the offset
 * (CLOCK_REALTIME - CLOCK_MONOTONIC) its shards' wall-clock timers follow
 * (ARCHITECTURE.md, "Wall-clock timers").
 *
 * The control thread measures and publishes the offset; shards read the
 * published one and measure it themselves when a timer would fire early.
 */
#ifndef CHIMED_WALL_H
#define CHIMED_WALL_H

#include <stdbool.h>
#include <stdint.h>

/*
 * A change of the offset the shards follow: any step of the wall clock,
 * and a slew that moved it more than this since they last followed. Ahead
 * (the wall clock runs fast: wall-clock timers come due late), 1 ms, ten
 * ticks at the default resolution, which ntpd's fastest slew (500 ppm)
 * crosses every two seconds. Behind (it runs slow: they come due early,
 * and wait at firing for the wall clock, chan.c wall_early()), 50 us: what
 * a timer may wait so; a slew of 5 ppm crosses it every 10 s.
 */
#define WALL_FOLLOW_NS      1000000
#define WALL_FOLLOW_BACK_NS 50000
/*
 * wall_offset_now()'s clock reads 20 us apart or more: the thread was
 * preempted between them, read again (three times at most). So two
 * offsets read differ by up to this with no set in between.
 */
#define WALL_PAIR_NS 20000

/* CLOCK_REALTIME in ns, plus the test hook's shift (wall_hook_read()). Any thread. */
uint64_t wall_now_ns(void);

/*
 * wall_now_ns() - CLOCK_MONOTONIC now: the monotonic clock read on each
 * side of the wall clock, again if a preemption came between them. Any thread.
 */
int64_t wall_offset_now(void);

/* The offset the shards follow (relaxed: a seldom-changing word). */
int64_t wall_published(void);

/* Control thread: make off the offset the shards follow. */
void wall_publish(int64_t off);

/*
 * The test hook: re-read the shift from the file $CHIMED_WALL_SHIFT_FILE
 * names (signed ns, text) if the variable is set and the file is a
 * regular one that only the broker's user can write (else it is ignored,
 * with one warning). Control thread only. True if the shift changed (a
 * step, to the broker).
 */
bool wall_hook_read(void);

/*
 * For tests that drive the broker's code with a clock of their own (the
 * fuzz targets): wall_now_ns() reads wall_ns now, and runs on from there.
 */
void wall_pin(uint64_t wall_ns);

#endif /* CHIMED_WALL_H */
