# SPDX-License-Identifier: MIT
# bash completion for chime's commands: chimed, chimectl, chimestat, chime-demo.
# Installed once per command into bash-completion's directory (tools/meson.build),
# which loads it on the first <Tab> after that command's name; or source it.
# Plain bash: it needs nothing of the bash-completion package.
#
# What a running broker knows (client pids, session names, counter names) is
# asked of it with the command line's own --socket, if any, and only when
# that argument is being completed.

# The --socket/-s argument already on the line, for the broker's questions.
_chime_socket_of_line()
{
	local i
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		-s | --socket)
			printf '%s' "${COMP_WORDS[i + 1]}"
			return
			;;
		--socket=*)
			printf '%s' "${COMP_WORDS[i]#--socket=}"
			return
			;;
		esac
	done
}

# _chime_reply WORDS...: the words that start with the one being completed.
_chime_reply()
{
	local cur=${COMP_WORDS[COMP_CWORD]}
	mapfile -t COMPREPLY < <(compgen -W "$*" -- "$cur")
}

_chime_files()
{
	local cur=${COMP_WORDS[COMP_CWORD]}
	compopt -o filenames 2>/dev/null
	mapfile -t COMPREPLY < <(compgen -f -- "$cur")
}

# A column of a chimectl table (header line skipped): client pids, session names.
_chime_ctl_column()
{
	local what=$1 col=$2 sock
	sock=$(_chime_socket_of_line)
	chimectl ${sock:+--socket "$sock"} "$what" 2>/dev/null |
		awk -v c="$col" 'NR > 1 && $1 !~ /^\(/ { print $c }'
}

_chimectl()
{
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]} cmd="" i
	local commands="status clients timers sessions users drop-session reset-stats reload shutdown restart"

	case $prev in
	-s | --socket) _chime_files; return ;;
	-c | --client) _chime_reply "$(_chime_ctl_column clients 2)"; return ;;
	-S | --session | drop-session) _chime_reply "$(_chime_ctl_column sessions 1)"; return ;;
	-n | --limit) return ;;
	esac
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		-s | --socket) ((i++)) ;;
		-*) ;;
		*) cmd=${COMP_WORDS[i]}; break ;;
		esac
	done
	case $cmd in
	"") [[ $cur == -* ]] && _chime_reply "--socket --json --help --version" || _chime_reply "$commands" ;;
	timers) _chime_reply "--client --session --limit --json" ;;
	*) [[ $cur == -* ]] && _chime_reply "--json" ;;
	esac
}

_chimestat()
{
	local prev=${COMP_WORDS[COMP_CWORD - 1]} sock

	case $prev in
	-s | --socket) _chime_files; return ;;
	-f | --field)
		sock=$(_chime_socket_of_line)
		_chime_reply "$(chimestat ${sock:+--socket "$sock"} --once --field '*' 2>/dev/null | awk '{ print $1 }')"
		return
		;;
	--pid) _chime_reply "$(_chime_ctl_column clients 2)"; return ;;
	--uid | --comm | -i | --interval) return ;;
	esac
	_chime_reply "--socket --once --json --prometheus --field --interval --pid --uid --comm --help --version"
}

_chimed()
{
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}

	case $prev in
	-s | --socket | --policy-file | --subuid-file) _chime_files; return ;;
	--socket-group | --stats-group) mapfile -t COMPREPLY < <(compgen -g -- "$cur"); return ;;
	--allow-uid) mapfile -t COMPREPLY < <(compgen -u -- "${cur##*,}" | sed "s/^/${cur%"${cur##*,}"}/"); return ;;
	--allow-gid) mapfile -t COMPREPLY < <(compgen -g -- "${cur##*,}" | sed "s/^/${cur%"${cur##*,}"}/"); return ;;
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
	local prev=${COMP_WORDS[COMP_CWORD - 1]}

	case $prev in
	-s | --socket) _chime_files; return ;;
	-S | --session) _chime_reply "$(_chime_ctl_column sessions 1)"; return ;;
	-n | --timers | -t | --threads | -d | --seconds | -m | --max-ms) return ;;
	esac
	_chime_reply "--socket --timers --threads --seconds --max-ms --session --help --version"
}

complete -F _chimectl chimectl
complete -F _chimestat chimestat
complete -F _chimed chimed
complete -F _chime_demo chime-demo
