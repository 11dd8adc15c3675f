/* SPDX-License-Identifier: MIT */
/*
 * test_keyidx.c - the shard's key index (broker/keyidx.c) against a brute
 * force model: random inserts and removals over few buckets (long chains,
 * many collisions), then every (owner, key) lookup compared with a scan.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "keyidx.h"
#include "helpers.h"   /* after keyidx.h: its key-index helpers */

#define N       4096u
#define BUCKETS 1024u

static struct chime_node *nodes;
static uint32_t *heads;
static uint8_t *linked;
static struct keyidx ki;

static void setup(void)
{
	nodes = calloc(N, sizeof(*nodes));
	heads = calloc(BUCKETS, sizeof(*heads));
	linked = calloc(N, 1);
	cr_assert(nodes && heads && linked);
	keyidx_init(&ki, heads, BUCKETS, nodes, 0);
	cr_assert_eq(keyidx_walks_init(&ki, 4), 0);
}

static void teardown(void)
{
	keyidx_walks_fini(&ki);
	free(nodes);
	free(heads);
	free(linked);
}

TestSuite(keyidx, .init = setup, .fini = teardown);

Test(keyidx, zeroed_heads_are_an_empty_index)
{
	cr_assert_eq(t_key_first(&ki, 0, 0), CHIME_NIL);
	cr_assert_eq(t_key_first(&ki, 7, 12345), CHIME_NIL);
}

/* A node left out (a grant, or a client's that never cancelled by key) is linked by an insert and left out by a remove. */
Test(keyidx, a_node_left_out_is_in_no_chain_until_inserted)
{
	nodes[1] = (struct chime_node){ .owner = 1, .key = 5 };
	nodes[2] = (struct chime_node){ .owner = 1, .key = 5 };
	keyidx_leave_out(&nodes[1]);
	keyidx_leave_out(&nodes[2]);
	cr_assert(!keyidx_linked(&nodes[1]));
	cr_assert_eq(t_key_first(&ki, 1, 5), CHIME_NIL);
	keyidx_insert(&ki, 1);
	keyidx_insert(&ki, 2);
	cr_assert(keyidx_linked(&nodes[1]) && keyidx_linked(&nodes[2]));
	cr_assert_eq(nodes[2].key_prev, CHIME_NIL, "a chain's head is linked, its key_prev NIL");
	keyidx_remove(&ki, 2);
	cr_assert(!keyidx_linked(&nodes[2]));
	cr_assert_eq(nodes[1].key_prev, CHIME_NIL);
	cr_assert_eq(t_key_first(&ki, 1, 5), 1);
	keyidx_remove(&ki, 1);
	cr_assert_eq(t_key_first(&ki, 1, 5), CHIME_NIL);
}

Test(keyidx, buckets_scale_with_capacity)
{
	cr_assert_eq(keyidx_buckets_for(100), 1024);
	cr_assert_eq(keyidx_buckets_for(4194304), 1048576);
	cr_assert_eq(keyidx_buckets_for(4194304) & (keyidx_buckets_for(4194304) - 1), 0);
}

Test(keyidx, finds_only_its_owner_and_key)
{
	nodes[1] = (struct chime_node){ .owner = 1, .key = 5 };
	nodes[2] = (struct chime_node){ .owner = 2, .key = 5 };
	nodes[3] = (struct chime_node){ .owner = 1, .key = 6 };
	nodes[4] = (struct chime_node){ .owner = 1, .key = 5 };
	for (uint32_t i = 1; i <= 4; i++)
		keyidx_insert(&ki, i);
	uint32_t a, b, budget = 100;
	struct keyidx_walk w;

	keyidx_walk_begin(&ki, &w, 1, 5);
	a = keyidx_walk_next(&ki, &w, &budget);
	b = keyidx_walk_next(&ki, &w, &budget);
	cr_assert(a == 1 || a == 4);
	cr_assert(b == 1 || b == 4);
	cr_assert_neq(a, b);
	cr_assert_eq(keyidx_walk_next(&ki, &w, &budget), CHIME_NIL);
	cr_assert(keyidx_walk_over(&ki, &w));
	keyidx_walk_end(&ki, &w);
	keyidx_remove(&ki, 4);
	cr_assert_eq(t_key_first(&ki, 1, 5), 1);
	cr_assert_eq(t_key_first(&ki, 2, 5), 2);
	cr_assert_eq(t_key_first(&ki, 1, 6), 3);
}

Test(keyidx, random_model)
{
	uint64_t rng = 12345;

	for (int step = 0; step < 200000; step++) {
		uint32_t i = (uint32_t)(splitmix64(&rng) % N);

		if (linked[i]) {
			keyidx_remove(&ki, i);
			linked[i] = 0;
		} else {
			nodes[i].owner = (uint16_t)(splitmix64(&rng) % 4);
			nodes[i].key = splitmix64(&rng) % 64;   /* few keys: many nodes per key */
			keyidx_insert(&ki, i);
			linked[i] = 1;
		}
		if (step % 20000 != 0)
			continue;
		for (uint16_t o = 0; o < 4; o++) {
			for (uint64_t k = 0; k < 64; k++) {
				unsigned want = 0, got = 0;

				for (uint32_t j = 0; j < N; j++)
					want += linked[j] && nodes[j].owner == o && nodes[j].key == k;
				unsigned budget = UINT32_MAX;
				struct keyidx_walk w;

				keyidx_walk_begin(&ki, &w, o, k);
				for (uint32_t j; (j = keyidx_walk_next(&ki, &w, &budget)) != CHIME_NIL;) {
					cr_assert(linked[j]);
					cr_assert_eq(nodes[j].owner, o);
					cr_assert_eq(nodes[j].key, k);
					got++;
				}
				keyidx_walk_end(&ki, &w);
				cr_assert_eq(got, want, "owner %u key %llu", o, (unsigned long long)k);
			}
		}
	}
}

Test(keyidx, remove_while_walking)
{
	for (uint32_t i = 0; i < 100; i++) {
		nodes[i] = (struct chime_node){ .owner = 3, .key = 9 };
		keyidx_insert(&ki, i);
	}
	unsigned n = 0, budget = UINT32_MAX;
	struct keyidx_walk w;

	keyidx_walk_begin(&ki, &w, 3, 9);
	for (uint32_t i; (i = keyidx_walk_next(&ki, &w, &budget)) != CHIME_NIL; n++)
		keyidx_remove(&ki, i);
	keyidx_walk_end(&ki, &w);
	cr_assert_eq(n, 100);
	cr_assert_eq(t_key_first(&ki, 3, 9), CHIME_NIL);
	for (uint32_t b = 0; b < BUCKETS; b++)
		cr_assert_eq(heads[b], 0);
}

/*
 * Walks in steps, several at once over one chain, with the index changing
 * between steps as the shard's other work changes it: each finds exactly
 * the nodes of its key that were there when it began and are still there,
 * each once, whoever else is inserted or removed (any walk's cursor node
 * included), and every step looks at no more nodes than its budget.
 */
static void walks_in_steps(unsigned nwalks)
{
	enum { OWNERS = 4 };
	uint64_t rng = 99 + nwalks;
	static unsigned seen[N];
	static uint8_t at_start[N][OWNERS];
	struct keyidx_walk w[OWNERS];
	uint64_t key[OWNERS] = { 5 };
	unsigned over = 0;

	memset(seen, 0, sizeof(seen));
	/* for owners 2, 3, 4: keys that share (1, 5)'s bucket: one chain for all */
	for (uint16_t o = 2; o <= OWNERS; o++)
		for (key[o - 1] = 0; keyidx_bucket(&ki, o, key[o - 1]) != keyidx_bucket(&ki, 1, 5);)
			key[o - 1]++;
	for (uint32_t i = 0; i < N; i++) {
		uint16_t o = (uint16_t)(1 + i % OWNERS);

		nodes[i] = (struct chime_node){ .owner = o, .key = key[o - 1] };
		if (splitmix64(&rng) % 2) {
			keyidx_insert(&ki, i);
			linked[i] = 1;
		}
	}
	for (unsigned k = 0; k < nwalks; k++) {
		for (uint32_t i = 0; i < N; i++)
			at_start[i][k] = linked[i];
		keyidx_walk_begin(&ki, &w[k], (uint16_t)(k + 1), key[k]);
	}
	while (over < nwalks) {
		for (unsigned k = 0; k < nwalks; k++) {
			unsigned budget = 7, before = budget;
			uint32_t j;

			if (keyidx_walk_over(&ki, &w[k]))
				continue;
			while ((j = keyidx_walk_next(&ki, &w[k], &budget)) != CHIME_NIL) {
				cr_assert_eq(nodes[j].owner, k + 1);
				cr_assert(linked[j] && at_start[j][k], "node %u was not there when walk %u began", j, k);
				seen[j]++;
				if (splitmix64(&rng) % 2) {
					keyidx_remove(&ki, j);  /* cancelled as it is met */
					linked[j] = 0;
				}
			}
			cr_assert_leq(before - budget, 7);
			/* between steps: nodes come and go, the walks' cursors among them */
			for (int m = 0; m < 5; m++) {
				uint32_t i = (uint32_t)(splitmix64(&rng) % N);

				if (m < (int)nwalks && ki.cursor[m] != CHIME_NIL)
					i = ki.cursor[m];
				if (linked[i]) {
					keyidx_remove(&ki, i);
					linked[i] = 0;
				} else {
					keyidx_insert(&ki, i);
					linked[i] = 1;
					for (unsigned q = 0; q < nwalks; q++)
						at_start[i][q] = 0;     /* inserted after the walks began: never seen */
				}
			}
		}
		/* A walk may end between its steps too: its cursor's node removed, the chain's last. */
		over = 0;
		for (unsigned k = 0; k < nwalks; k++)
			over += keyidx_walk_over(&ki, &w[k]);
	}
	/* Ended in another order than begun: the packed cursors stay right. */
	for (unsigned k = nwalks; k-- > 0;)
		keyidx_walk_end(&ki, &w[(k + 1) % nwalks]);
	cr_assert_eq(ki.nr_walks, 0);
	for (uint32_t i = 0; i < N; i++) {
		unsigned k = nodes[i].owner - 1u;

		cr_assert_leq(seen[i], 1, "node %u seen twice", i);
		if (k < nwalks && at_start[i][k] && linked[i])
			cr_assert_eq(seen[i], 1, "node %u, linked all along, was missed by walk %u", i, k);
	}
}

Test(keyidx, a_walk_in_steps_survives_inserts_and_removes)
{
	walks_in_steps(1);
}

Test(keyidx, walks_in_steps_at_once_each_survive_the_others_and_inserts_and_removes)
{
	walks_in_steps(4);
}

/* chimed's seed is random per run: another seed sends the same keys elsewhere. */
Test(keyidx, the_seed_picks_the_buckets)
{
	struct keyidx other;
	unsigned same = 0;

	keyidx_init(&other, heads, BUCKETS, nodes, UINT64_C(0x5eed5eed5eed5eed));
	for (uint64_t key = 0; key < 1000; key++)
		same += keyidx_bucket(&ki, 1, key) == keyidx_bucket(&other, 1, key);
	/* By chance about 1 in 1024 stays; a seed that changed nothing keeps all 1000. */
	cr_assert_lt(same, 20, "%u of 1000 keys in the same bucket under two seeds", same);
}
