#!/usr/bin/env bash
# tsan_suites.sh CHIMED_TSAN TEST_PROGRAM... - run criterion test programs
# (plain builds) against a chimed built with ThreadSanitizer. A program's own
# failure fails this test, and so does any race report from any broker it
# started (each writes its reports to a file of its own here). Exit 0: every
# program passed and no broker reported anything.
set -u
chimed=$1; shift
dir=$(mktemp -d /tmp/chime-tsan-suites-XXXXXX)
trap 'rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM HUP PIPE   # so that the EXIT trap runs
export CHIMED=$chimed
# for the tests whose bound is the broker's speed (a TSan broker is 5-10 times slower)
export CHIME_BROKER_TSAN=1
export TSAN_OPTIONS="log_path=$dir/race halt_on_error=0 second_deadlock_stack=1"
rc=0
for t in "$@"; do
	name=$(basename "$t")
	if ! "$t" --jobs=2 >"$dir/$name.log" 2>&1; then
		echo "tsan_suites: $name failed against a TSan chimed:"
		grep -E '^\[(FAIL|----)\]|Synthesis' "$dir/$name.log" | head -60
		rc=1
	else
		echo "tsan_suites: $name: $(grep -E 'Synthesis' "$dir/$name.log")"
	fi
done
if compgen -G "$dir/race.*" >/dev/null; then
	echo "tsan_suites: ThreadSanitizer reported in chimed:"
	cat "$dir"/race.*
	rc=1
fi
[ "$rc" = 0 ] && echo "tsan_suites: no race reported by any broker of $# programs"
exit "$rc"
