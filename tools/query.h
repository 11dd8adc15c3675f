/* SPDX-License-Identifier: MIT */
/*
 * query.h - ask the broker about the caller's own clients and timers over its
 * socket (struct chime_hello with a CHIME_HELLO_QUERY_* flag, or
 * CHIME_HELLO_DROP_SESSION): what chimectl
 * does for a user who may connect but not read the broker's segments.
 */
#ifndef CHIME_QUERY_H
#define CHIME_QUERY_H

#include <stddef.h>
#include <stdint.h>

#include "chime_shm.h"

/* The broker answers at most one query per this (broker/handshake.c): query_broker() waits past it. */
#define QUERY_INTERVAL_MS 50
/* How long query_broker() keeps retrying while the broker says -EBUSY (another query was just answered). */
#define QUERY_BUSY_WAIT_MS 1000

/*
 * Which step a query failed at: the same errno means different things at
 * each (-EACCES: the socket's permissions, the broker's policy, or another
 * user's client or session).
 */
enum query_step {
	QUERY_CONNECT,  /* socket(2), connect(2): -ENOENT no broker listens, -EACCES the socket's permissions,
			 * -EPERM a listener this user does not trust (chime_broker_trusted()),
			 * -ETIMEDOUT its queue stayed full for 5 s */
	QUERY_HELLO,    /* the broker refused the hello: -EACCES not admitted, -EPROTO another layout */
	QUERY_ANSWER,   /* the answer's status, or it ended early (-ECONNRESET) or never came (-ETIMEDOUT) */
};

/*
 * Send the query (about the client of `pid`, or of the named `session` if
 * that is not NULL), receive the head into *head and up to `limit` records of
 * `recsz` bytes into recs (head->count of them). 0, or -errno with *step
 * (if not NULL) saying where: of connect (-ENOENT: no broker, -EPERM: a
 * listener libchime would not trust either, not asked), of the hello
 * (-EACCES, -EPROTO), or of the answer (-ECONNRESET: it ended early, or the
 * head's status: -ESRCH, -EACCES, -EPERM, -EBUSY). -EBUSY (the broker just
 * answered another query) and -EAGAIN (too many of our user's connections
 * wait to say hello) are retried for QUERY_BUSY_WAIT_MS before they are
 * returned.
 */
int query_broker(const char *sock, uint32_t kind, int32_t pid, const char *session, uint64_t limit,
		 struct chime_query_head *head, void *recs, size_t recsz, enum query_step *step);

/*
 * A query's whole time, from its connect to its last record: a broker (any
 * user's, on a socket an operator names) that sent a record every few
 * seconds kept a query, and a <Tab> of the shell completion, waiting for
 * an hour (found by a security audit). What came by then is kept, as for
 * an answer cut short (-ECONNRESET).
 */
#define QUERY_ANSWER_NS (10 * UINT64_C(1000000000))

/* query_broker() within a time of the caller's too: until give_up (CLOCK_MONOTONIC ns), for a listing of pages. */
int query_broker_by(const char *sock, uint32_t kind, int32_t pid, const char *session, uint64_t limit,
		    struct chime_query_head *head, void *recs, size_t recsz, enum query_step *step,
		    uint64_t give_up);

/*
 * CHIME_HELLO_DROP_SESSION of `name` (too long: -EINVAL at QUERY_HELLO); as
 * query_broker(), but -EBUSY is the session's: a process has it attached.
 */
int query_drop_session(const char *sock, const char *name, enum query_step *step);

#endif /* CHIME_QUERY_H */
