/* SPDX-License-Identifier: MIT */
/*
 * fuzz_rebuild.c - libFuzzer target for wheel_rebuild(): a shard's wheel
 * region as a crash or a stray writer could leave it for the next broker.
 *
 * The input's first 8 bytes seed a real wheel (CAP nodes armed at random
 * deadlines, some freed, some made due, some in broker states); the rest is
 * a list of patches, each (offset: 2 bytes, length: 1 byte, bytes), written
 * over the region, header included. Then wheel_rebuild() with the wheel's
 * own geometry and a later clock must either refuse the region (only if
 * its geometry no longer matches) or leave a wheel that passes
 * wheel_check(), holds exactly the nodes whose bytes say ARMED or EXPIRED
 * with a sane generation, and, run to the end, fires each of them once and
 * never before its deadline. Before the patches some timers are reset to a
 * later deadline (lazily: left in an earlier slot) or to an earlier one;
 * after the rebuild some restored ones are reset later again. A violation
 * calls abort() so libFuzzer reports the input.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "wheel.h"
#include "fuzz_input.h"

#define CAP 128u
#define RES 1000u
#define T0  UINT64_C(5000000)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The rule rebuild must apply, restated from chime_shm.h's node states. */
static bool sane(const struct chime_node *n)
{
	if (n->state > CHIME_NODE_ACKWAIT)
		return false;
	return n->state == CHIME_NODE_FREE ||
	       ((n->gen & CHIME_ID_GEN_MASK) && !(n->gen & ~(CHIME_ID_GEN_MASK | CHIME_NODE_FLAGS)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static _Alignas(64) uint8_t mem[sizeof(struct chime_wheel) + CAP * sizeof(struct chime_node)];
	static uint64_t dl[CAP];
	static bool armed[CAP];
	const size_t len = sizeof(mem);
	uint64_t seed = 0, now = T0 + 500 * RES, at;
	uint32_t want = 0, fired = 0, out[CAP], dropped = 0;
	const struct chime_wheel *w = (const struct chime_wheel *)mem;
	struct wheel_rebuild_stats st;
	struct wheel wh;
	size_t p;

	memcpy(&seed, data, size < 8 ? size : 8);
	memset(mem, 0, len);
	CHECK(wheel_init(&wh, mem, len, CAP, RES, T0) == 0, "wheel_init");
	for (uint32_t i = 0; i < CAP; i++) {
		uint32_t idx = wheel_alloc(&wh);

		wheel_arm(&wh, idx, T0 + splitmix64(&seed) % (UINT64_C(2000) * RES));
	}
	for (uint32_t i = 0; i < CAP; i += 1 + (uint32_t)(seed % 7))
		wheel_free(&wh, i);
	wheel_advance(&wh, T0 + 100 * RES);
	for (uint32_t i = 1; i < CAP; i += 9)
		if (wheel_node(&wh, i)->state == CHIME_NODE_ARMED) {
			wheel_cancel(&wh, i);
			wheel_node(&wh, i)->state = CHIME_NODE_BACKLOG;
		}
	/* keepalive touches: a later deadline leaves the node in an earlier slot
	 * (lazy reset), an earlier one moves it */
	for (uint32_t i = 2; i < CAP; i += 1 + (uint32_t)(seed % 3))
		if (wheel_node(&wh, i)->state == CHIME_NODE_ARMED) {
			uint64_t d = wheel_node(&wh, i)->deadline_ns, r = splitmix64(&seed);

			wheel_reset(&wh, i, r % 4 ? d + 1 + r % (UINT64_C(100000) * RES)
					   : T0 + 101 * RES + r % (UINT64_C(50) * RES));
		}

	for (p = 8; p + 3 <= size;) {
		size_t off = (size_t)data[p] | (size_t)data[p + 1] << 8, n = data[p + 2];

		p += 3;
		if (n > size - p)
			n = size - p;
		off %= len;
		if (n > len - off)
			n = len - off;
		memcpy(mem + off, data + p, n);
		p += n;
	}

	for (uint32_t i = 0; i < CAP; i++) {
		const struct chime_node *n = (const struct chime_node *)(mem + sizeof(struct chime_wheel)) + i;

		armed[i] = false;
		if (i >= w->high_water)
			continue;
		dropped += !sane(n);
		armed[i] = sane(n) && (n->state == CHIME_NODE_ARMED || n->state == CHIME_NODE_EXPIRED);
		dl[i] = n->deadline_ns;
		want += armed[i];
	}
	if (w->slab_off != sizeof(struct chime_wheel) || w->capacity != CAP || w->resolution_ns != RES ||
	    w->high_water > CAP) {
		CHECK(wheel_rebuild(&wh, mem, len, CAP, RES, now, &st) == -EINVAL, "accepted another geometry");
		wheel_fini(&wh);
		return 0;
	}
	wheel_fini(&wh);        /* the rebuild sets up the handle anew, as a new broker's */
	CHECK(wheel_rebuild(&wh, mem, len, CAP, RES, now, &st) == 0, "refused its own geometry");
	wheel_check(&wh);
	CHECK(st.dropped == dropped, "dropped %u, want %u", st.dropped, dropped);
	CHECK(wheel_armed(&wh) == want, "armed %llu, want %u", (unsigned long long)wheel_armed(&wh), want);
	/* the new broker's clients touch restored timers: lazily, on the rebuilt wheel */
	for (uint32_t i = 0; i < CAP; i += 3)
		if (armed[i] && wheel_node(&wh, i)->state == CHIME_NODE_ARMED) {
			uint64_t d = dl[i] + 1 + splitmix64(&seed) % (UINT64_C(5000) * RES);

			dl[i] = d > dl[i] ? d : UINT64_MAX;
			wheel_reset(&wh, i, dl[i]);
		}
	wheel_check(&wh);

	while (wheel_armed(&wh) > 0) {
		unsigned k;

		/* (UINT64_MAX also when the earliest deadline is in the clock's last tick) */
		at = wheel_next_deadline(&wh);
		if (at < now)
			at = now;
		wheel_advance(&wh, at);
		now = at;
		while ((k = wheel_pop_expired(&wh, out, CAP)) > 0) {
			for (unsigned i = 0; i < k; i++) {
				CHECK(out[i] < CAP && armed[out[i]], "node %u fired, was not armed", out[i]);
				CHECK(dl[out[i]] <= now, "node %u fired early", out[i]);
				armed[out[i]] = false;
				fired++;
			}
		}
	}
	CHECK(fired == want, "fired %u of %u", fired, want);
	wheel_check(&wh);
	wheel_fini(&wh);
	return 0;
}
