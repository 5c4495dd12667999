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
        # (topic, broker) -> {future: queue ids or None}, in arrival order. Keyed by the
        # future so a request that ends (answered, timed out, cancelled) leaves in O(1):
        # a rebalance in a big group leaves thousands of pulls of dropped queues held here
        # until their suspend timeout, all on one (topic, broker).
        self._waiters: dict[tuple[str, str], dict[asyncio.Future, frozenset | None]] = {}

    def notify(self, touched):
        for topic, broker, qid in touched:
            waiters = self._waiters.get((topic, broker))
            if not waiters:
                continue
            woken = [fut for fut, qids in waiters.items() if fut.done() or qids is None or qid in qids]
            for fut in woken:
                del waiters[fut]
                if not fut.done():
                    fut.set_result(True)
            if not waiters:
                del self._waiters[(topic, broker)]

    def wake_all(self):
        """Release every held request (shutdown, broker offline, topic deleted)."""
        for waiters in self._waiters.values():
            for fut in waiters:
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
            waiters = self._waiters.setdefault((topic, broker), {})
            ids = None if qids is None else frozenset(qids)
            if fut in waiters:  # the same (topic, broker) named twice: wait on both sets
                ids = None if ids is None or waiters[fut] is None else ids | waiters[fut]
            waiters[fut] = ids
        try:
            return await asyncio.wait_for(fut, remaining)
        except asyncio.TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            for topic, broker, _ in targets:
                waiters = self._waiters.get((topic, broker))
                if waiters is not None:
                    waiters.pop(fut, None)
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
