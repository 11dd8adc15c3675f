/* SPDX-License-Identifier: MIT */
/* requests - the event-loop examples' simulation (see requests.h). */
#define _POSIX_C_SOURCE 200809L     /* getopt(), under -std=c11 too */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "requests.h"

#define MS 1000000ull
#define TICK UINT64_MAX         /* user_data of the periodic tick */

int requests_open(int argc, char **argv, const char *prog, chime_t **c, unsigned *n)
{
	int opt, r;

	*n = 2000;
	while ((opt = getopt(argc, argv, "n:")) != -1) {
		char *end = NULL;
		unsigned long v = 0;

		/* Digits only: atoi() took "-1" as 4294967295 requests, "5x" as 5. */
		errno = 0;
		if (opt == 'n' && isdigit((unsigned char)*optarg))
			v = strtoul(optarg, &end, 10);
		if (opt != 'n' || errno || !end || *end || v < 1 || v > 1000000) {
			fprintf(stderr, "usage: %s [-n requests]   (requests: 1..1000000)\n", prog);
			return 2;
		}
		*n = (unsigned)v;
	}
	if (optind < argc) {
		fprintf(stderr, "usage: %s [-n requests]   (requests: 1..1000000), and no other argument\n", prog);
		return 2;
	}
	r = chime_open(c, NULL);
	if (r < 0) {
		fprintf(stderr, "%s: cannot connect to chimed: %s%s\n", prog, strerror(-r), r == -ENOENT ? " (is chimed running? its socket: $CHIME_SOCKET, else /run/chime/chime.sock)" : "");
		return 1;
	}
	return 0;
}

int requests_start(struct requests *rq, chime_t *c, unsigned n)
{
	int r;

	*rq = (struct requests){ .chime = c, .n = n, .req = calloc(n, sizeof(*rq->req)) };
	if (!rq->req) {
		fprintf(stderr, "requests: %u requests: out of memory\n", n);
		return -ENOMEM;
	}
	r = chime_arm(c, 0, chime_now() + 50 * MS, 50 * MS, TICK, &rq->tick);
	for (unsigned i = 0; i < n && r == 0; i++) {
		rq->req[i].deadline_ns = chime_now() + (20 + i % 200) * MS;
		r = chime_arm(c, 1, rq->req[i].deadline_ns, 0, i, &rq->req[i].timeout);
	}
	for (unsigned i = 0; i < n && r == 0; i++) {
		if (i % 3 == 0) {               /* answered in time: no syscall to cancel */
			r = chime_cancel(c, rq->req[i].timeout);
			rq->req[i].answered = 1;
			continue;
		}
		if (i % 5 == 0) {               /* the client asked for more time */
			rq->req[i].deadline_ns += 100 * MS;
			r = chime_reset(c, rq->req[i].timeout, rq->req[i].deadline_ns);
		}
		rq->expected++;
	}
	if (r < 0) {
		fprintf(stderr, "requests: arming: %s\n", strerror(-r));
		free(rq->req);          /* no requests_finish() follows */
		rq->req = NULL;
	}
	return r;
}

void requests_on_timer(const struct chime_event *ev, void *arg)
{
	struct requests *rq = arg;
	struct request *q;

	if (ev->user_data == TICK) {
		rq->ticks++;
		return;
	}
	q = ev->user_data < rq->n ? &rq->req[ev->user_data] : NULL;
	if (!q || q->answered || q->timed_out || chime_now() < q->deadline_ns) {
		fprintf(stderr, "requests: request %llu timed out wrongly\n",
			(unsigned long long)ev->user_data);
		rq->errors++;
		return;
	}
	q->timed_out = 1;
	rq->timed_out++;
}

int requests_done(const struct requests *rq)
{
	return rq->timed_out == rq->expected && rq->ticks >= 3;
}

int requests_finish(struct requests *rq, const char *prog)
{
	int ok = !rq->errors && requests_done(rq);

	chime_cancel(rq->chime, rq->tick);
	if (ok)
		printf("%s: %u timeouts, %u answered in time, %u ticks\n", prog, rq->timed_out,
		       rq->n - rq->expected, rq->ticks);
	else
		fprintf(stderr, "%s: %u of %u timeouts, %u ticks, %u errors\n", prog, rq->timed_out,
			rq->expected, rq->ticks, rq->errors);
	free(rq->req);
	return ok ? 0 : 1;
}
