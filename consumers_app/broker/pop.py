"""POP consumption (RocketMQ 5): receive with an invisible time, ack, change invisible
duration, revive to the retry topic, dead-letter after the max attempts.

As in RocketMQ's broker (PopMessageProcessor / AckMessageProcessor / PopReviveService):

* a pop moves the group's offset of the queue forward at once and records one
  *checkpoint* per popped message (here: an in-memory ``Inflight`` entry, persisted with
  the consumer offsets so a restarted broker still revives what was not acked);
* an ack removes the checkpoint; ChangeInvisibleDuration replaces it (new handle);
* when a checkpoint's invisible time passes, the revive pass re-writes the message to
  ``%RETRY%{group}_{topic}`` with ``reconsume_times + 1`` (or to ``%DLQ%{group}`` once the
  delivery attempts reach the max) - the consumer then gets it again from the retry topic;
* a pop takes a per (group, topic, queue) lock (QueueLockManager) so two pops never
  take the same message, even if a read ever awaits.

Ordered (fifo) groups differ, as RocketMQ's ConsumerOrderInfoManager does: a queue
with un-acked messages is blocked for the group, and an expired message is delivered
again *in place* (same queue, same offset, attempt + 1) instead of via the retry topic.

Receipt handles are readable strings (``topic broker qid offset seq pop_ts invisible``)
with a CRC so a damaged or invented handle is rejected (INVALID_RECEIPT_HANDLE).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import random
import time
import zlib
from dataclasses import dataclass

from ..protocol import lab
from . import messages as M
from .topics import dlq_topic, pop_retry_topic

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


class HandleError(ValueError):
    pass


@dataclass(frozen=True)
class Handle:
    topic: str
    broker: str
    qid: int
    offset: int
    seq: int
    pop_ts: int
    invisible_ms: int

    @property
    def deadline(self) -> int:
        return self.pop_ts + self.invisible_ms

    def encode(self) -> str:
        body = f"{self.topic} {self.broker} {self.qid} {self.offset} {self.seq} {self.pop_ts} {self.invisible_ms}"
        return f"{body} {zlib.crc32(body.encode()) & 0xFFFFFFFF:08x}"

    @classmethod
    def decode(cls, text: str) -> "Handle":
        parts = (text or "").split(" ")
        if len(parts) != 8:
            raise HandleError("receipt handle is malformed")
        body = " ".join(parts[:7])
        if f"{zlib.crc32(body.encode()) & 0xFFFFFFFF:08x}" != parts[7]:
            raise HandleError("receipt handle checksum mismatch (damaged or not issued by this broker)")
        try:
            return cls(parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4]), int(parts[5]),
                       int(parts[6]))
        except ValueError:
            raise HandleError("receipt handle is malformed") from None


@dataclass
class Inflight:
    group: str
    key: tuple          # (topic, broker, qid) actually read (may be a retry topic)
    offset: int
    seq: int
    deadline: int       # wall-clock ms
    reconsume: int      # reconsume times of the delivered message
    client_id: str
    auto_renew: bool
    fifo: bool = False


class PopService:
    def __init__(self, core):
        self.core = core
        self.cfg = core.cfg
        self.inflight: dict[tuple, Inflight] = {}         # (group, topic, broker, qid, offset) -> entry
        self.counts: dict[tuple, int] = {}               # (group, topic, broker, qid) -> inflight count
        self._heap: list[tuple[int, int, tuple]] = []     # (due ms, seq, inflight key)
        self._seq = itertools.count(int(time.time() * 1000) % 1_000_000_000)
        self._busy: set[tuple] = set()                   # pop locks (group, topic, broker, qid)
        self._rotation: dict[tuple, int] = {}
        self.fifo_next: dict[tuple, int] = {}            # (group, topic, broker, qid) -> next pop offset
        self.fifo_attempts: dict[tuple, int] = {}        # (group, topic, broker, qid, offset) -> deliveries
        self.group_max_attempts: dict[str, int] = {}     # from the clients' Settings (Telemetry)
        self.stats = {"received": 0, "acked": 0, "revived": 0, "dlq": 0}

    # ---------------------------------------------------------------- helpers

    def max_attempts(self, group: str) -> int:
        return self.group_max_attempts.get(group) or self.cfg.pop_max_attempts

    def is_fifo(self, group: str) -> bool:
        return bool(self.core.topics.group_config(group).get("fifo"))

    def _add(self, entry: Inflight):
        k = (entry.group, *entry.key, entry.offset)
        old = self.inflight.get(k)
        if old is None:
            ck = (entry.group, *entry.key)
            self.counts[ck] = self.counts.get(ck, 0) + 1
        self.inflight[k] = entry
        heapq.heappush(self._heap, (self._due(entry), entry.seq, k))

    def _due(self, entry: Inflight) -> int:
        if entry.auto_renew:
            # Renew a little ahead of the deadline, as the proxy's receipt-handle renewer does.
            return entry.deadline - min(self.cfg.renew_ahead_ms, self.cfg.default_invisible_ms // 2)
        return entry.deadline

    def _remove(self, k: tuple) -> Inflight | None:
        entry = self.inflight.pop(k, None)
        if entry is not None:
            ck = (entry.group, *entry.key)
            n = self.counts.get(ck, 0) - 1
            if n > 0:
                self.counts[ck] = n
            else:
                self.counts.pop(ck, None)
        return entry

    def inflight_count(self, group: str, key: tuple) -> int:
        return self.counts.get((group, *key), 0)

    # -------------------------------------------------------------------- pop

    def pop(self, group: str, topic: str, broker: str, qid: int, batch: int, invisible_ms: int,
            tag_filter, client_id: str, auto_renew: bool) -> list[tuple]:
        """Take up to ``batch`` messages. Returns [(LabMessage, handle str, attempt)].

        ``qid == -1`` pops from any queue of the broker (RocketMQ 5's default for a normal
        group). The retry topic is tried first with popFromRetryProbability, else after.
        """
        fifo = self.is_fifo(group)
        t = self.core.topics.get(topic)
        if t is None:
            return []
        if qid >= 0:
            normal = [(topic, broker, qid)]
        else:
            n = t.queues.get(broker, 0)
            rk = (group, topic, broker)
            start = self._rotation.get(rk, 0)
            self._rotation[rk] = start + 1
            normal = [(topic, broker, (start + i) % n) for i in range(n)]
        keys = list(normal)
        rt = pop_retry_topic(group, topic)
        if not fifo and self.core.topics.has_queue(rt, broker, 0):
            if random.randrange(100) < self.cfg.pop_retry_probability:
                keys.insert(0, (rt, broker, 0))
            else:
                keys.append((rt, broker, 0))
        out = []
        for key in keys:
            if len(out) >= batch:
                break
            lock = (group, *key)
            if lock in self._busy:
                continue
            self._busy.add(lock)
            try:
                if fifo:
                    self._take_fifo(group, key, batch - len(out), invisible_ms, tag_filter, client_id,
                                    auto_renew, out)
                else:
                    self._take(group, key, batch - len(out), invisible_ms, tag_filter, client_id,
                               auto_renew, out)
            finally:
                self._busy.discard(lock)
        self.stats["received"] += len(out)
        return out

    def _start_offset(self, group: str, key: tuple) -> int:
        off = self.core.offsets.get(group, key)
        if off < 0:
            # A new pop group starts at the queue's min offset (RocketMQ's
            # initPopOffsetByCheckMsgInMem: the messages are still in the store).
            cq = self.core.store.queue(key)
            off = cq.min_offset if cq else 0
        return off

    def _read(self, key, offset, count, tag_filter):
        codes = None if tag_filter is None else tag_filter[0]
        found, next_off = self.core.store.scan(key, offset, count, codes)
        msgs = []
        for off, raw in found:
            msg = lab.LabMessage.FromString(raw)
            if tag_filter is not None and msg.tag not in tag_filter[1]:
                continue  # hash collision: not really a match
            msgs.append((off, msg))
        return msgs, next_off

    def _take(self, group, key, want, invisible_ms, tag_filter, client_id, auto_renew, out):
        offset = self._start_offset(group, key)
        msgs, next_off = self._read(key, offset, want, tag_filter)
        if next_off != offset:
            self.core.offsets.commit(group, key, next_off)
        now = now_ms()
        for off, msg in msgs:
            seq = next(self._seq)
            entry = Inflight(group, key, off, seq, now + invisible_ms, msg.reconsume_times, client_id, auto_renew)
            self._add(entry)
            out.append((msg, Handle(*key, off, seq, now, invisible_ms).encode(), msg.reconsume_times + 1))

    def _take_fifo(self, group, key, want, invisible_ms, tag_filter, client_id, auto_renew, out):
        if self.inflight_count(group, key):
            return  # ordered: the queue is blocked until its popped messages are acked
        ck = (group, *key)
        offset = self.fifo_next.get(ck)
        if offset is None:
            offset = self._start_offset(group, key)
        msgs, next_off = self._read(key, offset, want, tag_filter)
        self.fifo_next[ck] = next_off
        if not msgs:
            if next_off != offset:  # only unmatched messages were skipped
                self.core.offsets.commit(group, key, next_off)
            return
        now = now_ms()
        for off, msg in msgs:
            seq = next(self._seq)
            attempt = self.fifo_attempts.get((*ck, off), 0) + 1
            self.fifo_attempts[(*ck, off)] = attempt
            entry = Inflight(group, key, off, seq, now + invisible_ms, attempt - 1, client_id, auto_renew, fifo=True)
            self._add(entry)
            out.append((msg, Handle(*key, off, seq, now, invisible_ms).encode(), msg.reconsume_times + attempt))

    # ------------------------------------------------------------ ack & change

    def _lookup(self, group: str, handle_text: str) -> tuple[Handle, tuple, Inflight | None]:
        h = Handle.decode(handle_text)
        k = (group, h.topic, h.broker, h.qid, h.offset)
        entry = self.inflight.get(k)
        if entry is not None and entry.seq != h.seq:
            entry = None  # superseded by ChangeInvisibleDuration / a later pop
        now = now_ms()
        # An auto-renewed message keeps its first handle valid (the proxy renews it
        # behind the client's back); any other handle dies with its invisible time.
        expired = h.deadline < now if entry is None else (not entry.auto_renew and entry.deadline < now)
        if expired:
            raise HandleError("receipt handle is expired (the invisible time has passed)")
        return h, k, entry

    def ack(self, group: str, handle_text: str):
        """Ack a message. Acking twice is fine, as on RocketMQ's broker."""
        h, k, entry = self._lookup(group, handle_text)
        if entry is None:
            return
        self._remove(k)
        self.stats["acked"] += 1
        if entry.fifo:
            self._fifo_advance(group, entry.key)

    def _fifo_advance(self, group, key):
        """Ordered: the committed offset is the lowest un-acked one."""
        ck = (group, *key)
        pending = [k[4] for k in self.inflight if k[:4] == ck]
        committed = min(pending) if pending else self.fifo_next.get(ck, self._start_offset(group, key))
        self.core.offsets.commit(group, key, committed)
        for k in [k for k in self.fifo_attempts if k[:4] == ck and k[4] < committed]:
            del self.fifo_attempts[k]

    def change_invisible(self, group: str, handle_text: str, invisible_ms: int) -> str:
        h, k, entry = self._lookup(group, handle_text)
        if entry is None:
            raise HandleError("the message of this receipt handle was already acked or its handle superseded")
        now = now_ms()
        self._remove(k)
        entry.seq = next(self._seq)
        entry.deadline = now + invisible_ms
        entry.auto_renew = False
        self._add(entry)
        return Handle(h.topic, h.broker, h.qid, h.offset, entry.seq, now, invisible_ms).encode()

    def forward_to_dlq(self, group: str, handle_text: str):
        h, k, entry = self._lookup(group, handle_text)
        if entry is None:
            raise HandleError("the message of this receipt handle was already acked or its handle superseded")
        msg = self.core.store.read_message(entry.key, entry.offset)
        self._remove(k)
        if msg is not None:
            self._to_dlq(group, entry.key, msg)
        if entry.fifo:
            self._fifo_advance(group, entry.key)

    # ------------------------------------------------------------------ revive

    def client_gone(self, group, joined, left, reason):
        """Stop auto-renewing for clients that left: their messages revive normally."""
        if not left:
            return
        gone = set(left)
        for entry in self.inflight.values():
            if entry.group == group and entry.auto_renew and entry.client_id in gone:
                entry.auto_renew = False
                heapq.heappush(self._heap, (entry.deadline, entry.seq, (group, *entry.key, entry.offset)))

    def revive_due(self) -> int:
        """One revive pass (PopReviveService): handle every checkpoint that is due."""
        now = now_ms()
        n = 0
        while self._heap and self._heap[0][0] <= now:
            _, seq, k = heapq.heappop(self._heap)
            entry = self.inflight.get(k)
            if entry is None or entry.seq != seq:
                continue
            if entry.auto_renew and self.core.membership.is_alive(entry.group, entry.client_id):
                entry.deadline = now + self.cfg.default_invisible_ms
                heapq.heappush(self._heap, (self._due(entry), entry.seq, k))
                continue
            if entry.deadline > now:
                heapq.heappush(self._heap, (entry.deadline, entry.seq, k))
                continue
            self._remove(k)
            self._revive(entry)
            n += 1
        return n

    def _revive(self, entry: Inflight):
        group = entry.group
        msg = self.core.store.read_message(entry.key, entry.offset)
        if msg is None:
            return
        self.stats["revived"] += 1
        attempts_done = entry.reconsume + 1
        if attempts_done >= self.max_attempts(group):
            self._to_dlq(group, entry.key, msg)
            if entry.fifo:
                self.fifo_attempts.pop((group, *entry.key, entry.offset), None)
                self._fifo_rewind(group, entry.key, after=entry.offset)
            return
        if entry.fifo:
            self._fifo_rewind(group, entry.key)
            return
        broker = entry.key[1]
        rt = pop_retry_topic(group, M.original_topic(msg))
        self.core.topics.ensure_system_topic(rt, broker, self.core.store.write_pos)
        again = M.derived(msg, **{M.P_RETRY_TOPIC: M.original_topic(msg),
                                  M.P_ORIGIN_MSG_ID: msg.properties.get(M.P_ORIGIN_MSG_ID, msg.message_id)})
        again.reconsume_times = msg.reconsume_times + 1
        self.core.store.append([((rt, broker, 0), again)])

    def _fifo_rewind(self, group, key, after=None):
        """Ordered: deliver again from the lowest un-acked offset (drop the others' checkpoints)."""
        ck = (group, *key)
        pending = sorted(k for k in self.inflight if k[:4] == ck)
        for k in pending:
            self._remove(k)
        committed = self.core.offsets.get(group, key)
        if after is not None and committed <= after:
            committed = after + 1
            self.core.offsets.commit(group, key, committed)
        self.fifo_next[ck] = committed if committed >= 0 else self._start_offset(group, key)
        self.core.longpoll.notify([key])

    def _to_dlq(self, group, key, msg):
        broker = key[1]
        dt = dlq_topic(group)
        self.core.topics.ensure_system_topic(dt, broker, self.core.store.write_pos)
        dead = M.derived(msg, **{M.P_DLQ_ORIGIN_TOPIC: M.original_topic(msg)})
        self.core.store.append([((dt, broker, 0), dead)])
        self.stats["dlq"] += 1

    # ------------------------------------------------------------- persistence

    def dump(self):
        return {
            "inflight": [[e.group, *e.key, e.offset, e.deadline, e.reconsume, e.client_id, e.auto_renew, e.fifo,
                          e.seq] for e in self.inflight.values()],
            "fifo_next": [[*k, v] for k, v in self.fifo_next.items()],
            "fifo_attempts": [[*k, v] for k, v in self.fifo_attempts.items()],
        }

    def restore(self, data):
        top = 0
        for g, t, b, q, off, deadline, reconsume, cid, renew, fifo, seq in data.get("inflight", []):
            # Same seq: handles issued before the restart still ack. Nobody renews after a
            # restart, though: an auto-renewed message revives at its deadline.
            self._add(Inflight(g, (t, b, q), off, seq, deadline, reconsume, cid, False, fifo))
            top = max(top, seq)
        self._seq = itertools.count(max(top + 1, next(self._seq)))
        for g, t, b, q, v in data.get("fifo_next", []):
            self.fifo_next[(g, t, b, q)] = v
        for g, t, b, q, off, v in data.get("fifo_attempts", []):
            self.fifo_attempts[(g, t, b, q, off)] = v
