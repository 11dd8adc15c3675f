/* SPDX-License-Identifier: MIT */
/*
 * log.c - see log.h. Async-signal-safety is not needed: chimed takes signals
 * through a signalfd, never in a handler.
 */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int log_max_level = LOG_INFO;
static bool to_syslog;
static bool to_journal;    /* stderr is systemd's journal stream: "<level>" prefixes */
/*
 * Lines never wait for stderr's reader (a stalled journald, `chimed -f |
 * less` paused): a full pipe blocked the control thread's write, and with
 * it every handshake and the stop. A pipe or terminal gets a private
 * non-blocking open of its own (O_NONBLOCK on stderr itself would change
 * it for every process sharing it); a socket gets send(MSG_DONTWAIT).
 */
static int err_fd = STDERR_FILENO;
static bool err_sock;
static bool err_poll;               /* no private open (another user's pipe: EACCES): poll before a write */
static uint64_t err_dropped;        /* lines stderr had no room for, since the last one written */

/*
 * Syslog, our own client of /dev/log rather than glibc's syslog(3), whose
 * send() blocks while the receiver's queue is full (a stalled journald:
 * ten datagrams by default): that held the control thread, and with it
 * every handshake and the stop, as a full stderr pipe did. Non-blocking,
 * so a line with no room is dropped and counted like stderr's, and the
 * next that fits says how many. Under a lock: threads log, and a reopen
 * (SIGHUP, or the receiver restarted) replaces the socket.
 */
#define SYSLOG_PATH "/dev/log"
static pthread_mutex_t sl_lock = PTHREAD_MUTEX_INITIALIZER;
static int sl_fd = -1;
static bool sl_stream;              /* a stream /dev/log (some syslog daemons): lines end in a NUL */
static uint64_t sl_tried;           /* CLOCK_MONOTONIC second of the last connect attempt, + 1 */
static uint64_t sl_dropped;         /* lines not sent since the last one that was */

static const struct {
	const char *name;
	int level;
} level_names[] = {
	{ "err", LOG_ERR }, { "warning", LOG_WARNING }, { "notice", LOG_NOTICE },
	{ "info", LOG_INFO }, { "debug", LOG_DEBUG },
};

int log_parse_level(const char *name)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
		if (!strcasecmp(name, level_names[i].name))
			return level_names[i].level;
	return -EINVAL;
}

void log_stderr_reset(void)
{
	if (err_fd != STDERR_FILENO)
		close(err_fd);
	err_fd = STDERR_FILENO;
	err_sock = err_poll = false;
}

static uint64_t mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec;
}

/*
 * Under sl_lock: a socket connected to /dev/log (a datagram one, else a
 * stream one, as glibc tries), tried at most once a second; false: none.
 */
static bool sl_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX, .sun_path = SYSLOG_PATH };
	uint64_t now = mono_s() + 1;

	if (sl_fd >= 0)
		return true;
	if (sl_tried == now)
		return false;
	sl_tried = now;
	for (int i = 0; i < 2 && sl_fd < 0; i++) {
		sl_stream = i == 1;
		sl_fd = socket(AF_UNIX, (sl_stream ? SOCK_STREAM : SOCK_DGRAM) | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (sl_fd < 0)
			return false;
		if (connect(sl_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			int err = errno;

			close(sl_fd);
			sl_fd = -1;
			errno = err;    /* for log_use_syslog()'s warning */
			if (err != EPROTOTYPE)
				return false;
		}
	}
	return sl_fd >= 0;
}

static void sl_close(void)
{
	if (sl_fd >= 0)
		close(sl_fd);
	sl_fd = -1;
	sl_tried = 0;
}

/*
 * Under sl_lock: one datagram in the traditional format ("<PRI>Mmm dd
 * hh:mm:ss chimed[PID]: line"), which journald and rsyslog both take.
 * True if sent, or if it never will be (no syslog here: not counted).
 */
static bool sl_send(int level, const char *line, size_t len)
{
	char msg[1200];
	size_t n = 0;
	struct tm tm;
	time_t t = time(NULL);
	int k;

	if (!sl_connect())
		return true;
	k = snprintf(msg, sizeof(msg), "<%d>", LOG_DAEMON | (level & LOG_PRIMASK));
	if (k > 0)
		n = (size_t)k;
	if (localtime_r(&t, &tm))
		n += strftime(msg + n, sizeof(msg) - n, "%b %e %H:%M:%S ", &tm);
	k = snprintf(msg + n, sizeof(msg) - n, "chimed[%d]: %.*s", (int)getpid(), (int)len, line);
	if (k > 0)
		n += (size_t)k;
	if (n > sizeof(msg) - 1)
		n = sizeof(msg) - 1;
	msg[n] = '\0';
	n += sl_stream;         /* a stream's lines end in their NUL */
	for (int attempt = 0; attempt < 2; attempt++) {
		ssize_t sent = send(sl_fd, msg, n, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (sent == (ssize_t)n)
			return true;
		if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS))
			return false;
		/*
		 * The receiver went away (a syslog daemon restarted): connect
		 * anew, once. Or a stream took part of the line: the rest would
		 * run into the next one, so the connection goes, and the line.
		 */
		sl_close();
		if (sent >= 0 || !sl_connect())
			return sent < 0;
	}
	return true;
}

static void sl_line(int level, const char *line, size_t len)
{
	pthread_mutex_lock(&sl_lock);
	if (sl_dropped) {
		char note[160];
		int n = snprintf(note, sizeof(note), "%llu log lines dropped here: syslog had no room (its reader "
				 "was not reading)", (unsigned long long)sl_dropped);

		if (n <= 0 || (size_t)n >= sizeof(note) || !sl_send(LOG_WARNING, note, (size_t)n)) {
			sl_dropped++;
			pthread_mutex_unlock(&sl_lock);
			return;
		}
		sl_dropped = 0;
	}
	if (!sl_send(level, line, len))
		sl_dropped++;
	pthread_mutex_unlock(&sl_lock);
}

void log_use_syslog(void)
{
	bool ok;
	int err;

	pthread_mutex_lock(&sl_lock);
	sl_close();
	ok = sl_connect();
	err = errno;
	pthread_mutex_unlock(&sl_lock);
	/*
	 * Said on the starter's stderr while there still is one: without it, a
	 * daemon on a host with no syslog daemon (a container, a minimal
	 * system) logged nothing anywhere, its errors included.
	 */
	if (!ok)
		log_errno_hint(LOG_WARNING, err, "its lines are lost until a syslog daemon listens there, tried "
			       "again every second; chimed --foreground logs to standard error",
			       "no syslog at '%s'", SYSLOG_PATH);
	to_syslog = true;
	log_stderr_reset();     /* the starter's stderr, opened again for ourselves: a daemon holds none of it */
}

void log_stderr_setup(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (fstat(STDERR_FILENO, &st) < 0)
		return;
	to_journal = env && sscanf(env, "%llu:%llu", &dev, &ino) == 2 &&
		     (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
	if (S_ISSOCK(st.st_mode)) {
		err_sock = true;
	} else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
		/* A new open file description: O_NONBLOCK is ours alone. A FIFO with no reader: ENXIO. */
		int fd = open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);

		if (fd >= 0)
			err_fd = fd;
		else
			err_poll = true;
	}
}

/* One line, whole or not at all if its reader is behind (a pipe takes up to PIPE_BUF whole). */
static bool err_write(const char *buf, size_t len)
{
	struct pollfd p = { .fd = STDERR_FILENO, .events = POLLOUT };
	ssize_t n;

	/*
	 * Room for a page: a line (under PIPE_BUF) goes in whole. Not atomic
	 * with the write (another thread's line may take the room first and
	 * this one wait), but a pipe nobody reads stops every line here.
	 */
	if (err_poll && (poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT)))
		return false;
	n = err_sock ? send(STDERR_FILENO, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) : write(err_fd, buf, len);

	return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

void log_reopen(void)
{
	int saved = errno;

	if (to_syslog) {
		pthread_mutex_lock(&sl_lock);
		sl_close();
		(void)sl_connect();
		pthread_mutex_unlock(&sl_lock);
	}
	errno = saved;
}

bool log_ratelimit(uint64_t *last, unsigned interval_s)
{
	struct timespec ts;
	uint64_t now;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec + 1;  /* +1: a stamp of 0 means "never" */
	if (*last && now - *last < interval_s)
		return false;
	*last = now;
	return true;
}

bool log_budget_take(struct log_budget *b, unsigned per_s, const char *what)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	if ((uint64_t)ts.tv_sec != b->sec) {
		b->sec = (uint64_t)ts.tv_sec;
		b->used = 0;
	}
	if (b->used >= per_s) {
		b->dropped++;
		return false;
	}
	b->used++;
	if (b->dropped) {
		log_msg(LOG_NOTICE, "%llu %s lines not logged (more than %u a second; chimestat counts every client)",
			(unsigned long long)b->dropped, what, per_s);
		b->dropped = 0;
	}
	return true;
}

static const char *level_prefix(int level)
{
	switch (level) {
	case LOG_EMERG:
	case LOG_ALERT:
	case LOG_CRIT:
	case LOG_ERR:
		return "error: ";
	case LOG_WARNING:
		return "warning: ";
	case LOG_DEBUG:
		return "debug: ";
	default:
		return "";
	}
}

static void __attribute__((format(printf, 4, 0)))
log_write(int level, int err, const char *hint, const char *fmt, va_list ap)
{
	char buf[1024];
	size_t len;
	int n;

	/* sl_send() adds the ident and the priority itself. */
	if (to_syslog)
		n = 0;
	else if (to_journal)    /* sd-daemon(3) prefixes; the journal names us itself */
		n = snprintf(buf, sizeof(buf), "<%d>%s", level, level_prefix(level));
	else
		n = snprintf(buf, sizeof(buf), "chimed: %s", level_prefix(level));
	len = n > 0 ? (size_t)n : 0;
	n = vsnprintf(buf + len, sizeof(buf) - len, fmt, ap);
	if (n > 0)
		len += (size_t)n;
	if (len > sizeof(buf) - 2)
		len = sizeof(buf) - 2;      /* truncated: still one whole line */
	if (err) {
		char why[sizeof(buf) / 4];
		size_t wl;

		n = snprintf(why, sizeof(why), ": %s%s%s%s", strerror(err), hint ? " (" : "", hint ? hint : "",
			     hint ? ")" : "");
		wl = n > 0 ? ((size_t)n < sizeof(why) ? (size_t)n : sizeof(why) - 1) : 0;
		/* the reason kept whole, the message cut before it if both do not fit (a long path ate it) */
		if (len + wl > sizeof(buf) - 2)
			len = sizeof(buf) - 2 - wl;
		memcpy(buf + len, why, wl);
		len += wl;
	}
	if (to_syslog) {
		sl_line(level, buf, len);
		return;
	}
	buf[len++] = '\n';
	/* One write per line; a short write to a dying terminal is not worth a retry loop. */
	if (__atomic_load_n(&err_dropped, __ATOMIC_RELAXED)) {
		uint64_t lost = __atomic_exchange_n(&err_dropped, 0, __ATOMIC_RELAXED);
		char note[160];

		n = snprintf(note, sizeof(note), "%swarning: %llu log lines dropped here: stderr was full (its "
			     "reader was not reading)\n", to_journal ? "<4>" : "chimed: ", (unsigned long long)lost);
		if (lost && n > 0 && (size_t)n < sizeof(note) && !err_write(note, (size_t)n)) {
			__atomic_fetch_add(&err_dropped, lost + 1, __ATOMIC_RELAXED);
			return;
		}
	}
	if (!err_write(buf, len))
		__atomic_fetch_add(&err_dropped, 1, __ATOMIC_RELAXED);
}

void log_msg(int level, const char *fmt, ...)
{
	va_list ap;
	int saved = errno;

	if (level > log_max_level)
		return;
	va_start(ap, fmt);
	log_write(level, 0, NULL, fmt, ap);
	va_end(ap);
	errno = saved;
}

static int __attribute__((format(printf, 4, 0)))
log_verrno(int level, int err, const char *hint, const char *fmt, va_list ap)
{
	int saved = errno;

	if (err < 0)
		err = -err;
	if (level <= log_max_level)
		log_write(level, err, hint, fmt, ap);
	errno = saved;
	return -err;
}

int log_errno(int level, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err = log_verrno(level, err, NULL, fmt, ap);
	va_end(ap);
	return err;
}

int log_errno_hint(int level, int err, const char *hint, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err = log_verrno(level, err, hint, fmt, ap);
	va_end(ap);
	return err;
}

/* path in single quotes for a shell, each ' as '\'' (too long for buf: the path bare). */
static const char *sh_quoted(const char *path, char *buf, size_t size)
{
	size_t n = 0;

	buf[n++] = '\'';
	for (const char *p = path; *p; p++) {
		if (n + 5 >= size)
			return path;
		if (*p == '\'') {
			memcpy(buf + n, "'\\''", 4);
			n += 4;
		} else {
			buf[n++] = *p;
		}
	}
	buf[n++] = '\'';
	buf[n] = '\0';
	return buf;
}

int log_file_not_ours(const char *what, const char *path, const struct stat *st, const char *remedy)
{
	char quoted[1024];

	if (st->st_uid != geteuid() && st->st_uid != 0)
		log_msg(LOG_ERR, "%s '%s' belongs to uid %u, not to this broker's (%u) or root: not using it "
			"(another user can write in its directory?); %s", what, path, (unsigned)st->st_uid,
			(unsigned)geteuid(), remedy);
	else if (st->st_nlink > 1)
		/*
		 * Or a second name given to the broker's own file (a hard-link
		 * backup, cp -al): then removing that other name keeps the
		 * sessions, and find shows which it is. Never said as the way:
		 * the other name may be /etc/shadow.
		 */
		log_msg(LOG_ERR, "%s '%s' has %lu links (another name for someone's file, made by a user who can "
			"write in its directory?): not using it; %s (find / -xdev -samefile %s lists its names: "
			"if it is the broker's own file and another name is a hard-link copy of it, removing that "
			"copy instead keeps it)", what, path, (unsigned long)st->st_nlink, remedy,
			sh_quoted(path, quoted, sizeof(quoted)));
	else if (st->st_uid != geteuid())
		/* root's, we are not: fchmod() refused (root made it writable to others by hand), or an immutable open */
		log_msg(LOG_ERR, "%s '%s' is root's, and this broker (uid %u) may not set its mode or write it: "
			"not using it; %s, or give it to the broker's user (chown %u)", what, path,
			(unsigned)geteuid(), remedy, (unsigned)geteuid());
	else    /* ours, one name: the EPERM was the open's or fchmod's (it said "has 1 links" of these) */
		log_msg(LOG_ERR, "%s '%s' cannot be opened for writing: %s (immutable or append-only? lsattr "
			"shows it, chattr -i -a clears it): not using it", what, path, strerror(EPERM));
	return -EPERM;
}
