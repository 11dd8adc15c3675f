#!/bin/sh
# SPDX-License-Identifier: MIT
#
# build_deb: tools/build-deb.sh empties its --out directory before it
# builds there; a directory it did not make (a typo: --out shm, --out ~)
# holding anything is refused, untouched, before anything else is done.
# The build itself is tools/build-deb.sh --check's to run, not this test's.
#
# Usage: test_build_deb.sh BUILD_DEB_SH
# Exit: 0 pass, 1 fail.
set -u

script=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/chime-build-deb-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT INT TERM HUP

fail() {
	echo "build_deb: FAIL: $*"
	exit 1
}

mkdir "$dir/mine" || fail "cannot make $dir/mine"
echo precious >"$dir/mine/file"
out=$(bash "$script" --out "$dir/mine" 2>&1)
rc=$?
[ -f "$dir/mine/file" ] || fail "build-deb.sh --out DIR emptied a directory it did not make (exit $rc): $out"
[ "$rc" -eq 1 ] || fail "build-deb.sh --out DIR (a directory it did not make) exited $rc, not 1: $out"
echo "$out" | grep -q "refusing --out $dir/mine" || fail "build-deb.sh does not say why it refuses --out: $out"
echo "build_deb: --out a directory of someone else's is refused and left alone"

echo x >"$dir/afile"
out=$(bash "$script" --out "$dir/afile" 2>&1)
rc=$?
[ -f "$dir/afile" ] || fail "build-deb.sh --out FILE removed the file (exit $rc): $out"
[ "$rc" -eq 1 ] || fail "build-deb.sh --out FILE exited $rc, not 1: $out"
echo "build_deb: --out a file is refused and left alone"
echo "build_deb: ok"
