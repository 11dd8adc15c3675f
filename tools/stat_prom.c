/* SPDX-License-Identifier: MIT */
/* stat_prom.c - chimestat --prometheus: the field list in the text exposition format. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chimestat.h"

/* ---- Prometheus ---- */

/*
 * Nanoseconds as seconds, exactly (nanosecond resolution, trailing zeros
 * dropped): in binary, 21047282077 * 1e-9 is 21.047282077000002, and a
 * realtime stamp in ns has more digits than a double holds.
 */
static void prom_ns(FILE *out, int neg, uint64_t ns)
{
	uint32_t frac = (uint32_t)(ns % 1000000000u);
	int digits = 9;

	fprintf(out, "%s%" PRIu64, neg && ns ? "-" : "", ns / 1000000000u);
	if (!frac)
		return;
	for (; frac % 10 == 0; frac /= 10)
		digits--;
	fprintf(out, ".%0*" PRIu32, digits, frac);
}

/* Any other value: the shortest text that reads back as the same double. */
static void prom_num(FILE *out, double v)
{
	char b[32];

	if (isinf(v)) {
		fputs(v > 0 ? "+Inf" : "-Inf", out);
		return;
	}
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(b, sizeof(b), "%.*g", prec, v);
		if (strtod(b, NULL) == v)
			break;
	}
	fputs(b, out);
}

/* An integer times the field's scale: ns (scale 1e-9) exactly, others as a double. */
static void prom_scaled(FILE *out, int neg, uint64_t mag, double scale)
{
	if (scale == 1)
		fprintf(out, "%s%" PRIu64, neg && mag ? "-" : "", mag);
	else if (scale == 1e-9)
		prom_ns(out, neg, mag);
	else
		prom_num(out, (neg ? -1.0 : 1.0) * (double)mag * scale);
}

/* name[suffix]{labels}: no braces for no labels, as the format allows. */
static void prom_series(FILE *out, const char *name, const char *suffix, const char *labels)
{
	fprintf(out, "%s%s", name, suffix);
	if (*labels)
		fprintf(out, "{%s}", labels);
	fputc(' ', out);
}

/*
 * The families in the order of their first field. There are a few dozen,
 * all names from collect(); looking for each field's among the earlier
 * fields instead took O(fields^2): 27 s for 4096 clients named apart.
 */
static size_t prom_families(const struct flist *l, const char ***fams)
{
	size_t n = 0, cap = 0;

	*fams = NULL;
	for (size_t i = 0; i < l->n; i++) {
		const char *fam = l->v[i].prom;
		size_t k;

		for (k = 0; fam && k < n && strcmp((*fams)[k], fam); k++)
			;
		if (!fam || k < n)
			continue;
		if (n == cap) {
			const char **v = realloc(*fams, (cap = cap ? 2 * cap : 64) * sizeof(*v));

			if (!v) {
				fprintf(stderr, PROG ": out of memory\n");
				exit(SR_EXIT_NOSHM);
			}
			*fams = v;
		}
		(*fams)[n++] = fam;
	}
	return n;
}

void print_prom(FILE *out, const struct flist *l, const struct opts *o)
{
	const char **fams;
	size_t nf = prom_families(l, &fams), i, j;

	/* Each family once, with all its series together, as the format wants. */
	for (i = 0; i < nf; i++) {
		int seen = 0;

		for (j = 0; j < l->n; j++) {
			const struct field *g = &l->v[j];
			const char *sep;

			if (!g->prom || strcmp(g->prom, fams[i]) || !selected(o, g->name))
				continue;
			if (!seen) {
				fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", g->prom, g->help, g->prom, g->ptype);
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
					if (up == UINT64_MAX)
						prom_num(out, INFINITY);
					else
						prom_scaled(out, 0, up, g->scale);
					fprintf(out, "\"} %" PRIu64 "\n", cum);
				}
				prom_series(out, g->prom, "_sum", g->labels);
				prom_scaled(out, 0, g->hist_sum_ns, g->scale);
				fputc('\n', out);
				prom_series(out, g->prom, "_count", g->labels);
				fprintf(out, "%" PRIu64 "\n", cum);
				continue;
			}
			prom_series(out, g->prom, g->suffix ? g->suffix : "", g->labels);
			if (!strcmp(g->prom, "chime_broker_info"))
				fputs("1", out);
			else if (g->kind == F_INT)
				prom_scaled(out, g->i < 0, g->i < 0 ? -(uint64_t)g->i : (uint64_t)g->i, g->scale);
			else
				prom_scaled(out, 0, g->u, g->scale);
			fputc('\n', out);
		}
	}
	free(fams);
}
