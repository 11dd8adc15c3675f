/* SPDX-License-Identifier: MIT */
/*
 * control.h - chimed's control thread: start-up (lock, segments, shards,
 * socket; startup.c), the io_uring loop that owns every client's life
 * cycle, and the clean shutdown (control.c).
 */
#ifndef CHIMED_CONTROL_H
#define CHIMED_CONTROL_H

#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>

#include "policy.h"

struct broker_opts {
	char     socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	uint32_t nr_shards;
	uint32_t capacity;          /* timer nodes per shard */
	uint32_t max_clients;
	uint32_t sq_size;
	uint32_t cq_size;
	uint64_t max_timers_per_client;  /* 0: no limit; enforced per shard, rounded up */
	uint64_t max_timers_per_uid;     /* one user's clients together; the same */
	uint64_t max_timers_with_subuids;  /* the same for a user owning subordinate uids, and for each
					    * range (policy_has_subuids()): a quarter by default */
	uint64_t slab_fits;              /* the default quota was a share of this many nodes, all the
					  * socket's filesystem holds (less than the slab); else 0 */
	bool     quota_derived;          /* the per-uid quotas are the defaults (half and a quarter) */
	uint64_t resolution_ns;
	int64_t  spin_us;           /* -1: busy-poll */
	uint32_t spin_share;        /* percent of a shard's time it may spin with no work */
	bool     mkdir_parent;      /* the default path: create /run/chime (0755) */
	struct policy_src policy;   /* who may connect (policy.h) */
	uint32_t max_clients_per_uid;
	uint32_t session_linger_s;  /* a detached session is reclaimed after this */
	gid_t    socket_gid;        /* --socket-group, or (gid_t)-1 */
	gid_t    stats_gid;         /* --stats-group, or (gid_t)-1 */
	const char *socket_group;   /* --socket-group as given (a name the next broker looks up), or NULL */
	const char *stats_group;    /* --stats-group as given, or NULL */
	const char *helper_exe;     /* what discard_start() runs as chimed-discard (main.c, helper_exe()) */
	bool     fresh;             /* --fresh: discard what an earlier broker left */
};

struct broker;

/*
 * Take the socket (its lock file, a stale socket), create the control and
 * shard segments, start the shards and listen. On failure one line has been
 * logged, everything created is removed, and a negative errno is returned.
 */
int broker_start(struct broker **out, const struct broker_opts *o);

/*
 * The CPUs this process may run on (sched_getaffinity(): a unit's
 * CPUAffinity=, taskset, a cpuset), and how many; the online CPUs where
 * that cannot be read. Shard i is pinned to the (i mod count)-th of them.
 */
int broker_cpus(cpu_set_t *set);

struct chime_query_reload;

/*
 * SIGHUP, or chimectl reload: reopen the log, re-read the policy
 * (re-resolving names, re-reading --policy-file), look at the wall clock.
 * On an error the old policy stays and the error is logged. Clients
 * already connected stay. The outcome goes to *out if not NULL.
 */
void broker_reload(struct broker *b, struct chime_query_reload *out);

/*
 * Serve until SIGTERM or SIGINT (0), SIGUSR2 (1: the caller stops the broker
 * and executes chimed again, which takes the sessions over), or a fatal
 * error (negative errno, logged). Attached sessions are parked first.
 */
int broker_run(struct broker *b);

/* Stop: state STOPPED, shards joined, clients see EOF, files removed. NULL-safe. */
void broker_stop(struct broker *b);

/*
 * A quota's share in each shard, rounded up (0: no limit): each shard
 * enforces its own, so the hot path never counts across shards.
 */
static inline uint64_t shard_share(uint64_t total, uint32_t nr_shards)
{
	return total ? (total + nr_shards - 1) / nr_shards : UINT64_MAX;
}

#endif /* CHIMED_CONTROL_H */
