/* SPDX-License-Identifier: MIT */
/*
 * e2e.h - chime-bench's end-to-end mode: libchime + a real chimed, beside one
 * timerfd per timer. See e2e.c.
 */
#ifndef CHIME_BENCH_E2E_H
#define CHIME_BENCH_E2E_H

/*
 * `chime-bench e2e [--socket PATH] [--quick] [--shards N] [--only PART]`.
 * argv[0] is the mode's name. Prints one table; returns the process exit
 * status (0 ok, 1 failure or a correctness problem seen, 2 usage).
 */
int bench_e2e(int argc, char **argv);

#endif /* CHIME_BENCH_E2E_H */
