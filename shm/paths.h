/* SPDX-License-Identifier: MIT */
/*
 * paths.h - the names of the files a broker is reached by, for the broker,
 * libchime and the tools alike: one rule each, so that they agree.
 */
#ifndef CHIME_PATHS_H
#define CHIME_PATHS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "chime_shm.h"         /* CHIME_DEFAULT_SOCKET */

/*
 * The broker's socket: `arg` (--socket, chime_opts.socket_path) if not
 * NULL, else $CHIME_SOCKET if set and not empty, else the host's broker,
 * CHIME_DEFAULT_SOCKET (then *is_default is true, if is_default is not
 * NULL). An empty arg comes back as it is: callers refuse it, a mistake
 * and not "the default". secure_getenv(): in a set-user-ID or
 * set-group-ID program, whoever runs it does not pick the socket.
 */
static inline const char *chime_socket_path(const char *arg, bool *is_default)
{
	const char *env = arg ? NULL : secure_getenv("CHIME_SOCKET");
	const char *p = arg ? arg : env && *env ? env : CHIME_DEFAULT_SOCKET;

	if (is_default)
		*is_default = !arg && !(env && *env);
	return p;
}

/*
 * Shard k's segment file beside the socket: "<socket>.shard<k>". False if
 * it did not fit in len bytes (buf then holds it cut short).
 */
static inline bool chime_shard_path(char *buf, size_t len, const char *socket_path, uint32_t k)
{
	int n = snprintf(buf, len, "%s.shard%u", socket_path, k);

	return n >= 0 && (size_t)n < len;
}

/* The longest socket path: a unix socket's sun_path, less its NUL. */
#define CHIME_SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

/*
 * A tool's --socket PATH: 0, or -1 with why on stderr as "prog: ...".
 * Empty is a mistake, not "the default" (chimed refuses it too); no
 * broker can listen at a path longer than a unix socket's.
 */
static inline int chime_socket_opt(const char *prog, const char *arg)
{
	if (!*arg) {
		fprintf(stderr, "%s: --socket needs a path (empty given)\n", prog);
		return -1;
	}
	if (strlen(arg) > CHIME_SOCKET_PATH_MAX) {
		fprintf(stderr, "%s: --socket '%s' is too long (a unix socket's path is at most %zu bytes)\n",
			prog, arg, CHIME_SOCKET_PATH_MAX);
		return -1;
	}
	return 0;
}

#endif /* CHIME_PATHS_H */
