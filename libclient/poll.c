/* SPDX-License-Identifier: MIT */
/*
 * poll.c - the drainer: chime_poll, chime_dispatch, chime_wait.
 *
 * One thread at a time drains a chime_t; everything here is that thread's
 * private state except the shared words named in the labelled edges. Not
 * checked: an anonymous connection's drain takes no lock, and a check would
 * cost each one an atomic read-modify-write; overlapping drains are
 * undefined (two pollers move one cq.head: events lost, a drain run past the
 * tail; chime_poll(3)). Nothing is tied to the draining thread, so any
 * thread may drain next (ARCHITECTURE.md, "One drainer at a time").
 *
 * Per shard, per drain (ARCHITECTURE.md, "Cancels the shard has not read yet"):
 *
 *  1. D1: acquire-load cq_tail: the snapshot of events this drain may return.
 *     Nothing new: done (the fast path is this one load).
 *  2. D2: acquire-load sq_head, then scan our own published submission slots
 *     in [sq_head, sq_tail) for RESET, CANCEL and CANCEL_KEY into a private
 *     set. Because the shard publishes sq_head before the cq_tail of any event
 *     it produced after applying those records, every event in the snapshot
 *     was produced before each record in the set was applied: all of them
 *     are "in flight" with respect to those records. A record the shard
 *     consumed between our two loads (its slot already recycled) is waited
 *     out until sq_head passes it: then its VOIDs are visible in the claim
 *     words instead.
 *  3. Take events up to the snapshot. For each: its claim word must be FRESH
 *     (VOID: the shard's cancel or reset won; skip). If a CANCEL/CANCEL_KEY
 *     matches, claim it (FRESH -> TAKEN) and drop it: the shard, applying the
 *     cancel later, finds it taken and just frees the timer. If only a RESET
 *     matches, the event must NOT be claimed (the shard would take that as
 *     "received" and forget the reset): wait briefly until the shard applied
 *     the reset, which voids it. Else claim it and return it.
 *  4. D3: release-store cq_head; if the shard holds a backlog for us, ring its
 *     doorbell (if it sleeps): it must learn that there is room.
 *
 * Memory: the set is bounded by the ring size (2 * sq_size entries), whatever
 * the number of armed timers.
 *
 * chime_fd() is readable whenever events are pending, provided the
 * application drains until chime_poll() returns 0. It is an epoll set of two
 * things only we read: the connection, on which a shard sends one byte per
 * wake-up (and which reaches end of file when the broker dies), and our own
 * kick eventfd. A drain that finds nothing, when the caller may sleep next,
 * first reads both empty (recv until EAGAIN: a syscall on the way to sleep
 * only), then arms want_wakeup (W1, full barrier), then re-checks every ring:
 * an event published before the re-check is seen now; one published after it
 * makes its shard see want_wakeup and send a byte, which nothing reads before
 * we sleep. While events flow, want_wakeup is off and the shards make no
 * syscall for us.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define likely(x)   __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define DISPATCH_BATCH 64u
#define HOLD_SPINS     4096u     /* ~100 us waiting for a shard to apply a RESET */
#define CQ_AHEAD       8u        /* completion slots prefetched ahead of the one being drained */

#define TAG_KICK 1u
#define TAG_SOCK 2u

__thread char cl_thread_token __attribute__((tls_model("initial-exec")));

/*
 * Where a drain puts the events it claims: into an array (chime_poll,
 * chime_wait), or to a callback as each is claimed (chime_dispatch), so
 * that what a callback cancels or resets is judged before the next event
 * is claimed: a claimed event is the application's, and its timer gone.
 */
struct sink {
	struct chime_event *out;
	chime_cb cb;
	void *arg;
};

/* ---- the pending-cancel set ---- */

static inline uint32_t pend_hash(const struct chime *c, uint64_t what, uint32_t kind)
{
	return (uint32_t)(((what ^ kind) * UINT64_C(0x9e3779b97f4a7c15)) >> 32) & c->pend_mask;
}

static struct chime_pend *pend_find(const struct chime *c, uint64_t what, uint32_t kind)
{
	for (uint32_t i = pend_hash(c, what, kind);; i = (i + 1) & c->pend_mask) {
		struct chime_pend *p = &c->pend[i];

		if (p->kind == 0)
			return NULL;
		if (p->kind == kind && p->what == what)
			return p;
	}
}

static void pend_add(struct chime *c, uint64_t what, uint32_t kind, uint32_t flag, uint64_t pos)
{
	uint32_t i = pend_hash(c, what, kind);
	struct chime_pend *p;

	for (;; i = (i + 1) & c->pend_mask) {
		p = &c->pend[i];
		if (p->kind == 0)
			break;
		if (p->kind == kind && p->what == what) {
			if ((flag & CHIME_PEND_RESET) && !(p->flags & CHIME_PEND_RESET))
				p->reset_pos = pos;
			p->flags |= flag;
			return;
		}
	}
	/* At most sq_size records are scanned, so the table is never more than half full. */
	p->what = what;
	p->kind = kind;
	p->flags = flag;
	p->reset_pos = pos;
	c->pend_used[c->npend++] = i;
	c->npend_keys += kind == CHIME_PEND_KEY;
}

static void pend_clear(struct chime *c)
{
	for (uint32_t i = 0; i < c->npend; i++)
		c->pend[c->pend_used[i]].kind = 0;
	c->npend = 0;
	c->npend_keys = 0;
}

/*
 * Wait until the shard has applied the record at pos; false if it has not
 * in HOLD_SPINS (~100 us) or the broker died: the drain then holds its
 * events. One look only when the last drain held at the same record (a
 * stopped shard: every chime_wait() round, or a loop of chime_poll(), spun
 * its ~100 us again, 10% of a CPU at 1 ms rounds).
 */
static bool wait_applied(struct chime *c, struct chime_chan *ch, uint64_t pos)
{
	unsigned spins = ch->held_at == pos + 1 ? 1 : HOLD_SPINS;

	for (unsigned i = 1; at_load_acq(ch->sq_head) <= pos; i++) {
		if (i >= spins || (i % 1024 == 0 && cl_broker_gone(c, i % 65536 == 0))) {
			ch->held_at = pos + 1;
			return false;
		}
		at_relax();
	}
	return true;
}

/*
 * scan_pending()'s answer when a record the shard took is not applied yet
 * (below): the set is incomplete and no event of the ring may be judged.
 */
#define SCAN_UNSETTLED UINT64_MAX

/*
 * Step 2: collect the RESET/CANCEL/CANCEL_KEY records the shard has not
 * applied. Returns how many records it looked at, or SCAN_UNSETTLED.
 */
static uint64_t scan_pending(struct chime *c, struct chime_chan *ch)
{
	/* D2: after D1; pairs with the shard's release of sq_head after applying. */
	uint64_t head = at_load_acq(ch->sq_head);
	/* Our producers' CAS on sq_tail; they publish each slot later, with a full barrier. */
	uint64_t tail = at_load_acq(ch->sq.tail);

	pend_clear(c);
	if (head >= tail)
		return 0;
	if (tail - head > c->sq_size)
		head = tail - c->sq_size;
	for (uint64_t pos = head; pos != tail; pos++) {
		struct chime_sqe rec;
		uint64_t seq;

		if (!chime_sq_peek(ch->sq.slots, ch->sq.mask, pos, &rec)) {
			seq = at_load_acq(&ch->sq.slots[pos & ch->sq.mask].seq);
			/*
			 * seq == pos: reserved, not published yet: a concurrent call,
			 * which this drain need not honour. Anything else: the shard
			 * consumed it after our load of sq_head; once sq_head passes
			 * it, the VOIDs it caused are in the claim words. The shard
			 * publishes sq_head at the end of its batch, moments away,
			 * unless it stopped in the middle of it (SIGSTOP, a frozen
			 * cgroup, a debugger): then the drain holds the ring's events,
			 * as for a reset (drain_chan()). It waited 2^32 spins (minutes),
			 * and chime_poll(), which never blocks, spun on a CPU until the
			 * broker went on (found by an API audit). A broker gone
			 * never applies it: what it delivered is returned, as before.
			 */
			if (seq != pos && !wait_applied(c, ch, pos) && !cl_broker_gone(c, false))
				return SCAN_UNSETTLED;
			continue;
		}
		switch (rec.op) {
		case CHIME_OP_CANCEL:
			pend_add(c, rec.id, CHIME_PEND_ID, CHIME_PEND_CANCEL, pos);
			break;
		case CHIME_OP_RESET:
		case CHIME_OP_RESET_TOUCH:
			pend_add(c, rec.id, CHIME_PEND_ID, CHIME_PEND_RESET, pos);
			break;
		case CHIME_OP_CANCEL_KEY:
			pend_add(c, rec.key, CHIME_PEND_KEY, CHIME_PEND_CANCEL, pos);
			break;
		default:
			break;
		}
	}
	return tail - head;
}

/*
 * Records a drain scans before it wakes a sleeping shard to apply them:
 * records that can wait ring no doorbell (cl_doorbell_by(), up to half a
 * ring), but every drain with events pays a scan of them, so one that
 * finds this many has them applied rather than scan them again next time.
 */
#define SCAN_WAKE_MIN 64u

/* What a pending record says about an event: 0 keep, CANCEL drop, RESET hold. */
static uint32_t judge(const struct chime *c, const struct chime_cqe *e, struct chime_pend **reset)
{
	struct chime_pend *p = pend_find(c, e->id, CHIME_PEND_ID);

	if (c->npend_keys && pend_find(c, e->key, CHIME_PEND_KEY))
		return CHIME_PEND_CANCEL;
	if (!p || !p->flags)
		return 0;
	/* A cancel wins over a reset in either order: the timer ends cancelled. */
	if (p->flags & CHIME_PEND_CANCEL)
		return CHIME_PEND_CANCEL;
	*reset = p;
	return CHIME_PEND_RESET;
}

/*
 * A dispatch callback, run with a named session's lock let go: another
 * thread's arm, reset or cancel that waits for a reconnect (a planned
 * restart: stop_wait(), wait_room() in timer.c) takes the lock to make it,
 * and a callback that waits for that thread (a lock of the application's
 * that both take) held it: neither ever went on (an API audit). The drain
 * takes it back after; a reconnect meanwhile moved c->link, and the caller
 * stops there, as after a callback's own reconnect. Cancellation stays
 * put off through the callback, as it was under the lock.
 */
static void run_callback(struct chime *c, const struct sink *to, const struct chime_event *ev)
{
	int cancel;

	if (likely(!c->session[0])) {
		to->cb(ev, to->arg);
		return;
	}
	cancel = c->lock_cancel;        /* the thread's own, from before the drain took the lock */
	at_store(&c->drainer, (const char *)NULL);
	pthread_mutex_unlock(&c->lock); /* cancellation still off (cl_lock_try()) */
	to->cb(ev, to->arg);
	if (unlikely(at_load(&c->forked))) {
		/* The child of the callback's fork: another thread of the parent's may have held it then. */
		cl_cancel_restore(cancel);
		return;
	}
	/*
	 * Only a reconnect attempt can hold it now, a step at a time
	 * (reconnect.c). Cancellation is still off: the lock alone, and the
	 * state the next unlock gives back, which that holder's lock wrote over.
	 */
	while (pthread_mutex_trylock(&c->lock) != 0)
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 }, NULL);
	c->lock_cancel = cancel;
	at_store(&c->drainer, &cl_thread_token);
}

/* Step 4: what the drain took and skipped, up to the consumer's head, handed back. */
static void chan_release(struct chime_chan *ch)
{
	/* D3 (ring.h Q3): our copies are done; pairs with the shard's acquire of cq_head. */
	chime_cq_release(&ch->cq);
	/*
	 * D6: full barrier between our cq_head and the loads of backlog
	 * and of the shard's sleep number; pairs with the shard's barrier
	 * between publishing backlog (and its sleep number) and re-reading
	 * cq_head before it sleeps. Either it sees the room we made, or
	 * we see its backlog and ring. Without it both could read stale
	 * values and wait for each other forever (once a drain, not per event).
	 */
	at_fence();
	if (unlikely(at_load(ch->backlog) != 0))
		cl_ring_doorbell(ch);
}

/* Steps 1-4 for one shard. */
static unsigned drain_chan(struct chime *c, struct chime_chan *ch, const struct sink *to, unsigned max)
{
	struct chime_cq_cons *q = &ch->cq;
	uint64_t start = q->head, tail, link, scanned;
	unsigned n = 0;

	/* D1 (ring.h Q2): pairs with the shard's release of cq_tail after the cqe and its claim word. */
	tail = chime_cq_tail(q);
	ch->held = 0;
	if (likely(tail == start)) {
		ch->seen = tail;
		return 0;
	}
	if (unlikely(tail - start > c->cq_size)) {
		ch->seen = tail;        /* impossible from a sane broker: ignore */
		return 0;
	}
	if (at_load(ch->sq_head) == at_load(ch->sq.tail)) {
		pend_clear(c);
	} else if (unlikely((scanned = scan_pending(c, ch)) == SCAN_UNSETTLED)) {
		ch->held = 1;           /* nothing taken: judged by the next drain */
		ch->seen = tail;
		return 0;
	} else if (scanned >= SCAN_WAKE_MIN) {
		cl_ring_doorbell(ch);   /* S2: its load of `sleeping` follows the producers' barriers */
	}

	while (q->head != tail && n < max) {
		struct chime_pend *reset = NULL;
		const struct chime_cqe *e;
		uint32_t verdict;

		/*
		 * The lines ahead, while this one is judged: the shard wrote them
		 * on another core, and one transfer at a time was most of a
		 * drain's cost. Only below the tail: a line the shard is still
		 * writing would be pulled away from it. The claim words are
		 * prefetched for writing (our CAS), a line of eight at a time.
		 */
		if (likely(q->head + CQ_AHEAD < tail)) {
			uint64_t ahead = q->head + CQ_AHEAD;

			__builtin_prefetch(&q->slots[ahead & q->mask], 0);
			if ((ahead & 7) == 0 && ahead + 8 <= tail)
				__builtin_prefetch(&q->claim[ahead & q->mask], 1);
		}
		/* D4: a claim word not FRESH (VOID, or anything unexpected) means skip. */
		if (!chime_cq_fresh(q)) {
			chime_cq_skip(q);
			continue;
		}
		/* Judged in place (the slot is ours until D3 passes it) and copied only if returned. */
		e = chime_cq_head_slot(q);
		verdict = c->npend ? judge(c, e, &reset) : 0;
		if (verdict == CHIME_PEND_RESET) {
			/*
			 * Leave it FRESH for the shard to void; usually microseconds
			 * away. But a reset to a deadline after the shard's planned
			 * wake-up rang no doorbell (cl_doorbell_by()), and a sleeping
			 * shard would apply it only then, or at the next heartbeat:
			 * the drainer needs it now, so wake the shard (S2 as after a
			 * publication: a shard that is awake will see the record).
			 */
			at_fence();
			cl_ring_doorbell(ch);
			if (!wait_applied(c, ch, reset->reset_pos)) {
				ch->held = 1;
				break;
			}
			reset->flags &= ~CHIME_PEND_RESET;
			continue;       /* re-read the claim word */
		}
		/* D5 (ring.h Q5): FRESH -> TAKEN; pairs with the shard's CAS FRESH -> VOID. One wins. */
		if (!chime_cq_claim(q))
			continue;
		if (verdict == CHIME_PEND_CANCEL)
			continue;       /* cancelled before this drain: never returned */
		if (!to->cb) {
			to->out[n++] = (struct chime_event){
				.id = e->id, .key = e->key, .user_data = e->user_data,
				.deadline_ns = e->deadline_ns, .fired_ns = e->fired_ns,
			};
			continue;
		}
		n++;
		link = at_load(&c->link);
		run_callback(c, to, &(struct chime_event){
			.id = e->id, .key = e->key, .user_data = e->user_data,
			.deadline_ns = e->deadline_ns, .fired_ns = e->fired_ns,
		});
		/*
		 * A reconnect of the session while the callback ran (its own arm's,
		 * or another thread's) or a broker found dead: these rings are
		 * gone. Or it forked, and this is the child, back in its parent's
		 * drain: not one more event of the parent's, nor a store into its
		 * rings (libchime(3), FORK).
		 */
		if (unlikely(at_load(&c->link) != link || at_load(&c->forked)))
			return n;
		if (unlikely(c->voided | c->close_deferred)) {
			/*
			 * It cancelled or reset timers: the next events are judged by
			 * a new scan. Or it closed c: no event after it (chime_dispatch()).
			 */
			c->voided = 0;
			break;
		}
	}
	ch->seen = ch->held ? tail : q->head;
	if (q->head != start)
		chan_release(ch);
	return n;
}

/* Drain every shard, fairly: each drain starts one shard further. */
static unsigned drain(struct chime *c, const struct sink *to, unsigned max)
{
	uint32_t s = c->rr;
	unsigned n = 0;

	c->held = 0;
	/*
	 * A dispatch callback that closed c ends the drain here too: no other
	 * shard's event after it; nor, in the child of a callback's fork, of
	 * the parent's.
	 */
	for (uint32_t k = 0; k < c->nr_shards && n < max && !c->close_deferred && !at_load(&c->forked); k++) {
		struct sink rest = { to->out ? to->out + n : NULL, to->cb, to->arg };

		n += drain_chan(c, &c->chan[s], &rest, max - n);
		c->held |= c->chan[s].held;
		if (++s == c->nr_shards)
			s = 0;
	}
	if (++c->rr == c->nr_shards)
		c->rr = 0;
	return n;
}

/*
 * A named session's drainer state (seen, held, ww_armed) is reset by a
 * reconnect, which an arming thread may run (reconnect.c): the drainer
 * touches it under c->lock. Busy: a reconnect attempt under way, and the
 * caller has nothing to look at meanwhile. Anonymous connections take no lock.
 */
static bool drainer_trylock(struct chime *c)
{
	if (likely(!c->session[0]))
		return true;
	if (!cl_lock_try(c))
		return false;
	at_store(&c->drainer, &cl_thread_token);
	return true;
}

static void drainer_unlock(struct chime *c)
{
	/* Not after a fork in a dispatch callback: the child never took it back (run_callback()). */
	if (c->session[0] && at_load(&c->drainer) == &cl_thread_token) {
		at_store(&c->drainer, (const char *)NULL);
		cl_unlock(c);
	}
}

/* Anything published that the last drain did not look at? (acquire: D1 again) */
static bool pending(const struct chime *c)
{
	for (uint32_t s = 0; s < c->nr_shards; s++)
		if (at_load_acq(c->chan[s].cq.tail_pub) != c->chan[s].seen)
			return true;
	return false;
}

/* ---- the wake-up handshake ---- */

static void ww_arm(struct chime *c)
{
	/*
	 * W1: want_wakeup = 1 with a full barrier before the re-check; pairs
	 * with the shard's full barrier between publishing cq_tail and loading
	 * want_wakeup.
	 */
	at_store_sc(&c->rw->want_wakeup, 1);
	at_fence();
	c->ww_armed = 1;
}

static void ww_disarm(struct chime *c)
{
	/* W2: awake again: shards need not wake us (pairs with their CAS). */
	at_store(&c->rw->want_wakeup, 0);
	c->ww_armed = 0;
}

/*
 * Read chime_fd()'s sources empty: our kicks, and the wake-up bytes on the
 * connection. End of file there is the broker gone (its process died and
 * the kernel closed its end): from then on the drainer says -ENOTCONN.
 */
static void wake_clear(struct chime *c)
{
	uint64_t link = at_load_acq(&c->link);
	char buf[64];
	ssize_t n;

	if (c->kicks) {
		uint64_t v;

		if (read(c->kick_fd, &v, sizeof(v)) == sizeof(v))
			c->kicks = 0;
	}
	for (;;) {
		n = recv(c->sock, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || errno == ECONNRESET || errno == ENOTCONN)
			cl_lost(c, link);
		else if (errno != EAGAIN && errno != EWOULDBLOCK)
			(void)cl_broker_gone(c, true);  /* ours (ENOMEM): gone only if the socket says so */
		break;
	}
	if (c->timer_on) {      /* a session's made at its open: read only while it may have fired */
		uint64_t v;

		(void)!read(c->timer_fd, &v, sizeof(v));
	}
}

/* Make chime_fd() readable: more is pending than the caller took. */
static void kick(struct chime *c)
{
	uint64_t one = 1;

	if (write(c->kick_fd, &one, sizeof(one)) == sizeof(one))
		c->kicks++;
}

/*
 * Arm the fd's wake-up, and kick if anything is pending, or held: a held
 * ring's seen is its tail, yet its events are the application's once the
 * shard applies the record, and nothing wakes it then (the reset voids one
 * event, the ones behind it ring nothing). As poll_rings() kicks for a
 * held event, so that the application comes back.
 */
static void fd_arm(struct chime *c)
{
	bool held = false;

	for (uint32_t s = 0; s < c->nr_shards; s++)
		held |= c->chan[s].held != 0;
	ww_arm(c);
	if (held || pending(c))
		kick(c);
}

CHIME_PUBLIC int chime_fd(const chime_t *c)
{
	struct chime *m = (struct chime *)c;

	if (!c)
		return -EINVAL;
	if (at_load(&m->forked))
		return -ECHILD;
	/*
	 * From now on chime_poll() keeps the fd's promise (readable whenever
	 * events are pending) by arming want_wakeup whenever it runs dry; a
	 * client that only busy-polls never calls this and never costs the
	 * shards a wake-up message. The first call arms it now, since the
	 * application may go straight to its epoll_wait(). The cast: these
	 * are drainer fields, not the connection's observable value.
	 *
	 * The fd is an epoll set of the connection (wake-ups, and end of file
	 * when the broker dies) and our kick eventfd: nothing the broker or
	 * another client holds.
	 */
	if (at_load(&m->fd_used))
		return c->ep_fd;        /* a later call, from any thread (atomic: the first one wrote it) */
	if (!m->session[0]) {
		at_store(&m->fd_used, 1u);
		fd_arm(m);
		return c->ep_fd;
	}
	/*
	 * A session: a busy lock is a reconnect under way, which makes the fd
	 * readable when it is done; the chime_poll() that follows arms it.
	 */
	at_store(&m->fd_used, 1u);
	if (!drainer_trylock(m))
		return c->ep_fd;
	if (!cl_reconnecting(m))
		fd_arm(m);
	drainer_unlock(m);
	return c->ep_fd;
}

/*
 * Drain up to max events. `sleepy`: the caller may sleep on chime_fd()
 * afterwards (chime_wait, or an application that asked for chime_fd), so a
 * drain that finds nothing arms want_wakeup first. `want_kick`: returning to the
 * application with events left behind (max reached): make the fd readable.
 */
static int poll_rings(struct chime *c, const struct sink *to, unsigned max, bool sleepy, bool want_kick)
{
	unsigned n = drain(c, to, max);

	/* The child of a dispatch callback's fork: nothing of the parent's written (the wake-up request, its kicks). */
	if (unlikely(at_load(&c->forked)))
		return n ? (int)n : -ECHILD;
	if (n > 0) {
		c->empty_streak = 0;
		if (c->ww_armed)
			ww_disarm(c);
		/* One unread kick keeps the fd readable: another is a write(2) for nothing. */
		if (want_kick && !c->kicks && (n == max || c->held) && pending(c))
			kick(c);
		return (int)n;
	}
	if (sleepy && !c->held) {
		/*
		 * Clear BEFORE arming (W1), never after: a shard can win its
		 * 1 -> 0 CAS against our arm for events we already drained (it
		 * flushed them, was delayed, then saw the flag); if we swallowed
		 * that wake-up after arming, we would sleep with want_wakeup back
		 * at 0 and no shard would ever wake us again (found by the stress
		 * suite). Read first, and any wake-up after the read stays
		 * readable, and any CAS comes after our arm.
		 */
		wake_clear(c);
		ww_arm(c);
		if (pending(c)) {
			n = drain(c, to, max);
			if (n > 0) {
				ww_disarm(c);
				return (int)n;
			}
		}
	}
	if (sleepy && c->held)
		kick(c);        /* come back soon: a reset is about to void an event */
	c->empty_streak++;
	/* A session's broker gone: it reconnects (next call), and this call had nothing. */
	if (cl_is_dead(c) || cl_broker_check(c, chime_now()))
		return cl_is_dead(c) ? cl_dead_errno(c) : 0;
	return 0;
}

/*
 * A named session's drainer excludes a reconnect (reconnect.c), which
 * resets the drainer's state; while reconnecting it returns nothing, and
 * makes the attempts that are due. Anonymous connections take no lock.
 * The drainer is one thread, so a busy lock is a reconnect attempt under way
 * in an arming thread.
 */
static int poll_events(struct chime *c, const struct sink *to, unsigned max, bool sleepy, bool want_kick)
{
	int n;

	if (unlikely(at_load(&c->forked)))
		return -ECHILD;         /* the rings are the parent's: not one event for the child */
	if (likely(!c->session[0]))
		return poll_rings(c, to, max, sleepy, want_kick);
	/* Held only by a reconnect attempt (a handshake): nothing to return meanwhile, and no blocking. */
	if (!drainer_trylock(c))
		return cl_is_dead(c) ? cl_dead_errno(c) : 0;
	if (cl_reconnecting(c)) {
		wake_clear(c);  /* the timerfd that brought the caller here */
		(void)cl_reconnect(c, true);
	}
	if (cl_reconnecting(c))
		n = 0;
	else if (cl_is_dead(c))
		n = cl_dead_errno(c);
	else if ((n = poll_rings(c, to, max, sleepy, want_kick)) == 0 && cl_reconnecting(c))
		/*
		 * Found gone by this drain (its hang-up read, or a probe): the
		 * reconnect begins now, not at the next call. The dead socket
		 * leaves the fd's set, whose hang-up kept the fd readable with
		 * nothing new to report: a loop told of changes only (EPOLLET,
		 * an io_uring multishot poll) slept on for good after it.
		 */
		(void)cl_reconnect(c, true);
	drainer_unlock(c);
	cl_resume_flush(c);
	return n;
}

CHIME_PUBLIC int chime_poll(chime_t *c, struct chime_event *events, unsigned max)
{
	bool fd_used;
	int err;

	if (unlikely(!c || !events || max == 0))
		return -EINVAL;
	if ((err = cl_drain_refused(c)) < 0)
		return err;
	fd_used = at_load(&c->fd_used);
	return poll_events(c, &(struct sink){ .out = events }, max, fd_used, fd_used);
}

/*
 * Events pending for c now: in its rings, not yet read, and held by the
 * broker for want of room. At least 1, so that a dispatch with nothing
 * pending still drains once (a reconnect due, a dead broker, the fd's
 * wake-up armed). A count, not a promise: voided ones are skipped. A
 * session's rings are read under the drainer's lock (a reconnect replaces
 * them); with the lock busy, 1: the one round sees why.
 */
static unsigned pending_now(struct chime *c)
{
	uint64_t n = 0;

	if (!drainer_trylock(c))
		return 1;
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		const struct chime_chan *ch = &c->chan[s];

		n += at_load_acq(ch->cq.tail_pub) - ch->cq.head + at_load(ch->backlog);
	}
	drainer_unlock(c);
	return n == 0 ? 1 : n > UINT_MAX ? UINT_MAX : (unsigned)n;
}

/* One chime_dispatch() call's rounds of drains. */
struct dispatch_run {
	struct chime *c;
	const struct sink *to;
	unsigned limit;
	const char *outer;      /* c->dispatcher before the call */
	unsigned total;
	int err;
};

static void dispatch_rounds(struct dispatch_run *run)
{
	struct chime *c = run->c;

	while (run->total < run->limit) {
		unsigned want = run->limit - run->total < DISPATCH_BATCH ? run->limit - run->total : DISPATCH_BATCH;
		/* Runs until a round comes back empty: that one arms the fd's wake-up. */
		int n = poll_events(c, run->to, want, at_load(&c->fd_used), false);

		if (n <= 0) {
			run->err = n;
			break;
		}
		run->total += (unsigned)n;
		if (c->close_deferred)
			break;
	}
}

static void dispatch_cancelled(void *arg)
{
	const struct dispatch_run *run = arg;

	/*
	 * The events taken up to the callback's are consumed: left unreleased,
	 * the shard never saw them taken until another event came to that
	 * ring, and a periodic timer among them fired no more (its next event
	 * waits for that), a one-shot's node stayed held. A session's drain
	 * is not cancelled before it released them (cl_lock_try()); a child
	 * forked by the callback writes nothing of its parent's.
	 */
	for (uint32_t s = 0; !run->c->session[0] && !at_load(&run->c->forked) && s < run->c->nr_shards; s++)
		chan_release(&run->c->chan[s]);
	at_store(&run->c->dispatcher, run->outer);
	/* A callback's close waited for the dispatch to return, which it never does now. */
	if (run->c->close_deferred)
		chime_close(run->c);
}

CHIME_PUBLIC int chime_dispatch(chime_t *c, chime_cb cb, void *arg, unsigned max)
{
	/*
	 * max 0: what is pending now, so that callbacks re-arming at once
	 * cannot stretch the call (they did: a limit of every ring's size let
	 * callbacks re-arming at deadline 0 keep one call going for seconds).
	 */
	unsigned limit, total;
	/*
	 * Each event is claimed just before its callback, inside the drain, and
	 * a callback that cancels or resets cuts the drain short
	 * (cl_note_void()), so that the next event is judged against it.
	 */
	struct sink to = { NULL, cb, arg };
	const char *outer;      /* NULL, but for another thread's overlapping dispatch (not checked) */
	struct dispatch_run run = { .c = c, .to = &to };
	int err;

	if (unlikely(!c || !cb))
		return -EINVAL;
	if ((err = cl_drain_refused(c)) < 0)
		return err;
	limit = max ? max : pending_now(c);
	if (limit > INT_MAX)
		limit = INT_MAX;        /* the count returned: a periodic timer catching up could pass it */
	outer = at_load(&c->dispatcher);
	c->voided = 0;
	at_store(&c->dispatcher, &cl_thread_token);
	/*
	 * A thread cancelled in a callback (an anonymous connection's: a
	 * session's are not cancelled there, run_callback()) gives c back:
	 * left marked as dispatching, every later drain of it returned
	 * -EDEADLK and chime_close() waited for a dispatch that had gone
	 * (an API audit). A callback must return; chime_dispatch(3).
	 */
	run.limit = limit;
	run.outer = outer;
	pthread_cleanup_push(dispatch_cancelled, &run);
	dispatch_rounds(&run);
	pthread_cleanup_pop(0);
	total = run.total;
	err = run.err;
	at_store(&c->dispatcher, outer);
	if (c->close_deferred) {
		/* A callback closed c (chime_close()): now that no drain is under way. */
		chime_close(c);
		return (int)total;
	}
	if (err < 0)
		return total ? (int)total : err;
	/*
	 * Stopped by the limit, not by an empty ring: the last batch disarmed
	 * want_wakeup, and if nothing is pending right now no kick follows
	 * either. Re-arm it (and kick if something is pending) so that the fd
	 * keeps its promise to an application that goes back to epoll_wait().
	 * Clear the fd first, as an empty round does (poll_rings(): clear, then
	 * arm): the wake-up that brought the caller here announced events now
	 * drained, and left unread it made every other wake-up find nothing
	 * (idle wake-ups 47-50% of them; with the clear, see the test).
	 */
	if (total == limit && at_load(&c->fd_used) && drainer_trylock(c)) {
		/* Dead (an arming thread gave up meanwhile): its kick keeps the fd readable (chime_fd(3)). */
		if (!cl_reconnecting(c) && !cl_is_dead(c)) {
			wake_clear(c);
			fd_arm(c);      /* else the reconnect makes the fd readable */
			/* one begun or given up since the check: the clear may have read its kick or timer away */
			if (cl_reconnecting(c) || cl_is_dead(c))
				kick(c);
		}
		drainer_unlock(c);
	}
	return (int)total;
}

/* ---- chime_wait: sleep on the socket and the kick eventfd ---- */

static int sleep_poll(struct chime *c, uint64_t timeout_ns);

/* Take the polls' completions that have come (no system call). */
static void reap(struct chime *c)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;

	io_uring_for_each_cqe(&c->ring, head, cqe) {
		if (cqe->user_data == TAG_KICK) {
			c->kick_polled = false;
		} else if (cqe->user_data == TAG_SOCK) {
			c->sock_polled = false;
			if (cqe->res > 0 && (cqe->res & (POLLRDHUP | POLLHUP | POLLERR)))
				(void)cl_broker_gone(c, true);
		}
		seen++;
	}
	io_uring_cq_advance(&c->ring, seen);
}

/*
 * This thread's number as a waiter (sleep_uring()), from 1, never reused:
 * 0 until its first sleep. Not &cl_thread_token: glibc gives a new thread
 * the cached stack, and with it the TLS, of one that exited, and the new
 * thread took the polls the old one left for its own and slept on them,
 * to be woken a tick late (found by an API audit).
 */
static __thread uint64_t tl_waiter __attribute__((tls_model("initial-exec")));
static uint64_t waiters;        /* atomic: numbers handed out */

static uint64_t waiter_no(void)
{
	if (unlikely(!tl_waiter))
		tl_waiter = at_add(&waiters, 1);
	return tl_waiter;
}

static int sleep_uring(struct chime *c, uint64_t timeout_ns)
{
	struct __kernel_timespec ts = {
		.tv_sec = (long long)(timeout_ns / 1000000000u),
		.tv_nsec = (long long)(timeout_ns % 1000000000u),
	};
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	int r;

	/*
	 * The polls are one-shot and stay outstanding across waits until they
	 * fire. One another thread left outstanding completes late if that
	 * thread has exited: the kernel posts it from its fallback work, a
	 * tick later (4 ms at HZ=250, every time, found by an API audit). So
	 * a thread that did not submit the polls still outstanding sleeps in
	 * ppoll() instead; once they have fired it submits its own.
	 */
	reap(c);
	if ((c->kick_polled || c->sock_polled) && c->polls_by != waiter_no())
		return sleep_poll(c, timeout_ns);
	c->polls_by = waiter_no();
	if (!c->kick_polled && (sqe = io_uring_get_sqe(&c->ring))) {
		io_uring_prep_poll_add(sqe, c->kick_fd, POLLIN);
		io_uring_sqe_set_data64(sqe, TAG_KICK);
		c->kick_polled = true;
	}
	if (!c->sock_polled && (sqe = io_uring_get_sqe(&c->ring))) {
		/* A wake-up byte, or the broker's hang-up (POLLHUP, POLLERR are always reported). */
		io_uring_prep_poll_add(sqe, c->sock, POLLIN | POLLRDHUP);
		io_uring_sqe_set_data64(sqe, TAG_SOCK);
		c->sock_polled = true;
	}
	/*
	 * Submit, then wait with nothing to submit. A wait that also submits
	 * returns the number submitted even when a signal cut the wait short,
	 * and liburing then waits again: the -EINTR was lost and the caller
	 * slept on. If the polls cannot go in now, they stay queued for the
	 * next sleep and ppoll() sleeps this once.
	 */
	if (io_uring_sq_ready(&c->ring) && io_uring_submit(&c->ring) < 0)
		return sleep_poll(c, timeout_ns);
	if (timeout_ns == UINT64_MAX)
		r = io_uring_wait_cqe(&c->ring, &cqe);
	else
		r = io_uring_wait_cqe_timeout(&c->ring, &cqe, &ts);
	if (r < 0 && r != -ETIME)
		return r;
	reap(c);
	return 0;
}

static int sleep_poll(struct chime *c, uint64_t timeout_ns)
{
	struct pollfd pfd[2] = {
		{ .fd = c->kick_fd, .events = POLLIN },
		{ .fd = c->sock, .events = POLLIN | POLLRDHUP },
	};
	struct timespec ts = {
		.tv_sec = (time_t)(timeout_ns / 1000000000u),
		.tv_nsec = (long)(timeout_ns % 1000000000u),
	};
	int r = ppoll(pfd, 2, timeout_ns == UINT64_MAX ? NULL : &ts, NULL);

	if (r < 0)
		return errno == EINTR ? -EINTR : -errno;
	if (pfd[1].revents & (POLLRDHUP | POLLHUP | POLLERR))
		(void)cl_broker_gone(c, true);
	return 0;
}

/*
 * Before sleeping, watch the rings for a while: events that trickle in a few
 * microseconds apart (timers firing on time at a high rate) would otherwise
 * cost a sleep, a wake-up message from the shard and a wake-up each, and a
 * drainer that pays a wake-up per event or two falls behind (seen: 100 ms of
 * backlog at 333k events/s on 2 cores). Spin a few microseconds, then yield
 * the core (to the shard, on a small host) until the budget is spent.
 * The budget adapts (client.h, wait_spin_shift): a spin that catches
 * nothing halves the next one, down to WAIT_SPIN_NS >> WAIT_SPIN_MAX_SHIFT;
 * one that catches an event, or a sleep shorter than WAIT_SPIN_NS (the whole
 * spin would have caught its event), restores it. Sparse events (a timer a
 * millisecond) then cost the waiting thread 6 us of spinning each, not 50.
 * Returns true as soon as something is pending.
 */
#define WAIT_PURE_SPIN_NS   5000u

static bool spin_for_events(struct chime *c, uint64_t left_ns)
{
	uint64_t start = chime_now(), budget_ns;
	bool got = false;

	/* At most the budget: an arming thread's reconnect attempt waits that long. */
	if (!drainer_trylock(c))
		return true;    /* a reconnect under way: back to poll_events() */
	if (!spin_allowed(&c->wait_spin, start)) {
		drainer_unlock(c);
		return false;   /* a busy host (spin.h): sleep at once */
	}
	budget_ns = WAIT_SPIN_NS >> c->wait_spin_shift;
	budget_ns = left_ns < budget_ns ? left_ns : budget_ns;
	for (unsigned i = 1;; i++) {
		uint64_t spent;

		if ((got = pending(c)))
			break;
		at_relax();
		if (i % 32)
			continue;
		spent = chime_now() - start;
		if (spent >= budget_ns)
			break;
		if (spent >= WAIT_PURE_SPIN_NS) {
			uint64_t before = start + spent, now;

			sched_yield();
			now = chime_now();
			spin_yielded(&c->wait_spin, now - before, now);
			if (!spin_allowed(&c->wait_spin, now))
				break;
		}
	}
	if (got)
		c->wait_spin_shift = 0;
	else if (c->wait_spin_shift < WAIT_SPIN_MAX_SHIFT)
		c->wait_spin_shift++;
	drainer_unlock(c);
	return got;
}

/* After a sleep of slept_ns: one shorter than the whole spin ends the short spins. */
static void wait_spin_slept(struct chime *c, uint64_t slept_ns)
{
	if (slept_ns >= WAIT_SPIN_NS || !drainer_trylock(c))
		return;
	c->wait_spin_shift = 0;
	drainer_unlock(c);
}

/* chime_wait()'s naps while an event is held: the first, and at most (doubled between). */
#define HELD_NAP_MIN_NS 20000L
#define HELD_NAP_MAX_NS 1000000L

/* An event waits for its shard to apply a reset (drain() held it back). */
static bool events_held(struct chime *c)
{
	bool held;

	if (!drainer_trylock(c))
		return false;
	held = c->held;
	drainer_unlock(c);
	return held;
}

/* Time until deadline (UINT64_MAX: none) in *left; false once it has passed. */
static bool time_left(uint64_t deadline, uint64_t *left)
{
	uint64_t now = chime_now();

	if (now >= deadline)
		return false;
	*left = deadline == UINT64_MAX ? UINT64_MAX : deadline - now;
	return true;
}

CHIME_PUBLIC int chime_wait(chime_t *c, struct chime_event *events, unsigned max, int timeout_ms)
{
	uint64_t deadline = UINT64_MAX;
	unsigned ready_again = 0;
	long held_nap_ns = HELD_NAP_MIN_NS;
	int err;

	if (unlikely(!c || !events || max == 0 || timeout_ms < -1))
		return -EINVAL;
	if ((err = cl_drain_refused(c)) < 0)
		return err;
	if (timeout_ms == 0)
		return chime_poll(c, events, max);  /* exactly chime_poll() */
	if (timeout_ms > 0)
		deadline = chime_now() + (uint64_t)timeout_ms * 1000000u;
	for (;;) {
		/* Not sleepy yet: an empty drain here must not arm want_wakeup. */
		int n = poll_events(c, &(struct sink){ .out = events }, max, false, false);
		uint64_t left, slept;

		if (n != 0)
			return n;
		if (!time_left(deadline, &left))
			return 0;
		if (unlikely(cl_reconnecting(c))) {
			/*
			 * No broker to wait on: sleep until the next attempt is due
			 * or an attempt's answer comes (poll_events goes on with it),
			 * both of which make chime_fd()'s set readable.
			 */
			struct pollfd pfd = { .fd = c->ep_fd, .events = POLLIN };
			uint64_t ns = cl_reconnect_wait_ns(c);
			int r;

			ns = ns < left ? ns : left;
			ns = ns > 1000000u ? ns : 1000000u;
			r = ppoll(&pfd, 1, &(struct timespec){ .tv_sec = (time_t)(ns / 1000000000u),
							       .tv_nsec = (long)(ns % 1000000000u) }, NULL);
			if (r < 0 && errno == EINTR)
				return -EINTR;  /* as the sleeps on a broker: a signal ends the wait */
			/*
			 * Readable again with nothing done: another thread holds the
			 * lock (an attempt of its own) and will clear it. Not a spin.
			 */
			if (r > 0 && ready_again++) {
				if (nanosleep(&(struct timespec){ .tv_nsec = 200000 }, NULL) < 0 && errno == EINTR)
					return -EINTR;  /* a nap is the wait's sleep too */
			} else if (r == 0)
				ready_again = 0;
			continue;
		}
		/* not while an event is held: the naps below look for it */
		if (held_nap_ns == HELD_NAP_MIN_NS && spin_for_events(c, left))
			continue;
		/* About to sleep: arm want_wakeup and look once more (poll_events does both). */
		n = poll_events(c, &(struct sink){ .out = events }, max, true, false);
		if (n != 0)
			return n;
		if (!time_left(deadline, &left))
			return 0;
		if (events_held(c)) {
			/*
			 * Back in a moment: the reset is applied within a shard
			 * pass. Waiting on the socket's hang-up alone: a broker
			 * killed with the reset unapplied never applies it, and
			 * without this the loop went on until its heartbeat was a
			 * second old (cl_broker_check()); the event comes back
			 * through the next broker. Naps that double: a stopped
			 * broker (SIGSTOP, a debugger) takes as long as it likes,
			 * and at 20 us apart the wait burned half a CPU meanwhile.
			 */
			struct pollfd pfd = { .fd = c->sock, .events = POLLRDHUP };

			int r = ppoll(&pfd, 1, &(struct timespec){ .tv_nsec = held_nap_ns }, NULL);

			if (r > 0)
				(void)cl_broker_gone(c, true);
			else if (r < 0 && errno == EINTR)
				return -EINTR;
			if (held_nap_ns < HELD_NAP_MAX_NS)
				held_nap_ns *= 2;
			continue;
		}
		held_nap_ns = HELD_NAP_MIN_NS;
		/*
		 * No wake-up asked: the look above found the session's lock
		 * taken (a thread's reconnect check, between the spin and the
		 * look), or a shard has just taken the request and sent its
		 * byte. A sleep now could outlast events already coming (a
		 * stress review): look again in a moment instead.
		 */
		if (unlikely(c->session[0] && !at_load(&c->rw->want_wakeup))) {
			if (nanosleep(&(struct timespec){ .tv_nsec = 200000 }, NULL) < 0 && errno == EINTR)
				return -EINTR;  /* a nap is the wait's sleep too */
			continue;
		}
		slept = chime_now();
		n = c->has_ring ? sleep_uring(c, left) : sleep_poll(c, left);
		if (n < 0)
			return n;
		wait_spin_slept(c, chime_now() - slept);
	}
}
