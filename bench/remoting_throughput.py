"""Remoting throughput: send and pull through our broker's RocketMQ remoting port, and each
remoting peer's consumer next to ours on the same broker in the same run.

The script starts its own broker (free loopback ports, temp data dir, remoting on) and
measures, with 1 KiB messages:

1. remoting send: SEND_MESSAGE_V2 from one connection, --window requests in flight;
2. remoting pull: PULL_MESSAGE (32 per pull) over the 8 queues until the backlog is read;
3. ali-ons (Node.js) push consumer draining the backlog in a fresh group (its peer script
   prints one JSON line per message, which is part of its cost);
4. our PushConsumer draining the same backlog in a fresh group, over gRPC, then over
   remoting (ClientConfig.namesrv) in another fresh group.

Bounded: every phase stops at --seconds. Target: the broker is never the limit for a peer
(its send/pull rates stay far above any peer's consume rate).

    .venv/bin/python bench/remoting_throughput.py [--messages 50000]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from consumers_app.remoting import wire  # noqa: E402
from consumers_app.remoting.client import RemotingClient, broker_addresses  # noqa: E402
from consumers_app.client import ConsumeFromWhere, ConsumeResult, PushConsumer, PushConsumerConfig  # noqa: E402
from tests.brokers import BrokerProcess  # noqa: E402
from tests.remoting_peers import ALI_ONS, AliOns  # noqa: E402

TOPIC, QUEUES = "BenchRemoting", 8


async def route_address(namesrv: str) -> str:
    return (await broker_addresses(namesrv, TOPIC))["broker-a"]


async def send(addr: str, total: int, window: int, deadline: float) -> tuple[int, float]:
    client = await RemotingClient.connect(addr)
    body = b"x" * 1024
    props = wire.properties_to_string({"TAGS": "bench", "WAIT": "true"})
    started, sent, inflight = time.perf_counter(), 0, set()
    while sent < total and time.monotonic() < deadline:
        while len(inflight) < window and sent < total:
            ext = {"a": "PG_BENCH", "b": TOPIC, "c": "TBW102", "d": 4, "e": sent % QUEUES, "f": 0,
                   "g": int(time.time() * 1000), "h": 0, "i": props, "j": 0, "k": False}
            inflight.add(client.send(wire.SEND_MESSAGE_V2, ext, body))
            sent += 1
        done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        bad = [f.result().code for f in done if f.result().code != wire.SUCCESS]
        if bad:
            raise RuntimeError(f"send failed with codes {set(bad)}")
    await asyncio.gather(*inflight)
    elapsed = time.perf_counter() - started
    await client.close()
    return sent, elapsed


async def pull(addr: str, total: int, deadline: float) -> tuple[int, float]:
    client = await RemotingClient.connect(addr)
    offsets, got = [0] * QUEUES, 0
    started = time.perf_counter()

    async def one_queue(qid):
        nonlocal got
        while time.monotonic() < deadline and got < total:
            answer = await client.request(wire.PULL_MESSAGE, {
                "consumerGroup": "GID_BENCH_PULL", "topic": TOPIC, "queueId": qid, "queueOffset": offsets[qid],
                "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": "*", "subVersion": 0})
            if answer.code != wire.SUCCESS:
                return
            offsets[qid] = int(answer.ext["nextBeginOffset"])
            got += answer.body.count(wire.MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True))

    await asyncio.gather(*(one_queue(q) for q in range(QUEUES)))
    elapsed = time.perf_counter() - started
    await client.close()
    return got, elapsed


def ali_ons_consume(namesrv: str, total: int, seconds: float) -> tuple[int, float]:
    peer = AliOns.consume(namesrv, "GID_BENCH_ALI_ONS", TOPIC)
    try:
        peer.wait_ready(60)
        deadline = time.monotonic() + seconds
        first = None
        while time.monotonic() < deadline:
            n = len(peer.lines)
            if n > 1 and first is None:
                first = time.perf_counter()
            if n > total:
                break
            time.sleep(0.05)  # noqa: sleep-ok - the bench samples a counter
        got = len(peer.messages)
        return got, (time.perf_counter() - first) if first else 0.0
    finally:
        peer.stop()


async def our_consume(group: str, total: int, seconds: float, **connect) -> tuple[int, float]:
    """Our PushConsumer draining the backlog in a fresh group; ``connect``: endpoints= (gRPC)
    or namesrv= (remoting)."""
    seen = {"n": 0, "first": None, "last": None}

    def listener(msgs):
        now = time.perf_counter()
        seen["first"] = seen["first"] or now
        seen["n"] += len(msgs)
        seen["last"] = now
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(group, TOPIC, listener, PushConsumerConfig(
        client_id=f"bench-{group}", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **connect))
    await consumer.start()
    deadline = time.monotonic() + seconds
    while seen["n"] < total and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # noqa: sleep-ok - the bench samples a counter
    await consumer.shutdown()
    return seen["n"], (seen["last"] - seen["first"]) if seen["first"] else 0.0


def rate(n, s) -> str:
    return f"{n / s:,.0f} msgs/s ({n:,} in {s:.2f} s)" if s > 0 else f"{n:,} messages, no rate"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=256, help="sends in flight")
    parser.add_argument("--seconds", type=float, default=120, help="bound of each phase")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp), topics=[f"{TOPIC}:{QUEUES}"],
                                                             remoting=True) as broker:
        addr = asyncio.run(route_address(broker.namesrv))
        n, s = asyncio.run(send(addr, args.messages, args.window, time.monotonic() + args.seconds))
        print(f"remoting send (1 KiB, {args.window} in flight): {rate(n, s)}", flush=True)
        total = n
        n, s = asyncio.run(pull(addr, total, time.monotonic() + args.seconds))
        print(f"remoting pull (32 per pull, 8 queues): {rate(n, s)}", flush=True)
        if ALI_ONS.is_dir():
            n, s = ali_ons_consume(broker.namesrv, total, args.seconds)
            print(f"ali-ons push consumer (remoting): {rate(n, s)}", flush=True)
        else:
            print("ali-ons push consumer: not installed (make node-peers)")
        n, s = asyncio.run(our_consume("GID_BENCH_OURS", total, args.seconds, endpoints=broker.address))
        print(f"our push consumer (gRPC): {rate(n, s)}", flush=True)
        n, s = asyncio.run(our_consume("GID_BENCH_OURS_REMOTING", total, args.seconds, namesrv=broker.namesrv))
        print(f"our push consumer (remoting): {rate(n, s)}", flush=True)


if __name__ == "__main__":
    main()
