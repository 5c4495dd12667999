"""Broker start-up with a big store: consume-queue files + checkpoint vs the full scan.

Fills a data dir with N messages of 1 KiB (default 2,000,000; topic BenchTopic, 8 queues)
by appending in process through MessageStore - the broker's own store code, without
the network - and closing it as a broker stop does (consume-queue files + checkpoint
written). Then it times ``manage.py runbroker`` from process start to its
``broker listening on`` line, each run twice: as it starts normally (checkpoint), then with
the checkpoint deleted (the full scan of the commit log, the fallback). After each start
it asks the broker how many messages its queues hold (all N, both ways), and it prints
what the broker logged about its recovery. An empty store's start-up is timed first: the
fixed cost (interpreter, Django, gRPC) every figure includes.

Bounded (a timeout per start), and the temp dir is removed at the end (unless --dir).

    .venv/bin/python bench/broker_startup.py [--messages 2000000] [--runs 1] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
os.environ["LAB_LOG_LEVEL"] = "INFO"   # the broker's INFO lines say how it recovered (inherited)

from consumers_app.broker.store import MessageStore  # noqa: E402
from consumers_app.broker.topics import TopicManager  # noqa: E402
from consumers_app.protocol import lab  # noqa: E402
from tests.brokers import BrokerProcess  # noqa: E402
from tests.brokers import BrokerStubs  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 8
BROKER = "broker-a"
SEGMENT = 128 << 20          # the broker's default --segment-size
BATCH = 1000
BODY = b"b" * 1024
# Retention must not delete the store between runs (the default bound is 1 GiB).
BROKER_ARGS = ["--segment-size", str(SEGMENT), "--retention-mb", str(1 << 30)]


def fill(data: Path, n: int) -> None:
    topics = TopicManager(data, BROKER)
    topics.create(TOPIC, QUEUES, BROKER, 0)   # created at offset 0: the broker keeps every record
    topics.save()
    store = MessageStore(data, segment_size=SEGMENT)
    store.recover()
    already = sum(cq.max_offset for cq in store.queues.values())
    if already:
        print(f"reusing {already:,} messages in {data}")
        store.close()
        return
    keys = [(TOPIC, BROKER, q) for q in range(QUEUES)]
    # A message as a v2 send stores it (id, tag, a key, born time and host, 1 KiB body).
    # The objects are reused: append() rewrites queue, offset and store time of each.
    pool = []
    for _ in range(BATCH):
        m = lab.LabMessage(tag="TagA", body=BODY, born_ts=int(time.time() * 1000))
        m.keys.append("order-1")
        m.properties["__BORNHOST"] = "127.0.0.1:50000"
        pool.append(m)
    started = time.perf_counter()
    step = max(n // 10, 1)
    for i in range(0, n, BATCH):
        items = []
        for j, m in enumerate(pool[:min(BATCH, n - i)]):
            k = i + j
            m.message_id = f"01BE{k:028X}"
            items.append((keys[k % QUEUES], m))
        store.append(items)
        if (i + BATCH) // step != i // step:
            print(f"  filled {min(i + BATCH, n):,} / {n:,} ({time.perf_counter() - started:.0f} s)", flush=True)
    store.close()   # as a broker's stop: fsync, consume-queue files, checkpoint
    size = sum(s.stat().st_size for s in (data / "commitlog").iterdir())
    print(f"filled {n:,} messages in {time.perf_counter() - started:.1f} s: commit log {size / 2**30:.2f} GiB "
          f"in {len(list((data / 'commitlog').iterdir()))} segments")


def timed_start(data: Path, topics, expect: int | None) -> tuple[float, str]:
    """Seconds from process start to the ready line, and the broker's recovery log line."""
    broker = BrokerProcess(data, topics=topics, extra_args=BROKER_ARGS, startup_timeout=600)
    started = time.perf_counter()
    try:
        broker.start()
        elapsed = time.perf_counter() - started
        if expect is not None:
            stubs = BrokerStubs(broker.address, "startup-bench")
            resp = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic=TOPIC))
            stubs.close()
            held = sum(q.max_offset - q.min_offset for q in resp.queues)
            assert held == expect, f"the broker holds {held} messages, expected {expect}"
        line = next((ln.split(": ", 1)[-1] for ln in broker.output if "store recovery" in ln), "?")
        return elapsed, line
    finally:
        code = broker.stop(timeout=120)
        assert code == 0, f"broker exited {code}:\n" + "\n".join(broker.output[-20:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=1, help="checkpoint + full-scan start-ups each")
    parser.add_argument("--dir", type=Path, default=None,
                        help="data dir to fill (or reuse if filled) and keep; default: a temp dir, removed")
    args = parser.parse_args()
    tmp = None
    if args.dir is None:
        tmp = tempfile.mkdtemp(prefix="broker-startup-")
        root = Path(tmp)
    else:
        root = args.dir
        root.mkdir(parents=True, exist_ok=True)
    try:
        empty, _ = timed_start(root / "empty", [f"{TOPIC}:{QUEUES}"], 0)
        print(f"empty store: ready in {empty:.2f} s (the fixed cost)")
        data = root / "store"
        data.mkdir(exist_ok=True)
        fill(data, args.messages)
        topics = [f"{TOPIC}:{QUEUES}"]
        ckpt, full = [], []
        for run in range(args.runs):
            t, line = timed_start(data, topics, args.messages)
            ckpt.append(t)
            print(f"run {run + 1}: checkpoint  ready in {t:6.2f} s  [{line}]", flush=True)
            (data / "consumequeue" / "checkpoint").unlink()
            t, line = timed_start(data, topics, args.messages)
            full.append(t)
            print(f"run {run + 1}: full scan   ready in {t:6.2f} s  [{line}]", flush=True)
        print(f"\nrunbroker start to 'broker listening on' with {args.messages:,} messages of 1 KiB:")
        print(f"  checkpoint: {statistics.median(ckpt):.2f} s (median of {len(ckpt)}; min {min(ckpt):.2f})")
        print(f"  full scan:  {statistics.median(full):.2f} s (median of {len(full)}; min {min(full):.2f})")
        print(f"  empty store: {empty:.2f} s")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
