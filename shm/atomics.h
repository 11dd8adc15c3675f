/* SPDX-License-Identifier: MIT */
/*
 * atomics.h - the one atomics vocabulary of chime, for every word shared
 * between processes or threads (the broker's and libchime's alike).
 *
 * Each is the C11 builtin with the named order, so that ThreadSanitizer
 * models every edge exactly as written (it does not model ck_pr's inline
 * assembly, nor stand-alone fences: prefer an ordered access to a fence).
 * On x86-64 they compile to what ck_pr would: plain moves for relaxed,
 * acquire and release, `xchg`/`lock cmpxchg` for the full barriers.
 * Every use carries a label naming its partner (ARCHITECTURE.md, "Memory
 * ordering labels").
 *
 * Type-generic: the pointer's type picks the width (32 or 64 bits).
 */
#ifndef CHIME_ATOMICS_H
#define CHIME_ATOMICS_H

#include <stdbool.h>

/* Single-copy atomic, no ordering. */
#define at_load(p)              __atomic_load_n((p), __ATOMIC_RELAXED)
#define at_store(p, v)          __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* No later access moves above an acquire; no earlier one below a release. */
#define at_load_acq(p)          __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define at_store_rel(p, v)      __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* Sequentially consistent: a full barrier on both sides (store-load included). */
#define at_load_sc(p)           __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define at_store_sc(p, v)       __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define at_xchg(p, v)           __atomic_exchange_n((p), (v), __ATOMIC_SEQ_CST)
/* CAS: on failure *(cur) gets the value seen (acquire). */
#define at_cas(p, cur, v) \
	__atomic_compare_exchange_n((p), (cur), (v), false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)
/* CAS without ordering, for a word that guards nothing but itself. */
#define at_cas_relaxed(p, cur, v) \
	__atomic_compare_exchange_n((p), (cur), (v), false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)
#define at_add(p, v)            __atomic_add_fetch((p), (v), __ATOMIC_ACQ_REL)
#define at_sub(p, v)            __atomic_sub_fetch((p), (v), __ATOMIC_ACQ_REL)
/* Returns the value before. */
#define at_fetch_or(p, v)       __atomic_fetch_or((p), (v), __ATOMIC_SEQ_CST)

/* Stand-alone fences, where an ordered access cannot carry the edge. */
#define at_fence()              __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define at_fence_acq()          __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define at_fence_rel()          __atomic_thread_fence(__ATOMIC_RELEASE)

/*
 * Program order for a file the broker maps (a shard file): a SIGKILL stops
 * the thread between two instructions, and every store before that is in
 * the page cache, so only the compiler can reorder (or merge) what a kill
 * leaves. A compiler barrier, no instruction.
 */
#define at_crash_order()        __atomic_signal_fence(__ATOMIC_SEQ_CST)

/* A spin-wait hint to the CPU (and to a sibling hyperthread). */
static inline void at_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/*
 * Fetch the line holding p for writing: exclusive, every other copy
 * invalidated, in one coherence transaction. A line the other side read
 * last (a completion slot the client took) would otherwise come shared,
 * and our store then need a second transaction. GCC emits x86's
 * PREFETCHW for __builtin_prefetch(p, 1) only when built with -mprfchw,
 * so it is spelled out here, behind the CPU's feature bit (libgcc reads
 * it once, at start-up): without the bit, a plain prefetch.
 */
static inline void at_prefetch_w(const void *p)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
	if (__builtin_expect(__builtin_cpu_supports("prfchw"), 1)) {
		__asm__("prefetchw %0" : : "m"(*(const char *)p));
		return;
	}
#endif
	__builtin_prefetch(p, 1);
}

#endif /* CHIME_ATOMICS_H */
