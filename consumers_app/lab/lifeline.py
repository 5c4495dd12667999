"""Children that die with the lab, and one lab per data directory.

Everything ``runlab`` starts (the broker, workers, peers) must go when it goes, even
when it is SIGKILLed and can clean nothing up. A child started with ``child_env()``
calls ``die_with_parent()`` first thing: Linux delivers SIGTERM to it when its parent
dies (PR_SET_PDEATHSIG), and a watchdog thread checks the parent pid every second for
the cases the kernel signal misses (not Linux; the parent died before the call).
SIGTERM lets a broker persist its offsets on the way out.

``DataDirLock`` is an flock on ``lab.lock`` in the data directory: the kernel drops it
with the process however it dies, so a SIGKILLed lab never blocks the next one, and a
second lab on a directory in use learns the first one's pid and URL from the file.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

PARENT_ENV = "LAB_PARENT_PID"
PR_SET_PDEATHSIG = 1
WATCHDOG_INTERVAL_S = 1.0
# After the parent is gone a child gets this long to stop gracefully before it exits hard:
# everything a SIGKILLed lab started must be gone within 10 s, and a worker's clients may
# be waiting on a broker that is going down at the same moment.
PARENT_GONE_GRACE_S = 5.0


def child_env(env: dict | None = None) -> dict:
    """The environment for a child that must die with this process."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """Called by a child at start-up: exit (SIGTERM to ourselves) when the parent is gone."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not parent.isdigit():
        return  # started by hand: nobody to follow
    parent_pid = int(parent)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:       # it died before we could ask for the signal
        os.kill(os.getpid(), signal.SIGTERM)
        return

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_INTERVAL_S)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(PARENT_GONE_GRACE_S)   # the graceful path had its chance
                os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


class DataDirInUse(Exception):
    def __init__(self, data_dir: Path, holder: dict):
        self.data_dir = data_dir
        self.holder = holder
        who = f"pid {holder.get('pid', '?')}"
        if holder.get("url"):
            who += f", {holder['url']}"
        super().__init__(f"another Rebalance Lab is running on data dir {data_dir} ({who})")


class DataDirLock:
    """Exclusive use of a data directory for the life of this process."""

    FILE = "lab.lock"

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / self.FILE
        self._fd: int | None = None

    def acquire(self, **about) -> None:
        """Take the lock or raise DataDirInUse naming the holder. ``about`` (e.g. url) is
        written for the next one to read."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read(fd)
            os.close(fd)
            raise DataDirInUse(self.data_dir, holder) from None
        self._fd = fd
        self.update(**about)

    def update(self, **about) -> None:
        """Rewrite what the holder says about itself (e.g. the URL once it is known)."""
        if self._fd is None:
            return
        data = json.dumps({"pid": os.getpid(), **about}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)   # closing drops the flock
            self._fd = None

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            raw = os.pread(fd, 4096, 0)
            return json.loads(raw or b"{}")
        except (OSError, ValueError):
            return {}
