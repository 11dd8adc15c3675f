/* SPDX-License-Identifier: MIT */
/*
 * test_client.c - libchime without a broker: argument checking, socket path
 * resolution, and chime_open()'s handshake against a fake broker that
 * answers with crafted (refusing or malformed) welcomes. Every failed open
 * must leave no fd behind.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chime.h"
#include "chime_shm.h"
#include "helpers.h"

static char dir[PATH_MAX - 64];
static char sock_path[PATH_MAX];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/chime-tc-%d-XXXXXX", (int)getpid());
	cr_assert_not_null(mkdtemp(dir));
	snprintf(sock_path, sizeof(sock_path), "%s/chime.sock", dir);
	unsetenv("CHIME_SOCKET");
}

static void teardown(void)
{
	unlink(sock_path);
	rmdir(dir);
}

static int count_fds(void)
{
	int n = t_count_files("/proc/self/fd");

	cr_assert_geq(n, 1);
	return n - 1;   /* the DIR's own fd */
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 20);

/* ---- arguments ---- */

Test(client, open_rejects_null_out_and_flags)
{
	/* every bit but CHIME_OPEN_RECORD_RESETS is unknown */
	struct chime_opts o = { .socket_path = sock_path, .flags = CHIME_OPEN_RECORD_RESETS << 1 };
	chime_t *c = NULL;

	cr_assert_eq(chime_open(NULL, NULL), -EINVAL);
	cr_assert_eq(chime_open(&c, &o), -EINVAL);
	o.flags = ~0u;
	cr_assert_eq(chime_open(&c, &o), -EINVAL);
	cr_assert_null(c);
}

Test(client, open_rejects_too_long_path)
{
	char longp[200];
	struct chime_opts o = { .socket_path = longp };
	chime_t *c = NULL;

	memset(longp, 'x', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = 0;
	cr_assert_eq(chime_open(&c, &o), -EINVAL);
	o.socket_path = "";
	cr_assert_eq(chime_open(&c, &o), -EINVAL);
	cr_assert_null(c);
}

Test(client, calls_on_null_handle_are_einval)
{
	struct chime_event ev[1];
	chime_id_t id = 0;

	cr_assert_eq(chime_arm(NULL, 0, 0, 0, 0, &id), -EINVAL);
	cr_assert_eq(chime_reset(NULL, 1, 0), -EINVAL);
	cr_assert_eq(chime_cancel(NULL, 1), -EINVAL);
	cr_assert_eq(chime_cancel_key(NULL, 1), -EINVAL);
	cr_assert_eq(chime_fd(NULL), -EINVAL);
	cr_assert_eq(chime_poll(NULL, ev, 1), -EINVAL);
	cr_assert_eq(chime_wait(NULL, ev, 1, 0), -EINVAL);
	cr_assert_eq(chime_dispatch(NULL, NULL, NULL, 0), -EINVAL);
	cr_assert_eq(id, 0);
	chime_close(NULL);      /* NULL-safe */
}

Test(client, now_is_monotonic_and_version_is_set)
{
	uint64_t a = chime_now(), b = chime_now();

	cr_assert_geq(b, a);
	cr_assert_gt(a, 0);
	cr_assert_str_eq(chime_version(), "0.1.0");
}

/* ---- no broker ---- */

Test(client, open_without_broker_is_enoent)
{
	struct chime_opts o = { .socket_path = sock_path };
	chime_t *c = NULL;
	int fds = count_fds();

	cr_assert_eq(chime_open(&c, &o), -ENOENT);
	cr_assert_null(c);
	cr_assert_eq(count_fds(), fds, "an fd leaked");
}

Test(client, open_stale_socket_is_enoent)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct chime_opts o = { .socket_path = sock_path };
	chime_t *c = NULL;
	int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);

	strcpy(sa.sun_path, sock_path);
	cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(s);       /* bound, never listened: what a dead broker leaves */
	cr_assert_eq(chime_open(&c, &o), -ENOENT);
}

/* ---- a fake broker ---- */

enum fake {
	FAKE_HANGUP,            /* read the hello, close */
	FAKE_REFUSE_EACCES,
	FAKE_REFUSE_EUSERS,
	FAKE_LAYOUT,            /* welcome from another layout */
	FAKE_SHORT,             /* a truncated welcome */
	FAKE_BAD_MAGIC,
	FAKE_FEW_FDS,           /* status 0 but fewer fds than announced */
	FAKE_BAD_SEGMENTS,      /* the right fds, but segments of the wrong size */
	FAKE_REFUSE_MAPPED,     /* a good welcome; its answer checked, then a refusal (-ENOMEM) */
	FAKE_LATE_NO_READY,     /* a good welcome 6 s after the hello, its answer read, no ready ever */
	FAKE_RW_UNSIZED,        /* a good welcome but for rw_size 0, with a 1 MiB rw memfd */
	FAKE_RW_SEALED,         /* rw sealed against writes already: mmap's EPERM */
	FAKE_RW_DIR,            /* rw a directory */
	FAKE_WELCOME_HANGUP,    /* a good welcome, then close: the client's answer meets a closed socket */
	FAKE_SLOW_HANGUP,       /* read the hello, close 300 ms later */
};

static void fake_reply(int s, enum fake how)
{
	struct chime_welcome w = {
		.magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .nr_shards = 1,
		.nr_fds = CHIME_WELCOME_FIXED_FDS + 1, .rw_size = 4096, .ro_size = 4096, .pub_size = 4096,
	};
	int fds[5], nfds = 0;
	union {
		char buf[CMSG_SPACE(sizeof(fds))];
		struct cmsghdr a;
	} u;
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	switch (how) {
	case FAKE_HANGUP:
		return;
	case FAKE_SLOW_HANGUP:
		usleep(300 * 1000);
		return;
	case FAKE_REFUSE_EACCES:
		w.status = -EACCES;
		w.nr_fds = 0;
		break;
	case FAKE_REFUSE_EUSERS:
		w.status = -EUSERS;
		w.nr_fds = 0;
		break;
	case FAKE_LAYOUT:
		w.layout = CHIME_SHM_LAYOUT + 1;
		w.nr_fds = 0;
		break;
	case FAKE_SHORT:
		iov.iov_len = 10;
		break;
	case FAKE_BAD_MAGIC:
		w.magic = 0;
		break;
	case FAKE_FEW_FDS:
		fds[nfds++] = eventfd(0, 0);
		break;
	case FAKE_BAD_SEGMENTS:
		for (int i = 0; i < 3; i++) {
			fds[nfds] = memfd_create("fake", 0);
			(void)!ftruncate(fds[nfds++], 8192);     /* announced 4096 */
		}
		for (int i = 0; i < 2; i++)
			fds[nfds++] = eventfd(0, 0);
		break;
	case FAKE_RW_UNSIZED:
		w.rw_size = 0;
		for (int i = 0; i < 3; i++) {
			fds[nfds] = memfd_create("fake", MFD_ALLOW_SEALING);
			(void)!ftruncate(fds[nfds++], i == 1 ? 1 << 20 : 4096);
		}
		fds[nfds++] = eventfd(0, 0);
		break;
	case FAKE_RW_SEALED:
	case FAKE_RW_DIR:
		for (int i = 0; i < 3; i++) {
			fds[nfds] = memfd_create("fake", MFD_ALLOW_SEALING);
			(void)!ftruncate(fds[nfds++], 4096);
		}
		if (how == FAKE_RW_SEALED) {
			(void)!fcntl(fds[1], F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
		} else {
			close(fds[1]);
			fds[1] = open("/", O_RDONLY | O_DIRECTORY);
		}
		fds[nfds++] = eventfd(0, 0);
		break;
	case FAKE_LATE_NO_READY:
		sleep(6);
		/* fall through */
	case FAKE_REFUSE_MAPPED:
	case FAKE_WELCOME_HANGUP:
		for (int i = 0; i < 3; i++) {
			fds[nfds] = memfd_create("fake", MFD_ALLOW_SEALING);
			(void)!ftruncate(fds[nfds++], 4096);
		}
		fds[nfds++] = eventfd(0, 0);
		break;
	}
	if (nfds) {
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	(void)!sendmsg(s, &msg, MSG_NOSIGNAL);
	if (how == FAKE_LATE_NO_READY) {
		struct chime_mapped m;

		(void)!recv(s, &m, sizeof(m), 0);
		sleep(30);      /* killed by the test */
		return;
	}
	if (how == FAKE_REFUSE_MAPPED) {
		/* The client's answer, and what it says it did: rw sealed against writes, faulted in. */
		struct chime_mapped m = { 0 };
		struct stat st;
		ssize_t got = recv(s, &m, sizeof(m), 0);
		int seals = fcntl(fds[1], F_GET_SEALS);

		if (got != (ssize_t)sizeof(m) || m.magic != CHIME_MAPPED_MAGIC ||
		    seals < 0 || !(seals & F_SEAL_FUTURE_WRITE) || fstat(fds[1], &st) < 0 || st.st_blocks * 512 < 4096)
			_exit(2);
		w = (struct chime_welcome){ .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .status = -ENOMEM };
		(void)!send(s, &w, sizeof(w), MSG_NOSIGNAL);
	}
}

/* A fake broker at sock_path, in a child, for one connection: its pid. It exits 1 on a bad hello. */
static pid_t fake_start(enum fake how)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	pid_t pid;

	strcpy(sa.sun_path, sock_path);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct chime_hello h;
		int s = accept(l, NULL, NULL);

		if (s < 0 || recv(s, &h, sizeof(h), 0) != sizeof(h) || h.magic != CHIME_HELLO_MAGIC ||
		    h.layout != CHIME_SHM_LAYOUT)
			_exit(1);
		fake_reply(s, how);
		close(s);
		_exit(0);
	}
	close(l);
	return pid;
}

/* Run a fake broker for one connection; return chime_open()'s result. */
static int open_against_fake(enum fake how)
{
	struct chime_opts o = { .socket_path = sock_path };
	chime_t *c = NULL;
	int r, st, fds;
	pid_t pid = fake_start(how);

	fds = count_fds();
	r = chime_open(&c, &o);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the fake broker saw a bad hello (1) or answer (2): %d",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	cr_assert_null(c);
	cr_assert_eq(count_fds(), fds, "an fd leaked on the error path");
	return r;
}

Test(client, hangup_during_handshake_is_econnreset)
{
	cr_assert_eq(open_against_fake(FAKE_HANGUP), -ECONNRESET);
}

Test(client, policy_refusal_is_eacces)
{
	cr_assert_eq(open_against_fake(FAKE_REFUSE_EACCES), -EACCES);
}

Test(client, full_client_table_is_eusers)
{
	cr_assert_eq(open_against_fake(FAKE_REFUSE_EUSERS), -EUSERS);
}

Test(client, other_layout_is_eproto)
{
	cr_assert_eq(open_against_fake(FAKE_LAYOUT), -EPROTO);
}

Test(client, malformed_welcomes_are_ebadmsg)
{
	cr_assert_eq(open_against_fake(FAKE_SHORT), -EBADMSG);
	unlink(sock_path);
	cr_assert_eq(open_against_fake(FAKE_BAD_MAGIC), -EBADMSG);
	unlink(sock_path);
	cr_assert_eq(open_against_fake(FAKE_FEW_FDS), -EBADMSG);
	unlink(sock_path);
	cr_assert_eq(open_against_fake(FAKE_BAD_SEGMENTS), -EBADMSG);
	unlink(sock_path);
	/* an rw size of 0 would have the library fault in whatever the memfd holds: refused before */
	cr_assert_eq(open_against_fake(FAKE_RW_UNSIZED), -EBADMSG);
	/* not -EPERM (an untrusted broker) nor -EISDIR, which chime_open(3) does not list */
	unlink(sock_path);
	cr_assert_eq(open_against_fake(FAKE_RW_SEALED), -EBADMSG);
	unlink(sock_path);
	cr_assert_eq(open_against_fake(FAKE_RW_DIR), -EBADMSG);
}

/*
 * The attach's last step refused (chime_shm.h, struct chime_mapped): the
 * broker's status, after the library mapped, faulted in and sealed its rw
 * segment and said so; nothing of it stays (the fds counted, the fake's
 * checks of the seal in its exit status).
 */
Test(client, a_refusal_after_the_mapped_answer_is_the_brokers_status)
{
	cr_assert_eq(open_against_fake(FAKE_REFUSE_MAPPED), -ENOMEM);
}

Test(client, no_sigpipe_when_broker_vanishes)
{
	int r;

	/*
	 * A send to a broker gone must not kill us: the fake closes right after
	 * its welcome, so the answer we send once mapped meets a closed socket
	 * (EPIPE). Closing after the hello alone, as this test once did, left
	 * no send to meet it (an audit: it passed without MSG_NOSIGNAL).
	 */
	signal(SIGPIPE, SIG_DFL);
	cr_assert_eq(open_against_fake(FAKE_HANGUP), -ECONNRESET);
	unlink(sock_path);
	r = open_against_fake(FAKE_WELCOME_HANGUP);
	cr_assert(r == -ECONNRESET || r == -EPIPE, "%d (%s)", r, strerror(-r));
}

/*
 * A broker that took the connection and never answers (stopped, wedged):
 * the handshake gives up after 10 s, -ETIMEDOUT, also in a process that
 * gets a signal every 50 ms (an interval timer, a profiler). With a
 * socket timeout set, each signal ends the blocking receive with EINTR,
 * even under SA_RESTART, and the receive was made again with the whole
 * timeout: chime_open() and chime_drop_session() never returned.
 */
static void on_tick(int sig)
{
	(void)sig;
}

/* In a child that gets SIGALRM every 50 ms: the call's errno, as its exit status. */
static pid_t call_under_ticks(bool drop)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct sigaction sa = { .sa_handler = on_tick, .sa_flags = SA_RESTART };
		struct itimerval it = { .it_interval = { .tv_usec = 50000 }, .it_value = { .tv_usec = 50000 } };
		struct chime_opts o = { .socket_path = sock_path, .session = drop ? "ticked" : NULL };
		chime_t *c;
		int r;

		if (sigaction(SIGALRM, &sa, NULL) < 0 || setitimer(ITIMER_REAL, &it, NULL) < 0)
			_exit(250);
		r = drop ? chime_drop_session(&o) : chime_open(&c, &o);
		_exit(r < 0 ? -r : 0);
	}
	return pid;
}

Test(client, a_handshake_never_answered_times_out_under_a_stream_of_signals, .timeout = 40)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	uint64_t t0 = chime_now(), took[2] = { 0, 0 };
	pid_t pid[2];
	int st[2];

	/* Listening, never accepting: the connection is taken, the hello never answered. */
	strcpy(sa.sun_path, sock_path);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	pid[0] = call_under_ticks(false);
	pid[1] = call_under_ticks(true);
	while ((!took[0] || !took[1]) && chime_now() - t0 < 25 * UINT64_C(1000000000)) {
		for (int i = 0; i < 2; i++)
			if (!took[i] && waitpid(pid[i], &st[i], WNOHANG) == pid[i])
				took[i] = chime_now() - t0;
		usleep(10000);
	}
	for (int i = 0; i < 2; i++) {
		if (!took[i]) {
			kill(pid[i], SIGKILL);
			(void)waitpid(pid[i], &st[i], 0);
		}
	}
	close(l);
	cr_assert(took[0], "chime_open() still waiting after 25 s");
	cr_assert(took[1], "chime_drop_session() still waiting after 25 s");
	for (int i = 0; i < 2; i++) {
		cr_assert(WIFEXITED(st[i]) && WEXITSTATUS(st[i]) == ETIMEDOUT, "%s: status %#x",
			  i ? "chime_drop_session" : "chime_open", st[i]);
		/* 10 s, give or take a loaded host */
		cr_assert(took[i] >= 9 * UINT64_C(1000000000) && took[i] < 20 * UINT64_C(1000000000),
			  "%s gave up after %.1f s", i ? "chime_drop_session" : "chime_open", (double)took[i] / 1e9);
	}
}

/*
 * chime_open(3): the connect, the hello and the broker's answers take 10 s
 * at most, all together. The ready was awaited with the socket timeout
 * the connect set, 10 s, which each receive takes anew (and
 * cl_await_ready() counted its own 10 s from its start): a welcome that
 * came at 6 s, then no ready, kept the open 16.1 s. Now the ready gets
 * what is left of the 10 s.
 */
Test(client, a_handshake_whose_ready_never_comes_ends_within_its_10_s, .timeout = 40)
{
	struct chime_opts o = { .socket_path = sock_path };
	chime_t *c = NULL;
	uint64_t t0, took;
	int r, st;
	pid_t pid = fake_start(FAKE_LATE_NO_READY);

	t0 = chime_now();
	r = chime_open(&c, &o);
	took = chime_now() - t0;
	kill(pid, SIGKILL);
	(void)waitpid(pid, &st, 0);
	cr_assert_eq(r, -ETIMEDOUT, "chime_open: %d", r);
	cr_assert_lt(took, 11 * UINT64_C(1000000000), "chime_open gave up after %.1f s, not 10", (double)took / 1e9);
}

/* A thread that opens against the fake, then meets a cancellation point. */
static void *open_then_testcancel(void *arg)
{
	struct chime_opts o = { .socket_path = sock_path };
	chime_t *c = NULL;

	*(int *)arg = chime_open(&c, &o);
	pthread_testcancel();
	return NULL;
}

/* Another thread's stack where the cancelled one's was, written over. */
static void *scribble_stack(void *arg)
{
	volatile char buf[64 * 1024];

	(void)arg;
	memset((char *)buf, 0xff, sizeof(buf));
	usleep(100 * 1000);
	return (void *)(intptr_t)buf[100];
}

/*
 * A thread cancelled (pthread_cancel(3)) while chime_open() waits for the
 * broker's answer: the open finishes first, then the cancel acts. A
 * cancel at the handshake's recvmsg() left the open's record, on the dead
 * thread's stack, in the process's list of opens: the next open and every
 * fork's child handler wrote into whatever reused that stack (an API
 * audit: each fork's child died of SIGSEGV), and its socket stayed open.
 */
Test(client, a_thread_cancelled_in_chime_open_leaves_nothing_behind)
{
	int fds = count_fds(), r = 1, st;
	pthread_t t;
	void *ret;
	pid_t fake, child;

#if defined(__SANITIZE_ADDRESS__)
	/* A cancelled thread's exit unwinds past ASan's stack poisoning, which it then reports as ours. */
	cr_skip("the release build runs it: ASan misreports a cancelled thread's exit (sigaltstack)");
#endif
	fake = fake_start(FAKE_SLOW_HANGUP);
	cr_assert_eq(pthread_create(&t, NULL, open_then_testcancel, &r), 0);
	usleep(100 * 1000);     /* in the handshake: the fake answers nothing for 300 ms */
	cr_assert_eq(pthread_cancel(t), 0);
	cr_assert_eq(pthread_join(t, &ret), 0);
	cr_assert_eq(ret, PTHREAD_CANCELED);
	cr_assert_eq(r, -ECONNRESET, "the open was cut short: %d", r);
	cr_assert_eq(waitpid(fake, &st, 0), fake);
	cr_assert_eq(count_fds(), fds, "the cancelled open's socket is still open");
	cr_assert_eq(pthread_create(&t, NULL, scribble_stack, NULL), 0);
	usleep(50 * 1000);
	child = fork();
	cr_assert_geq(child, 0);
	if (child == 0)
		_exit(0);       /* the library's fork handler ran before this */
	cr_assert_eq(waitpid(child, &st, 0), child);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a fork's child died (status %#x)", st);
	cr_assert_eq(pthread_join(t, NULL), 0);
}

/*
 * $CHIME_SOCKET when opts names none, opts->socket_path over it: told
 * apart by a fake broker that refuses (-EACCES) at one path and nothing at
 * the other (-ENOENT). Each fake serves one connection.
 */
/* chime_open() with $CHIME_SOCKET env and opts->socket_path path (NULL: no opts), a refusing fake at sock_path. */
static int open_with_env(const char *env, const char *path)
{
	struct chime_opts o = { .socket_path = path };
	chime_t *c = NULL;
	pid_t f = fake_start(FAKE_REFUSE_EACCES);
	int r;

	setenv("CHIME_SOCKET", env, 1);
	r = chime_open(&c, path ? &o : NULL);
	kill(f, SIGKILL);       /* not reached: still waiting for its connection */
	cr_assert_eq(waitpid(f, NULL, 0), f);
	unlink(sock_path);
	unsetenv("CHIME_SOCKET");
	cr_assert_null(c);
	return r;
}

Test(client, socket_path_from_environment)
{
	char none[PATH_MAX];

	snprintf(none, sizeof(none), "%s/no-broker.sock", dir);
	cr_assert_eq(open_with_env(sock_path, NULL), -EACCES, "$CHIME_SOCKET not used");
	cr_assert_eq(open_with_env(none, sock_path), -EACCES, "opts->socket_path did not win over $CHIME_SOCKET");
	cr_assert_eq(open_with_env(sock_path, none), -ENOENT, "$CHIME_SOCKET won over opts->socket_path");
}
