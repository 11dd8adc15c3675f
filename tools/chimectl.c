/* SPDX-License-Identifier: MIT */
/*
 * chimectl - administer a running chimed: is it healthy, who is connected,
 * which timers does a client hold, stop it.
 *
 * Everything but the handshake of `status` and the signal of `shutdown` is
 * read from the broker's segments, mapped read-only: chimectl never changes
 * the broker's memory.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "chime_config.h"
#include "query.h"
#include "statsread.h"

#include <chime.h>

#define PROG "chimectl"

/* How long `shutdown` waits for the broker to exit. */
#define SHUTDOWN_WAIT_NS (UINT64_C(5) * 1000000000u)

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chimectl [--socket PATH] COMMAND [OPTIONS]\n"
		"Administer a running chimed.\n"
		"\n"
		"Commands:\n"
		"  status                     exit 0 if the broker is running and answers a handshake\n"
		"  clients                    list the connected clients\n"
		"  timers --client PID [--limit N]\n"
		"                             list the armed timers of client PID (default limit 100,\n"
		"                             0: all)\n"
		"  shutdown                   stop the broker (SIGTERM) and wait up to 5 s for it\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   broker socket (default: $CHIME_SOCKET, else\n"
		"                      /run/chime/chime.sock)\n"
		"  -h, --help          show this help\n"
		"  -V, --version       show the version\n"
		"\n"
		"Exit status: 0 ok; 1 failure (cannot read the broker's shared memory, the\n"
		"handshake failed, the signal failed or the broker did not exit in time);\n"
		"2 usage error; 3 the broker is not running.\n");
}

static int open_snapshot(struct sr *s, struct sr_snap *sn, const char *sock)
{
	int r = sr_open(s, sock);

	if (r < 0) {
		sr_perror(PROG, s, r);
		return SR_EXIT_NOSHM;
	}
	if (sr_snapshot(s, sn) < 0) {
		fprintf(stderr, PROG ": out of memory\n");
		sr_close(s);
		return SR_EXIT_NOSHM;
	}
	return SR_EXIT_OK;
}

/*
 * `status` for a user who may connect but not read the counters (an admitted
 * client outside --stats-group): the handshake alone says whether it runs.
 */
static int status_by_handshake(const char *sock)
{
	struct chime_opts o = { .socket_path = sock, .flags = 0 };
	chime_t *c;
	int r = chime_open(&c, &o);

	if (r < 0) {
		fprintf(stderr, PROG ": handshake with '%s' failed: %s%s\n", sock, strerror(-r),
			r == -EACCES ? " (the broker's policy refused this user)" :
			r == -ENOENT ? " (is chimed running?)" : "");
		return r == -ENOENT ? SR_EXIT_NOT_RUNNING : SR_EXIT_NOSHM;
	}
	chime_close(c);
	printf("chimed at %s is running and admits this user (its counters are for root, the "
	       "broker's user and chimed --stats-group)\n", sock);
	return SR_EXIT_OK;
}

static int cmd_status(const char *sock)
{
	struct sr_snap sn;
	const char *why;
	enum sr_state st;
	struct sr s;
	char up[32];
	int r;

	r = sr_open(&s, sock);
	if (r == -EACCES)
		return status_by_handshake(sock);
	if (r < 0) {
		sr_perror(PROG, &s, r);
		return SR_EXIT_NOSHM;
	}
	sr_close(&s);
	r = open_snapshot(&s, &sn, sock);
	if (r)
		return r;
	st = sr_liveness(&sn, &why);
	if (st != SR_RUNNING) {
		fprintf(stderr, PROG ": %s (state %s, pid %d, heartbeat %.1fs ago)\n", why,
			sr_state_name(sn.hdr.state), (int)sn.hdr.pid,
			sn.now_ns > sn.hdr.heartbeat_ns ? (double)(sn.now_ns - sn.hdr.heartbeat_ns) / 1e9 : 0.0);
		r = st == SR_STARTING ? SR_EXIT_NOSHM : SR_EXIT_NOT_RUNNING;
		goto out;
	}
	{
		struct chime_opts o = { .socket_path = sock, .flags = 0 };
		chime_t *c;

		/* The segment says alive; only a handshake proves it answers. */
		r = chime_open(&c, &o);
		if (r < 0) {
			fprintf(stderr, PROG ": handshake with '%s' failed: %s%s\n", sock, strerror(-r),
				r == -EACCES ? " (the broker's policy refused this user)" : "");
			r = SR_EXIT_NOSHM;
			goto out;
		}
		chime_close(c);
	}
	sr_fmt_dur(up, sizeof(up), sn.now_ns - sn.hdr.start_ns);
	printf("chimed pid %d version %s running, up %s, %u shards, %" PRIu64 " clients\n",
	       (int)sn.hdr.pid, sn.hdr.version, up, sn.hdr.nr_shards, sn.hdr.clients_now);
	r = SR_EXIT_OK;
out:
	sr_snap_free(&sn);
	sr_close(&s);
	return r;
}

static const char *node_state(uint8_t st)
{
	switch (st) {
	case CHIME_NODE_ARMED:
		return "armed";
	case CHIME_NODE_EXPIRED:
		return "due";
	case CHIME_NODE_BACKLOG:
		return "held";
	}
	return NULL;
}

/* Why a query failed, for a user who cannot read the segments either. */
static int query_error(const char *sock, int r, long pid)
{
	fprintf(stderr, PROG ": asking '%s' failed: %s%s\n", sock, strerror(-r),
		r == -ESRCH ? " (no client with that pid)" :
		r == -EACCES ? " (another user's client: only root, the broker's user and chimed --stats-group see it)" :
		r == -EBUSY ? " (the broker answers one query at a time: try again)" :
		r == -ENOENT ? " (is chimed running?)" : "");
	(void)pid;
	return r == -ENOENT ? SR_EXIT_NOT_RUNNING : SR_EXIT_NOSHM;
}

/*
 * `clients` and `timers` for a user who may connect but not read the
 * segments: the broker answers for the caller's own clients only.
 */
static int clients_by_query(const char *sock)
{
	struct chime_query_client recs[CHIME_QUERY_MAX];
	struct chime_query_head head;
	int r = query_broker(sock, CHIME_HELLO_QUERY_CLIENTS, 0, CHIME_QUERY_MAX, &head, recs, sizeof(recs[0]));

	if (r < 0 && r != -ECONNRESET)
		return query_error(sock, r, 0);
	printf("(this user's clients only: the others' need root, the broker's user or chimed --stats-group)\n");
	printf("%4s %7s %6s %6s %-15s %10s %8s %10s %10s\n", "SLOT", "PID", "UID", "GID", "COMM",
	       "CONNECTED", "ARMED", "ARMS", "FIRES");
	for (uint64_t i = 0; i < head.count; i++) {
		const struct chime_query_client *c = &recs[i];
		char since[32], comm[17];

		memcpy(comm, c->comm, 16);
		comm[16] = '\0';
		sr_fmt_dur(since, sizeof(since), head.now_ns > c->connected_ns ? head.now_ns - c->connected_ns : 0);
		printf("%4u %7d %6u %6u %-15s %10s %8" PRIu64 " %10" PRIu64 " %10" PRIu64 "\n", c->slot,
		       (int)c->pid, c->uid, c->gid, comm, since, c->armed, c->arms, c->fires);
	}
	return SR_EXIT_OK;
}

static int timers_by_query(const char *sock, long pid, uint64_t limit)
{
	static struct chime_query_timer recs[CHIME_QUERY_MAX];
	struct chime_query_head head;
	uint64_t want = limit && limit < CHIME_QUERY_MAX ? limit : CHIME_QUERY_MAX;
	int r = query_broker(sock, CHIME_HELLO_QUERY_TIMERS, (int32_t)pid, want, &head, recs, sizeof(recs[0]));

	if (r < 0 && r != -ECONNRESET)
		return query_error(sock, r, pid);
	printf("%18s %20s %16s %12s %6s %5s\n", "ID", "KEY", "DEADLINE", "PERIOD", "STATE", "SHARD");
	for (uint64_t i = 0; i < head.count; i++) {
		const struct chime_query_timer *t = &recs[i];
		char dl[32], per[32];

		snprintf(dl, sizeof(dl), "%+.6fs", (double)(int64_t)(t->deadline_ns - head.now_ns) / 1e9);
		if (t->period_ns)
			sr_fmt_ns(per, sizeof(per), t->period_ns);
		else
			snprintf(per, sizeof(per), "-");
		printf("%#18" PRIx64 " %20" PRIu64 " %16s %12s %6s %5u\n", t->id, t->key, dl, per,
		       node_state((uint8_t)t->state) ? node_state((uint8_t)t->state) : "?", t->shard);
	}
	if (head.total > head.count)
		printf("(%" PRIu64 " of %" PRIu64 " timers shown)\n", head.count, head.total);
	return SR_EXIT_OK;
}

/* Can this user read the counters? If not, the broker answers queries instead. */
static bool can_read(const char *sock)
{
	struct sr s;
	int r = sr_open(&s, sock);

	if (r == 0)
		sr_close(&s);
	return r != -EACCES;
}

static int cmd_clients(const char *sock)
{
	struct sr_snap sn;
	struct sr s;
	uint32_t i;
	int r;

	if (!can_read(sock))
		return clients_by_query(sock);
	r = open_snapshot(&s, &sn, sock);
	if (r)
		return r;
	printf("%4s %7s %6s %6s %-15s %10s %8s %10s %10s %10s %6s %7s %8s\n", "SLOT", "PID", "UID", "GID",
	       "COMM", "CONNECTED", "ARMED", "ARMS", "FIRES", "CANCELS", "CQ", "BACKLOG", "STATE");
	for (i = 0; i < sn.nr_clients; i++) {
		const struct sr_client *c = &sn.clients[i];
		char since[32];

		sr_fmt_dur(since, sizeof(since), sn.now_ns > c->id.connected_ns ? sn.now_ns - c->id.connected_ns : 0);
		printf("%4u %7d %6u %6u %-15s %10s %8" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64
		       " %6" PRIu64 " %7" PRIu64 " %8s\n",
		       c->slot, (int)c->id.pid, c->id.uid, c->id.gid, c->id.comm, since, c->sum.armed,
		       c->sum.arms, c->sum.fires, c->sum.cancels, c->sum.cq_depth, c->sum.backlog,
		       c->id.state == CHIME_CLIENT_DYING ? "dying" : "active");
	}
	r = sr_liveness(&sn, NULL) == SR_DEAD ? SR_EXIT_NOT_RUNNING : SR_EXIT_OK;
	if (r)
		fprintf(stderr, PROG ": chimed is not running; the list is its last state\n");
	sr_snap_free(&sn);
	sr_close(&s);
	return r;
}

/*
 * Walk shard `k`'s slab for nodes of client slot `slot`. The shard writes the
 * slab with no lock: this is a racy snapshot (a node may change while it is
 * printed), which is fine for a listing; every index is bounded by the
 * mapping, so a torn value cannot make us read outside it.
 */
static int list_shard(const char *sock, uint32_t k, uint32_t slot, uint64_t now,
		      uint64_t limit, uint64_t *shown, uint64_t *total)
{
	char path[PATH_MAX + 32];
	struct chime_map m;
	const struct chime_shard_seg *hdr;
	const struct chime_wheel *w;
	const struct chime_node *nodes;
	uint64_t wheel_off, slab_off, cap, hw, i;
	int r;

	snprintf(path, sizeof(path), "%s.shard%u", sock, k);
	r = chime_seg_open(path, CHIME_SEG_SHARD, &m);
	if (r < 0) {
		fprintf(stderr, PROG ": cannot open '%s': %s\n", path,
			r == -EBADMSG ? "not a chime shard segment" : strerror(-r));
		return SR_EXIT_NOSHM;
	}
	hdr = m.base;
	wheel_off = hdr->wheel_off;
	if (wheel_off < sizeof(*hdr) || wheel_off > m.size || m.size - wheel_off < sizeof(*w) || wheel_off % 64)
		goto bad;
	w = (const struct chime_wheel *)((const char *)m.base + wheel_off);
	slab_off = w->slab_off;
	cap = w->capacity;
	if (slab_off % 64 || slab_off > m.size - wheel_off ||
	    cap > (m.size - wheel_off - slab_off) / sizeof(struct chime_node))
		goto bad;
	nodes = (const struct chime_node *)((const char *)w + slab_off);
	hw = w->high_water < cap ? w->high_water : cap;
	for (i = 0; i < hw; i++) {
		struct chime_node n = nodes[i];
		const char *st = node_state(n.state);
		char dl[32], per[32];
		int64_t rel;

		/* A held one-shot has fired: only a held periodic timer is still armed. */
		if (!st || n.owner != slot || (n.state == CHIME_NODE_BACKLOG && !n.period_ns))
			continue;
		(*total)++;
		if (limit && *shown >= limit)
			continue;
		(*shown)++;
		rel = (int64_t)(n.deadline_ns - now);
		snprintf(dl, sizeof(dl), "%+.6fs", (double)rel / 1e9);
		if (n.period_ns)
			sr_fmt_ns(per, sizeof(per), n.period_ns);
		else
			snprintf(per, sizeof(per), "-");
		printf("%#18" PRIx64 " %20" PRIu64 " %16s %12s %6s %5u\n",
		       chime_id_make(n.gen & CHIME_ID_GEN_MASK, k, (uint32_t)i), n.key, dl, per, st, k);
	}
	chime_seg_unmap(&m);
	return SR_EXIT_OK;
bad:
	fprintf(stderr, PROG ": cannot read '%s': wheel geometry does not fit the segment\n", path);
	chime_seg_unmap(&m);
	return SR_EXIT_NOSHM;
}

static int cmd_timers(const char *sock, long pid, uint64_t limit)
{
	uint64_t shown = 0, total = 0;
	struct sr_snap sn;
	struct sr s;
	uint32_t i, k;
	int r, found = 0;

	if (!can_read(sock))
		return timers_by_query(sock, pid, limit);
	r = open_snapshot(&s, &sn, sock);
	if (r)
		return r;
	printf("%18s %20s %16s %12s %6s %5s\n", "ID", "KEY", "DEADLINE", "PERIOD", "STATE", "SHARD");
	for (i = 0; i < sn.nr_clients && !r; i++) {
		if (sn.clients[i].id.pid != pid)
			continue;
		found = 1;
		for (k = 0; k < sn.hdr.nr_shards && !r; k++)
			r = list_shard(sock, k, sn.clients[i].slot, now_ns(), limit, &shown, &total);
	}
	if (!found) {
		fprintf(stderr, PROG ": no client with pid %ld is connected to '%s'\n", pid, sock);
		r = SR_EXIT_NOSHM;
	} else if (!r && total > shown) {
		printf("(%" PRIu64 " of %" PRIu64 " timers shown; --limit 0 shows all)\n", shown, total);
	}
	sr_snap_free(&sn);
	sr_close(&s);
	return r;
}

/* 1 if /proc/PID is gone or a zombie (exited, not yet reaped by its parent). */
static int pid_gone(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static int cmd_shutdown(const char *sock)
{
	char path[64], comm[32] = "";
	struct sr_snap sn;
	uint64_t t0;
	pid_t pid;
	struct sr s;
	FILE *f;
	int r;

	r = open_snapshot(&s, &sn, sock);
	if (r)
		return r;
	pid = sn.hdr.pid;
	r = sr_liveness(&sn, NULL);
	sr_snap_free(&sn);
	sr_close(&s);
	if (r == SR_DEAD || r == SR_STOPPED || pid <= 0) {
		fprintf(stderr, PROG ": chimed (pid %d) is not running\n", (int)pid);
		return SR_EXIT_NOT_RUNNING;
	}
	/* Never signal a process that merely reused the pid. */
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "re");
	if (!f || !fgets(comm, sizeof(comm), f)) {
		fprintf(stderr, PROG ": cannot read '%s': %s\n", path, strerror(errno));
		if (f)
			fclose(f);
		return SR_EXIT_NOSHM;
	}
	fclose(f);
	comm[strcspn(comm, "\n")] = '\0';
	if (strcmp(comm, "chimed") != 0) {
		fprintf(stderr, PROG ": pid %d is '%s', not chimed; not signalling it\n", (int)pid, comm);
		return SR_EXIT_NOSHM;
	}
	if (kill(pid, SIGTERM) < 0) {
		fprintf(stderr, PROG ": kill(%d, SIGTERM) failed: %s%s\n", (int)pid, strerror(errno),
			errno == EPERM ? " (run as the broker's user or root)" : "");
		return SR_EXIT_NOSHM;
	}
	t0 = now_ns();
	while (!pid_gone(pid)) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };

		if (now_ns() - t0 > SHUTDOWN_WAIT_NS) {
			fprintf(stderr, PROG ": chimed (pid %d) did not exit within 5 s of SIGTERM\n", (int)pid);
			return SR_EXIT_NOSHM;
		}
		nanosleep(&ts, NULL);
	}
	printf("chimed (pid %d) stopped\n", (int)pid);
	return SR_EXIT_OK;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "client", required_argument, NULL, 'c' },
		{ "limit", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	const char *socket_arg = NULL, *cmd;
	long pid = -1;
	uint64_t limit = 100;
	char sock[PATH_MAX], *end;
	int opt, r;

	/* Options may come before or after the command (GNU getopt permutes). */
	while ((opt = getopt_long(argc, argv, "s:c:n:hV", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			socket_arg = optarg;
			break;
		case 'c':
			errno = 0;
			pid = strtol(optarg, &end, 10);
			if (errno || *end || pid <= 0) {
				fprintf(stderr, PROG ": invalid pid '%s'\n", optarg);
				return SR_EXIT_USAGE;
			}
			break;
		case 'n': {
			unsigned long long v;

			errno = 0;
			v = strtoull(optarg, &end, 10);
			if (errno || *end || *optarg == '-') {
				fprintf(stderr, PROG ": invalid limit '%s'\n", optarg);
				return SR_EXIT_USAGE;
			}
			limit = v;
			break;
		}
		case 'h':
			usage(stdout);
			return SR_EXIT_OK;
		case 'V':
			printf(PROG " %s\n", CHIME_VERSION);
			return SR_EXIT_OK;
		default:
			fprintf(stderr, PROG ": try '" PROG " --help'\n");
			return SR_EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, PROG ": %s (try '" PROG " --help')\n",
			optind == argc ? "missing command" : "too many arguments");
		return SR_EXIT_USAGE;
	}
	cmd = argv[optind];
	if (strcmp(cmd, "timers") && (pid != -1 || limit != 100)) {
		fprintf(stderr, PROG ": --client and --limit go with 'timers' only\n");
		return SR_EXIT_USAGE;
	}
	if (!strcmp(cmd, "timers") && pid == -1) {
		fprintf(stderr, PROG ": 'timers' needs --client PID\n");
		return SR_EXIT_USAGE;
	}
	if (strcmp(cmd, "status") && strcmp(cmd, "clients") && strcmp(cmd, "timers") && strcmp(cmd, "shutdown")) {
		fprintf(stderr, PROG ": unknown command '%s' (try '" PROG " --help')\n", cmd);
		return SR_EXIT_USAGE;
	}
	r = sr_socket_path(sock, sizeof(sock), socket_arg);
	if (r < 0) {
		fprintf(stderr, PROG ": no socket path: %s (set $CHIME_SOCKET or use --socket)\n", strerror(-r));
		return SR_EXIT_NOSHM;
	}
	if (!strcmp(cmd, "status"))
		return cmd_status(sock);
	if (!strcmp(cmd, "clients"))
		return cmd_clients(sock);
	if (!strcmp(cmd, "timers"))
		return cmd_timers(sock, pid, limit);
	return cmd_shutdown(sock);
}
