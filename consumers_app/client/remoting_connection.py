"""Our consumers over RocketMQ's remoting protocol: a Connection with the same face.

A consumer talks to the broker through ``connection.v2`` and ``connection.lab`` (stubs of
the v2 gRPC service and the lab's LabAdmin). ``RemotingConnection`` offers those same calls,
with the same request and response messages, and carries each over remoting the way a
4.x/5.x Java client does: routes from the name server, one TCP connection per broker
address, heartbeats with the consumer's subscriptions to every broker, pulls with long
polling and the commit-offset piggyback, offsets, locks and send-back at the queue's
broker. So the consumers' RocketMQ logic (rebalance, ProcessQueue, flow control, consume
services) is the same code on either protocol, and on remoting they run against any
RocketMQ cluster, not only the lab's broker.

The broker's requests on our connections are answered: NOTIFY_CONSUMER_IDS_CHANGED wakes
the membership watch (which then asks GET_CONSUMER_LIST_BY_GROUP, as Java's rebalance
does), and GET_CONSUMER_RUNNING_INFO gets the consumer's real state (``running_info()``).
Selected by ``ClientConfig.namesrv``; the pop consumer stays on gRPC (the proxy's protocol).

Every request announces language PYTHON and RocketMQ 5.3.3's version (codec.CURRENT_VERSION),
so a 5.3 broker serves us as a current client (running info, offset resets).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time

from ..protocol import lab, v2, v2_service
from ..remoting import wire
from ..remoting.bodies import cluster_masters, route_masters
from ..remoting.client import RemotingClient
from ..remoting.codec import response
from ..message_queue import MessageQueue
from .connection import BrokerError
from .message import TARGET_QUEUE_PROPERTY
from .faults import NetworkCut
from .remoting_message import RemotingPull, pulled_messages

log = logging.getLogger(__name__)

LANGUAGE = "PYTHON"   # a LanguageCode a 5.3 broker knows
OK = lab.Status(code=v2.Code.OK)
# Our pull statuses from remoting response codes (PullAPIWrapper.processPullResult).
PULL_STATUS = {wire.SUCCESS: lab.FOUND, wire.PULL_NOT_FOUND: lab.NO_NEW_MSG,
               wire.PULL_RETRY_IMMEDIATELY: lab.NO_MATCHED_MSG, wire.PULL_OFFSET_MOVED: lab.OFFSET_ILLEGAL}
POLICY_CODE = {v2.BEGINNING: wire.GET_MIN_OFFSET, v2.END: wire.GET_MAX_OFFSET, v2.TIMESTAMP: wire.SEARCH_OFFSET_BY_TIMESTAMP}


def _failed(answer) -> BrokerError:
    return BrokerError(v2.Code.INTERNAL_ERROR, f"remoting code {answer.code}: {answer.remark or ''}")


class RemotingConnection:
    """The Connection face (``v2``, ``lab``, ``metadata``, ``close``, ``network``) over remoting."""

    def __init__(self, namesrv: str, client_id: str, owner=None, timeout_s: float = 3.0):
        self.address = namesrv
        self.namesrv = namesrv
        self.client_id = client_id
        self.owner = owner            # the consumer: group, subscriptions, running_info()
        self.timeout_s = timeout_s
        self.metadata = ()            # gRPC call metadata: nothing to carry here
        self.closed = False
        self.brokers: dict[str, str] = {}          # broker name -> master address (from routes)
        # topic -> the brokers its last route named (topicRouteTable's brokerDatas): unlike
        # ``brokers``, a broker that went offline leaves it at the next route refresh.
        self.route_brokers: dict[str, list[str]] = {}
        self._clients: dict[str, RemotingClient] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._notices: dict[str, asyncio.Event] = {}   # group -> woken by NOTIFY_CONSUMER_IDS_CHANGED
        self.v2 = _V2(self)
        self.lab = _Lab(self)
        self.network = NetworkCut(self)   # the lab's "cut": calls vanish, the sockets stay open

    # -- connections ---------------------------------------------------------------

    async def client(self, address: str) -> RemotingClient:
        if self.closed:
            raise ConnectionError("connection closed")
        current = self._clients.get(address)
        if current is not None and not current.closed:
            return current
        async with self._connecting.setdefault(address, asyncio.Lock()):
            current = self._clients.get(address)
            if current is None or current.closed:
                current = self._clients[address] = await RemotingClient.connect(
                    address, self.timeout_s, on_request=self._on_request, language=LANGUAGE)
            return current

    async def ask(self, address: str, code: int, ext: dict | None = None, body: bytes = b"",
                  timeout: float | None = None):
        client = await self.client(address)
        return await client.request(code, ext, body, timeout=timeout or self.timeout_s)

    async def broker_address(self, mq_topic: str, broker_name: str) -> str:
        address = self.brokers.get(broker_name)
        if address is None:
            await self.route(mq_topic)
            address = self.brokers.get(broker_name)
        if address is None:
            raise BrokerError(v2.Code.NOT_FOUND, f"no address for broker {broker_name}")
        return address

    async def at_queue(self, topic: str, broker_name: str, code: int, ext: dict, body: bytes = b"",
                       timeout: float | None = None):
        return await self.ask(await self.broker_address(topic, broker_name), code, ext, body, timeout)

    async def route(self, topic: str) -> list[tuple[str, int, int]] | None:
        """(broker, queue id, perm) of the topic's queues; None when the name server has no route."""
        answer = await self.ask(self.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if answer.code == wire.TOPIC_NOT_EXIST:
            self.route_brokers.pop(topic, None)
            return None
        if answer.code != wire.SUCCESS:
            raise _failed(answer)
        route = wire.loads(answer.body) or {}
        masters = route_masters(route)
        self.brokers.update(masters)
        self.route_brokers[topic] = list(masters)
        return [(q["brokerName"], i, int(q.get("perm", wire.PERM_READ_WRITE)))
                for q in route.get("queueDatas") or () for i in range(int(q.get("readQueueNums", 0)))]

    async def every_broker(self, code: int, ext: dict | None = None, body: bytes = b"") -> list:
        """The same request to every broker we know (heartbeat, unregister)."""
        if not self.brokers:
            answer = await self.ask(self.namesrv, wire.GET_BROKER_CLUSTER_INFO)
            if answer.code == wire.SUCCESS:
                for name, master in cluster_masters(wire.loads(answer.body) or {}).items():
                    self.brokers.setdefault(name, master)
        return await asyncio.gather(*(self.ask(a, code, ext, body) for a in set(self.brokers.values())))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        for event in self._notices.values():
            event.set()

    # -- the broker's requests -----------------------------------------------------

    async def _on_request(self, cmd):
        if cmd.code == wire.NOTIFY_CONSUMER_IDS_CHANGED:
            event = self._notices.get(cmd.text("consumerGroup") or "")
            if event is not None and not self.network.active:   # partitioned: the notice is lost
                event.set()
            return None
        if cmd.code == wire.GET_CONSUMER_RUNNING_INFO:
            info = getattr(self.owner, "running_info", None)
            if info is None:
                return response(cmd, wire.SYSTEM_ERROR, "not a consumer")
            return response(cmd, body=wire.dumps(info()))
        return response(cmd, wire.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported")

    def notice(self, group: str) -> asyncio.Event:
        return self._notices.setdefault(group, asyncio.Event())


def heartbeat_body(client_id: str, owner) -> bytes:
    """HeartbeatData: the consumer's group, model, where it starts and its subscriptions."""
    consumers = []
    if owner is not None and getattr(owner, "group", None):
        config = owner.config
        where = getattr(config, "consume_from_where", None)
        consumers.append({
            "groupName": owner.group,
            "consumeType": "CONSUME_ACTIVELY" if owner.mode == "lite_pull" else "CONSUME_PASSIVELY",
            "messageModel": owner.message_model.value,
            "consumeFromWhere": where.value if where is not None else "CONSUME_FROM_LAST_OFFSET",
            # Java's SubscriptionData: tags and their hash codes (what a 5.3 broker filters
            # by), and a subVersion that moves only when the subscription changes (a newer
            # one replaces the group's subscription on the broker).
            "subscriptionDataSet": owner.subscription_set(),
            "unitMode": False,
        })
    producers = [{"groupName": wire.DEFAULT_PRODUCER_GROUP}] if getattr(owner, "mode", None) == "producer" else []
    return wire.dumps({"clientID": client_id, "producerDataSet": producers, "consumerDataSet": consumers})


def remoting_properties(m: v2.Message) -> dict:
    """A v2 message's identity and user properties as remoting carries them (MessageConst)."""
    sp = m.system_properties
    props = {k: v for k, v in m.user_properties.items() if k != TARGET_QUEUE_PROPERTY}
    if sp.tag:
        props[wire.P_TAGS] = sp.tag
    if sp.keys:
        props[wire.P_KEYS] = " ".join(sp.keys)
    props[wire.P_UNIQ_KEY] = sp.message_id
    props[wire.P_WAIT] = "true"
    return props


class _V2:
    """The v2 MessagingService calls our clients make, over remoting."""

    def __init__(self, conn: RemotingConnection):
        self.c = conn

    async def SendMessage(self, request, metadata=(), timeout=None):
        """Our producer's SendMessage: messages for one queue (its target property), sent as
        Java's producer does: SEND_MESSAGE_V2 for one, SEND_BATCH_MESSAGE for several."""
        messages = list(request.messages)
        first = messages[0]
        topic = first.topic.name
        mq = MessageQueue.from_label(topic, first.user_properties[TARGET_QUEUE_PROPERTY])
        born = first.system_properties.born_timestamp
        # SendMessageRequestHeaderV2: producer group, topic, default topic and its queue count,
        # queue id, sysFlag, born ts, flag, properties, reconsume times, unit mode, batch.
        ext = {"a": wire.DEFAULT_PRODUCER_GROUP, "b": topic, "c": "TBW102", "d": 4, "e": mq.queue_id, "f": 0,
               "g": born.seconds * 1000 + born.nanos // 1_000_000, "h": 0, "j": 0, "k": False,
               "m": len(messages) > 1}
        if len(messages) == 1:
            code, body = wire.SEND_MESSAGE_V2, first.body
            ext["i"] = wire.properties_to_string(remoting_properties(first))
        else:
            code = wire.SEND_BATCH_MESSAGE
            body = wire.encode_batch((m.body, remoting_properties(m), 0) for m in messages)
            ext["i"] = wire.properties_to_string({wire.P_WAIT: "true"})
        answer = await self.c.at_queue(topic, mq.broker_name, code, ext, body, timeout)
        if answer.code != wire.SUCCESS:
            raise _failed(answer)
        offset = answer.number("queueOffset")
        ok = v2.Status(code=v2.Code.OK)
        return v2_service.SendMessageResponse(status=ok, entries=[
            v2_service.SendResultEntry(status=ok, message_id=m.system_properties.message_id, offset=offset + i)
            for i, m in enumerate(messages)])

    async def QueryRoute(self, request, metadata=(), timeout=None):
        topic = request.topic.name
        queues = await self.c.route(topic)
        if queues is None:
            return v2_service.QueryRouteResponse(status=v2.Status(code=v2.Code.TOPIC_NOT_FOUND,
                                                                  message=f"no route for {topic}"))
        perms = {6: v2.READ_WRITE, 4: v2.READ, 2: v2.WRITE}
        return v2_service.QueryRouteResponse(status=v2.Status(code=v2.Code.OK), message_queues=[
            v2.MessageQueue(topic=v2.Resource(name=topic), id=qid, broker=v2.Broker(name=broker),
                            permission=perms.get(perm & 6, v2.NONE))
            for broker, qid, perm in queues])

    async def Heartbeat(self, request, metadata=(), timeout=None):
        answers = await self.c.every_broker(wire.HEART_BEAT, body=heartbeat_body(self.c.client_id, self.c.owner))
        bad = next((a for a in answers if a.code != wire.SUCCESS), None)
        if bad is not None:
            raise _failed(bad)
        return v2_service.HeartbeatResponse(status=v2.Status(code=v2.Code.OK))

    async def NotifyClientTermination(self, request, metadata=(), timeout=None):
        await self.c.every_broker(wire.UNREGISTER_CLIENT, {"clientID": self.c.client_id,
                                                           "consumerGroup": request.group.name})
        return v2_service.NotifyClientTerminationResponse(status=v2.Status(code=v2.Code.OK))

    async def GetOffset(self, request, metadata=(), timeout=None):
        mq = request.message_queue
        answer = await self.c.at_queue(mq.topic.name, mq.broker.name, wire.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": request.group.name, "topic": mq.topic.name, "queueId": mq.id})
        if answer.code == wire.QUERY_NOT_FOUND:
            return v2_service.GetOffsetResponse(status=v2.Status(code=v2.Code.OFFSET_NOT_FOUND, message=answer.remark or ""))
        if answer.code != wire.SUCCESS:
            raise _failed(answer)
        return v2_service.GetOffsetResponse(status=v2.Status(code=v2.Code.OK), offset=answer.number("offset"))

    async def UpdateOffset(self, request, metadata=(), timeout=None):
        mq = request.message_queue
        answer = await self.c.at_queue(mq.topic.name, mq.broker.name, wire.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": request.group.name, "topic": mq.topic.name, "queueId": mq.id,
            "commitOffset": request.offset})
        if answer.code != wire.SUCCESS:
            raise _failed(answer)
        return v2_service.UpdateOffsetResponse(status=v2.Status(code=v2.Code.OK))

    async def QueryOffset(self, request, metadata=(), timeout=None):
        mq = request.message_queue
        ext = {"topic": mq.topic.name, "queueId": mq.id}
        if request.query_offset_policy == v2.TIMESTAMP:
            ext["timestamp"] = request.timestamp.seconds * 1000 + request.timestamp.nanos // 1_000_000
        answer = await self.c.at_queue(mq.topic.name, mq.broker.name, POLICY_CODE[request.query_offset_policy], ext)
        if answer.code != wire.SUCCESS:
            raise _failed(answer)
        return v2_service.QueryOffsetResponse(status=v2.Status(code=v2.Code.OK), offset=answer.number("offset"))


class _Lab:
    """The LabAdmin calls our consumers make, each as RocketMQ's own request."""

    def __init__(self, conn: RemotingConnection):
        self.c = conn

    def _route_broker(self, topic: str) -> str | None:
        names = self.c.route_brokers.get(topic)
        return self.c.brokers[random.choice(names)] if names else None

    async def _members(self, group: str) -> list[str]:
        # findConsumerIdList -> findBrokerAddrByTopic: any broker of the subscribed topic's
        # current route (every broker knows the whole group), picked at random, the route
        # fetched first if there is none yet. Not any broker ever seen: one taken offline
        # stays in ``brokers`` but leaves the route, so the survivors still get their list.
        topic = getattr(self.c.owner, "topic", None)
        if not topic:
            raise BrokerError(v2.Code.BAD_REQUEST, f"no subscribed topic to find {group}'s members by")
        address = self._route_broker(topic)
        if address is None:
            await self.c.route(topic)
            address = self._route_broker(topic)
        if address is None:
            raise BrokerError(v2.Code.NOT_FOUND, f"no broker in the route of {topic}")
        answer = await self.c.ask(address, wire.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        if answer.code != wire.SUCCESS:
            # A 5.3 broker answers SYSTEM_ERROR for a group with no member: no list, which
            # the rebalance rides out until its next period (findConsumerIdList -> null).
            raise _failed(answer)
        return sorted(str(x) for x in (wire.loads(answer.body) or {}).get("consumerIdList") or ())

    async def ListGroupMembers(self, request, metadata=(), timeout=None):
        return lab.GroupMembers(status=OK, group=request.group, client_ids=await self._members(request.group))

    def WatchMembership(self, request, metadata=()):
        return self._watch(request.group)

    async def _watch(self, group: str):
        """The current list, then a change per NOTIFY_CONSUMER_IDS_CHANGED (asking the list
        again, as RebalanceImpl does after the notice)."""
        notice = self.c.notice(group)
        members = await self._members(group)
        yield lab.MembershipChange(group=group, client_ids=members, reason="initial", ts=_now_ms())
        while not self.c.closed:
            await notice.wait()
            notice.clear()
            if self.c.closed:
                return
            now = await self._members(group)
            if now != members:
                joined, left = sorted(set(now) - set(members)), sorted(set(members) - set(now))
                members = now
                yield lab.MembershipChange(group=group, client_ids=now, joined=joined, left=left,
                                           reason="joined" if joined and not left else "left" if left and not joined
                                           else "changed", ts=_now_ms())

    async def PullBatch(self, request, metadata=(), timeout=None):
        q = request.queue
        flags = wire.PULL_SUBSCRIPTION
        pull_sub_version = getattr(self.c.owner, "pull_sub_version", None)
        # PullMessageRequestHeader: commitOffset and suspendTimeoutMillis are required
        # fields (a 5.3 broker logs an error for each pull without them); the sysFlag
        # bits say whether they mean anything.
        ext = {"consumerGroup": request.group, "topic": q.topic, "queueId": q.queue_id,
               "queueOffset": request.offset, "maxMsgNums": request.max_messages,
               "commitOffset": max(request.commit_offset, 0), "suspendTimeoutMillis": request.suspend_timeout_ms,
               "subscription": request.tag_expression or "*", "expressionType": "TAG",
               "subVersion": pull_sub_version(q.topic) if pull_sub_version is not None else 0}
        if request.commit_offset > 0:
            flags |= wire.PULL_COMMIT_OFFSET
        if request.suspend_timeout_ms > 0:
            flags |= wire.PULL_SUSPEND
        ext["sysFlag"] = flags
        answer = await self.c.at_queue(q.topic, q.broker_name, wire.PULL_MESSAGE, ext,
                                       timeout=timeout or (request.suspend_timeout_ms / 1000 + self.c.timeout_s))
        status = PULL_STATUS.get(answer.code)
        if status is None:
            return lab.PullBatchResponse(status=lab.Status(code=v2.Code.INTERNAL_ERROR,
                                                           message=f"pull: remoting code {answer.code} {answer.remark or ''}"))
        return RemotingPull(OK, status, pulled_messages(answer.body, q) if status == lab.FOUND else [],
                            answer.number("nextBeginOffset", request.offset), answer.number("minOffset", 0),
                            answer.number("maxOffset", 0))

    async def GetQueueOffsets(self, request, metadata=(), timeout=None):
        """Committed, min and max offset of every queue of the topic, or of the ones
        ``request.queues`` names (three requests each, as a Java client's
        computePullFromWhere asks them one by one)."""
        topic, group = request.topic, request.group
        queues = await self.c.route(topic) or []
        if request.queues:
            asked = {(q.broker_name, q.queue_id) for q in request.queues}
            queues = [q for q in queues if (q[0], q[1]) in asked]

        async def one(broker: str, qid: int) -> lab.QueueOffsets | None:
            ext = {"topic": topic, "queueId": qid}
            low, high = await asyncio.gather(self.c.at_queue(topic, broker, wire.GET_MIN_OFFSET, ext),
                                             self.c.at_queue(topic, broker, wire.GET_MAX_OFFSET, ext))
            if low.code != wire.SUCCESS or high.code != wire.SUCCESS:
                return None
            committed = -1
            if group:
                answer = await self.c.at_queue(topic, broker, wire.QUERY_CONSUMER_OFFSET,
                                               {**ext, "consumerGroup": group})
                if answer.code == wire.SUCCESS:
                    committed = answer.number("offset")
                elif answer.code != wire.QUERY_NOT_FOUND:
                    return None
            return lab.QueueOffsets(queue=lab.QueueRef(topic=topic, broker_name=broker, queue_id=qid),
                                    min_offset=low.number("offset"), max_offset=high.number("offset"),
                                    committed_offset=committed)
        # A queue the broker failed to answer for (SYSTEM_BUSY, ...) is left out, not
        # reported as "no offset": the caller asks it again on its own.
        rows = await asyncio.gather(*(one(b, i) for b, i, _ in queues))
        return lab.QueueOffsetsResponse(status=OK, ts=_now_ms(), queues=[r for r in rows if r is not None])

    async def _locks(self, code: int, request) -> list[lab.QueueRef]:
        by_broker: dict[str, list] = {}
        for q in request.queues:
            by_broker.setdefault(q.broker_name, []).append(q)
        locked = []
        for broker, queues in by_broker.items():
            body = wire.dumps({"consumerGroup": request.group, "clientId": request.client_id,
                               "mqSet": [{"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id}
                                         for q in queues]})
            answer = await self.c.at_queue(queues[0].topic, broker, code, {}, body)
            if answer.code != wire.SUCCESS:
                raise _failed(answer)
            if code == wire.LOCK_BATCH_MQ:
                locked += [lab.QueueRef(topic=m["topic"], broker_name=m["brokerName"], queue_id=int(m["queueId"]))
                           for m in (wire.loads(answer.body) or {}).get("lockOKMQSet") or ()]
        return locked

    async def LockQueues(self, request, metadata=(), timeout=None):
        return lab.LockQueuesResponse(status=OK, locked=await self._locks(wire.LOCK_BATCH_MQ, request))

    async def UnlockQueues(self, request, metadata=(), timeout=None):
        await self._locks(wire.UNLOCK_BATCH_MQ, request)
        return lab.LockQueuesResponse(status=OK)

    async def SendBack(self, request, metadata=(), timeout=None):
        msg = request.message
        answer = await self.c.at_queue(msg.queue.topic, msg.queue.broker_name, wire.CONSUMER_SEND_MSG_BACK, {
            "offset": msg.commit_log_offset, "group": request.group, "delayLevel": request.delay_level,
            "originMsgId": msg.message_id, "originTopic": msg.properties.get("RETRY_TOPIC") or msg.queue.topic,
            "unitMode": False, "maxReconsumeTimes": request.max_reconsume_times})
        if answer.code != wire.SUCCESS:
            raise _failed(answer)
        dlq = request.delay_level < 0 or (request.max_reconsume_times >= 0
                                          and msg.reconsume_times >= request.max_reconsume_times)
        return lab.SendBackResponse(status=OK, destination_topic=f"%{'DLQ' if dlq else 'RETRY'}%{request.group}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


