"""Watching a consumer group the lab did not start, through what any RocketMQ cluster answers.

rocketmq-dashboard asks a cluster about a group only when someone opens its page; the lab
asks every second and turns the differences into the events its own consumers send, so an
outside group's hand-offs play on the page and go into the lag history like the lab's own.

One look (``Cluster.look``) is, over remoting only, so it works on any cluster:

* the name server's cluster info (106) for the brokers, the topic's route (105) for its queues;
* GET_CONSUMER_CONNECTION_LIST (203): the members, their language, version and subscriptions;
* GET_CONSUMER_RUNNING_INFO (307) per member, which the broker forwards to the client: the
  queues it holds and each ProcessQueue's figures. A client that does not answer (ali-ons)
  is kept with the reason, its queues unknown;
* GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208) from every broker of the route:
  min/max offsets and the group's committed offsets, so lag is known whoever holds the queue;
* PULL_MESSAGE (11) of one message at a queue's committed offset, committing nothing: the
  store time of the oldest unconsumed message, hence the time lag (``OldestUnconsumed``).
* when a member is gone, the lab-only GET_CONSUMER_DEPARTURES (20010) to the lab's own broker:
  how it went (``departure``); a real RocketMQ broker does not support it and is not asked again.

``changes(before, after)`` is pure: the events that lead from one look to the next.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from consumers_app.events import AssignmentEvent, Event, MembershipEvent, PqEvent, RebalanceEvent
from consumers_app.message_queue import MessageQueue
from consumers_app.remoting import wire
from consumers_app.remoting.bodies import cluster_masters, held_queues, route_masters
from consumers_app.remoting.client import RemotingClient

log = logging.getLogger(__name__)

REASON = "observed"
# Time lag probes: a queue is pulled (one message) only when its committed offset moved
# since its last probe, and at most this many queues per look (the longest unprobed first).
PROBES_PER_LOOK = 64
MIB = 1 << 20
# RocketMQ's consume types as the lab names the modes.
MODES = {"CONSUME_PASSIVELY": "push", "CONSUME_ACTIVELY": "lite_pull", "CONSUME_POP": "pop"}
# How a member went, as the lab's broker tells it: a goodbye, its connection closed, its channel expired.
DEPARTURES = ("left", "closed", "expired")


class NotObservable(Exception):
    """The cluster cannot show this group (not online, no route): a message for the user."""


class GroupOffline(NotObservable):
    """No broker lists a connection of the group."""


@dataclass
class ClientSighting:
    client_id: str
    language: str = ""
    version: str = ""
    address: str = ""
    # MessageQueue -> ProcessQueue figures, from its running info; None when it did not answer.
    queues: dict[MessageQueue, dict] | None = None
    unanswered: str = ""   # why there is no running info
    # It answered running info at some look (carried from look to look by ``changes``): a
    # client that did and then stops answering has gone silent (frozen, cut off).
    answered: bool = False

    @property
    def silent(self) -> bool:
        return self.answered and self.queues is None


@dataclass
class Sighting:
    ts: int
    topic: str
    mode: str
    queues: list[MessageQueue]                       # the route's readable queues of ``topic``
    clients: dict[str, ClientSighting] = field(default_factory=dict)
    # MessageQueue -> {"min_offset", "max_offset", "committed_offset", "last_consumed_ts",
    # "oldest_unconsumed_store_ts" (0: nothing unconsumed; None: not known yet)}
    offsets: dict[MessageQueue, dict] = field(default_factory=dict)
    address: str = ""   # the broker that listed the group
    # client id -> how it went, for members of the look before gone since, as the broker
    # told it (``Cluster.tell_departures``); empty when the broker cannot tell.
    departures: dict[str, str] = field(default_factory=dict)


class Cluster:
    """The remoting connections the observer asks through: the name server and each broker."""

    def __init__(self, namesrv: str, timeout: float = 3.0):
        self.namesrv = namesrv
        self.timeout = timeout
        self._connections: dict[str, RemotingClient] = {}
        self.oldest = OldestUnconsumed(self)
        self._untold: set[str] = set()   # brokers that do not support GET_CONSUMER_DEPARTURES
        # Asked from several tasks at once (the lab's admin calls): one connection per address.
        self._connecting = asyncio.Lock()

    async def ask(self, address: str, code: int, ext: dict | None = None):
        async with self._connecting:
            client = self._connections.get(address)
            if client is None or client.closed:
                client = self._connections[address] = await RemotingClient.connect(address, self.timeout)
        return await client.request(code, ext, timeout=self.timeout)

    async def close(self) -> None:
        for client in self._connections.values():
            await client.close()
        self._connections.clear()

    async def brokers(self) -> dict[str, str]:
        """Logical broker -> its master's address (cluster info, 106)."""
        answer = await self.ask(self.namesrv, wire.GET_BROKER_CLUSTER_INFO)
        if answer.code != wire.SUCCESS:
            raise NotObservable(f"the name server {self.namesrv} gave no cluster info: {answer.remark}")
        return cluster_masters(wire.loads(answer.body) or {})

    async def route(self, topic: str) -> tuple[list[MessageQueue], dict[str, str]]:
        """The topic's readable queues and the addresses of the brokers holding them."""
        answer = await self.ask(self.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if answer.code != wire.SUCCESS:
            raise NotObservable(f"no route for topic {topic}: {answer.remark}")
        route = wire.loads(answer.body) or {}
        addresses = route_masters(route)
        queues = [MessageQueue(topic, q["brokerName"], i)
                  for q in route.get("queueDatas") or () if int(q.get("perm", 6)) & 4   # PERM_READ
                  for i in range(int(q.get("readQueueNums", 0)))]
        return sorted(queues), addresses

    async def connections(self, group: str, brokers: dict[str, str]) -> tuple[str, dict]:
        """(the broker that knows the group, its connection list): every client heartbeats
        to every broker it uses, so the first that answers is enough."""
        reasons = []
        for address in brokers.values():
            try:
                answer = await self.ask(address, wire.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
            except (OSError, TimeoutError) as exc:
                reasons.append(f"{address}: {exc or 'timeout'}")
                continue
            if answer.code == wire.SUCCESS:
                return address, wire.loads(answer.body) or {}
            reasons.append(answer.remark or f"code {answer.code}")
        raise GroupOffline(f"the consumer group {group} is not online: {'; '.join(reasons) or 'no broker'}")

    async def running_info(self, address: str, group: str, client_id: str) -> tuple[dict | None, str]:
        """(mqTable as {MessageQueue: ProcessQueue info}, "") or (None, why not)."""
        try:
            answer = await self.ask(address, wire.GET_CONSUMER_RUNNING_INFO,
                                    {"consumerGroup": group, "clientId": client_id, "jstackEnable": False})
        except (OSError, TimeoutError) as exc:
            return None, f"no answer to GET_CONSUMER_RUNNING_INFO: {exc or 'timeout'}"
        if answer.code != wire.SUCCESS:
            return None, answer.remark or f"GET_CONSUMER_RUNNING_INFO answered code {answer.code}"
        try:
            return held_queues(wire.loads(answer.body)), ""
        except ValueError:
            # The C++ client writes an empty mqTable malformed: it holds nothing.
            return {}, ""

    async def offsets(self, group: str, topic: str, addresses: dict[str, str]) -> dict[MessageQueue, dict]:
        """Per queue: the broker's min/max offsets (202) and the group's committed offset (208)."""
        figures: dict[MessageQueue, dict] = {}
        for address in addresses.values():
            stats = await self.ask(address, wire.GET_TOPIC_STATS_INFO, {"topic": topic})
            if stats.code == wire.SUCCESS:
                for key, row in ((wire.loads(stats.body) or {}).get("offsetTable") or {}).items():
                    figures.setdefault(_queue(key), {}).update(
                        min_offset=int(row.get("minOffset", 0)), max_offset=int(row.get("maxOffset", 0)))
            consumed = await self.ask(address, wire.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})
            if consumed.code == wire.SUCCESS:
                for key, row in ((wire.loads(consumed.body) or {}).get("offsetTable") or {}).items():
                    entry = figures.setdefault(_queue(key), {})
                    entry.setdefault("max_offset", int(row.get("brokerOffset", 0)))
                    entry.update(committed_offset=int(row.get("consumerOffset", -1)),
                                 last_consumed_ts=int(row.get("lastTimestamp", 0)))
        for entry in figures.values():
            entry.setdefault("min_offset", 0)
            entry.setdefault("committed_offset", -1)
        await self.oldest.fill(group, figures, addresses)
        return figures

    async def store_ts_at(self, address: str, group: str, mq: MessageQueue, offset: int) -> int | None:
        """The store time of the message at ``offset`` of ``mq`` (a pull of one message that
        commits nothing and is not held), or None when the broker has none to give."""
        answer = await self.ask(address, wire.PULL_MESSAGE, {
            "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "queueOffset": offset,
            "maxMsgNums": 1, "sysFlag": wire.PULL_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0, "expressionType": "TAG"})
        if answer.code != wire.SUCCESS or not answer.body:
            return None
        messages = wire.decode_messages(answer.body)
        return int(messages[0]["store_ts"]) if messages else None

    async def tell_departures(self, group: str, before: Sighting, after: Sighting) -> None:
        """Fill ``after.departures``: how each member of ``before`` missing from ``after`` went,
        as the broker that listed the group says (GET_CONSUMER_DEPARTURES). A broker that does
        not support it (any real RocketMQ) answers so once and is not asked again; one that
        fails this time is asked at the next departure. Either way ``departure`` infers."""
        gone = set(before.clients) - set(after.clients)
        address = after.address or before.address
        if not gone or not address or address in self._untold:
            return
        try:
            answer = await self.ask(address, wire.GET_CONSUMER_DEPARTURES, {"consumerGroup": group})
            if answer.code == wire.REQUEST_CODE_NOT_SUPPORTED:
                self._untold.add(address)
                log.info("%s does not tell how members went: the observer infers it", address)
            if answer.code != wire.SUCCESS:
                return
            told = (wire.loads(answer.body) or {}).get("departures") or ()
        except (OSError, TimeoutError, ValueError) as exc:
            log.info("how members of %s went not known this time: %s", group, exc or "timeout")
            return
        for d in told:   # oldest first: a member that came back and went again reads its last way out
            if d.get("clientId") in gone and d.get("reason") in DEPARTURES:
                after.departures[d["clientId"]] = d["reason"]

    async def look(self, group: str, ts: int) -> Sighting:
        brokers = await self.brokers()
        if not brokers:
            raise NotObservable(f"the name server {self.namesrv} lists no broker")
        address, connections = await self.connections(group, brokers)
        topic = subscribed_topic(connections)
        if topic is None:
            raise NotObservable(f"the consumer group {group} subscribes to no topic")
        queues, addresses = await self.route(topic)
        sighting = Sighting(ts, topic, MODES.get(connections.get("consumeType", ""), "push"), queues, address=address)
        members = [c for c in connections.get("connectionSet") or () if c.get("clientId")]
        answers = await asyncio.gather(*(self.running_info(address, group, c["clientId"]) for c in members))
        for c, (held, why) in zip(members, answers):
            sighting.clients[c["clientId"]] = ClientSighting(
                c["clientId"], str(c.get("language", "")), str(c.get("version", "")), str(c.get("clientAddr", "")),
                None if held is None else {mq: info for mq, info in held.items() if mq.topic == topic}, why)
        sighting.offsets = await self.offsets(group, topic, addresses)
        return sighting


class OldestUnconsumed:
    """Per queue, the store time of the message at the group's committed offset: what the
    time lag is measured from (RocketMQ 5's rocketmq_consumer_lag_latency does the same
    inside the broker). A message's store time never changes, so a queue is asked again
    only once its committed offset moved; a hung consumer's queue is asked once and its
    time lag then grows with the clock."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        # (group, mq) -> (offset asked, its store ts); one cluster connection serves several groups
        self.known: dict[tuple[str, MessageQueue], tuple[int, int]] = {}
        self.asked_at: dict[tuple[str, MessageQueue], float] = {}

    async def fill(self, group: str, figures: dict[MessageQueue, dict], addresses: dict[str, str]) -> None:
        """Set each queue's ``oldest_unconsumed_store_ts``: 0 when nothing is unconsumed, the
        probed store time, or None while it is not known (never probed, or the probe failed).
        Queues the group no longer has (a topic deleted, a broker gone) are forgotten: a day
        of a cluster's topics coming and going holds this flat."""
        for key in [k for k in self.asked_at if k[0] == group and k[1] not in figures]:
            self.asked_at.pop(key, None)
            self.known.pop(key, None)
        due = []
        for mq, f in figures.items():
            offset = _consumed_to(f)
            if offset >= f.get("max_offset", 0):
                self.known.pop((group, mq), None)
            elif self.known.get((group, mq), (None,))[0] != offset:
                due.append((mq, offset))
        due.sort(key=lambda d: self.asked_at.get((group, d[0]), 0.0))
        due = [(mq, offset) for mq, offset in due[:PROBES_PER_LOOK] if mq.broker_name in addresses]
        answers = await asyncio.gather(*(self.cluster.store_ts_at(addresses[mq.broker_name], group, mq, offset)
                                         for mq, offset in due), return_exceptions=True)
        for (mq, offset), answer in zip(due, answers):
            self.asked_at[(group, mq)] = time.monotonic()
            if isinstance(answer, (OSError, TimeoutError, ValueError)):
                log.info("time lag of %s not known this time: %s", mq.label, answer or "timeout")
            elif isinstance(answer, BaseException):
                raise answer
            if isinstance(answer, int):
                self.known[(group, mq)] = (offset, answer)
            else:
                self.known.pop((group, mq), None)   # asked again next look
        for mq, f in figures.items():
            offset = _consumed_to(f)
            asked = self.known.get((group, mq))
            # A queue not probed at its offset yet (over the budget of a look) is unknown: the
            # message of its last probe, consumed since, would overstate the time lag.
            f["oldest_unconsumed_store_ts"] = (0 if offset >= f.get("max_offset", 0)
                                               else asked[1] if asked is not None and asked[0] == offset else None)


def _consumed_to(figures: dict) -> int:
    """Where the group's next unconsumed message is: its committed offset (the queue's
    first when it committed none), never below what retention kept."""
    committed = figures["committed_offset"]
    return max(committed if committed >= 0 else figures["min_offset"], figures["min_offset"])


def subscribed_topic(connections: dict) -> str | None:
    """The group's topic: its one subscription that is not the %RETRY% topic every push group has."""
    topics = sorted(t for t in (connections.get("subscriptionTable") or {}) if not t.startswith("%RETRY%"))
    return topics[0] if topics else None


def _queue(key) -> MessageQueue:
    mq = dict(key) if isinstance(key, tuple) else {}
    return MessageQueue(mq.get("topic", ""), mq.get("brokerName", ""), int(mq.get("queueId", 0)))


def pq_figures(info: dict) -> dict:
    """A ProcessQueueInfo as the lab's pq figures."""
    low, high = int(info.get("cachedMsgMinOffset", 0)), int(info.get("cachedMsgMaxOffset", 0))
    count = int(info.get("cachedMsgCount", 0))
    committed = int(info.get("commitOffset", -1))
    if committed >= 1 << 63:   # the C++ client writes -1 as an unsigned 64-bit number
        committed -= 1 << 64
    return {"cached_count": count, "cached_bytes": int(float(info.get("cachedMsgSizeInMiB", 0)) * MIB),
            "span": high - low if count else 0, "committed_offset": committed}


def departure(last: ClientSighting, told: str = "") -> str:
    """Why a member the broker no longer lists went: as the lab's broker ``told`` it ("left":
    a goodbye, UNREGISTER_CLIENT or NotifyClientTermination; "closed": its connection closed;
    "expired": silent past the channel expiry). A real cluster does not tell: then from the
    last look at it, "expired" when it had gone silent (answered running info before, then
    no more), else "left", which there stands for a goodbye or a close alike (both drop it
    at once, and the member list shows no difference)."""
    return told or ("expired" if last.silent else "left")


def changes(group: str, before: Sighting | None, after: Sighting) -> list[Event]:
    """The events between two looks: membership (a departure with its reason, ``departure``),
    and per client whose queues changed a rebalance (inferred: the client does not say when
    it ran one) and its assignment; ProcessQueue figures that moved. Carries each client's
    ``answered`` over from ``before`` into ``after``."""
    events: list[Event] = []
    old = before.clients if before is not None else {}
    for client_id, seen in after.clients.items():
        seen.answered = seen.queues is not None or (client_id in old and old[client_id].answered)
    joined = sorted(set(after.clients) - set(old))
    left = sorted(set(old) - set(after.clients))
    if joined or left:
        subject = (joined + left)[0] if len(joined) + len(left) == 1 else ""
        reasons = {departure(old[c], after.departures.get(c, "")) for c in left}
        reason = reasons.pop() if not joined and len(reasons) == 1 else REASON
        events.append(MembershipEvent(ts=after.ts, group=group, client_id=subject, source="broker", reason=reason,
                                      members=sorted(after.clients), joined=joined, left=left))
    for client_id, seen in sorted(after.clients.items()):
        if seen.queues is None:
            continue
        was = old.get(client_id)
        held_before = set(was.queues or ()) if was is not None else set()
        held = set(seen.queues)
        if was is None or was.queues is None or held != held_before:
            added, removed = sorted(held - held_before), sorted(held_before - held)
            if added or removed:
                events.append(RebalanceEvent(ts=after.ts, group=group, client_id=client_id, mode=after.mode,
                                             topic=after.topic, phase="end", reason=REASON,
                                             added=added, removed=removed, balanced=True))
            events.append(AssignmentEvent(ts=after.ts, group=group, client_id=client_id, mode=after.mode,
                                          topic=after.topic, queues=sorted(held), reason=REASON))
        for mq, info in sorted(seen.queues.items()):
            figures = pq_figures(info)
            if was is None or was.queues is None or pq_figures(was.queues.get(mq) or {}) != figures:
                events.append(PqEvent(ts=after.ts, group=group, client_id=client_id, mode=after.mode,
                                      topic=after.topic, queue=mq, **figures))
    return events
