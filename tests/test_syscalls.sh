#!/bin/sh
# SPDX-License-Identifier: MIT
#
# nosyscall: DESIGN.md invariant 1 ("no syscall on the submission fast path
# when the other side is awake"), checked from outside. Start a real chimed on
# a private socket, run test_nosyscall (arm, reset and cancel TIMERS timers:
# 3 * TIMERS operations) under `strace -f -c`, and require the client's system
# calls in all (connecting and mapping included) to stay below 1% of its
# operations. On failure, strace's table and the broker's log are printed.
#
# Usage: test_syscalls.sh CHIMED TEST_NOSYSCALL [TIMERS]
# Exit: 0 pass, 1 fail, 77 skipped (no strace, or ptrace not permitted).
set -u

chimed=$1
client=$2
timers=${3:-200000}

if ! command -v strace >/dev/null 2>&1; then
	echo "nosyscall: strace not installed: skipped"
	exit 77
fi
if ! strace -f -qq -o /dev/null true >/dev/null 2>&1; then
	echo "nosyscall: strace cannot trace here (ptrace not permitted?): skipped"
	exit 77
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/chime-nosyscall-XXXXXX") || exit 1
sock=$dir/chime.sock
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE   # so that the EXIT trap stops the broker

# --spin-us 2000: strace stops the client for tens of microseconds at every
# system call it makes. With the default 50 us spin, each doorbell write lets
# the shard fall asleep again and so forces the next write: a loop strace
# itself creates (seen: 28k writes). The invariant is about a broker that is
# awake, so keep it awake across strace's stops. --sq-size 262144: a phase's
# 200k records fit in a ring, so that a shard starved of CPU by other work on
# the host is not waited for (a full ring's sched_yield() is the slow path,
# not this one: 6,592 of them failed a CI run at load average 5.8).
"$chimed" --foreground --spin-us 2000 --sq-size 262144 --subuid-file '' --socket "$sock" >"$dir/chimed.log" 2>&1 &
pid=$!
i=0
while [ ! -S "$sock" ] || [ ! -e "$sock.ctl" ]; do
	i=$((i + 1))
	if [ $i -gt 200 ] || ! kill -0 "$pid" 2>/dev/null; then
		echo "nosyscall: chimed did not start; its log:"
		cat "$dir/chimed.log"
		exit 1
	fi
	sleep 0.05
done

if ! strace -f -c -o "$dir/strace.txt" "$client" "$sock" "$timers" >"$dir/client.out" 2>&1; then
	echo "nosyscall: the client failed:"
	cat "$dir/client.out"
	echo "chimed's log:"
	cat "$dir/chimed.log"
	exit 1
fi
ops=$(awk '$1 == "ops" { print $2 }' "$dir/client.out")
# strace -c: "% time  seconds  usecs/call  calls  errors  syscall"; the calls
# column is the 4th field on every row, the "total" row included.
calls=$(awk '$NF == "total" { print $4 }' "$dir/strace.txt")
if [ -z "$ops" ] || [ -z "$calls" ]; then
	echo "nosyscall: could not read the counts; client said:"
	cat "$dir/client.out" "$dir/strace.txt"
	exit 1
fi
limit=$((ops / 100))
echo "nosyscall: $ops operations, $calls system calls in the client (limit $limit, 1%)"
if [ "$calls" -ge "$limit" ]; then
	echo "nosyscall: FAIL: too many system calls for $ops operations; strace -f -c of the client:"
	cat "$dir/strace.txt"
	echo "load average: $(cat /proc/loadavg)"
	exit 1
fi
exit 0
