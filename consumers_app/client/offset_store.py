"""Consumer offset stores: where "consumed up to here" lives.

* RemoteBrokerOffsetStore (CLUSTERING): the group shares offsets kept by the broker.
  The consumer keeps its latest offsets in memory and persists them every
  persistConsumerOffsetInterval (5 s), when a queue is taken away by rebalance, and on
  shutdown. Push pulls also piggy-back the in-memory offset on every pull (4.x's
  commitOffset sysFlag), so the broker is usually only one pull behind.
* LocalFileOffsetStore (BROADCASTING): each consumer consumes everything, so its
  progress is its own: a JSON file ``{dir}/{client_id}/{group}/offsets.json``.

``read_offset`` follows ReadOffsetType: MEMORY, STORE, or MEMORY_FIRST_THEN_STORE.
Offsets read from the broker: -1 = none committed; -2 = the broker could not be asked.
"""
from __future__ import annotations

import enum
import json
import logging
import os
from pathlib import Path

from ..atomic import write_json
from ..message_queue import MessageQueue
from ..protocol import lab, v2_service
from .connection import BrokerError, check, queue_ref, resource, v2_queue
from .session import SessionClosed

log = logging.getLogger(__name__)


class ReadOffsetType(enum.Enum):
    MEMORY = 1
    STORE = 2
    MEMORY_FIRST_THEN_STORE = 3


class OffsetStore:
    """In-memory table shared by both stores (offsetTable + updateOffset semantics)."""

    def __init__(self, group: str):
        self.group = group
        self.table: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        old = self.table.get(mq)
        if old is None or not increase_only or offset > old:
            self.table[mq] = offset

    def read_memory(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)
        self._persisted.pop(mq, None)

    def dirty(self, mqs) -> list[tuple[MessageQueue, int]]:
        """Offsets of ``mqs`` that changed since last persisted."""
        return [(mq, off) for mq, off in self.table.items()
                if mq in mqs and off >= 0 and self._persisted.get(mq) != off]

    def mark_persisted(self, mq: MessageQueue, offset: int) -> None:
        self._persisted[mq] = offset

    def is_persisted(self, mq: MessageQueue, offset: int) -> bool:
        return self._persisted.get(mq) == offset


class RemoteBrokerOffsetStore(OffsetStore):
    def __init__(self, group: str, connection, timeout_s: float = 3.0, session=None):
        super().__init__(group)
        self.connection = connection
        self.timeout_s = timeout_s
        self.session = session   # MemberSession: fetch_offsets asks on it while it is open

    async def load(self) -> None:  # nothing local to load
        return None

    async def fetch_offsets(self, topic: str, mqs=None) -> dict[MessageQueue, tuple[int, int, int]]:
        """One call for the queues of a topic: mq -> (committed or -1, min, max).

        With ``mqs`` only those queues are asked (a rebalance wants a few of 256 rows, and
        every member of the group asks at the same moment); the answer is still matched
        row by row, as an adapter may answer for the whole topic.
        """
        asked = None if mqs is None else [queue_ref(mq) for mq in mqs if mq.topic == topic]
        if asked == []:
            return {}
        request = lab.QueueOffsetsRequest(topic=topic, group=self.group, queues=asked)
        resp = None
        if self.session is not None and self.session.usable:
            try:
                resp = await self.session.queue_offsets(request, self.timeout_s)
            except SessionClosed:
                pass   # ended meanwhile: ask by a call
        if resp is None:
            resp = await self.connection.lab.GetQueueOffsets(request, metadata=self.connection.metadata,
                                                             timeout=self.timeout_s)
        check(resp.status)
        if mqs is None:
            return {
                MessageQueue(q.queue.topic, q.queue.broker_name, q.queue.queue_id):
                    (q.committed_offset, q.min_offset, q.max_offset)
                for q in resp.queues
            }
        wanted = {(mq.broker_name, mq.queue_id): mq for mq in mqs if mq.topic == topic}
        out = {}
        for q in resp.queues:
            ref = q.queue
            mq = wanted.get((ref.broker_name, ref.queue_id))
            if mq is not None and ref.topic == topic:
                out[mq] = (q.committed_offset, q.min_offset, q.max_offset)
        return out

    async def read_offset(self, mq: MessageQueue, how: ReadOffsetType = ReadOffsetType.STORE) -> int:
        if how in (ReadOffsetType.MEMORY, ReadOffsetType.MEMORY_FIRST_THEN_STORE):
            offset = self.table.get(mq)
            if offset is not None or how is ReadOffsetType.MEMORY:
                return -1 if offset is None else offset
        try:
            resp = await self.connection.v2.GetOffset(
                v2_service.GetOffsetRequest(group=resource(self.group), message_queue=v2_queue(mq)),
                metadata=self.connection.metadata, timeout=self.timeout_s)
            check(resp.status)
        except BrokerError as exc:
            return -1 if exc.is_not_found else -2
        except Exception:  # noqa: BLE001 - network: the caller retries later
            return -2
        self.update_offset(mq, resp.offset, False)
        self.mark_persisted(mq, resp.offset)  # the broker has it: no need to send it back
        return resp.offset

    async def persist(self, mq: MessageQueue) -> None:
        offset = self.table.get(mq)
        if offset is None or offset < 0:
            return
        await self._update_to_broker(mq, offset)

    async def persist_all(self, mqs) -> None:
        """persistAll: send changed offsets of the queues we still own; forget the rest."""
        mqs = set(mqs)
        for mq in [m for m in self.table if m not in mqs]:
            self.remove_offset(mq)  # "remove unused mq"
        for mq, offset in self.dirty(mqs):
            try:
                await self._update_to_broker(mq, offset)
            except Exception as exc:  # noqa: BLE001
                log.warning("persist offset %s=%s failed: %s", mq.label, offset, exc)

    async def send_offset(self, mq: MessageQueue, offset: int) -> None:
        """Persist one offset that may already be gone from the table (queue removed)."""
        await self._update_to_broker(mq, offset)

    async def _update_to_broker(self, mq: MessageQueue, offset: int) -> None:
        resp = await self.connection.v2.UpdateOffset(
            v2_service.UpdateOffsetRequest(group=resource(self.group), message_queue=v2_queue(mq), offset=offset),
            metadata=self.connection.metadata, timeout=self.timeout_s)
        check(resp.status)
        self.mark_persisted(mq, offset)


class LocalFileOffsetStore(OffsetStore):
    def __init__(self, group: str, client_id: str, store_dir: str):
        super().__init__(group)
        safe_id = client_id.replace("/", "_").replace(os.sep, "_")
        self.path = Path(store_dir) / safe_id / group / "offsets.json"
        self._stored: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("offset file %s unreadable: %s", self.path, exc)
            return
        for row in data.get("offsetTable", []):
            mq = MessageQueue(row["topic"], row["brokerName"], row["queueId"])
            self._stored[mq] = row["offset"]
            self.table[mq] = row["offset"]

    async def read_offset(self, mq: MessageQueue, how: ReadOffsetType = ReadOffsetType.STORE) -> int:
        if how in (ReadOffsetType.MEMORY, ReadOffsetType.MEMORY_FIRST_THEN_STORE):
            offset = self.table.get(mq)
            if offset is not None or how is ReadOffsetType.MEMORY:
                return -1 if offset is None else offset
        offset = self._stored.get(mq, -1)
        if offset >= 0:
            self.update_offset(mq, offset, False)
        return offset

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all(self.table.keys())

    async def send_offset(self, mq: MessageQueue, offset: int) -> None:
        self._stored[mq] = offset
        await self.persist_all(())

    async def persist_all(self, mqs) -> None:
        mqs = set(mqs)
        for mq in mqs:
            if mq in self.table:
                self._stored[mq] = self.table[mq]
        rows = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                for mq, off in sorted(self._stored.items())]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # write-then-rename, as RocketMQ's MixAll.string2File (no fsync: rewritten every few seconds)
        write_json(self.path, {"offsetTable": rows}, durable=False, indent=1)

    def remove_offset(self, mq: MessageQueue) -> None:
        # Broadcasting keeps its file entry: the queue is still ours next time.
        self.table.pop(mq, None)

    async def fetch_offsets(self, topic: str, mqs=None):
        return {}
