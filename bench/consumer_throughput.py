"""Push-consumer throughput: our PushConsumer vs the official rocketmq-python-client PushConsumer.

Same broker, same run, same backlog: the script starts its own broker (free loopback
port, temp data dir), pre-fills TopicTest (8 queues) with 1 KiB messages, then lets
each consumer drain the backlog in its own consumer group (CONSUME_FROM_FIRST_OFFSET
for ours; the official client pops from the group's start) and reports end-to-end
msgs/s (first message to last) and the ratio. Bounded: the official client gets at
most --official-seconds.

    .venv/bin/python bench/consumer_throughput.py [--messages 200000] [--profile]
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.brokers import BrokerProcess  # noqa: E402

from consumers_app.client import (ConsumeFromWhere, ConsumeResult, Producer, ProducerConfig,  # noqa: E402
                                  PushConsumer, PushConsumerConfig)

TOPIC = "TopicTest"


class Counter:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = 0
        self.first = None
        self.last = None

    def hit(self, k=1):
        now = time.perf_counter()
        with self.lock:
            if self.first is None:
                self.first = now
            self.n += k
            self.last = now

    def rate(self) -> float:
        if not self.n or self.last == self.first:
            return 0.0
        return self.n / (self.last - self.first)


async def prefill(addr: str, total: int) -> float:
    producer = Producer(ProducerConfig(endpoints=addr, topic=TOPIC, batch_size=256, message_size=1024))
    await producer.start()
    started = time.perf_counter()
    body = b"x" * 1024
    per_task = total // 4
    await asyncio.gather(*(producer.send(per_task, body=body) for _ in range(4)))
    if total % 4:
        await producer.send(total % 4, body=body)
    elapsed = time.perf_counter() - started
    await producer.shutdown()
    return total / elapsed


async def run_ours(addr: str, total: int, profile: bool) -> Counter:
    counter = Counter()

    def listener(msgs):
        counter.hit(len(msgs))
        return ConsumeResult.SUCCESS

    config = PushConsumerConfig(endpoints=addr, client_id="bench-ours",
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer = PushConsumer("GID_BENCH_OURS", TOPIC, listener, config)
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    await consumer.start()
    deadline = time.monotonic() + 120
    while counter.n < total and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await consumer.shutdown()
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return counter


def run_official(addr: str, total: int, seconds: float) -> Counter:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, PushConsumer as OfficialPush
    from rocketmq.v5.consumer.push.message_listener import ConsumeResult as OfficialResult
    from rocketmq.v5.consumer.push.message_listener import MessageListener

    counter = Counter()

    class Listener(MessageListener):
        def consume(self, message):
            counter.hit()
            return OfficialResult.SUCCESS

    consumer = OfficialPush(ClientConfiguration(addr, Credentials()), "GID_BENCH_OFFICIAL", Listener(),
                            {TOPIC: FilterExpression()})
    consumer.startup()
    deadline = time.monotonic() + seconds
    while counter.n < total and time.monotonic() < deadline:
        time.sleep(0.1)  # noqa: sleep-ok - a benchmark's polling, not a test
    consumer.shutdown()
    return counter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--official-messages", type=int, default=50_000)
    ap.add_argument("--official-seconds", type=float, default=40.0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--skip-official", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            BrokerProcess(Path(tmp), topics=[f"{TOPIC}:8@broker-a"]) as broker:
        fill_rate = asyncio.run(prefill(broker.address, args.messages))
        print(f"pre-filled {args.messages} x 1 KiB at {fill_rate:,.0f} msgs/s")
        ours = asyncio.run(run_ours(broker.address, args.messages, args.profile))
        print(f"ours:     {ours.n:>8} msgs  {ours.rate():>10,.0f} msgs/s")
        if args.skip_official:
            return
        official = run_official(broker.address, min(args.official_messages, args.messages), args.official_seconds)
        print(f"official: {official.n:>8} msgs  {official.rate():>10,.0f} msgs/s")
        if official.rate():
            print(f"ratio ours/official: {ours.rate() / official.rate():.1f}x")


if __name__ == "__main__":
    main()
