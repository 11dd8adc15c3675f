/* SPDX-License-Identifier: MIT */
/*
 * timeout_tasks - give tasks a deadline, cancel them by id or all at once.
 *
 * Each task owns a timer: its key is the group it belongs to and its
 * user_data points back at the task (a "context pointer"), so the event
 * says which task timed out without any lookup.
 *
 * This program arms "a" in 40 ms, "b" in 30 ms and "c" in 20 ms (group 1),
 * "d" in 10 ms which it cancels by id, and "e", "f" in 5 ms (group 2) which
 * it cancels with one chime_cancel_key(). It prints the tasks that time out,
 * in order: c, b, a. Exit status 0 if that is what happened.
 *
 * Run: chimed & CHIME_SOCKET=... ./example_timeout_tasks
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <chime.h>

#define MS 1000000ull

struct task {
	const char *name;
	chime_id_t timer;
};

static int start(chime_t *c, struct task *t, uint64_t group, uint64_t timeout_ms)
{
	/* The task's own address comes back in the event's user_data. */
	return chime_arm(c, group, chime_now() + timeout_ms * MS, 0, (uint64_t)(uintptr_t)t, &t->timer);
}

int main(void)
{
	struct task a = { .name = "a" }, b = { .name = "b" }, c_ = { .name = "c" };
	struct task d = { .name = "d" }, e = { .name = "e" }, f = { .name = "f" };
	const char *want[] = { "c", "b", "a" };
	struct chime_event ev[8];
	chime_t *c;
	int r, n = 0;

	r = chime_open(&c, NULL);   /* $CHIME_SOCKET, else the default socket */
	if (r < 0) {
		fprintf(stderr, "timeout_tasks: cannot connect to chimed: %s%s\n", strerror(-r), r == -ENOENT ? " (is chimed running? its socket: $CHIME_SOCKET, else /run/chime/chime.sock)" : "");
		return 1;
	}
	if ((r = start(c, &a, 1, 40)) < 0 || (r = start(c, &b, 1, 30)) < 0 || (r = start(c, &c_, 1, 20)) < 0 ||
	    (r = start(c, &d, 1, 10)) < 0 || (r = start(c, &e, 2, 5)) < 0 || (r = start(c, &f, 2, 5)) < 0) {
		/* -EDQUOT, -ENOMEM: the broker's limits; -ENOTCONN: it is gone */
		fprintf(stderr, "timeout_tasks: chime_arm: %s\n", strerror(-r));
		chime_close(c);
		return 1;
	}
	/* Neither fails but with -ENOTCONN (the broker is gone: the wait below says so too). */
	(void)chime_cancel(c, d.timer);         /* "d" finished in time */
	(void)chime_cancel_key(c, 2);           /* group 2 was abandoned: drop all its timeouts */

	/*
	 * Collect timeouts until a quiet 100 ms; none of d, e, f may show up.
	 * -EINTR: the process was stopped and continued (^Z, fg): wait on.
	 */
	while ((r = chime_wait(c, ev, 8, 100)) > 0 || r == -EINTR) {
		for (int i = 0; i < r; i++) {
			struct task *t = (struct task *)(uintptr_t)ev[i].user_data;

			printf("%s timed out (%.1f ms late)\n", t->name,
			       (double)(ev[i].fired_ns - ev[i].deadline_ns) / 1e6);
			if (n >= 3 || strcmp(t->name, want[n]) != 0) {
				fprintf(stderr, "timeout_tasks: unexpected task '%s'\n", t->name);
				chime_close(c);
				return 1;
			}
			n++;
		}
	}
	chime_close(c);
	if (r < 0 || n != 3) {
		fprintf(stderr, "timeout_tasks: %d of 3 timeouts (%s)\n", n, r < 0 ? strerror(-r) : "ok");
		return 1;
	}
	return 0;
}
