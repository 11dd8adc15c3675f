/* SPDX-License-Identifier: MIT */
/*
 * chime_shm.h - the shared-memory contract between chimed, libchime and the tools.
 *
 * Everything that crosses a process boundary is defined here and nowhere else:
 * segment layouts, the submission and completion records, the timer node, the
 * timer id encoding and the socket handshake. Any incompatible change bumps
 * CHIME_SHM_LAYOUT.
 *
 * Rules (DESIGN.md invariants 4 and 5):
 * - fixed-width types only, explicit padding, no pointers (every process maps a
 *   segment at its own address: things are found by byte offset or 32-bit index);
 * - fields written by different sides sit on different cache lines, and a
 *   producer index and its consumer index sit 128 bytes apart (adjacent-line
 *   prefetcher);
 * - every struct here carries _Static_asserts on its size and field offsets;
 * - the broker never trusts memory a client can write: every index, count or
 *   sequence it reads from a client's writable segment is bounded by the
 *   broker's private copy before use.
 *
 * Segments (see ARCHITECTURE.md for the picture):
 *   control   one per broker, file "<socket>.ctl"; broker writes, everybody reads.
 *   shard     one per shard, file "<socket>.shard<N>"; broker writes, tools read.
 *   client rw one per client, sealed memfd; the client writes, the broker reads
 *             (bounded) and writes a few broker-owned words (slot seq, grants).
 *   client ro one per client, sealed memfd, mode 0400, handed to the client as
 *             an O_RDONLY descriptor; the broker writes, the client can only
 *             read.
 */
#ifndef CHIME_SHM_H
#define CHIME_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"

#define CHIME_SHM_MAGIC   UINT64_C(0x0031454d49484321) /* "!CHIME1" in LE bytes */
#define CHIME_SHM_LAYOUT  5u                           /* bump on ANY incompatible change */
#define CHIME_CACHELINE   64u

/* Segment kinds, stored in every segment header so a file can't be mistaken for another. */
#define CHIME_SEG_CONTROL   1u
#define CHIME_SEG_SHARD     2u
#define CHIME_SEG_CLIENT_RW 3u
#define CHIME_SEG_CLIENT_RO 4u
#define CHIME_SEG_PUBLIC    5u   /* what every client reads of the broker (struct chime_pub) */

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shm atomics must be lock-free");
_Static_assert(sizeof(void *) == 8, "chime's shm layout assumes a 64-bit target");

/*
 * Common segment header: the first 64 bytes of every segment.
 *
 * field      | writer           | readers | ordering
 * magic      | creator, LAST    | all     | release store by creator; readers acquire-load:
 *            |                  |         | 0 = not ready (-EAGAIN), other = wrong file
 * layout     | creator, once    | all     | before magic
 * kind       | creator, once    | all     | before magic
 * size       | creator, once    | all     | total bytes of the segment; must equal the file size
 */
struct chime_seg_hdr {
	uint64_t magic;
	uint32_t layout;
	uint32_t kind;
	uint64_t size;
	uint8_t  _reserved[40];
};
_Static_assert(sizeof(struct chime_seg_hdr) == 64, "hdr must stay one cache line");
_Static_assert(offsetof(struct chime_seg_hdr, layout) == 8, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_seg_hdr, kind) == 12, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_seg_hdr, size) == 16, "moved: bump CHIME_SHM_LAYOUT");

/* ------------------------------------------------------------------------ */
/* Timer ids                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * A timer id names a node of one shard's slab, and which reuse of that node:
 *
 *   bits 63..40  generation (24 bits, never 0: so an id is never 0)
 *   bits 39..32  shard index
 *   bits 31..0   node index in the shard's slab
 *
 * The broker hands ids out before they are used (a "grant" in every submission
 * slot, see struct chime_sqe), so chime_arm() knows its id with no round trip,
 * and the broker finds a node from an id in O(1) with no hash table. A stale id
 * (its node freed and reused) has a different generation and is ignored.
 */
#define CHIME_ID_GEN_BITS    24u
#define CHIME_ID_GEN_MASK    ((UINT32_C(1) << CHIME_ID_GEN_BITS) - 1u)
#define CHIME_MAX_SHARDS     256u

static inline uint64_t chime_id_make(uint32_t gen, uint32_t shard, uint32_t idx)
{
	return ((uint64_t)(gen & CHIME_ID_GEN_MASK) << 40) | ((uint64_t)(shard & 0xffu) << 32) | idx;
}
static inline uint32_t chime_id_gen(uint64_t id)   { return (uint32_t)(id >> 40) & CHIME_ID_GEN_MASK; }
static inline uint32_t chime_id_shard(uint64_t id) { return (uint32_t)(id >> 32) & 0xffu; }
static inline uint32_t chime_id_index(uint64_t id) { return (uint32_t)id; }

/*
 * A submission slot's grant is a timer id (generation != 0), or, when the
 * shard could not give the slot a node, a marker with generation 0 (never a
 * valid id) saying why. A client that finds a marker publishes a NOP in the
 * slot (so the ring moves on) and fails the arm at once; the shard grants
 * the slot again whenever it consumes one of its records, and sooner when
 * room comes back.
 */
#define CHIME_GRANT_NOMEM UINT64_C(1)   /* no free node: the slab is full (or not reserved) */
#define CHIME_GRANT_QUOTA UINT64_C(2)   /* the client holds --max-timers-per-client nodes */
static inline int chime_grant_is_marker(uint64_t grant) { return chime_id_gen(grant) == 0; }

/* ------------------------------------------------------------------------ */
/* Timer node (the slab of a shard segment)                                    */
/* ------------------------------------------------------------------------ */

/*
 * Node states. The wheel owns FREE, ALLOC, ARMED and EXPIRED; the broker moves
 * ALLOC nodes through its own states (which the wheel leaves alone).
 */
#define CHIME_NODE_FREE     0u  /* free (the shard's private map of free nodes) */
#define CHIME_NODE_ARMED    1u  /* linked into a wheel slot */
#define CHIME_NODE_EXPIRED  2u  /* due: on the wheel's expired list, not yet popped */
#define CHIME_NODE_ALLOC    3u  /* allocated, on no wheel list (fresh, cancelled or popped) */
#define CHIME_NODE_GRANTED  4u  /* broker: id handed to a client in a submission slot, not armed */
#define CHIME_NODE_BACKLOG  5u  /* broker: fired, held until its client's completion ring has room */
#define CHIME_NODE_ACKWAIT  6u  /* broker: one-shot delivered; freed once the client consumed it */

#define CHIME_NIL UINT32_C(0xffffffff) /* the null node index */

/*
 * One timer: 64 bytes, one cache line. Written only by the shard thread that
 * owns the slab; read by tools (chimectl timers) with no ordering guarantee
 * (a racy snapshot is fine there).
 *
 * next/prev link the node into at most one list at a time, chosen by state:
 * a wheel slot (ARMED), the expired list (EXPIRED), or one of its client's
 * per-shard lists (BACKLOG, ACKWAIT). key_next/key_prev link it into
 * the shard's key index bucket while it belongs to a client.
 */
struct chime_node {
	uint64_t key;
	uint64_t user_data;
	uint64_t deadline_ns;   /* absolute CLOCK_MONOTONIC (a wall-clock timer's too: CHIME_NODE_REALTIME) */
	uint64_t period_ns;     /* 0: one-shot */
	uint64_t cq_pos;        /* completion-ring position of its unconsumed event, or CHIME_POS_NONE */
	uint32_t next;
	uint32_t prev;
	uint32_t key_next;
	uint32_t key_prev;
	uint32_t gen;           /* generation of the id that owns the node now (CHIME_ID_GEN_MASK bits;
				 * CHIME_NODE_FLAGS above them) */
	uint16_t owner;         /* client slot */
	uint8_t  state;         /* CHIME_NODE_* */
	uint8_t  level;         /* wheel level while ARMED (its slot follows from deadline) */
};
#define CHIME_POS_NONE UINT64_MAX
/* In node.gen, above the generation: armed already due, so its lateness means nothing. */
#define CHIME_NODE_IMMEDIATE (UINT32_C(1) << 31)
_Static_assert(CHIME_ID_GEN_MASK < CHIME_NODE_IMMEDIATE, "the flag is above the generation");
/* In node.gen: a one-shot whose deadline its client's touch table may move later (chime_touch). */
#define CHIME_NODE_TOUCH (UINT32_C(1) << 30)
_Static_assert(CHIME_ID_GEN_MASK < CHIME_NODE_TOUCH, "the flag is above the generation");
/*
 * In node.gen: a wall-clock timer (chime_arm_realtime()). Its deadline_ns is
 * still the wheel's CLOCK_MONOTONIC deadline, the wall deadline minus the
 * offset named by CHIME_NODE_WALL_B (struct chime_shard_seg.wall_off;
 * ARCHITECTURE.md, "Wall-clock timers").
 */
#define CHIME_NODE_REALTIME (UINT32_C(1) << 29)
/* In node.gen, with CHIME_NODE_REALTIME: its deadline is based on wall_off[1] (clear: wall_off[0]). */
#define CHIME_NODE_WALL_B (UINT32_C(1) << 28)
_Static_assert(CHIME_ID_GEN_MASK < CHIME_NODE_WALL_B, "the flags are above the generation");
#define CHIME_NODE_FLAGS (CHIME_NODE_IMMEDIATE | CHIME_NODE_TOUCH | CHIME_NODE_REALTIME | CHIME_NODE_WALL_B)

_Static_assert(sizeof(struct chime_node) == 64, "a timer is one cache line");
_Static_assert(offsetof(struct chime_node, deadline_ns) == 16, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, cq_pos) == 32, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, next) == 40, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, key_next) == 48, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, gen) == 56, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, owner) == 60, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, state) == 62, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_node, level) == 63, "moved: bump CHIME_SHM_LAYOUT");

/* ------------------------------------------------------------------------ */
/* Timing wheel state (head of a shard's wheel region)                         */
/* ------------------------------------------------------------------------ */

#define CHIME_WHEEL_BITS   6u                          /* slots per level = 64 */
#define CHIME_WHEEL_SLOTS  (1u << CHIME_WHEEL_BITS)
#define CHIME_WHEEL_LEVELS 11u                         /* 11 * 6 >= 64: any uint64 tick fits */

/*
 * The wheel's own state. It precedes the node slab in the region the caller
 * gives wheel_init(); everything in it is derivable from the slab, which is
 * what wheel_rebuild() does. Single writer: the owning shard thread.
 */
struct chime_wheel {
	uint64_t resolution_ns;     /* one tick */
	uint64_t now_tick;          /* ticks of the last advance */
	uint64_t now_ns;            /* time of the last advance */
	uint32_t capacity;          /* nodes in the slab */
	uint32_t high_water;        /* nodes [0, high_water) have been handed out at least once */
	uint32_t free_head;         /* unused, CHIME_NIL: the free nodes are in the shard's private map */
	uint32_t shrunk_from;       /* nodes [high_water, shrunk_from) were given back: an id there is stale
				     * (0 from a broker before it, whose slab never shrank) */
	uint64_t armed;             /* unused, 0: the shard counts its timers privately */
	uint64_t slab_off;          /* byte offset of node 0 from this struct */
	uint32_t expired_head;      /* due timers not yet popped (through next/prev) */
	uint32_t expired_tail;
	uint64_t occupied[CHIME_WHEEL_LEVELS];                 /* bit s: slot s of level is non-empty */
	uint8_t  _pad2[64 - (CHIME_WHEEL_LEVELS * 8) % 64];
	uint32_t slot[CHIME_WHEEL_LEVELS][CHIME_WHEEL_SLOTS];  /* list heads (node index or CHIME_NIL) */
};
_Static_assert(offsetof(struct chime_wheel, occupied) == 64, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_wheel, slot) % 64 == 0, "slot heads start a cache line");
_Static_assert(sizeof(struct chime_wheel) % 64 == 0, "slab follows on a cache line");

/* ------------------------------------------------------------------------ */
/* Submission ring: client threads -> one shard (MPSC)                          */
/* ------------------------------------------------------------------------ */

#define CHIME_OP_NOP        0u  /* ignored (a producer that had to give up a slot) */
#define CHIME_OP_ARM        1u  /* id = the slot's grant; key, deadline_ns, period_ns, user_data */
#define CHIME_OP_RESET      2u  /* id, deadline_ns */
#define CHIME_OP_CANCEL     3u  /* id */
#define CHIME_OP_CANCEL_KEY 4u  /* key */
#define CHIME_OP_RESUMED    5u  /* libchime re-submitted what its old broker never read: the
				 * session's grants kept for that are freed (not public) */
#define CHIME_OP_RESET_TOUCH 6u /* id, deadline_ns: a RESET of a client with a touch table, whose
				 * word (below) holds the deadline to apply (not public) */
#define CHIME_OP_ARM_REALTIME 7u /* an ARM whose deadline_ns is CLOCK_REALTIME (public: CHIME_ARM_REALTIME,
				  * 5); only to a broker with CHIME_WELCOME_F_REALTIME */

/*
 * One submission slot, 64 bytes. The ring is a bounded MPSC queue of such
 * slots with a sequence number per slot (D. Vyukov's bounded queue):
 *
 *   seq == pos            slot is free for the producer of position pos
 *   seq == pos + 1        slot holds the record of position pos (published)
 *   consumer sets seq = pos + size after reading, which frees it for pos + size.
 *
 * field      | writer                      | reader             | ordering
 * seq        | producer (publish),         | both               | producer: record fields, then
 *            | broker (free)               |                    | seq with a full barrier (the
 *            |                             |                    | sleeping-flag check follows);
 *            |                             |                    | broker: grant, then seq (release)
 * grant,     | broker, while slot is free  | producer (ARM)     | before seq=pos+size (release)
 * grant_flags|                             |                    |
 * op..       | producer of pos             | broker             | before seq (release)
 *
 * The broker reads seq once per slot; a value other than pos+1 means "not
 * ready" (it never indexes anything with it). It then copies the record and
 * validates every field: a client scribbling here only loses its own records.
 */
struct chime_sqe {
	uint64_t seq;
	uint64_t grant;         /* a fresh timer id, valid for an ARM written in this slot */
	uint64_t id;            /* ARM: copy of grant; RESET, CANCEL: the target */
	uint64_t key;
	uint64_t deadline_ns;
	uint64_t period_ns;
	uint64_t user_data;
	uint32_t op;            /* CHIME_OP_* */
	uint32_t grant_flags;   /* CHIME_GRANT_F_*, about grant (0 from a broker that sets none) */
};
_Static_assert(sizeof(struct chime_sqe) == 64, "a submission is one cache line");
_Static_assert(offsetof(struct chime_sqe, grant) == 8, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_sqe, id) == 16, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_sqe, op) == 56, "moved: bump CHIME_SHM_LAYOUT");

/* ------------------------------------------------------------------------ */
/* Completion ring: one shard -> one client (SPSC)                              */
/* ------------------------------------------------------------------------ */

#define CHIME_CQE_PERIODIC 0x1u  /* the timer stays armed after this event */

/*
 * One expiration, 64 bytes. Slots live in the client's read-only segment;
 * the producer index (tail) too; the consumer index (head) and the claim
 * words live in the client's writable segment.
 */
struct chime_cqe {
	uint64_t id;
	uint64_t key;
	uint64_t user_data;
	uint64_t deadline_ns;   /* the deadline that fired, in the timer's clock (CLOCK_REALTIME for a
				 * wall-clock timer: the broker reads its own slots back through wall_off) */
	uint64_t fired_ns;      /* when the shard fired it (CLOCK_MONOTONIC) */
	uint32_t flags;         /* CHIME_CQE_* */
	uint32_t _pad;
	uint64_t _reserved[2];
};
_Static_assert(sizeof(struct chime_cqe) == 64, "a completion is one cache line");
_Static_assert(offsetof(struct chime_cqe, fired_ns) == 32, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_cqe, flags) == 40, "moved: bump CHIME_SHM_LAYOUT");

/*
 * Claim words: one uint64 per completion slot, in the client's writable
 * segment, deciding atomically who owns an event that a RESET or CANCEL races
 * with. For the event at position pos:
 *
 *   (pos << 2) | CHIME_CLAIM_FRESH   written by the broker before publishing the event
 *   (pos << 2) | CHIME_CLAIM_TAKEN   the client's CAS from FRESH: it returns the event
 *   (pos << 2) | CHIME_CLAIM_VOID    the broker's CAS from FRESH: a cancel or reset it
 *                                    consumed beat the client; the client skips it
 *
 * Exactly one CAS wins. A value the client did not expect (scribbled) makes it
 * skip the event; a value the broker did not expect makes it treat the event
 * as taken. Either way only that client's timers are affected.
 */
#define CHIME_CLAIM_FRESH 0u
#define CHIME_CLAIM_TAKEN 1u
#define CHIME_CLAIM_VOID  2u

/* ------------------------------------------------------------------------ */
/* Client segments                                                             */
/* ------------------------------------------------------------------------ */

/*
 * Per shard, in the client's WRITABLE segment.
 *
 * field      | writer                   | reader       | ordering
 * sq_tail    | client producers (CAS)   | producers    | Vyukov: CAS claims a position
 * cq_head    | the client's drainer     | broker       | release after the drainer copied the
 *            |                          | (bounded)    | slots; broker acquire-loads, then clamps
 *            |                          |              | to [its last seen head, its tail]
 */
struct chime_chan_rw {
	uint64_t sq_tail;
	/*
	 * A reconnecting libchime's word on its old completion ring (written
	 * once, before the broker can read these rings' records): every event
	 * below resume_cq_head was consumed there. Release-store resume_set = 1
	 * after it; the shard acquire-loads it and then holds back the events it
	 * restored as "delivered, maybe taken" until it has read them (chan.c).
	 * resume_claims = 1 (stored before resume_set too): the old ring's claim
	 * words are in this ring's claim words, each at its position's index
	 * (pos << 2 | state says whose it is), so that an event voided there
	 * is told from one taken (the head passes both); 0 from a libchime
	 * before it, and the head alone decides.
	 */
	uint64_t resume_cq_head;
	uint32_t resume_set;
	uint32_t resume_claims;
	uint8_t  _pad0[104];
	uint64_t cq_head;
	uint8_t  _pad1[120];
};
_Static_assert(sizeof(struct chime_chan_rw) == 256, "two 128-byte halves");
_Static_assert(offsetof(struct chime_chan_rw, cq_head) % 128 == 0, "producer/consumer 128 B apart");
_Static_assert(offsetof(struct chime_chan_rw, resume_claims) == 20, "moved: bump CHIME_SHM_LAYOUT");

/*
 * Per shard, in the client's READ-ONLY segment (broker writes).
 *
 * field      | writer  | reader  | ordering
 * cq_tail    | shard   | client  | release after the cqe and its claim word are written;
 *            |         |         | client acquire-loads
 * sq_head    | shard   | client, | release after the shard applied every record below it,
 *            |         | control | including the claim VOIDs those records caused; the
 *            |         | thread  | control thread looks past it for records left waiting (V2)
 * backlog    | shard   | client, | events held back because the ring was full; the client
 *            |         | tools   | rings its doorbell for the shard after draining if non-zero
 */
struct chime_chan_ro {
	uint64_t cq_tail;
	uint8_t  _pad0[120];
	uint64_t sq_head;
	uint64_t backlog;
	uint8_t  _pad1[112];
};
_Static_assert(sizeof(struct chime_chan_ro) == 256, "two 128-byte halves");
_Static_assert(offsetof(struct chime_chan_ro, sq_head) % 128 == 0, "producer/consumer 128 B apart");

/*
 * Client writable segment ("client rw"):
 *
 *   struct chime_client_rw                      header, 256 B
 *   struct chime_chan_rw   [nr_shards]           at chan_off
 *   struct chime_sqe       [nr_shards][sq_size]  at sq_off   (shard s: sq_off + s*sq_size*64)
 *   uint64_t claim         [nr_shards][cq_size]  at claim_off
 *
 * The geometry fields are a copy for the client's convenience; the broker
 * never reads them back (it keeps its own).
 *
 * want_wakeup: the client sets it (then a full barrier, then re-checks its
 * completion rings) before it sleeps on its connection socket; a shard that
 * publishes events after a full barrier loads it, and if set CASes it 1 -> 0
 * and sends a 1-byte message on the broker's end of that socket (non-blocking:
 * a full socket means the client has wake-ups unread already). Exactly one
 * wake-up per sleep; no syscall while awake.
 */
struct chime_client_rw {
	struct chime_seg_hdr hdr;
	uint32_t nr_shards;
	uint32_t sq_size;           /* slots per submission ring, power of two */
	uint32_t cq_size;           /* slots per completion ring, power of two */
	uint32_t _pad0;
	uint64_t chan_off;
	uint64_t sq_off;
	uint64_t claim_off;
	uint8_t  _pad1[24];
	uint32_t want_wakeup;       /* own cache line: client stores, shards CAS */
	uint8_t  _pad2[124];
};
_Static_assert(sizeof(struct chime_client_rw) == 256, "header is 256 B");
_Static_assert(offsetof(struct chime_client_rw, want_wakeup) == 128, "own cache line");

/*
 * Client read-only segment ("client ro"):
 *
 *   struct chime_client_ro                      header, 256 B
 *   struct chime_chan_ro   [nr_shards]           at chan_off
 *   struct chime_cqe       [nr_shards][cq_size]  at cq_off
 */
struct chime_client_ro {
	struct chime_seg_hdr hdr;
	uint32_t nr_shards;
	uint32_t sq_size;
	uint32_t cq_size;
	uint32_t slot;              /* this client's slot in the control segment's client table */
	uint64_t chan_off;
	uint64_t cq_off;
	uint8_t  _pad[160];
};
_Static_assert(sizeof(struct chime_client_ro) == 256, "header is 256 B");

/* ------------------------------------------------------------------------ */
/* Control segment                                                             */
/* ------------------------------------------------------------------------ */

#define CHIME_BROKER_STARTING 0u
#define CHIME_BROKER_RUNNING  1u
#define CHIME_BROKER_STOPPED  2u   /* clean shutdown; a dead broker leaves RUNNING and a stale heartbeat */
/*
 * Public segment only: the broker is stopping and parking its sessions
 * (chan_park() reads each ring once). Stored, with a full barrier, before
 * any park; a session's call that finds it after publishing its record
 * (a full barrier too) cannot tell whether the park read the record, and
 * waits for the reconnect to hand it to the next broker (timer.c). Older
 * libraries see a state that is not STOPPED: running, as before.
 */
#define CHIME_BROKER_STOPPING 3u

/*
 * The public segment: all a client needs of the broker, and nothing about
 * other clients (no pids, no counters, no timers). A memfd the broker maps
 * read-write and hands every client read-only (welcome fd 0, sealed with
 * F_SEAL_FUTURE_WRITE); the control segment with everyone's counters is for
 * the broker's user, root and --stats-group only.
 *
 * field        | writer         | reader  | ordering
 * state        | control thread | client  | release; a STOPPED broker is gone for good
 * heartbeat_ns | control thread | client  | relaxed, every <= 100 ms (<= 500 ms at rest); compared with the clock
 * sleeping     | shard          | client  | the doorbell handshake: the shard stores a new
 *              |                | producers | non-zero sleep number, full barrier, re-checks
 *              |                |         | its rings, sleeps; a producer publishes (full
 *              |                |         | barrier), loads it, and if non-zero and not yet
 *              |                |         | rung for that number, writes its own doorbell
 *              |                |         | unless the record can wait for wake_ns (below);
 *              |                |         | the shard stores 0 and a full barrier on waking
 * wake_ns      | shard          | client  | stored before sleeping (release, N1): the sleep
 *              |                |         | ends by then, and a waking shard drains its rings
 *              |                |         | before it fires anything. A record needed only at
 *              |                |         | or after it (an arm or reset to a deadline no
 *              |                |         | earlier; a cancel: any time before the timer's
 *              |                |         | deadline, itself no earlier) rings no doorbell.
 *              |                |         | Rounded up to 2^24 ns: every client reads it, and
 *              |                |         | it must not tell another user's exact deadline.
 *              |                |         | UINT64_MAX: nothing armed, no wake-up planned
 */
struct chime_pub_shard {
	uint32_t sleeping;          /* 0 awake, else the shard's sleep number */
	uint32_t _pad0;
	uint64_t wake_ns;           /* while sleeping: it wakes by then (CLOCK_MONOTONIC) */
	uint8_t  _pad[112];
};
_Static_assert(offsetof(struct chime_pub_shard, wake_ns) == 8, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(sizeof(struct chime_pub_shard) == 128, "one shard per pair of cache lines' half");

struct chime_pub {
	struct chime_seg_hdr hdr;
	uint32_t state;             /* CHIME_BROKER_* */
	uint32_t nr_shards;
	uint64_t heartbeat_ns;      /* CLOCK_MONOTONIC */
	uint64_t shards_off;        /* struct chime_pub_shard [nr_shards] */
	/*
	 * CLOCK_REALTIME - CLOCK_MONOTONIC as the broker last followed it
	 * (control thread, relaxed; 0 from a broker before wall-clock timers):
	 * the library's doorbell decision for wall-clock deadlines (timer.c).
	 */
	int64_t  wall_off;
	/*
	 * The offset of CLOCK_MONOTONIC in the broker's time namespace from
	 * the host's (chime_timens_monotonic(); set before the segment is
	 * sealed; CHIME_WELCOME_F_CLOCK says so): a client whose own differs
	 * reads another clock than the one its deadlines are fired by, and
	 * is refused (-EXDEV, libclient/client.c check_clock()).
	 */
	int64_t  mono_off;
	uint8_t  _reserved[128 - 64 - 40];
};
_Static_assert(offsetof(struct chime_pub, wall_off) == 88, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_pub, mono_off) == 96, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(sizeof(struct chime_pub) == 128, "public header is 128 B");

static inline uint64_t chime_pub_size(uint32_t nr_shards)
{
	uint64_t end = sizeof(struct chime_pub) + (uint64_t)nr_shards * sizeof(struct chime_pub_shard);

	return (end + 4095) & ~(uint64_t)4095;
}

/*
 * Statistics blocks are written by exactly one thread each and read by tools
 * with a sequence counter (seqlock), so a reader never sees a torn block:
 *
 *   writer: seq = odd; fence (R-STAT1); store the fields; seq = even with release (R-STAT2)
 *   reader: s1 = seq (acquire, A-STAT1); retry if odd; copy the fields; fence (A-STAT2);
 *           re-read seq; retry unless it is still s1
 *
 * chime_stats_begin/end/read below implement both halves. Writers keep their
 * counters in private memory and publish a block once per loop iteration, so
 * the hot path never touches a shared line per timer.
 */

/*
 * Lateness histogram (fired_ns - deadline_ns): log-scaled, 4 buckets per
 * power of two from 1 us (2^10 ns) to 2^30 ns (~1.07 s):
 *   bucket 0                       lateness < 1024 ns
 *   bucket 1 + 4*(e-10) + q        2^e * (1 + q/4) <= lateness < 2^e * (1 + (q+1)/4), e in 10..29
 *   bucket CHIME_LAT_BUCKETS - 1   lateness >= 2^30 ns
 * chime_lat_bucket() and chime_lat_upper_ns() are the one definition.
 */
#define CHIME_LAT_BUCKETS 82u

static inline uint32_t chime_lat_bucket(uint64_t lat_ns)
{
	uint32_t e, q;

	if (lat_ns < 1024u)
		return 0;
	if (lat_ns >= (UINT64_C(1) << 30))
		return CHIME_LAT_BUCKETS - 1;
	e = 63u - (uint32_t)__builtin_clzll(lat_ns);
	q = (uint32_t)(lat_ns >> (e - 2)) & 3u;
	return 1u + 4u * (e - 10u) + q;
}

/* Exclusive upper bound of bucket b in ns; UINT64_MAX for the last one. */
static inline uint64_t chime_lat_upper_ns(uint32_t b)
{
	uint32_t e, q;

	if (b == 0)
		return 1024u;
	if (b >= CHIME_LAT_BUCKETS - 1)
		return UINT64_MAX;
	e = 10u + (b - 1u) / 4u;
	q = (b - 1u) % 4u;
	return (UINT64_C(1) << e) + ((uint64_t)(q + 1u) << (e - 2u));
}

/*
 * Lateness over a recent window: each shard keeps CHIME_LAT_WINDOW one-second
 * histograms in a ring, slot (second % CHIME_LAT_WINDOW), each stamped with
 * its second of CLOCK_MONOTONIC (fired_ns / 1e9). The shard clears a slot
 * when it first records a sample in a new second (at most once a second,
 * never per fire); a slot whose stamp is older than the window is stale and
 * readers skip it (a shard that fired nothing for a while leaves old slots
 * behind). A reader at second S sums the slots stamped S - CHIME_LAT_WINDOW
 * + 1 .. S: the current second and the CHIME_LAT_WINDOW - 1 before it.
 * Per-second counts fit 32 bits (4 G fires per second per bucket).
 */
#define CHIME_LAT_WINDOW 10u

struct chime_lat_second {
	uint64_t sec;               /* fired_ns / 1e9 of its samples; 0 with lat[] all 0: unused */
	uint64_t max_ns;
	uint64_t sum_ns;
	uint32_t lat[CHIME_LAT_BUCKETS];
};
_Static_assert(sizeof(struct chime_lat_second) == 352, "a second is 352 B");

/*
 * Per shard, in the control segment (the broker's user, root, --stats-group).
 * The shard's sleep number, which clients need, is in the public segment
 * (struct chime_pub_shard).
 *
 * field      | writer  | reader          | ordering
 * stats      | shard   | tools           | seqlock (seq), published at most once a
 *            |         |                 | millisecond and before the shard sleeps
 *
 * Lateness: lat[] and lat_sum_ns count since the broker started and never go
 * back (Prometheus counters); lat_base[] and lat_sum_base_ns are their values
 * at the last `chimectl reset-stats` (zero before any), so "since the reset"
 * is lat - lat_base; lat_max_ns is the largest since the reset. reset_gen is
 * the control segment's stats_reset_gen this block has applied.
 */
struct chime_shard_stats {
	uint64_t seq;               /* odd while the shard writes the block */
	uint64_t armed;             /* timers this shard holds for clients now (armed or held) */
	uint64_t arms;
	uint64_t resets;
	uint64_t cancels;
	uint64_t cancel_keys;
	uint64_t fires;
	uint64_t delivered;         /* events written into completion rings */
	uint64_t malformed;         /* submissions dropped as malformed */
	uint64_t loops;
	uint64_t sleeps;
	uint64_t wakeups;
	uint64_t backlog;           /* events held for clients that do not drain, now */
	uint64_t next_deadline_ns;  /* earliest armed deadline (see next_inexact); UINT64_MAX: none (one armed there: - 1) */
	uint64_t busy_ns;           /* time spent with work to do */
	uint64_t sq_depth;          /* records waiting in its fullest submission ring (<= sq_size) */
	uint64_t sq_depth_max;      /* high-water mark of sq_depth since start or reset */
	uint64_t lat_max_ns;        /* since start or reset */
	uint64_t lat_sum_ns;        /* since start */
	uint64_t lat[CHIME_LAT_BUCKETS];    /* since start */
	uint64_t refused_nomem;     /* arms refused: no free node (slab full or not reserved) */
	uint64_t refused_quota;     /* arms refused: the client (or its user) was at its quota */
	uint64_t reserve_failed;    /* slab chunks the filesystem would not reserve */
	uint64_t immediate;         /* fires of timers armed (or reset) already due: not in lat[] */
	uint64_t cpu_ns;            /* the shard thread's CPU time (CLOCK_THREAD_CPUTIME_ID) */
	uint64_t reset_gen;         /* chime_ctl.stats_reset_gen applied */
	uint64_t sq_waiting;        /* records waiting in all its submission rings */
	uint64_t next_inexact;      /* 1: next_deadline_ns is a lower bound (the slot was too big to scan) */
	uint64_t lat_sum_base_ns;   /* lat_sum_ns at the last reset */
	uint64_t lat_base[CHIME_LAT_BUCKETS];   /* lat[] at the last reset */
	struct chime_lat_second win[CHIME_LAT_WINDOW];
	/* set once at start-up, from the shard file an earlier broker left */
	uint64_t restored;          /* timers of named sessions taken over */
	uint64_t restore_dropped;   /* damaged nodes freed */
	uint64_t redelivered;       /* delivered events whose claim could not be read: held again */
	/* counters again (zero from a broker before them: they were reserved) */
	uint64_t spin_ns;           /* time spent spinning with no work, idle or into a deadline */
	uint64_t spin_capped;       /* sleeps taken because spinning had used its share of the time */
	/* a gauge again (zero from a broker before it: it was reserved) */
	uint64_t armed_realtime;    /* of armed: wall-clock timers (chime_arm_realtime()) */
	/* a counter again (zero from a broker before it: it was reserved) */
	uint64_t spin_busy;         /* spinning turned off: a yield gave the CPU away for 1 ms (shm/spin.h) */
	uint64_t slow_wakeups;      /* wake-up sends slow by CPU time, each holding its user's back (chan.c) */
	uint64_t slab_given_back;   /* bytes of the slab's free top given back to its filesystem (shard.c) */
	uint64_t slab_bytes;        /* a gauge: the slab's storage reserved on its filesystem now */
	uint8_t  _reserved[7936 - 8 * (38 + 2 * CHIME_LAT_BUCKETS) - 352 * CHIME_LAT_WINDOW];
};
_Static_assert(sizeof(struct chime_shard_stats) == 7936, "stats block size is part of the layout");
_Static_assert(offsetof(struct chime_shard_stats, lat) == 152, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, refused_nomem) == 808, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, reset_gen) == 848, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, lat_base) == 880, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, win) == 1536, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, armed_realtime) == 5096, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, spin_busy) == 5104, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_shard_stats, slow_wakeups) == 5112, "moved: bump CHIME_SHM_LAYOUT");

struct chime_shard_ctl {
	uint8_t  _reserved[256];
	struct chime_shard_stats stats;
};
_Static_assert(sizeof(struct chime_shard_ctl) == 8192, "shard block is 8 KiB");
_Static_assert(offsetof(struct chime_shard_ctl, stats) == 256, "stats start on their own line");

/*
 * Client table entry (identity), written by the control thread under its seq;
 * the counters are per (client, shard) in struct chime_client_stats so that
 * each has one writer.
 */
#define CHIME_CLIENT_EMPTY  0u
#define CHIME_CLIENT_ACTIVE 1u
#define CHIME_CLIENT_DYING  2u  /* disconnected; shards are reclaiming its timers */
#define CHIME_CLIENT_DETACHED 3u  /* a named session with no process: its timers run on */

struct chime_client_ctl {
	uint64_t seq;               /* seqlock, control thread */
	uint32_t state;             /* CHIME_CLIENT_* */
	int32_t  pid;
	uint32_t uid;
	uint32_t gid;
	char     comm[16];
	uint64_t connected_ns;      /* CLOCK_MONOTONIC */
	uint64_t generation;        /* bumped each time the slot is reused */
	char     session[64];       /* CHIME_SESSION_MAX: a session's name, NUL-terminated; "" anonymous */
	uint64_t linger_until_ns;   /* DETACHED: reclaimed at this CLOCK_MONOTONIC time */
};
_Static_assert(sizeof(struct chime_client_ctl) == 128, "client block is 128 B");
_Static_assert(offsetof(struct chime_client_ctl, comm) == 24, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_client_ctl, session) == 56, "moved: bump CHIME_SHM_LAYOUT");

/*
 * Per (client, shard): written by that shard only; tools sum over shards
 * (the depths: their maximum). A shard that adopts a reused slot zeroes the
 * block and stamps it with the client's generation; `chimectl reset-stats`
 * zeroes the lateness and the high-water marks, never the counters.
 */
struct chime_client_stats {
	uint64_t seq;               /* seqlock, the shard */
	uint64_t generation;        /* client slot generation these counters belong to */
	uint64_t armed;             /* timers of this client the shard holds now */
	uint64_t arms;
	uint64_t resets;
	uint64_t cancels;           /* cancel + cancel_key victims */
	uint64_t fires;
	uint64_t cq_depth;          /* events waiting in its completion ring, last seen */
	uint64_t backlog;           /* events held back because it did not drain */
	uint64_t wakeups;           /* wake-up messages sent to it */
	uint64_t refused_nomem;     /* its arms refused: no free node */
	uint64_t refused_quota;     /* its arms refused: it or its user at the quota (EDQUOT) */
	uint64_t sq_depth;          /* records waiting in its submission ring (<= sq_size) */
	uint64_t sq_depth_max;      /* since it connected or the last reset */
	uint64_t cq_depth_max;      /* since it connected or the last reset */
	uint64_t lat_max_ns;        /* since it connected or the last reset */
	uint64_t lat[CHIME_LAT_BUCKETS];    /* lateness of its timers, since then */
	uint64_t refused_user_quota;        /* of refused_quota: its user's clients held --max-timers-per-uid */
	uint64_t malformed;                 /* its records dropped by validation (a bug, or a hostile client) */
	/*
	 * A gauge, at each publication: the timer ids of this client the shard
	 * counts against the quotas, its armed timers and the ids its library
	 * was handed ahead of its arms. 0 from a broker before it (reserved).
	 */
	uint64_t owned;
	uint64_t slow_wakeups;      /* its wake-up sends slow by CPU time (its epoll watches), each holding its user's back */
	uint8_t  _reserved[896 - 8 * (20 + CHIME_LAT_BUCKETS)];
};
_Static_assert(sizeof(struct chime_client_stats) == 896, "client stats block is 896 B");
_Static_assert(offsetof(struct chime_client_stats, sq_depth) == 96, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_client_stats, lat) == 128, "moved: bump CHIME_SHM_LAYOUT");

/*
 * The control segment:
 *   struct chime_ctl                                  header, 256 B
 *   struct chime_shard_ctl    [nr_shards]              at shards_off
 *   struct chime_client_ctl   [max_clients]            at clients_off
 *   struct chime_client_stats [max_clients][nr_shards] at client_stats_off
 * Broker-wide fields are written by the control thread (heartbeat_ns with a
 * relaxed store: readers only compare it with their clock).
 *
 * field            | writer         | readers       | ordering
 * stats_reset_ns,  | control thread | tools         | relaxed stores, then stats_reset_gen
 * _realtime_ns     |                |               | (release, RS1)
 * stats_reset_gen  | control thread | shards, tools | RS1; each shard acquire-loads it before
 *                  |                |               | it publishes (RS2) and, when it moved,
 *                  |                |               | resets its own private figures and
 *                  |                |               | publishes reset_gen: no cross-thread write
 */
struct chime_ctl {
	struct chime_seg_hdr hdr;
	uint32_t state;             /* CHIME_BROKER_* */
	int32_t  pid;
	uint32_t nr_shards;
	uint32_t max_clients;
	uint64_t start_ns;          /* CLOCK_MONOTONIC */
	uint64_t heartbeat_ns;      /* CLOCK_MONOTONIC, updated at least every 100 ms (500 ms at rest) */
	uint64_t resolution_ns;
	int64_t  spin_us;           /* -1: busy-poll */
	uint32_t sq_size;
	uint32_t cq_size;
	uint32_t shard_capacity;    /* nodes per shard slab */
	uint32_t spin_share;        /* --spin-share, percent; 0 from a broker before it */
	uint64_t clients_now;
	uint64_t clients_total;
	char     version[16];
	uint64_t shards_off;        /* byte offset of struct chime_shard_ctl[0] */
	uint64_t clients_off;       /* byte offset of struct chime_client_ctl[0] */
	uint64_t client_stats_off;  /* byte offset of struct chime_client_stats[0][0] */
	uint64_t start_realtime_ns; /* CLOCK_REALTIME at start, for display only */
	uint64_t stats_reset_gen;   /* bumped by `chimectl reset-stats` (RS1; shards: RS2) */
	uint64_t stats_reset_ns;    /* CLOCK_MONOTONIC of the last reset; 0: never */
	uint64_t stats_reset_realtime_ns; /* CLOCK_REALTIME of the same, for display only */
	/*
	 * Set before RUNNING, then fixed: shards whose file was missing while
	 * the sessions file named sessions to take over (their timers there are
	 * lost). 0 from a broker before it (it was reserved).
	 */
	uint32_t shards_lost;
	/*
	 * The heartbeat's period now, in ms: 90, or 450 at rest (less under a
	 * tight systemd watchdog). 0 from a broker before it (it was padding).
	 */
	uint32_t beat_ms;
	/*
	 * CLOCK_REALTIME - CLOCK_MONOTONIC as the shards follow it (wall-clock
	 * timers; ARCHITECTURE.md), ns, relaxed; 0 from a broker before it.
	 */
	int64_t  wall_off;
	/*
	 * Detached sessions no process can attach to under the policy (their
	 * user not admitted, or their name reserved for another), as judged
	 * at the start (sessions taken over) and at each reload; they go
	 * when their linger ends. Kept at each heartbeat, relaxed. 0 from a
	 * broker before it (it was reserved).
	 */
	uint32_t sessions_unadmitted;
	/*
	 * Set before RUNNING, then fixed: records of the sessions file found
	 * damaged at start (a checksum that does not hold, a name in two
	 * slots): those sessions were dropped, their timers freed. 0 from a
	 * broker before it (it was padding).
	 */
	uint32_t sessions_damaged;
	/*
	 * The offset of CLOCK_MONOTONIC in the broker's time namespace from
	 * the host's, as chime_pub.mono_off: its times here (start, heartbeat,
	 * deadlines) are read on its clock, which a tool in another namespace
	 * does not share (tools/statsread.c). Set before the magic, then fixed.
	 * 0 from a broker before it (it was reserved).
	 */
	int64_t  mono_off;
	/*
	 * State files the running broker's paths no longer name (removed or
	 * replaced: a cleanup of the directory), as its once-a-second look
	 * finds them (restart_watch()): its socket (no new client can
	 * connect), its sessions file and how many shard files (a crash would
	 * lose the named sessions' timers). Relaxed; 0 from a broker before
	 * it (it was reserved).
	 */
	uint8_t  socket_gone;
	uint8_t  sessions_file_gone;
	uint16_t shard_files_gone;
	/*
	 * Session records the sessions file could not take (a write failed:
	 * EIO, no room), written again at every heartbeat until they are; a
	 * restart meanwhile loses those sessions' changes. Relaxed; 0 from a
	 * broker before it (it was reserved).
	 */
	uint32_t session_records_unwritten;
};
_Static_assert(offsetof(struct chime_ctl, mono_off) == 240, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, socket_gone) == 248, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, session_records_unwritten) == 252, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, sessions_unadmitted) == 232, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, sessions_damaged) == 236, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, wall_off) == 224, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(sizeof(struct chime_ctl) == 256, "control header is 256 B");
_Static_assert(offsetof(struct chime_ctl, heartbeat_ns) == 88, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, shards_off) == 160, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, client_stats_off) == 176, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(offsetof(struct chime_ctl, stats_reset_gen) == 192, "moved: bump CHIME_SHM_LAYOUT");

/* ---- seqlock helpers (writer: one thread; readers: anyone, read-only mapping) ---- */

static inline void chime_stats_begin(uint64_t *seq)
{
	/* R-STAT1: odd seq before the fields; pairs with A-STAT2 in chime_stats_read(). */
	at_store(seq, *seq + 1);
	at_fence_rel();
}

/*
 * The writer's copy into its block, between begin and end: word by word,
 * relaxed atomic stores (plain moves on x86). chimed's control thread reads
 * some of the fields (a client's refusals, its armed count for a query)
 * with atomic loads while a shard writes them; a plain copy racing with
 * those is undefined in C11, and TSan said so. len and both addresses are
 * multiples of 8 (every field is a uint64_t, or packed in whole words).
 */
static inline void chime_stats_put(void *dst, const void *src, size_t len)
{
	uint64_t *d = (uint64_t *)dst;
	const uint64_t *s = (const uint64_t *)src;

	for (size_t i = 0; i < len / 8; i++)
		at_store(&d[i], s[i]);
}

static inline void chime_stats_end(uint64_t *seq)
{
	/* R-STAT2: fields before the even seq; pairs with A-STAT1 in chime_stats_read(). */
	at_store_rel(seq, *seq + 1);
}

/*
 * Copy a block whose first field is its seq into dst, retrying while the
 * writer is inside it. Returns 0, or -EAGAIN after `tries` torn reads (a
 * writer that died mid-update leaves seq odd forever: the copy is then the
 * best there is, and the caller says so).
 */
static inline int chime_stats_read(void *dst, const void *src, size_t len, unsigned tries)
{
	const uint64_t *seqp = (const uint64_t *)src;

	while (tries--) {
		/* A-STAT1: pairs with R-STAT2. */
		uint64_t s1 = at_load_acq(seqp);

		if (s1 & 1u)
			continue;
		__builtin_memcpy(dst, src, len);
		/* A-STAT2: the copy before the re-read; pairs with R-STAT1. */
		at_fence_acq();
		if (at_load(seqp) == s1)
			return 0;
	}
	__builtin_memcpy(dst, src, len);
	return -11; /* -EAGAIN, without pulling errno.h into the contract */
}

/* Shard segment header ("<socket>.shard<N>"); the wheel region follows at wheel_off. */
struct chime_shard_seg {
	struct chime_seg_hdr hdr;
	uint32_t shard;
	uint32_t key_buckets;       /* power of two */
	uint64_t key_off;           /* uint32_t bucket heads [key_buckets] */
	uint64_t wheel_off;         /* struct chime_wheel, then the slab */
	/*
	 * The offsets (CLOCK_REALTIME - CLOCK_MONOTONIC) the shard's wall-clock
	 * nodes are based on: a node's CHIME_NODE_WALL_B picks one. wall_cur
	 * is the one new nodes take. Written by the shard thread (a follow
	 * stores the other offset, moves the nodes to it, then wall_cur), so a
	 * broker killed in the middle leaves every node's base known. 0 in the
	 * files of brokers before wall-clock timers, which hold no such node.
	 */
	int64_t  wall_off[2];
	uint32_t wall_cur;
	uint8_t  _reserved[20];
};
_Static_assert(offsetof(struct chime_shard_seg, wall_off) == 88, "moved: bump CHIME_SHM_LAYOUT");
_Static_assert(sizeof(struct chime_shard_seg) == 128, "shard header is 128 B");

/* ------------------------------------------------------------------------ */
/* Socket handshake                                                             */
/* ------------------------------------------------------------------------ */

/* Where every client looks for the host's broker, root or not (overridden by $CHIME_SOCKET). */
#define CHIME_DEFAULT_SOCKET "/run/chime/chime.sock"

#define CHIME_HELLO_MAGIC UINT32_C(0x4d494843) /* "CHIM" */

/*
 * client -> broker, one SOCK_SEQPACKET message right after connect(). flags 0
 * attaches a client: anonymous, or the named session in `session` (opened,
 * or re-attached with its timers). A query flag instead asks a question about the caller's
 * own clients (for chimectl run by a user who may not read the segments): the
 * broker answers with a struct chime_query_head, then `count` records in
 * messages of at most CHIME_QUERY_BATCH, and closes.
 */
#define CHIME_HELLO_QUERY_CLIENTS 1u    /* the connected clients of the caller's uid */
#define CHIME_HELLO_QUERY_TIMERS  2u    /* the timers of client `pid`, if it is the caller's uid's */
/*
 * Reset the statistics (chimectl reset-stats): root and the broker's uid
 * only. The answer is a struct chime_query_head with no records: status 0
 * and total = the new chime_ctl.stats_reset_gen (each shard applies it
 * within a millisecond, and publishes it as its reset_gen), or -EPERM.
 */
#define CHIME_HELLO_RESET_STATS   3u
/*
 * The named sessions of the caller's uid (root and the broker's user: all);
 * struct chime_query_session, by slot from the hello's pid on (total counts
 * those before it too): a page after one that ended at slot N asks from N + 1.
 */
#define CHIME_HELLO_QUERY_SESSIONS 4u
/*
 * Reclaim the detached session `session` now (root and the broker's user:
 * any; others: their uid's). A head with no records: status 0, -ESRCH (none),
 * -EACCES (another uid's), -EBUSY (a process has it attached).
 */
#define CHIME_HELLO_DROP_SESSION  5u
/*
 * Each user's use of its per-user limits: one struct chime_query_user per
 * accounting uid with a client slot taken (policy_account_uid(): a
 * subordinate range counts as one user), by uid. Root and the broker's
 * user see every user; others the one they count as.
 */
#define CHIME_HELLO_QUERY_USERS   7u
/*
 * Re-read the policy now, as SIGHUP does, and say how it went (chimectl
 * reload): root and the broker's user only (else -EPERM). The answer is a
 * head (status 0) and one struct chime_query_reload, sent once this reload
 * has finished: two callers each get their own. A broker before it
 * answers -EINVAL, as to any query it does not know.
 */
#define CHIME_HELLO_RELOAD        6u
/*
 * Would an attach of the caller be admitted now (chimectl status)? A head
 * with no records: status 0, or -EUSERS (its user's --max-clients-per-uid
 * or the client table full), -ECONNREFUSED (the broker is stopping). No
 * client slot is taken and nothing is logged above debug: a health check
 * every few seconds is neither a client nor a line in the log. A broker
 * before it answers -EINVAL.
 */
#define CHIME_HELLO_PING          8u
/*
 * As CHIME_HELLO_QUERY_CLIENTS, with every slot the client table shows of
 * the caller's uid, not only the connected clients: one struct
 * chime_query_slot each, with the state a reader of the control segment
 * sees (chimectl clients as root): active, dying (closed, or holding a
 * slot whose peer has not read the broker's answer: its timers being
 * reclaimed, the slot still counted) and detached sessions. A broker
 * before it answers -EINVAL.
 */
#define CHIME_HELLO_QUERY_SLOTS   9u
/*
 * With a session name, or'ed into flags 0: libchime re-attaching by itself
 * after losing its broker (ARCHITECTURE.md, "libchime's reconnect"). The
 * session's grants kept from the old rings stay valid until its
 * CHIME_OP_RESUMED, and the new submission rings start at sq_base (a
 * multiple of the broker's sq_size, below 2^62) instead of 0.
 */
#define CHIME_HELLO_RESUME        0x100u

/*
 * Or'ed into every attach (flags 0 or CHIME_HELLO_RESUME): this library
 * seals its writable segments itself before it is attached (struct
 * chime_mapped). A broker refuses an attach without it (-EPROTO): a
 * client that could punch holes in memory a shard reads would stall the
 * shard (ARCHITECTURE.md, "Writable segments sealed by their client").
 */
#define CHIME_HELLO_SEALS         0x200u

/*
 * A session name: 1..CHIME_SESSION_MAX-1 bytes of [A-Za-z0-9._-], NUL-padded
 * in the hello (the broker refuses anything else with -EINVAL).
 */
#define CHIME_SESSION_MAX 64u

/*
 * The length of the session name at `name` (0..CHIME_SESSION_MAX-1) if it
 * is NUL-terminated within CHIME_SESSION_MAX bytes and every byte before
 * the NUL is one of [A-Za-z0-9._-]; else -1. Reads at most
 * CHIME_SESSION_MAX bytes. The library and the broker both check with it.
 */
static inline int chime_session_len(const char *name)
{
	for (int i = 0; i < (int)CHIME_SESSION_MAX; i++) {
		char ch = name[i];

		if (!ch)
			return i;
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		      ch == '.' || ch == '_' || ch == '-'))
			return -1;
	}
	return -1;
}

struct chime_hello {
	uint32_t magic;             /* CHIME_HELLO_MAGIC */
	uint32_t layout;            /* CHIME_SHM_LAYOUT the client speaks */
	uint32_t flags;             /* 0, one CHIME_HELLO_QUERY_*, CHIME_HELLO_RESET_STATS, _DROP_SESSION, _RELOAD or _PING */
	int32_t  pid;               /* QUERY_TIMERS: whose; QUERY_SESSIONS: the first slot to list (0: all) */
	uint64_t limit;             /* queries: records at most (0: CHIME_QUERY_MAX); CHIME_HELLO_RESUME:
				     * the session's token from its last welcome (0: none) */
	uint64_t sq_base;           /* CHIME_HELLO_RESUME: the submission rings' first position; else 0 */
	char     session[CHIME_SESSION_MAX]; /* flags 0: "" anonymous, else the session to open; DROP_SESSION: which */
};

#define CHIME_QUERY_BATCH 32u       /* records per answer message */
#define CHIME_QUERY_MAX   1024u     /* records per answer at most (they fit a socket buffer) */
#define CHIME_CLIENTS_MAX 65536u    /* chimed --max-clients at most: client slots, and so sessions */

struct chime_query_head {
	uint32_t magic;             /* CHIME_HELLO_MAGIC */
	int32_t  status;            /* 0, or -EACCES, -ESRCH (no such client of yours), -EBUSY (try later) */
	uint64_t total;             /* records that match */
	uint64_t count;             /* records that follow (<= total, <= limit) */
	uint64_t now_ns;            /* the broker's clock, for relative deadlines */
};
_Static_assert(sizeof(struct chime_query_head) == 32, "query head is 32 B");

struct chime_query_client {
	int32_t  pid;
	uint32_t uid;
	uint32_t gid;
	uint32_t slot;
	char     comm[16];
	uint64_t connected_ns;
	uint64_t armed;             /* summed over shards */
	uint64_t arms;
	uint64_t fires;
};
_Static_assert(sizeof(struct chime_query_client) == 64, "query record is 64 B");

/* CHIME_HELLO_QUERY_SLOTS's record. */
struct chime_query_slot {
	struct chime_query_client client;
	uint32_t state;             /* CHIME_CLIENT_ACTIVE, _DYING or _DETACHED, as the control segment's table */
	uint8_t  _reserved[60];
};
_Static_assert(sizeof(struct chime_query_slot) == 128, "slot record is 128 B");

struct chime_query_timer {
	uint64_t id;
	uint64_t key;
	uint64_t user_data;
	uint64_t deadline_ns;
	uint64_t period_ns;
	uint32_t state;             /* CHIME_NODE_* */
	uint32_t shard;
	uint32_t flags;             /* CHIME_QUERY_TIMER_* (0 from a broker before them) */
	uint8_t  _reserved[12];
};
_Static_assert(sizeof(struct chime_query_timer) == 64, "query record is 64 B");
/* Its resets are words in the client's touch table; deadline_ns is the latest the client wrote there. */
#define CHIME_QUERY_TIMER_TOUCHED 1u
/* A wall-clock timer (chime_arm_realtime()); its deadline_ns is CLOCK_MONOTONIC all the same, as every node's. */
#define CHIME_QUERY_TIMER_REALTIME 2u
_Static_assert(sizeof(struct chime_hello) == 96, "hello is 96 B");
_Static_assert(offsetof(struct chime_hello, session) == 32, "moved: bump CHIME_SHM_LAYOUT");

/* CHIME_HELLO_QUERY_SESSIONS: one per named session, attached or not. */
#define CHIME_SESSION_ATTACHED 1u
#define CHIME_SESSION_DETACHED 2u

struct chime_query_session {
	char     name[CHIME_SESSION_MAX];
	uint32_t uid;
	uint32_t state;             /* CHIME_SESSION_* */
	int32_t  pid;               /* the attached process, or the last one */
	uint32_t slot;
	uint64_t timers;            /* armed, summed over shards */
	uint64_t held;              /* events waiting for the next attach (backlog), summed */
	uint64_t linger_left_ns;    /* DETACHED: until it is reclaimed; 0 attached */
	uint8_t  _reserved[24];
};
_Static_assert(sizeof(struct chime_query_session) == 128, "session record is 128 B");

/*
 * CHIME_HELLO_QUERY_USERS' record: what the broker's own limits count
 * (handshake.c uid_full(); the shards' per-user quota, per shard).
 */
struct chime_query_user {
	uint32_t uid;               /* the uid counted (a subordinate range's: its owner's lowest start) */
	uint32_t clients;           /* slots counted against max_clients: attached, attaching, detached sessions */
	uint32_t held;              /* slots whose peer has not read the broker's answer */
	uint32_t reclaiming;        /* closed, their timers being reclaimed */
	uint32_t sessions;          /* named sessions, attached or not */
	uint32_t detached;          /* of them, with no process attached */
	uint32_t max_clients;       /* --max-clients-per-uid; 0: none */
	uint32_t nr_shards;
	uint64_t armed;             /* timers held for it, summed over its clients and the shards */
	uint64_t armed_fullest;     /* of them, in the shard holding the most */
	uint64_t max_timers;        /* --max-timers-per-uid; 0: none */
	uint64_t max_timers_shard;  /* each shard refuses its arms past this; UINT64_MAX: none */
	uint64_t owned;             /* what the shards count against the quotas: armed + ids handed ahead */
	uint64_t owned_fullest;     /* of them, in the shard counting the most: what max_timers_shard bounds */
	uint32_t flags;             /* CHIME_QUERY_USER_*; 0 from a broker before them */
	uint32_t table_free;        /* the client table's free slots (for every user: a table-wide count) */
	uint32_t table_kept;        /* of them, those kept for users holding no slot (its last sixteenth) */
	uint8_t  _reserved[36];
};
_Static_assert(sizeof(struct chime_query_user) == 128, "user record is 128 B");
/*
 * The user holds a slot, is neither root nor the broker's user, and the
 * table's free slots are all kept for users holding none: its next open is
 * refused EUSERS whatever its own limits say.
 */
#define CHIME_QUERY_USER_KEPT_OUT 1u

/* CHIME_HELLO_RELOAD's answer. The counts are of the policy's rules: before the reload and now. */
struct chime_query_reload {
	int32_t  error;             /* 0: reloaded; else the load's -errno, and the policy is the one before */
	uint32_t sessions_unadmitted; /* detached sessions no process can attach to under the policy now */
	uint32_t uids[2];           /* --allow-uid and the file's allow-uid, resolved: [0] before, [1] now */
	uint32_t gids[2];
	uint32_t session_rules[2];  /* "session NAME USER" reservations */
	uint32_t subuid_ranges[2];
	uint8_t  allow_all[2];
	uint8_t  has_file;          /* started with --policy-file */
	uint8_t  _pad;
	int32_t  socket_error;      /* reloaded, but the socket's group or mode not set to follow: -errno */
	uint8_t  _reserved[16];
	char     message[448];      /* error: why, as the log says it ("FILE:3: ..."); else whom it admits */
};
_Static_assert(sizeof(struct chime_query_reload) == 512, "reload record is 512 B");

/*
 * broker -> client, one message. status 0 carries SCM_RIGHTS with, in order:
 *   [0] public segment (read-only)   [1] client rw memfd   [2] client ro memfd (read-only)
 *   [3 .. 3+nr_shards) this client's own doorbell eventfd for each shard
 * Each doorbell is made for this client alone (the broker only reads it, through
 * io_uring); wake-ups come back as 1-byte messages on this same connection.
 * status < 0 carries no fds: -EACCES (policy, or a session of another uid), -EPROTO (layout),
 * -EUSERS (client table full), -ENOMEM, -EINVAL (a malformed session name), -EBUSY (the
 * session is attached to another process). The broker closes the connection after a refusal.
 */
struct chime_welcome {
	uint32_t magic;             /* CHIME_HELLO_MAGIC */
	uint32_t layout;            /* CHIME_SHM_LAYOUT the broker speaks */
	int32_t  status;
	uint32_t nr_shards;
	uint32_t slot;
	uint32_t nr_fds;
	uint64_t rw_size;
	uint64_t ro_size;
	uint64_t pub_size;           /* of the public segment (fd 0) */
	uint32_t features;          /* CHIME_WELCOME_F_*; 0 from a broker before them */
	/*
	 * A named session's token: a new one at every attach by a process that
	 * does not resume it. A resuming library sends it back (hello.limit),
	 * and a token not the session's is refused (-ESTALE): another attach,
	 * another chime_t of the same process included, freed what it would
	 * re-submit against. 0: none (anonymous, or a broker before it).
	 */
	uint32_t session_token;
	uint8_t  _reserved[8];
};
_Static_assert(sizeof(struct chime_welcome) == 64, "welcome is 64 B");
_Static_assert(offsetof(struct chime_welcome, features) == 48, "moved: bump CHIME_SHM_LAYOUT");

/*
 * The broker delivers nothing into a resuming library's new ring before it
 * has read the library's word (resume_set): the library may put its old
 * ring's claim words into the new ring's (resume_claims). A broker without
 * it may deliver at once, and the copy would overwrite those events' words.
 */
#define CHIME_WELCOME_F_CLAIMS 1u

/*
 * This attach created the named session (it did not exist). A library that
 * fails after such a welcome (no descriptor left for the segments, no
 * memory) drops the session again, instead of leaving an empty one to
 * linger under its user's name and quota. Only then: a session that
 * existed holds timers that are not the failing process's to drop.
 */
#define CHIME_WELCOME_F_NEW_SESSION 4u

/*
 * The broker takes CHIME_OP_ARM_REALTIME (wall-clock timers). A broker
 * without it counts the record malformed and arms nothing: the library
 * refuses chime_arm_realtime() with -EOPNOTSUPP instead.
 */
#define CHIME_WELCOME_F_REALTIME 8u

/*
 * chime_pub.mono_off is the broker's (its time namespace's monotonic
 * offset). Without it (a broker before it: 0 there, whatever its own),
 * the library does not compare its clock with the broker's.
 */
#define CHIME_WELCOME_F_CLOCK 16u

#define CHIME_WELCOME_FIXED_FDS 3u

/*
 * The attach in three messages (ARCHITECTURE.md, "Writable segments sealed
 * by their client"):
 *
 *   broker -> client  struct chime_welcome with the descriptors (the offer):
 *                     nothing of the broker's is in the rw segment yet
 *   client -> broker  struct chime_mapped: the client has mapped the rw
 *                     segment (every page faulted in: MAP_POPULATE) and the
 *                     touch table, and sealed both F_SEAL_FUTURE_WRITE |
 *                     F_SEAL_SEAL, so that nobody can punch a hole in them
 *   broker -> client  struct chime_welcome, status 0 and no descriptors (the
 *                     channels are attached and the rw segment's header
 *                     written), or a refusal (status < 0)
 *
 * The broker checks the seals and that every page of the rw segment is
 * there (the client's, not the broker's to allocate) before it writes a
 * byte of it; a client that does not answer within the hello's time is
 * closed. Wake-up bytes (1-byte messages) may come before the last message.
 */
struct chime_mapped {
	uint32_t magic;             /* CHIME_MAPPED_MAGIC */
	uint32_t _reserved;         /* 0 */
};
_Static_assert(sizeof(struct chime_mapped) == 8, "mapped is 8 B");
#define CHIME_MAPPED_MAGIC UINT32_C(0x50414d43) /* "CMAP" */

/*
 * Keepalive resets without a record (ARCHITECTURE.md, "Keepalive resets
 * without a record"). An anonymous client asks for a touch table with
 * `limit` = CHIME_HELLO_TOUCH in its hello (flags 0, no session; an older
 * broker ignores the field); a broker that grants it sets
 * CHIME_WELCOME_F_TOUCH and sends one more fd, after the doorbells: a
 * sealed memfd mapped read-write by both sides, of two arrays of one
 * entry per node of every shard (capacity = size / (12 * nr_shards)): a
 * 64-bit word per node, shard s's at s * capacity, then a 32-bit tag per
 * node, in the same order. Apart, not side by side, because an ARM
 * writes its node's tag: 1024 tags to a page, where 16-byte entries had
 * 256, so a client's first arms of a fresh table take a fourth of the
 * page faults (4 us each on the development VM). It is the client's own
 * memory: the broker trusts nothing in it but a deadline for that
 * client's own timers.
 *
 * field       | writer                         | reader
 * word        | client: CAS (the deadline it   | shard: when a flagged node's deadline comes
 *             | wants, FIRED clear); shard:    | (later: back on the wheel there; else
 *             | fetch-or FIRED as it fires     | FIRED, fired), and applying RESET_TOUCH
 * tag         | client: gen at ARM, before the | client: its reset skips the record iff
 *             | id is returned, unless the     | tag == gen(id)|ON, the word not FIRED and
 *             | slot says CHIME_GRANT_F_TAGGED;| its deadline >= the word
 *             | shard: gen at the grant, where |
 *             | it has faulted the page in     |
 *             | (F_TAGGED); gen|ON (release)   |
 *             | when it flags a node           |
 */
/*
 * The token names the layout: a layout that changes takes a new token, so
 * that a library and a broker of different layouts fall back to records
 * rather than read each other's entries wrong. "touch" was 16-byte
 * entries {word, tag} (2026-11-27, never released).
 */
#define CHIME_HELLO_TOUCH     UINT64_C(0x32316863756f74)  /* "touch12": words, then tags */
#define CHIME_WELCOME_F_TOUCH 2u
#define CHIME_TOUCH_FIRED     (UINT64_C(1) << 63)       /* in a word: the shard fired it */
#define CHIME_TOUCH_ON        (UINT32_C(1) << 31)       /* in a tag: the shard reads the word */
#define CHIME_TOUCH_MAX_NS    (CHIME_TOUCH_FIRED - 1)   /* later deadlines are kept as this */
#define CHIME_TOUCH_BYTES     12u                       /* per node: its word and its tag */
/*
 * In a submission slot's grant_flags: the shard wrote the grant's tag
 * (its generation) before the slot's seq freed it, so the ARM that takes
 * the grant need not. Kept off the client's thread: a tag is a store into
 * a line the client seldom holds, and an arm waited for it in its
 * publication's barrier. An older broker sets no flag (the client writes
 * the tag); an older library ignores it (and writes the same value).
 */
#define CHIME_GRANT_F_TAGGED  1u
_Static_assert(CHIME_ID_GEN_MASK < CHIME_TOUCH_ON, "a tag holds a generation and ON");

/* Shard s's words and tags in a table of nr_shards * cap nodes at base. */
static inline uint64_t *chime_touch_words(void *base, uint32_t s, uint32_t cap)
{
	return (uint64_t *)base + (uint64_t)s * cap;
}

static inline uint32_t *chime_touch_tags(void *base, uint32_t nr_shards, uint32_t s, uint32_t cap)
{
	return (uint32_t *)((uint64_t *)base + (uint64_t)nr_shards * cap) + (uint64_t)s * cap;
}

#endif /* CHIME_SHM_H */
