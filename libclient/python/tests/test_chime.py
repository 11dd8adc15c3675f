# SPDX-License-Identifier: MIT
"""The chime module against a real chimed: what an application relies on."""
import asyncio
import contextlib
import copy
import errno
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import chime
import chime.aio

MS = 1_000_000


def wait_for(c, n, timeout=2.0):
    """At least n events, or fail after timeout seconds."""
    events, end = [], time.monotonic() + timeout
    while len(events) < n:
        left = end - time.monotonic()
        assert left > 0, f"got {len(events)} of {n} events"
        events += c.wait(timeout=left)
    return events


def test_version_is_the_librarys():
    major, minor, patch = (int(x) for x in chime.version().split("."))
    assert (major, minor, patch) >= (0, 1, 0)


def test_now_is_clock_monotonic():
    a = time.monotonic_ns()
    b = chime.now()
    assert a <= b <= time.monotonic_ns()


def test_one_shot_after_fires_once_never_early(chime_conn):
    c = chime_conn
    armed = chime.now()
    tid = c.arm(7, after=0.02, data=42)
    assert tid != 0
    (ev,) = wait_for(c, 1)
    received = chime.now()
    assert (ev.id, ev.key, ev.data, ev.periodic) == (tid, 7, 42, False)
    assert armed + 20 * MS <= ev.deadline_ns <= armed + 25 * MS
    assert ev.deadline_ns <= ev.fired_ns <= received
    assert c.wait(timeout=0.1) == [], "a one-shot timer fired twice"


def test_absolute_deadline(chime_conn):
    at = chime.now() + 30 * MS
    tid = chime_conn.arm(1, at_ns=at)
    (ev,) = wait_for(chime_conn, 1)
    assert ev.id == tid and ev.deadline_ns == at and ev.fired_ns >= at


def test_periodic_fires_every_period_until_cancelled(chime_conn):
    c = chime_conn
    tid = c.arm(3, after=0.01, period=0.01, data=5)
    events = wait_for(c, 4)[:4]
    assert all(e.id == tid and e.periodic and e.data == 5 for e in events)
    steps = {b.deadline_ns - a.deadline_ns for a, b in zip(events, events[1:])}
    assert steps == {10 * MS}, "a periodic timer drifted"
    c.cancel(tid)
    assert c.wait(timeout=0.05) == [], "events after cancel"


def test_reset_moves_the_deadline(chime_conn):
    c = chime_conn
    tid = c.arm(1, after=0.03)
    c.reset(tid, after=0.25)
    new = chime.now()
    # Whatever comes (a stalled host can let the new firing into this
    # wait), it is the new deadline's event, never the old one's.
    early = c.wait(timeout=0.15)
    assert all(e.deadline_ns >= new + 240 * MS for e in early), "fired at the old deadline"
    (ev,) = early or wait_for(c, 1)
    assert ev.id == tid and ev.deadline_ns >= new + 240 * MS
    assert ev.fired_ns >= ev.deadline_ns, "fired before its new deadline"


def _touch_tables():
    """This process's touch-table mappings (the broker's memfd, chime-client-touch)."""
    with open("/proc/self/maps") as f:
        return sum("memfd:chime-client-touch" in line for line in f)


def test_record_resets_opens_without_a_touch_table(broker):
    before = _touch_tables()
    with chime.Chime(socket=broker.socket) as c:
        assert _touch_tables() == before + 1, "no touch table on a default connection"
    for flag in (True, 1):
        with chime.Chime(socket=broker.socket, record_resets=flag) as c:
            assert _touch_tables() == before, "record_resets=True mapped a touch table"
            tid = c.arm(1, after=0.03)
            c.reset(tid, after=0.1)
            c.reset(tid, after=0.25)        # a second reset: a record too, and kept
            new = chime.now()
            assert c.wait(timeout=0.15) == [], "fired at an old deadline"
            (ev,) = wait_for(c, 1)
            assert ev.id == tid and ev.deadline_ns >= new + 240 * MS


def test_cancel_and_cancel_key(chime_conn):
    c = chime_conn
    a = c.arm(1, after=0.02)
    c.arm(2, after=0.02)
    c.arm(2, after=0.02, period=0.01)
    keep = c.arm(3, after=0.03)
    c.cancel(a)
    c.cancel(a)     # cancelling twice is not an error
    c.cancel_key(2)
    (ev,) = wait_for(c, 1)
    assert ev.id == keep
    assert c.wait(timeout=0.1) == []


def test_submit_applies_a_batch(chime_conn):
    c = chime_conn
    a, b, p, k, *rest = c.submit([chime.Op.arm(1, after=0.5), chime.Op.arm(2, after=0.05, data=5),
                                  chime.Op.arm(3, after=0.02, period=0.01), chime.Op.arm(4, after=0.05)])
    assert rest == [] and all(isinstance(x, int) and x for x in (a, b, p, k))
    reset_at = time.monotonic_ns()
    assert c.submit([chime.Op.reset(a, after=0.03), chime.Op.cancel(k), chime.Op.cancel_key(3)]) == [None] * 3
    evs = wait_for(c, 2)
    assert sorted((ev.key, ev.periodic) for ev in evs) == [(1, False), (2, False)]
    # the reset held: a's event is due 30 ms after it, not at the 0.5 s it was armed for
    (ea,) = [ev for ev in evs if ev.key == 1]
    assert reset_at + 30_000_000 <= ea.deadline_ns < reset_at + 200_000_000
    assert [ev.data for ev in evs if ev.key == 2] == [5]
    assert c.wait(timeout=0.1) == []
    assert c.submit([]) == []
    with pytest.raises(TypeError):
        c.submit([("arm", 1)])
    with pytest.raises(ValueError):
        chime.Op.arm(1, after=1, period=0)


def test_submit_reports_each_refusal_without_raising(tmp_path):
    from conftest import Broker
    if not os.environ.get("CHIMED"):
        pytest.skip("$CHIMED not set (run through meson test)")
    b = Broker(os.environ["CHIMED"], ["--shards", "1", "--max-timers-per-client", "8"])
    try:
        with chime.Chime(socket=b.socket) as c:
            got = c.submit([chime.Op.arm(i, after=60) for i in range(40)] + [chime.Op.cancel_key(0)])
            ids = [x for x in got[:40] if isinstance(x, int)]
            refused = [x for x in got[:40] if isinstance(x, OSError)]
            assert len(ids) + len(refused) == 40 and ids and refused
            assert all(e.errno == errno.EDQUOT and "chime_arm" in str(e) for e in refused), refused
            assert got[40] is None      # the batch went on after the refusals
    finally:
        b.stop()


def test_an_op_made_by_hand_is_checked_before_anything_is_submitted(chime_conn):
    """Op is a dataclass a caller may also build by hand: a code that is no
    operation, or a field that is no uint64, is refused as Op.arm() refuses
    one (ValueError), before the batch goes out. Before, an unknown code
    raised KeyError after chime_submit() had applied the batch, so the ids
    of its arms were lost with their timers still armed; a field out of
    range was passed modulo 2**64 (the cancel of 2**64 + id cancelled id)."""
    c = chime_conn
    keep = c.arm(7, after=0.05)
    for bad in (dict(code=99), dict(code=0), dict(code=True), dict(code=chime.Op.CANCEL, id=(1 << 64) + keep),
                dict(code=chime.Op.ARM, key=-1), dict(code=chime.Op.ARM, deadline_ns=1.5),
                dict(code=chime.Op.ARM, data=1 << 64), dict(code=chime.Op.ARM, period_ns=-1),
                dict(code=1.0)):     # 1.0 in (1, ..., 5): it passed, then ctypes raised TypeError
        with pytest.raises(ValueError):
            c.submit([chime.Op.arm(8, after=0), chime.Op(**bad)])
    evs = wait_for(c, 1)
    evs += c.wait(timeout=0.1)
    assert [(e.id, e.key) for e in evs] == [(keep, 7)], "a refused batch armed, or the cancel reached the timer"


def test_poll_never_blocks(chime_conn):
    chime_conn.arm(1, after=10)
    t = time.monotonic()
    assert chime_conn.poll() == []
    assert chime_conn.poll(max=1) == []
    assert time.monotonic() - t < 0.05


def test_poll_respects_max(chime_conn):
    c = chime_conn
    for i in range(10):
        c.arm(1, after=0, data=i)
    time.sleep(0.05)
    first = c.poll(max=3)
    assert len(first) == 3
    rest = first + c.poll(max=64)
    assert sorted(e.data for e in rest) == list(range(10))


def test_wait_timeout(chime_conn):
    t = time.monotonic()
    assert chime_conn.wait(timeout=0.1) == []
    assert 0.09 <= time.monotonic() - t < 1.0


def test_an_idle_wait_does_not_spin(chime_conn):
    """wait() sleeps in slices (so that close() can end it): a slice is a
    sleep, not a busy poll, and the end of one is not the timeout's."""
    cpu, t = time.thread_time(), time.monotonic()
    assert chime_conn.wait(timeout=0.6) == []
    assert time.thread_time() - cpu < 0.05
    assert 0.59 <= time.monotonic() - t < 1.5


class _Alarm(Exception):
    pass


def _raise_alarm(signum, frame):
    raise _Alarm()


@pytest.mark.parametrize("timeout", [None, 3.0])
def test_a_signal_handler_runs_during_wait(chime_conn, timeout):
    """Ctrl-C (here SIGALRM) reaches Python while wait() sleeps, before and
    after an event has been taken."""
    old = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        for round in range(2):
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            t0 = time.monotonic()
            with pytest.raises(_Alarm):
                chime_conn.wait(timeout=timeout)
            assert time.monotonic() - t0 < 2.0
            chime_conn.arm(round, after=0)
            assert len(wait_for(chime_conn, 1)) == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_fileno_is_readable_when_events_are_pending(chime_conn):
    c = chime_conn
    assert c.poll() == []
    tid = c.arm(1, after=0.02)
    readable, _, _ = select.select([c.fileno()], [], [], 2.0)
    assert readable, "fileno() not readable while an event is pending"
    events = []
    for _ in range(100):
        events += c.poll()
        if events:
            break
        time.sleep(0.001)
    assert [e.id for e in events] == [tid]


def test_context_manager_closes(broker):
    with chime.Chime(socket=broker.socket) as c:
        c.arm(1, after=10)
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.arm(1, after=1)
    with pytest.raises(ValueError):
        c.fileno()
    c.close()       # twice is fine


def test_flush_applies_now_and_needs_an_open_connection(broker):
    with chime.Chime(socket=broker.socket) as c:
        tid = c.arm(1, after=3600)
        assert c.flush() is None
        c.reset(tid, after=0.01)
        c.flush()
        assert [e.id for e in wait_for(c, 1)] == [tid]
    with pytest.raises(ValueError, match="closed"):
        c.flush()


def test_chime_socket_environment(broker, monkeypatch):
    monkeypatch.setenv("CHIME_SOCKET", broker.socket)
    with chime.Chime() as c:
        c.arm(1, after=0)
        assert len(wait_for(c, 1)) == 1


def test_open_without_broker_names_the_socket(tmp_path):
    path = str(tmp_path / "none.sock")
    with pytest.raises(OSError) as e:
        chime.Chime(socket=path)
    assert e.value.errno == errno.ENOENT
    assert "chime_open" in str(e.value) and path in str(e.value)


def test_open_refusals_name_their_cause():
    # EACCES and EPERM need another user's broker or session: the messages alone.
    e = chime._error("chime_open", errno.EACCES, socket="/s", invalid="", or_session="")
    assert e.errno == errno.EACCES and "does not admit this user" in str(e), str(e)
    e = chime._error("chime_open", errno.EACCES, socket="/s", invalid="",
                     or_session=", or session 'jobs' is another user's or its name is reserved for one")
    assert "session 'jobs' is another user's" in str(e), str(e)
    e = chime._error("chime_open", errno.EPERM, socket="/s", invalid="", or_session="")
    assert e.errno == errno.EPERM and "/s runs as a user" in str(e) and "not trusted" in str(e), str(e)


def test_a_session_keeps_its_timers_for_the_next_opener(broker):
    with chime.Chime(socket=broker.socket, session="py-jobs") as c:
        c.arm(7, after=0.2)
        with pytest.raises(OSError) as e:
            chime.Chime(socket=broker.socket, session="py-jobs")
        # chime_open(3): held by another process, or by another chime_t of this one (here)
        assert e.value.errno == errno.EBUSY and "another Chime of this process" in str(e.value), str(e.value)
    with chime.Chime(socket=broker.socket, session=b"py-jobs") as c:    # bytes name the same session
        assert [ev.key for ev in wait_for(c, 1)] == [7]
    with pytest.raises(TypeError):
        chime.Chime(socket=broker.socket, session=7)
    for bad in ("", "a/b", "x" * 64, b"a/b"):
        with pytest.raises(OSError) as e:
            chime.Chime(socket=broker.socket, session=bad)
        assert e.value.errno == errno.EINVAL
        assert "is not a session name" in str(e.value), str(e.value)
    with pytest.raises(OSError) as e:
        chime.Chime(socket="/" + "x" * 120)
    assert e.value.errno == errno.EINVAL and "is not a socket path" in str(e.value), str(e.value)


def test_a_closed_session_is_dropped_with_its_timers(broker):
    c = chime.Chime(socket=broker.socket, session="py-done")
    c.arm(1, after=0)                   # fires and is held for the next opener
    with pytest.raises(OSError) as e:
        chime.drop_session("py-done", socket=broker.socket)
    assert e.value.errno == errno.EBUSY and "close it first" in str(e.value), str(e.value)
    c.close()
    chime.drop_session("py-done", socket=broker.socket)
    with pytest.raises(OSError) as e:
        chime.drop_session(b"py-done", socket=broker.socket)
    assert e.value.errno == errno.ESRCH and "no session is named" in str(e.value), str(e.value)
    with chime.Chime(socket=broker.socket, session="py-done") as c:     # a new, empty session
        assert c.wait(timeout=0.05) == []
    chime.drop_session("py-done", socket=broker.socket)
    with pytest.raises(OSError) as e:
        chime.drop_session("a/b", socket=broker.socket)
    assert e.value.errno == errno.EINVAL and "is not a session name" in str(e.value), str(e.value)
    with pytest.raises(TypeError):
        chime.drop_session(None, socket=broker.socket)
    with pytest.raises(OSError) as e:
        chime.drop_session("x", socket="/nonexistent/chime.sock")
    assert e.value.errno == errno.ENOENT and "is chimed running" in str(e.value), str(e.value)


def test_bad_arguments(chime_conn):
    c = chime_conn
    with pytest.raises(TypeError):
        c.arm(1)
    with pytest.raises(TypeError):
        c.arm(1, at_ns=1, after=1)
    for bad in (dict(after=-1), dict(after=float("nan")), dict(at_ns=-1), dict(after=1, period=0)):
        with pytest.raises(ValueError):
            c.arm(1, **bad)
    with pytest.raises(ValueError):
        c.arm(-1, after=1)
    with pytest.raises(ValueError):
        c.poll(max=0)
    with pytest.raises(ValueError):
        c.poll(max=True)        # a bool is an int to Python, not a count
    with pytest.raises(OSError) as e:
        c.reset(0, after=1)
    assert e.value.errno == errno.EINVAL and "chime_reset" in str(e.value)
    with pytest.raises(OSError) as e:
        c.cancel(0)
    assert e.value.errno == errno.EINVAL


def test_a_chime_cannot_be_copied_or_pickled(chime_conn):
    """A copy would share the C handle: closing both freed it twice (copy.copy
    did, and the second close() crashed the interpreter, SIGSEGV)."""
    for how in (copy.copy, copy.deepcopy, pickle.dumps):
        try:
            d = how(chime_conn)
        except TypeError as e:
            assert "cannot copy or pickle a Chime" in str(e), str(e)
            continue
        except Exception as e:      # noqa: BLE001 - ctypes' refusal, by chance
            pytest.fail(f"{how.__name__} of a Chime: {type(e).__name__}: {e}, not TypeError")
        if isinstance(d, chime.Chime):
            d._c = None             # no second close of the shared handle
        pytest.fail(f"{how.__name__} of a Chime did not raise TypeError")
    assert not chime_conn.closed


def test_periods_and_delays_beyond_uint64_ns_saturate(chime_conn):
    """A period of 2**64 ns or more (584 years) is "never again", not the
    remainder modulo 2**64; an `after` that large is "never", not an
    OverflowError."""
    c = chime_conn
    p = 18446744074.0               # 2**64 ns + 0.29 s: modulo 2**64, a 0.29 s period
    tid = c.arm(1, after=0.001, period=p)
    assert [ev.id for ev in wait_for(c, 1)] == [tid]
    assert c.wait(timeout=0.4) == [], "a 584-year period fired again within 0.4 s"
    c.cancel(tid)
    for huge in (1e300, 10 ** 30, 10 ** 400):   # 10**400: beyond a float (it raised OverflowError)
        tid = c.arm(2, after=huge, period=huge)
        c.reset(tid, after=huge)
        c.cancel(tid)
        assert c.submit([chime.Op.arm(3, after=huge, period=huge)])[0] != 0
    assert c.wait(timeout=0.05) == []
    c.cancel_key(3)


def test_a_wait_beyond_a_float_is_a_wait_without_timeout(chime_conn):
    c = chime_conn
    tid = c.arm(1, after=0.02)
    assert [ev.id for ev in c.wait(timeout=10 ** 400)] == [tid]


def test_a_nul_in_a_socket_path_or_session_name_is_refused(broker):
    """A C string ends at the NUL: 'billing\\0x' opened session 'billing'."""
    for kw in ({"socket": broker.socket + "\0/ignored"}, {"socket": broker.socket, "session": "billing\0x"},
               {"socket": broker.socket, "session": b"billing\0x"}):
        with pytest.raises(ValueError, match="embedded null byte"):
            chime.Chime(**kw)
    with pytest.raises(ValueError, match="embedded null byte"):
        chime.drop_session("billing\0x", socket=broker.socket)


def test_close_never_frees_the_handle_under_calls_in_other_threads(broker):
    """close() while other threads arm and cancel: each call either runs on
    the open handle or raises ValueError, never a crash (it was a segfault:
    the handle freed under a thread inside chime_arm())."""
    import threading
    for _ in range(3):
        c = chime.Chime(socket=broker.socket)
        errors, started = [], threading.Barrier(3)

        def churn():
            started.wait()
            try:
                while True:
                    c.cancel(c.arm(5, after=1000))
            except ValueError as e:
                if "closed" not in str(e):
                    errors.append(e)
            except Exception as e:      # noqa: BLE001 - anything else is the failure
                errors.append(e)

        threads = [threading.Thread(target=churn) for _ in range(2)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.05)
        c.close()
        for t in threads:
            t.join(5)
            assert not t.is_alive()
        assert errors == []
        assert c.closed


def test_close_from_a_signal_handler_during_a_wait(broker):
    """A handler runs on the thread that is inside wait(): its close() must
    neither wait for that call (it hung, the call never to return) nor free
    the handle under it; the wait then says the Chime is closed."""
    c = chime.Chime(socket=broker.socket)
    old = signal.signal(signal.SIGALRM, lambda *_: c.close())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        t = time.monotonic()
        with pytest.raises(ValueError, match="closed"):
            c.wait(timeout=5)
        assert time.monotonic() - t < 2
        assert c.closed
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_close_ends_a_wait_in_another_thread(broker, timeout):
    """close() on one thread ends another's wait() within a slice, with the
    ValueError of any call on a closed Chime (it waited in chime_wait()
    until an event came, or its timeout: with none, for ever)."""
    import threading
    c, got = chime.Chime(socket=broker.socket), []

    def waiter():
        try:
            got.append(c.wait(timeout))
        except Exception as e:          # noqa: BLE001 - the exception is the result
            got.append(e)

    t = threading.Thread(target=waiter, daemon=True)   # daemon: it never returned
    t.start()
    time.sleep(0.2)                     # inside the C wait by now
    t0 = time.monotonic()
    c.close()
    t.join(2.0)
    assert not t.is_alive(), "wait() still blocked 2 s after close()"
    assert time.monotonic() - t0 < 1.0     # a wait slice: 0.25 s
    assert len(got) == 1 and isinstance(got[0], ValueError) and "closed" in str(got[0]), got


def test_a_signal_handler_may_arm_while_the_thread_is_in_a_call(chime_conn):
    """The handle's lock is re-entrant: a handler that arms while its thread
    is inside cancel_key() or submit() does not deadlock."""
    c, armed = chime_conn, []
    old = signal.signal(signal.SIGALRM, lambda *_: armed.append(c.arm(9, after=60, period=1)))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            c.cancel_key(9)
            c.submit([chime.Op.cancel_key(9), chime.Op.arm(9, after=60, period=1)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert armed, "the handler never ran"
    c.cancel_key(9)


def test_cancel_key_while_another_thread_arms_periodics(chime_conn):
    """The periodic-id table is shared by the threads (it raised
    'dictionary changed size during iteration' after a cancel had taken effect)."""
    import threading
    c, stop, errors = chime_conn, threading.Event(), []

    def arm():
        try:
            while not stop.is_set():
                c.cancel(c.arm(8, after=1000, period=1))
        except Exception as e:          # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=arm)
    t.start()
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            c.cancel_key(7)
            c.submit([chime.Op.cancel_key(7)])
    finally:
        stop.set()
        t.join(5)
    assert errors == []


@pytest.mark.parametrize("arm", ["arm", "submit"])
@pytest.mark.parametrize("cancel", ["cancel_key", "submit_cancel_key", "cancel"])
def test_a_cancel_between_a_periodic_arm_and_its_note_is_not_missed(chime_conn, monkeypatch, arm, cancel):
    """Another thread's cancel_key(key), or cancel(id) (the id learnt from an
    event, say), made just after the C call armed a periodic timer and before
    the binding noted its id: the note must not outlive the timer (it stayed
    in the periodic table for ever). The C call is wrapped to run the other
    thread exactly there."""
    import threading
    c, key, others = chime_conn, 5, []
    func = "chime_arm" if arm == "arm" else "chime_submit"
    real = getattr(chime.lib, func)

    def other(tid):
        {"cancel_key": lambda: c.cancel_key(key), "cancel": lambda: c.cancel(tid),
         "submit_cancel_key": lambda: c.submit([chime.Op.cancel_key(key)])}[cancel]()

    def armed_then_other(handle, *args):
        monkeypatch.undo()  # once: the other thread's submit() is not to be wrapped
        r = real(handle, *args)
        tid = args[-1]._obj.value if arm == "arm" else args[0][0].id
        t = threading.Thread(target=other, args=(tid,))
        t.start()
        t.join(0.2)         # done at once, unless it waits for this arm to be noted
        others.append(t)
        return r

    monkeypatch.setattr(chime.lib, func, armed_then_other)
    if arm == "arm":
        tid = c.arm(key, after=60, period=1)
    else:
        (tid,) = c.submit([chime.Op.arm(key, after=60, period=1)])
    (t,) = others
    t.join(5)
    assert not t.is_alive()
    # white-box: the table is what Event.periodic reads, and a leak otherwise invisible
    assert tid not in c._periodic, f"{cancel} did not forget the periodic timer {tid}"


@pytest.mark.parametrize("arm", ["arm", "submit"])
@pytest.mark.parametrize("who", ["thread", "handler"])
def test_an_event_taken_between_a_periodic_arm_and_its_note_is_periodic(chime_conn, monkeypatch, arm, who):
    """A periodic timer due at once, its event taken by another thread's
    poll(), or by a signal handler's on this thread, after the C call armed
    it and before the binding noted its id: the event must say
    periodic=True (it said False). The C arm is wrapped to take it exactly
    there: once its event is pending, another thread polls (it may wait for
    the note, not for the arm to return), or a SIGUSR1 sent to this thread
    runs a handler that polls. For the thread, the id is not in the C
    call's output yet, as in chime_arm() between its publish and its store
    of *id (after it waits out a stopping broker)."""
    import threading
    c, got, polled = chime_conn, [], threading.Event()
    func = "chime_arm" if arm == "arm" else "chime_submit"
    real, real_poll = getattr(chime.lib, func), chime.lib.chime_poll

    def take():
        end = time.monotonic() + 5
        while not got and time.monotonic() < end:
            got.extend(c.poll())

    def poll(handle, *args):
        r = real_poll(handle, *args)
        if r > 0:
            polled.set()
        return r

    def armed_then_taken(handle, *args):
        monkeypatch.setattr(chime.lib, func, real)     # once
        r = real(handle, *args)
        assert select.select([c.fileno()], [], [], 5)[0], "the due timer's event never came"
        if who == "handler":
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)    # its handler runs here
            assert got, "the handler took no event"
        else:
            cell, field = (args[-1]._obj, "value") if arm == "arm" else (args[0][0], "id")
            tid = getattr(cell, field)
            setattr(cell, field, 0)
            t = threading.Thread(target=take)
            t.start()
            assert polled.wait(5), "the other thread's poll took no event"
            t.join(0.2)     # its events converted at once, unless it waits for this arm's note
            threads.append(t)
            setattr(cell, field, tid)
        return r

    threads = []
    old = signal.signal(signal.SIGUSR1, lambda *_: take())
    monkeypatch.setattr(chime.lib, "chime_poll", poll)
    monkeypatch.setattr(chime.lib, func, armed_then_taken)
    try:
        if arm == "arm":
            tid = c.arm(6, after=0, period=60)
        else:
            (tid,) = c.submit([chime.Op.arm(6, after=0, period=60)])
    finally:
        signal.signal(signal.SIGUSR1, old)
    for t in threads:
        t.join(5)
        assert not t.is_alive()
    assert [(ev.id, ev.periodic) for ev in got] == [(tid, True)]
    c.cancel(tid)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("via", ["cancel_key", "submit"])
def test_a_handler_arming_inside_cancel_key_is_noted_as_the_c_call_left_it(chime_conn, monkeypatch, via,
                                                                          when):
    """A signal handler arms a periodic timer of the key on the thread
    inside cancel_key(key) (the RLock lets it in). Before the C cancel_key,
    that cancels it: it must not be noted. After it, the timer is live: it
    must stay noted (cancel_key then forgot it, and its events said
    periodic=False). The C call (chime_cancel_key or chime_submit, whichever
    cancel_key() makes) is wrapped to send SIGUSR1 to this thread just
    before or just after it."""
    import threading
    c, key, armed, sent = chime_conn, 4, [], []
    old_tid = c.arm(key, after=60, period=60)
    reals = {f: getattr(chime.lib, f) for f in ("chime_cancel_key", "chime_submit")}

    def wrap(func):
        def cancel_key(handle, *args):
            if sent:        # the handler's own calls
                return reals[func](handle, *args)
            sent.append(func)
            if when == "before":
                signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)    # its handler runs here
            r = reals[func](handle, *args)
            if when == "after":
                signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            return r
        return cancel_key

    for f in reals:
        monkeypatch.setattr(chime.lib, f, wrap(f))
    old = signal.signal(signal.SIGUSR1, lambda *_: armed.append(c.arm(key, after=0, period=60)))
    try:
        if via == "cancel_key":
            c.cancel_key(key)
        else:
            assert c.submit([chime.Op.cancel_key(key)]) == [None]
    finally:
        signal.signal(signal.SIGUSR1, old)
    (tid,) = armed
    assert old_tid not in c._periodic, "the timer armed before the cancel_key is still noted"
    if when == "before":
        assert tid not in c._periodic, "the timer the cancel_key cancelled is still noted"
        assert c.wait(timeout=0.05) == []
    else:
        assert c._periodic.get(tid) == key, "the live timer armed after the C cancel_key was forgotten"
        assert [(ev.id, ev.periodic) for ev in wait_for(c, 1)] == [(tid, True)]
        c.cancel(tid)


@pytest.mark.parametrize("arm", ["arm", "submit"])
@pytest.mark.parametrize("cancel", ["cancel_key", "submit_cancel_key", "cancel"])
def test_a_handler_cancelling_inside_a_periodic_arm_leaves_no_note(chime_conn, monkeypatch, arm, cancel):
    """A signal handler on the thread inside a periodic arm, after its C
    call and before its note, cancels the timer: cancel_key(key), or
    cancel(id) (the id from an event, say). The arm must not note it then
    (the note outlived the timer for ever). The C arm is wrapped to send
    SIGUSR1 to this thread just after it."""
    import threading
    c, key, ids = chime_conn, 3, []
    func = "chime_arm" if arm == "arm" else "chime_submit"
    real = getattr(chime.lib, func)

    def armed_then_signalled(handle, *args):
        monkeypatch.setattr(chime.lib, func, real)     # once
        r = real(handle, *args)
        ids.append(args[-1]._obj.value if arm == "arm" else args[0][0].id)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)    # its handler runs here
        return r

    def handler(*_):
        {"cancel_key": lambda: c.cancel_key(key), "cancel": lambda: c.cancel(ids[0]),
         "submit_cancel_key": lambda: c.submit([chime.Op.cancel_key(key)])}[cancel]()
        ids.append("handled")

    monkeypatch.setattr(chime.lib, func, armed_then_signalled)
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        if arm == "arm":
            tid = c.arm(key, after=0, period=60)
        else:
            (tid,) = c.submit([chime.Op.arm(key, after=0, period=60)])
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert ids == [tid, "handled"]
    assert tid not in c._periodic, f"the timer the handler's {cancel} cancelled is noted"
    assert c.wait(timeout=0.05) == []


@pytest.mark.parametrize("cancel", ["cancel", "cancel_key", "submit_cancel_key"])
def test_an_event_taken_before_its_periodic_timer_is_cancelled_is_periodic(chime_conn, monkeypatch, cancel):
    """Another thread cancels a periodic timer after poll()'s C call took
    its event and before the event is made an Event: it must still say
    periodic=True (the cancel had forgotten the note: False). chime_poll is
    wrapped to run the other thread's cancel exactly there."""
    import threading
    c, key = chime_conn, 2
    real = chime.lib.chime_poll
    tid = c.arm(key, after=0, period=60)
    assert select.select([c.fileno()], [], [], 5)[0], "the due timer's event never came"

    def polled_then_cancelled(handle, buf, max):
        monkeypatch.setattr(chime.lib, "chime_poll", real)     # once
        r = real(handle, buf, max)
        assert r == 1 and buf[0].id == tid
        other = {"cancel": lambda: c.cancel(tid), "cancel_key": lambda: c.cancel_key(key),
                 "submit_cancel_key": lambda: c.submit([chime.Op.cancel_key(key)])}[cancel]
        t = threading.Thread(target=other)
        t.start()
        t.join(5)
        assert not t.is_alive()
        return r

    monkeypatch.setattr(chime.lib, "chime_poll", polled_then_cancelled)
    assert [(ev.id, ev.periodic) for ev in c.poll()] == [(tid, True)]
    assert tid not in c._periodic and not c._gone, "the cancelled timer's note was kept"
    assert c.wait(timeout=0.05) == []


def test_a_poll_inside_a_poll_keeps_each_its_own_events(chime_conn, monkeypatch):
    """A signal handler that polls on the thread of a poll() whose C call
    has returned (its events in the buffer, not yet converted) takes other
    events: each call must return its own. Before, both used one buffer,
    and the outer call returned the handler's events. chime_poll is wrapped
    to run the handler's poll exactly there."""
    c = chime_conn
    real = chime.lib.chime_poll
    ids = [c.arm(k, after=0) for k in (1, 2)]
    assert select.select([c.fileno()], [], [], 5)[0], "the due timers' events never came"
    inner = []

    def polled_then_handler(handle, buf, max):
        monkeypatch.setattr(chime.lib, "chime_poll", real)     # once
        r = real(handle, buf, 1)
        assert r == 1
        for _ in range(500):         # the handler's poll, until the second event is there
            inner.extend(c.poll(1))
            if inner:
                break
            time.sleep(0.01)
        return r

    monkeypatch.setattr(chime.lib, "chime_poll", polled_then_handler)
    outer = c.poll(1)
    got = [e.id for e in outer + inner]
    assert len(outer) == 1 and len(inner) == 1, (outer, inner)
    assert sorted(got) == sorted(ids), f"an event returned twice or lost: {got} for {ids}"


def test_fileno_in_a_forked_child_is_echild(chime_conn):
    c = chime_conn
    c.fileno()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            c.fileno()
        except OSError as e:
            code = 0 if e.errno == errno.ECHILD else 2
        except BaseException:           # noqa: BLE001
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _fork_with_a_thread_in(c, hold, child):
    """Fork while another thread is inside hold() (a call on c, or a lock of
    c's held as a call holds it); child() runs in the child under a 5 s
    alarm and returns its exit code. Returns the child's exit code."""
    entered, done = threading.Event(), threading.Event()

    def inside():
        with hold():
            entered.set()
            done.wait(5)
    t = threading.Thread(target=inside)
    t.start()
    assert entered.wait(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)    # fork with threads: what this tests
        pid = os.fork()
    if pid == 0:
        signal.alarm(5)     # a hang ends with SIGALRM: -14
        code = 3
        try:
            code = child()
        finally:
            os._exit(code)
    done.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_closes_its_copy_whatever_its_parents_threads_were_doing(chime_conn):
    """The parent's other threads do not exist in the child: their calls
    under way never return there, and the locks they held are never let go.
    A close() in the child frees its copies (libchime(3), FORK) at once, and
    its calls say ECHILD. Before, a close() with a parent's thread in a
    wait() at the fork left them for the child's whole life (its descriptors
    and its maps of the parent's segments), and a call that takes the lock a
    parent's thread held in a submit() or a periodic arm hung."""
    c = chime_conn

    @contextlib.contextmanager
    def in_a_call():
        # a call under way as wait() has one: counted in, the C call left alone
        c._enter()
        try:
            yield
        finally:
            c._leave()

    def close_frees():
        n = len(os.listdir("/proc/self/fd"))
        c.close()
        return 0 if len(os.listdir("/proc/self/fd")) < n else 1

    def echild_not_hang():
        try:
            c.cancel_key(1)
        except OSError as e:
            return 0 if e.errno == errno.ECHILD else 2
        return 1

    assert _fork_with_a_thread_in(c, in_a_call, close_frees) == 0, "the child's close() freed nothing"
    assert _fork_with_a_thread_in(c, lambda: c._order, echild_not_hang) == 0, "cancel_key() in the child"
    assert _fork_with_a_thread_in(c, lambda: c._lock, close_frees) == 0, "close() in the child"
    assert c.wait(timeout=0.05) == []       # the parent's connection is its own still


def test_broker_death_is_enotconn(broker):
    c = chime.Chime(socket=broker.socket)
    c.arm(1, after=60)
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait()
    t = time.monotonic()
    with pytest.raises(OSError) as e:
        while time.monotonic() - t < 3:
            c.wait(timeout=0.5)
    assert e.value.errno == errno.ENOTCONN and "gone" in str(e.value)
    assert time.monotonic() - t < 2.5
    with pytest.raises(OSError):
        c.arm(1, after=1)
    c.close()


def test_threads_arm_while_one_waits(chime_conn):
    import threading
    c = chime_conn
    ids = []

    def arm():
        for i in range(200):
            ids.append(c.arm(1, after=0.01, data=i))

    threads = [threading.Thread(target=arm) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = wait_for(c, 800, timeout=5)
    assert sorted(e.id for e in events) == sorted(ids)


def test_threads_waiting_on_one_chime_take_turns(chime_conn):
    """Two threads in wait() on one Chime: each event reaches one of them,
    once, and neither hangs (their C drains overlapped, which chime_poll(3)
    leaves undefined: events were lost, and a chime_wait() of 50 ms never
    returned)."""
    c = chime_conn
    for _ in range(5):
        got, stop = [], threading.Event()

        def drain():
            while not stop.is_set():
                got.extend(e.id for e in c.wait(timeout=0.01))

        threads = [threading.Thread(target=drain, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        now = chime.now()
        ids = [c.arm(1, at_ns=now + (i % 300) * MS) for i in range(3000)]
        end = time.monotonic() + 5
        while len(got) < len(ids) and time.monotonic() < end:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=2)
        assert not any(t.is_alive() for t in threads), "a wait() of 10 ms never returned"
        assert sorted(got) == sorted(ids), f"{len(got)} events for {len(ids)} timers"


def test_asyncio_wait_and_iteration(broker):
    async def main():
        async with chime.aio.AsyncChime(socket=broker.socket) as c:
            a = c.arm(1, after=0.02, data=1)
            (ev,) = await asyncio.wait_for(c.wait(), 2)
            assert ev.id == a
            b = c.arm(1, after=0.01, period=0.01)
            got = []
            async for ev in c:
                got.append(ev)
                if len(got) == 3:
                    break
            assert all(e.id == b and e.periodic for e in got)
            c.cancel(b)
        assert c.chime.closed

    asyncio.run(main())


def test_asyncio_iteration_takes_only_the_events_it_hands_out(broker):
    """`async for` that stops after one event leaves the others pending: a
    wait() then returns them, and a session's next opener gets them (they
    were taken 64 at a time and held inside the AsyncChime: wait() never
    returned them, and close() lost them for good)."""
    async def take_one(**kw):
        async with chime.aio.AsyncChime(socket=broker.socket, **kw) as c:
            ids = {c.arm(1, after=0, data=i) for i in range(3)}
            c.flush()
            await asyncio.sleep(0.2)        # all three fired: one poll could take them all
            rest = []
            async with asyncio.timeout(3):
                async for ev in c:
                    break
                while not kw and len(rest) < 2:
                    rest += await c.wait()
            return ids, ev, rest

    ids, ev, rest = asyncio.run(take_one())
    assert {ev.id} | {e.id for e in rest} == ids and len(rest) == 2, (ev, rest)
    ids, ev, _ = asyncio.run(take_one(session="py-aio-iter"))
    with chime.Chime(socket=broker.socket, session="py-aio-iter") as c:
        assert {e.id for e in wait_for(c, 2)} == ids - {ev.id}
    chime.drop_session("py-aio-iter", socket=broker.socket)


def test_asyncio_tasks_awaiting_one_chime_take_turns_and_close_ends_them(broker):
    """Two tasks awaiting one AsyncChime: every event reaches one of them
    (the second task's reader replaced the first's, and one waited for
    ever); close() ends a task's wait with ValueError."""
    async def main():
        c = chime.aio.AsyncChime(socket=broker.socket)
        ids = {c.arm(1, after=t) for t in (0.1, 0.4, 0.7)}
        # three tasks, one wait() each, the timers 300 ms apart: one event each
        lists = await asyncio.wait_for(asyncio.gather(c.wait(), c.wait(), c.wait()), 5)
        assert sorted(len(events) for events in lists) == [1, 1, 1], lists
        assert {events[0].id for events in lists} == ids
        c.arm(1, after=60)
        waiter = asyncio.ensure_future(c.wait())
        await asyncio.sleep(0.05)
        c.close()
        # A new one at once, likely on the same fd number, awaited in this task before the
        # closed one's waiter resumes: the loop must watch the new one's, and the old
        # waiter's cleanup must not remove it (it did: the new wait never woke).
        d = chime.aio.AsyncChime(socket=broker.socket)
        tid = d.arm(1, after=0.2)
        async with asyncio.timeout(3):
            got = await d.wait()
        assert [ev.id for ev in got] == [tid]
        with pytest.raises(ValueError, match="closed"):
            await asyncio.wait_for(waiter, 2)
        assert c.chime.closed
        d.close()

    asyncio.run(main())


def test_a_wait_closed_under_it_hands_out_nothing_fired_after(broker):
    """close() on one thread while another waits: the wait ends with
    ValueError, never with an event its slice took after close() returned
    (a periodic timer's, fired meanwhile: close() cancels every timer).
    Found by an audit: one event came back 100 ms after close()."""
    import threading
    c, got = chime.Chime(socket=broker.socket), []
    c.arm(1, after=0.15, period=0.02)

    def waiter():
        try:
            while True:
                got.append(c.wait(5))
        except Exception as e:          # noqa: BLE001 - the exception is the result
            got.append(e)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.05)
    c.close()
    t.join(2.0)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], ValueError), got


def test_submit_of_nothing_on_a_closed_chime_raises(broker):
    c = chime.Chime(socket=broker.socket)
    assert c.submit([]) == []
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.submit([])


def test_a_period_that_rounds_to_zero_says_so(chime_conn):
    with pytest.raises(ValueError, match="at least 1 ns"):
        chime_conn.arm(1, after=1, period=1e-12)


def test_asyncio_chime_wrapping_one_takes_no_open_arguments(broker):
    with chime.Chime(socket=broker.socket) as c:
        with pytest.raises(TypeError, match="socket"):
            chime.aio.AsyncChime(c, socket="/elsewhere")


def test_asyncio_close_from_another_thread_ends_the_wait(broker):
    """AsyncChime.close() on a thread other than its loop's: the awaiting
    task ends with ValueError at once. Before, close() touched the future
    and the reader from that thread, which asyncio does not allow: the
    loop slept on in epoll, for ever (or until a wait_for's timeout)."""
    a = chime.aio.AsyncChime(socket=broker.socket)
    got, started = [], threading.Event()

    async def main():
        started.set()
        try:
            await asyncio.wait_for(a.wait(), 10)
        except BaseException as e:     # noqa: BLE001 - the exception is the result
            got.append(e)

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    started.wait(2)
    time.sleep(0.2)
    t0 = time.monotonic()
    a.close()
    t.join(5)
    assert not t.is_alive(), "the task still awaited 5 s after close()"
    assert time.monotonic() - t0 < 1.0
    assert len(got) == 1 and isinstance(got[0], ValueError), got
    assert a.chime.closed


@pytest.mark.parametrize("where", ["poll", "fileno"])
def test_asyncio_a_close_on_another_thread_before_the_task_sleeps_ends_the_wait(broker, monkeypatch, where):
    """A close on another thread while the task is on its way to sleep: in
    its poll (a C call: the GIL is free), an AsyncChime.close() of one
    wrapping a given Chime told no one (no reader yet), and the task then
    slept for good; between fileno() and add_reader(), the Chime's close()
    closed the descriptor, and the task got OSError EBADF (or watched
    whatever reused the number). Both end the wait with ValueError now."""
    c = chime.Chime(socket=broker.socket)
    a = chime.aio.AsyncChime(c)
    real, closed = getattr(c, where), []

    def closing(*args):
        r = real(*args)
        if not closed:          # the close lands in the window, once, from another thread
            closed.append(True)
            t = threading.Thread(target=a.close if where == "poll" else c.close)
            t.start()
            t.join()
        return r

    monkeypatch.setattr(c, where, closing)

    async def main():
        with pytest.raises(ValueError, match="closed"):
            await asyncio.wait_for(a.wait(), 3)

    asyncio.run(main())
    c.close()


def test_asyncio_chime_works_in_one_loop_after_another(broker):
    """An AsyncChime used by tasks of one asyncio.run(), then another's: its
    lock was bound to the first loop ("bound to a different event loop"),
    and held for good by a task that loop closed in its wait."""
    a = chime.aio.AsyncChime(socket=broker.socket)

    async def two_waiters():
        a.arm(1, after=0.02)
        a.arm(2, after=0.04)
        got = await asyncio.gather(a.wait(1), a.wait(1))
        return sorted(e.key for evs in got for e in evs)

    assert asyncio.run(two_waiters()) == [1, 2]
    loop = asyncio.new_event_loop()
    loop.create_task(a.wait())          # left awaiting when its loop closes
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    assert asyncio.run(two_waiters()) == [1, 2]
    a.close()
    assert a.chime.closed


def test_asyncio_close_after_its_loop_closed_closes_the_chime(broker):
    """close() once the loop a task awaited in is closed: it raised
    RuntimeError ("Event loop is closed") and left the Chime open."""
    a = chime.aio.AsyncChime(socket=broker.socket)
    loop = asyncio.new_event_loop()
    loop.create_task(a.wait())
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    a.close()
    assert a.chime.closed


def test_asyncio_wait_backs_off_while_the_broker_is_stopped(broker):
    """A fired timer reset while the broker is stopped (SIGSTOP): the
    descriptor stays readable and poll() finds nothing until the broker
    settles the reset. The task's wait re-armed its reader at once, a core
    spinning (1.0 s of CPU a second); it backs off now, as chime_wait()
    does."""
    a = chime.aio.AsyncChime(socket=broker.socket)
    tid = a.arm(1, after=0.01)

    async def main():
        await asyncio.sleep(0.1)        # fired, in the completion ring
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            a.reset(tid, after=30)
            t0 = time.process_time()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(a.wait(), 1.0)
            return time.process_time() - t0
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)

    cpu = asyncio.run(main())
    a.close()
    assert cpu < 0.3, f"{cpu:.2f} s of CPU in a 1 s wait"


def test_asyncio_a_wait_ends_when_the_chime_it_wraps_is_closed(broker):
    """An AsyncChime wrapping a Chime its caller closes (a `with` block left
    while a task awaits): the task's wait ends with ValueError, as a
    thread's wait() does (it awaited for ever, the loop watching a closed
    descriptor)."""
    async def main():
        with chime.Chime(socket=broker.socket) as c:
            a = chime.aio.AsyncChime(c)
            c.arm(1, after=60)
            waiter = asyncio.ensure_future(a.wait())
            await asyncio.sleep(0.05)
        with pytest.raises(ValueError, match="closed"):
            await asyncio.wait_for(waiter, 3)
        with pytest.raises(ValueError, match="closed"):
            await a.wait()

    asyncio.run(main())


def test_asyncio_example(broker):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "asyncio_timeouts.py")
    env = dict(os.environ, CHIME_SOCKET=broker.socket)
    r = subprocess.run([sys.executable, example, "100"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "timeouts of 100 requests" in r.stdout


def test_a_forked_child_is_told_to_open_its_own(chime_conn):
    c = chime_conn
    tid = c.arm(1, after=0.05)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            c.arm(1, after=1)
        except OSError as e:
            code = 0 if e.errno == errno.ECHILD and "fork" in str(e) else 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    events = wait_for(c, 1)
    assert [e.id for e in events] == [tid]


def test_a_wall_clock_timer_fires_at_its_wall_deadline(chime_conn):
    c = chime_conn
    at = time.time_ns() + 50_000_000
    tid = c.arm_realtime(1, at_ns=at, data=9)
    (b,) = c.submit([chime.Op.arm_realtime(2, at_ns=at + 20_000_000)])
    c.reset(b, at_ns=at + 30_000_000)       # a wall-clock deadline: the timer's clock
    evs = wait_for(c, 2)
    assert time.time_ns() >= at + 30_000_000
    assert [(e.id, e.deadline_ns, e.data) for e in evs] == [(tid, at, 9), (b, at + 30_000_000, 0)]


def test_asyncio_a_closed_loops_task_finalised_later_leaves_the_next_loops_wait_alone(broker):
    """A task left awaiting when its loop closed is finalised by the garbage
    collector whenever it runs: its `finally` cleared the future and removed
    the reader of the task now awaiting in the next loop, which slept on for
    good with its event pending (close() could not end it either)."""
    import gc
    a = chime.aio.AsyncChime(socket=broker.socket)
    loop = asyncio.new_event_loop()
    loop.create_task(a.wait())          # left awaiting when its loop closes
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    del loop

    async def main():
        a.arm(1, after=0.2, data=5)
        task = asyncio.create_task(a.wait())
        await asyncio.sleep(0.05)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc.collect()                # the first loop's task and its coroutine go
        return [e.data for e in await asyncio.wait_for(task, 3)]

    try:
        assert asyncio.run(main()) == [5]
    finally:
        a.close()


def test_asyncio_two_wrappers_of_one_chime_in_one_loop_both_get_their_events(broker):
    """Two AsyncChime wrapping one Chime, awaited in one loop: the second's
    add_reader() replaced the first's reader on the same descriptor, and the
    first's task slept on with its event pending."""
    with chime.Chime(socket=broker.socket) as c:
        a1, a2 = chime.aio.AsyncChime(c), chime.aio.AsyncChime(c)

        async def main():
            t1 = asyncio.create_task(a1.wait(1))
            await asyncio.sleep(0.01)
            t2 = asyncio.create_task(a2.wait(1))
            await asyncio.sleep(0.01)
            c.arm(1, after=0.05, data=1)
            c.arm(1, after=0.10, data=2)
            done, pending = await asyncio.wait({t1, t2}, timeout=3)
            for t in pending:
                t.cancel()
            assert not pending, f"a task slept on; still pending in C: {[e.data for e in c.poll()]}"
            return sorted(e.data for t in done for e in t.result())

        assert asyncio.run(main()) == [1, 2]


def test_asyncio_a_wrapper_closed_while_the_chime_tells_its_wrappers_skips_none(broker):
    """Another wrapper's AsyncChime.close() (on another thread) while the
    Chime's close() called its wrappers' hooks: it took its hook out of the
    very list being walked, the walk skipped the next one, and that
    wrapper's task slept on a closed descriptor for good."""
    c = chime.Chime(socket=broker.socket)
    a2, a3 = chime.aio.AsyncChime(c), chime.aio.AsyncChime(c)
    # a2.close() just as the walk has passed a2's hook: a hook of its own, after a2's
    c._close_hooks.insert(c._close_hooks.index(a2._hook) + 1, lambda: a2.close)

    async def main():
        waiter = asyncio.create_task(a3.wait())
        await asyncio.sleep(0.05)
        c.close()
        with pytest.raises(ValueError, match="closed"):
            await asyncio.wait_for(waiter, 3)

    asyncio.run(main())


def test_asyncio_a_second_loop_starting_while_the_first_polls_is_refused(broker):
    """Two loops' tasks entering wait() together: the second checked for
    another loop while the first was still in its poll (before it noted its
    reader), both went on, and the first to finish removed the other's
    reader: that task slept on with its event pending."""
    a = chime.aio.AsyncChime(socket=broker.socket)
    poll, in_poll, second_done = a.chime.poll, threading.Event(), threading.Event()
    first = []

    def slow_poll(max=64):
        if not first:                   # the first loop's first poll: held until the second loop tried
            first.append(threading.get_ident())
            in_poll.set()
            second_done.wait(2)
        return poll(max)

    a.chime.poll = slow_poll
    got = {}

    def run(n, before=None):
        async def main():
            if before:
                before.wait(2)
            try:
                got[n] = [e.data for e in await asyncio.wait_for(a.wait(), 2)]
            except (RuntimeError, asyncio.TimeoutError) as e:
                got[n] = type(e).__name__
            finally:
                if n == 2:
                    second_done.set()
        asyncio.run(main())

    try:
        threads = [threading.Thread(target=run, args=(1,)), threading.Thread(target=run, args=(2, in_poll))]
        for t in threads:
            t.start()
        threads[1].join(3)
        a.arm(1, after=0.01, data=1)
        threads[0].join(5)
        assert got == {1: [1], 2: "RuntimeError"}, got
    finally:
        a.close()


def test_open_in_another_time_namespace_says_so(broker):
    """EXDEV from chime_open() (another CLOCK_MONOTONIC offset) read
    "Invalid cross-device link"."""
    e = chime._error("chime_open", errno.EXDEV, socket="/s", invalid="", or_session="")
    assert "CLOCK_MONOTONIC" in str(e) and "time namespace" in str(e), str(e)
    e = chime._error("chime_drop_session", errno.EPERM, socket="/s", session="x", invalid="", or_session="")
    assert "/s runs as a user" in str(e), str(e)
    if os.geteuid() != 0 or subprocess.run(["unshare", "--time", "--fork", "true"],
                                           capture_output=True).returncode != 0:
        return                          # no time namespace here: the messages alone
    r = subprocess.run(["unshare", "--time", "--monotonic", "1000", "--fork", sys.executable, "-c",
                        "import chime, sys\ntry:\n    chime.Chime(socket=sys.argv[1])\n"
                        "except OSError as e:\n    print(e.errno, e)\n", broker.socket],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.startswith(f"{errno.EXDEV} ") and "time namespace" in r.stdout, (r.stdout, r.stderr)
