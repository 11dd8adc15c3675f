/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what chime-bench's modes share: a clock, a PRNG, medians, and
 * the mode entry points (one per file: wheel.c, e2e.c, ...).
 */
#ifndef CHIME_BENCH_H
#define CHIME_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "clock.h"     /* now_ns(), splitmix64() */

/* A mode: argv[0] is the mode's name. Returns the exit status (2: usage). */
typedef int (*bench_mode_fn)(int argc, char **argv);

int bench_wheel(int argc, char **argv);

/* Median of v[0..n) (sorts v). 0 if n == 0. */
double bench_median(double *v, size_t n);

/* Fisher-Yates shuffle of idx[0..n). */
void bench_shuffle(uint32_t *idx, size_t n, uint64_t *rng);

/* Anonymous mapping, NORESERVE; exits with a message on failure. */
void *bench_map(size_t len);
void bench_unmap(void *p, size_t len);

#endif /* CHIME_BENCH_H */
