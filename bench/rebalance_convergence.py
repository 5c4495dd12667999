"""Rebalance convergence: how long from a membership change until every queue is owned
exactly once again, across the group's consumers' current assignments.

For (consumers, queues) in (4,16), (16,64), (64,256), (128,1024): start a broker of our
own (free loopback port, temp dir), start that many of our push consumers in this one process
(one event loop, AVG, RocketMQ's default intervals: the periodic rebalance is 20 s, so
what is measured is the notice-driven path), then repeatedly make one leave gracefully
and one join. The clock starts when the group changes at the broker - when the leaver
sends its NotifyClientTermination, when the joiner sends its first Heartbeat (the
request that registers it) - not when shutdown()/start() is called: the leaver's own
goodbye work before that (stopping its loops, persisting its offsets) and the joiner's
channel set-up are not part of the group's convergence. It stops at the first
``assignment`` event after which every live consumer holds exactly what AVG gives it for
the new member list (which implies every queue owned exactly once); the check runs on
those events only, no polling, and re-checks only the consumer that sent the event.
Changes are spaced past RebalanceService's 1 s minInterval. Prints p50/p99/max per size.

    .venv/bin/python bench/rebalance_convergence.py [--changes 20] [--sizes 4x16,16x64,64x256,128x1024]
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

from tests.brokers import BrokerProcess  # noqa: E402

from consumers_app.allocate import get_strategy  # noqa: E402
from consumers_app.client import PushConsumer, PushConsumerConfig  # noqa: E402
from consumers_app.client.rebalance import allocate_sorted, mq_sort_key  # noqa: E402
from consumers_app.javastr import java_key  # noqa: E402
from consumers_app.events import EventEmitter  # noqa: E402
from consumers_app.message_queue import MessageQueue  # noqa: E402

BROKER = "broker-a"


class Convergence:
    """Watches assignment events; resolves when the live set matches its expected allocation.

    Each event re-checks only the consumer that sent it (the others' holdings have not
    moved), so the watch costs the shared event loop the same at 128 consumers as at 4:
    the figure is the group's, not the bench's own bookkeeping.
    """

    def __init__(self, group: str, queues: list[MessageQueue]):
        self.group = group
        self.queues = queues
        self.topic = queues[0].topic
        self.sorted_queues = sorted(queues, key=mq_sort_key)  # sorted once, not per consumer
        self.live: dict[str, PushConsumer] = {}
        self.expected: dict[str, set] = {}
        self.off: set[str] = set()   # live consumers not (yet) holding what they should
        self.waiter: asyncio.Future | None = None
        self.strategy = get_strategy("AVG")

    def expect(self, live: dict[str, PushConsumer]) -> asyncio.Future:
        self.live = dict(live)
        cids = sorted(self.live, key=java_key)
        self.expected = {cid: set(allocate_sorted(self.strategy, self.group, cid, self.sorted_queues, cids))
                         for cid in cids}
        if sorted(mq for share in self.expected.values() for mq in share) != sorted(self.queues):
            raise AssertionError("AVG's shares do not split the topic")
        self.off = {cid for cid in cids if not self.holds_expected(cid)}
        self.waiter = asyncio.get_running_loop().create_future()
        self.check()
        return self.waiter

    def holds_expected(self, cid: str) -> bool:
        table = self.live[cid].rebalance_impl.process_queue_table   # ProcessQueues held now
        mine = {mq for mq, pq in table.items() if mq.topic == self.topic and not pq.dropped}
        return mine == self.expected[cid]

    def check(self) -> None:
        # Every live consumer holds exactly its share, and the shares split the topic
        # (checked in expect): every queue owned exactly once.
        if self.waiter is not None and not self.waiter.done() and not self.off:
            self.waiter.set_result(time.perf_counter())

    def on_event(self, event) -> None:
        if event.type == "assignment" and event.group == self.group and event.client_id in self.live:
            if self.holds_expected(event.client_id):
                self.off.discard(event.client_id)
            else:
                self.off.add(event.client_id)
            self.check()


def consumer(addr: str, group: str, topic: str, cid: str, emitter) -> PushConsumer:
    return PushConsumer(group, topic, None, PushConsumerConfig(endpoints=addr, client_id=cid), emitter=emitter)


def clock_on_call(client, method: str, box: dict) -> None:
    """Record in ``box["t0"]`` when ``client.<method>`` is first called (the request that
    changes the group is sent right after)."""
    inner = getattr(client, method)

    async def timed(*args, **kwargs):
        box.setdefault("t0", time.perf_counter())
        return await inner(*args, **kwargs)

    setattr(client, method, timed)


async def measure(addr: str, n: int, q: int, changes: int) -> dict:
    topic = f"Conv{q}"
    group = f"GID_CONV_{n}x{q}"
    queues = [MessageQueue(topic, BROKER, i) for i in range(q)]
    emitter = EventEmitter(keep=100)
    conv = Convergence(group, queues)
    emitter.subscribe(conv.on_event)
    live: dict[str, PushConsumer] = {}
    seq = 0

    def next_id():
        nonlocal seq
        seq += 1
        return f"c{seq:04d}"

    started = time.perf_counter()
    for _ in range(n):
        c = consumer(addr, group, topic, next_id(), emitter)
        live[c.client_id] = c
    # Sixteen at a time: the set-up is not measured, and one by one 128 consumers take a
    # minute (each start waits behind the group's rebalance after the previous one); all
    # at once, their first route queries time out on a busy machine.
    starting = list(live.values())
    for i in range(0, len(starting), 16):
        await asyncio.gather(*(c.start() for c in starting[i:i + 16]))
    await asyncio.wait_for(conv.expect(live), 120)
    setup_s = time.perf_counter() - started

    samples = {"join": [], "leave": []}
    for i in range(changes):
        await asyncio.sleep(1.2)  # past minInterval (1 s) since everyone's last rebalance
        if i % 2 == 0:
            victim = live.pop(sorted(live)[(i * 7) % len(live)])
            waiter = conv.expect(live)
            box: dict = {}
            clock_on_call(victim, "notify_termination", box)
            await victim.shutdown()
            kind = "leave"
        else:
            c = consumer(addr, group, topic, next_id(), emitter)
            live[c.client_id] = c
            waiter = conv.expect(live)
            box = {}
            clock_on_call(c, "send_heartbeat", box)
            await c.start()
            kind = "join"
        t1 = await asyncio.wait_for(waiter, 60)
        samples[kind].append((t1 - box["t0"]) * 1000)
    for c in live.values():
        await c.shutdown()
    return {"setup_s": setup_s, **samples}


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=20, help="membership changes per size (half leaves, half joins)")
    ap.add_argument("--sizes", default="4x16,16x64,64x256,128x1024")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    topics = [f"Conv{q}:{q}@{BROKER}" for _, q in sizes]
    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp), topics=topics) as broker:
        print(f"{'consumers x queues':>20} {'changes':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
              f" {'join p50':>9} {'leave p50':>10}")
        for n, q in sizes:
            result = asyncio.run(measure(broker.address, n, q, args.changes))
            every = result["join"] + result["leave"]
            print(f"{f'{n} x {q}':>20} {len(every):>8} {pct(every, 50):>8.1f} {pct(every, 99):>8.1f}"
                  f" {max(every):>8.1f} {pct(result['join'], 50):>9.1f} {pct(result['leave'], 50):>10.1f}"
                  f"   (start-up of {n}: {result['setup_s']:.1f} s)")


if __name__ == "__main__":
    main()
