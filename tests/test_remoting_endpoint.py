"""The remoting endpoint both ends share (consumers_app.remoting.endpoint), over real
loopback sockets: closing fails every waiting call at once, a peer that goes away fails
ours, and a frame whose length cannot be right closes the connection with a log line,
on the client as on the broker's side."""
from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from consumers_app.remoting import wire
from consumers_app.remoting.client import RemotingClient
from consumers_app.remoting.codec import MAX_FRAME, Command, decode, encode, response
from consumers_app.remoting.endpoint import Endpoint

from .support import async_wait_until

NEVER = 3600        # a call's own timeout no test ever reaches
DEADLINE = 30       # how long a test waits for what must happen at once


class Peer:
    """A bare TCP server that records the frames it receives and writes what a test tells it."""

    def __init__(self):
        self.frames: list[Command] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.ended = 0      # connections whose other end closed
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader, writer) -> None:
        self.writers.append(writer)
        try:
            while True:
                n = int.from_bytes(await reader.readexactly(4), "big")
                self.frames.append(decode(await reader.readexactly(n)))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.ended += 1

    async def stop(self) -> None:
        for writer in self.writers:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def peer():
    p = Peer()
    yield p
    await p.stop()


async def test_close_fails_every_pending_call_at_once(peer):
    client = await RemotingClient.connect(await peer.start())
    calls = [asyncio.ensure_future(client.request(wire.GET_MAX_OFFSET, {"topic": "T", "queueId": i}, timeout=NEVER))
             for i in range(3)]
    sent = client.send(wire.GET_MIN_OFFSET, {"topic": "T", "queueId": 0})
    await async_wait_until(lambda: len(peer.frames) == 4, message="the peer got the four requests")
    assert not any(c.done() for c in calls)   # the peer answers nothing: they wait

    await client.close()
    results = await asyncio.wait_for(asyncio.gather(*calls, sent, return_exceptions=True), DEADLINE)
    assert all(isinstance(r, ConnectionError) for r in results), results
    assert client.closed
    with pytest.raises(ConnectionError):
        await client.request(wire.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}, timeout=NEVER)


async def test_a_peer_that_goes_away_fails_the_calls_waiting_on_it(peer):
    client = await RemotingClient.connect(await peer.start())
    call = asyncio.ensure_future(client.request(wire.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}, timeout=NEVER))
    await async_wait_until(lambda: peer.frames, message="the peer got the request")
    peer.writers[0].close()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(call, DEADLINE)
    assert client.closed


async def test_answers_find_their_request_and_requests_from_the_peer_are_answered(peer):
    async def on_request(cmd: Command):
        return response(cmd, body=b"pong") if cmd.code == wire.GET_CONSUMER_RUNNING_INFO else None

    client = await RemotingClient.connect(await peer.start(), on_request=on_request, language="PYTHON")
    first = asyncio.ensure_future(client.request(wire.GET_MAX_OFFSET, {"queueId": 1}, timeout=NEVER))
    second = asyncio.ensure_future(client.request(wire.GET_MAX_OFFSET, {"queueId": 2}, timeout=NEVER))
    await async_wait_until(lambda: len(peer.frames) == 2, message="both requests")
    assert [f.language for f in peer.frames] == ["PYTHON", "PYTHON"]
    by_queue = {f.ext["queueId"]: f for f in peer.frames}
    # Answered in the opposite order: each goes to its own caller by opaque.
    peer.writers[0].write(encode(response(by_queue["2"], ext={"offset": 20})))
    peer.writers[0].write(encode(response(by_queue["1"], ext={"offset": 10})))
    assert (await asyncio.wait_for(first, DEADLINE)).ext["offset"] == "10"
    assert (await asyncio.wait_for(second, DEADLINE)).ext["offset"] == "20"

    # The peer's own requests: answered when the handler has an answer, ignored when not.
    peer.writers[0].write(encode(Command(wire.NOTIFY_CONSUMER_IDS_CHANGED, {}, b"", 900)))
    peer.writers[0].write(encode(Command(wire.GET_CONSUMER_RUNNING_INFO, {}, b"", 901)))
    answer = await async_wait_until(lambda: next((f for f in peer.frames if f.is_response), None),
                                    message="the answer to the running-info request")
    assert (answer.opaque, answer.body) == (901, b"pong")
    assert [f.opaque for f in peer.frames if f.is_response] == [901]
    await client.close()


@pytest.mark.parametrize("length", [0, 3, MAX_FRAME + 1, 0xFFFFFFFF], ids=["empty", "short", "over-16MiB", "4GiB"])
async def test_a_frame_of_impossible_length_closes_the_client_connection(peer, caplog, length):
    client = await RemotingClient.connect(await peer.start())
    call = asyncio.ensure_future(client.request(wire.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}, timeout=NEVER))
    await async_wait_until(lambda: peer.frames, message="the peer got the request")
    with caplog.at_level(logging.WARNING, logger="consumers_app.remoting.endpoint"):
        # Only the length field: a client that believed it would wait for 16 MiB that never come.
        peer.writers[0].write(struct.pack(">I", length))
        with pytest.raises(ConnectionError, match="unreadable frame"):
            await asyncio.wait_for(call, DEADLINE)
    assert client.closed
    assert any("closing the connection" in r.getMessage() and f"frame length {length}" in r.getMessage()
               for r in caplog.records), caplog.text
    await async_wait_until(lambda: peer.ended == 1, message="the client closed its socket")


async def test_the_server_end_fails_its_own_invoke_when_the_client_leaves():
    """The broker's side: a request of the server's (running info) waits on the client;
    the client's socket closing fails it at once."""
    accepted: asyncio.Future[Endpoint] = asyncio.get_running_loop().create_future()

    async def accept(reader, writer):
        end = Endpoint(reader, writer, name="test server")
        accepted.set_result(end)
        await end.serve()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        end = await asyncio.wait_for(accepted, DEADLINE)
        call = asyncio.ensure_future(end.invoke(wire.GET_CONSUMER_RUNNING_INFO, {"clientId": "c"}, timeout=NEVER))
        n = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), DEADLINE), "big")
        assert decode(await reader.readexactly(n)).code == wire.GET_CONSUMER_RUNNING_INFO
        writer.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(call, DEADLINE)
        assert end.closed
    finally:
        server.close()
        await server.wait_closed()


async def test_a_request_whose_handler_waits_does_not_hold_up_the_next_one():
    """Handlers run at once in the frame loop; one that has to wait (a long poll) goes on
    in a task of its own: the request behind it is answered first, the waiting one once
    what it waits for comes, and closing cancels it."""
    release = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(request: Command) -> Command:
        if request.code == wire.PULL_MESSAGE:
            try:
                await release.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return response(request, ext={"code": request.code})

    async def accept(reader, writer):
        await Endpoint(reader, writer, handler, name="test server").serve()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        client = await RemotingClient.connect(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        held = client.send(wire.PULL_MESSAGE)
        quick = await asyncio.wait_for(client.request(wire.HEART_BEAT, timeout=NEVER), DEADLINE)
        assert quick.ext["code"] == str(wire.HEART_BEAT) and not held.done()
        release.set()
        assert (await asyncio.wait_for(held, DEADLINE)).ext["code"] == str(wire.PULL_MESSAGE)

        release.clear()
        client.send(wire.PULL_MESSAGE)
        await asyncio.wait_for(client.request(wire.HEART_BEAT, timeout=NEVER), DEADLINE)
        await client.close()
        await asyncio.wait_for(cancelled.wait(), DEADLINE)
    finally:
        server.close()
        await server.wait_closed()
