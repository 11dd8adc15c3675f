/* SPDX-License-Identifier: MIT */
/* discard.c - see discard.h. */
#include "discard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <unistd.h>

#include "clock.h"

#define DISCARD_SEGS 3u         /* a connection's: rw, ro, touch */
/* A seal under way this long is held up by its client (see sealer_step()): another sealer takes the rest. */
#define SEAL_STUCK_NS (UINT64_C(1000) * 1000000u)
/* Sealers at most, held up or not: past them the jobs wait for one to be let go. */
#define SEALERS_MAX 16u
/* How long a stop waits for the sealers under way (discard_stop()). */
#define SEAL_STOP_WAIT_NS (UINT64_C(1000) * 1000000u)
/* A helper gone (killed): the next one is forked this long after, at a step. */
#define HELPER_RESPAWN_NS (UINT64_C(1000) * 1000000u)

/* A job as the helper gets it: one datagram, its descriptors attached in order. */
struct discard_msg {
	uint32_t nfds;
	uint32_t punch;                 /* 0: close them only */
	uint64_t sizes[DISCARD_SEGS];   /* bytes of descriptor i to punch out */
};

struct discard_job {
	struct discard_job *next;
	uint32_t uid;           /* the user the connection counted against (waiting()) */
	unsigned max;           /* that user's jobs that may wait for the helper */
	unsigned n;
	struct chime_map maps[DISCARD_SEGS];    /* ours, unmapped by discard_step() before the helper sees it */
	int fds[DISCARD_SEGS];
	size_t sizes[DISCARD_SEGS];
	unsigned unsealed;                      /* segments to seal before the unmap (discard_post()) */
	int seal_err[DISCARD_SEGS];             /* the sealer's: 0, or why segment i could not be sealed */
	uint64_t seal_t0;                       /* under slock: when a sealer began it; 0 while none has */
	struct discard_job *snext;              /* the caller's thread only: on d->sealing until sealed */
};

/* A segment its client sealed for good, unsealed against writes: ours stays mapped (discard_post()). */
struct discard_kept {
	struct discard_kept *next;
	uint32_t uid;
	struct chime_map map;
};

/*
 * The caller's thread only, but for the sealers' part (slock). The helper
 * is a process: nothing here is shared with it but the socket.
 */
struct discard {
	char *exe;                          /* chimed's path, run again as the helper */
	pid_t helper;                       /* 0 while there is none (and sock is -1) */
	int sock;                           /* ours: jobs out, a byte back for each one done */
	uint64_t lost_ns;                   /* when the last one was lost */
	unsigned lost;                      /* helpers lost so far */
	struct discard_job *head, **tail;   /* unmapped, its descriptors ours, not sent yet */
	struct discard_job *sent, **sent_tail;  /* sent, the helper's until its byte comes back (in order) */
	struct discard_job *pend, **pend_tail;  /* posted, still mapped (discard_step() unmaps) */

	/*
	 * Sealers: threads at normal priority, started while jobs wait for
	 * one, each gone once none waits. A seal costs no CPU, but waits for
	 * the memfd's inode lock, which its client can hold for as long as it
	 * likes (a write() from a buffer whose page fault it serves: FUSE,
	 * userfaultfd): never on the caller's thread, and one held up holds
	 * up nobody else's (sealer_step()).
	 */
	pthread_mutex_t slock;
	pthread_cond_t scond;               /* a sealer left: discard_stop() waits for the last */
	struct discard_job *shead, **stail; /* under slock: to seal */
	struct discard_job *sdone;          /* under slock: sealed (or not), for the caller's thread */
	unsigned sealers;                   /* under slock: sealers running */
	uint32_t sealing_uid[SEALERS_MAX];  /* under slock: the users whose seal is under way ... */
	unsigned nsealing;                  /* ... one per sealer at most (sjob_take()) */
	bool sstop;                         /* under slock: take no more jobs */
	struct discard_job *spend;          /* the caller's thread only: not handed to the sealer yet */
	struct discard_job *sealing;        /* the caller's thread only: every job not back from it (snext) */
	struct discard_kept *kept;          /* the caller's thread only */
};

static void fds_close(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Every descriptor but `keep`: close_range(), or one by one where a filter refuses it. */
static void close_all_but(int keep)
{
	struct rlimit rl;
	unsigned max = 1u << 20;

	if ((keep == 0 || close_range(0, (unsigned)keep - 1, 0) == 0) &&
	    close_range((unsigned)keep + 1, ~0u, 0) == 0)
		return;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < max)
		max = (unsigned)rl.rlim_cur;
	for (unsigned fd = 0; fd < max; fd++)
		if ((int)fd != keep)
			(void)close((int)fd);
}

_Noreturn void discard_helper_main(const char *parent_pid)
{
	struct sched_param idle = { .sched_priority = 0 };
	pid_t parent = (pid_t)strtol(parent_pid, NULL, 10);
	int sock = DISCARD_HELPER_FD;

	/* Gone with the broker, however it ends (a stop kills it first); not a helper of anyone else's. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		_exit(0);
	close_all_but(sock);    /* its standard streams: what it has to say goes nowhere */
	(void)prctl(PR_SET_NAME, DISCARD_HELPER_NAME);
	(void)sched_setscheduler(0, SCHED_IDLE, &idle);
	for (;;) {
		struct discard_msg m;
		union {
			char buf[CMSG_SPACE(sizeof(int) * DISCARD_SEGS)];
			struct cmsghdr align;
		} u;
		struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
				     .msg_controllen = sizeof(u.buf) };
		struct cmsghdr *c;
		ssize_t r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			_exit(0);       /* the broker closed its end */
		for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			unsigned nfds;
			int fds[DISCARD_SEGS];

			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			nfds = (unsigned)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			if (nfds > DISCARD_SEGS)
				nfds = DISCARD_SEGS;
			memcpy(fds, CMSG_DATA(c), nfds * sizeof(int));
			for (unsigned i = 0; i < nfds; i++) {
				if ((size_t)r == sizeof(m) && m.punch && i < m.nfds && m.sizes[i])
					(void)chime_seg_discard(fds[i], (size_t)m.sizes[i]);
				close(fds[i]);
			}
		}
		while ((r = send(sock, "", 1, MSG_NOSIGNAL)) < 0 && errno == EINTR)
			;
		if (r < 0)
			_exit(0);
	}
}
/*
 * Seal each unsealed segment against writes through our descriptor. Once
 * that returns no punch is under way (a seal is added under the inode
 * lock, which a punch holds from its start to its end) and none can
 * start: the caller's munmap, which takes the lock a punch holds while it
 * tears the pages out of every mapping, no longer waits for the client.
 * A memfd its client sealed for good (F_SEAL_SEAL) refuses the seal: kept
 * mapped, unless the client sealed it against writes itself.
 */
static void job_seal(struct discard_job *j)
{
	for (unsigned i = 0; i < j->n; i++) {
		int seals;

		if (!(j->unsealed & (1u << i)))
			continue;
		if (fcntl(j->fds[i], F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0) {
			j->seal_err[i] = 0;
			continue;
		}
		j->seal_err[i] = -errno;
		seals = fcntl(j->fds[i], F_GET_SEALS);
		if (seals >= 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
			j->seal_err[i] = 0;
	}
}

/* Under slock: is a seal of user uid's under way? */
static bool sealing_for(const struct discard *d, uint32_t uid)
{
	for (unsigned i = 0; i < d->nsealing; i++)
		if (d->sealing_uid[i] == uid)
			return true;
	return false;
}

/* Under slock: the oldest job to seal whose user has no seal under way, or NULL. */
static struct discard_job **sjob_next(struct discard *d)
{
	for (struct discard_job **pp = &d->shead; *pp; pp = &(*pp)->next)
		if (!sealing_for(d, (*pp)->uid))
			return pp;
	return NULL;
}

/*
 * Under slock: that job, off the list, its user's seal under way. One at a
 * time per user: a client holding its memfd's inode lock holds up one
 * sealer, and its own user's later jobs behind it, never another user's
 * (processes of one user can ptrace one another: no boundary to keep
 * between them). With any number of seals held up, SEALERS_MAX users'
 * clients are needed to hold up everyone's.
 */
static struct discard_job *sjob_take(struct discard *d, struct discard_job **pp)
{
	struct discard_job *j = *pp;

	*pp = j->next;
	if (!*pp)
		d->stail = pp;
	d->sealing_uid[d->nsealing++] = j->uid;
	return j;
}

/* Under slock: user uid's seal is over. */
static void sjob_done(struct discard *d, uint32_t uid)
{
	for (unsigned i = 0; i < d->nsealing; i++)
		if (d->sealing_uid[i] == uid) {
			d->sealing_uid[i] = d->sealing_uid[--d->nsealing];
			return;
		}
}

/* Detached: one held up by its client may never end, and nothing joins it. */
static void *sealer_main(void *arg)
{
	struct discard *d = arg;
	struct discard_job **pp, *j;

	pthread_mutex_lock(&d->slock);
	while (!d->sstop && (pp = sjob_next(d))) {
		j = sjob_take(d, pp);
		j->seal_t0 = now_ns();
		pthread_mutex_unlock(&d->slock);
		job_seal(j);
		pthread_mutex_lock(&d->slock);
		sjob_done(d, j->uid);
		j->seal_t0 = 0;
		j->next = d->sdone;
		d->sdone = j;
	}
	d->sealers--;
	pthread_cond_signal(&d->scond);
	pthread_mutex_unlock(&d->slock);
	return NULL;
}

void discard_post(struct discard *d, struct chime_map *maps, int *fds, const size_t *sizes, unsigned n,
		  uint32_t uid, unsigned max, unsigned unsealed)
{
	struct discard_job *j = d ? calloc(1, sizeof(*j)) : NULL;

	if (n > DISCARD_SEGS)
		n = DISCARD_SEGS;
	unsealed &= (1u << n) - 1;
	if (!j) {
		/* An unsealed one stays mapped, uncounted: its munmap could wait for the client. */
		for (unsigned i = 0; i < n; i++)
			if (!(unsealed & (1u << i)))
				chime_seg_unmap(&maps[i]);
		fds_close(fds, n);
	}
	for (unsigned i = 0; j && i < n; i++) {
		j->maps[i] = maps[i];
		j->fds[i] = fds[i];
		j->sizes[i] = sizes[i];
	}
	for (unsigned i = 0; i < n; i++) {
		memset(&maps[i], 0, sizeof(maps[i]));
		fds[i] = -1;
	}
	if (!j)
		return;
	j->uid = uid;
	j->max = max;
	j->n = n;
	j->unsealed = unsealed;
	for (unsigned i = 0; i < n; i++)
		j->seal_err[i] = -EAGAIN;       /* until the sealer says otherwise */
	if (unsealed) {
		j->next = d->spend;
		d->spend = j;
		j->snext = d->sealing;
		d->sealing = j;
		return;
	}
	*d->pend_tail = j;
	d->pend_tail = &j->next;
}

unsigned discard_unsealed(const struct discard *d, uint32_t uid)
{
	unsigned n = 0;

	if (!d)
		return 0;
	for (const struct discard_job *j = d->sealing; j; j = j->snext)
		if (j->uid == uid)
			n += (unsigned)__builtin_popcount(j->unsealed);
	for (const struct discard_kept *k = d->kept; k; k = k->next)
		n += k->uid == uid;
	return n;
}

/*
 * Back from the sealer (or never sealed: the broker stops): what was
 * sealed is unmapped and punched as any segment, what was not stays
 * mapped, kept, and its descriptor goes (the mapping holds the memfd).
 */
static void job_sealed(struct discard *d, struct discard_job *j)
{
	struct discard_job **pp = &d->sealing;

	while (*pp != j)
		pp = &(*pp)->snext;
	*pp = j->snext;
	for (unsigned i = 0; i < j->n; i++) {
		struct discard_kept *k;

		if (!(j->unsealed & (1u << i)) || !j->seal_err[i])
			continue;
		k = calloc(1, sizeof(*k));
		if (k) {        /* else left mapped, uncounted */
			k->uid = j->uid;
			k->map = j->maps[i];
			k->next = d->kept;
			d->kept = k;
		}
		memset(&j->maps[i], 0, sizeof(j->maps[i]));
		close(j->fds[i]);
		j->fds[i] = -1;
	}
	j->unsealed = 0;
	j->next = NULL;
	*d->pend_tail = j;
	d->pend_tail = &j->next;
}

/* Under slock: is every sealer running held up in one seal (SEAL_STUCK_NS)? */
static bool sealers_held_up(const struct discard *d, uint64_t now)
{
	unsigned held = 0;

	for (const struct discard_job *j = d->sealing; j; j = j->snext)
		held += j->seal_t0 && now - j->seal_t0 >= SEAL_STUCK_NS;
	return held >= d->sealers;
}

/* Under slock: one more sealer, detached; if none can be had, at a later step. */
static void sealer_start(struct discard *d)
{
	pthread_attr_t attr;
	pthread_t thr;

	if (pthread_attr_init(&attr) != 0)
		return;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&thr, &attr, sealer_main, d) == 0) {
		pthread_setname_np(thr, "chimed-seal");
		d->sealers++;
	}
	pthread_attr_destroy(&attr);
}

/*
 * Jobs to the sealers, and those they are done with back, never waiting
 * for their lock (they hold it for a few instructions at a time, but may
 * be preempted there): at a later step if one holds it. A sealer is
 * started while a job waits that one could take (sjob_next(): a user
 * with no seal under way) and none runs, or every one running has been
 * held up by its client for SEAL_STUCK_NS (its job stays with it, its
 * segments mapped and counted for their user: discard_unsealed()), up to
 * SEALERS_MAX: one client holding its inode lock held up every other
 * user's refused segments, mapped and counted for them until it let go.
 */
static void sealer_step(struct discard *d)
{
	struct discard_job *done;

	if (!d->sealing || pthread_mutex_trylock(&d->slock) != 0)
		return;
	while (d->spend) {
		struct discard_job *j = d->spend;

		d->spend = j->next;
		j->next = NULL;
		*d->stail = j;
		d->stail = &j->next;
	}
	/* a job none running may take (another user's): no sealer started for nothing */
	if (sjob_next(d) && (d->sealers == 0 || (d->sealers < SEALERS_MAX && sealers_held_up(d, now_ns()))))
		sealer_start(d);
	done = d->sdone;
	d->sdone = NULL;
	pthread_mutex_unlock(&d->slock);
	while (done) {
		struct discard_job *j = done;

		done = j->next;
		job_sealed(d, j);
	}
}

/* The oldest job not handed over yet, off the list. */
static struct discard_job *pend_pop(struct discard *d)
{
	struct discard_job *j = d->pend;

	d->pend = j->next;
	if (!d->pend)
		d->pend_tail = &d->pend;
	return j;
}


/* Closed here, its pages not punched: they go with the client's own close (or the helper is gone). */
static void job_close(struct discard_job *j)
{
	fds_close(j->fds, j->n);
	free(j);
}

/* Jobs of user uid waiting for the helper: queued here or sent. */
static unsigned waiting(const struct discard *d, uint32_t uid)
{
	unsigned n = 0;

	for (const struct discard_job *j = d->head; j; j = j->next)
		n += j->uid == uid;
	for (const struct discard_job *j = d->sent; j; j = j->next)
		n += j->uid == uid;
	return n;
}

/*
 * Start the helper: chimed run again (d->exe) as DISCARD_HELPER_NAME, our
 * pid its argument, its end of a socket pair its descriptor
 * DISCARD_HELPER_FD, its signals as at a start, our environment. 0, or
 * -errno. Run, not forked: a fork() shares every page of ours with the
 * child until we write it again, and each such write is then a copy and a
 * TLB flush of every CPU the broker has run on (discard.h). Started by the
 * thread that calls discard_step() (its death is the helper's:
 * PR_SET_PDEATHSIG).
 */
static int helper_spawn(struct discard *d)
{
	char parent[24];
	char *argv[] = { (char *)DISCARD_HELPER_NAME, parent, NULL };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, all;
	int sv[2], err;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	snprintf(parent, sizeof(parent), "%ld", (long)getpid());
	sigemptyset(&none);
	sigfillset(&all);       /* the broker ignores SIGPIPE and SIGCHLD: not the helper */
	err = posix_spawn_file_actions_init(&fa);
	if (err == 0) {
		err = posix_spawnattr_init(&at);
		if (err == 0) {
			if (!(err = posix_spawn_file_actions_adddup2(&fa, sv[1], DISCARD_HELPER_FD)) &&
			    !(err = posix_spawn_file_actions_addclosefrom_np(&fa, DISCARD_HELPER_FD + 1)) &&
			    !(err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)) &&
			    !(err = posix_spawnattr_setsigmask(&at, &none)) &&
			    !(err = posix_spawnattr_setsigdefault(&at, &all)))
				err = posix_spawn(&pid, d->exe, &fa, &at, argv, environ);
			posix_spawnattr_destroy(&at);
		}
		posix_spawn_file_actions_destroy(&fa);
	}
	close(sv[1]);
	if (err) {
		close(sv[0]);
		return -err;
	}
	d->helper = pid;
	d->sock = sv[0];
	return 0;
}

/*
 * The helper is gone (killed, or it failed a send): what it had is the
 * kernel's to close with its socket, what waits here is closed without
 * the punch, and discard_step() forks another after HELPER_RESPAWN_NS.
 */
static void helper_lost(struct discard *d)
{
	if (d->helper > 0)
		(void)kill(d->helper, SIGKILL);         /* reaped by the kernel: chimed ignores SIGCHLD */
	if (d->sock >= 0)
		close(d->sock);
	d->sock = -1;
	d->helper = 0;
	d->lost_ns = now_ns();
	d->lost++;
	while (d->sent) {
		struct discard_job *j = d->sent;

		d->sent = j->next;
		free(j);        /* its descriptors were closed as it was sent */
	}
	d->sent_tail = &d->sent;
	while (d->head) {
		struct discard_job *j = d->head;

		d->head = j->next;
		job_close(j);
	}
	d->tail = &d->head;
}

/* One job to the helper, without waiting: 0, -EAGAIN if its socket is full, or another -errno. */
static int job_send(int sock, const struct discard_job *j)
{
	struct discard_msg m = { .punch = 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int) * DISCARD_SEGS)];
		struct cmsghdr align;
	} u;
	int fds[DISCARD_SEGS];
	struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf };
	struct cmsghdr *c;

	memset(&u, 0, sizeof(u));
	for (unsigned i = 0; i < j->n; i++)
		if (j->fds[i] >= 0) {
			fds[m.nfds] = j->fds[i];
			m.sizes[m.nfds++] = j->sizes[i];
		}
	mh.msg_controllen = CMSG_SPACE(sizeof(int) * m.nfds);
	c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * m.nfds);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * m.nfds);
	return sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/* The helper's answers: the jobs it has done no longer count for their users. Never waits. */
static void helper_answers(struct discard *d)
{
	char ack[16];
	ssize_t r;

	while (d->sock >= 0 && d->sent) {
		r = recv(d->sock, ack, sizeof(ack), MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (r <= 0) {
			helper_lost(d);
			break;
		}
		{
			struct discard_job *j = d->sent;

			d->sent = j->next;
			if (!d->sent)
				d->sent_tail = &d->sent;
			free(j);
		}
	}
}

/* The queued jobs to the helper, as many as its socket takes (about 280 here: its send buffer). Never waits. */
static void helper_send(struct discard *d)
{
	while (d->sock >= 0 && d->head) {
		struct discard_job *j = d->head;
		bool none = true;
		int e;

		for (unsigned i = 0; i < j->n; i++)
			none &= j->fds[i] < 0;
		e = none ? 0 : job_send(d->sock, j);
		/* full, or past the descriptors the kernel lets us have in flight (RLIMIT_NOFILE): later */
		if (e == -EAGAIN || e == -EINTR || e == -ETOOMANYREFS || e == -ENOBUFS || e == -ENOMEM)
			break;
		if (e < 0) {
			helper_lost(d);
			break;
		}
		d->head = j->next;
		if (!d->head)
			d->tail = &d->head;
		fds_close(j->fds, j->n);        /* the helper's now */
		if (none) {
			free(j);
			continue;
		}
		j->next = NULL;
		*d->sent_tail = j;
		d->sent_tail = &j->next;
	}
}

/*
 * Our mappings of the oldest posted job go, then it waits for the helper
 * (or is closed here: its user's share waits already, or there is no
 * helper).
 */
static void job_hand_over(struct discard *d)
{
	struct discard_job *j = pend_pop(d);

	for (unsigned i = 0; i < j->n; i++)
		chime_seg_unmap(&j->maps[i]);
	j->next = NULL;
	if (d->sock < 0 || waiting(d, j->uid) >= j->max) {
		job_close(j);
		return;
	}
	*d->tail = j;
	d->tail = &j->next;
}

int discard_start(struct discard **out, const char *exe)
{
	struct discard *d = calloc(1, sizeof(*d));
	int r;

	if (!d || !(d->exe = strdup(exe))) {
		free(d);
		return -ENOMEM;
	}
	d->sock = -1;
	r = helper_spawn(d);
	if (r < 0) {
		free(d->exe);
		free(d);
		return r;
	}
	pthread_mutex_init(&d->slock, NULL);
	(void)cond_init_monotonic(&d->scond);       /* discard_stop()'s timed wait */
	d->tail = &d->head;
	d->sent_tail = &d->sent;
	d->stail = &d->shead;
	d->pend_tail = &d->pend;
	*out = d;
	return 0;
}

bool discard_step(struct discard *d, uint64_t budget_ns)
{
	uint64_t t0 = now_ns();

	if (!d)
		return false;
	sealer_step(d);
	if (!d->helper && now_ns() - d->lost_ns >= HELPER_RESPAWN_NS)
		(void)helper_spawn(d);          /* else at a later step */
	helper_answers(d);
	while (d->pend) {
		job_hand_over(d);
		if (now_ns() - t0 >= budget_ns)
			break;
	}
	helper_send(d);
	return d->pend != NULL;
}

int discard_poll_fd(const struct discard *d)
{
	return d && d->sent ? d->sock : -1;
}

pid_t discard_helper(const struct discard *d)
{
	return d ? d->helper : 0;
}

unsigned discard_helpers_lost(const struct discard *d)
{
	return d ? d->lost : 0;
}

void discard_stop(struct discard *d)
{
	unsigned sealers_left;

	if (!d)
		return;
	/*
	 * The sealers end the seals they are in, for SEAL_STOP_WAIT_NS at
	 * most: one its client holds up may never end, and the sessions file
	 * and the lock file wait for this. Those left keep their jobs (their
	 * segments stay mapped, for the exit) and this struct, lock and all.
	 */
	pthread_mutex_lock(&d->slock);
	d->sstop = true;
	for (struct timespec until = deadline_ts_after(SEAL_STOP_WAIT_NS); d->sealers;)
		if (pthread_cond_timedwait(&d->scond, &d->slock, &until) == ETIMEDOUT)
			break;
	sealers_left = d->sealers;
	while (d->spend || d->shead || d->sdone) {
		struct discard_job **from = d->spend ? &d->spend : d->shead ? &d->shead : &d->sdone;
		struct discard_job *j = *from;

		*from = j->next;
		job_sealed(d, j);
	}
	pthread_mutex_unlock(&d->slock);
	while (d->kept) {
		struct discard_kept *k = d->kept;

		d->kept = k->next;
		free(k);
	}
	while (d->pend) {
		struct discard_job *j = pend_pop(d);

		for (unsigned i = 0; i < j->n; i++)
			chime_seg_unmap(&j->maps[i]);
		job_close(j);
	}
	/*
	 * What waits is closed here, and what the helper has is closed with
	 * it, no punch: killed, not waited for (at idle priority it may not
	 * get a CPU for a while, and nothing of ours waits for it).
	 */
	helper_lost(d);
	if (sealers_left)
		return;         /* theirs until the exit */
	pthread_cond_destroy(&d->scond);
	pthread_mutex_destroy(&d->slock);
	free(d->exe);
	free(d);
}
