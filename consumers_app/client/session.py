"""A member's session with the broker: LabAdmin.Session, one stream for the client's life.

It carries what WatchMembership does (the broker's "consumer ids changed" notices, and
by being open, the sign that we are connected) and, beside them, the requests a
rebalance makes at a change and the pulls, answered on the same stream by id. RocketMQ's
client sends its requests over its one remoting connection; a unary gRPC call instead
costs each side several times what a message on an open stream does, and at a change
every member asks at the same moment.

``changes()`` opens the stream and yields each MembershipChange until it ends;
``queue_offsets(request)`` and ``pull(request)`` ask while it is open (``usable``), else
raise ``SessionClosed`` so the caller makes its own call.
"""
from __future__ import annotations

import asyncio
import itertools

from ..protocol import lab


class SessionClosed(ConnectionError):
    """The session is not open (yet, or any more): ask by a call of its own."""


class MemberSession:
    def __init__(self, connection, group: str):
        self.connection = connection
        self.group = group
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        # Requests go out through one writer task (gRPC allows one write in flight): an
        # asker cancelled meanwhile (a pull at shutdown) never cancels a write, which
        # would cancel the stream and tell the broker we closed before our goodbye.
        self._outbox: asyncio.Queue | None = None

    @property
    def usable(self) -> bool:
        # A cut network loses new requests: then the caller's own call is lost instead.
        return self._outbox is not None and not self.connection.network.active

    async def changes(self):
        """Open the session; yield every MembershipChange until the stream ends."""
        conn = self.connection
        if conn.network.active:
            raise SessionClosed("the network is cut")   # nothing opens; the watch tries again
        call = conn.lab.Session(metadata=conn.metadata)
        writer = None
        try:
            await call.write(lab.SessionRequest(watch=lab.GroupRequest(group=self.group)))
            outbox = self._outbox = asyncio.Queue()
            writer = asyncio.get_running_loop().create_task(self._write_all(call, outbox))
            async for message in call:
                if message.HasField("change"):
                    yield message.change
                else:
                    waiter = self._pending.pop(message.id, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(message)
        finally:
            self._outbox = None
            if writer is not None:
                writer.cancel()
            call.cancel()
            self._fail_pending("the session ended before the answer")

    async def queue_offsets(self, request: lab.QueueOffsetsRequest, timeout: float) -> lab.QueueOffsetsResponse:
        """LabAdmin.GetQueueOffsets, asked on the session."""
        return (await self._ask(lab.SessionRequest(queue_offsets=request), timeout)).queue_offsets

    async def pull(self, request: lab.PullBatchRequest, timeout: float) -> lab.PullBatchResponse:
        """LabAdmin.PullBatch, asked on the session (a long poll is answered when it ends)."""
        return (await self._ask(lab.SessionRequest(pull=request), timeout)).pull

    async def _write_all(self, call, outbox: asyncio.Queue) -> None:
        try:
            while True:
                await call.write(await outbox.get())
        except Exception as exc:  # noqa: BLE001 - the stream ended: the reader ends with it
            self._fail_pending(f"the session ended: {exc}")

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(SessionClosed(reason))

    async def _ask(self, request: lab.SessionRequest, timeout: float) -> lab.SessionMessage:
        outbox = self._outbox
        if outbox is None or not self.usable:
            raise SessionClosed("no session open")
        request.id = request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._pending[request_id] = waiter
        # The deadline is a timer on the bare future, not asyncio.wait_for, which on Python
        # 3.11 can swallow a cancellation that races the answer (and then a consumer's
        # shutdown waits forever for its rebalance task to end).
        deadline = loop.call_later(timeout, _expire, waiter, timeout)
        outbox.put_nowait(request)
        try:
            return await waiter
        finally:
            deadline.cancel()
            self._pending.pop(request_id, None)
            if waiter.done() and not waiter.cancelled():
                waiter.exception()   # retrieved: a failure that came after the asker left


def _expire(waiter: asyncio.Future, timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError(f"no answer on the session in {timeout:g}s"))
