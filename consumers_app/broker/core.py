"""The broker's state and the operations both gRPC services share.

``BrokerCore`` owns the store, topic metadata, offsets, membership, long polling,
pop and delay services, and implements what is common to v2 and the lab service:
choosing a queue and storing messages, batched pull, send-back, queue locks.
Service modules only translate requests and responses.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..javastr import java_hash
from ..message_queue import parse_label
from ..protocol import lab, v2
from . import messages as M
from .delay import DelayService
from .longpoll import LongPollService
from .membership import Membership
from .offsets import OffsetStore
from .pop import PopService
from .store import MessageStore, tag_code
from .topics import RETRY_PREFIX, TopicManager, dlq_topic, retry_topic, topic_error

log = logging.getLogger(__name__)
Code = v2.Code

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 8081
    data_dir: Path = Path("var/broker")
    topics: list = field(default_factory=list)        # "NAME:QUEUES[@BROKER]"
    flush: str = "async"
    default_broker: str = "broker-a"
    channel_expired_ms: int = 120_000                 # BrokerConfig.channelExpiredTimeout
    client_scan_ms: int = 10_000                      # ClientHousekeepingService period
    long_poll_max_ms: int = 20_000                    # proxy grpcClientConsumerMaxLongPollingTimeoutMillis
    long_poll_default_ms: int = 15_000                # BROKER_SUSPEND_MAX_TIME_MILLIS
    revive_interval_ms: int = 1_000                   # BrokerConfig.reviveInterval
    min_invisible_ms: int = 10_000                    # ProxyConfig.minInvisibleTimeMillsForRecv
    max_invisible_ms: int = 12 * 3_600_000            # ProxyConfig.maxInvisibleTimeMills
    default_invisible_ms: int = 60_000                # ProxyConfig.defaultInvisibleTimeMills (auto renew)
    renew_ahead_ms: int = 10_000
    delay_levels: str = DEFAULT_DELAY_LEVELS          # MessageStoreConfig.messageDelayLevel
    offset_persist_ms: int = 5_000                    # flushConsumerOffsetInterval
    max_body_size: int = 4 * 1024 * 1024              # maxMessageSize
    pop_max_attempts: int = 17                        # retryMaxTimes 16 + the first delivery
    max_reconsume_times: int = 16                     # send-back default (concurrently)
    pop_retry_probability: int = 20                   # popFromRetryProbability (%)
    # RocketMQ writes 1 GiB files next to a budget of 75 % of a disk; against the lab's 1 GiB
    # budget, 128 MiB files let retention free the disk in steps instead of all at once.
    segment_size: int = 128 << 20                     # mappedFileSizeCommitLog
    retention_mb: int = 1024                          # commit-log bound (stands in for diskMaxUsedSpaceRatio)
    retention_hours: float = 72                       # fileReservedTime
    retention_interval_ms: int = 10_000               # CleanCommitLogService period
    flush_interval_ms: int = 500                      # flushIntervalCommitLog
    lock_expiry_ms: int = 60_000                      # REBALANCE_LOCK_MAX_LIVE_TIME (broker)
    receive_batch_size: int = 32
    namesrv_port: int | None = None                   # remoting off unless set (0 = any free port)
    remoting_port: int = 10911                        # first logical broker's remoting port


class BrokerError(Exception):
    """An error answered as a status (code + readable message), never a gRPC failure."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def parse_tag_filter(expression: str):
    """``"*"``/empty -> None; ``"a || b"`` -> (tag hash set, tag set) as SubscriptionData."""
    expr = (expression or "").strip()
    if not expr or expr == "*":
        return None
    tags = {t.strip() for t in expr.split("||") if t.strip()}
    if not tags:
        return None
    return ({tag_code(t) for t in tags}, tags)


def parse_topic_spec(spec: str, default_broker: str) -> tuple[str, int, str]:
    """``NAME:QUEUES[@BROKER]`` (BROKER may itself contain '@': ``T:4@ROOM@broker-a``)."""
    name, sep, rest = spec.partition(":")
    if not sep:
        raise ValueError(f"bad topic spec {spec!r}: expected NAME:QUEUES[@BROKER]")
    count, _, broker = rest.partition("@")
    return name, int(count), broker or default_broker


class BrokerCore:
    def __init__(self, cfg: BrokerConfig):
        self.cfg = cfg
        if cfg.segment_size < cfg.max_body_size + (64 << 10):
            # A record must always fit in one segment (body + properties + header).
            raise ValueError(f"--segment-size {cfg.segment_size} is too small for --max-body-size "
                             f"{cfg.max_body_size} (needs at least max body size + 64 KiB)")
        if cfg.retention_mb < 0 or cfg.retention_hours < 0 or cfg.retention_interval_ms <= 0:
            raise ValueError("--retention-mb and --retention-hours must be >= 0, --retention-interval-ms > 0")
        data = Path(cfg.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.topics = TopicManager(data, cfg.default_broker)
        self.offsets = OffsetStore(data)
        self.store = MessageStore(data, cfg.segment_size, cfg.flush, cfg.flush_interval_ms,
                                  retention_bytes=cfg.retention_mb << 20,
                                  retention_ms=int(cfg.retention_hours * 3_600_000),
                                  clean_interval_ms=cfg.retention_interval_ms)
        self.longpoll = LongPollService()
        self.membership = Membership(cfg.channel_expired_ms, cfg.client_scan_ms)
        self.pop = PopService(self)
        self.delay = DelayService(self)
        self.store.on_append = self.longpoll.notify
        self.membership.listeners.append(self.pop.client_gone)
        self.locks: dict[tuple, tuple[str, float]] = {}  # (group, topic, broker, qid) -> (client, expiry)
        # (group, topic, broker, qid) -> (client id, ms): who pulled a queue last, as the broker
        # sees it (remoting clients rebalance on their own; this is how the lab sees theirs).
        self.pullers: dict[tuple, tuple[str, int]] = {}
        self._rr = itertools.count()
        self.started_ms = int(time.time() * 1000)
        self._tasks: list[asyncio.Task] = []
        self.broker_listeners = []  # callables (broker, online) e.g. for logs/watchers

    # ------------------------------------------------------------- lifecycle

    def open(self):
        self.topics.load()
        for group, gc in self.topics.groups.items():
            if gc.get("retry_max_times"):
                self.pop.group_max_attempts[group] = gc["retry_max_times"] + 1
        self.offsets.register_section("pop", self.pop.dump, self.pop.restore)
        self.offsets.register_section("delay", self.delay.dump, self.delay.restore)
        self.offsets.load()
        n = self.store.recover(accept=self.topics.accept_record)
        for spec in self.cfg.topics:
            name, count, broker = parse_topic_spec(spec, self.cfg.default_broker)
            err = topic_error(name)
            if err:
                raise ValueError(err)
            t = self.topics.get(name)
            if t is None or t.queues.get(broker) != count:
                self.topics.create(name, count, broker, self.store.write_pos)
        self.topics.save()
        self.delay.rebuild()
        log.info("store recovered: %d messages, commit log at %d", n, self.store.write_pos)

    async def start(self):
        self.store.start()
        self.membership.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._persist_loop()), loop.create_task(self._revive_loop()),
                       loop.create_task(self.delay.run())]

    async def _persist_loop(self):
        while True:
            await asyncio.sleep(self.cfg.offset_persist_ms / 1000)
            try:
                self.offsets.persist()
            except OSError:
                log.exception("persisting offsets failed")

    async def _revive_loop(self):
        while True:
            await asyncio.sleep(self.cfg.revive_interval_ms / 1000)
            self.pop.revive_due()

    async def shutdown(self):
        for t in self._tasks:
            t.cancel()
        self.membership.stop()
        self.longpoll.wake_all()
        self.offsets.persist()
        self.topics.save()
        self.store.close()

    # ---------------------------------------------------------------- checks

    def require_topic(self, topic: str):
        err = topic_error(topic)
        if err:
            raise BrokerError(Code.ILLEGAL_TOPIC, err)
        if self.topics.get(topic) is None:
            raise BrokerError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")

    def require_queue(self, topic: str, broker: str, qid: int):
        self.require_topic(topic)
        if broker not in self.topics.get(topic).queues:
            raise BrokerError(Code.NOT_FOUND, f"topic {topic!r} has no queues on broker {broker!r}")
        if not self.topics.online(broker):
            raise BrokerError(Code.FORBIDDEN, f"broker {broker!r} is offline")
        if not self.topics.has_queue(topic, broker, qid):
            raise BrokerError(Code.BAD_REQUEST,
                              f"queue id {qid} is out of range for topic {topic!r} on broker {broker!r}")

    # ----------------------------------------------------------------- send

    def choose_queue(self, topic: str, msg: "lab.LabMessage", target: str | None) -> tuple:
        """Which queue a message goes to: an explicit ``BROKER:QID``, the message-group
        hash (fifo, as the proxy's SendMessageQueueSelector), else round robin."""
        if target:
            try:
                broker, qid = parse_label(target)
            except ValueError:
                raise BrokerError(Code.BAD_REQUEST, f"bad target queue {target!r}: expected BROKER:QUEUE_ID") from None
            self.require_queue(topic, broker, qid)
            return (topic, broker, qid)
        queues = self.topics.queues_of(topic)
        if not queues:
            raise BrokerError(Code.FORBIDDEN, f"no writable queue for topic {topic!r}: its brokers are offline")
        group = msg.properties.get(M.P_MESSAGE_GROUP)
        if group:
            return queues[abs(java_hash(group)) % len(queues)]
        return queues[next(self._rr) % len(queues)]

    def validate_message(self, msg: "lab.LabMessage"):
        size, tag = len(msg.body), msg.tag   # (each read of a upb field makes a new object)
        if not size:
            raise BrokerError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
        if size > self.cfg.max_body_size:
            raise BrokerError(Code.MESSAGE_BODY_TOO_LARGE,
                              f"message body of {size} bytes exceeds the limit of {self.cfg.max_body_size} bytes")
        if tag and ("|" in tag or not tag.strip()):
            raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {tag!r} (blank or containing '|')")

    def put(self, items: list[tuple[tuple, "lab.LabMessage"]], defer_write: bool = False) -> list[tuple[int, int]]:
        """Store validated messages (delayed ones go through the schedule queue).

        Returns (queue offset, physical offset) per message; for a delayed message the
        offset is the one in the schedule queue, as RocketMQ answers. ``defer_write``: see
        CommitLog.append (the caller acknowledges only after ``store.write_unwritten()``).
        """
        if not any(M.P_DELIVER_MS in msg.properties for _, msg in items):
            return self.store.append(items, defer_write)   # nothing delayed: every send's path
        now = int(time.time() * 1000)
        results: list = [None] * len(items)
        direct = []
        for i, (key, msg) in enumerate(items):
            due = msg.properties.get(M.P_DELIVER_MS)
            if due is not None and int(due) > now + 50:
                results[i] = self.delay.schedule(key[1], key, msg, int(due))
            else:
                direct.append(i)
        if direct:
            stored = self.store.append([items[i] for i in direct], defer_write)
            for i, r in zip(direct, stored):
                results[i] = r
        return results

    async def durable(self):
        """Wait for the flush policy: fsync in sync mode, nothing in async mode."""
        await self.store.wait_flushed()

    def deliver_scheduled(self, held: "lab.LabMessage"):
        """A delayed message is due: store it in its real topic (DelayService callback)."""
        topic = held.properties.get(M.P_REAL_TOPIC)
        broker = held.properties.get(M.P_REAL_BROKER)
        qid = held.properties.get(M.P_REAL_QID)
        out = M.derived(held, **{M.P_REAL_TOPIC: None, M.P_REAL_BROKER: None, M.P_REAL_QID: None,
                                 M.P_DELIVER_MS: None})
        if self.topics.get(topic) is None:
            log.warning("dropping a delayed message for deleted topic %s", topic)
            return
        if qid is None or not self.topics.has_queue(topic, broker, int(qid)):
            queues = [q for q in self.topics.queues_of(topic, online_only=False) if q[1] == broker] \
                or self.topics.queues_of(topic, online_only=False)
            key = queues[next(self._rr) % len(queues)]
        else:
            key = (topic, broker, int(qid))
        self.store.append([(key, out)])

    # ------------------------------------------------------------------ pull

    async def pull(self, group: str, key: tuple, offset: int, max_messages: int, tag_filter,
                   suspend_ms: int, fill):
        """4.x-style pull with long polling. ``fill(offset, raw)`` adds one message to the
        response and returns False to drop it (tag hash collision).

        Returns (pull status, next offset, min offset, max offset).
        """
        self.require_queue(*key)
        cq = self.store.queue(key)
        lo = cq.min_offset if cq else 0
        hi = cq.max_offset if cq else 0
        if offset < lo or offset > hi:
            # RocketMQ: OFFSET_TOO_SMALL / OFFSET_OVERFLOW_BADLY -> client corrects its offset.
            return lab.OFFSET_ILLEGAL, (lo if offset < lo else hi), lo, hi
        codes = None if tag_filter is None else tag_filter[0]
        max_messages = max(1, min(max_messages or 32, 1024))
        result = {}

        def attempt():
            found, nxt = self.store.scan(key, offset, max_messages, codes)
            kept = sum(1 for off, raw in found if fill(off, raw))
            result["next"] = nxt
            result["kept"] = kept
            return kept > 0 or nxt != offset

        wait_ms = min(suspend_ms, self.cfg.long_poll_max_ms)
        if wait_ms > 0:
            deadline = time.monotonic() + wait_ms / 1000
            await self.longpoll.poll(attempt, [(key[0], key[1], {key[2]})], deadline)
        else:
            attempt()
        cq = self.store.queue(key)
        lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
        if result["kept"]:
            status = lab.FOUND
        elif result["next"] != offset:
            status = lab.NO_MATCHED_MSG
        else:
            status = lab.NO_NEW_MSG
        return status, result["next"], lo, hi

    # ------------------------------------------------------------- send back

    def send_back(self, group: str, msg: "lab.LabMessage", delay_level: int, max_reconsume: int) -> str:
        """Consumer send-back (4.x CONSUMER_SEND_MSG_BACK): to %RETRY%group after a delay
        level of 3 + reconsume times by default, to %DLQ%group once reconsume times reach max."""
        topic = msg.queue.topic
        broker = msg.queue.broker_name or self.cfg.default_broker
        if not self.topics.online(broker):
            raise BrokerError(Code.FORBIDDEN, f"broker {broker!r} is offline")
        max_reconsume = max_reconsume if max_reconsume > 0 else self.cfg.max_reconsume_times
        origin = M.original_topic(msg) if topic.startswith(RETRY_PREFIX) else topic
        reconsume = msg.reconsume_times
        again = M.derived(msg, **{M.P_ORIGIN_MSG_ID: msg.properties.get(M.P_ORIGIN_MSG_ID, msg.message_id)})
        if delay_level < 0 or reconsume >= max_reconsume:
            dt = dlq_topic(group)
            self.topics.ensure_system_topic(dt, broker, self.store.write_pos)
            again.properties[M.P_DLQ_ORIGIN_TOPIC] = origin
            self.store.append([((dt, broker, 0), again)])
            self.pop.stats["dlq"] += 1
            return dt
        rt = retry_topic(group)
        self.topics.ensure_system_topic(rt, broker, self.store.write_pos)
        again.properties[M.P_RETRY_TOPIC] = origin
        again.reconsume_times = reconsume + 1
        level = delay_level if delay_level > 0 else 3 + reconsume
        due = int(time.time() * 1000) + self.delay.level_delay_ms(level)
        self.delay.schedule(broker, (rt, broker, 0), again, due)
        return rt

    # ----------------------------------------------------------------- locks

    def query_consumer_offset(self, group: str, key: tuple) -> int:
        """The group's committed offset of a queue, or -1 (queryConsumerOffset).

        As RocketMQ's broker: a group with no offset for a queue whose min offset is 0
        and whose first message is still in the store is answered 0, so a brand-new
        group with CONSUME_FROM_LAST_OFFSET consumes the queue from the start.
        """
        committed = self.offsets.get(group, key)
        if committed >= 0:
            return committed
        cq = self.store.queue(key)
        if cq is not None and cq.min_offset <= 0 < cq.max_offset:
            return 0
        return -1

    def note_pull(self, group: str, key: tuple, client_id: str) -> None:
        if client_id:
            self.pullers[(group, *key)] = (client_id, int(time.time() * 1000))

    def lock_queues(self, group: str, client_id: str, keys: list[tuple]) -> list[tuple]:
        now = time.monotonic()
        ttl = self.cfg.lock_expiry_ms / 1000
        locked = []
        for key in keys:
            lk = (group, *key)
            holder = self.locks.get(lk)
            if holder is None or holder[0] == client_id or holder[1] < now:
                self.locks[lk] = (client_id, now + ttl)
                locked.append(key)
        return locked

    def unlock_queues(self, group: str, client_id: str, keys: list[tuple]) -> list[tuple]:
        released = []
        for key in keys:
            lk = (group, *key)
            holder = self.locks.get(lk)
            if holder is not None and holder[0] == client_id:
                del self.locks[lk]
                released.append(key)
        return released

    def known_group(self, group: str) -> bool:
        """Whether the broker has ever seen the group (members, offsets, config, pops)."""
        return (self.membership.known_group(group) or self.offsets.has_group(group)
                or group in self.topics.groups or group in self.pop.group_max_attempts)

    # --------------------------------------------------------------- brokers

    def set_broker_online(self, broker: str, online: bool):
        self.topics.set_online(broker, online)
        if not online:
            # Held requests on that broker answer now rather than at their timeout.
            self.longpoll.wake_all()
        for listener in self.broker_listeners:
            listener(broker, online)
