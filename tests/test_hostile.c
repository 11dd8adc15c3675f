/* SPDX-License-Identifier: MIT */
/*
 * test_hostile.c - a client that abuses what it was handed hurts only itself.
 *
 * Each attack runs in a forked "attacker" process that uses nothing but the
 * public API and what any process can do to its own descriptors
 * (/proc/self/fd, fcntl, read, write). Meanwhile the test process, an
 * honest client, must keep arming timers and receiving them on time, and a
 * new client must still connect: the broker's shard and control threads are
 * neither blocked nor starved (ARCHITECTURE.md, "What a client can touch").
 * The attacker's own timers may well stop working: that is its problem.
 *
 * Two executables are built from this file (tests/meson.build):
 * test_hostile_release has the cases declared ReleaseTest(), which bound
 * the broker's stalls and other users' lateness beside busy loops and
 * hostile clients (ASan's runtime takes locks of its own, and a starved
 * holder of one stalled every other thread of an ASan chimed for seconds:
 * not what they measure); test_hostile has those declared AsanTest(), run
 * under ASan+UBSan (helpers.h, T_RELEASE_CASES).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <linux/close_range.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chime.h"
#include "atomics.h"
#include "chime_shm.h"
#include "segment.h"
#include "helpers.h"

#if !defined(SO_PASSRIGHTS) && !defined(__alpha__) && !defined(__mips__) && !defined(__hppa__) && !defined(__sparc__)
#define SO_PASSRIGHTS 83      /* Linux 6.16 */
#endif

#ifndef T_RELEASE_CASES
#error "tests/meson.build builds this file with -DT_RELEASE_CASES=0 and with -DT_RELEASE_CASES=1"
#endif

#define MS 1000000ull

static struct t_chimed tb;
static chime_id_t junk;       /* ids the test does not need */

static void broker_start(void)
{
	cr_assert_eq(t_chimed_start(&tb, NULL, "--shards 2"), 0, "chimed did not come up");
}

static void broker_stop(void)
{
	t_chimed_stop(&tb, SIGKILL);
}

TestSuite(hostile, .init = broker_start, .fini = broker_stop, .timeout = 60);

static chime_t *copen(void)
{
	return t_open(tb.sock);
}

/* Calls fn(fd) for every eventfd this process holds (libchime's, here). */
static int for_each_eventfd(void (*fn)(int fd))
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char path[64], target[64];
		ssize_t len;
		int fd = atoi(e->d_name);

		if (e->d_name[0] == '.' || fd == dirfd(d))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = 0;
		if (strcmp(target, "anon_inode:[eventfd]") == 0) {
			fn(fd);
			n++;
		}
	}
	closedir(d);
	return n;
}

/* Blocking, and one short of overflow: a write by anyone sharing it would now block. */
static void saturate(int fd)
{
	uint64_t v;
	int fl = fcntl(fd, F_GETFL);

	(void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	(void)!read(fd, &v, sizeof(v));
	v = UINT64_C(0xfffffffffffffffe);
	(void)!write(fd, &v, sizeof(v));
	(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

/* Drain it, making it non-blocking first so the thief itself never hangs. */
static void steal(int fd)
{
	uint64_t v;
	int fl = fcntl(fd, F_GETFL);

	(void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	(void)!read(fd, &v, sizeof(v));
}

static void close_it(int fd)
{
	close(fd);
}

/* Swap: a fresh eventfd of its own in its place. */
static void swap_it(int fd)
{
	int e = eventfd(0, 0);

	if (e >= 0 && e != fd) {
		(void)dup2(e, fd);
		close(e);
	}
}

/* The attacker: arms timers due at once, asks to be woken, then runs `attack` forever. */
static pid_t attacker(void (*attack)(int fd), int once)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		chime_t *c;
		struct chime_event ev[64];

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		/* Inherited descriptors are the test runner's (it uses eventfds too): only ours get abused. */
		close_range(3, ~0U, 0);
		c = copen();
		if (!c)
			_exit(3);
		(void)chime_fd(c);      /* asks for wake-ups: the shard will want to signal us */
		for (int i = 0; i < 64; i++)
			(void)chime_arm(c, 1, 0, 0, 0, &junk);
		for (unsigned k = 0;; k++) {
			if (!once || k == 0)
				(void)for_each_eventfd(attack);
			/* Keep asking for wake-ups and keep timers firing at us. */
			(void)chime_poll(c, ev, 64);
			if (k % 16 == 0)
				(void)chime_arm(c, 2, 0, 0, 0, &junk);
			usleep(1000);
		}
	}
	return pid;
}

/*
 * The honest side: a fresh client connects within 1 s, and 200 timers armed
 * 20..120 ms ahead all fire, none more than 500 ms late (generous on a noisy
 * 2-core host; a wedged shard would never deliver them).
 */
static void honest_client_unharmed(void)
{
	struct chime_event ev[64];
	uint64_t t0 = now_ns(), base;
	unsigned got = 0;
	chime_t *c;

	c = copen();
	cr_assert_not_null(c, "a new client could not connect while under attack");
	cr_assert_lt(now_ns() - t0, 1000 * MS, "chime_open took %llu ms under attack",
		     (unsigned long long)((now_ns() - t0) / MS));
	base = now_ns();
	for (int i = 0; i < 200; i++) {
		chime_id_t id;

		cr_assert_eq(chime_arm(c, 7, base + (20 + (uint64_t)(i % 100)) * MS, 0, (uint64_t)i, &id), 0);
	}
	while (got < 200 && now_ns() - base < 5000 * MS) {
		int n = chime_wait(c, ev, 64, 100);

		cr_assert_geq(n, 0, "chime_wait: %s", strerror(-n));
		for (int i = 0; i < n; i++) {
			cr_assert_geq(ev[i].fired_ns, ev[i].deadline_ns, "fired early");
			cr_assert_lt(ev[i].fired_ns - ev[i].deadline_ns, 500 * MS, "fired %llu ms late",
				     (unsigned long long)((ev[i].fired_ns - ev[i].deadline_ns) / MS));
		}
		got += (unsigned)n;
	}
	cr_assert_eq(got, 200, "only %u of 200 timers fired while under attack", got);
	chime_close(c);
}

static void run_attack(void (*attack)(int fd), int once)
{
	pid_t pid = attacker(attack, once);
	int st;

	usleep(300 * 1000);     /* let it open, arm and attack */
	cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the attacker died on its own (status %d)", st);
	for (int round = 0; round < 3; round++)
		honest_client_unharmed();
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	/* And after the attacker is gone, its slot is reclaimed and the broker is fine. */
	honest_client_unharmed();
	cr_assert(t_alive(tb.pid), "the broker died");
}

AsanTest(hostile, saturated_blocking_eventfds_wedge_nothing)
{
	run_attack(saturate, 1);
}

AsanTest(hostile, reading_own_doorbells_steals_only_own_wakeups)
{
	run_attack(steal, 0);
}

AsanTest(hostile, closing_handed_fds_hurts_only_itself)
{
	run_attack(close_it, 1);
}

AsanTest(hostile, swapping_handed_fds_hurts_only_itself)
{
	run_attack(swap_it, 1);
}

/* The address of the mapping whose name contains `what` (/proc/self/maps). */
static void *find_mapping(const char *what)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	void *base = NULL;

	while (f && fgets(line, sizeof(line), f)) {
		if (strstr(line, what)) {
			base = (void *)strtoull(line, NULL, 16);
			break;
		}
	}
	if (f)
		fclose(f);
	return base;
}

/*
 * A client that never reads its wake-ups and keeps asking for more (it
 * writes want_wakeup itself, as any client can), while timers fire at it
 * and it takes the events: the broker's messages pile up in its socket
 * until sends fail with EAGAIN. The shard must not care.
 */
AsanTest(hostile, unread_wakeups_fill_only_its_own_socket)
{
	pid_t pid = fork();
	int st;

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct chime_event ev[64];
		char *rw;
		chime_t *c;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		c = copen();
		rw = find_mapping("chime-client-rw");
		if (!c || !rw)
			_exit(3);
		for (;;) {
			(void)chime_arm(c, 1, 0, 0, 0, &junk);
			/* want_wakeup: offset 128 of the rw segment (chime_shm.h) */
			__atomic_store_n((uint32_t *)(rw + 128), 1, __ATOMIC_SEQ_CST);
			while (chime_poll(c, ev, 64) > 0)   /* never chime_fd(): never reads the socket */
				;
		}
	}
	usleep(300 * 1000);
	for (int round = 0; round < 3; round++)
		honest_client_unharmed();
	cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the attacker died on its own");
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	honest_client_unharmed();
}

/* ---- the broker's death is visible on chime_fd() ---- */

static void no_event(const struct chime_event *ev, void *arg)
{
	(void)ev;
	(void)arg;
	cr_assert_fail("an event after the broker died");
}

AsanTest(hostile, broker_sigkill_makes_chime_fd_readable_then_enotconn)
{
	struct chime_event ev[8];
	struct epoll_event e = { .events = EPOLLIN };
	chime_t *c = copen();
	uint64_t t0;
	int ep, n;

	cr_assert_not_null(c);
	ep = epoll_create1(EPOLL_CLOEXEC);
	cr_assert_geq(ep, 0);
	cr_assert_eq(epoll_ctl(ep, EPOLL_CTL_ADD, chime_fd(c), &e), 0);
	/* A quiet application: one timer an hour away, nothing pending. */
	cr_assert_eq(chime_arm(c, 1, now_ns() + 3600000 * MS, 0, 0, &junk), 0);
	cr_assert_eq(chime_poll(c, ev, 8), 0);
	cr_assert_eq(epoll_wait(ep, &e, 1, 100), 0, "chime_fd() readable with nothing pending");

	t0 = now_ns();
	kill(tb.pid, SIGKILL);
	n = epoll_wait(ep, &e, 1, 2000);
	cr_assert_eq(n, 1, "chime_fd() not readable 2 s after the broker died");
	cr_assert_lt(now_ns() - t0, 1000 * MS, "chime_fd() readable only after %llu ms",
		     (unsigned long long)((now_ns() - t0) / MS));
	cr_assert_eq(chime_poll(c, ev, 8), -ENOTCONN);
	cr_assert_eq(chime_dispatch(c, no_event, NULL, 0), -ENOTCONN);
	chime_close(c);
	close(ep);
}

/*
 * A wedged broker (stopped, here) whose listening queue is full: a connect
 * waits for room, and chime_open() with it, for good before (found by an
 * audit). chime_open(3) bounds the handshake by 10 s: the connect too.
 */
AsanTest(hostile, chime_open_at_a_stopped_broker_with_its_queue_full_times_out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fds[200], n = 0, r;
	uint64_t t0, took;
	chime_t *c;

	strcpy(sa.sun_path, tb.sock);
	cr_assert_eq(kill(tb.pid, SIGSTOP), 0);
	while (n < 200) {
		fds[n] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		cr_assert_geq(fds[n], 0);
		if (connect(fds[n], (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			cr_assert_eq(errno, EAGAIN, "connect %d: %s", n, strerror(errno));
			close(fds[n]);
			break;
		}
		n++;
	}
	cr_assert_lt(n, 200, "the queue never filled");
	t0 = now_ns();
	r = chime_open(&c, &(struct chime_opts){ .socket_path = tb.sock });
	took = now_ns() - t0;
	kill(tb.pid, SIGCONT);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	cr_assert_eq(r, -ETIMEDOUT, "chime_open: %d (%s)", r, strerror(-r));
	cr_assert_lt(took, 12000 * MS, "chime_open took %.1f s", (double)took / 1e9);
	/*
	 * Running again, it answers, once it has gone through the queue: those
	 * connections are this user's, and while 8 of them are in a handshake
	 * the next is refused (MAX_HANDSHAKES_PER_UID).
	 */
	for (t0 = now_ns(); (r = chime_open(&c, &(struct chime_opts){ .socket_path = tb.sock })) < 0;) {
		cr_assert_lt(now_ns() - t0, 3000 * MS, "no open 3 s after SIGCONT: %s", strerror(-r));
		usleep(20000);
	}
	chime_close(c);
}

/*
 * What a client holds of the broker: its own segments and the public one
 * (state, heartbeat, sleep numbers). Never the control segment (everyone's
 * pids and counters) nor a shard segment (everyone's timers).
 */
AsanTest(hostile, a_client_maps_nothing_about_other_clients)
{
	chime_t *c = copen();
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int pub = 0;

	cr_assert_not_null(c);
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f)) {
		cr_assert_null(strstr(line, ".ctl"), "a client maps the control segment: %s", line);
		cr_assert_null(strstr(line, ".shard"), "a client maps a shard segment: %s", line);
		pub += strstr(line, "chime-public") != NULL;
	}
	fclose(f);
	cr_assert_gt(pub, 0, "the public segment is not mapped");
	chime_close(c);
}

/*
 * A descriptor of the memfd named `name` this process maps (the library
 * closes its descriptors once mapped): opened through /proc/self/map_files
 * (root: CAP_SYS_ADMIN), or -1.
 */
static int memfd_of_mapping(const char *name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], want[64], path[128];
	int fd = -1;

	snprintf(want, sizeof(want), "/memfd:%s ", name);
	cr_assert_not_null(f);
	while (fd < 0 && fgets(line, sizeof(line), f)) {
		char *range = strtok(line, " ");

		if (range && strstr(range + strlen(range) + 1, want)) {
			snprintf(path, sizeof(path), "/proc/self/map_files/%s", range);
			fd = open(path, O_RDONLY | O_CLOEXEC);
		}
	}
	fclose(f);
	return fd;
}

/* Bytes of memory behind memfd fd (its allocated blocks). */
static uint64_t memfd_bytes(int fd)
{
	struct stat st;

	cr_assert_eq(fstat(fd, &st), 0);
	return (uint64_t)st.st_blocks * 512;
}

/*
 * A process may keep the memfds of a connection it has ended (the library
 * closes them; a hostile process need not): the broker punches the ro
 * segment's pages out when the connection ends, since it faulted them
 * (the events it wrote) and was charged for them. Kept, each connection
 * left the broker 1.28 MiB that no process's RSS showed (an audit: 250 MiB
 * in 2.5 s). The rw segment stays whole: the client faulted in every page
 * of it before it sealed it, which the broker checks before it writes a
 * byte there (segments_unfaulted_before_the_seal_are_refused), so what it
 * keeps is its own, and sealed, nobody can punch it, the broker included.
 * The library closes its segments' descriptors once mapped; this test
 * opens its own through /proc/self/map_files.
 */
AsanTest(hostile, memfds_kept_after_the_connection_hold_none_of_the_brokers_memory)
{
	enum { DUE = 4000 };
	chime_t *c;
	int rw, ro;
	uint64_t before;

	c = copen();
	cr_assert_not_null(c);
	rw = memfd_of_mapping("chime-client-rw");
	ro = memfd_of_mapping("chime-client-ro");
	if (rw < 0 || ro < 0)
		cr_skip("cannot open the mapped memfds through /proc/self/map_files (needs root): %s", strerror(errno));
	for (int i = 0; i < DUE; i++)
		cr_assert_eq(chime_arm(c, 1, 0, 0, (uint64_t)i, &junk), 0);
	cr_assert_eq(chime_flush(c), 0);
	/* Events written into the completion rings, never taken. */
	for (int i = 0; i < 500 && memfd_bytes(ro) < DUE * 64u; i++)
		usleep(2000);
	before = memfd_bytes(ro) + memfd_bytes(rw);
	cr_assert_geq(memfd_bytes(ro), DUE * 64u, "the events were not written: ro holds %llu bytes",
		      (unsigned long long)memfd_bytes(ro));
	chime_close(c);
	for (int i = 0; i < 1000 && memfd_bytes(ro) > 0; i++)
		usleep(2000);
	cr_assert_eq(memfd_bytes(ro), 0, "%llu bytes of %llu still held by the ro memfd 2 s after the close",
		     (unsigned long long)memfd_bytes(ro), (unsigned long long)before);
	cr_assert_eq(memfd_bytes(rw), (uint64_t)lseek(rw, 0, SEEK_END), "the client's own rw pages, "
		     "sealed: %llu bytes held, not all of them", (unsigned long long)memfd_bytes(rw));
	close(rw);
	close(ro);
}

/* The start of this process's mapping of memfd `name` (the library's), or NULL. */
static void *mapping_of(const char *name, size_t *len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], want[64];
	unsigned long lo, hi;
	void *p = NULL;

	snprintf(want, sizeof(want), "/memfd:%s ", name);
	cr_assert_not_null(f);
	while (!p && fgets(line, sizeof(line), f))
		if (strstr(line, want) && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
			p = (void *)lo;
			*len = hi - lo;
		}
	fclose(f);
	return p;
}

/* A hello by hand for an anonymous attach with a touch table, on a fresh connection. */
static int raw_attach_hello(void)
{
	int fd = t_raw_hello(tb.sock, NULL, 0, CHIME_HELLO_TOUCH);

	cr_assert_geq(fd, 0, "a hello by hand: %s", strerror(errno));
	return fd;
}

/*
 * A hole punched in memory a shard reads (a client's rw segment, its touch
 * table) takes the pages out of the shard's mapping too, and the shard's
 * next access waits in the kernel until the punch ends, which takes as
 * long as the client's own mappings make it: punches in a loop over about
 * 1000 mappings made another client's 1 ms periodic fire up to 1979 ms
 * late (a stall audit, 2026-11-30). The client now seals both before
 * anything of the broker's is in them, and the broker attaches nothing
 * until they are: after that nobody can punch them, through a descriptor
 * or a mapping, nor map them writable again, nor resize them.
 */
AsanTest(hostile, a_client_cannot_punch_holes_in_memory_a_shard_reads)
{
	static const char *const names[] = { "chime-client-rw", "chime-client-touch" };
	int fd = raw_attach_hello(), kept[3 + 2 + 1], n = 0;
	chime_t *c;

	cr_assert_eq(t_answer_offer_as(fd, T_ANSWER_HONEST, kept, &n), 0);
	cr_assert_eq(t_attach_answer(fd), 0, "an honest attach by hand was refused");
	cr_assert_eq(n, 6, "the welcome of a client with a touch table has 6 descriptors, not %d", n);
	for (int k = 0; k < 2; k++) {
		int t = k == 0 ? kept[1] : kept[n - 1];
		void *p;

		errno = 0;
		cr_assert_eq(fallocate(t, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1,
			     "a hole punched in the %s", names[k]);
		cr_assert_eq(errno, EPERM, "%s: %s", names[k], strerror(errno));
		cr_assert_eq(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, t, 0), MAP_FAILED,
			     "the %s mapped writable again", names[k]);
		p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, t, 0);
		cr_assert_neq(p, MAP_FAILED);
		cr_assert_eq(mprotect(p, 4096, PROT_READ | PROT_WRITE), -1, "the %s made writable", names[k]);
		munmap(p, 4096);
		cr_assert_eq(ftruncate(t, 4096), -1, "the %s resized", names[k]);
	}
	for (int i = 0; i < n; i++)
		close(kept[i]);
	close(fd);
	/* Through the library's own writable mappings, made before the seal: the same. */
	c = copen();
	cr_assert_not_null(c);
	for (int k = 0; k < 2; k++) {
		size_t len = 0;
		void *p = mapping_of(names[k], &len);

		cr_assert_not_null(p, "no mapping of the %s", names[k]);
		errno = 0;
		cr_assert_eq(madvise(p, 4096, MADV_REMOVE), -1, "MADV_REMOVE on the library's %s", names[k]);
		cr_assert_eq(errno, EPERM, "%s: %s", names[k], strerror(errno));
	}
	chime_close(c);
}

/* The inode of this process's mapping of memfd `name` (the library's), or 0. */
static unsigned long mapping_inode(const char *name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], want[64];
	unsigned long ino = 0;

	snprintf(want, sizeof(want), "/memfd:%s ", name);
	cr_assert_not_null(f);
	while (!ino && fgets(line, sizeof(line), f))
		if (strstr(line, want) && sscanf(line, "%*s %*s %*s %*s %lu", &ino) != 1)
			ino = 0;
	fclose(f);
	return ino;
}

/*
 * Pages of process pid's mapping of the file with inode `ino` that are in
 * its page tables (/proc/PID/pagemap, bit 63), into *present; the
 * mapping's pages into *total. The mapping is the broker's of a memfd
 * this process maps too (the inode names it among every client's).
 */
static void pages_mapped_by(pid_t pid, unsigned long ino, uint64_t *present, uint64_t *total)
{
	char path[64], line[512];
	unsigned long lo = 0, hi = 0, i;
	long page = sysconf(_SC_PAGESIZE);
	FILE *f;
	int pm;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &lo, &hi, &i) == 3 && i == ino)
			break;
		else
			lo = hi = 0;
	fclose(f);
	cr_assert_neq(hi, 0ul, "the broker has no mapping of inode %lu", ino);
	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	pm = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(pm, 0, "%s: %s", path, strerror(errno));
	*present = *total = 0;
	for (unsigned long a = lo; a < hi; a += (unsigned long)page) {
		uint64_t e = 0;

		cr_assert_eq(pread(pm, &e, sizeof(e), (off_t)(a / (unsigned long)page * sizeof(e))), (ssize_t)sizeof(e));
		*present += e >> 63;
		(*total)++;
	}
	close(pm);
}

/*
 * With swap, a client may page out (MADV_PAGEOUT) pages of its own memory
 * that it alone maps: its rw segment is its own writable memfd. A page
 * the broker has not mapped yet then goes to swap, and the broker's first
 * access of it waits for the disk: the shard that formats the rings at
 * the attach, or writes an event's claim word later. Mapped by the broker
 * too, a page is not the client's alone, and MADV_PAGEOUT passes it by.
 * So the broker maps all of rw at the attach, before any shard touches it.
 */
AsanTest(hostile, a_clients_rw_segment_is_all_mapped_by_the_broker_at_the_attach)
{
	uint64_t present, total;
	unsigned long ino;
	chime_t *c = copen();

	cr_assert_not_null(c);
	ino = mapping_inode("chime-client-rw");
	cr_assert_neq(ino, 0ul, "no mapping of the rw segment");
	pages_mapped_by(tb.pid, ino, &present, &total);
	cr_assert_eq(present, total, "%llu pages of the rw segment's %llu are not in the broker's page tables",
		     (unsigned long long)(total - present), (unsigned long long)total);
	chime_close(c);
}

/* Process pid's major page faults so far (/proc/PID/stat, field 12). */
static uint64_t major_faults(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long v = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	cr_assert_gt(n, 0);
	buf[n] = 0;
	p = strrchr(buf, ')');  /* after "PID (COMM)", which may hold anything */
	cr_assert(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %llu", &v) == 1);
	return v;
}

/* The host's swap, from /proc/meminfo: 0 without. */
static uint64_t swap_total_kb(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	unsigned long long kb = 0;
	char line[128];

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "SwapTotal: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}

/*
 * The attack the case above closes for rw, and the touch table's, end to
 * end: a client that pages out all its memory (MADV_PAGEOUT on the
 * library's own mappings) while its timers are armed, tagged, reset and
 * fired makes the broker wait for no swap-in: its major faults stay
 * where they were. Before, a broker took 12-15 major faults in such a
 * round (its shards' first accesses of rw's claim words and of the
 * table's pages it had found resident), each a wait on the disk. Only
 * with swap: without, MADV_PAGEOUT moves nothing and this proves nothing.
 */
AsanTest(hostile, a_client_paging_its_memory_out_costs_the_broker_no_major_fault, .timeout = 60)
{
	static const char *const names[] = { "chime-client-rw", "chime-client-touch" };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	struct chime_event ev[256];
	uint64_t before, after;
	chime_id_t id;
	chime_t *c;

	if (swap_total_kb() == 0)
		cr_skip("no swap on this host: MADV_PAGEOUT moves nothing");
	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 2"), 0);
	o.socket_path = b.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	/* Table windows allocated by the library, tagged by the shards, found resident in their idle moments. */
	for (unsigned i = 0; i < 100000; i++) {
		cr_assert_eq(chime_arm(c, 2, UINT64_MAX, 0, i, &id), 0);
		if (i % 4096 == 4095)
			usleep(20000);
	}
	cr_assert_eq(chime_flush(c), 0);
	usleep(200 * 1000);
	before = major_faults(b.pid);
	for (int round = 0; round < 3; round++) {
		uint64_t t0 = now_ns();
		unsigned got = 0;

		for (int k = 0; k < 2; k++) {
			size_t len = 0;
			void *p = mapping_of(names[k], &len);

			cr_assert_not_null(p, "no mapping of the %s", names[k]);
			cr_assert_eq(madvise(p, len, MADV_PAGEOUT), 0, "MADV_PAGEOUT: %s", strerror(errno));
		}
		for (unsigned i = 0; i < 20000; i++) {
			cr_assert_eq(chime_arm(c, 1, t0 + 20 * MS + i * 1000, 0, i, &id), 0);
			if (i % 2)
				cr_assert_eq(chime_reset(c, id, t0 + 30 * MS + i * 1000), 0);
		}
		while (got < 20000) {
			int n = chime_wait(c, ev, 256, 2000);

			cr_assert_gt(n, 0, "round %d: %u of 20000 timers fired", round, got);
			got += (unsigned)n;
		}
	}
	after = major_faults(b.pid);
	fprintf(stderr, "a client paging its memory out: the broker's major faults %llu -> %llu\n",
		(unsigned long long)before, (unsigned long long)after);
	cr_assert_eq(after, before, "the broker took %llu major faults on a client's paged-out memory",
		     (unsigned long long)(after - before));
	chime_close(c);
	t_chimed_stop(&b, SIGTERM);
}

/*
 * An attach whose client does not seal, seals before it has faulted its rw
 * segment in (the broker would then allocate pages that, sealed, it could
 * never punch back), or answers the welcome with anything else is refused
 * (-EPROTO) before anything is attached; one that never answers is closed
 * after the hello's time (HELLO_TIMEOUT_S, 2 s, -ETIMEDOUT). Meanwhile
 * others attach and their timers fire, and each refused slot is free again:
 * a broker of five slots (as many as the test takes at once, should none
 * come back before the next hello), all five open at once at the end (five
 * opens one after another, at 64 slots, passed with slots kept: an audit).
 */
AsanTest(hostile, attaches_unsealed_unfaulted_silent_or_malformed_are_refused)
{
	static const enum t_answer bad[] = { T_ANSWER_UNSEALED, T_ANSWER_UNFAULTED, T_ANSWER_MALFORMED };
	struct chime_welcome w;
	struct chime_event ev;
	uint64_t t0, took;
	chime_id_t id;
	chime_t *c;
	chime_t *all[5] = { NULL };
	unsigned open = 0;
	int fd, silent, r;

	t_chimed_stop(&tb, SIGKILL);
	cr_assert_eq(t_chimed_start(&tb, NULL, "--shards 2 --max-clients 5"), 0, "chimed did not come up");
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fd = raw_attach_hello();
		cr_assert_eq(t_answer_offer_as(fd, bad[i], NULL, NULL), 0);
		r = t_attach_answer(fd);
		cr_assert_eq(r, -EPROTO, "answer %u to the welcome: %d, not refused", (unsigned)bad[i], r);
		close(fd);
	}
	silent = raw_attach_hello();
	cr_assert_eq(recv(silent, &w, sizeof(w), 0), (ssize_t)sizeof(w), "no welcome");   /* its descriptors dropped */
	cr_assert_eq(w.status, 0);
	t0 = now_ns();
	c = copen();
	cr_assert_not_null(c, "an open while a client keeps its welcome unanswered");
	cr_assert_eq(chime_arm(c, 1, now_ns() + 10 * MS, 0, 1, &id), 0);
	cr_assert_eq(chime_wait(c, &ev, 1, 2000), 1);
	cr_assert_eq(t_attach_answer(silent), -ETIMEDOUT);
	took = now_ns() - t0;
	cr_assert(took >= 1500 * MS && took < 6000 * MS, "the silent client was closed after %llu ms",
		  (unsigned long long)(took / MS));
	close(silent);
	chime_close(c);
	/* Every slot back (a closed one is reclaimed by its shards first: a moment). */
	for (int i = 0; i < 300 && open < 5; i++) {
		for (unsigned k = 0; k < 5; k++)
			if (!all[k] && chime_open(&all[k], &(struct chime_opts){ .socket_path = tb.sock }) == 0)
				open++;
		if (open < 5)
			usleep(10 * 1000);
	}
	cr_assert_eq(open, 5, "%u opens at once after the refusals, at --max-clients 5: slots kept", open);
	for (unsigned k = 0; k < 5; k++)
		chime_close(all[k]);
}

/*
 * Punching a segment's pages out tears them out of every mapping of it,
 * and a client may map its segments thousands of times, faulted in (at
 * its own cost): a review measured 1.6 s for 1 MiB under 60,000 such
 * mappings. The broker does it on a thread of its own (discard.c), so
 * the control thread goes on answering: opens right after such a
 * client's close take no longer than usual.
 */
AsanTest(hostile, a_segment_mapped_many_times_does_not_stall_the_broker_at_the_close)
{
	enum { MAPS = 20000 };
	void **maps = calloc(MAPS, sizeof(*maps));
	uint64_t t0, worst = 0, setup;
	struct stat st;
	chime_t *c, *d;
	int ro, n = 0;

	cr_assert_not_null(maps);
	c = copen();
	cr_assert_not_null(c);
	ro = memfd_of_mapping("chime-client-ro");
	if (ro < 0)
		cr_skip("cannot open the mapped memfd through /proc/self/map_files (needs root): %s", strerror(errno));
	cr_assert_eq(fstat(ro, &st), 0);
	t0 = now_ns();
	for (; n < MAPS; n++) {
		maps[n] = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, ro, 0);
		if (maps[n] == MAP_FAILED)
			break;
	}
	setup = now_ns() - t0;
	cr_assert_gt(n, MAPS / 4, "only %d mappings: %s", n, strerror(errno));
	chime_close(c);
	/* Opens for 1.5 s after the close: the slowest is what a stall would show. */
	for (t0 = now_ns(); now_ns() - t0 < 1500 * MS;) {
		uint64_t a = now_ns(), took;

		d = copen();
		took = now_ns() - a;
		cr_assert_not_null(d);
		chime_close(d);
		if (took > worst)
			worst = took;
	}
	for (int i = 0; i < n; i++)
		munmap(maps[i], (size_t)st.st_size);
	free(maps);
	close(ro);
	fprintf(stderr, "%d mappings of %lld bytes set up in %llu ms; slowest open after the close %llu ms\n", n,
		(long long)st.st_size, (unsigned long long)(setup / MS), (unsigned long long)(worst / MS));
	cr_assert_lt(worst, 300 * MS, "an open took %llu ms after a client with %d mappings of its segment closed",
		     (unsigned long long)(worst / MS), n);
}

/* Mappings in process pid (/proc/PID/maps lines), or -1. */
static int maps_of(int pid)
{
	char path[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strchr(line, '\n') != NULL;
	fclose(f);
	return n;
}

/*
 * The segments of a connection that ended are emptied by the broker's
 * helper process, at idle priority (discard.c), which any user can
 * starve of CPU (busy loops beside the broker), or hold up with one slow
 * punch. Until it runs, each connection handed to it stays held by the
 * broker (mapped, as it was, when the helper was a thread; its
 * descriptors now), with the pages it faulted and the client's own (its
 * touch table: up to 96 MiB), in no process once the client exits:
 * a user opening and closing in a loop meanwhile queued every one of
 * them, without bound (an audit: 80 a second with one busy loop on the
 * broker's CPU; at vm.max_map_count every mmap of the broker fails, for
 * every user). Now at most --max-clients-per-uid of a user's connections
 * wait for the helper; the others are closed at once (their pages go
 * with the client's close), and nobody is refused. The helper is held
 * here with ptrace, as a starved one would be.
 */
AsanTest(hostile, a_starved_discard_helper_holds_at_most_a_users_share_of_its_connections)
{
	enum { PER_UID = 4, OPENS = 200 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	unsigned ok = 0, failed = 0;
	int tid, r, maps0, maps1, fds0, fds1, err = 0;
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1 --max-clients-per-uid 4"), 0);
	o.socket_path = b.sock;
	/* the broker's mappings with one connection come and gone (its first maps arenas, say) */
	cr_assert_eq(chime_open(&c, &o), 0);
	chime_close(c);
	usleep(200000);
	maps0 = maps_of(b.pid);
	fds0 = t_open_fds(b.pid);
	/* the helper, waiting for its next job */
	for (int i = 0; i < 200 && ((tid = t_child_named(b.pid, "chimed-discard")) <= 0 || !t_thread_asleep(tid, tid));
	     i++)
		usleep(10000);
	cr_assert_gt(tid, 0, "no chimed-discard helper");
	r = t_thread_hold(tid);
	if (r < 0) {
		t_chimed_stop(&b, SIGKILL);
		cr_skip("ptrace(PTRACE_SEIZE) of the discard helper: %s", strerror(-r));
	}
	/* Nothing asserted while the helper is held: a failure would leave it so. */
	for (unsigned i = 0; i < OPENS; i++) {
		r = chime_open(&c, &o);
		if (r == 0) {
			ok++;
			chime_close(c);
		} else {
			failed++;
			err = r;
			usleep(1000);
		}
	}
	usleep(200000);         /* the last closes released */
	maps1 = maps_of(b.pid);
	fds1 = t_open_fds(b.pid);
	cr_assert_eq(t_thread_release(tid), 0);
	fprintf(stderr, "discard helper held: %u opens, %u failed; broker mappings %d -> %d, descriptors %d -> %d\n",
		ok, failed, maps0, maps1, fds0, fds1);
	cr_assert_eq(failed, 0, "%u opens failed while the discard helper was held: %s", failed, strerror(-err));
	/* 3 mappings a connection (rw, ro, touch table) */
	cr_assert_leq(maps1 - maps0, 3 * PER_UID + 2, "the broker holds %d more mappings after %u connections",
		      maps1 - maps0, ok);
	/* the broker keeps the memfds' descriptors until the helper takes them (discard.h), 3 a connection */
	cr_assert_leq(fds1 - fds0, 3 * PER_UID + 2, "the broker holds %d more descriptors after %u connections",
		      fds1 - fds0, ok);
	/*
	 * Polled, not one reading: the connections' last closes may still be
	 * on their way through the control loop.
	 */
	for (int i = 0; i < 1000 && (maps1 = maps_of(b.pid)) > maps0; i++)
		usleep(10000);
	cr_assert_leq(maps1, maps0, "the broker's mappings did not come back to %d: %d", maps0, maps1);
	t_chimed_stop(&b, SIGTERM);
}

/*
 * The broker at rest beats every 450 ms, and a completion on its control
 * ring (a connection, a hang-up, a query) ends the rest. It beat at once
 * then, and the heartbeat is in the public segment every client maps: a
 * client watching it at rest saw another user's connect or hang-up to
 * within 1-5 ms (8 of 8 in an audit's probe), a signal the rest added (at
 * 90 ms a connect changed nothing). The beat that ends a rest keeps to
 * the 90 ms grid of the last one, so what shows is that something
 * happened within a 90 ms window, the cadence's own signal. A round in
 * which the host's wall clock was set (by anyone) is not counted as one
 * at rest or not: a set rightly ends the rest (t_clock_watch()).
 */
AsanTest(hostile, a_rest_ended_by_another_connection_does_not_time_it_to_the_millisecond)
{
	enum { ROUNDS = 8 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	const struct chime_pub *pub;
	unsigned close_calls = 0, rested = 0, clock_sets = 0;
	int clock_watch = t_clock_watch();
	uint64_t d[ROUNDS];
	char seen[ROUNDS * 12] = "";
	chime_t *c;

	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1"), 0);
	o.socket_path = b.sock;
	cr_assert_eq(chime_open(&c, &o), 0);
	pub = find_mapping("chime-public");
	cr_assert_not_null(pub);
	t_at_rest_within(b.sock, 1500); /* QUIET_BEATS: at rest */
	for (unsigned k = 0; k < ROUNDS; k++) {
		uint64_t hb0 = at_load(&pub->heartbeat_ns), hb, t;
		int fd;

		/* somewhere in the idle beat's 450 ms, another connection comes and goes */
		while (at_load(&pub->heartbeat_ns) == hb0)
			usleep(200);
		hb0 = at_load(&pub->heartbeat_ns);
		usleep(120000 + (k * 37 % 200) * 1000);
		if (t_clock_was_set(clock_watch))
			clock_sets++;   /* since the last round's check: this round's rest says nothing */
		else
			rested += at_load(&pub->heartbeat_ns) == hb0;   /* no beat within 120 ms: at rest */
		hb0 = at_load(&pub->heartbeat_ns);
		t = now_ns();
		fd = t_sock_connect(b.sock);
		cr_assert_geq(fd, 0);
		close(fd);
		while ((hb = at_load(&pub->heartbeat_ns)) == hb0 && now_ns() - t < 1000 * MS)
			usleep(100);
		d[k] = hb > t ? hb - t : 0;
		close_calls += d[k] < 5 * MS;
		snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), " %.1f", (double)d[k] / 1e6);
		t_at_rest_within(b.sock, 1300); /* at rest again */
	}
	fprintf(stderr, "the next heartbeat came after another connection, ms:%s\n", seen);
	if (clock_sets > ROUNDS / 2) {
		chime_close(c);
		t_chimed_stop(&b, SIGTERM);
		cr_skip("the host's wall clock was set in %u of %u rounds (by another process): a set rightly "
			"ends a rest, so too few rounds measured one", clock_sets, ROUNDS);
	}
	cr_assert_geq(rested + 2, ROUNDS - clock_sets, "the broker was at rest in only %u of %u rounds (%u more "
		      "not counted: the host's wall clock was set)", rested, ROUNDS - clock_sets, clock_sets);
	/* on a 90 ms grid: 5 ms of it is 1 chance in 18 a round */
	cr_assert_leq(close_calls, 3, "%u of %u connections were followed by a heartbeat within 5 ms:%s", close_calls,
		      ROUNDS, seen);
	chime_close(c);
	t_chimed_stop(&b, SIGTERM);
	if (clock_watch >= 0)
		close(clock_watch);
}

struct hb_watch {
	const struct chime_pub *pub;
	volatile bool stop;
	uint64_t worst_age;
};

/* The oldest heartbeat seen, sampled every 500 us by a thread of its own (an open may wait for the broker). */
static void *hb_watch(void *arg)
{
	struct hb_watch *w = arg;

	while (!w->stop) {
		uint64_t t = now_ns(), hb = at_load(&w->pub->heartbeat_ns);

		if (t > hb && t - hb > w->worst_age)
			w->worst_age = t - hb;
		usleep(500);
	}
	return NULL;
}

static void busy_as_nobody(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	for (;;)
		;
}

/*
 * The discard helper runs at idle priority, and any user can starve it of
 * CPU with busy loops. As a thread of the broker's, it punched through
 * the broker's mappings (MADV_REMOVE) and unmapped them, holding the
 * broker's mmap_lock, and was preempted there: the control thread's next
 * mmap (every chime_open()) waited until the starved thread ran again,
 * heartbeat and all. With clients opening and closing on 2 CPUs and 3
 * busy loops of another user, an audit saw heartbeats 250-909 ms old (a
 * client takes one a second old for a dead broker) and opens of 205-826
 * ms; 93 ms and 17-48 ms once the thread punched through descriptors and
 * the control thread unmapped. Here the helper shares a CPU with 24 busy
 * loops of user 65534, the rest of the broker and this process, opening
 * and closing, the other CPU: before, heartbeats 703-1337 ms old and
 * opens of 703-1280 ms (5 runs); then 90-100 ms and 11-64 ms, but a
 * thread that exited after each job still stalled it now and then
 * (heartbeats 2.3 and 3.9 s old in 2 of 8 runs with each new thread
 * pinned here, 3.5 s once in CI unpinned; discard.h). The helper is a
 * process now, pinned here for the whole run.
 */
ReleaseTest(hostile, a_starved_discard_helper_does_not_stall_the_control_thread, .timeout = 30)
{
	enum { BUSY = 24, SECS = 3 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	struct hb_watch w = { 0 };
	uint64_t t0, worst_open = 0;
	pthread_t watcher;
	pid_t busy[BUSY];
	cpu_set_t set;
	unsigned opens = 0;
	int tid;
	chime_t *me, *c;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1"), 0);
	o.socket_path = b.sock;
	for (int i = 0; i < 200 && (tid = t_child_named(b.pid, "chimed-discard")) <= 0; i++)
		usleep(10000);  /* it names itself once it runs */
	cr_assert_gt(tid, 0, "no chimed-discard helper");
	cr_assert_gt(t_pin_threads(b.pid, 0), 0);
	CPU_ZERO(&set);
	CPU_SET(1, &set);
	cr_assert_eq(sched_setaffinity(tid, sizeof(set), &set), 0);
	cr_assert_gt(t_pin_threads(getpid(), 0), 0);   /* our opens and samples beside the broker, not the loops */
	cr_assert_eq(chime_open(&me, &o), 0);
	w.pub = find_mapping("chime-public");
	cr_assert_not_null(w.pub);
	cr_assert_eq(pthread_create(&watcher, NULL, hb_watch, &w), 0);
	for (int i = 0; i < BUSY; i++) {
		busy[i] = fork();
		cr_assert_geq(busy[i], 0);
		if (busy[i] == 0)
			busy_as_nobody(1);
	}
	/* Nothing asserted while the loops run: a failure would leave them running. */
	for (t0 = now_ns(); now_ns() - t0 < SECS * 1000 * MS;) {
		uint64_t t = now_ns();

		if (chime_open(&c, &o) == 0) {
			opens++;
			chime_close(c);
		}
		t = now_ns() - t;
		if (t > worst_open)
			worst_open = t;
	}
	w.stop = true;
	pthread_join(watcher, NULL);
	for (int i = 0; i < BUSY; i++)
		kill(busy[i], SIGKILL);
	for (int i = 0; i < BUSY; i++)
		waitpid(busy[i], NULL, 0);
	fprintf(stderr, "discard helper starved: %u opens, the oldest heartbeat %llu ms, the slowest open %llu ms\n",
		opens, (unsigned long long)(w.worst_age / MS), (unsigned long long)(worst_open / MS));
	cr_assert_lt(w.worst_age, 500 * MS, "a heartbeat %llu ms old (a client takes a second for a dead broker)",
		     (unsigned long long)(w.worst_age / MS));
	cr_assert_lt(worst_open, 500 * MS, "an open took %llu ms", (unsigned long long)(worst_open / MS));
	chime_close(me);
	t_chimed_stop(&b, SIGTERM);
}

/*
 * chimed as on a kernel before Linux 6.16 (Debian 12's 6.1), whose
 * listening socket takes descriptors from anyone: no_passrights.so,
 * preloaded, refuses its SO_PASSRIGHTS. Not under a sanitizer, whose
 * runtime must come first.
 */
static void start_without_passrights(struct t_chimed *b)
{
	const char *so = getenv("CHIME_NO_PASSRIGHTS");

#if defined(__SANITIZE_ADDRESS__)
	cr_skip("chimed preloaded with no_passrights.so: not under ASan");
#endif
	if (!so || access(so, R_OK) < 0)
		cr_skip("$CHIME_NO_PASSRIGHTS names no no_passrights.so (meson test sets it)");
	cr_assert_eq(setenv("LD_PRELOAD", so, 1), 0);
	cr_assert_eq(t_chimed_start(b, NULL, "--shards 1"), 0);
	unsetenv("LD_PRELOAD");
}

/* A broker of one shard (as before Linux 6.16 if asked), our client on it and settled, the heartbeat watch's segment. */
static chime_t *linger_broker(struct t_chimed *b, struct chime_opts *o, struct hb_watch *w, bool without_passrights)
{
	uint64_t opened;
	chime_t *me;

	if (without_passrights)
		start_without_passrights(b);
	else
		cr_assert_eq(t_chimed_start(b, NULL, "--shards 1"), 0);
	o->socket_path = b->sock;
	cr_assert_eq(chime_open(&me, o), 0);
	opened = now_ns();
	w->pub = find_mapping("chime-public");
	cr_assert_not_null(w->pub);
	/*
	 * The open's pass over: it answers first and then opens our pidfd
	 * (arm_hup()), so a count of the broker's descriptors taken at once
	 * could miss it (a base of 25, 26 at the end, in CI). A heartbeat
	 * taken after the answer came is a later pass.
	 */
	while (at_load(&w->pub->heartbeat_ns) <= opened && now_ns() - opened < 2000 * MS)
		usleep(1000);
	cr_assert_gt(at_load(&w->pub->heartbeat_ns), opened, "no heartbeat in 2 s");
	return me;
}

/*
 * A descriptor a client sends over its connection is the broker's once
 * read, or once the connection is closed with it unread, and its close,
 * the last reference being ours, runs on the control thread. Some closes
 * wait: a TCP socket with SO_LINGER, its send queue stuck behind a window
 * its peer keeps shut, waits up to its linger time (the sender's choice,
 * without bound) in tcp_close(). An audit's client said hello, sent one
 * such socket in a second message and hung up: the control thread was in
 * sk_stream_wait_close() for the whole 5 s, every open and heartbeat
 * waiting (an open of 5213 ms), and the watchdog ends the broker long
 * before such a wait does. The listening socket refuses descriptors now
 * (SO_PASSRIGHTS, Linux 6.16): the sendmsg() is EPERM. Here, a linger
 * of 3 s: before, heartbeats 3228-3281 ms old and opens of 3202-3253 ms
 * (2 runs; 2046-2056 ms with 2 s, 3 runs); after, 90 ms and 4 ms, and up
 * to 313 ms beside the cases with busy loops. (A wait begun while the control
 * ring has work pending is cut short by its task_work notification, which
 * is why the client lets the broker go idle first: without the pause, no
 * stall in 3 runs.)
 */
ReleaseTest(hostile, a_descriptor_a_client_sends_cannot_hold_up_the_control_thread, .timeout = 30)
{
	enum { LINGER_S = 3 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	struct hb_watch w = { 0 };
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = "x", .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	uint64_t t0, worst_open = 0;
	pthread_t watcher;
	int sv[2], t, peer, listener, u, sent;
	chime_t *me, *c;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
#ifdef SO_PASSRIGHTS
	if (setsockopt(sv[0], SOL_SOCKET, SO_PASSRIGHTS, &(int){ 0 }, sizeof(int)) < 0)
#endif
		cr_skip("no SO_PASSRIGHTS (Linux 6.16): the broker cannot refuse descriptors here (%s)", strerror(errno));
	close(sv[0]);
	close(sv[1]);
	me = linger_broker(&b, &o, &w, false);
	t = t_lingering_tcp_socket(LINGER_S, &peer, &listener);
	cr_assert_geq(t, 0, "no lingering TCP socket: %s", strerror(errno));
	u = t_sock_connect(b.sock);
	cr_assert_geq(u, 0);
	cr_assert_eq(send(u, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_eq(pthread_create(&watcher, NULL, hb_watch, &w), 0);
	usleep(100 * 1000);     /* the welcome sent and the broker idle: nothing of its ring to cut the wait short */
	/* After the hello: left unread, it is dropped as the broker closes its end, ours closed first. */
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &t, sizeof(t));
	sent = sendmsg(u, &mh, MSG_NOSIGNAL) == 1 ? 0 : errno;
	/* Ours lingers here (our own, without the broker) when the broker refused it. */
	if (sent) {
		struct linger lg = { 0 };

		(void)setsockopt(t, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	close(t);
	close(u);
	for (t0 = now_ns(); now_ns() - t0 < (LINGER_S * 1000 + 500) * MS;) {
		uint64_t s = now_ns();

		if (chime_open(&c, &o) == 0)
			chime_close(c);
		s = now_ns() - s;
		if (s > worst_open)
			worst_open = s;
		usleep(10000);
	}
	w.stop = true;
	pthread_join(watcher, NULL);
	close(peer);
	close(listener);
	fprintf(stderr, "a lingering socket sent to the broker (sendmsg: %s): the oldest heartbeat %llu ms, "
		"the slowest open %llu ms\n", sent ? strerror(sent) : "sent", (unsigned long long)(w.worst_age / MS),
		(unsigned long long)(worst_open / MS));
	/* Roomy: the cases beside this one run busy loops. */
	cr_assert_lt(w.worst_age, 1000 * MS, "a heartbeat %llu ms old", (unsigned long long)(w.worst_age / MS));
	cr_assert_lt(worst_open, 1000 * MS, "an open took %llu ms", (unsigned long long)(worst_open / MS));
	cr_assert_eq(sent, EPERM, "the broker took a descriptor from a client (sendmsg: %s)", sent ? strerror(sent) : "sent");
	chime_close(me);
	t_chimed_stop(&b, SIGTERM);
}

/* Heartbeats and opens beside a broker for ms: the oldest heartbeat and the slowest open seen. */
static void watch_broker(struct hb_watch *w, const struct chime_opts *o, uint64_t ms, uint64_t *worst_open)
{
	pthread_t watcher;

	*worst_open = 0;
	cr_assert_eq(pthread_create(&watcher, NULL, hb_watch, w), 0);
	for (uint64_t t0 = now_ns(); now_ns() - t0 < ms * MS;) {
		uint64_t s = now_ns();
		chime_t *c;

		if (chime_open(&c, o) == 0)
			chime_close(c);
		s = now_ns() - s;
		if (s > *worst_open)
			*worst_open = s;
		usleep(10000);
	}
	w->stop = true;
	pthread_join(watcher, NULL);
}

/* Send one byte on fd with descriptor `carried` (SCM_RIGHTS): 0 or -errno. */
static int send_with_fd(int fd, const void *buf, size_t len, int carried)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &carried, sizeof(int));
	return sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

/*
 * A raw client attached to the broker at sock that then sends descriptor
 * t in a message the broker never reads, and closes its own t: the
 * broker's reference is the last. Returns the connection.
 */
static int attached_sending_fd(const char *sock, int t)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	int u = t_sock_connect(sock);

	cr_assert_geq(u, 0);
	cr_assert_eq(send(u, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_eq(t_answer_offer(u), 0);
	cr_assert_eq(t_attach_answer(u), 0);
	cr_assert_eq(send_with_fd(u, "x", 1, t), 0, "a message with a descriptor once attached");
	close(t);
	return u;
}

/*
 * Before Linux 6.16 nothing refuses a client's descriptors, and a
 * descriptor the broker drops has its last close where the broker drops
 * it: a TCP socket set to linger (3 s here) then holds that thread. The
 * broker receives every message with room for them and closes each on a
 * closer thread, and closes every client socket there too, whose queue may
 * hold more (close_sent_fds(), close_aside()). Two ways in: a message
 * with descriptors sent once attached, which the broker never reads,
 * before the hang-up (closed with the socket by the control thread before:
 * heartbeats 3152 ms old, an open of 3109 ms); and descriptors with the
 * hello, sent, and ours closed, while the control thread is held under
 * ptrace, so that the broker's reference is the last (on this 6.18
 * kernel that way did not hold the control thread even when io_uring's
 * receive dropped them: kept as a guard).
 */
ReleaseTest(hostile, descriptors_a_client_sends_before_linux_6_16_cannot_hold_up_the_control_thread,
	    .timeout = 60)
{
	enum { LINGER_S = 3 };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	uint64_t worst_open;
	int t, peer, listener, u;
	chime_t *me;

	struct hb_watch first = { 0 };

	me = linger_broker(&b, &o, &first, true);
	for (int way = 0; way < 2; way++) {
		struct hb_watch w = { .pub = first.pub };

		t = t_lingering_tcp_socket(LINGER_S, &peer, &listener);
		cr_assert_geq(t, 0, "no lingering TCP socket: %s", strerror(errno));
		if (way == 0) {
			int r = t_thread_hold(b.pid);

			if (r < 0)
				cr_skip("ptrace(PTRACE_SEIZE) of the control thread: %s", strerror(-r));
			u = t_sock_connect(b.sock);     /* in the listening queue until the thread runs */
			cr_assert_geq(u, 0);
			cr_assert_eq(send_with_fd(u, &h, sizeof(h), t), 0, "the hello with a descriptor");
			close(t);
			cr_assert_eq(t_thread_release(b.pid), 0);
		} else {
			u = attached_sending_fd(b.sock, t);
		}
		usleep(50 * 1000);
		close(u);
		watch_broker(&w, &o, LINGER_S * 1000 + 500, &worst_open);
		close(peer);
		close(listener);
		fprintf(stderr, "a lingering socket sent %s: the oldest heartbeat %llu ms, the slowest open %llu ms\n",
			way == 0 ? "with the hello" : "once attached", (unsigned long long)(w.worst_age / MS),
			(unsigned long long)(worst_open / MS));
		cr_assert_lt(w.worst_age, 1000 * MS, "%s: a heartbeat %llu ms old", way == 0 ? "hello" : "attached",
			     (unsigned long long)(w.worst_age / MS));
		cr_assert_lt(worst_open, 1000 * MS, "%s: an open took %llu ms", way == 0 ? "hello" : "attached",
			     (unsigned long long)(worst_open / MS));
	}
	chime_close(me);
	t_chimed_stop(&b, SIGTERM);
}

/*
 * The same descriptor sent with the answer to the welcome (struct
 * chime_mapped), which the broker reads: the broker receives it with the
 * answer and closes it on a closer thread (recv_mapped()), and refuses the
 * attach (-EPROTO). Dropped by a plain recv(), its last close ran on the
 * control thread and waited for the linger (heartbeats 3019 and 3257 ms
 * old). The answer goes right after the hello, and our descriptor is
 * closed before the broker has even sent its welcome: the broker's is the
 * last reference.
 */
ReleaseTest(hostile, a_descriptor_sent_with_the_answer_to_a_welcome_cannot_hold_up_the_control_thread,
	    .timeout = 30)
{
	enum { LINGER_S = 3 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	struct hb_watch w = { 0 };
	struct chime_mapped m = { .magic = CHIME_MAPPED_MAGIC };
	struct chime_welcome wl;
	uint64_t worst_open = 0;
	int t, peer, listener, u;
	chime_t *me;

	me = linger_broker(&b, &o, &w, true);
	t = t_lingering_tcp_socket(LINGER_S, &peer, &listener);
	cr_assert_geq(t, 0, "no lingering TCP socket: %s", strerror(errno));
	u = t_sock_connect(b.sock);
	cr_assert_geq(u, 0);
	cr_assert_eq(send(u, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_eq(send_with_fd(u, &m, sizeof(m), t), 0, "the answer with a descriptor");
	close(t);
	cr_assert_eq(recv(u, &wl, sizeof(wl), 0), (ssize_t)sizeof(wl), "no welcome");    /* its descriptors dropped */
	cr_assert_eq(t_attach_answer(u), -EPROTO, "an answer with a descriptor was taken");
	close(u);
	watch_broker(&w, &o, LINGER_S * 1000 + 500, &worst_open);
	close(peer);
	close(listener);
	fprintf(stderr, "a lingering socket sent with the answer to a welcome: the oldest heartbeat %llu ms, "
		"the slowest open %llu ms\n", (unsigned long long)(w.worst_age / MS),
		(unsigned long long)(worst_open / MS));
	cr_assert_lt(w.worst_age, 1000 * MS, "a heartbeat %llu ms old", (unsigned long long)(w.worst_age / MS));
	cr_assert_lt(worst_open, 1000 * MS, "an open took %llu ms", (unsigned long long)(worst_open / MS));
	chime_close(me);
	t_chimed_stop(&b, SIGTERM);
}

/* A thread's time on a CPU so far (schedstat), in ns. */
static uint64_t thread_runtime_ns(int pid, int tid)
{
	char path[64];
	unsigned long long ns = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", pid, tid);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%llu", &ns) != 1)
			ns = 0;
		fclose(f);
	}
	return ns;
}

/*
 * Each descriptor a client dups its doorbell to is a watch of its own in
 * an epoll instance, kept after the client closes them all, up to
 * fs.epoll.max_user_watches (5.5 million on a 24 GiB VM), and whoever
 * closes the eventfd's last reference removes them one by one. That was
 * the control thread at the client's hang-up: 1.9 million watches cost it
 * 620-670 ms of CPU, heartbeats 615-656 ms old and opens of 591-624 ms (a
 * stall audit, 3 runs), 3 times as long at the limit. One of the ring's
 * workers closes the doorbells now; the walk is still the kernel's, and
 * where it runs it holds its CPU (a preempt=none kernel does not preempt
 * it), as the client could by closing an eventfd of its own. Here, a
 * million watches: the control thread's CPU time across the hang-up,
 * before 319-383 ms, after 2 ms (2 runs each).
 */
ReleaseTest(hostile, a_clients_watches_on_its_doorbell_cost_the_control_thread_nothing_at_its_close, .timeout = 60)
{
	enum { WATCHES = 1000000 };
	struct t_chimed b = { 0 };
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	struct chime_welcome wl;
	char cbuf[CMSG_SPACE(sizeof(int) * 8)];
	struct iovec iov = { .iov_base = &wl, .iov_len = sizeof(wl) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct epoll_event ev = { .events = EPOLLIN };
	struct cmsghdr *cm;
	struct rlimit rl;
	int fds[8], nfds, u, nr_eps, per_ep, *eps;
	long added = 0;
	uint64_t before, spent = 0, t0;

	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = rl.rlim_max;
	(void)setrlimit(RLIMIT_NOFILE, &rl);
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 4096)
		cr_skip("RLIMIT_NOFILE %llu: too few descriptors for the watches", (unsigned long long)rl.rlim_cur);
	per_ep = rl.rlim_cur - 1024 > 20000 ? 20000 : (int)rl.rlim_cur - 1024;
	nr_eps = (WATCHES + per_ep - 1) / per_ep;
	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1"), 0);
	u = t_sock_connect(b.sock);
	cr_assert_geq(u, 0);
	cr_assert_eq(send(u, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	cr_assert_gt(recvmsg(u, &mh, MSG_CMSG_CLOEXEC), 0);
	cm = CMSG_FIRSTHDR(&mh);
	cr_assert(cm && cm->cmsg_type == SCM_RIGHTS && wl.status == 0, "no welcome (status %d)", wl.status);
	nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
	cr_assert_geq(nfds, 4);
	memcpy(fds, CMSG_DATA(cm), (size_t)nfds * sizeof(int));
	eps = calloc((size_t)nr_eps, sizeof(*eps));
	for (int e = 0; e < nr_eps; e++)
		cr_assert_geq(eps[e] = epoll_create1(EPOLL_CLOEXEC), 0);
	/* The doorbell (welcome fd 3) under per_ep descriptor numbers, each in every instance; then closed. */
	for (int k = 0; k < per_ep && added < WATCHES; k++) {
		int fd = 1000 + k;

		cr_assert_eq(dup2(fds[3], fd), fd, "dup2: %s", strerror(errno));
		for (int e = 0; e < nr_eps && added < WATCHES; e++) {
			if (epoll_ctl(eps[e], EPOLL_CTL_ADD, fd, &ev) < 0)
				cr_skip("epoll_ctl after %ld watches: %s (fs.epoll.max_user_watches)", added, strerror(errno));
			added++;
		}
		close(fd);
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	before = thread_runtime_ns(b.pid, b.pid);
	close(u);
	/* The hang-up, the shards' detach and the doorbell's close: all done well within a second. */
	for (t0 = now_ns(); now_ns() - t0 < 1500 * MS; usleep(10000))
		;
	spent = thread_runtime_ns(b.pid, b.pid) - before;
	fprintf(stderr, "%ld watches on a client's doorbell: the control thread ran %llu ms across its hang-up\n",
		added, (unsigned long long)(spent / MS));
	cr_assert_lt(spent, 150 * MS, "the control thread ran %llu ms (the watches' removal is not its own)",
		     (unsigned long long)(spent / MS));
	for (int e = 0; e < nr_eps; e++)
		close(eps[e]);
	free(eps);
	t_chimed_stop(&b, SIGTERM);
}

/*
 * A broker is reaped once every thread of it has exited, and the discard
 * thread waited for work at idle priority: killed beside busy loops (any
 * user's), it was the last to get a CPU, and the broker was gone only
 * then, its socket with it (a dead broker's ring holds it). On 2 CPUs
 * with 3 loops: SIGKILL to waitpid() 0.4-0.6 s (median of 10), up to 2.6
 * s; with a thread at idle priority only for its jobs, 10-20 ms (up to
 * 40). Here the broker shares a CPU with 3 loops: 153-497 ms before,
 * 6-25 ms after (10 and 9 rounds). The helper is a process of its own
 * now, and nobody waits for it.
 */
ReleaseTest(hostile, busy_loops_beside_a_killed_broker_do_not_hold_up_its_exit, .timeout = 30)
{
	enum { BUSY = 3, ROUNDS = 3 };
	struct t_misses m = { 0 };
	pid_t busy[BUSY];

	if (geteuid() != 0)
		cr_skip("needs root (to run the loops as another user)");
	for (unsigned k = 0; k < ROUNDS; k++) {
		struct t_chimed b = { 0 };
		uint64_t t;
		int st;

		cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1"), 0);
		cr_assert_gt(t_pin_threads(b.pid, 0), 0);
		for (int i = 0; i < BUSY; i++) {
			busy[i] = fork();
			cr_assert_geq(busy[i], 0);
			if (busy[i] == 0)
				busy_as_nobody(0);
		}
		usleep(50000);  /* the loops have the CPU */
		t = now_ns();
		kill(b.pid, SIGKILL);
		waitpid(b.pid, &st, 0);
		t = now_ns() - t;
		for (int i = 0; i < BUSY; i++)
			kill(busy[i], SIGKILL);
		for (int i = 0; i < BUSY; i++)
			waitpid(busy[i], NULL, 0);
		b.pid = 0;
		t_chimed_stop(&b, 0);   /* its directory */
		fprintf(stderr, "a broker killed beside %d busy loops was reaped after %.1f ms\n", BUSY, (double)t / 1e6);
		if (t > 100 * MS)
			t_missed(&m, "%.1f ms", (double)t / 1e6);
	}
	cr_assert_leq(m.n, 1, "%u of %u killed brokers were reaped after more than 100 ms: %s", m.n, ROUNDS, m.what);
}

/*
 * The closer thread that closes a client's lingering socket (the case
 * above) waits out the linger, which the client chose; a stop waits for
 * the closer's last closes 250 ms at most (CLOSER_STOP_WAIT_NS) and
 * leaves that one to the exit. Before (an io_uring worker, whose wait the
 * ring's teardown interrupted), a 20 s linger pending, the stop took
 * 1-3 ms here.
 */
ReleaseTest(hostile, a_descriptor_lingering_on_the_closer_does_not_hold_up_a_stop, .timeout = 60)
{
	enum { LINGER_S = 20 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	struct hb_watch w = { 0 };
	int t, peer, listener, u, st;
	unsigned closers;
	uint64_t t0, took;
	chime_t *me;

	me = linger_broker(&b, &o, &w, true);
	t = t_lingering_tcp_socket(LINGER_S, &peer, &listener);
	cr_assert_geq(t, 0, "no lingering TCP socket: %s", strerror(errno));
	u = attached_sending_fd(b.sock, t);
	usleep(50 * 1000);
	close(u);       /* the broker closes its end, and the socket in it, on the closer */
	usleep(500 * 1000);
	chime_close(me);
	closers = t_threads_prefixed(b.pid, "chimed-closer");
	t0 = now_ns();
	st = t_chimed_stop(&b, SIGTERM);
	took = now_ns() - t0;
	close(peer);
	close(listener);
	fprintf(stderr, "a stop with a %d s linger pending (%u closer threads): %llu ms\n", LINGER_S, closers,
		(unsigned long long)(took / MS));
	cr_assert_geq(closers, 1);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chimed's stop: status %#x", st);
	cr_assert_lt(took, 3000 * MS, "the stop took %llu ms", (unsigned long long)(took / MS));
}

/*
 * Each close a client holds up (a lingering socket, as above) holds one
 * of the closer's threads, and the heartbeat adds another while closes
 * wait behind it (aside_unstick(), up to CLOSER_THREADS): two clients
 * that each hung up with a 20 s linger in their connection leave the
 * broker free to close everyone else's descriptors. With one thread
 * and no more, an honest client's socket and doorbells stayed open
 * behind them for the whole linger.
 */
ReleaseTest(hostile, lingering_closes_do_not_keep_other_clients_descriptors_open, .timeout = 90)
{
	enum { LINGER_S = 20, HONEST = 8 };
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	struct hb_watch w = { 0 };
	int t[2], peer[2], listener[2], u[2], base, now_open = 0;
	uint64_t t0, took = 0;
	chime_t *me;

	me = linger_broker(&b, &o, &w, true);
	base = t_open_fds(b.pid);
	cr_assert_gt(base, 0);
	for (int i = 0; i < 2; i++) {
		t[i] = t_lingering_tcp_socket(LINGER_S, &peer[i], &listener[i]);
		cr_assert_geq(t[i], 0, "no lingering TCP socket: %s", strerror(errno));
		u[i] = attached_sending_fd(b.sock, t[i]);
	}
	usleep(50 * 1000);
	for (int i = 0; i < 2; i++)
		close(u[i]);
	usleep(200 * 1000);     /* both lingering on the closer's threads */
	for (int i = 0; i < HONEST; i++) {
		chime_t *c;

		cr_assert_eq(chime_open(&c, &o), 0);
		chime_close(c);
	}
	/* Every descriptor of theirs closed: the broker's count back where it was. */
	t0 = now_ns();
	while ((now_open = t_open_fds(b.pid)) > base && (took = now_ns() - t0) < 10000 * MS)
		usleep(20 * 1000);
	fprintf(stderr, "%d clients' descriptors closed behind two lingering closes in %llu ms "
		"(%d open, %d before; %u closer threads)\n", HONEST, (unsigned long long)(took / MS), now_open, base,
		t_threads_prefixed(b.pid, "chimed-closer"));
	cr_assert_leq(now_open, base, "%d descriptors open, %d before, after %llu ms", now_open, base,
		      (unsigned long long)(took / MS));
	cr_assert_lt(took, 3000 * MS, "closed after %llu ms", (unsigned long long)(took / MS));
	for (int i = 0; i < 2; i++) {
		close(peer[i]);
		close(listener[i]);
	}
	chime_close(me);
	cr_assert_eq(t_chimed_stop(&b, SIGTERM), 0);
}

/* Whether process pid maps the file with inode ino. */
static bool maps_inode(pid_t pid, unsigned long ino)
{
	char path[64], line[512];
	unsigned long i;
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%*s %*s %*s %*s %lu", &i) == 1 && i == ino;
	fclose(f);
	return found;
}

/*
 * A refused attach whose client never sealed leaves the broker its own
 * mappings of the client's rw segment and touch table: sealed against
 * writes first, then let go (discard_post()), and while they wait they
 * count against a quarter of the user's share of connections (two here,
 * of two segments each). Let go each time: the user is never locked out
 * by refusals in a row. (A refused slot stays HELD until the next
 * heartbeat if its refusal was still unread when the shards let go, and
 * HELD slots have a quarter of the share too: each round waits for that.)
 */
AsanTest(hostile, a_refused_unsealed_clients_segments_are_sealed_then_let_go)
{
	struct t_chimed b = { 0 };

	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1 --max-clients-per-uid 8"), 0);
	for (int round = 0; round < 4; round++) {
		int kept[16], n = 0, fd = t_raw_hello(b.sock, NULL, 0, CHIME_HELLO_TOUCH), r;
		unsigned long ino[2];
		struct stat st;
		bool gone = false;

		cr_assert_geq(fd, 0);
		r = t_answer_offer_as(fd, T_ANSWER_UNSEALED, kept, &n);
		cr_assert_eq(r, 0, "round %d: %s", round, strerror(-r));
		cr_assert_eq(t_attach_answer(fd), -EPROTO, "round %d: an unsealed answer was not refused", round);
		cr_assert_eq(n, 5, "a welcome of one shard with a touch table has 5 descriptors, not %d", n);
		for (int k = 0; k < 2; k++) {
			cr_assert_eq(fstat(kept[k ? n - 1 : 1], &st), 0);
			ino[k] = st.st_ino;
		}
		for (int i = 0; i < 300 && !gone; i++) {
			gone = !maps_inode(b.pid, ino[0]) && !maps_inode(b.pid, ino[1]);
			if (!gone)
				usleep(10000);
		}
		cr_assert(gone, "round %d: the broker still maps the refused client's segments after 3 s", round);
		for (int k = 0; k < 2; k++) {
			int seals = fcntl(kept[k ? n - 1 : 1], F_GET_SEALS);

			cr_assert(seals >= 0 && (seals & F_SEAL_FUTURE_WRITE), "round %d: segment %d let go unsealed: %#x",
				  round, k, seals);
		}
		for (int i = 0; i < n; i++)
			close(kept[i]);
		close(fd);
		usleep(600 * 1000);     /* a heartbeat at rest: the slot is no longer HELD */
	}
	t_chimed_stop(&b, SIGTERM);
}

/* The broker's first welcome on sock, taken by hand: its descriptors into fds[16]; how many. */
static int welcome_fds(int sock, int *fds)
{
	struct chime_welcome w = { 0 };
	union {
		char buf[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;
	int n;

	cr_assert_eq(recvmsg(sock, &mh, MSG_CMSG_CLOEXEC), (ssize_t)sizeof(w));
	cm = CMSG_FIRSTHDR(&mh);
	cr_assert_not_null(cm, "a welcome without descriptors (status %d)", w.status);
	n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
	memcpy(fds, CMSG_DATA(cm), (size_t)n * sizeof(int));
	return n;
}

/* A refused client's rw segment, mapped many times over and punched while the broker lets go of it. */
struct punch_loop {
	int rw;
	void **maps;
	int n;
	size_t size;
	atomic_int stop, punching;
	uint64_t punch_ns[8];
	int punches;
};

/*
 * Punch all of rw, every mapping faulted in (the first time by the caller):
 * as long as the mappings make it, each time; then fault them in again.
 */
static void *punch_loop_main(void *arg)
{
	struct punch_loop *p = arg;

	while (!atomic_load(&p->stop) && p->punches < 8) {
		uint64_t t0;

		atomic_store(&p->punching, 1);
		t0 = now_ns();
		(void)fallocate(p->rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)p->size);
		p->punch_ns[p->punches++] = now_ns() - t0;
		for (int i = 0; i < p->n; i++)
			(void)madvise(p->maps[i], p->size, MADV_POPULATE_WRITE);
	}
	return NULL;
}

/* For 1 s: the longest the broker's control thread (its main thread) spent in a file mapping's unlink. */
struct wchan_watch {
	pid_t pid;
	uint64_t longest_ns;
	char where[64];
};

static void *wchan_watch_main(void *arg)
{
	struct wchan_watch *w = arg;
	char path[96], wchan[64];
	uint64_t t0 = now_ns(), since = 0;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/wchan", (int)w->pid, (int)w->pid);
	while (now_ns() - t0 < 1000 * MS) {
		FILE *f = fopen(path, "r");
		bool in = f && fgets(wchan, sizeof(wchan), f) && strstr(wchan, "unlink_file_vma");

		if (f)
			fclose(f);
		if (in && !since) {
			since = now_ns();
			snprintf(w->where, sizeof(w->where), "%s", wchan);
		} else if (!in && since) {
			if (now_ns() - since > w->longest_ns)
				w->longest_ns = now_ns() - since;
			since = 0;
		}
		usleep(200);
	}
	return NULL;
}

/*
 * A client that never seals keeps the right to punch its rw segment, and
 * the broker holds its own writable mapping of it, made before the offer.
 * When the attach is refused (-EPROTO here; a time-out, a hang-up or a
 * failed re-attach end the same way) the broker lets go of that mapping,
 * and its munmap takes the memfd's lock that a punch holds for as long as
 * the client's mappings make it (60,000 here, faulted in: 200-470 ms a
 * punch). On the control thread it waited 210-332 ms, and another
 * client's open took 192-319 ms (a review, 2026-11-30). The broker now
 * seals the memfd against writes first, on a thread of its own (the seal
 * waits out the punch under way, and none can start after it), and only
 * then unmaps it (discard_post()).
 */
ReleaseTest(hostile, a_refused_unsealed_client_punching_its_rw_does_not_stall_the_control_thread, .timeout = 60)
{
	enum { MAPS = 60000 };
	struct chime_mapped m = { .magic = CHIME_MAPPED_MAGIC };
	struct punch_loop p = { 0 };
	struct wchan_watch ww = { .pid = tb.pid };
	int fds[16], nfds, fd = raw_attach_hello(), seals, answer;
	uint64_t worst = 0, t0;
	pthread_t thr, wthr;
	struct stat st;

	t0 = now_ns();
	nfds = welcome_fds(fd, fds);
	cr_assert_eq(fstat(fds[1], &st), 0);
	p.rw = fds[1];
	p.size = (size_t)st.st_size;
	p.maps = calloc(MAPS, sizeof(void *));
	cr_assert_not_null(p.maps);
	/*
	 * As many mappings, faulted in, as 1.2 s allows: the answer must go
	 * within the broker's HELLO_TIMEOUT_S (2 s) of the hello, or the
	 * attach ends in a time-out, not the refusal under test (on a slower
	 * host the 60,000 took longer than that).
	 */
	for (; p.n < MAPS && now_ns() - t0 < 1200 * MS; p.n++) {
		p.maps[p.n] = mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, p.rw, 0);
		if (p.maps[p.n] == MAP_FAILED)
			break;
		(void)madvise(p.maps[p.n], p.size, MADV_POPULATE_WRITE);
	}
	cr_assert_gt(p.n, 1000, "%d mappings", p.n);
	cr_assert_eq(pthread_create(&thr, NULL, punch_loop_main, &p), 0);
	while (!atomic_load(&p.punching))
		usleep(50);
	usleep(5000);           /* a punch under way */
	cr_assert_eq(send(fd, &m, sizeof(m), MSG_NOSIGNAL), (ssize_t)sizeof(m), "not sealed: refused");
	cr_assert_eq(pthread_create(&wthr, NULL, wchan_watch_main, &ww), 0);
	usleep(20000);          /* the broker refuses and lets go meanwhile */
	/* Opens for 1.5 s from the answer on: the slowest is the stall. */
	for (t0 = now_ns(); now_ns() - t0 < 1500 * MS;) {
		uint64_t a = now_ns(), took;
		chime_t *c = copen();

		took = now_ns() - a;
		cr_assert_not_null(c);
		chime_close(c);
		if (took > worst)
			worst = took;
	}
	atomic_store(&p.stop, 1);
	pthread_join(thr, NULL);
	pthread_join(wthr, NULL);
	answer = t_attach_answer(fd);
	cr_assert_eq(answer, -EPROTO, "the refusal's answer: %d (%s)", answer, strerror(-answer));
	seals = fcntl(p.rw, F_GET_SEALS);
	fprintf(stderr, "%d mappings of %zu bytes; punches (ms):", p.n, p.size);
	for (int i = 0; i < p.punches; i++)
		fprintf(stderr, " %llu", (unsigned long long)(p.punch_ns[i] / MS));
	fprintf(stderr, "; the slowest open after the refusal %llu ms; the control thread in munmap (%s) for %llu ms\n",
		(unsigned long long)(worst / MS), ww.where, (unsigned long long)(ww.longest_ns / MS));
	for (int i = 0; i < p.n; i++)
		munmap(p.maps[i], p.size);
	free(p.maps);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	close(fd);
	cr_assert(seals >= 0 && (seals & F_SEAL_FUTURE_WRITE), "the broker did not seal the refused client's rw: %#x",
		  seals);
	cr_assert_lt(ww.longest_ns, 50 * MS, "the control thread waited %llu ms in munmap() of a refused client's rw",
		     (unsigned long long)(ww.longest_ns / MS));
	cr_assert_lt(worst, 150 * MS, "an open took %llu ms while a refused client punched its unsealed rw",
		     (unsigned long long)(worst / MS));
}

/*
 * A refused client holding its rw segment's inode lock: a write() to the
 * segment from a buffer whose page fault the client answers itself holds
 * the lock (i_rwsem) for as long as it likes. Any user can do it with a
 * buffer mapped from a FUSE file of its own (fusermount, or a user
 * namespace's mount); the test uses userfaultfd, which needs
 * CAP_SYS_PTRACE (or vm.unprivileged_userfaultfd) for a fault the kernel
 * takes. The broker's seal (F_ADD_SEALS, chimed-seal) waits for that lock,
 * uninterruptibly. Set up: the writer waiting in its fault, the answer
 * unsealed, refused; the broker's sealer then waits behind the writer.
 */
struct held_write {
	int fd;
	void *buf;
	ssize_t r;
};

static void *held_write_main(void *arg)
{
	struct held_write *h = arg;

	h->r = pwrite(h->fd, h->buf, 4096, 0);
	return NULL;
}

struct held_rw {
	int fd, fds[16], nfds, uffd;
	void *buf;
	size_t page;
	struct held_write h;
	pthread_t thr;
};

static void held_rw_start(struct held_rw *hr, const char *sock)
{
	struct chime_mapped m = { .magic = CHIME_MAPPED_MAGIC };
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };

	hr->page = (size_t)sysconf(_SC_PAGESIZE);
	hr->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (hr->uffd < 0)
		cr_skip("no userfaultfd that serves the kernel's faults: %s", strerror(errno));
	cr_assert_eq(ioctl(hr->uffd, UFFDIO_API, &api), 0);
	hr->buf = mmap(NULL, hr->page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(hr->buf, MAP_FAILED);
	reg.range.start = (unsigned long)hr->buf;
	reg.range.len = hr->page;
	cr_assert_eq(ioctl(hr->uffd, UFFDIO_REGISTER, &reg), 0);
	hr->fd = t_raw_hello(sock, NULL, 0, CHIME_HELLO_TOUCH);
	cr_assert_geq(hr->fd, 0, "a hello by hand: %s", strerror(errno));
	hr->nfds = welcome_fds(hr->fd, hr->fds);
	hr->h.fd = hr->fds[1];
	hr->h.buf = hr->buf;
	cr_assert_eq(pthread_create(&hr->thr, NULL, held_write_main, &hr->h), 0);
	cr_assert_eq(poll(&(struct pollfd){ .fd = hr->uffd, .events = POLLIN }, 1, 2000), 1,
		     "the write to rw did not fault");
	/* rw's inode lock held by the writer now; the answer, unsealed, is refused */
	cr_assert_eq(send(hr->fd, &m, sizeof(m), MSG_NOSIGNAL), (ssize_t)sizeof(m));
	cr_assert_eq(t_attach_answer(hr->fd), -EPROTO);
}

/* The writer's fault answered: its write, and the lock, end. */
static void held_rw_end(struct held_rw *hr)
{
	struct uffdio_zeropage z = { .range = { .start = (unsigned long)hr->buf, .len = hr->page } };

	(void)ioctl(hr->uffd, UFFDIO_ZEROPAGE, &z);
	pthread_join(hr->thr, NULL);
	for (int i = 0; i < hr->nfds; i++)
		close(hr->fds[i]);
	close(hr->fd);
	close(hr->uffd);
	munmap(hr->buf, hr->page);
}

/* Where chimed-seal waits (stderr): its state and wchan. */
static void sealer_state(pid_t pid)
{
	char path[320], buf[128], wchan[64] = "?", state[160] = "?";
	struct dirent *e;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	cr_assert_not_null(dir);
	while ((e = readdir(dir))) {
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		buf[0] = 0;
		(void)!fgets(buf, sizeof(buf), f);
		fclose(f);
		if (strncmp(buf, "chimed-seal", 11))
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/wchan", (int)pid, e->d_name);
		if ((f = fopen(path, "r"))) {
			(void)!fgets(wchan, sizeof(wchan), f);
			fclose(f);
		}
		snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, e->d_name);
		if ((f = fopen(path, "r"))) {
			while (fgets(buf, sizeof(buf), f))
				if (!strncmp(buf, "State:", 6))
					snprintf(state, sizeof(state), "%s", buf + 7);
			fclose(f);
		}
	}
	closedir(dir);
	fprintf(stderr, "chimed-seal: wchan %s, state %s", wchan, state);
}

/*
 * discard_stop() joined chimed-seal, whose seal waits for that lock: the
 * stop waited for the client, lock file, sessions file and all (the next
 * broker cannot start; a SIGKILL leaves the thread in D state too; a
 * review). It now waits a second at most, and leaves a sealer still held
 * up to the exit. Held 6 s here; the stop must be done (its lock file
 * gone) within 3 s: 1009 ms.
 */
ReleaseTest(hostile, a_refused_client_holding_its_rw_segments_lock_does_not_hold_up_a_stop, .timeout = 60)
{
	enum { HOLD_MS = 6000 };
	struct held_rw hr = { 0 };
	char lock[300];
	uint64_t t0, took;
	bool gone = false;
	int st;

	held_rw_start(&hr, tb.sock);
	usleep(300 * 1000);     /* the broker's sealer waits for the lock */
	sealer_state(tb.pid);
	snprintf(lock, sizeof(lock), "%s.lock", tb.sock);
	cr_assert_eq(access(lock, F_OK), 0, "no lock file %s", lock);
	t0 = now_ns();
	kill(tb.pid, SIGTERM);
	while (!(gone = access(lock, F_OK) != 0) && now_ns() - t0 < HOLD_MS * MS)
		usleep(10 * 1000);
	took = now_ns() - t0;
	held_rw_end(&hr);
	st = t_chimed_stop(&tb, 0);
	fprintf(stderr, "a stop beside a refused client holding its rw's lock for %d ms: lock file %s after %llu ms "
		"(exit status %#x)\n", HOLD_MS, gone ? "gone" : "still there", (unsigned long long)(took / MS), st);
	cr_assert(gone && took < 3000 * MS, "the stop waited %llu ms for a client holding its rw's inode lock",
		  (unsigned long long)(took / MS));
}

/*
 * In a child of user 65534: an attach to sock answered unsealed, so
 * refused; its rw segment's inode number to the parent through wfd.
 */
static void refused_unsealed_as_nobody(const char *sock, int wfd)
{
	int kept[16], n = 0, fd;
	unsigned long ino = 0;
	struct stat st;

	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	fd = t_raw_hello(sock, NULL, 0, CHIME_HELLO_TOUCH);
	if (fd < 0)
		_exit(91);
	if (t_answer_offer_as(fd, T_ANSWER_UNSEALED, kept, &n) != 0 || n < 2)
		_exit(92);
	if (t_attach_answer(fd) != -EPROTO)
		_exit(93);
	if (fstat(kept[1], &st) == 0)
		ino = st.st_ino;
	_exit(write(wfd, &ino, sizeof(ino)) == (ssize_t)sizeof(ino) && ino ? 0 : 94);
}

/*
 * With one chimed-seal for everyone, while it waited for one client's
 * lock, another client's refused, unsealed segments waited behind it,
 * mapped and counted for their user (an honest library killed
 * mid-handshake leaves the same), for as long as the first client liked
 * (a review). A sealer held up for a second then had another take the
 * rest, but the rest began with the same client's other held-up jobs:
 * with HELD of them queued first, another user's waited a second for
 * each (7.7 s with 6), and 16 held up every user's for good. A user now
 * has one seal under way at a time: root's client holds up its own later
 * jobs, and user 65534's are let go within 4 s here (0.87 s: the
 * first seal's second held up, begun 0.3 s before this refusal, then a
 * step or two of the control loop, 450 ms apart at rest).
 */
ReleaseTest(hostile, a_refused_client_holding_its_rw_segments_lock_does_not_hold_up_others_segments,
	    .timeout = 60)
{
	enum { HELD = 6 };
	struct held_rw hr[HELD];
	struct t_chimed b = { 0 };
	unsigned long ino = 0;
	uint64_t t0, took;
	int pfd[2], st;
	bool gone = false;
	pid_t pid;

	if (geteuid() != 0)
		cr_skip("needs root (a refusal of user 65534's)");
	memset(hr, 0, sizeof(hr));
	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1 --allow-all"), 0);
	cr_assert_eq(chmod(b.dir, 0755), 0);    /* user 65534 reaches the socket */
	for (int i = 0; i < HELD; i++)
		held_rw_start(&hr[i], b.sock);
	usleep(300 * 1000);     /* the first one's seal under way, held up; the others queued behind it */
	cr_assert_eq(pipe(pfd), 0);
	t0 = now_ns();
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		refused_unsealed_as_nobody(b.sock, pfd[1]);
	}
	close(pfd[1]);
	(void)!read(pfd[0], &ino, sizeof(ino));
	close(pfd[0]);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0 && ino, "user 65534's refused attach: status %#x", st);
	while (!(gone = !maps_inode(b.pid, ino)) && now_ns() - t0 < 8000 * MS)
		usleep(10 * 1000);
	took = now_ns() - t0;
	for (int i = 0; i < HELD; i++)
		held_rw_end(&hr[i]);
	(void)t_chimed_stop(&b, SIGTERM);
	fprintf(stderr, "another user's refused rw let go after %llu ms beside %d seals held up by one client\n",
		(unsigned long long)(took / MS), HELD);
	cr_assert(gone && took < 4000 * MS, "another user's refused rw still mapped by the broker %llu ms on, behind "
		  "%d seals one user's client held up", (unsigned long long)(took / MS), HELD);
}

/*
 * One user's connections flooding their submission rings, and another
 * user's timers. The shard fires between passes, each pass draining every
 * channel's ring: with a budget per channel only (256 records), user
 * 65534's 64 connections (--max-clients-per-uid) made each pass 64 budgets
 * long, and the other user's timers waited for it. Now a user's channels
 * share one budget a pass (shard.c, USER_DRAIN_BUDGET). Before (3 runs):
 * the other user's timers 2442-3033 us late at the median beside 64
 * connections, 1-3 us beside one; after, 39-42 us against 4-6.
 */
enum { FLOOD_TIMERS = 2048, FLOOD_BATCH = 256, VICTIM_TIMERS = 300 };

static void flood_as_nobody(const char *sock, unsigned conns, int ready)
{
	struct chime_opts o = { .socket_path = sock, .flags = CHIME_OPEN_RECORD_RESETS };
	static struct chime_op ops[FLOOD_BATCH];
	chime_t **c = calloc(conns, sizeof(*c));
	chime_id_t (*ids)[FLOOD_TIMERS] = calloc(conns, sizeof(*ids));
	uint64_t far = chime_now() + 3600 * 1000 * MS, x = 88172645463325252ull;
	char one = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (!c || !ids || setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	for (unsigned k = 0; k < conns; k++) {
		if (chime_open(&c[k], &o) != 0)
			_exit(91);
		for (unsigned i = 0; i < FLOOD_TIMERS; i++)
			if (chime_arm(c[k], i, far + i * MS, 0, 0, &ids[k][i]) != 0)
				_exit(92);
	}
	(void)!write(ready, &one, 1);
	for (;;)
		for (unsigned k = 0; k < conns; k++) {
			for (unsigned i = 0; i < FLOOD_BATCH; i++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				ops[i] = (struct chime_op){ .op = CHIME_RESET, .id = ids[k][x % FLOOD_TIMERS],
							    .deadline_ns = far + x % (3600 * 1000 * MS) };
			}
			(void)chime_submit(c[k], ops, FLOOD_BATCH);
		}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The victim's half of victim_lateness(), in its own process: what it got, or why not. */
struct victim_result {
	int err;                /* 0, or the failing call's -errno */
	const char *failed;     /* which call (a string of this file's, the same in the parent) */
	unsigned got;
	uint64_t late[];
};

/* Root's process: n timers 1 ms apart from the base it is sent, up to wait_ms past it. */
struct victim {
	pid_t pid;
	int go;                 /* the base goes down it */
	unsigned n;
	size_t len;
	struct victim_result *r;        /* shared with it */
};

static _Noreturn void victim_arms_and_waits(const char *sock, int go, unsigned n, unsigned wait_ms,
					    struct victim_result *r)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_event ev[64];
	uint64_t base;
	chime_t *me;
	int e;

	if (read(go, &base, sizeof(base)) != sizeof(base))
		_exit(2);       /* the test gave up before the attack */
	if ((e = chime_open(&me, &o)) != 0) {
		r->err = e, r->failed = "chime_open";
		_exit(1);
	}
	for (unsigned i = 0; i < n; i++)
		if ((e = chime_arm(me, 1, base + i * MS, 0, i, &junk)) != 0) {
			r->err = e, r->failed = "chime_arm";
			_exit(1);
		}
	while (r->got < n && chime_now() < base + (uint64_t)wait_ms * MS) {
		int k = chime_wait(me, ev, 64, 100);

		if (k < 0) {
			r->err = k, r->failed = "chime_wait";
			_exit(1);
		}
		for (int i = 0; i < k && r->got < n; i++)
			r->late[r->got++] = ev[i].fired_ns - ev[i].deadline_ns;
	}
	chime_close(me);
	_exit(0);
}

/*
 * Root's process, forked before the attack and waiting for its base. It
 * runs only on the broker's CPU (0), and has from its start. The test's
 * own process has run on CPU 1 too, where the attacker walks epoll watches
 * with interrupts off: a fork there, or its copies on write after one,
 * flushed that CPU's TLB and spun on CPU 0 till the walk let the flush
 * in, the broker's thread waiting (perf, tlb:tlb_flush and
 * sched:sched_switch: the test's process running 111-152 ms on CPU 0 in
 * fork() or a page fault; root's timers 33-141 ms late at the median
 * with 2.5 million watches on the doorbell, 2026-12-08). A process that
 * has only run on CPU 0 flushes CPU 0 alone.
 */
static void victim_fork(struct victim *v, const char *sock, unsigned n, unsigned wait_ms)
{
	cpu_set_t was, cpu0;
	int go[2];

	v->n = n;
	v->len = sizeof(struct victim_result) + n * sizeof(uint64_t);
	v->r = mmap(NULL, v->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(v->r, MAP_FAILED);
	cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
	CPU_ZERO(&cpu0);
	CPU_SET(0, &cpu0);
	cr_assert_eq(sched_getaffinity(0, sizeof(was), &was), 0);
	cr_assert_eq(sched_setaffinity(0, sizeof(cpu0), &cpu0), 0);
	v->pid = fork();
	if (v->pid == 0) {
		close(go[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		victim_arms_and_waits(sock, go[0], n, wait_ms, v->r);
	}
	cr_assert_eq(sched_setaffinity(0, sizeof(was), &was), 0);
	cr_assert_geq(v->pid, 0);
	close(go[0]);
	v->go = go[1];
}

/*
 * Root's timers from base, 1 ms apart, beside user 65534's attacker pid
 * on broker b (v, forked before the attack): each one's lateness by the
 * broker (fired_ns - deadline_ns), sorted, in late[]. Then the attacker
 * is killed and the broker stopped.
 */
static void victim_lateness(struct t_chimed *b, pid_t pid, struct victim *v, uint64_t base, uint64_t *late)
{
	int st, vst;

	cr_assert_eq(write(v->go, &base, sizeof(base)), (ssize_t)sizeof(base));
	close(v->go);
	cr_assert_eq(waitpid(v->pid, &vst, 0), v->pid);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	t_chimed_stop(b, SIGTERM);
	cr_assert(WIFEXITED(vst) && WEXITSTATUS(vst) == 0, "root's process: %s: %s (status 0x%x)",
		  v->r->failed ? v->r->failed : "killed", strerror(-v->r->err), vst);
	cr_assert_eq(v->r->got, v->n, "%u of %u timers fired beside the attack", v->r->got, v->n);
	memcpy(late, v->r->late, v->n * sizeof(uint64_t));
	munmap(v->r, v->len);
	qsort(late, v->n, sizeof(late[0]), cmp_u64);
}

/* How late (the broker's fired_ns - deadline_ns) 300 timers 1 ms apart fire beside conns attacking: the median. */
static uint64_t lateness_beside(void (*attack)(const char *, unsigned, int), unsigned conns, uint64_t *max)
{
	static uint64_t late[VICTIM_TIMERS];
	struct t_chimed b = { 0 };
	struct victim v;
	int pfd[2];
	char one;
	pid_t pid;

	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1 --allow-all"), 0);
	cr_assert_eq(chmod(b.dir, 0755), 0);    /* user 65534 reaches the socket */
	cr_assert_gt(t_pin_threads(b.pid, 0), 0);
	victim_fork(&v, b.sock, VICTIM_TIMERS, 5000);
	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		(void)t_pin_threads(getpid(), 1);
		attack(b.sock, conns, pfd[1]);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &one, 1), 1, "user 65534's %u connections did not open and arm", conns);
	close(pfd[0]);
	usleep(200 * 1000);     /* the flood under way */
	victim_lateness(&b, pid, &v, chime_now() + 50 * MS, late);
	*max = late[VICTIM_TIMERS - 1];
	return late[VICTIM_TIMERS / 2];
}

/*
 * Root's timers beside `attack` (conns connections of user 65534) fire at
 * most margin_ns later at the median than beside `base` (base_conns), and
 * the latest at most max_margin_ns later than there (UINT64_MAX: not
 * judged). The maximum is mostly this host's: a shard kept busy is
 * preempted for a time slice on a loaded host; where an attack's
 * stall is one in the window, only the maximum shows it. Up to three
 * tries, each pair measured afresh: the host's noise only ever adds
 * lateness, and one try in five beside other builds was 230 us late (a
 * second or so each), while what the bound catches is in every try (the
 * forced wake-ups before the share: 66-89 us in each of three).
 */
static void later_beside_by_at_most(void (*base)(const char *, unsigned, int), unsigned base_conns,
				    void (*attack)(const char *, unsigned, int), unsigned conns,
				    uint64_t margin_ns, uint64_t max_margin_ns, const char *what_base, const char *what)
{
	uint64_t before = 0, after = UINT64_MAX, max_before = 0, max_after = UINT64_MAX;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	for (int try = 0; try < 3 && (after >= before + margin_ns ||
				      (max_margin_ns != UINT64_MAX && max_after >= max_before + max_margin_ns)); try++) {
		before = lateness_beside(base, base_conns, &max_before);
		after = lateness_beside(attack, conns, &max_after);
		fprintf(stderr, "another user's timers, late at the median (max), try %d: %.1f us (%.1f) %s, "
			"%.1f us (%.1f) %s\n", try + 1, before / 1e3, max_before / 1e3, what_base, after / 1e3,
			max_after / 1e3, what);
	}
	cr_assert_lt(after, before + margin_ns, "another user's timers fired %.1f us late at the median %s, "
		     "against %.1f %s", after / 1e3, what, before / 1e3, what_base);
	if (max_margin_ns != UINT64_MAX)
		cr_assert_lt(max_after, max_before + max_margin_ns, "another user's timers fired up to %.1f us late %s, "
			     "against %.1f %s", max_after / 1e3, what, max_before / 1e3, what_base);
}

ReleaseTest(hostile, one_users_many_connections_flooding_their_rings_hold_up_anothers_timers_as_one_does,
	    .timeout = 60)
{
	later_beside_by_at_most(flood_as_nobody, 1, flood_as_nobody, 64, 200 * 1000, UINT64_MAX,
				"beside one connection flooding its ring",
				"beside 64 connections of one user flooding theirs");
}

/*
 * Wake-ups forced. A wake-up is a send() on the shard, made when a client's
 * want_wakeup (in its writable segment) is 1 as events go out. User 65534's
 * 64 connections, with four 100 us periodic timers each, store 1 there
 * without pause, mark every event consumed (cq_head far ahead) and never
 * read their sockets. Each send a pass made for them held every other
 * timer of the shard up: root's timers fired 61-124 us late at the median,
 * against 2.2-2.4 us beside the same connections not asking (the trust
 * audit of 2026-12-02), 66.5-88.9 us against 0.9-1.6 in this test on a
 * quiet host. A user's wake-ups now have a share per pass (shard.c,
 * USER_WAKE_BUDGET): 10.1-11.3 us against 0.6-1.4 the same hour (three
 * runs each); 8.3-38.5 us beside other tests' builds.
 */
static void wakes_as_nobody(const char *sock, unsigned conns, int ready, bool force)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_client_geom g = { .nr_shards = 1, .sq_size = 1024, .cq_size = 8192 };
	chime_t **c = calloc(conns, sizeof(*c));
	char **rw = calloc(conns, sizeof(*rw)), line[512], one = 1;
	unsigned nrw = 0;
	FILE *f;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (!c || !rw || setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0 || chime_client_layout(&g) != 0)
		_exit(90);
	for (unsigned k = 0; k < conns; k++) {
		if (chime_open(&c[k], &o) != 0)
			_exit(91);
		for (unsigned i = 0; i < 4; i++)
			if (chime_arm(c[k], i, chime_now() + 10 * MS, 100 * 1000, 0, &junk) != 0)
				_exit(92);
	}
	f = fopen("/proc/self/maps", "r");
	while (f && nrw < conns && fgets(line, sizeof(line), f))
		if (strstr(line, "chime-client-rw"))
			rw[nrw++] = (char *)strtoull(line, NULL, 16);
	if (!f || nrw != conns)
		_exit(93);
	fclose(f);
	(void)!write(ready, &one, 1);
	for (;;)
		for (unsigned k = 0; k < nrw; k++) {
			/* want_wakeup: offset 128 of the rw segment (chime_shm.h) */
			if (force)
				__atomic_store_n((uint32_t *)(rw[k] + 128), 1, __ATOMIC_RELAXED);
			at_store_rel(&((struct chime_chan_rw *)(rw[k] + g.rw_chan_off))->cq_head, UINT64_C(1) << 40);
		}
}

static void periodics_as_nobody(const char *sock, unsigned conns, int ready)
{
	wakes_as_nobody(sock, conns, ready, false);
}

static void forced_wakes_as_nobody(const char *sock, unsigned conns, int ready)
{
	wakes_as_nobody(sock, conns, ready, true);
}

ReleaseTest(hostile, forced_wakeups_of_one_users_connections_hold_up_anothers_timers_little, .timeout = 60)
{
	later_beside_by_at_most(periodics_as_nobody, 64, forced_wakes_as_nobody, 64, 50 * 1000, UINT64_MAX,
				"beside 64 connections of one user taking periodic events",
				"beside the same forcing wake-ups");
}

/*
 * Epoll watches. Each is an entry on the wait queue of the file it
 * watches, and each wake-up of that file calls every entry, with the
 * queue's lock held and interrupts off, in whoever makes the wake-up: any
 * user may put fs.epoll.max_user_watches of them (5.5 million on a 24 GiB
 * VM) on a file it holds, its end of its connection or its doorbell, and
 * the shard makes wake-ups of both (a send() to wake the client, a read of
 * its doorbell). Here `want` of them on fd: descriptors numbered from 1000
 * up dup'd from it, each number a watch of its own in every one of as many
 * epoll instances as it takes, the instances left open (the watches with
 * them) until the caller exits. The cheaper way, one instance watched a
 * million times that watches fd once, the kernel refuses: adding fd to it
 * fails with EINVAL, at most 500 wake-up paths through a nested instance
 * (fs/eventpoll.c, path_limits). How many it added; it says why it stopped.
 */
static long watch_many(int fd, long want)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct rlimit rl;
	long added = 0;
	int per_ep, nr_eps, *eps;

	if (!want)
		return 0;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 4096) {
		fprintf(stderr, "RLIMIT_NOFILE: too few descriptors for %ld watches\n", want);
		return 0;
	}
	per_ep = rl.rlim_cur - 1024 > 20000 ? 20000 : (int)rl.rlim_cur - 1024;
	nr_eps = (int)((want + per_ep - 1) / per_ep) + 1;     /* one more: numbers already taken are skipped */
	eps = calloc((size_t)nr_eps, sizeof(*eps));
	for (int e = 0; eps && e < nr_eps; e++)
		if ((eps[e] = epoll_create1(EPOLL_CLOEXEC)) < 0) {
			fprintf(stderr, "epoll_create1: %s\n", strerror(errno));
			return 0;
		}
	for (int k = 0; eps && k < per_ep && added < want; k++) {
		int n = 1000 + k;

		if (fcntl(n, F_GETFD) >= 0)
			continue;       /* taken (the library's) */
		if (dup2(fd, n) != n) {
			fprintf(stderr, "dup2: %s\n", strerror(errno));
			return added;
		}
		for (int e = 0; e < nr_eps && added < want; e++) {
			if (epoll_ctl(eps[e], EPOLL_CTL_ADD, n, &ev) < 0) {
				fprintf(stderr, "epoll_ctl after %ld watches: %s (fs.epoll.max_user_watches)\n",
					added, strerror(errno));
				return added;
			}
			added++;
		}
		close(n);
	}
	return added;
}

/* Skips unless user 65534 may put want watches on one file (fs.epoll.max_user_watches, RLIMIT_NOFILE). */
static void watches_allowed(long want)
{
	FILE *f = fopen("/proc/sys/fs/epoll/max_user_watches", "r");
	struct rlimit rl;
	long max = 0;

	if (f) {
		if (fscanf(f, "%ld", &max) != 1)
			max = 0;
		fclose(f);
	}
	if (max < want + 1000)
		cr_skip("fs.epoll.max_user_watches is %ld: user 65534 may not put %ld watches on a file", max, want);
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max < 4096)
		cr_skip("RLIMIT_NOFILE's hard limit is %llu: too few descriptors for %ld watches",
			(unsigned long long)rl.rlim_max, want);
}

/*
 * User 65534 with one connection to sock, holding no descriptor but the
 * library's and ready (now 3): the test runner's (sockets, eventfds of its
 * own) closed, so that the attacker's scans of /proc/self/fd find only
 * the library's. RLIMIT_NOFILE up to its hard limit, as any user may.
 */
static chime_t *one_connection_as_nobody(const char *sock, int *ready)
{
	struct chime_opts o = { .socket_path = sock };
	struct rlimit rl;
	chime_t *c;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (*ready != 3 && dup2(*ready, 3) != 3)
		_exit(90);
	*ready = 3;
	close_range(4, ~0U, 0);
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	if (chime_open(&c, &o) != 0)
		_exit(91);
	return c;
}

/* The first of this process's descriptors that fits, or -1. */
static int first_fd_that(bool (*fits)(int fd))
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int found = -1;

	while (d && found < 0 && (e = readdir(d))) {
		int fd = atoi(e->d_name);

		if (e->d_name[0] != '.' && fd != dirfd(d) && fits(fd))
			found = fd;
	}
	if (d)
		closedir(d);
	return found;
}

static bool is_socket(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

static bool fd_is(int fd, const char *what)
{
	char path[64], target[64];
	ssize_t len;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	len = readlink(path, target, sizeof(target) - 1);
	if (len <= 0)
		return false;
	target[len] = 0;
	return strcmp(target, what) == 0;
}

/* Is fd watched by the epoll instance ep (a "tfd:" line of its fdinfo)? */
static bool epoll_watches(int ep, int fd)
{
	char path[64], line[256];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", ep);
	f = fopen(path, "r");
	while (f && !found && fgets(line, sizeof(line), f))
		found = strncmp(line, "tfd:", 4) == 0 && atoi(line + 4) == fd;
	if (f)
		fclose(f);
	return found;
}

static int the_candidate;
static bool watches_the_candidate(int ep)
{
	return fd_is(ep, "anon_inode:[eventpoll]") && epoll_watches(ep, the_candidate);
}

/*
 * A doorbell: an eventfd the library's epoll instance (chime_fd()) does not
 * watch. The library's own, its kick, it does. Before it is watched here.
 */
static bool is_a_doorbell(int fd)
{
	if (!fd_is(fd, "anon_inode:[eventfd]"))
		return false;
	the_candidate = fd;
	return first_fd_that(watches_the_candidate) < 0;
}

/*
 * 2.5 million: a walk (220-340 ms here) outlasts the victim's lead (200 ms
 * and its open), and any stall of the shard behind one stands out of this
 * host's noise. A million (110-150 ms) caught the same only in some runs.
 */
enum { EPOLL_WATCHES = 2500000 };

/*
 * Wake-ups through a watched socket. User 65534's one connection, with
 * four 100 us periodic timers, stores want_wakeup = 1 and marks every
 * event consumed without pause, as forced_wakes_as_nobody() does, with
 * `watches` epoll watches on its end of the connection: each wake-up's
 * send() on the shard walks them all. It reads the wake-ups too: a full
 * socket would refuse them (EAGAIN) without a walk.
 */
static void wakes_watched_by(const char *sock, long watches, int ready)
{
	struct chime_client_geom g = { .nr_shards = 1, .sq_size = 1024, .cq_size = 8192 };
	chime_t *c = one_connection_as_nobody(sock, &ready);
	char line[512], buf[16], *rw = NULL, one = 1;
	int s = first_fd_that(is_socket);
	FILE *f;

	if (s < 0 || chime_client_layout(&g) != 0)
		_exit(93);
	if (watch_many(s, watches) < watches)
		_exit(94);
	for (unsigned i = 0; i < 4; i++)
		if (chime_arm(c, i, chime_now() + 10 * MS, 100 * 1000, 0, &junk) != 0)
			_exit(92);
	f = fopen("/proc/self/maps", "r");
	while (f && !rw && fgets(line, sizeof(line), f))
		if (strstr(line, "chime-client-rw"))
			rw = (char *)strtoull(line, NULL, 16);
	if (!f || !rw)
		_exit(93);
	fclose(f);
	(void)!write(ready, &one, 1);
	for (;;) {
		/* want_wakeup: offset 128 of the rw segment (chime_shm.h) */
		__atomic_store_n((uint32_t *)(rw + 128), 1, __ATOMIC_RELAXED);
		at_store_rel(&((struct chime_chan_rw *)(rw + g.rw_chan_off))->cq_head, UINT64_C(1) << 40);
		while (recv(s, buf, sizeof(buf), MSG_DONTWAIT) > 0)
			;
	}
}

static void wakes_unwatched_as_nobody(const char *sock, unsigned conns, int ready)
{
	(void)conns;
	wakes_watched_by(sock, 0, ready);
}

static void wakes_watched_as_nobody(const char *sock, unsigned conns, int ready)
{
	(void)conns;
	wakes_watched_by(sock, EPOLL_WATCHES, ready);
}

/*
 * A wake-up's walk. User 65534's one connection forcing wake-ups (as
 * above) with 2.5 million epoll watches on its end: each send() of the
 * shard calls as many callbacks with the socket's queue lock held and
 * interrupts off (110-150 ms a million, a throwaway probe), and every other
 * timer of the shard waits for it (ARCHITECTURE.md, "The wait queues of
 * its connection socket and doorbells"). The margin (15 ms) is far above
 * the base's noise and far below a single walk (beside a busy loop, the
 * doorbell's case below was 4.8 ms late once: the ringer's walks on its
 * CPU push the loop onto the broker's). Before (5 runs of 3 tries, 11-13 s
 * a run, a million watches): root's timers 50.3-154.5 ms late at the
 * median, up to 108-294 ms, against 0.1-415 us (up to 0.002-23.6 ms, this
 * host's preemption) beside the same connection without the watches. Now a
 * send slow by CPU time holds the user's wake-ups back 16 times as long
 * (wake_send(), chan.c), so a walk comes at most once in 17 of the shard's
 * time. It held only from the second slow send until 2026-12-08: two walks
 * back to back at the start, the second in the victim's window whenever
 * walks were slow (one CI run in two or three, 133 ms at the median in
 * each of 3 tries; with 2.5 million watches, 43.5-188.5 ms in 5 tries of
 * 6, 2 runs). Now it holds from the first: 0.1 us at the median, up to
 * 0.01-0.45 ms, against 0.0-1.2 us (up to 1.1-5.0 ms) without the watches
 * (3 runs of one try). The maximum is not judged: the first walk, which
 * no broker can know slow before it is made, starts 10 ms after the
 * attacker is ready and takes 220-340 ms, and root's first timers fall
 * 250 ms after it, some in its tail (up to 19.5-53.5 ms in 4 of 9 runs
 * since, the median 0.1 us in all).
 */
ReleaseTest(hostile, wakeups_walking_one_users_epoll_watches_hold_up_anothers_timers_little, .timeout = 90)
{
	watches_allowed(EPOLL_WATCHES);
	later_beside_by_at_most(wakes_unwatched_as_nobody, 1, wakes_watched_as_nobody, 1, 15 * MS, UINT64_MAX,
				"beside one connection of one user forcing wake-ups",
				"beside the same with 2.5 million epoll watches on its socket");
}

/*
 * A doorbell rung with `watches` epoll watches on it: user 65534's one
 * connection rings it every 200 us or so, time for the shard to go to
 * sleep between rings. Each ring completed the shard's read of it, whose
 * eventfd_read() woke the doorbell's writers: all its watches. The shard
 * polls it now, and never reads it.
 */
static void rings_watched_by(const char *sock, long watches, int ready)
{
	char one = 1;
	int bell;

	(void)one_connection_as_nobody(sock, &ready);
	bell = first_fd_that(is_a_doorbell);
	if (bell < 0)
		_exit(93);
	if (watch_many(bell, watches) < watches)
		_exit(94);
	(void)!write(ready, &one, 1);
	for (;;) {
		(void)eventfd_write(bell, 1);
		usleep(200);
	}
}

static void rings_unwatched_as_nobody(const char *sock, unsigned conns, int ready)
{
	(void)conns;
	rings_watched_by(sock, 0, ready);
}

static void rings_watched_as_nobody(const char *sock, unsigned conns, int ready)
{
	(void)conns;
	rings_watched_by(sock, EPOLL_WATCHES, ready);
}

/*
 * A doorbell's walk. The shard kept an io_uring READ on each client's
 * doorbell, and each read's eventfd_read() woke the eventfd's writers:
 * every watch on it (a million then), on the shard with interrupts off.
 * The ringer's own eventfd_write() walks them too, on its CPU, under the
 * lock the shard's read takes: likely why one run of four was 465-894 ms
 * late at the median in every try (not looked into). Margin as above.
 * Before (4 runs of 3 tries, 11-15 s a run): root's timers 75.6-894.3 ms
 * late at the median, up to 141-1024 ms, against 0.1-46.5 us (up to
 * 1.3-98 ms) beside the same ringing without the watches. A stand-in for
 * a shard that never walks them (a throwaway variant: the million watches
 * on an eventfd of the ringer's own, rung beside the bare doorbell) gave
 * 0.3-0.4 us at the median, up to 54-102 ms (2 runs): what the ringer's
 * walks cost the shard's CPU still shows in the maximum. The shard now
 * keeps a multishot poll on each doorbell instead (shard.c): after (2
 * runs of one try), 0.1-7.3 us at the median, up to 1.2-5.8 ms, against
 * 0.1 us (up to 0.07-1.0 ms) without the watches; with the read put back
 * (a throwaway build), 68.6-202.1 ms, up to 157-351 ms (3 tries).
 *
 * What was left, and failed runs now and then (a million watches) or
 * most (2.5 million, now): TLB flushes sent to the ringer's CPU, which
 * takes none with interrupts off, each spinning on the broker's CPU till
 * the walk ended (ARCHITECTURE.md, the same row). Root's own process
 * forking or copying on write there (victim_fork() says more), and the
 * shard's first write to a page of its free map that a read had mapped to
 * the zero page (wheel.c, free_map()). Before, with 2.5 million watches:
 * 33.4-140.8 ms at the median in 8 tries of 14 (5 runs), up to
 * 150-290 ms; with root's process fixed, still up to 53-68 ms in each of
 * 4 runs (the shard's flush); now 0.0-0.1 us at the median, up to
 * 0.02-1.4 ms (4 runs), against 0.1 us (up to 0.2-0.9 ms). Hence the
 * bound on the maximum too (25 ms).
 */
ReleaseTest(hostile, a_doorbell_under_one_users_epoll_watches_holds_up_anothers_timers_little, .timeout = 90)
{
	watches_allowed(EPOLL_WATCHES);
	later_beside_by_at_most(rings_unwatched_as_nobody, 1, rings_watched_as_nobody, 1, 15 * MS, 25 * MS,
				"beside one user ringing its doorbell",
				"beside the same with 2.5 million epoll watches on it");
}

/*
 * The control thread's answers walk watches too: the welcome's sendmsg()
 * wakes every epoll watch on the client's end of the connection, and so
 * does its read of the hello (it frees the sender's message, and the
 * kernel wakes the sender's writers, sock_wfree()). User 65534's
 * HELLO_CONNS connections each carry HELLO_WATCHES watches, made before
 * its connect (the hello must come within 2 s). A user whose answer took
 * 500 us of CPU time now has its next connections neither read nor
 * answered for 16 times as long (hello_dispatch(), hello_arm(),
 * handshake.c); then one is read, and the others wait for its answer.
 * Times on CLOCK_MONOTONIC.
 */
enum { HELLO_CONNS = 6, HELLO_WATCHES = 250000 };

/* Its welcome on u, if one came: its descriptors closed (a connection that never maps them). True if read. */
static bool welcome_taken(int u)
{
	struct chime_welcome wl;
	char cbuf[CMSG_SPACE(sizeof(int) * 8)];
	struct iovec iov = { .iov_base = &wl, .iov_len = sizeof(wl) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };

	if (recvmsg(u, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) <= 0)
		return false;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
			close(((int *)CMSG_DATA(cm))[i]);
	return true;
}

/*
 * User 65534's side: the connections and their watches, then on `go` the
 * hellos, all at once, or (later) the first alone and, once its welcome
 * came, the others on connections made then. A byte on ready when the
 * watches are made and when the hellos are sent; then when each welcome
 * came, for all of them.
 */
static void hellos_watched_as_nobody(const char *sock, int ready, int go, bool later)
{
	struct chime_hello h = { .magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT, .flags = CHIME_HELLO_SEALS };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t at[HELLO_CONNS] = { 0 }, end;
	int u[HELLO_CONNS], got = 0, now_conns = later ? 1 : HELLO_CONNS;
	struct rlimit rl;
	char one = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	for (int k = 0; k < HELLO_CONNS; k++) {
		u[k] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (u[k] < 0 || watch_many(u[k], HELLO_WATCHES) < HELLO_WATCHES)
			_exit(94);
	}
	for (int k = 0; k < now_conns; k++)
		if (connect(u[k], (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(95);
	(void)!write(ready, &one, 1);
	if (read(go, &one, 1) != 1)
		_exit(96);
	for (int k = 0; k < now_conns; k++)
		if (send(u[k], &h, sizeof(h), 0) != (ssize_t)sizeof(h))
			_exit(97);
	if (later) {
		struct pollfd pf = { .fd = u[0], .events = POLLIN };

		if (poll(&pf, 1, 10000) != 1 || !welcome_taken(u[0]))
			_exit(98);
		at[0] = chime_now();
		got = 1;
		for (int k = 1; k < HELLO_CONNS; k++)
			if (connect(u[k], (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
			    send(u[k], &h, sizeof(h), 0) != (ssize_t)sizeof(h))
				_exit(99);
	}
	(void)!write(ready, &one, 1);
	end = chime_now() + 60000 * MS;
	while (got < HELLO_CONNS && chime_now() < end) {
		struct pollfd pf[HELLO_CONNS];

		for (int k = 0; k < HELLO_CONNS; k++)
			pf[k] = (struct pollfd){ .fd = at[k] ? -1 : u[k], .events = POLLIN };
		if (poll(pf, HELLO_CONNS, 60000) <= 0)
			break;
		for (int k = 0; k < HELLO_CONNS; k++)
			if ((pf[k].revents & POLLIN) && welcome_taken(u[k])) {
				at[k] = chime_now();
				got++;
			}
	}
	(void)!write(ready, at, sizeof(at));
	pause();
	_exit(0);
}

/*
 * User 65534's hellos (later: as in hellos_watched_as_nobody()) and root's
 * open once they are sent: when each welcome came, sorted, in at[]; when
 * the hellos were sent, and when root's open ended.
 */
static void hellos_beside_an_open(bool later, uint64_t *at, uint64_t *sent, uint64_t *opened)
{
	struct chime_opts o = { .socket_path = NULL };
	struct t_chimed b = { 0 };
	int rd[2], gp[2], st;
	char one = 0;
	chime_t *me;
	pid_t pid;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	watches_allowed((long)HELLO_CONNS * HELLO_WATCHES);
	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1 --allow-all"), 0);
	cr_assert_eq(chmod(b.dir, 0755), 0);    /* user 65534 reaches the socket */
	cr_assert_gt(t_pin_threads(b.pid, 0), 0);
	o.socket_path = b.sock;
	cr_assert_eq(pipe(rd), 0);
	cr_assert_eq(pipe(gp), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(rd[0]);
		close(gp[1]);
		(void)t_pin_threads(getpid(), 1);
		hellos_watched_as_nobody(b.sock, rd[1], gp[0], later);
	}
	close(rd[1]);
	close(gp[0]);
	cr_assert_eq(read(rd[0], &one, 1), 1, "user 65534's %d connections with their watches not made", HELLO_CONNS);
	*sent = chime_now();
	cr_assert_eq(write(gp[1], &one, 1), 1);
	cr_assert_eq(read(rd[0], &one, 1), 1, "user 65534's hellos not sent");
	if (!later)
		*sent = chime_now();
	usleep(2000);           /* its hellos read by the control thread before root's */
	cr_assert_eq(chime_open(&me, &o), 0);
	*opened = chime_now();
	chime_close(me);
	cr_assert_eq(read(rd[0], at, sizeof(*at) * HELLO_CONNS), (ssize_t)(sizeof(*at) * HELLO_CONNS),
		     "user 65534's welcomes not reported");
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	t_chimed_stop(&b, SIGTERM);
	for (int k = 0; k < HELLO_CONNS; k++)
		cr_assert_neq(at[k], 0, "a hello of user 65534's was never answered: held back for good");
	qsort(at, HELLO_CONNS, sizeof(at[0]), cmp_u64);
	for (int k = 0; k < HELLO_CONNS; k++)
		fprintf(stderr, "user 65534's welcome %d of %d: %.1f ms after its first hello\n", k + 1, HELLO_CONNS,
			(at[k] - *sent) / 1e6);
	fprintf(stderr, "root's chime_open() beside them: ended %.1f ms after it\n", (*opened - *sent) / 1e6);
}

/*
 * Six hellos at once, and root's open right after. The control thread
 * answered them in turn, a walk each, and root's open waited for all of
 * them. Before (2 runs): root's open ended 291-450 ms after the hellos,
 * after all six welcomes, 25 ms apart. After (2 runs): 182-196 ms, the
 * welcomes 430-870 ms apart, every one of them answered. What is left of
 * the 182 ms is the six hellos' reads, made before the first answer shows
 * the user slow.
 */
ReleaseTest(hostile, answers_walking_one_users_epoll_watches_hold_up_anothers_open_little, .timeout = 120)
{
	uint64_t at[HELLO_CONNS], sent, opened;

	hellos_beside_an_open(false, at, &sent, &opened);
	cr_assert_lt(opened, at[1], "root's open ended %.1f ms after user 65534's hellos, after its second welcome "
		     "(%.1f ms): the control thread answered them in turn", (opened - sent) / 1e6, (at[1] - sent) / 1e6);
}

/*
 * One hello, and once its answer has shown the user slow, five more on
 * connections made then, and root's open. Their reads, a walk each, held
 * root's open up; a held user's connections are not read now until its
 * hold ends, one at a time. A walk is about half the first welcome's wait
 * (its read and its answer): root's open must take less than one. Before
 * (2 runs, reads not held back): root's open ended 123.7-163.9 ms after the
 * first welcome, a walk being 25.7-32.9 ms. After (2 runs): 3.1-3.4 ms.
 */
ReleaseTest(hostile, connections_of_a_user_held_back_are_not_read_until_its_hold_ends, .timeout = 120)
{
	uint64_t at[HELLO_CONNS], sent, opened, walk, took;

	hellos_beside_an_open(true, at, &sent, &opened);
	walk = (at[0] - sent) / 2;
	took = opened - at[0];
	fprintf(stderr, "a walk: about %.1f ms; root's open, from the first welcome: %.1f ms\n", walk / 1e6,
		took / 1e6);
	cr_assert_lt(took, walk, "root's open took %.1f ms after user 65534's first welcome, a walk being %.1f ms: "
		     "its later connections were read", took / 1e6, walk / 1e6);
	cr_assert_lt(opened, at[1], "root's open ended after user 65534's second welcome");
}

/*
 * Held events handed over at once. A client that does not drain has its
 * timers' events held (the backlog); as it consumes, each pass moved as
 * many of them as its completion ring had room for and freed as many
 * consumed ones, for every channel: user 65534's 64 connections, 30000
 * events held each, consuming as fast as they could, held every timer of
 * the shard up for a pass of 64 rings' worth. With --cq-size 65536,
 * before: another user's timers up to 138-293 ms late (4 rounds; the pass
 * alone took 94-108 ms with 24000 held each). Now a user's channels share
 * a budget of events moved and nodes freed per pass (shard.c,
 * USER_SERVICE_BUDGET): 2.3-10 ms, this loaded host's preemption of a
 * busy shard (such a pass's own CPU time was 0.4-0.6 ms).
 */
enum { HELD_TIMERS = 30000, HELD_CONNS = 64, HELD_VICTIM = 1000 };

static void held_then_drained_as_nobody(const char *sock, uint64_t due, uint64_t drain_at, int ready)
{
	struct chime_opts o = { .socket_path = sock };
	static struct chime_event ev[65536];
	chime_t *c[HELD_CONNS];
	char one = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	for (unsigned k = 0; k < HELD_CONNS; k++) {
		if (chime_open(&c[k], &o) != 0)
			_exit(91);
		for (unsigned i = 0; i < HELD_TIMERS; i++)
			if (chime_arm(c[k], i, due, 0, 0, &junk) != 0)
				_exit(92);
	}
	(void)!write(ready, &one, 1);
	while (chime_now() < drain_at)
		usleep(1000);
	for (;;)
		for (unsigned k = 0; k < HELD_CONNS; k++)
			(void)chime_poll(c[k], ev, 65536);
}

/*
 * The latest of 1000 timers 1 ms apart (the broker's fired_ns - deadline_ns)
 * while `attack` runs, on a broker started with `args`, its connections
 * given lead_ms to open and arm.
 */
static uint64_t latest_median;  /* latest_beside()'s last median */

static uint64_t latest_beside(const char *args, uint64_t lead_ms, void (*attack)(const char *, uint64_t, uint64_t, int))
{
	static uint64_t late[HELD_VICTIM];
	struct t_chimed b = { 0 };
	struct victim v;
	uint64_t due, base;
	int pfd[2];
	char one;
	pid_t pid;

	cr_assert_eq(t_chimed_start(&b, NULL, args), 0);
	cr_assert_eq(chmod(b.dir, 0755), 0);    /* user 65534 reaches the socket */
	cr_assert_gt(t_pin_threads(b.pid, 0), 0);
	victim_fork(&v, b.sock, HELD_VICTIM, 10000);
	cr_assert_eq(pipe(pfd), 0);
	due = chime_now() + lead_ms * MS;
	base = due + 3000 * MS;     /* all of its events fired and delivered (or held) by then */
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		(void)t_pin_threads(getpid(), 1);
		attack(b.sock, due, base + 100 * MS, pfd[1]);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &one, 1), 1, "user 65534's connections did not open and arm");
	close(pfd[0]);
	cr_assert_lt(chime_now(), due, "user 65534's arms took past their deadline");
	victim_lateness(&b, pid, &v, base, late);
	fprintf(stderr, "another user's timers beside one user's held events going out or let go: median %.1f us, "
		"p99 %.1f us, max %.1f us\n", late[HELD_VICTIM / 2] / 1e3, late[HELD_VICTIM * 99 / 100] / 1e3,
		late[HELD_VICTIM - 1] / 1e3);
	latest_median = late[HELD_VICTIM / 2];
	return late[HELD_VICTIM - 1];
}

/*
 * latest_beside(args, 4000, attack) of the better of two rounds, the second
 * only if the first was 30 ms late or more: a busy shard preempted on a
 * loaded host is not the pass. Skips without 2 CPUs and root.
 */
static uint64_t latest_of_better_round(const char *args, void (*attack)(const char *, uint64_t, uint64_t, int))
{
	uint64_t worst = UINT64_MAX;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	for (int round = 0; round < 2 && worst >= 30 * MS; round++) {
		uint64_t w = latest_beside(args, 4000, attack);

		worst = w < worst ? w : worst;
	}
	return worst;
}

/* The latest of 1000 timers 1 ms apart while `attack` consumes (--cq-size 65536). */
static uint64_t latest_beside_held_events_handed_over(void (*attack)(const char *, uint64_t, uint64_t, int))
{
	return latest_beside("--shards 1 --allow-all --cq-size 65536", 4000, attack);
}

ReleaseTest(hostile, held_events_handed_over_at_once_to_one_users_connections_do_not_hold_up_anothers_timers,
	    .timeout = 90)
{
	uint64_t worst = UINT64_MAX;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	/* A second round only if the first was late: a busy shard preempted on a loaded host is not the pass. */
	for (int round = 0; round < 2 && worst >= 40 * MS; round++) {
		uint64_t w = latest_beside_held_events_handed_over(held_then_drained_as_nobody);

		worst = w < worst ? w : worst;
	}
	cr_assert_lt(worst, 40 * MS, "another user's timer fired %.1f ms late while one user's 64 connections "
		     "took their held events (twice)", worst / 1e6);
}

/*
 * Held events let go at once. A client that never drains has its fired
 * timers held (the backlog), up to its quota; when it goes, the shard
 * freed all of them in the first step of its reclaim, before the sweep of
 * the slab that goes in steps. User 65534's two connections, 900k timers
 * held each, exit: another user's timers waited for both lists
 * (a hostile-client audit, 2026-12-07). Now the held and delivered
 * events go in the sweep's steps (chan_reclaim(), RECLAIM_BUDGET).
 */
enum { DROPPED_TIMERS = 900000, DROPPED_CONNS = 2 };

static void held_then_exited_as_nobody(const char *sock, uint64_t due, uint64_t drop_at, int ready)
{
	struct chime_opts o = { .socket_path = sock };
	chime_t *c[DROPPED_CONNS];
	char one = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	for (unsigned k = 0; k < DROPPED_CONNS; k++) {
		if (chime_open(&c[k], &o) != 0)
			_exit(91);
		for (unsigned i = 0; i < DROPPED_TIMERS; i++)
			if (chime_arm(c[k], i, due, 0, 0, &junk) != 0)
				_exit(92);
	}
	(void)!write(ready, &one, 1);
	while (chime_now() < drop_at)
		usleep(1000);
	_exit(0);       /* the kernel closes both connections: their held events go with them */
}

ReleaseTest(hostile, held_events_of_a_client_that_goes_do_not_hold_up_anothers_timers, .timeout = 90)
{
	uint64_t worst = UINT64_MAX;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	/* A second round only if the first was late: a busy shard preempted on a loaded host is not the pass. */
	for (int round = 0; round < 2 && worst >= 25 * MS; round++) {
		uint64_t w = latest_beside_held_events_handed_over(held_then_exited_as_nobody);

		worst = w < worst ? w : worst;
	}
	cr_assert_lt(worst, 25 * MS, "another user's timer fired %.1f ms late while one user's connections "
		     "that held %u events each went (twice)", worst / 1e6, DROPPED_TIMERS);
}

/*
 * The periodics' side of a consume: for each position the client's head
 * passed, the shard reads the event there and, for a periodic's, forgets
 * the position in its node (periodics_taken()), all of them in the
 * refresh that saw the head move. User 65534's 64 connections, each with
 * 30000 periodic events in its ring, move their heads past them all at
 * once (one store each in their rw segments). Before (4 rounds): another
 * user's timers up to 37-49 ms late, the walk of 1.9M positions in one
 * pass; now the walk shares the user's budget a pass (shard.c,
 * USER_SERVICE_BUDGET): 1.5-7.6 ms, this host's.
 */
static void periodics_consumed_at_once_as_nobody(const char *sock, uint64_t due, uint64_t drain_at, int ready)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_client_geom g = { .nr_shards = 1, .sq_size = 1024, .cq_size = 65536 };
	FILE *f;
	char line[512], one = 1;
	chime_t *c[HELD_CONNS];

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0 ||
	    chime_client_layout(&g) != 0)
		_exit(90);
	for (unsigned k = 0; k < HELD_CONNS; k++) {
		if (chime_open(&c[k], &o) != 0)
			_exit(91);
		/* Due in an order other than their nodes': each position read then costs a miss in the slab. */
		for (unsigned i = 0; i < HELD_TIMERS; i++)
			if (chime_arm(c[k], i, due + (i * UINT64_C(2654435761)) % (400 * MS), 3600 * 1000 * MS, 0,
				      &junk) != 0)
				_exit(92);
	}
	(void)!write(ready, &one, 1);
	while (chime_now() < drain_at)
		usleep(1000);
	/* Every rw segment's head past its tail (the shard clamps it to the tail), as fast as stores go. */
	f = fopen("/proc/self/maps", "r");
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo;

		if (strstr(line, "/memfd:chime-client-rw ") && sscanf(line, "%lx-", &lo) == 1)
			at_store_rel(&((struct chime_chan_rw *)(lo + g.rw_chan_off))->cq_head, UINT64_C(1) << 40);
	}
	for (;;)
		pause();
}

ReleaseTest(hostile, periodic_events_consumed_at_once_by_one_users_connections_do_not_hold_up_anothers_timers,
	    .timeout = 90)
{
	uint64_t worst = UINT64_MAX;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	for (int round = 0; round < 2 && worst >= 20 * MS; round++) {
		uint64_t w = latest_beside_held_events_handed_over(periodics_consumed_at_once_as_nobody);

		worst = w < worst ? w : worst;
	}
	cr_assert_lt(worst, 20 * MS, "another user's timer fired %.1f ms late as one user's 64 connections "
		     "consumed their periodic events at once (twice)", worst / 1e6);
}

/*
 * Slab sweeps take turns by user (shard.c, reclaim_pick()). User 65534's 60
 * connections, each holding a timer, end at once: 60 sweeps of a slab root's
 * own timers raised to 3M nodes. Root's named session detaches just after:
 * its park is a sweep too, and the session's next process waits for it. In
 * turn by connection it waited behind all 60 (a security audit: 60-120 such
 * sweeps of 1.8M nodes made a reopen 1.3-1.4 s, 8-19 ms without them). The
 * process is killed with an event unread, or its park would skip the sweep.
 * One try: how long the session's reopen waited.
 */
static uint64_t reopen_beside_sweeps(void)
{
	enum { CONNS = 60, FILL = 3000000, BATCH = 1000 };
	static struct chime_op ops[BATCH];
	struct t_chimed b = { 0 };
	struct chime_opts o = { 0 };
	chime_t *fill, *sess;
	uint64_t far = chime_now() + 3600 * 1000 * MS, t0, took;
	int pfd[2], st;
	pid_t pid, worker;
	char one;

	cr_assert_eq(t_chimed_start(&b, NULL, "--shards 1 --allow-all --max-timers-per-client 0 "
				    "--max-timers-per-uid 0"), 0);
	cr_assert_eq(chmod(b.dir, 0755), 0);    /* user 65534 reaches the socket */
	o.socket_path = b.sock;
	cr_assert_eq(chime_open(&fill, &o), 0);
	for (unsigned i = 0; i < FILL; i += BATCH) {
		for (unsigned k = 0; k < BATCH; k++)
			ops[k] = (struct chime_op){ .op = CHIME_ARM, .deadline_ns = far + k };
		cr_assert_eq(chime_submit(fill, ops, BATCH), BATCH);
	}
	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		chime_t *c[CONNS];

		close(pfd[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
			_exit(90);
		for (unsigned k = 0; k < CONNS; k++)
			if (chime_open(&c[k], &o) != 0 || chime_arm(c[k], 1, far, 0, 0, &junk) != 0)
				_exit(91);
		(void)!write(pfd[1], &one, 1);
		pause();
		_exit(0);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &one, 1), 1, "user 65534's %u connections did not open and arm", CONNS);
	close(pfd[0]);
	/* the session's process, killed with an event unread: its channel's park is a sweep */
	o.session = "sweeps-in-turn";
	cr_assert_eq(pipe(pfd), 0);
	worker = fork();
	cr_assert_geq(worker, 0);
	if (worker == 0) {
		close(pfd[0]);
		/* an event left in its ring: the park sweeps the slab for what the next process is owed */
		if (chime_open(&sess, &o) != 0 || chime_arm(sess, 1, chime_now() + MS, 0, 0, &junk) != 0 ||
		    chime_flush(sess) != 0)
			_exit(91);
		usleep(50 * 1000);
		(void)!write(pfd[1], &one, 1);
		pause();
		_exit(0);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &one, 1), 1, "the session's process did not open and arm");
	close(pfd[0]);
	usleep(200 * 1000);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	usleep(20 * 1000);      /* their hang-ups seen: the sweeps under way */
	kill(worker, SIGKILL);
	waitpid(worker, &st, 0);
	t0 = now_ns();
	cr_assert_eq(chime_open(&sess, &o), 0);
	took = now_ns() - t0;
	fprintf(stderr, "the session reopened in %.1f ms beside %u sweeps of user 65534\n", took / 1e6, CONNS);
	chime_close(sess);
	chime_close(fill);
	t_chimed_stop(&b, SIGTERM);
	return took;
}

/*
 * Up to three tries: the host's noise only adds. 44-61 ms here, 243-260 ms
 * with the sweeps in turn by connection (three runs each).
 */
ReleaseTest(hostile, one_users_many_sweeps_hold_up_anothers_session_reopen_little, .timeout = 90)
{
	uint64_t took = UINT64_MAX;

	if (geteuid() != 0)
		cr_skip("needs root (to run as another user)");
	for (int try = 0; try < 3 && took >= 150 * MS; try++)
		took = reopen_beside_sweeps();
	cr_assert_lt(took, 150 * MS, "the session's reopen took %.1f ms beside the sweeps of another user's "
		     "connections", took / 1e6);
}

/*
 * A named session's park with a full ring. Its process goes with a 1M-slot
 * completion ring (--cq-size 1048576, the most chimed takes) full of
 * events delivered and not taken, one in eight a periodic's: the park
 * settles every delivered one-shot by its claim word and puts back what
 * the ring held in ring order. It did both whole in its first call, up to
 * a ring's worth each, where its sweep of the slab goes in steps: another
 * user's timers waited for the pass: up to 174-208 ms late (6 rounds; 19-26
 * ms with the nodes due in their order). Now they go in the sweep's steps
 * too (chan_park(), RECLAIM_BUDGET): 5-15 ms in 6 rounds of 7, this host's
 * (the seventh 28 ms, its median 10 us against 0.1: the host was busy);
 * on a quiet host later the same day 28-34 ms in 5 runs of 6. On
 * 2026-12-07 that was 14.2-19.8 ms (p99 5.2-10.8 ms, 4 runs), found: the
 * park's first call filled its 4 MiB park_order with CHIME_NIL, 10.3 ms of
 * page faults in one pass (now calloc()'s zero pages, faulted in a page a
 * step), and a pass walked 16384 of the ring's nodes, about 4 ms (now a
 * walked node costs 16 of the budget, WALK_COST). After both: 2.7-4.9 ms,
 * p99 0.5-1.9 ms (7 runs); the first alone: 5.9-6.8, p99 3.9-4.7.
 */
enum { PARK_TIMERS = 1040000 };        /* its quota, 1048576 less the grants of its 1024 slots */

static void session_ring_full_then_exited_as_nobody(const char *sock, uint64_t due, uint64_t drop_at, int ready)
{
	struct chime_opts o = { .socket_path = sock, .session = "full-ring" };
	chime_t *c;
	char one = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	if (chime_open(&c, &o) != 0)
		_exit(91);
	/* Due in an order other than their nodes': each one settled then costs a miss in the slab. */
	for (unsigned i = 0; i < PARK_TIMERS; i++)
		if (chime_arm(c, i, due + (i * UINT64_C(2654435761)) % (400 * MS), i % 8 ? 0 : 3600 * 1000 * MS,
			      0, &junk) != 0)
			_exit(92);
	(void)!write(ready, &one, 1);
	while (chime_now() < drop_at)
		usleep(1000);
	_exit(0);       /* the kernel closes its connection: the session parks */
}

ReleaseTest(hostile, a_session_that_goes_with_a_full_ring_does_not_hold_up_anothers_timers, .timeout = 90)
{
	uint64_t worst = latest_of_better_round("--shards 1 --allow-all --cq-size 1048576", session_ring_full_then_exited_as_nobody);

	cr_assert_lt(worst, 30 * MS, "another user's timer fired %.1f ms late while a session with %u events "
		     "delivered and not taken parked (twice)", worst / 1e6, PARK_TIMERS);
}

/*
 * A named session's park with its submission ring full. Its process goes
 * with a 1M-slot ring (--sq-size 1048576) of records published and not
 * applied: one thread's slot at the head reserved and never published, the
 * rest resets of its 500k timers behind it. The park applies what the
 * process published before it went, behind the hole too, a lap at most.
 */
enum { PARK_RESET_TIMERS = 500000 };

/* This process's (last mapped) rw segment: its channel's words and its submission slots. */
static bool own_rw(const struct chime_client_geom *g, struct chime_chan_rw **rw, struct chime_sqe **sq)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];

	*rw = NULL;
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo;

		if (strstr(line, "/memfd:chime-client-rw ") && sscanf(line, "%lx-", &lo) == 1) {
			*rw = (struct chime_chan_rw *)(lo + g->rw_chan_off);
			*sq = (struct chime_sqe *)(lo + g->rw_sq_off);
		}
	}
	if (f)
		fclose(f);
	return *rw != NULL;
}


static void session_records_unapplied_then_exited_as_nobody(const char *sock, uint64_t due, uint64_t drop_at,
							     int ready)
{
	struct chime_opts o = { .socket_path = sock, .session = "full-sq" };
	struct chime_client_geom g = { .nr_shards = 1, .sq_size = 1u << 20, .cq_size = 8192 };
	static chime_id_t ids[PARK_RESET_TIMERS];
	struct chime_chan_rw *rw = NULL;
	struct chime_sqe *sq = NULL;
	uint64_t head;
	char one = 1;
	chime_t *c;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0 ||
	    chime_client_layout(&g) != 0)
		_exit(90);
	if (chime_open(&c, &o) != 0)
		_exit(91);
	for (unsigned i = 0; i < PARK_RESET_TIMERS; i++)
		if (chime_arm(c, i, due + 3600 * 1000 * MS, 0, 0, &ids[i]) != 0)
			_exit(92);
	if (chime_flush(c) != 0)
		_exit(93);
	if (!own_rw(&g, &rw, &sq))
		_exit(94);
	(void)!write(ready, &one, 1);
	while (chime_now() < drop_at)
		usleep(1000);
	/* The head's slot reserved by a thread that never publishes; every other slot a reset, published. */
	head = at_load(&rw->sq_tail);
	for (uint64_t k = 1; k < g.sq_size; k++) {
		struct chime_sqe *s = &sq[(head + k) & (g.sq_size - 1)];

		s->op = CHIME_OP_RESET;
		s->id = ids[(k * UINT64_C(2654435761)) % PARK_RESET_TIMERS];
		s->deadline_ns = due + 3600 * 1000 * MS - (k * UINT64_C(2654435761)) % (3000 * 1000 * MS);
		at_store_rel(&s->seq, head + k + 1);
	}
	_exit(0);       /* the kernel closes its connection: the session parks */
}

ReleaseTest(hostile, a_session_that_goes_with_a_full_submission_ring_does_not_hold_up_anothers_timers,
	    .timeout = 90)
{
	uint64_t worst = latest_of_better_round("--shards 1 --allow-all --sq-size 1048576", session_records_unapplied_then_exited_as_nobody);

	cr_assert_lt(worst, 30 * MS, "another user's timer fired %.1f ms late while a session with %u records "
		     "published and not applied parked (twice)", worst / 1e6, (1u << 20) - 1);
}

/*
 * Connections with 1M-slot rings (--sq-size 1048576) that go. User 65534's
 * connections go one by one with their rings full of NOPs published and
 * not applied (published last to first, the head's slot the last, so that
 * the shard finds them all at once). A reclaim counts the refused arms left
 * in its ring (a slot read each) and frees a grant per slot (two of them
 * hold a grant in every slot, the user's quota; the others markers): in
 * its first call, another user's timers were 34.8-54.6 ms late (4 rounds,
 * 2026-12-07); in steps of the reclaim's budget, 5.0-7.2 ms.
 */
enum { RING_GOERS = 4 };

static void rings_of_nops_then_exited_as_nobody(const char *sock, uint64_t due, uint64_t drop_at, int ready)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_client_geom g = { .nr_shards = 1, .sq_size = 1u << 20, .cq_size = 8192 };
	int opened[2];
	char one = 1;

	(void)due;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0 ||
	    chime_client_layout(&g) != 0 || pipe(opened) < 0)
		_exit(90);
	for (unsigned k = 0; k < RING_GOERS; k++) {
		struct chime_chan_rw *rw = NULL;
		struct chime_sqe *sq = NULL;
		uint64_t head;
		chime_t *c;

		if (fork() != 0)
			continue;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (chime_open(&c, &o) != 0)
			_exit(91);
		if (!own_rw(&g, &rw, &sq))
			_exit(94);
		(void)!write(opened[1], &one, 1);
		while (chime_now() < drop_at + k * 200 * MS)
			usleep(1000);
		head = at_load(&rw->sq_tail);
		for (uint64_t i = g.sq_size; i-- > 0;) {
			struct chime_sqe *s = &sq[(head + i) & (g.sq_size - 1)];

			s->op = CHIME_OP_NOP;
			at_store_rel(&s->seq, head + i + 1);
		}
		_exit(0);       /* the kernel closes its connection: it is reclaimed */
	}
	for (unsigned k = 0; k < RING_GOERS; k++)
		if (read(opened[0], &one, 1) != 1)
			_exit(92);
	(void)!write(ready, &one, 1);
	for (;;)
		pause();
}

ReleaseTest(hostile, connections_that_go_with_1m_slot_rings_do_not_hold_up_anothers_timers, .timeout = 90)
{
	uint64_t worst = latest_of_better_round("--shards 1 --allow-all --sq-size 1048576", rings_of_nops_then_exited_as_nobody);

	cr_assert_lt(worst, 30 * MS, "another user's timer fired %.1f ms late while %u connections with rings of %u "
		     "NOPs published and not applied went (twice)", worst / 1e6, RING_GOERS, 1u << 20);
}

/*
 * Refused slots given room back. A client at its quota has a marker (no
 * grant) in the slot of its last arm, the last its ring reaches from its
 * tail; when one of its nodes is freed, the shard gives that slot a grant
 * at once (markers_replace()), found by a walk from the tail: every slot's
 * grant read, up to --sq-size (1M) a call, for each channel with a marker,
 * every pass. User 65534's 16 connections at --sq-size 1048576 (their
 * quota of 1M a shard all grants), each arming a timer due at once and
 * taking its event, again and again: another user's timers 20 ms late at
 * the median, up to 93-134 ms (2 runs; their connections open and idle:
 * 0.8 ms, up to 12). Now the walk finds them by a bit per slot
 * (marked_bits), 64 slots a word: 55-58 us at the median, up to 8.6-28 ms.
 * The median is judged: a pass's length is in every timer that waits for
 * it, where the maximum is also this host's preemption of a busy shard
 * (before, a round's maximum was 45 ms and another's 88).
 */
enum { MARKED_CONNS = 16 };

static void refused_and_freed_as_nobody(const char *sock, uint64_t due, uint64_t start_at, int ready)
{
	struct chime_opts o = { .socket_path = sock };
	struct chime_event ev[4];
	chime_t *c[MARKED_CONNS];
	char one = 1;

	(void)due;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
		_exit(90);
	for (unsigned k = 0; k < MARKED_CONNS; k++)
		if (chime_open(&c[k], &o) != 0)
			_exit(91);
	(void)!write(ready, &one, 1);
	while (chime_now() < start_at)
		usleep(1000);
	for (;;) {
		/* Each arm leaves a marker in its slot (the quota is all grants); each event taken frees a node. */
		for (unsigned k = 0; k < MARKED_CONNS; k++)
			(void)chime_arm(c[k], 1, 0, 0, 0, &junk);
		for (unsigned k = 0; k < MARKED_CONNS; k++)
			for (uint64_t t = chime_now(); chime_poll(c[k], ev, 4) == 0 && chime_now() < t + 100 * MS;)
				;
	}
}

ReleaseTest(hostile, refused_slots_given_room_back_do_not_hold_up_anothers_timers, .timeout = 90)
{
	uint64_t median = UINT64_MAX;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || geteuid() != 0)
		cr_skip("needs 2 CPUs and root (to pin the broker's threads and run as another user)");
	/* A second round only if the first was late: a busy shard preempted on a loaded host is not the pass. */
	for (int round = 0; round < 2 && median >= 3 * MS; round++) {
		(void)latest_beside("--shards 1 --allow-all --sq-size 1048576 --capacity 40000000 "
				    "--max-timers-per-uid 0", 15000, refused_and_freed_as_nobody);
		median = latest_median < median ? latest_median : median;
	}
	cr_assert_lt(median, 3 * MS, "another user's timers fired %.1f ms late at the median while one user's %u "
		     "connections at their quotas had refused slots given room back (twice)", median / 1e6,
		     MARKED_CONNS);
}
