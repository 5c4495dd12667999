"""``apache.rocketmq.v2.MessagingService``: what RocketMQ 5's proxy serves, over BrokerCore.

Every failure is answered in the response's ``status`` (code + readable message), as
the proxy does; the official client maps codes to exceptions. Handlers never let an
exception escape as a gRPC error, so one bad request never disturbs the others.
"""
from __future__ import annotations

import functools
import logging
import time

from ..protocol import v2, v2_grpc, v2_service as svc
from . import messages as M
from .core import BrokerCore, BrokerError, parse_tag_filter
from .pop import HandleError
from .topics import group_error, pop_retry_topic

log = logging.getLogger(__name__)
Code = v2.Code
ACCEPT_TYPES = [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]  # a "mixed" topic, as by default


def status(code=Code.OK, message="OK") -> v2.Status:
    return v2.Status(code=code, message=message)


OK = status()


def client_id_of(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return value
    return ""


def guarded(response_type):
    """Turn BrokerError/HandleError/unexpected errors into a response status."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(self, request, context):
            try:
                return await fn(self, request, context)
            except BrokerError as e:
                return response_type(status=status(e.code, e.message))
            except HandleError as e:
                return response_type(status=status(Code.INVALID_RECEIPT_HANDLE, str(e)))
            except Exception as e:  # keep serving; report what went wrong
                log.exception("%s failed", fn.__name__)
                return response_type(status=status(Code.INTERNAL_ERROR, f"{type(e).__name__}: {e}"))
        return handler
    return wrap


def duration_ms(d) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def overall(entries_status: list) -> v2.Status:
    """One status for a batch: OK, the single entry's, or MULTIPLE_RESULTS when mixed."""
    if not entries_status:
        return status(Code.BAD_REQUEST, "the request holds no entries")
    codes = {s.code for s in entries_status}
    if len(entries_status) == 1 or len(codes) == 1:
        return entries_status[0] if codes != {Code.OK} else status()
    return status(Code.MULTIPLE_RESULTS, "entries have different results; see each entry's status")


MAX_PROPERTY_COUNT = 128          # ProxyConfig.maxPropertyCount
MAX_PROPERTY_SIZE = 16 * 1024     # ProxyConfig.maxUserPropertySize (bytes; we count characters)


def check_properties(props):
    if len(props) > MAX_PROPERTY_COUNT:
        raise BrokerError(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"{len(props)} user properties exceed the limit of {MAX_PROPERTY_COUNT}")
    size = sum(len(k) + len(v) for k, v in props.items())
    if size > MAX_PROPERTY_SIZE:
        raise BrokerError(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"user properties of {size} characters exceed the limit of {MAX_PROPERTY_SIZE}")


class MessagingService(v2_grpc.MessagingServiceServicer):
    def __init__(self, core: BrokerCore, advertised: tuple[str, int]):
        self.core = core
        self.host, self.port = advertised

    # --------------------------------------------------------------- helpers

    def _group(self, resource) -> str:
        name = resource.name
        err = group_error(name)
        if err:
            raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, err)
        return name

    def _endpoints(self, request_endpoints) -> v2.Endpoints:
        if request_endpoints is not None and len(request_endpoints.addresses):
            return request_endpoints
        ep = v2.Endpoints(scheme=v2.IPv4)
        ep.addresses.add(host=self.host, port=self.port)
        return ep

    def _mq(self, topic, broker, qid, endpoints) -> v2.MessageQueue:
        mq = v2.MessageQueue(id=qid, permission=v2.READ_WRITE, accept_message_types=ACCEPT_TYPES)
        mq.topic.name = topic
        mq.broker.name = broker
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(endpoints)
        return mq

    # ----------------------------------------------------------------- route

    @guarded(svc.QueryRouteResponse)
    async def QueryRoute(self, request, context):
        topic = request.topic.name
        self.core.require_topic(topic)
        ep = self._endpoints(request.endpoints)
        resp = svc.QueryRouteResponse(status=status())
        for t, b, q in self.core.topics.queues_of(topic):
            resp.message_queues.append(self._mq(t, b, q, ep))
        return resp

    @guarded(svc.HeartbeatResponse)
    async def Heartbeat(self, request, context):
        cid = client_id_of(context)
        if not cid:
            raise BrokerError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id metadata header is required")
        group = self._group(request.group) if request.HasField("group") and request.group.name else ""
        self.core.membership.heartbeat(group, cid, request.client_type)
        return svc.HeartbeatResponse(status=status())

    @guarded(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request, context):
        cid = client_id_of(context)
        if not cid:
            raise BrokerError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id metadata header is required")
        group = request.group.name if request.HasField("group") else ""
        if group:
            self.core.membership.unregister(group, cid, "left")
        else:
            self.core.membership.unregister_everywhere(cid, "left")
        return svc.NotifyClientTerminationResponse(status=status())

    # ------------------------------------------------------------------ send

    @guarded(svc.SendMessageResponse)
    async def SendMessage(self, request, context):
        core = self.core
        if not request.messages:
            raise BrokerError(Code.BAD_REQUEST, "the request holds no messages")
        items, where = [], []
        checked_topics = set()
        targets = {}  # target label -> queue key, checked once per request
        max_body = core.cfg.max_body_size
        failures = {}
        for i, m in enumerate(request.messages):
            try:
                topic = m.topic.name
                if topic not in checked_topics:
                    core.require_topic(topic)
                    checked_topics.add(topic)
                if len(m.body) > max_body:
                    raise BrokerError(Code.MESSAGE_BODY_TOO_LARGE,
                                      f"message body of {len(m.body)} bytes exceeds the limit of {max_body} bytes")
                up = m.user_properties
                if up and not (len(up) == 1 and M.P_TARGET_QUEUE in up):
                    check_properties(up)
                msg = M.from_v2(m)
                core.validate_message(msg)
                label = m.user_properties.get(M.P_TARGET_QUEUE)
                if label:
                    key = targets.get((topic, label))
                    if key is None:
                        key = targets[(topic, label)] = core.choose_queue(topic, msg, label)
                else:
                    key = core.choose_queue(topic, msg, None)
                items.append((key, msg))
                where.append(i)
            except BrokerError as e:
                failures[i] = (e, m.system_properties.message_id)
        offsets = {}
        if items:
            results = core.put(items)
            await core.durable()
            offsets = {i: (msg.message_id, r[0]) for i, (_, msg), r in zip(where, items, results)}
        resp = svc.SendMessageResponse()
        add = resp.entries.add
        for i in range(len(request.messages)):
            ok = offsets.get(i)
            if ok is not None:
                add(status=OK, message_id=ok[0], offset=ok[1])
            else:
                e, mid = failures[i]
                add(status=status(e.code, e.message), message_id=mid)
        # One status for the batch: OK, the common code, or MULTIPLE_RESULTS when mixed.
        codes = {e.code for e, _ in failures.values()}
        if not failures:
            resp.status.CopyFrom(OK)
        elif not items and len(codes) == 1:
            resp.status.CopyFrom(resp.entries[0].status)
        else:
            resp.status.code = Code.MULTIPLE_RESULTS
            resp.status.message = "entries have different results; see each entry's status"
        return resp

    # ----------------------------------------------------------- assignment

    @guarded(svc.QueryAssignmentResponse)
    async def QueryAssignment(self, request, context):
        topic = request.topic.name
        group = self._group(request.group)
        self.core.require_topic(topic)
        ep = self._endpoints(request.endpoints)
        resp = svc.QueryAssignmentResponse(status=status())
        queues = self.core.topics.queues_of(topic)
        if self.core.pop.is_fifo(group):
            # Ordered group: every readable queue (each is popped in order).
            for t, b, q in queues:
                resp.assignments.add().message_queue.CopyFrom(self._mq(t, b, q, ep))
        else:
            # Normal group: one per broker, queue id -1 = "pop from any queue of it".
            for b in sorted({b for _, b, _ in queues}, key=lambda s: s.encode("utf-16-be", "surrogatepass")):
                resp.assignments.add().message_queue.CopyFrom(self._mq(topic, b, -1, ep))
        return resp

    # -------------------------------------------------------------- receive

    def _receive_plan(self, request):
        """Validate a ReceiveMessage request; return what the pop needs."""
        core = self.core
        group = self._group(request.group)
        mq = request.message_queue
        topic = mq.topic.name
        core.require_topic(topic)
        t = core.topics.get(topic)
        if mq.broker.name:
            brokers = [mq.broker.name]
            if mq.broker.name not in t.queues:
                raise BrokerError(Code.NOT_FOUND, f"topic {topic!r} has no queues on broker {mq.broker.name!r}")
            if not core.topics.online(mq.broker.name):
                raise BrokerError(Code.FORBIDDEN, f"broker {mq.broker.name!r} is offline")
            if mq.id >= t.queues[mq.broker.name]:
                raise BrokerError(Code.BAD_REQUEST, f"queue id {mq.id} is out of range for topic {topic!r}")
        else:
            brokers = [b for b in t.queues if core.topics.online(b)]
            if not brokers:
                raise BrokerError(Code.FORBIDDEN, f"every broker of topic {topic!r} is offline")
        # As the proxy: a normal group pops from any queue of the broker (queue id -1)
        # whichever queue the client named; an ordered group pops the queue it names.
        qid = mq.id if (mq.broker.name and core.pop.is_fifo(group) and mq.id >= 0) else -1
        auto_renew = request.auto_renew
        if auto_renew and not request.HasField("invisible_duration"):
            # The push consumer's receive: the proxy picks the invisible time and renews it.
            invisible = core.cfg.default_invisible_ms
        elif not request.HasField("invisible_duration"):
            raise BrokerError(Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required unless auto_renew is set")
        else:
            invisible = duration_ms(request.invisible_duration)
            if invisible < core.cfg.min_invisible_ms or invisible > core.cfg.max_invisible_ms:
                raise BrokerError(Code.ILLEGAL_INVISIBLE_TIME,
                                  f"invisible time {invisible} ms is outside [{core.cfg.min_invisible_ms}, "
                                  f"{core.cfg.max_invisible_ms}] ms")
        expr = request.filter_expression
        if expr.type == v2.SQL:
            raise BrokerError(Code.UNSUPPORTED, "SQL92 filter expressions are not supported by the lab broker")
        batch = request.batch_size or core.cfg.receive_batch_size
        if batch < 0 or batch > 1024:
            raise BrokerError(Code.BAD_REQUEST, f"batch size {batch} is outside [1, 1024]")
        if request.HasField("long_polling_timeout"):
            poll_ms = duration_ms(request.long_polling_timeout)
            if poll_ms < 0:
                raise BrokerError(Code.ILLEGAL_POLLING_TIME, f"long polling timeout {poll_ms} ms is negative")
        else:
            poll_ms = core.cfg.long_poll_default_ms
        return group, topic, brokers, qid, batch, invisible, parse_tag_filter(expr.expression), auto_renew, poll_ms

    async def ReceiveMessage(self, request, context):
        try:
            async for response in self._receive(request, context):
                yield response
        except Exception as e:  # keep serving; report what went wrong
            log.exception("ReceiveMessage failed")
            yield svc.ReceiveMessageResponse(status=status(Code.INTERNAL_ERROR, f"{type(e).__name__}: {e}"))

    async def _receive(self, request, context):
        core = self.core
        try:
            group, topic, brokers, qid, batch, invisible, tag_filter, auto_renew, poll_ms = \
                self._receive_plan(request)
        except BrokerError as e:
            yield svc.ReceiveMessageResponse(status=status(e.code, e.message))
            return
        cid = client_id_of(context)
        wait_ms = min(poll_ms, core.cfg.long_poll_max_ms)
        remaining = context.time_remaining()
        if remaining is not None:
            # Answer a little before the client's deadline (longPollingReserveTimeInMillis).
            wait_ms = max(0, min(wait_ms, int(remaining * 1000) - 200))
        deadline = time.monotonic() + wait_ms / 1000
        rt = pop_retry_topic(group, topic)

        def attempt():
            got = []
            for b in brokers:
                if not core.topics.online(b):
                    continue
                got += core.pop.pop(group, topic, b, qid, batch - len(got), invisible, tag_filter, cid, auto_renew)
                if len(got) >= batch:
                    break
            return got

        targets = [(topic, b, None if qid < 0 else {qid}) for b in brokers] + [(rt, b, None) for b in brokers]
        try:
            found = await core.longpoll.poll(attempt, targets, deadline)
        except BrokerError as e:
            yield svc.ReceiveMessageResponse(status=status(e.code, e.message))
            return
        if not found:
            yield svc.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield svc.ReceiveMessageResponse(status=status())
        for msg, handle, attempt_no in found:
            yield svc.ReceiveMessageResponse(message=M.to_v2(msg, receipt_handle=handle, invisible_ms=invisible,
                                                             delivery_attempt=attempt_no))
        ts = svc.ReceiveMessageResponse()
        ts.delivery_timestamp.GetCurrentTime()
        yield ts

    # ------------------------------------------------------------- ack etc.

    @guarded(svc.AckMessageResponse)
    async def AckMessage(self, request, context):
        group = self._group(request.group)
        self.core.require_topic(request.topic.name)
        resp = svc.AckMessageResponse()
        for e in request.entries:
            try:
                self.core.pop.ack(group, e.receipt_handle)
                st = status()
            except HandleError as err:
                st = status(Code.INVALID_RECEIPT_HANDLE, str(err))
            resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle, status=st)
        resp.status.CopyFrom(overall([e.status for e in resp.entries]))
        return resp

    @guarded(svc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request, context):
        group = self._group(request.group)
        self.core.require_topic(request.topic.name)
        invisible = duration_ms(request.invisible_duration)
        if invisible < 0 or invisible > self.core.cfg.max_invisible_ms:
            raise BrokerError(Code.ILLEGAL_INVISIBLE_TIME,
                              f"invisible time {invisible} ms is outside [0, {self.core.cfg.max_invisible_ms}] ms")
        handle = self.core.pop.change_invisible(group, request.receipt_handle, invisible)
        return svc.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle)

    @guarded(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request, context):
        group = self._group(request.group)
        self.core.require_topic(request.topic.name)
        self.core.pop.forward_to_dlq(group, request.receipt_handle)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=status())

    # ------------------------------------------------------------- pull mode

    def _queue_key(self, mq) -> tuple:
        broker = mq.broker.name or self.core.cfg.default_broker
        key = (mq.topic.name, broker, mq.id)
        self.core.require_queue(*key)
        return key

    async def PullMessage(self, request, context):
        try:
            async for response in self._pull(request, context):
                yield response
        except Exception as e:
            log.exception("PullMessage failed")
            yield svc.PullMessageResponse(status=status(Code.INTERNAL_ERROR, f"{type(e).__name__}: {e}"))

    async def _pull(self, request, context):
        core = self.core
        try:
            group = self._group(request.group)
            key = self._queue_key(request.message_queue)
            if request.filter_expression.type == v2.SQL:
                raise BrokerError(Code.UNSUPPORTED, "SQL92 filter expressions are not supported by the lab broker")
            tag_filter = parse_tag_filter(request.filter_expression.expression)
            found = []

            def fill(off, raw):
                msg = M.lab.LabMessage.FromString(raw)
                if tag_filter is not None and msg.tag not in tag_filter[1]:
                    return False
                found.append(msg)
                return True

            poll_ms = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
            remaining = context.time_remaining()
            if remaining is not None:
                poll_ms = max(0, min(poll_ms, int(remaining * 1000) - 200))
            pull_status, nxt, lo, hi = await core.pull(group, key, request.offset, request.batch_size or 32,
                                                       tag_filter, poll_ms, fill)
        except BrokerError as e:
            yield svc.PullMessageResponse(status=status(e.code, e.message))
            return
        if pull_status == M.lab.OFFSET_ILLEGAL:
            yield svc.PullMessageResponse(status=status(Code.ILLEGAL_OFFSET,
                                                        f"offset {request.offset} is outside [{lo}, {hi}]"))
        elif found:
            yield svc.PullMessageResponse(status=status())
        else:
            yield svc.PullMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
        for msg in found:
            yield svc.PullMessageResponse(message=M.to_v2(msg))
        yield svc.PullMessageResponse(next_offset=nxt)

    @guarded(svc.UpdateOffsetResponse)
    async def UpdateOffset(self, request, context):
        group = self._group(request.group)
        key = self._queue_key(request.message_queue)
        if request.offset < 0:
            raise BrokerError(Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        self.core.offsets.commit(group, key, request.offset)
        return svc.UpdateOffsetResponse(status=status())

    @guarded(svc.GetOffsetResponse)
    async def GetOffset(self, request, context):
        group = self._group(request.group)
        key = self._queue_key(request.message_queue)
        off = self.core.query_consumer_offset(group, key)
        if off < 0:
            raise BrokerError(Code.OFFSET_NOT_FOUND, f"group {group!r} has no committed offset for {key}")
        return svc.GetOffsetResponse(status=status(), offset=off)

    @guarded(svc.QueryOffsetResponse)
    async def QueryOffset(self, request, context):
        key = self._queue_key(request.message_queue)
        cq = self.core.store.queue(key)
        lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
        policy = request.query_offset_policy
        if policy == v2.BEGINNING:
            off = lo
        elif policy == v2.END:
            off = hi
        else:
            ts = request.timestamp.seconds * 1000 + request.timestamp.nanos // 1_000_000
            off = cq.offset_for_time(ts) if cq else 0
        return svc.QueryOffsetResponse(status=status(), offset=off)

    # ------------------------------------------------------------- telemetry

    def _server_settings(self, client: v2.Settings) -> v2.Settings:
        """The settings the proxy answers: the client's own, completed by the server's
        (max body size, backoff policy, fifo flag, batch size, long-polling timeout)."""
        cfg = self.core.cfg
        out = v2.Settings()
        out.CopyFrom(client)
        if client.HasField("publishing") or client.client_type == v2.PRODUCER:
            out.publishing.max_body_size = cfg.max_body_size
            out.publishing.validate_message_type = True
            exp = out.backoff_policy.exponential_backoff
            exp.initial.FromMilliseconds(10)
            exp.max.FromMilliseconds(1000)
            exp.multiplier = 2
            out.backoff_policy.max_attempts = 3
        else:
            group = client.subscription.group.name
            sub = out.subscription
            sub.fifo = self.core.pop.is_fifo(group)
            sub.receive_batch_size = cfg.receive_batch_size
            asked = duration_ms(client.subscription.long_polling_timeout) \
                if client.subscription.HasField("long_polling_timeout") else cfg.long_poll_max_ms
            sub.long_polling_timeout.FromMilliseconds(min(asked, cfg.long_poll_max_ms))
            max_attempts = self.core.pop.max_attempts(group)
            if client.HasField("backoff_policy") and client.backoff_policy.max_attempts > 0:
                max_attempts = client.backoff_policy.max_attempts
            else:
                out.backoff_policy.max_attempts = max_attempts
                for ms in self.core.delay.levels:
                    out.backoff_policy.customized_backoff.next.add().FromMilliseconds(ms)
        out.metric.on = False
        return out

    async def Telemetry(self, request_iterator, context):
        cid = client_id_of(context)
        async for cmd in request_iterator:
            if not cid:
                yield svc.TelemetryCommand(status=status(Code.CLIENT_ID_REQUIRED,
                                                        "the x-mq-client-id metadata header is required"))
                continue
            if cmd.WhichOneof("command") != "settings":
                continue  # thread stack traces, verify results: nothing to do
            s = cmd.settings
            group = s.subscription.group.name if s.HasField("subscription") else ""
            if group:
                err = group_error(group)
                if err:
                    yield svc.TelemetryCommand(status=status(Code.ILLEGAL_CONSUMER_GROUP, err))
                    continue
                if s.HasField("backoff_policy") and s.backoff_policy.max_attempts > 0:
                    self.core.pop.group_max_attempts[group] = s.backoff_policy.max_attempts
            self.core.membership.heartbeat(group, cid, s.client_type, settings=s)
            yield svc.TelemetryCommand(status=status(), settings=self._server_settings(s))

    # ------------------------------------------------------- not implemented

    async def EndTransaction(self, request, context):
        return svc.EndTransactionResponse(status=status(
            Code.NOT_IMPLEMENTED, "transactional messages are not implemented by the lab broker"))

    async def RecallMessage(self, request, context):
        return svc.RecallMessageResponse(status=status(
            Code.NOT_IMPLEMENTED, "RecallMessage is not implemented by the lab broker"))

    async def SyncLiteSubscription(self, request, context):
        return svc.SyncLiteSubscriptionResponse(status=status(
            Code.NOT_IMPLEMENTED, "lite topics are not implemented by the lab broker"))
