/* SPDX-License-Identifier: MIT */
/*
 * no_passrights.so: chimed, preloaded with it, runs as on a kernel before
 * Linux 6.16, whose sockets take no SO_PASSRIGHTS (Debian 12's 6.1): its
 * listening socket then takes descriptors from any client, and
 * test_hostile checks that none of them can hold a thread of the broker's
 * up. Built for the tests only (tests/meson.build), never installed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	int (*real)(int, int, int, const void *, socklen_t);

	if (level == SOL_SOCKET && name == SO_PASSRIGHTS) {
		errno = ENOPROTOOPT;
		return -1;
	}
	*(void **)&real = dlsym(RTLD_NEXT, "setsockopt");
	return real ? real(fd, level, name, val, len) : (errno = ENOSYS, -1);
}
