/* SPDX-License-Identifier: MIT */
/*
 * test_access.c - who may connect, and what one user can see or do to
 * another's timers (chimed(8) ACCESS, ARCHITECTURE.md "Who may do what").
 *
 * Most cases need two unprivileged users and a group, so they run as root
 * (as CI does) and are skipped otherwise: the suite creates chimet1, chimet2
 * (a supplementary member of chimetg) and the group chimetg if missing, and
 * runs each client in a forked child that drops to that user with
 * initgroups/setgid/setuid. A child reports by its exit status.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"
#include "helpers.h"
#include "segment.h"

#define MS 1000000ull

static struct t_chimed tb;

static void stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(access, .fini = stop, .timeout = 120);

/* ---- users ---- */

static void need_users(void)
{
	if (geteuid() != 0)
		cr_skip("needs root (creates users chimet1, chimet2 and group chimetg)");
	if (!getgrnam("chimetg"))
		(void)!system("groupadd -r chimetg >/dev/null 2>&1");
	if (!getpwnam("chimet1"))
		(void)!system("useradd -r -M -s /usr/sbin/nologin chimet1 >/dev/null 2>&1");
	if (!getpwnam("chimet2"))
		(void)!system("useradd -r -M -s /usr/sbin/nologin -G chimetg chimet2 >/dev/null 2>&1");
	cr_assert(getpwnam("chimet1") && getpwnam("chimet2") && getgrnam("chimetg"),
		  "could not create the test users (useradd, groupadd)");
}

/* In a child: become `user` (with its supplementary groups), or exit 90. */
static void become(const char *user)
{
	struct passwd *pw = getpwnam(user);

	if (!pw || initgroups(user, pw->pw_gid) < 0 || setgid(pw->pw_gid) < 0 || setuid(pw->pw_uid) < 0)
		_exit(90);
}

/* In a child: become uid (no groups but its own number), or exit 90. */
static void become_uid(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
		_exit(90);
}

/*
 * Start fn(arg) in a child that exits with its result, as `user` or, if
 * that is NULL, as uid; its pid (see user_done()).
 */
static pid_t child_start(const char *user, uid_t uid, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		if (user)
			become(user);
		else
			become_uid(uid);
		prctl(PR_SET_PDEATHSIG, SIGKILL);      /* after: a change of credentials clears it */
		_exit(fn(arg));
	}
	return pid;
}

static pid_t as_user_start(const char *user, int (*fn)(void *), void *arg)
{
	return child_start(user, 0, fn, arg);
}

/* Its exit status (0: fn said ok), or 128 + the signal that ended it. */
static int user_done(pid_t pid)
{
	int st;

	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run fn(arg) as `user` in a child; returns its exit status (0: fn said ok). */
static int as_user(const char *user, int (*fn)(void *), void *arg)
{
	return user_done(as_user_start(user, fn, arg));
}

/* A broker other users can reach: its private directory must be traversable. */
static void start(const char *extra)
{
	cr_assert_eq(t_chimed_start(&tb, NULL, extra), 0, "chimed %s did not start", extra);
	cr_assert_eq(chmod(tb.dir, 0755), 0);
}

static int open_status(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *c = NULL;
	int r = chime_open(&c, &o);

	(void)arg;
	if (r == 0)
		chime_close(c);
	return r == 0 ? 0 : r == -EACCES ? 13 : r == -EUSERS ? 87 : 1;
}

/* Opens, arms a timer 20 ms ahead and receives it. */
static int open_arm_receive(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct chime_event ev;
	chime_t *c = NULL;
	chime_id_t id;
	int r = chime_open(&c, &o);

	(void)arg;
	if (r < 0)
		return r == -EACCES ? 13 : 1;
	if (chime_arm(c, 1, chime_now() + 20 * MS, 0, 7, &id) < 0)
		return 2;
	r = chime_wait(c, &ev, 1, 2000);
	chime_close(c);
	return r == 1 && ev.id == id && ev.user_data == 7 ? 0 : 3;
}

Test(access, other_users_are_refused_by_default)
{
	need_users();
	start("");
	cr_assert_eq(as_user("chimet1", open_status, NULL), 13, "expected EACCES");
	cr_assert_eq(open_status(NULL), 0, "root is always admitted");
}

Test(access, allow_uid_by_name_admits_that_user_only)
{
	need_users();
	start("--allow-uid chimet1");
	cr_assert_eq(as_user("chimet1", open_arm_receive, NULL), 0);
	cr_assert_eq(as_user("chimet2", open_status, NULL), 13);
}

Test(access, allow_gid_admits_supplementary_members)
{
	need_users();
	start("--allow-gid chimetg");
	cr_assert_eq(as_user("chimet2", open_arm_receive, NULL), 0, "chimet2 is in chimetg");
	cr_assert_eq(as_user("chimet1", open_status, NULL), 13);
}

/*
 * Start fn(NULL) as `user` (its uid and primary gid) in 300 supplementary
 * groups, 50000..50299 (gids need no names), in a child; its pid.
 */
static pid_t as_user_in_many_groups(const char *user, int (*fn)(void *))
{
	struct passwd *pw = getpwnam(user);
	pid_t pid;

	cr_assert_not_null(pw);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		gid_t g[300];

		for (unsigned i = 0; i < 300; i++)
			g[i] = 50000 + i;
		if (setgroups(300, g) < 0 || setgid(pw->pw_gid) < 0 || setuid(pw->pw_uid) < 0)
			_exit(90);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(fn(NULL));
	}
	return pid;
}

/*
 * A user in more groups than the broker's first buffer holds (256) is
 * admitted by any of them: SO_PEERGROUPS said ERANGE, and the broker then
 * looked at the primary group alone and refused a member of --allow-gid.
 */
Test(access, a_member_of_many_groups_is_admitted_by_any_of_them)
{
	int r;

	need_users();
	start("--allow-gid 50299");
	r = user_done(as_user_in_many_groups("chimet1", open_status));
	cr_assert_eq(r, 0, "chimet1 in 300 groups, the last allowed: %d (13: refused)", r);
	stop();
	start("--allow-gid 50000");
	r = user_done(as_user_in_many_groups("chimet1", open_status));
	cr_assert_eq(r, 0, "chimet1 in 300 groups, the first allowed: %d (13: refused)", r);
	stop();
	start("--allow-gid 50300");
	r = user_done(as_user_in_many_groups("chimet1", open_status));
	cr_assert_eq(r, 13, "chimet1 in none of the groups allowed: %d", r);
}

Test(access, allow_all_admits_everyone_and_opens_the_socket)
{
	struct stat st;

	need_users();
	start("--allow-all");
	cr_assert_eq(stat(tb.sock, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0666);
	cr_assert_eq(as_user("chimet1", open_arm_receive, NULL), 0);
	cr_assert_eq(as_user("chimet2", open_arm_receive, NULL), 0);
}

Test(access, socket_mode_follows_the_policy)
{
	struct stat st;

	need_users();
	start("");
	cr_assert_eq(stat(tb.sock, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600, "only root and the broker's user: %o", st.st_mode & 0777);
	t_chimed_stop(&tb, SIGTERM);
	start("--allow-gid chimetg --socket-group chimetg");
	cr_assert_eq(stat(tb.sock, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0660);
	cr_assert_eq(st.st_gid, getgrnam("chimetg")->gr_gid);
}

static int open_many(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	int want = *(int *)arg, r = 0, i;
	chime_t *c[8];

	for (i = 0; i < want && r == 0; i++)
		r = chime_open(&c[i], &o);
	/* i - 1 opened when r failed */
	for (int k = 0; k < (r ? i - 1 : i); k++)
		chime_close(c[k]);
	return r == 0 ? 0 : r == -EUSERS ? 100 + i - 1 : 1;
}

Test(access, max_clients_per_uid_gives_eusers_to_that_user_only)
{
	int three = 3, two = 2;

	need_users();
	start("--allow-all --max-clients-per-uid 2");
	cr_assert_eq(as_user("chimet1", open_many, &three), 102, "the third of one user's clients gets EUSERS");
	cr_assert_eq(as_user("chimet2", open_many, &two), 0, "another user is not affected");
}

/*
 * As `user`, in a child: open clients until one is refused (at most 64)
 * and keep them. *opened says how many opened; returns the child's pid
 * (unhold() ends it) and the refusal's errno in *err.
 */
static pid_t hold_clients(const char *user, int *opened, int *err)
{
	int p[2], got[2] = { -1, -1 };
	pid_t pid;

	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct chime_opts o = { .socket_path = tb.sock };
		chime_t *c[64];
		int n = 0, r = 0;

		close(p[0]);
		become(user);
		prctl(PR_SET_PDEATHSIG, SIGKILL);      /* after: a change of credentials clears it */
		while (n < 64 && (r = chime_open(&c[n], &o)) == 0)
			n++;
		got[0] = n;
		got[1] = -r;
		if (write(p[1], got, sizeof(got)) != sizeof(got))
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	cr_assert_eq(read(p[0], got, sizeof(got)), (ssize_t)sizeof(got));
	close(p[0]);
	*opened = got[0];
	*err = got[1];
	return pid;
}

static void unhold(pid_t pid);

static int connect_raw(void);

/* One query by hand: its answer's head in *head (status -1: no answer), then up to n records. */
static void raw_query(uint32_t flags, pid_t pid, uint64_t limit, struct chime_query_head *head,
		      void *recs, size_t rec_size, size_t n)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = flags,
				 .pid = pid, .limit = limit };
	int fd = connect_raw();
	size_t got = 0;

	head->status = -1;
	if (fd < 0 || send(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
	    recv(fd, head, sizeof(*head), 0) != (ssize_t)sizeof(*head))
		head->status = -1;
	while (head->status == 0 && got < n && got < head->count) {
		ssize_t r = recv(fd, (char *)recs + got * rec_size, (n - got) * rec_size, 0);

		if (r <= 0)
			break;
		got += (size_t)r / rec_size;
	}
	if (fd >= 0)
		close(fd);
}

/*
 * What chimectl users is told with the table at its kept sixteenth (32
 * slots, 2 kept, 31 taken by the two users): each of them kept out, with
 * the table's free slots; root, once its client is reclaimed, not listed.
 */
static void users_said_kept_out(uid_t one, uid_t two)
{
	struct chime_query_user u[4];
	struct chime_query_head head;
	unsigned seen = 0;

	/*
	 * root's own client (open_status()) is listed until the shards have
	 * reclaimed its slot; a query right after another is answered EBUSY
	 * (chimectl asks again 60 ms later, as here)
	 */
	for (int k = 0; k < 50; k++) {
		memset(u, 0, sizeof(u));
		raw_query(CHIME_HELLO_QUERY_USERS, 0, 4, &head, u, sizeof(u[0]), 4);
		if (head.status != -EBUSY && (head.status != 0 || head.count != 3))
			break;
		usleep(60000);
	}
	cr_assert_eq(head.status, 0, "the users query: %s", strerror(-head.status));
	for (uint64_t i = 0; i < head.count && i < 4; i++) {
		bool kept = u[i].flags & CHIME_QUERY_USER_KEPT_OUT;

		cr_expect(u[i].uid == one || u[i].uid == two, "uid %u listed, holding %u slots", u[i].uid, u[i].clients);
		cr_expect(kept, "uid %u (%u slots) not said kept out, %u of 32 free", u[i].uid, u[i].clients,
			  u[i].table_free);
		cr_expect_eq(u[i].table_free, 1, "uid %u: %u free slots said, not 1", u[i].uid, u[i].table_free);
		cr_expect_eq(u[i].table_kept, 2, "uid %u: %u kept slots said, not 2", u[i].uid, u[i].table_kept);
		seen += kept;
	}
	cr_expect_eq(seen, 2, "%u users said kept out of %lu listed, not 2", seen, (unsigned long)head.count);
}

/* chimectl users says so, on each kept-out user's line and in its JSON. */
static void chimectl_says_kept_out(void)
{
	char cmd[1024], out[4096];
	size_t n;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "\"$CHIMECTL\" --socket '%s' users; \"$CHIMECTL\" --socket '%s' -j users | "
		 "jq -c '[.users[] | select(.kept_out) | [.table_free, .table_kept]]'", tb.sock, tb.sock);
	f = popen(cmd, "r");
	cr_assert(f, "popen: %s", strerror(errno));
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	cr_expect_eq(pclose(f), 0, "chimectl users failed: %s", out);
	cr_expect(strstr(out, "(kept out: the table's 1 free slot is kept for users holding none)"),
		  "no kept-out note in chimectl users: %s", out);
	cr_expect(strstr(out, "[[1,2],[1,2]]"), "chimectl -j users does not say both kept out of 1 free: %s", out);
}

/*
 * The last sixteenth of the client table is kept for users that hold none
 * of it: a user and its subordinate uids are two shares, and detached
 * sessions keep their slots for an hour across restarts, so two users
 * could fill a table of 256 and lock every other user out (a hostile-client
 * audit). Root and the broker's user are not kept out of it.
 */
Test(access, the_last_sixteenth_of_the_client_table_is_kept_for_users_holding_none)
{
	pid_t first, second;
	int n, err, n2, err2;

	need_users();
	start("--allow-all --max-clients 32 --max-clients-per-uid 0");
	first = hold_clients("chimet1", &n, &err);
	second = hold_clients("chimet2", &n2, &err2);
	cr_expect_eq(n, 30, "one user took %d of 32 slots (%s), not all but the last 2", n, strerror(err));
	cr_expect_eq(err, EUSERS);
	cr_expect_eq(n2, 1, "another user took %d of the last slots (%s), not 1", n2, strerror(err2));
	cr_expect_eq(err2, EUSERS);
	cr_expect_eq(open_status(NULL), 0, "root was kept out of the last slot");
	users_said_kept_out(getpwnam("chimet1")->pw_uid, getpwnam("chimet2")->pw_uid);
	chimectl_says_kept_out();
	unhold(first);
	unhold(second);
}

/* Slots of the control segment's client table in `state` (CHIME_CLIENT_*). */
static unsigned in_state(const struct chime_ctl *ctl, uint32_t state)
{
	const struct chime_client_ctl *cc = (const void *)((const char *)ctl + ctl->clients_off);
	unsigned n = 0;

	for (uint32_t i = 0; i < ctl->max_clients; i++)
		n += at_load(&cc[i].state) == state;
	return n;
}

/* Clients the shards are still reclaiming. */
static unsigned dying(const struct chime_ctl *ctl)
{
	return in_state(ctl, CHIME_CLIENT_DYING);
}

/*
 * Clients connected or still being reclaimed, in one look at each slot:
 * dying() || in_state(ACTIVE) looked twice, and a slot going from active
 * to dying between the two looks was in neither.
 */
static unsigned taken(const struct chime_ctl *ctl)
{
	const struct chime_client_ctl *cc = (const void *)((const char *)ctl + ctl->clients_off);
	unsigned n = 0;

	for (uint32_t i = 0; i < ctl->max_clients; i++) {
		uint32_t st = at_load(&cc[i].state);

		n += st == CHIME_CLIENT_ACTIVE || st == CHIME_CLIENT_DYING;
	}
	return n;
}

/* A worker: opens a client, sleeps in chime_wait() (its io_uring polls the socket), exits: 0, or the open's errno. */
static void worker_exits(void)
{
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *c = NULL;
	int r = chime_open(&c, &o);

	if (r < 0)
		_exit(-r < 256 ? -r : 255);
	(void)chime_wait(c, &(struct chime_event){ 0 }, 1, 1);
	_exit(0);
}

/*
 * A prefork server at its --max-clients-per-uid replaces each worker that
 * exits at once. The exited worker's socket hangs up only when the kernel
 * tears its io_uring down, 8-13 ms after the exit: its slot counted until
 * then, and the replacement got -EUSERS (the broker now watches each
 * client's process, as a pidfd). The replacements here open in this process
 * right after reaping the workers, 20 rounds; their own closes end them at
 * once (chime_close() shuts the socket down). Each round's workers open
 * once the last round's four clients are reclaimed: while they are, they
 * count against the user's second share (uid_full(): twice the limit in
 * all), and under ASan, two cases at a time, a worker was refused there
 * once in CI (2026-12-02, round 2).
 */
Test(access, a_worker_replaced_at_once_takes_the_slot_of_the_one_that_exited)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct chime_map m;
	char path[300];

	start("--allow-all --shards 1 --max-clients-per-uid 2");
	o.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	for (int round = 0; round < 20; round++) {
		chime_t *c[2] = { NULL, NULL };
		pid_t pid[2];
		int st;

		for (int i = 0; i < 5000 && taken(m.base); i++)
			usleep(1000);
		cr_assert(!taken(m.base),
			  "round %d: the last round's clients not reclaimed after 5 s (%u active, %u dying)", round,
			  in_state(m.base, CHIME_CLIENT_ACTIVE), dying(m.base));
		for (int i = 0; i < 2; i++) {
			pid[i] = fork();
			cr_assert_geq(pid[i], 0);
			if (pid[i] == 0)
				worker_exits();
		}
		for (int i = 0; i < 2; i++) {
			cr_assert_eq(waitpid(pid[i], &st, 0), pid[i]);
			cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "round %d: worker %d could not open: %s", round, i,
				  WIFEXITED(st) ? strerror(WEXITSTATUS(st)) : "killed");
		}
		for (int i = 0; i < 2; i++) {
			int r = chime_open(&c[i], &o);

			cr_assert_eq(r, 0, "round %d: replacement %d: %s", round, i, strerror(-r));
		}
		chime_close(c[0]);
		chime_close(c[1]);
	}
	chime_seg_unmap(&m);
}

/*
 * As chimet1, 50 rounds: a worker opens and exits, and its replacement
 * opens at once. 0, or 100 + the round whose replacement was refused
 * (EUSERS), or 1 for anything else.
 */
static int replace_at_the_kept_sixteenth(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };

	(void)arg;
	for (int round = 0; round < 50; round++) {
		chime_t *c = NULL;
		pid_t w = fork();
		int st, r;

		if (w < 0)
			return 1;
		if (w == 0)
			worker_exits();
		if (waitpid(w, &st, 0) != w || !WIFEXITED(st) || WEXITSTATUS(st))
			return 1;
		r = chime_open(&c, &o);
		if (r == -EUSERS)
			return 100 + round;
		if (r < 0)
			return 1;
		chime_close(c);
		usleep(50000);          /* both reclaimed: the next worker finds the table as this one did */
	}
	return 0;
}

/*
 * The kept sixteenth counts a slot being reclaimed as no slot held, as
 * uid_full() does: a user whose only client just exited and is replaced
 * at once, with the table at its last sixteenth (root holds 29 of 32, the
 * user 1: 2 left), gets in (6283fec, which had no test; a review).
 */
Test(access, a_worker_replaced_at_once_at_the_tables_kept_sixteenth_gets_in)
{
	chime_t *held[29];
	int st;

	need_users();
	start("--allow-all --shards 1 --max-clients 32 --max-clients-per-uid 0");
	for (int i = 0; i < 29; i++)
		cr_assert_not_null(held[i] = t_open(tb.sock));
	st = as_user("chimet1", replace_at_the_kept_sixteenth, NULL);
	cr_expect_eq(st, 0, "%s %d", st >= 100 ? "the replacement got EUSERS in round" : "chimet1's side failed:",
		     st >= 100 ? st - 100 : st);
	for (int i = 0; i < 29; i++)
		chime_close(held[i]);
}

/*
 * A client being reclaimed does not count against --max-clients-per-uid,
 * but only as many again as the limit may be reclaiming: a user who closes
 * faster than the shards reclaim must not take the whole table. At a limit
 * of 1: A holds a million timers, which the shard reclaims 16384 nodes a
 * pass; B opens meanwhile (A does not count), the shard is held (ptrace)
 * and B closes. Two being reclaimed, none live: C gets EUSERS until the
 * shard, let go, has reclaimed them. Up to three tries: on a loaded host
 * the shard can finish A's reclaim before this process holds it (seen once
 * with other tests running beside it).
 */
Test(access, clients_being_reclaimed_count_up_to_the_limit_again)
{
	struct chime_opts o = { .socket_path = tb.sock };
	const unsigned timers = 1000000;
	struct chime_map m;
	chime_t *a = NULL, *b = NULL, *c = NULL;
	char path[300];
	chime_id_t id;
	unsigned held_a = 0, held_ab;
	uint64_t far;
	int tid, r;

	start("--allow-all --shards 1 --max-clients-per-uid 1");
	o.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0);
	for (unsigned attempt = 0; attempt < 3 && held_a != 1; attempt++) {
		if (attempt) {
			/* A was reclaimed before the hold: let go, B closed and gone, and again. */
			cr_assert_eq(t_thread_release(tid), 0);
			chime_close(b);
			for (int i = 0; i < 5000 && taken(m.base); i++)
				usleep(1000);
			fprintf(stderr, "access: A was reclaimed before the shard was held; try %u\n", attempt + 1);
		}
		cr_assert_eq(chime_open(&a, &o), 0);
		far = now_ns() + 3600000 * MS;
		for (unsigned i = 0; i < timers; i++)
			if ((r = chime_arm(a, 1, far + i, 0, i, &id)) < 0)
				cr_assert_fail("arm %u: %s", i, strerror(-r));
		cr_assert_eq(chime_flush(a), 0);
		cr_assert_eq(t_nodes_settle(tb.sock, T_NODES_TIMERS, timers), timers);
		chime_close(a);

		r = chime_open(&b, &o);
		cr_assert_eq(r, 0, "B, while A is reclaimed: %s", strerror(-r));
		r = t_thread_hold(tid);
		if (r < 0)
			cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
		/* Nothing asserted while the shard is held: a failure would leave it so. */
		held_a = dying(m.base);
	}
	chime_close(b);
	for (int i = 0; i < 2000 && dying(m.base) != 2; i++)
		usleep(1000);
	held_ab = dying(m.base);
	r = chime_open(&c, &o);
	cr_assert_eq(t_thread_release(tid), 0);
	cr_assert_eq(held_a, 1, "A was reclaimed before the shard was held, three times: %u clients dying", held_a);
	cr_assert_eq(held_ab, 2, "B is not being reclaimed after its close: %u clients dying", held_ab);
	cr_assert_eq(r, -EUSERS, "C with two of its user's clients being reclaimed at a limit of 1: %s",
		     r ? strerror(-r) : "admitted");

	for (int i = 0; i < 1000 && (r = chime_open(&c, &o)) == -EUSERS; i++)
		usleep(10000);
	cr_assert_eq(r, 0, "C once the shard has reclaimed A or B: %s", strerror(-r));
	for (int i = 0; i < 5000 && dying(m.base); i++)
		usleep(1000);
	cr_assert_eq(dying(m.base), 0, "A and B are still being reclaimed 5 s after the shard was let go");
	chime_close(c);
	chime_seg_unmap(&m);
}

/*
 * A hello (of `session`, or "" anonymous) whose welcome the caller will
 * never read; it shuts the socket down (the broker sees the client go) and
 * keeps it open, so that the welcome's descriptors stay in flight.
 */
static int hello_unread(const char *session)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(h.session, sizeof(h.session), "%s", session);
	cr_assert_geq(fd, 0);
	cr_assert_lt(strlen(tb.sock), sizeof(sa.sun_path));
	memcpy(sa.sun_path, tb.sock, strlen(tb.sock) + 1);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
	return fd;
}

/*
 * At a --max-clients-per-uid of `share`, n hellos sent at once and never
 * read, their sockets shut down but kept open: the broker holds all n
 * slots (shown taken), refuses the user's next hello (no welcome sent),
 * and gives the slots back once the sockets are closed.
 */
static void welcomes_held_then_dropped(unsigned share, unsigned n)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct chime_welcome w;
	struct chime_map m;
	const struct chime_ctl *ctl;
	char path[300], args[96];
	chime_t *c = NULL;
	int held[8], next, r;

	cr_assert_leq(n, 8u);
	snprintf(args, sizeof(args), "--allow-all --shards 1 --max-clients-per-uid %u", share);
	start(args);
	o.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	ctl = m.base;
	for (unsigned i = 0; i < n; i++)
		held[i] = hello_unread("");
	/* the welcome is sent once the shard attached it: then the broker sees it go */
	for (int k = 0; k < 5000 && at_load(&ctl->clients_total) < n; k++)
		usleep(1000);
	cr_assert_eq(at_load(&ctl->clients_total), n, "hellos admitted at once at a share of %u", share);
	for (unsigned i = 0; i < n; i++)
		shutdown(held[i], SHUT_RDWR);
	for (int k = 0; k < 5000 && (at_load(&ctl->clients_now) != 0 || in_state(ctl, CHIME_CLIENT_DYING) < n); k++)
		usleep(1000);
	cr_assert_eq(at_load(&ctl->clients_now), 0, "the broker did not see the clients go");
	cr_assert_eq(in_state(ctl, CHIME_CLIENT_DYING), n, "held slots shown taken, of %u", n);
	next = hello_unread("");
	r = (int)recv(next, &w, sizeof(w), 0);
	close(next);
	cr_assert(r == (int)sizeof(w) && w.status == -EUSERS && w.nr_fds == 0,
		  "a hello with %u welcomes unread at a share of %u: %d bytes, status %d, %u descriptors",
		  n, share, r, r > 0 ? w.status : 0, r > 0 ? w.nr_fds : 0);
	for (unsigned i = 0; i < n; i++)
		close(held[i]);
	for (int i = 0; i < 100 && (r = chime_open(&c, &o)) == -EUSERS; i++)
		usleep(20000);
	cr_assert_eq(r, 0, "an open once the welcomes were dropped: %s", strerror(-r));
	cr_assert_eq(in_state(ctl, CHIME_CLIENT_DYING), 0, "drained slots are still shown as taken");
	chime_close(c);
	chime_seg_unmap(&m);
}

/*
 * Descriptors the broker sends (a welcome's) count against its user until
 * they are received, up to its RLIMIT_NOFILE, for all its sockets: a user
 * who never read its welcomes, sockets shut down but kept open, once made
 * every later welcome fail (ETOOMANYREFS, an audit: after 410 at a limit of
 * 2048). Such a slot now stays taken until the welcome is read or dropped,
 * and a user that holds a quarter of its --max-clients-per-uid so (at least
 * one) is refused: at a limit of 4, one held, the next hello is refused
 * (and no welcome sent); closed, the slot comes back.
 */
Test(access, welcomes_never_read_keep_their_slots_taken)
{
	welcomes_held_then_dropped(4, 1);
}

/*
 * The quarter is checked when a client is admitted, and a user may have
 * MAX_HANDSHAKES_PER_UID (8) attaches under way at once: at a share of 8,
 * eight hellos sent together, none read, all end held, past the quarter
 * (2) that an audit found the docs promising. What holds is the bound the
 * docs now give, the share plus a quarter less one (9 here), and every
 * later open of that user refused until they drain.
 */
Test(access, unread_welcomes_under_way_at_once_stay_under_the_share_and_a_quarter)
{
	welcomes_held_then_dropped(8, 8);
}

/*
 * A slot held (its welcome never read) was listed (chimectl clients,
 * chimestat) under the pid, uid and comm of whoever had the slot before:
 * the control table's identity was written for ACTIVE and DETACHED only,
 * and a slot that never became ACTIVE went to DYING with its last
 * occupant's. Here the last occupant is a child that opened and closed;
 * the held slot must show this process, as chimectl users counts it.
 */
Test(access, a_held_slot_is_listed_as_its_own_clients_not_the_slots_last)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct chime_map m;
	const struct chime_ctl *ctl;
	const struct chime_client_ctl *cc;
	char path[300];
	int held, st, shown = -1;
	pid_t child;

	start("--allow-all --shards 1 --max-clients-per-uid 4");
	o.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	ctl = m.base;
	cc = (const void *)((const char *)ctl + ctl->clients_off);
	child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		chime_t *c;

		_exit(chime_open(&c, &o) == 0 ? (chime_close(c), 0) : 1);
	}
	cr_assert_eq(waitpid(child, &st, 0), child);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's open and close failed");
	for (int k = 0; k < 2000 && in_state(ctl, CHIME_CLIENT_EMPTY) != ctl->max_clients; k++)
		usleep(1000);
	held = hello_unread("");
	for (int k = 0; k < 2000 && at_load(&ctl->clients_total) < 2; k++)
		usleep(1000);
	shutdown(held, SHUT_RDWR);
	for (int k = 0; k < 2000 && in_state(ctl, CHIME_CLIENT_DYING) != 1; k++)
		usleep(1000);
	cr_assert_eq(in_state(ctl, CHIME_CLIENT_DYING), 1, "the held slot is not shown as taken");
	for (uint32_t i = 0; i < ctl->max_clients; i++)
		if (at_load(&cc[i].state) == CHIME_CLIENT_DYING)
			shown = (int)at_load(&cc[i].pid);
	cr_assert_eq(shown, (int)getpid(), "the held slot is listed as pid %d (the child was %d), not %d",
		     shown, (int)child, (int)getpid());
	close(held);
	chime_seg_unmap(&m);
}

struct session_opener {
	struct chime_opts o;
	chime_t *c;
	int r;
	uint64_t ns;            /* how long chime_open() took */
};

static void *open_session(void *arg)
{
	struct session_opener *so = arg;
	uint64_t t0 = now_ns();

	so->r = chime_open(&so->c, &so->o);
	so->ns = now_ns() - t0;
	return NULL;
}

/*
 * Session `name` opened, attached and left with the broker's last message
 * unread (its welcome taken and answered, t_answer_offer()), parked: its
 * socket, kept open.
 */
static int session_left_unread(const struct chime_ctl *ctl, const char *name)
{
	int held = hello_unread(name);

	cr_assert_eq(t_answer_offer(held), 0);
	shutdown(held, SHUT_RDWR);
	for (int k = 0; k < 2000 && in_state(ctl, CHIME_CLIENT_DETACHED) != 1; k++)
		usleep(1000);
	cr_assert_eq(in_state(ctl, CHIME_CLIENT_DETACHED), 1, "the session did not park when its socket went");
	return held;
}

/*
 * The same for a named session: it parks when its process goes, and its
 * next process would get a welcome of its own, and so on. One unread at a
 * time: a re-attach meanwhile waits for that socket to drain, up to a
 * second (a process that died with a wake-up unread drops it within
 * milliseconds), then gets EBUSY; it is attached once the socket closes.
 */
Test(access, a_session_whose_welcome_was_never_read_is_busy_until_it_is)
{
	struct session_opener so = { .o = { .socket_path = tb.sock, .session = "unread" } };
	struct chime_map m;
	char path[300];
	pthread_t th;
	int held, r;
	uint64_t t0;

	start("--allow-all --shards 1");
	so.o.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	held = session_left_unread(m.base, "unread");
	t0 = now_ns();
	r = chime_open(&so.c, &so.o);
	cr_assert_eq(r, -EBUSY, "a re-attach with the last welcome unread: %s", r ? strerror(-r) : "attached");
	cr_assert_geq(now_ns() - t0, 800 * MS, "EBUSY after %llu ms, not after waiting for the socket",
		      (unsigned long long)((now_ns() - t0) / MS));
	/* Closed while the next process waits: it is attached. */
	cr_assert_eq(pthread_create(&th, NULL, open_session, &so), 0);
	usleep(200000);
	close(held);
	pthread_join(th, NULL);
	cr_assert_eq(so.r, 0, "the re-attach waiting while that socket was closed: %s", strerror(-so.r));
	cr_assert_lt(so.ns, 900 * MS, "it waited %llu ms", (unsigned long long)(so.ns / MS));
	chime_close(so.c);
	cr_assert_eq(chime_drop_session(&so.o), 0);
	chime_seg_unmap(&m);
}

/*
 * Two processes for a session whose last socket is held: the first waits
 * for it, the second is refused at once (EBUSY), even when the socket
 * drained just before it came: the first goes first (found by a review:
 * the second was attached and the first left waiting until its timeout).
 */
Test(access, the_first_process_waiting_for_a_held_session_gets_it)
{
	struct session_opener w1 = { .o = { .socket_path = tb.sock, .session = "first" } };
	struct chime_opts o2 = { .socket_path = tb.sock, .session = "first" };
	struct chime_map m;
	char path[300];
	chime_t *c2 = NULL;
	pthread_t th;
	int held, r2;

	start("--allow-all --shards 1");
	w1.o.socket_path = o2.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	held = session_left_unread(m.base, "first");
	cr_assert_eq(pthread_create(&th, NULL, open_session, &w1), 0);
	usleep(100000);         /* w1 waits in the broker */
	close(held);
	r2 = chime_open(&c2, &o2);
	pthread_join(th, NULL);
	cr_assert_eq(w1.r, 0, "the process that waited: %s (after %llu ms)", strerror(-w1.r),
		     (unsigned long long)(w1.ns / MS));
	cr_assert_eq(r2, -EBUSY, "the one that came second: %s", r2 ? strerror(-r2) : "attached");
	chime_close(w1.c);
	cr_assert_eq(chime_drop_session(&w1.o), 0);
	chime_seg_unmap(&m);
}

/*
 * The same for a process that came while the session was still parking
 * (its old process just gone, the shards not done): it waits for the held
 * socket too, instead of EBUSY at once (found by a review). The shard is
 * held under ptrace to keep the session parking while it comes.
 */
Test(access, a_process_queued_while_parking_waits_for_a_held_socket)
{
	struct session_opener w1 = { .o = { .socket_path = tb.sock, .session = "parkq" } };
	struct chime_map m;
	char path[300];
	pthread_t th;
	int held, tid, r;

	start("--allow-all --shards 1");
	w1.o.socket_path = tb.sock;
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	held = hello_unread("parkq");
	cr_assert_eq(t_answer_offer(held), 0);          /* attached, its last message unread */
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0);
	r = t_thread_hold(tid);
	if (r < 0)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
	shutdown(held, SHUT_RDWR);      /* parking, on a held shard */
	usleep(50000);
	r = pthread_create(&th, NULL, open_session, &w1);
	usleep(100000);                 /* w1 queued behind the park */
	(void)t_thread_release(tid);
	cr_assert_eq(r, 0);
	usleep(200000);
	close(held);
	pthread_join(th, NULL);
	cr_assert_eq(w1.r, 0, "the process queued while parking: %s (after %llu ms)", strerror(-w1.r),
		     (unsigned long long)(w1.ns / MS));
	chime_close(w1.c);
	cr_assert_eq(chime_drop_session(&w1.o), 0);
	chime_seg_unmap(&m);
}

/* ---- one user cannot take every timer (--max-timers-per-uid) ---- */

/* Arms an hour ahead until one is refused; returns how many were armed, the refusal in *err. */
static unsigned arm_until_refused(chime_t *c, int *err)
{
	unsigned n = 0;
	chime_id_t id;

	while ((*err = chime_arm(c, 1, now_ns() + 3600000 * MS, 0, n, &id)) == 0)
		n++;
	return n;
}

/* ---- subordinate uids count as one user (--subuid-file) ---- */

/*
 * A child as uid that opens a client (and, with `arms`, arms timers an hour
 * ahead until refused) and holds it until killed. Its first byte on the
 * pipe is 0 (opened: then the number armed follows as 4 bytes) or the
 * refusal's errno; *pid is the child's.
 */
static int hold_as_uid(uid_t uid, bool arms, pid_t *pid)
{
	int p[2], st = -1;
	unsigned char b;
	uint32_t n = 0;

	cr_assert_eq(pipe(p), 0);
	*pid = fork();
	cr_assert_geq(*pid, 0);
	if (*pid == 0) {
		struct chime_opts o = { .socket_path = tb.sock };
		chime_t *c = NULL;
		int r, err = 0;

		close(p[0]);
		become_uid(uid);
		/* after: a change of credentials clears it */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		r = chime_open(&c, &o);
		b = (unsigned char)-r;
		if (write(p[1], &b, 1) != 1 || r < 0)
			_exit(1);
		if (r == 0 && arms) {
			n = arm_until_refused(c, &err);
			chime_flush(c);
			if (write(p[1], &n, sizeof(n)) != sizeof(n))
				_exit(1);
		}
		for (;;)
			pause();
	}
	close(p[1]);
	if (read(p[0], &b, 1) == 1)
		st = b;
	if (st == 0 && arms && read(p[0], &n, sizeof(n)) == sizeof(n))
		st = (int)n + 1000;     /* armed n */
	close(p[0]);
	return st;
}

static void unhold(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/*
 * One user's subordinate uids (the kernel shows each as a user of its
 * own: a user namespace's processes) share one user's limits: otherwise
 * a user with 65536 of them holds 65536 shares of the clients and of the
 * timers. They are one more user, not their owner: the owner's own share
 * is untouched. A file edited and re-read on SIGHUP counts new clients
 * the new way; lines it does not understand are skipped.
 */
Test(access, a_users_subordinate_uids_count_as_one_user)
{
	char file[300], extra[400];
	pid_t a, b, c, d;

	need_users();
	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\nnot a range\n400000:500000:10\n"), 0);
	snprintf(extra, sizeof(extra), "--allow-all --max-clients-per-uid 2 --subuid-file %s", file);
	start(extra);
	cr_assert_eq(hold_as_uid(200001, false, &a), 0);
	cr_assert_eq(hold_as_uid(265535, false, &b), 0);
	cr_assert_eq(hold_as_uid(230000, false, &c), EUSERS, "a third subordinate uid of chimet1's range");
	unhold(c);
	cr_assert_eq(as_user("chimet1", open_many, &(int){ 2 }), 0, "its owner keeps a share of its own");
	cr_assert_eq(hold_as_uid(265536, false, &d), 0, "a uid past the range is a user of its own");
	unhold(d);
	cr_assert_eq(hold_as_uid(500009, false, &d), 0, "another owner's range has a share of its own");
	unhold(d);
	/* the range gone from the file: a new client of it counts as itself */
	cr_assert_eq(t_write_file(file, "400000:500000:10\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	for (int i = 0; i < 100 && (c = 0, hold_as_uid(230000, false, &c)) != 0; i++) {
		unhold(c);
		usleep(20000);
	}
	cr_assert_gt(c, 0);
	unhold(c);
	unhold(a);
	unhold(b);
	t_chimed_stop(&tb, SIGTERM);

	/* Timers: the range's uids share --max-timers-per-uid (one shard: 64). */
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\n"), 0);
	snprintf(extra, sizeof(extra), "--allow-all -n 1 --sq-size 16 --max-timers-per-uid 64 --subuid-file %s",
		 file);
	start(extra);
	cr_assert_eq(hold_as_uid(200001, true, &a), 1000 + 64, "the first subordinate uid arms the share");
	cr_assert_eq(hold_as_uid(200002, true, &b), 1000 + 0, "the second finds it taken");
	cr_assert_eq(hold_as_uid(300000, true, &c), 1000 + 64, "a uid outside has a share of its own");
	unhold(a);
	unhold(b);
	unhold(c);
	unlink(file);
}

/* The quota chimectl users is told for account uid `as` (0 if not listed). */
static uint64_t quota_said(uid_t as)
{
	struct chime_query_user u[8];
	struct chime_query_head head;

	for (int k = 0; k < 50; k++) {
		memset(u, 0, sizeof(u));
		raw_query(CHIME_HELLO_QUERY_USERS, 0, 8, &head, u, sizeof(u[0]), 8);
		if (head.status != -EBUSY)
			break;
		usleep(60000);
	}
	cr_assert_eq(head.status, 0, "the users query: %s", strerror(-head.status));
	for (uint64_t i = 0; i < head.count && i < 8; i++)
		if (u[i].uid == as) {
			cr_expect_eq(u[i].max_timers_shard, u[i].max_timers, "one shard: its share is the quota");
			return u[i].max_timers;
		}
	return 0;
}

/*
 * A broker of one shard of `capacity` nodes (16 submission slots) reading
 * the subordinate-uid file `file`, which holds no range yet, with its log
 * in `logf` (NULL: none). Paths are this test's own.
 */
static void start_without_ranges(char file[300], char logf[300], unsigned capacity)
{
	char extra[700];

	snprintf(file, 300, "/tmp/chime-subuid-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "# no ranges yet\n"), 0);
	if (logf)
		snprintf(logf, 300, "/tmp/chime-subuid-%d.log", (int)getpid());
	snprintf(extra, sizeof(extra), "--allow-all -n 1 --capacity %u --sq-size 16 --subuid-file %s%s%s%s", capacity,
		 file, logf ? " 2>'" : "", logf ? logf : "", logf ? "'" : "");
	start(extra);
}

/* Give chimet1 the range 200000-265535 and reload, until the log says so. */
static void reload_with_a_range(const char *file, const char *logf)
{
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	for (int i = 0; i < 200 && !t_file_has(logf, "reloaded the policy"); i++)
		usleep(10000);
	cr_assert(t_file_has(logf, "reloaded the policy"), "no reload in 2 s");
}

/*
 * Where users have subordinate uids, the default --max-timers-per-uid of an
 * owner and of its range is a quarter of the slab, not half: the owner's
 * uid and its range are two users, and with half each one person held
 * every node, every other user's arm ENOMEM (a security audit). A user
 * with no range keeps half: the quarter was everyone's once the file named
 * any range, root's too (so on any host where useradd had made a user).
 * One shard of 4096: the owner and one of its subordinate uids arm until
 * refused, each a quarter; root arms half, refused EDQUOT.
 */
Test(access, an_owner_and_its_subordinate_uids_hold_half_the_slab_at_most_by_default)
{
	char file[300], extra[400];
	struct passwd *pw;
	unsigned n;
	chime_t *c;
	pid_t a, b;
	int ra, rb, err;

	need_users();
	pw = getpwnam("chimet1");
	cr_assert_not_null(pw);
	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\n"), 0);
	snprintf(extra, sizeof(extra), "--allow-all -n 1 --capacity 4096 --sq-size 16 --subuid-file %s", file);
	start(extra);
	ra = hold_as_uid(pw->pw_uid, true, &a);
	rb = hold_as_uid(200001, true, &b);
	cr_assert(ra >= 1000 && rb >= 1000, "opens refused: %d, %d", ra, rb);
	cr_assert(ra - 1000 <= 4096 / 4 && rb - 1000 <= 4096 / 4, "the owner armed %d and its subordinate uid %d: "
		  "more than a quarter each", ra - 1000, rb - 1000);
	cr_assert_geq(ra - 1000, 4096 / 4 - 16, "the owner's own quarter (less its grants set aside)");
	cr_assert_geq(rb - 1000, 4096 / 4 - 16, "the range's quarter");
	c = t_open(tb.sock);
	cr_assert_not_null(c);
	n = arm_until_refused(c, &err);
	cr_assert_eq(err, -EDQUOT, "root: %s after %u, not its quota", strerror(-err), n);
	cr_assert(n >= 4096 / 2 - 16 && n <= 4096 / 2, "root, with no range, armed %u: not half the slab", n);
	cr_expect_eq(quota_said(0), 4096 / 2, "root's quota");
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 4, "the owner's");
	chime_close(c);
	unhold(a);
	unhold(b);
	t_chimed_stop(&tb, SIGTERM);
	unlink(file);
}

/*
 * Each user is told its own quota: a quarter for the owner and its range,
 * half for the rest. A range that a reload adds is a quarter's from its
 * next attach: before, the quarter was decided once, at the start.
 */
Test(access, a_range_a_reload_adds_holds_a_quarter_from_its_next_attach)
{
	char file[300], logf[300];
	struct passwd *pw;
	pid_t a, b, c;
	int ra, rb, rc;

	need_users();
	pw = getpwnam("chimet1");
	cr_assert_not_null(pw);
	start_without_ranges(file, logf, 8192);
	ra = hold_as_uid(200001, true, &a);
	cr_assert(ra - 1000 >= 8192 / 2 - 16 && ra - 1000 <= 8192 / 2, "uid 200001, no range's yet, armed %d, "
		  "not half", ra - 1000);
	cr_expect_eq(quota_said(200001), 8192 / 2);
	unhold(a);
	reload_with_a_range(file, logf);
	rb = hold_as_uid(200002, true, &b);
	rc = hold_as_uid(pw->pw_uid, true, &c);
	cr_assert(rb - 1000 >= 8192 / 4 - 16 && rb - 1000 <= 8192 / 4, "the range's uid armed %d, not a quarter",
		  rb - 1000);
	cr_assert(rc - 1000 >= 8192 / 4 - 16 && rc - 1000 <= 8192 / 4, "its owner armed %d, not a quarter", rc - 1000);
	cr_expect_eq(quota_said(200000), 8192 / 4, "the range (counted as its start)");
	cr_expect_eq(quota_said(pw->pw_uid), 8192 / 4, "the owner");
	unhold(b);
	unhold(c);
	t_chimed_stop(&tb, SIGTERM);
	unlink(file);
	unlink(logf);
}

/*
 * newuidmap(1) gives a user the ranges whose owner is its name, its uid as a
 * number, or another name of the same uid (shadow's find_range()): all of
 * them are one login's. Each owner as written was a range account of its
 * own: an owner named by name, by number and by an alias held three
 * quarters of the slab between its ranges, and its own uid a fourth, where
 * the default is to keep one login to half (a review).
 */
Test(access, an_owners_ranges_named_by_name_number_and_alias_are_one_account)
{
	char pw[300], file[300], extra[400], text[400], line[1024];
	struct passwd *p;
	FILE *f, *in;
	pid_t a, b, c, d;
	int ra, rb, rc, rd, sum;

	need_users();
	p = getpwnam("chimet1");
	cr_assert_not_null(p);
	snprintf(pw, sizeof(pw), "/tmp/chime-passwd-%d", (int)getpid());
	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	f = fopen(pw, "w");
	in = fopen("/etc/passwd", "r");
	cr_assert(f && in);
	while (fgets(line, sizeof(line), in))
		fputs(line, f);
	fclose(in);
	/* an alias of chimet1's uid, seen only in this test's mount namespace */
	fprintf(f, "chimealias:x:%u:%u::/nonexistent:/usr/sbin/nologin\n", (unsigned)p->pw_uid, (unsigned)p->pw_gid);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare: %s", strerror(errno));
	cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
	cr_assert_eq(mount(pw, "/etc/passwd", NULL, MS_BIND, NULL), 0, "bind mount: %s", strerror(errno));
	snprintf(text, sizeof(text), "chimet1:200000:65536\n%u:300000:65536\nchimealias:400000:65536\n",
		 (unsigned)p->pw_uid);
	cr_assert_eq(t_write_file(file, text), 0);
	snprintf(extra, sizeof(extra), "--allow-all -n 1 --capacity 4096 --sq-size 16 --subuid-file %s", file);
	start(extra);
	ra = hold_as_uid(p->pw_uid, true, &a);
	rb = hold_as_uid(200001, true, &b);
	rc = hold_as_uid(300001, true, &c);
	rd = hold_as_uid(400001, true, &d);
	cr_assert(ra >= 1000 && rb >= 1000 && rc >= 1000 && rd >= 1000, "opens refused: %d %d %d %d", ra, rb, rc, rd);
	sum = ra + rb + rc + rd - 4000;
	cr_expect_leq(sum, 4096 / 2, "one login (chimet1 and its ranges by name, by number, by alias) armed %d "
		      "of 4096: %d + %d + %d + %d", sum, ra - 1000, rb - 1000, rc - 1000, rd - 1000);
	unhold(a);
	unhold(b);
	unhold(c);
	unhold(d);
	t_chimed_stop(&tb, SIGTERM);
	umount("/etc/passwd");
	unlink(pw);
	unlink(file);
}

/* As the owner: open session "rq" and close it, one timer kept. */
static int session_one_timer(void *arg)
{
	struct chime_opts so = { .socket_path = tb.sock, .session = "rq" };
	chime_t *s = NULL;
	chime_id_t id;

	(void)arg;
	if (chime_open(&s, &so) < 0)
		return 1;
	if (chime_arm(s, 1, now_ns() + 3600000 * MS, 0, 0, &id) < 0)
		return 2;
	chime_close(s);
	return 0;
}

/* As the owner, a new process: session "rq" again, armed until refused; the count in *(unsigned *)arg. */
static int session_reopen_fill(void *arg)
{
	struct chime_opts so = { .socket_path = tb.sock, .session = "rq" };
	chime_t *s = NULL;
	int err = 0, r;

	for (int i = 0; i < 100 && (r = chime_open(&s, &so)) == -EBUSY; i++)
		usleep(20000);
	if (!s)
		return 1;
	*(unsigned *)arg = 1 + arm_until_refused(s, &err);    /* the first process's one timer */
	chime_close(s);
	return err == -EDQUOT ? 0 : 2;
}

/*
 * A broker of 4096 nodes with no range yet (start_without_ranges()), and
 * chimet1's session "rq" holding one timer, its process gone; *armed a
 * count shared with the processes as_user() forks. chimet1's passwd entry.
 */
static struct passwd *owner_session_before_ranges(char file[300], char logf[300], unsigned **armed)
{
	struct passwd *pw;

	need_users();
	pw = getpwnam("chimet1");
	cr_assert_not_null(pw);
	*armed = mmap(NULL, sizeof(**armed), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(*armed, MAP_FAILED);
	start_without_ranges(file, logf, 4096);
	cr_assert_eq(as_user("chimet1", session_one_timer, NULL), 0);
	return pw;
}

/*
 * A range a reload adds makes its owner's quota a quarter from its next
 * connection (chimed(8)). A named session taken over by a new process is
 * one: it must bring the quarter too. The reattach (SHARD_CMD_REATTACH)
 * carried no quota, so an owner that only ever reattaches kept half of the
 * slab for good, beside its range's new quarter (three quarters for one
 * login), and chimectl users said a quarter all along (a review).
 */
Test(access, a_session_reattached_after_a_reload_brings_the_new_quota)
{
	char file[300], logf[300];
	unsigned *armed;
	struct passwd *pw;

	pw = owner_session_before_ranges(file, logf, &armed);
	reload_with_a_range(file, logf);
	cr_assert_eq(as_user("chimet1", session_reopen_fill, armed), 0);
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 4, "chimectl users: the owner's quota");
	cr_expect_leq(*armed, 4096 / 4, "the owner's session, reattached after the reload, holds %u of 4096 "
		      "(its quota is a quarter, 1024)", *armed);
	t_chimed_stop(&tb, SIGTERM);
	munmap(armed, sizeof(*armed));
	unlink(file);
	unlink(logf);
}

/*
 * chimectl users says the quota the shards hold a user to: its latest
 * attach's. A connection from before a reload that added the user's range
 * keeps half until the user's next one; users said the policy's quarter
 * meanwhile, while the shards let it arm half (a review).
 */
Test(access, users_says_the_quota_a_users_connections_are_held_to)
{
	char file[300], logf[300];
	struct passwd *pw;
	pid_t a, b;

	need_users();
	pw = getpwnam("chimet1");
	cr_assert_not_null(pw);
	start_without_ranges(file, logf, 4096);
	cr_assert_eq(hold_as_uid(pw->pw_uid, false, &a), 0);
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 2, "before the reload");
	reload_with_a_range(file, logf);
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 2, "its connection from before the reload is held to half");
	cr_assert_eq(hold_as_uid(pw->pw_uid, false, &b), 0);
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 4, "from its next connection, a quarter");
	unhold(a);
	unhold(b);
	t_chimed_stop(&tb, SIGTERM);
	unlink(file);
	unlink(logf);
}

/* As the owner: a re-attach of session "rq" whose welcome is read and never answered (the process goes). */
static int reattach_then_go(void *arg)
{
	struct chime_welcome w;
	int fd = hello_unread("rq");
	ssize_t n = recv(fd, &w, sizeof(w), 0);        /* its descriptors dropped with the control data */

	(void)arg;
	close(fd);
	return n == (ssize_t)sizeof(w) && w.status == 0 ? 0 : 1;
}

/*
 * A re-attach that fails before the shards took it (its process gone
 * before answering the welcome) brings them no quota: chimectl users must
 * go on saying the one they hold the user to, not the one the failed
 * attempt would have brought (it said the new quarter while the owner's
 * connection from before the reload armed half, a review).
 */
Test(access, a_reattach_that_fails_leaves_the_quota_users_says)
{
	char file[300], logf[300];
	unsigned *armed;
	struct passwd *pw;
	uint64_t q;
	pid_t a;

	pw = owner_session_before_ranges(file, logf, &armed);
	cr_assert_eq(hold_as_uid(pw->pw_uid, false, &a), 0);
	cr_assert_eq(quota_said(pw->pw_uid), 4096 / 2, "before the reload");
	reload_with_a_range(file, logf);
	cr_assert_eq(as_user("chimet1", reattach_then_go, NULL), 0, "the re-attach's welcome");
	q = quota_said(pw->pw_uid);
	cr_expect_eq(q, 4096 / 2, "while the failed re-attach is under way: %llu said", (unsigned long long)q);
	usleep(300000);         /* its hang-up seen, the session parked again */
	q = quota_said(pw->pw_uid);
	cr_expect_eq(q, 4096 / 2, "after it: %llu said, where the connection from before the reload is held "
		     "to half", (unsigned long long)q);
	unhold(a);
	t_chimed_stop(&tb, SIGTERM);
	munmap(armed, sizeof(*armed));
	unlink(file);
	unlink(logf);
}

/* As the owner: open, wait for a byte on the pipe *(int *)arg, arm until refused, close: 0 if EDQUOT. */
static int open_wait_fill(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *c = NULL;
	int err = 0;
	char b;

	if (chime_open(&c, &o) < 0)
		return 1;
	if (read(*(int *)arg, &b, 1) != 1)
		return 2;
	(void)arm_until_refused(c, &err);
	chime_close(c);
	return err == -EDQUOT ? 0 : 3;
}

/*
 * A connection from before a reload that gave its user a range is held to
 * the quarter once the user's next connection brought it to the shards;
 * its refusals were logged against the half it came with ("its quota of
 * 2048 timers" while refused at 1024, a review): the log says the quota
 * the shards hold the user to.
 */
Test(access, a_refusal_is_logged_with_the_quota_the_shards_enforce)
{
	char file[300], logf[300], want[200];
	struct passwd *pw;
	pid_t a, b;
	int go[2];

	need_users();
	pw = getpwnam("chimet1");
	cr_assert_not_null(pw);
	start_without_ranges(file, logf, 4096);
	cr_assert_eq(pipe(go), 0);
	a = as_user_start("chimet1", open_wait_fill, &go[0]);
	for (int i = 0; i < 200 && quota_said(pw->pw_uid) == 0; i++)
		usleep(10000);
	reload_with_a_range(file, logf);
	cr_assert_eq(hold_as_uid(pw->pw_uid, false, &b), 0);
	cr_assert_eq(quota_said(pw->pw_uid), 4096 / 4, "the owner's next connection brought the quarter");
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(user_done(a), 0, "the first connection was not refused EDQUOT");
	unhold(b);
	snprintf(want, sizeof(want), "together hold its quota of %u timers", 4096 / 4);
	for (int i = 0; i < 300 && !t_file_has(logf, "together hold its quota"); i++)
		usleep(10000);
	cr_expect(t_file_has(logf, want), "the refusal is not logged with the quota enforced (%s)", want);
	close(go[0]);
	close(go[1]);
	t_chimed_stop(&tb, SIGTERM);
	unlink(file);
	unlink(logf);
}

/*
 * A session restored by the next broker holds its user's quota by that
 * broker's policy: the owner of a range added while no broker ran gets a
 * quarter back, not the half it had (a crash: SIGKILL, then a start).
 */
Test(access, a_restored_session_holds_the_quota_of_the_new_brokers_policy)
{
	char file[300], extra[700];
	unsigned *armed;
	struct passwd *pw;

	pw = owner_session_before_ranges(file, NULL, &armed);
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 2, "before: no range");
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\n"), 0);
	snprintf(extra, sizeof(extra), "--allow-all -n 1 --capacity 4096 --sq-size 16 --subuid-file %s", file);
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, extra), 0);
	cr_assert_eq(chmod(tb.dir, 0755), 0);
	cr_expect_eq(quota_said(pw->pw_uid), 4096 / 4, "the restored session's user: a quarter");
	cr_assert_eq(as_user("chimet1", session_reopen_fill, armed), 0);
	cr_expect(*armed >= 4096 / 4 - 16 && *armed <= 4096 / 4, "the restored session, taken over, holds %u of "
		  "4096 (its quota is a quarter, 1024)", *armed);
	t_chimed_stop(&tb, SIGTERM);
	munmap(armed, sizeof(*armed));
	unlink(file);
}

/*
 * The owners of ten thousand ranges, each a user of /etc/passwd (a bigger
 * one bound over it, in a mount namespace of this test's), are found in
 * one pass over the user database: looked up one by one, each lookup read
 * the file again, and the broker took 6.3 s to start (a review; here 26
 * ms). An owner given as a number, no user's, owns its range all the same.
 */
Test(access, ten_thousand_range_owners_are_found_in_one_pass)
{
	char pw[300], file[300], extra[400];
	FILE *f, *g, *in;
	char line[1024];
	uint64_t t0, ms;
	pid_t a, b;

	if (geteuid() != 0)
		cr_skip("needs root (a mount namespace)");
	snprintf(pw, sizeof(pw), "/tmp/chime-passwd-%d", (int)getpid());
	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	f = fopen(pw, "w");
	g = fopen(file, "w");
	in = fopen("/etc/passwd", "r");
	cr_assert(f && g && in);
	while (fgets(line, sizeof(line), in))
		fputs(line, f);
	fclose(in);
	for (unsigned i = 0; i < 10000; i++) {
		fprintf(f, "chimeo%u:x:%u:%u::/nonexistent:/usr/sbin/nologin\n", i, 700000 + i, 700000 + i);
		fprintf(g, "chimeo%u:%u:65536\n", i, 1000000 + i * 65536);
	}
	fprintf(g, "710001:900000:65536\n");
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(fclose(g), 0);
	cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare: %s", strerror(errno));
	cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
	cr_assert_eq(mount(pw, "/etc/passwd", NULL, MS_BIND, NULL), 0, "bind mount: %s", strerror(errno));
	snprintf(extra, sizeof(extra), "--allow-all -n 1 --capacity 8192 --sq-size 16 --subuid-file %s", file);
	t0 = now_ns();
	start(extra);
	ms = (now_ns() - t0) / 1000000;
	cr_expect_lt(ms, 2000, "the broker took %llu ms to start", (unsigned long long)ms);
	cr_assert_geq(hold_as_uid(700000 + 9999, true, &a), 1000);
	cr_assert_geq(hold_as_uid(710001, true, &b), 1000);
	cr_expect_eq(quota_said(700000 + 9999), 8192 / 4, "the last owner's, by name");
	cr_expect_eq(quota_said(710001), 8192 / 4, "an owner by number's");
	unhold(a);
	unhold(b);
	t_chimed_stop(&tb, SIGTERM);
	umount(pw);
	unlink(pw);
	unlink(file);
}

/*
 * An owner no user has owns its range by the name as written (a user
 * made later under it is found at a reload): said at start, not silent.
 */
Test(access, an_owner_no_user_has_is_said)
{
	char file[300], logf[300], extra[700];

	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	snprintf(logf, sizeof(logf), "/tmp/chime-subuid-%d.log", (int)getpid());
	cr_assert_eq(t_write_file(file, "chime-no-such-user:200000:65536\n0:300000:65536\n"), 0);
	snprintf(extra, sizeof(extra), "-n 1 --subuid-file %s 2>'%s'", file, logf);
	start(extra);
	cr_expect(t_file_has(logf, "2 subordinate-uid ranges"), "the ranges are not counted");
	cr_expect(t_file_has(logf, "(1 owner no user has: its ranges counted by the name)"),
		  "the owner no user has is not said");
	t_chimed_stop(&tb, SIGTERM);
	unlink(file);
	unlink(logf);
}

/*
 * As a user whose quota is 300: a named session keeps 100 timers after its
 * process closes it, and two clients then arm 200 between them, no more.
 * When one of them goes, the other arms again.
 */
static int fill_user_quota(void *arg)
{
	struct chime_opts so = { .socket_path = tb.sock, .session = "held" };
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *s = NULL, *a = NULL, *b = NULL;
	unsigned n = 0;
	int err_a = 0, err_b = 0;
	chime_id_t id;

	(void)arg;
	if (chime_open(&s, &so) < 0)
		return 1;
	for (unsigned i = 0; i < 100; i++)
		if (chime_arm(s, 1, now_ns() + 3600000 * MS, 0, i, &id) < 0)
			return 2;
	chime_close(s);
	if (chime_open(&a, &o) < 0 || chime_open(&b, &o) < 0)
		return 3;
	/* The session's unused grants count until its park frees them: retry for a while. */
	for (uint64_t t0 = now_ns(); n < 200 && now_ns() - t0 < 3000 * MS; usleep(20000)) {
		n += arm_until_refused(a, &err_a);
		n += arm_until_refused(b, &err_b);
	}
	if (n != 200 || err_a != -EDQUOT || err_b != -EDQUOT) {
		fprintf(stderr, "armed %u of 200 (a: %s, b: %s)\n", n, strerror(-err_a), strerror(-err_b));
		return 4;
	}
	chime_close(a);
	n = 0;
	for (uint64_t t0 = now_ns(); n == 0 && now_ns() - t0 < 3000 * MS; usleep(20000))
		n += arm_until_refused(b, &err_b);
	chime_close(b);
	return n > 0 ? 0 : 5;
}

/* As the other user: 250 timers, all granted. */
static int arm_250(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *c = NULL;
	int err;
	unsigned n;

	(void)arg;
	if (chime_open(&c, &o) < 0)
		return 1;
	for (n = 0; n < 250; n++)
		if ((err = chime_arm(c, 1, now_ns() + 3600000 * MS, 0, n, &(chime_id_t){ 0 })) < 0)
			break;
	chime_close(c);
	if (n < 250)
		fprintf(stderr, "armed %u of 250: %s\n", n, strerror(-err));
	return n == 250 ? 0 : 2;
}

Test(access, max_timers_per_uid_gives_edquot_to_that_user_only)
{
	need_users();
	start("--allow-all -n 2 --sq-size 16 --max-timers-per-uid 300");
	cr_assert_eq(as_user("chimet1", fill_user_quota, NULL), 0,
		     "one user's session and clients share its quota of 300 timers");
	cr_assert_eq(as_user("chimet2", arm_250, NULL), 0, "another user is not affected");
}

/* As a user whose quota is 300: a session keeps 200 timers for later. */
static int keep_200_in_a_session(void *arg)
{
	struct chime_opts so = { .socket_path = tb.sock, .session = "held" };
	chime_t *s = NULL;
	chime_id_t id;

	(void)arg;
	if (chime_open(&s, &so) < 0)
		return 1;
	for (unsigned i = 0; i < 200; i++)
		if (chime_arm(s, 1, now_ns() + 3600000 * MS, 0, i, &id) < 0)
			return 2;
	chime_close(s);
	return 0;
}

/*
 * The same user, later: the session taken over (which frees the grants
 * the broker before kept for its old process) and another client, 100
 * timers between them, not one more.
 */
static int arm_the_last_100(void *arg)
{
	struct chime_opts so = { .socket_path = tb.sock, .session = "held" };
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *s = NULL, *c = NULL;
	unsigned n;
	int err_c = 0, err_s;

	(void)arg;
	if ((err_s = chime_open(&s, &so)) < 0 || (err_c = chime_open(&c, &o)) < 0) {
		fprintf(stderr, "chime_open (%s): %s\n", s ? "anonymous" : "session 'held'",
			strerror(-(s ? err_c : err_s)));
		return 1;
	}
	n = arm_until_refused(c, &err_c);
	n += arm_until_refused(s, &err_s);
	chime_close(c);
	chime_close(s);
	if (n != 100 || err_c != -EDQUOT || err_s != -EDQUOT) {
		fprintf(stderr, "armed %u of 100 (%s, %s)\n", n, strerror(-err_c), strerror(-err_s));
		return 2;
	}
	return 0;
}

Test(access, a_restored_session_counts_against_its_users_quota)
{
	need_users();
	start("--allow-all -n 1 --sq-size 16 --max-timers-per-uid 300");
	cr_assert_eq(as_user("chimet1", keep_200_in_a_session, NULL), 0);
	/* A crash: the next broker takes the session over from the files, uid and all. */
	cr_assert_eq(t_chimed_restart(&tb, SIGKILL, "--allow-all -n 1 --sq-size 16 --max-timers-per-uid 300"), 0);
	cr_assert_eq(as_user("chimet1", arm_the_last_100, NULL), 0,
		     "the restored session's 200 timers are its user's");
	cr_assert_eq(as_user("chimet2", arm_250, NULL), 0, "another user is not affected");
}

static int read_file(void *arg)
{
	int fd = open((const char *)arg, O_RDONLY);

	if (fd >= 0) {
		close(fd);
		return 0;
	}
	return errno == EACCES ? 13 : 1;
}

Test(access, clients_cannot_read_the_segments_only_the_stats_group_can)
{
	char ctl[300], shard[300];

	need_users();
	start("--allow-all --stats-group chimetg");
	snprintf(ctl, sizeof(ctl), "%s.ctl", tb.sock);
	snprintf(shard, sizeof(shard), "%s.shard0", tb.sock);
	cr_assert_eq(as_user("chimet1", read_file, ctl), 13, "an admitted client reads the control segment");
	cr_assert_eq(as_user("chimet1", read_file, shard), 13, "an admitted client reads every client's timers");
	cr_assert_eq(as_user("chimet2", read_file, ctl), 0, "the stats group cannot read counters");
	cr_assert_eq(as_user("chimet2", read_file, shard), 0);
	t_chimed_stop(&tb, SIGTERM);
	start("--allow-all");
	snprintf(ctl, sizeof(ctl), "%s.ctl", tb.sock);     /* a fresh directory */
	cr_assert_eq(as_user("chimet2", read_file, ctl), 13, "no --stats-group: the broker's user only");
}

/* ---- one user's timers are out of another's reach ---- */

static int pipe_fd[2];

/* chimet1: arm a timer 300 ms ahead, tell the parent its id, expect to receive it. */
static int victim(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct chime_event ev;
	chime_t *c = NULL;
	chime_id_t id;
	int r;

	(void)arg;
	if (chime_open(&c, &o) < 0 || chime_arm(c, 42, chime_now() + 300 * MS, 0, 1, &id) < 0)
		return 1;
	if (write(pipe_fd[1], &id, sizeof(id)) != sizeof(id))
		return 2;
	r = chime_wait(c, &ev, 1, 3000);
	chime_close(c);
	return r == 1 && ev.id == id ? 0 : 3;
}

static chime_id_t stolen;

/* chimet2: cancel, reset and cancel-by-key with the other user's id and key. */
static int thief(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *c = NULL;

	(void)arg;
	if (chime_open(&c, &o) < 0)
		return 1;
	(void)chime_cancel(c, stolen);
	(void)chime_reset(c, stolen, chime_now() + 3600000 * MS);
	(void)chime_cancel_key(c, 42);
	/*
	 * Wake the shard: records that can wait ring no doorbell, and closed
	 * before the shard's next look they would go with the connection,
	 * never judged (an audit: the test passed without the owner check).
	 */
	if (chime_flush(c) < 0)
		return 2;
	usleep(50000);          /* let the shard apply them */
	chime_close(c);
	return 0;
}

Test(access, a_client_cannot_cancel_or_reset_another_users_timer)
{
	pid_t v;
	int st;

	need_users();
	start("--allow-all");
	cr_assert_eq(pipe(pipe_fd), 0);
	v = as_user_start("chimet1", victim, NULL);
	cr_assert_eq(read(pipe_fd[0], &stolen, sizeof(stolen)), (ssize_t)sizeof(stolen));
	cr_assert_eq(as_user("chimet2", thief, NULL), 0);
	st = user_done(v);
	cr_assert_eq(st, 0, "the victim's timer did not fire (status %d): another user cancelled or moved it", st);
}

/* ---- the handshake: silent and garbage connections ---- */

static int connect_raw(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	memcpy(sa.sun_path, tb.sock, strnlen(tb.sock, sizeof(sa.sun_path) - 1));
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* chimet1 opens 200 connections and never says hello. */
static int flood(void *arg)
{
	(void)arg;
	for (int i = 0; i < 200; i++)
		(void)connect_raw();
	pause();
	return 0;
}

Test(access, silent_connections_of_one_user_do_not_keep_others_out)
{
	uint64_t t0;
	pid_t f;

	need_users();
	start("--allow-all");
	f = as_user_start("chimet1", flood, NULL);
	usleep(300000);
	t0 = now_ns();
	cr_assert_eq(as_user("chimet2", open_arm_receive, NULL), 0, "another user could not connect");
	cr_assert_eq(open_status(NULL), 0, "root could not connect");
	cr_assert_lt(now_ns() - t0, 1500 * MS, "connecting took %llu ms under the flood",
		     (unsigned long long)((now_ns() - t0) / MS));
	kill(f, SIGKILL);
	waitpid(f, NULL, 0);
}

/* chimet1 connects and closes in a loop, 4 processes, for `arg` seconds. */
static int connect_close_loop(void *arg)
{
	uint64_t end = now_ns() + (uint64_t)(uintptr_t)arg * 1000 * MS;

	for (int k = 0; k < 3; k++)
		if (fork() == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);       /* gone with the test's child */
			break;
		}
	while (now_ns() < end) {
		int fd = connect_raw();

		if (fd >= 0)
			close(fd);
	}
	while (wait(NULL) > 0)
		;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * The listening socket's queue is every user's, in arrival order: a user
 * who keeps it full makes the others' opens wait for all it holds. Kept
 * short, they wait milliseconds (with SOMAXCONN, 4096, an open took
 * ~100 ms here, every one).
 */
Test(access, a_connect_loop_of_one_user_keeps_others_waiting_only_briefly)
{
	enum { OPENS = 21 };
	uint64_t took[OPENS];
	pid_t f;

	need_users();
	start("--allow-all");
	f = as_user_start("chimet1", connect_close_loop, (void *)(uintptr_t)4);
	usleep(500000);
	for (int i = 0; i < OPENS; i++) {
		uint64_t t0 = now_ns();

		cr_assert_eq(open_status(NULL), 0, "open %d failed under the loop", i);
		took[i] = now_ns() - t0;
	}
	kill(f, SIGKILL);
	waitpid(f, NULL, 0);
	qsort(took, OPENS, sizeof(took[0]), cmp_u64);
	cr_assert_lt(took[OPENS / 2], 40 * MS, "chime_open took %.1f ms (median) under another user's connect loop",
		     (double)took[OPENS / 2] / 1e6);
}

/* The CPU time (ns, schedstat) the control thread of broker b has used so far. */
static uint64_t control_cpu_ns(const struct t_chimed *b)
{
	unsigned long long ns = 0;
	int tid = t_thread_named(b->pid, "chimed");
	char path[96];
	FILE *f;

	cr_assert_gt(tid, 0, "no control thread in pid %d", b->pid);
	snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", b->pid, tid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	cr_assert_eq(fscanf(f, "%llu", &ns), 1);
	fclose(f);
	return ns;
}

/* What n chime_open() + chime_close() in a row cost b's control thread, per pair (ns). */
static uint64_t open_close_cost(const struct t_chimed *b, unsigned n)
{
	uint64_t t0 = control_cpu_ns(b);

	for (unsigned i = 0; i < n; i++) {
		chime_t *c = t_open(b->sock);

		cr_assert_not_null(c);
		chime_close(c);
	}
	usleep(20000);          /* the last detach */
	return (control_cpu_ns(b) - t0) / n;
}

/*
 * A user opening and closing in a loop costs the control thread what the
 * open and the close cost, whatever --max-clients: each acknowledgement of
 * the shards (an attach, a detach) walked every slot of the table, and so
 * did the per-user count of every open, 65536 of them at --max-clients
 * 65536. One broker of each, the least of 5 rounds each, alternated (of
 * 3, an ASan run on a busy host once measured 425 us against 273; the
 * walks had cost 447-574 us against 177-213).
 */
Test(access, a_connect_loop_costs_the_broker_no_more_at_max_clients_65536)
{
	uint64_t small = UINT64_MAX, big = UINT64_MAX;
	struct t_chimed b;

	start("-n 1 --max-clients 256");
	cr_assert_eq(t_chimed_start(&b, NULL, "-n 1 --max-clients 65536"), 0);
	for (int round = 0; round < 5; round++) {
		uint64_t s = open_close_cost(&tb, 300), l = open_close_cost(&b, 300);

		small = s < small ? s : small;
		big = l < big ? l : big;
	}
	t_chimed_stop(&b, SIGKILL);
	cr_log_info("control thread per open and close: %.1f us at --max-clients 256, %.1f us at 65536",
		    small / 1e3, big / 1e3);
	cr_assert_leq(big, small * 3 / 2, "an open and a close cost the control thread %.1f us at --max-clients "
		      "65536, %.1f us at 256", big / 1e3, small / 1e3);
}

/* As `user`, in a child: what n pings (chimectl status's CHIME_HELLO_PING) cost b's control thread, each (ns). */
static uint64_t ping_cost_as(const struct t_chimed *b, const char *user, unsigned n)
{
	uint64_t t0 = control_cpu_ns(b);
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
					 .flags = CHIME_HELLO_PING };

		become(user);
		memcpy(sa.sun_path, b->sock, strnlen(b->sock, sizeof(sa.sun_path) - 1));
		for (unsigned i = 0; i < n; i++) {
			struct chime_query_head head;
			int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

			if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
			    send(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
			    recv(fd, &head, sizeof(head), 0) != (ssize_t)sizeof(head) || head.status != 0)
				_exit(1);
			close(fd);
		}
		_exit(0);
	}
	cr_assert_eq(user_done(pid), 0, "%s's pings at %s were not answered 'admitted'", user, b->sock);
	return (control_cpu_ns(b) - t0) / n;
}

/*
 * What a user neither root nor the broker's costs the control thread does
 * not grow with --max-clients either: the table's kept sixteenth
 * (table_kept_from()), asked at each of its opens and pings, walked every
 * slot, 65536 of them at --max-clients 65536 (a review: 0.3-0.4 ms more
 * per open and close; a ping, which walks nothing else, 10 times as dear).
 */
Test(access, an_unprivileged_users_pings_cost_the_broker_no_more_at_max_clients_65536)
{
	uint64_t small = UINT64_MAX, big = UINT64_MAX;
	struct t_chimed b;

	need_users();
	start("-n 1 --max-clients 256 --allow-all");
	cr_assert_eq(t_chimed_start(&b, NULL, "-n 1 --max-clients 65536 --allow-all"), 0);
	cr_assert_eq(chmod(b.dir, 0755), 0);
	for (int round = 0; round < 5; round++) {
		uint64_t s = ping_cost_as(&tb, "chimet1", 300), l = ping_cost_as(&b, "chimet1", 300);

		small = s < small ? s : small;
		big = l < big ? l : big;
	}
	t_chimed_stop(&b, SIGKILL);
	cr_log_info("control thread per ping of chimet1: %.1f us at --max-clients 256, %.1f us at 65536",
		    small / 1e3, big / 1e3);
	/*
	 * Against the 256-slot broker plus 100 us, not a multiple of it: a walk
	 * of 65536 slots costs 250 us or more under ASan (the fixed walk's 306
	 * against 27), while the least of five rounds of a ping alone is 10 or
	 * 20 us from one run to the next on a 2-CPU host (2026-12-06, the same
	 * with 5c2e0d1's chimed: 10.3 against 22.0 there), which failed a
	 * bound of twice the 256-slot figure one run in 14 under ASan.
	 */
	cr_assert_leq(big, small + 100000, "a ping of chimet1 cost the control thread %.1f us at --max-clients 65536, "
		      "%.1f us at 256", big / 1e3, small / 1e3);
}

/* More opens at once than the queue holds: the extra ones wait for room, none fails. */
static void *open_hold(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	chime_t *c = NULL;
	intptr_t r = chime_open(&c, &o);

	if (r == 0) {
		usleep(200000);
		chime_close(c);
	}
	(void)arg;
	return (void *)r;
}

Test(access, a_burst_of_opens_longer_than_the_queue_all_succeed)
{
	enum { N = 150 };
	pthread_t t[N];

	start("--shards 1 --max-clients 512 --max-clients-per-uid 0");
	for (int i = 0; i < N; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, open_hold, NULL), 0);
	for (int i = 0; i < N; i++) {
		void *r;

		cr_assert_eq(pthread_join(t[i], &r), 0);
		cr_assert_eq((intptr_t)r, 0, "open %d: %s", i, strerror(-(int)(intptr_t)r));
	}
}

Test(access, garbage_hellos_are_refused_and_harm_nothing)
{
	static const char junk[] = "GET / HTTP/1.0\r\n\r\n";
	struct chime_hello h = { .magic = 0x12345678, .layout = CHIME_SHM_LAYOUT };
	char buf[128];
	int fd;

	start("");
	fd = connect_raw();
	cr_assert_geq(fd, 0);
	cr_assert_eq(send(fd, junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
	cr_assert_leq(recv(fd, buf, sizeof(buf), 0), 0, "a garbage hello got an answer");
	close(fd);
	fd = connect_raw();
	cr_assert_eq(send(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_leq(recv(fd, buf, sizeof(buf), 0), 0, "a wrong magic got an answer");
	close(fd);
	h.magic = CHIME_HELLO_MAGIC;
	h.layout = CHIME_SHM_LAYOUT + 7;
	fd = connect_raw();
	cr_assert_eq(send(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	{
		struct chime_welcome w;

		cr_assert_eq(recv(fd, &w, sizeof(w), 0), (ssize_t)sizeof(w));
		cr_assert_eq(w.status, -EPROTO, "a wrong layout is refused with EPROTO");
	}
	close(fd);
	/* A hello cut short, or one inside a longer message (64 KiB): closed unanswered, nothing read past 128 bytes. */
	h.layout = CHIME_SHM_LAYOUT;
	fd = connect_raw();
	cr_assert_eq(send(fd, &h, sizeof(h) - 8, 0), (ssize_t)sizeof(h) - 8);
	cr_assert_leq(recv(fd, buf, sizeof(buf), 0), 0, "a short hello got an answer");
	close(fd);
	{
		static char big[65536];
		int sz = sizeof(big);

		memcpy(big, &h, sizeof(h));
		fd = connect_raw();
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		cr_assert_eq(send(fd, big, sizeof(big), 0), (ssize_t)sizeof(big));
		cr_assert_leq(recv(fd, buf, sizeof(buf), 0), 0, "a 64 KiB hello got an answer");
		close(fd);
	}
	cr_assert_eq(open_status(NULL), 0, "the broker still serves");
}

/* Send buf with n descriptors (copies of /dev/null) attached, SCM_RIGHTS. */
static ssize_t send_fds(int fd, const void *buf, size_t len, unsigned n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 32)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
			     .msg_controllen = CMSG_SPACE(sizeof(int) * n) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	int fds[32], e;
	ssize_t r;

	cr_assert_leq(n, 32u);
	memset(&u, 0, sizeof(u));
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
	for (unsigned i = 0; i < n; i++) {
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		cr_assert_geq(fds[i], 0);
	}
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
	r = sendmsg(fd, &mh, MSG_NOSIGNAL);
	e = errno;
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	errno = e;
	return r;
}

/* send_fds(), or the message alone where the broker refuses descriptors (SO_PASSRIGHTS, Linux 6.16). */
static ssize_t send_fds_or_not(int fd, const void *buf, size_t len, unsigned n, unsigned *refused)
{
	ssize_t r = send_fds(fd, buf, len, n);

	if (r < 0 && errno == EPERM) {
		(*refused)++;
		r = send(fd, buf, len, MSG_NOSIGNAL);
	}
	return r;
}

/* Receive the welcome and close the descriptors it carries: its status. */
static int32_t recv_welcome_close(int fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * (CHIME_WELCOME_FIXED_FDS + CHIME_MAX_SHARDS))];
		struct cmsghdr align;
	} u;
	struct chime_welcome w = { .status = -1 };
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b) };

	if (recvmsg(fd, &mh, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(w))
		return -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		for (size_t i = 0; cm->cmsg_type == SCM_RIGHTS && i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int x;

			memcpy(&x, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			close(x);
		}
	return w.status;
}

/*
 * A client can attach descriptors (SCM_RIGHTS) to its hello, to a garbage
 * one, or to messages after its welcome: the broker never reads a control
 * message (a recv without one discards them in the kernel), so none ever
 * takes a place in its table, which would run it out of descriptors for
 * every user (limits/a_broker_out_of_descriptors_refuses_at_once_and_recovers).
 * Where the kernel has SO_PASSRIGHTS (Linux 6.16) the broker refuses them
 * outright, the sendmsg() EPERM (a descriptor whose close waits, closed by
 * the control thread: hostile/a_descriptor_a_client_sends_cannot_hold_up_the_control_thread),
 * and each message goes without them.
 */
Test(access, descriptors_sent_to_the_broker_never_take_a_place_in_its_table)
{
	static const char junk[] = "GET / HTTP/1.0\r\n\r\n";
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	int base, now = 0, fd, keep[4], st;
	unsigned refused = 0;

	/*
	 * No per-user limit: the 100 clients come and go faster than a loaded
	 * broker notices them go, and the 65th met EUSERS (seen in CI, ASan).
	 */
	start("-n 1 --max-clients-per-uid 0");
	cr_assert_eq(open_status(NULL), 0);
	usleep(100 * 1000);
	base = t_open_fds(tb.pid);
	cr_assert_gt(base, 0);
	for (int i = 0; i < 100; i++) {
		fd = connect_raw();
		cr_assert_geq(fd, 0);
		cr_assert_eq(send_fds_or_not(fd, &h, sizeof(h), 32, &refused), (ssize_t)sizeof(h));
		st = recv_welcome_close(fd);
		cr_assert_eq(st, 0, "hello %d with descriptors attached was refused: %d (%s)", i, st,
			     st < 0 ? strerror(-st) : "-");
		cr_assert_eq(send_fds_or_not(fd, "x", 1, 32, &refused), 1);     /* after the welcome */
		if (i < 4)
			keep[i] = fd;   /* held open: the broker still has them in its queue */
		else
			close(fd);
		fd = connect_raw();
		cr_assert_geq(fd, 0);
		cr_assert_eq(send_fds_or_not(fd, junk, sizeof(junk), 32, &refused), (ssize_t)sizeof(junk));
		close(fd);
	}
	usleep(200 * 1000);
	/*
	 * The four held connections are clients: each holds its socket, its process's pidfd, per shard a doorbell,
	 * and its two segments' memfds (kept for the punch at its end, discard.h).
	 */
	now = t_open_fds(tb.pid);
	cr_assert_leq(now, base + 4 * 5, "%d descriptors in the broker, %d before", now, base);
	for (int i = 0; i < 4; i++)
		close(keep[i]);
	for (int i = 0; i < 100 && (now = t_open_fds(tb.pid)) > base; i++)
		usleep(20 * 1000);
	cr_assert_leq(now, base, "%d descriptors in the broker, %d before", now, base);
	cr_assert_eq(open_status(NULL), 0, "the broker still serves");
	cr_assert(refused == 0 || refused == 300, "%u of 300 messages with descriptors refused: all or none", refused);
}

/*
 * The broker watches each attached client's process with a poll on a pidfd
 * in its control ring, and closing the pidfd does not end that poll: a
 * process that opens and closes connections and lives on would leave one
 * armed per connection (each a kernel allocation the broker can never take
 * back while the process lives). 200 opens and closes from this process
 * leave the rings' polls as they were (without the removal: 200 more).
 */
Test(access, a_process_opening_and_closing_in_a_loop_leaves_no_poll_in_the_broker)
{
	int before, after;

	start("-n 1");
	cr_assert_eq(open_status(NULL), 0);
	usleep(50 * 1000);
	before = t_ring_polls(tb.pid);
	cr_assert_geq(before, 1, "no poll found in the broker's rings (is /proc/PID/fdinfo readable?)");
	for (int i = 0; i < 200; i++)
		cr_assert_eq(open_status(NULL), 0);
	for (int i = 0; i < 50 && (after = t_ring_polls(tb.pid)) > before; i++)
		usleep(20 * 1000);
	cr_assert_leq(after, before, "%d polls armed in the broker's rings after 200 opens and closes, %d before",
		      after, before);
}

/*
 * chimet1 opens the broker's lock file (if it can) and waits in flock()
 * until the broker is gone, then holds the lock: 0 if it could not open
 * it, 1 once it holds it (written to the pipe first), 2 on a failure.
 */
static int hold_lock(void *arg)
{
	const int *wfd = arg;
	char path[320];
	int fd;

	snprintf(path, sizeof(path), "%s.lock", tb.sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == EACCES ? 0 : 2;
	if (flock(fd, LOCK_SH) < 0)
		return 2;
	(void)!write(*wfd, "l", 1);
	pause();
	return 1;
}

/*
 * The lock file says which broker runs on the socket: flock() it and a
 * starting broker says "in use by a running broker" and exits. Any user
 * could open it (0644) and flock() it read-only: waiting in flock() for
 * the broker to crash (the file stays) kept every later broker out, no
 * broker for anyone until that user let go. Now only its owner opens it.
 */
Test(access, another_user_cannot_hold_the_lock_and_keep_the_next_broker_out)
{
	char path[320];
	struct stat st;
	int p[2], r;
	pid_t pid;

	need_users();
	start("");
	snprintf(path, sizeof(path), "%s.lock", tb.sock);
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_eq(st.st_mode & 0077, 0, "the lock file is mode %04o", (unsigned)(st.st_mode & 07777));
	cr_assert_eq(pipe(p), 0);
	pid = as_user_start("chimet1", hold_lock, &p[1]);
	close(p[1]);    /* the child's alone: its exit is EOF */
	usleep(200 * 1000);
	kill(tb.pid, SIGKILL);  /* a crash: the lock file stays */
	cr_assert_eq(waitpid(tb.pid, &(int){ 0 }, 0), tb.pid);
	tb.pid = 0;
	(void)!read(p[0], &(char){ 0 }, 1);     /* held (or chimet1 is gone: EOF) */
	r = t_chimed_restart(&tb, 0, "");
	kill(pid, SIGKILL);
	user_done(pid);
	close(p[0]);
	cr_assert_eq(r, 0, "another user's flock() of the lock file kept the next broker out");
	cr_assert_eq(open_status(NULL), 0);
}

/* As chimet1: create the lock file `path` (0644) and keep it open, as one waiting to flock() it would. */
struct plant {
	char path[320];
	int wfd;                /* a byte once it is there */
};

static int plant_lock(void *arg)
{
	struct plant *pl = arg;
	int fd = open(pl->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);

	if (fd < 0)
		return 2;
	(void)!write(pl->wfd, "l", 1);
	pause();
	return 1;
}

/*
 * A lock file another user put in a socket directory anyone may write (a
 * shared /tmp, before the broker's first start): its owner, holding it
 * open, can flock() it whenever it likes (before a start, or from the
 * broker's crash on: the file stays) and keep every broker on that socket
 * out, and it writes the pid a refused broker names. chimed used it, and
 * its fchmod() to 0600 came too late for a descriptor already open. It
 * now refuses to start (exit 1), naming the file and its owner.
 */
Test(access, a_lock_file_of_another_user_is_refused_and_named)
{
	char dir[] = "/tmp/chime-t-XXXXXX", cmd[1024], out[2048], want[400];
	const char *chimed = getenv("CHIMED");
	struct passwd *pw;
	struct plant pl;
	int p[2];
	pid_t pid;
	size_t n;
	FILE *f;

	need_users();
	pw = getpwnam("chimet1");
	cr_assert(chimed && pw);
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(chmod(dir, 01777), 0);     /* as /tmp */
	snprintf(pl.path, sizeof(pl.path), "%s/chime.sock.lock", dir);
	cr_assert_eq(pipe(p), 0);
	pl.wfd = p[1];
	pid = as_user_start("chimet1", plant_lock, &pl);
	close(p[1]);
	n = (size_t)read(p[0], &(char){ 0 }, 1);
	close(p[0]);
	snprintf(cmd, sizeof(cmd), "timeout 5 '%s' --foreground --socket '%s/chime.sock' 2>&1; echo \"exit $?\"",
		 chimed, dir);
	out[0] = 0;
	if (n == 1 && (f = popen(cmd, "r"))) {
		size_t got = fread(out, 1, sizeof(out) - 1, f);

		out[got] = 0;
		pclose(f);
	}
	kill(pid, SIGKILL);
	user_done(pid);
	t_rmdir_files(dir);
	cr_assert_eq(n, 1, "chimet1 could not create '%s'", pl.path);
	snprintf(want, sizeof(want), "lock file '%s' belongs to uid %u, not to this broker's (0) or root",
		 pl.path, (unsigned)pw->pw_uid);
	cr_assert(strstr(out, "exit 1\n") && strstr(out, want), "chimed on chimet1's lock file said:\n%s", out);
}

/*
 * A hard link in a socket directory others may write, made to a file of
 * root's at the path of the broker's lock or sessions file: a root broker
 * truncated it and wrote its pid, or its session records, into it, and
 * made it 0600 (an /etc file, where links can be made to it: found by a
 * security audit, with an inotify-timed link for the sessions file). Each
 * is now refused for its second name, said, and left as it was.
 */
Test(access, a_hard_link_at_the_lock_or_sessions_file_is_refused_and_left_alone)
{
	static const char *const files[] = { "chime.sock.lock", "chime.sock.sessions" };
	static const char *const said[] = { "lock file '", "sessions file '" };
	static const char victim_text[] = "root's file, not the broker's\n";
	const char *chimed = getenv("CHIMED");

	cr_assert_not_null(chimed);
	for (int i = 0; i < 2; i++) {
		char dir[] = "/tmp/chime-t-XXXXXX", victim[256], at[256], cmd[1024], want[400], buf[128] = { 0 };
		char out[4096] = { 0 };
		struct stat st;
		FILE *f;
		int fd;

		cr_assert_not_null(mkdtemp(dir));
		cr_assert_eq(chmod(dir, 01777), 0);     /* as /tmp */
		snprintf(victim, sizeof(victim), "%s/victim", dir);
		snprintf(at, sizeof(at), "%s/%s", dir, files[i]);
		fd = open(victim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		cr_assert_geq(fd, 0);
		cr_assert_eq(write(fd, victim_text, strlen(victim_text)), (ssize_t)strlen(victim_text));
		close(fd);
		cr_assert_eq(link(victim, at), 0, "%s", strerror(errno));
		snprintf(cmd, sizeof(cmd), "timeout 10 '%s' --foreground --shards 1 --socket '%s/chime.sock' 2>&1; "
			 "echo \"exit $?\"", chimed, dir);
		f = popen(cmd, "r");
		cr_assert_not_null(f);
		(void)!fread(out, 1, sizeof(out) - 1, f);
		pclose(f);
		snprintf(want, sizeof(want), "%s%s' has 2 links", said[i], at);
		cr_expect(strstr(out, "exit 1\n") && strstr(out, want), "chimed on a hard link at its %s said:\n%s",
			  files[i], out);
		cr_assert_eq(stat(victim, &st), 0);
		fd = open(victim, O_RDONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0);
		(void)!read(fd, buf, sizeof(buf) - 1);
		close(fd);
		t_rmdir_files(dir);
		cr_assert_str_eq(buf, victim_text, "the linked file was written: '%s'", buf);
		cr_assert_eq(st.st_mode & 07777, 0644, "the linked file's mode is %04o", (unsigned)(st.st_mode & 07777));
	}
}

/*
 * The refusal of a second name says how to find the file's names with a
 * find command to paste: a path with a quote in it must stay one word there
 * (it was put between single quotes as it was: a review).
 */
Test(access, a_second_names_find_hint_quotes_a_path_with_a_quote)
{
	const char *chimed = getenv("CHIMED");
	char dir[] = "/tmp/chime-t-XXXXXX", sub[64], victim[128], at[128], want[256], out[4096] = { 0 };
	FILE *f;
	int fd;

	cr_assert_not_null(chimed);
	cr_assert_not_null(mkdtemp(dir));
	snprintf(sub, sizeof(sub), "%s/it's", dir);
	cr_assert_eq(mkdir(sub, 0755), 0);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	snprintf(at, sizeof(at), "%s/chime.sock.lock", sub);
	fd = open(victim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(link(victim, at), 0, "%s", strerror(errno));
	cr_assert_eq(setenv("T_SOCK", sub, 1), 0);
	f = popen("timeout 10 \"$CHIMED\" --foreground --shards 1 --socket \"$T_SOCK/chime.sock\" 2>&1", "r");
	cr_assert_not_null(f);
	(void)!fread(out, 1, sizeof(out) - 1, f);
	pclose(f);
	unsetenv("T_SOCK");
	unlink(at);
	rmdir(sub);
	t_rmdir_files(dir);
	snprintf(want, sizeof(want), "find / -xdev -samefile '%s/it'\\''s/chime.sock.lock' lists", dir);
	cr_assert(strstr(out, want), "chimed on a hard link at its lock file in '%s' said:\n%s\n(wanted: %s)", sub,
		  out, want);
}

/*
 * Root's broker leaves its files in a directory of uid 65534's (a session
 * with one timer, stopped): sock gets its socket's path.
 */
static void leave_roots_session_files(struct t_chimed *b, char *sock, size_t len)
{
	struct chime_opts o = { .session = "kept" };
	chime_id_t id;
	chime_t *c;

	cr_assert_not_null(getenv("CHIMED"));
	cr_assert_eq(t_chimed_start(b, NULL, "--shards 1"), 0);
	snprintf(sock, len, "%s", b->sock);
	o.socket_path = sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 3600 * UINT64_C(1000000000), 0, 0, &id), 0);
	cr_assert_eq(chime_flush(c), 0);
	chime_close(c);
	b->own_dir = 0;         /* its files stay for the next broker */
	cr_assert_eq(t_chimed_stop(b, SIGTERM), 0);
	cr_assert_eq(chown(b->dir, 65534, 65534), 0);
}

/* A broker as uid 65534 started on sock: what it said, and "exit N" after it. */
static void start_on_them_as_nobody(const char *sock, char *out, size_t len)
{
	FILE *f;

	cr_assert_eq(setenv("T_SOCK", sock, 1), 0);
	f = popen("timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \"$CHIMED\" --foreground "
		  "--shards 1 --socket \"$T_SOCK\" 2>&1; echo \"exit $?\"", "r");
	cr_assert_not_null(f);
	(void)!fread(out, 1, len - 1, f);
	pclose(f);
	unsetenv("T_SOCK");
}

/*
 * A broker that now runs as a user of its own, on the files of one that ran
 * as root, which root made writable to everyone by hand: it may not set
 * their mode, and was said to find them immutable or append-only (a review).
 */
Test(access, roots_session_files_made_writable_by_hand_are_said_to_be_roots)
{
	char sock[PATH_MAX], path[PATH_MAX + 64], out[4096] = { 0 };
	struct t_chimed b;
	struct dirent *e;
	DIR *d;

	if (geteuid() != 0)
		cr_skip("needs root (the files are root's, the second broker uid 65534's)");
	leave_roots_session_files(&b, sock, sizeof(sock));
	d = opendir(b.dir);
	cr_assert_not_null(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", b.dir, e->d_name);
			cr_assert_eq(chmod(path, 0666), 0);
		}
	closedir(d);
	start_on_them_as_nobody(sock, out, sizeof(out));
	t_rmdir_files(b.dir);
	cr_assert(strstr(out, "exit 1\n") && strstr(out, "' is root's, and this broker (uid 65534) may not set its mode") &&
		  !strstr(out, "immutable"), "a broker as uid 65534 on root's files, mode 0666, said:\n%s", out);
}

/*
 * The same files left as root's broker wrote them (0600): the second broker
 * cannot open the sessions file (EACCES). It was told to chmod 600, which
 * root's file has already and which gives uid 65534 nothing: it must say the
 * file is root's, and chown as the way to keep its sessions (a review).
 */
Test(access, roots_unreadable_sessions_file_is_said_to_be_roots_not_a_mode_to_set)
{
	char sock[PATH_MAX], out[4096] = { 0 };
	struct t_chimed b;

	if (geteuid() != 0)
		cr_skip("needs root (the files are root's, the second broker uid 65534's)");
	leave_roots_session_files(&b, sock, sizeof(sock));
	start_on_them_as_nobody(sock, out, sizeof(out));
	t_rmdir_files(b.dir);
	cr_assert(strstr(out, "exit 1\n") && strstr(out, "' is root's") && strstr(out, "chown 65534") &&
		  !strstr(out, "chmod 600"), "a broker as uid 65534 on root's files, mode 0600, said:\n%s", out);
}

/* As uid 65534: put a symbolic link to `canary` where the broker's socket is (arg: the socket's path). */
static int plant_socket_link(void *arg)
{
	const char *sock = arg;

	return unlink(sock) == 0 && symlink("canary", sock) == 0 ? 0 : 1;
}

/* As uid 65534: 0 if the canary (arg: its path) cannot be opened, 1 if it can. */
static int canary_closed(void *arg)
{
	int fd = open(arg, O_RDONLY | O_CLOEXEC);

	if (fd >= 0)
		close(fd);
	return fd >= 0;
}

/*
 * A reload sets the socket's group and mode again (--socket-group, a
 * policy that admits others): on the socket this broker bound, never on
 * what is at its path now. In a directory others may write (not sticky),
 * one removes the socket and puts a link there to a file of the broker's
 * user: before, the SIGHUP's chown() and chmod() followed it, and a root
 * broker gave root's file (/etc/shadow as well as a canary) to
 * --socket-group with mode 0660, or to everyone 0666; a service's broker
 * its own live shard file, every user's timers, writable. (Found by a
 * review: by hand, root's canary 0600 became 0666 and uid 65534 wrote it.)
 */
Test(access, a_reload_sets_the_mode_of_its_own_socket_only)
{
	char dir[] = "/dev/shm/chime-sock-XXXXXX", sock[300], canary[300], logf[300], extra[400];
	struct stat st;

	if (geteuid() != 0)
		cr_skip("needs root (uid 65534 plants the link)");
	cr_assert(mkdtemp(dir));
	cr_assert_eq(chmod(dir, 0777), 0);      /* anyone may write it: not sticky */
	snprintf(sock, sizeof(sock), "%s/s", dir);
	snprintf(canary, sizeof(canary), "%s/canary", dir);
	snprintf(logf, sizeof(logf), "%s/chimed.log", dir);
	cr_assert_eq(t_write_file(canary, "root's\n"), 0);
	cr_assert_eq(chmod(canary, 0600), 0);
	snprintf(extra, sizeof(extra), "--shards 1 --allow-all --socket-group 65534 2>'%s'", logf);
	cr_assert_eq(t_chimed_start(&tb, sock, extra), 0);
	cr_assert_eq(stat(sock, &st), 0);
	cr_assert(st.st_mode == (S_IFSOCK | 0660) && st.st_gid == 65534, "the socket: mode %o, group %u",
		  (unsigned)st.st_mode, (unsigned)st.st_gid);
	cr_assert_eq(user_done(child_start(NULL, 65534, plant_socket_link, sock)), 0, "no link planted");
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	for (int i = 0; i < 200 && !t_file_has(logf, "reloaded the policy"); i++)
		usleep(10000);
	cr_assert(t_file_has(logf, "reloaded the policy"), "no reload in 2 s");
	usleep(100000);         /* the socket's mode is set after that line */
	cr_assert_eq(stat(canary, &st), 0);
	cr_expect(st.st_mode == (S_IFREG | 0600) && st.st_gid == 0, "the reload made root's canary mode %o, group %u",
		  (unsigned)st.st_mode, (unsigned)st.st_gid);
	cr_expect_eq(user_done(child_start(NULL, 65534, canary_closed, canary)), 0, "uid 65534 opened root's canary");
	cr_expect(t_file_has(logf, "is not the socket this broker bound"), "the log does not say why");
	cr_expect(t_alive(tb.pid), "the broker stopped");
	t_chimed_stop(&tb, SIGTERM);
	cr_expect_eq(lstat(sock, &st), 0, "the stop removed the link");
	t_rmdir_files(dir);
}

/* ---- queries (what chimectl asks when it cannot read the segments) ---- */

enum { SCANNED = 100000 };      /* timers: several of the broker's scan steps per shard */

/*
 * chimet1: SCANNED timers, then its own query for 5 of them: the count is
 * exact although the broker reads the slabs in steps, the records are its.
 */
static int query_many(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct chime_query_timer recs[5];
	struct chime_query_head head = { .status = -1 };
	chime_t *c = NULL;
	chime_id_t id;

	(void)arg;
	if (chime_open(&c, &o) < 0)
		return 1;
	for (unsigned i = 0; i < SCANNED; i++)
		if (chime_arm(c, 31, now_ns() + 3600000 * MS, 0, i, &id) < 0)
			return 2;
	/* The shards apply the arms meanwhile: ask until all are armed (one query per 50 ms). */
	for (uint64_t t0 = now_ns(); now_ns() - t0 < 5000 * MS; usleep(60000)) {
		raw_query(CHIME_HELLO_QUERY_TIMERS, getpid(), 5, &head, recs, sizeof(*recs), 5);
		if (head.status != 0 || head.total == SCANNED)
			break;
	}
	chime_close(c);
	if (head.status != 0 || head.total != SCANNED || head.count != 5) {
		fprintf(stderr, "status %d, total %llu, count %llu\n", head.status,
			(unsigned long long)head.total, (unsigned long long)head.count);
		return 3;
	}
	for (unsigned i = 0; i < 5; i++)
		if (recs[i].key != 31 || recs[i].state != CHIME_NODE_ARMED)
			return 4;
	return 0;
}

/*
 * chimet1: two queries at once; the second is too soon. On a loaded host
 * the pair can take 50 ms: a second query answered 0 fails only if it was
 * answered within 50 ms of the first one's sending (the broker's spacing
 * was then below 50 ms for sure); otherwise the pair is tried again.
 */
static int query_twice(void *arg)
{
	(void)arg;
	for (int tries = 0; tries < 20; tries++, usleep(60000)) {
		struct chime_query_head a, b;
		uint64_t sent = now_ns();

		raw_query(CHIME_HELLO_QUERY_SESSIONS, 0, 0, &a, NULL, 0, 0);
		raw_query(CHIME_HELLO_QUERY_SESSIONS, 0, 0, &b, NULL, 0, 0);
		if (a.status == 0 && b.status == -EBUSY)
			return 0;
		if (a.status == 0 && b.status == 0 && now_ns() - sent < 50 * MS)
			return 1;       /* two answered within 50 ms */
		if (a.status != 0 && a.status != -EBUSY)
			return 2;
	}
	return 3;
}

Test(access, a_timers_query_counts_every_timer_and_a_user_cannot_starve_roots_queries)
{
	struct chime_query_head head;

	need_users();
	start("--allow-all -n 2");
	cr_assert_eq(as_user("chimet1", query_many, NULL), 0, "chimet1's query of its %u timers", SCANNED);
	usleep(60000);
	cr_assert_eq(as_user("chimet1", query_twice, NULL), 0, "one query per 50 ms for a user");
	/* Within those 50 ms: root's queries have their own turn. */
	raw_query(CHIME_HELLO_QUERY_SESSIONS, 0, 0, &head, NULL, 0, 0);
	cr_assert_eq(head.status, 0, "root's query after another user's: %d", head.status);
}

/* chimet1: cheap queries in a tight loop for 2 s, as fast as the broker answers. */
static int query_spin(void *arg)
{
	uint64_t until = chime_now() + 2000 * MS;
	struct chime_query_head head;
	unsigned served = 0;

	(void)arg;
	while (chime_now() < until) {
		raw_query(CHIME_HELLO_QUERY_SESSIONS, 0, 0, &head, NULL, 0, 0);
		served += head.status == 0;
	}
	return served > 0 ? 0 : 1;
}

/* chimet2: asks as chimectl does, again 60 ms after each EBUSY; 0 if answered within 1 s. */
static int query_patiently(void *arg)
{
	uint64_t until = chime_now() + 1000 * MS;
	struct chime_query_head head;

	(void)arg;
	do {
		raw_query(CHIME_HELLO_QUERY_SESSIONS, 0, 0, &head, NULL, 0, 0);
		if (head.status == 0)
			return 0;
		usleep(60000);
	} while (chime_now() < until);
	return 1;
}

/* chimet2: three queries in a row, each as chimectl asks; 0 if each was answered within 1 s. */
static int query_patiently_thrice(void *arg)
{
	for (int i = 0; i < 3; i++)
		if (query_patiently(arg))
			return 1 + i;
	return 0;
}

Test(access, a_user_asking_in_a_tight_loop_cannot_starve_another_users_queries)
{
	pid_t spinner;

	need_users();
	start("--allow-all");
	spinner = as_user_start("chimet1", query_spin, NULL);
	usleep(100000);         /* chimet1 is spinning */
	cr_expect_eq(as_user("chimet2", query_patiently, NULL), 0,
		     "chimet2 was refused for 1 s while chimet1 asked in a loop");
	cr_assert_eq(user_done(spinner), 0, "chimet1's own queries were answered too");
}

/*
 * chimet1 asking in a loop as two uids (from_user: as itself and its
 * subordinate uid 200001; else as 200001 and 200002), while chimet2 asks
 * as chimectl does (patient).
 */
static void subuid_spinners_beside_chimet2(bool from_user, int (*patient)(void *), const char *what)
{
	char file[300], extra[400];
	pid_t spin[2];
	int served = 0;

	need_users();
	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\n"), 0);
	snprintf(extra, sizeof(extra), "--allow-all --subuid-file %s", file);
	start(extra);
	spin[0] = from_user ? as_user_start("chimet1", query_spin, NULL) : child_start(NULL, 200002, query_spin, NULL);
	spin[1] = child_start(NULL, 200001, query_spin, NULL);
	usleep(100000);         /* both are spinning */
	cr_expect_eq(as_user("chimet2", patient, NULL), 0, "chimet2 was refused for 1 s while %s asked in a loop",
		     what);
	for (int i = 0; i < 2; i++)
		served += user_done(spin[i]) == 0;
	cr_assert_gt(served, 0, "the spinners' own queries were answered too");
	unlink(file);
}

/*
 * The same with the spinning user's queries coming from two of its
 * subordinate uids (/etc/subuid): they count as one user, as for the
 * per-user limits. As two users, each took the turn owed to the first
 * user refused other than the one answered last, in alternation, and
 * chimet2, asking every 60 ms, was never that first one.
 */
Test(access, a_users_subordinate_uids_asking_in_a_loop_cannot_starve_another_users_queries)
{
	subuid_spinners_beside_chimet2(false, query_patiently, "two of chimet1's subordinate uids");
}

/*
 * The same with one user asking as itself and as one of its subordinate
 * uids, which for the limits is a user of its own (its containers do not
 * use up its own share): two users, so two who can each take the turn
 * owed to the other.
 */
Test(access, a_user_and_its_subordinate_uid_asking_in_a_loop_cannot_starve_another_users_queries)
{
	subuid_spinners_beside_chimet2(true, query_patiently_thrice, "chimet1 and its subordinate uid");
}

/*
 * A broker holding CROWD timers (root's, armed here): a timers query reads
 * every node, so each scan takes longer than chimectl's pause between asks
 * (60 ms): about 120 ms on the 2-core development VM.
 */
enum { CROWD = 9000000 };

/*
 * As chimet1 and chimet2 for 3 s, each with a client and one timer of its
 * own: queries for its own timers, in a tight loop (arg NULL) or as
 * chimectl asks (again 60 ms after EBUSY). Exits with the number answered
 * (at most 199), or 200 and more on a failure.
 */
static int scan_loop(void *patient)
{
	struct chime_query_timer rec;
	struct chime_query_head head;
	chime_t *c = t_open(tb.sock);
	unsigned served = 0;
	uint64_t until;
	chime_id_t id;

	if (!c || chime_arm(c, 5, chime_now() + 3600000 * MS, 0, 0, &id) < 0 || chime_flush(c) < 0)
		return 200;
	for (until = chime_now() + 3000 * MS; chime_now() < until && served < 199;) {
		raw_query(CHIME_HELLO_QUERY_TIMERS, getpid(), 1, &head, &rec, sizeof(rec), 1);
		if (head.status == 0)
			served++;
		else if (head.status != -EBUSY)
			return 201;
		else if (patient)
			usleep(60000);
	}
	chime_close(c);
	return (int)served;
}

/*
 * The timers query is one scan at a time, for everyone. A user asking for
 * its timers in a loop started the next scan as soon as its last one
 * ended, and another user's query, asked as chimectl asks, found the scan
 * busy (EBUSY) for as long as the turns of the interval happened to fall
 * so (a single query of chimet2's: 2 of 12 refused for 1 s, the others
 * answered in 153-451 ms), or the other way round, as here (before, six
 * runs: chimet1 answered 0-5 times, chimet2 16-22). Now the first other
 * user refused during a scan is owed the next one: two users asking take
 * turns (131-215 ms for that single query).
 */
Test(access, a_user_scanning_in_a_loop_cannot_keep_another_users_timers_query_busy)
{
	char dir[] = "/dev/shm/chime-t-XXXXXX", sock[64];
	int spun, patient;
	pid_t spinner;
	chime_t *c;
	chime_id_t id;

	need_users();
	if (!mkdtemp(dir))      /* a tmpfs: the slab is 600 MB */
		cr_skip("no writable /dev/shm here");
	cr_assert_eq(chmod(dir, 0755), 0);
	snprintf(sock, sizeof(sock), "%s/chime.sock", dir);
	cr_assert_eq(t_chimed_start(&tb, sock, "--allow-all -n 2 --capacity 4718592 --max-timers-per-client 0 "
				    "--max-timers-per-uid 0"), 0);
	snprintf(tb.dir, sizeof(tb.dir), "%s", dir);
	tb.own_dir = 1;         /* the suite's .fini removes it */
	c = t_open(tb.sock);
	cr_assert_not_null(c);
	for (unsigned i = 0; i < CROWD; i++)
		cr_assert_eq(chime_arm(c, 1, chime_now() + 3600000 * MS, 0, i, &id), 0, "arm %u", i);
	cr_assert_eq(chime_flush(c), 0);
	spinner = as_user_start("chimet1", scan_loop, NULL);
	patient = as_user("chimet2", scan_loop, "patient");
	spun = user_done(spinner);
	chime_close(c);
	cr_log_info("timers queries answered in 3 s: chimet1 (a tight loop) %d, chimet2 (as chimectl) %d",
		    spun, patient);
	cr_assert_lt(spun, 200, "chimet1's loop failed (%d)", spun);
	cr_assert_lt(patient, 200, "chimet2's loop failed (%d)", patient);
	cr_assert(patient * 2 >= spun && spun * 2 >= patient && patient >= 3,
		  "answered in 3 s: chimet1 %d times, chimet2 %d: not in turn", spun, patient);
}

/*
 * The same with a user scanning in a loop as itself and as one of its
 * subordinate uids (two users for the limits): with one scan owed, to the
 * first refused, the two took it in alternation, and the third user, asking
 * as chimectl does, was never the first refused. A broker of a few timers:
 * each scan is one step, and the owed scan is what refuses.
 */
Test(access, a_user_and_its_subordinate_uid_scanning_in_a_loop_cannot_keep_another_users_timers_query_busy)
{
	char file[300], extra[400];
	int spun[2], patient;
	pid_t spinner[2];

	need_users();
	snprintf(file, sizeof(file), "/tmp/chime-subuid-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "chimet1:200000:65536\n"), 0);
	snprintf(extra, sizeof(extra), "--allow-all -n 2 --subuid-file %s", file);
	start(extra);
	spinner[0] = as_user_start("chimet1", scan_loop, NULL);
	spinner[1] = child_start(NULL, 200001, scan_loop, NULL);
	patient = as_user("chimet2", scan_loop, "patient");
	for (int i = 0; i < 2; i++)
		spun[i] = user_done(spinner[i]);
	unlink(file);
	cr_log_info("timers queries answered in 3 s: chimet1 %d and its uid 200001 %d (tight loops), chimet2 %d "
		    "(as chimectl)", spun[0], spun[1], patient);
	cr_assert(spun[0] < 200 && spun[1] < 200 && patient < 200, "a loop failed (%d, %d, %d)", spun[0], spun[1],
		  patient);
	cr_assert_geq(patient, 5, "chimet2 answered %d times in 3 s, chimet1 %d and %d", patient, spun[0], spun[1]);
}

/* ---- the tools, run by an admitted client outside --stats-group ---- */

struct tool_run {
	const char *cmd;        /* shell command; its output goes to `out` */
	char out[2048];
};

static int run_tool(void *arg)
{
	struct tool_run *t = arg;
	FILE *p = popen(t->cmd, "r");
	size_t n;

	if (!p)
		return 99;
	n = fread(t->out, 1, sizeof(t->out) - 1, p);
	t->out[n] = 0;
	/* the parent cannot see our buffer: print it for the log, return the status */
	fputs(t->out, stdout);
	return WEXITSTATUS(pclose(p));
}

/*
 * The build tree may sit where other users cannot reach (a 0700 temporary
 * directory): give them copies in the broker's directory, with libchime next
 * to them (the commands set LD_LIBRARY_PATH to that directory).
 */
static const char *tool_copy(const char *env)
{
	const char *p = t_tool_copy(tb.dir, env);

	cr_assert_not_null(p);
	return p;
}

static const char *g_ctl;

/*
 * chimectl status is a health check: a user at its --max-clients-per-uid
 * (root's own services, say) gets EUSERS from the handshake, which is an
 * answer: exit 0, and the message says this user was refused.
 */
Test(access, status_at_the_users_client_limit_says_running)
{
	struct chime_opts o = { .socket_path = tb.sock };
	struct tool_run t;
	char cmd[1024];
	chime_t *c = NULL;
	int st;

	start("--max-clients-per-uid 1");
	o.socket_path = tb.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s status 2>&1", tb.dir, tool_copy("CHIMECTL"), tb.sock);
	t.cmd = cmd;
	st = run_tool(&t);
	chime_close(c);
	cr_assert_eq(st, 0, "exit %d: %s", st, t.out);
	cr_assert_not_null(strstr(t.out, "running"), "%s", t.out);
	cr_assert_not_null(strstr(t.out, "refused this user"), "%s", t.out);
}

/* chimet1: a client with 3 timers of key 77; chimectl lists them, and only its own clients. */
static int own_timers(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock };
	char cmd[1024], line[256];
	int timers = 0, mine = 0, others = 0;
	chime_t *c;
	chime_id_t id;
	FILE *p;

	(void)arg;
	if (chime_open(&c, &o) < 0)
		return 1;
	for (int i = 0; i < 3; i++)
		if (chime_arm(c, 77, chime_now() + 3600000 * MS, 0, 0, &id) < 0)
			return 2;
	chime_flush(c);         /* an hour ahead: applied now, not at the heartbeat */
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s timers --client %d", tb.dir, g_ctl, tb.sock,
		 (int)getpid());
	/* Until the shards have applied them (a loaded host): one query per 50 ms. */
	for (int tries = 0; tries < 30 && timers != 3; tries++) {
		usleep(100000);
		timers = 0;
		p = popen(cmd, "r");
		while (p && fgets(line, sizeof(line), p))
			timers += strstr(line, " 77 ") != NULL;
		if (!p || pclose(p) != 0)
			return 3;
	}
	if (timers != 3)
		return 3;
	usleep(100000);
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s clients", tb.dir, g_ctl, tb.sock);
	p = popen(cmd, "r");
	while (p && fgets(line, sizeof(line), p)) {
		int pid;

		if (sscanf(line, "%*u %d", &pid) == 1)
			*(pid == getpid() ? &mine : &others) += 1;
	}
	if (!p || pclose(p) != 0)
		return 4;
	chime_close(c);
	return mine == 1 && others == 0 ? 0 : 5;
}

Test(access, tools_work_on_what_a_client_may_see_and_say_why_not_the_rest)
{
	struct tool_run t;
	char cmd[1024];
	const char *chimectl, *chimestat;

	need_users();
	start("--allow-all");
	chimectl = tool_copy("CHIMECTL");
	chimestat = tool_copy("CHIMESTAT");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s status 2>&1 | grep -q 'running and admits this user'",
		 tb.dir, chimectl, tb.sock);
	t.cmd = cmd;
	cr_assert_eq(as_user("chimet1", run_tool, &t), 0, "chimectl status for an admitted user");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s timers --client %d 2>&1 | grep -q \"another user's\"",
		 tb.dir, chimectl, tb.sock, (int)getpid());
	{
		struct chime_opts o = { .socket_path = tb.sock };
		chime_t *mine;
		chime_id_t id;

		cr_assert_eq(chime_open(&mine, &o), 0);
		cr_assert_eq(chime_arm(mine, 5, now_ns() + 3600000 * MS, 0, 0, &id), 0);
		cr_assert_eq(as_user("chimet1", run_tool, &t), 0, "chimet1 must not list root's timers, and say why");
		g_ctl = chimectl;
		cr_assert_eq(as_user("chimet1", own_timers, NULL), 0, "a user lists its own client's timers");
		chime_close(mine);
	}
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s -1 >/dev/null 2>&1", tb.dir, chimestat, tb.sock);
	cr_assert_eq(as_user("chimet1", run_tool, &t), 1, "chimestat exits 1 (cannot read)");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s -1 2>&1 | grep -q 'stats-group'", tb.dir, chimestat, tb.sock);
	cr_assert_eq(as_user("chimet1", run_tool, &t), 0, "chimestat must say why it cannot");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s shutdown >/dev/null 2>&1", tb.dir, chimectl, tb.sock);
	cr_assert_neq(as_user("chimet1", run_tool, &t), 0, "a client stopped the broker");
	cr_assert(t_alive(tb.pid), "the broker is not running");
}

/*
 * chimet1: a hello whose welcome it never reads, the socket shut down but
 * kept open (the slot stays taken: welcomes_never_read_...), then its
 * chimectl clients until it lists that slot, as `jq` prints it: 0 once it
 * lists exactly this process's slot as dying, else 1 + what it last said.
 */
static int own_held_slot(void *arg)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	char cmd[1024], want[64], *said = arg;
	int fd = connect_raw();
	FILE *p;

	if (fd < 0 || send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h))
		return 1;
	usleep(50000);          /* the welcome sent: HELD once we hang up */
	shutdown(fd, SHUT_RDWR);
	snprintf(want, sizeof(want), "[[%d,\"dying\"]]", (int)getpid());
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s -j clients | jq -c '[.clients[] | [.pid, .state]]'",
		 tb.dir, g_ctl, tb.sock);
	for (int tries = 0; tries < 50; tries++) {
		size_t n;

		p = popen(cmd, "r");
		n = p ? fread(said, 1, 255, p) : 0;
		said[n] = '\0';
		if (p)
			pclose(p);
		if (!strncmp(said, want, strlen(want)))
			return close(fd), 0;
		usleep(100000);
	}
	close(fd);
	return 1;
}

/*
 * A user's own slot held by a welcome it never read counts against its
 * limits (chimectl users: "held"), and root's chimectl clients lists it
 * as dying, but the user's own listing (a query: it may not read the
 * segments) showed connected clients only, so its count had nothing to
 * show for it. Another user's held slot (root's, here) stays unlisted.
 */
Test(access, a_users_own_held_slot_is_listed_by_its_query_and_no_one_elses)
{
	/* the child's last answer, for the message: as_user() forks */
	char *said = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct chime_map m;
	char path[300];
	int roots;

	cr_assert_neq(said, MAP_FAILED);
	said[0] = '\0';
	need_users();
	start("--allow-all --shards 1");
	g_ctl = tool_copy("CHIMECTL");
	roots = hello_unread("");
	usleep(50000);
	shutdown(roots, SHUT_RDWR);
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	for (int k = 0; k < 2000 && in_state(m.base, CHIME_CLIENT_DYING) != 1; k++)
		usleep(1000);
	cr_assert_eq(in_state(m.base, CHIME_CLIENT_DYING), 1, "root's held slot is not shown as taken");
	chime_seg_unmap(&m);
	cr_expect_eq(as_user("chimet1", own_held_slot, said), 0,
		     "chimet1's chimectl clients did not list its held slot alone, as dying: last said %s", said);
	close(roots);
	munmap(said, 4096);
}

/* chimet1: session "t1jobs" with two timers an hour ahead, left detached. */
static int detached_jobs(void *arg)
{
	struct chime_opts o = { .socket_path = tb.sock, .session = "t1jobs" };
	chime_t *c;
	chime_id_t id;

	(void)arg;
	if (chime_open(&c, &o) < 0)
		return 1;
	for (int i = 0; i < 2; i++)
		if (chime_arm(c, 11, chime_now() + 3600000 * MS, 0, 0, &id) < 0)
			return 2;
	chime_flush(c);
	chime_close(c);         /* detached: the timers stay */
	return 0;
}

/*
 * `chimectl timers --session NAME` lists a session's timers with no
 * process attached: for its user by the broker's answer (it cannot read
 * the segments), for root from the segments; another user is told whose
 * it is not.
 */
Test(access, a_user_lists_its_detached_sessions_timers_by_name_and_no_one_elses)
{
	struct tool_run t;
	char cmd[1024];
	const char *chimectl;
	int r = -1;

	need_users();
	start("--allow-all");
	chimectl = tool_copy("CHIMECTL");
	cr_assert_eq(as_user("chimet1", detached_jobs, NULL), 0);
	t.cmd = cmd;
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s -j timers --session t1jobs | "
		 "jq -e '.total == 2 and ([.timers[] | select(.key == \"11\" and .state == \"armed\")] | length) == 2' "
		 ">/dev/null", tb.dir, chimectl, tb.sock);
	/* until the shard has applied the arms (a loaded host); one query per 50 ms */
	for (int tries = 0; tries < 30 && r != 0; tries++, usleep(100000))
		r = as_user("chimet1", run_tool, &t);
	cr_assert_eq(r, 0, "chimet1 lists its detached session's 2 timers");
	/* The child's output stays in the child: its status says both (99: not the message wanted). */
	snprintf(cmd, sizeof(cmd), "out=$(LD_LIBRARY_PATH=%s %s -s %s timers --session t1jobs 2>&1); s=$?; "
		 "echo \"$out\"; echo \"$out\" | grep -q \"another user's session\" || exit 99; exit $s", tb.dir,
		 chimectl, tb.sock);
	cr_assert_eq(as_user("chimet2", run_tool, &t), 1, "chimet2 must not list chimet1's session, and say why");
	snprintf(cmd, sizeof(cmd), "out=$(LD_LIBRARY_PATH=%s %s -s %s timers --session nosuch 2>&1); s=$?; "
		 "echo \"$out\"; echo \"$out\" | grep -q 'no session of that name' || exit 99; exit $s", tb.dir,
		 chimectl, tb.sock);
	cr_assert_eq(as_user("chimet1", run_tool, &t), 1, "a session that is not there: exit 1, and said");
	snprintf(cmd, sizeof(cmd), "%s -s %s -j timers -S t1jobs -n 1 | jq -e '.total == 2 and .shown == 1 and "
		 ".running' >/dev/null", chimectl, tb.sock);
	cr_assert_eq(run_tool(&t), 0, "root reads the segments: %s", t.out);
	snprintf(cmd, sizeof(cmd), "%s -s %s timers -S nosuch 2>&1; exit $?", chimectl, tb.sock);
	cr_assert_eq(run_tool(&t), 1, "%s", t.out);
	cr_assert(strstr(t.out, "no session 'nosuch'"), "%s", t.out);
}

/*
 * reset-stats is for root and the broker's user, like shutdown: an admitted
 * client of another user is refused by the broker, exit status 4 and a
 * message saying who may; the figures are untouched. Root may.
 */
Test(access, reset_stats_is_for_root_and_the_broker_user_only)
{
	struct tool_run t;
	char cmd[1024], path[300];
	const char *chimectl;
	struct chime_map m;
	const struct chime_ctl *ctl;

	need_users();
	start("--allow-all");
	chimectl = tool_copy("CHIMECTL");
	snprintf(path, sizeof(path), "%s.ctl", tb.sock);
	cr_assert_eq(chime_seg_open(path, CHIME_SEG_CONTROL, &m), 0);
	ctl = m.base;
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s reset-stats 2>&1; exit $?", tb.dir, chimectl, tb.sock);
	t.cmd = cmd;
	cr_assert_eq(as_user("chimet1", run_tool, &t), 4, "another user's reset-stats must exit 4");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s reset-stats 2>&1 | grep -q \"only root and the broker's user\"",
		 tb.dir, chimectl, tb.sock);
	cr_assert_eq(as_user("chimet1", run_tool, &t), 0, "the refusal must say who may");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s --json reset-stats | grep -q '\"exit_status\":4'",
		 tb.dir, chimectl, tb.sock);
	cr_assert_eq(as_user("chimet1", run_tool, &t), 0, "--json says so too");
	cr_assert_eq(at_load(&ctl->stats_reset_gen), 0, "a refused reset resets nothing");
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s -s %s reset-stats >/dev/null", tb.dir, chimectl, tb.sock);
	t.cmd = cmd;
	cr_assert_eq(run_tool(&t), 0, "root may");
	cr_assert_eq(at_load(&ctl->stats_reset_gen), 1);
	cr_assert_gt(at_load(&ctl->stats_reset_ns), 0);
	chime_seg_unmap(&m);
}

Test(access, sighup_reloads_the_policy_file_and_the_broker_keeps_running)
{
	char file[300], extra[400];

	need_users();
	snprintf(file, sizeof(file), "/tmp/chime-policy-%d", (int)getpid());
	cr_assert_eq(t_write_file(file, "# nobody else yet\n"), 0, "%s: %s", file, strerror(errno));
	snprintf(extra, sizeof(extra), "--policy-file %s", file);
	start(extra);
	cr_assert_eq(as_user("chimet1", open_status, NULL), 13, "not admitted yet");
	cr_assert_eq(t_write_file(file, "allow-uid chimet1   # added later\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	for (int i = 0; i < 100 && as_user("chimet1", open_status, NULL) != 0; i++)
		usleep(20000);
	cr_assert_eq(as_user("chimet1", open_arm_receive, NULL), 0, "admitted after SIGHUP");
	cr_assert_eq(as_user("chimet2", open_status, NULL), 13, "and nobody else");
	/* a broken file keeps the policy in force */
	cr_assert_eq(t_write_file(file, "allow-uid no-such-user-here\n"), 0);
	cr_assert_eq(kill(tb.pid, SIGHUP), 0);
	usleep(200000);
	cr_assert(t_alive(tb.pid), "SIGHUP stopped the broker");
	cr_assert_eq(as_user("chimet1", open_status, NULL), 0, "a bad reload must keep the old policy");
	unlink(file);
}

/* ---- whom a client trusts as its broker ---- */

struct squatter {
	char path[108];         /* the socket it listens at */
	int ready_fd;           /* a byte once it listens */
};

/* As another user: listen at the path, and hang up on whoever comes. */
static int squat(void *arg)
{
	const struct squatter *s = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 8) < 0 ||
	    chmod(s->path, 0666) < 0 || write(s->ready_fd, "", 1) != 1)
		return 1;
	for (;;) {
		int c = accept(fd, NULL, NULL);

		if (c >= 0)
			close(c);
	}
}

/* A directory for it: mode 1777 as /tmp, owned by root or by `owner`. */
static pid_t squatter_start(struct squatter *s, char *dir, uid_t owner)
{
	int fds[2];
	char byte;
	pid_t pid;

	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(chmod(dir, 01777), 0);
	cr_assert_eq(chown(dir, owner, (gid_t)-1), 0);
	snprintf(s->path, sizeof(s->path), "%s/chime.sock", dir);
	cr_assert_eq(pipe(fds), 0);
	s->ready_fd = fds[1];
	pid = as_user_start("chimet1", squat, s);
	close(fds[1]);
	cr_assert_eq(read(fds[0], &byte, 1), 1, "the other user could not listen at %s", s->path);
	close(fds[0]);
	return pid;
}

static void squatter_stop(pid_t pid, struct squatter *s, const char *dir)
{
	kill(pid, SIGKILL);
	(void)user_done(pid);
	unlink(s->path);
	rmdir(dir);
}

/*
 * libchime hands whoever listens at the socket path its session's name and
 * takes from it the memory its timers live in. In a directory any user may
 * write (/tmp), another user could listen there while no broker runs, and
 * chime_open() talked to it. It trusts root, its own user, and the owner of
 * the socket's directory only: anyone else is -EPERM.
 */
Test(access, a_client_does_not_trust_another_users_listener_in_a_directory_anyone_may_write)
{
	struct chime_opts o = { .socket_path = NULL, .session = "mine" };
	struct squatter s;
	char dir[] = "/tmp/chime-squat-XXXXXX";
	chime_t *c = NULL;
	const char *chimectl = getenv("CHIMECTL"), *demo = getenv("CHIME_DEMO");
	const char *asks[] = { "sessions", "drop-session mine", "reset-stats" };
	struct tool_run t[3], d;
	char cmd[3][1024], dcmd[1024];
	int st[3], dst;
	pid_t pid;
	int r;

	need_users();
	cr_assert_not_null(chimectl, "$CHIMECTL");
	cr_assert_not_null(demo, "$CHIME_DEMO");
	pid = squatter_start(&s, dir, 0);
	o.socket_path = s.path;
	r = chime_open(&c, &o);
	/* Nor do chimectl's questions over the socket, which name a session and believe the answer. */
	for (int i = 0; i < 3; i++) {
		snprintf(cmd[i], sizeof(cmd[i]), "%s -s %s %s 2>&1", chimectl, s.path, asks[i]);
		t[i].cmd = cmd[i];
		st[i] = run_tool(&t[i]);
	}
	/* chime-demo, the README's first client, says why as chimectl does (it said "Operation not permitted" alone). */
	snprintf(dcmd, sizeof(dcmd), "%s -s %s -n 10 2>&1", demo, s.path);
	d.cmd = dcmd;
	dst = run_tool(&d);
	squatter_stop(pid, &s, dir);
	cr_assert_eq(r, -EPERM, "chime_open() to another user's listener in a root-owned 1777 directory: %s",
		     strerror(-r));
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(st[i], 1, "chimectl %s: exit %d: %s", asks[i], st[i], t[i].out);
		cr_assert_not_null(strstr(t[i].out, "does not trust"), "chimectl %s: %s", asks[i], t[i].out);
	}
	cr_assert_eq(dst, 1, "chime-demo: exit %d: %s", dst, d.out);
	cr_assert_not_null(strstr(d.out, "Operation not permitted (what listens there runs as a user this one does "
				  "not trust"), "chime-demo: %s", d.out);

	/* The directory's owner put it there: trusted, so the handshake goes on (and is hung up on). */
	{
		char own[] = "/tmp/chime-squat-XXXXXX";

		pid = squatter_start(&s, own, getpwnam("chimet1")->pw_uid);
		o.socket_path = s.path;
		r = chime_open(&c, &o);
		squatter_stop(pid, &s, own);
		cr_assert(r < 0 && r != -EPERM, "a listener owning the directory: %s", strerror(-r));
	}
}

/* chimed run by a user in a directory it does not own says other users' clients will not trust it. */
Test(access, a_broker_in_a_directory_its_user_does_not_own_says_others_will_not_trust_it)
{
	char dir[] = "/tmp/chime-squat-XXXXXX", cmd[1024];
	const char *chimed;
	struct tool_run t = { .cmd = cmd };

	need_users();
	start("--allow-all");
	chimed = tool_copy("CHIMED");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(chmod(dir, 01777), 0);
	snprintf(cmd, sizeof(cmd), "timeout -s TERM 2 %s --foreground --socket %s/chime.sock 2>&1 | "
		 "grep -q 'will not trust'", chimed, dir);
	cr_assert_eq(as_user("chimet1", run_tool, &t), 0, "no warning from chimed in a root-owned 1777 directory");
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	(void)!system(cmd);
}

/*
 * One user's workers opening together (a pre-forked server starting, its
 * workers niced or short of CPU between their connect and their hello):
 * more of them wait for their hellos to be read than the broker lets one
 * user hold (8), and it used to hang up on the rest (5 of 64 such workers
 * failed with -ECONNRESET). It now answers -EAGAIN and libchime asks again.
 * Here 8 connections of the user that say nothing yet are the slow
 * workers; they go 300 ms into the open.
 */
Test(access, an_open_beside_a_users_eight_unfinished_handshakes_gets_in)
{
	int slow[8], st;
	pid_t kid;

	start("");
	for (int i = 0; i < 8; i++)
		cr_assert_geq(slow[i] = connect_raw(), 0);
	usleep(100000);         /* all 8 accepted */
	kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0) {
		chime_t *c = NULL;
		int r = chime_open(&c, &(struct chime_opts){ .socket_path = tb.sock });

		if (r == 0)
			chime_close(c);
		_exit(-r & 0xff);
	}
	usleep(300000);
	for (int i = 0; i < 8; i++)
		close(slow[i]);
	cr_assert_eq(waitpid(kid, &st, 0), kid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the open failed beside 8 unfinished handshakes: %s",
		  WIFEXITED(st) ? strerror(WEXITSTATUS(st)) : "killed");
}

/* Mappings of clients' rw segments and touch tables in process pid. */
static int client_segments_mapped(pid_t pid)
{
	char path[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "chime-client-rw") || strstr(line, "chime-client-touch");
	fclose(f);
	return n;
}

/*
 * As its user: `*arg` attaches at once, each offered before any is answered,
 * then each answered with its segments sealed for good but writable. The
 * exit status: how many were refused with EPROTO (their segments kept by
 * the broker), plus 10 for each hello refused with EUSERS; 255 if
 * anything else happened.
 */
static int attach_sealed_open(void *arg)
{
	enum { MAX = 8 };
	int n = *(const int *)arg, fd[MAX], proto = 0, users = 0;

	if (n > MAX)
		return 255;
	for (int i = 0; i < n; i++)
		if ((fd[i] = t_raw_hello(tb.sock, NULL, 0, CHIME_HELLO_TOUCH)) < 0)
			return 255;
	for (int i = 0; i < n; i++)
		if (poll(&(struct pollfd){ .fd = fd[i], .events = POLLIN }, 1, 5000) != 1)
			return 255;     /* every welcome (or refusal) is here before any answer */
	for (int i = 0; i < n; i++) {
		int kept[16], k = 0, r = t_answer_offer_as(fd[i], T_ANSWER_SEALED_OPEN, kept, &k);

		if (r == 0)
			r = t_attach_answer(fd[i]);
		proto += r == -EPROTO;
		users += r == -EUSERS;
		if (r != -EPROTO && r != -EUSERS)
			return 255;
		for (int m = 0; m < k; m++)
			close(kept[m]);
		close(fd[i]);
	}
	return proto + 10 * users;
}

/*
 * A client that seals its rw segment and touch table for good (F_SEAL_SEAL)
 * without sealing them against writes is refused, and leaves the broker
 * no way to stop its punches: the broker keeps its mappings of them (its
 * munmap would wait for a punch), counted for that user, up to the
 * segments of a quarter of its share of connections, but at least of
 * MAX_HANDSHAKES_PER_UID (8), each attach whose answer is still to come
 * counted as its two. Past that its user alone is refused (-EUSERS), for
 * good: nothing of libchime seals so. Here --max-clients-per-uid 4 lets
 * 4 attaches be under way at once, and 16 segments be kept: waves of 4
 * then 1 are refused EPROTO (10 kept), and of the next 4 at once the
 * last hello is refused EUSERS, the 3 before it counted as under way:
 * checked at each hello alone, four answered at once kept 8 past a bound
 * of 2 (a review). Then every attach of that user is refused.
 */
Test(access, a_client_sealing_its_segments_for_good_but_writable_locks_out_its_own_user_only)
{
	static const int waves[] = { 4, 1, 4, 4 }, want[] = { 4, 1, 3 + 10, 40 };
	int st, kept;

	need_users();
	start("--allow-all --max-clients-per-uid 4");
	for (int w = 0; w < 4; w++) {
		st = as_user("chimet1", attach_sealed_open, (void *)&waves[w]);
		cr_assert_eq(st, want[w], "wave %d of %d at once: %d (EPROTO + 10 x EUSERS), not %d", w, waves[w], st,
			     want[w]);
	}
	kept = client_segments_mapped(tb.pid);
	cr_assert_eq(kept, 16, "the broker keeps %d of chimet1's segments, not 16", kept);
	usleep(1000 * 1000);    /* the broker has tried to seal them, and kept them */
	cr_assert_eq(client_segments_mapped(tb.pid), 16, "the broker keeps %d, not 16", client_segments_mapped(tb.pid));
	cr_assert_eq(as_user("chimet1", open_status, NULL), 87, "its user was let in again");
	cr_assert_eq(as_user("chimet2", open_status, NULL), 0, "another user was refused");
	cr_assert_eq(open_status(NULL), 0, "root was refused");
}

/*
 * The same bound while the shards have not let go of the refused attaches
 * yet (they post the segments to the discard thread only then): counted
 * from the refusal. With the shard held, a wave of 8 refused attaches
 * waits on it; of the next 8 at once (--max-clients-per-uid 40: the
 * segments of 10 connections), 2 are refused EPROTO and 6 EUSERS. Before,
 * all 8 were let in, and the first case's 100 ms for the shards failed
 * once under load.
 */
Test(access, refused_attaches_the_shards_have_not_let_go_count_against_their_users_bound)
{
	static const int eight = 8;
	int tid, r, first, second;

	need_users();
	start("--allow-all --shards 1 --max-clients-per-uid 40");
	tid = t_thread_named(tb.pid, "chimed-shard0");
	cr_assert_gt(tid, 0);
	r = t_thread_hold(tid);
	if (r < 0)
		cr_skip("ptrace(PTRACE_SEIZE) of the shard thread: %s", strerror(-r));
	/* Nothing asserted while the shard is held: a failure would leave it so. */
	first = as_user("chimet1", attach_sealed_open, (void *)&eight);
	second = as_user("chimet1", attach_sealed_open, (void *)&eight);
	cr_assert_eq(t_thread_release(tid), 0);
	cr_assert_eq(first, 8, "the first 8 at once: %d (EPROTO + 10 x EUSERS), not 8", first);
	cr_assert_eq(second, 2 + 10 * 6, "the next 8, the first 8 not let go: %d (EPROTO + 10 x EUSERS), not 62",
		     second);
	cr_assert_eq(as_user("chimet2", open_status, NULL), 0, "another user was refused");
}
