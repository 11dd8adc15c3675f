/* SPDX-License-Identifier: MIT */
/*
 * discard.h - a finished connection's segments are emptied by a helper
 * process, not the control thread.
 *
 * Punching the pages out (chime_seg_discard()) tears them out of every
 * mapping of the memfd, and a client may map one thousands of times and
 * fault them all in: a review measured 1.6 s for 1 MiB under 60,000 such
 * mappings. On the control thread that stalled every handshake and, past
 * WatchdogSec, got the broker killed. So it runs at idle priority, on
 * CPU nobody else wants, and anyone's busy loops can starve it.
 *
 * A starved thread of the broker's held the broker up, whatever it did:
 * punching through the broker's mappings and unmapping them held its
 * mmap_lock (heartbeats 250-909 ms old in an audit); a thread waiting for
 * work at idle priority held up every kill of the broker (reaped once its
 * last thread exits: 0.4-2.6 s with 3 busy loops on 2 CPUs); and a
 * thread that went to idle priority with its first job and exited when
 * done still stalled the control thread now and then (heartbeats 2.3-3.9
 * s old in 2 of 8 runs with it pinned beside 24 busy loops, once in CI),
 * its stack never caught. The likeliest cause: its exit takes the
 * mmap_lock for reading (exit_mm()), a rw semaphore hands it to a reader
 * that waited behind a writer, and the thread then held it while it
 * waited for a CPU, with the control thread's next mmap behind it.
 *
 * Now a process of its own does it, the "chimed-discard" child: its own
 * memory, its own locks, and the broker exits without it. It is chimed
 * run again (posix_spawn()), not forked: a fork shared every page of the
 * broker's with it until the broker wrote the page again, and each such
 * write was a copy and a TLB flush of every CPU the broker had run on,
 * waiting for each (one with interrupts off, in a user's epoll walk, held
 * the writer for the walk). It gets descriptors, never mappings (the
 * control thread unmaps its own, in steps), over a socket pair, one
 * datagram a job, and answers a byte for each one done; it holds no other
 * descriptor, and dies with the broker (PR_SET_PDEATHSIG). One killed is
 * replaced a second later.
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
#include <sys/types.h>

#include "segment.h"

struct discard;

/* The helper's argv[0] and name, and its socket's descriptor there. */
#define DISCARD_HELPER_NAME "chimed-discard"
#define DISCARD_HELPER_FD 3

/*
 * Start the helper: exe (chimed: "/proc/self/exe", itself, even once
 * replaced on disk) run as DISCARD_HELPER_NAME, at idle priority. 0, or
 * -errno. The thread that calls it and discard_step() must outlive the
 * helper's use: the helper dies with it. The broker should reap its
 * children (SIGCHLD ignored): a helper killed is not waited for.
 */
int discard_start(struct discard **d, const char *exe);

/*
 * The helper, for chimed's main() when run as DISCARD_HELPER_NAME with the
 * broker's pid: gets jobs on DISCARD_HELPER_FD, punches and closes their
 * descriptors, and answers a byte for each. It holds that socket alone,
 * and exits if the broker is not its parent or is gone.
 */
_Noreturn void discard_helper_main(const char *parent_pid);

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
 * unmapped, then its descriptors to the helper, which punches their pages
 * out and closes them; the helper's answers taken. Never waits for the
 * helper: its socket takes some (about 280 with the default send
 * buffer, net.core.wmem_default), and the rest wait here, their
 * descriptors open. With `max` of that user's jobs waiting for it
 * already (queued or sent), with no helper, or out of memory, they are
 * closed here without the punch: the helper runs at idle priority, which
 * anyone can starve of CPU (or hold up with one slow punch), and each job
 * waiting keeps its memfds' pages. Forks a helper in place of one lost,
 * a second after. True if some remain to unmap at once. O(jobs waiting).
 */
bool discard_step(struct discard *d, uint64_t budget_ns);

/*
 * The helper's socket while it owes answers (jobs sent), for the caller to
 * poll for POLLIN and step when it is readable; else -1. A poll armed on
 * it may outlive it (a helper lost): it ends with the helper's end.
 */
int discard_poll_fd(const struct discard *d);

/* The helper's pid, 0 while there is none (lost, and not replaced yet). */
pid_t discard_helper(const struct discard *d);

/* Helpers lost so far (killed, or their socket failed): one is forked in place of each. */
unsigned discard_helpers_lost(const struct discard *d);

/* The control loop's budget for it, per iteration: about a handshake's cost. */
#define DISCARD_STEP_NS (UINT64_C(300) * 1000u)

/*
 * Unmap and close what is still queued (no punch: the broker is stopping)
 * and kill the helper, not waiting for it (what it has is closed with
 * it); the sealers end the seals they are in, for a second at most, and
 * one still held up then keeps its job and `d` until the exit. NULL is
 * fine. A segment still unsealed stays mapped, for the exit to unmap:
 * that waits for a punch under way too, but the lock file goes before it,
 * so the next broker need not wait.
 */
void discard_stop(struct discard *d);

#endif /* CHIME_DISCARD_H */
