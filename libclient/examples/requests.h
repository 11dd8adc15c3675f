/* SPDX-License-Identifier: MIT */
/*
 * requests - the simulation behind the event-loop examples (uv_timers.c,
 * event_timers.c), so that each of them shows only its loop's wiring.
 *
 * n requests, each with a timeout 20..220 ms away; every 3rd answers in time
 * (its timeout is cancelled), every 5th of the others asks for 100 ms more
 * (reset), and a periodic 50 ms tick runs beside them. requests_on_timer()
 * is the chime_cb to dispatch to; it checks that exactly the requests not
 * answered time out, each once, never early.
 */
#ifndef CHIME_EXAMPLE_REQUESTS_H
#define CHIME_EXAMPLE_REQUESTS_H

#include <chime.h>

struct request {
	chime_id_t timeout;
	uint64_t deadline_ns;
	int answered, timed_out;
};

struct requests {
	chime_t *chime;
	struct request *req;
	unsigned n, expected, timed_out, ticks, errors;
	chime_id_t tick;
};

/*
 * Parse the examples' command line ([-n requests], default 2000) and connect
 * to the broker ($CHIME_SOCKET or the default socket). 0, or the exit status
 * to return (2: usage, 1: no broker) after printing why.
 */
int requests_open(int argc, char **argv, const char *prog, chime_t **c, unsigned *n);

/* Arm (and cancel and reset) everything; 0, or a negative errno (printed; nothing left to finish). */
int requests_start(struct requests *rq, chime_t *c, unsigned n);

/* The chime_cb for chime_dispatch(): arg is the struct requests. */
void requests_on_timer(const struct chime_event *ev, void *arg);

/* Every expected timeout came, and a few ticks: time to stop the loop. */
int requests_done(const struct requests *rq);

/* Cancel the tick, print the outcome; the exit status (0: all as expected). */
int requests_finish(struct requests *rq, const char *prog);

#endif
