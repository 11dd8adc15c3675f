/* SPDX-License-Identifier: MIT */
/*
 * heartbeat - find the silent ones among many connections.
 *
 * Every connection has one idle timer, due `timeout` after it was last
 * heard from. Each keepalive just moves it (chime_reset: a store into
 * shared memory, no syscall). A connection that goes quiet is reported
 * when its timer fires.
 *
 * The simulation: -n connections (100000), every -s'th one (997) goes
 * silent at once, the others send a keepalive every timeout/4; after -d ms
 * (2000) the live ones hang up (their timers cancelled), and the program
 * checks that exactly the silent ones were reported, each once. Exit status
 * 0 if so.
 *
 *   heartbeat [-n connections] [-t timeout_ms] [-d duration_ms] [-s every]
 */
#define _POSIX_C_SOURCE 200809L     /* getopt(), under -std=c11 too */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chime.h>

#define MS 1000000ull
#define WRONG_REPORT 1          /* report()'s own failure: positive, unlike chime's -errno */

struct conn {
	chime_id_t idle_timer;
	uint8_t silent;         /* simulation: this peer stopped talking */
	uint8_t reported;
};

/* Take every report pending (waiting timeout_ms for the first): 0, WRONG_REPORT, or chime_wait's -errno. */
static int report(chime_t *c, struct conn *conns, unsigned n, int timeout_ms, unsigned *reported)
{
	struct chime_event ev[256];
	int r;

	/* -EINTR: the process was stopped and continued (^Z, fg): wait on */
	while ((r = chime_wait(c, ev, 256, timeout_ms)) > 0 || r == -EINTR) {
		for (int i = 0; i < r; i++) {
			struct conn *k = ev[i].user_data < n ? &conns[ev[i].user_data] : NULL;

			if (!k || !k->silent || k->reported) {
				fprintf(stderr, "heartbeat: connection %llu wrongly reported\n",
					(unsigned long long)ev[i].user_data);
				return WRONG_REPORT;
			}
			k->reported = 1;
			(*reported)++;
		}
		timeout_ms = 0;
	}
	return r;
}

/*
 * A whole decimal number in min..max, digits only (atoi() takes "-1" as
 * 4294967295 connections, "5x" as 5); anything else clears *ok.
 */
static long number(const char *s, long min, long max, int *ok)
{
	char *end = NULL;
	long v;

	errno = 0;
	v = isdigit((unsigned char)*s) ? strtol(s, &end, 10) : -1;
	if (v < 0 || errno || *end || v < min || v > max) {
		*ok = 0;
		return min;
	}
	return v;
}

int main(int argc, char **argv)
{
	unsigned n = 100000, every = 997, silent = 0, reported = 0;
	int timeout_ms = 500, duration_ms = 2000, opt, r, ok = 1;
	uint64_t start, end, next_round;
	struct conn *conns;
	chime_t *c;

	while ((opt = getopt(argc, argv, "n:t:d:s:")) != -1) {
		switch (opt) {
		case 'n': n = (unsigned)number(optarg, 1, 10000000, &ok); break;
		case 't': timeout_ms = (int)number(optarg, 20, 3600000, &ok); break;
		case 'd': duration_ms = (int)number(optarg, 0, 3600000, &ok); break;
		case 's': every = (unsigned)number(optarg, 1, 10000000, &ok); break;
		default:
			fprintf(stderr, "usage: heartbeat [-n conns] [-t timeout_ms] [-d duration_ms] [-s every]\n");
			return 2;
		}
	}
	if (optind < argc || !ok) {
		fprintf(stderr, "heartbeat: need -n 1..10000000, -s 1..10000000, -t 20..3600000, -d 0..3600000 "
			"(whole numbers) and no other argument\n");
		return 2;
	}
	conns = calloc(n, sizeof(*conns));
	if (!conns) {
		fprintf(stderr, "heartbeat: no memory for %u connections\n", n);
		return 1;
	}
	r = chime_open(&c, NULL);
	if (r < 0) {
		fprintf(stderr, "heartbeat: cannot connect to chimed: %s%s\n", strerror(-r), r == -ENOENT ? " (is chimed running? its socket: $CHIME_SOCKET, else /run/chime/chime.sock)" : "");
		free(conns);
		return 1;
	}
	/* Every connection starts with an idle timer; user_data is its index. */
	start = chime_now();
	for (unsigned i = 0; i < n; i++) {
		conns[i].silent = i % every == 0;
		silent += conns[i].silent;
		r = chime_arm(c, 0, start + (uint64_t)timeout_ms * MS, 0, i, &conns[i].idle_timer);
		if (r < 0)
			goto fail;
	}
	end = start + (uint64_t)duration_ms * MS;
	next_round = start;
	while (chime_now() < end) {
		if (chime_now() >= next_round) {
			/* A keepalive from every live peer: push its deadline out. */
			uint64_t deadline = chime_now() + (uint64_t)timeout_ms * MS;

			for (unsigned i = 0; i < n; i++)
				if (!conns[i].silent && (r = chime_reset(c, conns[i].idle_timer, deadline)) < 0)
					goto fail;
			next_round += (uint64_t)timeout_ms * MS / 4;
		}
		r = report(c, conns, n, 5, &reported);
		if (r != 0)
			goto fail;
	}
	/* The live peers hang up: their idle timers go, and only the silent ones are owed a report. */
	for (unsigned i = 0; i < n; i++)
		if (!conns[i].silent && (r = chime_cancel(c, conns[i].idle_timer)) < 0)
			goto fail;
	/* Anyone still owed a report is due within a timeout of the start; wait at most two past the end. */
	while (reported < silent && chime_now() < end + 2 * (uint64_t)timeout_ms * MS) {
		r = report(c, conns, n, 10, &reported);
		if (r != 0)
			goto fail;
	}
	printf("heartbeat: %u connections, %u silent, %u reported\n", n, silent, reported);
	chime_close(c);
	free(conns);
	return reported == silent ? 0 : 1;
fail:
	fprintf(stderr, "heartbeat: %s\n", r == WRONG_REPORT ? "wrong report" : strerror(-r));
	chime_close(c);
	free(conns);
	return 1;
}
