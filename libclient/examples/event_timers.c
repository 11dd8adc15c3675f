/* SPDX-License-Identifier: MIT */
/*
 * event_timers - chime in a libevent loop.
 *
 * A persistent EV_READ event watches chime_fd() (level-triggered: it is
 * called while events are pending); chime_dispatch() runs the callback of
 * every expired timer, until it returns 0. Arming, resetting and
 * cancelling are stores into shared memory: a request that answers in time
 * cancels its timeout with no system call. The requests themselves are
 * simulated by requests.c; exit status 0 if exactly the requests not
 * answered timed out, each once, never early.
 *
 *   event_timers [-n requests]   (default 2000; $CHIME_SOCKET picks the broker)
 */
#include <stdio.h>
#include <string.h>

#include <chime.h>
#include <event2/event.h>

#include "requests.h"

struct app {
	struct requests rq;
	struct event_base *base;
};

static void on_chime_readable(evutil_socket_t fd, short what, void *arg)
{
	struct app *a = arg;
	int r;

	(void)fd;
	(void)what;
	/* Drain until empty: the fd is readable again only for new events. */
	while ((r = chime_dispatch(a->rq.chime, requests_on_timer, &a->rq, 0)) > 0)
		;
	if (r < 0)
		fprintf(stderr, "event_timers: chime_dispatch: %s\n", strerror(-r));
	if (r < 0 || requests_done(&a->rq))
		event_base_loopbreak(a->base);
}

static void on_give_up(evutil_socket_t fd, short what, void *arg)
{
	struct app *a = arg;

	(void)fd;
	(void)what;
	fprintf(stderr, "event_timers: gave up after 10 s\n");
	event_base_loopbreak(a->base);
}

int main(int argc, char **argv)
{
	struct timeval give_up_after = { .tv_sec = 10 };
	struct event *watcher, *give_up;
	unsigned n;
	struct app a;
	chime_t *c;
	int fd, r;

	r = requests_open(argc, argv, "event_timers", &c, &n);
	if (r)
		return r;
	/* From the loop's thread, before anything drains: it arms the fd's wake-ups. */
	fd = chime_fd(c);
	if (fd < 0) {
		fprintf(stderr, "event_timers: chime_fd: %s\n", strerror(-fd));
		chime_close(c);
		return 1;
	}
	a.base = event_base_new();
	watcher = a.base ? event_new(a.base, fd, EV_READ | EV_PERSIST, on_chime_readable, &a) : NULL;
	give_up = a.base ? evtimer_new(a.base, on_give_up, &a) : NULL;
	if (!watcher || !give_up) {
		fprintf(stderr, "event_timers: libevent: out of memory\n");
		chime_close(c);
		return 1;
	}
	event_add(watcher, NULL);
	evtimer_add(give_up, &give_up_after);
	if (requests_start(&a.rq, c, n) < 0) {
		chime_close(c);
		return 1;
	}
	event_base_dispatch(a.base);
	event_free(watcher);
	event_free(give_up);
	event_base_free(a.base);
	r = requests_finish(&a.rq, "event_timers");
	chime_close(c);
	return r;
}
