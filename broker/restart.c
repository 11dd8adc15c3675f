/* SPDX-License-Identifier: MIT */
/*
 * restart.c - what one broker leaves to the next (ARCHITECTURE.md, "Broker
 * restart"): the sessions file, read at start-up to re-create detached
 * sessions before the shards restore their timers, and kept up to date by
 * the control thread as sessions come and go; --fresh; which files a stop
 * keeps.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "clock.h"
#include "log.h"
#include "paths.h"
#include "segment.h"
#include "sessfile.h"
#include "wheel.h"

static struct sessfile_geom geom_of(const struct broker *b)
{
	return (struct sessfile_geom){
		.nr_shards = b->o.nr_shards,
		.max_clients = b->o.max_clients,
		.capacity = b->o.capacity,
		.layout = CHIME_SHM_LAYOUT,
		.resolution_ns = b->o.resolution_ns,
	};
}

/*
 * Timers in a shard file, for --fresh's message: read-only, every bound
 * checked, and only in a file an earlier broker could have left
 * (chime_seg_ours(), never through a symlink). In a socket directory others
 * can write, another user's file may be cut short as it is read, and the
 * read past its end is SIGBUS: the broker dead at its start. Such a file
 * is replaced all the same, its timers never a broker's.
 */
static uint64_t count_timers(const char *path)
{
	/* O_NONBLOCK: a FIFO at the path must not hang the open (a regular file ignores it). */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	struct chime_map m;
	const struct chime_shard_seg *h;
	const struct chime_wheel *w;
	const struct chime_node *nodes;
	uint64_t n = 0, hw, fit;
	struct stat st;
	int r;

	if (fd < 0)
		return 0;
	r = fstat(fd, &st) == 0 && chime_seg_ours(&st) ? chime_seg_map_fd(fd, CHIME_SEG_SHARD, false, &m) : -EPERM;
	close(fd);
	if (r < 0)
		return 0;
	h = m.base;
	if (h->wheel_off > m.size || m.size - h->wheel_off < sizeof(*w))
		goto out;
	w = chime_at(&m, h->wheel_off);
	if (w->slab_off < sizeof(*w) || w->slab_off > m.size - h->wheel_off)
		goto out;
	nodes = (const struct chime_node *)((const char *)w + w->slab_off);
	fit = (m.size - h->wheel_off - w->slab_off) / sizeof(*nodes);
	hw = w->high_water < fit ? w->high_water : fit;
	for (uint64_t i = 0; i < hw; i++) {
		uint8_t s = nodes[i].state;

		n += s == CHIME_NODE_ARMED || s == CHIME_NODE_EXPIRED || s == CHIME_NODE_BACKLOG ||
		     s == CHIME_NODE_ACKWAIT;
	}
out:
	chime_seg_unmap(&m);
	return n;
}

/* Timers in the shard files an earlier broker of this many shards left. */
static uint64_t left_timers(const struct broker *b)
{
	uint64_t timers = 0;

	for (uint32_t i = 0; i < b->o.nr_shards; i++) {
		char p[PATH_MAX];

		chime_shard_path(p, sizeof(p), b->o.socket_path, i);
		timers += count_timers(p);
	}
	return timers;
}

uint64_t restart_remove_shard_files(const struct broker *b, uint32_t from, bool count)
{
	uint64_t timers = 0;

	for (uint32_t i = from; i < CHIME_MAX_SHARDS; i++) {
		char p[PATH_MAX];

		chime_shard_path(p, sizeof(p), b->o.socket_path, i);
		if (count)
			timers += count_timers(p);
		/* An earlier broker may have had more shards: look a few past ours before giving up. */
		if (unlink(p) < 0 && errno == ENOENT && i >= b->o.nr_shards + 8)
			break;
	}
	return timers;
}

/*
 * Remove what an earlier broker left: the sessions file, then every shard
 * file. Returns the timers in them. In that order: killed in between, the
 * next broker finds shard files without sessions, whose timers it discards
 * as --fresh asked. The shard files first, it took the sessions over
 * without their timers, an error per shard.
 */
static uint64_t discard(const struct broker *b)
{
	unlink(b->sess_path);
	return restart_remove_shard_files(b, 0, true);
}

/* The names of the sessions in recs, comma-separated, cut short with "..." if they do not fit. */
static void session_names(const struct sessfile_rec *recs, uint32_t n, char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < n; i++) {
		int w;

		if (!recs[i].used)
			continue;
		w = snprintf(buf + at, len - at, "%s'%.*s'", at ? ", " : "", (int)sizeof(recs[i].name),
			     recs[i].name);
		if (w < 0 || (size_t)w >= len - at) {
			/* room for the mark: the buffer holds at least one name's worth before it */
			snprintf(buf + (at < len - 5 ? at : len - 5), 5, "...");
			return;
		}
		at += (size_t)w;
	}
}

/*
 * sessfile_load(), but a file held by a broker that runs (-EBUSY) is said.
 * Held, another broker runs on these files: its lock file and socket were
 * removed while it ran (a cleanup of the directory), so take_lock() and
 * clear_stale_socket() let this one in, and taken over, two brokers ran
 * on one slab. One just killed lets it go as it exits, as it does its
 * lock file: it gets the time a dying broker's socket gets.
 */
#define IN_USE_WAIT_MS 2000
static int load(const struct broker *b, const struct sessfile_geom *g, struct sessfile_rec *recs, uint32_t *bad,
		struct sessfile_info *info)
{
	int n;

	for (int waited = 0;; waited += 10) {
		n = sessfile_load(b->sess_path, g, recs, bad, info);
		if (n != -EBUSY || waited >= IN_USE_WAIT_MS)
			break;
		usleep(10 * 1000);
	}
	if (n == -EBUSY)
		log_msg(LOG_ERR, "sessions file '%s' is in use by a running broker (its lock file '%s' and socket "
			"were removed while it runs?): not taking its files over; stop that broker first (its "
			"stop keeps the sessions for the next one)", b->sess_path, b->lock_path);
	return n;
}

/* Copy in into out, and sync it: 0 or an errno. */
static int copy_synced(int in, int out)
{
	char buf[16384];
	ssize_t n;

	while ((n = read(in, buf, sizeof(buf))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		/*
		 * A short write is no error (the next one says why, ENOSPC):
		 * taken as one, its message was whatever errno held before.
		 */
		for (ssize_t done = 0, w; done < n; done += w) {
			w = write(out, buf + done, (size_t)(n - done));
			if (w < 0 && errno == EINTR) {
				w = 0;
				continue;
			}
			if (w <= 0)
				return w < 0 ? errno : EIO;
		}
	}
	return fsync(out) < 0 && errno != EINVAL ? errno : 0;
}

/*
 * The copy at path, named once whole (O_TMPFILE, then linked: `unnamed`),
 * or, where that cannot be done (-EOPNOTSUPP), created there: 0 or -errno,
 * nothing left at path on an error.
 */
static int copy_damaged(const char *from, const char *path, bool unnamed)
{
	int in = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), out, e;

	if (in < 0)
		return -errno;
	out = unnamed ? chime_seg_tmpfile(path, O_WRONLY, 0600) :
	      open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0) {
		e = unnamed ? out : -errno;
		close(in);
		return e;
	}
	e = -copy_synced(in, out);
	close(in);
	if (e == 0 && unnamed)
		e = chime_seg_link(out, path);          /* never over another file: EEXIST */
	if (close(out) < 0 && e == 0)
		e = -errno;
	if (e < 0 && !unnamed)
		unlink(path);
	return e;
}

/*
 * A sessions file found damaged (records dropped, or its header read from
 * the copy) is rewritten in place by restart_save(): a copy of it as found,
 * at PATH.sessions.damaged, so that the operator still has what was dropped
 * (the records' bytes: the session names, users and slots). Never over
 * another file; a copy that finds no room is only said. Named once whole:
 * a broker killed while it copied left a cut copy there, which no later
 * start replaced, while each rewrote the file (a review).
 */
static void keep_damaged(const struct broker *b)
{
	char path[PATH_MAX + 16];
	struct stat st;
	int r;

	snprintf(path, sizeof(path), "%s.damaged", b->sess_path);
	/* Said before copying: unnamed, the copy would find it there only at its end. */
	r = lstat(path, &st) == 0 ? -EEXIST : copy_damaged(b->sess_path, path, true);
	if (r == -EOPNOTSUPP)
		r = copy_damaged(b->sess_path, path, false);
	if (r < 0) {
		log_errno(LOG_WARNING, -r, "cannot keep a copy of the damaged sessions file at '%s'%s", path,
			  r == -EEXIST ? " (one is there already: not replaced)" : "");
		return;
	}
	log_msg(LOG_WARNING, "'%s': a copy of it as found is kept at '%s' (the file itself is rewritten without "
		"what was damaged)", b->sess_path, path);
}

/* A monotonic offset (ns) in seconds as unshare --monotonic takes it: "100", "-2.5". */
static void mono_secs(int64_t ns, char *buf, size_t len)
{
	uint64_t a = ns < 0 ? -(uint64_t)ns : (uint64_t)ns;
	int w = snprintf(buf, len, "%s%llu", ns < 0 ? "-" : "", (unsigned long long)(a / 1000000000u));

	if (a % 1000000000u && w > 0 && (size_t)w < len) {
		snprintf(buf + w, len - (size_t)w, ".%09llu", (unsigned long long)(a % 1000000000u));
		for (size_t e = strlen(buf); buf[e - 1] == '0'; e--)
			buf[e - 1] = 0;
	}
}

/* A detached session as the sessions file describes it. */
static void adopt(struct broker *b, const struct sessfile_rec *r, uint64_t now)
{
	struct client *c = &b->clients[r->slot];
	uint64_t linger = (uint64_t)b->o.session_linger_s * 1000000000u;

	memset(c, 0, sizeof(*c));
	c->state = CL_DETACHED;
	c->slot = (uint16_t)r->slot;
	client_taken(b, c);
	c->rw_fd = c->ro_fd = c->ro_wfd = c->touch_fd = c->fd = c->next_fd = c->pidfd = c->held_fd = -1;
	c->holder_pidfd = -1;                           /* memset above: 0 is not "none" (holder_unwatch() closes it) */
	memcpy(c->session, r->name, sizeof(c->session));
	c->cred.uid = r->uid;
	c->acct_uid = policy_account_uid(&b->policy, r->uid);
	c->timer_quota = uid_timer_quota(b, c->acct_uid);
	c->quota_held = c->timer_quota;                 /* the shards restore it with the session */
	c->quota_order = ++b->quota_orders;
	c->user_quota = c->timer_quota;                 /* its user's other sessions bring the same */
	c->cred.gid = r->gid;
	c->cred.pid = 0;
	c->holder_pid = r->pid;
	c->holder_start = r->pid_start;
	holder_unwatch(c);                              /* restart_watch_holders(), once the shards restored */
	c->holder_lost = false;
	c->token = r->token;
	snprintf(c->comm, sizeof(c->comm), "(restored)");
	c->generation = r->generation;
	/* Attached when the old broker went (0), or a linger longer than ours allows: ours from now. */
	c->linger_until_ns = r->linger_until_ns && r->linger_until_ns < now + linger ? r->linger_until_ns :
			     now + linger;
	c->connected_ns = now;
	b->clients_now++;
	b->clients_total++;
}

void restart_watch_holders(struct broker *b)
{
	for (uint32_t i = 0; b->clients && i < b->o.max_clients; i++) {
		struct client *c = &b->clients[i];
		uint32_t carried = 0;

		holder_unwatch(c);
		if (c->state != CL_DETACHED || !c->session[0] || c->holder_pid <= 0 || !c->chans)
			continue;
		for (uint32_t s = 0; s < b->o.nr_shards; s++)
			carried += c->chans[s].nr_carried;
		c->holder_watched = carried != 0;
	}
}

/*
 * Could a process of the session's user attach to it under this broker's
 * policy? Its groups at connect time (SO_PEERGROUPS) are unknown here:
 * its primary group, and those the group database gives its name (what a
 * new login of it gets).
 */
static bool admits(const struct broker *b, uid_t uid, gid_t gid)
{
	struct passwd pw, *p = NULL;
	gid_t some[256], *groups = some;
	int n = 256;
	char buf[4096];
	bool ok;

	if (policy_admits(&b->policy, geteuid(), uid, gid, NULL, 0))
		return true;
	if (!b->policy.nr_gids)
		return false;
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &p) != 0)
		return true;            /* cannot tell (ERANGE, the user database down): not said to be refused */
	if (!p)
		return false;
	if (getgrouplist(p->pw_name, gid, groups, &n) < 0) {
		groups = malloc((size_t)n * sizeof(*groups));
		if (!groups || getgrouplist(p->pw_name, gid, groups, &n) < 0) {
			free(groups);
			return true;    /* cannot tell: not said to be refused */
		}
	}
	ok = policy_admits(&b->policy, geteuid(), uid, gid, groups, (size_t)n);
	if (groups != some)
		free(groups);
	return ok;
}

/*
 * Detached sessions no process can attach to under the policy (changed
 * across the restart, or by a reload): of a user it does not admit, or
 * named for another user (a reservation: handshake.c refuses the name to
 * its session's user, and the session to the reserving one). Kept, so
 * that a policy put right and reloaded lets their processes back, but
 * said, with the way out. Nothing extends their linger.
 */
#define UNADMITTED_SAID 16
uint32_t restart_say_unattachable(struct broker *b, uint64_t now, bool reload)
{
	uint32_t n = 0;
	uid_t last_uid = (uid_t)-1, owner;
	gid_t last_gid = (gid_t)-1;
	bool last = true;

	for (uint32_t slot = 0; slot < b->o.max_clients; slot++) {
		struct client *c = &b->clients[slot];
		char why[96];
		uint64_t left;

		if (c->state != CL_DETACHED)
			continue;
		c->unadmitted = false;
		/* Slots in a row of one user (its sessions are often many): one look-up in the user database. */
		if (c->cred.uid != last_uid || c->cred.gid != last_gid) {
			last_uid = c->cred.uid;
			last_gid = c->cred.gid;
			last = admits(b, last_uid, last_gid);
		}
		if (!last)
			snprintf(why, sizeof(why), "the policy does not admit that user (nor its groups)");
		else if (policy_session_owner(&b->policy, c->session, &owner) && owner != c->cred.uid)
			snprintf(why, sizeof(why), "the policy file reserves its name for uid %u", (unsigned)owner);
		else
			continue;
		c->unadmitted = true;
		if (n++ >= UNADMITTED_SAID)
			continue;
		/* Restored, restart_save() gives it RESTART_LINGER_NS at least. */
		left = c->linger_until_ns > now ? c->linger_until_ns - now : 0;
		if (!reload && left < RESTART_LINGER_NS)
			left = RESTART_LINGER_NS;
		log_msg(LOG_WARNING, "session '%s' of uid %u %s, but %s: no process of it can attach again; "
			"its timers run until its linger ends in %llu s (put the policy right and reload, SIGHUP, "
			"to keep them; chimectl drop-session '%s' frees them now)", c->session,
			(unsigned)c->cred.uid, reload ? "detached (policy reloaded)" : "taken over", why,
			(unsigned long long)((left + 999999999u) / 1000000000u), c->session);
	}
	if (n > UNADMITTED_SAID)
		log_msg(LOG_WARNING, "%u more detached sessions that no process can attach to under this policy",
			n - UNADMITTED_SAID);
	return n;
}

int restart_load(struct broker *b)
{
	struct sessfile_geom g = geom_of(b), found;
	struct sessfile_info info = { 0 };
	struct sessfile_rec *recs;
	uint64_t now = now_ns();
	uint32_t bad = 0;
	int n;

	b->sess.fd = -1;
	snprintf(b->sess_path, sizeof(b->sess_path), "%s.sessions", b->o.socket_path);
	recs = calloc(b->o.max_clients, sizeof(*recs));
	if (!recs)
		return log_errno(LOG_ERR, ENOMEM, "sessions");
	if (b->o.fresh) {
		char names[256];
		int had = load(b, &g, recs, &bad, &info);
		uint64_t timers;

		if (had == -EBUSY) {
			free(recs);
			return -EBUSY;
		}

		/* Which sessions go with them: the operator may have meant another broker's socket. */
		session_names(recs, b->o.max_clients, names, sizeof(names));
		free(recs);
		timers = discard(b);
		if (had > 0)
			log_msg(LOG_NOTICE, "--fresh: discarded %llu timer%s and %d session%s (%s) the previous "
				"broker left", (unsigned long long)timers, timers == 1 ? "" : "s", had,
				had == 1 ? "" : "s", names);
		else
			log_msg(LOG_NOTICE, "--fresh: discarded %llu timer%s the previous broker left",
				(unsigned long long)timers, timers == 1 ? "" : "s");
		return 0;
	}
	{
		/*
		 * Read first, said as what it is: sessfile_load() fails on it too,
		 * but as "cannot take over sessions file (--fresh discards it)",
		 * which would have an operator discard every timer over a
		 * descriptor it lacked for a moment.
		 */
		char boot[40];
		int e = sessfile_boot_id(boot);

		if (e < 0) {
			log_errno(LOG_ERR, e, "cannot read this boot's id ('/proc/sys/kernel/random/boot_id'), which "
				  "says whether '%s' is this boot's: not started, its sessions and their timers kept in "
				  "the files for a broker that can read it", b->sess_path);
			free(recs);
			return e;
		}
	}
	n = load(b, &g, recs, &bad, &info);
	found = info.geom;
	/*
	 * A broker killed holding no session: nothing of it to keep, its shard
	 * files' timers anonymous clients' (no broker takes those over).
	 * Refused, a broker of other options or another layout did not start,
	 * told to --fresh away sessions there were none of.
	 */
	if (n == -EMEDIUMTYPE && info.empty) {
		log_msg(LOG_NOTICE, "'%s' was written by a broker with other options and names no session: "
			"discarding it and the %llu timers of anonymous clients left in the shard files",
			b->sess_path, (unsigned long long)discard(b));
		n = 0;
	} else if (n == -EPROTO && info.empty) {
		/* Shard files of another layout: count_timers() cannot read them. */
		(void)discard(b);
		log_msg(LOG_NOTICE, "'%s' was written by another version of chimed (shard file layout %u; this "
			"one's is %u) and names no session: discarding it and the shard files (what they hold is "
			"anonymous clients' timers)", b->sess_path, found.layout, g.layout);
		n = 0;
	}
	switch (n) {
	case -EBUSY:
		free(recs);
		return -EBUSY;
	case -ENOENT: {
		/*
		 * Shard files without it. Every broker writes it at its start and
		 * a killed one leaves it; a stop that keeps no session removes the
		 * shard files with it. So timers left here were the sessions' it
		 * named (and anonymous clients'), and it was removed: while the
		 * broker ran (logged then), after it, or by a --fresh killed in
		 * between. Whose they were nothing says any more.
		 */
		uint64_t timers = left_timers(b);

		if (timers)
			log_msg(LOG_WARNING, "no sessions file '%s', but shard files: it was removed (while the "
				"broker before ran, or since; a killed broker leaves it), and the %llu timers left in "
				"the shard files are discarded with the sessions it named (none is taken over)",
				b->sess_path, (unsigned long long)timers);
		n = 0;
		break;
	}
	case -ESTALE:
		if (found.layout == g.layout) {
			log_msg(LOG_WARNING, "'%s' was written before the last reboot (its deadlines are another "
				"boot's clock): discarding %llu timers", b->sess_path, (unsigned long long)discard(b));
		} else {
			/* Shard files of another layout: count_timers() cannot read them. */
			(void)discard(b);
			log_msg(LOG_WARNING, "'%s' was written before the last reboot (its deadlines are another "
				"boot's clock), by another version of chimed (shard file layout %u; this one's is "
				"%u): discarding it and the shard files, with their timers", b->sess_path,
				found.layout, g.layout);
		}
		n = 0;
		break;
	case -EXDEV: {
		char theirs[32], ours[32];

		/*
		 * Translated, the deadlines would fire at the right instants, but
		 * its sessions' processes, in that namespace, would be refused
		 * (-EXDEV, chime_open(3)): the broker belongs where they are.
		 */
		mono_secs(info.mono_off, theirs, sizeof(theirs));
		mono_secs(chime_timens_monotonic(), ours, sizeof(ours));
		log_msg(LOG_ERR, "sessions file '%s' was written by a broker in another time namespace (its "
			"CLOCK_MONOTONIC %s s off the host's, this one's %s s): the deadlines of its sessions' "
			"timers are that clock's; not taking it over, nor the shard files' timers; start chimed in "
			"a time namespace of that offset (unshare --time --monotonic=%s), where its sessions' "
			"processes are, or with --fresh to discard them", b->sess_path, theirs, ours, theirs);
		free(recs);
		return -EXDEV;
	}
	case -EPERM: {
		struct stat st = { .st_uid = (uid_t)-1 };

		(void)lstat(b->sess_path, &st);
		free(recs);
		return log_file_not_ours("sessions file", b->sess_path, &st, "remove it, or start with --fresh");
	}
	case -EMEDIUMTYPE:
		log_msg(LOG_ERR, "'%s' was written by a broker with %u shards, --capacity %u, --max-clients %u "
			"and --resolution-us %llu; this one has %u, %u, %u and %llu: start with the same options, "
			"or with --fresh to discard its sessions", b->sess_path, found.nr_shards, found.capacity,
			found.max_clients, (unsigned long long)(found.resolution_ns / 1000), g.nr_shards,
			g.capacity, g.max_clients, (unsigned long long)(g.resolution_ns / 1000));
		free(recs);
		return -EMEDIUMTYPE;
	case -EBADMSG:
		log_msg(LOG_ERR, "sessions file '%s' is not one, or has a damaged header (its checksum does not "
			"hold, nor its copy's at the end of the file): not taking it over, nor the shard files' "
			"timers; put it back as it was, or start with --fresh to discard them", b->sess_path);
		free(recs);
		return -EBADMSG;
	case -EPROTO:
		/* An upgrade or a downgrade: the version that wrote it keeps the sessions, --fresh loses them. */
		if (found.layout != g.layout)
			log_msg(LOG_ERR, "sessions file '%s' was written by another version of chimed (shard file "
				"layout %u; this one's is %u): not taking it over; start the chimed that wrote it "
				"to keep its sessions' timers, or this one with --fresh to discard them", b->sess_path,
				found.layout, g.layout);
		else
			log_msg(LOG_ERR, "sessions file '%s' was written by another version of chimed (another "
				"format than this one's %u): not taking it over; start the chimed that wrote it to "
				"keep its sessions' timers, or this one with --fresh to discard them", b->sess_path,
				SESSFILE_VERSION);
		free(recs);
		return -EPROTO;
	case -ENODATA: {
		struct stat st = { 0 };

		(void)stat(b->sess_path, &st);
		log_msg(LOG_ERR, "sessions file '%s' is cut short (%lld bytes; a broker writes %llu): not taking "
			"it over, nor the shard files' timers, whose sessions it no longer names; put it back "
			"whole, or start with --fresh to discard them", b->sess_path, (long long)st.st_size,
			(unsigned long long)sessfile_size(b->o.max_clients));
		free(recs);
		return -ENODATA;
	}
	default:
		if (n == -EACCES) {
			struct stat st;

			/*
			 * Not its user's: a mode it cannot set is no way out (root's
			 * 0600 has it already), chown is, as for a file of root's
			 * it may not write (log_file_not_ours()).
			 */
			if (lstat(b->sess_path, &st) == 0 && st.st_uid != geteuid()) {
				free(recs);
				return log_file_not_ours("sessions file", b->sess_path, &st,
							 "remove it, or start with --fresh");
			}
		}
		if (n < 0) {
			struct stat st;

			/* A directory or FIFO made there: its errno named neither, and --fresh leaves a directory. */
			if (lstat(b->sess_path, &st) == 0 && !S_ISREG(st.st_mode)) {
				log_msg(LOG_ERR, "sessions file '%s' is not a regular file (uid %u's): not using it; "
					"remove it", b->sess_path, (unsigned)st.st_uid);
				free(recs);
				return n;
			}
			/*
			 * A mode set by hand (chmod 000, a restrictive umask in a
			 * copy put back): chmod is the way out, not --fresh, which
			 * discards every session's timers.
			 */
			log_errno_hint(LOG_ERR, n, n == -EACCES ?
				       "not started: its sessions and their timers stay in the files; give chimed's user "
				       "read and write access to it (chmod 600), or --fresh discards them" :
				       "--fresh discards it", "cannot take over sessions file '%s'", b->sess_path);
			free(recs);
			return n;
		}
	}
	if (info.from_copy)
		log_msg(LOG_WARNING, "sessions file '%s': its header is damaged (its checksum does not hold); "
			"taken over by its copy at the end of the file, which is whole (the header is written "
			"again)", b->sess_path);
	if (bad)
		log_msg(LOG_WARNING, "'%s': %u damaged session record%s dropped (%s timers are freed, counted in the "
			"shards' lines below as anonymous clients')", b->sess_path, bad, bad == 1 ? "" : "s",
			bad == 1 ? "its" : "their");
	if (bad || info.from_copy)
		keep_damaged(b);
	b->sessions_damaged = bad;
	if (n > 0) {
		b->restoring = true;
		for (uint32_t slot = 0; slot < b->o.max_clients; slot++)
			if (recs[slot].used)
				adopt(b, &recs[slot], now);
		log_msg(LOG_INFO, "taking over %d session%s from '%s'", n, n == 1 ? "" : "s", b->sess_path);
		b->sessions_unadmitted = restart_say_unattachable(b, now, false);
	}
	free(recs);
	return 0;
}

struct shard_session *restart_shard_sessions(struct broker *b, uint32_t shard)
{
	struct shard_session *ss;

	if (!b->restoring)
		return NULL;
	ss = calloc(b->o.max_clients, sizeof(*ss));
	if (!ss)
		return NULL;
	for (uint32_t slot = 0; slot < b->o.max_clients; slot++) {
		struct client *c = &b->clients[slot];

		if (c->state != CL_DETACHED)
			continue;
		if (!c->chans && !(c->chans = calloc(b->o.nr_shards, sizeof(*c->chans)))) {
			free(ss);
			return NULL;
		}
		ss[slot].ch = &c->chans[shard];
		ss[slot].generation = c->generation;
		ss[slot].uid = c->acct_uid;
		ss[slot].user_quota = shard_share(c->timer_quota, b->o.nr_shards);
	}
	return ss;
}

static struct sessfile_rec rec_of(const struct client *c)
{
	struct sessfile_rec r = {
		.used = 1,
		.slot = c->slot,
		.uid = c->cred.uid,
		.gid = c->cred.gid,
		.generation = c->generation,
		.linger_until_ns = c->state == CL_DETACHED ? c->linger_until_ns : 0,
		.pid = c->holder_pid,
		.pid_start = c->holder_start,
		.token = c->token,
	};

	memcpy(r.name, c->session, sizeof(r.name));
	return r;
}

int restart_save(struct broker *b)
{
	struct sessfile_geom g = geom_of(b);
	struct sessfile_rec *recs = calloc(b->o.max_clients, sizeof(*recs));
	uint64_t now = now_ns();
	int r;

	if (!recs)
		return log_errno(LOG_ERR, ENOMEM, "sessions");
	for (uint32_t slot = 0; slot < b->o.max_clients; slot++) {
		struct client *c = &b->clients[slot];

		if (c->state != CL_DETACHED)
			continue;
		/*
		 * Restored: a short linger (0 reclaims at once) counted from
		 * before the restore reclaimed sessions whose processes were
		 * still reconnecting, every timer lost.
		 */
		if (c->linger_until_ns < now + RESTART_LINGER_NS)
			c->linger_until_ns = now + RESTART_LINGER_NS;
		recs[slot] = rec_of(c);
	}
	r = sessfile_open(&b->sess, b->sess_path, &g, recs);
	free(recs);
	/*
	 * A start that took nothing over has no sessions to leave in the files:
	 * the hint is the other state files' (the room, or an inode).
	 */
	if (r < 0 && !b->restoring && r != -EPERM)
		return log_errno_hint(LOG_ERR, r, r == -ENOSPC || r == -EDQUOT ? SEG_NO_ROOM_HINT : NULL,
				      "cannot write sessions file '%s'", b->sess_path);
	/* Not started: what the lines before said was taken over is left as it was, for the next broker. */
	if (r < 0)
		return log_errno_hint(LOG_ERR, r, r == -EPERM ?
				      "not started: the sessions and their timers stay in the files, for a broker "
				      "that can write it (is it immutable, another user's, or a second name for a "
				      "file, a hard link someone made in its directory?)" :
				      "not started: the sessions and their timers stay in the files, "
				      "for a broker that can write it", "cannot write sessions file '%s'",
				      b->sess_path);
	for (uint32_t slot = 0; slot < b->o.max_clients; slot++)
		if (b->clients[slot].state == CL_DETACHED)
			table_set(b, &b->clients[slot], CHIME_CLIENT_DETACHED);
	b->restoring = false;
	return 0;
}

/*
 * A record written (e 0) or not (-errno): a failure is said once and the
 * slot marked, so that the heartbeat writes it again, until it succeeds
 * (restart_retry()). Before, a failed write (a disk's EIO) was only said,
 * and a session detached meanwhile was lost at the next restart, or a
 * dropped one taken over again by the next broker.
 */
static void rec_written(struct broker *b, const struct client *c, int e, bool put)
{
	bool was = b->rec_stale && b->rec_stale[c->slot];
	const char *name = c->session[0] ? c->session : "(dropped)";

	if (e < 0 && !was) {
		log_errno(LOG_WARNING, e, put ? "'%s': cannot record session '%s' (written again at every heartbeat; a "
			  "broker restart meanwhile would lose it)" : "'%s': cannot remove session '%s' (removed again "
			  "at every heartbeat; a broker restart meanwhile would take it over)", b->sess_path, name);
		if (b->rec_stale) {
			b->rec_stale[c->slot] = true;
			b->recs_stale++;
		}
	} else if (e == 0 && was) {
		log_msg(LOG_NOTICE, "'%s': session '%s' %s after all", b->sess_path, name, put ? "recorded" : "removed");
		b->rec_stale[c->slot] = false;
		b->recs_stale--;
	}
}

void restart_put(struct broker *b, const struct client *c)
{
	struct sessfile_rec r = rec_of(c);

	rec_written(b, c, sessfile_put(&b->sess, &r), true);
}

void restart_clear(struct broker *b, const struct client *c)
{
	rec_written(b, c, sessfile_clear(&b->sess, c->slot), false);
}

/* Should the sessions file hold slot c's record now? A named session's, from its open to its drop. */
static bool rec_wanted(const struct client *c)
{
	return c->session[0] && c->state != CL_FREE && c->state != CL_DETACHING && c->state != CL_HELD &&
	       !c->drop_parked;
}

void restart_retry(struct broker *b)
{
	for (uint32_t s = 0; b->recs_stale && s < b->o.max_clients; s++) {
		const struct client *c = &b->clients[s];

		if (!b->rec_stale[s])
			continue;
		/*
		 * What the slot holds now: a record, or none (dropped, freed, or
		 * another's anonymous connection). Not restart_session_kept(),
		 * the stop's count: a session being created has its record from
		 * its open on (client_open()), and a heartbeat during its
		 * handshake cleared it (found by a review).
		 */
		if (rec_wanted(c))
			restart_put(b, c);
		else
			restart_clear(b, c);
	}
}

bool restart_session_kept(const struct client *c)
{
	return c->session[0] && c->state != CL_FREE && c->state != CL_DETACHING && c->state != CL_HELD &&
	       !c->drop_parked && !(c->state == CL_ATTACHING && c->created);
}

uint32_t restart_sessions(const struct broker *b)
{
	uint32_t n = 0;

	for (uint32_t i = 0; b->clients && i < b->o.max_clients; i++)
		n += restart_session_kept(&b->clients[i]);
	return n;
}

/*
 * Before the shard files: it is small, and without it the next broker
 * discards all their timers, so on a nearly full filesystem it goes first.
 */
void restart_keep(struct broker *b)
{
	if (b->sess.fd < 0)
		return;
	restart_retry(b);       /* a last try, the sessions parked by the stop included */
	if (b->recs_stale)
		log_msg(LOG_ERR, "'%s': %u session record%s could not be written: the next broker will not have "
			"%s timers (or will take over a session dropped since)", b->sess_path, b->recs_stale,
			b->recs_stale == 1 ? "" : "s", b->recs_stale == 1 ? "that session's" : "those sessions'");
	b->sess_lost = !keep_file(b->sess.fd, b->sess_path, "the next broker will have none of the "
				  "sessions' timers", NULL, 0);
}

void restart_close(struct broker *b, uint32_t sessions, uint32_t lost_shards, const struct stop_timers *t)
{
	bool ours = b->sess.fd >= 0;    /* a file we did not create (a refused start) is never removed */
	char timers[96] = "";

	if (t && t->kept_events)
		snprintf(timers, sizeof(timers), " (%llu timer%s armed, %llu event%s not consumed)",
			 (unsigned long long)t->kept, t->kept == 1 ? "" : "s",
			 (unsigned long long)t->kept_events, t->kept_events == 1 ? "" : "s");
	else if (t)
		snprintf(timers, sizeof(timers), " (%llu timer%s)", (unsigned long long)t->kept,
			 t->kept == 1 ? "" : "s");
	if (sessions && ours && !b->sess_lost && !lost_shards)
		log_msg(LOG_INFO, "keeping the timers of %u session%s%s for the next broker ('%s')", sessions,
			sessions == 1 ? "" : "s", timers, b->sess_path);
	else if (sessions && ours && !b->sess_lost)
		log_msg(LOG_WARNING, "keeping the timers of %u session%s%s for the next broker ('%s'), except "
			"those of %u shard%s", sessions, sessions == 1 ? "" : "s", timers, b->sess_path, lost_shards,
			lost_shards == 1 ? "" : "s");
	/* events counted as the kept sessions' are: a next broker's restore frees their nodes too (an operator's audit) */
	if (t && t->dropped_events)
		log_msg(LOG_INFO, "%llu timer%s armed and %llu event%s not consumed, of %u client%s that no next broker "
			"takes over (anonymous, or sessions being reclaimed), end with this one",
			(unsigned long long)t->dropped, t->dropped == 1 ? "" : "s", (unsigned long long)t->dropped_events,
			t->dropped_events == 1 ? "" : "s", t->anonymous, t->anonymous == 1 ? "" : "s");
	else if (t && t->dropped)
		log_msg(LOG_INFO, "%llu timer%s of %u client%s that no next broker takes over (anonymous, or "
			"sessions being reclaimed) end with this one", (unsigned long long)t->dropped,
			t->dropped == 1 ? "" : "s", t->anonymous, t->anonymous == 1 ? "" : "s");
	if (!sessions && ours)
		(void)chime_seg_unlink_named(b->sess.fd, b->sess_path);
	sessfile_close(&b->sess);
}

/* Is the directory of path gone (removed with what was in it)? */
static bool dir_gone(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	struct stat st;

	if (!slash)
		return false;   /* the working directory: still ours, whatever its name now */
	snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	return stat(dir, &st) < 0 && (errno == ENOENT || errno == ENOTDIR);
}

/*
 * A state file removed or replaced while the broker runs: what it holds is
 * safe in this broker's memory, and a stop writes it again (restart_keep(),
 * shard_fini()), but a crash now loses it, and nothing else would say so
 * before the next broker starts empty. Said once per removal: the flag
 * clears only when the path names the file again.
 */
#define WATCH_NS (UINT64_C(1000000000))  /* a stat and an fstat per file per second */

static void watch(int fd, const char *path, bool *gone)
{
	int r = chime_seg_named(fd, path);

	if (r == 1)
		*gone = false;
	/* Named; said already; or an error (ENOMEM, EACCES) this time: the next look tries again. */
	if ((r != 0 && r != -EEXIST) || *gone)
		return;
	*gone = true;
	/*
	 * Without its directory a stop cannot write it again (keep_file()
	 * fails, and says so, too late): the way out is to make the directory
	 * again before the stop.
	 */
	if (r == 0 && dir_gone(path))
		log_msg(LOG_ERR, "'%s' was removed with its directory while the broker runs: a crash now would "
			"lose the named sessions' timers, and so would a stop until the directory is made again "
			"(same owner and mode), where the stop writes it again", path);
	else if (r == 0)
		log_msg(LOG_ERR, "'%s' was removed while the broker runs: a crash now would lose the named "
			"sessions' timers (a stop writes it again)", path);
	else
		log_msg(LOG_ERR, "'%s' was replaced by another file while the broker runs: a crash or a stop "
			"now would lose the named sessions' timers (remove that file: a stop then writes it "
			"again)", path);
}

/*
 * The socket file removed or replaced (a cleanup of its directory): the
 * broker goes on serving its clients, but no new one can connect until it
 * is restarted. Said once per removal, as a state file's.
 */
static void watch_socket(struct broker *b)
{
	struct stat st;
	bool named;
	int r;

	if (!b->sock_st.st_ino)
		return;
	r = lstat(b->o.socket_path, &st);
	if (r < 0 && errno != ENOENT)
		return;         /* cannot tell this time */
	named = r == 0 && st.st_dev == b->sock_st.st_dev && st.st_ino == b->sock_st.st_ino;
	if (named || b->sock_gone) {
		b->sock_gone = !named && b->sock_gone;
		return;
	}
	b->sock_gone = true;
	if (r < 0 && dir_gone(b->o.socket_path))
		log_msg(LOG_ERR, "socket '%s' was removed while the broker runs, and its directory is gone too: "
			"its clients go on, but no new one can connect, nor can a restart listen there until the "
			"directory is made again (same owner and mode)", b->o.socket_path);
	else
		log_msg(LOG_ERR, "socket '%s' was removed or replaced while the broker runs: its clients go on, "
			"but no new one can connect (chimectl restart, or a stop and a start, makes it again)",
			b->o.socket_path);
}

/* What the look found, for chimestat: the log says it once, an operator may look later. */
static void publish_gone(struct broker *b)
{
	uint16_t shards = 0;

	if (!b->ctl)
		return;
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		shards += b->shards[i].seg_fd >= 0 && b->shards[i].file_gone;
	at_store(&b->ctl->socket_gone, (uint8_t)b->sock_gone);
	at_store(&b->ctl->sessions_file_gone, (uint8_t)(b->sess.fd >= 0 && b->sess_gone));
	at_store(&b->ctl->shard_files_gone, shards);
	at_store(&b->ctl->session_records_unwritten, b->recs_stale);
}

void restart_watch(struct broker *b, uint64_t now)
{
	if (now - b->watched_ns < WATCH_NS)
		return;
	b->watched_ns = now;
	watch_socket(b);
	if (b->sess.fd >= 0)
		watch(b->sess.fd, b->sess_path, &b->sess_gone);
	for (uint32_t i = 0; i < b->o.nr_shards; i++)
		if (b->shards[i].seg_fd >= 0)
			watch(b->shards[i].seg_fd, b->shards[i].path, &b->shards[i].file_gone);
	publish_gone(b);
}
