#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# completion: tools/completion.bash offers each command's options, exactly
# those its --help lists (so neither can change without the other), and
# completes what a running broker knows: the pids of its clients, the names
# of its sessions, the names of its counters; a missing broker completes
# nothing and prints nothing.
#
# Usage: test_completion.sh COMPLETION_BASH CHIMED CHIMECTL CHIMESTAT CHIME_DEMO
# Exit: 0 pass, 1 fail.
set -u

script=$1 chimed=$2 chimectl=$3 chimestat=$4 demo=$5
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chime-completion-XXXXXX") || exit 1
broker=""
cleanup() {
	[ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM HUP
status=0
fail() {
	echo "completion: FAIL: $*"
	status=1
}

# The commands by their installed names, as the script calls them.
mkdir "$tmp/bin"
ln -s "$(realpath "$chimed")" "$tmp/bin/chimed"
ln -s "$(realpath "$chimectl")" "$tmp/bin/chimectl"
ln -s "$(realpath "$chimestat")" "$tmp/bin/chimestat"
ln -s "$(realpath "$demo")" "$tmp/bin/chime-demo"
PATH="$tmp/bin:$PATH"
# shellcheck source=/dev/null
. "$script" || { echo "completion: FAIL: $script does not load"; exit 1; }

# complete LINE: COMPREPLY for the cursor at the end of LINE (a trailing
# space: a new, empty word), one per line, sorted. Words are split as bash
# splits them for completion: at white space, and '=' a word of its own
# (COMP_WORDBREAKS), so --socket=PATH is --socket, =, PATH.
complete_line() {
	local line=$1 fn w words word
	read -r -a words <<<"$line"
	COMP_WORDS=()
	for w in "${words[@]}"; do
		if [[ $w == -*=* ]]; then
			COMP_WORDS+=("${w%%=*}" "=")
			[ -n "${w#*=}" ] && COMP_WORDS+=("${w#*=}")
		else
			COMP_WORDS+=("$w")
		fi
	done
	[[ $line == *" " ]] && COMP_WORDS+=("")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	COMP_LINE=$line
	COMP_POINT=${#line}
	COMPREPLY=()
	fn=$(complete -p "${COMP_WORDS[0]}" 2>/dev/null | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
	[ -n "$fn" ] || { echo "no completion for ${COMP_WORDS[0]}"; return; }
	# $2 as bash passes it: the word unquoted, '' right after an option's '='
	word=${CHIME_TEST_WORD-${COMP_WORDS[COMP_CWORD]}}
	[ "$word" = "=" ] && word=""
	"$fn" "${COMP_WORDS[0]}" "$word" "${COMP_WORDS[COMP_CWORD - 1]}" 2>&1
	printf '%s\n' "${COMPREPLY[@]}" | sort -u | sed '/^$/d'
}

# expect LINE WORD...: completing LINE offers each WORD (and maybe more).
expect() {
	local line=$1 got w
	shift
	got=$(complete_line "$line")
	for w in "$@"; do
		grep -qxF -- "$w" <<<"$got" || fail "'$line<Tab>' does not offer '$w'; it offers: $(echo $got)"
	done
}

# expect_only LINE WORD...: exactly those.
expect_only() {
	local line=$1 got want
	shift
	got=$(complete_line "$line")
	want=$(printf '%s\n' "$@" | sort -u | sed '/^$/d')
	[ "$got" = "$want" ] || fail "'$line<Tab>' offers '$(echo $got)', not '$(echo $want)'"
}

# A command's long options as its --help lists them: the lines that start
# with an option (or, for chimectl, with the command that takes it).
help_options() {
	"$@" --help | grep -E '^ +(-[A-Za-z0-9], |-[A-Za-z0-9]\|)?--|^  timers ' |
		grep -oE -- '--[a-z][a-z-]*' | sort -u
}

# ---- each command's options: those of its --help, no more, no fewer ----
expect_only "chimed --" $(help_options chimed)
expect_only "chime-demo --" $(help_options chime-demo)
expect_only "chimestat --" $(help_options chimestat)
# chimectl's global ones, then timers' own (--json is every command's)
expect_only "chimectl timers --" $(help_options chimectl | grep -xE -- '--(client|session|limit|json)')
expect_only "chimectl --" $(help_options chimectl | grep -vxE -- '--(client|session|limit)')
[ "$(help_options chimed | wc -l)" -ge 25 ] || fail "chimed --help lists $(help_options chimed | wc -l) long options: the parse of it broke"

# ---- commands and fixed values ----
expect_only "chimectl " status clients timers sessions users drop-session reset-stats reload shutdown restart
expect_only "chimectl --socket /x re" reset-stats reload restart
expect_only "chimectl --j" --json
expect_only "chimectl --socket=/x --s" --socket
expect_only "chimectl --h" --help
expect_only "chimed --log-level w" warning
expect "chimed --allow-uid ro" root
expect "chimed --allow-uid daemon,ro" daemon,root
expect "chimed --socket-group ro" root
touch "$tmp/a-socket-file"
expect "chimectl --socket $tmp/a-sock" "$tmp/a-socket-file"
expect_only "chimed --capacity "

# ---- what a broker answers is never run nor expanded ----
# Any user may run a broker on a socket of theirs and have it answer any
# session name; the completion runs in the operator's shell (root's). A
# stand-in chimectl answers as such a broker would (the real one prints a
# broker's names as they come, made printable), and a slow one never ends.
mkdir "$tmp/hostile"
cat >"$tmp/hostile/chimectl" <<EOF
#!/bin/sh
[ -n "\${CHIME_TEST_SLOW:-}" ] && exec sleep 60
echo "(this user's clients only: a note before the header)"
case "\$*" in
*sessions*) echo "SESSION UID STATE" ;;
*) echo "SLOT PID UID" ;;
esac
echo 'x\$(touch\${IFS}$tmp/pwned-1) 0 attached'
echo '\`touch\${IFS}$tmp/pwned-2\` 0 attached'
echo 'x;touch\${IFS}$tmp/pwned-3 0 attached'
echo '~root 0 attached'
echo '* 0 attached'
echo 'x{a,b} 0 attached'
echo 'x-plain.name_1 0 attached'
# as chimectl ends a listing cut at 1024 (a user's own clients, by query): "of" is a plain word
echo "(1024 of 1100 clients shown: the broker's answer holds at most 1024, and what its socket takes at once)"
EOF
chmod +x "$tmp/hostile/chimectl"
(
	PATH="$tmp/hostile:$PATH"
	expect_only "chimectl -s $tmp/h.sock drop-session " x-plain.name_1
	expect_only "chimectl -s $tmp/h.sock drop-session x" x-plain.name_1
	expect_only "chime-demo -s $tmp/h.sock -S " x-plain.name_1
	expect_only "chimectl -s $tmp/h.sock timers --client " 0
	start=$SECONDS
	CHIME_TEST_SLOW=1 expect_only "chimectl -s $tmp/h.sock drop-session "
	[ $((SECONDS - start)) -le 10 ] || fail "a broker that never answers held the completion $((SECONDS - start)) s"
	exit $status
) || status=1
# nor is the word being completed (it went into a sed script once)
complete_line "chimed --allow-uid /;e\${IFS}touch\${IFS}$tmp/pwned-4;#," >/dev/null
# nor the --socket word, taken off its quotes
complete_line "chimectl -s \"\$(touch\${IFS}$tmp/pwned-5)\" drop-session " >/dev/null
for n in 1 2 3 4 5; do
	[ -e "$tmp/pwned-$n" ] && fail "completing ran code it was given (pwned-$n exists)"
done

# ---- a path word as the command gets it (_chime_path) ----
path_is() {
	local got
	got=$(_chime_path "$1")
	[ "$got" = "$2" ] || fail "_chime_path [$1] gave [$got], not [$2]"
}
path_is '/run/a\ b.sock' '/run/a b.sock'
path_is "'/run/a\\b.sock'" '/run/a\b.sock'
# inside double quotes a backslash is itself but before $ ` " \
path_is '"/run/a\b.sock"' '/run/a\b.sock'
path_is '"/run/a\$b\"c\\d.sock"' '/run/a$b"c\d.sock'
path_is "'/run/it'\\''s.sock'" "/run/it's.sock"

# ---- nothing running: nothing offered, nothing printed ----
expect_only "chimectl -s $tmp/none.sock drop-session "
expect_only "chimestat -s $tmp/none.sock -f "

# ---- a running broker: its sessions, clients and counters ----
sock=$tmp/chime.sock
chimed --foreground --socket "$sock" --shards 1 >"$tmp/chimed.log" 2>&1 &
broker=$!
for _ in $(seq 100); do
	[ -S "$sock" ] && grep -q "listening on" "$tmp/chimed.log" && break
	sleep 0.05
done
grep -q "listening on" "$tmp/chimed.log" || { fail "chimed did not start: $(cat "$tmp/chimed.log")"; exit 1; }
# a session that stays (detached, its timers an hour ahead) and a client that stays connected
demo_client() {
	chime-demo --socket "$sock" --timers 1 --max-ms 60000 --seconds 1 --session "$1" >/dev/null 2>&1
}
demo_client completion-test-session &
demo_pid=$!
pid=""
for _ in $(seq 100); do
	pid=$(chimectl --socket "$sock" clients 2>/dev/null | awk 'NR > 1 && $1 !~ /^\(/ { print $2; exit }')
	[ -n "$pid" ] && break
	sleep 0.05
done
[ -n "$pid" ] || fail "no client listed: $(chimectl --socket "$sock" clients 2>&1)"
expect "chimectl --socket $sock timers --client " "$pid"
expect "chimestat -s $sock --pid " "$pid"
expect_only "chimectl -s $sock drop-session completion-" completion-test-session
expect_only "chime-demo -s $sock -S completion-" completion-test-session
expect "chimestat --socket=$sock -f shard.0.fi" shard.0.fires
# --socket=PATH (three words to bash) asks PATH, not a socket named '='
expect_only "chimectl --socket=$sock drop-session completion-" completion-test-session
expect_only "chimectl --socket=$sock --session=completion-" completion-test-session
# a word begun with a quote: bash hands the function the word unquoted
CHIME_TEST_WORD=completion- expect_only "chimectl -s $sock drop-session 'completion-" completion-test-session
# the --socket word is in COMP_WORDS as typed: quoted, or from ~ (nothing was offered)
expect_only "chimectl -s '$sock' drop-session completion-" completion-test-session
expect_only "chimectl --socket=\"$sock\" drop-session completion-" completion-test-session
HOME=$tmp expect_only "chimectl -s ~/chime.sock drop-session completion-" completion-test-session
expect "chimestat -s $sock -f broker.st" broker.state broker.status
kill "$demo_pid" 2>/dev/null
wait "$demo_pid" 2>/dev/null

[ $status -eq 0 ] && echo "completion: every option of chimed, chimectl, chimestat and chime-demo; a broker's clients, sessions and counters"
exit $status
