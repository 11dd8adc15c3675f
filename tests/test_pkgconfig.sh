#!/bin/sh
# SPDX-License-Identifier: MIT
#
# pkgconfig: libchime.pc as a consumer sees it after `meson install`. Install
# the build into a scratch DESTDIR and, with only that directory on the
# pkg-config path (no ck.pc, no liburing.pc), require that --cflags names our
# include directory and nothing else (no leaked -D), that --static --libs
# carries liburing, and that a program using chime.h compiles and links.
#
# Usage: test_pkgconfig.sh MESON BUILD_ROOT CC
# Exit: 0 pass, 1 fail, 77 skipped (no pkg-config).
set -u

meson=$1
build=$2
cc=$3

if ! command -v pkg-config >/dev/null 2>&1; then
	echo "pkgconfig: pkg-config not installed: skipped"
	exit 77
fi
dest=$(mktemp -d "${TMPDIR:-/tmp}/chime-pkgconfig-XXXXXX") || exit 1
trap 'rm -rf "$dest"' EXIT INT TERM HUP

fail() {
	echo "pkgconfig: FAIL: $*"
	exit 1
}

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$dest/install.log" 2>&1 ||
	{ cat "$dest/install.log"; fail "meson install --destdir failed"; }
pc=$(find "$dest" -name libchime.pc | head -n 1)
[ -n "$pc" ] || fail "no libchime.pc installed under $dest"
echo "pkgconfig: $pc:"
cat "$pc"

PKG_CONFIG_LIBDIR=$(dirname "$pc")
PKG_CONFIG_PATH=
PKG_CONFIG_SYSROOT_DIR=$dest
export PKG_CONFIG_LIBDIR PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR

cflags=$(pkg-config --cflags libchime) || fail "pkg-config --cflags libchime failed without ck's and liburing's .pc"
libs=$(pkg-config --libs libchime) || fail "pkg-config --libs libchime failed"
static=$(pkg-config --static --libs libchime) || fail "pkg-config --static --libs libchime failed"
echo "pkgconfig: --cflags: $cflags"
echo "pkgconfig: --libs: $libs"
echo "pkgconfig: --static --libs: $static"

for f in $cflags; do
	case $f in
	-I*) ;;
	*) fail "--cflags has '$f' (only -I of our include directory belongs there)" ;;
	esac
done
# shellcheck disable=SC2086
set -- $cflags
[ $# -eq 1 ] && [ -f "${1#-I}/chime.h" ] || fail "--cflags '$cflags' does not name the directory of chime.h"
case " $libs " in *" -lchime "*) ;; *) fail "--libs lacks -lchime" ;; esac
case " $static " in *" -luring "*) ;; *) fail "--static --libs lacks -luring" ;; esac

cat >"$dest/consumer.c" <<'SRC'
#include <chime.h>
#include <string.h>
int main(void)
{
	return strcmp(chime_version(), "") == 0;
}
SRC
# shellcheck disable=SC2086 # pkg-config's flags are meant to split
"$cc" -std=c11 -Wall -Werror $cflags -o "$dest/consumer" "$dest/consumer.c" $libs ||
	fail "a consumer does not build with pkg-config's flags"
# shellcheck disable=SC2086
set -- $libs
LD_LIBRARY_PATH=${1#-L}
export LD_LIBRARY_PATH
"$dest/consumer" || fail "the consumer does not run against the installed libchime.so"
echo "pkgconfig: ok"
