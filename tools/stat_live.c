/* SPDX-License-Identifier: MIT */
/*
 * stat_live.c - chimestat's live view on ncurses (as varnishstat's): a fixed
 * header (broker line, shard lines, overall lateness), an optional lateness
 * histogram pane, and below them a client list (or, with -f, the selected
 * fields) that scrolls and sorts. See KEYS in chimestat(1).
 *
 * Invariants:
 * - Every value shown is a field of the list collect() built (chimestat.h),
 *   looked up by name: no value is read from the snapshot directly, so the
 *   view cannot disagree with -1, -j or --prometheus, and a field added to
 *   collect() needs only a column here (an optional column, such as a
 *   client's p99, shows only when some row has its field).
 * - The terminal is restored on every way out: return, exit() (atexit),
 *   SIGINT, SIGTERM and SIGHUP (a flag the loop polls at least every 100 ms).
 * - The broker dying changes nothing here but the header ("NOT RUNNING"):
 *   the mapping stays valid and shows its last state.
 *
 * Cost: one snapshot and collect() per interval, as the plain output; a
 * redraw sorts the field names (findex_build(): O(F log F), F ~ 30 per
 * shard + 45 per client) and curses sends only what changed.
 */
#include <curses.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chimestat.h"
#include "clock.h"
/* setupterm(), del_curterm(). Last: its capability macros (key_next, lines, ...) would rename fields above. */
#include <term.h>

/* ---- columns ---- */

enum ckind {
	K_ID,           /* the row's shard or slot number */
	K_NUM,          /* a value */
	K_RATE,         /* a counter's rate per second */
	K_NS,           /* a duration in ns, "12.3us"; "-" when the count name2 is 0 (nothing fired) */
	K_DUR,          /* a duration in ns, "1h02m03s" */
	K_STR,          /* a string, left-aligned */
	K_CPU,          /* cpu_ns per second, as a percentage */
	K_SUM,          /* name + name2 */
	K_PAIR,         /* "name/name2" */
	K_WAKE,         /* next_deadline_in_ns: "-" (null), "due", or a duration (">=" if not exact) */
};

struct col {
	const char *head;
	const char *name;       /* field name after "<group>.<N>." */
	const char *name2;
	enum ckind k;
	int w;
	int prio;               /* dropped first when narrow: the highest */
	int opt;                /* shown only if some row has the field (a newer collect()) */
};

static const struct col shard_cols[] = {
	{ "shard", NULL, NULL, K_ID, 5, 0, 0 },
	{ "armed", "armed", NULL, K_NUM, 9, 1, 0 },
	{ "wall", "armed_realtime", NULL, K_NUM, 7, 6, 0 },
	{ "arms/s", "arms", NULL, K_RATE, 9, 1, 0 },
	{ "fires/s", "fires", NULL, K_RATE, 9, 1, 0 },
	{ "cancel/s", "cancels", NULL, K_RATE, 9, 3, 0 },
	{ "resets/s", "resets", NULL, K_RATE, 9, 5, 0 },
	{ "backlog", "backlog", NULL, K_NUM, 7, 2, 0 },
	{ "sq wait/max", "sq_depth", "sq_depth_max", K_PAIR, 11, 6, 0 },
	{ "refused", "refused_nomem", "refused_quota", K_SUM, 7, 3, 0 },
	{ "malf", "malformed", NULL, K_NUM, 6, 6, 0 },
	{ "p99", "lateness.p99_ns", NULL, K_NS, 8, 2, 0 },
	{ "cpu%", "cpu_ns", NULL, K_CPU, 5, 2, 0 },
	{ "loops/s", "loops", NULL, K_RATE, 9, 7, 0 },
	{ "sleeps/s", "sleeps", NULL, K_RATE, 8, 8, 0 },
	{ "wakeups/s", "wakeups", NULL, K_RATE, 9, 7, 0 },
	{ "next", "next_deadline_in_ns", "next_deadline_exact", K_WAKE, 8, 5, 0 },
};
#define NR_SHARD_COLS (sizeof(shard_cols) / sizeof(shard_cols[0]))

static const struct col client_cols[] = {
	{ "slot", NULL, NULL, K_ID, 4, 0, 0 },
	{ "pid", "pid", NULL, K_NUM, 7, 1, 0 },
	{ "uid", "uid", NULL, K_NUM, 6, 4, 0 },
	{ "comm", "comm", NULL, K_STR, 15, 0, 0 },
	{ "since", "connected_for_ns", NULL, K_DUR, 8, 6, 0 },
	{ "armed", "armed", NULL, K_NUM, 8, 1, 0 },
	{ "arms/s", "arms", NULL, K_RATE, 8, 1, 0 },
	{ "fires/s", "fires", NULL, K_RATE, 8, 1, 0 },
	{ "cancels", "cancels", NULL, K_NUM, 8, 5, 0 },
	{ "cq", "cq_depth", NULL, K_NUM, 6, 3, 0 },
	{ "backlog", "backlog", NULL, K_NUM, 7, 2, 0 },
	{ "p99", "lateness.p99_ns", "lateness.count", K_NS, 8, 3, 1 },  /* per-client lateness, if collected */
	{ "wakeups", "wakeups", NULL, K_NUM, 7, 6, 0 },
	{ "refused", "refused_nomem", "refused_quota", K_PAIR, 9, 5, 0 },
	{ "state", "state", NULL, K_STR, 6, 7, 0 },
};
#define NR_CLIENT_COLS (sizeof(client_cols) / sizeof(client_cols[0]))
#define MAX_COLS 17
_Static_assert(NR_SHARD_COLS <= MAX_COLS && NR_CLIENT_COLS <= MAX_COLS, "a table's columns fit its arrays");

/* What `s` cycles through, by column head; numbers sort biggest first. */
static const char *const client_sorts[] = { "slot", "armed", "arms/s", "fires/s", "backlog", "p99", "comm" };
#define NR_CLIENT_SORTS (sizeof(client_sorts) / sizeof(client_sorts[0]))
static const char *const field_sorts[] = { "name", "value", "rate" };
#define NR_FIELD_SORTS (sizeof(field_sorts) / sizeof(field_sorts[0]))

/* `+` and `-` step through these (seconds). */
static const double steps[] = { 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300, 600, 3600 };
#define NR_STEPS (sizeof(steps) / sizeof(steps[0]))

/* ---- state ---- */

struct lrow {
	long id;                /* client slot, or (with -f) the field's index */
	double num;             /* the sort key */
	const char *str;
};

struct live {
	struct sr *s;
	const struct opts *o;
	struct flist cur, prev;
	struct sr_snap sn, ps;
	int have_cur, have_prev;
	struct findex fx;       /* cur's fields by name */
	struct lrow *rows;
	size_t nrows, cap_rows;
	double interval;
	int paused, help, hist, hist_src, sort, rev;
	long sel_id;            /* the selected row's id, kept across refreshes and sorts */
	size_t sel, top, page;
	char err[96];
	int stopped;            /* its broker stopped and emptied the segment: the last frame is shown */
};

static volatile sig_atomic_t live_stop;
static int live_active;
static SCREEN *live_scr;
static FILE *live_in;           /* /dev/tty when stdin is not the terminal */

static void live_on_signal(int sig)
{
	(void)sig;
	live_stop = 1;
}

static void live_atexit(void)
{
	if (live_active) {
		live_active = 0;
		endwin();
		delscreen(live_scr);
		if (live_in != stdin)
			fclose(live_in);
	}
}

/* ---- fields by name ---- */

static const struct field *fld(const struct live *L, const char *group, long id, const char *name, long *idx)
{
	char full[80];
	long i;

	if (id >= 0)
		snprintf(full, sizeof(full), "%s.%ld.%s", group, id, name);
	else
		snprintf(full, sizeof(full), "%s.%s", group, name);
	i = findex_find(&L->fx, full);
	if (idx)
		*idx = i;
	return i < 0 ? NULL : &L->cur.v[i];
}

static double num_of(const struct field *f)
{
	switch (f->kind) {
	case F_INT:
		return (double)f->i;
	case F_FLOAT:
		return f->d;
	case F_HIST:
	case F_STR:
	case F_NULL:
		return 0;
	default:
		return (double)f->u;
	}
}

/* A counter's rate: between the last two samples, else an average (field_rate()). */
static double rate(const struct live *L, const struct field *f, long idx)
{
	const struct field *p = L->have_prev ? prev_of(&L->prev, (size_t)idx, f->name) : NULL;

	return field_rate(f, p, &L->sn, p ? &L->ps : NULL);
}

/* ---- formatting ---- */

/* A number in at most w characters: exact when it fits, else with k/M/G/T. */
static void fmt_num(char *buf, size_t len, double v, int w)
{
	static const char sfx[] = "kMGTP";
	int i;

	snprintf(buf, len, "%.0f", v);
	if ((int)strlen(buf) <= w)
		return;
	for (i = 0; i < 5; i++) {
		v /= 1000;
		snprintf(buf, len, v < 10 ? "%.1f%c" : "%.0f%c", v, sfx[i]);
		if ((int)strlen(buf) <= w)
			return;
	}
}

/* Printable ASCII only: a process name is any bytes. */
static void sanitize(char *dst, size_t len, const char *src)
{
	size_t o = 0;

	for (; *src && o + 1 < len; src++)
		dst[o++] = *src >= 0x20 && *src < 0x7f ? *src : '?';
	dst[o] = '\0';
}

/* Whether the column is shown: always, or if an optional one's "<group>.<N>.<name>" is in the list. */
static int col_present(const struct live *L, const struct col *c, const char *group)
{
	size_t i, gl = strlen(group), nl;

	if (!c->name || !c->opt)
		return 1;
	nl = strlen(c->name);
	for (i = 0; i < L->cur.n; i++) {
		const char *n = L->cur.v[i].name, *p;
		size_t len = strlen(n);

		if (strncmp(n, group, gl) || n[gl] != '.' || len < gl + 3 + nl || strcmp(n + len - nl, c->name) ||
		    n[len - nl - 1] != '.')
			continue;
		for (p = n + gl + 1; p < n + len - nl - 1 && *p >= '0' && *p <= '9'; p++)
			;
		if (p == n + len - nl - 1 && p > n + gl + 1)
			return 1;
	}
	return 0;
}

/* The cell's sort value (and string, for K_STR). */
static double cell_key(const struct live *L, const struct col *c, const char *group, long id, const char **str)
{
	const struct field *f, *g;
	long idx;

	*str = NULL;
	if (c->k == K_ID)
		return (double)id;
	f = fld(L, group, id, c->name, &idx);
	if (!f)
		return -1;
	switch (c->k) {
	case K_STR:
		*str = f->s;
		return 0;
	case K_RATE:
	case K_CPU:
		return rate(L, f, idx);
	case K_SUM:
		g = fld(L, group, id, c->name2, NULL);
		return num_of(f) + (g ? num_of(g) : 0);
	default:
		return f->kind == F_NULL ? -1 : num_of(f);
	}
}

static void cell(char *buf, size_t len, const struct live *L, const struct col *c, const char *group, long id)
{
	const struct field *f, *g;
	char a[24], b[24];
	long idx;

	if (c->k == K_ID) {
		snprintf(buf, len, "%ld", id);
		return;
	}
	f = fld(L, group, id, c->name, &idx);
	if (!f) {
		snprintf(buf, len, "-");
		return;
	}
	switch (c->k) {
	case K_STR:
		sanitize(buf, len, f->s);
		if ((int)strlen(buf) > c->w)
			buf[c->w] = '\0';
		break;
	case K_RATE:
		fmt_num(buf, len, rate(L, f, idx), c->w);
		break;
	case K_CPU:
		snprintf(buf, len, "%.1f", rate(L, f, idx) / 1e7);    /* ns per s -> percent */
		break;
	case K_NS:
		/* a client with nothing fired has no lateness, not 0, as in the plain table */
		g = c->name2 ? fld(L, group, id, c->name2, NULL) : NULL;
		if (f->kind == F_NULL || (g && !num_of(g)))
			snprintf(buf, len, "-");
		else
			sr_fmt_ns(buf, len, (uint64_t)num_of(f));
		break;
	case K_DUR:
		sr_fmt_dur(buf, len, (uint64_t)num_of(f));
		break;
	case K_WAKE:
		if (f->kind == F_NULL)
			snprintf(buf, len, "-");
		else if (f->i <= 0)
			snprintf(buf, len, "due");
		else {
			/* a lower bound when the earliest slot was too big to scan */
			g = fld(L, group, id, c->name2, NULL);
			sr_fmt_ns(a, sizeof(a), (uint64_t)f->i);
			snprintf(buf, len, "%s%s", g && !g->u ? ">=" : "", a);
		}
		break;
	case K_SUM:
		g = fld(L, group, id, c->name2, NULL);
		fmt_num(buf, len, num_of(f) + (g ? num_of(g) : 0), c->w);
		break;
	case K_PAIR:
		g = fld(L, group, id, c->name2, NULL);
		fmt_num(a, sizeof(a), num_of(f), c->w);
		fmt_num(b, sizeof(b), g ? num_of(g) : 0, c->w);
		snprintf(buf, len, "%s/%s", a, b);
		break;
	default:
		fmt_num(buf, len, f->kind == F_NULL ? 0 : num_of(f), c->w);
	}
}

/*
 * Choose the columns that fit `width`: all present ones, then drop the one
 * with the highest prio (the rightmost among equals) until they fit; `keep`
 * (the sort column) is never dropped. Returns how many, into vis[].
 */
static size_t fit_cols(const struct col *cols, size_t n, const int *present, int keep, int width, int *vis)
{
	int on[MAX_COLS];
	size_t i, nv;

	for (i = 0; i < n; i++)
		on[i] = present[i];
	for (;;) {
		int total = -1, worst = -1;

		for (i = 0; i < n; i++) {
			if (!on[i])
				continue;
			total += cols[i].w + 1;
			if ((int)i != keep && cols[i].prio > 0 && (worst < 0 || cols[i].prio >= cols[worst].prio))
				worst = (int)i;
		}
		if (total <= width || worst < 0)
			break;
		on[worst] = 0;
	}
	for (i = nv = 0; i < n; i++)
		if (on[i])
			vis[nv++] = (int)i;
	return nv;
}

/* One table line (or the header) of the visible columns, clipped to the screen. */
static void table_line(char *line, size_t len, const struct live *L, const struct col *cols, const int *vis,
		       size_t nv, const char *group, long id, int header)
{
	size_t i, o = 0;

	line[0] = '\0';
	for (i = 0; i < nv && o + 1 < len; i++) {
		const struct col *c = &cols[vis[i]];
		char v[64];
		int n;

		if (header)
			snprintf(v, sizeof(v), "%s", c->head);
		else
			cell(v, sizeof(v), L, c, group, id);
		if (c->k == K_STR)
			n = snprintf(line + o, len - o, "%s%-*.*s", i ? " " : "", c->w, c->w, v);
		else
			n = snprintf(line + o, len - o, "%s%*s", i ? " " : "", c->w, v);
		if (n < 0)
			break;
		o += (size_t)n;
		if (o >= len)
			o = len - 1;
	}
}

/* ---- drawing ---- */

static void put(int y, int x, attr_t attr, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(int y, int x, attr_t attr, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	if (y < 0 || y >= LINES || x >= COLS)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	attrset(attr);
	mvaddnstr(y, x, buf, COLS - x);
	attrset(A_NORMAL);
}

/* A full-width bar (reverse video) holding `text`. */
static void bar_line(int y, const char *text)
{
	attrset(A_REVERSE);
	mvhline(y, 0, ' ', COLS);
	mvaddnstr(y, 0, text, COLS);
	attrset(A_NORMAL);
}

/* Append " seg" to line if it fits in width. */
static void add_seg(char *line, size_t len, int width, const char *seg)
{
	size_t o = strlen(line);

	if ((int)(o + strlen(seg) + 2) <= width)
		snprintf(line + o, len - o, "%s%s", o ? "  " : "", seg);
}

static const char *sort_name(const struct live *L)
{
	return L->o->nr_pat ? field_sorts[L->sort] : client_sorts[L->sort];
}

/* Descending unless the key is a name or a number that identifies the row. */
static int sort_desc(const struct live *L)
{
	const char *n = sort_name(L);
	int asc = !strcmp(n, "slot") || !strcmp(n, "comm") || !strcmp(n, "name");

	return asc == L->rev;
}

static int header(struct live *L)
{
	const struct field *f = fld(L, "broker", -1, "running", NULL);
	const struct field *status = fld(L, "broker", -1, "status", NULL);
	const char *why = status ? status->s : "?", *state;
	int running = f && f->u, y = 0;
	char line[512], seg[96], a[32], warn[512];

	line[0] = '\0';
	f = fld(L, "broker", -1, "pid", NULL);
	snprintf(seg, sizeof(seg), "chimed pid %" PRId64, f ? f->i : 0);
	add_seg(line, sizeof(line), COLS, seg);
	f = fld(L, "broker", -1, "version", NULL);
	sanitize(a, sizeof(a), f ? f->s : "?");
	snprintf(seg, sizeof(seg), "v%s", a);
	add_seg(line, sizeof(line), COLS, seg);
	f = fld(L, "broker", -1, "uptime_ns", NULL);
	snprintf(seg, sizeof(seg), "up %s", sr_fmt_dur(a, sizeof(a), f ? f->u : 0));
	add_seg(line, sizeof(line), COLS, seg);
	f = fld(L, "broker", -1, "clients_now", NULL);
	snprintf(seg, sizeof(seg), "clients %" PRIu64, f ? f->u : 0);
	f = fld(L, "broker", -1, "clients_total", NULL);
	snprintf(seg + strlen(seg), sizeof(seg) - strlen(seg), "/%" PRIu64, f ? f->u : 0);
	add_seg(line, sizeof(line), COLS, seg);
	f = fld(L, "broker", -1, "shards", NULL);
	snprintf(seg, sizeof(seg), "shards %" PRIu64, f ? f->u : 0);
	add_seg(line, sizeof(line), COLS, seg);
	f = fld(L, "broker", -1, "heartbeat_age_ns", NULL);
	snprintf(seg, sizeof(seg), "heartbeat %s", sr_fmt_ns(a, sizeof(a), f ? f->u : 0));
	add_seg(line, sizeof(line), COLS - 16, seg);
	f = fld(L, "broker", -1, "resolution_ns", NULL);
	snprintf(seg, sizeof(seg), "resolution %s", sr_fmt_ns(a, sizeof(a), f ? f->u : 0));
	add_seg(line, sizeof(line), COLS - 16, seg);
	put(y, 0, A_BOLD, "%s", line);
	f = fld(L, "broker", -1, "state", NULL);
	state = f ? f->s : "?";
	f = fld(L, "broker", -1, "heartbeat_period_ns", NULL);
	if (running && f && f->u > SR_HEARTBEAT_MS * UINT64_C(1000000))
		state = "running, at rest";     /* its heartbeat slowed: an old one is no alarm */
	if (L->stopped) {
		/* the last frame is a running broker's: its header said "running" after the stop (an operator's audit) */
		running = 0;
		state = "stopped";
		why = "stopped";
	}
	if ((int)(strlen(line) + strlen(state) + 2) <= COLS)
		put(y, COLS - (int)strlen(state), running ? A_BOLD : A_BOLD | A_REVERSE, "%s", state);
	y++;

	if (!running) {
		const char *p = strchr(why, '(');

		/* "chimed is not running (stale heartbeat)": the part in parentheses */
		if (p)
			snprintf(line, sizeof(line), " NOT RUNNING (%.*s): its last state is shown ",
				 (int)strcspn(p + 1, ")"), p + 1);
		else
			snprintf(line, sizeof(line), " NOT RUNNING (%s): its last state is shown ", why);
		put(y++, 0, A_BOLD | A_REVERSE, "%s", line);
	}
	f = fld(L, "broker", -1, "torn_blocks", NULL);
	if (f && f->u)
		put(y++, 0, A_BOLD, "%" PRIu64 " block(s) torn by a writer that stopped: values may be inconsistent", f->u);
	if (sr_files_warning(&L->sn.hdr, warn, sizeof(warn)))
		put(y++, 0, A_BOLD, "%s", warn);

	line[0] = '\0';
	snprintf(seg, sizeof(seg), "sort %s %s", sort_name(L), sort_desc(L) ? "(desc)" : "(asc)");
	add_seg(line, sizeof(line), COLS, seg);
	snprintf(seg, sizeof(seg), "every %gs", L->interval);
	add_seg(line, sizeof(line), COLS, seg);
	if (L->paused)
		add_seg(line, sizeof(line), COLS, "PAUSED");
	if (!L->have_prev)
		add_seg(line, sizeof(line), COLS, "rates: since start");
	if (L->err[0])
		add_seg(line, sizeof(line), COLS, L->err);
	add_seg(line, sizeof(line), COLS, "? keys");
	put(y++, 0, A_NORMAL, "%s", line);
	return y;
}

static int shards_block(struct live *L, int y)
{
	const struct field *f = fld(L, "broker", -1, "shards", NULL);
	long n = f ? (long)f->u : 0, k, shown;
	int present[MAX_COLS], vis[MAX_COLS];
	char line[512];
	size_t nv, i;

	for (i = 0; i < NR_SHARD_COLS; i++)
		present[i] = col_present(L, &shard_cols[i], "shard");
	nv = fit_cols(shard_cols, NR_SHARD_COLS, present, -1, COLS, vis);
	table_line(line, sizeof(line), L, shard_cols, vis, nv, "shard", -1, 1);
	put(y++, 0, A_UNDERLINE, "%-*s", COLS, line);
	/* Leave room for the client list: at most half of what is left. */
	shown = (LINES - y - 6) / 2;
	if (shown < 1)
		shown = 1;
	if (n > shown)
		shown--;                /* the last line says how many are not shown */
	for (k = 0; k < n && k < shown; k++) {
		table_line(line, sizeof(line), L, shard_cols, vis, nv, "shard", k, 0);
		put(y++, 0, A_NORMAL, "%s", line);
	}
	if (k < n)
		put(y++, 0, A_DIM, "(%ld more shards: a taller terminal shows them, or -1)", n - k);
	return y;
}

/* "lateness (all)  n 123  p50 1.0us ... max 4.2ms", as many parts as fit. */
static void lat_text(char *line, size_t len, const struct live *L, const char *group, const char *label)
{
	static const char *const names[] = { "count", "p50_ns", "p90_ns", "p99_ns", "p99_9_ns", "max_ns" };
	static const char *const heads[] = { "n", "p50", "p90", "p99", "p99.9", "max" };
	const struct field *f;
	char seg[64], a[24];
	size_t i;

	snprintf(line, len, "%s", label);
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		f = fld(L, group, -1, names[i], NULL);
		if (!f)
			snprintf(seg, sizeof(seg), "%s -", heads[i]);
		else if (i == 0)
			snprintf(seg, sizeof(seg), "%s %" PRIu64, heads[i], f->u);
		else
			snprintf(seg, sizeof(seg), "%s %s", heads[i], sr_fmt_ns(a, sizeof(a), f->u));
		add_seg(line, len, COLS, seg);
	}
}

/*
 * The lateness histogram of the chosen source: one bar per bucket that has
 * counts (buckets merged by 2, 4, ... when there are more than rows), each
 * labelled with its upper bound from chime_lat_upper_ns(), scaled to the
 * widest bar. Returns the next free line.
 */
static int hist_pane(struct live *L, int y, int rows)
{
	const struct field *f;
	uint64_t cnt[CHIME_LAT_BUCKETS], maxc = 0, total = 0;
	uint32_t upb[CHIME_LAT_BUCKETS], lob[CHIME_LAT_BUCKETS], b, g, ng, nonempty, last, group = 1;
	char title[256], lab[24], a[24];
	int barw, i;

	if (L->hist_src < 0) {
		f = fld(L, "lateness", -1, "buckets", NULL);
		snprintf(title, sizeof(title), "lateness histogram (all shards)");
	} else {
		char g2[32];

		snprintf(g2, sizeof(g2), "shard.%d.lateness", L->hist_src);
		f = fld(L, g2, -1, "buckets", NULL);
		snprintf(title, sizeof(title), "lateness histogram (shard %d)", L->hist_src);
	}
	if (!f || f->kind != F_HIST || !f->hist) {
		put(y++, 0, A_BOLD, "%s: no histogram", title);
		return y;
	}
	/*
	 * Bucket 0 (< 1 us) alone, then groups of `group` buckets from bucket 1:
	 * with 4, one power of two each (the log2 buckets); 8, two; and so on.
	 */
	for (;;) {
		nonempty = 0;
		for (b = 0; b < CHIME_LAT_BUCKETS; b = last + 1) {
			uint64_t c = 0;

			last = b == 0 ? 0 : b + group - 1 < CHIME_LAT_BUCKETS ? b + group - 1 : CHIME_LAT_BUCKETS - 1;
			for (g = b; g <= last; g++)
				c += f->hist[g];
			if (!c)
				continue;
			if (nonempty < CHIME_LAT_BUCKETS) {
				cnt[nonempty] = c;
				upb[nonempty] = last;
				lob[nonempty] = b;
			}
			nonempty++;
		}
		if ((int)nonempty <= rows - 1 || group >= CHIME_LAT_BUCKETS)
			break;
		group *= 2;
	}
	ng = nonempty;
	for (i = 0; i < (int)ng; i++) {
		total += cnt[i];
		if (cnt[i] > maxc)
			maxc = cnt[i];
	}
	if (group > 1)
		snprintf(title + strlen(title), sizeof(title) - strlen(title), ", %u buckets a bar", group);
	f = fld(L, "broker", -1, "stats_reset_gen", NULL);
	snprintf(title + strlen(title), sizeof(title) - strlen(title), ": %" PRIu64 " since %s", total,
		 f && f->u ? "the reset" : "start");
	put(y++, 0, A_BOLD, "%s", title);
	barw = COLS - 20 - 1;           /* "   <1.0us      12345 " then the bar */
	for (i = 0; i < (int)ng && i < rows - 1; i++) {
		uint64_t up = chime_lat_upper_ns(upb[i]);
		int n = (int)((cnt[i] * (uint64_t)(barw > 0 ? barw : 0) + maxc - 1) / maxc);

		/* the last bucket has no upper bound: its bar says where it starts */
		if (up == UINT64_MAX)
			snprintf(lab, sizeof(lab), ">=%s", lob[i] ? sr_fmt_ns(a, sizeof(a), chime_lat_upper_ns(lob[i] - 1)) : "0");
		else
			snprintf(lab, sizeof(lab), "<%s", sr_fmt_ns(a, sizeof(a), up));
		put(y, 0, A_NORMAL, "%8s %10" PRIu64 " ", lab, cnt[i]);
		if (n > 0 && barw > 0) {
			attrset(A_BOLD);
			mvhline(y, 20, '#', n);
			attrset(A_NORMAL);
		}
		y++;
	}
	return y;
}

/* Build the rows of the list pane (clients, or the -f fields), sorted. */
static const struct live *sort_ctx;

static int cmp_rows(const void *a, const void *b)
{
	const struct lrow *x = a, *y = b;
	int c, desc = sort_desc(sort_ctx);

	if (x->str || y->str)
		c = strcmp(x->str ? x->str : "", y->str ? y->str : "");
	else
		c = (x->num > y->num) - (x->num < y->num);
	if (desc)
		c = -c;
	return c ? c : (x->id > y->id) - (x->id < y->id);
}

static void add_row(struct live *L, long id, double num, const char *str)
{
	if (L->nrows == L->cap_rows) {
		size_t cap = L->cap_rows ? 2 * L->cap_rows : 64;
		struct lrow *v = realloc(L->rows, cap * sizeof(*v));

		if (!v) {
			fprintf(stderr, PROG ": out of memory\n");
			exit(SR_EXIT_NOSHM);
		}
		L->rows = v;
		L->cap_rows = cap;
	}
	L->rows[L->nrows++] = (struct lrow){ .id = id, .num = num, .str = str };
}

/* Client slots present in cur, ascending, into L->rows (ids only). */
static void client_ids(struct live *L)
{
	size_t i;

	L->nrows = 0;
	for (i = 0; i < L->cur.n; i++) {
		const char *n = L->cur.v[i].name;
		char *end;
		long id;

		if (strncmp(n, "client.", 7))
			continue;
		id = strtol(n + 7, &end, 10);
		if (end == n + 7 || *end != '.')
			continue;
		if (L->nrows && L->rows[L->nrows - 1].id == id)
			continue;
		add_row(L, id, 0, NULL);
	}
}

/* The rows of the list pane (clients, or the -f fields) with their sort keys, sorted. */
static void list_rows(struct live *L)
{
	size_t i;

	if (L->o->nr_pat) {
		L->nrows = 0;
		for (i = 0; i < L->cur.n; i++) {
			const struct field *f = &L->cur.v[i];

			if (f->prom_only || !selected(L->o, f->name))
				continue;
			if (!strcmp(sort_name(L), "rate"))
				add_row(L, (long)i, f->kind == F_COUNTER ? rate(L, f, (long)i) : -1, NULL);
			else if (!strcmp(sort_name(L), "value"))
				add_row(L, (long)i, num_of(f), f->kind == F_STR ? f->s : NULL);
			else
				add_row(L, (long)i, (double)i, NULL);
		}
	} else {
		client_ids(L);
		for (i = 0; i < NR_CLIENT_COLS; i++) {
			size_t k;

			if (strcmp(client_cols[i].head, sort_name(L)))
				continue;
			for (k = 0; k < L->nrows; k++)
				L->rows[k].num = cell_key(L, &client_cols[i], "client", L->rows[k].id, &L->rows[k].str);
		}
	}
	sort_ctx = L;
	if (L->nrows > 1)       /* rows is NULL with none: qsort() is not to be given it */
		qsort(L->rows, L->nrows, sizeof(*L->rows), cmp_rows);
}

static int list_pane(struct live *L, int y)
{
	int present[MAX_COLS], vis[MAX_COLS], keep = -1, h = LINES - 1 - y - 1;
	char line[512];
	size_t nv = 0, i;

	if (L->o->nr_pat) {
		snprintf(line, sizeof(line), "%-40s %20s %14s", "field", "value", "rate/s");
	} else {
		for (i = 0; i < NR_CLIENT_COLS; i++) {
			present[i] = col_present(L, &client_cols[i], "client");
			if (!strcmp(client_cols[i].head, sort_name(L)))
				keep = (int)i;
		}
		nv = fit_cols(client_cols, NR_CLIENT_COLS, present, keep, COLS, vis);
		table_line(line, sizeof(line), L, client_cols, vis, nv, "client", -1, 1);
	}
	put(y++, 0, A_UNDERLINE, "%-*s", COLS, line);
	if (h < 1)
		h = 1;
	L->page = (size_t)h;
	/* Keep the selected row selected across refreshes and sorts. */
	for (i = 0; i < L->nrows; i++)
		if (L->rows[i].id == L->sel_id)
			L->sel = i;
	if (L->sel >= L->nrows)
		L->sel = L->nrows ? L->nrows - 1 : 0;
	if (L->nrows)
		L->sel_id = L->rows[L->sel].id;
	if (L->sel < L->top)
		L->top = L->sel;
	if (L->sel >= L->top + (size_t)h)
		L->top = L->sel - (size_t)h + 1;
	if (L->top + (size_t)h > L->nrows)
		L->top = L->nrows > (size_t)h ? L->nrows - (size_t)h : 0;
	for (i = L->top; i < L->nrows && i < L->top + (size_t)h; i++) {
		attr_t at = i == L->sel ? A_REVERSE : A_NORMAL;

		if (L->o->nr_pat) {
			const struct field *f = &L->cur.v[L->rows[i].id];
			char v[200] = "", vs[200], r[32] = "";
			FILE *m;

			/* The same value text as -1 -f prints (print_value). */
			if (f->kind == F_HIST) {
				snprintf(v, sizeof(v), "%" PRIu64 " samples", sr_hist_count(f->hist));
			} else if ((m = fmemopen(v, sizeof(v) - 1, "w"))) {
				print_value(m, f);
				fclose(m);
			}
			if (f->kind == F_COUNTER)
				fmt_num(r, sizeof(r), rate(L, f, L->rows[i].id), 14);
			sanitize(vs, sizeof(vs), v);
			snprintf(line, sizeof(line), "%-40s %20s %14s", f->name, vs, r);
		} else {
			const struct field *st = fld(L, "client", L->rows[i].id, "state", NULL);

			table_line(line, sizeof(line), L, client_cols, vis, nv, "client", L->rows[i].id, 0);
			/* Dim: no process behind it (dying, or a detached session). */
			if (st && (!strcmp(st->s, "dying") || !strcmp(st->s, "detached")))
				at |= A_DIM;
		}
		if (i == L->sel)
			put(y, 0, at, "%-*s", COLS, line);
		else
			put(y, 0, at, "%s", line);
		y++;
	}
	if (!L->nrows)
		put(y, 0, A_DIM, "%s", L->o->nr_pat ? "(no field matches -f)" : "(no clients)");
	snprintf(line, sizeof(line), " %s %zu-%zu of %zu   q quit  p pause  s sort  r reverse  h histogram  ? keys",
		 L->o->nr_pat ? "fields" : "clients", L->nrows ? L->top + 1 : 0,
		 L->top + (size_t)h < L->nrows ? L->top + (size_t)h : L->nrows, L->nrows);
	bar_line(LINES - 1, line);
	return y;
}

static void help_box(void)
{
	static const char *const text[] = {
		"chimestat live view: keys",
		"",
		"q           quit",
		"p           pause / resume sampling",
		"s / S       next / previous sort key",
		"r           reverse the sort",
		"h           lateness histogram pane on / off",
		"Tab         histogram of the next shard (or all)",
		"+ / -       longer / shorter interval",
		"Up Down j k move the selection",
		"PgUp PgDn   a page up / down",
		"Home End    first / last row (g G)",
		"Ctrl-L      redraw the screen",
		"?           this help (any key closes it)",
	};
	int n = (int)(sizeof(text) / sizeof(text[0])), w = 52, y0, x0, i;

	if (w > COLS)
		w = COLS;
	y0 = (LINES - n - 2) / 2;
	x0 = (COLS - w) / 2;
	if (y0 < 0)
		y0 = 0;
	if (x0 < 0)
		x0 = 0;
	for (i = -1; i <= n; i++) {
		char buf[128];

		snprintf(buf, sizeof(buf), "  %-*s", w - 2, i >= 0 && i < n ? text[i] : "");
		put(y0 + i + 1, x0, A_REVERSE, "%.*s", w, buf);
	}
}

static void draw(struct live *L)
{
	int y;

	erase();
	if (LINES < 10 || COLS < 40) {
		put(0, 0, A_BOLD, "terminal too small (%dx%d; need 40x10)", COLS, LINES);
		refresh();
		return;
	}
	findex_build(&L->fx, &L->cur);
	y = header(L);
	y = shards_block(L, y);
	{
		char line[256];

		lat_text(line, sizeof(line), L, "lateness", "lateness (all)");
		put(y++, 0, A_NORMAL, "%s", line);
	}
	list_rows(L);
	if (L->hist) {
		/* Two thirds of what is left (asked for, it comes first), or more if the list needs fewer. */
		int rows = (LINES - y - 3) * 2 / 3, spare = LINES - y - 3 - (int)L->nrows;

		if (spare > rows)
			rows = spare;

		if (rows < 2)
			rows = 2;
		y = hist_pane(L, y, rows);
	}
	list_pane(L, y);
	if (L->help)
		help_box();
	refresh();
}

/* ---- the loop ---- */

/* 0, or sr_snapshot()'s -errno: -ENOMEM is shown and the last sample kept, -ENODATA ends the view. */
static int sample(struct live *L)
{
	struct sr_snap sn;
	int r = sr_snapshot(L->s, &sn);

	if (r == -ESTALE) {
		/* Its broker stopped and emptied it: the last frame stays, sr_follow() takes the next one. */
		snprintf(L->err, sizeof(L->err), "the broker stopped: waiting for the next one");
		L->stopped = 1;
		return r;
	}
	if (r < 0) {
		snprintf(L->err, sizeof(L->err), "snapshot failed: %s", strerror(-r));
		return r;
	}
	L->err[0] = '\0';
	L->stopped = 0;
	keep_clients(&sn, L->o);
	if (L->have_cur) {
		/* This sample becomes the previous one, for the rates. */
		struct flist t = L->prev;

		if (L->have_prev)
			sr_snap_free(&L->ps);
		L->ps = L->sn;
		L->prev = L->cur;
		L->cur = t;
		L->have_prev = 1;
	}
	L->sn = sn;
	collect(&L->cur, &L->sn);       /* after the copy: F_HIST fields point into L->sn */
	L->have_cur = 1;
	return 0;
}

static void step_interval(struct live *L, int up)
{
	size_t i;

	if (up) {
		for (i = 0; i < NR_STEPS && steps[i] <= L->interval * 1.0001; i++)
			;
		if (i < NR_STEPS)
			L->interval = steps[i];
	} else {
		for (i = NR_STEPS; i > 0 && steps[i - 1] >= L->interval * 0.9999; i--)
			;
		if (i > 0)
			L->interval = steps[i - 1];
	}
}

/* The next sort key whose column is there (p99: only if collect() has a client lateness). */
static void next_sort(struct live *L, int dir)
{
	size_t n = L->o->nr_pat ? NR_FIELD_SORTS : NR_CLIENT_SORTS, tries, i;

	for (tries = 0; tries < n; tries++) {
		L->sort = (int)((size_t)(L->sort + dir + (int)n) % n);
		if (L->o->nr_pat)
			return;
		for (i = 0; i < NR_CLIENT_COLS; i++)
			if (!strcmp(client_cols[i].head, client_sorts[L->sort]) &&
			    col_present(L, &client_cols[i], "client"))
				return;
	}
}

/* A key: 1 to quit. */
static int key(struct live *L, int ch)
{
	long nshards;
	const struct field *f;

	if (L->help && ch != KEY_RESIZE) {
		L->help = 0;
		return 0;
	}
	switch (ch) {
	case 'q':
	case 'Q':
		return 1;
	case 'p':
	case 'P':
		L->paused = !L->paused;
		break;
	case 's':
	case 'S':
	case 'r':
	case 'R':
		if (ch == 'r' || ch == 'R')
			L->rev = !L->rev;
		else
			next_sort(L, ch == 's' ? 1 : -1);
		/* A new order starts at its top; a refresh keeps the selected row. */
		L->sel = L->top = 0;
		L->sel_id = -1;
		break;
	case 'h':
	case 'H':
		L->hist = !L->hist;
		break;
	case '\t':
	case KEY_BTAB:
		f = fld(L, "broker", -1, "shards", NULL);
		nshards = f ? (long)f->u : 0;
		L->hist = 1;
		L->hist_src += ch == '\t' ? 1 : -1;
		if (L->hist_src >= nshards)
			L->hist_src = -1;
		if (L->hist_src < -1)
			L->hist_src = (int)nshards - 1;
		break;
	case '+':
	case '=':
		step_interval(L, 1);
		break;
	case '-':
	case '_':
		step_interval(L, 0);
		break;
	case '?':
		L->help = 1;
		break;
	case KEY_UP:
	case 'k':
		if (L->sel)
			L->sel--;
		break;
	case KEY_DOWN:
	case 'j':
		L->sel++;
		break;
	case KEY_PPAGE:
	case 'b':
		L->sel = L->sel > L->page ? L->sel - L->page : 0;
		break;
	case KEY_NPAGE:
	case ' ':
		L->sel += L->page;
		break;
	case KEY_HOME:
	case 'g':
		L->sel = 0;
		break;
	case KEY_END:
	case 'G':
		L->sel = L->nrows ? L->nrows - 1 : 0;
		break;
	case 'L' & 0x1f:
		clearok(curscr, TRUE);
		break;
	default:
		break;
	}
	/* A move chooses the row by position: forget the id until the redraw. */
	if (ch == KEY_UP || ch == KEY_DOWN || ch == 'j' || ch == 'k' || ch == KEY_PPAGE || ch == KEY_NPAGE ||
	    ch == 'b' || ch == ' ' || ch == KEY_HOME || ch == KEY_END || ch == 'g' || ch == 'G') {
		if (L->nrows && L->sel >= L->nrows)
			L->sel = L->nrows - 1;
		L->sel_id = L->nrows ? L->rows[L->sel].id : -1;
	}
	return 0;
}

static int start(char *why, size_t len)
{
	const char *term = getenv("TERM");
	struct sigaction sa;
	FILE *in = stdin;
	SCREEN *scr;
	char *cup;
	int err = 0;

	if (!term || !*term) {
		snprintf(why, len, "TERM is not set");
		return -1;
	}
	/*
	 * Ask terminfo first: newterm() on an unknown type leaks its half-made
	 * screen (LeakSanitizer sees it); setupterm() + del_curterm() do not.
	 */
	if (setupterm(term, STDOUT_FILENO, &err) != OK) {
		snprintf(why, len, err == 0 ? "unknown terminal type '%s'" : "no terminfo database for '%s'", term);
		return -1;
	}
	cup = tigetstr("cup");
	del_curterm(cur_term);
	if (!cup || cup == (char *)-1) {
		snprintf(why, len, "terminal type '%s' cannot move the cursor", term);
		return -1;
	}
	/*
	 * The size from the tty, never $LINES/$COLUMNS: exported, they would pin
	 * it across SIGWINCH (and with use_env(FALSE) or use_tioctl(TRUE),
	 * ncurses 6.4 did not follow SIGWINCH at all when tried).
	 */
	unsetenv("LINES");
	unsetenv("COLUMNS");
	/* Keys from the terminal even when stdin is not one (a file at EOF would never block). */
	if (!isatty(STDIN_FILENO) && !(in = fopen("/dev/tty", "re"))) {
		snprintf(why, len, "no terminal to read keys from: /dev/tty: %s", strerror(errno));
		return -1;
	}
	scr = newterm(term, stdout, in);
	if (!scr) {
		snprintf(why, len, "cannot use terminal type '%s'", term);
		if (in != stdin)
			fclose(in);
		return -1;
	}
	live_scr = scr;
	live_in = in;
	live_active = 1;
	atexit(live_atexit);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = live_on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	cbreak();
	noecho();
	nonl();
	keypad(stdscr, TRUE);
	idcok(stdscr, FALSE);
	leaveok(stdscr, TRUE);
	curs_set(0);
	return 0;
}

int live_run(struct sr *s, const struct opts *o, char *why, size_t len)
{
	struct live L = { .s = s, .o = o, .interval = o->interval, .hist_src = -1, .sel_id = -1 };
	uint64_t last = 0;
	int r, dirty = 1, lost = 0;

	if (start(why, len) < 0)
		return LIVE_UNAVAILABLE;
	while (!live_stop) {
		uint64_t now = now_ns(), next = last + (uint64_t)(L.interval * 1e9), wait_ms;
		int ch;

		if (!L.paused && (!L.have_cur || now >= next)) {
			if (sr_follow(L.s)) {
				/* A new broker: no rates against the old one's counters, its shards' count may differ. */
				if (L.have_cur)
					sr_snap_free(&L.sn);
				if (L.have_prev)
					sr_snap_free(&L.ps);
				L.have_cur = L.have_prev = 0;
				L.hist_src = -1;
			}
			/* The file shrank under the view: nothing left to show (said once the screen is left). */
			lost = sample(&L) == -ENODATA ? -ENODATA : 0;
			if (lost)
				break;
			last = now;
			next = now + (uint64_t)(L.interval * 1e9);
			dirty = 1;
		}
		if (dirty && L.have_cur)
			draw(&L);
		dirty = 0;
		/* At most 100 ms: the stop flag is polled, a signal need not interrupt getch(). */
		wait_ms = L.paused || next <= now ? 100 : (next - now) / 1000000 + 1;
		timeout((int)(wait_ms < 100 ? wait_ms : 100));
		ch = getch();
		if (ch == ERR && now_ns() - now < 2000000) {
			/* ERR at once (input gone, or a signal): wait anyway, never spin */
			struct timespec ts = { 0, 50000000 };

			nanosleep(&ts, NULL);
		}
		if (ch == ERR)
			continue;
		if (key(&L, ch))
			break;
		dirty = 1;              /* a key or KEY_RESIZE (SIGWINCH): redraw now */
	}
	live_atexit();
	r = SR_EXIT_OK;
	if (lost) {
		sr_perror(PROG, L.s, lost);
		r = SR_EXIT_NOSHM;
	} else if (L.have_cur) {
		enum sr_state st = sr_liveness(&L.sn, NULL);

		r = st == SR_RUNNING || st == SR_STARTING ? SR_EXIT_OK : SR_EXIT_NOT_RUNNING;
	}
	if (L.have_cur)
		sr_snap_free(&L.sn);
	if (L.have_prev)
		sr_snap_free(&L.ps);
	free(L.cur.v);
	free(L.prev.v);
	findex_free(&L.fx);
	free(L.rows);
	return r;
}
