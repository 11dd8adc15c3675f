/* SPDX-License-Identifier: MIT */
/*
 * demo_dup.so: chime-demo, preloaded with it, receives one event twice and
 * never sees another: the first event its chime_wait() returns is kept, and
 * the first event of a later call is replaced by a copy of it. The count of
 * events is what it would be; test_tools checks that the demo tells the
 * duplicate and the loss all the same. With $DEMO_DUP_EARLY set, the event
 * of a later call is instead said to have fired a nanosecond before its
 * deadline: the demo must tell it too (its "0 early" is what other tests
 * take as "never early"). Built for the tests only (tests/meson.build),
 * never installed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>

#include <chime.h>

int chime_wait(chime_t *c, struct chime_event *events, unsigned max, int timeout_ms)
{
	static struct chime_event first;
	static int state;       /* 0: none kept yet, 1: kept, 2: duplicated */
	int (*real)(chime_t *, struct chime_event *, unsigned, int);
	int n;

	*(void **)&real = dlsym(RTLD_NEXT, "chime_wait");
	if (!real)
		return -ENOSYS;
	n = real(c, events, max, timeout_ms);
	if (n > 0 && state == 0) {
		first = events[0];
		state = 1;
	} else if (n > 0 && state == 1) {
		if (getenv("DEMO_DUP_EARLY"))
			events[0].fired_ns = events[0].deadline_ns - 1;
		else
			events[0] = first;
		state = 2;
	}
	return n;
}
