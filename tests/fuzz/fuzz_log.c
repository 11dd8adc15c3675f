/* SPDX-License-Identifier: MIT */
/*
 * fuzz_log.c - broker/log.c for the fuzz targets that run broker code which
 * logs: nothing is logged (refusals would flood the fuzzer's output), and
 * the functions return what log.c's do.
 */
#include <errno.h>
#include <stdbool.h>

#include "log.h"

void log_msg(int level, const char *fmt, ...)
{
	(void)level;
	(void)fmt;
}

int log_errno(int level, int err, const char *fmt, ...)
{
	(void)level;
	(void)fmt;
	return -(err < 0 ? -err : err);
}

int log_errno_hint(int level, int err, const char *hint, const char *fmt, ...)
{
	(void)level;
	(void)hint;
	(void)fmt;
	return -(err < 0 ? -err : err);
}

bool log_budget_take(struct log_budget *b, unsigned per_s, const char *what)
{
	(void)b;
	(void)per_s;
	(void)what;
	return true;
}

int log_file_not_ours(const char *what, const char *path, const struct stat *st, const char *remedy)
{
	(void)what;
	(void)path;
	(void)st;
	(void)remedy;
	return -EPERM;
}

bool log_ratelimit(uint64_t *last, unsigned interval_s)
{
	(void)last;
	(void)interval_s;
	return true;
}
