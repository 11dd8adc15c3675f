/* SPDX-License-Identifier: MIT */
/* helpers.h - small things every test file uses. */
#ifndef CHIME_TEST_HELPERS_H
#define CHIME_TEST_HELPERS_H

#include <stdint.h>

/* CLOCK_MONOTONIC in ns. */
uint64_t t_now_ns(void);

/* A deterministic PRNG (splitmix64) so a failing seed can be replayed. */
uint64_t t_rand(uint64_t *state);

/* A unique name for this test process: "/chime-t-<pid>-<n>" style, written into buf. */
const char *t_unique_name(char *buf, unsigned len, const char *prefix);

#endif
