#!/usr/bin/env bash
# tsan_broker.sh CHIMED CHIME_DEMO [CHIMECTL] - ThreadSanitizer over the whole
# data path: a TSan-built chimed (control thread + shard threads) serves a
# TSan-built chime-demo (several arming threads + a draining thread), while
# chimectl resets the statistics a few times (the control thread's reset
# generation against the shards' own counters, RS1/RS2), then stops on
# SIGTERM. Any race report, in either process, fails the test.
set -u
chimed=$1 demo=$2 ctl=${3:-}
dir=$(mktemp -d /tmp/chime-tsan-XXXXXX)
sock="$dir/chime.sock"
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1"
trap 'kill -KILL "$broker" 2>/dev/null; rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM HUP PIPE   # so that the EXIT trap stops the broker

"$chimed" --foreground --shards 2 --socket "$sock" 2>"$dir/chimed.log" &
broker=$!
for _ in $(seq 200); do
	[ -S "$sock" ] && break
	kill -0 "$broker" 2>/dev/null || break
	sleep 0.05
done
if [ ! -S "$sock" ]; then
	echo "tsan_broker: chimed did not start:"; cat "$dir/chimed.log"; exit 1
fi

if [ -n "$ctl" ]; then
	( for _ in 1 2 3 4; do sleep 0.4; "$ctl" --socket "$sock" reset-stats >>"$dir/ctl.log" 2>&1 || echo "reset-stats failed" >>"$dir/ctl.log"; done ) &
	resets=$!
fi
"$demo" --socket "$sock" --timers 20000 --threads 3 --seconds 2 --max-ms 50 >"$dir/demo.log" 2>&1
demo_rc=$?
if [ -n "$ctl" ]; then
	wait "$resets"
	if grep -q "failed" "$dir/ctl.log"; then
		echo "tsan_broker: chimectl reset-stats failed:"; cat "$dir/ctl.log"; demo_rc=1
	fi
fi
kill -TERM "$broker"
wait "$broker"
broker_rc=$?

if [ "$demo_rc" -ne 0 ] || [ "$broker_rc" -ne 0 ] || grep -q "ThreadSanitizer" "$dir/chimed.log" "$dir/demo.log"; then
	echo "tsan_broker: chime-demo exit $demo_rc, chimed exit $broker_rc"
	echo "--- chime-demo:"; cat "$dir/demo.log"
	echo "--- chimed:"; cat "$dir/chimed.log"
	exit 1
fi
echo "tsan_broker: no race reported (chime-demo and chimed both exit 0${ctl:+; $(grep -c 'statistics reset' "$dir/ctl.log") reset-stats applied})"
