/* SPDX-License-Identifier: MIT */
/*
 * discard.h - a finished connection's segments are emptied and unmapped on a
 * thread of their own, not the control thread's.
 *
 * Punching the pages out (chime_seg_discard()) tears them out of every
 * mapping of the memfd, and a client may map one thousands of times and
 * fault them all in: a review measured 1.6 s for 1 MiB under 60,000 such
 * mappings. On the control thread that stalled every handshake and, past
 * WatchdogSec, got the broker killed.
 */
#ifndef CHIME_DISCARD_H
#define CHIME_DISCARD_H

#include <stdbool.h>
#include <stdint.h>

#include "segment.h"

struct discard;

/* Start the thread (idle priority): 0, or -errno. */
int discard_start(struct discard **d);

/*
 * Hand over n mappings of a connection of user uid (its acct_uid), which
 * the caller forgets: the thread punches their pages out and unmaps them,
 * in order. Never blocks on the thread. With `max` of that user's jobs
 * waiting already, or out of memory, they are unmapped here without the
 * punch: the thread runs at idle priority, which anyone can starve of CPU
 * (or hold up with one slow punch), and each job waiting keeps its
 * mappings in the broker, pages and all. O(jobs waiting), under the lock.
 */
void discard_post(struct discard *d, struct chime_map *maps, unsigned n, uint32_t uid, unsigned max);

/* Unmap what is still queued (no punch: the broker is stopping) and join the thread; NULL is fine. */
void discard_stop(struct discard *d);

#endif /* CHIME_DISCARD_H */
