/* SPDX-License-Identifier: MIT */
/*
 * test_sessfile.c - the sessions file a broker leaves to the next one: each
 * broker rewrites it in place, so that one killed while taking the
 * sessions over, or one on a full filesystem, leaves every session it was
 * handed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "sessfile.h"

#define CLIENTS 4096u           /* a 512 KiB file: a write of it spans many pages */

static const struct sessfile_geom geom = {
	.nr_shards = 2,
	.max_clients = CLIENTS,
	.capacity = 1u << 20,
	.layout = CHIME_SHM_LAYOUT,
	.resolution_ns = 1000000,
};

static struct sessfile_rec recs[CLIENTS], got[CLIENTS];
static char dir[64], path[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/chime-sessfile-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/chime.sock.sessions", dir);
}

static void teardown(void)
{
	t_rmdir_files(dir);
}

/* recs holds the sessions named, each at its slot. */
static void sessions(const uint32_t *slots, const char *const *names, unsigned n)
{
	memset(recs, 0, sizeof(recs));
	for (unsigned i = 0; i < n; i++) {
		struct sessfile_rec *r = &recs[slots[i]];

		r->used = 1;
		r->slot = slots[i];
		r->uid = 1000 + slots[i];
		r->gid = 1000;
		r->generation = 7;
		snprintf(r->name, sizeof(r->name), "%s", names[i]);
	}
}

static void write_sessions(const uint32_t *slots, const char *const *names, unsigned n)
{
	struct sessfile sf;

	sessions(slots, names, n);
	cr_assert_eq(sessfile_open(&sf, path, &geom, recs), 0);
	sessfile_close(&sf);
}

static int load(uint32_t *bad)
{
	memset(got, 0, sizeof(got));
	return sessfile_load(path, &geom, got, bad, NULL);
}

TestSuite(sessfile, .init = setup, .fini = teardown);

Test(sessfile, a_rewrite_is_in_place_and_clears_the_slots_no_session_holds)
{
	struct stat before, after;
	uint32_t bad;

	write_sessions((uint32_t[]){ 1, 5 }, (const char *const[]){ "kept", "gone" }, 2);
	cr_assert_eq(stat(path, &before), 0);
	cr_assert_eq(before.st_mode & 07777, 0600, "mode %o", before.st_mode & 07777);
	write_sessions((uint32_t[]){ 1, 9 }, (const char *const[]){ "kept", "new" }, 2);
	cr_assert_eq(stat(path, &after), 0);
	cr_assert_eq(after.st_ino, before.st_ino, "the file was replaced, not rewritten");
	cr_assert_eq(load(&bad), 2);
	cr_assert_eq(bad, 0);
	cr_assert_str_eq(got[1].name, "kept");
	cr_assert_str_eq(got[9].name, "new");
	cr_assert_eq(got[9].uid, 1009);
	cr_assert_eq(got[5].used, 0, "a session no broker holds is still recorded");
}

/*
 * The broker that takes sessions over rewrites the file before it listens.
 * It used to unlink and re-create it, and then write each session: killed
 * in between (a crash, an OOM kill, systemd's watchdog), it left a file
 * with fewer sessions, or none, and the next broker freed their timers as
 * an anonymous client's. Here a process rewrites the file over and over and
 * is killed at random moments: every session it was handed must be there
 * after each kill, intact.
 */
Test(sessfile, a_broker_killed_while_rewriting_leaves_every_session, .timeout = 60)
{
	const uint32_t slots[] = { 1, 300, 4095 };
	const char *const names[] = { "orders", "reminders", "last" };
	uint64_t rng = 42;
	unsigned kills = 0;

	write_sessions(slots, names, 3);
	for (unsigned round = 0; round < 300; round++) {
		uint32_t bad;
		int pid = fork(), st, n;

		cr_assert_geq(pid, 0);
		if (pid == 0) {
			struct sessfile sf;

			sessions(slots, names, 3);
			for (;;) {
				if (sessfile_open(&sf, path, &geom, recs) < 0)
					_exit(1);
				sessfile_close(&sf);
			}
		}
		usleep((useconds_t)(splitmix64(&rng) % 3000));
		kill(pid, SIGKILL);
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_assert(WIFSIGNALED(st), "the writer failed (status %d)", st);
		kills++;
		n = load(&bad);
		cr_assert_eq(n, 3, "after kill %u: %d sessions in the file, not 3 (%u damaged)", kills, n, bad);
		cr_assert_eq(bad, 0, "after kill %u: %u damaged records", kills, bad);
		for (unsigned i = 0; i < 3; i++)
			cr_assert_str_eq(got[slots[i]].name, names[i]);
	}
}

Test(sessfile, a_rewrite_needs_no_room_and_a_new_file_that_finds_none_is_removed)
{
	char tdir[64];
	struct sessfile sf;
	uint32_t bad;

	if (geteuid() != 0)
		cr_skip("mounting a tmpfs needs root");
	cr_assert_eq(t_mount_tmpfs(tdir, sizeof(tdir), "1m"), 0, "mount tmpfs: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/chime.sock.sessions", tdir);
	write_sessions((uint32_t[]){ 2 }, (const char *const[]){ "before" }, 1);
	cr_assert_geq(t_fill(tdir, "filler", 0), 0, "filling: %s", strerror(errno));
	write_sessions((uint32_t[]){ 2, 3 }, (const char *const[]){ "before", "after" }, 2);
	cr_assert_eq(load(&bad), 2, "the sessions rewritten on a full filesystem");

	cr_assert_eq(unlink(path), 0);
	cr_assert_geq(t_fill(tdir, "more", 0), 0, "filling: %s", strerror(errno));
	cr_assert_eq(sessfile_open(&sf, path, &geom, recs), -ENOSPC);
	cr_assert_eq(access(path, F_OK), -1, "a file that found no room is left behind");
	t_unmount_tmpfs(tdir);
}

/*
 * A file of a broker before the header's copy ends with its records; with
 * 4095 of them, at a page boundary, the copy needs a page more. On a full
 * filesystem it is rewritten without the copy, as before, rather than not
 * at all (the broker did not start: every session's timers held up).
 */
Test(sessfile, a_file_without_the_headers_copy_is_rewritten_on_a_full_filesystem)
{
	struct sessfile_geom g = geom;
	struct sessfile sf;
	uint32_t bad;
	char tdir[64];
	struct stat st;

	if (geteuid() != 0)
		cr_skip("mounting a tmpfs needs root");
	g.max_clients = CLIENTS - 1;
	cr_assert_eq(t_mount_tmpfs(tdir, sizeof(tdir), "1m"), 0, "mount tmpfs: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/chime.sock.sessions", tdir);
	sessions((uint32_t[]){ 2 }, (const char *const[]){ "older" }, 1);
	cr_assert_eq(sessfile_open(&sf, path, &g, recs), 0);
	sessfile_close(&sf);
	cr_assert_eq(truncate(path, (off_t)sessfile_size(g.max_clients) - 128), 0, "as a broker before the copy left it");
	cr_assert_geq(t_fill(tdir, "filler", 0), 0, "filling: %s", strerror(errno));
	cr_assert_eq(sessfile_open(&sf, path, &g, recs), 0, "a file without the header's copy, on a full filesystem");
	sessfile_close(&sf);
	memset(got, 0, sizeof(got));
	cr_assert_eq(sessfile_load(path, &g, got, &bad, NULL), 1);
	cr_assert_str_eq(got[2].name, "older");
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_size, (off_t)sessfile_size(g.max_clients) - 128, "grown past its room");
	t_unmount_tmpfs(tdir);
}

Test(sessfile, something_else_where_the_file_should_be_is_refused_and_left_alone, .timeout = 10)
{
	struct sessfile sf;
	char target[160];
	uint32_t bad;

	memset(recs, 0, sizeof(recs));
	cr_assert_eq(mkfifo(path, 0600), 0);
	/* Loading it must not block in open() waiting for a writer: the broker would hang at start. */
	cr_assert_eq(load(&bad), -EINVAL, "a FIFO, loaded");
	cr_assert_eq(sessfile_open(&sf, path, &geom, recs), -EINVAL, "a FIFO");
	cr_assert_eq(access(path, F_OK), 0, "the FIFO was removed");
	cr_assert_eq(unlink(path), 0);

	snprintf(target, sizeof(target), "%s/elsewhere", dir);
	cr_assert_eq(symlink(target, path), 0);
	cr_assert_eq(sessfile_open(&sf, path, &geom, recs), -ELOOP, "a symbolic link");
	cr_assert_eq(access(target, F_OK), -1, "the link was followed");
	cr_assert_eq(unlink(path), 0);

	cr_assert_eq(mkdir(path, 0700), 0);
	cr_assert_eq(load(&bad), -EISDIR, "a directory, loaded");
	cr_assert_eq(rmdir(path), 0);
}

/*
 * Two sealed records of one name (a clear that failed left the old one, and
 * the session was opened again in another slot): the next broker took both,
 * and a process re-opening the name got the first slot, maybe the stale
 * one, its timers in the other lost without a word. Neither is trusted now;
 * the other sessions are taken as before. Found by tests/fuzz/fuzz_sessions.
 */
Test(sessfile, a_name_recorded_in_two_slots_is_trusted_in_neither)
{
	uint32_t bad;

	write_sessions((uint32_t[]){ 2, 3, 7 }, (const char *const[]){ "twice", "once", "twice" }, 3);
	cr_assert_eq(load(&bad), 1);
	cr_assert_eq(bad, 2, "%u damaged records, not the two of one name", bad);
	cr_assert_str_eq(got[3].name, "once");
	cr_assert_eq(got[2].used, 0, "a record of a name recorded twice was taken");
	cr_assert_eq(got[7].used, 0, "a record of a name recorded twice was taken");
}
