/* SPDX-License-Identifier: MIT */
/*
 * fuzz_hello.c - libFuzzer target for what anyone who can reach the
 * broker's socket sends: a hello (struct chime_hello, or any other bytes),
 * judged by the real handshake.c (hello_answer(): the layout, the policy,
 * the session name, resume, sessions, queries, reset-stats, drop-session)
 * against a small broker whose client table the input sets up.
 *
 * The input is a program: the policy (allowed uids and groups, reserved
 * session names, a subordinate uid range, --max-clients-per-uid), a client
 * table (each slot's state, user, session name, hang-up, held socket), then
 * steps: hellos from users the input picks (their fields from a few
 * meaningful values or raw bytes, their length too), and the events that
 * move the table between them (a park ending, a hang-up, a reclaim, the
 * query interval passing). control.c's side (admit, park, re-attach,
 * detach, the status sent) is stubbed below: it records what it was asked
 * and moves the slot as control.c would. Checked after every hello:
 *   - a hello gets exactly one answer (a status, a query answer, an admit,
 *     a re-attach, or its socket queued for a session), none if it is not
 *     a hello at all (too short, wrong magic, wrong size);
 *   - nobody the policy refuses gets anything but a refusal;
 *   - a session goes only to its user, and a reserved name only to the
 *     user it is reserved for; no two live slots hold one name;
 *   - a query answer is well formed: magic, count <= total and <= the
 *     limit, exactly count records, each one the asker may see, and every
 *     timer record names a node of a client it may see;
 *   - every descriptor is closed once: none leaks, none is closed twice.
 * A violation calls abort() so libFuzzer reports the input.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker.h"
#include "discard.h"
#include "wheel.h"
#include "fuzz_input.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXC 6u                 /* client slots */
#define NS   2u                 /* shards */
#define CAP  16u                /* nodes per shard */
#define NR_UIDS 5u
#define NR_NAMES 6u

static struct broker B;
static uid_t uids[NR_UIDS];     /* root, ours, two users, a subordinate uid of the first */
static const char *names[NR_NAMES] = { "", "a", "b", "job.1", "job-2", "x_y" };
static gid_t my_groups[256];
static int nr_my_groups;

/* ---- what control.c would do, recorded ---- */

static struct {
	int fd;                 /* the connection being answered */
	unsigned status, admit, reattach;       /* its answers of each kind */
	int32_t last_status;
} seen;

void send_status(int fd, int32_t status)
{
	CHECK(fd >= 0 && status < 0, "send_status(%d, %d)", fd, status);
	if (fd == seen.fd) {
		seen.status++;
		seen.last_status = status;
	}
}

/* A reload (CHIME_HELLO_RELOAD of root): the policy under fuzz stays as it is. */
void broker_reload(struct broker *b, struct chime_query_reload *out)
{
	(void)b;
	memset(out, 0, sizeof(*out));
}

void read_comm(pid_t pid, char comm[16])
{
	snprintf(comm, 16, "pid%d", (int)pid);
}

/* A fuzzed hello's pid names no process of ours: its start time unknown, as /proc's hidepid leaves it. */
uint64_t chime_proc_start(pid_t pid)
{
	(void)pid;
	return 0;
}

/* No fuzzed client has a pidfd (c->pidfd stays -1): never asked. */
bool pidfd_exited(int fd)
{
	CHECK(false, "pidfd_exited(%d) of a fuzzed client", fd);
	return false;
}

void arm_accept(struct broker *b)
{
	(void)b;
}

int socket_access(struct broker *b)
{
	(void)b;
	return 0;
}

/* No fuzzed client has a memfd of its own: none can punch. */
bool punchable(int fd)
{
	(void)fd;
	return false;
}

bool held_drained(struct broker *b, struct client *c)
{
	(void)b;
	return c->held_fd < 0;
}

/* A held slot (its marker above) never drains here: none is freed. */
bool held_free_if_drained(struct broker *b, struct client *c)
{
	(void)b;
	(void)c;
	return false;
}

void close_aside(struct broker *b, int fd)
{
	(void)b;
	close(fd);
}

void close_sent_fds(struct broker *b, struct msghdr *mh)
{
	(void)b;
	CHECK(mh->msg_controllen == 0, "a fuzzed hello came with descriptors");
}

void restart_clear(struct broker *b, const struct client *c)
{
	(void)b;
	(void)c;
}

uint32_t restart_say_unattachable(struct broker *b, uint64_t now, bool reload)
{
	(void)b;
	(void)now;
	(void)reload;
	return 0;
}

/* Segments of user 1000's failed attaches that discard.c has yet to seal (the input sets how many). */
static unsigned unsealed_1000;

unsigned discard_unsealed(const struct discard *d, uint32_t uid)
{
	(void)d;
	return uid == 1000 ? unsealed_1000 : 0;
}

/* Whose a session name is by the policy, if anyone's. */
static void check_reserved(const char *name, uid_t uid)
{
	uid_t owner;

	if (name[0] && policy_session_owner(&B.policy, name, &owner))
		CHECK(owner == uid, "session '%s' reserved for uid %u went to uid %u", name, (unsigned)owner,
		      (unsigned)uid);
}

static bool name_ok(const char *name)
{
	int n = chime_session_len(name);

	if (n < 0)
		return false;
	for (int i = n; i < (int)CHIME_SESSION_MAX; i++)
		if (name[i])
			return false;
	return true;
}

void client_admit(struct broker *b, struct conn *cn, const struct ucred *cred, const char *session,
		  bool want_touch)
{
	struct client *c = NULL;

	char name[CHIME_SESSION_MAX] = "";

	(void)want_touch;
	/* "" or a hello's field: copied, the rest zero (the field's own padding was checked before). */
	strncpy(name, session, sizeof(name));
	CHECK(name_ok(name), "admitted with a malformed session name");
	check_reserved(session, cred->uid);
	for (uint32_t i = 0; i < b->o.max_clients && !c; i++)
		if (b->clients[i].state == CL_FREE)
			c = &b->clients[i];
	if (!c || b->stopping) {
		send_status(cn->fd, c ? -ECONNREFUSED : -EUSERS);
		return;
	}
	if (cn->fd == seen.fd)
		seen.admit++;
	memset(c, 0, offsetof(struct client, generation));
	c->slot = (uint16_t)(c - b->clients);
	c->fd = cn->fd;
	cn->fd = -1;
	c->next_fd = c->pidfd = c->held_fd = -1;
	snprintf(c->session, sizeof(c->session), "%s", session);
	c->cred = *cred;
	c->holder_pid = session[0] ? cred->pid : 0;
	c->acct_uid = policy_account_uid(&b->policy, cred->uid);
	c->generation++;
	c->state = CL_ACTIVE;
	client_taken(b, c);
}

void client_park(struct broker *b, struct client *c)
{
	(void)b;
	CHECK(c->state == CL_ACTIVE && c->session[0], "park of a slot in state %u", c->state);
	c->state = CL_PARKING;
}

void client_reattach(struct broker *b, struct client *c, int fd, const struct ucred *cred, bool resume,
		     uint64_t sq_base)
{
	(void)b;
	(void)resume;
	(void)sq_base;
	CHECK(c->state == CL_DETACHED, "re-attach of a slot in state %u", c->state);
	CHECK(cred->uid == c->cred.uid, "session '%s' of uid %u re-attached by uid %u", c->session,
	      (unsigned)c->cred.uid, (unsigned)cred->uid);
	check_reserved(c->session, cred->uid);
	if (fd == seen.fd)
		seen.reattach++;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = fd;
	c->cred = *cred;
	c->holder_pid = cred->pid;
	c->state = CL_ACTIVE;
}

void client_detach(struct broker *b, struct client *c, int refuse)
{
	(void)b;
	(void)refuse;
	c->state = CL_DETACHING;
}

/* ---- the input ---- */

/* ---- the broker ---- */

/* The peers' ends of the connections this input made: ours to close. */
static int peers[512];
static unsigned nr_peers;

static void pair(int sv[2])
{
	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0, "socketpair: %s",
	      strerror(errno));
	CHECK(nr_peers < sizeof(peers) / sizeof(peers[0]), "too many descriptors");
	peers[nr_peers++] = sv[1];
}

static unsigned open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	CHECK(d, "opendir /proc/self/fd");
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static _Alignas(64) uint8_t wheel_mem[NS][sizeof(struct chime_wheel) + CAP * sizeof(struct chime_node) + 4096];
	size_t ctl_size = sizeof(struct chime_ctl) + (size_t)MAXC * NS * sizeof(struct chime_client_stats);

	(void)argc;
	(void)argv;
	uids[0] = 0;
	uids[1] = geteuid();
	uids[2] = 1000;
	uids[3] = 1001;
	uids[4] = 100000;       /* 1000's (the policy's subordinate range, when the input has one) */
	nr_my_groups = getgroups(256, my_groups);
	CHECK(nr_my_groups >= 0, "getgroups");
	B.o.max_clients = MAXC;
	B.o.nr_shards = NS;
	B.o.session_linger_s = 5;
	B.geom.sq_size = 64;
	B.clients = calloc(MAXC, sizeof(*B.clients));
	B.ctl = aligned_alloc(64, (ctl_size + 63) / 64 * 64);
	B.shards = calloc(NS, sizeof(*B.shards));
	CHECK(B.clients && B.ctl && B.shards, "calloc");
	memset(B.ctl, 0, ctl_size);
	B.ctl->client_stats_off = sizeof(struct chime_ctl);
	/* Each shard: nodes of every slot, armed, one periodic, one held. */
	for (uint32_t k = 0; k < NS; k++) {
		struct wheel *wh = &B.shards[k].core.wh;

		B.shards[k].doorbell = -1;
		CHECK(wheel_init(wh, wheel_mem[k], sizeof(wheel_mem[k]), CAP, 1000, 1000000) == 0, "wheel_init");
		for (uint32_t i = 0; i < CAP - 2; i++) {
			uint32_t idx = wheel_alloc(wh);
			struct chime_node *n = wheel_node(wh, idx);

			n->owner = (uint16_t)((i + k) % MAXC);
			n->gen = 1 + i;
			n->key = i;
			n->user_data = 0xfeed0000u + i;
			n->period_ns = i % 5 == 0 ? 1000000 : 0;
			wheel_arm(wh, idx, 2000000 + i * 1000);
			if (i % 7 == 3) {
				wheel_cancel(wh, idx);
				n->state = CHIME_NODE_BACKLOG;
			}
		}
	}
	return 0;
}

static struct uid_range subuid = { .start = 100000, .count = 65536, .as = 1000 };
static struct session_rule rules[2] = { { .name = "a", .uid = 1000 }, { .name = "job", .prefix = true, .uid = 1001 } };
static uid_t allow_uids[2];
static gid_t allow_gids[1];

static void set_policy(struct in *in)
{
	uint8_t p = byte(in);
	struct policy *pol = &B.policy;

	memset(pol, 0, sizeof(*pol));
	pol->allow_all = p & 1;
	pol->uids = allow_uids;
	if (p & 2)
		allow_uids[pol->nr_uids++] = 1000;
	if (p & 4)
		allow_uids[pol->nr_uids++] = 1001;
	if (p & 8) {
		/* The hellos' primary group, or one of ours (SO_PEERGROUPS of the socketpair: admitted()). */
		allow_gids[0] = (p & 128) && nr_my_groups > 0 ? my_groups[0] : 100;
		pol->gids = allow_gids;
		pol->nr_gids = 1;
	}
	pol->sessions = (p & 16) ? rules : rules + 1;
	pol->nr_sessions = ((p & 16) != 0) + ((p & 32) != 0);
	if (p & 64) {
		pol->subuids = &subuid;
		pol->nr_subuids = 1;
	}
	B.o.max_clients_per_uid = byte(in) % 5;
	B.stopping = byte(in) == 0xff;
	unsealed_1000 = byte(in) % 4;
}

/* A slot holding a session name that session_find() sees. */
static bool holds_name(const struct client *c)
{
	return c->state != CL_FREE && c->state != CL_DETACHING && c->state != CL_HELD && !c->drop_parked &&
	       c->session[0];
}

static void set_table(struct in *in)
{
	for (uint32_t i = 0; i < MAXC; i++) {
		struct client *c = &B.clients[i];
		uint8_t st = byte(in) % 7, who = byte(in), bits = byte(in);
		int sv[2];

		memset(c, 0, sizeof(*c));
		c->slot = (uint16_t)i;
		c->fd = c->next_fd = c->pidfd = c->held_fd = -1;
		c->generation = 1;
		c->state = st;
		c->cred = (struct ucred){ .pid = (pid_t)(200 + i), .uid = uids[who % NR_UIDS], .gid = 100 };
		c->acct_uid = policy_account_uid(&B.policy, c->cred.uid);
		snprintf(c->session, sizeof(c->session), "%s", names[who / NR_UIDS % NR_NAMES]);
		c->drop_parked = c->state == CL_PARKING && (bits & 1);
		c->holder_pid = bits & 2 ? c->cred.pid : 0;
		c->token = bits & 4 ? 7 : 0;
		if (bits & 8)
			c->held_fd = 1 << 30;   /* a marker held_drained() reads; never a descriptor */
		/* The broker's own rules: one live slot a name; only a session parks or detaches. */
		for (uint32_t j = 0; j < i; j++)
			if (holds_name(&B.clients[j]) && !strcmp(B.clients[j].session, c->session))
				c->session[0] = '\0';
		if (!c->session[0] && (c->state == CL_PARKING || c->state == CL_DETACHED))
			c->state = CL_FREE;
		if (c->state == CL_ACTIVE || c->state == CL_ATTACHING) {
			pair(sv);
			c->fd = sv[0];
			if (bits & 16)
				shutdown(sv[1], SHUT_RDWR);     /* its process hung up, not seen yet */
		}
	}
	B.clients_hi = MAXC;
}

/* The hello's fields, from a few meaningful values each, or raw bytes. */
static void make_hello(struct in *in, struct chime_hello *h)
{
	static const uint32_t flags[] = {
		CHIME_HELLO_SEALS, CHIME_HELLO_RESUME | CHIME_HELLO_SEALS, CHIME_HELLO_QUERY_CLIENTS,
		CHIME_HELLO_QUERY_TIMERS, CHIME_HELLO_RESET_STATS, CHIME_HELLO_QUERY_SESSIONS,
		CHIME_HELLO_DROP_SESSION, CHIME_HELLO_RESUME | CHIME_HELLO_QUERY_CLIENTS,
		0, CHIME_HELLO_RESUME,  /* an attach of a library that does not seal: refused */
		CHIME_HELLO_QUERY_USERS, CHIME_HELLO_RELOAD, CHIME_HELLO_PING, CHIME_HELLO_QUERY_SLOTS,
	};
	enum { NF = sizeof(flags) / sizeof(flags[0]) };
	uint8_t bits = byte(in), f = byte(in), s = byte(in), l = byte(in), q = byte(in);

	memset(h, 0, sizeof(*h));
	h->magic = bits & 1 ? (uint32_t)take(in, 4) : CHIME_HELLO_MAGIC;
	h->layout = bits & 2 ? (uint32_t)take(in, 4) : CHIME_SHM_LAYOUT;
	h->flags = f < NF * (256 / NF - 1) ? flags[f % NF] : (uint32_t)take(in, 4);
	if (s % 8 < NR_NAMES) {
		snprintf(h->session, sizeof(h->session), "%s", names[s % 8]);
	} else {
		memcpy(h->session, in->p, in->n < 16 ? in->n : 16);
		skip(in, 16);
	}
	if (s & 0x80)
		h->session[CHIME_SESSION_MAX - 1] = 'z';        /* garbage after the name */
	switch (l % 6) {
	case 0:
		h->limit = 0;
		break;
	case 1:
		h->limit = 1 + l / 6;
		break;
	case 2:
		h->limit = CHIME_HELLO_TOUCH;
		break;
	case 3:
		h->limit = 7;   /* the token set_table() gives some sessions */
		break;
	default:
		h->limit = take(in, 8);
	}
	switch (q % 5) {
	case 0:
		h->sq_base = 0;
		break;
	case 1:
		h->sq_base = (uint64_t)(q / 5) * B.geom.sq_size;
		break;
	case 2:
		h->sq_base = UINT64_C(1) << 62;
		break;
	default:
		h->sq_base = take(in, 8);
	}
	/* QUERY_TIMERS: whose, a slot's process or any pid. */
	h->pid = bits & 4 ? (int32_t)take(in, 4) : (int32_t)(200 + (bits >> 3) % MAXC);
}

struct answer {
	uint8_t buf[256 * 1024];
	size_t len;
};

static void read_answer(int fd, struct answer *a)
{
	ssize_t n;

	a->len = 0;
	while (a->len < sizeof(a->buf) && (n = recv(fd, a->buf + a->len, sizeof(a->buf) - a->len, MSG_DONTWAIT)) > 0)
		a->len += (size_t)n;
}

static bool privileged(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

static bool admitted(const struct ucred *cred)
{
	return policy_admits(&B.policy, geteuid(), cred->uid, cred->gid, nr_my_groups ? my_groups : NULL,
			     (size_t)nr_my_groups);
}

/* A query's answer: a head, then exactly `count` records the asker may see. */
static void check_answer(const struct answer *a, const struct chime_hello *h, const struct ucred *asker)
{
	struct chime_query_head head;
	size_t sz = h->flags == CHIME_HELLO_QUERY_SESSIONS ? sizeof(struct chime_query_session) :
		    h->flags == CHIME_HELLO_QUERY_CLIENTS ? sizeof(struct chime_query_client) :
		    h->flags == CHIME_HELLO_QUERY_SLOTS ? sizeof(struct chime_query_slot) :
		    h->flags == CHIME_HELLO_QUERY_TIMERS ? sizeof(struct chime_query_timer) :
		    h->flags == CHIME_HELLO_QUERY_USERS ? sizeof(struct chime_query_user) :
		    h->flags == CHIME_HELLO_RELOAD ? sizeof(struct chime_query_reload) : 0;
	uint64_t limit = h->limit && h->limit < CHIME_QUERY_MAX ? h->limit : CHIME_QUERY_MAX;
	const uint8_t *rec = a->buf + sizeof(head);

	CHECK(a->len >= sizeof(head), "answer of %zu bytes", a->len);
	memcpy(&head, a->buf, sizeof(head));
	CHECK(head.magic == CHIME_HELLO_MAGIC, "answer magic %#x", head.magic);
	if (head.status != 0 || !sz) {
		CHECK(a->len == sizeof(head), "status %d with %zu bytes", head.status, a->len);
		CHECK(head.status == 0 || head.status == -EBUSY || head.status == -EINVAL || head.status == -ESRCH ||
		      head.status == -EACCES || head.status == -ENOMEM || head.status == -EPERM ||
		      (h->flags == CHIME_HELLO_PING && (head.status == -EUSERS || head.status == -ECONNREFUSED)),
		      "answer status %d", head.status);
		return;
	}
	CHECK(h->flags != CHIME_HELLO_RELOAD || (privileged(asker->uid) && head.count == 1),
	      "a reload answered to uid %u with %llu records", (unsigned)asker->uid, (unsigned long long)head.count);
	CHECK(head.count <= head.total && head.count <= limit, "count %llu, total %llu, limit %llu",
	      (unsigned long long)head.count, (unsigned long long)head.total, (unsigned long long)limit);
	CHECK(a->len == sizeof(head) + head.count * sz, "%llu records in %zu bytes",
	      (unsigned long long)head.count, a->len);
	for (uint64_t i = 0; i < head.count; i++, rec += sz) {
		if (h->flags == CHIME_HELLO_QUERY_CLIENTS) {
			struct chime_query_client r;

			memcpy(&r, rec, sizeof(r));
			CHECK(r.slot < MAXC && B.clients[r.slot].state == CL_ACTIVE, "client record of slot %u", r.slot);
			CHECK(privileged(asker->uid) || r.uid == asker->uid, "uid %u sees a client of uid %u",
			      (unsigned)asker->uid, r.uid);
		} else if (h->flags == CHIME_HELLO_QUERY_SLOTS) {
			struct chime_query_slot r;
			int st;

			memcpy(&r, rec, sizeof(r));
			CHECK(r.client.slot < MAXC, "slot record of slot %u", r.client.slot);
			st = B.clients[r.client.slot].state;
			CHECK(r.state == (st == CL_ACTIVE || st == CL_PARKING ? CHIME_CLIENT_ACTIVE :
					  st == CL_DETACHING || st == CL_HELD ? CHIME_CLIENT_DYING :
					  st == CL_DETACHED ? CHIME_CLIENT_DETACHED : UINT32_MAX),
			      "slot %u in state %d shown as %u", r.client.slot, st, r.state);
			CHECK(privileged(asker->uid) || r.client.uid == asker->uid, "uid %u sees a slot of uid %u",
			      (unsigned)asker->uid, r.client.uid);
		} else if (h->flags == CHIME_HELLO_RELOAD) {
			break;  /* the stub's: nothing of the asker's to check */
		} else if (h->flags == CHIME_HELLO_QUERY_USERS) {
			struct chime_query_user r;

			memcpy(&r, rec, sizeof(r));
			CHECK(privileged(asker->uid) || r.uid == policy_account_uid(&B.policy, asker->uid),
			      "uid %u sees the use of uid %u", (unsigned)asker->uid, r.uid);
		} else if (h->flags == CHIME_HELLO_QUERY_SESSIONS) {
			struct chime_query_session r;

			memcpy(&r, rec, sizeof(r));
			CHECK(r.slot < MAXC && r.name[0] && name_ok(r.name), "session record of slot %u", r.slot);
			CHECK(privileged(asker->uid) || r.uid == asker->uid, "uid %u sees a session of uid %u",
			      (unsigned)asker->uid, r.uid);
		} else {
			struct chime_query_timer r;
			const struct chime_node *n;
			uint32_t idx;

			memcpy(&r, rec, sizeof(r));
			idx = chime_id_index(r.id);
			CHECK(r.shard < NS && chime_id_shard(r.id) == r.shard && idx < CAP, "timer record %#llx",
			      (unsigned long long)r.id);
			n = wheel_node(&B.shards[r.shard].core.wh, idx);
			CHECK(n->owner < MAXC && (privileged(asker->uid) || B.clients[n->owner].cred.uid == asker->uid),
			      "uid %u sees a timer of slot %u", (unsigned)asker->uid, n->owner);
			CHECK(r.key == n->key && r.user_data == n->user_data, "timer record of another node");
		}
	}
}

/* No two live slots hold one session name, and nobody waits for a session that is not its user's. */
static void check_table(void)
{
	for (uint32_t i = 0; i < MAXC; i++) {
		const struct client *c = &B.clients[i];

		for (uint32_t j = 0; j < i; j++)
			CHECK(!holds_name(c) || !holds_name(&B.clients[j]) || strcmp(c->session, B.clients[j].session),
			      "slots %u and %u both hold session '%s'", j, i, c->session);
		if (c->next_fd >= 0) {
			CHECK(c->session[0] && (c->state == CL_PARKING || c->state == CL_DETACHED),
			      "slot %u: a process waits for it in state %u", i, c->state);
			CHECK(c->next_cred.uid == c->cred.uid, "session '%s' of uid %u: uid %u waits for it",
			      c->session, (unsigned)c->cred.uid, (unsigned)c->next_cred.uid);
			check_reserved(c->session, c->next_cred.uid);
		}
	}
}

static void hello(struct in *in, bool raw)
{
	static struct answer a;
	struct conn cn = { .fd = -1 };
	struct chime_hello h;
	uint8_t who = byte(in), len = byte(in);
	struct ucred cred = { .pid = (pid_t)(300 + who / NR_UIDS % 4), .uid = uids[who % NR_UIDS], .gid = 100 };
	int sv[2], res, waiting = -1;
	unsigned outcomes;

	if (raw) {
		size_t n = in->n < sizeof(cn.buf) ? in->n : sizeof(cn.buf);

		memcpy(cn.buf, in->p, n);
		skip(in, n);
		memcpy(&h, cn.buf, sizeof(h));
		res = (int)n;
	} else {
		make_hello(in, &h);
		memcpy(cn.buf, &h, sizeof(h));
		/* Mostly a hello's size; else any a SEQPACKET recv of sizeof(buf) can return. */
		res = len < 200 ? (int)sizeof(h) : len % (sizeof(cn.buf) + 1);
	}
	pair(sv);
	cn.fd = sv[0];
	cn.uid = policy_account_uid(&B.policy, cred.uid);
	cn.inflight = 2;
	memset(&seen, 0, sizeof(seen));
	seen.fd = cn.fd;
	hello_answer(&B, &cn, res, &cred);
	while (query_step(&B))
		;
	read_answer(sv[1], &a);
	for (uint32_t i = 0; i < MAXC; i++)
		if (B.clients[i].next_fd == sv[0])
			waiting = (int)i;
	outcomes = seen.status + seen.admit + seen.reattach + (a.len > 0) + (waiting >= 0);
	if (res < 8 || h.magic != CHIME_HELLO_MAGIC ||
	    (h.layout == CHIME_SHM_LAYOUT && res != (int)sizeof(h))) {
		CHECK(outcomes == 0, "a hello of %d bytes, magic %#x, answered", res, h.magic);
	} else {
		CHECK(outcomes == 1, "%u answers (status %u: %d, admit %u, re-attach %u, %zu bytes, waiting %d)",
		      outcomes, seen.status, seen.last_status, seen.admit, seen.reattach, a.len, waiting);
		if (h.layout != CHIME_SHM_LAYOUT)
			CHECK(seen.status && seen.last_status == -EPROTO, "layout %u: status %d", h.layout,
			      seen.last_status);
		else if (!admitted(&cred))
			CHECK(seen.status && seen.last_status == -EACCES, "uid %u not admitted: status %d",
			      (unsigned)cred.uid, seen.last_status);
		else if (!name_ok(h.session))
			CHECK(seen.status && seen.last_status == -EINVAL, "malformed name: status %d", seen.last_status);
		else if ((h.flags == 0 && h.sq_base == 0) || (h.flags == CHIME_HELLO_RESUME && h.session[0] &&
							      !(h.sq_base & (B.geom.sq_size - 1)) &&
							      h.sq_base < (UINT64_C(1) << 62)))
			CHECK(seen.status && seen.last_status == -EPROTO, "an attach without CHIME_HELLO_SEALS: "
			      "status %d, admit %u", seen.last_status, seen.admit);
	}
	if (a.len)
		check_answer(&a, &h, &cred);
	check_table();
	/* What nobody took is the connection's, which conn_put() closes. */
	if (cn.fd >= 0)
		close(cn.fd);
}

/* Between hellos: what the shards, the processes and the clock do to the table. */
static void event(struct in *in)
{
	uint8_t e = byte(in);
	struct client *c = &B.clients[e % MAXC];

	switch (e / MAXC % 6) {
	case 0: /* its process hangs up (seen at the next hello) */
		if (c->fd >= 0)
			shutdown(c->fd, SHUT_RDWR);
		break;
	case 1: /* the shards have parked it; a process waiting for it attaches */
		if (c->state != CL_PARKING)
			break;
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		c->state = CL_DETACHED;
		if (c->drop_parked) {
			c->state = CL_DETACHING;
			c->drop_parked = false;
		}
		if (c->next_fd >= 0 && c->state == CL_DETACHED) {
			int fd = c->next_fd;

			c->next_fd = -1;
			c->fd = fd;
			c->cred = c->next_cred;
			c->state = CL_ACTIVE;
		}
		break;
	case 2: /* reclaimed: the slot is free */
		if (c->state != CL_DETACHING && c->state != CL_HELD)
			break;
		if (c->next_fd >= 0)
			close(c->next_fd);
		c->next_fd = -1;
		c->state = CL_FREE;
		break;
	case 3: /* attached: the shards have answered */
		if (c->state == CL_ATTACHING)
			c->state = CL_ACTIVE;
		break;
	case 4: /* its held socket drained */
		c->held_fd = -1;
		break;
	default: /* an anonymous client leaves; the query interval passes */
		if (c->state == CL_ACTIVE && !c->session[0]) {
			close(c->fd);
			c->fd = -1;
			c->state = CL_DETACHING;
		}
		B.last_query_ns[0] = B.last_query_ns[1] = 0;
		B.query_owed.n = 0;
		B.scan_owed.n = 0;
	}
}

/* Close what the table holds and the peers' ends: then no descriptor of this input may be left. */
static void finish(unsigned fds_before)
{
	for (uint32_t i = 0; i < MAXC; i++) {
		struct client *c = &B.clients[i];

		if (c->fd >= 0)
			CHECK(close(c->fd) == 0, "slot %u: its socket %d was closed already", i, c->fd);
		if (c->next_fd >= 0)
			CHECK(close(c->next_fd) == 0, "slot %u: the waiting socket %d was closed already", i, c->next_fd);
		c->fd = c->next_fd = -1;
	}
	CHECK(B.scan.fd < 0, "a timers scan left open");
	for (unsigned i = 0; i < nr_peers; i++)
		CHECK(close(peers[i]) == 0, "peer %d closed already", peers[i]);
	nr_peers = 0;
	CHECK(open_fds() == fds_before, "%u descriptors leaked", open_fds() - fds_before);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	unsigned fds_before = open_fds();

	memset(&seen, 0, sizeof(seen));
	B.scan.fd = -1;
	B.scan_owed.n = 0;
	B.last_query_ns[0] = B.last_query_ns[1] = 0;
	B.query_owed.n = 0;
	B.refused_logged_ns = 0;
	set_policy(&in);
	set_table(&in);
	for (unsigned steps = 0; in.n && steps < 64; steps++) {
		uint8_t op = byte(&in);

		if (op % 8 < 5)
			hello(&in, false);
		else if (op % 8 == 5)
			hello(&in, true);
		else
			event(&in);
	}
	finish(fds_before);
	return 0;
}
