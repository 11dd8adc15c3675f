#!/usr/bin/env bash
# run-tests.sh - install what is needed, build chime five ways and run the
# test suite in each, then print the closing line "N passed, N failed".
#
#   tools/run-tests.sh               default suite: unit tests, short integration
#                                    and stress runs, and 10 s of fuzzing per
#                                    target (six, two at a time: about 35 s);
#                                    each integration program in one of
#                                    the plain and ASan+UBSan builds (suite
#                                    'other-build' left out, tests/meson.build)
#                                    (from a fresh clone on 2 cores, the five
#                                    builds included: 8 to 16 minutes by the
#                                    host's day, 465-907 s in CI on 2026-12-02;
#                                    each phase's time is printed before the
#                                    summary)
#   tools/run-tests.sh --full        the same with every program in both builds
#                                    (about 15 minutes)
#   tools/run-tests.sh --stress      the long stress and soak suite instead (plain
#                                    and ASan+UBSan builds; about 15 minutes here)
#   tools/run-tests.sh --fuzz SECS   only the fuzzers (build-fuzz), SECS seconds each
#
# Builds: build/ (-Werror), build-asan/ (AddressSanitizer + UBSan, -Werror),
# build-tsan/ (ThreadSanitizer: the plain-executable thread checks only, since
# criterion cannot run under TSan), build-fuzz/ (clang-14, libFuzzer + ASan +
# UBSan: suite 'fuzz' only; a crashing input is left in
# build-fuzz/meson-logs/fuzz-artifacts), build-lto/ (link-time optimization,
# as distributions build: only what `meson install` installs is built there,
# for the install test, which checks libchime's symbol versions).
# Exit status: 0 if every case passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

setup="default"
suite_args=(--no-suite other-build)
fuzz_only=0
fuzz_secs=10
case "${1:-}" in
"") ;;
--full) suite_args=() ;;
--stress) setup="stress"; suite_args=(--suite stress) ;;
--fuzz)
	fuzz_secs=${2:-}
	if ! [[ "$fuzz_secs" =~ ^[1-9][0-9]*$ ]]; then
		echo "run-tests.sh: --fuzz needs a number of seconds (e.g. --fuzz 3600)" >&2
		exit 2
	fi
	fuzz_only=1 ;;
-h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "run-tests.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

# Each phase's wall time, printed as it ends and again before the summary.
phases=()
phase_t0=$SECONDS
phase_end() {
	local what=$1 secs=$((SECONDS - phase_t0))
	echo "==> $what: ${secs} s"
	phases+=("$(printf '%-22s %4d s' "$what" "$secs")")
	phase_t0=$SECONDS
}

tools/install-deps.sh || exit 1

# promtool checks chimestat's Prometheus output. Debian ships it only inside
# the prometheus server package, whose install would start a server; so unpack
# the package into a cache instead of installing it (no root, no service).
# Without it the test falls back to a format check of its own.
if ! command -v promtool >/dev/null 2>&1; then
	cache="$PWD/.cache/promtool"
	if [ ! -x "$cache/usr/bin/promtool" ]; then
		mkdir -p "$cache"
		( cd "$cache" && apt-get download prometheus >/dev/null 2>&1 &&
		  dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb ) ||
			echo "run-tests.sh: promtool unavailable; Prometheus output gets the format check only" >&2
	fi
	[ -x "$cache/usr/bin/promtool" ] && export PATH="$cache/usr/bin:$PATH"
fi

# ccache (tools/install-deps.sh installs it; meson compiles through it by
# itself, and run_fuzz names it for clang-14): CI builds in a fresh clone in a
# new directory every time, so key the cache on paths relative to the clone
# and leave the directory out of the hash, or nothing would ever hit. (An
# object from the cache carries the directory of the clone that compiled it
# first in its debug information: only a debugger's source lookup sees it.)
if command -v ccache >/dev/null 2>&1; then
	export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
	fuzz_cc="ccache clang-14"
else
	fuzz_cc=clang-14
fi

phase_end "install-deps, promtool"

# configure DIR [meson options...]: set up a build dir, or reconfigure an existing one.
configure() {
	local dir=$1; shift
	if [ -f "$dir/build.ninja" ]; then
		meson setup --reconfigure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@" >/dev/null
	fi
}

# installed_targets DIR: the build targets `meson install` installs (paths
# relative to DIR, for ninja), from meson's introspection.
installed_targets() {
	meson introspect "$1" --targets | python3 -c '
import json, os, sys
for t in json.load(sys.stdin):
    if t["installed"]:
        for f in t["filename"]:
            print(os.path.relpath(f, sys.argv[1]))' "$(cd "$1" && pwd)"
}

# pick_targets DIR: with installed_only=1, set targets to what DIR installs.
pick_targets() {
	[ "$installed_only" = 1 ] || return 0
	mapfile -t targets < <(installed_targets "$1")
	[ "${#targets[@]}" -gt 0 ] || { echo "run-tests.sh: $1 installs no build target?" >&2; return 1; }
}

labels=()
targets=()          # what run() builds: everything unless set
installed_only=0    # 1: build only what `meson install` installs (targets unused)
test_jobs=2         # meson test --num-processes
run() {
	local label=$1 dir=$2; shift 2
	echo "==> $label: build ($dir)"
	phase_t0=$SECONDS
	if ! configure "$dir" -Dwerror=true "$@" || ! pick_targets "$dir" ||
	   ! ninja -C "$dir" "${targets[@]}" >"$dir.ninja.log" 2>&1; then
		cat "$dir.ninja.log" 2>/dev/null | tail -40
		echo "$label: build failed"
		mkdir -p "$dir/meson-logs"
		echo '{"name": "build", "result": "FAIL", "stdout": ""}' >"$dir/meson-logs/testlog-$setup.json"
		labels+=("$label=$dir")
		phase_end "$label build (failed)"
		return
	fi
	phase_end "$label build"
	echo "==> $label: test (setup $setup)"
	rm -f "$dir"/meson-logs/testlog*.json   # the summary must not count an older run
	# Two at a time, but only the tests marked parallel in tests/meson.build
	# run beside another: the others measure lateness, and two cores are few.
	meson test -C "$dir" --setup "$setup" "${suite_args[@]}" --num-processes "$test_jobs" --print-errorlogs
	labels+=("$label=$dir")
	phase_end "$label tests"
}

# The fuzzer: its own clang build, suite 'fuzz' only, for $fuzz_secs seconds
# (tests/fuzz/run-fuzz.sh reads CHIME_FUZZ_SECONDS; no meson timeout then).
# Only the fuzz targets are built: the rest of the tree is checked by gcc above.
# Two targets fuzz at once, one a core (up to the cores there are): they
# measure no time, and nothing else runs meanwhile.
run_fuzz() {
	local saved_args=("${suite_args[@]}") saved_jobs=$test_jobs
	suite_args=(--suite fuzz --no-rebuild)
	[ "$fuzz_only" = 0 ] || suite_args+=(--timeout-multiplier 0)
	targets=(tests/fuzz/fuzz_chan tests/fuzz/fuzz_rebuild tests/fuzz/fuzz_hello tests/fuzz/fuzz_sessions
		 tests/fuzz/fuzz_restore tests/fuzz/fuzz_stats)
	test_jobs=$(nproc 2>/dev/null || echo 1)
	[ "$test_jobs" -le 2 ] || test_jobs=2
	CHIME_FUZZ_SECONDS=$fuzz_secs CC=$fuzz_cc \
		run fuzz build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
	test_jobs=$saved_jobs
	targets=()
	suite_args=("${saved_args[@]}")
}

if [ "$fuzz_only" = 1 ]; then
	run_fuzz
else
	run release build
	if [ "$setup" != stress ]; then
		# The install test only: build what `meson install` installs (the test
		# depends on nothing else), and let `meson test` build nothing more.
		saved_args=("${suite_args[@]}")
		suite_args=(--no-rebuild install)
		installed_only=1
		run lto build-lto -Db_lto=true
		installed_only=0
		targets=()
		suite_args=("${saved_args[@]}")
	fi
	run asan+ubsan build-asan -Db_sanitize=address,undefined -Db_lundef=false
	# TSan runs only the plain tsan_* checks, which have no stress variant.
	[ "$setup" = stress ] || run tsan build-tsan -Db_sanitize=thread -Db_lundef=false
	[ "$setup" = stress ] || run_fuzz
fi

echo
echo "==> wall time by phase:"
printf '    %s\n' "${phases[@]}"
printf '    %-22s %4d s\n' total "$SECONDS"
echo
exec python3 tools/test-summary.py "${labels[@]}"
