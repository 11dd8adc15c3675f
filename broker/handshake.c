/* SPDX-License-Identifier: MIT */
/*
 * handshake.c - who gets in: a connection's hello (within HELLO_TIMEOUT_S),
 * the access policy (policy.h) with SO_PEERCRED and SO_PEERGROUPS, the caps
 * per user (connections waiting to say hello, connected clients), the
 * refusals and their rate-limited log lines, SIGHUP's policy reload, and the
 * queries chimectl sends for a user's own clients and timers. An admitted
 * client goes on to client_admit() (control.c). See ARCHITECTURE.md, "Who
 * may do what" and "What a client can touch".
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"
#include "broker.h"
#include "clock.h"
#include "discard.h"
#include "log.h"
#include "wall.h"

void arm_hello(struct broker *b, struct conn *cn)
{
	static struct __kernel_timespec ts = { .tv_sec = HELLO_TIMEOUT_S };
	struct io_uring_sqe *sqe;

	/* Both in one submission: make room for two first. */
	if (io_uring_sq_space_left(&b->ring) < 2)
		io_uring_submit(&b->ring);
	sqe = io_uring_get_sqe(&b->ring);
	cn->iov = (struct iovec){ .iov_base = cn->buf, .iov_len = sizeof(cn->buf) };
	cn->msg = (struct msghdr){ .msg_iov = &cn->iov, .msg_iovlen = 1,
				   .msg_control = cn->ctl, .msg_controllen = sizeof(cn->ctl) };
	io_uring_prep_recvmsg(sqe, cn->fd, &cn->msg, MSG_CMSG_CLOEXEC);
	io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)cn | TAG_HELLO);
	sqe->flags |= IOSQE_IO_LINK;
	sqe = io_uring_get_sqe(&b->ring);
	io_uring_prep_link_timeout(sqe, &ts, 0);
	io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)cn | TAG_HTIMER);
	cn->inflight = 2;
}

/*
 * Is the peer admitted? Its supplementary groups as of connect time
 * (SO_PEERGROUPS). More than the buffer holds (a user may have up to
 * NGROUPS_MAX, 65536) is ERANGE with the size needed: read them all then,
 * or a member of an allowed group was refused for being in many others.
 */
static bool admitted(struct broker *b, int fd, const struct ucred *cred)
{
	gid_t groups[256], *all = groups;
	socklen_t len = sizeof(groups);
	size_t n = 0;
	int r;
	bool ok;

	if (policy_admits(&b->policy, geteuid(), cred->uid, cred->gid, NULL, 0))
		return true;
	if (!b->policy.nr_gids)
		return false;
	r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
	if (r < 0 && errno == ERANGE && len > sizeof(groups) && (all = malloc(len)))
		r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, all, &len);
	if (r == 0)
		n = len / sizeof(gid_t);
	ok = policy_admits(&b->policy, geteuid(), cred->uid, cred->gid, n ? all : NULL, n);
	if (all != groups)
		free(all);
	return ok;
}

/* Every open asks: up to clients_hi (no slot above it is taken), not --max-clients. */
/* The refusal of a user at --max-clients-per-uid, for the log. */
static const char *per_uid_full(const struct broker *b, uid_t uid)
{
	return policy_account_uid(&b->policy, uid) == uid ?
	       "its user has --max-clients-per-uid clients already" :
	       "its user, a subordinate uid, and the others its owner has (subuid file) have "
	       "--max-clients-per-uid clients already";
}

/* How a taken slot counts for its user: uid_full() and the users query (chimectl users) both go by it. */
static void slot_tally(const struct client *c, uint32_t *all, uint32_t *held, uint32_t *live)
{
	*all += 1;
	*held += c->state == CL_HELD;
	*live += c->state != CL_DETACHING && c->state != CL_HELD;
}

/*
 * Is uid's share of the table (--max-clients-per-uid) taken? A client being
 * reclaimed (DETACHING: closed, its process gone, its session dropped) no
 * longer counts: a worker replacing one that exited, or an open right after
 * a close, got -EUSERS for the millisecond the shards take to reclaim it.
 * As many again may be reclaiming, no more: a user who opens and exits
 * faster than the shards reclaim holds at most twice its share. A slot
 * HELD (its peer has not read what we sent, control.c) does not count as
 * live either, but a user that holds a quarter of its share so is refused
 * until they drain. Its attaches under way (unsealed_full(): up to
 * MAX_HANDSHAKES_PER_UID, more than a quarter of a share under 32) and
 * its live clients can still end HELD after that check, so a user holds
 * at most its share plus a quarter, less one: never twice its share.
 */
static bool uid_full(const struct broker *b, uid_t uid)
{
	uid_t as = policy_account_uid(&b->policy, uid);
	uint32_t max = b->o.max_clients_per_uid, live = 0, held = 0, all = 0;

	if (!max)
		return false;
	for (uint32_t i = 0; i < b->clients_hi; i++) {
		const struct client *c = &b->clients[i];

		if (c->state == CL_FREE || c->acct_uid != as)
			continue;
		slot_tally(c, &all, &held, &live);
	}
	/*
	 * HELD lasts as long as its peer keeps the socket and does not read
	 * (a hostile client), DETACHING milliseconds: held slots get a share
	 * of their own, a quarter, so that a user cannot keep twice its share
	 * of the table for as long as it likes.
	 */
	return live >= max || all >= 2 * max || held >= (max / 4 ? max / 4 : 1);
}

/*
 * Free uid's HELD slots whose peers have read or dropped what was unread,
 * as the heartbeat does, before they are counted: a refusal sent just
 * before the broker let its connection go is read a moment later, and the
 * user's next open within the beat's 90 ms met the slot still held (one
 * slot is the quarter of a share under 8: EUSERS; a test failed so one
 * run in eight).
 */
static void held_settle(struct broker *b, uid_t uid)
{
	uid_t as = policy_account_uid(&b->policy, uid);

	for (uint32_t i = 0; i < b->clients_hi; i++)
		if (b->clients[i].state == CL_HELD && b->clients[i].acct_uid == as)
			(void)held_free_if_drained(b, &b->clients[i]);
}

static bool privileged(const struct ucred *asker);

/* The client table's free slots, counted exactly up to `upto` (past it, a count above it). */
static uint32_t table_free(const struct broker *b, uint32_t upto)
{
	uint32_t n = b->o.max_clients - b->clients_hi;

	for (uint32_t i = 0; i < b->clients_hi && n <= upto; i++)
		n += b->clients[i].state == CL_FREE;
	return n;
}

/* One being reclaimed is not held: a worker replacing one that exited gets in (as uid_full()). */
static bool holds_slot(const struct client *c)
{
	return c->state != CL_FREE && c->state != CL_DETACHING;
}

/*
 * The last sixteenth of the client table is kept for users that hold no
 * slot of it (root and the broker's user aside): users who filled the
 * rest (a user and its subordinate uids are two shares, and detached
 * sessions hold their slots for --session-linger, across restarts) leave
 * every other user a way in. True if cred's user may not take one now.
 * O(1) while the slots above clients_hi alone outnumber the reserve, else
 * O(clients_hi), as uid_full().
 */
bool table_kept_from(const struct broker *b, const struct ucred *cred)
{
	uint32_t reserve = b->o.max_clients / TABLE_RESERVE_DIV;
	uid_t as;

	if (!reserve || privileged(cred) || table_free(b, reserve) > reserve)
		return false;
	as = policy_account_uid(&b->policy, cred->uid);
	for (uint32_t i = 0; i < b->clients_hi; i++)
		if (holds_slot(&b->clients[i]) && b->clients[i].acct_uid == as)
			return true;
	return false;
}

/*
 * The segments of a user's connections that ended before their client
 * sealed them wait for our seal before we unmap them, or stay mapped for
 * good if the client sealed them otherwise (discard_post()). A user may
 * hold those of a quarter of its share of connections (of --max-clients
 * without one), two segments each, but at least of MAX_HANDSHAKES_PER_UID
 * (honest opens at once may all be under way). Each attach under way
 * whose client has not answered yet counts as its two: checked at the
 * hello only, four answered at once kept 8 past a bound of 2 (a review).
 * So does each refused one the shards have not let go of yet (detaching
 * or parking: not posted to the discard thread until they have): not
 * counted, a wave of hellos sent while the last wave's shards were busy
 * went past the bound by that wave (a test's, under load). Counted
 * whatever the attach: a session's re-attach that fails leaves them too.
 * O(clients_hi), as uid_full().
 */
static bool unsealed_full(const struct broker *b, uid_t uid)
{
	uid_t as = policy_account_uid(&b->policy, uid);
	uint32_t share = b->o.max_clients_per_uid ? b->o.max_clients_per_uid : b->o.max_clients;
	uint32_t conns = share / 4 > MAX_HANDSHAKES_PER_UID ? share / 4 : MAX_HANDSHAKES_PER_UID;
	uint32_t segs = discard_unsealed(b->discard, as);

	for (uint32_t i = 0; i < b->clients_hi; i++) {
		const struct client *c = &b->clients[i];

		if (c->acct_uid != as)
			continue;
		if (c->offered)
			segs += 2;
		else if (c->state == CL_DETACHING || c->state == CL_PARKING)
			segs += (unsigned)punchable(c->rw_fd) + (unsigned)punchable(c->touch_fd);
	}
	return segs >= 2 * conns;
}

/* "refusing pid ..." at most once a second: a refused client that retries must not flood the log. */
void refuse_log(struct broker *b, const struct ucred *cred, const char *why)
{
	char comm[16];
	uint64_t now = now_ns();

	if (now - b->refused_logged_ns < 1000000000u) {
		b->refused_quiet++;
		return;
	}
	read_comm(cred->pid, comm);
	log_msg(LOG_NOTICE, "refusing pid %d '%s' (uid %u): %s%s", (int)cred->pid, comm,
		(unsigned)cred->uid, why, b->refused_quiet ? " (and more refusals not logged)" : "");
	b->refused_logged_ns = now;
	b->refused_quiet = 0;
}

/* The counts of the policy's rules, into [when] of a reload's answer. */
static void policy_counts(const struct policy *p, struct chime_query_reload *out, int when)
{
	out->uids[when] = (uint32_t)p->nr_uids;
	out->gids[when] = (uint32_t)p->nr_gids;
	out->session_rules[when] = (uint32_t)p->nr_sessions;
	out->subuid_ranges[when] = (uint32_t)p->nr_subuids;
	out->allow_all[when] = p->allow_all;
}

void policy_reload(struct broker *b, struct chime_query_reload *out)
{
	char err[512], desc[512];
	struct chime_query_reload dummy;
	int r;

	if (!out)
		out = &dummy;
	memset(out, 0, sizeof(*out));
	out->has_file = b->o.policy.file != NULL;
	policy_counts(&b->policy, out, 0);
	r = policy_load(&b->policy, &b->o.policy, err, sizeof(err));
	policy_counts(&b->policy, out, 1);
	if (r < 0) {
		log_msg(LOG_ERR, "reload: %s; keeping the current policy", err);
		out->error = r;
		out->sessions_unadmitted = b->sessions_unadmitted;
		memcpy(out->message, err, strnlen(err, sizeof(out->message) - 1));
		return;
	}
	policy_describe(&b->policy, desc, sizeof(desc));
	log_msg(LOG_NOTICE, "reloaded the policy: admitting %s", desc);
	memcpy(out->message, desc, strnlen(desc, sizeof(out->message) - 1));
	out->socket_error = socket_access(b);   /* the socket's mode follows (it logs a failure) */
	out->sessions_unadmitted = restart_say_unattachable(b, now_ns(), true);
	/* the segment says it as the answer does, not a heartbeat later (clients_beat()): an operator's audit */
	b->sessions_unadmitted = out->sessions_unadmitted;
	at_store(&b->ctl->sessions_unadmitted, out->sessions_unadmitted);
}

/* ---- queries: chimectl clients/timers for a user who may not read the segments ---- */

#define QUERY_INTERVAL_NS (50u * 1000000u)  /* one query per 50 ms: a timers query reads every node */
#define QUERY_TURN_HOLD_NS (150u * 1000000u) /* past the interval: chimectl asks again 60 ms after EBUSY */

/*
 * Bytes of records per answer message at most. A message's buffer is
 * charged to the socket at its allocation's size: 32 sessions (4 KiB of
 * data) took 8 KiB each, and the default send buffer (208 KiB) held 832
 * to 896 of an answer's 1024 sessions.
 */
#define QUERY_MSG_BYTES 3584u

/*
 * Send the answer without ever waiting: a reader that does not read gets
 * fewer records (and sees the connection end early), nobody else waits.
 * The send buffer is raised (to net.core.wmem_max at most) so that an
 * answer of CHIME_QUERY_MAX records fits it whole.
 */
static void query_send(int fd, struct chime_query_head *head, const void *recs, size_t n, size_t sz)
{
	size_t per = sz ? QUERY_MSG_BYTES / sz : 1;
	/* The kernel doubles what it is given: four times the data, for each message's overhead. */
	int want = (int)(2 * (sizeof(*head) + n * sz)), have = 0;
	socklen_t len = sizeof(have);

	if (per > CHIME_QUERY_BATCH)
		per = CHIME_QUERY_BATCH;
	head->magic = CHIME_HELLO_MAGIC;
	head->count = n;
	head->now_ns = now_ns();
	if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &have, &len) == 0 && have < 2 * want)
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
	if (client_send(fd, head, sizeof(*head)) < 0)
		return;
	for (size_t i = 0; i < n; i += per) {
		size_t k = n - i < per ? n - i : per;

		if (client_send(fd, (const char *)recs + i * sz, k * sz) < 0)
			return;
	}
}

/* Root and the broker's own user: they see every client and may reset the counters. */
static bool privileged(const struct ucred *asker)
{
	return asker->uid == 0 || asker->uid == geteuid();
}

/* Root and the broker's user see every client; anyone else its own uid's. */
static bool may_see(const struct ucred *asker, uid_t owner)
{
	return privileged(asker) || asker->uid == owner;
}

/*
 * What the control segment's table shows of a slot (table_set()'s states,
 * control.c): a parking session stays active there until its shards have
 * parked it, a slot attaching is not shown yet.
 */
static uint32_t slot_shown(const struct client *c)
{
	switch (c->state) {
	case CL_ACTIVE:
	case CL_PARKING:
		return CHIME_CLIENT_ACTIVE;
	case CL_DETACHING:
	case CL_HELD:
		return CHIME_CLIENT_DYING;
	case CL_DETACHED:
		return CHIME_CLIENT_DETACHED;
	default:
		return CHIME_CLIENT_EMPTY;
	}
}

/*
 * The asker's clients (all, to root and the broker's user): the connected
 * ones (CHIME_HELLO_QUERY_CLIENTS), or every slot the table shows, with
 * its state (CHIME_HELLO_QUERY_SLOTS: `out` holds struct chime_query_slot).
 */
static void query_clients(struct broker *b, int fd, const struct ucred *asker, uint64_t limit, bool slots,
			  void *out)
{
	const char *base = (const char *)b->ctl;
	const struct chime_client_stats *cs =
		(const struct chime_client_stats *)(base + b->ctl->client_stats_off);
	struct chime_query_head head = { .status = 0 };
	size_t n = 0, size = slots ? sizeof(struct chime_query_slot) : sizeof(struct chime_query_client);

	for (uint32_t slot = 0; slot < b->o.max_clients; slot++) {
		const struct client *c = &b->clients[slot];
		uint32_t shown = slot_shown(c);
		struct chime_query_client *r = (struct chime_query_client *)((char *)out + n * size);

		if ((slots ? shown == CHIME_CLIENT_EMPTY : c->state != CL_ACTIVE) || !may_see(asker, c->cred.uid))
			continue;
		head.total++;
		if (n == limit)
			continue;
		*r = (struct chime_query_client){
			.pid = c->cred.pid, .uid = c->cred.uid, .gid = c->cred.gid, .slot = slot,
			.connected_ns = c->connected_ns,
		};
		if (slots)
			((struct chime_query_slot *)r)->state = shown;
		memcpy(r->comm, c->comm, sizeof(r->comm));
		for (uint32_t k = 0; k < b->o.nr_shards; k++) {
			const struct chime_client_stats *e = &cs[(uint64_t)slot * b->o.nr_shards + k];

			if (at_load(&e->generation) != c->generation)
				continue;
			r->armed += at_load(&e->armed);
			r->arms += at_load(&e->arms);
			r->fires += at_load(&e->fires);
		}
		n++;
	}
	query_send(fd, &head, out, n, size);
}

static struct client *session_find(struct broker *b, const char *name);
static bool session_listed(const struct client *c);

/*
 * The armed timers of one client, by its pid, or of a named session
 * (attached or not), by its name: read from the shards' slabs while the
 * shards run, a racy snapshot (as chimectl's own reading of the files),
 * each field a single atomic load, nothing written. The count of them
 * (head.total) needs every node looked at, whatever the limit: that is
 * done in steps (query_step), the answer sent after the last.
 */
static void query_timers(struct broker *b, struct conn *cn, const struct ucred *asker, pid_t pid,
			 const char *session, uint64_t limit)
{
	struct timers_scan *q = &b->scan;
	int32_t status = -ESRCH;
	uint32_t slot = b->o.max_clients;

	if (session[0]) {
		const struct client *c = session_find(b, session);

		if (c && session_listed(c)) {
			slot = (uint32_t)(c - b->clients);
			status = may_see(asker, c->cred.uid) ? 0 : -EACCES;
		}
	}
	for (uint32_t i = 0; i < b->o.max_clients && !session[0]; i++) {
		const struct client *c = &b->clients[i];

		if (c->state == CL_ACTIVE && c->cred.pid == pid) {
			slot = i;
			status = may_see(asker, c->cred.uid) ? 0 : -EACCES;
			break;
		}
	}
	if (status == 0 && !(q->out = calloc(limit, sizeof(*q->out))))
		status = -ENOMEM;
	if (status < 0) {
		query_send(cn->fd, &(struct chime_query_head){ .status = status }, NULL, 0, 0);
		return;
	}
	q->fd = cn->fd;
	cn->fd = -1;            /* the scan answers, then closes it */
	q->uid = cn->uid;       /* the user it counts as (subordinate uids: their owner) */
	q->slot = slot;
	q->generation = b->clients[slot].generation;
	q->session = session[0];
	q->shard = q->next = 0;
	q->limit = limit;
	q->n = 0;
	q->head = (struct chime_query_head){ .status = 0 };
}

/* Nodes looked at per control loop iteration: ~0.3 ms. */
#define QUERY_SCAN_STEP 16384u

/* A user refused while the scan ran is owed the next: it has QUERY_TURN_HOLD_NS from now to ask again. */
static void scan_end(struct broker *b)
{
	struct timers_scan *q = &b->scan;

	close(q->fd);
	q->fd = -1;
	free(q->out);
	q->out = NULL;
	if (b->scan_owed.n)
		b->scan_owed.until_ns = now_ns() + QUERY_TURN_HOLD_NS;
}

/*
 * A flagged timer's deadline is the word its client last wrote (chan.c,
 * touch_moved()): the node's is where the shard will next look. The word
 * is read only for a flagged node, whose page the shard has mapped
 * already (touch_page_ok()); this thread unmaps the table, and only after
 * the client is no longer ACTIVE, so it is there (a session, which a scan
 * by name may find detached, has none). A word marked FIRED, or
 * no later than the node's, is not a later deadline.
 */
static void touched_deadline(const struct client *c, uint32_t shard, uint32_t idx, struct chime_query_timer *t)
{
	const uint64_t *words = c->mems ? c->mems[shard].touch_word : NULL;     /* a detached session: none */
	uint64_t w;

	if (!words)
		return;
	t->flags |= CHIME_QUERY_TIMER_TOUCHED;
	w = at_load(&words[idx]);
	if (!(w & CHIME_TOUCH_FIRED) && w > t->deadline_ns)
		t->deadline_ns = w;
}

/*
 * One node of the scan: true if it is one of client slot's live timers, and,
 * with copy, its fields in *t (id and shard left to the caller) and its
 * generation word in *genp. An optimistic read: the shard writes these
 * fields with plain stores while this thread reads them (aligned words,
 * each store single-copy atomic on every target), and a copy counts only if
 * the generation and owner read after it are those read before (QT1, QT2).
 * ThreadSanitizer sees each such pair as a race and is told not to look
 * here; every other access of the scan is checked.
 */
static bool __attribute__((no_sanitize("thread")))
node_peek(const struct chime_node *nd, uint32_t slot, bool copy, struct chime_query_timer *t, uint32_t *genp)
{
	uint32_t gen = at_load_acq(&nd->gen);     /* QT1: the generation before the fields (QT2 below) */
	uint8_t st = at_load(&nd->state);
	uint64_t period = at_load(&nd->period_ns);

	if (at_load(&nd->owner) != slot ||
	    !(st == CHIME_NODE_ARMED || st == CHIME_NODE_EXPIRED || (st == CHIME_NODE_BACKLOG && period)))
		return false;
	if (!copy)
		return true;
	*t = (struct chime_query_timer){
		.key = at_load(&nd->key), .user_data = at_load(&nd->user_data),
		.deadline_ns = at_load(&nd->deadline_ns), .period_ns = period,
		.state = st,
		.flags = gen & CHIME_NODE_REALTIME ? CHIME_QUERY_TIMER_REALTIME : 0,
	};
	/*
	 * The node freed and taken again while this thread read it
	 * (preempted between two loads): its key and user data may be
	 * another user's. A new timer bumps the generation before the
	 * shard writes its owner and fields, so the same generation
	 * (the flags above it may change in a live timer) and owner
	 * after the copy mean it is this client's.
	 */
	at_fence_acq();         /* QT2: the fields before the generation's second load */
	if (((at_load(&nd->gen) ^ gen) & CHIME_ID_GEN_MASK) || at_load(&nd->owner) != slot)
		return false;
	*genp = gen;
	return true;
}

bool query_step(struct broker *b)
{
	struct timers_scan *q = &b->scan;
	const struct client *c = &b->clients[q->slot];
	uint32_t budget = QUERY_SCAN_STEP;

	if (q->fd < 0)
		return false;
	if (c->generation != q->generation || !(q->session ? session_listed(c) : c->state == CL_ACTIVE)) {
		/* Gone meanwhile: its slot's nodes are another's soon. */
		query_send(q->fd, &(struct chime_query_head){ .status = -ESRCH }, NULL, 0, 0);
		scan_end(b);
		return false;
	}
	for (; q->shard < b->o.nr_shards && budget; q->shard++, q->next = 0) {
		struct shard *sh = &b->shards[q->shard];
		const struct wheel *wh = &sh->core.wh;
		uint32_t hw;

		/*
		 * SH2: `scanning` stored, a full barrier, then `shrinking`
		 * loaded; pairs with SH1 (slab_give_back()): a give-back's
		 * punch never runs while this step reads up to a mark loaded
		 * before it lowered the mark. One under way (SH4: acquire, its
		 * punch done before the mark is loaded; pairs with SH3): this
		 * step waits for the next iteration.
		 */
		at_store(&sh->scanning, 1);
		at_fence();
		if (at_load_acq(&sh->shrinking)) {
			at_store_rel(&sh->scanning, 0);
			return true;
		}
		hw = at_load(&wh->w->high_water);
		for (; q->next < hw && budget; q->next++, budget--) {
			bool copy = q->n < q->limit;
			uint32_t gen = 0;

			if (!node_peek(&wh->nodes[q->next], q->slot, copy, copy ? &q->out[q->n] : NULL, &gen))
				continue;
			q->head.total++;
			if (!copy)
				continue;
			q->out[q->n].id = chime_id_make(gen & CHIME_ID_GEN_MASK, q->shard, q->next);
			q->out[q->n].shard = q->shard;
			if (gen & CHIME_NODE_TOUCH)
				touched_deadline(c, q->shard, q->next, &q->out[q->n]);
			q->n++;
		}
		at_store_rel(&sh->scanning, 0);         /* SH5: the step's reads before it; the shard's SH1 load */
		if (q->next < hw)
			return true;    /* budget spent inside this shard */
	}
	if (q->shard < b->o.nr_shards)
		return true;
	query_send(q->fd, &q->head, q->out, q->n, sizeof(*q->out));
	scan_end(b);
	return false;
}

void query_abort(struct broker *b)
{
	if (b->scan.fd >= 0)
		scan_end(b);
}

/* ---- named sessions ---- */

/*
 * The session name of a hello, checked: NUL-terminated within the field,
 * NUL-padded after it, [A-Za-z0-9._-] before it. Empty is anonymous. false:
 * malformed (the caller answers -EINVAL).
 */
static bool session_name_ok(const char name[CHIME_SESSION_MAX])
{
	int n = chime_session_len(name);

	if (n < 0)
		return false;
	for (int i = n; i < (int)CHIME_SESSION_MAX; i++)
		if (name[i])
			return false;
	return true;
}

/*
 * The slot holding session `name` (any uid), or NULL. One being reclaimed
 * (DETACHING: linger ran out, dropped) is gone already: the name is free.
 * Up to clients_hi, as uid_full().
 */
static struct client *session_find(struct broker *b, const char *name)
{
	for (uint32_t i = 0; i < b->clients_hi; i++) {
		struct client *c = &b->clients[i];

		if (c->state != CL_FREE && c->state != CL_DETACHING && c->state != CL_HELD && !c->drop_parked &&
		    c->session[0] && strcmp(c->session, name) == 0)
			return c;
	}
	return NULL;
}

static bool session_listed(const struct client *c)
{
	return c->session[0] && !c->drop_parked && (c->state == CL_ATTACHING || c->state == CL_ACTIVE ||
						     c->state == CL_PARKING || c->state == CL_DETACHED);
}

/*
 * From slot `from` on (the hello's pid: the page after one that ended at
 * slot from - 1; 0 from a chimectl before pages), total counting them all:
 * more than CHIME_QUERY_MAX sessions are listed a page at a time.
 */
static void query_sessions(struct broker *b, int fd, const struct ucred *asker, uint32_t from, uint64_t limit,
			   struct chime_query_session *out)
{
	const char *base = (const char *)b->ctl;
	const struct chime_client_stats *cs =
		(const struct chime_client_stats *)(base + b->ctl->client_stats_off);
	struct chime_query_head head = { .status = 0 };
	uint64_t now = now_ns();
	size_t n = 0;

	for (uint32_t slot = 0; slot < b->o.max_clients; slot++) {
		const struct client *c = &b->clients[slot];
		struct chime_query_session *r = &out[n];

		if (!session_listed(c) || !may_see(asker, c->cred.uid))
			continue;
		head.total++;
		if (slot < from || n == limit)
			continue;
		*r = (struct chime_query_session){
			.uid = c->cred.uid, .pid = c->cred.pid, .slot = slot,
			.state = c->state == CL_DETACHED || c->state == CL_PARKING ?
				 CHIME_SESSION_DETACHED : CHIME_SESSION_ATTACHED,
		};
		memcpy(r->name, c->session, sizeof(r->name));
		if (c->state == CL_DETACHED)
			r->linger_left_ns = c->linger_until_ns > now ? c->linger_until_ns - now : 0;
		else if (c->state == CL_PARKING)        /* its linger starts once the shards have parked it */
			r->linger_left_ns = (uint64_t)b->o.session_linger_s * 1000000000u;
		for (uint32_t k = 0; k < b->o.nr_shards; k++) {
			const struct chime_client_stats *e = &cs[(uint64_t)slot * b->o.nr_shards + k];

			if (at_load(&e->generation) != c->generation)
				continue;
			r->timers += at_load(&e->armed);
			r->held += at_load(&e->backlog);
		}
		n++;
	}
	query_send(fd, &head, out, n, sizeof(*out));
}

static bool peer_gone(const struct client *c);
static bool process_gone(const struct client *c);

/*
 * chimectl drop-session: root and the broker's user any, others their own
 * uid's; a detached session, or one whose process is gone, parked or not
 * yet (`stop the worker, drop its session` in a script: its hang-up may
 * not have come, or its park not ended): that one is detached once parked.
 * Not one a live process has, or one a process waits to take over, or
 * while the broker stops (it hands every session to the next).
 */
static void drop_session(struct broker *b, int fd, const struct ucred *asker, const char *name)
{
	struct chime_query_head head = { .status = -ESRCH };
	struct client *c = name[0] ? session_find(b, name) : NULL;
	char comm[16];

	if (c && !may_see(asker, c->cred.uid))
		head.status = -EACCES;
	else if (c && c->state == CL_ACTIVE && !b->stopping && (peer_gone(c) || process_gone(c)))
		client_park(b, c);
	if (c && head.status != -EACCES)
		head.status = (c->state == CL_DETACHED && c->next_fd < 0) ||
			      (c->state == CL_PARKING && c->next_fd < 0 && !b->stopping) ? 0 : -EBUSY;
	if (head.status == 0) {
		/* On the connect lines' budget: a user dropping sessions in a loop must not flood the log. */
		if (log_budget_take(&b->conn_log, CONN_LOG_PER_S, CONN_LOG_WHAT)) {
			read_comm(asker->pid, comm);
			log_msg(LOG_NOTICE, "session '%s' (uid %u) dropped by pid %d '%s' (uid %u)", c->session,
				(unsigned)c->cred.uid, (int)asker->pid, comm, (unsigned)asker->uid);
		}
		if (c->state == CL_DETACHED) {
			client_detach(b, c, 0);
		} else {
			/* Gone already: the name is free, and no broker restores it. */
			c->drop_parked = true;
			restart_clear(b, c);
		}
	}
	query_send(fd, &head, NULL, 0, 0);
}

/* Is the attached process of c gone already (its hang-up not yet seen by the ring)? */
static bool peer_gone(const struct client *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLRDHUP };

	return c->fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/*
 * Has the attached process exited, its exit not yet seen by the ring? The
 * exit poll (control.c, arm_hup()) ends a client at the exit; this is for
 * the hello that comes in the same batch of completions, ahead of it (a
 * worker restarted at once, a drop right after the exit). A zombie's pidfd
 * is readable. No pidfd (none could be had): as alive, the -EBUSY of before.
 */
static bool process_gone(const struct client *c)
{
	return c->pidfd >= 0 && pidfd_exited(c->pidfd);
}

/*
 * A resume from the holder's pid: is it the holder, not a process that
 * reused the pid since (a library before tokens says only its pid)? As
 * the holder when either start time is unknown (holder_gone() in control.c).
 */
static bool holder_start_matches(const struct client *c, const struct ucred *cred)
{
	uint64_t start = c->holder_start && c->holder_pid == cred->pid ? chime_proc_start(cred->pid) : 0;

	return !start || start == c->holder_start;
}

/*
 * flags 0 with a session name: open it (a new slot, as an anonymous client
 * gets) or re-attach it. A session whose process has just gone (hung up,
 * or being parked) is handed to this one as soon as its shards are done.
 */
static void session_open(struct broker *b, struct conn *cn, const struct ucred *cred,
			 const struct chime_hello *h)
{
	const char *name = h->session;
	bool resume = (h->flags & CHIME_HELLO_RESUME) != 0;
	struct client *c = session_find(b, name);
	bool reserved;
	char why[160];
	uid_t owner;

	/* A reserved name is its user's before any session of that name exists. */
	reserved = policy_session_owner(&b->policy, name, &owner);
	if (reserved && owner != cred->uid) {
		snprintf(why, sizeof(why), "session '%s' is reserved for uid %u (policy file)", name,
			 (unsigned)owner);
		refuse_log(b, cred, why);
		send_status(cn->fd, -EACCES);
		return;
	}
	if (!c && resume) {
		/* Dropped, reclaimed or discarded (--fresh) meanwhile: its timers and ids are gone. */
		snprintf(why, sizeof(why), "session '%s' is not this broker's: it cannot be resumed", name);
		refuse_log(b, cred, why);
		send_status(cn->fd, -ESTALE);
		return;
	}
	if (!c) {
		if (uid_full(b, cred->uid)) {
			refuse_log(b, cred, per_uid_full(b, cred->uid));
			send_status(cn->fd, -EUSERS);
			return;
		}
		client_admit(b, cn, cred, name, false);
		return;
	}
	if (c->cred.uid != cred->uid) {
		/* taken before the reservation was: the operator drops it, its timers are not ours to hand over */
		snprintf(why, sizeof(why), reserved ? "session '%s' is reserved for it but held by uid %u "
			 "(chimectl drop-session frees the name)" : "session '%s' belongs to uid %u",
			 name, (unsigned)c->cred.uid);
		refuse_log(b, cred, why);
		send_status(cn->fd, -EACCES);
		return;
	}
	if (b->stopping) {
		send_status(cn->fd, -ECONNREFUSED);
		return;
	}
	if (resume && ((h->limit && c->token && h->limit != c->token) || c->holder_lost ||
		       (c->holder_pid && c->holder_pid != cred->pid) || !holder_start_matches(c, cred))) {
		/*
		 * Another attach since this library's (another process, or
		 * another chime_t of this one) freed the grants it would
		 * re-submit arms with: they would be dropped, after their calls
		 * returned 0. It learns instead. The token says which attach; the
		 * pid, for a library before tokens.
		 */
		if (c->holder_lost)
			snprintf(why, sizeof(why), "session '%s': its process (pid %d) exited before it resumed, what "
				 "it held is freed", name, (int)c->holder_pid);
		else if (c->holder_pid == cred->pid && !holder_start_matches(c, cred))
			snprintf(why, sizeof(why), "session '%s': its process (pid %d) is gone and this one reused its "
				 "pid: it cannot be resumed", name, (int)c->holder_pid);
		else
			snprintf(why, sizeof(why), "session '%s' was opened again (pid %d) since this connection "
				 "held it: it cannot be resumed", name, (int)c->holder_pid);
		refuse_log(b, cred, why);
		send_status(cn->fd, -ESTALE);
		return;
	}
	if (c->state == CL_ACTIVE && (peer_gone(c) || process_gone(c)))
		client_park(b, c);
	if (c->state == CL_DETACHED && c->next_fd >= 0) {
		/* A process waits for it already (below): it goes first, now if the socket has drained. */
		if (held_drained(b, c)) {
			int fd = c->next_fd;

			c->next_fd = -1;
			client_reattach(b, c, fd, &c->next_cred, c->next_resume, c->next_sq_base);
		}
		send_status(cn->fd, -EBUSY);
		return;
	}
	if (c->state == CL_DETACHED && !held_drained(b, c)) {
		/*
		 * Its last connection has not been read to the end (a welcome's
		 * descriptors?), and one unread at a time is all a slot holds:
		 * wait for it, up to HELD_WAIT_NS (clients_beat()). A process
		 * that died with a wake-up unread drops it within milliseconds.
		 */
		c->next_fd = cn->fd;
		c->next_cred = *cred;
		c->next_resume = resume;
		c->next_sq_base = h->sq_base;
		c->next_until_ns = now_ns() + HELD_WAIT_NS;
		cn->fd = -1;
		return;
	}
	if (c->state == CL_DETACHED) {
		client_reattach(b, c, cn->fd, cred, resume, h->sq_base);
		cn->fd = -1;    /* the session owns the socket now (or closed it) */
		return;
	}
	if (c->state == CL_PARKING && c->next_fd < 0) {
		c->next_fd = cn->fd;
		c->next_cred = *cred;
		c->next_resume = resume;
		c->next_sq_base = h->sq_base;
		cn->fd = -1;
		return;
	}
	send_status(cn->fd, -EBUSY);
}

/* ---- turns owed (struct owed in broker.h) ---- */

static bool owed_has(const struct owed *o, uid_t who)
{
	for (uint32_t i = 0; i < o->n; i++)
		if (o->uid[i] == who)
			return true;
	return false;
}

/* who waits, after those who were refused before it; until: the turn's end if it is the first. */
static void owed_push(struct owed *o, uid_t who, uint64_t until)
{
	if (o->n == OWED_MAX || owed_has(o, who))
		return;
	if (!o->n)
		o->until_ns = until;
	o->uid[o->n++] = who;
}

/* The head's turn is over (taken, or let pass); the next one's ends at until. */
static void owed_pop(struct owed *o, uint64_t until)
{
	memmove(&o->uid[0], &o->uid[1], (o->n - 1) * sizeof(o->uid[0]));
	o->n--;
	o->until_ns = until;
}

/* Turns not taken in time pass on, each next one QUERY_TURN_HOLD_NS from the end of the one before. */
static void owed_expire(struct owed *o, uint64_t now)
{
	while (o->n && now >= o->until_ns)
		owed_pop(o, o->until_ns + QUERY_TURN_HOLD_NS);
}

/* Is the turn someone else's than who's? */
static bool owed_to_another(const struct owed *o, uid_t who)
{
	return o->n && o->uid[0] != who;
}

/*
 * One query per QUERY_INTERVAL_NS for root and the broker's user, one for
 * everyone else. A user asking in a tight loop would take every turn of the
 * others: each unprivileged user refused, other than the one answered last,
 * is owed a turn, in the order they were refused, and the next turn is the
 * first one's, which nobody else may take until it comes back for it (or
 * QUERY_TURN_HOLD_NS after the turn begins: it gave up, and the turn is the
 * next one's). `who` is the user the asker counts as (policy_account_uid():
 * a user's subordinate uids are one user, or two of them would take the
 * owed turns in alternation). A user and its subordinate uids still count
 * as two, and with one owed turn for the first refused only, those two
 * took it in alternation too: a third user was never the first.
 */
static bool query_turn(struct broker *b, const struct ucred *asker, uid_t who, uint64_t now)
{
	bool priv = privileged(asker);
	uint64_t *last = &b->last_query_ns[priv];
	struct owed *o = &b->query_owed;

	owed_expire(o, now);
	if (now - *last < QUERY_INTERVAL_NS || (!priv && owed_to_another(o, who))) {
		if (!priv && who != b->query_last_uid)
			owed_push(o, who, (*last + QUERY_INTERVAL_NS > now ? *last + QUERY_INTERVAL_NS : now) +
					  QUERY_TURN_HOLD_NS);
		return false;
	}
	*last = now;
	if (!priv) {
		b->query_last_uid = who;
		if (o->n && o->uid[0] == who)   /* its owed turn, taken: the next one's begins after the interval */
			owed_pop(o, now + QUERY_INTERVAL_NS + QUERY_TURN_HOLD_NS);
	}
	return true;
}

/*
 * The timers scan is one at a time, for everyone (root included), and a
 * scan of millions of nodes takes longer than the interval: a user asking
 * again as soon as its scan ended would start the next, and others would
 * find the scan busy whenever they asked. So each user refused while a
 * scan runs, other than the scan's own, is owed a scan, in the order they
 * were refused: nobody else may start one until the first of them comes
 * back (or QUERY_TURN_HOLD_NS after the scan ends: it gave up, and the
 * next scan is the next one's). A user cannot have two scans in a row
 * while another waits. Checked before query_turn(), so a refusal here
 * spends nobody's turn there.
 */
static bool scan_turn(struct broker *b, uid_t who, uint64_t now)
{
	struct owed *o = &b->scan_owed;

	if (b->scan.fd >= 0) {
		if (who != b->scan.uid)
			owed_push(o, who, UINT64_MAX);  /* its turn begins when the scan ends: scan_end() */
		return false;
	}
	owed_expire(o, now);
	return !owed_to_another(o, who);
}

/* ---- users: each user's use of the per-user limits ---- */

static int key_cmp(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? -1 : a > b;
}

/*
 * One record per accounting uid with a slot taken, by uid: the slots
 * sorted by (acct_uid, slot), then each user's counted as uid_full()
 * counts them and its armed timers and the ids its shards count against
 * the quota (armed and handed ahead) summed per shard, as the shards
 * publish them (their quota is per shard: the fullest one is said). A
 * user not privileged sees the uid it counts as (`as`) only.
 */
static void query_users(struct broker *b, int fd, const struct ucred *asker, uid_t as, uint64_t limit,
			struct chime_query_user *out)
{
	const char *base = (const char *)b->ctl;
	const struct chime_client_stats *cs =
		(const struct chime_client_stats *)(base + b->ctl->client_stats_off);
	struct chime_query_head head = { .status = 0 };
	uint32_t nk = 0, shards = b->o.nr_shards, free_slots;
	bool at_kept;
	uint64_t *keys = malloc(((size_t)b->clients_hi + 1) * sizeof(*keys));
	uint64_t *per = calloc(2 * (size_t)shards, sizeof(*per));       /* armed, then owned, per shard */
	size_t n = 0;

	if (!keys || !per) {
		free(keys);
		free(per);
		query_send(fd, &(struct chime_query_head){ .status = -ENOMEM }, NULL, 0, 0);
		return;
	}
	for (uint32_t slot = 0; slot < b->clients_hi; slot++) {
		const struct client *c = &b->clients[slot];

		if (c->state != CL_FREE && (privileged(asker) || c->acct_uid == as))
			keys[nk++] = (uint64_t)c->acct_uid << 32 | slot;
	}
	qsort(keys, nk, sizeof(*keys), key_cmp);
	free_slots = table_free(b, UINT32_MAX);
	at_kept = b->o.max_clients / TABLE_RESERVE_DIV && free_slots <= b->o.max_clients / TABLE_RESERVE_DIV;
	for (uint32_t i = 0; i < nk;) {
		uint32_t uid = (uint32_t)(keys[i] >> 32), all = 0;
		struct chime_query_user u = {
			.uid = uid, .max_clients = b->o.max_clients_per_uid, .nr_shards = shards,
			.table_free = free_slots, .table_kept = b->o.max_clients / TABLE_RESERVE_DIV,
		};
		bool holds = false;
		uint64_t latest = 0, order = 0;

		memset(per, 0, 2 * (size_t)shards * sizeof(*per));
		for (; i < nk && (uint32_t)(keys[i] >> 32) == uid; i++) {
			uint32_t slot = (uint32_t)keys[i];
			const struct client *c = &b->clients[slot];

			/*
			 * What the shards refuse past: the quota its latest
			 * (re)attach brought (chan_user.quota), not the policy's
			 * now, which its connections from before a reload do not
			 * hold to until its next one (a review: a quarter said
			 * where half was enforced). Latest as posted to the
			 * shards, not as connected: a re-attach that failed
			 * before they took it brought nothing. With none posted
			 * yet, what the newest will bring.
			 */
			if (c->quota_order > order) {
				order = c->quota_order;
				u.max_timers = c->quota_held;
			} else if (!order && c->connected_ns >= latest) {
				latest = c->connected_ns;
				u.max_timers = c->timer_quota;
			}
			slot_tally(c, &all, &u.held, &u.clients);
			holds = holds || holds_slot(c);
			u.reclaiming += c->state == CL_DETACHING;
			u.sessions += session_listed(c);
			u.detached += session_listed(c) && (c->state == CL_DETACHED || c->state == CL_PARKING);
			for (uint32_t k = 0; k < shards; k++) {
				const struct chime_client_stats *e = &cs[(uint64_t)slot * shards + k];

				if (at_load(&e->generation) == c->generation) {
					per[k] += at_load(&e->armed);
					per[shards + k] += at_load(&e->owned);
				}
			}
		}
		u.max_timers_shard = shard_share(u.max_timers, shards);
		/* as table_kept_from() decides for this user's own open: root and the broker's user are never kept out */
		if (at_kept && holds && uid != 0 && uid != geteuid())
			u.flags |= CHIME_QUERY_USER_KEPT_OUT;
		for (uint32_t k = 0; k < shards; k++) {
			uint64_t own = per[shards + k];

			u.armed += per[k];
			u.armed_fullest = per[k] > u.armed_fullest ? per[k] : u.armed_fullest;
			u.owned += own;
			u.owned_fullest = own > u.owned_fullest ? own : u.owned_fullest;
		}
		head.total++;
		if (n < limit)
			out[n++] = u;
	}
	free(keys);
	free(per);
	query_send(fd, &head, out, n, sizeof(*out));
}

static void answer_query(struct broker *b, struct conn *cn, const struct chime_hello *h,
			 const struct ucred *asker)
{
	uint64_t limit = h->limit && h->limit < CHIME_QUERY_MAX ? h->limit : CHIME_QUERY_MAX;
	bool timers = h->flags == CHIME_HELLO_QUERY_TIMERS;
	uint64_t now = now_ns();
	void *buf;

	/* cn->uid: the user the asker counts as (subordinate uids: their owner) */
	if ((timers && !scan_turn(b, cn->uid, now)) || !query_turn(b, asker, cn->uid, now)) {
		query_send(cn->fd, &(struct chime_query_head){ .status = -EBUSY }, NULL, 0, 0);
		return;
	}
	if (timers) {
		if (b->scan_owed.n && b->scan_owed.uid[0] == cn->uid)
			owed_pop(&b->scan_owed, UINT64_MAX);    /* taken: the next one's begins when this scan ends */
		query_timers(b, cn, asker, h->pid, h->session, limit);
		if (b->scan.fd < 0 && b->scan_owed.n)   /* none started (answered at once): it begins now */
			b->scan_owed.until_ns = now + QUERY_TURN_HOLD_NS;
		return;
	}
	_Static_assert(sizeof(struct chime_query_slot) <= sizeof(struct chime_query_session) &&
		       sizeof(struct chime_query_user) <= sizeof(struct chime_query_session), "the largest record");
	buf = calloc(limit, sizeof(struct chime_query_session));     /* the largest record */
	if (!buf) {
		query_send(cn->fd, &(struct chime_query_head){ .status = -ENOMEM }, NULL, 0, 0);
		return;
	}
	if (h->flags == CHIME_HELLO_QUERY_CLIENTS || h->flags == CHIME_HELLO_QUERY_SLOTS)
		query_clients(b, cn->fd, asker, limit, h->flags == CHIME_HELLO_QUERY_SLOTS, buf);
	else if (h->flags == CHIME_HELLO_QUERY_SESSIONS)
		query_sessions(b, cn->fd, asker, h->pid > 0 ? (uint32_t)h->pid : 0, limit, buf);
	else if (h->flags == CHIME_HELLO_QUERY_USERS)
		query_users(b, cn->fd, asker, cn->uid, limit, buf);
	else
		query_send(cn->fd, &(struct chime_query_head){ .status = -EINVAL }, NULL, 0, 0);
	free(buf);
}

/* ---- reset-stats: root and the broker's user ---- */

/*
 * The shards own their counters, so the control thread writes none of them:
 * it bumps stats_reset_gen (and says when), and rings every shard's private
 * command doorbell so that a sleeping shard wakes up, sees the generation
 * move before it publishes (RS2) and resets its own figures. An awake shard
 * does it within PUBLISH_NS. Counters never go back (see stats.h, "reset").
 */
static void reset_stats(struct broker *b, int fd, const struct ucred *asker)
{
	struct chime_query_head head = { .status = -EPERM };
	struct chime_ctl *c = b->ctl;
	char comm[16];

	if (!privileged(asker)) {
		refuse_log(b, asker, "reset-stats is for root and the broker's user only");
		query_send(fd, &head, NULL, 0, 0);
		return;
	}
	read_comm(asker->pid, comm);
	at_store(&c->stats_reset_ns, now_ns());
	at_store(&c->stats_reset_realtime_ns, wall_now_ns());
	/* RS1: the reset's time before its generation (release); pairs with RS2 in shard.c publish(). */
	at_store_rel(&c->stats_reset_gen, c->stats_reset_gen + 1);
	for (uint32_t k = 0; k < b->o.nr_shards; k++)
		(void)eventfd_write(b->shards[k].doorbell, 1);
	log_msg(LOG_NOTICE, "statistics reset (generation %llu) by pid %d '%s' (uid %u)",
		(unsigned long long)c->stats_reset_gen, (int)asker->pid, comm, (unsigned)asker->uid);
	head.status = 0;
	head.total = c->stats_reset_gen;
	query_send(fd, &head, NULL, 0, 0);
}

/* ---- reload: root and the broker's user ---- */

/*
 * chimectl reload: the reload SIGHUP does, done now and answered with its
 * outcome. Root and the broker's user only, as a signal to it would be.
 */
static void reload_asked(struct broker *b, int fd, const struct ucred *asker)
{
	struct chime_query_head head = { .status = -EPERM };
	struct chime_query_reload res;
	char comm[16];

	if (!privileged(asker)) {
		refuse_log(b, asker, "reload is for root and the broker's user only");
		query_send(fd, &head, NULL, 0, 0);
		return;
	}
	read_comm(asker->pid, comm);
	log_msg(LOG_NOTICE, "reload asked by pid %d '%s' (uid %u)", (int)asker->pid, comm, (unsigned)asker->uid);
	broker_reload(b, &res);
	head.status = 0;
	head.total = 1;
	query_send(fd, &head, &res, 1, sizeof(res));
}

/*
 * CHIME_HELLO_PING: what an attach of this peer would be answered now,
 * short of the attach: the checks hello_answer() and client_admit() make.
 */
static void ping_answer(struct broker *b, int fd, const struct ucred *cred)
{
	struct chime_query_head head = { .status = 0 };
	bool table_full = true;

	held_settle(b, cred->uid);
	for (uint32_t i = 0; i < b->o.max_clients && table_full; i++)
		table_full = b->clients[i].state != CL_FREE;
	if (b->stopping)
		head.status = -ECONNREFUSED;
	else if (unsealed_full(b, cred->uid) || uid_full(b, cred->uid) || table_full || table_kept_from(b, cred))
		head.status = -EUSERS;
	log_msg(LOG_DEBUG, "pinged by pid %d (uid %u): %s", (int)cred->pid, (unsigned)cred->uid,
		head.status ? strerror(-head.status) : "it would be admitted");
	query_send(fd, &head, NULL, 0, 0);
}

/* ---- answers that walk a client's epoll watches ---- */

/*
 * The kernel wakes every waiter of the client's end of a connection inside
 * each send to it, one callback per epoll watch the client put there (up
 * to fs.epoll.max_user_watches; a million: 110-216 ms, interrupts off),
 * and the control thread is every user's. A user whose answers cost
 * SEND_SLOW_NS of CPU time (a preemption does not count) has its next
 * hellos wait SEND_QUIET_FACTOR times as long, so the control thread walks
 * for it at most about one part in SEND_QUIET_FACTOR + 1 of its time.
 * Each new socket needs its watches made anew (a million epoll_ctl() calls),
 * and a connection gets at most its welcome and its ready: holding back
 * hellos is enough. Reads walk them too (a read frees the sender's message,
 * and the kernel wakes its writers, sock_wfree()): a held user's new
 * connections are not read either, and when the hold ends one of them is,
 * the others waiting for its answer. See ARCHITECTURE.md, "What a client
 * can touch".
 */
#define SEND_SLOW_NS      (500u * 1000u)
#define SEND_QUIET_FACTOR 16u

/* The control thread's sends since the last sends_judge(): CPU time, and time by the clock. */
static uint64_t sends_cpu_ns, sends_ns;

/* Count a send that began at CPU time c0, clock t0; errno as the send left it. */
static ssize_t sends_count(ssize_t n, uint64_t c0, uint64_t t0)
{
	int e = errno;

	sends_ns += now_ns() - t0;
	sends_cpu_ns += thread_cpu_ns() - c0;
	errno = e;
	return n;
}

ssize_t client_sendmsg(int fd, const struct msghdr *mh)
{
	uint64_t c0 = thread_cpu_ns(), t0 = now_ns();

	return sends_count(sendmsg(fd, mh, MSG_NOSIGNAL | MSG_DONTWAIT), c0, t0);
}

ssize_t client_send(int fd, const void *buf, size_t len)
{
	uint64_t c0 = thread_cpu_ns(), t0 = now_ns();

	return sends_count(send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT), c0, t0);
}

/* When uid's hold ends, if it is held at now; 0 if not. */
static uint64_t held_until(const struct broker *b, uid_t uid, uint64_t now)
{
	for (unsigned i = 0; i < SEND_HOLDS; i++)
		if (b->send_holds[i].uid == uid && b->send_holds[i].until > now)
			return b->send_holds[i].until;
	return 0;
}

/* uid's hold: its entry, or a free one, or (SEND_HOLDS users held) the one that ends first, cut short. */
static struct send_hold *hold_of(struct broker *b, uid_t uid, uint64_t now)
{
	struct send_hold *h = NULL;

	for (unsigned i = 0; i < SEND_HOLDS; i++) {
		struct send_hold *e = &b->send_holds[i];

		if (e->uid == uid && e->until > now)
			return e;
		if (!h || (h->until > now && e->until < h->until))
			h = e;
	}
	h->uid = uid;
	h->until = 0;
	return h;
}

void sends_judge(struct broker *b, uid_t uid)
{
	uint64_t took = sends_cpu_ns, wall = sends_ns, now, until;
	struct send_hold *h;

	sends_cpu_ns = sends_ns = 0;
	if (uid == (uid_t)-1)
		return;
	now = now_ns();
	if (took < SEND_SLOW_NS) {
		/* answered, and not slow: a user's connection read after its hold lets the others be read */
		for (unsigned i = 0; i < SEND_HOLDS; i++)
			if (b->send_holds[i].uid == uid && b->send_holds[i].reading)
				b->send_holds[i].until = 0;
		return;
	}
	/*
	 * Slow by CPU time; held for as long as it took by the clock, if
	 * longer: on a VM the walk's CPU time leaves out what the host took.
	 */
	took = wall > took ? wall : took;
	until = now + SEND_QUIET_FACTOR * took;
	h = hold_of(b, uid, now);
	h->until = until;
	h->reading = false;
	if (log_ratelimit(&b->send_hold_log, 10))
		log_msg(LOG_WARNING, "answering a connection of uid %u took %.1f ms (the kernel woke as many "
			"epoll watches on its socket): that user's next connections wait %.0f ms",
			(unsigned)uid, took / 1e6, (until - now) / 1e6);
}

static void hello_answer_judged(struct broker *b, struct conn *cn, int res)
{
	sends_judge(b, (uid_t)-1);      /* what came before is not this hello's */
	hello_answer(b, cn, res, NULL);
	sends_judge(b, cn->uid);
	conn_put(b, cn);
}

#define HELD_UNREAD INT_MIN       /* conn.held_res of a connection not read yet */

static void held_append(struct broker *b, struct conn *cn, int res)
{
	struct conn **tail = &b->held;

	while (*tail)
		tail = &(*tail)->held_next;
	cn->held_res = res;
	cn->held_next = NULL;
	*tail = cn;
}

void hello_arm(struct broker *b, struct conn *cn)
{
	if (held_until(b, cn->uid, now_ns())) {
		cn->inflight = 1;       /* the hold's: arm_hello() gives it to the read and its timeout */
		held_append(b, cn, HELD_UNREAD);
		return;
	}
	arm_hello(b, cn);
}

void hello_dispatch(struct broker *b, struct conn *cn, int res)
{
	if (res >= 0)
		close_sent_fds(b, &cn->msg);
	if (res >= 0 && !cn->released && held_until(b, cn->uid, now_ns())) {
		held_append(b, cn, res);        /* its reference (inflight) is the answer's now */
		return;
	}
	hello_answer_judged(b, cn, res);
}

uint64_t hellos_held_run(struct broker *b)
{
	uint64_t next = UINT64_MAX, now = now_ns(), until;
	struct conn **pp = &b->held, *cn;

	while ((cn = *pp)) {
		until = held_until(b, cn->uid, now);
		if (until) {
			next = until < next ? until : next;
			pp = &cn->held_next;
			continue;
		}
		*pp = cn->held_next;
		if (cn->held_res == HELD_UNREAD) {
			/* Read it; the user's others wait for its answer (sends_judge()), or its hello's timeout. */
			struct send_hold *h = hold_of(b, cn->uid, now);

			h->until = now + HELLO_TIMEOUT_S * UINT64_C(1000000000);
			h->reading = true;
			cn->released = 1;
			arm_hello(b, cn);
		} else {
			hello_answer_judged(b, cn, cn->held_res);
		}
		now = now_ns();
	}
	return next;
}

void hello_answer(struct broker *b, struct conn *cn, int res, const struct ucred *peer)
{
	struct chime_hello hello, *h = &hello;
	socklen_t len = sizeof(struct ucred);
	struct ucred cred;
	bool attach;

	memcpy(h, cn->buf, sizeof(*h));
	if (res == -ECANCELED)
		return;         /* the hello timeout fired first: it logs */
	if (res < 8 || h->magic != CHIME_HELLO_MAGIC) {
		log_msg(LOG_DEBUG, "closing a connection that did not say hello (%d bytes)", res);
		return;
	}
	if (peer) {
		cred = *peer;
	} else if (getsockopt(cn->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_errno(LOG_WARNING, errno, "getsockopt(SO_PEERCRED)");
		return;
	}
	/*
	 * Layout first: an older client's hello is shorter, and it deserves
	 * EPROTO. Logged as refusals are, at most once a second: anyone who
	 * can reach the socket can send one, admitted or not.
	 */
	if (h->layout != CHIME_SHM_LAYOUT) {
		char why[96];

		snprintf(why, sizeof(why), "it speaks shm layout %u, this broker %u", h->layout, CHIME_SHM_LAYOUT);
		refuse_log(b, &cred, why);
		send_status(cn->fd, -EPROTO);
		return;
	}
	if (res != (int)sizeof(*h)) {
		log_msg(LOG_DEBUG, "closing a connection whose hello has %d bytes", res);
		return;
	}
	if (!admitted(b, cn->fd, &cred)) {
		refuse_log(b, &cred, "not admitted by the policy (--allow-uid, --allow-gid, --allow-all)");
		send_status(cn->fd, -EACCES);
		return;
	}
	if (!session_name_ok(h->session)) {
		refuse_log(b, &cred, "a malformed session name");
		send_status(cn->fd, -EINVAL);
		return;
	}
	if (h->flags == CHIME_HELLO_RESET_STATS) {
		reset_stats(b, cn->fd, &cred);  /* and the connection ends */
		return;
	}
	if (h->flags == CHIME_HELLO_DROP_SESSION) {
		drop_session(b, cn->fd, &cred, h->session);     /* and the connection ends */
		return;
	}
	if (h->flags == CHIME_HELLO_RELOAD) {
		reload_asked(b, cn->fd, &cred); /* and the connection ends */
		return;
	}
	if (h->flags == CHIME_HELLO_PING) {
		ping_answer(b, cn->fd, &cred);  /* and the connection ends */
		return;
	}
	/* A resuming library's rings start where it closed its old ones (ring.h), a position it chose. */
	if ((h->flags & CHIME_HELLO_RESUME) ?
	    (!h->session[0] || h->sq_base >= (UINT64_C(1) << 62) || (h->sq_base & (b->geom.sq_size - 1))) :
	    h->sq_base != 0) {
		refuse_log(b, &cred, "a malformed hello (resume flag or submission base)");
		send_status(cn->fd, -EINVAL);
		return;
	}
	attach = (h->flags & ~(CHIME_HELLO_RESUME | CHIME_HELLO_SEALS)) == 0;
	if (attach && !(h->flags & CHIME_HELLO_SEALS)) {
		/* An older libchime: it would leave its segments open to holes that stall a shard. */
		refuse_log(b, &cred, "its library does not seal its segments (CHIME_HELLO_SEALS): libchime too old");
		send_status(cn->fd, -EPROTO);
		return;
	}
	if (attach)
		held_settle(b, cred.uid);
	if (attach && unsealed_full(b, cred.uid)) {
		refuse_log(b, &cred, "its user's connections that ended before their client sealed its segments "
			   "left the broker as many of them to seal, or kept, as it allows one user");
		send_status(cn->fd, -EUSERS);
		return;
	}
	if (attach && h->session[0]) {
		session_open(b, cn, &cred, h);
		return;
	}
	if (!attach) {
		answer_query(b, cn, h, &cred);  /* and the connection ends: no client slot is taken */
		return;
	}
	if (uid_full(b, cred.uid)) {
		refuse_log(b, &cred, per_uid_full(b, cred.uid));
		send_status(cn->fd, -EUSERS);
		return;
	}
	client_admit(b, cn, &cred, "", h->limit == CHIME_HELLO_TOUCH);
}

/*
 * A user may hold MAX_HANDSHAKES_PER_UID connections that have not said
 * hello yet: one that opens connections and stays silent keeps only itself
 * waiting (each still times out after HELLO_TIMEOUT_S). One past it is
 * answered -EAGAIN: a connection counts from its accept until its hello's
 * read completes, and a burst of honest opens (64 workers forked together)
 * fills the cap before their hellos are read; libchime asks again after a
 * random pause. Hung up on without a word, 5 of 64 such workers failed.
 */
bool handshake_allowed(struct broker *b, struct conn *cn)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	uint32_t n = 0;

	if (getsockopt(cn->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return false;
	cn->uid = policy_account_uid(&b->policy, cred.uid);
	for (struct conn *o = b->conns; o; o = o->next)
		n += o->uid == cn->uid;
	if (n < MAX_HANDSHAKES_PER_UID)
		return true;
	refuse_log(b, &cred, "too many connections of its user waiting to say hello (told to try again)");
	send_status(cn->fd, -EAGAIN);
	return false;
}

void conn_put(struct broker *b, struct conn *cn)
{
	if (--cn->inflight)
		return;
	if (cn->fd >= 0)
		close_aside(b, cn->fd);
	if (cn->prev)
		cn->prev->next = cn->next;
	else
		b->conns = cn->next;
	if (cn->next)
		cn->next->prev = cn->prev;
	free(cn);
	b->nr_handshakes--;
	arm_accept(b);
}
