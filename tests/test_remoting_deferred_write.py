"""The broker's remoting sends are written to the commit log together (CommitLog.append's
defer_write) and never answered before they are written: an in-process broker core and its
remoting port, a real loopback connection."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from consumers_app.broker.core import BrokerConfig, BrokerCore
from consumers_app.broker.remoting.service import RemotingService
from consumers_app.remoting import wire
from consumers_app.remoting.client import RemotingClient

from .support import async_wait_until

pytestmark = pytest.mark.unit
TOPIC = "Deferred"


@pytest.fixture
async def broker(tmp_path):
    core = BrokerCore(BrokerConfig(data_dir=tmp_path, topics=[f"{TOPIC}:2"]))
    core.open()
    await core.start()
    service = RemotingService(core, "127.0.0.1", 0, 0)
    await service.start()
    yield core, service
    await service.stop()
    await core.shutdown()


def send_header(n: int) -> dict:
    props = wire.properties_to_string({"UNIQ_KEY": f"DEFERRED{n:024X}", "WAIT": "true"})
    return {"a": "PG", "b": TOPIC, "c": "TBW102", "d": 2, "e": n % 2, "f": 0, "g": int(time.time() * 1000),
            "h": 0, "i": props, "j": 0, "k": False}


async def test_no_answer_leaves_before_the_sends_it_acknowledges_are_written(broker, monkeypatch):
    core, service = broker
    client = await RemotingClient.connect(service.broker_address("broker-a"))
    listener = service.brokers["broker-a"]
    await async_wait_until(lambda: listener.connections, timeout=30, message="the broker took the connection")
    conn, = listener.connections
    # Each write to the socket: were records still waiting for the commit log then?
    unwritten_at_answer = []
    socket_write = conn.writer.write
    monkeypatch.setattr(conn.writer, "write",
                        lambda data: (unwritten_at_answer.append(bool(core.store._unwritten)), socket_write(data)))
    pwrites = []
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: (pwrites.append(len(data)), real_pwrite(fd, data, offset))[1])

    # One write from the client: a request answered at once (its answer is queued before
    # the sends are appended), then twenty sends - read by the broker together.
    first = client.endpoint.send(wire.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
    sends = [client.endpoint.send(wire.SEND_MESSAGE_V2, send_header(n), b"m" * 1000) for n in range(20)]
    answers = await asyncio.wait_for(asyncio.gather(first, *sends), 30)
    await client.close()

    assert [a.code for a in answers] == [wire.SUCCESS] * 21
    assert unwritten_at_answer and not any(unwritten_at_answer), "an answer left before its send was written"
    assert 0 < len(pwrites) < 20, f"the sends of one read were written together, not one by one: {pwrites}"
    stored = [core.store.read_message((TOPIC, "broker-a", q), i) for q in (0, 1) for i in range(10)]
    assert sorted(m.message_id for m in stored) == sorted(f"DEFERRED{n:024X}" for n in range(20))
