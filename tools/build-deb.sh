#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# build-deb.sh - build chime's Debian packages from this source tree (debian/),
# out of tree, and run lintian on them; with --check, also install them, run a
# smoke test against a private chimed, and purge them again.
#
# Meant for root on a Debian 12 machine (a fresh one is fine): it installs what
# the build needs with apt-get. See README.md, "Debian packages".
set -euo pipefail

prog=build-deb.sh
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build-deb
check=0
jobs=2

usage() {
	cat <<EOF
Usage: tools/$prog [--check] [--out DIR] [--jobs N]
Build chime's Debian packages (dpkg-buildpackage -us -uc -b) from a copy of
this source tree in DIR, and run lintian on them.

  --check      then install the packages (apt-get install ./*.deb), run a smoke
               test against a private chimed (no systemd needed), and purge
               them again; fails if anything is left behind. Then, where
               systemd-nspawn is installed, in a container booted with
               systemd: install chimed (the unit starts), upgrade it under a
               session's timers (none lost), remove and reinstall it (the
               session kept), and purge it (/run/chime emptied)
  --out DIR    where to build and leave the .debs (default: build-deb/ at the
               top of the source tree; emptied first: a DIR that holds
               files this script did not put there is refused)
  --jobs N     parallel build jobs (default 2)
  -h, --help   show this help

As root, it first installs what is missing of: the build dependencies in
debian/control (apt-get build-dep), dpkg-dev, build-essential and lintian.
Without root, those must be there already (--check needs root anyway).

Exit status: 0 if the packages built, lintian found no error or warning
other than the maintainer address chime@localhost (bogus-mail-host, which
the .changes file and the -dbgsym packages cannot override) and, with
--check, the smoke test passed, the machine was left as before, and the
maintainer scripts did under systemd what is said above (where
systemd-nspawn is installed); 1 otherwise; 2 on a usage error.
EOF
}

while [ $# -gt 0 ]; do
	case $1 in
	--check) check=1 ;;
	--out) [ $# -ge 2 ] || { echo "$prog: --out needs a directory" >&2; exit 2; }
		out=$2; shift ;;
	--out=*) out=${1#--out=} ;;
	--jobs) [ $# -ge 2 ] || { echo "$prog: --jobs needs a number" >&2; exit 2; }
		jobs=$2; shift ;;
	--jobs=*) jobs=${1#--jobs=} ;;
	-h|--help) usage; exit 0 ;;
	*) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done
case $jobs in ''|*[!0-9]*|0) echo "$prog: --jobs wants a positive number, not '$jobs'" >&2; exit 2 ;; esac

say() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { printf '%s: FAIL: %s\n' "$prog" "$*" >&2; exit 1; }

# --out is emptied before the build: only a directory this script made
# (its mark inside), the default build-deb/, or one empty or absent. Checked
# first, before anything is installed or built.
case $out in /*) ;; *) out=$PWD/$out ;; esac
mark=.chime-build-deb
case $root/ in "${out%/}"/*) die "refusing --out $out: it would empty the source tree" ;; esac
[ ! -e "$out" ] || [ -d "$out" ] || die "refusing --out $out: not a directory"
if [ -d "$out" ] && [ "$out" != "$root/build-deb" ] && [ ! -f "$out/$mark" ] && [ -n "$(ls -A "$out")" ]; then
	die "refusing --out $out: it holds files that build-deb.sh did not put there, and would be emptied (give a new or empty directory)"
fi

start=$(date +%s)
is_root=0
[ "$(id -u)" -eq 0 ] && is_root=1
[ "$check" -eq 0 ] || [ "$is_root" -eq 1 ] || die "--check installs packages: run it as root"
[ -f "$root/debian/control" ] || die "no debian/control under $root"

# --- build dependencies ------------------------------------------------------
# debian/control is the one list of what the build needs: apt-get build-dep
# reads it. (tools/install-deps.sh installs the developer's set instead:
# criterion, clang and the fuzzing runtimes, gnuplot, ... which the package
# build does not use; the libraries both need are the same packages.)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
need_apt=0
for p in dpkg-dev build-essential lintian; do
	installed "$p" || need_apt=1
done
if [ "$need_apt" -eq 0 ]; then
	(cd "$root" && dpkg-checkbuilddeps >/dev/null 2>&1) || need_apt=1
fi
if [ "$need_apt" -eq 1 ]; then
	[ "$is_root" -eq 1 ] || die "build dependencies missing (cd $root && dpkg-checkbuilddeps says which); run as root to install them"
	say "installing the build dependencies (apt-get update, build-dep ./, dpkg-dev build-essential lintian)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || die "apt-get update failed"
	apt-get install -y -qq --no-install-recommends dpkg-dev build-essential lintian >/dev/null ||
		die "apt-get install dpkg-dev build-essential lintian failed"
	apt-get build-dep -y -qq --no-install-recommends "$root" >/dev/null ||
		die "apt-get build-dep $root failed"
	(cd "$root" && dpkg-checkbuilddeps) || die "build dependencies still unmet after apt-get build-dep"
fi

# --- version: debian/changelog must say what meson.build says ---------------
version=$(cd "$root" && dpkg-parsechangelog -SVersion)
meson_version=$(sed -n "s/^ *version: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -n 1)
[ "$version" = "$meson_version" ] ||
	die "debian/changelog has version '$version' but meson.build's project() has '$meson_version': add a changelog entry (dch -v $meson_version)"
arch=$(dpkg --print-architecture)

# --- build, out of tree ------------------------------------------------------
# A copy of the tree as git sees it (tracked files with their changes, plus
# untracked ones not ignored: no build directories), or all of it without git.
rm -rf "$out"
src=$out/chime-$version
mkdir -p "$src"
touch "$out/$mark"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$root" && git ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do
			# a tracked file deleted in the work tree is left out
			if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
		done |
		tar --null -T - -cf -) | tar -xf - -C "$src"
else
	(cd "$root" && tar --exclude=./.git --exclude='./build*' --exclude='./obj-*' --exclude=./debian/tmp -cf - .) |
		tar -xf - -C "$src"
fi
say "building chime $version in $out (dpkg-buildpackage -us -uc -b, $jobs jobs; log: $out/build.log)"
opts=${DEB_BUILD_OPTIONS:-}
case " $opts " in *" parallel="*) ;; *) opts="$opts parallel=$jobs" ;; esac
if ! (cd "$src" && DEB_BUILD_OPTIONS="${opts# }" dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1; then
	tail -n 40 "$out/build.log" >&2
	die "dpkg-buildpackage failed (the whole log: $out/build.log)"
fi
changes=$out/chime_${version}_${arch}.changes
[ -f "$changes" ] || die "no $changes after the build"
debs=()
for p in chimed libchime0 libchime-dev chime-bench; do
	debs+=("$out/${p}_${version}_${arch}.deb")
done
debs+=("$out/python3-chime_${version}_all.deb")
for d in "${debs[@]}"; do
	[ -f "$d" ] || die "the build made no $(basename "$d")"
done
say "built in $out:"
(cd "$out" && ls -1 ./*.deb) >&2

# --- lintian -----------------------------------------------------------------
# On the .changes: every package, the -dbgsym ones included. The maintainer
# address chime@localhost (the project's choice) is an error to lintian
# (bogus-mail-host): the packages carry overrides for it, with the reason,
# but the .changes file and the automatic -dbgsym packages cannot, so those
# lines are shown and counted apart, and only they are allowed.
say "lintian -I --pedantic $(basename "$changes") (as root lintian warns that it runs as root)"
lintian_rc=0
lintian -I --pedantic "$changes" >"$out/lintian.txt" 2>"$out/lintian.err" || lintian_rc=$?
cat "$out/lintian.txt"
grep -v 'running with root privileges is not recommended' "$out/lintian.err" >&2 || true
# lintian exits 2 when it reports an error (--fail-on error, its default), 1
# when it cannot run; the errors are judged below.
[ "$lintian_rc" -ne 1 ] || die "lintian could not run (exit 1; $out/lintian.err)"
count() { grep -cE "$1" "$out/lintian.txt" || true; }
maint_re='^E: [a-z0-9-]+( changes|-dbgsym): bogus-mail-host'
known=$(count "$maint_re")
errors=$(( $(count '^E: ') - known ))
warnings=$(count '^W: ')
say "lintian summary: $errors error(s), $warnings warning(s), $(count '^I: ') info, $(count '^P: ') pedantic, $known error(s) for the maintainer address in the .changes and -dbgsym packages (no override possible there)"
if [ "$errors" -ne 0 ] || [ "$warnings" -ne 0 ]; then
	die "lintian reported errors or warnings beyond the maintainer address (above; $out/lintian.txt)"
fi

if [ "$check" -eq 0 ]; then
	say "done in $(( $(date +%s) - start )) s: the packages are in $out"
	exit 0
fi

# --- --check: install, smoke test, purge ---------------------------------------
pkgs=(chimed libchime0 libchime-dev python3-chime chime-bench)
for p in "${pkgs[@]}"; do
	! installed "$p" || die "$p is installed already: --check would purge it at the end; remove it first (apt-get purge ${pkgs[*]})"
done
# What the install may change, to put it back afterwards: the packages, the
# chime user and group (systemd-sysusers in chimed's postinst makes them; a
# Debian package never removes a system user), /run/chime (systemd-tmpfiles).
before_pkgs=$(mktemp)
dpkg-query -W -f='${Package}:${Architecture} ${db:Status-Abbrev}\n' | sort >"$before_pkgs"
had_user=0; getent passwd chime >/dev/null && had_user=1
had_group=0; getent group chime >/dev/null && had_group=1
rundir_state=$(stat -c '%u:%g %a' /run/chime 2>/dev/null || echo absent)
tmp=$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )/chime-check.XXXXXX")
chimed_pid=
cleaned=0

restore() {
	[ "$cleaned" -eq 0 ] || return 0
	cleaned=1
	local ok=1
	if [ -n "$chimed_pid" ] && kill -0 "$chimed_pid" 2>/dev/null; then
		kill "$chimed_pid" 2>/dev/null || true
		wait "$chimed_pid" 2>/dev/null || true
	fi
	# Every package the install added (the five and anything apt pulled in).
	local now added
	now=$(mktemp)
	dpkg-query -W -f='${Package}:${Architecture} ${db:Status-Abbrev}\n' | sort >"$now"
	added=$(comm -13 <(awk '$2 ~ /^ii/ {print $1}' "$before_pkgs") <(awk '$2 !~ /^(un|pn)/ {print $1}' "$now") | tr '\n' ' ')
	if [ -n "${added// /}" ]; then
		say "purging: $added"
		# shellcheck disable=SC2086 # one word per package
		DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $added >"$tmp.purge.log" 2>&1 ||
			{ cat "$tmp.purge.log" >&2; say "apt-get purge failed"; ok=0; }
	fi
	if [ "$had_user" -eq 0 ] && getent passwd chime >/dev/null; then
		userdel chime || { say "userdel chime failed"; ok=0; }
	fi
	if [ "$had_group" -eq 0 ] && getent group chime >/dev/null; then
		groupdel chime || { say "groupdel chime failed"; ok=0; }
	fi
	if [ "$rundir_state" = absent ]; then
		[ ! -d /run/chime ] || rmdir /run/chime || { say "/run/chime is not empty: left in place"; ok=0; }
	elif [ -d /run/chime ]; then
		if ! chown "${rundir_state% *}" /run/chime || ! chmod "${rundir_state#* }" /run/chime; then
			say "could not restore /run/chime to $rundir_state"; ok=0
		fi
	fi
	dpkg-query -W -f='${Package}:${Architecture} ${db:Status-Abbrev}\n' | sort >"$now"
	if ! diff -u "$before_pkgs" "$now" >"$tmp.pkgdiff"; then
		cat "$tmp.pkgdiff" >&2
		say "the installed packages differ from before --check"; ok=0
	fi
	[ "$(stat -c '%u:%g %a' /run/chime 2>/dev/null || echo absent)" = "$rundir_state" ] ||
		{ say "/run/chime is not as before ($rundir_state)"; ok=0; }
	rm -f "$now" "$before_pkgs" "$tmp.purge.log" "$tmp.pkgdiff"
	rm -rf "$tmp"
	[ "$ok" -eq 1 ]
}
on_exit() {
	local rc=$?
	if ! restore; then
		say "FAIL: the machine is not as it was before --check (above)"
		rc=1
	fi
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 1' INT TERM HUP

say "installing: ${pkgs[*]} (apt-get install ./*.deb; log: $out/install.log)"
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${debs[@]}" >"$out/install.log" 2>&1 ||
	{ tail -n 30 "$out/install.log" >&2; die "apt-get install of the packages failed"; }

# What the maintainer scripts did (dh_installsysusers, dh_installtmpfiles,
# dh_installsystemd); systemd itself is not PID 1 here, so nothing starts.
getent passwd chime >/dev/null || die "chimed's postinst did not create the chime user (systemd-sysusers)"
[ "$(stat -c %U /run/chime 2>/dev/null)" = chime ] || die "/run/chime is not there owned by chime (systemd-tmpfiles)"
# (deb-systemd-helper answers only to maintainer scripts: look at its symlink.)
[ -L /etc/systemd/system/multi-user.target.wants/chimed.service ] ||
	die "chimed.service is not enabled after the install (no multi-user.target.wants/chimed.service)"
for f in /usr/sbin/chimed /lib/systemd/system/chimed.service /usr/lib/sysusers.d/chime.conf \
	/usr/lib/tmpfiles.d/chime.conf /usr/include/chime.h /usr/share/man/man3/chime_arm.3.gz; do
	[ -e "$f" ] || die "$f is not installed"
done
grep -q '^ExecStart=/usr/sbin/chimed ' /lib/systemd/system/chimed.service ||
	die "chimed.service does not start /usr/sbin/chimed"
say "installed: chime user, /run/chime (owner chime), chimed.service enabled"

sock=$tmp/s
say "smoke test: chimed --foreground --socket $sock (its log: $tmp/chimed.log)"
chimed --foreground --socket "$sock" 2>"$tmp/chimed.log" &
chimed_pid=$!
for _ in $(seq 100); do
	[ -S "$sock" ] && break
	kill -0 "$chimed_pid" 2>/dev/null || { cat "$tmp/chimed.log" >&2; die "chimed exited at start-up"; }
	sleep 0.1
done
[ -S "$sock" ] || { cat "$tmp/chimed.log" >&2; die "chimed did not listen on $sock within 10 s"; }

chime-demo --socket "$sock" -n 10000 || die "chime-demo --socket $sock -n 10000 failed"
chimectl --socket "$sock" status || die "chimectl --socket $sock status failed"
chimestat --socket "$sock" -1 >"$tmp/chimestat.txt" || die "chimestat --socket $sock -1 failed"
grep -q "^chimed pid $chimed_pid " "$tmp/chimestat.txt" || { cat "$tmp/chimestat.txt" >&2; die "chimestat -1 does not show this chimed"; }
say "chimestat -1: $(head -n 1 "$tmp/chimestat.txt")"
chime-bench --version || die "chime-bench --version failed"

cat >"$tmp/smoke.c" <<'SRC'
#include <chime.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	struct chime_opts o = { .socket_path = argc > 1 ? argv[1] : NULL };
	struct chime_event ev;
	chime_id_t id;
	chime_t *c;
	int r = chime_open(&c, &o);
	if (r < 0) {
		fprintf(stderr, "chime_open: %s\n", strerror(-r));
		return 1;
	}
	unsigned long long deadline = chime_now() + 2000000;    /* 2 ms */
	r = chime_arm(c, 1, deadline, 0, 42, &id);
	if (r < 0) {
		fprintf(stderr, "chime_arm: %s\n", strerror(-r));
		return 1;
	}
	r = chime_wait(c, &ev, 1, 5000);
	if (r != 1 || ev.id != id || ev.user_data != 42 || ev.fired_ns < deadline) {
		fprintf(stderr, "chime_wait: %d, not the timer armed (or early)\n", r);
		return 1;
	}
	printf("%s: libchime %s: the timer fired %.1f us after its deadline\n",
	       argv[0], chime_version(), (double)(ev.fired_ns - deadline) / 1e3);
	chime_close(c);
	return 0;
}
SRC
cflags=$(pkg-config --cflags libchime) || die "pkg-config --cflags libchime failed"
libs=$(pkg-config --libs libchime) || die "pkg-config --libs libchime failed"
say "cc smoke.c \$(pkg-config --cflags --libs libchime) (cflags '$cflags', libs '$libs')"
# shellcheck disable=SC2086 # pkg-config's flags are meant to split
cc -std=c11 -Wall -Werror $cflags -o "$tmp/smoke" "$tmp/smoke.c" $libs || die "a program does not build with pkg-config's flags"
"$tmp/smoke" "$sock" || die "the program built against libchime-dev failed against the broker"
# libchime.a too, with what pkg-config --static adds (liburing: libchime-dev depends on liburing-dev for it).
static_libs=$(pkg-config --static --libs-only-l --libs-only-other libchime) || die "pkg-config --static failed"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror $cflags -o "$tmp/smoke-static" "$tmp/smoke.c" \
	-Wl,-Bstatic -lchime -Wl,-Bdynamic ${static_libs//-lchime/} || die "a program does not link libchime.a"
! ldd "$tmp/smoke-static" | grep -q libchime || die "smoke-static still loads libchime.so"
"$tmp/smoke-static" "$sock" || die "the program linked with libchime.a failed against the broker"

# Debian's python3, which python3-chime is for: a pyenv or virtualenv python3
# earlier in $PATH does not look in /usr/lib/python3/dist-packages.
py=/usr/bin/python3
"$py" -c 'import chime' || die "$py -c 'import chime' failed"
"$py" - "$sock" <<'PY' || die "python3-chime could not arm and take a timer"
import sys
import chime

with chime.Chime(socket=sys.argv[1]) as c:
    tid = c.arm(key=1, after=0.002, data=7)
    evs = c.wait(timeout=5.0)
    assert len(evs) == 1 and evs[0].id == tid and evs[0].data == 7, evs
    assert evs[0].fired_ns >= evs[0].deadline_ns, evs
print(f"python3-chime: chime {chime.version()}: the timer fired "
      f"{(evs[0].fired_ns - evs[0].deadline_ns) / 1e3:.1f} us after its deadline")
PY

kill "$chimed_pid"
chimed_rc=0
wait "$chimed_pid" || chimed_rc=$?
chimed_pid=
[ "$chimed_rc" -eq 0 ] || { cat "$tmp/chimed.log" >&2; die "chimed exited $chimed_rc on SIGTERM"; }
say "smoke test passed (chimed stopped cleanly on SIGTERM)"

trap - EXIT
restore || die "the machine is not as it was before --check (above)"
say "purged; the machine's packages, chime user and /run/chime are as before"

# --- --check under systemd: what the maintainer scripts do to the service ----
# Here systemd is not PID 1, so the install above started nothing. In a
# container booted with systemd (systemd-nspawn, as tests/test_systemd.sh:
# this host's /usr under a writable overlay, a copy of its dpkg database),
# dpkg runs chimed's maintainer scripts for real: the install starts the
# unit; an upgrade (dpkg -i again: postinst configure with the old version,
# which restarts the unit) keeps a session's timers, every one firing, none
# early; a remove stops the broker and keeps its files, and a reinstall takes
# the session over; a purge leaves no file in /run/chime.
if ! command -v systemd-nspawn >/dev/null 2>&1 || ! command -v nsenter >/dev/null 2>&1; then
	say "no systemd-nspawn (Debian: systemd-container) or nsenter: the maintainer scripts under systemd not checked"
	say "done in $(( $(date +%s) - start )) s: the packages are in $out"
	exit 0
fi
ctdir=$(mktemp -d "${TMPDIR:-/tmp}/chime-deb-ct.XXXXXX")
ctroot=$ctdir/root
nspawn=
ctinit=
ct() { nsenter -t "$ctinit" -a "$@"; }
ct_cleanup() {
	if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
		kill -TERM "$nspawn" 2>/dev/null || true     # nspawn halts the container
		for _ in $(seq 100); do
			kill -0 "$nspawn" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$nspawn" 2>/dev/null || true
		wait "$nspawn" 2>/dev/null || true
	fi
	rm -rf "$ctdir"
}
ct_fail() {
	[ -z "$ctinit" ] || ct journalctl -u chimed --no-pager -n 30 2>/dev/null | sed 's/^/  journal: /' >&2
	die "$*"
}
trap ct_cleanup EXIT
mkdir -p "$ctroot"/etc "$ctroot"/usr "$ctroot"/var/lib "$ctroot"/run "$ctroot"/tmp "$ctroot"/root \
	"$ctroot"/dev "$ctroot"/proc "$ctroot"/sys "$ctroot"/debs "$ctdir/upper"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$ctroot/$d"; done
cp /etc/os-release "$ctroot/etc/" 2>/dev/null || cp /usr/lib/os-release "$ctroot/etc/"
cp /etc/passwd /etc/group "$ctroot/etc/"
cp -a /etc/dpkg "$ctroot/etc/"
cp -a /var/lib/dpkg "$ctroot/var/lib/"
cp "${debs[@]}" "$ctroot/debs/"
echo "chimedeb$$" >"$ctroot/etc/hostname"
say "under systemd: a container (systemd-nspawn) over this host's /usr; dpkg installs, upgrades, removes and purges chimed there"
systemd-nspawn -q -D "$ctroot" --overlay="/usr:$ctdir/upper:/usr" --register=no --keep-unit \
	-b -M "chimedeb$$" --console=pipe >"$ctdir/boot.log" 2>&1 </dev/null &
nspawn=$!
state=
for _ in $(seq 300); do
	ctinit=$(pgrep -P "$nspawn" | head -n 1 || true)
	# Only the container's own systemd, in a pid namespace of its own.
	if [ -n "$ctinit" ] && [ "$(cat "/proc/$ctinit/comm" 2>/dev/null)" = systemd ] &&
		[ "$(readlink "/proc/$ctinit/ns/pid")" != "$(readlink /proc/self/ns/pid)" ]; then
		state=$(ct timeout 90 systemctl is-system-running --wait 2>/dev/null || true)
		case $state in running | degraded) break ;; esac
	fi
	kill -0 "$nspawn" 2>/dev/null || break
	sleep 0.2
done
case $state in
running | degraded) ;;
*)
	# As tests/test_systemd.sh skips: a host that cannot boot a container (a container itself).
	cat "$ctdir/boot.log" >&2
	ctinit=
	trap - EXIT
	ct_cleanup
	say "the container's systemd did not boot (state '$state'): the maintainer scripts under systemd not checked"
	say "done in $(( $(date +%s) - start )) s: the packages are in $out"
	exit 0
	;;
esac
# A policy-rc.d that forbids starting services (Docker's) would keep the postinst from starting chimed.
ct rm -f /usr/sbin/policy-rc.d
cdpkg() { ct env DEBIAN_FRONTEND=noninteractive dpkg "$@" >>"$ctdir/dpkg.log" 2>&1 || { cat "$ctdir/dpkg.log" >&2; ct_fail "dpkg $* in the container failed"; }; }
active() { ct systemctl is-active chimed 2>/dev/null || true; }
as_nobody() { ct setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
deb() { echo "/debs/$(basename "$1")"; }

cdpkg -i "$(deb "${debs[1]}")" "$(deb "${debs[0]}")"
[ "$(active)" = active ] || ct_fail "chimed.service is '$(active)' after the install, not active"
say "under systemd: the install started chimed.service"

# The upgrade, under another user's session: its 20000 timers armed over 1 s, due within 3 s.
as_nobody chime-demo -S upgrade -n 20000 -t 1 -d 1 -m 3000 >"$ctdir/demo.log" 2>&1 &
demo=$!
sleep 1.5
cdpkg -i "$(deb "${debs[0]}")"
wait "$demo" || ct_fail "chime-demo across the upgrade: $(cat "$ctdir/demo.log")"
grep -q "20000 of 20000 timers fired, 0 early" "$ctdir/demo.log" || ct_fail "across the upgrade: $(cat "$ctdir/demo.log")"
ct journalctl -u chimed --no-pager -o cat | grep -q "taking over 1 session" ||
	ct_fail "the broker the upgrade started did not take the session over"
[ "$(active)" = active ] || ct_fail "chimed.service is '$(active)' after the upgrade"
say "under systemd: the upgrade restarted chimed, and a session's 20000 timers all fired across it"

# A session left with timers (its process killed), then remove and reinstall.
ct sh -c 'echo $$ >/run/kept.pid; exec setpriv --reuid=65534 --regid=65534 --clear-groups chime-demo -S kept -n 1000 -t 1 -d 1 -m 60000' >/dev/null 2>&1 &
demo=$!
sleep 2
ct kill -KILL "$(ct cat /run/kept.pid)" || ct_fail "could not kill the session's chime-demo"
wait "$demo" 2>/dev/null || true
ct chimectl sessions | grep -q '^kept .* detached' || ct_fail "no detached session 'kept': $(ct chimectl sessions 2>&1)"
cdpkg -r chimed
[ "$(active)" != active ] || ct_fail "chimed.service still runs after dpkg -r chimed"
ct test -f /run/chime/chime.sock.sessions || ct_fail "dpkg -r chimed removed the sessions file"
cdpkg -i "$(deb "${debs[0]}")"
ct chimectl sessions | grep -q '^kept .* detached' ||
	ct_fail "the reinstall did not take the session over: $(ct chimectl sessions 2>&1)"
say "under systemd: remove stopped chimed and kept its files, the reinstall took the session over"

cdpkg --purge chimed
left=$(ct find /run/chime -mindepth 1)
[ -z "$left" ] || ct_fail "after the purge, /run/chime still holds: $left"
! ct test -e /etc/systemd/system/multi-user.target.wants/chimed.service || ct_fail "the purge left chimed.service enabled"
say "under systemd: the purge left /run/chime empty (the directory and the chime user stay)"
trap - EXIT
ct_cleanup
say "done in $(( $(date +%s) - start )) s: the packages are in $out"
