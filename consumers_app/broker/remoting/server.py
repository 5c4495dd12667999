"""A remoting TCP listener: frames in, handler calls, frames out, on one asyncio loop.

Each accepted socket is a ``Connection``. Requests are handled concurrently (a long
poll must not hold up the heartbeat behind it), answers go back with the request's
opaque, and the server can send requests of its own to the client over the same socket
(``invoke`` for an answer, ``send_oneway`` for a notice). A frame that cannot be read
closes that one connection with a log line; nothing else is affected.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Awaitable, Callable

from consumers_app.remoting.codec import FLAG_ONEWAY, MAX_FRAME, Command, FrameError, decode, encode, response
from consumers_app.remoting.wire import REQUEST_CODE_NOT_SUPPORTED, SYSTEM_ERROR

log = logging.getLogger(__name__)

Handler = Callable[["Connection", Command], Awaitable[Command | None]]


class Connection:
    _opaques = itertools.count(1)

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener: "Listener"):
        self.reader, self.writer, self.listener = reader, writer, listener
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer: tuple[str, int] = (peer[0], peer[1])
        self.client_id = ""
        self.language = ""
        self.version = 0
        self.groups: set[str] = set()        # consumer groups whose session this connection is
        self.closed = False
        self._pending: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"

    # ------------------------------------------------------------------ reading

    async def serve(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(4)
                length = int.from_bytes(head, "big")
                if length < 4 or length > MAX_FRAME:
                    raise FrameError(f"frame length {length} outside [4, {MAX_FRAME}]")
                cmd = decode(await self.reader.readexactly(length))
                if cmd.is_response:
                    future = self._pending.pop(cmd.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(cmd)
                    continue
                task = asyncio.get_running_loop().create_task(self._handle(cmd))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except FrameError as exc:
            log.warning("remoting %s: closing the connection from %s: %s", self.listener.name, self.address, exc)
        finally:
            self.close()

    async def _handle(self, cmd: Command) -> None:
        try:
            answer = await self.listener.handler(self, cmd)
            if answer is None:
                answer = response(cmd, REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        except FrameError as exc:   # a request we understood the frame of but not its fields
            answer = response(cmd, SYSTEM_ERROR, str(exc))
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the connection
            log.exception("remoting %s: request code %d failed", self.listener.name, cmd.code)
            answer = response(cmd, SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if not cmd.is_oneway:
            self.write(answer)

    # ------------------------------------------------------------------ writing

    def write(self, cmd: Command) -> None:
        if not self.closed:
            self.writer.write(encode(cmd))

    def send_oneway(self, code: int, ext: dict | None = None, body: bytes = b"") -> None:
        self.write(Command(code, ext or {}, body, next(self._opaques), FLAG_ONEWAY))

    async def invoke(self, code: int, ext: dict | None = None, body: bytes = b"", timeout: float = 5.0) -> Command:
        """A request of ours to the client; its answer, or TimeoutError."""
        opaque = next(self._opaques)
        future = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        self.write(Command(code, ext or {}, body, opaque, 0))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(opaque, None)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for task in self._tasks:
            task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("connection closed"))
        self.writer.close()
        self.listener.connections.discard(self)
        self.listener.on_close(self)


class Listener:
    """One TCP port: the name server's or one logical broker's."""

    def __init__(self, name: str, handler: Handler, on_close: Callable[[Connection], None] = lambda c: None):
        self.name = name
        self.handler = handler
        self.on_close = on_close
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._accept, host, port, limit=MAX_FRAME + 8)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader, writer) -> None:
        conn = Connection(reader, writer, self)
        self.connections.add(conn)
        await conn.serve()

    def close_connections(self) -> None:
        for conn in list(self.connections):
            conn.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.close_connections()
            await self.server.wait_closed()
            self.server = None
