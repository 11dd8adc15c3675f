/* SPDX-License-Identifier: MIT */
/* test_segment.c - segments and layouts (shm/segment.c). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "ring.h"
#include "segment.h"

static uint64_t pagesz(void)
{
	return (uint64_t)sysconf(_SC_PAGESIZE);
}

/* ---- memfd and seals ---- */

Test(segment, memfd_is_mapped_zeroed_and_of_the_asked_size)
{
	struct chime_map m;
	struct stat st;
	int fd;

	cr_assert_eq(chime_seg_memfd("chime-t", 3 * pagesz(), &fd, &m), 0);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq((uint64_t)st.st_size, 3 * pagesz());
	cr_assert_eq(m.size, 3 * pagesz());
	cr_assert_eq(((char *)m.base)[m.size - 1], 0);
	cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	chime_seg_unmap(&m);
	cr_assert_null(m.base);
	chime_seg_unmap(&m);            /* a zeroed map is ignored */
	chime_seg_unmap(NULL);
	close(fd);
}

Test(segment, seal_forbids_resizing_and_more_seals)
{
	struct chime_map m;
	int fd;

	cr_assert_eq(chime_seg_memfd("chime-t", pagesz(), &fd, &m), 0);
	cr_assert_eq(chime_seg_seal(fd, CHIME_SEAL_FINAL), 0);
	cr_assert_eq(ftruncate(fd, 2 * (off_t)pagesz()), -1);
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(ftruncate(fd, 0), -1);
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1, "F_SEAL_SEAL set");
	cr_assert_eq(chime_seg_seal(fd, CHIME_SEAL_WRITES), -EPERM);
	/* A writable (not read-only) seal still allows a writable mapping. */
	{
		void *p = mmap(NULL, pagesz(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		cr_assert_neq(p, MAP_FAILED);
		munmap(p, pagesz());
	}
	chime_seg_unmap(&m);
	close(fd);
}

/*
 * The broker seals a client's writable segments against resizing only
 * (CHIME_SEAL_SIZE), and the client adds the rest once it has mapped them
 * (chime_shm.h, struct chime_mapped); chime_seg_client_sealed() is the
 * broker's check that it did, and faulted every page in first. Sealed, the
 * pages cannot be punched out by anyone, the creator included.
 */
Test(segment, a_client_seals_what_the_broker_sized_and_the_broker_checks_it)
{
	size_t size = 4 * pagesz();
	struct chime_map m, mine;
	int fd;

	cr_assert_eq(chime_seg_memfd("chime-t", size, &fd, &m), 0);
	cr_assert_eq(chime_seg_seal(fd, CHIME_SEAL_SIZE), 0);
	cr_assert_eq(ftruncate(fd, 0), -1, "resized after the size seal");
	cr_assert_eq(chime_seg_client_sealed(fd, size), -EPERM, "not sealed yet");
	/* The client maps it, seals it before faulting it in: refused. */
	cr_assert_eq(chime_seg_map_file(fd, true, &mine), 0);
	cr_assert_eq(chime_seg_seal(fd, CHIME_SEAL_WRITES), 0, "the size seal left no room for the client's");
	cr_assert_eq(chime_seg_client_sealed(fd, 0), 0, "sealed, its pages not asked about");
	cr_assert_eq(chime_seg_client_sealed(fd, size), -ENODATA, "sealed with none of its pages there");
	/* Faulted in through the mapping made before the seal: accepted; nobody punches it any more. */
	cr_assert_eq(chime_seg_populate(mine.base, mine.size), 0);
	cr_assert_eq(chime_seg_client_sealed(fd, size), 0);
	cr_assert_eq(chime_seg_discard(fd, size), -EPERM, "a hole punched in a sealed segment");
	cr_assert_eq(madvise(m.base, pagesz(), MADV_REMOVE), -1, "MADV_REMOVE through the creator's mapping");
	((char *)m.base)[size - 1] = 1;         /* both mappings made before the seal still write */
	cr_assert_eq(((char *)mine.base)[size - 1], 1);
	chime_seg_unmap(&mine);
	chime_seg_unmap(&m);
	close(fd);
}

Test(segment, read_only_seal_forbids_new_writable_mappings_but_keeps_the_creators)
{
	struct chime_map m;
	void *p;
	int fd, ro;
	char path[64];

	cr_assert_eq(chime_seg_memfd("chime-t", pagesz(), &fd, &m), 0);
	cr_assert_eq(chime_seg_seal(fd, CHIME_SEAL_WRITES), 0);
	/* The creator's mapping still writes. */
	((char *)m.base)[7] = 42;
	cr_assert_eq(mmap(NULL, pagesz(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
	cr_assert_eq(errno, EPERM);
	/* A read-only shared mapping cannot be made writable. */
	p = mmap(NULL, pagesz(), PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(p, MAP_FAILED);
	cr_assert_eq(((char *)p)[7], 42);
	cr_assert_eq(mprotect(p, pagesz(), PROT_READ | PROT_WRITE), -1);
	munmap(p, pagesz());
	/*
	 * Nor written, nor zeroed by punching a hole, through the descriptor
	 * a client is handed (memfds are O_RDWR): the public segment is one
	 * for every client, and zeroing its state and heartbeat would tell
	 * each of them that the broker is gone.
	 */
	cr_assert_eq(write(fd, "x", 1), -1);
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(pwrite(fd, "x", 1, 7), -1);
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)pagesz()), -1);
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(((char *)m.base)[7], 42, "the page was zeroed");
	/* Nor through another open file description (what a client could try). */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDWR);
	if (ro >= 0) {
		cr_assert_eq(mmap(NULL, pagesz(), PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
		cr_assert_eq(write(ro, "x", 1), -1);
		cr_assert_eq(fallocate(ro, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)pagesz()), -1);
		close(ro);
	}
	/* chime_seg_map_fd() read-only works; writable does not. */
	chime_seg_publish(m.base, CHIME_SEG_CLIENT_RO, m.size);
	{
		struct chime_map r;

		cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_CLIENT_RO, false, &r), 0);
		chime_seg_unmap(&r);
		cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_CLIENT_RO, true, &r), -EPERM);
	}
	chime_seg_unmap(&m);
	close(fd);
}

/* ---- publish and check ---- */

/*
 * A client's ro segment is handed over as a descriptor that can only read
 * (chime_seg_reopen_ro()), so that the broker keeps the right to punch
 * its pages out when the connection ends (chime_seg_discard()), which a
 * F_SEAL_FUTURE_WRITE seal refuses: the descriptor maps read-only only, and
 * another user holding it cannot open the memfd again for writing.
 */
Test(segment, a_read_only_descriptor_cannot_write_and_the_creator_can_discard)
{
	struct chime_map m;
	struct stat st;
	char path[64];
	void *p;
	int fd, ro, status;
	pid_t pid;

	cr_assert_eq(chime_seg_memfd("chime-t", 4 * pagesz(), &fd, &m), 0);
	cr_assert_eq(chime_seg_seal(fd, CHIME_SEAL_FINAL), 0);
	memset(m.base, 7, m.size);
	ro = chime_seg_reopen_ro(fd);
	cr_assert_geq(ro, 0, "%s", strerror(-ro));
	cr_assert_eq(mmap(NULL, pagesz(), PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
	cr_assert_eq(errno, EACCES);
	p = mmap(NULL, pagesz(), PROT_READ, MAP_SHARED, ro, 0);
	cr_assert_neq(p, MAP_FAILED);
	cr_assert_eq(mprotect(p, pagesz(), PROT_READ | PROT_WRITE), -1);
	cr_assert_eq(write(ro, "x", 1), -1);
	cr_assert_eq(fallocate(ro, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)pagesz()), -1);
	if (geteuid() == 0) {
		/* Another user with the descriptor (root may write anything: it is trusted). */
		pid = fork();
		cr_assert_geq(pid, 0);
		if (pid == 0) {
			int w;

			if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
				_exit(90);
			snprintf(path, sizeof(path), "/proc/self/fd/%d", ro);
			w = open(path, O_RDWR);
			_exit(w >= 0 ? 1 : errno == EACCES ? 0 : 2);
		}
		cr_assert_eq(waitpid(pid, &status, 0), pid);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			  "user 65534 opened the memfd for writing through /proc (status %d)", status);
	}
	cr_assert_eq(fstat(ro, &st), 0);
	cr_assert_geq((uint64_t)st.st_blocks * 512, m.size);
	cr_assert_eq(chime_seg_discard(fd, m.size), 0);
	cr_assert_eq(fstat(ro, &st), 0);
	cr_assert_eq(st.st_blocks, 0, "%ld blocks left after the discard", (long)st.st_blocks);
	cr_assert_eq(((volatile char *)p)[0], 0, "the holder's mapping still reads the old page");
	munmap(p, pagesz());
	close(ro);
	chime_seg_unmap(&m);
	close(fd);
}

Test(segment, check_reports_every_error_case)
{
	struct chime_map m, small;
	struct chime_seg_hdr *h;
	uint32_t layout = 0;
	int fd;

	cr_assert_eq(chime_seg_memfd("chime-t", pagesz(), &fd, &m), 0);
	h = m.base;
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_CONTROL, &layout), -EAGAIN, "magic 0: not ready");

	chime_seg_publish(h, CHIME_SEG_CONTROL, m.size);
	cr_assert_eq(h->magic, CHIME_SHM_MAGIC);
	cr_assert_eq(h->layout, CHIME_SHM_LAYOUT);
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_CONTROL, &layout), 0);
	cr_assert_eq(layout, 0, "untouched on success");
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_SHARD, NULL), -EBADMSG, "other kind");

	h->size = m.size - 1;
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_CONTROL, NULL), -EBADMSG, "sizes disagree");
	h->size = m.size;

	h->layout = CHIME_SHM_LAYOUT + 1;
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_CONTROL, &layout), -EPROTO);
	cr_assert_eq(layout, CHIME_SHM_LAYOUT + 1);
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_CONTROL, NULL), -EPROTO, "NULL layout is fine");
	h->layout = CHIME_SHM_LAYOUT;

	h->magic = 0x1234;
	cr_assert_eq(chime_seg_check(&m, CHIME_SEG_CONTROL, NULL), -EBADMSG, "wrong magic");

	small.base = m.base;
	small.size = sizeof(struct chime_seg_hdr) - 1;
	cr_assert_eq(chime_seg_check(&small, CHIME_SEG_CONTROL, NULL), -EBADMSG, "too small");
	small.base = NULL;
	small.size = 0;
	cr_assert_eq(chime_seg_check(&small, CHIME_SEG_CONTROL, NULL), -EBADMSG, "nothing mapped");
	chime_seg_unmap(&m);
	close(fd);
}

Test(segment, map_fd_maps_the_whole_file_and_leaves_nothing_on_failure)
{
	struct chime_map m, r = { .base = (void *)1, .size = 1 };
	int fd;

	cr_assert_eq(chime_seg_memfd("chime-t", 2 * pagesz(), &fd, &m), 0);
	cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_SHARD, false, &r), -EAGAIN);
	cr_assert_eq(r.base, (void *)1, "out-param untouched on failure");
	chime_seg_publish(m.base, CHIME_SEG_SHARD, m.size);
	cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_CONTROL, false, &r), -EBADMSG);
	cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_SHARD, false, &r), 0);
	cr_assert_eq(r.size, 2 * pagesz());
	chime_seg_unmap(&r);
	cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_SHARD, true, &r), 0);
	((char *)r.base)[100] = 5;
	cr_assert_eq(((char *)m.base)[100], 5);
	chime_seg_unmap(&r);
	cr_assert_eq(chime_seg_map_fd(-1, CHIME_SEG_SHARD, true, &r), -EBADF);
	chime_seg_unmap(&m);
	close(fd);

	/* Empty: not sized yet. Tiny: not a segment. */
	fd = memfd_create("chime-t", MFD_CLOEXEC);
	cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_SHARD, false, &r), -EAGAIN);
	cr_assert_eq(ftruncate(fd, 10), 0);
	cr_assert_eq(chime_seg_map_fd(fd, CHIME_SEG_SHARD, false, &r), -EBADMSG);
	close(fd);
}

/* A path that is not a regular file: refused at once, never a hang (a FIFO's open would block). */
Test(segment, open_refuses_a_directory_and_a_fifo_without_blocking, .timeout = 10)
{
	char dir[] = "/tmp/chime-seg-XXXXXX", fifo[64];
	struct chime_map r = { .base = (void *)1, .size = 1 };

	cr_assert(mkdtemp(dir));
	cr_assert_eq(chime_seg_open(dir, CHIME_SEG_CONTROL, &r), -EISDIR);
	snprintf(fifo, sizeof(fifo), "%s/f.ctl", dir);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	cr_assert_eq(chime_seg_open(fifo, CHIME_SEG_CONTROL, &r), -EBADMSG);
	cr_assert_eq(r.base, (void *)1, "out-param untouched on failure");
	unlink(fifo);
	rmdir(dir);
}

/* ---- named file segments ---- */

Test(segment, file_replaces_a_stale_file_and_applies_the_mode)
{
	char path[128];
	struct chime_map m, r, stale;
	struct stat st;
	int fd, fd2, sfd;
	mode_t old = umask(077);

	snprintf(path, sizeof(path), "/tmp/chime-t-seg-%d", (int)getpid());
	/* A stale segment, still mapped by a "tool". */
	cr_assert_eq(chime_seg_file(path, pagesz(), 0, 0600, &sfd, &stale), 0);
	chime_seg_publish(stale.base, CHIME_SEG_CONTROL, stale.size);

	cr_assert_eq(chime_seg_file(path, 2 * pagesz(), pagesz(), 0644, &fd, &m), 0);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0644, "mode %o despite umask 077", st.st_mode & 0777);
	cr_assert_eq((uint64_t)st.st_size, 2 * pagesz());
	cr_assert_eq(((uint64_t *)m.base)[0], 0, "a fresh file, not the stale one");
	/*
	 * The stale one was emptied before it was unlinked: a tool still
	 * mapping it holds none of the filesystem's room (its reads are SIGBUS
	 * now, which the tools' reader guards against: tools/statsread.c).
	 */
	cr_assert_eq(fstat(sfd, &st), 0);
	cr_assert_eq(st.st_size, 0, "the replaced file kept %lld bytes", (long long)st.st_size);
	cr_assert_eq(st.st_nlink, 0, "the replaced file is still named");

	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &r), -EAGAIN);
	chime_seg_publish(m.base, CHIME_SEG_CONTROL, m.size);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &r), 0);
	cr_assert_eq(r.size, 2 * pagesz());
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_SHARD, &r), -EBADMSG);
	chime_seg_unmap(&r);

	/* A symlink planted at the path is replaced, not followed. */
	{
		char target[160];

		snprintf(target, sizeof(target), "%s.target", path);
		unlink(path);
		cr_assert_eq(symlink(target, path), 0);
		cr_assert_eq(chime_seg_file(path, pagesz(), 0, 0600, &fd2, &r), 0);
		cr_assert_eq(access(target, F_OK), -1, "symlink followed");
		cr_assert_eq(lstat(path, &st), 0);
		cr_assert(S_ISREG(st.st_mode));
		chime_seg_unmap(&r);
		close(fd2);
	}
	/* A hard link planted at the path is replaced, and its other name's file not emptied. */
	{
		char other[160];
		int o;

		snprintf(other, sizeof(other), "%s.other", path);
		o = open(other, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		cr_assert_geq(o, 0);
		cr_assert_eq(write(o, "kept", 4), 4);
		close(o);
		unlink(path);
		cr_assert_eq(link(other, path), 0);
		cr_assert_eq(chime_seg_file(path, pagesz(), 0, 0600, &fd2, &r), 0);
		cr_assert_eq(stat(other, &st), 0);
		cr_assert_eq(st.st_size, 4, "a file hard-linked at the path was emptied");
		chime_seg_unmap(&r);
		close(fd2);
		unlink(other);
	}
	cr_assert_eq(chime_seg_open("/nonexistent/chime", CHIME_SEG_CONTROL, &r), -ENOENT);
	cr_assert_eq(chime_seg_file("/nonexistent/dir/chime", pagesz(), 0, 0600, &fd2, &r), -ENOENT);
	unlink(path);
	chime_seg_unmap(&m);
	chime_seg_unmap(&stale);
	close(fd);
	close(sfd);
	umask(old);
}

/* ---- layouts ---- */

static void no_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	cr_assert(a + alen <= b || b + blen <= a, "[%llu,+%llu) overlaps [%llu,+%llu)",
		  (unsigned long long)a, (unsigned long long)alen, (unsigned long long)b, (unsigned long long)blen);
}

Test(segment, client_layout_aligns_every_array_and_rounds_to_pages)
{
	static const uint32_t shards[] = { 1, 2, 3, 7, 64, 256 };
	static const uint32_t sizes[] = { 8, 16, 1024, 4096 };

	for (unsigned a = 0; a < sizeof(shards) / sizeof(shards[0]); a++)
	for (unsigned b = 0; b < sizeof(sizes) / sizeof(sizes[0]); b++)
	for (unsigned c = 0; c < sizeof(sizes) / sizeof(sizes[0]); c++) {
		struct chime_client_geom g = { .nr_shards = shards[a], .sq_size = sizes[b], .cq_size = sizes[c] };
		uint64_t n = g.nr_shards;

		cr_assert_eq(chime_client_layout(&g), 0);
		cr_assert_eq(g.rw_chan_off % 128, 0);
		cr_assert_eq(g.rw_sq_off % 128, 0);
		cr_assert_eq(g.rw_claim_off % 128, 0);
		cr_assert_eq(g.ro_chan_off % 128, 0);
		cr_assert_eq(g.ro_cq_off % 128, 0);
		/* Every shard's claim words start a cache line: no line is shared by two shards. */
		cr_assert_eq((g.rw_claim_off + g.cq_size * 8) % 64, 0);
		cr_assert_eq(g.rw_size % pagesz(), 0);
		cr_assert_eq(g.ro_size % pagesz(), 0);
		no_overlap(0, sizeof(struct chime_client_rw), g.rw_chan_off, n * 256);
		no_overlap(g.rw_chan_off, n * 256, g.rw_sq_off, n * g.sq_size * 64);
		no_overlap(g.rw_sq_off, n * g.sq_size * 64, g.rw_claim_off, n * g.cq_size * 8);
		cr_assert_leq(g.rw_claim_off + n * g.cq_size * 8, g.rw_size);
		cr_assert_lt(g.rw_size - (g.rw_claim_off + n * g.cq_size * 8), pagesz());
		no_overlap(0, sizeof(struct chime_client_ro), g.ro_chan_off, n * 256);
		no_overlap(g.ro_chan_off, n * 256, g.ro_cq_off, n * g.cq_size * 64);
		cr_assert_leq(g.ro_cq_off + n * g.cq_size * 64, g.ro_size);
		cr_assert_lt(g.ro_size - (g.ro_cq_off + n * g.cq_size * 64), pagesz());
	}
}

Test(segment, client_layout_rejects_bad_sizes_and_leaves_g_alone)
{
	static const struct { uint32_t nr, sq, cq; } bad[] = {
		{ 0, 64, 64 }, { CHIME_MAX_SHARDS + 1, 64, 64 }, { 1, 0, 64 }, { 1, 64, 0 },
		{ 1, 1, 64 }, { 1, 3, 64 }, { 1, 64, 100 }, { 1, 64, 4 }, { 1, CHIME_RING_MAX * 2, 64 },
		{ 1, 64, CHIME_RING_MAX * 2 }, { 1, UINT32_MAX, 64 }, { 1, 1u << 31, 64 },
	};

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct chime_client_geom g = { .nr_shards = bad[i].nr, .sq_size = bad[i].sq, .cq_size = bad[i].cq };

		cr_assert_eq(chime_client_layout(&g), -EINVAL, "case %u", i);
		cr_assert_eq(g.rw_size, 0);
	}
	/* The largest accepted geometry computes without overflow. */
	{
		struct chime_client_geom g = { .nr_shards = CHIME_MAX_SHARDS, .sq_size = CHIME_RING_MAX,
					       .cq_size = CHIME_RING_MAX };

		cr_assert_eq(chime_client_layout(&g), 0);
		cr_assert_geq(g.rw_size, (uint64_t)CHIME_MAX_SHARDS * CHIME_RING_MAX * 72);
	}
}

Test(segment, ctl_layout_aligns_blocks_and_rejects_bad_counts)
{
	struct chime_ctl_geom g = { .nr_shards = 3, .max_clients = 100 };
	struct chime_ctl_geom bad[] = {
		{ .nr_shards = 0, .max_clients = 1 }, { .nr_shards = CHIME_MAX_SHARDS + 1, .max_clients = 1 },
		{ .nr_shards = 1, .max_clients = 0 }, { .nr_shards = 1, .max_clients = 65537 },
	};

	cr_assert_eq(chime_ctl_layout(&g), 0);
	cr_assert_eq(g.shards_off % 128, 0);
	cr_assert_eq(g.clients_off % 128, 0);
	no_overlap(0, sizeof(struct chime_ctl), g.shards_off, 3 * sizeof(struct chime_shard_ctl));
	no_overlap(g.shards_off, 3 * sizeof(struct chime_shard_ctl), g.clients_off,
		   100 * sizeof(struct chime_client_ctl));
	cr_assert_leq(g.clients_off + 100 * sizeof(struct chime_client_ctl), g.size);
	cr_assert_eq(g.size % pagesz(), 0);
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(chime_ctl_layout(&bad[i]), -EINVAL, "case %u", i);
	g.nr_shards = CHIME_MAX_SHARDS;
	g.max_clients = 65536;
	cr_assert_eq(chime_ctl_layout(&g), 0);
}

Test(segment, shard_layout_places_keys_and_wheel_and_rejects_bad_sizes)
{
	uint64_t wheel = sizeof(struct chime_wheel) + 1000 * sizeof(struct chime_node);
	struct chime_shard_geom g = { .capacity = 1000, .key_buckets = 512, .wheel_size = wheel };

	cr_assert_eq(chime_shard_layout(&g), 0);
	cr_assert_eq(g.key_off % 128, 0);
	cr_assert_eq(g.wheel_off % 128, 0);
	no_overlap(0, sizeof(struct chime_shard_seg), g.key_off, 512 * 4);
	no_overlap(g.key_off, 512 * 4, g.wheel_off, wheel);
	cr_assert_leq(g.wheel_off + wheel, g.size);
	cr_assert_eq(g.size % pagesz(), 0);

	g.key_buckets = 500;
	cr_assert_eq(chime_shard_layout(&g), -EINVAL, "buckets not a power of two");
	g.key_buckets = 0;
	cr_assert_eq(chime_shard_layout(&g), -EINVAL);
	g.key_buckets = 512;
	g.capacity = 0;
	cr_assert_eq(chime_shard_layout(&g), -EINVAL);
	g.capacity = CHIME_NIL;
	cr_assert_eq(chime_shard_layout(&g), -EINVAL, "CHIME_NIL is the null index");
	g.capacity = 1000;
	g.wheel_size = wheel - 1;
	cr_assert_eq(chime_shard_layout(&g), -EINVAL, "wheel region too small for the slab");
	g.wheel_size = UINT64_MAX;
	cr_assert_eq(chime_shard_layout(&g), -EINVAL, "overflow");
	g.wheel_size = wheel;
	g.key_buckets = 1u << 31;
	cr_assert_eq(chime_shard_layout(&g), 0);
	cr_assert_geq(g.wheel_off, (uint64_t)(1u << 31) * 4);
}

Test(segment, dir_in_memory_names_the_filesystem_of_the_files_directory)
{
	char buf[32], dir[] = "/dev/shm/chime-t-XXXXXX", path[64];
	const char *fs = NULL;

	/* /dev/shm (tmpfs, named) and procfs (not in memory for us, named by its magic number) */
	if (!mkdtemp(dir))
		cr_skip("no writable /dev/shm here");
	snprintf(path, sizeof(path), "%s/chime.sock", dir);
	cr_assert_eq(chime_seg_dir_in_memory(path, &fs, buf, sizeof(buf)), 1);
	cr_assert_str_eq(fs, "tmpfs");
	rmdir(dir);
	cr_assert_eq(chime_seg_dir_in_memory("/proc/self/x", &fs, buf, sizeof(buf)), 0);
	cr_assert_str_eq(fs, "0x9fa0", "procfs named %s", fs);
	cr_assert_eq(chime_seg_dir_in_memory("/no/such/dir/chime.sock", &fs, buf, sizeof(buf)), -ENOENT);
	cr_assert_geq(chime_seg_dir_in_memory("chime.sock", &fs, buf, sizeof(buf)), 0, "the working directory");
}

/* ---- a removed file written again (chime_seg_relink) ---- */

#define SLAB_BYTES (272ull << 20)      /* a default shard file: 4M nodes */

/* Bytes here and there in a sparse file of SLAB_BYTES, mapped as a shard's slab is. */
static const uint64_t relink_at[] = { 0, 5ull << 20, (130ull << 20) + 12345, SLAB_BYTES - 1 };

static int sparse_slab(const char *path, struct chime_map *m)
{
	int fd;

	cr_assert_eq(chime_seg_file(path, SLAB_BYTES, 0, 0640, &fd, m), 0);
	for (size_t i = 0; i < sizeof(relink_at) / sizeof(relink_at[0]); i++)
		((unsigned char *)m->base)[relink_at[i]] = (unsigned char)(0xa0 + i);
	return fd;
}

/* A sparse slab at dir/c.sock.<name> (dir made from its template, else the test skipped), then removed. */
static int removed_slab(char *dir, char *path, size_t len, const char *name, struct chime_map *m)
{
	int fd;

	if (!mkdtemp(dir))
		cr_skip("no writable /dev/shm here");
	snprintf(path, len, "%s/c.sock.%s", dir, name);
	fd = sparse_slab(path, m);
	cr_assert_eq(unlink(path), 0);
	return fd;
}

Test(segment, relink_writes_a_removed_file_again_sparse_with_its_mode_group_and_data)
{
	char dir[] = "/dev/shm/chime-t-XXXXXX", path[64];
	struct chime_map m;
	struct stat st, was;
	int fd, at;
	mode_t old = umask(077);

	if (!mkdtemp(dir))
		cr_skip("no writable /dev/shm here");
	snprintf(path, sizeof(path), "%s/c.sock.shard0", dir);
	fd = sparse_slab(path, &m);
	/* --stats-group's group (root only: another group than ours). */
	if (geteuid() == 0)
		cr_assert_eq(fchown(fd, (uid_t)-1, 4242), 0);
	cr_assert_eq(fstat(fd, &was), 0);
	cr_assert_eq(chime_seg_named(fd, path), 1);
	cr_assert_eq(chime_seg_relink(fd, path, NULL, 0), 0, "the path still names it: nothing to do");

	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(chime_seg_named(fd, path), 0);
	cr_assert_eq(chime_seg_relink(fd, path, NULL, 0), 1);
	cr_assert_eq(lstat(path, &st), 0);
	cr_assert(S_ISREG(st.st_mode));
	cr_assert_neq(st.st_ino, was.st_ino, "a new file, the old inode has no name to take");
	cr_assert_eq(st.st_size, (off_t)SLAB_BYTES);
	cr_assert_eq(st.st_mode & 07777, 0640, "mode %o despite umask 077", st.st_mode & 07777);
	cr_assert_eq(st.st_gid, was.st_gid, "group %u, not the file's %u", (unsigned)st.st_gid, (unsigned)was.st_gid);
	/* 4 pages written (and the chunk tmpfs may give a huge page): sparse, not 272 MB. */
	cr_assert_lt((uint64_t)st.st_blocks * 512, 16ull << 20, "%llu bytes allocated",
		     (unsigned long long)st.st_blocks * 512);
	at = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(at, 0);
	for (size_t i = 0; i < sizeof(relink_at) / sizeof(relink_at[0]); i++) {
		unsigned char b = 0;

		cr_assert_eq(pread(at, &b, 1, (off_t)relink_at[i]), 1);
		cr_assert_eq(b, 0xa0 + i, "byte at %llu: %#x", (unsigned long long)relink_at[i], b);
		cr_assert_eq(pread(at, &b, 1, (off_t)relink_at[i] - (relink_at[i] ? 1 : -1)), 1);
		cr_assert_eq(b, 0, "a neighbour of byte %llu", (unsigned long long)relink_at[i]);
	}
	close(at);
	/* The copy is another file: once written, the path no longer names fd's. */
	cr_assert_eq(chime_seg_named(fd, path), -EEXIST);
	chime_seg_unmap(&m);
	close(fd);
	unlink(path);
	rmdir(dir);
	umask(old);
}

/* With ranges, only the data within them is copied: the rest a hole, of the same size. */
Test(segment, relink_of_ranges_copies_only_their_data)
{
	char dir[] = "/dev/shm/chime-t-XXXXXX", path[64];
	/* relink_at[0] and [2] in, [1] (5 MiB) and [3] (the last byte) out */
	const struct chime_seg_range keep[] = { { 0, 4096 }, { 130ull << 20, 1ull << 20 } };
	const bool kept[] = { true, false, true, false };
	struct chime_map m;
	struct stat st;
	int fd, at;

	fd = removed_slab(dir, path, sizeof(path), "shard0", &m);
	cr_assert_eq(chime_seg_relink(fd, path, keep, 2), 1);
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_size, (off_t)SLAB_BYTES);
	at = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(at, 0);
	for (size_t i = 0; i < sizeof(relink_at) / sizeof(relink_at[0]); i++) {
		unsigned char b = 0xff;

		cr_assert_eq(pread(at, &b, 1, (off_t)relink_at[i]), 1);
		cr_assert_eq(b, kept[i] ? 0xa0 + i : 0, "byte at %llu: %#x", (unsigned long long)relink_at[i], b);
	}
	/* what is not in a range is a hole: SEEK_DATA past the second range (and a huge page of it) finds nothing */
	cr_assert_eq(lseek(at, (off_t)(132ull << 20), SEEK_DATA), -1);
	cr_assert_eq(errno, ENXIO);
	close(at);
	/* a range to "the end" whatever the size (off + len would overflow): to the file's end */
	{
		const struct chime_seg_range tail = { SLAB_BYTES - 4096, UINT64_MAX };
		unsigned char b = 0;

		cr_assert_eq(unlink(path), 0);
		cr_assert_eq(chime_seg_relink(fd, path, &tail, 1), 1);
		at = open(path, O_RDONLY | O_CLOEXEC);
		cr_assert_geq(at, 0);
		cr_assert_eq(pread(at, &b, 1, (off_t)(SLAB_BYTES - 1)), 1);
		cr_assert_eq(b, 0xa3, "the last byte: %#x", b);
		close(at);
	}
	chime_seg_unmap(&m);
	close(fd);
	unlink(path);
	rmdir(dir);
}

/* Another file (or a symlink, even to a copy of ours) at the path is never written over, nor followed. */
Test(segment, relink_never_writes_over_another_file_at_the_path)
{
	char dir[] = "/dev/shm/chime-t-XXXXXX", path[64], target[80], buf[16] = { 0 };
	struct chime_map m;
	struct stat st;
	int fd, other;

	fd = removed_slab(dir, path, sizeof(path), "sessions", &m);
	snprintf(target, sizeof(target), "%s/elsewhere", dir);
	cr_assert_eq(t_write_file(path, "someone's"), 0);
	cr_assert_eq(chime_seg_relink(fd, path, NULL, 0), -EEXIST);
	other = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(other, 0);
	cr_assert_eq(read(other, buf, sizeof(buf) - 1), 9);
	cr_assert_str_eq(buf, "someone's");
	close(other);

	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(symlink(target, path), 0);
	cr_assert_eq(chime_seg_relink(fd, path, NULL, 0), -EEXIST);
	cr_assert_eq(access(target, F_OK), -1, "symlink followed");
	cr_assert_eq(lstat(path, &st), 0);
	cr_assert(S_ISLNK(st.st_mode));
	unlink(path);

	cr_assert_eq(chime_seg_relink(fd, "/nonexistent/dir/c.sock.shard0", NULL, 0), -ENOENT);
	chime_seg_unmap(&m);
	close(fd);
	rmdir(dir);
}

/* A filesystem with no room for the copy: an error, and nothing left half written at the path. */
Test(segment, relink_that_finds_no_room_leaves_nothing_at_the_path)
{
	char dir[PATH_MAX], path[PATH_MAX + 16];
	struct chime_map m;
	int fd;

	if (geteuid() != 0)
		cr_skip("needs root (mounts a small tmpfs)");
	cr_assert_eq(t_mount_tmpfs(dir, sizeof(dir), "24m"), 0, "mount tmpfs: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/c.sock.shard0", dir);
	cr_assert_eq(chime_seg_file(path, 32u << 20, 0, 0600, &fd, &m), 0);
	cr_assert_eq(unlink(path), 0);
	/* 16 MiB of data: the file and its copy cannot both fit in 24 MiB. */
	memset(m.base, 0x5a, 16u << 20);
	cr_assert_eq(chime_seg_relink(fd, path, NULL, 0), -ENOSPC);
	cr_assert_eq(access(path, F_OK), -1, "a partial copy was left at the path");
	chime_seg_unmap(&m);
	close(fd);
	t_unmount_tmpfs(dir);
}

/* ---- the room a filesystem leaves (chime_fs_room()) ---- */

/*
 * fstatvfs() replaced for this binary (the headers name it fstatvfs64 with
 * 64-bit offsets): for the descriptor fake_vfs_fd it returns fake_vfs,
 * which no filesystem here would (a petabyte of 64 KiB fragments), for any
 * other the real one's answer.
 */
#include <dlfcn.h>
#include <sys/statvfs.h>

static int fake_vfs_fd = -1;
static struct statvfs fake_vfs;

int fstatvfs64(int fd, struct statvfs64 *v);
int fstatvfs64(int fd, struct statvfs64 *v)
{
	int (*real)(int, struct statvfs64 *);

	if (fd >= 0 && fd == fake_vfs_fd) {
		_Static_assert(sizeof(*v) == sizeof(fake_vfs), "one struct under two names");
		memcpy(v, &fake_vfs, sizeof(*v));
		return 0;
	}
	*(void **)&real = dlsym(RTLD_NEXT, "fstatvfs64");
	return real ? real(fd, v) : (errno = ENOSYS, -1);
}

static uint64_t room_of(uint64_t blocks, uint64_t avail, uint64_t frsize)
{
	uint64_t room;

	fake_vfs = (struct statvfs){ .f_blocks = blocks, .f_bavail = avail, .f_frsize = frsize };
	fake_vfs_fd = 0;
	room = chime_fs_room(0, NULL);
	fake_vfs_fd = -1;
	return room;
}

Test(segment, fs_room_keeps_a_tenth_and_saturates_where_bytes_pass_64_bits)
{
	struct statvfs v;
	int fd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	/* a tenth of the blocks kept: 1000 blocks, 950 free -> 850 of 4 KiB */
	cr_assert_eq(room_of(1000, 950, 4096), UINT64_C(850) * 4096);
	/* at or under the keep line: nothing */
	cr_assert_eq(room_of(1000, 100, 4096), 0);
	cr_assert_eq(room_of(1000, 0, 4096), 0);
	/* no size (f_blocks 0, as some virtual filesystems say): no limit */
	cr_assert_eq(room_of(0, 0, 4096), UINT64_MAX);
	/*
	 * 2^60 free blocks of 64 KiB: 2^76 bytes. Multiplied in 64 bits that
	 * wraps (to a small or zero room, which would refuse every chunk);
	 * saturated, it is just under "no size".
	 */
	cr_assert_eq(room_of(UINT64_C(1) << 61, UINT64_C(1) << 60, 65536), UINT64_MAX - 1);
	cr_assert_eq(room_of(UINT64_MAX, UINT64_MAX - 1, 2), UINT64_MAX - 1);
	/* the real call still answers through the replacement */
	cr_assert_geq(fd, 0);
	cr_assert_eq(fstatvfs(fd, &v), 0);
	cr_assert_gt(v.f_blocks, 0);
	cr_assert_neq(chime_fs_room(fd, NULL), UINT64_MAX - 1);
	close(fd);
}
