"""Producer: sends to a topic with v2 SendMessage, many messages per call.

Queues come from QueryRoute (refreshed every pollNameServerInterval) and are used round
robin, one queue per call, as a RocketMQ batch goes to one queue. A broker whose send
fails is skipped for ``isolate_broker_ms`` (the official producer isolates endpoints
the same way), so taking a logical broker offline in the lab moves traffic to the rest.

Lab knobs: ``set_rate(msgs_per_s)`` for a steady flow (``run()`` sends at that rate
until stopped) and ``burst(n)`` for a one-off batch; ``message_size``, tag and keys.

The target queue is named with the broker's ``__QUEUE`` user property ("BROKER:QID"):
one broker process hosts several logical brokers behind one address, so the address
alone cannot say which logical broker a v2 send is meant for.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
import uuid

from google.protobuf.timestamp_pb2 import Timestamp

from ..message_queue import MessageQueue, shared_queue
from ..protocol import v2, v2_service
from .config import ProducerConfig
from .connection import Connection, check, new_client_id, resource
from .message import TARGET_QUEUE_PROPERTY
from .remoting_connection import RemotingConnection

log = logging.getLogger(__name__)

_HOST = socket.gethostname()


def _message_id() -> str:
    # 5.x ids are 34 hex chars starting with the version byte "01"; unique is enough here.
    return "01" + uuid.uuid4().hex


class Producer:
    mode = "producer"

    def __init__(self, config: ProducerConfig | None = None, emitter=None):
        self.config = config or ProducerConfig()
        self.topic = self.config.topic
        self.client_id = self.config.client_id or new_client_id()
        self.emitter = emitter
        self.connection: Connection | None = None
        self.queues: list[MessageQueue] = []
        self._rr = itertools.count()
        self._isolated: dict[str, float] = {}  # broker -> until (monotonic)
        self.rate = float(self.config.rate)
        self.message_size = self.config.message_size
        self.sent = 0
        self.failed = 0
        self._seq = itertools.count()
        self._task: asyncio.Task | None = None
        self._route_task: asyncio.Task | None = None
        self._rate_changed = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        if cfg.namesrv:   # a RocketMQ client: routes from the name server, sends over remoting
            self.connection = RemotingConnection(cfg.namesrv, self.client_id, owner=self,
                                                 timeout_s=cfg.rpc_timeout_ms / 1000)
        else:
            self.connection = Connection(cfg.endpoints, self.client_id)
        resp = await self.connection.v2.Heartbeat(
            v2_service.HeartbeatRequest(client_type=v2.ClientType.PRODUCER),
            metadata=self.connection.metadata, timeout=self.config.rpc_timeout_ms / 1000)
        check(resp.status)
        await self.refresh_route()
        self._route_task = asyncio.get_running_loop().create_task(self._route_loop())

    async def shutdown(self) -> None:
        await self.stop()
        if self._route_task:
            self._route_task.cancel()
            await asyncio.gather(self._route_task, return_exceptions=True)
        if self.connection:
            try:
                await self.connection.v2.NotifyClientTermination(
                    v2_service.NotifyClientTerminationRequest(), metadata=self.connection.metadata,
                    timeout=self.config.rpc_timeout_ms / 1000)
            except Exception:  # noqa: BLE001
                pass
            await self.connection.close()

    async def refresh_route(self) -> None:
        resp = await self.connection.v2.QueryRoute(
            v2_service.QueryRouteRequest(topic=resource(self.topic)),
            metadata=self.connection.metadata, timeout=self.config.rpc_timeout_ms / 1000)
        check(resp.status)
        writable = (v2.Permission.WRITE, v2.Permission.READ_WRITE, v2.Permission.PERMISSION_UNSPECIFIED)
        self.queues = sorted(shared_queue(mq.topic.name, mq.broker.name, mq.id)
                             for mq in resp.message_queues if mq.permission in writable)

    async def _route_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_name_server_interval_ms / 1000)
            try:
                await self.refresh_route()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("producer route refresh: %s", exc)

    def _next_queue(self) -> MessageQueue:
        now = time.monotonic()
        n = len(self.queues)
        if not n:
            raise RuntimeError(f"topic {self.topic} has no writable queue")
        for _ in range(n):
            mq = self.queues[next(self._rr) % n]
            if self._isolated.get(mq.broker_name, 0) <= now:
                return mq
        return self.queues[next(self._rr) % n]  # everything isolated: try anyway

    def _build(self, count: int, mq: MessageQueue, body: bytes | None, tag: str | None, keys) -> list:
        cfg = self.config
        born = Timestamp()
        born.GetCurrentTime()
        payload = body if body is not None else os.urandom(8).hex().encode().ljust(self.message_size, b".")
        tag = cfg.tag if tag is None else tag
        keys = list(cfg.keys if keys is None else keys)
        target = mq.label
        msgs = []
        for _ in range(count):
            m = v2.Message(topic=resource(self.topic), body=payload)
            sp = m.system_properties
            sp.message_id = _message_id()
            sp.message_type = v2.MessageType.NORMAL
            sp.born_host = _HOST
            sp.born_timestamp.CopyFrom(born)
            sp.body_encoding = v2.Encoding.IDENTITY
            if tag:
                sp.tag = tag
            if keys:
                sp.keys.extend(keys)
            m.user_properties[TARGET_QUEUE_PROPERTY] = target
            msgs.append(m)
        return msgs

    async def send_batch(self, count: int, body: bytes | None = None, tag: str | None = None, keys=None,
                         queue: MessageQueue | None = None) -> list:
        """Send ``count`` messages in one SendMessage call to the next queue; returns entries."""
        mq = queue or self._next_queue()
        msgs = self._build(count, mq, body, tag, keys)
        try:
            resp = await self.connection.v2.SendMessage(
                v2_service.SendMessageRequest(messages=msgs), metadata=self.connection.metadata,
                timeout=self.config.rpc_timeout_ms / 1000)
            check(resp.status)
        except Exception:
            self.failed += count
            self._isolated[mq.broker_name] = time.monotonic() + self.config.isolate_broker_ms / 1000
            raise
        self.sent += count
        return list(resp.entries)

    async def send(self, total: int, body: bytes | None = None, tag: str | None = None, keys=None,
                   retries: int = 3) -> int:
        """Send ``total`` messages in batches of ``batch_size``; returns how many went out."""
        done = 0
        while done < total:
            n = min(self.config.batch_size, total - done)
            for attempt in range(retries + 1):
                try:
                    await self.send_batch(n, body, tag, keys)
                    break
                except Exception as exc:  # noqa: BLE001 - next queue/broker on retry
                    if attempt == retries:
                        raise
                    log.info("send failed (%s); retrying on another queue", exc)
            done += n
        return done

    # ------------------------------------------------------------------ lab knobs

    def set_rate(self, msgs_per_s: float) -> None:
        self.rate = max(0.0, float(msgs_per_s))
        self._rate_changed.set()

    async def burst(self, count: int) -> int:
        return await self.send(count)

    def start_steady(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._steady())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _steady(self) -> None:
        """Token bucket: send what the rate allows, in batches, about 20 times a second."""
        tokens = 0.0
        last = time.monotonic()
        while True:
            if self.rate <= 0:
                self._rate_changed.clear()
                await self._rate_changed.wait()
                last = time.monotonic()
                continue
            now = time.monotonic()
            tokens = min(tokens + (now - last) * self.rate, max(self.rate, self.config.batch_size))
            last = now
            n = int(tokens)
            if n >= 1:
                try:
                    while n > 0:
                        k = min(n, self.config.batch_size)
                        await self.send_batch(k)
                        n -= k
                        tokens -= k
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    log.info("steady send failed: %s", exc)
            await asyncio.sleep(0.05)

    def snapshot(self) -> dict:
        return {"client_id": self.client_id, "mode": self.mode, "topic": self.topic, "rate": self.rate,
                "message_size": self.message_size, "sent": self.sent, "failed": self.failed,
                "queues": [mq.label for mq in self.queues]}
