"""The lab's fault injection, kept outside the RocketMQ logic it disturbs.

* ``ListenerFaults`` wraps the user's listener: *hang* (the listener blocks, heartbeats
  go on), *slow* (a sleep per message) and *fail* (a share of RECONSUME_LATER).
* ``NetworkCut`` stands between a client and its connection: while cut, every new call
  is lost (it times out, as over a partitioned network) and nothing that arrives on an
  open stream is seen. Nothing is closed, so the broker notices only the silence: the
  client expires after the broker's channel expiry (120 s by default). A *kill*, by
  contrast, closes the connection, which the broker notices at once.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time


class ListenerFaults:
    """hang / slow / fail around a listener; checked on consume threads before each call."""

    def __init__(self):
        self._gate = threading.Event()
        self._gate.set()
        self._closing = threading.Event()
        self.slow_ms = 0.0
        self.fail_ratio = 0.0

    @property
    def hung(self) -> bool:
        return not self._gate.is_set()

    def hang(self) -> None:
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def release(self) -> None:
        """The consumer is closing: let held threads go (their calls return None)."""
        self._closing.set()
        self._gate.set()

    def pass_gate(self) -> bool:
        """Block while hung; False when released (closing) while held."""
        gate = self._gate
        while not gate.wait(0.2):
            if self._closing.is_set():
                return False
        return True

    def injects_failure(self) -> bool:
        """Apply *slow*; True when *fail* decides this call fails (RECONSUME_LATER)."""
        if self.slow_ms:
            time.sleep(self.slow_ms / 1000)  # the lab's "slow consumer"
        return bool(self.fail_ratio) and random.random() < self.fail_ratio


class NetworkCutError(ConnectionError):
    """A call made while the lab had cut this client off the network."""


class _LostCall:
    """A call into a partitioned network: nothing comes back before the deadline."""

    def __init__(self, name: str, timeout: float | None):
        self.name = name
        self.timeout = 3.0 if timeout is None else timeout

    async def _wait(self):
        await asyncio.sleep(self.timeout)
        raise NetworkCutError(f"{self.name}: no answer in {self.timeout:g}s (network cut)")

    def __await__(self):
        return self._wait().__await__()

    def __aiter__(self):
        return self

    async def __anext__(self):
        await self._wait()


class _Unreachable:
    """Stands in for a gRPC stub while the network is cut."""

    def __getattr__(self, name):
        def call(request=None, *, timeout=None, **_):
            return _LostCall(name, timeout)
        return call


class NetworkCut:
    """Cuts one Connection off the network and heals it again (no close either way)."""

    def __init__(self, connection):
        self.connection = connection
        self._stubs = None

    @property
    def active(self) -> bool:
        return self._stubs is not None

    def cut(self) -> None:
        c = self.connection
        if self._stubs is None:
            self._stubs = (c.v2, c.lab)
            c.v2 = c.lab = _Unreachable()

    def heal(self) -> None:
        if self._stubs is not None:
            self.connection.v2, self.connection.lab = self._stubs
            self._stubs = None
