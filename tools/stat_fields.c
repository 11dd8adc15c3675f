/* SPDX-License-Identifier: MIT */
/* stat_fields.c - chimestat's one list of fields, built from a snapshot. See chimestat.h. */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chimestat.h"

/* ---- the field list ---- */

struct field *field_add(struct flist *l, enum fkind kind, const char *fmt, ...)
{
	struct field *f;
	va_list ap;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 256;
		struct field *v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			fprintf(stderr, PROG ": out of memory\n");
			exit(SR_EXIT_NOSHM);
		}
		l->v = v;
		l->cap = cap;
	}
	f = &l->v[l->n++];
	memset(f, 0, sizeof(*f));
	f->kind = kind;
	f->scale = 1;
	va_start(ap, fmt);
	vsnprintf(f->name, sizeof(f->name), fmt, ap);
	va_end(ap);
	return f;
}

void fprom(struct field *f, const char *fam, const char *type, const char *help,
		  const char *labels, double scale)
{
	f->prom = fam;
	f->ptype = type;
	f->help = help;
	snprintf(f->labels, sizeof(f->labels), "%s", labels ? labels : "");
	f->scale = scale;
}

/* Prometheus label values escape backslash, quote and newline. */
static void prom_escape(char *dst, size_t len, const char *src)
{
	size_t o = 0;

	for (; *src && o + 3 < len; src++) {
		unsigned char c = (unsigned char)*src;

		if (c == '\\' || c == '"') {
			dst[o++] = '\\';
			dst[o++] = (char)c;
		} else if (c == '\n') {
			dst[o++] = '\\';
			dst[o++] = 'n';
		} else if (c >= 0x20 && c != 0x7f) {
			dst[o++] = (char)c;     /* UTF-8 is what label values are (sr_snapshot() leaves no other) */
		} else {
			dst[o++] = '?';
		}
	}
	dst[o] = '\0';
}

struct cdef {
	const char *name;
	size_t off;
	enum fkind kind;
	const char *prom;
	const char *help;
	double scale;
};

#define SS(f) offsetof(struct chime_shard_stats, f)
static const struct cdef shard_defs[] = {
	{ "armed", SS(armed), F_GAUGE, "chime_shard_armed", "Timers the shard holds for clients now (armed or held).", 1 },
	{ "armed_realtime", SS(armed_realtime), F_GAUGE, "chime_shard_armed_realtime", "Of chime_shard_armed: wall-clock timers (chime_arm_realtime()).", 1 },
	{ "arms", SS(arms), F_COUNTER, "chime_shard_arms_total", "Timers armed.", 1 },
	{ "resets", SS(resets), F_COUNTER, "chime_shard_resets_total", "Timers reset to a new deadline.", 1 },
	{ "cancels", SS(cancels), F_COUNTER, "chime_shard_cancels_total", "Timers removed by cancel or cancel-by-key.", 1 },
	{ "cancel_keys", SS(cancel_keys), F_COUNTER, "chime_shard_cancel_keys_total", "Cancel-by-key requests.", 1 },
	{ "fires", SS(fires), F_COUNTER, "chime_shard_fires_total", "Expirations (each period of a periodic timer counts).", 1 },
	{ "delivered", SS(delivered), F_COUNTER, "chime_shard_delivered_total", "Events written into completion rings.", 1 },
	{ "malformed", SS(malformed), F_COUNTER, "chime_shard_malformed_total", "Submissions dropped as malformed.", 1 },
	{ "backlog", SS(backlog), F_GAUGE, "chime_shard_backlog", "Events held for clients that do not drain.", 1 },
	{ "sq_depth", SS(sq_depth), F_GAUGE, "chime_shard_sq_depth", "Records waiting in the shard's fullest submission ring (of chime_broker_sq_size).", 1 },
	{ "sq_depth_max", SS(sq_depth_max), F_GAUGE, "chime_shard_sq_depth_max", "High-water mark of sq_depth since start or the last reset-stats.", 1 },
	{ "sq_waiting", SS(sq_waiting), F_GAUGE, "chime_shard_sq_waiting", "Records waiting in all the shard's submission rings.", 1 },
	{ "loops", SS(loops), F_COUNTER, "chime_shard_loops_total", "Shard loop iterations.", 1 },
	{ "sleeps", SS(sleeps), F_COUNTER, "chime_shard_sleeps_total", "Times the shard went to sleep.", 1 },
	{ "wakeups", SS(wakeups), F_COUNTER, "chime_shard_client_wakeups_total", "Wake-up messages sent to clients.", 1 },
	{ "refused_nomem", SS(refused_nomem), F_COUNTER, "chime_shard_refused_nomem_total", "Arms this shard refused: no free timer node (ENOMEM). An arm is tried on each shard in turn: one call can count on several.", 1 },
	{ "refused_quota", SS(refused_quota), F_COUNTER, "chime_shard_refused_quota_total", "Arms this shard refused: the client, or its user, held its quota (EDQUOT). An arm is tried on each shard in turn: a failed call counts once per shard.", 1 },
	{ "reserve_failed", SS(reserve_failed), F_COUNTER, "chime_shard_reserve_failed_total", "Slab chunks the filesystem would not reserve.", 1 },
	{ "slab_bytes", SS(slab_bytes), F_GAUGE, "chime_shard_slab_bytes", "Storage the shard's timer slab holds on its filesystem now: grown 4 MiB at a time ahead of use, its free top given back (0 from a broker before it).", 1 },
	{ "slab_given_back", SS(slab_given_back), F_COUNTER, "chime_shard_slab_given_back_bytes_total", "Bytes of the slab's storage given back to its filesystem once the timers at its top were gone (0 from a broker before it).", 1 },
	{ "busy_ns", SS(busy_ns), F_COUNTER, "chime_shard_busy_seconds_total", "Time spent in loop iterations that had work.", 1e-9 },
	{ "spin_ns", SS(spin_ns), F_COUNTER, "chime_shard_spin_seconds_total", "Time spent spinning with no work (idle, or into a deadline); at most chimed --spin-share of the time plus 2 us per timer fired, not limited with --spin-us -1.", 1e-9 },
	{ "spin_capped", SS(spin_capped), F_COUNTER, "chime_shard_spin_capped_total", "Sleeps taken early because spinning had used its share (--spin-share).", 1 },
	{ "spin_busy", SS(spin_busy), F_COUNTER, "chime_shard_spin_busy_total", "Times spinning was turned off because a yield gave the CPU to another task for 1 ms or more (a busy host): the shard sleeps instead for 2-100 ms.", 1 },
	{ "slow_wakeups", SS(slow_wakeups), F_COUNTER, "chime_shard_slow_wakeups_total", "Wake-up sends that took 500 us or more of the shard's CPU time (the kernel woke as many epoll watches of the client's), each holding that client's user's wake-ups back 16 times as long (0 from a broker before it).", 1 },
	{ "cpu_ns", SS(cpu_ns), F_COUNTER, "chime_shard_cpu_seconds_total", "CPU time of the shard thread (CLOCK_THREAD_CPUTIME_ID), spinning included.", 1e-9 },
	{ "immediate", SS(immediate), F_COUNTER, "chime_shard_immediate_total", "Fires of timers armed already due (not in the lateness histogram).", 1 },
	{ "restored", SS(restored), F_COUNTER, "chime_shard_restored_total", "Timers of named sessions taken over from the previous broker at start.", 1 },
	{ "restore_dropped", SS(restore_dropped), F_COUNTER, "chime_shard_restore_dropped_total", "Damaged timer nodes freed at start.", 1 },
	{ "redelivered", SS(redelivered), F_COUNTER, "chime_shard_redelivered_total", "Events the previous broker delivered, held again because their claim could not be read.", 1 },
};

#define CS(f) offsetof(struct chime_client_stats, f)
static const struct cdef client_defs[] = {
	{ "armed", CS(armed), F_GAUGE, "chime_client_armed", "Timers of the client held now (armed or held).", 1 },
	{ "arms", CS(arms), F_COUNTER, "chime_client_arms_total", "Timers the client armed.", 1 },
	{ "resets", CS(resets), F_COUNTER, "chime_client_resets_total", "Timers the client reset.", 1 },
	{ "cancels", CS(cancels), F_COUNTER, "chime_client_cancels_total", "Timers of the client cancelled (by id or key).", 1 },
	{ "fires", CS(fires), F_COUNTER, "chime_client_fires_total", "Expirations of the client's timers.", 1 },
	{ "cq_depth", CS(cq_depth), F_GAUGE, "chime_client_cq_depth", "Events waiting in its completion rings.", 1 },
	{ "cq_depth_max", CS(cq_depth_max), F_GAUGE, NULL, NULL, 1 },
	{ "sq_depth", CS(sq_depth), F_GAUGE, NULL, NULL, 1 },
	{ "sq_depth_max", CS(sq_depth_max), F_GAUGE, NULL, NULL, 1 },
	{ "backlog", CS(backlog), F_GAUGE, "chime_client_backlog", "Events held back because it does not drain.", 1 },
	{ "wakeups", CS(wakeups), F_COUNTER, "chime_client_wakeups_total", "Wake-up messages sent to the client.", 1 },
	{ "refused_nomem", CS(refused_nomem), F_COUNTER, "chime_client_refused_nomem_total", "Its arms refused by a shard: no free timer node (ENOMEM); one per shard that refused an arm (libchime tries each).", 1 },
	{ "refused_quota", CS(refused_quota), F_COUNTER, "chime_client_refused_quota_total", "Its arms refused by a shard: at its quota (EDQUOT); one per shard that refused an arm (libchime tries each).", 1 },
	{ "refused_user_quota", CS(refused_user_quota), F_COUNTER, "chime_client_refused_user_quota_total", "Its arms refused because its user's clients together held --max-timers-per-uid (EDQUOT, also counted in refused_quota).", 1 },
	{ "malformed", CS(malformed), F_COUNTER, "chime_client_malformed_total", "Its records dropped by validation: an id it was never given, an unknown op (a bug in it, or a hostile client).", 1 },
	{ "slow_wakeups", CS(slow_wakeups), F_COUNTER, "chime_client_slow_wakeups_total", "Wake-up sends to the client that took 500 us or more of a shard's CPU time (its epoll watches on its socket), each holding its user's wake-ups back 16 times as long (0 from a broker before it).", 1 },
	{ "counted", CS(owned), F_GAUGE, "chime_client_counted", "Timer ids of the client the shards count against the quotas: armed or held, and handed ahead of its arms (0 from a broker before it).", 1 },
};

const struct stat_pct pcts[NR_PCTS] = { { "p50", 0.50 }, { "p90", 0.90 }, { "p99", 0.99 }, { "p99_9", 0.999 } };

/* What add_lateness() adds besides count, percentiles and max. */
#define LAT_SUM     1u      /* .sum_ns */
#define LAT_BUCKETS 2u      /* .buckets (the histogram itself) */
#define LAT_PROMMAX 4u      /* .max_ns is the Prometheus max gauge (since the last reset) */
#define LAT_RECENT  8u      /* the percentiles, max, sum and count are the Prometheus recent-window summary */

static const char *const pct_q[NR_PCTS] = { "0.5", "0.9", "0.99", "0.999" };

/*
 * <prefix>.count, [.sum_ns], .p50_ns .. .p99_9_ns, .max_ns, [.buckets]: the
 * counts are F_GAUGE (a histogram since a reset, or of a window, may go down).
 */
/* The last 10 s as a Prometheus summary: quantiles (1 is the max), _sum and _count. */
#define RECENT_FAM  "chime_shard_recent_lateness_seconds"
#define RECENT_HELP "Lateness (fired - deadline) over the last 10 seconds (quantile 1: the max; immediate timers excluded)."

static void add_lateness(struct flist *l, const char *prefix, const uint64_t *hist,
			 uint64_t sum_ns, uint64_t max_ns, const char *labels, unsigned what)
{
	struct field *f;
	char lab[112];
	size_t i;

	f = field_add(l, F_GAUGE, "%s.count", prefix);
	f->u = sr_hist_count(hist);
	if (what & LAT_RECENT) {
		fprom(f, RECENT_FAM, "summary", RECENT_HELP, labels, 1);
		f->suffix = "_count";
	}
	if (what & LAT_SUM) {
		f = field_add(l, F_GAUGE, "%s.sum_ns", prefix);
		f->u = sum_ns;
		if (what & LAT_RECENT) {
			fprom(f, RECENT_FAM, "summary", RECENT_HELP, labels, 1e-9);
			f->suffix = "_sum";
		}
	}
	for (i = 0; i < NR_PCTS; i++) {
		f = field_add(l, F_GAUGE, "%s.%s_ns", prefix, pcts[i].name);
		f->u = sr_percentile(hist, max_ns, pcts[i].p);
		/* labels are a shard's (short): a cut one would be a malformed series, left out */
		if ((what & LAT_RECENT) &&
		    snprintf(lab, sizeof(lab), "%s,quantile=\"%s\"", labels, pct_q[i]) < (int)sizeof(lab))
			fprom(f, RECENT_FAM, "summary", RECENT_HELP, lab, 1e-9);
	}
	f = field_add(l, F_GAUGE, "%s.max_ns", prefix);
	f->u = max_ns;
	if (what & LAT_PROMMAX)
		fprom(f, "chime_shard_lateness_max_seconds", "gauge",
		      "Largest lateness (fired - deadline) since start or the last reset-stats.", labels, 1e-9);
	if ((what & LAT_RECENT) && snprintf(lab, sizeof(lab), "%s,quantile=\"1\"", labels) < (int)sizeof(lab))
		fprom(f, RECENT_FAM, "summary", RECENT_HELP, lab, 1e-9);
	if (what & LAT_BUCKETS) {
		f = field_add(l, F_HIST, "%s.buckets", prefix);
		f->hist = hist;
		f->hist_sum_ns = sum_ns;
	}
}

/* Clients by (uid, comm), then slot: a group's clients side by side, its first (lowest slot) first. */
static int cmp_group(const void *a, const void *b, void *snap)
{
	const struct sr_snap *sn = snap;
	const struct sr_client *x = &sn->clients[*(const uint32_t *)a], *y = &sn->clients[*(const uint32_t *)b];
	int c = strncmp(x->id.comm, y->id.comm, sizeof(x->id.comm));

	if (x->id.uid != y->id.uid)
		return x->id.uid < y->id.uid ? -1 : 1;
	if (c)
		return c;
	return (*(const uint32_t *)a > *(const uint32_t *)b) - (*(const uint32_t *)a < *(const uint32_t *)b);
}

static bool same_group(const struct sr_client *a, const struct sr_client *b)
{
	return a->id.uid == b->id.uid && !strncmp(a->id.comm, b->id.comm, sizeof(a->id.comm));
}

/*
 * Prometheus series per (comm, uid), summed over that group's clients: labels
 * that survive a client's restart (a pid or slot label would start a new
 * series each time) and stay unique when one program runs several times.
 * Grouped by sorting: comparing every client with every other took O(n^2),
 * seconds at 16384 clients named apart.
 */
static void client_groups(struct flist *l, const struct sr_snap *sn)
{
	uint32_t *by = malloc((sn->nr_clients ? sn->nr_clients : 1) * sizeof(*by));

	if (!by) {
		fprintf(stderr, PROG ": out of memory\n");
		exit(SR_EXIT_NOSHM);
	}
	for (uint32_t c = 0; c < sn->nr_clients; c++)
		by[c] = c;
	qsort_r(by, sn->nr_clients, sizeof(*by), cmp_group, (void *)sn);
	for (uint32_t g = 0, end; g < sn->nr_clients; g = end) {
		const struct sr_client *cl = &sn->clients[by[g]];
		char esc[64], lab[112];
		uint64_t sum[sizeof(client_defs) / sizeof(client_defs[0])] = { 0 };

		for (end = g; end < sn->nr_clients && same_group(&sn->clients[by[end]], cl); end++)
			for (size_t i = 0; i < sizeof(client_defs) / sizeof(client_defs[0]); i++) {
				uint64_t v;

				memcpy(&v, (const char *)&sn->clients[by[end]].sum + client_defs[i].off, sizeof(v));
				sum[i] += v;
			}
		prom_escape(esc, sizeof(esc), cl->id.comm);
		snprintf(lab, sizeof(lab), "comm=\"%s\",uid=\"%u\"", esc, cl->id.uid);
		for (size_t i = 0; i < sizeof(client_defs) / sizeof(client_defs[0]); i++) {
			const struct cdef *d = &client_defs[i];
			struct field *f = field_add(l, d->kind, "client.group.%u.%s", cl->slot, d->name);

			f->u = sum[i];
			f->prom_only = 1;
			fprom(f, d->prom, d->kind == F_COUNTER ? "counter" : "gauge", d->help, lab, d->scale);
		}
		{
			struct field *f = field_add(l, F_GAUGE, "client.group.%u.connected", cl->slot);

			f->u = end - g;
			f->prom_only = 1;
			fprom(f, "chime_client_group_clients", "gauge", "Clients with this comm and uid: slots in use, detached named sessions included.", lab, 1);
		}
	}
	free(by);
}

void collect(struct flist *l, const struct sr_snap *sn)
{
	const struct chime_ctl *h = &sn->hdr;
	const char *why;
	enum sr_state st = sr_liveness(sn, &why);
	char lab[112], esc[40];
	struct field *f;
	uint32_t k, c;
	size_t i;

	l->n = 0;
	f = field_add(l, F_INT, "broker.pid");
	f->i = h->pid;
	f = field_add(l, F_STR, "broker.version");
	snprintf(f->s, sizeof(f->s), "%s", h->version);
	prom_escape(esc, sizeof(esc), h->version);
	snprintf(lab, sizeof(lab), "version=\"%s\",pid=\"%d\"", esc, (int)h->pid);
	fprom(f, "chime_broker_info", "gauge", "Broker identity (always 1).", lab, 1);
	f = field_add(l, F_STR, "broker.state");
	snprintf(f->s, sizeof(f->s), "%s", sr_state_name(h->state));
	f = field_add(l, F_BOOL, "broker.running");
	f->u = st == SR_RUNNING || st == SR_STARTING;
	fprom(f, "chime_broker_up", "gauge", "1 if the broker is alive (fresh heartbeat, pid present).", NULL, 1);
	f = field_add(l, F_STR, "broker.status");
	snprintf(f->s, sizeof(f->s), "%s", why);
	f = field_add(l, F_GAUGE, "broker.uptime_ns");
	f->u = sn->now_ns > h->start_ns ? sn->now_ns - h->start_ns : 0;
	fprom(f, "chime_broker_uptime_seconds", "gauge", "Time since the broker started.", NULL, 1e-9);
	f = field_add(l, F_GAUGE, "broker.heartbeat_age_ns");
	f->u = sn->now_ns > h->heartbeat_ns ? sn->now_ns - h->heartbeat_ns : 0;
	fprom(f, "chime_broker_heartbeat_age_seconds", "gauge", "Age of the broker's heartbeat.", NULL, 1e-9);
	f = field_add(l, F_INT, "broker.clock_offset_ns");
	f->i = sn->clock_off;
	fprom(f, "chime_broker_clock_offset_seconds", "gauge",
	      "The broker's CLOCK_MONOTONIC minus this reader's: not 0 from another time namespace, where "
	      "chime_open() fails with EXDEV.", NULL, 1e-9);
	f = field_add(l, F_GAUGE, "broker.heartbeat_period_ns");
	f->u = st == SR_RUNNING || st == SR_STARTING ? (uint64_t)h->beat_ms * 1000000u : 0;
	fprom(f, "chime_broker_heartbeat_period_seconds", "gauge",
	      "The broker's heartbeat period now: 90 ms, longer at rest (0: not running, or a broker that does not say).",
	      NULL, 1e-9);
	f = field_add(l, F_GAUGE, "broker.start_realtime_ns");
	f->u = h->start_realtime_ns;
	fprom(f, "chime_broker_start_time_seconds", "gauge", "Broker start, seconds since the epoch.", NULL, 1e-9);
	f = field_add(l, F_GAUGE, "broker.shards");
	f->u = h->nr_shards;
	fprom(f, "chime_broker_shards", "gauge", "Shard threads.", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.resolution_ns");
	f->u = h->resolution_ns;
	fprom(f, "chime_broker_resolution_seconds", "gauge", "Timing wheel resolution.", NULL, 1e-9);
	f = field_add(l, F_INT, "broker.spin_us");
	f->i = h->spin_us;
	f = field_add(l, F_GAUGE, "broker.spin_share");
	f->u = h->spin_share;
	fprom(f, "chime_broker_spin_share_ratio", "gauge",
	      "Share of a shard's time it may spin with no work (chimed --spin-share; not applied with --spin-us -1).",
	      NULL, 0.01);
	/* The sizes an alert divides by (armed of capacity, clients of max_clients, depths of sizes). */
	f = field_add(l, F_GAUGE, "broker.sq_size");
	f->u = h->sq_size;
	fprom(f, "chime_broker_sq_size", "gauge", "Slots of each submission ring (chimed --sq-size).", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.cq_size");
	f->u = h->cq_size;
	fprom(f, "chime_broker_cq_size", "gauge", "Slots of each completion ring (chimed --cq-size).", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.capacity");
	f->u = h->shard_capacity;
	fprom(f, "chime_broker_capacity", "gauge", "Timers each shard can hold (chimed --capacity).", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.max_clients");
	f->u = h->max_clients;
	fprom(f, "chime_broker_max_clients", "gauge", "Clients the broker admits at once (chimed --max-clients).",
	      NULL, 1);
	f = field_add(l, F_GAUGE, "broker.clients_now");
	f->u = h->clients_now;
	fprom(f, "chime_clients", "gauge", "Client slots in use now: connected, being reclaimed, or a detached named session.", NULL, 1);
	f = field_add(l, F_COUNTER, "broker.clients_total");
	f->u = h->clients_total;
	fprom(f, "chime_clients_connected_total", "counter", "Clients accepted since start.", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.torn_blocks");
	f->u = sn->torn;
	f = field_add(l, F_GAUGE, "broker.shards_lost");
	f->u = h->shards_lost;
	fprom(f, "chime_broker_shards_lost", "gauge", "Shards whose file was missing at start while sessions were "
	      "taken over: their timers there were lost.", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.sessions_damaged");
	f->u = h->sessions_damaged;
	fprom(f, "chime_broker_sessions_damaged", "gauge", "Damaged records of the sessions file dropped at start: "
	      "those sessions' timers were lost (the file as found is kept at PATH.sessions.damaged).", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.sessions_unadmitted");
	f->u = h->sessions_unadmitted;
	fprom(f, "chime_broker_sessions_unadmitted", "gauge", "Detached sessions that no process can attach to "
	      "under the policy (user not admitted, or name reserved for another), as judged at start and at each "
	      "reload; they go when their linger ends.", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.socket_gone");
	f->u = h->socket_gone;
	fprom(f, "chime_broker_socket_gone", "gauge", "1 if the socket's path no longer names the broker's socket "
	      "(removed or replaced while it runs): no new client can connect until a restart.", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.sessions_file_gone");
	f->u = h->sessions_file_gone;
	fprom(f, "chime_broker_sessions_file_gone", "gauge", "1 if the sessions file was removed or replaced while the "
	      "broker runs: a crash now would lose the named sessions' timers (a stop writes it again).", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.shard_files_gone");
	f->u = h->shard_files_gone;
	fprom(f, "chime_broker_shard_files_gone", "gauge", "Shard files removed or replaced while the broker runs: a "
	      "crash now would lose the named sessions' timers there (a stop writes them again).", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.session_records_unwritten");
	f->u = h->session_records_unwritten;
	fprom(f, "chime_broker_session_records_unwritten", "gauge", "Session records the sessions file could not take "
	      "(a failed write), tried again at every heartbeat: a restart meanwhile loses those sessions' changes.",
	      NULL, 1);
	f = field_add(l, F_GAUGE, "broker.stats_reset_gen");
	f->u = h->stats_reset_gen;
	/* When `chimectl reset-stats` last ran: null if never. */
	if (h->stats_reset_gen && h->stats_reset_ns) {
		f = field_add(l, F_GAUGE, "broker.stats_reset_realtime_ns");
		f->u = h->stats_reset_realtime_ns;
		fprom(f, "chime_broker_stats_reset_time_seconds", "gauge",
		      "Last chimectl reset-stats, seconds since the epoch (0: never).", NULL, 1e-9);
		f = field_add(l, F_GAUGE, "broker.stats_reset_age_ns");
		f->u = sn->now_ns > h->stats_reset_ns ? sn->now_ns - h->stats_reset_ns : 0;
	} else {
		f = field_add(l, F_NULL, "broker.stats_reset_realtime_ns");
		fprom(f, "chime_broker_stats_reset_time_seconds", "gauge",
		      "Last chimectl reset-stats, seconds since the epoch (0: never).", NULL, 1e-9);
		field_add(l, F_NULL, "broker.stats_reset_age_ns");
	}
	f = field_add(l, F_GAUGE, "broker.stats_reset_pending");
	f->u = sn->reset_pending;

	for (k = 0; k < h->nr_shards; k++) {
		const struct chime_shard_stats *s = &sn->shards[k];
		char pre[32];

		snprintf(lab, sizeof(lab), "shard=\"%u\"", k);
		for (i = 0; i < sizeof(shard_defs) / sizeof(shard_defs[0]); i++) {
			const struct cdef *d = &shard_defs[i];

			f = field_add(l, d->kind, "shard.%u.%s", k, d->name);
			memcpy(&f->u, (const char *)s + d->off, sizeof(f->u));
			fprom(f, d->prom, d->kind == F_COUNTER ? "counter" : "gauge", d->help, lab, d->scale);
		}
		/* The earliest armed deadline from now (exact unless next_deadline_exact is false: then a lower bound). */
		if (s->next_deadline_ns == UINT64_MAX) {
			f = field_add(l, F_NULL, "shard.%u.next_deadline_in_ns", k);
		} else {
			f = field_add(l, F_INT, "shard.%u.next_deadline_in_ns", k);
			f->i = sr_rel_ns(s->next_deadline_ns, sn->now_ns);
		}
		f = field_add(l, F_BOOL, "shard.%u.next_deadline_exact", k);
		f->u = !s->next_inexact;
		f = field_add(l, F_BOOL, "shard.%u.stats_reset_applied", k);
		f->u = s->reset_gen == h->stats_reset_gen;
		/* Since start or the last reset (JSON, text); Prometheus gets the never-reset one below. */
		snprintf(pre, sizeof(pre), "shard.%u.lateness", k);
		add_lateness(l, pre, sn->sh[k].lat, sn->sh[k].lat_sum_ns, s->lat_max_ns, lab,
			     LAT_SUM | LAT_BUCKETS | LAT_PROMMAX);
		snprintf(pre, sizeof(pre), "shard.%u.lateness_10s", k);
		add_lateness(l, pre, sn->sh[k].win, sn->sh[k].win_sum_ns, sn->sh[k].win_max_ns, lab,
			     LAT_SUM | LAT_RECENT);
		f = field_add(l, F_HIST, "shard.%u.lateness_since_start", k);
		f->hist = s->lat;
		f->hist_sum_ns = s->lat_sum_ns;
		f->prom_only = 1;
		fprom(f, "chime_shard_lateness_seconds", "histogram",
		      "Lateness of expirations (fired - deadline) since the broker started (reset-stats leaves it), seconds.",
		      lab, 1e-9);
	}

	for (c = 0; c < sn->nr_clients; c++) {
		const struct sr_client *cl = &sn->clients[c];

		prom_escape(esc, sizeof(esc), cl->id.comm);
		/* Identity as an info series: pid and slot change on every restart, comm and uid do not. */
		snprintf(lab, sizeof(lab), "comm=\"%s\",uid=\"%u\",pid=\"%d\",slot=\"%u\"", esc,
			 cl->id.uid, (int)cl->id.pid, cl->slot);
		f = field_add(l, F_GAUGE, "client.%u.info", cl->slot);
		f->u = 1;
		f->prom_only = 1;
		fprom(f, "chime_client_info", "gauge", "A client slot in use (always 1): connected, being reclaimed, or a detached named session.", lab, 1);
		f = field_add(l, F_INT, "client.%u.pid", cl->slot);
		f->i = cl->id.pid;
		f = field_add(l, F_GAUGE, "client.%u.uid", cl->slot);
		f->u = cl->id.uid;
		f = field_add(l, F_GAUGE, "client.%u.gid", cl->slot);
		f->u = cl->id.gid;
		f = field_add(l, F_STR, "client.%u.comm", cl->slot);
		snprintf(f->s, sizeof(f->s), "%s", cl->id.comm);
		f = field_add(l, F_STR, "client.%u.state", cl->slot);
		snprintf(f->s, sizeof(f->s), "%s", sr_client_state(cl->id.state));
		if (cl->id.session[0]) {
			/* A named session: its name, and while detached the time it has left. */
			f = field_add(l, F_STR, "client.%u.session", cl->slot);
			snprintf(f->s, sizeof(f->s), "%s", cl->id.session);
			f = field_add(l, F_GAUGE, "client.%u.linger_left_ns", cl->slot);
			f->u = cl->id.state == CHIME_CLIENT_DETACHED && cl->id.linger_until_ns > sn->now_ns ?
			       cl->id.linger_until_ns - sn->now_ns : 0;
		}
		f = field_add(l, F_GAUGE, "client.%u.connected_for_ns", cl->slot);
		f->u = sn->now_ns > cl->id.connected_ns ? sn->now_ns - cl->id.connected_ns : 0;
		for (i = 0; i < sizeof(client_defs) / sizeof(client_defs[0]); i++) {
			const struct cdef *d = &client_defs[i];

			f = field_add(l, d->kind, "client.%u.%s", cl->slot, d->name);
			memcpy(&f->u, (const char *)&cl->sum + d->off, sizeof(f->u));
		}
		/* Its timers' lateness since it connected (or the last reset), all shards. */
		{
			char pre[40];

			snprintf(pre, sizeof(pre), "client.%u.lateness", cl->slot);
			add_lateness(l, pre, cl->sum.lat, 0, cl->sum.lat_max_ns, NULL, 0);
		}
	}
	client_groups(l, sn);

	/* Overall lateness has no Prometheus series: sum the shards' instead. */
	add_lateness(l, "lateness", sn->lat, sn->lat_sum_ns, sn->lat_max_ns, NULL, LAT_SUM | LAT_BUCKETS);
	add_lateness(l, "lateness_10s", sn->win, sn->win_sum_ns, sn->win_max_ns, NULL, LAT_SUM);
}

int selected(const struct opts *o, const char *name)
{
	unsigned i;

	if (!o->nr_pat)
		return 1;
	for (i = 0; i < o->nr_pat; i++)
		if (fnmatch(o->pat[i], name, 0) == 0)
			return 1;
	return 0;
}

/* The client in `slot` of a snapshot (its clients are in slot order), or NULL. */
static const struct sr_client *snap_client(const struct sr_snap *sn, uint32_t slot)
{
	uint32_t lo = 0, hi = sn->nr_clients;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (sn->clients[mid].slot == slot)
			return &sn->clients[mid];
		if (sn->clients[mid].slot < slot)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

double field_rate(const struct field *f, const struct field *p, const struct sr_snap *sn,
		  const struct sr_snap *ps)
{
	uint64_t since = sn->hdr.start_ns;
	unsigned slot;

	if (!strncmp(f->name, "client.", 7) && sscanf(f->name + 7, "%u.", &slot) == 1) {
		const struct sr_client *c = snap_client(sn, slot), *o = ps ? snap_client(ps, slot) : NULL;

		/* The slot's previous occupant's counters are no baseline for this one's. */
		if (!c || !o || o->id.generation != c->id.generation)
			p = NULL;
		/* A session's counters run on across its attaches; connected_ns is the last one's. */
		if (c && !c->id.session[0] && c->id.connected_ns > since)
			since = c->id.connected_ns;
	}
	if (p && ps)
		return sr_rate(p->u, f->u, sn->now_ns - ps->now_ns);
	return sr_rate(0, f->u, sn->now_ns > since ? sn->now_ns - since : 0);
}

/* The previous value of a counter, by name; usually at the same index. */
const struct field *prev_of(const struct flist *prev, size_t idx, const char *name)
{
	size_t i;

	if (!prev || !prev->n)
		return NULL;
	if (idx < prev->n && !strcmp(prev->v[idx].name, name))
		return &prev->v[idx];
	for (i = 0; i < prev->n; i++)
		if (!strcmp(prev->v[i].name, name))
			return &prev->v[i];
	return NULL;
}

static int cmp_by_name(const void *a, const void *b, void *list)
{
	const struct flist *l = list;

	return strcmp(l->v[*(const size_t *)a].name, l->v[*(const size_t *)b].name);
}

void findex_build(struct findex *x, const struct flist *l)
{
	if (l->n > x->cap) {
		size_t *v = realloc(x->ix, l->n * sizeof(*v));

		if (!v) {
			fprintf(stderr, PROG ": out of memory\n");
			exit(SR_EXIT_NOSHM);
		}
		x->ix = v;
		x->cap = l->n;
	}
	for (size_t i = 0; i < l->n; i++)
		x->ix[i] = i;
	x->n = l->n;
	x->l = l;
	qsort_r(x->ix, x->n, sizeof(*x->ix), cmp_by_name, (void *)l);
}

long findex_find(const struct findex *x, const char *name)
{
	size_t lo = 0, hi = x->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(x->l->v[x->ix[mid]].name, name);

		if (!c)
			return (long)x->ix[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

void findex_free(struct findex *x)
{
	free(x->ix);
	x->ix = NULL;
	x->n = x->cap = 0;
}
