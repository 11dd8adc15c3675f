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

/*
 * Send the query, receive the head into *head and up to `limit` records of
 * `recsz` bytes into recs (head->count of them). 0, or -errno: of connect
 * (-ENOENT: no broker), -EACCES/-EPROTO (refused), -ECONNRESET (the answer
 * ended early), or the head's status (-ESRCH, -EACCES, -EBUSY).
 */
int query_broker(const char *sock, uint32_t kind, int32_t pid, uint64_t limit,
		 struct chime_query_head *head, void *recs, size_t recsz);

/* CHIME_HELLO_DROP_SESSION of `name` (too long: -EINVAL); the head's status as query_broker(). */
int query_drop_session(const char *sock, const char *name);

#endif /* CHIME_QUERY_H */
