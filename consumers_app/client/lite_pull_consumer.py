"""LitePullConsumer: RocketMQ's DefaultLitePullConsumer (seed 003).

The application pulls: ``await consumer.poll(timeout_ms)`` returns the next batch. Behind
it, one pull task per queue fetches batches (pullBatchSize 10) into a shared
``consumeRequestCache``; poll() takes from that cache and counts what it returns as
consumed (the consume offset moves at once - a failed message is the caller's business).

* subscribe(topic) joins the group's rebalance (queues come and go); assign(queues)
  takes fixed queues, no rebalance.
* Flow control, checked by each pull task before pulling, 50 ms back-off each:
  cached requests x pullBatchSize > pullThresholdForAll (10000); the queue's cached
  count > 1000 or MiB > 100; span > consumeMaxSpan (2000). A paused queue waits 1 s.
* Offsets: auto-commit every autoCommitIntervalMillis (5 s) from inside poll(), or
  commit() by hand; the store persists them as for the push consumer. A queue taken
  away by rebalance, or a shutdown, persists only what was committed: messages polled
  after the last commit are consumed again by the next owner.
* seek(mq, offset) drops what is cached for the queue and pulls from ``offset`` next.

In the lab the consumer also runs its own poll loop when given a listener, so it can
be hung, slowed and failed like the others.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ..message_queue import MessageQueue
from ..protocol import lab, v2
from .base import ConsumerBase
from .config import ConsumeResult, LitePullConsumerConfig, MessageModel
from .connection import check, queue_ref
from .flow_control import check_lite
from .message import MessageExt
from .offset_store import ReadOffsetType
from .process_queue import ProcessQueue
from .rebalance import RebalanceImpl, RebalanceService
from .start_offset import compute_pull_from_where
from .waiting import Wakeup

log = logging.getLogger(__name__)


class AssignedQueue:
    """AssignedMessageQueue's per-queue record."""

    __slots__ = ("mq", "pq", "paused", "pull_offset", "consume_offset", "seek_offset", "task", "ref")

    def __init__(self, mq: MessageQueue, pq: ProcessQueue, pull_offset: int = -1):
        self.mq = mq
        self.pq = pq
        self.paused = False
        self.pull_offset = pull_offset
        self.consume_offset = -1
        self.seek_offset = -1
        self.task: asyncio.Task | None = None
        self.ref = queue_ref(mq)


class ConsumeRequest:
    __slots__ = ("msgs", "mq", "pq")

    def __init__(self, msgs, mq, pq):
        self.msgs = msgs
        self.mq = mq
        self.pq = pq


class LitePullConsumer(ConsumerBase):
    mode = "lite_pull"
    client_type = v2.ClientType.PULL_CONSUMER

    def __init__(self, group: str, topic: str | None = None, listener=None,
                 config: LitePullConsumerConfig | None = None, *, emitter=None, tag_expression: str = "*",
                 auto_consume: bool | None = None, **strategy_options):
        config = config or LitePullConsumerConfig()
        super().__init__(group, topic or "", listener, config, emitter, tag_expression)
        self.orderly = False
        self.message_model = config.message_model
        self.subscriptions: dict[str, str] = {}
        self.subscription_type = None  # "SUBSCRIBE" | "ASSIGN"
        self.assigned: dict[MessageQueue, AssignedQueue] = {}
        self.consume_request_cache: deque[ConsumeRequest] = deque()
        self._cache_event = Wakeup()
        self.rebalance_impl = RebalanceImpl(self, config.allocate_strategy, **strategy_options)
        self.rebalance_service = RebalanceService(
            self._rebalance, config.rebalance_wait_interval_ms, config.rebalance_min_interval_ms)
        self.offset_store = None
        self.auto_consume = listener is not None if auto_consume is None else auto_consume
        self.executor = None
        self._next_auto_commit = 0.0
        if topic:
            self.subscribe(topic, tag_expression)

    # ------------------------------------------------------------------ subscription

    def subscribe(self, topic: str, tag_expression: str = "*") -> None:
        if self.subscription_type == "ASSIGN":
            raise RuntimeError("subscribe and assign are mutually exclusive")
        self.subscription_type = "SUBSCRIBE"
        self.topic = self.topic or topic
        self.subscriptions[topic] = tag_expression
        if self.running:
            self.spawn(self.refresh_routes())
            self.rebalance_service.wakeup()

    def assign(self, mqs) -> None:
        """Take exactly these queues (no rebalance)."""
        if self.subscription_type == "SUBSCRIBE":
            raise RuntimeError("subscribe and assign are mutually exclusive")
        self.subscription_type = "ASSIGN"
        mqs = sorted(mqs)
        if mqs:
            self.topic = self.topic or mqs[0].topic
        self._assign_pending = mqs
        if self.running:
            self.spawn(self._apply_assign(mqs))

    async def _apply_assign(self, mqs) -> None:
        wanted = set(mqs)
        for mq in [m for m in self.assigned if m not in wanted]:
            self._drop_queue(mq)
        new = [mq for mq in mqs if mq not in self.assigned]
        by_topic: dict[str, list] = {}
        for mq in new:
            by_topic.setdefault(mq.topic, []).append(mq)
        for topic, group in by_topic.items():
            offsets = await self.compute_pull_from_where(topic, group)
            self.on_queues_added([(mq, self.create_process_queue(mq), offsets.get(mq, 0)) for mq in group])
        self.emit_assignment("assign")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.state != "created":
            raise RuntimeError(f"consumer is {self.state}")
        cfg = self.config
        await self._connect_with_offset_store()
        await self.send_heartbeat()
        self.state = "running"
        self._next_auto_commit = time.monotonic() + cfg.auto_commit_interval_ms / 1000
        self.spawn(self._heartbeat_loop(), "heartbeat")
        self.spawn(self._persist_loop(), "persist-offsets")
        self.spawn(self._pq_event_loop(), "pq-events")
        self.spawn(self._consume_event_loop(), "consume-events")
        if self.subscription_type == "SUBSCRIBE":
            await self.refresh_routes()
            self.spawn(self.rebalance_service.run(), "rebalance-service")
            self.spawn(self._route_loop(), "route")
            if self.message_model is MessageModel.CLUSTERING:
                self._open_session()
            self.rebalance_impl.last_reason = "start"
            self.rebalance_service.wakeup()
        elif self.subscription_type == "ASSIGN":
            await self._apply_assign(self._assign_pending)
        if self.auto_consume:
            self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"lite-{self.client_id}")
            self.spawn(self._consume_loop(), "poll-loop")

    def _stop_consume_pool(self) -> None:
        """The lab's poll loop runs the listener on its own one-thread executor (if any)."""
        if self.executor:
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def _persist_on_shutdown(self) -> None:
        """Persist what was committed (by auto-commit or commit()), as DefaultLitePullConsumerImpl
        does: messages polled since the last commit are not committed, so the next owner
        consumes them again (the hand-off's duplicates)."""
        owned = list(self.assigned)
        for aq in self.assigned.values():
            aq.pq.dropped = True
        try:
            await self.offset_store.persist_all(owned)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: persist on shutdown: %s", self.client_id, exc)

    def _forget_assignments(self) -> None:
        """Drop the assigned queues (already dropped on a graceful shutdown) and forget them."""
        for aq in self.assigned.values():
            aq.pq.dropped = True
        self.assigned.clear()
        self.rebalance_impl.process_queue_table.clear()

    # ------------------------------------------------------------------ rebalance hooks

    def on_membership_changed(self, change) -> None:
        self.rebalance_impl.last_reason = change.reason or "membership"
        self.rebalance_service.wakeup()

    def on_route_changed(self) -> None:
        self.rebalance_impl.last_reason = "route"
        self.rebalance_service.wakeup()

    def set_strategy(self, name: str, **options) -> None:
        self.rebalance_impl.set_strategy(name, **options)
        self.emit("fault", fault="strategy", strategy=self.rebalance_impl.strategy.name)
        if self.running and self.subscription_type == "SUBSCRIBE":
            self.spawn(self.rebalance_impl.do_rebalance("strategy"))

    def emit_assignment(self, reason: str) -> None:
        self.emit("assignment", topic=self.topic, queues=self.assignments,
                  strategy=self.rebalance_impl.strategy.name, reason=reason)

    def is_pull_expired(self, pq) -> bool:
        return False

    def pull_sub_version(self, topic: str) -> int:
        """DefaultLitePullConsumerImpl pulls a TAG subscription with subVersion 0."""
        return 0

    def create_process_queue(self, mq) -> ProcessQueue:
        return ProcessQueue()

    async def lock(self, mq) -> bool:
        return True

    async def compute_pull_from_where(self, topic: str, mqs) -> dict:
        return await compute_pull_from_where(self, topic, mqs)

    async def remove_unnecessary(self, mq, pq) -> bool:
        """RebalanceLitePullImpl: persist what was committed, forget. What poll() handed out
        since the last commit is not committed: the next owner gets it again."""
        try:
            await self.offset_store.persist(mq)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: persist %s: %s", self.client_id, mq.label, exc)
        self.offset_store.remove_offset(mq)
        self._drop_queue(mq)
        return True

    def _drop_queue(self, mq) -> None:
        aq = self.assigned.pop(mq, None)
        self.forget_queue(mq)
        if aq is None:
            return
        aq.pq.dropped = True
        if aq.task:
            aq.task.cancel()
        self.rebalance_impl.process_queue_table.pop(mq, None)
        self.consume_request_cache = deque(r for r in self.consume_request_cache if r.mq != mq)

    def on_queues_added(self, new) -> None:
        """updatePullTask / startPullTask: one pull task per new queue."""
        for mq, pq, offset in new:
            aq = AssignedQueue(mq, pq, offset)
            self.assigned[mq] = aq
            self.rebalance_impl.process_queue_table[mq] = pq
            aq.task = self.spawn(self._pull_task(aq), f"pull-{mq.label}")

    def on_queues_changed(self, topic, mq_all, mine) -> None:
        pass

    # ------------------------------------------------------------------ pull tasks

    async def _pull_task(self, aq: AssignedQueue) -> None:
        while not aq.pq.dropped:
            delay_ms = await self._pull_once(aq)
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)

    async def _pull_once(self, aq: AssignedQueue) -> float:
        """PullTaskImpl.run; returns the delay before the next run."""
        cfg = self.config
        mq, pq = aq.mq, aq.pq
        if aq.paused:
            return cfg.pull_time_delay_ms_when_pause
        fc = check_lite(len(self.consume_request_cache), cfg.pull_batch_size, cfg.pull_threshold_for_all,
                        pq, cfg.pull_threshold_for_queue, cfg.pull_threshold_size_for_queue_mib, cfg.consume_max_span)
        if fc is not None:
            self.note_flow_control(mq, fc)
            return cfg.pull_time_delay_ms_when_flow_control
        # nextPullOffset: a pending seek wins over where we were.
        if aq.seek_offset != -1:
            offset = aq.seek_offset
            aq.consume_offset = offset
            aq.seek_offset = -1
            aq.pull_offset = offset
        offset = aq.pull_offset
        if offset < 0:
            offsets = await self.compute_pull_from_where(mq.topic, [mq])
            if mq not in offsets:
                return cfg.pull_time_delay_ms_when_exception
            offset = aq.pull_offset = offsets[mq]
        try:
            resp = await self.pull_batch(
                lab.PullBatchRequest(group=self.group, queue=aq.ref, offset=offset, max_messages=cfg.pull_batch_size,
                                     suspend_timeout_ms=cfg.broker_suspend_max_time_ms,
                                     tag_expression=self.subscriptions.get(mq.topic, self.tag_expression),
                                     commit_offset=-1),
                cfg.consumer_timeout_ms_when_suspend / 1000)
            check(resp.status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.debug("%s: pull %s: %s", self.client_id, mq.label, exc)
            return cfg.pull_time_delay_ms_when_exception
        if pq.dropped:
            return 0
        if aq.seek_offset != -1:
            return 0  # seek() happened during the pull: discard, pull from the seek offset
        if resp.pull_status == lab.FOUND and resp.messages:
            msgs = [MessageExt(pb, mq) for pb in resp.messages]
            pq.put_messages(msgs)
            self.consume_request_cache.append(ConsumeRequest(msgs, mq, pq))
            self._cache_event.set()
        if resp.pull_status == lab.OFFSET_ILLEGAL:
            self.note_offset_moved(mq, offset, resp.next_begin_offset)
        aq.pull_offset = resp.next_begin_offset
        return 0

    # ------------------------------------------------------------------ the API

    async def poll(self, timeout_ms: float | None = None) -> list[MessageExt]:
        """The next cached batch, waiting up to ``timeout_ms`` (pollTimeoutMillis)."""
        if self.config.auto_commit:
            self._maybe_auto_commit()
        timeout_ms = self.config.poll_timeout_ms if timeout_ms is None else timeout_ms
        if timeout_ms < 0:
            raise ValueError("timeout must not be negative")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            cache = self.consume_request_cache
            while cache:
                request = cache.popleft()
                if request.pq.dropped:
                    continue
                offsets = [m.pb.queue_offset for m in request.msgs]
                offset = request.pq.remove_messages(offsets)
                aq = self.assigned.get(request.mq)
                if aq is not None and offset >= 0:
                    aq.consume_offset = offset
                return request.msgs
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._cache_event.clear()
            await self._cache_event.wait(remaining)

    def _maybe_auto_commit(self) -> None:
        now = time.monotonic()
        if now >= self._next_auto_commit:
            self.commit_all()
            self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000

    def commit_all(self) -> None:
        """commitAll: every queue's consume offset into the offset store (persisted every 5 s)."""
        for mq, aq in self.assigned.items():
            if aq.consume_offset != -1 and not aq.pq.dropped:
                self.offset_store.update_offset(mq, aq.consume_offset, False)

    async def commit(self, offsets: dict | None = None, persist: bool = True) -> None:
        """commitSync: store the given offsets (or every consume offset) and persist now."""
        if offsets is None:
            self.commit_all()
        else:
            for mq, offset in offsets.items():
                self.offset_store.update_offset(mq, offset, False)
        if persist:
            await self.offset_store.persist_all([mq for mq in self.assigned])

    async def committed(self, mq: MessageQueue) -> int:
        return await self.offset_store.read_offset(mq, ReadOffsetType.STORE)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        aq = self.assigned.get(mq)
        if aq is None:
            raise ValueError(f"{mq} is not assigned to this consumer")
        aq.seek_offset = offset
        aq.pq.clear()  # clearMessageQueueInCache
        self.consume_request_cache = deque(r for r in self.consume_request_cache if r.mq != mq)
        if aq.task is not None and self.running:
            # Don't sit out a 20 s long poll at the old offset: restart the pull task now.
            aq.task.cancel()
            aq.task = self.spawn(self._pull_task(aq), f"pull-{mq.label}")

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        offsets = await self._min_max(mq)
        self.seek(mq, offsets[0])

    async def seek_to_end(self, mq: MessageQueue) -> None:
        offsets = await self._min_max(mq)
        self.seek(mq, offsets[1])

    async def _min_max(self, mq):
        resp = await self.connection.lab.GetQueueOffsets(lab.QueueOffsetsRequest(topic=mq.topic),
                                                         metadata=self.connection.metadata, timeout=self._timeout())
        for q in resp.queues:
            if (q.queue.broker_name, q.queue.queue_id) == (mq.broker_name, mq.queue_id):
                return q.min_offset, q.max_offset
        raise ValueError(f"{mq} not found")

    def pause(self, mqs) -> None:
        for mq in mqs:
            if mq in self.assigned:
                self.assigned[mq].paused = True

    def resume(self, mqs=None) -> None:
        """resume(queues) un-pauses queues (RocketMQ's API); resume() with no argument is
        the lab's "un-hang" control shared by every consumer."""
        if mqs is None:
            super().resume()
            return
        for mq in mqs:
            if mq in self.assigned:
                self.assigned[mq].paused = False

    @property
    def assignments(self) -> list[MessageQueue]:
        return sorted(mq for mq, aq in self.assigned.items() if not aq.pq.dropped)

    # ------------------------------------------------------------------ lab poll loop

    async def _consume_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            msgs = await self.poll(1000)
            if not msgs:
                continue
            statuses = await loop.run_in_executor(self.executor, self._run_listener, msgs)
            if statuses is None:
                continue
            for m in msgs:
                self.stats.consumed.note(m.queue, m.pb.queue_offset)
            for s in statuses:
                if s is ConsumeResult.SUCCESS:
                    self.stats.ok += 1
                else:
                    # Lite pull has no send-back: a failure is the application's to handle.
                    self.stats.fail += 1

    def _run_listener(self, msgs):
        out = []
        for m in msgs:
            s = self.call_listener([m])
            if s is None:
                return None
            out.append(s)
        return out

    # ------------------------------------------------------------------ offsets & reporting

    async def _persist_loop(self) -> None:
        interval = self.config.persist_consumer_offset_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            owned = list(self.assigned)
            try:
                await self.offset_store.persist_all(owned)
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: persist: %s", self.client_id, exc)
                continue
            self._emit_offsets(owned)

    def queue_figures(self) -> dict[MessageQueue, dict]:
        store = self.offset_store
        return {mq: aq.pq.figures(store.table.get(mq, -1) if store else -1, aq.pull_offset)
                for mq, aq in list(self.assigned.items())}

    def snapshot_fields(self) -> dict:
        return {
            "message_model": self.message_model.value,
            "subscription_type": self.subscription_type,
            "paused": [mq.label for mq, aq in self.assigned.items() if aq.paused],
            "cached_requests": len(self.consume_request_cache),
        }
