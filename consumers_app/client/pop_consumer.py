"""PopConsumer: RocketMQ 5.0's POP consumption (seed 004), over v2.

No client-side rebalance: QueryAssignment answers one assignment per broker with queue
id -1 ("pop from any queue of that broker"), so every member pops from every queue and
adding consumers adds capacity beyond the queue count. A popped message is invisible
to everyone for ``invisible_time`` (60 s, 5 s-300 s); ack it and it is done; don't, and
the broker revives it (retry topic, delivery attempt + 1) for any member to receive.
That is why a hung POP consumer does not strand its queues the way a hung push
consumer does: only its in-flight messages wait, and only for the invisible time.

Flow: per assignment, a receive loop asks for up to ``batch_size`` (32) messages with
long polling, but never holds more than ``pop_threshold_for_queue`` (96) received and
not yet acked (RocketMQ's popThresholdForQueue); the listener runs on the consume pool
(one message per call) and successes are acked in one AckMessage per batch. A failed
message (RECONSUME_LATER) is not acked: its invisible time is changed to a back-off
(popDelayLevel: 10 s, 30 s, 1 min ... by reconsume times), as the 5.x consumer does.

``receive()``, ``ack()`` and ``change_invisible_duration()`` are public for callers that
want SimpleConsumer-style control.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter

from google.protobuf.duration_pb2 import Duration

from ..message_queue import MessageQueue, shared_queue
from ..protocol import v2, v2_service
from .base import ConsumerBase
from .config import ConsumeResult, PopConsumerConfig
from .connection import Connection, check, resource
from .consume_pool import ConsumePool
from .flow_control import FlowControl
from .message import PopMessage
from .waiting import Wakeup

log = logging.getLogger(__name__)


def _duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


class PopConsumer(ConsumerBase):
    mode = "pop"
    client_type = v2.ClientType.SIMPLE_CONSUMER

    def __init__(self, group: str, topic: str, listener=None, config: PopConsumerConfig | None = None,
                 *, emitter=None, tag_expression: str = "*", receive_concurrency: int = 1):
        config = config or PopConsumerConfig()
        super().__init__(group, topic, listener, config, emitter, tag_expression)
        self._assignments: list[MessageQueue] = []
        self.receive_concurrency = receive_concurrency
        self.inflight: Counter = Counter()            # assignment -> received, not acked
        self.inflight_by_queue: Counter = Counter()   # MessageQueue -> received, not acked
        self.pop_counts: Counter = Counter()          # received / acked / ack_failed / nacked / redelivered
        self._receivers: dict[MessageQueue, list[asyncio.Task]] = {}
        self._capacity = Wakeup()
        self.pool = None

    @property
    def strategy_name(self) -> str:
        return "POP"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.state != "created":
            raise RuntimeError(f"consumer is {self.state}")
        self.connection = Connection(self.config.endpoints, self.client_id)
        self.pool = ConsumePool(asyncio.get_running_loop(), self.config.consume_thread_max, self._call,
                                self._on_results, name=f"pop-{self.client_id}")
        await self.send_heartbeat()
        self.state = "running"
        await self.update_assignments()
        self.spawn(self._heartbeat_loop(), "heartbeat")
        self._open_session()  # its close tells the broker we are gone
        self.spawn(self._assignment_loop(), "assignments")
        self.spawn(self._consume_event_loop(), "consume-events")
        self.spawn(self._pq_event_loop(), "pq-events")

    # shutdown(): nothing to persist - un-acked messages return after their invisible time.

    def _stop_consume_pool(self) -> None:
        """The consume pool runs the listener; received, un-acked messages are left to revive."""
        self.pool.shutdown()

    def _forget_assignments(self) -> None:
        """The broker's assignments are what we hold."""
        self._assignments = []

    def set_strategy(self, name: str, **options) -> None:
        """POP has no client-side allocation: the broker hands every member every queue."""
        self.emit("fault", fault="strategy", strategy=name, ignored=True)

    # ------------------------------------------------------------------ assignments

    async def query_assignment(self) -> list[MessageQueue]:
        resp = await self.connection.v2.QueryAssignment(
            v2_service.QueryAssignmentRequest(topic=resource(self.topic), group=resource(self.group)),
            metadata=self.connection.metadata, timeout=self._timeout())
        check(resp.status)
        return sorted(shared_queue(a.message_queue.topic.name, a.message_queue.broker.name, a.message_queue.id)
                      for a in resp.assignments)

    async def update_assignments(self) -> None:
        mqs = await self.query_assignment()
        if mqs == self._assignments:
            return
        for mq in [m for m in self._receivers if m not in mqs]:
            for task in self._receivers.pop(mq):
                task.cancel()
        for mq in mqs:
            if mq not in self._receivers:
                self._receivers[mq] = [self.spawn(self._receive_loop(mq), f"receive-{mq.label}")
                                       for _ in range(self.receive_concurrency)]
        self._assignments = mqs
        self.emit_assignment("assignment")

    def emit_assignment(self, reason: str) -> None:
        self.emit("assignment", topic=self.topic, queues=list(self._assignments),
                  strategy=self.strategy_name, reason=reason)

    async def _assignment_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.query_assignment_interval_ms / 1000)
            try:
                await self.update_assignments()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: query assignment: %s", self.client_id, exc)

    # ------------------------------------------------------------------ receive / ack

    async def receive(self, mq: MessageQueue, max_messages: int | None = None,
                      invisible_time_ms: int | None = None, long_polling_ms: int | None = None) -> list[PopMessage]:
        cfg = self.config
        invisible = invisible_time_ms if invisible_time_ms is not None else cfg.effective_invisible_time_ms()
        poll_ms = cfg.long_polling_timeout_ms if long_polling_ms is None else long_polling_ms
        request = v2_service.ReceiveMessageRequest(
            group=resource(self.group),
            message_queue=v2.MessageQueue(topic=resource(mq.topic), id=mq.queue_id, broker=v2.Broker(name=mq.broker_name)),
            filter_expression=v2.FilterExpression(type=v2.FilterType.TAG, expression=self.tag_expression),
            batch_size=max_messages or cfg.batch_size,
            invisible_duration=_duration(invisible), auto_renew=False,
            long_polling_timeout=_duration(poll_ms))
        msgs = []
        async for resp in self.connection.v2.ReceiveMessage(
                request, metadata=self.connection.metadata, timeout=poll_ms / 1000 + cfg.rpc_timeout_ms / 1000):
            which = resp.WhichOneof("content")
            if which == "status":
                if resp.status.code == v2.Code.MESSAGE_NOT_FOUND:
                    return []
                check(resp.status)
            elif which == "message":
                qid = resp.message.system_properties.queue_id
                msgs.append(PopMessage(resp.message, MessageQueue(mq.topic, mq.broker_name, qid)))
        return msgs

    async def ack(self, msgs) -> list[bool]:
        """AckMessage for a batch; returns per-message success."""
        if not msgs:
            return []
        resp = await self.connection.v2.AckMessage(
            v2_service.AckMessageRequest(group=resource(self.group), topic=resource(self.topic), entries=[
                v2_service.AckMessageEntry(message_id=m.message_id, receipt_handle=m.receipt_handle) for m in msgs]),
            metadata=self.connection.metadata, timeout=self._timeout())
        if len(resp.entries) != len(msgs):
            ok = resp.status.code == v2.Code.OK
            return [ok] * len(msgs)
        return [e.status.code == v2.Code.OK for e in resp.entries]

    async def change_invisible_duration(self, msg: PopMessage, invisible_time_ms: int) -> str:
        resp = await self.connection.v2.ChangeInvisibleDuration(
            v2_service.ChangeInvisibleDurationRequest(
                group=resource(self.group), topic=resource(self.topic), receipt_handle=msg.receipt_handle,
                invisible_duration=_duration(invisible_time_ms), message_id=msg.message_id),
            metadata=self.connection.metadata, timeout=self._timeout())
        check(resp.status)
        msg.receipt_handle = resp.receipt_handle or msg.receipt_handle
        self.pop_counts["invisible_changed"] += 1
        self.emit("pop", action="invisible_changed", count=1, invisible_ms=invisible_time_ms)
        return msg.receipt_handle

    async def _receive_loop(self, mq: MessageQueue) -> None:
        cfg = self.config
        while True:
            room = cfg.pop_threshold_for_queue - self.inflight[mq]
            if room <= 0:
                self.note_flow_control(mq, FlowControl("count", cfg.pop_threshold_for_queue, self.inflight[mq]))
                self._capacity.clear()
                await self._capacity.wait(1.0)
                continue
            try:
                msgs = await self.receive(mq, min(cfg.batch_size, room))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.debug("%s: receive %s: %s", self.client_id, mq.label, exc)
                await asyncio.sleep(cfg.pull_time_delay_ms_when_exception / 1000)
                continue
            if not msgs:
                continue
            self._received(mq, msgs)
            self.pool.submit([(m, mq) for m in msgs])

    def _received(self, mq, msgs) -> None:
        self.inflight[mq] += len(msgs)
        redelivered = 0
        for m in msgs:
            self.inflight_by_queue[m.queue] += 1
            if m.delivery_attempt > 1:
                redelivered += 1
        self.pop_counts["received"] += len(msgs)
        self.emit("pop", action="received", topic=mq.topic, queue=mq, count=len(msgs), redelivered=redelivered)
        if redelivered:
            self.pop_counts["redelivered"] += redelivered

    def _call(self, item):
        if self.state != "running":
            return None
        return self.call_listener([item[0]])

    def _on_results(self, done) -> None:
        if not self.running:
            return  # shutting down: un-acked messages come back after the invisible time
        per_assignment: dict = {}
        for (msg, mq), status in done:
            if status is None:
                continue
            ok, failed = per_assignment.setdefault(mq, ([], []))
            (ok if status is ConsumeResult.SUCCESS else failed).append(msg)
        for mq, (ok, failed) in per_assignment.items():
            self.stats.ok += len(ok)
            self.stats.retry += len(failed)
            if failed:
                # Not acked; as the 5.x push-over-pop consumer, each gets a back-off
                # (popDelayLevel by its reconsume times) instead of the full invisible time.
                self.pop_counts["nacked"] += len(failed)
                self.emit("pop", action="nacked", topic=mq.topic, queue=mq, count=len(failed))
                self.spawn(self._back_off(mq, failed))
            if ok:
                self.spawn(self._ack(mq, ok))

    async def _back_off(self, mq, msgs) -> None:
        try:
            await asyncio.gather(*(
                self.change_invisible_duration(m, self.config.retry_backoff_ms(m.delivery_attempt - 1))
                for m in msgs), return_exceptions=True)  # a failed change: the invisible time still runs out
        finally:
            self._release(mq, msgs)

    def _release(self, mq, msgs) -> None:
        if not msgs:
            return
        self.inflight[mq] -= len(msgs)
        for m in msgs:
            self.inflight_by_queue[m.queue] -= 1
        self._capacity.set()

    async def _ack(self, mq, msgs) -> None:
        try:
            results = await self.ack(msgs)
        except Exception as exc:  # noqa: BLE001 - they will be revived and re-delivered
            log.warning("%s: ack failed: %s", self.client_id, exc)
            results = [False] * len(msgs)
        finally:
            self._release(mq, msgs)
        acked = sum(results)
        self.pop_counts["acked"] += acked
        if acked:
            self.emit("pop", action="acked", topic=mq.topic, queue=mq, count=acked)
        if acked < len(msgs):
            # The invisible time ran out first (e.g. after a hang): someone else has it now.
            self.pop_counts["ack_failed"] += len(msgs) - acked
            self.emit("pop", action="ack_failed", topic=mq.topic, queue=mq, count=len(msgs) - acked)

    # ------------------------------------------------------------------ reporting

    def queue_figures(self) -> dict[MessageQueue, dict]:
        # A queue stays listed until a zero has been reported for it once.
        return {mq: {"cached_count": n, "cached_bytes": 0, "span": 0, "inflight": n,
                     "committed_offset": -1, "pull_offset": -1}
                for mq, n in sorted(self.inflight_by_queue.items()) if n or mq in self._last_pq}

    @property
    def assignments(self) -> list[MessageQueue]:
        return self._assignments

    def snapshot_fields(self) -> dict:
        return {"inflight": sum(self.inflight.values()), "pop": dict(self.pop_counts)}
