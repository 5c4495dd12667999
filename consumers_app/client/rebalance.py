"""Client-side rebalance: RebalanceService (when) and RebalanceImpl (what).

RebalanceService wakes every ``waitInterval`` (20 s) or at once when woken (a
membership notice, a strategy switch, start-up), but never sooner than ``minInterval``
(1 s) after the previous run; an unbalanced run (the queues held are not exactly the
allocated ones: an orderly queue whose broker lock we could not get, a start offset the
broker failed to answer) is retried after ``minInterval`` (RocketMQ 5.2, ISSUE #7644).
No member list is no reason to hurry: it waits for the next period, as 5.3 does.

RebalanceImpl.rebalanceByTopic (CLUSTERING): take the topic's queues (cached route)
and the group's consumer ids (asked from the broker), sort both exactly as Java does,
let the strategy pick this consumer's share, then updateProcessQueueTableInRebalance:
queues no longer ours are marked dropped and removed (offset persisted first); new
ones get a ProcessQueue, a start offset (computePullFromWhere) and a PullRequest.
BROADCASTING takes every queue. Every consumer does this alone, on the same inputs,
so they agree without talking to each other.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..allocate import get_strategy
from ..javastr import java_key
from ..message_queue import MessageQueue
from .config import MessageModel
from .waiting import Wakeup

log = logging.getLogger(__name__)


def diff_assignment(owned, allocated) -> tuple[list[MessageQueue], list[MessageQueue]]:
    """(added, removed), each sorted: what a rebalance must create and drop."""
    owned, allocated = set(owned), set(allocated)
    return sorted(allocated - owned), sorted(owned - allocated)


def mq_sort_key(mq: MessageQueue):
    """MessageQueue.compareTo as a key: topic, broker name (Java string order), queue id."""
    return (java_key(mq.topic), java_key(mq.broker_name), mq.queue_id)


def allocate(strategy, group: str, client_id: str, mq_set, cid_all) -> list[MessageQueue]:
    """Sort as RebalanceImpl does (Collections.sort on both lists), then ask the strategy.

    Same order as ``allocate.sort_for_allocation``; a key sort computes each element's
    Java-order key once instead of twice per comparison (it matters at 64 x 256).
    """
    return allocate_sorted(strategy, group, client_id,
                           sorted(mq_set, key=mq_sort_key), sorted(cid_all, key=java_key))


def allocate_sorted(strategy, group: str, client_id: str, mq_all, cids) -> list[MessageQueue]:
    """``allocate`` on lists already sorted as Java sorts them (each call gets its own copies)."""
    if not mq_all or not cids:
        return []
    return list(strategy.allocate(group, client_id, list(mq_all), list(cids)) or [])


class _SortedCache:
    """The last sorted copy of one input: the queue set of a topic only changes with its
    route, the member list only on a membership change, so a rebalance after a notice
    re-sorts 64 ids but not 256 queues (x 64 consumers in one worker)."""

    __slots__ = ("_key", "_sorted")

    def __init__(self):
        self._key = self._sorted = None

    def get(self, items, key_fn) -> list:
        key = tuple(items)  # compared element by element (identical objects: pointer checks)
        if key != self._key:
            self._sorted = sorted(key, key=key_fn)
            self._key = key
        return self._sorted


class RebalanceService:
    """The wait/wake loop around ``rebalance()`` (an async callable returning balanced)."""

    def __init__(self, rebalance, wait_interval_ms: int = 20_000, min_interval_ms: int = 1_000):
        self._rebalance = rebalance
        self.wait_s = wait_interval_ms / 1000
        self.min_s = min_interval_ms / 1000
        self._wakeup = Wakeup()
        self.last_rebalance = 0.0  # monotonic seconds
        self.runs = 0

    def wakeup(self) -> None:
        """rebalanceImmediately(): run as soon as minInterval allows."""
        self._wakeup.set()

    async def run(self) -> None:
        real_wait = self.wait_s
        while True:
            await self._wakeup.wait(real_wait)
            since = time.monotonic() - self.last_rebalance
            if since < self.min_s:
                real_wait = self.min_s - since
                self._wakeup.set()  # we owe a run: do it once minInterval has passed
                await asyncio.sleep(real_wait)
                continue
            try:
                balanced = await self._rebalance()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed run is retried at minInterval
                log.exception("rebalance failed")
                balanced = False
            self.runs += 1
            self.last_rebalance = time.monotonic()
            real_wait = self.wait_s if balanced else self.min_s


class RebalanceImpl:
    """The queue-table bookkeeping shared by the push and lite-pull consumers.

    ``consumer`` provides: ``group``, ``client_id``, ``message_model``, ``orderly``,
    ``subscriptions`` {topic: tag expression}, ``topic_queues`` {topic: [mq]},
    ``async list_members()``, ``async compute_pull_from_where(topic, mqs)`` ->
    {mq: offset}, ``create_process_queue(mq)``, ``async remove_unnecessary(mq, pq)`` ->
    bool, ``async lock(mq)`` -> bool (orderly), ``on_queues_added(list[(mq, pq, offset)])``,
    ``on_queues_changed(topic, mq_all, mine)`` and ``emit(type, **fields)``.
    """

    def __init__(self, consumer, strategy_name: str = "AVG", **strategy_options):
        self.consumer = consumer
        self.strategy = get_strategy(strategy_name, **strategy_options)
        self.process_queue_table: dict[MessageQueue, object] = {}
        self._lock = asyncio.Lock()  # one rebalance at a time per consumer
        self._sorted_mqs: dict[str, _SortedCache] = {}
        self._sorted_cids = _SortedCache()
        self.last_reason = "start"
        self._removed_between: list[MessageQueue] = []   # remove_process_queue since the last run

    def set_strategy(self, name: str, **options) -> None:
        self.strategy = get_strategy(name, **options)

    @property
    def assignments(self) -> list[MessageQueue]:
        return sorted((mq for mq, pq in self.process_queue_table.items() if not pq.dropped), key=mq_sort_key)

    async def do_rebalance(self, reason: str | None = None) -> bool:
        async with self._lock:
            c = self.consumer
            reason = reason or self.last_reason
            self.last_reason = "periodic"
            started = time.monotonic()
            c.emit("rebalance", topic=c.topic, phase="start", reason=reason, strategy=self.strategy.name)
            balanced = True
            added_all: list[MessageQueue] = []
            removed_all, self._removed_between = self._removed_between, []
            cid_all = None
            if c.message_model is MessageModel.CLUSTERING:
                try:
                    cid_all = await c.list_members()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - findConsumerIdList: null, nothing moves
                    log.warning("%s: member list of %s: %s", c.client_id, c.group, exc)
            for topic in list(c.subscriptions):
                try:
                    ok, added, removed = await self._rebalance_by_topic(topic, cid_all)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - as RebalanceImpl: log, go on
                    log.warning("rebalance of %s failed: %s", topic, exc)
                    ok, added, removed = False, [], []
                balanced = balanced and ok
                added_all += added
                removed_all += removed
            removed_all += await self._truncate_not_my_topic()
            duration_ms = round((time.monotonic() - started) * 1000, 3)
            c.emit("rebalance", topic=c.topic, phase="end", reason=reason, strategy=self.strategy.name,
                   duration_ms=duration_ms, added=added_all, removed=removed_all, balanced=balanced)
            if added_all or removed_all or reason in ("start", "strategy"):
                c.emit_assignment(reason)
            return balanced

    async def _rebalance_by_topic(self, topic: str, cid_all):
        c = self.consumer
        mq_set = c.topic_queues.get(topic)
        if c.message_model is MessageModel.BROADCASTING:
            if mq_set is None:
                return True, [], []
            return await self._update_table(topic, set(mq_set))
        if mq_set is None or not cid_all:
            # No route yet (e.g. %RETRY% before the first send-back), or no member list: a
            # 5.3 broker answers a memberless group with SYSTEM_ERROR, findConsumerIdList
            # returns null and rebalanceByTopic does nothing, balanced: the next try is the
            # periodic one (an empty list counts the same: never "drop every queue").
            if mq_set is not None:
                log.warning("%s: no member list for %s; keeping the current assignment", c.client_id, c.group)
            return True, [], []
        if not mq_set:
            # Java's strategies throw on an empty queue list and rebalanceByTopic keeps
            # what it has, unbalanced (retried at minInterval).
            log.warning("%s: %s has no queue; keeping the current assignment", c.client_id, topic)
            return False, [], []
        mq_all = self._sorted_mqs.setdefault(topic, _SortedCache()).get(mq_set, mq_sort_key)
        cids = self._sorted_cids.get(cid_all, java_key)
        mine = allocate_sorted(self.strategy, c.group, c.client_id, mq_all, cids)
        return await self._update_table(topic, set(mine), mq_set)

    async def _update_table(self, topic: str, mine: set, mq_all=None):
        """updateProcessQueueTableInRebalance; returns (balanced, added, removed).

        Balanced as 5.3 says it: ``mine`` is exactly the topic's queues held by ProcessQueues
        that are not dropped (anything else is retried at minInterval)."""
        c = self.consumer
        table = self.process_queue_table
        removed = []
        for mq, pq in list(table.items()):
            if mq.topic != topic:
                continue
            # A queue ours again whose removal is still pending (an orderly queue that was
            # consuming) keeps its dropped ProcessQueue until the pull expires, as in 5.3:
            # only then is it removed and, below, created anew.
            if mq not in mine or c.is_pull_expired(pq):
                pq.dropped = True
                if await c.remove_unnecessary(mq, pq):
                    table.pop(mq, None)
                    removed.append(mq)
        candidates = []
        for mq in sorted(mine, key=mq_sort_key):  # one key per queue, not two per comparison
            if mq in table:
                continue
            if c.orderly and c.message_model is MessageModel.CLUSTERING and not await c.lock(mq):
                continue  # someone else still holds it: unbalanced, retried at minInterval
            candidates.append(mq)
        added = []
        if candidates:
            offsets = await c.compute_pull_from_where(topic, candidates)
            new = []
            for mq in candidates:
                offset = offsets.get(mq, -1)
                if offset is None or offset < 0 or mq in table:
                    continue  # could not compute (the broker failed to answer): next round
                pq = c.create_process_queue(mq)
                table[mq] = pq
                new.append((mq, pq, offset))
                added.append(mq)
            c.on_queues_added(new)
        if added or removed:
            c.on_queues_changed(topic, mq_all if mq_all is not None else mine, mine)
        working = {mq for mq, pq in table.items() if mq.topic == topic and not pq.dropped}
        return working == mine, added, removed

    async def remove_process_queue(self, mq) -> None:
        """removeProcessQueue: forget the queue's ProcessQueue now (the OFFSET_ILLEGAL fix);
        the next rebalance creates a new one."""
        async with self._lock:   # not in the middle of a rebalance's own removals
            pq = self.process_queue_table.pop(mq, None)
            if pq is not None:
                pq.dropped = True
                await self.consumer.remove_unnecessary(mq, pq)
                self._removed_between.append(mq)   # reported by the next rebalance's end event

    async def _truncate_not_my_topic(self) -> list[MessageQueue]:
        c = self.consumer
        removed = []
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic not in c.subscriptions:
                pq.dropped = True
                self.process_queue_table.pop(mq, None)
                removed.append(mq)
        return removed
