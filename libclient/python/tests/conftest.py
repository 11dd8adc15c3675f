# SPDX-License-Identifier: MIT
"""A private chimed per test, on a socket in a fresh directory.

meson test sets $CHIMED (the broker to run), $CHIME_LIBRARY (the build's
libchime.so) and PYTHONPATH (this module's sources)."""
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest


class Broker:
    def __init__(self, path, extra=()):
        self.dir = tempfile.mkdtemp(prefix="chime-py-")
        self.socket = os.path.join(self.dir, "chime.sock")
        self.log = open(os.path.join(self.dir, "chimed.log"), "w+")
        # not the host's /etc/subuid, whose ranges make the default per-uid quota a quarter of the slab
        subuids = [] if any(str(a).startswith("--subuid-file") for a in extra) else ["--subuid-file", ""]
        self.proc = subprocess.Popen([path, "--foreground", "--socket", self.socket, *subuids, *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                    s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.02)
        self.log.seek(0)
        log = self.log.read()
        self.stop()
        pytest.fail(f"chimed did not come up on {self.socket}: {log}")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture
def broker():
    path = os.environ.get("CHIMED")
    if not path:
        pytest.skip("$CHIMED not set (run through meson test)")
    b = Broker(path, ["--shards", "2"])
    yield b
    b.stop()


@pytest.fixture
def chime_conn(broker):
    import chime
    with chime.Chime(socket=broker.socket) as c:
        yield c
