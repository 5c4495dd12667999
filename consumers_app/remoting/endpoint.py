"""One remoting connection, whichever end of it we are: the broker's server connections
and every client are this class.

It reads frames until the connection ends. A response goes to the request of ours that
waits for it (the pending table, by opaque); a request from the peer goes to ``on_request``
and its answer, if any, is sent back; a handler that has to wait goes on in a task of its
own (a long poll must not hold up the heartbeat behind it). ``invoke`` sends a request and
waits for its answer, ``send`` gives the answer's future (many in flight), ``oneway``
expects none.

A frame that cannot be read (length outside [4, MAX_FRAME], a header we cannot decode)
closes the connection with a log line, as Netty's frame decoder does. Closing, for
whatever reason, fails every call still waiting at once: no caller waits out its timeout
on a connection that is gone.

Cost per frame is what limits a remoting peer (profiled: a loopback send() is ~100 us
of CPU on a busy VM, more than the rest of a request), so the loop batches what Netty's
pipeline batches: it reads what the socket has and cuts every whole frame out of it; a
request's handler runs at once, inside the loop, and gets a task of its own only when it
has to wait (a long poll, a sync flush); and what one turn of the event loop writes goes
out in one send (up to FLUSH_BYTES: more goes at once).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import types
from typing import Awaitable, Callable

from .codec import FLAG_ONEWAY, MAX_FRAME, Command, FrameError, decode, encode, response
from .wire import SYSTEM_ERROR

log = logging.getLogger(__name__)

RequestHandler = Callable[[Command], Awaitable[Command | None]]
READ_CHUNK = 256 * 1024   # what one read takes off the socket: many frames at a time
FLUSH_BYTES = 32 * 1024   # written frames wait for the end of the loop's turn up to this much


async def _continued(coro, waiting_on):
    return await _resumed(coro, waiting_on)


@types.coroutine
def _resumed(coro, waiting_on):
    """The rest of a coroutine started outside a task, as its task: what it waits on is
    passed up to the task, the task's wake-ups and cancellation passed down."""
    while True:
        try:
            sent = yield waiting_on
        except BaseException as exc:  # noqa: BLE001 - the task's throw (a cancel) goes down
            try:
                waiting_on = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                waiting_on = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class Endpoint:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_request: RequestHandler | None = None, *, name: str = "client", language: str = "JAVA"):
        self.reader, self.writer = reader, writer
        self.on_request = on_request      # None: the peer's requests are ignored
        self.name = name                  # what the log lines call this end
        self.request_language = language  # the LanguageCode our requests announce
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer: tuple[str, int] = (peer[0], peer[1])
        self.address = f"{peer[0]}:{peer[1]}"
        self.closed = False
        self._pending: dict[int, asyncio.Future] = {}
        self._opaques = itertools.count(1)
        self._answering: set[asyncio.Task] = set()
        self._out: list[bytes] = []       # frames written this turn of the loop, not sent yet
        self._out_bytes = 0
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ reading

    async def serve(self) -> None:
        """The frame loop: runs until the connection ends, then closes this end."""
        reason = "connection closed"
        reader = self.reader
        try:
            buf = b""
            while not self.closed:
                chunk = await reader.read(READ_CHUNK)
                if not chunk:
                    raise asyncio.IncompleteReadError(buf, None)
                buf = buf + chunk if buf else chunk
                pos, end = 0, len(buf)
                while end - pos >= 4:
                    length = int.from_bytes(buf[pos:pos + 4], "big")
                    if length < 4 or length > MAX_FRAME:
                        raise FrameError(f"frame length {length} outside [4, {MAX_FRAME}]")
                    if end - pos - 4 < length:
                        # A frame longer than what came: read its rest in one go (a 16 MiB
                        # frame is not grown chunk by chunk).
                        buf = buf[pos:] + await reader.readexactly(4 + length - (end - pos))
                        pos, end = 0, len(buf)
                    self._received(decode(buf[pos + 4:pos + 4 + length]))
                    pos += 4 + length
                    if self.closed:
                        break
                buf = buf[pos:]
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            reason = f"connection lost: {exc}"
        except FrameError as exc:
            reason = f"unreadable frame: {exc}"
            log.warning("remoting %s: closing the connection with %s: %s", self.name, self.address, exc)
        finally:
            self.close(reason)

    def _received(self, cmd: Command) -> None:
        if cmd.is_response:
            future = self._pending.pop(cmd.opaque, None)
            if future is not None and not future.done():
                future.set_result(cmd)
        elif self.on_request is not None:
            # Run the handler now; only one that waits becomes a task (most answer at once).
            answering = self._answer(cmd)
            try:
                waiting_on = answering.send(None)
            except StopIteration:
                return
            task = self._loop.create_task(_continued(answering, waiting_on))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer(self, request: Command) -> None:
        try:
            answer = await self.on_request(request)
        except FrameError as exc:   # a request whose frame we read but whose fields we cannot
            answer = response(request, SYSTEM_ERROR, str(exc))
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the connection
            log.exception("remoting %s: answering request code %d failed", self.name, request.code)
            answer = response(request, SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if answer is None:
            answer = self.unanswered(request)
        if answer is not None and not request.is_oneway:
            self.write(answer)

    def unanswered(self, request: Command) -> Command | None:
        """What goes back for a request the handler had no answer for: nothing, on this end."""
        return None

    # ------------------------------------------------------------------ writing

    def write(self, cmd: Command) -> None:
        if not self.closed:
            self._queue(encode(cmd))

    def _queue(self, frame: bytes) -> None:
        """Frames written in one turn of the loop leave in one send, at its end; but no
        more than FLUSH_BYTES wait: a peer reads the first pull answers while we encode
        the next (held to the end of the turn, eight 36 KiB answers made both ends take
        turns instead of working at once)."""
        self._out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()
        elif len(self._out) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        out, self._out, self._out_bytes = self._out, [], 0
        if out and not self.writer.is_closing():
            self.writer.write(b"".join(out))

    def _request(self, code: int, ext: dict | None, body: bytes) -> tuple[int, asyncio.Future]:
        if self.closed:
            raise ConnectionError(f"remoting connection with {self.address} closed")
        opaque = next(self._opaques)
        future = self._pending[opaque] = self._loop.create_future()
        self._queue(encode(Command(code, ext or {}, body, opaque, language=self.request_language)))
        return opaque, future

    def send(self, code: int, ext: dict | None = None, body: bytes = b"") -> asyncio.Future:
        """Write a request now; the future resolves to its answer (or fails when the
        connection closes). Without a timeout: the caller bounds the wait."""
        return self._request(code, ext, body)[1]

    async def invoke(self, code: int, ext: dict | None = None, body: bytes = b"", timeout: float = 5.0) -> Command:
        """A request and its answer; TimeoutError, or ConnectionError once the connection closes."""
        opaque, future = self._request(code, ext, body)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(opaque, None)

    def oneway(self, code: int, ext: dict | None = None, body: bytes = b"") -> None:
        """A request without an answer (dropped if the connection is closed)."""
        self.write(Command(code, ext or {}, body, next(self._opaques), FLAG_ONEWAY, language=self.request_language))

    def close(self, reason: str = "connection closed") -> None:
        if self.closed:
            return
        self.closed = True
        for task in self._answering:
            task.cancel()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"remoting connection with {self.address}: {reason}"))
        self._flush()   # what was written before the close still goes (a oneway, an answer)
        # The frame loop sees the end of the stream and stops.
        self.writer.close()
