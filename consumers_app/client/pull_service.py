"""PullMessageService: one loop taking PullRequests off a queue and pulling for them.

As in RocketMQ there is exactly one PullRequest per assigned queue, and it circulates:
rebalance creates it, the service takes it and starts an asynchronous pull, and the
pull's callback puts it back - at once (``executePullRequestImmediately``) or after a
delay (``executePullRequestLater``: 50 ms on cache flow control, 20 ms on broker flow
control, 1 s on an exception). A dropped ProcessQueue ends the circulation.
"""
from __future__ import annotations

import asyncio

from ..message_queue import MessageQueue


class PullRequest:
    __slots__ = ("mq", "pq", "next_offset", "previously_locked", "lab_queue")

    def __init__(self, mq: MessageQueue, pq, next_offset: int, lab_queue=None):
        self.mq = mq
        self.pq = pq
        self.next_offset = next_offset
        self.previously_locked = False
        self.lab_queue = lab_queue  # the wire QueueRef, built once

    def __repr__(self) -> str:
        return f"PullRequest({self.mq.topic}/{self.mq.label}@{self.next_offset})"


class PullMessageService:
    def __init__(self, pull_message):
        """``pull_message(request)`` is called for each request taken; it must not block."""
        self._pull_message = pull_message
        self._queue: asyncio.Queue[PullRequest] = asyncio.Queue()
        self._timers: set[asyncio.TimerHandle] = set()
        self.stopped = False

    def execute_pull_request_immediately(self, request: PullRequest) -> None:
        if not self.stopped:
            self._queue.put_nowait(request)

    def execute_pull_request_later(self, request: PullRequest, delay_ms: float) -> None:
        if self.stopped:
            return
        loop = asyncio.get_running_loop()
        handle = None

        def fire():
            self._timers.discard(handle)
            self.execute_pull_request_immediately(request)

        handle = loop.call_later(delay_ms / 1000, fire)
        self._timers.add(handle)

    async def run(self) -> None:
        get = self._queue.get
        pull = self._pull_message
        while True:
            request = await get()
            pull(request)

    def stop(self) -> None:
        self.stopped = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
