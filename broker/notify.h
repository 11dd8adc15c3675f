/* SPDX-License-Identifier: MIT */
/*
 * notify.h - tell systemd how chimed is doing (sd_notify(3)).
 *
 * Built with libsystemd (meson -Dsystemd=enabled/auto) these send to
 * $NOTIFY_SOCKET; without it, or when chimed was not started by systemd,
 * they do nothing. None of them can fail in a way the broker cares about.
 */
#ifndef CHIMED_NOTIFY_H
#define CHIMED_NOTIFY_H

#include <stdint.h>

/* READY=1 with a STATUS= line: the socket listens. */
void notify_ready(const char *status);

/* STOPPING=1: shutdown has begun. */
void notify_stopping(void);

/*
 * RELOADING=1: a restart in place (chimectl restart) has begun; the same
 * pid, chimed again, says READY=1 once it listens. Not STOPPING=1: systemd
 * would take the unit as stopping, ignore that READY=1, and kill the new
 * broker after TimeoutStopSec=.
 */
void notify_reloading(const char *status);

/*
 * WATCHDOG=1 when sd_watchdog_enabled() says systemd wants it: call it every
 * `period_ns` (the heartbeat) with CLOCK_MONOTONIC now; it pings only when
 * waiting one more period would leave more than WATCHDOG_USEC/2 unpinged.
 */
void notify_watchdog(uint64_t now_ns, uint64_t period_ns);

/* WATCHDOG_USEC/2 in ns when systemd wants WATCHDOG=1, else 0. */
uint64_t notify_watchdog_half_ns(void);

/* STATUS=<text>. */
void notify_status(const char *status);

#endif /* CHIMED_NOTIFY_H */
