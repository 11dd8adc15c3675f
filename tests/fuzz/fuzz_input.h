/* SPDX-License-Identifier: MIT */
/*
 * fuzz_input.h - what every libFuzzer target here shares: reading its input
 * a field at a time (past the end, fields read as zero) and CHECK(), which
 * aborts with the invariant that failed, for libFuzzer to keep the input.
 */
#ifndef CHIME_FUZZ_INPUT_H
#define CHIME_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...) do { \
	if (!(cond)) { \
		fprintf(stderr, "invariant violated at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
		fprintf(stderr, __VA_ARGS__); \
		fputc('\n', stderr); \
		abort(); \
	} \
} while (0)

struct in {
	const uint8_t *p;
	size_t n;
};

/* The next len (<= 8) bytes as a little-endian number; fewer if the input ends. */
static inline uint64_t take(struct in *in, size_t len)
{
	uint64_t v = 0;

	len = len < in->n ? len : in->n;
	memcpy(&v, in->p, len);
	in->p += len;
	in->n -= len;
	return v;
}

static inline void skip(struct in *in, size_t len)
{
	len = len < in->n ? len : in->n;
	in->p += len;
	in->n -= len;
}

static inline uint8_t byte(struct in *in)
{
	return (uint8_t)take(in, 1);
}

#endif /* CHIME_FUZZ_INPUT_H */
