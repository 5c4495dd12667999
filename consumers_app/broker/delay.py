"""Delayed delivery: send-back delay levels and v2 delivery timestamps.

As RocketMQ stores a delayed message first in ``SCHEDULE_TOPIC_XXXX`` and moves it to
its real topic when due (ScheduleMessageService / TimerMessageStore), a delayed
message is appended to the broker's schedule queue with ``REAL_TOPIC``/``REAL_BROKER``
/``REAL_QID``/``TIMER_DELIVER_MS`` properties; a min-heap of due times drives the
delivery. What has been delivered is tracked as a watermark plus the set of delivered
offsets above it, persisted with the consumer offsets, so a restart rebuilds the heap
from the schedule queue and neither loses nor repeats deliveries.
"""
from __future__ import annotations

import asyncio
import heapq
import re
import time

from . import messages as M

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 10s 30s 1m ..."`` -> delays in ms (level 1 is the first)."""
    out = []
    for item in text.split():
        m = re.fullmatch(r"(\d+)([smhd])", item)
        if not m:
            raise ValueError(f"bad delay level {item!r} (expected e.g. 5s, 2m, 1h)")
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise ValueError("no delay levels")
    return out


class DelayService:
    def __init__(self, core):
        self.core = core
        self.levels = parse_delay_levels(core.cfg.delay_levels)
        self._heap: list[tuple[int, str, int]] = []   # (due ms, broker, schedule offset)
        self.watermark: dict[str, int] = {}           # broker -> every offset below delivered
        self.delivered: dict[str, set[int]] = {}
        self._wake: asyncio.Event | None = None

    def level_delay_ms(self, level: int) -> int:
        level = max(1, min(level, len(self.levels)))
        return self.levels[level - 1]

    def schedule(self, broker: str, target: tuple | None, msg, due_ms: int):
        """Store ``msg`` now, deliver it to ``target`` (topic, broker, qid|None) when due."""
        topic = target[0] if target else msg.queue.topic
        self.core.topics.ensure_system_topic(SCHEDULE_TOPIC, broker, self.core.store.write_pos)
        held = M.derived(msg, **{M.P_REAL_TOPIC: topic, M.P_REAL_BROKER: target[1] if target else broker,
                                 M.P_REAL_QID: (target[2] if target and target[2] is not None else None),
                                 M.P_DELIVER_MS: due_ms})
        results = self.core.store.append([((SCHEDULE_TOPIC, broker, 0), held)])
        heapq.heappush(self._heap, (due_ms, broker, results[0][0]))
        if self._wake:
            self._wake.set()
        return results[0]

    def rebuild(self):
        """After store recovery: queue every undelivered schedule entry again."""
        store = self.core.store
        for (topic, broker, qid), cq in store.queues.items():
            if topic != SCHEDULE_TOPIC:
                continue
            done = self.delivered.setdefault(broker, set())
            if self.watermark.get(broker, 0) < cq.min_offset:
                # Retention deleted schedule entries (delivered or not, as RocketMQ's does):
                # nothing below the min offset is left to deliver.
                self.watermark[broker] = cq.min_offset
                done = self.delivered[broker] = {off for off in done if off >= cq.min_offset}
            for off in range(self.watermark.get(broker, 0), cq.max_offset):
                if off in done:
                    continue
                msg = store.read_message((topic, broker, qid), off)
                heapq.heappush(self._heap, (int(msg.properties.get(M.P_DELIVER_MS, "0")), broker, off))

    def _deliver_due(self):
        now = int(time.time() * 1000)
        store = self.core.store
        while self._heap and self._heap[0][0] <= now:
            _, broker, off = heapq.heappop(self._heap)
            msg = store.read_message((SCHEDULE_TOPIC, broker, 0), off)
            if msg is not None:
                self.core.deliver_scheduled(msg)
            self._mark(broker, off)

    def _mark(self, broker, off):
        done = self.delivered.setdefault(broker, set())
        done.add(off)
        wm = self.watermark.get(broker, 0)
        while wm in done:
            done.discard(wm)
            wm += 1
        self.watermark[broker] = wm

    async def run(self):
        self._wake = asyncio.Event()
        while True:
            self._deliver_due()
            timeout = None
            if self._heap:
                timeout = max(0.0, (self._heap[0][0] - time.time() * 1000) / 1000)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    def dump(self):
        return {b: [self.watermark.get(b, 0), sorted(self.delivered.get(b, ()))]
                for b in set(self.watermark) | set(self.delivered)}

    def restore(self, data):
        for b, (wm, done) in data.items():
            self.watermark[b] = wm
            self.delivered[b] = set(done)
