/* SPDX-License-Identifier: MIT */
/* tsan_harness.c - see tsan_harness.h. */
#include "tsan_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *prog = "tsan";
const char *chimed_path;
const char *scenario_name = "start";
char dir[64], sock_path[128], log_path[128], ctl_log_path[128];
pid_t broker = -1;
pthread_mutex_t broker_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t violations;
static uint32_t failing;                /* atomic: fail() is under way */
static uint64_t clk;                    /* atomic: the stamps */

/* The runtime asks before main. */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
	return TSAN_OPTS;
}

void pause_ns(long ns)
{
	nanosleep(&(struct timespec){ .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 }, NULL);
}

uint64_t stamp(void)
{
	uint64_t v;

	CC_BARRIER();
	v = __atomic_add_fetch(&clk, 1, ORD_STAMP);
	CC_BARRIER();
	return v;
}

void cleanup(void)
{
	pid_t pid = __atomic_exchange_n(&broker, -1, __ATOMIC_RELAXED);

	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	if (dir[0]) {
		/* chimed's files too: the socket, the logs, the segments ("chime.sock.shard0"...). */
		DIR *dp = opendir(dir);
		struct dirent *de;

		while (dp && (de = readdir(dp)))
			if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
				unlinkat(dirfd(dp), de->d_name, 0);
		if (dp)
			closedir(dp);
		rmdir(dir);
		dir[0] = 0;
	}
}

static void show_file(const char *what, const char *path)
{
	char buf[4096];
	size_t n;
	FILE *f = fopen(path, "r");

	if (!f)
		return;
	fprintf(stderr, "--- %s:\n", what);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, stderr);
	fclose(f);
}

/*
 * A race report here ends the process inside TSan (halt_on_error), past
 * any exit handler: without this, chimed lived on, orphaned, with its
 * directory. Weak: a build without a sanitizer has no such hook.
 */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void on_sanitizer_death(void)
{
	cleanup();
}

void fail(const char *fmt, ...)
{
	va_list ap;

	if (__atomic_exchange_n(&failing, 1, __ATOMIC_ACQ_REL))
		for (;;)
			pause();        /* another thread fails first, and ends the process */
	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	show_file("chimed", log_path);
	show_file("chimectl", ctl_log_path);
	cleanup();
	/*
	 * Not _exit(): TSan's interceptor finalizes, which waits for the
	 * thread registry, and a race report under way in another thread
	 * (the stall that made this thread give up) holds it and waits in
	 * turn: the run hung until meson's time-out (seen, an API review).
	 */
	syscall(SYS_exit_group, 1);
	_exit(1);
}

void violation(const char *fmt, ...)
{
	va_list ap;

	if (__atomic_fetch_add(&violations, 1, __ATOMIC_RELAXED) >= MAX_REPORT)
		return;
	fprintf(stderr, "%s: %s: VIOLATION: ", prog, scenario_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void broker_alive(void)
{
	pid_t pid;
	int st;

	pthread_mutex_lock(&broker_lock);
	pid = __atomic_load_n(&broker, __ATOMIC_RELAXED);
	if (pid <= 0 || waitpid(pid, &st, WNOHANG) != pid) {
		pthread_mutex_unlock(&broker_lock);
		return;
	}
	__atomic_store_n(&broker, -1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&broker_lock);
	fail("chimed %s %d during the %s scenario", WIFEXITED(st) ? "exited" : "was killed by signal",
	     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), scenario_name);
}

pid_t spawn_broker(void)
{
	char *argv[] = { (char *)chimed_path, (char *)"--foreground", (char *)"--shards", (char *)"2",
			 (char *)"--socket", sock_path,
			 (char *)"--subuid-file", (char *)"", NULL };     /* not the host's (T_SUBUIDS_NONE()) */
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int r;

	if (posix_spawn_file_actions_init(&fa) ||
	    posix_spawn_file_actions_addopen(&fa, 2, log_path, O_WRONLY | O_CREAT | O_APPEND, 0600))
		fail("posix_spawn_file_actions: out of memory");
	if ((r = posix_spawn(&pid, chimed_path, &fa, NULL, argv, environ)) != 0)
		fail("posix_spawn %s: %s", chimed_path, strerror(r));
	posix_spawn_file_actions_destroy(&fa);
	return pid;
}

void start_broker(void)
{
	char tmpl[64];

	snprintf(tmpl, sizeof(tmpl), "/tmp/chime-%s-XXXXXX", prog);
	if (!mkdtemp(tmpl))
		fail("mkdtemp: %s", strerror(errno));
	snprintf(dir, sizeof(dir), "%s", tmpl);
	snprintf(sock_path, sizeof(sock_path), "%s/chime.sock", dir);
	snprintf(log_path, sizeof(log_path), "%s/chimed.log", dir);
	snprintf(ctl_log_path, sizeof(ctl_log_path), "%s/chimectl.log", dir);
	if (__sanitizer_set_death_callback)
		__sanitizer_set_death_callback(on_sanitizer_death);
	setenv("TSAN_OPTIONS", TSAN_OPTS, 0);
	fflush(NULL);
	broker = spawn_broker();
	for (int i = 0; i < 400; i++) {
		struct stat st;

		if (stat(sock_path, &st) == 0 && S_ISSOCK(st.st_mode))
			return;
		if (waitpid(broker, NULL, WNOHANG) == broker) {
			broker = -1;
			fail("chimed '%s' exited before listening", chimed_path);
		}
		pause_ns(25000000);
	}
	fail("chimed '%s' did not listen on '%s' within 10 s", chimed_path, sock_path);
}

unsigned log_lines(const char *path, const char *what, const char *and)
{
	char line[1024];
	unsigned n = 0;
	FILE *f = fopen(path, "r");

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, what) && (!and || strstr(line, and));
	if (f)
		fclose(f);
	return n;
}

bool log_says(const char *path, const char *what)
{
	return log_lines(path, what, NULL) != 0;
}

void stop_broker(void)
{
	bool raced;
	int st;

	kill(broker, SIGTERM);
	if (waitpid(broker, &st, 0) != broker)
		fail("waitpid(chimed): %s", strerror(errno));
	__atomic_store_n(&broker, -1, __ATOMIC_RELAXED);
	raced = log_says(log_path, "ThreadSanitizer") || log_says(ctl_log_path, "ThreadSanitizer");
	if (raced || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail("chimed %s %d%s", WIFEXITED(st) ? "exited" : "killed by signal",
		     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
		     raced ? ", and a race was reported (chimed or chimectl)" : "");
}
