/* SPDX-License-Identifier: MIT */
/*
 * segment.h - create, map, seal and validate chime shared-memory segments,
 * and compute their layouts. Shared by chimed, libchime and the tools.
 *
 * Every function returns 0 or a negative errno and prints nothing: the caller
 * owns the message (it knows the path and the program name).
 */
#ifndef CHIME_SEGMENT_H
#define CHIME_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "chime_shm.h"

/* A mapping: base address and length. */
struct chime_map {
	void  *base;
	size_t size;
};

/*
 * The offset of CLOCK_MONOTONIC in the calling process's time namespace
 * from the host's (/proc/self/timens_offsets, ns): 0 in the host's, and
 * when there is none to read (a kernel before time namespaces, no /proc).
 * A process's own never changes (unshare() and setns() move its children).
 */
int64_t chime_timens_monotonic(void);

/*
 * Create an anonymous memfd of `size` bytes (MFD_CLOEXEC | MFD_ALLOW_SEALING),
 * map it read-write and set *fd and *map. Errors: -errno of memfd_create,
 * ftruncate or mmap.
 */
int chime_seg_memfd(const char *name, size_t size, int *fd, struct chime_map *map);

/*
 * Create the file `path` (mode `mode`, replacing a stale one) of `size` bytes,
 * reserve its first `reserve` bytes on the filesystem (before anything touches
 * them), map it read-write and set *fd and *map. Used for the control and
 * shard segments, which tools find by name. Errors: -errno of open,
 * ftruncate, mmap; -ENOSPC (or -EDQUOT) if the reservation failed (nothing is
 * left behind).
 */
int chime_seg_file(const char *path, size_t size, size_t reserve, mode_t mode, int *fd,
		   struct chime_map *map);

/*
 * A file an earlier broker could have left: owned by this process's
 * effective uid, or by root, and with no other name (at most one link).
 * The socket's directory may be writable by others (a shared /tmp): a file
 * another uid put there is not a broker's (taken over, its owner would
 * read everyone's timers and write the live slab under the broker), and a
 * hard link another uid made there to a file of root's (its /etc/shadow)
 * would have a root broker truncate and write that file (found by a
 * security audit).
 */
bool chime_seg_ours(const struct stat *st);

/*
 * Open the existing segment file `path` that an earlier broker left, check
 * that it is a regular file of exactly `size` bytes and ours
 * (chime_seg_ours()), set its mode and map it read-write. Its contents are
 * the caller's to check. Errors: -ENOENT (no file), -EMEDIUMTYPE (another
 * size, or not a regular file), -EPERM (another uid's), -errno of open,
 * fchmod, mmap.
 */
int chime_seg_file_reopen(const char *path, size_t size, mode_t mode, int *fd, struct chime_map *map);

/*
 * Whether `path` still names the file open as `fd` (an operator or a
 * cleanup job may remove, or replace, a broker's file while it runs): 1 if
 * it does, 0 if nothing is there, -EEXIST if another file is (a symlink
 * too, even to this one), -errno of fstat or lstat.
 */
int chime_seg_named(int fd, const char *path);

/*
 * Unlink `path` if it still names the file open as `fd`: one put there
 * since (another broker's, started after this one's files were removed)
 * is left alone. 0 if unlinked or nothing was there, -EEXIST if another
 * file is, -errno.
 */
int chime_seg_unlink_named(int fd, const char *path);

/* A byte range of a file: [off, off + len). */
struct chime_seg_range {
	uint64_t off, len;
};

/*
 * Put the contents of file `fd` at `path` again if `path` no longer names
 * it (chime_seg_named()): a new file (the mode and group of `fd`), copied
 * unnamed (O_TMPFILE) and linked at `path` once complete, so that a process
 * killed meanwhile leaves no half-written file there (without O_TMPFILE or
 * /proc: created at `path`, O_EXCL | O_NOFOLLOW, and filled there), of the
 * same size, with only its data extents copied, so that a
 * sparse slab stays sparse; with `keep` (n ranges, in order), only the data
 * within them (the rest a hole: what the next reader rebuilds, or never
 * reads). 0 if `path` still names it, 1 if written again, or -errno:
 * -EEXIST if another file is there (never overwritten), -errno of open,
 * copy_file_range, read, write, ftruncate (nothing is left at `path`
 * then). The caller must keep the file from changing meanwhile.
 */
int chime_seg_relink(int fd, const char *path, const struct chime_seg_range *keep, unsigned n);

/*
 * A file to be named `path` once complete (chime_seg_link()): unnamed
 * (O_TMPFILE) in the directory of `path` (absolute), opened with `flags`
 * (O_WRONLY or O_RDWR) and `mode`, so that a process killed while it writes
 * it leaves nothing at `path`. Its fd, or -EOPNOTSUPP (no O_TMPFILE there:
 * the caller creates it at `path`), or -errno.
 */
int chime_seg_tmpfile(const char *path, int flags, mode_t mode);

/* Name such a file `path`: 0, -EEXIST (never over another file), -EOPNOTSUPP (no /proc), -errno. */
int chime_seg_link(int fd, const char *path);

/*
 * Whether the directory holding `path` (a file in it, existing or not) is
 * on a filesystem in memory (tmpfs, ramfs): segment files anywhere else are
 * written back to disk by the kernel, and growing them costs more. Sets
 * *fs to a short name of the filesystem ("tmpfs", "ext4", "0x..."), which
 * points to static storage or to buf. 1 if in memory, 0 if not, -errno of
 * statfs.
 */
int chime_seg_dir_in_memory(const char *path, const char **fs, char *buf, size_t len);

/*
 * Whether a client of user `client` may trust a broker of user `broker`
 * listening at socket `path` with its session's name and timers: the
 * broker runs as root, as the client's own user, or as the owner of the
 * socket's directory (only they could have put a socket there; a broker's
 * /run/chime is its own). In a directory any user may write, such as /tmp,
 * another user could listen at the path while no broker runs. 1 if
 * trusted, 0 if not, -errno of stat() on the directory.
 */
int chime_broker_trusted(const char *path, uid_t broker, uid_t client);

/*
 * A descriptor of memfd `fd` that can only ever read it, for a client of
 * another user: the memfd made 0400 (a memfd is 0777, and anyone holding a
 * descriptor could open it again for writing through /proc/PID/fd), then
 * a new open file description of it, O_RDONLY. Unlike F_SEAL_FUTURE_WRITE
 * this leaves the broker free to punch the pages out (chime_seg_discard()).
 * Root, and the broker's own user (who may chmod it back), can still write:
 * they are trusted anyway. The new descriptor, or -errno.
 */
int chime_seg_reopen_ro(int fd);

/*
 * Free the memory of the first `size` bytes of memfd `fd` (a hole punched
 * through a writable descriptor, fallocate), whoever else maps or holds
 * the memfd: their pages are gone too, and read as zeros. Through the
 * descriptor, not a mapping (MADV_REMOVE, as it was): that takes the
 * caller's mmap_lock, and chimed punches at idle priority (discard.c).
 * 0 or -errno (-EPERM: it is sealed against writes).
 */
int chime_seg_discard(int fd, size_t size);

/*
 * Free the storage of bytes [off, off + len) of file `fd`, its size kept
 * (a hole punched, fallocate): every mapping of them reads zeros, and a
 * write there takes storage again. Whole pages only on tmpfs (a partial
 * one is zeroed). 0 or -errno.
 */
int chime_seg_punch(int fd, uint64_t off, uint64_t len);

/*
 * Map the pages of [p, p + bytes) of a shared mapping now, writable, in one
 * call, rather than one page fault at a time on a path that should not
 * wait (MADV_POPULATE_WRITE, Linux 5.14; on an older kernel a read of each
 * page, which allocates a shared memfd's; no memory leaves them to fault
 * as before). Whole pages: the range is widened to
 * them, and must lie in the mapping once widened. 0, or -errno of the
 * populate (-ENOMEM: no memory for every page; some may be mapped), for a
 * caller that needs every page (the client's rw segment, which the broker
 * checks); the others may leave them to fault.
 */
int chime_seg_populate(void *p, size_t bytes);

/*
 * MADV_POPULATE_WRITE over [p, p + len) (page-aligned), tried again while
 * the kernel says "again" (EINTR: a signal pending; EAGAIN: a page busy):
 * 0 or -errno (-EINVAL before Linux 5.14). A caller that took EINTR for
 * a failure gave up on a client's touch table for good (broker/aside.c).
 */
int chime_seg_populate_write(void *p, size_t len);

/*
 * Which pages of [p, p + bytes) of a shared mapping are in its file's page
 * cache (mincore(2): nothing is allocated or mapped, unlike any access or
 * populate): bit 0 of vec[i] for the i-th page of the range widened to
 * whole pages, as many bytes as pages. The number of pages, or -errno.
 */
int chime_seg_resident(const void *p, size_t bytes, unsigned char *vec);

/*
 * Why nothing answered at socket `path` (connect(2) said ENOENT,
 * ECONNREFUSED or ENOTDIR, which libchime reports as -ENOENT), for a
 * tool's message after "nothing listens there": no such file (and
 * whether a broker's segments are still beside it: a socket removed from
 * under a running broker), not a socket, or a socket file left behind.
 * A constant string.
 */
const char *chime_socket_absent_why(const char *path);

/*
 * Why a handshake at socket `path` was refused EACCES, for a tool's
 * message: the broker's policy (this user may write the socket), or the
 * path's permissions (the socket's, or a directory's above it, which the
 * policy cannot help with). A constant string.
 */
const char *chime_socket_eacces_why(const char *path);

/*
 * After a recvmsg() of the broker's answer failed with ECONNRESET: read
 * again, without waiting. A broker that hangs up with our hello unread
 * makes the kernel report ECONNRESET once, first, and its refusal (-EAGAIN,
 * -EUSERS) sent before the close is queued behind it. The message's
 * length, or -1 with errno ECONNRESET.
 */
ssize_t chime_recv_behind_reset(int fd, struct msghdr *msg, int flags);

/*
 * Reserve [off, off + len) of a segment file on its filesystem, so that the
 * first touch of those pages cannot raise SIGBUS on a full filesystem (a
 * sparse file's pages are only allocated when written). 0 or -errno (-ENOSPC).
 */
int chime_seg_reserve(int fd, uint64_t off, uint64_t len);

/*
 * A tenth of a filesystem stays free for its other writers: the shard files
 * grow only into the rest (the service's socket directory is /run, where one
 * user arming up to its quota left the host's other services ENOSPC).
 */
#define CHIME_FS_KEEP_DIV 10

/*
 * How many more bytes the filesystem holding fd (if fd >= 0, else path) can
 * give the shard files, a tenth of its size kept free (CHIME_FS_KEEP_DIV);
 * UINT64_MAX where it reports no size (a tmpfs mounted without one) or
 * cannot be asked.
 */
uint64_t chime_fs_room(int fd, const char *path);

/*
 * Seal a memfd: what the broker does to every segment it hands to a
 * client, so that a client's ftruncate cannot SIGBUS it. SIZE: against
 * resizing, and the client seals the rest (its rw segment and touch table:
 * chime_seg_client_sealed()); FINAL: and against further sealing; WRITES:
 * and against new writable mappings, writes and holes punched
 * (F_SEAL_FUTURE_WRITE: mappings made before keep writing).
 */
enum chime_seal { CHIME_SEAL_SIZE, CHIME_SEAL_FINAL, CHIME_SEAL_WRITES };
int chime_seg_seal(int fd, enum chime_seal how);

/*
 * Has the client sealed memfd `fd` as CHIME_SEAL_WRITES, and, if `size`,
 * is every page of its first `size` bytes allocated (st_blocks: faulted in
 * by the client, so that the broker allocates none it could not take back)?
 * 0, -EPERM (not sealed), -ENODATA (pages missing) or another -errno.
 * Neither check waits for a punch under way (F_GET_SEALS and fstat take no
 * lock a punch holds).
 */
int chime_seg_client_sealed(int fd, uint64_t size);

/*
 * Make the NUL-terminated name in s[0..len) fit to show to an operator, in
 * place: every byte that is not part of a printable character becomes '?'.
 * Printable: ASCII 0x20..0x7e, or well-formed UTF-8 of a code point that is
 * not a C1 control (U+009B is a terminal's CSI) nor one that breaks or
 * reorders a line or hides (line separators, bidirectional marks and overrides,
 * zero-width marks); a character cut short (the kernel cuts a process name
 * at 15 bytes) is not. chimed applies it to a process name as it reads it,
 * the tools to every name they read from a segment or an answer, whose
 * writer is whoever owns the socket's directory.
 */
void chime_printable(char *s, size_t len);

/*
 * The fields of /proc/PID/stat from the state on, read into buf (len
 * bytes): they start after the command name's last ')', as the name may
 * hold spaces and parentheses. NULL if the file cannot be read (no such
 * process, no /proc, another user's under hidepid).
 */
const char *chime_proc_stat(pid_t pid, char *buf, size_t len);

/*
 * When process pid started (/proc/PID/stat's starttime, clock ticks since
 * boot): with the pid, it names one process of this boot, a pid reused
 * since being another start time. 0 if it cannot be read.
 */
uint64_t chime_proc_start(pid_t pid);

/* Write the common header (layout, kind, size) and then, last, the magic (release). */
void chime_seg_publish(struct chime_seg_hdr *hdr, uint32_t kind, uint64_t size);

/*
 * Check a mapped segment: 0 if it is a ready chime segment of `kind` whose
 * header size equals map->size. -EAGAIN: magic still 0 (not ready yet);
 * -EBADMSG: not a chime segment, or of another kind, or sizes disagree;
 * -EPROTO: another layout version (its number in *layout if not NULL).
 */
int chime_seg_check(const struct chime_map *map, uint32_t kind, uint32_t *layout);

/*
 * Map an fd (its whole size, from fstat), read-only unless `writable`,
 * reading nothing of it: for a reader that checks it where a read of a
 * file shrunk since (SIGBUS) is caught (the tools' sr_guard()). Not a
 * regular file: -EISDIR for a directory, -EBADMSG for anything else;
 * -EAGAIN for an empty one (not sized yet), -EBADMSG for one too small for
 * a header; -errno of fstat, mmap.
 */
int chime_seg_map_file(int fd, bool writable, struct chime_map *map);

/*
 * chime_seg_map_file(), then chime_seg_check(). On failure nothing stays
 * mapped.
 */
int chime_seg_map_fd(int fd, uint32_t kind, bool writable, struct chime_map *map);

/*
 * Open `path` read-only (never blocking, on a FIFO) and chime_seg_map_fd() it.
 * -errno of open too. The tools use sr_map() instead, which survives the
 * file shrinking while it is read.
 */
int chime_seg_open(const char *path, uint32_t kind, struct chime_map *map);

/* Unmap (NULL-safe: a zeroed map is ignored). */
void chime_seg_unmap(struct chime_map *map);

/* ---- layouts: offsets and sizes, the same computation on every side ---- */

struct chime_client_geom {
	uint32_t nr_shards;
	uint32_t sq_size;      /* power of two */
	uint32_t cq_size;      /* power of two */
	/* computed by chime_client_layout(): */
	uint64_t rw_chan_off, rw_sq_off, rw_claim_off, rw_size;
	uint64_t ro_chan_off, ro_cq_off, ro_size;
};

/* Fill the computed fields of g. -EINVAL if a size is 0, not a power of two, or too large. */
int chime_client_layout(struct chime_client_geom *g);

struct chime_ctl_geom {
	uint32_t nr_shards;
	uint32_t max_clients;
	uint64_t shards_off, clients_off, client_stats_off, size;
};
int chime_ctl_layout(struct chime_ctl_geom *g);

struct chime_shard_geom {
	uint32_t capacity;     /* slab nodes */
	uint32_t key_buckets;  /* power of two */
	uint64_t key_off, wheel_off, wheel_size, size;
};
/* wheel_size comes from wheel_region_size() (broker/wheel.h) and must be set by the caller. */
int chime_shard_layout(struct chime_shard_geom *g);

/* Typed accessors (no pointers are stored in shm: everything is base + offset). */
static inline void *chime_at(const struct chime_map *m, uint64_t off)
{
	return (char *)m->base + off;
}

#endif /* CHIME_SEGMENT_H */
