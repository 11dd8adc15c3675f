/* SPDX-License-Identifier: MIT */
/*
 * policy.h - who may connect to chimed (ARCHITECTURE.md, "Who may do what").
 *
 * Root and the broker's own uid are always admitted. Anyone else needs
 * --allow-all, or a uid in --allow-uid, or a primary or supplementary group
 * in --allow-gid (supplementary groups come from SO_PEERGROUPS, so they are
 * the peer's groups at connect time, not /etc/group's). Lists take numbers
 * or names; names are resolved when the policy is loaded, and again on each
 * reload (SIGHUP), so a user created later is found then. An optional policy
 * file adds the same settings, one per line, and is re-read on reload.
 *
 * The file also reserves session names for their users ("session NAME
 * USER", NAME ending in '*' for a prefix): a session is its creator's, so
 * without a reservation any admitted user could open a service's session
 * name first and keep the service out of it.
 *
 * Per-user limits (--max-clients-per-uid, --max-timers-per-uid, handshakes)
 * count a subordinate uid (subuid(5): a user's range for user namespaces)
 * with the other uids its owner has: the kernel shows each as a user of
 * its own, and one user holding 65536 of them would otherwise have 65536
 * shares. They count together as one more user, not as their owner (a
 * container's processes cannot use up its owner's, or root's, share), and
 * only for counting: admission, sessions and privileges go by the uid.
 */
#ifndef CHIMED_POLICY_H
#define CHIMED_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "chime_shm.h"   /* CHIME_SESSION_MAX */

struct policy_src {
	const char *allow_uid;          /* "LIST" as given, or NULL */
	const char *allow_gid;
	bool allow_all;
	const char *file;               /* --policy-file, or NULL */
	const char *subuid_file;        /* --subuid-file (/etc/subuid), or NULL */
};

struct session_rule {
	char name[CHIME_SESSION_MAX];   /* the name, or the prefix before '*' */
	bool prefix;                    /* NAME* */
	uid_t uid;
};

/* uids [start, start + count) count as uid `as` (the owner's lowest start) */
struct uid_range {
	uid_t start;
	uint32_t count;
	uid_t as;
};

struct policy {
	bool allow_all;
	uid_t *uids;
	size_t nr_uids;
	gid_t *gids;
	size_t nr_gids;
	struct session_rule *sessions;  /* in file order: the first match decides */
	size_t nr_sessions;
	struct uid_range *subuids;      /* by start, disjoint */
	size_t nr_subuids;
	uid_t *subuid_owners;           /* the uids owning a range, sorted, distinct */
	size_t nr_subuid_owners;
	size_t subuid_owners_unknown;   /* owners named that no user has (counted by name) */
	size_t subuids_skipped;         /* lines of the file not understood, or overlapping */
};

/*
 * Build the policy from the command line and the file. 0, or -EINVAL
 * (a bad setting), -ENOMEM or -errno opening or reading the file, always
 * with a message in err that names what failed ("--allow-uid: no user
 * 'bob'", "FILE:3: unknown setting 'x'", "cannot open policy file 'FILE':
 * ..."). On failure *p is left as it was. A subordinate-uid file that does
 * not exist gives no ranges; lines of it not understood are skipped
 * (counted in subuids_skipped: the file is the system's, not chimed's).
 */
int policy_load(struct policy *p, const struct policy_src *src, char *err, size_t errlen);
void policy_free(struct policy *p);
/*
 * Would policy_load() succeed now? The same result and message, nothing
 * kept: at the start, and before a restart, whose new broker reads it all
 * again and would exit on what it refuses. *subuid_ranges (if not NULL):
 * how many subordinate-uid ranges it would count.
 */
int policy_check(const struct policy_src *src, char *err, size_t errlen, size_t *subuid_ranges);

/* Is a peer with these credentials admitted? (root and `self` always are) */
bool policy_admits(const struct policy *p, uid_t self, uid_t uid, gid_t gid,
		   const gid_t *groups, size_t nr_groups);

/* The uid whose share uid counts against: its range's, or its own. */
uid_t policy_account_uid(const struct policy *p, uid_t uid);

/*
 * Does uid own a subordinate-uid range, or lie in one? Such a user is one
 * of the two accounts of a login (its own and its range's): its default
 * timer quota is a quarter of the slab, not half (main.c).
 */
bool policy_has_subuids(const struct policy *p, uid_t uid);

/* Is session `name` reserved for a user? true and *uid if so. */
bool policy_session_owner(const struct policy *p, const char *name, uid_t *uid);

/* True if anyone but root and the broker's own user may be admitted. */
bool policy_is_open(const struct policy *p);

/* "uids 1000,1001; gids 27; all" for the log. */
void policy_describe(const struct policy *p, char *buf, size_t len);

/* Parse "LIST" of users (or groups) into ids; for main.c's checks and the tests. */
int policy_parse_uids(const char *list, uid_t **out, size_t *n, char *err, size_t errlen);
int policy_parse_gids(const char *list, gid_t **out, size_t *n, char *err, size_t errlen);

/* A group name or number to a gid: 0, or -EINVAL with a message. */
int policy_group(const char *name, gid_t *gid, char *err, size_t errlen);

#endif /* CHIMED_POLICY_H */
