/* SPDX-License-Identifier: MIT */
/*
 * test_ring.c - the submission and completion rings (shm/ring.c).
 *
 * The multi-process tests fork real producers and consumers over sealed
 * memfds, the way chimed and libchime use them; children report by exit
 * status (criterion asserts belong to the test process only). The hostile
 * test maps every array of the broker's view as its own page-exact memfd
 * with PROT_NONE guard pages on both sides, so a single out-of-bounds access
 * by the consumer faults in any build, not only under ASan (which does not
 * instrument mmap'd memory).
 *
 * CHIME_TEST_SCALE (default 1) multiplies the record counts and durations.
 * Suite ring_stress runs ten times more and only when CHIME_STRESS is set
 * (meson test --suite stress).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "atomics.h"
#include "helpers.h"
#include "ring.h"
#include "segment.h"

/* In children: report and leave with a distinct status. */
#define CHECK(cond, code)							\
	do {									\
		if (!(cond)) {							\
			fprintf(stderr, "%s:%d: check failed: %s\n",		\
				__FILE__, __LINE__, #cond);			\
			_exit(code);						\
		}								\
	} while (0)

static unsigned scale(void)
{
	const char *s = getenv("CHIME_TEST_SCALE");
	long v = s ? strtol(s, NULL, 10) : 1;

	return v > 0 ? (unsigned)v : 1;
}

/* Spin politely: two cores are shared by more threads than that. */
static void relax(unsigned *spins)
{
	if (++*spins > 64) {
		*spins = 0;
		sched_yield();
	}
}

static pid_t spawn(int (*fn)(void *), void *arg)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		/* A test killed by its timeout takes its spinning children along. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(fn(arg));
	}
	return pid;
}

/*
 * Waits for every child; the first one that fails gets the others killed,
 * so a crashed consumer cannot leave its producer spinning until the test
 * times out. If `stop` is set, it is raised once all but pids[0] are done:
 * pids[0] is the consumer that runs until told.
 */
static void reap_all(const pid_t *pids, int *codes, int n, uint64_t *stop)
{
	int left = n, others = n - 1;

	while (left) {
		int st, code, i;
		pid_t w = waitpid(-1, &st, 0);

		if (w < 0) {
			cr_assert_eq(errno, EINTR);
			continue;
		}
		for (i = 0; i < n && pids[i] != w; i++)
			;
		if (i == n)
			continue;
		code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		codes[i] = code;
		left--;
		if (code) {
			for (int j = 0; j < n; j++)
				if (j != i)
					kill(pids[j], SIGKILL);
		}
		if (i && --others == 0 && stop)
			__atomic_store_n(stop, 1, __ATOMIC_RELEASE);
	}
}

static size_t page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

/* Maps fd (len bytes, a page multiple) between two PROT_NONE guard pages. */
static void *map_guarded(int fd, size_t len, int prot)
{
	char *g = mmap(NULL, len + 2 * page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	void *p;

	cr_assert_neq(g, MAP_FAILED);
	p = mmap(g + page(), len, prot, MAP_SHARED | MAP_FIXED, fd, 0);
	cr_assert_eq(p, (void *)(g + page()));
	return p;
}

/* A shared anonymous block for results and flags between test processes. */
static void *shared_block(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	cr_assert_neq(p, MAP_FAILED);
	return p;
}

/* ------------------------------------------------------------------------ */
/* A client segment pair built with the real layout, one shard.              */
/* ------------------------------------------------------------------------ */

struct chan {
	struct chime_client_geom g;
	struct chime_map rw, ro;
	int rw_fd, ro_fd;
	struct chime_chan_rw *crw;
	struct chime_chan_ro *cro;
	struct chime_sqe *sq;
	uint64_t *claim;
	struct chime_cqe *cq;
};

static void chan_new(struct chan *c, uint32_t sq_size, uint32_t cq_size)
{
	struct chime_sq_cons sc;

	memset(c, 0, sizeof(*c));
	c->g.nr_shards = 1;
	c->g.sq_size = sq_size;
	c->g.cq_size = cq_size;
	cr_assert_eq(chime_client_layout(&c->g), 0);
	cr_assert_eq(chime_seg_memfd("chime-t-rw", c->g.rw_size, &c->rw_fd, &c->rw), 0);
	cr_assert_eq(chime_seg_memfd("chime-t-ro", c->g.ro_size, &c->ro_fd, &c->ro), 0);
	cr_assert_eq(chime_seg_seal(c->rw_fd, CHIME_SEAL_FINAL), 0);
	cr_assert_eq(chime_seg_seal(c->ro_fd, CHIME_SEAL_WRITES), 0);
	c->crw = chime_at(&c->rw, c->g.rw_chan_off);
	c->cro = chime_at(&c->ro, c->g.ro_chan_off);
	c->sq = chime_at(&c->rw, c->g.rw_sq_off);
	c->claim = chime_at(&c->rw, c->g.rw_claim_off);
	c->cq = chime_at(&c->ro, c->g.ro_cq_off);
	chime_sq_cons_init(&sc, c->sq, sq_size, 0);
	for (uint32_t i = 0; i < sq_size; i++)
		c->sq[i].grant = i;
}

/* ------------------------------------------------------------------------ */
/* (a) MPSC across processes: no loss, no duplicate, per-producer order     */
/* ------------------------------------------------------------------------ */

struct mpsc {
	struct chan *c;
	unsigned producers;
	uint64_t per_producer;
	unsigned thread;            /* producer thread index */
	unsigned batch;             /* 0: one record at a time; else runs of 1..batch (reserve_n) */
};

static void *mpsc_producer_thread(void *arg)
{
	struct mpsc *m = arg;
	struct chime_sq_prod p;
	unsigned spins = 0;

	chime_sq_prod_init(&p, m->c->sq, &m->c->crw->sq_tail, m->c->g.sq_size);
	for (uint64_t i = 0, rng = m->thread + 1; m->batch && i < m->per_producer;) {
		uint64_t left = m->per_producer - i, pos;
		uint32_t want = 1 + (uint32_t)(splitmix64(&rng) % m->batch), got;

		/* Odd threads mix in single records: both kinds share the ring. */
		if (m->thread % 2 && want % 3 == 0)
			want = 1;
		if (want > left)
			want = (uint32_t)left;
		while (!(got = chime_sq_reserve_n(&p, want, &pos)))
			relax(&spins);
		CHECK(got <= want, 12);
		for (uint32_t k = 0; k < got; k++, i++) {
			struct chime_sqe *s = &p.slots[(pos + k) & p.mask];

			CHECK(s->grant == pos + k, 13);
			s->id = s->grant;
			s->key = m->thread;
			s->user_data = i;
			s->deadline_ns = i ^ 0x5555;
			s->period_ns = 0;
			s->op = CHIME_OP_ARM;
		}
		chime_sq_publish_n(&p, pos, got);
	}
	for (uint64_t i = 0; !m->batch && i < m->per_producer; i++) {
		struct chime_sqe *s;
		uint64_t pos;

		while (!(s = chime_sq_reserve(&p, &pos)))
			relax(&spins);
		/* The consumer wrote grant = pos before freeing the slot for pos (C2 -> S3). */
		CHECK(s->grant == pos, 10);
		s->id = s->grant;
		s->key = m->thread;
		s->user_data = i;
		s->deadline_ns = i ^ 0x5555;
		s->period_ns = 0;
		s->op = CHIME_OP_ARM;
		chime_sq_publish(s, pos);
	}
	return NULL;
}

static int mpsc_producer(void *arg)
{
	struct mpsc *m = arg;
	pthread_t th[16];
	struct mpsc a[16];

	for (unsigned t = 0; t < m->producers; t++) {
		a[t] = *m;
		a[t].thread = t;
		CHECK(pthread_create(&th[t], NULL, mpsc_producer_thread, &a[t]) == 0, 11);
	}
	for (unsigned t = 0; t < m->producers; t++)
		pthread_join(th[t], NULL);
	return 0;
}

static int mpsc_consumer(void *arg)
{
	struct mpsc *m = arg;
	uint64_t next[16] = { 0 };
	uint64_t total = m->producers * m->per_producer, got = 0;
	uint64_t last = now_ns();
	struct chime_sq_cons c;
	unsigned spins = 0;

	/* Geometry is the consumer's own, as in chimed; the ring is already formatted. */
	c.slots = m->c->sq;
	c.mask = m->c->g.sq_size - 1;
	c.head = 0;
	while (got < total) {
		struct chime_sqe e;
		uint64_t pos;

		if (!chime_sq_pop(&c, &e, &pos)) {
			relax(&spins);
			if ((spins & 63) == 0 && now_ns() - last > 30 * UINT64_C(1000000000))
				return 20;      /* stalled: lost a record */
			continue;
		}
		CHECK(e.seq == pos + 1, 21);
		CHECK(e.id == pos, 22);
		CHECK(e.op == CHIME_OP_ARM, 23);
		CHECK(e.key < m->producers, 24);
		/* One sequence per producer thread: a loss or duplicate breaks it. */
		CHECK(e.user_data == next[e.key], 25);
		CHECK(e.deadline_ns == (e.user_data ^ 0x5555), 26);
		next[e.key]++;
		chime_sq_free(&c, pos, pos + m->c->g.sq_size, 0);
		got++;
		last = now_ns();
	}
	for (unsigned t = 0; t < m->producers; t++)
		CHECK(next[t] == m->per_producer, 27);
	/* Nothing more than what was sent. */
	{
		struct chime_sqe e;
		uint64_t pos;

		CHECK(!chime_sq_pop(&c, &e, &pos), 28);
	}
	return 0;
}

static void mpsc_run(unsigned producers, uint64_t total, unsigned batch)
{
	struct chan c;
	struct mpsc m = { .c = &c, .producers = producers, .per_producer = total / producers, .batch = batch };
	uint64_t t0 = now_ns();

	pid_t pids[2];
	int codes[2];

	chan_new(&c, 1024, 1024);
	pids[0] = spawn(mpsc_consumer, &m);
	pids[1] = spawn(mpsc_producer, &m);
	reap_all(pids, codes, 2, NULL);
	cr_assert_eq(codes[1], 0, "producer exit %d", codes[1]);
	cr_assert_eq(codes[0], 0, "consumer exit %d", codes[0]);
	cr_assert_eq(__atomic_load_n(&c.crw->sq_tail, __ATOMIC_RELAXED), m.per_producer * producers);
	cr_log_info("mpsc %u producers: %llu records in %.2f s", producers,
		    (unsigned long long)(m.per_producer * producers), (now_ns() - t0) / 1e9);
}

Test(ring, mpsc_one_producer_process_keeps_every_record_in_order, .timeout = 120)
{
	mpsc_run(1, 8000000ull * scale(), 0);
}

Test(ring, mpsc_producer_threads_across_processes_no_loss_no_dup_order_kept, .timeout = 120)
{
	mpsc_run(3, 18000000ull * scale(), 0);
}

Test(ring, mpsc_batches_and_single_records_mixed_no_loss_no_dup_order_kept, .timeout = 120)
{
	mpsc_run(3, 12000000ull * scale(), 100);
}

Test(ring_stress, mpsc_many_producers_long_run, .timeout = 1800)
{
	const char *on = getenv("CHIME_STRESS");

	if (!on || !strcmp(on, "") || !strcmp(on, "0"))
		cr_skip_test("stress: meson test --suite stress");
	mpsc_run(4, 100000000ull * scale(), 0);
}

/* ------------------------------------------------------------------------ */
/* Single-process semantics: full ring, peek, a scribbled seq                */
/* ------------------------------------------------------------------------ */

static void fill(struct chime_sqe *s, uint64_t v)
{
	s->id = s->grant;
	s->key = v;
	s->user_data = ~v;
	s->op = CHIME_OP_CANCEL;
}

Test(ring, full_ring_reserve_returns_null_and_never_overwrites)
{
	struct chan c;
	struct chime_sq_prod p;
	struct chime_sq_cons k;
	struct chime_sqe e, *s;
	uint64_t pos;

	chan_new(&c, 8, 8);
	chime_sq_prod_init(&p, c.sq, &c.crw->sq_tail, 8);
	k.slots = c.sq;
	k.mask = 7;
	k.head = 0;
	for (uint64_t i = 0; i < 8; i++) {
		s = chime_sq_reserve(&p, &pos);
		cr_assert_not_null(s);
		cr_assert_eq(pos, i);
		fill(s, i);
		chime_sq_publish(s, pos);
	}
	/* A ring of 8 slots holds 8 records; the 9th finds slot 0 still published. */
	cr_assert_null(chime_sq_reserve(&p, &pos));
	cr_assert_null(chime_sq_reserve(&p, &pos));
	cr_assert_eq(c.crw->sq_tail, 8);
	for (uint64_t i = 0; i < 8; i++)
		cr_assert_eq(c.sq[i].seq, i + 1, "slot %llu overwritten", (unsigned long long)i);

	cr_assert(chime_sq_pop(&k, &e, &pos));
	cr_assert_eq(pos, 0);
	cr_assert_eq(e.key, 0);
	cr_assert_eq(e.user_data, ~UINT64_C(0));
	/* Popped but not freed: still full. */
	cr_assert_null(chime_sq_reserve(&p, &pos));
	chime_sq_free(&k, 0, 1000, 0);
	s = chime_sq_reserve(&p, &pos);
	cr_assert_not_null(s);
	cr_assert_eq(pos, 8);
	cr_assert_eq(s, &c.sq[0]);
	cr_assert_eq(s->grant, 1000);
	cr_assert_null(chime_sq_reserve(&p, &pos));
	/* The rest come out untouched, in order. */
	for (uint64_t i = 1; i < 8; i++) {
		cr_assert(chime_sq_pop(&k, &e, &pos));
		cr_assert_eq(pos, i);
		cr_assert_eq(e.key, i);
		chime_sq_free(&k, pos, pos + 8, 0);
	}
	/* Position 8 is reserved, not published: the consumer waits. */
	cr_assert_not(chime_sq_pop(&k, &e, &pos));
}

Test(ring, reserve_n_takes_only_the_free_run_and_publish_n_shows_it_in_order)
{
	struct chan c;
	struct chime_sq_prod p;
	struct chime_sq_cons k;
	struct chime_sqe e;
	uint64_t pos;

	chan_new(&c, 8, 8);
	chime_sq_prod_init(&p, c.sq, &c.crw->sq_tail, 8);
	k.slots = c.sq;
	k.mask = 7;
	k.head = 0;
	cr_assert_eq(chime_sq_reserve_n(&p, 0, &pos), 0);
	cr_assert_eq(chime_sq_reserve_n(&p, 5, &pos), 5);
	cr_assert_eq(pos, 0);
	for (uint64_t i = 0; i < 5; i++)
		fill(&c.sq[i], i);
	/* Reserved, not published: the consumer waits, the next run starts after it. */
	cr_assert_not(chime_sq_pop(&k, &e, &pos));
	cr_assert_eq(chime_sq_reserve_n(&p, 100, &pos), 3, "only 3 slots are free");
	cr_assert_eq(pos, 5);
	for (uint64_t i = 5; i < 8; i++)
		fill(&c.sq[i], i);
	cr_assert_eq(chime_sq_reserve_n(&p, 1, &pos), 0, "full");
	chime_sq_publish_n(&p, 5, 3);
	/* The second run is published, but the consumer reads in order: still waiting for 0. */
	cr_assert_not(chime_sq_pop(&k, &e, &pos));
	chime_sq_publish_n(&p, 0, 5);
	for (uint64_t i = 0; i < 8; i++) {
		cr_assert(chime_sq_pop(&k, &e, &pos));
		cr_assert_eq(pos, i);
		cr_assert_eq(e.key, i);
		if (i < 2)
			chime_sq_free(&k, pos, 100 + pos, 0);
	}
	/* Two freed: a run of 2 (wrapping to slots 0 and 1), with their new grants. */
	cr_assert_eq(chime_sq_reserve_n(&p, 8, &pos), 2);
	cr_assert_eq(pos, 8);
	cr_assert_eq(c.sq[0].grant, 100);
	cr_assert_eq(c.sq[1].grant, 101);
	cr_assert_eq(c.crw->sq_tail, 10);
}

Test(ring, peek_sees_only_published_records_of_that_position)
{
	struct chan c;
	struct chime_sq_prod p;
	struct chime_sq_cons k = { 0 };
	struct chime_sqe e, *s;
	uint64_t pos, pos2;

	chan_new(&c, 4, 8);
	chime_sq_prod_init(&p, c.sq, &c.crw->sq_tail, 4);
	k.slots = c.sq;
	k.mask = 3;

	cr_assert_not(chime_sq_peek(c.sq, 3, 0, &e), "nothing reserved");
	s = chime_sq_reserve(&p, &pos);
	fill(s, 42);
	cr_assert_not(chime_sq_peek(c.sq, 3, 0, &e), "reserved, not published");
	chime_sq_publish(s, pos);
	memset(&e, 0, sizeof(e));
	cr_assert(chime_sq_peek(c.sq, 3, 0, &e));
	cr_assert_eq(e.key, 42);
	cr_assert_eq(e.user_data, ~UINT64_C(42));
	cr_assert_eq(e.op, CHIME_OP_CANCEL);
	cr_assert_eq(e.seq, 1);
	cr_assert_not(chime_sq_peek(c.sq, 3, 4, &e), "same slot, next lap");
	cr_assert_not(chime_sq_peek(c.sq, 3, 1, &e), "next position");

	/* Peek does not consume: the consumer still gets it. */
	cr_assert(chime_sq_pop(&k, &e, &pos2));
	cr_assert_eq(e.key, 42);
	cr_assert(chime_sq_peek(c.sq, 3, 0, &e), "popped, not yet freed");
	chime_sq_free(&k, pos2, 4, 0);
	cr_assert_not(chime_sq_peek(c.sq, 3, 0, &e), "freed");

	/* Lap the ring: slot 0 now holds position 4. */
	for (int i = 1; i <= 4; i++) {
		s = chime_sq_reserve(&p, &pos);
		cr_assert_not_null(s);
		fill(s, 100 + i);
		chime_sq_publish(s, pos);
	}
	cr_assert_eq(pos, 4);
	cr_assert_not(chime_sq_peek(c.sq, 3, 0, &e));
	cr_assert(chime_sq_peek(c.sq, 3, 4, &e));
	cr_assert_eq(e.key, 104);
}

Test(ring, consumer_reads_only_a_seq_of_exactly_head_plus_one)
{
	struct chan c;
	struct chime_sq_cons k = { .slots = NULL };
	struct chime_sqe e;
	uint64_t pos, rng = 7;

	chan_new(&c, 16, 8);
	k.slots = c.sq;
	k.mask = 15;
	for (int i = 0; i < 100000; i++) {
		uint64_t v = splitmix64(&rng);

		if (v == 1)
			v = 2;
		c.sq[0].seq = v;
		cr_assert_not(chime_sq_pop(&k, &e, &pos));
		cr_assert_eq(k.head, 0);
	}
	c.sq[0].seq = 1;
	c.sq[0].key = 9;
	cr_assert(chime_sq_pop(&k, &e, &pos));
	cr_assert_eq(pos, 0);
	cr_assert_eq(e.key, 9);
	cr_assert_eq(k.head, 1);
}

/*
 * After its producers died: the head steps over reserved, never published
 * slots up to the next published record, and over nothing else.
 */
Test(ring, skip_unpublished_steps_to_the_next_published_record_only)
{
	struct chan c;
	struct chime_sq_prod p;
	struct chime_sq_cons k;
	struct chime_sqe *s, e;
	uint64_t pos = 0;

	chan_new(&c, 16, 8);
	chime_sq_prod_init(&p, c.sq, &c.crw->sq_tail, 16);
	chime_sq_cons_init(&k, c.sq, 16, 0);
	for (uint32_t i = 0; i < 16; i++)
		c.sq[i].grant = i;
	cr_assert_eq(chime_sq_skip_unpublished(&k), 0, "an empty ring: nothing to step to");
	cr_assert(chime_sq_reserve(&p, &pos));                 /* a hole at 0 */
	cr_assert_eq(chime_sq_skip_unpublished(&k), 0, "a hole with nothing behind it stays");
	cr_assert_eq(k.head, 0);
	s = chime_sq_reserve(&p, &pos);                         /* 1: published */
	fill(s, 1);
	chime_sq_publish(s, pos);
	cr_assert(chime_sq_reserve(&p, &pos));                 /* 2, 3: holes */
	cr_assert(chime_sq_reserve(&p, &pos));
	s = chime_sq_reserve(&p, &pos);                         /* 4: published */
	fill(s, 4);
	chime_sq_publish(s, pos);
	cr_assert_eq(chime_sq_skip_unpublished(&k), 1);
	cr_assert_eq(chime_sq_skip_unpublished(&k), 0, "the head is published: nothing to step over");
	cr_assert(chime_sq_pop(&k, &e, &pos));
	cr_assert_eq(pos, 1);
	cr_assert_eq(e.key, 1);
	cr_assert_not(chime_sq_pop(&k, &e, &pos), "2 was never published");
	cr_assert_eq(chime_sq_skip_unpublished(&k), 2);
	cr_assert(chime_sq_pop(&k, &e, &pos));
	cr_assert_eq(pos, 4);
	cr_assert_eq(e.key, 4);
	cr_assert_eq(chime_sq_skip_unpublished(&k), 0, "nothing published past 4");
	cr_assert_eq(k.head, 5);
	/* A scribbled seq is no published record: only pos + 1 is. */
	c.sq[6].seq = 6;
	c.sq[7].seq = UINT64_MAX;
	c.sq[8].seq = 7;
	cr_assert_eq(chime_sq_skip_unpublished(&k), 0);
	cr_assert_eq(k.head, 5);
}

/*
 * A park steps over a hole (a slot reserved, never published) and frees
 * the records behind it: frees are then out of order, and a run whose last
 * slot is free may still hold the hole. The thread that reserved it is
 * alive at a handover; a run that claimed its slot too had two writers in
 * one slot, and whichever published last lost the other's record (the
 * reconnect re-submits by seq). A run stops at the hole.
 */
Test(ring, reserve_n_stops_at_a_hole_a_park_stepped_over)
{
	struct chan c;
	struct chime_sq_prod p;
	struct chime_sq_cons k;
	struct chime_sqe e;
	uint64_t pos, hole;

	chan_new(&c, 8, 8);
	chime_sq_prod_init(&p, c.sq, &c.crw->sq_tail, 8);
	chime_sq_cons_init(&k, c.sq, 8, 0);
	cr_assert_eq(chime_sq_reserve_n(&p, 2, &pos), 2);      /* 0, 1: published */
	chime_sq_publish_n(&p, pos, 2);
	cr_assert(chime_sq_reserve(&p, &hole));                /* 2: a hole */
	cr_assert_eq(hole, 2);
	cr_assert_eq(chime_sq_reserve_n(&p, 5, &pos), 5);      /* 3..7: published */
	chime_sq_publish_n(&p, pos, 5);
	for (int i = 0; i < 2; i++) {
		cr_assert(chime_sq_pop(&k, &e, &pos));
		chime_sq_free(&k, pos, 0, 0);
	}
	cr_assert_eq(chime_sq_skip_unpublished(&k), 1);
	while (chime_sq_pop(&k, &e, &pos))
		chime_sq_free(&k, pos, 0, 0);
	cr_assert_eq(k.head, 8);
	/* Positions 8 and 9 (slots 0, 1) are free; 10 is the hole's slot, still position 2's. */
	cr_assert_eq(chime_sq_reserve_n(&p, 4, &pos), 2, "a run of 4 claimed the hole's slot");
	cr_assert_eq(pos, 8);
	cr_assert_eq(chime_sq_reserve_n(&p, 1, &pos), 0, "the hole's slot is not free");
	cr_assert_null(chime_sq_reserve(&p, &pos));
}

/* ------------------------------------------------------------------------ */
/* (c) Completion ring                                                        */
/* ------------------------------------------------------------------------ */

static void cq_views(struct chan *c, struct chime_cq_prod *p, struct chime_cq_cons *k)
{
	chime_cq_prod_init(p, c->cq, c->claim, &c->cro->cq_tail, &c->crw->cq_head, c->g.cq_size);
	chime_cq_cons_init(k, c->cq, c->claim, &c->cro->cq_tail, &c->crw->cq_head, c->g.cq_size);
}

static void cq_put(struct chime_cq_prod *p, uint64_t id)
{
	struct chime_cqe *e = chime_cq_slot(p);

	memset(e, 0, sizeof(*e));
	e->id = id;
	e->key = id * 7;
	e->user_data = ~id;
	chime_cq_push(p);
}

Test(ring, cq_room_accounts_for_pushed_and_released_events)
{
	struct chan c;
	struct chime_cq_prod p;
	struct chime_cq_cons k;
	struct chime_cqe e;

	chan_new(&c, 8, 16);
	cq_views(&c, &p, &k);
	cr_assert_eq(chime_cq_room(&p), 16);
	for (uint64_t i = 0; i < 16; i++) {
		cr_assert_eq(chime_cq_room(&p), 16 - i);
		cq_put(&p, i);
	}
	cr_assert_eq(chime_cq_room(&p), 0);
	cr_assert_not(chime_cq_pending(&k), "not flushed yet");
	chime_cq_flush(&p);
	cr_assert(chime_cq_pending(&k));
	for (uint64_t i = 0; i < 5; i++) {
		cr_assert_eq(chime_cq_take(&k, &e), 1);
		cr_assert_eq(e.id, i);
		cr_assert_eq(e.key, i * 7);
	}
	cr_assert_eq(chime_cq_room(&p), 0, "taken but not released");
	cr_assert_not(chime_cq_consumed(&p, 0));
	chime_cq_release(&k);
	cr_assert_eq(chime_cq_room(&p), 5);
	cr_assert(chime_cq_consumed(&p, 4));
	cr_assert_not(chime_cq_consumed(&p, 5));
	for (uint64_t i = 5; i < 16; i++)
		cr_assert_eq(chime_cq_take(&k, &e), 1);
	cr_assert_eq(chime_cq_take(&k, &e), 0);
	chime_cq_release(&k);
	cr_assert_eq(chime_cq_room(&p), 16);
	cr_assert_eq(c.claim[3], (UINT64_C(3) << 2) | CHIME_CLAIM_TAKEN);
}

Test(ring, cq_room_clamps_a_scribbled_head_to_the_last_head_and_the_tail)
{
	struct chan c;
	struct chime_cq_prod p;
	struct chime_cq_cons k;
	uint64_t rng = 3;

	chan_new(&c, 8, 16);
	cq_views(&c, &p, &k);
	for (int i = 0; i < 10; i++)
		cq_put(&p, (uint64_t)i);
	chime_cq_flush(&p);
	c.crw->cq_head = 4;
	cr_assert_eq(chime_cq_room(&p), 10);

	c.crw->cq_head = UINT64_MAX;          /* beyond the tail: at most everything consumed */
	cr_assert_eq(chime_cq_room(&p), 16);
	cr_assert_eq(p.head, p.tail);
	c.crw->cq_head = 0;                   /* backwards: ignored */
	cr_assert_eq(chime_cq_room(&p), 16);
	cr_assert_eq(p.head, 10);
	for (int i = 0; i < 1000000; i++) {
		uint64_t before = p.head;
		uint32_t room;

		c.crw->cq_head = (i & 1) ? splitmix64(&rng) : p.head + splitmix64(&rng) % 40 - 20;
		room = chime_cq_room(&p);
		cr_assert_leq(room, 16);
		cr_assert_geq(p.head, before);
		cr_assert_leq(p.head, p.tail);
		cr_assert_eq(room, 16 - (p.tail - p.head));
		if (room && (i & 7) == 0) {
			cq_put(&p, (uint64_t)i);
			chime_cq_flush(&p);
		}
	}
}

Test(ring, cq_void_and_take_on_one_event_exactly_one_wins_in_process)
{
	struct chan c;
	struct chime_cq_prod p;
	struct chime_cq_cons k;
	struct chime_cqe e;

	chan_new(&c, 8, 8);
	cq_views(&c, &p, &k);
	for (int i = 0; i < 4; i++)
		cq_put(&p, (uint64_t)i);
	chime_cq_flush(&p);
	cr_assert(chime_cq_void(&p, 1));
	cr_assert_not(chime_cq_void(&p, 1), "already void");
	cr_assert_not(chime_cq_void(&p, 4), "not pushed");
	cr_assert_not(chime_cq_void(&p, UINT64_MAX), "far out");
	cr_assert_eq(chime_cq_take(&k, &e), 1);
	cr_assert_eq(e.id, 0);
	cr_assert_not(chime_cq_void(&p, 0), "taken");
	cr_assert_eq(chime_cq_take(&k, &e), 1, "skips the voided one");
	cr_assert_eq(e.id, 2);
	c.claim[3] = 12345;                   /* scribbled: both sides treat it as gone */
	cr_assert_not(chime_cq_void(&p, 3));
	cr_assert_eq(chime_cq_take(&k, &e), 0);
}

/* SPSC across processes: order, contents, room never above size. */
struct cq_x {
	struct chan *c;
	uint64_t n;
	uint8_t *broker_won;          /* shared: [n] */
	uint8_t *client_won;          /* shared: [n] */
	bool race;
};

static int cq_broker(void *arg)
{
	struct cq_x *x = arg;
	struct chime_cq_prod p;
	struct chime_cq_cons unused;
	uint64_t rng = 11;
	unsigned spins = 0;

	cq_views(x->c, &p, &unused);
	for (uint64_t i = 0; i <= x->n; i++) {
		uint32_t room;

		uint64_t t0 = now_ns();

		while ((room = chime_cq_room(&p)) == 0) {
			relax(&spins);
			CHECK(now_ns() - t0 < 30 * UINT64_C(1000000000), 31);
		}
		CHECK(room <= x->c->g.cq_size, 30);
		/* Event n is the end marker, never voided. */
		cq_put(&p, i == x->n ? UINT64_MAX : i);
		chime_cq_flush(&p);
		if (x->race && i < x->n) {
			/*
			 * Void after a random short delay. One event in 256 waits
			 * (10 ms at most) for the client to consume it first, so
			 * both outcomes occur even when the two processes end up
			 * sharing one core.
			 */
			uint64_t r = splitmix64(&rng), t1 = now_ns();

			for (uint64_t d = r % 64; d; d--)
				at_relax();
			while ((r >> 8) % 256 == 0 && now_ns() - t1 < 10000000) {
				chime_cq_room(&p);
				if (chime_cq_consumed(&p, i))
					break;
				sched_yield();
			}
			x->broker_won[i] = chime_cq_void(&p, i);
		}
	}
	return 0;
}

static int cq_client(void *arg)
{
	struct cq_x *x = arg;
	struct chime_cq_prod unused;
	struct chime_cq_cons k;
	uint64_t expect = 0;
	unsigned spins = 0;

	cq_views(x->c, &unused, &k);
	for (;;) {
		struct chime_cqe e;

		if (!chime_cq_take(&k, &e)) {
			/* Voided events were skipped: they are consumed too. */
			chime_cq_release(&k);
			relax(&spins);
			continue;
		}
		chime_cq_release(&k);
		if (e.id == UINT64_MAX)
			break;
		CHECK(e.key == e.id * 7 && e.user_data == ~e.id, 40);
		if (x->race) {
			CHECK(e.id >= expect && e.id < x->n, 41);
		} else {
			CHECK(e.id == expect, 42);
		}
		expect = e.id + 1;
		x->client_won[e.id] = 1;
	}
	CHECK(x->race || expect == x->n, 43);
	return 0;
}

static void cq_run(struct cq_x *x)
{
	struct chan c;
	pid_t pids[2];
	int codes[2];

	chan_new(&c, 8, 64);
	x->c = &c;
	x->broker_won = shared_block(x->n);
	x->client_won = shared_block(x->n);
	pids[0] = spawn(cq_client, x);
	pids[1] = spawn(cq_broker, x);
	reap_all(pids, codes, 2, NULL);
	cr_assert_eq(codes[1], 0, "broker exit %d", codes[1]);
	cr_assert_eq(codes[0], 0, "client exit %d", codes[0]);
}

Test(ring, cq_spsc_across_processes_keeps_order_and_room, .timeout = 120)
{
	struct cq_x x = { .n = 2000000ull * scale(), .race = false };

	cq_run(&x);
	for (uint64_t i = 0; i < x.n; i++)
		cr_assert_eq(x.client_won[i], 1, "event %llu lost", (unsigned long long)i);
}

Test(ring, cq_void_races_take_across_processes_exactly_one_winner, .timeout = 120)
{
	struct cq_x x = { .n = 300000ull * scale(), .race = true };
	uint64_t voided = 0, taken = 0;

	cq_run(&x);
	for (uint64_t i = 0; i < x.n; i++) {
		cr_assert_eq(x.broker_won[i] + x.client_won[i], 1, "event %llu: void %u take %u",
			     (unsigned long long)i, x.broker_won[i], x.client_won[i]);
		voided += x.broker_won[i];
		taken += x.client_won[i];
	}
	cr_log_info("void/take race: %llu voided, %llu taken", (unsigned long long)voided,
		    (unsigned long long)taken);
	/* Both outcomes happened, or the test did not race anything. */
	cr_assert_gt(voided, 0);
	cr_assert_gt(taken, 0);
}

/* ------------------------------------------------------------------------ */
/* (b) A hostile client scribbles over everything it can write               */
/* ------------------------------------------------------------------------ */

/*
 * The broker's view of one hostile channel, each array its own page-exact
 * memfd between guard pages: idx (sq_tail, cq_head), the sq slots and the
 * claim words are client-writable; cq slots and cq_tail are broker-written.
 * A clean channel, fed by a well-behaved producer process, is served by the
 * same consumer loop: it must lose nothing while its neighbour is scribbled.
 */
#define H_SQ  64u           /* 64 * 64 B = one page */
#define H_CQ  512u          /* 512 * 8 B claim words = one page */

struct hostile {
	int idx_fd, sq_fd, claim_fd, cq_fd, ro_fd;
	struct chan clean;
	uint64_t clean_n;
	uint64_t duration_ns;
	struct {
		uint64_t stop;          /* parent -> consumer */
		uint64_t loops, popped, pushed, voided, clean_got;
		uint64_t head;          /* consumer -> scribbler, as sq_head would tell it */
		uint64_t writes;        /* scribbler */
	} *ctl;                         /* shared anonymous */
};

static int memfd_page(const char *name, size_t len)
{
	struct chime_map m;
	int fd;

	cr_assert_eq(chime_seg_memfd(name, len, &fd, &m), 0);
	chime_seg_unmap(&m);
	return fd;
}

static int hostile_consumer(void *arg)
{
	struct hostile *h = arg;
	struct chime_chan_rw *idx = map_guarded(h->idx_fd, page(), PROT_READ | PROT_WRITE);
	struct chime_sqe *sq = map_guarded(h->sq_fd, page(), PROT_READ | PROT_WRITE);
	uint64_t *claim = map_guarded(h->claim_fd, page(), PROT_READ | PROT_WRITE);
	struct chime_cqe *cq = map_guarded(h->cq_fd, H_CQ * sizeof(struct chime_cqe), PROT_READ | PROT_WRITE);
	struct chime_chan_ro *ro = map_guarded(h->ro_fd, page(), PROT_READ | PROT_WRITE);
	struct chime_sq_cons sc = { .slots = sq, .head = 0, .mask = H_SQ - 1 };
	struct chime_sq_cons clean = { .slots = h->clean.sq, .head = 0, .mask = h->clean.g.sq_size - 1 };
	struct chime_cq_prod cp;
	uint64_t rng = 99, next_clean = 0;

	chime_cq_prod_init(&cp, cq, claim, &ro->cq_tail, &idx->cq_head, H_CQ);
	while (!__atomic_load_n(&h->ctl->stop, __ATOMIC_ACQUIRE) || next_clean < h->clean_n) {
		struct chime_sqe e;
		uint64_t pos, before;
		uint32_t room;

		for (int i = 0; i < 64 && chime_sq_pop(&sc, &e, &pos); i++) {
			/* A record the broker would now validate; here it only counts. */
			chime_sq_free(&sc, pos, splitmix64(&rng), 0);
			h->ctl->popped++;
		}
		for (int i = 0; i < 64 && chime_sq_pop(&clean, &e, &pos); i++) {
			CHECK(e.user_data == next_clean && e.id == pos, 50);
			next_clean++;
			chime_sq_free(&clean, pos, pos + h->clean.g.sq_size, 0);
		}
		before = cp.head;
		room = chime_cq_room(&cp);
		CHECK(room <= H_CQ, 51);
		CHECK(cp.head >= before && cp.head <= cp.tail, 52);
		CHECK(cp.tail - cp.head <= H_CQ, 53);
		for (uint32_t i = 0; i < room && i < 8; i++) {
			cq_put(&cp, cp.tail);
			h->ctl->pushed++;
		}
		chime_cq_flush(&cp);
		/* Void positions in and around the ring; out of range must say no. */
		for (int i = 0; i < 8; i++) {
			uint64_t p = cp.tail - splitmix64(&rng) % (3 * H_CQ) + H_CQ;
			bool v = chime_cq_void(&cp, p);

			CHECK(!v || (p < cp.tail && cp.tail - p <= H_CQ), 54);
			h->ctl->voided += v;
		}
		/* Two cores, three busy processes: let the others run. */
		if ((++h->ctl->loops & 15) == 0)
			sched_yield();
		h->ctl->clean_got = next_clean;
		__atomic_store_n(&h->ctl->head, sc.head, __ATOMIC_RELAXED);
	}
	return 0;
}

/* Random words, and as often words that look right (near the real positions). */
static uint64_t plausible(uint64_t *rng, uint64_t near)
{
	uint64_t r = splitmix64(rng);

	switch (r & 3) {
	case 0:
		return splitmix64(rng);
	case 1:
		return near + (r >> 8) % 256 - 128;
	case 2:
		return ((near + (r >> 8) % 64) << 2) | ((r >> 4) & 3);
	default:
		return (r >> 8) % 4096;
	}
}

static int hostile_scribbler(void *arg)
{
	struct hostile *h = arg;
	uint64_t *idx = mmap(NULL, page(), PROT_READ | PROT_WRITE, MAP_SHARED, h->idx_fd, 0);
	uint64_t *sq = mmap(NULL, page(), PROT_READ | PROT_WRITE, MAP_SHARED, h->sq_fd, 0);
	uint64_t *claim = mmap(NULL, page(), PROT_READ | PROT_WRITE, MAP_SHARED, h->claim_fd, 0);
	const struct chime_chan_ro *ro = mmap(NULL, page(), PROT_READ, MAP_SHARED, h->ro_fd, 0);
	uint64_t rng = 1234, end = now_ns() + h->duration_ns;
	size_t words = page() / 8;

	CHECK(idx != MAP_FAILED && sq != MAP_FAILED && claim != MAP_FAILED && ro != MAP_FAILED, 60);
	while (now_ns() < end) {
		for (int i = 0; i < 4096; i++) {
			uint64_t near = __atomic_load_n(&ro->cq_tail, __ATOMIC_RELAXED);
			uint64_t r = splitmix64(&rng);

			switch (r % 5) {
			case 0:     /* sq_tail, cq_head */
				__atomic_store_n(&idx[(r >> 8) & 1 ? 16 : 0], plausible(&rng, near), __ATOMIC_RELAXED);
				break;
			case 1: {   /* a slot's seq: mostly "published" for the broker's head */
				/* A real client knows the head: the broker publishes sq_head. */
				uint64_t head = __atomic_load_n(&h->ctl->head, __ATOMIC_RELAXED);
				uint64_t k = (r >> 8) % 4 ? head : (r >> 8);
				uint64_t *seq = &sq[(k % H_SQ) * 8];

				__atomic_store_n(seq, (r >> 16) % 8 ? k + 1 : plausible(&rng, k), __ATOMIC_RELAXED);
				break;
			}
			case 2:     /* any word of the slots but seq */
				if ((r >> 8) % 8)
					__atomic_store_n(&sq[(r >> 8) % words], splitmix64(&rng), __ATOMIC_RELAXED);
				break;
			default:    /* claim words */
				__atomic_store_n(&claim[(r >> 8) % words], plausible(&rng, near), __ATOMIC_RELAXED);
				break;
			}
		}
		h->ctl->writes += 4096;
	}
	return 0;
}

static int clean_producer(void *arg)
{
	struct hostile *h = arg;
	struct chime_sq_prod p;
	unsigned spins = 0;

	chime_sq_prod_init(&p, h->clean.sq, &h->clean.crw->sq_tail, h->clean.g.sq_size);
	for (uint64_t i = 0; i < h->clean_n; i++) {
		struct chime_sqe *s;
		uint64_t pos;

		while (!(s = chime_sq_reserve(&p, &pos)))
			relax(&spins);
		s->id = s->grant;
		s->user_data = i;
		s->op = CHIME_OP_ARM;
		chime_sq_publish(s, pos);
	}
	return 0;
}

Test(ring, hostile_scribbles_never_move_the_consumer_out_of_bounds, .timeout = 120)
{
	struct hostile h = { 0 };
	struct chime_sq_cons init;
	struct chime_sqe *sq;
	pid_t pids[3];
	int codes[3];

	cr_assert_eq(H_SQ * sizeof(struct chime_sqe), page());
	h.idx_fd = memfd_page("chime-t-idx", page());
	h.sq_fd = memfd_page("chime-t-sq", page());
	h.claim_fd = memfd_page("chime-t-claim", page());
	h.cq_fd = memfd_page("chime-t-cq", H_CQ * sizeof(struct chime_cqe));
	h.ro_fd = memfd_page("chime-t-ro", page());
	sq = mmap(NULL, page(), PROT_READ | PROT_WRITE, MAP_SHARED, h.sq_fd, 0);
	chime_sq_cons_init(&init, sq, H_SQ, 0);
	munmap(sq, page());
	chan_new(&h.clean, 256, 8);
	h.clean_n = 500000ull * scale();
	h.duration_ns = 2000000000ull * scale();
	h.ctl = shared_block(page());

	pids[0] = spawn(hostile_consumer, &h);
	pids[1] = spawn(clean_producer, &h);
	pids[2] = spawn(hostile_scribbler, &h);
	reap_all(pids, codes, 3, &h.ctl->stop);
	cr_assert_eq(codes[0], 0, "consumer exit %d (128+11: an out-of-bounds access hit a guard page)", codes[0]);
	cr_assert_eq(codes[2], 0, "scribbler exit %d", codes[2]);
	cr_assert_eq(codes[1], 0, "clean producer exit %d", codes[1]);
	cr_assert_eq(h.ctl->clean_got, h.clean_n, "the clean channel lost records");
	cr_assert_gt(h.ctl->loops, 1000);
	cr_assert_gt(h.ctl->popped, 0, "the scribbler never fed the consumer a garbage record");
	cr_log_info("hostile: %llu scribbles, %llu loops, %llu garbage records popped, %llu events pushed, %llu voided",
		    (unsigned long long)h.ctl->writes, (unsigned long long)h.ctl->loops, (unsigned long long)h.ctl->popped,
		    (unsigned long long)h.ctl->pushed, (unsigned long long)h.ctl->voided);
}
