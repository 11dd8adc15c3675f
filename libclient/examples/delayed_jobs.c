/* SPDX-License-Identifier: MIT */
/*
 * delayed_jobs - run jobs at absolute times from an epoll loop.
 *
 * An application with its own event loop adds chime_fd() to it. When the fd
 * is readable, chime_dispatch() calls back once per due job; it runs until
 * nothing is pending, which also re-arms the fd's wake-up.
 *
 * Jobs are scheduled at absolute CLOCK_MONOTONIC times (chime_now() + x),
 * but the reminder, which is due at a time of day ("at 9:00"): it is armed
 * with chime_arm_realtime() at a CLOCK_REALTIME time, and follows the wall
 * clock if it is set meanwhile. The program checks that each ran at or
 * after its time, in its clock, prints them in the order they ran, and
 * exits 0 once all have run.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <chime.h>

#define MS 1000000ull

struct job {
	const char *what;
	uint64_t at_ns;         /* absolute time to run */
	int wall;               /* at_ns is CLOCK_REALTIME (a time of day), not CLOCK_MONOTONIC */
	int done;
};

struct queue {
	uint64_t start_ns;
	int left;
	int bad;
};

/* CLOCK_REALTIME, the clock of chime_arm_realtime(): C11's own reading of it. */
static uint64_t wall_now(void)
{
	struct timespec ts;

	timespec_get(&ts, TIME_UTC);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void run_job(const struct chime_event *ev, void *arg)
{
	struct queue *q = arg;
	struct job *j = (struct job *)(uintptr_t)ev->user_data;
	uint64_t now = chime_now();

	if ((j->wall ? wall_now() : now) < j->at_ns || j->done) {
		fprintf(stderr, "delayed_jobs: '%s' ran %s\n", j->what, j->done ? "twice" : "early");
		q->bad = 1;
	}
	j->done = 1;
	q->left--;
	printf("+%4.1f ms  %s\n", (double)(now - q->start_ns) / 1e6, j->what);
}

int main(void)
{
	/* at_ns starts as milliseconds from the start; main() makes it absolute. */
	struct job jobs[] = {
		{ .what = "send the reminder e-mail", .at_ns = 50, .wall = 1 },
		{ .what = "retry the upload", .at_ns = 10 },
		{ .what = "expire the session", .at_ns = 30 },
		{ .what = "rotate the log", .at_ns = 20 },
		{ .what = "flush the cache", .at_ns = 40 },
	};
	struct queue q = { .left = 5 };
	struct epoll_event ee = { .events = EPOLLIN };
	chime_t *c;
	int ep, fd, r;

	r = chime_open(&c, NULL);
	if (r < 0) {
		fprintf(stderr, "delayed_jobs: cannot connect to chimed: %s%s\n", strerror(-r), r == -ENOENT ? " (is chimed running? its socket: $CHIME_SOCKET, else /run/chime/chime.sock)" : "");
		return 1;
	}
	/*
	 * The start is after the connect: a slow one would eat into the delays,
	 * and jobs already due when armed run at once, in the order armed.
	 */
	q.start_ns = chime_now();
	for (int i = 0; i < 5; i++) {
		uint64_t data = (uint64_t)(uintptr_t)&jobs[i];
		chime_id_t id;

		/* ms from start -> absolute; a real reminder would be a time of day: mktime() of 9:00 */
		if (jobs[i].wall) {
			jobs[i].at_ns = wall_now() + jobs[i].at_ns * MS;
			r = chime_arm_realtime(c, 0, jobs[i].at_ns, 0, data, &id);
		} else {
			jobs[i].at_ns = q.start_ns + jobs[i].at_ns * MS;
			r = chime_arm(c, 0, jobs[i].at_ns, 0, data, &id);
		}
		if (r < 0) {
			fprintf(stderr, "delayed_jobs: %s: %s\n", jobs[i].wall ? "chime_arm_realtime" : "chime_arm",
				strerror(-r));
			chime_close(c);
			return 1;
		}
	}
	fd = chime_fd(c);       /* before draining starts, from the thread that drains */
	if (fd < 0) {
		fprintf(stderr, "delayed_jobs: chime_fd: %s\n", strerror(-fd));
		chime_close(c);
		return 1;
	}
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ee) < 0) {
		perror("delayed_jobs: epoll");
		chime_close(c);
		return 1;
	}
	while (q.left > 0) {
		/* ... the application's other fds would be in this epoll set too ... */
		r = epoll_wait(ep, &ee, 1, 2000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "delayed_jobs: no wake-up with %d jobs left\n", q.left);
			return 1;
		}
		/* max 0: every job due now; it finds the rings empty at the end, which re-arms the fd */
		r = chime_dispatch(c, run_job, &q, 0);
		if (r < 0) {
			/* -ENOTCONN: the broker is gone, and the fd stays readable: stop watching it */
			fprintf(stderr, "delayed_jobs: chime_dispatch: %s\n", strerror(-r));
			chime_close(c);
			return 1;
		}
	}
	close(ep);
	chime_close(c);
	return q.bad;
}
