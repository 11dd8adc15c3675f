/* SPDX-License-Identifier: MIT */
/*
 * test_aside.c - broker/aside.c: blocking calls run on a thread of the
 * owner's, in posting order, their results reaped by the owner.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "aside.h"
#include "helpers.h"

#define PAGES 64u

static size_t page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

/* How many of the n pages at p are resident in this process's page tables' view (mincore). */
static unsigned resident(void *p, unsigned n)
{
	unsigned char vec[PAGES];
	unsigned k = 0;

	cr_assert(n <= PAGES);
	cr_assert_eq(mincore(p, n * page_size(), vec), 0, "mincore: %s", strerror(errno));
	for (unsigned i = 0; i < n; i++)
		k += vec[i] & 1;
	return k;
}

/* Reap exactly one result, after draining. */
static struct aside_job reap_one(struct aside *a)
{
	struct aside_job out[2];

	aside_drain(a);
	cr_assert_eq(aside_reap(a, out, 2), 1);
	return out[0];
}

Test(aside, a_populate_maps_the_pages_and_its_result_wakes_the_owner)
{
	struct aside *a;
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int fd = memfd_create("aside", MFD_CLOEXEC);
	size_t len = PAGES * page_size();
	eventfd_t v = 0;
	void *p;
	struct aside_job j;

	cr_assert(efd >= 0 && fd >= 0);
	cr_assert_eq(ftruncate(fd, (off_t)len), 0);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED);
	cr_assert_eq(resident(p, PAGES), 0, "a fresh memfd mapping has no pages");
	cr_assert_eq(aside_start(&a, "t-aside", efd, 1), 0);
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_POPULATE, .fd = -1, .addr = p, .plen = len,
						      .ud = 42 }));
	j = reap_one(a);
	cr_assert_eq(j.ud, 42);
	if (j.res == -EINVAL)
		cr_skip_test("MADV_POPULATE_WRITE: not in this kernel (5.14)");
	cr_assert_eq(j.res, 0, "populate: %s", strerror(-j.res));
	cr_assert_eq(resident(p, PAGES), PAGES);
	cr_assert_eq(eventfd_read(efd, &v), 0);
	cr_assert_eq(v, 1, "one result, one wake-up");
	cr_assert_eq(aside_reap(a, &j, 1), 0, "reaped once");
	cr_assert(aside_stop(a, UINT64_MAX));
	munmap(p, len);
	close(fd);
	close(efd);
}

Test(aside, a_reserve_allocates_then_maps_and_a_failed_fallocate_maps_nothing)
{
	struct aside *a;
	int fd = memfd_create("aside", MFD_CLOEXEC);
	size_t len = PAGES * page_size();
	struct stat st;
	struct aside_job j;
	char path[64];
	void *p;
	int ro;

	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, (off_t)len), 0);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED);
	cr_assert_eq(aside_start(&a, "t-aside", -1, 1), 0);
	/* The first half reserved and mapped; the second half's fallocate fails (a read-only descriptor). */
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_RESERVE, .fd = fd, .off = 0, .len = len / 2,
						      .addr = p, .plen = len / 2, .ud = 1 }));
	j = reap_one(a);
	if (j.res == -EINVAL)
		cr_skip_test("MADV_POPULATE_WRITE: not in this kernel (5.14)");
	cr_assert_eq(j.res, 0, "reserve: %s", strerror(-j.res));
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_geq((uint64_t)st.st_blocks * 512u, len / 2, "allocated: %lld blocks", (long long)st.st_blocks);
	cr_assert_eq(resident(p, PAGES / 2), PAGES / 2);

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert(ro >= 0);
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_RESERVE, .fd = ro, .off = len / 2, .len = len / 2,
						      .addr = (char *)p + len / 2, .plen = len / 2, .ud = 2 }));
	j = reap_one(a);
	cr_assert_eq(j.ud, 2);
	cr_assert_eq(j.res, -EBADF, "fallocate on a read-only descriptor: %d", j.res);
	cr_assert_eq(resident((char *)p + len / 2, PAGES / 2), 0, "nothing mapped after a failed fallocate");
	cr_assert(aside_stop(a, UINT64_MAX));
	close(ro);
	munmap(p, len);
	close(fd);
}

Test(aside, closes_run_in_order_give_no_result_and_a_stop_runs_what_is_queued)
{
	enum { N = 200 };
	struct aside *a;
	struct aside_job out[4];
	int fds[N];

	cr_assert_eq(aside_start(&a, "t-aside", -1, 1), 0);
	for (int i = 0; i < N; i++) {
		fds[i] = eventfd(0, EFD_CLOEXEC);
		cr_assert(fds[i] >= 0);
		cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = fds[i] }));
	}
	/* A result posted after them is reaped once they have all run. */
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_POPULATE, .fd = -1, .addr = NULL, .plen = 0,
						      .ud = 7 }));
	aside_drain(a);
	cr_assert_eq(aside_reap(a, out, 4), 1, "closes have no result");
	cr_assert_eq(out[0].ud, 7);
	for (int i = 0; i < N; i++)
		cr_assert_eq(fcntl(fds[i], F_GETFD), -1, "fd %d still open", fds[i]);
	/* Queued, then stopped at once: the stop runs them before the thread ends. */
	for (int i = 0; i < N; i++) {
		fds[i] = eventfd(0, EFD_CLOEXEC);
		cr_assert(fds[i] >= 0);
		cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = fds[i] }));
	}
	cr_assert(aside_stop(a, UINT64_MAX));
	for (int i = 0; i < N; i++)
		cr_assert_eq(fcntl(fds[i], F_GETFD), -1, "fd %d still open after the stop", fds[i]);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * Closes held up by a client (two lingering sockets, 20 s each) hold a
 * thread each: the owner's next calls of aside_unstick() add threads, and
 * a close queued behind them runs within those calls. With one thread
 * the pipe would stay open for the whole linger. The stop does not wait
 * for the lingering ones.
 */
Test(aside, closes_held_up_get_threads_of_their_own_and_the_others_go_on, .timeout = 30)
{
	enum { LINGER_S = 20 };
	int t[2], peer[2], listener[2], pfd[2];
	struct aside *a;
	uint64_t t0, took;
	unsigned added = 0;
	struct pollfd p;

	cr_assert_eq(aside_start(&a, "t-closer", -1, 4), 0);
	for (int i = 0; i < 2; i++) {
		t[i] = t_lingering_tcp_socket(LINGER_S, &peer[i], &listener[i]);
		cr_assert_geq(t[i], 0, "no lingering TCP socket: %s", strerror(errno));
		cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = t[i] }));
	}
	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = pfd[1] }));
	t0 = mono_ms();
	p = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	/* As the owner's heartbeat would: every 90 ms, until the pipe's write end is closed (EOF). */
	while (poll(&p, 1, 90) == 0 && mono_ms() - t0 < 5000)
		added += aside_unstick(a) == 1;
	took = mono_ms() - t0;
	fprintf(stderr, "a close behind two lingering ones: %llu ms, %u threads added\n", (unsigned long long)took,
		added);
	cr_assert(p.revents & POLLHUP, "the pipe's write end still open after %llu ms", (unsigned long long)took);
	cr_assert_lt(took, 2000, "%llu ms", (unsigned long long)took);
	cr_assert_eq(added, 2, "one thread for the second lingering close, one for the pipe's");
	cr_assert_eq(aside_unstick(a), 0, "nothing waits: no thread added");
	t0 = mono_ms();
	cr_assert_not(aside_stop(a, 200u * 1000000u), "the lingering closes outlast the stop's wait");
	took = mono_ms() - t0;
	cr_assert_lt(took, 1000, "the stop waited %llu ms", (unsigned long long)took);
	for (int i = 0; i < 2; i++) {
		close(peer[i]);         /* the lingering closes end: their threads free what is left */
		close(listener[i]);
	}
	close(pfd[0]);
}

/* Held up at max_threads (one here): jobs wait, and aside_unstick() says so (the broker logs it). */
Test(aside, a_set_held_up_at_its_bound_says_so, .timeout = 30)
{
	int t, peer, listener, pfd[2];
	struct aside *a;

	cr_assert_eq(aside_start(&a, "t-closer", -1, 1), 0);
	t = t_lingering_tcp_socket(20, &peer, &listener);
	cr_assert_geq(t, 0, "no lingering TCP socket: %s", strerror(errno));
	cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = t }));
	cr_assert(aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = pfd[1] }));
	usleep(100 * 1000);
	cr_assert_eq(aside_unstick(a), 0, "a job was taken since the last look");
	cr_assert_eq(aside_unstick(a), -EBUSY, "a close waits behind the one thread there may be");
	cr_assert_neq(fcntl(pfd[1], F_GETFD), -1, "the pipe's close waits");
	close(peer);    /* the linger ends, and the pipe's close runs */
	close(listener);
	aside_drain(a);
	cr_assert_eq(fcntl(pfd[1], F_GETFD), -1, "the pipe's write end still open");
	cr_assert_eq(aside_unstick(a), 0);
	cr_assert(aside_stop(a, UINT64_MAX));
	close(pfd[0]);
}

Test(aside, no_thread_means_the_caller_makes_the_call)
{
	struct aside_job out;

	cr_assert_not(aside_post(NULL, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = -1 }));
	cr_assert_eq(aside_reap(NULL, &out, 1), 0);
	cr_assert_eq(aside_unstick(NULL), 0);
	aside_drain(NULL);
	cr_assert(aside_stop(NULL, 0));
}
