"""PushConsumer: RocketMQ 4.x's DefaultMQPushConsumer, on our broker.

"Push" is a pull loop in disguise (seed 000): RebalanceService decides which queues
are ours, each gets a ProcessQueue and one circulating PullRequest, PullMessageService
pulls (long polling, batches of pullBatchSize via the lab's PullBatch, the in-memory
offset piggy-backed as the commit), and the consume service runs the listener on a
thread pool. Offsets go to the broker (clustering) or a local file (broadcasting).

    consumer = PushConsumer("GID_LAB", "TopicTest", listener, PushConsumerConfig(endpoints=addr))
    await consumer.start()
    ...
    await consumer.shutdown()

The listener is a plain callable ``listener(messages) -> ConsumeResult`` run on the
consume thread pool (one message per call). ``orderly=True`` selects orderly
consumption (MessageListenerOrderly).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from ..message_queue import MessageQueue
from ..protocol import lab
from .base import ConsumerBase, retry_topic
from .config import MessageModel, PushConsumerConfig
from .connection import check, queue_ref
from .consume_service import ConcurrentlyConsumeService, OrderlyConsumeService
from .flow_control import check_push, per_queue_threshold
from .message import MessageExt
from .process_queue import ProcessQueue
from .pull_service import PullMessageService, PullRequest
from .rebalance import RebalanceImpl, RebalanceService
from .start_offset import compute_pull_from_where

log = logging.getLogger(__name__)

FOUND = lab.FOUND
NO_NEW_MSG = lab.NO_NEW_MSG
NO_MATCHED_MSG = lab.NO_MATCHED_MSG
OFFSET_ILLEGAL = lab.OFFSET_ILLEGAL


async def _try_lock(lock: asyncio.Lock, timeout_s: float) -> bool:
    """tryLock(timeout) without wait_for(lock.acquire()), which can leak the lock when
    the timeout and the acquisition race."""
    deadline = time.monotonic() + timeout_s
    while lock.locked():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    await lock.acquire()  # free and we are on the loop: returns at once
    return True


class PushConsumer(ConsumerBase):
    mode = "push"

    def __init__(self, group: str, topic: str, listener=None, config: PushConsumerConfig | None = None,
                 *, orderly: bool = False, emitter=None, tag_expression: str = "*", **strategy_options):
        config = config or PushConsumerConfig()
        super().__init__(group, topic, listener, config, emitter, tag_expression)
        self.orderly = orderly
        self.message_model = config.message_model
        self.subscriptions: dict[str, str] = {topic: tag_expression}
        if self.message_model is MessageModel.CLUSTERING:
            # RocketMQ subscribes every clustering consumer to its group's retry topic,
            # where sent-back messages come back after their delay (copySubscription).
            self.subscriptions[retry_topic(group)] = "*"
        self.rebalance_impl = RebalanceImpl(self, config.allocate_strategy, **strategy_options)
        self.rebalance_service = RebalanceService(
            self._rebalance, config.rebalance_wait_interval_ms, config.rebalance_min_interval_ms)
        self.pull_service = PullMessageService(self.pull_message)
        self.threshold_count = config.pull_threshold_for_queue
        self.threshold_size_mib = config.pull_threshold_size_for_queue_mib
        self.pull_requests: dict[MessageQueue, PullRequest] = {}
        self.offset_store = None
        self.executor = None
        self.consume_service = None
        self._pull_timeout_s = config.consumer_timeout_ms_when_suspend / 1000

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.state != "created":
            raise RuntimeError(f"consumer is {self.state}")
        cfg = self.config
        await self._connect_with_offset_store()
        if self.orderly:
            self.executor = ThreadPoolExecutor(cfg.consume_thread_max, thread_name_prefix=f"consume-{self.client_id}")
            self.consume_service = OrderlyConsumeService(self, self.executor)
        else:
            self.consume_service = ConcurrentlyConsumeService(self)
        # As DefaultMQPushConsumerImpl.start: learn the routes
        # (updateTopicSubscribeInfoWhenSubscriptionChanged), register with the broker
        # (sendHeartbeatToAllBrokerWithLock), then rebalance at once. Routes first: once
        # the heartbeat has told the group we are here, the others drop the queues that
        # become ours, and we can take them without another round trip.
        await self.refresh_routes()
        await self.send_heartbeat()
        self.state = "running"
        self.spawn(self.pull_service.run(), "pull-service")
        self.spawn(self.rebalance_service.run(), "rebalance-service")
        self.spawn(self._heartbeat_loop(), "heartbeat")
        self.spawn(self._route_loop(), "route")
        self._open_session()
        self.spawn(self._persist_loop(), "persist-offsets")
        self.spawn(self._pq_event_loop(), "pq-events")
        self.spawn(self._consume_event_loop(), "consume-events")
        if self.orderly and self.message_model is MessageModel.CLUSTERING:
            self.spawn(self._lock_loop(), "lock-all")
        self.rebalance_impl.last_reason = "start"
        self.rebalance_service.wakeup()

    async def _stop_work(self, graceful: bool = False) -> None:
        """Stop pulling first (no PullRequest is re-queued), and mark our process queues
        dropped before the consume threads are let go, so late results are ignored."""
        self.pull_service.stop()
        await self._cancel_tasks(keep_persists=graceful)
        for pq in self.rebalance_impl.process_queue_table.values():
            pq.dropped = True
        self._release_threads()
        self._stop_consume_pool()

    def _stop_consume_pool(self) -> None:
        """The consume service owns the listener's threads."""
        self.consume_service.shutdown()

    async def _persist_on_shutdown(self) -> None:
        """Persist the owned queues' offsets, then (orderly clustering) unlock them, so
        the next owner starts where we stopped and need not wait for our locks to expire."""
        owned = list(self.rebalance_impl.process_queue_table)
        try:
            await self.offset_store.persist_all(owned)
            self._emit_offsets(owned)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: persisting offsets on shutdown failed: %s", self.client_id, exc)
        if self.orderly and self.message_model is MessageModel.CLUSTERING and owned:
            await self._unlock(owned)

    def _forget_assignments(self) -> None:
        """The process queues are what we hold."""
        self.rebalance_impl.process_queue_table.clear()

    # ------------------------------------------------------------------ rebalance hooks

    def rebalance_now(self, reason: str) -> None:
        self.rebalance_impl.last_reason = reason
        self.rebalance_service.wakeup()

    def emit_assignment(self, reason: str) -> None:
        held = self.rebalance_impl.assignments   # sorted once for both lists
        self.emit("assignment", topic=self.topic, queues=[mq for mq in held if mq.topic == self.topic],
                  retry_queues=[mq for mq in held if mq.topic != self.topic],
                  strategy=self.rebalance_impl.strategy.name, reason=reason)

    def on_membership_changed(self, change) -> None:
        self.rebalance_now(change.reason or "membership")

    def on_route_changed(self) -> None:
        self.rebalance_now("route")

    def set_strategy(self, name: str, **options) -> None:
        """Switch the allocation strategy and rebalance at once."""
        self.rebalance_impl.set_strategy(name, **options)
        self.emit("fault", fault="strategy", strategy=self.rebalance_impl.strategy.name)
        if self.running:
            self.spawn(self.rebalance_impl.do_rebalance("strategy"))

    def is_pull_expired(self, pq) -> bool:
        return pq.is_pull_expired(self.config.pull_max_idle_time_ms)

    def create_process_queue(self, mq) -> ProcessQueue:
        pq = ProcessQueue()
        if self.orderly:
            pq.consume_lock = asyncio.Lock()
            # We only add an orderly queue after locking it at the broker.
            pq.locked = self.message_model is MessageModel.CLUSTERING
            pq.last_lock_ts = time.monotonic_ns() // 1_000_000
        return pq

    async def compute_pull_from_where(self, topic: str, mqs) -> dict:
        return await compute_pull_from_where(self, topic, mqs)

    async def remove_unnecessary(self, mq, pq) -> bool:
        """RebalancePushImpl.removeUnnecessaryMessageQueue: persist, forget, unlock."""
        self.pull_requests.pop(mq, None)
        # RemoteBrokerOffsetStore.persist sends the offset one-way: the rebalance does
        # not wait for the broker's answer. Whether the broker already has exactly this
        # offset is decided now, before remove_offset forgets what was persisted (asked
        # later, every removed queue would be sent again: one call per moved queue).
        offset = self.offset_store.table.get(mq, -1)
        if offset >= 0 and not self.offset_store.is_persisted(mq, offset):
            self.spawn_persist(self._persist_quietly(mq, offset))
        self.offset_store.remove_offset(mq)
        self.forget_queue(mq)
        if self.orderly and self.message_model is MessageModel.CLUSTERING:
            # 5.2+ tryRemoveOrderMessageQueue: unlock at the broker at once unless a
            # consume is in progress (we wait 0.5 s for it); a queue stuck consuming is
            # force-unlocked once its lock is older than UNLOCK_DELAY_TIME_MILLS (20 s).
            now = time.monotonic_ns() // 1_000_000
            force = now > pq.last_lock_ts + self.config.unlock_delay_time_ms
            if not force and not await _try_lock(pq.consume_lock, 0.5):
                pq.try_unlock_times += 1  # still consuming: try again next rebalance
                return False
            try:
                pq.locked = False
                await self._unlock([mq])
            finally:
                if not force:
                    pq.consume_lock.release()
        return True

    async def _persist_quietly(self, mq, offset: int) -> None:
        if offset < 0:
            return
        try:
            await self.offset_store.send_offset(mq, offset)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: persist %s on removal: %s", self.client_id, mq.label, exc)

    def on_queues_added(self, new) -> None:
        """dispatchPullRequest: one PullRequest per new queue, pulled ``dispatch_pull_delay_ms``
        later, as RocketMQ 5 does: a change's first pulls of every member do not land on the
        broker in the same instant as the members' own rebalances."""
        delay_ms = self.config.dispatch_pull_delay_ms
        for mq, pq, offset in new:
            request = PullRequest(mq, pq, offset, queue_ref(mq))
            request.previously_locked = True  # offset computed right after locking
            self.pull_requests[mq] = request
            if delay_ms > 0:
                self.pull_service.execute_pull_request_later(request, delay_ms)
            else:
                self.pull_service.execute_pull_request_immediately(request)

    def on_queues_changed(self, topic, mq_all, mine) -> None:
        """messageQueueChanged: re-split topic-wide thresholds; tell the broker (heartbeat)."""
        cfg = self.config
        n = len(self.rebalance_impl.process_queue_table)
        self.threshold_count = per_queue_threshold(cfg.pull_threshold_for_topic, cfg.pull_threshold_for_queue, n)
        self.threshold_size_mib = per_queue_threshold(
            cfg.pull_threshold_size_for_topic_mib, cfg.pull_threshold_size_for_queue_mib, n)

    # ------------------------------------------------------------------ orderly locks

    async def lock(self, mq) -> bool:
        """RebalanceImpl.lock: take one queue's broker lock."""
        try:
            resp = await self.connection.lab.LockQueues(
                lab.LockQueuesRequest(group=self.group, client_id=self.client_id, queues=[queue_ref(mq)]),
                metadata=self.connection.metadata, timeout=self._timeout())
            check(resp.status)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: lock %s: %s", self.client_id, mq.label, exc)
            return False
        locked = any(q.queue_id == mq.queue_id and q.broker_name == mq.broker_name and q.topic == mq.topic
                     for q in resp.locked)
        pq = self.rebalance_impl.process_queue_table.get(mq)
        if pq is not None:
            pq.locked = locked
            if locked:
                pq.last_lock_ts = time.monotonic_ns() // 1_000_000
        return locked

    async def _unlock(self, mqs) -> None:
        try:
            await self.connection.lab.UnlockQueues(
                lab.LockQueuesRequest(group=self.group, client_id=self.client_id, queues=[queue_ref(m) for m in mqs]),
                metadata=self.connection.metadata, timeout=self._timeout())
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: unlock: %s", self.client_id, exc)

    async def lock_all(self) -> None:
        """RebalanceImpl.lockAll: renew every owned queue's lock (every 20 s)."""
        table = self.rebalance_impl.process_queue_table
        mqs = [mq for mq, pq in table.items() if not pq.dropped]
        if not mqs:
            return
        resp = await self.connection.lab.LockQueues(
            lab.LockQueuesRequest(group=self.group, client_id=self.client_id, queues=[queue_ref(m) for m in mqs]),
            metadata=self.connection.metadata, timeout=self._timeout())
        check(resp.status)
        locked = {MessageQueue(q.topic, q.broker_name, q.queue_id) for q in resp.locked}
        now = time.monotonic_ns() // 1_000_000
        for mq in mqs:
            pq = table.get(mq)
            if pq is None:
                continue
            if mq in locked:
                pq.locked = True
                pq.last_lock_ts = now
            else:
                pq.locked = False

    async def _lock_loop(self) -> None:
        interval = self.config.rebalance_lock_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.lock_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: lockAll: %s", self.client_id, exc)

    # ------------------------------------------------------------------ pulling

    def pull_message(self, request: PullRequest) -> None:
        """DefaultMQPushConsumerImpl.pullMessage: checks first, then an async pull."""
        pq = request.pq
        if pq.dropped:
            return
        pq.last_pull_ts = time.monotonic_ns() // 1_000_000
        service = self.pull_service
        if not self.running:
            service.execute_pull_request_later(request, self.config.pull_time_delay_ms_when_exception)
            return
        fc = check_push(pq, self.threshold_count, self.threshold_size_mib,
                        self.config.consume_concurrently_max_span, self.orderly)
        if fc is not None:
            self.note_flow_control(request.mq, fc)
            service.execute_pull_request_later(request, self.config.pull_time_delay_ms_when_cache_flow_control)
            return
        if self.orderly and self.message_model is MessageModel.CLUSTERING and not pq.locked:
            # Orderly may only pull a queue it holds the broker lock of.
            service.execute_pull_request_later(request, self.config.pull_time_delay_ms_when_exception)
            return
        self.spawn(self._pull(request))

    async def _pull(self, request: PullRequest) -> None:
        mq, pq = request.mq, request.pq
        cfg = self.config
        service = self.pull_service
        commit = -1
        if self.message_model is MessageModel.CLUSTERING:
            # commitOffsetEnable: piggy-back what we have consumed so far.
            memory = self.offset_store.table.get(mq, -1)
            if memory > 0:
                commit = memory
        try:
            resp = await self.pull_batch(lab.PullBatchRequest(
                group=self.group, queue=request.lab_queue, offset=request.next_offset,
                max_messages=cfg.pull_batch_size, suspend_timeout_ms=cfg.broker_suspend_max_time_ms,
                tag_expression=self.subscriptions.get(mq.topic, "*"), commit_offset=commit), self._pull_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - onException
            if self.running:
                log.debug("%s: pull %s failed: %s", self.client_id, mq.label, exc)
                service.execute_pull_request_later(request, cfg.pull_time_delay_ms_when_exception)
            return
        if commit > 0:
            self.offset_store.mark_persisted(mq, commit)
        code = resp.status.code
        if code != 20000 and code != 0:
            delay = (cfg.pull_time_delay_ms_when_broker_flow_control if code == 42900
                     else cfg.pull_time_delay_ms_when_exception)
            service.execute_pull_request_later(request, delay)
            return
        if pq.dropped:
            return
        status = resp.pull_status
        if status == FOUND:
            request.next_offset = resp.next_begin_offset
            pbs = resp.messages
            if not pbs:
                service.execute_pull_request_immediately(request)
                return
            msgs = [MessageExt(pb, mq) for pb in pbs]
            pq.msg_acc_cnt = resp.max_offset - pbs[-1].queue_offset
            dispatch = pq.put_messages(msgs)
            self.consume_service.submit(msgs, pq, mq, dispatch)
            if cfg.pull_interval_ms > 0:
                service.execute_pull_request_later(request, cfg.pull_interval_ms)
            else:
                service.execute_pull_request_immediately(request)
        elif status in (NO_NEW_MSG, NO_MATCHED_MSG):
            request.next_offset = resp.next_begin_offset
            if pq.msg_count == 0:
                # correctTagsOffset: nothing cached, so everything below is consumed.
                self.offset_store.update_offset(mq, request.next_offset, True)
            service.execute_pull_request_immediately(request)
        elif status == OFFSET_ILLEGAL:
            # The offset fell out of the queue (retention deleted it, or it is past the
            # end): as 5.3's pull callback, drop the ProcessQueue (its cache is discarded,
            # late consume results are ignored), persist the broker's corrected offset,
            # remove the queue and rebalance at once, which creates it anew from there.
            log.warning("%s: offset %d of %s is illegal; corrected to %d", self.client_id,
                        request.next_offset, mq.label, resp.next_begin_offset)
            self.note_offset_moved(mq, request.next_offset, resp.next_begin_offset)
            request.next_offset = resp.next_begin_offset
            pq.dropped = True
            self.spawn(self._fix_illegal_offset(mq, request.next_offset))
        else:
            service.execute_pull_request_later(request, cfg.pull_time_delay_ms_when_exception)

    async def _fix_illegal_offset(self, mq, offset: int) -> None:
        """The OFFSET_ILLEGAL task: updateAndFreezeOffset + persist, removeProcessQueue,
        rebalanceImmediately. The persist is awaited so the new ProcessQueue's
        computePullFromWhere reads the corrected offset back from the broker."""
        store = self.offset_store
        store.update_offset(mq, offset, False)   # frozen: the dropped queue's results no longer count
        try:
            await store.persist(mq)
        except Exception as exc:  # noqa: BLE001 - the rebalance then starts from the old offset
            log.warning("%s: persisting the corrected offset of %s: %s", self.client_id, mq.label, exc)
        await self.rebalance_impl.remove_process_queue(mq)
        self.rebalance_now("offset_moved")

    # ------------------------------------------------------------------ send back

    async def send_back(self, msg, delay_level: int, max_reconsume_times: int) -> bool:
        """sendMessageBack: the broker re-queues it on %RETRY%group (or the DLQ)."""
        try:
            resp = await self.connection.lab.SendBack(
                lab.SendBackRequest(group=self.group, message=msg.lab_message(), delay_level=delay_level,
                                    max_reconsume_times=max_reconsume_times),
                metadata=self.connection.metadata, timeout=self._timeout())
            check(resp.status)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: send back %r: %s", self.client_id, msg, exc)
            return False
        if resp.destination_topic.startswith("%DLQ%"):
            self.stats.fail += 1
        return True

    # ------------------------------------------------------------------ offsets & reporting

    async def _persist_loop(self) -> None:
        interval = self.config.persist_consumer_offset_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self.persist_offsets()

    async def persist_offsets(self) -> None:
        owned = [mq for mq, pq in self.rebalance_impl.process_queue_table.items() if not pq.dropped]
        try:
            await self.offset_store.persist_all(owned)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: persist offsets: %s", self.client_id, exc)
            return
        self._emit_offsets(owned)

    def queue_figures(self) -> dict[MessageQueue, dict]:
        store = self.offset_store
        out = {}
        for mq, pq in list(self.rebalance_impl.process_queue_table.items()):
            if pq.dropped:
                continue
            request = self.pull_requests.get(mq)
            out[mq] = pq.figures(store.table.get(mq, -1) if store else -1,
                                 request.next_offset if request else -1)
        return out

    @property
    def assignments(self) -> list[MessageQueue]:
        return [mq for mq in self.rebalance_impl.assignments if mq.topic == self.topic]

    def snapshot_fields(self) -> dict:
        return {
            "orderly": self.orderly,
            "message_model": self.message_model.value,
            "retry_assignments": [mq.label for mq in self.rebalance_impl.assignments if mq.topic != self.topic],
        }
