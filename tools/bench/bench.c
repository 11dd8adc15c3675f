/* SPDX-License-Identifier: MIT */
/* bench.c - helpers shared by chime-bench's modes. */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

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
		fprintf(stderr, "chime-bench: mmap(%zu bytes) failed: %s\n", len, strerror(errno));
		exit(1);
	}
	return p;
}

void bench_unmap(void *p, size_t len)
{
	munmap(p, len);
}
