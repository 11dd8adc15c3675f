/* SPDX-License-Identifier: MIT */
/*
 * sessfile.h - "<socket>.sessions": the named sessions a broker leaves to
 * the next one (ARCHITECTURE.md, "Sessions and restarts").
 *
 * The shard files hold the timers; this file says whose they are: for
 * every client slot that holds a named session, its name, uid and gid,
 * the slot's generation, the linger deadline and its last process (pid and
 * start time: the one that may resume it). Nodes of a slot with no
 * record here are an anonymous client's and are freed on restore.
 *
 *   header   128 B: magic, layout, geometry, boot id, monotonic offset, checksum
 *   records  128 B each, one per client slot (max_clients)
 *   header   its copy, read when the first one's checksum fails (a file of
 *            a broker before the copy ends with the records)
 *
 * Only the broker reads or writes it (mode 0600), and only the control
 * thread, with one pwrite() per change. A record is trusted only if its
 * checksum, slot, name and uid hold, and no other record holds its name; a
 * torn or scribbled one drops that session and no other (a name recorded
 * twice, each of them). Nothing here logs: the caller names the file.
 */
#ifndef CHIMED_SESSFILE_H
#define CHIMED_SESSFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "chime_shm.h"

#define SESSFILE_MAGIC   UINT64_C(0x534e4f4953534843)  /* "CHSSIONS" */
#define SESSFILE_VERSION 1u
/* In the header's flags: its mono_off is the writer's (a broker before it left 0 there). */
#define SESSFILE_F_MONO  1u

/* What the file must agree on with the broker reading it. */
struct sessfile_geom {
	uint32_t nr_shards;
	uint32_t max_clients;
	uint32_t capacity;
	uint32_t layout;            /* CHIME_SHM_LAYOUT of the shard files */
	uint64_t resolution_ns;
};

/* The file's first 128 bytes, and again after the records (the copy a damaged header is read from). */
struct sessfile_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t rec_size;
	struct sessfile_geom geom;
	char     boot_id[40];
	/*
	 * The writer's CLOCK_MONOTONIC offset (chime_timens_monotonic()), valid
	 * with SESSFILE_F_MONO. Zero in a file of a broker before it (these
	 * were reserved, and the checksum covered them): its clock is unknown.
	 */
	int64_t  mono_off;
	uint32_t flags;
	uint8_t  _reserved[128 - 16 - sizeof(struct sessfile_geom) - 40 - 12 - 8];
	uint64_t check;
};
_Static_assert(sizeof(struct sessfile_hdr) == 128, "the header is 128 B");
_Static_assert(offsetof(struct sessfile_hdr, mono_off) == 80, "in the old reserved bytes");

struct sessfile_rec {
	uint32_t used;              /* 1: a session holds this slot */
	uint32_t slot;
	uint32_t uid;
	uint32_t gid;
	uint64_t generation;        /* the slot's, for the counters */
	uint64_t linger_until_ns;   /* CLOCK_MONOTONIC; 0: a process was attached */
	char     name[CHIME_SESSION_MAX];
	int32_t  pid;               /* the last process attached, the one that may resume it; 0: unknown */
	uint32_t token;             /* its attach's token (chime_welcome.session_token); 0: unknown */
	uint64_t pid_start;         /* pid's start time (chime_proc_start()); 0: unknown (a broker before it) */
	uint8_t  _reserved[8];
	uint64_t check;             /* FNV-1a of the bytes before it */
};
_Static_assert(sizeof(struct sessfile_rec) == 128, "a record is 128 B");

/* What sessfile_load() read in the header, for the caller's messages. */
struct sessfile_info {
	struct sessfile_geom geom;
	int64_t mono_off;           /* the writer's CLOCK_MONOTONIC offset (SESSFILE_F_MONO) */
	bool from_copy;             /* the header was damaged: its copy was read */
	/*
	 * -EPROTO (layout only) or -EMEDIUMTYPE: the file, read by its own
	 * geometry, is whole and every record in it is zero (it names no
	 * session, not even a damaged one).
	 */
	bool empty;
};

struct sessfile {
	int fd;
	uint32_t max_clients;
};

/*
 * Read `path`: every valid record into recs[slot] (recs has max_clients
 * entries, zeroed by the caller; an invalid or unused record leaves its
 * entry zero, and so do valid records that share a name: none of them is
 * trusted). Returns the number of sessions found, or:
 *   -ENOENT   no file;
 *   -ESTALE   written during another boot (its deadlines are another
 *             clock's);
 *   -EXDEV    written in this boot by a broker in another time namespace,
 *             whose CLOCK_MONOTONIC is off ours (info->mono_off: its
 *             offset, chime_timens_monotonic()); a file of a broker before
 *             the offset was recorded is taken as ours;
 *   -EPROTO   another version or layout (info->empty: a layout's file of
 *             no session);
 *   -EMEDIUMTYPE  the geometry differs (info->geom tells how; info->empty
 *             as for -EPROTO);
 *   -ENODATA  cut short: fewer bytes than the header and a record per
 *             client slot (a broker writes them all);
 *   -EBADMSG  not a sessions file, or its header is damaged and its copy
 *             too (a damaged header whose copy is whole is read from the
 *             copy, info->from_copy set);
 *   -EINVAL   not a regular file (a FIFO, a device: never blocks on one);
 *   -EISDIR   a directory;
 *   -EPERM    owned by another uid than ours or root's (chime_seg_ours());
 *   -EBUSY    held (flock) by a broker that has it open (sessfile_open()):
 *             one still runs on these files;
 *   -ENOMEM   no memory to look for names recorded twice;
 *   -errno    of open, fstat, read, and of the read of this boot's id
 *             (sessfile_boot_id()), never taken for another boot.
 * *bad counts records present but rejected. info may be NULL.
 */
int sessfile_load(const char *path, const struct sessfile_geom *g, struct sessfile_rec *recs,
		  uint32_t *bad, struct sessfile_info *info);

/*
 * Open `path` (created with mode 0600 if absent: written unnamed, O_TMPFILE,
 * and linked at `path` once complete, so that a broker killed meanwhile
 * leaves no empty file there) for updates, with this
 * broker's header and recs[slot] for every slot (max_clients entries;
 * used 0: no session), rewritten in place: a broker killed meanwhile
 * leaves each record the earlier one or the new one, never none. 0 or
 * -errno (-ENOSPC: a new file found no room; -EPERM: the file there is
 * another uid's, chime_seg_ours(); -EBUSY: another broker holds it); a
 * file that was there is never removed. Held (flock(LOCK_EX)) until
 * sessfile_close(): the lock a broker keeps on its files when the lock
 * file is removed.
 */
int sessfile_open(struct sessfile *sf, const char *path, const struct sessfile_geom *g,
		  const struct sessfile_rec *recs);

/* Write the record of r->slot (r->used 0: the slot holds no session). 0 or -errno. */
int sessfile_put(struct sessfile *sf, const struct sessfile_rec *r);

/* Clear the record of `slot`. */
int sessfile_clear(struct sessfile *sf, uint32_t slot);

void sessfile_close(struct sessfile *sf);

/* The size of a whole file of max_clients records (a header, a record per slot, the header's copy). */
uint64_t sessfile_size(uint32_t max_clients);

/* The checksum of a record or the header: FNV-1a of the bytes before its `check`. */
uint64_t sessfile_hash(const void *p, size_t n);

/*
 * This boot's id (/proc/sys/kernel/random/boot_id), 36 characters and a
 * NUL; "" with no /proc mounted or a sandbox that refuses it (ENOENT,
 * EACCES, EPERM: for good, and every broker there alike). 0, or -errno if
 * it could not be read for now (EMFILE, ENOMEM, EIO: out ""): a caller
 * that took "" for this boot's would take its files for another boot's.
 */
int sessfile_boot_id(char out[40]);

#endif /* CHIMED_SESSFILE_H */
