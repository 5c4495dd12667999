"""Consume services: hand pulled messages to the listener on the consume thread pool.

* Concurrently (ConsumeMessageConcurrentlyService): any thread, any order. Failed
  messages (RECONSUME_LATER) are sent back to the broker (%RETRY%{group}, delay level
  3 + reconsume times; the DLQ after maxReconsumeTimes); the commit offset is the
  lowest offset still cached, so one slow message holds it back.
* Orderly (ConsumeMessageOrderlyService): one queue is consumed by one thread at a
  time, in offset order, only while this consumer holds the queue's broker lock
  (clustering); a failure suspends the queue and retries the same message.

The listener gets one message per call (consumeMessageBatchMaxSize = 1), and any idle
thread takes the next message, as in RocketMQ; but we do not pay one future and one
loop wake-up per message: see ConsumePool (concurrently). Orderly hands a thread a run
of a queue's messages at a time, sized by the measured listener time.

State (ProcessQueue, offsets) is only touched on the event loop; threads run the
listener and post the results back with ``call_soon_threadsafe``.
"""
from __future__ import annotations

import asyncio
import logging
import time

from .config import ConsumeResult, MessageModel
from .consume_pool import ConsumePool

log = logging.getLogger(__name__)

SUCCESS = ConsumeResult.SUCCESS


class _ListenerTimer:
    """EWMA of the listener's time per message (seconds), measured on consume threads."""

    def __init__(self):
        self.per_message = 0.0

    def observe(self, seconds: float, n: int) -> None:
        if n:
            self.per_message = 0.8 * self.per_message + 0.2 * (seconds / n)

    def chunk(self, budget_ms: float, n: int) -> int:
        if self.per_message <= 0:
            return n
        return max(1, min(n, int(budget_ms / 1000 / self.per_message)))


class ConcurrentlyConsumeService:
    def __init__(self, consumer, executor=None):
        self.consumer = consumer
        self.loop = asyncio.get_running_loop()
        cfg = consumer.config
        self.pool = ConsumePool(self.loop, cfg.consume_thread_max, self._call, self._on_results,
                                name=f"consume-{consumer.client_id}", budget_ms=cfg.consume_dispatch_budget_ms)
        self.clustering = cfg.message_model is MessageModel.CLUSTERING
        self.max_reconsume = cfg.effective_max_reconsume_times(orderly=False)

    def shutdown(self) -> None:
        self.pool.shutdown()

    # -- event loop side

    def submit(self, msgs, pq, mq, dispatch_to_consume: bool = True) -> None:
        pq.inflight += len(msgs)
        self.pool.submit([(m, pq) for m in msgs])

    def submit_later(self, msgs, pq, mq, delay_ms: int) -> None:
        def again():
            if not pq.dropped and self.consumer.running:
                self.submit(msgs, pq, mq)
        self.loop.call_later(delay_ms / 1000, again)

    def _call(self, item):
        """ConsumeRequest.run: a queue dropped by rebalance is not consumed any more -
        its next owner re-pulls from the committed offset (the hand-off's duplicates)."""
        msg, pq = item
        if pq.dropped or self.consumer.state != "running":
            return None
        return self.consumer.call_listener([msg])

    def _on_results(self, done) -> None:
        """processConsumeResult for whatever finished since the last wake-up (on the loop)."""
        c = self.consumer
        per_queue: dict = {}
        consumed = c.stats.consumed.note
        for (msg, pq), status in done:
            pq.inflight -= 1
            if status is not None:   # the listener had it, whatever happens to the queue now
                consumed(msg.queue, msg.pb.queue_offset)
            if pq.dropped or status is None:
                # Rebalanced away (or shutting down) meanwhile: the new owner re-pulls
                # from the committed offset; this is where RocketMQ's duplicates come from.
                continue
            entry = per_queue.get(pq)
            if entry is None:
                entry = per_queue[pq] = (msg.queue, [], [])
            if status is SUCCESS:
                entry[1].append(msg.pb.queue_offset)
            else:
                entry[2].append(msg)
        for pq, (mq, ok, failed) in per_queue.items():
            c.stats.ok += len(ok)
            if failed:
                c.stats.retry += len(failed)
                if not self.clustering:
                    # BROADCASTING: failures are dropped (logged), never sent back.
                    c.stats.fail += len(failed)
                    ok += [m.pb.queue_offset for m in failed]
                    failed = None
            if ok:
                self._commit(ok, pq, mq)
            if failed:
                c.spawn(self._send_back(failed, pq, mq))

    def _commit(self, offsets, pq, mq) -> None:
        offset = pq.remove_messages(offsets)
        if offset >= 0 and not pq.dropped:
            self.consumer.offset_store.update_offset(mq, offset, True)

    async def _send_back(self, failed, pq, mq) -> None:
        c = self.consumer
        results = await asyncio.gather(*(c.send_back(m, 0, self.max_reconsume) for m in failed),
                                       return_exceptions=True)
        sent, again = [], []
        for msg, ok in zip(failed, results):
            if ok is True:
                sent.append(msg.pb.queue_offset)
            else:
                msg.pb.reconsume_times += 1
                again.append(msg)
        if pq.dropped:
            return
        if sent:
            self._commit(sent, pq, mq)
        if again:
            # sendMessageBack failed: keep them cached, consume again locally in 5 s.
            self.submit_later(again, pq, mq, c.config.consume_request_later_delay_ms)


class OrderlyConsumeService:
    def __init__(self, consumer, executor):
        self.consumer = consumer
        self.executor = executor
        self.timer = _ListenerTimer()
        self.loop = asyncio.get_running_loop()
        self.clustering = consumer.config.message_model is MessageModel.CLUSTERING
        self.max_reconsume = consumer.config.effective_max_reconsume_times(orderly=True)
        self._queue_locks: dict = {}  # the local per-queue lock (MessageQueueLock)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._queue_locks: dict = {}  # the local per-queue lock (MessageQueueLock)

    def submit(self, msgs, pq, mq, dispatch_to_consume: bool) -> None:
        if dispatch_to_consume:
            self.consumer.spawn(self._consume_queue(pq, mq))

    def submit_later(self, pq, mq, delay_ms: float) -> None:
        def again():
            if not pq.dropped and self.consumer.running:
                self.consumer.spawn(self._consume_queue(pq, mq))
        self.loop.call_later(delay_ms / 1000, again)

    def _try_lock_later_and_reconsume(self, pq, mq, delay_ms: float) -> None:
        async def relock():
            await asyncio.sleep(delay_ms / 1000)
            if pq.dropped or not self.consumer.running:
                return
            locked = await self.consumer.lock(mq)
            self.submit_later(pq, mq, 10 if locked else 3_000)
        self.consumer.spawn(relock())

    async def _consume_queue(self, pq, mq) -> None:
        c = self.consumer
        cfg = c.config
        if pq.dropped:
            return
        lock = self._queue_locks.setdefault(mq, asyncio.Lock())
        async with lock:
            if self.clustering and not (pq.locked and not pq.is_lock_expired(cfg.rebalance_lock_max_live_time_ms)):
                if not pq.dropped:
                    self._try_lock_later_and_reconsume(pq, mq, 100)
                return
            started = time.monotonic()
            while True:
                if pq.dropped:
                    break
                if self.clustering and not pq.locked:
                    self._try_lock_later_and_reconsume(pq, mq, 10)
                    break
                if self.clustering and pq.is_lock_expired(cfg.rebalance_lock_max_live_time_ms):
                    self._try_lock_later_and_reconsume(pq, mq, 10)
                    break
                if time.monotonic() - started > cfg.max_time_consume_continuously_ms / 1000:
                    self.submit_later(pq, mq, 10)  # let other queues have the threads
                    break
                n = self.timer.chunk(cfg.consume_dispatch_budget_ms, cfg.pull_batch_size)
                msgs = pq.take_messages(max(1, n))
                if not msgs:
                    break
                async with pq.consume_lock:
                    if pq.dropped:
                        break
                    pq.inflight += len(msgs)
                    try:
                        statuses = await self.loop.run_in_executor(self.executor, self._run, msgs, pq)
                    finally:
                        pq.inflight -= len(msgs)
                if statuses is None or not self._process(msgs, statuses, pq, mq):
                    break

    def _process(self, msgs, statuses, pq, mq) -> bool:
        """Orderly processConsumeResult; returns continueConsume."""
        c = self.consumer
        for msg in msgs[:len(statuses)]:   # the listener stops at a failure: the rest ran not
            c.stats.consumed.note(mq, msg.pb.queue_offset)
        n_ok = 0
        while n_ok < len(statuses) and statuses[n_ok] is SUCCESS:
            n_ok += 1
        c.stats.ok += n_ok
        cont = True
        if n_ok < len(msgs):
            failed = msgs[n_ok]
            c.stats.retry += 1
            if failed.pb.reconsume_times >= self.max_reconsume:
                # checkReconsumeTimes: give up on it - straight to the DLQ, then move on.
                c.stats.fail += 1
                c.spawn(c.send_back(failed, -1, self.max_reconsume))
                pq.make_message_to_consume_again(msgs[n_ok + 1:])
            else:
                failed.pb.reconsume_times += 1
                pq.make_message_to_consume_again(msgs[n_ok:])
                self.submit_later(pq, mq, c.config.suspend_current_queue_time_ms)
                cont = False
        commit = pq.commit()
        if commit >= 0 and not pq.dropped:
            c.offset_store.update_offset(mq, commit, False)
        return cont

    def _run(self, msgs, pq):
        call = self.consumer.call_listener
        statuses = []
        started = time.perf_counter()
        for m in msgs:
            if pq.dropped:
                return None  # rebalanced away mid-run: the rest is the next owner's
            status = call([m])
            if status is None:
                return None
            statuses.append(status)
            if status is not SUCCESS:
                break  # order: nothing after a failed message may run
        self.timer.observe(time.perf_counter() - started, len(statuses))
        return statuses
