/* SPDX-License-Identifier: MIT */
/*
 * reconnect.c - a named session does not see its broker restart
 * (ARCHITECTURE.md, "libchime's reconnect").
 *
 *   CONNECTED --broker gone--> RECONNECTING --welcome, same geometry--> CONNECTED
 *                                   +--30 s ($CHIME_RECONNECT_S), or a broker it
 *                                      cannot resume with, or one that no longer
 *                                      has the session as we left it--> DEAD
 *
 * While reconnecting:
 * - every submission ring is closed: its tail jumps to a position no slot is
 *   free for (every seq is below it, ring.h), so producers wait in
 *   wait_room() as on a full ring, and one still holding an older position
 *   can never claim a slot, in this ring or the next;
 * - the drainer returns nothing: what the old completion rings still hold
 *   comes back through the new broker (a planned stop settled it by claim
 *   word; after a crash the new broker delivers it again);
 * - attempts back off from 10 ms to 1 s; a timerfd in chime_fd()'s epoll
 *   set makes the fd readable when one is due;
 * - an attempt never waits for the broker: the call that is due sends the
 *   hello, the socket joins the epoll set, and a later call takes the
 *   welcome (up to DIAL_WAIT_NS after the hello).
 *
 * On a welcome: the records the old broker never read (published, their
 * slot not freed) are copied in order into the new rings, which start at the
 * closed position, and a RESUMED follows them (the broker then frees the
 * grants it carried for them). Then the new segments are moved onto the old
 * addresses (mremap) and the new doorbells and socket onto the old fd
 * numbers (dup3): no thread ever holds a pointer or an fd that goes away,
 * chime_fd() keeps its number, and ids stay valid.
 *
 * Everything here runs under c->lock, which the drainer holds too; `link`
 * and `dead` are the only words other threads read. `link` numbers the
 * connections, so that evidence about a replaced one (a hang-up seen late)
 * cannot start a reconnect of the new one.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define likely(x)        __builtin_expect(!!(x), 1)
#define RECONNECT_S      30u                            /* chime_open(3): then -ENOTCONN */
#define RECONNECT_MAX_S  86400u
#define BACKOFF_MIN_NS   (UINT64_C(10) * 1000000u)
#define BACKOFF_MAX_NS   (UINT64_C(1000) * 1000000u)
#define INFLIGHT_WAIT_NS (UINT64_C(1000) * 1000000u)    /* a producer between its claim and publish */
#define DIAL_WAIT_NS     (UINT64_C(10000) * 1000000u)   /* a welcome's wait: chime_open()'s 10 s */

uint64_t cl_reconnect_window(void)
{
	const char *v = secure_getenv("CHIME_RECONNECT_S");
	char *end;
	unsigned long s;

	if (!v || !*v)
		return (uint64_t)RECONNECT_S * 1000000000u;
	errno = 0;
	s = strtoul(v, &end, 10);
	if (errno || *end || v[0] == '-' || s > RECONNECT_MAX_S)
		return (uint64_t)RECONNECT_S * 1000000000u;    /* not a number of seconds: the default */
	return (uint64_t)s * 1000000000u;
}

void cl_lost(struct chime *c, uint64_t link)
{
	if (!c->session[0] || !c->recon_window_ns)
		at_store(&c->dead, 1);
	else if (!(link & 1))
		(void)at_cas(&c->link, &link, link | 1);    /* L1: fails if already, or a newer connection */
}

uint64_t cl_reconnect_wait_ns(struct chime *c)
{
	uint64_t now = chime_now(), next = at_load(&c->recon_next_ns);

	return next > now ? next - now : 0;
}

uint64_t cl_reconnect_answer_by(struct chime *c)
{
	uint64_t by = 0;

	if (!cl_lock_try(c))
		return 0;
	if (c->recon_sock >= 0)
		by = c->recon_dial_until_ns;
	cl_unlock(c);
	return by;
}

void cl_reconnect_hurry(struct chime *c)
{
	uint64_t now = chime_now();

	if (at_load(&c->recon_next_ns) > now)
		at_store(&c->recon_next_ns, now);
}

/* chime_fd() becomes readable at `at` (CLOCK_MONOTONIC ns), or never (0). */
static void timer_set(struct chime *c, uint64_t at)
{
	struct itimerspec its = {
		.it_value = { .tv_sec = (time_t)(at / 1000000000u), .tv_nsec = (long)(at % 1000000000u) },
	};

	if (c->timer_fd >= 0)
		(void)timerfd_settime(c->timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
	c->timer_on = c->timer_fd >= 0 && at != 0;     /* a setting clears what had fired */
}

/* Close every submission ring (see the top). */
static void rings_close(struct chime *c)
{
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		struct chime_chan *ch = &c->chan[s];
		uint64_t size = (uint64_t)ch->sq.mask + 1, cur = at_load(ch->sq.tail), to;

		/* Every seq is below cur + size: nothing is free at `to` or after. */
		do
			to = (cur + 2 * size) & ~(size - 1);
		while (!at_cas(ch->sq.tail, &cur, to));
		ch->closed_from = cur;
		ch->closed_at = to;
	}
}

/*
 * Every position claimed before the close is published (a producer between
 * its claim and its publish is moments away from it). Until then the rings
 * must not move: its late stores would land in the new ones.
 */
static bool rings_settled(struct chime *c)
{
	uint64_t until = chime_now() + INFLIGHT_WAIT_NS;

	for (uint32_t s = 0; s < c->nr_shards; s++) {
		struct chime_chan *ch = &c->chan[s];
		uint64_t size = (uint64_t)ch->sq.mask + 1;

		for (uint64_t pos = ch->closed_from > size ? ch->closed_from - size : 0; pos < ch->closed_from; pos++)
			while (at_load_acq(&ch->sq.slots[pos & ch->sq.mask].seq) == pos) {
				if (chime_now() >= until)
					return false;
				sched_yield();
			}
	}
	return true;
}

int cl_reconnect_prepare(struct chime *c)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int r;

	c->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (c->timer_fd < 0)
		return -errno;
	if (epoll_ctl(c->ep_fd, EPOLL_CTL_ADD, c->timer_fd, &ev) < 0) {
		r = -errno;
		close(c->timer_fd);
		c->timer_fd = -1;
		return r;
	}
	return 0;
}

static void begin(struct chime *c, uint64_t now)
{
	rings_close(c);
	/* The old connection only says "gone" now: out of the fd's set until the new one replaces it. */
	(void)epoll_ctl(c->ep_fd, EPOLL_CTL_DEL, c->sock, NULL);
	if (c->timer_fd < 0)
		(void)cl_reconnect_prepare(c);  /* chime_open() made it: not reached */
	c->recon_give_up_ns = now + c->recon_window_ns;
	c->recon_backoff_ns = BACKOFF_MIN_NS;
	at_store(&c->recon_next_ns, now);
	c->recon_begun = true;
}

static void put(struct chime_sqe *slots, uint32_t mask, uint64_t pos, const struct chime_sqe *r)
{
	struct chime_sqe *q = &slots[pos & mask];

	at_store(&q->id, r->id);
	at_store(&q->key, r->key);
	at_store(&q->deadline_ns, r->deadline_ns);
	at_store(&q->period_ns, r->period_ns);
	at_store(&q->user_data, r->user_data);
	at_store(&q->op, r->op);
	chime_sq_publish(q, pos);
}

/*
 * Copy what the old broker never read into the new rings (rw: not visible
 * to any other thread yet; the new broker may read along, in order).
 */
static void resubmit(struct chime *c, const struct chime_map *rw, const struct chime_client_geom *g,
		     uint64_t base, bool claims)
{
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		const struct chime_chan *ch = &c->chan[s];
		struct chime_sqe *slots = chime_at(rw, g->rw_sq_off + (uint64_t)s * g->sq_size * sizeof(struct chime_sqe));
		struct chime_chan_rw *crw = chime_at(rw, g->rw_chan_off + s * sizeof(*crw));
		uint64_t *claim = chime_at(rw, g->rw_claim_off + (uint64_t)s * g->cq_size * sizeof(uint64_t));
		uint64_t size = g->sq_size, pos = base;

		/*
		 * The old ring's claim words, each where it was (the sizes are
		 * the same): they say which events we took and which the old
		 * broker voided, which the head alone cannot (it passes both),
		 * and a park voids the events it holds again. No one writes
		 * them now: the old broker is gone, and we hold the drainer's
		 * lock. A broker gone again before it read them finds them here
		 * for the next one: a new ring's words are written only by an
		 * event it delivers, and a broker delivers none before it read
		 * these (its settle, chan.c), if it says so in its welcome: one
		 * before that delivers at once, and the copy would overwrite
		 * those events' words (they would be skipped, lost).
		 */
		for (uint32_t i = 0; claims && i < g->cq_size; i++)
			claim[i] = at_load(&ch->cq.claim[i]);
		crw->resume_claims = claims;
		/*
		 * R1: every event below our old head was consumed (taken, or
		 * skipped as voided): after a crash the new broker holds back the
		 * ones its predecessor delivered until it has read this, and
		 * delivers again only those we never took (exactly once).
		 */
		crw->resume_cq_head = ch->cq.head;
		at_store_rel(&crw->resume_set, 1u);

		for (uint64_t p = ch->closed_from > size ? ch->closed_from - size : 0; p < ch->closed_from; p++) {
			struct chime_sqe r;

			/* Published and its slot never freed: the old broker did not apply it. */
			if (!chime_sq_peek(ch->sq.slots, ch->sq.mask, p, &r))
				continue;
			if (r.op == CHIME_OP_ARM || r.op == CHIME_OP_ARM_REALTIME || r.op == CHIME_OP_RESET ||
			    r.op == CHIME_OP_CANCEL || r.op == CHIME_OP_CANCEL_KEY)
				put(slots, g->sq_size - 1, pos++, &r);
		}
		/* A ring full of records leaves no room: RESUMED follows once the rings are live. */
		if (pos - base < size) {
			put(slots, g->sq_size - 1, pos++, &(struct chime_sqe){ .op = CHIME_OP_RESUMED });
		} else {
			at_store(&c->chan[s].resumed_owed, 1u);
			at_store_rel(&c->resumed_owed, 1u);
		}
		at_store_rel(&crw->sq_tail, pos);
	}
}

/* Move the new segment onto the old one's address: the old one is unmapped by it. */
static int move_onto(struct chime_map *from, struct chime_map *onto)
{
	void *p = mremap(from->base, from->size, from->size, MREMAP_MAYMOVE | MREMAP_FIXED, onto->base);

	if (p == MAP_FAILED)
		return -errno;
	from->base = NULL;
	return 0;
}

/* The drainer's view of the new rings: same addresses, positions from the new segment. */
static void drainer_reset(struct chime *c)
{
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		struct chime_chan *ch = &c->chan[s];

		ch->cq.head = ch->cq.tail = at_load(ch->cq.head_pub);
		ch->seen = ch->cq.head;
		ch->held = 0;
		ch->held_at = 0;
		ch->closed_from = ch->closed_at = 0;
		at_store(&ch->rung, 0);
	}
	c->held = 0;
	c->ww_armed = 0;
	c->empty_streak = 0;
	at_store(&c->last_sock_check_ns, 0);
}

/*
 * Send an attempt's hello; its welcome is awaited by attempt(). The socket
 * joins chime_fd()'s set, so that the fd is readable when the answer comes.
 */
static int dial_start(struct chime *c, uint64_t now)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
	uint64_t base = 0;
	int r;

	if (!rings_settled(c))
		return -EAGAIN;         /* a stuck producer: try again, or give up at the deadline */
	for (uint32_t s = 0; s < c->nr_shards; s++)
		base = c->chan[s].closed_at > base ? c->chan[s].closed_at : base;
	r = cl_dial_start(c->path, c->session, CHIME_HELLO_RESUME, base, c->session_token, false, &c->recon_sock);
	if (r < 0)
		return r;
	c->recon_base = base;
	if (epoll_ctl(c->ep_fd, EPOLL_CTL_ADD, c->recon_sock, &ev) < 0) {
		/* Unwatched, the answer would wake nobody until DIAL_WAIT_NS: a failed attempt (ENOSPC, ENOMEM). */
		r = -errno;
		cl_sock_close(&c->recon_sock);
		return r;
	}
	/* No answer by then: the attempt failed (the fd is readable at it, through the timerfd). */
	c->recon_dial_until_ns = now + DIAL_WAIT_NS;
	at_store(&c->recon_next_ns, c->recon_dial_until_ns);
	timer_set(c, c->recon_dial_until_ns);
	return 0;
}

/*
 * The attempt's socket, out of chime_fd()'s set, to be closed by the
 * caller (cl_sock_close(), after it is dup3()'d onto c->sock if the
 * attempt succeeded): it stays in c->recon_sock until then, for a child
 * forked meanwhile to close.
 */
static int dial_end(struct chime *c)
{
	int sock = c->recon_sock;

	(void)epoll_ctl(c->ep_fd, EPOLL_CTL_DEL, sock, NULL);
	return sock;
}

/*
 * One attempt, in two steps that never wait: the hello, then, at this call
 * or a later one, the welcome (a drain must not block for it: a broker
 * taking over its shard files answers only once it has). 0: connected
 * again; -EINPROGRESS: no answer yet; -EPROTO, -EACCES, -EINVAL, -ESTALE
 * (the session is gone, or another process opened it meanwhile): never
 * will be; else: try again.
 */
void cl_recon_offer_drop(struct chime *c)
{
	for (unsigned i = 0; i < c->recon_nfds; i++)
		close(c->recon_fds[i]);
	c->recon_nfds = 0;
	cl_own_unmap(&c->recon_own);
	c->recon_offered = false;
}

/*
 * The welcome, at this call or a later one: mapped, sealed and answered
 * at once (cl_take_offer() never waits). -EINPROGRESS: no welcome yet.
 */
static int take_offer(struct chime *c)
{
	const struct chime_welcome *w = &c->recon_w;
	int r = cl_dial_finish(c->recon_sock, false, &c->recon_w, c->recon_fds, &c->recon_nfds);

	if (r < 0)
		return r;
	/* The rings move onto the old addresses: they must be the same size. */
	if (w->nr_shards != c->nr_shards || w->pub_size != c->pub_map.size || w->rw_size != c->rw_map.size ||
	    w->ro_size != c->ro_map.size)
		r = -EPROTO;
	if (r == 0)
		r = cl_take_offer(c->recon_sock, w, c->recon_fds, &c->recon_own);
	if (r < 0) {
		cl_recon_offer_drop(c);
		return r;
	}
	c->recon_offered = true;
	return 0;
}

static int attempt(struct chime *c, uint64_t now)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
	int *fds = c->recon_fds, sock, r = 0;
	struct chime_welcome w = c->recon_w;
	struct chime_client_geom g;
	struct chime_map maps[3];
	unsigned nfds;
	uint64_t base;

	if (c->recon_sock < 0 && (r = dial_start(c, now)) < 0)
		return r;
	if (!c->recon_offered)
		r = take_offer(c);
	if (r == 0)
		r = cl_await_ready(c->recon_sock, false, 0);
	if (r == -EINPROGRESS && now < c->recon_dial_until_ns)
		return r;
	base = c->recon_base;
	sock = dial_end(c);
	if (r == -EINPROGRESS)
		r = -ETIMEDOUT;
	if (r < 0) {
		cl_recon_offer_drop(c);
		cl_sock_close(&c->recon_sock);
		return r;
	}
	w = c->recon_w;
	nfds = c->recon_nfds;
	r = cl_map(&w, fds, &c->recon_own, maps, &g);
	if (r == 0 && (g.sq_size != c->sq_size || g.cq_size != c->cq_size)) {
		for (int i = 0; i < 3; i++)
			chime_seg_unmap(&maps[i]);
		r = -EPROTO;
	}
	if (r == 0) {
		resubmit(c, &maps[1], &g, base, (w.features & CHIME_WELCOME_F_CLAIMS) != 0);
		at_store(&c->realtime, (w.features & CHIME_WELCOME_F_REALTIME) != 0);
		r = move_onto(&maps[0], &c->pub_map);
		if (r == 0)
			r = move_onto(&maps[1], &c->rw_map);
		if (r == 0)
			r = move_onto(&maps[2], &c->ro_map);
		for (int i = 0; i < 3; i++)
			chime_seg_unmap(&maps[i]);
		if (r < 0)
			r = -EPROTO;    /* half moved: nothing sane to go back to */
	}
	for (uint32_t s = 0; r == 0 && s < c->nr_shards; s++)
		if (dup3(fds[CHIME_WELCOME_FIXED_FDS + s], c->chan[s].doorbell, O_CLOEXEC) < 0)
			r = -EPROTO;
	if (r == 0 && dup3(sock, c->sock, O_CLOEXEC) < 0)
		r = -EPROTO;
	(void)nfds;
	cl_recon_offer_drop(c);         /* the descriptors, and the touch map a session never has */
	cl_sock_close(&c->recon_sock);
	if (r < 0)
		return r;
	cl_sock_ready(c->sock);
	if (epoll_ctl(c->ep_fd, EPOLL_CTL_ADD, c->sock, &ev) < 0) {
		/*
		 * Attached, but the session is given up: hung up, so that the
		 * broker parks it for the next process, which got EBUSY until
		 * this chime_t was closed.
		 */
		cl_sock_hang_up(c->sock);
		return -EPROTO;
	}
	/* Atomic: a thread arming for the first time reads it without the lock (home_shard()). */
	at_store(&c->slot, w.slot);
	c->session_token = w.session_token;
	drainer_reset(c);
	return 0;
}

bool cl_reconnect(struct chime *c, bool locked)
{
	uint64_t now, one = 1;
	int r;

	if (!cl_reconnecting(c))
		return false;
	if (!locked && !cl_lock_try(c))
		return cl_reconnecting(c);
	if (!cl_reconnecting(c))
		goto out;
	now = chime_now();
	if (!c->recon_begun)
		begin(c, now);
	/* An attempt's welcome may have come: look at every call (it costs a recvmsg). */
	if (c->recon_sock < 0 && now < at_load(&c->recon_next_ns))
		goto out;
	r = attempt(c, now);
	now = chime_now();
	if (r == -EINPROGRESS)
		goto out;
	if (r == 0) {
		c->recon_begun = false;
		c->reconnects++;
		timer_set(c, 0);
		/* Come back: the fd's promise, and the shards may be asleep with our re-submitted records. */
		if (write(c->kick_fd, &one, sizeof(one)) == sizeof(one))
			c->kicks++;
		/* L1: a new connection number, not reconnecting: late evidence about the old one is ignored. */
		at_store_rel(&c->link, (at_load(&c->link) | 1) + 1);
		for (uint32_t s = 0; s < c->nr_shards; s++) {
			at_fence();
			cl_ring_doorbell(&c->chan[s]);
		}
	} else if (r == -EPROTO || r == -EACCES || r == -EINVAL || r == -ESTALE || now >= c->recon_give_up_ns) {
		at_store(&c->dead, 1);
		at_store_rel(&c->link, (at_load(&c->link) | 1) + 1);
		timer_set(c, 0);
		/*
		 * The fd says so, and stays readable (chime_fd(3)), as an
		 * anonymous connection's dead socket does: the old socket left
		 * its set at begin(), and the timer is off. Given up by an
		 * arming thread, no drainer would ever see it: an event loop
		 * asleep on chime_fd() slept for good (found by an API audit).
		 */
		if (write(c->kick_fd, &one, sizeof(one)) == sizeof(one))
			c->kicks++;
	} else {
		at_store(&c->recon_next_ns, now + c->recon_backoff_ns);
		c->recon_backoff_ns = c->recon_backoff_ns * 2 < BACKOFF_MAX_NS ? c->recon_backoff_ns * 2 : BACKOFF_MAX_NS;
		timer_set(c, at_load(&c->recon_next_ns));
	}
out:
	if (!locked) {
		cl_unlock(c);
		cl_resume_flush(c);
	}
	return cl_reconnecting(c);
}

void cl_resume_flush(struct chime *c)
{
	uint32_t any = 1;

	if (likely(!at_load(&c->resumed_owed)) || !at_cas(&c->resumed_owed, &any, 0u))
		return;
	for (uint32_t s = 0; s < c->nr_shards; s++) {
		uint32_t owed = 1;

		/* After the re-submitted records, in the same ring: its position is past them. */
		if (at_load(&c->chan[s].resumed_owed) && at_cas(&c->chan[s].resumed_owed, &owed, 0u))
			(void)cl_submit_op(c, s, CHIME_OP_RESUMED);     /* lost with the broker: the next attach frees them */
	}
}
