#!/usr/bin/env bash
# bench-counters.sh - what the broker's counters cost on its hot path.
#
# Runs the same fixed workload (chime-demo: 1M timers armed from 2 threads,
# fired and delivered) against a chimed built as usual and one built with
# -Dcounters=false, RUNS times each, and prints the broker's CPU time per
# timer (arm + fire + deliver) from /proc/PID/schedstat. The broker runs with
# --spin-us 0 so that idle spinning is not counted; both variants pay the
# same sleeps and wake-ups, so the difference is the counters.
#   tools/bench-counters.sh [RUNS]     (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
-h|--help)
	echo "Usage: tools/bench-counters.sh [RUNS]"
	echo "chimed's CPU per timer with and without its counters (-Dcounters=false, built in"
	echo "build-nocounters/), the median of RUNS runs of each (1..100, default 3)."
	exit 0 ;;
esac
runs=${1:-3}
case $runs in
''|*[!0-9]*|0*) echo "bench-counters.sh: RUNS '$runs' is not a number from 1 to 100 (try --help)" >&2; exit 2 ;;
esac
[ "$runs" -le 100 ] || { echo "bench-counters.sh: RUNS '$runs' is not a number from 1 to 100 (try --help)" >&2; exit 2; }
[ $# -le 1 ] || { echo "bench-counters.sh: unexpected argument '$2' (try --help)" >&2; exit 2; }
timers=1000000

tools/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
[ -f build-nocounters/build.ninja ] || meson setup build-nocounters -Dcounters=false -Dtests=disabled >/dev/null
ninja -C build >/dev/null
ninja -C build-nocounters broker/chimed >/dev/null

# cpu_ns PID: nanoseconds on CPU of every thread of PID so far.
cpu_ns() {
	local t sum=0
	for t in /proc/"$1"/task/*/schedstat; do
		sum=$((sum + $(cut -d' ' -f1 "$t")))
	done
	echo "$sum"
}

one_run() {
	local chimed=$1 dir sock pid before after
	dir=$(mktemp -d /tmp/chime-bc-XXXXXX)
	sock="$dir/chime.sock"
	"$chimed" --foreground --spin-us 0 --socket "$sock" 2>/dev/null &
	pid=$!
	for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
	before=$(cpu_ns "$pid")
	build/tools/chime-demo --socket "$sock" --timers "$timers" --threads 2 --seconds 2 --max-ms 100 >/dev/null
	after=$(cpu_ns "$pid")
	kill -TERM "$pid"; wait "$pid" || true
	rm -rf "$dir"
	echo $(( (after - before) / timers ))
}

echo "bench-counters: chimed CPU ns per timer (arm + fire + deliver), chime-demo $timers timers, $runs runs each"
for variant in build build-nocounters; do
	results=()
	for _ in $(seq "$runs"); do
		results+=("$(one_run "$PWD/$variant/broker/chimed")")
	done
	sorted=$(printf '%s\n' "${results[@]}" | sort -n | tr '\n' ' ')
	median=$(printf '%s\n' "${results[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
	printf '  %-18s median %4s ns/timer   (runs: %s)\n' "$variant" "$median" "$sorted"
done
