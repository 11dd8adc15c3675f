/* SPDX-License-Identifier: MIT */
/*
 * sessfile.c - the sessions file. See sessfile.h.
 */
#include "sessfile.h"

#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t sessfile_hash(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = UINT64_C(0xcbf29ce484222325);

	while (n--) {
		h ^= *b++;
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

/* Where the header's copy is: after the records. */
static off_t copy_at(uint32_t max_clients)
{
	return (off_t)sizeof(struct sessfile_hdr) + (off_t)max_clients * (off_t)sizeof(struct sessfile_rec);
}

uint64_t sessfile_size(uint32_t max_clients)
{
	return (uint64_t)copy_at(max_clients) + sizeof(struct sessfile_hdr);
}

static bool hdr_valid(const struct sessfile_hdr *h)
{
	return h->magic == SESSFILE_MAGIC && h->check == sessfile_hash(h, offsetof(struct sessfile_hdr, check));
}

int sessfile_boot_id(char out[40])
{
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC), err;
	ssize_t n;

	memset(out, 0, 40);
	/*
	 * No /proc mounted (a chroot, test_daemon's case), or a sandbox that
	 * refuses it: "", unknown, as every broker there writes it (and a
	 * file of another boot is then taken for this one's, as before).
	 * Anything else (no descriptor left, no memory) passes: an error.
	 */
	if (fd < 0)
		return errno == ENOENT || errno == EACCES || errno == EPERM ? 0 : -errno;
	n = read(fd, out, 39);
	err = errno;
	close(fd);
	if (n < 0)
		return -err;
	while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == 0))
		out[--n] = 0;
	return 0;
}

static bool rec_valid(const struct sessfile_rec *r, uint32_t slot)
{
	int len = chime_session_len(r->name);

	if (r->check != sessfile_hash(r, offsetof(struct sessfile_rec, check)) || r->used != 1 || r->slot != slot)
		return false;
	if (len < 1)
		return false;
	for (int i = len; i < (int)CHIME_SESSION_MAX; i++)
		if (r->name[i])
			return false;
	return true;
}

static int name_cmp(const void *pa, const void *pb, void *recs)
{
	const struct sessfile_rec *r = recs;

	return strncmp(r[*(const uint32_t *)pa].name, r[*(const uint32_t *)pb].name, CHIME_SESSION_MAX);
}

/*
 * Records of one name in two slots or more: each sealed, so written whole by
 * a broker, but one of them is stale (a clear that failed, EIO on a disk
 * going bad) and nothing in the file says which. Taken both, the next broker
 * had two sessions of that name: a process re-opening it got the first slot,
 * perhaps the stale one, and lost the timers of the other without a word.
 * Dropped both, its process learns (-ESTALE for a resume) and their timers
 * are freed as anonymous ones. Sorted by name: O(n log n) for 65536 slots.
 * Returns the records dropped, or -ENOMEM.
 */
static int drop_duplicates(struct sessfile_rec *recs, uint32_t max_clients, int n)
{
	uint32_t *by_name = malloc((size_t)(n ? n : 1) * sizeof(*by_name)), k = 0;
	int dropped = 0;

	if (!by_name)
		return -ENOMEM;
	for (uint32_t slot = 0; slot < max_clients; slot++)
		if (recs[slot].used)
			by_name[k++] = slot;
	qsort_r(by_name, k, sizeof(*by_name), name_cmp, recs);
	for (uint32_t i = 0, j; i < k; i = j) {
		for (j = i + 1; j < k && name_cmp(&by_name[i], &by_name[j], recs) == 0; j++)
			;
		for (uint32_t d = i; j - i > 1 && d < j; d++) {
			memset(&recs[by_name[d]], 0, sizeof(recs[0]));
			dropped++;
		}
	}
	free(by_name);
	return dropped;
}

/* Read exactly n bytes at off; a short file reads as zeroes. */
static int read_at(int fd, void *buf, size_t n, off_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	memset((char *)buf + got, 0, n - got);
	return 0;
}

/*
 * A file of another geometry or layout, its records in our format: does it
 * name no session? Read by its own geometry, whole, every record zero (a
 * damaged one is not nothing: it may be a session's). A broker killed
 * holding none leaves such a file, and refused, it kept a broker of other
 * options or another layout from starting, with nothing to keep.
 */
static bool names_nothing(int fd, const struct sessfile_hdr *h, off_t size)
{
	struct sessfile_rec rec;
	static const struct sessfile_rec zero;

	if (h->version != SESSFILE_VERSION || h->rec_size != sizeof(rec) || size < copy_at(h->geom.max_clients))
		return false;
	for (uint32_t slot = 0; slot < h->geom.max_clients; slot++)
		if (read_at(fd, &rec, sizeof(rec), (off_t)sizeof(*h) + (off_t)slot * (off_t)sizeof(rec)) < 0 ||
		    memcmp(&rec, &zero, sizeof(rec)) != 0)
			return false;
	return true;
}

int sessfile_load(const char *path, const struct sessfile_geom *g, struct sessfile_rec *recs,
		  uint32_t *bad, struct sessfile_info *info)
{
	struct sessfile_info local;
	struct sessfile_hdr h;
	struct stat st;
	char boot[40];
	int fd, r, n = 0;

	*bad = 0;
	if (!info)
		info = &local;
	memset(info, 0, sizeof(*info));
	/* O_NONBLOCK: a FIFO put at the path must not hang the start (a regular file ignores it). */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;    /* as sessfile_open() says */
		goto out;
	}
	if (!chime_seg_ours(&st)) {
		r = -EPERM;     /* another uid put it there: its sessions are nobody's to restore */
		goto out;
	}
	/* Held by the broker that writes it (sessfile_open()): that one still runs. */
	if (flock(fd, LOCK_SH | LOCK_NB) < 0) {
		r = errno == EWOULDBLOCK ? -EBUSY : -errno;
		goto out;
	}
	r = read_at(fd, &h, sizeof(h), 0);
	if (r < 0)
		goto out;
	/*
	 * One flipped bit in the header cost every session: its copy after
	 * the records (where our --max-clients puts it) stands in. A file of
	 * a broker before the copy has none there.
	 */
	if (!hdr_valid(&h)) {
		struct sessfile_hdr copy;

		r = read_at(fd, &copy, sizeof(copy), copy_at(g->max_clients));
		if (r < 0)
			goto out;
		r = -EBADMSG;
		if (!hdr_valid(&copy))
			goto out;
		h = copy;
		info->from_copy = true;
	}
	info->geom = h.geom;
	r = -EPROTO;
	if (h.version != SESSFILE_VERSION || h.rec_size != sizeof(struct sessfile_rec))
		goto out;
	/*
	 * Not read (no descriptor left): not "another boot", which discards
	 * every timer (found by failing the broker's calls in turn,
	 * tests/test_failstart.c), but a failure to start.
	 */
	r = sessfile_boot_id(boot);
	if (r < 0)
		goto out;
	/*
	 * Before the layout and the geometry: another boot's deadlines are no
	 * broker's to keep, and a reboot that brought another chimed or other
	 * options was refused, no broker started to discard them.
	 */
	r = -ESTALE;
	if (strncmp(boot, h.boot_id, sizeof(boot)) != 0)
		goto out;
	r = -EPROTO;
	if (h.geom.layout != g->layout) {
		info->empty = names_nothing(fd, &h, st.st_size);
		goto out;
	}
	r = -EMEDIUMTYPE;
	if (h.geom.nr_shards != g->nr_shards || h.geom.max_clients != g->max_clients ||
	    h.geom.capacity != g->capacity || h.geom.resolution_ns != g->resolution_ns) {
		info->empty = names_nothing(fd, &h, st.st_size);
		goto out;
	}
	info->mono_off = h.mono_off;
	/* Its deadlines are its time namespace's clock: read on ours, every one off by the difference. */
	r = -EXDEV;
	if ((h.flags & SESSFILE_F_MONO) && h.mono_off != chime_timens_monotonic())
		goto out;
	/*
	 * A broker writes every record, its room reserved: a shorter file was
	 * cut (a stray truncate, a copy that ran out of room). Its missing
	 * records read as empty slots, and the sessions they held went with
	 * their timers, without a word (cut at the header: all of them).
	 */
	r = -ENODATA;
	if (st.st_size < copy_at(g->max_clients))
		goto out;
	for (uint32_t slot = 0; slot < g->max_clients; slot++) {
		struct sessfile_rec rec;

		r = read_at(fd, &rec, sizeof(rec), (off_t)sizeof(h) + (off_t)slot * (off_t)sizeof(rec));
		if (r < 0)
			goto out;
		if (rec_valid(&rec, slot)) {
			recs[slot] = rec;
			n++;
			continue;
		}
		/* Zero is an empty slot; anything else was a record once. */
		for (size_t i = 0; i < sizeof(rec); i++) {
			if (((const uint8_t *)&rec)[i]) {
				(*bad)++;
				break;
			}
		}
	}
	r = drop_duplicates(recs, g->max_clients, n);
	if (r < 0)
		goto out;
	*bad += (uint32_t)r;
	r = n - r;
out:
	close(fd);
	return r;
}

static int write_at(int fd, const void *buf, size_t n, off_t off)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = pwrite(fd, (const char *)buf + done, n - done, off + (off_t)done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		done += (size_t)r;
	}
	return 0;
}

static void rec_seal(struct sessfile_rec *r)
{
	r->check = sessfile_hash(r, offsetof(struct sessfile_rec, check));
}

/* sessfile_open(); `tmp`: a new file is written unnamed, and named once complete. */
static int open_as(struct sessfile *sf, const char *path, const struct sessfile_geom *g,
		   const struct sessfile_rec *recs, bool tmp)
{
	struct sessfile_hdr h;
	size_t body = (size_t)g->max_clients * sizeof(struct sessfile_rec);
	off_t size = (off_t)sessfile_size(g->max_clients);
	struct sessfile_rec *all;
	bool created = false, unnamed = false;
	struct stat st;
	int r;

	sf->fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (sf->fd < 0 && errno == ENOENT) {
		/*
		 * A new one is named once written: created at its path, a broker
		 * killed before the header was written left an empty file, which
		 * the next broker refused as damaged (it did not start).
		 */
		sf->fd = tmp ? chime_seg_tmpfile(path, O_RDWR, 0600) : -EOPNOTSUPP;
		unnamed = sf->fd >= 0;
		if (sf->fd == -EOPNOTSUPP) {
			sf->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
			created = sf->fd >= 0;
		} else if (sf->fd < 0) {
			errno = -sf->fd;
			sf->fd = -1;
		}
	}
	if (sf->fd < 0)
		return -errno;
	sf->max_clients = g->max_clients;
	if (fstat(sf->fd, &st) < 0) {
		r = -errno;
		goto fail;
	}
	/* Another uid's file: it could write records in it under us, for the next broker. */
	if (!chime_seg_ours(&st)) {
		r = -EPERM;
		goto fail;
	}
	if (fchmod(sf->fd, 0600) < 0) {
		r = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;    /* a FIFO or device where the file should be */
		goto fail;
	}
	/*
	 * Held from now to the close: the lock that stays when the lock file
	 * goes (a cleanup of the directory). A broker started meanwhile finds
	 * it held (sessfile_load()) and does not take over files this one
	 * still runs on.
	 */
	if (flock(sf->fd, LOCK_EX | LOCK_NB) < 0) {
		r = errno == EWOULDBLOCK ? -EBUSY : -errno;
		goto fail;
	}
	memset(&h, 0, sizeof(h));
	/* Written without it, the file would read as another boot's to the next broker: its timers discarded. */
	r = sessfile_boot_id(h.boot_id);
	if (r < 0)
		goto fail;
	all = calloc(g->max_clients ? g->max_clients : 1, sizeof(*all));
	if (!all) {
		r = -ENOMEM;
		goto fail;
	}
	h.magic = SESSFILE_MAGIC;
	h.version = SESSFILE_VERSION;
	h.rec_size = sizeof(struct sessfile_rec);
	h.geom = *g;
	h.mono_off = chime_timens_monotonic();
	h.flags = SESSFILE_F_MONO;
	h.check = sessfile_hash(&h, offsetof(struct sessfile_hdr, check));
	for (uint32_t i = 0; i < g->max_clients; i++) {
		if (!recs[i].used)
			continue;
		all[i] = recs[i];
		all[i].slot = i;
		rec_seal(&all[i]);
	}
	/*
	 * In place, never unlink and create: the storage is already there (a full
	 * filesystem cannot take it), and at every instant each record is the
	 * earlier broker's or ours (128 B, never across a page), so a broker
	 * killed in here leaves the sessions it was taking over. A header that
	 * matches is rewritten unchanged; one that does not came with records of
	 * another geometry, which restart_load() discarded or refused.
	 */
	r = posix_fallocate(sf->fd, 0, size);
	/*
	 * A file of a broker before the header's copy has no room for it: on a
	 * full filesystem it is taken over without one rather than not at all.
	 */
	if (r == ENOSPC && st.st_size >= copy_at(g->max_clients)) {
		size = copy_at(g->max_clients);
		r = ftruncate(sf->fd, size) < 0 ? errno : 0;      /* what the failed call may have added */
	}
	if (r == 0 && st.st_size > size && ftruncate(sf->fd, size) < 0)
		r = errno;
	r = -r;
	if (r == 0)
		r = write_at(sf->fd, &h, sizeof(h), 0);
	if (r == 0)
		r = write_at(sf->fd, all, body, (off_t)sizeof(h));
	if (r == 0 && size > copy_at(g->max_clients))
		r = write_at(sf->fd, &h, sizeof(h), copy_at(g->max_clients));
	free(all);
	if (r == 0 && unnamed)
		r = chime_seg_link(sf->fd, path);
	if (r == 0)
		return 0;
fail:
	sessfile_close(sf);
	if (created)
		unlink(path);
	return r;
}

int sessfile_open(struct sessfile *sf, const char *path, const struct sessfile_geom *g,
		  const struct sessfile_rec *recs)
{
	int r = open_as(sf, path, g, recs, true);

	/* No /proc to name it by: created at its path, as without O_TMPFILE. */
	return r == -EOPNOTSUPP ? open_as(sf, path, g, recs, false) : r;
}

int sessfile_put(struct sessfile *sf, const struct sessfile_rec *r)
{
	struct sessfile_rec rec = *r;

	if (sf->fd < 0)
		return 0;
	if (rec.slot >= sf->max_clients)
		return -EINVAL;
	rec_seal(&rec);
	return write_at(sf->fd, &rec, sizeof(rec),
			(off_t)sizeof(struct sessfile_hdr) + (off_t)rec.slot * (off_t)sizeof(rec));
}

int sessfile_clear(struct sessfile *sf, uint32_t slot)
{
	struct sessfile_rec rec = { 0 };

	if (sf->fd < 0)
		return 0;
	if (slot >= sf->max_clients)
		return -EINVAL;
	return write_at(sf->fd, &rec, sizeof(rec),
			(off_t)sizeof(struct sessfile_hdr) + (off_t)slot * (off_t)sizeof(rec));
}

void sessfile_close(struct sessfile *sf)
{
	if (sf->fd >= 0)
		close(sf->fd);
	sf->fd = -1;
}
