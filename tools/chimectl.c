/* SPDX-License-Identifier: MIT */
/*
 * chimectl - administer a running chimed: is it healthy, who is connected,
 * which timers does a client hold, reset its statistics, reload its policy,
 * stop it.
 *
 * Everything but the handshake of `status`, the requests of `reset-stats`
 * and `reload` and the signal of `shutdown` is read from the broker's segments, mapped
 * read-only: chimectl never changes the broker's memory.
 *
 * --json: every command prints one JSON document on stdout (jansson) with
 * the information of its text, {"command", "ok", "exit_status", ...} and on
 * failure "error" (the message also goes to stderr, as without --json).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
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
#include "cliarg.h"
#include "paths.h"
#include "query.h"
#include "segment.h"        /* chime_socket_absent_why() */
#include "statsread.h"

#include <chime.h>
#include <jansson.h>

#define PROG "chimectl"

/* How long `reset-stats` waits for every shard to apply the reset. */
#define RESET_WAIT_NS (UINT64_C(5) * 1000000000u)

/* --json: the document being built (NULL: text). */
static json_t *J;

/* Text output: only without --json. */
static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
	va_list ap;

	if (J)
		return;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
}

/* A string that may not be UTF-8 (a path, a message quoting one): bytes >= 0x80 become '?' if need be. */
static json_t *jtext(const char *s, size_t len);

/* A failure: the message on stderr, and in the JSON document's "error". Returns code. */
static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, PROG ": %s\n", msg);
	if (J && !json_object_get(J, "error"))
		json_object_set_new(J, "error", jtext(msg, sizeof(msg)));
	return code;
}

/* A process name (or a path) is whatever bytes it chose: JSON needs UTF-8, so other bytes become '?'. */
static json_t *jtext(const char *s, size_t len)
{
	size_t n = strnlen(s, len);
	json_t *j = json_stringn(s, n);
	char *buf;

	if (j)
		return j;
	buf = malloc(n + 1);
	if (!buf)
		return json_null();
	for (size_t i = 0; i < n; i++)
		buf[i] = (unsigned char)s[i] >= 0x80 ? '?' : s[i];
	buf[n] = '\0';
	j = json_string(buf);
	free(buf);
	return j;
}

static void jset(const char *key, json_t *v)
{
	if (J)
		json_object_set_new(J, key, v);
	else
		json_decref(v);
}

/*
 * How long `shutdown` waits for the broker to exit: a stop parks its
 * sessions for up to 5 s, then gives its shards 2 s to stop, then writes
 * its files (chimed(8), RESTARTS).
 */
#define SHUTDOWN_WAIT_S  10u
#define SHUTDOWN_WAIT_NS (UINT64_C(1000000000) * SHUTDOWN_WAIT_S)
/* How long `restart` waits for the new broker. */
#define RESTART_WAIT_NS (UINT64_C(10) * 1000000000u)
/* ... and how long for a new one once the old is gone (systemd's unit restarts it after 100 ms). */
#define RESTART_GONE_NS (UINT64_C(2) * 1000000000u)
/* After the signal, the same broker running and not stopping this long refused it (it stops within ms). */
#define RESTART_REFUSED_NS (UINT64_C(3) * 1000000000u)

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chimectl [--socket PATH] COMMAND [OPTIONS]\n"
		"Administer a running chimed.\n"
		"\n"
		"Commands:\n"
		"  status             exit 0 if the broker is running and answers a handshake\n"
		"  clients            list the connected clients\n"
		"  timers -c|--client PID [-n|--limit N]\n"
		"                     list the armed timers of client PID (default limit 100,\n"
		"                     0: all)\n"
		"  timers -S|--session NAME [-n|--limit N]\n"
		"                     the same for the named session NAME, attached or not\n"
		"  sessions           list the named sessions (attached or not, timers, events\n"
		"                     held, time left before an unattached one is reclaimed)\n"
		"  users              each user's use of chimed's per-user limits: clients,\n"
		"                     sessions, timers (and in the fullest shard, against its\n"
		"                     share there), and who is kept out of the table's last\n"
		"                     free slots; a user not root nor the broker's: its own\n"
		"  drop-session NAME  reclaim the detached session NAME and its timers now\n"
		"                     (root and the broker's user: any; others: their own)\n"
		"  reset-stats        restart the lateness histograms and the high-water marks\n"
		"                     (not the counters); root and the broker's user\n"
		"  reload             re-read the policy (as SIGHUP does) and say how it went:\n"
		"                     what it admits now and which rule counts changed, or why\n"
		"                     it failed (the old policy is kept); root and the\n"
		"                     broker's user\n"
		"  shutdown           stop the broker (SIGTERM) and wait up to 10 s for it\n"
		"  restart            restart the broker in place (SIGUSR2): attached sessions\n"
		"                     are parked, the new broker takes every session's timers\n"
		"                     over; waits up to 10 s for it\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   broker socket (default: $CHIME_SOCKET, else\n"
		"                      /run/chime/chime.sock)\n"
		"  -j, --json          print one JSON document (every command)\n"
		"  -h, --help          show this help\n"
		"  -V, --version       show the version\n"
		"\n"
		"Exit status:\n"
		"  0  ok\n"
		"  1  failure: the broker's shared memory cannot be read (a segment file\n"
		"     that shrank as it was read included), its socket cannot be\n"
		"     reached (permissions), it did not admit this user (these two are 4 for\n"
		"     reset-stats and reload), the handshake or the query failed, it runs\n"
		"     in another time namespace (status), it is still starting, no such\n"
		"     client or session (a\n"
		"     well-formed NAME the broker does not know), the session is attached,\n"
		"     the signal failed, it did not stop or restart in time, or the restarted\n"
		"     broker has fewer sessions than there were or lost a shard's file, the\n"
		"     reload failed (the policy kept), its socket's mode could not follow\n"
		"     it, or its outcome is unknown (a broker older than reload: sent\n"
		"     SIGHUP instead), or\n"
		"     stdout could not be written (said, unless its reader has gone)\n"
		"  2  usage error: an unknown option or command, an argument missing,\n"
		"     misplaced or malformed (a drop-session NAME that is not 1 to 63 bytes\n"
		"     of A-Z, a-z, 0-9, '.', '_', '-' included: the broker is not asked)\n"
		"  3  the broker is not running: nothing listens on the socket, no control\n"
		"     segment, or the segment says it stopped, its heartbeat is stale or its\n"
		"     process is gone (or exited, not yet reaped), or it is unfinished and no\n"
		"     broker holds the lock file (one died starting)\n"
		"  4  not permitted: reset-stats, reload, shutdown or restart by a user other\n"
		"     than root and the broker's user (one the socket's or the segment's\n"
		"     permissions refuse included), or drop-session of another user's session\n");
}

/*
 * sr_open() or sr_snapshot() failed: the standard message, on stderr and
 * in the JSON document (a shorter one there said "Bad message" for a
 * corrupt segment). No segment: no broker.
 */
static int sr_fail(const struct sr *s, int r)
{
	char msg[PATH_MAX + 256];

	sr_strerror(s, r, msg, sizeof(msg));
	return fail(r == -ENOENT || r == -ESRCH || r == -ESTALE ? SR_EXIT_NOT_RUNNING : SR_EXIT_NOSHM, "%s", msg);
}

/* Snapshot the opened segment s; closes it on failure. */
static int take_snapshot(struct sr *s, struct sr_snap *sn)
{
	int r = sr_snapshot(s, sn);

	if (r < 0) {
		r = sr_fail(s, r);
		sr_close(s);
		return r;
	}
	return SR_EXIT_OK;
}

static int open_snapshot(struct sr *s, struct sr_snap *sn, const char *sock)
{
	int r = sr_open(s, sock);

	if (r < 0)
		return sr_fail(s, r);
	return take_snapshot(s, sn);
}

/* The snapshot says no broker runs: it stopped, its heartbeat is stale or its process is gone. */
static bool broker_down(const struct sr_snap *sn, const char **why)
{
	enum sr_state st = sr_liveness(sn, why);

	return st == SR_DEAD || st == SR_STOPPED;
}

/* An -EUSERS refusal: the broker answered, so it runs. */
#define AT_LIMIT "refused this user (it has --max-clients-per-uid clients already, or the broker --max-clients)"

/* -EPERM of a connection: what chime_open(3) says of the broker's user. */
#define UNTRUSTED " (what listens there runs as a user this one does not trust: not root, not this user, " \
		  "not the owner of the socket's directory; see chime_open(3))"

/*
 * chime_open() failed. -EACCES is the broker's policy or the socket's
 * permissions (chime_open(3)); the socket's own access check tells which.
 */
static int handshake_fail(const char *sock, int r)
{
	const char *why = "";

	if (r == -ENOENT)
		return fail(SR_EXIT_NOT_RUNNING, "handshake with '%s' failed: nothing listens there (%s)", sock,
			    chime_socket_absent_why(sock));
	if (r == -EACCES)
		return fail(SR_EXIT_NOSHM, "handshake with '%s' failed: %s (%s)", sock, strerror(-r),
			    chime_socket_eacces_why(sock));
	if (r == -EPROTO)
		why = " (the broker speaks another shm layout: upgrade one side)";
	else if (r == -ECONNREFUSED)
		why = " (the broker is stopping or restarting)";
	else if (r == -EPROTOTYPE)
		why = " (not a chime broker's socket: something else listens there)";
	else if (r == -EPERM)
		why = UNTRUSTED;
	else if (r == -EUSERS)
		why = " (the broker runs, but " AT_LIMIT ")";
	else if (r == -EXDEV)
		why = " (the broker runs in another time namespace: its CLOCK_MONOTONIC is not this one's, and "
		      "chime_open() here fails with EXDEV; run clients in the broker's time namespace)";
	return fail(r == -ENOENT ? SR_EXIT_NOT_RUNNING : SR_EXIT_NOSHM, "handshake with '%s' failed: %s%s", sock,
		    strerror(-r), why);
}

/*
 * Would the broker admit this user's chime_open() now? Asked with
 * CHIME_HELLO_PING: the broker's checks of an attach, short of it, so a
 * health check is no client (a slot, segments, two log lines each time);
 * a broker before it (-EINVAL) is asked by an attach. 0, -EUSERS (at a
 * limit), -EXDEV (another clock), or chime_open()'s errors.
 */
static int handshake(const char *sock)
{
	struct chime_query_head head;
	enum query_step step;
	uint64_t t0 = now_ns();
	int r = query_broker(sock, CHIME_HELLO_PING, 0, NULL, 0, &head, NULL, 0, &step);

	/*
	 * The broker read its clock between our hello and its answer: outside
	 * that span it reads another one (a time namespace of its own), and
	 * chime_open() here would fail with EXDEV after its welcome.
	 */
	if ((r == 0 || r == -EUSERS) && (head.now_ns < t0 || head.now_ns > now_ns()))
		return -EXDEV;

	if (r == -EINVAL && step == QUERY_ANSWER) {
		struct chime_opts o = { .socket_path = sock, .flags = 0 };
		chime_t *c;

		r = chime_open(&c, &o);
		if (r == 0)
			chime_close(c);
	}
	return r;
}

/*
 * `status` for a user who may connect but not read the counters (an admitted
 * client outside --stats-group): the handshake alone says whether it runs.
 */
static int status_by_handshake(const char *sock)
{
	int r = handshake(sock);

	if (r < 0 && r != -EUSERS)
		return handshake_fail(sock, r);
	out("chimed at %s is running and %s (its counters are for root, the broker's user and chimed "
	    "--stats-group)\n", sock, r == 0 ? "admits this user" : "answered, but " AT_LIMIT);
	jset("running", json_true());
	jset("admits_this_user", json_boolean(r == 0));
	jset("counters_readable", json_false());
	return SR_EXIT_OK;
}

static int cmd_status(const char *sock)
{
	bool admitted = false;
	struct sr_snap sn;
	const char *why;
	enum sr_state st;
	struct sr s;
	char up[32];
	int r;

	r = sr_open(&s, sock);
	if (r == -EACCES)
		return status_by_handshake(sock);
	if (r < 0)
		return sr_fail(&s, r);
	r = take_snapshot(&s, &sn);
	if (r)
		return r;
	st = sr_liveness(&sn, &why);
	jset("pid", json_integer(sn.hdr.pid));
	jset("broker_version", jtext(sn.hdr.version, sizeof(sn.hdr.version)));  /* "version" is ours */
	jset("state", json_string(sr_state_name(sn.hdr.state)));
	jset("running", json_boolean(st == SR_RUNNING));
	jset("heartbeat_age_ns", json_integer(sn.now_ns > sn.hdr.heartbeat_ns ?
					      (json_int_t)(sn.now_ns - sn.hdr.heartbeat_ns) : 0));
	jset("heartbeat_period_ns", json_integer(st == SR_RUNNING ? (json_int_t)sn.hdr.beat_ms * 1000000 : 0));
	jset("counters_readable", json_true());
	if (st != SR_RUNNING) {
		r = fail(st == SR_STARTING ? SR_EXIT_NOSHM : SR_EXIT_NOT_RUNNING,
			 "%s (state %s, pid %d, heartbeat %.1fs ago)", why, sr_state_name(sn.hdr.state),
			 (int)sn.hdr.pid,
			 sn.now_ns > sn.hdr.heartbeat_ns ? (double)(sn.now_ns - sn.hdr.heartbeat_ns) / 1e9 : 0.0);
		goto out;
	}
	jset("clock_offset_ns", json_integer((json_int_t)sn.clock_off));
	/* The segment says alive; only a handshake proves it answers (a refusal for the limits too). */
	r = handshake(sock);
	if (r < 0 && r != -EUSERS) {
		/* another clock: it runs, but for no client here */
		jset(r == -EXDEV ? "admits_this_user" : "running", json_false());
		r = handshake_fail(sock, r);
		goto out;
	}
	admitted = r == 0;
	jset("admits_this_user", json_boolean(admitted));
	jset("uptime_ns", json_integer((json_int_t)(sn.now_ns - sn.hdr.start_ns)));
	jset("shards", json_integer(sn.hdr.nr_shards));
	jset("clients", json_integer((json_int_t)sn.hdr.clients_now));
	jset("stats_reset_gen", json_integer((json_int_t)sn.hdr.stats_reset_gen));
	jset("stats_reset_realtime_ns", sn.hdr.stats_reset_gen ?
	     json_integer((json_int_t)sn.hdr.stats_reset_realtime_ns) : json_null());
	sr_fmt_dur(up, sizeof(up), sn.now_ns - sn.hdr.start_ns);
	out("chimed pid %d version %s running, up %s, %u shard%s, %" PRIu64 " client%s%s\n",
	    (int)sn.hdr.pid, sn.hdr.version, up, sn.hdr.nr_shards, sn.hdr.nr_shards == 1 ? "" : "s",
	    sn.hdr.clients_now, sn.hdr.clients_now == 1 ? "" : "s",
	    sn.hdr.beat_ms > SR_HEARTBEAT_MS ? ", at rest" : "");
	if (!admitted)
		out("it answered the handshake, but %s\n", AT_LIMIT);
	r = SR_EXIT_OK;
out:
	sr_snap_free(&sn);
	sr_close(&s);
	return r;
}

/*
 * A timer's state as listed, NULL for nodes that are not listed. "due": its
 * deadline is past and its event not delivered yet; the shard takes a tick
 * of due timers off the wheel whole and leaves them ARMED until it delivers
 * each (wheel.c, the raw list), so an ARMED node past its deadline is due too.
 */
static const char *node_state(uint8_t st, uint64_t deadline_ns, uint64_t now_ns)
{
	switch (st) {
	case CHIME_NODE_ARMED:
		return deadline_ns <= now_ns ? "due" : "armed";
	case CHIME_NODE_EXPIRED:
		return "due";
	case CHIME_NODE_BACKLOG:
		return "held";
	}
	return NULL;
}

/* What a query's failure means, by the step it failed at (the same errno means different things at each). */
static const char *query_why(int r, enum query_step step)
{
	if (step == QUERY_CONNECT && r == -EACCES)
		return " (this user may not connect: the socket's permissions or a directory's above it)";
	if (step == QUERY_CONNECT && r == -EPERM)
		return UNTRUSTED;
	/* chimed's socket is SOCK_SEQPACKET: a stream or datagram one there is someone else's */
	if (step == QUERY_CONNECT && r == -EPROTOTYPE)
		return " (not a chime broker's socket: something else listens there)";
	if (step == QUERY_CONNECT && r == -ETIMEDOUT)
		return " (the broker did not take the connection within 5 s: its queue is full, and it is stopped, "
		       "wedged or flooded)";
	if (step == QUERY_HELLO && r == -EACCES)
		return " (the broker did not admit this user: see chimed --allow-uid, --allow-gid, --allow-all)";
	if (step == QUERY_HELLO && r == -EPROTO)
		return " (the broker speaks another shm layout: upgrade one side)";
	if (step == QUERY_ANSWER && r == -EBUSY)
		return " (the broker answers at most one query per 50 ms, and other queries kept it busy for 1 s: "
		       "try again)";
	if (step == QUERY_ANSWER && r == -ETIMEDOUT)
		return " (the broker did not answer within 5 s)";
	if (step == QUERY_ANSWER && r == -EBADMSG)
		return " (not a chime broker's answer: is something else listening there?)";
	return "";
}

/*
 * A query failed: "WHAT at 'SOCK' failed: ERROR (WHY)". why: what the
 * answer's status means for this query, or NULL for query_why()'s. Nothing
 * listening is exit status 3, like a dead broker's segment.
 */
static int query_error(const char *sock, const char *what, int r, enum query_step step, const char *why)
{
	if (step == QUERY_CONNECT && r == -ENOENT)
		return fail(SR_EXIT_NOT_RUNNING, "%s at '%s' failed: nothing listens there (%s)", what, sock,
			    chime_socket_absent_why(sock));
	/* The broker's ESRCH names no process: a session or client it does not have ("No such process"). */
	return fail(step == QUERY_CONNECT && r == -ENOENT ? SR_EXIT_NOT_RUNNING : SR_EXIT_NOSHM,
		    "%s at '%s' failed: %s%s", what, sock, step == QUERY_ANSWER && r == -ESRCH ? "not found" :
		    strerror(-r), why ? why : query_why(r, step));
}

/* The answer ended early but its head came: the records that arrived are good. */
static bool partial(int r, const struct chime_query_head *head)
{
	return r == -ECONNRESET && head->magic == CHIME_HELLO_MAGIC;
}

/* A timer id as the text shows it and JSON carries it: "0x..." (an opaque 64-bit value). */
static const char *fmt_id(char *buf, size_t len, uint64_t id)
{
	snprintf(buf, len, "0x%" PRIx64, id);
	return buf;
}

/* A listed timer, from a slab (list_shard()) or from the broker (timers_by_query()). */
struct listed {
	uint64_t id, key, user_data, deadline_ns, period_ns;
	const char *state;
	uint32_t shard;
	bool touched;           /* its resets are words in the client's touch table */
	bool exact;             /* false: a touched timer's deadline as the shard last took it (a lower bound) */
	bool wall;              /* a wall-clock timer (its deadline_ns is monotonic all the same) */
};

/*
 * A timer as a line of text and as JSON, deadline relative to `now`. key
 * and user_data are any uint64_t, which a JSON number (a double to most
 * readers, int64 to jansson) does not hold exactly: always decimal
 * strings, as the text prints the key.
 */
static void show_timer(const struct listed *t, uint64_t now, json_t *arr)
{
	char ids[24], keys[24], uds[24], dl[40], per[32];
	bool due = t->deadline_ns < now;
	uint64_t dist = due ? now - t->deadline_ns : t->deadline_ns - now;
	/* Any uint64_t deadline is valid (UINT64_MAX: never, in effect): not negative past 2^63 ns. */
	json_int_t rel = sr_rel_ns(t->deadline_ns, now);
	json_int_t period = t->period_ns > INT64_MAX ? INT64_MAX : (json_int_t)t->period_ns;

	snprintf(dl, sizeof(dl), "%s%+.6fs", t->exact ? "" : ">=", (due ? -1.0 : 1.0) * ((double)dist / 1e9));
	if (t->period_ns)
		sr_fmt_ns(per, sizeof(per), t->period_ns == UINT64_MAX ? UINT64_MAX - 1 : t->period_ns);  /* not "-" */
	else
		snprintf(per, sizeof(per), "-");
	fmt_id(ids, sizeof(ids), t->id);
	out("%18s %20" PRIu64 " %16s %12s %6s %5u %5s\n", ids, t->key, dl, per, t->state ? t->state : "?", t->shard,
	    t->wall ? "wall" : "mono");
	snprintf(keys, sizeof(keys), "%" PRIu64, t->key);
	snprintf(uds, sizeof(uds), "%" PRIu64, t->user_data);
	json_array_append_new(arr, json_pack("{s:s,s:s,s:s,s:I,s:b,s:I,s:s,s:i,s:b,s:s}", "id", ids, "key", keys,
					     "user_data", uds, "deadline_in_ns", (json_int_t)rel,
					     "deadline_exact", t->exact, "period_ns", period,
					     "state", t->state ? t->state : "?", "shard", (int)t->shard,
					     "touched", t->touched, "clock", t->wall ? "realtime" : "monotonic"));
}

/*
 * A query's answer that lists fewer than there are says so: the broker
 * sends at most CHIME_QUERY_MAX records, and only what its socket takes
 * without waiting (a thousand sessions were cut to 832-896, silently).
 */
static void shown_of(uint64_t shown, uint64_t total, const char *what)
{
	if (total > shown)
		out("(%" PRIu64 " of %" PRIu64 " %s shown: the broker's answer holds at most %u, and what its "
		    "socket takes at once)\n", shown, total, what, CHIME_QUERY_MAX);
}

/*
 * `clients` and `timers` for a user who may connect but not read the
 * segments: the broker answers for the caller's own clients only, with
 * the slots that are not connected clients (dying, detached) as the
 * segment shows them; a broker before CHIME_HELLO_QUERY_SLOTS, the
 * connected ones only.
 */
static int clients_by_query(const char *sock)
{
	static struct chime_query_slot recs[CHIME_QUERY_MAX];
	struct chime_query_head head;
	enum query_step step;
	bool with_state = true;
	json_t *arr;
	int r = query_broker(sock, CHIME_HELLO_QUERY_SLOTS, 0, NULL, CHIME_QUERY_MAX, &head, recs, sizeof(recs[0]),
			     &step);

	if (r == -EINVAL && step == QUERY_ANSWER) {
		static struct chime_query_client old[CHIME_QUERY_MAX];

		with_state = false;
		r = query_broker(sock, CHIME_HELLO_QUERY_CLIENTS, 0, NULL, CHIME_QUERY_MAX, &head, old, sizeof(old[0]),
				 &step);
		for (uint64_t i = 0; i < head.count && i < CHIME_QUERY_MAX; i++)
			recs[i] = (struct chime_query_slot){ .client = old[i], .state = CHIME_CLIENT_ACTIVE };
	}
	if (r < 0 && !partial(r, &head))
		return query_error(sock, "asking for this user's clients", r, step, NULL);
	arr = json_array();
	out("(this user's clients only: the others' need root, the broker's user or chimed --stats-group%s)\n",
	    with_state ? "" : "; a broker this old lists connected clients only");
	out("%4s %7s %6s %6s %-15s %10s %8s %10s %10s %8s\n", "SLOT", "PID", "UID", "GID", "COMM",
	    "CONNECTED", "ARMED", "ARMS", "FIRES", "STATE");
	for (uint64_t i = 0; i < head.count; i++) {
		const struct chime_query_client *c = &recs[i].client;
		uint64_t age = head.now_ns > c->connected_ns ? head.now_ns - c->connected_ns : 0;
		const char *state = sr_client_state(recs[i].state);
		char since[32], comm[17];

		memcpy(comm, c->comm, 16);
		comm[16] = '\0';
		chime_printable(comm, sizeof(comm));    /* the answer is whoever listens at the socket's */
		sr_fmt_dur(since, sizeof(since), age);
		out("%4u %7d %6u %6u %-15s %10s %8" PRIu64 " %10" PRIu64 " %10" PRIu64 " %8s\n", c->slot,
		    (int)c->pid, c->uid, c->gid, comm, since, c->armed, c->arms, c->fires, state);
		json_array_append_new(arr, json_pack("{s:i,s:i,s:i,s:i,s:o,s:I,s:I,s:I,s:I,s:s}", "slot", (int)c->slot,
						     "pid", (int)c->pid, "uid", (int)c->uid, "gid", (int)c->gid,
						     "comm", jtext(comm, sizeof(comm)),
						     "connected_for_ns", (json_int_t)age,
						     "armed", (json_int_t)c->armed, "arms", (json_int_t)c->arms,
						     "fires", (json_int_t)c->fires, "state", state));
	}
	if (head.count == 0 && head.total == 0)
		out("(no clients)\n");
	shown_of(head.count, head.total, "clients");
	jset("shown", json_integer((json_int_t)head.count));
	jset("total", json_integer((json_int_t)head.total));
	jset("own_uid_only", json_true());
	jset("clients", arr);
	return SR_EXIT_OK;
}

/* Whose timers `timers` lists: the client of pid, or the named session (pid -1). */
struct whose {
	long pid;
	const char *session;
};

static int timers_by_query(const char *sock, struct whose w, uint64_t limit)
{
	static struct chime_query_timer recs[CHIME_QUERY_MAX];
	struct chime_query_head head;
	uint64_t want = limit && limit < CHIME_QUERY_MAX ? limit : CHIME_QUERY_MAX;
	enum query_step step;
	json_t *arr;
	int r = query_broker(sock, CHIME_HELLO_QUERY_TIMERS, w.session ? 0 : (int32_t)w.pid, w.session, want, &head,
			     recs, sizeof(recs[0]), &step);

	if (r < 0 && !partial(r, &head))
		return query_error(sock, w.session ? "asking for the timers of a session" :
				   "asking for the timers of a client", r, step,
				   step != QUERY_ANSWER ? NULL :
				   r == -ESRCH ? (w.session ? " (no session of that name)" :
						  " (no client with that pid is connected)") :
				   r == -EACCES ? (w.session ? " (another user's session: only root, the broker's user "
							       "and chimed --stats-group see its timers)" :
						   " (another user's client: only root, the broker's user and chimed "
						   "--stats-group see its timers)") : NULL);
	arr = json_array();
	out("%18s %20s %16s %12s %6s %5s %5s\n", "ID", "KEY", "DEADLINE", "PERIOD", "STATE", "SHARD", "CLOCK");
	for (uint64_t i = 0; i < head.count; i++) {
		const struct chime_query_timer *t = &recs[i];

		/* The broker read a touched timer's word: exact, as of the query. */
		show_timer(&(struct listed){ .id = t->id, .key = t->key, .user_data = t->user_data,
					     .deadline_ns = t->deadline_ns, .period_ns = t->period_ns,
					     .state = node_state((uint8_t)t->state, t->deadline_ns, head.now_ns),
					     .shard = t->shard, .touched = t->flags & CHIME_QUERY_TIMER_TOUCHED,
					     .exact = true, .wall = t->flags & CHIME_QUERY_TIMER_REALTIME },
			   head.now_ns, arr);
	}
	if (head.total > head.count)
		out("(%" PRIu64 " of %" PRIu64 " timers shown)\n", head.count, head.total);
	else if (!head.total)
		out("(no timers)\n");      /* as clients, sessions and users say theirs: not a header alone */
	jset("timers", arr);
	jset("shown", json_integer((json_int_t)head.count));
	jset("total", json_integer((json_int_t)head.total));
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

/* Lateness of a client's timers (since it connected or the last reset): nearest-rank, bucket bound. */
static uint64_t client_pct(const struct sr_client *c, double p)
{
	return sr_percentile(c->sum.lat, c->sum.lat_max_ns, p);
}

static int cmd_clients(const char *sock)
{
	struct sr_snap sn;
	const char *why;
	struct sr s;
	json_t *arr;
	uint32_t i;
	int r;

	if (!can_read(sock))
		return clients_by_query(sock);
	r = open_snapshot(&s, &sn, sock);
	if (r)
		return r;
	arr = json_array();
	out("%4s %7s %6s %6s %-15s %10s %8s %10s %10s %10s %6s %7s %6s %9s %9s %9s %8s\n", "SLOT", "PID", "UID",
	    "GID", "COMM", "CONNECTED", "ARMED", "ARMS", "FIRES", "CANCELS", "CQ", "BACKLOG", "SQ", "LAT_P50",
	    "LAT_P99", "LAT_MAX", "STATE");
	for (i = 0; i < sn.nr_clients; i++) {
		const struct sr_client *c = &sn.clients[i];
		uint64_t age = sn.now_ns > c->id.connected_ns ? sn.now_ns - c->id.connected_ns : 0;
		const char *state = sr_client_state(c->id.state);
		char since[32], lp[3][16];
		json_t *o;

		sr_fmt_dur(since, sizeof(since), age);
		sr_fmt_ns(lp[0], sizeof(lp[0]), client_pct(c, 0.5));
		sr_fmt_ns(lp[1], sizeof(lp[1]), client_pct(c, 0.99));
		sr_fmt_ns(lp[2], sizeof(lp[2]), c->sum.lat_max_ns);
		if (!sr_hist_count(c->sum.lat))
			for (int k = 0; k < 3; k++)
				strcpy(lp[k], "-");     /* nothing fired yet: no lateness, not 0 */
		out("%4u %7d %6u %6u %-15s %10s %8" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64
		    " %6" PRIu64 " %7" PRIu64 " %6" PRIu64 " %9s %9s %9s %8s\n",
		    c->slot, (int)c->id.pid, c->id.uid, c->id.gid, c->id.comm, since, c->sum.armed,
		    c->sum.arms, c->sum.fires, c->sum.cancels, c->sum.cq_depth, c->sum.backlog,
		    c->sum.sq_depth, lp[0], lp[1], lp[2], state);
		o = json_pack("{s:i,s:i,s:i,s:i,s:o,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s}", "slot", (int)c->slot,
			      "pid", (int)c->id.pid, "uid", (int)c->id.uid, "gid", (int)c->id.gid,
			      "comm", jtext(c->id.comm, sizeof(c->id.comm)), "connected_for_ns", (json_int_t)age,
			      "armed", (json_int_t)c->sum.armed, "arms", (json_int_t)c->sum.arms,
			      "fires", (json_int_t)c->sum.fires, "cancels", (json_int_t)c->sum.cancels,
			      "cq_depth", (json_int_t)c->sum.cq_depth, "backlog", (json_int_t)c->sum.backlog,
			      "sq_depth", (json_int_t)c->sum.sq_depth, "state", state);
		json_object_set_new(o, "lateness", json_pack("{s:I,s:I,s:I,s:I}",
							     "count", (json_int_t)sr_hist_count(c->sum.lat),
							     "p50_ns", (json_int_t)client_pct(c, 0.5),
							     "p99_ns", (json_int_t)client_pct(c, 0.99),
							     "max_ns", (json_int_t)c->sum.lat_max_ns));
		json_array_append_new(arr, o);
	}
	if (sn.nr_clients == 0)
		out("(no clients)\n");
	jset("clients", arr);
	r = broker_down(&sn, &why) ? SR_EXIT_NOT_RUNNING : SR_EXIT_OK;
	jset("running", json_boolean(!r));
	if (r)
		fail(r, "%s; the list is its last state", why);
	sr_snap_free(&sn);
	sr_close(&s);
	return r;
}

/* A node of shard k as listed, or false if it is not one of the slots' timers. */
static bool node_listed(const struct chime_node *n, uint32_t k, uint64_t i, const uint8_t *slots, uint64_t now,
			struct listed *t)
{
	const char *st = node_state(n->state, n->deadline_ns, now);
	bool touched = n->gen & CHIME_NODE_TOUCH;

	/* A held one-shot has fired: only a held periodic timer is still armed. */
	if (!st || !slots[n->owner] || (n->state == CHIME_NODE_BACKLOG && !n->period_ns))
		return false;
	/*
	 * A touched timer's latest deadline is a word in its client's
	 * table, which only the broker maps: the node's is where the
	 * shard will next look, no later than it.
	 */
	*t = (struct listed){ .id = chime_id_make(n->gen & CHIME_ID_GEN_MASK, k, (uint32_t)i), .key = n->key,
			      .user_data = n->user_data, .deadline_ns = n->deadline_ns, .period_ns = n->period_ns,
			      .state = st, .shard = k, .touched = touched, .exact = !touched,
			      .wall = n->gen & CHIME_NODE_REALTIME };
	return true;
}

/* Nodes copied out of a slab at a time (sr_copy()): 256 KiB. */
#define LIST_BATCH 4096u

/*
 * Walk shard `k`'s slab for nodes of the client slots in `slots` (a set:
 * one byte per slot, 65536). The shard writes the
 * slab with no lock: this is a racy snapshot (a node may change while it is
 * printed), which is fine for a listing; every index is bounded by the
 * mapping, so a torn value cannot make us read outside it. The file is
 * read through sr_copy(), in batches, and printed from the copy: it may
 * shrink meanwhile (SIGBUS, before).
 */
static int list_shard(const char *sock, uint32_t k, const uint8_t *slots, uint64_t now,
		      uint64_t limit, uint64_t *shown, uint64_t *total, json_t *arr)
{
	static struct chime_node batch[LIST_BATCH];
	char path[PATH_MAX + 32];
	struct chime_map m;
	struct chime_shard_seg hdr;
	struct chime_wheel w;   /* its head only: the fields up to the slot lists */
	uint64_t wheel_off, slab_off, cap, hw, i;
	int r;

	chime_shard_path(path, sizeof(path), sock, k);
	r = sr_map(path, CHIME_SEG_SHARD, &m, NULL, NULL);
	if (r < 0)
		return fail(SR_EXIT_NOSHM, "cannot open '%s': %s", path,
			    r == -EBADMSG ? "not a chime shard segment" : r == -ENODATA ? SR_SHRANK_WHY :
			    r == -ELOOP ? SR_SYMLINK_WHY : strerror(-r));
	r = sr_copy(&m, &hdr, 0, sizeof(hdr));
	if (r < 0)
		goto bad;
	wheel_off = hdr.wheel_off;
	if (wheel_off < sizeof(hdr) || wheel_off > m.size || m.size - wheel_off < sizeof(w) || wheel_off % 64)
		goto bad;
	r = sr_copy(&m, &w, wheel_off, offsetof(struct chime_wheel, occupied));
	if (r < 0)
		goto bad;
	slab_off = w.slab_off;
	cap = w.capacity;
	if (slab_off % 64 || slab_off > m.size - wheel_off ||
	    cap > (m.size - wheel_off - slab_off) / sizeof(struct chime_node))
		goto bad;
	hw = w.high_water < cap ? w.high_water : cap;
	for (i = 0; i < hw && r == 0; i += LIST_BATCH) {
		uint64_t n = hw - i < LIST_BATCH ? hw - i : LIST_BATCH;

		r = sr_copy(&m, batch, wheel_off + slab_off + i * sizeof(batch[0]), n * sizeof(batch[0]));
		for (uint64_t j = 0; j < n && r == 0; j++) {
			struct listed t;

			if (!node_listed(&batch[j], k, i + j, slots, now, &t))
				continue;
			(*total)++;
			if (limit && *shown >= limit)
				continue;
			(*shown)++;
			show_timer(&t, now, arr);
		}
	}
	if (r < 0)
		goto bad;
	chime_seg_unmap(&m);
	return SR_EXIT_OK;
bad:
	chime_seg_unmap(&m);
	return fail(SR_EXIT_NOSHM, "cannot read '%s': %s", path,
		    r == -ENODATA ? SR_SHRANK_WHY : "wheel geometry does not fit the segment");
}

/* Is client table entry c the one w names? A session being reclaimed (DYING) is gone already. */
static bool is_whose(const struct sr_client *c, struct whose w)
{
	if (!w.session)
		return c->id.pid == w.pid;
	return c->id.state != CHIME_CLIENT_DYING && c->id.state != CHIME_CLIENT_EMPTY &&
	       strncmp(c->id.session, w.session, sizeof(c->id.session)) == 0;
}

static int cmd_timers(const char *sock, struct whose w, uint64_t limit)
{
	static uint8_t slots[UINT16_MAX + 1];   /* the slots listed: chime_node.owner is 16 bits */
	uint64_t shown = 0, total = 0;
	struct sr_snap sn;
	const char *why;
	struct sr s;
	json_t *arr;
	uint32_t i, k;
	int r, found = 0;
	bool down;

	if (!can_read(sock))
		return timers_by_query(sock, w, limit);
	r = open_snapshot(&s, &sn, sock);
	if (r)
		return r;
	/* A dead broker's segments keep their last state: list it, but say so and exit 3, as `clients`. */
	down = broker_down(&sn, &why);
	jset("running", json_boolean(!down));
	arr = json_array();
	/*
	 * Every slot of the pid (a process may hold many connections), then one
	 * walk of each slab: a walk per slot cost a process of 200 connections
	 * 2.5 s beside 2M timers, and grows with the broker's timers.
	 */
	for (i = 0; i < sn.nr_clients; i++)
		if (is_whose(&sn.clients[i], w))
			found = slots[sn.clients[i].slot] = 1;
	if (found)      /* no table at all for a pid that is not there: only the error */
		out("%18s %20s %16s %12s %6s %5s %5s\n", "ID", "KEY", "DEADLINE", "PERIOD", "STATE", "SHARD", "CLOCK");
	for (k = 0; found && k < sn.hdr.nr_shards && !r; k++)
		r = list_shard(sock, k, slots, sr_now(&sn), limit, &shown, &total, arr);
	if (!found && down && w.session)
		r = fail(SR_EXIT_NOT_RUNNING, "%s; its last state has no session '%s'", why, w.session);
	else if (!found && down)
		r = fail(SR_EXIT_NOT_RUNNING, "%s; its last state has no client with pid %ld", why, w.pid);
	else if (!found && w.session)
		r = fail(SR_EXIT_NOSHM, "no session '%s' at '%s'", w.session, sock);
	else if (!found)
		r = fail(SR_EXIT_NOSHM, "no client with pid %ld is connected to '%s'", w.pid, sock);
	else if (!r && total > shown)
		out("(%" PRIu64 " of %" PRIu64 " timers shown; --limit 0 shows all)\n", shown, total);
	else if (!r && !total)
		out("(no timers)\n");      /* as clients, sessions and users say theirs: not a header alone */
	/* Not running comes first: a dead broker's shard files may be gone or half written. */
	if (found && down)
		r = fail(SR_EXIT_NOT_RUNNING, "%s; %s", why, r ? "its timers cannot be listed" :
			 "the list is its last state");
	jset("timers", arr);
	jset("shown", json_integer((json_int_t)shown));
	jset("total", json_integer((json_int_t)total));
	sr_snap_free(&sn);
	sr_close(&s);
	return r;
}

/*
 * Ask the broker to reset its statistics (CHIME_HELLO_RESET_STATS), then,
 * reading the control segment, wait until every shard has applied it (each
 * does before it next publishes: within a millisecond when awake, at once
 * when asleep, since the broker rings it).
 */
static int cmd_reset_stats(const char *sock)
{
	struct chime_query_head head;
	struct sr_snap sn;
	uint64_t t0, gen;
	enum query_step step;
	struct sr s;
	int r = query_broker(sock, CHIME_HELLO_RESET_STATS, 0, NULL, 0, &head, NULL, 0, &step);

	if (step == QUERY_ANSWER && (r == -EPERM || r == -EACCES))
		return fail(SR_EXIT_DENIED, "the broker at '%s' refused reset-stats: %s (only root and the broker's "
			    "user may reset its statistics)", sock, strerror(-r));
	/*
	 * Root and the broker's user are always admitted, and reach its socket
	 * (root past any permission, the broker's user as its creator): a user
	 * who is not, or may not connect, may not reset either. As shutdown
	 * and restart refuse a user who may not read the control segment.
	 */
	if (step == QUERY_HELLO && r == -EACCES)
		return fail(SR_EXIT_DENIED, "the broker at '%s' did not admit this user (and only root and the "
			    "broker's user may reset its statistics)", sock);
	if (step == QUERY_CONNECT && r == -EACCES)
		return fail(SR_EXIT_DENIED, "cannot connect to '%s': %s (this user may not reach the socket, and "
			    "only root and the broker's user may reset its statistics)", sock, strerror(-r));
	if (r < 0)
		return query_error(sock, "asking for reset-stats", r, step, NULL);
	gen = head.total;
	jset("generation", json_integer((json_int_t)gen));
	r = sr_open(&s, sock);
	if (r < 0)
		return sr_fail(&s, r);
	for (t0 = now_ns();;) {
		r = take_snapshot(&s, &sn);
		if (r)
			return r;
		if (!sn.reset_pending && sn.hdr.stats_reset_gen >= gen)
			break;
		sr_snap_free(&sn);
		if (now_ns() - t0 > RESET_WAIT_NS) {
			sr_close(&s);
			jset("applied", json_false());
			return fail(SR_EXIT_NOSHM, "chimed did not apply the reset in every shard within 5 s");
		}
		nanosleep(&(struct timespec){ 0, 2 * 1000 * 1000 }, NULL);
	}
	jset("applied", json_true());
	jset("stats_reset_realtime_ns", json_integer((json_int_t)sn.hdr.stats_reset_realtime_ns));
	out("chimed statistics reset (generation %" PRIu64 "): lateness histograms, their max and the sq/cq "
	    "high-water marks start again; counters (*_total) and the last-10 s window are kept\n", gen);
	sr_snap_free(&sn);
	sr_close(&s);
	return SR_EXIT_OK;
}

/* 1 if /proc/PID is gone or a zombie (exited, not yet reaped by its parent). */
static int pid_gone(pid_t pid)
{
	char st = sr_pid_state(pid);

	return st == 0 || st == 'Z' || st == 'X';
}

/* The effective uid of process pid (/proc/PID/status), or -1. */
static long pid_euid(pid_t pid)
{
	char path[64], line[256];
	unsigned ruid, euid;
	long r = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (r < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, "Uid: %u %u", &ruid, &euid) == 2)
			r = euid;
	fclose(f);
	return r;
}

/*
 * Send sig to the broker at sock, after checking that the pid its control
 * segment names is chimed (never a process that merely reused the pid) and
 * runs as the segment's owner: the segment's writer is whoever owns the
 * socket's directory, and could name another user's chimed (root's, whose
 * operator runs this) for us to stop. Sets *pid and *start_ns (that
 * broker's start). SR_EXIT_OK or the failure.
 */
static int signal_broker(const char *sock, int sig, pid_t *pid, uint64_t *start_ns)
{
	char path[64], comm[32] = "";
	struct sr_snap sn;
	uid_t owner;
	long euid;
	struct sr s;
	FILE *f;
	int r;

	/* Root and the broker's user can always read the control segment: anyone else may not signal it. */
	r = sr_open(&s, sock);
	if (r == -EACCES || r == -EPERM)
		return fail(SR_EXIT_DENIED, "cannot read '%s': %s (only root and the broker's user may stop or "
			    "restart it)", s.ctl_path, strerror(-r));
	if (r < 0)
		return sr_fail(&s, r);
	r = take_snapshot(&s, &sn);
	if (r)
		return r;
	*pid = sn.hdr.pid;
	*start_ns = sn.hdr.start_ns;
	owner = s.uid;
	r = sr_liveness(&sn, NULL);
	sr_snap_free(&sn);
	sr_close(&s);
	jset("pid", json_integer(*pid));
	if (r == SR_DEAD || r == SR_STOPPED || *pid <= 0)
		return fail(SR_EXIT_NOT_RUNNING, "chimed (pid %d) is not running", (int)*pid);
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)*pid);
	f = fopen(path, "re");
	if (!f || !fgets(comm, sizeof(comm), f)) {
		r = errno;
		if (f)
			fclose(f);
		return fail(SR_EXIT_NOSHM, "cannot read '%s': %s", path, strerror(r));
	}
	fclose(f);
	comm[strcspn(comm, "\n")] = '\0';
	chime_printable(comm, sizeof(comm));    /* any process's name, quoted below */
	if (strcmp(comm, "chimed") != 0)
		return fail(SR_EXIT_NOSHM, "pid %d is '%s', not chimed; not signalling it", (int)*pid, comm);
	euid = pid_euid(*pid);
	if (euid != (long)owner)
		return fail(SR_EXIT_NOSHM, "pid %d runs as uid %ld, but '%s' is uid %u's: not the broker that wrote "
			    "it; not signalling it", (int)*pid, euid, s.ctl_path, (unsigned)owner);
	if (kill(*pid, sig) < 0)
		return fail(errno == EPERM ? SR_EXIT_DENIED : SR_EXIT_NOSHM, "kill(%d, %s) failed: %s%s",
			    (int)*pid, sigabbrev_np(sig), strerror(errno),
			    errno == EPERM ? " (run as the broker's user or root)" : "");
	return SR_EXIT_OK;
}

static void pause_20ms(void)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
}

static int cmd_shutdown(const char *sock)
{
	uint64_t t0, start;
	pid_t pid;
	int r = signal_broker(sock, SIGTERM, &pid, &start);

	if (r)
		return r;
	t0 = now_ns();
	while (!pid_gone(pid)) {
		if (now_ns() - t0 > SHUTDOWN_WAIT_NS) {
			jset("stopped", json_false());
			return fail(SR_EXIT_NOSHM, "chimed (pid %d) did not exit within %u s of SIGTERM", (int)pid,
				    SHUTDOWN_WAIT_S);
		}
		pause_20ms();
	}
	jset("stopped", json_true());
	out("chimed (pid %d) stopped\n", (int)pid);
	return SR_EXIT_OK;
}

/* How many named sessions the broker has (all of them: root and the broker's user ask); -1 if it did not say. */
static int64_t sessions_total(const char *sock)
{
	struct chime_query_head head;

	if (query_broker(sock, CHIME_HELLO_QUERY_SESSIONS, 0, NULL, 0, &head, NULL, 0, NULL) < 0)
		return -1;
	return (int64_t)head.total;
}

/*
 * Is the broker that answers on sock running on, not stopping (after a
 * restart's signal: it refused it)? The control segment cannot say: its
 * state stays RUNNING through the stop's park (CHIME_BROKER_STOPPING is the
 * public segment's), which lasts up to 5 s, with the heartbeat going on.
 * A ping can: a stopping broker answers it -ECONNREFUSED. 1: running on;
 * 0: stopping; -1: no answer that says (none yet, a broker before pings).
 */
static int broker_runs_on(const char *sock)
{
	struct chime_query_head head;
	enum query_step step = QUERY_CONNECT;
	int r = query_broker_by(sock, CHIME_HELLO_PING, 0, NULL, 0, &head, NULL, 0, &step,
				now_ns() + UINT64_C(1000000000));

	if (step == QUERY_ANSWER && (r == 0 || r == -EUSERS))
		return 1;
	return step == QUERY_ANSWER && r == -ECONNREFUSED ? 0 : -1;
}

/*
 * SIGUSR2: the broker parks its sessions, stops and executes itself again;
 * the new one takes the sessions over. Done when a broker started after the
 * signal runs and beats; then the sessions it has are counted against those
 * there were, since a broker that could not keep its state files (removed,
 * and no room to write them again) says so only in its log.
 */
static int cmd_restart(const char *sock)
{
	uint64_t t0, start, gone_ns;
	int64_t before = sessions_total(sock), after;
	bool stopping = false;
	pid_t pid;
	int r = signal_broker(sock, SIGUSR2, &pid, &start);

	if (r)
		return r;
	for (t0 = now_ns(), gone_ns = 0;; pause_20ms()) {
		struct sr_snap sn;
		struct sr s;

		/*
		 * It re-executes itself in place (same pid): gone, with no
		 * broker holding the lock file for a while, it stopped (its
		 * execv() failed, or the new one could not start) and nothing
		 * starts another (a service manager would within RestartSec).
		 */
		if (pid_gone(pid) && !sr_broker_alive(sock)) {
			if (!gone_ns)
				gone_ns = now_ns();
			else if (now_ns() - gone_ns > RESTART_GONE_NS) {
				jset("restarted", json_false());
				jset("sessions_before", before >= 0 ? json_integer(before) : json_null());
				jset("sessions_after", json_null());
				return fail(SR_EXIT_NOSHM, "chimed (pid %d) exited on SIGUSR2 and no new chimed started "
					    "at '%s' (see its log: it says why)", (int)pid, sock);
			}
		} else {
			gone_ns = 0;
		}
		if (now_ns() - t0 > RESTART_WAIT_NS) {
			jset("restarted", json_false());
			jset("sessions_before", before >= 0 ? json_integer(before) : json_null());
			jset("sessions_after", json_null());
			return fail(SR_EXIT_NOSHM, "no new chimed runs at '%s' within 10 s of SIGUSR2 to pid %d "
				    "(see its log)", sock, (int)pid);
		}
		if (sr_open(&s, sock) < 0)
			continue;
		r = sr_snapshot(&s, &sn);
		sr_close(&s);
		if (r < 0)
			continue;
		/*
		 * The same broker, running and not stopping, well after the
		 * signal: it refused the restart (its log says why: a policy
		 * the new broker would not start with) and keeps its sessions.
		 * Not stopping is its ping's answer: the control segment says
		 * RUNNING through a park that may outlast the 3 s (a stop never
		 * turns back, so once seen stopping it is not asked again).
		 */
		if (!stopping && sn.hdr.start_ns == start && sn.hdr.state == CHIME_BROKER_RUNNING &&
		    sr_liveness(&sn, NULL) == SR_RUNNING && now_ns() - t0 > RESTART_REFUSED_NS) {
			int on = broker_runs_on(sock);

			stopping = on == 0;     /* it stops: it restarts (or exits, said above) */
			if (on == 1) {
				sr_snap_free(&sn);
				jset("restarted", json_false());
				jset("sessions_before", before >= 0 ? json_integer(before) : json_null());
				jset("sessions_after", before >= 0 ? json_integer(before) : json_null());
				return fail(SR_EXIT_NOSHM, "chimed (pid %d) did not restart: it runs on with its "
					    "sessions (see its log: it refuses a restart whose new broker would not "
					    "start, such as one with a policy that no longer loads)", (int)pid);
			}
		}
		r = sn.hdr.start_ns != start && sr_liveness(&sn, NULL) == SR_RUNNING;
		if (r) {
			jset("restarted", json_true());
			jset("new_pid", json_integer(sn.hdr.pid));
			pid_t new_pid = (pid_t)sn.hdr.pid;
			uint32_t shards_lost = sn.hdr.shards_lost, unadmitted = sn.hdr.sessions_unadmitted;

			sr_snap_free(&sn);
			after = before >= 0 ? sessions_total(sock) : -1;
			jset("sessions_before", before >= 0 ? json_integer(before) : json_null());
			jset("sessions_after", after >= 0 ? json_integer(after) : json_null());
			jset("shards_lost", json_integer(shards_lost));
			jset("sessions_unadmitted", json_integer(unadmitted));
			if (shards_lost)
				return fail(SR_EXIT_NOSHM, "chimed restarted (pid %d, was %d), but the files of %u of its "
					    "shards were missing: the sessions' timers there are lost (see its log)",
					    (int)new_pid, (int)pid, shards_lost);
			if (before >= 0 && after >= 0 && after < before)
				return fail(SR_EXIT_NOSHM, "chimed restarted (pid %d, was %d), but with %lld of the "
					    "%lld sessions there were: see its log (the timers of sessions whose "
					    "state files it could not keep are lost; a session that ended "
					    "meanwhile counts too)", (int)new_pid, (int)pid, (long long)after,
					    (long long)before);
			/* A broker re-executes itself in place; one its service manager started anew has a new pid. */
			if (new_pid == pid)
				out("chimed restarted in place (pid %d)", (int)pid);
			else
				out("chimed restarted (pid %d, was %d)", (int)new_pid, (int)pid);
			if (after == 0)
				out("; it had no session to hand over");
			else if (after > 0)
				out("; its %lld session%s handed over", (long long)after, after == 1 ? " was" : "s were");
			if (unadmitted)
				out(" (%u of them no process can attach to under its policy: see its log)", unadmitted);
			out("\n");
			return SR_EXIT_OK;
		}
		sr_snap_free(&sn);
	}
}

/* "N/MAX", or "N/-" with no limit (0 or UINT64_MAX). */
static const char *of_limit(char *buf, size_t len, uint64_t n, uint64_t max)
{
	if (!max || max == UINT64_MAX)
		snprintf(buf, len, "%" PRIu64 "/-", n);
	else
		snprintf(buf, len, "%" PRIu64 "/%" PRIu64, n, max);
	return buf;
}

static json_t *jlimit(uint64_t max)
{
	return !max || max == UINT64_MAX ? json_null() : json_integer((json_int_t)max);
}

/*
 * Each user's use of its per-user limits, as the broker counts them
 * (CHIME_HELLO_QUERY_USERS): root and the broker's user see every user,
 * others the one they count as. A broker before it answers -EINVAL.
 */
static int cmd_users(const char *sock)
{
	struct chime_query_user *recs = calloc(CHIME_QUERY_MAX, sizeof(*recs));
	struct chime_query_head head;
	enum query_step step;
	json_t *arr;
	int r;

	if (!recs)
		return fail(SR_EXIT_NOSHM, "out of memory");
	r = query_broker(sock, CHIME_HELLO_QUERY_USERS, 0, NULL, CHIME_QUERY_MAX, &head, recs, sizeof(*recs),
			 &step);
	if (r == -EINVAL && step == QUERY_ANSWER) {
		free(recs);
		return fail(SR_EXIT_NOSHM, "the broker at '%s' is older than 'chimectl users' and cannot list "
			    "its users' use of the limits ('chimectl clients' and 'sessions' still can)", sock);
	}
	if (r < 0 && !partial(r, &head)) {
		free(recs);
		return query_error(sock, "asking for the users", r, step, NULL);
	}
	arr = json_array();
	out("%10s %11s %8s %8s %22s %22s\n", "UID", "CLIENTS", "SESSIONS", "DETACHED", "ARMED",
	    "FULLEST SHARD");
	for (uint64_t i = 0; i < head.count; i++) {
		const struct chime_query_user *u = &recs[i];
		char cl[24], tm[48], sh[48];
		json_t *rec;

		out("%10u %11s %8u %8u %22s %22s", u->uid, of_limit(cl, sizeof(cl), u->clients, u->max_clients),
		    u->sessions, u->detached, of_limit(tm, sizeof(tm), u->armed, u->max_timers),
		    of_limit(sh, sizeof(sh), u->owned_fullest, u->max_timers_shard));
		if (u->held || u->reclaiming)
			out("  (%u held, %u reclaiming)", u->held, u->reclaiming);
		if (u->flags & CHIME_QUERY_USER_KEPT_OUT)
			out("  (kept out: the table's %u free slot%s kept for users holding none)", u->table_free,
			    u->table_free == 1 ? " is" : "s are");
		out("\n");
		rec = json_pack("{s:I,s:I,s:o,s:I,s:I,s:I,s:I,s:I,s:o,s:I,s:I,s:I,s:o,s:I}",
						     "uid", (json_int_t)u->uid, "clients", (json_int_t)u->clients,
						     "max_clients_per_uid", jlimit(u->max_clients),
						     "held", (json_int_t)u->held, "reclaiming", (json_int_t)u->reclaiming,
						     "sessions", (json_int_t)u->sessions,
						     "detached", (json_int_t)u->detached,
						     "armed", (json_int_t)u->armed,
						     "max_timers_per_uid", jlimit(u->max_timers),
						     "armed_fullest_shard", (json_int_t)u->armed_fullest,
						     "counted", (json_int_t)u->owned,
						     "counted_fullest_shard", (json_int_t)u->owned_fullest,
						     "max_timers_per_shard", jlimit(u->max_timers_shard),
						     "shards", (json_int_t)u->nr_shards);
		/* zeros from a broker before them, or a table too small to keep slots: no table counts */
		json_object_set_new(rec, "kept_out", json_boolean(u->flags & CHIME_QUERY_USER_KEPT_OUT));
		json_object_set_new(rec, "table_free", u->table_kept ? json_integer((json_int_t)u->table_free)
								      : json_null());
		json_object_set_new(rec, "table_kept", u->table_kept ? json_integer((json_int_t)u->table_kept)
								      : json_null());
		json_array_append_new(arr, rec);
	}
	free(recs);
	if (head.count == 0 && head.total == 0)
		out("(no users)\n");
	shown_of(head.count, head.total, "users");
	jset("shown", json_integer((json_int_t)head.count));
	jset("total", json_integer((json_int_t)head.total));
	jset("users", arr);
	return SR_EXIT_OK;      /* an answer cut short: shown_of() said how much of it came */
}

/* A reload's rule counts, [0] before and [1] after, for the JSON document. */
static json_t *reload_rules(const struct chime_query_reload *rec, int when)
{
	return json_pack("{s:I,s:I,s:I,s:I,s:b}", "uids", (json_int_t)rec->uids[when], "gids",
			 (json_int_t)rec->gids[when], "session_rules", (json_int_t)rec->session_rules[when],
			 "subuid_ranges", (json_int_t)rec->subuid_ranges[when], "allow_all", rec->allow_all[when]);
}

/* "uids 1 -> 3, session rules 0 -> 2": the counts that moved, or "" if none did. */
static void reload_changes(const struct chime_query_reload *rec, char *buf, size_t len)
{
	const struct { const char *what; const uint32_t *n; } c[] = {
		{ "uids", rec->uids }, { "gids", rec->gids }, { "session rules", rec->session_rules },
		{ "subordinate-uid ranges", rec->subuid_ranges },
	};
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]) && o < len; i++)
		if (c[i].n[0] != c[i].n[1])
			o += (size_t)snprintf(buf + o, len - o, "%s%s %u -> %u", o ? ", " : "", c[i].what,
					      c[i].n[0], c[i].n[1]);
	if (rec->allow_all[0] != rec->allow_all[1] && o < len)
		snprintf(buf + o, len - o, "%sany local user %s", o ? ", " : "",
			 rec->allow_all[1] ? "now admitted" : "no longer admitted");
}

/*
 * Ask the broker to re-read its policy (CHIME_HELLO_RELOAD) and say how it
 * went: the broker answers once that reload has finished, so the outcome
 * is this request's, whoever else reloads meanwhile. A broker before the
 * request answers -EINVAL: it is sent SIGHUP instead, and the outcome is
 * unknown (its log has it).
 */
static int cmd_reload(const char *sock)
{
	struct chime_query_reload rec;
	struct chime_query_head head;
	enum query_step step;
	char changes[256];
	uint64_t start;
	pid_t pid;
	int r = query_broker(sock, CHIME_HELLO_RELOAD, 0, NULL, 1, &head, &rec, sizeof(rec), &step);

	if (step == QUERY_ANSWER && (r == -EPERM || r == -EACCES))
		return fail(SR_EXIT_DENIED, "the broker at '%s' refused reload: %s (only root and the broker's "
			    "user may reload its policy)", sock, strerror(-r));
	/* As reset-stats: root and the broker's user are always admitted and reach the socket. */
	if (step == QUERY_HELLO && r == -EACCES)
		return fail(SR_EXIT_DENIED, "the broker at '%s' did not admit this user (and only root and the "
			    "broker's user may reload its policy)", sock);
	if (step == QUERY_CONNECT && r == -EACCES)
		return fail(SR_EXIT_DENIED, "cannot connect to '%s': %s (this user may not reach the socket, and "
			    "only root and the broker's user may reload its policy)", sock, strerror(-r));
	if (step == QUERY_ANSWER && r == -EINVAL) {
		jset("supported", json_false());
		jset("reloaded", json_null());
		r = signal_broker(sock, SIGHUP, &pid, &start);
		if (r)
			return r;
		return fail(SR_EXIT_NOSHM, "the broker at '%s' (pid %d) is older than 'chimectl reload' and cannot "
			    "say how a reload went: sent it SIGHUP instead; whether it re-read its policy is in its "
			    "log", sock, (int)pid);
	}
	if (r < 0)
		return query_error(sock, "asking for a reload", r, step, NULL);
	if (head.count < 1)
		return fail(SR_EXIT_NOSHM, "the broker at '%s' answered reload without its outcome", sock);
	rec.message[sizeof(rec.message) - 1] = '\0';
	chime_printable(rec.message, sizeof(rec.message));     /* a path, or a line of the file, quoted */
	reload_changes(&rec, changes, sizeof(changes));
	jset("supported", json_true());
	jset("reloaded", json_boolean(rec.error == 0));
	jset("policy_file", json_boolean(rec.has_file));
	jset("rules_before", reload_rules(&rec, 0));
	jset("rules_after", reload_rules(&rec, 1));
	jset("sessions_unadmitted", json_integer(rec.sessions_unadmitted));
	if (rec.error) {
		jset("errno", json_integer(-rec.error));
		return fail(SR_EXIT_NOSHM, "chimed did not reload its policy, and keeps the one it had: %s",
			    rec.message);
	}
	jset("admitting", jtext(rec.message, sizeof(rec.message)));
	/* Admitted now, but kept out by the socket's old mode: the reload did not do what was asked. */
	if (rec.socket_error < 0) {
		jset("socket_error", json_string(strerror(-rec.socket_error)));
		return fail(SR_EXIT_NOSHM, "chimed reloaded its policy (admitting %s), but could not set its socket's "
			    "group or mode to follow it: %s (see its log): users it admits now may not reach the "
			    "socket", rec.message, strerror(-rec.socket_error));
	}
	out("chimed reloaded its policy%s: admitting %s\n", rec.has_file ? " and --policy-file" :
	    " (no --policy-file: the command line's names resolved again)", rec.message);
	if (changes[0])
		out("changed: %s\n", changes);
	else
		out("as many rules of each kind as before (a rule itself may have changed)\n");
	if (rec.sessions_unadmitted)
		out("%u detached session%s no process can attach to under it (see its log)\n",
		    rec.sessions_unadmitted, rec.sessions_unadmitted == 1 ? "" : "s");
	return SR_EXIT_OK;
}

/*
 * Every named session, a page of CHIME_QUERY_MAX at a time, each from the
 * slot after the last page's last one (hello.pid): the sessions in *recs
 * (malloc'd), their number in head->count, all of them in head->total. A
 * broker before pages answers from slot 0 again: its first page is then
 * all there is. Sessions that come or go meanwhile may be missed or not.
 * A session holds a client slot, and each page's slots rise, from the
 * one asked for, below CHIME_CLIENTS_MAX: a record that breaks that ends
 * the listing (a broker, any user's, answering made-up pages took memory
 * without end), and so does SESSIONS_LIST_NS (pages that come slowly).
 */
#define SESSIONS_LIST_NS (3 * QUERY_ANSWER_NS)
static int sessions_query(const char *sock, struct chime_query_session **recs, struct chime_query_head *head,
			  enum query_step *step)
{
	struct chime_query_session *all = NULL, *more;
	struct chime_query_head page;
	uint64_t n = 0, give_up = now_ns() + SESSIONS_LIST_NS;
	int r;

	memset(head, 0, sizeof(*head));
	for (;;) {
		int32_t from = n ? (int32_t)all[n - 1].slot + 1 : 0;

		more = realloc(all, (size_t)(n + CHIME_QUERY_MAX) * sizeof(*all));
		if (!more) {
			r = -ENOMEM;
			break;
		}
		all = more;
		uint64_t ok = 0;

		r = query_broker_by(sock, CHIME_HELLO_QUERY_SESSIONS, from, NULL, CHIME_QUERY_MAX, &page, all + n,
				    sizeof(*all), step, give_up);
		if (r < 0 && !partial(r, &page))
			break;
		if (page.count && (int64_t)all[n].slot < from)
			break;          /* a broker before pages: from slot 0 again */
		/* rising slots from `from`, below the bound: what breaks that, and all after it, is made up */
		while (ok < page.count && all[n + ok].slot < CHIME_CLIENTS_MAX &&
		       (ok ? all[n + ok].slot > all[n + ok - 1].slot : (int64_t)all[n].slot >= from))
			ok++;
		n += ok;
		*head = page;
		head->count = n;
		if (r < 0 || ok < page.count || !ok || n >= page.total || all[n - 1].slot + 1 >= CHIME_CLIENTS_MAX ||
		    now_ns() >= give_up)
			break;
	}
	*recs = all;
	/* A page after the first that failed leaves those before it: "N of M shown". */
	if (n && r < 0 && !partial(r, head))
		r = 0;
	return r;
}

/* Named sessions, by query (root and the broker's user see all, others their own). */
static int cmd_sessions(const char *sock)
{
	struct chime_query_session *recs;
	struct chime_query_head head;
	enum query_step step;
	json_t *arr;
	int r = sessions_query(sock, &recs, &head, &step);

	if (r < 0 && !partial(r, &head)) {
		free(recs);
		return query_error(sock, "asking for the sessions", r, step, NULL);
	}
	arr = json_array();
	out("%-24s %6s %-8s %7s %8s %8s %10s\n", "SESSION", "UID", "STATE", "PID", "TIMERS", "HELD", "LINGER");
	for (uint64_t i = 0; i < head.count; i++) {
		const struct chime_query_session *e = &recs[i];
		const char *state = e->state == CHIME_SESSION_ATTACHED ? "attached" : "detached";
		char name[CHIME_SESSION_MAX + 1], left[32], pid[16];

		memcpy(name, e->name, CHIME_SESSION_MAX);
		name[CHIME_SESSION_MAX] = '\0';
		chime_printable(name, sizeof(name));
		if (e->state == CHIME_SESSION_ATTACHED)
			snprintf(left, sizeof(left), "-");
		else
			sr_fmt_dur(left, sizeof(left), e->linger_left_ns);
		/* 0: detached since a broker took it over from an earlier one, which knew the pid */
		if (e->pid > 0)
			snprintf(pid, sizeof(pid), "%d", (int)e->pid);
		else
			snprintf(pid, sizeof(pid), "-");
		out("%-24s %6u %-8s %7s %8" PRIu64 " %8" PRIu64 " %10s\n", name, e->uid, state, pid,
		    e->timers, e->held, left);
		json_array_append_new(arr, json_pack("{s:o,s:i,s:s,s:o,s:i,s:I,s:I,s:o}",
						     "name", jtext(name, sizeof(name)), "uid", (int)e->uid,
						     "state", state, "pid", e->pid > 0 ? json_integer(e->pid) : json_null(),
						     "slot", (int)e->slot,
						     "timers", (json_int_t)e->timers, "held", (json_int_t)e->held,
						     "linger_left_ns", e->state == CHIME_SESSION_ATTACHED ? json_null() :
						     json_integer((json_int_t)e->linger_left_ns)));
	}
	free(recs);
	if (head.count == 0 && head.total == 0)
		out("(no sessions)\n");
	shown_of(head.count, head.total, "sessions");
	jset("shown", json_integer((json_int_t)head.count));
	jset("total", json_integer((json_int_t)head.total));
	jset("sessions", arr);
	return SR_EXIT_OK;
}

/* What drop-session's failure means, by the step it failed at. */
static const char *drop_why(int r, enum query_step step)
{
	if (step == QUERY_HELLO && r == -EINVAL)
		return " (not a session name: 1 to 63 bytes of A-Z, a-z, 0-9, '.', '_', '-')";
	if (step == QUERY_HELLO && r == -EACCES)
		return " (the broker did not admit this user, so it does not say whether that session exists: "
		       "see chimed --allow-uid, --allow-gid, --allow-all)";
	if (step == QUERY_ANSWER && r == -ESRCH)
		return " (no such session)";
	if (step == QUERY_ANSWER && r == -EBUSY)
		return " (a live process has it attached: only a detached session, or one whose process has "
		       "exited, is dropped)";
	return NULL;
}

static int cmd_drop_session(const char *sock, const char *name)
{
	enum query_step step;
	char what[CHIME_SESSION_MAX + 64];
	int r = query_drop_session(sock, name, &step);

	jset("session", jtext(name, strlen(name) + 1));
	if (step == QUERY_ANSWER && (r == -EACCES || r == -EPERM))
		return fail(SR_EXIT_DENIED, "the broker at '%s' refused to drop session '%s': it belongs to "
			    "another user (root and the broker's user may drop any)", sock, name);
	snprintf(what, sizeof(what), "dropping session '%.*s'", CHIME_SESSION_MAX, name);
	if (r < 0)
		return query_error(sock, what, r, step, drop_why(r, step));
	jset("dropped", json_true());
	out("session '%s' dropped: its timers are being reclaimed\n", name);
	return SR_EXIT_OK;
}

static const char *const commands[] = { "status", "clients", "timers", "sessions", "drop-session",
					"users", "reset-stats", "reload", "shutdown",
					"restart" };

static int run(const char *cmd, const char *sock, long pid, uint64_t limit, const char *arg)
{
	if (!strcmp(cmd, "sessions"))
		return cmd_sessions(sock);
	if (!strcmp(cmd, "drop-session"))
		return cmd_drop_session(sock, arg);
	if (!strcmp(cmd, "status"))
		return cmd_status(sock);
	if (!strcmp(cmd, "clients"))
		return cmd_clients(sock);
	if (!strcmp(cmd, "timers"))
		return cmd_timers(sock, (struct whose){ .pid = pid, .session = arg }, limit);
	if (!strcmp(cmd, "reset-stats"))
		return cmd_reset_stats(sock);
	if (!strcmp(cmd, "restart"))
		return cmd_restart(sock);
	if (!strcmp(cmd, "reload"))
		return cmd_reload(sock);
	if (!strcmp(cmd, "users"))
		return cmd_users(sock);
	return cmd_shutdown(sock);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "client", required_argument, NULL, 'c' },
		{ "session", required_argument, NULL, 'S' },
		{ "limit", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	const char *socket_arg = NULL, *cmd, *arg = NULL, *session = NULL;
	long pid = -1;
	uint64_t limit = 100, v;
	char sock[PATH_MAX];
	int opt, r, json = 0, known = 0;
	bool have_limit = false;

	/* getopt's own messages start with argv[0]: the program's name, not the path it was run by. */
	argv[0] = (char *)PROG;
	/* Options may come before or after the command (GNU getopt permutes). */
	while ((opt = getopt_long(argc, argv, "s:c:S:n:jhV", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (chime_socket_opt(PROG, optarg) < 0)
				return SR_EXIT_USAGE;
			socket_arg = optarg;
			break;
		case 'c':
			if (chime_parse_u64(optarg, &v) < 0 || v == 0 || v > INT32_MAX) {
				fprintf(stderr, PROG ": invalid --client '%s' (a process id from 1 to %d)\n", optarg,
					INT32_MAX);
				return SR_EXIT_USAGE;
			}
			if (pid != -1) {
				/* one client a listing: the last one silently kept was a surprise (an audit) */
				fprintf(stderr, PROG ": --client given twice (one client a listing)\n");
				return SR_EXIT_USAGE;
			}
			pid = (long)v;
			break;
		case 'S':
			/* What the broker would refuse (EINVAL): say so here, as a usage error. */
			if (chime_session_len(optarg) <= 0) {
				fprintf(stderr, PROG ": invalid --session '%s' (1 to %u bytes of A-Z, a-z, 0-9, "
					"'.', '_', '-')\n", optarg, CHIME_SESSION_MAX - 1);
				return SR_EXIT_USAGE;
			}
			if (session) {
				fprintf(stderr, PROG ": --session given twice (one session a listing)\n");
				return SR_EXIT_USAGE;
			}
			session = optarg;
			break;
		case 'n':
			if (chime_parse_u64(optarg, &limit) < 0) {
				fprintf(stderr, PROG ": invalid --limit '%s' (a number from 0 to %llu; 0: all)\n",
					optarg, (unsigned long long)UINT64_MAX);
				return SR_EXIT_USAGE;
			}
			have_limit = true;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return sr_stdout_check(PROG);
		case 'V':
			printf(PROG " %s\n", CHIME_VERSION);
			return sr_stdout_check(PROG);
		default:
			fprintf(stderr, PROG ": try '" PROG " --help'\n");
			return SR_EXIT_USAGE;
		}
	}
	if (optind == argc) {
		fprintf(stderr, PROG ": missing command (try '" PROG " --help')\n");
		return SR_EXIT_USAGE;
	}
	cmd = argv[optind];
	/* First: "bogus extra" is an unknown command, not too many arguments. */
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		known |= !strcmp(cmd, commands[i]);
	if (!known) {
		fprintf(stderr, PROG ": unknown command '%s' (try '" PROG " --help')\n", cmd);
		return SR_EXIT_USAGE;
	}
	/* drop-session takes its NAME; every other command nothing. */
	if (optind != argc - 1 - !strcmp(cmd, "drop-session")) {
		fprintf(stderr, PROG ": %s (try '" PROG " --help')\n",
			optind > argc - 1 - !strcmp(cmd, "drop-session") ? "drop-session needs a NAME" :
			"too many arguments");
		return SR_EXIT_USAGE;
	}
	if (!strcmp(cmd, "drop-session")) {
		arg = argv[optind + 1];
		/* What the broker would refuse (EINVAL): say so here, as a usage error. */
		if (chime_session_len(arg) <= 0) {
			fprintf(stderr, PROG ": '%s' is not a session name (1 to %u bytes of A-Z, a-z, 0-9, "
				"'.', '_', '-')\n", arg, CHIME_SESSION_MAX - 1);
			return SR_EXIT_USAGE;
		}
	}
	if (strcmp(cmd, "timers") && (pid != -1 || session || have_limit)) {
		fprintf(stderr, PROG ": --client, --session and --limit go with 'timers' only\n");
		return SR_EXIT_USAGE;
	}
	if (!strcmp(cmd, "timers") && pid == -1 && !session) {
		fprintf(stderr, PROG ": 'timers' needs --client PID or --session NAME\n");
		return SR_EXIT_USAGE;
	}
	if (!strcmp(cmd, "timers") && pid != -1 && session) {
		fprintf(stderr, PROG ": 'timers' takes --client PID or --session NAME, not both\n");
		return SR_EXIT_USAGE;
	}
	if (!strcmp(cmd, "timers"))
		arg = session;
	/* A usage error, like any other on the command line: no JSON document (chimectl(1), -j). */
	r = sr_socket_path(sock, sizeof(sock), socket_arg);
	if (r == -ENAMETOOLONG) {
		fprintf(stderr, PROG ": the socket path of %s, '%.*s...', is too long (a unix socket's is at "
			"most %d bytes)\n", socket_arg ? "--socket" : "$CHIME_SOCKET", 40,
			chime_socket_path(socket_arg, NULL), SR_SOCKET_PATH_MAX);
		return SR_EXIT_USAGE;
	}
	if (json) {
		J = json_pack("{s:s,s:s}", "version", CHIME_VERSION, "command", cmd);
		if (!J) {
			fprintf(stderr, PROG ": out of memory\n");
			return SR_EXIT_NOSHM;
		}
	}
	if (r < 0)
		r = fail(SR_EXIT_NOSHM, "no socket path: %s (set $CHIME_SOCKET or use --socket)", strerror(-r));
	else
		r = run(cmd, sock, pid, limit, arg);
	if (J) {
		json_object_set_new(J, "socket", jtext(sock, sizeof(sock)));
		json_object_set_new(J, "ok", json_boolean(r == SR_EXIT_OK));
		json_object_set_new(J, "exit_status", json_integer(r));
		json_dumpf(J, stdout, JSON_COMPACT);
		fputc('\n', stdout);
		json_decref(J);
		J = NULL;       /* main() again (tests/fuzz/fuzz_stats.c) is text unless -j */
	}
	/* The text too: `chimectl clients > file` on a full disk is no success. */
	if (sr_stdout_check(PROG) && !r)
		r = SR_EXIT_NOSHM;
	return r;
}
