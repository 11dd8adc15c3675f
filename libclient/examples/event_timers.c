/* SPDX-License-Identifier: MIT */
/*
 * event_timers - chime in a libevent loop: request timeouts for a server.
 *
 * The loop watches chime_fd() with a persistent EV_READ event; when it is readable,
 * chime_dispatch() runs the callbacks of every expired timer. Arming,
 * resetting and cancelling are stores into shared memory: a request that
 * completes in time cancels its timeout with no system call.
 *
 * The simulation: -n requests (2000), each with a timeout 20..220 ms away;
 * every 3rd completes in time (its timeout is cancelled), every 5th of the
 * others is extended by 100 ms (reset), and a periodic 50 ms tick runs
 * beside them. Exit status 0 if exactly the requests not completed timed
 * out, each once, never early, and the tick fired.
 *
 *   event_timers [-n requests]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chime.h>
#include <event2/event.h>

#define MS 1000000ull
#define TICK UINT64_MAX         /* user_data of the periodic tick */

struct request {
	chime_id_t timeout;
	uint64_t deadline_ns;
	int completed, timed_out;
};

struct app {
	chime_t *chime;
	struct event_base *base;
	struct event *watcher;
	struct event *give_up;
	struct request *req;
	unsigned n, expected, timed_out, ticks, errors;
	chime_id_t tick;
};

static void on_timer(const struct chime_event *ev, void *arg)
{
	struct app *a = arg;
	struct request *r;

	if (ev->user_data == TICK) {
		a->ticks++;
		return;
	}
	r = ev->user_data < a->n ? &a->req[ev->user_data] : NULL;
	if (!r || r->completed || r->timed_out || chime_now() < r->deadline_ns) {
		fprintf(stderr, "event_timers: request %llu timed out wrongly\n",
			(unsigned long long)ev->user_data);
		a->errors++;
		return;
	}
	r->timed_out = 1;
	a->timed_out++;
}

static void finish(struct app *a)
{
	chime_cancel(a->chime, a->tick);
	event_base_loopbreak(a->base);
}

static void on_chime_readable(evutil_socket_t fd, short what, void *arg)
{
	struct app *a = arg;
	int r;

	(void)fd;
	(void)what;
	/* Drain until empty: the fd is readable again only for new events. */
	while ((r = chime_dispatch(a->chime, on_timer, a, 0)) > 0)
		;
	if (r < 0) {
		fprintf(stderr, "event_timers: chime_dispatch: %s\n", strerror(-r));
		a->errors++;
		finish(a);
	} else if (a->timed_out == a->expected && a->ticks >= 3) {
		finish(a);
	}
}

static void on_give_up(evutil_socket_t fd, short what, void *arg)
{
	struct app *a = arg;

	(void)fd;
	(void)what;
	fprintf(stderr, "event_timers: gave up: %u of %u timeouts, %u ticks\n",
		a->timed_out, a->expected, a->ticks);
	a->errors++;
	finish(a);
}

int main(int argc, char **argv)
{
	struct app a = { .n = 2000 };
	struct timeval give_up_after = { .tv_sec = 10 };
	int opt, r, fd;

	while ((opt = getopt(argc, argv, "n:")) != -1) {
		if (opt != 'n' || (a.n = (unsigned)atoi(optarg)) == 0) {
			fprintf(stderr, "usage: event_timers [-n requests]\n");
			return 2;
		}
	}
	a.req = calloc(a.n, sizeof(*a.req));
	if (!a.req)
		return 1;
	r = chime_open(&a.chime, NULL);
	if (r < 0) {
		fprintf(stderr, "event_timers: chime_open: %s\n", strerror(-r));
		return 1;
	}
	fd = chime_fd(a.chime);
	a.base = event_base_new();
	if (!a.base)
		return 1;
	/* Level-triggered and persistent: called while events are pending. */
	a.watcher = event_new(a.base, fd, EV_READ | EV_PERSIST, on_chime_readable, &a);
	a.give_up = evtimer_new(a.base, on_give_up, &a);
	if (!a.watcher || !a.give_up)
		return 1;
	event_add(a.watcher, NULL);
	evtimer_add(a.give_up, &give_up_after);

	r = chime_arm(a.chime, 0, chime_now() + 50 * MS, 50 * MS, TICK, &a.tick);
	for (unsigned i = 0; i < a.n && r == 0; i++) {
		a.req[i].deadline_ns = chime_now() + (20 + i % 200) * MS;
		r = chime_arm(a.chime, 1, a.req[i].deadline_ns, 0, i, &a.req[i].timeout);
	}
	for (unsigned i = 0; i < a.n && r == 0; i++) {
		if (i % 3 == 0) {               /* answered in time */
			r = chime_cancel(a.chime, a.req[i].timeout);
			a.req[i].completed = 1;
			continue;
		}
		if (i % 5 == 0) {               /* the client asked for more time */
			a.req[i].deadline_ns += 100 * MS;
			r = chime_reset(a.chime, a.req[i].timeout, a.req[i].deadline_ns);
		}
		a.expected++;
	}
	if (r < 0) {
		fprintf(stderr, "event_timers: arming: %s\n", strerror(-r));
		return 1;
	}
	event_base_dispatch(a.base);
	event_free(a.watcher);
	event_free(a.give_up);
	event_base_free(a.base);
	chime_close(a.chime);
	free(a.req);
	if (a.errors || a.timed_out != a.expected)
		return 1;
	printf("event_timers: %u timeouts, %u cancelled, %u ticks\n", a.timed_out, a.n - a.expected, a.ticks);
	return 0;
}
