/* SPDX-License-Identifier: MIT */
/* notify.c - see notify.h. */
#include "notify.h"

#include "chime_config.h"

#if CHIME_SYSTEMD
#include <stdbool.h>
#include <systemd/sd-daemon.h>

static bool watchdog_checked;
static uint64_t watchdog_half_ns;   /* 0: no watchdog */
static uint64_t watchdog_last_ns;

void notify_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void notify_stopping(void)
{
	sd_notify(0, "STOPPING=1");
}

void notify_reloading(const char *status)
{
	sd_notifyf(0, "RELOADING=1\nSTATUS=%s", status);
}

uint64_t notify_watchdog_half_ns(void)
{
	if (!watchdog_checked) {
		uint64_t usec = 0;

		/* 0 unset: $WATCHDOG_USEC is still there for the check on every call. */
		if (sd_watchdog_enabled(0, &usec) > 0)
			watchdog_half_ns = usec * 1000u / 2;
		watchdog_checked = true;
	}
	return watchdog_half_ns;
}

void notify_watchdog(uint64_t now_ns, uint64_t period_ns)
{
	/* Ping now if waiting one more period would pass WATCHDOG_USEC/2. */
	if (!notify_watchdog_half_ns() ||
	    (watchdog_last_ns && now_ns - watchdog_last_ns + period_ns < watchdog_half_ns))
		return;
	watchdog_last_ns = now_ns;
	sd_notify(0, "WATCHDOG=1");
}

void notify_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}
#else
void notify_ready(const char *status) { (void)status; }
void notify_stopping(void) { }
void notify_reloading(const char *status) { (void)status; }
uint64_t notify_watchdog_half_ns(void) { return 0; }
void notify_watchdog(uint64_t now_ns, uint64_t period_ns) { (void)now_ns; (void)period_ns; }
void notify_status(const char *status) { (void)status; }
#endif
