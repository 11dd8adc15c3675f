/* SPDX-License-Identifier: MIT */
/*
 * segment.c - create, seal, map and validate shared-memory segments, and
 * compute their layouts.
 *
 * Invariants:
 * - Every function returns 0 or -errno, prints nothing, and sets its
 *   out-parameters only on success; on failure nothing stays open or mapped.
 * - Layouts are pure arithmetic, the same on every side: every array starts
 *   on a 128-byte boundary (a cache line, and never on the adjacent-line
 *   prefetcher pair of a line another side writes), every size is checked
 *   for overflow, and segment sizes are rounded up to the page size (mmap
 *   maps whole pages; a rounded size makes the file size and the mapping
 *   agree, which chime_seg_check() insists on).
 * - A segment becomes valid when its magic is stored, last, with release
 *   (P1); a reader acquire-loads the magic before trusting the rest (P2).
 */
#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "atomics.h"

#include "ring.h"

/* glibc 2.36 lacks it; the kernel has had it since 5.1. */
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define SEG_ALIGN 128u

static int map_rw(int fd, size_t size, struct chime_map *map)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	map->base = p;
	map->size = size;
	return 0;
}

/* Size f to `size` bytes and map it read-write; on success hand out both. */
static int size_and_map(int f, size_t size, int *fd, struct chime_map *map)
{
	struct chime_map m;
	int r;

	if (ftruncate(f, (off_t)size) < 0)
		return -errno;
	r = map_rw(f, size, &m);
	if (r < 0)
		return r;
	*fd = f;
	*map = m;
	return 0;
}

int chime_seg_memfd(const char *name, size_t size, int *fd, struct chime_map *map)
{
	int f, r;

	if (!size || size > (size_t)INT64_MAX)
		return -EINVAL;
	f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (f < 0)
		return -errno;
	r = size_and_map(f, size, fd, map);
	if (r < 0)
		close(f);
	return r;
}

/*
 * unlink + O_CREAT|O_EXCL|O_NOFOLLOW rather than O_TRUNC: a stale file may
 * still be mapped by a tool (truncating it would SIGBUS that tool), and
 * O_EXCL never follows a symlink someone planted at the path. fchmod
 * applies `mode` exactly, whatever the umask.
 */
/* The directory holding `path` (a file in it, existing or not), into dir. */
static int dir_of(const char *path, char *dir, size_t len)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(dir, len, ".");
	else if (slash == path)
		snprintf(dir, len, "/");
	else if ((size_t)(slash - path) >= len)
		return -ENAMETOOLONG;
	else
		snprintf(dir, len, "%.*s", (int)(slash - path), path);
	return 0;
}

int chime_broker_trusted(const char *path, uid_t broker, uid_t client)
{
	char dir[PATH_MAX];
	struct stat st;
	int r;

	if (broker == 0 || broker == client)
		return 1;
	if ((r = dir_of(path, dir, sizeof(dir))) < 0)
		return r;
	if (stat(dir, &st) < 0)
		return -errno;
	return st.st_uid == broker;
}

int chime_seg_reopen_ro(int fd)
{
	char path[64];
	int ro;

	if (fchmod(fd, 0400) < 0)
		return -errno;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	return ro < 0 ? -errno : ro;
}

int chime_seg_punch(int fd, uint64_t off, uint64_t len)
{
	if (fd < 0 || !len)
		return 0;
	return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0 ? -errno : 0;
}

int chime_seg_discard(int fd, size_t size)
{
	return chime_seg_punch(fd, 0, size);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int chime_seg_populate_write(void *p, size_t len)
{
	int r;

	/* EINTR (a signal pending) and EAGAIN (a page busy) are the kernel's "again" */
	for (int tries = 0; (r = madvise(p, len, MADV_POPULATE_WRITE)) < 0 && (errno == EINTR || errno == EAGAIN) &&
	     tries < 100; tries++)
		;
	return r < 0 ? -errno : 0;
}

int chime_seg_populate(void *p, size_t bytes)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t from = (uintptr_t)p & ~(page - 1), to = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);
	int r;

	if (to <= from)
		return 0;
	r = chime_seg_populate_write((void *)from, to - from);
	if (r != -EINVAL)
		return r;
	/* Before Linux 5.14: a read fault allocates a shared memfd's page too (a SIGBUS if it cannot). */
	for (uintptr_t a = from; a < to; a += page)
		(void)*(volatile const char *)a;
	return 0;
}

int chime_seg_resident(const void *p, size_t bytes, unsigned char *vec)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t from = (uintptr_t)p & ~(page - 1), to = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);

	if (to <= from)
		return 0;
	return mincore((void *)from, to - from, vec) < 0 ? -errno : (int)((to - from) / page);
}

ssize_t chime_recv_behind_reset(int fd, struct msghdr *msg, int flags)
{
	ssize_t n = recvmsg(fd, msg, flags | MSG_DONTWAIT);

	if (n < 0)
		errno = ECONNRESET;
	return n;
}

const char *chime_socket_absent_why(const char *path)
{
	struct stat st;

	char ctl[PATH_MAX];

	if (stat(path, &st) < 0) {
		if (errno == ENOTDIR)
			return "a component of the path is not a directory";
		/*
		 * chimectl status said "is chimed running?" of a broker that ran,
		 * its socket removed (an operator audit). A constant: a buffer of
		 * this thread's (TLS in libchime, which links this file) kept
		 * libchime.so from loading with dlopen(), Python's too.
		 */
		if ((size_t)snprintf(ctl, sizeof(ctl), "%s.ctl", path) < sizeof(ctl) && stat(ctl, &st) == 0)
			return "no such file, but its PATH.ctl segment is there: a broker still running had its "
			       "socket removed (chimestat says whether it runs; chimectl restart makes the socket "
			       "again), or one that was killed left it";
		return "no such file: is chimed running?";
	}
	if (!S_ISSOCK(st.st_mode))
		return "it exists and is not a socket";
	return "a socket file left behind: chimed is not running, or did not stop cleanly";
}

const char *chime_socket_eacces_why(const char *path)
{
	if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0)
		return "the broker did not admit this user: see chimed --allow-uid, --allow-gid, --allow-all";
	if (errno == EACCES)
		return "this user may not reach the socket: its permissions or a directory's above it";
	return "the broker did not admit this user, or the socket's permissions refused it";
}

int chime_seg_dir_in_memory(const char *path, const char **fs, char *buf, size_t len)
{
	static const struct {
		unsigned long magic;
		const char *name;
		bool in_memory;
	} known[] = {
		{ TMPFS_MAGIC, "tmpfs", true },
		{ RAMFS_MAGIC, "ramfs", true },
		{ EXT4_SUPER_MAGIC, "ext4", false },      /* ext2 and ext3 too */
		{ XFS_SUPER_MAGIC, "xfs", false },
		{ BTRFS_SUPER_MAGIC, "btrfs", false },
		{ OVERLAYFS_SUPER_MAGIC, "overlayfs", false },
		{ NFS_SUPER_MAGIC, "nfs", false },
	};
	char dir[PATH_MAX];
	struct statfs st;
	int r;

	if ((r = dir_of(path, dir, sizeof(dir))) < 0)
		return r;
	if (statfs(dir, &st) < 0)
		return -errno;
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if ((unsigned long)st.f_type == known[i].magic) {
			*fs = known[i].name;
			return known[i].in_memory;
		}
	snprintf(buf, len, "0x%lx", (unsigned long)st.f_type);
	*fs = buf;
	return 0;
}

int chime_seg_reserve(int fd, uint64_t off, uint64_t len)
{
	int r;

	if (len == 0)
		return 0;
	/* posix_fallocate: fallocate(2) where the filesystem has it, else writes zeros. */
	do
		r = posix_fallocate(fd, (off_t)off, (off_t)len);
	while (r == EINTR);
	return -r;
}

/* a * b, or just under UINT64_MAX if that does not fit (UINT64_MAX says "no size") */
static inline uint64_t mul_sat(uint64_t a, uint64_t b)
{
	uint64_t r;

	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX - 1 : r;
}

uint64_t chime_fs_room(int fd, const char *path)
{
	struct statvfs v;
	uint64_t avail, keep;

	if ((fd >= 0 ? fstatvfs(fd, &v) : statvfs(path, &v)) < 0 || v.f_blocks == 0)
		return UINT64_MAX;
	/* in blocks, then bytes: the products can pass 2^64 (reviews, with a faked statvfs) */
	avail = v.f_bavail;
	keep = v.f_blocks / CHIME_FS_KEEP_DIV;
	return avail > keep ? mul_sat(avail - keep, v.f_frsize) : 0;
}

/*
 * Empty the file at path, if it is ours (chime_seg_ours(): a regular file
 * of one link, this user's or root's), before it is replaced: a reader that
 * still maps it (a chimestat left running) kept its pages, and on a full
 * filesystem the file replacing it found no room (a storage audit).
 */
static void empty_replaced(const char *path)
{
	struct stat st;
	int f;

	/* Not even opened otherwise: opening a device node can do something. */
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return;
	f = open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (f < 0)
		return;
	if (fstat(f, &st) == 0 && S_ISREG(st.st_mode) && chime_seg_ours(&st))
		(void)ftruncate(f, 0);
	close(f);
}

int chime_seg_file(const char *path, size_t size, size_t reserve, mode_t mode, int *fd,
		   struct chime_map *map)
{
	int f, r;

	if (!size || size > (size_t)INT64_MAX || reserve > size)
		return -EINVAL;
	empty_replaced(path);
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	f = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	if (f < 0)
		return -errno;
	r = fchmod(f, mode) < 0 ? -errno : 0;
	/* Before anything touches it: a page of a full filesystem would be SIGBUS. */
	if (r == 0 && ftruncate(f, (off_t)size) < 0)
		r = -errno;
	if (r == 0)
		r = chime_seg_reserve(f, 0, reserve);
	if (r == 0)
		r = size_and_map(f, size, fd, map);
	if (r < 0) {
		close(f);
		unlink(path);
	}
	return r;
}

bool chime_seg_ours(const struct stat *st)
{
	return (st->st_uid == geteuid() || st->st_uid == 0) && st->st_nlink <= 1;
}

int chime_seg_file_reopen(const char *path, size_t size, mode_t mode, int *fd, struct chime_map *map)
{
	struct chime_map m;
	struct stat st;
	int f, r;

	f = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (f < 0)
		return -errno;
	if (fstat(f, &st) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)
		r = -EMEDIUMTYPE;
	else if (!chime_seg_ours(&st))
		r = -EPERM;
	else if (fchmod(f, mode) < 0)
		r = -errno;
	else
		r = map_rw(f, size, &m);
	if (r < 0) {
		close(f);
		return r;
	}
	*fd = f;
	*map = m;
	return 0;
}

int chime_seg_named(int fd, const char *path)
{
	struct stat have, there;

	if (fstat(fd, &have) < 0)
		return -errno;
	/* lstat: a symlink at the path is another file; the next broker's O_NOFOLLOW would refuse it. */
	if (lstat(path, &there) < 0)
		return errno == ENOENT ? 0 : -errno;
	return there.st_dev == have.st_dev && there.st_ino == have.st_ino ? 1 : -EEXIST;
}

int chime_seg_unlink_named(int fd, const char *path)
{
	int r = chime_seg_named(fd, path);

	if (r == 1 && unlink(path) < 0 && errno != ENOENT)
		return -errno;
	return r == 1 ? 0 : r;
}

/* [off, end) of `in` to the same offsets of `out`, through this process: the fallback. */
static int copy_plain(int in, int out, off_t off, off_t end)
{
	char buf[65536];

	while (off < end) {
		size_t want = end - off < (off_t)sizeof(buf) ? (size_t)(end - off) : sizeof(buf);
		ssize_t n = pread(in, buf, want, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;    /* shorter than fstat said: the caller keeps it from changing */
		for (ssize_t done = 0; done < n;) {
			ssize_t w = pwrite(out, buf + done, (size_t)(n - done), off + done);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				return -errno;
			done += w;
		}
		off += n;
	}
	return 0;
}

/* [off, end) of `in` to the same offsets of `out`: in the kernel where it can, else copy_plain(). */
static int copy_range(int in, int out, off_t off, off_t end)
{
	while (off < end) {
		loff_t i = off, o = off;
		ssize_t n = copy_file_range(in, &i, out, &o, (size_t)(end - off), 0);

		if (n < 0 && errno == EINTR)
			continue;
		/* Not across these filesystems, or not by this kernel: by hand. */
		if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
			return copy_plain(in, out, off, end);
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		off += n;
	}
	return 0;
}

/* The data extents of `in` (SEEK_DATA, SEEK_HOLE) within [from, to) to `out`: its holes stay holes. */
static int copy_data(int in, int out, off_t from, off_t to)
{
	off_t off = from;

	while (off < to) {
		off_t data = lseek(in, off, SEEK_DATA), hole;
		int r;

		if (data < 0)
			return errno == ENXIO ? 0 : -errno;     /* ENXIO: no data past off */
		if (data >= to)
			return 0;
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			return -errno;
		if ((r = copy_range(in, out, data, hole < to ? hole : to)) < 0)
			return r;
		off = hole;
	}
	return 0;
}

/* The mode, group, size and kept data extents of `fd` (fstat in st) into the new file `out`. */
static int copy_into(int fd, const struct stat *st, int out, const struct chime_seg_range *keep, unsigned n)
{
	/* Its group too: --stats-group's, not ours or a setgid directory's, reads a shard file. */
	int r = fchown(out, (uid_t)-1, st->st_gid) < 0 || fchmod(out, st->st_mode & 07777) < 0 ? -errno : 0;

	if (r == 0 && ftruncate(out, st->st_size) < 0)
		r = -errno;
	for (unsigned i = 0; r == 0 && i < (keep ? n : 1); i++) {
		uint64_t from = keep ? keep[i].off : 0, to = (uint64_t)st->st_size;

		if (keep && keep[i].len < to - (from < to ? from : to))
			to = from + keep[i].len;        /* no overflow: it ends before the file does */
		if (to > (uint64_t)st->st_size)
			to = (uint64_t)st->st_size;
		if (from < to)
			r = copy_data(fd, out, (off_t)from, (off_t)to);
	}
	return r;
}

int chime_seg_tmpfile(const char *path, int flags, mode_t mode)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	int fd;

	if (!slash || (size_t)(slash - path) >= sizeof(dir))
		return -EOPNOTSUPP;
	snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	fd = open(dir, O_TMPFILE | flags | O_CLOEXEC, mode);
	if (fd < 0)
		return errno == EISDIR || errno == EINVAL ? -EOPNOTSUPP : -errno;
	return fd;
}

int chime_seg_link(int fd, const char *path)
{
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0)
		return 0;
	return errno == ENOENT && access("/proc/self/fd", F_OK) < 0 ? -EOPNOTSUPP : -errno;
}

/*
 * The copy, unnamed, named once complete: a broker killed while it copied
 * left a file at the path with its size set and its data partly written,
 * and the next broker refused a shard file with a zeroed header (chimed
 * would not start). 1 if named, 0 if it cannot be done this way (no
 * O_TMPFILE here, no /proc), -errno.
 */
static int relink_whole(int fd, const struct stat *st, const char *path,
			const struct chime_seg_range *keep, unsigned n)
{
	int out = chime_seg_tmpfile(path, O_WRONLY, st->st_mode & 07777), r;

	if (out < 0)
		return out == -EOPNOTSUPP ? 0 : out;
	/* No durability asked (the next boot discards the files): a crash of the process is the case. */
	r = copy_into(fd, st, out, keep, n);
	if (r == 0)
		r = chime_seg_link(out, path);  /* never over another file: EEXIST */
	close(out);
	return r == 0 ? 1 : r == -EOPNOTSUPP ? 0 : r;
}

/*
 * A copy, not linkat() of /proc/self/fd/N of fd itself: the kernel refuses
 * to link a file whose last name is gone (ENOENT).
 */
int chime_seg_relink(int fd, const char *path, const struct chime_seg_range *keep, unsigned n)
{
	struct stat st;
	int out, r = chime_seg_named(fd, path);

	if (r != 0)
		return r == 1 ? 0 : r;
	if (fstat(fd, &st) < 0)
		return -errno;
	r = relink_whole(fd, &st, path, keep, n);
	if (r != 0)
		return r;
	/* Without O_TMPFILE or /proc: at the path, and filled there. */
	out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, st.st_mode & 07777);
	if (out < 0)
		return -errno;
	r = copy_into(fd, &st, out, keep, n);
	/* A filesystem that writes back at the close (NFS) says there if it had no room. */
	if (close(out) < 0 && r == 0 && errno != EINTR)
		r = -errno;
	if (r < 0) {
		unlink(path);
		return r;
	}
	return 1;
}

/*
 * F_SEAL_FUTURE_WRITE (not F_SEAL_WRITE): mappings made before keep
 * writing, while nobody can map the memfd writable again, mprotect a
 * read-only mapping to writable or punch a hole in it.
 */
int chime_seg_seal(int fd, enum chime_seal how)
{
	int seals = F_SEAL_SHRINK | F_SEAL_GROW;

	if (how != CHIME_SEAL_SIZE)
		seals |= F_SEAL_SEAL;
	if (how == CHIME_SEAL_WRITES)
		seals |= F_SEAL_FUTURE_WRITE;
	if (fcntl(fd, F_ADD_SEALS, seals) < 0)
		return -errno;
	return 0;
}

int chime_seg_client_sealed(int fd, uint64_t size)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0)
		return -errno;
	if ((seals & (F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)) != (F_SEAL_FUTURE_WRITE | F_SEAL_SEAL))
		return -EPERM;
	if (!size)
		return 0;
	if (fstat(fd, &st) < 0)
		return -errno;
	return (uint64_t)st.st_blocks * 512u >= size ? 0 : -ENODATA;
}

void chime_seg_publish(struct chime_seg_hdr *hdr, uint32_t kind, uint64_t size)
{
	hdr->layout = CHIME_SHM_LAYOUT;
	hdr->kind = kind;
	hdr->size = size;
	memset(hdr->_reserved, 0, sizeof(hdr->_reserved));
	/* P1: the header and everything the creator wrote before, then magic; pairs with P2. */
	at_store_rel(&hdr->magic, CHIME_SHM_MAGIC);
}

/*
 * The size check comes after the magic and layout ones: a header of another
 * layout may keep its size elsewhere.
 */
int chime_seg_check(const struct chime_map *map, uint32_t kind, uint32_t *layout)
{
	const struct chime_seg_hdr *hdr = map->base;
	uint64_t magic;
	uint32_t l;

	if (!hdr || map->size < sizeof(*hdr))
		return -EBADMSG;
	/* P2: magic, then the header; pairs with P1. */
	magic = at_load_acq(&hdr->magic);
	if (magic == 0)
		return -EAGAIN;
	if (magic != CHIME_SHM_MAGIC)
		return -EBADMSG;
	l = at_load(&hdr->layout);
	if (l != CHIME_SHM_LAYOUT) {
		if (layout)
			*layout = l;
		return -EPROTO;
	}
	if (at_load(&hdr->kind) != kind || at_load(&hdr->size) != map->size)
		return -EBADMSG;
	return 0;
}

/*
 * A file of size 0 is one whose creator has not sized it yet: -EAGAIN like
 * a magic of 0. A file too small for a header is not a chime segment.
 */
int chime_seg_map_file(int fd, bool writable, struct chime_map *map)
{
	struct stat st;
	void *p;

	if (fstat(fd, &st) < 0)
		return -errno;
	/* A directory, a FIFO, a device: not a segment (mmap would say ENODEV, or map a device). */
	if (!S_ISREG(st.st_mode))
		return S_ISDIR(st.st_mode) ? -EISDIR : -EBADMSG;
	if (st.st_size == 0)
		return -EAGAIN;
	if (st.st_size < (off_t)sizeof(struct chime_seg_hdr) || (uint64_t)st.st_size > SIZE_MAX)
		return -EBADMSG;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)    /* EAGAIN: over RLIMIT_MEMLOCK under mlockall(MCL_FUTURE), not "unfinished" */
		return errno == EAGAIN ? -ENOMEM : -errno;
	map->base = p;
	map->size = (size_t)st.st_size;
	return 0;
}

int chime_seg_map_fd(int fd, uint32_t kind, bool writable, struct chime_map *map)
{
	struct chime_map m;
	int r = chime_seg_map_file(fd, writable, &m);

	if (r < 0)
		return r;
	r = chime_seg_check(&m, kind, NULL);
	if (r < 0) {
		munmap(m.base, m.size);
		return r;
	}
	*map = m;
	return 0;
}

int chime_seg_open(const char *path, uint32_t kind, struct chime_map *map)
{
	/* O_NONBLOCK: a FIFO at the path must not hang the open (a regular file ignores it). */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	int r;

	if (fd < 0)
		return -errno;
	r = chime_seg_map_fd(fd, kind, false, map);
	close(fd);
	return r;
}

void chime_seg_unmap(struct chime_map *map)
{
	if (!map || !map->base)
		return;
	munmap(map->base, map->size);
	map->base = NULL;
	map->size = 0;
}

/* ------------------------------------------------------------------------ */
/* Layouts                                                                    */
/* ------------------------------------------------------------------------ */

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

/*
 * *off = align(*off, a) and returns where the array starts; then adds
 * n * elem. False on overflow. The caller keeps offsets below INT64_MAX so
 * that they fit off_t and size_t.
 */
static bool place(uint64_t *off, uint64_t a, uint64_t n, uint64_t elem, uint64_t *start)
{
	uint64_t s, len;

	if (__builtin_add_overflow(*off, a - 1, &s))
		return false;
	s &= ~(a - 1);
	if (__builtin_mul_overflow(n, elem, &len) || __builtin_add_overflow(s, len, off))
		return false;
	*start = s;
	return *off <= INT64_MAX;
}

static bool page_round(uint64_t *size)
{
	long ps = sysconf(_SC_PAGESIZE);
	uint64_t a = ps > 0 ? (uint64_t)ps : 4096u;

	if (__builtin_add_overflow(*size, a - 1, size))
		return false;
	*size &= ~(a - 1);
	return *size <= INT64_MAX && *size <= SIZE_MAX;
}

/*
 * rw: header | chan_rw[nr] | sqe[nr][sq_size] | claim[nr][cq_size]
 * ro: header | chan_ro[nr] | cqe[nr][cq_size]
 * Shard s's rings are at base + s * size * elem: each shard's array is a
 * whole number of cache lines (64-byte slots; cq_size >= 8 claim words), so
 * no two shards write the same line.
 */
int chime_client_layout(struct chime_client_geom *g)
{
	uint64_t rw = sizeof(struct chime_client_rw), ro = sizeof(struct chime_client_ro);
	uint64_t rw_chan, rw_sq, rw_claim, ro_chan, ro_cq;

	if (!g->nr_shards || g->nr_shards > CHIME_MAX_SHARDS ||
	    !is_pow2(g->sq_size) || g->sq_size < CHIME_SQ_MIN || g->sq_size > CHIME_RING_MAX ||
	    !is_pow2(g->cq_size) || g->cq_size < CHIME_CQ_MIN || g->cq_size > CHIME_RING_MAX)
		return -EINVAL;
	if (!place(&rw, SEG_ALIGN, g->nr_shards, sizeof(struct chime_chan_rw), &rw_chan) ||
	    !place(&rw, SEG_ALIGN, (uint64_t)g->nr_shards * g->sq_size, sizeof(struct chime_sqe), &rw_sq) ||
	    !place(&rw, SEG_ALIGN, (uint64_t)g->nr_shards * g->cq_size, sizeof(uint64_t), &rw_claim) ||
	    !page_round(&rw))
		return -EINVAL;
	if (!place(&ro, SEG_ALIGN, g->nr_shards, sizeof(struct chime_chan_ro), &ro_chan) ||
	    !place(&ro, SEG_ALIGN, (uint64_t)g->nr_shards * g->cq_size, sizeof(struct chime_cqe), &ro_cq) ||
	    !page_round(&ro))
		return -EINVAL;
	g->rw_chan_off = rw_chan;
	g->rw_sq_off = rw_sq;
	g->rw_claim_off = rw_claim;
	g->rw_size = rw;
	g->ro_chan_off = ro_chan;
	g->ro_cq_off = ro_cq;
	g->ro_size = ro;
	return 0;
}

/*
 * header | shard_ctl[nr_shards] | client_ctl[max_clients]. A client slot is
 * a uint16_t in every node (chime_node.owner), hence at most 65536 clients.
 */
int chime_ctl_layout(struct chime_ctl_geom *g)
{
	uint64_t off = sizeof(struct chime_ctl), shards, clients;

	if (!g->nr_shards || g->nr_shards > CHIME_MAX_SHARDS ||
	    !g->max_clients || g->max_clients > UINT16_MAX + 1u)
		return -EINVAL;
	if (!place(&off, SEG_ALIGN, g->nr_shards, sizeof(struct chime_shard_ctl), &shards) ||
	    !place(&off, SEG_ALIGN, g->max_clients, sizeof(struct chime_client_ctl), &clients) ||
	    !page_round(&off))
		return -EINVAL;
	g->shards_off = shards;
	g->clients_off = clients;
	g->size = off;
	return 0;
}

/*
 * header | uint32_t key bucket heads[key_buckets] | wheel region. The
 * wheel region (struct chime_wheel, then the slab) must at least hold the
 * wheel header and `capacity` nodes. capacity < CHIME_NIL: that index is
 * the null node.
 */
int chime_shard_layout(struct chime_shard_geom *g)
{
	uint64_t off = sizeof(struct chime_shard_seg), keys, wheel, need;

	if (!g->capacity || g->capacity >= CHIME_NIL || !is_pow2(g->key_buckets))
		return -EINVAL;
	need = sizeof(struct chime_wheel) + (uint64_t)g->capacity * sizeof(struct chime_node);
	if (g->wheel_size < need)
		return -EINVAL;
	if (!place(&off, SEG_ALIGN, g->key_buckets, sizeof(uint32_t), &keys) ||
	    !place(&off, SEG_ALIGN, 1, g->wheel_size, &wheel) ||
	    !page_round(&off))
		return -EINVAL;
	g->key_off = keys;
	g->wheel_off = wheel;
	g->size = off;
	return 0;
}

/*
 * The length of the character at s (n bytes left) if it may be shown as it
 * is (see chime_printable()), else 0.
 */
static unsigned shown_char_len(const unsigned char *s, size_t n)
{
	unsigned len;
	uint32_t cp;

	if (s[0] < 0x80)
		return s[0] >= 0x20 && s[0] < 0x7f;
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		len = 2;
		cp = s[0] & 0x1fu;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		len = 3;
		cp = s[0] & 0x0fu;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		len = 4;
		cp = s[0] & 0x07u;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (unsigned i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;       /* overlong, out of range, a surrogate */
	if (cp < 0xa0 || cp == 0x61c || (cp >= 0x200b && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) ||
	    (cp >= 0x2060 && cp <= 0x206f) || cp == 0xfeff)
		return 0;
	return len;
}

void chime_printable(char *s, size_t len)
{
	size_t n = strnlen(s, len);

	for (size_t i = 0; i < n;) {
		unsigned k = shown_char_len((const unsigned char *)s + i, n - i);

		if (k)
			i += k;
		else
			s[i++] = '?';
	}
}

const char *chime_proc_stat(pid_t pid, char *buf, size_t len)
{
	char path[32];
	const char *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return NULL;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0)
		return NULL;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] ? p + 2 : NULL;
}

uint64_t chime_proc_start(pid_t pid)
{
	char buf[1024], *end;
	const char *f = chime_proc_stat(pid, buf, sizeof(buf));
	unsigned long long start;

	/* starttime is field 22; the state, field 3, is the first after the name */
	for (unsigned field = 3; f && field < 22; field++)
		if ((f = strchr(f, ' ')))
			f++;
	if (!f)
		return 0;
	errno = 0;
	start = strtoull(f, &end, 10);
	return end != f && errno == 0 ? start : 0;
}

int64_t chime_timens_monotonic(void)
{
	char buf[256], *line, *save = NULL;
	int fd = open("/proc/self/timens_offsets", O_RDONLY | O_CLOEXEC | O_NOCTTY);
	ssize_t n;

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	/* "monotonic <s> <ns>" (the kernel's names; a clock id, 1, as writes take it, too) */
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[16];
		long long sec;
		long nsec;

		if (sscanf(line, "%15s %lld %ld", name, &sec, &nsec) == 3 &&
		    (!strcmp(name, "monotonic") || !strcmp(name, "1")))
			return (int64_t)sec * 1000000000 + nsec;
	}
	return 0;
}
