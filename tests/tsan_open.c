/* SPDX-License-Identifier: MIT */
/*
 * tsan_open.c CHIMED - a chime_t per thread, under ThreadSanitizer:
 * threads that each open, use and close connections of their own at the
 * same time (chime_open(3): "MT-Safe: any thread may open connections at
 * any time").
 *
 * A plain program (criterion cannot run under TSan, ../shared/STYLE.md section 9):
 * exit 0 on success, 1 on a failed call; TSan exits 66 on a report
 * (halt_on_error; the broker gets the same options).
 *
 * It starts its own chimed (argv[1], else $CHIMED) on a private socket,
 * then 4 threads each, 25 times over: chime_open() (an anonymous
 * connection, every other time a session of the thread's own), arm a
 * timer due now, chime_wait() for its event, chime_close(). Every open
 * adds its connection to the library's list of open connections (what a
 * fork() lets go of) and every close takes it out, while the other
 * threads do the same: found by an adopter's program, whose close read
 * its list links outside the list's lock while another thread's open
 * wrote them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chime.h>

#include "tsan_harness.h"

#define NTHREADS 4
#define ROUNDS   25

static void *worker(void *arg)
{
	unsigned t = (unsigned)(uintptr_t)arg;
	char name[48];

	snprintf(name, sizeof(name), "tsan-open-%d-%u", (int)getpid(), t);
	for (unsigned i = 0; i < ROUNDS; i++) {
		struct chime_opts o = { .socket_path = sock_path, .session = i % 2 ? name : NULL };
		struct chime_event ev;
		chime_id_t id;
		chime_t *c;
		int r = chime_open(&c, &o);

		if (r < 0)
			fail_op(r, "thread %u: chime_open (%s): %s", t, o.session ? "session" : "anonymous", strerror(-r));
		r = chime_arm(c, t, chime_now(), 0, i, &id);
		if (r < 0)
			fail_op(r, "thread %u: chime_arm: %s", t, strerror(-r));
		r = chime_wait(c, &ev, 1, 5000);
		if (r != 1)
			fail_op(r, "thread %u: chime_wait returned %d (%s), not its event", t, r,
				r < 0 ? strerror(-r) : "timed out");
		if (ev.id != id || ev.user_data != i)
			violation("thread %u: an event of another timer (user_data %llu, round %u)", t,
				  (unsigned long long)ev.user_data, i);
		chime_close(c);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	const char *chimed = argc > 1 ? argv[1] : getenv("CHIMED");
	pthread_t th[NTHREADS];

	prog = "tsan_open";
	if (!chimed || !*chimed) {
		fprintf(stderr, "usage: tsan_open CHIMED (or $CHIMED)\n");
		return 2;
	}
	chimed_path = chimed;
	start_broker();
	scenario_name = "a chime_t per thread";
	for (unsigned t = 0; t < NTHREADS; t++)
		if ((errno = pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t)) != 0)
			fail("pthread_create: %s", strerror(errno));
	for (unsigned t = 0; t < NTHREADS; t++)
		pthread_join(th[t], NULL);
	stop_broker();
	cleanup();
	if (violations) {
		fprintf(stderr, "tsan_open: %llu violation(s)\n", (unsigned long long)violations);
		return 1;
	}
	printf("tsan_open: ok, no race reported (this process and chimed)\n");
	return 0;
}
