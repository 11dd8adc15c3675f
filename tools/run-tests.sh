#!/usr/bin/env bash
# run-tests.sh - install what is needed, build chime three ways and run the
# test suite in each, then print the closing line "N passed, N failed".
#
#   tools/run-tests.sh           default suite: unit tests and short integration
#                                and stress runs (about 2 minutes on 2 cores)
#   tools/run-tests.sh --stress  the long stress and soak suite instead (plain
#                                and ASan+UBSan builds; about 2 minutes here)
#
# Builds: build/ (-Werror), build-asan/ (AddressSanitizer + UBSan, -Werror),
# build-tsan/ (ThreadSanitizer: the plain-executable thread checks only, since
# criterion cannot run under TSan). Exit status: 0 if every case passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

setup="default"
suite_args=()
case "${1:-}" in
"") ;;
--stress) setup="stress"; suite_args=(--suite stress) ;;
-h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "run-tests.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

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

# configure DIR [meson options...]: set up a build dir, or reconfigure an existing one.
configure() {
	local dir=$1; shift
	if [ -f "$dir/build.ninja" ]; then
		meson setup --reconfigure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@" >/dev/null
	fi
}

labels=()
run() {
	local label=$1 dir=$2; shift 2
	echo "==> $label: build ($dir)"
	if ! configure "$dir" -Dwerror=true "$@" || ! ninja -C "$dir" >"$dir.ninja.log" 2>&1; then
		cat "$dir.ninja.log" 2>/dev/null | tail -40
		echo "$label: build failed"
		mkdir -p "$dir/meson-logs"
		echo '{"name": "build", "result": "FAIL", "stdout": ""}' >"$dir/meson-logs/testlog-$setup.json"
		labels+=("$label=$dir")
		return
	fi
	echo "==> $label: test (setup $setup)"
	rm -f "$dir"/meson-logs/testlog*.json   # the summary must not count an older run
	# Serial on purpose: the integration tests measure lateness, and two cores are few.
	meson test -C "$dir" --setup "$setup" "${suite_args[@]}" --num-processes 1 --print-errorlogs
	labels+=("$label=$dir")
}

run release build
run asan+ubsan build-asan -Db_sanitize=address,undefined -Db_lundef=false
# TSan runs only the plain tsan_* checks, which have no stress variant.
[ "$setup" = stress ] || run tsan build-tsan -Db_sanitize=thread -Db_lundef=false

echo
exec python3 tools/test-summary.py "${labels[@]}"
