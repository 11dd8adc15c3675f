/* SPDX-License-Identifier: MIT */
/*
 * A broker whose own calls fail: each call chimed makes to start and to
 * stop (opening and locking its files, the segments' memfds, sizes,
 * reservations and mappings, its sockets, descriptors, threads and helper
 * process, the sessions file's writes, syncs and renames) fails in turn,
 * its first time, then its second, and so on (tests/failcall_preload.c),
 * with the kernel's errno for want of a resource or for a failed disk.
 * Starting where an earlier broker left a named session's timers, every
 * such broker either runs and stops cleanly or exits 1 saying why
 * ("error:"), never crashes, and never loses the session: a broker started
 * after it, with nothing failing, holds every one of its timers.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "atomics.h"
#include "chime_shm.h"
#include "segment.h"
#include "helpers.h"

#define TIMERS 1000

static uint64_t expect;                 /* the timers the next broker must hold: TIMERS, and those armed since */

static char dir[64], sock[96], log_path[128], fired[128], trigger[128], mended[128];
static unsigned fail_times = 1;         /* calls failed in a row from the Nth (0: every one, until `mended` exists) */
static char serving[96];                /* "NAME #N failing (ERR)", for messages */

static void setup(void)
{
	cr_assert_eq(t_mkdtemp(dir, sizeof(dir), "chime-failstart"), 0);
	snprintf(sock, sizeof(sock), "%s/s", dir);
	snprintf(log_path, sizeof(log_path), "%s/log", dir);
	snprintf(fired, sizeof(fired), "%s/fired", dir);
	snprintf(trigger, sizeof(trigger), "%s/failing", dir);
	snprintf(mended, sizeof(mended), "%s/mended", dir);
}

static void teardown(void)
{
	t_rmdir_files(dir);
}

TestSuite(failstart, .init = setup, .fini = teardown, .timeout = 600);

/* The failing broker's log (its last 4 KiB). */
static const char *log_text(void)
{
	static char text[4096];
	FILE *f = fopen(log_path, "r");
	size_t n = 0;

	text[0] = '\0';
	if (f) {
		if (fseek(f, -(long)(sizeof(text) - 1), SEEK_END) < 0)
			rewind(f);
		n = fread(text, 1, sizeof(text) - 1, f);
		fclose(f);
	}
	text[n] = '\0';
	return text;
}

/* A broker's first life: session "keep" with TIMERS timers an hour ahead, stopped with them in its files. */
static void leave_a_session(void)
{
	struct chime_opts o = { .socket_path = sock, .session = "keep" };
	struct t_chimed b;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0);
	cr_assert_eq(chime_open(&c, &o), 0);
	for (int i = 0; i < TIMERS; i++) {
		chime_id_t id;

		cr_assert_eq(chime_arm(c, (uint64_t)i, chime_now() + 3600 * UINT64_C(1000000000), 0, 0, &id), 0);
	}
	chime_close(c);         /* detached, once the broker has applied them */
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
	cr_assert_eq(t_nodes(sock, T_NODES_TIMERS), TIMERS);
	expect = TIMERS;
}

/*
 * chimed with call `name`'s nth call failing with err: started, stopped
 * with SIGTERM if it came up (within 10 s). Its wait status; *did_fail
 * says whether the call was made that often.
 */
/*
 * chimed with call `name`'s nth call failing with err: started, stopped
 * with SIGTERM if it came up (within 10 s). With `serve`, the calls are
 * counted only once it listens, and serve() runs against it first (its
 * pid given; false: it found the broker gone). Its wait status; *did_fail
 * says whether the call was made that often.
 */
static int run_failing_while(const char *name, unsigned nth, int err, bool (*serve)(pid_t), bool *did_fail)
{
	const char *chimed = getenv("CHIMED"), *so = getenv("CHIME_FAILCALL_SO");
	char spec[96], cmd[1024], from[160] = "";
	uint64_t t0 = chime_now();
	int st = 0;
	pid_t p;

	unlink(fired);
	unlink(trigger);
	unlink(mended);
	snprintf(spec, sizeof(spec), "%s:%u:%d:%u", name, nth, err, fail_times);
	if (serve)
		snprintf(from, sizeof(from), "CHIME_FAILCALL_FROM='%s'", trigger);
	snprintf(cmd, sizeof(cmd), "exec env ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" "
		 "LD_PRELOAD='%s' CHIME_FAILCALL='%s' CHIME_FAILCALL_FIRED='%s' CHIME_FAILCALL_UNTIL='%s' %s '%s' "
		 "--foreground --socket '%s' --shards 2 2>'%s'", so, spec, fired, mended, from, chimed, sock, log_path);
	p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	for (;;) {
		if (waitpid(p, &st, WNOHANG) == p)
			break;
		if (t_sock_accepts(sock)) {
			usleep(20 * 1000);      /* a start-up step after listening (the restore) may fail too */
			if (serve) {
				/*
				 * Counted once start-up is over (it listens before its
				 * shards take the files over, and says "listening" after):
				 * the failing is the serving's, not the start's.
				 */
				for (int i = 0; i < 1000 && !t_file_has(log_path, "chimed: listening on"); i++) {
					if (waitpid(p, &st, WNOHANG) == p)
						goto done;
					usleep(10 * 1000);
				}
				cr_assert(t_file_has(log_path, "chimed: listening on"), "%s", log_text());
				cr_assert_eq(t_write_file(trigger, ""), 0);
				if (!serve(p)) {
					cr_assert_eq(waitpid(p, &st, 0), p);
					break;
				}
			}
			kill(p, SIGTERM);
			cr_assert_eq(waitpid(p, &st, 0), p);
			break;
		}
		if (chime_now() - t0 > 10 * UINT64_C(1000000000)) {
			kill(p, SIGKILL);
			waitpid(p, &st, 0);
			cr_assert_fail("%s #%u failing: chimed neither listened nor exited in 10 s", name, nth);
		}
		usleep(1000);
	}
done:
	*did_fail = access(fired, F_OK) == 0;
	return st;
}

/* A call to fail, and with what. */
struct failing {
	const char *name;
	int err;
};

static const struct failing calls[] = {
	{ "open", EMFILE },      { "flock", ENOLCK },    { "socket", EMFILE },      { "socketpair", EMFILE },
	{ "bind", EADDRINUSE },  { "listen", ENOBUFS },  { "memfd_create", EMFILE }, { "ftruncate", ENOSPC },
	{ "fallocate", ENOSPC }, { "mmap", ENOMEM },     { "madvise", ENOMEM },      { "eventfd", EMFILE },
	{ "timerfd_create", EMFILE }, { "signalfd", EMFILE }, { "pthread_create", EAGAIN }, { "posix_spawn", EAGAIN },
	{ "pwrite", ENOSPC },    { "unlink", EIO },
};

/*
 * At most this many of a call's times are failed, each its own broker (the
 * default suite's share; every one in the stress suite).
 */
static unsigned cap(unsigned dflt)
{
	const char *s = getenv("CHIME_STRESS");

	return s && *s == '1' ? 400 : dflt;
}

/*
 * After a broker with a call failing (its wait status st): it stopped
 * cleanly or exited 1 saying why, and the next broker, nothing failing,
 * holds the session's every timer. True if it exited 1.
 */
static bool judge(const char *name, unsigned n, int err, int st)
{
	struct t_chimed b;
	uint64_t held;

	cr_assert(!WIFSIGNALED(st), "%s #%u failing (%s): chimed killed by signal %d:\n%s", name, n, strerror(err),
		  WTERMSIG(st), log_text());
	cr_assert(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 1), "%s #%u failing: status %#x:\n%s",
		  name, n, st, log_text());
	if (WEXITSTATUS(st) == 1) {
		cr_assert(t_file_has(log_path, "chimed: error: "), "%s #%u failing: exit 1, no error said:\n%s", name, n,
			  log_text());
		if (getenv("FAILSTART_VERBOSE"))
			fprintf(stderr, "failstart: %s #%u: %s", name, n, strstr(log_text(), "chimed: error: "));
	}
	cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0, "%s #%u failing: the next broker did not "
		     "start", name, n);
	held = t_nodes_settle(sock, T_NODES_TIMERS, expect);
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
	cr_assert_eq(held, expect, "%s #%u failing (%s, exit %d): the next broker holds %llu of the sessions' %llu "
		     "timers", name, n, strerror(err), WIFEXITED(st) ? WEXITSTATUS(st) : -1, (unsigned long long)held,
		     (unsigned long long)expect);
	return WEXITSTATUS(st) == 1;
}

static bool have_preload(void)
{
	const char *so = getenv("CHIME_FAILCALL_SO");

	return so && *so && access(so, R_OK) == 0;
}

/*
 * Each of `list`'s calls in turn, each time it is made, a broker each
 * (serve: as run_failing_while() says), at most `most` times a call: every
 * one must be made at least once (a list of calls chimed makes).
 */
static void each_in_turn(const struct failing *list, size_t len, unsigned most, bool (*serve)(pid_t),
			 const char *what)
{
	unsigned runs = 0, exited = 0;

	if (!have_preload())
		cr_skip("$CHIME_FAILCALL_SO names no failcall_preload.so (meson test sets it)");
	leave_a_session();
	for (size_t k = 0; k < len; k++) {
		unsigned n;

		for (n = 1; n <= most; n++) {
			bool did_fail;
			int st;

			snprintf(serving, sizeof(serving), "%s #%u failing (%s)", list[k].name, n, strerror(list[k].err));
			st = run_failing_while(list[k].name, n, list[k].err, serve, &did_fail);
			runs++;
			exited += judge(list[k].name, n, list[k].err, st);
			if (!did_fail)
				break;          /* made fewer than n times: every one has failed */
		}
		if (getenv("FAILSTART_VERBOSE"))
			fprintf(stderr, "failstart: %s, %s failed %u times in turn\n", what, list[k].name, n - 1);
		/* accepts, for one, are io_uring's, not accept4()'s: a call listed must be one chimed makes */
		cr_assert_gt(n, 1, "%s: chimed never called %s", what, list[k].name);
	}
	fprintf(stderr, "failstart: %s: %u brokers, %u of them exited 1 saying why\n", what, runs, exited);
}

Test(failstart, no_call_failing_at_start_or_stop_crashes_the_broker_or_loses_a_session)
{
	each_in_turn(calls, sizeof(calls) / sizeof(calls[0]), cap(24), NULL, "start and stop");
}

/* ---- while serving ---- */

#define SERVE_TIMERS 40

/*
 * A client's life against a broker one of whose calls may fail: open, arm
 * SERVE_TIMERS timers 5 to 44 ms ahead, take their events, close. A call
 * may fail, with a negative errno; if none did, every event came, once.
 * False if a call failed.
 */
static bool client_life(const char *what)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_event ev[64];
	bool got[SERVE_TIMERS] = { false };
	chime_id_t ids[SERVE_TIMERS];
	uint64_t end = chime_now() + 5 * UINT64_C(1000000000);
	chime_t *c;
	int r, n = 0;

	r = chime_open(&c, &o);
	if (r < 0) {
		if (getenv("FAILSTART_VERBOSE"))
			fprintf(stderr, "failstart: %s: chime_open: %s\n", what, strerror(-r));
		return false;
	}
	for (int i = 0; i < SERVE_TIMERS; i++) {
		r = chime_arm(c, (uint64_t)i, chime_now() + (uint64_t)(5 + i) * 1000000, 0, (uint64_t)i, &ids[i]);
		if (r < 0) {
			chime_close(c);
			return false;
		}
	}
	while (n < SERVE_TIMERS && chime_now() < end) {
		int k = chime_wait(c, ev, 64, 500);

		if (k < 0 && k != -EINTR) {
			chime_close(c);
			return false;
		}
		for (int j = 0; j < k; j++) {
			cr_assert(ev[j].user_data < SERVE_TIMERS && ev[j].id == ids[ev[j].user_data], "%s: a stray event",
				  what);
			cr_assert(!got[ev[j].user_data], "%s: timer %llu fired twice", what,
				  (unsigned long long)ev[j].user_data);
			got[ev[j].user_data] = true;
			n++;
		}
	}
	chime_close(c);
	cr_assert_eq(n, SERVE_TIMERS, "%s: every call succeeded, %d of %d events came in 5 s", what, n, SERVE_TIMERS);
	return true;
}

/*
 * A named session's life: open "more", arm 5 timers an hour ahead, close
 * (detached: its record written, and the timers kept for the next broker,
 * which must hold every one whose arm returned 0). False if a call failed.
 */
static bool session_life(const char *what)
{
	struct chime_opts o = { .socket_path = sock, .session = "more" };
	chime_t *c;
	bool ok = true;
	int r = chime_open(&c, &o);

	if (r < 0) {
		if (getenv("FAILSTART_VERBOSE"))
			fprintf(stderr, "failstart: %s: chime_open of a session: %s\n", what, strerror(-r));
		return false;
	}
	for (int i = 0; i < 5; i++) {
		chime_id_t id;

		r = chime_arm(c, 1, chime_now() + 3600 * UINT64_C(1000000000), 0, 0, &id);
		if (r == 0)
			expect++;
		ok &= r == 0;
	}
	chime_close(c);
	return ok;
}

/* Has child pid exited (not reaped)? Looked at for grace_ms, for one on its way out. */
static bool exited(pid_t pid, int grace_ms)
{
	for (int i = 0; i <= grace_ms; i++) {
		siginfo_t si = { 0 };

		if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
			return true;
		if (kill(pid, 0) < 0)
			return true;
		if (i < grace_ms)
			usleep(1000);
	}
	return false;
}

/* Process pid's descriptors, "N -> target" a line, for a failure's message. */
static const char *fds_of(pid_t pid)
{
	static char text[4096];
	char cmd[128];
	FILE *p;
	size_t n = 0;

	snprintf(cmd, sizeof(cmd), "ls -l /proc/%d/fd | awk 'NR > 1 { print $9, $10, $11 }'", (int)pid);
	text[0] = '\0';
	p = popen(cmd, "r");
	if (p) {
		n = fread(text, 1, sizeof(text) - 1, p);
		pclose(p);
	}
	text[n] = '\0';
	return text;
}

/*
 * Clients' lives, the failing call counted from the first: whichever meets
 * the failure may fail; the one after it must not (a broker that failed
 * once serves the next client), nor may the broker keep any descriptor of
 * theirs. Up to eight before it; false if the broker exited meanwhile
 * (then judge() wants it said why).
 */
static bool serve_clients(pid_t pid)
{
	int base = t_open_fds_settled(pid), now = -1;
	char what[160], before[4096];

	snprintf(before, sizeof(before), "%s", fds_of(pid));

	for (int i = 1; i <= 8 && access(fired, F_OK) != 0; i++) {
		snprintf(what, sizeof(what), "%s, client %d", serving, i);
		(void)client_life(what);
		(void)session_life(what);
		if (exited(pid, 0))
			return false;   /* judge() reaps it */
	}
	if (access(fired, F_OK) != 0)
		return true;    /* fewer calls in eight lives: the run that counts them ends here */
	snprintf(what, sizeof(what), "%s, the client after it", serving);
	if (!client_life(what) || !session_life(what)) {
		/* A broker that exited (a start-up step after listening failed) is judge()'s. */
		if (exited(pid, 500))
			return false;
		cr_assert_fail("%s: a call failed, the broker running:\n%s", what, log_text());
	}
	/*
	 * Its descriptors for them all given back (the discard helper's turn
	 * included); fewer than at the start is no leak (one of the start-up's
	 * own may still have been open then).
	 */
	for (int i = 0; i < 1000 && (now = t_open_fds(pid)) > base; i++)
		usleep(10 * 1000);
	if (now > base) {
		const char *after = fds_of(pid);

		cr_assert_fail("%s: the broker has %d descriptors more after its clients (%d when listed):\nbefore\n%s\n"
			       "after\n%s", serving, now - base, t_open_fds(pid) - base, before, after);
	}
	return true;
}

static const struct failing serve_calls[] = {
	{ "recvmsg", ENOBUFS },  { "recv", EINTR },      { "send", ENOBUFS },        { "sendmsg", ENOBUFS },
	{ "getsockopt", ENOBUFS }, { "memfd_create", EMFILE }, { "ftruncate", ENOSPC }, { "fallocate", ENOSPC },
	{ "mmap", ENOMEM },      { "madvise", ENOMEM },  { "fcntl", EMFILE },        { "fchmod", EIO },
	{ "open", EMFILE },      { "eventfd", EMFILE },  { "pwrite", EIO },          { "munmap", ENOMEM },
};

/*
 * Each call a running broker makes to serve clients (accepting,
 * handshakes, the segments it makes, maps, seals and sends, the threads it
 * starts on demand), failed in turn: the client that meets it gets an
 * error or carries on, the next is served whole, the broker keeps no
 * descriptor of theirs and runs on (or exits 1 saying why), and the
 * session it holds survives.
 */
Test(failstart, no_call_failing_while_serving_clients_wedges_the_broker_or_loses_a_session)
{
	each_in_turn(serve_calls, sizeof(serve_calls) / sizeof(serve_calls[0]), cap(3), serve_clients, "serving");
}

/* ---- a sessions-file record that could not be written ---- */

/* A broker whose first write of the sessions file once serving fails (EIO), serve() run against it: its status. */
static int first_record_write_failing(bool (*serve)(pid_t))
{
	bool did_fail;
	int st;

	if (!have_preload())
		cr_skip("$CHIME_FAILCALL_SO names no failcall_preload.so (meson test sets it)");
	leave_a_session();
	st = run_failing_while("pwrite", 1, EIO, serve, &did_fail);
	cr_assert(did_fail, "no write of the sessions file failed:\n%s", log_text());
	return st;
}

/*
 * serve(): session "gone", detached with timers, then dropped while the
 * first write of the sessions file fails (EIO): the clear of its record.
 */
static bool drop_while_failing(pid_t pid)
{
	struct chime_opts o = { .socket_path = sock, .session = "gone" };
	chime_t *c;
	chime_id_t id;

	(void)pid;
	unlink(trigger);        /* the session's own writes succeed */
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 3600 * UINT64_C(1000000000), 0, 0, &id), 0);
	chime_close(c);
	/* Parked after the close returns: its record written, before the failing starts. */
	for (int i = 0; i < 500 && !t_file_has(log_path, "session 'gone' (uid 0) detached"); i++)
		usleep(10 * 1000);
	cr_assert(t_file_has(log_path, "session 'gone' (uid 0) detached"), "%s", log_text());
	cr_assert_eq(t_write_file(trigger, ""), 0);
	cr_assert_eq(chime_drop_session(&o), 0);
	cr_assert(access(fired, F_OK) == 0, "the drop wrote nothing to the sessions file");
	/* Written again by the heartbeat (450 ms at rest), not only by the stop's last try. */
	for (int i = 0; i < 200 && !t_file_has(log_path, "session 'gone' removed after all"); i++)
		usleep(10 * 1000);
	cr_assert(t_file_has(log_path, "session 'gone' removed after all"), "not written again within 2 s, "
		  "the broker running:\n%s", log_text());
	return true;
}

/*
 * A record the broker could not write (a disk's EIO) is written again at
 * the next heartbeat, not only said: a session dropped while the clear of
 * its record failed came back with the next broker (taken over again, its
 * name held); one whose record could not be written was lost to it.
 */
Test(failstart, a_record_the_broker_could_not_write_is_written_at_the_next_heartbeat)
{
	struct chime_opts o = { .socket_path = sock, .session = "gone" };
	struct t_chimed b;
	int st = first_record_write_failing(drop_while_failing);

	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x:\n%s", st, log_text());
	cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0);
	cr_assert_eq(chime_drop_session(&o), -ESRCH, "the session dropped came back with the next broker");
	cr_assert_eq(t_nodes_settle(sock, T_NODES_TIMERS, TIMERS), TIMERS);
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
	cr_assert(t_file_has(log_path, "cannot remove session 'gone'") &&
		  t_file_has(log_path, "session 'gone' removed after all"), "%s", log_text());
}

/*
 * serve(): session "slow" opened by hand, its record's first write failing
 * (EIO), its welcome answered only after several heartbeats; then the
 * broker is killed (SIGKILL: no stop's last try). The file holds it.
 */
static bool create_slowly_while_failing(pid_t pid)
{
	int fd, r;

	fd = t_raw_hello(sock, "slow", 0, 0);
	cr_assert_geq(fd, 0);
	for (int i = 0; i < 200 && !t_file_has(log_path, "cannot record session 'slow'"); i++)
		usleep(10 * 1000);
	cr_assert(t_file_has(log_path, "cannot record session 'slow'"), "%s", log_text());
	usleep(600 * 1000);     /* heartbeats during its handshake (450 ms apart at rest) */
	r = t_answer_offer(fd);
	cr_assert_eq(r, 0, "the attach: %d\n%s", r, log_text());
	cr_assert(t_file_has(log_path, "session 'slow' recorded after all"), "%s", log_text());
	kill(pid, SIGKILL);
	close(fd);
	return false;           /* judge() reaps it */
}

/*
 * The heartbeat writes again what the slot should hold now: a session
 * being created has its record from its open on. Found by a review: the
 * retry asked the stop's question (is it kept?), whose answer for a
 * session still attaching for the first time is no, and cleared the
 * record; a crash before its first detach then lost the session.
 */
Test(failstart, a_session_created_while_its_record_fails_is_recorded_by_the_heartbeat)
{
	struct chime_opts o = { .socket_path = sock, .session = "slow" };
	struct t_chimed b;
	int st = first_record_write_failing(create_slowly_while_failing);

	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status %#x", st);
	cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0);
	cr_assert_eq(chime_drop_session(&o), 0, "session 'slow' was lost with the crash");
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
}

/* The control segment's session_records_unwritten, once it is `want` (up to 3 s: a look a second). */
static uint32_t unwritten_settles(uint32_t want)
{
	char path[128];
	uint32_t n = UINT32_MAX;

	snprintf(path, sizeof(path), "%s.ctl", sock);
	for (int i = 0; i < 300 && n != want; i++) {
		struct chime_map m = { 0 };

		if (chime_seg_open(path, CHIME_SEG_CONTROL, &m) == 0) {
			n = at_load(&((const struct chime_ctl *)m.base)->session_records_unwritten);
			chime_seg_unmap(&m);
		}
		if (n != want)
			usleep(10 * 1000);
	}
	return n;
}

/*
 * serve(): session "stuck" opened while every write of the sessions file
 * fails (EIO, a failing disk), then the fault mended: the record the
 * heartbeat keeps trying shows in the control segment (chimestat's
 * broker.session_records_unwritten, its warning line) while it lasts, and
 * not once written.
 */
static bool unwritten_while_failing(pid_t pid)
{
	struct chime_opts o = { .socket_path = sock, .session = "stuck" };
	chime_t *c;
	chime_id_t id;

	(void)pid;
	cr_assert_eq(unwritten_settles(0), 0);
	cr_assert_eq(chime_open(&c, &o), 0);
	cr_assert_eq(chime_arm(c, 1, chime_now() + 3600 * UINT64_C(1000000000), 0, 0, &id), 0);
	for (int i = 0; i < 300 && !t_file_has(log_path, "cannot record session 'stuck'"); i++)
		usleep(10 * 1000);
	cr_assert(t_file_has(log_path, "cannot record session 'stuck'"), "%s", log_text());
	cr_assert_eq(unwritten_settles(1), 1, "a record the heartbeat cannot write is not counted\n%s", log_text());
	usleep(1500 * 1000);    /* more heartbeats, every write failing: still one record, said once */
	cr_assert_eq(unwritten_settles(1), 1);
	cr_assert_eq(t_write_file(mended, ""), 0);
	for (int i = 0; i < 300 && !t_file_has(log_path, "session 'stuck' recorded after all"); i++)
		usleep(10 * 1000);
	cr_assert(t_file_has(log_path, "session 'stuck' recorded after all"), "%s", log_text());
	cr_assert_eq(unwritten_settles(0), 0, "a record written is still counted unwritten");
	chime_close(c);
	return true;
}

Test(failstart, a_record_the_heartbeat_cannot_write_is_counted_until_written)
{
	bool did_fail;
	int st;

	if (!have_preload())
		cr_skip("$CHIME_FAILCALL_SO names no failcall_preload.so (meson test sets it)");
	fail_times = 0;
	st = run_failing_while("pwrite", 1, EIO, unwritten_while_failing, &did_fail);
	cr_assert(did_fail, "no write of the sessions file failed:\n%s", log_text());
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x:\n%s", st, log_text());
}

/*
 * A broker killed while it copies a damaged sessions file (at the second
 * write of the copy) must leave no part of the copy at
 * PATH.sessions.damaged: one there is never replaced, so the next start
 * said "one is there already", rewrote the file without the damaged
 * record, and what was dropped was left only in a cut copy that said
 * nothing of being one (a review). Named once whole, as relink_whole()
 * names the shard files: the next start keeps the file as it found it.
 */
Test(failstart, a_broker_killed_while_copying_the_damaged_sessions_file_leaves_no_part_of_it)
{
	const char *chimed = getenv("CHIMED"), *so = getenv("CHIME_FAILCALL_SO");
	static uint8_t before[65536], after[65536];
	char sess[160], copy[192], cmd[1024];
	struct t_chimed b;
	ssize_t nb, na;
	uint8_t bit;
	int fd, st;

	if (!have_preload())
		cr_skip("$CHIME_FAILCALL_SO names no failcall_preload.so (meson test sets it)");
	leave_a_session();
	snprintf(sess, sizeof(sess), "%s.sessions", sock);
	snprintf(copy, sizeof(copy), "%s.damaged", sess);
	fd = open(sess, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s: %s", sess, strerror(errno));
	cr_assert_eq(pread(fd, &bit, 1, 128 + 40), 1);         /* slot 0's record, in its name */
	bit ^= 0x10;
	cr_assert_eq(pwrite(fd, &bit, 1, 128 + 40), 1);
	nb = pread(fd, before, sizeof(before), 0);
	close(fd);
	cr_assert_gt(nb, 16384, "the sessions file is %zd bytes: the copy takes one write", nb);
	snprintf(cmd, sizeof(cmd), "exec env ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" "
		 "LD_PRELOAD='%s' CHIME_FAILCALL=write:2:5 CHIME_FAILCALL_KILL=1 CHIME_FAILCALL_DIR='%s' "
		 "CHIME_FAILCALL_FIRED='%s' '%s' --foreground --socket '%s' --shards 2 2>/dev/null", so, dir, fired,
		 chimed, sock);
	unlink(fired);
	st = system(cmd);
	/* its log is not in the directory: the writes counted are the copy's */
	cr_assert(access(fired, F_OK) == 0, "the copy was not written twice (exit status %#x)", st);
	cr_assert_eq(t_chimed_start(&b, sock, "--shards 2 2>/dev/null"), 0);
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
	fd = open(copy, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "%s: %s", copy, strerror(errno));
	na = pread(fd, after, sizeof(after), 0);
	close(fd);
	cr_expect(na == nb && memcmp(before, after, (size_t)nb) == 0, "the copy is %zd bytes, not the %zd of the file "
		  "as found", na, nb);
}
