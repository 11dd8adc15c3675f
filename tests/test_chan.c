/* SPDX-License-Identifier: MIT */
/*
 * test_chan.c - the broker's per-client channel logic (broker/chan.c), driven
 * without threads or sockets: a wheel in malloc'd memory, a client's segments
 * in malloc'd memory, the client side played with the ring functions.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "chan.h"
#include "keyidx.h"
#include "restore.h"
#include "ring.h"
#include "segment.h"
#include "stats.h"
#include "wall.h"
#include "wheel.h"
#include "helpers.h"   /* after keyidx.h and wheel.h: their helpers */

#define CAP     4096u
#define RES     100000u         /* 100 us */
#define SQ      16u
#define CQ      8u
#define T0      UINT64_C(1000000000)
#define MAXCL   8u
#define NSIM    8               /* simulated clients (F.cl) */

struct client_sim {
	void *rw, *ro;
	void *touch;            /* its touch table, if it has one (touch_client_init()) */
	struct chan_mem m;
	struct chan ch;
	struct chime_sq_prod prod;
	struct chime_cq_cons cons;
};

static struct {
	struct shard_core sc;
	struct stats st;
	struct chime_shard_stats pub;
	struct chime_client_stats cpub[MAXCL];
	struct chan *by_slot[MAXCL];
	struct chan_user users[MAXCL];
	uint16_t user_of_slot[MAXCL];
	void *wmem;
	uint32_t *heads;
	struct chime_client_geom g;
	struct client_sim cl[NSIM];
	uint64_t now;
	uint64_t user_quota;    /* what client_init_uid() attaches with: its user's quota here */
} F;

/* A client's two segments in malloc'd memory (a re-attach gets new ones). */
static void client_mem(struct client_sim *c)
{
	c->rw = aligned_alloc(4096, F.g.rw_size);
	c->ro = aligned_alloc(4096, F.g.ro_size);
	cr_assert(c->rw && c->ro);
	memset(c->rw, 0, F.g.rw_size);
	memset(c->ro, 0, F.g.ro_size);
	chan_mem_layout(&c->m, c->rw, c->ro, &F.g, 0);
}

/* The client's side of the rings, once the shard formatted them. */
static void client_rings(struct client_sim *c)
{
	chime_sq_prod_init(&c->prod, c->m.sq_slots, &c->m.rw->sq_tail, SQ);
	chime_cq_cons_init(&c->cons, c->m.cq_slots, c->m.claim, &c->m.ro->cq_tail, &c->m.rw->cq_head, CQ);
	/* Where the segment says, as libchime does: a re-attach goes on from the last ring's positions. */
	c->cons.head = c->cons.tail = c->m.rw->cq_head;
}

/* The client's process attaches again (resuming it or not): new rings, the old ones freed. */
static void reattach(struct client_sim *c, bool resume)
{
	void *old_rw = c->rw, *old_ro = c->ro;

	client_mem(c);
	chan_reattach(&F.sc, &c->ch, &c->m, resume);
	client_rings(c);
	free(old_rw);
	free(old_ro);
}

/* The session parked (its connection hung up, or the broker stopping), then attached again. */
static void park_and_reattach(struct client_sim *c, bool resume)
{
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	reattach(c, resume);
}

static void client_init_uid(struct client_sim *c, uint16_t slot, uint32_t uid)
{
	client_mem(c);
	cr_assert_eq(chan_attach(&F.sc, &c->ch, &c->m, slot, 1, uid, F.user_quota), 0);
	client_rings(c);
}

/* A client of its own user (uid = slot). */
static void client_init(struct client_sim *c, uint16_t slot)
{
	client_init_uid(c, slot, slot);
}

static void setup(void)
{
	size_t wsz = wheel_region_size(CAP);

	memset(&F, 0, sizeof(F));
	F.wmem = aligned_alloc(64, (wsz + 63) & ~(size_t)63);
	F.heads = calloc(1024, sizeof(uint32_t));
	cr_assert(F.wmem && F.heads);
	cr_assert_eq(wheel_init(&F.sc.wh, F.wmem, wsz, CAP, RES, T0), 0);
	keyidx_init(&F.sc.ki, F.heads, 1024, F.sc.wh.nodes, 0);
	cr_assert_eq(keyidx_walks_init(&F.sc.ki, MAXCL), 0);
	cr_assert_eq(stats_init_blocks(&F.st, &F.pub, F.cpub, MAXCL, 1, 0), 0);
	F.sc.st = &F.st;
	F.sc.by_slot = F.by_slot;
	F.sc.shard = 0;
	F.sc.capacity = CAP;
	F.sc.max_clients = MAXCL;
	F.sc.quota = UINT64_MAX;
	F.sc.users = F.users;
	F.sc.user_of_slot = F.user_of_slot;
	wheel_group_owners(&F.sc.wh, F.user_of_slot);    /* as the shard: by user */
	F.user_quota = UINT64_MAX;
	F.g.nr_shards = 1;
	F.g.sq_size = SQ;
	F.g.cq_size = CQ;
	cr_assert_eq(chime_client_layout(&F.g), 0);
	client_init(&F.cl[0], 0);
	F.now = T0;
}

static void teardown(void)
{
	for (int i = 0; i < NSIM; i++) {
		if (F.cl[i].rw) {
			chan_fini(&F.cl[i].ch);
			free(F.cl[i].rw);
			free(F.cl[i].ro);
			free(F.cl[i].touch);
		}
	}
	stats_fini(&F.st);
	keyidx_walks_fini(&F.sc.ki);
	chan_wall_fini(&F.sc);
	wheel_fini(&F.sc.wh);
	free(F.wmem);
	free(F.heads);
}

/* ---- the client's side ---- */

static uint64_t submit(struct client_sim *c, uint32_t op, uint64_t id, uint64_t key,
		       uint64_t deadline, uint64_t period, uint64_t ud)
{
	uint64_t pos = 0;      /* cr_assert() below is not known not to return */
	struct chime_sqe *s = chime_sq_reserve(&c->prod, &pos);

	cr_assert(s, "submission ring full");
	if (op == CHIME_OP_ARM || op == CHIME_OP_ARM_REALTIME)
		id = s->grant;
	s->op = op;
	s->id = id;
	s->key = key;
	s->deadline_ns = deadline;
	s->period_ns = period;
	s->user_data = ud;
	chime_sq_publish(s, pos);
	return id;
}

static uint64_t arm(struct client_sim *c, uint64_t key, uint64_t deadline, uint64_t period, uint64_t ud)
{
	return submit(c, CHIME_OP_ARM, 0, key, deadline, period, ud);
}

/* Take one event, and release it (the consumer head moves). 0 if none. */
static int take(struct client_sim *c, struct chime_cqe *e)
{
	int r = chime_cq_take(&c->cons, e);

	chime_cq_release(&c->cons);
	return r;
}

/* ---- the shard's side: one loop iteration at time `now` ---- */

/* The first half of an iteration: drain, then fire what is due. */
static void drain_and_fire(uint64_t now)
{
	uint32_t buf[64];
	unsigned n;

	F.now = now;
	for (int i = 0; i < NSIM; i++)
		if (F.cl[i].rw && !F.cl[i].ch.dying && !F.cl[i].ch.parked)
			chan_drain(&F.sc, &F.cl[i].ch, 1000);
	wheel_advance(&F.sc.wh, now);
	while ((n = wheel_pop_expired(&F.sc.wh, buf, 64)) > 0)
		for (unsigned i = 0; i < n; i++)
			chan_fire(&F.sc, F.sc.by_slot[wheel_node(&F.sc.wh, buf[i])->owner], buf[i], now);
}

/*
 * An iteration without its service pass: the events published, the room
 * as the last pass left it.
 */
static void fire_at(uint64_t now)
{
	drain_and_fire(now);
	for (int i = 0; i < NSIM; i++)
		if (F.cl[i].rw && !F.cl[i].ch.dying && !F.cl[i].ch.parked)
			chime_cq_flush(&F.cl[i].ch.cq);
}

static void step_at(uint64_t now)
{
	drain_and_fire(now);
	for (int i = 0; i < NSIM; i++)
		if (F.cl[i].rw && !F.cl[i].ch.dying && !F.cl[i].ch.parked)
			chan_service(&F.sc, &F.cl[i].ch, now);
	wheel_check(&F.sc.wh);
}

static void step(void)
{
	step_at(F.now);
}

#define MS UINT64_C(1000000)

TestSuite(chan, .init = setup, .fini = teardown);

Test(chan, attach_grants_every_slot)
{
	struct chan *ch = &F.cl[0].ch;

	cr_assert_eq(ch->owned, SQ);
	for (uint32_t i = 0; i < SQ; i++) {
		uint64_t g = F.cl[0].m.sq_slots[i].grant;

		cr_assert_neq(g, 0);
		cr_assert_eq(g, ch->grants[i]);
		cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(g))->state, CHIME_NODE_GRANTED);
		cr_assert_eq(F.cl[0].m.sq_slots[i].seq, i);
	}
}

Test(chan, arm_fires_once_never_early)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 7, T0 + 5 * MS, 0, 42);

	step_at(T0 + 5 * MS - 1);
	cr_assert_eq(take(c, &e), 0, "fired early");
	cr_assert_eq(c->m.ro->sq_head, 1, "sq_head published after applying");
	step_at(T0 + 5 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, id);
	cr_assert_eq(e.key, 7);
	cr_assert_eq(e.user_data, 42);
	cr_assert_eq(e.deadline_ns, T0 + 5 * MS);
	cr_assert_geq(e.fired_ns, e.deadline_ns);
	cr_assert_eq(e.flags, 0);
	step_at(T0 + 50 * MS);
	cr_assert_eq(take(c, &e), 0, "fired twice");
	/* consumed one-shot: freed; the grants are back to exactly one per slot */
	cr_assert_eq(c->ch.owned, SQ);
	cr_assert_eq(F.st.sh.fires, 1);
	cr_assert_eq(F.st.sh.delivered, 1);
	cr_assert_eq(F.st.sh.armed, 0);
}

/*
 * Behind a backlog, a tick's timers go ahead of it in places that any
 * client with few due could take: two clients of one user took them all,
 * and another user's timer due next waited behind the backlog. The wheel
 * counts places by user, as chan_attach() groups its slots (thresholds
 * lowered: the shard's are thousands).
 */
Test(chan, one_users_clients_hold_at_most_their_share_of_the_places_ahead_of_a_backlog)
{
	struct client_sim *n1 = &F.cl[1], *n2 = &F.cl[2], *v = &F.cl[3];
	uint32_t got[3];

	client_init_uid(n1, 1, 7);
	client_init_uid(n2, 2, 7);
	client_init_uid(v, 3, 8);
	F.sc.wh.jump_backlog = 8;
	F.sc.wh.jump_max = 4;
	F.sc.wh.jump_owner = 4;
	F.sc.wh.jump_group = 2;
	for (unsigned k = 0; k < 12; k++)
		arm(&F.cl[0], 0, T0 + 10 * MS, 0, k);
	for (unsigned k = 0; k < 2; k++) {
		arm(n1, 0, T0 + 20 * MS, 0, k);
		arm(n2, 0, T0 + 20 * MS, 0, k);
	}
	arm(v, 0, T0 + 20 * MS + RES, 0, 0);
	for (int i = 0; i < 4; i++)
		chan_drain(&F.sc, &F.cl[i].ch, 1000);
	cr_assert_eq(t_advance(&F.sc.wh, T0 + 10 * MS), 12);
	cr_assert_eq(t_advance(&F.sc.wh, T0 + 20 * MS + RES), 5);
	wheel_check(&F.sc.wh);
	cr_assert_eq(wheel_pop_expired(&F.sc.wh, got, 3), 3);
	for (unsigned k = 0; k < 2; k++)
		cr_assert(wheel_node(&F.sc.wh, got[k])->owner == 1 || wheel_node(&F.sc.wh, got[k])->owner == 2,
			  "#%u: client %u's, not the neighbours'", k, wheel_node(&F.sc.wh, got[k])->owner);
	cr_assert_eq(wheel_node(&F.sc.wh, got[2])->owner, 3, "third: client %u's, not the other user's",
		     wheel_node(&F.sc.wh, got[2])->owner);
}

Test(chan, arm_refreshes_the_slot_grant)
{
	struct client_sim *c = &F.cl[0];
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	step();
	cr_assert_neq(c->m.sq_slots[0].grant, id, "a used grant is replaced");
	cr_assert_eq(c->m.sq_slots[0].grant, c->ch.grants[0]);
	cr_assert_eq(c->m.sq_slots[0].seq, SQ, "slot freed for position SQ");
}

/*
 * A burst's grants sat at the slab's top until the client armed a lap of
 * its ring, and nothing above them could be given back once the burst's
 * timers were gone (shard.c, slab_give_back()): a cancel's slot swaps its
 * grant for the lowest free node, and a reset's; a grant near the bottom
 * stays.
 */
Test(chan, a_slot_swaps_a_grant_at_the_slabs_top_for_the_lowest_free_node)
{
	struct client_sim *c = &F.cl[0];
	uint64_t ids[1000];
	uint32_t end;

	F.sc.grant_lower = 64;
	for (unsigned i = 0; i < 1000; i++) {
		ids[i] = arm(c, 0, T0 + 3600000 * MS, 0, i);
		if (i % SQ == SQ - 1)
			step();
	}
	step();
	end = wheel_slab_end(&F.sc.wh);
	cr_assert_geq(end, 1000 + SQ - 1, "the burst's grants at the top: the slab ends at %u", end);
	for (unsigned i = 0; i < 1000; i++) {
		submit(c, i % 2 ? CHIME_OP_CANCEL : CHIME_OP_RESET, ids[i], 0, T0 + 7200000 * MS, 0, 0);
		if (i % 2)
			continue;
		submit(c, CHIME_OP_CANCEL, ids[i], 0, 0, 0, 0);
		if (i % (SQ / 2) == SQ / 2 - 2)
			step();
	}
	step();
	for (uint32_t s = 0; s < SQ; s++)
		cr_assert_lt(chime_id_index(c->ch.grants[s]), 64 + SQ, "slot %u's grant at node %u", s,
			     chime_id_index(c->ch.grants[s]));
	end = wheel_slab_end(&F.sc.wh);
	cr_assert_lt(end, 64 + SQ, "the slab still ends at node %u", end);
	cr_assert_eq(F.pub.malformed + F.st.sh.malformed, 0);
	cr_assert_eq(c->ch.owned, SQ, "the client owns its grants only");
}

Test(chan, cancel_before_fire)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	submit(c, CHIME_OP_CANCEL, id, 0, 0, 0, 0);
	step_at(T0 + 10 * MS);
	cr_assert_eq(take(c, &e), 0);
	cr_assert_eq(c->ch.owned, SQ);
	cr_assert_eq(F.st.sh.cancels, 1);
	cr_assert_eq(F.st.sh.armed, 0);
	cr_assert_eq(wheel_armed(&F.sc.wh), 0);
}

Test(chan, cancel_voids_an_event_in_flight)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	step_at(T0 + MS);                       /* fired and published, not consumed */
	submit(c, CHIME_OP_CANCEL, id, 0, 0, 0, 0);
	step();
	cr_assert_eq(take(c, &e), 0, "a cancelled event must be skipped");
	step();
	cr_assert_eq(c->ch.owned, SQ);
}

Test(chan, cancel_after_consumed_is_stale_not_malformed)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	step_at(T0 + MS);
	cr_assert_eq(take(c, &e), 1);
	step();                                 /* node freed */
	submit(c, CHIME_OP_CANCEL, id, 0, 0, 0, 0);
	step();
	cr_assert_eq(F.st.sh.malformed, 0);
	cr_assert_eq(F.st.sh.cancels, 0);
}

Test(chan, reset_moves_an_armed_timer)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	submit(c, CHIME_OP_RESET, id, 0, T0 + 20 * MS, 0, 0);
	step_at(T0 + 10 * MS);
	cr_assert_eq(take(c, &e), 0);
	step_at(T0 + 20 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, id);
	cr_assert_eq(e.deadline_ns, T0 + 20 * MS);
}

Test(chan, reset_of_unconsumed_oneshot_rearms_when_void_wins)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	step_at(T0 + MS);                       /* fired: ACKWAIT, event unconsumed */
	submit(c, CHIME_OP_RESET, id, 0, T0 + 30 * MS, 0, 0);
	step_at(T0 + 2 * MS);
	cr_assert_eq(take(c, &e), 0, "the earlier firing is voided");
	cr_assert_eq(F.st.sh.armed, 1);
	step_at(T0 + 30 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, id, "same id, alive again");
	cr_assert_eq(e.deadline_ns, T0 + 30 * MS);
}

Test(chan, reset_after_client_took_the_event_changes_nothing)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 0, 0);

	step_at(T0 + MS);
	/* the client takes it but has not released its head yet */
	cr_assert_eq(chime_cq_take(&c->cons, &e), 1);
	submit(c, CHIME_OP_RESET, id, 0, T0 + 30 * MS, 0, 0);
	step();
	chime_cq_release(&c->cons);
	step_at(T0 + 40 * MS);
	cr_assert_eq(take(c, &e), 0, "reset after the event was taken must not fire again");
	cr_assert_eq(c->ch.owned, SQ, "the node is gone");
	cr_assert_eq(F.st.sh.armed, 0);
}

/*
 * CQ + 2 one-shots a tick apart (a known order), fired: the ring holds the
 * first CQ, the last two are held. Their ids in ids[CQ + 2].
 */
static void fire_two_past_a_full_ring(struct client_sim *c, uint64_t *ids)
{
	for (unsigned i = 0; i < CQ + 2; i++)
		ids[i] = arm(c, 0, T0 + MS + i * RES, 0, i);
	step_at(T0 + 2 * MS);
	cr_assert_eq(c->m.ro->cq_tail, CQ);
	cr_assert_eq(c->m.ro->backlog, 2);
}

/*
 * A one-shot fired while its client's ring was full waits, held; reset
 * before it goes out, it was not due after all: it leaves the held ones
 * and fires once, at the new deadline, never at the old firing.
 */
Test(chan, reset_of_a_held_oneshot_rearms_it)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t ids[CQ + 2];

	fire_two_past_a_full_ring(c, ids);
	cr_assert_eq(F.st.sh.armed, 0, "fired one-shots, held or not, are not armed");
	submit(c, CHIME_OP_RESET, ids[CQ], 0, T0 + 30 * MS, 0, 0);
	step();
	cr_assert_eq(c->m.ro->backlog, 1);
	cr_assert_eq(F.st.sh.armed, 1);
	for (unsigned i = 0; i < CQ; i++) {
		cr_assert_eq(take(c, &e), 1);
		cr_assert_eq(e.id, ids[i]);
	}
	step();
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, ids[CQ + 1], "the other held event goes out; the reset one does not");
	step_at(T0 + 30 * MS - 1);
	cr_assert_eq(take(c, &e), 0, "fired early");
	step_at(T0 + 30 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, ids[CQ]);
	cr_assert_eq(e.deadline_ns, T0 + 30 * MS);
	cr_assert_eq(e.user_data, CQ);
	step_at(T0 + 60 * MS);
	cr_assert_eq(take(c, &e), 0, "fired twice");
	cr_assert_eq(F.st.sh.armed, 0);
	cr_assert_eq(c->ch.owned, SQ, "every node freed");
}

/*
 * A periodic reset while its last event waits in the ring, untaken: that
 * event is voided (never returned) and the timer goes on from the new
 * deadline; one the client has already taken stays taken, and only the
 * timer moves.
 */
Test(chan, reset_of_a_periodic_voids_its_untaken_event_in_the_ring)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, 10 * MS, 7);

	step_at(T0 + MS);
	cr_assert_eq(c->m.ro->cq_tail, 1, "the first period's event is in the ring");
	submit(c, CHIME_OP_RESET, id, 0, T0 + 5 * MS, 0, 0);
	step_at(T0 + 2 * MS);
	cr_assert_eq(take(c, &e), 0, "the earlier firing, reset before it was taken, was returned");
	step_at(T0 + 5 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, id);
	cr_assert_eq(e.flags, CHIME_CQE_PERIODIC);
	cr_assert_eq(e.deadline_ns, T0 + 5 * MS);
	step_at(T0 + 15 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.deadline_ns, T0 + 15 * MS, "the period goes on from the new deadline");

	/* the next one taken (claimed, head not yet moved) before the reset is applied */
	step_at(T0 + 25 * MS);
	cr_assert_eq(chime_cq_take(&c->cons, &e), 1);
	cr_assert_eq(e.deadline_ns, T0 + 25 * MS);
	submit(c, CHIME_OP_RESET, id, 0, T0 + 40 * MS, 0, 0);
	step_at(T0 + 26 * MS);
	chime_cq_release(&c->cons);
	step_at(T0 + 39 * MS);
	cr_assert_eq(take(c, &e), 0, "nothing between the taken event and the new deadline");
	step_at(T0 + 40 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.deadline_ns, T0 + 40 * MS);
	cr_assert_eq(F.st.sh.armed, 1);
	submit(c, CHIME_OP_CANCEL, id, 0, 0, 0, 0);
	step_at(T0 + 100 * MS);
	cr_assert_eq(take(c, &e), 0);
	cr_assert_eq(F.st.sh.armed, 0);
	cr_assert_eq(c->ch.owned, SQ);
}

/*
 * The same with the next firing already held behind the event (BACKLOG):
 * untaken, the event is voided and the timer leaves the backlog for the
 * new deadline; taken (claimed, the head not moved yet), only the timer
 * moves. reset_voiding() does both, so a kill in the middle is the reset
 * applied or not (restart/a_reset_of_a_periodic_held_behind_*).
 */
Test(chan, reset_of_a_periodic_held_behind_its_event_moves_it_and_voids_the_event_untaken)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t p = arm(c, 0, T0 + MS, MS, 7), q = arm(c, 0, T0 + MS + RES, MS, 8);

	step_at(T0 + MS + RES);
	cr_assert_eq(chime_cq_take(&c->cons, &e), 1);
	cr_assert_eq(e.id, p, "p's first event taken (its head not released), q's left untaken");
	step_at(T0 + 2 * MS + RES);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(p))->state, CHIME_NODE_BACKLOG);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(q))->state, CHIME_NODE_BACKLOG);
	submit(c, CHIME_OP_RESET, p, 0, T0 + 10 * MS, 0, 0);
	submit(c, CHIME_OP_RESET, q, 0, T0 + 10 * MS + RES, 0, 0);
	step_at(T0 + 3 * MS);
	cr_assert_eq(c->ch.nr_backlog, 0, "both left the backlog");
	chime_cq_release(&c->cons);
	step_at(T0 + 9 * MS);
	cr_assert_eq(take(c, &e), 0, "q's voided event, or a held firing, came after the resets");
	step_at(T0 + 10 * MS + RES);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, p);
	cr_assert_eq(e.deadline_ns, T0 + 10 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, q);
	cr_assert_eq(e.deadline_ns, T0 + 10 * MS + RES);
	cr_assert_eq(take(c, &e), 0);
}

/*
 * A CANCEL_KEY reaches that key's timers in every state: fired and in the
 * ring untaken, fired and held (the ring full), and armed. None of their
 * events is returned after it; the other key's are, in order.
 */
Test(chan, cancel_key_takes_fired_and_held_timers_of_the_key_too)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	unsigned i, got = 0;

	/* ring order: two of key 5, then six of key 1 (the ring's 8), then two of key 5 held */
	for (i = 0; i < CQ + 2; i++)
		arm(c, i < 2 || i >= CQ ? 5 : 1, T0 + MS + i * RES, 0, i);
	arm(c, 5, T0 + 50 * MS, 0, 99);
	step_at(T0 + 2 * MS);
	cr_assert_eq(c->m.ro->cq_tail, CQ);
	cr_assert_eq(c->m.ro->backlog, 2);
	cr_assert_eq(F.st.sh.armed, 1);
	submit(c, CHIME_OP_CANCEL_KEY, 0, 5, 0, 0, 0);
	step();
	cr_assert_eq(c->m.ro->backlog, 0, "the held events of key 5 are dropped");
	cr_assert_eq(F.st.sh.armed, 0);
	cr_assert_eq(F.st.sh.cancel_keys, 1);
	cr_assert_eq(F.st.sh.cancels, 5, "two in the ring, two held, one armed");
	while (take(c, &e)) {
		cr_assert_eq(e.key, 1, "an event of key 5 (user_data %llu) after its CANCEL_KEY",
			     (unsigned long long)e.user_data);
		cr_assert_eq(e.user_data, 2 + got, "out of order");
		got++;
	}
	cr_assert_eq(got, CQ - 2);
	step_at(T0 + 60 * MS);
	cr_assert_eq(take(c, &e), 0);
	cr_assert_eq(c->ch.owned, SQ, "every node freed");
}

/* chime_arm(3): a period shorter than the resolution is taken as the resolution (1 ns was due again at every advance). */
Test(chan, a_period_below_the_resolution_is_the_resolution)
{
	struct client_sim *c = &F.cl[0];
	uint64_t periods[] = { 1, RES - 1, RES, RES + 1 };
	struct chime_cqe e;

	for (unsigned i = 0; i < sizeof(periods) / sizeof(periods[0]); i++) {
		uint64_t start = T0 + (i + 1) * 10 * MS, want = periods[i] < RES ? RES : periods[i];
		uint64_t id = arm(c, 0, start, periods[i], i);

		for (uint64_t k = 0; k < 4; k++) {
			step_at(start + 3 * RES + 3);
			cr_assert_eq(take(c, &e), 1, "period %llu: event %llu", (unsigned long long)periods[i],
				     (unsigned long long)k);
			cr_assert_eq(e.id, id);
			cr_assert_eq(e.deadline_ns, start + k * want, "period %llu: event %llu at T0%+lld ns",
				     (unsigned long long)periods[i], (unsigned long long)k,
				     (long long)(e.deadline_ns - T0));
		}
		step_at(start + 3 * RES + 3);
		cr_assert_eq(take(c, &e), 0, "period %llu: an event before its deadline", (unsigned long long)periods[i]);
		submit(c, CHIME_OP_CANCEL, id, 0, 0, 0, 0);
		step_at(start + 3 * RES + 3);
	}
}

Test(chan, periodic_never_drifts_and_waits_for_consumption)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id = arm(c, 0, T0 + MS, MS, 0);

	/* the client does not drain: one event in the ring, the rest wait in order */
	step_at(T0 + MS);
	for (int i = 2; i <= 5; i++)
		step_at(T0 + (uint64_t)i * MS);
	cr_assert_eq(c->m.ro->cq_tail, 1, "one unconsumed event per timer");
	cr_assert_eq(c->m.ro->backlog, 1);
	for (int k = 1; k <= 5; k++) {
		cr_assert_eq(take(c, &e), 1, "period %d lost", k);
		cr_assert_eq(e.id, id);
		cr_assert_eq(e.flags, CHIME_CQE_PERIODIC);
		cr_assert_eq(e.deadline_ns, T0 + (uint64_t)k * MS, "period %d: %llu", k,
			     (unsigned long long)e.deadline_ns);
		step_at(T0 + 5 * MS);
	}
	cr_assert_eq(c->m.ro->backlog, 0);
	submit(c, CHIME_OP_CANCEL, id, 0, 0, 0, 0);
	step_at(T0 + 100 * MS);
	cr_assert_eq(take(c, &e), 0);
	cr_assert_eq(c->ch.owned, SQ);
	cr_assert_eq(F.st.sh.armed, 0);
}

Test(chan, full_ring_holds_events_in_order_never_drops)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	const int n = 3 * CQ + 1;
	int i;

	for (i = 0; i < n; i++) {
		arm(c, 0, T0 + MS + (uint64_t)i * RES, 0, (uint64_t)i);
		if (i % 8 == 7)
			step();                 /* the submission ring holds SQ */
	}
	step_at(T0 + 10 * MS);
	cr_assert_eq(c->m.ro->cq_tail, CQ);
	cr_assert_eq(c->m.ro->backlog, n - CQ);
	for (i = 0; i < n; i++) {
		if (!take(c, &e)) {
			step();
			cr_assert_eq(take(c, &e), 1, "event %d lost", i);
		}
		cr_assert_eq(e.user_data, (uint64_t)i, "out of order");
	}
	step();
	cr_assert_eq(take(c, &e), 0);
	cr_assert_eq(c->m.ro->backlog, 0);
	step();
	cr_assert_eq(c->ch.owned, SQ);
}

Test(chan, cancel_of_a_held_event)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t ids[CQ + 2];

	fire_two_past_a_full_ring(c, ids);
	submit(c, CHIME_OP_CANCEL, ids[CQ], 0, 0, 0, 0);
	step();
	cr_assert_eq(c->m.ro->backlog, 1);
	for (unsigned i = 0; i < CQ; i++)
		cr_assert_eq(take(c, &e), 1);
	step();
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, ids[CQ + 1]);
	cr_assert_eq(take(c, &e), 0);
}

Test(chan, cancel_key_takes_only_that_clients_key)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	struct chime_cqe e;
	int got = 0;

	client_init(b, 1);
	for (int i = 0; i < 5; i++) {
		arm(a, 100, T0 + MS, 0, 1);
		arm(a, 200, T0 + MS, 0, 2);
		arm(b, 100, T0 + MS, 0, 3);
	}
	submit(a, CHIME_OP_CANCEL_KEY, 0, 100, 0, 0, 0);
	step_at(T0 + 2 * MS);
	while (take(a, &e)) {
		cr_assert_eq(e.user_data, 2);
		got++;
	}
	cr_assert_eq(got, 5);
	got = 0;
	while (take(b, &e)) {
		cr_assert_eq(e.user_data, 3);
		got++;
	}
	cr_assert_eq(got, 5, "another client's timers of the same key are untouched");
	cr_assert_eq(F.st.sh.cancel_keys, 1);
	cr_assert_eq(F.st.sh.cancels, 5);
}

Test(chan, malformed_records_are_counted_and_dropped)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	struct chime_cqe e;
	uint64_t pos, bid;
	struct chime_sqe *s;

	client_init(b, 1);
	bid = arm(b, 0, T0 + MS, 0, 9);
	step();
	submit(a, 99, 0, 0, 0, 0, 0);                                   /* unknown op */
	submit(a, CHIME_OP_CANCEL, bid, 0, 0, 0, 0);                    /* another client's timer */
	submit(a, CHIME_OP_RESET, chime_id_make(1, 3, 5), 0, 0, 0, 0);  /* wrong shard */
	submit(a, CHIME_OP_CANCEL, chime_id_make(1, 0, CAP + 5), 0, 0, 0, 0); /* beyond the slab */
	s = chime_sq_reserve(&a->prod, &pos);                           /* ARM with a forged id */
	s->op = CHIME_OP_ARM;
	s->id = bid;
	s->deadline_ns = T0;
	chime_sq_publish(s, pos);
	step_at(T0 + MS);
	cr_assert_eq(F.st.sh.malformed, 5);
	cr_assert_eq(F.st.cl[0].c.malformed, 5, "counted for the client that sent them");
	cr_assert_eq(F.st.cl[1].c.malformed, 0, "counted for its victim");
	cr_assert_eq(take(a, &e), 0);
	cr_assert_eq(take(b, &e), 1, "the victim's timer survives");
	cr_assert_eq(e.id, bid);
}

Test(chan, scribbled_client_memory_stays_in_bounds)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;

	for (unsigned i = 0; i < CQ; i++)
		arm(c, 0, T0 + MS, 0, i);
	step_at(T0 + MS);
	/* a hostile client: consumer head far beyond the tail, claim words and seqs garbage */
	c->m.rw->cq_head = UINT64_MAX - 3;
	for (unsigned i = 0; i < CQ; i++)
		c->m.claim[i] = UINT64_MAX;
	c->m.sq_slots[0].seq = 12345;
	*c->m.want_wakeup = 7;
	for (unsigned i = 0; i < 4; i++) {
		arm(c, 0, T0 + MS, 0, i);
		step_at(T0 + 2 * MS);
	}
	cr_assert_leq(c->ch.cq.tail - c->ch.cq.head, CQ, "room never exceeds the ring");
	(void)e;
}

Test(chan, wakes_a_sleeping_client_once)
{
	struct client_sim *c = &F.cl[0];

	arm(c, 0, T0 + MS, 0, 0);
	arm(c, 0, T0 + 2 * MS, 0, 0);
	step();
	*c->m.want_wakeup = 1;
	step_at(T0 + MS);
	cr_assert_eq(c->ch.wakes, 1);
	cr_assert_eq(*c->m.want_wakeup, 0);
	step_at(T0 + 2 * MS);
	cr_assert_eq(c->ch.wakes, 1, "no wake-up unless asked");
	cr_assert_eq(F.st.sh.wakeups, 1);
}

/* A wake-up past its user's share for the pass (shard.c, USER_WAKE_BUDGET) waits for the next pass. */
Test(chan, a_wake_up_past_the_users_share_is_owed_to_the_next_pass)
{
	struct client_sim *c = &F.cl[0];
	uint32_t budget = UINT32_MAX, none = 0, one = 1;

	arm(c, 0, T0 + MS, 0, 0);
	step();
	*c->m.want_wakeup = 1;
	drain_and_fire(T0 + MS);
	cr_assert(chan_service_n(&F.sc, &c->ch, T0 + MS, &budget, &none));
	cr_assert_eq(c->m.ro->cq_tail, 1, "the event is published, wake-up or not");
	cr_assert_eq(c->ch.wakes, 0, "a wake-up with none left to the user");
	cr_assert_eq(*c->m.want_wakeup, 1, "the client's request was consumed without a wake-up");
	cr_assert(chan_pending(&F.sc, &c->ch), "an owed wake-up is not work: the shard would sleep on it");
	cr_assert(chan_service_n(&F.sc, &c->ch, T0 + MS, &budget, &one));
	cr_assert_eq(c->ch.wakes, 1, "the owed wake-up not sent in the next pass");
	cr_assert_eq(one, 0, "the wake-up not taken from the user's share");
	cr_assert_eq(*c->m.want_wakeup, 0);
	cr_assert_not(chan_pending(&F.sc, &c->ch), "still owed once sent");
	cr_assert_not(chan_service_n(&F.sc, &c->ch, T0 + MS, &budget, &one), "work with nothing to do");

	/* A client that took its request back (it found the event itself) is owed nothing. */
	arm(c, 0, T0 + 2 * MS, 0, 0);
	step();
	*c->m.want_wakeup = 1;
	drain_and_fire(T0 + 2 * MS);
	(void)chan_service_n(&F.sc, &c->ch, T0 + 2 * MS, &budget, &none);
	cr_assert(chan_pending(&F.sc, &c->ch));
	*c->m.want_wakeup = 0;
	one = 1;
	(void)chan_service_n(&F.sc, &c->ch, T0 + 2 * MS, &budget, &one);
	cr_assert_eq(c->ch.wakes, 1, "a wake-up nobody asked for any more");
	cr_assert_eq(one, 1);
	cr_assert_not(chan_pending(&F.sc, &c->ch));
}

/*
 * Up to `want` epoll watches on fd (each of up to `per` descriptor numbers
 * from 200 on, in each of enough epoll instances), kept after the numbers
 * close: the kernel walks them all inside each write to fd's peer. The
 * instances (to close after) in *eps; the watches made, or -1 (none
 * allowed: too few descriptors, or fs.epoll.max_user_watches).
 */
static long watches_on(int fd, long want, int **eps, int *nr_eps)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct rlimit rl;
	long per, added = 0;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -1;
	rl.rlim_cur = rl.rlim_max;
	(void)setrlimit(RLIMIT_NOFILE, &rl);
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < 1024)
		return -1;
	per = (long)rl.rlim_cur - 400 > 2000 ? 2000 : (long)rl.rlim_cur - 400;
	*nr_eps = (int)((want + per - 1) / per);
	*eps = calloc((size_t)*nr_eps, sizeof(**eps));
	cr_assert_not_null(*eps);
	for (int e = 0; e < *nr_eps; e++)
		cr_assert_geq((*eps)[e] = epoll_create1(EPOLL_CLOEXEC), 0);
	for (long k = 0; k < per && added < want; k++) {
		int n = 200 + (int)k;

		cr_assert_eq(dup2(fd, n), n, "dup2: %s", strerror(errno));
		for (int e = 0; e < *nr_eps && added < want; e++, added++)
			if (epoll_ctl((*eps)[e], EPOLL_CTL_ADD, n, &ev) < 0)
				return close(n), -1;
		close(n);
	}
	return added;
}

/* A timer of c's due 1 ms after t, fired with its client asking for a wake-up; the pass's time returned. */
static uint64_t event_asking_for_a_wake_up(struct client_sim *c, uint64_t t)
{
	arm(c, 0, t + MS, 0, 0);
	step_at(t);
	*c->m.want_wakeup = 1;
	drain_and_fire(t + MS);
	F.sc.wake_retry_ns = UINT64_MAX;        /* as the shard's pass begins */
	F.sc.wake_clock_ns = 0;
	return t + MS;
}

/*
 * A wake-up's send() walks every epoll watch the client put on its end of
 * the connection, on the shard (wake_send(), chan.c). One slow by the
 * thread's CPU time holds the user's wake-ups back for
 * CHAN_WAKE_QUIET_FACTOR times as long, from the first: held, not owed (no
 * work for the shard, which wakes for it at wake_retry_ns). Fast sends hold
 * nothing back; nor does one slow by the clock alone, preempted (not shown
 * here: a preemption inside a send cannot be made to order).
 */
Test(chan, a_wake_up_that_walked_many_watches_holds_its_users_next_ones_back)
{
	struct client_sim *c = &F.cl[0];
	uint32_t budget = UINT32_MAX, wakes = UINT32_MAX;
	uint64_t t = T0, quiet;
	int sv[2], *eps = NULL, nr_eps = 0;
	char buf[64];
	long w;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	c->ch.wake_fd = sv[0];
	for (int i = 1; i <= 4; i++) {
		t = event_asking_for_a_wake_up(c, t);
		(void)chan_service_n(&F.sc, &c->ch, t, &budget, &wakes);
		cr_assert_eq(c->ch.wakes, (unsigned)i, "wake-up %d, with no watches, not sent", i);
		cr_assert_eq(c->ch.user->wake_quiet_until, 0, "a fast send held the next ones back");
		while (take(c, &(struct chime_cqe){ 0 }) > 0)
			;
	}
	cr_assert_eq(read(sv[1], buf, sizeof(buf)), 4);
	/* 200k watches: 15 ms a walk here, 500 us is the threshold. */
	w = watches_on(sv[1], 200000, &eps, &nr_eps);
	if (w < 0)
		cr_skip("no room for the watches (RLIMIT_NOFILE, fs.epoll.max_user_watches)");
	t = event_asking_for_a_wake_up(c, t);
	(void)chan_service_n(&F.sc, &c->ch, t, &budget, &wakes);
	cr_assert_eq(c->ch.wakes, 5, "the wake-up walking %ld watches not sent", w);
	while (take(c, &(struct chime_cqe){ 0 }) > 0)
		;
	cr_assert_eq(F.st.sh.slow_wakeups, 1, "the send walking %ld watches not found slow by CPU time", w);
	quiet = c->ch.user->wake_quiet_until;
	cr_assert_gt(quiet, t + (uint64_t)CHAN_WAKE_QUIET_FACTOR * CHAN_WAKE_SLOW_NS,
		     "no hold after the first send slow by CPU time: the next walks too");
	t = event_asking_for_a_wake_up(c, t);
	cr_assert_lt(t, quiet);
	cr_assert(chan_service_n(&F.sc, &c->ch, t, &budget, &wakes), "the event not published");
	cr_assert_eq(c->ch.wakes, 5, "a wake-up sent while its user's are held back");
	cr_assert_eq(*c->m.want_wakeup, 1, "the request consumed without a wake-up");
	cr_assert_eq(F.sc.wake_retry_ns, quiet, "the shard not told when to wake for the held wake-up");
	cr_assert_not(chan_pending(&F.sc, &c->ch), "a held wake-up is work: the shard would spin through the hold");
	F.sc.wake_retry_ns = UINT64_MAX;
	cr_assert_not(chan_service_n(&F.sc, &c->ch, quiet - 1, &budget, &wakes), "a held wake-up is work");
	cr_assert_eq(c->ch.wakes, 5);
	cr_assert_eq(F.sc.wake_retry_ns, quiet);
	(void)chan_service_n(&F.sc, &c->ch, quiet, &budget, &wakes);
	cr_assert_eq(c->ch.wakes, 6, "the held wake-up not sent when the hold ended");
	cr_assert_eq(*c->m.want_wakeup, 0);
	for (int e = 0; e < nr_eps; e++)
		close(eps[e]);
	free(eps);
	c->ch.wake_fd = -1;
	close(sv[0]);
	close(sv[1]);
}

/* Armed timers of (owner, key), from the slab. */
static unsigned armed_of(uint16_t owner, uint64_t key)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < F.sc.wh.w->high_water; i++) {
		const struct chime_node *nd = wheel_node(&F.sc.wh, i);

		n += nd->state == CHIME_NODE_ARMED && nd->owner == owner && nd->key == key;
	}
	return n;
}

Test(chan, reclaim_frees_every_node_of_the_client)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	uint32_t before;

	client_init(b, 1);
	for (unsigned i = 0; i < 40; i++) {
		arm(a, i % 3, T0 + MS + i * RES, i % 4 == 0 ? MS : 0, i);   /* some periodic */
		arm(b, 0, T0 + 100 * MS, 0, i);
		if (i % 8 == 7)
			step_at(T0);
	}
	step_at(T0 + 3 * MS);           /* some delivered, some in the backlog, most armed */
	before = b->ch.owned;
	while (!chan_reclaim(&F.sc, &a->ch, 7))
		;
	cr_assert_eq(a->ch.owned, 0);
	cr_assert_null(F.sc.by_slot[0]);
	cr_assert_eq(b->ch.owned, before, "the other client keeps its timers");
	for (uint32_t i = 0; i < F.sc.wh.w->high_water; i++) {
		struct chime_node *n = wheel_node(&F.sc.wh, i);

		cr_assert(n->state == CHIME_NODE_FREE || n->owner == 1, "node %u leaked", i);
	}
	wheel_check(&F.sc.wh);
	cr_assert_eq(t_key_index_check(&F.sc), 0, "neither client sent a CANCEL_KEY: nothing indexed");
	cr_assert_eq(b->ch.unindexed, before - SQ, "the other client's timers, left out (its grants apart)");
}

/* The same with both clients keyed: the index loses the one's nodes, keeps the other's. */
Test(chan, reclaim_unlinks_the_clients_nodes_from_the_key_index)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];

	client_init(b, 1);
	submit(a, CHIME_OP_CANCEL_KEY, 0, 77, 0, 0, 0);
	submit(b, CHIME_OP_CANCEL_KEY, 0, 77, 0, 0, 0);
	step();
	for (unsigned i = 0; i < 40; i++) {
		arm(a, i % 3, T0 + MS + i * RES, i % 4 == 0 ? MS : 0, i);
		arm(b, 0, T0 + 100 * MS, 0, i);
		if (i % 8 == 7)
			step_at(T0);
	}
	step_at(T0 + 3 * MS);
	cr_assert_eq(t_key_index_check(&F.sc), a->ch.owned - SQ + b->ch.owned - SQ,
		     "both keyed: every node but the grants is indexed");
	while (!chan_reclaim(&F.sc, &a->ch, 7))
		;
	cr_assert_eq(t_key_first(&F.sc.ki, 0, 0), CHIME_NIL);
	cr_assert_neq(t_key_first(&F.sc.ki, 1, 0), CHIME_NIL);
	cr_assert_eq(t_key_index_check(&F.sc), 40);
}

/*
 * The key index holds a client's timers only once it sent a CANCEL_KEY on
 * the shard: its first one indexes those armed before it, then walks; its
 * arms after that go in at once. A client that never sends one is never
 * indexed.
 */
Test(chan, arms_stay_out_of_the_key_index_until_the_clients_first_cancel_key)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];

	client_init(b, 1);
	for (unsigned i = 0; i < 60; i++) {
		arm(a, i % 3, T0 + 3600 * MS, 0, i);
		arm(b, i % 3, T0 + 3600 * MS, 0, i);
		if (i % 8 == 7)
			step();
	}
	step();
	cr_assert_eq(t_key_index_check(&F.sc), 0);
	cr_assert_eq(a->ch.unindexed, 60);
	for (uint32_t i = 0; i <= F.sc.ki.mask; i++)
		cr_assert_eq(F.sc.ki.heads[i], 0, "bucket %u used", i);
	submit(a, CHIME_OP_CANCEL_KEY, 0, 1, 0, 0, 0);
	step();
	cr_assert_eq(armed_of(0, 1), 0, "the timers armed before the first CANCEL_KEY are found");
	cr_assert_eq(armed_of(0, 0) + armed_of(0, 2), 40);
	cr_assert_eq(armed_of(1, 1), 20, "another client's are not");
	cr_assert_eq(t_key_index_check(&F.sc), 40, "the client's others are indexed now, the other client's not");
	cr_assert_eq(a->ch.unindexed, 0);
	cr_assert_eq(b->ch.unindexed, 60);
	(void)arm(a, 2, T0 + 3600 * MS, 0, 0);
	step();
	cr_assert_eq(t_key_index_check(&F.sc), 41, "a keyed client's arm goes in at once");
	submit(a, CHIME_OP_CANCEL_KEY, 0, 2, 0, 0, 0);
	step();
	cr_assert_eq(armed_of(0, 2), 0);
	cr_assert_eq(armed_of(0, 0), 20);
	cr_assert_eq(t_key_index_check(&F.sc), 20);
}

/*
 * Indexing a client's timers reads the slab in steps of index_budget nodes,
 * one per pass: another client's records go on between them, the client's
 * own wait (sq_head stays at the CANCEL_KEY), and its timers that fire
 * and are consumed meanwhile, indexed or not yet, leave the count right.
 * A detach in the middle leaves nothing behind.
 */
Test(chan, the_first_cancel_key_indexes_in_steps_and_a_detach_midway_leaves_nothing)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	uint64_t head_at, keep;
	unsigned steps = 0;
	struct chime_cqe e;

	client_init(b, 1);
	for (unsigned i = 0; i < 120; i++) {
		arm(a, 9, i < 20 ? T0 + MS + i * RES : T0 + 3600 * MS, 0, i);
		arm(b, 9, T0 + 3600 * MS, 0, i);
		if (i % 8 == 7)
			step_at(T0);
	}
	step_at(T0);
	F.sc.index_budget = 16;
	head_at = a->m.rw->sq_tail;
	submit(a, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	keep = arm(a, 9, T0 + 3600 * MS, 0, 1000);
	(void)arm(b, 5, T0 + 3600 * MS, 0, 1);
	step_at(T0);
	cr_assert_eq(armed_of(0, 9), 120, "nothing cancelled while the client's timers are being indexed");
	cr_assert_eq(armed_of(1, 5), 1, "another client's records go on meanwhile");
	cr_assert_eq(a->m.ro->sq_head, head_at);
	t_key_index_check(&F.sc);
	/* the first 20 fire and are consumed meanwhile: released, indexed or not */
	step_at(T0 + MS + 20 * RES);
	while (take(a, &e) == 1)
		;
	while (a->m.ro->sq_head == head_at) {
		cr_assert_lt(++steps, 1000);
		t_key_index_check(&F.sc);
		step_at(T0 + MS + 20 * RES);
	}
	cr_assert_gt(steps, 2, "in steps (%u)", steps);
	cr_assert_eq(armed_of(0, 9), 1, "only the timer armed after it");
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(keep))->state, CHIME_NODE_ARMED);
	cr_assert_eq(armed_of(1, 9), 120);
	cr_assert_eq(t_key_index_check(&F.sc), 1);

	/* b's first CANCEL_KEY, b gone before it is done */
	submit(b, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step_at(T0 + MS + 20 * RES);
	cr_assert(b->ch.walk_queued && !b->ch.walk_begun, "still indexing");
	t_key_index_check(&F.sc);
	steps = 0;
	while (!chan_reclaim(&F.sc, &b->ch, 7)) {
		/* midway: the walk ended, the nodes still left out counted (fuzz_chan found it, 2026-12-02) */
		cr_assert(!b->ch.walk_queued);
		t_key_index_check(&F.sc);
		steps += b->ch.keyed && b->ch.unindexed > 0;
	}
	cr_assert_gt(steps, 0, "the reclaim had keyed nodes left out midway");
	cr_assert_null(F.sc.walk_head);
	cr_assert_eq(t_key_index_check(&F.sc), 1);
	wheel_check(&F.sc.wh);
}


/*
 * A CANCEL_KEY is applied in steps of walk_budget nodes, so that a chain of
 * a million timers under one key cannot hold the shard: its channel's later
 * records wait for it (and sq_head stays at it), another channel's records
 * go on, and another channel's CANCEL_KEY waits its turn.
 */
Test(chan, cancel_key_is_applied_in_steps_and_in_turn)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	uint64_t head_at, keep;
	unsigned steps = 0;

	client_init(b, 1);
	/* Keyed first: their walks step at once (indexing in steps is the test below). */
	submit(a, CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);
	submit(b, CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);
	step();
	for (int i = 0; i < 200; i++) {
		arm(a, 9, T0 + 3600 * MS, 0, 1);
		if (i % 10 == 0) {
			arm(a, 8, T0 + 3600 * MS, 0, 2);
			arm(b, 9, T0 + 3600 * MS, 0, 3);
		}
		if (i % 4 == 3)
			step();
	}
	step();
	cr_assert_eq(armed_of(0, 9), 200);
	F.sc.walk_budget = 8;
	head_at = a->m.rw->sq_tail;
	submit(a, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	keep = arm(a, 9, T0 + 3600 * MS, 0, 4);         /* after the cancel: it stays */
	(void)arm(b, 7, T0 + 3600 * MS, 0, 5);
	step();
	cr_assert_geq(armed_of(0, 9), 200 - 8, "one step cancels at most its budget");
	cr_assert_lt(armed_of(0, 9), 200);
	cr_assert_eq(a->m.ro->sq_head, head_at, "sq_head stays at the CANCEL_KEY until it is done");
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(keep))->state, CHIME_NODE_GRANTED,
		     "the arm after it waits");
	cr_assert_eq(armed_of(1, 7), 1, "another client's records go on meanwhile");
	submit(b, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	cr_assert_eq(armed_of(1, 9), 20, "the other client's CANCEL_KEY waits for a step of the first");
	/* Then a step each in turn: the short walk is over long before the long one. */
	while (armed_of(1, 9) > 0) {
		cr_assert_lt(++steps, 20, "the short walk waits for the whole long one");
		step();
	}
	cr_assert_eq(b->m.ro->sq_head, b->m.rw->sq_tail, "every record of the other client applied");
	cr_assert_eq(a->m.ro->sq_head, head_at, "the long walk is still going");
	cr_assert_gt(armed_of(0, 9), 1);
	while (a->m.ro->sq_head == head_at) {
		cr_assert_lt(++steps, 1000);
		step();
	}
	cr_assert_gt(steps, 200 / 8 / 2, "in steps, not at once (%u)", steps);
	cr_assert_eq(armed_of(0, 9), 1, "only the timer armed after it");
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(keep))->state, CHIME_NODE_ARMED);
	cr_assert_eq(armed_of(0, 8), 20, "another key untouched");
	cr_assert_null(F.sc.walk_head);
	cr_assert_eq(F.st.sh.cancel_keys, 4);
	cr_assert_eq(F.st.sh.cancels, 220);
}

/*
 * uid 0's connections F.cl[0 .. NSIM - 2], uid 8's the last one, each
 * keyed already (a first CANCEL_KEY: no indexing before later walks).
 */
static void many_and_one_keyed(void)
{
	for (uint16_t k = 1; k < NSIM - 1; k++)
		client_init_uid(&F.cl[k], k, 0);
	client_init_uid(&F.cl[NSIM - 1], NSIM - 1, 8);
	for (int k = 0; k < NSIM; k++)
		submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);
	step();
}

/*
 * Walks take turns by user: after a step of one user's walk, the next is
 * another user's if one waits (chan.c, walk_step()). Seven connections of
 * uid 0 walking long chains and one of uid 8 a shorter one: in turn by
 * connection uid 8 stepped once in eight passes (a security audit's user
 * held another's arm after chime_cancel_key() up to 462 ms so).
 */
Test(chan, walks_take_turns_by_user_not_by_connection)
{
	enum { MANY = NSIM - 1 };       /* uid 0's connections; the last one is uid 8's */
	struct client_sim *v = &F.cl[MANY];
	unsigned passes = 0, left = 0;

	many_and_one_keyed();
	for (int i = 0; i < 200; i++) {
		for (int k = 0; k < NSIM; k++)
			if (k < MANY || i < 64)
				arm(&F.cl[k], 9, T0 + 3600 * MS, 0, 1);
		if (i % 4 == 3)
			step();
	}
	step();
	cr_assert_eq(armed_of(MANY, 9), 64);
	F.sc.walk_budget = 8;
	for (int k = 0; k < MANY; k++)
		submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	submit(v, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	/* uid 8's 64 in steps of 8: a step in three passes or better; in turn by connection one in eight */
	while (armed_of(MANY, 9) > 0) {
		step();
		cr_assert_lt(++passes, 8 * 4, "uid 8's walk waited for uid 0's %u connections in turn", MANY);
	}
	for (uint16_t k = 0; k < MANY; k++)
		left += armed_of(k, 9);
	cr_assert_gt(left, 0, "uid 0's walks are still going");
	while (F.sc.walk_head)
		step();
	for (uint16_t k = 0; k < MANY; k++)
		cr_assert_eq(armed_of(k, 9), 0);
}

/*
 * And a user's walks keep their order among themselves: moved to the back
 * past the user's own, its second connection's one-step walk waited for
 * its first connection's whole walk (a review: 37 passes, 2 before).
 */
Test(chan, a_users_second_walk_is_not_held_back_by_its_first_until_it_ends)
{
	struct client_sim *a0 = &F.cl[0], *a1 = &F.cl[1], *b = &F.cl[2];
	unsigned passes = 0;

	client_init_uid(a1, 1, 0);
	client_init_uid(b, 2, 8);
	for (int k = 0; k < 3; k++)
		submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);   /* keyed: no indexing first */
	step();
	for (int i = 0; i < 400; i++) {
		if (i < 100)
			arm(a0, 9, T0 + 3600 * MS, 0, 1);
		arm(b, 9, T0 + 3600 * MS, 0, 1);
		if (i < 8)
			arm(a1, 9, T0 + 3600 * MS, 0, 1);
		if (i % 4 == 3)
			step();
	}
	step();
	cr_assert_eq(armed_of(1, 9), 8);
	F.sc.walk_budget = 8;
	submit(a0, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	submit(a1, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	submit(b, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	while (armed_of(1, 9) > 0 && passes < 400) {
		step();
		passes++;
	}
	cr_expect_lt(passes, 10, "uid 0's second connection's one-step walk waited %u passes (%u of its first "
		     "connection's walk left)", passes, armed_of(0, 9));
	while (F.sc.walk_head)
		step();
	cr_assert_eq(armed_of(0, 9) + armed_of(1, 9) + armed_of(2, 9), 0);
}


/*
 * Slab sweeps (reclaims, parks) take turns by user, then by channel: the
 * shard's pick (shard.c, reclaim_pick()) is this loop. uid 0 has five
 * channels dying, uids 8 and 9 one each.
 */
static unsigned sweep_pick(struct chan *const *dying, unsigned n, uint64_t *turns)
{
	unsigned best = 0;

	for (unsigned i = 1; i < n; i++)
		if (chan_sweeps_before(dying[i], dying[best]))
			best = i;
	chan_sweep_served(dying[best], ++*turns);
	return best;
}

Test(chan, sweeps_take_turns_by_user_then_by_channel)
{
	struct chan *dying[7];
	unsigned turns_of[7] = { 0 }, order[7];
	uint64_t turns = 0;

	for (uint16_t k = 1; k < 7; k++)
		client_init_uid(&F.cl[k], k, k < 5 ? 0 : k == 5 ? 8 : 9);
	/* uid 8's and 9's in the middle and at the end, as the shard's array may hold them */
	for (unsigned i = 0; i < 7; i++) {
		order[i] = i == 2 ? 5 : i == 5 ? 2 : i;
		dying[i] = &F.cl[order[i]].ch;
	}
	for (unsigned round = 0; round < 10; round++) {
		bool seen0 = false, seen8 = false, seen9 = false;

		for (unsigned k = 0; k < 3; k++) {
			unsigned who = order[sweep_pick(dying, 7, &turns)];

			turns_of[who]++;
			seen0 |= who < 5;
			seen8 |= who == 5;
			seen9 |= who == 6;
		}
		/* in turn by channel, uid 8 and 9 would wait for all five of uid 0's */
		cr_assert(seen0 && seen8 && seen9, "round %u: a user had no turn among three", round);
	}
	cr_assert_eq(turns_of[5], 10);
	cr_assert_eq(turns_of[6], 10);
	/* uid 0's ten turns go round its five channels, two each: none held behind another */
	for (unsigned k = 0; k < 5; k++)
		cr_assert_eq(turns_of[k], 2, "uid 0's channel %u had %u of its user's turns", k, turns_of[k]);
}
/*
 * Three users walking: uid 0 with two walks, uid 8 and uid 9 with one each.
 * Users in turn, uid 0 gets about a third of the steps; a version that
 * moved the first walk of another user to the head gave it every other
 * step (a review: 128 cancels against 64 and 64).
 */
Test(chan, three_users_walks_take_turns_by_user)
{
	struct client_sim *a1 = &F.cl[1], *b = &F.cl[2], *c = &F.cl[3];
	unsigned passes = 0, a_done;

	client_init_uid(a1, 1, 0);
	client_init_uid(b, 2, 8);
	client_init_uid(c, 3, 9);
	for (int k = 0; k < 4; k++)
		submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);   /* keyed: no indexing first */
	step();
	for (int i = 0; i < 400; i++) {
		arm(&F.cl[0], 9, T0 + 3600 * MS, 0, 1);
		arm(a1, 9, T0 + 3600 * MS, 0, 1);
		if (i < 64) {
			arm(b, 9, T0 + 3600 * MS, 0, 1);
			arm(c, 9, T0 + 3600 * MS, 0, 1);
		}
		if (i % 4 == 3)
			step();
	}
	step();
	F.sc.walk_budget = 8;
	for (int k = 0; k < 4; k++)
		submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	while ((armed_of(2, 9) > 0 || armed_of(3, 9) > 0) && passes < 1000) {
		step();
		passes++;
	}
	a_done = 800 - armed_of(0, 9) - armed_of(1, 9);
	cr_expect_leq(a_done, 64 + 16, "uid 0 (two walks) took %u cancels while uid 8 and uid 9 took 64 each: "
		      "not users in turn", a_done);
	while (F.sc.walk_head)
		step();
	cr_assert_eq(armed_of(0, 9) + armed_of(1, 9) + armed_of(2, 9) + armed_of(3, 9), 0);
}

/*
 * A walk that ends in its step is a turn of its user's too: ended, it
 * handed the head on in list order, and its user's turn never moved, so a
 * user whose seven connections each sent CANCEL_KEYs of a step took seven
 * steps for each of another user's long walk (a review: 336 against 49;
 * each such step may visit a whole budget of the chain).
 */
Test(chan, walks_of_one_step_take_turns_by_user_too)
{
	enum { MANY = NSIM - 1, SHORT = 6 };
	struct client_sim *v = &F.cl[MANY];
	unsigned a_steps = 0, v_steps = 0, v_left, passes = 0;

	many_and_one_keyed();
	for (int i = 0; i < 400; i++) {
		arm(v, 9, T0 + 3600 * MS, 0, 1);
		if (i % 8 == 7)
			step();
	}
	step();
	F.sc.walk_budget = 8;
	submit(v, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	v_left = armed_of(MANY, 9);
	while (v_left > 0 && passes < 400) {
		/* each of uid 0's connections whose last walk ended: SHORT timers of key 9 and a CANCEL_KEY of them */
		for (int k = 0; k < MANY; k++)
			if (!F.cl[k].ch.walk_queued) {
				if (armed_of((uint16_t)k, 9) == 0)
					a_steps += passes > 0;
				for (int j = 0; j < SHORT; j++)
					arm(&F.cl[k], 9, T0 + 3600 * MS, 0, 1);
				submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
			}
		step();
		passes++;
		if (armed_of(MANY, 9) < v_left)
			v_steps += (v_left - armed_of(MANY, 9) + 7) / 8;
		v_left = armed_of(MANY, 9);
	}
	cr_assert_eq(v_left, 0, "uid 8's walk not done in %u passes", passes);
	cr_assert_leq(a_steps, 2 * v_steps + 8, "uid 0's one-step walks took %u steps against uid 8's %u: "
		      "not users in turn", a_steps, v_steps);
}

/* n timers an hour ahead under key 9 for each of three clients, applied as they go. */
static void arm_keyed_each(int n, struct client_sim *a, struct client_sim *b, struct client_sim *c)
{
	for (int i = 0; i < n; i++) {
		arm(a, 9, T0 + 3600 * MS, 0, 1);
		arm(b, 9, T0 + 3600 * MS, 0, 1);
		arm(c, 9, T0 + 3600 * MS, 0, 1);
		if (i % 4 == 3)
			step();
	}
	step();
}

/* A client that goes while its CANCEL_KEY is being walked: the walk is dropped, the next one begins. */
Test(chan, a_detach_drops_its_walk_and_the_next_one_goes_on)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	unsigned steps = 0;

	client_init(b, 1);
	for (int i = 0; i < 100; i++) {
		arm(a, 9, T0 + 3600 * MS, 0, 1);
		arm(b, 9, T0 + 3600 * MS, 0, 1);
		if (i % 4 == 3)
			step();
	}
	step();
	F.sc.walk_budget = 4;
	submit(a, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	submit(b, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	cr_assert_eq(F.sc.walk_head, &a->ch);
	while (!chan_reclaim(&F.sc, &a->ch, 1000))
		;
	cr_assert_eq(F.sc.walk_head, &b->ch);
	while (armed_of(1, 9) > 0) {
		cr_assert_lt(++steps, 1000);
		step();
	}
	cr_assert_null(F.sc.walk_head);
	cr_assert_null(F.sc.walk_tail);
}

/*
 * A walk that goes with its connection while at the head hands the head to
 * the user whose walks stepped longest ago, as a walk that ends does: in
 * list order, a user's next walk got it, and one user detaching its
 * connections one after the other kept another user's walk waiting (a
 * review).
 */
Test(chan, a_walk_detached_at_the_head_hands_it_to_the_user_served_longest_ago)
{
	struct client_sim *a = &F.cl[0], *a2 = &F.cl[1], *b = &F.cl[2];

	client_init_uid(a2, 1, 0);      /* a's user's second connection */
	client_init(b, 2);
	arm_keyed_each(100, a, a2, b);
	F.sc.walk_budget = 4;
	submit(a, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	submit(a2, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	submit(b, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	cr_assert_eq(F.sc.walk_head, &a->ch, "a's walk stepped first");
	cr_assert_eq(F.sc.walk_head->walk_next, &a2->ch, "then its user's second, in arrival order");
	while (!chan_reclaim(&F.sc, &a->ch, 1000))
		;
	cr_assert_eq(F.sc.walk_head, &b->ch, "the head went to a's user again, not to the user waiting");
	cr_assert_eq(F.sc.walk_tail, &a2->ch);
}

/* The walk list is whole: from the head, every queued walk once, to the tail, which ends it. */
static void walk_list_whole(void)
{
	unsigned queued = 0, listed = 0;
	const struct chan *c, *last = NULL;

	for (int k = 0; k < NSIM; k++)
		queued += F.cl[k].rw && F.cl[k].ch.walk_queued;
	for (c = F.sc.walk_head; c && listed <= NSIM; last = c, c = c->walk_next) {
		cr_assert(c->walk_queued, "a channel on the walk list not queued");
		cr_assert(!c->dying, "a dying channel on the walk list");
		listed++;
	}
	cr_assert_eq(listed, queued, "%u walks listed, %u queued", listed, queued);
	cr_assert_eq(F.sc.walk_tail, last, "walk_tail is not the list's last");
}

/*
 * A walk reclaimed at the head, alone on the list or not begun yet (its
 * client's timers still being indexed): the list stays whole, head and
 * tail, and a walk queued after it goes on to its end.
 */
Test(chan, a_walk_reclaimed_at_the_head_alone_or_not_begun_leaves_the_list_whole)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1], *c = &F.cl[2];

	client_init(b, 1);
	client_init(c, 2);
	arm_keyed_each(200, a, b, c);
	F.sc.walk_budget = 4;
	F.sc.index_budget = 8;
	/* alone, begun or not */
	submit(a, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	cr_assert_eq(F.sc.walk_head, &a->ch);
	cr_assert_not(a->ch.walk_begun, "a's first CANCEL_KEY is still indexing its timers");
	walk_list_whole();
	while (!chan_reclaim(&F.sc, &a->ch, 1000))
		;
	cr_assert_null(F.sc.walk_head);
	cr_assert_null(F.sc.walk_tail);
	/* a walk after it: queued on the empty list, walked to its end */
	submit(b, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	walk_list_whole();
	submit(c, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	step();
	walk_list_whole();
	cr_assert_eq(F.sc.walk_tail, F.sc.walk_head == &b->ch ? &c->ch : &b->ch);
	/* the head reclaimed while another waits: that one is head and tail */
	{
		struct client_sim *h = F.sc.walk_head == &b->ch ? b : c, *o = h == b ? c : b;

		while (!chan_reclaim(&F.sc, &h->ch, 1000))
			;
		walk_list_whole();
		cr_assert_eq(F.sc.walk_head, &o->ch);
		cr_assert_eq(F.sc.walk_tail, &o->ch);
		for (unsigned n = 0; F.sc.walk_head && n < 2000; n++)
			step();
		cr_assert_null(F.sc.walk_head);
		cr_assert_null(F.sc.walk_tail);
		cr_assert_eq(armed_of(o == b ? 1 : 2, 9), 0, "the walk left after the head's did not end");
	}
}

/*
 * At random: clients of three users send CANCEL_KEYs and go (reclaimed at
 * the head of the walk list or anywhere on it), the list checked whole
 * after every pass and every reclaim; whatever is left walks to its end.
 */
Test(chan, walks_reclaimed_at_random_leave_the_list_whole)
{
	unsigned heads = 0, others = 0;

	for (unsigned seed = 1; seed <= 40; seed++) {
		unsigned rs = seed;

		teardown();
		setup();
		for (uint16_t k = 1; k < NSIM; k++)
			client_init_uid(&F.cl[k], k, k % 3);
		for (int i = 0; i < 64; i++) {
			for (int k = 0; k < NSIM; k++)
				arm(&F.cl[k], (uint64_t)(rand_r(&rs) % 3), T0 + 3600 * MS, 0, 1);
			if (i % 4 == 3)
				step();
		}
		step();
		F.sc.walk_budget = 1 + rand_r(&rs) % 4;
		F.sc.index_budget = 1 + rand_r(&rs) % 16;
		for (unsigned pass = 0; pass < 300; pass++) {
			int k = rand_r(&rs) % NSIM;
			struct client_sim *c = &F.cl[k];

			if (!c->ch.dying && !c->ch.walk_queued && rand_r(&rs) % 2)
				submit(c, CHIME_OP_CANCEL_KEY, 0, (uint64_t)(rand_r(&rs) % 3), 0, 0, 0);
			if (rand_r(&rs) % 16 == 0) {
				/* the head's client most often */
				struct chan *h = F.sc.walk_head;
				int g = k;

				for (int j = 0; h && j < NSIM && rand_r(&rs) % 4; j++)
					if (&F.cl[j].ch == h)
						g = j;
				if (!F.cl[g].ch.dying) {
					heads += F.sc.walk_head == &F.cl[g].ch;
					others += F.cl[g].ch.walk_queued && F.sc.walk_head != &F.cl[g].ch;
					while (!chan_reclaim(&F.sc, &F.cl[g].ch, 1000))
						;
					walk_list_whole();
				}
			}
			step();
			walk_list_whole();
		}
		for (unsigned n = 0; F.sc.walk_head && n < 5000; n++) {
			step();
			walk_list_whole();
		}
		cr_assert_null(F.sc.walk_head, "seed %u: walks left", seed);
		cr_assert_null(F.sc.walk_tail, "seed %u", seed);
	}
	cr_assert(heads >= 20 && others >= 10, "reclaimed %u walks at the head, %u behind it: too few to say", heads,
		  others);
}

/* Take every free node of the slab for a client that is not ours (slot 3). */
static void fill_slab(void)
{
	for (;;) {
		uint32_t idx = wheel_alloc(&F.sc.wh);

		if (idx == CHIME_NIL)
			break;
		wheel_node(&F.sc.wh, idx)->owner = 3;
		wheel_node(&F.sc.wh, idx)->state = CHIME_NODE_GRANTED;
	}
}

/* What libchime does with a marked slot: publish a NOP there. Returns the marker seen. */
static uint64_t refused_arm(struct client_sim *c)
{
	uint64_t pos;
	struct chime_sqe *s = chime_sq_reserve(&c->prod, &pos);
	uint64_t g;

	cr_assert(s, "submission ring full: a refused arm must never wait");
	g = s->grant;
	cr_assert(chime_grant_is_marker(g), "slot holds a grant (%#llx), not a marker", (unsigned long long)g);
	s->op = CHIME_OP_NOP;
	chime_sq_publish(s, pos);
	return g;
}

static unsigned shared_markers(struct client_sim *c)
{
	unsigned n = 0;

	for (unsigned i = 0; i < SQ; i++)
		n += chime_grant_is_marker(c->m.sq_slots[i].grant) != 0;
	return n;
}

Test(chan, full_slab_frees_slots_with_nomem_markers_and_grants_again_when_room_returns)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;

	fill_slab();
	for (unsigned n = 0; n < SQ; n++)
		(void)arm(c, 0, T0 + MS, 0, n);
	step_at(T0);
	cr_assert_eq(c->ch.marked, SQ, "every slot's next grant is a marker");
	cr_assert_eq(shared_markers(c), SQ);
	cr_assert_eq(c->m.sq_slots[0].grant, CHIME_GRANT_NOMEM);
	/* the ring keeps moving: a refused arm takes a slot and gives it back */
	for (unsigned n = 0; n < 2 * SQ; n++) {
		cr_assert_eq(refused_arm(c), CHIME_GRANT_NOMEM);
		step_at(T0);
	}
	cr_assert_eq(F.st.sh.refused_nomem, 2 * SQ);
	cr_assert_eq(F.st.sh.refused_quota, 0);
	/* the events still fire; consuming them frees nodes, and markers become grants at once */
	step_at(T0 + MS);
	for (unsigned i = 0; i < CQ; i++)
		cr_assert_eq(take(c, &e), 1);
	step();
	cr_assert_eq(c->ch.marked, SQ - CQ);
	cr_assert_eq(shared_markers(c), SQ - CQ);
	for (unsigned i = 0; i < SQ; i++) {
		uint64_t g = c->m.sq_slots[i].grant;

		cr_assert(chime_grant_is_marker(g) || wheel_node(&F.sc.wh, chime_id_index(g))->owner == 0,
			  "a grant names a node of ours");
	}
	wheel_check(&F.sc.wh);
}

/*
 * Client c at its quota (SQ + 2: the attach's SQ grants and two more), the
 * next lap's grant of slot 2 a marker, and its ring rounded with NOPs in
 * granted slots (not refusals) up to position `upto`; ids[0..2] armed.
 */
static void at_quota_with_a_marker(struct client_sim *c, uint64_t ids[3], unsigned upto)
{
	F.sc.quota = SQ + 2;
	for (unsigned n = 0; n < 3; n++)
		ids[n] = arm(c, 7, T0 + 3600 * MS, 0, n);
	step_at(T0);
	cr_assert_eq(c->ch.owned, SQ + 2);
	cr_assert_eq(c->ch.marked, 1, "the third renewal is over quota");
	cr_assert_eq(c->m.sq_slots[2].grant, CHIME_GRANT_QUOTA);
	for (unsigned n = 3; n < upto; n++) {
		(void)submit(c, CHIME_OP_NOP, 0, 0, 0, 0, 0);
		step_at(T0);
	}
	cr_assert_eq(F.st.sh.refused_quota, 0);
}

Test(chan, a_client_at_its_quota_gets_quota_markers_until_it_cancels)
{
	struct client_sim *c = &F.cl[0];
	uint64_t ids[3];

	at_quota_with_a_marker(c, ids, SQ + 2);     /* the next reservation is slot 2 */
	cr_assert_eq(refused_arm(c), CHIME_GRANT_QUOTA);
	step_at(T0);
	cr_assert_eq(F.st.sh.refused_quota, 1);
	/* cancel one: below quota again, the marker becomes a grant */
	(void)submit(c, CHIME_OP_CANCEL, ids[0], 0, 0, 0, 0);
	step_at(T0);
	cr_assert_eq(c->ch.marked, 0);
	cr_assert_eq(shared_markers(c), 0);
	cr_assert_eq(c->ch.owned, SQ + 2);
}

/*
 * Room given back goes to the markers the client reaches first from its
 * tail, round the ring: found by their bits (marked_bits) now, where the
 * walk read every slot's grant (up to --sq-size a call, each pass).
 */
Test(chan, room_given_back_goes_to_the_markers_next_from_the_tail_round_the_ring)
{
	struct client_sim *c = &F.cl[0];
	uint64_t ids[6];

	F.sc.quota = SQ + 2;
	for (unsigned n = 0; n < 6; n++)
		ids[n] = arm(c, 7, T0 + 3600 * MS, 0, n);
	step_at(T0);
	cr_assert_eq(c->ch.marked, 4, "slots 2-5 over quota");
	for (unsigned n = 6; n < SQ + 2; n++) {
		(void)submit(c, CHIME_OP_NOP, 0, 0, 0, 0, 0);
		step_at(T0);
	}
	/* the tail at slot 2: the cancels take slots 2 and 3, then the tail is at 4 */
	(void)submit(c, CHIME_OP_CANCEL, ids[0], 0, 0, 0, 0);
	(void)submit(c, CHIME_OP_CANCEL, ids[1], 0, 0, 0, 0);
	step_at(T0);
	cr_assert_eq(c->ch.marked, 2);
	cr_assert_neq(c->m.sq_slots[4].grant, CHIME_GRANT_QUOTA, "slot 4, the tail's, has a grant again");
	cr_assert_neq(c->m.sq_slots[5].grant, CHIME_GRANT_QUOTA);
	cr_assert_eq(c->m.sq_slots[2].grant, CHIME_GRANT_QUOTA, "slot 2, reached last, keeps its marker");
	cr_assert_eq(c->m.sq_slots[3].grant, CHIME_GRANT_QUOTA);
	/* two more: round the ring to them */
	(void)submit(c, CHIME_OP_CANCEL, ids[2], 0, 0, 0, 0);
	(void)submit(c, CHIME_OP_CANCEL, ids[3], 0, 0, 0, 0);
	step_at(T0);
	cr_assert_eq(c->ch.marked, 0);
	cr_assert_eq(shared_markers(c), 0);
}

/*
 * A refusal is put down to the quota that was full when its slot's marker
 * was set. Read off the quotas when the refused arm came, a cancel applied
 * just before it in the same pass had the client below its own quota, and
 * the refusal was counted and logged as its user's (found by a restart
 * soak: "the clients of uid 0 together hold its quota" with a few
 * thousand timers held).
 */
Test(chan, a_refusal_is_put_down_to_the_quota_full_at_its_marker)
{
	struct client_sim *c = &F.cl[0];
	uint64_t ids[3];

	at_quota_with_a_marker(c, ids, SQ + 1);     /* slot 1, then the marked slot 2 */
	/* in one pass: a cancel (below its quota again), then the arm that found the marker */
	(void)submit(c, CHIME_OP_CANCEL, ids[0], 0, 0, 0, 0);
	cr_assert_eq(refused_arm(c), CHIME_GRANT_QUOTA);
	step_at(T0);
	cr_assert_eq(F.st.sh.refused_quota, 1);
	cr_assert_eq(F.st.cl[0].c.refused_quota, 1);
	cr_assert_eq(F.st.cl[0].c.refused_user_quota, 0, "counted as its user's quota");
}

/*
 * Each user's quota comes with its attach (the control thread's policy
 * gives an owner of subordinate uids a quarter, the others half): two
 * users held to two quotas in one shard, and a later attach of a user
 * moves its quota for all its channels (a reload changed it).
 */
Test(chan, each_user_is_held_to_the_quota_its_attach_brought)
{
	struct client_sim *a = &F.cl[1], *b = &F.cl[2], *a2 = &F.cl[3];

	F.user_quota = SQ + 1;
	client_init_uid(a, 1, 1000);
	F.user_quota = SQ + 3;
	client_init_uid(b, 2, 2000);
	for (unsigned n = 0; n < 4; n++) {
		(void)arm(a, 7, T0 + 3600 * MS, 0, n);
		(void)arm(b, 8, T0 + 3600 * MS, 0, n);
		step_at(T0);
	}
	cr_assert_eq(a->ch.user->owned, SQ + 1, "uid 1000 past its own quota");
	cr_assert_eq(b->ch.user->owned, SQ + 3, "uid 2000 held to uid 1000's quota, or past its own");
	cr_assert(a->ch.marked && b->ch.marked);
	/* uid 1000 attaches again, now with room for 4 more: its first channel arms too */
	F.user_quota = 2 * SQ + 5;
	client_init_uid(a2, 3, 1000);
	cr_assert_eq(a2->ch.user, a->ch.user);
	for (unsigned n = 0; n < 4; n++) {
		(void)arm(a, 7, T0 + 3600 * MS, 0, 4 + n);
		step_at(T0);
	}
	cr_assert_eq(a->ch.user->owned, 2 * SQ + 5, "uid 1000 not moved to its new quota");
	cr_assert_eq(b->ch.user->owned, SQ + 3, "uid 2000's quota moved with uid 1000's");
}

Test(chan, the_clients_of_one_user_share_its_quota_and_another_user_is_not_refused)
{
	struct client_sim *a = &F.cl[1], *b = &F.cl[2], *other = &F.cl[0];
	uint64_t ids[3];

	/* uid 1000's two clients: their grants and two more nodes, together */
	F.user_quota = 2 * SQ + 2;
	client_init_uid(a, 1, 1000);
	client_init_uid(b, 2, 1000);
	cr_assert_eq(a->ch.user, b->ch.user, "one share for one user");
	cr_assert_neq(other->ch.user, a->ch.user);
	for (unsigned n = 0; n < 3; n++)
		ids[n] = arm(a, 7, T0 + 3600 * MS, 0, n);
	step_at(T0);
	cr_assert_eq(a->ch.user->owned, 2 * SQ + 2);
	cr_assert_eq(a->ch.marked, 1, "a's third renewal is over its user's quota");
	/* b holds SQ nodes, far from any quota of its own, and is refused all the same */
	(void)arm(b, 8, T0 + 3600 * MS, 0, 0);
	step_at(T0);
	cr_assert_eq(b->ch.owned, SQ);
	cr_assert_eq(b->ch.marked, 1);
	cr_assert_eq(b->m.sq_slots[0].grant, CHIME_GRANT_QUOTA, "EDQUOT for the library");
	for (unsigned n = 1; n < SQ; n++)
		(void)submit(b, CHIME_OP_NOP, 0, 0, 0, 0, 0);
	step_at(T0);
	cr_assert_eq(refused_arm(b), CHIME_GRANT_QUOTA);
	step_at(T0);
	cr_assert_eq(F.st.cl[2].c.refused_quota, 1);
	cr_assert_eq(F.st.cl[2].c.refused_user_quota, 1, "counted as its user's quota");
	/* another user (uid 0) arms and renews as before, up to a quota of its own */
	for (unsigned n = 0; n < SQ + 2; n++) {
		(void)arm(other, 9, T0 + 3600 * MS, 0, n);
		step_at(T0);
	}
	cr_assert_eq(other->ch.marked, 0);
	cr_assert_eq(other->ch.owned, 2 * SQ + 2);
	/* a cancels one: the user is below its quota, b's marker becomes a grant */
	(void)submit(a, CHIME_OP_CANCEL, ids[0], 0, 0, 0, 0);
	step_at(T0);
	cr_assert_eq(a->ch.marked + b->ch.marked, 1, "one node back, one marker replaced");
	cr_assert_eq(a->ch.user->owned, 2 * SQ + 2);
	/* a goes: all of its nodes leave the user's share, and b's arms are granted again */
	while (!chan_reclaim(&F.sc, &a->ch, 1000))
		;
	cr_assert_eq(b->ch.user->owned, b->ch.owned);
	cr_assert_eq(b->ch.user->chans, 1);
	step_at(T0);
	cr_assert_eq(b->ch.marked, 0);
}

Test(chan, a_users_share_is_freed_with_its_last_channel_and_reused)
{
	struct client_sim *a = &F.cl[1];
	struct chan_user *u;
	uint32_t nr;

	client_init_uid(a, 1, 1000);
	(void)arm(a, 7, T0 + 3600 * MS, 0, 0);
	step_at(T0);
	u = a->ch.user;
	nr = F.sc.nr_users;
	cr_assert_eq(u->owned, SQ + 1);
	while (!chan_reclaim(&F.sc, &a->ch, 1000))
		;
	cr_assert_eq(u->chans, 0);
	cr_assert_eq(u->owned, 0);
	chan_fini(&a->ch);
	free(a->rw);
	free(a->ro);
	client_init_uid(a, 1, 2000);
	cr_assert_eq(a->ch.user, u, "the free entry is taken again");
	cr_assert_eq(u->uid, 2000);
	cr_assert_eq(u->owned, SQ);
	cr_assert_eq(F.sc.nr_users, nr);
}

/* The process's address space in bytes (/proc/self/statm), or 0. */
static size_t vm_size(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long pages = 0;

	if (f) {
		if (fscanf(f, "%lu", &pages) != 1)
			pages = 0;
		fclose(f);
	}
	return (size_t)pages * 4096u;
}

/*
 * An attach that fails for want of memory (its touch-table bitmaps: a
 * large calloc() refused under RLIMIT_AS) gives its user's entry back:
 * the shard never sees a detach for it. Kept, every such failure took an
 * entry for good, and the (max_clients)th hit user_get()'s assert.
 */
Test(chan, a_failed_attach_gives_back_its_users_share)
{
#if defined(__SANITIZE_ADDRESS__)
	cr_skip_test("ASan's allocator dies on a refused mmap instead of returning NULL");
#endif
	struct client_sim *a = &F.cl[1];
	uint32_t nr = F.sc.nr_users;
	struct rlimit was;

	client_mem(a);
	a->m.touch_word = a->rw;        /* asks for the table: never read on this path */
	a->m.touch_tag = a->rw;
	cr_assert_eq(getrlimit(RLIMIT_AS, &was), 0);
	for (uint32_t i = 0; i < 2 * MAXCL; i++) {
		struct rlimit low = { .rlim_cur = vm_size() + (256u << 10), .rlim_max = was.rlim_max };
		int r;

		F.sc.capacity = UINT32_MAX - 1;         /* bitmaps of some 3 MiB: mmap'd, refused */
		cr_assert_eq(setrlimit(RLIMIT_AS, &low), 0);
		r = chan_attach(&F.sc, &a->ch, &a->m, 1, 1, 1000 + i, UINT64_MAX);
		cr_assert_eq(setrlimit(RLIMIT_AS, &was), 0);
		F.sc.capacity = CAP;
		cr_assert_eq(r, -ENOMEM, "attempt %u: %d", i, r);
		for (uint32_t k = 0; k < F.sc.nr_users; k++)
			cr_assert(!F.users[k].chans || F.users[k].uid != 1000 + i,
				  "attempt %u: the failed attach still counts a channel of its user", i);
	}
	cr_assert_leq(F.sc.nr_users, nr + 1);
	a->m.touch_word = NULL;
	a->m.touch_tag = NULL;
	cr_assert_eq(chan_attach(&F.sc, &a->ch, &a->m, 1, 1, 1000, UINT64_MAX), 0);
	client_rings(a);
}

Test(chan, attach_to_a_full_slab_succeeds_with_markers_only)
{
	struct client_sim *c = &F.cl[1];

	fill_slab();
	client_init(c, 1);
	cr_assert_eq(c->ch.marked, SQ);
	cr_assert_eq(c->ch.owned, 0);
	cr_assert_eq(refused_arm(c), CHIME_GRANT_NOMEM);
	step_at(T0);
	cr_assert_eq(F.st.sh.refused_nomem, 1);
	/* detaching a client that holds nothing is immediate and frees nothing */
	cr_assert(chan_reclaim(&F.sc, &c->ch, 1));
}

/*
 * A client gone with its ring full of refused arms (NOPs in marked slots)
 * published and not applied, and one gone with a grant in every slot: the
 * reclaim reads the ring and lets the grants go in steps of its budget, not
 * a whole ring (--sq-size, up to 1M) in its first call, a pass that held
 * every other timer of the shard back (hostile/connections_that_go_with_
 * 1m_slot_rings_...: 34.8-54.6 ms); each refused arm counted once, each
 * grant freed once.
 */
Test(chan, a_reclaim_reads_the_ring_and_lets_the_grants_go_in_steps)
{
	struct client_sim *a = &F.cl[0], *c = &F.cl[1];
	unsigned calls = 1;

	fill_slab();
	client_init(c, 1);
	cr_assert_eq(c->ch.marked, SQ);
	for (unsigned i = 0; i < SQ; i++)
		submit(c, CHIME_OP_NOP, 0, 0, 0, 0, 0);
	cr_assert_not(chan_reclaim(&F.sc, &c->ch, 3), "a ring of %u records read in one call", SQ);
	while (!chan_reclaim(&F.sc, &c->ch, 3))
		cr_assert_lt(++calls, 100, "the reclaim never ends");
	step_at(T0);
	cr_assert_eq(F.st.sh.refused_nomem, SQ, "%lu of %u refused arms counted", (unsigned long)F.st.sh.refused_nomem,
		     SQ);
	cr_assert_eq(a->ch.owned, SQ, "client 0's grants");
	calls = 1;
	cr_assert_not(chan_reclaim(&F.sc, &a->ch, 3), "%u grants let go in one call", SQ);
	while (!chan_reclaim(&F.sc, &a->ch, 3))
		cr_assert_lt(++calls, 100, "the reclaim never ends");
	cr_assert_eq(a->ch.owned, 0, "every grant freed");
	wheel_check(&F.sc.wh);
}

/* shard_core.grow as the shard's: a few more nodes of the slab usable per call, up to `grow_to`. */
static uint32_t grow_to, grow_calls;

static bool grow_some(struct shard_core *sc)
{
	grow_calls++;
	if (sc->wh.reserved >= grow_to)
		return false;
	sc->wh.reserved = sc->wh.reserved + 4 < grow_to ? sc->wh.reserved + 4 : grow_to;
	return true;
}

Test(chan, grants_past_the_reserved_slab_grow_it_instead_of_refusing)
{
	struct client_sim *c = &F.cl[1];
	uint32_t hw = F.sc.wh.w->high_water;

	/* Client 0 holds SQ grants; 5 nodes of the slab are usable beyond them. */
	F.sc.wh.reserved = hw + 5;
	F.sc.grow = grow_some;
	grow_to = hw + 5 + SQ;
	client_init(c, 1);
	cr_assert_eq(c->ch.marked, 0, "%u of %u slots refused with capacity to spare", c->ch.marked, SQ);
	cr_assert_eq(c->ch.owned, SQ);
	cr_assert_eq(grow_calls, 3, "grown on demand: ceil((SQ - 5) / 4) calls");
	wheel_check(&F.sc.wh);
	/* When it cannot grow (capacity, a full filesystem): markers, as before. */
	cr_assert(chan_reclaim(&F.sc, &c->ch, SQ));
	chan_fini(&c->ch);
	free(c->rw);
	free(c->ro);
	fill_slab();
	F.sc.wh.reserved = grow_to = F.sc.wh.w->high_water + 4;
	grow_calls = 0;
	client_init(c, 1);
	cr_assert_eq(c->ch.owned, 4, "the 4 nodes the reserve had left");
	cr_assert_eq(c->ch.marked, SQ - 4);
	cr_assert_eq(shared_markers(c), SQ - 4);
	cr_assert_gt(grow_calls, 0);
	wheel_check(&F.sc.wh);
}

Test(chan, an_arm_in_a_marked_slot_is_malformed_and_changes_nothing)
{
	struct client_sim *c = &F.cl[0];
	uint64_t before;

	fill_slab();
	for (unsigned n = 0; n < SQ; n++)
		(void)arm(c, 0, T0 + 3600 * MS, 0, n);
	step_at(T0);
	before = c->ch.owned;
	/* a hostile client arms with the marker itself, and with a forged id */
	(void)arm(c, 0, T0, 0, 0);
	(void)submit(c, CHIME_OP_ARM, chime_id_make(1, 0, 5), 0, T0, 0, 0);
	step_at(T0);
	cr_assert_eq(F.st.sh.malformed, 2);
	cr_assert_eq(c->ch.owned, before);
	wheel_check(&F.sc.wh);
}

Test(chan, a_periodic_waiting_for_its_client_lets_the_shard_sleep)
{
	struct client_sim *c = &F.cl[0];

	arm(c, 0, T0 + MS, MS, 0);
	step_at(T0 + MS);
	step_at(T0 + 2 * MS);           /* second period held: the first is unconsumed */
	cr_assert_eq(c->m.ro->backlog, 1);
	cr_assert_not(chan_pending(&F.sc, &c->ch), "nothing can move until the client drains");
	cr_assert_eq(chime_cq_take(&c->cons, &(struct chime_cqe){ 0 }), 1);
	chime_cq_release(&c->cons);
	cr_assert(chan_pending(&F.sc, &c->ch), "the client drained: the held period can go");
}

Test(chan, consumed_oneshots_are_freed_whoever_refreshed_the_head)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;

	arm(c, 0, T0 + MS, 0, 0);
	step_at(T0 + MS);
	cr_assert_eq(take(c, &e), 1);
	(void)chime_cq_room(&c->ch.cq);         /* someone else saw the head move */
	step();
	cr_assert_eq(c->ch.owned, SQ, "the ACKWAIT node is freed");
}

Test(chan, a_timer_armed_already_due_counts_as_immediate_not_as_lateness)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t lat = 0;

	step_at(T0 + 5 * MS);                   /* the wheel's clock moves on */
	(void)arm(c, 1, 0, 0, 0);               /* deadline 0: allowed, fires at once */
	(void)arm(c, 2, T0 + 6 * MS, 0, 0);     /* a normal one */
	step_at(T0 + 5 * MS);
	step_at(T0 + 6 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.deadline_ns, 0, "the event keeps the client's deadline");
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(F.st.sh.immediate, 1);
	for (unsigned b = 0; b < CHIME_LAT_BUCKETS; b++)
		lat += F.st.sh.lat[b];
	cr_assert_eq(lat, 1, "only the normal timer's lateness is recorded");
	cr_assert_lt(F.st.sh.lat_max_ns, MS, "the lateness of deadline 0 leaked into the maximum");
}

/*
 * A periodic timer behind its schedule (armed with a first deadline long
 * past, or its events taken late) catches up one period at a time: each
 * of those periods was already due when the one before went out, so its
 * fired - deadline is the schedule's age, not the broker's delay. They
 * were counted as lateness: one client's periodic armed at deadline 0 put
 * the host's uptime into every shard's lateness maximum and p99 (a
 * hostile client could set off every lateness alarm).
 */
Test(chan, a_periodic_catching_up_counts_its_past_periods_apart_not_as_lateness)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t lat = 0;

	step_at(T0 + 50 * MS);
	(void)arm(c, 1, T0 + MS, MS, 0);        /* 50 periods behind */
	for (unsigned i = 0; i < 10; i++) {
		step_at(T0 + 50 * MS);
		cr_assert_eq(take(c, &e), 1, "period %u", i);
		cr_assert_eq(e.deadline_ns, T0 + (i + 1) * MS, "the event keeps its period's deadline");
	}
	cr_assert_eq(F.st.sh.immediate, 10);
	for (unsigned b = 0; b < CHIME_LAT_BUCKETS; b++)
		lat += F.st.sh.lat[b];
	cr_assert_eq(lat, 0, "%" PRIu64 " catch-up periods counted as lateness (max %" PRIu64 " ns)", lat,
		     F.st.sh.lat_max_ns);

	/* on its schedule again, its periods are lateness as any timer's */
	(void)arm(c, 2, T0 + 60 * MS, MS, 0);
	step_at(T0 + 60 * MS);
	step_at(T0 + 61 * MS);
	for (unsigned b = 0; b < CHIME_LAT_BUCKETS; b++)
		lat += F.st.sh.lat[b];
	cr_assert_eq(lat, 2, "the periods of a periodic on time are lateness");
	cr_assert_lt(F.st.sh.lat_max_ns, MS);
}

/*
 * chan_fire_batch() counts runs of timers alike at once: the counters must
 * be what one chan_fire() per timer gives, across runs that change client,
 * deadline and flags in the middle of a batch, with some held back.
 */
Test(chan, a_fired_batch_is_counted_as_its_timers_one_by_one)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	uint32_t buf[64];
	uint64_t lat = 0, now = T0 + 3 * MS;
	unsigned n;

	client_init(b, 1);
	for (int i = 0; i < 5; i++)
		(void)arm(a, 1, T0 + MS, 0, 0);
	(void)arm(b, 1, T0 + MS, 0, 0);
	(void)arm(a, 1, T0 + 2 * MS, 0, 0);
	(void)arm(a, 1, T0 + 2 * MS, 0, 0);
	(void)arm(b, 1, T0 + 2 * MS, MS, 0);    /* periodic: stays armed */
	(void)arm(a, 1, 0, 0, 0);               /* immediate */
	for (int i = 0; i < 5; i++)             /* CQ is 8: two of client a's are held */
		(void)arm(a, 1, T0 + MS, 0, 0);
	chan_drain(&F.sc, &a->ch, 1000);
	chan_drain(&F.sc, &b->ch, 1000);
	wheel_advance(&F.sc.wh, now);
	n = wheel_pop_expired(&F.sc.wh, buf, 64);
	cr_assert_eq(n, 15);
	chan_fire_batch(&F.sc, buf, n, now);
	wheel_check(&F.sc.wh);
	cr_assert_eq(F.st.sh.fires, 15);
	cr_assert_eq(F.st.sh.immediate, 1);
	cr_assert_eq(F.st.sh.delivered, 8 + 2);
	cr_assert_eq(a->ch.nr_backlog, 13 - 8);
	cr_assert_eq(F.st.cl[0].c.fires, 13);
	cr_assert_eq(F.st.cl[1].c.fires, 2);
	cr_assert_eq(F.st.sh.armed, 1, "the periodic timer only");
	cr_assert_eq(F.st.cl[1].c.armed, 1);
	cr_assert_eq(F.st.cl[0].c.armed, 0);
	for (unsigned k = 0; k < CHIME_LAT_BUCKETS; k++)
		lat += F.st.sh.lat[k];
	cr_assert_eq(lat, 14);
	cr_assert_eq(F.st.sh.lat_sum_ns, 11 * 2 * MS + 3 * MS);
	cr_assert_eq(F.st.sh.lat_max_ns, 2 * MS);
	cr_assert_eq(F.st.cl[1].c.lat_max_ns, 2 * MS);
}

/*
 * The submission depth the shard reports: the client's sq_tail minus the
 * shard's head, whatever the client wrote there bounded to [0, sq_size].
 */
Test(chan, sq_waiting_counts_reserved_records_and_bounds_a_scribbled_tail)
{
	struct client_sim *c = &F.cl[0];

	cr_assert_eq(chan_sq_waiting(&c->ch), 0);
	for (int i = 0; i < 5; i++)
		submit(c, CHIME_OP_ARM, 0, 1, T0 + 3600 * RES, 0, 0);
	cr_assert_eq(chan_sq_waiting(&c->ch), 5);
	cr_assert_eq(chan_drain(&F.sc, &c->ch, 3), 3);
	cr_assert_eq(chan_sq_waiting(&c->ch), 2);
	cr_assert_eq(chan_drain(&F.sc, &c->ch, 64), 2);
	cr_assert_eq(chan_sq_waiting(&c->ch), 0);
	/* A hostile client: a tail far ahead, or behind the head. */
	c->m.rw->sq_tail = c->ch.sq.head + 1000000;
	cr_assert_eq(chan_sq_waiting(&c->ch), SQ);
	c->m.rw->sq_tail = c->ch.sq.head - 1;
	cr_assert_eq(chan_sq_waiting(&c->ch), 0);
	c->m.rw->sq_tail = UINT64_MAX;
	cr_assert_leq(chan_sq_waiting(&c->ch), SQ);
}

/*
 * A session's process goes (ARCHITECTURE.md, "Client exit"): park settles
 * delivered one-shots by the claim word (taken: freed; untaken: held again,
 * first), frees the unused grants, holds what fires while parked, and a
 * re-attach with new rings delivers the held events in order, ids intact.
 */
/* A periodic's untaken event comes back too, with its deadline; the timer then runs on. */
/*
 * Once the shard sees the consumer head past a periodic's event, the node
 * (in the shard file) no longer names that event: before, it kept its
 * position until the next firing, and a restore after a crash that took
 * the process too delivered that taken event again. head_watch tells the
 * control thread's heartbeat that the shard is waiting to see a head move.
 */
Test(chan, a_periodics_taken_event_is_forgotten_by_its_node_once_the_head_passes_it)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t p = arm(c, 1, T0 + 1 * MS, 50 * MS, 9);
	struct chime_node *n;

	step_at(T0 + 2 * MS);
	n = wheel_node(&F.sc.wh, chime_id_index(p));
	cr_assert_eq(n->cq_pos, 0, "its event at position 0, not taken yet");
	cr_assert_eq(c->ch.head_watch, 0, "the shard waits to see the head move past 0");
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, p);
	step_at(T0 + 3 * MS);
	cr_assert_eq(n->cq_pos, CHIME_POS_NONE, "the taken event is still the node's");
	cr_assert_eq(n->state, CHIME_NODE_ARMED);
	cr_assert_eq(c->ch.head_watch, UINT64_MAX, "nothing left to watch");
	step_at(T0 + 51 * MS);
	cr_assert_eq(take(c, &e), 1, "the next period");
	cr_assert_eq(e.deadline_ns, T0 + 51 * MS);
}

/*
 * The walk over the positions a consume passed is budgeted too
 * (chan_service_n()): in steps, and no slot it has yet to read is written
 * over meanwhile (the room stops there), so every taken periodic's node
 * forgets its event's position in the end. Before, a refresh walked every
 * position at once, whatever the budget.
 */
Test(chan, a_periodics_walk_in_steps_writes_over_no_slot_it_has_not_read)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t p[CQ];
	uint32_t budget;

	for (unsigned i = 0; i < CQ; i++)
		p[i] = arm(c, 1, T0 + 1 * MS + i, 50 * MS, i);
	step_at(T0 + 2 * MS);
	cr_assert_eq(c->m.ro->cq_tail, CQ, "every periodic's event in the ring");
	for (unsigned i = 0; i < CQ; i++) {
		cr_assert_eq(take(c, &e), 1);
		p[i] = e.id;    /* in ring order: timers due in one tick fire in no particular order */
	}
	for (unsigned i = 0; i < CQ; i++) {
		budget = 1;
		/* Once a refresh saw the head move (the first step), what is left to walk is work. */
		cr_assert(i == 0 || chan_pending(&F.sc, &c->ch), "a walk left to do is not work (step %u)", i);
		cr_assert(chan_service_n(&F.sc, &c->ch, T0 + 2 * MS, &budget, &(uint32_t){ UINT32_MAX }), "step %u did nothing", i);
		cr_assert_eq(budget, 0, "step %u took no budget", i);
		cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(p[i]))->cq_pos, CHIME_POS_NONE, "step %u", i);
		if (i + 1 < CQ)
			cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(p[i + 1]))->cq_pos, i + 1,
				     "step %u went past its budget", i);
		cr_assert_leq(c->ch.room, i + 1, "room over slots the walk has yet to read (step %u)", i);
	}
	budget = 1;
	(void)chan_service_n(&F.sc, &c->ch, T0 + 2 * MS, &budget, &(uint32_t){ UINT32_MAX });
	cr_assert_eq(c->ch.room, CQ, "the whole ring free once the walk is done");
	step_at(T0 + 52 * MS);
	for (unsigned i = 0; i < CQ; i++) {
		cr_assert_eq(take(c, &e), 1, "the next period of the %uth", i);
		cr_assert_eq(e.deadline_ns - e.user_data, T0 + 51 * MS);
	}
}

/*
 * A periodic fires while its last event looks unread: that look refreshes
 * the room, which the walk of the taken periodics (not run yet) can bring
 * down to 0 from what the last pass left. The event was then written
 * anyway, into a full ring, and the room's count wrapped (an assertion in
 * chimed's build: any client could stop the broker; fuzz_chan found it,
 * 2026-12-02). It waits for room instead, and comes once the walk is done.
 */
Test(chan, a_periodics_look_at_its_last_event_that_fills_the_room_holds_it)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t per;
	unsigned got = 0, periods = 0;

	/* the head moves ahead of the walk's start, no periodic among the events: no walk */
	for (unsigned i = 0; i < CQ / 2; i++)
		(void)arm(c, 1, T0 + 1 * MS, 0, i);
	step_at(T0 + 1 * MS);
	while (take(c, &e) == 1)
		got++;
	cr_assert_eq(got, CQ / 2);
	step_at(T0 + 1 * MS);
	cr_assert_eq(c->ch.room, CQ, "the whole ring free");
	/* a periodic and one-shots fill the ring, the client takes them all, no service pass */
	per = arm(c, 2, T0 + 2 * MS, 5 * MS, 100);
	for (unsigned i = 0; i < CQ / 2 - 1; i++)
		(void)arm(c, 3, T0 + 2 * MS, 0, 200 + i);
	fire_at(T0 + 2 * MS);
	cr_assert_eq(c->m.ro->cq_tail, CQ, "%lu events", (unsigned long)c->m.ro->cq_tail);
	cr_assert_gt(c->ch.room, 0, "the room the last pass left");
	while (take(c, &e) == 1)
		periods += e.id == per;
	cr_assert_eq(periods, 1);
	/* its next period: the look at its last event finds no room left (the walk is to come) */
	fire_at(T0 + 7 * MS);
	cr_assert_eq(c->m.ro->cq_tail, CQ, "an event written into a ring with no room");
	cr_assert_lt(c->ch.room, CQ + 1, "the room's count wrapped: %u", c->ch.room);
	cr_assert_eq(c->ch.nr_backlog, 1, "the period is held");
	step_at(T0 + 7 * MS);
	cr_assert_eq(take(c, &e), 1, "the held period once the walk made room");
	cr_assert_eq(e.id, per);
	cr_assert_eq(e.deadline_ns, T0 + 7 * MS);
	cr_assert_eq(take(c, &e), 0);
}

/*
 * A parked session's rings went with its process, and the park applied
 * what waited in them: the tools show no records waiting for it. The
 * shard measures the depth of active channels only (shard.c, publish()),
 * so a session that went with records waiting showed them for good.
 */
Test(chan, a_park_leaves_no_records_waiting_in_the_counters)
{
	struct client_sim *c = &F.cl[0];

	arm(c, 1, T0 + 50 * MS, 0, 1);
	stats_client_sq(&F.st, c->ch.slot, 3);  /* as publish() measured it while the process lived */
	stats_publish(&F.st);
	cr_assert_eq(F.cpub[c->ch.slot].sq_depth, 3);
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	stats_publish(&F.st);
	cr_assert_eq(F.cpub[c->ch.slot].sq_depth, 0, "a parked session's ring is gone: nothing waits in it");
	cr_assert_eq(F.cpub[c->ch.slot].sq_depth_max, 3, "its high-water mark stays");
}

Test(chan, park_keeps_a_periodics_untaken_event)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t p = arm(c, 1, T0 + 1 * MS, 5 * MS, 9);
	uint64_t o = arm(c, 1, T0 + 2 * MS, 0, 8);

	step_at(T0 + 2 * MS);   /* both events in the ring, neither taken */
	for (int i = 0; !chan_park(&F.sc, &c->ch, 7); i++)      /* in steps of 7 nodes */
		cr_assert_lt(i, 100);
	cr_assert_eq(c->ch.nr_backlog, 2);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(p))->state, CHIME_NODE_BACKLOG);
	step_at(T0 + 20 * MS);
	cr_assert_eq(c->ch.nr_backlog, 2, "a held periodic does not fire again");
	reattach(c, false);
	step_at(T0 + 20 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, p, "ring order: the periodic fired first");
	cr_assert_eq(e.deadline_ns, T0 + 1 * MS, "the event it had, not a later one");
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, o);
	step_at(T0 + 20 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, p);
	cr_assert_eq(e.deadline_ns, T0 + 6 * MS, "then its next period, behind as it is");
}

/*
 * A periodic whose next firing is held behind its untaken event when the
 * session parks: the next process gets that event's period, then every
 * later one in order; none is lost. One whose event the process took gets
 * the held firing and what follows, and the taken one not again. Before,
 * the park voided the untaken event and kept the held firing at its own
 * deadline: its period never came.
 */
Test(chan, park_of_a_periodic_held_behind_its_event_loses_no_period)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t q = arm(c, 1, T0 + 1 * MS, 1 * MS, 8), p = arm(c, 1, T0 + 1 * MS + RES, 1 * MS, 9);
	uint64_t next_q = T0 + 2 * MS, next_p = T0 + 1 * MS + RES;

	step_at(T0 + 1 * MS + RES);     /* each one's first event in the ring */
	cr_assert_eq(chime_cq_take(&c->cons, &e), 1);
	cr_assert_eq(e.id, q, "q's first event taken (its head not released), p's left untaken");
	step_at(T0 + 2 * MS + RES);     /* the second periods: held behind them */
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(p))->state, CHIME_NODE_BACKLOG);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(q))->state, CHIME_NODE_BACKLOG);
	for (int i = 0; !chan_park(&F.sc, &c->ch, 7); i++)
		cr_assert_lt(i, 100);
	step_at(T0 + 20 * MS);
	reattach(c, false);
	for (int k = 0; k < 12; k++) {
		step_at(T0 + 20 * MS);
		cr_assert_eq(take(c, &e), 1, "event %d: none", k);
		if (e.id == p) {
			cr_assert_eq(e.deadline_ns, next_p, "p: deadline T0%+lld us, want T0%+lld",
				     (long long)(e.deadline_ns - T0) / 1000, (long long)(next_p - T0) / 1000);
			next_p += MS;
		} else {
			cr_assert_eq(e.id, q);
			cr_assert_eq(e.deadline_ns, next_q, "q: deadline T0%+lld us, want T0%+lld",
				     (long long)(e.deadline_ns - T0) / 1000, (long long)(next_q - T0) / 1000);
			next_q += MS;
		}
	}
	cr_assert_gt(next_p, T0 + 3 * MS, "p's periods came");
	cr_assert_gt(next_q, T0 + 3 * MS, "q's periods came");
}

/*
 * A park in steps (chan_park() with a budget of one node): its ring's last
 * look, its delivered one-shots, its sweep and the ring order each go over
 * many calls (a full 1M-slot ring held the shard 19-26 ms in one). The
 * next process gets what a park in one call gives back: the untaken events
 * in ring order, then the held ones, each once, and none it took.
 */
static void ring_full(struct client_sim *c)
{
	/* due one after another: they fire in this order */
	(void)arm(c, 1, T0 + RES, 50 * MS, 100);
	for (unsigned i = 0; i < 11; i++)
		(void)arm(c, 1, T0 + (i + 2) * RES, i % 4 ? 0 : 50 * MS, i);
}

static void take_two(struct client_sim *c)
{
	struct chime_cqe e;

	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(take(c, &e), 1);
}

static unsigned given_back(struct client_sim *c, uint64_t *ud, unsigned max)
{
	struct chime_cqe e;
	unsigned n = 0;

	reattach(c, false);
	for (int k = 0; k < 20; k++) {
		step_at(T0 + 2 * MS);
		while (n < max && take(c, &e) == 1)
			ud[n++] = e.user_data;
	}
	return n;
}

Test(chan, a_park_in_steps_gives_back_what_a_park_in_one_does)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	uint64_t in_steps[32], in_one[32];
	unsigned n_steps, n_one, calls = 0;

	client_init(b, 1);
	ring_full(a);
	ring_full(b);
	step_at(T0 + 2 * MS);   /* 8 in each ring (CQ), 4 held */
	cr_assert_eq(a->ch.nr_backlog, 4);
	take_two(a);
	take_two(b);
	step_at(T0 + 2 * MS);   /* 2 freed, 2 more delivered, 2 held */
	cr_assert_eq(a->ch.nr_backlog, 2);
	take_two(a);            /* taken, the shard has not seen it yet */
	take_two(b);
	cr_assert(chan_park(&F.sc, &b->ch, 1u << 20));
	while (!chan_park(&F.sc, &a->ch, 1)) {
		cr_assert_lt(++calls, 1000);
		step_at(T0 + 2 * MS);   /* passes between the steps, nothing new due */
	}
	cr_assert_gt(calls, 10, "the park went in %u steps", calls);
	n_steps = given_back(a, in_steps, 32);
	n_one = given_back(b, in_one, 32);
	cr_assert_eq(n_steps, 8, "%u events given back: 6 untaken in the ring, 2 held", n_steps);
	cr_assert_eq(n_one, n_steps);
	for (unsigned i = 0; i < n_one; i++)
		cr_assert_eq(in_steps[i], in_one[i], "event %u: user_data %lu in steps, %lu in one", i,
			     (unsigned long)in_steps[i], (unsigned long)in_one[i]);
}

/*
 * Events restored as "delivered, maybe taken" (three, at old positions
 * 0..2), their session re-attached by a resuming process that has not
 * written its word yet.
 */
static void resumed_without_word(struct client_sim *c, uint64_t *id)
{
	struct chan_settle *st = malloc(3 * sizeof(*st));
	struct chime_node *n;

	cr_assert_not_null(st);
	for (unsigned i = 0; i < 3; i++)
		id[i] = arm(c, 1, T0 + 1 * MS, 0, i);
	step_at(T0 + 2 * MS);   /* in the ring */
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	cr_assert_eq(c->ch.nr_backlog, 3);
	/* As restore.c leaves them: delivered at old positions 0..2, maybe taken. */
	for (unsigned i = 0; i < 3; i++) {
		n = wheel_node(&F.sc.wh, chime_id_index(id[i]));
		n->cq_pos = CHAN_POS_OLD | i;
		st[i] = (struct chan_settle){ .pos = i, .idx = chime_id_index(id[i]),
					      .gen = n->gen & CHIME_ID_GEN_MASK };
	}
	chan_settle_set(&c->ch, st, 3);
	reattach(c, true);
}

/*
 * After a crash the new broker holds the events the old one had delivered
 * until the resuming process says which it took (restore.c, "settle"). A
 * stop that parks the session after the process wrote its word but before
 * the shard read it must settle by it: before, the park held them all
 * again, and the broker after it delivered the taken ones a second time.
 */
Test(chan, a_park_settles_restored_events_by_a_word_that_came)
{
	struct client_sim *c = &F.cl[0];
	struct chime_node *n;
	uint64_t id[3];

	resumed_without_word(c, id);
	/* The process took the first two, and says so; the broker stops before any service. */
	c->m.rw->resume_cq_head = 2;
	__atomic_store_n(&c->m.rw->resume_set, 1u, __ATOMIC_RELEASE);
	c->ch.handover = 1;
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	cr_assert_eq(c->ch.nr_backlog, 1, "%llu held: the two taken events are held again",
		     (unsigned long long)c->ch.nr_backlog);
	n = wheel_node(&F.sc.wh, chime_id_index(id[2]));
	cr_assert_eq(n->state, CHIME_NODE_BACKLOG);
	cr_assert_eq(n->cq_pos, CHIME_POS_NONE, "settled: no old position left for the next broker");
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(id[0]))->state, CHIME_NODE_FREE);
}

/*
 * A resuming library whose welcome comes too late (its 10 s) hangs up and
 * resumes again, with the claim words of the ring it still has. The park
 * of the connection it gave up must leave the restored events waiting for
 * that word: before, it settled them all as untaken, and the events the
 * process had taken came a second time (restart/a_broker_killed_while_it_
 * settles_a_living_process_s_events_delivers_each_once, under load).
 */
Test(chan, a_park_before_a_resuming_process_s_word_keeps_its_restored_events_waiting_for_it)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t id[3];

	resumed_without_word(c, id);
	park_and_reattach(c, true);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(id[i]))->cq_pos, CHAN_POS_OLD | i,
			     "event %u settled without the word: a broker stopped now has nothing to wait for", i);
	/* The process took the first two, and says so this time. */
	c->m.rw->resume_cq_head = 2;
	__atomic_store_n(&c->m.rw->resume_set, 1u, __ATOMIC_RELEASE);
	step_at(T0 + 3 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, id[2], "a taken event came again");
	cr_assert_eq(take(c, &e), 0, "a taken event came again");
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(id[0]))->state, CHIME_NODE_FREE);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(id[1]))->state, CHIME_NODE_FREE);
}

/* ... and if another process attaches instead, it gets all of them: nothing says which were taken. */
Test(chan, restored_events_left_waiting_by_a_park_go_to_the_next_process_if_it_does_not_resume)
{
	struct client_sim *c = &F.cl[0];
	unsigned seen[3] = { 0 };
	struct chime_cqe e;
	uint64_t id[3];

	resumed_without_word(c, id);
	park_and_reattach(c, false);
	step_at(T0 + 3 * MS);
	while (take(c, &e) == 1)
		for (unsigned i = 0; i < 3; i++)
			seen[i] += e.id == id[i];
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(seen[i], 1, "event %u came %u times", i, seen[i]);
}

/*
 * A resuming process's records are applied only after its word on the
 * events the old broker delivered (chan_drain()). Until then they are no
 * work either: chan_pending() said "pending" for them, so a client that
 * published without its word kept its shard from ever sleeping, looping
 * on records it could not apply.
 */
Test(chan, records_before_a_resuming_process_s_word_wait_without_keeping_the_shard_awake)
{
	struct client_sim *c = &F.cl[0];
	uint64_t id;

	(void)arm(c, 1, T0 + 1000 * MS, 0, 1);
	step_at(T0 + MS);
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	reattach(c, true);
	id = arm(c, 2, T0 + 2000 * MS, 0, 2);          /* no resume_set: the word has not come */
	cr_assert_eq(chan_drain(&F.sc, &c->ch, 1000), 0, "a record applied before the process's word");
	cr_assert_not(chan_pending(&F.sc, &c->ch), "records waiting for the word keep the shard awake");
	__atomic_store_n(&c->m.rw->resume_set, 1u, __ATOMIC_RELEASE);
	cr_assert(chan_pending(&F.sc, &c->ch), "the word came: the record is work now");
	cr_assert_eq(chan_drain(&F.sc, &c->ch, 1000), 1);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(id))->state, CHIME_NODE_ARMED);
}

/*
 * A periodic whose event the process took before it went keeps that event's
 * position: a park that finds the ring empty does not sweep for it. Its new
 * process's ring must not have an event at that position for the periodic
 * to name: cancelling the periodic voided another timer's event there (the
 * new ring counted from 0 again), and that timer was lost (found by
 * fuzz_chan).
 */
Test(chan, a_periodic_cancelled_after_a_reattach_voids_no_other_timers_event)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t p = arm(c, 1, T0 + 1 * MS, 50 * MS, 9);
	uint64_t o;

	step_at(T0 + 2 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, p, "the periodic's first event, at position 0, taken");
	o = arm(c, 1, T0 + 3 * MS, 0, 8);
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));  /* applies the arm; every event taken: no sweep */
	step_at(T0 + 4 * MS);                           /* o fires while parked: held */
	reattach(c, false);
	step_at(T0 + 4 * MS);                           /* o delivered into the new ring */
	submit(c, CHIME_OP_CANCEL, p, 0, 0, 0, 0);
	step_at(T0 + 4 * MS);
	cr_assert_eq(take(c, &e), 1, "the one-shot's event was voided by the periodic's cancel");
	cr_assert_eq(e.id, o);
	cr_assert_eq(take(c, &e), 0);
}

Test(chan, park_keeps_untaken_events_and_reattach_delivers_them_in_order)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	uint64_t a = arm(c, 1, T0 + 1 * MS, 0, 1);
	uint64_t b = arm(c, 1, T0 + 2 * MS, 0, 2);
	uint64_t d = arm(c, 1, T0 + 3 * MS, 0, 3);
	uint64_t late = arm(c, 1, T0 + 10 * MS, 0, 4);
	uint64_t unread;

	step_at(T0 + 3 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, a, "the process took the first one");
	/* Its last record, never read by the shard: park applies it. */
	unread = arm(c, 1, T0 + 20 * MS, 0, 5);
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	cr_assert_eq(c->ch.owned, 4, "b, d, late, unread: no grant, not the taken one");
	cr_assert_eq(c->ch.nr_backlog, 2, "b and d are held again");
	cr_assert_eq(F.sc.backlog, 2);
	step_at(T0 + 10 * MS);
	cr_assert_eq(c->ch.nr_backlog, 3, "late fired while parked: held");
	cr_assert_eq(take(c, &e), 0, "nothing more reaches the old ring");
	reattach(c, false);
	cr_assert_eq(c->ch.owned, 4 + SQ, "new grants for the new ring");
	step_at(T0 + 10 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, b);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, d);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, late);
	cr_assert_eq(take(c, &e), 0);
	/* The old ids still work: the unread arm is cancelled by its id. */
	submit(c, CHIME_OP_CANCEL, unread, 0, 0, 0, 0);
	step_at(T0 + 30 * MS);
	cr_assert_eq(take(c, &e), 0, "a cancelled timer fired");
	cr_assert_eq(c->ch.owned, SQ, "everything consumed or cancelled: only the grants");
}

/*
 * A session's process killed while one thread held a reserved slot it had
 * not published: the arms its other threads published behind that slot
 * returned their ids, and the park applies them all the same.
 */
Test(chan, a_park_applies_what_other_threads_published_behind_a_slot_never_published)
{
	struct client_sim *c = &F.cl[0];
	struct chime_sqe *hole;
	uint64_t a, b, hole_pos = 0;

	step();
	/* One thread reserved an arm's slot, read its grant, and was killed before publishing. */
	hole = chime_sq_reserve(&c->prod, &hole_pos);
	cr_assert(hole);
	hole->op = CHIME_OP_ARM;
	hole->deadline_ns = T0 + 1 * MS;
	/* Two other threads' arms, published after it. */
	a = arm(c, 1, T0 + 2 * MS, 0, 1);
	b = arm(c, 1, T0 + 3 * MS, 0, 2);
	step();
	cr_assert_eq(c->ch.sq.head, hole_pos, "the shard waits at the reserved slot while the process lives");
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	cr_assert_eq(c->ch.sq.head, hole_pos + 3, "both records behind the hole applied");
	cr_assert_eq(c->ch.owned, 2, "a and b armed; every unused grant freed, the hole's too");
	step_at(T0 + 3 * MS);
	cr_assert_eq(c->ch.nr_backlog, 2, "a and b fired while parked: held for the next process");
	cr_assert_neq(a, b);
}

/* With nothing published behind it, a reserved slot is stepped over by nothing. */
Test(chan, a_park_with_only_an_unpublished_slot_at_the_head_applies_nothing)
{
	struct client_sim *c = &F.cl[0];
	uint64_t pos = 0;

	step();
	cr_assert(chime_sq_reserve(&c->prod, &pos));
	cr_assert(chan_park(&F.sc, &c->ch, 1u << 20));
	cr_assert_eq(c->ch.sq.head, pos);
	cr_assert_eq(c->ch.owned, 0, "no timer, and every grant freed");
}

/*
 * A session's process gone with its submission ring full of records not
 * applied yet: the park applies them in steps of its budget, as it sweeps,
 * not a whole ring (--sq-size, up to 1M) in its first call, a pass that
 * held every other timer of the shard back (hostile/a_session_that_goes_
 * with_a_full_submission_ring_...: 132 ms); up to the lap it began with.
 */
Test(chan, a_park_applies_the_records_left_in_its_ring_in_steps)
{
	struct client_sim *c = &F.cl[0];
	uint64_t id[SQ / 2], head;
	unsigned calls = 1;

	for (unsigned i = 0; i < SQ / 2; i++)
		id[i] = arm(c, 1, T0 + 10 * MS, 0, i);
	step();
	head = c->ch.sq.head;
	for (unsigned i = 0; i < SQ; i++)
		submit(c, CHIME_OP_RESET, id[i % (SQ / 2)], 0, T0 + (20 + i) * MS, 0, 0);
	/* a budget of 72 slab nodes: a few records' worth */
	cr_assert_not(chan_park(&F.sc, &c->ch, 72), "a ring of %u records applied in one call", SQ);
	cr_assert_lt(c->ch.sq.head - head, SQ, "the first call applied the whole ring");
	while (!chan_park(&F.sc, &c->ch, 72)) {
		cr_assert_lt(++calls, 100, "the park never ends");
		/* A writer still alive (its segment passed on): past the lap the park began with. */
		submit(c, CHIME_OP_NOP, 0, 0, 0, 0, 0);
	}
	cr_assert_eq(c->ch.sq.head, head + SQ, "every record of the lap applied, and none after it");
	for (unsigned i = 0; i < SQ / 2; i++)
		cr_assert_eq(F.sc.wh.nodes[chime_id_index(id[i])].deadline_ns, T0 + (20 + SQ / 2 + i) * MS,
			     "timer %u at its last reset's deadline", i);
	cr_assert_eq(c->ch.owned, SQ / 2, "the timers, and no grant left");
}


/* ---- wall-clock timers (ARCHITECTURE.md, "Wall-clock timers") ---- */

/*
 * The shard's wall-clock offset, so that the fake clock's T0 is the host's
 * wall clock minus `behind`: a wall deadline `behind` or more in the past
 * is due by the host's clock too, so the firing check lets it go.
 */
static int64_t wall_setup(uint64_t behind)
{
	int64_t off = (int64_t)(wall_now_ns() - T0 - behind);

	F.sc.wall_off[0] = F.sc.wall_off[1] = off;
	F.sc.wall_cur = 0;
	return off;
}

Test(chan, a_follow_moves_wall_clock_timers_in_every_state_and_no_other)
{
	struct client_sim *c = &F.cl[0];
	struct chime_shard_seg file = { 0 };
	int64_t off = wall_setup(10 * 1000 * MS);
	uint64_t w_armed, w_acked, w_periodic, mono;
	struct chime_node *na, *nk, *np, *nm;
	struct chime_cqe e;

	F.sc.wall_file = &file;
	w_armed = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, (uint64_t)off + T0 + 50 * MS, 0, 1);
	w_acked = submit(c, CHIME_OP_ARM_REALTIME, 0, 2, (uint64_t)off + T0 + 1 * MS, 0, 2);
	w_periodic = submit(c, CHIME_OP_ARM_REALTIME, 0, 3, (uint64_t)off + T0 + 2 * MS, 10 * MS, 3);
	mono = arm(c, 4, T0 + 50 * MS, 0, 4);
	step_at(T0 + 2 * MS);
	na = wheel_node(&F.sc.wh, chime_id_index(w_armed));
	nk = wheel_node(&F.sc.wh, chime_id_index(w_acked));
	np = wheel_node(&F.sc.wh, chime_id_index(w_periodic));
	nm = wheel_node(&F.sc.wh, chime_id_index(mono));
	cr_assert_eq(na->deadline_ns, T0 + 50 * MS, "the wheel's deadline: the wall one minus the offset");
	cr_assert_eq(nk->state, CHIME_NODE_ACKWAIT, "fired, its event not taken");
	cr_assert_eq(np->deadline_ns, T0 + 12 * MS, "fired once, next period on the wheel");
	cr_assert_eq(F.sc.wall_nodes, 3);

	/* The wall clock steps 50 ms forward: each wall-clock node 50 ms earlier on the wheel, whatever its state. */
	chan_wall_follow(&F.sc, off + 50 * (int64_t)MS);
	cr_assert_eq(na->deadline_ns, T0);
	cr_assert(wheel_node_due(&F.sc.wh, chime_id_index(w_armed)), "due now, at the next advance");
	cr_assert(na->gen & CHIME_NODE_IMMEDIATE, "made due by the step: its lateness is not the broker's");
	cr_assert_not(nm->gen & CHIME_NODE_IMMEDIATE);
	cr_assert_eq(nk->deadline_ns, T0 + 1 * MS - 50 * MS);
	cr_assert_eq(np->deadline_ns, T0 + 12 * MS - 50 * MS);
	cr_assert_eq(nm->deadline_ns, T0 + 50 * MS, "a monotonic timer does not move");
	cr_assert_eq(F.sc.wall_cur, 1);
	cr_assert_eq(file.wall_cur, 1);
	cr_assert_eq(file.wall_off[1], off + 50 * (int64_t)MS);
	cr_assert_eq(F.sc.wall_nodes, 3);

	/* Their events say their wall deadlines still; the moved one now due fires at the next pass. */
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, w_acked);
	cr_assert_eq(e.deadline_ns, (uint64_t)off + T0 + 1 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, w_periodic);
	cr_assert_eq(e.deadline_ns, (uint64_t)off + T0 + 2 * MS);
	step_at(T0 + 3 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, w_armed);
	cr_assert_eq(e.deadline_ns, (uint64_t)off + T0 + 50 * MS);
	/* the periodic: every period it missed (wall deadlines T0 + 12..52 ms), one at a time */
	for (uint64_t k = 1; k <= 5; k++) {
		cr_assert_eq(take(c, &e), 1, "period %llu", (unsigned long long)k);
		cr_assert_eq(e.id, w_periodic);
		cr_assert_eq(e.deadline_ns, (uint64_t)off + T0 + 2 * MS + k * 10 * MS);
		step_at(T0 + 3 * MS);
	}
	cr_assert_eq(take(c, &e), 0, "the monotonic timer is not due");
	submit(c, CHIME_OP_CANCEL, w_periodic, 0, 0, 0, 0);
	step_at(T0 + 3 * MS);
}

/*
 * The shard walks in steps (chan_wall_begin(), chan_wall_step()), so that
 * one user's wall-clock timers do not hold every other timer up for the
 * whole walk: the nodes not reached yet keep the old offset, those passed
 * and any armed meanwhile have the new one, and the last step makes it
 * the shard's (the file's too).
 */
Test(chan, a_walk_in_steps_moves_each_node_once_and_arms_meanwhile_take_the_new_offset)
{
	enum { N = 100 };
	struct client_sim *c = &F.cl[0];
	struct chime_shard_seg file = { 0 };
	int64_t off = wall_setup(10 * 1000 * MS), by = 50 * (int64_t)MS;
	uint64_t ids[N], late;
	struct chime_node *n;
	unsigned steps = 0;

	F.sc.wall_file = &file;
	for (unsigned i = 0; i < N; i++) {
		ids[i] = submit(c, CHIME_OP_ARM_REALTIME, 0, i, (uint64_t)off + T0 + 100 * MS + i, 0, i);
		if (i % 8 == 7 || i == N - 1)
			step_at(T0 + MS);       /* applied before the ring fills */
	}
	cr_assert_eq(F.sc.wall_nodes, N);
	chan_wall_begin(&F.sc, off + by);
	cr_assert(F.sc.wall_walking);
	cr_assert_eq(file.wall_off[1], off + by, "the new offset persisted before any node is on it");
	cr_assert(chan_wall_step(&F.sc, 10), "10 of 100 moved: more to go");
	for (unsigned i = 0; i < N; i++) {
		n = wheel_node(&F.sc.wh, chime_id_index(ids[i]));
		cr_assert_eq(n->deadline_ns, T0 + 100 * MS + i - (i < 10 ? (uint64_t)by : 0), "node %u", i);
		cr_assert_eq(!!(n->gen & CHIME_NODE_WALL_B), i < 10, "node %u's base", i);
	}
	cr_assert_eq(F.sc.wall_cur, 0, "the shard's offset is the old one until the walk ends");
	cr_assert_eq(file.wall_cur, 0);

	/* armed meanwhile: on the new offset at once, and not moved again */
	late = submit(c, CHIME_OP_ARM_REALTIME, 0, N, (uint64_t)off + T0 + 300 * MS, 0, N);
	step_at(T0 + MS);
	n = wheel_node(&F.sc.wh, chime_id_index(late));
	cr_assert_eq(n->deadline_ns, T0 + 300 * MS - (uint64_t)by);
	while (chan_wall_step(&F.sc, 10))
		steps++;
	cr_assert_eq(steps, 8, "the rest in steps of 10");
	cr_assert_not(F.sc.wall_walking);
	cr_assert_eq(F.sc.wall_cur, 1);
	cr_assert_eq(file.wall_cur, 1);
	cr_assert_eq(F.sc.wall_nodes, N + 1);
	cr_assert_eq(n->deadline_ns, T0 + 300 * MS - (uint64_t)by);
	for (unsigned i = 0; i < N; i++) {
		n = wheel_node(&F.sc.wh, chime_id_index(ids[i]));
		cr_assert_eq(n->deadline_ns, T0 + 100 * MS + i - (uint64_t)by, "node %u", i);
	}

	/* A step while one is under way leaves that one to its steps, then walks to the newest offset. */
	chan_wall_begin(&F.sc, off);
	cr_assert(chan_wall_step(&F.sc, 10));
	chan_wall_begin(&F.sc, off - by);
	cr_assert(F.sc.wall_walking);
	cr_assert_eq(F.sc.wall_cur, 1, "the walk to `off` goes on in its steps, not ended at once");
	while (chan_wall_step(&F.sc, 10))
		;
	cr_assert_eq(F.sc.wall_cur, 1);
	for (unsigned i = 0; i < N; i++) {
		n = wheel_node(&F.sc.wh, chime_id_index(ids[i]));
		cr_assert_eq(n->deadline_ns, T0 + 100 * MS + i + (uint64_t)by, "node %u", i);
	}
	n = wheel_node(&F.sc.wh, chime_id_index(late));
	cr_assert_eq(n->deadline_ns, T0 + 300 * MS + (uint64_t)by);
}

/* Of ids[0..n), how many are on offset 1 (CHIME_NODE_WALL_B): moved by a walk from offset 0. */
static unsigned wall_on_b(const uint64_t *ids, unsigned n)
{
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++)
		k += (wheel_node(&F.sc.wh, chime_id_index(ids[i]))->gen & CHIME_NODE_WALL_B) != 0;
	return k;
}

/*
 * A step of the wall clock while a walk is under way (steps closer
 * together than a walk lasts: a VM agent's, ten a second) leaves the walk
 * to its steps, and the next one follows it, to the latest offset: ending
 * it at once, in the pass that saw the step, held the shard for the rest
 * of it (up to a whole walk of one user's wall-clock timers). Every node
 * keeps its wall deadline through the offset its base names meanwhile.
 */
Test(chan, a_step_during_a_walk_leaves_the_rest_of_it_to_its_steps)
{
	enum { N = 100 };
	struct client_sim *c = &F.cl[0];
	struct chime_shard_seg file = { 0 };
	int64_t off = wall_setup(10 * 1000 * MS), by = 50 * (int64_t)MS;
	uint64_t ids[N];
	unsigned steps = 0, moved;

	F.sc.wall_file = &file;
	for (unsigned i = 0; i < N; i++) {
		ids[i] = submit(c, CHIME_OP_ARM_REALTIME, 0, i, (uint64_t)off + T0 + 100 * MS + i, 0, i);
		if (i % 8 == 7 || i == N - 1)
			step_at(T0 + MS);
	}
	chan_wall_begin(&F.sc, off + by);
	cr_assert(chan_wall_step(&F.sc, 10));
	chan_wall_begin(&F.sc, off + 2 * by);
	chan_wall_begin(&F.sc, off + 3 * by);   /* two steps in a walk: the latest is the one taken */
	moved = 0;
	for (unsigned i = 0; i < N; i++)
		moved += wheel_node(&F.sc.wh, chime_id_index(ids[i]))->deadline_ns != T0 + 100 * MS + i;
	cr_assert_eq(moved, 10, "%u of %u moved by the steps' begins and the walk's step of 10: the walk under way "
		     "was ended at once", moved, N);
	cr_assert_eq(wall_on_b(ids, N), 10);
	cr_assert(F.sc.wall_walking);
	for (unsigned i = 0; i < N; i++) {
		const struct chime_node *n = wheel_node(&F.sc.wh, chime_id_index(ids[i]));

		cr_assert_eq(n->deadline_ns + (uint64_t)F.sc.wall_off[(n->gen & CHIME_NODE_WALL_B) != 0],
			     (uint64_t)off + T0 + 100 * MS + i, "node %u off its wall deadline", i);
	}
	while (chan_wall_step(&F.sc, 10))
		steps++;
	cr_assert_eq(steps, 8 + 10, "the rest of the first walk in steps of 10, then all of the next");
	cr_assert_not(F.sc.wall_walking);
	cr_assert_eq(F.sc.wall_off[F.sc.wall_cur], off + 3 * by);
	cr_assert_eq(file.wall_cur, F.sc.wall_cur);
	for (unsigned i = 0; i < N; i++) {
		const struct chime_node *n = wheel_node(&F.sc.wh, chime_id_index(ids[i]));

		cr_assert_eq(n->deadline_ns, T0 + 100 * MS + i - 3 * (uint64_t)by, "node %u", i);
		cr_assert_eq(!!(n->gen & CHIME_NODE_WALL_B), F.sc.wall_cur, "node %u's base", i);
	}
}

/*
 * A wall-clock timer the wheel pops early by a step the shard has not
 * followed yet (a step back, seen by the shard before the control thread
 * publishes it): the shard begins the walk to the offset it measures,
 * in steps as any, and moves the early node alone at once. It walked all
 * of the shard's wall-clock timers there, inside the firing, in one go.
 */
Test(chan, a_wall_clock_timer_found_early_begins_a_walk_in_steps)
{
	enum { N = 100 };
	struct client_sim *c = &F.cl[0];
	/* The shard believes the wall clock 500 ms ahead of the host's: its timers come due 500 ms early. */
	int64_t off = wall_setup(0) + 500 * (int64_t)MS;
	uint64_t ids[N], far = wall_now_ns() + 3600 * 1000 * MS, wall_deadline, id;
	struct chime_node *n;
	struct chime_cqe e;
	unsigned moved;

	F.sc.wall_off[0] = F.sc.wall_off[1] = off;
	for (unsigned i = 0; i < N; i++) {
		ids[i] = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, far + i, 0, i);
		if (i % 8 == 7 || i == N - 1)
			step_at(T0);
	}
	wall_deadline = wall_now_ns() + 300 * MS;
	id = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, wall_deadline, 0, N);
	step_at(T0);
	cr_assert_eq(take(c, &e), 0, "fired 300 ms before its wall deadline");
	n = wheel_node(&F.sc.wh, chime_id_index(id));
	cr_assert(n->gen & CHIME_NODE_WALL_B, "the early node is moved at once");
	cr_assert_eq(n->deadline_ns + (uint64_t)F.sc.wall_off[1], wall_deadline);
	cr_assert_gt(n->deadline_ns, F.sc.wh.w->now_ns, "back on the wheel, not due");
	moved = wall_on_b(ids, N);
	cr_assert_eq(moved, 0, "%u of the other %u wall-clock timers moved in the firing", moved, N);
	cr_assert(F.sc.wall_walking, "the walk goes on in the shard's next passes");
	while (chan_wall_step(&F.sc, 10))
		;
	cr_assert_eq(F.sc.wall_cur, 1);
	cr_assert_eq(wall_on_b(ids, N), N);
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(ids[i]))->deadline_ns + (uint64_t)F.sc.wall_off[1],
			     far + i, "node %u", i);
}

/*
 * A wall-clock arm during a walk, when the list cannot grow (realloc()
 * fails): the shard scans the slab from then on, and the walk under way
 * with it. Going on over list positions as if they were nodes, it left
 * the nodes it missed on the old offset, and the next walk overwrote that
 * offset: 200 of 1024 timers 100 ms off their wall deadline (a review).
 * realloc() is replaced for this binary, not under the sanitizers (theirs).
 */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static size_t fail_realloc_of;  /* the size of the next realloc() to refuse, once */
extern void *__libc_realloc(void *p, size_t n);

void *realloc(void *p, size_t n);
void *realloc(void *p, size_t n)
{
	if (fail_realloc_of && (n == fail_realloc_of || fail_realloc_of == 1)) {
		fail_realloc_of = 0;
		return NULL;
	}
	return __libc_realloc(p, n);
}

Test(chan, a_list_that_cannot_grow_during_a_walk_leaves_no_node_behind)
{
	enum { N = 1024 };      /* the list's first capacity: the next wall-clock arm grows it */
	struct client_sim *c = &F.cl[0];
	struct chime_shard_seg file = { 0 };
	int64_t off = wall_setup(10 * 1000 * MS), by = 50 * (int64_t)MS;
	static uint64_t ids[N];
	unsigned behind = 0, off_by = 0;

	F.sc.wall_file = &file;
	/* monotonic timers first: the list's positions are not the nodes' indices */
	for (unsigned i = 0; i < 200; i++) {
		arm(c, 2, T0 + 100 * 1000 * MS, 0, i);
		if (i % 8 == 7)
			step_at(T0);
	}
	for (unsigned i = 0; i < N; i++) {
		ids[i] = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, (uint64_t)off + T0 + 100 * 1000 * MS + i, 0, i);
		if (i % 8 == 7)
			step_at(T0);
	}
	cr_assert_eq(F.sc.wall_len, N);
	cr_assert_eq(F.sc.wall_cap, N);
	chan_wall_begin(&F.sc, off + by);
	cr_assert(chan_wall_step(&F.sc, 10));
	fail_realloc_of = (size_t)2 * N * sizeof(uint32_t);
	submit(c, CHIME_OP_ARM_REALTIME, 0, 1, (uint64_t)off + T0 + 200 * 1000 * MS, 0, N);
	step_at(T0);
	cr_assert(F.sc.wall_scan, "the list could not grow: the shard scans the slab from now on");
	while (chan_wall_step(&F.sc, 10))
		;
	cr_assert_eq(F.sc.wall_cur, 1);
	for (unsigned i = 0; i < N; i++)
		behind += !(wheel_node(&F.sc.wh, chime_id_index(ids[i]))->gen & CHIME_NODE_WALL_B);
	/* the next step of the wall clock takes the offset any left behind are still on */
	chan_wall_begin(&F.sc, off + 2 * by);
	while (chan_wall_step(&F.sc, 10))
		;
	for (unsigned i = 0; i < N; i++) {
		const struct chime_node *n = wheel_node(&F.sc.wh, chime_id_index(ids[i]));

		off_by += n->deadline_ns + (uint64_t)(off + 2 * by) != (uint64_t)off + T0 + 100 * 1000 * MS + i;
	}
	cr_assert_eq(behind + off_by, 0, "%u of %u wall-clock timers left on the old offset by the walk, %u off "
		     "their wall deadline after the next one (wall_nodes %llu)", behind, N, off_by,
		     (unsigned long long)F.sc.wall_nodes);
	cr_assert_eq(F.sc.wall_nodes, N + 1);
}

/*
 * The stepped walk against random arms, resets and cancels of wall-clock
 * timers, clock steps (a second one mid-walk too), walk steps of 1-40
 * nodes, a list that cannot grow (from then on a scan) and restores: after
 * each, every live node gives its wall-clock deadline through the offset
 * its base bit names, in the shard and in the file (a crash then restores
 * it right). Written by a review of the stepped walk, which found nothing.
 */
static uint64_t fz_state = 88172645463325252ull;
static uint64_t fz(void)
{
	fz_state ^= fz_state << 13;
	fz_state ^= fz_state >> 7;
	fz_state ^= fz_state << 17;
	return fz_state;
}

static void fz_check(const struct chime_shard_seg *file, const uint64_t *ids, const uint64_t *walls,
		     const bool *live, unsigned n, const char *when, unsigned it)
{
	for (unsigned i = 0; i < n; i++) {
		const struct chime_node *nd;
		unsigned b;

		if (!live[i])
			continue;
		nd = wheel_node(&F.sc.wh, chime_id_index(ids[i]));
		cr_assert(nd->gen & CHIME_NODE_REALTIME, "%s it %u: node %u not realtime", when, it, i);
		b = (nd->gen & CHIME_NODE_WALL_B) != 0;
		cr_assert_eq(nd->deadline_ns + (uint64_t)F.sc.wall_off[b], walls[i],
			     "%s it %u: node %u (bit %u, cur %u, walking %d, scan %d) off its wall deadline by %lld",
			     when, it, i, b, F.sc.wall_cur, F.sc.wall_walking, F.sc.wall_scan,
			     (long long)(nd->deadline_ns + (uint64_t)F.sc.wall_off[b] - walls[i]));
		cr_assert_eq(nd->deadline_ns + (uint64_t)file->wall_off[b], walls[i],
			     "%s it %u: node %u: a crash now restores it off its wall deadline", when, it, i);
		if (!F.sc.wall_walking && !F.sc.wall_mixed)
			cr_assert_eq(b, F.sc.wall_cur, "%s it %u: node %u on the other offset with no walk", when, it, i);
	}
}

/* A restore, as shard.c's start and restore.c do it: the offsets from the file, mixed, the list from the slab. */
static void fz_restore(const struct chime_shard_seg *file)
{
	chan_wall_fini(&F.sc);
	F.sc.wall_scan = false;
	F.sc.wall_walking = false;
	F.sc.wall_next_set = false;
	F.sc.wall_nodes = 0;
	F.sc.wall_off[0] = file->wall_off[0];
	F.sc.wall_off[1] = file->wall_off[1];
	F.sc.wall_cur = file->wall_cur;
	F.sc.wall_mixed = true;
	for (uint32_t i = 0; i < F.sc.wh.w->high_water; i++) {
		const struct chime_node *nd = wheel_node(&F.sc.wh, i);

		if (nd->state != CHIME_NODE_FREE && (nd->gen & CHIME_NODE_REALTIME)) {
			F.sc.wall_nodes++;
			chan_wall_note(&F.sc, i);
		}
	}
}

Test(chan, a_walk_in_steps_keeps_every_node_through_random_operations_steps_and_restores, .timeout = 120)
{
	enum { N = 3000, ITERS = 40000 };
	struct client_sim *c = &F.cl[0];
	static struct chime_shard_seg file;
	int64_t off = wall_setup(10 * 1000 * MS), cur_off = off;
	static uint64_t ids[N], walls[N];
	static bool live[N];
	unsigned nlive = 0, walks = 0, scan_its = 0, restores = 0;

	memset(&file, 0, sizeof(file));
	file.wall_off[0] = file.wall_off[1] = off;
	F.sc.wall_file = &file;
	for (unsigned it = 0; it < ITERS; it++) {
		unsigned r = (unsigned)(fz() % 100), i = (unsigned)(fz() % N);

		scan_its += F.sc.wall_scan;

		if (r < 55) {
			if (live[i]) {
				if (fz() % 2) {
					submit(c, CHIME_OP_CANCEL, ids[i], 0, 0, 0, 0);
					live[i] = false;
					nlive--;
				} else {
					walls[i] = (uint64_t)off + T0 + 100 * 1000 * MS + fz() % (1000 * MS);
					submit(c, CHIME_OP_RESET, ids[i], 0, walls[i], 0, 0);
				}
			} else {
				walls[i] = (uint64_t)off + T0 + 100 * 1000 * MS + fz() % (1000 * MS);
				ids[i] = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, walls[i], 0, i);
				live[i] = true;
				nlive++;
			}
			if (it == ITERS / 2)
				fail_realloc_of = 1;     /* the next realloc() fails, whatever its size */
			step_at(T0);
			fz_check(&file, ids, walls, live, N, "drain", it);
		} else if (r < 90) {
			(void)chan_wall_step(&F.sc, 1 + (uint32_t)(fz() % 40));
			fz_check(&file, ids, walls, live, N, "step", it);
		} else if (r < 98) {
			cur_off = off + (int64_t)(fz() % (10 * 1000 * MS)) - 5 * 1000 * (int64_t)MS;
			chan_wall_begin(&F.sc, cur_off);
			walks += F.sc.wall_walking;
			fz_check(&file, ids, walls, live, N, "begin", it);
		} else {
			fz_restore(&file);
			restores++;
			fz_check(&file, ids, walls, live, N, "restore", it);
		}
	}
	step_at(T0);
	while (chan_wall_step(&F.sc, 100))
		;
	fz_check(&file, ids, walls, live, N, "end", ITERS);
	fail_realloc_of = 0;
	/* what it went through: else it checked less than it says */
	cr_assert_gt(restores, 100);
	cr_assert_gt(walks, 100);
	cr_assert_gt(scan_its, 0, "no scan: the list never failed to grow");
	cr_assert_gt(nlive, N / 4);
	cr_assert_geq(F.sc.wall_nodes, nlive);
}
#endif

Test(chan, a_wall_clock_timer_due_early_by_the_wall_clock_goes_back_until_it_is_due)
{
	struct client_sim *c = &F.cl[0];
	/* The shard believes the wall clock 500 ms ahead of the host's: its timers come due 500 ms early. */
	int64_t off = wall_setup(0) + 500 * (int64_t)MS;
	uint64_t wall_deadline, id;
	struct chime_node *n;
	struct chime_cqe e;

	F.sc.wall_off[0] = F.sc.wall_off[1] = off;
	wall_deadline = wall_now_ns() + 300 * MS;
	id = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, wall_deadline, 0, 1);
	step_at(T0);
	n = wheel_node(&F.sc.wh, chime_id_index(id));
	cr_assert_eq(take(c, &e), 0, "fired 300 ms before its wall deadline");
	cr_assert_eq(n->state, CHIME_NODE_ARMED, "back on the wheel");
	cr_assert_eq(n->deadline_ns + (uint64_t)F.sc.wall_off[(n->gen & CHIME_NODE_WALL_B) != 0], wall_deadline,
		     "based on the offset the shard measured, the same wall deadline");
	cr_assert_gt(n->deadline_ns, F.sc.wh.w->now_ns);
}

/*
 * The same park, of wall-clock periodics: the broker reads back the
 * deadlines of its own completion slots, which hold wall-clock deadlines
 * for these, through the shard's offset. Read as monotonic ones, p's
 * untaken event matched no period of it, and the park only voided it: that
 * period never came.
 */
Test(chan, park_of_a_wall_clock_periodic_held_behind_its_event_loses_no_period)
{
	struct client_sim *c = &F.cl[0];
	uint64_t off = (uint64_t)wall_setup(10 * 1000 * MS);
	struct chime_cqe e;
	uint64_t q = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, off + T0 + 1 * MS, 1 * MS, 8);
	uint64_t p = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, off + T0 + 1 * MS + RES, 1 * MS, 9);
	uint64_t next_q = off + T0 + 2 * MS, next_p = off + T0 + 1 * MS + RES;

	step_at(T0 + 1 * MS + RES);
	cr_assert_eq(chime_cq_take(&c->cons, &e), 1);
	cr_assert_eq(e.id, q);
	step_at(T0 + 2 * MS + RES);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(p))->state, CHIME_NODE_BACKLOG);
	for (int i = 0; !chan_park(&F.sc, &c->ch, 7); i++)
		cr_assert_lt(i, 100);
	step_at(T0 + 20 * MS);
	reattach(c, false);
	for (int k = 0; k < 12; k++) {
		step_at(T0 + 20 * MS);
		cr_assert_eq(take(c, &e), 1, "event %d: none", k);
		if (e.id == p) {
			cr_assert_eq(e.deadline_ns, next_p, "p: deadline T0%+lld us, want T0%+lld",
				     (long long)(e.deadline_ns - off - T0) / 1000, (long long)(next_p - off - T0) / 1000);
			next_p += MS;
		} else {
			cr_assert_eq(e.id, q);
			cr_assert_eq(e.deadline_ns, next_q, "q: deadline T0%+lld us, want T0%+lld",
				     (long long)(e.deadline_ns - off - T0) / 1000, (long long)(next_q - off - T0) / 1000);
			next_q += MS;
		}
	}
}

/*
 * A step forward past the boot of a wall-clock periodic: on the wheel it
 * goes whole periods ahead, to its first deadline after the boot, and
 * keeps its phase (realtime/a_periodic_stepped_before_the_boot_keeps_its_phase);
 * but an event of it already fired and held (the ring full) is that
 * event: it goes out with the deadline that fired (the boot, as the
 * monotonic clock holds it), never with a later period's, which would be
 * ahead of the wall clock.
 */
Test(chan, a_step_past_the_boot_moves_a_wall_clock_periodic_by_periods_but_not_its_held_event)
{
	struct client_sim *c = &F.cl[0];
	int64_t off = wall_setup(10 * 1000 * MS), by = (int64_t)(T0 + 500 * MS);
	uint64_t period = 100 * 1000 * MS, ids[CQ], w, held, armed;
	struct chime_cqe e;

	for (unsigned i = 0; i < CQ; i++)
		ids[i] = arm(c, 0, T0 + MS, 0, i);
	w = (uint64_t)off + T0 + 2 * MS;
	held = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, w, period, 1);
	armed = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, w + 400 * MS, period, 2);
	step_at(T0 + 2 * MS);
	cr_assert_eq(c->m.ro->backlog, 1, "the periodic's first event held: the ring is full");
	/* the boot moves 500 ms past T0 + 2 ms: both deadlines fall before it */
	chan_wall_follow(&F.sc, off + by);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(armed))->deadline_ns,
		     T0 + 402 * MS + period - (uint64_t)by, "on the wheel: a period ahead, its phase kept");
	for (unsigned i = 0; i < CQ; i++) {
		cr_assert_eq(take(c, &e), 1);
		cr_assert(e.user_data < CQ && e.id == ids[e.user_data], "a one-shot's event");
	}
	step_at(T0 + 3 * MS);
	cr_assert_eq(take(c, &e), 1, "the held event");
	cr_assert_eq(e.id, held);
	cr_assert_leq(e.deadline_ns, (uint64_t)(off + by) + 1,
		      "the held event's deadline %+lld ms past the boot: a later period's",
		      (long long)(e.deadline_ns - (uint64_t)(off + by)) / (long long)MS);
	submit(c, CHIME_OP_CANCEL, held, 0, 0, 0, 0);
	submit(c, CHIME_OP_CANCEL, armed, 0, 0, 0, 0);
	step_at(T0 + 3 * MS);
}

/*
 * A broker killed in the middle of a walk leaves nodes based on either
 * offset, each saying which (CHIME_NODE_WALL_B): the next follow moves
 * each from its own, so that every wall deadline stays where it was.
 */
Test(chan, a_follow_moves_each_wall_clock_timer_from_its_own_offset)
{
	struct client_sim *c = &F.cl[0];
	int64_t off = wall_setup(10 * 1000 * MS), moved = off - 7 * (int64_t)MS;
	uint64_t wa = (uint64_t)off + T0 + 50 * MS, wb = (uint64_t)off + T0 + 60 * MS;
	uint64_t a = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, wa, 0, 1);
	uint64_t b = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, wb, 0, 2);
	struct chime_node *na, *nb;

	step();
	na = wheel_node(&F.sc.wh, chime_id_index(a));
	nb = wheel_node(&F.sc.wh, chime_id_index(b));
	/* As a walk to `moved` leaves them when killed after b: b on offset 1, a still on 0. */
	F.sc.wall_off[1] = moved;
	wheel_reset(&F.sc.wh, chime_id_index(b), wb - (uint64_t)moved);
	nb->gen |= CHIME_NODE_WALL_B;
	F.sc.wall_nodes = 2;
	F.sc.wall_mixed = true;         /* as shard.c restores a file */

	chan_wall_follow(&F.sc, off + 3 * (int64_t)MS);
	cr_assert_eq(na->deadline_ns + (uint64_t)(off + 3 * (int64_t)MS), wa);
	cr_assert_eq(nb->deadline_ns + (uint64_t)(off + 3 * (int64_t)MS), wb);
	cr_assert_eq(!!(na->gen & CHIME_NODE_WALL_B), F.sc.wall_cur);
	cr_assert_eq(!!(nb->gen & CHIME_NODE_WALL_B), F.sc.wall_cur);
}

/*
 * Early by a slew the shard has not followed (a wall clock running slow):
 * the timer waits for the wall clock on the expired list, its deadline as
 * it was, with no walk of the slab; then it fires.
 */
Test(chan, a_wall_clock_timer_early_by_a_slew_waits_without_a_walk)
{
	struct client_sim *c = &F.cl[0];
	/*
	 * The shard believes the wall clock 1.5 s ahead of the host's, and
	 * waits for up to 10 s (the shard's 1 ms is too close to this host's
	 * scheduling noise for a test): its timer comes due 1 s early.
	 */
	int64_t off = wall_setup(0) + 1500 * (int64_t)MS;
	uint64_t wall_deadline, id;
	struct chime_node *n;
	struct chime_cqe e;

	F.sc.wall_off[0] = F.sc.wall_off[1] = off;
	F.sc.wall_wait_ns = 10 * 1000 * MS;
	wall_deadline = wall_now_ns() + 1000 * MS;
	id = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, wall_deadline, 0, 1);
	step_at(T0);
	n = wheel_node(&F.sc.wh, chime_id_index(id));
	cr_assert_eq(take(c, &e), 0, "fired before its wall deadline");
	cr_assert(wheel_node_due(&F.sc.wh, chime_id_index(id)), "waiting, due");
	cr_assert_eq(n->deadline_ns + (uint64_t)off, wall_deadline, "its deadline as it was");
	cr_assert_eq(F.sc.wall_cur, 0, "no walk");
	step_at(T0);
	cr_assert_eq(take(c, &e), 0, "fired before its wall deadline");
	wall_pin(wall_deadline);        /* the wall clock gets there */
	step_at(T0);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, id);
	cr_assert_eq(e.deadline_ns, wall_deadline);
}

/*
 * A walk visits the wall-clock timers' nodes from a list, not the slab: a
 * node whose wall-clock timer ended and that a monotonic timer took is
 * dropped from it, not moved; one a wall-clock timer took again is on it
 * once. Without memory for the list, a walk scans the slab, the same.
 */
static void walk_list_case(bool scan)
{
	struct client_sim *c = &F.cl[0];
	int64_t off = wall_setup(10 * 1000 * MS);
	uint64_t a, m, b;
	struct chime_cqe e;

	F.sc.wall_scan = scan;
	a = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, (uint64_t)off + T0 + 1 * MS, 0, 1);
	step_at(T0 + 1 * MS);
	cr_assert_eq(take(c, &e), 1);
	cr_assert_eq(e.id, a);
	step();         /* consumed: its node is free, for a grant of the slots after it */
	for (int i = 0;; i++) {
		cr_assert_lt(i, 2 * (int)SQ, "its node was not taken again");
		m = arm(c, 2, T0 + 50 * MS, 0, 2);
		step();
		if (chime_id_index(m) == chime_id_index(a))
			break;
	}
	b = submit(c, CHIME_OP_ARM_REALTIME, 0, 3, (uint64_t)off + T0 + 60 * MS, 0, 3);
	step();
	chan_wall_follow(&F.sc, off + 5 * (int64_t)MS);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(m))->deadline_ns, T0 + 50 * MS, "a monotonic timer moved");
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(b))->deadline_ns, T0 + 55 * MS);
	cr_assert_eq(F.sc.wall_nodes, 1);
	if (!scan)
		cr_assert_eq(F.sc.wall_len, 1, "the ended timer's node still listed");
	chan_wall_follow(&F.sc, off);
	cr_assert_eq(wheel_node(&F.sc.wh, chime_id_index(b))->deadline_ns, T0 + 60 * MS);
}

Test(chan, a_walk_visits_the_wall_clock_timers_from_a_list_or_the_slab)
{
	walk_list_case(false);
}

Test(chan, a_walk_without_a_list_scans_the_slab_the_same)
{
	walk_list_case(true);
}

/* The slab's armed wall-clock timers (chan_counts_as_armed(), flagged): what armed_realtime must say. */
static uint64_t wall_armed_in_slab(void)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < F.sc.wh.w->high_water; i++) {
		const struct chime_node *nd = wheel_node(&F.sc.wh, i);

		n += nd->state != CHIME_NODE_FREE && (nd->gen & CHIME_NODE_REALTIME) && chan_counts_as_armed(nd);
	}
	return n;
}

#define WALL_ARMED_IS_THE_SLABS(what) \
	cr_assert_eq(F.st.sh.armed_realtime, wall_armed_in_slab(), "%s: counted %llu, the slab %llu", what, \
		     (unsigned long long)F.st.sh.armed_realtime, (unsigned long long)wall_armed_in_slab())

/*
 * armed_realtime follows the wall-clock timers among the armed ones through
 * every way in and out: arms, fires (one-shots out, periodics not), a ring
 * full (held), resets of fired one-shots (back in), cancels and a
 * cancel-by-key, and a reclaim whose client's timers also fire meanwhile.
 */
Test(chan, armed_realtime_counts_the_armed_wall_clock_timers_through_every_state)
{
	struct client_sim *a = &F.cl[0], *b = &F.cl[1];
	int64_t off = wall_setup(10 * 1000 * MS);      /* the host's wall clock is ahead: none is early */
	uint64_t ids[12];
	struct chime_cqe e;
	unsigned i;

	client_init(b, 1);
	for (i = 0; i < 12; i++) {
		ids[i] = submit(a, CHIME_OP_ARM_REALTIME, 0, i % 3, (uint64_t)off + T0 + (1 + i % 4) * MS,
				i % 4 == 0 ? 2 * MS : 0, i);  /* some periodic */
		if (i % 4 == 3)
			step_at(T0);
	}
	for (i = 0; i < 4; i++) {
		arm(a, 0, T0 + (1 + i) * MS, 0, 100 + i);
		submit(a, CHIME_OP_ARM_REALTIME, 0, 7, (uint64_t)off + T0 + 40 * MS, 0, 200 + i);
		if (i < 2)      /* still on the wheel when the reclaim sweeps it */
			submit(a, CHIME_OP_ARM_REALTIME, 0, 8, (uint64_t)off + T0 + 1000 * MS, 0, 300 + i);
		submit(b, CHIME_OP_ARM_REALTIME, 0, 0, (uint64_t)off + T0 + 100 * MS, 0, i);
	}
	step_at(T0);
	cr_assert_eq(F.st.sh.armed_realtime, 22, "18 of client a, 4 of b; not the 4 monotonic");
	WALL_ARMED_IS_THE_SLABS("armed");
	step_at(T0 + 5 * MS);
	cr_assert_eq(a->m.ro->cq_tail, CQ, "the ring full");
	cr_assert_gt(a->m.ro->backlog, 0, "the rest held");
	WALL_ARMED_IS_THE_SLABS("fired, delivered and held");
	cr_assert_eq(F.st.sh.armed_realtime, 3 + 4 + 2 + 4, "the periodics, and the later ones");
	/* A one-shot delivered and one held, reset: armed again (the first event untaken, voided) */
	cr_assert_eq(take(a, &e), 1);
	submit(a, CHIME_OP_RESET, ids[1], 0, (uint64_t)off + T0 + 30 * MS, 0, 0);
	submit(a, CHIME_OP_RESET, ids[11], 0, (uint64_t)off + T0 + 30 * MS, 0, 0);
	step();
	WALL_ARMED_IS_THE_SLABS("reset after firing");
	/* Cancels of an armed one, a periodic, and a fired one; then key 7's by key */
	submit(a, CHIME_OP_CANCEL, ids[1], 0, 0, 0, 0);
	submit(a, CHIME_OP_CANCEL, ids[4], 0, 0, 0, 0);
	submit(a, CHIME_OP_CANCEL, ids[2], 0, 0, 0, 0);
	submit(a, CHIME_OP_CANCEL_KEY, 0, 7, 0, 0, 0);
	for (i = 0; i < 4; i++)
		step();
	WALL_ARMED_IS_THE_SLABS("cancels");
	cr_assert_gt(F.st.sh.armed_realtime, 4, "some of client a's left");
	/* a goes: its timers on the wheel fire while its reclaim sweeps in small steps */
	i = 0;
	while (!chan_reclaim(&F.sc, &a->ch, 3)) {
		step_at(T0 + (31 + i++) * MS);
		WALL_ARMED_IS_THE_SLABS("reclaimed in part");
	}
	cr_assert_eq(F.st.sh.armed_realtime, 4, "client b's alone");
	WALL_ARMED_IS_THE_SLABS("reclaimed");
}

/*
 * Walks of random lengths by connections of three users, ended in their
 * step or not, with connections detached mid-walk and new ones attached:
 * the walk list stays whole (every queued walk on it once, walk_tail its
 * last) and every walk ends (a review of walk_pick()).
 */
static void walk_list_check(unsigned it)
{
	unsigned n = 0, queued = 0;
	struct chan *last = NULL;

	for (struct chan *c = F.sc.walk_head; c; last = c, c = c->walk_next) {
		cr_assert(c->walk_queued, "it %u: a walk on the list not queued", it);
		cr_assert_leq(++n, NSIM, "it %u: a cycle in the walk list", it);
	}
	cr_assert_eq(F.sc.walk_tail, last, "it %u: walk_tail is not the list's last", it);
	for (int k = 0; k < NSIM; k++)
		queued += F.cl[k].rw && F.cl[k].ch.walk_queued;
	cr_assert_eq(queued, n, "it %u: %u walks queued, %u on the list", it, queued, n);
}

Test(chan, the_walk_list_stays_whole_through_random_walks_detaches_and_attaches)
{
	static uint64_t st = 0x9E3779B97F4A7C15ull;
#define RND() (st ^= st << 13, st ^= st >> 7, st ^= st << 17, st)

	for (uint16_t k = 1; k < NSIM; k++)
		client_init_uid(&F.cl[k], k, k % 3);
	for (int k = 0; k < NSIM; k++)
		submit(&F.cl[k], CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);
	step();
	for (unsigned it = 0; it < 20000; it++) {
		F.sc.walk_budget = 1 + (unsigned)(RND() % 4);
		for (int k = 0; k < NSIM; k++) {
			struct client_sim *c = &F.cl[k];

			if (RND() % 50 == 0) {
				while (!chan_reclaim(&F.sc, &c->ch, 1 + (uint32_t)(RND() % 64)))
					walk_list_check(it);
				chan_fini(&c->ch);
				free(c->rw);
				free(c->ro);
				memset(c, 0, sizeof(*c));
				client_init_uid(c, (uint16_t)k, (uint32_t)(RND() % 3));
				submit(c, CHIME_OP_CANCEL_KEY, 0, 12345, 0, 0, 0);
				continue;
			}
			if (!c->ch.walk_queued && RND() % 3 == 0) {
				unsigned a = (unsigned)(RND() % 7);

				for (unsigned j = 0; j < a; j++)
					arm(c, 9, T0 + 3600 * MS, 0, 1);
				submit(c, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
			}
		}
		step();
		walk_list_check(it);
	}
	for (unsigned i = 0; F.sc.walk_head && i < 10000; i++) {
		step();
		walk_list_check(i);
	}
	cr_assert_null(F.sc.walk_head, "walks left");
	for (uint16_t k = 0; k < NSIM; k++)
		cr_assert_eq(armed_of(k, 9), 0, "client %u: timers of key 9 left", k);
#undef RND
}

/*
 * A broker killed inside op_arm() of a wall-clock ARM (the node ALLOC,
 * its base bit set for offset 1, its deadline not stored): the restore
 * carries it as a grant, the next broker's first walk makes offset 0
 * current, and the process re-submits the ARM. It kept the stale base,
 * so the next step's walk, overwriting offset 1, left it there: it fired
 * a whole step early (a review).
 */
Test(chan, a_wall_clock_arm_resubmitted_after_a_kill_takes_the_current_offset)
{
	struct client_sim *c = &F.cl[0];
	static struct chime_shard_seg file;
	int64_t off = wall_setup(0), o1 = off + 2 * (int64_t)MS, o2 = o1 - 1000 * (int64_t)MS;
	uint64_t W = T0 + 500 * MS + (uint64_t)o1, x, pos = 0;
	struct chime_node *nx;
	struct chime_sqe *s;
	struct chime_cqe e;
	uint32_t ix;

	memset(&file, 0, sizeof(file));
	file.wall_off[0] = file.wall_off[1] = off;
	F.sc.wall_file = &file;
	wall_pin(T0 + (uint64_t)off);
	submit(c, CHIME_OP_ARM_REALTIME, 0, 1, T0 + 3600 * 1000 * MS + (uint64_t)off, 0, 1);  /* a walk has work */
	step_at(T0);
	chan_wall_follow(&F.sc, o1);    /* the old broker followed a step: offset 1 current */
	wall_pin(T0 + (uint64_t)o1);
	cr_assert_eq(F.sc.wall_cur, 1);
	x = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, W, 0, 3);
	step_at(T0);
	ix = chime_id_index(x);
	nx = wheel_node(&F.sc.wh, ix);
	cr_assert(nx->gen & CHIME_NODE_WALL_B);
	/* killed inside op_arm(): ALLOC, REALTIME | WALL_B, the grant's deadline 0; restore_nodes() carries it */
	wheel_cancel(&F.sc.wh, ix);
	nx->deadline_ns = 0;
	chan_carry(&F.sc, &c->ch, ix);
	/* the next broker: the file's offsets, read as mixed (wall_init()), and only the kept nodes listed (restore_nodes()) */
	chan_wall_fini(&F.sc);
	F.sc.wall_nodes = 0;
	F.sc.wall_off[0] = file.wall_off[0];
	F.sc.wall_off[1] = file.wall_off[1];
	F.sc.wall_cur = file.wall_cur;
	F.sc.wall_mixed = true;
	for (uint32_t i = 0; i < F.sc.wh.w->high_water; i++) {
		const struct chime_node *nd = wheel_node(&F.sc.wh, i);

		if (nd->state != CHIME_NODE_FREE && nd->state != CHIME_NODE_GRANTED && (nd->gen & CHIME_NODE_REALTIME)) {
			F.sc.wall_nodes++;
			chan_wall_note(&F.sc, i);
		}
	}
	/* its first pass follows the offset of now: a walk, offset 0 current */
	chan_wall_follow(&F.sc, o1);
	cr_assert_eq(F.sc.wall_cur, 0);
	/* the process re-submits its ARM, by the id it was given */
	s = chime_sq_reserve(&c->prod, &pos);
	*s = (struct chime_sqe){ .op = CHIME_OP_ARM_REALTIME, .id = x, .key = 1, .deadline_ns = W, .user_data = 3 };
	chime_sq_publish(s, pos);
	step_at(T0 + 1 * MS);
	cr_assert_eq(nx->state, CHIME_NODE_ARMED, "the re-submitted arm applied");
	cr_assert_not(nx->gen & CHIME_NODE_WALL_B, "re-armed on offset 1, the shard's current one 0");
	/* the wall clock steps 1 s back; 500 ms later it reads W - 1 s: nothing due */
	wall_pin(T0 + 1 * MS + (uint64_t)o2);
	chan_wall_follow(&F.sc, o2);
	wall_pin(T0 + 500 * MS + (uint64_t)o2);
	step_at(T0 + 500 * MS);
	cr_assert_eq(take(c, &e), 0, "fired with the wall clock at W%+lld ms (event deadline W%+lld ms)",
		     (long long)(wall_now_ns() - W) / (long long)MS, (long long)(e.deadline_ns - W) / (long long)MS);
}

/*
 * A broker killed with a wall-clock timer popped by the wheel (ALLOC, its
 * monotonic deadline passed) before wall_early() judged it: the wall clock
 * was stepped back and the shard had not followed, so it was not due. The
 * restore took it for fired and delivered it at once, a whole step early
 * (a review); it goes back on the wheel, and fires when the wall clock
 * reaches it.
 */
Test(chan, a_restore_does_not_deliver_a_popped_wall_clock_timer_before_its_wall_deadline)
{
	struct client_sim *c = &F.cl[0];
	int64_t off = wall_setup(0), back = off - 1000 * (int64_t)MS;
	uint64_t W = T0 + 500 * MS + (uint64_t)off, y;
	struct restore_stats rs;
	struct chime_cqe e;
	uint32_t buf[8];

	wall_pin(T0 + (uint64_t)off);
	y = submit(c, CHIME_OP_ARM_REALTIME, 0, 1, W, 0, 2);
	step_at(T0);
	/* the wall clock steps 1 s back, not followed yet; the wheel pops the timer at W's old monotonic deadline */
	F.now = T0 + 500 * MS;
	wall_pin(F.now + (uint64_t)back);
	wheel_advance(&F.sc.wh, F.now);
	cr_assert_eq(wheel_pop_expired(&F.sc.wh, buf, 8), 1);
	cr_assert_eq(buf[0], chime_id_index(y));
	/* killed there: restored, and the next broker's first pass follows the offset of now */
	cr_assert_eq(restore_nodes(&F.sc, F.sc.wh.w->now_ns, &rs), 0);
	chan_wall_follow(&F.sc, back);
	step_at(F.now);
	cr_assert_eq(take(c, &e), 0, "delivered with the wall clock at W%+lld ms",
		     (long long)(wall_now_ns() - W) / (long long)MS);
	/* a second of the monotonic clock on, the wall clock is at W: it fires, once */
	F.now += 1000 * MS;
	wall_pin(F.now + (uint64_t)back);
	step_at(F.now);
	cr_assert_eq(take(c, &e), 1, "not delivered once the wall clock reached it");
	cr_assert_eq(e.id, y);
	cr_assert_eq(take(c, &e), 0, "delivered twice");
}

/* ---- a park in steps, cut by a stop, or killed: every event once (a review's model test) ---- */

struct park_model {
	uint64_t id, deadline, period, next;
	unsigned got;
};

static struct park_model PM[16];
static unsigned NPM;
static char pm_fail[512];       /* the first violation, "" none */

/* An event taken by the old process or the next one, judged against the model. */
static void pm_take(const struct chime_cqe *e, const char *who)
{
	for (unsigned i = 0; i < NPM; i++) {
		struct park_model *m = &PM[i];

		if (m->id != e->id)
			continue;
		if (pm_fail[0])
			return;
		if (!m->period && m->got)
			snprintf(pm_fail, sizeof(pm_fail), "%s: one-shot %u came twice", who, i);
		else if (!m->period && e->deadline_ns != m->deadline)
			snprintf(pm_fail, sizeof(pm_fail), "%s: one-shot %u's deadline", who, i);
		else if (m->period && e->deadline_ns != m->next)
			snprintf(pm_fail, sizeof(pm_fail), "%s: periodic %u deadline T0%+lld us, want T0%+lld us", who, i,
				 (long long)(e->deadline_ns - T0) / 1000, (long long)(m->next - T0) / 1000);
		else if (e->fired_ns < e->deadline_ns)
			snprintf(pm_fail, sizeof(pm_fail), "%s: timer %u early", who, i);
		m->next = e->deadline_ns + m->period;
		m->got++;
		return;
	}
	if (!pm_fail[0])
		snprintf(pm_fail, sizeof(pm_fail), "%s: unknown id %#llx", who, (unsigned long long)e->id);
}

/* The next broker over the same slab, as shard.c's restore() builds it. */
static void restart_over_the_slab(struct client_sim *c, uint64_t now)
{
	uint64_t old_now = F.sc.wh.w->now_ns;
	struct wheel_rebuild_stats ws;
	struct restore_stats rs;

	chan_fini(&c->ch);
	stats_fini(&F.st);
	keyidx_walks_fini(&F.sc.ki);
	chan_wall_fini(&F.sc);
	wheel_fini(&F.sc.wh);
	memset(&F.sc, 0, sizeof(F.sc));
	memset(F.by_slot, 0, sizeof(F.by_slot));
	memset(F.users, 0, sizeof(F.users));
	memset(F.user_of_slot, 0, sizeof(F.user_of_slot));
	memset(&F.pub, 0, sizeof(F.pub));
	memset(F.cpub, 0, sizeof(F.cpub));
	memset(F.heads, 0, 1024 * sizeof(uint32_t));
	cr_assert_eq(stats_init_blocks(&F.st, &F.pub, F.cpub, MAXCL, 1, 0), 0);
	F.sc.st = &F.st;
	F.sc.by_slot = F.by_slot;
	F.sc.capacity = CAP;
	F.sc.max_clients = MAXCL;
	F.sc.quota = UINT64_MAX;
	F.sc.users = F.users;
	F.sc.user_of_slot = F.user_of_slot;
	cr_assert_eq(keyidx_walks_init(&F.sc.ki, MAXCL), 0);
	cr_assert_eq(chan_restore_init(&F.sc, &c->ch, 0, 1, 0, UINT64_MAX, SQ), 0);
	cr_assert_eq(wheel_rebuild(&F.sc.wh, F.wmem, wheel_region_size(CAP), CAP, RES, now, &ws), 0);
	wheel_group_owners(&F.sc.wh, F.user_of_slot);
	keyidx_init(&F.sc.ki, F.heads, 1024, F.sc.wh.nodes, 0);
	cr_assert_eq(restore_nodes(&F.sc, old_now, &rs), 0);
}

/* The session's next process: resuming (the old ring's claim words and head copied, as libchime does) or new. */
static void next_process(struct client_sim *c, bool resume)
{
	uint64_t claims[CQ], head = c->cons.head;

	memcpy(claims, c->m.claim, sizeof(claims));
	reattach(c, resume);
	if (resume) {
		memcpy(c->m.claim, claims, sizeof(claims));
		c->m.rw->resume_claims = 1;
		c->m.rw->resume_cq_head = head;
		__atomic_store_n(&c->m.rw->resume_set, 1u, __ATOMIC_RELEASE);
	}
}

enum park_end { PARK_WHOLE, PARK_CUT, PARK_KILLED };

/*
 * One round: one-shots and periodics fire into an 8-slot ring while the
 * process takes some (claimed and released, or, with claim_only, some
 * only claimed), then it goes; the park runs in steps of a random budget,
 * timers firing between them, and ends whole, cut by a stop (then a
 * restart) or killed (a restart); the next process, resuming or not,
 * takes the rest. Every one-shot exactly once, every periodic's periods
 * in order, none early.
 */
static void park_round(unsigned seed, enum park_end how, bool resume, bool claim_only)
{
	struct client_sim *c = &F.cl[0];
	struct chime_cqe e;
	unsigned r = seed;
	uint64_t now = T0;

	NPM = 4 + rand_r(&r) % 12;
	for (unsigned i = 0; i < NPM; i++) {
		uint64_t d = T0 + (1 + rand_r(&r) % 30) * RES;
		uint64_t p = rand_r(&r) % 3 == 0 ? (3 + rand_r(&r) % 8) * RES : 0;

		PM[i] = (struct park_model){ .deadline = d, .period = p, .next = d };
		PM[i].id = arm(c, i, d, p, i);
	}
	for (unsigned k = 0, nk = 1 + rand_r(&r) % 6; k < nk; k++) {
		now += (rand_r(&r) % 12) * RES;
		step_at(now);
		for (unsigned t = rand_r(&r) % 6; t--;) {
			if (claim_only && rand_r(&r) % 2) {
				if (chime_cq_take(&c->cons, &e) != 1)
					break;
				pm_take(&e, "old process (claimed only)");
			} else {
				if (take(c, &e) != 1)
					break;
				pm_take(&e, "old process");
			}
		}
		if (rand_r(&r) % 2)
			chime_cq_release(&c->cons);
	}
	if (!claim_only)
		chime_cq_release(&c->cons);
	{
		uint32_t budget = 1 + rand_r(&r) % 40;
		unsigned stop_at = rand_r(&r) % 30, calls = 0;
		bool done = false;

		c->ch.handover = resume;
		while (!done && !(how != PARK_WHOLE && calls == stop_at)) {
			done = chan_park(&F.sc, &c->ch, budget);
			calls++;
			if (rand_r(&r) % 2) {
				now += (rand_r(&r) % 5) * RES;
				fire_at(now);
			}
			cr_assert_lt(calls, 100000, "the park never ends");
		}
		if (how == PARK_CUT && !done)
			chan_park_cut(&F.sc, &c->ch);
		if (how != PARK_WHOLE) {
			now += (rand_r(&r) % 5) * RES;
			restart_over_the_slab(c, now);
		}
	}
	now += (rand_r(&r) % 5) * RES;
	next_process(c, resume);
	if (now < T0 + 31 * RES)
		now = T0 + 31 * RES;
	for (unsigned k = 0; k < 400; k++) {
		step_at(now);
		while (take(c, &e) == 1)
			pm_take(&e, "next process");
		if (k == 200)
			now += 10 * RES;
	}
	for (unsigned i = 0; i < NPM && !pm_fail[0]; i++) {
		if (!PM[i].period && PM[i].got != 1)
			snprintf(pm_fail, sizeof(pm_fail), "one-shot %u came %u times", i, PM[i].got);
		else if (PM[i].period && PM[i].next + PM[i].period <= now)
			snprintf(pm_fail, sizeof(pm_fail), "periodic %u: next T0%+lld us at T0%+lld us: periods lost", i,
				 (long long)(PM[i].next - T0) / 1000, (long long)(now - T0) / 1000);
	}
}

static void park_rounds(enum park_end how, bool resume, bool claim_only)
{
	for (unsigned seed = 1; seed <= 400; seed++) {
		pm_fail[0] = 0;
		park_round(seed, how, resume, claim_only);
		cr_assert_eq(pm_fail[0], 0, "seed %u (end %d, resume %d, claim only %d): %s", seed, how, resume,
			     claim_only, pm_fail);
		teardown();
		setup();
	}
}

Test(chan, a_park_in_steps_with_fires_between_gives_every_event_once)
{
	park_rounds(PARK_WHOLE, false, true);
	park_rounds(PARK_WHOLE, true, true);
}

/*
 * Cut by a stop: what the process took is settled, the rest restored. The
 * periodics were left to the restore, unswept, and an event only claimed
 * (its head not yet released) came again to a new process (a review).
 */
Test(chan, a_park_cut_by_a_stop_gives_every_event_once)
{
	park_rounds(PARK_CUT, true, true);
	park_rounds(PARK_CUT, false, false);
	park_rounds(PARK_CUT, false, true);
}

/* Killed mid-park: a resuming process's word settles every event (a new one's is not exactly once: "Sessions and restarts"). */
Test(chan, a_park_killed_midway_gives_a_resuming_process_every_event_once)
{
	park_rounds(PARK_KILLED, true, true);
}

/*
 * A stop that cuts a park short while the session's last CANCEL_KEY is
 * still in its steps: the process took two of four delivered one-shots
 * and died. The cut returned at the walk and settled nothing, and the
 * restore gave all four to the next process (a review).
 */
Test(chan, a_park_cut_during_a_cancel_key_walk_gives_back_only_what_was_not_taken)
{
	struct client_sim *c = &F.cl[0];
	bool taken[4] = { false };
	struct chime_cqe e;
	unsigned got = 0;
	uint64_t id[4];

	F.sc.index_budget = 1;
	F.sc.walk_budget = 1;
	for (unsigned i = 0; i < 4; i++)
		id[i] = arm(c, 1, T0 + 1 * MS, 0, i);
	for (unsigned i = 0; i < 10; i++)
		(void)arm(c, 9, T0 + 1000 * MS, 0, 100 + i);   /* not due: what the walk indexes */
	step_at(T0 + 1 * MS);                                   /* the four in the ring */
	for (unsigned t = 0; t < 2; t++) {
		cr_assert_eq(take(c, &e), 1);
		for (unsigned i = 0; i < 4; i++)
			taken[i] |= e.id == id[i];
	}
	(void)submit(c, CHIME_OP_CANCEL_KEY, 0, 9, 0, 0, 0);
	/* the process dies; the park's first call; then the stop gives up on it */
	cr_assert_not(chan_park(&F.sc, &c->ch, 1u << 20), "the park ended in its first call: no walk in steps");
	chan_park_cut(&F.sc, &c->ch);
	restart_over_the_slab(c, T0 + 2 * MS);
	next_process(c, false);
	for (unsigned k = 0; k < 20; k++) {
		step_at(T0 + 2 * MS);
		while (take(c, &e) == 1)
			for (unsigned i = 0; i < 4; i++)
				if (e.id == id[i]) {
					got++;
					cr_assert_not(taken[i], "one-shot %u, taken by the process that died, came again", i);
				}
	}
	cr_assert_eq(got, 2, "%u of the 2 untaken one-shots came", got);
}

/* ---- the touch table (ARCHITECTURE.md, "Keepalive resets without a record") ---- */

/* A client of its own user with a touch table (words, then tags), resident: written, as libchime's. */
static void touch_client_init(struct client_sim *c, uint16_t slot)
{
	size_t words = CAP * sizeof(uint64_t), len = words + CAP * sizeof(uint32_t);

	client_mem(c);
	c->touch = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
	cr_assert_not_null(c->touch);
	memset(c->touch, 0, len);
	c->m.touch_word = c->touch;
	c->m.touch_tag = (uint32_t *)((char *)c->touch + words);
	cr_assert_eq(chan_attach(&F.sc, &c->ch, &c->m, slot, 1, slot, F.user_quota), 0);
	client_rings(c);
}

/* A reset of id to d through the table, as libchime's first one: the word, then a RESET_TOUCH. */
static void touch_reset(struct client_sim *c, uint64_t id, uint64_t d)
{
	c->m.touch_word[chime_id_index(id)] = d;
	(void)submit(c, CHIME_OP_RESET_TOUCH, id, 0, d, 0, 0);
}

/*
 * The shard's part while a RESET_TOUCH of c waits for its run (touch_hold()):
 * the populate the aside thread would make, done at once, and the ring
 * drained again, until nothing waits.
 */
static void touch_mapped(struct client_sim *c)
{
	struct chan_populate p;

	for (;;) {
		if (c->ch.touch_pop)
			chan_touch_populated(&c->ch, 0);
		chan_drain(&F.sc, &c->ch, 1000);
		if (!c->ch.touch_hold)
			return;
		if (!chan_touch_check(&F.sc, &c->ch, &p))
			chan_touch_unhold(&c->ch);
	}
}

/*
 * A client's records wait behind its first reset of a timer whose run is
 * being mapped (touch_hold()). A reset among them of another timer, due
 * meanwhile, made well before that timer's deadline: the timer fired at
 * the deadline the reset moved, and the reset, applied once the run was
 * mapped, voided that event and armed it again (two fires counted and two
 * events delivered for one the application saw).
 */
Test(chan, a_reset_waiting_behind_a_first_reset_moves_its_timer_before_the_old_deadline_fires_it)
{
	struct client_sim *c = &F.cl[1];
	uint64_t far = now_ns() + 3600000 * MS;         /* touch_hold() reads the clock */
	struct chan_populate p;
	struct chime_cqe e;
	uint64_t a, b[2];

	touch_client_init(c, 1);
	a = arm(c, 1, far, 0, 1);
	for (unsigned i = 0; i < 2; i++)
		b[i] = arm(c, 2, T0 + 2 * MS, 0, 2 + i);
	step_at(T0);
	touch_reset(c, a, far + MS);                    /* its run not mapped yet: waits */
	for (unsigned i = 0; i < 2; i++)
		touch_reset(c, b[i], T0 + 50 * MS);     /* behind it, 2 ms before their deadline */
	chan_drain(&F.sc, &c->ch, 1000);
	cr_assert(c->ch.touch_hold, "the first reset did not wait for its run");
	cr_assert(chan_touch_check(&F.sc, &c->ch, &p), "no populate for the run");
	step_at(T0 + 3 * MS);                           /* their old deadline passes before the populate is done */
	touch_mapped(c);
	step_at(T0 + 3 * MS);
	step_at(T0 + 50 * MS);
	for (unsigned i = 0; i < 2; i++) {
		cr_assert_eq(take(c, &e), 1, "%u of 2 timers fired", i);
		cr_assert(e.id == b[0] || e.id == b[1]);
		cr_assert_eq(e.deadline_ns, T0 + 50 * MS, "fired for +%llu ms",
			     (unsigned long long)(e.deadline_ns - T0) / MS);
	}
	cr_assert_eq(take(c, &e), 0, "a third event");
	cr_assert_eq(F.st.sh.fires, 2, "%llu fires counted for two", (unsigned long long)F.st.sh.fires);
	cr_assert_eq(F.st.sh.delivered, 2, "%llu events delivered for two", (unsigned long long)F.st.sh.delivered);
}

/*
 * While a RESET_TOUCH waits for its run's populate, the ring's head record
 * is no work: the populate's completion rings the shard's doorbell. Counted
 * as work, the shard neither slept nor yielded until the aside thread was
 * done, a populate of a page the client paged out included.
 */
Test(chan, a_reset_waiting_for_its_run_keeps_the_shard_awake_only_once_the_run_is_mapped)
{
	struct client_sim *c = &F.cl[1];
	uint64_t far = now_ns() + 3600000 * MS;
	struct chan_populate p;
	uint64_t a;

	touch_client_init(c, 1);
	a = arm(c, 1, far, 0, 1);
	step_at(T0);
	cr_assert_not(chan_pending(&F.sc, &c->ch));
	touch_reset(c, a, far + MS);
	cr_assert(chan_pending(&F.sc, &c->ch), "a record published is work");
	chan_drain(&F.sc, &c->ch, 1000);
	cr_assert(c->ch.touch_hold);
	cr_assert(chan_touch_check(&F.sc, &c->ch, &p));
	cr_assert_not(chan_pending(&F.sc, &c->ch), "the record waiting for the populate keeps the shard awake");
	chan_touch_populated(&c->ch, 0);
	cr_assert(chan_pending(&F.sc, &c->ch), "mapped: the record is work again");
	touch_mapped(c);
	cr_assert_eq(c->m.ro->sq_head, c->m.rw->sq_tail, "the record was not applied");
	cr_assert_eq(c->m.touch_tag[chime_id_index(a)], chime_id_gen(a) | CHIME_TOUCH_ON, "not flagged");
}

/*
 * A flagged timer whose word is later than its deadline but already past
 * when the shard reads it: it fires then, at the word's deadline. Put back
 * on the wheel there, it was due again at the next pass, where a word
 * moved again, still past, put it back again: a client bumping its word
 * kept its timer from firing and the shard re-arming it at every pass,
 * awake, without a record (the docs: at most one re-arm per timer per tick).
 */
Test(chan, a_word_moved_to_a_deadline_already_past_fires_the_timer_in_the_pass_that_reads_it)
{
	struct client_sim *c = &F.cl[1];
	uint64_t far = now_ns() + 3600000 * MS;
	struct chime_cqe e;
	uint64_t a, resets;
	unsigned pass;

	touch_client_init(c, 1);
	a = arm(c, 1, far, 0, 1);
	step_at(T0);
	touch_reset(c, a, far);
	touch_mapped(c);
	cr_assert_eq(c->m.touch_tag[chime_id_index(a)], chime_id_gen(a) | CHIME_TOUCH_ON, "not flagged");
	touch_reset(c, a, T0 + 5 * MS);                 /* earlier: a record, the node moved */
	step_at(T0);
	resets = F.st.sh.resets;
	for (pass = 0; pass < 100; pass++) {
		/* later than the deadline the shard last took, and past */
		c->m.touch_word[chime_id_index(a)] = T0 + 6 * MS + pass;
		step_at(T0 + 10 * MS);
		if (take(c, &e) == 1)
			break;
	}
	cr_assert_lt(pass, 100, "never fired in 100 passes, re-armed %llu times",
		     (unsigned long long)(F.st.sh.resets - resets));
	cr_assert_eq(pass, 0, "fired at pass %u", pass);
	cr_assert_eq(e.id, a);
	cr_assert_eq(e.deadline_ns, T0 + 6 * MS, "fired for +%llu ns", (unsigned long long)(e.deadline_ns - T0));
	cr_assert_leq(F.st.sh.resets - resets, 1, "re-armed %llu times", (unsigned long long)(F.st.sh.resets - resets));
	cr_assert_eq(F.st.sh.fires, 1);
}
