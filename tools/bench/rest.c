/* SPDX-License-Identifier: MIT */
/*
 * rest.c - `chime-bench rest`: what the broker costs when nothing is due.
 *
 * Arm N timers an hour ahead (one client, kept connected and idle), let the
 * shards settle, then over S seconds read the broker's /proc entries at both
 * ends: CPU from /proc/PID/stat (utime+stime, in clock ticks) and, exactly,
 * from each thread's schedstat; wake-ups as the sum over every thread of
 * /proc/PID/task/TID/status voluntary+nonvoluntary context switches. Meanwhile
 * the control segment's heartbeat_ns is polled every 5 ms, so the heartbeats
 * in the window are counted, not assumed (the control thread wakes every
 * 90 ms to beat, every 450 ms after a second at rest: HEARTBEAT_NS and
 * IDLE_BEAT_NS in broker/broker.h).
 *
 * Targets (issue 9 item 7): broker CPU < 0.1% of a core; no wake-ups beyond
 * the heartbeat's. A miss makes the exit status 1.
 *
 * Beside it, in the same run, the floor: a process that does nothing but
 * wake as often as the broker's heartbeats came in the window, measured
 * the same way over as long. What a wake-up costs depends on the host (on
 * the development VM it ranged from 50 to 100 us of CPU time from one hour
 * to the next at 90 ms, and more the longer the sleep).
 *
 * And what the host does to the broker's idle pages: a kernel running DAMON
 * (a kdamond) with a reclaim scheme walks them, and on the development VM
 * that made each beat of a broker with 1M timers cost 480-550 us instead of
 * 60-90 (the same broker with DAMON off); with its shard files in 2 MiB
 * pages (a tmpfs mounted huge=within_size) 90-130. So the report says
 * whether a kdamond runs and how much of the broker's shared memory is
 * mapped in huge pages.
 *
 * A set of the host's wall clock in the window (by anyone: an NTP step,
 * date(1), a VM's agent) rightly wakes the broker's control thread, and
 * each shard holding wall-clock timers, to follow it: the report says so,
 * and then judges neither target.
 */
#include <chime.h>

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "atomics.h"
#include "chime_shm.h"
#include "compare.h"

#define REST_CPU_TARGET   0.001   /* share of one core */
#define REST_SLACK        2u      /* switches a window's two edges may split off a beat */
#define REST_IDLE_BEAT_NS (450 * NS_PER_MS)  /* chimed's IDLE_BEAT_NS (broker/broker.h) */

/* 1 if a DAMON monitor (kdamond) is on, 0 if none is, -1 if this kernel has no DAMON sysfs to say. */
static int host_damon_on(void)
{
	const char *dir = "/sys/kernel/mm/damon/admin/kdamonds";
	unsigned long n = 0;
	char path[128], buf[16];
	int on = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/nr_kdamonds", dir);
	if (!(f = fopen(path, "r")))
		return -1;
	if (fscanf(f, "%lu", &n) != 1)
		n = 0;
	fclose(f);
	for (unsigned long i = 0; i < n && i < 64 && !on; i++) {
		snprintf(path, sizeof(path), "%s/%lu/state", dir, i);
		if ((f = fopen(path, "r"))) {
			on = fgets(buf, sizeof(buf), f) && strncmp(buf, "on", 2) == 0;
			fclose(f);
		}
	}
	return on;
}

/* A field in KiB of /proc/PID/FILE ("status": RssShmem; "smaps_rollup": ShmemPmdMapped), or -1. */
static long long proc_kib(pid_t pid, const char *file, const char *field)
{
	char path[64], line[256];
	size_t len = strlen(field);
	long long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, len) == 0 && line[len] == ':') {
			kib = strtoll(line + len + 1, NULL, 10);
			break;
		}
	fclose(f);
	return kib;
}

/* The floor's process: wakes every period_ns and does nothing else, until killed. */
static void rest_floor(uint64_t period_ns)
{
	struct timespec at;

	clock_gettime(CLOCK_MONOTONIC, &at);
	for (;;) {
		at.tv_sec += (time_t)(period_ns / NS_PER_S);
		at.tv_nsec += (long)(period_ns % NS_PER_S);
		if (at.tv_nsec >= (long)NS_PER_S) {
			at.tv_nsec -= (long)NS_PER_S;
			at.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
	}
}

/* The floor's CPU share over secs seconds (its schedstat, as the broker's), or -1; *per_wake_ns its cost per wake-up. */
static double rest_floor_share(long secs, uint64_t period_ns, double *per_wake_ns)
{
	struct bench_proc f0, f1;
	pid_t pid = fork();
	double share = -1;

	if (pid < 0)
		return -1;
	if (pid == 0)
		rest_floor(period_ns);
	sleep_ns(200 * NS_PER_MS);      /* started and asleep */
	if (bench_proc_sample(pid, &f0) == 0) {
		sleep_ns((uint64_t)secs * NS_PER_S);
		if (bench_proc_sample(pid, &f1) == 0) {
			uint64_t wakes = (f1.vol + f1.nonvol) - (f0.vol + f0.nonvol);

			share = (double)(f1.sched_ns - f0.sched_ns) / (double)(f1.t_ns - f0.t_ns);
			*per_wake_ns = wakes ? (double)(f1.sched_ns - f0.sched_ns) / (double)wakes : 0.;
		}
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return share;
}

struct beat {
	const struct chime_ctl *ctl;
	uint64_t ns;
};

static int beat_read(void *arg)
{
	struct beat *b = arg;

	b->ns = at_load(&b->ctl->heartbeat_ns);
	return 0;
}

/* The broker's last heartbeat, read from its segment; 0 if the file shrank under the mapping. */
static uint64_t heartbeat(const struct broker *b)
{
	struct beat r = { .ctl = b->sr.ctl };

	return sr_guard(&b->sr.map, beat_read, &r) == 0 ? r.ns : 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chime-bench rest [--socket PATH] [--timers N] [--seconds S]\n"
		"                        [--session NAME] [--json]\n"
		"The broker with N timers armed an hour ahead and nothing due: its CPU share\n"
		"and wake-ups per second over S seconds, against the targets.\n"
		"\n"
		"  -s, --socket PATH   use the chimed at PATH (default: a private one)\n"
		"  -S, --session NAME  arm them in session NAME, its process attached (the\n"
		"                      session is dropped at the end)\n"
		"  -n, --timers N      timers to arm, 1..16000000 (default 1000000)\n"
		"  -t, --seconds S     the measuring window, 1..3600 (default 10)\n"
		"  -j, --json          the figures as JSON on stdout\n"
		"  -h, --help          show this help\n");
}

int bench_rest(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "timers", required_argument, NULL, 'n' },
		{ "seconds", required_argument, NULL, 't' },
		{ "session", required_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool help = false;
	const char *socket = NULL, *session = NULL;
	long n = 1000000, secs = 10;
	uint64_t v;
	int opt, json = 0, r = 0, cpu_ok, wake_ok, clock_fd;
	bool clock_set = false, judged;
	struct bench_proc p0, p1;
	struct bench_machine m;
	struct broker b;
	uint64_t *ids, base, hb, beats = 0, end, sw, floor_period;
	double win, cpu_stat, cpu_sched, floor;
	double floor_wake_ns = 0;
	long long shmem_kib, huge_kib;
	int damon;
	chime_t *c;

	signal(SIGPIPE, SIG_IGN);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:n:t:S:jh", lopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (bench_opt_socket("rest", optarg, &socket) < 0)
				return 2;
			break;
		case 'n':
			if (bench_opt_u64("rest", "--timers", optarg, 1, 16000000, &v) < 0)
				return 2;
			n = (long)v;
			break;
		case 't':
			if (bench_opt_u64("rest", "--seconds", optarg, 1, 3600, &v) < 0)
				return 2;
			secs = (long)v;
			break;
		case 'S':
			/* What chime_open() refuses (EINVAL): a usage error now, before a private broker is started. */
			if (chime_session_len(optarg) <= 0) {
				fprintf(stderr, "chime-bench rest: --session '%s': not a session name (1 to %u bytes of "
					"A-Z, a-z, 0-9, '.', '_', '-')\n", optarg, CHIME_SESSION_MAX - 1);
				return 2;
			}
			session = optarg;
			break;
		case 'j': json = bench_json = 1; break;
		case 'h': help = true; break;   /* after the check for what is left over */
		default: return bench_usage_error("rest", NULL);
		}
	}
	if (optind < argc)
		return bench_usage_error("rest", argv[optind]);
	if (help) {
		usage(stdout);
		return 0;
	}
	bench_machine(&m);
	memset(&b, 0, sizeof(b));
	if (socket) {
		snprintf(b.sock, sizeof(b.sock), "%s", socket);
		if (broker_map_ctl(&b) < 0)
			return 1;
	} else if (broker_start(&b, 0, NULL) < 0) {
		broker_stop(&b);
		return 1;
	}
	if (session) {
		struct chime_opts o = { .socket_path = b.sock, .session = session };

		r = chime_open(&c, &o);
		if (r < 0)
			bench_error("opening session '%s' at '%s' failed: %s", session, b.sock, strerror(-r));
	} else {
		r = broker_open(&b, 0, &c);
	}
	if (r < 0) {
		broker_stop(&b);
		return 1;
	}
	ids = xcalloc((size_t)n, sizeof(*ids));
	base = now_ns() + FAR_NS;
	for (long i = 0; i < n && r == 0; i++)
		r = chime_arm(c, (uint64_t)i, base + (uint64_t)i * 1000, 0, (uint64_t)i, &ids[i]);
	if (r < 0 || wait_armed(&b, (uint64_t)n, 60 * NS_PER_S) < 0) {
		if (r < 0)
			bench_error("arming %ld timers failed: %s", n, strerror(-r));
		else
			bench_error("the broker did not report the %ld timers armed (above)", n);
		chime_close(c);
		free(ids);
		broker_stop(&b);
		return 1;
	}
	/* From a second before the window: a set's 90 ms beats last that long. */
	clock_fd = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);
	if (clock_fd >= 0 && clock_set_watch_arm(clock_fd) < 0) {
		close(clock_fd);
		clock_fd = -1;  /* no watch: a set goes unseen, as before */
	}
	sleep_ns(NS_PER_S);     /* shards done spinning, counters published */

	/* the broker's /proc unreadable at either end (gone, or not ours): no figure, never 0 CPU */
	if ((r = bench_proc_sample(b.ctl->pid, &p0)) == 0) {
		hb = heartbeat(&b);
		end = p0.t_ns + (uint64_t)secs * NS_PER_S;
		while (now_ns() < end) {
			uint64_t h = heartbeat(&b);

			if (h != hb) {
				beats++;
				hb = h;
			}
			sleep_ns(5 * NS_PER_MS);
		}
		r = bench_proc_sample(b.ctl->pid, &p1);
	}
	if (clock_fd >= 0) {
		uint64_t x;

		clock_set = read(clock_fd, &x, sizeof(x)) < 0 && errno == ECANCELED;
		close(clock_fd);
	}
	if (r < 0) {
		bench_error("cannot read /proc/%d of the broker: %s", (int)b.ctl->pid, strerror(-r));
		chime_close(c);
		free(ids);
		broker_stop(&b);
		return 1;
	}
	damon = host_damon_on();
	shmem_kib = proc_kib(b.ctl->pid, "status", "RssShmem");
	huge_kib = proc_kib(b.ctl->pid, "smaps_rollup", "ShmemPmdMapped");
	/* the broker's beat as seen, to the millisecond (none seen: its idle beat) */
	floor_period = beats ? (p1.t_ns - p0.t_ns) / beats / NS_PER_MS * NS_PER_MS : REST_IDLE_BEAT_NS;
	floor = rest_floor_share(secs, floor_period, &floor_wake_ns);

	win = (double)(p1.t_ns - p0.t_ns) / 1e9;
	cpu_stat = (double)(p1.stat_ns - p0.stat_ns) / 1e9 / win;
	cpu_sched = (double)(p1.sched_ns - p0.sched_ns) / 1e9 / win;
	sw = (p1.vol + p1.nonvol) - (p0.vol + p0.nonvol);
	cpu_ok = cpu_sched < REST_CPU_TARGET;   /* stat cannot resolve it: see the note printed */
	wake_ok = sw <= beats + REST_SLACK;
	/* Beside a set of the wall clock, or others' timers, these are not the broker's own figures at rest. */
	judged = !clock_set && !b.armed_base;

	if (json) {
		json_t *o = json_pack("{s:s, s:{s:s, s:s, s:s, s:i}, s:{s:b, s:i, s:i}, s:I, s:o, s:f,"
				      " s:f, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:b, s:b, s:o, s:o, s:I}",
				      "mode", "rest",
				      "machine", "date", m.date, "cpu", m.model, "kernel", m.kernel, "cpus", (int)m.cpus,
				      "broker", "private", b.pid != 0, "pid", (int)b.ctl->pid, "shards", (int)b.nr_shards,
				      "timers", (json_int_t)n, "session", session ? json_string(session) : json_null(),
				      "seconds", win,
				      "cpu_share_stat", cpu_stat, "cpu_share_schedstat", cpu_sched,
				      "switches_voluntary", (json_int_t)(p1.vol - p0.vol),
				      "switches_nonvoluntary", (json_int_t)(p1.nonvol - p0.nonvol),
				      "heartbeats", (json_int_t)beats,
				      "wakeups_per_s", (double)sw / win, "heartbeats_per_s", (double)beats / win,
				      "cpu_target", REST_CPU_TARGET, "cpu_ok", cpu_ok, "wakeups_ok", wake_ok,
				      "floor_cpu_share", floor >= 0 ? json_real(floor) : json_null(),
				      "floor_ns_per_wakeup", floor >= 0 ? json_real(floor_wake_ns) : json_null(),
				      "floor_period_ns", (json_int_t)floor_period);
		json_object_set_new(o, "host_damon_on", damon < 0 ? json_null() : json_boolean(damon));
		json_object_set_new(o, "wall_clock_set", json_boolean(clock_set));
		json_object_set_new(o, "others_timers", json_integer((json_int_t)b.armed_base));
		json_object_set_new(o, "judged", json_boolean(judged));
		json_object_set_new(o, "broker_rss_shmem_kib", shmem_kib < 0 ? json_null() : json_integer(shmem_kib));
		json_object_set_new(o, "broker_shmem_huge_kib", huge_kib < 0 ? json_null() : json_integer(huge_kib));
		json_t *th = json_array();

		for (unsigned i = 0; i < p1.threads && i < BENCH_MAX_THREADS; i++) {
			const struct bench_thread *a = NULL, *z = &p1.thr[i];

			for (unsigned j = 0; j < p0.threads && j < BENCH_MAX_THREADS; j++)
				if (p0.thr[j].tid == z->tid)
					a = &p0.thr[j];
			json_array_append_new(th, json_pack("{s:i, s:s, s:I, s:I}", "tid", z->tid, "comm", z->comm,
					      "switches", (json_int_t)(z->vol + z->nonvol - (a ? a->vol + a->nonvol : 0)),
					      "cpu_ns", (json_int_t)(z->sched_ns - (a ? a->sched_ns : 0))));
		}
		json_object_set_new(o, "threads", th);
		json_dumpf(o, stdout, JSON_INDENT(2));
		bench_json_done = 1;
		printf("\n");
		json_decref(o);
	} else {
		printf("chime-bench rest: the broker at rest, %ld timers armed an hour ahead, one idle client%s%s%s\n",
		       n, session ? " (session '" : "", session ? session : "", session ? "', its process attached)" : "");
		printf("date:    %s\n", m.date);
		printf("machine: %ld CPUs online, %s, Linux %s; load average %.2f %.2f %.2f at start\n",
		       m.cpus, m.model, m.kernel, m.load[0], m.load[1], m.load[2]);
		printf("broker:  %s chimed pid %d, %u shard(s), spin %lld us; window %.1f s\n",
		       b.pid ? "private" : "external", (int)b.ctl->pid, b.nr_shards, (long long)b.ctl->spin_us, win);
		char shm[32] = "unknown", huge[32] = "unknown";

		if (shmem_kib >= 0)
			snprintf(shm, sizeof(shm), "%.1f MiB", (double)shmem_kib / 1024);
		if (huge_kib >= 0)
			snprintf(huge, sizeof(huge), "%.1f MiB", (double)huge_kib / 1024);
		printf("memory:  the broker's shared memory %s, in huge pages %s; DAMON (kdamond) %s\n\n", shm, huge,
		       damon < 0 ? "not in this kernel" : damon ? "on (see chime-bench(1), rest)" : "off");
		/* utime and stime are each whole ticks: their sum's delta is off by up to 2 */
		printf("  CPU, /proc/PID/stat utime+stime    %8.4f%% of a core   (+-%.1f%%: whole clock ticks; not judged)\n",
		       cpu_stat * 100, 200.0 / (double)sysconf(_SC_CLK_TCK) / win);
		printf("  CPU, schedstat of all threads      %8.4f%% of a core   target < %.1f%%  %s\n",
		       cpu_sched * 100, REST_CPU_TARGET * 100, !judged ? "not judged" : cpu_ok ? "ok" : "MISS");
		if (floor >= 0)
			printf("  the floor: a process waking every %llu ms %8.4f%% of a core   (%.1f us per wake-up, the "
			       "broker %.1f per beat)\n", (unsigned long long)(floor_period / NS_PER_MS), floor * 100,
			       floor_wake_ns / 1e3, beats ? (double)(p1.sched_ns - p0.sched_ns) / 1e3 / (double)beats : 0.);
		printf("  wake-ups (all threads' switches)   %8.2f /s  (%llu voluntary, %llu nonvoluntary)\n",
		       (double)sw / win, (unsigned long long)(p1.vol - p0.vol), (unsigned long long)(p1.nonvol - p0.nonvol));
		printf("  heartbeats seen (heartbeat_ns)     %8.2f /s  (%llu; by design every 90 ms, 450 ms at rest)\n",
		       (double)beats / win, (unsigned long long)beats);
		printf("  wake-ups beyond the heartbeat      %8.2f /s  target 0 (%u of slack for the window's edges)  %s\n",
		       sw > beats ? (double)(sw - beats) / win : 0., REST_SLACK, !judged ? "not judged" :
		       wake_ok ? "ok" : "MISS");
		if (clock_set)
			printf("  the host's wall clock was set in the window (by another process): the broker woke to\n"
			       "  follow it (its control thread, and each shard holding wall-clock timers, once a set):\n"
			       "  these are not the broker's own figures at rest (run it again)\n");
		if (b.armed_base)
			printf("  the broker holds %llu timers of other clients: its CPU and wake-ups include their work,\n"
			       "  so these are not its own figures at rest (run it beside an idle broker)\n",
			       (unsigned long long)b.armed_base);
		printf("\n  %-7s %-16s %10s %12s\n", "tid", "thread", "switches", "cpu us");
		for (unsigned i = 0; i < p1.threads && i < BENCH_MAX_THREADS; i++) {
			const struct bench_thread *a = NULL, *z = &p1.thr[i];

			for (unsigned j = 0; j < p0.threads && j < BENCH_MAX_THREADS; j++)
				if (p0.thr[j].tid == z->tid)
					a = &p0.thr[j];
			printf("  %-7d %-16s %10llu %12.1f\n", z->tid, z->comm,
			       (unsigned long long)(z->vol + z->nonvol - (a ? a->vol + a->nonvol : 0)),
			       (double)(z->sched_ns - (a ? a->sched_ns : 0)) / 1e3);
		}
		printf("\nstat's utime and stime count whole clock ticks (%ld/s): over %.0f s one tick is %.3f%% of a\n"
		       "core, against a target of %.1f%%, so the target is judged on schedstat (ns, all threads).\n",
		       sysconf(_SC_CLK_TCK), win, 100.0 / (double)sysconf(_SC_CLK_TCK) / win, REST_CPU_TARGET * 100);
	}
	chime_close(c);
	if (session) {
		/* Its timers would linger (--session-linger), a private broker's too. */
		struct chime_opts o = { .socket_path = b.sock, .session = session };

		r = chime_drop_session(&o);
		if (r < 0) {
			fprintf(stderr, "chime-bench rest: dropping session '%s' failed: %s\n", session, strerror(-r));
			g_problems++;
		}
	}
	free(ids);
	wait_armed(&b, 0, 60 * NS_PER_S);
	if (broker_stop(&b) < 0)
		g_problems++;
	return g_problems || (judged && (!cpu_ok || !wake_ok)) ? 1 : 0;
}
