/* SPDX-License-Identifier: MIT */
/*
 * test_session.c - named sessions outlive their process while the broker
 * stays up (ARCHITECTURE.md, "Sessions and restarts", "Client exit"): a
 * session SIGKILLed with a thousand timers is re-attached with its ids
 * valid and every live timer delivered once, never early; what fired while
 * nobody was attached is delivered in order; the claim word decides
 * exactly once for events in flight; one process at a time, one uid per
 * session; --session-linger and drop-session reclaim; anonymous
 * connections are unchanged; bad names are refused; arms published behind
 * a slot a killed thread held are applied at the park.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"
#include "client.h"      /* a reserved slot held by hand (white box) */
#include "helpers.h"
#include "t_session.h"
#include "segment.h"

#define HOUR (3600000 * MS)

static struct t_chimed tb;

static void stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(session, .fini = stop, .timeout = 120);

static void start(const char *extra)
{
	cr_assert_eq(t_chimed_start(&tb, NULL, extra), 0, "chimed %s did not start", extra);
	t_session_sock = tb.sock;
	cr_assert_eq(chmod(tb.dir, 0755), 0);  /* other users reach the socket (test 3) */
}

static int wait_child(pid_t pid)
{
	int st;

	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- (1) SIGKILL with a thousand timers, re-attach by a new process ---- */

Test(session, sigkilled_session_keeps_its_timers_and_ids_for_the_next_process)
{
	struct t1 *s;

	start("-n 2");
	s = t1_new(1200, 1500);
	kill_child(child(t1_child, s));
	t1_next_process(s, 1800, 2300);
}

/*
 * ---- (1b) killed with a thread between its reserve and its publish ----
 * The head stops at that slot: what the other threads published behind it
 * (arms whose ids they had returned) is applied at the park all the same.
 */
Test(session, arms_published_behind_a_slot_a_killed_thread_held_still_fire_for_the_next_process)
{
	struct hole_x *x = mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_event ev[4];
	unsigned n;
	chime_t *c;

	cr_assert_neq(x, MAP_FAILED);
	start("-n 1");
	x->dl = chime_now() + 300 * MS;
	kill_child(child(hole_child, x));
	c = sopen_ok("holes");
	n = collect(c, ev, 4, x->dl + 1000 * MS);
	cr_assert_eq(n, 2, "%u events for the two arms published behind the held slot", n);
	cr_assert(ev[0].id == x->ids[0] || ev[1].id == x->ids[0]);
	cr_assert(ev[0].id == x->ids[1] || ev[1].id == x->ids[1]);
	chime_close(c);
	munmap(x, sizeof(*x));
}

/* ---- (2) fired while detached: delivered in order on re-attach ---- */

Test(session, events_fired_while_detached_are_delivered_in_order)
{
	enum { N = 20 };
	struct chime_event ev[N + 1];
	chime_id_t id[N], pid_;
	uint64_t t0;
	unsigned n, per = 0;
	chime_t *c;

	start("-n 1");   /* order is per shard, as for every event (each shard has its own ring) */
	c = sopen_ok("held");
	t0 = now_ns();
	/* Armed in reverse: delivery follows the deadlines, not the arming order. */
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(chime_arm(c, 1, t0 + 50 * MS + (N - i) * 5 * MS, 0, N - i, &id[i]), 0);
	cr_assert_eq(chime_arm(c, 2, t0 + 10 * MS, 10 * MS, 1000, &pid_), 0);
	chime_close(c);         /* a session's close detaches it: the timers stay */
	usleep(400 * 1000);     /* all fire with nobody attached; the periodic holds one event */
	c = sopen_ok("held");
	n = 0;
	while (n < N + 1) {
		int r = chime_wait(c, ev + n, N + 1 - n, 2000);

		cr_assert_gt(r, 0, "only %u of %u held events came back", n, N + 1);
		n += (unsigned)r;
	}
	for (unsigned k = 0; k < n; k++) {
		per += ev[k].id == pid_;
		if (k)
			cr_assert_geq(ev[k].deadline_ns, ev[k - 1].deadline_ns, "held events out of order at %u", k);
		if (ev[k].id != pid_)
			cr_assert_eq(ev[k].user_data, k, "held event %u is timer %llu", k,
				     (unsigned long long)ev[k].user_data);
	}
	cr_assert_eq(per, 1, "the periodic timer held %u events, not one", per);
	cr_assert_eq(ev[0].id, pid_, "the periodic fired first");
	cr_assert_eq(chime_cancel(c, pid_), 0);
	chime_close(c);
}

/* ---- (3) one process at a time, one uid per session ---- */

static void open_expect(int wfd, void *arg)
{
	chime_t *c = NULL;
	int want = *(int *)arg, r;

	if (want == -EACCES && (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0))
		_exit(90);
	r = sopen(&c, "mine");
	if (r == 0)
		chime_close(c);
	(void)!write(wfd, "r", 1);
	_exit(r == want ? 0 : 1);
}

Test(session, a_session_is_one_process_and_one_user)
{
	int busy = -EBUSY, acces = -EACCES, ok = 0;
	chime_t *c;

	if (geteuid() != 0)
		cr_skip("needs root (opens the session as uid 65534 too)");
	start("--allow-all");
	c = sopen_ok("mine");
	cr_assert_eq(wait_child(child(open_expect, &busy)), 0, "a second process did not get EBUSY");
	cr_assert_eq(wait_child(child(open_expect, &acces)), 0, "another uid did not get EACCES");
	chime_close(c);
	/* Detached, it is still this uid's: the other gets EACCES, a process of ours gets it. */
	cr_assert_eq(wait_child(child(open_expect, &acces)), 0, "another uid did not get EACCES (detached)");
	cr_assert_eq(wait_child(child(open_expect, &ok)), 0, "the owner could not re-attach");
}

/*
 * A worker restarted at once gets its session. A process that waited in
 * chime_wait() has a poll on its socket in its io_uring, which the kernel
 * tears down some milliseconds after the process let go (8-13 ms here), and
 * until then the broker saw no hang-up: the next process's chime_open() got
 * -EBUSY (89 times in 100, exit after exit). Now the broker takes an exited
 * process for gone (its pidfd), and chime_close() shuts the socket down,
 * so a process that closes and lives on lets go at once too.
 */
struct leave {
	bool close;             /* chime_close() first */
	bool live_on;           /* then stay alive (the parent kills it) */
};

static void open_wait_leave(int wfd, void *arg)
{
	const struct leave *l = arg;
	struct chime_event ev;
	chime_t *c = NULL;

	if (sopen(&c, "restarted") < 0)
		_exit(1);
	(void)chime_wait(c, &ev, 1, 1);         /* the io_uring, and its poll on the socket */
	if (l->close)
		chime_close(c);
	(void)!write(wfd, "r", 1);
	if (!l->live_on)
		_exit(0);
	for (;;)
		pause();
}

Test(session, a_session_is_free_for_the_next_process_as_soon_as_the_last_one_lets_go)
{
	static const struct leave ways[] = { { .close = false }, { .close = true }, { .close = true, .live_on = true } };
	static const char *const what[] = { "exited", "closed and exited", "closed (alive)" };
	/* refused without the fix: ~89% of exits, ~6% of closes in a process that lives on */
	static const int rounds[] = { 20, 20, 100 };

	start("");
	for (unsigned w = 0; w < 3; w++) {
		for (int i = 0; i < rounds[w]; i++) {
			pid_t pid = child(open_wait_leave, (void *)&ways[w]);
			chime_t *c = NULL;
			int r;

			if (!ways[w].live_on)
				cr_assert_eq(wait_child(pid), 0);
			r = sopen(&c, "restarted");
			cr_assert_eq(r, 0, "round %d: the last process %s, the next got %s", i, what[w], strerror(-r));
			chime_close(c);
			if (ways[w].live_on)
				kill_child(pid);
		}
	}
}

/*
 * A policy file reserves session names for their users ("session NAME
 * USER", NAME* a prefix): before, whoever opened a name first owned it, so
 * any admitted user could take a service's session name and keep the
 * service out.
 */
struct open_as {
	uid_t uid;
	const char *name;
	int want;
};

static void open_as_expect(int wfd, void *arg)
{
	const struct open_as *o = arg;
	chime_t *c = NULL;
	int r;

	if (o->uid && (setresgid(o->uid, o->uid, o->uid) < 0 || setresuid(o->uid, o->uid, o->uid) < 0))
		_exit(90);
	r = sopen(&c, o->name);
	if (r == 0)
		chime_close(c);
	(void)!write(wfd, "r", 1);
	if (r != o->want)
		fprintf(stderr, "uid %u opening '%s': %s, expected %s\n", (unsigned)o->uid, o->name,
			strerror(-r), strerror(-o->want));
	_exit(r == o->want ? 0 : 1);
}

static int opens_as(uid_t uid, const char *name, int want)
{
	struct open_as o = { .uid = uid, .name = name, .want = want };

	return wait_child(child(open_as_expect, &o));
}

Test(session, a_policy_file_reserves_session_names_for_their_users)
{
	char file[64], extra[128];
	chime_t *held;

	if (geteuid() != 0)
		cr_skip("needs root (opens sessions as uid 65534 too)");
	snprintf(file, sizeof(file), "/tmp/chime-policy-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "allow-all\nsession billing-* root   # a prefix\nsession exact.name 65534\n"),
		     0, "%s: %s", file, strerror(errno));
	snprintf(extra, sizeof(extra), "--policy-file %s", file);
	start(extra);
	cr_assert_eq(opens_as(65534, "billing-worker", -EACCES), 0, "another user took a reserved prefix");
	cr_assert_eq(opens_as(0, "billing-worker", 0), 0, "the user it is reserved for");
	cr_assert_eq(opens_as(0, "billing", 0), 0, "the prefix is 'billing-'");
	cr_assert_eq(opens_as(65534, "other", 0), 0, "an unreserved name is anyone's");
	cr_assert_eq(opens_as(0, "exact.name", -EACCES), 0, "reserved for 65534, root included");
	cr_assert_eq(opens_as(65534, "exact.name", 0), 0);
	cr_assert_eq(opens_as(0, "exact.name2", 0), 0, "a name without '*' is not a prefix");

	/* Held before it was reserved: nobody gets it until the operator drops it. */
	cr_assert_eq(opens_as(65534, "late-x", 0), 0);
	cr_assert_eq(t_write_file(file, "allow-all\nsession late-* root\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	for (int i = 0; i < 100 && opens_as(65534, "late-y", -EACCES) != 0; i++)
		usleep(20000);
	cr_assert_eq(opens_as(65534, "late-x", -EACCES), 0, "its holder is refused once it is reserved");
	cr_assert_eq(opens_as(0, "late-x", -EACCES), 0, "another user's timers are not handed over");
	held = sopen_ok("late-z");
	chime_close(held);

	/* A malformed reservation is refused, and the broker keeps the policy it has. */
	cr_assert_eq(t_write_file(file, "allow-all\nsession bad/name root\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	usleep(200000);
	cr_assert_eq(opens_as(65534, "late-q", -EACCES), 0, "a bad reload must keep the old policy");
	/* ... all of it: a policy emptied (admitting only root) would refuse that too. */
	cr_assert_eq(opens_as(65534, "other2", 0), 0, "a bad reload must keep the old policy's allow-all");
	cr_assert_eq(opens_as(0, "late-q", 0), 0, "a bad reload must keep the old policy's reservation for root");
	unlink(file);
}

/* ---- (4) --session-linger reclaims ---- */

Test(session, linger_expiry_reclaims_a_detached_session_and_its_nodes)
{
	chime_id_t id[100];
	struct chime_event ev;
	chime_t *c;
	uint64_t base;

	start("-n 1 --sq-size 16 --session-linger 1");
	base = t_nodes(tb.sock, T_NODES_USED);
	cr_assert_eq(base, 0);
	c = sopen_ok("brief");
	for (unsigned i = 0; i < 100; i++)
		cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, i, &id[i]), 0);
	chime_close(c);
	/* Detached: the 100 timers stay, the 16 unused grants are freed. */
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 100), 100);
	usleep(500 * 1000);
	cr_assert_eq(t_nodes(tb.sock, T_NODES_USED), 100, "reclaimed before --session-linger");
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 0), 0, "a lingering session was not reclaimed");
	/* The name is free again: a fresh session, the old ids stale. */
	c = sopen_ok("brief");
	cr_assert_eq(chime_reset(c, id[0], now_ns()), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 200), 0, "a reclaimed timer fired");
	chime_close(c);
}

/* n timers of key, an hour ahead. */
static void arm_many(chime_t *c, uint64_t key, unsigned n)
{
	chime_id_t id;

	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(chime_arm(c, key, now_ns() + HOUR, 0, i, &id), 0);
}

/*
 * A CANCEL_KEY of many timers is applied in steps; a session that detaches
 * right after it has it finished before it parks (its process published
 * it): none of the key's timers is left for the next process.
 */
Test(session, a_cancel_key_in_steps_is_finished_before_the_session_parks)
{
	enum { MANY = 200000, OTHERS = 100 };
	chime_t *c;

	start("-n 1 --max-timers-per-client 0");
	c = sopen_ok("walker");
	arm_many(c, 5, MANY);
	arm_many(c, 6, OTHERS);
	cr_assert_eq(chime_cancel_key(c, 5), 0);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, OTHERS), OTHERS,
		     "the key's timers were not all cancelled before the park");
	/* and the next process of the session has exactly the others */
	c = sopen_ok("walker");
	cr_assert_eq(t_nodes(tb.sock, T_NODES_TIMERS), OTHERS);
	chime_close(c);
}

/*
 * The key index holds a connection's timers only once it cancels by key.
 * The session's next process finds, by key, every timer the last one
 * armed: one that never cancelled by key (its first CANCEL_KEY indexes
 * them), and one that did midway (armed before it, indexed then; after
 * it, at their arms).
 */
Test(session, the_next_processs_cancel_key_finds_what_the_last_one_armed)
{
	enum { N = 1000, OTHERS = 50 };
	chime_t *c;

	start("-n 1");
	c = sopen_ok("nokeys");
	arm_many(c, 7, N);
	arm_many(c, 8, OTHERS);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, N + OTHERS), N + OTHERS);
	c = sopen_ok("nokeys");
	cr_assert_eq(chime_cancel_key(c, 7), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, OTHERS), OTHERS,
		     "timers of key 7 left after its cancel (the last process never cancelled by key)");
	chime_close(c);

	c = sopen_ok("keys");
	arm_many(c, 7, N);
	cr_assert_eq(chime_cancel_key(c, 99), 0);      /* keyed: the N are indexed */
	arm_many(c, 7, N);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, 2 * N + OTHERS), 2 * N + OTHERS);
	c = sopen_ok("keys");
	cr_assert_eq(chime_cancel_key(c, 7), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, OTHERS), OTHERS,
		     "timers of key 7 left after its cancel (the last process cancelled by key midway)");
	chime_close(c);
}

/* ---- limits: a detached session keeps its client slot and its quota ---- */

Test(session, a_detached_session_keeps_its_slot_and_its_quota)
{
	chime_id_t id[4];
	chime_t *c, *a = NULL;
	int r;

	start("-n 1 --sq-size 4 --max-clients-per-uid 1 --max-timers-per-client 4");
	c = sopen_ok("quota");
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, i, &id[i]), 0);
	cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, 9, &(chime_id_t){ 0 }), -EDQUOT);
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 4), 4);
	/* Detached, it still holds its user's only client slot. */
	cr_assert_eq(sopen(&a, NULL), -EUSERS);
	/* Re-attached: the same four timers, so still at the quota, until one goes. */
	c = sopen_ok("quota");
	cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, 9, &(chime_id_t){ 0 }), -EDQUOT);
	cr_assert_eq(chime_cancel(c, id[0]), 0);
	for (int i = 0; (r = chime_arm(c, 1, now_ns() + HOUR, 0, 9, &(chime_id_t){ 0 })) == -EDQUOT && i < 200; i++)
		usleep(5000);
	cr_assert_eq(r, 0, "an arm after the cancel: %s", strerror(-r));
	chime_close(c);
}

/* ---- (5) anonymous connections are unchanged ---- */

Test(session, anonymous_timers_are_freed_at_exit)
{
	chime_t *c;

	start("-n 1 --sq-size 16");
	c = sopen_ok(NULL);
	for (unsigned i = 0; i < 100; i++)
		cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, i, &(chime_id_t){ 0 }), 0);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 116), 116, "100 timers and 16 grants");
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 0), 0, "an anonymous client's timers outlived it");
}

/* ---- (6) chimectl sessions and drop-session ---- */

/* Run chimectl with args; its exit status, stdout in out (if not NULL). */
static int ctl(char *out, size_t len, const char *args)
{
	char cmd[1024];
	FILE *p;
	size_t n = 0;
	int st;

	usleep(60 * 1000);      /* the broker answers one query per 50 ms */
	snprintf(cmd, sizeof(cmd), "%s --socket %s %s", getenv("CHIMECTL"), tb.sock, args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	if (out) {
		n = fread(out, 1, len - 1, p);
		out[n] = 0;
	} else {
		char sink[4096];

		while (fread(sink, 1, sizeof(sink), p) > 0)
			;
	}
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* arg: a copy of chimectl that user 65534 can run (t_tool_copy). */
static void drop_as_nobody(int wfd, void *arg)
{
	char cmd[1400];
	int st;

	if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	(void)!write(wfd, "r", 1);
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s --socket %s drop-session ops >/dev/null 2>&1",
		 tb.dir, (const char *)arg, tb.sock);
	st = system(cmd);
	_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 99);
}

/* The first session's linger_left_ns in `chimectl --json sessions` output, or UINT64_MAX. */
static uint64_t linger_left(const char *json)
{
	const char *p = strstr(json, "\"linger_left_ns\":");

	return p ? strtoull(p + strlen("\"linger_left_ns\":"), NULL, 10) : UINT64_MAX;
}

/*
 * A session whose process closed is parked by the shards before its linger
 * starts; listed meanwhile, it said 0 s left ("reclaimed any moment"). The
 * shard is held (ptrace) so that the session stays parking while it is
 * listed: its whole linger is left, and after the park about as much.
 */
Test(session, a_session_being_parked_is_listed_with_its_whole_linger)
{
	char parking[8192], parked[8192];
	int tid, r, st;
	chime_t *c;

	start("-n 1 --session-linger 600");
	c = sopen_ok("lp");
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0);
	r = t_thread_hold(tid);
	if (r < 0)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
	chime_close(c);
	usleep(50 * 1000);      /* the control thread sees the close; the held shard cannot park it */
	st = ctl(parking, sizeof(parking), "--json sessions");
	cr_assert_eq(t_thread_release(tid), 0);
	cr_assert_eq(st, 0, "%s", parking);
	cr_assert(strstr(parking, "\"name\":\"lp\"") && strstr(parking, "\"state\":\"detached\""), "%s", parking);
	cr_assert_eq(linger_left(parking), 600000 * MS, "parking: %s", parking);
	cr_assert_eq(ctl(parked, sizeof(parked), "--json sessions"), 0);
	cr_assert(linger_left(parked) > 590000 * MS && linger_left(parked) <= 600000 * MS, "parked: %s",
		  parked);
}

Test(session, chimectl_lists_and_drops_sessions)
{
	char out[8192];
	chime_t *c;

	start("-n 1 --sq-size 16 --allow-all");
	c = sopen_ok("ops");
	for (unsigned i = 0; i < 10; i++)
		cr_assert_eq(chime_arm(c, 1, now_ns() + (i < 3 ? 0 : HOUR), 0, i, &(chime_id_t){ 0 }), 0);
	cr_assert_eq(ctl(out, sizeof(out), "sessions"), 0);
	cr_assert(strstr(out, "ops") && strstr(out, "attached"), "chimectl sessions:\n%s", out);
	cr_assert_eq(ctl(NULL, 0, "drop-session ops"), 1, "an attached session was dropped");
	usleep(50 * 1000);      /* the three due timers fire into the ring: the process never takes them */
	chime_close(c);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 10), 10);
	/* The counters reach the tools within a millisecond or so. */
	for (int i = 0; i < 100; i++) {
		cr_assert_eq(ctl(out, sizeof(out), "--json sessions"), 0);
		if (strstr(out, "\"held\":3") && strstr(out, "\"timers\":7"))
			break;
		usleep(20 * 1000);
	}
	cr_assert(strstr(out, "\"name\":\"ops\"") && strstr(out, "\"state\":\"detached\"") &&
		  strstr(out, "\"held\":3") && strstr(out, "\"timers\":7") && strstr(out, "\"linger_left_ns\":"),
		  "chimectl --json sessions:\n%s", out);
	/* chimestat, from the control segment: the client row says detached and names the session. */
	{
		char cmd[1024];
		FILE *p;
		size_t n;

		snprintf(cmd, sizeof(cmd), "%s --socket %s -1 -j", getenv("CHIMESTAT"), tb.sock);
		p = popen(cmd, "r");
		cr_assert_not_null(p);
		n = fread(out, 1, sizeof(out) - 1, p);
		out[n] = 0;
		cr_assert_eq(pclose(p), 0);
		cr_assert(strstr(out, "\"session\":\"ops\"") && strstr(out, "\"state\":\"detached\""),
			  "chimestat -1 -j:\n%.2000s", out);
	}
	{
		const char *ctl_copy = t_tool_copy(tb.dir, "CHIMECTL");

		cr_assert_not_null(ctl_copy);
		cr_assert_eq(wait_child(child(drop_as_nobody, (void *)ctl_copy)), 4,
			     "another user dropped the session");
	}
	cr_assert_eq(ctl(out, sizeof(out), "--json drop-session ops"), 0, "%s", out);
	cr_assert(strstr(out, "\"dropped\":true"), "%s", out);
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 0), 0, "a dropped session's nodes were not freed");
	cr_assert_eq(ctl(out, sizeof(out), "sessions"), 0);
	cr_assert_null(strstr(out, "ops"), "still listed:\n%s", out);
	cr_assert_eq(ctl(NULL, 0, "drop-session ops"), 1, "dropping a missing session succeeded");
	cr_assert_eq(ctl(NULL, 0, "drop-session"), 2, "drop-session without a NAME");
}

/* ---- (7) names ---- */

/* A raw hello with a session field, flags and base of our choosing: the broker's answer status. */
static int raw_hello_as(const char session[CHIME_SESSION_MAX], uint32_t flags, uint64_t sq_base)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
				 .flags = flags | CHIME_HELLO_SEALS, .sq_base = sq_base };
	struct chime_welcome w = { 0 };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ssize_t n;

	cr_assert_geq(fd, 0);
	memcpy(sa.sun_path, tb.sock, strlen(tb.sock));
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	memcpy(h.session, session, CHIME_SESSION_MAX);
	cr_assert_eq(send(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	n = recv(fd, &w, sizeof(w), 0);
	close(fd);
	cr_assert_eq(n, (ssize_t)sizeof(w));
	return w.status;
}

static int raw_hello(const char session[CHIME_SESSION_MAX])
{
	return raw_hello_as(session, 0, 0);
}

/* chime_drop_session() of name at this test's broker. */
static int drop_now(const char *name)
{
	return chime_drop_session(&(struct chime_opts){ .socket_path = tb.sock, .session = name });
}

/* A session with a timer an hour ahead, whose process waited in chime_wait() and exits. */
static void arm_wait_exit(int wfd, void *arg)
{
	struct chime_event ev;
	chime_t *c = NULL;

	(void)arg;
	if (sopen(&c, "dropme") < 0 || chime_arm(c, 1, now_ns() + HOUR, 0, 0, &(chime_id_t){ 0 }) < 0)
		_exit(1);
	(void)chime_wait(c, &ev, 1, 1);
	(void)!write(wfd, "r", 1);
	_exit(0);
}

/*
 * `stop the worker, then drop its session`, as a script does: the worker
 * has exited, but the hang-up of its socket comes when its io_uring is torn
 * down, some milliseconds later; until then the drop was -EBUSY ("a
 * process has it attached"). A live process's session is still -EBUSY.
 */
Test(session, a_session_whose_process_has_exited_can_be_dropped_at_once)
{
	chime_t *c;

	start("-n 1 --sq-size 16");
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(wait_child(child(arm_wait_exit, NULL)), 0);
		cr_assert_eq(drop_now("dropme"), 0, "round %d: the drop after the exit", i);
	}
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 0), 0, "a dropped session's timer outlived it");
	c = sopen_ok("dropme");
	cr_assert_eq(drop_now("dropme"), -EBUSY, "a live process's session was dropped");
	chime_close(c);
}

/* uid 65534 opens o->name, closes it and drops it, then drops the broker's own session "roots". */
static void own_drop_as_nobody(int wfd, void *arg)
{
	chime_t *c = NULL;
	int r;

	(void)arg;
	if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	(void)!write(wfd, "r", 1);
	if (sopen(&c, "nobodys") < 0)
		_exit(2);
	chime_close(c);
	if ((r = drop_now("nobodys")) != 0) {
		fprintf(stderr, "dropping its own session: %s\n", strerror(-r));
		_exit(3);
	}
	if ((r = drop_now("roots")) != -EACCES) {
		fprintf(stderr, "dropping root's session: %s, expected %s\n", strerror(-r), strerror(EACCES));
		_exit(4);
	}
	_exit(0);
}

/*
 * A process done with its session ends it: chime_close(), then
 * chime_drop_session(), at once and every time (the close shuts its socket,
 * so the broker sees the hang-up by the drop at the latest). Attached, the
 * session is the caller's own and -EBUSY; gone, -ESRCH; another user's,
 * -EACCES; a user drops its own; bad arguments and a missing broker are told
 * apart.
 */
Test(session, a_process_ends_its_session_with_close_and_chime_drop_session)
{
	struct chime_opts o = { .socket_path = "/nonexistent/chime.sock", .session = "x" };
	chime_t *c, *mine;

	start("-n 1 --sq-size 16 --allow-all");
	for (int i = 0; i < 20; i++) {
		c = sopen_ok("done");
		cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, 0, &(chime_id_t){ 0 }), 0);
		/* Slept in its io_uring, which holds the socket until torn down at exit (not at close). */
		cr_assert_eq(chime_wait(c, &(struct chime_event){ 0 }, 1, 1), 0);
		cr_assert_eq(chime_arm(c, 2, now_ns(), 0, 0, &(chime_id_t){ 0 }), 0);   /* an event held */
		if (i == 0)
			cr_assert_eq(drop_now("done"), -EBUSY, "the caller's own attached session was dropped");
		chime_close(c);
		cr_assert_eq(drop_now("done"), 0, "round %d: the drop right after chime_close()", i);
	}
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 0), 0, "a dropped session's timers outlived it");
	cr_assert_eq(drop_now("done"), -ESRCH);
	/* The next open of the name is a new session: nothing held from the dropped ones. */
	c = sopen_ok("done");
	cr_assert_eq(chime_wait(c, &(struct chime_event){ 0 }, 1, 50), 0, "a dropped session's event came");
	chime_close(c);
	cr_assert_eq(drop_now("done"), 0);

	mine = sopen_ok("roots");
	chime_close(mine);
	cr_assert_eq(wait_child(child(own_drop_as_nobody, NULL)), 0);
	cr_assert_eq(drop_now("roots"), 0, "root's session was gone after another user's drop");

	cr_assert_eq(chime_drop_session(NULL), -EINVAL);
	cr_assert_eq(chime_drop_session(&(struct chime_opts){ .socket_path = tb.sock }), -EINVAL);
	cr_assert_eq(drop_now("a/b"), -EINVAL);
	cr_assert_eq(drop_now(""), -EINVAL);
	cr_assert_eq(chime_drop_session(&(struct chime_opts){ .socket_path = tb.sock, .session = "x",
							      .flags = 0x80 }), -EINVAL);
	cr_assert_eq(chime_drop_session(&(struct chime_opts){ .socket_path = "", .session = "x" }), -EINVAL);
	cr_assert_eq(chime_drop_session(&o), -ENOENT);
}

/*
 * chime_open() of session arg with two descriptor numbers left: one for the
 * socket, one of the welcome's four (-n 1). Exits 0 if it said -EMFILE.
 */
static void open_out_of_fds(int wfd, void *arg)
{
	struct rlimit rl;
	chime_t *c = NULL;
	int free_fds = 0, fd, r;

	(void)!write(wfd, "r", 1);
	close(wfd);
	for (fd = 0; free_fds < 2; fd++)
		free_fds += fcntl(fd, F_GETFD) < 0;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		_exit(2);
	rl.rlim_cur = (rlim_t)fd;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		_exit(3);
	r = sopen(&c, arg);
	_exit(r == -EMFILE ? 0 : 10);
}

/*
 * A process that runs out of descriptors after the welcome (its segments'
 * arrive with it) gets -EMFILE. A session that open created is dropped
 * again; it stayed, empty, for its linger (an hour), under its user's name
 * and quota. One that existed is left as it was, its timers with it.
 */
Test(session, an_open_that_fails_after_the_welcome_drops_only_a_session_it_created)
{
	chime_t *c;

	start("-n 1 --allow-all");
	cr_assert_eq(wait_child(child(open_out_of_fds, "lost")), 0, "the open did not run out of descriptors");
	cr_assert_eq(drop_now("lost"), -ESRCH, "the failed open's new session stayed");

	c = sopen_ok("kept");
	cr_assert_eq(chime_arm(c, 1, now_ns() + HOUR, 0, 0, &(chime_id_t){ 0 }), 0);
	chime_close(c);
	cr_assert_eq(wait_child(child(open_out_of_fds, "kept")), 0, "the open did not run out of descriptors");
	cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_USED, 1), 1, "the session's timer went with the failed open");
	cr_assert_eq(drop_now("kept"), 0, "the failed open dropped a session it had not created");
}

/*
 * A close hangs up with nothing of the broker's unread: its wake-up bytes
 * are read first. A hang-up with one unread kept the slot taken (HELD)
 * until the next heartbeat, up to 90 ms, and a user may hold a quarter of
 * its --max-clients-per-uid so: here 1 of 4, and the next open got
 * EUSERS (and, on a loaded host, the twenty sessions opened and closed in
 * a row above did).
 */
Test(session, a_close_with_a_wakeup_unread_frees_its_slot_at_once)
{
	start("-n 1 --max-clients-per-uid 4");
	for (int i = 0; i < 5; i++) {
		chime_t *c = sopen_ok(i % 2 ? "woken" : NULL);

		/* Asleep once: the shard sends a wake-up byte for the next event. */
		cr_assert_eq(chime_wait(c, &(struct chime_event){ 0 }, 1, 1), 0);
		cr_assert_eq(chime_arm(c, 1, now_ns(), 0, 0, &(chime_id_t){ 0 }), 0);
		usleep(20000);  /* fired, and the byte sent */
		chime_close(c);
		c = sopen_ok(NULL);
		chime_close(c);
		if (i % 2)
			cr_assert_eq(drop_now("woken"), 0);
	}
}

Test(session, bad_session_names_are_einval)
{
	static const char *const bad[] = { "", "a b", "a/b", "caf\xc3\xa9", "tab\t", "new\nline",
		"0123456789012345678901234567890123456789012345678901234567890123" /* 64 */ };
	char raw[CHIME_SESSION_MAX];
	chime_t *c = NULL;

	start("-n 1");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(sopen(&c, bad[i]), -EINVAL, "session name '%s' accepted", bad[i]);
	/* 63 bytes is the longest; every allowed character. */
	c = sopen_ok("Az09._-01234567890123456789012345678901234567890123456789012345");
	chime_close(c);
	/* The broker checks too: no NUL in the field, bytes after the NUL, a bad byte. */
	memset(raw, 'a', sizeof(raw));
	cr_assert_eq(raw_hello(raw), -EINVAL);
	memset(raw, 0, sizeof(raw));
	memcpy(raw, "ok\0junk", 7);
	cr_assert_eq(raw_hello(raw), -EINVAL);
	memset(raw, 0, sizeof(raw));
	memcpy(raw, "a*b", 3);
	cr_assert_eq(raw_hello(raw), -EINVAL);
	/* Nothing stuck: the broker still serves. */
	c = sopen_ok("fine");
	chime_close(c);
}

/*
 * A resuming hello (libchime's reconnect) is checked like any other: a base
 * that fits, only with a session, and one this broker has.
 */
Test(session, resuming_hellos_are_checked)
{
	char name[CHIME_SESSION_MAX] = "resumer";
	struct chime_event ev;
	chime_id_t id;
	chime_t *c;

	start("-n 1 --sq-size 16");
	cr_assert_eq(raw_hello_as((char[CHIME_SESSION_MAX]){ 0 }, CHIME_HELLO_RESUME, 0), -EINVAL,
		     "resuming an anonymous connection");
	cr_assert_eq(raw_hello_as(name, 0, 16), -EINVAL, "a base without the resume flag");
	cr_assert_eq(raw_hello_as(name, CHIME_HELLO_RESUME, 17), -EINVAL, "a base not a multiple of sq_size");
	cr_assert_eq(raw_hello_as(name, CHIME_HELLO_RESUME, UINT64_C(1) << 62), -EINVAL, "a base near the wrap");
	/* A good one, for a session this broker does not have: what it would resume is gone, it is told. */
	cr_assert_eq(raw_hello_as(name, CHIME_HELLO_RESUME, UINT64_C(1) << 40), -ESTALE);
	c = sopen_ok("resumer");
	chime_close(c);
	/* Its last process resumes it (its rings from 1 << 40); the connection leaves at once. */
	cr_assert_eq(raw_hello_as(name, CHIME_HELLO_RESUME, UINT64_C(1) << 40), 0);
	/* The broker still serves it and others, from position 0 again. */
	c = sopen_ok("resumer");
	cr_assert_eq(chime_arm(c, 0, now_ns(), 0, 7, &id), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1);
	cr_assert_eq(ev.user_data, 7);
	chime_close(c);
}

/* ---- (8) the claim word decides exactly once ---- */

struct t8 {
	chime_id_t taken, fresh;
};

static void t8_child(int wfd, void *arg)
{
	struct t8 *s = arg;
	struct chime_event ev;
	chime_t *c = NULL;
	uint64_t t0 = now_ns();

	if (sopen(&c, "once") < 0)
		_exit(1);
	if (chime_arm(c, 1, t0 + 20 * MS, 0, 1, &s->taken) < 0 ||
	    chime_arm(c, 1, t0 + 30 * MS, 0, 2, &s->fresh) < 0)
		_exit(2);
	usleep(150 * 1000);     /* both are in the completion ring now */
	if (chime_poll(c, &ev, 1) != 1 || ev.id != s->taken)
		_exit(3);
	/* Taken and consumed: the first is the application's; the second stays FRESH. */
	(void)!write(wfd, "r", 1);
	pause();
}

Test(session, the_claim_word_decides_what_the_next_process_gets)
{
	struct t8 *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_event ev[4];
	chime_t *c;
	unsigned n;

	cr_assert_neq(s, MAP_FAILED);
	start("-n 1");
	kill_child(child(t8_child, s));
	c = sopen_ok("once");
	n = collect(c, ev, 4, now_ns() + 400 * MS);
	cr_assert_eq(n, 1, "%u events after re-attach, want the untaken one only", n);
	cr_assert_eq(ev[0].id, s->fresh);
	cr_assert_eq(ev[0].user_data, 2);
	chime_close(c);
	munmap(s, sizeof(*s));
}

/* ---- a child after fork(): its copy of the parent's chime_t is not its own ---- */

/* In the child: every call says -ECHILD, none takes an event, and close frees only its copies. */
static void child_cb(const struct chime_event *ev, void *arg)
{
	(void)ev;
	(void)arg;
	_exit(5);       /* the parent's event, taken by its child */
}

static int forked_child(chime_t *c, chime_id_t id)
{
	struct chime_event ev;
	struct chime_op op = { .op = CHIME_ARM, .deadline_ns = now_ns() };
	chime_id_t id2;

	if (chime_arm(c, 1, now_ns(), 0, 0, &id2) != -ECHILD || chime_reset(c, id, now_ns()) != -ECHILD ||
	    chime_cancel(c, id) != -ECHILD || chime_cancel_key(c, 1) != -ECHILD)
		return 1;
	if (chime_submit(c, &op, 1) != -ECHILD || op.result != -ECHILD || chime_flush(c) != -ECHILD)
		return 2;
	usleep(100000);         /* the parent's timer has fired: the child must not take it */
	if (chime_poll(c, &ev, 1) != -ECHILD || chime_wait(c, &ev, 1, 10) != -ECHILD ||
	    chime_fd(c) != -ECHILD)
		return 3;
	/* libchime(3), FORK: every call but chime_open() and chime_close(); the callback never runs */
	if (chime_dispatch(c, child_cb, NULL, 0) != -ECHILD || chime_dispatch(c, child_cb, NULL, 4) != -ECHILD ||
	    chime_arm_realtime(c, 1, 0, 0, 0, &id2) != -ECHILD)
		return 4;
	chime_close(c);
	return 0;
}

/* Open descriptors as a bitmap of the first 1024 (fcntl: no /proc needed). */
static void open_fds(uint64_t set[16])
{
	memset(set, 0, 16 * sizeof(uint64_t));
	for (int fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			set[fd / 64] |= UINT64_C(1) << (fd % 64);
}

static void fork_case(const char *session)
{
	uint64_t before[16], after[16];
	struct chime_event ev;
	chime_t *c;
	chime_id_t id;
	pid_t pid;

	open_fds(before);
	c = session ? sopen_ok(session) : NULL;
	if (!session)
		cr_assert_eq(chime_open(&c, &(struct chime_opts){ .socket_path = tb.sock }), 0);
	open_fds(after);
	/* Every descriptor the library opened is close-on-exec: an exec'd child has none of them. */
	for (int fd = 0; fd < 1024; fd++)
		if ((after[fd / 64] & ~before[fd / 64]) >> (fd % 64) & 1)
			cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC, "fd %d of chime_open() is not close-on-exec", fd);
	cr_assert_eq(chime_arm(c, 1, now_ns() + 50 * MS, 0, 7, &id), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(forked_child(c, id));
	cr_assert_eq(wait_child(pid), 0, "the child's calls on its parent's chime_t (session %s)",
		     session ? session : "none");
	/* The parent's connection is untouched: its timer, and a new one. */
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1, "the parent lost its event to the child");
	cr_assert_eq(ev.id, id);
	cr_assert_eq(chime_arm(c, 1, now_ns() + 10 * MS, 0, 8, &id), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1);
	cr_assert_eq(ev.user_data, 8);
	chime_close(c);
}

Test(session, a_forked_child_gets_echild_and_leaves_its_parents_connection_alone)
{
	start("");
	fork_case(NULL);
	fork_case("forked");
}

/*
 * A child forked from a dispatch callback is inside that dispatch too: its
 * drains said -EDEADLK (the dispatch is its own) where libchime(3), FORK,
 * promises -ECHILD (an API audit). The child's status: a bit for each
 * drain that did not say -ECHILD.
 */
struct cb_fork {
	chime_t *c;
	int status;
};

static void fork_in_callback(const struct chime_event *ev, void *arg)
{
	struct cb_fork *f = arg;
	pid_t pid;

	(void)ev;
	pid = fork();
	if (pid == 0) {
		struct chime_event e;

		_exit((chime_poll(f->c, &e, 1) != -ECHILD) | (chime_wait(f->c, &e, 1, 10) != -ECHILD) << 1 |
		      (chime_dispatch(f->c, child_cb, NULL, 0) != -ECHILD) << 2);
	}
	f->status = pid < 0 ? -1 : wait_child(pid);
}

Test(session, a_child_forked_from_a_callback_gets_echild_from_its_drains)
{
	const char *names[] = { NULL, "forked-cb" };

	start("");
	for (int i = 0; i < 2; i++) {
		struct cb_fork f = { .status = -2 };
		chime_id_t id;

		if (names[i])
			f.c = sopen_ok(names[i]);
		else
			cr_assert_eq(chime_open(&f.c, &(struct chime_opts){ .socket_path = tb.sock }), 0);
		cr_assert_eq(chime_arm(f.c, 1, now_ns(), 0, 7, &id), 0);
		for (int k = 0; k < 400 && f.status == -2; k++) {
			cr_assert_geq(chime_dispatch(f.c, fork_in_callback, &f, 1), 0);
			if (f.status == -2)
				usleep(5000);
		}
		cr_assert_eq(f.status, 0, "the child of a callback's fork (session %s): its drains that did not "
			     "say ECHILD: %#x (poll 1, wait 2, dispatch 4)", names[i] ? names[i] : "none", f.status);
		chime_close(f.c);
	}
}

/*
 * A child's copy of a session its parent is reconnecting: chime_flush()
 * there made the parent's next reconnect attempt (a resume hello of the
 * parent's session from the child's pid) before it said -ECHILD, through
 * the descriptors the two share: the attempt's socket joined the parent's
 * chime_fd() set and, given up, it disarmed the parent's reconnect timer,
 * whose event loop then slept past its next attempt (an API audit).
 * libchime(3), FORK: every call in the child says -ECHILD and leaves the
 * parent's connection alone. The socket is a listener of the test's here,
 * which counts who connects.
 */
Test(session, a_childs_flush_makes_no_reconnect_attempt_of_its_parents)
{
	struct chime_opts o;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_event ev[4];
	chime_t *c = NULL;
	chime_id_t id;
	int lfd, conn, st;
	pid_t pid;

	start("");
	o = (struct chime_opts){ .socket_path = tb.sock, .session = "childflush" };
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + HOUR, 0, 1, &id), 0);
	kill(tb.pid, SIGKILL);
	cr_assert_eq(waitpid(tb.pid, NULL, 0), tb.pid);
	tb.pid = 0;
	/* The parent finds its broker gone: reconnecting (0, not -ENOTCONN). */
	for (int i = 0; i < 100 && chime_poll(c, ev, 4) == 0 && !cl_reconnecting(c); i++)
		usleep(10 * 1000);
	cr_assert(cl_reconnecting(c), "the parent did not start reconnecting");
	/* Something listens there again, and counts. */
	cr_assert_eq(unlink(tb.sock), 0);
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(lfd, 0);
	cr_assert_lt(strlen(tb.sock), sizeof(sa.sun_path));
	memcpy(sa.sun_path, tb.sock, strlen(tb.sock) + 1);
	cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(lfd, 8), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		usleep(1200 * 1000);    /* past the back-off (1 s at most): an attempt is due */
		_exit(chime_flush(c) == -ECHILD ? 0 : 1);
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's flush did not say -ECHILD");
	conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	cr_assert(conn < 0 && errno == EAGAIN, "the child's flush connected to the broker's socket");
	close(lfd);
	chime_close(c);
}

/*
 * A worker forked without exec that keeps its copy of its parent's chime_t
 * and never calls chime_close() (a pre-forked server's worker) must not keep
 * the parent's connection alive: once the parent dies, its session is free
 * for the next process and its anonymous connection's timers are freed,
 * while the worker lives on.
 */
struct orphan {
	const char *session;    /* NULL: anonymous */
	pid_t worker;
};

static void orphan_parent(int wfd, void *arg)
{
	struct orphan *o = arg;
	struct chime_event ev;
	chime_t *c = NULL;
	pid_t pid;

	if (sopen(&c, o->session) < 0)
		_exit(1);
	for (unsigned i = 0; i < 100; i++)
		if (chime_arm(c, 1, now_ns() + HOUR, 0, i, &(chime_id_t){ 0 }) < 0)
			_exit(2);
	/* A wait that sleeps: io_uring polls on the connection stay outstanding. */
	if (chime_wait(c, &ev, 1, 5) != 0)
		_exit(3);
	pid = fork();
	if (pid == 0) {
		alarm(20);      /* the test kills it; never outlive a failed test for long */
		for (;;)
			pause();
	}
	o->worker = pid;
	(void)!write(wfd, "r", 1);
	pause();        /* SIGKILLed here */
}

static void orphan_case(const char *session)
{
	struct orphan *o = mmap(NULL, sizeof(*o), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	chime_t *c = NULL;
	uint64_t until;
	int r;

	cr_assert_neq(o, MAP_FAILED);
	o->session = session;
	kill_child(child(orphan_parent, o));
	cr_assert_gt(o->worker, 0);
	cr_assert_eq(kill(o->worker, 0), 0, "the worker is alive");
	if (session) {
		until = now_ns() + 2000 * MS;
		while ((r = sopen(&c, session)) == -EBUSY && now_ns() < until)
			usleep(10000);
		cr_assert_eq(r, 0, "session '%s' after its process died, its forked worker alive: %s",
			     session, strerror(-r));
		cr_assert_eq(chime_cancel_key(c, 1), 0);
		chime_close(c);
	} else {
		cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, 0), 0,
			     "a dead process's anonymous timers are kept while its forked worker lives");
	}
	kill(o->worker, SIGKILL);     /* a grandchild: not ours to wait for */
	munmap(o, sizeof(*o));
}

Test(session, a_forked_worker_does_not_keep_its_dead_parents_connection)
{
	start("-n 1 --sq-size 16");
	orphan_case(NULL);
	orphan_case("orphaned");
}

/*
 * A session's dispatch callback that drained another session, then arms
 * into a full ring after its broker died: the arm must reconnect (or give
 * up with -ENOTCONN), which only this thread can do, as the holder of the
 * session's drainer lock. It hung, waiting for itself.
 */
static chime_t *nest_a, *nest_b;

static void nested_cb(const struct chime_event *ev, void *arg)
{
	struct chime_event e[4];
	int *r = arg;

	(void)ev;
	(void)chime_poll(nest_b, e, 4);         /* another session's drain, inside A's */
	kill(tb.pid, SIGKILL);                  /* the test process reaps it */
	for (unsigned i = 0; i < 100000; i++)
		if ((*r = chime_arm(nest_a, 1, now_ns() + HOUR, 0, i, &(chime_id_t){ 0 })) != 0)
			break;
}

static int nested_child(void)
{
	int r = 0;

	alarm(15);      /* the bug is a hang: SIGALRM ends it */
	setenv("CHIME_RECONNECT_S", "1", 1);
	if (sopen(&nest_a, "nest-a") < 0 || sopen(&nest_b, "nest-b") < 0)
		return 2;
	if (chime_arm(nest_a, 0, now_ns(), 0, 0, &(chime_id_t){ 0 }) < 0)
		return 3;
	usleep(20000);
	if (chime_dispatch(nest_a, nested_cb, &r, 0) != 1)
		return 4;
	return r == -ENOTCONN ? 0 : 5;
}

Test(session, a_callback_that_drained_another_session_still_reconnects_its_own)
{
	pid_t pid;

	start("-n 1 --sq-size 64");
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(nested_child());
	cr_assert_eq(wait_child(pid), 0, "the arm in the callback (142: it hung)");
	(void)t_chimed_stop(&tb, SIGKILL);
}

/*
 * A thread that waited, then exited, and a new thread waiting next: the
 * new one is woken on time. glibc gives the new thread the exited one's
 * cached stack, TLS included, so the library took it for the thread that
 * had left its io_uring polls outstanding, and slept on them: their
 * completion comes from the kernel's fallback work once their thread is
 * gone, a tick late (4.7-5.4 ms here at HZ=250, every round).
 */
struct waiter_turn {
	chime_t *c;
	uint64_t late_ns;       /* the event's delivery after its deadline; UINT64_MAX: none */
};

static void *wait_and_exit(void *arg)
{
	(void)chime_wait(((struct waiter_turn *)arg)->c, (struct chime_event[1]){ 0 }, 1, 5);
	return NULL;
}

static void *arm_and_wait(void *arg)
{
	struct waiter_turn *t = arg;
	uint64_t due = chime_now() + 30 * MS;
	struct chime_event ev;

	t->late_ns = UINT64_MAX;
	if (chime_arm(t->c, 0, due, 0, 0, &(chime_id_t){ 0 }) == 0 && chime_wait(t->c, &ev, 1, 2000) == 1)
		t->late_ns = chime_now() - due;
	return NULL;
}

Test(session, a_new_waiter_thread_after_one_that_exited_is_woken_on_time)
{
	struct waiter_turn t = { 0 };
	uint64_t best = UINT64_MAX;

	start("-n 1");
	t.c = sopen_ok("waiters");
	for (int i = 0; i < 5; i++) {
		pthread_t th;

		cr_assert_eq(pthread_create(&th, NULL, wait_and_exit, &t), 0);
		cr_assert_eq(pthread_join(th, NULL), 0);
		cr_assert_eq(pthread_create(&th, NULL, arm_and_wait, &t), 0);
		cr_assert_eq(pthread_join(th, NULL), 0);
		cr_assert_neq(t.late_ns, UINT64_MAX, "round %d: no event", i);
		best = t.late_ns < best ? t.late_ns : best;
	}
	/* A tick is 1-10 ms (HZ 1000-100); on time is a fraction of one. The best of five: noise aside. */
	cr_assert_lt(best, 2500000, "the best of five new waiters got its event %.2f ms late", (double)best / 1e6);
	chime_close(t.c);
}

/*
 * A broker stopped (SIGSTOP, a frozen cgroup, a debugger) in the middle
 * of a batch: a cancel's slot freed, the head that says it is applied not
 * published yet. A drain with events to judge then cannot know what the
 * cancel voided: it waited for the head, spinning on a CPU until the
 * broker went on (minutes at most), and chime_poll() never blocks. Held
 * instead, as behind a reset, and judged once the broker goes on. The
 * freed slot is made by hand (white box): stopped at that instant, the
 * broker leaves it so in about one stop in twenty under a stream of
 * cancels.
 */
struct frozen_batch {
	struct chime_sqe *slot;
	uint64_t pos, size;
	int broker;
	int polled;             /* the test's chime_poll() has returned */
};

/* The broker goes on once the test's chime_poll() has returned, or after 2 s: a poll that waits for it takes 2 s. */
static void *thaw_later(void *arg)
{
	struct frozen_batch *f = arg;

	for (uint64_t t0 = now_ns(); !at_load_acq(&f->polled) && now_ns() - t0 < 2000 * MS;)
		usleep(1000);
	at_store_rel(&f->slot->seq, f->pos + 1);        /* published, not freed: the broker applies it */
	kill(f->broker, SIGCONT);
	return NULL;
}

Test(session, a_poll_returns_at_once_while_the_broker_is_stopped_in_the_middle_of_a_batch)
{
	struct chime_event ev[4];
	struct frozen_batch f;
	struct chime_chan *ch;
	chime_id_t fired, later;
	uint64_t t0, took, until;
	unsigned got = 0;
	pthread_t th;
	chime_t *c;
	int r;

	start("-n 1");
	c = sopen_ok(NULL);
	ch = &c->chan[0];
	cr_assert_eq(chime_arm(c, 1, now_ns(), 0, 1, &fired), 0);
	cr_assert_eq(chime_arm(c, 2, now_ns() + HOUR, 0, 2, &later), 0);
	cr_assert_eq(chime_flush(c), 0);
	/* The first one's event waits in the ring, the second is applied. */
	for (until = now_ns() + 3000 * MS; now_ns() < until; usleep(1000))
		if (at_load_acq(ch->cq.tail_pub) != ch->cq.head && at_load_acq(ch->sq_head) == at_load(ch->sq.tail))
			break;
	cr_assert_neq(at_load_acq(ch->cq.tail_pub), ch->cq.head, "the event never came");
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	f = (struct frozen_batch){ .pos = at_load(ch->sq.tail), .size = (uint64_t)ch->sq.mask + 1, .broker = tb.pid };
	f.slot = &ch->sq.slots[f.pos & ch->sq.mask];
	cr_assert_eq(chime_cancel(c, later), 0);
	at_store_rel(&f.slot->seq, f.pos + f.size);     /* taken by the shard, its batch not over */
	cr_assert_eq(pthread_create(&th, NULL, thaw_later, &f), 0);
	t0 = now_ns();
	r = chime_poll(c, ev, 4);
	took = now_ns() - t0;
	at_store_rel(&f.polled, 1);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_lt(took, 1000 * MS, "chime_poll() took %.0f ms with the broker stopped", (double)took / 1e6);
	cr_assert_eq(r, 0, "chime_poll() judged events against a cancel it could not see: %d", r);
	/*
	 * Going on, the broker applies the cancel and the held event comes,
	 * once: for 3 s, or until nothing more can come (no node armed, due,
	 * held or delivered unconsumed, read before the ring is seen empty).
	 */
	for (until = now_ns() + 3000 * MS; now_ns() < until;) {
		r = chime_wait(c, ev, 4, 100);
		cr_assert_geq(r, 0, "chime_wait: %s", strerror(-r));
		for (int i = 0; i < r; i++) {
			cr_assert_eq(ev[i].id, fired, "an event of the cancelled timer");
			got++;
		}
		if (got && !r && t_nodes(tb.sock, T_NODES_TIMERS | 1u << CHIME_NODE_ALLOC) == 0 &&
		    at_load_acq(ch->cq.tail_pub) == ch->cq.head)
			break;
	}
	cr_assert_eq(got, 1, "the held event came %u times", got);
	chime_close(c);
}

/*
 * A session whose reconnecting is given up by a thread that arms, not by
 * the drainer: chime_fd() says so, readable (and stays so, as an
 * anonymous connection's does once its broker is gone), and the drain
 * returns -ENOTCONN. The old socket had left the fd's set and the timer
 * was turned off: an event loop asleep on the fd never woke to learn it.
 */
static void on_event(const struct chime_event *e, void *arg)
{
	(void)e;
	(void)arg;
}

Test(session, a_reconnect_given_up_by_an_arming_thread_makes_the_fd_readable)
{
	struct pollfd p = { .events = POLLIN };
	chime_t *c;
	int r = 0, n = 0;

	start("-n 1 --sq-size 64");
	setenv("CHIME_RECONNECT_S", "1", 1);
	c = sopen_ok("given-up");
	unsetenv("CHIME_RECONNECT_S");
	p.fd = chime_fd(c);
	cr_assert_geq(p.fd, 0);
	cr_assert_eq(poll(&p, 1, 0), 0, "readable with nothing pending");
	(void)t_chimed_stop(&tb, SIGKILL);      /* and none comes back */
	/* The ring fills, the arm finds the broker gone, reconnects for 1 s and gives up. */
	while (n < 100000 && (r = chime_arm(c, 0, now_ns() + HOUR, 0, 0, &(chime_id_t){ 0 })) == 0)
		n++;
	cr_assert_eq(r, -ENOTCONN, "after %d arms: %d", n, r);
	cr_assert_eq(poll(&p, 1, 1000), 1, "chime_fd() not readable once reconnecting was given up");
	cr_assert_eq(chime_dispatch(c, on_event, NULL, 0), -ENOTCONN);
	cr_assert_eq(poll(&p, 1, 0), 1, "chime_fd() no longer readable after the -ENOTCONN");
	chime_close(c);
}

/*
 * A session that starts reconnecting while its process has no descriptor
 * left (RLIMIT_NOFILE): once descriptors are free again, chime_fd() wakes
 * its event loop for the next attempt, and the session comes back. The
 * timer that makes the fd readable when an attempt is due was made only
 * then, and failed: the fd never woke the loop again, and the session
 * stayed down for good though the broker was back.
 */
static int nofile_recon_child(int ready)
{
	struct rlimit old, none;
	struct epoll_event ee = { .events = EPOLLIN };
	struct chime_event ev[4];
	uint64_t lift, end;
	chime_id_t id;
	unsigned got = 0;
	chime_t *c;
	int ep, r;

	if (sopen(&c, "nofile-recon") < 0 || chime_arm(c, 0, now_ns() + 1500 * MS, 0, 7, &id) < 0)
		return 2;
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, chime_fd(c), &ee) < 0 || getrlimit(RLIMIT_NOFILE, &old) < 0)
		return 2;
	if (write(ready, "", 1) != 1)
		return 2;
	/* Not one descriptor more: none at or above the lowest free number. */
	if ((r = dup(0)) < 0)
		return 2;
	close(r);
	none = (struct rlimit){ .rlim_cur = (rlim_t)r, .rlim_max = old.rlim_max };
	if (setrlimit(RLIMIT_NOFILE, &none) < 0)
		return 2;
	lift = now_ns() + 1000 * MS;
	for (end = now_ns() + 15000 * MS; now_ns() < end && !got;) {
		if (lift && now_ns() >= lift) {
			(void)setrlimit(RLIMIT_NOFILE, &old);
			lift = 0;
		}
		/* An event loop: the library only when the fd says so. */
		if (epoll_wait(ep, &ee, 1, 50) != 1)
			continue;
		while ((r = chime_poll(c, ev, 4)) > 0)
			for (int i = 0; i < r; i++)
				got += ev[i].id == id;
		if (r < 0)
			return 3;
	}
	return got == 1 ? 0 : 4;
}

Test(session, a_reconnect_begun_out_of_descriptors_is_woken_for_its_attempts_once_they_are_back)
{
	int p[2], st;
	pid_t pid;
	char b;

	start("-n 1");
	cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(nofile_recon_child(p[1]));
	close(p[1]);
	cr_assert_eq(read(p[0], &b, 1), 1, "the child did not get going");
	close(p[0]);
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, "-n 1"), 0);
	st = wait_child(pid);
	cr_assert_eq(st, 0, "the child: %s", st == 4 ? "its timer never came through the next broker (15 s)" :
		     st == 3 ? "a drain failed" : "set-up failed");
}

/*
 * A session opened with a relative socket path reconnects to that socket,
 * the one it opened, after the process changed its working directory (a
 * daemon's chdir("/")): the path was kept as given and resolved again at
 * each attempt, against another directory, and the session never came
 * back to its restarted broker.
 */
static int relative_child(void)
{
	struct chime_opts o = { .socket_path = "chime.sock", .session = "relative" };
	struct chime_event ev[4];
	uint64_t until;
	chime_id_t id;
	chime_t *c;
	int r;

	setenv("CHIME_RECONNECT_S", "5", 1);
	if (chdir(tb.dir) < 0 || chime_open(&c, &o) < 0 || chdir("/") < 0)
		return 2;
	kill(getppid(), SIGUSR1);       /* restart the broker now */
	/* Its first arm after the restart waits for the reconnect, then fires. */
	usleep(300000);
	if (chime_arm(c, 0, now_ns() + 50 * MS, 0, 9, &id) < 0)
		return 3;
	for (until = now_ns() + 6000 * MS; now_ns() < until;) {
		r = chime_wait(c, ev, 4, 100);
		if (r < 0)
			return 3;
		for (int i = 0; i < r; i++)
			if (ev[i].id == id)
				return 0;
	}
	return 4;
}

Test(session, a_session_opened_by_a_relative_path_reconnects_to_it_after_a_chdir)
{
	sigset_t usr1, old;
	pid_t pid;
	int sig, st;

	start("-n 1");
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	cr_assert_eq(sigprocmask(SIG_BLOCK, &usr1, &old), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(relative_child());
	cr_assert_eq(sigwait(&usr1, &sig), 0);
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, "-n 1"), 0);
	st = wait_child(pid);
	(void)sigprocmask(SIG_SETMASK, &old, NULL);
	cr_assert_eq(st, 0, "the child: %s", st == 4 ? "its timer never came through the restarted broker" :
		     st == 3 ? "an arm or a wait failed (reconnecting given up?)" : "set-up failed");
}

/*
 * A thread cancelled (pthread_cancel(3), deferred) in a named session's
 * drain: the cancel is acted on after the call, never with the session's
 * lock held. A drain's recv(2) is a cancellation point, and a thread
 * cancelled there left the lock held for good: every later drain returned
 * nothing (a timer 20 ms ahead was never delivered), and chime_wait()
 * spun on the lock until its timeout.
 */
static pthread_barrier_t cancel_turns;

static void *drain_cancelled(void *arg)
{
	struct chime_event ev[4];

	(void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	(void)pthread_barrier_wait(&cancel_turns);
	(void)pthread_barrier_wait(&cancel_turns);      /* cancelled meanwhile: it is pending */
	(void)pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	(void)chime_poll(arg, ev, 4);                   /* an event loop's drain */
	pthread_testcancel();
	return NULL;
}

Test(session, a_thread_cancelled_in_a_drain_leaves_the_session_usable)
{
	struct chime_event ev[4];
	chime_id_t id;
	pthread_t th;
	void *ret;
	chime_t *c;
	int r;

	start("-n 1");
	c = sopen_ok("cancelled");
	cr_assert_geq(chime_fd(c), 0);         /* its empty drains read the fd's wake-ups: recv(2) */
	cr_assert_eq(pthread_barrier_init(&cancel_turns, NULL, 2), 0);
	cr_assert_eq(pthread_create(&th, NULL, drain_cancelled, c), 0);
	(void)pthread_barrier_wait(&cancel_turns);
	cr_assert_eq(pthread_cancel(th), 0);
	(void)pthread_barrier_wait(&cancel_turns);
	cr_assert_eq(pthread_join(th, &ret), 0);
	cr_assert_eq(ret, PTHREAD_CANCELED, "the cancel was not honoured");
	cr_assert_eq(chime_arm(c, 0, now_ns() + 20 * MS, 0, 5, &id), 0);
	r = chime_wait(c, ev, 4, 2000);
	cr_assert_eq(r, 1, "a drain after the cancelled one: %d (the session's lock left held)", r);
	cr_assert_eq(ev[0].id, id);
	(void)pthread_barrier_destroy(&cancel_turns);
	chime_close(c);
}

/*
 * ---- an open whose process is gone before its welcome could be sent ----
 * The broker made the session, attached it, and its welcome's send failed
 * (the process killed meanwhile): a session this open created holds
 * nothing and goes at once. It was parked, and lingered empty under its
 * user's name and client quota for --session-linger, an hour by default.
 * A session that existed keeps its timers, as on any hang-up. The shard is
 * held under ptrace so that the attach is still in flight at the kill.
 */
static void open_and_wait(int wfd, void *arg)
{
	chime_t *c = NULL;

	(void)!write(wfd, "r", 1);
	(void)sopen(&c, arg);   /* killed while it waits for the welcome */
	pause();
}

static void open_killed_before_its_welcome(const char *name)
{
	int tid = t_thread_named(tb.pid, "chimed-shard0"), r;
	pid_t pid;

	cr_assert_gt(tid, 0);
	r = t_thread_hold(tid);
	if (r == -EPERM || r == -EACCES)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
	cr_assert_eq(r, 0, "the shard thread did not stop: %s", strerror(-r));
	pid = child(open_and_wait, (void *)name);
	if (!session_listed(name, true) || (usleep(100 * 1000), false)) {
		(void)t_thread_release(tid);
		cr_assert_fail("the broker does not list the session being opened");
	}
	kill_child(pid);
	cr_assert_eq(t_thread_release(tid), 0);
}

Test(session, a_session_an_open_killed_before_its_welcome_created_is_not_kept)
{
	chime_id_t id;
	chime_t *c;

	cr_assert_not_null(getenv("CHIMECTL"));
	start("-n 1");
	open_killed_before_its_welcome("fresh");
	cr_assert(session_listed("fresh", false), "the session the killed open created is still there");
	/* One that existed stays, with its timer. */
	c = sopen_ok("kept");
	cr_assert_eq(chime_arm(c, 0, now_ns() + HOUR, 0, 1, &id), 0);
	chime_close(c);
	open_killed_before_its_welcome("kept");
	usleep(200 * 1000);
	cr_assert(session_listed("kept", true), "the session that existed is gone");
	cr_assert_eq(t_nodes(tb.sock, T_NODES_TIMERS), 1, "its timer is gone");
}

/*
 * ---- fork() in one thread while another is inside chime_open() ----
 * The child has none of its parent's locks' holders: it opens and closes a
 * connection of its own (a deadlock there is the child's alarm, a
 * failure), and the parent's open completes. Nor does it keep the
 * parent's half-made connection: it did, and a worker forked so that
 * lived on held the parent's socket; the parent killed with a wake-up
 * byte unread on it, its session's next process got EBUSY after a
 * second, for as long as the worker lived (a probe: 3 runs of 3, none
 * after). The shard is held under ptrace so that the parent's open waits
 * for its welcome while the other thread forks.
 */
static uint64_t fds_before_open[16];

static void *open_session_main(void *arg)
{
	chime_t *c = NULL;
	intptr_t r = sopen(&c, arg);

	return r == 0 ? (void *)c : (void *)r;
}

static int fork_child_opens(void)
{
	struct chime_event ev;
	chime_id_t id;
	chime_t *c;

	uint64_t now[16];

	alarm(10);      /* a deadlock is SIGALRM */
	open_fds(now);
	for (int i = 0; i < 16; i++)
		if (now[i] & ~fds_before_open[i])
			return 4;       /* the parent's open's socket */
	if (sopen(&c, NULL) < 0)
		return 1;
	if (chime_arm(c, 1, now_ns() + 10 * MS, 0, 5, &id) < 0 || chime_wait(c, &ev, 1, 2000) != 1 || ev.id != id)
		return 2;
	chime_close(c);
	if (sopen(&c, "forked-child") < 0)
		return 3;
	chime_close(c);
	return 0;
}

Test(session, a_child_forked_during_its_parents_open_opens_its_own)
{
	int tid = 0, r;
	struct chime_event ev;
	chime_t *other;
	chime_id_t id;
	pthread_t thr;
	void *ret;
	pid_t pid;

	cr_assert_not_null(getenv("CHIMECTL"));
	start("-n 1");
	other = sopen_ok(NULL);         /* the library's fork handlers are in place */
	open_fds(fds_before_open);
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0);
	r = t_thread_hold(tid);
	if (r == -EPERM || r == -EACCES)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
	cr_assert_eq(r, 0, "the shard thread did not stop: %s", strerror(-r));
	cr_assert_eq(pthread_create(&thr, NULL, open_session_main, "parent"), 0);
	if (!session_listed("parent", true)) {
		(void)t_thread_release(tid);
		cr_assert_fail("the broker does not list the session being opened");
	}
	pid = fork();
	if (pid == 0)
		_exit(fork_child_opens());
	usleep(50 * 1000);
	cr_assert_eq(t_thread_release(tid), 0);
	r = wait_child(pid);
	cr_assert_eq(r, 0, "the child's own open, arm, wait and close: %d (142: a deadlock; 4: it has its parent's "
		     "half-made connection)", r);
	cr_assert_eq(pthread_join(thr, &ret), 0);
	cr_assert_gt((intptr_t)ret, 0, "the parent's open: %s", strerror((int)-(intptr_t)ret));
	cr_assert_eq(chime_arm(ret, 1, now_ns() + 10 * MS, 0, 6, &id), 0);
	cr_assert_eq(chime_wait(ret, &ev, 1, 2000), 1);
	cr_assert_eq(ev.id, id);
	chime_close(ret);
	chime_close(other);
}

/* Hold a session's lock for 50 ms, as a thread making a reconnect attempt does (white box). */
static void *lock_a_while(void *arg)
{
	struct chime *c = arg;

	pthread_mutex_lock(&c->lock);
	usleep(50 * 1000);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/*
 * chime_wait()'s looks take the session's lock, which a thread making a
 * reconnect attempt (an arm waiting for room, a flush) may hold for a
 * moment: held while the wait begins, the wait looks again until it gets
 * it, then asks its wake-up and sleeps, and its event wakes it. (Not
 * covered: the lock taken exactly between the wait's spin and its last
 * look before sleeping, which a stress review suspected and could not
 * make happen; that look would ask no wake-up.)
 */
Test(session, a_wait_begun_while_a_reconnect_holds_the_lock_still_wakes_for_its_event)
{
	struct chime_event ev;
	pthread_t thr;
	chime_id_t id;
	uint64_t t0;
	chime_t *c;

	start("-n 1");
	c = sopen_ok("lookbusy");
	cr_assert_eq(chime_arm(c, 1, now_ns() + 5 * MS, 0, 1, &id), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1, "the first event");     /* events: no wake-up asked now */
	cr_assert_eq(chime_arm(c, 1, now_ns() + 100 * MS, 0, 2, &id), 0);
	cr_assert_eq(pthread_create(&thr, NULL, lock_a_while, c), 0);
	usleep(5000);           /* the lock taken */
	t0 = now_ns();
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1, "no event in 2 s");
	cr_assert_eq(ev.user_data, 2);
	cr_assert_lt(now_ns() - t0, 1000 * MS, "woken after %llu ms for an event due in 100",
		     (unsigned long long)((now_ns() - t0) / MS));
	cr_assert_eq(pthread_join(thr, NULL), 0);
	chime_close(c);
}
