/* SPDX-License-Identifier: MIT */
/*
 * unpaid_orders - close an order that is still unpaid when its deadline
 * comes, even if the process that took the order is gone by then.
 *
 * The timers live in a named session (chime_open(3)): when the process
 * that armed them exits, the broker keeps them armed and holds what fires
 * for the next process that opens the same name. Here a child takes five
 * orders (timer key = order number), hears that order 2 was paid, and
 * exits without waiting. Then this process, a "restarted worker", opens
 * the session, hears that order 4 was paid (it never had that timer's id:
 * chime_cancel_key() by the order number), and closes the others as their
 * deadlines come. It checks that exactly orders 1, 3 and 5 were closed,
 * none before its deadline, and exits 0.
 *
 * In a real service the deadline is 30 minutes, not 100-300 ms, and the
 * session name is the service's own ("billing-worker").
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chime.h>

#define MS     1000000ull
#define ORDERS 5

/* The worker that takes the orders: it arms their deadlines and exits. */
static int take_orders(const char *session)
{
	struct chime_opts o = { .session = session };
	chime_id_t ids[ORDERS + 1];
	chime_t *c;
	int r = chime_open(&c, &o);

	if (r < 0) {
		fprintf(stderr, "unpaid_orders: cannot open session '%s': %s%s\n", session, strerror(-r),
			r == -EBUSY ? " (another run of this example has it open)" : "");
		return 1;
	}
	for (uint64_t order = 1; order <= ORDERS; order++) {
		/* order n is closed if still unpaid 50 ms * n + 50 ms from now */
		r = chime_arm(c, order, chime_now() + (50 * order + 50) * MS, 0, order, &ids[order]);
		if (r < 0) {
			fprintf(stderr, "unpaid_orders: chime_arm: %s\n", strerror(-r));
			return 1;
		}
		printf("worker %d: order %llu taken\n", (int)getpid(), (unsigned long long)order);
	}
	chime_cancel(c, ids[2]);
	printf("worker %d: order 2 paid\n", (int)getpid());
	/* A session's close detaches it: the timers stay armed for the next process. */
	chime_close(c);
	printf("worker %d: exits\n", (int)getpid());
	fflush(stdout);         /* the child leaves by _exit(), which does not */
	return 0;
}

int main(void)
{
	/*
	 * One name for every run. A session outlives its processes (an hour
	 * by default): the run ends it with chime_drop_session(), and drops
	 * what a run that died left under the name before it starts.
	 */
	const char *session = "unpaid-orders-example";
	int closed[ORDERS + 1] = { 0 }, left = 3, bad = 0, st, r;
	struct chime_opts o = { .session = session };
	chime_t *c;
	pid_t pid;

	r = chime_drop_session(&o);
	if (r < 0 && r != -ESRCH) {
		fprintf(stderr, "unpaid_orders: cannot drop what an earlier run left in session '%s': %s%s\n",
			session, strerror(-r), r == -ENOENT ? " (is chimed running? its socket: $CHIME_SOCKET, else /run/chime/chime.sock)" : "");
		return 1;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("unpaid_orders: fork");
		return 1;
	}
	if (pid == 0)
		_exit(take_orders(session));
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return 1;

	/* The restarted worker: the same name, the same timers. */
	r = chime_open(&c, &o);
	if (r < 0) {
		fprintf(stderr, "unpaid_orders: cannot open session '%s': %s\n", session, strerror(-r));
		return 1;
	}
	chime_cancel_key(c, 4);
	printf("worker %d: order 4 paid\n", (int)getpid());
	while (left > 0) {
		struct chime_event ev[ORDERS];
		int n = chime_wait(c, ev, ORDERS, 2000);

		if (n == -EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "unpaid_orders: %s with %d orders open\n", n < 0 ? strerror(-n) : "no event",
				left);
			bad = 1;
			break;
		}
		for (int i = 0; i < n; i++) {
			uint64_t order = ev[i].user_data;

			if (order < 1 || order > ORDERS || order == 2 || order == 4 || closed[order] ||
			    ev[i].fired_ns < ev[i].deadline_ns || chime_now() < ev[i].deadline_ns) {
				fprintf(stderr, "unpaid_orders: order %llu closed wrongly\n", (unsigned long long)order);
				bad = 1;
				continue;
			}
			closed[order] = 1;
			left--;
			printf("worker %d: order %llu closed unpaid, %.1f ms after its deadline\n", (int)getpid(),
			       (unsigned long long)order, (double)(chime_now() - ev[i].deadline_ns) / 1e6);
		}
	}
	/* Nothing else comes: the paid orders' timers were cancelled, whoever armed them. */
	{
		struct chime_event ev;

		while ((r = chime_wait(c, &ev, 1, 300)) == -EINTR)
			;       /* stopped and continued (^Z, fg): wait on */
		if (r != 0) {
			fprintf(stderr, "unpaid_orders: %s after the last unpaid order\n",
				r > 0 ? "an event" : strerror(-r));
			bad = 1;
		}
	}
	/* The job is done: end the session, or its (empty) slot would linger for an hour. */
	chime_close(c);
	r = chime_drop_session(&o);
	if (r < 0) {
		fprintf(stderr, "unpaid_orders: cannot drop session '%s': %s\n", session, strerror(-r));
		bad = 1;
	}
	return bad;
}
