# SPDX-License-Identifier: MIT
"""chime: timers served by the host's chime broker (chimed), from Python.

    import chime

    with chime.Chime() as c:
        tid = c.arm(key=1, after=0.5, data=42)
        for ev in c.wait(timeout=1.0):
            print(ev.id == tid, ev.data, ev.fired_ns - ev.deadline_ns)

A thin ctypes binding of libchime (see libchime(3) and the chime_*(3) pages):
arming, resetting and cancelling are stores into shared memory, with no
round trip to the broker. Times are nanoseconds of CLOCK_MONOTONIC
(time.monotonic_ns() reads the same clock; chime.now() too); `after` and
`period` are seconds, as floats. Errors are OSError with the errno of the C
call and a message naming the call and the cause. chime.aio integrates a
Chime with asyncio.
"""
import contextlib
import ctypes
import errno
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass

from ._lib import ChimeEvent, ChimeOp, ChimeOpts, lib

__all__ = ["Chime", "drop_session", "Event", "Op", "now", "version", "DEFAULT_SOCKET", "OPEN_RECORD_RESETS"]

DEFAULT_SOCKET = "/run/chime/chime.sock"
OPEN_RECORD_RESETS = 1      # CHIME_OPEN_RECORD_RESETS (chime.h): Chime(record_resets=True)
_U64_MAX = (1 << 64) - 1
# The longest chime_wait() of Chime.wait(): how long a close() on another
# thread may take to end it. An idle wait(None) wakes 4 times a second for
# it, at 0.1-0.2 ms of CPU each (measured: 0.1 % of a core; 100 ms slices
# cost 0.2 %, and 10 wake-ups a second of every idle waiter).
_WAIT_SLICE_MS = 250


@dataclass(frozen=True)
class Event:
    """One expiration: the timer's id, key and data as armed, the deadline it
    fired for (in the timer's clock: CLOCK_REALTIME for arm_realtime()'s)
    and when the broker fired it (CLOCK_MONOTONIC ns), and whether
    the timer is periodic (it stays armed). `periodic` is what this Chime
    remembers of its own periodic arms (arm(), submit()), also for an event
    taken while one is still under way or being cancelled on another thread:
    the C event does not say, so a timer armed by an earlier process of the
    same session says False."""
    id: int
    key: int
    data: int
    deadline_ns: int
    fired_ns: int
    periodic: bool


@dataclass(frozen=True)
class Op:
    """One operation of a Chime.submit() batch; make it with Op.arm(),
    Op.arm_realtime(), Op.reset(), Op.cancel() or Op.cancel_key(), whose arguments are those of
    the Chime methods of the same names (`after` counts from when the Op is
    made). One made by hand, Op(code, ...), is checked the same way:
    ValueError for a code that is none of those, or a field that is not an
    int in 0..2**64-1."""
    code: int
    id: int = 0
    key: int = 0
    deadline_ns: int = 0
    period_ns: int = 0
    data: int = 0

    ARM, RESET, CANCEL, CANCEL_KEY, ARM_REALTIME = 1, 2, 3, 4, 5     # enum chime_op_code

    def __post_init__(self):
        # One built by hand is checked as the class methods check theirs:
        # ctypes would pass a field modulo 2**64 (a cancel of 2**64 + id
        # cancels id), and submit() could not name an unknown code's
        # refusal once the rest of its batch was applied.
        if not isinstance(self.code, int) or isinstance(self.code, bool) or \
                self.code not in (1, 2, 3, 4, 5):      # not 1.0, not True; an IntEnum is an int
            raise ValueError(f"code must be one of Op.ARM, RESET, CANCEL, CANCEL_KEY, ARM_REALTIME, "
                             f"not {self.code!r}")
        for name in ("id", "key", "deadline_ns", "period_ns", "data"):
            _u64(name, getattr(self, name))

    @classmethod
    def arm(cls, key, *, at_ns=None, after=None, period=None, data=0):
        return cls(cls.ARM, key=_u64("key", key), deadline_ns=_deadline(at_ns, after),
                   period_ns=_period_ns(period), data=_u64("data", data))

    @classmethod
    def arm_realtime(cls, key, *, at_ns, period=None, data=0):
        return cls(cls.ARM_REALTIME, key=_u64("key", key), deadline_ns=_u64("at_ns", at_ns),
                   period_ns=_period_ns(period), data=_u64("data", data))

    @classmethod
    def reset(cls, id, *, at_ns=None, after=None):
        return cls(cls.RESET, id=_u64("id", id), deadline_ns=_deadline(at_ns, after))

    @classmethod
    def cancel(cls, id):
        return cls(cls.CANCEL, id=_u64("id", id))

    @classmethod
    def cancel_key(cls, key):
        return cls(cls.CANCEL_KEY, key=_u64("key", key))


def now():
    """CLOCK_MONOTONIC in nanoseconds, the clock of every deadline but
    arm_realtime()'s (CLOCK_REALTIME: time.time_ns())."""
    return lib.chime_now()


def version():
    """The version of the libchime in use, "MAJOR.MINOR.PATCH"."""
    return lib.chime_version().decode()


# Why a call failed, in the words of the chime_*(3) pages.
_WHY = {
    ("chime_open", errno.ENOENT): "no chimed listens at {socket} (is chimed running?)",
    ("chime_open", errno.EACCES): "chimed at {socket} does not admit this user (its --allow-uid, "
                                  "--allow-gid, --allow-all policy) or the socket's permissions refuse it"
                                  "{or_session}",
    ("chime_open", errno.EPERM): "what listens at {socket} runs as a user that is not root, not this "
                                 "process's and does not own the socket's directory: not trusted (run "
                                 "chimed as root, or put its socket in a directory its user owns)",
    ("chime_open", errno.EUSERS): "too many clients for this user, chimed's client table is full, "
                                 "or chimed is out of file descriptors",
    ("chime_open", errno.EPROTO): "chimed speaks another shared-memory layout version "
                                  "(libchime and chimed of different releases)",
    ("chime_open", errno.ETIMEDOUT): "chimed accepted the connection but did not answer within 10 s",
    ("chime_open", errno.ECONNRESET): "chimed hung up during the handshake",
    ("chime_open", errno.ECONNREFUSED): "chimed at {socket} is stopping or restarting and takes no new "
                                        "client; open again once the next one listens",
    ("chime_open", errno.EBADMSG): "chimed's reply or shared memory was malformed",
    ("chime_open", errno.EINVAL): "{invalid}",
    ("chime_open", errno.EBUSY): "the session is attached to another process, or to another Chime of this "
                                 "process (one at a time)",
    ("chime_open", errno.EXDEV): "this process's CLOCK_MONOTONIC is not chimed's (a time namespace with "
                                 "another offset, unshare --time): its deadlines would be off",
    ("chime_drop_session", errno.ENOENT): "no chimed listens at {socket} (is chimed running?)",
    ("chime_drop_session", errno.ESRCH): "no session is named {session!r}",
    ("chime_drop_session", errno.EBUSY): "a live process has session {session!r} attached (close it first)",
    ("chime_drop_session", errno.EACCES): "session {session!r} is another user's, or chimed at {socket} "
                                          "does not admit this user",
    ("chime_drop_session", errno.EINVAL): "{invalid}",
    ("chime_arm", errno.EDQUOT): "this client, or its user's clients together, have as many armed timers "
                                 "as chimed allows (chimed --max-timers-per-client, --max-timers-per-uid)",
    ("chime_arm", errno.ENOMEM): "chimed's shards have no free timer (chimed --capacity), or the filesystem "
                                 "of its state files is full (its log says which); nothing was armed",
    ("chime_arm_realtime", errno.EDQUOT): "this client, or its user's clients together, have as many armed "
                                          "timers as chimed allows (chimed --max-timers-per-client, "
                                          "--max-timers-per-uid)",
    ("chime_arm_realtime", errno.ENOMEM): "chimed's shards have no free timer (chimed --capacity), or the "
                                          "filesystem of its state files is full (its log says which); "
                                          "nothing was armed",
    ("chime_arm_realtime", errno.EOPNOTSUPP): "chimed is older than wall-clock timers; nothing was armed",
    ("chime_reset", errno.EINVAL): "{id} is not a timer id of this broker",
    ("chime_cancel", errno.EINVAL): "{id} is not a timer id of this broker",
}


def _error(func, err, **what):
    why = _WHY.get((func, err))
    if why is None and func == "chime_drop_session":
        why = _WHY.get(("chime_open", err))     # "as chime_open()" (chime_drop_session(3)): EPERM, EUSERS, ...
    if why is None:
        why = "chimed is gone" if err == errno.ENOTCONN else \
            "this connection was opened by the parent process, before fork(); open another one" \
            if err == errno.ECHILD else os.strerror(err)
    else:
        why = why.format(**what)
    return OSError(err, f"{func}: {why}")


def _u64(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{name} must be an int in 0..2**64-1, not {value!r}")
    return value


def _seconds_ns(name, value):
    """Seconds as nanoseconds, saturated at 2**64-1 (584 years): ctypes would
    pass a larger int modulo 2**64 (a period that long would become a short
    one), and value * 1e9 may overflow a float. An int is taken exactly,
    however large (math.isfinite() of one beyond a float's range raises)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value!r}")
    if isinstance(value, int):
        return min(value * 1_000_000_000, _U64_MAX)
    if value >= _U64_MAX / 1e9:
        return _U64_MAX
    return min(int(round(value * 1e9)), _U64_MAX)


def _c_string(name, value):
    """os.fsencode(value), refused if it holds a NUL: a C string would end
    there, and another socket or session than the one named be used."""
    b = os.fsencode(value)
    if b"\0" in b:
        raise ValueError(f"{name} {value!r}: embedded null byte")
    return b


def _period_ns(period):
    if period is None:
        return 0
    period_ns = _seconds_ns("period", period)
    if period_ns == 0:
        raise ValueError(f"period must be at least 1 ns (1e-9 seconds), not {period!r} (leave it out for a "
                         "one-shot timer)")
    return period_ns


def _deadline(at_ns, after):
    if (at_ns is None) == (after is None):
        raise TypeError("give exactly one of at_ns= (absolute, CLOCK_MONOTONIC ns) "
                        "and after= (seconds from now)")
    if at_ns is not None:
        return _u64("at_ns", at_ns)
    return min(lib.chime_now() + _seconds_ns("after", after), _U64_MAX)


_SESSION_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _socket_shown(socket):
    """The path libchime tried, for an error: `socket`, else $CHIME_SOCKET if not empty, else the default."""
    return socket if socket is not None else os.environ.get("CHIME_SOCKET") or DEFAULT_SOCKET


def _open_invalid(socket, session):
    """What chime_open's EINVAL was about: the session name, else the socket path."""
    if session is not None:
        name = os.fsencode(session)
        if not 1 <= len(name) <= 63 or not set(name) <= _SESSION_CHARS:
            return f"{session!r} is not a session name (1..63 of A-Z a-z 0-9 . _ -)"
    return f"{socket!r} is not a socket path (empty, or longer than a unix socket's 107 bytes)"


def drop_session(session, socket=None):
    """End the named session at once: chimed cancels its timers and frees the
    name (chime_drop_session(3)). Only a session nobody holds: close your
    own Chime first. OSError on failure (ESRCH: no such session, EBUSY: a
    live process has it, EACCES: another user's)."""
    if not isinstance(session, (str, bytes)):
        raise TypeError(f"session must be str or bytes, not {type(session).__name__}")
    path = _c_string("socket", socket) if socket is not None else None
    r = lib.chime_drop_session(ctypes.byref(ChimeOpts(path, 0, _c_string("session", session))))
    if r < 0:
        shown = _socket_shown(socket)
        raise _error("chime_drop_session", -r, socket=shown, session=os.fsdecode(session),
                     invalid=_open_invalid(shown, session), or_session="")


# Every Chime with a handle, for the child of a fork (Chime._after_fork).
_open = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_open):
        c._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

_OP_ID = ChimeOp.id.offset
_OP_SIZE = ctypes.sizeof(ChimeOp)
# ChimeOp.result before chime_submit() sets it (to 0 or a negative errno):
# the mark of an operation whose C call has not been made.
_UNSENT = 1 << 30
_OneOp = ChimeOp * 1


class _Arming:
    """A periodic arm under way: from before its C call to the note of its id
    in Chime._periodic. `cell` (a c_uint64) is 0 until the C call has armed
    the timer (chime_arm() stores the id last, after publishing the record:
    only the arming thread may rely on it before the note); `void` once the
    timer is known not to be live (the arm refused, or cancelled by a later
    operation of its batch or by a signal handler that ran after its C
    call), so that it is not noted."""
    __slots__ = ("cell", "key", "void")

    def __init__(self, cell, key):
        self.cell, self.key, self.void = cell, key, False


class _Cancel:
    """A cancel_key under way (its ChimeOp `op`, and its key), and the ids of
    the periodic timers of its key noted before its C call: those noted when
    it began, and a signal handler's on its thread while op.result is
    _UNSENT. That C call cancels them."""
    __slots__ = ("op", "key", "noted")

    def __init__(self, op):
        self.op, self.key, self.noted = op, op.key, []


class Chime:
    """One connection to the broker. Chime(socket=None, session=None): the
    socket is `socket`, else $CHIME_SOCKET, else /run/chime/chime.sock.
    Closing it (or leaving its `with` block) cancels every timer it armed,
    unless `session` (str or bytes) names a session (1..63 of [A-Za-z0-9._-]): its timers
    stay for the next Chime that opens it, and a restart of chimed goes
    unseen (the library reconnects, up to $CHIME_RECONNECT_S, 30 s; see
    chime_open(3), "Broker restarts").

    arm, reset, cancel and cancel_key may be called from any thread, and
    so may poll and wait: threads collecting together take turns, each
    event going to one of them (in C two drains at once are undefined:
    chime_poll(3)); a poll() finds none while another thread's poll or
    wait has the turn. After close() every call
    raises ValueError; calls already under way in other threads finish on
    the open connection, and the last of them to return closes it (a wait()
    among them ends within 0.25 s, raising ValueError). In a child after
    fork() every call raises OSError ECHILD, and close() frees the child's
    copies at once, whatever the parent's other threads were doing
    (libchime(3), FORK): the child opens a Chime of its own.

    record_resets=True is CHIME_OPEN_RECORD_RESETS: every reset a record in
    the ring, no touch table (4 bytes of shared memory per armed timer
    saved, 12 per reset one; a keepalive's resets cost more; chime_open(3),
    chime_reset(3))."""

    def __init__(self, socket=None, session=None, *, record_resets=False):
        self._c = None
        self._periodic = {}     # id -> key of the periodic timers: Event.periodic (under _order)
        # Held across the C call of a periodic arm, a cancel_key or a submit
        # and the note of what it did in _periodic, so that a cancel_key on
        # another thread comes wholly before an arm and its note or wholly
        # after (one between them found nothing to forget: the note stayed
        # for ever), and a cancel(id) forgets `id` after its arm noted it.
        # Events are converted under it (_events), so that one taken between
        # an arm's C call and its note waits for the note.
        self._order = threading.RLock()
        # The periodic arms under way (_Arming), between their C call and
        # their note: only the thread holding _order has any, and a signal
        # handler on it that takes an event in between reads the id here.
        self._arming = []
        # The cancel_keys under way (_Cancel), on the thread holding _order.
        self._cancelling = []
        # The poll()s and wait() slices under way (one item each: append and
        # pop are atomic, no lock before the C call), and the periodic ids
        # forgotten meanwhile (_forget): an event their C call took before
        # the cancel still says periodic. Emptied when the last one ends.
        self._collecting = []
        self._gone = set()
        self._buf = None
        # Held by the thread in a poll() or wait() slice across its C call
        # and the copy of its events: two drains at once are undefined in C
        # (chime_poll(3): events lost, a chime_wait() that never returned),
        # so threads take turns. Re-entrant for a signal handler's poll on
        # that thread, which comes after the C call, never inside it.
        self._drain = threading.RLock()
        # The calls under way in C, so that close() never frees the handle
        # under one (ctypes lets other threads run during a foreign call):
        # the last call out frees it. Re-entrant: a signal handler or a
        # __del__ may call in on a thread that holds it.
        self._lock = threading.RLock()
        self._calls = 0
        self._mine = threading.local()     # .calls: this thread's part of _calls (_after_fork)
        self._closing = None    # the handle close() took away while calls were under way
        # Called once by the close() that closes it (chime.aio: a task awaiting
        # the descriptor is told), as weakref.WeakMethod: a wrapper may go first.
        self._close_hooks = []
        path = _c_string("socket", socket) if socket is not None else None
        if session is not None and not isinstance(session, (str, bytes)):
            raise TypeError(f"session must be str or bytes, not {type(session).__name__}")
        name = _c_string("session", session) if session is not None else None
        opts = ChimeOpts(path, OPEN_RECORD_RESETS if record_resets else 0, name)
        handle = ctypes.c_void_p()
        r = lib.chime_open(ctypes.byref(handle), ctypes.byref(opts))
        if r < 0:
            shown = _socket_shown(socket)
            or_session = "" if session is None else \
                f", or session {os.fsdecode(name)!r} is another user's or its name is reserved for one"
            raise _error("chime_open", -r, socket=shown, invalid=_open_invalid(shown, session),
                         or_session=or_session)
        self._c = handle
        self._fd = lib.chime_fd(self._c)
        _open.add(self)

    def _enter(self):
        """The handle, counted as in use until _leave(); ValueError if closed."""
        with self._lock:
            if self._c is None:
                raise ValueError("operation on a closed Chime")
            self._calls += 1
            self._mine.calls = getattr(self._mine, "calls", 0) + 1
            return self._c

    def _leave(self):
        with self._lock:
            self._calls -= 1
            self._mine.calls -= 1
            c = self._closing if not self._calls else None
            if c is not None:
                self._closing = None
        if c is not None:
            lib.chime_close(c)

    def _call(self, func, *args):
        """func(handle, *args), with the handle held open for the call."""
        c = self._enter()
        try:
            return func(c, *args)
        finally:
            self._leave()

    @contextlib.contextmanager
    def _ordered(self):
        """The handle, held open, and _order held inside that: whoever holds
        _order takes _lock only before and after, so a signal handler's arm()
        on a thread inside _enter() or close() (holding _lock) waits for
        _order without a deadlock."""
        c = self._enter()
        try:
            with self._order:
                yield c
        finally:
            self._leave()

    def arm(self, key, *, at_ns=None, after=None, period=None, data=0):
        """Arm a timer at at_ns (absolute) or `after` seconds from now,
        repeating every `period` seconds if given; returns its id (never 0).
        A deadline in the past fires at once; a periodic timer then fires
        once for every period already missed (at_ns=0, period=1: one event
        per second of uptime), so start one with after=0 or after=period.
        Times beyond 2**64 ns (584 years) mean never: such a timer, or a
        periodic one once its next deadline would pass them, stays armed,
        and counts against the quotas, until cancelled."""
        return self._arm("chime_arm", _deadline(at_ns, after), key, period, data)

    def arm_realtime(self, key, *, at_ns, period=None, data=0):
        """Arm a wall-clock timer at at_ns, CLOCK_REALTIME nanoseconds since
        the Epoch (time.time_ns()), repeating every `period` seconds of wall
        clock if given; returns its id. It fires when the wall clock reaches
        it, never before, and follows steps of the wall clock (a step
        forward fires what is then due at once, a step back delays it);
        reset() of it takes CLOCK_REALTIME too, and its events' deadline_ns
        is CLOCK_REALTIME (chime_arm_realtime(3)). OSError EOPNOTSUPP from
        a chimed older than wall-clock timers."""
        return self._arm("chime_arm_realtime", _u64("at_ns", at_ns), key, period, data)

    def _arm(self, name, deadline, key, period, data):
        func = getattr(lib, name)
        period_ns = _period_ns(period)
        out = ctypes.c_uint64()
        key, data = _u64("key", key), _u64("data", data)
        args = (key, deadline, period_ns, data, ctypes.byref(out))
        if not period_ns:       # nothing to note: no _order
            r = self._call(func, *args)
        else:
            arming = _Arming(out, key)
            with self._ordered() as c:
                self._arming.append(arming)
                try:
                    r = func(c, *args)
                finally:        # noted even if a signal handler raises after the C call
                    self._settle([arming])
        if r < 0:
            raise _error(name, -r)
        return out.value

    def reset(self, id, *, at_ns=None, after=None):
        """Move timer `id` to at_ns (absolute, in the timer's clock) or
        `after` seconds from now() (CLOCK_MONOTONIC). An earlier firing
        still in flight is never returned after this. A wall-clock timer
        (arm_realtime()) takes at_ns in CLOCK_REALTIME, time.time_ns() + ...:
        `after` would be read as a wall-clock time in 1970, due at once."""
        id, deadline = _u64("id", id), _deadline(at_ns, after)
        r = self._call(lib.chime_reset, id, deadline)
        if r < 0:
            raise _error("chime_reset", -r, id=id)

    def cancel(self, id):
        """Cancel timer `id`: no event for it is returned after this. A timer
        that already fired or was cancelled is not an error."""
        id = _u64("id", id)
        r = self._call(lib.chime_cancel, id)
        if r < 0:
            raise _error("chime_cancel", -r, id=id)
        with self._order:       # after the note of an arm still under way that returns `id`
            self._forget(id)
            for a in self._arming:  # a signal handler's cancel inside that arm, on its thread
                a.void = a.void or a.cell.value == id

    def cancel_key(self, key):
        """Cancel every timer this connection armed with `key`."""
        # chime_submit(), which does what chime_cancel_key() does, for its
        # op.result: set by the C call, it tells a signal handler's arm on
        # this thread whether that call has been made (_submit).
        arr = _OneOp()
        arr[0].op, arr[0].key = Op.CANCEL_KEY, _u64("key", key)
        with self._ordered() as c:
            r = self._submit(c, arr)
        err = r if r < 0 else arr[0].result
        if err < 0:
            raise _error("chime_cancel_key", -err)

    def submit(self, ops):
        """Apply a batch of Op values in one call (chime_submit(3)): one
        publication, one barrier and at most one doorbell per shard, and one
        call into the library instead of one per operation. Returns a list,
        one entry per Op: an arm's timer id, None for the others, or, for an
        operation refused alone (EDQUOT, ENOMEM, a malformed id), the
        OSError it would have raised, without raising it: the rest of the
        batch still applies. Raises only when the call fails as a whole (the
        broker gone before any operation succeeded, a forked child)."""
        ops = list(ops)
        if not ops:
            self._call(lambda c: None)      # ValueError once closed, as every call
            return []
        if not all(isinstance(o, Op) for o in ops):
            raise TypeError("submit takes Op values (Op.arm(), Op.arm_realtime(), Op.reset(), Op.cancel(), "
                            "Op.cancel_key())")
        arr = (ChimeOp * len(ops))()
        for a, o in zip(arr, ops):
            a.op, a.id, a.key, a.deadline_ns, a.period_ns, a.user_data = (
                o.code, o.id, o.key, o.deadline_ns, o.period_ns, o.data)
        names = {Op.ARM: "chime_arm", Op.RESET: "chime_reset", Op.CANCEL: "chime_cancel",
                 Op.CANCEL_KEY: "chime_cancel_key", Op.ARM_REALTIME: "chime_arm_realtime"}
        with self._ordered() as c:     # a batch may arm periodic timers, or cancel_key
            r = self._submit(c, arr)
        if r < 0:
            raise _error("chime_submit", -r)
        out = []
        for a, o in zip(arr, ops):
            if a.result < 0:
                out.append(_error(names[o.code], -a.result, id=o.id))
            else:
                out.append(a.id if o.code in (Op.ARM, Op.ARM_REALTIME) else None)
        return out

    def _submit(self, c, arr):
        """chime_submit(c, arr), and what it did noted in _periodic: its
        periodic arms noted, the ids its cancels and cancel_keys cancelled
        forgotten. Under _order (the caller's).

        A signal handler may run on this thread anywhere in here, arm, and
        note (_order is re-entrant): its arm comes before this C call or
        after it, and what this call forgets must be what it cancelled. A
        cancel_key forgets the notes of its key made before the C call: those
        already there, and those made while its op.result is _UNSENT (the
        handler's _settle records them in its _Cancel). A handler's arm after
        the C call stays noted. In turn, when this is a handler's call, the
        arms under way that it runs inside and cancels are not noted. The
        notes are settled from the results (not from the C call's return), in
        `finally`: a handler that raises after the C call does not skip them,
        and one before it finds all _UNSENT."""
        ops = arr[:]        # views of the ChimeOps, made once
        # the batch's periodic arms (each reading its id in its ChimeOp), and its cancel_keys
        arming, cancels = {}, {}
        for i, a in enumerate(ops):
            a.result = _UNSENT
            if a.op == Op.CANCEL_KEY:
                cancels[i] = _Cancel(a)
            elif a.op in (Op.ARM, Op.ARM_REALTIME) and a.period_ns:
                arming[i] = _Arming(ctypes.c_uint64.from_buffer(arr, i * _OP_SIZE + _OP_ID), a.key)
        outer = list(self._arming)     # (a signal handler's call) the periodic arms it runs inside
        self._arming += arming.values()
        self._cancelling += cancels.values()
        try:
            if cancels and self._periodic:      # what is noted now (a handler's note from here on: _settle)
                by_key = {}
                for x in cancels.values():
                    by_key.setdefault(x.key, []).append(x)
                for t, k in list(self._periodic.items()):
                    for x in by_key.get(k, ()):
                        x.noted.append(t)
            return lib.chime_submit(c, arr, len(ops))
        finally:
            for x in cancels.values():
                self._cancelling.remove(x)
            # the periodic arms not yet noted whose C call came before: those
            # it runs inside (a signal handler's call) and the batch's so far
            armed = [x for x in outer if x.cell.value]
            for i, a in enumerate(ops):
                # refused, or not sent (an arm unpublished by a stopping broker keeps its id)
                if a.result:
                    if i in arming:
                        arming[i].void = True
                elif i in arming:
                    armed.append(arming[i])
                elif a.op == Op.CANCEL:
                    self._forget(a.id)
                    for x in armed:
                        x.void = x.void or x.cell.value == a.id
                elif i in cancels:
                    for t in cancels[i].noted:
                        self._forget(t)
                    for x in armed:
                        x.void = x.void or x.key == a.key
            if arming:
                self._settle(arming.values())

    def _settle(self, arming):
        """Note the ids of these periodic arms (_Arming) that armed a timer
        still live, and end their time under way; under _order. One inside
        a cancel_key of its key whose C call is still to come (a signal
        handler's) is recorded for it to forget once made (_submit)."""
        for a in arming:
            tid = a.cell.value
            if tid and not a.void:
                self._periodic[tid] = a.key
                for x in self._cancelling:
                    if x.key == a.key and x.op.result == _UNSENT:
                        x.noted.append(tid)
            self._arming.remove(a)

    def _forget(self, tid):
        """Drop the note of periodic timer `tid`, cancelled; under _order,
        after the C cancel. A collection that begins after this reads
        _collecting takes no event of `tid` (the C call's promise): only one
        under way needs it in _gone."""
        if self._periodic.pop(tid, None) is not None and self._collecting:
            self._gone.add(tid)

    def flush(self):
        """Have the broker apply what this connection submitted now, rather
        than when its sleeping shards next wake (chime_flush(3)); does not
        wait for them."""
        r = self._call(lib.chime_flush)
        if r < 0:
            raise _error("chime_flush", -r)

    def _collect(self, func, buf, max, within=0, slice_ms=None):
        """func(handle, buf, max), chime_poll, or chime_wait for slice_ms()
        ms (read once _drain is held): its return and its events as Event
        values. (0, []) if another thread's drain holds _drain for more
        than `within` seconds (-1: as long as it takes)."""
        self._collecting.append(None)
        try:
            if not self._drain.acquire(timeout=within):
                return 0, []
            try:
                args = () if slice_ms is None else (slice_ms(),)
                r = self._call(func, buf, max, *args)
                # copied before the next drain's C call writes buf (another thread's may share it)
                taken = [(e.id, e.key, e.user_data, e.deadline_ns, e.fired_ns) for e in buf[:r]] if r > 0 else ()
            finally:
                self._drain.release()
            # converted out of _drain: _order's holder may poll in a signal handler
            return r, self._events(taken)
        finally:
            self._collecting.pop()
            if not self._collecting and self._gone:
                with self._order:
                    if not self._collecting:
                        self._gone.clear()

    def _events(self, taken):
        out = []
        # Under _order: an event taken while another thread's periodic arm
        # is between its C call and its note (a timer due at once) waits for
        # the note. Its id is in _arming for a signal handler that takes it
        # on the arming thread meanwhile (the RLock lets it in). Never held
        # across chime_wait(): only for this conversion.
        with self._order:
            arming = [a.cell.value for a in self._arming]
            for id, key, data, deadline_ns, fired_ns in taken:
                periodic = id in self._periodic or id in arming or id in self._gone
                out.append(Event(id, key, data, deadline_ns, fired_ns, periodic))
        return out

    def _buffer(self, max):
        if not isinstance(max, int) or isinstance(max, bool) or not 0 < max <= 65536:
            raise ValueError(f"max must be an int in 1..65536, not {max!r}")
        # A collection under way (a signal handler polling on its thread
        # between the outer call's C call and its conversion) gets a buffer
        # of its own: the shared one would hand the outer call its events.
        if self._collecting:
            return (ChimeEvent * max)()
        if self._buf is None or len(self._buf) < max:
            self._buf = (ChimeEvent * max)()
        return self._buf

    def poll(self, max=64):
        """Up to `max` (1..65536, else ValueError) pending events, as a list
        (empty if none); never blocks: empty too while another thread is in
        a poll() or wait() of this Chime (they take turns)."""
        buf = self._buffer(max)
        r, events = self._collect(lib.chime_poll, buf, max)
        if r < 0:
            raise _error("chime_poll", -r)
        return events

    def wait(self, timeout=None):
        """The pending events (up to 64; poll(max) takes more), waiting up to
        `timeout` seconds (None: forever) for one; an empty list on timeout.
        A signal whose handler returns does not end the wait (PEP 475); a
        close() on another thread does, within 0.25 s, with ValueError.
        Threads waiting together take turns: each event goes to one."""
        # A timeout too long for a float's seconds (584 years and more) is none.
        if timeout is None or _seconds_ns("timeout", timeout) == _U64_MAX:
            end = None
        else:
            end = time.monotonic() + timeout
        buf = self._buffer(64)
        while True:
            # In slices of _WAIT_SLICE_MS: close() on another thread cannot
            # wake a chime_wait(), so between slices _call() sees it and
            # raises ValueError, and the last slice's _leave() disconnects.
            # Another thread's slice may hold the drain for as long as one;
            # ms stays 0 if it holds it past the end.
            ms = 0

            def slice_ms():
                nonlocal ms
                ms = _WAIT_SLICE_MS if end is None else \
                    min(_WAIT_SLICE_MS, max(0, math.ceil((end - time.monotonic()) * 1000)))
                return ms
            within = -1 if end is None else min(max(0.0, end - time.monotonic()), threading.TIMEOUT_MAX)
            r, events = self._collect(lib.chime_wait, buf, 64, within, slice_ms)
            # Closed during the slice: what it took after close() returned is
            # not handed out (close() cancels every timer; its docstring's
            # ValueError), as a cancel's event is not.
            if self._c is None:
                raise ValueError("operation on a closed Chime")
            # A signal: its Python handler runs here (and may raise); then
            # wait on for what is left of the timeout, as PEP 475 asks.
            if r == -errno.EINTR:
                continue
            if r < 0:
                raise _error("chime_wait", -r)
            if r or (end is not None and ms < _WAIT_SLICE_MS):
                return events

    def fileno(self):
        """A descriptor readable whenever events are pending (for select,
        selectors, asyncio); then call poll() until it returns []. Do not
        read it."""
        r = self._call(lib.chime_fd)    # in a forked child: -ECHILD, as every call
        if r < 0:
            raise _error("chime_fd", -r)
        return r

    @property
    def closed(self):
        return self._c is None

    def close(self):
        """Disconnect: the broker cancels every timer of this connection (a
        session's stay for its next opener). Every call after it raises
        ValueError; calls under way in other threads (or in this one, for a
        signal handler's close()) finish first, and the last of them to
        return disconnects; a wait() among them ends within 0.25 s, raising
        ValueError. Never blocks on them."""
        lock = getattr(self, "_lock", None)
        if lock is None:        # __init__ failed before the lock
            return
        with lock:
            c, self._c = self._c, None      # no call starts from here on
            # a copy: a wrapper's close() on another thread takes its hook out meanwhile
            hooks = list(self._close_hooks) if c is not None else []
            if c is not None and self._calls:
                self._closing, c = c, None  # _leave() closes it
        if c is not None:
            lib.chime_close(c)
        for ref in hooks:
            hook = ref()
            if hook is not None:
                hook()

    def _after_fork(self):
        """In the child of a fork(): only this thread is left. The calls the
        parent's other threads had under way never return here, and a lock
        one of them held is never given back: this thread's own count and
        locks are kept, the rest let go of, so that the child's calls say
        ECHILD and its close() frees its copies at once (libchime(3), FORK),
        as does a close() the parent had left to those calls."""
        if not self._lock._is_owned():
            self._lock = threading.RLock()
        if not self._order._is_owned():
            self._order = threading.RLock()
        if not self._drain._is_owned():
            self._drain = threading.RLock()
        self._calls = getattr(self._mine, "calls", 0)
        if self._closing is not None and not self._calls:
            c, self._closing = self._closing, None
            lib.chime_close(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        # copy, deepcopy and pickle: a copy would share the C handle, and
        # the second close() free it again
        raise TypeError("cannot copy or pickle a Chime (one connection to chimed): open another")

    def __del__(self):
        self.close()

    def __repr__(self):
        state = "closed" if self._c is None else f"fd={self._fd}"
        return f"<chime.Chime {state}>"
