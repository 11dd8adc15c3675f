/* SPDX-License-Identifier: MIT */
#include "helpers.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

uint64_t t_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t t_rand(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

const char *t_unique_name(char *buf, unsigned len, const char *prefix)
{
	static unsigned n;

	snprintf(buf, len, "%s-%d-%u", prefix, (int)getpid(), n++);
	return buf;
}
