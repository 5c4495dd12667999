"""The broker's remoting front: a name server port and one port per logical broker.

    service = RemotingService(core, host, namesrv_port=9876, first_broker_port=10911)
    await service.start()        # binds the name server and every known logical broker
    await service.stop()

Logical brokers get ports from ``first_broker_port`` upward in name order (a broker
that appears later gets the next free one); taking one offline closes its port and its
connections, as a stopped broker would, and leaves the routes.

One membership with the gRPC side: a remoting consumer's heartbeat registers it in the
group; each of its broker connections is a session, the last one closing unregisters it
at once ("closed"); silence waits for the client expiry. As 5.3's ConsumerManager, a
join, a leave (UNREGISTER_CLIENT) and a close are sent to the group's remoting members as
NOTIFY_CONSUMER_IDS_CHANGED; an expiry is not (scanNotActiveChannel only closes the
channel), so the survivors take the expired member's queues at their next periodic
rebalance.
"""
from __future__ import annotations

import asyncio
import logging

from ...protocol import v2
from ..core import BrokerCore
from ..topics import retry_topic
from consumers_app.remoting import wire
from .broker_requests import BrokerRequests
from .name_server import NameServerRequests
from .server import Connection, Listener

log = logging.getLogger(__name__)

CLUSTERING = "CLUSTERING"


class RemotingService:
    def __init__(self, core: BrokerCore, host: str, namesrv_port: int, first_broker_port: int = 10911):
        self.core = core
        self.host = host
        self.namesrv_port = namesrv_port
        self.first_broker_port = first_broker_port
        self.names = NameServerRequests(self)
        self.name_server = Listener("name server", self.names.handle)
        self.brokers: dict[str, Listener] = {}
        self.ports: dict[str, int] = {}               # logical broker -> its port, kept while offline
        self._opening: dict[str, asyncio.Future] = {}  # broker -> done when its port is bound
        self._subscriptions: dict[tuple[str, str], str] = {}   # (group, topic) -> expression
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        self._loop = asyncio.get_running_loop()
        self.namesrv_port = await self.name_server.start(self.host, self.namesrv_port)
        for broker in sorted(self.core.topics.brokers):
            if self.core.topics.online(broker):
                await self._open(broker)
        self.core.membership.listeners.append(self._membership_changed)
        self.core.broker_listeners.append(self._broker_changed)
        return self.namesrv_port

    async def stop(self) -> None:
        for listener in [self.name_server, *self.brokers.values()]:
            await listener.stop()
        self.brokers.clear()

    async def _open(self, broker: str) -> None:
        if broker in self.brokers:
            return
        if broker in self._opening:   # another request is binding its port: wait for that
            await asyncio.shield(self._opening[broker])
            return
        requests = BrokerRequests(self, broker)
        listener = Listener(broker, requests.handle, self._connection_closed, self.core.store.write_unwritten)
        if self.first_broker_port == 0:
            port = self.ports.get(broker, 0)   # any free port, kept while the broker is offline
        else:
            port = self.ports.get(broker) or max([self.first_broker_port - 1, *self.ports.values()]) + 1
        bound = self._opening[broker] = asyncio.get_running_loop().create_future()
        try:
            self.ports[broker] = await listener.start(self.host, port)
            self.brokers[broker] = listener
            bound.set_result(None)
        except BaseException as exc:
            bound.set_exception(exc)
            bound.exception()   # retrieved: waiters see it, nobody else must
            raise
        finally:
            del self._opening[broker]
        if not self.core.topics.online(broker):   # taken offline while its port was bound
            self.brokers.pop(broker, None)
            await listener.stop()
            return
        log.info("remoting: logical broker %s on %s:%d", broker, self.host, self.ports[broker])

    def _broker_changed(self, broker: str, online: bool) -> None:
        if online:
            self._loop.create_task(self._open(broker))
        else:
            listener = self.brokers.pop(broker, None)
            if listener is not None:
                self._loop.create_task(listener.stop())

    # ------------------------------------------------------------------ lookups

    def broker_address(self, broker: str) -> str | None:
        """host:port of a logical broker's remoting port (None if it does not listen)."""
        return f"{self.host}:{self.ports[broker]}" if broker in self.brokers else None

    async def listening(self, broker: str) -> str | None:
        """host:port of an online broker's remoting port, opened first if the broker was
        named after start-up (a topic created on it): a route never names a port that
        is not bound yet, nor leaves out a broker that is online."""
        if broker not in self.brokers and self.core.topics.online(broker):
            await self._open(broker)
        return self.broker_address(broker) if self.core.topics.online(broker) else None

    def store_host(self, broker: str) -> tuple[str, int]:
        return (self.host, self.ports.get(broker, 0))

    def subscription(self, group: str, topic: str) -> str:
        return self._subscriptions.get((group, topic), "*")

    def subscribed_topics(self, group: str) -> list[tuple[str, str]]:
        """(topic, expression) the group's remoting members subscribe to."""
        return sorted((t, e) for (g, t), e in self._subscriptions.items() if g == group)

    def subscribed_by_members(self, group: str) -> set[str]:
        """Topics the group's online members subscribe to: a remoting member's heartbeat
        and a gRPC member's settings (what 5.3's ConsumerGroupInfo holds)."""
        members = self.core.membership.groups.get(group) or {}
        topics = {t for t, _ in self.subscribed_topics(group)
                  if any(self.connection_of(group, cid) for cid in members)}
        for info in members.values():
            if info.settings is not None and info.settings.HasField("subscription"):
                topics.update(e.topic.name for e in info.settings.subscription.subscriptions)
        return topics

    def connection_of(self, group: str, client_id: str) -> Connection | None:
        """One open remoting connection of a group member (None: not a remoting client)."""
        for listener in self.brokers.values():
            for conn in listener.connections:
                if conn.client_id == client_id and group in conn.groups:
                    return conn
        return None

    # ------------------------------------------------------------------ membership

    def consumer_heartbeat(self, conn: Connection, broker: str, group: str, data: dict) -> None:
        """ConsumerData of a heartbeat: register, remember subscriptions, open a session."""
        for sub in data.get("subscriptionDataSet") or ():
            topic = str(sub.get("topic") or "")
            if topic:
                self._subscriptions[(group, topic)] = str(sub.get("subString") or "*")
        if data.get("messageModel", CLUSTERING) == CLUSTERING:
            # As the broker's heartbeat processor: the group's retry topic exists from now on.
            self.core.topics.ensure_system_topic(retry_topic(group), broker, self.core.store.write_pos)
        client_type = (v2.ClientType.PUSH_CONSUMER if data.get("consumeType") == "CONSUME_PASSIVELY"
                       else v2.ClientType.SIMPLE_CONSUMER)
        if group not in conn.groups:
            conn.groups.add(group)
            self.core.membership.open_session(group, conn.client_id)
        self.core.membership.heartbeat(group, conn.client_id, client_type)

    def _connection_closed(self, conn: Connection) -> None:
        for group in sorted(conn.groups):
            self.core.membership.close_session(group, conn.client_id)
        conn.groups.clear()

    def _membership_changed(self, group: str, joined, left, reason) -> None:
        """A member gone ends its sessions here; the rest of the group hears of the change."""
        connections = [conn for listener in self.brokers.values() for conn in list(listener.connections)]
        for conn in connections:
            if group in conn.groups and conn.client_id in left:
                # Its heartbeats open new sessions if it comes back (UNREGISTER_CLIENT then
                # a heartbeat again): a later close of those is then noticed at once.
                conn.groups.discard(group)
                if reason == "expired":
                    # ConsumerManager.scanNotActiveChannel: the expired channel is closed; its
                    # other groups see that close as doChannelCloseEvent does.
                    conn.close()
        if reason == "expired":
            # scanNotActiveChannel fires CLIENT_UNREGISTER only, which DefaultConsumerIdsChangeListener
            # ignores: no CHANGE, so no NOTIFY_CONSUMER_IDS_CHANGED.
            return
        for conn in connections:
            if group in conn.groups and not conn.closed:
                conn.oneway(wire.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
