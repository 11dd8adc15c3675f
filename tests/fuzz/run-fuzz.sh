#!/bin/sh
# run-fuzz.sh FUZZER SEED_DIR SECONDS ARTIFACT_DIR - run a libFuzzer target for SECONDS on a
# copy of the seed corpus ($CHIME_FUZZ_SECONDS, if set, overrides SECONDS:
# tools/run-tests.sh --fuzz SECS). Exit 0 if it found nothing; otherwise the fuzzer's
# exit status, with the crashing input left in ARTIFACT_DIR (for
# tests/fuzz/corpus and a regression test in tests/test_chan.c).
set -eu
fuzzer=$1 seeds=$2 secs=${CHIME_FUZZ_SECONDS:-$3} artifacts=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/chime-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM HUP
mkdir -p "$work/corpus" "$artifacts"
cp "$seeds"/* "$work/corpus/" 2>/dev/null || true
# libFuzzer reports on stderr; keep stdout free of anything a TAP parser could read.
exec 1>&2
"$fuzzer" -max_total_time="$secs" -error_exitcode=1 -timeout=25 -rss_limit_mb=2048 \
	-artifact_prefix="$artifacts/" -print_final_stats=1 "$work/corpus"
