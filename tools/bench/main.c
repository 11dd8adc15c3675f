/* SPDX-License-Identifier: MIT */
/*
 * chime-bench - benchmarks, one mode per file. A mode is one line in
 * modes[] plus its file in tools/meson.build's bench_sources.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

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
	{ "e2e", bench_e2e, "libchime + chimed end to end vs timerfd [--socket PATH] [--quick]\n"
	  "           [--shards N] [--only PARTS] [--expire N] [--busy-poll] [--cold]" },
	{ "compare", bench_compare, "chime vs its wheel, timerfd, libuv, libev: ops, expiry, memory,\n"
	  "           CPU, lateness [--quick] [--json] [--socket PATH] [--sizes N,N...]\n"
	  "           [--lateness-csv DIR] [--lateness-rounds N]" },
	{ "apply", bench_apply, "the shard's cost per submission record, in-process: arm, reset,\n"
	  "           cancel [--quick]" },
	{ "rest", bench_rest, "the broker at rest with N timers armed an hour ahead: CPU and\n"
	  "           wake-ups [--socket PATH] [--timers N] [--seconds S] [--session NAME]\n"
	  "           [--json]" },
};

#define NR_MODES (sizeof(modes) / sizeof(modes[0]))

/*
 * --json and a run that failed before its document: one that says so, in
 * chimectl -j's shape (a message quoting a path may not be UTF-8: such
 * bytes become '?').
 */
static void json_failure(const char *mode, int status)
{
	json_t *o, *e;

	if (!bench_last_error[0])
		snprintf(bench_last_error, sizeof(bench_last_error), "it could not run (see standard error)");
	e = json_string(bench_last_error);
	if (!e) {
		for (char *p = bench_last_error; *p; p++)
			if ((unsigned char)*p >= 0x80)
				*p = '?';
		e = json_string(bench_last_error);
	}
	o = json_pack("{s:s,s:s,s:b,s:i,s:o}", "version", CHIME_VERSION, "mode", mode, "ok", 0,
		      "exit_status", status, "error", e);
	if (o) {
		json_dumpf(o, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(o);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: chime-bench MODE [OPTIONS]\n       chime-bench MODE --help\n"
		"       chime-bench -h|--help | -V|--version\n\nmodes:\n");
	for (size_t i = 0; i < NR_MODES; i++)
		fprintf(f, "  %-8s %s\n", modes[i].name, modes[i].help);
	fprintf(f, "\nExit status: 0 the benchmark ran; 1 it could not (the message says why), or\n"
		"a problem was seen (lines marked !!; rest: a target missed); 2 usage error.\n");
}

int main(int argc, char **argv)
{
	static char name[64];
	bool help;

	if (argc < 2) {
		fprintf(stderr, "chime-bench: missing MODE (try 'chime-bench --help')\n");
		return 2;
	}
	help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
	if (help || !strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		/* chime-bench(1): an argument left over is a usage error, here too */
		if (argc > 2) {
			fprintf(stderr, "chime-bench: unexpected argument '%s' (try 'chime-bench --help')\n", argv[2]);
			return 2;
		}
		if (help)
			usage(stdout);
		else
			printf("chime-bench %s\n", CHIME_VERSION);
		return sr_stdout_check("chime-bench");
	}
	for (size_t i = 0; i < NR_MODES; i++) {
		if (!strcmp(argv[1], modes[i].name)) {
			int r;

			/* getopt_long() prefixes its messages with argv[0]: "chime-bench e2e: ..." */
			snprintf(name, sizeof(name), "chime-bench %s", modes[i].name);
			argv[1] = name;
			bench_prog = name;
			r = modes[i].fn(argc - 1, argv + 1);
			if (r == 1 && bench_json && !bench_json_done)
				json_failure(modes[i].name, r);
			/* Figures that did not arrive (a full disk) are no success. */
			return sr_stdout_check(name) && !r ? 1 : r;
		}
	}
	fprintf(stderr, "chime-bench: unknown mode '%s' (try 'chime-bench --help')\n", argv[1]);
	return 2;
}
