"""ProcessQueue: the consumer-side cache of one assigned message queue.

As RocketMQ's ProcessQueue: messages pulled and not yet consumed, keyed by queue offset
(``msgTreeMap``), with the count, body bytes and span (last - first offset) that flow
control looks at, the ``dropped`` flag rebalance sets when the queue moves away, and
for orderly consumption the messages being consumed (``consumingMsgOrderlyTreeMap``)
plus the broker lock state.

All mutation happens on the event loop, so no lock is needed (Java guards the tree map
with a read-write lock because pull callbacks and consume threads touch it).

Offsets arrive in increasing order per queue (pulls are sequential), so a plain dict
(insertion ordered) plus a deque of offsets with lazy deletion gives TreeMap's
firstKey/lastKey cheaply. The one out-of-order insert, orderly's "consume again",
puts the lowest offsets back at the front.
"""
from __future__ import annotations

import time
from collections import deque


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ProcessQueue:
    __slots__ = (
        "msgs", "_order", "msg_count", "msg_size", "queue_offset_max", "dropped",
        "last_pull_ts", "last_consume_ts", "consuming", "consuming_orderly",
        "locked", "last_lock_ts", "try_unlock_times", "consume_lock", "inflight",
        "msg_acc_cnt",
    )

    def __init__(self):
        self.msgs: dict[int, object] = {}       # offset -> message (msgTreeMap)
        self._order: deque[int] = deque()       # offsets ascending, lazily pruned
        self.msg_count = 0
        self.msg_size = 0                       # body bytes
        self.queue_offset_max = 0
        self.dropped = False
        self.last_pull_ts = _now_ms()
        self.last_consume_ts = _now_ms()
        self.consuming = False                  # orderly: a consume request is scheduled
        self.consuming_orderly: dict[int, object] = {}  # consumingMsgOrderlyTreeMap
        self.locked = False
        self.last_lock_ts = _now_ms()
        self.try_unlock_times = 0
        self.consume_lock = None                # orderly: asyncio.Lock, set by the consume service
        self.inflight = 0                       # messages handed to listeners, not yet done
        self.msg_acc_cnt = 0                    # broker max offset - last pulled offset

    # ------------------------------------------------------------------ cache

    def put_messages(self, msgs, offsets=None) -> bool:
        """Add pulled messages; return dispatchToConsume (orderly: start a consume request)."""
        table = self.msgs
        order = self._order
        added = 0
        size = 0
        for msg in msgs:
            offset = msg.pb.queue_offset
            if offset not in table:
                table[offset] = msg
                order.append(offset)
                added += 1
                size += len(msg.pb.body)
                self.queue_offset_max = offset
        self.msg_count += added
        self.msg_size += size
        dispatch = False
        if table and not self.consuming:
            dispatch = True
            self.consuming = True
        return dispatch

    def remove_messages(self, offsets) -> int:
        """Drop consumed messages; return the offset to commit (removeMessage).

        -1 if the cache was empty; else the lowest offset still cached, or
        queue_offset_max + 1 when nothing is left: the consumer has everything below.
        """
        table = self.msgs
        if not table:
            return -1
        result = self.queue_offset_max + 1
        removed = 0
        size = 0
        for offset in offsets:
            msg = table.pop(offset, None)
            if msg is not None:
                removed += 1
                size += len(msg.pb.body)
        self.msg_count -= removed
        self.msg_size -= size
        self.last_consume_ts = _now_ms()
        first = self.first_offset()
        if first is not None:
            result = first
        return result

    def first_offset(self) -> int | None:
        order = self._order
        table = self.msgs
        while order and order[0] not in table:
            order.popleft()
        return order[0] if order else None

    def last_offset(self) -> int | None:
        order = self._order
        table = self.msgs
        while order and order[-1] not in table:
            order.pop()
        return order[-1] if order else None

    @property
    def max_span(self) -> int:
        """lastKey - firstKey of the cached messages (getMaxSpan)."""
        if not self.msgs:
            return 0
        return self.last_offset() - self.first_offset()

    def clear(self) -> None:
        self.msgs.clear()
        self._order.clear()
        self.consuming_orderly.clear()
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = 0

    def is_pull_expired(self, max_idle_ms: int) -> bool:
        return _now_ms() - self.last_pull_ts > max_idle_ms

    def is_lock_expired(self, max_live_ms: int) -> bool:
        return _now_ms() - self.last_lock_ts > max_live_ms

    # ------------------------------------------------------------------ orderly

    def take_messages(self, batch_size: int) -> list:
        """Move up to batch_size lowest-offset messages into the consuming map."""
        result = []
        table = self.msgs
        order = self._order
        while len(result) < batch_size:
            while order and order[0] not in table:
                order.popleft()
            if not order:
                break
            offset = order.popleft()
            msg = table.pop(offset)
            self.consuming_orderly[offset] = msg
            result.append(msg)
        if not result:
            self.consuming = False
        return result

    def commit(self) -> int:
        """Orderly success: forget the consuming messages; return the next offset (or -1)."""
        consuming = self.consuming_orderly
        if not consuming:
            return -1
        offset = max(consuming)
        self.msg_count -= len(consuming)
        self.msg_size -= sum(len(m.pb.body) for m in consuming.values())
        consuming.clear()
        self.last_consume_ts = _now_ms()
        return offset + 1

    def make_message_to_consume_again(self, msgs) -> None:
        """Orderly failure: put messages back at the front, in offset order."""
        for msg in sorted(msgs, key=lambda m: m.pb.queue_offset, reverse=True):
            offset = msg.pb.queue_offset
            self.consuming_orderly.pop(offset, None)
            self.msgs[offset] = msg
            self._order.appendleft(offset)

    # ------------------------------------------------------------------ figures

    def figures(self, committed_offset: int, pull_offset: int) -> dict:
        """The dashboard's per-queue numbers (the ``pq`` event fields)."""
        return {
            "cached_count": self.msg_count,
            "cached_bytes": self.msg_size,
            "span": self.max_span,
            "inflight": self.inflight,
            "committed_offset": committed_offset,
            "pull_offset": pull_offset,
        }
