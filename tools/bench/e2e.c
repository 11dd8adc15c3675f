/* SPDX-License-Identifier: MIT */
/*
 * e2e.c - `chime-bench e2e`: what a timer costs an application end to end,
 * through libchime and a real chimed, beside one timerfd per timer.
 *
 * One run prints one table:
 *
 *   1. client operations: ns per chime_arm / chime_reset / chime_cancel on
 *      the calling thread, 1 and 2 threads sharing one chime_t, with N timers
 *      armed (arm grows 0 -> N, reset and touch run at N, cancel shrinks
 *      N -> 0; a touch is each timer's second reset, a keepalive's).
 *      Deadlines are an hour ahead, so nothing fires. Each thread times
 *      batches of BATCH calls with clock_gettime(CLOCK_MONOTONIC); the figure
 *      is the median of the batch means (over all threads' batches), with the
 *      plain mean beside it (the mean includes stalls on a full ring).
 *      Between phases the bench waits for the broker's `armed` counter and
 *      for the client's rings to be applied, so a phase never measures the
 *      broker still digesting the previous one (and the touches find their
 *      timers flagged by the resets).
 *      Baseline: timerfd_create + timerfd_settime per arm, timerfd_settime
 *      per reset, close per cancel, same batches.
 *   2. broker throughput: 2 threads flood chime_reset over N armed timers for
 *      FLOOD seconds; the shards' arms+resets+cancels counters (control
 *      segment "<socket>.ctl", chime_stats_read) over a window, divided by
 *      the window and the shard count. Also the shards' busy share (busy_ns)
 *      and the ops per busy second (what a shard does when it has work).
 *   3. expirations/s: N timers due at one instant, drained with chime_poll()
 *      in a loop; time from the deadline to the last event. Baseline: N
 *      timerfds in one epoll, epoll_wait + read(2) each.
 *   4. lateness: N timers with random deadlines over a few seconds, drained
 *      with chime_wait() (blocking, as applications do); fired_ns - deadline
 *      (the broker's view) and receive time - deadline (the application's).
 *      Baseline: timerfds in epoll, receive time - deadline.
 *
 * Correctness is checked on the side: every expiration must arrive exactly
 * once, with its own deadline, never early. Anything else is printed and
 * makes the exit status 1.
 *
 * Without --socket, a private chimed is started (from $CHIMED, else next to
 * this executable in the build tree: ../broker/chimed, ./chimed, ../sbin/chimed)
 * on a socket in a fresh directory under $TMPDIR, and stopped at the end.
 *
 * The phases live in e2e_ops.c and e2e_fire.c, the broker in e2e_broker.c (e2e.h).
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "chime_shm.h"
#include "e2e.h"
#include "ring.h"       /* CHIME_SQ_AHEAD */
#include "segment.h"

/*
 * A failed phase has no figure (its batches after the error were never
 * timed); one not run because a phase before it failed (run_ops: err
 * -ECANCELED) says so.
 */
static const char *failed_cell(int err)
{
	return err == -ECANCELED ? "not run (a phase before failed)" : "ERR: no figure (see !!)";
}

/* ------------------------------------------------------------------------ */
/* the table                                                                  */
/* ------------------------------------------------------------------------ */

static void print_header(const struct broker *b, const char *mode, size_t tfd_max)
{
	struct bench_machine m;
	char fsbuf[32];
	const char *fs;

	bench_machine(&m);
	printf("chime-bench e2e (%s): libchime + chimed end to end, beside one timerfd per timer\n", mode);
	printf("machine: %ld CPUs online (nproc), %s, Linux %s; load average %.2f %.2f %.2f at start\n",
	       m.cpus, m.model, m.kernel, m.load[0], m.load[1], m.load[2]);
	if (chime_seg_dir_in_memory(b->sock, &fs, fsbuf, sizeof(fsbuf)) < 0)
		fs = "?";
	printf("broker:  %s chimed, socket %s (%s): %u shard(s), spin %" PRId64 " us, resolution %" PRIu64
	       " us, sq %u / cq %u slots per client and shard\n",
	       b->pid ? "private" : "external", b->sock, fs, b->nr_shards, b->ctl->spin_us,
	       b->ctl->resolution_ns / 1000, b->ctl->sq_size, b->ctl->cq_size);
	printf("method:  client ops: clock_gettime(CLOCK_MONOTONIC) around batches of calls on the calling\n"
	       "         thread; figure = median of batch means (mean of all ops beside it; Mops/s = all\n"
	       "         threads' ops / wall time of the phase). Deadlines 1 h ahead (nothing fires). arm grows\n"
	       "         0->N, reset and touch run at N, cancel shrinks N->0; T threads share one chime_t, N/T\n"
	       "         each; the bench waits for the broker's `armed` counter and the rings applied between\n"
	       "         phases. reset: each timer's first (a record: the shard flags the timer); touch: its\n"
	       "         second, later still (a keepalive's: a word in the touch table, no record).\n"
	       "         timerfd: create+settime (ABSTIME) per arm, settime per reset and touch, close per\n"
	       "         cancel. op/64: the same\n"
	       "         operations through chime_submit(), 64 per call. Bursts: one thread, the same\n"
	       "         batches, but before each (untimed) the bench waits until the broker's counters\n"
	       "         show every earlier one applied: the thread's own cost, not the broker's pace.\n"
	       "         Sporadic: one operation after each 20 ms asleep (the shard sleeps too).\n");
	printf("targets: <= 15 ns per client op, mean <= 25 (<= 8 ns per op in chime_submit batches of 64);\n"
	       "         >= 10 M ops/s per shard at 1M armed.\n"
	       "         reference on this VM: timerfd create+arm 1.3-1.8 us, re-arm 0.6-1.4 us.\n");
	if (tfd_max)
		printf("fds:     RLIMIT_NOFILE allows %zu timerfds\n", tfd_max);
	printf("\n");
}

/* --shards: chimed's own bound; --expire: the slab (64 B a node) stays addressable and sane */
#define E2E_MAX_SHARDS  128u
#define E2E_MAX_EXPIRE  100000000u

struct cfg {
	const char *socket;
	int quick;
	int shards;
	uint32_t only;          /* bit i: part_name[i] asked for by --only; 0: all */
	int busy_poll;
	int cold;
	size_t expire_n;
};

/* --only's parts, matched whole (bench_opt_names) */
static const char *const part_name[] = { "ops", "flood", "expire", "lat", "timerfd" };
#define NR_PARTS (sizeof(part_name) / sizeof(part_name[0]))

static int want(const struct cfg *cf, const char *part)
{
	if (!cf->only)
		return 1;
	for (unsigned i = 0; i < NR_PARTS; i++)
		if (!strcmp(part, part_name[i]))
			return (cf->only >> i) & 1;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chime-bench e2e [--socket PATH] [--quick] [--shards N] [--only PARTS]\n"
		"                       [--expire N] [--busy-poll] [--cold]\n"
		"End to end: ns per chime_arm/reset/cancel (1 and 2 threads, 100k and 1M armed;\n"
		"in bursts into emptied rings, beside the hardware's floor; one at a time after\n"
		"idling), the broker's ops/s per shard, expirations/s to a draining client and\n"
		"lateness, beside one timerfd per timer.\n"
		"\n"
		"  -s, --socket PATH   use the chimed at PATH (default: start a private one, from\n"
		"                      $CHIMED or next to this program, and stop it at the end)\n"
		"  -q, --quick         small sizes (a smoke test, a few seconds)\n"
		"  -n, --shards N      shards of the private chimed, 1..128 (default: its\n"
		"                      default, one per CPU; with --busy-poll, one fewer, so\n"
		"                      that the client has a CPU)\n"
		"      --only PARTS    comma list of ops,flood,expire,lat,timerfd (default: all)\n"
		"  -N, --expire N      timers due at one instant in the expire phase,\n"
		"                      1..100000000 (default 1M, --quick 50k); above 1M the\n"
		"                      private chimed gets --capacity N + 65536 and no quotas\n"
		"      --busy-poll     lateness drained by chime_poll() in a loop, not\n"
		"                      chime_wait(); the private chimed runs with --spin-us -1\n"
		"                      (busy-poll mode) and, without --shards, a shard fewer\n"
		"                      than the CPUs (at least 1)\n"
		"      --cold          in the bursts, flush every CPU's caches between the arms\n"
		"                      and the first resets, as the interval before a\n"
		"                      keepalive's would\n"
		"  -h, --help          show this help\n");
}

int bench_e2e(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "shards", required_argument, NULL, 'n' },
		{ "only", required_argument, NULL, 'o' },
		{ "busy-poll", no_argument, NULL, 'b' },
		{ "expire", required_argument, NULL, 'N' },
		{ "cold", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool help = false;
	struct cfg cf = { .socket = NULL, .quick = 0, .shards = 0, .only = 0, .busy_poll = 0, .expire_n = 0 };
	uint64_t v;
	struct broker b;
	size_t sizes_full[] = { 100000, 1000000 }, sizes_quick[] = { 10000, 50000 };
	size_t *sizes, tfd_max, nsizes = 2;
	unsigned batch;
	uint64_t flood_ns, span_ns, t_run = now_ns();
	size_t n_expire, n_lat, n_expire_tfd, n_lat_tfd;
	int opt;

	signal(SIGPIPE, SIG_IGN);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:qn:N:h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (bench_opt_socket("e2e", optarg, &cf.socket) < 0)
				return 2;
			break;
		case 'q': cf.quick = 1; break;
		case 'n':
			if (bench_opt_u64("e2e", "--shards", optarg, 1, E2E_MAX_SHARDS, &v) < 0)
				return 2;
			cf.shards = (int)v;
			break;
		case 'o':
			if (bench_opt_names("e2e", "--only", optarg, part_name, NR_PARTS, &cf.only) < 0)
				return 2;
			break;
		case 'b': cf.busy_poll = 1; break;
		case 'c': cf.cold = 1; break;
		case 'N':
			if (bench_opt_u64("e2e", "--expire", optarg, 1, E2E_MAX_EXPIRE, &v) < 0)
				return 2;
			cf.expire_n = (size_t)v;
			break;
		case 'h': help = true; break;   /* after the check for what is left over */
		default: return bench_usage_error("e2e", NULL);
		}
	}
	if (optind < argc)
		return bench_usage_error("e2e", argv[optind]);
	if (help) {
		usage(stdout);
		return 0;
	}
	sizes = cf.quick ? sizes_quick : sizes_full;
	batch = cf.quick ? 100 : 1000;
	flood_ns = cf.quick ? 300 * NS_PER_MS : 2 * NS_PER_S;
	span_ns = cf.quick ? 500 * NS_PER_MS : 2 * NS_PER_S;
	n_expire = cf.expire_n ? cf.expire_n : cf.quick ? 50000 : 1000000;
	n_expire_tfd = cf.quick ? 10000 : 100000;
	n_lat = cf.quick ? 10000 : 100000;
	n_lat_tfd = n_lat;

	memset(&b, 0, sizeof(b));
	/* Every timer may land on one shard; the slab is sparse, so this costs only what is used. */
	if (n_expire > 1000000)
		b.capacity = n_expire + 65536;
	if (cf.socket) {
		snprintf(b.sock, sizeof(b.sock), "%s", cf.socket);
		if (broker_map_ctl(&b) < 0)
			return 1;
	} else {
		/*
		 * Busy-poll: a shard per CPU would leave the polling client none
		 * (chimed warns), and the kernel would take turns between them.
		 */
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

		if (cf.busy_poll && cf.shards == 0)
			cf.shards = ncpu > 1 ? (int)ncpu - 1 : 1;
		if (broker_start(&b, cf.shards, cf.busy_poll ? "-1" : NULL) < 0) {
			broker_stop(&b);
			return 1;
		}
	}
	tfd_max = want(&cf, "timerfd") ? fd_room(sizes[nsizes - 1]) : 0;
	print_header(&b, cf.quick ? "--quick" : "full", tfd_max);
	if (n_expire_tfd > tfd_max)
		n_expire_tfd = tfd_max / 1000 * 1000;
	if (n_lat_tfd > tfd_max)
		n_lat_tfd = tfd_max / 1000 * 1000;

	/* 1. client operations */
	if (want(&cf, "ops") || want(&cf, "timerfd")) {
		printf("client operations: ns per op on the calling thread, median of batches of %u (mean) | Mops/s all threads\n",
		       batch);
		printf("  %-6s %3s %-9s | %-31s | %-44s\n", "armed", "thr", "op", "chime",
		       "timerfd (op)");
		for (size_t si = 0; si < nsizes; si++) {
			for (unsigned nthr = 1; nthr <= MAX_THR; nthr++) {
				struct op_result rc[NR_OPS], rt[NR_OPS];
				size_t nt = sizes[si] <= tfd_max ? sizes[si] : tfd_max / 1000 * 1000;
				int have_c = 0, have_t = 0;
				char cnt[24], tcnt[24];

				if (want(&cf, "ops") && run_ops(IMPL_CHIME, &b, sizes[si], nthr, batch, rc) == 0)
					have_c = 1;
				else if (want(&cf, "ops"))
					have_c = -1;
				/* Above the fd limit: as many timerfds as it allows, and say so. */
				if (want(&cf, "timerfd") && nt >= 1000)
					have_t = run_ops(IMPL_TFD, NULL, nt, nthr, batch, rt) == 0 ? 1 : -1;
				fmt_count(tcnt, sizeof(tcnt), nt);
				for (int op = 0; op < NR_OPS; op++) {
					char cs[96] = "-", ts[96] = "-";

					if (have_c)
						snprintf(cs, sizeof(cs), "%7.1f (%7.1f) %6.2f %s", rc[op].median_ns,
							 rc[op].mean_ns, rc[op].mops,
							 rc[op].err ? "ERR" :
							 rc[op].median_ns <= 15.0 * nthr && rc[op].mean_ns <= 25.0 * nthr ? "ok  " : "MISS");
					if (have_c && rc[op].err)
						snprintf(cs, sizeof(cs), "%s", failed_cell(rc[op].err));
					if (have_t && rt[op].err)
						snprintf(ts, sizeof(ts), "%s", failed_cell(rt[op].err));
					else if (have_t)
						snprintf(ts, sizeof(ts), "%7.1f (%7.1f) %6.2f %-14s%s%s", rt[op].median_ns,
							 rt[op].mean_ns, rt[op].mops, tfd_op_name[op],
							 nt < sizes[si] ? " at " : "", nt < sizes[si] ? tcnt : "");
					else if (want(&cf, "timerfd"))
						snprintf(ts, sizeof(ts), "not run: RLIMIT_NOFILE allows %zu", tfd_max);
					printf("  %-6s %3u %-9s | %-31s | %-44s\n",
					       fmt_count(cnt, sizeof(cnt), sizes[si]), nthr, op_name[op], cs, ts);
					if (have_c && rc[op].err && rc[op].err != -ECANCELED)
						PROBLEM("chime %s: %s\n", op_name[op], strerror(-rc[op].err));
					if (have_t && rt[op].err && rt[op].err != -ECANCELED)
						printf("  (timerfd %s: %s)\n", tfd_op_name[op], strerror(-rt[op].err));
				}
				/* The same operations through chime_submit, SUBMIT_BATCH a call. */
				if (want(&cf, "ops")) {
					have_c = run_ops(IMPL_SUBMIT, &b, sizes[si], nthr, batch, rc) == 0;
					for (int op = 0; op < NR_OPS; op++) {
						char name[24], cs[96];

						snprintf(name, sizeof(name), "%s/%u", op_name[op], SUBMIT_BATCH);
						snprintf(cs, sizeof(cs), "%7.1f (%7.1f) %6.2f %s", rc[op].median_ns,
							 rc[op].mean_ns, rc[op].mops,
							 !have_c || rc[op].err ? "ERR" : rc[op].median_ns <= 8.0 * nthr ? "ok  " : "MISS");
						if (rc[op].err)
							snprintf(cs, sizeof(cs), "%s", failed_cell(rc[op].err));
						printf("  %-6s %3u %-9s | %-31s | %-44s\n",
						       fmt_count(cnt, sizeof(cnt), sizes[si]), nthr, name, cs, "-");
						if (rc[op].err && rc[op].err != -ECANCELED)
							PROBLEM("chime_submit %s: %s\n", op_name[op], strerror(-rc[op].err));
					}
				}
				fflush(stdout);
			}
		}
		printf("  (ok/MISS: median <= 15 and mean <= 25 ns per call, median <= 8 ns per op in chime_submit\n"
		       "   batches of %u; with 2 threads, twice that)\n", SUBMIT_BATCH);
		if (want(&cf, "ops")) {
			struct floor_result fl;
			/* A burst is the timers of a thousand new connections, --quick too. */
			const unsigned burst = 1000;

			if (run_floor(burst, &fl) == 0)
				printf("\nfloor: one 64-byte record handed to another CPU through a ring, no chime code\n"
				       "(bursts of %u into slots the consumer wrote last; CPUs %d -> %d), ns per record:\n"
				       "  seq by release store %.1f | by exchange %.1f (libchime's publish) | CAS on the\n"
				       "  tail, then exchange %.1f | the same, the slot %u on prefetched for writing %.1f\n"
				       "  (libchime's reserve and publish) | 64 a CAS and an exchange %.1f (chime_submit's)\n"
				       "  | the same, the 64 slots prefetched for writing first %.1f\n",
				       burst, fl.cpu[0], fl.cpu[1], fl.ns[FLOOR_PLAIN], fl.ns[FLOOR_XCHG],
				       fl.ns[FLOOR_CAS_XCHG], CHIME_SQ_AHEAD, fl.ns[FLOOR_CAS_XCHG_AHEAD], fl.ns[FLOOR_BATCH], fl.ns[FLOOR_BATCH_AHEAD]);
			else
				printf("\nfloor: not measured (fewer than 2 CPUs allowed)\n");
			printf("\nclient operations in bursts: 1 or 2 threads on one chime_t, each batch of %u into\n"
			       "rings the broker has emptied (the bench waits, untimed, for its counters between\n"
			       "batches; 2 threads start each batch together); ns per op on each thread, median of\n"
			       "batches (mean)%s\n", burst,
			       cf.cold ? "; every CPU's caches flushed between the arms and the resets (--cold)" : "");
			printf("  %-6s %3s %-7s | %-25s | %-25s\n", "armed", "thr", "op", "chime_arm/reset/cancel",
			       "chime_submit, 64 a call");
			for (size_t si = 0; si < nsizes; si++) {
				for (unsigned nthr = 1; nthr <= MAX_THR; nthr++) {
					struct op_result rc[NR_OPS], rs[NR_OPS];
					int have_c = run_ops_bursts(IMPL_CHIME, &b, sizes[si], nthr, burst, cf.cold, rc) == 0;
					int have_s = run_ops_bursts(IMPL_SUBMIT, &b, sizes[si], nthr, burst, cf.cold, rs) == 0;
					char cnt[24];

					for (int op = 0; op < NR_OPS; op++) {
						char cs[64], ss[64];

						/* the targets: 15 ns per call (mean 25) and 8 per op in batches, x threads */
						snprintf(cs, sizeof(cs), "%7.1f (%7.1f) %s", rc[op].median_ns, rc[op].mean_ns,
							 !have_c || rc[op].err ? "ERR" :
							 rc[op].median_ns <= 15.0 * nthr && rc[op].mean_ns <= 25.0 * nthr ? "ok" : "MISS");
						snprintf(ss, sizeof(ss), "%7.1f (%7.1f) %s", rs[op].median_ns, rs[op].mean_ns,
							 !have_s || rs[op].err ? "ERR" : rs[op].median_ns <= 8.0 * nthr ? "ok" : "MISS");
						if (rc[op].err)
							snprintf(cs, sizeof(cs), "%s", failed_cell(rc[op].err));
						if (rs[op].err)
							snprintf(ss, sizeof(ss), "%s", failed_cell(rs[op].err));
						printf("  %-6s %3u %-7s | %-25s | %-25s\n", fmt_count(cnt, sizeof(cnt), sizes[si]),
						       nthr, op_name[op], cs, ss);
						if (rc[op].err && rc[op].err != -ECANCELED)
							PROBLEM("chime %s in bursts: %s\n", op_name[op], strerror(-rc[op].err));
						if (rs[op].err && rs[op].err != -ECANCELED)
							PROBLEM("chime_submit %s in bursts: %s\n", op_name[op], strerror(-rs[op].err));
					}
					fflush(stdout);
				}
			}
			printf("  (ok/MISS: median <= 15 and mean <= 25 ns per call; median <= 8 ns per op in\n"
			       "   chime_submit batches of %u; with 2 threads, twice that)\n", SUBMIT_BATCH);
			{
				struct sporadic_result sp;
				size_t nsp = cf.quick ? 20 : 100;

				if (run_sporadic(&b, nsp, 20 * NS_PER_MS, &sp) == 0)
					printf("\nsporadic operations: one at a time after 20 ms idle (the shard asleep), %zu each,\n"
					       "ns on the calling thread:\n"
					       "  keepalive reset (due after the shard's planned wake-up: no doorbell)"
					       "  p50 %6" PRIu64 "  p90 %6" PRIu64 "\n"
					       "  arm due in 50 ms (before it: a doorbell wakes the shard)           "
					       "  p50 %6" PRIu64 "  p90 %6" PRIu64 "\n"
					       "  arm due in 5 s (a second ahead or more: the heartbeat applies it) "
					       "  p50 %6" PRIu64 "  p90 %6" PRIu64 "\n"
					       "  the same reset of one timerfd (timerfd_settime, in turn with them) "
					       "  p50 %6" PRIu64 "  p90 %6" PRIu64 "\n",
					       nsp, pct(sp.reset_ns, sp.n, 0.5), pct(sp.reset_ns, sp.n, 0.9),
					       pct(sp.arm_ns, sp.n, 0.5), pct(sp.arm_ns, sp.n, 0.9),
					       pct(sp.arm_far_ns, sp.n, 0.5), pct(sp.arm_far_ns, sp.n, 0.9),
					       pct(sp.tfd_ns, sp.n, 0.5), pct(sp.tfd_ns, sp.n, 0.9));
				free(sp.reset_ns);
				free(sp.arm_ns);
				free(sp.arm_far_ns);
				free(sp.tfd_ns);
			}
		}
		if (want(&cf, "timerfd") && tfd_max < sizes[nsizes - 1])
			printf("  (timerfd \"at N\": RLIMIT_NOFILE could not be raised above %zu fds here (hard\n"
			       "   limit, no CAP_SYS_RESOURCE), so those rows ran with N timerfds armed)\n",
			       tfd_max + 256 + 64);
		printf("\n");
	}

	/* 2. broker throughput */
	if (want(&cf, "flood")) {
		printf("broker: sustained ops/s per shard, %u threads flooding chime_reset for %.1f s\n"
		       "        (shards' arms+resets+cancels from %s.ctl over the window / window / %u shards)\n",
		       MAX_THR, (double)flood_ns / 1e9, b.sock, b.nr_shards);
		printf("  %-6s | %-17s | %-10s | %-22s | %-17s | %s\n", "armed", "M ops/s per shard",
		       "shard busy", "M ops/s per busy shard", "client M resets/s", "target >= 10 M");
		for (size_t si = 0; si < nsizes; si++) {
			struct flood_result fr;
			char cnt[24];

			if (run_flood(&b, sizes[si], flood_ns, &fr) < 0) {
				if (fr.err)
					PROBLEM("flood: %s\n", strerror(-fr.err));
				printf("  %-6s | not measured\n", fmt_count(cnt, sizeof(cnt), sizes[si]));
				continue;
			}
			printf("  %-6s | %17.2f | %9.0f%% | %22.2f | %17.2f | %s\n",
			       fmt_count(cnt, sizeof(cnt), sizes[si]), fr.ops_per_shard, fr.busy_share * 100,
			       fr.ops_per_busy, fr.client_mops,
			       si == nsizes - 1 ? (fr.ops_per_shard >= 10 ? "ok" : "MISS") : "");
			fflush(stdout);
		}
		if (want(&cf, "timerfd") && tfd_max >= 1000) {
			double t = run_tflood(sizes[0] <= tfd_max ? sizes[0] : tfd_max / 1000 * 1000, flood_ns);
			char cnt[24];

			if (t < 0)
				printf("  timerfd: not measured (see above)\n");
			else
				printf("  timerfd: %u threads timerfd_settime over %s timerfds: %.2f M/s in all (the kernel's\n"
			       "           timers have no shard; that is the whole machine)\n",
			       MAX_THR, fmt_count(cnt, sizeof(cnt), sizes[0] <= tfd_max ? sizes[0] : tfd_max / 1000 * 1000), t);
		}
		printf("  counters' own cost: chimed has no switch to turn its counters off, so no with/without\n"
		       "  run is possible at run time; see the perf sample share in the report.\n\n");
	}

	/* 3. expirations */
	if (want(&cf, "expire")) {
		struct expire_result er;
		char cnt[24];

		printf("expirations delivered to a draining client (N timers due at the same instant)\n");
		printf("  %-34s %6s | %-21s | %-21s | %s\n", "", "N", "deadline->first (ms)",
		       "deadline->last (ms)", "M events/s");
		for (int busy = 0; busy <= 1; busy++) {
			if (run_expire_chime(&b, n_expire, cf.quick ? 500 * NS_PER_MS : 2 * NS_PER_S, busy, &er) != 0)
				continue;
			printf("  %-34s %6s | %21.2f | %21.2f | %.2f%s\n",
			       busy ? "chime (chime_poll loop)" : "chime (chime_wait loop)",
			       fmt_count(cnt, sizeof(cnt), er.n), (double)er.first_ns / 1e6,
			       (double)er.drain_ns / 1e6, er.per_s / 1e6, er.ok ? "" : "  INCOMPLETE");
			if (er.ok)
				printf("  %-34s CPU per event: client %.1f ns (first event to last), shards %.1f ns\n"
				       "  %-34s (all shards, deadline to last event, idle spin included)\n", "",
				       er.client_cpu, er.shard_cpu, "");
		}
		printf("  %-34s (a chime_poll loop never gives up its CPU: with a shard per CPU, one shard\n"
		       "  %-34s  shares it and runs only in the scheduler's time slices)\n", "", "");
		if (want(&cf, "timerfd")) {
			if (n_expire_tfd >= 1000 && run_expire_tfd(n_expire_tfd, NS_PER_S, &er) == 0)
				printf("  %-34s %6s | %21.2f | %21.2f | %.2f%s\n", "timerfd (epoll_wait + read each)",
				       fmt_count(cnt, sizeof(cnt), er.n), (double)er.first_ns / 1e6,
				       (double)er.drain_ns / 1e6, er.per_s / 1e6, er.ok ? "" : "  INCOMPLETE");
			else if (n_expire_tfd < 1000)
				printf("  timerfd: not run, RLIMIT_NOFILE allows %zu fds\n", tfd_max);
		}
		printf("\n");
	}

	/* 4. lateness */
	if (want(&cf, "lat")) {
		struct lat_result lc, lc2, lt, ls;
		char cnt[24];
		int have_t = 0;

		printf("lateness: %s timers, random deadlines over %.1f s, chime drained %s (us)\n",
		       fmt_count(cnt, sizeof(cnt), n_lat), (double)span_ns / 1e9,
		       cf.busy_poll ? "busy-polling (chime_poll in a loop)" : "blocking (chime_wait)");
		printf("  %-40s | %9s %9s %9s %9s | %s\n", "", "p50", "p99", "p99.9", "max", "events");
		if (run_lat_chime(&b, n_lat, span_ns, cf.busy_poll, &lc) == 0) {
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", "chime fired_ns - deadline (broker)",
			       pct(lc.fired, lc.got, .5) / 1e3, pct(lc.fired, lc.got, .99) / 1e3,
			       pct(lc.fired, lc.got, .999) / 1e3, (lc.got ? lc.fired[lc.got - 1] : 0) / 1e3,
			       lc.got, lc.n);
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", cf.busy_poll ? "chime received - deadline (chime_poll)" : "chime received - deadline (chime_wait)",
			       pct(lc.recv, lc.got, .5) / 1e3, pct(lc.recv, lc.got, .99) / 1e3,
			       pct(lc.recv, lc.got, .999) / 1e3, (lc.got ? lc.recv[lc.got - 1] : 0) / 1e3,
			       lc.got, lc.n);
		}
		if (cf.busy_poll && run_lat_spin(n_lat, span_ns, &ls) == 0) {
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", "bare clock-reading loop (the floor)",
			       pct(ls.recv, ls.got, .5) / 1e3, pct(ls.recv, ls.got, .99) / 1e3,
			       pct(ls.recv, ls.got, .999) / 1e3, (ls.got ? ls.recv[ls.got - 1] : 0) / 1e3,
			       ls.got, ls.n);
			free(ls.recv);
		}
		/*
		 * Fewer timerfds than timers (RLIMIT_NOFILE): chime again at the
		 * timerfds' count, so that one pair of rows is the same workload.
		 * Five times the timers over the same span is five times as dense.
		 */
		if (want(&cf, "timerfd") && n_lat_tfd >= 1000 && n_lat_tfd < n_lat &&
		    run_lat_chime(&b, n_lat_tfd, span_ns, cf.busy_poll, &lc2) == 0) {
			char label[64];

			snprintf(label, sizeof(label), "chime received - deadline, %s timers", fmt_count(cnt, sizeof(cnt), n_lat_tfd));
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", label,
			       pct(lc2.recv, lc2.got, .5) / 1e3, pct(lc2.recv, lc2.got, .99) / 1e3,
			       pct(lc2.recv, lc2.got, .999) / 1e3, (lc2.got ? lc2.recv[lc2.got - 1] : 0) / 1e3,
			       lc2.got, lc2.n);
			free(lc2.fired);
			free(lc2.recv);
		}
		if (want(&cf, "timerfd") && n_lat_tfd >= 1000 && run_lat_tfd(n_lat_tfd, span_ns, &lt) == 0) {
			have_t = 1;
			printf("  %-40s | %9.1f %9.1f %9.1f %9.1f | %zu/%zu\n", "timerfd received - deadline (epoll)",
			       pct(lt.recv, lt.got, .5) / 1e3, pct(lt.recv, lt.got, .99) / 1e3,
			       pct(lt.recv, lt.got, .999) / 1e3, (lt.got ? lt.recv[lt.got - 1] : 0) / 1e3,
			       lt.got, lt.n);
		}
		free(lc.fired);
		free(lc.recv);
		if (have_t)
			free(lt.recv);
		printf("\n");
	}

	{
		double la[3] = { 0, 0, 0 };

		getloadavg(la, 3);
		printf("done in %.1f s; load average %.2f %.2f %.2f at the end\n",
		       (double)(now_ns() - t_run) / 1e9, la[0], la[1], la[2]);
	}
	if (broker_stop(&b) < 0)
		g_problems++;
	if (g_problems)
		printf("%d correctness problem(s) seen: see the lines marked !! above\n", g_problems);
	return g_problems ? 1 : 0;
}
