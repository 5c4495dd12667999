"""Long polling: hold a pull/pop that found nothing until a message arrives or it times out.

RocketMQ's PullRequestHoldService re-checks held requests when the commit-log
dispatcher reports a new message for their queue (``notifyMessageArriving``). Here the
store calls :meth:`LongPollService.notify` synchronously after every append with the
set of queues that grew, and each waiter's future is resolved at once - a held
request wakes within one event-loop turn, never by periodic polling.

Waiters register on (topic, broker) with an optional set of queue ids: a pop from
"any queue of the broker" (queue id -1) waits on every queue of that broker.
"""
from __future__ import annotations

import asyncio
import time


class LongPollService:
    def __init__(self):
        # (topic, broker) -> list of (queue ids or None, future)
        self._waiters: dict[tuple[str, str], list[tuple[frozenset | None, asyncio.Future]]] = {}

    def notify(self, touched):
        for topic, broker, qid in touched:
            waiters = self._waiters.get((topic, broker))
            if not waiters:
                continue
            keep = []
            for qids, fut in waiters:
                if fut.done():
                    continue
                if qids is None or qid in qids:
                    fut.set_result(True)
                else:
                    keep.append((qids, fut))
            if keep:
                self._waiters[(topic, broker)] = keep
            else:
                del self._waiters[(topic, broker)]

    def wake_all(self):
        """Release every held request (shutdown, broker offline, topic deleted)."""
        for waiters in self._waiters.values():
            for _, fut in waiters:
                if not fut.done():
                    fut.set_result(False)
        self._waiters.clear()

    async def wait(self, targets, deadline: float) -> bool:
        """Wait until one of ``targets`` ((topic, broker, qids|None) ...) gets a message.

        ``deadline`` is a ``time.monotonic()`` instant. Returns False on timeout.
        """
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        fut = asyncio.get_running_loop().create_future()
        for topic, broker, qids in targets:
            self._waiters.setdefault((topic, broker), []).append(
                (None if qids is None else frozenset(qids), fut))
        try:
            return await asyncio.wait_for(fut, remaining)
        except asyncio.TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            for topic, broker, _ in targets:
                waiters = self._waiters.get((topic, broker))
                if waiters:
                    waiters[:] = [w for w in waiters if w[1] is not fut]
                    if not waiters:
                        del self._waiters[(topic, broker)]

    async def poll(self, attempt, targets, deadline: float):
        """Run ``attempt()`` until it returns something truthy or the deadline passes.

        ``attempt`` is synchronous, so nothing can arrive between a failed attempt and
        the registration of the waiter (one event-loop turn).
        """
        while True:
            result = attempt()
            if result:
                return result
            if not await self.wait(targets, deadline):
                return attempt()
