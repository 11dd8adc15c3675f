/* SPDX-License-Identifier: MIT */
/*
 * failcall_preload.so: chimed, preloaded with it, has one of its calls
 * fail. $CHIME_FAILCALL is "NAME:N:ERRNO[:TIMES]": the Nth call of NAME
 * (counted over every thread, from the start) fails with ERRNO (a number),
 * and the TIMES - 1 after it too (TIMES 0: every one from the Nth on);
 * every other call is the real one. With $CHIME_FAILCALL_FROM set,
 * counting starts once that file exists (a broker running, its start-up's
 * calls left alone); with $CHIME_FAILCALL_UNTIL set, no call fails once
 * that file exists (a fault that lasts, then mends). The file $CHIME_FAILCALL_FIRED is created when it fails,
 * so that a test can tell a run that made fewer than N such calls.
 * With $CHIME_FAILCALL_KILL set, that call kills the process (SIGKILL)
 * instead: a broker killed in the middle of what it was doing. write() is
 * counted only on files in $CHIME_FAILCALL_DIR (named or not yet: an
 * O_TMPFILE's is "DIR/#INO (deleted)"), not the log's.
 * test_failstart fails each of the broker's calls in turn.
 * Built for the tests only (tests/meson.build), never installed.
 *
 * Both names of the calls glibc's headers rename under
 * _FILE_OFFSET_BITS=64 (open64, mmap64, ...: chimed is built with it),
 * counted as one.
 * Calls that liburing makes as raw system calls (io_uring_setup) cannot
 * be failed here. glibc's names (__CONST_SOCKADDR_ARG, __O_TMPFILE): a
 * test of glibc builds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* Both names defined here, each its own symbol: the headers would make open() open64(). */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static char target[64];
static unsigned long nth, times = 1;
static int fail_errno;
static atomic_ulong made;
static const char *from;                /* $CHIME_FAILCALL_FROM: count once it exists */
static atomic_bool counting;

__attribute__((constructor)) static void failcall_init(void)
{
	const char *spec = getenv("CHIME_FAILCALL");
	char name[64];

	if (spec && sscanf(spec, "%63[^:]:%lu:%d:%lu", name, &nth, &fail_errno, &times) >= 3 && nth > 0)
		memcpy(target, name, sizeof(target));
	from = getenv("CHIME_FAILCALL_FROM");
	atomic_store(&counting, !from);
}

/* Counting yet? (raw: access() of our own would be one of the calls) */
static bool started(void)
{
	if (atomic_load(&counting))
		return true;
	if (syscall(SYS_faccessat, AT_FDCWD, from, F_OK, 0) != 0)
		return false;
	atomic_store(&counting, true);
	return true;
}

/* True (errno set) if this is the call to fail. */
static bool fail_now(const char *name)
{
	const char *fired, *until = getenv("CHIME_FAILCALL_UNTIL");
	unsigned long n;

	if (!target[0] || strcmp(name, target) || !started())
		return false;
	n = atomic_fetch_add(&made, 1) + 1;
	if (n < nth || (times && n >= nth + times))
		return false;
	/* Raw, as in started(). */
	if (until && syscall(SYS_faccessat, AT_FDCWD, until, F_OK, 0) == 0)
		return false;
	fired = getenv("CHIME_FAILCALL_FIRED");
	if (fired) {
		/* Raw: open() itself may be the call being failed. */
		long fd = syscall(SYS_openat, AT_FDCWD, fired, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);

		if (fd >= 0)
			syscall(SYS_close, fd);
	}
	if (getenv("CHIME_FAILCALL_KILL"))
		syscall(SYS_kill, syscall(SYS_getpid), SIGKILL);
	errno = fail_errno;
	return true;
}

/* The next definition of `name` (libc's, or a sanitizer's interceptor). */
static void *real_of(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

/* A call of `name`, counted as `as`'s, with these parameters: failed (returning fail) or passed on. */
#define FAILABLE_AS(ret, name, as, fail, params, args)                          \
	ret name params;                                                        \
	ret name params                                                         \
	{                                                                       \
		ret (*real) params;                                             \
		if (fail_now(#as))                                              \
			return fail;                                            \
		*(void **)&real = real_of(#name);                               \
		return real args;                                               \
	}
#define FAILABLE(ret, name, fail, params, args) FAILABLE_AS(ret, name, name, fail, params, args)

FAILABLE(int, socket, -1, (int d, int t, int p), (d, t, p))
FAILABLE(int, socketpair, -1, (int d, int t, int p, int sv[2]), (d, t, p, sv))
FAILABLE(int, bind, -1, (int fd, __CONST_SOCKADDR_ARG a, socklen_t l), (fd, a, l))     /* glibc's type */
FAILABLE(int, listen, -1, (int fd, int n), (fd, n))
FAILABLE(int, memfd_create, -1, (const char *n, unsigned f), (n, f))
FAILABLE(int, ftruncate, -1, (int fd, off_t l), (fd, l))
FAILABLE_AS(int, ftruncate64, ftruncate, -1, (int fd, off64_t l), (fd, l))
FAILABLE(int, fallocate, -1, (int fd, int m, off_t o, off_t l), (fd, m, o, l))
FAILABLE_AS(int, fallocate64, fallocate, -1, (int fd, int m, off64_t o, off64_t l), (fd, m, o, l))
FAILABLE(void *, mmap, (void *)-1, (void *a, size_t l, int p, int f, int fd, off_t o), (a, l, p, f, fd, o))
FAILABLE_AS(void *, mmap64, mmap, (void *)-1, (void *a, size_t l, int p, int f, int fd, off64_t o),
	    (a, l, p, f, fd, o))
FAILABLE(int, madvise, -1, (void *a, size_t l, int adv), (a, l, adv))
FAILABLE(int, eventfd, -1, (unsigned v, int f), (v, f))
FAILABLE(int, timerfd_create, -1, (int c, int f), (c, f))
FAILABLE(int, signalfd, -1, (int fd, const sigset_t *m, int f), (fd, m, f))
FAILABLE(int, rename, -1, (const char *a, const char *b), (a, b))
FAILABLE(int, unlink, -1, (const char *p), (p))
FAILABLE(int, fsync, -1, (int fd), (fd))
FAILABLE(int, fdatasync, -1, (int fd), (fd))
FAILABLE(int, flock, -1, (int fd, int op), (fd, op))
FAILABLE(int, mkdir, -1, (const char *p, mode_t m), (p, m))
FAILABLE(ssize_t, pwrite, -1, (int fd, const void *b, size_t n, off_t o), (fd, b, n, o))
FAILABLE_AS(ssize_t, pwrite64, pwrite, -1, (int fd, const void *b, size_t n, off64_t o), (fd, b, n, o))
FAILABLE(int, accept4, -1, (int fd, __SOCKADDR_ARG a, socklen_t *l, int f), (fd, a, l, f))
FAILABLE(ssize_t, send, -1, (int fd, const void *b, size_t n, int f), (fd, b, n, f))
FAILABLE(ssize_t, sendmsg, -1, (int fd, const struct msghdr *m, int f), (fd, m, f))
FAILABLE(ssize_t, recv, -1, (int fd, void *b, size_t n, int f), (fd, b, n, f))
FAILABLE(ssize_t, recvmsg, -1, (int fd, struct msghdr *m, int f), (fd, m, f))
FAILABLE(int, getsockopt, -1, (int fd, int lv, int o, void *v, socklen_t *l), (fd, lv, o, v, l))
FAILABLE(int, dup, -1, (int fd), (fd))
FAILABLE(int, fchmod, -1, (int fd, mode_t m), (fd, m))
FAILABLE(int, munmap, -1, (void *a, size_t l), (a, l))

/* Is fd a file in $CHIME_FAILCALL_DIR? (raw: a call of ours would be counted) */
static bool in_dir(int fd)
{
	const char *dir = getenv("CHIME_FAILCALL_DIR");
	char proc[64], link[4096];
	size_t len;
	long n;

	if (!dir)
		return false;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = syscall(SYS_readlinkat, AT_FDCWD, proc, link, sizeof(link) - 1);
	if (n < 0)
		return false;
	link[n] = '\0';
	len = strlen(dir);
	return strncmp(link, dir, len) == 0 && link[len] == '/';
}

ssize_t write(int fd, const void *b, size_t n)
{
	ssize_t (*real)(int, const void *, size_t);

	if (!strcmp(target, "write") && in_dir(fd) && fail_now("write"))
		return -1;
	*(void **)&real = real_of("write");
	return real(fd, b, n);
}

/* fcntl's third argument is an int or a pointer: passed on as a pointer-sized word, as glibc does. */
#define FAILABLE_FCNTL(name)                                                    \
	int name(int fd, int cmd, ...);                                         \
	int name(int fd, int cmd, ...)                                          \
	{                                                                       \
		int (*real)(int, int, ...);                                     \
		va_list ap;                                                     \
		void *arg;                                                      \
		va_start(ap, cmd);                                              \
		arg = va_arg(ap, void *);                                       \
		va_end(ap);                                                     \
		if (fail_now("fcntl"))                                          \
			return -1;                                              \
		*(void **)&real = real_of(#name);                               \
		return real(fd, cmd, arg);                                      \
	}

FAILABLE_FCNTL(fcntl)
FAILABLE_FCNTL(fcntl64)

/* posix_spawn returns the error, not -1 and errno. */
int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *at,
		char *const argv[], char *const envp[])
{
	int (*real)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
		    char *const[], char *const[]);

	if (fail_now("posix_spawn"))
		return errno;
	*(void **)&real = real_of("posix_spawn");
	return real(pid, path, fa, at, argv, envp);
}

/* pthread_create returns the error, not -1 and errno. */
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
	int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

	if (fail_now("pthread_create"))
		return errno;
	*(void **)&real = real_of("pthread_create");
	return real(t, a, fn, arg);
}

/* open and openat take a mode only with O_CREAT or O_TMPFILE; counted as "open" and "openat". */
#define COMMA ,
#define FAILABLE_OPEN(name, as, dfd_param, dfd_arg)                             \
	int name(dfd_param const char *p, int flags, ...);                      \
	int name(dfd_param const char *p, int flags, ...)                       \
	{                                                                       \
		int (*real)(dfd_param const char *, int, ...);                  \
		mode_t mode = 0;                                                \
		if (flags & (O_CREAT | __O_TMPFILE)) {                          \
			va_list ap;                                             \
			va_start(ap, flags);                                    \
			mode = (mode_t)va_arg(ap, int);                         \
			va_end(ap);                                             \
		}                                                               \
		if (fail_now(as))                                               \
			return -1;                                              \
		*(void **)&real = real_of(#name);                               \
		return real(dfd_arg p, flags, mode);                            \
	}

FAILABLE_OPEN(open, "open", , )
FAILABLE_OPEN(open64, "open", , )
FAILABLE_OPEN(openat, "openat", int dfd COMMA, dfd COMMA)
FAILABLE_OPEN(openat64, "openat", int dfd COMMA, dfd COMMA)
