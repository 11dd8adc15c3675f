/* SPDX-License-Identifier: MIT */
/*
 * wall.c - the broker's wall clock. See wall.h.
 */
#include "wall.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"
#include "clock.h"
#include "log.h"

/* The test hook's shift, ns (atomic: the control thread writes, shards read). */
static int64_t wall_shift;
/* The offset the shards follow (atomic, as above). */
static int64_t wall_off;

/* CLOCK_REALTIME itself: nothing but wall_now_ns() and wall_pin() read it. */
static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

uint64_t wall_now_ns(void)
{
	return realtime_ns() + (uint64_t)at_load(&wall_shift);
}

void wall_pin(uint64_t wall_ns)
{
	at_store(&wall_shift, (int64_t)(wall_ns - realtime_ns()));
}

int64_t wall_offset_now(void)
{
	uint64_t m0, w, m1;

	for (int i = 0;; i++) {
		m0 = now_ns();
		w = wall_now_ns();
		m1 = now_ns();
		if (m1 - m0 < WALL_PAIR_NS || i == 2)
			break;
	}
	return (int64_t)(w - (m0 + (m1 - m0) / 2));
}

int64_t wall_published(void)
{
	return at_load(&wall_off);
}

void wall_publish(int64_t off)
{
	at_store(&wall_off, off);
}

bool wall_hook_read(void)
{
	const char *path = getenv("CHIMED_WALL_SHIFT_FILE");
	static bool warned;
	struct stat st;
	char buf[32];
	int64_t shift;
	ssize_t n;
	int fd;

	if (!path)
		return false;
	/*
	 * The control thread reads it: never a FIFO or a device (open and
	 * read would wait for a writer, and the heartbeat with them), and only
	 * a file that no one but the broker's own user can write, so that a
	 * path in a shared directory moves no one's clock but its owner's.
	 */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return false;
	/*
	 * Its type first (a read of a FIFO would wait), its owner and mode
	 * after the read: checked before, a file made writable by others and
	 * written between the check and the read could be taken (the likely
	 * way a test that does so as the broker starts failed, once in 10
	 * runs against a TSan chimed).
	 */
	n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (n < 0 || fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		if (!warned)
			log_msg(LOG_WARNING, "$CHIMED_WALL_SHIFT_FILE '%s' ignored: not a regular file that only "
				"the broker's user can write", path);
		warned = true;
		close(fd);
		return false;
	}
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	shift = strtoll(buf, NULL, 10);
	if (shift == at_load(&wall_shift))
		return false;
	at_store(&wall_shift, shift);
	return true;
}
