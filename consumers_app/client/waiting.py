"""Wakeup: ServiceThread.waitForRunning/wakeup for asyncio.

A flag plus at most one waiting future. ``wait(timeout)`` returns at once if woken since
the last wait (the flag is consumed, as RocketMQ's ``hasNotified``), else when woken or
after ``timeout`` seconds. Built on a bare future and ``call_later`` rather than
``asyncio.wait_for(event.wait(), ...)``, which on Python 3.11 can leave a cancelled
task hanging when the cancellation races the wake-up.
"""
from __future__ import annotations

import asyncio


class Wakeup:
    __slots__ = ("_notified", "_waiter")

    def __init__(self):
        self._notified = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._notified = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def clear(self) -> None:
        self._notified = False

    def is_set(self) -> bool:
        return self._notified

    async def wait(self, timeout: float | None = None) -> bool:
        """True if woken, False on timeout. Consumes the wake-up."""
        if self._notified:
            self._notified = False
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        handle = None
        if timeout is not None:
            handle = loop.call_later(max(0.0, timeout), lambda: waiter.done() or waiter.set_result(False))
        try:
            woken = await waiter
        finally:
            if handle is not None:
                handle.cancel()
            if self._waiter is waiter:
                self._waiter = None
        if woken:
            self._notified = False
        return woken
