/* SPDX-License-Identifier: MIT */
/* query.c - see query.h. */
#include "query.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "segment.h"        /* chime_broker_trusted(), chime_recv_behind_reset() */

#define QUERY_TIMEOUT_S 5       /* each step: the connect, the hello, each message of the answer */

static ssize_t recv_msg(int fd, void *buf, size_t len)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	do
		n = recvmsg(fd, &msg, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == ECONNRESET)
		n = chime_recv_behind_reset(fd, &msg, 0);
	return n;
}

/*
 * Bound fd's next send and receive (and so a connect) by QUERY_TIMEOUT_S and
 * by what is left until give_up (CLOCK_MONOTONIC ns); false: nothing left.
 */
static bool time_left(int fd, uint64_t give_up)
{
	uint64_t now = now_ns(), left = now < give_up ? give_up - now : 0;
	struct timeval tv = { .tv_sec = QUERY_TIMEOUT_S };

	if (!left)
		return false;
	if (left < (uint64_t)QUERY_TIMEOUT_S * 1000000000u) {
		tv.tv_sec = (time_t)(left / 1000000000u);
		tv.tv_usec = (suseconds_t)(left % 1000000000u / 1000u);
		if (!tv.tv_sec && !tv.tv_usec)
			tv.tv_usec = 1;         /* 0 would be no bound at all */
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return true;
}

static int ask(const char *sock, const struct chime_hello *hello, uint64_t limit,
	       struct chime_query_head *head, void *recs, size_t recsz, enum query_step *step, uint64_t give_up)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const struct chime_hello h = *hello;
	uint64_t got = 0;
	ssize_t n;
	int fd, r = 0;

	*step = QUERY_CONNECT;
	memset(head, 0, sizeof(*head));
	if (strlen(sock) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, sock, strlen(sock));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/*
	 * The send timeout bounds the connect too: a listener whose queue is
	 * full (a broker stopped or wedged, or one user's connect loop) kept it
	 * waiting for good, as chime_open() did before its own.
	 */
	if (!time_left(fd, give_up)) {
		r = -ETIMEDOUT;
		goto out;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = errno == ECONNREFUSED ? -ENOENT : errno == EPERM ? -EACCES :
		    errno == EAGAIN || errno == EINPROGRESS ? -ETIMEDOUT : -errno;
		goto out;
	}
	/* As libchime's: a hello names a session, and an answer is believed, only from a trusted broker. */
	{
		struct ucred cr;
		socklen_t len = sizeof(cr);

		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
			r = -errno;
			goto out;
		}
		r = chime_broker_trusted(sock, cr.uid, geteuid());
		if (r <= 0) {
			r = r < 0 ? r : -EPERM;
			goto out;
		}
		r = 0;
	}
	*step = QUERY_HELLO;
	if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h)) {
		r = -ECONNRESET;
		goto out;
	}
	/* A refusal is a 64-byte welcome with a status; an answer starts with a 32-byte head. */
	{
		union {
			struct chime_query_head q;
			struct chime_welcome w;
		} u;

		n = time_left(fd, give_up) ? recv_msg(fd, &u, sizeof(u)) : (errno = EAGAIN, -1);
		if (n == (ssize_t)sizeof(u.w) && u.w.magic == CHIME_HELLO_MAGIC) {
			r = u.w.status < 0 ? u.w.status : -EPROTO;
			goto out;
		}
		*step = QUERY_ANSWER;
		if (n != (ssize_t)sizeof(u.q) || u.q.magic != CHIME_HELLO_MAGIC) {
			/* a hang-up, or bytes that are no broker's answer (something else listens there) */
			r = n < 0 && errno == EAGAIN ? -ETIMEDOUT : n <= 0 ? -ECONNRESET : -EBADMSG;
			goto out;
		}
		*head = u.q;
	}
	if (head->status < 0) {
		r = head->status;
		goto out;
	}
	if (head->count > limit)
		head->count = limit;
	while (got < head->count) {
		if (!time_left(fd, give_up)) {
			head->count = got;      /* what arrived is good; the rest is too slow */
			r = -ECONNRESET;
			break;
		}
		n = recv_msg(fd, (char *)recs + got * recsz, (head->count - got) * recsz);
		if (n <= 0 || n % (ssize_t)recsz) {
			head->count = got;      /* what arrived is good; the rest did not */
			r = -ECONNRESET;
			break;
		}
		got += (uint64_t)n / recsz;
	}
out:
	close(fd);
	return r;
}

/*
 * The broker answers one query per QUERY_INTERVAL_MS for everyone (a timers
 * query reads every node): a second chimectl right after the first is told
 * -EBUSY, and is simply a little early. Wait a bit more than the interval.
 */
/* The hello's session name; false: too long for it. */
static bool hello_session(struct chime_hello *h, const char *name)
{
	size_t n = strlen(name);

	if (n >= sizeof(h->session))
		return false;
	memcpy(h->session, name, n);
	return true;
}

/*
 * ask(), again while the broker says -EAGAIN (too many of our user's
 * connections waiting to say hello: a burst of chime_open()s) or, if
 * busy_too, answers -EBUSY (another query answered meanwhile; a drop's
 * -EBUSY is its answer: the session is in use), for up to
 * QUERY_BUSY_WAIT_MS.
 */
static int ask_patiently(const char *sock, const struct chime_hello *h, uint64_t limit,
			 struct chime_query_head *head, void *recs, size_t recsz, enum query_step *step,
			 bool busy_too, uint64_t give_up)
{
	const struct timespec pause = { 0, (QUERY_INTERVAL_MS + 10) * 1000000L };
	uint64_t t0 = now_ns();
	int r;

	while (((r = ask(sock, h, limit, head, recs, recsz, step, give_up)) == -EBUSY && busy_too &&
		*step == QUERY_ANSWER) || r == -EAGAIN) {
		if (now_ns() - t0 >= QUERY_BUSY_WAIT_MS * UINT64_C(1000000) || now_ns() >= give_up)
			break;
		nanosleep(&pause, NULL);
	}
	return r;
}

int query_broker(const char *sock, uint32_t kind, int32_t pid, const char *session, uint64_t limit,
		 struct chime_query_head *head, void *recs, size_t recsz, enum query_step *step)
{
	return query_broker_by(sock, kind, pid, session, limit, head, recs, recsz, step,
			       now_ns() + QUERY_ANSWER_NS);
}

int query_broker_by(const char *sock, uint32_t kind, int32_t pid, const char *session, uint64_t limit,
		    struct chime_query_head *head, void *recs, size_t recsz, enum query_step *step,
		    uint64_t give_up)
{
	struct chime_hello h = {
		.magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
		.flags = kind, .pid = pid, .limit = limit,
	};
	uint64_t own = now_ns() + QUERY_ANSWER_NS;
	enum query_step dummy;

	if (!step)
		step = &dummy;
	*step = QUERY_HELLO;
	if (session && !hello_session(&h, session))
		return -EINVAL;
	/* each query has QUERY_ANSWER_NS at most, whatever is left of the caller's time */
	return ask_patiently(sock, &h, limit, head, recs, recsz, step, true, own < give_up ? own : give_up);
}

int query_drop_session(const char *sock, const char *name, enum query_step *step)
{
	struct chime_hello h = {
		.magic = CHIME_HELLO_MAGIC, .layout = CHIME_SHM_LAYOUT,
		.flags = CHIME_HELLO_DROP_SESSION,
	};
	struct chime_query_head head;
	enum query_step dummy;

	if (!step)
		step = &dummy;
	*step = QUERY_HELLO;
	if (!hello_session(&h, name))
		return -EINVAL;
	return ask_patiently(sock, &h, 0, &head, NULL, 0, step, false, now_ns() + QUERY_ANSWER_NS);
}
