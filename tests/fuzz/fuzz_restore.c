/* SPDX-License-Identifier: MIT */
/*
 * fuzz_restore.c - libFuzzer target for restore_nodes(): the timers a shard
 * file holds when the next broker takes it over, after wheel_rebuild()
 * (which fuzz_rebuild.c covers alone).
 *
 * The input writes a shard's slab as a broker killed at any moment could
 * leave it: each node in one of the states the broker uses (armed, due,
 * a grant, ALLOC half-way, held, delivered and waiting for its claim word,
 * held with an old-ring position, tagged CHAN_POS_AT by a move to the
 * backlog), its owner, generation, deadline, period and position from a
 * few meaningful values or raw bytes; then patches (offset, length, bytes)
 * over the region, header included, as a stray writer; then which slots
 * the sessions file says are sessions, and how late the new broker comes.
 * A new shard core takes the region over as shard.c's restore() does
 * (chan_restore_init(), wheel_rebuild(), keyidx_init(), restore_nodes()).
 * Checked:
 *   - each node is counted once: kept, carried as a grant, freed as an
 *     anonymous client's or as damaged;
 *   - every node left is free or a session's, with a generation; each
 *     channel's owned and backlog counts and carried grants match its
 *     nodes; wheel_check(); every held event's deadline has passed (a held
 *     event is delivered at once: never early), but a wall-clock timer's
 *     event from the old ring, whose deadline a step of the wall clock back
 *     after it fired moves ahead (restore.c: it was delivered);
 *   - each session's next process (a plain re-attach) gets, as the clock
 *     runs on, each kept one-shot once and never before its deadline, with
 *     its own key and user data, and each periodic's deadlines in order;
 *   - reclaiming every session frees the whole slab.
 * A violation calls abort() so libFuzzer reports the input.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"
#include "keyidx.h"
#include "restore.h"
#include "ring.h"
#include "segment.h"
#include "stats.h"
#include "wall.h"
#include "wheel.h"
#include "fuzz_input.h"

#define CAP  64u
#define RES  100000u            /* 100 us */
#define SQ   8u
#define CQ   8u
#define NCL  3u                 /* client slots; owner NCL is no slot at all */
#define T0   UINT64_C(1000000000)
#define TOLD (T0 + 1000 * RES)  /* the old wheel's last advance */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A node as restore left it, for the events its next process gets. */
struct kept {
	bool kept, oneshot;
	uint16_t owner;
	bool wall_held;         /* a wall-clock timer's event from the old ring: its deadline may be ahead */
	uint64_t key, ud, deadline, period;
	unsigned delivered;
	uint64_t last;          /* the last deadline delivered */
};

static struct {
	void *wmem;
	size_t wsz;
	uint32_t *heads, nb;
	struct shard_core sc;
	struct stats st;
	struct chime_shard_stats pub;
	struct chime_client_stats cpub[NCL];
	struct chan *by_slot[NCL];
	struct chan_user users[NCL];
	uint16_t user_of_slot[NCL];
	struct chan ch[NCL];
	bool session[NCL];
	struct chime_client_geom g;
	void *rw[NCL], *ro[NCL];
	struct chan_mem m[NCL];
	struct chime_cq_cons cons[NCL];
	struct kept k[CAP];
	uint64_t now;
} W;

static void world_alloc(void)
{
	W.wsz = wheel_region_size(CAP);
	W.nb = keyidx_buckets_for(CAP);
	W.wmem = aligned_alloc(64, (W.wsz + 63) & ~(size_t)63);
	W.heads = calloc(W.nb, sizeof(uint32_t));
	W.g.nr_shards = 1;
	W.g.sq_size = SQ;
	W.g.cq_size = CQ;
	CHECK(W.wmem && W.heads && chime_client_layout(&W.g) == 0, "setup");
	for (unsigned i = 0; i < NCL; i++) {
		W.rw[i] = aligned_alloc(4096, (W.g.rw_size + 4095) & ~(uint64_t)4095);
		W.ro[i] = aligned_alloc(4096, (W.g.ro_size + 4095) & ~(uint64_t)4095);
		CHECK(W.rw[i] && W.ro[i], "out of memory");
	}
}

/* The old broker's slab: each node from the input, then its patches. */
static uint64_t old_slab(struct in *in)
{
	struct wheel old;
	uint32_t n = byte(in) % (CAP + 1);
	uint64_t old_now;

	memset(W.wmem, 0, W.wsz);
	CHECK(wheel_init(&old, W.wmem, W.wsz, CAP, RES, T0) == 0, "wheel_init");
	for (uint32_t i = 0; i < n; i++) {
		uint32_t idx = wheel_alloc(&old);
		struct chime_node *nd = wheel_node(&old, idx);
		uint8_t kind = byte(in), who = byte(in), when = byte(in);
		uint64_t pos = byte(in);

		CHECK(idx != CHIME_NIL, "wheel_alloc");
		nd->owner = (uint16_t)(who % (NCL + 1));
		nd->gen = who & 0x10 ? (uint32_t)take(in, 4) : 1 + who / 32;
		nd->key = who & 3;
		nd->user_data = 0xabc0000u + idx;
		nd->period_ns = who & 0x8 ? (uint64_t)(1 + when % 16) * 100 * RES : 0;
		/* Before the old broker's last advance (fired) or after it, or any time. */
		nd->deadline_ns = kind & 0x80 ? take(in, 8) : T0 + (uint64_t)when * 8 * RES;
		nd->cq_pos = CHIME_POS_NONE;
		switch (kind % 8) {
		case 0:
		case 1:
			wheel_arm(&old, idx, nd->deadline_ns);  /* due at the advance below: EXPIRED */
			break;
		case 2:
			nd->state = CHIME_NODE_GRANTED;
			break;
		case 3:
			break;          /* ALLOC: between two steps of the old shard */
		case 4:
			nd->state = CHIME_NODE_BACKLOG;
			break;
		case 5:
			nd->state = CHIME_NODE_ACKWAIT;
			nd->cq_pos = pos;
			break;
		case 6:         /* held with an old-ring position: unsure, or behind its event */
			nd->state = kind & 0x40 ? CHIME_NODE_BACKLOG : CHIME_NODE_ALLOC;
			nd->cq_pos = CHAN_POS_OLD | pos | (kind & 0x10 ? CHAN_POS_UNSURE : 0) |
				     (kind & 0x20 ? CHAN_POS_BEHIND : 0);
			break;
		default:        /* a periodic's event being held again (any state the move reached) */
			nd->state = (uint8_t)(kind >> 4 & 7);
			if (nd->state == CHIME_NODE_ARMED) {
				nd->state = CHIME_NODE_ALLOC;
				wheel_arm(&old, idx, nd->deadline_ns);
			}
			nd->cq_pos = CHAN_POS_AT | (kind & 0x08 ? take(in, 7) : T0 + (uint64_t)when * 4 * RES);
		}
		if (kind & 0x80 && who & 0x80)
			nd->cq_pos = take(in, 8);       /* any position at all */
	}
	wheel_advance(&old, TOLD);
	old_now = old.w->now_ns;
	wheel_fini(&old);
	/* A stray writer: patches over the region, header included. */
	for (unsigned p = byte(in) % 8; p && in->n >= 3; p--) {
		size_t off = (size_t)take(in, 2) % W.wsz, len = byte(in) % 32;

		len = len < in->n ? len : in->n;
		len = len < W.wsz - off ? len : W.wsz - off;
		memcpy((char *)W.wmem + off, in->p, len);
		in->p += len;
		in->n -= len;
	}
	return old_now;
}

/* The new broker: its shard core, the sessions the sessions file names, the restore. */
static int restore(struct in *in, uint64_t old_now)
{
	uint8_t sessions = byte(in);
	struct wheel_rebuild_stats ws;
	struct restore_stats rs;
	uint64_t before = 0, after = 0;
	int r;

	memset(&W.sc, 0, sizeof(W.sc));
	memset(W.by_slot, 0, sizeof(W.by_slot));
	memset(W.users, 0, sizeof(W.users));
	memset(W.user_of_slot, 0, sizeof(W.user_of_slot));
	memset(&W.pub, 0, sizeof(W.pub));
	memset(W.cpub, 0, sizeof(W.cpub));
	memset(W.heads, 0, W.nb * sizeof(uint32_t));
	CHECK(stats_init_blocks(&W.st, &W.pub, W.cpub, NCL, 1, 0) == 0, "stats_init_blocks");
	W.sc.st = &W.st;
	W.sc.by_slot = W.by_slot;
	W.sc.capacity = CAP;
	W.sc.max_clients = NCL;
	W.sc.quota = UINT64_MAX;
	W.sc.users = W.users;
	W.sc.user_of_slot = W.user_of_slot;
	W.sc.walk_budget = 16;
	W.now = TOLD + (uint64_t)byte(in) * 10 * RES;
	CHECK(keyidx_walks_init(&W.sc.ki, NCL) == 0, "keyidx_walks_init");
	for (uint16_t s = 0; s < NCL; s++) {
		W.session[s] = sessions >> s & 1;
		if (W.session[s])
			CHECK(chan_restore_init(&W.sc, &W.ch[s], s, 1, 1000 + s % 2, UINT64_MAX, SQ) == 0, "chan_restore_init");
	}
	r = wheel_rebuild(&W.sc.wh, W.wmem, W.wsz, CAP, RES, W.now, &ws);
	if (r < 0)
		return r;
	/* What the old broker's nodes were, before anything is judged: each is counted once below. */
	for (uint32_t i = 0; i < W.sc.wh.w->high_water; i++)
		before += wheel_node(&W.sc.wh, i)->state != CHIME_NODE_FREE;
	wheel_group_owners(&W.sc.wh, W.user_of_slot);
	keyidx_init(&W.sc.ki, W.heads, W.nb, W.sc.wh.nodes, 0);
	CHECK(restore_nodes(&W.sc, old_now, &rs) == 0, "restore_nodes");
	for (uint32_t i = 0; i < W.sc.wh.w->high_water; i++)
		after += wheel_node(&W.sc.wh, i)->state != CHIME_NODE_FREE;
	CHECK(rs.kept + rs.grants == after && before == after + rs.anonymous + rs.anonymous_grants + rs.dropped,
	      "%llu nodes, then %llu: kept %llu, grants %llu, anonymous %llu (and %llu grants), damaged %llu",
	      (unsigned long long)before, (unsigned long long)after, (unsigned long long)rs.kept,
	      (unsigned long long)rs.grants, (unsigned long long)rs.anonymous,
	      (unsigned long long)rs.anonymous_grants, (unsigned long long)rs.dropped);
	return 0;
}

/* A wall-clock timer's event from the old ring, held: a step back after it fired may have moved it ahead. */
static bool wall_held(const struct chime_node *n)
{
	return n->state == CHIME_NODE_BACKLOG && (n->gen & CHIME_NODE_REALTIME) && chan_pos_old(n->cq_pos);
}

/* Every node free or a session's; the channels' counts; no held event before its time. */
static void check_restored(void)
{
	uint64_t owned[NCL] = { 0 }, held[NCL] = { 0 }, granted[NCL] = { 0 }, armed = 0, backlog = 0;
	uint32_t hw = W.sc.wh.w->high_water;

	wheel_check(&W.sc.wh);
	for (uint32_t i = 0; i < hw; i++) {
		const struct chime_node *n = wheel_node(&W.sc.wh, i);

		if (n->state == CHIME_NODE_FREE)
			continue;
		CHECK(n->owner < NCL && W.session[n->owner], "node %u of owner %u kept, no session", i, n->owner);
		CHECK(n->gen & CHIME_ID_GEN_MASK, "node %u kept with generation 0", i);
		owned[n->owner]++;
		switch (n->state) {
		case CHIME_NODE_ARMED:
		case CHIME_NODE_EXPIRED:
			armed++;
			break;
		case CHIME_NODE_BACKLOG:
			held[n->owner]++;
			CHECK(n->deadline_ns <= W.now || wall_held(n), "node %u held with deadline %llu ahead of now %llu",
			      i, (unsigned long long)n->deadline_ns, (unsigned long long)W.now);
			break;
		case CHIME_NODE_GRANTED:
			granted[n->owner]++;
			break;
		default:
			CHECK(false, "node %u kept in state %u", i, n->state);
		}
	}
	CHECK(armed == wheel_armed(&W.sc.wh), "armed %llu, the wheel says %llu", (unsigned long long)armed,
	      (unsigned long long)wheel_armed(&W.sc.wh));
	for (unsigned c = 0; c < NCL; c++) {
		const struct chan *ch = &W.ch[c];

		if (!W.session[c])
			continue;
		CHECK(ch->owned == owned[c] && ch->nr_backlog == held[c] && ch->nr_carried == granted[c],
		      "slot %u: owned %llu/%llu, backlog %llu/%llu, carried %u/%llu", c,
		      (unsigned long long)ch->owned, (unsigned long long)owned[c], (unsigned long long)ch->nr_backlog,
		      (unsigned long long)held[c], ch->nr_carried, (unsigned long long)granted[c]);
		backlog += ch->nr_backlog;
	}
	CHECK(backlog == W.sc.backlog, "backlog %llu, the shard says %llu", (unsigned long long)backlog,
	      (unsigned long long)W.sc.backlog);
}

/* What restore kept, to judge the events to come by. */
static void remember(void)
{
	for (uint32_t i = 0; i < CAP; i++) {
		const struct chime_node *n = wheel_node(&W.sc.wh, i);
		struct kept *k = &W.k[i];

		memset(k, 0, sizeof(*k));
		if (i >= W.sc.wh.w->high_water || n->state == CHIME_NODE_FREE || n->state == CHIME_NODE_GRANTED)
			continue;
		*k = (struct kept){ .kept = true, .oneshot = !n->period_ns, .owner = n->owner, .wall_held = wall_held(n),
				    .key = n->key, .ud = n->user_data, .deadline = n->deadline_ns, .period = n->period_ns };
	}
}

static void take_events(unsigned c)
{
	struct chime_cqe e;

	while (chime_cq_take(&W.cons[c], &e) == 1) {
		uint32_t idx = chime_id_index(e.id);
		struct kept *k = idx < CAP ? &W.k[idx] : NULL;

		CHECK(k && k->kept && k->owner == c, "slot %u: event of id %#llx, not one of its timers", c,
		      (unsigned long long)e.id);
		CHECK(e.key == k->key && e.user_data == k->ud, "slot %u: node %u's event with another key", c, idx);
		CHECK(e.deadline_ns <= W.now || (k->wall_held && !k->delivered), "node %u: event of deadline %llu at %llu",
		      idx, (unsigned long long)e.deadline_ns, (unsigned long long)W.now);
		if (k->oneshot) {
			CHECK(k->delivered == 0, "one-shot node %u delivered twice", idx);
			CHECK(e.deadline_ns == k->deadline, "one-shot node %u: event of deadline %llu, its deadline %llu",
			      idx, (unsigned long long)e.deadline_ns, (unsigned long long)k->deadline);
		} else {
			CHECK(k->delivered == 0 || e.deadline_ns > k->last, "periodic node %u: deadline %llu after %llu",
			      idx, (unsigned long long)e.deadline_ns, (unsigned long long)k->last);
		}
		k->delivered++;
		k->last = e.deadline_ns;
	}
	chime_cq_release(&W.cons[c]);
}

static void fire(void)
{
	uint32_t buf[16];
	unsigned n;

	/*
	 * Wall-clock timers (CLOCK_REALTIME arms) on this clock too: the
	 * shard's offset is 0 here, so they fire as the monotonic ones do,
	 * never early by the wall clock the firing checks.
	 */
	wall_pin(W.now);
	wheel_advance(&W.sc.wh, W.now);
	while ((n = wheel_pop_expired(&W.sc.wh, buf, 16)) > 0)
		for (unsigned i = 0; i < n; i++) {
			uint16_t owner = wheel_node(&W.sc.wh, buf[i])->owner;

			CHECK(owner < NCL && W.by_slot[owner], "node %u of owner %u fired, no channel", buf[i], owner);
			chan_fire(&W.sc, W.by_slot[owner], buf[i], W.now);
		}
}

/* Each session's next process: new rings; the clock runs past every deadline kept. */
static void run_out(void)
{
	uint64_t last = W.now;

	for (unsigned c = 0; c < NCL; c++) {
		if (!W.session[c])
			continue;
		memset(W.rw[c], 0, W.g.rw_size);
		memset(W.ro[c], 0, W.g.ro_size);
		chan_mem_layout(&W.m[c], W.rw[c], W.ro[c], &W.g, 0);
		chan_reattach(&W.sc, &W.ch[c], &W.m[c], false);
		chime_cq_cons_init(&W.cons[c], W.m[c].cq_slots, W.m[c].claim, &W.m[c].ro->cq_tail, &W.m[c].rw->cq_head, CQ);
	}
	for (uint32_t i = 0; i < CAP; i++)
		if (W.k[i].kept && W.k[i].oneshot && W.k[i].deadline > last && W.k[i].deadline < UINT64_MAX / 2)
			last = W.k[i].deadline;
	/* In steps to past the last deadline, then a few more there: a full ring holds the rest back until taken. */
	for (uint64_t start = W.now, end = last + 64 * RES, step = 0; step <= 36; step++) {
		W.now = step < 32 ? start + (end - start) / 32 * step : end;
		fire();
		for (unsigned c = 0; c < NCL; c++) {
			if (!W.session[c])
				continue;
			for (unsigned round = 0; round < 2 * CAP / CQ + 2; round++) {
				chan_service(&W.sc, &W.ch[c], W.now);
				take_events(c);
			}
		}
	}
	for (uint32_t i = 0; i < CAP; i++) {
		const struct kept *k = &W.k[i];

		if (k->kept && k->oneshot && k->deadline <= last)
			CHECK(k->delivered == 1, "one-shot node %u of deadline %llu delivered %u times by %llu", i,
			      (unsigned long long)k->deadline, k->delivered, (unsigned long long)W.now);
	}
}

/* Reclaim every session: the slab is all free after. */
static void reclaim_all(void)
{
	for (unsigned c = 0; c < NCL; c++) {
		if (!W.session[c])
			continue;
		for (unsigned n = 0; !chan_reclaim(&W.sc, &W.ch[c], 16); n++)
			CHECK(n < 4 * CAP, "slot %u: reclaim does not end", c);
		CHECK(W.ch[c].owned == 0, "slot %u reclaimed, owns %llu", c, (unsigned long long)W.ch[c].owned);
		chan_fini(&W.ch[c]);
		W.session[c] = false;
	}
	for (uint32_t i = 0; i < W.sc.wh.w->high_water; i++)
		CHECK(wheel_node(&W.sc.wh, i)->state == CHIME_NODE_FREE, "node %u left in state %u", i,
		      wheel_node(&W.sc.wh, i)->state);
	CHECK(wheel_armed(&W.sc.wh) == 0, "armed nodes left");
}

static void world_fini(void)
{
	for (unsigned c = 0; c < NCL; c++)
		if (W.session[c])
			chan_fini(&W.ch[c]);
	keyidx_walks_fini(&W.sc.ki);
	chan_wall_fini(&W.sc);
	stats_fini(&W.st);
	wheel_fini(&W.sc.wh);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint64_t old_now;

	if (!W.wmem)
		world_alloc();
	old_now = old_slab(&in);
	if (restore(&in, old_now) < 0) {
		wheel_fini(&W.sc.wh);
		for (unsigned c = 0; c < NCL; c++)
			if (W.session[c])
				chan_fini(&W.ch[c]);
		memset(W.session, 0, sizeof(W.session));
		keyidx_walks_fini(&W.sc.ki);
		chan_wall_fini(&W.sc);
		stats_fini(&W.st);
		return 0;
	}
	check_restored();
	remember();
	run_out();
	reclaim_all();
	world_fini();
	return 0;
}
