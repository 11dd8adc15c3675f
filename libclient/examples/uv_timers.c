/* SPDX-License-Identifier: MIT */
/*
 * uv_timers - chime in a libuv loop.
 *
 * A uv_poll_t watches chime_fd(); when it is readable, chime_dispatch()
 * runs the callback of every expired timer, until it returns 0. Arming,
 * resetting and cancelling are stores into shared memory: a request that
 * answers in time cancels its timeout with no system call. The requests
 * themselves are simulated by requests.c; exit status 0 if exactly the
 * requests not answered timed out, each once, never early.
 *
 *   uv_timers [-n requests]      (default 2000; $CHIME_SOCKET picks the broker)
 */
#define _POSIX_C_SOURCE 200809L     /* uv.h's pthread types, under -std=c11 too */
#include <stdio.h>
#include <string.h>

#include <chime.h>
#include <uv.h>

#include "requests.h"

struct app {
	struct requests rq;
	uv_poll_t watcher;
	uv_timer_t give_up;
};

static void stop(struct app *a)
{
	uv_close((uv_handle_t *)&a->watcher, NULL);
	uv_close((uv_handle_t *)&a->give_up, NULL);
}

static void on_chime_readable(uv_poll_t *w, int status, int events)
{
	struct app *a = w->data;
	int r;

	(void)events;
	if (status < 0) {
		fprintf(stderr, "uv_timers: poll: %s\n", uv_strerror(status));
		stop(a);
		return;
	}
	/* Drain until empty: the fd is readable again only for new events. */
	while ((r = chime_dispatch(a->rq.chime, requests_on_timer, &a->rq, 0)) > 0)
		;
	if (r < 0)
		fprintf(stderr, "uv_timers: chime_dispatch: %s\n", strerror(-r));
	if (r < 0 || requests_done(&a->rq))
		stop(a);
}

static void on_give_up(uv_timer_t *t)
{
	fprintf(stderr, "uv_timers: gave up after 10 s\n");
	stop(t->data);
}

int main(int argc, char **argv)
{
	uv_loop_t *loop = uv_default_loop();
	unsigned n;
	struct app a;
	chime_t *c;
	int fd, r;

	r = requests_open(argc, argv, "uv_timers", &c, &n);
	if (r)
		return r;
	/* From the loop's thread, before anything drains: it arms the fd's wake-ups. */
	fd = chime_fd(c);
	r = fd < 0 ? fd : uv_poll_init(loop, &a.watcher, fd);
	if (r < 0) {
		fprintf(stderr, "uv_timers: watching chime_fd(): %s\n", fd < 0 ? strerror(-fd) : uv_strerror(r));
		chime_close(c);
		return 1;
	}
	uv_timer_init(loop, &a.give_up);
	a.watcher.data = a.give_up.data = &a;
	uv_poll_start(&a.watcher, UV_READABLE, on_chime_readable);
	uv_timer_start(&a.give_up, on_give_up, 10000, 0);
	if (requests_start(&a.rq, c, n) < 0) {
		chime_close(c);
		return 1;
	}
	uv_run(loop, UV_RUN_DEFAULT);
	uv_loop_close(loop);
	r = requests_finish(&a.rq, "uv_timers");
	chime_close(c);
	return r;
}
