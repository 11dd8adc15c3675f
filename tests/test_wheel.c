/* SPDX-License-Identifier: MIT */
/*
 * test_wheel.c - broker/wheel.c. The test names read as the wheel's spec.
 *
 * The core is a randomized differential test against a plain array of live
 * timers (the reference model): after every advance the wheel must agree with
 * the model on exactly which timers are due. CHIME_TEST_SCALE multiplies the
 * operation count (default 1: a few million operations); CHIME_STRESS=1
 * enables the wheel_stress suite (tests/meson.build runs it in suite
 * 'stress').
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "wheel.h"
#include "helpers.h"   /* after wheel.h: its wheel helpers */

#define NIL CHIME_NIL

/*
 * A check in a hot loop: formats only on failure, and always names the seed
 * (on stderr, just before the failure: standard C has no way to splice it
 * into a format whose arguments may be empty).
 */
#define MCHECK(seed, cond, ...)                                                        \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "test_wheel: seed %llu (replay: CHIME_TEST_SEED=%llu)\n", \
				(unsigned long long)(seed), (unsigned long long)(seed)); \
			cr_assert_fail(__VA_ARGS__);                                   \
		}                                                                      \
	} while (0)

struct tw {
	struct wheel wh;
	void *mem;
	size_t len;
};

static void tw_init(struct tw *t, uint32_t cap, uint64_t res, uint64_t now)
{
	t->len = wheel_region_size(cap);
	/* NORESERVE anonymous memory: untouched slab pages cost nothing */
	t->mem = mmap(NULL, t->len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	cr_assert(t->mem != MAP_FAILED, "mmap %zu bytes", t->len);
	cr_assert_eq(wheel_init(&t->wh, t->mem, t->len, cap, res, now), 0);
}

static void tw_fini(struct tw *t)
{
	wheel_fini(&t->wh);
	munmap(t->mem, t->len);
}

static double scale(void)
{
	const char *s = getenv("CHIME_TEST_SCALE");
	double v = s ? atof(s) : 1.0;

	return v > 0 ? v : 1.0;
}

static int stress_enabled(void)
{
	const char *s = getenv("CHIME_STRESS");

	return s && *s && *s != '0';
}

static uint32_t arm_new(struct tw *t, uint64_t deadline)
{
	uint32_t i = wheel_alloc(&t->wh);

	cr_assert_neq(i, NIL);
	wheel_arm(&t->wh, i, deadline);
	return i;
}

/* A timer of client slot `owner` (who may go ahead of a backlog depends on it). */
static uint32_t arm_owned(struct tw *t, uint64_t deadline, uint16_t owner)
{
	uint32_t i = wheel_alloc(&t->wh);

	cr_assert_neq(i, NIL);
	wheel_node(&t->wh, i)->owner = owner;
	wheel_arm(&t->wh, i, deadline);
	return i;
}

/* Pop everything due; returns the count, indices in out (if not NULL). */
static unsigned pop_all(struct tw *t, uint32_t *out, unsigned max)
{
	uint32_t buf[64];
	unsigned n, total = 0;

	while ((n = wheel_pop_expired(&t->wh, buf, 64)) > 0) {
		for (unsigned k = 0; k < n; k++) {
			if (out && total + k < max)
				out[total + k] = buf[k];
		}
		total += n;
	}
	return total;
}

/* An advance to now makes exactly timer i due, and it pops. */
static void fires_alone(struct tw *t, uint64_t now, uint32_t i)
{
	uint32_t got;

	cr_assert_eq(t_advance(&t->wh, now), 1, "advance to %llu", (unsigned long long)now);
	cr_assert_eq(wheel_pop_expired(&t->wh, &got, 1), 1);
	cr_assert_eq(got, i);
	cr_assert_eq(wheel_pop_expired(&t->wh, &got, 1), 0);
}

/* ------------------------------------------------------------------------ */
/* Contract edge cases                                                       */
/* ------------------------------------------------------------------------ */

Test(wheel, region_costs_at_most_64_bytes_per_timer_plus_a_constant)
{
	size_t cap = 10u * 1000 * 1000;
	size_t sz = wheel_region_size((uint32_t)cap);

	cr_assert_leq(sz, cap * sizeof(struct chime_node) + 4096,
		      "%zu bytes for %zu timers", sz, cap);
	cr_assert_eq(sizeof(struct chime_node), 64);
}

Test(wheel, init_touches_no_slab_page_until_nodes_are_allocated)
{
	struct tw t;
	unsigned char vec[64];
	size_t page = 4096;
	char *slab;

	tw_init(&t, 10u * 1000 * 1000, 1000000, 0);
	slab = (char *)t.mem + t.wh.w->slab_off;
	/* pages well inside the slab must not be resident after init */
	cr_assert_eq(mincore((void *)(((uintptr_t)slab + 1024 * page) & ~(page - 1)),
			     64 * page, vec), 0);
	for (unsigned i = 0; i < 64; i++)
		cr_assert_eq(vec[i] & 1, 0, "slab page %u resident after init", i);
	tw_fini(&t);
}

Test(wheel, init_rejects_bad_arguments)
{
	struct wheel wh;
	size_t len = wheel_region_size(16);
	void *mem = aligned_alloc(64, len + 64);

	cr_assert_eq(wheel_init(&wh, mem, len, 16, 0, 0), -EINVAL);
	cr_assert_eq(wheel_init(&wh, mem, len - 1, 16, 1000, 0), -EINVAL);
	cr_assert_eq(wheel_init(&wh, mem, len, 0, 1000, 0), -EINVAL);
	cr_assert_eq(wheel_init(&wh, (char *)mem + 8, len, 16, 1000, 0), -EINVAL);
	cr_assert_eq(wheel_init(&wh, mem, len, 16, 1000, 0), 0);
	wheel_fini(&wh);
	free(mem);
}

Test(wheel, never_fires_early_and_fires_exactly_at_the_deadline)
{
	struct tw t;
	uint64_t res = 1000000, base = 5 * res + 123;
	uint64_t offs[] = { 1, 2, res - 1, res, res + 1, 63 * res, 64 * res, 4097 * res + 17 };

	tw_init(&t, 64, res, base);
	for (unsigned k = 0; k < sizeof(offs) / sizeof(offs[0]); k++) {
		uint64_t d = base + offs[k] * 3;
		uint32_t i = arm_new(&t, d), got;

		cr_assert_eq(t_advance(&t.wh, d - 1), 0, "fired 1 ns early (offset %llu)",
			     (unsigned long long)offs[k]);
		cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 0);
		cr_assert_eq(t_advance(&t.wh, d), 1, "not due at its deadline");
		cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1);
		cr_assert_eq(got, i);
		cr_assert_eq(wheel_node(&t.wh, i)->state, CHIME_NODE_ALLOC);
		wheel_free(&t.wh, i);
		base = d;
		wheel_check(&t.wh);
	}
	tw_fini(&t);
}

/*
 * A million timers due at one instant take a shard tens of milliseconds to
 * deliver, and every timer due after them waited behind the rest of them:
 * one client's burst made everyone's timers late. Timers made due for a
 * later tick go ahead of a backlog of WHEEL_JUMP_BACKLOG or more (at most
 * WHEEL_JUMP_MAX an advance, in the order they became due), if their owner
 * has fewer than WHEEL_JUMP_OWNER due. The burst is owner 1's.
 */
Test(wheel, timers_due_after_a_backlog_go_ahead_of_it)
{
	const uint64_t res = 100000, D = 1000 * res, MS = 1000000;  /* 100 us ticks */
	uint32_t v, w, x, y, z, own, got[4096], n;
	struct tw t;

	tw_init(&t, 65536, res, 0);
	for (unsigned k = 0; k < 5000; k++)
		arm_owned(&t, D, 1);
	v = arm_owned(&t, D + res + res / 2, 2);        /* a tick later, in the burst's advance: ahead of it */
	own = arm_owned(&t, D + res + res / 2, 1);      /* the burst's owner's: behind its own burst */
	w = arm_owned(&t, D + MS / 2, 2);
	x = arm_owned(&t, D + 2 * MS, 3);               /* whole slots, node by node behind a backlog */
	y = arm_owned(&t, D + 2 * MS + 5 * res, 2);     /* and the current tick's */
	z = arm_owned(&t, D + 2 * MS + 5 * res + 1, 3);
	cr_assert_eq(t_advance(&t.wh, D + res + res / 2), 5002);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 100), 100);
	cr_assert_eq(got[0], v, "popped %u, not v %u, due a tick after the burst", got[0], v);
	cr_assert_eq(wheel_node(&t.wh, got[1])->deadline_ns, D);
	cr_assert_eq(t_advance(&t.wh, D + MS / 2), 1);
	cr_assert_eq(t_advance(&t.wh, D + 2 * MS + 5 * res), 2);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 2);
	cr_assert(got[0] == w && got[1] == x, "popped %u %u, not the timers due after the backlog %u %u",
		  got[0], got[1], w, x);
	cr_assert_eq(t_advance(&t.wh, D + 2 * MS + 5 * res + 1), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 2);
	cr_assert(got[0] == y && got[1] == z, "popped %u %u, not y %u and z %u", got[0], got[1], y, z);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4096), 4096);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4096), 4902 - 4096);
	cr_assert_eq(got[4902 - 4096 - 1], own, "the burst's owner's later timer went ahead of its burst");
	wheel_check(&t.wh);

	/* Fewer than WHEEL_JUMP_BACKLOG waiting is no backlog: what comes due after them waits its turn. */
	for (unsigned k = 0; k < 3000; k++)
		arm_owned(&t, D + 5 * MS, 1);
	x = arm_owned(&t, D + 6 * MS, 2);
	cr_assert_eq(t_advance(&t.wh, D + 5 * MS), 3000);
	cr_assert_eq(t_advance(&t.wh, D + 6 * MS), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4096), 3001);
	cr_assert_eq(got[3000], x, "x went ahead of 3000");

	/*
	 * A second burst behind a first, of 12 owners with 250 each (fewer
	 * than WHEEL_JUMP_OWNER): at most WHEEL_JUMP_MAX go ahead.
	 */
	for (unsigned k = 0; k < 6000; k++)
		arm_owned(&t, D + 10 * MS, 1);
	for (unsigned k = 0; k < 3000; k++)
		arm_owned(&t, D + 12 * MS + 5 * res + 1, (uint16_t)(2 + k % 12));
	cr_assert_eq(t_advance(&t.wh, D + 10 * MS), 6000);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 10), 10);
	cr_assert_eq(t_advance(&t.wh, D + 12 * MS + 5 * res + 1), 3000);
	wheel_check(&t.wh);
	n = wheel_pop_expired(&t.wh, got, 4096);
	cr_assert_eq(n, 4096);
	for (unsigned k = 0; k < n; k++)
		if (wheel_node(&t.wh, got[k])->deadline_ns == D + 10 * MS) {
			cr_assert_eq(k, WHEEL_JUMP_MAX, "%u of the second burst went ahead of the first", k);
			break;
		}
	pop_all(&t, NULL, 0);

	/*
	 * One owner's 300 behind another's backlog: WHEEL_JUMP_OWNER go
	 * ahead, the rest wait; and as the backlog's owner's count falls below
	 * it, that owner's timers go ahead again.
	 */
	for (unsigned k = 0; k < 6000; k++)
		arm_owned(&t, D + 20 * MS, 1);
	for (unsigned k = 0; k < 300; k++)
		arm_owned(&t, D + 21 * MS, 2);
	cr_assert_eq(t_advance(&t.wh, D + 20 * MS), 6000);
	cr_assert_eq(t_advance(&t.wh, D + 21 * MS), 300);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4096), 4096);
	for (unsigned k = 0; k < 4096; k++)
		cr_assert_eq(wheel_node(&t.wh, got[k])->owner, k < WHEEL_JUMP_OWNER ? 2 : 1,
			     "popped #%u: owner %u", k, wheel_node(&t.wh, got[k])->owner);
	pop_all(&t, NULL, 0);
	for (unsigned k = 0; k < 6000; k++)
		arm_owned(&t, D + 30 * MS, 1);
	cr_assert_eq(t_advance(&t.wh, D + 30 * MS), 6000);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4096 - 64), 4096 - 64);   /* owner 1 has 2064 due */
	x = arm_owned(&t, D + 31 * MS, 1);
	cr_assert_eq(t_advance(&t.wh, D + 31 * MS), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 1), 1);
	cr_assert_neq(got[0], x, "owner 1, 2064 due, went ahead");
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2064 - WHEEL_JUMP_OWNER), 2064 - WHEEL_JUMP_OWNER);
	for (unsigned k = 0; k < 4096; k++)     /* another owner's backlog, behind which owner 1 has 255 */
		arm_owned(&t, D + 32 * MS, 3);
	y = arm_owned(&t, D + 33 * MS, 1);
	cr_assert_eq(t_advance(&t.wh, D + 32 * MS), 4096);
	cr_assert_eq(t_advance(&t.wh, D + 33 * MS), 1);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 1), 1);
	cr_assert_eq(got[0], y, "owner 1, %u due, did not go ahead of owner 3's backlog", WHEEL_JUMP_OWNER - 1);
	tw_fini(&t);
}

/*
 * Many clients of one user, each with fewer than WHEEL_JUMP_OWNER due,
 * took every place an advance had ahead of a backlog, and another user's
 * timer due after theirs waited behind it all. A group (the shard's: a
 * user) holds at most WHEEL_JUMP_GROUP places there.
 */
Test(wheel, one_groups_owners_take_at_most_its_share_of_the_places_ahead)
{
	const uint64_t res = 100000, D = 1000 * res, MS = 1000000;
	static uint16_t group_of[65536];
	uint32_t v, got[4096];
	unsigned ahead = 0, victim_at = 0;
	struct tw t;

	for (unsigned o = 10; o < 20; o++)
		group_of[o] = 1;                /* ten clients of one user */
	group_of[30] = 2;                       /* and another user's */
	tw_init(&t, 65536, res, 0);
	wheel_group_owners(&t.wh, group_of);
	for (unsigned k = 0; k < 6000; k++)
		arm_owned(&t, D, 1);
	cr_assert_eq(t_advance(&t.wh, D), 6000);
	for (unsigned k = 0; k < 2000; k++)     /* 200 each: under WHEEL_JUMP_OWNER */
		arm_owned(&t, D + 2 * MS, (uint16_t)(10 + k % 10));
	v = arm_owned(&t, D + 2 * MS + res, 30);
	cr_assert_eq(t_advance(&t.wh, D + 3 * MS), 2001);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4096), 4096);
	for (unsigned k = 0; k < 4096; k++) {
		uint16_t o = wheel_node(&t.wh, got[k])->owner;

		if (got[k] == v)
			victim_at = k;
		else if (o != 1 && !victim_at)
			ahead++;
	}
	cr_assert_eq(ahead, WHEEL_JUMP_GROUP, "%u of one user's timers went ahead of the backlog", ahead);
	cr_assert_eq(victim_at, WHEEL_JUMP_GROUP, "another user's timer came %u-th", victim_at);
	/* Popped, the front's places are the group's again. */
	pop_all(&t, NULL, 0);
	for (unsigned k = 0; k < 6000; k++)
		arm_owned(&t, D + 10 * MS, 1);
	for (unsigned k = 0; k < 10; k++)
		arm_owned(&t, D + 12 * MS, (uint16_t)(10 + k));
	cr_assert_eq(t_advance(&t.wh, D + 10 * MS), 6000);
	cr_assert_eq(t_advance(&t.wh, D + 12 * MS), 10);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 10), 10);
	for (unsigned k = 0; k < 10; k++)
		cr_assert_neq(wheel_node(&t.wh, got[k])->owner, 1, "#%u: the group's timer stayed behind", k);
	tw_fini(&t);
}

/*
 * Free nodes went back on a LIFO list, so after a while of arms, resets
 * and cancels in any order, timers armed together lay anywhere in the
 * slab, and an advance and the pops of a million of them due at once
 * walked it in random order: 20-30 times as long as on a fresh wheel
 * (about 300 ns a timer against 10, cache and TLB misses). The lowest
 * free node is handed out first.
 */
Test(wheel, a_node_freed_anywhere_is_handed_out_lowest_first)
{
	const uint32_t n = 100000;
	uint64_t rng = 7;
	uint32_t *idx = malloc(n * sizeof(*idx));
	bool *freed = calloc(n, sizeof(*freed));
	struct tw t;

	cr_assert(idx && freed);
	tw_init(&t, 2 * n, 1000, 0);
	for (uint32_t i = 0; i < n; i++)
		cr_assert_eq(idx[i] = arm_new(&t, 1000 + splitmix64(&rng) % 1000000000), i);
	for (uint32_t i = n - 1; i > 0; i--) {          /* a random order */
		uint32_t j = (uint32_t)(splitmix64(&rng) % (i + 1)), x = idx[i];

		idx[i] = idx[j];
		idx[j] = x;
	}
	for (uint32_t i = 0; i < n / 2; i++) {
		wheel_free(&t.wh, idx[i]);
		freed[idx[i]] = true;
	}
	wheel_check(&t.wh);
	for (uint32_t want = 0, k = 0; k < n / 2; k++, want++) {
		while (!freed[want])
			want++;
		cr_assert_eq(wheel_alloc(&t.wh), want, "allocation %u after frees in random order", k);
	}
	cr_assert_eq(wheel_alloc(&t.wh), n, "none free below the high-water mark: the next node");
	wheel_check(&t.wh);
	free(freed);
	free(idx);
	tw_fini(&t);
}

/*
 * The free nodes at the slab's top given back (wheel_shrink()): whatever
 * the order the nodes were freed in, the slab's end is one past the
 * highest in use, the shrunk map passes wheel_check(), and nodes are
 * handed out lowest first below the end and grown into again beyond it.
 */
Test(wheel, the_free_top_of_the_slab_is_given_back_and_grown_into_again)
{
	const uint32_t n = 70000;       /* more than a word of every level of the free map */
	uint64_t rng = 11;
	uint32_t *idx = malloc(n * sizeof(*idx)), keep[3] = { 5, 4097, 40000 };
	struct tw t;

	cr_assert(idx);
	tw_init(&t, 2 * n, 1000, 0);
	for (uint32_t i = 0; i < n; i++)
		idx[i] = arm_new(&t, 1000 + splitmix64(&rng) % 1000000000);
	cr_assert_eq(wheel_slab_end(&t.wh), n, "every node in use");
	for (uint32_t i = n - 1; i > 0; i--) {          /* freed in a random order */
		uint32_t j = (uint32_t)(splitmix64(&rng) % (i + 1)), x = idx[i];

		idx[i] = idx[j];
		idx[j] = x;
	}
	for (uint32_t i = 0; i < n; i++)
		if (idx[i] != keep[0] && idx[i] != keep[1] && idx[i] != keep[2])
			wheel_free(&t.wh, idx[i]);
	cr_assert_eq(wheel_slab_end(&t.wh), keep[2] + 1, "one past the highest node in use");
	wheel_shrink(&t.wh, keep[2] + 1);
	cr_assert_eq(t.wh.w->high_water, keep[2] + 1);
	wheel_check(&t.wh);
	wheel_free(&t.wh, keep[2]);
	cr_assert_eq(wheel_slab_end(&t.wh), keep[1] + 1);
	wheel_shrink(&t.wh, keep[1] + 1);
	wheel_check(&t.wh);
	/* below the end the free nodes first, lowest first; then new ones from the end up */
	for (uint32_t want = 0; want <= keep[1] + 2; want++) {
		if (want == keep[0] || want == keep[1])
			continue;
		cr_assert_eq(wheel_alloc(&t.wh), want, "after the shrink, allocation of node %u", want);
	}
	cr_assert_eq(t.wh.w->high_water, keep[1] + 3);
	wheel_check(&t.wh);
	/* nothing in use above node 0 after all: down to one node, then none */
	for (uint32_t i = 1; i <= keep[1] + 2; i++)
		wheel_free(&t.wh, i);
	cr_assert_eq(wheel_slab_end(&t.wh), 1);
	wheel_free(&t.wh, 0);
	cr_assert_eq(wheel_slab_end(&t.wh), 0);
	wheel_shrink(&t.wh, 0);
	cr_assert_eq(t.wh.w->high_water, 0);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_alloc(&t.wh), 0, "an empty slab grows from its start");
	wheel_check(&t.wh);
	free(idx);
	tw_fini(&t);
}

Test(wheel, only_the_due_part_of_the_current_tick_fires)
{
	struct tw t;
	uint64_t res = 1000;
	uint32_t a, b, got[2];

	tw_init(&t, 8, res, 0);
	a = arm_new(&t, 10 * res + 100);
	b = arm_new(&t, 10 * res + 900);
	cr_assert_eq(t_advance(&t.wh, 10 * res + 500), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 1);
	cr_assert_eq(got[0], a);
	wheel_check(&t.wh);
	/* inside the same tick, below the rest's minimum: nothing */
	cr_assert_eq(t_advance(&t.wh, 10 * res + 899), 0);
	cr_assert_eq(t_advance(&t.wh, 10 * res + 900), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 1);
	cr_assert_eq(got[0], b);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, past_deadline_is_due_at_the_next_advance)
{
	struct tw t;
	uint32_t i, got;

	tw_init(&t, 8, 1000, 1000000);
	i = arm_new(&t, 5);
	cr_assert_eq(wheel_node(&t.wh, i)->state, CHIME_NODE_EXPIRED);
	cr_assert_leq(wheel_next_deadline(&t.wh), 1000000);
	/* armed in the past: not poppable before the next advance */
	cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 0);
	cr_assert_eq(t_advance(&t.wh, 1000000), 1, "same now still makes it due");
	cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1);
	cr_assert_eq(got, i);
	wheel_check(&t.wh);
	tw_fini(&t);
}

/*
 * A level-0 slot all due goes over whole, unwalked (wheel.c, "raw"): its
 * timers stay ARMED until popped. Cancelling one at either end of that
 * list or inside it, resetting one later (not due any more) or earlier
 * (due at the next advance, as an EXPIRED one would be), and a later
 * advance with more due behind them must all behave as for due timers:
 * the rest pop first, in the order they became due.
 */
Test(wheel, a_tick_made_due_whole_cancels_resets_and_pops_like_due_timers)
{
	const uint64_t res = 1000, D = 50 * res + 7;
	uint32_t a[8], b, got[8];
	struct tw t;

	tw_init(&t, 64, res, 0);
	for (unsigned k = 0; k < 8; k++)
		a[k] = arm_new(&t, D);
	cr_assert_eq(t_advance(&t.wh, D - 1), 0);
	cr_assert_eq(t_advance(&t.wh, D), 8, "the whole tick, inside it");
	for (unsigned k = 0; k < 8; k++)
		cr_assert(wheel_node_due(&t.wh, a[k]), "timer %u not due", k);
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, a[0]);      /* pushed first: the list's last */
	wheel_cancel(&t.wh, a[7]);      /* and its first */
	wheel_cancel(&t.wh, a[3]);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_due(&t.wh), 5);
	wheel_reset(&t.wh, a[1], D + 100 * res);
	cr_assert(!wheel_node_due(&t.wh, a[1]), "reset later, still due");
	wheel_reset(&t.wh, a[2], D - 5);
	cr_assert(wheel_node_due(&t.wh, a[2]));
	wheel_check(&t.wh);
	cr_assert_eq(wheel_due(&t.wh), 3, "a past deadline set since waits for the next advance");
	b = arm_new(&t, D + 2 * res);
	cr_assert_eq(t_advance(&t.wh, D + 3 * res), 2);
	wheel_check(&t.wh);
	cr_assert_eq(pop_all(&t, got, 8), 5);
	for (unsigned k = 0; k < 3; k++)
		cr_assert(got[k] == a[4] || got[k] == a[5] || got[k] == a[6], "popped #%u: %u", k, got[k]);
	cr_assert(got[3] == a[2] && got[4] == b, "then %u and %u, not %u and %u", got[3], got[4], a[2], b);
	cr_assert_eq(t_advance(&t.wh, D + 100 * res - 1), 0);
	fires_alone(&t, D + 100 * res, a[1]);
	cr_assert_eq(wheel_armed(&t.wh), 0);
	wheel_check(&t.wh);
	tw_fini(&t);
}

/*
 * A later deadline stored in place on level 0 (a lazy reset) leaves the
 * node in its old tick's slot: that slot must then be walked when its
 * tick comes due, not taken whole, or the node would pop early.
 */
Test(wheel, a_level0_timer_reset_later_in_place_does_not_go_with_its_old_tick)
{
	const uint64_t res = 1000, D = 50 * res + 7, E = 60 * res + 3;
	uint32_t a, b, c, d;
	struct tw t;

	tw_init(&t, 16, res, 0);
	a = arm_new(&t, D);
	b = arm_new(&t, D);
	wheel_reset(&t.wh, b, D + 200 * res);
	c = arm_new(&t, E);
	d = arm_new(&t, E);
	wheel_reset(&t.wh, d, E + 1);   /* same tick, later */
	wheel_check(&t.wh);
	fires_alone(&t, D + res, a);    /* a whole tick */
	cr_assert(!wheel_node_due(&t.wh, b), "reset later, due with its old tick");
	fires_alone(&t, E, c);          /* inside the tick */
	cr_assert(!wheel_node_due(&t.wh, d));
	fires_alone(&t, E + 1, d);
	cr_assert_eq(t_advance(&t.wh, D + 200 * res - 1), 0);
	fires_alone(&t, D + 200 * res, b);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, deadline_zero_and_near_uint64_max_work)
{
	struct tw t;
	uint32_t z, m1, m, got[2];

	tw_init(&t, 8, 1000, 0);
	z = arm_new(&t, 0);
	m1 = arm_new(&t, UINT64_MAX - 1);
	m = arm_new(&t, UINT64_MAX);
	cr_assert_eq(t_advance(&t.wh, 0), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 1);
	cr_assert_eq(got[0], z);
	cr_assert_eq(t_advance(&t.wh, UINT64_MAX - 2), 0);
	wheel_check(&t.wh);
	cr_assert_eq(t_advance(&t.wh, UINT64_MAX - 1), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 1);
	cr_assert_eq(got[0], m1);
	cr_assert_eq(wheel_next_deadline(&t.wh), UINT64_MAX);
	cr_assert_eq(t_advance(&t.wh, UINT64_MAX), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 1);
	cr_assert_eq(got[0], m);
	cr_assert_eq(wheel_armed(&t.wh), 0);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, far_future_deadlines_fire_on_time_after_a_long_sleep)
{
	struct tw t;
	uint64_t res = 1, now = 1000;
	uint64_t far[] = { UINT64_C(1) << 40, (UINT64_C(1) << 52) + 3, (UINT64_C(1) << 63) + 12345,
			   UINT64_MAX - 7 };
	uint32_t got;

	tw_init(&t, 8, res, now);
	for (unsigned k = 0; k < 4; k++) {
		uint32_t i = arm_new(&t, far[k]);

		/* one jump to just before: cost independent of the 2^40+ ticks elapsed */
		cr_assert_eq(t_advance(&t.wh, far[k] - 1), 0);
		wheel_check(&t.wh);
		cr_assert_eq(wheel_next_deadline(&t.wh), far[k]);
		cr_assert_eq(t_advance(&t.wh, far[k]), 1);
		cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1);
		cr_assert_eq(got, i);
		wheel_free(&t.wh, i);
	}
	tw_fini(&t);
}

Test(wheel, one_advance_pops_in_deadline_tick_order)
{
	struct tw t;
	uint64_t res = 1000, seed = 7;
	uint32_t out[4096];
	unsigned n;

	tw_init(&t, 4096, res, 0);
	for (unsigned k = 0; k < 4096; k++)
		arm_new(&t, 1 + splitmix64(&seed) % (UINT64_C(1) << 36));
	cr_assert_eq(t_advance(&t.wh, UINT64_C(1) << 36), 4096);
	n = pop_all(&t, out, 4096);
	cr_assert_eq(n, 4096);
	for (unsigned k = 1; k < n; k++)
		cr_assert_leq(wheel_node(&t.wh, out[k - 1])->deadline_ns / res,
			      wheel_node(&t.wh, out[k])->deadline_ns / res, "out of tick order at %u", k);
	tw_fini(&t);
}

Test(wheel, reset_of_an_expired_unpopped_timer_moves_it_back_to_the_wheel)
{
	struct tw t;
	uint32_t i, got;

	tw_init(&t, 8, 1000, 0);
	i = arm_new(&t, 5000);
	cr_assert_eq(t_advance(&t.wh, 6000), 1);
	cr_assert(wheel_node_due(&t.wh, i));
	wheel_reset(&t.wh, i, 100000);
	cr_assert_eq(wheel_node(&t.wh, i)->state, CHIME_NODE_ARMED);
	cr_assert(!wheel_node_due(&t.wh, i));
	cr_assert_eq(wheel_armed(&t.wh), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 0);
	wheel_check(&t.wh);
	cr_assert_eq(t_advance(&t.wh, 99999), 0);
	cr_assert_eq(t_advance(&t.wh, 100000), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1);
	cr_assert_eq(got, i);
	tw_fini(&t);
}

/*
 * Lazy reset: a reset to a later deadline only stores it; the node stays in
 * its slot until that slot is processed. Cancelling it there (as the first,
 * last, only or a middle node of its list), resetting it again (later or
 * earlier) and advancing must behave as if it had moved.
 */
Test(wheel, lazily_reset_timers_cancel_from_any_list_position)
{
	uint64_t res = 1000, now = 0;
	struct tw t;
	uint32_t a, b, c, solo, got[4];

	tw_init(&t, 16, res, now);
	/* three timers in one level-1 slot (ticks 100..127 share digit 1), one alone */
	a = arm_new(&t, 100 * res + 1);
	b = arm_new(&t, 101 * res + 1);
	c = arm_new(&t, 102 * res + 1);
	solo = arm_new(&t, 200 * res + 1);
	/* move every one far later: none moves, each stays cancellable */
	wheel_reset(&t.wh, a, 5000 * res);
	wheel_reset(&t.wh, b, 900000 * res);
	wheel_reset(&t.wh, c, 70 * 64 * res);
	wheel_reset(&t.wh, solo, 64 * 64 * 64 * res + 5);
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, c);        /* head of its list (arms push at the head) */
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, solo);     /* alone in its slot: the slot empties */
	wheel_check(&t.wh);
	cr_assert_eq(wheel_armed(&t.wh), 2);
	/* reset earlier than the lazily stored deadline: a real move */
	wheel_reset(&t.wh, b, 3000 * res);
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, a);        /* now alone where it was armed */
	wheel_check(&t.wh);
	cr_assert_eq(wheel_armed(&t.wh), 1);
	cr_assert_eq(t_advance(&t.wh, 3000 * res - 1), 0);
	wheel_check(&t.wh);
	cr_assert_eq(t_advance(&t.wh, 3000 * res), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 4), 1);
	cr_assert_eq(got[0], b);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, a_timer_reset_later_many_times_fires_once_at_its_last_deadline)
{
	uint64_t res = 1000000, now = 1000 * res, d = 0;
	struct tw t;
	uint32_t i, got;

	tw_init(&t, 4, res, now);
	i = arm_new(&t, now + 1000 * res);
	/* a keepalive: touched every 10 ms for 30 s, 1 s timeout, across many slots */
	for (unsigned k = 0; k < 3000; k++) {
		now += 10 * res;
		d = now + 1000 * res + k % 7;
		wheel_reset(&t.wh, i, d);
		cr_assert_eq(t_advance(&t.wh, now), 0, "touch %u: fired early", k);
		cr_assert_eq(wheel_node(&t.wh, i)->state, CHIME_NODE_ARMED);
		if (k % 97 == 0)
			wheel_check(&t.wh);
	}
	cr_assert_eq(t_advance(&t.wh, d - 1), 0);
	cr_assert_eq(t_advance(&t.wh, d), 1);
	cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1);
	cr_assert_eq(got, i);
	wheel_check(&t.wh);
	tw_fini(&t);
}

/*
 * Many timers, mostly reset later (left in place), sometimes earlier or
 * cancelled; advance by small and large steps, sometimes to
 * wheel_next_deadline(): after each advance a timer is due iff its deadline
 * is <= now, the next deadline is within one unit of the earliest (and makes
 * progress) and wheel_earliest() is exact.
 */
/*
 * A model of 256 timers under random resets (mostly later: lazy), cancels
 * and advances; with `stage`, wheel_stage() in small random steps between
 * them, as an idle shard calls it. The wheel must match the model at every
 * advance: never early, exact, earliest() and next_deadline() right; and
 * when wheel_stage_at() says now, there is something to stage.
 * 24 seeds; 2000 in the stress suite.
 */
static void lazy_reset_model(bool stage)
{
	uint64_t seeds = stress_enabled() ? 2000 : 24;

	for (uint64_t seed = 1; seed <= seeds; seed++) {
		uint64_t rng = seed * UINT64_C(0x9e3779b97f4a7c15), res = seed % 3 ? 1000 : 999983;
		uint64_t now = seed % 2 ? 0 : UINT64_C(1) << 40, dl[256];
		uint32_t n = 256, idx[256];
		int armed[256];
		struct tw t;

		tw_init(&t, n, res, now);
		t.wh.stage_wake_min = 0;        /* wheel_stage_at() for these 256 too */
		for (uint32_t k = 0; k < n; k++) {
			dl[k] = now + 1 + splitmix64(&rng) % (5000 * res);
			idx[k] = arm_new(&t, dl[k]);
			armed[k] = 1;
		}
		for (unsigned op = 0; op < 20000; op++) {
			uint64_t r = splitmix64(&rng);
			uint32_t k = (uint32_t)(r >> 40) % n;

			if (r % 16 < 9) {                       /* later: the keepalive case */
				if (armed[k]) {
					dl[k] += 1 + (r >> 8) % (r % 3 ? 100 * res : 200000 * res);
				} else {
					dl[k] = now + 1 + (r >> 8) % (3000 * res);
					armed[k] = 1;
				}
				wheel_reset(&t.wh, idx[k], dl[k]);
			} else if (r % 16 < 11) {               /* earlier (or re-arm) */
				dl[k] = now + 1 + (r >> 8) % (64 * res);
				armed[k] = 1;
				wheel_reset(&t.wh, idx[k], dl[k]);
			} else if (r % 16 < 12) {               /* cancel */
				wheel_cancel(&t.wh, idx[k]);
				armed[k] = 0;
			} else if (stage && r % 16 < 14) {      /* part of the next cascade, early */
				/* a wake-up to stage finds something to stage: a shard never wakes for nothing */
				uint64_t at = wheel_stage_at(&t.wh);
				unsigned budget = (unsigned)(r >> 32) % 9, moved = wheel_stage(&t.wh, budget);

				MCHECK(seed, at > t.wh.w->now_ns || moved > 0 || budget == 0,
				       "op %u: stage_at %llu, now %llu, but nothing staged", op,
				       (unsigned long long)at, (unsigned long long)t.wh.w->now_ns);
			} else {                                /* advance */
				uint64_t want, nd, min = UINT64_MAX, e;
				int inexact;

				switch (r % 5) {
				case 0: want = wheel_next_deadline(&t.wh); break;
				case 1: want = now + (r >> 8) % (100 * res); break;
				default: want = now + (r >> 8) % (3 * res); break;
				}
				if (want > now)
					now = want;
				wheel_advance(&t.wh, now);
				for (uint32_t j = 0; j < n; j++) {
					struct chime_node *x = wheel_node(&t.wh, idx[j]);

					if (!armed[j])
						continue;
					MCHECK(seed, x->deadline_ns == dl[j], "deadline changed");
					if (dl[j] <= now) {
						MCHECK(seed, wheel_node_due(&t.wh, idx[j]),
						       "op %u: deadline %llu <= now %llu not due", op,
						       (unsigned long long)dl[j], (unsigned long long)now);
						armed[j] = 0;
					} else {
						MCHECK(seed, x->state == CHIME_NODE_ARMED && !wheel_node_due(&t.wh, idx[j]),
						       "op %u: deadline %llu > now %llu fired early", op,
						       (unsigned long long)dl[j], (unsigned long long)now);
						if (dl[j] < min)
							min = dl[j];
					}
				}
				e = wheel_earliest(&t.wh, n, &inexact);
				MCHECK(seed, !inexact, "earliest inexact with max_scan = n");
				pop_all(&t, NULL, 0);
				e = wheel_earliest(&t.wh, n, &inexact);
				MCHECK(seed, e == min && !inexact, "earliest %llu, true minimum %llu",
				       (unsigned long long)e, (unsigned long long)min);
				nd = wheel_next_deadline(&t.wh);
				MCHECK(seed, min == UINT64_MAX ? nd == UINT64_MAX
							       : nd > now && (nd <= min || nd - min < res),
				       "next deadline %llu, now %llu, earliest %llu",
				       (unsigned long long)nd, (unsigned long long)now,
				       (unsigned long long)min);
				e = wheel_earliest(&t.wh, 1, &inexact);
				MCHECK(seed, e <= min, "a cut-short earliest %llu above the minimum %llu",
				       (unsigned long long)e, (unsigned long long)min);
			}
			if (op % 256 == 0)
				wheel_check(&t.wh);
		}
		wheel_check(&t.wh);
		tw_fini(&t);
	}
}

Test(wheel, lazily_reset_timers_never_fire_early_and_always_on_time)
{
	lazy_reset_model(false);
}

Test(wheel, staging_cascades_ahead_changes_no_timer)
{
	lazy_reset_model(true);
}

/*
 * wheel_cancel() leaves a cancelled node's next/prev stale (one store fewer
 * per cancel). Whatever the caller does with it at once, nothing may follow
 * those links: cancel it again (a no-op), arm it, reset it, free it and
 * allocate it again, rebuild; its old neighbours still fire on time.
 */
Test(wheel, a_cancelled_node_is_reusable_at_once_despite_its_stale_links)
{
	uint64_t res = 1000;
	struct tw t;
	uint32_t id[6], got[8], cp;
	void *copy;
	struct wheel b;

	tw_init(&t, 16, res, 0);
	/* six timers in one level-1 slot: ticks 64..127 */
	for (unsigned k = 0; k < 6; k++)
		id[k] = arm_new(&t, (70 + k) * res);
	wheel_cancel(&t.wh, id[2]);             /* inside the list: the inline path */
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, id[2]);             /* ALLOC: a no-op, its links not followed */
	wheel_check(&t.wh);
	cr_assert_eq(wheel_node(&t.wh, id[2])->state, CHIME_NODE_ALLOC);
	cr_assert_eq(wheel_armed(&t.wh), 5);
	wheel_arm(&t.wh, id[2], 300 * res);     /* armed again at once, elsewhere */
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, id[3]);
	wheel_reset(&t.wh, id[3], 72 * res);    /* reset of a node on no list: an arm */
	wheel_check(&t.wh);
	wheel_cancel(&t.wh, id[4]);
	wheel_free(&t.wh, id[4]);               /* freed at once, its links stale */
	wheel_check(&t.wh);
	cr_assert_eq(wheel_alloc(&t.wh), id[4]);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_armed(&t.wh), 5);
	/* a rebuild of this state must not follow id[4]'s stale links either */
	copy = mmap(NULL, t.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert(copy != MAP_FAILED);
	memcpy(copy, t.mem, t.len);
	cr_assert_eq(wheel_rebuild(&b, copy, t.len, 16, res, 0, NULL), 0);
	wheel_check(&b);
	cr_assert_eq(wheel_armed(&b), 5);
	wheel_fini(&b);
	munmap(copy, t.len);
	/* the old neighbours and the moved ones fire once each, in tick order */
	cr_assert_eq(t_advance(&t.wh, 72 * res), 3);   /* id[0], id[1], id[3] */
	cp = (uint32_t)pop_all(&t, got, 8);
	cr_assert_eq(cp, 3);
	cr_assert_eq(got[0], id[0]);
	cr_assert_eq(got[2], id[3]);
	wheel_check(&t.wh);
	cr_assert_eq(t_advance(&t.wh, 299 * res), 1);   /* id[5] */
	cr_assert_eq(pop_all(&t, got, 8), 1);
	cr_assert_eq(got[0], id[5]);
	cr_assert_eq(t_advance(&t.wh, 300 * res), 1);   /* id[2] */
	cr_assert_eq(pop_all(&t, got, 8), 1);
	cr_assert_eq(got[0], id[2]);
	cr_assert_eq(wheel_armed(&t.wh), 0);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, cancel_of_an_expired_unpopped_timer_drops_it)
{
	struct tw t;
	uint32_t i, j, got[2];

	tw_init(&t, 8, 1000, 0);
	i = arm_new(&t, 5000);
	j = arm_new(&t, 5001);
	cr_assert_eq(t_advance(&t.wh, 6000), 2);
	wheel_cancel(&t.wh, i);
	cr_assert_eq(wheel_node(&t.wh, i)->state, CHIME_NODE_ALLOC);
	cr_assert_eq(wheel_armed(&t.wh), 1);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_pop_expired(&t.wh, got, 2), 1);
	cr_assert_eq(got[0], j);
	/* a second cancel is a no-op */
	wheel_cancel(&t.wh, i);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, periodic_timer_does_not_drift_over_many_periods)
{
	struct tw t;
	uint64_t res = 1000000, period = 999983, d0 = 5000017, now = 0, seed = 3;
	uint32_t i, got;

	tw_init(&t, 8, res, 0);
	i = wheel_alloc(&t.wh);
	wheel_node(&t.wh, i)->period_ns = period;
	wheel_arm(&t.wh, i, d0);
	for (uint64_t k = 0; k < 20000; k++) {
		/* wake up late by a random amount, like a real broker */
		now = wheel_next_deadline(&t.wh) + splitmix64(&seed) % (res / 2);
		wheel_advance(&t.wh, now);
		cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1, "period %llu missing",
			     (unsigned long long)k);
		cr_assert_eq(wheel_node(&t.wh, i)->deadline_ns, d0 + k * period, "drift at %llu",
			     (unsigned long long)k);
		cr_assert_leq(wheel_node(&t.wh, i)->deadline_ns, now);
		wheel_rearm_periodic(&t.wh, i);
	}
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, periodic_timer_behind_catches_up_one_period_per_advance)
{
	struct tw t;
	uint64_t period = 1000;
	uint32_t i, got;

	tw_init(&t, 8, 1000, 0);
	i = wheel_alloc(&t.wh);
	wheel_node(&t.wh, i)->period_ns = period;
	wheel_arm(&t.wh, i, period);
	wheel_advance(&t.wh, 100 * period);
	for (uint64_t k = 1; k <= 100; k++) {
		cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 1);
		cr_assert_eq(wheel_node(&t.wh, i)->deadline_ns, k * period);
		wheel_rearm_periodic(&t.wh, i);
		/* none skipped, none doubled: the next one is due at the next advance */
		cr_assert_eq(wheel_pop_expired(&t.wh, &got, 1), 0);
		wheel_advance(&t.wh, 100 * period);
	}
	cr_assert_eq(wheel_node(&t.wh, i)->state, CHIME_NODE_ARMED);
	cr_assert_eq(wheel_node(&t.wh, i)->deadline_ns, 101 * period);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, periodic_rearm_saturates_at_uint64_max)
{
	struct tw t;
	uint32_t i;

	tw_init(&t, 8, 1000, 0);
	i = wheel_alloc(&t.wh);
	wheel_node(&t.wh, i)->period_ns = UINT64_MAX / 2;
	wheel_arm(&t.wh, i, UINT64_MAX - 10);
	wheel_rearm_periodic(&t.wh, i);
	cr_assert_eq(wheel_node(&t.wh, i)->deadline_ns, UINT64_MAX);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, full_slab_returns_nil)
{
	struct tw t;
	uint32_t i;

	tw_init(&t, 5, 1000, 0);
	for (uint32_t k = 0; k < 5; k++)
		cr_assert_neq(wheel_alloc(&t.wh), NIL);
	cr_assert_eq(wheel_alloc(&t.wh), NIL);
	wheel_free(&t.wh, 3);
	i = wheel_alloc(&t.wh);
	cr_assert_eq(i, 3);
	cr_assert_eq(wheel_alloc(&t.wh), NIL);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, free_then_alloc_bumps_the_generation_and_skips_zero)
{
	struct tw t;
	uint32_t i, gen;
	struct chime_node *n;

	tw_init(&t, 4, 1000, 0);
	i = wheel_alloc(&t.wh);
	n = wheel_node(&t.wh, i);
	cr_assert_eq(n->state, CHIME_NODE_ALLOC);
	cr_assert_eq(n->cq_pos, CHIME_POS_NONE);
	cr_assert_neq(n->gen, 0);
	gen = n->gen;
	wheel_free(&t.wh, i);
	cr_assert_eq(wheel_alloc(&t.wh), i);
	cr_assert_eq(n->gen, gen + 1);
	n->gen = CHIME_ID_GEN_MASK;
	wheel_free(&t.wh, i);
	cr_assert_eq(wheel_alloc(&t.wh), i);
	cr_assert_eq(n->gen, 1, "generation wrapped to %u", n->gen);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, tick_math_matches_plain_division_for_any_resolution)
{
	uint64_t seed = 11, ress[] = { 1, 2, 3, 7, 1000, 999983, 1000000, UINT64_C(1) << 20,
				       (UINT64_C(1) << 40) + 7, UINT64_MAX / 3, UINT64_MAX - 1,
				       UINT64_MAX };
	struct tw t;

	for (unsigned r = 0; r < 12 + 200; r++) {
		uint64_t res = r < 12 ? ress[r] : splitmix64(&seed) >> (splitmix64(&seed) % 64);

		if (res == 0)
			res = 1;

		tw_init(&t, 1, res, 0);
		for (unsigned k = 0; k < 2000; k++) {
			uint64_t ns = k < 4 ? (uint64_t[]){ 0, 1, UINT64_MAX, UINT64_MAX - 1 }[k]
					    : splitmix64(&seed) >> (splitmix64(&seed) % 64);

			/* wheel_check() compares now_tick with ns / resolution_ns */
			t.wh.w->now_ns = ns;
			t.wh.w->now_tick = ns / res;
			wheel_check(&t.wh);
		}
		tw_fini(&t);
	}
}

/* Advance through next_deadline() only: each step is bounded and progresses. */
static void next_deadline_loop(uint64_t seed, uint64_t res, unsigned n, uint64_t spread)
{
	struct tw t;
	uint64_t rng = seed, now = splitmix64(&rng) % spread, steps = 0, fired = 0;

	tw_init(&t, n, res, now);
	for (unsigned k = 0; k < n; k++)
		arm_new(&t, now + 1 + splitmix64(&rng) % spread);
	while (wheel_armed(&t.wh) > 0) {
		uint64_t nd = wheel_next_deadline(&t.wh), earliest = UINT64_MAX, due;

		for (uint32_t i = 0; i < n; i++) {
			struct chime_node *x = wheel_node(&t.wh, i);

			if (x->state == CHIME_NODE_ARMED && x->deadline_ns < earliest)
				earliest = x->deadline_ns;
		}
		MCHECK(seed, nd > t.wh.w->now_ns, "next deadline %llu not after now %llu",
		       (unsigned long long)nd, (unsigned long long)t.wh.w->now_ns);
		MCHECK(seed, nd - earliest < res || nd <= earliest,
		       "next deadline %llu more than one resolution after earliest %llu",
		       (unsigned long long)nd, (unsigned long long)earliest);
		due = t_advance(&t.wh, nd);
		fired += pop_all(&t, NULL, 0);
		MCHECK(seed, due == 0 || fired > 0, "advance counted but popped nothing");
		/* progress: each wake-up fires or cascades; cascades are <= 10 per timer */
		MCHECK(seed, ++steps <= (uint64_t)n * CHIME_WHEEL_LEVELS + 2, "spinning");
	}
	cr_assert_eq(fired, n);
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, next_deadline_is_within_one_resolution_and_always_progresses)
{
	next_deadline_loop(1, 1000000, 2000, 60ull * 1000000000);
	next_deadline_loop(2, 1, 2000, UINT64_C(1) << 62);
	next_deadline_loop(3, 999983, 2000, UINT64_C(1) << 50);
	next_deadline_loop(4, 1 << 20, 200, 100ull << 20);
}

Test(wheel, next_deadline_of_an_empty_wheel_is_uint64_max)
{
	struct tw t;

	tw_init(&t, 4, 1000, 12345);
	cr_assert_eq(wheel_next_deadline(&t.wh), UINT64_MAX);
	tw_fini(&t);
}

/*
 * wheel_earliest(): the exact earliest deadline, wherever it waits (level 0,
 * a coarse level far ahead, after cancels), "due" for expired timers, and a
 * lower bound flagged inexact when the slot is larger than the scan.
 */
/*
 * wheel_stage() moves a whole coming cascade ahead of time, within its
 * horizon only: afterwards the slot's own list is empty, the slot still
 * counts as pending, earliest() and next_deadline() are unchanged, and
 * every timer fires at its deadline, not before.
 */
Test(wheel, staging_moves_the_next_cascade_early_and_every_timer_still_fires_on_time)
{
	const uint64_t res = 1000, base = 8192 * res;   /* level-2 slot 2: ticks 8192-12287 */
	struct tw t;
	uint64_t rng = 7, min = UINT64_MAX, now = 0, nd;
	uint32_t idx[2000];
	uint64_t dl[2000];
	unsigned moved = 0, k, n = 2000, got = 0;
	int inexact;

	tw_init(&t, n, res, now);
	for (k = 0; k < n; k++) {
		/* all in that one slot */
		dl[k] = base + splitmix64(&rng) % (4096 * res - res) + 1;
		if (dl[k] < min)
			min = dl[k];
		idx[k] = arm_new(&t, dl[k]);
	}
	cr_assert_eq(wheel_stage(&t.wh, 100), 0, "a slot 8192 ticks ahead is not staged");
	now = 4096 * res;               /* tick 4096: the slot is 4096 ahead, one too many */
	wheel_advance(&t.wh, now);
	cr_assert_eq(wheel_stage(&t.wh, 100), 0, "a slot 4096 ticks ahead is not staged");
	now += res;
	wheel_advance(&t.wh, now);
	nd = wheel_next_deadline(&t.wh);
	cr_assert_eq(wheel_earliest(&t.wh, n, &inexact), min);
	/* in steps, as an idle shard does */
	for (unsigned step; (step = wheel_stage(&t.wh, 64)) > 0; moved += step) {
		cr_assert_leq(step, 64);
		wheel_check(&t.wh);
	}
	cr_assert_eq(moved, n, "staged %u of %u", moved, n);
	cr_assert_eq(t.wh.w->slot[2][2], NIL, "the slot's own list is empty once staged");
	cr_assert(t.wh.w->occupied[2] & (UINT64_C(1) << 2), "a staged slot is still pending");
	cr_assert_eq(wheel_earliest(&t.wh, n, &inexact), min);
	cr_assert(!inexact);
	cr_assert_eq(wheel_next_deadline(&t.wh), nd);
	/* a cut-short walk inside the staged lists: a lower bound, never above the minimum */
	cr_assert_leq(wheel_earliest(&t.wh, 3, &inexact), min);
	/* cancel and reset staged timers, either way */
	wheel_cancel(&t.wh, idx[0]);
	dl[0] = 0;
	dl[1] += 100 * res;
	wheel_reset(&t.wh, idx[1], dl[1]);
	dl[2] = base + 2 * res;
	wheel_reset(&t.wh, idx[2], dl[2]);
	wheel_check(&t.wh);
	while (got < n - 1) {
		uint32_t out[2000];
		unsigned popped;

		now += res / 3 + 1;
		wheel_advance(&t.wh, now);
		popped = pop_all(&t, out, 2000);
		for (unsigned j = 0; j < popped; j++) {
			uint64_t d = wheel_node(&t.wh, out[j])->deadline_ns;

			cr_assert_leq(d, now, "fired early");
			cr_assert_gt(d + res, now, "fired late: deadline %llu, now %llu",
				     (unsigned long long)d, (unsigned long long)now);
		}
		got += popped;
		if (now % (64 * res) < res)
			wheel_check(&t.wh);
		cr_assert_lt(now, base + 5000 * res, "%u of %u fired", got, n - 1);
	}
	wheel_check(&t.wh);
	cr_assert_eq(wheel_armed(&t.wh), 0);
	tw_fini(&t);
}

/*
 * wheel_stage_at(): when a sleeping caller should wake to stage. A slot of
 * level 2 or above: the tick from which it is within the horizon (4095
 * ticks); then now, while nodes are left to move; then nothing until the
 * advance reaches the slot. Level-1 slots never ask for a wake-up of their
 * own, nor does a wheel of fewer than WHEEL_STAGE_WAKE_TIMERS timers. Waking at it and staging leaves the slot's own list empty before
 * it starts, so its start holds nothing back.
 */
Test(wheel, stage_at_is_when_the_next_big_cascade_comes_within_the_horizon)
{
	const uint64_t res = 1000, base = 8192 * res;   /* level-2 slot 2: ticks 8192-12287 */
	struct tw t;
	unsigned n = WHEEL_STAGE_WAKE_TIMERS + 1000, moved = 0, step;
	uint64_t at;

	tw_init(&t, n + 1, res, 0);
	cr_assert_eq(wheel_stage_at(&t.wh), UINT64_MAX, "an empty wheel asks for no wake-up");
	(void)arm_new(&t, 40 * res + 7);                /* level 0 */
	(void)arm_new(&t, 1000 * res + 7);              /* level 1 */
	cr_assert_eq(wheel_stage_at(&t.wh), UINT64_MAX, "levels 0 and 1 ask for no wake-up");
	for (unsigned k = 1; k < n; k++) {
		(void)arm_new(&t, base + 300 * res + k);
		if (k == WHEEL_STAGE_WAKE_TIMERS - 3)
			cr_assert_eq(wheel_stage_at(&t.wh), UINT64_MAX, "a wheel of few timers asks for no wake-up");
	}
	at = wheel_stage_at(&t.wh);
	cr_assert_eq(at, (8192 - 4095) * res, "wake at tick 4097, not %llu", (unsigned long long)at);
	/* Before then there is nothing to stage (the level-1 slot is not asked for). */
	wheel_advance(&t.wh, at - 1);
	(void)pop_all(&t, (uint32_t[4]){ 0 }, 4);
	cr_assert_eq(wheel_stage_at(&t.wh), at, "unchanged until then");
	wheel_advance(&t.wh, at);
	cr_assert_eq(wheel_stage_at(&t.wh), at, "now, once there");
	for (unsigned i = 0; (step = wheel_stage(&t.wh, 64)) > 0; i++) {
		moved += step;
		if (moved < n - 1)
			cr_assert_eq(wheel_stage_at(&t.wh), t.wh.w->now_ns, "now, while nodes are left");
		cr_assert_lt(i, n, "staging does not end");
	}
	cr_assert_eq(moved, n - 1, "staged %u of %u", moved, n - 1);
	cr_assert_eq(t.wh.w->slot[2][2], NIL, "the slot's own list is empty before it starts");
	cr_assert_eq(wheel_stage_at(&t.wh), UINT64_MAX, "staged whole: nothing until it joins");
	wheel_check(&t.wh);
	tw_fini(&t);
}

Test(wheel, earliest_is_the_exact_minimum_deadline)
{
	uint64_t seed = 11, now = 1000000000, res = 100000, min = UINT64_MAX;
	uint32_t idx[500], keep = 0;
	struct tw t;
	int inexact = 7;

	tw_init(&t, 1024, res, now);
	cr_assert_eq(wheel_earliest(&t.wh, 256, &inexact), UINT64_MAX);
	cr_assert_eq(inexact, 0);
	/* One timer 3.7 s ahead, in a coarse slot: its deadline, not the slot's start. */
	idx[0] = arm_new(&t, now + 3700000123u);
	cr_assert_eq(wheel_earliest(&t.wh, 256, &inexact), now + 3700000123u);
	cr_assert_eq(inexact, 0);
	cr_assert_lt(wheel_next_deadline(&t.wh), now + 3700000123u, "the wake-up is the slot's, earlier");
	wheel_cancel(&t.wh, idx[0]);
	/* Random deadlines; cancel half; the minimum of the rest. */
	for (int i = 0; i < 500; i++)
		idx[i] = arm_new(&t, now + 1000 + splitmix64(&seed) % UINT64_C(90000000000));
	for (int i = 0; i < 500; i += 2)
		wheel_cancel(&t.wh, idx[i]);
	for (int i = 1; i < 500; i += 2) {
		uint64_t d = wheel_node(&t.wh, idx[i])->deadline_ns;

		if (d < min) {
			min = d;
			keep = idx[i];
		}
	}
	cr_assert_eq(wheel_earliest(&t.wh, 1024, &inexact), min);
	cr_assert_eq(inexact, 0);
	/* Advance just before it: still exact; at it: due (<= now). */
	wheel_advance(&t.wh, min - 1);
	cr_assert_eq(wheel_earliest(&t.wh, 1024, &inexact), min);
	wheel_advance(&t.wh, min);
	cr_assert_leq(wheel_earliest(&t.wh, 1024, &inexact), min);
	cr_assert_eq(pop_all(&t, NULL, 0), 1);
	wheel_free(&t.wh, keep);
	wheel_check(&t.wh);
	tw_fini(&t);
	/* A slot larger than the scan: a lower bound, flagged. */
	tw_init(&t, 1024, res, now);
	{
		uint64_t base = now + UINT64_C(5000000000), got;

		for (int i = 0; i < 20; i++)
			arm_new(&t, base + 1000 * (uint64_t)i);
		got = wheel_earliest(&t.wh, 4, &inexact);
		cr_assert_eq(inexact, 1);
		cr_assert_leq(got, base, "a lower bound");
		cr_assert_gt(got, now);
		cr_assert_eq(wheel_earliest(&t.wh, 1024, &inexact), base);
		cr_assert_eq(inexact, 0);
	}
	wheel_check(&t.wh);
	tw_fini(&t);
}

/* Copy the region, rebuild the copy, drive both to the end: same expiries. */
Test(wheel, rebuild_from_a_copy_of_the_region_gives_the_same_future_expiries)
{
	struct tw a, b;
	uint64_t seed = 99, res = 1000000, now = 7 * res + 3;
	uint32_t n = 5000, outa[5000], outb[5000];

	tw_init(&a, n, res, now);
	for (uint32_t k = 0; k < n; k++)
		arm_new(&a, now + splitmix64(&seed) % (UINT64_C(100) * res * 1000));
	for (uint32_t k = 0; k < n; k += 7)
		wheel_free(&a.wh, k);
	wheel_advance(&a.wh, now + 1000 * res);     /* some EXPIRED, not popped */
	/* a node in a broker state: rebuild leaves it (and its links) alone */
	wheel_cancel(&a.wh, 1);
	wheel_node(&a.wh, 1)->state = CHIME_NODE_BACKLOG;
	wheel_node(&a.wh, 1)->next = 4242;

	b.len = a.len;
	b.mem = mmap(NULL, b.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert(b.mem != MAP_FAILED);
	memcpy(b.mem, a.mem, a.len);
	/* scramble every derived structure: rebuild must not rely on any */
	memset((char *)b.mem + offsetof(struct chime_wheel, armed), 0xff, 8);
	memset((char *)b.mem + offsetof(struct chime_wheel, occupied), 0x5a,
	       sizeof(((struct chime_wheel *)0)->occupied) + sizeof(((struct chime_wheel *)0)->slot));
	/* the header's clock is not trusted: pass the one the region was at */
	memset((char *)b.mem + offsetof(struct chime_wheel, now_ns), 0x7f, 8);
	cr_assert_eq(wheel_rebuild(&b.wh, b.mem, b.len, n, res, now + 1000 * res, NULL), 0);
	wheel_check(&b.wh);
	cr_assert_eq(wheel_armed(&b.wh), wheel_armed(&a.wh));
	cr_assert_eq(wheel_node(&b.wh, 1)->state, CHIME_NODE_BACKLOG);
	cr_assert_eq(wheel_node(&b.wh, 1)->next, 4242);

	while (wheel_armed(&a.wh) > 0) {
		uint64_t t = wheel_next_deadline(&a.wh);
		unsigned na, nb;

		/* (EXPIRED nodes come back due at the next advance, so compare pops) */
		cr_assert_eq(t, wheel_next_deadline(&b.wh));
		wheel_advance(&a.wh, t);
		wheel_advance(&b.wh, t);
		na = pop_all(&a, outa, n);
		nb = pop_all(&b, outb, n);
		cr_assert_eq(na, nb);
		/* same set (the order within a tick is free) */
		for (unsigned k = 0; k < na; k++) {
			wheel_node(&b.wh, outb[k])->user_data = t;
		}
		for (unsigned k = 0; k < na; k++)
			cr_assert_eq(wheel_node(&b.wh, outa[k])->user_data, t, "node %u differs",
				     outa[k]);
	}
	cr_assert_eq(wheel_armed(&b.wh), 0);
	/* and the free maps hold the same nodes, handed out in the same order */
	for (uint32_t i; (i = wheel_alloc(&a.wh)) != NIL;)
		cr_assert_eq(wheel_alloc(&b.wh), i);
	cr_assert_eq(wheel_alloc(&b.wh), NIL);
	wheel_check(&b.wh);
	tw_fini(&a);
	tw_fini(&b);
}

/*
 * The shard file a killed broker left can hold lazily reset timers, each in a
 * slot earlier than its deadline. The rebuild files every node by its stored
 * deadline, so the rebuilt wheel fires what the old one would have: the same
 * timers at every step, each at its stored deadline (never at the old slot),
 * and wheel_earliest() agrees; the rebuilt one just wakes less often.
 */
Test(wheel, rebuild_of_lazily_reset_timers_fires_each_at_its_stored_deadline)
{
	enum { N = 4000 };
	struct tw a, b;
	uint64_t seed = 4242, res = 1000000, now = 5 * res + 11, dl[N];
	uint32_t outa[N], outb[N], lazy = 0, fired = 0;
	uint8_t live[N] = { 0 };

	tw_init(&a, N, res, now);
	for (uint32_t k = 0; k < N; k++) {
		dl[k] = now + 1 + splitmix64(&seed) % (2000 * res);
		cr_assert_eq(arm_new(&a, dl[k]), k);
		live[k] = 1;
	}
	/* keepalive touches: most later (left in place), some earlier (moved) */
	for (int round = 0; round < 2; round++) {
		for (uint32_t k = 0; k < N; k++) {
			uint64_t r = splitmix64(&seed);

			if (!live[k] || wheel_node(&a.wh, k)->state != CHIME_NODE_ARMED)
				continue;
			if (r % 8 < 5) {
				dl[k] += 1 + (r >> 8) % (r % 2 ? 50 * res : 500000 * res);
				lazy++;
			} else if (r % 8 == 5) {
				dl[k] = now + 1 + (r >> 8) % (300 * res);
			} else {
				continue;
			}
			wheel_reset(&a.wh, k, dl[k]);
		}
		wheel_check(&a.wh);
		/* the first round's advance re-files some of them and fires others (left EXPIRED) */
		if (round == 0) {
			now += 300 * res;
			wheel_advance(&a.wh, now);
		}
	}
	cr_assert_gt(lazy, N / 2);

	b.len = a.len;
	b.mem = mmap(NULL, b.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert(b.mem != MAP_FAILED);
	memcpy(b.mem, a.mem, a.len);
	memset((char *)b.mem + offsetof(struct chime_wheel, occupied), 0x5a,
	       sizeof(((struct chime_wheel *)0)->occupied) + sizeof(((struct chime_wheel *)0)->slot));
	cr_assert_eq(wheel_rebuild(&b.wh, b.mem, b.len, N, res, now, NULL), 0);
	wheel_check(&b.wh);
	cr_assert_eq(wheel_armed(&b.wh), wheel_armed(&a.wh));

	while (wheel_armed(&a.wh) > 0) {
		uint64_t ta = wheel_next_deadline(&a.wh), tb = wheel_next_deadline(&b.wh);
		uint64_t t = ta < tb ? ta : tb, ea, eb;
		unsigned na, nb;
		int ia, ib;

		/* the old wheel may wake earlier (a lazily reset node's slot), never later */
		cr_assert_leq(ta, tb);
		if (t < now)
			t = now;
		wheel_advance(&a.wh, t);
		wheel_advance(&b.wh, t);
		now = t;
		na = pop_all(&a, outa, N);
		nb = pop_all(&b, outb, N);
		cr_assert_eq(na, nb, "at %llu: %u fired, %u after the rebuild", (unsigned long long)t, na, nb);
		for (unsigned k = 0; k < nb; k++) {
			cr_assert(live[outb[k]] == 1 && dl[outb[k]] <= t, "node %u fired early or twice", outb[k]);
			live[outb[k]] = 2;
		}
		for (unsigned k = 0; k < na; k++) {
			cr_assert_eq(live[outa[k]], 2, "node %u fired in one wheel only", outa[k]);
			live[outa[k]] = 0;
			fired++;
		}
		ea = wheel_earliest(&a.wh, N, &ia);
		eb = wheel_earliest(&b.wh, N, &ib);
		cr_assert(ea == eb && !ia && !ib, "earliest %llu, after the rebuild %llu",
			  (unsigned long long)ea, (unsigned long long)eb);
	}
	cr_assert_eq(wheel_armed(&b.wh), 0);
	for (uint32_t k = 0; k < N; k++)
		cr_assert_eq(live[k], 0, "node %u never fired", k);
	cr_assert_eq(fired, N);
	wheel_check(&a.wh);
	wheel_check(&b.wh);
	tw_fini(&a);
	tw_fini(&b);
}

/* A region that does not match the caller's geometry is refused, whole. */
Test(wheel, rebuild_refuses_another_geometry)
{
	struct tw t;
	uint64_t res = 1000000, now = 5 * res;
	struct chime_wheel *w;

	tw_init(&t, 64, res, now);
	arm_new(&t, now + res);
	w = t.mem;
	cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len, 32, res, now, NULL), -EINVAL);
	cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len, 64, res / 2, now, NULL), -EINVAL);
	cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len - 1, 64, res, now, NULL), -EINVAL);
	w->high_water = 65;
	cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len, 64, res, now, NULL), -EINVAL);
	w->high_water = 1;
	w->slab_off += 64;
	cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len, 64, res, now, NULL), -EINVAL);
	w->slab_off -= 64;
	wheel_fini(&t.wh);      /* a rebuild sets up the handle anew */
	cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len, 64, res, now, NULL), 0);
	wheel_check(&t.wh);
	cr_assert_eq(wheel_armed(&t.wh), 1);
	tw_fini(&t);
}

/*
 * Random bytes over random nodes and over every derived structure of the
 * header, as a crash or a stray writer could leave them: rebuild frees
 * exactly the nodes it cannot judge, keeps every sane one, never fires one
 * early, and leaves a wheel that passes wheel_check() and runs to the end.
 */
Test(wheel, rebuild_repairs_a_scribbled_region_node_by_node)
{
	const uint32_t n = 4000;
	uint64_t res = 1000000;
	static uint8_t sane[4000], armed[4000];
	static uint64_t dl[4000];
	static uint32_t out[4000];

	for (uint64_t seed = 1; seed <= 40; seed++) {
		uint64_t rng = seed, now = (10 + seed) * res, later;
		uint32_t want_dropped = 0, want_armed = 0, want_due = 0, got = 0;
		struct wheel_rebuild_stats st;
		struct chime_wheel *w;
		struct tw t;

		tw_init(&t, n, res, now);
		for (uint32_t k = 0; k < n; k++)
			arm_new(&t, now + splitmix64(&rng) % (UINT64_C(600) * res * 1000));
		for (uint32_t k = 0; k < n; k += 5)
			wheel_free(&t.wh, k);
		wheel_advance(&t.wh, now + 200 * res);
		for (uint32_t k = 3; k < n; k += 11)       /* a broker state rebuild leaves alone */
			if (wheel_node(&t.wh, k)->state == CHIME_NODE_ARMED) {
				wheel_cancel(&t.wh, k);
				wheel_node(&t.wh, k)->state = CHIME_NODE_BACKLOG;
			}
		/* scribble: random bytes at random offsets of a tenth of the nodes */
		for (uint32_t k = 0; k < n / 10; k++) {
			uint8_t *p = (uint8_t *)wheel_node(&t.wh, (uint32_t)(splitmix64(&rng) % n));

			for (unsigned b = 0; b < 8; b++)
				p[splitmix64(&rng) % sizeof(struct chime_node)] = (uint8_t)splitmix64(&rng);
		}
		w = t.mem;
		memset(w->occupied, 0xa5, sizeof(w->occupied) + sizeof(w->slot));
		w->expired_head = (uint32_t)splitmix64(&rng);
		w->free_head = (uint32_t)splitmix64(&rng);
		w->armed = splitmix64(&rng);
		w->now_ns = UINT64_MAX - 1;     /* a clock far ahead must not fire everything */
		/* what a correct rebuild must find, judged from the bytes as they are */
		later = now + 300 * res;
		for (uint32_t k = 0; k < n; k++) {
			const struct chime_node *x = wheel_node(&t.wh, k);
			uint32_t g = x->gen;

			sane[k] = x->state <= CHIME_NODE_ACKWAIT &&
				  (x->state == CHIME_NODE_FREE ||
				   ((g & CHIME_ID_GEN_MASK) && !(g & ~(CHIME_ID_GEN_MASK | CHIME_NODE_FLAGS))));
			armed[k] = sane[k] && (x->state == CHIME_NODE_ARMED || x->state == CHIME_NODE_EXPIRED);
			dl[k] = x->deadline_ns;
			want_dropped += !sane[k];
			want_armed += armed[k];
			want_due += armed[k] && dl[k] <= later;
		}
		wheel_fini(&t.wh);
		cr_assert_eq(wheel_rebuild(&t.wh, t.mem, t.len, n, res, later, &st), 0, "seed %llu",
			     (unsigned long long)seed);
		wheel_check(&t.wh);
		cr_assert_eq(st.dropped, want_dropped, "seed %llu", (unsigned long long)seed);
		cr_assert_eq(st.due, want_due, "seed %llu", (unsigned long long)seed);
		cr_assert_eq(wheel_armed(&t.wh), want_armed, "seed %llu", (unsigned long long)seed);
		for (uint32_t k = 0; k < n; k++)
			if (!sane[k])
				cr_assert_eq(wheel_node(&t.wh, k)->state, CHIME_NODE_FREE);
		/* run to the end: each armed node fires once, never before its deadline */
		while (wheel_armed(&t.wh) > 0) {
			uint64_t at = wheel_next_deadline(&t.wh);
			unsigned k;

			cr_assert_neq(at, UINT64_MAX);
			wheel_advance(&t.wh, at);
			k = pop_all(&t, out, n);
			for (unsigned i = 0; i < k; i++) {
				cr_assert(armed[out[i]], "seed %llu: node %u fired, was not armed",
					  (unsigned long long)seed, out[i]);
				cr_assert_leq(dl[out[i]], at > later ? at : later, "fired early");
				armed[out[i]] = 0;
				got++;
			}
		}
		cr_assert_eq(got, want_armed);
		wheel_check(&t.wh);
		tw_fini(&t);
	}
}

/* ------------------------------------------------------------------------ */
/* Differential test against a reference model                               */
/* ------------------------------------------------------------------------ */

struct mt {
	uint32_t idx;       /* wheel node, NIL when not allocated */
	uint8_t  armed;     /* ARMED or EXPIRED in the wheel */
	uint8_t  due;       /* made due by an advance, not popped yet */
	uint64_t deadline;
	uint64_t period;
};

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

static uint64_t rand_deadline(uint64_t *rng, uint64_t now, uint64_t res)
{
	uint64_t r = splitmix64(rng);

	switch (r % 16) {
	case 0:
		return now >= (r >> 8) % (64 * res) ? now - (r >> 8) % (64 * res) : 0; /* past */
	case 1:
		return now;
	case 2:
		return (r >> 8) % 3 == 0 ? 0 : (r >> 8) % 3 == 1 ? UINT64_MAX : UINT64_MAX - 1;
	case 3:
		return now == UINT64_MAX ? now : now + (r >> 8) % (UINT64_MAX - now); /* ahead */
	case 4: case 5:
		return sat_add(now, splitmix64(rng) >> (splitmix64(rng) % 64)); /* log-uniform */
	case 6: case 7: case 8:
		return sat_add(now, (r >> 8) % (4096 * res));
	case 9: {
		/*
		 * At a level's edge: 64^k ticks after now's (k = 1..10, the
		 * last past 2^64 ns at small resolutions), on the tick's
		 * first or last ns, or one ns to either side.
		 */
		uint64_t t = now / res, span = UINT64_C(1) << (6 * (1 + (r >> 8) % 10));
		uint64_t b = t + span < t || (t + span) > UINT64_MAX / res ? UINT64_MAX : (t + span) * res;
		uint64_t d = (r >> 16) % 2 ? sat_add(b, res - 1) : b;

		switch ((r >> 24) % 3) {
		case 0: return d;
		case 1: return d ? d - 1 : 0;
		default: return sat_add(d, 1);
		}
	}
	default:
		return sat_add(now, (r >> 8) % (4 * res + 1));
	}
}

static uint64_t rand_advance(uint64_t *rng, struct tw *t, uint64_t now, uint64_t res)
{
	uint64_t r = splitmix64(rng);

	switch (r % 32) {
	case 0:
		return now > 100 ? now - 100 : 0; /* backwards: treated as the last now */
	case 1:
		return now;
	case 2: case 3: case 4: case 5: case 6:
		return wheel_next_deadline(&t->wh); /* the tickless loop */
	case 7:
		/* log-uniform steps; a jump of up to 2^64 once in a while */
		return sat_add(now, splitmix64(rng) >> (r % 1024 == 7 ? splitmix64(rng) % 64
							      : 8 + splitmix64(rng) % 56));
	case 8: case 9: case 10:
		return sat_add(now, (r >> 8) % (256 * res));
	default:
		return sat_add(now, (r >> 8) % (2 * res + 1));
	}
}

/* The model's 40 owners (k * 1023) in 7 groups, as a shard puts a user's clients in one. */
static const uint16_t *model_groups(void)
{
	static uint16_t group_of[65536];

	for (unsigned k = 0; k < 40; k++)
		group_of[k * 1023] = (uint16_t)(k % 7);
	return group_of;
}

/*
 * Random arms, resets (lazy ones included), cancels, frees, periodic
 * re-arms, wheel_stage() steps and advances, with deadlines in the past,
 * at now, at 0 and UINT64_MAX, at the edges of every level (64^k ticks
 * ahead, to the ns) and past 2^64 ns, against the model after every
 * advance: each timer due exactly once, never before its deadline, and
 * always at the first advance past it; and wheel_earliest(), by which a
 * shard sleeps, the least deadline armed.
 */
static void run_model(uint64_t seed, uint64_t nops)
{
	static const uint64_t ress[] = { 1, 3, 1000, 1000000, 999983, UINT64_C(1) << 20,
					 UINT64_C(1) << 30, 7777777 };
	uint64_t rng = seed, res, now, adv = 0;
	uint32_t m;
	struct mt *h;
	uint32_t *owner;
	struct tw t;

	splitmix64(&rng);
	res = splitmix64(&rng) % 4 ? ress[splitmix64(&rng) % 8] : 1 + splitmix64(&rng) % 50000000;
	m = 8u << (splitmix64(&rng) % 8);   /* 8 .. 1024 live timers */
	switch (splitmix64(&rng) % 4) {
	case 0: now = 0; break;
	case 1: now = UINT64_MAX - (splitmix64(&rng) % (UINT64_C(1) << 44)); break;
	default: now = splitmix64(&rng) >> 2; break;
	}
	tw_init(&t, m, res, now);
	/* small enough that backlogs and jumps ahead of them are common */
	t.wh.jump_backlog = 1 + (uint32_t)(splitmix64(&rng) % 64);
	t.wh.jump_owner = 1 + (uint32_t)(splitmix64(&rng) % 16);
	t.wh.jump_group = 1 + (uint32_t)(splitmix64(&rng) % 16);
	wheel_group_owners(&t.wh, model_groups());
	h = calloc(m, sizeof(*h));
	owner = calloc(m, sizeof(*owner));
	for (uint32_t k = 0; k < m; k++)
		h[k].idx = NIL;

	for (uint64_t op = 0; op < nops; op++) {
		uint64_t r = splitmix64(&rng);
		struct mt *x = &h[(r >> 32) % m];

		unsigned what = (unsigned)(r % 100);

		if (what < 40) {                                /* arm or reset */
			uint64_t d = rand_deadline(&rng, now, res);

			if (x->idx == NIL) {
				uint32_t gen;

				x->idx = wheel_alloc(&t.wh);
				MCHECK(seed, x->idx != NIL, "slab full with %u of %u", m, m);
				gen = wheel_node(&t.wh, x->idx)->gen;
				MCHECK(seed, gen != 0, "generation 0");
				owner[x->idx] = (uint32_t)(x - h);
				/* client slots: who may go ahead of a backlog (some share a count) */
				wheel_node(&t.wh, x->idx)->owner = (uint16_t)(splitmix64(&rng) % 40 * 1023);
			}
			x->period = splitmix64(&rng) % 8 == 0 ? 1 + splitmix64(&rng) % (8 * res) : 0;
			wheel_node(&t.wh, x->idx)->period_ns = x->period;
			if (x->armed || splitmix64(&rng) % 2)
				wheel_reset(&t.wh, x->idx, d);
			else
				wheel_arm(&t.wh, x->idx, d);
			x->armed = 1;
			x->due = 0;
			x->deadline = d;
		} else if (what < 50) {                         /* cancel */
			if (x->idx != NIL) {
				wheel_cancel(&t.wh, x->idx);
				MCHECK(seed, wheel_node(&t.wh, x->idx)->state == CHIME_NODE_ALLOC,
				       "op %llu: cancelled node not ALLOC", (unsigned long long)op);
				x->armed = x->due = 0;
			}
		} else if (what < 55) {                         /* free */
			if (x->idx != NIL) {
				wheel_free(&t.wh, x->idx);
				x->idx = NIL;
				x->armed = x->due = 0;
			}
		} else if (what < 61) {                         /* part of the next cascade, early */
			wheel_stage(&t.wh, (unsigned)(splitmix64(&rng) % 17));
		} else if (what < 63) {                         /* periodic re-arm while armed */
			if (x->idx != NIL && x->armed && x->period) {
				wheel_rearm_periodic(&t.wh, x->idx);
				x->deadline = sat_add(x->deadline, x->period);
				x->due = 0;
			}
		} else {                                        /* advance, then maybe pop */
			uint64_t want = rand_advance(&rng, &t, now, res), became = 0, got;
			uint64_t nd;
			int any_due = 0, popped_all;

			got = t_advance(&t.wh, want);
			if (want > now)
				now = want;
			adv++;
			/* exact: EXPIRED iff deadline <= now, for every live timer */
			for (uint32_t k = 0; k < m; k++) {
				struct mt *y = &h[k];
				struct chime_node *n;

				if (!y->armed)
					continue;
				n = wheel_node(&t.wh, y->idx);
				MCHECK(seed, n->deadline_ns == y->deadline, "deadline changed");
				if (y->deadline <= now) {
					MCHECK(seed, wheel_node_due(&t.wh, y->idx),
					       "op %llu advance %llu: deadline %llu <= now %llu not due (state %u)",
					       (unsigned long long)op, (unsigned long long)adv,
					       (unsigned long long)y->deadline,
					       (unsigned long long)now, n->state);
					became += !y->due;
					y->due = 1;
					any_due = 1;
				} else {
					MCHECK(seed, n->state == CHIME_NODE_ARMED && !wheel_node_due(&t.wh, y->idx),
					       "op %llu: deadline %llu > now %llu fired early",
					       (unsigned long long)op, (unsigned long long)y->deadline,
					       (unsigned long long)now);
				}
			}
			MCHECK(seed, got == became, "advance returned %llu, %llu became due",
			       (unsigned long long)got, (unsigned long long)became);

			nd = wheel_next_deadline(&t.wh);
			if (any_due) {
				MCHECK(seed, nd <= now, "due timers but next deadline %llu > now",
				       (unsigned long long)nd);
			} else {
				uint64_t earliest = UINT64_MAX;
				int armed = 0;

				for (uint32_t k = 0; k < m; k++) {
					armed |= h[k].armed;
					if (h[k].armed && h[k].deadline < earliest)
						earliest = h[k].deadline;
				}
				MCHECK(seed, !armed ? nd == UINT64_MAX : nd > now,
				       "next deadline %llu, now %llu, nothing due, earliest %llu",
				       (unsigned long long)nd, (unsigned long long)now,
				       (unsigned long long)earliest);
				MCHECK(seed, nd <= earliest || nd - earliest < res,
				       "next deadline %llu > earliest %llu + resolution %llu",
				       (unsigned long long)nd, (unsigned long long)earliest,
				       (unsigned long long)res);
			}

			/* one advance in four leaves them EXPIRED, not popped */
			popped_all = splitmix64(&rng) % 4 != 0;
			for (int pop = popped_all; pop;) {
				uint32_t out[64];
				unsigned want_n = 1 + splitmix64(&rng) % 64;
				unsigned n = wheel_pop_expired(&t.wh, out, want_n);

				pop = n > 0;
				for (unsigned k = 0; k < n; k++) {
					struct mt *y;

					MCHECK(seed, out[k] < m, "popped node %u out of range", out[k]);
					y = &h[owner[out[k]]];
					MCHECK(seed, y->idx == out[k] && y->armed && y->due,
					       "popped node %u that is not due", out[k]);
					MCHECK(seed, wheel_node(&t.wh, out[k])->state == CHIME_NODE_ALLOC,
					       "popped node not ALLOC");
					y->due = 0;
					if (y->period) {
						wheel_rearm_periodic(&t.wh, y->idx);
						y->deadline = sat_add(y->deadline, y->period);
					} else {
						y->armed = 0;
					}
				}
			}
			for (uint32_t k = 0; k < m && any_due; k++)
				MCHECK(seed, !h[k].due || !popped_all, "due timer %u not popped", h[k].idx);
			if (popped_all) {
				/* the shard sleeps until wheel_earliest(): exact, staged slots and all */
				uint64_t min = UINT64_MAX, e;
				int inexact;

				for (uint32_t k = 0; k < m; k++)
					if (h[k].armed && h[k].deadline < min)
						min = h[k].deadline;
				/* due ones (periodics re-armed in the past, pending): any deadline <= now, exact else */
				e = wheel_earliest(&t.wh, m, &inexact);
				MCHECK(seed, !inexact && (min <= now ? e <= now : e == min),
				       "op %llu: earliest %llu%s, the least armed deadline %llu, now %llu",
				       (unsigned long long)op, (unsigned long long)e, inexact ? " (inexact)" : "",
				       (unsigned long long)min, (unsigned long long)now);
			}
		}
		if (op % 512 == 0)
			wheel_check(&t.wh);
	}
	wheel_check(&t.wh);
	free(h);
	free(owner);
	tw_fini(&t);
}

static void run_seeds(unsigned seeds, uint64_t ops)
{
	const char *one = getenv("CHIME_TEST_SEED");

	if (one) {
		run_model(strtoull(one, NULL, 0), ops);
		return;
	}
	for (unsigned s = 1; s <= seeds; s++)
		run_model(s * UINT64_C(0x9e3779b97f4a7c15), ops);
}

Test(wheel, random_operations_agree_with_the_reference_model)
{
	/* 64 seeds x 100k ops = 6.4M operations at scale 1 */
	run_seeds(64, (uint64_t)(100000 * scale()));
}

/* ------------------------------------------------------------------------ */
/* Stress (CHIME_STRESS=1; meson test --suite stress)                        */
/* ------------------------------------------------------------------------ */

Test(wheel_stress, random_operations_agree_with_the_reference_model_long, .timeout = 1800)
{
	if (!stress_enabled())
		cr_skip_test("set CHIME_STRESS=1");
	run_seeds(1000, (uint64_t)(100000 * scale()));
}

Test(wheel_stress, ten_million_timers_in_one_wheel, .timeout = 600)
{
	struct tw t;
	uint64_t seed = 5, res = 1000000, now = 1000 * res, span = 60ull * 1000000000;
	uint64_t last_tick = 0, total = 0;
	uint32_t n = 10u * 1000 * 1000, out[4096];

	if (!stress_enabled())
		cr_skip_test("set CHIME_STRESS=1");
	tw_init(&t, n, res, now);
	for (uint32_t k = 0; k < n; k++)
		arm_new(&t, now + splitmix64(&seed) % span);
	cr_assert_eq(wheel_alloc(&t.wh), NIL);
	cr_assert_eq(wheel_armed(&t.wh), n);
	wheel_check(&t.wh);
	for (uint32_t k = 0; k < n; k += 3)
		wheel_reset(&t.wh, k, now + splitmix64(&seed) % span);
	wheel_check(&t.wh);
	while (wheel_armed(&t.wh)) {
		unsigned got;

		now += res;
		wheel_advance(&t.wh, now);
		while ((got = wheel_pop_expired(&t.wh, out, 4096)) > 0) {
			for (unsigned k = 0; k < got; k++) {
				uint64_t d = wheel_node(&t.wh, out[k])->deadline_ns;

				MCHECK(seed, d <= now, "early");
				MCHECK(seed, d / res >= last_tick, "out of tick order");
				last_tick = d / res;
				MCHECK(seed, d + res > now, "late by more than a tick");
			}
			total += got;
		}
	}
	cr_assert_eq(total, n);
	wheel_check(&t.wh);
	tw_fini(&t);
}
