/* SPDX-License-Identifier: MIT */
/*
 * uv_timers - chime in a libuv loop: request timeouts for a server.
 *
 * The loop watches chime_fd() with a uv_poll_t; when it is readable,
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
 *   uv_timers [-n requests]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chime.h>
#include <uv.h>

#define MS 1000000ull
#define TICK UINT64_MAX         /* user_data of the periodic tick */

struct request {
	chime_id_t timeout;
	uint64_t deadline_ns;
	int completed, timed_out;
};

struct app {
	chime_t *chime;
	uv_poll_t watcher;
	uv_timer_t give_up;
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
		fprintf(stderr, "uv_timers: request %llu timed out wrongly\n",
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
	uv_poll_stop(&a->watcher);
	uv_timer_stop(&a->give_up);
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
		a->errors++;
		finish(a);
		return;
	}
	/* Drain until empty: the fd is readable again only for new events. */
	while ((r = chime_dispatch(a->chime, on_timer, a, 0)) > 0)
		;
	if (r < 0) {
		fprintf(stderr, "uv_timers: chime_dispatch: %s\n", strerror(-r));
		a->errors++;
		finish(a);
	} else if (a->timed_out == a->expected && a->ticks >= 3) {
		finish(a);
	}
}

static void on_give_up(uv_timer_t *t)
{
	struct app *a = t->data;

	fprintf(stderr, "uv_timers: gave up: %u of %u timeouts, %u ticks\n",
		a->timed_out, a->expected, a->ticks);
	a->errors++;
	finish(a);
}

int main(int argc, char **argv)
{
	struct app a = { .n = 2000 };
	uv_loop_t *loop = uv_default_loop();
	int opt, r, fd;

	while ((opt = getopt(argc, argv, "n:")) != -1) {
		if (opt != 'n' || (a.n = (unsigned)atoi(optarg)) == 0) {
			fprintf(stderr, "usage: uv_timers [-n requests]\n");
			return 2;
		}
	}
	a.req = calloc(a.n, sizeof(*a.req));
	if (!a.req)
		return 1;
	r = chime_open(&a.chime, NULL);
	if (r < 0) {
		fprintf(stderr, "uv_timers: chime_open: %s\n", strerror(-r));
		return 1;
	}
	fd = chime_fd(a.chime);
	uv_poll_init(loop, &a.watcher, fd);
	a.watcher.data = &a;
	uv_poll_start(&a.watcher, UV_READABLE, on_chime_readable);
	uv_timer_init(loop, &a.give_up);
	a.give_up.data = &a;
	uv_timer_start(&a.give_up, on_give_up, 10000, 0);

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
		fprintf(stderr, "uv_timers: arming: %s\n", strerror(-r));
		return 1;
	}
	uv_run(loop, UV_RUN_DEFAULT);
	uv_loop_close(loop);
	chime_close(a.chime);
	free(a.req);
	if (a.errors || a.timed_out != a.expected)
		return 1;
	printf("uv_timers: %u timeouts, %u cancelled, %u ticks\n", a.timed_out, a.n - a.expected, a.ticks);
	return 0;
}
