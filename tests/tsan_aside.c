/* SPDX-License-Identifier: MIT */
/*
 * tsan_aside.c - broker/aside.c under ThreadSanitizer.
 *
 * Criterion cannot run under TSan (../shared/STYLE.md section 9), so this is a plain
 * program: exit 0 on success, 1 on a failed check; TSan itself exits 66 on
 * a report. What it exercises: the owner posting closes and populates
 * while the threads run them, reaping results (aside_reap()'s lock-free
 * look at `finished`), draining, adding threads (aside_unstick()) while
 * some end idle, and a stop that gives up on a thread still in a job (an
 * orphan, freed by its last thread).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "aside.h"
#include "helpers.h"

#define FAIL(...)							\
	do {								\
		fprintf(stderr, "tsan_aside: " __VA_ARGS__);		\
		fputc('\n', stderr);					\
		exit(1);						\
	} while (0)

#define ROUNDS 200u
#define PER    32u

int main(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	char *mem = mmap(NULL, page * PER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	unsigned posted = 0, reaped = 0;
	struct aside *a;

	if (mem == MAP_FAILED || wake < 0)
		FAIL("mmap or eventfd: %d", errno);
	if (aside_start(&a, "tsan-aside", wake, 4) < 0)
		FAIL("aside_start");
	for (unsigned r = 0; r < ROUNDS; r++) {
		struct aside_job out[PER];

		for (unsigned i = 0; i < PER; i++) {
			struct aside_job j = { .op = ASIDE_CLOSE, .fd = eventfd(0, EFD_CLOEXEC) };

			if (i % 4 == 0)
				j = (struct aside_job){ .op = ASIDE_POPULATE, .fd = -1, .addr = mem + i * page,
							.plen = page, .ud = r * PER + i };
			if (!aside_post(a, &j))
				FAIL("post");
			posted += j.op == ASIDE_POPULATE;
		}
		(void)aside_unstick(a);         /* as a heartbeat would, the jobs in flight */
		reaped += aside_reap(a, out, PER);
		if (r % 8 == 0) {
			unsigned n;

			aside_drain(a);
			while ((n = aside_reap(a, out, PER)) > 0)
				reaped += n;
			if (reaped != posted)
				FAIL("round %u: %u results reaped of %u", r, reaped, posted);
		}
	}
	aside_drain(a);
	while (reaped < posted) {
		struct aside_job out[PER];

		reaped += aside_reap(a, out, PER);
	}
	if (!aside_stop(a, UINT64_MAX))
		FAIL("stop");

	/* An orphan: a stop that gives up on a thread held in a lingering close, which then frees it all. */
	{
		int peer, listener, t = t_lingering_tcp_socket(20, &peer, &listener);

		if (t < 0)
			FAIL("no lingering TCP socket: %d", errno);
		if (aside_start(&a, "tsan-aside", -1, 2) < 0)
			FAIL("aside_start");
		if (!aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = t }))
			FAIL("post");
		for (unsigned i = 0; i < PER; i++)
			if (!aside_post(a, &(struct aside_job){ .op = ASIDE_CLOSE, .fd = eventfd(0, EFD_CLOEXEC) }))
				FAIL("post");
		usleep(100 * 1000);
		(void)aside_unstick(a);
		usleep(100 * 1000);
		if (aside_unstick(a) != 1)
			FAIL("no thread added behind the lingering close");
		if (aside_stop(a, 200u * 1000000u))
			FAIL("the stop waited out a 20 s linger");
		close(peer);    /* the linger ends: the last thread frees the set */
		close(listener);
		usleep(300 * 1000);
	}
	close(wake);
	munmap(mem, page * PER);
	return 0;
}
