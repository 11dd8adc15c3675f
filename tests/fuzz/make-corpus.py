#!/usr/bin/env python3
"""make-corpus.py OUT_DIR - write the seed programs for fuzz_chan.

Each seed is a small program in fuzz_chan.c's step language: an opcode byte
(bit 0: which hostile client; bits 1-4: the step) and its operands; an odd
first byte also sets a per-client quota. They
start the fuzzer inside the interesting states: timers armed and fired,
a full completion ring, held events, voids racing the client, a dying client.
"""
import os
import random
import struct
import sys

HOSTILE_RECORD, SCRIBBLE, ARM, CANCEL, RESET, CANCEL_KEY, TAKE = 0, 2, 3, 4, 5, 6, 7
DRAIN, FIRE, SERVICE, PENDING, RECLAIM, WANT_WAKEUP, BURST, LOOP = 8, 9, 10, 11, 12, 13, 14, 15


def op(step, hostile=0):
    return bytes([(step << 1) | hostile])


def u8(v):
    return bytes([v & 0xff])


def u32(v):
    return struct.pack("<I", v & 0xffffffff)


def u64(v):
    return struct.pack("<Q", v & 0xffffffffffffffff)


def arm(delay_ticks, key=0, periodic=False, ud=7):
    # deadline offset (u32), key (u8), periodic? (u8 >= 192) then period (u8), user_data (u64)
    b = op(ARM) + u32(delay_ticks * 100000) + u8(key) + u8(200 if periodic else 0)
    if periodic:
        b += u8(3)
    return b + u64(ud)


def fire(ns):
    return op(FIRE) + u8(64) + u32(ns) + u8(63)


def loop():
    return op(LOOP)


def hostile_arm(h, delay):
    # slot at head, proper seq; op ARM (1); id: its own slot's grant; key 0; deadline now+delay
    return (op(HOSTILE_RECORD, h) + u8(0) + u8(1) + u8(0) + u8(0) + u8(0) + u8(0) + u32(delay)
            + u8(0) + u64(0))


def seeds():
    s = {}
    s["arm-fire-take"] = arm(5) + loop() + fire(600000) + loop() + op(TAKE) + u8(0) + loop()
    s["periodic-cancel"] = (arm(2, periodic=True) + loop() + fire(400000) + loop() + fire(400000) + loop()
                            + op(CANCEL) + u32(0) + loop() + op(TAKE) + u8(0))
    s["full-ring-backlog"] = b"".join(arm(1, ud=i) for i in range(8)) + loop() + b"".join(
        arm(1, ud=i) for i in range(8)) + loop() + fire(300000) + loop() + op(TAKE) + u8(3) + loop()
    s["reset-races-void"] = (arm(1) + loop() + fire(200000) + loop() + op(RESET) + u32(0) + u32(900000)
                             + loop() + op(TAKE) + u8(0) + fire(2000000) + loop())
    s["cancel-key"] = arm(3, key=1) + arm(4, key=1) + arm(5, key=2) + op(CANCEL_KEY) + u8(1) + loop()
    s["hostile-arms-and-dies"] = (b"".join(hostile_arm(1, 1000) for _ in range(6)) + loop()
                                  + arm(2) + fire(500000) + loop() + op(RECLAIM, 1) + u8(3)
                                  + op(RECLAIM, 1) + u8(63) + op(RECLAIM, 1) + loop())
    s["hostile-scribbles"] = (hostile_arm(0, 0) + loop() + fire(100) + op(SCRIBBLE, 0) + u8(0 | (5 << 3))
                              + op(SCRIBBLE, 0) + u8(1) + u8(0) + u8(2) + op(SCRIBBLE, 0) + u8(2)
                              + u8(0) + u8(1) + loop() + arm(1) + fire(300000) + loop())
    # hostile bursts fill the slab: the honest client's renewed grants are owed, then paid
    burst = lambda h: op(BURST, h) + u8(31) + b"".join(u8(0) + u32(0) for _ in range(16))
    s["slab-full"] = (burst(0) + burst(1) + b"".join(arm(1, ud=i) for i in range(10)) + loop()
                      + fire(300000) + loop() + op(TAKE) + u8(0) + loop() + op(RECLAIM, 0) + u8(63)
                      + op(RECLAIM, 0) + u8(63) + loop() + op(TAKE) + u8(0) + loop())
    # an odd first byte sets a per-client quota (here 15 nodes): arms past it get markers
    s["quota-reached"] = (op(PENDING, 1) + u8(0) + b"".join(arm(2, ud=i) for i in range(12)) + loop()
                          + burst(1) + b"".join(arm(1, ud=i) for i in range(6)) + loop() + fire(400000)
                          + loop() + op(TAKE) + u8(0) + loop() + b"".join(arm(1, ud=i) for i in range(4))
                          + loop() + fire(200000) + loop())
    rnd = random.Random(7)
    for i in range(4):
        s["random-%d" % i] = bytes(rnd.randrange(256) for _ in range(256))
    return s


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
