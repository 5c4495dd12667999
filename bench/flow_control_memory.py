"""Flow control bounds memory: a 1M-message backlog must keep a worker under 300 MiB RSS.

The script starts its own broker (free loopback port, temp data dir), pre-fills
TopicTest (8 queues) with --messages 1 KiB messages, then starts a separate worker
process hosting --consumers push consumers of one group (CONSUME_FROM_FIRST_OFFSET),
so the whole backlog is theirs. Phase 1: the listener is slow (--slow-ms per message)
for --slow-seconds, so every ProcessQueue fills to pullThresholdForQueue and flow
control holds it there. Phase 2: the listener runs at full speed and drains the
backlog. The parent samples the worker's RSS from /proc every 100 ms and prints the
peak (and the kernel's high-water mark, VmHWM) with the consumed count. ``--remoting``:
the consumers pull over RocketMQ's remoting protocol (ClientConfig.namesrv), not gRPC.

    .venv/bin/python bench/flow_control_memory.py [--messages 1000000]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOPIC = "TopicTest"
GROUP = "GID_MEMORY"


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


async def prefill(addr: str, total: int) -> float:
    from consumers_app.client import Producer, ProducerConfig

    producer = Producer(ProducerConfig(endpoints=addr, topic=TOPIC, batch_size=256, message_size=1024))
    await producer.start()
    started = time.perf_counter()
    body = b"x" * 1024
    per_task, rest = divmod(total, 4)
    await asyncio.gather(*(producer.send(per_task, body=body) for _ in range(4)))
    if rest:
        await producer.send(rest, body=body)
    elapsed = time.perf_counter() - started
    await producer.shutdown()
    return total / elapsed


async def worker(addr: str, consumers: int, slow_ms: float, slow_seconds: float, total: int, deadline_s: float,
                 namesrv: str | None = None) -> None:
    """The worker process: push consumers sharing the backlog; prints progress lines."""
    import threading

    from consumers_app.client import ConsumeFromWhere, ConsumeResult, PushConsumer, PushConsumerConfig

    lock = threading.Lock()
    consumed = 0
    slow_until = time.monotonic() + slow_seconds

    def listener(msgs):
        nonlocal consumed
        if time.monotonic() < slow_until:
            time.sleep(slow_ms / 1000 * len(msgs))
        with lock:
            consumed += len(msgs)
        return ConsumeResult.SUCCESS

    clients = []
    for i in range(consumers):
        connect = {"namesrv": namesrv} if namesrv else {"endpoints": addr}
        config = PushConsumerConfig(**connect, client_id=f"mem-{i}",
                                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        clients.append(PushConsumer(GROUP, TOPIC, listener, config))
    for c in clients:
        await c.start()
    deadline = time.monotonic() + deadline_s
    while consumed < total and time.monotonic() < deadline:
        cached = sum(q.get("cached_count", 0) for c in clients for q in c.snapshot()["queues"].values())
        print(f"consumed {consumed} cached {cached}", flush=True)
        await asyncio.sleep(0.5)
    print(f"consumed {consumed} done", flush=True)
    for c in clients:
        await c.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--slow-ms", type=float, default=2.0)
    ap.add_argument("--slow-seconds", type=float, default=15.0)
    ap.add_argument("--deadline", type=float, default=240.0)
    ap.add_argument("--remoting", action="store_true", help="the consumers over remoting (name server)")
    ap.add_argument("--worker", metavar="ADDR", help=argparse.SUPPRESS)
    ap.add_argument("--worker-namesrv", metavar="ADDR", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        asyncio.run(worker(args.worker, args.consumers, args.slow_ms, args.slow_seconds, args.messages, args.deadline,
                           args.worker_namesrv))
        return

    from tests.brokers import BrokerProcess

    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp), topics=[f"{TOPIC}:8@broker-a"],
                                                             remoting=args.remoting) as broker:
        rate = asyncio.run(prefill(broker.address, args.messages))
        print(f"pre-filled {args.messages:,} x 1 KiB at {rate:,.0f} msgs/s")
        child = subprocess.Popen(
            [sys.executable, __file__, "--worker", broker.address, "--messages", str(args.messages),
             "--consumers", str(args.consumers), "--slow-ms", str(args.slow_ms),
             "--slow-seconds", str(args.slow_seconds), "--deadline", str(args.deadline),
             *(["--worker-namesrv", broker.namesrv] if args.remoting else [])],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        peak_rss = peak_hwm = 0
        last_line = ""
        next_report = time.monotonic()
        os.set_blocking(child.stdout.fileno(), False)
        while child.poll() is None:
            try:
                rss, hwm = rss_kib(child.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            peak_rss, peak_hwm = max(peak_rss, rss), max(peak_hwm, hwm)
            for line in child.stdout:
                last_line = line.strip()
            if last_line and time.monotonic() >= next_report:
                print(f"  worker: {last_line}  rss {rss / 1024:.0f} MiB", flush=True)
                next_report = time.monotonic() + 5
            time.sleep(0.1)  # noqa: sleep-ok - sampling interval of a benchmark
        # "consumed" counts deliveries: it may exceed the backlog by the redeliveries
        # around the start-up rebalances (at-least-once), as RocketMQ's would.
        print(f"worker: {last_line}")
        print(f"worker peak RSS {peak_rss / 1024:.0f} MiB (VmHWM {peak_hwm / 1024:.0f} MiB); "
              f"target < 300 MiB with a {args.messages:,}-message backlog")


if __name__ == "__main__":
    main()
