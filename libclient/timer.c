/* SPDX-License-Identifier: MIT */
/*
 * timer.c - chime_arm/reset/cancel/cancel_key: the submission fast path.
 *
 * Each call is one record in one shard's submission ring: reserve a slot
 * (a CAS on sq_tail), fill it, publish it (an atomic exchange: a full
 * barrier), then load the shard's sleep number and write its doorbell
 * only if it sleeps, once per sleep. No system call while the shard is
 * awake; no lock; any number of threads.
 *
 * - ARM takes its id from the slot's grant (a node the broker set aside for
 *   whoever writes this slot), so the id is known before the broker has
 *   seen anything. The shard is chosen round-robin per calling thread: a
 *   thread-local counter, so threads share no cache line to pick one.
 * - RESET and CANCEL go to the shard named in the id; CANCEL_KEY to every
 *   shard (a key's timers are spread over all of them).
 * - A full ring is waited out (spin, then yield, then short sleeps), never
 *   dropped; the wait gives up with -ENOTCONN if the broker dies meanwhile.
 */
#include <errno.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define likely(x)   __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

static __thread uint32_t tl_next_shard;    /* round-robin for this thread's ARMs */

/*
 * The ring is full: the shard is behind (or asleep, or dead). Wait for room:
 * spin first (the shard usually frees slots within microseconds, and a
 * syscall here would cost more than the wait), then yield, then sleep in
 * short steps; ring the doorbell in case the shard sleeps, and check at most
 * once a millisecond that the broker is still there.
 */
#define ROOM_SPIN_NS  50000u      /* pure spinning before the first syscall */
#define ROOM_YIELD_NS 1000000u    /* sched_yield until then, then 50 us naps */

static __attribute__((noinline)) struct chime_sqe *
wait_room(struct chime *c, struct chime_chan *ch, uint64_t *pos)
{
	uint64_t start = chime_now(), probed = start;
	struct chime_sqe *sqe;

	for (unsigned i = 1;; i++) {
		uint64_t now, waited;

		at_relax();
		sqe = chime_sq_reserve(&ch->sq, pos);
		if (sqe)
			return sqe;
		if (cl_is_dead(c))
			return NULL;
		if (i % 64)
			continue;
		now = chime_now();      /* vDSO: no syscall */
		waited = now - start;
		if (waited < ROOM_SPIN_NS)
			continue;
		/* S2 again: full barrier before the sleep-number load, as after a publish. */
		at_fence();
		cl_ring_doorbell(ch);
		if (now - probed >= ROOM_YIELD_NS) {
			probed = now;
			if (cl_broker_gone(c, true))
				return NULL;
		}
		if (waited < ROOM_YIELD_NS)
			sched_yield();
		else
			nanosleep(&(struct timespec){ .tv_nsec = 50000 }, NULL);
	}
}

static inline int submit(struct chime *c, uint32_t shard, uint32_t op, uint64_t id, uint64_t key,
			 uint64_t deadline_ns, uint64_t period_ns, uint64_t user_data, chime_id_t *out)
{
	struct chime_chan *ch = &c->chan[shard];
	struct chime_sqe *sqe;
	uint64_t pos;
	int refused = 0;

	if (unlikely(cl_is_dead(c)))
		return -ENOTCONN;
	sqe = chime_sq_reserve(&ch->sq, &pos);
	if (unlikely(!sqe)) {
		sqe = wait_room(c, ch, &pos);
		if (!sqe)
			return -ENOTCONN;
	}
	if (op == CHIME_OP_ARM) {
		/*
		 * The grant was stored before the slot's seq freed it for this
		 * position (broker: release); chime_sq_reserve() acquire-loaded
		 * that seq, so the grant is the one meant for us.
		 */
		id = at_load(&sqe->grant);
		if (unlikely(chime_grant_is_marker(id) || chime_id_shard(id) != shard)) {
			/* No node for us here: give the slot back, and say why. */
			refused = id == CHIME_GRANT_QUOTA ? -EDQUOT : -ENOMEM;
			op = CHIME_OP_NOP;
		}
	}
	/*
	 * Relaxed atomic stores (plain moves on x86): the drainer may peek at
	 * this slot meanwhile (chime_sq_peek: a seqlock read that discards a
	 * torn copy), and a plain store racing with it is undefined in C11.
	 */
	at_store(&sqe->id, id);
	at_store(&sqe->key, key);
	at_store(&sqe->deadline_ns, deadline_ns);
	at_store(&sqe->period_ns, period_ns);
	at_store(&sqe->user_data, user_data);
	at_store(&sqe->op, op);
	/* S1: the record, then seq (full barrier); pairs with the shard's acquire of seq. */
	chime_sq_publish(sqe, pos);
	cl_ring_doorbell(ch);
	if (unlikely(refused))
		return refused;
	if (out)
		*out = id;
	return 0;
}

static inline bool id_ok(const struct chime *c, chime_id_t id)
{
	return id != 0 && chime_id_gen(id) != 0 && chime_id_shard(id) < c->nr_shards;
}

CHIME_PUBLIC int chime_arm(chime_t *c, uint64_t key, uint64_t deadline_ns, uint64_t period_ns,
			   uint64_t user_data, chime_id_t *id)
{
	uint32_t s;
	int r;

	if (unlikely(!c || !id))
		return -EINVAL;
	s = tl_next_shard;
	if (s >= c->nr_shards)
		s = 0;
	tl_next_shard = s + 1;
	r = submit(c, s, CHIME_OP_ARM, 0, key, deadline_ns, period_ns, user_data, id);
	if (likely(r != -ENOMEM && r != -EDQUOT))
		return r;
	/* That shard is full, or has our share of the quota: any other one may have room. */
	for (uint32_t k = 1; k < c->nr_shards; k++) {
		int r2;

		if (++s == c->nr_shards)
			s = 0;
		r2 = submit(c, s, CHIME_OP_ARM, 0, key, deadline_ns, period_ns, user_data, id);
		if (r2 != -ENOMEM && r2 != -EDQUOT)
			return r2;
		if (r2 == -ENOMEM)
			r = -ENOMEM;    /* EDQUOT only if every shard said quota */
	}
	return r;
}

CHIME_PUBLIC int chime_reset(chime_t *c, chime_id_t id, uint64_t deadline_ns)
{
	if (unlikely(!c || !id_ok(c, id)))
		return -EINVAL;
	return submit(c, chime_id_shard(id), CHIME_OP_RESET, id, 0, deadline_ns, 0, 0, NULL);
}

CHIME_PUBLIC int chime_cancel(chime_t *c, chime_id_t id)
{
	if (unlikely(!c || !id_ok(c, id)))
		return -EINVAL;
	return submit(c, chime_id_shard(id), CHIME_OP_CANCEL, id, 0, 0, 0, 0, NULL);
}

CHIME_PUBLIC int chime_cancel_key(chime_t *c, uint64_t key)
{
	if (unlikely(!c))
		return -EINVAL;
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		int r = submit(c, s, CHIME_OP_CANCEL_KEY, 0, key, 0, 0, 0, NULL);

		if (r < 0)
			return r;
	}
	return 0;
}
