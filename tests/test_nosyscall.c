/* SPDX-License-Identifier: MIT */
/*
 * test_nosyscall - the client half of the `nosyscall` test (run by
 * test_syscalls.sh under `strace -f -c`): arm, reset and cancel many timers
 * through a running chimed and print how many operations that was. The
 * script compares the number with strace's count of this process's system
 * calls: DESIGN.md invariant 1 says the fast path makes none while the
 * broker is awake, so the count must stay far below the operations.
 *
 * Usage: test_nosyscall SOCKET [TIMERS]   (default 200000). Deadlines are an
 * hour ahead, so nothing fires. Exit 0 and "ops N" on stdout, 1 on an error.
 */
#include <chime.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	struct chime_opts o = { .socket_path = NULL, .flags = 0 };
	uint64_t far;
	chime_id_t *ids;
	size_t n = 200000, ops = 0;
	chime_t *c;
	int r;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: test_nosyscall SOCKET [TIMERS]\n");
		return 2;
	}
	if (argc == 3)
		n = strtoul(argv[2], NULL, 10);
	o.socket_path = argv[1];
	ids = calloc(n ? n : 1, sizeof(*ids));
	if (!ids)
		return 1;
	r = chime_open(&c, &o);
	if (r < 0) {
		fprintf(stderr, "test_nosyscall: chime_open('%s') failed: %s\n", argv[1], strerror(-r));
		return 1;
	}
	far = chime_now() + UINT64_C(3600000000000);
	for (size_t i = 0; i < n; i++, ops++)
		if ((r = chime_arm(c, i & 63, far + i, 0, i, &ids[i])) < 0)
			goto fail;
	for (size_t i = 0; i < n; i++, ops++)
		if ((r = chime_reset(c, ids[i], far + 2 * i)) < 0)
			goto fail;
	for (size_t i = 0; i < n; i++, ops++)
		if ((r = chime_cancel(c, ids[i])) < 0)
			goto fail;
	chime_close(c);
	free(ids);
	printf("ops %zu\n", ops);
	return 0;
fail:
	fprintf(stderr, "test_nosyscall: operation %zu failed: %s\n", ops, strerror(-r));
	chime_close(c);
	free(ids);
	return 1;
}
