/* SPDX-License-Identifier: MIT */
/*
 * chime-bench - benchmarks, one mode per file. A mode is one line in
 * modes[] plus its file in tools/meson.build's bench_sources.
 */
#include <stdio.h>
#include <string.h>

#include "chime_config.h"
#include "bench.h"
#include "e2e.h"
#include "compare.h"

static const struct {
	const char *name;
	bench_mode_fn fn;
	const char *help;
} modes[] = {
	{ "wheel", bench_wheel, "timing wheel vs binary heap: arm, cancel, reset, expiry [--quick]" },
	{ "e2e", bench_e2e, "libchime + chimed end to end vs timerfd [--socket PATH] [--quick]" },
	{ "compare", bench_compare, "chime vs its wheel, timerfd, libuv, libev: ops, expiry, memory, CPU, lateness [--quick] [--json]" },
	{ "apply", bench_apply, "the shard's cost per submission record, in-process: arm, reset, cancel [--quick]" },
	{ "rest", bench_rest, "the broker at rest with N timers armed an hour ahead: CPU and wake-ups [--timers N] [--seconds S]" },
};

#define NR_MODES (sizeof(modes) / sizeof(modes[0]))

static void usage(FILE *f)
{
	fprintf(f, "usage: chime-bench MODE [OPTIONS]\n       chime-bench MODE --help\n"
		"       chime-bench -h|--help | -V|--version\n\nmodes:\n");
	for (size_t i = 0; i < NR_MODES; i++)
		fprintf(f, "  %-8s %s\n", modes[i].name, modes[i].help);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("chime-bench %s\n", CHIME_VERSION);
		return 0;
	}
	for (size_t i = 0; i < NR_MODES; i++) {
		if (!strcmp(argv[1], modes[i].name))
			return modes[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "chime-bench: unknown mode '%s' (try chime-bench --help)\n", argv[1]);
	return 2;
}
