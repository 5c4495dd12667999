"""One remoting connection, whichever end of it we are: the broker's server connections
and every client are this class.

It reads frames until the connection ends. A response goes to the request of ours that
waits for it (the pending table, by opaque); a request from the peer goes to ``on_request``
in a task of its own (a long poll must not hold up the heartbeat behind it) and its answer,
if any, is sent back. ``invoke`` sends a request and waits for its answer, ``send`` gives
the answer's future (many in flight), ``oneway`` expects none.

A frame that cannot be read (length outside [4, MAX_FRAME], a header we cannot decode)
closes the connection with a log line, as Netty's frame decoder does. Closing, for
whatever reason, fails every call still waiting at once: no caller waits out its timeout
on a connection that is gone.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Awaitable, Callable

from .codec import FLAG_ONEWAY, MAX_FRAME, Command, FrameError, decode, encode, response
from .wire import SYSTEM_ERROR

log = logging.getLogger(__name__)

RequestHandler = Callable[[Command], Awaitable[Command | None]]


class Endpoint:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_request: RequestHandler | None = None, *, name: str = "client", language: str = "JAVA"):
        self.reader, self.writer = reader, writer
        self.on_request = on_request      # None: the peer's requests are ignored
        self.name = name                  # what the log lines call this end
        self.request_language = language  # the LanguageCode our requests announce
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer: tuple[str, int] = (peer[0], peer[1])
        self.closed = False
        self._pending: dict[int, asyncio.Future] = {}
        self._opaques = itertools.count(1)
        self._answering: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"

    # ------------------------------------------------------------------ reading

    async def serve(self) -> None:
        """The frame loop: runs until the connection ends, then closes this end."""
        reason = "connection closed"
        try:
            while not self.closed:
                length = int.from_bytes(await self.reader.readexactly(4), "big")
                if length < 4 or length > MAX_FRAME:
                    raise FrameError(f"frame length {length} outside [4, {MAX_FRAME}]")
                cmd = decode(await self.reader.readexactly(length))
                if cmd.is_response:
                    future = self._pending.pop(cmd.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(cmd)
                elif self.on_request is not None:
                    task = asyncio.get_running_loop().create_task(self._answer(cmd))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            reason = f"connection lost: {exc}"
        except FrameError as exc:
            reason = f"unreadable frame: {exc}"
            log.warning("remoting %s: closing the connection with %s: %s", self.name, self.address, exc)
        finally:
            self.close(reason)

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
            self.writer.write(encode(cmd))

    def _request(self, code: int, ext: dict | None, body: bytes) -> tuple[int, asyncio.Future]:
        if self.closed:
            raise ConnectionError(f"remoting connection with {self.address} closed")
        opaque = next(self._opaques)
        future = self._pending[opaque] = asyncio.get_running_loop().create_future()
        self.writer.write(encode(Command(code, ext or {}, body, opaque, language=self.request_language)))
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
        # The frame loop sees the end of the stream and stops.
        self.writer.close()
