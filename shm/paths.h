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

/*
 * Shard k's segment file beside the socket: "<socket>.shard<k>". False if
 * it did not fit in len bytes (buf then holds it cut short).
 */
static inline bool chime_shard_path(char *buf, size_t len, const char *socket_path, uint32_t k)
{
	int n = snprintf(buf, len, "%s.shard%u", socket_path, k);

	return n >= 0 && (size_t)n < len;
}

#endif /* CHIME_PATHS_H */
