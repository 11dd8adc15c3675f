/* SPDX-License-Identifier: MIT */
/* stat_prom.c - chimestat --prometheus: the field list in the text exposition format. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chimestat.h"

/* ---- Prometheus ---- */

static void prom_num(FILE *out, double v)
{
	if (isinf(v))
		fputs("+Inf", out);
	else
		fprintf(out, "%.17g", v);
}

void print_prom(FILE *out, const struct flist *l, const struct opts *o)
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
			fprintf(out, "%s%s{%s} ", g->prom, g->suffix ? g->suffix : "", g->labels);
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
