"""The lab's admin calls answered by an existing RocketMQ cluster (``runlab --namesrv``).

The controller drives the embedded broker through LabAdmin (gRPC). Against someone
else's cluster only what RocketMQ's remoting protocol offers is there, so this class
offers the LabAdmin calls the controller makes, with the same request and response
messages, built from remoting requests (the observer's ``Cluster`` connections):

* CreateTopic: UPDATE_AND_CREATE_TOPIC (17) to the named broker, unless the topic is
  already there (a real cluster's topic is its owners': never resized by the lab);
* ListTopics: the routes (105) of the lab's topics only, never the whole cluster's;
* ListBrokers: cluster info (106); a listed broker is online;
* GetQueueOffsets: per broker, GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208), and
  the time lag from a pull of the message at the committed offset (observer.OldestUnconsumed);
  ``oldest_unconsumed_store_ts`` is ``UNKNOWN_TS`` while the cluster has not told it;
* WatchMembership: GET_CONSUMER_LIST_BY_GROUP (38) every second, changes yielded;
* AddQueues and SetBrokerOnline: refused, with the reason (``DISABLED``).
"""
from __future__ import annotations

import asyncio
import logging
import time

from consumers_app.javastr import java_key
from consumers_app.protocol import lab, v2
from consumers_app.remoting import wire

from .observer import Cluster, NotObservable

log = logging.getLogger(__name__)

Code = v2.Code
MEMBERSHIP_POLL_S = 1.0
# Lab controls a real cluster cannot honour: control -> why (the page shows it too).
DISABLED = {
    "broker_online": "taking a broker offline is a lab-only control",
    "queues": "a real cluster: queues are changed with mqadmin updateTopic",
}
POP_NEEDS_PROXY = "pop needs a RocketMQ 5 proxy: set LAB_PROXY"
UNKNOWN_TS = -1   # oldest_unconsumed_store_ts not known (0 would say "nothing unconsumed")
# RocketMQ's defaults for a topic created by updateTopic.
NEW_TOPIC = {"defaultTopic": "TBW102", "perm": wire.PERM_READ_WRITE, "topicFilterType": "SINGLE_TAG",
             "topicSysFlag": 0, "order": False}


class ClusterUnreachable(Exception):
    """The name server did not answer, or lists no broker: a one-line message for the user."""


def attachment(namesrv: str, proxy: str) -> dict:
    """The snapshot's ``cluster``: attached to ``namesrv``, and which controls are off and why."""
    disabled = dict(DISABLED)
    if not proxy:
        disabled["pop"] = POP_NEEDS_PROXY
    return {"attached": True, "namesrv": namesrv, "disabled": disabled}


async def reach(namesrv: str, timeout: float = 3.0, topic: str | None = None) -> list[str]:
    """The cluster's broker names, or ClusterUnreachable: what runlab checks before starting
    (and that ``topic``, when named, exists there)."""
    host, _, port = namesrv.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachable(f"cannot reach the name server at {namesrv}: not HOST:PORT")
    cluster = Cluster(namesrv, timeout)
    try:
        brokers = await cluster.brokers()
        if brokers and topic is not None:
            try:
                await cluster.route(topic)
            except NotObservable:
                raise ClusterUnreachable(f"the cluster at {namesrv} has no topic {topic!r} "
                                         f"(create it with mqadmin updateTopic, or leave out --topic)") from None
    except (OSError, TimeoutError, NotObservable) as exc:
        raise ClusterUnreachable(f"cannot reach the name server at {namesrv}: "
                                 f"{exc or f'no answer in {timeout:g} s'}") from None
    finally:
        await cluster.close()
    if not brokers:
        raise ClusterUnreachable(f"the name server at {namesrv} lists no broker")
    return sorted(brokers, key=java_key)


def _status(code: int = Code.OK, message: str = "OK") -> lab.Status:
    return lab.Status(code=code, message=message)


def oldest_ts_field(ts: int | None) -> int:
    """A probed oldest store time (None: not known) as QueueOffsets carries it."""
    return UNKNOWN_TS if ts is None else ts


def _membership_reason(joined, left) -> str:
    if joined and left:
        return "changed"
    return "joined" if joined else "left"


class ClusterAdmin:
    """LabAdmin's calls the controller makes, over remoting to the cluster at ``namesrv``.
    Every call takes the stub's ``timeout`` keyword (seconds) and honours it."""

    def __init__(self, namesrv: str, timeout: float = 3.0):
        self.namesrv = namesrv
        self.cluster = Cluster(namesrv, timeout)
        # The lab's topics: the scenario's and its groups' (all created or adopted through
        # CreateTopic). Only these are listed: a cluster's other topics are not the lab's.
        self.topics: set[str] = set()

    async def close(self) -> None:
        await self.cluster.close()

    async def broker_names(self) -> list[str]:
        """The cluster's brokers, in RocketMQ's order."""
        return sorted(await self.cluster.brokers(), key=java_key)

    async def _within(self, timeout, call):
        return await asyncio.wait_for(call, timeout) if timeout is not None else await call

    async def _route(self, topic: str):
        """(readable queues, broker addresses) of ``topic``; none when it has no route yet."""
        try:
            return await self.cluster.route(topic)
        except NotObservable:
            return [], {}

    async def _topic_info(self, topic: str) -> lab.TopicInfo:
        queues, _ = await self._route(topic)
        return lab.TopicInfo(status=_status(), name=topic, queues=[
            lab.QueueRef(topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id) for q in queues])

    # -- topics and brokers ---------------------------------------------------------

    async def CreateTopic(self, request: lab.CreateTopicRequest, timeout=None) -> lab.TopicInfo:
        return await self._within(timeout, self._create_topic(request))

    async def _create_topic(self, request: lab.CreateTopicRequest) -> lab.TopicInfo:
        brokers = await self.cluster.brokers()
        address = brokers.get(request.broker_name)
        if address is None:
            return lab.TopicInfo(status=_status(Code.NOT_FOUND, (
                f"the cluster has no broker {request.broker_name!r} (it has "
                f"{', '.join(sorted(brokers, key=java_key)) or 'none'})")), name=request.name)
        queues, _ = await self._route(request.name)
        if not any(q.broker_name == request.broker_name for q in queues):
            answer = await self.cluster.ask(address, wire.UPDATE_AND_CREATE_TOPIC, {
                **NEW_TOPIC, "topic": request.name, "readQueueNums": request.queue_count,
                "writeQueueNums": request.queue_count})
            if answer.code != wire.SUCCESS:
                return lab.TopicInfo(status=_status(Code.FORBIDDEN, (
                    f"broker {request.broker_name} did not create topic {request.name}: "
                    f"{answer.remark or f'code {answer.code}'}")), name=request.name)
        self.topics.add(request.name)
        return await self._topic_info(request.name)

    async def ListTopics(self, request: lab.ListTopicsRequest, timeout=None) -> lab.ListTopicsResponse:
        topics = await self._within(timeout, asyncio.gather(
            *(self._topic_info(t) for t in sorted(self.topics, key=java_key))))
        return lab.ListTopicsResponse(status=_status(), topics=[t for t in topics if t.queues])

    async def ListBrokers(self, request: lab.ListBrokersRequest, timeout=None) -> lab.ListBrokersResponse:
        brokers = await self._within(timeout, self.cluster.brokers())
        return lab.ListBrokersResponse(status=_status(), brokers=[
            lab.BrokerInfo(status=_status(), broker_name=name, online=True)
            for name in sorted(brokers, key=java_key)])

    async def AddQueues(self, request: lab.AddQueuesRequest, timeout=None) -> lab.TopicInfo:
        return lab.TopicInfo(status=_status(Code.FORBIDDEN, DISABLED["queues"]), name=request.topic)

    async def SetBrokerOnline(self, request: lab.SetBrokerOnlineRequest, timeout=None) -> lab.BrokerInfo:
        return lab.BrokerInfo(status=_status(Code.FORBIDDEN, DISABLED["broker_online"]),
                              broker_name=request.broker_name)

    # -- offsets ----------------------------------------------------------------------

    async def GetQueueOffsets(self, request: lab.QueueOffsetsRequest, timeout=None) -> lab.QueueOffsetsResponse:
        return await self._within(timeout, self._queue_offsets(request))

    async def _queue_offsets(self, request: lab.QueueOffsetsRequest) -> lab.QueueOffsetsResponse:
        """Every lab topic's queues (or the one asked), as LabAdmin answers for "every topic"."""
        response = lab.QueueOffsetsResponse(status=_status())
        for topic in [request.topic] if request.topic else sorted(self.topics, key=java_key):
            queues, addresses = await self._route(topic)
            figures = await self.cluster.offsets(request.group, topic, addresses) if request.group else {}
            for mq in queues:
                f = figures.get(mq, {})
                response.queues.add(
                    queue=lab.QueueRef(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id),
                    min_offset=f.get("min_offset", 0), max_offset=f.get("max_offset", 0),
                    committed_offset=f.get("committed_offset", -1),
                    oldest_unconsumed_store_ts=oldest_ts_field(f.get("oldest_unconsumed_store_ts")),
                    # Pop's in-flight count is the proxy's to tell; the lab's pop groups are its.
                    inflight=0)
        # Taken after the probes: a message stored while they ran is not younger than "now".
        response.ts = int(time.time() * 1000)
        return response

    # -- membership -------------------------------------------------------------------

    async def _members(self, group: str) -> list[str]:
        """The group's client ids, as the first broker that knows the group lists them."""
        for address in (await self.cluster.brokers()).values():
            answer = await self.cluster.ask(address, wire.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
            if answer.code == wire.SUCCESS:
                return sorted((wire.loads(answer.body) or {}).get("consumerIdList") or (), key=java_key)
        return []   # no broker has a consumer of the group

    async def WatchMembership(self, request: lab.GroupRequest):
        """The members now (reason "initial"), then one change per poll that saw one. The
        cluster does not tell why a member left (goodbye, closed connection or expiry): all
        are "left" here; the controller names the reason for the clients it runs."""
        group, known = request.group, None
        while True:
            try:
                members = await self._members(group)
            except (OSError, TimeoutError, NotObservable) as exc:
                # A blip of the cluster: the membership is as last seen until it answers.
                log.info("membership of %s not known this time: %s", group, exc or "timeout")
            else:
                if known is None:
                    yield lab.MembershipChange(group=group, client_ids=members, reason="initial",
                                               ts=int(time.time() * 1000))
                elif members != known:
                    joined = [c for c in members if c not in known]
                    left = [c for c in known if c not in members]
                    yield lab.MembershipChange(group=group, client_ids=members, joined=joined, left=left,
                                               reason=_membership_reason(joined, left), ts=int(time.time() * 1000))
                known = members
            await asyncio.sleep(MEMBERSHIP_POLL_S)
