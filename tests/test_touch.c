/* SPDX-License-Identifier: MIT */
/*
 * test_touch.c - keepalive resets without a record (ARCHITECTURE.md, "Keepalive
 * resets without a record"), against a real chimed: a reset of a flagged
 * one-shot to a later deadline writes no record and the timer fires at its
 * last deadline; an earlier reset, and one after the fire, go through the
 * ring and keep chime_reset()'s promises; resets racing the fire from two
 * threads give each timer once, never early; a stale id moves no other
 * timer; a scribbled table hurts only its client; a session, and a client
 * that asks for records, are never given a table.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/perf_event.h>
#include <time.h>
#include <unistd.h>

#include "chime.h"
#include "client.h"
#include "helpers.h"

#define MS 1000000ull

static struct t_chimed tb;

static void broker_start(void)
{
	cr_assert_eq(t_chimed_start(&tb, NULL, "--shards 2"), 0, "chimed did not come up");
}

static void broker_stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(touch, .init = broker_start, .fini = broker_stop, .timeout = 120);

static chime_t *copen(unsigned flags, const char *session)
{
	struct chime_opts o = { .socket_path = tb.sock, .flags = flags, .session = session };
	chime_t *c = NULL;
	int r = chime_open(&c, &o);

	cr_assert_eq(r, 0, "chime_open: %s", strerror(-r));
	return c;
}

/* Records this client has published, over every shard. */
static uint64_t records(chime_t *c)
{
	uint64_t n = 0;

	for (uint32_t s = 0; s < c->nr_shards; s++)
		n += at_load(c->chan[s].sq.tail);
	return n;
}

/* Until the broker has applied every record this client published (at most 5 s). */
static void applied(chime_t *c)
{
	uint64_t until = now_ns() + 5000 * MS;

	for (uint32_t s = 0; s < c->nr_shards; s++) {
		chime_flush(c);
		while (at_load_acq(c->chan[s].sq_head) < at_load(c->chan[s].sq.tail)) {
			cr_assert_lt(now_ns(), until, "shard %u did not apply the records", s);
			usleep(200);
		}
	}
}

/* The id's word and tag in c's touch table. */
static uint64_t *word_of(chime_t *c, chime_id_t id)
{
	cr_assert_not_null(c->touch);
	return &c->touch[(uint64_t)chime_id_shard(id) * c->touch_cap + chime_id_index(id)];
}

static uint32_t *tag_of(chime_t *c, chime_id_t id)
{
	cr_assert_not_null(c->touch_tag);
	return &c->touch_tag[(uint64_t)chime_id_shard(id) * c->touch_cap + chime_id_index(id)];
}

/* The next event (at most wait_ms away), asserted never early. 0: none came. */
static int next_event(chime_t *c, struct chime_event *ev, int wait_ms)
{
	int n = chime_wait(c, ev, 1, wait_ms);

	cr_assert_geq(n, 0, "chime_wait: %s", strerror(-n));
	if (n == 1) {
		cr_assert_geq(ev->fired_ns, ev->deadline_ns, "fired early");
		cr_assert_geq(now_ns(), ev->deadline_ns, "returned early");
	}
	return n;
}

/* Arm a one-shot and reset it once through the ring, applied: flagged. */
static chime_id_t flagged(chime_t *c, uint64_t deadline_ns, uint64_t user_data)
{
	chime_id_t id;

	cr_assert_eq(chime_arm(c, 1, deadline_ns, 0, user_data, &id), 0);
	cr_assert_eq(chime_reset(c, id, deadline_ns), 0);
	applied(c);
	cr_assert_eq(at_load(tag_of(c, id)), chime_id_gen(id) | CHIME_TOUCH_ON,
		     "the shard did not flag the timer");
	return id;
}

Test(touch, a_reset_that_skips_the_record_fires_at_its_last_deadline)
{
	chime_t *c = copen(0, NULL);
	struct chime_event ev;
	uint64_t t0 = now_ns(), last = 0, before;
	chime_id_t id = flagged(c, t0 + 100 * MS, 7);

	before = records(c);
	for (unsigned i = 1; i <= 1000; i++) {
		last = t0 + 100 * MS + i * 200000;      /* 100 .. 300 ms */
		cr_assert_eq(chime_reset(c, id, last), 0);
	}
	cr_assert_eq(records(c), before, "%llu records for 1000 later resets, want none",
		     (unsigned long long)(records(c) - before));
	cr_assert_eq(at_load(word_of(c, id)), last);
	cr_assert_eq(next_event(c, &ev, 2000), 1, "the timer did not fire");
	cr_assert_eq(ev.id, id);
	cr_assert_eq(ev.user_data, 7);
	cr_assert_eq(ev.deadline_ns, last, "fired for deadline +%lld us, want the last one",
		     (long long)(ev.deadline_ns - t0) / 1000);
	cr_assert(at_load(word_of(c, id)) & CHIME_TOUCH_FIRED);
	cr_assert_eq(next_event(c, &ev, 300), 0, "a second event");
	chime_close(c);
}

/*
 * A one-shot is flagged by its first reset, not its arm (a flagged fire
 * reads the word: timers never reset should not pay for it); a periodic
 * never is, and its resets stay records.
 */
Test(touch, a_one_shot_is_flagged_by_its_first_reset_and_a_periodic_never)
{
	chime_t *c = copen(0, NULL);
	struct chime_event ev;
	uint64_t t0 = now_ns(), before;
	chime_id_t one, per, never;

	cr_assert_eq(chime_arm(c, 1, t0 + 100 * MS, 0, 1, &one), 0);
	cr_assert_eq(chime_arm(c, 1, t0 + 3600000 * MS, 1000 * MS, 2, &per), 0);
	cr_assert_eq(chime_arm(c, 1, UINT64_MAX, 0, 3, &never), 0);
	applied(c);
	cr_assert_eq(at_load(tag_of(c, one)), chime_id_gen(one), "an arm flagged the timer");
	cr_assert_eq(at_load(tag_of(c, per)), chime_id_gen(per));
	cr_assert_eq(at_load(tag_of(c, never)), chime_id_gen(never));
	before = records(c);
	cr_assert_eq(chime_reset(c, one, t0 + 150 * MS), 0);
	cr_assert_eq(chime_reset(c, per, t0 + 3700000 * MS), 0);
	cr_assert_eq(chime_reset(c, never, t0 + 250 * MS), 0);
	cr_assert_eq(records(c), before + 3, "a first reset wrote no record");
	applied(c);
	cr_assert_eq(at_load(tag_of(c, one)), chime_id_gen(one) | CHIME_TOUCH_ON);
	cr_assert_eq(at_load(tag_of(c, per)), chime_id_gen(per), "a periodic was flagged");
	cr_assert_eq(at_load(tag_of(c, never)), chime_id_gen(never) | CHIME_TOUCH_ON);
	before = records(c);
	cr_assert_eq(chime_reset(c, one, t0 + 200 * MS), 0);
	cr_assert_eq(records(c), before, "the second later reset of a one-shot wrote a record");
	cr_assert_eq(chime_reset(c, per, t0 + 3800000 * MS), 0);
	cr_assert_eq(records(c), before + 1, "a periodic's reset wrote no record");
	applied(c);
	cr_assert_eq(next_event(c, &ev, 2000), 1);
	cr_assert_eq(ev.id, one);
	cr_assert_eq(ev.deadline_ns, t0 + 200 * MS);
	cr_assert_eq(next_event(c, &ev, 2000), 1);
	cr_assert_eq(ev.id, never);
	cr_assert_eq(ev.deadline_ns, t0 + 250 * MS);
	cr_assert_eq(next_event(c, &ev, 200), 0);
	chime_close(c);
}

Test(touch, an_earlier_reset_goes_through_the_ring_and_is_kept)
{
	chime_t *c = copen(0, NULL);
	struct chime_event ev;
	uint64_t t0 = now_ns(), before;
	chime_id_t id = flagged(c, t0 + 400 * MS, 1);

	cr_assert_eq(chime_reset(c, id, t0 + 900 * MS), 0);     /* later: the word */
	before = records(c);
	cr_assert_eq(chime_reset(c, id, t0 + 150 * MS), 0);     /* earlier: a record */
	cr_assert_eq(records(c), before + 1);
	cr_assert_eq(chime_reset(c, id, t0 + 200 * MS), 0);     /* later than that: the word again */
	applied(c);
	cr_assert_eq(next_event(c, &ev, 2000), 1);
	cr_assert_eq(ev.deadline_ns, t0 + 200 * MS, "fired for +%lld ms, want +200",
		     (long long)(ev.deadline_ns - t0) / (long long)MS);
	cr_assert_eq(next_event(c, &ev, 300), 0, "a second event");
	chime_close(c);
}

/*
 * An earlier reset is a record that cannot wait for the sleeping shard's
 * planned wake-up (the old deadline): it rings, and fires on time. Left
 * to the heartbeat it would fire 0-90 ms late: four of five under 15 ms
 * (one may be late on a loaded host) would be luck of about 5 x 0.2^4.
 */
Test(touch, an_earlier_reset_wakes_a_sleeping_shard_and_fires_on_time)
{
	chime_t *c = copen(0, NULL);
	struct t_misses late_ones = { 0 };
	struct chime_event ev;

	for (unsigned i = 0; i < 5; i++) {
		chime_id_t id = flagged(c, now_ns() + 2000 * MS, i);
		uint64_t d;

		usleep(50000);          /* the shards asleep until the deadline */
		d = now_ns() + 20 * MS;
		cr_assert_eq(chime_reset(c, id, d), 0);
		cr_assert_eq(next_event(c, &ev, 2000), 1);
		cr_assert_eq(ev.id, id);
		cr_assert_eq(ev.deadline_ns, d);
		if (ev.fired_ns - d >= 15 * MS)
			t_missed(&late_ones, "round %u: %.1f ms", i, (double)(ev.fired_ns - d) / 1e6);
	}
	cr_assert_leq(late_ones.n, 1, "an earlier reset fired 15 ms or more late in %u of 5 rounds%s",
		      late_ones.n, late_ones.what);
	chime_close(c);
}

Test(touch, a_reset_after_the_fire_voids_the_untaken_event_or_changes_nothing)
{
	chime_t *c = copen(0, NULL);
	struct chime_event ev;
	uint64_t t0 = now_ns(), before;
	chime_id_t id = flagged(c, t0 + 50 * MS, 2);

	/* fired, its event not taken: FIRED, so the reset is a record, and it wins */
	while (!(at_load(word_of(c, id)) & CHIME_TOUCH_FIRED)) {
		cr_assert_lt(now_ns(), t0 + 5000 * MS, "the shard never set FIRED");
		usleep(1000);
	}
	before = records(c);
	cr_assert_eq(chime_reset(c, id, t0 + 300 * MS), 0);
	cr_assert_eq(records(c), before + 1, "a reset after the fire wrote no record");
	cr_assert_eq(next_event(c, &ev, 2000), 1);
	cr_assert_eq(ev.deadline_ns, t0 + 300 * MS, "the voided event came back (+%lld ms)",
		     (long long)(ev.deadline_ns - t0) / (long long)MS);
	/* taken: the timer is gone, a reset changes nothing */
	cr_assert_eq(chime_reset(c, id, now_ns() + 50 * MS), 0);
	cr_assert_eq(chime_reset(c, id, now_ns() + 60 * MS), 0);
	cr_assert_eq(next_event(c, &ev, 400), 0, "a reset of a timer whose event was taken fired it again");
	chime_close(c);
}

Test(touch, a_stale_id_moves_no_timer_armed_on_its_node)
{
	chime_t *c = copen(0, NULL);
	struct chime_event ev;
	uint64_t t0 = now_ns();
	chime_id_t old = flagged(c, t0 + 3600000 * MS, 3), id;
	int tries = 0;

	cr_assert_eq(chime_cancel(c, old), 0);
	applied(c);
	/* the node again, under a new generation (the slab hands out its lowest free node) */
	do {
		cr_assert_eq(chime_arm(c, 1, t0 + 200 * MS, 0, 4, &id), 0);
		cr_assert_lt(++tries, 100000, "the node never came back");
	} while (chime_id_index(id) != chime_id_index(old) || chime_id_shard(id) != chime_id_shard(old));
	cr_assert_eq(chime_reset(c, id, t0 + 250 * MS), 0);
	applied(c);
	cr_assert_eq(chime_reset(c, old, t0 + 900 * MS), 0);    /* stale: must not move id */
	cr_assert_eq(chime_reset(c, old, t0 + 100 * MS), 0);
	applied(c);
	cr_assert_eq(at_load(word_of(c, id)), t0 + 250 * MS, "a stale id wrote the word");
	for (;;) {
		cr_assert_eq(next_event(c, &ev, 2000), 1, "the new timer did not fire");
		if (ev.id == id)
			break;
		cr_assert_eq(ev.user_data, 4);  /* the arms that did not land on the node: +200 ms */
	}
	cr_assert_eq(ev.deadline_ns, t0 + 250 * MS);
	chime_close(c);
}

/* ---- resets racing the fire ---- */

#define RACE_TIMERS   200u
#define RACE_LOG      4096u

struct race_log {
	uint64_t ret_ns[RACE_LOG];      /* when the reset returned */
	uint64_t d[RACE_LOG];           /* its deadline, increasing */
	unsigned n;
};

struct race {
	chime_t *c;
	chime_id_t id[RACE_TIMERS];
	struct race_log *log;           /* [RACE_TIMERS] */
	unsigned first, count;
	uint64_t until_ns;
	unsigned seed;
};

/*
 * Reset its timers to increasing deadlines 1-4 ms ahead, each now and then
 * left alone for 2-6 ms so that it fires meanwhile (some events then
 * taken, some voided by the next reset).
 */
static void *racer(void *arg)
{
	struct race *r = arg;
	uint64_t skip_until[RACE_TIMERS] = { 0 };

	while (now_ns() < r->until_ns) {
		for (unsigned k = r->first; k < r->first + r->count; k++) {
			struct race_log *l = &r->log[k];
			uint64_t now = now_ns(), d;

			if (now < skip_until[k] || l->n == RACE_LOG)
				continue;
			if (rand_r(&r->seed) % 64 == 0) {
				skip_until[k] = now + (2 + rand_r(&r->seed) % 5) * MS;
				continue;
			}
			d = now + (1 + rand_r(&r->seed) % 4) * MS;
			if (l->n && d <= l->d[l->n - 1])
				d = l->d[l->n - 1] + 1;
			if (chime_reset(r->c, r->id[k], d) != 0)
				return (void *)1;
			l->ret_ns[l->n] = now_ns();
			l->d[l->n++] = d;
		}
		usleep(100);
	}
	return NULL;
}

Test(touch, resets_racing_the_fire_from_two_threads_give_each_timer_once_never_early)
{
	chime_t *c = copen(0, NULL);
	struct race r[2];
	struct race_log *log = calloc(RACE_TIMERS, sizeof(*log));
	uint64_t fired[RACE_TIMERS], deadline[RACE_TIMERS];    /* fired: or when its chime_wait() began */
	unsigned seen[RACE_TIMERS] = { 0 }, got = 0, touched = 0;
	pthread_t th[2];
	chime_id_t ids[RACE_TIMERS];
	uint64_t t0 = now_ns();
	struct chime_event ev[64];
	unsigned seed = 777;

	cr_assert_not_null(log);
	for (unsigned k = 0; k < RACE_TIMERS; k++) {
		cr_assert_eq(chime_arm(c, k, t0 + 20 * MS, 0, k, &ids[k]), 0);
		cr_assert_eq(chime_reset(c, ids[k], t0 + 20 * MS), 0);     /* flags it once applied */
		log[k].ret_ns[0] = now_ns();
		log[k].d[0] = t0 + 20 * MS;
		log[k].n = 1;
	}
	for (unsigned i = 0; i < 2; i++) {
		r[i] = (struct race){ .c = c, .log = log, .first = i * RACE_TIMERS / 2, .count = RACE_TIMERS / 2,
				      .until_ns = t0 + 600 * MS, .seed = 12345 + i };
		memcpy(r[i].id, ids, sizeof(ids));
		cr_assert_eq(pthread_create(&th[i], NULL, racer, &r[i]), 0);
	}
	/* drain meanwhile and after: every timer once */
	while (got < RACE_TIMERS || now_ns() < t0 + 1000 * MS) {
		uint64_t called;
		int n;

		usleep(500 + (unsigned)rand_r(&seed) % 3000);   /* events wait in the ring, for resets to race */
		called = now_ns();
		n = chime_wait(c, ev, 64, 50);

		cr_assert_geq(n, 0);
		cr_assert_lt(now_ns(), t0 + 10000 * MS, "%u of %u timers fired", got, RACE_TIMERS);
		for (int i = 0; i < n; i++) {
			unsigned k = (unsigned)ev[i].user_data;

			cr_assert_lt(k, RACE_TIMERS);
			cr_assert_eq(ev[i].id, ids[k]);
			cr_assert_geq(ev[i].fired_ns, ev[i].deadline_ns, "fired early");
			cr_assert_eq(++seen[k], 1, "timer %u fired twice", k);
			/* what a reset that returned before then must be no later than */
			fired[k] = ev[i].fired_ns > called ? ev[i].fired_ns : called;
			deadline[k] = ev[i].deadline_ns;
			got++;
		}
	}
	for (unsigned i = 0; i < 2; i++) {
		void *ret;

		pthread_join(th[i], &ret);
		cr_assert_null(ret, "a reset failed");
	}
	/*
	 * Never early against the resets: each one that had returned before
	 * the shard fired (fired_ns is taken before it looks at the word), or
	 * before the chime_wait() that returned the event (an earlier firing
	 * in flight is never returned), asked for a deadline no later than the
	 * one that fired, which is one the thread asked for.
	 */
	for (unsigned k = 0; k < RACE_TIMERS; k++) {
		const struct race_log *l = &log[k];
		bool asked = false;

		for (unsigned j = 0; j < l->n; j++) {
			asked |= l->d[j] == deadline[k];
			if (l->ret_ns[j] < fired[k])
				cr_assert_leq(l->d[j], deadline[k],
					      "timer %u fired for +%lld us, though a reset to +%lld us had returned %lld us "
					      "before it fired or its chime_wait() began", k, (long long)(deadline[k] - t0) / 1000,
					      (long long)(l->d[j] - t0) / 1000, (long long)(fired[k] - l->ret_ns[j]) / 1000);
		}
		cr_assert(asked, "timer %u fired for a deadline no reset asked for", k);
		touched += l->n > 1;
	}
	cr_assert_gt(touched, RACE_TIMERS / 2, "the threads reset only %u timers", touched);
	free(log);
	chime_close(c);
}

/* ---- who gets a table, and a hostile one ---- */

/* The welcome's features for an anonymous hello by hand whose `limit` is token. */
static uint32_t welcome_features(uint64_t token)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
				 .flags = CHIME_HELLO_SEALS, .pid = getpid(), .limit = token };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_welcome w = { 0 };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	memcpy(sa.sun_path, tb.sock, strnlen(tb.sock, sizeof(sa.sun_path) - 1));
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(send(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	/* no room for the fds: the kernel closes them (MSG_CTRUNC) */
	cr_assert_geq(recv(fd, &w, sizeof(w), 0), (ssize_t)offsetof(struct chime_welcome, features) + 4);
	cr_assert_eq(w.magic, CHIME_HELLO_MAGIC);
	cr_assert_eq(w.status, 0);
	close(fd);
	return w.features;
}

/*
 * The hello's token names the table's layout: a library of another
 * layout (the 16-byte entries of "touch", never released) gets no table
 * and resets through records, rather than reading entries wrong.
 */
Test(touch, a_hello_asking_for_another_layout_gets_no_table)
{
	cr_assert(welcome_features(CHIME_HELLO_TOUCH) & CHIME_WELCOME_F_TOUCH);
	cr_assert_not(welcome_features(UINT64_C(0x686375746f74)) & CHIME_WELCOME_F_TOUCH,
		      "a hello for 16-byte entries got a table");
	cr_assert_not(welcome_features(0) & CHIME_WELCOME_F_TOUCH);
}

Test(touch, a_session_and_a_client_asking_for_records_get_no_table_and_reset_as_before)
{
	chime_t *c[3] = { copen(0, NULL), copen(CHIME_OPEN_RECORD_RESETS, NULL), copen(0, "touchless") };
	struct chime_event ev;

	cr_assert_not_null(c[0]->touch, "an anonymous client got no table");
	cr_assert_null(c[1]->touch);
	cr_assert_null(c[2]->touch);
	for (int i = 1; i < 3; i++) {
		uint64_t t0 = now_ns(), before;
		chime_id_t id;

		cr_assert_eq(chime_arm(c[i], 1, t0 + 100 * MS, 0, 0, &id), 0);
		before = records(c[i]);
		for (unsigned k = 1; k <= 10; k++)
			cr_assert_eq(chime_reset(c[i], id, t0 + (100 + k * 10) * MS), 0);
		cr_assert_eq(records(c[i]), before + 10, "every reset is a record");
		cr_assert_eq(next_event(c[i], &ev, 2000), 1);
		cr_assert_eq(ev.deadline_ns, t0 + 200 * MS);
	}
	for (int i = 0; i < 3; i++)
		chime_close(c[i]);
}

/* ---- how a touched timer is listed ---- */

/* The broker's answer to a timers query for this process (as root: every client). */
static uint64_t query_timers(struct chime_query_timer *recs, uint64_t n)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
				 .flags = CHIME_HELLO_QUERY_TIMERS, .pid = getpid(), .limit = n };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_query_head head = { .status = -1 };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	size_t got = 0;

	cr_assert_geq(fd, 0);
	memcpy(sa.sun_path, tb.sock, strnlen(tb.sock, sizeof(sa.sun_path) - 1));
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(send(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_eq(recv(fd, &head, sizeof(head), 0), (ssize_t)sizeof(head));
	cr_assert_eq(head.status, 0, "the timers query: %s", strerror(-head.status));
	while (got < n && got < head.count) {
		ssize_t r = recv(fd, recs + got, (n - got) * sizeof(*recs), 0);

		cr_assert_gt(r, 0);
		got += (size_t)r / sizeof(*recs);
	}
	close(fd);
	return got;
}

/* `chimectl ARGS` on this broker, piped through `FILTER`: its first line of output. */
static void chimectl(char *line, size_t len, const char *args, const char *filter)
{
	const char *ctl = getenv("CHIMECTL");
	char cmd[1024];
	FILE *p;

	if (!ctl || !*ctl)
		cr_skip_test("$CHIMECTL not set (run through meson test)");
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' %s | %s", ctl, tb.sock, args, filter);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	line[0] = '\0';
	if (!fgets(line, (int)len, p))
		line[0] = '\0';
	pclose(p);
	line[strcspn(line, "\n")] = '\0';
}

/*
 * A touched timer's latest deadline is its word, which only the broker
 * maps: the broker's answer to a timers query carries the word (and says
 * the timer is touched); chimectl reading the segments shows the node's
 * deadline as a lower bound (">=", "deadline_exact": false). A timer that
 * is never reset is exact both ways.
 */
Test(touch, a_touched_timer_is_listed_with_its_latest_deadline_or_as_a_lower_bound)
{
	chime_t *c = copen(0, NULL);
	uint64_t t0 = now_ns(), d1 = t0 + 3600000 * MS, d2 = d1 + 1800000 * MS;
	struct chime_query_timer recs[4];
	chime_id_t a = flagged(c, d1, 1), b;
	char args[128], filter[256], line[256];
	uint64_t n;
	bool seen_a = false, seen_b = false;

	cr_assert_eq(chime_arm(c, 2, d1, 0, 2, &b), 0);
	cr_assert_eq(chime_reset(c, a, d2), 0);
	cr_assert_eq(at_load(word_of(c, a)), d2, "the touch did not go through the word");
	applied(c);

	n = query_timers(recs, 4);
	cr_assert_eq(n, 2);
	for (uint64_t i = 0; i < n; i++) {
		if (recs[i].id == a) {
			seen_a = true;
			cr_assert_eq(recs[i].flags, CHIME_QUERY_TIMER_TOUCHED);
			cr_assert_eq(recs[i].deadline_ns, d2, "the query gave %" PRIu64 ", not the word's %" PRIu64,
				     recs[i].deadline_ns, d2);
		} else if (recs[i].id == b) {
			seen_b = true;
			cr_assert_eq(recs[i].flags, 0);
			cr_assert_eq(recs[i].deadline_ns, d1);
		}
	}
	cr_assert(seen_a && seen_b);

	/* chimectl, as root, reads the segments: the node's deadline, d1, said to be a lower bound */
	snprintf(args, sizeof(args), "-j timers --client %d", (int)getpid());
	snprintf(filter, sizeof(filter),
		 "jq -r '.timers[] | select(.id == \"0x%" PRIx64 "\") | \"\\(.touched) \\(.deadline_exact) "
		 "\\(.deadline_in_ns > 3000000000000 and .deadline_in_ns <= 3600000000000)\"'", a);
	chimectl(line, sizeof(line), args, filter);
	cr_assert_str_eq(line, "true false true", "touched, exact, deadline about d1");
	snprintf(filter, sizeof(filter),
		 "jq -r '.timers[] | select(.id == \"0x%" PRIx64 "\") | \"\\(.touched) \\(.deadline_exact)\"'", b);
	chimectl(line, sizeof(line), args, filter);
	cr_assert_str_eq(line, "false true");
	snprintf(args, sizeof(args), "timers --client %d", (int)getpid());
	snprintf(filter, sizeof(filter), "grep '^ *0x%" PRIx64 " '", a);
	chimectl(line, sizeof(line), args, filter);
	cr_assert(strstr(line, " >=+"), "the text marks the lower bound: '%s'", line);
	snprintf(filter, sizeof(filter), "grep '^ *0x%" PRIx64 " '", b);
	chimectl(line, sizeof(line), args, filter);
	cr_assert(line[0] && !strstr(line, ">="), "'%s'", line);
	chime_close(c);
}

Test(touch, a_deadline_past_2_63_ns_is_kept_as_the_latest_and_never_fires)
{
	chime_t *c = copen(0, NULL);
	struct chime_event ev;
	chime_id_t id = flagged(c, now_ns() + 50 * MS, 5);

	cr_assert_eq(chime_reset(c, id, UINT64_MAX), 0);
	cr_assert_eq(at_load(word_of(c, id)), CHIME_TOUCH_MAX_NS);
	cr_assert_eq(next_event(c, &ev, 300), 0, "a timer reset to UINT64_MAX fired");
	cr_assert_eq(chime_cancel(c, id), 0);
	chime_close(c);
}

/*
 * A client that writes anything into its table (deadlines, FIRED bits,
 * tags) and sends RESET_TOUCH records for its timers: the shard reads only
 * words of its own flagged timers, so an honest client beside it keeps
 * its timers on time and the broker lives on.
 */
Test(touch, a_scribbled_table_hurts_only_its_client)
{
	chime_t *honest = copen(0, NULL);
	struct chime_event ev;
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		chime_t *c = t_open(tb.sock);
		chime_id_t id[256];
		unsigned seed = 99;
		uint64_t until = now_ns() + 1500 * MS;

		if (!c || !c->touch)
			_exit(2);
		for (unsigned k = 0; k < 256; k++)
			if (chime_arm(c, k, now_ns() + (1 + k % 50) * MS, 0, k, &id[k]) != 0 ||
			    chime_reset(c, id[k], now_ns() + (2 + k % 50) * MS) != 0)
				_exit(3);
		while (now_ns() < until) {
			uint64_t e = (uint64_t)rand_r(&seed) % ((uint64_t)c->touch_cap * c->nr_shards);
			uint64_t v = ((uint64_t)rand_r(&seed) << 33) ^ (uint64_t)rand_r(&seed) ^ now_ns();

			switch (rand_r(&seed) % 4) {
			case 0: at_store(&c->touch[e], v); break;
			case 1: at_store(&c->touch[e], now_ns() + (v % 3) * MS); break;
			case 2: at_store(&c->touch_tag[e], (uint32_t)v); break;
			default: (void)chime_reset(c, id[v % 256], now_ns() + (v % 5) * MS); break;
			}
			(void)chime_poll(c, &ev, 1);
		}
		_exit(0);
	}
	/* meanwhile: 100 timers 20 ms apart, each reset through the fast path */
	for (unsigned k = 0; k < 60; k++) {
		uint64_t t = now_ns();
		chime_id_t id = flagged(honest, t + 15 * MS, k);

		cr_assert_eq(chime_reset(honest, id, t + 20 * MS), 0);
		cr_assert_eq(next_event(honest, &ev, 2000), 1, "timer %u did not fire", k);
		cr_assert_eq(ev.id, id);
		cr_assert_eq(ev.deadline_ns, t + 20 * MS);
		cr_assert_lt(ev.fired_ns - ev.deadline_ns, 200 * MS, "timer %u fired %llu us late", k,
			     (unsigned long long)(ev.fired_ns - ev.deadline_ns) / 1000);
	}
	{
		int st;

		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the attacker failed to set up (%d)", st);
	}
	cr_assert(t_alive(tb.pid), "the broker died");
	chime_close(honest);
}

/*
 * A client's timers spread over the slab (another client's 255 between
 * each two of its own): the shard checks the residency of at most one run
 * of 512 nodes (their words fill a page, their tags half of one) per 128
 * timers it owns, plus 16 (touch_page_ok()), and reads and writes the
 * entries of no other run, so the client cannot make it take a syscall
 * per record (the pages are the client's own now: it wrote every entry
 * here, and the shard allocates none). Past that, its timers are not
 * flagged, and their resets are records, kept as before.
 */
Test(touch, a_client_spread_over_the_slab_gets_no_more_table_pages_than_its_share)
{
	struct t_chimed b2 = { 0 };
	struct chime_opts fo = { .flags = CHIME_OPEN_RECORD_RESETS };
	chime_t *a, *f = NULL;
	struct chime_event ev;
	chime_id_t id[300], junk;
	uint64_t far = now_ns() + 3600000 * MS, t;
	unsigned flagged_n = 0, runs = 0;
	uint32_t last_run = UINT32_MAX;

	cr_assert_eq(t_chimed_start(&b2, NULL, "--shards 1 --capacity 262144 --sq-size 16 --cq-size 64"), 0);
	a = t_open(b2.sock);
	fo.socket_path = b2.sock;
	cr_assert_not_null(a);
	cr_assert_eq(chime_open(&f, &fo), 0);
	for (unsigned k = 0; k < 300; k++) {
		for (unsigned j = 0; j < 255; j++)
			cr_assert_eq(chime_arm(f, 0, far, 0, 0, &junk), 0);
		applied(f);
		cr_assert_eq(chime_arm(a, k, far, 0, k, &id[k]), 0);
		applied(a);
	}
	for (unsigned k = 0; k < 300; k++)     /* first resets: each would flag its timer */
		cr_assert_eq(chime_reset(a, id[k], far + MS), 0);
	applied(a);
	for (unsigned k = 0; k < 300; k++) {
		uint32_t run = chime_id_index(id[k]) / 512;

		if (at_load(tag_of(a, id[k])) != (chime_id_gen(id[k]) | CHIME_TOUCH_ON))
			continue;
		flagged_n++;
		runs += run != last_run;
		last_run = run;
	}
	/* 300 timers and 16 grants: 2 runs by the share, plus 16 (the 300 timers span 150) */
	cr_assert_leq(runs, 316 / 128 + 16, "the shard touched %u runs of the table for %u timers", runs, 300);
	cr_assert_lt(flagged_n, 300, "every spread timer was flagged");
	cr_assert_gt(flagged_n, 0);
	/* flagged or not, a reset is kept */
	t = now_ns();
	for (unsigned k = 0; k < 300; k++)
		cr_assert_eq(chime_reset(a, id[k], t + (100 + k % 10) * MS), 0);
	for (unsigned k = 0; k < 300; k++) {
		cr_assert_eq(next_event(a, &ev, 3000), 1, "%u of 300 timers fired", k);
		cr_assert_eq(ev.deadline_ns, t + (100 + ev.user_data % 10) * MS);
	}
	cr_assert_eq(next_event(a, &ev, 200), 0);
	chime_close(a);
	chime_close(f);
	t_chimed_stop(&b2, SIGTERM);
}


/* Pages of the table resident in memory from &c->touch_tag[first] on, over n tags (mincore: the page cache). */
static unsigned tag_pages_resident(chime_t *c, uint64_t first, uint64_t n)
{
	uintptr_t from = (uintptr_t)&c->touch_tag[first] & ~(uintptr_t)4095;
	uintptr_t to = ((uintptr_t)&c->touch_tag[first + n] + 4095) & ~(uintptr_t)4095;
	size_t pages = (to - from) / 4096;
	unsigned char *v = calloc(pages, 1);
	unsigned in = 0;

	cr_assert_not_null(v);
	cr_assert_eq(mincore((void *)from, to - from, v), 0, "mincore: %s", strerror(errno));
	for (size_t i = 0; i < pages; i++)
		in += v[i] & 1;
	free(v);
	return in;
}

/*
 * The calling thread's page faults taken in user space, from now on (a
 * perf software counter: a populate's faults, MADV_POPULATE_WRITE, are
 * not counted, as they are in getrusage()'s ru_minflt: the library
 * allocates its table's pages itself, a window at a time, and what is
 * counted is the exceptions its calls take). Skips the test if perf
 * counters are not available.
 */
static int fault_counter(void)
{
	struct perf_event_attr a = { .type = PERF_TYPE_SOFTWARE, .size = sizeof(a),
				     .config = PERF_COUNT_SW_PAGE_FAULTS, .exclude_kernel = 1, .exclude_hv = 1 };
	int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);

	if (fd < 0)
		cr_skip_test("perf_event_open: %s", strerror(errno));
	return fd;
}

static long minor_faults(int fd)
{
	uint64_t n = 0;

	cr_assert_eq(read(fd, &n, sizeof(n)), (ssize_t)sizeof(n));
	return (long)n;
}

/* A chimed of one shard of its own, and a client of it with a touch table. */
static chime_t *one_shard_client(struct t_chimed *b)
{
	chime_t *c;

	cr_assert_eq(t_chimed_start(b, NULL, "--shards 1"), 0);
	c = t_open(b->sock);
	cr_assert_not_null(c);
	cr_assert_not_null(c->touch_tag, "no touch table");
	return c;
}

/*
 * A client arming in bursts allocates its table's pages itself (the shard
 * allocates none: broker/chan.c, chan_touch_check()), a 64 KiB window at
 * a time, half a window ahead of its arms (libclient: touch_ahead(); a
 * chime_submit() looks once a run of records), and the shard writes the
 * tags of the grants in those windows: its arms take far fewer page
 * faults than the table's pages they write (one each without). So do the
 * first resets, with their words.
 */
static void arms_in_bursts_fault_ahead(bool batched)
{
	enum { N = 65536, BURST = 1024, BATCH = 64 };
	struct t_chimed b1 = { 0 };
	uint64_t far = now_ns() + 3600000 * MS;
	static chime_id_t id[N];
	static struct chime_op ops[BATCH];
	long faults = 0;
	chime_t *c;
	int r = 0, pf;

	c = one_shard_client(&b1);
	pf = fault_counter();
	/* its own pages faulted in now, not in the arms (after the fork: it write-protects them) */
	memset(id, 0xff, sizeof(id));
	memset(ops, 0, sizeof(ops));
	for (unsigned i = 0; i < N; i += BURST) {
		long f0;

		usleep(3000);   /* the shard idle between bursts, as between a service's bursts */
		f0 = minor_faults(pf);
		/* no assertion in the burst: criterion's own bookkeeping of each takes page faults */
		for (unsigned j = i; j < i + BURST && !r; j += batched ? BATCH : 1) {
			if (!batched) {
				r = chime_arm(c, 1, far, 0, j, &id[j]);
				continue;
			}
			for (unsigned k = 0; k < BATCH; k++)
				ops[k] = (struct chime_op){ .op = CHIME_ARM, .key = 1, .deadline_ns = far, .user_data = j + k };
			r = chime_submit(c, ops, BATCH);
			r = r == BATCH ? 0 : r < 0 ? r : ops[0].result ? ops[0].result : -EIO;
			for (unsigned k = 0; k < BATCH; k++)
				id[j + k] = ops[k].id;
		}
		faults += minor_faults(pf) - f0;
		cr_assert_eq(r, 0, "%s: %s", batched ? "chime_submit" : "chime_arm", strerror(-r));
	}
	/*
	 * the first 4096 arms' 4 pages, before the channel allocates windows
	 * (5 here, and 9-13 in the first resets); 65 when each arm's first
	 * write into a page faulted
	 */
	cr_assert_leq(faults, N / 1024 * 2 / 3, "%ld page faults in %u arms (%u pages of tags)", faults, N, N / 1024);
	/* and the first resets: they write the words (512 to a page), a window at a time */
	faults = 0;
	for (unsigned i = 0; i < N; i += BURST) {
		long f0;

		usleep(3000);
		f0 = minor_faults(pf);
		for (unsigned j = i; j < i + BURST && !r; j++)
			r = chime_reset(c, id[j], far + MS);
		faults += minor_faults(pf) - f0;
		cr_assert_eq(r, 0, "chime_reset: %s", strerror(-r));
	}
	cr_assert_leq(faults, N / 512 * 2 / 3, "%ld page faults in %u first resets (%u pages of words)", faults, N,
		      N / 512);
	close(pf);
	chime_close(c);
	t_chimed_stop(&b1, SIGTERM);
}

Test(touch, arms_in_bursts_find_their_table_faulted_in_ahead)
{
	arms_in_bursts_fault_ahead(false);
}

Test(touch, batched_arms_find_their_table_faulted_in_ahead)
{
	arms_in_bursts_fault_ahead(true);
}

/* Pages of [from, to) of c's table (its mapping) resident: mincore, which reports the memfd's page cache. */
static unsigned resident_between(const void *from_p, const void *to_p)
{
	uintptr_t from = ((uintptr_t)from_p + 4095) & ~(uintptr_t)4095, to = (uintptr_t)to_p & ~(uintptr_t)4095;
	size_t pages = to > from ? (to - from) / 4096 : 0;
	unsigned char *v = calloc(pages + 1, 1);
	unsigned in = 0;

	cr_assert_not_null(v);
	if (pages)
		cr_assert_eq(mincore((void *)from, to - from, v), 0, "mincore: %s", strerror(errno));
	for (size_t i = 0; i < pages; i++)
		in += v[i] & 1;
	free(v);
	return in;
}

/* The end of the 64 KiB window (of address space, as libclient counts them) that holds p. */
static const void *window_end(const void *p)
{
	return (const void *)(((uintptr_t)p / TOUCH_WINDOW + 1) * TOUCH_WINDOW);
}

/*
 * The broker allocates no page of a client's table (it will be sealed
 * against punching, so that a page the shard finds there stays): the
 * shard writes tags and words only in pages already resident, which the
 * client allocated (broker/chan.c, chan_touch_check(), touch_page_ok()).
 * A client arms and resets 30000 timers in bursts, the shard idle between
 * them (where it faulted blocks of the table in ahead before: the words
 * of nodes up to 49151 then), and the table past what the library
 * allocates (half a window of tags ahead of its last arm, the window of
 * words of its last reset) stays out of memory, however long the shard
 * is idle.
 */
Test(touch, the_shard_allocates_no_page_of_a_clients_table)
{
	enum { N = 30000, BURST = 1000 };
	struct t_chimed b1 = { 0 };
	uint64_t far = now_ns() + 3600000 * MS;
	static chime_id_t id[N];
	uint32_t top = 0;
	unsigned tags, words;
	chime_t *c;

	c = one_shard_client(&b1);
	for (unsigned i = 0; i < N; i += BURST) {
		usleep(3000);
		for (unsigned j = i; j < i + BURST; j++)
			cr_assert_eq(chime_arm(c, 1, far, 0, j, &id[j]), 0);
	}
	for (unsigned i = 0; i < N; i += BURST) {
		usleep(3000);
		for (unsigned j = i; j < i + BURST; j++)
			cr_assert_eq(chime_reset(c, id[j], far + MS), 0);
	}
	applied(c);
	for (unsigned j = 0; j < N; j++)
		top = chime_id_index(id[j]) > top ? chime_id_index(id[j]) : top;
	cr_assert_lt((uint64_t)top + 2 * 16384, c->touch_cap, "the test wants room past its timers");
	usleep(100000);         /* the shard idle: it faulted blocks in then */
	tags = resident_between(window_end(&c->touch_tag[top + 8192]), &c->touch_tag[c->touch_cap]);
	words = resident_between(window_end(&c->touch[top]), &c->touch[c->touch_cap]);
	cr_assert_eq(tags, 0, "%u pages of tags past the client's last window (node %u) resident", tags, top);
	cr_assert_eq(words, 0, "%u pages of words past the client's last window (node %u) resident", words, top);
	/* and what the client did write is resident: the check sees pages */
	cr_assert_gt(resident_between(c->touch_tag, &c->touch_tag[top]), top / 1024 - 2);
	cr_assert_gt(resident_between(c->touch, &c->touch[top]), top / 512 - 2);
	chime_close(c);
	t_chimed_stop(&b1, SIGTERM);
}

/* The slots whose grant the shard says it tagged, each checked: how many. */
static unsigned tagged_slots(chime_t *c)
{
	struct chime_chan *ch = &c->chan[0];
	unsigned tagged = 0;

	for (uint32_t s = 0; s < c->sq_size; s++) {
		const struct chime_sqe *e = &ch->sq.slots[s];
		uint64_t g = at_load(&e->grant);

		if (chime_grant_is_marker(g) || !(at_load_acq(&e->grant_flags) & CHIME_GRANT_F_TAGGED))
			continue;
		tagged++;
		cr_assert_eq(at_load(&c->touch_tag[chime_id_index(g)]), chime_id_gen(g),
			     "slot %u: grant %#" PRIx64 " says tagged, its tag is %#x", s, g,
			     at_load(&c->touch_tag[chime_id_index(g)]));
	}
	return tagged;
}

/*
 * Where the shard has faulted the table in, it writes each grant's tag as
 * it hands the grant to a slot, and says so (CHIME_GRANT_F_TAGGED): the
 * ARM that takes the grant does not write it, so the tag must already
 * name the grant's generation. Checked on every slot of the ring after
 * bursts of arms (some flagged, or the path is not tested), then the
 * timers armed through flagged slots reset by their words alone.
 */
Test(touch, a_grant_the_shard_tagged_is_in_the_table_before_its_arm)
{
	enum { N = 16384, BURST = 1000 };
	struct t_chimed b1 = { 0 };
	uint64_t far = now_ns() + 3600000 * MS;
	static chime_id_t id[N];
	unsigned tagged = 0, pause = 3000;
	chime_t *c;

	c = one_shard_client(&b1);
	/*
	 * The shard idle between bursts (3 ms): it faults the table in then,
	 * on a thread of its own. A TSan broker on a loaded host (the CI) had
	 * tagged none after 3 ms pauses: the bursts again, with longer ones.
	 */
	for (int round = 0; round < 3 && tagged <= c->sq_size / 2; round++, pause *= 10) {
		for (unsigned i = 0; i < N; i += BURST) {
			applied(c);
			usleep(pause);
			for (unsigned j = i; j < i + BURST && j < N; j++)
				cr_assert_eq(chime_arm(c, 1, far, 0, j, &id[j]), 0);
		}
		applied(c);
		tagged = tagged_slots(c);
	}
	cr_assert_gt(tagged, c->sq_size / 2, "%u of %u slots' grants tagged by the shard (pauses up to %u ms)", tagged,
		     c->sq_size, pause / 10 / 1000);
	/* the last arms took grants the shard tagged: their first resets are records, the next words */
	for (unsigned j = N - BURST; j < N; j++) {
		cr_assert_eq(at_load(&c->touch_tag[chime_id_index(id[j])]), chime_id_gen(id[j]));
		cr_assert_eq(chime_reset(c, id[j], far + MS), 0);
	}
	applied(c);
	for (unsigned j = N - BURST; j < N; j++) {
		cr_assert_eq(at_load(&c->touch_tag[chime_id_index(id[j])]), chime_id_gen(id[j]) | CHIME_TOUCH_ON,
			     "timer %u not flagged by its first reset", j);
		cr_assert_eq(chime_reset(c, id[j], far + 2 * MS), 0);
		cr_assert_eq(at_load(word_of(c, id[j])), far + 2 * MS, "timer %u: its word not written", j);
	}
	chime_close(c);
	t_chimed_stop(&b1, SIGTERM);
}

/*
 * The table is allocated ahead of the arms (by the library, for itself:
 * the shard allocates none) only on a channel that has carried 4096
 * records: a client with a few timers holds the pages its tags are on and
 * no more, and one with many the windows of its timers, not the whole
 * table.
 */
Test(touch, a_client_with_few_timers_gets_no_table_faulted_in_ahead)
{
	uint64_t far = now_ns() + 3600000 * MS;
	chime_t *c = copen(0, NULL), *big = copen(0, NULL);
	chime_id_t id;
	unsigned in;

	cr_assert_not_null(c->touch_tag, "no touch table");
	for (unsigned j = 0; j < 100; j++)
		cr_assert_eq(chime_arm(c, 1, far, 0, j, &id), 0);
	applied(c);
	usleep(50000);  /* idle shards: time to fault in what they would */
	in = tag_pages_resident(c, 0, (uint64_t)c->touch_cap * c->nr_shards);
	/* its own tags (on at most 2 pages a shard) and the shards' first grants */
	cr_assert_leq(in, 2 * c->nr_shards, "%u pages of a 100-timer client's table are resident", in);
	/* and one with many timers gets its blocks, not the whole table */
	for (unsigned j = 0; j < 40000; j++)
		cr_assert_eq(chime_arm(big, 1, far, 0, j, &id), 0);
	applied(big);
	usleep(50000);
	in = tag_pages_resident(big, 0, (uint64_t)big->touch_cap * big->nr_shards);
	cr_assert_leq(in, (40000 + 2 * 16384 * big->nr_shards) / 1024 + 2 * big->nr_shards,
		      "%u pages of a 40000-timer client's table are resident", in);
	chime_close(c);
	chime_close(big);
}

/*
 * A wall-clock timer (chime_arm_realtime()) is listed as one: the broker's
 * answer to a timers query flags it, and chimectl says its clock in both
 * formats, whether it reads the segments (root, here) or asks.
 */
Test(touch, a_wall_clock_timer_is_listed_as_one)
{
	chime_t *c = copen(0, NULL);
	struct timespec wall;
	struct chime_query_timer recs[4];
	char args[128], filter[256], line[256];
	chime_id_t w, m;
	uint64_t n;
	unsigned seen = 0;

	clock_gettime(CLOCK_REALTIME, &wall);
	cr_assert_eq(chime_arm_realtime(c, 1, ((uint64_t)wall.tv_sec + 3600) * 1000000000u, 0, 1, &w), 0);
	cr_assert_eq(chime_arm(c, 2, now_ns() + 3600000 * MS, 0, 2, &m), 0);
	applied(c);

	n = query_timers(recs, 4);
	cr_assert_eq(n, 2);
	for (uint64_t i = 0; i < n; i++) {
		cr_assert(recs[i].id == w || recs[i].id == m);
		cr_assert_eq(recs[i].flags, recs[i].id == w ? CHIME_QUERY_TIMER_REALTIME : 0u,
			     "flags %#x of %s", recs[i].flags, recs[i].id == w ? "the wall-clock timer" : "the other");
		seen |= recs[i].id == w ? 1u : 2u;
	}
	cr_assert_eq(seen, 3u);

	snprintf(args, sizeof(args), "-j timers --client %d", (int)getpid());
	snprintf(filter, sizeof(filter), "jq -r '[.timers[] | \"\\(.key)=\\(.clock)\"] | sort | join(\" \")'");
	chimectl(line, sizeof(line), args, filter);
	cr_assert_str_eq(line, "1=realtime 2=monotonic");
	snprintf(args, sizeof(args), "timers --client %d", (int)getpid());
	snprintf(filter, sizeof(filter), "grep '^ *0x%" PRIx64 " '", w);
	chimectl(line, sizeof(line), args, filter);
	cr_assert(strstr(line, " wall"), "the text says the wall clock: '%s'", line);
	snprintf(filter, sizeof(filter), "grep '^ *0x%" PRIx64 " '", m);
	chimectl(line, sizeof(line), args, filter);
	cr_assert(strstr(line, " mono"), "'%s'", line);
	chime_close(c);
}
