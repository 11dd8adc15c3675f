# SPDX-License-Identifier: MIT
"""chime with asyncio: a Chime whose events are awaited, not waited for.

    import asyncio, chime.aio

    async def main():
        async with chime.aio.AsyncChime() as c:
            c.arm(key=1, after=0.1, data=7)
            async for ev in c:
                print(ev.data)
                break

    asyncio.run(main())

The loop watches the connection's fileno() (loop.add_reader): awaiting events
never blocks the loop. arm, arm_realtime, reset, cancel, cancel_key, submit and
flush are the Chime's own (no await: they are stores into shared memory),
which wait, and stall the loop, only while a submission ring is full: the
broker behind, or a named session's broker restarting (once its ring is
full, until the next broker is up: $CHIME_RECONNECT_S, 30 s, at most).
"""
import asyncio
import threading
import weakref

from . import Chime

__all__ = ["AsyncChime"]


class AsyncChime:
    """An asyncio view of a Chime: AsyncChime(chime=None, **kw) wraps
    `chime`, or a Chime(**kw) it opens (and then closes). Its arm,
    arm_realtime, reset, cancel, cancel_key, submit and flush are that
    Chime's own methods (help(chime.Chime)); its events come from
    `await c.wait()` or `async for ev in c`."""

    def __init__(self, chime=None, **kw):
        if chime is not None and kw:
            raise TypeError(f"AsyncChime(chime=...) wraps that Chime: {', '.join(sorted(kw))} would open "
                            "another (give them to chime.Chime())")
        self._own = chime is None
        self.chime = Chime(**kw) if chime is None else chime
        self.arm = self.chime.arm
        self.arm_realtime = self.chime.arm_realtime
        self.reset = self.chime.reset
        self.cancel = self.chime.cancel
        self.cancel_key = self.chime.cancel_key
        self.submit = self.chime.submit
        self.flush = self.chime.flush
        # One task collects at a time (as one thread does from a Chime): the
        # others queue here, so that each event goes to exactly one of them
        # and no task's reader replaces another's. A lock per loop: an
        # asyncio.Lock is bound to the loop it was first contended in, and
        # one held by a task whose loop was closed stays held for good.
        # Shared by every AsyncChime wrapping this Chime: a loop has one
        # reader per descriptor, and a second wrapper's add_reader() replaced
        # the first's, whose task then slept on with its event pending.
        self._locks = self.chime.__dict__.setdefault("_aio_locks", weakref.WeakKeyDictionary())
        self._ready = None      # the future the collecting task sleeps on
        self._watch = None      # (loop, fd) while a reader is registered for it
        # The loop whose tasks are in wait(), and how many (under _guard):
        # checked and claimed at once, or two loops starting together both
        # passed the check, and one's _unwatch() removed the other's reader.
        self._guard = threading.Lock()
        self._loop, self._tasks = None, 0
        self._closed = False
        self._hook = weakref.WeakMethod(self._chime_closed)
        hooks = self.chime._close_hooks     # those of wrappers gone dropped: a Chime may outlive many
        hooks[:] = [h for h in hooks if h() is not None] + [self._hook]

    def _check_open(self):
        if self._closed:
            raise ValueError("operation on a closed AsyncChime")

    async def wait(self, max=64):
        """The pending events (at least one, up to `max`), awaiting the first.
        Tasks awaiting it together take turns; close() ends their wait with
        ValueError. `async for ev in c` takes one event at a time: those a
        loop that stops has not reached stay pending."""
        self._check_open()
        loop = asyncio.get_running_loop()
        with self._guard:
            if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
                # Its reader and future are one loop's: a second loop collecting
                # at once would orphan them (the first lock, shared, said so too).
                raise RuntimeError("an AsyncChime is awaited in one event loop at a time")
            if self._loop is not loop:      # none, or one closed with its tasks in here
                self._loop, self._tasks = loop, 0
            self._tasks += 1
        try:
            return await self._wait(loop, max)
        finally:
            with self._guard:
                if self._loop is loop:      # not a closed loop's task, finalised later
                    self._tasks -= 1
                    if not self._tasks:
                        self._loop = None

    async def _wait(self, loop, max):
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        async with lock:
            empty = 0
            while True:
                self._check_open()
                events = self.chime.poll(max)
                if events:
                    return events
                # Woken with nothing to take, again and again: the descriptor
                # stays readable while what woke it waits on the broker (one
                # stopped, SIGSTOP or a debugger, with a reset of a fired timer
                # to settle: chime_poll(3)), and re-arming at once spun a core.
                # A few such wake-ups are normal; past them, back off (1 ms,
                # doubling, 100 ms at most), as chime_wait() sleeps in C.
                if empty > 2:
                    await asyncio.sleep(min(0.001 * 2 ** (empty - 3), 0.1))
                    self._check_open()
                    events = self.chime.poll(max)
                    if events:
                        return events
                # Nothing pending: the poll that ran dry asked for a wake-up on
                # fileno(); sleep in the loop until it comes.
                watch = self._watch
                if watch is not None and watch[0].is_closed():
                    self._watch = None      # a task of a loop closed in its wait: its reader went with it
                ready = self._ready = loop.create_future()
                # Held open until the reader is on the number (a close() on
                # another thread meanwhile closes it at _leave()), and a close
                # that came before _watch was set, which told no one
                # (_chime_closed), is seen here.
                self.chime._enter()
                try:
                    fd = self.chime.fileno()
                    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
                    watch = self._watch = (loop, fd)
                    if self._closed or self.chime.closed:
                        self._abandon()
                finally:
                    self.chime._leave()
                try:
                    await ready
                finally:
                    # Only what this task set: a task of a closed loop, finalised
                    # (GC) while another loop's task waits, cleared that one's
                    # future and removed its reader, which then slept for good.
                    if self._ready is ready:
                        self._ready = None
                    if self._watch is watch:
                        self._unwatch()
                empty += 1

    def _chime_closed(self):
        """The Chime closed, maybe by its owner and on another thread: the
        task awaiting its descriptor is told, and the loop stops watching
        the number before another open reuses it (at once on the loop's
        thread)."""
        watch = self._watch
        if watch is None:
            return
        try:
            here = asyncio.get_running_loop() is watch[0]
        except RuntimeError:
            here = False
        if here:
            self._abandon()
        else:
            try:
                watch[0].call_soon_threadsafe(self._abandon)
            except RuntimeError:    # that loop is closed: nothing awaits in it
                pass

    def _abandon(self):
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(ValueError("the Chime (or its AsyncChime) was closed while a task "
                                                 "awaited its events"))
        self._unwatch()

    def _unwatch(self):
        """Remove our reader, once: after close() the fd number may be another's."""
        if self._watch is not None:
            loop, fd = self._watch
            self._watch = None
            loop.remove_reader(fd)

    def __aiter__(self):
        return self

    async def __anext__(self):
        # One event per poll: events read ahead and held here would be lost
        # to a loop that breaks (wait() and a session's next opener included).
        return (await self.wait(1))[0]

    def close(self):
        """Close the Chime it opened (not one it was given); a task awaiting
        wait() gets ValueError, as it does when the Chime it was given is
        closed. From any thread, and after the task's loop has closed."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._hook in self.chime._close_hooks:
                self.chime._close_hooks.remove(self._hook)
            # The awaiting task is told on its loop's thread (at once on that
            # thread, before the fd is closed: the loop must not go on watching
            # a number the next open reuses); from another thread, its loop
            # stayed asleep in epoll for good when told from here.
            self._chime_closed()
        finally:
            if self._own:
                self.chime.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
