/* SPDX-License-Identifier: MIT */
/*
 * wheel_alone.c - `chime-bench wheel` built from bench.c, heap.c, wheel.c
 * and the broker's wheel.c, nothing else, as ../shared/bench-ref builds it
 * (with timeout.c beside): the build fails here when bench.c comes to need
 * more of chime, as it did once (chime_proc_stat(), 2026-12-05).
 */
#include "bench.h"

int main(int argc, char **argv)
{
	return bench_wheel(argc, argv);
}
