/* SPDX-License-Identifier: MIT */
/*
 * chimestat - show chimed's counters, read from its control segment.
 * This file: main(), the options and the plain periodic output (stdout not
 * a terminal, or one the live view cannot use); the fields, the outputs and
 * the live view on a terminal (stat_live.c) are in stat_*.c (chimestat.h).
 *
 * It maps "<socket>.ctl" read-only and never talks to the broker: it costs
 * the broker nothing, works for any member of the broker's group, and shows
 * the last state of a broker that died (exit status 3 then).
 *
 * Every value is a "field" named <group>.<index>.<name> (see FIELD NAMES in
 * chimestat(1)): broker.<name>, shard.<N>.<name>, client.<SLOT>.<name>,
 * lateness.<name> and lateness_10s.<name>. -f selects fields by those names; the text, JSON and
 * Prometheus outputs are all generated from the one list of fields built by
 * collect(), so they cannot disagree.
 */
#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "chime_config.h"
#include "chimestat.h"
#include "cliarg.h"
#include "paths.h"

/* --uid is kept in a long (struct opts), -1 for "any": every uid_t must fit beside it. */
_Static_assert(sizeof(long) > sizeof(uid_t), "struct opts.uid holds every uid_t");

static volatile sig_atomic_t stop;

/* The interval between frames, cut short by SIGINT or SIGTERM. */
static void interval_sleep(double interval)
{
	struct timespec ts = { .tv_sec = (time_t)interval };

	ts.tv_nsec = (long)((interval - (double)ts.tv_sec) * 1e9);
	while (!stop && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: chimestat [OPTIONS]\n"
		"Show the counters of a running (or dead) chimed, read from its shared memory.\n"
		"\n"
		"  -s, --socket PATH    broker socket; reads PATH.ctl (default: $CHIME_SOCKET,\n"
		"                       else /run/chime/chime.sock)\n"
		"  -1, --once           print once and exit (rates are averages since start, a\n"
		"                       client's since it connected, a named session's since\n"
		"                       the broker started)\n"
		"  -j, --json           print one JSON document and exit (implies -1); on a\n"
		"                       failure too, with its \"error\"\n"
		"      --prometheus     print the Prometheus text exposition format and exit\n"
		"  -f, --field PATTERN  only fields whose name matches the shell PATTERN\n"
		"                       (fnmatch; repeatable), e.g. 'shard.*.fires'\n"
		"  -i, --interval SECS  refresh interval of the live view or the plain frames\n"
		"                       (decimal seconds, 0.05..3600, default 1)\n"
		"      --pid PID        only the client(s) with this process id\n"
		"      --uid UID        only the clients of this user id (a number)\n"
		"      --comm NAME      only the clients with this process name (1 to 15 bytes,\n"
		"                       as /proc/PID/comm and ps show it)\n"
		"  -h, --help           show this help\n"
		"  -V, --version        show the version\n"
		"\n"
		"Field names: broker.NAME, shard.N.NAME, client.SLOT.NAME, lateness.NAME\n"
		"(all shards, since start or chimectl reset-stats), lateness_10s.NAME (the\n"
		"last 10 s); -1 -f '*' lists them all.\n"
		"\n"
		"Exit status: 0 ok; 1 cannot read the broker's shared memory, or write\n"
		"stdout; 2 usage error; 3 the broker is not running (its last state is shown).\n");
}

static int exit_for(const struct sr_snap *sn)
{
	enum sr_state st = sr_liveness(sn, NULL);

	return st == SR_RUNNING || st == SR_STARTING ? SR_EXIT_OK : SR_EXIT_NOT_RUNNING;
}

/* --pid, --uid, --comm: drop the other clients from the snapshot, so every output agrees. */
void keep_clients(struct sr_snap *sn, const struct opts *o)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < sn->nr_clients; i++) {
		const struct sr_client *c = &sn->clients[i];

		if ((o->pid >= 0 && c->id.pid != o->pid) || (o->uid >= 0 && c->id.uid != (uint32_t)o->uid) ||
		    (o->comm && strncmp(c->id.comm, o->comm, sizeof(c->id.comm))))
			continue;
		sn->clients[n++] = *c;
	}
	sn->nr_clients = n;
}

/* Does the output asked for show field f? Prometheus has the fields with a series; the others theirs. */
static bool shown(const struct field *f, const struct opts *o)
{
	return o->prom ? f->prom != NULL : !f->prom_only;
}

/*
 * A -f PATTERN that names no field is most likely a typo: say so on stderr
 * (the output is still what was asked, and the exit status 0). Not for
 * client.* patterns: a client's fields come and go with it. With
 * --prometheus, a field with no series of its own (broker.pid and
 * broker.version are labels of chime_broker_info) matches nothing: an
 * empty document, before, said nothing of why.
 */
static void unmatched_patterns(const struct flist *l, const struct opts *o)
{
	for (unsigned i = 0; i < o->nr_pat; i++) {
		size_t k = 0;

		if (!strncmp(o->pat[i], "client.", 7))
			continue;
		while (k < l->n && (!shown(&l->v[k], o) || fnmatch(o->pat[i], l->v[k].name, 0) != 0))
			k++;
		if (k < l->n)
			continue;
		if (o->prom)
			fprintf(stderr, PROG ": no field with a Prometheus series matches '%s' (chimestat "
				"--prometheus lists them; -f matches field names, not metric names)\n", o->pat[i]);
		else
			fprintf(stderr, PROG ": no field matches '%s' (chimestat -1 -f '*' lists their names)\n",
				o->pat[i]);
	}
}

/*
 * A failure after the options: its message on stderr and, with -j, a
 * document that says it (chimectl -j's shape), not an empty stdout.
 */
static int fail(const struct opts *o, const char *sock, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(const struct opts *o, const char *sock, int code, const char *fmt, ...)
{
	char msg[PATH_MAX + 512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, PROG ": %s\n", msg);
	if (o->json) {
		print_json(stdout, NULL, o, &(struct json_end){ .socket = sock, .status = code, .error = msg });
		if (sr_stdout_check(PROG))
			code = SR_EXIT_NOSHM;
	}
	return code;
}

/* sr_open() or sr_snapshot() failed: fail() with the standard message. */
static int sr_fail(const struct opts *o, const struct sr *s, int code, int err)
{
	char msg[PATH_MAX + 256];

	sr_strerror(s, err, msg, sizeof(msg));
	return fail(o, s->sock, code, "%s", msg);
}

static int chimestat(struct opts *op, int argc, char **argv)
{
	enum { OPT_PROM = 256, OPT_PID, OPT_UID, OPT_COMM };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "once", no_argument, NULL, '1' },
		{ "json", no_argument, NULL, 'j' },
		{ "prometheus", no_argument, NULL, OPT_PROM },
		{ "field", required_argument, NULL, 'f' },
		{ "interval", required_argument, NULL, 'i' },
		{ "pid", required_argument, NULL, OPT_PID },
		{ "uid", required_argument, NULL, OPT_UID },
		{ "comm", required_argument, NULL, OPT_COMM },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	struct opts o = *op;
	struct flist cur = { 0 }, prev = { 0 };
	struct sr_snap sn, ps;
	char sock[PATH_MAX];
	int have_prev = 0, r, opt;
	bool warned = false, gone_said = false;
	struct sr s;

	/* getopt's own messages start with argv[0]: the program's name, as chimectl's, not its path. */
	argv[0] = (char *)PROG;
	while ((opt = getopt_long(argc, argv, "s:1jf:i:hV", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (chime_socket_opt(PROG, optarg) < 0)
				return SR_EXIT_USAGE;
			o.socket = optarg;
			break;
		case '1':
			o.once = 1;
			break;
		case 'j':
			o.json = o.once = 1;
			break;
		case OPT_PROM:
			o.prom = o.once = 1;
			break;
		case 'f':
			o.pat[o.nr_pat++] = optarg;
			break;
		case OPT_PID:
		case OPT_UID: {
			/* A pid is 1..INT32_MAX (as chimectl's); a uid any uid_t but (uid_t)-1, "no uid". */
			unsigned long long min = opt == OPT_PID, max = opt == OPT_PID ? INT32_MAX : (uid_t)-1 - 1;
			uint64_t v;

			if (chime_parse_u64(optarg, &v) < 0 || v < min || v > max) {
				fprintf(stderr, PROG ": invalid %s '%s' (a number from %llu to %llu)\n",
					opt == OPT_PID ? "--pid" : "--uid", optarg, min, max);
				return SR_EXIT_USAGE;
			}
			/* -f adds up, these do not: a second one silently replaced the first (as chimectl --client) */
			if (*(opt == OPT_PID ? &o.pid : &o.uid) >= 0) {
				fprintf(stderr, PROG ": %s given twice (a client filter takes one value)\n",
					opt == OPT_PID ? "--pid" : "--uid");
				return SR_EXIT_USAGE;
			}
			*(opt == OPT_PID ? &o.pid : &o.uid) = (long)v;
			break;
		}
		case OPT_COMM:
			/* The kernel's comm, which chimed records, is 1 to 15 bytes: a longer name matched no client. */
			if (!*optarg || strlen(optarg) >= sizeof(((struct chime_client_ctl *)0)->comm)) {
				fprintf(stderr, PROG ": invalid --comm '%s' (a process name as /proc/PID/comm and ps "
					"show it: 1 to %zu bytes, longer ones cut there)\n", optarg,
					sizeof(((struct chime_client_ctl *)0)->comm) - 1);
				return SR_EXIT_USAGE;
			}
			if (o.comm) {
				fprintf(stderr, PROG ": --comm given twice (a client filter takes one value)\n");
				return SR_EXIT_USAGE;
			}
			o.comm = optarg;
			break;
		case 'i': {
			char *end = optarg;

			/*
			 * A decimal number of seconds: digits first, as the other
			 * number options (strtod would also take " 1", "+1", "0x1",
			 * "1e1" and "inf"); a sign, "-1" included, is no interval.
			 */
			errno = 0;
			o.interval = isdigit((unsigned char)optarg[0]) || (optarg[0] == '.' &&
				     isdigit((unsigned char)optarg[1])) ? strtod(optarg, &end) : -1;
			if (o.interval < 0 || errno || *end || strpbrk(optarg, "xXeEpP") ||
			    !(o.interval >= 0.05 && o.interval <= 3600)) {
				fprintf(stderr, PROG ": invalid --interval '%s' (seconds, from 0.05 to 3600)\n",
					optarg);
				return SR_EXIT_USAGE;
			}
			break;
		}
		case 'h':
			usage(stdout);
			return sr_stdout_check(PROG);
		case 'V':
			printf(PROG " %s\n", CHIME_VERSION);
			return sr_stdout_check(PROG);
		default:
			fprintf(stderr, PROG ": try '" PROG " --help'\n");
			return SR_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, PROG ": unexpected argument '%s' (try '" PROG " --help')\n", argv[optind]);
		return SR_EXIT_USAGE;
	}
	if (o.json && o.prom) {
		fprintf(stderr, PROG ": --json and --prometheus exclude each other\n");
		return SR_EXIT_USAGE;
	}
	r = sr_socket_path(sock, sizeof(sock), o.socket);
	if (r == -ENAMETOOLONG) {
		fprintf(stderr, PROG ": the socket path of %s, '%.*s...', is too long (a unix socket's is at "
			"most %d bytes)\n", o.socket ? "--socket" : "$CHIME_SOCKET", 40,
			chime_socket_path(o.socket, NULL), SR_SOCKET_PATH_MAX);
		return SR_EXIT_USAGE;
	}
	if (r < 0)
		return fail(&o, NULL, SR_EXIT_NOSHM, "no socket path: %s (set $CHIME_SOCKET or use --socket)",
			    strerror(-r));
	r = sr_open(&s, sock);
	if (r < 0)
		return sr_fail(&o, &s, SR_EXIT_NOSHM, r);

	if (o.once) {
		char why_last[256] = "";

		r = sr_snapshot(&s, &sn);
		if (r < 0) {
			r = sr_fail(&o, &s, r == -ESTALE ? SR_EXIT_NOT_RUNNING : SR_EXIT_NOSHM, r);
			sr_close(&s);
			return r;   /* -ESTALE: it stopped as it was read */
		}
		keep_clients(&sn, &o);
		collect(&cur, &sn);
		unmatched_patterns(&cur, &o);
		r = exit_for(&sn);
		if (r == SR_EXIT_NOT_RUNNING) {
			const char *why;

			sr_liveness(&sn, &why);
			snprintf(why_last, sizeof(why_last), "%s; the state shown is its last", why);
		}
		if (o.json)
			print_json(stdout, &cur, &o, &(struct json_end){ .socket = s.sock, .status = r,
					.error = why_last[0] ? why_last : NULL });
		else if (o.prom)
			print_prom(stdout, &cur, &o);
		else if (o.nr_pat)
			print_flat(stdout, &cur, NULL, &sn, NULL, &o);
		else
			print_table(stdout, &cur, NULL, &sn, NULL);
		if (why_last[0])
			fprintf(stderr, PROG ": %s\n", why_last);
		if (sr_stdout_check(PROG))
			r = SR_EXIT_NOSHM;
		free(cur.v);
		sr_snap_free(&sn);
		sr_close(&s);
		return r;
	}

	if (isatty(STDOUT_FILENO)) {
		char why[128];

		r = live_run(&s, &o, why, sizeof(why));
		if (r != LIVE_UNAVAILABLE) {
			sr_close(&s);
			return r;
		}
		/* Asked for the live view on a terminal that cannot show it: say why, then print frames. */
		fprintf(stderr, PROG ": no live view (%s); printing plain frames instead\n", why);
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	r = SR_EXIT_OK;
	while (!stop) {
		if (sr_follow(&s)) {
			/* chimectl restart, or another broker started: show it, with no rates against the old one. */
			fprintf(stderr, PROG ": '%s' is a new broker's now: following it\n", s.ctl_path);
			if (have_prev)
				sr_snap_free(&ps);
			have_prev = 0;
		}
		r = sr_snapshot(&s, &sn);
		if (r == -ESTALE) {
			/* Its broker stopped and emptied it: sr_follow() above takes the next one. */
			if (!gone_said)
				fprintf(stderr, PROG ": the broker at '%s' stopped: waiting for the next one\n", s.sock);
			gone_said = true;
			r = SR_EXIT_NOT_RUNNING;
			interval_sleep(o.interval);
			continue;
		}
		if (r < 0) {
			/* -ENODATA: the file mapped shrank (one replaced at the path, sr_follow() took above). */
			sr_perror(PROG, &s, r);
			r = SR_EXIT_NOSHM;
			break;
		}
		gone_said = false;
		keep_clients(&sn, &o);
		collect(&cur, &sn);
		if (!have_prev && !warned) {
			unmatched_patterns(&cur, &o);   /* once, on the first frame, as -1 does */
			warned = true;
		}
		if (o.nr_pat)
			print_flat(stdout, &cur, have_prev ? &prev : NULL, &sn, have_prev ? &ps : NULL, &o);
		else
			print_table(stdout, &cur, have_prev ? &prev : NULL, &sn, have_prev ? &ps : NULL);
		/*
		 * A blank line between frames, on a terminal too: we are here
		 * because it cannot move the cursor (or TERM says nothing of
		 * it), so a clear-screen sequence would be garbage on it.
		 */
		fputc('\n', stdout);
		r = exit_for(&sn);
		/* A reader gone (SIGPIPE ignored) or a full disk: frames no one gets, forever, before. */
		if (sr_stdout_check(PROG)) {
			r = SR_EXIT_NOSHM;
			sr_snap_free(&sn);
			break;
		}
		/* Keep this sample for the next rates; the field list too. */
		if (have_prev)
			sr_snap_free(&ps);
		ps = sn;
		{
			struct flist t = prev;

			prev = cur;
			cur = t;
		}
		have_prev = 1;
		interval_sleep(o.interval);
	}
	if (have_prev)
		sr_snap_free(&ps);
	free(cur.v);
	free(prev.v);
	sr_close(&s);
	return r;
}

int main(int argc, char **argv)
{
	/* -f patterns: at most one per argument. Owned here so every exit path frees them. */
	struct opts o = { .interval = 1, .pid = -1, .uid = -1, .pat = calloc((size_t)argc, sizeof(*o.pat)) };
	int r;

	if (!o.pat) {
		fprintf(stderr, PROG ": out of memory\n");
		return SR_EXIT_NOSHM;
	}
	r = chimestat(&o, argc, argv);
	free(o.pat);
	return r;
}
