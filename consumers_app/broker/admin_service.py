"""``rebalancelab.v1.LabAdmin``: topic/broker administration, membership watch, offsets
for the dashboard, and the 4.x-style fast paths our own consumers use (PullBatch,
SendBack, queue locks). See ``consumers_app/protocol/lab.proto`` for each RPC's contract.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time

from ..protocol import lab, lab_grpc, v2
from .core import BrokerCore, BrokerError, parse_tag_filter
from .messaging_service import client_id_of
from .topics import group_error, topic_error

log = logging.getLogger(__name__)
Code = v2.Code


def status(code=Code.OK, message="OK") -> lab.Status:
    return lab.Status(code=code, message=message)


def guarded(response_type):
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(self, request, context):
            try:
                return await fn(self, request, context)
            except BrokerError as e:
                return response_type(status=status(e.code, e.message))
            except Exception as e:
                log.exception("%s failed", fn.__name__)
                return response_type(status=status(Code.INTERNAL_ERROR, f"{type(e).__name__}: {e}"))
        return handler
    return wrap


def qref(key) -> lab.QueueRef:
    return lab.QueueRef(topic=key[0], broker_name=key[1], queue_id=key[2])


class LabAdminService(lab_grpc.LabAdminServicer):
    def __init__(self, core: BrokerCore):
        self.core = core

    # ---------------------------------------------------------------- helpers

    def _group(self, name: str) -> str:
        err = group_error(name)
        if err:
            raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, err)
        return name

    def _topic_info(self, name: str) -> lab.TopicInfo:
        info = lab.TopicInfo(status=status(), name=name)
        for key in self.core.topics.queues_of(name, online_only=False):
            info.queues.append(qref(key))
        return info

    def _broker_name(self, name: str) -> str:
        name = name or self.core.cfg.default_broker
        if any(c.isspace() for c in name) or ":" in name:
            raise BrokerError(Code.BAD_REQUEST, f"illegal broker name {name!r} (no spaces or ':')")
        return name

    # ----------------------------------------------------------------- topics

    @guarded(lab.TopicInfo)
    async def CreateTopic(self, request, context):
        err = topic_error(request.name)
        if err:
            raise BrokerError(Code.ILLEGAL_TOPIC, err)
        if request.queue_count <= 0 or request.queue_count > 1024:
            raise BrokerError(Code.BAD_REQUEST, f"queue count {request.queue_count} is outside [1, 1024]")
        broker = self._broker_name(request.broker_name)
        self.core.topics.create(request.name, request.queue_count, broker, self.core.store.write_pos)
        self.core.topics.save()
        return self._topic_info(request.name)

    @guarded(lab.DeleteTopicResponse)
    async def DeleteTopic(self, request, context):
        self.core.require_topic(request.name)
        self.core.topics.delete(request.name)
        for key in [k for k in self.core.store.queues if k[0] == request.name]:
            self.core.store.drop_queue(key)
        self.core.offsets.drop_topic(request.name)
        self.core.topics.save()
        self.core.longpoll.wake_all()
        return lab.DeleteTopicResponse(status=status())

    @guarded(lab.TopicInfo)
    async def AddQueues(self, request, context):
        self.core.require_topic(request.topic)
        broker = self._broker_name(request.broker_name)
        t = self.core.topics.get(request.topic)
        current = t.queues.get(broker, 0)
        new = current + request.delta
        if new < 0 or new > 1024:
            raise BrokerError(Code.BAD_REQUEST, f"queue count would become {new}, outside [0, 1024]")
        if new == 0:
            self.core.topics.changed()
            t.queues.pop(broker, None)
            t.since.pop(broker, None)
            # Gone from this broker: forget its queues now, as a restart would.
            for key in [k for k in self.core.store.queues if k[0] == request.topic and k[1] == broker]:
                self.core.store.drop_queue(key)
        else:
            self.core.topics.create(request.topic, new, broker, self.core.store.write_pos)
        self.core.topics.save()
        return self._topic_info(request.topic)

    @guarded(lab.ListTopicsResponse)
    async def ListTopics(self, request, context):
        resp = lab.ListTopicsResponse(status=status())
        for name in sorted(self.core.topics.topics):
            resp.topics.append(self._topic_info(name))
        return resp

    # ------------------------------------------------------------- membership

    @guarded(lab.GroupMembers)
    async def ListGroupMembers(self, request, context):
        group = self._group(request.group)
        if not self.core.known_group(group):
            raise BrokerError(Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} is unknown to this broker")
        return lab.GroupMembers(status=status(), group=group, client_ids=self.core.membership.members(group))

    async def WatchMembership(self, request, context):
        group = request.group
        err = group_error(group)
        if err:
            await context.abort(_grpc_invalid(), err)
        membership = self.core.membership
        client_id = client_id_of(context)  # a consumer's watch is its session (see membership.py)
        q = membership.watch(group)
        if client_id:
            membership.open_session(group, client_id)
        try:
            while True:
                change = await q.get()
                yield lab.MembershipChange(**change)
        finally:
            membership.unwatch(group, q)
            if client_id:
                membership.close_session(group, client_id)

    async def Session(self, request_iterator, context):
        """WatchMembership, plus the member's requests answered on the same stream: the
        first request names the group; each later one is answered with its id, in between
        the changes, as it would be by its own call."""
        requests = request_iterator.__aiter__()
        try:
            opening = await requests.__anext__()
        except StopAsyncIteration:
            return
        group = opening.watch.group
        err = group_error(group)
        if err:
            await context.abort(_grpc_invalid(), err)
        membership = self.core.membership
        client_id = client_id_of(context)
        out = membership.watch(group)   # changes arrive here as dicts; answers are put beside them
        if client_id:
            membership.open_session(group, client_id)
        answering = asyncio.get_running_loop().create_task(self._answer(requests, context, out))
        try:
            while True:
                item = await out.get()
                yield lab.SessionMessage(change=lab.MembershipChange(**item)) if isinstance(item, dict) else item
        finally:
            answering.cancel()
            membership.unwatch(group, out)
            if client_id:
                membership.close_session(group, client_id)

    async def _answer(self, requests, context, out) -> None:
        pulls: set[asyncio.Task] = set()   # each its own task: a long poll holds nothing else up
        try:
            async for request in requests:
                if request.HasField("queue_offsets"):
                    answer = await self.GetQueueOffsets(request.queue_offsets, context)
                    out.put_nowait(lab.SessionMessage(id=request.id, queue_offsets=answer))
                elif request.HasField("pull"):
                    pull = asyncio.get_running_loop().create_task(self._session_pull(request, context, out))
                    pulls.add(pull)
                    pull.add_done_callback(pulls.discard)
        except Exception as exc:  # noqa: BLE001 - the member went; the stream's end says so
            log.debug("session requests ended: %s", exc)
        finally:
            for pull in pulls:
                pull.cancel()

    async def _session_pull(self, request, context, out) -> None:
        answer = await self.PullBatch(request.pull, context)
        out.put_nowait(lab.SessionMessage(id=request.id, pull=answer))

    # ---------------------------------------------------------------- brokers

    @guarded(lab.BrokerInfo)
    async def SetBrokerOnline(self, request, context):
        broker = self._broker_name(request.broker_name)
        if broker not in self.core.topics.brokers:
            raise BrokerError(Code.NOT_FOUND, f"no logical broker named {broker!r}")
        self.core.set_broker_online(broker, request.online)
        return lab.BrokerInfo(status=status(), broker_name=broker, online=request.online)

    @guarded(lab.ListBrokersResponse)
    async def ListBrokers(self, request, context):
        resp = lab.ListBrokersResponse(status=status())
        for name in sorted(self.core.topics.brokers):
            resp.brokers.add(status=status(), broker_name=name, online=self.core.topics.online(name))
        return resp

    # ---------------------------------------------------------------- offsets

    @guarded(lab.QueueOffsetsResponse)
    async def GetQueueOffsets(self, request, context):
        core = self.core
        group = request.group
        if group:
            self._group(group)
        if request.queues:
            keys = self._asked_queues(request)
        else:
            if request.topic:
                core.require_topic(request.topic)
                names = [request.topic]
            else:
                names = sorted(core.topics.topics)
            keys = [key for name in names for key in core.topics.queues_of(name, online_only=False)]
        resp = lab.QueueOffsetsResponse(status=status(), ts=int(time.time() * 1000))
        for key in keys:
            cq = core.store.queue(key)
            lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
            committed = core.offsets.get(group, key) if group else -1
            oldest = 0
            if group and cq is not None:
                first = max(committed, lo) if committed >= 0 else lo
                if first < hi:
                    oldest = cq.store_ts[first]
            puller, pulled_ms = core.pullers.get((group, *key), ("", 0)) if group else ("", 0)
            resp.queues.add(queue=qref(key), min_offset=lo, max_offset=hi, committed_offset=committed,
                            oldest_unconsumed_store_ts=oldest,
                            inflight=core.pop.inflight_count(group, key) if group else 0,
                            last_puller=puller, last_pull_ms=pulled_ms)
        return resp

    def _asked_queues(self, request) -> list[tuple[str, str, int]]:
        """The queue keys a GetQueueOffsets names, each checked: of ``topic`` (a ref's own
        topic may be left empty), on a broker that has the topic, in range."""
        core = self.core
        keys = []
        for ref in request.queues:
            topic = ref.topic or request.topic
            if request.topic and topic != request.topic:
                raise BrokerError(Code.BAD_REQUEST, f"queue of topic {topic!r} asked with topic {request.topic!r}")
            broker = ref.broker_name or core.cfg.default_broker
            core.require_topic(topic)
            if not core.topics.has_queue(topic, broker, ref.queue_id):
                raise BrokerError(Code.NOT_FOUND, f"topic {topic!r} has no queue {ref.queue_id} on broker {broker!r}")
            keys.append((topic, broker, ref.queue_id))
        return keys

    @guarded(lab.SearchOffsetResponse)
    async def SearchOffset(self, request, context):
        q = request.queue
        key = (q.topic, q.broker_name or self.core.cfg.default_broker, q.queue_id)
        self.core.require_queue(*key)
        cq = self.core.store.queue(key)
        return lab.SearchOffsetResponse(status=status(), offset=cq.offset_for_time(request.timestamp) if cq else 0)

    # ------------------------------------------------------------- fast paths

    @guarded(lab.PullBatchResponse)
    async def PullBatch(self, request, context):
        core = self.core
        group = self._group(request.group)
        q = request.queue
        key = (q.topic, q.broker_name or core.cfg.default_broker, q.queue_id)
        core.require_queue(*key)
        # As the 4.x push consumer sets the commit sysFlag only when its offset is > 0,
        # 0 (proto3's default) and -1 both mean "no commit".
        if request.commit_offset > 0:
            core.offsets.commit(group, key, request.commit_offset)
        tag_filter = parse_tag_filter(request.tag_expression)
        resp = lab.PullBatchResponse()
        msgs = resp.messages
        tags = None if tag_filter is None else tag_filter[1]

        def fill(off, raw):
            m = msgs.add()
            m.MergeFromString(raw)  # stored bytes are a LabMessage already: no re-encoding
            if tags is not None and m.tag not in tags:
                del msgs[-1]
                return False
            return True

        suspend = request.suspend_timeout_ms
        remaining = context.time_remaining()
        if remaining is not None:
            suspend = max(0, min(suspend, int(remaining * 1000) - 200))
        pull_status, nxt, lo, hi = await core.pull(group, key, request.offset, request.max_messages,
                                                   tag_filter, suspend, fill)
        resp.status.CopyFrom(status())
        resp.pull_status = pull_status
        resp.next_begin_offset = nxt
        resp.min_offset = lo
        resp.max_offset = hi
        return resp

    @guarded(lab.SendBackResponse)
    async def SendBack(self, request, context):
        group = self._group(request.group)
        msg = request.message
        if not msg.queue.topic:
            raise BrokerError(Code.BAD_REQUEST, "the message to send back has no queue/topic")
        dest = self.core.send_back(group, msg, request.delay_level, request.max_reconsume_times)
        await self.core.durable()
        return lab.SendBackResponse(status=status(), destination_topic=dest)

    @guarded(lab.LockQueuesResponse)
    async def LockQueues(self, request, context):
        group = self._group(request.group)
        if not request.client_id:
            raise BrokerError(Code.CLIENT_ID_REQUIRED, "client_id is required to lock queues")
        keys = [(q.topic, q.broker_name or self.core.cfg.default_broker, q.queue_id) for q in request.queues]
        locked = self.core.lock_queues(group, request.client_id, keys)
        return lab.LockQueuesResponse(status=status(), locked=[qref(k) for k in locked])

    @guarded(lab.LockQueuesResponse)
    async def UnlockQueues(self, request, context):
        group = self._group(request.group)
        keys = [(q.topic, q.broker_name or self.core.cfg.default_broker, q.queue_id) for q in request.queues]
        self.core.unlock_queues(group, request.client_id, keys)
        # "locked" = the requested queues the client still holds (none once released).
        still = [k for k in keys if self.core.locks.get((group, *k), ("",))[0] == request.client_id]
        return lab.LockQueuesResponse(status=status(), locked=[qref(k) for k in still])

    @guarded(lab.GroupConfigResponse)
    async def UpdateGroup(self, request, context):
        group = self._group(request.group)
        cfg = self.core.topics.groups.setdefault(group, {})
        cfg["fifo"] = request.fifo
        if request.retry_max_times > 0:
            cfg["retry_max_times"] = request.retry_max_times
            self.core.pop.group_max_attempts[group] = request.retry_max_times + 1
        self.core.topics.save()
        return lab.GroupConfigResponse(status=status(), group=group, fifo=cfg["fifo"],
                                       retry_max_times=cfg.get("retry_max_times", self.core.cfg.max_reconsume_times))


def _grpc_invalid():
    import grpc
    return grpc.StatusCode.INVALID_ARGUMENT
