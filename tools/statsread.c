/* SPDX-License-Identifier: MIT */
/*
 * statsread.c - read-only access to the control segment for the tools.
 *
 * Invariants:
 * - the mapping is PROT_READ of a file opened O_RDONLY: a tool can never
 *   disturb the broker, and group members need no write permission;
 * - the segment's geometry (counts and offsets in its header) is checked
 *   against the mapping's size before anything is indexed with it: a
 *   corrupt or truncated file gives -EBADMSG, not a crash;
 * - every block is copied with chime_stats_read(), so a value is never torn;
 *   a block a dead writer left mid-update is copied anyway and counted in
 *   snap->torn (the best there is, and the caller says so);
 * - every name in a snapshot (version, comm, session) is printable UTF-8
 *   (chime_printable()), whoever wrote the segment;
 * - every read of a mapping runs in sr_guard(): a file truncated under it
 *   is an error (-ENODATA), not SIGBUS.
 */
#include "statsread.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"

/*
 * A live writer holds a block's seq odd for well under 1 us, unless it is
 * preempted inside it: so retry in rounds, yielding between them, for up to
 * SR_READ_WAIT_NS before declaring the block torn (a dead writer). That is
 * one wait per snapshot, shared by its blocks: a writer is inside one block
 * at a time, and a segment whose every block is odd (not chimed's) took
 * 50 ms a block, minutes a snapshot.
 */
#define SR_READ_TRIES   1000u
#define SR_READ_WAIT_NS UINT64_C(50000000)

/*
 * sr_guard(): a SIGBUS handler and sigsetjmp()/siglongjmp(), the one way to
 * survive the fault itself (checking the size first cannot: the file may
 * shrink right after; copying with pread() would cost a syscall per block,
 * and a shard's slab is gigabytes). The handler jumps only out of a
 * guarded read of the mapping it guards, one it knows to hold no lock and
 * to leave nothing half done; per thread (a fault is delivered to the
 * thread that faulted). libchime does not use it: it maps only memfds the
 * broker sealed against shrinking.
 */
static _Thread_local sigjmp_buf *volatile guard_jmp;
static _Thread_local const struct chime_map *volatile guard_map;
static struct sigaction guard_old;      /* SIGBUS's action before ours: what takes any other */

static void guard_on_sigbus(int sig, siginfo_t *si, void *uc)
{
	const struct chime_map *m = guard_map;
	uintptr_t at = (uintptr_t)si->si_addr;

	(void)uc;
	/* si_code > 0: a fault, not a kill(); at: inside the mapping guarded. */
	if (m && si->si_code > 0 && at >= (uintptr_t)m->base && at - (uintptr_t)m->base < m->size) {
		guard_map = NULL;
		siglongjmp(*guard_jmp, 1);
	}
	/*
	 * Not ours: as if we had never handled it. A fault happens again as
	 * the load is retried, a signal sent is sent again (blocked until
	 * this returns).
	 */
	sigaction(SIGBUS, &guard_old, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

/* Once per process, whichever thread comes first: installed twice, guard_old would be ours. */
static void guard_install(void)
{
	struct sigaction sa = { .sa_sigaction = guard_on_sigbus, .sa_flags = SA_SIGINFO };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &guard_old);
}

int sr_guard(const struct chime_map *m, int (*reader)(void *arg), void *arg)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	sigjmp_buf jb;

	pthread_once(&once, guard_install);
	/* 1: the jump restores the signal mask, SIGBUS unblocked again. */
	if (sigsetjmp(jb, 1))
		return -ENODATA;
	guard_jmp = &jb;
	guard_map = m;
	{
		int r = reader(arg);

		guard_map = NULL;
		return r;
	}
}

struct copy {
	void *dst;
	const void *src;
	size_t len;
};

static int copy_read(void *arg)
{
	const struct copy *c = arg;

	memcpy(c->dst, c->src, c->len);
	return 0;
}

int sr_copy(const struct chime_map *m, void *dst, uint64_t off, size_t len)
{
	if (off > m->size || len > m->size - off)
		return -EBADMSG;
	return sr_guard(m, copy_read, &(struct copy){ dst, (const char *)m->base + off, len });
}

struct check {
	const struct chime_map *m;
	uint32_t kind;
	uint32_t *layout;
};

static int check_read(void *arg)
{
	const struct check *c = arg;

	return chime_seg_check(c->m, c->kind, c->layout);
}

int sr_map(const char *path, uint32_t kind, struct chime_map *m, struct stat *st, uint32_t *layout)
{
	/*
	 * O_NONBLOCK: a FIFO at the path must not hang the open (a regular file
	 * ignores it). O_NOFOLLOW, O_NOCTTY: chimed creates its files, never a
	 * symlink, and one planted there would have a tool (often root's) open
	 * whatever it names: a device whose open does something (a watchdog, a
	 * tape), a terminal made the tool's own.
	 */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
	struct chime_map map;
	int r;

	if (fd < 0)
		return -errno;
	r = st && fstat(fd, st) < 0 ? -errno : chime_seg_map_file(fd, false, &map);
	close(fd);
	if (r < 0)
		return r;
	r = sr_guard(&map, check_read, &(struct check){ &map, kind, layout });
	if (r < 0) {
		chime_seg_unmap(&map);
		return r;
	}
	*m = map;
	return 0;
}

int sr_socket_path(char *buf, size_t len, const char *arg)
{
	int n;

	if (arg && !*arg)
		return -EINVAL;         /* an empty --socket is a mistake, not the default */
	n = snprintf(buf, len, "%s", chime_socket_path(arg, NULL));
	if (n < 0 || (size_t)n >= len || n > SR_SOCKET_PATH_MAX)
		return -ENAMETOOLONG;
	return 0;
}

/* [off, off + n * size) lies inside the mapping and is 8-byte aligned. */
static int sr_fits(uint64_t map_size, uint64_t off, uint64_t n, uint64_t size)
{
	if (off % 8 || off < sizeof(struct chime_ctl) || off > map_size)
		return 0;
	if (n && size > (map_size - off) / n)
		return 0;
	return 1;
}

/*
 * An unfinished control segment (not published yet): a broker starting,
 * or one that died starting. The lock file names the broker that holds it
 * (its pid); no file, or a pid that is gone, is no broker. A lock file this
 * user cannot read (another user's broker) says nothing: alive, as far as
 * we know.
 */
bool sr_broker_alive(const char *sock)
{
	char path[PATH_MAX], buf[32] = "";
	ssize_t n;
	long pid;
	int fd;

	snprintf(path, sizeof(path), "%s.lock", sock);
	/* O_NONBLOCK: a FIFO put there (the directory's owner may) must not hang the open. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return errno != ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	pid = n > 0 ? strtol(buf, NULL, 10) : 0;
	return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* sr_open()'s checks, under sr_guard(): the geometry, copied into s once checked. */
static int geometry_read(void *arg)
{
	struct sr *s = arg;
	const struct chime_ctl *c = s->map.base;
	uint64_t shards_off, clients_off, cstats_off;

	/* The geometry is written before the magic (which sr_map() acquired). */
	s->nr_shards = c->nr_shards;
	s->max_clients = c->max_clients;
	shards_off = c->shards_off;
	clients_off = c->clients_off;
	cstats_off = c->client_stats_off;
	if (!s->nr_shards || s->nr_shards > CHIME_MAX_SHARDS || s->max_clients > UINT16_MAX + 1u ||
	    !sr_fits(s->map.size, shards_off, s->nr_shards, sizeof(struct chime_shard_ctl)) ||
	    !sr_fits(s->map.size, clients_off, s->max_clients, sizeof(struct chime_client_ctl)) ||
	    !sr_fits(s->map.size, cstats_off, (uint64_t)s->max_clients * s->nr_shards,
		     sizeof(struct chime_client_stats)))
		return -EBADMSG;
	s->shards_off = shards_off;
	s->clients_off = clients_off;
	s->client_stats_off = cstats_off;
	return 0;
}

int sr_open(struct sr *s, const char *sock)
{
	struct stat st;
	int r;

	memset(s, 0, sizeof(*s));
	if (strlen(sock) >= sizeof(s->sock))
		return -ENAMETOOLONG;
	strcpy(s->sock, sock);
	snprintf(s->ctl_path, sizeof(s->ctl_path), "%s.ctl", sock);
	/* The file's identity kept for sr_follow(). */
	r = sr_map(s->ctl_path, CHIME_SEG_CONTROL, &s->map, &st, &s->layout_seen);
	if (r == -EAGAIN && !sr_broker_alive(sock))
		r = -ESRCH;
	if (r < 0)
		return r;
	s->dev = st.st_dev;
	s->ino = st.st_ino;
	s->uid = st.st_uid;
	r = sr_guard(&s->map, geometry_read, s);
	if (r < 0) {
		chime_seg_unmap(&s->map);
		return r;
	}
	s->ctl = s->map.base;
	return 0;
}

void sr_close(struct sr *s)
{
	chime_seg_unmap(&s->map);
	s->ctl = NULL;
}

bool sr_segment_gone(const struct sr *s)
{
	struct stat st;

	/* A stopping broker empties its segment, then removes it (broker_stop()). */
	return stat(s->ctl_path, &st) < 0 || st.st_dev != s->dev || st.st_ino != s->ino || st.st_size == 0;
}

int sr_follow(struct sr *s)
{
	struct stat st;
	struct sr *n;

	if (stat(s->ctl_path, &st) < 0 || (st.st_dev == s->dev && st.st_ino == s->ino))
		return 0;
	n = malloc(sizeof(*n));         /* two paths of PATH_MAX: not on the stack */
	if (!n)
		return 0;
	if (sr_open(n, s->sock) < 0) {
		free(n);
		return 0;
	}
	sr_close(s);
	*s = *n;
	free(n);
	return 1;
}

void sr_strerror(const struct sr *s, int err, char *buf, size_t len)
{
	switch (err) {
	case -ENOENT:
		snprintf(buf, len, "cannot open '%s': %s (is chimed running?)", s->ctl_path, strerror(-err));
		break;
	case -EACCES:
		snprintf(buf, len, "cannot open '%s': %s (the broker's counters and timers are for root, "
			 "the broker's user and the group given to chimed --stats-group)",
			 s->ctl_path, strerror(-err));
		break;
	case -EAGAIN:
		snprintf(buf, len, "cannot read '%s': not ready yet (chimed is starting; try again)", s->ctl_path);
		break;
	case -ESRCH:
		snprintf(buf, len, "cannot read '%s': chimed is not running (it died while starting, leaving "
			 "this unfinished segment; the next chimed replaces it)", s->ctl_path);
		break;
	case -EPROTO:
		snprintf(buf, len, "shm layout %u of '%s' not supported (this build speaks %u); upgrade one side",
			 s->layout_seen, s->ctl_path, CHIME_SHM_LAYOUT);
		break;
	case -EBADMSG:
		snprintf(buf, len, "cannot read '%s': not a chime control segment, or corrupt", s->ctl_path);
		break;
	case -ENODATA:
		snprintf(buf, len, "cannot read '%s': " SR_SHRANK_WHY, s->ctl_path);
		break;
	case -ESTALE:
		snprintf(buf, len, "cannot read '%s': its chimed stopped as it was read (a stopping broker empties "
			 "and removes it; the next one makes its own)", s->ctl_path);
		break;
	case -ELOOP:
		snprintf(buf, len, "cannot open '%s': " SR_SYMLINK_WHY, s->ctl_path);
		break;
	case -ENOMEM:
		snprintf(buf, len, "cannot read '%s': %s", s->ctl_path, strerror(-err));
		break;
	default:
		snprintf(buf, len, "cannot open '%s': %s", s->ctl_path, strerror(-err));
	}
}

void sr_perror(const char *prog, const struct sr *s, int err)
{
	char msg[PATH_MAX + 256];

	sr_strerror(s, err, msg, sizeof(msg));
	fprintf(stderr, "%s: %s\n", prog, msg);
}

/* *wait_ns: what is left of the snapshot's wait; the time spent here comes off it. */
static int sr_read_block(struct sr_snap *snap, void *dst, const void *src, size_t len, uint64_t *wait_ns)
{
	uint64_t t0 = 0, now = 0;
	int r;

	while ((r = chime_stats_read(dst, src, len, SR_READ_TRIES)) < 0) {
		now = now_ns();
		if (!t0)
			t0 = now;
		else if (now - t0 >= *wait_ns)
			break;
		sched_yield();
	}
	if (t0)
		*wait_ns -= now - t0 < *wait_ns ? now - t0 : *wait_ns;
	if (r < 0)
		snap->torn++;
	return r;
}

struct snap_read {
	const struct sr *s;
	struct sr_snap *snap;
	int64_t timens;         /* chime_timens_monotonic(): ours, read before the guard */
};

/* sr_snapshot()'s reads, under sr_guard(): into the snapshot's own memory only. */
static int snapshot_read(void *arg)
{
	const struct sr *s = ((struct snap_read *)arg)->s;
	struct sr_snap *snap = ((struct snap_read *)arg)->snap;
	int64_t timens = ((struct snap_read *)arg)->timens;
	const char *base = s->map.base;
	const struct chime_shard_ctl *sc;
	const struct chime_client_ctl *cc;
	const struct chime_client_stats *cs;
	uint64_t wait_ns = SR_READ_WAIT_NS;
	uint32_t i, k;

	/*
	 * The header has no seqlock: its fields are written one at a time and
	 * each is read once here (relaxed), so each is whole; the geometry is
	 * the one checked at sr_open().
	 */
	memcpy(&snap->hdr, s->ctl, sizeof(snap->hdr));
	snap->hdr.state = at_load(&s->ctl->state);
	snap->hdr.heartbeat_ns = at_load(&s->ctl->heartbeat_ns);
	snap->hdr.beat_ms = at_load(&s->ctl->beat_ms);
	/* RS3: acquire, so that the reset's time read next is this generation's (pairs with RS1). */
	snap->hdr.stats_reset_gen = at_load_acq(&s->ctl->stats_reset_gen);
	snap->hdr.stats_reset_ns = at_load(&s->ctl->stats_reset_ns);
	snap->hdr.stats_reset_realtime_ns = at_load(&s->ctl->stats_reset_realtime_ns);
	snap->hdr.nr_shards = s->nr_shards;
	snap->hdr.max_clients = s->max_clients;
	snap->hdr.shards_off = s->shards_off;
	snap->hdr.clients_off = s->clients_off;
	snap->hdr.client_stats_off = s->client_stats_off;
	snap->hdr.version[sizeof(snap->hdr.version) - 1] = '\0';
	chime_printable(snap->hdr.version, sizeof(snap->hdr.version));
	/*
	 * On the broker's clock before the shards' windows are read: their
	 * slots are stamped with its seconds (another time namespace's reader
	 * found the last 10 s empty). unsigned: a scribbled segment's offset
	 * wraps, as any of its times may.
	 */
	snap->clock_off = (int64_t)((uint64_t)snap->hdr.mono_off - (uint64_t)timens);
	snap->now_ns += (uint64_t)snap->clock_off;

	/* The offsets checked at sr_open(), never the segment's again (its writer may change them). */
	sc = (const struct chime_shard_ctl *)(base + s->shards_off);
	for (k = 0; k < s->nr_shards; k++) {
		struct chime_shard_stats *st = &snap->shards[k];

		struct sr_shard *d = &snap->sh[k];

		sr_read_block(snap, st, &sc[k].stats, sizeof(*st), &wait_ns);
		/* Since the reset: lat[] never goes back, lat_base[] is its copy at the reset. */
		for (i = 0; i < CHIME_LAT_BUCKETS; i++) {
			d->lat[i] = st->lat[i] >= st->lat_base[i] ? st->lat[i] - st->lat_base[i] : 0;
			snap->lat[i] += d->lat[i];
		}
		d->lat_sum_ns = st->lat_sum_ns >= st->lat_sum_base_ns ? st->lat_sum_ns - st->lat_sum_base_ns : 0;
		snap->lat_sum_ns += d->lat_sum_ns;
		if (st->lat_max_ns > snap->lat_max_ns)
			snap->lat_max_ns = st->lat_max_ns;
		sr_window(st, snap->now_ns, d->win, &d->win_sum_ns, &d->win_max_ns);
		sr_window(st, snap->now_ns, snap->win, &snap->win_sum_ns, &snap->win_max_ns);
		snap->reset_pending += st->reset_gen != snap->hdr.stats_reset_gen;
	}

	cc = (const struct chime_client_ctl *)(base + s->clients_off);
	cs = (const struct chime_client_stats *)(base + s->client_stats_off);
	for (i = 0; i < s->max_clients; i++) {
		struct sr_client *cl = &snap->clients[snap->nr_clients];

		sr_read_block(snap, &cl->id, &cc[i], sizeof(cl->id), &wait_ns);
		if (cl->id.state != CHIME_CLIENT_ACTIVE && cl->id.state != CHIME_CLIENT_DYING &&
		    cl->id.state != CHIME_CLIENT_DETACHED)
			continue;
		cl->id.comm[sizeof(cl->id.comm) - 1] = '\0';
		cl->id.session[sizeof(cl->id.session) - 1] = '\0';
		/*
		 * chimed writes printable names only, but the segment's writer
		 * is whoever owns the directory --socket names: every output
		 * (a terminal, JSON, Prometheus) gets printable UTF-8 from here.
		 */
		chime_printable(cl->id.comm, sizeof(cl->id.comm));
		chime_printable(cl->id.session, sizeof(cl->id.session));
		cl->slot = i;
		memset(&cl->sum, 0, sizeof(cl->sum));
		for (k = 0; k < s->nr_shards; k++) {
			struct chime_client_stats b;

			sr_read_block(snap, &b, &cs[(uint64_t)i * s->nr_shards + k], sizeof(b), &wait_ns);
			/* A shard that has not adopted this client yet still
			 * holds the previous occupant's counters: skip them. */
			if (b.generation != cl->id.generation)
				continue;
			cl->sum.armed += b.armed;
			cl->sum.arms += b.arms;
			cl->sum.resets += b.resets;
			cl->sum.cancels += b.cancels;
			cl->sum.fires += b.fires;
			cl->sum.cq_depth += b.cq_depth;
			cl->sum.backlog += b.backlog;
			cl->sum.wakeups += b.wakeups;
			cl->sum.refused_nomem += b.refused_nomem;
			cl->sum.refused_quota += b.refused_quota;
			cl->sum.refused_user_quota += b.refused_user_quota;
			cl->sum.malformed += b.malformed;
			cl->sum.owned += b.owned;
			cl->sum.slow_wakeups += b.slow_wakeups;
#define SR_MAX(f) (cl->sum.f = b.f > cl->sum.f ? b.f : cl->sum.f)
			SR_MAX(sq_depth);
			SR_MAX(sq_depth_max);
			SR_MAX(cq_depth_max);
			SR_MAX(lat_max_ns);
#undef SR_MAX
			for (uint32_t j = 0; j < CHIME_LAT_BUCKETS; j++)
				cl->sum.lat[j] += b.lat[j];
		}
		cl->sum.generation = cl->id.generation;
		snap->nr_clients++;
	}
	return 0;
}

int sr_snapshot(const struct sr *s, struct sr_snap *snap)
{
	int r;

	memset(snap, 0, sizeof(*snap));
	snap->shards = calloc(s->nr_shards, sizeof(*snap->shards));
	snap->sh = calloc(s->nr_shards, sizeof(*snap->sh));
	snap->clients = calloc(s->max_clients ? s->max_clients : 1, sizeof(*snap->clients));
	if (!snap->shards || !snap->sh || !snap->clients) {
		sr_snap_free(snap);
		return -ENOMEM;
	}
	snap->now_ns = now_ns();
	r = sr_guard(&s->map, snapshot_read, &(struct snap_read){ s, snap, chime_timens_monotonic() });
	if (r == -ENODATA && sr_segment_gone(s))
		r = -ESTALE;
	if (r < 0) {
		sr_snap_free(snap);
		return r;
	}
	return 0;
}

uint64_t sr_now(const struct sr_snap *snap)
{
	return now_ns() + (uint64_t)snap->clock_off;
}

void sr_snap_free(struct sr_snap *snap)
{
	free(snap->shards);
	free(snap->sh);
	snap->sh = NULL;
	free(snap->clients);
	snap->shards = NULL;
	snap->clients = NULL;
}

const char *sr_state_name(uint32_t state)
{
	switch (state) {
	case CHIME_BROKER_STARTING:
		return "starting";
	case CHIME_BROKER_RUNNING:
		return "running";
	case CHIME_BROKER_STOPPED:
		return "stopped";
	}
	return "unknown";
}

const char *sr_client_state(uint32_t state)
{
	return state == CHIME_CLIENT_DYING ? "dying" : state == CHIME_CLIENT_DETACHED ? "detached" : "active";
}

char sr_pid_state(pid_t pid)
{
	char buf[512];
	const char *f = chime_proc_stat(pid, buf, sizeof(buf));

	return f ? f[0] : 0;
}

/* Append "; " and the formatted text to buf (cut to len). */
static void sr_append(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sr_append(char *buf, size_t len, const char *fmt, ...)
{
	size_t at = strlen(buf);
	va_list ap;

	if (at && at + 2 < len) {
		memcpy(buf + at, "; ", 3);
		at += 2;
	}
	if (at + 1 >= len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + at, len - at, fmt, ap);
	va_end(ap);
}

bool sr_files_warning(const struct chime_ctl *h, char *buf, size_t len)
{
	uint32_t shards = h->shard_files_gone, recs = h->session_records_unwritten;

	if (!len)
		return false;
	buf[0] = '\0';
	if (h->socket_gone)
		sr_append(buf, len, "its socket was removed or replaced: no new client can connect until a restart");
	if (h->sessions_file_gone || shards) {
		char what[64];

		if (h->sessions_file_gone && shards)
			snprintf(what, sizeof(what), "its sessions file and %u shard file%s were", shards,
				 shards == 1 ? "" : "s");
		else if (h->sessions_file_gone)
			snprintf(what, sizeof(what), "its sessions file was");
		else
			snprintf(what, sizeof(what), "%u shard file%s %s", shards, shards == 1 ? "" : "s",
				 shards == 1 ? "was" : "were");
		sr_append(buf, len, "%s removed or replaced: a crash now would lose the named sessions' timers "
			  "(a stop writes them again)", what);
	}
	if (recs)
		sr_append(buf, len, "%u session record%s could not be written to the sessions file (tried again at "
			  "every heartbeat; a restart meanwhile loses %s)", recs, recs == 1 ? "" : "s",
			  recs == 1 ? "that session's change" : "those sessions' changes");
	return buf[0] != '\0';
}

enum sr_state sr_liveness(const struct sr_snap *snap, const char **why)
{
	char st;

	uint64_t hb = snap->hdr.heartbeat_ns;
	const char *dummy;

	if (!why)
		why = &dummy;
	if (snap->hdr.state == CHIME_BROKER_STOPPED) {
		*why = "chimed stopped cleanly";
		return SR_STOPPED;
	}
	/*
	 * The pid test is exact on this host but meaningless from another pid
	 * namespace, so the heartbeat decides too: either one failing means
	 * not running. EPERM means the process exists (another user's).
	 */
	if (snap->hdr.pid <= 0 || (kill(snap->hdr.pid, 0) < 0 && errno == ESRCH)) {
		*why = "chimed is not running (its process is gone)";
		return SR_DEAD;
	}
	/* killed, not yet reaped: kill() still finds it, for as long as its parent waits */
	st = sr_pid_state(snap->hdr.pid);
	if (st == 'Z' || st == 'X') {
		*why = "chimed is not running (its process has exited)";
		return SR_DEAD;
	}
	if (snap->now_ns > hb && snap->now_ns - hb > SR_HEARTBEAT_STALE_NS) {
		*why = "chimed is not running (stale heartbeat)";
		return SR_DEAD;
	}
	if (snap->hdr.state == CHIME_BROKER_STARTING) {
		*why = "chimed is starting";
		return SR_STARTING;
	}
	if (snap->hdr.state != CHIME_BROKER_RUNNING) {
		*why = "chimed is in an unknown state";
		return SR_DEAD;
	}
	*why = "chimed is running";
	return SR_RUNNING;
}

uint64_t sr_hist_count(const uint64_t *hist)
{
	uint64_t n = 0;
	uint32_t b;

	for (b = 0; b < CHIME_LAT_BUCKETS; b++)
		n += hist[b];
	return n;
}

uint64_t sr_percentile(const uint64_t *hist, uint64_t max_ns, double p)
{
	uint64_t n = sr_hist_count(hist), rank, cum = 0, up;
	uint32_t b;

	if (!n)
		return 0;
	if (p <= 0)
		p = 1e-12;
	if (p > 1)
		p = 1;
	/* Nearest rank: the smallest sample with at least p*n samples <= it. */
	rank = (uint64_t)((double)n * p);
	if ((double)rank < (double)n * p)
		rank++;
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	for (b = 0; b < CHIME_LAT_BUCKETS; b++) {
		cum += hist[b];
		if (cum >= rank)
			break;
	}
	if (b >= CHIME_LAT_BUCKETS)
		b = CHIME_LAT_BUCKETS - 1;
	/* Report the bucket's upper bound (never understate lateness), but
	 * no more than the exact maximum. */
	up = chime_lat_upper_ns(b);
	return up < max_ns ? up : max_ns;
}

void sr_window(const struct chime_shard_stats *s, uint64_t now_ns, uint64_t *hist,
	       uint64_t *sum_ns, uint64_t *max_ns)
{
	uint64_t sec = now_ns / UINT64_C(1000000000);

	for (uint32_t w = 0; w < CHIME_LAT_WINDOW; w++) {
		const struct chime_lat_second *ls = &s->win[w];

		/* Stale (older than the window) or ahead of our clock (never, on one host): skip. */
		if (ls->sec > sec || sec - ls->sec >= CHIME_LAT_WINDOW)
			continue;
		for (uint32_t b = 0; b < CHIME_LAT_BUCKETS; b++)
			hist[b] += ls->lat[b];
		*sum_ns += ls->sum_ns;
		if (ls->max_ns > *max_ns)
			*max_ns = ls->max_ns;
	}
}

int64_t sr_rel_ns(uint64_t deadline_ns, uint64_t now_ns)
{
	uint64_t dist = deadline_ns < now_ns ? now_ns - deadline_ns : deadline_ns - now_ns;
	int64_t mag = dist > INT64_MAX ? INT64_MAX : (int64_t)dist;

	return deadline_ns < now_ns ? -mag : mag;
}

double sr_rate(uint64_t a, uint64_t b, uint64_t dt_ns)
{
	if (!dt_ns || b < a)
		return 0;
	return (double)(b - a) * 1e9 / (double)dt_ns;
}

int sr_stdout_check(const char *prog)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return SR_EXIT_OK;
	if (errno != EPIPE)
		fprintf(stderr, "%s: write to stdout failed: %s\n", prog, errno ? strerror(errno) : "I/O error");
	return SR_EXIT_NOSHM;
}

const char *sr_fmt_dur(char *buf, size_t len, uint64_t ns)
{
	uint64_t s = ns / 1000000000u;

	if (s >= 86400)
		snprintf(buf, len, "%llud%02lluh%02llum", (unsigned long long)(s / 86400),
			 (unsigned long long)(s / 3600 % 24), (unsigned long long)(s / 60 % 60));
	else if (s >= 3600)
		snprintf(buf, len, "%lluh%02llum%02llus", (unsigned long long)(s / 3600),
			 (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60));
	else if (s >= 60)
		snprintf(buf, len, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
	else
		snprintf(buf, len, "%.1fs", (double)ns / 1e9);
	return buf;
}

const char *sr_fmt_ns(char *buf, size_t len, uint64_t ns)
{
	if (ns == UINT64_MAX)
		snprintf(buf, len, "-");
	else if (ns < 1000)
		snprintf(buf, len, "%lluns", (unsigned long long)ns);
	else if (ns < 1000000)
		snprintf(buf, len, "%.1fus", (double)ns / 1e3);
	else if (ns < 1000000000)
		snprintf(buf, len, "%.1fms", (double)ns / 1e6);
	else
		snprintf(buf, len, "%.2fs", (double)ns / 1e9);
	return buf;
}
