# SPDX-License-Identifier: MIT
# bash completion for chime's commands: chimed, chimectl, chimestat, chime-demo.
# Installed once per command into bash-completion's directory (tools/meson.build),
# which loads it on the first <Tab> after that command's name; or source it.
# Plain bash: it needs nothing of the bash-completion package.
#
# What a running broker knows (client pids, session names, counter names) is
# asked of it with the command line's own --socket, if any, and only when
# that argument is being completed.

# Nothing a broker answers, nor the word being completed, is ever expanded:
# any user may run a broker on a socket an operator's --socket names (its
# session names, in a shell running as root, would otherwise be command
# substitutions), so no untrusted text goes through compgen -W, eval or a
# sed script; broker words are kept only if they are plain names
# (_chime_safe) and matched with a quoted prefix.

# _chime_safe WORD: letters, digits, '.', '_', '-' only (session names, pids,
# counter names, user and group names), so that the completed line needs no
# quoting and means what it shows.
_chime_safe()
{
	[[ $1 =~ ^[A-Za-z0-9._-]+$ ]]
}

# _chime_path WORD: a path word of the line (COMP_WORDS holds it as typed)
# as the command will get it: quotes and quoting backslashes taken off, a leading
# ~/ made $HOME/ ('/run/x.sock', ~/chime.sock asked a socket of that very
# name). Nothing else is expanded: $(...), `...` and globs stay text.
_chime_path()
{
	local w=$1 out="" q="" c i
	[[ $w == "~" || $w == "~/"* ]] && w=$HOME${w:1}
	for ((i = 0; i < ${#w}; i++)); do
		c=${w:i:1}
		if [[ -z $q && ($c == "'" || $c == '"') ]]; then
			q=$c
			continue
		fi
		if [[ -n $q && $c == "$q" ]]; then
			q=""
			continue
		fi
		# A backslash quotes the next character outside quotes; inside
		# double quotes only before $ ` " \ (else it is itself).
		if [[ $c == '\' && $q != "'" ]] && ((i + 1 < ${#w})) &&
		   [[ -z $q || ${w:i+1:1} == [\$\`\"\\] ]]; then
			((++i))
			c=${w:i:1}
		fi
		out+=$c
	done
	printf '%s' "$out"
}

# The --socket/-s argument already on the line, for the broker's questions.
# bash splits --socket=PATH at '=' (COMP_WORDBREAKS): --socket, =, PATH.
_chime_socket_of_line()
{
	local i
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		-s | --socket)
			if [[ ${COMP_WORDS[i + 1]} == = ]]; then
				((i + 2 < COMP_CWORD)) && _chime_path "${COMP_WORDS[i + 2]}"
			else
				((i + 1 < COMP_CWORD)) && _chime_path "${COMP_WORDS[i + 1]}"
			fi
			return
			;;
		--socket=*)
			_chime_path "${COMP_WORDS[i]#--socket=}"
			return
			;;
		esac
	done
}

# The word before the one being completed, an option's '=' stepped over
# (--session=<Tab> is --session, =, '').
_chime_prev()
{
	local k=$((COMP_CWORD - 1))
	[[ ${COMP_WORDS[k]} == = && k -gt 0 ]] && ((k--))
	[[ ${COMP_WORDS[COMP_CWORD]} == = ]] && ((k = COMP_CWORD - 1))
	printf '%s' "${COMP_WORDS[k]}"
}

# The word being completed: as bash passes it to the completion function
# ($2, kept in _chime_word: its quotes removed, so that -S 'al<Tab> matches
# alpha), else as typed; '' right after an option's '='.
_chime_cur()
{
	local cur=${_chime_word-${COMP_WORDS[COMP_CWORD]}}
	[[ $cur == = ]] && cur=""
	printf '%s' "$cur"
}

# _chime_reply WORDS...: the words (split at white space; never expanded)
# that start with the one being completed.
_chime_reply()
{
	local cur w words
	cur=$(_chime_cur)
	read -ra words -d '' <<<"$*"       # split (lines too), never globbed
	COMPREPLY=()
	for w in "${words[@]}"; do
		[[ $w == "$cur"* ]] && COMPREPLY+=("$w")
	done
	return 0        # a caller's `_chime_reply A || _chime_reply B` must not run B for a last word unmatched
}

# _chime_reply_lines PREFIX < LINES: the lines that are plain names
# (_chime_safe) and start with the word being completed after PREFIX,
# offered as PREFIX + line (a comma list's earlier entries).
_chime_reply_lines()
{
	local prefix=$1 cur w
	cur=$(_chime_cur)
	cur=${cur#"$prefix"}
	COMPREPLY=()
	while IFS= read -r w; do
		_chime_safe "$w" && [[ $w == "$cur"* ]] && COMPREPLY+=("$prefix$w")
	done
	return 0
}

_chime_files()
{
	local cur
	cur=$(_chime_cur)
	compopt -o filenames 2>/dev/null
	mapfile -t COMPREPLY < <(compgen -f -- "$cur")
}

# A column of a chimectl table: the rows after its header line, whose first
# column is HEADER (a user's own listing has a note before it), and not the
# notes after them ("(1024 of 1100 clients shown: ...)" offered "of" as a pid).
_chime_ctl_column()
{
	local what=$1 col=$2 header=$3 sock
	sock=$(_chime_socket_of_line)
	timeout 3 chimectl ${sock:+--socket "$sock"} "$what" 2>/dev/null |
		awk -v c="$col" -v h="$header" 'rows && $1 !~ /^\(/ { print $c } $1 == h { rows = 1 }'
}

# A user or group list (NAME,NAME,...): the last entry completed.
_chime_id_list()
{
	local kind=$1 cur last
	cur=$(_chime_cur)
	last=${cur##*,}
	_chime_reply_lines "${cur%"$last"}" < <(compgen "-$kind" -- "$last")
}

_chimectl()
{
	local _chime_word=$2
	local cur prev cmd="" i
	local commands="status clients timers sessions users drop-session reset-stats reload shutdown restart"

	cur=$(_chime_cur)
	prev=$(_chime_prev)

	case $prev in
	-s | --socket) _chime_files; return ;;
	-c | --client) _chime_reply_lines "" < <(_chime_ctl_column clients 2 SLOT); return ;;
	-S | --session | drop-session) _chime_reply_lines "" < <(_chime_ctl_column sessions 1 SESSION); return ;;
	-n | --limit) return ;;
	esac
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		-s | --socket) [[ ${COMP_WORDS[i + 1]} == = ]] && ((i++)); ((i++)) ;;
		-* | =) ;;
		*) cmd=${COMP_WORDS[i]}; break ;;
		esac
	done
	case $cmd in
	"")
		if [[ $cur == -* ]]; then
			_chime_reply "--socket --json --help --version"
		else
			_chime_reply "$commands"
		fi
		;;
	timers) _chime_reply "--client --session --limit --json" ;;
	*) [[ $cur == -* ]] && _chime_reply "--json" ;;
	esac
}

_chimestat()
{
	local _chime_word=$2
	local prev sock

	prev=$(_chime_prev)
	case $prev in
	-s | --socket) _chime_files; return ;;
	-f | --field)
		sock=$(_chime_socket_of_line)
		_chime_reply_lines "" < <(timeout 3 chimestat ${sock:+--socket "$sock"} --once --field '*' 2>/dev/null |
			awk '{ print $1 }')
		return
		;;
	--pid) _chime_reply_lines "" < <(_chime_ctl_column clients 2 SLOT); return ;;
	--uid | --comm | -i | --interval) return ;;
	esac
	_chime_reply "--socket --once --json --prometheus --field --interval --pid --uid --comm --help --version"
}

_chimed()
{
	local _chime_word=$2
	local cur prev

	cur=$(_chime_cur)
	prev=$(_chime_prev)
	case $prev in
	-s | --socket | --policy-file | --subuid-file) _chime_files; return ;;
	--socket-group | --stats-group) _chime_reply_lines "" < <(compgen -g -- "$cur"); return ;;
	--allow-uid) _chime_id_list u; return ;;
	--allow-gid) _chime_id_list g; return ;;
	--log-level) _chime_reply "err warning notice info debug"; return ;;
	-n | --shards | --spin-us | --spin-share | --resolution-us | --capacity | --max-clients | \
		--max-clients-per-uid | --session-linger | --max-timers-per-client | --max-timers-per-uid | \
		--sq-size | --cq-size) return ;;
	esac
	_chime_reply "--socket --shards --spin-us --spin-share --foreground --resolution-us --capacity
		--max-clients --max-clients-per-uid --session-linger --fresh --allow-uid --allow-gid
		--allow-all --policy-file --subuid-file --socket-group --stats-group
		--max-timers-per-client --max-timers-per-uid --sq-size --cq-size --log-level --verbose
		--help --version"
}

_chime_demo()
{
	local _chime_word=$2
	local prev

	prev=$(_chime_prev)
	case $prev in
	-s | --socket) _chime_files; return ;;
	-S | --session) _chime_reply_lines "" < <(_chime_ctl_column sessions 1 SESSION); return ;;
	-n | --timers | -t | --threads | -d | --seconds | -m | --max-ms) return ;;
	esac
	_chime_reply "--socket --timers --threads --seconds --max-ms --session --help --version"
}

complete -F _chimectl chimectl
complete -F _chimestat chimestat
complete -F _chimed chimed
complete -F _chime_demo chime-demo
