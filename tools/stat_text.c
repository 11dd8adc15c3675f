/* SPDX-License-Identifier: MIT */
/* stat_text.c - chimestat's text: the live view's table and the flat -1 -f listing. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chimestat.h"

/* ---- text ---- */

void print_flat(FILE *out, const struct flist *l, const struct flist *prev,
		       const struct sr_snap *sn, const struct sr_snap *ps, const struct opts *o)
{
	size_t i;

	for (i = 0; i < l->n; i++) {
		const struct field *f = &l->v[i];

		if (f->prom_only || !selected(o, f->name))
			continue;
		fprintf(out, "%-36s ", f->name);
		switch (f->kind) {
		case F_COUNTER:
			fprintf(out, "%20" PRIu64 " %12.1f/s", f->u, field_rate(f, prev_of(prev, i, f->name), sn, ps));
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

/*
 * Values by name through the index: the table looks up a few per client,
 * and a scan of the list (~45 fields a client) each time made it O(clients^2).
 */
static uint64_t fval(const struct findex *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static uint64_t fval(const struct findex *x, const char *fmt, ...)
{
	char name[64];
	va_list ap;
	long i;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	i = findex_find(x, name);
	return i < 0 ? 0 : x->l->v[i].u;
}

/* Rate of a counter field by name between two field lists (prev NULL: an average, field_rate()). */
static double frate(const struct findex *x, const struct flist *prev, const struct sr_snap *sn,
		    const struct sr_snap *ps, const char *name)
{
	long i = findex_find(x, name);

	return i < 0 ? 0 : field_rate(&x->l->v[i], prev_of(prev, (size_t)i, name), sn, ps);
}

/* One lateness row from the fields <prefix>.count, .p50_ns .. .p99_9_ns, .max_ns. */
static void print_lat_row(FILE *out, const char *label, const struct findex *l, const char *prefix)
{
	char b[5][16];
	size_t i;

	for (i = 0; i < NR_PCTS; i++)
		sr_fmt_ns(b[i], sizeof(b[i]), fval(l, "%s.%s_ns", prefix, pcts[i].name));
	sr_fmt_ns(b[4], sizeof(b[4]), fval(l, "%s.max_ns", prefix));
	fprintf(out, "%-8s %10" PRIu64 " %9s %9s %9s %9s %9s\n", label, fval(l, "%s.count", prefix),
		b[0], b[1], b[2], b[3], b[4]);
}

void print_table(FILE *out, const struct flist *fields, const struct flist *prev,
			const struct sr_snap *sn, const struct sr_snap *ps)
{
	struct findex index = { 0 }, *l = &index;
	const struct chime_ctl *h = &sn->hdr;
	char up[32], hb[32], res[16], since[32], nd[24], name[64], every[40] = "", warn[512];
	const char *why;
	enum sr_state st = sr_liveness(sn, &why);
	uint32_t k, c;

	findex_build(&index, fields);
	sr_fmt_dur(up, sizeof(up), fval(l, "broker.uptime_ns"));
	sr_fmt_ns(hb, sizeof(hb), fval(l, "broker.heartbeat_age_ns"));
	sr_fmt_ns(res, sizeof(res), h->resolution_ns);
	if (h->beat_ms && (st == SR_RUNNING || st == SR_STARTING))      /* a dead broker's period is no promise */
		snprintf(every, sizeof(every), " (every %u ms%s)", h->beat_ms, h->beat_ms > SR_HEARTBEAT_MS ? ", at rest" : "");
	fprintf(out, "chimed pid %d  version %s  up %s  heartbeat %s ago%s  shards %u  resolution %s  ",
		(int)h->pid, h->version, up, hb, every, h->nr_shards, res);
	if (h->spin_us < 0)
		fprintf(out, "spin busy-poll  ");
	else if (h->spin_share)
		fprintf(out, "spin %" PRId64 "us (%u%%)  ", h->spin_us, h->spin_share);
	else
		fprintf(out, "spin %" PRId64 "us  ", h->spin_us);
	fprintf(out, "clients %" PRIu64 "/%" PRIu64 "  state %s%s\n", h->clients_now, h->clients_total,
		sr_state_name(h->state), st == SR_DEAD ? " (NOT RUNNING: last state shown)" : "");
	if (st == SR_DEAD || st == SR_STOPPED)
		fprintf(out, "*** %s ***\n", why);
	if (sn->clock_off)
		fprintf(out, "*** another time namespace: the broker's clock is %+.3f s from this one's (times shown on "
			"its clock); chime_open() here fails with EXDEV ***\n", (double)sn->clock_off / 1e9);
	if (h->stats_reset_gen && h->stats_reset_ns) {
		char ago[32];

		sr_fmt_dur(ago, sizeof(ago), fval(l, "broker.stats_reset_age_ns"));
		fprintf(out, "stats reset %s ago: lateness, its max and the sq/cq maxima count from then%s\n", ago,
			sn->reset_pending ? " (some shards have not applied it yet)" : "");
	}
	if (sn->torn)
		fprintf(out, "*** %u block(s) were being written by a writer that stopped: values may be inconsistent ***\n",
			sn->torn);
	if (sr_files_warning(h, warn, sizeof(warn)))
		fprintf(out, "*** %s ***\n", warn);
	fprintf(out, "%s\n", ps ? "" : "(rates: averages since start)");

	fprintf(out, "%5s %9s %7s %9s %9s %9s %9s %6s %7s %7s %12s %6s %9s %8s %9s %5s %10s\n",
		"shard", "armed", "wall", "arms/s", "resets/s", "cancel/s", "fires/s", "malf", "refused", "backlog",
		"sq wait/size", "sq max", "loops/s", "sleeps/s", "wakeups/s", "cpu%", "next");
	for (k = 0; k < h->nr_shards; k++) {
		const struct chime_shard_stats *s = &sn->shards[k];
		char sq[24];
		double busy;

		/* The thread's CPU time per second, as top shows it (spinning counts). */
		snprintf(name, sizeof(name), "shard.%u.cpu_ns", k);
		busy = frate(l, prev, sn, ps, name) / 1e7; /* ns per s -> percent */
		/* The fullest submission ring: records waiting, of its size. */
		snprintf(sq, sizeof(sq), "%" PRIu64 "/%" PRIu32, s->sq_depth, h->sq_size);
		/* The earliest armed deadline; ">=" when the slot was too big to scan (a lower bound). */
		if (s->next_deadline_ns == UINT64_MAX) {
			snprintf(nd, sizeof(nd), "-");
		} else if (s->next_deadline_ns <= sn->now_ns) {
			snprintf(nd, sizeof(nd), "due");
		} else {
			char t[16];

			sr_fmt_ns(t, sizeof(t), s->next_deadline_ns - sn->now_ns);
			snprintf(nd, sizeof(nd), "%s%s", s->next_inexact ? ">=" : "", t);
		}
#define R(f) (snprintf(name, sizeof(name), "shard.%u." f, k), frate(l, prev, sn, ps, name))
		fprintf(out, "%5u %9" PRIu64 " %7" PRIu64 " %9.0f %9.0f %9.0f %9.0f %6" PRIu64 " %7" PRIu64 " %7" PRIu64
			" %12s %6" PRIu64 " %9.0f %8.0f %9.0f %5.1f %10s\n",
			k, s->armed, s->armed_realtime, R("arms"), R("resets"), R("cancels"), R("fires"), s->malformed,
			s->refused_nomem + s->refused_quota, s->backlog, sq, s->sq_depth_max, R("loops"), R("sleeps"),
			R("wakeups"), busy, nd);
		if (s->reserve_failed)
			fprintf(out, "      shard %u: %" PRIu64 " slab reservations failed (filesystem full?)\n",
				k, s->reserve_failed);
#undef R
	}

	fprintf(out, "\n%-8s %10s %9s %9s %9s %9s %9s   %s\n", "lateness", "count", "p50", "p90", "p99", "p99.9",
		"max", h->stats_reset_gen ? "since the reset" : "since start");
	for (k = 0; k < h->nr_shards; k++) {
		char pre[40];

		snprintf(name, sizeof(name), "shard %u", k);
		snprintf(pre, sizeof(pre), "shard.%u.lateness", k);
		print_lat_row(out, name, l, pre);
	}
	print_lat_row(out, "all", l, "lateness");
	fprintf(out, "%-8s %10s %9s %9s %9s %9s %9s   %s\n", "", "", "", "", "", "", "", "last 10 s");
	for (k = 0; k < h->nr_shards; k++) {
		char pre[40];

		snprintf(name, sizeof(name), "shard %u", k);
		snprintf(pre, sizeof(pre), "shard.%u.lateness_10s", k);
		print_lat_row(out, name, l, pre);
	}
	print_lat_row(out, "all", l, "lateness_10s");

	fprintf(out, "\n%4s %7s %6s %-15s %9s %8s %8s %8s %8s %6s %7s %6s %8s %8s %8s %7s %s\n",
		"slot", "pid", "uid", "comm", "since", "armed", "arms/s", "fires/s", "cancels", "cq",
		"backlog", "sq", "lat p50", "p99", "max", "wakeups", "refused nomem/quota");
	for (c = 0; c < sn->nr_clients; c++) {
		const struct sr_client *cl = &sn->clients[c];

		sr_fmt_dur(since, sizeof(since), sn->now_ns > cl->id.connected_ns ? sn->now_ns - cl->id.connected_ns : 0);
		char lp[3][16];

		sr_fmt_ns(lp[0], sizeof(lp[0]), fval(l, "client.%u.lateness.p50_ns", cl->slot));
		sr_fmt_ns(lp[1], sizeof(lp[1]), fval(l, "client.%u.lateness.p99_ns", cl->slot));
		sr_fmt_ns(lp[2], sizeof(lp[2]), fval(l, "client.%u.lateness.max_ns", cl->slot));
		if (!fval(l, "client.%u.lateness.count", cl->slot))
			for (int j = 0; j < 3; j++)
				strcpy(lp[j], "-");     /* nothing fired yet: no lateness, not 0 */
#define R(f) (snprintf(name, sizeof(name), "client.%u." f, cl->slot), frate(l, prev, sn, ps, name))
		fprintf(out, "%4u %7d %6u %-15s %9s %8" PRIu64 " %8.0f %8.0f %8" PRIu64 " %6" PRIu64
			" %7" PRIu64 " %6" PRIu64 " %8s %8s %8s %7" PRIu64 " %" PRIu64 "/%" PRIu64 "%s\n",
			cl->slot, (int)cl->id.pid, cl->id.uid, cl->id.comm, since, cl->sum.armed, R("arms"),
			R("fires"), cl->sum.cancels, cl->sum.cq_depth, cl->sum.backlog, cl->sum.sq_depth,
			lp[0], lp[1], lp[2], cl->sum.wakeups,
			cl->sum.refused_nomem, cl->sum.refused_quota,
			cl->id.state == CHIME_CLIENT_DYING ? " (dying)" :
			cl->id.state == CHIME_CLIENT_DETACHED ? " (detached)" : "");
		if (cl->id.session[0])
			fprintf(out, "     session '%s'%s\n", cl->id.session,
				cl->id.state == CHIME_CLIENT_DETACHED ? ", no process attached" : "");
#undef R
	}
	if (!sn->nr_clients)
		fprintf(out, "(no clients)\n");
	findex_free(&index);
}
