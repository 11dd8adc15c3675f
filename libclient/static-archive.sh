#!/bin/sh
# SPDX-License-Identifier: MIT
#
# libchime.a for static consumers: the library's and the shared-memory
# code's objects partially linked into one, with every symbol but the public
# API made local. An archive of the objects as they are would hand a
# consumer the internals' names (cl_dial, chime_sq_*, ...) to collide with;
# libchime.so hides them with its version script, which a static link does
# not read. The sources are built with hidden visibility and the API marked
# CHIME_PUBLIC, so --localize-hidden leaves exactly chime.h's functions.
#
# Usage: static-archive.sh OUTPUT plain|lto ARCHIVE... (the archives to
# merge). lto: their objects are GCC's LTO code, compiled now to machine
# code by the compiler driver in $CC (objcopy cannot read LTO code).
set -eu

out=$1
mode=$2
shift 2
tmp="$out.tmp.o"
trap 'rm -f "$tmp" "$tmp.2"' EXIT
if [ "$mode" = lto ]; then
	# shellcheck disable=SC2086 # $CC may be "ccache cc"
	${CC:-cc} -r -nostdlib -flto -flinker-output=nolto-rel -Wl,--whole-archive "$@" -Wl,--no-whole-archive \
		-o "$tmp"
else
	${LD:-ld} -r --whole-archive "$@" --no-whole-archive -o "$tmp"
fi
# chime_open: the current one by its plain name, no version (a versioned
# name has no version node to go to in a shared object the archive is
# linked into: a plugin, a language binding); the first version's goes.
${OBJCOPY:-objcopy} --localize-hidden -L chime_open_0_1 -L chime_open_0_3 --strip-symbol 'chime_open@CHIME_0.1' \
	--redefine-sym 'chime_open@@CHIME_0.3=chime_open' "$tmp" "$tmp.2"
rm -f "$out"
${AR:-ar} rcsD "$out" "$tmp.2"
