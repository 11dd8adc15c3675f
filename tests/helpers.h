/* SPDX-License-Identifier: MIT */
/* helpers.h - small things every test file uses. */
#ifndef CHIME_TEST_HELPERS_H
#define CHIME_TEST_HELPERS_H

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clock.h"       /* now_ns(), splitmix64(): the tree's one clock and PRNG */

/*
 * A private chimed for integration tests: "$CHIMED --foreground --socket SOCK
 * [--subuid-file ''] EXTRA" (EXTRA: more shell words, may be ""), killed with the test process
 * (PR_SET_PDEATHSIG), ready once its control segment says it runs (its socket
 * listens earlier: clients connecting while the shards restore an earlier
 * broker's files wait for them) and its socket accepts. One helper for every test that needs a
 * broker, so that start-up and clean-up are written once.
 */
struct t_chimed {
	int pid;                /* pid_t; 0 when not running */
	int own_dir;            /* dir was made here: t_chimed_stop() removes it */
	char dir[200];
	char sock[256];
};

/*
 * "--subuid-file ''" unless extra names a subordinate-uid file: a test's
 * broker reads no host's /etc/subuid, whose ranges (any user added with
 * useradd has one) made the default --max-timers-per-uid a quarter of the
 * slab instead of half for every user until 2026-12-07, and still do for
 * their owners (root, on a host that gave it one): cases arming more than
 * a quarter as one user failed on such a host.
 */
#define T_SUBUIDS_NONE(extra) ((extra) && strstr((extra), "--subuid-file") ? "" : "--subuid-file ''")

/*
 * Start a broker on `sock`, or (sock NULL) on "chime.sock" in a fresh
 * directory (t_mkdtemp()). Waits up to 10 s. Returns 0, or -1 after printing
 * why to stderr (no broker left running).
 */
int t_chimed_start(struct t_chimed *b, const char *sock, const char *extra);

/*
 * Send `sig` (if still running), reap, and return the wait status (-1 if it
 * was not running); removes the directory if t_chimed_start() made it.
 */
int t_chimed_stop(struct t_chimed *b, int sig);

/*
 * Is process pid running? Not exited: a child of ours that died and is not
 * reaped yet (a zombie) is not (kill(pid, 0) still finds it); it is left to
 * be reaped. Another's: /proc/PID/stat's state is not Z or X.
 */
bool t_alive(int pid);

/* Broker pid at sock has started: its control segment names it and says RUNNING. */
bool t_broker_running(const char *sock, int pid);

/*
 * Stop the broker with `sig` (0: it is expected to exit by itself), reap it,
 * and start a new one on the same socket with `extra`, keeping the
 * directory and what the old one left in it. Returns t_chimed_start()'s
 * result.
 */
int t_chimed_restart(struct t_chimed *b, int sig, const char *extra);

/*
 * A fresh directory "PARENT/PREFIX-XXXXXX" (mkdtemp), its path in dir:
 * PARENT is /dev/shm if it is a tmpfs this process can write and run
 * programs from, else /tmp. A broker's files there are not written back to
 * a disk, as chimed advises: a start and a stop took 10.5 ms there against
 * 16 on this VM's ext4 /tmp (2026-11-30). 0, or -1 (errno).
 */
int t_mkdtemp(char *dir, size_t len, const char *prefix);

/* Replace the file at path with text (a policy file, say). 0, or -1 (errno). */
int t_write_file(const char *path, const char *text);

/* A SOCK_SEQPACKET connection to the socket at path (nothing sent): its fd, or -1 (errno). */
int t_sock_connect(const char *path);

/*
 * A hello by hand on a fresh connection to the socket at path, as libchime
 * sends one (CHIME_HELLO_SEALS), for session `session` (NULL: anonymous)
 * with `flags` and `limit` besides. Its fd, or -1 (errno).
 */
int t_raw_hello(const char *path, const char *session, uint32_t flags, uint64_t limit);

/*
 * The client's part of an attach after a hello by hand on fd: take the
 * broker's first welcome and its descriptors, map the rw segment (faulted
 * in) and the touch table, seal them and say so (struct chime_mapped), as
 * libchime does; the broker's last message is awaited and left unread.
 * 0, the welcome's refusal, or -errno.
 */
int t_answer_offer(int fd);

/*
 * The same answered as `how`: HONEST as above; UNSEALED without the seals;
 * UNFAULTED sealed before its pages are faulted in; MALFORMED a message
 * that is not a struct chime_mapped; SEALED_OPEN sealed for good
 * (F_SEAL_SEAL) but not against writes, so that nobody can seal them
 * against punches any more. kept: if not NULL, the welcome's descriptors
 * are handed to the caller (*nkept of them), not closed.
 */
enum t_answer { T_ANSWER_HONEST, T_ANSWER_UNSEALED, T_ANSWER_UNFAULTED, T_ANSWER_MALFORMED, T_ANSWER_SEALED_OPEN };
int t_answer_offer_as(int fd, enum t_answer how, int *kept, int *nkept);

/* The broker's last answer to an attach on fd, read: its status; -ECONNRESET if it hung up. */
int t_attach_answer(int fd);

/* Whether something listens at the socket path (a connect succeeds; nothing is sent). */
bool t_sock_accepts(const char *path);

/* Whether the first 64 KiB of the file at path (a broker's log) hold needle. */
bool t_file_has(const char *path, const char *needle);

/* Remove a directory and what is in it (one level, as brokers leave it). */
void t_rmdir_files(const char *dir);

/* The entries of a directory, but those starting with '.'; -1 if it cannot be read. */
int t_count_files(const char *dir);
/* Process pid's open descriptors other than pidfds (-1 if unreadable); its pidfds into *pidfds. */
int t_fds(pid_t pid, unsigned *pidfds);

/*
 * A fresh tmpfs of `size` ("16m") on a new directory under /tmp, named in dir
 * (root only). 0 or -1 (errno). Unmounted at exit if a failed assertion
 * skipped t_unmount_tmpfs().
 */
int t_mount_tmpfs(char *dir, size_t len, const char *size);

/* Unmount it and remove the directory with what is in it. */
void t_unmount_tmpfs(const char *dir);

/*
 * Write `bytes` into dir/name (created or truncated), or (bytes 0) until the
 * filesystem is full. Returns the bytes written, or -1 (errno) on any other
 * failure.
 */
int64_t t_fill(const char *dir, const char *name, uint64_t bytes);

/*
 * Copy the program named by $env, and the libchime.so.0 of its build tree,
 * into dir, readable and executable by everyone: for a test that runs it as
 * another user, since the build tree may sit under a 0700 directory (a
 * mktemp -d clone). Run the copy with LD_LIBRARY_PATH=dir. Returns its path
 * (a static buffer, two in rotation), or NULL after saying why on stderr.
 */
const char *t_tool_copy(const char *dir, const char *env);

/*
 * The rounds of a timing test that missed its bound, and what each saw. A
 * test that allows one (a test process or a shard preempted for 15 ms on a
 * loaded host) still fails when what it checks is missing, which would make
 * most rounds miss.
 */
struct t_misses {
	unsigned n;
	char what[768];
};

/* Count a missed round and add "; " and its description to m->what (cut short when full). */
void t_missed(struct t_misses *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How many descriptors process pid has open (/proc/PID/fd), or -1. */
int t_open_fds(int pid);

/* t_open_fds() once it holds still (five looks 20 ms apart agree, 4 s at most): a start-up's or a close's end. */
int t_open_fds_settled(int pid);

/*
 * The next of process pid's descriptors, from d (opendir("/proc/PID/fd")),
 * that is an anonymous inode of this kind ("[io_uring]", "[timerfd]"): its
 * /proc/PID/fdinfo file open for reading (the caller closes it), its
 * number in *fd. NULL when there are no more.
 */
FILE *t_next_anon_fdinfo(int pid, DIR *d, const char *kind, int *fd);

/* Polls armed in all of process pid's io_urings (their fdinfo's PollList), or -1. */
int t_ring_polls(int pid);

/* The thread of process `pid` whose name (/proc/PID/task/TID/comm) is `comm`, or -1. */
int t_thread_named(int pid, const char *comm);

/* A child process of `ppid` whose name (/proc/PID/comm) is `comm`, or -1. */
int t_child_named(int ppid, const char *comm);

/* How many threads of process `pid` have a name starting with `prefix`. */
unsigned t_threads_prefixed(int pid, const char *prefix);

/*
 * A TCP connection to ourselves over loopback that cannot end: its peer
 * (*peer, accepted from *listener) never reads, both buffers are full, and
 * its close lingers for linger_s (SO_LINGER), in tcp_close(), until the
 * peer is closed. Returns the socket, or -1 with errno.
 */
int t_lingering_tcp_socket(int linger_s, int *peer, int *listener);

/*
 * True if thread tid of process pid is asleep (state S in
 * /proc/PID/task/TID/stat: blocked in a system call, waiting).
 */
bool t_thread_asleep(int pid, int tid);

/*
 * Stop one thread of a child process under ptrace (PTRACE_SEIZE, then
 * PTRACE_INTERRUPT), as a debugger would, while its other threads run on:
 * a shard thread held here does nothing, the control thread goes on. 0, or
 * -errno (-EPERM: ptrace not allowed here; the caller skips).
 * t_thread_release() lets it go on (PTRACE_DETACH): 0 or -errno.
 */
/* Pin every thread of process pid to CPU cpu: the number pinned, or -errno. */
int t_pin_threads(int pid, int cpu);
int t_thread_hold(int tid);
int t_thread_release(int tid);

/*
 * One instruction of a thread held by t_thread_hold() (PTRACE_SINGLESTEP),
 * passing on a signal that stopped it instead: 0, or -errno (-ECHILD: it
 * is gone; -ETIMEDOUT: the instruction was a system call still blocked
 * after 2 s, the thread asleep: it is held again, stopped in it).
 */
int t_thread_step(int tid);

/* Node states for t_nodes(): a bit per CHIME_NODE_* state. */
#define T_NODES_USED   (~1u)    /* every state but FREE */
#define T_NODES_TIMERS ((1u << 1) | (1u << 2) | (1u << 5) | (1u << 6))  /* ARMED, EXPIRED, BACKLOG, ACKWAIT */

/* Nodes of every shard file of the broker at `sock` whose state is in `states`, read from the files. */
uint64_t t_nodes(const char *sock, unsigned states);

/* Wait (up to 3 s) for t_nodes() to reach want; returns the last count. */
uint64_t t_nodes_settle(const char *sock, unsigned states, uint64_t want);

/*
 * The heartbeat's period (ms) the broker at sock shows the tools (its
 * control segment's beat_ms) once it is `want`, polled for up to
 * within_ms; else the last one read (0: unreadable).
 */
uint32_t t_beat_ms_becomes(const char *sock, uint32_t want, unsigned within_ms);

/*
 * Wait until the broker at sock is at rest (beat_ms 450: a second of
 * quiet since it last had anything to do), for at most within_ms: what a
 * fixed sleep that long waited for, without the rest of it. Not asserted:
 * the caller measures the rest.
 */
void t_at_rest_within(const char *sock, unsigned within_ms);

/*
 * A set of the host's wall clock, by anyone (another test, an NTP step at
 * boot, a VM's agent), rightly wakes a broker: its control thread follows
 * the set at once, and so does each shard holding wall-clock timers
 * (control.c, wall_check()). A test
 * that measures a rest watches for sets with t_clock_watch(): a
 * CLOCK_REALTIME timerfd armed far ahead with TFD_TIMER_CANCEL_ON_SET, as
 * the broker's own watch (-1 if none could be made: then no set is seen).
 * t_clock_was_set(): whether the clock was set since the watch was made
 * or last asked. t_clock_set_skips(): skips the test, saying why, if it
 * was (stopping b first if given): the rest it measured says nothing.
 */
int t_clock_watch(void);
bool t_clock_was_set(int fd);
#ifdef CRITERION_H_
static inline void t_clock_set_skips(int fd, struct t_chimed *b)
{
	if (!t_clock_was_set(fd))
		return;
	if (b)
		t_chimed_stop(b, SIGTERM);
	cr_skip("the host's wall clock was set during the measurement (by another process): a set rightly "
		"wakes a broker to follow it, so this rest measured more than the broker's own wake-ups");
}
#endif

#ifdef CHIMED_KEYIDX_H /* for the tests of the key index (they include keyidx.h first) */
/* The first node of (owner, key) in the index, by its bucket's chain: CHIME_NIL if none. */
static inline uint32_t t_key_first(struct keyidx *ki, uint16_t owner, uint64_t key)
{
	uint32_t i = ki->heads[keyidx_bucket(ki, owner, key)] - 1;

	while (i != CHIME_NIL && (ki->nodes[i].owner != owner || ki->nodes[i].key != key))
		i = ki->nodes[i].key_next;
	return i;
}

#ifdef CHIMED_CHAN_H /* and of the channels (chan.h) */
/*
 * The index against the slab (keyidx.h, chan.h): every node a client armed
 * is in its bucket's chain, or left out and counted in its channel's
 * `unindexed`, never left out on a keyed channel once its walk began
 * (but a dying one's: its reclaim ends the walk, indexed or not, and
 * releases every node); grants are left out. Returns how many nodes are
 * in the index.
 */
static inline uint32_t t_key_index_check(struct shard_core *sc)
{
	uint32_t *out = calloc(sc->max_clients, sizeof(*out)), in = 0;

	cr_assert_not_null(out);
	for (uint32_t idx = 0; idx < sc->wh.w->high_water; idx++) {
		struct chime_node *n = &sc->wh.nodes[idx];
		uint32_t i;

		if (n->state == CHIME_NODE_FREE)
			continue;
		if (n->state == CHIME_NODE_GRANTED) {
			cr_assert(!keyidx_linked(n), "grant %u is in the index", idx);
			continue;
		}
		if (!keyidx_linked(n)) {
			out[n->owner]++;
			continue;
		}
		for (i = sc->ki.heads[keyidx_bucket(&sc->ki, n->owner, n->key)] - 1; i != CHIME_NIL && i != idx;)
			i = sc->ki.nodes[i].key_next;
		cr_assert_eq(i, idx, "node %u is linked but not in its bucket's chain", idx);
		in++;
	}
	for (uint32_t s = 0; s < sc->max_clients; s++) {
		const struct chan *ch = sc->by_slot[s];

		cr_assert(ch || out[s] == 0, "slot %u: %u nodes left out, no channel", s, out[s]);
		if (!ch)
			continue;
		cr_assert_eq(ch->unindexed, out[s], "slot %u: %u left out, counted %u", s, out[s], ch->unindexed);
		cr_assert(ch->dying || !ch->keyed || out[s] == 0 || (ch->walk_queued && !ch->walk_begun),
			  "slot %u: keyed, and %u nodes left out", s, out[s]);
	}
	free(out);
	return in;
}
#endif
#endif

#ifdef CHIME_WHEEL_H /* for the tests of the wheel (they include wheel.h first) */
/* wheel_advance(), and how many timers it made poppable (none may be popped meanwhile). */
static inline uint64_t t_advance(struct wheel *wh, uint64_t now_ns)
{
	uint64_t before = wheel_due(wh);

	wheel_advance(wh, now_ns);
	return wheel_due(wh) - before;
}
#endif

#ifdef T_RELEASE_CASES
/*
 * A test file built into two executables (tests/meson.build, 'c_args':
 * -DT_RELEASE_CASES=1 and =0), each run by one build's default suite. The
 * release one has the cases declared ReleaseTest(), which judge time
 * (lateness, wake-ups, heartbeats, stalls under starvation: a sanitizer's
 * runtime, its slowness and its own locks, is not what they measure) or
 * need what a sanitizer's runtime lacks (mlockall); the other has those
 * declared AsanTest(), run under ASan+UBSan. A new case picks one of the
 * two: a plain Test() would be in both executables, and run twice.
 */
#if T_RELEASE_CASES
#define ReleaseTest(...) Test(__VA_ARGS__)
#define AsanTest(...)    T_NOT_HERE(__VA_ARGS__, 0)
#else
#define ReleaseTest(...) T_NOT_HERE(__VA_ARGS__, 0)
#define AsanTest(...)    Test(__VA_ARGS__)
#endif
/* A case of the other executable: compiled (what it calls stays used), not registered. */
#define T_NOT_HERE(suite, name, ...) static void __attribute__((unused)) suite##_##name##_elsewhere(void)
#endif

#ifdef CHIME_H /* for the tests that link libchime (they include chime.h first) */
#include <stdio.h>
#include <string.h>

/* Connect to the broker at sock: NULL after saying why on stderr (so safe in a forked child). */
static inline chime_t *t_open(const char *sock)
{
	struct chime_opts o = { .socket_path = sock };
	chime_t *c = NULL;
	int r = chime_open(&c, &o);

	if (r < 0) {
		fprintf(stderr, "chime_open('%s'): %s\n", sock, strerror(-r));
		return NULL;
	}
	return c;
}
#endif

/*
 * SIGKILL process pid as soon as its thread tid returns from system call `nr`
 * (a SYS_* number) with a result >= 0: a broker killed right after a given
 * step. The thread is traced meanwhile (PTRACE_SYSCALL), the others run on.
 * 0 once killed; -ETIMEDOUT if no such call returned within `ms` (the thread
 * released, the process left running); -errno (-EPERM: ptrace is not allowed).
 */
int t_kill_after_syscall(int pid, int tid, long nr, unsigned ms);

/*
 * Start a broker as t_chimed_start() does (sock NULL: in a fresh directory),
 * its main thread traced from the exec, and SIGKILL it at system call `nr`
 * on a file whose path ends in `suffix`: SYS_openat, as an open() with
 * O_CREAT of it, or its first open() with O_TMPFILE (a file to be named
 * later), returns (a broker killed right after it created that file);
 * another (SYS_unlink), as the call begins, before it is done (its path the
 * first argument). 0 once killed (b->pid 0, the directory kept for a
 * t_chimed_start() on b->sock); -ETIMEDOUT if no such call came within 10 s
 * (the broker killed all the same); -errno.
 */
int t_chimed_killed_at(struct t_chimed *b, const char *sock, const char *extra, long nr, const char *suffix);

#endif
