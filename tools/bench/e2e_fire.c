/* SPDX-License-Identifier: MIT */
/*
 * e2e_fire.c - chime-bench e2e, phases 3 and 4: expirations per second and
 * lateness (chime and timerfd). See e2e.c.
 */
#include <chime.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chime_shm.h"
#include "e2e.h"

/* ------------------------------------------------------------------------ */
/* 3. expirations per second, 4. lateness                                     */
/* ------------------------------------------------------------------------ */

/*
 * Count one event for timer `idx` of `n`. seen[] guards exactly-once.
 * Returns 1 if new, 0 if a duplicate (reported).
 */
static int seen_once(uint8_t *seen, size_t n, uint64_t idx, const char *who)
{
	if (idx >= n) {
		PROBLEM("%s: event with user_data %" PRIu64 " (only %zu armed)\n", who, idx, n);
		return 0;
	}
	if (seen[idx]) {
		if (seen[idx] == 1)
			PROBLEM("%s: timer %" PRIu64 " delivered more than once\n", who, idx);
		seen[idx] = 2;
		return 0;
	}
	seen[idx] = 1;
	return 1;
}

/* Report the first few timers never delivered. */
static void report_missing(const uint8_t *seen, size_t n, size_t got, const char *who)
{
	size_t shown = 0;

	if (got == n)
		return;
	PROBLEM("%s: %zu of %zu expirations never arrived; first missing:", who, n - got, n);
	for (size_t i = 0; i < n && shown < 8; i++)
		if (!seen[i]) {
			printf(" #%zu", i);
			shown++;
		}
	printf("\n");
}

int lat_armed_late(uint64_t t0, size_t n, const char *who)
{
	uint64_t t = now_ns();

	if (t < t0)
		return 0;
	PROBLEM("%s lateness: arming %zu timers took %.0f ms past the earliest deadline; not measured\n", who, n,
		(double)(t - t0) / 1e6);
	return 1;
}

int run_expire_chime(const struct broker *b, size_t n, uint64_t gap_ns, int busy_poll,
		     struct expire_result *res)
{
	struct shard_sum s0, s1;
	uint64_t cpu_first = 0, cpu_last = 0;
	struct chime_event ev[EV_BATCH];
	uint8_t *seen = xcalloc(n, 1);
	chime_t *c;
	uint64_t d, t_last = 0, t_first = 0, idle_since;
	size_t got = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	for (int attempt = 0;; attempt++) {
		int r = 0;

		if (broker_open((struct broker *)b, 0, &c) < 0) {
			free(seen);
			return -1;
		}
		d = now_ns() + gap_ns;
		for (size_t i = 0; i < n && r == 0; i++) {
			chime_id_t id;

			r = chime_arm(c, 7, d, 0, i, &id);
		}
		if (r < 0) {
			PROBLEM("chime_arm failed: %s\n", strerror(-r));
			chime_close(c);
			free(seen);
			return -1;
		}
		/* The broker must hold them all before the deadline, or this measures arming. */
		for (;;) {
			struct shard_sum s;

			shards_read(b, &s);
			if (s.armed >= n || s.t_ns >= d)
				break;
			sleep_ns(100000);
		}
		if (now_ns() + NS_PER_MS < d)
			break;
		chime_close(c);
		if (attempt == 2) {
			PROBLEM("could not arm %zu timers within %.1f s; expiration rate not measured\n",
				n, (double)gap_ns / 1e9);
			free(seen);
			return -1;
		}
		wait_armed(b, 0, 60 * NS_PER_S);
		gap_ns *= 2;
	}

	sleep_until(d - 2 * NS_PER_MS);
	shards_read(b, &s0);
	sleep_until(d - NS_PER_MS);
	idle_since = now_ns();
	while (got < n) {
		int k = busy_poll ? chime_poll(c, ev, EV_BATCH) : chime_wait(c, ev, EV_BATCH, 100);
		uint64_t t = now_ns();

		if (k < 0) {
			PROBLEM("%s: %s\n", busy_poll ? "chime_poll" : "chime_wait", strerror(-k));
			break;
		}
		if (k == 0) {
			if (t - idle_since > 5 * NS_PER_S)
				break;
			continue;
		}
		idle_since = t;
		if (!t_first) {
			t_first = t;
			cpu_first = thread_cpu_ns();
		}
		for (int i = 0; i < k; i++) {
			if (ev[i].fired_ns < ev[i].deadline_ns || t < d)
				PROBLEM("chime: timer %" PRIu64 " fired early\n", ev[i].user_data);
			got += (size_t)seen_once(seen, n, ev[i].user_data, "chime expire");
		}
		t_last = t;
	}
	cpu_last = thread_cpu_ns();
	/* The shards publish their counters at least once a millisecond while awake, and before they sleep. */
	sleep_ns(3 * NS_PER_MS);
	shards_read(b, &s1);
	report_missing(seen, n, got, "chime expire");
	if (got) {
		res->client_cpu = (double)(cpu_last - cpu_first) / (double)got;
		res->shard_cpu = (double)(s1.cpu_ns - s0.cpu_ns) / (double)got;
	}
	res->ok = got == n;
	res->drain_ns = t_last > d ? t_last - d : 0;
	res->first_ns = t_first > d ? t_first - d : 0;
	res->per_s = res->drain_ns ? (double)got / (double)res->drain_ns * 1e9 : 0;
	chime_close(c);
	free(seen);
	wait_armed(b, 0, 60 * NS_PER_S);
	return 0;
}

int run_expire_tfd(size_t n, uint64_t gap_ns, struct expire_result *res)
{
	struct epoll_event ev[EV_BATCH];
	int *fds = xcalloc(n, sizeof(int));
	uint8_t *seen = xcalloc(n, 1);
	uint64_t d, t_last = 0, t_first = 0, idle_since;
	size_t got = 0, made = 0;
	int ep = epoll_create1(EPOLL_CLOEXEC), ret = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	for (; made < n; made++) {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = made };

		fds[made] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (fds[made] < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fds[made], &e) < 0) {
			fprintf(stderr, "%s: timerfd %zu: %s\n", bench_prog, made, strerror(errno));
			if (fds[made] >= 0)
				close(fds[made]);
			ret = -1;
			goto out;
		}
	}
	/* All armed before the deadline, or this measures arming: chime's rule (run_expire_chime) */
	for (int attempt = 0;; attempt++) {
		d = now_ns() + gap_ns;
		for (size_t i = 0; i < n; i++)
			if ((ret = tfd_set(fds[i], d)) < 0) {
				PROBLEM("timerfd expire: timerfd_settime: %s\n", strerror(-ret));
				ret = -1;
				goto out;
			}
		if (now_ns() + NS_PER_MS < d)
			break;
		if (attempt == 2) {
			PROBLEM("could not arm %zu timerfds within %.1f s; expiration rate not measured\n", n,
				(double)gap_ns / 1e9);
			ret = -1;
			goto out;
		}
		gap_ns *= 2;    /* re-arming clears what fired meanwhile: a read then gets EAGAIN */
	}
	sleep_until(d - NS_PER_MS);
	idle_since = now_ns();
	while (got < n) {
		int k = epoll_wait(ep, ev, EV_BATCH, 100);
		uint64_t t;

		if (k < 0 && errno == EINTR)
			continue;
		t = now_ns();
		if (k <= 0) {
			if (t - idle_since > 5 * NS_PER_S)
				break;
			continue;
		}
		idle_since = t;
		if (!t_first)
			t_first = t;
		for (int i = 0; i < k; i++) {
			uint64_t cnt;

			if (read(fds[ev[i].data.u64], &cnt, sizeof(cnt)) == sizeof(cnt))
				got += (size_t)seen_once(seen, n, ev[i].data.u64, "timerfd expire");
		}
		t_last = now_ns();
	}
	report_missing(seen, n, got, "timerfd expire");
	res->ok = got == n;
	res->drain_ns = t_last > d ? t_last - d : 0;
	res->first_ns = t_first > d ? t_first - d : 0;
	res->per_s = res->drain_ns ? (double)got / (double)res->drain_ns * 1e9 : 0;
out:
	for (size_t i = 0; i < made; i++)
		close(fds[i]);
	close(ep);
	free(fds);
	free(seen);
	return ret;
}

int run_lat_chime(const struct broker *b, size_t n, uint64_t span_ns, int busy_poll,
		  struct lat_result *res)
{
	struct chime_event ev[EV_BATCH];
	uint64_t *dl = xcalloc(n, sizeof(uint64_t)), rng = 0x9e3779b97f4a7c15u, t0, end;
	uint8_t *seen = xcalloc(n, 1);
	chime_t *c;
	size_t got = 0;
	int r = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	res->fired = xcalloc(n, sizeof(uint64_t));
	res->recv = xcalloc(n, sizeof(uint64_t));
	if (broker_open((struct broker *)b, 0, &c) < 0) {
		free(dl);
		free(seen);
		return -1;
	}
	t0 = now_ns() + LAT_LEAD_NS(n);
	for (size_t i = 0; i < n && r == 0; i++) {
		chime_id_t id;

		dl[i] = t0 + splitmix64(&rng) % span_ns;
		if ((r = chime_arm(c, 9, dl[i], 0, i, &id)) < 0)
			PROBLEM("chime lateness: chime_arm: %s\n", strerror(-r));
	}
	if (r == 0 && lat_armed_late(t0, n, "chime"))
		r = -ETIME;
	/* after a failure, no figure: chime_close() below reclaims what was armed */
	end = r == 0 ? t0 + span_ns + 5 * NS_PER_S : 0;
	while (got < n && now_ns() < end) {
		int k = busy_poll ? chime_poll(c, ev, EV_BATCH) : chime_wait(c, ev, EV_BATCH, 100);
		uint64_t t = now_ns();

		if (k == -EINTR)
			continue;
		if (k < 0) {
			PROBLEM("chime_wait: %s\n", strerror(-k));
			break;
		}
		for (int i = 0; i < k; i++) {
			uint64_t idx = ev[i].user_data;

			if (!seen_once(seen, n, idx, "chime lateness"))
				continue;
			if (ev[i].deadline_ns != dl[idx])
				PROBLEM("chime: timer %" PRIu64 " came back with deadline %" PRIu64 ", armed %" PRIu64 "\n",
					idx, ev[i].deadline_ns, dl[idx]);
			if (ev[i].fired_ns < dl[idx] || t < dl[idx])
				PROBLEM("chime: timer %" PRIu64 " fired early (fired %" PRId64 " ns, received %" PRId64
					" ns after its deadline)\n", idx, (int64_t)(ev[i].fired_ns - dl[idx]),
					(int64_t)(t - dl[idx]));
			res->fired[got] = ev[i].fired_ns > dl[idx] ? ev[i].fired_ns - dl[idx] : 0;
			res->recv[got] = t > dl[idx] ? t - dl[idx] : 0;
			got++;
		}
	}
	if (r == 0)
		report_missing(seen, n, got, "chime lateness");
	res->got = got;
	qsort(res->fired, got, sizeof(uint64_t), cmp_u64);
	qsort(res->recv, got, sizeof(uint64_t), cmp_u64);
	chime_close(c);
	free(dl);
	free(seen);
	wait_armed(b, 0, 60 * NS_PER_S);
	return r < 0 ? -1 : 0;
}

int run_lat_tfd(size_t n, uint64_t span_ns, struct lat_result *res)
{
	struct epoll_event ev[EV_BATCH];
	uint64_t *dl = xcalloc(n, sizeof(uint64_t)), rng = 0x9e3779b97f4a7c15u, t0, end;
	int *fds = xcalloc(n, sizeof(int));
	uint8_t *seen = xcalloc(n, 1);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	size_t got = 0, made = 0, created;

	memset(res, 0, sizeof(*res));
	res->n = n;
	res->recv = xcalloc(n, sizeof(uint64_t));
	/* Made first, untimed: the deadlines are set from a clock read after them */
	for (; made < n; made++) {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = made };

		fds[made] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (fds[made] < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fds[made], &e) < 0) {
			fprintf(stderr, "%s: timerfd %zu: %s\n", bench_prog, made, strerror(errno));
			if (fds[made] >= 0)
				close(fds[made]);
			break;
		}
	}
	created = made;
	t0 = now_ns() + LAT_LEAD_NS(made);
	for (size_t i = 0; i < made; i++) {
		int r;

		dl[i] = t0 + splitmix64(&rng) % span_ns;
		if ((r = tfd_set(fds[i], dl[i])) < 0) {
			fprintf(stderr, "%s: timerfd %zu: timerfd_settime: %s\n", bench_prog, i, strerror(-r));
			made = i;
			break;
		}
	}
	if (made < n || lat_armed_late(t0, n, "timerfd"))
		made = 0;       /* no figure: the loop below does not wait */
	end = t0 + span_ns + 5 * NS_PER_S;
	while (got < made && now_ns() < end) {
		int k = epoll_wait(ep, ev, EV_BATCH, 100);

		for (int i = 0; i < k; i++) {
			uint64_t idx = ev[i].data.u64, cnt, t;

			if (read(fds[idx], &cnt, sizeof(cnt)) != sizeof(cnt) || !seen_once(seen, n, idx, "timerfd"))
				continue;
			/* in hand once read: the reads before it in this batch delay it, as they would an application */
			t = now_ns();
			res->recv[got++] = t > dl[idx] ? t - dl[idx] : 0;
		}
	}
	res->got = got;
	qsort(res->recv, got, sizeof(uint64_t), cmp_u64);
	for (size_t i = 0; i < created; i++)
		close(fds[i]);
	close(ep);
	free(fds);
	free(dl);
	free(seen);
	return made == n ? 0 : -1;
}

/*
 * What a perfect busy-poller would see: the same deadlines, sorted, and a
 * loop that does nothing but read the clock. Its lateness is the time the
 * machine took the core away (another thread, the hypervisor): the floor
 * under chime's busy-poll figures, measured in the same run.
 */
int run_lat_spin(size_t n, uint64_t span_ns, struct lat_result *res)
{
	uint64_t *dl = xcalloc(n, sizeof(uint64_t)), rng = 0x9e3779b97f4a7c15u, t0;
	size_t got = 0;

	memset(res, 0, sizeof(*res));
	res->n = n;
	res->recv = xcalloc(n, sizeof(uint64_t));
	t0 = now_ns() + 10 * NS_PER_MS;
	for (size_t i = 0; i < n; i++)
		dl[i] = t0 + splitmix64(&rng) % span_ns;
	qsort(dl, n, sizeof(uint64_t), cmp_u64);
	while (got < n) {
		uint64_t t = now_ns();

		while (got < n && dl[got] <= t) {
			res->recv[got] = t - dl[got];
			got++;
		}
	}
	res->got = got;
	qsort(res->recv, got, sizeof(uint64_t), cmp_u64);
	free(dl);
	return 0;
}
