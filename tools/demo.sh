#!/usr/bin/env bash
# demo.sh - install what is needed, build chime, start chimed on a private
# socket, run chime-demo against it (1M timers armed from 4 threads over 3 s,
# fires per second and lateness printed), then stop the broker.
#   tools/demo.sh [chime-demo options]     e.g. tools/demo.sh --timers 200000
set -euo pipefail
cd "$(dirname "$0")/.."

# Its own help first: anything else is chime-demo's, checked once it is built.
case ${1:-} in
-h|--help)
	cat <<'USAGE'
Usage: tools/demo.sh [CHIME-DEMO OPTION]...
Install what is needed, build chime, start chimed on a private socket, run
chime-demo against it (by default 1M timers armed from 4 threads over 3 s),
then stop the broker. The options are chime-demo's but --socket (see
chime-demo --help or man 1 chime-demo; e.g. --timers 200000).

Exit status: chime-demo's (0: every timer fired once and never early),
or 1 if the build or the broker failed.
USAGE
	exit 0 ;;
esac

tools/install-deps.sh
# Quietly, but meson and ninja print their errors on stdout: a failed step
# shows the end of its output, and where the rest is.
mkdir -p build
log=build/demo.sh.log
build_step() {
	if ! "$@" >"$log" 2>&1; then
		tail -n 40 "$log" >&2
		echo "demo.sh: the build failed: '$*' (its whole output is in $PWD/$log)" >&2
		exit 1
	fi
}
if [ ! -f build/build.ninja ]; then
	build_step meson setup build
fi
build_step ninja -C build
rm -f "$log"

# On a tmpfs, as a service's /run is on most hosts: elsewhere (an ext4 /tmp)
# the kernel writes the timers' segment files back to disk, and chimed says so.
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
	dir=$(mktemp -d -p /dev/shm chime-demo.XXXXXX)
else
	dir=$(mktemp -d)
fi
sock="$dir/chime.sock"
build/broker/chimed --foreground --socket "$sock" &
broker=$!
cleanup() {
	kill -TERM "$broker" 2>/dev/null && wait "$broker" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE   # so that the EXIT trap stops the broker

for _ in $(seq 100); do
	[ -S "$sock" ] && break
	kill -0 "$broker" 2>/dev/null || { echo "demo.sh: chimed exited during start-up" >&2; exit 1; }
	sleep 0.05
done
[ -S "$sock" ] || { echo "demo.sh: chimed did not create '$sock' within 5 s" >&2; exit 1; }

status=0
build/tools/chime-demo --socket "$sock" "$@" || status=$?
# The broker's word on the client's end before it is stopped (it frees the
# client a moment after the process exits): at most 2 s.
for _ in $(seq 40); do
	build/tools/chimectl --socket "$sock" clients --json 2>/dev/null | grep -q '"clients":\[\]' && break
	sleep 0.05
done
exit "$status"
