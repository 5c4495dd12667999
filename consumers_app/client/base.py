"""What every consumer of the lab shares: identity, heartbeats, membership notices,
topic routes, the listener wrapper with the lab's fault knobs, and event reporting.

Lifecycle (the lab controller calls these on every client, whatever its mode):

* ``await start()``      register (heartbeat), then run.
* ``await shutdown()``   graceful: persist offsets, NotifyClientTermination (the group
                         rebalances at once), close.
* ``await abort()``      die as a process does: every loop stops, no offset persist, no
                         termination notice; the connection closes, which the broker
                         notices at once (it then tells the group).
* ``hang()`` / ``resume()``  the listener blocks (heartbeats go on) / unblocks.
* ``cut()``              a network partition: no heartbeats, no close; the broker
                         expires us after its channel expiry. ``resume()`` heals it.
* ``set_slow(ms)``, ``set_fail_ratio(r)``, ``set_strategy(name, **options)``.
* ``snapshot()``         a dict of what this consumer holds right now.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import grpc

from .. import events
from ..message_queue import MessageQueue, shared_queue
from ..offset_ranges import merge_ranges
from ..protocol import lab, v2, v2_service
from .config import ConsumeResult, MessageModel
from ..remoting import wire
from ..remoting.codec import CURRENT_VERSION_DESC
from .connection import Connection, check, new_client_id, resource
from .remoting_connection import RemotingConnection
from .faults import ListenerFaults
from .offset_store import LocalFileOffsetStore, RemoteBrokerOffsetStore
from .session import MemberSession, SessionClosed
from .subscription import SubscriptionVersions

log = logging.getLogger(__name__)

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def _readable(permission) -> bool:
    return permission in (v2.Permission.READ, v2.Permission.READ_WRITE, v2.Permission.PERMISSION_UNSPECIFIED)


class ConsumedRanges:
    """Which queue offsets the listener was given since the last ``drain``, as ranges.

    The lab measures duplicates exactly from these (consumers_app/lab/handoff.py): the same
    queue offset in two clients' ranges was consumed twice. Offsets mostly arrive in order,
    so a note usually just extends the queue's last range; ``drain`` sorts and merges
    whatever concurrent consume threads finished out of order.
    """

    __slots__ = ("_ranges",)

    def __init__(self):
        self._ranges: dict = {}   # MessageQueue -> [[start, end), ...] (end exclusive)

    def note(self, mq, offset: int) -> None:
        ranges = self._ranges.get(mq)
        if ranges is None:
            self._ranges[mq] = [[offset, offset + 1]]
        elif ranges[-1][1] == offset:
            ranges[-1][1] = offset + 1
        else:
            ranges.append([offset, offset + 1])

    def drain(self) -> dict:
        taken, self._ranges = self._ranges, {}
        return {mq: merge_ranges(ranges) for mq, ranges in taken.items()}


class ConsumeStats:
    """Counters: totals for snapshot(), per-interval deltas for ``consume`` events; and
    the offsets consumed per queue in the interval (``consumed``)."""

    __slots__ = ("ok", "retry", "fail", "_last", "consumed")

    def __init__(self):
        self.ok = self.retry = self.fail = 0
        self._last = (0, 0, 0)
        self.consumed = ConsumedRanges()

    def totals(self) -> dict:
        return {"ok": self.ok, "retry": self.retry, "fail": self.fail}

    def interval(self) -> dict | None:
        now = (self.ok, self.retry, self.fail)
        if now == self._last:
            return None
        last, self._last = self._last, now
        return {"ok": now[0] - last[0], "retry": now[1] - last[1], "fail": now[2] - last[2]}


class ConsumerBase:
    mode = "push"
    client_type = v2.ClientType.PUSH_CONSUMER

    def __init__(self, group: str, topic: str, listener=None, config=None, emitter=None,
                 tag_expression: str = "*"):
        self.config = config
        self.group = group
        self.topic = topic
        self.tag_expression = tag_expression
        self.client_id = config.client_id or new_client_id()
        self.emitter = emitter or events.emitter
        self.listener = listener or (lambda msgs: ConsumeResult.SUCCESS)
        self.connection: Connection | None = None
        self.session: MemberSession | None = None   # gRPC only: the remoting client asks over its connection
        self.stats = ConsumeStats()
        self.flow_control_counts: Counter = Counter()
        self.members: list[str] = []
        self._members_hint: list[str] | None = None
        self.topic_queues: dict[str, list[MessageQueue]] = {}
        self.state = "created"  # created | running | stopping | stopped | aborted
        self._tasks: set[asyncio.Task] = set()
        self._persists: set[asyncio.Task] = set()   # one-way persists in flight (spawn_persist)
        self._session: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.faults = ListenerFaults()  # the lab's hang / slow / fail, read by consume threads
        self._fc_last_emit: dict[tuple, float] = {}
        self._last_offsets: dict[MessageQueue, int] = {}
        self._last_pq: dict[MessageQueue, dict] = {}   # figures of the last pq event per queue
        self.subscription_versions = SubscriptionVersions()
        self.start_timestamp_ms = 0   # consumerStartTimestamp (wall clock), set by start()

    # ------------------------------------------------------------------ events

    def emit(self, type: str, **fields) -> None:
        self.emitter.emit(type, self.group, self.client_id, mode=self.mode, **fields)

    def note_offset_moved(self, mq: MessageQueue, from_offset: int, to_offset: int) -> None:
        """The broker corrected a pull offset: say how many messages that skipped."""
        self.emit("offset_moved", topic=mq.topic, queue=mq, from_offset=from_offset, to_offset=to_offset,
                  skipped=max(0, to_offset - from_offset))

    def note_flow_control(self, mq: MessageQueue, fc) -> None:
        """Count every flow-control decision; emit at most one event per queue/reason/interval."""
        self.flow_control_counts[fc.reason] += 1
        key = (mq, fc.reason)
        now = time.monotonic()
        if now - self._fc_last_emit.get(key, -1e9) >= self.config.flow_control_event_interval_ms / 1000:
            self._fc_last_emit[key] = now
            self.emit("flow_control", queue=mq, topic=mq.topic, reason=fc.reason,
                      threshold=fc.threshold, value=fc.value, times=self.flow_control_counts[fc.reason])

    # ------------------------------------------------------------------ tasks

    def spawn(self, coro, name: str | None = None) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_persist(self, coro) -> None:
        """A one-way offset persist (RocketMQ's is on the wire once sent): a graceful
        shutdown lets it finish before the goodbye, an abort drops it with the rest."""
        task = self.spawn(coro, "persist")
        self._persists.add(task)
        task.add_done_callback(self._persists.discard)

    def _open_session(self) -> None:
        """The membership watch, open for the client's life: the broker's sign that our
        connection is up (closing it is how a dead process leaves at once)."""
        self._session = self.spawn(self._watch_membership(), "session")

    async def _close_session(self) -> None:
        task, self._session = self._session, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _cancel_tasks(self, keep_persists: bool = False) -> None:
        """Every loop but the session, which stays open until the goodbye is said (and, for
        a graceful stop, the persists in flight)."""
        keep = {asyncio.current_task(), self._session, *(self._persists if keep_persists else ())}
        tasks = [t for t in self._tasks if t not in keep]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def running(self) -> bool:
        return self.state == "running"

    # ------------------------------------------------------------------ lifecycle (template)

    async def _connect_with_offset_store(self) -> None:
        """Open the broker connection and the offset store of the message model:
        the broker keeps a clustering group's offsets, a broadcasting consumer keeps
        its own in a local file (RocketMQ's RemoteBrokerOffsetStore / LocalFileOffsetStore)."""
        cfg = self.config
        self.start_timestamp_ms = time.time_ns() // 1_000_000
        if cfg.namesrv:
            self.connection = RemotingConnection(cfg.namesrv, self.client_id, owner=self,
                                                 timeout_s=cfg.rpc_timeout_ms / 1000)
        else:
            self.connection = Connection(cfg.endpoints, self.client_id)
            self.session = MemberSession(self.connection, self.group)
        if self.message_model is MessageModel.CLUSTERING:
            self.offset_store = RemoteBrokerOffsetStore(self.group, self.connection, cfg.rpc_timeout_ms / 1000,
                                                        session=self.session)
        else:
            self.offset_store = LocalFileOffsetStore(self.group, self.client_id, cfg.offset_store_dir)
        await self.offset_store.load()

    async def shutdown(self) -> None:
        """Graceful: stop working, persist, say goodbye (the group rebalances at once), close."""
        if self.state != "running":
            return
        self.state = "stopping"
        await self._stop_work(graceful=True)
        self._emit_consumed()   # what the listener took before it stopped is consumed all the same
        if self._persists:   # a released queue's offset: its next owner starts there
            await asyncio.gather(*self._persists, return_exceptions=True)
        await self._persist_on_shutdown()
        await self.notify_termination()
        await self._close_session()
        self._forget_assignments()
        self.emit_assignment("shutdown")
        await self.connection.close()
        self.state = "stopped"

    async def abort(self) -> None:
        """Die without goodbye: no persist, no termination notice; the broker must expire us."""
        if self.state not in ("running", "stopping"):
            return
        self.state = "aborted"
        await self._stop_work()
        self._emit_consumed()   # a killed client's last messages were consumed: duplicates count them
        await self._close_session()
        self._forget_assignments()
        self.emit("fault", fault="kill")
        await self.connection.close()

    async def _stop_work(self, graceful: bool = False) -> None:
        """Shared first step of shutdown and abort: end every loop (a graceful stop keeps
        the persists in flight), let consume threads go, stop the consume pool. Push
        overrides it to also stop pulling and drop its process queues in between."""
        await self._cancel_tasks(keep_persists=graceful)
        self._release_threads()
        self._stop_consume_pool()

    def _stop_consume_pool(self) -> None:
        """Each mode runs its listener on its own pool; stop it without waiting."""

    async def _persist_on_shutdown(self) -> None:
        """Graceful shutdown only, before the termination notice: keep what was consumed
        so the next owner starts there. Default: nothing to persist (POP acks as it goes)."""

    def _forget_assignments(self) -> None:
        """Drop every queue we held, so the final ``assignment`` event and snapshot() are empty."""

    def emit_assignment(self, reason: str) -> None:
        """``assignment`` event: what this consumer holds now; each mode says what it holds."""
        raise NotImplementedError

    async def _rebalance(self) -> bool:
        """RebalanceService's callback for the modes with a client-side rebalance (push,
        lite pull): nothing to do once no longer running."""
        if not self.running:
            return True
        return await self.rebalance_impl.do_rebalance()

    # ------------------------------------------------------------------ broker calls

    def _timeout(self) -> float:
        return self.config.rpc_timeout_ms / 1000

    async def send_heartbeat(self) -> None:
        resp = await self.connection.v2.Heartbeat(
            v2_service.HeartbeatRequest(group=resource(self.group), client_type=self.client_type),
            metadata=self.connection.metadata, timeout=self._timeout())
        check(resp.status)

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.send_heartbeat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next period
                log.warning("%s heartbeat failed: %s", self.client_id, exc)

    async def query_route(self, topic: str) -> list[MessageQueue] | None:
        """Readable queues of ``topic`` (None if the broker does not know the topic)."""
        try:
            resp = await self.connection.v2.QueryRoute(
                v2_service.QueryRouteRequest(topic=resource(topic)),
                metadata=self.connection.metadata, timeout=self._timeout())
        except grpc.aio.AioRpcError as exc:
            log.warning("route of %s: %s", topic, exc.code())
            return self.topic_queues.get(topic)
        if resp.status.code != v2.Code.OK:
            return None
        return sorted(shared_queue(mq.topic.name, mq.broker.name, mq.id)
                      for mq in resp.message_queues if _readable(mq.permission))

    async def refresh_routes(self) -> bool:
        """updateTopicSubscribeInfo: returns True when some topic's queue set changed."""
        changed = False
        topics = list(self.subscriptions)
        # One round trip for all of them (the topic and its %RETRY%), not one per topic.
        answers = await asyncio.gather(*(self.query_route(topic) for topic in topics))
        for topic, queues in zip(topics, answers):
            if queues is None:
                if self.topic_queues.pop(topic, None) is not None:
                    changed = True
                continue
            if self.topic_queues.get(topic) != queues:
                self.topic_queues[topic] = queues
                changed = True
        return changed

    async def _route_loop(self) -> None:
        interval = self.config.poll_name_server_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                if await self.refresh_routes():
                    # What the page times: a queue or broker change reaches us only here.
                    self.emit("route", topic=self.topic,
                              queues=list(self.topic_queues.get(self.topic) or ()))
                    self.on_route_changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("%s route refresh failed: %s", self.client_id, exc)

    def on_route_changed(self) -> None:
        """Queues were added or removed: subclasses rebalance."""

    async def list_members(self) -> list[str] | None:
        """findConsumerIdList: the group's live client ids.

        After a membership notice the notice's own list is used (it is the broker's
        list at that change, and saves 64 consumers 64 calls at once); otherwise, as
        in RocketMQ, the broker is asked.
        """
        hint, self._members_hint = self._members_hint, None
        if hint is not None:
            self.members = hint
            return hint
        resp = await self.connection.lab.ListGroupMembers(
            lab.GroupRequest(group=self.group), metadata=self.connection.metadata, timeout=self._timeout())
        check(resp.status)
        self.members = list(resp.client_ids)
        return self.members

    async def _watch_membership(self) -> None:
        """The lab's 'consumer ids changed' notice: rebalance at once on every change."""
        while True:
            try:
                async for change in self._membership_changes():
                    if self.cut_off:
                        continue  # partitioned: the notice never reaches us
                    members = list(change.client_ids)
                    self.emit("membership", members=members, joined=list(change.joined),
                              left=list(change.left), reason=change.reason)
                    # Rebalance on every change, and on the initial list if it differs from
                    # the one our last rebalance used (a change we missed while not watching).
                    # No last list yet: the start-up rebalance will ask the broker anyway.
                    if change.reason != "initial" or (self.members and members != self.members):
                        self._members_hint = members
                        self.on_membership_changed(change)
                    self.members = members
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-subscribe; the periodic rebalance covers the gap
                log.info("%s membership watch ended: %s", self.client_id, exc)
            await asyncio.sleep(1.0)

    def _membership_changes(self):
        """The broker's notices: on our session when we have one (a rebalance's requests ride
        along), else LabAdmin.WatchMembership."""
        if self.session is not None:
            return self.session.changes()
        return self.connection.lab.WatchMembership(lab.GroupRequest(group=self.group), metadata=self.connection.metadata)

    def on_membership_changed(self, change) -> None:
        """Subclasses rebalance."""

    async def pull_batch(self, pull: lab.PullBatchRequest, timeout_s: float) -> lab.PullBatchResponse:
        """LabAdmin.PullBatch on our session while it is open (a message on an open stream
        costs each side less than a call of its own: ~10 % more messages a second), else by
        a call (the remoting connection translates it to PULL_MESSAGE)."""
        session = self.session
        if session is not None and session.usable:
            try:
                return await session.pull(pull, timeout_s)
            except SessionClosed:
                pass
        conn = self.connection
        return await conn.lab.PullBatch(pull, metadata=conn.metadata, timeout=timeout_s)

    async def notify_termination(self) -> None:
        try:
            await self.connection.v2.NotifyClientTermination(
                v2_service.NotifyClientTerminationRequest(group=resource(self.group)),
                metadata=self.connection.metadata, timeout=self._timeout())
        except Exception as exc:  # noqa: BLE001 - the broker will expire us anyway
            log.warning("%s termination notice failed: %s", self.client_id, exc)

    # ------------------------------------------------------------------ listener (consume threads)

    def call_listener(self, msgs) -> ConsumeResult:
        """Run the user's listener with the lab's faults applied. Runs on a consume thread.

        Returns None when the consumer is closing while the listener was held by hang().
        """
        faults = self.faults
        if not faults.pass_gate():
            return None
        if faults.injects_failure():
            return ConsumeResult.RECONSUME_LATER
        try:
            result = self.listener(msgs)
        except Exception:  # noqa: BLE001 - RocketMQ treats a throwing listener as RECONSUME_LATER
            log.exception("listener of %s raised", self.client_id)
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.RECONSUME_LATER if result is None else result

    # ------------------------------------------------------------------ lab controls

    hung = property(lambda self: self.faults.hung)
    slow_ms = property(lambda self: self.faults.slow_ms)
    fail_ratio = property(lambda self: self.faults.fail_ratio)

    @property
    def cut_off(self) -> bool:
        return self.connection is not None and self.connection.network.active

    def hang(self) -> None:
        """Keep heartbeating, stop consuming: the listener blocks until resume()."""
        self.faults.hang()
        self.emit("fault", fault="hang")

    def cut(self) -> None:
        """A network partition: calls go unanswered, nothing is closed. Consume threads go
        on with what is cached; the broker expires us after its channel expiry."""
        if self.connection is not None:
            self.connection.network.cut()
        self.emit("fault", fault="cut")

    def resume(self) -> None:
        """Un-hang and heal a cut."""
        self.faults.resume()
        if self.connection is not None:
            self.connection.network.heal()
        self.emit("fault", fault="resume")

    def set_slow(self, ms_per_message: float) -> None:
        self.faults.slow_ms = max(0.0, float(ms_per_message))
        self.emit("fault", fault="slow", ms=self.slow_ms)

    def set_fail_ratio(self, ratio: float) -> None:
        self.faults.fail_ratio = min(1.0, max(0.0, float(ratio)))
        self.emit("fault", fault="fail", ratio=self.fail_ratio)

    def _emit_offsets(self, owned) -> None:
        """``offset`` event: the committed offsets (this topic) that moved since the last one."""
        owned = set(owned)
        current = {mq: off for mq, off in self.offset_store.table.items()
                   if mq in owned and mq.topic == self.topic}
        last = self._last_offsets
        changed = {mq: off for mq, off in current.items() if last.get(mq) != off}
        if changed:
            last.update(changed)
            self.emit("offset", topic=self.topic, offsets=changed)

    def _release_threads(self) -> None:
        self.faults.release()

    async def _consume_event_loop(self) -> None:
        interval = self.config.consume_event_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._emit_consumed()

    def _emit_consumed(self) -> None:
        """``consume`` event: counts and consumed offset ranges since the last one."""
        counts = self.stats.interval()
        ranges = self.stats.consumed.drain()
        if counts or ranges:
            self.emit("consume", topic=self.topic, interval_ms=self.config.consume_event_interval_ms,
                      **(counts or {}), ranges=ranges or None)

    # ------------------------------------------------------------------ queues and snapshot
    # One report for every client kind: each says which queues it holds (queue_figures)
    # and what else describes it (snapshot_fields); the pq events and the snapshot follow.

    @property
    def strategy_name(self) -> str:
        return self.rebalance_impl.strategy.name

    @property
    def assignments(self) -> list[MessageQueue]:
        """The subscribed topic's queues this consumer owns."""
        raise NotImplementedError

    def queue_figures(self) -> dict[MessageQueue, dict]:
        """Per queue held: the ``pq`` event fields (cached_count, cached_bytes, span, ...)."""
        raise NotImplementedError

    def forget_queue(self, mq: MessageQueue) -> None:
        self._last_pq.pop(mq, None)

    async def _pq_event_loop(self) -> None:
        """A ``pq`` event per queue whose figures changed since its last one."""
        interval = self.config.pq_event_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            for mq, figures in self.queue_figures().items():
                if self._last_pq.get(mq) != figures:
                    self._last_pq[mq] = figures
                    self.emit("pq", topic=mq.topic, queue=mq, **figures)

    def snapshot_fields(self) -> dict:
        """What only this kind of client reports (merged into ``snapshot()``)."""
        return {}

    def subscription_set(self) -> list[dict]:
        """Our subscriptions as Java's SubscriptionData (heartbeats and running info)."""
        return self.subscription_versions.data(self.subscriptions)

    def pull_sub_version(self, topic: str) -> int:
        """The subVersion a pull of ``topic`` carries (the push consumer's, as pullMessage)."""
        return self.subscription_versions.version(topic, self.subscriptions.get(topic))

    #: ConsumerRunningInfo's properties from our config, by the Java field names
    #: MixAll.object2Properties writes for DefaultMQPushConsumer / DefaultLitePullConsumer.
    RUNNING_INFO_FIELDS = (
        ("consumeThreadMin", "consume_thread_min"), ("consumeThreadMax", "consume_thread_max"),
        ("consumeConcurrentlyMaxSpan", "consume_concurrently_max_span"), ("consumeMaxSpan", "consume_max_span"),
        ("pullThresholdForQueue", "pull_threshold_for_queue"),
        ("pullThresholdSizeForQueue", "pull_threshold_size_for_queue_mib"),
        ("pullThresholdForTopic", "pull_threshold_for_topic"),
        ("pullThresholdSizeForTopic", "pull_threshold_size_for_topic_mib"),
        ("pullThresholdForAll", "pull_threshold_for_all"), ("pullInterval", "pull_interval_ms"),
        ("consumeMessageBatchMaxSize", "consume_message_batch_max_size"), ("pullBatchSize", "pull_batch_size"),
        ("maxReconsumeTimes", "max_reconsume_times"),
        ("suspendCurrentQueueTimeMillis", "suspend_current_queue_time_ms"),
        ("autoCommit", "auto_commit"), ("autoCommitIntervalMillis", "auto_commit_interval_ms"),
        ("pollTimeoutMillis", "poll_timeout_ms"), ("brokerSuspendMaxTimeMillis", "broker_suspend_max_time_ms"),
        ("consumerTimeoutMillisWhenSuspend", "consumer_timeout_ms_when_suspend"),
        ("pollNameServerInterval", "poll_name_server_interval_ms"),
        ("heartbeatBrokerInterval", "heartbeat_interval_ms"),
        ("persistConsumerOffsetInterval", "persist_consumer_offset_interval_ms"),
        ("pullTimeDelayMillsWhenException", "pull_time_delay_ms_when_exception"),
        ("mqClientApiTimeout", "rpc_timeout_ms"),
    )

    def running_info(self) -> dict:
        """ConsumerRunningInfo, as a Java consumer answers GET_CONSUMER_RUNNING_INFO over
        remoting (DefaultMQPushConsumerImpl.consumerRunningInfo + what MQClientInstance
        adds): properties, subscriptions and the mqTable of ProcessQueue info, so
        mqadmin-style tools (and the lab's observer) see what it really holds.
        ProcessQueue times go out as wall-clock ms, as Java's ``System.currentTimeMillis()``."""
        impl = getattr(self, "rebalance_impl", None)
        offsets = getattr(self, "offset_store", None)
        mono_now, wall_now = time.monotonic_ns() // 1_000_000, time.time_ns() // 1_000_000

        def wall(mono_ms: int) -> int:
            return wall_now - (mono_now - mono_ms)

        table = {}
        for mq, pq in list(impl.process_queue_table.items()) if impl is not None else ():
            consuming = sorted(pq.consuming_orderly)
            table[wire.message_queue_key(mq.topic, mq.broker_name, mq.queue_id)] = {
                "commitOffset": offsets.table.get(mq, -1) if offsets is not None else -1,
                "cachedMsgMinOffset": pq.first_offset() or 0, "cachedMsgMaxOffset": pq.last_offset() or 0,
                "cachedMsgCount": pq.msg_count, "cachedMsgSizeInMiB": pq.msg_size >> 20,
                "transactionMsgMinOffset": consuming[0] if consuming else 0,
                "transactionMsgMaxOffset": consuming[-1] if consuming else 0,
                "transactionMsgCount": len(consuming),
                "locked": pq.locked, "tryUnlockTimes": pq.try_unlock_times, "lastLockTimestamp": wall(pq.last_lock_ts),
                "droped": pq.dropped, "lastPullTimestamp": wall(pq.last_pull_ts),
                "lastConsumeTimestamp": wall(pq.last_consume_ts),
            }
        cfg = self.config
        where = getattr(cfg, "consume_from_where", None)
        properties = {java: str(getattr(cfg, name)).lower() if isinstance(getattr(cfg, name), bool)
                      else str(getattr(cfg, name))
                      for java, name in self.RUNNING_INFO_FIELDS if hasattr(cfg, name)}
        properties.update({
            "consumerGroup": self.group, "messageModel": self.message_model.value,
            "allocateMessageQueueStrategy": self.strategy_name, "namesrvAddr": cfg.namesrv,
            "unitMode": "false",
            "PROP_CONSUMER_START_TIMESTAMP": str(self.start_timestamp_ms),
            "PROP_NAMESERVER_ADDR": f"{cfg.namesrv};" if cfg.namesrv else "",
            "PROP_CONSUME_TYPE": "CONSUME_ACTIVELY" if self.mode == "lite_pull" else "CONSUME_PASSIVELY",
            "PROP_CLIENT_VERSION": CURRENT_VERSION_DESC,
        })
        if where is not None:
            properties["consumeFromWhere"] = where.value
        if self.mode == "push":   # only DefaultMQPushConsumerImpl adds these two
            properties["PROP_CONSUMEORDERLY"] = str(bool(getattr(self, "orderly", False))).lower()
            properties["PROP_THREADPOOL_CORE_SIZE"] = str(cfg.consume_thread_min)
        return {"properties": properties, "subscriptionSet": self.subscription_set(),
                "mqTable": table, "statusTable": {}, "jstack": ""}

    def snapshot(self) -> dict:
        """The consumer as the lab's worker reports it (queues keyed as in events: label,
        or TOPIC/label for another topic's queue)."""
        return {
            "client_id": self.client_id,
            "group": self.group,
            "mode": self.mode,
            "state": self.state,
            "strategy": self.strategy_name,
            "assignments": [mq.label for mq in self.assignments],
            "queues": {events.queue_text(mq, self.topic): figures
                       for mq, figures in sorted(self.queue_figures().items())},
            "flow_control_counts": dict(self.flow_control_counts),
            "consumed": self.stats.totals(),
            "hung": self.hung,
            "slow_ms": self.slow_ms,
            "fail_ratio": self.fail_ratio,
            "members": list(self.members),
            **self.snapshot_fields(),
        }
