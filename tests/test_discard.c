/* SPDX-License-Identifier: MIT */
/*
 * test_discard.c - broker/discard.c: a finished connection's segments,
 * handed to a helper process at idle priority that punches their pages
 * out, and sealed first on sealer threads where their client may still
 * punch them.
 *
 * The control thread must never wait for the helper, nor for a sealer's
 * lock: a sealer may be preempted inside its few instructions under it.
 * The test stands in for that moment: linked with --wrap
 * (tests/meson.build), pthread_mutex_trylock() fails on this thread (the
 * control thread's stand-in) while `held` is set, and pthread_mutex_lock()
 * on this thread is counted (it would wait). A helper starved of CPU is
 * played by stopping it (SIGSTOP).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "discard.h"
#include "segment.h"

#define SEG_BYTES (256u * 1024u)
#define SEC UINT64_C(1000000000)

/* The helper is chimed run again: the one built beside these tests ($CHIMED, meson.build). */
static const char *chimed(void)
{
	const char *p = getenv("CHIMED");

	cr_assert(p && *p, "CHIMED: the chimed to run as the helper is not set");
	return p;
}

int __real_pthread_mutex_trylock(pthread_mutex_t *m);
int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_trylock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);

static pthread_t control;               /* the thread that plays the control thread */
static atomic_bool held;                /* a sealer "holds" its lock, for `control` */
static atomic_uint control_locks;       /* pthread_mutex_lock() calls on `control`: waits */

int __wrap_pthread_mutex_trylock(pthread_mutex_t *m)
{
	if (pthread_equal(pthread_self(), control) && atomic_load(&held))
		return EBUSY;
	return __real_pthread_mutex_trylock(m);
}

int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
	if (pthread_equal(pthread_self(), control))
		atomic_fetch_add(&control_locks, 1);
	return __real_pthread_mutex_lock(m);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* A connection's one segment, its pages written; `watch`: our own descriptor of the memfd. */
struct seg {
	struct chime_map map;
	int fd, watch;
	size_t size;
};

static void seg_make_sized(struct seg *s, size_t size)
{
	cr_assert_eq(chime_seg_memfd("test-discard", size, &s->fd, &s->map), 0);
	memset(s->map.base, 0xab, size);
	s->size = size;
	s->watch = dup(s->fd);
	cr_assert_geq(s->watch, 0);
}

static void seg_make(struct seg *s)
{
	seg_make_sized(s, SEG_BYTES);
}

/* Bytes of the memfd still in memory. */
static uint64_t seg_bytes(const struct seg *s)
{
	struct stat st;

	cr_assert_eq(fstat(s->watch, &st), 0);
	return (uint64_t)st.st_blocks * 512;
}

/* Our descriptors of the memfd, `watch` included: 2 while a job keeps its own. */
static unsigned seg_refs(const struct seg *s)
{
	struct stat want, st;
	struct dirent *e;
	unsigned n = 0;
	DIR *dir;

	cr_assert_eq(fstat(s->watch, &want), 0);
	dir = opendir("/proc/self/fd");
	cr_assert_not_null(dir);
	while ((e = readdir(dir))) {
		int fd = atoi(e->d_name);

		if (e->d_name[0] == '.' || fd == dirfd(dir) || fstat(fd, &st) < 0)
			continue;
		n += st.st_dev == want.st_dev && st.st_ino == want.st_ino;
	}
	closedir(dir);
	return n;
}

/*
 * Until its pages are punched out, or 2 s (the thread runs at idle
 * priority), stepping as the control loop does: a thread that has left
 * is replaced at a step.
 */
static bool seg_punched(struct discard *d, const struct seg *s)
{
	uint64_t end = now_ns() + 2 * SEC;

	while (seg_bytes(s) != 0 && now_ns() < end) {
		(void)discard_step(d, SEC);
		usleep(2000);
	}
	return seg_bytes(s) == 0;
}

static void post(struct discard *d, struct seg *s)
{
	size_t size = s->size;

	discard_post(d, &s->map, &s->fd, &size, 1, 1000, 1000, 0);
	cr_assert_null(s->map.base, "the caller forgets its mapping");
	cr_assert_eq(s->fd, -1, "and its descriptor");
}

static void setup(void)
{
	control = pthread_self();
	atomic_store(&held, false);
	atomic_store(&control_locks, 0);
}

TestSuite(discard, .init = setup, .timeout = 30);

Test(discard, a_job_is_punched_and_closed_by_the_helper)
{
	struct discard *d;
	struct seg s;

	cr_assert_eq(discard_start(&d, chimed()), 0);
	seg_make(&s);
	cr_assert_geq(seg_bytes(&s), SEG_BYTES, "the pages are in memory");
	post(d, &s);
	(void)discard_step(d, SEC);
	cr_assert(seg_punched(d, &s), "%llu bytes left after 2 s", (unsigned long long)seg_bytes(&s));
	for (int i = 0; i < 200 && seg_refs(&s) > 1; i++) {
		(void)discard_step(d, SEC);
		usleep(10000);
	}
	cr_assert_eq(seg_refs(&s), 1u, "the job's descriptor is still ours");
	close(s.watch);
	discard_stop(d);
}

/* Field `field` (1-based, after "PID (COMM)") of /proc/PID/stat, or -1. */
static long stat_field(pid_t pid, int field)
{
	char path[64], buf[512], *p;
	FILE *f;
	long v = -1;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')'))) {
		p++;
		for (int i = 2; p && i < field; i++)
			p = strchr(p + 1, ' ');
		if (p)
			v = p[1] >= '0' && p[1] <= '9' ? strtol(p + 1, NULL, 10) : p[1];
	}
	fclose(f);
	return v;
}

static unsigned fds_of(pid_t pid)
{
	char path[64];
	struct dirent *e;
	unsigned n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* Shared mappings ("s" in their perms) of process pid, the kernel's ([vvar] and such) aside. */
static unsigned shared_maps_of(pid_t pid)
{
	char path[64], line[512], perms[8];
	unsigned n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		n += sscanf(line, "%*s %7s", perms) == 1 && perms[3] == 's' && !strchr(line, '[');
	fclose(f);
	return n;
}

/*
 * The helper is a child process of ours, at idle priority, named, holding
 * nothing of ours but its socket (not the broker's listening socket, lock
 * file or clients' descriptors: this test's own open file stands in), nor
 * any of our shared mappings (a segment stands in for the shard files and
 * clients' segments: it would keep their memory).
 */
Test(discard, the_helper_is_a_child_at_idle_priority_holding_only_its_socket)
{
	int mine = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	char comm[32] = "", path[64];
	struct discard *d;
	struct seg s;
	pid_t pid;
	FILE *f;

	cr_assert_geq(mine, 0);
	seg_make(&s);
	cr_assert_gt(shared_maps_of(getpid()), 0u);
	cr_assert_eq(discard_start(&d, chimed()), 0);
	pid = discard_helper(d);
	cr_assert_gt(pid, 0);
	cr_assert_eq(stat_field(pid, 4), getpid(), "not our child");
	/* it sets itself up at idle priority: beside this host's neighbours, a while */
	for (int i = 0; i < 500 && (fds_of(pid) != 1 || sched_getscheduler(pid) != SCHED_IDLE); i++)
		usleep(10000);
	cr_assert_eq(sched_getscheduler(pid), SCHED_IDLE);
	cr_assert_eq(fds_of(pid), 1u, "the helper holds %u descriptors", fds_of(pid));
	cr_assert_eq(shared_maps_of(pid), 0u, "the helper keeps %u of our shared mappings", shared_maps_of(pid));
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(comm, sizeof(comm), f));
	fclose(f);
	cr_assert_str_eq(comm, "chimed-discard\n");
	discard_stop(d);
	close(mine);
	close(s.fd);
	close(s.watch);
}

/*
 * The helper shares none of our memory. A fork() would have: every page
 * of ours written before it, written again after, faulted and was copied
 * (the child kept the old one), each copy flushing the TLB of every CPU
 * the broker had run on and waiting for each; one inside a user's epoll
 * walk with interrupts off held the writer up to 300 ms (perf,
 * ARCHITECTURE.md, the TLB flushes). Ours are written again after the
 * start, and counted in minor faults.
 */
Test(discard, the_helper_shares_none_of_its_brokers_memory)
{
	enum { PAGES = 1024 };
	long page = sysconf(_SC_PAGESIZE), before;
	char *mem = mmap(NULL, PAGES * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct discard *d;
	struct rusage ru;

	cr_assert_neq(mem, MAP_FAILED);
	for (int i = 0; i < PAGES; i++)
		mem[(size_t)i * (size_t)page] = 1;
	cr_assert_eq(discard_start(&d, chimed()), 0);
	cr_assert_gt(discard_helper(d), 0);
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	before = ru.ru_minflt;
	for (int i = 0; i < PAGES; i++)
		mem[(size_t)i * (size_t)page] = 2;
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	cr_assert_lt(ru.ru_minflt - before, PAGES / 8, "%ld faults writing our %d pages again: copies on write",
		     ru.ru_minflt - before, PAGES);
	discard_stop(d);
	munmap(mem, PAGES * (size_t)page);
}

/* Post s as a job of user uid, of whom `max` jobs may wait. */
static void post_as(struct discard *d, struct seg *s, uint32_t uid, unsigned max)
{
	size_t size = SEG_BYTES;

	discard_post(d, &s->map, &s->fd, &size, 1, uid, max, 0);
	cr_assert_eq(s->fd, -1);
}

/* Start, the helper stopped as a starved one would be: its pid. */
static pid_t start_stopped(struct discard **d)
{
	pid_t pid;

	cr_assert_eq(discard_start(d, chimed()), 0);
	pid = discard_helper(*d);
	cr_assert_eq(kill(pid, SIGSTOP), 0);
	return pid;
}

/*
 * A helper starved of CPU (stopped here): steps go on at once, the jobs
 * wait (in its socket, about 280 of them, then here), and all are punched
 * once it runs again. Pages of their own each, few: 400 jobs.
 */
Test(discard, a_step_never_waits_for_a_starved_helper)
{
	enum { N = 400 };
	static struct seg s[N];
	struct discard *d;
	pid_t pid;

	pid = start_stopped(&d);
	for (int i = 0; i < N; i++) {
		uint64_t t0 = now_ns();
		bool again;

		seg_make_sized(&s[i], 4096);
		post(d, &s[i]);
		again = discard_step(d, SEC);
		cr_assert_lt(now_ns() - t0, SEC / 10, "a step took %llu ms",
			     (unsigned long long)((now_ns() - t0) / 1000000));
		cr_assert_not(again, "a step asks to be called again at once: a spin");
	}
	cr_assert_eq(seg_refs(&s[N - 1]), 2u, "the last job is not waiting here with its descriptor");
	cr_assert_geq(discard_poll_fd(d), 0, "answers are due, but nothing to poll");
	usleep(100 * 1000);
	for (int i = 0; i < N; i++)
		cr_assert_geq(seg_bytes(&s[i]), 4096u, "job %d punched by a stopped helper", i);
	cr_assert_eq(kill(pid, SIGCONT), 0);
	for (int i = 0; i < N; i++)
		cr_assert(seg_punched(d, &s[i]), "job %d not punched once the helper ran", i);
	cr_assert_eq(discard_helpers_lost(d), 0u);
	for (uint64_t end = now_ns() + 2 * SEC; discard_poll_fd(d) >= 0 && now_ns() < end;) {
		(void)discard_step(d, SEC);     /* the last answers */
		usleep(1000);
	}
	cr_assert_eq(discard_poll_fd(d), -1, "every job done, but a poll asked for");
	for (int i = 0; i < N; i++)
		close(s[i].watch);
	discard_stop(d);
}

/*
 * While the helper is starved, at most `max` of a user's jobs wait for it
 * (in its socket or here); the user's later ones are closed at once
 * without the punch, another user's wait as theirs.
 */
Test(discard, a_users_jobs_past_its_share_are_closed_without_the_punch)
{
	enum { N = 12, MAX = 4, OTHER = 2 };
	static struct seg s[N], o[OTHER];
	struct discard *d;
	pid_t pid;

	pid = start_stopped(&d);
	for (int i = 0; i < N; i++) {
		seg_make(&s[i]);
		post_as(d, &s[i], 1000, MAX);
		(void)discard_step(d, SEC);
	}
	for (int i = 0; i < OTHER; i++) {
		seg_make(&o[i]);
		post_as(d, &o[i], 1001, MAX);
		(void)discard_step(d, SEC);
	}
	cr_assert_eq(kill(pid, SIGCONT), 0);
	for (int i = 0; i < MAX; i++)
		cr_assert(seg_punched(d, &s[i]), "job %d, within the share, was not punched", i);
	for (int i = 0; i < OTHER; i++)
		cr_assert(seg_punched(d, &o[i]), "another user's job %d was not punched", i);
	for (int i = MAX; i < N; i++) {
		cr_assert_geq(seg_bytes(&s[i]), SEG_BYTES, "job %d, past the share, was punched", i);
		cr_assert_eq(seg_refs(&s[i]), 1u, "job %d, past the share, is still open", i);
	}
	for (int i = 0; i < N; i++)
		close(s[i].watch);
	for (int i = 0; i < OTHER; i++)
		close(o[i].watch);
	discard_stop(d);
}

/*
 * A helper killed (by root, or the OOM killer): what waits is closed
 * without the punch, and another is forked a second later, which
 * punches again.
 */
Test(discard, a_killed_helper_is_replaced)
{
	struct discard *d;
	struct seg a, b;
	uint64_t end;
	pid_t pid;

	cr_assert_eq(discard_start(&d, chimed()), 0);
	pid = discard_helper(d);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
	seg_make(&a);
	post(d, &a);
	(void)discard_step(d, SEC);
	cr_assert_eq(discard_helpers_lost(d), 1u, "a send to a dead helper went unnoticed");
	cr_assert_eq(discard_helper(d), 0);
	cr_assert_eq(seg_refs(&a), 1u, "the job waits for a helper that is gone");
	cr_assert_geq(seg_bytes(&a), SEG_BYTES);
	for (end = now_ns() + 3 * SEC; discard_helper(d) == 0 && now_ns() < end;) {
		(void)discard_step(d, SEC);
		usleep(10000);
	}
	cr_assert_gt(discard_helper(d), 0, "no helper forked in its place within 3 s");
	cr_assert_neq(discard_helper(d), pid);
	seg_make(&b);
	post(d, &b);
	(void)discard_step(d, SEC);
	cr_assert(seg_punched(d, &b), "the new helper did not punch");
	close(a.watch);
	close(b.watch);
	discard_stop(d);
}

/*
 * A helper stopped (starved), then n jobs of a page each posted and
 * stepped: more than its socket takes, so the last ones wait here.
 * Returns the helper's pid.
 */
static pid_t start_starved(struct discard **d, struct seg *s, int n)
{
	pid_t pid;

	pid = start_stopped(d);
	for (int i = 0; i < n; i++) {
		seg_make_sized(&s[i], 4096);
		post(*d, &s[i]);
		(void)discard_step(*d, SEC);
	}
	cr_assert_eq(seg_refs(&s[n - 1]), 2u, "the last job is not waiting here");
	return pid;
}

/*
 * A helper killed with jobs in its socket and more waiting here: noticed
 * at the next step (its end closed), nothing of ours left open or
 * waiting (the kernel closes what was in its socket), none punched.
 */
Test(discard, a_helper_killed_with_jobs_in_flight_leaves_nothing_open)
{
	enum { N = 400 };
	static struct seg s[N];
	struct discard *d;
	pid_t pid;

	pid = start_starved(&d, s, N);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
	(void)discard_step(d, SEC);
	cr_assert_eq(discard_helpers_lost(d), 1u, "a dead helper owing answers went unnoticed");
	cr_assert_eq(discard_poll_fd(d), -1, "a poll asked for on a helper that is gone");
	for (int i = 0; i < N; i++) {
		cr_assert_eq(seg_refs(&s[i]), 1u, "job %d is still open", i);
		cr_assert_geq(seg_bytes(&s[i]), 4096u, "job %d was punched", i);
		close(s[i].watch);
	}
	discard_stop(d);
}

/*
 * A stop closes what waits (here and in the starved helper's socket)
 * without the punch, and kills the helper without waiting for it.
 */
Test(discard, a_stop_kills_the_helper_and_closes_what_waits)
{
	enum { N = 400 };
	static struct seg s[N];
	struct discard *d;
	uint64_t t0;
	pid_t pid;
	int st;

	pid = start_starved(&d, s, N);
	t0 = now_ns();
	discard_stop(d);
	cr_assert_lt(now_ns() - t0, SEC / 10, "the stop took %llu ms", (unsigned long long)((now_ns() - t0) / 1000000));
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the helper ended with %#x", st);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(seg_refs(&s[i]), 1u, "job %d is still open after the stop", i);
		cr_assert_geq(seg_bytes(&s[i]), 4096u, "job %d was punched at the stop", i);
		close(s[i].watch);
	}
}

/* The helper dies with the process that forked it, however that ends. */
Test(discard, the_helper_dies_with_its_broker)
{
	int p[2];
	pid_t broker, helper = 0;
	long state = 0;

	cr_assert_eq(pipe(p), 0);
	broker = fork();
	cr_assert_geq(broker, 0);
	if (broker == 0) {
		struct discard *d;

		if (discard_start(&d, chimed()) == 0) {
			pid_t h = discard_helper(d);

			(void)!write(p[1], &h, sizeof(h));
		}
		_exit(0);       /* no stop: as if killed */
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &helper, sizeof(helper)), (ssize_t)sizeof(helper));
	close(p[0]);
	cr_assert_eq(waitpid(broker, NULL, 0), broker);
	cr_assert_gt(helper, 0);
	/* gone, or a zombie of whoever reaps orphans here */
	for (int i = 0; i < 1000 && (state = stat_field(helper, 3)) != -1 && state != 'Z'; i++)
		usleep(10000);  /* at idle priority beside this host's neighbours (1.9 s in a CI run) */
	cr_assert(state == -1 || state == 'Z', "the helper outlived its broker by 10 s (state %c)", (char)state);
}

/* Is [p, p + len) mapped in this process? (mincore fails with ENOMEM where it is not) */
static bool mapped(void *p, size_t len)
{
	unsigned char v[SEG_BYTES / 4096];

	return mincore(p, len, v) == 0;
}

static int seals_of(const struct seg *s)
{
	return fcntl(s->watch, F_GET_SEALS);
}

/* Post s as a segment its client may still punch (user 1000); our mapping's address, which the caller forgot. */
static void *post_unsealed(struct discard *d, struct seg *s)
{
	size_t size = SEG_BYTES;
	void *base = s->map.base;

	discard_post(d, &s->map, &s->fd, &size, 1, 1000, 1000, 1u);
	cr_assert_null(s->map.base, "the caller forgets its mapping");
	return base;
}

/*
 * A segment its client may still punch holes in (an attach that failed
 * before the client sealed it): our munmap would wait for a punch under
 * way. Sealed against writes first, on the sealer thread; unmapped only
 * after, and counted for its user until then.
 */
Test(discard, an_unsealed_segment_is_sealed_before_it_is_unmapped)
{
	struct discard *d;
	struct seg s;
	uint64_t end;
	void *base;

	cr_assert_eq(discard_start(&d, chimed()), 0);
	seg_make(&s);
	cr_assert_eq(seals_of(&s) & F_SEAL_FUTURE_WRITE, 0);
	base = post_unsealed(d, &s);
	cr_assert(mapped(base, SEG_BYTES), "unmapped before its seal");
	cr_assert_eq(discard_unsealed(d, 1000), 1u);
	cr_assert_eq(discard_unsealed(d, 1001), 0u, "counted for another user");
	for (end = now_ns() + 2 * SEC; mapped(base, SEG_BYTES) && now_ns() < end;) {
		(void)discard_step(d, SEC);
		cr_assert(!mapped(base, SEG_BYTES) ? (seals_of(&s) & F_SEAL_FUTURE_WRITE) != 0 : true,
			  "unmapped, but not sealed: %#x", seals_of(&s));
		usleep(1000);
	}
	cr_assert_not(mapped(base, SEG_BYTES), "still mapped after 2 s");
	cr_assert_neq(seals_of(&s) & F_SEAL_FUTURE_WRITE, 0, "not sealed: %#x", seals_of(&s));
	cr_assert_eq(discard_unsealed(d, 1000), 0u, "still counted once let go");
	cr_assert_eq(atomic_load(&control_locks), 0, "a step waited for a lock");
	close(s.watch);
	discard_stop(d);
}

/*
 * A client that sealed its memfd for good (F_SEAL_SEAL) without sealing
 * it against writes leaves nobody a way to stop its punches: our mapping
 * stays, counted for its user, and not even a stop unmaps it (the exit
 * does). Its descriptor goes.
 */
Test(discard, a_segment_sealed_for_good_but_writable_stays_mapped_and_counted)
{
	struct discard *d;
	struct seg s;
	void *base;

	cr_assert_eq(discard_start(&d, chimed()), 0);
	seg_make(&s);
	cr_assert_eq(fcntl(s.watch, F_ADD_SEALS, F_SEAL_SEAL), 0);
	base = post_unsealed(d, &s);
	for (int i = 0; i < 200 && seg_refs(&s) > 1; i++) {
		(void)discard_step(d, SEC);
		usleep(1000);
	}
	cr_assert_eq(seg_refs(&s), 1u, "the job's descriptor was not closed");
	cr_assert(mapped(base, SEG_BYTES), "unmapped, though its client can still punch it");
	cr_assert_eq(discard_unsealed(d, 1000), 1u, "not counted for its user");
	cr_assert_geq(seg_bytes(&s), SEG_BYTES, "punched: the pages are its client's");
	discard_stop(d);
	cr_assert(mapped(base, SEG_BYTES), "unmapped at the stop");
	munmap(base, SEG_BYTES);
	close(s.watch);
}

/* A stop while a segment waits for its seal (the sealer's lock "held" meanwhile): left mapped, its descriptor closed. */
Test(discard, a_stop_leaves_a_segment_waiting_for_its_seal_mapped)
{
	struct discard *d;
	struct seg s;
	void *base;

	cr_assert_eq(discard_start(&d, chimed()), 0);
	atomic_store(&held, true);
	seg_make(&s);
	base = post_unsealed(d, &s);
	(void)discard_step(d, SEC);
	cr_assert_eq(seals_of(&s) & F_SEAL_FUTURE_WRITE, 0, "sealed though never handed over");
	atomic_store(&held, false);
	discard_stop(d);
	cr_assert(mapped(base, SEG_BYTES), "unmapped unsealed at the stop");
	cr_assert_eq(seg_refs(&s), 1u, "its descriptor was not closed");
	munmap(base, SEG_BYTES);
	close(s.watch);
}
