"""A small asyncio remoting client: requests with many in flight on one connection.

    client = await RemotingClient.connect("127.0.0.1:10911")
    answer = await client.request(GET_CONSUMER_RUNNING_INFO, {"consumerGroup": g, "clientId": c})
    await client.close()

What the lab uses to ask the broker what only remoting carries (a peer's running info),
what our consumers' remoting connection is built on, and what the remoting benchmark
drives the broker with. Requests from the server on the same connection (a membership
notice, a running-info question) go to ``on_request``, whose answer, if any, is sent back;
without one they are ignored. The connection itself (frames, pending requests, closing) is
the ``Endpoint`` the broker's server uses too.
"""
from __future__ import annotations

import asyncio

from . import wire
from .bodies import route_masters
from .codec import MAX_FRAME, Command
from .endpoint import Endpoint, RequestHandler


class RemotingClient:
    """A connection we open: an ``Endpoint`` and the task running its frame loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_request: RequestHandler | None = None, language: str = "JAVA"):
        self.endpoint = Endpoint(reader, writer, on_request, name="client", language=language)
        self._reading = asyncio.get_running_loop().create_task(self.endpoint.serve())

    @classmethod
    async def connect(cls, addr: str, timeout: float = 5, on_request: RequestHandler | None = None,
                      language: str = "JAVA") -> "RemotingClient":
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), limit=MAX_FRAME + 8),
                                                timeout)
        return cls(reader, writer, on_request, language)

    @property
    def closed(self) -> bool:
        return self.endpoint.closed

    def send(self, code: int, ext: dict | None = None, body: bytes = b"") -> asyncio.Future:
        """Write a request now; the future resolves to its answer."""
        return self.endpoint.send(code, ext, body)

    async def request(self, code: int, ext: dict | None = None, body: bytes = b"", timeout: float = 5) -> Command:
        return await self.endpoint.invoke(code, ext, body, timeout)

    async def close(self) -> None:
        """Every request still waiting fails now with ConnectionError."""
        self.endpoint.close()
        self._reading.cancel()


async def broker_addresses(namesrv: str, topic: str) -> dict[str, str]:
    """Logical broker -> its remoting address, from the name server's route of ``topic``."""
    client = await RemotingClient.connect(namesrv)
    try:
        answer = await client.request(wire.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    finally:
        await client.close()
    if answer.code != wire.SUCCESS:
        raise LookupError(f"no route for {topic}: {answer.remark}")
    masters = route_masters(wire.loads(answer.body) or {})
    if not masters:
        raise LookupError(f"the route of {topic} names no broker master")
    return masters
