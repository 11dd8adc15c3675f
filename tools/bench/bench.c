/* SPDX-License-Identifier: MIT */
/* bench.c - helpers shared by chime-bench's modes. */
/* secure_getenv() (paths.h): ../shared/bench-ref compiles this file without meson's -D_GNU_SOURCE */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cliarg.h"
#include "paths.h"

const char *bench_prog = "chime-bench";
int bench_json, bench_json_done;
char bench_last_error[1024];

void bench_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(bench_last_error, sizeof(bench_last_error), fmt, ap);
	va_end(ap);
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", bench_prog);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/*
 * The number in p[0..len): 0, -EINVAL if it is not a decimal number, or
 * -ERANGE if it is one (negative, or past UINT64_MAX included) outside
 * min..max.
 */
static int parse_span(const char *p, size_t len, uint64_t min, uint64_t max, uint64_t *out)
{
	int neg = len > 0 && p[0] == '-';
	uint64_t v;
	int r = chime_parse_u64n(p + neg, len - (size_t)neg, &v);

	if (r < 0)
		return r;
	if (neg || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int bench_opt_u64(const char *mode, const char *opt, const char *s, uint64_t min, uint64_t max,
		  uint64_t *out)
{
	int r = parse_span(s, strlen(s), min, max, out);

	if (r < 0)
		fprintf(stderr, "chime-bench %s: %s '%s': %s (%" PRIu64 "..%" PRIu64 ")\n", mode, opt, s,
			r == -EINVAL ? "not a number" : "out of range", min, max);
	return r < 0 ? -1 : 0;
}

int bench_opt_socket(const char *mode, const char *s, const char **out)
{
	char prog[64];

	snprintf(prog, sizeof(prog), "chime-bench %s", mode);
	if (chime_socket_opt(prog, s) < 0)
		return -1;
	*out = s;
	return 0;
}

int bench_usage_error(const char *mode, const char *unexpected)
{
	if (unexpected)
		fprintf(stderr, "chime-bench %s: unexpected argument '%s' (try 'chime-bench %s --help')\n", mode,
			unexpected, mode);
	else
		fprintf(stderr, "chime-bench %s: try 'chime-bench %s --help'\n", mode, mode);
	return 2;
}

int bench_opt_u64_list(const char *mode, const char *opt, const char *s, uint64_t min, uint64_t max,
		       uint64_t *out, size_t cap, size_t *n)
{
	const char *p = s;

	*n = 0;
	for (;;) {
		size_t len = strcspn(p, ",");
		int r;

		if (*n == cap) {
			fprintf(stderr, "chime-bench %s: %s '%s': more than %zu numbers\n", mode, opt, s, cap);
			return -1;
		}
		r = parse_span(p, len, min, max, &out[*n]);
		if (r < 0) {
			fprintf(stderr, "chime-bench %s: %s '%s': '%.*s' %s (%" PRIu64 "..%" PRIu64 ")\n", mode,
				opt, s, (int)len, p, r == -EINVAL ? "not a number" : "out of range", min, max);
			return -1;
		}
		(*n)++;
		if (p[len] == '\0')
			return 0;
		p += len + 1;
	}
}

int bench_opt_names(const char *mode, const char *opt, const char *s, const char *const *names,
		    unsigned nnames, uint32_t *mask)
{
	const char *p = s;

	*mask = 0;
	for (;;) {
		size_t len = strcspn(p, ",");
		unsigned i;

		for (i = 0; i < nnames && i < 32; i++)
			if (strlen(names[i]) == len && !strncmp(p, names[i], len))
				break;
		if (i == nnames || i == 32) {
			fprintf(stderr, "chime-bench %s: %s '%s': unknown part '%.*s' (valid:", mode, opt, s,
				(int)len, p);
			for (i = 0; i < nnames; i++)
				fprintf(stderr, "%s%s", i ? "," : " ", names[i]);
			fprintf(stderr, ")\n");
			return -1;
		}
		*mask |= UINT32_C(1) << i;
		if (p[len] == '\0')
			return 0;
		p += len + 1;
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_shuffle(uint32_t *idx, size_t n, uint64_t *rng)
{
	for (size_t i = n; i > 1; i--) {
		size_t j = splitmix64(rng) % i;
		uint32_t t = idx[i - 1];

		idx[i - 1] = idx[j];
		idx[j] = t;
	}
}

void *bench_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED) {
		fprintf(stderr, "%s: mmap(%zu bytes) failed: %s\n", bench_prog, len, strerror(errno));
		exit(1);
	}
	return p;
}

void bench_unmap(void *p, size_t len)
{
	munmap(p, len);
}

void bench_machine(struct bench_machine *m)
{
	char line[256];
	FILE *f = fopen("/proc/cpuinfo", "r");
	struct utsname u;
	time_t t = time(NULL);

	memset(m, 0, sizeof(*m));
	snprintf(m->model, sizeof(m->model), "?");
	if (f) {
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
				snprintf(m->model, sizeof(m->model), "%s", strchr(line, ':') + 2);
				m->model[strcspn(m->model, "\n")] = '\0';
				break;
			}
		fclose(f);
	}
	if (uname(&u) == 0)
		snprintf(m->kernel, sizeof(m->kernel), "%s", u.release);
	strftime(m->date, sizeof(m->date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
	m->cpus = sysconf(_SC_NPROCESSORS_ONLN);
	getloadavg(m->load, 3);
}
