"""A remoting TCP listener: one ``Endpoint`` per accepted socket, its requests handed to
the listener's handler, on one asyncio loop.

Each accepted socket is a ``Connection``: the shared remoting endpoint (frame loop,
concurrent handling, ``invoke`` / ``oneway`` of the server's own requests to the client,
a frame that cannot be read closing that one connection with a log line) plus what the
broker knows of the client on it (its id, language, version and the groups whose session
it is). A request the handler has no answer for gets REQUEST_CODE_NOT_SUPPORTED. A broker's
answers leave only after its listener's ``before_answers`` (the commit log's deferred write).
"""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Awaitable, Callable

from consumers_app.remoting.codec import MAX_FRAME, Command, response
from consumers_app.remoting.endpoint import Endpoint
from consumers_app.remoting.wire import REQUEST_CODE_NOT_SUPPORTED

Handler = Callable[["Connection", Command], Awaitable[Command | None]]


class Connection(Endpoint):
    def __init__(self, reader, writer, listener: "Listener"):
        super().__init__(reader, writer, partial(listener.handler, self), name=listener.name)
        self.listener = listener
        self.client_id = ""
        self.language = ""                   # the client's, from its heartbeat
        self.version = 0
        self.groups: set[str] = set()        # consumer groups whose session this connection is

    def unanswered(self, request: Command) -> Command:
        return response(request, REQUEST_CODE_NOT_SUPPORTED, f" request type {request.code} not supported")

    def _flush(self) -> None:
        # No answer leaves before what it acknowledges is in the commit log: the sends of
        # one read are appended with defer_write, their records written in one go here.
        self.listener.before_answers()
        super()._flush()

    def close(self, reason: str = "connection closed") -> None:
        if self.closed:
            return
        super().close(reason)
        self.listener.connections.discard(self)
        self.listener.on_close(self)


class Listener:
    """One TCP port: the name server's or one logical broker's."""

    def __init__(self, name: str, handler: Handler, on_close: Callable[[Connection], None] = lambda c: None,
                 before_answers: Callable[[], None] = lambda: None):
        self.name = name
        self.handler = handler
        self.on_close = on_close
        self.before_answers = before_answers   # what must happen before any answer is sent
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
