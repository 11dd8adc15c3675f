/* SPDX-License-Identifier: MIT */
/*
 * chimestat - show chimed's counters, read from its control segment.
 *
 * It maps "<socket>.ctl" read-only and never talks to the broker: it costs
 * the broker nothing, works for any member of the broker's group, and shows
 * the last state of a broker that died (exit status 3 then).
 *
 * Every value is a "field" named <group>.<index>.<name> (see FIELD NAMES in
 * chimestat(1)): broker.<name>, shard.<N>.<name>, client.<SLOT>.<name> and
 * lateness.<name>. -f selects fields by those names; the text, JSON and
 * Prometheus outputs are all generated from the one list of fields built by
 * collect(), so they cannot disagree.
 */
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "chime_config.h"
#include "statsread.h"

#define PROG "chimestat"

enum fkind { F_COUNTER, F_GAUGE, F_INT, F_FLOAT, F_STR, F_BOOL, F_HIST, F_NULL };

struct field {
	char name[64];
	enum fkind kind;
	uint64_t u;
	int64_t i;
	double d;
	char s[160];
	const uint64_t *hist;       /* F_HIST: CHIME_LAT_BUCKETS buckets */
	uint64_t hist_sum_ns;
	/* Prometheus: family (NULL: not exported), its type, help, labels, scale. */
	const char *prom;
	const char *ptype;
	const char *help;
	char labels[112];
	double scale;
};

struct flist {
	struct field *v;
	size_t n, cap;
};

struct opts {
	const char *socket;
	const char **pat;
	unsigned nr_pat;
	int once, json, prom;
	double interval;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chimestat [OPTIONS]\n"
		"Show the counters of a running (or dead) chimed, read from its shared memory.\n"
		"\n"
		"  -s, --socket PATH    broker socket; reads PATH.ctl (default: $CHIME_SOCKET,\n"
		"                       else /run/chime/chime.sock)\n"
		"  -1, --once           print once and exit (rates are averages since start)\n"
		"  -j, --json           print one JSON document and exit (implies -1)\n"
		"      --prometheus     print the Prometheus text exposition format and exit\n"
		"  -f, --field PATTERN  only fields whose name matches the shell PATTERN\n"
		"                       (fnmatch; repeatable), e.g. 'shard.*.fires'\n"
		"  -i, --interval SECS  refresh interval of the live view (default 1)\n"
		"  -h, --help           show this help\n"
		"  -V, --version        show the version\n"
		"\n"
		"Field names: broker.NAME, shard.N.NAME, client.SLOT.NAME, lateness.NAME\n"
		"(all shards); -1 -f '*' lists them all.\n"
		"\n"
		"Exit status: 0 ok; 1 cannot read the broker's shared memory; 2 usage error;\n"
		"3 the broker is not running (its last state is shown).\n");
}

/* ---- the field list ---- */

static struct field *field_add(struct flist *l, enum fkind kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static struct field *field_add(struct flist *l, enum fkind kind, const char *fmt, ...)
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

static void fprom(struct field *f, const char *fam, const char *type, const char *help,
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
		} else if (c >= 0x20 && c < 0x7f) {
			dst[o++] = (char)c;
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
	{ "arms", SS(arms), F_COUNTER, "chime_shard_arms_total", "Timers armed.", 1 },
	{ "resets", SS(resets), F_COUNTER, "chime_shard_resets_total", "Timers reset to a new deadline.", 1 },
	{ "cancels", SS(cancels), F_COUNTER, "chime_shard_cancels_total", "Timers removed by cancel or cancel-by-key.", 1 },
	{ "cancel_keys", SS(cancel_keys), F_COUNTER, "chime_shard_cancel_keys_total", "Cancel-by-key requests.", 1 },
	{ "fires", SS(fires), F_COUNTER, "chime_shard_fires_total", "Expirations (each period of a periodic timer counts).", 1 },
	{ "delivered", SS(delivered), F_COUNTER, "chime_shard_delivered_total", "Events written into completion rings.", 1 },
	{ "malformed", SS(malformed), F_COUNTER, "chime_shard_malformed_total", "Submissions dropped as malformed.", 1 },
	{ "backlog", SS(backlog), F_GAUGE, "chime_shard_backlog", "Events held for clients that do not drain.", 1 },
	{ "sq_depth", SS(sq_depth), F_GAUGE, "chime_shard_sq_depth", "Submissions waiting at the last drain, all clients.", 1 },
	{ "sq_depth_max", SS(sq_depth_max), F_GAUGE, "chime_shard_sq_depth_max", "High-water mark of sq_depth.", 1 },
	{ "loops", SS(loops), F_COUNTER, "chime_shard_loops_total", "Shard loop iterations.", 1 },
	{ "sleeps", SS(sleeps), F_COUNTER, "chime_shard_sleeps_total", "Times the shard went to sleep.", 1 },
	{ "wakeups", SS(wakeups), F_COUNTER, "chime_shard_client_wakeups_total", "Wake-up messages sent to clients.", 1 },
	{ "refused_nomem", SS(refused_nomem), F_COUNTER, "chime_shard_refused_nomem_total", "Arms refused: no free timer node (ENOMEM).", 1 },
	{ "refused_quota", SS(refused_quota), F_COUNTER, "chime_shard_refused_quota_total", "Arms refused: the client held its quota (EDQUOT).", 1 },
	{ "reserve_failed", SS(reserve_failed), F_COUNTER, "chime_shard_reserve_failed_total", "Slab chunks the filesystem would not reserve.", 1 },
	{ "busy_ns", SS(busy_ns), F_COUNTER, "chime_shard_busy_seconds_total", "Time spent with work to do.", 1e-9 },
};

#define CS(f) offsetof(struct chime_client_stats, f)
static const struct cdef client_defs[] = {
	{ "armed", CS(armed), F_GAUGE, "chime_client_armed", "Timers of the client held now (armed or held).", 1 },
	{ "arms", CS(arms), F_COUNTER, "chime_client_arms_total", "Timers the client armed.", 1 },
	{ "resets", CS(resets), F_COUNTER, "chime_client_resets_total", "Timers the client reset.", 1 },
	{ "cancels", CS(cancels), F_COUNTER, "chime_client_cancels_total", "Timers of the client cancelled (by id or key).", 1 },
	{ "fires", CS(fires), F_COUNTER, "chime_client_fires_total", "Expirations of the client's timers.", 1 },
	{ "cq_depth", CS(cq_depth), F_GAUGE, "chime_client_cq_depth", "Events waiting in its completion rings.", 1 },
	{ "backlog", CS(backlog), F_GAUGE, "chime_client_backlog", "Events held back because it does not drain.", 1 },
	{ "wakeups", CS(wakeups), F_COUNTER, "chime_client_wakeups_total", "Wake-up messages sent to the client.", 1 },
	{ "refused_nomem", CS(refused_nomem), F_COUNTER, "chime_client_refused_nomem_total", "Its arms refused: no free timer node (ENOMEM).", 1 },
	{ "refused_quota", CS(refused_quota), F_COUNTER, "chime_client_refused_quota_total", "Its arms refused: at its quota (EDQUOT).", 1 },
};

static const struct {
	const char *name;
	double p;
} pcts[] = { { "p50", 0.50 }, { "p90", 0.90 }, { "p99", 0.99 }, { "p99_9", 0.999 } };

static void add_lateness(struct flist *l, const char *prefix, const uint64_t *hist,
			 uint64_t sum_ns, uint64_t max_ns, const char *labels)
{
	struct field *f;
	size_t i;

	f = field_add(l, F_COUNTER, "%s.count", prefix);
	f->u = sr_hist_count(hist);
	f = field_add(l, F_COUNTER, "%s.sum_ns", prefix);
	f->u = sum_ns;
	for (i = 0; i < sizeof(pcts) / sizeof(pcts[0]); i++) {
		f = field_add(l, F_GAUGE, "%s.%s_ns", prefix, pcts[i].name);
		f->u = sr_percentile(hist, max_ns, pcts[i].p);
	}
	f = field_add(l, F_GAUGE, "%s.max_ns", prefix);
	f->u = max_ns;
	if (labels)
		fprom(f, "chime_shard_lateness_max_seconds", "gauge",
		      "Largest lateness (fired - deadline) seen.", labels, 1e-9);
	f = field_add(l, F_HIST, "%s.buckets", prefix);
	f->hist = hist;
	f->hist_sum_ns = sum_ns;
	if (labels)
		fprom(f, "chime_shard_lateness_seconds", "histogram",
		      "Lateness of expirations (fired - deadline), seconds.", labels, 1e-9);
}

static void collect(struct flist *l, const struct sr_snap *sn)
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
	f = field_add(l, F_GAUGE, "broker.sq_size");
	f->u = h->sq_size;
	f = field_add(l, F_GAUGE, "broker.cq_size");
	f->u = h->cq_size;
	f = field_add(l, F_GAUGE, "broker.capacity");
	f->u = h->shard_capacity;
	f = field_add(l, F_GAUGE, "broker.max_clients");
	f->u = h->max_clients;
	f = field_add(l, F_GAUGE, "broker.clients_now");
	f->u = h->clients_now;
	fprom(f, "chime_clients", "gauge", "Clients connected now.", NULL, 1);
	f = field_add(l, F_COUNTER, "broker.clients_total");
	f->u = h->clients_total;
	fprom(f, "chime_clients_connected_total", "counter", "Clients accepted since start.", NULL, 1);
	f = field_add(l, F_GAUGE, "broker.torn_blocks");
	f->u = sn->torn;

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
		if (s->next_deadline_ns == UINT64_MAX) {
			f = field_add(l, F_NULL, "shard.%u.next_deadline_in_ns", k);
		} else {
			f = field_add(l, F_INT, "shard.%u.next_deadline_in_ns", k);
			f->i = (int64_t)(s->next_deadline_ns - sn->now_ns);
		}
		snprintf(pre, sizeof(pre), "shard.%u.lateness", k);
		add_lateness(l, pre, s->lat, s->lat_sum_ns, s->lat_max_ns, lab);
	}

	for (c = 0; c < sn->nr_clients; c++) {
		const struct sr_client *cl = &sn->clients[c];

		prom_escape(esc, sizeof(esc), cl->id.comm);
		snprintf(lab, sizeof(lab), "slot=\"%u\",pid=\"%d\",comm=\"%s\"", cl->slot, (int)cl->id.pid, esc);
		f = field_add(l, F_INT, "client.%u.pid", cl->slot);
		f->i = cl->id.pid;
		f = field_add(l, F_GAUGE, "client.%u.uid", cl->slot);
		f->u = cl->id.uid;
		f = field_add(l, F_GAUGE, "client.%u.gid", cl->slot);
		f->u = cl->id.gid;
		f = field_add(l, F_STR, "client.%u.comm", cl->slot);
		snprintf(f->s, sizeof(f->s), "%s", cl->id.comm);
		f = field_add(l, F_STR, "client.%u.state", cl->slot);
		snprintf(f->s, sizeof(f->s), "%s", cl->id.state == CHIME_CLIENT_DYING ? "dying" : "active");
		f = field_add(l, F_GAUGE, "client.%u.connected_for_ns", cl->slot);
		f->u = sn->now_ns > cl->id.connected_ns ? sn->now_ns - cl->id.connected_ns : 0;
		fprom(f, "chime_client_connected_seconds", "gauge", "Time since the client connected.", lab, 1e-9);
		for (i = 0; i < sizeof(client_defs) / sizeof(client_defs[0]); i++) {
			const struct cdef *d = &client_defs[i];

			f = field_add(l, d->kind, "client.%u.%s", cl->slot, d->name);
			memcpy(&f->u, (const char *)&cl->sum + d->off, sizeof(f->u));
			fprom(f, d->prom, d->kind == F_COUNTER ? "counter" : "gauge", d->help, lab, d->scale);
		}
	}

	/* Overall lateness has no Prometheus series: sum the shards' instead. */
	add_lateness(l, "lateness", sn->lat, sn->lat_sum_ns, sn->lat_max_ns, NULL);
}

static int selected(const struct opts *o, const char *name)
{
	unsigned i;

	if (!o->nr_pat)
		return 1;
	for (i = 0; i < o->nr_pat; i++)
		if (fnmatch(o->pat[i], name, 0) == 0)
			return 1;
	return 0;
}

/* The previous value of a counter, by name; usually at the same index. */
static const struct field *prev_of(const struct flist *prev, size_t idx, const char *name)
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

/* ---- JSON (jansson: escaping, UTF-8 and nesting done by a well-kept library) ---- */

/*
 * A process name is whatever bytes the process chose: keep valid UTF-8 and
 * replace every invalid byte with U+FFFD, so the document is always valid.
 */
static json_t *json_text(const char *s)
{
	json_t *j = json_string(s);
	char buf[4 * sizeof(((struct field *)0)->s)];
	size_t o = 0;

	if (j)
		return j;
	for (const unsigned char *p = (const unsigned char *)s; *p && o + 4 < sizeof(buf);) {
		int n = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 ? 2 : (*p & 0xf0) == 0xe0 ? 3 :
			(*p & 0xf8) == 0xf0 ? 4 : 0;
		json_t *one = NULL;

		if (n > 1) {
			char seq[5] = { 0 };

			memcpy(seq, p, (size_t)n);
			one = strnlen(seq, (size_t)n) == (size_t)n ? json_stringn(seq, (size_t)n) : NULL;
		}
		if (n == 1 || one) {
			memcpy(buf + o, p, (size_t)n);
			o += (size_t)n;
			p += n;
		} else {
			memcpy(buf + o, "\xef\xbf\xbd", 3);     /* U+FFFD */
			o += 3;
			p++;
		}
		json_decref(one);
	}
	return json_stringn(buf, o);
}

static json_t *json_field(const struct field *f)
{
	json_t *a;

	switch (f->kind) {
	case F_COUNTER:
	case F_GAUGE:
		return json_integer((json_int_t)f->u);
	case F_INT:
		return json_integer((json_int_t)f->i);
	case F_FLOAT:
		return json_real(f->d);
	case F_STR:
		return json_text(f->s);
	case F_BOOL:
		return json_boolean(f->u);
	case F_NULL:
		return json_null();
	case F_HIST:
		/* [[upper_ns, count], ...] for the non-empty buckets; upper null = +inf. */
		a = json_array();
		for (uint32_t b = 0; b < CHIME_LAT_BUCKETS; b++) {
			uint64_t up = chime_lat_upper_ns(b);

			if (f->hist[b])
				json_array_append_new(a, json_pack("[o,I]", up == UINT64_MAX ? json_null() :
								   json_integer((json_int_t)up),
								   (json_int_t)f->hist[b]));
		}
		return a;
	}
	return json_null();
}

/* The object of shards[]/clients[] whose `idkey` is `id`: the last one, or a new one. */
static json_t *json_element(json_t *arr, const char *idkey, json_int_t id)
{
	size_t n = json_array_size(arr);
	json_t *last = n ? json_array_get(arr, n - 1) : NULL, *o;

	if (last && json_integer_value(json_object_get(last, idkey)) == id)
		return last;
	o = json_pack("{s:I}", idkey, id);
	json_array_append_new(arr, o);
	return o;
}

static json_t *json_child(json_t *obj, const char *key)
{
	json_t *c = json_object_get(obj, key);

	if (!c) {
		c = json_object();
		json_object_set_new(obj, key, c);
	}
	return c;
}

/*
 * The document: {"version", "timestamp" (Unix time, s), "broker": {...},
 * "shards": [{"shard": N, ...}], "clients": [{"slot": S, ...}] (always an
 * array, empty with no clients), "lateness": {...}}. A field name
 * "shard.N.lateness.p99_ns" becomes shards[i].lateness.p99_ns.
 */
static void print_json(FILE *out, const struct flist *l, const struct opts *o)
{
	struct timespec rt;
	json_t *doc, *shards = json_array(), *clients = json_array();

	clock_gettime(CLOCK_REALTIME, &rt);
	doc = json_pack("{s:s,s:f,s:o,s:o}", "version", CHIME_VERSION,
			"timestamp", (double)rt.tv_sec + (double)rt.tv_nsec / 1e9,
			"shards", shards, "clients", clients);
	for (size_t i = 0; i < l->n; i++) {
		const struct field *f = &l->v[i];
		char name[sizeof(f->name)], *save = NULL, *part[4];
		int n = 0;
		json_t *at;

		if (!selected(o, f->name))
			continue;
		snprintf(name, sizeof(name), "%s", f->name);
		for (char *t = strtok_r(name, ".", &save); t && n < 4; t = strtok_r(NULL, ".", &save))
			part[n++] = t;
		if (n < 2)
			continue;
		if (!strcmp(part[0], "shard") || !strcmp(part[0], "client")) {
			bool shard = part[0][0] == 's';

			if (n < 3)
				continue;
			at = json_element(shard ? shards : clients, shard ? "shard" : "slot",
					  (json_int_t)strtoll(part[1], NULL, 10));
			if (n == 4)
				at = json_child(at, part[2]);
		} else {
			at = json_child(doc, part[0]);
			if (n >= 3)
				at = json_child(at, part[1]);
		}
		json_object_set_new(at, part[n - 1], json_field(f));
	}
	json_dumpf(doc, out, JSON_COMPACT | JSON_REAL_PRECISION(17));
	fputc('\n', out);
	json_decref(doc);
}

/* One value as JSON text (the flat listing's strings and specials). */
static void print_value(FILE *out, const struct field *f)
{
	json_t *j = json_field(f);

	json_dumpf(j, out, JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(j);
}

/* ---- Prometheus ---- */

static void prom_num(FILE *out, double v)
{
	if (isinf(v))
		fputs("+Inf", out);
	else
		fprintf(out, "%.17g", v);
}

static void print_prom(FILE *out, const struct flist *l, const struct opts *o)
{
	size_t i, j;

	for (i = 0; i < l->n; i++) {
		const struct field *f = &l->v[i];
		int seen = 0;

		if (!f->prom)
			continue;
		/* Families are emitted once, at their first field, with all their series. */
		for (j = 0; j < i && !seen; j++)
			seen = l->v[j].prom && !strcmp(l->v[j].prom, f->prom);
		if (seen)
			continue;
		for (j = i; j < l->n; j++) {
			const struct field *g = &l->v[j];
			const char *sep;

			if (!g->prom || strcmp(g->prom, f->prom) || !selected(o, g->name))
				continue;
			if (!seen) {
				fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", f->prom, f->help, f->prom, f->ptype);
				seen = 1;
			}
			sep = *g->labels ? "," : "";
			if (g->kind == F_HIST) {
				uint64_t cum = 0;
				uint32_t b;

				for (b = 0; b < CHIME_LAT_BUCKETS; b++) {
					uint64_t up = chime_lat_upper_ns(b);

					cum += g->hist[b];
					fprintf(out, "%s_bucket{%s%sle=\"", g->prom, g->labels, sep);
					prom_num(out, up == UINT64_MAX ? INFINITY : (double)up * g->scale);
					fprintf(out, "\"} %" PRIu64 "\n", cum);
				}
				fprintf(out, "%s_sum{%s} ", g->prom, g->labels);
				prom_num(out, (double)g->hist_sum_ns * g->scale);
				fprintf(out, "\n%s_count{%s} %" PRIu64 "\n", g->prom, g->labels, cum);
				continue;
			}
			fprintf(out, "%s{%s} ", g->prom, g->labels);
			if (!strcmp(g->prom, "chime_broker_info"))
				fputs("1", out);
			else if (g->kind == F_INT)
				prom_num(out, (double)g->i * g->scale);
			else if (g->scale == 1)
				fprintf(out, "%" PRIu64, g->u);
			else
				prom_num(out, (double)g->u * g->scale);
			fputc('\n', out);
		}
	}
}

/* ---- text ---- */

static double rate_of(const struct field *f, const struct field *p, const struct sr_snap *sn,
		      const struct sr_snap *ps)
{
	if (p && ps)
		return sr_rate(p->u, f->u, sn->now_ns - ps->now_ns);
	/* No previous sample: the average since the broker started. */
	return sr_rate(0, f->u, sn->now_ns > sn->hdr.start_ns ? sn->now_ns - sn->hdr.start_ns : 0);
}

static void print_flat(FILE *out, const struct flist *l, const struct flist *prev,
		       const struct sr_snap *sn, const struct sr_snap *ps, const struct opts *o)
{
	size_t i;

	for (i = 0; i < l->n; i++) {
		const struct field *f = &l->v[i];

		if (!selected(o, f->name))
			continue;
		fprintf(out, "%-36s ", f->name);
		switch (f->kind) {
		case F_COUNTER:
			fprintf(out, "%20" PRIu64 " %12.1f/s", f->u, rate_of(f, prev_of(prev, i, f->name), sn, ps));
			break;
		case F_HIST:
			fprintf(out, "%20" PRIu64 " samples", sr_hist_count(f->hist));
			break;
		default:
			print_value(out, f);
		}
		fputc('\n', out);
	}
}

static uint64_t fval(const struct flist *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static uint64_t fval(const struct flist *l, const char *fmt, ...)
{
	char name[64];
	va_list ap;
	size_t i;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	for (i = 0; i < l->n; i++)
		if (!strcmp(l->v[i].name, name))
			return l->v[i].u;
	return 0;
}

/* Rate of a counter field by name between two field lists (prev NULL: since start). */
static double frate(const struct flist *l, const struct flist *prev, const struct sr_snap *sn,
		    const struct sr_snap *ps, const char *name)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		if (!strcmp(l->v[i].name, name))
			return rate_of(&l->v[i], prev_of(prev, i, name), sn, ps);
	return 0;
}

static void print_lat_row(FILE *out, const char *label, const uint64_t *hist, uint64_t max_ns)
{
	char b[5][16];
	size_t i;

	for (i = 0; i < 4; i++)
		sr_fmt_ns(b[i], sizeof(b[i]), sr_percentile(hist, max_ns, pcts[i].p));
	sr_fmt_ns(b[4], sizeof(b[4]), max_ns);
	fprintf(out, "%-8s %10" PRIu64 " %9s %9s %9s %9s %9s\n", label, sr_hist_count(hist),
		b[0], b[1], b[2], b[3], b[4]);
}

static void print_table(FILE *out, const struct flist *l, const struct flist *prev,
			const struct sr_snap *sn, const struct sr_snap *ps)
{
	const struct chime_ctl *h = &sn->hdr;
	char up[32], hb[32], res[16], since[32], nd[16], name[64];
	const char *why;
	enum sr_state st = sr_liveness(sn, &why);
	uint32_t k, c;

	sr_fmt_dur(up, sizeof(up), fval(l, "broker.uptime_ns"));
	sr_fmt_ns(hb, sizeof(hb), fval(l, "broker.heartbeat_age_ns"));
	sr_fmt_ns(res, sizeof(res), h->resolution_ns);
	fprintf(out, "chimed pid %d  version %s  up %s  heartbeat %s ago  shards %u  resolution %s  ",
		(int)h->pid, h->version, up, hb, h->nr_shards, res);
	if (h->spin_us < 0)
		fprintf(out, "spin busy-poll  ");
	else
		fprintf(out, "spin %" PRId64 "us  ", h->spin_us);
	fprintf(out, "clients %" PRIu64 "/%" PRIu64 "  state %s%s\n", h->clients_now, h->clients_total,
		sr_state_name(h->state), st == SR_DEAD ? " (NOT RUNNING: last state shown)" : "");
	if (st == SR_DEAD || st == SR_STOPPED)
		fprintf(out, "*** %s ***\n", why);
	if (sn->torn)
		fprintf(out, "*** %u block(s) were being written by a writer that stopped: values may be inconsistent ***\n",
			sn->torn);
	fprintf(out, "%s\n", ps ? "" : "(rates: averages since start)");

	fprintf(out, "%5s %9s %9s %9s %9s %9s %6s %7s %7s %11s %9s %8s %9s %5s %9s\n",
		"shard", "armed", "arms/s", "resets/s", "cancel/s", "fires/s", "malf", "refused", "backlog",
		"sq now/max", "loops/s", "sleeps/s", "wakeups/s", "busy%", "next");
	for (k = 0; k < h->nr_shards; k++) {
		const struct chime_shard_stats *s = &sn->shards[k];
		char sq[24];
		double busy;

		snprintf(name, sizeof(name), "shard.%u.busy_ns", k);
		busy = frate(l, prev, sn, ps, name) / 1e7; /* ns per s -> percent */
		snprintf(sq, sizeof(sq), "%" PRIu64 "/%" PRIu64, s->sq_depth, s->sq_depth_max);
		if (s->next_deadline_ns == UINT64_MAX)
			snprintf(nd, sizeof(nd), "-");
		else if (s->next_deadline_ns <= sn->now_ns)
			snprintf(nd, sizeof(nd), "due");
		else
			sr_fmt_ns(nd, sizeof(nd), s->next_deadline_ns - sn->now_ns);
#define R(f) (snprintf(name, sizeof(name), "shard.%u." f, k), frate(l, prev, sn, ps, name))
		fprintf(out, "%5u %9" PRIu64 " %9.0f %9.0f %9.0f %9.0f %6" PRIu64 " %7" PRIu64 " %7" PRIu64
			" %11s %9.0f %8.0f %9.0f %5.1f %9s\n",
			k, s->armed, R("arms"), R("resets"), R("cancels"), R("fires"), s->malformed,
			s->refused_nomem + s->refused_quota, s->backlog, sq, R("loops"), R("sleeps"),
			R("wakeups"), busy, nd);
		if (s->reserve_failed)
			fprintf(out, "      shard %u: %" PRIu64 " slab reservations failed (filesystem full?)\n",
				k, s->reserve_failed);
#undef R
	}

	fprintf(out, "\n%-8s %10s %9s %9s %9s %9s %9s\n", "lateness", "count", "p50", "p90", "p99", "p99.9", "max");
	for (k = 0; k < h->nr_shards; k++) {
		snprintf(name, sizeof(name), "shard %u", k);
		print_lat_row(out, name, sn->shards[k].lat, sn->shards[k].lat_max_ns);
	}
	print_lat_row(out, "all", sn->lat, sn->lat_max_ns);

	fprintf(out, "\n%4s %7s %6s %-15s %9s %8s %8s %8s %8s %6s %7s %7s %s\n",
		"slot", "pid", "uid", "comm", "since", "armed", "arms/s", "fires/s", "cancels", "cq",
		"backlog", "wakeups", "refused nomem/quota");
	for (c = 0; c < sn->nr_clients; c++) {
		const struct sr_client *cl = &sn->clients[c];

		sr_fmt_dur(since, sizeof(since), sn->now_ns > cl->id.connected_ns ? sn->now_ns - cl->id.connected_ns : 0);
#define R(f) (snprintf(name, sizeof(name), "client.%u." f, cl->slot), frate(l, prev, sn, ps, name))
		fprintf(out, "%4u %7d %6u %-15s %9s %8" PRIu64 " %8.0f %8.0f %8" PRIu64 " %6" PRIu64
			" %7" PRIu64 " %7" PRIu64 " %" PRIu64 "/%" PRIu64 "%s\n",
			cl->slot, (int)cl->id.pid, cl->id.uid, cl->id.comm, since, cl->sum.armed, R("arms"),
			R("fires"), cl->sum.cancels, cl->sum.cq_depth, cl->sum.backlog, cl->sum.wakeups,
			cl->sum.refused_nomem, cl->sum.refused_quota,
			cl->id.state == CHIME_CLIENT_DYING ? " (dying)" : "");
#undef R
	}
	if (!sn->nr_clients)
		fprintf(out, "(no clients)\n");
}

static int exit_for(const struct sr_snap *sn)
{
	enum sr_state st = sr_liveness(sn, NULL);

	return st == SR_RUNNING || st == SR_STARTING ? SR_EXIT_OK : SR_EXIT_NOT_RUNNING;
}

static int chimestat(struct opts *op, int argc, char **argv)
{
	enum { OPT_PROM = 256 };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "once", no_argument, NULL, '1' },
		{ "json", no_argument, NULL, 'j' },
		{ "prometheus", no_argument, NULL, OPT_PROM },
		{ "field", required_argument, NULL, 'f' },
		{ "interval", required_argument, NULL, 'i' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	struct opts o = *op;
	struct flist cur = { 0 }, prev = { 0 };
	struct sr_snap sn, ps;
	char sock[PATH_MAX];
	int have_prev = 0, tty, r, opt;
	struct sr s;

	while ((opt = getopt_long(argc, argv, "s:1jf:i:hV", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			o.socket = optarg;
			break;
		case '1':
			o.once = 1;
			break;
		case 'j':
			o.json = o.once = 1;
			break;
		case OPT_PROM:
			o.prom = o.once = 1;
			break;
		case 'f':
			o.pat[o.nr_pat++] = optarg;
			break;
		case 'i': {
			char *end;

			errno = 0;
			o.interval = strtod(optarg, &end);
			if (errno || *end || !(o.interval >= 0.05 && o.interval <= 3600)) {
				fprintf(stderr, PROG ": invalid interval '%s' (0.05 to 3600 seconds)\n", optarg);
				return SR_EXIT_USAGE;
			}
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
	if (optind < argc) {
		fprintf(stderr, PROG ": unexpected argument '%s' (try '" PROG " --help')\n", argv[optind]);
		return SR_EXIT_USAGE;
	}
	if (o.json && o.prom) {
		fprintf(stderr, PROG ": --json and --prometheus exclude each other\n");
		return SR_EXIT_USAGE;
	}
	r = sr_socket_path(sock, sizeof(sock), o.socket);
	if (r < 0) {
		fprintf(stderr, PROG ": no socket path: %s (set $CHIME_SOCKET or use --socket)\n", strerror(-r));
		return SR_EXIT_NOSHM;
	}
	r = sr_open(&s, sock);
	if (r < 0) {
		sr_perror(PROG, &s, r);
		return SR_EXIT_NOSHM;
	}

	if (o.once) {
		if (sr_snapshot(&s, &sn) < 0) {
			fprintf(stderr, PROG ": out of memory\n");
			sr_close(&s);
			return SR_EXIT_NOSHM;
		}
		collect(&cur, &sn);
		if (o.json)
			print_json(stdout, &cur, &o);
		else if (o.prom)
			print_prom(stdout, &cur, &o);
		else if (o.nr_pat)
			print_flat(stdout, &cur, NULL, &sn, NULL, &o);
		else
			print_table(stdout, &cur, NULL, &sn, NULL);
		r = exit_for(&sn);
		if (r == SR_EXIT_NOT_RUNNING) {
			const char *why;

			sr_liveness(&sn, &why);
			fprintf(stderr, PROG ": %s; the state shown is its last\n", why);
		}
		if (fflush(stdout) != 0) {
			fprintf(stderr, PROG ": write to stdout failed: %s\n", strerror(errno));
			r = SR_EXIT_NOSHM;
		}
		free(cur.v);
		sr_snap_free(&sn);
		sr_close(&s);
		return r;
	}

	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	tty = isatty(STDOUT_FILENO);
	r = SR_EXIT_OK;
	while (!stop) {
		struct timespec ts;

		if (sr_snapshot(&s, &sn) < 0) {
			fprintf(stderr, PROG ": out of memory\n");
			r = SR_EXIT_NOSHM;
			break;
		}
		collect(&cur, &sn);
		if (tty)
			fputs("\033[H\033[2J", stdout);
		if (o.nr_pat)
			print_flat(stdout, &cur, have_prev ? &prev : NULL, &sn, have_prev ? &ps : NULL, &o);
		else
			print_table(stdout, &cur, have_prev ? &prev : NULL, &sn, have_prev ? &ps : NULL);
		if (!tty)
			fputc('\n', stdout);
		fflush(stdout);
		r = exit_for(&sn);
		/* Keep this sample for the next rates; the field list too. */
		if (have_prev)
			sr_snap_free(&ps);
		ps = sn;
		{
			struct flist t = prev;

			prev = cur;
			cur = t;
		}
		have_prev = 1;
		ts.tv_sec = (time_t)o.interval;
		ts.tv_nsec = (long)((o.interval - (double)ts.tv_sec) * 1e9);
		while (!stop && nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	if (have_prev)
		sr_snap_free(&ps);
	free(cur.v);
	free(prev.v);
	sr_close(&s);
	return r;
}

int main(int argc, char **argv)
{
	/* -f patterns: at most one per argument. Owned here so every exit path frees them. */
	struct opts o = { .interval = 1, .pat = calloc((size_t)argc, sizeof(*o.pat)) };
	int r;

	if (!o.pat) {
		fprintf(stderr, PROG ": out of memory\n");
		return SR_EXIT_NOSHM;
	}
	r = chimestat(&o, argc, argv);
	free(o.pat);
	return r;
}
