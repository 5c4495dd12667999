"""Conversions between the wire messages (v2 ``Message``) and the stored ``LabMessage``.

The store keeps one format, ``rebalancelab.v1.LabMessage``: user properties and the
broker's own bookkeeping live together in ``properties``, the latter under RocketMQ's
property names (``RETRY_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``REAL_TOPIC``...), which are
stripped before a message goes back to a client.
"""
from __future__ import annotations

import itertools
import os
import socket
import zlib

from ..protocol import lab, v2

# Broker-internal properties (RocketMQ's MessageConst names where one exists).
P_RETRY_TOPIC = "RETRY_TOPIC"            # original topic of a %RETRY% message
P_ORIGIN_MSG_ID = "ORIGIN_MESSAGE_ID"
P_REAL_TOPIC = "REAL_TOPIC"              # delayed message: where it goes when due
P_REAL_BROKER = "REAL_BROKER"
P_REAL_QID = "REAL_QID"
P_DELIVER_MS = "TIMER_DELIVER_MS"        # delayed message: due time (ms)
P_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
P_MESSAGE_GROUP = "__SHARDINGKEY"
P_BORN_HOST = "BORN_HOST"
P_TRACE = "TRACE_CONTEXT"
P_TRANSACTION = "TRAN_MSG"
SYSTEM_PROPS = frozenset({P_RETRY_TOPIC, P_ORIGIN_MSG_ID, P_REAL_TOPIC, P_REAL_BROKER, P_REAL_QID,
                          P_DELIVER_MS, P_DLQ_ORIGIN_TOPIC, P_MESSAGE_GROUP, P_BORN_HOST, P_TRACE,
                          P_TRANSACTION})
# Lab extension: a user property choosing the exact queue (``BROKER:QUEUE_ID``) of a send.
P_TARGET_QUEUE = "__QUEUE"

STORE_HOST = f"{socket.gethostname()}"


_ID_PREFIX = "01" + os.urandom(9).hex().upper()  # per process, as RocketMQ's host/pid part
_id_counter = itertools.count(int.from_bytes(os.urandom(3), "big"))


def new_message_id() -> str:
    """A unique id in RocketMQ 5's shape (34 hex chars, version prefix 01): a random
    per-process prefix and a counter, cheap on the send path."""
    return f"{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFF:012X}"


def from_v2(m: "v2.Message") -> "lab.LabMessage":
    """Build the stored form of a message a v2 client sent (queue/offset set by the store).

    On the send fast path: touch each field once, skip the optional ones when unset.
    """
    sp = m.system_properties
    born = sp.born_timestamp
    # Attribute sets are cheaper than constructor keywords on upb messages.
    out = lab.LabMessage()
    out.body = m.body
    out.message_id = sp.message_id or new_message_id()
    tag = sp.tag
    if tag:
        out.tag = tag
    if sp.keys:
        out.keys.extend(sp.keys)
    out.born_ts = born.seconds * 1000 + born.nanos // 1_000_000
    up = m.user_properties
    n = len(up)
    if n and not (n == 1 and P_TARGET_QUEUE in up):
        props = out.properties
        for k, v in up.items():
            if k != P_TARGET_QUEUE:
                props[k] = v
    host = sp.born_host
    if host:
        out.properties[P_BORN_HOST] = host
    if sp.message_group:
        out.properties[P_MESSAGE_GROUP] = sp.message_group
    if sp.trace_context:
        out.properties[P_TRACE] = sp.trace_context
    if sp.HasField("delivery_timestamp"):
        ts = sp.delivery_timestamp
        out.properties[P_DELIVER_MS] = str(ts.seconds * 1000 + ts.nanos // 1_000_000)
    return out


def original_topic(msg: "lab.LabMessage") -> str:
    """The topic a consumer sees: a retry message shows the topic it came from."""
    return msg.properties.get(P_RETRY_TOPIC) or msg.queue.topic


def to_v2(msg: "lab.LabMessage", *, receipt_handle: str = "", invisible_ms: int = 0,
          delivery_attempt: int = 0, topic: str | None = None) -> "v2.Message":
    props = msg.properties
    out = v2.Message(body=msg.body)
    out.topic.name = topic or original_topic(msg)
    for k, v in props.items():
        if k not in SYSTEM_PROPS:
            out.user_properties[k] = v
    sp = out.system_properties
    if msg.tag:
        sp.tag = msg.tag
    sp.keys.extend(msg.keys)
    sp.message_id = msg.message_id
    sp.body_digest.type = v2.CRC32
    sp.body_digest.checksum = format(zlib.crc32(msg.body) & 0xFFFFFFFF, "08X")
    sp.body_encoding = v2.IDENTITY
    group = props.get(P_MESSAGE_GROUP)
    if group:
        sp.message_group = group
        sp.message_type = v2.FIFO
    elif P_DELIVER_MS in props:
        sp.message_type = v2.DELAY
        d = int(props[P_DELIVER_MS])
        sp.delivery_timestamp.seconds, sp.delivery_timestamp.nanos = d // 1000, (d % 1000) * 1_000_000
    else:
        sp.message_type = v2.NORMAL
    sp.born_timestamp.seconds, sp.born_timestamp.nanos = msg.born_ts // 1000, (msg.born_ts % 1000) * 1_000_000
    sp.born_host = props.get(P_BORN_HOST, "")
    sp.store_timestamp.seconds, sp.store_timestamp.nanos = msg.store_ts // 1000, (msg.store_ts % 1000) * 1_000_000
    sp.store_host = STORE_HOST
    sp.queue_id = msg.queue.queue_id
    sp.queue_offset = msg.queue_offset
    if receipt_handle:
        sp.receipt_handle = receipt_handle
        sp.invisible_duration.seconds = invisible_ms // 1000
        sp.invisible_duration.nanos = (invisible_ms % 1000) * 1_000_000
    sp.delivery_attempt = delivery_attempt or msg.reconsume_times + 1
    if P_TRACE in props:
        sp.trace_context = props[P_TRACE]
    return out


def derived(msg: "lab.LabMessage", **props) -> "lab.LabMessage":
    """A copy of ``msg`` to be re-stored elsewhere (retry, DLQ, delay): queue/offset reset."""
    out = lab.LabMessage()
    out.CopyFrom(msg)
    out.ClearField("queue")
    out.queue_offset = 0
    out.store_ts = 0
    for k, v in props.items():
        if v is None:
            out.properties.pop(k, None)
        else:
            out.properties[k] = str(v)
    return out
