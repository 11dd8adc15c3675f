/* SPDX-License-Identifier: MIT */
/*
 * delayed_jobs - run jobs at absolute times from an epoll loop.
 *
 * An application with its own event loop adds chime_fd() to it. When the fd
 * is readable, chime_dispatch() calls back once per due job; it runs until
 * nothing is pending, which also re-arms the fd's wake-up.
 *
 * Jobs are scheduled at absolute CLOCK_MONOTONIC times (chime_now() + x);
 * the program checks that each ran at or after its time, prints them in the
 * order they ran, and exits 0 once all have run.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chime.h>

#define MS 1000000ull

struct job {
	const char *what;
	uint64_t at_ns;         /* absolute time to run */
	int done;
};

struct queue {
	uint64_t start_ns;
	int left;
	int bad;
};

static void run_job(const struct chime_event *ev, void *arg)
{
	struct queue *q = arg;
	struct job *j = (struct job *)(uintptr_t)ev->user_data;
	uint64_t now = chime_now();

	if (now < j->at_ns || j->done) {
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
		{ .what = "send the reminder e-mail", .at_ns = 50 },
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
		fprintf(stderr, "delayed_jobs: cannot connect to chimed: %s\n", strerror(-r));
		return 1;
	}
	/*
	 * The start is after the connect: a slow one would eat into the delays,
	 * and jobs already due when armed run at once, in the order armed.
	 */
	q.start_ns = chime_now();
	for (int i = 0; i < 5; i++) {
		chime_id_t id;

		jobs[i].at_ns = q.start_ns + jobs[i].at_ns * MS;     /* ms from start -> absolute */
		r = chime_arm(c, 0, jobs[i].at_ns, 0, (uint64_t)(uintptr_t)&jobs[i], &id);
		if (r < 0) {
			fprintf(stderr, "delayed_jobs: chime_arm: %s\n", strerror(-r));
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
