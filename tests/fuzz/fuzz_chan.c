/* SPDX-License-Identifier: MIT */
/*
 * fuzz_chan.c - libFuzzer target for everything the broker reads from a
 * client: the real broker/chan.c (with the real wheel, key index and
 * counters) on malloc'd memory, as tests/test_chan.c sets it up.
 *
 * The input is a program. Each step is one byte of opcode and its operands:
 * hostile clients (slots 1 and 2) write arbitrary submission records and seqs,
 * cq_head values, claim words, want_wakeup, grant words and the entries of
 * their touch tables (RESET_TOUCH records among theirs); an honest client
 * (slot 0) submits only well-formed records through shm/ring.h and keeps a
 * shadow model of its timers; the shard side calls chan_drain, chan_service(_n),
 * chan_pending, chan_park, chan_reattach, chan_reclaim and fires timers
 * through wheel_advance at a fuzz-chosen (monotonic) clock, in fuzz-chosen
 * order, staging the next cascade (wheel_stage) when a loop iteration ends.
 *
 * After every step the global invariants are checked (wheel_check, owned
 * counts, armed and backlog counts, grants); at the end the hostile clients
 * are reclaimed, the honest client's timers are run out and checked against
 * its shadow (each one-shot fires exactly once unless cancelled, never after
 * a cancel it saw applied, never early, never with another client's key or
 * user_data; the honest client also dies as a session and re-attaches, so
 * this covers the claim word's verdict at a park), and after reclaiming
 * every client the slab is entirely free.
 * A violation calls abort() so libFuzzer reports the input.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"
#include "keyidx.h"
#include "ring.h"
#include "segment.h"
#include "stats.h"
#include "wall.h"
#include "wheel.h"
#include "fuzz_input.h"

#define CAP     64u             /* small: a full slab (owed grants) is easy to reach */
#define RES     100000u         /* 100 us */
#define SQ      8u
#define CQ      8u
#define NCL     3u              /* slot 0 honest, 1 and 2 hostile */
#define HONEST  0u
#define T0      UINT64_C(1000000000)
#define MAXT    1024u           /* honest timers remembered per run */
#define MAXRS   8u              /* applied-deadline history per honest timer */
#define NONE    UINT64_MAX

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- the fuzz program ---- */

struct prog {
	const uint8_t *p;
	size_t n, off;
};

static uint64_t take_bytes(struct prog *g, unsigned nbytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < nbytes; i++)
		v |= (uint64_t)(g->off < g->n ? g->p[g->off++] : 0) << (8 * i);
	return v;
}

static uint8_t u8(struct prog *g)   { return (uint8_t)take_bytes(g, 1); }
static uint32_t u32(struct prog *g) { return (uint32_t)take_bytes(g, 4); }
static uint64_t u64(struct prog *g) { return take_bytes(g, 8); }

/* ---- the world: one shard, NCL clients ---- */

struct client {
	void *rw, *ro;
	struct chan_mem m;
	struct chan ch;
	struct chime_sq_prod prod;
	struct chime_cq_cons cons;
	void *touch;                    /* the hostile clients' touch tables (CAP words and tags, chime_shm.h) */
	bool attached;          /* ch is live (possibly dying) */
};

/* One honest timer: what the client asked for, by submission position. */
struct htimer {
	uint64_t id, key, ud, period;
	uint64_t rs_pos[MAXRS], rs_dl[MAXRS];   /* arm and resets: position, deadline */
	unsigned nrs;
	uint64_t cancel_pos;    /* first cancel (or cancel_key) submitted for it, or NONE */
	unsigned taken;
};

static struct {
	struct shard_core sc;
	struct stats st;
	struct chime_shard_stats pub;
	struct chime_client_stats cpub[NCL];
	struct chan *by_slot[NCL];
	struct chan_user users[NCL];
	uint16_t user_of_slot[NCL];
	void *wmem;
	uint32_t *heads;
	struct chime_client_geom g;
	struct client cl[NCL];
	uint64_t now;
	uint64_t user_quota;    /* every user's, brought by each attach */
	struct htimer t[MAXT];
	unsigned nt;
	uint64_t max_deadline;  /* latest honest deadline submitted */
	uint64_t hbase;         /* the honest client's earlier rings' positions (it re-attaches as a session) */
} W;

/* A client's segments, cleared, and its channel in them (chan_mem_layout()). */
static void client_mem(struct client *c)
{
	memset(c->rw, 0, W.g.rw_size);
	memset(c->ro, 0, W.g.ro_size);
	chan_mem_layout(&c->m, c->rw, c->ro, &W.g, 0);
}

static void client_rings(struct client *c)
{
	chime_sq_prod_init(&c->prod, c->m.sq_slots, &c->m.rw->sq_tail, SQ);
	chime_cq_cons_init(&c->cons, c->m.cq_slots, c->m.claim, &c->m.ro->cq_tail, &c->m.rw->cq_head, CQ);
	/* Where the segment says, as libchime does: a re-attach goes on from the last ring's positions. */
	c->cons.head = c->cons.tail = c->m.rw->cq_head;
}

/* The hostile clients are one user: their nodes count against one user quota. */
static uint32_t uid_of(uint16_t slot)
{
	return slot ? 1000 : 0;
}

static int client_attach(struct client *c, uint16_t slot)
{
	int r;

	client_mem(c);
	if (c->touch) {
		memset(c->touch, 0, CAP * CHIME_TOUCH_BYTES);
		c->m.touch_word = chime_touch_words(c->touch, 0, CAP);
		c->m.touch_tag = chime_touch_tags(c->touch, 1, 0, CAP);
	}
	r = chan_attach(&W.sc, &c->ch, &c->m, slot, 1, uid_of(slot), W.user_quota);
	if (r)
		return r;
	client_rings(c);
	c->attached = true;
	return 0;
}

/* A parked session's new process: new (zeroed) segments, the same channel (chan_reattach). */
static void client_reattach(struct client *c, bool resume)
{
	client_mem(c);
	chan_reattach(&W.sc, &c->ch, &c->m, resume);
	client_rings(c);
}

/* A grant a client may arm with: not a no-grant marker (slab full, quota reached). */
static bool grant_usable(uint64_t grant)
{
	return !chime_grant_is_marker(grant);
}

static void world_init(uint64_t quota, uint64_t user_quota, unsigned walk_budget)
{
	size_t wsz = wheel_region_size(CAP);
	uint32_t nb = keyidx_buckets_for(CAP);

	if (W.wmem) {
		/* Reuse the allocations between inputs; only the state is reset. */
		for (unsigned i = 0; i < NCL; i++)
			if (W.cl[i].attached)
				chan_fini(&W.cl[i].ch);
		stats_fini(&W.st);
		keyidx_walks_fini(&W.sc.ki);
		chan_wall_fini(&W.sc);
		wheel_fini(&W.sc.wh);
	} else {
		W.wmem = aligned_alloc(64, (wsz + 63) & ~(size_t)63);
		W.heads = calloc(nb, sizeof(uint32_t));
		W.g.nr_shards = 1;
		W.g.sq_size = SQ;
		W.g.cq_size = CQ;
		CHECK(chime_client_layout(&W.g) == 0, "layout");
		for (unsigned i = 0; i < NCL; i++) {
			W.cl[i].rw = aligned_alloc(4096, (W.g.rw_size + 4095) & ~(uint64_t)4095);
			W.cl[i].ro = aligned_alloc(4096, (W.g.ro_size + 4095) & ~(uint64_t)4095);
			W.cl[i].touch = i == HONEST ? NULL : calloc(CAP, CHIME_TOUCH_BYTES);
			CHECK(W.cl[i].rw && W.cl[i].ro && (i == HONEST || W.cl[i].touch), "out of memory");
		}
		CHECK(W.wmem && W.heads, "out of memory");
	}
	memset(&W.sc, 0, sizeof(W.sc));
	memset(W.by_slot, 0, sizeof(W.by_slot));
	memset(W.users, 0, sizeof(W.users));
	memset(W.user_of_slot, 0, sizeof(W.user_of_slot));
	memset(&W.pub, 0, sizeof(W.pub));
	memset(W.cpub, 0, sizeof(W.cpub));
	memset(W.heads, 0, nb * sizeof(uint32_t));
	CHECK(wheel_init(&W.sc.wh, W.wmem, wsz, CAP, RES, T0) == 0, "wheel_init");
	keyidx_init(&W.sc.ki, W.heads, nb, W.sc.wh.nodes, 0);
	CHECK(keyidx_walks_init(&W.sc.ki, NCL) == 0, "out of memory");
	CHECK(stats_init_blocks(&W.st, &W.pub, W.cpub, NCL, 1, 0) == 0, "stats_init_blocks");
	W.sc.st = &W.st;
	W.sc.by_slot = W.by_slot;
	W.sc.shard = 0;
	W.sc.capacity = CAP;
	W.sc.max_clients = NCL;
	W.sc.quota = quota;
	W.sc.users = W.users;
	W.sc.user_of_slot = W.user_of_slot;
	/* as the shard, by user; thresholds low enough for a 64-node slab to jump and refuse */
	wheel_group_owners(&W.sc.wh, W.user_of_slot);
	W.sc.wh.jump_backlog = 2;
	W.sc.wh.jump_max = 8;
	W.sc.wh.jump_owner = 4;
	W.sc.wh.jump_group = 2;
	W.user_quota = user_quota;
	W.sc.walk_budget = walk_budget;
	W.sc.index_budget = walk_budget;        /* a client's first CANCEL_KEY indexes in steps too */
	W.sc.grant_lower = walk_budget;         /* grants at a 64-node slab's top swapped for lower ones */
	W.now = T0;
	W.nt = 0;
	W.max_deadline = T0;
	W.hbase = 0;
	for (unsigned i = 0; i < NCL; i++) {
		W.cl[i].attached = false;
		CHECK(client_attach(&W.cl[i], (uint16_t)i) == 0, "attach on an empty slab");
	}
}

static bool live(unsigned i)
{
	return W.cl[i].attached && !W.cl[i].ch.dying && !W.cl[i].ch.parked;
}

/* ---- global invariants ---- */

static void check_world(void)
{
	uint64_t owned[NCL] = { 0 }, granted[NCL] = { 0 }, held[NCL] = { 0 }, left_out[NCL] = { 0 };
	uint64_t armed = 0, backlog = 0;
	uint32_t hw = W.sc.wh.w->high_water;

	wheel_check(&W.sc.wh);
	for (uint32_t i = 0; i < hw; i++) {
		const struct chime_node *n = wheel_node(&W.sc.wh, i);

		if (n->state == CHIME_NODE_FREE)
			continue;
		CHECK(n->owner < NCL, "node %u owner %u", i, n->owner);
		owned[n->owner]++;
		/* The key index: a grant is left out; any other node is in its bucket's chain or counted out. */
		if (!keyidx_linked(n)) {
			left_out[n->owner] += n->state != CHIME_NODE_GRANTED;
		} else {
			uint32_t j = W.sc.ki.heads[keyidx_bucket(&W.sc.ki, n->owner, n->key)] - 1, len = 0;

			CHECK(n->state != CHIME_NODE_GRANTED, "grant %u is in the key index", i);
			while (j != CHIME_NIL && j != i && len++ <= hw)
				j = wheel_node(&W.sc.wh, j)->key_next;
			CHECK(j == i, "node %u is linked, not in its bucket's chain", i);
		}
		if (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED)
			armed++;
		else if (n->state == CHIME_NODE_GRANTED)
			granted[n->owner]++;
		else if (n->state == CHIME_NODE_BACKLOG)
			held[n->owner]++;
	}
	CHECK(armed == wheel_armed(&W.sc.wh), "armed %lu, wheel says %lu",
	      (unsigned long)armed, (unsigned long)wheel_armed(&W.sc.wh));
	for (unsigned c = 0; c < NCL; c++) {
		const struct chan *ch = &W.cl[c].ch;
		uint64_t grants = 0, markers = 0;

		if (!W.cl[c].attached) {
			CHECK(owned[c] == 0, "client %u detached, owns %lu nodes", c, (unsigned long)owned[c]);
			continue;
		}
		CHECK(ch->unindexed == left_out[c], "client %u: %lu nodes out of the key index, counted %u", c,
		      (unsigned long)left_out[c], ch->unindexed);
		/* a dying channel's reclaim ends its walk, indexed or not, and releases every node */
		CHECK(ch->dying || !ch->keyed || left_out[c] == 0 || (ch->walk_queued && !ch->walk_begun),
		      "client %u keyed, %lu nodes out of the key index (parked %d, walk queued %d, begun %d)", c,
		      (unsigned long)left_out[c], ch->parked, ch->walk_queued, ch->walk_begun);
		CHECK(ch->owned == owned[c], "client %u: ch->owned %lu, nodes %lu", c,
		      (unsigned long)ch->owned, (unsigned long)owned[c]);
		CHECK(ch->nr_backlog == held[c], "client %u: nr_backlog %lu, BACKLOG nodes %lu", c,
		      (unsigned long)ch->nr_backlog, (unsigned long)held[c]);
		backlog += ch->nr_backlog;
		CHECK(ch->cq.tail - ch->cq.head <= CQ, "client %u: %lu events in a ring of %u", c,
		      (unsigned long)(ch->cq.tail - ch->cq.head), CQ);
		/* Carried grants: GRANTED, owned, marked, exactly ch->nr_carried of them. */
		uint32_t carried = 0;

		for (uint32_t i = ch->carried.head; i != CHIME_NIL && carried <= hw;
		     i = wheel_node(&W.sc.wh, i)->next, carried++) {
			const struct chime_node *n = wheel_node(&W.sc.wh, i);

			CHECK(n->state == CHIME_NODE_GRANTED && n->owner == c && n->cq_pos == CHIME_POS_NONE - 1,
			      "carried node %u of client %u", i, c);
		}
		CHECK(carried == ch->nr_carried, "client %u: %u carried nodes listed, nr_carried %u", c,
		      carried, ch->nr_carried);
		if (ch->dying || ch->parked) {
			/* and a reclaim's grants not let go yet (grants_let_go(), in steps) */
			uint32_t left = 0;

			for (uint32_t s = ch->dying ? ch->grants_pos : ch->sq_mask + 1; s <= ch->sq_mask; s++)
				left += !chime_grant_is_marker(ch->grants[s]);
			CHECK(granted[c] == carried + left, "client %u: %lu GRANTED nodes, %u carried, %u grants left",
			      c, (unsigned long)granted[c], carried, left);
			continue;       /* no grants, no ring of its own any more */
		}
		/* Whatever the client wrote as its sq_tail, the depth the shard reports fits the ring. */
		CHECK(chan_sq_waiting(ch) <= SQ, "client %u: %lu records waiting in a ring of %u", c,
		      (unsigned long)chan_sq_waiting(ch), SQ);
		for (unsigned s = 0; s < SQ; s++)
			if (grant_usable(ch->grants[s])) {
				const struct chime_node *n = wheel_node(&W.sc.wh, chime_id_index(ch->grants[s]));

				CHECK(n->state == CHIME_NODE_GRANTED && n->owner == c, "grant %u of client %u", s, c);
				grants++;
			} else {
				markers++;
			}
		CHECK(grants + carried == granted[c], "client %u: %lu grants and %u carried, %lu GRANTED nodes", c,
		      (unsigned long)grants, carried, (unsigned long)granted[c]);
		CHECK(markers == ch->marked, "client %u: %lu markers, ch->marked %u", c,
		      (unsigned long)markers, ch->marked);
		CHECK(ch->owned <= W.sc.quota, "client %u owns %lu nodes, quota %lu", c,
		      (unsigned long)ch->owned, (unsigned long)W.sc.quota);
	}
	CHECK(backlog == W.sc.backlog, "backlog sum %lu, shard says %lu",
	      (unsigned long)backlog, (unsigned long)W.sc.backlog);
	/* Each user's share: the sum of its channels' nodes, within its quota, one entry per uid. */
	for (unsigned c = 0; c < NCL; c++) {
		const struct chan_user *u = W.cl[c].attached ? W.cl[c].ch.user : NULL;
		uint64_t sum = 0;
		uint32_t chans = 0;

		if (!u)
			continue;
		CHECK(u->uid == uid_of((uint16_t)c) && u >= W.users && u < W.users + W.sc.nr_users,
		      "client %u: user entry of uid %u", c, u->uid);
		for (unsigned d = 0; d < NCL; d++)
			if (W.cl[d].attached && uid_of((uint16_t)d) == u->uid) {
				CHECK(W.cl[d].ch.user == u, "clients %u and %u: two entries for uid %u", c, d, u->uid);
				sum += W.cl[d].ch.owned;
				chans++;
			}
		CHECK(u->owned == sum && u->chans == chans, "uid %u: owned %lu in %u channels, its entry "
		      "says %lu in %u", u->uid, (unsigned long)sum, chans, (unsigned long)u->owned, u->chans);
		CHECK(u->owned <= W.user_quota && u->quota == W.user_quota, "uid %u owns %lu nodes, user quota %lu", u->uid,
		      (unsigned long)u->owned, (unsigned long)W.user_quota);
	}
	CHECK(W.sc.nr_users <= NCL, "%u user entries for %u clients", W.sc.nr_users, NCL);
}

/* ---- the shard's side ---- */

static void shard_fire(unsigned budget)
{
	uint32_t buf[16];
	unsigned n, total = 0;

	/*
	 * Wall-clock timers (CLOCK_REALTIME arms) on this clock too: the
	 * shard's offset is 0 here, so they fire as the monotonic ones do,
	 * never early by the wall clock the firing checks.
	 */
	wall_pin(W.now);
	wheel_advance(&W.sc.wh, W.now);
	/* at most the budget: what is left is a backlog, which timers due later may jump */
	while (total < budget && (n = wheel_pop_expired(&W.sc.wh, buf, budget - total < 16 ? budget - total : 16)) > 0) {
		for (unsigned i = 0; i < n; i++) {
			uint16_t owner = wheel_node(&W.sc.wh, buf[i])->owner;
			struct chan *ch = owner < NCL ? W.by_slot[owner] : NULL;

			CHECK(ch, "popped node %u of owner %u with no channel", buf[i], owner);
			chan_fire(&W.sc, ch, buf[i], W.now);
		}
		total += n;
	}
}

/* Reclaim client c a step (budget nodes); when done, detach it. True when done. */
static bool shard_reclaim(unsigned c, uint32_t budget)
{
	struct client *cl = &W.cl[c];

	if (!cl->attached)
		return true;
	if (!chan_reclaim(&W.sc, &cl->ch, budget))
		return false;
	CHECK(cl->ch.owned == 0, "client %u reclaimed, still owns %lu", c, (unsigned long)cl->ch.owned);
	CHECK(W.by_slot[c] == NULL, "client %u reclaimed, still in by_slot", c);
	chan_fini(&cl->ch);
	cl->attached = false;
	return true;
}

/*
 * Park client c, in steps as the shard does: between them the shard's
 * other work goes on, and with it another channel's CANCEL_KEY walk that
 * c's own may be waiting behind (budget 0: walk steps, no new records).
 */
static void shard_park(unsigned c, uint32_t budget)
{
	while (!chan_park(&W.sc, &W.cl[c].ch, budget))
		for (unsigned o = 0; o < NCL; o++)
			if (o != c && live(o))
				chan_drain(&W.sc, &W.cl[o].ch, 0);
}

/* ---- the honest client ---- */

static struct htimer *htimer_of(uint64_t id)
{
	for (unsigned i = 0; i < W.nt; i++)
		if (W.t[i].id == id)
			return &W.t[i];
	return NULL;
}

/*
 * Publish a well-formed record; false if the ring is full. *posp: its
 * position, counted over every ring the honest client had (W.hbase).
 */
static bool honest_submit(uint32_t op, uint64_t id, uint64_t key, uint64_t deadline, uint64_t period,
			  uint64_t ud, uint64_t *idp, uint64_t *posp)
{
	struct client *c = &W.cl[HONEST];
	struct chime_sqe *s = chime_sq_reserve(&c->prod, posp);

	if (!s)
		return false;
	if (op == CHIME_OP_ARM) {
		id = s->grant;
		if (!grant_usable(id)) {
			/* No node for this slot (slab full): give the slot up, as libchime does. */
			s->op = CHIME_OP_NOP;
			chime_sq_publish(s, *posp);
			*posp += W.hbase;
			return false;
		}
	}
	s->op = op;
	s->id = id;
	s->key = key;
	s->deadline_ns = deadline;
	s->period_ns = period;
	s->user_data = ud;
	chime_sq_publish(s, *posp);
	*posp += W.hbase;
	if (idp)
		*idp = id;
	return true;
}

static void honest_arm(uint64_t key, uint64_t deadline, uint64_t period, uint64_t ud)
{
	struct htimer *t;
	uint64_t id, pos;

	if (W.nt == MAXT || !honest_submit(CHIME_OP_ARM, 0, key, deadline, period, ud, &id, &pos))
		return;
	CHECK(!htimer_of(id), "grant %#lx handed out twice", (unsigned long)id);
	t = &W.t[W.nt++];
	*t = (struct htimer){ .id = id, .key = key, .ud = ud, .period = period, .cancel_pos = NONE };
	t->rs_pos[0] = pos;
	t->rs_dl[0] = deadline;
	t->nrs = 1;
	if (deadline > W.max_deadline)
		W.max_deadline = deadline;
}

static void honest_cancel(struct htimer *t)
{
	uint64_t pos;

	if (honest_submit(CHIME_OP_CANCEL, t->id, 0, 0, 0, 0, NULL, &pos) && t->cancel_pos == NONE)
		t->cancel_pos = pos;
}

static void honest_reset(struct htimer *t, uint64_t deadline)
{
	uint64_t pos;

	/* Past the history's end the shadow could not follow: do not reset. */
	if (t->nrs == MAXRS || !honest_submit(CHIME_OP_RESET, t->id, 0, deadline, 0, 0, NULL, &pos))
		return;
	t->rs_pos[t->nrs] = pos;
	t->rs_dl[t->nrs++] = deadline;
	if (deadline > W.max_deadline)
		W.max_deadline = deadline;
}

static void honest_cancel_key(uint64_t key)
{
	uint64_t pos;

	if (!honest_submit(CHIME_OP_CANCEL_KEY, 0, key, 0, 0, 0, NULL, &pos))
		return;
	for (unsigned i = 0; i < W.nt; i++)
		if (W.t[i].key == key && W.t[i].rs_pos[0] < pos && W.t[i].cancel_pos == NONE)
			W.t[i].cancel_pos = pos;
}

/* Check one event the honest client took against its shadow. */
static void honest_check_event(const struct chime_cqe *e, uint64_t applied)
{
	struct htimer *t = htimer_of(e->id);
	uint64_t base = NONE;

	CHECK(t, "honest client got id %#lx it never armed (key %lu, ud %lu)", (unsigned long)e->id,
	      (unsigned long)e->key, (unsigned long)e->user_data);
	CHECK(t->rs_pos[0] < applied, "event for an arm not applied yet");
	CHECK(e->key == t->key && e->user_data == t->ud, "event for %#lx with key %lu ud %lu, armed %lu %lu",
	      (unsigned long)e->id, (unsigned long)e->key, (unsigned long)e->user_data,
	      (unsigned long)t->key, (unsigned long)t->ud);
	CHECK(t->cancel_pos == NONE || t->cancel_pos >= applied,
	      "event for %#lx after its cancel (pos %lu) was applied (sq_head %lu)",
	      (unsigned long)e->id, (unsigned long)t->cancel_pos, (unsigned long)applied);
	CHECK(e->fired_ns >= e->deadline_ns, "fired early: deadline %lu fired %lu",
	      (unsigned long)e->deadline_ns, (unsigned long)e->fired_ns);
	CHECK(e->fired_ns <= W.now, "fired in the future");
	CHECK(!!(e->flags & CHIME_CQE_PERIODIC) == !!t->period, "flags %#x for period %lu", e->flags,
	      (unsigned long)t->period);
	for (unsigned i = 0; i < t->nrs && t->rs_pos[i] < applied; i++)
		base = t->rs_dl[i];
	if (t->period) {
		CHECK(e->deadline_ns >= base && (e->deadline_ns - base) % t->period == 0,
		      "periodic %#lx: deadline %lu, base %lu period %lu", (unsigned long)e->id,
		      (unsigned long)e->deadline_ns, (unsigned long)base, (unsigned long)t->period);
	} else {
		CHECK(e->deadline_ns == base, "one-shot %#lx: deadline %lu, last applied %lu",
		      (unsigned long)e->id, (unsigned long)e->deadline_ns, (unsigned long)base);
		CHECK(t->taken == 0, "one-shot %#lx fired twice", (unsigned long)e->id);
	}
	t->taken++;
}

/* Take up to max events (0: all) and release them. */
static void honest_take(unsigned max)
{
	struct client *c = &W.cl[HONEST];
	uint64_t applied = W.hbase + c->m.ro->sq_head;  /* everything below was applied */
	struct chime_cqe e;
	unsigned n = 0;

	while ((max == 0 || n < max) && chime_cq_take(&c->cons, &e) == 1) {
		honest_check_event(&e, applied);
		n++;
	}
	chime_cq_release(&c->cons);
}

static struct htimer *honest_pick(struct prog *g)
{
	return W.nt ? &W.t[u32(g) % W.nt] : NULL;
}

/*
 * The honest client is a session whose process dies: whatever it left in
 * its rings (records not applied, events not taken) is settled by the park,
 * timers fire while nobody is attached, and its next process re-attaches
 * with new rings. Its shadow carries on: every record of the old ring was
 * applied (the park drains it), untaken events come back once.
 */
static void honest_park(struct prog *g)
{
	struct client *c = &W.cl[HONEST];
	uint8_t how = u8(g);

	shard_park(HONEST, 1 + how % 64);
	check_world();
	if (how & 64) {
		W.now += u32(g) % (256 * RES);
		shard_fire(1 + u8(g) % 64);
		check_world();
	}
	W.hbase += c->m.rw->sq_tail;
	client_reattach(c, false);
}

/* ---- the hostile clients ---- */

/* An id a hostile client might try: its own, another client's, stale or garbage. */
static uint64_t hostile_id(struct prog *g, struct client *c)
{
	uint8_t how = u8(g);
	struct client *o = &W.cl[how % NCL];

	switch ((how >> 2) % 7) {
	case 0: return c->m.sq_slots[u8(g) % SQ].grant;
	case 1: return o->m.sq_slots[u8(g) % SQ].grant;
	case 2: return W.nt ? W.t[u32(g) % W.nt].id : 0;
	case 3: return chime_id_make(u32(g), u8(g), u32(g) % (CAP + 4));
	case 4: {
		/* a node currently in the slab, with its current or a nearby generation */
		uint32_t idx = u32(g) % CAP;

		return chime_id_make(wheel_node(&W.sc.wh, idx)->gen + (u8(g) % 3) - 1, 0, idx);
	}
	case 5: return c->cons.head ? c->m.cq_slots[(c->cons.head - 1) & (CQ - 1)].id : 0;
	default: return u64(g);
	}
}

static uint64_t some_time(struct prog *g)
{
	uint8_t how = u8(g);

	switch (how % 4) {
	case 0: return W.now + u32(g) % (64 * RES);
	case 1: return W.now - (u32(g) % (64 * RES));
	case 2: return (uint64_t)u8(g) << (how >> 2);
	default: return u64(g);
	}
}

/* Write one arbitrary record into a slot of the submission ring, seq included. */
static void hostile_record(struct prog *g, struct client *c)
{
	uint8_t how = u8(g);
	uint64_t head = c->ch.sq.head;
	struct chime_sqe *s = &c->m.sq_slots[(head + (how & 3)) & (SQ - 1)];
	uint32_t op = u8(g);

	s->op = op < 200 ? op % 7 : op | u32(g);     /* up to RESET_TOUCH */
	s->id = hostile_id(g, c);
	s->key = u8(g) < 128 ? u8(g) % 4 : u64(g);
	s->deadline_ns = some_time(g);
	s->period_ns = u8(g) < 128 ? 0 : some_time(g) - W.now;
	s->user_data = u64(g);
	switch ((how >> 2) % 4) {
	case 0:
	case 1: s->seq = head + (how & 3) + 1; break;             /* published at its position */
	case 2: s->seq = head + 1 + SQ * (uint64_t)(u8(g) % 4); break; /* forged lap */
	default: s->seq = u64(g); break;
	}
}

static void hostile_scribble(struct prog *g, struct client *c)
{
	uint8_t how = u8(g);

	switch (how % 9) {
	case 0: {
		uint64_t v[] = { c->cons.head, c->ch.cq.tail, c->ch.cq.tail + 1 + u8(g), c->ch.cq.head - 1, 0,
				 u64(g), UINT64_MAX, c->ch.cq.tail - CQ };

		c->m.rw->cq_head = v[(how >> 3) % 8];
		break;
	}
	case 1: c->m.claim[u8(g) % CQ] = u8(g) < 200 ? u8(g) % 4 : u64(g); break;
	case 2: *c->m.want_wakeup = u8(g) < 128 ? u8(g) % 3 : u32(g); break;
	case 3: c->m.sq_slots[u8(g) % SQ].grant = hostile_id(g, c); break;
	case 4: c->m.rw->sq_tail = u64(g); break;
	case 5: /* consume like a client would, through its own view */
		for (unsigned n = u8(g) % 16; n && chime_cq_take(&c->cons, &(struct chime_cqe){ 0 }); n--)
			;
		chime_cq_release(&c->cons);
		break;
	case 6: /* the claim word of the newest event: races with a void */
		c->m.claim[(c->ch.cq.tail - 1) & (CQ - 1)] = u8(g) % 4;
		break;
	case 7: { /* a touch table entry: a deadline near now, any word, FIRED, any tag */
		uint32_t e = u8(g) % CAP;
		uint64_t *w = &chime_touch_words(c->touch, 0, CAP)[e];

		switch (u8(g) % 4) {
		case 0: *w = some_time(g); break;
		case 1: *w = u64(g); break;
		case 2: *w |= CHIME_TOUCH_FIRED; break;
		default: chime_touch_tags(c->touch, 1, 0, CAP)[e] = (uint32_t)u64(g); break;
		}
		break;
	}
	default: c->m.sq_slots[u8(g) % SQ].seq = u64(g); break;
	}
}

/* ---- the interpreter ---- */

static void step(struct prog *g)
{
	uint8_t op = u8(g);
	unsigned hc = 1 + (op & 1);     /* the hostile client an op names */
	struct client *h = &W.cl[hc];
	struct htimer *t;

	switch ((op >> 1) % 16) {
	case 0: case 1:
		if (live(hc))
			hostile_record(g, h);
		break;
	case 2:
		if (live(hc))
			hostile_scribble(g, h);
		break;
	case 3: {
		uint64_t d = W.now + u32(g) % (1024 * RES);

		honest_arm(u8(g) % 4, d, u8(g) < 192 ? 0 : RES * (1 + u8(g) % 64), u64(g));
		break;
	}
	case 4:
		if ((t = honest_pick(g)))
			honest_cancel(t);
		break;
	case 5:
		if ((t = honest_pick(g)))
			honest_reset(t, W.now + u32(g) % (1024 * RES));
		break;
	case 6:
		honest_cancel_key(u8(g) % 4);
		break;
	case 7:
		honest_take(u8(g) % 4);
		break;
	case 8: {
		unsigned c = u8(g) % NCL;

		if (live(c))
			chan_drain(&W.sc, &W.cl[c].ch, 1 + u8(g) % 16);
		break;
	}
	case 9: {
		uint8_t how = u8(g);

		W.now += how < 64 ? how : how < 192 ? (uint64_t)u32(g) % (256 * RES) : (uint64_t)u32(g) * 64;
		shard_fire(1 + u8(g) % 64);
		break;
	}
	case 10: {
		unsigned c = u8(g) % NCL;
		/* a user's budget left this pass (shard.c): a few steps, or none, of the service's work */
		uint32_t budget = u8(g);

		if (live(c))
			(void)chan_service_n(&W.sc, &W.cl[c].ch, W.now, budget == 255 ? &(uint32_t){ UINT32_MAX } : &budget,
					     &(uint32_t){ budget == 255 ? UINT32_MAX : budget % 4u });
		break;
	}
	case 11: {
		unsigned c = u8(g) % NCL;

		if (live(c))
			(void)chan_pending(&W.sc, &W.cl[c].ch);
		break;
	}
	case 12: {
		/*
		 * A hostile client dies (or goes on dying); a dead slot is taken
		 * by a new client. As a session it parks instead (its claim
		 * words, cq_head and unread records as it left them), and a
		 * parked one re-attaches with new rings or is reclaimed.
		 */
		uint8_t how = u8(g);

		if (live(hc) && how < 96) {
			h->ch.handover = how & 1;       /* a broker stop: grants carried, not freed */
			shard_park(hc, 1 + how % 64);
			CHECK(h->ch.parked, "client %u parked, not marked", hc);
		} else if (W.cl[hc].attached && h->ch.parked && !h->ch.dying && how < 192) {
			client_reattach(h, how & 1);   /* resuming: the carried grants stay */
		} else if (W.cl[hc].attached) {
			shard_reclaim(hc, 1 + u8(g) % 64);
		} else {
			(void)client_attach(h, (uint16_t)hc);
		}
		break;
	}
	case 13: {
		uint8_t how = u8(g);

		if (how < 16) {
			honest_park(g);
		} else if (how < 32) {
			/*
			 * The shard gives the slab's free top back (shard.c,
			 * slab_give_back()): a new generation base far from the
			 * old, so that no id of a node given back names its next
			 * life (by chance, 1 in 2^24, it could).
			 */
			wheel_shrink(&W.sc.wh, wheel_slab_end(&W.sc.wh));
			W.sc.wh.gen_base += UINT32_C(1) << 20;
		} else {
			*W.cl[HONEST].m.want_wakeup = 1;
		}
		break;
	}
	case 14:
		/* a hostile client arms a burst of well-formed timers: fills the slab fast */
		if (live(hc))
			for (unsigned n = u8(g) % 32; n; n--) {
				struct chime_sqe *s = &h->m.sq_slots[h->ch.sq.head & (SQ - 1)];

				s->op = CHIME_OP_ARM;
				s->id = s->grant;
				s->key = n % 4;
				s->deadline_ns = n & 1 ? UINT64_MAX : some_time(g);
				s->period_ns = 0;
				s->user_data = n;
				s->seq = h->ch.sq.head + 1;
				chan_drain(&W.sc, &h->ch, 1);
			}
		break;
	default: {
		/* one ordinary shard loop iteration */
		for (unsigned c = 0; c < NCL; c++)
			if (live(c))
				chan_drain(&W.sc, &W.cl[c].ch, 64);
		shard_fire(256);
		for (unsigned c = 0; c < NCL; c++)
			if (live(c))
				chan_service(&W.sc, &W.cl[c].ch, W.now);
		/* idle, it stages part of the next cascade (shard.c: STAGE_BUDGET) */
		(void)wheel_stage(&W.sc.wh, u8(g) % 40);
		break;
	}
	}
}

/* The end: hostile clients die, the honest one's timers run out, then it dies. */
static void finish(void)
{
	struct client *hc = &W.cl[HONEST];
	unsigned i, rounds;

	for (unsigned c = 1; c < NCL; c++)
		while (!shard_reclaim(c, 64))
			;
	check_world();
	/* Cancel every periodic (they would never run out); keep the loop turning while the ring is full. */
	for (i = 0; i < W.nt; i++) {
		struct htimer *t = &W.t[i];

		for (rounds = 0; t->period && t->cancel_pos == NONE; rounds++) {
			CHECK(rounds < 1000, "honest client cannot submit a cancel");
			honest_cancel(t);
			chan_drain(&W.sc, &hc->ch, 64);
			W.now += RES;
			shard_fire(UINT32_MAX);
			chan_service(&W.sc, &hc->ch, W.now);
			honest_take(0);
		}
	}
	/* Run the clock past every deadline until the honest client holds nothing but grants. */
	for (rounds = 0;; rounds++) {
		chan_drain(&W.sc, &hc->ch, 64);
		if (W.now < W.max_deadline)
			W.now = W.now + 64 * RES < W.max_deadline ? W.now + 64 * RES : W.max_deadline;
		else
			W.now += RES;
		shard_fire(UINT32_MAX);
		chan_service(&W.sc, &hc->ch, W.now);
		honest_take(0);
		chan_service(&W.sc, &hc->ch, W.now);
		check_world();
		if (W.now > W.max_deadline && hc->ch.sq.head == hc->m.rw->sq_tail &&
		    hc->ch.owned == SQ - hc->ch.marked && hc->ch.nr_backlog == 0 && hc->ch.cq.tail == hc->cons.head)
			break;
		CHECK(rounds < 100000, "the honest client's timers never ran out (owned %lu, backlog %lu)",
		      (unsigned long)hc->ch.owned, (unsigned long)hc->ch.nr_backlog);
	}
	for (i = 0; i < W.nt; i++) {
		const struct htimer *t = &W.t[i];

		if (!t->period && t->cancel_pos == NONE)
			CHECK(t->taken == 1, "one-shot %#lx (deadline %lu) taken %u times", (unsigned long)t->id,
			      (unsigned long)t->rs_dl[t->nrs - 1], t->taken);
	}
	while (!shard_reclaim(HONEST, 64))
		;
	check_world();
	/* No node leaked: every node handed out is free again (wheel_check(): and in the free map). */
	{
		uint32_t nfree = 0;

		wheel_check(&W.sc.wh);
		for (uint32_t idx = 0; idx < W.sc.wh.w->high_water; idx++)
			nfree += wheel_node(&W.sc.wh, idx)->state == CHIME_NODE_FREE;
		CHECK(nfree == W.sc.wh.w->high_water, "%u nodes free of %u handed out", nfree,
		      W.sc.wh.w->high_water);
		CHECK(W.sc.backlog == 0 && wheel_armed(&W.sc.wh) == 0, "shard not empty");
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct prog g = { .p = data, .n = size };
	unsigned steps = 0;

	/*
	 * The first byte picks the per-client quota (none, or one the clients
	 * reach; the hostile clients' user then has one and a half of it, so
	 * the two reach the user's before their own) and how many nodes a
	 * CANCEL_KEY looks at per step (1-8: its walks take steps, with the
	 * others' records and firings between them).
	 */
	uint64_t quota = size && data[0] & 1 ? 4 + (data[0] >> 1) % 48 : UINT64_MAX;

	world_init(quota, quota == UINT64_MAX ? UINT64_MAX : quota * 3 / 2, size ? 1 + (data[0] >> 5) : 0);
	while (g.off < g.n && steps++ < 4096) {
		step(&g);
		check_world();
	}
	finish();
	return 0;
}
