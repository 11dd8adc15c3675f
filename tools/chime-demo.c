/* SPDX-License-Identifier: MIT */
/*
 * chime-demo - arm many timers from several threads through a running chimed
 * and show, once a second, how many fired and how late.
 *
 * Each arming thread spreads its share of timers evenly over --seconds, each
 * with a deadline a random 1..--max-ms milliseconds ahead. The main thread
 * drains with chime_wait(). Lateness is measured twice: by the broker
 * (fired_ns - deadline_ns: wheel resolution plus the shard's wake-up) and by
 * this process (when chime_wait() handed the event over - deadline_ns: adds
 * the delivery to the client). Exit status 0 only if every timer fired
 * exactly once and none fired early: each event is matched to the timer it
 * is for (key: its number in its thread's share; user_data: this run's id
 * and the thread), so that a duplicate is seen as one even when another
 * timer is missing, and so that the events of timers an earlier process
 * left in the session (-S) are told apart from this run's. If the broker
 * refuses an arm (its quota or capacity), that thread stops and the demo
 * waits only for the timers that were armed.
 */
#include <chime.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chime_shm.h"     /* CHIME_DEFAULT_SOCKET */
#include "cliarg.h"       /* chime_parse_u64() */
#include "clock.h"       /* splitmix64() */
#include "paths.h"       /* chime_socket_path() */
#include "segment.h"     /* chime_socket_absent_why() */
#include "statsread.h"   /* sr_stdout_check() */

#define NSEC_PER_SEC UINT64_C(1000000000)
#define NSEC_PER_MSEC UINT64_C(1000000)

/* Every timer armed fired once and never early, but the broker refused some arms. */
#define EXIT_REFUSED 3

struct demo {
	chime_t *chime;
	uint64_t timers;        /* in all */
	unsigned threads;
	unsigned seconds;
	unsigned max_ms;
	uint64_t start_ns;
	uint64_t run_id;        /* the high 32 bits of this run's user_data (never 0); the low: the thread */
};

/* What the events said: this run's timers (each counted once), and the rest. */
struct tally {
	uint64_t fired;         /* timers of this run that fired (once each) */
	uint64_t early;         /* of those, fired or received before their deadline */
	uint64_t twice;         /* events of a timer of this run that had fired already */
	uint64_t foreign;       /* events of timers this run did not arm (an earlier process's, in its session) */
	uint64_t per_sec;
	uint8_t *seen;          /* a bit per timer of this run: fired */
	uint64_t *broker_lat, *client_lat;
};

struct arm_thread {
	pthread_t tid;
	struct demo *demo;
	unsigned index;
	_Atomic uint64_t armed;
	_Atomic int error;      /* first chime_arm() error, 0 if none; the thread then stops */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chime-demo [OPTIONS]\n"
		"Arm timers through a running chimed and report fires per second and lateness.\n"
		"\n"
		"  -s, --socket PATH   broker socket (default: $CHIME_SOCKET, else\n"
		"                      " CHIME_DEFAULT_SOCKET ")\n"
		"  -n, --timers N      timers to arm in all (1..100000000, default 1000000)\n"
		"  -t, --threads N     arming threads (1..64, default 4)\n"
		"  -d, --seconds N     spread the arming over N seconds (1..3600, default 3)\n"
		"  -m, --max-ms N      each deadline is 1..N ms after arming (1..60000,\n"
		"                      default 200)\n"
		"  -S, --session NAME  arm in the named session (it lives through a broker\n"
		"                      restart)\n"
		"  -h, --help          show this help\n"
		"  -V, --version       show the version\n"
		"\n"
		"Exit status: 0 if every timer fired exactly once and never early, 1 otherwise,\n"
		"2 on a usage error, 3 if every timer armed fired so but the broker refused\n"
		"some arms (chime_arm() EDQUOT or ENOMEM: its --max-timers-per-client,\n"
		"--max-timers-per-uid or --capacity).\n");
}

static const char *plural(uint64_t n)
{
	return n == 1 ? "" : "s";
}

/* The broker's limits, which a user can raise, as opposed to a lost broker. */
static int arm_refused(int error)
{
	return error == -EDQUOT || error == -ENOMEM;
}

static const char *arm_error_hint(int error)
{
	switch (error) {
	case -EDQUOT:
		return " (the broker's quota of timers for this client or its user is reached:"
		       " chimed --max-timers-per-client, --max-timers-per-uid)";
	case -ENOMEM:
		return " (the broker has no free timer node: chimed --capacity, or its filesystem is full)";
	case -ENOTCONN:
		return " (the broker is gone)";
	default:
		return "";
	}
}

/* Thread i's share of the timers, and the number of its first in the run's numbering. */
static uint64_t share_of(const struct demo *d, unsigned i)
{
	return d->timers / d->threads + (i < d->timers % d->threads);
}

static uint64_t first_of(const struct demo *d, unsigned i)
{
	uint64_t rest = d->timers % d->threads;

	return (uint64_t)i * (d->timers / d->threads) + (i < rest ? i : rest);
}

/*
 * Count ev[0..n) into t, stamped `now` (when chime_wait() handed them over):
 * each one of this run's timers once, its duplicates and the events of
 * timers it did not arm apart.
 */
static void tally_events(const struct demo *d, struct tally *t, const struct chime_event *ev, int n, uint64_t now)
{
	for (int i = 0; i < n; i++) {
		uint64_t thread = ev[i].user_data & 0xffffffffu, k;

		if ((ev[i].user_data & ~UINT64_C(0xffffffff)) != d->run_id || thread >= d->threads ||
		    ev[i].key >= share_of(d, (unsigned)thread)) {
			t->foreign++;
			continue;
		}
		k = first_of(d, (unsigned)thread) + ev[i].key;
		if (t->seen[k / 8] & (1u << (k % 8))) {
			t->twice++;
			continue;
		}
		t->seen[k / 8] |= (uint8_t)(1u << (k % 8));
		if (ev[i].fired_ns < ev[i].deadline_ns || now < ev[i].deadline_ns)
			t->early++;
		t->broker_lat[t->fired] = ev[i].fired_ns - ev[i].deadline_ns;
		t->client_lat[t->fired] = now - ev[i].deadline_ns;
		t->fired++;
		t->per_sec++;
	}
}

/* What will fire: a thread's whole share, unless it stopped at an error (counted in *failed). */
static uint64_t timers_expected(struct demo *d, struct arm_thread *threads, unsigned *failed)
{
	uint64_t sum = 0;

	*failed = 0;
	for (unsigned i = 0; i < d->threads; i++) {
		/* DEMO1: the thread's count before its error; pairs with DEMO2 in arm_main(). */
		if (atomic_load_explicit(&threads[i].error, memory_order_acquire)) {
			sum += atomic_load_explicit(&threads[i].armed, memory_order_relaxed);
			++*failed;
		} else {
			sum += share_of(d, i);
		}
	}
	return sum;
}

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = { .tv_sec = (time_t)(t_ns / NSEC_PER_SEC),
			       .tv_nsec = (long)(t_ns % NSEC_PER_SEC) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Arm this thread's share in 10 ms steps so the load is spread over the run. */
static void *arm_main(void *arg)
{
	struct arm_thread *t = arg;
	struct demo *d = t->demo;
	uint64_t share = share_of(d, t->index);
	uint64_t steps = (uint64_t)d->seconds * 100, done = 0;
	uint64_t seed = 0x5eed0000ull + t->index;

	for (uint64_t step = 1; step <= steps && !t->error; step++) {
		uint64_t target = share * step / steps;

		for (; done < target; done++) {
			uint64_t delay = (1 + splitmix64(&seed) % d->max_ms) * NSEC_PER_MSEC;
			chime_id_t id;
			int r = chime_arm(d->chime, done, chime_now() + delay, 0, d->run_id | t->index, &id);

			if (r < 0) {
				atomic_store_explicit(&t->armed, done, memory_order_relaxed);
				/* DEMO2: pairs with DEMO1 in timers_expected(). */
				atomic_store_explicit(&t->error, r, memory_order_release);
				break;
			}
		}
		sleep_until(d->start_ns + step * 10 * NSEC_PER_MSEC);
	}
	if (!t->error)
		atomic_store_explicit(&t->armed, done, memory_order_relaxed);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Percentiles of lat[0..n) (sorted in place), printed in microseconds. */
static void print_lateness(const char *what, uint64_t *lat, size_t n)
{
	if (n == 0) {
		printf("  %-8s -\n", what);
		return;
	}
	qsort(lat, n, sizeof(*lat), cmp_u64);
	printf("  %-8s p50 %7.1f us  p99 %7.1f us  max %7.1f us\n", what,
	       lat[n / 2] / 1e3, lat[(n * 99) / 100] / 1e3, lat[n - 1] / 1e3);
}

static int parse_uint(const char *s, const char *opt, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v;

	if (chime_parse_u64(s, &v) < 0 || v < min || v > max) {
		fprintf(stderr, "chime-demo: invalid %s '%s' (expected %" PRIu64 "..%" PRIu64 ")\n",
			opt, s, min, max);
		return -1;
	}
	*out = v;
	return 0;
}

/*
 * Past the last deadline by more than the slack (give_up), wait on only
 * while events still come: a broker restarted on a busy host delivers late
 * what came due meanwhile (a documentation audit saw events 4.3 s late,
 * still arriving, said to be missing). A timer really lost ends the wait
 * LATE_QUIET_NS after the slack or the last event, whichever is later;
 * LATE_MAX_NS is libchime's own bound on a reconnect ($CHIME_RECONNECT_S).
 */
#define LATE_QUIET_NS (2 * NSEC_PER_SEC)
#define LATE_MAX_NS   (30 * NSEC_PER_SEC)

static bool still_waiting(uint64_t give_up, uint64_t last_event)
{
	uint64_t now = chime_now(), quiet_from = last_event > give_up ? last_event : give_up;

	return now < give_up || (now - quiet_from < LATE_QUIET_NS && now < give_up + LATE_MAX_NS);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "timers", required_argument, NULL, 'n' },
		{ "threads", required_argument, NULL, 't' },
		{ "seconds", required_argument, NULL, 'd' },
		{ "max-ms", required_argument, NULL, 'm' },
		{ "session", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	struct demo d = { .timers = 1000000, .threads = 4, .seconds = 3, .max_ms = 200 };
	struct chime_opts opts = { 0 };
	struct chime_event ev[256];
	struct tally t = { 0 };
	uint64_t v, next_report, expected, armed = 0, seed;
	struct arm_thread *threads;
	unsigned failed, failed_told = 0;
	int c, r, status = 0;

	/* getopt's own messages start with argv[0]: the program's name, as chimectl's, not its path. */
	if (argc > 0)
		argv[0] = (char *)"chime-demo";
	while ((c = getopt_long(argc, argv, "s:n:t:d:m:S:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (chime_socket_opt("chime-demo", optarg) < 0)
				return 2;
			opts.socket_path = optarg;
			break;
		case 'S':
			/* What chime_open() refuses (EINVAL): a usage error, said as one, before any broker is asked. */
			if (chime_session_len(optarg) <= 0) {
				fprintf(stderr, "chime-demo: invalid --session '%s': not a session name (1 to %u bytes "
					"of A-Z, a-z, 0-9, '.', '_', '-')\n", optarg, CHIME_SESSION_MAX - 1);
				return 2;
			}
			opts.session = optarg;
			break;
		case 'n': if (parse_uint(optarg, "--timers", 1, 100000000, &d.timers)) return 2; break;
		case 't': if (parse_uint(optarg, "--threads", 1, 64, &v)) return 2; d.threads = (unsigned)v; break;
		case 'd': if (parse_uint(optarg, "--seconds", 1, 3600, &v)) return 2; d.seconds = (unsigned)v; break;
		case 'm': if (parse_uint(optarg, "--max-ms", 1, 60000, &v)) return 2; d.max_ms = (unsigned)v; break;
		case 'h': usage(stdout); return sr_stdout_check("chime-demo");
		case 'V': printf("chime-demo %s\n", chime_version()); return sr_stdout_check("chime-demo");
		default: fprintf(stderr, "chime-demo: try 'chime-demo --help'\n"); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "chime-demo: unexpected argument '%s' (try 'chime-demo --help')\n", argv[optind]);
		return 2;
	}

	r = chime_open(&d.chime, &opts);
	if (r < 0) {
		/* The path chime_open() tried. */
		const char *path = chime_socket_path(opts.socket_path, NULL);
		char absent[160], refused[256];

		snprintf(absent, sizeof(absent), " (%s)", chime_socket_absent_why(path));
		snprintf(refused, sizeof(refused), " (%s%s)", opts.session ? "the session is another user's or its "
			 "name is reserved for one (chimed --policy-file), or " : "", chime_socket_eacces_why(path));

		fprintf(stderr, "chime-demo: cannot connect to chimed at '%s'%s%s%s: %s%s\n", path,
			opts.session ? " (session '" : "", opts.session ? opts.session : "", opts.session ? "')" : "",
			r == -EINVAL ? "not a socket path (longer than a unix socket's 107 bytes)" :
			r == -ENOENT ? "nothing listens there" : strerror(-r),
			r == -ENOENT ? absent :
			r == -EACCES ? refused :
			r == -EPERM ? " (what listens there runs as a user this one does not trust: not root, not"
				      " this user, not the owner of the socket's directory; see chime_open(3))" :
			r == -EBUSY ? " (another process has this session open)" :
			r == -EPROTO ? " (the broker and this libchime are of different releases: upgrade one side)" :
			r == -EUSERS ? " (the broker has as many clients as it allows: this user's, or all)" : "");
		return r == -EINVAL ? 2 : 1;    /* EINVAL: what the options said */
	}
	t.broker_lat = calloc(d.timers, sizeof(*t.broker_lat));
	t.client_lat = calloc(d.timers, sizeof(*t.client_lat));
	t.seen = calloc((d.timers + 7) / 8, 1);
	threads = calloc(d.threads, sizeof(*threads));
	if (!t.broker_lat || !t.client_lat || !t.seen || !threads) {
		fprintf(stderr, "chime-demo: out of memory for %" PRIu64 " timer%s\n", d.timers, plural(d.timers));
		return 1;
	}

	printf("chime-demo: arming %" PRIu64 " timer%s from %u thread%s over %u s, deadlines 1..%u ms ahead\n",
	       d.timers, plural(d.timers), d.threads, plural(d.threads), d.seconds, d.max_ms);
	d.start_ns = chime_now();
	seed = d.start_ns ^ ((uint64_t)getpid() << 32);
	d.run_id = (splitmix64(&seed) | 1) << 32;
	next_report = d.start_ns + NSEC_PER_SEC;
	for (unsigned i = 0; i < d.threads; i++) {
		threads[i] = (struct arm_thread){ .demo = &d, .index = i };
		if (pthread_create(&threads[i].tid, NULL, arm_main, &threads[i]) != 0) {
			fprintf(stderr, "chime-demo: pthread_create failed\n");
			return 1;
		}
	}

	/*
	 * Drain until everything armed fired, or until well past the last
	 * possible deadline. A thread that stopped at an error armed no more:
	 * waiting for its share would only run into give_up.
	 */
	uint64_t give_up = d.start_ns + (uint64_t)(d.seconds + 5) * NSEC_PER_SEC + d.max_ms * NSEC_PER_MSEC;
	uint64_t last_event = d.start_ns;
	bool said_late = false;

	while (t.fired < (expected = timers_expected(&d, threads, &failed)) && still_waiting(give_up, last_event)) {
		int n;
		uint64_t now;

		if (failed != failed_told) {
			printf("  chime_arm() failed in %u of %u thread%s (see below): waiting for %" PRIu64
			       " of the %" PRIu64 " timer%s\n", failed, d.threads, plural(d.threads), expected,
			       d.timers, plural(d.timers));
			fflush(stdout);
			failed_told = failed;
		}
		n = chime_wait(d.chime, ev, 256, 100);
		now = chime_now();

		if (n < 0 && n != -EINTR) {
			fprintf(stderr, "chime-demo: chime_wait failed: %s\n", strerror(-n));
			status = 1;
			break;
		}
		tally_events(&d, &t, ev, n, now);
		if (n > 0)
			last_event = now;
		if (now >= give_up && !said_late) {
			printf("  %" PRIu64 " of %" PRIu64 " fired 5 s past the last deadline (a broker restart, a busy "
			       "host?): waiting on while events come (%u s without one ends it, %u s at most)\n", t.fired,
			       expected, (unsigned)(LATE_QUIET_NS / NSEC_PER_SEC), (unsigned)(LATE_MAX_NS / NSEC_PER_SEC));
			said_late = true;
		}
		if (now >= next_report) {
			printf("  %2" PRIu64 " s: %8" PRIu64 " fired/s  (%" PRIu64 " of %" PRIu64 " so far)\n",
			       (now - d.start_ns) / NSEC_PER_SEC, t.per_sec, t.fired, expected);
			fflush(stdout);
			t.per_sec = 0;
			next_report += NSEC_PER_SEC;
		}
	}
	for (unsigned i = 0; i < d.threads; i++) {
		pthread_join(threads[i].tid, NULL);
		armed += threads[i].armed;
	}
	/* One line per error, not per thread: with a quota, every thread hits it. */
	for (unsigned i = 0; i < d.threads; i++) {
		int e = threads[i].error;
		unsigned first = i, count = 0;

		for (unsigned k = 0; k < d.threads; k++) {
			if (threads[k].error == e && k < first)
				first = k;
			count += threads[k].error == e;
		}
		if (!e || first != i)
			continue;
		fprintf(stderr, "chime-demo: chime_arm() failed in %u of %u thread%s: %s%s\n", count, d.threads,
			plural(d.threads), strerror(-e), arm_error_hint(e));
		if (!arm_refused(e))
			status = 1;
		else if (!status)
			status = EXIT_REFUSED;
	}
	/* Give stragglers (a duplicate, a timer missed so far) a moment to show up. */
	for (int i = 0; i < 5; i++) {
		int n = chime_wait(d.chime, ev, 256, 20);

		if (n > 0)
			tally_events(&d, &t, ev, n, chime_now());
	}

	if (t.foreign)
		printf("chime-demo: %" PRIu64 " event%s of timers this run did not arm (left in session '%s' by an "
		       "earlier process) not counted\n", t.foreign, plural(t.foreign), opts.session);
	if (armed == d.timers)
		printf("chime-demo: %" PRIu64 " of %" PRIu64 " timer%s fired, %" PRIu64 " early", t.fired, d.timers,
		       plural(d.timers), t.early);
	else
		printf("chime-demo: %" PRIu64 " of %" PRIu64 " timer%s armed, %" PRIu64 " of those fired, %" PRIu64
		       " early", armed, d.timers, plural(d.timers), t.fired, t.early);
	if (t.twice)
		printf(", %" PRIu64 " event%s of a timer that had fired already", t.twice, plural(t.twice));
	printf("\nlateness (fired - deadline):\n");
	print_lateness("broker", t.broker_lat, t.fired);
	print_lateness("client", t.client_lat, t.fired);
	if (t.fired != armed || t.early || t.twice) {
		fprintf(stderr, "chime-demo: FAILED: %s\n",
			t.early ? "timers fired early" : t.twice ? "timers fired twice" : "timers missing");
		status = 1;
	}
	chime_close(d.chime);
	/* Its timers are done: end the session rather than leave it for --session-linger. */
	if (opts.session && (r = chime_drop_session(&opts)) < 0 && r != -ESRCH)
		fprintf(stderr, "chime-demo: could not end session '%s' (it lingers for chimed's "
			"--session-linger): %s\n", opts.session, strerror(-r));
	free(t.broker_lat);
	free(t.client_lat);
	free(t.seen);
	free(threads);
	/* A report that did not arrive (a full disk) is no success. */
	return sr_stdout_check("chime-demo") ? 1 : status;
}
