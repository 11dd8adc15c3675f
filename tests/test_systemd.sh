#!/bin/bash
# SPDX-License-Identifier: MIT
#
# systemd: the installed chimed.service under a real systemd. The build is
# installed into a scratch DESTDIR, laid over this host's /usr in a
# container (systemd-nspawn: a root of its own on a tmpfs-like scratch
# directory, the host's /usr read-only with the install on top), and the
# container boots systemd. Then, as an operator would:
#
#   - systemctl start: the unit's user (sysusers.d), its runtime directory,
#     its hardening (a system call allow-list among it) and Type=notify
#     together let chimed start and say READY;
#   - a client arms timers and every one fires (chime-demo), chimectl status;
#   - systemctl reload: the policy reloaded (chimectl reload), and a
#     malformed policy file fails it;
#   - systemctl restart under a session's timers: none lost, none early;
#   - chimectl restart (chimed executes itself again) the same, its pid
#     and the unit kept (RELOADING=1, then READY=1 from the new image);
#   - both shard threads held (ptrace) under a session's timers: chimed
#     withholds its watchdog ping, systemd kills and restarts it, and the
#     session's timers all fire after;
#   - systemctl stop: a clean stop;
#   - a client's unit with Wants= and After=chimed.service: its start
#     starts chimed first, and its chime_open() finds it listening.
#
# Usage: test_systemd.sh MESON BUILD_ROOT
# Exit: 0 pass, 1 fail, 77 skipped (not root, no systemd-nspawn, a prefix
# systemd does not look in, or a container that cannot boot here).
set -u

meson=$1
build=$2

skip() {
	echo "systemd: skipped: $*"
	exit 77
}

fail() {
	echo "systemd: FAIL: $*"
	[ -n "${init:-}" ] && ct journalctl -u chimed --no-pager -n 40 2>/dev/null | sed 's/^/  journal: /'
	exit 1
}

[ "$(id -u)" -eq 0 ] || skip "needs root (a container)"
command -v systemd-nspawn >/dev/null 2>&1 || skip "systemd-nspawn is not installed (Debian: systemd-container)"
command -v nsenter >/dev/null 2>&1 || skip "nsenter is not installed"
[ -x /usr/lib/systemd/systemd ] || [ -x /lib/systemd/systemd ] || skip "systemd is not installed"

dest=$(mktemp -d "${TMPDIR:-/tmp}/chime-systemd-XXXXXX") || exit 1
nspawn=""
init=""

# Run a command in the container (its namespaces, through its init's pid).
ct() {
	nsenter -t "$init" -a "$@"
}

# shellcheck disable=SC2317 # run by the trap
cleanup() {
	if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
		kill -TERM "$nspawn" 2>/dev/null     # nspawn halts the container
		for _ in $(seq 100); do
			kill -0 "$nspawn" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$nspawn" 2>/dev/null
		wait "$nspawn" 2>/dev/null
	fi
	rm -rf "$dest"
	rm -rf "/run/systemd/nspawn/propagate/chimetest$$" 2>/dev/null
}
trap cleanup EXIT INT TERM HUP

# ---- the install, laid out as a merged-/usr system's ----
"$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest/inst" >"$dest/install.log" 2>&1 ||
	{ cat "$dest/install.log"; fail "meson install --destdir failed"; }
chimed=$(find "$dest/inst" -path '*/sbin/chimed' | head -n 1)
[ -n "$chimed" ] || fail "no sbin/chimed installed"
prefix=$(dirname "$(dirname "${chimed#"$dest/inst"}")")
case $prefix in
/usr | /usr/local) ;;
*) skip "prefix $prefix: systemd looks for units under /usr and /usr/local only" ;;
esac
# systemd's own prefix puts the unit in /lib/systemd/system (Debian 12): /usr/lib on merged /usr
if [ -d "$dest/inst/lib" ]; then
	mkdir -p "$dest/inst/usr/lib"
	cp -a "$dest/inst/lib/." "$dest/inst/usr/lib/" || fail "cannot merge $dest/inst/lib into usr/lib"
fi
unit=$(find "$dest/inst/usr" -name chimed.service | head -n 1)
[ -n "$unit" ] || fail "no chimed.service installed"
libdir=$(dirname "$(find "$dest/inst" -name 'libchime.so.0' | head -n 1)")
libdir=${libdir#"$dest/inst"}
notify=no
grep -q '^Type=notify' "$unit" && grep -q '^WatchdogSec=' "$unit" && notify=yes

# ---- the container's root: its own /etc, the host's /usr with the install over it ----
root=$dest/root
mkdir -p "$root"/etc "$root"/usr "$root"/var "$root"/run "$root"/tmp "$root"/root "$root"/home \
	"$root"/dev "$root"/proc "$root"/sys || fail "mkdir $root"
for d in bin lib lib64 sbin; do
	ln -s "usr/$d" "$root/$d"
done
if [ -f /etc/os-release ]; then cp /etc/os-release "$root/etc/"; else cp /usr/lib/os-release "$root/etc/"; fi
cp /etc/passwd /etc/group "$root/etc/" || fail "cannot copy /etc/passwd and /etc/group"
echo "chimetest$$" >"$root/etc/hostname"

systemd-nspawn -q -D "$root" --overlay-ro="/usr:$dest/inst/usr:/usr" --register=no --keep-unit \
	-b -M "chimetest$$" --console=pipe >"$dest/boot.log" 2>&1 </dev/null &
nspawn=$!
# Until its manager answers (its bus is up a moment after it starts), then until it has booted.
state=""
for _ in $(seq 300); do
	init=$(pgrep -P "$nspawn" | head -n 1)
	# Only the container's own systemd, never this host's: in a pid namespace of its own.
	if [ -n "$init" ] && [ "$(cat "/proc/$init/comm" 2>/dev/null)" = systemd ] &&
		[ "$(readlink "/proc/$init/ns/pid")" != "$(readlink /proc/self/ns/pid)" ]; then
		state=$(ct timeout 90 systemctl is-system-running --wait 2>/dev/null)
		case $state in
		running | degraded) break ;;
		esac
	fi
	kill -0 "$nspawn" 2>/dev/null || break
	sleep 0.2
done
case $state in
running | degraded) ;;
*) cat "$dest/boot.log"; init=""; skip "the container's systemd did not finish booting (state '$state')" ;;
esac

# As the README's install runs ldconfig: the unit's ExecReload, chimectl, finds libchime by itself.
echo "$libdir" >"$root/etc/ld.so.conf" && ct ldconfig || fail "ldconfig in the container failed"

# Run in the container: its PATH finds the install's programs, its loader our libchime.
in_ct() {
	ct env PATH="$prefix/bin:$prefix/sbin:/usr/bin:/usr/sbin" LD_LIBRARY_PATH="$libdir" "$@"
}
show() {
	ct systemctl show chimed -p "$1" --value
}
journal_has() {
	ct journalctl -u chimed --no-pager -o cat 2>/dev/null | grep -qF -- "$1"
}

# The discard helper under the unit's sandbox and system call filter: one
# child of chimed's, alive (a killed one is reaped by the kernel, no zombie
# left, across a restart's exec too), at idle priority, holding nothing
# but its socket (close_range(), or the fallback where it is refused).
helper_ok() {
	local pid kids hpid fds
	pid=$(show MainPID)
	for _ in $(seq 50); do
		kids=$(ct ps -o pid=,stat=,comm= --ppid "$pid" 2>/dev/null | awk '{$1=$1; print}')
		[ "$(echo "$kids" | wc -l)" = 1 ] && echo "$kids" | grep -q '^[0-9]* [RS][^ ]* chimed-discard$' && break
		sleep 0.1
	done
	echo "$kids" | grep -q '^[0-9]* [RS][^ ]* chimed-discard$' && [ "$(echo "$kids" | wc -l)" = 1 ] ||
		fail "$1: chimed $pid's children are not one live chimed-discard: '$kids'"
	hpid=${kids%% *}
	fds=$(ct ls "/proc/$hpid/fd" | wc -l)
	[ "$fds" = 1 ] || fail "$1: the chimed-discard helper holds $fds descriptors, not its socket alone"
	ct chrt -p "$hpid" | grep -q SCHED_IDLE || fail "$1: the helper is not at idle priority: $(ct chrt -p "$hpid")"
}

# ---- start ----
ct timeout 30 systemctl start chimed || fail "systemctl start chimed failed"
[ "$(show ActiveState)" = active ] || fail "chimed is $(show ActiveState) after its start"
[ "$(show User)" = chime ] || fail "the unit's User is '$(show User)', not chime"
# chimed runs under a system call allow-list (what follows shows it is enough):
# io_uring for its shards, not reboot nor the rest of what a service never needs.
filter=" $(show SystemCallFilter) "
case $filter in *" io_uring_enter "*) ;; *) fail "chimed runs without a system call allow-list holding io_uring_enter (SystemCallFilter='$(show SystemCallFilter)')" ;; esac
case $filter in *" reboot "*) fail "chimed's system call filter lets it call reboot" ;; esac
# mincore is in no group of systemd 252 but @known: without it every keepalive reset is a ring record.
case $filter in *" mincore "*) ;; *) fail "chimed's system call filter lacks mincore (the touch table's residency check)" ;; esac
owner=$(ct stat -c %U /run/chime/chime.sock 2>/dev/null)
[ "$owner" = chime ] || fail "the socket /run/chime/chime.sock is owned by '$owner', not chime"
if [ $notify = yes ]; then
	[ "$(show StatusText)" = listening ] || fail "chimed's status text is '$(show StatusText)', not 'listening'"
fi
out=$(in_ct chime-demo -n 20000 -t 2 -d 1 -m 200 2>&1) || fail "chime-demo against the service: $out"
echo "$out" | grep -q "20000 of 20000 timers fired, 0 early" || fail "chime-demo: $out"
out=$(in_ct chimectl status 2>&1) || fail "chimectl status: $out"
echo "$out" | grep -q "running" || fail "chimectl status: $out"
helper_ok "after the start"
echo "systemd: started (Type $(show Type), user chime), 20000 timers fired, chimectl status ok, one discard helper"

# ---- reload ----
ct timeout 30 systemctl reload chimed || fail "systemctl reload chimed failed"
for _ in $(seq 50); do
	journal_has "reloaded the policy" && break
	sleep 0.1
done
journal_has "reloaded the policy" || fail "no 'reloaded the policy' in the journal after systemctl reload"
# ExecReload is chimectl reload: its answer is in the journal, and a policy
# file the broker cannot take fails systemctl reload (the old policy kept).
journal_has "chimed reloaded its policy" || fail "no chimectl reload in the journal after systemctl reload"
ct sh -c 'printf "allow-all\n" >/etc/chime.policy && mkdir -p /etc/default &&
	echo CHIMED_OPTS=\"--allow-all --stats-group chime --policy-file /etc/chime.policy\" >/etc/default/chimed' ||
	fail "cannot write the container's /etc/chime.policy"
ct timeout 30 systemctl restart chimed || fail "systemctl restart chimed (with --policy-file) failed"
ct sh -c 'printf "allow-all\nbogus\n" >/etc/chime.policy'
ct timeout 30 systemctl reload chimed 2>/dev/null && fail "systemctl reload of a malformed policy file succeeded"
journal_has "/etc/chime.policy:2: unknown setting 'bogus'" || fail "the journal does not say why the reload failed"
[ "$(show ActiveState)" = active ] || fail "chimed is $(show ActiveState) after a failed reload"
ct sh -c 'printf "allow-all\n" >/etc/chime.policy'
ct timeout 30 systemctl reload chimed || fail "systemctl reload of the policy put right failed"
echo "systemd: systemctl reload says whether the policy was re-read (chimectl reload)"

# ---- restart under a session's timers ----
in_ct chime-demo -S restart1 -n 20000 -t 1 -d 1 -m 3000 >"$dest/demo1.log" 2>&1 &
demo=$!
sleep 1.5
ct timeout 30 systemctl restart chimed || fail "systemctl restart chimed failed"
wait "$demo" || fail "chime-demo across systemctl restart: $(cat "$dest/demo1.log")"
grep -q "20000 of 20000 timers fired, 0 early" "$dest/demo1.log" || fail "across the restart: $(cat "$dest/demo1.log")"
journal_has "taking over 1 session" || fail "the restarted chimed did not take the session over"
echo "systemd: a session's 20000 timers all fired across systemctl restart"

# ---- chimectl restart: chimed executes itself again, its pid kept, the unit active throughout ----
pid=$(show MainPID)
restarts=$(show NRestarts)
in_ct chime-demo -S restart2 -n 20000 -t 1 -d 1 -m 3000 >"$dest/demo3.log" 2>&1 &
demo=$!
sleep 1.5
out=$(in_ct chimectl restart 2>&1) || fail "chimectl restart under systemd: $out"
wait "$demo" || fail "chime-demo across chimectl restart: $(cat "$dest/demo3.log")"
grep -q "20000 of 20000 timers fired, 0 early" "$dest/demo3.log" ||
	fail "across chimectl restart: $(cat "$dest/demo3.log")"
[ "$(show MainPID)" = "$pid" ] || fail "chimed's pid changed across chimectl restart ($pid -> $(show MainPID))"
[ "$(show NRestarts)" = "$restarts" ] || fail "systemd restarted chimed across chimectl restart"
[ "$(show ActiveState)" = active ] || fail "chimed is $(show ActiveState) after chimectl restart"
helper_ok "after chimectl restart"
echo "systemd: a session's 20000 timers all fired across chimectl restart, the pid and the unit kept, one discard helper"

# ---- the watchdog: both shards held, chimed killed and restarted by systemd ----
if [ $notify = yes ]; then
	pid=$(show MainPID)
	restarts=$(show NRestarts)
	tids=""
	for t in $(ct ls "/proc/$pid/task"); do
		case $(ct cat "/proc/$pid/task/$t/comm" 2>/dev/null) in
		chimed-shard*) tids="$tids $t" ;;
		esac
	done
	[ -n "$tids" ] || fail "no chimed-shard threads in chimed $pid"
	in_ct chime-demo -S watchdog1 -n 20000 -t 1 -d 1 -m 20000 >"$dest/demo2.log" 2>&1 &
	demo=$!
	sleep 1.5
	# Hold the shard threads (ptrace-stopped, as a hung shard) until systemd's
	# watchdog has fired: chimed finds a shard stuck 3 s after it should
	# have made progress (a sleeping one, after its wake-up), withholds its
	# ping, and WatchdogSec=5s later systemd sends SIGABRT, which takes the
	# process once the threads are let go. At most 40 s.
	# shellcheck disable=SC2086 # the thread ids are separate arguments
	ct python3 -c '
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
flag, tids = sys.argv[1], [int(t) for t in sys.argv[2:]]
for t in tids:
    if libc.ptrace(SEIZE, t, None, None) != 0 or libc.ptrace(INTERRUPT, t, None, None) != 0:
        sys.exit("ptrace %d: %s" % (t, os.strerror(ctypes.get_errno())))
    os.waitpid(t, WALL)
end = time.monotonic() + 40
while not os.path.exists(flag) and time.monotonic() < end:
    time.sleep(0.05)
for t in tids:
    libc.ptrace(DETACH, t, None, None)
' /run/chime-test-release $tids &
	holder=$!
	for _ in $(seq 400); do
		journal_has "Watchdog timeout" && break
		kill -0 "$holder" 2>/dev/null || break
		sleep 0.1
	done
	ct touch /run/chime-test-release
	wait "$holder" || fail "could not hold chimed's shard threads"
	wait "$demo" || fail "chime-demo across the watchdog's restart: $(cat "$dest/demo2.log")"
	grep -q "20000 of 20000 timers fired, 0 early" "$dest/demo2.log" ||
		fail "across the watchdog's restart: $(cat "$dest/demo2.log")"
	journal_has "withholding the watchdog ping" || fail "chimed did not withhold its watchdog ping"
	journal_has "Watchdog timeout" || fail "systemd's watchdog did not fire"
	[ "$(show NRestarts)" -gt "$restarts" ] || fail "systemd did not restart chimed (NRestarts $(show NRestarts))"
	[ "$(show ActiveState)" = active ] || fail "chimed is $(show ActiveState) after the watchdog's restart"
	[ "$(show MainPID)" != "$pid" ] || fail "chimed's pid did not change"
	echo "systemd: shards held: ping withheld, systemd restarted chimed, a session's 20000 timers all fired"
else
	echo "systemd: chimed built without libsystemd (Type=simple, no watchdog): the watchdog part skipped"
fi

# ---- stop ----
ct timeout 30 systemctl stop chimed || fail "systemctl stop chimed failed"
[ "$(show ActiveState)" = inactive ] || fail "chimed is $(show ActiveState) after its stop"
[ "$(show ExecMainStatus)" = 0 ] || fail "chimed exited with status $(show ExecMainStatus) at its stop"
journal_has "stopped" || fail "no 'stopped' in the journal"
echo "systemd: stopped cleanly"

# ---- a client's unit ordered after it (README): its start pulls chimed in, and it finds it listening ----
out=$(ct timeout 60 systemd-run --quiet --wait --pipe -p Wants=chimed.service -p After=chimed.service \
	-p User=nobody -E PATH="$prefix/bin:/usr/bin" -E LD_LIBRARY_PATH="$libdir" \
	chime-demo -n 1000 -t 1 -d 1 -m 100 2>&1) || fail "a client unit with Wants= and After=chimed.service: $out"
echo "$out" | grep -q "1000 of 1000 timers fired, 0 early" || fail "a client unit after chimed: $out"
[ "$(show ActiveState)" = active ] || fail "a client unit's Wants= did not start chimed"
ct timeout 30 systemctl stop chimed || fail "systemctl stop chimed failed"
echo "systemd: a client unit with Wants= and After=chimed.service started chimed and used it"
exit 0
