/* SPDX-License-Identifier: MIT */
/*
 * fuzz_sessions.c - libFuzzer target for the sessions file a broker leaves
 * to the next one (<socket>.sessions): what a crash, a full disk or a stray
 * writer leaves there is read by restart_load() at the next start.
 *
 * The input describes the file: which header fields are right (magic,
 * version, record size, layout, geometry, boot id, checksum) and which come
 * from the input, and whether the header's copy follows the records; then
 * each slot's record (empty, or its fields from a few
 * meaningful values or raw bytes, sealed with a right checksum or not); then
 * where the file ends; then whether the file is there at all, --fresh, and
 * a shard file whose timers such a start counts for its message. With the
 * RAW flag the input is the sessions file itself. Then
 * the real restart_load() takes it over into a small broker's client
 * table, and restart_save() writes it back. Checked:
 *   - restart_load() takes the file or refuses it whole (one cut short,
 *     its header intact, included); taken, every slot
 *     it filled (DETACHED) holds a record that is valid by the broker's own
 *     rules (checksum, used, slot, a well-formed name), with that record's
 *     name, user and generation, and a linger no longer than its own; every
 *     such record is taken unless another holds its name too (then
 *     neither is); no two slots hold one session name;
 *   - restart_save() writes back exactly the sessions taken, and the file
 *     it writes loads again to the same records.
 * A violation calls abort() so libFuzzer reports the input.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "clock.h"
#include "sessfile.h"
#include "fuzz_input.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXC 8u
#define LINGER_S 30u

/* flags (the input's first byte) */
#define RAW       0x01u         /* the rest of the input is the file */
#define BAD_MAGIC 0x02u
#define BAD_VER   0x04u
#define BAD_GEOM  0x08u
#define BAD_BOOT  0x10u
#define BAD_CHECK 0x20u
#define CUT       0x40u         /* the file ends early */
#define COPY      0x80u         /* the header's copy after the records, as a broker writes it */

static struct broker B;
static char dir[] = "/dev/shm/chime-fuzz-sessions.XXXXXX";
static const struct sessfile_geom geom = {
	.nr_shards = 2, .max_clients = MAXC, .capacity = 64, .layout = CHIME_SHM_LAYOUT, .resolution_ns = 1000000,
};
static const char *names[] = { "a", "b", "job.1", "x-y_z" };

/* ---- what restart.c calls elsewhere in the broker ---- */

void table_set(struct broker *b, struct client *c, uint32_t state)
{
	(void)b;
	(void)c;
	(void)state;
}

/* No pidfd is opened here (holder_watch() is the control thread's): nothing to close. */
void holder_unwatch(struct client *c)
{
	c->holder_pidfd = -1;
	c->holder_watched = false;
}

bool keep_file(int fd, const char *path, const char *lost, const struct chime_seg_range *keep, unsigned n)
{
	(void)fd;
	(void)path;
	(void)lost;
	(void)keep;
	(void)n;
	return true;
}

/* ---- the input ---- */

static void cleanup(void)
{
	char p[128];

	snprintf(p, sizeof(p), "%s/s.sessions", dir);
	unlink(p);
	for (uint32_t k = 0; k < geom.nr_shards; k++) {
		snprintf(p, sizeof(p), "%s/s.shard%u", dir, k);
		unlink(p);
	}
	rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	atexit(cleanup);
	snprintf(B.o.socket_path, sizeof(B.o.socket_path), "%s/s", dir);
	B.o.nr_shards = geom.nr_shards;
	B.o.max_clients = geom.max_clients;
	B.o.capacity = geom.capacity;
	B.o.resolution_ns = geom.resolution_ns;
	B.o.session_linger_s = LINGER_S;
	B.sess.fd = -1;
	B.clients = calloc(MAXC, sizeof(*B.clients));
	CHECK(B.clients, "calloc");
	return 0;
}

/* sessfile.c's rule for a record, restated. */
static bool rec_valid(const struct sessfile_rec *r, uint32_t slot)
{
	int len = chime_session_len(r->name);

	if (r->check != sessfile_hash(r, offsetof(struct sessfile_rec, check)) || r->used != 1 || r->slot != slot || len < 1)
		return false;
	for (int i = len; i < (int)CHIME_SESSION_MAX; i++)
		if (r->name[i])
			return false;
	return true;
}

/* The file the input describes; *len its length. */
static uint8_t *build(struct in *in, uint8_t flags, size_t *len)
{
	size_t size = sizeof(struct sessfile_hdr) + MAXC * sizeof(struct sessfile_rec) + (flags & COPY ? sizeof(struct sessfile_hdr) : 0);
	uint8_t *f = calloc(1, size);
	struct sessfile_hdr *h = (struct sessfile_hdr *)f;
	struct sessfile_rec *recs = (struct sessfile_rec *)(f + sizeof(*h));

	CHECK(f, "calloc");
	if (flags & COPY) {
		struct sessfile_hdr *c = (struct sessfile_hdr *)(f + sizeof(*h) + MAXC * sizeof(struct sessfile_rec));

		c->magic = SESSFILE_MAGIC;
		c->version = SESSFILE_VERSION;
		c->rec_size = sizeof(struct sessfile_rec);
		c->geom = geom;
		(void)sessfile_boot_id(c->boot_id);
		c->check = sessfile_hash(c, offsetof(struct sessfile_hdr, check));
	}
	h->magic = flags & BAD_MAGIC ? take(in, 8) : SESSFILE_MAGIC;
	h->version = flags & BAD_VER ? (uint32_t)take(in, 4) : SESSFILE_VERSION;
	h->rec_size = flags & BAD_VER ? (uint32_t)take(in, 4) : sizeof(struct sessfile_rec);
	h->geom = geom;
	if (flags & BAD_GEOM) {
		h->geom.layout = (uint32_t)take(in, 1);
		h->geom.nr_shards = (uint32_t)take(in, 1);
		h->geom.max_clients = (uint32_t)take(in, 4);
	}
	(void)sessfile_boot_id(h->boot_id);
	if (flags & BAD_BOOT)
		h->boot_id[byte(in) % sizeof(h->boot_id)] ^= (char)(1 | byte(in));
	h->check = flags & BAD_CHECK ? take(in, 8) : sessfile_hash(h, offsetof(struct sessfile_hdr, check));
	for (uint32_t i = 0; i < MAXC && in->n; i++) {
		struct sessfile_rec *r = &recs[i];
		uint8_t what = byte(in), nm = byte(in);

		if (what % 4 == 0)
			continue;               /* an empty slot */
		r->used = what & 4 ? (uint32_t)take(in, 4) : 1;
		r->slot = what & 8 ? (uint32_t)take(in, 4) : i;
		r->uid = 1000 + (what >> 4) % 3;
		r->gid = 100;
		r->generation = take(in, 2);
		/* 0: attached when the broker went; else any deadline, past, near or far ahead. */
		r->linger_until_ns = what & 16 ? take(in, 8) : (what & 32 ? now_ns() + 1000000000u : 0);
		if (nm % 8 < 4) {
			snprintf(r->name, sizeof(r->name), "%s", names[nm % 8]);
		} else {
			memcpy(r->name, in->p, in->n < 16 ? in->n : 16);
			skip(in, 16);
		}
		if (nm & 0x80)
			r->name[CHIME_SESSION_MAX - 1] = 'z';
		r->pid = (int32_t)(500 + i);
		r->token = nm & 0x40 ? 9 : 0;
		/* Mostly sealed: a record a broker wrote whole, whatever its fields say. */
		r->check = (what & 3) == 3 ? take(in, 8) : sessfile_hash(r, offsetof(struct sessfile_rec, check));
	}
	*len = flags & CUT ? (size_t)(take(in, 2) % (size + 1)) : size;
	return f;
}

static void write_file(const char *path, const uint8_t *f, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	CHECK(fd >= 0, "open '%s': %s", path, strerror(errno));
	CHECK(write(fd, f, len) == (ssize_t)len, "write: %s", strerror(errno));
	close(fd);
}

/*
 * What is left of the input: a shard file (a header, then any bytes) whose
 * timers a start without a sessions file, or with --fresh, counts for its
 * message (count_timers(): every bound checked, read-only). Returns
 * whether the sessions file is to go (the start finds none).
 */
static bool shard_file(struct in *in)
{
	uint8_t mode = byte(in);
	struct chime_shard_seg h = { 0 };
	size_t body = in->n, len = sizeof(h) + body;
	char path[128];
	uint8_t *f;

	B.o.fresh = mode & 2;
	if (!(mode & 4))
		return mode & 1;
	snprintf(path, sizeof(path), "%s/s.shard%u", dir, (mode >> 3) % geom.nr_shards);
	h.hdr.magic = CHIME_SHM_MAGIC;
	h.hdr.layout = CHIME_SHM_LAYOUT;
	h.hdr.kind = CHIME_SEG_SHARD;
	h.hdr.size = len;
	h.wheel_off = mode & 0x80 ? take(in, 8) : sizeof(h);
	body = in->n;
	len = sizeof(h) + body;
	h.hdr.size = len;
	f = malloc(len);
	CHECK(f, "malloc");
	memcpy(f, &h, sizeof(h));
	memcpy(f + sizeof(h), in->p, body);
	write_file(path, f, len);
	free(f);
	return mode & 1;
}

static void reset_broker(void)
{
	for (uint32_t i = 0; i < MAXC; i++) {
		free(B.clients[i].chans);
		memset(&B.clients[i], 0, sizeof(B.clients[i]));
		B.clients[i].slot = (uint16_t)i;
	}
	sessfile_close(&B.sess);
	B.clients_hi = 0;
	B.clients_now = B.clients_total = 0;
	B.restoring = false;
}

/* The file's record of slot i (zeroes past its end). */
static struct sessfile_rec rec_at(const uint8_t *f, size_t len, uint32_t i)
{
	struct sessfile_rec r = { 0 };
	size_t at = sizeof(struct sessfile_hdr) + i * sizeof(r);

	if (at < len)
		memcpy(&r, f + at, len - at < sizeof(r) ? len - at : sizeof(r));
	return r;
}

/* Does another valid record hold the name of slot i's? */
static bool recorded_twice(const uint8_t *f, size_t len, uint32_t i)
{
	struct sessfile_rec r = rec_at(f, len, i), o;

	for (uint32_t j = 0; j < MAXC; j++) {
		o = rec_at(f, len, j);
		if (j != i && rec_valid(&o, j) && !strncmp(o.name, r.name, sizeof(r.name)))
			return true;
	}
	return false;
}

/* What restart_load() took over, checked against the file it read (f: NULL if it was no sessions file of ours). */
static void check_taken(const uint8_t *f, size_t len, uint64_t before, uint64_t after)
{
	size_t at = sizeof(struct sessfile_hdr) + MAXC * sizeof(struct sessfile_rec);
	const struct sessfile_hdr *h = (const struct sessfile_hdr *)f, *copy = (const struct sessfile_hdr *)(f + at);
	bool sealed = h->magic == SESSFILE_MAGIC && h->check == sessfile_hash(h, offsetof(struct sessfile_hdr, check));
	/* A damaged header is read from its copy, when that one is there and sealed. */
	bool by_copy = !sealed && len >= at + sizeof(*copy) && copy->magic == SESSFILE_MAGIC &&
		       copy->check == sessfile_hash(copy, offsetof(struct sessfile_hdr, check));
	/* Whole: its header (or its copy) right, and a record per slot (a file cut short is refused). */
	bool whole;
	uint64_t n = 0;

	if (by_copy)
		h = copy;
	whole = len >= at && (sealed || by_copy) && h->version == SESSFILE_VERSION &&
		h->rec_size == sizeof(struct sessfile_rec) && !memcmp(&h->geom, &geom, sizeof(geom));

	for (uint32_t i = 0; i < MAXC; i++) {
		const struct client *c = &B.clients[i];
		struct sessfile_rec r = rec_at(f, len, i);

		CHECK(c->state == CL_FREE || c->state == CL_DETACHED, "slot %u: state %u", i, c->state);
		if (c->state == CL_FREE) {
			/* Not taken: no valid record, the whole file refused, or another valid record of its name. */
			CHECK(!whole || !B.restoring || !rec_valid(&r, i) || recorded_twice(f, len, i),
			      "slot %u: a valid record not taken", i);
			continue;
		}
		CHECK(!recorded_twice(f, len, i), "slot %u: session '%s' taken, recorded twice", i, c->session);
		n++;
		CHECK(whole && rec_valid(&r, i), "slot %u taken from an invalid record", i);
		CHECK(!memcmp(c->session, r.name, sizeof(r.name)) && c->cred.uid == r.uid && c->cred.gid == r.gid &&
		      c->generation == r.generation && c->holder_pid == r.pid && c->token == r.token,
		      "slot %u: not its record's session", i);
		CHECK(c->linger_until_ns > 0 && c->linger_until_ns <= after + LINGER_S * UINT64_C(1000000000) &&
		      (c->linger_until_ns == r.linger_until_ns || c->linger_until_ns >= before + LINGER_S * UINT64_C(1000000000)),
		      "slot %u: linger %llu from %llu", i, (unsigned long long)c->linger_until_ns,
		      (unsigned long long)r.linger_until_ns);
		for (uint32_t j = 0; j < i; j++)
			CHECK(B.clients[j].state != CL_DETACHED || strcmp(B.clients[j].session, c->session),
			      "slots %u and %u both hold session '%s'", j, i, c->session);
	}
	CHECK(B.clients_now == n, "clients_now %llu, %llu taken", (unsigned long long)B.clients_now,
	      (unsigned long long)n);
}

/* restart_save() writes back what was taken; loaded again, it is the same. */
static void check_saved(const char *path)
{
	static struct sessfile_rec got[MAXC];
	uint32_t bad = 0;
	int n;

	CHECK(restart_save(&B) == 0, "restart_save");
	sessfile_close(&B.sess);
	memset(got, 0, sizeof(got));
	n = sessfile_load(path, &geom, got, &bad, NULL);
	CHECK(n >= 0 && bad == 0, "the file written back: %d, %u bad", n, bad);
	for (uint32_t i = 0; i < MAXC; i++) {
		const struct client *c = &B.clients[i];

		CHECK((c->state == CL_DETACHED) == (got[i].used == 1), "slot %u: state %u, record used %u", i,
		      c->state, got[i].used);
		if (c->state == CL_DETACHED)
			CHECK(!strcmp(got[i].name, c->session) && got[i].uid == c->cred.uid &&
			      got[i].generation == c->generation && got[i].linger_until_ns == c->linger_until_ns,
			      "slot %u written back as another session", i);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint8_t flags = byte(&in), *f;
	char path[128];
	uint64_t before, after;
	size_t len;
	int r;

	snprintf(path, sizeof(path), "%s/s.sessions", dir);
	if (flags & RAW) {
		len = in.n;
		f = malloc(len ? len : 1);
		CHECK(f, "malloc");
		memcpy(f, in.p, len);
	} else {
		f = build(&in, flags, &len);
	}
	write_file(path, f, len);
	if (!(flags & RAW) && shard_file(&in))
		unlink(path);
	reset_broker();
	before = now_ns();
	r = restart_load(&B);
	after = now_ns();
	CHECK(r == 0 || r == -EMEDIUMTYPE || r == -EBADMSG || r == -EPROTO || r == -ENODATA || r == -EXDEV,
	      "restart_load: %d", r);
	/* Cut short (shorter than a broker writes it): refused, never a session taken from what is left. */
	CHECK(r != -ENODATA || len < sizeof(struct sessfile_hdr) + MAXC * sizeof(struct sessfile_rec), "a whole file refused as cut short");
	if (r == 0 && (B.o.fresh || access(path, F_OK) < 0))
		CHECK(B.clients_now == 0, "no sessions file, or --fresh, and %llu sessions taken",
		      (unsigned long long)B.clients_now);
	else if (r == 0)
		check_taken(f, len, before, after);
	else
		CHECK(B.clients_now == 0, "refused, and %llu sessions taken", (unsigned long long)B.clients_now);
	free(f);
	if (r == 0 && B.restoring) {
		for (uint32_t k = 0; k < geom.nr_shards; k++) {
			struct shard_session *ss = restart_shard_sessions(&B, k);

			CHECK(ss, "restart_shard_sessions");
			for (uint32_t i = 0; i < MAXC; i++)
				CHECK(!ss[i].ch == (B.clients[i].state != CL_DETACHED), "slot %u: channel", i);
			free(ss);
		}
		check_saved(path);
	}
	reset_broker();
	unlink(path);
	for (uint32_t k = 0; k < geom.nr_shards; k++) {
		snprintf(path, sizeof(path), "%s/s.shard%u", dir, k);
		unlink(path);
	}
	B.o.fresh = false;
	return 0;
}
