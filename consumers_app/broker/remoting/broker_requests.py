"""What one logical broker answers over remoting (RocketMQ's broker processors).

Every handler translates a remoting request into the BrokerCore call the gRPC services
make too, so a message sent over remoting is in the same commit log, an offset
committed here is the one a gRPC consumer reads, and the group's member list is one.
"""
from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING

from ...protocol import lab, v2
from .. import messages as M
from ..core import BrokerError, parse_tag_filter
from ..topics import topic_error
from consumers_app.remoting import wire
from consumers_app.remoting.codec import Command, FrameError, response

if TYPE_CHECKING:
    from .server import Connection
    from .service import RemotingService

# Properties the client sets that the broker keeps as the message's own fields.
P_TAGS, P_KEYS, P_UNIQ_KEY, P_DELAY = wire.P_TAGS, wire.P_KEYS, wire.P_UNIQ_KEY, wire.P_DELAY
P_WAIT, P_MAX_RECONSUME = wire.P_WAIT, wire.P_MAX_RECONSUME
# The broker's own properties a pulled message still carries (where a retried one came from).
_SYSTEM_PROPS_SENT = (M.P_RETRY_TOPIC, M.P_ORIGIN_MSG_ID)
# Stored properties a pull answer leaves out: the other system ones, and those it sets itself.
_NOT_SENT = (M.SYSTEM_PROPS - frozenset(_SYSTEM_PROPS_SENT)) | {P_TAGS, P_KEYS, P_UNIQ_KEY}
_NV, _SEP = wire.NAME_VALUE, wire.PROPERTY_SEP
_born_hosts: dict[str, tuple[bytes, int]] = {}   # BORN_HOST value -> (packed ip, port): few distinct ones


class BrokerRequests:
    def __init__(self, service: "RemotingService", broker: str):
        self.service = service
        self.core = service.core
        self.broker = broker
        self._id_host, self._id_prefix = None, ""   # store host -> its part of an offset message id
        self.handlers = {
            wire.SEND_MESSAGE: self.send_message, wire.SEND_MESSAGE_V2: self.send_message,
            wire.SEND_BATCH_MESSAGE: self.send_batch,
            # Java 5.x's DefaultLitePullConsumer pulls with its own code; 5.3's BrokerController
            # registers the same PullMessageProcessor for both (litePullMessageEnable: true).
            wire.PULL_MESSAGE: self.pull_message, wire.LITE_PULL_MESSAGE: self.pull_message,
            wire.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            wire.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            wire.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            wire.GET_MAX_OFFSET: self.max_offset, wire.GET_MIN_OFFSET: self.min_offset,
            wire.HEART_BEAT: self.heartbeat, wire.UNREGISTER_CLIENT: self.unregister_client,
            wire.CONSUMER_SEND_MSG_BACK: self.send_back,
            wire.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            wire.LOCK_BATCH_MQ: self.lock_batch, wire.UNLOCK_BATCH_MQ: self.unlock_batch,
            wire.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            wire.GET_ROUTEINFO_BY_TOPIC: service.names.route,   # some tools ask a broker
            wire.GET_TOPIC_STATS_INFO: self.topic_stats,
            wire.GET_CONSUMER_CONNECTION_LIST: self.consumer_connections,
            wire.GET_CONSUME_STATS: self.consume_stats,
            wire.GET_CONSUMER_RUNNING_INFO: self.consumer_running_info,
            wire.GET_CONSUMER_DEPARTURES: self.consumer_departures,   # lab-only
        }

    async def handle(self, conn: "Connection", cmd: Command) -> Command | None:
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return None
        if not self.core.topics.online(self.broker) and cmd.code != wire.UNREGISTER_CLIENT:
            return response(cmd, wire.SYSTEM_ERROR, f"broker {self.broker} is offline")
        try:
            return await handler(conn, cmd)
        except BrokerError as exc:
            return response(cmd, _code_for(exc), exc.message)

    def key(self, cmd: Command, topic_field: str = "topic", queue_field: str = "queueId") -> tuple:
        topic = cmd.text(topic_field) or ""
        return (topic, self.broker, cmd.number(queue_field))

    # ------------------------------------------------------------------ send

    async def send_message(self, conn, cmd: Command) -> Command:
        h = _send_header(cmd)
        topic = h["b"] or ""
        qid = int(h["e"] or 0)
        key = (topic, self.broker, qid)
        if not self.core.topics.has_queue(topic, self.broker, qid):
            # Only a queue we do not know needs the checks (the broker is online: handle()).
            self.core.require_topic(topic)
            qid = qid % max(1, self.core.topics.get(topic).queues.get(self.broker, 1))
            key = (topic, self.broker, qid)
            self.core.require_queue(*key)
        msg = self._stored_message(h, cmd.body, conn)
        # Written with the other sends of this read (the answer leaves after it: server.Connection).
        (offset, phys), = self.core.put([(key, msg)], defer_write=True)
        if self.core.store.sync_flush:   # (not awaited at all in async mode: the send's fast path)
            await self.core.durable()
        # SendMessageProcessor answers AppendMessageResult.getMsgId(): the offset message id
        # (MessageDecoder.createMessageId); the client's UNIQ_KEY stays in the properties.
        return response(cmd, ext={"msgId": self._offset_id(phys), "queueId": qid, "queueOffset": offset,
                                  "transactionId": msg.message_id})

    async def send_batch(self, conn, cmd: Command) -> Command:
        h = _send_header(cmd)
        topic = h.get("b") or ""
        self.core.require_topic(topic)
        qid = int(h.get("e") or 0)
        key = (topic, self.broker, qid)
        self.core.require_queue(*key)
        # Each message brings its own properties; a batch is never compressed (sysFlag 0),
        # as Java's producer does not compress batches.
        items = [(key, self._stored_message({**h, "i": props, "f": 0}, body, conn))
                 for body, props in _batch_bodies(cmd.body)]
        if not items:
            raise BrokerError(v2.Code.BAD_REQUEST, "empty batch")
        results = self.core.put(items, defer_write=True)
        await self.core.durable()
        # CommitLog's batch append: one offset message id per message, comma-joined.
        ids = ",".join(self._offset_id(phys) for _, phys in results)
        return response(cmd, ext={"msgId": ids, "queueId": qid, "queueOffset": results[0][0]})

    def _offset_id(self, phys: int) -> str:
        host = self.service.store_host(self.broker)
        if host != self._id_host:   # the host and port part, hex, once
            self._id_host, self._id_prefix = host, wire.offset_message_id(host, 0)[:-16]
        return f"{self._id_prefix}{phys:016X}"

    def _stored_message(self, h: dict, body: bytes, conn) -> lab.LabMessage:
        props = wire.string_to_properties(h["i"])
        sys_flag = int(h["f"] or 0)
        if sys_flag & wire.COMPRESSED_FLAG:
            try:
                body = zlib.decompress(body)   # stored inflated: a gRPC consumer gets it readable
            except zlib.error:
                raise BrokerError(v2.Code.BAD_REQUEST, "the body is flagged compressed but does not inflate") from None
        # Attribute sets: a upb message's keyword constructor costs several times more.
        msg = lab.LabMessage()
        msg.body = body
        msg.message_id = props.pop(P_UNIQ_KEY, "") or M.new_message_id()
        tag = props.pop(P_TAGS, "")
        if tag:
            msg.tag = tag
        keys = props.pop(P_KEYS, "")
        if keys:
            msg.keys.extend(k for k in keys.split(" ") if k)
        msg.born_ts = int(h["g"] or time.time() * 1000)
        reconsume = h["j"]
        if reconsume and reconsume != "0":
            msg.reconsume_times = int(reconsume)
        level = int(props.pop(P_DELAY, "0") or 0)
        for name in (P_WAIT, "MIN_OFFSET", "MAX_OFFSET"):
            props.pop(name, None)
        props.setdefault(M.P_BORN_HOST, conn.address)
        stored = msg.properties
        for name, value in props.items():   # (the map's update() is the ABC's: 2x a plain loop)
            stored[name] = value
        if level > 0:
            msg.properties[M.P_DELIVER_MS] = str(int(time.time() * 1000) + self.core.delay.level_delay_ms(level))
        self.core.validate_message(msg)
        return msg

    # ------------------------------------------------------------------ pull

    async def pull_message(self, conn, cmd: Command) -> Command:
        group = cmd.text("consumerGroup") or ""
        key = self.key(cmd)
        self.core.require_queue(*key)
        self.core.note_pull(group, key, conn.client_id)
        sys_flag = cmd.number("sysFlag", 0)
        if sys_flag & wire.PULL_COMMIT_OFFSET and cmd.number("commitOffset", -1) > 0:
            self.core.offsets.commit(group, key, cmd.number("commitOffset"))
        expression = (cmd.text("subscription") if sys_flag & wire.PULL_SUBSCRIPTION
                      else self.service.subscription(group, key[0]))
        tag_filter = parse_tag_filter(expression or "*")
        tags = None if tag_filter is None else tag_filter[1]
        suspend = cmd.number("suspendTimeoutMillis", 0) if sys_flag & wire.PULL_SUSPEND else 0
        store_host = self.service.store_host(self.broker)
        store_ip, store_port = wire.ipv4(store_host[0]), store_host[1]
        parts: list[bytes] = []
        phys = None   # the queue's commit-log offsets, looked up once a message is found

        def fill(offset, raw) -> bool:
            nonlocal phys
            msg = lab.LabMessage.FromString(raw)
            if tags is not None and msg.tag not in tags:
                return False
            if phys is None:
                phys = self.core.store.queue(key).phys
            # The commit-log offset: what a send-back (CONSUMER_SEND_MSG_BACK) names it by.
            parts.append(self._encode(msg, phys[offset], store_ip, store_port))
            return True

        status, nxt, lo, hi = await self.core.pull(group, key, cmd.number("queueOffset"),
                                                   cmd.number("maxMsgNums", 32), tag_filter, suspend, fill)
        ext = {"suggestWhichBrokerId": wire.MASTER_ID, "nextBeginOffset": nxt, "minOffset": lo, "maxOffset": hi}
        code = {lab.FOUND: wire.SUCCESS, lab.NO_NEW_MSG: wire.PULL_NOT_FOUND,
                lab.NO_MATCHED_MSG: wire.PULL_RETRY_IMMEDIATELY, lab.OFFSET_ILLEGAL: wire.PULL_OFFSET_MOVED}[status]
        if code == wire.SUCCESS and not parts:
            code = wire.PULL_RETRY_IMMEDIATELY
        return response(cmd, code, None if code == wire.SUCCESS else "pull status " + lab.PullStatus.Name(status),
                        ext, b"".join(parts))

    def _encode(self, msg: lab.LabMessage, phys: int, store_ip: bytes, store_port: int) -> bytes:
        """A stored message as a pull answer carries it: the stored properties a client sees,
        then TAGS, KEYS, UNIQ_KEY and the message group (send takes those out of the stored
        map, so they are only ever added here); the text built at once, not through a dict."""
        stored = msg.properties   # upb map: keys and [] cost half what items() does
        text = [f"{k}{_NV}{stored[k]}{_SEP}" for k in stored if k not in _NOT_SENT]
        if msg.tag:
            text.append(f"{P_TAGS}{_NV}{msg.tag}{_SEP}")
        keys = msg.keys
        if keys:
            text.append(f"{P_KEYS}{_NV}{' '.join(keys)}{_SEP}")
        text.append(f"{P_UNIQ_KEY}{_NV}{msg.message_id}{_SEP}")
        group = stored.get(M.P_MESSAGE_GROUP)
        if group:
            text.append(f"{M.P_MESSAGE_GROUP}{_NV}{group}{_SEP}")
        born = stored.get(M.P_BORN_HOST, "127.0.0.1:0")
        born_host = _born_hosts.get(born)
        if born_host is None:
            host, _, port = born.rpartition(":")
            born_host = (wire.ipv4(host or born), int(port) if port.isdigit() else 0)
            if len(_born_hosts) < 4096:
                _born_hosts[born] = born_host
        queue = msg.queue
        return wire.encode_record(
            msg.body, queue.topic.encode(), queue.queue_id, msg.queue_offset, phys, msg.born_ts, born_host[0],
            born_host[1], msg.store_ts, store_ip, store_port, msg.reconsume_times, "".join(text).encode())

    # ------------------------------------------------------------------ offsets

    async def query_consumer_offset(self, conn, cmd: Command) -> Command:
        key = self.key(cmd)
        self.core.require_queue(*key)
        offset = self.core.query_consumer_offset(cmd.text("consumerGroup") or "", key)
        if offset < 0:
            return response(cmd, wire.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")
        return response(cmd, ext={"offset": offset})

    async def update_consumer_offset(self, conn, cmd: Command) -> Command:
        key = self.key(cmd)
        self.core.require_queue(*key)
        self.core.offsets.commit(cmd.text("consumerGroup") or "", key, cmd.number("commitOffset"))
        return response(cmd)

    def _queue(self, cmd: Command):
        key = self.key(cmd)
        self.core.require_queue(*key)
        return self.core.store.queue(key)

    async def search_offset(self, conn, cmd: Command) -> Command:
        cq = self._queue(cmd)
        return response(cmd, ext={"offset": cq.offset_for_time(cmd.number("timestamp")) if cq else 0})

    async def max_offset(self, conn, cmd: Command) -> Command:
        cq = self._queue(cmd)
        return response(cmd, ext={"offset": cq.max_offset if cq else 0})

    async def min_offset(self, conn, cmd: Command) -> Command:
        cq = self._queue(cmd)
        return response(cmd, ext={"offset": cq.min_offset if cq else 0})

    # ------------------------------------------------------------------ clients

    async def heartbeat(self, conn, cmd: Command) -> Command:
        try:
            data = wire.loads(cmd.body or b"{}")
        except ValueError as exc:
            raise FrameError(f"heartbeat body is not JSON: {exc}") from None
        client_id = str(data.get("clientID") or "")
        if not client_id:
            return response(cmd, wire.SYSTEM_ERROR, "heartbeat without clientID")
        conn.client_id, conn.language, conn.version = client_id, cmd.language, cmd.version
        for producer in data.get("producerDataSet") or ():
            self.core.membership.heartbeat(None, client_id, v2.ClientType.PRODUCER)
        for consumer in data.get("consumerDataSet") or ():
            group = str(consumer.get("groupName") or "")
            if not group or group == "CLIENT_INNER_PRODUCER":
                continue
            self.service.consumer_heartbeat(conn, self.broker, group, consumer)
        return response(cmd)

    async def unregister_client(self, conn, cmd: Command) -> Command:
        client_id = cmd.text("clientID") or conn.client_id
        group = cmd.text("consumerGroup")
        if group:
            # ConsumerManager.unregisterConsumer; the membership listener ends its sessions.
            self.core.membership.unregister(group, client_id, "left")
        if cmd.text("producerGroup"):
            self.core.membership.unregister(None, client_id)
        return response(cmd)

    async def consumer_departures(self, conn, cmd: Command) -> Command:
        """Lab-only: the group's members gone lately, each with how (membership.departures)."""
        departures = self.core.membership.departures(cmd.text("consumerGroup") or "")
        return response(cmd, body=wire.dumps({"departures": departures}))

    async def consumer_list(self, conn, cmd: Command) -> Command:
        group = cmd.text("consumerGroup") or ""
        members = self.core.membership.members(group)
        if not members:
            return response(cmd, wire.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return response(cmd, body=wire.dumps({"consumerIdList": members}))

    # ------------------------------------------------------------------ retry, locks, topics

    async def send_back(self, conn, cmd: Command) -> Command:
        group = cmd.text("group") or ""
        msg = self.core.store.read_at(cmd.number("offset"))
        if msg is None:
            return response(cmd, wire.SYSTEM_ERROR, f"look message by offset failed, {cmd.text('offset')}")
        self.core.send_back(group, msg, cmd.number("delayLevel", 0), cmd.number("maxReconsumeTimes", -1))
        await self.core.durable()
        return response(cmd)

    def _lock_body(self, cmd: Command):
        try:
            data = wire.loads(cmd.body or b"{}")
            group, client_id = str(data["consumerGroup"]), str(data["clientId"])
            keys = [(str(q["topic"]), str(q.get("brokerName") or self.broker), int(q["queueId"]))
                    for q in data.get("mqSet") or ()]
        except (ValueError, KeyError, TypeError) as exc:
            raise FrameError(f"bad lock body: {exc}") from None
        return group, client_id, keys

    async def lock_batch(self, conn, cmd: Command) -> Command:
        group, client_id, keys = self._lock_body(cmd)
        locked = self.core.lock_queues(group, client_id, keys)
        return response(cmd, body=wire.dumps({"lockOKMQSet": [
            {"topic": t, "brokerName": b, "queueId": q} for t, b, q in locked]}))

    async def unlock_batch(self, conn, cmd: Command) -> Command:
        group, client_id, keys = self._lock_body(cmd)
        self.core.unlock_queues(group, client_id, keys)
        return response(cmd)

    async def create_topic(self, conn, cmd: Command) -> Command:
        name = cmd.text("topic") or ""
        err = topic_error(name)
        if err:
            return response(cmd, wire.SYSTEM_ERROR, err)
        count = cmd.number("writeQueueNums", 0) or cmd.number("readQueueNums", 8)
        if not 1 <= count <= 1024:
            return response(cmd, wire.SYSTEM_ERROR, f"queue count {count} is outside [1, 1024]")
        topic = self.core.topics.get(name)
        if topic is None or topic.queues.get(self.broker) != count:
            self.core.topics.create(name, count, self.broker, self.core.store.write_pos)
            self.core.topics.save()
        return response(cmd)


    # ------------------------------------------------------------------ what dashboards and mqadmin ask

    async def topic_stats(self, conn, cmd: Command) -> Command:
        topic = cmd.text("topic") or ""
        self.core.require_topic(topic)
        table = {}
        for key in self.core.topics.queues_of(topic, online_only=False):
            if key[1] != self.broker:
                continue
            cq = self.core.store.queue(key)
            last = cq.store_ts[-1] if cq is not None and len(cq.store_ts) else 0
            table[wire.message_queue_key(*key)] = {"minOffset": cq.min_offset if cq else 0,
                                                   "maxOffset": cq.max_offset if cq else 0,
                                                   "lastUpdateTimestamp": last}
        return response(cmd, body=wire.dumps({"offsetTable": table}))

    async def consume_stats(self, conn, cmd: Command) -> Command:
        """AdminBrokerProcessor.getConsumeStats: the offset table, whoever the members are
        (gRPC ones too); a group with nothing to show gets an empty table, not an error."""
        group = cmd.text("consumerGroup") or ""
        table = {}
        for name in self._consume_stats_topics(group, cmd.text("topic") or "", cmd.text("topicList") or ""):
            if self.core.topics.get(name) is None:
                continue   # 5.3: "topic config does not exist", skipped
            for key in self.core.topics.queues_of(name, online_only=False):
                if key[1] != self.broker:
                    continue
                cq = self.core.store.queue(key)
                committed = max(self.core.offsets.get(group, key), 0)
                last = 0
                if cq is not None and cq.min_offset <= committed - 1 < cq.max_offset:
                    last = cq.store_ts[committed - 1]
                table[wire.message_queue_key(*key)] = {"brokerOffset": cq.max_offset if cq else 0,
                                                       "consumerOffset": committed, "pullOffset": committed,
                                                       "lastTimestamp": last}
        return response(cmd, body=wire.dumps({"offsetTable": table, "consumeTps": 0.0}))

    def _consume_stats_topics(self, group: str, topic: str, topic_list: str) -> list[str]:
        """getTopicsForCollectingConsumeStats: a topicList as given; else the topic asked
        or every topic the group has offsets for here (whichTopicByConsumer), without
        those its online members do not subscribe to."""
        if topic_list.strip():
            return sorted({t for t in topic_list.split(";") if t})
        topics = {topic} if topic else {k[0] for k in self.core.offsets.offsets.get(group, {}) if k[1] == self.broker}
        subscribed = self.service.subscribed_by_members(group)
        return sorted(t for t in topics if not subscribed or t in subscribed)

    async def consumer_connections(self, conn, cmd: Command) -> Command:
        group = cmd.text("consumerGroup") or ""
        members = self.core.membership.members(group)
        if not members:
            return response(cmd, wire.SYSTEM_ERROR, f"the consumer group[{group}] not online")
        connections = []
        for client_id in members:
            remote = self.service.connection_of(group, client_id)
            connections.append({"clientId": client_id,
                                "clientAddr": remote.address if remote else "",
                                "language": remote.language if remote else "GRPC",
                                "version": remote.version if remote else 0})
        subscriptions = {topic: {"topic": topic, "subString": expression, "tagsSet": [], "codeSet": [],
                                 "subVersion": 0, "expressionType": "TAG"}
                         for topic, expression in self.service.subscribed_topics(group)}
        return response(cmd, body=wire.dumps({
            "connectionSet": connections, "subscriptionTable": subscriptions,
            "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET"}))

    async def consumer_running_info(self, conn, cmd: Command) -> Command:
        """Forwarded to the client over its own connection; its answer is relayed."""
        group, client_id = cmd.text("consumerGroup") or "", cmd.text("clientId") or ""
        remote = self.service.connection_of(group, client_id)
        if remote is None:
            return response(cmd, wire.SYSTEM_ERROR, f"The Consumer <{client_id}> not online")
        try:
            answer = await remote.invoke(wire.GET_CONSUMER_RUNNING_INFO, dict(cmd.ext), timeout=5)
        except (TimeoutError, ConnectionError) as exc:
            return response(cmd, wire.SYSTEM_ERROR,
                            f"the consumer {client_id} did not answer GET_CONSUMER_RUNNING_INFO: {exc or 'timeout'}")
        return response(cmd, answer.code, answer.remark, answer.ext, answer.body)


# SendMessageRequestHeader's fields the broker reads, by their long names (code 10) and
# the V2's one-letter names (310/320): topic, queue id, sysFlag, born ts, properties,
# reconsume times.
_SEND_FIELDS = {"topic": "b", "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "properties": "i",
                "reconsumeTimes": "j"}


def _send_header(cmd: Command) -> dict:
    """The send header's fields by their V2 names, as text (a JSON header's are strings
    already: only another value goes through Command.text)."""
    ext = cmd.ext
    names = _SEND_FIELDS.items() if cmd.code == wire.SEND_MESSAGE else _SEND_FIELDS_V2
    return {short: value if (value := ext.get(name)).__class__ is str else cmd.text(name) for name, short in names}


_SEND_FIELDS_V2 = [(short, short) for short in _SEND_FIELDS.values()]


def _batch_bodies(raw: bytes):
    """(body, properties string) per message of a SEND_BATCH_MESSAGE body."""
    try:
        messages = wire.decode_batch(raw)
    except ValueError as exc:
        raise BrokerError(v2.Code.BAD_REQUEST, f"malformed batch body: {exc}") from None
    return [(body, wire.properties_to_string(props)) for body, props, _flag in messages]


def _code_for(exc: BrokerError) -> int:
    if exc.code in (v2.Code.TOPIC_NOT_FOUND,):
        return wire.TOPIC_NOT_EXIST
    if exc.code in (v2.Code.MESSAGE_BODY_EMPTY, v2.Code.MESSAGE_BODY_TOO_LARGE, v2.Code.ILLEGAL_MESSAGE_TAG):
        return wire.MESSAGE_ILLEGAL
    if exc.code == v2.Code.FORBIDDEN:
        return wire.NO_PERMISSION
    return wire.SYSTEM_ERROR

