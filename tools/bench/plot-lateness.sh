#!/bin/sh
# SPDX-License-Identifier: MIT
#
# plot-lateness.sh - the lateness CDF of `chime-bench compare --lateness-csv DIR`
# as a PNG: one curve per contender's CSV in DIR (chime, timerfd, libuv),
# lateness in us on a log scale against the fraction of timers at most that
# late. Needs gnuplot (Debian: gnuplot-nox).
#
# Usage: plot-lateness.sh DIR OUT.png [TITLE]
set -eu

usage="Usage: plot-lateness.sh DIR OUT.png [TITLE]"
case ${1:-} in
-h|--help)
	echo "$usage"
	echo "Draw the lateness CSVs of chime-bench compare --lateness-csv DIR as a CDF in OUT.png."
	exit 0 ;;
esac
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
	echo "plot-lateness.sh: expected DIR and OUT.png, and at most a TITLE" >&2
	echo "$usage" >&2
	exit 2
fi
dir=$1
out=$2
title=${3:-timer lateness: received - deadline}
[ -d "$dir" ] || { echo "plot-lateness.sh: '$dir' is not a directory (chime-bench compare --lateness-csv DIR)" >&2; exit 1; }

if ! command -v gnuplot >/dev/null 2>&1; then
	echo "plot-lateness.sh: gnuplot not installed (Debian: apt-get install gnuplot-nox)" >&2
	exit 1
fi
plots=""
for c in chime timerfd libuv; do
	f=$dir/$c.csv
	[ -s "$f" ] || continue
	label=$c
	case $c in
	chime) label="chime (chime_wait)" ;;
	timerfd) label="timerfd (epoll)" ;;
	libuv) label="libuv uv_timer_t" ;;
	esac
	plots="$plots${plots:+, }'$f' using 1:2 with lines lw 2 title '$label'"
done
if [ -z "$plots" ]; then
	echo "plot-lateness.sh: no lateness CSV in '$dir'" >&2
	exit 1
fi
gnuplot <<GP
set terminal pngcairo size 800,480 font ",10" noenhanced
set output '$out'
set datafile separator ','
set key left top
set title '$title'
set xlabel 'lateness (us, log scale)'
set ylabel 'fraction of timers'
set logscale x
set xrange [0.1:*]
set yrange [0:1]
set grid
plot $plots
GP
