"""A small asyncio remoting client: requests with many in flight on one connection.

    client = await RemotingClient.connect("127.0.0.1:10911")
    answer = await client.request(GET_CONSUMER_RUNNING_INFO, {"consumerGroup": g, "clientId": c})
    await client.close()

What the lab uses to ask the broker what only remoting carries (a peer's running info),
what our consumers' remoting connection is built on, and what the remoting benchmark
drives the broker with. Requests from the server on the same connection (a membership
notice, a running-info question) go to ``on_request``, whose answer, if any, is sent back;
without one they are ignored.
"""
from __future__ import annotations

import asyncio
import itertools
import logging

from . import wire
from .codec import MAX_FRAME, Command, decode, encode, response

log = logging.getLogger(__name__)


class RemotingClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_request=None,
                 language: str = "JAVA"):
        self.reader, self.writer = reader, writer
        self.on_request = on_request     # async (Command) -> Command | None
        self.language = language
        self._pending: dict[int, asyncio.Future] = {}
        self._opaques = itertools.count(1)
        self._handling: set[asyncio.Task] = set()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, addr: str, timeout: float = 5, on_request=None, language: str = "JAVA") -> "RemotingClient":
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), limit=MAX_FRAME + 8),
                                                timeout)
        return cls(reader, writer, on_request, language)

    @property
    def closed(self) -> bool:
        return self._task.done()

    async def _read(self) -> None:
        try:
            while True:
                n = int.from_bytes(await self.reader.readexactly(4), "big")
                cmd = decode(await self.reader.readexactly(n))
                if not cmd.is_response:
                    if self.on_request is not None:
                        task = asyncio.get_running_loop().create_task(self._answer(cmd))
                        self._handling.add(task)
                        task.add_done_callback(self._handling.discard)
                    continue
                future = self._pending.pop(cmd.opaque, None)
                if future is not None and not future.done():
                    future.set_result(cmd)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"remoting connection lost: {exc}"))

    async def _answer(self, request: Command) -> None:
        try:
            answer = await self.on_request(request)
        except Exception as exc:  # noqa: BLE001 - the server gets an error answer, the connection lives on
            log.warning("answering request code %d failed: %s", request.code, exc)
            answer = response(request, 1, f"client error: {exc}")
        if answer is not None and not request.is_oneway and not self.writer.is_closing():
            self.writer.write(encode(answer))

    def send(self, code: int, ext: dict | None = None, body: bytes = b"") -> asyncio.Future:
        """Write a request now; the future resolves to its answer."""
        if self.closed:
            raise ConnectionError("remoting connection closed")
        opaque = next(self._opaques)
        future = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        self.writer.write(encode(Command(code, ext or {}, body, opaque, language=self.language)))
        return future

    async def request(self, code: int, ext: dict | None = None, body: bytes = b"", timeout: float = 5) -> Command:
        future = self.send(code, ext, body)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            for opaque, f in list(self._pending.items()):
                if f is future:
                    del self._pending[opaque]

    async def close(self) -> None:
        self._task.cancel()
        self.writer.close()


async def broker_addresses(namesrv: str, topic: str) -> dict[str, str]:
    """Logical broker -> its remoting address, from the name server's route of ``topic``."""
    client = await RemotingClient.connect(namesrv)
    try:
        answer = await client.request(wire.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    finally:
        await client.close()
    if answer.code != wire.SUCCESS:
        raise LookupError(f"no route for {topic}: {answer.remark}")
    route = wire.loads(answer.body)
    return {b["brokerName"]: b["brokerAddrs"]["0"] for b in route["brokerDatas"]}
