/* SPDX-License-Identifier: MIT */
/*
 * proc.c - chime-bench's /proc readers: a process's CPU (its own and its
 * helper children's), its threads' context switches and its RSS. Apart
 * from bench.c so that the wheel benchmark builds from bench.c and the
 * wheel alone (../shared/bench-ref builds it so, with timeout.c beside).
 */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "segment.h"      /* chime_proc_stat() */

/* Sum of utime+stime in /proc/PID/stat (clock ticks), as ns; UINT64_MAX if unreadable. */
static uint64_t stat_cpu_ns(pid_t pid)
{
	char buf[1024];
	const char *f = chime_proc_stat(pid, buf, sizeof(buf));
	unsigned long long ut = 0, st = 0;

	if (!f || sscanf(f, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return UINT64_MAX;
	return (ut + st) * (UINT64_C(1000000000) / (uint64_t)sysconf(_SC_CLK_TCK));
}

/* Process pid's threads, added to s. */
static int sample_tasks(pid_t pid, struct bench_proc *s)
{
	char path[64];
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((e = readdir(d)) != NULL) {
		struct bench_thread th = { .tid = atoi(e->d_name) };
		char p[96], line[256];
		unsigned long long v;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		/* schedstat: ns on a CPU, exact (stat's ticks are 10 ms here) */
		snprintf(p, sizeof(p), "/proc/%d/task/%d/schedstat", (int)pid, th.tid);
		if ((f = fopen(p, "r")) != NULL) {
			if (fscanf(f, "%llu", &v) == 1)
				th.sched_ns = v;
			fclose(f);
		}
		snprintf(p, sizeof(p), "/proc/%d/task/%d/status", (int)pid, th.tid);
		if ((f = fopen(p, "r")) != NULL) {
			while (fgets(line, sizeof(line), f)) {
				if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1)
					th.vol = v;
				else if (sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
					th.nonvol = v;
			}
			fclose(f);
		}
		snprintf(p, sizeof(p), "/proc/%d/task/%d/comm", (int)pid, th.tid);
		if ((f = fopen(p, "r")) != NULL) {
			if (fgets(th.comm, sizeof(th.comm), f))
				th.comm[strcspn(th.comm, "\n")] = '\0';
			fclose(f);
		}
		s->sched_ns += th.sched_ns;
		s->vol += th.vol;
		s->nonvol += th.nonvol;
		if (s->threads < BENCH_MAX_THREADS)
			s->thr[s->threads] = th;
		s->threads++;
	}
	closedir(d);
	return 0;
}

int bench_proc_sample(pid_t pid, struct bench_proc *s)
{
	char path[96];
	int child, r;
	FILE *f;

	memset(s, 0, sizeof(*s));
	s->t_ns = now_ns();
	/* unreadable (gone, or another's): an error, never a sample of 0 CPU */
	if ((s->stat_ns = stat_cpu_ns(pid)) == UINT64_MAX)
		return -ESRCH;
	r = sample_tasks(pid, s);
	if (r < 0)
		return r;
	/* Its children, forked by its main thread: chimed's discard helper works for it. */
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
	f = fopen(path, "r");
	while (f && fscanf(f, "%d", &child) == 1) {
		uint64_t ns = stat_cpu_ns(child);

		if (ns == UINT64_MAX)
			continue;       /* gone meanwhile */
		s->stat_ns += ns;
		(void)sample_tasks(child, s);
	}
	if (f)
		fclose(f);
	return 0;
}

uint64_t bench_rss_bytes(pid_t pid)
{
	char path[64];
	unsigned long long size = 0, rss = 0;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/statm");
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%llu %llu", &size, &rss) != 2)
		rss = 0;
	fclose(f);
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

