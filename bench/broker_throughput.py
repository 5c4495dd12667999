"""Broker throughput: N messages of 1 KiB sent and consumed end to end, two ways.

(a) the official rocketmq-python-client: Producer.send_async + SimpleConsumer receive/ack;
(b) batched raw stubs: v2 SendMessage carrying many messages per call + LabAdmin.PullBatch
    (8 queues, one producer task with 2 calls in flight and one long-polling puller per queue).

Starts its own broker (``manage.py runbroker``) on a free loopback port in a temp dir,
prints msgs/s for each and the ratio, and stops by itself.

    .venv/bin/python bench/broker_throughput.py [--messages 100000] [--official-messages 5000]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from tests.brokers import BrokerProcess  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 8
BODY = b"x" * 1024


def bench_official(address: str, n: int) -> float:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    cfg = ClientConfiguration(address, Credentials())
    producer = Producer(cfg, (TOPIC,))
    producer.startup()
    consumer = SimpleConsumer(cfg, "bench-official", {TOPIC: FilterExpression()}, await_duration=2)
    consumer.startup()
    received = 0
    lock = threading.Lock()
    done = threading.Event()

    def consume():
        # Several receivers, as an application would run; ack is synchronous
        # (the client's ack_async needs an event loop in the calling thread).
        nonlocal received
        while not done.is_set():
            for m in consumer.receive(32, 30):
                consumer.ack(m)
                with lock:
                    received += 1
                    if received >= n:
                        done.set()

    start = time.perf_counter()
    threads = [threading.Thread(target=consume, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    futures = []
    for i in range(n):
        m = Message()
        m.topic = TOPIC
        m.body = BODY
        m.tag = "bench"
        futures.append(producer.send_async(m))
        if len(futures) >= 256:
            for f in futures:
                f.result()
            futures.clear()
    for f in futures:
        f.result()
    done.wait(300)
    elapsed = time.perf_counter() - start
    for t in threads:
        t.join(10)  # let in-flight receives finish before shutting the client down
    consumer.shutdown()
    producer.shutdown()
    return received / elapsed


async def bench_batched(address: str, n: int, send_batch: int = 128, pull_batch: int = 128) -> float:
    import grpc

    from consumers_app.protocol import lab, lab_grpc, v2, v2_grpc, v2_service

    channel = grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
    md = (("x-mq-client-id", "bench-batched"),)
    v2s = v2_grpc.MessagingServiceStub(channel)
    admin = lab_grpc.LabAdminStub(channel)
    group = f"bench-batched-{send_batch}-{pull_batch}"
    base = {}
    offsets = await admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic=TOPIC))
    for q in offsets.queues:
        base[q.queue.queue_id] = q.max_offset

    def make_request(start: int, count: int, qid: int):
        req = v2_service.SendMessageRequest()
        for i in range(count):
            m = req.messages.add(body=BODY)
            m.topic.name = TOPIC
            m.system_properties.tag = "bench"
            m.user_properties["__QUEUE"] = f"broker-a:{qid}"
        return req

    per_queue = n // QUEUES
    consumed = 0

    async def produce(qid: int):
        # Two calls in flight per queue keep the broker busy while a response travels.
        sent = 0
        full = make_request(0, send_batch, qid)  # built once: the broker stores each send anew
        pending = set()
        while sent < per_queue or pending:
            while sent < per_queue and len(pending) < 2:
                count = min(send_batch, per_queue - sent)
                req = full if count == send_batch else make_request(sent, count, qid)
                pending.add(asyncio.ensure_future(v2s.SendMessage(req, metadata=md)))
                sent += count
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                resp = d.result()
                assert resp.status.code == v2.Code.OK, resp.status

    async def consume(qid: int):
        nonlocal consumed
        offset = base.get(qid, 0)
        end = offset + per_queue
        while offset < end:
            resp = await admin.PullBatch(lab.PullBatchRequest(
                group=group, queue=lab.QueueRef(topic=TOPIC, broker_name="broker-a", queue_id=qid),
                offset=offset, max_messages=pull_batch, suspend_timeout_ms=5000, commit_offset=offset))
            offset = resp.next_begin_offset
            consumed += len(resp.messages)

    start = time.perf_counter()
    await asyncio.gather(*(produce(q) for q in range(QUEUES)), *(consume(q) for q in range(QUEUES)))
    elapsed = time.perf_counter() - start
    await channel.close()
    return consumed / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000, help="messages for the batched run")
    ap.add_argument("--official-messages", type=int, default=5_000, help="messages for the official-client run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="broker-bench-") as tmp:
        broker = BrokerProcess(Path(tmp), topics=[f"{TOPIC}:{QUEUES}"], extra_args=["--segment-size", str(256 << 20)])
        with broker:
            print(f"broker on {broker.address}, {os.cpu_count()} cpus, body 1 KiB")
            a = bench_official(broker.address, args.official_messages)
            print(f"(a) official client (Producer.send_async + SimpleConsumer): {args.official_messages} msgs, "
                  f"{a:,.0f} msgs/s")
            b = asyncio.run(bench_batched(broker.address, args.messages, send_batch=128, pull_batch=128))
            print(f"(b) batched stubs (SendMessage x128 + PullBatch x128):       {args.messages} msgs, "
                  f"{b:,.0f} msgs/s")
            b32 = asyncio.run(bench_batched(broker.address, args.messages // 2, send_batch=32, pull_batch=32))
            print(f"    same with RocketMQ's pullBatchSize (SendMessage x32 + PullBatch x32): "
                  f"{args.messages // 2} msgs, {b32:,.0f} msgs/s")
            print(f"ratio b/a: {b / a:.1f}x")
            try:
                print(f"load average during the run: {os.getloadavg()[0]:.1f} (other processes share the CPUs)")
            except OSError:
                pass


if __name__ == "__main__":
    main()
