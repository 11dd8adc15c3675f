#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""asyncio_timeouts - request timeouts in an asyncio program, served by chimed.

Every request gets a timeout timer; a request that answers in time cancels
it (a store into shared memory, no system call). One task collects the
expirations with `async for` while the requests run; a periodic tick runs
beside them. Exits 0 if exactly the slow requests timed out, each once,
never early.

    asyncio_timeouts.py [REQUESTS]        # default 200; $CHIME_SOCKET picks the broker
"""
import argparse
import asyncio
import random
import sys

import chime
import chime.aio

TIMEOUT = 0.05          # seconds a request may take
TICK = 0                # key of the periodic tick; requests use key 1
REQUEST = 1


async def request(c, i, slow, timers):
    tid = c.arm(REQUEST, after=TIMEOUT, data=i)
    timers[i] = tid
    await asyncio.sleep(TIMEOUT * 3 if slow else TIMEOUT / 10)
    if not slow:
        c.cancel(tid)   # answered in time


async def main(n):
    rng = random.Random(1)
    slow = {i for i in range(n) if rng.random() < 0.3}
    timers, timed_out, ticks = {}, set(), 0
    async with chime.aio.AsyncChime() as c:
        tick = c.arm(TICK, after=0.01, period=0.01)

        async def collect():
            nonlocal ticks
            if not slow:
                return
            async for ev in c:
                if ev.key == TICK:
                    ticks += 1
                    continue
                if ev.data in timed_out or ev.data not in slow or chime.now() < ev.deadline_ns:
                    sys.exit(f"asyncio_timeouts: request {ev.data} timed out wrongly")
                timed_out.add(ev.data)
                if timed_out == slow:
                    return

        collector = asyncio.create_task(collect())
        await asyncio.gather(*(request(c, i, i in slow, timers) for i in range(n)))
        await asyncio.wait_for(collector, timeout=10)
        c.cancel(tick)
    print(f"asyncio_timeouts: {len(timed_out)} timeouts of {n} requests, {ticks} ticks")
    return 0 if timed_out == slow and ticks > 0 else 1


def requests(text):
    n = int(text)
    if n < 1:
        raise ValueError(text)
    return n


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Request timeouts in an asyncio program, served by chimed "
                                     "($CHIME_SOCKET picks the broker).")
    parser.add_argument("requests", nargs="?", type=requests, default=200,
                        help="how many requests to run, 1 or more (default 200)")
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(main(args.requests)))
    except OSError as e:            # no broker, not admitted, ...: one line, as the C examples say it
        sys.exit(f"asyncio_timeouts: {e}")
