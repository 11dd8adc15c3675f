/* SPDX-License-Identifier: MIT */
/*
 * test_spin.c - shm/spin.h: when a yield turns spinning off, and for how long.
 */
#include <criterion/criterion.h>

#include "spin.h"

#define MS UINT64_C(1000000)

Test(spin, yields_that_come_back_soon_leave_spinning_on)
{
	struct spin_watch w = { 0 };
	uint64_t now = 1000 * MS;

	cr_assert(spin_allowed(&w, 0));
	for (unsigned i = 0; i < 1000; i++, now += 50000) {
		spin_yielded(&w, i % (YIELD_CONTENDED_NS / 1000), now);
		cr_assert(spin_allowed(&w, now), "a %u us yield turned spinning off", i % 1000);
	}
}

Test(spin, a_yield_that_gave_the_core_away_turns_spinning_off_for_a_while)
{
	struct spin_watch w = { 0 };
	uint64_t now = 1000 * MS;

	spin_yielded(&w, YIELD_CONTENDED_NS, now);
	cr_assert_not(spin_allowed(&w, now));
	cr_assert_not(spin_allowed(&w, now + SPIN_OFF_MIN_NS - 1));
	cr_assert(spin_allowed(&w, now + SPIN_OFF_MIN_NS));
}

Test(spin, contention_that_persists_keeps_spinning_off_longer_up_to_the_maximum)
{
	struct spin_watch w = { 0 };
	uint64_t now = 1000 * MS, off = SPIN_OFF_MIN_NS;

	for (unsigned i = 0; i < 40; i++) {
		spin_yielded(&w, 2 * MS, now);
		cr_assert_not(spin_allowed(&w, now + off - 1), "round %u: on before %llu ns", i,
			      (unsigned long long)off);
		cr_assert(spin_allowed(&w, now + off), "round %u: still off after %llu ns", i, (unsigned long long)off);
		/* the first spin after it, a yield later: given away again */
		now += off + 2 * MS;
		off = off * 2 < SPIN_OFF_MAX_NS ? off * 2 : SPIN_OFF_MAX_NS;
	}
	cr_assert_eq(w.off_ns, SPIN_OFF_MAX_NS);
}

Test(spin, contention_long_after_the_last_starts_again_from_the_shortest)
{
	struct spin_watch w = { 0 };
	uint64_t now = 1000 * MS;

	for (unsigned i = 0; i < 5; i++) {
		spin_yielded(&w, 2 * MS, now);
		now = w.off_until + 1;
	}
	cr_assert_gt(w.off_ns, SPIN_OFF_MIN_NS);
	/* a whole off period (the last one's length) and more with spinning on: a fresh start */
	now = w.off_until + w.off_ns + 1;
	spin_yielded(&w, 2 * MS, now);
	cr_assert_eq(w.off_ns, SPIN_OFF_MIN_NS);
	cr_assert(spin_allowed(&w, now + SPIN_OFF_MIN_NS));
}
