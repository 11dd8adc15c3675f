/* SPDX-License-Identifier: MIT */
/*
 * discard.h - a finished connection's segments are emptied on a thread of
 * their own, not the control thread's.
 *
 * Punching the pages out (chime_seg_discard()) tears them out of every
 * mapping of the memfd, and a client may map one thousands of times and
 * fault them all in: a review measured 1.6 s for 1 MiB under 60,000 such
 * mappings. On the control thread that stalled every handshake and, past
 * WatchdogSec, got the broker killed.
 *
 * The thread gets descriptors, never mappings: the control thread unmaps
 * its own (its page tables only), in steps. Unmapping here, and
 * punching through the mapping (MADV_REMOVE), took the broker's mmap_lock
 * at idle priority: any user's busy loops starved the thread while it
 * held the lock, and the control thread's next mmap (every chime_open())
 * waited for it, heartbeat and all (an audit: heartbeats 250-909 ms old
 * with 3 busy loops and 2 open/close loops of one user, 2 CPUs).
 *
 * A thread waits for jobs at normal priority and goes to idle priority
 * as it takes one, then exits once it has none (an unprivileged process
 * cannot come back from SCHED_IDLE); the next is started by
 * discard_step(). A broker is reaped once all of its threads have
 * exited, and a killed one waited for its thread at idle priority, the
 * last to get a CPU beside any busy loop: SIGKILL to waitpid() 0.4-0.6 s
 * (median), up to 2.6 s, with 3 busy loops on 2 CPUs; 10-20 ms now.
 *
 * A writable segment its client never sealed (an attach that failed
 * before it did) it may still punch: our munmap of it would wait for the
 * punch under way, 200-330 ms on the control thread with 60,000 mappings
 * of the client's (a review). Such a segment is sealed against writes
 * first, on a sealer thread at normal priority (a seal costs no CPU, only
 * a wait for the memfd's inode lock), and unmapped once sealed
 * (discard_post()). The client can hold that lock for as long as it
 * likes (a write() to the memfd from a buffer whose page fault it serves:
 * FUSE, userfaultfd), so a sealer held up for a second leaves the rest to
 * another (up to 16), a user has one seal under way at a time (its
 * client holds up its own user's later segments, not another's), and a
 * stop waits a second for them at most (a review: one sealer for all held
 * up every user's refused segments, and the stop, for as long as one
 * client liked). For the same reason only
 * the ro segment is ever punched: the client cannot write it.
 */
#ifndef CHIME_DISCARD_H
#define CHIME_DISCARD_H

#include <stdbool.h>
#include <stdint.h>

#include "segment.h"

struct discard;

/* Start the first thread (idle priority once it has a job): 0, or -errno. */
int discard_start(struct discard **d);

/*
 * Hand over n segments of a connection of user uid (its acct_uid), which
 * the caller forgets (maps[] zeroed, fds[] set to -1): our mapping of
 * each, and a writable descriptor of its memfd, whose first sizes[i]
 * bytes are punched out (0: none; a punch takes the memfd's inode lock,
 * which a client that can write the memfd can hold for good). Queued
 * for discard_step(), on the caller's thread: munmap costs our page
 * tables (50 us for a session's segments here), and 2500 sessions parked
 * at once, unmapped in a row, held another user's open 117-148 ms.
 *
 * Bit i of `unsealed`: segment i is one the client may still punch holes
 * in (a writable memfd of its own, not sealed against writes: an attach
 * that failed before the client sealed). Our munmap of it would wait for
 * a punch under way, for as long as the client's mappings make it: it is
 * sealed first (F_SEAL_FUTURE_WRITE, on a thread of its own, since the
 * seal waits out that punch too), then unmapped. One the client sealed
 * for good without that seal (F_SEAL_SEAL) stays mapped until the broker
 * exits: counted for its user (discard_unsealed()).
 */
void discard_post(struct discard *d, struct chime_map *maps, int *fds, const size_t *sizes, unsigned n,
		  uint32_t uid, unsigned max, unsigned unsealed);

/*
 * User uid's segments waiting for that seal, or kept mapped for good
 * without it. The caller's thread only; O(such segments of all users).
 */
unsigned discard_unsealed(const struct discard *d, uint32_t uid);

/*
 * For about budget_ns at most (one at least), what discard_post() queued:
 * unmapped, then its descriptors to the thread, which punches their pages
 * out and closes them. Frees the jobs run, and starts a thread in place
 * of one that has exited, never waiting for it or for the lock: while the
 * thread holds it, the jobs wait for a later call (at most 64 of them;
 * older ones are closed here without the punch). With `max` of that
 * user's jobs waiting for the thread already, or out of memory, they are
 * closed here without the punch: the thread runs at idle priority, which
 * anyone can starve of CPU (or hold up with one slow punch), and each job
 * waiting keeps its memfds' pages. True if some remain for the next
 * call at once (false while the thread holds the lock). O(jobs waiting)
 * each, under the lock.
 */
bool discard_step(struct discard *d, uint64_t budget_ns);

/* The control loop's budget for it, per iteration: about a handshake's cost. */
#define DISCARD_STEP_NS (UINT64_C(300) * 1000u)

/*
 * Unmap and close what is still queued (no punch: the broker is stopping)
 * and join the discard thread; the sealers end the seals they are in, for
 * a second at most, and one still held up then keeps its job and `d`
 * until the exit. NULL is fine. A segment still unsealed stays mapped,
 * for the exit to unmap: that waits for a punch under way too, but the
 * lock file goes before it, so the next broker need not wait.
 */
void discard_stop(struct discard *d);

#endif /* CHIME_DISCARD_H */
