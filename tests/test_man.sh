#!/bin/sh
# SPDX-License-Identifier: MIT
#
# man: every installed man page renders without a warning (groff -ww, and
# man -l when man-db is there); each libchime page has the sections an adopter
# looks for; every function chime.h declares has its page, listed in
# libchime(3); every chime page a page cites exists; no font macro line
# carries prose (groff renders its words run together, and says nothing);
# no list entry's tag misses its .TP (groff says nothing of that either).
#
# Usage: test_man.sh CHIME_H PAGE...
# Exit: 0 pass, 1 fail, 77 skipped (no groff).
set -u

header=$1
shift
if ! command -v groff >/dev/null 2>&1; then
	echo "man: groff not installed (tools/install-deps.sh installs groff-base): skipped"
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chime-man-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM HUP
status=0
fail() {
	echo "man: FAIL: $*"
	status=1
}

# The pages by their installed names: a .so link and a citation resolve there.
for p in "$@"; do
	ln -s "$p" "$tmp/$(basename "$p")"
done
has_page() { [ -e "$tmp/$1" ]; }

for p in "$@"; do
	name=$(basename "$p")
	first=$(head -n 1 "$p")
	case $first in
	.so\ *)
		has_page "$(basename "${first#.so }")" || fail "$name links to a missing page: $first"
		continue ;;
	esac
	groff -man -Tutf8 -ww -z "$p" >"$tmp/out" 2>&1 || fail "$name: groff failed"
	[ -s "$tmp/out" ] && { fail "$name: groff warns:"; cat "$tmp/out"; }
	if command -v man >/dev/null 2>&1; then
		MANWIDTH=80 man --warnings=w -l "$p" >/dev/null 2>"$tmp/out" || fail "$name: man -l failed"
		[ -s "$tmp/out" ] && { fail "$name: man -l warns:"; cat "$tmp/out"; }
	fi
	# .BR/.IR/.BI/... alternate fonts with no space between arguments: three
	# plain words in a row outside quotes are prose glued together
	# (".BR chime_flush (3). If the ring is full" renders "(3).Iftheringisfull").
	awk '/^\.(BR|BI|IR|IB|RB|RI)[ \t]/ {
		l = $0; gsub(/"[^"]*"/, " \" ", l); n = split(l, a, /[ \t]+/); run = 0
		for (i = 2; i <= n; i++) {
			run = a[i] ~ /^[A-Za-z]+[,.;:]?$/ ? run + 1 : 0
			if (run >= 3) { printf "%d: %s\n", FNR, $0; next }
		}
	}' "$p" >"$tmp/out"
	[ -s "$tmp/out" ] && { fail "$name: a font macro line carries prose (words run together):"; cat "$tmp/out"; }
	# A bold or italic line with no punctuation between a sentence's end and
	# a capital is a list entry's tag without its .TP: groff runs the entry
	# into the one before (chimed(8)'s "Who may do what" rendered so).
	awk '{ l[FNR] = $0 } END {
		for (i = 2; i < FNR; i++)
			if (l[i] ~ /^\.(B|BR|BI|I|IR|IB) / && l[i] !~ /[.,;:!?)]"?$/ &&
			    l[i - 1] ~ /^[^.\\].*[.;:)]$/ && l[i + 1] ~ /^[A-Z]/)
				printf "%d: %s\n", i, l[i]
	}' "$p" >"$tmp/out"
	[ -s "$tmp/out" ] && { fail "$name: a list entry's tag without .TP (runs into the entry before):"; cat "$tmp/out"; }
	case $name in
	chime_*.3)
		for s in NAME SYNOPSIS DESCRIPTION "RETURN VALUE" ERRORS "THREAD SAFETY" PROGRESS "SEE ALSO"; do
			grep -q "^\.SH $s\$" "$p" || fail "$name has no $s section"
		done ;;
	esac
	# Citations of our own pages: .BR chime_open (3), \fBchimed\fR(8), ...
	sed 's/\\f[BIRP]//g' "$p" | grep -o '\(chime[a-z_-]*\|libchime\) *([1-8])' |
		sed 's/^\([a-z_-]*\) *(\([1-8]\))$/\1.\2/' | sort -u | while read -r ref; do
			has_page "$ref" || echo "$name cites $ref, which is not installed"
		done >"$tmp/refs"
	[ -s "$tmp/refs" ] && { fail "dangling citations:"; cat "$tmp/refs"; }
done

# Every public function has a page, and libchime(3) lists it.
for f in $(grep -o '^[a-z].*\bchime_[a-z_]*(' "$header" | sed 's/.*\(chime_[a-z_]*\)($/\1/'); do
	has_page "$f.3" || fail "chime.h declares $f(), which has no page"
	grep -q "BR $f (3)" "$tmp/libchime.3" || fail "libchime(3) does not list $f(3)"
done
[ $status -eq 0 ] && echo "man: $# pages ok"
exit $status
