/* SPDX-License-Identifier: MIT */
/* stat_json.c - chimestat -j: the field list as one JSON document (libjansson). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "chime_config.h"
#include "chimestat.h"

/* ---- JSON (jansson: escaping, UTF-8 and nesting done by a well-kept library) ---- */

/*
 * Names come printable UTF-8 from sr_snapshot() (chime_printable()); any
 * other string keeps its valid UTF-8 and has each invalid byte replaced
 * with U+FFFD, so the document is always valid.
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
 * The document: {"version", "timestamp" (Unix time, s), "socket", "ok",
 * "exit_status", "error" (on failure), "broker": {...}, "shards":
 * [{"shard": N, ...}], "clients": [{"slot": S, ...}] (always an array,
 * empty with no clients), "lateness": {...}}. A field name
 * "shard.N.lateness.p99_ns" becomes shards[i].lateness.p99_ns. l NULL: a
 * failure before any counters were read, the envelope alone (as chimectl
 * -j's: a script is told why, not handed an empty stdout).
 */
void print_json(FILE *out, const struct flist *l, const struct opts *o, const struct json_end *end)
{
	struct timespec rt;
	json_t *doc, *shards, *clients;

	doc = json_pack("{s:s}", "version", CHIME_VERSION);
	if (end) {
		json_object_set_new(doc, "socket", end->socket ? json_text(end->socket) : json_null());
		json_object_set_new(doc, "ok", json_boolean(end->status == SR_EXIT_OK));
		json_object_set_new(doc, "exit_status", json_integer(end->status));
		if (end->error)
			json_object_set_new(doc, "error", json_text(end->error));
	}
	if (!l)
		goto print;
	clock_gettime(CLOCK_REALTIME, &rt);
	json_object_set_new(doc, "timestamp", json_real((double)rt.tv_sec + (double)rt.tv_nsec / 1e9));
	shards = json_array();
	clients = json_array();
	json_object_set_new(doc, "shards", shards);
	json_object_set_new(doc, "clients", clients);
	for (size_t i = 0; i < l->n; i++) {
		const struct field *f = &l->v[i];
		char name[sizeof(f->name)], *save = NULL, *part[4];
		int n = 0;
		json_t *at;

		if (f->prom_only || !selected(o, f->name))
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
print:
	json_dumpf(doc, out, JSON_COMPACT | JSON_REAL_PRECISION(17));
	fputc('\n', out);
	json_decref(doc);
}

/* One value as JSON text (the flat listing's strings and specials). */
void print_value(FILE *out, const struct field *f)
{
	json_t *j = json_field(f);

	json_dumpf(j, out, JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(j);
}
