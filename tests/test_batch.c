/* SPDX-License-Identifier: MIT */
/*
 * test_batch.c - chime_submit() against a real chimed: a batch does what the
 * same calls one by one would (each timer fires once, never early; cancels
 * and resets hold once it returns), sets every result, waits out a full
 * ring, fails fast at a full slab or a quota, and says -ENOTCONN when the
 * broker is gone.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"     /* chime_id_shard() */
#include "helpers.h"

#define MS 1000000ull
#define HOUR (3600000 * MS)

static struct t_chimed tb;

static void stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(batch, .fini = stop, .timeout = 120);

static chime_t *copen(void)
{
	chime_t *c = t_open(tb.sock);

	cr_assert_not_null(c, "no connection to the broker (see stderr)");
	return c;
}

static struct chime_op arm_op(uint64_t key, uint64_t deadline_ns, uint64_t user_data)
{
	return (struct chime_op){ .op = CHIME_ARM, .key = key, .deadline_ns = deadline_ns, .user_data = user_data };
}

/*
 * Collect events until `want` arrived and then `quiet_ms` passed with no
 * more; checks none is early. Returns how many arrived; counts per
 * user_data in seen[] (user_data < nseen).
 */
/* Events until `want` and then quiet_ms without one; seen[user_data] counted, dl[user_data] its deadline (dl may be NULL). */
static unsigned collect_dl(chime_t *c, unsigned *seen, uint64_t *dl, unsigned nseen, unsigned want, unsigned quiet_ms)
{
	struct chime_event ev[64];
	unsigned got = 0;
	uint64_t deadline = now_ns() + 20000 * MS;

	while (now_ns() < deadline) {
		int n = chime_wait(c, ev, 64, got >= want ? (int)quiet_ms : 100);

		cr_assert_geq(n, 0, "chime_wait: %s", strerror(-n));
		if (n == 0 && got >= want)
			break;
		for (int i = 0; i < n; i++) {
			cr_assert_geq(ev[i].fired_ns, ev[i].deadline_ns, "fired early");
			cr_assert_geq(now_ns(), ev[i].deadline_ns, "returned early");
			cr_assert_lt(ev[i].user_data, nseen);
			seen[ev[i].user_data]++;
			if (dl)
				dl[ev[i].user_data] = ev[i].deadline_ns;
		}
		got += (unsigned)n;
	}
	return got;
}

static unsigned collect(chime_t *c, unsigned *seen, unsigned nseen, unsigned want, unsigned quiet_ms)
{
	return collect_dl(c, seen, NULL, nseen, want, quiet_ms);
}

Test(batch, bad_arguments)
{
	struct chime_op op = arm_op(1, 0, 0);

	cr_assert_eq(chime_submit(NULL, &op, 1), -EINVAL);
	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2"), 0);
	{
		chime_t *c = copen();

		cr_assert_eq(chime_submit(c, NULL, 1), -EINVAL);
		cr_assert_eq(chime_submit(c, NULL, 0), 0);
		cr_assert_eq(chime_submit(c, &op, 0), 0);
		/* more than the int it returns can count: refused before any operation is read */
		op.result = 7;
		cr_assert_eq(chime_submit(c, &op, (unsigned)INT_MAX + 1u), -EINVAL);
		cr_assert_eq(op.result, 7, "a result set");
		chime_close(c);
	}
}

Test(batch, arms_fire_once_each_never_early_from_one_shard)
{
	enum { N = 64 };
	struct chime_op ops[N];
	unsigned seen[N] = { 0 };
	uint64_t now;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2"), 0);
	c = copen();
	now = now_ns();
	for (unsigned i = 0; i < N; i++)
		ops[i] = arm_op(i, now + (10 + i % 7) * MS, i);
	cr_assert_eq(chime_submit(c, ops, N), N);
	for (unsigned i = 0; i < N; i++) {
		cr_assert_eq(ops[i].result, 0);
		cr_assert_neq(ops[i].id, 0);
		cr_assert_eq(ops[i].id >> 32 & 0xff, ops[0].id >> 32 & 0xff, "a batch's arms share a shard");
		for (unsigned j = 0; j < i; j++)
			cr_assert_neq(ops[i].id, ops[j].id, "ids %u and %u are equal", i, j);
	}
	cr_assert_eq(collect(c, seen, N, N, 100), N);
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(seen[i], 1, "timer %u fired %u times", i, seen[i]);
	chime_close(c);
}

Test(batch, mixed_operations_hold_when_it_returns)
{
	enum { N = 12 };
	struct chime_op ops[N], mix[8];
	unsigned seen[N] = { 0 };
	uint64_t now, dl[N] = { 0 };
	chime_t *c;
	int r;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2"), 0);
	c = copen();
	now = now_ns();
	/* 0..9 at +300 ms (key 100 + i, but 8 and 9 share key 7), 10 and 11 armed one by one */
	for (unsigned i = 0; i < 10; i++)
		ops[i] = arm_op(i >= 8 ? 7 : 100 + i, now + 300 * MS, i);
	cr_assert_eq(chime_submit(c, ops, 10), 10);
	cr_assert_eq(chime_arm(c, 200, now + 300 * MS, 0, 10, &ops[10].id), 0);
	cr_assert_eq(chime_arm(c, 201, now + 300 * MS, 0, 11, &ops[11].id), 0);

	mix[0] = (struct chime_op){ .op = CHIME_CANCEL, .id = ops[1].id };
	mix[1] = (struct chime_op){ .op = CHIME_RESET, .id = ops[2].id, .deadline_ns = now + 600 * MS };
	mix[2] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = 7 };
	mix[3] = (struct chime_op){ .op = 99 };
	mix[4] = (struct chime_op){ .op = CHIME_CANCEL, .id = 0 };
	mix[5] = (struct chime_op){ .op = CHIME_RESET, .id = ops[3].id, .deadline_ns = now + 600 * MS };
	mix[6] = (struct chime_op){ .op = CHIME_CANCEL, .id = ops[3].id };   /* after its reset: gone */
	mix[7] = (struct chime_op){ .op = CHIME_CANCEL, .id = ops[11].id };
	r = chime_submit(c, mix, 8);
	cr_assert_eq(r, 6, "%d succeeded", r);
	cr_assert_eq(mix[3].result, -EINVAL, "an unknown op");
	cr_assert_eq(mix[4].result, -EINVAL, "id 0");
	for (unsigned i = 0; i < 8; i++)
		if (i != 3 && i != 4)
			cr_assert_eq(mix[i].result, 0, "op %u: %s", i, strerror(-mix[i].result));

	/* live: 0, 2 (at +600 ms), 4..7, 10 = 7 timers */
	cr_assert_eq(collect_dl(c, seen, dl, N, 7, 500), 7);
	for (unsigned i = 0; i < N; i++) {
		unsigned want = (i == 0 || i == 2 || (i >= 4 && i <= 7) || i == 10) ? 1 : 0;

		cr_assert_eq(seen[i], want, "timer %u fired %u times, want %u", i, seen[i], want);
	}
	/* The reset held: 2 fired at its new deadline, not at the one it was armed with (an audit: unchecked). */
	cr_assert_eq(dl[2], now + 600 * MS, "timer 2 fired at +%lld ms, not at its reset's +600",
		     (long long)(dl[2] - now) / (long long)MS);
	cr_assert_eq(dl[0], now + 300 * MS);
	chime_close(c);
}

/* A batch much bigger than the submission ring: it is waited out, nothing lost. */
Test(batch, bigger_than_the_ring)
{
	enum { N = 3000 };
	static struct chime_op ops[N];
	static unsigned seen[N];
	uint64_t now;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2 --sq-size 16"), 0);
	c = copen();
	now = now_ns();
	for (unsigned i = 0; i < N; i++)
		ops[i] = arm_op(i, now + 50 * MS, i);
	cr_assert_eq(chime_submit(c, ops, N), N);
	cr_assert_eq(collect(c, seen, N, N, 100), N);
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(seen[i], 1, "timer %u fired %u times", i, seen[i]);
	chime_close(c);
}

Test(batch, full_slab_and_quota_fail_per_operation)
{
	enum { N = 200 };
	static struct chime_op ops[N];
	chime_t *c;
	int r, nomem = 0;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2 --max-timers-per-client 100 --sq-size 16"), 0);
	c = copen();
	for (unsigned i = 0; i < N; i++)
		ops[i] = arm_op(1, now_ns() + HOUR, i);
	r = chime_submit(c, ops, N);
	cr_assert_eq(r, 100, "%d armed, quota 100", r);
	for (unsigned i = 0; i < N; i++) {
		cr_assert(ops[i].result == 0 || ops[i].result == -EDQUOT, "op %u: %s", i, strerror(-ops[i].result));
		cr_assert_eq(ops[i].id == 0, ops[i].result != 0);
	}
	chime_close(c);
	t_chimed_stop(&tb, SIGKILL);

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 1 --capacity 2048 --sq-size 16 --max-timers-per-uid 0"), 0);
	c = copen();
	for (int round = 0; round < 20; round++) {
		for (unsigned i = 0; i < N; i++)
			ops[i] = arm_op(1, now_ns() + HOUR, i);
		r = chime_submit(c, ops, N);
		cr_assert_geq(r, 0);
		for (unsigned i = 0; i < N; i++) {
			cr_assert(ops[i].result == 0 || ops[i].result == -ENOMEM, "op %u: %s", i,
				  strerror(-ops[i].result));
			nomem += ops[i].result == -ENOMEM;
		}
	}
	cr_assert_gt(nomem, 4000 - 2048 - 1, "a full slab refuses: %d refused", nomem);
	chime_close(c);
}

/*
 * An ARM its home shard refuses goes out on another after the call's other
 * records, so a CANCEL_KEY later in the call reached that shard before it.
 * One by one, the cancel comes after the arm and cancels it; so it must
 * in a batch: before, half of these 100 fired (found by an audit).
 */
Test(batch, a_cancel_key_later_in_the_call_cancels_arms_that_went_to_another_shard)
{
	enum { N = 101 };
	static struct chime_op ops[N];
	struct chime_event ev[8];
	unsigned moved = 0;
	chime_t *c;
	int r;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2 --max-timers-per-client 100"), 0);
	c = copen();
	for (unsigned i = 0; i + 1 < N; i++)
		ops[i] = arm_op(7, now_ns() + 300 * MS, i);
	ops[N - 1] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = 7 };
	r = chime_submit(c, ops, N);
	/* a quota of 50 a shard: 50 arms at home, 49 on the other (the CANCEL_KEY's slot took a grant), the cancel */
	cr_assert_geq(r, N - 2, "%d of %d done", r, N);
	cr_assert_eq(ops[N - 1].result, 0);
	for (unsigned i = 0; i + 1 < N; i++)
		moved += ops[i].id && chime_id_shard(ops[i].id) != chime_id_shard(ops[0].id);
	cr_assert_gt(moved, 0, "no arm went to another shard: nothing was tested");
	r = chime_wait(c, ev, 8, 800);
	cr_assert_eq(r, 0, "%d event(s) after the call's CANCEL_KEY (%u arms went to the other shard)", r, moved);
	chime_close(c);
}

Test(batch, broker_gone_is_enotconn)
{
	struct chime_op ops[4];
	chime_t *c;
	int r;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2"), 0);
	c = copen();
	t_chimed_stop(&tb, SIGKILL);
	for (int i = 0; i < 4; i++)
		ops[i] = arm_op(1, now_ns() + HOUR, 0);
	ops[3] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = 1 };
	/* chime_wait notices the hang-up (as an application's loop would) */
	for (int tries = 0; tries < 50 && (r = chime_wait(c, &(struct chime_event){ 0 }, 1, 100)) != -ENOTCONN; tries++)
		;
	cr_assert_eq(r, -ENOTCONN, "chime_wait: %d", r);
	cr_assert_eq(chime_submit(c, ops, 4), -ENOTCONN);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(ops[i].result, -ENOTCONN, "op %d: %d", i, ops[i].result);
	chime_close(c);
}

/*
 * A broker stopped cleanly, its connections not told yet (no drain, no
 * wait): every operation of a call says ENOTCONN and no ARM gets an id,
 * in a call of ARMs only and in a mixed one (libchime sends the first by
 * a path of its own while the broker runs), each on a connection of its
 * own.
 */
Test(batch, a_stopped_broker_loses_every_operation_of_a_call)
{
	enum { N = 40 };
	static struct chime_op ops[N];
	chime_t *c[2];

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 1 --sq-size 16"), 0);
	c[0] = copen();
	c[1] = copen();
	cr_assert_eq(t_chimed_stop(&tb, SIGTERM), 0);
	for (int mixed = 0; mixed < 2; mixed++) {
		for (unsigned i = 0; i < N; i++)
			ops[i] = arm_op(1, now_ns() + HOUR, i);
		if (mixed)
			ops[N - 1] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = 2 };
		cr_assert_eq(chime_submit(c[mixed], ops, N), -ENOTCONN, "%s call", mixed ? "a mixed" : "an ARM-only");
		for (unsigned i = 0; i < N; i++) {
			cr_assert_eq(ops[i].result, -ENOTCONN, "op %u: %d", i, ops[i].result);
			cr_assert(ops[i].op != CHIME_ARM || ops[i].id == 0, "op %u: an id for a timer nobody holds", i);
		}
		chime_close(c[mixed]);
	}
}

/* What one connection's calls across a stop said, checked by the test's thread. */
struct across_stop {
	chime_t *c;
	bool mixed_only;                /* every call mixed, else ARM-only and mixed in turn */
	unsigned calls, partial;        /* calls made; of them, some operations done and some not */
	int last;                       /* the last call's return */
	char wrong[256];                /* the first inconsistency seen, or "" */
};

static void *submit_across_stop(void *arg)
{
	enum { N = 40 };
	struct across_stop *a = arg;
	struct chime_op ops[N];
	uint64_t end = now_ns() + 20000 * MS;

	do {
		unsigned ok = 0, armed = 0, k = a->calls;

		for (unsigned i = 0; i < N; i++)
			ops[i] = arm_op(k, now_ns() + HOUR, i);
		if (k % 2 || a->mixed_only)     /* a mixed call: it also cancels the call before's arms */
			ops[N - 1] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = k - 1 };
		a->last = chime_submit(a->c, ops, N);
		a->calls++;
		for (unsigned i = 0; i < N && !a->wrong[0]; i++) {
			ok += ops[i].result == 0;
			if (ops[i].op != CHIME_ARM)
				continue;
			armed += ops[i].result == 0;
			if ((ops[i].result == 0) != (ops[i].id != 0))
				snprintf(a->wrong, sizeof(a->wrong), "call %u, ARM %u: result %d with id %#llx", k, i,
					 ops[i].result, (unsigned long long)ops[i].id);
			else if (ops[i].result != 0 && ops[i].result != -ENOTCONN && ops[i].result != -ENOMEM &&
				 ops[i].result != -EDQUOT)
				snprintf(a->wrong, sizeof(a->wrong), "call %u, ARM %u: result %d", k, i, ops[i].result);
		}
		if (!a->wrong[0] && (a->last >= 0 ? a->last != (int)ok : ok != 0))
			snprintf(a->wrong, sizeof(a->wrong), "call %u returned %d with %u operations done", k,
				 a->last, ok);
		a->partial += ok && ok < N;
		(void)armed;
	} while (a->last != -ENOTCONN && !a->wrong[0] && now_ns() < end);
	return NULL;
}

/*
 * Calls going on while the broker stops, on an anonymous connection and
 * on two sessions' (which wait for a broker to take them over, here for
 * 1 s, and then lose what they published: a mixed call's unpublish()),
 * one of them making mixed calls only, so that the call the stop finds
 * there is a mixed one: whichever moment each call meets the stop at,
 * every operation's result says what happened to it, an ARM has an id
 * exactly when it is done, the call returns how many are done (or, none
 * done, the error), and all end with ENOTCONN.
 */
Test(batch, calls_across_a_stop_say_what_each_operation_did, .timeout = 60)
{
	static const char *const what[] = { "anonymous", "session", "mixed-only session" };
	struct chime_opts o = { 0 };
	struct across_stop a[3] = { { 0 } };
	pthread_t th[3];

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2 --sq-size 16"), 0);
	o.socket_path = tb.sock;
	cr_assert_eq(chime_open(&a[0].c, &o), 0);
	cr_assert_eq(setenv("CHIME_RECONNECT_S", "1", 1), 0);
	o.session = "batch-across-a-stop";
	cr_assert_eq(chime_open(&a[1].c, &o), 0);
	o.session = "batch-across-a-stop-mixed";
	cr_assert_eq(chime_open(&a[2].c, &o), 0);
	unsetenv("CHIME_RECONNECT_S");
	a[2].mixed_only = true;
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, submit_across_stop, &a[i]), 0);
	usleep(300 * 1000);
	cr_assert_eq(t_chimed_stop(&tb, SIGTERM), 0);
	for (int i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		fprintf(stderr, "%s connection: %u calls, %u with some operations done and some not, the last %d\n",
			what[i], a[i].calls, a[i].partial, a[i].last);
		cr_assert_eq(a[i].wrong[0], 0, "%s connection: %s", what[i], a[i].wrong);
		cr_assert_eq(a[i].last, -ENOTCONN, "%s connection: the last call returned %d", what[i], a[i].last);
		chime_close(a[i].c);
	}
}

/* Two threads submitting batches on one chime_t: exactly once, never early. */
enum { T_BATCHES = 50, T_BATCH = 64, T_N = 2 * T_BATCHES * T_BATCH };
static chime_t *shared_c;

static void *batcher(void *arg)
{
	unsigned base = (unsigned)(uintptr_t)arg;
	struct chime_op ops[T_BATCH];

	for (unsigned b = 0; b < T_BATCHES; b++) {
		uint64_t now = now_ns();

		for (unsigned i = 0; i < T_BATCH; i++)
			ops[i] = arm_op(i, now + (5 + i % 20) * MS, base + b * T_BATCH + i);
		if (chime_submit(shared_c, ops, T_BATCH) != T_BATCH)
			return (void *)1;
	}
	return NULL;
}

Test(batch, two_threads_exactly_once)
{
	static unsigned seen[T_N];
	pthread_t t[2];
	void *ret;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2 --sq-size 64"), 0);
	shared_c = copen();
	for (uintptr_t i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, batcher, (void *)(i * T_BATCHES * T_BATCH)), 0);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(pthread_join(t[i], &ret), 0);
		cr_assert_null(ret, "a batch was not fully submitted");
	}
	cr_assert_eq(collect(shared_c, seen, T_N, T_N, 100), T_N);
	for (unsigned i = 0; i < T_N; i++)
		cr_assert_eq(seen[i], 1, "timer %u fired %u times", i, seen[i]);
	chime_close(shared_c);
}

/*
 * The cancels of arms retried on another shard (above) are found in one
 * pass over the call: a first version scanned the rest of the call for
 * each retried ARM, and 200k arms split between two shards took 3.9 s
 * (found by a review). A CANCEL_KEY of another key at the end has the
 * pass look every retried ARM up; the bound is ten times what it takes.
 */
Test(batch, a_big_batch_split_between_shards_is_submitted_in_linear_time)
{
	enum { N = 200001 };
	static struct chime_op ops[N];
	uint64_t t0, took, bound;
	chime_t *c;
	int r;

	cr_assert_eq(t_chimed_start(&tb, NULL, "-n 2 --max-timers-per-client 200002"), 0);
	c = copen();
	for (unsigned i = 0; i + 1 < N; i++)
		ops[i] = arm_op(7, now_ns() + HOUR, i);
	ops[N - 1] = (struct chime_op){ .op = CHIME_CANCEL_KEY, .key = 8 };
	t0 = now_ns();
	r = chime_submit(c, ops, N);
	took = now_ns() - t0;
	fprintf(stderr, "chime_submit of %d arms and a CANCEL_KEY: %d done in %.0f ms\n", N - 1, r, (double)took / 1e6);
	cr_assert_geq(r, N - 4);
	/*
	 * Against a ThreadSanitizer broker (tsan_suites.sh), 2 s more for the
	 * shards' own pace: one took 1551 ms in a CI run. The scan this is
	 * about is the client's, 3.9 s alone when it was quadratic.
	 */
	bound = (getenv("CHIME_BROKER_TSAN") ? 3500 : 1500) * MS;
	cr_assert_lt(took, bound, "a split batch of %d arms took %.0f ms", N - 1, (double)took / 1e6);
	chime_close(c);
}
