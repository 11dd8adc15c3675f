/* SPDX-License-Identifier: MIT */
/*
 * test_restart.c - named sessions' timers outlive the broker
 * (ARCHITECTURE.md, "Broker restart"): a SIGKILLed chimed's successor takes
 * over every session's timers (ids still valid, each fired once, never
 * early, late if due while no broker ran) and frees anonymous clients';
 * a stop parks attached sessions so the claim word keeps events exactly
 * once; a restart loop leaks nothing; scribbled files are repaired node by
 * node or refused, never crash the broker; --fresh and a changed geometry
 * behave as documented.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/fs.h>
#include <pthread.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"
#include "client.h"      /* ring_holds(): the ring's published tail (white box) */
#include "helpers.h"
#include "t_session.h"

#define HOUR (3600000 * MS)
#define ARMED_STATES ((1u << CHIME_NODE_ARMED) | (1u << CHIME_NODE_EXPIRED))

static struct t_chimed tb;

static void stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(restart, .fini = stop, .timeout = 240);

static void start(const char *extra)
{
	cr_assert_eq(t_chimed_start(&tb, NULL, extra), 0, "chimed %s did not start", extra);
	t_session_sock = tb.sock;
}

static void restart(int sig, const char *extra)
{
	cr_assert_eq(t_chimed_restart(&tb, sig, extra), 0, "chimed %s did not start again", extra);
}

/* Open `session` and arm n timers an hour ahead (user_data 0..n-1); the last one's id in *last. */
static chime_t *open_armed(const char *session, unsigned n, chime_id_t *last)
{
	chime_t *c = sopen_ok(session);

	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, i, last), 0);
	return c;
}

/*
 * Wait (up to 5 s) until at least n events are published in c's rings (white
 * box: each shard's tail against the process's head, read without taking
 * anything): what a fixed sleep "until they are delivered" waited for.
 */
static uint64_t ring_count(chime_t *c)
{
	uint64_t have = 0;

	for (uint32_t k = 0; k < c->nr_shards; k++)
		have += __atomic_load_n(c->chan[k].cq.tail_pub, __ATOMIC_ACQUIRE) - c->chan[k].cq.head;
	return have;
}

static void ring_holds(chime_t *c, uint64_t n)
{
	uint64_t t0 = now_ns(), have;

	for (;;) {
		have = ring_count(c);
		if (have >= n)
			return;
		cr_assert_lt(now_ns() - t0, 5000 * MS, "%llu of %llu events in the ring after 5 s",
			     (unsigned long long)have, (unsigned long long)n);
		usleep(1000);
	}
}

/* ---- (1) chimed SIGKILLed under a session: its successor has every timer, ids valid ---- */

enum { ANON1 = 500 };

Test(restart, sigkilled_broker_hands_every_session_timer_to_the_next_one)
{
	char log[300], extra[400];
	struct t1 *s;
	struct chime_event e;
	unsigned live = 0;
	chime_t *anon;
	chime_id_t id;
	pid_t pid;

	start("-n 2");
	s = t1_new(2500, 2700);
	pid = child(t1_child, s);
	anon = sopen_ok(NULL);
	for (unsigned i = 0; i < ANON1; i++)
		cr_assert_eq(chime_arm(anon, 0, now_ns() + HOUR, 0, i, &id), 0);
	for (unsigned i = 0; i < T1_N; i++)
		live += !s->cancelled[i];
	/* Applied by the broker (it has no flush: a crash loses what it never read). */
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, live + ANON1), live + ANON1);

	/* The broker dies with the session's process still attached. */
	snprintf(log, sizeof(log), "%s.restore.log", tb.sock);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	restart(SIGKILL, extra);
	/* the anonymous client's timers, named apart from its grants (one a submission slot) */
	cr_assert(t_file_has(log, "freed 500 timers and"), "the restore does not say it freed the 500 anonymous timers");
	kill_child(pid);
	for (int i = 0; i < 300 && chime_poll(anon, &e, 1) != -ENOTCONN; i++)
		usleep(10 * 1000);
	cr_assert_eq(chime_poll(anon, &e, 1), -ENOTCONN, "the anonymous client did not see its broker go");
	chime_close(anon);
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), live, "anonymous timers survived, or session ones were lost");
	t1_next_process(s, 2900, 3500);
}

/*
 * A session's linger is how long it waits for a process once its process
 * is gone, but after a restart its process may be alive and reconnecting:
 * libchime backs off to an attempt a second, and the restore itself comes
 * before the first beat. The restored session got --session-linger from
 * the restore's start, so with a short one (0 reclaims at once) the next
 * broker reclaimed the session of a process that was still there, and its
 * reconnect found it gone (-ESTALE, then -ENOTCONN): every timer lost. A
 * restored session now waits at least RESTART_LINGER_NS from the end of the
 * restore (found by a leak audit's churn, with --session-linger 1).
 */
Test(restart, a_short_linger_does_not_reclaim_a_session_whose_process_is_reconnecting)
{
	struct chime_event ev;
	chime_id_t id;
	chime_t *c;
	unsigned n;

	start("--session-linger 0");
	c = sopen_ok("brief");
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 7, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, NULL, 0), tb.pid);
	tb.pid = 0;
	/* the library sees it go and backs off to an attempt a second */
	for (unsigned i = 0; i < 250; i++) {
		cr_assert_geq(chime_poll(c, &ev, 1), 0, "gave up with no broker for %u0 ms", i);
		usleep(10000);
	}
	restart(0, "--session-linger 0");
	/* a reset waits for the reconnect, as on a full ring: the session must still be there */
	cr_assert_eq(chime_reset(c, id, now_ns() + 100 * MS), 0, "the session was reclaimed before its process came");
	n = collect(c, &ev, 1, now_ns() + 2000 * MS);
	cr_assert_eq(n, 1, "the session's timer did not fire after the restart");
	cr_assert_eq(ev.id, id);
	cr_assert_eq(ev.user_data, 7);
	chime_close(c);
}

/* ---- (2) due while no broker ran: fired at once, late, never lost ---- */

/*
 * A session taken over from the sessions file closes no descriptor of the
 * broker's. Before, adopt() zeroed the client and then closed its holder
 * pidfd, 0: the broker's standard input. The control segment then opened
 * as descriptor 0, and a broker in the background (which points 0 to
 * /dev/null after) lost it: its stop left PATH.ctl behind (an operator's
 * audit).
 */
Test(restart, taking_over_a_session_closes_no_descriptor_of_the_broker, .timeout = 30)
{
	char fd0[PATH_MAX], link[64];
	chime_id_t id;
	chime_t *c;
	ssize_t n;

	start("--shards 1");
	c = open_armed("fd0", 1, &id);
	chime_close(c);
	restart(SIGTERM, "--shards 1");
	snprintf(link, sizeof(link), "/proc/%d/fd/0", tb.pid);
	n = readlink(link, fd0, sizeof(fd0) - 1);
	cr_assert_gt(n, 0, "%s: %s (the broker's standard input was closed)", link, strerror(errno));
	fd0[n] = 0;
	cr_assert(strstr(fd0, ".ctl") == NULL, "the broker's standard input was closed: fd 0 is now '%s'", fd0);
	cr_assert_eq(chime_drop_session(&(struct chime_opts){ .socket_path = tb.sock, .session = "fd0" }), 0);
}

Test(restart, timers_due_while_no_broker_ran_fire_at_once_late)
{
	struct chime_event ev[64];
	uint64_t t0, dl, t_restart, t_ready;
	chime_t *c;
	chime_id_t id;
	unsigned n;

	start("");
	c = sopen_ok("late");
	t0 = now_ns();
	dl = t0 + 300 * MS;
	for (unsigned i = 0; i < 50; i++)
		cr_assert_eq(chime_arm(c, 0, dl, 0, i, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 50), 50);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, NULL, 0), tb.pid);
	tb.pid = 0;
	chime_close(c);
	while (now_ns() < dl + 20 * MS)         /* they come due with no broker */
		usleep(1000);
	t_restart = now_ns();
	restart(0, "");
	c = sopen_ok("late");
	t_ready = now_ns();
	n = collect(c, ev, 64, now_ns() + 500 * MS);
	cr_assert_eq(n, 50, "%u of 50 timers due while no broker ran", n);
	for (unsigned i = 0; i < n; i++) {
		cr_assert_eq(ev[i].deadline_ns, dl);
		cr_assert_geq(ev[i].fired_ns, t_restart, "fired before the new broker started");
		/* At once: by the time the session is back, give or take a loaded host's 200 ms. */
		cr_assert_leq(ev[i].fired_ns, t_ready + 200 * MS, "fired %.0f ms after the session was back",
			      (double)(ev[i].fired_ns - t_ready) / 1e6);
	}
	chime_close(c);
}

/* ---- (3) exactly once across a planned stop; at least once across a crash ---- */

static void consume_half(chime_t *c, uint64_t until, unsigned *taken, uint8_t *got)
{
	struct chime_event ev[10];
	unsigned n = 0;

	/* 20 events fire; take exactly 10 of them and leave the rest in the ring. */
	while (n < 10 && now_ns() < until) {
		int r = chime_wait(c, ev, 10 - n, 50);

		cr_assert_geq(r, 0);
		for (int i = 0; i < r; i++)
			got[ev[i].user_data] = 1;
		n += (unsigned)r;
	}
	*taken = n;
}

static void claim_word_case(int sig, bool exactly)
{
	uint8_t got[20] = { 0 }, again[20] = { 0 };
	struct chime_event ev[64];
	unsigned taken, n, untaken_back = 0;
	chime_t *c;
	chime_id_t id;

	start("-n 1");
	c = sopen_ok("once");
	for (unsigned i = 0; i < 20; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + 100 * MS, 0, i, &id), 0);
	ring_holds(c, 20);      /* all 20 delivered into the ring */
	consume_half(c, now_ns() + 2000 * MS, &taken, got);
	cr_assert_eq(taken, 10);
	restart(sig, "-n 1");
	chime_close(c);
	c = sopen_ok("once");
	n = collect(c, ev, 64, now_ns() + 500 * MS);
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (unsigned)ev[k].user_data;

		cr_assert_lt(i, 20);
		cr_assert_eq(again[i]++, 0, "event %u delivered twice by the new broker", i);
		if (!got[i])
			untaken_back++;
		else
			cr_assert_not(exactly, "event %u, taken before the stop, came back", i);
	}
	cr_assert_eq(untaken_back, 10, "%u of the 10 events nobody took came back", untaken_back);
	chime_close(c);
}

/*
 * A drain never waits for a handshake: its reconnect attempt sends the hello
 * and comes back, and a later call (chime_fd() readable then) takes the
 * welcome. Before, the drain that made the attempt waited for the answer,
 * up to 10 s from a broker still taking over its shard files or wedged
 * (found by an audit). The new broker is stopped here, so that it answers
 * nothing until SIGCONT; then the session goes on and its timer fires.
 */
Test(restart, a_drain_does_not_wait_for_a_broker_that_has_not_answered)
{
	struct chime_event ev[4];
	uint64_t t0, end, worst = 0;
	unsigned polls = 0;
	chime_id_t id;
	chime_t *c;
	int r;

	start("-n 1");
	c = sopen_ok("nowait");
	cr_assert_eq(chime_arm(c, 0, now_ns() + 2500 * MS, 0, 7, &id), 0);
	restart(SIGKILL, "-n 1");
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	/* The library sees its broker gone within a second (cl_broker_check()), then makes attempts. */
	for (end = now_ns() + 1800 * MS; now_ns() < end; polls++) {
		t0 = now_ns();
		r = chime_poll(c, ev, 4);
		worst = now_ns() - t0 > worst ? now_ns() - t0 : worst;
		cr_assert_eq(r, 0, "chime_poll: %d", r);
		usleep(5000);
	}
	cr_assert(cl_reconnecting(c), "the library did not see its broker gone: nothing was tested");
	cr_assert_eq(kill(tb.pid, SIGCONT), 0);
	cr_assert_lt(worst, 100 * MS, "a chime_poll took %.0f ms while the broker did not answer (%u polls)",
		     (double)worst / 1e6, polls);
	r = chime_wait(c, ev, 4, 5000);
	cr_assert_eq(r, 1, "chime_wait after the broker answered: %d", r);
	cr_assert_eq(ev[0].id, id);
	cr_assert_eq(ev[0].user_data, 7);
	chime_close(c);
}

/*
 * Once the library has found its broker gone (here a chime_flush() that
 * sees the heartbeat a second old), a session's arms and cancels wait for
 * the next broker, as chime_arm(3) says, so that a process that then dies
 * loses none of them. Before, they went into the dead broker's rings and
 * returned 0 at once, and went to the next broker only with a drain or a
 * full ring: the process died first, and its 5 arms were lost and its 5
 * cancelled timers fired (an API audit).
 */
Test(restart, calls_after_the_broker_is_found_gone_wait_for_the_next_one)
{
	struct chime_event ev[16];
	int go[2], done[2], st;
	unsigned later = 0, cancelled = 0, n;
	char b;
	pid_t pid;
	chime_t *c;

	start("-n 1");
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(done), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		chime_id_t ids[5], id;
		uint64_t t0;
		int r = 0;

		c = NULL;
		if (sopen(&c, "found-gone") < 0)
			_exit(10);
		for (unsigned i = 0; i < 5; i++)
			r |= chime_arm(c, 0, now_ns() + 4000 * MS, 0, i, &ids[i]);
		r |= chime_flush(c);
		if (r || write(done[1], "a", 1) != 1 || read(go[0], &b, 1) != 1)
			_exit(11);
		/* the heartbeat a second old: the flush finds the broker gone */
		usleep(1200 * 1000);
		(void)chime_flush(c);
		if (!cl_reconnecting(c))
			_exit(12);      /* not found gone: nothing would be tested */
		t0 = now_ns();
		for (unsigned i = 0; i < 5; i++)
			r |= chime_arm(c, 0, now_ns() + 2000 * MS, 0, 100 + i, &id) | chime_cancel(c, ids[i]);
		if (r)
			_exit(13);
		fprintf(stderr, "arms and cancels after the broker was found gone: %.1f ms\n",
			(double)(now_ns() - t0) / 1e6);
		kill(getpid(), SIGKILL);        /* dies without a close */
	}
	cr_assert_eq(read(done[0], &b, 1), 1, "the child could not arm");
	restart(SIGKILL, "-n 1");
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child ended with status %#x", st);
	c = sopen_ok("found-gone");
	n = collect(c, ev, 16, now_ns() + 5000 * MS);
	for (unsigned i = 0; i < n; i++) {
		later += ev[i].user_data >= 100;
		cancelled += ev[i].user_data < 100;
	}
	cr_assert_eq(cancelled, 0, "%u timers cancelled after the crash fired", cancelled);
	cr_assert_eq(later, 5, "%u of the 5 timers armed after the crash fired", later);
	chime_close(c);
	close(go[0]);
	close(go[1]);
	close(done[0]);
	close(done[1]);
}

/*
 * A session's close at a broker that is there but applies nothing
 * (stopped: a frozen cgroup, a debugger; stuck: the shipped unit's watchdog
 * kills it after 5 s and systemd starts another) waits for it, and for the
 * next one when it is killed, so that the arms reach a broker. Before, the
 * close gave up after 1 s, and the crash 1.5 s in lost all 100 (an API
 * audit).
 */
struct timed_close {
	chime_t *c;
	uint64_t took;
};

/* On a thread of its own: the broker is restarted by the test's (PR_SET_PDEATHSIG names the thread). */
static void *close_timed(void *arg)
{
	struct timed_close *t = arg;
	uint64_t t0 = now_ns();

	chime_close(t->c);
	t->took = now_ns() - t0;
	return NULL;
}

Test(restart, a_close_at_a_stopped_broker_hands_its_records_to_the_next_one)
{
	enum { N = 100 };
	struct chime_event ev[N + 1];
	struct timed_close t;
	pthread_t th;
	chime_id_t id;
	chime_t *c;
	unsigned n;
	int st;

	start("-n 1");
	c = sopen_ok("stopped-close");
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	/* stopped for good before the arms: a shard still running for a moment applied them (a CI run) */
	cr_assert_eq(waitpid(tb.pid, &st, WUNTRACED), tb.pid);
	cr_assert(WIFSTOPPED(st), "chimed ended (status %#x) instead of stopping", st);
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + 4000 * MS, 0, i, &id), 0);
	t = (struct timed_close){ .c = c };
	cr_assert_eq(pthread_create(&th, NULL, close_timed, &t), 0);
	usleep(1500 * 1000);
	restart(SIGKILL, "-n 1");
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_gt(t.took, 1400 * MS, "the close returned after %.0f ms, before the broker was killed",
		     (double)t.took / 1e6);
	cr_assert_lt(t.took, 10000 * MS, "the close took %.0f ms", (double)t.took / 1e6);
	c = sopen_ok("stopped-close");
	n = collect(c, ev, N + 1, now_ns() + 6000 * MS);
	cr_assert_eq(n, N, "%u of the %u timers armed before the close fired", n, N);
	chime_close(c);
}

Test(restart, planned_stop_keeps_events_exactly_once_by_the_claim_word)
{
	claim_word_case(SIGTERM, true);
}

Test(restart, crash_redelivers_what_it_cannot_prove_taken_and_loses_nothing)
{
	claim_word_case(SIGKILL, false);
}

/* ---- (4) a restart loop leaks nothing ---- */

static unsigned count_entries(const char *dir)
{
	int n = t_count_files(dir);

	cr_assert_geq(n, 0, "opendir(%s)", dir);
	return (unsigned)n;
}

/*
 * The broker's descriptors once closed connections (a readiness probe, a
 * client just closed) are gone: at most 'want' if it gets there within 2 s,
 * else the lowest count seen. A leak stays above it. Pidfds apart, at
 * most one by then: the holder of the session, which the broker watches
 * while it holds grants carried for it (holder_watch() in control.c), its
 * connected clients' gone.
 */
static unsigned broker_fds(unsigned want)
{
	unsigned n, low = UINT_MAX, pidfds, low_pidfds = UINT_MAX;

	for (int i = 0; i < 200; i++) {
		int r = t_fds(tb.pid, &pidfds);

		cr_assert_geq(r, 0, "/proc/%d/fd", (int)tb.pid);
		n = (unsigned)r;
		low = n < low ? n : low;
		low_pidfds = pidfds < low_pidfds ? pidfds : low_pidfds;
		if (low <= want && low_pidfds <= 1)
			break;
		usleep(10 * 1000);
	}
	cr_assert_leq(low_pidfds, 1, "the broker holds %u pidfds, and no client", low_pidfds);
	return low;
}

Test(restart, twenty_restarts_leak_no_node_file_or_fd)
{
	unsigned files = 0, fds = 0;
	chime_t *c, *anon;
	chime_id_t id;

	start("-n 2");
	c = open_armed("loop", 200, &id);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 200), 200);
	chime_close(c);
	for (int round = 0; round < 20; round++) {
		anon = sopen_ok(NULL);
		for (unsigned i = 0; i < 100; i++)
			cr_assert_eq(chime_arm(anon, 0, now_ns() + HOUR, 0, i, &id), 0);
		c = sopen_ok("loop");   /* attached during the restart half of the time */
		if (round % 2)
			chime_close(c);
		cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 300), 300, "round %d", round);
		restart(round % 3 ? SIGKILL : SIGTERM, "-n 2");
		if (!(round % 2))
			chime_close(c);
		chime_close(anon);
		/*
		 * The session's 200 timers and no anonymous one; grants only
		 * those carried for the session's process (one ring's worth per
		 * shard at most: kept until its next attach, never piling up).
		 */
		cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, 200), 200, "round %d", round);
		cr_assert_leq(t_nodes(tb.sock, 1u << CHIME_NODE_GRANTED), 2 * 1024, "round %d", round);
		if (!files) {
			files = count_entries(tb.dir);
			fds = broker_fds(0);   /* the settled count: 2 s of samples */
		}
		cr_assert_eq(count_entries(tb.dir), files, "round %d: files next to the socket", round);
		cr_assert_leq(broker_fds(fds), fds, "round %d: the broker's descriptors", round);
	}
	/* A new process cannot name the carried grants: its attach frees them, its exit its own. */
	c = sopen_ok("loop");
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 200), 200, "grants left behind");
}

/* ---- (5) scribbled files: repaired node by node, or refused; never a crash ---- */

static void scribble(const char *path, off_t off, size_t len, uint64_t *rng)
{
	int fd = open(path, O_RDWR);
	uint8_t buf[4096];

	cr_assert_geq(fd, 0, "open(%s)", path);
	cr_assert_leq(len, sizeof(buf));
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)splitmix64(rng);
	cr_assert_eq(pwrite(fd, buf, len, off), (ssize_t)len);
	close(fd);
}

/* Where node 0 is in a shard file (read before scribbling on it). */
static uint64_t slab_off(const char *path)
{
	struct chime_shard_seg h;
	struct chime_wheel w;
	int fd = open(path, O_RDONLY);

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_eq(pread(fd, &w, sizeof(w), (off_t)h.wheel_off), (ssize_t)sizeof(w));
	close(fd);
	return h.wheel_off + w.slab_off;
}

Test(restart, scribbled_files_are_repaired_or_refused_never_a_crash)
{
	uint64_t rng = 0x5eed;
	char shard0[300], sessions[300];
	unsigned started = 0, refused = 0;

	start("-n 1");
	snprintf(shard0, sizeof(shard0), "%s.shard0", tb.sock);
	snprintf(sessions, sizeof(sessions), "%s.sessions", tb.sock);
	for (int round = 0; round < 12; round++) {
		struct chime_event ev[8];
		struct stat st;
		chime_t *c, *anon;
		chime_id_t id;
		int r;

		c = sopen_ok("victim");
		for (unsigned i = 0; i < 300; i++)
			cr_assert_eq(chime_arm(c, i % 3, now_ns() + (i % 2 ? HOUR : 200 * MS), i % 5 ? 0 : 50 * MS,
					       i, &id), 0);
		cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 300), 300);
		chime_close(c);
		kill(tb.pid, SIGKILL);
		cr_assert_eq(stat(shard0, &st), 0);
		switch (round % 4) {
		case 0: /* nodes in use, and the key index */
			for (int k = 0; k < 60; k++)
				scribble(shard0, (off_t)(slab_off(shard0) + (splitmix64(&rng) % 4000) * 64),
					 1 + splitmix64(&rng) % 64, &rng);
			for (int k = 0; k < 20; k++)
				scribble(shard0, (off_t)(128 + splitmix64(&rng) % (1u << 20)), 8, &rng);
			break;
		case 1: /* the shard header or the wheel header */
			scribble(shard0, (off_t)(splitmix64(&rng) % 128), 8, &rng);
			break;
		case 2: /* the sessions file: header or records */
			scribble(sessions, (off_t)(splitmix64(&rng) % 512), 1 + splitmix64(&rng) % 64, &rng);
			break;
		case 3: /* everything at once, sparsely */
			for (int k = 0; k < 200; k++)
				scribble(shard0, (off_t)(splitmix64(&rng) % (uint64_t)st.st_size), 1, &rng);
			scribble(sessions, (off_t)(splitmix64(&rng) % 4096), 1, &rng);
			break;
		}
		r = t_chimed_restart(&tb, 0, "-n 1");
		if (r < 0) {
			refused++;
			restart(0, "-n 1 --fresh");
		} else {
			started++;
		}
		/* Whatever it kept, the broker serves: a new timer fires, and nothing fires early. */
		anon = sopen_ok(NULL);
		cr_assert_eq(chime_arm(anon, 0, now_ns() + 20 * MS, 0, 7, &id), 0);
		cr_assert_eq(collect(anon, ev, 8, now_ns() + 300 * MS), 1);
		chime_close(anon);
		r = sopen(&c, "victim");
		cr_assert_eq(r, 0, "round %d: the session cannot be opened: %s", round, strerror(-r));
		(void)collect(c, ev, 8, now_ns() + 100 * MS);
		chime_close(c);
		cr_assert(t_alive(tb.pid), "round %d: the broker died", round);
		restart(SIGTERM, "-n 1 --fresh");
	}
	cr_log_info("scribbled: %u starts, %u refusals", started, refused);
	cr_assert_gt(started, 0);
}

/* ---- (6) options and --fresh ---- */

/* A broker of two shards, a detached session `name` with n timers an hour ahead; a log path in its directory. */
static void detached_session_on_two_shards(const char *name, unsigned n, char *log, size_t len)
{
	chime_id_t id;

	start("-n 2");
	snprintf(log, len, "%s/start.log", tb.dir);
	chime_close(open_armed(name, n, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, n), n);
}

Test(restart, another_geometry_is_refused_and_the_files_kept_until_fresh)
{
	char log[300], extra[400];
	chime_t *c;

	detached_session_on_two_shards("geo", 40, log, sizeof(log));
	snprintf(extra, sizeof(extra), "-n 1 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, SIGTERM, extra), 0, "a broker with another shard count took over");
	cr_assert(t_file_has(log, "--fresh"), "the refusal does not say what to do");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 40, "a refused start touched the timers");
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 40);
	snprintf(extra, sizeof(extra), "-n 1 --fresh 2>'%s'", log);
	restart(SIGKILL, extra);
	cr_assert(t_file_has(log, "discarded 40 timers"), "--fresh did not say how many timers it discarded");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0);
	c = sopen_ok("geo");
	cr_assert_eq(collect(c, (struct chime_event[4]){ 0 }, 4, now_ns() + 100 * MS), 0);
	chime_close(c);
}

/*
 * A sessions file of another version of chimed (an upgrade or a downgrade
 * across a change of the file's format, or of the layout of the shard
 * files it goes with): refused and left alone, and said as such, with both
 * ways out: the chimed that wrote it, which takes the sessions over, or
 * --fresh, which discards them. Before, the log said "Protocol error" and
 * that --fresh discards the file: every session's timers, where the
 * version that wrote the file would have kept them.
 */
#define SESS_HDR_VERSION 8      /* sessfile.c's header: magic, then version (uint32) */
#define SESS_HDR_LAYOUT  28     /* geometry at 16: shards, max clients, capacity, then layout */
#define SESS_HDR_CHECK   120    /* FNV-1a of the bytes before it */

/* The broker killed (its files as a crash leaves them): its sessions file, open for writing. */
static int killed_sessions_file(void)
{
	char path[PATH_MAX];
	int fd;

	cr_assert_eq(kill(tb.pid, SIGKILL), 0);
	cr_assert_eq(waitpid(tb.pid, NULL, 0), tb.pid);
	tb.pid = 0;
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	fd = open(path, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	return fd;
}

/* Header h (128 B) written to the sessions file fd with its checksum made right: only what was edited differs. */
static void sessions_header_write(int fd, uint8_t *h)
{
	uint64_t check = UINT64_C(0xcbf29ce484222325);

	for (unsigned i = 0; i < SESS_HDR_CHECK; i++)
		check = (check ^ h[i]) * UINT64_C(0x100000001b3);
	memcpy(h + SESS_HDR_CHECK, &check, sizeof(check));
	cr_assert_eq(pwrite(fd, h, 128, 0), 128);
}

static void sessions_file_of_another_version(unsigned at)
{
	char log[300], extra[400];
	uint8_t h[128], was[128];
	int fd;

	detached_session_on_two_shards("ver", 10, log, sizeof(log));
	fd = killed_sessions_file();
	cr_assert_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
	memcpy(was, h, sizeof(h));
	h[at]++;
	sessions_header_write(fd, h);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker took over a sessions file of another version");
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "another version of chimed") &&
		  t_file_has(log, "the chimed that wrote it") && t_file_has(log, "--fresh"),
		  "the refusal does not say the file is another version's, and both ways out");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "a refused start touched the timers");
	/* The version that wrote it (here: its header as it was) takes the session over. */
	cr_assert_eq(pwrite(fd, was, sizeof(was), 0), (ssize_t)sizeof(was));
	close(fd);
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10);
	chime_close(sopen_ok("ver"));
}

Test(restart, a_sessions_file_of_another_format_is_refused_and_said_so)
{
	sessions_file_of_another_version(SESS_HDR_VERSION);
}

Test(restart, a_sessions_file_of_another_layout_is_refused_and_said_so)
{
	sessions_file_of_another_version(SESS_HDR_LAYOUT);
}

/*
 * A broker killed holding no session (anonymous clients only: a crash, a
 * watchdog's kill) leaves a sessions file that names none. The next one,
 * started with other options (--shards) or by an upgrade that changed the
 * layout, refused it as it refuses one with sessions: it did not start (a
 * unit that failed), and said "--fresh to discard its sessions", of which
 * there were none; without the file it starts. Now a file of another
 * geometry or layout whose every record is empty is discarded with its
 * shard files (their timers were anonymous clients', which no broker takes
 * over), said, and the broker starts. One record not empty (a session, or
 * one damaged) is refused as before, the file left alone.
 */
static void killed_without_sessions(const char *how, unsigned at, char *log, size_t len)
{
	chime_t *c;
	chime_id_t id;
	int fd;

	start("-n 2");
	snprintf(log, len, "%s/start.log", tb.dir);
	c = t_open(tb.sock);
	cr_assert_not_null(c);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 0, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 3), 3);
	fd = killed_sessions_file();
	chime_close(c);
	if (at) {
		uint8_t h[128];

		cr_assert_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
		h[at]++;
		sessions_header_write(fd, h);
	}
	close(fd);
	cr_log_info("%s", how);
}

Test(restart, a_sessions_file_naming_no_session_does_not_keep_a_broker_of_other_options_from_starting)
{
	char log[300], extra[400], path[PATH_MAX];
	uint8_t one = 1;
	int fd;

	killed_without_sessions("other options", 0, log, sizeof(log));
	snprintf(extra, sizeof(extra), "-n 1 2>'%s'", log);
	cr_assert_eq(t_chimed_restart(&tb, 0, extra), 0, "a broker of other options refused a sessions file of no "
		     "session");
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "names no session") && t_file_has(log, "3 timers"),
		  "the discarded files are not said");
	cr_assert_not(t_file_has(log, "--fresh"), "the log still asks for --fresh");
	cr_assert_eq(t_nodes(tb.sock, T_NODES_USED), 0, "anonymous clients' timers kept");
	chime_close(sopen_ok("after"));

	/* A record not empty (a session's, here: a byte of one) is not nothing: refused as before. */
	fd = killed_sessions_file();
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	cr_assert_eq(pwrite(fd, &one, 1, 128 + 5 * 128 + 64), 1);
	close(fd);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a sessions file with a record in it was discarded");
	cr_assert(t_file_has(log, "--fresh"), "the refusal does not say the way out");
	cr_assert_eq(access(path, F_OK), 0, "the refused file was not left alone");
}

Test(restart, a_sessions_file_naming_no_session_does_not_keep_a_broker_of_another_layout_from_starting)
{
	char log[300], extra[400];

	killed_without_sessions("another layout", SESS_HDR_LAYOUT, log, sizeof(log));
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_eq(t_chimed_restart(&tb, 0, extra), 0, "a broker of another layout refused a sessions file of no "
		     "session");
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "names no session"), "the discarded file is not said");
	cr_assert_eq(t_nodes(tb.sock, T_NODES_USED), 0, "anonymous clients' timers kept");
	chime_close(sopen_ok("after"));
}

/* A bit of the sessions file's byte at off flipped. */
static void flip_bit(int fd, off_t off)
{
	uint8_t b;

	cr_assert_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x10;
	cr_assert_eq(pwrite(fd, &b, 1, off), 1);
}

/*
 * The sessions file's header damaged (a bit flipped in it, its checksum
 * wrong), and its copy at the end of the file too: nothing says which
 * broker wrote the records, so it is refused, left alone, and said as
 * such, as a damaged shard header is ("damaged header"). It said "Bad
 * message".
 */
Test(restart, a_sessions_file_with_a_damaged_header_is_refused_and_said_so)
{
	char log[300], extra[400];
	struct stat st;
	int fd;

	detached_session_on_two_shards("flip", 10, log, sizeof(log));
	fd = killed_sessions_file();
	cr_assert_eq(fstat(fd, &st), 0);
	flip_bit(fd, 100);      /* a spare byte of the header: only its checksum says */
	flip_bit(fd, st.st_size - 128 + 100);   /* the same in its copy */
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker took over a sessions file with a damaged header");
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "damaged header") && t_file_has(log, "--fresh"),
		  "the refusal does not say the header is damaged, and the way out");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "a refused start touched the timers");
	flip_bit(fd, 100);
	close(fd);
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10);
}

/* Set (on) or clear the immutable flag of fd (a sessions or shard file); false where its filesystem has none. */
static bool sessions_immutable(int fd, bool on)
{
	int flags;

	if (ioctl(fd, FS_IOC_GETFLAGS, &flags) < 0)
		return false;
	flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
	return ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
}

/*
 * A sessions file the next broker cannot write (immutable: root's open for
 * writing gets EPERM; a broker rewrites the file at each start): it does
 * not start, says which file and why, and that the sessions' timers stay
 * in the files; and they do, for the broker started once it can write.
 * Before, it said only "cannot write sessions file", after lines saying
 * it was taking the sessions over and had kept their timers.
 */
Test(restart, a_sessions_file_it_cannot_write_is_refused_said_and_its_timers_kept)
{
	char log[300], extra[400];
	int fd;

	detached_session_on_two_shards("ro", 10, log, sizeof(log));
	fd = killed_sessions_file();
	if (!sessions_immutable(fd, true))
		cr_skip_test("no immutable flag on this filesystem: %s", strerror(errno));
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker started on a sessions file it cannot write");
	cr_assert(sessions_immutable(fd, false));
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "Operation not permitted"),
		  "the refusal does not name the file and why");
	cr_assert(t_file_has(log, "stay in the files"), "the refusal does not say that the timers are kept");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "a refused start touched the timers");
	close(fd);
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "the next broker did not take the timers over");
	chime_close(sopen_ok("ro"));
}

/*
 * A shard file the next broker may not open for writing (immutable: root's
 * open gets EPERM) is the broker's own, with one name: it was said to be
 * "another name for someone's file ... has 1 links", which sends an
 * operator looking for a hard link that is not there.
 */
Test(restart, a_shard_file_it_cannot_write_is_said_as_such_not_as_a_second_name)
{
	char log[300], extra[400], path[PATH_MAX];
	int fd;

	detached_session_on_two_shards("ro-shard", 10, log, sizeof(log));
	close(killed_sessions_file());
	snprintf(path, sizeof(path), "%s.shard1", tb.sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	if (!sessions_immutable(fd, true))
		cr_skip_test("no immutable flag on this filesystem: %s", strerror(errno));
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker started on a shard file it cannot write");
	cr_assert(sessions_immutable(fd, false));
	close(fd);
	cr_assert(t_file_has(log, path) && t_file_has(log, "immutable"), "the refusal does not name the file and why");
	cr_assert_not(t_file_has(log, "links"), "the refusal speaks of a hard link that is not there");
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "the next broker did not take the timers over");
}

/*
 * One bit flipped in the header (a bad sector, a stray write): every
 * session's timers were refused with it, the broker not started until
 * the operator chose --fresh. The header's copy at the end of the file
 * is whole: the sessions are taken over, the damage said, and the header
 * written again (a second start needs no copy).
 */
Test(restart, a_sessions_file_header_damaged_in_one_copy_is_taken_over_from_the_other)
{
	static const off_t where[] = { 20, 100 };       /* its geometry (max clients), a spare byte */
	char log[300], extra[400];
	int fd;

	detached_session_on_two_shards("flip1", 10, log, sizeof(log));
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++) {
		fd = killed_sessions_file();
		flip_bit(fd, where[i]);
		close(fd);
		cr_assert_eq(t_chimed_restart(&tb, 0, extra), 0,
			     "a broker refused a sessions file whose header had one bit flipped (at byte %lld), its "
			     "copy whole", (long long)where[i]);
		cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "header is damaged") &&
			  t_file_has(log, "copy"), "the damaged header is not said");
		cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "the session's timers were not taken over");
	}
	/* Written again: taken over without the copy's help. */
	restart(SIGKILL, extra);
	cr_assert_not(t_file_has(log, "header is damaged"), "the header was not written again");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10);
	chime_close(sopen_ok("flip1"));
}

/*
 * One bit flipped in a session record (past its header): that session is
 * dropped and its timers freed, as chimed(8) says; but the
 * start rewrote the file in place without the record, and the operator had
 * nothing left of it (its name, its user) to say what was lost. A copy of
 * the file as found is kept at PATH.sessions.damaged, and said.
 */
Test(restart, a_damaged_session_record_is_said_and_the_file_as_found_kept)
{
	char log[300], extra[400], copy[PATH_MAX];
	uint8_t before[256], after[256];
	int fd, cfd;

	detached_session_on_two_shards("rec", 10, log, sizeof(log));
	fd = killed_sessions_file();
	flip_bit(fd, 128 + 40);         /* slot 0's record, inside its name */
	cr_assert_eq(pread(fd, before, sizeof(before), 0), (ssize_t)sizeof(before));
	close(fd);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	restart(0, extra);
	cr_assert(t_file_has(log, "1 damaged session record dropped"), "the dropped record is not said");
	snprintf(copy, sizeof(copy), "%s.sessions.damaged", tb.sock);
	cr_assert(t_file_has(log, copy), "the copy of the damaged file is not named");
	cfd = open(copy, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(cfd, 0, "%s: %s", copy, strerror(errno));
	cr_assert_eq(pread(cfd, after, sizeof(after), 0), (ssize_t)sizeof(after));
	close(cfd);
	cr_assert_eq(memcmp(before, after, sizeof(before)), 0, "the copy is not the file as it was found");
	unlink(copy);
}

/* chimestat's figure `field` (broker.NAME), or UINT_MAX if it has none. */
static unsigned chimestat_figure(const char *field)
{
	const char *stat = getenv("CHIMESTAT");
	char cmd[800], name[96];
	unsigned n = UINT_MAX;
	FILE *f;

	cr_assert_not_null(stat);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' -1 -f %s 2>/dev/null", stat, tb.sock, field);
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	if (fscanf(f, " %95s %u", name, &n) != 2 || strcmp(name, field) != 0)
		n = UINT_MAX;
	pclose(f);
	return n;
}

/*
 * A damaged session record drops its session and frees its timers: the
 * log said so, but chimestat and chimectl showed a broker that had lost
 * nothing (restored counts what was kept, restore_dropped damaged nodes,
 * not these), where a missing shard file is counted (shards_lost). The
 * start counts the records it dropped (chimestat broker.sessions_damaged),
 * and a start that drops none counts 0.
 */
Test(restart, a_damaged_session_record_is_counted_for_chimestat)
{
	char log[300], extra[400], copy[PATH_MAX];
	unsigned n;
	int fd;

	detached_session_on_two_shards("counted", 10, log, sizeof(log));
	cr_assert_eq(n = chimestat_figure("broker.sessions_damaged"), 0, "a start from nothing counts %u", n);
	fd = killed_sessions_file();
	flip_bit(fd, 128 + 40);         /* slot 0's record, inside its name */
	close(fd);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	restart(0, extra);
	cr_assert(t_file_has(log, "1 damaged session record dropped"), "the dropped record is not said");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0, "the dropped session's timers were kept");
	cr_assert_eq(n = chimestat_figure("broker.sessions_damaged"), 1,
		     "chimestat does not count the dropped session (%u; UINT_MAX: no such figure)", n);
	snprintf(copy, sizeof(copy), "%s.sessions.damaged", tb.sock);
	unlink(copy);
	restart(SIGKILL, "-n 2");
	cr_assert_eq(n = chimestat_figure("broker.sessions_damaged"), 0, "a clean start counts %u", n);
}

/*
 * Files of another boot (state kept on a disk filesystem across a reboot):
 * CLOCK_MONOTONIC started again from 0, so every deadline in them is
 * another clock's. The sessions file's boot id says so, and the next
 * broker discards the files, says how many timers, and starts empty (the
 * sessions' timers are not carried across a reboot, wall-clock ones
 * included: chimed(8), RESTARTS).
 */
#define SESS_HDR_BOOT_ID 40     /* after the geometry: the boot id, 40 bytes */

Test(restart, files_of_another_boot_are_discarded_and_said_so)
{
	char log[300], extra[400];
	uint8_t h[128];
	struct chime_event ev[4];
	chime_t *c;
	int fd;

	detached_session_on_two_shards("rebooted", 10, log, sizeof(log));
	fd = killed_sessions_file();
	cr_assert_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
	h[SESS_HDR_BOOT_ID] = h[SESS_HDR_BOOT_ID] == 'f' ? 'e' : 'f';        /* another boot's id */
	sessions_header_write(fd, h);
	close(fd);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	restart(0, extra);
	cr_assert(t_file_has(log, "before the last reboot") && t_file_has(log, "discarding 10 timers"),
		  "the discarded files and their timers are not said");
	cr_assert_eq(t_nodes(tb.sock, T_NODES_USED), 0, "nodes of another boot's files kept");
	c = sopen_ok("rebooted");
	cr_assert_eq(collect(c, ev, 4, now_ns() + 100 * MS), 0, "an event of another boot's timers");
	chime_close(c);
}

/*
 * The same across a reboot that also brought another chimed (an upgrade
 * that changed the layout, installed before the reboot) or other options:
 * the files' deadlines are another boot's clock, and no broker of any
 * version or options would take their timers over. They were refused as
 * another layout's or geometry's (those checks came first): chimed did
 * not start after the reboot, and said to start the version or the
 * options that wrote them, which would only have discarded them.
 */
Test(restart, files_of_another_boot_are_discarded_whatever_their_layout_or_options)
{
	char log[300], extra[400];
	uint8_t h[128];
	int fd;

	for (int round = 0; round < 2; round++) {
		detached_session_on_two_shards("rebooted", 10, log, sizeof(log));
		fd = killed_sessions_file();
		cr_assert_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
		h[SESS_HDR_BOOT_ID] = h[SESS_HDR_BOOT_ID] == 'f' ? 'e' : 'f';        /* another boot's id */
		if (round == 0)
			h[SESS_HDR_LAYOUT]++;   /* and another version's layout */
		sessions_header_write(fd, h);
		close(fd);
		snprintf(extra, sizeof(extra), "-n %d 2>'%s'", round == 0 ? 2 : 1, log);
		cr_assert_eq(t_chimed_restart(&tb, 0, extra), 0, "a broker did not start on files of another boot and %s",
			     round == 0 ? "another layout" : "other options");
		cr_assert(t_file_has(log, "before the last reboot"), "the discarded files are not said");
		cr_assert_eq(t_nodes(tb.sock, T_NODES_USED), 0, "nodes of another boot's files kept");
		chime_close(sopen_ok("rebooted"));
		cr_assert_neq(t_chimed_stop(&tb, SIGTERM), -1);
	}
}

/*
 * A broker restarted in the same boot into another time namespace (the
 * old one ran in a container whose CLOCK_MONOTONIC was offset, the new
 * one without): the deadlines in the files are the old namespace's clock.
 * Taken over as they were, a timer an hour ahead by its process's clock
 * came up 100 s later or sooner, a timer due in a second fired 100 s late.
 * The new broker refuses the files, says why and the ways out, and leaves
 * them alone; one in the old broker's namespace (same offset) takes them over.
 */
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#define TIMENS_OFF_S 100

/* chimed run under `unshare --time --monotonic=TIMENS_OFF_S`: a script at path for $CHIMED. */
static void timens_chimed(char *path, size_t len)
{
	const char *real = getenv("CHIMED");
	FILE *f;
	int fd;

	cr_assert_not_null(real);
	if (geteuid() != 0 || system("unshare --time true 2>/dev/null") != 0)
		cr_skip("needs root and time namespaces (unshare --time, Linux 5.6)");
	snprintf(path, len, "/tmp/chimed-timens-XXXXXX");
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	f = fdopen(fd, "w");
	cr_assert_not_null(f);
	fprintf(f, "#!/bin/sh\nexec unshare --time --monotonic=%d '%s' \"$@\"\n", TIMENS_OFF_S, real);
	fclose(f);
	cr_assert_eq(chmod(path, 0755), 0);
}

/*
 * A process in a time namespace off the host's by TIMENS_OFF_S (the old
 * broker's) opens session `name` and arms n timers an hour ahead by its
 * clock. 0, or 1 (what failed on stderr).
 */
static int timens_session(const char *name, unsigned n)
{
	pid_t p = fork(), q;
	int st;

	cr_assert_geq(p, 0);
	if (p == 0) {
		char line[64];
		int fd, k;

		/* the offsets can be set only before a process enters the namespace: the child below */
		if (unshare(CLONE_NEWTIME) < 0)
			_exit(1);
		k = snprintf(line, sizeof(line), "monotonic %d 0\n", TIMENS_OFF_S);
		fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, line, (size_t)k) != k)
			_exit(1);
		close(fd);
		q = fork();
		if (q == 0) {
			struct chime_opts o = { .socket_path = tb.sock, .session = name };
			chime_t *c = NULL;
			chime_id_t id;
			int r = chime_open(&c, &o);

			if (r < 0) {
				fprintf(stderr, "chime_open in the broker's time namespace: %s\n", strerror(-r));
				_exit(1);
			}
			for (unsigned i = 0; i < n; i++)
				if (chime_arm(c, 0, chime_now() + HOUR, 0, i, &id) < 0)
					_exit(1);
			chime_close(c);
			_exit(0);
		}
		if (q < 0 || waitpid(q, &st, 0) != q)
			_exit(1);
		_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
	}
	cr_assert_eq(waitpid(p, &st, 0), p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

Test(restart, files_of_another_time_namespace_are_refused_and_said_so)
{
	char wrapper[64], log[300], extra[400];
	const char *real = getenv("CHIMED");
	char keep[PATH_MAX];

	cr_assert_not_null(real);
	snprintf(keep, sizeof(keep), "%s", real);
	timens_chimed(wrapper, sizeof(wrapper));
	setenv("CHIMED", wrapper, 1);
	start("-n 2");
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	cr_assert_eq(timens_session("timens", 10), 0, "a session in the broker's time namespace");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	/* Killed; the next one on the host's clock. */
	setenv("CHIMED", keep, 1);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	if (t_chimed_restart(&tb, SIGKILL, extra) == 0) {
		unlink(wrapper);
		cr_assert_fail("a broker on the host's clock took over the files of one in a time namespace "
			       "%d s off it (its timers' deadlines are that clock's)", TIMENS_OFF_S);
	}
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "time namespace") &&
		  t_file_has(log, "--monotonic=100") && t_file_has(log, "--fresh"),
		  "the refusal does not say the files are of another time namespace, and the ways out");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "a refused start touched the timers");
	/* The way out: a broker in a namespace of the old one's offset takes them over. */
	setenv("CHIMED", wrapper, 1);
	restart(0, "-n 2");
	setenv("CHIMED", keep, 1);
	unlink(wrapper);
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10);
}

/*
 * The same judged from the file alone (no time namespace needed): its
 * header says the writer's offset, flagged; a file of a broker before the
 * offset was recorded (unflagged) is not judged, whatever those bytes hold.
 */
#define SESS_HDR_MONO_OFF 80    /* after the boot id: the writer's monotonic offset (int64), then flags */
#define SESS_HDR_FLAGS    88

/* This process's CLOCK_MONOTONIC offset, ns (the broker it starts has it too): 0 outside a time namespace. */
static int64_t own_mono_off(void)
{
	long long s = 0;
	long ns = 0;
	char name[16] = "";
	FILE *f = fopen("/proc/self/timens_offsets", "r");

	while (f && fscanf(f, "%15s %lld %ld", name, &s, &ns) == 3)
		if (!strcmp(name, "monotonic"))
			break;
	if (f)
		fclose(f);
	return f && !strcmp(name, "monotonic") ? (int64_t)s * 1000000000 + ns : 0;
}

Test(restart, a_sessions_file_of_another_monotonic_offset_is_refused_one_of_an_older_broker_is_not)
{
	char log[300], extra[400];
	int64_t off = 100 * INT64_C(1000000000) + own_mono_off();
	uint32_t flags = 1;
	uint8_t h[128];
	int fd;

	detached_session_on_two_shards("clocked", 10, log, sizeof(log));
	fd = killed_sessions_file();
	cr_assert_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
	memcpy(h + SESS_HDR_MONO_OFF, &off, sizeof(off));
	memcpy(h + SESS_HDR_FLAGS, &flags, sizeof(flags));
	sessions_header_write(fd, h);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a sessions file of another monotonic offset taken over");
	cr_assert(t_file_has(log, "another time namespace") && t_file_has(log, "--fresh"),
		  "the refusal does not say the file is of another time namespace");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "a refused start touched the timers");
	flags = 0;
	memcpy(h + SESS_HDR_FLAGS, &flags, sizeof(flags));
	sessions_header_write(fd, h);
	close(fd);
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "a file with no offset recorded was not taken over");
	chime_close(sopen_ok("clocked"));
}

/* --fresh with the same options says which sessions it discarded, not only how many timers. */
Test(restart, fresh_names_the_sessions_it_discards)
{
	char log[300], extra[400];

	detached_session_on_two_shards("fresh-named", 25, log, sizeof(log));
	snprintf(extra, sizeof(extra), "-n 2 --fresh 2>'%s'", log);
	restart(SIGTERM, extra);
	cr_assert(t_file_has(log, "discarded 25 timers and 1 session ('fresh-named')"),
		  "--fresh did not name the session it discarded");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0);
}

/*
 * The sessions file removed under a stopped broker's shard files: nothing
 * says whose their timers are, so the next broker discards them, and says
 * how many (it did so silently).
 */
Test(restart, a_missing_sessions_file_discards_the_shard_files_timers_and_says_how_many)
{
	char log[300], extra[400], path[PATH_MAX];

	detached_session_on_two_shards("gone", 30, log, sizeof(log));
	/* A crash keeps the files; then the sessions file goes. */
	cr_assert_eq(kill(tb.pid, SIGKILL), 0);
	cr_assert_eq(waitpid(tb.pid, NULL, 0), tb.pid);
	tb.pid = 0;
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	cr_assert_eq(unlink(path), 0);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	restart(0, extra);
	cr_assert(t_file_has(log, "no sessions file") && t_file_has(log, "the 30 timers"),
		  "the discarded timers were not counted");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0);
}

/*
 * The sessions file removed while the broker ran (a cleanup of the
 * directory), then a crash: the shard files' timers were a session's, and
 * the next broker said they "belong to no session", as if none had been
 * named. A killed broker always leaves the file (written at its start):
 * the log says that it is missing and how many timers go with it.
 */
Test(restart, a_sessions_file_removed_before_a_crash_is_said_missing)
{
	char log[300], extra[400], path[PATH_MAX];

	detached_session_on_two_shards("gone-live", 30, log, sizeof(log));
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	cr_assert_eq(unlink(path), 0);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	restart(SIGKILL, extra);
	cr_assert(t_file_has(log, "no sessions file") && t_file_has(log, "it was removed") &&
		  t_file_has(log, "the 30 timers left in the shard files are discarded"),
		  "the log does not say that the sessions file was removed and 30 timers are discarded");
	cr_assert(!t_file_has(log, "belong to no session"), "the log says the timers were no session's");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0);
}

/*
 * A tmpfs mounted with `opts` ("16m,nr_inodes=64": t_mount_tmpfs() puts
 * "size=" before them) in a mount namespace of this test's own (criterion
 * runs each test in a process of its own), named in fs; the broker's log
 * beside it, in log. Skips where a tmpfs cannot be mounted.
 */
static void private_tmpfs(char *fs, size_t fs_len, char *log, size_t log_len, const char *opts)
{
	if (geteuid() != 0)
		cr_skip("mounting a tmpfs needs root");
	cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare: %s", strerror(errno));
	cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0, "mount --make-rprivate /: %s",
		     strerror(errno));
	cr_assert_eq(t_mount_tmpfs(fs, fs_len, opts), 0, "mount tmpfs: %s", strerror(errno));
	snprintf(log, log_len, "%s.log", fs);
}

/* A broker on a private_tmpfs(opts) with chimed's `args`, its log in p->log, its sessions' socket. */
struct private_broker {
	char fs[64], log[80], sock[96], extra[200];
};

static void private_broker_start(struct private_broker *p, const char *opts, const char *args)
{
	private_tmpfs(p->fs, sizeof(p->fs), p->log, sizeof(p->log), opts);
	snprintf(p->sock, sizeof(p->sock), "%s/chime.sock", p->fs);
	snprintf(p->extra, sizeof(p->extra), "%s 2>'%s'", args, p->log);
	cr_assert_eq(t_chimed_start(&tb, p->sock, p->extra), 0);
	t_session_sock = tb.sock;
}

/*
 * The socket's directory on a filesystem mounted read-only under the files
 * of a stopped broker's sessions: the lock file cannot be created, and the
 * broker does not start. Its message said only "is the directory
 * writable?", not what its other refusals say: that the sessions and their
 * timers stay in the files, and for what. They do (nothing was written),
 * and a start once it is read-write takes them over.
 */
Test(restart, a_read_only_filesystem_keeps_the_sessions_and_says_so, .timeout = 60)
{
	struct private_broker pb;
	char path[PATH_MAX];
	struct stat before, after;
	chime_id_t id;

	private_broker_start(&pb, "64m", "-n 1 --capacity 65536");
	chime_close(open_armed("readonly", 20, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20), 20);
	snprintf(path, sizeof(path), "%s.sessions", pb.sock);
	cr_assert_eq(t_chimed_stop(&tb, SIGTERM), 0);
	cr_assert_eq(stat(path, &before), 0, "the stop kept no sessions file");
	/*
	 * EBUSY while a file on it is still open for writing: the stopped
	 * broker's io_uring is torn down by a kernel worker after its exit,
	 * and under load that comes a moment later (once in a suite's run).
	 */
	for (uint64_t t0 = now_ns(); mount(NULL, pb.fs, NULL, MS_REMOUNT | MS_RDONLY, NULL) < 0; usleep(20000))
		cr_assert(errno == EBUSY && now_ns() - t0 < 5000 * MS, "remount ro: %s", strerror(errno));
	cr_assert_neq(t_chimed_start(&tb, pb.sock, pb.extra), 0, "chimed started on a read-only filesystem");
	cr_assert(t_file_has(pb.log, "cannot create lock file") && t_file_has(pb.log, "Read-only file system"),
		  "the refusal is not the lock file's");
	cr_assert(t_file_has(pb.log, "not started: the sessions and their timers stay in the files"),
		  "the refusal does not say that the sessions and their timers stay in the files");
	cr_assert(t_file_has(pb.log, "once the filesystem is mounted read-write"), "the refusal does not say what to do");
	cr_assert_eq(stat(path, &after), 0, "the sessions file is gone");
	cr_assert(after.st_ino == before.st_ino && after.st_size == before.st_size &&
		  after.st_mtim.tv_sec == before.st_mtim.tv_sec && after.st_mtim.tv_nsec == before.st_mtim.tv_nsec,
		  "the sessions file changed");
	snprintf(path, sizeof(path), "%s.shard0", pb.sock);
	cr_assert_eq(stat(path, &after), 0, "the shard file is gone");
	cr_assert_eq(mount(NULL, pb.fs, NULL, MS_REMOUNT, NULL), 0, "remount rw: %s", strerror(errno));
	cr_assert_eq(t_chimed_start(&tb, pb.sock, pb.extra), 0, "chimed did not start on the read-write filesystem");
	cr_assert(t_file_has(pb.log, "taking over 1 session from"), "the sessions were not taken over");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20), 20, "timers lost");
	t_chimed_stop(&tb, SIGTERM);
	unlink(pb.log);
	t_unmount_tmpfs(pb.fs);
}

/*
 * A shard file cut short (a full disk while copying it, a stray truncate):
 * the next broker refuses it, names it, and leaves every file as it was, so
 * that the operator can put it back or start with --fresh; it never maps
 * past its end (SIGBUS) nor makes a new, empty one in its place.
 */
Test(restart, a_truncated_shard_file_is_refused_and_left_alone)
{
	char log[300], extra[400], path[PATH_MAX];
	struct stat st0, st1;
	off_t cut;
	chime_t *c;
	chime_id_t id;

	start("-n 2");
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	c = open_armed("cut", 40, &id);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 40), 40);
	chime_close(c);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
	tb.pid = 0;
	snprintf(path, sizeof(path), "%s.shard1", tb.sock);
	cr_assert_eq(stat(path, &st0), 0);
	cut = st0.st_size / 2;
	cr_assert_eq(truncate(path, cut), 0);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker took over a truncated shard file");
	cr_assert(t_file_has(log, ".shard1") && t_file_has(log, "--fresh"), "the refusal does not name the file and the way out");
	cr_assert_eq(stat(path, &st1), 0, "the truncated file is gone");
	cr_assert_eq(st1.st_size, cut, "the truncated file was replaced");
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	cr_assert_eq(stat(path, &st1), 0, "the sessions file is gone");
	snprintf(extra, sizeof(extra), "-n 2 --fresh 2>'%s'", log);
	restart(0, extra);
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0);
}

/*
 * The sessions file cut short the same way (a stray truncate, a copy that
 * ran out of room): a broker writes it whole (a header and a record per
 * client slot, its room reserved), so a shorter one is damaged, and it is
 * refused, named and left alone, as a truncated shard file is. Before,
 * the records past its end read as empty slots: cut at its header, the
 * next broker started with no session and discarded every timer without a
 * word; cut between records, the sessions past the cut went the same way,
 * their timers counted as anonymous clients'.
 */
static void truncated_sessions_file(off_t cut_records)
{
	char log[300], extra[400], path[PATH_MAX];
	struct stat st;
	size_t size;
	char *whole;
	int fd;

	detached_session_on_two_shards("cut-a", 20, log, sizeof(log));
	/* Slots are taken in order: "cut-b" is in slot 1, past a cut after one record. */
	chime_close(open_armed("cut-b", 30, &(chime_id_t){ 0 }));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 50), 50);
	fd = killed_sessions_file();
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	cr_assert_eq(fstat(fd, &st), 0);
	size = (size_t)st.st_size;
	whole = malloc(size);
	cr_assert_not_null(whole);
	cr_assert_eq(read(fd, whole, size), (ssize_t)size);
	close(fd);
	cr_assert_eq(truncate(path, 128 + cut_records * 128), 0);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0,
		      "a broker took over a sessions file cut after %lld records (%llu timers left in the shard files)",
		      (long long)cut_records, (unsigned long long)t_nodes(tb.sock, ARMED_STATES));
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "cut short") && t_file_has(log, "--fresh"),
		  "the refusal does not name the file, what is wrong with it, and the way out");
	cr_assert_eq(stat(path, &st), 0, "the truncated file is gone");
	cr_assert_eq(st.st_size, 128 + cut_records * 128, "the truncated file was changed");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 50, "a refused start touched the timers");
	/* Put back whole, as the operator would: both sessions, every timer. */
	fd = open(path, O_WRONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, whole, size), (ssize_t)size);
	close(fd);
	free(whole);
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 50);
	chime_close(sopen_ok("cut-a"));
	chime_close(sopen_ok("cut-b"));
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 50);
}

Test(restart, a_sessions_file_cut_at_its_header_is_refused_and_left_alone)
{
	truncated_sessions_file(0);
}

Test(restart, a_sessions_file_cut_between_its_records_is_refused_and_left_alone)
{
	truncated_sessions_file(1);
}

/*
 * The socket's directory may be one other users can write in (a shared
 * /tmp): a sessions or shard file another uid put there is no broker's.
 * Taken over, its owner would choose the sessions restored (any uid's
 * names) and read and write the live slab, every user's timers, under
 * the broker. Refused, named, left alone; --fresh replaces them. (The
 * files here are a real broker's, given to another uid: what a user who
 * ran its own chimed with the same options could put there.)
 */
Test(restart, files_of_another_uid_are_not_taken_over)
{
	static const char *const which[] = { "sessions", "shard1" };
	char log[300], extra[400], path[PATH_MAX];
	struct stat st;
	chime_t *c;
	chime_id_t id;

	if (geteuid() != 0)
		cr_skip("needs root (gives the broker's files to another uid)");
	start("-n 2");
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	c = open_armed("planted", 40, &id);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 40), 40);
	chime_close(c);
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		kill(tb.pid, SIGKILL);
		cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
		tb.pid = 0;
		snprintf(path, sizeof(path), "%s.%s", tb.sock, which[i]);
		cr_assert_eq(chown(path, 4242, 4242), 0, "chown %s", path);
		cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker took over a %s file of uid 4242", which[i]);
		cr_assert(t_file_has(log, path) && t_file_has(log, "belongs to uid 4242") && t_file_has(log, "--fresh"),
			  "the refusal does not name the file, its owner and the way out");
		cr_assert_eq(stat(path, &st), 0, "the file is gone");
		cr_assert_eq(st.st_uid, 4242, "the file was replaced or given back");
		/* Its own again: taken over, the session and its 40 timers with it. */
		cr_assert_eq(chown(path, 0, 0), 0);
		restart(0, "-n 2");
		cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 40, "the session's timers were not taken over");
	}
	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
	tb.pid = 0;
	cr_assert_eq(chown(path, 4242, 4242), 0);
	restart(0, "-n 2 --fresh");
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_uid, 0, "--fresh kept another uid's shard file");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 0);
}

/* ---- (7) files removed while the broker runs (rm, systemd-tmpfiles) ---- */

/* A broker in a directory of its own, its stderr in <dir>/chimed.log (named in log). */
static void start_logged(const char *extra, char *log, size_t len)
{
	char dir[64], sock[96], opts[512];
	int r;

	cr_assert_eq(t_mkdtemp(dir, sizeof(dir), "chime-t"), 0);
	snprintf(sock, sizeof(sock), "%s/chime.sock", dir);
	snprintf(log, len, "%s/chimed.log", dir);
	snprintf(opts, sizeof(opts), "%s 2>'%s'", extra, log);
	r = t_chimed_start(&tb, sock, opts);
	tb.own_dir = 1;         /* stop() removes it, started or not */
	snprintf(tb.dir, sizeof(tb.dir), "%s", dir);
	cr_assert_eq(r, 0, "chimed %s did not start", opts);
	t_session_sock = tb.sock;
}

/* Lines of the log holding both a and b. */
static unsigned log_lines(const char *log, const char *a, const char *b)
{
	char line[1024];
	unsigned n = 0;
	FILE *f = fopen(log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, a) && strstr(line, b);
	fclose(f);
	return n;
}

/* Wait (up to 3 s: the broker looks once a second) for a line holding a and b. */
static bool log_says(const char *log, const char *a, const char *b)
{
	for (int i = 0; i < 300; i++, usleep(10 * 1000))
		if (log_lines(log, a, b))
			return true;
	return false;
}

static void stop_now(int sig)
{
	int st;

	cr_assert_eq(kill(tb.pid, sig), 0);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chimed's stop: status %#x", st);
}

/* Create empty files in dir until the filesystem has no inode left: how many. */
static unsigned fill_inodes(const char *dir)
{
	char path[PATH_MAX];
	unsigned n = 0;

	for (;; n++) {
		int fd;

		snprintf(path, sizeof(path), "%s/inode%u", dir, n);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0) {
			if (errno == EEXIST)
				continue;
			cr_assert_eq(errno, ENOSPC, "creating %s: %s", path, strerror(errno));
			return n;
		}
		close(fd);
	}
}

/*
 * Wait until what a stopped broker held on fs is given back: its listening
 * socket's last reference is the io_uring accept in flight, dropped by the
 * kernel's ring teardown after the process is reaped, so the socket's inode
 * comes free a little later (under load, after a filling had taken the
 * others: the next start then created its lock file and failed its bind).
 * Settled: free inodes and blocks unchanged for 300 ms (10 s at most).
 */
static void room_settle(const char *fs)
{
	struct statvfs v;
	fsfilcnt_t inodes = (fsfilcnt_t)-1;
	fsblkcnt_t blocks = (fsblkcnt_t)-1;
	int same = 0;

	for (int i = 0; i < 1000 && same < 30; i++, usleep(10 * 1000)) {
		cr_assert_eq(statvfs(fs, &v), 0, "statvfs('%s'): %s", fs, strerror(errno));
		same = v.f_ffree == inodes && v.f_bfree == blocks ? same + 1 : 0;
		inodes = v.f_ffree;
		blocks = v.f_bfree;
	}
	cr_assert_eq(same, 30, "the room on %s kept changing for 10 s", fs);
}

/* Take what room the filesystem has left: its inodes (empty files), or its space. */
static void fill_up(const char *fs, bool inodes, const char *name)
{
	if (inodes)
		cr_assert_gt(fill_inodes(fs), 0);
	else
		cr_assert_geq(t_fill(fs, name, 0), 0, "filling: %s", strerror(errno));
}

/*
 * A stop (SIGTERM) on a tmpfs with no inode or no space left, sessions
 * attached and detached: the sessions file and the shard files are
 * written in place (the one reserved whole at the start, the others
 * mapped and reserved), so the stop needs no room and keeps every timer.
 * A start on it then (the room the stop freed taken again) finds none
 * for the lock file: it said only "No space left on device", where
 * the files were kept, and nothing about them or what to do.
 */
static void a_stop_on_a_full_tmpfs(bool inodes, bool one_left)
{
	struct private_broker pb;
	char path[PATH_MAX], sess[PATH_MAX];
	struct stat before, after;
	chime_t *c, *c2;
	chime_id_t id;

	private_broker_start(&pb, "64m,nr_inodes=64", "-n 2 --capacity 65536");
	chime_close(open_armed("full-detached", 30, &id));
	c = open_armed("full-attached", 40, &id);
	c2 = open_armed("full-attached2", 20, &id);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 90), 90);
	fill_up(pb.fs, inodes, "filler");
	stop_now(SIGTERM);
	cr_assert_eq(log_lines(pb.log, "keeping the timers of 3 sessions (90 timers) for the next broker", ""), 1,
		     "the stop does not keep the 3 sessions' 90 timers");
	cr_assert_eq(log_lines(pb.log, "cannot", ""), 0, "the stop could not write something");
	snprintf(sess, sizeof(sess), "%s.sessions", pb.sock);
	cr_assert_eq(stat(sess, &before), 0);
	/* The lock file, socket and control segment the stop removed: their room taken again. */
	room_settle(pb.fs);
	fill_up(pb.fs, inodes, "filler2");
	if (one_left) {
		/* one inode, for the lock file: the socket has none */
		snprintf(path, sizeof(path), "%s/inode0", pb.fs);
		cr_assert_eq(unlink(path), 0);
	}
	cr_assert_neq(t_chimed_start(&tb, pb.sock, pb.extra), 0, "chimed started on a full filesystem");
	cr_assert(log_lines(pb.log, one_left ? "cannot bind socket" : "lock file", "No space left on device"),
		  "the refusal is not the %s's", one_left ? "socket" : "lock file");
	cr_assert(log_lines(pb.log, "not started: the sessions and their timers stay in the files", "once there is room"),
		  "the refusal does not say that the sessions and their timers stay in the files, nor what to do");
	cr_assert_eq(stat(sess, &after), 0, "the sessions file is gone");
	cr_assert(after.st_ino == before.st_ino && after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
		  after.st_mtim.tv_nsec == before.st_mtim.tv_nsec, "the sessions file changed");
	/* Room again: every timer is there. */
	for (unsigned i = one_left; inodes; i++) {
		snprintf(path, sizeof(path), "%s/inode%u", pb.fs, i);
		if (unlink(path) < 0)
			break;
	}
	snprintf(path, sizeof(path), "%s/filler", pb.fs);
	(void)unlink(path);
	snprintf(path, sizeof(path), "%s/filler2", pb.fs);
	(void)unlink(path);
	cr_assert_eq(t_chimed_start(&tb, pb.sock, pb.extra), 0, "chimed did not start once there was room");
	cr_assert(t_file_has(pb.log, "taking over 3 sessions from"), "the sessions were not taken over");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 90), 90, "timers lost");
	chime_close(c);
	chime_close(c2);
	t_chimed_stop(&tb, SIGTERM);
	unlink(pb.log);
	t_unmount_tmpfs(pb.fs);
}

Test(restart, a_stop_on_a_tmpfs_out_of_space_keeps_every_session_and_a_start_without_room_says_so, .timeout = 60)
{
	a_stop_on_a_full_tmpfs(false, false);
}

Test(restart, a_stop_on_a_tmpfs_out_of_inodes_keeps_every_session_and_a_start_without_room_says_so, .timeout = 60)
{
	a_stop_on_a_full_tmpfs(true, false);
}

/* One inode left, the lock file's: the socket's bind is refused, and said the same way. */
Test(restart, a_start_on_a_tmpfs_with_one_inode_left_says_the_sessions_stay_in_the_files, .timeout = 60)
{
	a_stop_on_a_full_tmpfs(true, true);
}

/*
 * A stop says how many timers it keeps for the next broker, and how many
 * end with it: "keeping the timers of 1 session" said neither, and nothing
 * at all of the anonymous clients' timers that a stop takes with it.
 */
Test(restart, a_stop_counts_the_timers_it_keeps_and_those_that_end_with_it)
{
	char log[300];
	chime_t *anon;
	chime_id_t id;

	start_logged("-n 2", log, sizeof(log));
	chime_close(open_armed("counted", 7, &id));
	anon = sopen_ok(NULL);
	for (unsigned i = 0; i < 5; i++)
		cr_assert_eq(chime_arm(anon, 0, now_ns() + HOUR, 0, i, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 12), 12);
	restart(SIGTERM, "-n 2");
	cr_assert_eq(log_lines(log, "keeping the timers of 1 session (7 timers) for the next broker", ""), 1,
		     "the stop does not count the session's 7 timers");
	cr_assert_eq(log_lines(log, "5 timers of 1 client that no next broker takes over", "end with this one"), 1,
		     "the stop does not count the anonymous client's 5 timers it ends");
	chime_close(anon);
}

/*
 * And the events an anonymous client has not consumed, as a kept
 * session's: the stop said 15362 timers where the next broker's restore
 * freed 15384 nodes, 22 of them fired and not taken (an operator's audit).
 */
Test(restart, a_stop_counts_the_events_an_anonymous_client_has_not_consumed)
{
	char log[300];
	chime_t *anon;
	chime_id_t id;

	start_logged("-n 1", log, sizeof(log));
	anon = sopen_ok(NULL);
	for (unsigned i = 0; i < 5; i++)
		cr_assert_eq(chime_arm(anon, 0, now_ns() + HOUR, 0, i, &id), 0);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(chime_arm(anon, 0, now_ns(), 0, 10 + i, &id), 0);
	cr_assert_eq(chime_flush(anon), 0);
	ring_holds(anon, 3);
	usleep(50 * 1000);      /* the shard's counters, published once a millisecond at most */
	restart(SIGTERM, "-n 1");
	cr_assert_eq(log_lines(log, "5 timers armed and 3 events not consumed, of 1 client that no next broker "
			       "takes over", "end with this one"), 1, "the stop does not count the 3 events it ends");
	chime_close(anon);
}

/*
 * The events a kept session has not consumed are kept too, and said: a
 * stop said "(0 timers)" of a session holding 150 events (the chaos soak).
 */
Test(restart, a_stop_counts_the_events_a_kept_session_has_not_consumed)
{
	char log[300];
	chime_t *c;
	chime_id_t id;

	start_logged("-n 2", log, sizeof(log));
	c = open_armed("held", 3, &id);
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns(), 0, 100 + i, &id), 0);
	cr_assert_eq(chime_flush(c), 0);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 3), 3);
	usleep(300 * 1000);     /* the gauges are published within a few ms of a change */
	restart(SIGTERM, "-n 2");
	cr_assert_eq(log_lines(log, "keeping the timers of 1 session (3 timers armed, 4 events not consumed) for "
			       "the next broker", ""), 1, "the stop does not count the session's 4 events");
}

/*
 * The sessions file and every shard file removed under a running broker
 * holding a session's timers: its stop wrote the unlinked inodes and said
 * "keeping the timers", and the next broker started empty without a word.
 * Now the stop writes them again, says so, and every timer comes back,
 * each id still naming its timer.
 */
Test(restart, files_removed_while_the_broker_ran_are_written_again_at_a_stop)
{
	static const char *const which[] = { "sessions", "shard0", "shard1" };
	char log[300], next[300], extra[400], path[PATH_MAX];
	struct chime_event ev[128];
	uint8_t seen[100] = { 0 };
	chime_id_t ids[100];
	chime_t *c;
	unsigned n;

	start_logged("-n 2", log, sizeof(log));
	c = sopen_ok("keepme");
	for (unsigned i = 0; i < 100; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, i, &ids[i]), 0);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 100), 100);
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		snprintf(path, sizeof(path), "%s.%s", tb.sock, which[i]);
		cr_assert_eq(unlink(path), 0, "unlink %s", path);
	}
	snprintf(next, sizeof(next), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", next);
	restart(SIGTERM, extra);
	cr_assert(log_lines(next, "taking over 1 session from", ""), "the next broker took no session over");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 100, "timers lost across the stop");
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		snprintf(path, sizeof(path), "'%s.%s'", tb.sock, which[i]);
		cr_assert_eq(log_lines(log, path, "written again for the next broker"), 1,
			     "the stop did not say it wrote %s again", path);
	}
	cr_assert_eq(log_lines(log, "keeping the timers of 1 session ", ""), 1);
	/* Every old id still names its timer: reset to now, each fires once. */
	c = sopen_ok("keepme");
	for (unsigned i = 0; i < 100; i++)
		cr_assert_eq(chime_reset(c, ids[i], now_ns() + 20 * MS), 0);
	n = collect(c, ev, 128, now_ns() + 1000 * MS);
	cr_assert_eq(n, 100, "%u of 100 timers fired after a reset by their old ids", n);
	for (unsigned i = 0; i < n; i++) {
		cr_assert_lt(ev[i].user_data, 100);
		cr_assert_eq(seen[ev[i].user_data]++, 0, "timer %llu fired twice",
			     (unsigned long long)ev[i].user_data);
	}
	chime_close(c);
}

/*
 * On a nearly full filesystem, the stop writes a removed shard file again
 * with what the next broker reads (the header, the wheel up to the slab's
 * high-water mark), not the key index nor the reserve, which a tmpfs counts
 * as data: 5 MiB copied for the 64 KiB of these 1000 timers, and with 2 MiB
 * free the copy failed and the timers were lost (found by an audit).
 */
Test(restart, a_removed_shard_file_is_written_again_on_a_nearly_full_filesystem, .timeout = 60)
{
	static const char *const which[] = { "sessions", "shard0" };
	char fs[64], sock[128], log[192], next[192], extra[400], path[PATH_MAX];
	struct statvfs v;
	chime_id_t id;

	cr_assert_eq(t_mount_tmpfs(fs, sizeof(fs), "32m"), 0, "mount tmpfs: %s", strerror(errno));
	snprintf(sock, sizeof(sock), "%s/chime.sock", fs);
	snprintf(log, sizeof(log), "%s/chimed.log", fs);
	snprintf(extra, sizeof(extra), "-n 1 --capacity 1048576 2>'%s'", log);
	cr_assert_eq(t_chimed_start(&tb, sock, extra), 0);
	t_session_sock = tb.sock;
	chime_close(open_armed("tight", 1000, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1000), 1000);
	/* the shard file holds its reserve (the case: a whole copy would need 5 MiB) */
	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	{
		uint64_t held = 0;

		for (uint64_t t0 = now_ns(); now_ns() - t0 < 5000 * MS && held < (4u << 20); usleep(20000)) {
			struct stat st;

			cr_assert_eq(stat(path, &st), 0);
			held = (uint64_t)st.st_blocks * 512;
		}
		cr_assert_geq(held, 4u << 20, "the shard file holds %llu bytes, not its 4 MiB reserve",
			      (unsigned long long)held);
	}
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		snprintf(path, sizeof(path), "%s.%s", tb.sock, which[i]);
		cr_assert_eq(unlink(path), 0, "unlink %s", path);
	}
	/* 2 MiB left: room for what the next broker reads, not for the shard file's 5 MiB of data */
	cr_assert_eq(statvfs(fs, &v), 0);
	cr_assert_gt((uint64_t)v.f_bavail * v.f_bsize, 3u << 20);
	cr_assert_geq(t_fill(fs, "filler", (uint64_t)v.f_bavail * v.f_bsize - (2u << 20)), 0, "filling: %s",
		      strerror(errno));
	snprintf(next, sizeof(next), "%s/next.log", fs);
	snprintf(extra, sizeof(extra), "-n 1 --capacity 1048576 2>'%s'", next);
	restart(SIGTERM, extra);
	cr_assert(!log_lines(log, "cannot write", ""), "the stop could not write a file again");
	cr_assert(log_lines(next, "taking over 1 session from", ""), "the next broker took no session over");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 1000, "timers lost across the stop");
	t_chimed_stop(&tb, SIGTERM);
	t_unmount_tmpfs(fs);
}

/*
 * chimestat's gauge `field` (broker.sessions_unadmitted...), once it is
 * `want` (up to 3 s: the broker counts at its heartbeat, and looks at its
 * files once a second); else the last value read.
 */
static unsigned gauge_settles(const char *field, unsigned want)
{
	const char *stat = getenv("CHIMESTAT");
	char cmd[800], name[128];
	unsigned n = UINT_MAX;

	cr_assert_not_null(stat);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' -1 -f %s", stat, tb.sock, field);
	for (int i = 0; i < 30 && n != want; i++) {
		FILE *f = popen(cmd, "r");

		cr_assert_not_null(f);
		if (fscanf(f, " %127s %u", name, &n) != 2 || strcmp(name, field))
			n = UINT_MAX;
		pclose(f);
		if (n != want)
			usleep(100 * 1000);
	}
	return n;
}

/* Does chimestat's plain table (-1) show a line holding `needle`? Once, up to 3 s. */
static bool stat_says(const char *needle)
{
	const char *stat = getenv("CHIMESTAT");
	char cmd[800], line[2048];
	bool found = false;

	cr_assert_not_null(stat);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' -1", stat, tb.sock);
	for (int i = 0; i < 30 && !found; i++) {
		FILE *f = popen(cmd, "r");

		cr_assert_not_null(f);
		while (fgets(line, sizeof(line), f))
			found |= strstr(line, needle) != NULL;
		pclose(f);
		if (!found)
			usleep(100 * 1000);
	}
	return found;
}

/*
 * A crash between the removal and the stop loses the timers: the heartbeat
 * says so at once, once per file and per removal (the flag clears when the
 * path names the file again), and only for the files removed.
 */
Test(restart, a_file_removed_while_the_broker_runs_is_reported_once_per_removal)
{
	char log[300], sess[PATH_MAX], shard1[PATH_MAX], aside[PATH_MAX], said_sess[PATH_MAX + 2],
	     said_shard1[PATH_MAX + 2];
	chime_id_t id;

	start_logged("-n 2", log, sizeof(log));
	chime_close(open_armed("watched", 10, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	snprintf(sess, sizeof(sess), "%s.sessions", tb.sock);
	snprintf(shard1, sizeof(shard1), "%s.shard1", tb.sock);
	snprintf(aside, sizeof(aside), "%s.aside", tb.sock);
	snprintf(said_sess, sizeof(said_sess), "'%s'", sess);
	snprintf(said_shard1, sizeof(said_shard1), "'%s'", shard1);
	cr_assert_eq(link(shard1, aside), 0);   /* kept under another name, to be put back */
	cr_assert_eq(unlink(shard1), 0);
	cr_assert_eq(unlink(sess), 0);
	cr_assert(log_says(log, said_sess, "was removed while the broker runs: a crash now would lose"),
		  "no error for the removed sessions file within 3 s");
	cr_assert(log_says(log, said_shard1, "was removed while the broker runs"), "no error for shard1");
	/* Said once in the log, shown as long as it lasts: an operator may look later (it was only in the log). */
	cr_assert_eq(gauge_settles("broker.sessions_file_gone", 1), 1, "chimestat does not show the sessions file gone");
	cr_assert_eq(gauge_settles("broker.shard_files_gone", 1), 1, "chimestat does not count the shard file gone");
	cr_assert_eq(gauge_settles("broker.socket_gone", 0), 0, "chimestat shows the socket gone");
	cr_assert(stat_says("*** its sessions file and 1 shard file were removed or replaced: a crash now would lose "
			    "the named sessions' timers"), "chimestat's table does not warn of the files gone");
	usleep(3000 * 1000);    /* two more looks: 1-1.35 s apart (heartbeats of 450 ms at rest) */
	cr_assert_eq(log_lines(log, said_sess, "was removed"), 1, "said more than once");
	cr_assert_eq(log_lines(log, said_shard1, "was removed"), 1, "said more than once");
	cr_assert_eq(log_lines(log, ".shard0'", "was removed"), 0, "shard0 was not removed");
	/* Put back (the same file), then removed again: a new removal, said again. */
	cr_assert_eq(rename(aside, shard1), 0);
	cr_assert_eq(gauge_settles("broker.shard_files_gone", 0), 0, "the shard file put back, still counted gone");
	cr_assert(stat_says("*** its sessions file was removed or replaced"), "the warning does not follow the files");
	usleep(1500 * 1000);
	cr_assert_eq(unlink(shard1), 0);
	for (int i = 0; i < 300 && log_lines(log, said_shard1, "was removed") < 2; i++)
		usleep(10 * 1000);
	cr_assert_eq(log_lines(log, said_shard1, "was removed"), 2, "the second removal was not said");
	stop_now(SIGTERM);
	cr_assert_eq(log_lines(log, said_sess, "written again"), 1);
	cr_assert_eq(log_lines(log, said_shard1, "written again"), 1);
}

/*
 * The socket's directory removed with everything in it (rm -r, a cleanup):
 * a stop cannot write the files again where there is no directory, so the
 * heartbeat says so, and what to do: make the directory again before the
 * stop (for the socket, before a restart). It said "a stop writes it
 * again" (and "chimectl restart ... makes it again"), and the stop that
 * came then found no directory, and every session's timers were lost
 * (said by the stop, too late). Made again, the stop writes the files
 * there, and the next broker has every timer.
 */
Test(restart, a_directory_removed_while_the_broker_runs_is_said_to_need_making_again)
{
	char logdir[64], log[128], extra[300], said[PATH_MAX + 16];
	chime_id_t id;

	cr_assert_eq(t_mkdtemp(logdir, sizeof(logdir), "chime-t-log"), 0);
	snprintf(log, sizeof(log), "%s/chimed.log", logdir);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	start(extra);
	chime_close(open_armed("homeless", 20, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20), 20);
	t_rmdir_files(tb.dir);
	cr_assert_neq(access(tb.dir, F_OK), 0, "the directory is still there");
	snprintf(said, sizeof(said), "'%s.sessions'", tb.sock);
	cr_assert(log_says(log, said, "was removed with its directory"),
		  "no error for the sessions file removed with its directory within 3 s%s",
		  log_lines(log, said, "a stop writes it again") ? " (it says a stop writes it again)" : "");
	cr_assert(log_says(log, ".shard1'", "was removed with its directory"), "no such error for shard1");
	cr_assert_eq(log_lines(log, ".sessions'", "a stop writes it again"), 0, "it says a stop writes it again");
	cr_assert(log_says(log, "socket '", "its directory is gone too"),
		  "the removed socket is not said to need its directory made again (%u lines on the socket)",
		  log_lines(log, "socket '", "was removed"));
	cr_assert_eq(mkdir(tb.dir, 0700), 0);
	stop_now(SIGTERM);
	cr_assert_eq(log_lines(log, said, "written again"), 1, "the stop did not write the sessions file again");
	restart(0, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 20, "timers lost across the stop");
	chime_close(sopen_ok("homeless"));
	t_rmdir_files(logdir);
}

/*
 * The socket file removed (a cleanup of its directory): the clients go on,
 * no new one can connect, and the log says so once (it said nothing; found
 * by an audit); put back, it is not said again.
 */
Test(restart, a_removed_socket_is_reported_once)
{
	char log[300], aside[PATH_MAX], said[PATH_MAX + 16];

	start_logged("-n 1", log, sizeof(log));
	snprintf(aside, sizeof(aside), "%s.aside", tb.sock);
	snprintf(said, sizeof(said), "socket '%s'", tb.sock);
	cr_assert_eq(rename(tb.sock, aside), 0);
	cr_assert(log_says(log, said, "was removed or replaced while the broker runs"),
		  "no error for the removed socket within 3 s");
	cr_assert_eq(gauge_settles("broker.socket_gone", 1), 1, "chimestat does not show the socket gone");
	cr_assert(stat_says("*** its socket was removed or replaced: no new client can connect"),
		  "chimestat's table does not warn of the socket gone");
	usleep(3000 * 1000);    /* two more looks: 1-1.35 s apart (heartbeats of 450 ms at rest) */
	cr_assert_eq(log_lines(log, said, "was removed"), 1, "said more than once");
	cr_assert_eq(rename(aside, tb.sock), 0);
	cr_assert_eq(gauge_settles("broker.socket_gone", 0), 0, "the socket put back, still shown gone");
	usleep(1200 * 1000);
	cr_assert_eq(log_lines(log, said, "was removed"), 1, "said again once put back");
	stop_now(SIGTERM);
}

/*
 * Two brokers on the same files at once. The lock file keeps a second one
 * out, but a cleanup of the socket's directory can remove it, and the
 * socket, while the broker runs and its sessions and shard files are
 * still there. A second chimed on that socket then took the running one's
 * files over: it adopted its sessions, rebuilt the wheels and key indexes
 * of the slabs the first one still ran on, and rewrote the sessions file
 * under it, both brokers firing the same timers from one slab. The
 * sessions file, open in the broker from its start to its stop and no
 * one else's (mode 0600), is the lock that stays: held, the second broker
 * refuses to start and says why; the first one runs on, and its stop
 * hands every timer to the next.
 */
Test(restart, a_second_broker_does_not_take_over_the_files_of_one_that_runs)
{
	struct t_chimed second;
	char log[300], lock[PATH_MAX], extra[400];
	chime_id_t id;
	chime_t *c;
	int r;

	start("-n 2");
	snprintf(log, sizeof(log), "%s/second.log", tb.dir);
	chime_close(open_armed("first", 100, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 100), 100);
	snprintf(lock, sizeof(lock), "%s.lock", tb.sock);
	cr_assert_eq(unlink(lock), 0);
	cr_assert_eq(unlink(tb.sock), 0);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	r = t_chimed_start(&second, tb.sock, extra);
	if (r == 0)
		t_chimed_stop(&second, SIGKILL);
	cr_assert_neq(r, 0, "a second broker started on the files of one that runs%s",
		      t_file_has(log, "taking over 1 session") ? ", and took its session over" : "");
	cr_assert(t_file_has(log, ".sessions") && t_file_has(log, "in use by a running broker"),
		  "the refusal does not say why");
	cr_assert(t_alive(tb.pid), "the first broker is gone");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 100, "the refused start touched the timers");
	/* The first one's stop keeps the session for the next broker, every timer, ids and all. */
	restart(SIGTERM, "-n 2");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 100);
	c = sopen_ok("first");
	cr_assert_eq(chime_cancel(c, id), 0, "the last timer's id does not name it");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 99), 99);
	chime_close(c);
}

/*
 * Something other than a file at PATH.sessions (a directory made by hand,
 * a FIFO): refused and said as such. It was "cannot take over sessions
 * file: Is a directory (--fresh discards it)", and "Invalid argument" for
 * a FIFO; --fresh does not remove a directory, and that start failed too.
 */
Test(restart, a_sessions_path_that_is_not_a_file_is_said_so)
{
	char log[300], extra[400], path[PATH_MAX];

	start("-n 1");
	stop_now(SIGTERM);
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	snprintf(log, sizeof(log), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 1 2>'%s'", log);
	cr_assert_eq(mkdir(path, 0700), 0);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker started with a directory at its sessions file");
	cr_expect(t_file_has(log, path) && t_file_has(log, "not a regular file"),
		  "a directory at the sessions file is not said as such");
	cr_expect(!t_file_has(log, "--fresh"), "told to --fresh, which does not remove a directory");
	cr_assert_eq(rmdir(path), 0);
	cr_assert_eq(mkfifo(path, 0600), 0);
	cr_assert_neq(t_chimed_restart(&tb, 0, extra), 0, "a broker started with a FIFO at its sessions file");
	cr_expect(t_file_has(log, path) && t_file_has(log, "not a regular file"),
		  "a FIFO at the sessions file is not said as such");
	cr_assert_eq(unlink(path), 0);
	restart(0, "-n 1");
}

/*
 * Another file put where a removed one was (a new broker's, another
 * program's): neither the heartbeat nor the stop writes over it, and both
 * say the timers are lost; the stop does not claim to keep them.
 */
Test(restart, another_file_at_a_removed_files_path_is_not_written_over)
{
	static const char *const which[] = { "sessions", "shard1" };
	char log[300], path[PATH_MAX], quoted[PATH_MAX + 2], buf[32];
	chime_id_t id;

	start_logged("-n 2", log, sizeof(log));
	chime_close(open_armed("displaced", 10, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		snprintf(path, sizeof(path), "%s.%s", tb.sock, which[i]);
		cr_assert_eq(unlink(path), 0);
		cr_assert_eq(t_write_file(path, "someone else's"), 0);
	}
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		snprintf(quoted, sizeof(quoted), "'%s.%s'", tb.sock, which[i]);
		cr_assert(log_says(log, quoted, "was replaced by another file"), "no error for %s within 3 s", quoted);
	}
	stop_now(SIGTERM);
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		int fd;
		ssize_t n;

		snprintf(path, sizeof(path), "%s.%s", tb.sock, which[i]);
		snprintf(quoted, sizeof(quoted), "'%s'", path);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0, "%s is gone", path);
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		cr_assert_eq(n, 14, "%s was written over", path);
		cr_assert_eq(memcmp(buf, "someone else's", 14), 0, "%s was written over", path);
		cr_assert_eq(log_lines(log, quoted, "another file is there now: not writing over it"), 1,
			     "the stop did not say it left %s alone", path);
	}
	cr_assert_eq(log_lines(log, "keeping the timers", ""), 0, "the stop claims to keep the timers");
}

Test(restart, a_stop_with_no_session_leaves_no_file)
{
	chime_t *c;
	chime_id_t id;
	int st;

	start("");
	c = sopen_ok(NULL);
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 1, &id), 0);
	kill(tb.pid, SIGTERM);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	chime_close(c);
	cr_assert_eq(count_entries(tb.dir), 0, "files left behind with no session to keep");
}

/* The running broker's shard thread, held (t_thread_release() lets it go); a skip when ptrace is not allowed. */
static int shard0_hold(void)
{
	int tid = t_thread_named(tb.pid, "chimed-shard0"), r;

	cr_assert_gt(tid, 0, "no thread chimed-shard0 in chimed %d", tb.pid);
	r = t_thread_hold(tid);
	if (r == -EPERM || r == -EACCES)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
	cr_assert_eq(r, 0, "the shard thread did not stop: %s", strerror(-r));
	return tid;
}

/*
 * A restored session's holder that exits before it resumes gets its
 * carried grants freed by a command no one acknowledges (SHARD_CMD_FORGET,
 * control.c's holder_watch()), so a slot can have it and its next command
 * in a shard's command ring at once. The ring was sized for one command a
 * client: with the shard held, six holders' exits and six re-opens of
 * their sessions (12 commands in a ring of 8 at --max-clients 6)
 * overwrote some; 2 of 6 opens came back and the broker died of SIGSEGV
 * (3 of 4 runs: a review). All six must open, the broker running.
 */
Test(restart, forgotten_grants_and_reopens_of_every_slot_fit_a_held_shards_command_ring, .timeout = 60)
{
	enum { N = 6 };
	pid_t holders[N], openers[N];
	int ready[2], hold[2], st, tid, opened = 0;
	char c;

	start("--shards 1 --max-clients 6 --sq-size 16");
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(hold), 0);
	for (int i = 0; i < N; i++) {
		holders[i] = fork();
		cr_assert_geq(holders[i], 0);
		if (holders[i] == 0) {
			char name[16];
			chime_t *h;
			chime_id_t id;

			snprintf(name, sizeof(name), "held-%d", i);
			(void)!write(ready[1], sopen(&h, name) == 0 && chime_arm(h, 1, now_ns() + HOUR, 0, 0, &id) == 0 &&
					       chime_flush(h) == 0 ? "y" : "n", 1);
			(void)!read(hold[0], &c, 1);    /* held: no call into libchime after the restart */
			_exit(0);
		}
	}
	for (int i = 0; i < N; i++) {
		cr_assert_eq(read(ready[0], &c, 1), 1);
		cr_assert_eq(c, 'y', "a holder could not open and arm");
	}
	restart(SIGTERM, "--shards 1 --max-clients 6 --sq-size 16");   /* their grants carried */
	tid = shard0_hold();
	for (int i = 0; i < N; i++) {
		kill(holders[i], SIGKILL);
		waitpid(holders[i], &st, 0);
	}
	usleep(1000 * 1000);    /* a beat or two: a FORGET for each */
	for (int i = 0; i < N; i++) {
		openers[i] = fork();
		if (openers[i] == 0) {
			char name[16];
			chime_t *o;

			alarm(20);
			snprintf(name, sizeof(name), "held-%d", i);
			_exit(sopen(&o, name) == 0 ? 0 : 1);
		}
	}
	usleep(1000 * 1000);    /* their REATTACHes posted behind the FORGETs */
	cr_assert_eq(t_thread_release(tid), 0);
	for (int i = 0; i < N; i++) {
		if (openers[i] > 0 && waitpid(openers[i], &st, 0) == openers[i] && WIFEXITED(st) &&
		    WEXITSTATUS(st) == 0)
			opened++;
	}
	close(ready[0]);
	close(ready[1]);
	close(hold[0]);
	close(hold[1]);
	cr_assert(t_broker_running(tb.sock, tb.pid), "the broker died");
	cr_assert_eq(opened, N, "%d of %d re-opens of the sessions succeeded", opened, N);
}

/*
 * SIGTERM the broker with its shard 0 held under ptrace: a stop that waits
 * for the attached sessions to park until the shard is released
 * (t_thread_release() of the tid returned, before any assertion: a test
 * that ends with it held never reaps the broker).
 */
static int stop_with_shard0_held(void)
{
	int tid = shard0_hold();

	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	return tid;
}

/*
 * A stopping broker takes no new client: chime_open() says -ECONNREFUSED
 * (chime_open(3)), whether anonymous, a new session, or the session being
 * parked for the next broker. The stop lasts as long as attached sessions
 * take to park (at most 5 s): the one shard is held under ptrace so that
 * the session stays parking while the control thread answers the opens.
 * Released, the shard parks it and the broker exits 0.
 */
Test(restart, opens_during_a_stop_are_refused_with_econnrefused)
{
	chime_t *held, *c = NULL;
	uint64_t t0;
	int tid, r, st, rs[3];
	bool alive;

	start("-n 1");
	held = sopen_ok("held");
	tid = stop_with_shard0_held();
	/* Until the control thread has read the signal, an open may still be admitted (it never hangs). */
	t0 = now_ns();
	while ((r = sopen(&c, NULL)) == 0 && now_ns() - t0 < 2000 * MS) {
		chime_close(c);
		usleep(10 * 1000);
	}
	rs[0] = r;
	t0 = now_ns();
	rs[1] = sopen(&c, "a-new-one");
	rs[2] = sopen(&c, "held");
	t0 = now_ns() - t0;
	alive = waitpid(tb.pid, &st, WNOHANG) == 0;
	/* Released before any assertion: a test that ends with it held never reaps the broker. */
	cr_assert_eq(t_thread_release(tid), 0);
	cr_expect_eq(rs[0], -ECONNREFUSED, "an anonymous open during the stop: %s", strerror(-rs[0]));
	cr_expect_eq(rs[1], -ECONNREFUSED, "a new session's open during the stop: %s", strerror(-rs[1]));
	cr_expect_eq(rs[2], -ECONNREFUSED, "the parking session's open during the stop: %s", strerror(-rs[2]));
	cr_expect(alive, "the broker stopped with a session still parking");
	cr_expect_lt(t0, 1000 * MS, "two refused opens took %llu ms", (unsigned long long)(t0 / MS));
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
	chime_close(held);
}

/*
 * A stop hands every session to the next broker, the detached ones too:
 * their lingers go on there (restored sessions wait at least 3 s). A stop
 * lasts while attached sessions park (up to 5 s), and the heartbeat went
 * on reclaiming detached sessions whose linger ended meanwhile, so a
 * session detached just before a slow stop was lost with its timers. The
 * shard is held under ptrace for 2 s to keep "held" parking while the
 * linger of "brief" (1 s) ends.
 */
Test(restart, a_detached_session_whose_linger_ends_during_a_stop_goes_to_the_next_broker)
{
	struct chime_event ev;
	chime_t *held, *c;
	chime_id_t id;
	uint64_t due;
	int tid, st;

	start("-n 1 --session-linger 1");
	c = sopen_ok("brief");
	due = now_ns() + 3000 * MS;     /* fired by the next broker, held for the session meanwhile */
	cr_assert_eq(chime_arm(c, 0, due, 0, 7, &id), 0);
	chime_close(c);         /* detached, applied: its linger ends in 1 s */
	held = sopen_ok("held");
	tid = stop_with_shard0_held();
	usleep(2000 * 1000);
	/* Released before any assertion: a test that ends with it held never reaps the broker. */
	cr_assert_eq(t_thread_release(tid), 0);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
	chime_close(held);
	restart(0, "-n 1 --session-linger 1");
	c = sopen_ok("brief");
	cr_assert_eq(collect(c, &ev, 1, due + 2000 * MS), 1, "the session's timer was lost in the stop");
	cr_assert_eq(ev.id, id);
	cr_assert_eq(ev.user_data, 7);
	chime_close(c);
}

static void kept_child(int wfd, void *arg)
{
	chime_t *c = NULL;
	chime_id_t id;

	(void)arg;
	if (sopen(&c, "kept") < 0)
		_exit(1);
	for (unsigned i = 0; i < 10; i++)
		if (chime_arm(c, 0, now_ns() + HOUR, 0, i, &id) < 0)
			_exit(2);
	(void)!write(wfd, "r", 1);
	pause();
}

Test(restart, a_restored_session_lingers_and_can_be_dropped)
{
	const char *ctl = getenv("CHIMECTL");
	char cmd[600];
	pid_t pid;

	cr_assert_not_null(ctl);
	start("--session-linger 30");
	pid = child(kept_child, NULL);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	restart(SIGKILL, "--session-linger 30");
	/* Its process dies too: gone with the old broker, never attached to this one. */
	kill_child(pid);
	/* Its pid died with the old broker: not known, so not shown as pid 0. */
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' sessions | grep -q 'kept .*detached  *- '", ctl, tb.sock);
	cr_assert_eq(system(cmd), 0, "chimectl sessions does not list the restored session, pid -");
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' -j sessions | grep -q '\"pid\":null'", ctl, tb.sock);
	cr_assert_eq(system(cmd), 0, "chimectl -j sessions: the restored session's pid is not null");
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' drop-session kept >/dev/null", ctl, tb.sock);
	cr_assert_eq(system(cmd), 0, "drop-session of a restored session failed");
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 0), 0, "a dropped restored session kept nodes");
}


/* As uid 65534: open session "lapsed", arm 10 timers an hour ahead, close (the session stays, detached). */
static void lapsed_child(int wfd, void *arg)
{
	chime_t *c = NULL;
	chime_id_t id;

	(void)arg;
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	if (sopen(&c, "lapsed") < 0)
		_exit(1);
	for (unsigned i = 0; i < 10; i++)
		if (chime_arm(c, 0, now_ns() + HOUR, 0, i, &id) < 0)
			_exit(2);
	chime_close(c);
	(void)!write(wfd, "r", 1);
}

static unsigned unadmitted_settles(unsigned want)
{
	return gauge_settles("broker.sessions_unadmitted", want);
}

/*
 * A session of a user the next broker's policy no longer admits (its
 * --allow-uid dropped): no process of that user can attach to it again.
 * It was restored without a word, kept its timers and its memory, and
 * nothing showed why. It is said at the restore (its name and user, and
 * the ways out), counted (chimestat broker.sessions_unadmitted), and goes
 * as an unattached session does when its linger ends.
 */
Test(restart, a_restored_session_of_a_user_no_longer_admitted_is_said_counted_and_lingers_out)
{
	char log[300], extra[400];
	chime_t *adm;
	unsigned n;

	if (geteuid() != 0)
		cr_skip("needs root (opens the session as uid 65534)");
	start("-n 2 --allow-uid 65534");
	cr_assert_eq(chmod(tb.dir, 0755), 0);
	kill_child(child(lapsed_child, NULL));
	chime_close(open_armed("admitted", 5, &(chime_id_t){ 0 }));     /* root's: admitted, not counted */
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 15), 15);
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 2 --session-linger 2 2>'%s'", log);
	restart(SIGKILL, extra);
	adm = sopen_ok("admitted");     /* its process back: it does not linger out */
	cr_assert(log_lines(log, "'lapsed'", "65534") && t_file_has(log, "does not admit"),
		  "the restored session of a user the policy no longer admits is not said, with its name and user");
	cr_assert_not(log_lines(log, "'admitted'", "does not admit"), "an admitted user's session said not to be");
	cr_assert_eq(n = unadmitted_settles(1), 1, "chimestat does not count the session (%u)", n);
	/* Its linger (2 s, at least the restart's 3 s) ends as an unattached session's does. */
	for (int i = 0; i < 80 && t_nodes(tb.sock, ARMED_STATES) > 5; i++)
		usleep(100 * 1000);
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 5, "the session's timers outlived its linger by 5 s");
	cr_assert_eq(n = unadmitted_settles(0), 0, "the session gone, still counted (%u)", n);
	chime_close(adm);
}

/* As uid 65534: try session "claimed"; the byte written says how it went: 'A' EACCES, 'o' opened, 'x' else. */
static void claim_child(int wfd, void *arg)
{
	chime_t *c = NULL;
	int r;

	(void)arg;
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	r = sopen(&c, "claimed");
	(void)!write(wfd, r == -EACCES ? "A" : r == 0 ? "o" : "x", 1);
	if (c)
		chime_close(c);
}

/*
 * The same for a session whose name the next broker's policy file reserves
 * for another user: its own user is refused it (reserved), the other one
 * too (the session is not its). Said and counted as well.
 */
Test(restart, a_restored_session_whose_name_is_now_reserved_for_another_user_is_said_and_counted)
{
	char log[300], extra[700], file[300], how = 0;
	chime_t *c = NULL;
	unsigned n;
	pid_t pid;
	int p[2], st;

	start("-n 2");
	chime_close(open_armed("claimed", 5, &(chime_id_t){ 0 }));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 5), 5);
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	snprintf(file, sizeof(file), "%s/policy", tb.dir);
	cr_assert_eq(t_write_file(file, "allow-all\nsession claimed 65534\n"), 0);
	snprintf(extra, sizeof(extra), "-n 2 --policy-file '%s' 2>'%s'", file, log);
	restart(SIGKILL, extra);
	cr_assert(log_lines(log, "'claimed'", "reserves its name for uid 65534"),
		  "the restored session whose name is reserved for another user is not said");
	cr_assert_eq(n = unadmitted_settles(1), 1, "chimestat does not count the session (%u)", n);
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 5, "its timers go with its linger, not at the restore");
	/* Neither may attach: root's name is 65534's now, and the session and its timers are root's. */
	cr_assert_eq(sopen(&c, "claimed"), -EACCES, "its own user attached to a name now reserved for another");
	cr_assert_eq(chmod(tb.dir, 0755), 0);
	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		claim_child(p[1], NULL);
		_exit(0);
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &how, 1), 1);
	close(p[0]);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert_eq(how, 'A', "uid 65534 %s another user's restored session", how == 'o' ? "attached to" :
		     "was not refused EACCES by");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 5, "the refused attaches took the session's timers");
}

/*
 * A reload (SIGHUP) that leaves a detached session to nobody (its name now
 * reserved for another user) says so, as a restart does, and counts it;
 * its timers go with its linger. A reload that gives it back uncounts it
 * (the count was the start's, and stayed so).
 */
Test(restart, a_reload_that_leaves_a_detached_session_to_nobody_says_so)
{
	char log[300], extra[700], file[300];
	unsigned n;

	start("-n 1");
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	snprintf(file, sizeof(file), "%s/policy", tb.dir);
	cr_assert_eq(t_write_file(file, "allow-all\n"), 0);
	snprintf(extra, sizeof(extra), "-n 1 --policy-file '%s' 2>'%s'", file, log);
	restart(SIGTERM, extra);
	chime_close(open_armed("orphaned", 5, &(chime_id_t){ 0 }));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 5), 5);
	/* Detached by then (a reload judges detached sessions only): the close is seen a moment later. */
	cr_assert(log_says(log, "'orphaned'", "detached:"), "the closed session was not detached");
	cr_assert_eq(t_write_file(file, "allow-all\nsession orphaned 65534\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	cr_assert(log_says(log, "'orphaned'", "reserves its name for uid 65534"),
		  "a reload that leaves a detached session to nobody does not say so");
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 5, "its timers go with its linger, not at the reload");
	cr_assert_eq(n = unadmitted_settles(1), 1, "the reload does not count the session (%u)", n);
	cr_assert_eq(t_write_file(file, "allow-all\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	cr_assert_eq(n = unadmitted_settles(0), 0, "a reload that gives the session back still counts it (%u)", n);
	chime_close(sopen_ok("orphaned"));
}

/*
 * chime_close() of a session commits: the timers armed just before it are
 * in the broker's slab, not only in the session's rings, when it returns.
 * A broker that crashes before reading the rings loses those arms (the
 * next process to open the session frees the grants they held).
 */
Test(restart, timers_armed_just_before_a_sessions_close_survive_a_crash_right_after)
{
	chime_t *c;
	chime_id_t id;

	start("");
	/* An hour ahead: nothing wakes the shard for them (see chime_flush(3)). */
	c = open_armed("commit", 100, &id);
	chime_close(c);
	restart(SIGKILL, "");
	c = sopen_ok("commit");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 100), 100,
		     "timers armed before the session's close were lost with the broker");
	chime_close(c);
}

/*
 * The same close while the broker restarts: the process's last arms are in
 * the rings of a broker that is gone (it had not noticed yet: chime_arm()
 * succeeds), and its close must hand them to the next broker (reconnecting,
 * within its 1 s) before the process goes; before, it did not wait for a
 * broker that was gone, and the arms went with the process.
 */
static void *close_thread(void *arg)
{
	chime_close(arg);
	return NULL;
}

/* Session "commit": 10 timers armed, the broker ended by sig, 10 more armed into the rings. */
static chime_t *armed_across_a_stop(int sig)
{
	chime_id_t id;
	chime_t *c;
	int st;

	start("");
	c = open_armed("commit", 10, &id);
	kill(tb.pid, sig);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	for (unsigned i = 10; i < 20; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, i, &id), 0);
	return c;
}

static void arms_then_close_across_a_restart(int sig, bool up_before_close, unsigned back_after_ms)
{
	pthread_t t;
	chime_t *c;

	c = armed_across_a_stop(sig);
	if (up_before_close) {
		restart(0, "");
		chime_close(c);
	} else {
		/* The next broker, a moment after the close began (as systemd restarts one). */
		cr_assert_eq(pthread_create(&t, NULL, close_thread, c), 0);
		usleep(back_after_ms * 1000);
		restart(0, "");
		pthread_join(t, NULL);
	}
	c = sopen_ok("commit");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20), 20,
		     "timers armed just before a close during a restart were lost");
	chime_close(c);
}

Test(restart, arms_closed_after_a_crash_reach_the_next_broker)
{
	arms_then_close_across_a_restart(SIGKILL, true, 0);
}

struct ten_arms {
	chime_t *c;
	int r;                  /* the first failure, or 0 */
	uint64_t done_ns;       /* when the last returned */
};

static void *arm_ten(void *arg)
{
	struct ten_arms *a = arg;
	chime_id_t id;

	for (unsigned i = 10; i < 20 && a->r == 0; i++)
		a->r = chime_arm(a->c, 0, now_ns() + HOUR, 0, i, &id);
	a->done_ns = now_ns();
	return NULL;
}

/*
 * After a planned stop, a session's arms wait for the next broker (the
 * public segment says the broker stopped: a record in its ring would live
 * only in this process, chime_open(3)), then return 0, and every one of
 * them is there for the next process. Before, they returned at once and
 * the close handed them over; a process that died first lost them.
 */
Test(restart, arms_after_a_planned_stop_wait_for_the_next_broker)
{
	struct ten_arms a = { 0 };
	chime_id_t id;
	pthread_t t;
	uint64_t up;
	int st;

	start("");
	a.c = open_armed("commit", 10, &id);
	kill(tb.pid, SIGTERM);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	cr_assert_eq(pthread_create(&t, NULL, arm_ten, &a), 0);
	usleep(200 * 1000);
	up = now_ns();
	restart(0, "");
	pthread_join(t, NULL);
	cr_assert_eq(a.r, 0, "an arm after the stop: %s", strerror(-a.r));
	cr_assert_geq(a.done_ns, up, "the arms returned before the next broker was started");
	chime_close(a.c);
	a.c = sopen_ok("commit");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20), 20, "timers armed after a planned stop were lost");
	chime_close(a.c);
}

Test(restart, arms_closed_while_no_broker_runs_reach_the_next_one_within_the_close)
{
	arms_then_close_across_a_restart(SIGKILL, false, 100);
}

/*
 * The same with a broker back late in the close's second (a slow start,
 * or systemd's RestartSec): the close tries every 50 ms, not on its
 * back-off. Before, its attempts came 0, 10, 30, 70, 150, 310 and 630 ms
 * in, and the next one (1270 ms) fell past its second: a broker back at
 * 750 ms was never tried, and the unread arms left with the process.
 */
Test(restart, arms_closed_while_no_broker_runs_reach_one_back_late_in_the_close)
{
	arms_then_close_across_a_restart(SIGKILL, false, 750);
}

struct dropper {
	int lfd;
	volatile int stop;
	unsigned taken;
};

/* A "broker" that takes each connection, holds it 20 ms without a word, and hangs up. */
static void *dropper_run(void *arg)
{
	struct dropper *d = arg;

	while (!d->stop) {
		struct pollfd p = { .fd = d->lfd, .events = POLLIN };
		int fd;

		if (poll(&p, 1, 50) <= 0)
			continue;
		fd = accept(d->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		d->taken++;
		usleep(20000);
		close(fd);
	}
	return NULL;
}

/*
 * A close waits a second for a broker to take its hello, and then for that
 * broker's answer; a broker that takes each hello and hangs up gives no
 * answer to wait for. Before, each hello taken stretched the close by the
 * 10 s an answer may take, up to the reconnect's whole window (8 s here:
 * the close took 8020 ms; found by a review).
 */
Test(restart, a_close_waits_no_longer_for_a_broker_that_hung_up_on_its_hello)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct dropper d = { .lfd = -1 };
	uint64_t t0, took;
	pthread_t t;
	chime_id_t id;
	chime_t *c;
	int st;

	setenv("CHIME_RECONNECT_S", "8", 1);
	start("-n 1");
	c = open_armed("dropped", 1, &id);
	unsetenv("CHIME_RECONNECT_S");
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	/* An arm left in the ring: the close has something to hand over, and reconnects for it. */
	(void)chime_arm(c, 0, now_ns() + HOUR, 0, 1, &id);
	strcpy(sa.sun_path, tb.sock);
	unlink(tb.sock);
	d.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	cr_assert_geq(d.lfd, 0);
	cr_assert_eq(bind(d.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0, "bind: %s", strerror(errno));
	cr_assert_eq(listen(d.lfd, 16), 0);
	cr_assert_eq(pthread_create(&t, NULL, dropper_run, &d), 0);
	t0 = now_ns();
	chime_close(c);
	took = now_ns() - t0;
	d.stop = 1;
	pthread_join(t, NULL);
	close(d.lfd);
	unlink(tb.sock);
	fprintf(stderr, "close took %.0f ms, %u hellos taken and dropped\n", (double)took / 1e6, d.taken);
	cr_assert_lt(took, 2500 * MS,
		     "chime_close took %.0f ms against a broker that hung up on each of %u hellos (chime_close(3): "
		     "at most 1 s for one to listen, then its answer)", (double)took / 1e6, d.taken);
}

static pid_t chimed_spawn(int *errfd, const char *extra);

/*
 * The same with a next broker whose restore outlasts the close's second:
 * its control thread is held under ptrace for 1.2 s once it is "taking
 * over" (a restore of full shards: about 0.4-0.7 s per 4M timers on this
 * 2-core host, shard after shard). It listens before it restores, so the
 * close's connection waits in its queue and is answered once the shards
 * are done. Before, the socket came last, the close found none for its
 * whole second and gave up: the 10 arms left with the process.
 */
Test(restart, arms_closed_while_the_next_broker_restores_reach_it)
{
	char line[1024];
	pthread_t t;
	chime_t *c;
	FILE *f;
	int fd, st, r;
	pid_t pid;

	c = armed_across_a_stop(SIGKILL);
	cr_assert_eq(pthread_create(&t, NULL, close_thread, c), 0);
	usleep(100 * 1000);     /* systemd's RestartSec */
	pid = chimed_spawn(&fd, "");
	f = fdopen(fd, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f) && !strstr(line, "taking over"))
		;
	r = t_thread_hold(pid);
	if (r == -EPERM || r == -EACCES) {
		kill(pid, SIGKILL);
		pthread_join(t, NULL);
		cr_skip("ptrace(PTRACE_SEIZE) of chimed's control thread: %s", strerror(-r));
	}
	tb.pid = pid;
	cr_assert_eq(r, 0, "chimed's control thread did not stop: %s", strerror(-r));
	usleep(1200 * 1000);
	cr_assert_eq(t_thread_release(pid), 0);
	pthread_join(t, NULL);
	while (fgets(line, sizeof(line), f) && !strstr(line, "listening"))
		;
	c = sopen_ok("commit");
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20), 20,
		     "timers armed just before a close were lost while the next broker restored");
	chime_close(c);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	fclose(f);
}

/*
 * A session re-attached for longer than --session-linger: a crash then must
 * not make the next broker reclaim it (the sessions file had kept the
 * deadline of its last detach, already past).
 */
Test(restart, a_reattached_session_outlives_a_crash_after_its_old_linger)
{
	struct chime_event ev;
	chime_t *c;
	chime_id_t id;

	start("--session-linger 1");
	c = open_armed("again", 10, &id);
	chime_close(c);                 /* detached: kept for 1 s */
	c = sopen_ok("again");          /* re-attached in time */
	usleep(1500 * 1000);            /* past the detach's deadline, attached all along */
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10);
	restart(SIGKILL, "--session-linger 1");
	/* the process carries on: its library reconnects to the next broker */
	cr_assert_eq(chime_wait(c, &ev, 1, 300), 0);
	usleep(1500 * 1000);            /* the next broker's heartbeats */
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "the re-attached session was reclaimed after the crash");
	cr_assert_eq(chime_reset(c, id, now_ns()), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1, "its timer is gone");
	cr_assert_eq(ev.id, id);
	chime_close(c);
}

/* Take exactly `want` events already fired (chime_poll, no waiting), counting each in seen[user_data]. */
static void take(chime_t *c, struct chime_event *ev, unsigned want, uint8_t *seen)
{
	for (unsigned taken = 0; taken < want;) {
		int r = chime_poll(c, ev, want - taken);

		cr_assert_gt(r, 0, "fired events are missing");
		for (int i = 0; i < r; i++)
			seen[ev[i].user_data]++;
		taken += (unsigned)r;
	}
}

/* ---- (7) chimectl restart: in place, under load, nothing lost or twice ---- */

Test(restart, chimectl_restart_hands_over_in_place_under_load)
{
	const char *ctl = getenv("CHIMECTL");
	static struct chime_event ev[4096];
	static uint8_t seen[2000];
	char cmd[600];
	uint64_t t0;
	unsigned n;
	chime_t *c;
	chime_id_t id;
	int pid;

	cr_assert_not_null(ctl);
	start("-n 2");
	pid = tb.pid;
	c = sopen_ok("handover");
	t0 = now_ns();
	/* 1000 already fired (in the ring, half of them taken), 1000 due after the restart. */
	for (unsigned i = 0; i < 2000; i++)
		cr_assert_eq(chime_arm(c, 0, t0 + (i < 1000 ? 50 * MS : 1500 * MS + i * 100000), 0, i, &id), 0);
	usleep(300 * 1000);
	take(c, ev, 500, seen);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' restart >/dev/null", ctl, tb.sock);
	cr_assert_eq(system(cmd), 0, "chimectl restart failed");
	/* In place: the same process runs the new broker (systemd's MAINPID), which says so in its segment. */
	cr_assert(t_alive(pid), "the broker's process is gone");
	cr_assert(t_broker_running(tb.sock, pid), "the broker running is not process %d", pid);
	/* The process goes on with the same handle: libchime reconnected to the new broker. */
	n = collect(c, ev, 4096, t0 + 2000 * MS + 500 * MS);
	for (unsigned k = 0; k < n; k++)
		seen[ev[k].user_data]++;
	for (unsigned i = 0; i < 2000; i++)
		cr_assert_eq(seen[i], 1, "timer %u delivered %u times across the restart", i, seen[i]);
	chime_close(c);
}

/*
 * A broker started with --fresh executed itself again with --fresh on
 * chimectl restart, and the new one discarded every session the old one
 * had just handed over: the restart that loses nothing lost everything.
 * --fresh is for the first start only.
 */
Test(restart, chimectl_restart_of_a_broker_started_fresh_keeps_the_sessions)
{
	const char *ctl = getenv("CHIMECTL");
	char cmd[600];
	chime_t *c;
	chime_id_t id;
	int pid;

	cr_assert_not_null(ctl);
	start("--fresh -n 2");
	pid = tb.pid;
	c = open_armed("kept", 10, &id);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' restart >/dev/null", ctl, tb.sock);
	cr_assert_eq(system(cmd), 0, "chimectl restart failed");
	cr_assert(t_broker_running(tb.sock, pid), "the broker running is not process %d", pid);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10, "the session's timers are gone");
	/* And the session is there to attach to, its ids valid. */
	c = sopen_ok("kept");
	cr_assert_eq(chime_cancel(c, id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 9), 9);
	chime_close(c);
}

/* ---- (8) a session's process keeps arming, resetting, cancelling and draining through restarts ---- */

enum { N8 = 2400, LAG8 = 40 };

/* Timer i: i % 3 == 0 fires as armed; 1: armed far, reset near LAG8 timers later; 2: armed far, cancelled then. */
struct t8 {
	chime_t *c;
	chime_id_t id[N8];
	uint64_t deadline[N8];          /* the near deadline it was armed or reset to (atomic) */
	int err;                        /* the first error a call returned (atomic) */
	unsigned done;                  /* atomic: the producer finished */
	uint16_t got[N8];
};

static void t8_touch(struct t8 *s, unsigned j, uint64_t *rng)
{
	uint64_t near = now_ns() + (50 + splitmix64(rng) % 250) * MS;
	int r = 0;

	if (j % 3 == 1) {
		__atomic_store_n(&s->deadline[j], near, __ATOMIC_RELEASE);
		r = chime_reset(s->c, s->id[j], near);      /* an id from before a restart, often */
	} else if (j % 3 == 2) {
		r = chime_cancel(s->c, s->id[j]);
	}
	if (r)
		__atomic_store_n(&s->err, r, __ATOMIC_RELEASE);
}

static void *t8_producer(void *arg)
{
	struct t8 *s = arg;
	uint64_t rng = 8;

	for (unsigned i = 0; i < N8 && !__atomic_load_n(&s->err, __ATOMIC_ACQUIRE); i++) {
		uint64_t near = now_ns() + (50 + splitmix64(&rng) % 250) * MS;
		int r;

		__atomic_store_n(&s->deadline[i], near, __ATOMIC_RELEASE);
		/* Blocks while no broker runs, as on a full ring: never an error, never a lost record. */
		r = chime_arm(s->c, 0, i % 3 ? now_ns() + HOUR : near, 0, i, &s->id[i]);
		if (r)
			__atomic_store_n(&s->err, r, __ATOMIC_RELEASE);
		if (i >= LAG8)
			t8_touch(s, i - LAG8, &rng);
		usleep(1000);
	}
	for (unsigned j = N8 - LAG8; j < N8; j++)
		t8_touch(s, j, &rng);
	__atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Drain for `ms`, never early, counting each timer's events. */
static void t8_drain(struct t8 *s, unsigned ms)
{
	uint64_t until = now_ns() + ms * MS;
	struct chime_event ev[64];

	while (now_ns() < until) {
		int r = chime_wait(s->c, ev, 64, 20);

		cr_assert_geq(r, 0, "chime_wait: %s (the process saw the restart)", strerror(-r));
		for (int k = 0; k < r; k++) {
			unsigned i = (unsigned)ev[k].user_data;

			cr_assert_lt(i, N8);
			cr_assert_neq(i % 3, 2, "cancelled timer %u fired", i);
			cr_assert_geq(ev[k].fired_ns, ev[k].deadline_ns, "timer %u fired early", i);
			cr_assert_geq(ev[k].deadline_ns, __atomic_load_n(&s->deadline[i], __ATOMIC_ACQUIRE),
				      "timer %u fired at a deadline before its last one", i);
			s->got[i]++;
		}
	}
}

/*
 * `sig` restarts the broker three times while one thread arms, resets and
 * cancels (ids from before a restart too) and this one drains: no call
 * fails, chime_fd() keeps its number, every timer fires, none early, no
 * cancelled one; `exactly`: each once.
 */
static void through_restarts(int sig, bool exactly)
{
	struct t8 *s = calloc(1, sizeof(*s));
	unsigned dups = 0;
	pthread_t th;
	int fd;

	cr_assert_not_null(s);
	start("-n 2");
	s->c = sopen_ok("through");
	fd = chime_fd(s->c);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pthread_create(&th, NULL, t8_producer, s), 0);
	/* The stress suite (CHIME_STRESS=1) restarts it 12 times. */
	int rounds = getenv("CHIME_STRESS") && atoi(getenv("CHIME_STRESS")) > 0 ? 12 : 3;

	for (int round = 0; round < rounds; round++) {
		t8_drain(s, round < 3 ? 600 : 200);
		restart(sig, "-n 2");
	}
	while (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE))
		t8_drain(s, 100);
	pthread_join(th, NULL);
	cr_assert_eq(s->err, 0, "a call failed across a restart: %s", strerror(-s->err));
	t8_drain(s, 700);
	cr_assert_eq(chime_fd(s->c), fd, "chime_fd() changed");
	/* The grants carried for re-submitted ARMs are gone: only the live rings' (sq_size a shard). */
	cr_assert_eq(t_nodes_settle(tb.sock, 1u << CHIME_NODE_GRANTED, 2 * 1024), 2 * 1024,
		     "grants carried across a restart were never freed");
	for (unsigned i = 0; i < N8; i++) {
		if (i % 3 == 2)
			continue;
		cr_assert_geq(s->got[i], 1, "timer %u was lost", i);
		dups += s->got[i] - 1u;
		if (exactly)
			cr_assert_eq(s->got[i], 1, "timer %u delivered %u times", i, s->got[i]);
	}
	if (dups)
		cr_log_info("%u events delivered again after a crash (at-least-once)", dups);
	chime_close(s->c);
	free(s);
}

Test(restart, a_session_process_keeps_working_through_planned_restarts_exactly_once)
{
	through_restarts(SIGTERM, true);
}

Test(restart, a_session_process_keeps_working_through_crashes_losing_nothing)
{
	through_restarts(SIGKILL, true);
}

struct crash_later {
	unsigned after_ms;
	int pid;
	bool killed;            /* atomic */
};

/* Kill the broker later; the test's own thread starts the next (PR_SET_PDEATHSIG is the forking thread's). */
static void *crash_later_run(void *arg)
{
	struct crash_later *k = arg;

	usleep(k->after_ms * 1000u);
	kill(k->pid, SIGKILL);
	__atomic_store_n(&k->killed, true, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * A loop told only of changes of chime_fd() (EPOLLET; an io_uring multishot
 * poll is the same) through a crash of the broker while events flow: every
 * one arrives. The drain that read the dead socket's hang-up returned 0 and
 * left the reconnect for the next call, with the fd readable from that
 * hang-up and nothing new to report: the loop slept on for good (found by
 * an adopter's io_uring loop; 6680 events of 20000, then none).
 */
Test(restart, an_edge_triggered_loop_on_chime_fd_gets_every_event_through_a_crash)
{
	enum { N = 300 };
	struct crash_later k = { .after_ms = 800 };
	bool restarted = false;
	struct epoll_event ee = { .events = EPOLLIN | EPOLLET };
	struct chime_event ev[16];
	unsigned got = 0, seen[N] = { 0 };
	uint64_t t0;
	pthread_t th;
	chime_t *c;
	chime_id_t id;
	int ep, fd, n;

	start("-n 2");
	c = sopen_ok("edge");
	fd = chime_fd(c);
	cr_assert_geq(fd, 0);
	ep = epoll_create1(EPOLL_CLOEXEC);
	cr_assert_geq(ep, 0);
	cr_assert_eq(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ee), 0);
	t0 = chime_now();
	for (unsigned i = 0; i < N; i++)        /* one every 10 ms for 3 s */
		cr_assert_eq(chime_arm(c, 0, t0 + 10 * MS * (i + 1), 0, i, &id), 0);
	k.pid = tb.pid;
	cr_assert_eq(pthread_create(&th, NULL, crash_later_run, &k), 0);
	while (got < N) {
		while ((n = chime_poll(c, ev, 16)) > 0)
			for (int i = 0; i < n; i++) {
				cr_assert_lt(ev[i].user_data, N);
				got += !seen[ev[i].user_data]++;
			}
		cr_assert_eq(n, 0, "chime_poll: %s", strerror(-n));
		if (got == N)
			break;
		if (!restarted && __atomic_load_n(&k.killed, __ATOMIC_ACQUIRE)) {
			restart(0, "-n 2");     /* reaps the killed one */
			restarted = true;
		}
		n = epoll_wait(ep, &ee, 1, 3000);
		cr_assert_geq(n, 0);
		if (n == 0) {
			struct pollfd p = { .fd = fd, .events = POLLIN };

			cr_assert_fail("no change of chime_fd() for 3 s with %u of %u events delivered (the fd %s readable)",
				got, N, poll(&p, 1, 0) == 1 ? "is" : "is not");
		}
	}
	pthread_join(th, NULL);
	cr_assert(restarted);
	chime_close(c);
	close(ep);
}

/* A broker the session cannot resume with (other ring sizes): -ENOTCONN, as an anonymous connection. */
Test(restart, a_broker_with_other_rings_ends_the_reconnect_with_enotconn)
{
	struct chime_event ev;
	chime_id_t id, id2;
	chime_t *c;
	int r = 0;

	start("-n 1");
	c = sopen_ok("other");
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 1, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1);
	restart(SIGTERM, "-n 1 --sq-size 64");
	for (int i = 0; i < 500 && (r = chime_wait(c, &ev, 1, 10)) == 0; i++)
		;
	cr_assert_eq(r, -ENOTCONN, "chime_wait: %d", r);
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 2, &id2), -ENOTCONN);
	chime_close(c);
	/* The timer is still the session's: a new process, with the new rings, cancels it by its id. */
	c = sopen_ok("other");
	cr_assert_eq(chime_cancel(c, id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 0), 0, "the old id did not cancel its timer");
	chime_close(c);
}

/*
 * A reconnect attempt that leaves the broker's messages unread for a while
 * (no call into the library for longer than the broker's HELLO_TIMEOUT_S,
 * 2 s): the broker withdraws the welcome with -ETIMEDOUT and, both still
 * unread, keeps the socket and the session's slot (control.c, held_fd)
 * until they are read or dropped. The library reads the welcome at its
 * next call and then either reads the status too (same rings: the attempt
 * failed, the next one reattaches) or abandons the welcome with the status
 * unread behind it (other rings: -ENOTCONN) and closes the socket. Either
 * way nothing stays held: a close drops what is unread before the broker
 * sees the hang-up, and the next hello finds the socket drained. Kept
 * open instead (a socket shut down but not closed, or leaked), the slot
 * stays held: the next open waits HELD_WAIT_NS (1 s) and gets -EBUSY, and
 * the library's own next attempts get the same until its window ends.
 */
static void a_reconnect_welcome_left_unread(bool other_rings)
{
	struct chime_event ev;
	uint64_t t0, took;
	int r = 0, queued = 0, st;
	chime_t *c;

	start("-n 1");
	c = sopen_ok("unread");
	restart(SIGTERM, other_rings ? "-n 1 --sq-size 64" : "-n 1");
	/*
	 * Calls until one has sent the attempt's hello (white box), then none.
	 * The broker stopped meanwhile: on a loaded host, woken by each send,
	 * it answered the hello and the mapped answer before the call went on,
	 * and the whole attempt was over within the call that began it.
	 */
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	cr_assert_eq(waitpid(tb.pid, &st, WUNTRACED), tb.pid);
	cr_assert(WIFSTOPPED(st));
	for (int i = 0; i < 1000 && c->recon_sock < 0; i++) {
		cr_assert_eq(chime_poll(c, &ev, 1), 0);
		usleep(1000);
	}
	cr_assert_eq(kill(tb.pid, SIGCONT), 0);
	cr_assert_geq(c->recon_sock, 0, "no reconnect attempt began");
	/* The welcome, then (2 s later) the broker's -ETIMEDOUT behind it, both unread. */
	for (t0 = now_ns(); now_ns() - t0 < 5000 * MS; usleep(10000)) {
		cr_assert_eq(ioctl(c->recon_sock, FIONREAD, &queued), 0);
		if (queued >= 2 * (int)sizeof(struct chime_welcome))
			break;
	}
	cr_assert_eq(queued, 2 * (int)sizeof(struct chime_welcome),
		     "%d bytes unread, not a welcome and the status that withdrew it", queued);
	t0 = now_ns();
	if (other_rings) {
		cr_assert_eq(chime_poll(c, &ev, 1), -ENOTCONN, "the welcome of other rings was taken");
		chime_close(c);
		r = sopen(&c, "unread");
		took = now_ns() - t0;
		cr_assert_eq(r, 0, "the next process's open: %s", strerror(-r));
	} else {
		uint64_t before = c->reconnects;

		while (c->reconnects == before && now_ns() - t0 < 5000 * MS)
			cr_assert_geq(r = chime_wait(c, &ev, 1, 10), 0, "chime_wait: %s", strerror(-r));
		took = now_ns() - t0;
		cr_assert_eq(c->reconnects, before + 1, "not reconnected within 5 s");
	}
	cr_log_info("%s after %.1f ms", other_rings ? "the next open" : "reconnected", (double)took / 1e6);
	cr_assert_lt(took, 500 * MS, "%s after %.0f ms: the broker held the abandoned attempt's socket",
		     other_rings ? "the next open" : "reconnected", (double)took / 1e6);
	chime_close(c);
}

Test(restart, a_reconnect_welcome_withdrawn_while_unread_holds_nothing_once_read)
{
	a_reconnect_welcome_left_unread(false);
}

Test(restart, a_reconnect_welcome_abandoned_with_a_status_unread_behind_it_holds_nothing)
{
	a_reconnect_welcome_left_unread(true);
}

/*
 * Both sides of exactly-once across a crash, for a process that lives on:
 * of 400 events in its ring when chimed is SIGKILLed, it took 200; the
 * new broker (told the old ring's head on resume) delivers the other 200,
 * each once, and none of those it took.
 *
 * With `second`, a second broker comes and goes (that signal) before the
 * process reconnects (a crash loop, or a `chimectl restart` of the new
 * broker while the library waits in its back-off): the events the first
 * one delivered are still "delivered, maybe taken" for the third, and the
 * old ring's head the process sends it still settles them. Before, the
 * second broker's restore left them as plain held events, and the third
 * delivered the 200 the process had taken again.
 */
static void a_living_process_through_restarts(int second)
{
	struct chime_event ev[512];
	uint8_t seen[400] = { 0 };
	unsigned n;
	chime_id_t id;
	uint64_t t0;
	chime_t *c;

	start("-n 2");
	c = sopen_ok("living");
	t0 = now_ns();
	for (unsigned i = 0; i < 400; i++)
		cr_assert_eq(chime_arm(c, 0, t0 + 20 * MS, 0, i, &id), 0);
	ring_holds(c, 400);
	take(c, ev, 200, seen);
	/* No call into the library meanwhile: it cannot reconnect to the second broker. */
	restart(SIGKILL, "-n 2");
	if (second)
		restart(second, "-n 2");
	n = collect(c, ev, 512, now_ns() + 1500 * MS);
	for (unsigned k = 0; k < n; k++)
		seen[ev[k].user_data]++;
	for (unsigned i = 0; i < 400; i++)
		cr_assert_eq(seen[i], 1, "timer %u delivered %u times across the restarts", i, seen[i]);
	cr_assert_eq(n, 200, "%u events after the restarts, not the 200 untaken ones", n);
	/* And the session goes on: nothing held back waits for a word that never comes. */
	cr_assert_eq(chime_arm(c, 0, now_ns() + 10 * MS, 0, 400, &id), 0);
	cr_assert_eq(collect(c, ev, 1, now_ns() + 2000 * MS), 1, "a timer armed after the restarts never fired");
	cr_assert_eq(ev[0].user_data, 400);
	chime_close(c);
}

Test(restart, a_crash_under_a_living_process_delivers_what_it_did_not_take_exactly_once)
{
	a_living_process_through_restarts(0);
}

Test(restart, a_second_crash_before_the_process_resumes_still_delivers_exactly_once)
{
	a_living_process_through_restarts(SIGKILL);
}

Test(restart, a_planned_restart_before_the_process_resumes_still_delivers_exactly_once)
{
	a_living_process_through_restarts(SIGTERM);
}
/* Shard 0's file of the broker at tb.sock, opened with flags; its wheel header in *w, its slab's offset in *slab. */
static int shard0_open(int flags, struct chime_wheel *w, uint64_t *slab)
{
	char path[PATH_MAX];
	struct chime_shard_seg h;
	int fd;

	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	fd = open(path, flags);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_eq(pread(fd, w, sizeof(*w), (off_t)h.wheel_off), (ssize_t)sizeof(*w));
	*slab = h.wheel_off + w->slab_off;
	return fd;
}


/*
 * The state a SIGKILL leaves between the wheel's pop of a due timer and its
 * firing (ALLOC, off every list, its deadline at or before the wheel's
 * now), made by hand: the next broker fires it, once; before, it took it
 * for a grant and the session's next process freed it. And the state it
 * leaves in the middle of a cancel (ALLOC, off its list, not due): that
 * one stays cancelled.
 */
Test(restart, a_timer_popped_when_the_broker_died_fires_and_one_being_cancelled_does_not)
{
	struct chime_event ev[8];
	struct chime_wheel w;
	struct chime_node nd;
	uint64_t off, popped = 0;
	chime_id_t id;
	unsigned n;
	chime_t *c;
	int fd, st;

	start("-n 1");
	c = open_armed("popped", 3, &id);
	chime_close(c);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	fd = shard0_open(O_RDWR, &w, &off);
	for (uint32_t i = 0; i < w.high_water; i++) {
		cr_assert_eq(pread(fd, &nd, sizeof(nd), (off_t)(off + i * sizeof(nd))), (ssize_t)sizeof(nd));
		if (nd.state != CHIME_NODE_ARMED || nd.user_data == 0)
			continue;
		/* What pop_one() leaves (1), and wheel_cancel() (2): off its list, ALLOC. */
		nd.state = CHIME_NODE_ALLOC;
		nd.next = nd.prev = CHIME_NIL;
		if (nd.user_data == 1)
			nd.deadline_ns = popped = w.now_ns;     /* due at the old wheel's now */
		cr_assert_eq(pwrite(fd, &nd, sizeof(nd), (off_t)(off + i * sizeof(nd))), (ssize_t)sizeof(nd));
	}
	close(fd);
	cr_assert_neq(popped, 0, "no armed node with user_data 1 in the file");
	restart(0, "-n 1");
	c = sopen_ok("popped");
	n = collect(c, ev, 8, now_ns() + 500 * MS);
	cr_assert_eq(n, 1, "%u events, not the one popped timer", n);
	cr_assert_eq(ev[0].user_data, 1);
	cr_assert_eq(ev[0].deadline_ns, popped);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1, "the timer not due is not armed, or the cancelled one is");
	chime_close(c);
}

/*
 * SIGKILL the broker and pass every node of shard 0's file through
 * edit(node, the old wheel's now, arg), which returns true to write it back.
 */
static void edit_nodes(bool (*edit)(struct chime_node *, uint64_t, void *), void *arg)
{
	struct chime_wheel w;
	struct chime_node nd;
	uint64_t off;
	int fd, st;

	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	fd = shard0_open(O_RDWR, &w, &off);
	for (uint32_t i = 0; i < w.high_water; i++) {
		cr_assert_eq(pread(fd, &nd, sizeof(nd), (off_t)(off + i * sizeof(nd))), (ssize_t)sizeof(nd));
		if (edit(&nd, w.now_ns, arg))
			cr_assert_eq(pwrite(fd, &nd, sizeof(nd), (off_t)(off + i * sizeof(nd))), (ssize_t)sizeof(nd));
	}
	close(fd);
}

/* chan.h's CHAN_POS_AT: in cq_pos, the deadline of the event a park or a restore is holding again. */
#define POS_AT (UINT64_C(1) << 62)
enum { HELD_STEPS = 5 };

/*
 * A session of `steps` periodic timers an hour ahead, each node then
 * written by edit() as a step of a cut-short store sequence (its deadline
 * into deadline[i]), and the next broker's events to the session's next
 * process: into ev (at most max), their count in *n. Returns that process's
 * handle.
 */
static chime_t *periodics_edited_and_restored(const char *name, unsigned steps, uint64_t period,
					      bool (*edit)(struct chime_node *, uint64_t, void *), uint64_t *deadline,
					      struct chime_event *ev, unsigned max, unsigned *n)
{
	chime_id_t id;
	chime_t *c;

	start("-n 1");
	c = sopen_ok(name);
	for (unsigned i = 0; i < steps; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, period, i, &id), 0);
	chime_close(c);
	edit_nodes(edit, deadline);
	for (unsigned i = 0; i < steps; i++)
		cr_assert_neq(deadline[i], 0, "periodic %u is not in the file", i);
	restart(0, "-n 1");
	c = sopen_ok(name);
	*n = collect(c, ev, max, now_ns() + 500 * MS);
	return c;
}

/*
 * Periodic i (user_data i, an hour's period) as step i of chan_hold_at()
 * left it, holding an event of deadline old_now - (i + 1) ms: tagged, then
 * off the wheel (ALLOC), then with that deadline, then BACKLOG, then the
 * tag cleared.
 */
static bool held_step(struct chime_node *nd, uint64_t old_now, void *arg)
{
	uint64_t *deadline = arg, d = old_now - (nd->user_data + 1) * MS;
	unsigned i = (unsigned)nd->user_data;

	if (nd->state != CHIME_NODE_ARMED || nd->period_ns != HOUR || i >= HELD_STEPS)
		return false;
	deadline[i] = d;
	nd->deadline_ns = d + HOUR;     /* the next period's, as the wheel has it */
	nd->cq_pos = i < 4 ? POS_AT | d : CHIME_POS_NONE;
	if (i >= 1) {
		nd->state = CHIME_NODE_ALLOC;
		nd->next = nd->prev = CHIME_NIL;
	}
	if (i >= 2)
		nd->deadline_ns = d;
	if (i >= 3)
		nd->state = CHIME_NODE_BACKLOG;
	return true;
}

/*
 * A park holds a periodic's untaken event again (as a restore does for
 * one whose event was in the old ring) in steps, each a store in the
 * shard file. A broker killed after any of them: the next one holds that
 * event, once, at its deadline, and the timer goes on. Before, the park
 * took the timer off the wheel first, and that step's node (ALLOC, the
 * next period's deadline, not due) was taken for a cancel and freed: the
 * timer was lost (step 1 here, tagged as the park now tags it first).
 */
Test(restart, a_periodic_being_held_again_when_the_broker_died_comes_back_once)
{
	uint64_t deadline[HELD_STEPS] = { 0 };
	uint8_t seen[HELD_STEPS] = { 0 };
	struct chime_event ev[16];
	unsigned n;
	chime_t *c;

	c = periodics_edited_and_restored("held", HELD_STEPS, HOUR, held_step, deadline, ev, 16, &n);
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (unsigned)ev[k].user_data;

		cr_assert_lt(i, HELD_STEPS);
		cr_assert_eq(seen[i]++, 0, "step %u's event came twice", i);
		cr_assert_eq(ev[k].deadline_ns, deadline[i], "step %u's event came at another deadline", i);
	}
	for (unsigned i = 0; i < HELD_STEPS; i++)
		cr_assert_eq(seen[i], 1, "step %u's event was lost", i);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, HELD_STEPS), HELD_STEPS,
		     "not every periodic is armed again for its next period");
	chime_close(c);
}

/*
 * Periodic 0 (an hour's period) as deliver() leaves it while it re-arms
 * the timer it just delivered, its event (deadline old_now - 1 ms) at ring
 * position 0: ALLOC, that position, and already the next period's deadline
 * (wheel_rearm_periodic() stores it before the wheel makes the node ARMED).
 */
static bool rearming(struct chime_node *nd, uint64_t old_now, void *arg)
{
	uint64_t *deadline = arg;

	if (nd->state != CHIME_NODE_ARMED || nd->period_ns != HOUR || nd->user_data != 0)
		return false;
	*deadline = old_now - MS;
	nd->deadline_ns = *deadline + HOUR;
	nd->cq_pos = 0;
	nd->state = CHIME_NODE_ALLOC;
	nd->next = nd->prev = CHIME_NIL;
	return true;
}

/*
 * A broker killed while it re-arms a periodic it has just delivered: the
 * next one delivers that event again (its process may not have taken it)
 * and the timer goes on. Before, the node (ALLOC, a deadline not due) was
 * taken for a cancel in progress and freed: the timer was lost.
 */
Test(restart, a_periodic_being_re_armed_after_its_event_when_the_broker_died_goes_on)
{
	struct chime_event ev[4];
	uint64_t deadline = 0;
	chime_id_t id;
	unsigned n;
	chime_t *c;

	start("-n 1");
	c = sopen_ok("rearm");
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, HOUR, 0, &id), 0);
	chime_close(c);
	edit_nodes(rearming, &deadline);
	cr_assert_neq(deadline, 0, "the periodic is not in the file");
	restart(0, "-n 1");
	c = sopen_ok("rearm");
	n = collect(c, ev, 4, now_ns() + 500 * MS);
	cr_assert_eq(n, 1, "%u events, not the one the broker had delivered", n);
	cr_assert_eq(ev[0].id, id);
	cr_assert_eq(ev[0].deadline_ns, deadline);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1, "the periodic is not armed for its next period");
	chime_close(c);
}

enum { DUE_STEPS = 5 };
#define DUE_PERIOD (10000 * MS)

/*
 * Periodic i (user_data i, a 10 s period) as deliver() leaves it at each
 * step of delivering its event of deadline d = old_now - 15 s - (i + 1)
 * ms at ring position i, when the next period's (d + 10 s) is due already
 * (a periodic behind, catching up): tagged CHAN_POS_AT | d (0); the next
 * deadline stored (1); back on the wheel, due (2); the position stored
 * (3). And (4) the state the order before this change left between its
 * position and the wheel: ALLOC with the position and the next deadline.
 */
static bool due_again_step(struct chime_node *nd, uint64_t old_now, void *arg)
{
	uint64_t *deadline = arg, d = old_now - 3 * DUE_PERIOD / 2 - (nd->user_data + 1) * MS;
	unsigned i = (unsigned)nd->user_data;

	if (nd->state != CHIME_NODE_ARMED || nd->period_ns != DUE_PERIOD || i >= DUE_STEPS)
		return false;
	deadline[i] = d;
	nd->next = nd->prev = CHIME_NIL;
	nd->state = i == 2 || i == 3 ? CHIME_NODE_EXPIRED : CHIME_NODE_ALLOC;
	nd->deadline_ns = i == 0 ? d : d + DUE_PERIOD;
	nd->cq_pos = i < 3 ? POS_AT | d : i;
	return true;
}

/*
 * A broker killed while it delivers an event of a periodic timer whose
 * next period is due already: the next one delivers that event and then
 * the next, each once, at their deadlines, and the timer goes on. Before,
 * step 4's node (the next deadline stored, not yet on the wheel) was read
 * as fired at that deadline: one event came, for both periods.
 */
Test(restart, a_periodic_due_again_when_its_delivery_was_cut_short_comes_twice_not_once)
{
	uint64_t deadline[DUE_STEPS] = { 0 };
	uint8_t seen[DUE_STEPS][2] = { { 0 } };
	struct chime_event ev[32];
	unsigned n;
	chime_t *c;

	c = periodics_edited_and_restored("behind", DUE_STEPS, DUE_PERIOD, due_again_step, deadline, ev, 32, &n);
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (unsigned)ev[k].user_data;
		uint64_t d;

		cr_assert_lt(i, DUE_STEPS);
		d = ev[k].deadline_ns;
		cr_assert(d == deadline[i] || d == deadline[i] + DUE_PERIOD,
			  "step %u: an event of deadline old_now%+lld ms", i,
			  (long long)(d - deadline[i]) / (long long)MS);
		cr_assert_eq(seen[i][d != deadline[i]]++, 0, "step %u's event of +%u periods came twice", i,
			     d != deadline[i]);
	}
	for (unsigned i = 0; i < DUE_STEPS; i++) {
		cr_assert_eq(seen[i][0], 1, "step %u: the event being delivered was lost", i);
		cr_assert_eq(seen[i][1], 1, "step %u: the next period's event was lost", i);
	}
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, DUE_STEPS), DUE_STEPS,
		     "not every periodic is armed again for its next period");
	chime_close(c);
}

/*
 * A broker killed at any instruction of an operation on one node: the
 * shard thread is held under ptrace (t_thread_hold()) with the work in its
 * queue, then single-stepped, and the node (read from the shard file
 * after every instruction) is kept each time it changed, until done(node)
 * says the operation is over. Then the broker is SIGKILLed, and each image
 * is put back by the caller, one restart at a time: every state the shard
 * file went through, not only those a test thought of. Returns how many
 * images (the first: the node before the operation).
 */
static unsigned step_images(int tid, const char *path, uint64_t off, struct chime_node *img, unsigned max,
			    bool (*done)(const struct chime_node *, const void *), const void *arg)
{
	struct chime_node nd;
	unsigned n = 1;
	uint64_t steps;
	int fd = open(path, O_RDONLY), st, r = 0;
	bool over = false;

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, &img[0], sizeof(img[0]), (off_t)off), (ssize_t)sizeof(img[0]));
	for (steps = 0; steps < 50000000 && !over; steps++) {
		if ((r = t_thread_step(tid)) < 0 || pread(fd, &nd, sizeof(nd), (off_t)off) != (ssize_t)sizeof(nd))
			break;
		if (memcmp(&nd, &img[n - 1], sizeof(nd))) {
			if (n == max)
				break;
			img[n++] = nd;
		}
		over = done(&nd, arg);
	}
	close(fd);
	/* Killed before any assertion: the traced thread is ours to reap before its process can be. */
	kill(tb.pid, SIGKILL);
	(void)waitpid(tid, &st, __WALL);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	cr_assert_eq(r, 0, "single-stepping the shard thread: %s", strerror(-r));
	cr_assert(over, "the operation did not end in %llu instructions (%u states of the node, at most %u)",
		  (unsigned long long)steps, n, max);
	return n;
}

/* The index in shard 0's file of the one node with user_data ud and period period_ns, as a file offset; 0: none. */
static uint64_t node_find(uint64_t ud, uint64_t period_ns)
{
	struct chime_wheel w;
	struct chime_node nd;
	uint64_t off, found = 0;
	int fd;

	fd = shard0_open(O_RDONLY, &w, &off);
	for (uint32_t i = 0; i < w.high_water; i++) {
		cr_assert_eq(pread(fd, &nd, sizeof(nd), (off_t)(off + i * sizeof(nd))), (ssize_t)sizeof(nd));
		if (nd.state != CHIME_NODE_FREE && nd.state != CHIME_NODE_GRANTED && nd.user_data == ud &&
		    nd.period_ns == period_ns) {
			cr_assert_eq(found, 0, "two nodes of user_data %llu", (unsigned long long)ud);
			found = off + i * sizeof(nd);
		}
	}
	close(fd);
	return found;
}

/* node_find()'s node, there now. */
static uint64_t node_offset(uint64_t ud, uint64_t period_ns)
{
	uint64_t found = node_find(ud, period_ns);

	cr_assert_neq(found, 0, "no node of user_data %llu in the file", (unsigned long long)ud);
	return found;
}

/* What the reset tests' child and the test share. */
struct rs {
	uint64_t d1;            /* the periodic's first deadline */
	uint64_t period;
	uint64_t d2;            /* the reset's */
	int cancel;             /* cancel it instead */
	chime_id_t id;
	int go, done;
};

/* Arm the periodic, let its first event into the ring (not taken), then reset it when told, and wait to be killed. */
static void reset_child(int wfd, void *arg)
{
	struct rs *r = arg;
	chime_t *c = NULL;

	uint64_t t0 = now_ns();

	if (sopen(&c, "reset") < 0 || chime_arm(c, 0, r->d1, r->period, 0, &r->id) < 0)
		_exit(1);
	while (ring_count(c) < 1) {             /* its first event in the ring (ring_holds(), without asserts) */
		if (now_ns() - t0 > 5000 * MS)
			_exit(3);
		usleep(1000);
	}
	(void)!write(wfd, "r", 1);
	while (!__atomic_load_n(&r->go, __ATOMIC_ACQUIRE))
		usleep(1000);
	if ((r->cancel ? chime_cancel(c, r->id) : chime_reset(c, r->id, r->d2)) < 0)
		_exit(2);
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	pause();
}

static bool reset_done(const struct chime_node *nd, const void *arg)
{
	const struct rs *r = arg;

	if (r->cancel)
		return nd->state == CHIME_NODE_FREE;
	return nd->deadline_ns == r->d2 && nd->cq_pos == CHIME_POS_NONE;
}

static uint64_t behind_held(uint64_t d1);
static struct chime_node node_at(const char *path, uint64_t off);

/*
 * reset_child's reset of its periodic (r->period: HOUR, armed; BEHIND_PERIOD,
 * held behind its first event), the shard thread held, then single-stepped
 * through it (step_images()): the node's images in img[32], how many.
 * The shard file's path and the node's offset in path and *off.
 */
static unsigned reset_stepped(struct rs *r, char *path, uint64_t *off, struct chime_node *img)
{
	uint64_t t0;
	pid_t pid;
	int tid;

	start("-n 1");
	snprintf(path, PATH_MAX, "%s.shard0", tb.sock);
	pid = child(reset_child, r);
	if (r->period == HOUR) {
		/* the periodic re-armed an hour on behind the event, and the shard asleep (behind_held()'s wait) */
		int stid = t_thread_named(tb.pid, "chimed-shard0");

		*off = node_offset(0, HOUR);
		cr_assert_gt(stid, 0);
		for (t0 = now_ns(); node_at(path, *off).deadline_ns != r->d1 + HOUR || !t_thread_asleep(tb.pid, stid);
		     usleep(1000))
			cr_assert_lt(now_ns() - t0, 5000 * MS, "the periodic was not re-armed within 5 s");
	} else {
		*off = behind_held(r->d1);
	}
	tid = shard0_hold();
	__atomic_store_n(&r->go, 1, __ATOMIC_RELEASE);
	for (t0 = now_ns(); !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE); usleep(1000))
		cr_assert_lt(now_ns() - t0, 2000 * MS, "the child did not reset its timer");
	kill_child(pid);
	return step_images(tid, path, *off, img, 32, reset_done, r);
}

/* The node at off in the shard file at path. */
static struct chime_node node_at(const char *path, uint64_t off)
{
	struct chime_node nd;
	int fd = open(path, O_RDONLY);

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, &nd, sizeof(nd), (off_t)off), (ssize_t)sizeof(nd));
	close(fd);
	return nd;
}

/* Image img of the node put back at off, a broker started on the file, and the session opened. */
static chime_t *image_restored(const char *path, uint64_t off, const struct chime_node *img)
{
	int fd = open(path, O_RDWR);

	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, img, sizeof(*img), (off_t)off), (ssize_t)sizeof(*img));
	close(fd);
	restart(0, "-n 1");
	return sopen_ok("reset");
}

static void image_done(chime_t *c)
{
	int e;

	chime_close(c);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &e, 0), tb.pid);
	tb.pid = 0;
}

/*
 * A session's process resets a periodic whose event waits in its ring,
 * untaken, and dies; the broker applies the reset as it parks the session,
 * and is killed at any instruction of it (step_images()). The next broker
 * and the session's next process see the reset applied (no event, the
 * timer at the new deadline) or not applied (the event, once, and the
 * timer at the next period), never half of each. Before, the void
 * cleared the event's position before the deadline moved: a kill between
 * left the event gone and the timer where it was.
 */
/*
 * Each image of reset_stepped() (the reset of a periodic of `period`, first
 * due d1_ahead from now, to two hours after that) put back in turn, with a
 * broker started on it and the session opened: check() says whether what
 * the session gets is the reset applied or not. `what` names the image.
 */
typedef void reset_check_fn(const struct rs *r, const char *what, const char *path, uint64_t off, chime_t *c);

static void each_reset_image(uint64_t period, uint64_t d1_ahead, bool cancel, reset_check_fn *check)
{
	struct rs *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_node img[32];
	char path[PATH_MAX], what[160];
	unsigned nimg;
	uint64_t off;

	cr_assert_neq(r, MAP_FAILED);
	r->d1 = now_ns() + d1_ahead;
	r->period = period;
	r->d2 = r->d1 + 2 * HOUR;
	r->cancel = cancel;
	nimg = reset_stepped(r, path, &off, img);
	cr_assert_geq(nimg, 2);
	for (unsigned k = 0; k < nimg; k++) {
		chime_t *c = image_restored(path, off, &img[k]);

		snprintf(what, sizeof(what), "image %u of %u (state %u, cq_pos %#llx, deadline d1%+lld ms)", k, nimg,
			 img[k].state, (unsigned long long)img[k].cq_pos,
			 (long long)(img[k].deadline_ns - r->d1) / (long long)MS);
		check(r, what, path, off, c);
		image_done(c);
	}
	munmap(r, sizeof(*r));
}

/* The reset applied (no event, the timer at its deadline) or not (the event, once, and the next period). */
static void reset_whole(const struct rs *r, const char *what, const char *path, uint64_t off, chime_t *c)
{
	struct chime_event ev[4];
	struct chime_node nd;
	unsigned n = collect(c, ev, 4, now_ns() + 300 * MS);

	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1, "%s: the timer is not armed", what);
	nd = node_at(path, off);
	cr_assert((n == 0 && nd.deadline_ns == r->d2) ||
		  (n == 1 && ev[0].deadline_ns == r->d1 && nd.deadline_ns == r->d1 + HOUR),
		  "%s: %u events, then the timer at d1%+lld ms: neither the reset applied nor not", what, n,
		  (long long)(nd.deadline_ns - r->d1) / (long long)MS);
}

Test(restart, a_reset_cut_short_by_a_kill_is_applied_or_not_never_half)
{
	each_reset_image(HOUR, 50 * MS, false, reset_whole);
}

/* Nodes watched while the shard thread is single-stepped, as last read from the shard file. */
struct watch {
	int fd;
	unsigned n;
	uint64_t off[4];
	struct chime_node last[4];
};

static void watch_init(struct watch *w, const uint64_t *off, unsigned n)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	w->fd = open(path, O_RDONLY);
	cr_assert_geq(w->fd, 0);
	w->n = n;
	for (unsigned i = 0; i < n; i++) {
		w->off[i] = off[i];
		cr_assert_eq(pread(w->fd, &w->last[i], sizeof(w->last[i]), (off_t)off[i]), (ssize_t)sizeof(w->last[i]));
	}
}

/*
 * Single-step the held shard thread tid until the watched nodes have
 * changed `changes` times in the file (any store to any of them), calling
 * on_change(k, arg) after the k-th, or until done(w) or the thread sleeps
 * (t_thread_step(): 2 s in a system call); then SIGKILL the
 * broker, the traced thread reaped first. Returns the changes seen: a
 * broker killed after every one of them in turn (one run each, from the
 * same start) is a broker killed between any two stores the operation
 * makes to those nodes.
 */
static unsigned step_changes(int tid, struct watch *w, unsigned changes, bool (*done)(const struct watch *),
			     void (*on_change)(unsigned, void *), void *arg)
{
	bool exited = false;
	unsigned k = 0;
	int r = 0, st;

	for (uint64_t steps = 0; k < changes && !done(w) && steps < 50000000 && r == 0; steps++) {
		bool changed = false;

		if ((r = t_thread_step(tid)) < 0) {
			if (r == -ETIMEDOUT)
				r = 0;  /* asleep: nothing more comes by itself */
			/*
			 * The broker ended by itself: a stop that takes longer than
			 * its bound (5 s, control.c) stops with what is parked by
			 * then, and single steps on a loaded host can take that long.
			 * Where it ended is a kill point as good as the one asked for.
			 */
			for (int i = 0; r == -ECHILD && i < 2000; i++) {
				if (waitpid(tb.pid, &st, WNOHANG) == tb.pid) {
					fprintf(stderr, "step_changes: the broker ended by itself after %u of %u changes "
						"(a slow host)\n", k, changes);
					exited = true;
					r = 0;
				}
				usleep(1000);
			}
			break;
		}
		for (unsigned i = 0; i < w->n && r == 0; i++) {
			struct chime_node nd;

			if (pread(w->fd, &nd, sizeof(nd), (off_t)w->off[i]) != (ssize_t)sizeof(nd))
				r = -EIO;
			else if (memcmp(&nd, &w->last[i], sizeof(nd))) {
				w->last[i] = nd;
				changed = true;
			}
		}
		if (changed && ++k && on_change)
			on_change(k, arg);
	}
	close(w->fd);
	if (!exited) {
		kill(tb.pid, SIGKILL);
		(void)waitpid(tid, &st, __WALL);
		cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	}
	tb.pid = 0;
	cr_assert_eq(r, 0, "single-stepping the shard thread: %s", strerror(-r));
	return k;
}

/* The four timers of the two tests below, by user_data: one-shot A, periodic P, one-shot B, periodic Q. */
enum { T4_A, T4_P, T4_B, T4_Q, T4 };
/* Small rings: a shard single-stepped through an attach or a park goes through every grant. */
#define T4_OPTS "-n 1 --sq-size 8 --cq-size 16"

static uint64_t t4_period(unsigned i)
{
	return i & 1 ? HOUR : 0;
}

/*
 * Arm the four 20, 25, 30, 35 ms ahead (each periodic fires once within the
 * test) and wait until all are in the ring, published (ring_holds()), and
 * the shard thread asleep again: where a fixed 200 ms left them, without
 * the rest of it.
 */
static void t4_arm(chime_t *c, uint64_t *d, chime_id_t *ids)
{
	uint64_t t0 = now_ns();
	chime_id_t id;
	int tid;

	for (unsigned i = 0; i < T4; i++) {
		d[i] = t0 + (20 + 5 * i) * MS;
		cr_assert_eq(chime_arm(c, 0, d[i], t4_period(i), i, &id), 0);
		if (ids)
			ids[i] = id;
	}
	ring_holds(c, T4);
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0, "no thread chimed-shard0 in chimed %d", tb.pid);
	while (!t_thread_asleep(tb.pid, tid)) {
		cr_assert_lt(now_ns() - t0, 5000 * MS, "the shard did not sleep within 5 s");
		usleep(1000);
	}
}

/*
 * Whether nothing more can come to the process c from the broker now
 * running (one shard): it is connected, no node in the shard file is due
 * within a second (the periodics' next period and the other timers are an
 * hour ahead), popped to fire, held, or a one-shot's event not yet
 * consumed, and then, read after the nodes, its rings hold no event: one
 * published after that read came from a node in one of those states.
 */
static bool t4_quiet(chime_t *c)
{
	struct chime_wheel w;
	struct chime_node nd;
	uint64_t off, soon = now_ns() + 1000 * MS, have = 0;
	bool busy = cl_reconnecting(c);
	int fd = shard0_open(O_RDONLY, &w, &off);

	for (uint32_t i = 0; i < w.high_water && !busy; i++) {
		cr_assert_eq(pread(fd, &nd, sizeof(nd), (off_t)(off + i * sizeof(nd))), (ssize_t)sizeof(nd));
		busy = nd.state == CHIME_NODE_EXPIRED || nd.state == CHIME_NODE_ALLOC || nd.state == CHIME_NODE_BACKLOG ||
		       nd.state == CHIME_NODE_ACKWAIT || (nd.state == CHIME_NODE_ARMED && nd.deadline_ns < soon);
	}
	close(fd);
	for (uint32_t k = 0; k < c->nr_shards; k++)
		have += __atomic_load_n(c->chan[k].cq.tail_pub, __ATOMIC_ACQUIRE) - c->chan[k].cq.head;
	return !busy && have == 0;
}

/*
 * What the process takes from the broker now running, added to what it
 * took before (seen): every one of the four exactly once, at its
 * deadline. Collected until each has come and nothing more can
 * (t4_quiet()), up to 5 s: a fixed 500 ms was most of each run. Then the
 * session closes and the broker goes.
 */
static void t4_once(chime_t *c, uint8_t *seen, const uint64_t *d, unsigned run)
{
	struct chime_event ev[8];
	uint64_t until = now_ns() + 5000 * MS;
	unsigned n = 0, got = 1, missing = T4;

	while (n < 8 && now_ns() < until && (missing || got || !t4_quiet(c))) {
		got = collect(c, ev + n, 8 - n, now_ns() + 10 * MS);
		for (unsigned k = n; k < n + got; k++) {
			cr_assert_lt(ev[k].user_data, T4);
			seen[ev[k].user_data]++;
		}
		n += got;
		missing = 0;
		for (unsigned i = 0; i < T4; i++)
			missing += !seen[i];
	}
	for (unsigned k = 0; k < n; k++)
		cr_assert_eq(ev[k].deadline_ns, d[ev[k].user_data], "run %u: timer %llu's event at another deadline",
			     run, (unsigned long long)ev[k].user_data);
	for (unsigned i = 0; i < T4; i++)
		cr_assert_eq(seen[i], 1, "run %u: %s %c came %u times", run, t4_period(i) ? "periodic" : "one-shot",
			     "APBQ"[i], seen[i]);
	chime_close(c);
	t_chimed_stop(&tb, SIGKILL);
}

/*
 * Which stores a kill-after-each-store test kills after: every one, but
 * under ASan outside the stress suite every third and the last. The
 * default suite runs this program in the release build only, which kills
 * after each store (tests/meson.build, 'once_in'); the stress suite kills
 * after each under ASan too. ASan's part is the memory errors of a restore
 * from a killed broker's files, which does not need every store, and the
 * two longest of these tests took 64 s there (20 in the release build).
 */
static unsigned store_stride(void)
{
#if defined(__SANITIZE_ADDRESS__)
	const char *s = getenv("CHIME_STRESS");

	return s && atoi(s) > 0 ? 1 : 3;
#else
	return 1;
#endif
}

/*
 * One run of `killed_after` in which nothing is killed, to count the stores
 * (at least `least`), then one run killed after each of them (store_stride()).
 */
static void t4_kill_after_each_store(unsigned (*killed_after)(unsigned j, unsigned run), unsigned least,
				     const char *what)
{
	unsigned total = 0, stride = store_stride();

	/*
	 * The count: a whole run. Single steps on a loaded host (CI, other
	 * cases beside) can be so slow that a stop's park reaches none of the
	 * nodes before the stop's 5 s bound ends it (step_changes() says "ended
	 * by itself after 0"): 1 run in 3 under CI's load. Counted again then;
	 * a park that never stores to them fails every try.
	 */
	for (int tries = 0; tries < 3 && total < least; tries++)
		total = killed_after(UINT_MAX, 0);
	cr_assert_geq(total, least, "%s made %u stores to the four nodes (3 tries)", what, total);
	for (unsigned j = 0; j < total; j++)
		if (j % stride == 0 || j == total - 1)
			killed_after(j, j + 1);
}

struct stop_run {
	chime_t *c;
	int took;               /* P's take during the park: 1 taken, -1 failed, 0 not yet */
	struct chime_event ev;
};

/* At the park's first store to a watched node (after it read the consumer head), the process takes P. */
static void stop_take_p(unsigned k, void *arg)
{
	struct stop_run *s = arg;

	if (k == 1)
		s->took = chime_poll(s->c, &s->ev, 1) == 1 && s->ev.user_data == T4_P ? 1 : -1;
}

static bool stop_done(const struct watch *w)
{
	return w->last[T4_A].state == CHIME_NODE_FREE && w->last[T4_P].cq_pos == CHIME_POS_NONE &&
	       w->last[T4_B].state == CHIME_NODE_BACKLOG && w->last[T4_B].cq_pos == CHIME_POS_NONE &&
	       w->last[T4_Q].state == CHIME_NODE_BACKLOG && w->last[T4_Q].cq_pos == CHIME_POS_NONE;
}

/*
 * A planned stop's park, killed after its j-th store to the four timers'
 * nodes, under a process that lives on: it took A before the stop (the
 * shard not told yet) and takes P at the park's first store (after the
 * park read the consumer head: its claim CAS on P loses); B and Q it
 * never took. Returns the stores a whole park makes.
 */
static unsigned stop_killed_after(unsigned j, unsigned run)
{
	struct stop_run s = { 0 };
	struct chime_event ev[8];
	uint8_t seen[T4] = { 0 };
	uint64_t d[T4], off[T4];
	struct watch w;
	unsigned k;
	int tid;

	start(T4_OPTS);
	s.c = sopen_ok("stop");
	t4_arm(s.c, d, NULL);
	for (unsigned i = 0; i < T4; i++)
		off[i] = node_offset(i, t4_period(i));
	tid = shard0_hold();
	cr_assert_eq(chime_poll(s.c, ev, 1), 1);
	cr_assert_eq(ev[0].user_data, T4_A);
	seen[T4_A]++;
	watch_init(&w, off, T4);
	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	k = step_changes(tid, &w, j, stop_done, stop_take_p, &s);
	cr_assert_geq(s.took, 0, "run %u: the process did not take P during the park", run);
	if (s.took)
		seen[T4_P]++;
	restart(0, T4_OPTS);
	t4_once(s.c, seen, d, run);
	return k;
}

/*
 * SIGKILL during a planned stop, at any store of the park to the nodes of
 * the events it settles, under a process that lives on and resumes: every
 * event exactly once. Before, the park cleared a one-shot's position
 * before its claim CAS and tagged a periodic to be held before it, so a
 * broker killed after the CAS lost to the process (A, taken before the
 * stop; P, taken during it) left A looking undelivered and P held: both
 * came again. Now the node says "maybe taken, maybe voided" across the
 * CAS, and the library's copy of its old claim words tells which.
 */
Test(restart, a_stop_killed_at_any_store_of_its_park_delivers_each_event_once_to_a_living_process)
{
	t4_kill_after_each_store(stop_killed_after, 6, "the park");
}

/*
 * The process, in a thread of its own (the test's is the shard's tracer):
 * an arm into its full submission ring finds the broker gone and
 * reconnects; it takes no event meanwhile, so B and Q stay untaken in the
 * old ring. 0, or the arm's error.
 */
static void *settle_arm(void *arg)
{
	chime_id_t id;

	return (void *)(intptr_t)chime_arm(arg, 0, now_ns() + HOUR, 0, 200, &id);
}

static bool settle_done(const struct watch *w)
{
	for (unsigned i = 0; i < T4; i++)
		if (w->last[i].state != CHIME_NODE_FREE && w->last[i].cq_pos != CHIME_POS_NONE)
			return false;
	return true;
}

/*
 * The process takes A and P, the broker is SIGKILLed (not told), and the
 * next one restores the four as delivered, maybe taken; the process
 * resumes with it, and it is killed after its j-th store to their nodes
 * while it settles them by the process's word (j 0: before it read it).
 * A third broker and the same process then: every event once.
 */
static unsigned settle_killed_after(unsigned j, unsigned run)
{
	struct chime_event ev[8];
	uint8_t seen[T4] = { 0 };
	uint64_t d[T4], off[T4];
	struct watch w;
	chime_id_t id;
	unsigned k;
	pthread_t t;
	void *r;
	chime_t *c;
	int tid;

	start(T4_OPTS);
	/* A shard single-stepped through the re-attach can outlast the 30 s a library waits for a broker. */
	cr_assert_eq(setenv("CHIME_RECONNECT_S", "600", 1), 0);
	c = sopen_ok("settle");
	unsetenv("CHIME_RECONNECT_S");
	t4_arm(c, d, NULL);
	cr_assert_eq(chime_poll(c, ev, 2), 2);
	cr_assert(ev[0].user_data == T4_A && ev[1].user_data == T4_P);
	seen[T4_A]++;
	seen[T4_P]++;
	restart(SIGKILL, T4_OPTS);
	/* The old ring filled: the process has not noticed the crash (an arm with room does not look). */
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 100 + i, &id), 0);
	for (unsigned i = 0; i < T4; i++)
		off[i] = node_offset(i, t4_period(i));
	tid = shard0_hold();
	watch_init(&w, off, T4);
	cr_assert_eq(pthread_create(&t, NULL, settle_arm, c), 0);
	k = step_changes(tid, &w, j, settle_done, NULL, NULL);
	restart(0, T4_OPTS);
	pthread_join(t, &r);
	cr_assert_eq((intptr_t)r, 0, "run %u: the arm that reconnects failed: %s", run, strerror(-(int)(intptr_t)r));
	t4_once(c, seen, d, run);
	return k;
}

/*
 * A broker killed while it settles a resumed process's events by the
 * process's word (a crash loop), at any store to their nodes: the next
 * one still settles each exactly once. Before, the library had moved to
 * the killed broker's ring and sent the next one that ring's head, which
 * says nothing of the first ring's events: those the process had taken
 * and the killed broker had not yet dropped (P, a periodic being settled
 * as taken) came again. Now its claim words, copied from ring to ring
 * until a broker has settled them, decide.
 */
Test(restart, a_broker_killed_while_it_settles_a_living_process_s_events_delivers_each_once)
{
	t4_kill_after_each_store(settle_killed_after, 4, "the settle");
}

static bool reset_taken_done(const struct watch *w)
{
	return w->last[0].state == CHIME_NODE_FREE;
}

static bool reset_voided_done(const struct watch *w)
{
	return w->last[0].state == CHIME_NODE_ARMED;
}

/*
 * The process takes one-shot A, then resets it 100 ms ahead (which changes
 * nothing then: chime_reset(3)); the broker is killed after its j-th store
 * to A's node while it applies the reset (j 0: before it read it; then
 * off the ACKWAIT list, freed, the position cleared). The next broker and
 * the same process: A never again, P, B and Q once. Until the reset kept
 * the event's position in the node until it was free, a kill after it was
 * cleared left A ACKWAIT with no position: the next broker held it to
 * deliver again, and the RESET the library submitted again put it back on
 * the wheel, to fire at the reset's deadline (tsan_api's crash step saw it
 * under heavy load; with the reset an hour ahead, as this test had it,
 * that firing came after the test).
 */
static unsigned reset_killed_after(unsigned j, unsigned run, bool take)
{
	struct chime_event ev;
	uint8_t seen[T4] = { 0 };
	uint64_t d[T4], off, to;
	chime_id_t ids[T4], id;
	struct watch w;
	unsigned k;
	chime_t *c;
	int tid;

	start(T4_OPTS);
	c = sopen_ok(take ? "rtaken" : "rvoided");
	t4_arm(c, d, ids);
	id = ids[T4_A];
	if (take) {
		cr_assert_eq(chime_poll(c, &ev, 1), 1);
		cr_assert_eq(ev.id, id);
		seen[T4_A]++;
	}
	off = node_offset(T4_A, 0);
	tid = shard0_hold();
	watch_init(&w, &off, 1);
	to = now_ns() + 100 * MS;
	if (!take)
		d[T4_A] = to;   /* its only event */
	cr_assert_eq(chime_reset(c, id, to), 0);
	cr_assert_eq(chime_flush(c), 0);
	k = step_changes(tid, &w, j, take ? reset_taken_done : reset_voided_done, NULL, NULL);
	restart(0, T4_OPTS);
	/*
	 * 500 ms when A's event is untaken too: killed with the RESET popped
	 * and not applied, the drainer holds A back for it (poll.c,
	 * events_held()), and notices the broker gone by the socket's hang-up
	 * while it waits, not by the heartbeat (about 1 s; 500 ms failed then).
	 */
	t4_once(c, seen, d, run);
	return k;
}

static unsigned reset_taken_killed_after(unsigned j, unsigned run)
{
	return reset_killed_after(j, run, true);
}

Test(restart, a_reset_of_a_taken_one_shot_killed_at_any_store_never_delivers_it_again)
{
	t4_kill_after_each_store(reset_taken_killed_after, 2, "the reset");
}

/*
 * The same with A's event left in the ring, untaken: the reset voids it
 * and puts A back on the wheel 100 ms ahead; killed after each of its
 * stores to A's node (off the ACKWAIT list, the position cleared, back on
 * the wheel). A comes once, at the reset's deadline: the next broker holds
 * it (its event the process never took), and the RESET the library
 * submits again moves it; P, B and Q once.
 */
static unsigned reset_voided_killed_after(unsigned j, unsigned run)
{
	return reset_killed_after(j, run, false);
}

Test(restart, a_reset_that_voids_a_one_shot_s_event_killed_at_any_store_delivers_it_once_at_the_new_deadline)
{
	t4_kill_after_each_store(reset_voided_killed_after, 2, "the reset");
}

/* ---- a periodic held behind its untaken event: no period lost to a park or a crash ---- */

/*
 * Periodic P (user_data 0) of the "behind" tests: its process never takes
 * its first event, so its second firing is held behind that event
 * (BACKLOG, the event's ring position in the node).
 */
#define BEHIND_PERIOD (40 * MS)

struct behind {
	uint64_t d1;            /* P's first deadline: the event never taken */
	int take;               /* behind_child(): take two events when told (1), then say so (2) */
};

static void behind_child(int wfd, void *arg)
{
	struct behind *b = arg;
	struct chime_event ev;
	chime_t *c = NULL;
	chime_id_t id;

	if (sopen(&c, "behind") < 0 || chime_arm(c, 0, b->d1, BEHIND_PERIOD, 0, &id) < 0)
		_exit(1);
	(void)!write(wfd, "r", 1);
	while (__atomic_load_n(&b->take, __ATOMIC_ACQUIRE) != 1)
		usleep(1000);
	/*
	 * The first, from the old ring maybe (the library has not looked for
	 * its broker yet); the second only once it has resumed with the next
	 * broker and told it what it took.
	 */
	for (uint64_t k = 0; k < 2; k++)
		if (chime_wait(c, &ev, 1, 5000) != 1 || ev.deadline_ns != b->d1 + k * BEHIND_PERIOD)
			_exit(2 + (int)k);
	__atomic_store_n(&b->take, 2, __ATOMIC_RELEASE);
	pause();
}

/* Wait until P (first deadline d1) is held behind its first event and the shard sleeps; its node's offset. */
static uint64_t behind_held(uint64_t d1)
{
	struct chime_node nd;
	uint64_t t0 = now_ns(), off;
	char path[PATH_MAX];
	int fd, tid;

	if (now_ns() < d1 + BEHIND_PERIOD + 20 * MS)
		usleep((unsigned)((d1 + BEHIND_PERIOD + 20 * MS - now_ns()) / 1000));
	/* The arm is applied when the shard next runs: late on a loaded host (7.6: not yet, once). */
	while (!(off = node_find(0, BEHIND_PERIOD))) {
		cr_assert_lt(now_ns() - t0, 5000 * MS, "P is not in the shard's file after 5 s");
		usleep(1000);
	}
	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0);
	for (;;) {
		cr_assert_eq(pread(fd, &nd, sizeof(nd), (off_t)off), (ssize_t)sizeof(nd));
		if (nd.state == CHIME_NODE_BACKLOG && nd.cq_pos >> 62 == 0)
			break;
		cr_assert_lt(now_ns() - t0, 5000 * MS, "P is not held behind its event after 5 s (state %u, "
			     "position %#llx)", nd.state, (unsigned long long)nd.cq_pos);
		usleep(1000);
	}
	close(fd);
	cr_assert_eq(nd.deadline_ns, d1 + BEHIND_PERIOD, "the held firing is not P's second");
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0);
	while (!t_thread_asleep(tb.pid, tid)) {
		cr_assert_lt(now_ns() - t0, 5000 * MS, "the shard did not sleep within 5 s");
		usleep(1000);
	}
	return off;
}

/*
 * Start P in a child and wait until it is held behind its first event
 * (behind_held()). A struct behind in shared memory (the child reads it).
 */
static pid_t behind_arm(struct behind **bp, uint64_t *off)
{
	struct behind *b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pid;

	cr_assert_neq(b, MAP_FAILED);
	b->d1 = now_ns() + 20 * MS;
	pid = child(behind_child, b);
	*off = behind_held(b->d1);
	*bp = b;
	return pid;
}

/*
 * What the process of the session gets now: P's events from `first` on,
 * every period once and in order (a periodic comes back every period it
 * missed). Then it closes and the broker goes.
 */
static void behind_next(chime_t *c, uint64_t first, unsigned run)
{
	static struct chime_event ev[256];
	unsigned n = collect(c, ev, 256, now_ns() + 200 * MS);

	/* the reconnect to the next broker alone took the 200 ms once on a loaded host (a CI run): up to 3 s more */
	for (uint64_t end = now_ns() + 3000 * MS; n < 2 && now_ns() < end;)
		n += collect(c, ev + n, 256 - n, now_ns() + 100 * MS);
	cr_assert_geq(n, 2, "run %u: %u events of P", run, n);
	for (unsigned k = 0; k < n; k++) {
		int64_t at = (int64_t)(ev[k].deadline_ns - first);

		cr_assert_eq(ev[k].user_data, 0);
		cr_assert_eq(ev[k].deadline_ns, first + k * BEHIND_PERIOD,
			     "run %u: P's event %u is of deadline %+lld us from the first due, want +%llu us "
			     "(a period lost or repeated)", run, k, (long long)at / 1000,
			     (unsigned long long)(k * BEHIND_PERIOD / 1000));
	}
	chime_close(c);
	t_chimed_stop(&tb, SIGKILL);
}

static bool behind_parked(const struct watch *w)
{
	return w->last[0].state == CHIME_NODE_BACKLOG && w->last[0].cq_pos == CHIME_POS_NONE;
}

/*
 * P's process dies (SIGKILL), and the broker parks the session: it voids
 * the untaken event and holds P at that event's deadline. The broker is
 * killed after the park's j-th store to P's node; the next one, and the
 * session's next process, must still get that event's period, then each
 * later one.
 */
static unsigned behind_park_killed_after(unsigned j, unsigned run)
{
	struct behind *b;
	struct watch w;
	uint64_t off;
	unsigned k;
	pid_t pid;
	int tid;

	start(T4_OPTS);
	pid = behind_arm(&b, &off);
	tid = shard0_hold();
	watch_init(&w, &off, 1);
	kill_child(pid);
	k = step_changes(tid, &w, j, behind_parked, NULL, NULL);
	restart(0, T4_OPTS);
	behind_next(sopen_ok("behind"), b->d1, run);
	munmap(b, sizeof(*b));
	return k;
}

/*
 * The park of a periodic held behind its untaken event, killed at any of
 * its stores to the node: the voided event's period still comes, once.
 * Before, the park voided the event (clearing the node's position) and
 * then moved the held firing back to its deadline: a broker killed
 * between the two left the held firing alone, and that period was lost.
 */
Test(restart, a_park_killed_at_any_store_of_a_periodic_held_behind_its_event_loses_no_period)
{
	t4_kill_after_each_store(behind_park_killed_after, 2, "the park");
}

struct behind_stop {
	chime_t *c;
	bool take;              /* take P's first event at the park's first store */
	int took;               /* 1 taken, -1 not found, 0 not yet */
};

static void behind_stop_take(unsigned k, void *arg)
{
	struct behind_stop *s = arg;
	struct chime_event ev;

	if (k == 1 && s->take)
		s->took = chime_poll(s->c, &ev, 1) == 1 && ev.user_data == 0 ? 1 : -1;
}

/*
 * A planned stop's park of P, held behind its first event, under a process
 * that lives on and resumes (the test's), killed after its j-th store to
 * P's node; the process takes that event at the park's first store, or
 * never. Each period comes once either way.
 */
static unsigned behind_stop_killed_after(bool take, unsigned j, unsigned run)
{
	struct behind_stop s = { .take = take };
	uint64_t d1, off;
	struct watch w;
	unsigned k;
	chime_id_t id;
	int tid;

	start(T4_OPTS);
	s.c = sopen_ok("behind");
	d1 = now_ns() + 20 * MS;
	cr_assert_eq(chime_arm(s.c, 0, d1, BEHIND_PERIOD, 0, &id), 0);
	off = behind_held(d1);
	tid = shard0_hold();
	watch_init(&w, &off, 1);
	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	k = step_changes(tid, &w, j, behind_parked, behind_stop_take, &s);
	cr_assert_geq(s.took, 0, "run %u: the process did not take P's first event during the park", run);
	restart(0, T4_OPTS);
	behind_next(s.c, s.took ? d1 + BEHIND_PERIOD : d1, run);
	return k;
}

static unsigned behind_stop_taken_killed_after(unsigned j, unsigned run)
{
	return behind_stop_killed_after(true, j, run);
}

static unsigned behind_stop_untaken_killed_after(unsigned j, unsigned run)
{
	return behind_stop_killed_after(false, j, run);
}

/*
 * A planned stop killed at any store of its park of a periodic held
 * behind its event, under a process that lives on: each period once,
 * whether the process took that event as the park began or not (its
 * claim word settles it). Before, the park held the periodic at that
 * event's deadline before its claim CAS, unconditionally: killed there,
 * a process that had just taken it got it again.
 */
Test(restart, a_stop_killed_at_any_store_of_its_park_of_a_held_periodic_gives_each_period_once)
{
	t4_kill_after_each_store(behind_stop_taken_killed_after, 1, "the park");
	t4_kill_after_each_store(behind_stop_untaken_killed_after, 1, "the park");
}

/*
 * A broker SIGKILLed while P is held behind its untaken event, its process
 * dead (killed after the broker) or alive (it takes that event and the
 * next, resuming with the next broker): the session gets each period once,
 * from that event's on.
 */
static void behind_crash(bool process_lives)
{
	struct behind *b;
	uint64_t off;
	pid_t pid;

	start(T4_OPTS);
	pid = behind_arm(&b, &off);
	restart(SIGKILL, T4_OPTS);
	if (process_lives) {
		/* The child takes two events, resuming on the way. */
		__atomic_store_n(&b->take, 1, __ATOMIC_RELEASE);
		for (uint64_t t0 = now_ns(); __atomic_load_n(&b->take, __ATOMIC_ACQUIRE) != 2;) {
			int st;

			cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the process did not get P's first two periods "
				     "in order (exit %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
			cr_assert_lt(now_ns() - t0, 10000 * MS, "the process did not take two events in 10 s");
			usleep(1000);
		}
		kill_child(pid);
		behind_next(sopen_ok("behind"), b->d1 + 2 * BEHIND_PERIOD, 0);
	} else {
		kill_child(pid);
		behind_next(sopen_ok("behind"), b->d1, 0);
	}
	munmap(b, sizeof(*b));
}

Test(restart, a_crash_while_a_periodic_is_held_behind_its_event_loses_no_period_of_a_dead_process)
{
	behind_crash(false);
}

Test(restart, a_crash_while_a_periodic_is_held_behind_its_event_gives_a_living_process_each_period_once)
{
	behind_crash(true);
}

/* The reset applied (no event, the timer at its deadline) or not (the held event's period, then each later one). */
static void reset_behind_whole(const struct rs *r, const char *what, const char *path, uint64_t off, chime_t *c)
{
	static struct chime_event ev[256];
	unsigned n = collect(c, ev, 256, now_ns() + 200 * MS);
	struct chime_node nd = node_at(path, off);

	if (n == 0)
		cr_assert_eq(nd.deadline_ns, r->d2, "%s: no event, and the timer at d1%+lld ms, not the reset's", what,
			     (long long)(nd.deadline_ns - r->d1) / (long long)MS);
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(ev[i].deadline_ns, r->d1 + i * BEHIND_PERIOD, "%s: event %u of %u at d1%+lld ms: the reset "
			     "not applied, and a period lost or repeated", what, i, n,
			     (long long)(ev[i].deadline_ns - r->d1) / (long long)MS);
}

/*
 * The reset of a_reset_cut_short_by_a_kill_is_applied_or_not_never_half, of
 * a periodic held behind its untaken event (P's period, taken by no one): each
 * image of the node that the shard file went through, restored, is the
 * reset applied (no event, the timer at its deadline) or not (that
 * event's period, then every later one), never half. Before, the void
 * cleared the event's position before the timer left the backlog: a kill
 * between left the held firing alone, and the voided event's period was
 * lost with the reset.
 */
Test(restart, a_reset_of_a_periodic_held_behind_its_event_cut_short_is_applied_or_not)
{
	each_reset_image(BEHIND_PERIOD, 20 * MS, false, reset_behind_whole);
}

/* The cancel applied (no event, no timer) or not (the held event's period, then each later one). */
static void cancel_whole(const struct rs *r, const char *what, const char *path, uint64_t off, chime_t *c)
{
	static struct chime_event ev[256];
	unsigned n = collect(c, ev, 256, now_ns() + 200 * MS);
	struct chime_node nd = node_at(path, off);

	if (n == 0)
		cr_assert(nd.state == CHIME_NODE_FREE || (nd.gen & CHIME_ID_GEN_MASK) != chime_id_gen(r->id),
			  "%s: no event, and the timer still there (state %u)", what, nd.state);
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(ev[i].deadline_ns, r->d1 + i * r->period, "%s: event %u of %u at d1%+lld ms: the cancel "
			     "not applied, and a period lost or repeated", what, i, n,
			     (long long)(ev[i].deadline_ns - r->d1) / (long long)MS);
}

/*
 * A session's process cancels a periodic whose event waits in its ring,
 * untaken (its next period an hour away, or already held behind that
 * event), and dies: each image of the node that the shard file went
 * through, restored, is the cancel applied (no event, no timer) or not
 * (that event, then the timer's later periods), never half. Before, the
 * void cleared the event's position before the node was freed: a kill
 * between kept the timer and lost the event.
 */
Test(restart, a_cancel_of_a_periodic_with_an_untaken_event_cut_short_is_applied_or_not)
{
	each_reset_image(HOUR, 50 * MS, true, cancel_whole);
	each_reset_image(BEHIND_PERIOD, 20 * MS, true, cancel_whole);
}

/*
 * A crash that takes the session's process too, `ms` after it said it was
 * ready: the broker SIGKILLed and reaped, then the process. Returns when
 * the broker was killed.
 */
static uint64_t crash_with(pid_t pid, unsigned ms)
{
	uint64_t at;

	usleep(ms * 1000);
	at = now_ns();
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, NULL, 0), tb.pid);
	tb.pid = 0;
	kill_child(pid);
	return at;
}

/* What the process of test_taken_then_both_die took: the deadline of each timer's last event. */
struct taken {
	uint64_t t0;
	uint64_t last[2];       /* user_data 0: the periodic; 1: the one-shot */
	unsigned periodic_events;
};

/* Arm a periodic (every second) and a one-shot, take three events of the first and the second, wait to be killed. */
static void taken_child(int wfd, void *arg)
{
	struct taken *t = arg;
	struct chime_event ev[4];
	chime_id_t id;
	chime_t *c = NULL;

	if (sopen(&c, "taken") < 0 || chime_arm(c, 0, t->t0 + 100 * MS, 1000 * MS, 0, &id) < 0 ||
	    chime_arm(c, 0, t->t0 + 2150 * MS, 0, 1, &id) < 0)
		_exit(1);
	while (t->periodic_events < 3 || !t->last[1]) {
		int r = chime_wait(c, ev, 4, 5000);

		if (r <= 0)
			_exit(2);
		for (int k = 0; k < r; k++) {
			t->last[ev[k].user_data & 1] = ev[k].deadline_ns;
			t->periodic_events += ev[k].user_data == 0;
		}
	}
	(void)!write(wfd, "t", 1);
	pause();
}

/*
 * A session's process takes events, then the broker is SIGKILLed and the
 * process dies too, a while after it took them (a second, at most 90 ms
 * here), before the periodic fires again. A new process of the session,
 * under a new broker, must not get those events again: the broker could
 * see them taken (the consumer head) long before it died. Before, a
 * periodic's node kept its event's position until its next firing, and
 * the next broker delivered that event again; a one-shot taken while its
 * shard slept stayed ACKWAIT in the file the same way.
 */
Test(restart, events_a_dead_process_took_before_the_crash_are_not_delivered_again)
{
	struct taken *t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_event ev[8];
	unsigned n, next = 0;
	chime_t *c;

	cr_assert_neq(t, MAP_FAILED);
	start("-n 1");
	t->t0 = now_ns();
	crash_with(child(taken_child, t), 400);      /* a heartbeat or four after the last take */
	cr_assert_lt(now_ns(), t->last[0] + 1000 * MS, "too slow: the periodic's next event came due");
	restart(0, "-n 1");
	c = sopen_ok("taken");
	n = collect(c, ev, 8, t->last[0] + 1300 * MS);
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (unsigned)ev[k].user_data;

		cr_assert_lt(i, 2);
		cr_assert_gt(ev[k].deadline_ns, t->last[i], "%s's event of deadline +%llu ms, taken, came again",
			     i ? "the one-shot" : "the periodic",
			     (unsigned long long)((ev[k].deadline_ns - t->t0) / MS));
		next += i == 0 && ev[k].deadline_ns == t->last[0] + 1000 * MS;
	}
	cr_assert_eq(next, 1, "the periodic's next event did not come once");
	chime_close(c);
	munmap(t, sizeof(*t));
}

/* What the process of the test below took, and when. */
struct rest_take {
	uint64_t t0;
	uint64_t deadline_ns;   /* of the event it took */
	uint64_t took_ns;
};

/* Arm a one-shot 2.5 s ahead (the broker at rest by then), take its event, say so, wait to be killed. */
static void rest_take_child(int wfd, void *arg)
{
	struct rest_take *t = arg;
	struct chime_event ev;
	chime_id_t id;
	chime_t *c = NULL;

	if (sopen(&c, "resting") < 0 || chime_arm(c, 0, t->t0 + 2500 * MS, 0, 7, &id) < 0 || chime_flush(c) < 0)
		_exit(1);
	if (chime_wait(c, &ev, 1, 5000) != 1)
		_exit(2);
	t->deadline_ns = ev.deadline_ns;
	t->took_ns = now_ns();
	(void)!write(wfd, "t", 1);
	pause();
}

/*
 * The same at rest: the broker beats every 450 ms once it has had nothing
 * to do for a second, but a session's process that takes an event has the
 * 90 ms beat back (rest_end(), shard.c), so that its take is seen within
 * ~100 ms, as when busy. The broker and the process are killed 200 ms
 * after the take; the next broker must not deliver the event again. Left
 * to the idle beat (the shard not waking the control thread), the take
 * went unseen for up to 450 ms, and 6 runs of 6 delivered it again.
 */
Test(restart, an_event_a_session_took_at_rest_is_not_delivered_again_after_a_crash)
{
	struct rest_take *t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_event ev[4];
	uint64_t killed;
	unsigned n;
	chime_t *c;

	cr_assert_neq(t, MAP_FAILED);
	start("-n 1");
	t->t0 = now_ns();
	killed = crash_with(child(rest_take_child, t), 200);
	cr_assert_lt(t->took_ns - t->deadline_ns, 100 * MS, "taken %.0f ms late: not a broker at rest",
		     (double)(t->took_ns - t->deadline_ns) / 1e6);
	restart(0, "-n 1");
	c = sopen_ok("resting");
	n = collect(c, ev, 4, now_ns() + 300 * MS);
	cr_assert_eq(n, 0, "the event taken %.0f ms before the crash came again",
		     (double)(killed - t->took_ns) / 1e6);
	chime_close(c);
	munmap(t, sizeof(*t));
}

/*
 * Take up to `want` events of timers with user_data < n (max a call) into
 * seen[], until until_ns; counts the repeats in *twice. Returns how many came.
 */
static unsigned take_each(chime_t *c, uint8_t *seen, unsigned want, unsigned max, uint64_t until_ns,
			  unsigned *twice)
{
	static struct chime_event ev[4096];
	unsigned got = 0;

	cr_assert_leq(max, 4096);
	while (got < want && now_ns() < until_ns) {
		int r = chime_wait(c, ev, want - got < max ? want - got : max, 100);

		cr_assert_geq(r, 0, "chime_wait: %s", strerror(-r));
		for (int k = 0; k < r; k++)
			*twice += seen[ev[k].user_data]++ > 0;
		got += (unsigned)r;
	}
	return got;
}

/* Each of the n timers came, once. */
static void came_once(const uint8_t *seen, unsigned n, unsigned twice)
{
	unsigned missing = 0;

	for (unsigned i = 0; i < n; i++)
		missing += !seen[i];
	cr_assert_eq(twice, 0, "%u events delivered twice", twice);
	cr_assert_eq(missing, 0, "%u of %u events lost", missing, n);
}

/*
 * A broker SIGKILLed while it fires a burst of a detached session's
 * timers: each one is held for the session, or still on the wheel, or
 * between the two (popped by the wheel, not yet held: up to a batch of
 * them). The next broker must fire every one of them, once.
 */
Test(restart, a_crash_in_the_middle_of_a_burst_loses_no_timer)
{
	enum { N = 300000 };
	static uint8_t seen[N];
	unsigned twice = 0;
	uint64_t t0, until, held = 0;
	chime_id_t id;
	chime_t *c;

	start("-n 1");
	c = sopen_ok("burst");
	t0 = now_ns() + 1500 * MS;
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(chime_arm(c, 0, t0, 0, i, &id), 0);
	chime_close(c);         /* detached: what fires is held in the backlog */
	while (now_ns() < t0)
		usleep(1000);
	/*
	 * Kill it once it has held some and not all. Stopped while its files
	 * are read: a look at 300k nodes could take longer than the whole
	 * burst, which then ended between two looks (the case skipped in 7
	 * of 18 CI runs). Now the burst goes on only in the millisecond
	 * between looks, and the kill lands wherever that left it, as a
	 * crash would.
	 */
	until = now_ns() + 10000 * MS;
	while (now_ns() < until) {
		int st;

		cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
		cr_assert_eq(waitpid(tb.pid, &st, WUNTRACED), tb.pid);
		cr_assert(WIFSTOPPED(st), "chimed ended (status %#x) before it was killed", st);
		held = t_nodes(tb.sock, 1u << CHIME_NODE_BACKLOG);
		if (held > 0 && held < N)
			break;  /* killed stopped, below */
		cr_assert_eq(kill(tb.pid, SIGCONT), 0);
		if (held == N)
			cr_skip_test("the burst was over before a look found it under way");
		usleep(1000);
	}
	/* Else what follows would be a plain restart, the burst not begun (an audit). */
	cr_assert(held > 0 && held < N, "no look in 10 s found the burst under way: %llu of %u held",
		  (unsigned long long)held, N);
	fprintf(stderr, "killed with %llu of %u held\n", (unsigned long long)held, N);
	restart(SIGKILL, "-n 1");
	c = sopen_ok("burst");
	take_each(c, seen, N, 4096, now_ns() + 10000 * MS, &twice);
	came_once(seen, N, twice);
	chime_close(c);
}

/*
 * A broker SIGKILLed while it takes over the files of the one before (its
 * restore of a shard: a sweep of the slab, then the held events sorted and
 * queued), again and again at other moments, and then one that finishes:
 * that one has every held event, and delivers each once. Before, the
 * restore marked the held events ALLOC during the sweep and held them only
 * at the end: a broker killed in between (some 20 ms for 200k events here)
 * left them looking like grants to the next one, which freed them all.
 */
/* A broker on tb.sock, not waited for; its stderr in *errfd. */
static pid_t chimed_spawn(int *errfd, const char *extra)
{
	char cmd[1024];
	int p[2];
	pid_t pid;

	snprintf(cmd, sizeof(cmd), "exec '%s' --foreground --socket '%s' %s %s", getenv("CHIMED"), tb.sock,
		 T_SUBUIDS_NONE(extra), extra);
	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(p[1], 2);  /* its log: the test waits for "taking over" */
		close(p[0]);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	*errfd = p[0];
	return pid;
}

Test(restart, a_broker_killed_while_it_takes_over_loses_no_held_event)
{
	enum { N = 200000 };
	static uint8_t seen[N];
	unsigned twice = 0;
	chime_id_t id;
	chime_t *c;
	int st;

	start("-n 1");
	c = sopen_ok("held");
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + 300 * MS, 0, i, &id), 0);
	chime_close(c);
	/* all fired and held for the session */
	cr_assert_eq(t_nodes_settle(tb.sock, (1u << CHIME_NODE_BACKLOG) | (1u << CHIME_NODE_ACKWAIT), N), N,
		     "not all fired and held 3 s after");
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	for (unsigned k = 0; k < 10; k++) {
		char line[1024];
		int fd;
		pid_t pid = chimed_spawn(&fd, "-n 1");
		FILE *f = fdopen(fd, "r");

		cr_assert_not_null(f);
		while (fgets(line, sizeof(line), f) && !strstr(line, "taking over"))
			;
		usleep(k * 6000);
		kill(pid, SIGKILL);
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		fclose(f);
	}
	restart(0, "-n 1");
	c = sopen_ok("held");
	take_each(c, seen, N, 4096, now_ns() + 5000 * MS, &twice);
	came_once(seen, N, twice);
	chime_close(c);
}

/*
 * A broker SIGKILLed while it keeps pace with a process draining a burst:
 * it frees the events consumed and moves held ones into the ring, node
 * after node. The process takes 3000 and the broker dies at once, three
 * times; every event comes exactly once. The library takes its events
 * from the dead broker's ring until it notices, so the next crash comes
 * before it resumed: the old positions must survive a broker that never
 * heard from the process (thousands delivered twice before 87ce007). And
 * a consumed one-shot was ALLOC while it left its key chain (a cache
 * miss), which restore.c takes for a timer the old wheel popped: the next
 * broker delivered it again (one in some runs).
 */
Test(restart, crashes_while_the_process_drains_a_burst_deliver_each_event_once)
{
	enum { N = 200000 };
	static uint8_t seen[N];
	unsigned n = 0, twice = 0;
	chime_id_t id;
	chime_t *c;

	start("-n 1");
	c = sopen_ok("drain");
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + 300 * MS, 0, i, &id), 0);
	/* all fired: in the ring or held behind it */
	cr_assert_eq(t_nodes_settle(tb.sock, (1u << CHIME_NODE_BACKLOG) | (1u << CHIME_NODE_ACKWAIT), N), N,
		     "not all fired and held 3 s after");
	for (unsigned round = 0; round < 3; round++) {
		unsigned taken = take_each(c, seen, 3000, 512, now_ns() + 2000 * MS, &twice);

		cr_assert_eq(taken, 3000, "round %u: %u events of 3000", round, taken);
		n += taken;
		restart(SIGKILL, "-n 1");
	}
	take_each(c, seen, N - n, 4096, now_ns() + 10000 * MS, &twice);
	came_once(seen, N, twice);
	chime_close(c);
}

/*
 * A dispatch callback runs under the session's drainer lock. One that arms
 * into a crashed broker's full ring must reconnect itself (no one else can
 * take the lock): its arms all succeed, and the events the drain had not
 * reached come again from the new broker, once.
 */
struct refill {
	chime_t *c;
	unsigned calls, armed;
	int err;
	uint8_t seen[3];
};

static void refill_cb(const struct chime_event *e, void *arg)
{
	struct refill *r = arg;
	chime_id_t id;

	r->calls++;
	if (e->user_data < 3)
		r->seen[e->user_data]++;
	if (r->calls > 1)
		return;
	for (unsigned i = 0; i < 64 + 8; i++) {    /* past the ring of 64 the old broker never reads */
		int x = chime_arm(r->c, 0, now_ns() + HOUR, 0, 1000 + i, &id);

		if (x < 0) {
			r->err = x;
			return;
		}
		r->armed++;
	}
}

Test(restart, a_dispatch_callback_arming_into_a_crashed_brokers_full_ring_reconnects, .timeout = 30)
{
	struct refill r = { 0 };
	chime_id_t id;
	uint64_t end;

	start("-n 1 --sq-size 64");
	r.c = sopen_ok("dispatcher");
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(chime_arm(r.c, 0, now_ns() + 20 * MS, 0, i, &id), 0);
	ring_holds(r.c, 3);     /* delivered: waiting in the completion ring */
	restart(SIGKILL, "-n 1 --sq-size 64");
	for (end = now_ns() + 3000 * MS; now_ns() < end && r.calls < 3;)
		cr_assert_geq(chime_dispatch(r.c, refill_cb, &r, 0), 0);
	cr_assert_eq(r.err, 0, "an arm in the callback: %s", strerror(-r.err));
	cr_assert_eq(r.armed, 72);
	cr_assert_eq(r.calls, 3, "%u callbacks", r.calls);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(r.seen[i], 1, "timer %u dispatched %u times", i, r.seen[i]);
	chime_close(r.c);
}

/*
 * No broker comes back: a session gives up after $CHIME_RECONNECT_S (here
 * 1 s) with -ENOTCONN, in the drainer, in a thread that only arms (it
 * drives the attempts itself: no deadlock) and in one that only flushes
 * (a flush made no attempt, so it said 0 for good: an adopter audit had
 * 10 s of flushes return 0); 0 gives up at once.
 */
Test(restart, a_session_gives_up_after_chime_reconnect_s)
{
	struct chime_event ev;
	chime_t *c, *a, *z, *f;
	chime_id_t id;
	uint64_t t0;
	int r = 0;

	start("-n 1 --sq-size 16");
	cr_assert_eq(setenv("CHIME_RECONNECT_S", "1", 1), 0);
	c = sopen_ok("waits");
	a = sopen_ok("arms");
	f = sopen_ok("flushes");
	cr_assert_eq(setenv("CHIME_RECONNECT_S", "0", 1), 0);
	z = sopen_ok("never");
	unsetenv("CHIME_RECONNECT_S");
	t_chimed_stop(&tb, SIGKILL);
	t0 = now_ns();
	/* Arms only: the first 16 fill the ring nobody reads; the next waits, reconnects, gives up. */
	for (unsigned i = 0; i < 64 && r == 0; i++)
		r = chime_arm(a, 0, now_ns() + HOUR, 0, i, &id);
	cr_assert_eq(r, -ENOTCONN, "chime_arm: %d", r);
	cr_assert_lt(now_ns() - t0, 8000 * MS, "gave up after %llu ms", (unsigned long long)((now_ns() - t0) / MS));
	t0 = now_ns();
	for (int i = 0; i < 800 && (r = chime_wait(c, &ev, 1, 10)) == 0; i++)
		;
	cr_assert_eq(r, -ENOTCONN, "chime_wait: %d", r);
	cr_assert_lt(now_ns() - t0, 8000 * MS);
	for (int i = 0; i < 300 && (r = chime_wait(z, &ev, 1, 10)) == 0; i++)
		;
	cr_assert_eq(r, -ENOTCONN, "CHIME_RECONNECT_S=0: %d", r);
	t0 = now_ns();
	while ((r = chime_flush(f)) == 0 && now_ns() - t0 < 8000 * MS)
		usleep(10000);
	cr_assert_eq(r, -ENOTCONN, "chime_flush: %d after %llu ms", r, (unsigned long long)((now_ns() - t0) / MS));
	chime_close(f);
	chime_close(a);
	chime_close(c);
	chime_close(z);
}

/*
 * A process that only flushes reconnects too, and what the dead broker
 * never read reaches the next one: arms published while the broker was
 * stopped, then killed, then started again. Before, a flush made no
 * attempt: the ten arms waited in closed rings for good.
 */
Test(restart, a_session_that_only_flushes_reconnects_and_hands_its_records_over)
{
	chime_id_t id;
	chime_t *c;
	uint64_t t0;
	unsigned n = 0;
	int r = 0;

	start("-n 1");
	c = sopen_ok("flush-only");
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 0, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1);
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, WUNTRACED), tb.pid);
	for (unsigned i = 1; i <= 10; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, i, &id), 0);
	restart(SIGKILL, "-n 1");
	t0 = now_ns();
	while (now_ns() - t0 < 5000 * MS && r == 0 && (n = t_nodes(tb.sock, ARMED_STATES)) < 11) {
		r = chime_flush(c);
		usleep(10000);
	}
	cr_assert_eq(r, 0, "chime_flush: %d", r);
	cr_assert_eq(n, 11, "%u of 11 timers in the next broker after 5 s of flushes", n);
	chime_close(c);
}

/* ---- a resume the broker no longer has the session for ends the reconnect ---- */

/* Until chime_wait() fails (it reconnects on the way), up to 5 s; its result. */
static int wait_until_dead(chime_t *c)
{
	struct chime_event ev;
	uint64_t t0 = now_ns();
	int r = 0;

	while (r >= 0 && now_ns() - t0 < 5000 * MS)
		r = chime_wait(c, &ev, 1, 10);
	return r;
}

static void open_and_close_taken(int wfd, void *arg)
{
	chime_t *c = NULL;

	(void)arg;
	if (sopen(&c, "taken") < 0)
		_exit(1);
	chime_close(c);
	(void)!write(wfd, "r", 1);
}

/*
 * Another process opens the session while its first process has not yet
 * reconnected to the next broker: that open frees the grants the first
 * one's unread arms go again with. Before, the first process's reconnect
 * was accepted and those arms were dropped, after their calls had returned
 * 0 (10 of 10 here); now the reconnect is refused and the process learns
 * (-ENOTCONN) at once. With a restart between, the sessions file says
 * which attach held the session last.
 */
enum taker { OTHER_PROCESS, OTHER_PROCESS_THEN_RESTART, SAME_PROCESS };

/*
 * Session `name` opened, 10 arms (user_data 0-9) published into the ring
 * of a broker stopped and then killed, which never reads them: only a
 * resume brings them to the next broker, which is up when this returns.
 * *last: the last one's id.
 */
static chime_t *arms_only_a_resume_brings(const char *name, chime_id_t *last)
{
	chime_t *c;

	start("-n 1");
	c = sopen_ok(name);
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	for (unsigned i = 0; i < 10; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, i, last), 0);
	restart(SIGKILL, "-n 1");
	return c;
}

static void taken_meanwhile(enum taker by)
{
	chime_id_t id;
	pid_t pid;
	chime_t *c = arms_only_a_resume_brings("taken", &id);
	int st;

	if (by == SAME_PROCESS) {
		chime_close(sopen_ok("taken"));
	} else {
		pid = child(open_and_close_taken, NULL);
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other process could not open the session");
	}
	if (by == OTHER_PROCESS_THEN_RESTART)
		restart(SIGTERM, "-n 1");
	cr_assert_eq(wait_until_dead(c), -ENOTCONN, "the first process resumed a session another one took");
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 10, &id), -ENOTCONN);
	chime_close(c);
}

Test(restart, a_session_another_process_opened_meanwhile_is_not_resumed)
{
	taken_meanwhile(OTHER_PROCESS);
}

Test(restart, a_session_another_process_opened_before_a_second_restart_is_not_resumed)
{
	taken_meanwhile(OTHER_PROCESS_THEN_RESTART);
}

/* Another chime_t of the same process: the pid alone let it resume (found by a review); the token does not. */
Test(restart, a_session_opened_again_by_the_same_process_meanwhile_is_not_resumed)
{
	taken_meanwhile(SAME_PROCESS);
}

/*
 * Another process of the session's user that attaches "held" by hand and
 * fails each time before anything is attached: it answers its welcome
 * unsealed, then malformed, then hangs up with it unanswered. Exits 0 once
 * each failed as meant (an -EBUSY, the last attempt's hang-up not yet
 * seen, is tried again).
 */
static void attach_and_fail(int wfd, void *arg)
{
	static const enum t_answer bad[] = { T_ANSWER_UNSEALED, T_ANSWER_MALFORMED };
	struct chime_welcome w;
	int fd, r, tries = 0;

	(void)arg;
	for (unsigned i = 0; i < 3; i++) {
		do {
			fd = t_raw_hello(t_session_sock, "held", 0, 0);
			if (fd < 0 || tries++ > 500)
				_exit(1);
			if (i < 2)
				r = t_answer_offer_as(fd, bad[i], NULL, NULL);
			else    /* its descriptors dropped unread, and gone */
				r = recv(fd, &w, sizeof(w), 0) == (ssize_t)sizeof(w) ? w.status : -EBADMSG;
			if (r == -EBUSY) {
				close(fd);
				usleep(10 * 1000);
			}
		} while (r == -EBUSY);
		if (r != 0 || (i < 2 && t_attach_answer(fd) != -EPROTO))
			_exit(2);
		close(fd);
	}
	(void)!write(wfd, "r", 1);
}

/*
 * A session's process has not reconnected to the next broker yet, and
 * another process of its user fails to attach the session meanwhile
 * (attach_and_fail()): nothing was attached, the grants the first
 * process's unread arms name are still carried, and the session is as it
 * was, so the first process resumes it and those arms reach the broker.
 * With a restart between, the sessions file says the same.
 */
static void failed_attach_meanwhile(bool restart_between)
{
	struct chime_event ev;
	char cmd[700];
	chime_id_t id;
	pid_t pid;
	chime_t *c;
	int st, r = 0;

	c = arms_only_a_resume_brings("held", &id);
	pid = child(attach_and_fail, NULL);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other process's attaches did not fail as meant");
	if (restart_between) {
		/*
		 * Once its last hang-up is seen: a broker killed while an attach
		 * is under way leaves its record to the next (client_reattach()).
		 */
		snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' sessions 2>/dev/null | grep -q '^held .* detached '",
			 getenv("CHIMECTL"), tb.sock);
		for (int i = 0; i < 100 && system(cmd) != 0; i++)
			usleep(50 * 1000);
		cr_assert_eq(system(cmd), 0, "the session is not detached again after the failed attaches");
		restart(SIGKILL, "-n 1");
	}
	for (uint64_t t0 = now_ns(); r >= 0 && t_nodes(tb.sock, ARMED_STATES) < 10 && now_ns() - t0 < 5000 * MS;)
		r = chime_wait(c, &ev, 1, 10);
	cr_assert_geq(r, 0, "the first process could not resume a session only a failed attach touched: %s",
		      strerror(-r));
	cr_assert_eq(t_nodes(tb.sock, ARMED_STATES), 10, "its unread arms did not reach the broker");
	cr_assert_eq(chime_cancel(c, id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 9), 9, "an id from before the restart no longer works");
	cr_assert_eq(chime_arm(c, 0, now_ns() + 20 * MS, 0, 99, &id), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1);
	cr_assert_eq(ev.user_data, 99);
	chime_close(c);
}

Test(restart, a_failed_attach_by_another_process_leaves_the_session_to_its_resume)
{
	failed_attach_meanwhile(false);
}

Test(restart, a_failed_attach_by_another_process_leaves_the_session_to_its_resume_across_a_restart)
{
	failed_attach_meanwhile(true);
}

/* The same for a session dropped (or reclaimed, or discarded by --fresh) while no broker ran. */
Test(restart, a_session_dropped_meanwhile_is_not_resumed)
{
	struct chime_opts o = { .session = "dropped" };
	chime_id_t id;
	chime_t *c;

	start("-n 1");
	c = open_armed("dropped", 10, &id);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	restart(SIGTERM, "-n 1");
	o.socket_path = tb.sock;
	cr_assert_eq(chime_drop_session(&o), 0);
	cr_assert_eq(wait_until_dead(c), -ENOTCONN, "the process went on in a new session, its timers gone");
	chime_close(c);
}

/*
 * The old ring full of records the broker never read (it was stopped, then
 * killed): 8 resets and 8 arms go again; the new ring has no room left for
 * RESUMED at once, and it follows as soon as there is: the 8 grants the
 * resets' slots carried are freed.
 */
Test(restart, a_full_ring_of_records_goes_again_and_the_grants_are_freed)
{
	struct chime_event ev[32];
	chime_id_t id[16];
	uint64_t t0 = now_ns();
	chime_t *c;
	unsigned n;

	start("-n 1 --sq-size 16");
	c = sopen_ok("full");
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(chime_arm(c, 0, t0 + HOUR, 0, i, &id[i]), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 8), 8);
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	for (unsigned i = 0; i < 8; i++) {
		cr_assert_eq(chime_reset(c, id[i], t0 + 300 * MS), 0);
		cr_assert_eq(chime_arm(c, 0, t0 + 300 * MS, 0, 8 + i, &id[8 + i]), 0);
	}
	restart(SIGKILL, "-n 1 --sq-size 16");
	n = collect(c, ev, 32, now_ns() + 1500 * MS);
	cr_assert_eq(n, 16, "%u of the 16 timers fired (8 re-submitted resets, 8 arms)", n);
	for (unsigned k = 0; k < n; k++)
		cr_assert_eq(ev[k].deadline_ns, t0 + 300 * MS, "timer %llu at another deadline",
			     (unsigned long long)ev[k].user_data);
	cr_assert_eq(t_nodes_settle(tb.sock, 1u << CHIME_NODE_GRANTED, 16), 16,
		     "carried grants left after a full ring was re-submitted");
	chime_close(c);
}

/*
 * The key index hashes with a seed new every broker run: a broker that
 * takes over a session refills it under its own seed, so cancel_key still
 * finds every restored timer of the key, and only those.
 */
Test(restart, cancel_key_finds_restored_timers_under_the_new_brokers_hash)
{
	struct chime_event ev[256];
	uint64_t dl = now_ns() + 700 * MS;
	chime_t *c;
	chime_id_t id;
	unsigned n;

	start("");
	c = sopen_ok("keys");
	for (unsigned i = 0; i < 200; i++)
		cr_assert_eq(chime_arm(c, i % 2 ? 42 : 1000 + i, dl, 0, i, &id), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 200), 200);
	chime_close(c);
	restart(SIGKILL, "");
	c = sopen_ok("keys");
	cr_assert_eq(chime_cancel_key(c, 42), 0);
	n = collect(c, ev, 256, now_ns() + 1500 * MS);
	cr_assert_eq(n, 100, "%u events, expected the 100 timers not under key 42", n);
	for (unsigned i = 0; i < n; i++)
		cr_assert_neq(ev[i].key, 42, "a timer of the cancelled key fired (user_data %llu)",
			      (unsigned long long)ev[i].user_data);
	chime_close(c);
}

/*
 * What a session process shares with the test before it is killed: how
 * many of its arms returned, and which of them it cancelled (the call
 * returned).
 */
#define KW_MAX 200000u
struct kw_shared {
	uint32_t armed;                 /* arms 0..armed-1 returned 0 */
	uint32_t cancelling;            /* 1 + the index whose cancel was called last (maybe not returned) */
	uint8_t cancelled[KW_MAX];
};

/* The session process: arms one-shots 800 ms ahead (user_data = i), cancels every third, until killed. */
static void kw_worker(struct kw_shared *sh)
{
	struct chime_opts o = { .socket_path = tb.sock, .session = "killwin" };
	chime_t *c;

	if (chime_open(&c, &o) < 0)
		_exit(1);
	for (uint32_t i = 0; i < KW_MAX; i++) {
		chime_id_t id;

		if (chime_arm(c, 1, now_ns() + 800 * MS, 0, i, &id) < 0)
			_exit(2);
		at_store_rel(&sh->armed, i + 1);
		if (i % 3 != 2)
			continue;
		at_store_rel(&sh->cancelling, i + 1);
		if (chime_cancel(c, id) == 0)
			at_store_rel(&sh->cancelled[i], 1);
	}
	pause();
	_exit(0);
}

/*
 * A planned stop parks each session by reading its rings once: a record
 * published after that was only in the process until its library's
 * reconnect handed it to the next broker, and a process killed before
 * that lost arms and cancels whose calls had returned (a reliability
 * audit: 1050 arms lost and 20 cancelled timers fired in 5 restarts, each
 * kill 0-20 ms after the stop). The broker now says it is stopping before
 * it parks (CHIME_BROKER_STOPPING), and a call that sees that after its
 * publication waits for the reconnect. Three rounds, the process killed 0,
 * 5 and 12 ms into the stop while it arms as fast as it can: every arm
 * that returned and was not cancelled fires for the next process, no
 * cancelled one does.
 */
Test(restart, a_session_process_killed_during_a_planned_stop_loses_no_returned_call)
{
	static const unsigned kill_after_us[] = { 0, 5000, 12000 };
	struct kw_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint8_t *seen = calloc(KW_MAX, 1);

	cr_assert_neq(sh, MAP_FAILED);
	cr_assert_not_null(seen);
	start("-n 1");
	for (unsigned round = 0; round < 3; round++) {
		uint32_t armed, lost = 0, first_lost = 0, fired_cancelled = 0, want = 0, got = 0;
		struct chime_event ev[256];
		chime_t *c;
		pid_t pid;
		uint64_t t0;

		memset(sh, 0, sizeof(*sh));
		memset(seen, 0, KW_MAX);
		pid = fork();
		cr_assert_geq(pid, 0);
		if (pid == 0)
			kw_worker(sh);
		while (at_load_acq(&sh->armed) < 1000)
			usleep(200);
		cr_assert_eq(kill(tb.pid, SIGTERM), 0);
		usleep(kill_after_us[round]);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		armed = at_load_acq(&sh->armed);
		/* A cancel killed in its call may or may not be applied: that timer is neither promised. */
		if (sh->cancelling == armed && !sh->cancelled[armed - 1])
			armed--;
		restart(0, "-n 1");
		for (uint32_t i = 0; i < armed; i++)
			want += !sh->cancelled[i];
		c = sopen_ok("killwin");
		for (t0 = now_ns(); got < want && now_ns() - t0 < 3000 * MS;) {
			int n = chime_wait(c, ev, 256, 100);

			for (int k = 0; k < n; k++) {
				uint64_t i = ev[k].user_data;

				if (i >= armed || seen[i]++)
					continue;
				if (sh->cancelled[i])
					fired_cancelled++;
				else
					got++;
			}
		}
		for (uint32_t i = 0; i < armed; i++)
			if (!sh->cancelled[i] && !seen[i] && lost++ == 0)
				first_lost = i;
		chime_close(c);
		cr_assert(lost == 0 && fired_cancelled == 0,
			  "round %u (killed %u us into the stop): %u of %u returned arms lost (the first: %u), %u "
			  "cancelled timers fired", round, kill_after_us[round], lost, armed, first_lost, fired_cancelled);
		{
			struct chime_opts o = { .socket_path = tb.sock, .session = "killwin" };

			cr_assert_eq(chime_drop_session(&o), 0, "round %u: the session could not be ended", round);
		}
	}
	free(seen);
	munmap(sh, sizeof(*sh));
}


/* ---- (10) the stop and restart life cycle: signals, parks cut short, what the next broker gets ---- */

/* Reap the test's broker within `ms`: its wait status, or -1 if it still runs (it is left running). */
static int reap_within(unsigned ms)
{
	uint64_t t0 = now_ns();
	int st;

	do {
		if (waitpid(tb.pid, &st, WNOHANG) == tb.pid) {
			tb.pid = 0;
			return st;
		}
		usleep(10 * 1000);
	} while (now_ns() - t0 < ms * MS);
	return -1;
}

/*
 * SIGTERM (systemctl stop, chimectl shutdown) while a chimectl restart
 * parks the sessions stops the broker for good: a second signal "stops at
 * once" (chimed(8)). It executed chimed again instead, so the stop never
 * came (systemd waits, then SIGKILLs the new broker). The shard is held so
 * that the restart is still parking "held" when SIGTERM comes.
 */
Test(restart, sigterm_during_a_restart_stops_the_broker_instead_of_restarting_it)
{
	char log[300];
	chime_t *held;
	int tid, st;

	start_logged("-n 1", log, sizeof(log));
	held = sopen_ok("held");
	tid = shard0_hold();
	kill(tb.pid, SIGUSR2);
	if (!log_says(log, "SIGUSR2 received", "") && !log_says(log, "SIGUSR2 received", "")) {
		/* Released before any assertion: a test that ends with it held never reaps the broker. */
		(void)t_thread_release(tid);
		cr_assert_fail("the broker did not begin its restart within 6 s");
	}
	kill(tb.pid, SIGTERM);
	/* the stop is at once now: the shard must be back within its 2 s to stop */
	(void)log_says(log, "SIGTERM received", "");
	cr_assert_eq(t_thread_release(tid), 0);
	st = reap_within(10000);
	cr_assert_neq(st, -1, "chimed still runs 10 s after SIGTERM (it executed itself again: %s)",
		      log_lines(log, "executing", "again") ? "yes" : "no");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
	cr_assert_eq(log_lines(log, "executing", "again"), 0, "the broker executed itself again");
	chime_close(held);
	/* The session went to the next broker all the same. */
	restart(0, "-n 1");
	cr_assert_eq(sopen(&held, "held"), 0, "the session was not handed over");
	chime_close(held);
}

/*
 * A second SIGUSR2 (a second chimectl restart, a retry) while a restart
 * parks the sessions: the restart under way goes on, its park whole. It
 * was taken as a second stop signal, logged "SIGUSR2 received: stopping"
 * (it restarted), and cut the park short: the sessions went to the next
 * broker as after a crash, where a planned restart delivers each event
 * exactly once. The shard is held so that the restart is still parking
 * "held" when the second signal comes.
 */
Test(restart, a_second_sigusr2_during_a_restart_does_not_cut_its_park_short)
{
	char log[300];
	chime_t *held;
	int tid;

	start_logged("-n 1", log, sizeof(log));
	held = sopen_ok("held");
	tid = shard0_hold();
	kill(tb.pid, SIGUSR2);
	if (!log_says(log, "SIGUSR2 received", "")) {
		(void)t_thread_release(tid);
		cr_assert_fail("the broker did not begin its restart within 3 s");
	}
	kill(tb.pid, SIGUSR2);
	/* the second one read (a line of its own, as the first), or 1 s */
	for (int i = 0; i < 100 && log_lines(log, "SIGUSR2", "") < 2; i++)
		usleep(10 * 1000);
	cr_assert_eq(t_thread_release(tid), 0);
	for (int i = 0; i < 1000 && log_lines(log, "listening on", "") < 2; i++)
		usleep(10 * 1000);
	cr_assert_eq(log_lines(log, "listening on", ""), 2, "the broker did not restart");
	cr_expect_eq(log_lines(log, "still parking or attaching", ""), 0, "the second SIGUSR2 cut the park short");
	cr_expect_eq(log_lines(log, "SIGUSR2 received", "stopping"), 0, "a SIGUSR2 was said to stop the broker");
	chime_close(held);
	cr_assert_eq(sopen(&held, "held"), 0, "the session was not handed over");
	chime_close(held);
}

struct hup_spam {
	pid_t pid;
	int stop;
};

static void *hup_spam_main(void *arg)
{
	struct hup_spam *h = arg;

	while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) {
		kill(h->pid, SIGHUP);
		usleep(100);
	}
	return NULL;
}

/*
 * A SIGHUP (systemctl reload, logrotate), SIGTERM or SIGUSR2 that comes
 * while chimed executes itself again (chimectl restart) waits for the new
 * broker's signalfd. The restart unblocked them for the exec, and one that
 * came between then and the new main()'s block took its default action: a
 * SIGHUP killed the broker (3 runs in 3 by hand, within 1235 signals), a
 * broker gone for good unless a service manager starts another.
 */
Test(restart, a_signal_while_chimed_executes_itself_again_does_not_kill_it)
{
	struct hup_spam h;
	pthread_t thr;
	char log[300];
	uint64_t t0;
	int st = -1;
	bool died = false;

	start_logged("-n 1", log, sizeof(log));
	h = (struct hup_spam){ .pid = tb.pid };
	cr_assert_eq(pthread_create(&thr, NULL, hup_spam_main, &h), 0);
	cr_assert_eq(kill(tb.pid, SIGUSR2), 0);
	for (t0 = now_ns(); now_ns() - t0 < 10000 * MS; usleep(10 * 1000)) {
		if (waitpid(tb.pid, &st, WNOHANG) == tb.pid) {
			tb.pid = 0;
			died = true;
			break;
		}
		if (log_lines(log, "listening on", "") >= 2)
			break;
	}
	__atomic_store_n(&h.stop, 1, __ATOMIC_RELEASE);
	pthread_join(thr, NULL);
	cr_assert(!died, "chimed died while it executed itself again: %s %d", WIFSIGNALED(st) ? "signal" : "status",
		  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	cr_assert_geq(log_lines(log, "listening on", ""), 2, "chimed did not run again within 10 s");
	stop_now(SIGTERM);
}

struct opener {
	const char *session;
	unsigned delay_ms;      /* before the open */
	chime_t *c;
	int r;
};

static void *opener_main(void *arg)
{
	struct opener *o = arg;

	usleep(o->delay_ms * 1000u);
	o->r = sopen(&o->c, o->session);
	return NULL;
}

/*
 * A process that opens a detached session anew gets a new token in its
 * welcome, and resumes with it after a crash; the broker wrote the token to
 * the sessions file only after the welcome was sent, so a broker killed in
 * between left the last process's token there, and the next broker refused
 * the resume (ESTALE): the process's calls failed with ENOTCONN, its
 * session left to its old linger. The control thread is traced and the
 * broker killed as its send() of its last answer (the attach done: struct
 * chime_mapped) returns.
 */
Test(restart, a_broker_killed_right_after_a_reattach_s_welcome_lets_the_process_resume)
{
	/*
	 * The open after the control thread is traced: opened at once, its
	 * welcome went before the trace began in one CI run (a loaded host),
	 * and no send() came in the 10 s after.
	 */
	struct opener o = { .session = "again", .delay_ms = 200 };
	struct chime_event ev;
	pthread_t thr;
	chime_id_t id;
	chime_t *c;
	int r;

	unsetenv("NOTIFY_SOCKET");      /* that answer is then the control thread's first send() */
	start("-n 1");
	c = sopen_ok("again");
	chime_close(c);         /* detached: the open below is a re-attach with a new token */
	cr_assert_eq(pthread_create(&thr, NULL, opener_main, &o), 0);
	r = t_kill_after_syscall(tb.pid, tb.pid, SYS_sendto, 10000);
	if (r == -EPERM || r == -EACCES)
		cr_skip("ptrace(PTRACE_SEIZE) of the control thread: %s", strerror(-r));
	pthread_join(thr, NULL);
	cr_assert_eq(r, 0, "the broker sent no welcome within 10 s: %s", strerror(-r));
	cr_assert_eq(o.r, 0, "the open whose welcome was sent failed: %s", strerror(-o.r));
	restart(0, "-n 1");
	r = chime_arm(o.c, 0, now_ns() + 50 * MS, 0, 9, &id);
	cr_assert_eq(r, 0, "an arm after the crash: %s", strerror(-r));
	for (uint64_t t0 = now_ns(); now_ns() - t0 < 5000 * MS;) {
		r = chime_wait(o.c, &ev, 1, 100);
		cr_assert_geq(r, 0, "the process could not go on in its session: %s", strerror(-r));
		if (r == 1)
			break;
	}
	cr_assert_eq(r, 1, "the timer armed after the crash did not fire");
	cr_assert_eq(ev.user_data, 9);
	chime_close(o.c);
}

/*
 * A stop with a shard wedged (held under ptrace past its 2 s to stop) gives
 * up on it and exits 1, removing what it can. With no session to keep, that
 * is every file: it left the sessions file behind.
 */
Test(restart, a_stop_that_gives_up_on_a_wedged_shard_leaves_no_file_when_no_session_is_kept)
{
	char log[300], path[PATH_MAX];
	chime_t *c;
	chime_id_t id;
	int tid, st, n;

	start_logged("-n 2", log, sizeof(log));
	c = sopen_ok(NULL);
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 1, &id), 0);
	tid = shard0_hold();
	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	if (!log_says(log, "did not stop within", "") && !log_says(log, "did not stop within", "")) {
		(void)t_thread_release(tid);
		cr_assert_fail("the stop did not give up on the held shard within 6 s");
	}
	/* The held thread's end is ours to reap (its tracer's) before the process's is its parent's. */
	cr_assert_eq(waitpid(tid, &st, __WALL), tid);
	st = reap_within(10000);
	cr_assert_neq(st, -1, "chimed still runs 10 s after it gave up on its shard");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %#x", st);
	chime_close(c);
	snprintf(path, sizeof(path), "%s.sessions", tb.sock);
	n = t_count_files(tb.dir);
	cr_assert_eq(n, 1, "%d files left behind (the log is one) with no session to keep (the sessions file %s)",
		     n, access(path, F_OK) == 0 ? "among them" : "not");
}

/*
 * chimectl shutdown waits for a stop as long as one may take: a session's
 * park up to 5 s, then its shard's stop. It waited 5 s and said the
 * broker "did not exit" of a stop that then ended well (a review). The
 * shard is held past the park's 5 s, then let go.
 */
Test(restart, chimectl_shutdown_waits_out_a_stop_whose_park_takes_its_5_s)
{
	const char *ctl = getenv("CHIMECTL");
	char log[300], cmd[600];
	chime_t *held;
	pid_t sh;
	int tid, st;

	cr_assert_not_null(ctl);
	start_logged("-n 1", log, sizeof(log));
	held = sopen_ok("held");
	tid = shard0_hold();
	snprintf(cmd, sizeof(cmd), "exec '%s' --socket '%s' shutdown >/dev/null", ctl, tb.sock);
	sh = fork();
	if (sh == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	cr_assert_gt(sh, 0);
	usleep(5500 * 1000);
	cr_assert_eq(t_thread_release(tid), 0);
	cr_assert_eq(waitpid(sh, &st, 0), sh);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		  "chimectl shutdown of a stop that took 5.5 s: status %#x (its log: %s)", st, log);
	st = reap_within(10000);
	cr_assert_neq(st, -1, "chimed still runs 10 s after its shard was let go");
	chime_close(held);
}

/*
 * A session "fresh" opened while the shard is held, a stop (cut short by a
 * second SIGTERM) before its welcome: the open is refused, and the next
 * broker takes over "held" alone.
 */
static void open_interrupted_by_a_stop(bool cut_short)
{
	struct opener o = { .session = "fresh" };
	char log[300], next[300], extra[400];
	pthread_t thr;
	chime_t *held;
	int tid, st;

	cr_assert_not_null(getenv("CHIMECTL"));
	start_logged("-n 1", log, sizeof(log));
	held = sopen_ok("held");
	tid = shard0_hold();
	cr_assert_eq(pthread_create(&thr, NULL, opener_main, &o), 0);
	if (!session_listed("fresh", true)) {
		(void)t_thread_release(tid);
		cr_assert_fail("the broker does not list the session being opened");
	}
	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	(void)log_says(log, "SIGTERM received", "");
	if (cut_short) {
		kill(tb.pid, SIGTERM);  /* at once: "fresh" still attaching, "held" not parked */
		usleep(100 * 1000);
	}
	cr_assert_eq(t_thread_release(tid), 0);
	pthread_join(thr, NULL);
	st = reap_within(10000);
	cr_assert_neq(st, -1, "chimed still runs 10 s after %s", cut_short ? "two SIGTERMs" : "SIGTERM");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
	if (o.r == 0)
		chime_close(o.c);
	cr_expect_eq(o.r, -ECONNREFUSED, "the open during the stop: %s", strerror(-o.r));
	chime_close(held);
	snprintf(next, sizeof(next), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 1 2>'%s'", next);
	restart(0, extra);
	cr_assert(log_lines(next, "taking over 1 session from", ""),
		  "the next broker did not take over exactly the one session there was");
}

/*
 * An open that creates a session, caught by a stop before its welcome, is
 * refused as every open during a stop is (ECONNREFUSED: open again once the
 * next broker listens), and the session it would have created is no more.
 * It was parked for the next broker instead: the process got ECONNRESET,
 * and the next broker kept an empty session it never had, under its user's
 * name and client quota, for the whole linger (an hour by default). The
 * shard is held so that the attach is still in flight when SIGTERM comes.
 */
Test(restart, a_new_session_whose_open_a_stop_interrupts_is_refused_and_not_handed_over)
{
	open_interrupted_by_a_stop(false);
}

struct late_signal {
	pid_t pid;
	int sig;
	unsigned ms;
};

static void *late_signal_main(void *arg)
{
	struct late_signal *l = arg;

	usleep(l->ms * 1000);
	kill(l->pid, l->sig);
	return NULL;
}

static void *arm_100_main(void *arg)
{
	chime_id_t id;

	for (unsigned i = 0; i < 100; i++)
		if (chime_arm(arg, 0, now_ns() + HOUR, 0, 100 + i, &id) < 0)
			return (void *)1;
	return NULL;
}

/* A detached session "halves" with 100 timers on each of the two shards, applied. */
static void halves_armed(void)
{
	pthread_t thr;
	chime_id_t id;
	chime_t *c;
	void *ret;

	/* Each thread arms on a shard of its own (home_shard()): this one on shard 0, the next on shard 1. */
	c = open_armed("halves", 100, &id);
	cr_assert_eq(pthread_create(&thr, NULL, arm_100_main, c), 0);
	pthread_join(thr, &ret);
	cr_assert_null(ret, "the second thread's arms failed");
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 200), 200);
}

/*
 * A stop writes a removed shard file again, and a broker killed in the
 * middle of that copy leaves no half-written file at its path: the copy is
 * named only once complete. It was created at the path first, its size
 * set, then filled: killed in between, the next broker found a shard file
 * with a zeroed header and refused to start, and the way out (--fresh)
 * discarded every shard's timers, not only those of the removed file. The
 * control thread is traced and the broker killed as the copy's ftruncate()
 * returns.
 */
Test(restart, a_broker_killed_while_it_writes_a_removed_shard_file_again_leaves_no_half_file)
{
	struct late_signal term;
	char log[300], next[300], extra[400], path[PATH_MAX];
	pthread_t thr;
	int r;

	start_logged("-n 2", log, sizeof(log));
	halves_armed();
	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	cr_assert_eq(unlink(path), 0);
	term = (struct late_signal){ .pid = tb.pid, .sig = SIGTERM, .ms = 200 };
	cr_assert_eq(pthread_create(&thr, NULL, late_signal_main, &term), 0);
	r = t_kill_after_syscall(tb.pid, tb.pid, SYS_ftruncate, 10000);
	pthread_join(thr, NULL);
	if (r == -EPERM || r == -EACCES)
		cr_skip("ptrace(PTRACE_SEIZE) of the control thread: %s", strerror(-r));
	cr_assert_eq(r, 0, "the stop did not write the removed file again within 10 s: %s", strerror(-r));
	snprintf(next, sizeof(next), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", next);
	r = t_chimed_restart(&tb, 0, extra);
	cr_assert_eq(r, 0, "the next broker did not start (%s)",
		     log_lines(next, "damaged header", "") ? "a damaged header: the file half written" : "see its log");
	/* The removed shard's timers are lost (the crash came before its copy); the other shard's are kept. */
	r = (int)t_nodes(tb.sock, ARMED_STATES);
	cr_assert_eq(r, 100, "%d of the 200 timers kept, not the 100 of shard 1", r);
	cr_assert(log_lines(next, "shard0", "is missing"), "the next broker did not say shard 0's file was missing");
}

/*
 * A broker killed as it creates its sessions file (a first start: none was
 * there) leaves no empty one: the next broker refused an empty file as
 * damaged ('Bad message', --fresh discards it) and did not start. It is
 * written unnamed and linked at its path once complete.
 */
Test(restart, a_broker_killed_as_it_creates_its_sessions_file_does_not_keep_the_next_from_starting)
{
	char sock[sizeof(tb.sock)], dir[sizeof(tb.dir)];
	int r = t_chimed_killed_at(&tb, NULL, "-n 1", SYS_openat, ".sessions");

	cr_assert_eq(r, 0, "chimed did not create its sessions file within 10 s: %s", strerror(-r));
	snprintf(sock, sizeof(sock), "%s", tb.sock);
	snprintf(dir, sizeof(dir), "%s", tb.dir);
	r = t_chimed_start(&tb, sock, "-n 1");
	tb.own_dir = 1;         /* stop() removes it, started or not */
	snprintf(tb.dir, sizeof(tb.dir), "%s", dir);
	cr_assert_eq(r, 0, "the next broker did not start");
	t_session_sock = tb.sock;
	chime_close(sopen_ok("after"));
}

/*
 * A shard file that is empty, or whose magic was never stored (0: "not
 * ready", chime_shm.h), is one whose creation never finished:
 * chime_seg_file() creates it, then sets its size, and shard_init() writes
 * its header and publishes it last. A broker killed in there (re-creating
 * a shard file that was missing while it restored the sessions) left such
 * a file, and the next broker refused it ("another --capacity?", "damaged
 * header") and did not start. It is a missing file: counted lost, the other
 * shards' timers kept. The file is written here as each kill leaves it:
 * empty (killed before the ftruncate(): strace -e inject=ftruncate:signal=KILL
 * did it), and the right size, all zero (killed after it).
 */
static void never_finished_file(bool sized)
{
	char log[300], next[300], extra[400], path[PATH_MAX];
	struct stat st;
	int fd, r;

	start_logged("-n 2", log, sizeof(log));
	halves_armed();
	stop_now(SIGTERM);
	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(unlink(path), 0);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, st.st_mode & 07777);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, sized ? st.st_size : 0), 0);
	close(fd);
	snprintf(next, sizeof(next), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", next);
	r = t_chimed_restart(&tb, 0, extra);
	cr_assert_eq(r, 0, "the next broker did not start with an %s shard file (%s)", sized ? "unpublished" : "empty",
		     log_lines(next, "damaged header", "") ? "a damaged header" :
		     log_lines(next, "another --capacity", "") ? "another --capacity?" : "see its log");
	cr_assert(log_lines(next, "shard0", "is missing"), "the next broker did not count shard 0 lost");
	r = (int)t_nodes(tb.sock, ARMED_STATES);
	cr_assert_eq(r, 100, "%d of the 200 timers kept, not the 100 of shard 1", r);
}

Test(restart, an_empty_shard_file_a_killed_broker_was_creating_is_taken_as_missing)
{
	never_finished_file(false);
}

Test(restart, a_shard_file_whose_creation_never_finished_is_taken_as_missing)
{
	never_finished_file(true);
}

/*
 * The same open, with the stop cut short by a second SIGTERM while the
 * attach is still in flight (the shard held): its session holds nothing and
 * is not handed over either, and the open is refused with ECONNREFUSED. It
 * went to the next broker as an empty session (its opener saw ECONNRESET).
 */
Test(restart, a_new_session_whose_open_a_stop_cut_short_interrupts_is_not_handed_over)
{
	open_interrupted_by_a_stop(true);
}

/*
 * --fresh discards the sessions file first, then the shard files: a broker
 * killed in between leaves shard files without a sessions file, whose
 * timers the next broker discards (with a warning), as --fresh asked. The
 * shard files went first, and a broker killed before the sessions file left
 * the sessions to the next one without their timers: restored empty for
 * their linger, with an error per shard that their timers were lost (and
 * chimectl restart failing on shards_lost). Killed as --fresh begins to
 * remove the sessions file.
 */
Test(restart, a_fresh_start_killed_midway_brings_no_session_back_without_its_timers)
{
	char log[300], sock[sizeof(tb.sock)], dir[sizeof(tb.dir)], extra[400];
	struct t_chimed fresh;
	chime_id_t id;
	int r;

	start("-n 2");
	chime_close(open_armed("dropped", 10, &id));
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 10), 10);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
	tb.pid = 0;
	r = t_chimed_killed_at(&fresh, tb.sock, "-n 2 --fresh", SYS_unlink, ".sessions");
	cr_assert_eq(r, 0, "chimed --fresh did not remove the sessions file within 10 s: %s", strerror(-r));
	snprintf(sock, sizeof(sock), "%s", tb.sock);
	snprintf(dir, sizeof(dir), "%s", tb.dir);
	snprintf(log, sizeof(log), "%s/next.log", dir);
	snprintf(extra, sizeof(extra), "-n 2 2>'%s'", log);
	r = t_chimed_start(&tb, sock, extra);
	tb.own_dir = 1;         /* stop() removes it, started or not */
	snprintf(tb.dir, sizeof(tb.dir), "%s", dir);
	cr_assert_eq(r, 0, "the next broker did not start");
	cr_assert_eq(log_lines(log, "is missing", ""), 0, "the next broker took sessions over without their timers");
	r = (int)t_nodes(tb.sock, ARMED_STATES);
	cr_assert(r == 0 || r == 10, "%d of the session's 10 timers", r);
}

/*
 * A planned stop under a session's process with a slot one thread reserved
 * and never published, and two arms other threads published behind it,
 * their ids returned: the stop's park (a handover) stopped at that slot,
 * and the two arms lived only in the process's rings, which the next
 * broker never sees: the process gone before its library reconnected
 * (killed with the thread that held the slot, or while it waited for the
 * next broker), they were lost. The park steps over the slot at a stop too
 * now, and the stop does not wait for it.
 */
Test(restart, arms_published_behind_a_slot_never_published_survive_a_stop_and_the_processs_death)
{
	struct hole_x *x = mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_event ev[4];
	uint64_t t0, stop_ns;
	unsigned n;
	pid_t pid;
	chime_t *c;

	cr_assert_neq(x, MAP_FAILED);
	start("-n 1");
	x->dl = chime_now() + 1500 * MS;
	pid = child(hole_child, x);
	t0 = now_ns();
	kill(tb.pid, SIGTERM);
	cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
	stop_ns = now_ns() - t0;
	tb.pid = 0;
	kill_child(pid);
	cr_assert_lt(stop_ns, 2000 * MS, "the stop took %llu ms", (unsigned long long)(stop_ns / MS));
	restart(0, "-n 1");
	c = sopen_ok("holes");
	n = collect(c, ev, 4, x->dl + 1000 * MS);
	cr_assert_eq(n, 2, "%u events for the two arms published behind the slot never published", n);
	cr_assert(ev[0].id == x->ids[0] || ev[1].id == x->ids[0]);
	cr_assert(ev[0].id == x->ids[1] || ev[1].id == x->ids[1]);
	chime_close(c);
	munmap(x, sizeof(*x));
}

/*
 * The same stop under a process that lives on: the park steps over the
 * slot, the thread publishes it after the stop (an arm, by hand), and the
 * library's reconnect re-submits it to the next broker with what else the
 * old one never applied (its seq says so). Each of the three fires once.
 */
struct live_hole {
	struct hole_x x;
	chime_id_t late;
	int go;                 /* the test: the next broker runs */
	unsigned n;             /* the child: events it collected */
	struct chime_event ev[4];
};

static void live_hole_child(int wfd, void *arg)
{
	struct live_hole *h = arg;
	chime_t *c = sopen_ok("holes");
	struct chime_sqe *sqe;
	uint64_t pos;

	if (!(sqe = chime_sq_reserve(&c->chan[0].sq, &pos)))
		_exit(1);
	if (chime_arm(c, 1, h->x.dl, 0, 1, &h->x.ids[0]) || chime_arm(c, 1, h->x.dl, 0, 2, &h->x.ids[1]))
		_exit(1);
	(void)!write(wfd, "r", 1);
	while (!__atomic_load_n(&h->go, __ATOMIC_ACQUIRE))
		usleep(1000);
	h->late = sqe->grant;
	sqe->id = h->late;
	sqe->deadline_ns = h->x.dl;
	sqe->user_data = 3;
	sqe->op = CHIME_OP_ARM;
	chime_sq_publish(sqe, pos);
	h->n = collect(c, h->ev, 4, h->x.dl + 1000 * MS);
	_exit(0);
}

Test(restart, a_slot_published_after_a_stop_stepped_over_it_reaches_the_next_broker)
{
	struct live_hole *h = mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pid;
	int st;

	cr_assert_neq(h, MAP_FAILED);
	start("-n 1");
	h->x.dl = chime_now() + 1500 * MS;
	pid = child(live_hole_child, h);
	restart(SIGTERM, "-n 1");
	__atomic_store_n(&h->go, 1, __ATOMIC_RELEASE);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed: status %#x", st);
	cr_assert_eq(h->n, 3, "%u events for the two arms behind the slot and the one published in it late", h->n);
	for (unsigned i = 0; i < 3; i++) {
		chime_id_t want = i < 2 ? h->x.ids[i] : h->late;

		cr_assert(h->ev[0].id == want || h->ev[1].id == want || h->ev[2].id == want, "timer %u did not fire", i);
	}
	munmap(h, sizeof(*h));
}

/*
 * --fresh counts the timers an earlier broker left, for its message, by
 * reading each shard file at the path. In a socket directory others can
 * write (a shared /tmp), another user's file there was read too, or one a
 * symlink there named: cut short while it was read, the read past its end
 * killed the broker at its start (SIGBUS: 9 starts of 12 by hand, root's
 * broker in a 1777 directory on ext4, a file of nobody's with 131072 nodes
 * cut and written back in a loop; a race too rare on a small slab for a
 * test). Only a file an earlier broker could have left (chime_seg_ours(),
 * not through a symlink) is read now, which the count shows: another
 * user's 20,000 timers, or a symlink's, are not counted (they were). Both
 * are replaced all the same.
 */
Test(restart, a_fresh_start_does_not_read_another_uids_shard_file)
{
	char path[PATH_MAX], copy[PATH_MAX + 8], log[300], extra[400];
	struct stat st;
	chime_t *c;
	chime_id_t id;

	if (geteuid() != 0)
		cr_skip("needs root (gives a shard file to another uid)");
	start("-n 1");
	c = open_armed("counted", 20000, &id);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 20000), 20000);
	chime_close(c);
	snprintf(path, sizeof(path), "%s.shard0", tb.sock);
	snprintf(copy, sizeof(copy), "%s.copy", path);
	snprintf(log, sizeof(log), "%s/start.log", tb.dir);
	snprintf(extra, sizeof(extra), "-n 1 --fresh 2>'%s'", log);
	for (int round = 0; round < 2; round++) {
		kill(tb.pid, SIGKILL);
		cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
		tb.pid = 0;
		if (round == 0) {
			cr_assert_eq(link(path, copy), 0);      /* kept for the next round */
			cr_assert_eq(chown(path, 4242, 4242), 0);
		} else {
			cr_assert_eq(unlink(path), 0);
			cr_assert_eq(symlink(copy, path), 0);
			cr_assert_eq(chown(copy, 0, 0), 0);
		}
		restart(0, extra);
		cr_assert(t_file_has(log, "discarded 0 timers"), "%s the broker read: %s",
			  round ? "a symlink's file" : "uid 4242's file", t_file_has(log, "20000") ? "20000 counted" : "");
		cr_assert_eq(lstat(path, &st), 0);
		cr_assert(S_ISREG(st.st_mode) && st.st_uid == 0, "--fresh kept the file there");
	}
	unlink(copy);
}

/* ---- soak 2026-11-30 ("periodic 2/25619 never fired"): a periodic that came due only while its
 * session was detached holds one event; the next process's cancel_key before its first drain
 * discards that held event (chime_cancel(3): "even one the broker had already fired and not yet
 * delivered"), across a broker crash or none. Designed behaviour, not a loss. ---- */

#define DP_KEY 0x7777

struct dp_x {
	uint64_t d0;
};

static void dp_child(int wfd, void *arg)
{
	struct dp_x *x = arg;
	chime_t *c = NULL;
	chime_id_t id;

	if (sopen(&c, "detper") < 0)
		_exit(1);
	if (chime_arm(c, DP_KEY, x->d0, 100 * MS, 1, &id) < 0)      /* the periodic: d0 after the kill */
		_exit(2);
	if (chime_arm(c, 1, x->d0, 0, 2, &id) < 0)                  /* a one-shot of another key */
		_exit(3);
	chime_flush(c);
	(void)!write(wfd, "r", 1);
	pause();
}

static void detached_periodic(int sig, bool cancel_first)
{
	struct chime_event ev[64];
	struct dp_x x;
	unsigned n, nper = 0, none = 0;
	chime_t *c;
	pid_t pid;

	start("");
	x.d0 = now_ns() + 300 * MS;
	pid = child(dp_child, &x);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 2), 2);
	kill_child(pid);                        /* as p33 (END_KILL) before its periodic's d0 */
	while (now_ns() < x.d0 + 600 * MS)      /* due while detached: held, one event */
		usleep(10 * 1000);
	cr_assert_eq(t_nodes_settle(tb.sock, 1u << CHIME_NODE_BACKLOG, 2), 2,
		     "the periodic and the one-shot are not both held");
	if (sig)
		restart(sig, "");
	cr_assert_eq(t_nodes_settle(tb.sock, 1u << CHIME_NODE_BACKLOG, 2), 2,
		     "the held events did not survive the restart");
	c = sopen_ok("detper");
	if (cancel_first)
		cr_assert_eq(chime_cancel_key(c, DP_KEY), 0);
	n = collect(c, ev, 64, now_ns() + 500 * MS);
	for (unsigned i = 0; i < n; i++) {
		if (ev[i].user_data == 1) {
			nper++;
			if (nper == 1)
				cr_assert_eq(ev[i].deadline_ns, x.d0, "the held period is not d0");
		} else {
			none++;
		}
	}
	cr_assert_eq(none, 1, "the one-shot came %u times", none);
	if (cancel_first)
		cr_assert_eq(nper, 0, "a cancel_key returned the held periodic's event (%u)", nper);
	else
		cr_assert_geq(nper, 2, "the held period then the later ones: %u", nper);
	chime_close(c);
}

Test(restart, a_detached_periodics_held_event_is_taken_by_the_next_process)
{
	detached_periodic(SIGKILL, false);
}

Test(restart, a_detached_periodics_held_event_goes_with_a_cancel_key_before_the_first_drain_after_a_crash)
{
	detached_periodic(SIGKILL, true);
}

Test(restart, a_detached_periodics_held_event_goes_with_a_cancel_key_before_the_first_drain_no_restart)
{
	detached_periodic(0, true);
}

/* ---- a dispatch callback that waits for a thread arming on its session ---- */

struct cb_wait {
	chime_t *c;
	pthread_mutex_t table;          /* the application's: the callback and the worker take it */
	chime_id_t id;                  /* the worker's keepalive */
	volatile bool stop, in_cb, reset_done;
	volatile int reset_r;
	unsigned long fired;            /* under table */
};

static void cb_wait_event(const struct chime_event *ev, void *arg)
{
	struct cb_wait *w = arg;

	(void)ev;
	w->in_cb = true;
	pthread_mutex_lock(&w->table);
	w->fired++;
	pthread_mutex_unlock(&w->table);
}

static void *cb_wait_dispatcher(void *arg)
{
	struct cb_wait *w = arg;

	while (!w->stop)
		if (chime_dispatch(w->c, cb_wait_event, w, 0) <= 0)
			usleep(1000);
	return NULL;
}

/* The worker: its keepalive reset with the table held (the test holds it for it). */
static void *cb_wait_worker(void *arg)
{
	struct cb_wait *w = arg;

	w->reset_r = chime_reset(w->c, w->id, chime_now() + HOUR);
	w->reset_done = true;
	return NULL;
}

/*
 * A dispatch callback takes a lock of the application's that a worker
 * holds while it resets a timer of the same session (ordinary code: the
 * connection's object found under the table's mutex). After a planned
 * restart the worker's reset waits for the reconnect (a call that returns
 * during a stop is kept), which the session's lock excludes; the callback
 * ran under that lock, waiting for the worker: both waited for good (an
 * API audit: 2 restarts in 3 froze its process). The lock is let go while
 * a callback runs now. Here the callback is made to wait on the table
 * before the stop, and the worker resets with the table held after it.
 */
Test(restart, a_dispatch_callback_waiting_for_a_thread_that_arms_survives_a_planned_restart, .timeout = 60)
{
	static struct cb_wait w = { .table = PTHREAD_MUTEX_INITIALIZER };
	unsigned long fired;
	pthread_t d, k;
	chime_id_t now_id;

	start("-n 1");
	w.c = sopen_ok("cbwait");
	cr_assert_eq(chime_arm(w.c, 1, chime_now() + HOUR, 0, 1, &w.id), 0);
	cr_assert_eq(pthread_create(&d, NULL, cb_wait_dispatcher, &w), 0);
	/* The table held ("by the worker"), an event due: its callback waits for the table. */
	pthread_mutex_lock(&w.table);
	cr_assert_eq(chime_arm(w.c, 2, 0, 0, 2, &now_id), 0);
	for (int i = 0; i < 500 && !w.in_cb; i++)
		usleep(10 * 1000);
	cr_assert(w.in_cb, "the event's callback did not run");
	restart(SIGTERM, "-n 1");
	/* The worker's reset, the table still held for it: it must come back. */
	cr_assert_eq(pthread_create(&k, NULL, cb_wait_worker, &w), 0);
	for (int i = 0; i < 1000 && !w.reset_done; i++)
		usleep(10 * 1000);
	cr_assert(w.reset_done, "a reset made while a dispatch callback waits for its thread never returned "
		  "across a planned restart");
	pthread_mutex_unlock(&w.table);
	cr_assert_eq(w.reset_r, 0, "the reset: %s", strerror(-w.reset_r));
	cr_assert_eq(pthread_join(k, NULL), 0);
	for (int i = 0; i < 500; i++) {
		pthread_mutex_lock(&w.table);
		fired = w.fired;
		pthread_mutex_unlock(&w.table);
		if (fired)
			break;
		usleep(10 * 1000);
	}
	cr_assert_eq(fired, 1, "the event whose callback waited was delivered %lu times", fired);
	w.stop = true;
	cr_assert_eq(pthread_join(d, NULL), 0);
	/* The reset held through the restart: the keepalive is armed in the next broker, an hour ahead. */
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 1), 1);
	chime_close(w.c);
}

/* A close after its broker was killed outright (no successor) waits the second for one, not a stuck broker's ten. */
Test(restart, a_close_after_its_broker_was_killed_waits_a_second_not_ten)
{
	chime_id_t id;
	uint64_t t0, took;
	chime_t *c;
	int st;

	start("-n 1");
	c = sopen_ok("killed-close");
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	for (unsigned i = 0; i < 10; i++)
		cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, i, &id), 0);
	cr_assert_eq(kill(tb.pid, SIGKILL), 0);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	t0 = now_ns();
	chime_close(c);
	took = now_ns() - t0;
	cr_assert_gt(took, 900 * MS, "the close did not wait for a successor: %.0f ms", (double)took / 1e6);
	cr_assert_lt(took, 5000 * MS, "the close took %.0f ms", (double)took / 1e6);
}

/* ---- (9) a stop while a session's park is in its steps ---- */

/*
 * A named session's process goes with a full completion ring (--cq-size
 * 1048576: 1040000 events delivered, one in eight a periodic's, a quarter
 * of them taken), and a stop comes at once: the session's own park (not a
 * handover's) is in its steps (chan_park(), RECLAIM_BUDGET a pass) when
 * the stop begins, and the stop waits for it, up to 5 s (STOP_PARK_NS).
 * The next process of the session must get each event nobody took once,
 * none taken, ids and deadlines as armed, the periodics still armed.
 */
enum { BIG_N = 1040000, BIG_TAKEN = 260000 };   /* BIG_N: the quota, 1048576 less the grants of 1024 slots */

struct big {
	uint64_t t0;
	chime_id_t ids[BIG_N];
	uint8_t taken[BIG_N];
	char name[32];
};

static uint64_t big_due(const struct big *s, unsigned i)
{
	/* Due in an order other than their nodes', as hostile's: 400 ms from the first arm. */
	return s->t0 + ((uint64_t)i * UINT64_C(2654435761)) % (400 * MS);
}

static struct big *big_new(const char *name)
{
	struct big *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	cr_assert_neq(s, MAP_FAILED);
	snprintf(s->name, sizeof(s->name), "%s", name);
	return s;
}

/* Arm BIG_N timers (user_data i, every 8th periodic, an hour), wait for every event, take BIG_TAKEN; wait to be killed. */
static void big_child(int wfd, void *arg)
{
	static struct chime_event ev[4096];
	struct big *s = arg;
	chime_t *c = NULL;
	unsigned got = 0;
	uint64_t until;

	if (sopen(&c, s->name) < 0)
		_exit(1);
	s->t0 = now_ns();
	for (unsigned i = 0; i < BIG_N; i++)
		if (chime_arm(c, 0, big_due(s, i), i % 8 ? 0 : HOUR, i, &s->ids[i]) != 0)
			_exit(2);
	if (chime_flush(c) != 0)
		_exit(3);
	for (until = now_ns() + 20000 * MS; ring_count(c) < BIG_N; usleep(1000))
		if (now_ns() > until)
			_exit(4);
	while (got < BIG_TAKEN) {
		int r = chime_poll(c, ev, BIG_TAKEN - got < 4096 ? BIG_TAKEN - got : 4096);

		if (r <= 0)
			_exit(5);
		for (int k = 0; k < r; k++)
			s->taken[ev[k].user_data]++;
		got += (unsigned)r;
	}
	(void)!write(wfd, "r", 1);
	pause();
}

/*
 * A new process of s->name takes every event it gets until it has them
 * all (or until_ns), then 300 ms more: each one nobody took exactly once,
 * with its id and deadline; none taken. Returns how many it got.
 */
static uint64_t big_check(struct big *s, chime_t *c, uint64_t until_ns)
{
	static struct chime_event ev[8192];
	static uint8_t seen[BIG_N];
	uint64_t want = 0, got = 0, twice = 0, again = 0, lost = 0, quiet_until = 0;
	unsigned first_twice = BIG_N, first_again = BIG_N, first_lost = BIG_N;

	memset(seen, 0, sizeof(seen));
	for (unsigned i = 0; i < BIG_N; i++) {
		cr_assert_leq(s->taken[i], 1, "the dead process took timer %u's event %u times", i, s->taken[i]);
		want += !s->taken[i];
	}
	for (;;) {
		uint64_t now = now_ns();
		int r;

		if (now >= until_ns || (quiet_until && now >= quiet_until))
			break;
		r = chime_wait(c, ev, 8192, 50);
		cr_assert_geq(r, 0, "chime_wait: %s", strerror(-r));
		for (int k = 0; k < r; k++) {
			unsigned i = (unsigned)ev[k].user_data;

			cr_assert_lt(i, BIG_N, "an event of user_data %u, never armed", i);
			cr_assert_eq(ev[k].id, s->ids[i], "timer %u's event came with another id", i);
			cr_assert_eq(ev[k].deadline_ns, big_due(s, i), "timer %u's event came with deadline %+lld ns",
				     i, (long long)(ev[k].deadline_ns - big_due(s, i)));
			if (s->taken[i] && !again++)
				first_again = i;
			if (seen[i]++ == 1 && !twice++)
				first_twice = i;
		}
		got += (unsigned)r;
		if (!quiet_until && got >= want)
			quiet_until = now_ns() + 300 * MS;
	}
	for (unsigned i = 0; i < BIG_N; i++)
		if (!s->taken[i] && !seen[i] && !lost++)
			first_lost = i;
	fprintf(stderr, "%s: %llu events of %llu untaken; %llu lost (first %u), %llu twice (first %u), %llu taken "
		"ones again (first %u)\n", s->name, (unsigned long long)got, (unsigned long long)want,
		(unsigned long long)lost, first_lost, (unsigned long long)twice, first_twice,
		(unsigned long long)again, first_again);
	cr_expect_eq(lost, 0, "%llu events nobody took were lost (the first timer %u, %s)", (unsigned long long)lost,
		     first_lost, first_lost % 8 ? "a one-shot" : "a periodic");
	cr_expect_eq(twice, 0, "%llu events came twice (the first timer %u)", (unsigned long long)twice, first_twice);
	cr_expect_eq(again, 0, "%llu events the dead process took came again (the first timer %u, %s)",
		     (unsigned long long)again, first_again, first_again % 8 ? "a one-shot" : "a periodic");
	return got;
}

/* Every periodic still armed, its id naming it: cancelled by the new process, one by one; then none armed. */
static void big_periodics_armed(struct big *s, chime_t *c)
{
	uint64_t bad = 0;
	unsigned first_bad = BIG_N;

	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, BIG_N / 8), BIG_N / 8,
		     "not the %u periodics armed once every event was taken", BIG_N / 8);
	for (unsigned i = 0; i < BIG_N; i += 8) {
		int r = chime_cancel(c, s->ids[i]);

		if (r != 0 && !bad++)
			first_bad = i;
	}
	cr_assert_eq(bad, 0, "%llu periodics' ids no longer named them (the first timer %u)",
		     (unsigned long long)bad, first_bad);
	cr_assert_eq(chime_flush(c), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, ARMED_STATES, 0), 0, "periodics still armed after their cancels");
}

/* Lines of the log that say an error or a warning, echoed; how many. */
static unsigned log_complaints(const char *log)
{
	char line[1024];
	unsigned n = 0;
	FILE *f = fopen(log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "error: ") || strstr(line, "warning: ")) {
			fprintf(stderr, "%s: %s", log, line);
			n++;
		}
	fclose(f);
	return n;
}

static void big_echo_log(const char *log)
{
	char line[1024];
	FILE *f = fopen(log, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "session") || strstr(line, "timers") || strstr(line, "SIG") || strstr(line, "restor") ||
		    strstr(line, "stop"))
			fprintf(stderr, "  | %s", line);
	fclose(f);
}

/*
 * sig SIGTERM: the broker stops and a new one starts; SIGUSR2: it restarts
 * in place (chimectl restart). delay_us after the process is reaped.
 */
static void big_stop_case(int sig, unsigned delay_us)
{
	char log[300], next[300], extra[400];
	struct big *s = big_new("backlog");
	uint64_t t_kill, t_sig, t_back, t0;
	pid_t pid;
	chime_t *c;
	int st;

	start_logged("--shards 1 --cq-size 1048576", log, sizeof(log));
	t0 = now_ns();
	pid = child(big_child, s);
	fprintf(stderr, "armed %u timers and took %u of their events in %.0f ms\n", BIG_N, BIG_TAKEN,
		(now_ns() - t0) / 1e6);
	t_kill = now_ns();
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	if (delay_us)
		usleep(delay_us);
	t_sig = now_ns();
	cr_assert_eq(kill(tb.pid, sig), 0);
	fprintf(stderr, "the process was killed and reaped, and SIG%s sent, %.3f ms after the kill\n",
		sig == SIGTERM ? "TERM" : "USR2", (t_sig - t_kill) / 1e6);
	if (sig == SIGTERM) {
		cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
		tb.pid = 0;
		t_back = now_ns();
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chimed's stop: status %#x", st);
		snprintf(next, sizeof(next), "%s/next.log", tb.dir);
		snprintf(extra, sizeof(extra), "--shards 1 --cq-size 1048576 2>'%s'", next);
		restart(0, extra);
	} else {
		for (t_back = 0; now_ns() - t_sig < 20000 * MS; usleep(1000)) {
			cr_assert_eq(waitpid(tb.pid, &st, WNOHANG), 0, "chimed ended (status %#x) in its restart", st);
			if (!t_back && log_lines(log, "executing", "again"))
				t_back = now_ns();
			if (log_lines(log, "listening on", "") >= 2 && t_sock_accepts(tb.sock))
				break;
		}
		cr_assert_geq(log_lines(log, "listening on", ""), 2, "chimed did not run again within 20 s");
		snprintf(next, sizeof(next), "%s", log);
	}
	fprintf(stderr, "the stop took %.0f ms; the next broker listened %.0f ms after the signal\n",
		t_back ? (t_back - t_sig) / 1e6 : -1.0, (now_ns() - t_sig) / 1e6);
	big_echo_log(log);
	if (sig == SIGTERM)
		big_echo_log(next);
	cr_expect_eq(log_lines(log, "session 'backlog'", "parked for the next broker") +
		     log_lines(log, "session 'backlog'", "detached"), 1,
		     "the stop did not say the session parked");
	cr_expect_eq(log_lines(next, "taking over 1 session from", ""), 1, "the next broker did not take it over");
	/* Its own park, not the stop's handover (which carries its 1024 grants): the process was seen gone first. */
	if (delay_us)
		cr_expect_eq(log_lines(next, " 0 grants kept for their processes", ""), 1,
			     "the session was parked by the stop's handover, not by its own park");
	c = sopen_ok("backlog");
	t0 = now_ns();
	big_check(s, c, now_ns() + 15000 * MS);
	fprintf(stderr, "the new process took them in %.0f ms\n", (now_ns() - t0) / 1e6);
	big_periodics_armed(s, c);
	chime_close(c);
	cr_expect_eq(log_complaints(log) + (sig == SIGTERM ? log_complaints(next) : 0), 0,
		     "the brokers logged errors or warnings");
	munmap(s, sizeof(*s));
}

Test(restart, a_stop_right_after_a_sessions_process_went_with_a_full_ring_gives_each_event_once, .timeout = 60)
{
	big_stop_case(SIGTERM, 0);
}

Test(restart, a_stop_while_a_sessions_park_of_a_full_ring_is_in_its_steps_gives_each_event_once, .timeout = 60)
{
	big_stop_case(SIGTERM, 20000);
}

Test(restart, a_restart_in_place_right_after_a_sessions_process_went_with_a_full_ring_gives_each_event_once,
     .timeout = 60)
{
	big_stop_case(SIGUSR2, 0);
}

/*
 * The same, the session's park cut short by the stop's 5 s (STOP_PARK_NS):
 * a slow host's, made here by holding the shard (ptrace) hold_after_us
 * after SIGTERM, the park in its steps, until the control thread gave up
 * waiting for it (the socket is gone), then letting it go within the
 * shard's 2 s to stop. The next broker takes over the park as it was.
 * Fails since e6f0a57 (a park in steps): held 5-30 ms in, 94280-257949 of
 * the 260000 events the dead process took came again (one-shots and
 * periodics), where before it none did: the one-shots it took are left
 * ACKWAIT and the periodics' taken events in their nodes (periodics_taken()
 * not yet past them), which the restore can only deliver again. Neither
 * stop says the park was cut short.
 */
static void big_cut_case(unsigned hold_after_us)
{
	char log[300], next[300], extra[400], sockfile[sizeof(tb.sock)];
	struct big *s = big_new("backlog");
	uint64_t t_sig, t_gone = 0, t0;
	pid_t pid;
	chime_t *c;
	int st, tid;

	start_logged("--shards 1 --cq-size 1048576", log, sizeof(log));
	snprintf(sockfile, sizeof(sockfile), "%s", tb.sock);
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0, "no thread chimed-shard0 in chimed %d", tb.pid);
	pid = child(big_child, s);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	t_sig = now_ns();
	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	while (now_ns() - t_sig < hold_after_us * UINT64_C(1000))
		;
	st = t_thread_hold(tid);
	if (st == -EPERM || st == -EACCES)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-st));
	cr_assert_eq(st, 0, "the shard thread did not stop: %s", strerror(-st));
	t0 = now_ns();
	/* The control thread gives up on the park at 5 s: the socket goes first. */
	while (now_ns() - t0 < 8000 * MS && access(sockfile, F_OK) == 0)
		usleep(1000);
	t_gone = now_ns();
	cr_assert_eq(t_thread_release(tid), 0);
	fprintf(stderr, "held the shard %.1f ms after SIGTERM; the socket went %.0f ms after SIGTERM\n",
		(t0 - t_sig) / 1e6, (t_gone - t_sig) / 1e6);
	st = reap_within(10000);
	cr_assert_neq(st, -1, "chimed still runs 10 s after its shard was let go");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chimed's stop: status %#x", st);
	big_echo_log(log);
	snprintf(next, sizeof(next), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "--shards 1 --cq-size 1048576 2>'%s'", next);
	restart(0, extra);
	big_echo_log(next);
	cr_expect_eq(log_lines(next, "taking over 1 session from", ""), 1, "the next broker did not take it over");
	cr_expect_eq(log_lines(next, " 0 grants kept for their processes", ""), 1,
		     "the session was parked by the stop's handover, not by its own park");
	c = sopen_ok("backlog");
	big_check(s, c, now_ns() + 15000 * MS);
	big_periodics_armed(s, c);
	chime_close(c);
	(void)log_complaints(log);
	(void)log_complaints(next);
	munmap(s, sizeof(*s));
}

Test(restart, a_stop_that_cuts_a_sessions_park_of_a_full_ring_short_gives_each_event_once, .timeout = 60)
{
	big_cut_case(10000);    /* in its first steps: the ring's last look and the delivered one-shots */
}

/*
 * Without a hold: n sessions' processes go at once, each with a full ring,
 * and a stop comes: their parks share the shard, each sweeping the whole
 * slab (n times 1M nodes), so the stop may reach its 5 s on its own.
 */
static void big_many_case(unsigned n)
{
	char log[300], next[300], extra[400], name[32];
	struct big *s[16];
	pid_t pid[16];
	uint64_t t_sig, t0;
	chime_t *c;
	int st;

	cr_assert_leq(n, 16);
	start_logged("--shards 1 --cq-size 1048576 --capacity 33554432 --max-timers-per-uid 0", log, sizeof(log));
	t0 = now_ns();
	for (unsigned k = 0; k < n; k++) {
		snprintf(name, sizeof(name), "backlog%u", k);
		s[k] = big_new(name);
		pid[k] = child(big_child, s[k]);
	}
	fprintf(stderr, "%u sessions of %u events armed in %.0f ms\n", n, BIG_N, (now_ns() - t0) / 1e6);
	for (unsigned k = 0; k < n; k++)
		cr_assert_eq(kill(pid[k], SIGKILL), 0);
	for (unsigned k = 0; k < n; k++)
		cr_assert_eq(waitpid(pid[k], &st, 0), pid[k]);
	t_sig = now_ns();
	cr_assert_eq(kill(tb.pid, SIGTERM), 0);
	cr_assert_eq(waitpid(tb.pid, &st, 0), tb.pid);
	tb.pid = 0;
	fprintf(stderr, "the stop took %.0f ms\n", (now_ns() - t_sig) / 1e6);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chimed's stop: status %#x", st);
	big_echo_log(log);
	snprintf(next, sizeof(next), "%s/next.log", tb.dir);
	snprintf(extra, sizeof(extra), "--shards 1 --cq-size 1048576 --capacity 33554432 --max-timers-per-uid 0 2>'%s'",
		 next);
	restart(0, extra);
	big_echo_log(next);
	for (unsigned k = 0; k < n; k++) {
		c = sopen_ok(s[k]->name);
		big_check(s[k], c, now_ns() + 15000 * MS);
		chime_close(c);
		munmap(s[k], sizeof(*s[k]));
	}
	cr_expect_eq(log_complaints(log) + log_complaints(next), 0, "the brokers logged errors or warnings");
}

Test(restart, a_stop_after_many_sessions_went_with_full_rings_gives_each_event_once, .timeout = 120)
{
	big_many_case(4);
}
