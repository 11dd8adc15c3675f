/* SPDX-License-Identifier: MIT */
/*
 * chimestat.h - what chimestat's parts share: the one list of fields that
 * collect() builds from a snapshot (stat_fields.c), and the outputs that
 * print it (stat_json.c, stat_prom.c, stat_text.c, and the live view on a
 * terminal, stat_live.c). chimestat.c has main(), the options and the plain
 * periodic output (when stdout is not a terminal).
 */
#ifndef CHIME_CHIMESTAT_H
#define CHIME_CHIMESTAT_H

#include <stdint.h>
#include <stdio.h>

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
	int prom_only;              /* a Prometheus series with no place in JSON or text */
	const char *suffix;         /* appended to the family for this sample: "_sum", "_count" (a summary) */
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
	/* client filters (-1 / NULL: any) */
	long pid;
	long uid;
	const char *comm;
};

/* Lateness percentiles reported for every histogram. */
#define NR_PCTS 4
struct stat_pct {
	const char *name;
	double p;
};
extern const struct stat_pct pcts[NR_PCTS];

/* The fields of a list sorted by name, to find one in O(log n): an output looks many up. */
struct findex {
	const struct flist *l;
	size_t *ix;
	size_t n, cap;
};

/* chimestat.c: --pid, --uid, --comm: drop the other clients from a snapshot. */
void keep_clients(struct sr_snap *sn, const struct opts *o);

/* stat_fields.c */
struct field *field_add(struct flist *l, enum fkind kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void fprom(struct field *f, const char *fam, const char *type, const char *help,
	   const char *labels, double scale);
void collect(struct flist *l, const struct sr_snap *sn);
int selected(const struct opts *o, const char *name);
const struct field *prev_of(const struct flist *prev, size_t idx, const char *name);
/*
 * A counter's rate per second: against p, its value in the previous sample ps
 * (NULL: none), else an average since the broker started; a client's only
 * against the same client's value (a slot reused in between is not) and,
 * an anonymous one's, since it connected.
 */
double field_rate(const struct field *f, const struct field *p, const struct sr_snap *sn,
		  const struct sr_snap *ps);
/* (Re)build x over l, as it is now; findex_find(): the index in l of the field `name`, or -1. */
void findex_build(struct findex *x, const struct flist *l);
long findex_find(const struct findex *x, const char *name);
void findex_free(struct findex *x);

/* stat_json.c: -j's document; end (NULL: none) its envelope, as chimectl -j's. */
struct json_end {
	const char *socket;     /* NULL: none known */
	int status;             /* the exit status */
	const char *error;      /* NULL on success: the message on stderr, without "chimestat: " */
};
void print_json(FILE *out, const struct flist *l, const struct opts *o, const struct json_end *end);
void print_value(FILE *out, const struct field *f);

/* stat_prom.c */
void print_prom(FILE *out, const struct flist *l, const struct opts *o);

/* stat_text.c */
void print_flat(FILE *out, const struct flist *l, const struct flist *prev,
		const struct sr_snap *sn, const struct sr_snap *ps, const struct opts *o);
void print_table(FILE *out, const struct flist *l, const struct flist *prev,
		 const struct sr_snap *sn, const struct sr_snap *ps);

/*
 * stat_live.c: the live view on ncurses until q or SIGINT/SIGTERM/SIGHUP;
 * returns the exit status (SR_EXIT_NOT_RUNNING if the broker was not running
 * at the last sample), or LIVE_UNAVAILABLE with the reason in why[] if the
 * terminal cannot do it (nothing was drawn: print plain frames instead).
 */
#define LIVE_UNAVAILABLE (-1)
int live_run(struct sr *s, const struct opts *o, char *why, size_t len);

#endif /* CHIME_CHIMESTAT_H */
