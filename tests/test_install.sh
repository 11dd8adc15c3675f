#!/bin/sh
# SPDX-License-Identifier: MIT
#
# install: what `meson install` gives a consumer. Install the build into a
# scratch DESTDIR; nothing lands outside the prefix (unless it is systemd's
# own, as a package's /usr is); with only its libchime.pc on the pkg-config path (no
# liburing.pc), --cflags names our include directory and nothing else (no
# leaked -D), --static --libs carries liburing, and a program using chime.h
# compiles, links and runs, with libchime.so and with libchime.a, and with
# the build tree's uninstalled libchime.pc; chime.h compiles on its own as
# C99, C11 and C++98/11/17 with -pedantic -Werror; every example in libclient/examples
# compiles on its own (-std=c11, no -D_GNU_SOURCE). The Python module lands in a
# directory on the sys.path of PYTHON (Debian's /usr/bin/python3), and imports from there.
#
# Usage: test_install.sh MESON BUILD_ROOT CC PYTHON [static|no-static]
# (no-static: the build makes no libchime.a, clang with LTO)
# Exit: 0 pass, 1 fail, 77 skipped (no pkg-config).
set -u

meson=$1
build=$2
cc=$3
python=${4:-}
static_lib=${5:-static}

if ! command -v pkg-config >/dev/null 2>&1; then
	echo "install: pkg-config not installed: skipped"
	exit 77
fi
dest=$(mktemp -d "${TMPDIR:-/tmp}/chime-install-XXXXXX") || exit 1
trap 'rm -rf "$dest"' EXIT INT TERM HUP

fail() {
	echo "install: FAIL: $*"
	exit 1
}

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$dest/install.log" 2>&1 ||
	{ cat "$dest/install.log"; fail "meson install --destdir failed"; }
# A prefix that is not systemd's own (the default /usr/local, a user's
# --prefix=$HOME/p) is never written outside of: the unit, sysusers.d and
# tmpfiles.d files go under it too (systemd/meson.build), not into /lib/systemd.
chimed=$(find "$dest" -path '*/sbin/chimed' | head -n 1)
[ -n "$chimed" ] || fail "no sbin/chimed installed under $dest"
prefix=$(dirname "$(dirname "${chimed#"$dest"}")")
if [ "$prefix" != "$(pkg-config --variable=prefix systemd 2>/dev/null)" ]; then
	outside=$(find "$dest" ! -type d ! -path "$dest$prefix/*" ! -path "$dest/install.log")
	[ -z "$outside" ] || fail "installed outside the prefix $prefix: $outside"
	for f in lib/systemd/system/chimed.service lib/sysusers.d/chime.conf lib/tmpfiles.d/chime.conf; do
		[ -f "$dest$prefix/$f" ] || fail "no $prefix/$f installed"
	done
	echo "install: everything under the prefix $prefix, the systemd files included"
fi
# Loadable at run time (dlopen: Python's ctypes, plugins), not only linked:
# a thread-local buffer of 4 KiB in the library (its TLS is initial-exec)
# left no room in glibc's static TLS reserve for a library loaded late.
so=$(find "$dest" -name 'libchime.so.*' -type f | head -n 1)
[ -n "$so" ] || fail "no libchime.so.* installed under $dest"
python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$so" 2>"$dest/dlopen.log" ||
	fail "dlopen('$so') failed: $(cat "$dest/dlopen.log")"
echo "install: $so loads with dlopen()"
pc=$(find "$dest" -name libchime.pc | head -n 1)
[ -n "$pc" ] || fail "no libchime.pc installed under $dest"
echo "install: $pc:"
cat "$pc"

PKG_CONFIG_LIBDIR=$(dirname "$pc")
PKG_CONFIG_PATH=
PKG_CONFIG_SYSROOT_DIR=$dest
export PKG_CONFIG_LIBDIR PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR

cflags=$(pkg-config --cflags libchime) || fail "pkg-config --cflags libchime failed without liburing's .pc"
libs=$(pkg-config --libs libchime) || fail "pkg-config --libs libchime failed"
static=$(pkg-config --static --libs libchime) || fail "pkg-config --static --libs libchime failed"
echo "install: --cflags: $cflags"
echo "install: --libs: $libs"
echo "install: --static --libs: $static"

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

# chime.h on its own, as strict consumers compile it: ISO C, and C++ from
# C++98 on (extern "C", nothing C-only such as an enum list's last comma),
# each with -pedantic -Werror. C++ where a C++ compiler is installed.
for std in c99 c11; do
	# shellcheck disable=SC2086
	echo '#include <chime.h>' | "$cc" -x c -std=$std -Wall -Wextra -pedantic -Werror $cflags -fsyntax-only - ||
		fail "chime.h does not compile on its own with -std=$std -pedantic -Werror"
done
cxx=$(command -v c++ || command -v g++ || command -v clang++ || true)
if [ -n "$cxx" ]; then
	for std in c++98 c++11 c++17; do
		# shellcheck disable=SC2086
		printf '#include <chime.h>\nint main() { return chime_fd(0) == 0; }\n' |
			"$cxx" -x c++ -std=$std -Wall -Wextra -pedantic -Werror $cflags -fsyntax-only - ||
			fail "chime.h does not compile as C++ with -std=$std -pedantic -Werror ($cxx)"
	done
	echo "install: chime.h compiles on its own as C99, C11, C++98, C++11 and C++17 (-pedantic -Werror)"
else
	echo "install: chime.h compiles on its own as C99 and C11; no C++ compiler: C++ not checked"
fi

# The examples are programs to copy (libchime-dev ships them): each compiles
# on its own with the installed chime.h under -std=c11, without the build's
# -D_GNU_SOURCE (getopt() and uv.h's pthread types need POSIX, which the
# example asks for itself). The event-loop ones need libuv's and libevent's
# headers: checked where their .pc is installed.
examples=$(cd "$(dirname "$0")/../libclient/examples" && pwd) || fail "no libclient/examples next to $0"
for ex in "$examples"/*.c; do
	name=$(basename "$ex" .c)
	extra=
	case $name in
	uv_timers) pcmod=libuv ;;
	event_timers) pcmod=libevent_core ;;
	*) pcmod= ;;
	esac
	if [ -n "$pcmod" ]; then
		extra=$(env -u PKG_CONFIG_LIBDIR -u PKG_CONFIG_SYSROOT_DIR pkg-config --cflags "$pcmod" 2>/dev/null) || {
			echo "install: example $name: $pcmod not installed: not checked"
			continue
		}
	fi
	# shellcheck disable=SC2086
	"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $cflags $extra "$ex" ||
		fail "the example $name.c does not compile on its own (-std=c11 with pkg-config's flags)"
done
echo "install: every example compiles on its own with the installed chime.h"

# The uninstalled libchime.pc, for building against this build tree: the
# source's chime.h and the built libchime.so, not ${libdir} under the build.
uninstalled=$build/meson-uninstalled
[ -f "$uninstalled/libchime-uninstalled.pc" ] || fail "no $uninstalled/libchime-uninstalled.pc"
ucflags=$(PKG_CONFIG_LIBDIR=$uninstalled PKG_CONFIG_SYSROOT_DIR='' pkg-config --cflags libchime) ||
	fail "pkg-config --cflags libchime failed with the uninstalled .pc"
ulibs=$(PKG_CONFIG_LIBDIR=$uninstalled PKG_CONFIG_SYSROOT_DIR='' pkg-config --libs libchime) ||
	fail "pkg-config --libs libchime failed with the uninstalled .pc"
echo "install: uninstalled --cflags: $ucflags"
echo "install: uninstalled --libs: $ulibs"
ulibdir=$(echo "$ulibs" | tr ' ' '\n' | sed -n 's/^-L//p' | head -n 1)
[ -f "$ulibdir/libchime.so" ] || fail "the uninstalled --libs '$ulibs' names no directory with libchime.so"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Werror $ucflags -o "$dest/consumer_uninstalled" "$dest/consumer.c" $ulibs ||
	fail "a consumer does not build with the uninstalled .pc's flags"
LD_LIBRARY_PATH=$ulibdir "$dest/consumer_uninstalled" ||
	fail "the consumer does not run against the build's libchime.so"

# The first ABI: a program built against the old header calls
# chime_open@CHIME_0.1 with a struct chime_opts that ends after flags. That
# version must not read past it (here: a bad session name would be EINVAL),
# and the default chime_open is @@CHIME_0.3.
cat >"$dest/old_abi.c" <<'SRC'
#include <chime.h>
#include <errno.h>
struct old_opts { const char *socket_path; unsigned flags; };
int chime_open_0_1(chime_t **out, const struct old_opts *opts);
__asm__(".symver chime_open_0_1, chime_open@CHIME_0.1");
int main(void)
{
	/* What follows the old struct in memory: not a session name. */
	struct { struct old_opts o; const char *after; } m = { { "/nonexistent/chime.sock", 0 }, "not a name!" };
	chime_t *c;

	return chime_open_0_1(&c, &m.o) != -ENOENT;
}
SRC
# shellcheck disable=SC2086
"$cc" -std=gnu11 -Wall -Werror $cflags -o "$dest/old_abi" "$dest/old_abi.c" $libs ||
	fail "a program calling chime_open@CHIME_0.1 does not build"
"$dest/old_abi" || fail "chime_open@CHIME_0.1 read beyond the old struct chime_opts"
if command -v objdump >/dev/null 2>&1; then
	syms=$(objdump -T "$LD_LIBRARY_PATH/libchime.so.0")
	echo "$syms" | grep -Eq 'CHIME_0\.3 +chime_open$' || fail "no default chime_open@@CHIME_0.3"
	echo "$syms" | grep -Eq '\(CHIME_0\.1\) +chime_open$' || fail "no chime_open@CHIME_0.1"
	# A new function, a new version node (libchime.map): a program linked
	# against it fails to load on an older libchime, by name, not at the call.
	echo "$syms" | grep -Eq 'CHIME_0\.5 +chime_drop_session$' || fail "no chime_drop_session@@CHIME_0.5"
	echo "$syms" | grep -Eq 'CHIME_0\.6 +chime_arm_realtime$' || fail "no chime_arm_realtime@@CHIME_0.6"
	# Exactly chime.h's functions, each with a version: none missing (a
	# forgotten line in libchime.map), none leaked (an internal function).
	# shellcheck disable=SC2086
	set -- $cflags
	api=$(grep -o 'chime_[a-z_]*(' "${1#-I}/chime.h" | tr -d '(' | sort -u)
	exported=$(echo "$syms" | awk '$2 == "g" && $4 != "*UND*" && $NF !~ /^CHIME_/ { print $NF }' | sort -u)
	if [ "$api" != "$exported" ]; then
		echo "$api" >"$dest/api.txt"
		echo "$exported" >"$dest/exported.txt"
		fail "libchime.so.0 does not export exactly chime.h's functions: missing: $(comm -23 "$dest/api.txt" "$dest/exported.txt" | tr '\n' ' '); not in chime.h: $(comm -13 "$dest/api.txt" "$dest/exported.txt" | tr '\n' ' ')"
	fi
	unversioned=$(echo "$syms" | awk '$2 == "g" && $4 != "*UND*" && $(NF - 1) !~ /CHIME_/ { print $NF }')
	[ -z "$unversioned" ] || fail "libchime.so.0 exports without a version: $unversioned"
	echo "install: libchime.so.0 exports chime.h's functions, each versioned, and nothing else"
fi

if [ "$static_lib" = static ]; then
	# The static library: chime.h's functions are its only global symbols
	# (libclient/static-archive.sh), and a program links with it alone, by
	# pkg-config --static, with no libchime.so in the way.
	archive=$LD_LIBRARY_PATH/libchime.a
	[ -f "$archive" ] || fail "no libchime.a installed next to libchime.so"
	if command -v nm >/dev/null 2>&1; then
		# shellcheck disable=SC2086
		set -- $cflags
		api=$(grep -o 'chime_[a-z_]*(' "${1#-I}/chime.h" | tr -d '(' | sort -u)
		for sym in $(nm -g --defined-only "$archive" | awk 'NF == 3 { sub(/@.*/, "", $3); print $3 }' | sort -u); do
			echo "$api" | grep -qx "$sym" || fail "libchime.a exports '$sym', which is not in chime.h"
		done
		echo "install: libchime.a exports chime.h's functions only"
	fi
	mkdir "$dest/static" && cp "$archive" "$dest/static/"
	# shellcheck disable=SC2086
	"$cc" -std=c11 -Wall -Werror $cflags -o "$dest/consumer_static" "$dest/consumer.c" \
		-L"$dest/static" -Wl,-Bstatic -lchime -Wl,-Bdynamic ${static#*-lchime} ||
		fail "a consumer does not link with libchime.a and pkg-config --static's flags"
	if command -v ldd >/dev/null 2>&1 && ldd "$dest/consumer_static" | grep -q libchime; then
		fail "the static consumer still needs libchime.so"
	fi
	LD_LIBRARY_PATH='' "$dest/consumer_static" || fail "the statically linked consumer does not run"
	echo "install: a program links libchime.a and runs"
	# And into a shared object (a plugin, a language binding): no symbol version
	# of ours in the archive, which would need a version node there.
	cat >"$dest/plugin.c" <<-'SRC'
	#include <chime.h>
	const char *plugin_version(void);
	const char *plugin_version(void)
	{
		return chime_version();
	}
	SRC
	# shellcheck disable=SC2086
	"$cc" -std=c11 -Wall -Werror -fPIC -shared $cflags -o "$dest/static/libplugin.so" "$dest/plugin.c" \
		"$dest/static/libchime.a" ${static#*-lchime} || fail "libchime.a does not link into a shared object"
	echo "install: a shared object links libchime.a"
else
	echo "install: this build makes no libchime.a (clang with LTO): not checked"
fi

if [ -n "$python" ]; then
	init=$(find "$dest" -path '*/chime/__init__.py' | head -n 1)
	[ -n "$init" ] || fail "the Python module chime is not installed"
	site=$(dirname "$(dirname "$init")")
	"$python" -c 'import sys; sys.exit(sys.argv[1] not in sys.path)' "${site#"$dest"}" ||
		fail "the Python module went to ${site#"$dest"}, which is not on $python's sys.path"
	PYTHONPATH=$site CHIME_LIBRARY=$LD_LIBRARY_PATH/libchime.so.0 PYTHONDONTWRITEBYTECODE=1 \
		"$python" -c 'import chime, chime.aio; print("install: python: chime", chime.version())' ||
		fail "the installed Python module does not import"
fi
echo "install: ok"
