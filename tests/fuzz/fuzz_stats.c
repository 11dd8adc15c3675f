/* SPDX-License-Identifier: MIT */
/*
 * fuzz_stats.c - libFuzzer target for what chimestat and chimectl read: a
 * control segment (<socket>.ctl). Whoever owns the socket's directory can
 * write it, so every count, offset, state, counter, histogram and name in it
 * is input.
 *
 * The input describes a segment: a flags byte, the shard and client counts,
 * which of the three offsets are taken from the input instead of the honest
 * layout, then patches (block, offset in the block, bytes) written over a
 * plausible segment (a running broker, clients in every state). With the
 * RAW flag the input is the whole file instead, its header stamped or not.
 * The file is written at <dir>/s.ctl and read through sr_open() and
 * sr_snapshot(), as the tools do, then collect() and every chimestat output:
 * JSON (-j), Prometheus (--prometheus), the flat listing (-1 -f) and the
 * table (-1), then chimectl's main() (-j clients, -j timers --session, and
 * timers --client as text) on the same segment and on shard files the
 * input may write (a header, a wheel whose geometry may come from the
 * input, nodes). After each input:
 *   - sr_open() accepts the segment or says why (-EBADMSG, -EAGAIN/-ESRCH,
 *     -EPROTO), nothing else;
 *   - the snapshot has at most max_clients clients, each in a listed state,
 *     with NUL-terminated printable names;
 *   - the JSON parses (jansson) and is an object with "shards", "clients";
 *   - every Prometheus line is a # HELP or # TYPE line or a sample
 *     `name{label="value",...} number`, label values escaped;
 *   - the text outputs carry no control character but newlines;
 *   - chimectl's JSON parses, its exit_status the one it exited with, and
 *     its text carries no control character but newlines.
 * A violation calls abort() so libFuzzer reports the input.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <sanitizer/common_interface_defs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chimestat.h"
#include "fuzz_input.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* flags (the input's first byte) */
#define RAW        1u   /* the rest of the input is the file */
#define STAMP      2u   /* RAW: write a valid header (magic, layout, kind, size) over it */
/* Leave odd seqs odd (a writer that died mid-update): 50 ms a snapshot, so only with all four high bits too. */
#define KEEP_ODD   0xf4u
#define BAD_SIZE   8u   /* the header's size is not the file's */

#define MAX_SHARDS  4u
#define MAX_CLIENTS 8u

static char dir[] = "/dev/shm/chime-fuzz-stats.XXXXXX", sock[64], path[72];
static int seg_fd = -1;

/* The shard files chimectl reads, from the last input. */
static void shard_files_remove(void)
{
	char p[sizeof(sock) + 16];

	for (uint32_t k = 0; k < MAX_SHARDS; k++) {
		snprintf(p, sizeof(p), "%s.shard%u", sock, k);
		unlink(p);
	}
}

static void cleanup(void)
{
	shard_files_remove();
	unlink(path);
	rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	snprintf(sock, sizeof(sock), "%s/s", dir);
	snprintf(path, sizeof(path), "%s.ctl", sock);
	seg_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(seg_fd >= 0, "open '%s': %s", path, strerror(errno));
	atexit(cleanup);
	/* Sanitizer reports go to this stderr even while chimectl's goes to /dev/null (chimectl()). */
	__sanitizer_set_report_fd((void *)(intptr_t)dup(2));
	return 0;
}

/* The input, read from the front; past its end, zeroes. */
static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

static void stamp(uint8_t *seg, uint64_t size)
{
	struct chime_seg_hdr *h = (struct chime_seg_hdr *)seg;

	h->magic = CHIME_SHM_MAGIC;
	h->layout = CHIME_SHM_LAYOUT;
	h->kind = CHIME_SEG_CONTROL;
	h->size = size;
}

/* Shard files for chimectl's `timers`: nodes per file, and where they are. */
#define SHARD_NODES 16u

/*
 * <sock>.shard0.. for `chimectl timers` (list_shard(): a header, a wheel,
 * the slab, every index bounded by the mapping): the nodes and, if the
 * input says, the wheel's geometry from the input. The same file for each
 * shard; none if the input does not ask (a missing file is an error too).
 */
static void shard_files(struct in *in, uint32_t nr)
{
	size_t size = sizeof(struct chime_shard_seg) + sizeof(struct chime_wheel) +
		      SHARD_NODES * sizeof(struct chime_node);
	uint8_t *f = calloc(1, size), geo = (uint8_t)take(in, 1), n = (uint8_t)take(in, 1) % (SHARD_NODES + 1);
	struct chime_shard_seg *h = (struct chime_shard_seg *)f;
	struct chime_wheel *w = (struct chime_wheel *)(f + sizeof(*h));
	struct chime_node *nodes = (struct chime_node *)(w + 1);
	char p[sizeof(sock) + 16];

	CHECK(f, "calloc");
	h->hdr.magic = CHIME_SHM_MAGIC;
	h->hdr.layout = CHIME_SHM_LAYOUT;
	h->hdr.kind = CHIME_SEG_SHARD;
	h->hdr.size = size;
	h->wheel_off = geo & 1 ? take(in, 8) : sizeof(*h);
	w->slab_off = geo & 2 ? take(in, 8) : sizeof(*w);
	w->capacity = geo & 4 ? (uint32_t)take(in, 4) : SHARD_NODES;
	w->high_water = geo & 8 ? (uint32_t)take(in, 4) : n;
	for (uint32_t i = 0; i < n; i++) {
		/* owner: a client slot of the table (or any); state any; the rest from the input */
		nodes[i].owner = (uint16_t)take(in, 1);
		nodes[i].state = (uint8_t)(take(in, 1) % 8);
		nodes[i].gen = (uint32_t)take(in, 1) | (geo & 16 ? CHIME_NODE_TOUCH : 0);
		nodes[i].deadline_ns = take(in, 1) * UINT64_C(1000000000);
		nodes[i].period_ns = take(in, 1) * UINT64_C(1000000);
		nodes[i].key = i;
		nodes[i].user_data = 0xfeed0000u + i;
	}
	for (uint32_t k = 0; k < (nr < MAX_SHARDS ? nr : MAX_SHARDS); k++) {
		int fd;

		snprintf(p, sizeof(p), "%s.shard%u", sock, k);
		fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		CHECK(fd >= 0 && write(fd, f, size) == (ssize_t)size, "write '%s': %s", p, strerror(errno));
		close(fd);
	}
	free(f);
}

/*
 * A segment as a running broker writes it, then the input's patches. Returns
 * its size; *seg is malloc'd.
 */
static size_t build(struct in *in, uint8_t flags, uint8_t **seg)
{
	uint32_t nr = (uint32_t)take(in, 1) % (MAX_SHARDS + 2), max = (uint32_t)take(in, 1) % (MAX_CLIENTS + 2);
	uint8_t raw_off = (uint8_t)take(in, 1);
	uint64_t shards_off = sizeof(struct chime_ctl), clients_off, cstats_off, size;
	uint32_t lay_nr, lay_max;
	struct chime_ctl *c;
	uint8_t *s;

	/* The last value of each count: one from the input, for the bounds sr_open() checks. */
	if (nr == MAX_SHARDS + 1)
		nr = (uint32_t)take(in, 4);
	if (max == MAX_CLIENTS + 1)
		max = (uint32_t)take(in, 4);
	/* The memory laid out: no more than the largest sane geometry. */
	lay_nr = nr <= MAX_SHARDS ? nr : MAX_SHARDS;
	lay_max = max <= MAX_CLIENTS ? max : MAX_CLIENTS;
	clients_off = shards_off + (uint64_t)lay_nr * sizeof(struct chime_shard_ctl);
	cstats_off = round_up(clients_off + (uint64_t)lay_max * sizeof(struct chime_client_ctl), 128);
	size = round_up(cstats_off + (uint64_t)lay_max * lay_nr * sizeof(struct chime_client_stats), 4096);
	s = calloc(1, size);
	CHECK(s, "calloc %llu", (unsigned long long)size);
	c = (struct chime_ctl *)s;
	c->state = CHIME_BROKER_RUNNING;
	c->pid = (int32_t)getpid();
	c->nr_shards = nr;
	c->max_clients = max;
	c->start_ns = 1;
	c->heartbeat_ns = now_ns();
	c->resolution_ns = 1000000;
	snprintf(c->version, sizeof(c->version), "0.1.0");
	c->shards_off = raw_off & 1 ? take(in, 8) : shards_off;
	c->clients_off = raw_off & 2 ? take(in, 8) : clients_off;
	c->client_stats_off = raw_off & 4 ? take(in, 8) : cstats_off;
	if (raw_off & 8)
		shard_files(in, nr);
	for (uint32_t i = 0; i < lay_max; i++) {
		struct chime_client_ctl *cc = (struct chime_client_ctl *)(s + clients_off) + i;

		cc->state = i % 4;      /* EMPTY, ACTIVE, DYING, DETACHED */
		cc->pid = (int32_t)(1000 + i);
		cc->generation = 1;
		snprintf(cc->comm, sizeof(cc->comm), "worker%u", i);
		if (i & 1)
			snprintf(cc->session, sizeof(cc->session), "sess-%u", i);
		for (uint32_t k = 0; k < lay_nr; k++)
			((struct chime_client_stats *)(s + cstats_off))[(uint64_t)i * lay_nr + k].generation = 1;
	}
	/* Patches: block (0 header, 1 shard, 2 client, 3 client stats) and index, offset in it, bytes. */
	while (in->n >= 4) {
		uint8_t sel = (uint8_t)take(in, 1), len = (uint8_t)take(in, 1) % 33;
		uint16_t off = (uint16_t)take(in, 2);
		uint64_t at;

		switch (sel % 4) {
		case 0:
			at = off % sizeof(struct chime_ctl);
			break;
		case 1:
			at = shards_off + (lay_nr ? sel / 4 % lay_nr : 0) * sizeof(struct chime_shard_ctl) +
			     off % sizeof(struct chime_shard_ctl);
			break;
		case 2:
			at = clients_off + (lay_max ? sel / 4 % lay_max : 0) * sizeof(struct chime_client_ctl) +
			     off % sizeof(struct chime_client_ctl);
			break;
		default:
			at = cstats_off + (lay_max * lay_nr ? sel / 4 % (lay_max * lay_nr) : 0) *
			     sizeof(struct chime_client_stats) + off % sizeof(struct chime_client_stats);
		}
		len = len < in->n ? len : (uint8_t)in->n;
		if (at + len <= size)
			memcpy(s + at, in->p, len);
		skip(in, len);
	}
	if ((flags & KEEP_ODD) != KEEP_ODD) {
		for (uint32_t k = 0; k < lay_nr; k++)
			((struct chime_shard_ctl *)(s + shards_off))[k].stats.seq &= ~UINT64_C(1);
		for (uint32_t i = 0; i < lay_max; i++)
			((struct chime_client_ctl *)(s + clients_off))[i].seq &= ~UINT64_C(1);
		for (uint64_t i = 0; i < (uint64_t)lay_max * lay_nr; i++)
			((struct chime_client_stats *)(s + cstats_off))[i].seq &= ~UINT64_C(1);
	}
	stamp(s, flags & BAD_SIZE ? size + 64 : size);
	*seg = s;
	return size;
}

static void write_seg(const uint8_t *seg, size_t size)
{
	CHECK(ftruncate(seg_fd, 0) == 0 && ftruncate(seg_fd, (off_t)size) == 0, "ftruncate: %s", strerror(errno));
	CHECK(pwrite(seg_fd, seg, size, 0) == (ssize_t)size, "pwrite: %s", strerror(errno));
}

/* NUL-terminated within len, and printable (chime_printable()'s promise: no byte below 0x20, nor 0x7f). */
static bool printable(const char *s, size_t len)
{
	size_t n = strnlen(s, len);

	if (n == len)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

static void check_snapshot(const struct sr *s, const struct sr_snap *sn)
{
	CHECK(sn->nr_clients <= s->max_clients, "%u clients of %u", sn->nr_clients, s->max_clients);
	CHECK(printable(sn->hdr.version, sizeof(sn->hdr.version)), "version not printable");
	for (uint32_t i = 0; i < sn->nr_clients; i++) {
		const struct sr_client *c = &sn->clients[i];

		CHECK(c->slot < s->max_clients && (i == 0 || c->slot > sn->clients[i - 1].slot),
		      "client %u: slot %u", i, c->slot);
		CHECK(c->id.state == CHIME_CLIENT_ACTIVE || c->id.state == CHIME_CLIENT_DYING ||
		      c->id.state == CHIME_CLIENT_DETACHED, "client %u: state %u", i, c->id.state);
		CHECK(printable(c->id.comm, sizeof(c->id.comm)), "client %u: comm not printable", i);
		CHECK(printable(c->id.session, sizeof(c->id.session)), "client %u: session not printable", i);
	}
}

/* A metric or label name: [a-zA-Z_:][a-zA-Z0-9_:]* (labels: no ':'). Returns its end. */
static const char *prom_name(const char *p, bool label)
{
	const char *s = p;

	while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (!label && *p == ':') ||
	       (p > s && *p >= '0' && *p <= '9'))
		p++;
	return p > s ? p : NULL;
}

/* A sample value: a float strtod reads whole, or +Inf, -Inf, NaN. */
static bool prom_value(const char *p)
{
	char *end;

	if (!strcmp(p, "+Inf") || !strcmp(p, "-Inf") || !strcmp(p, "NaN"))
		return true;
	errno = 0;
	(void)strtod(p, &end);
	return *p && *p != ' ' && !*end && (isdigit((unsigned char)*p) || *p == '-' || *p == '+');
}

static void check_prom_line(const char *l)
{
	const char *p;

	if (!strncmp(l, "# HELP ", 7) || !strncmp(l, "# TYPE ", 7)) {
		p = prom_name(l + 7, false);
		CHECK(p && *p == ' ', "prometheus: '%s'", l);
		if (l[2] == 'T')
			CHECK(!strcmp(p + 1, "counter") || !strcmp(p + 1, "gauge") || !strcmp(p + 1, "histogram") ||
			      !strcmp(p + 1, "summary") || !strcmp(p + 1, "untyped"), "prometheus type: '%s'", l);
		return;
	}
	p = prom_name(l, false);
	CHECK(p, "prometheus: no metric name: '%s'", l);
	if (*p == '{') {
		p++;
		while (*p != '}') {
			p = prom_name(p, true);
			CHECK(p && p[0] == '=' && p[1] == '"', "prometheus label: '%s'", l);
			for (p += 2; *p != '"'; p++) {
				CHECK(*p && *p != '\n', "prometheus: unterminated label value: '%s'", l);
				if (*p == '\\') {
					p++;
					CHECK(*p == '\\' || *p == '"' || *p == 'n', "prometheus escape: '%s'", l);
				}
			}
			p++;
			CHECK(*p == ',' || *p == '}', "prometheus labels: '%s'", l);
			p += *p == ',';
		}
		p++;
	}
	CHECK(*p == ' ' && prom_value(p + 1), "prometheus value: '%s'", l);
}

static void check_prom(char *text)
{
	for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
		check_prom_line(l);
}

static void check_json(const char *text)
{
	json_error_t err;
	json_t *doc = json_loads(text, 0, &err);

	CHECK(doc, "JSON does not parse: %s (line %d col %d): %s", err.text, err.line, err.column, text);
	CHECK(json_is_object(doc) && json_is_array(json_object_get(doc, "shards")) &&
	      json_is_array(json_object_get(doc, "clients")), "JSON: %s", text);
	json_decref(doc);
}

static void check_text(const char *text, size_t len, const char *what)
{
	CHECK(strlen(text) == len, "%s: a NUL byte in the output", what);
	for (size_t i = 0; i < len; i++)
		CHECK((unsigned char)text[i] >= 0x20 || text[i] == '\n', "%s: control byte 0x%02x: %s", what,
		      (unsigned char)text[i], text);
}

/* Run one output into memory; check(): its invariant. */
static void run_output(int which, const struct flist *l, const struct sr_snap *sn, const struct opts *o)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	CHECK(f, "open_memstream");
	switch (which) {
	case 0:
		print_json(f, l, o, &(struct json_end){ .socket = "fuzz" });
		break;
	case 1:
		print_prom(f, l, o);
		break;
	case 2:
		print_flat(f, l, NULL, sn, NULL, o);
		break;
	default:
		print_table(f, l, NULL, sn, NULL);
	}
	CHECK(fclose(f) == 0, "fclose");
	switch (which) {
	case 0:
		check_json(text);
		break;
	case 1:
		check_text(text, len, "prometheus");
		check_prom(text);
		break;
	default:
		check_text(text, len, which == 2 ? "flat" : "table");
	}
	free(text);
}

/*
 * chimectl (its main(), compiled as chimectl_main) on the same files: its
 * output into a file, its complaints into /dev/null (a sanitizer's report
 * still shows: LLVMFuzzerInitialize()). Returns what it wrote (malloc'd,
 * NUL-terminated).
 */
int chimectl_main(int argc, char **argv);

static char *chimectl(int argc, char **argv, int *status)
{
	static int out = -1, null = -1;
	int saved_out, saved_err;
	char *text;
	off_t len;

	if (out < 0) {
		char p[sizeof(path) + 8];

		snprintf(p, sizeof(p), "%s.out", sock);
		out = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		unlink(p);
		null = open("/dev/null", O_WRONLY | O_CLOEXEC);
		CHECK(out >= 0 && null >= 0, "open: %s", strerror(errno));
	}
	/* Empty, and written from its start (the offset is the descriptor's, shared with its dup). */
	CHECK(ftruncate(out, 0) == 0 && lseek(out, 0, SEEK_SET) == 0, "ftruncate");
	fflush(stdout);
	fflush(stderr);
	saved_out = dup(1);
	saved_err = dup(2);
	dup2(out, 1);
	dup2(null, 2);
	optind = 0;             /* getopt starts over (glibc) */
	*status = chimectl_main(argc, argv);
	fflush(stdout);
	fflush(stderr);
	dup2(saved_out, 1);
	dup2(saved_err, 2);
	close(saved_out);
	close(saved_err);
	len = lseek(out, 0, SEEK_END);
	text = malloc((size_t)len + 1);
	CHECK(text && pread(out, text, (size_t)len, 0) == len, "read chimectl's output");
	text[len] = '\0';
	return text;
}

/* `chimectl -j clients` and `timers`: a JSON document that parses; `timers` as text, printable. */
static void run_chimectl(void)
{
	char *clients[] = { "chimectl", "-j", "--socket", sock, "clients", NULL };
	char *by_session[] = { "chimectl", "-j", "--socket", sock, "timers", "--session", "sess-1", NULL };
	char *by_pid[] = { "chimectl", "--socket", sock, "timers", "--client", "1002", "-n", "0", NULL };
	json_error_t err;
	json_t *doc;
	char *text;
	int st;

	for (int i = 0; i < 2; i++) {
		text = i ? chimectl(7, by_session, &st) : chimectl(5, clients, &st);
		doc = json_loads(text, 0, &err);
		CHECK(doc && json_is_object(doc) && json_integer_value(json_object_get(doc, "exit_status")) == st,
		      "chimectl %s: JSON: %s: %s", i ? "timers" : "clients", err.text, text);
		json_decref(doc);
		free(text);
	}
	text = chimectl(8, by_pid, &st);
	check_text(text, strlen(text), "chimectl timers");
	free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint8_t flags = (uint8_t)take(&in, 1), *seg;
	struct opts o = { .pid = -1, .uid = -1 };
	struct flist l = { 0 };
	struct sr_snap sn;
	struct sr s;
	size_t len;
	int r;

	shard_files_remove();
	if (flags & RAW) {
		len = in.n;
		seg = malloc(len ? len : 1);
		CHECK(seg, "malloc");
		memcpy(seg, in.p, len);
		if ((flags & STAMP) && len >= sizeof(struct chime_seg_hdr))
			stamp(seg, flags & BAD_SIZE ? len + 64 : len);
	} else {
		len = build(&in, flags, &seg);
	}
	write_seg(seg, len);
	free(seg);
	r = sr_open(&s, sock);
	CHECK(r == 0 || r == -EBADMSG || r == -EAGAIN || r == -ESRCH || r == -EPROTO, "sr_open: %d", r);
	if (r < 0)
		return 0;
	CHECK(sr_snapshot(&s, &sn) == 0, "sr_snapshot");
	check_snapshot(&s, &sn);
	(void)sr_liveness(&sn, NULL);
	collect(&l, &sn);
	for (int which = 0; which < 4; which++)
		run_output(which, &l, &sn, &o);
	run_chimectl();
	free(l.v);
	sr_snap_free(&sn);
	sr_close(&s);
	return 0;
}
