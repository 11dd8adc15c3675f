#!/bin/sh
# install-deps.sh - install the Debian 12 packages that chime's build, tests,
# demo and benchmarks need. Idempotent: installs only what is missing, so it
# needs root (or sudo) only the first time.
set -eu

case ${1:-} in
'') ;;
-h|--help)
	echo "Usage: tools/install-deps.sh"
	echo "Install the Debian 12 packages chime's build, tests, demo and benchmarks need"
	echo "(only the missing ones: as root, or through sudo). Exit status 0 once they are there."
	exit 0 ;;
*)
	echo "install-deps.sh: unexpected argument '$1' (it takes none; try --help)" >&2
	exit 2 ;;
esac

# The second line: the man-page test (groff, man), the Python module's tests,
# the libuv / libevent examples, and libjansson for chimestat's JSON.
pkgs="gcc libc6-dev meson ninja-build pkg-config python3 liburing-dev libcriterion-dev jq strace
groff-base man-db python3-pytest libuv1-dev libevent-dev libjansson-dev"
# clang-14 and its runtimes (libFuzzer, sanitizers): the build-fuzz build (tests/fuzz).
pkgs="$pkgs clang-14 libclang-rt-14-dev"
# libsystemd-dev: chimed's sd_notify (meson -Dsystemd=auto builds without it);
# systemd-container: systemd-nspawn, for the test that runs the installed unit
# under a real systemd (tests/test_systemd.sh).
pkgs="$pkgs libsystemd-dev systemd-container"
# libncurses-dev: chimestat's live view (ncursesw).
pkgs="$pkgs libncurses-dev"
# ccache: meson compiles through it when it is there (tools/run-tests.sh also
# hands it clang-14); its cache in $HOME outlives the fresh clones CI builds in.
pkgs="$pkgs ccache"
# Benchmark only (chime-bench compare builds without them, leaving the
# contender out): libev-dev, libev's ev_timer as a contender (libuv1-dev is
# above); gnuplot-nox, the lateness plot (tools/bench/plot-lateness.sh).
pkgs="$pkgs libev-dev gnuplot-nox"

missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
	sudo=""
elif command -v sudo >/dev/null 2>&1; then
	sudo="sudo"
else
	echo "install-deps.sh: need root to install:$missing" >&2
	exit 1
fi
echo "install-deps.sh: installing:$missing" >&2
$sudo apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
