"""A message pulled over remoting, kept as MessageDecoder reads it.

Over gRPC a pulled message is the lab's ``LabMessage``, parsed by upb in C. A remoting
pull answer is RocketMQ's own message encoding, read in Python; building a ``LabMessage``
from it field by field (then copying it into a ``PullBatchResponse``) cost more than the
rest of a message's way to the listener (profiled: ~10 of ~30 us a message). So the
remoting connection answers a pull with a ``RemotingPull`` of ``RemotingMessage``: plain
objects with the field names the consumers read on a ``LabMessage`` (``queue_offset``,
``body``, ``properties``, ...), and ``as_lab()`` for the one call that needs the
protobuf (send-back builds a ``SendBackRequest`` of it).
"""
from __future__ import annotations

from ..protocol import lab
from ..remoting import wire


class RemotingMessage:
    """LabMessage's fields, as plain attributes (``queue`` is the pulled queue's QueueRef,
    shared by the messages of one pull: never changed).

    The properties text is split only when asked for (``properties``, ``message_id``,
    ``tag``, ``keys``): a listener that reads the body and offsets does not pay for it
    (it was a fifth of the consumer's loop per message, cProfile 2026-11-28)."""

    __slots__ = ("queue", "queue_offset", "commit_log_offset", "born_ts", "store_ts", "reconsume_times", "body",
                 "_props_raw", "_split")

    def __init__(self, queue, queue_offset, commit_log_offset, born_ts, store_ts, reconsume_times, body,
                 props_raw: bytes):
        self.queue = queue
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.born_ts = born_ts
        self.store_ts = store_ts
        self.reconsume_times = reconsume_times
        self.body = body
        self._props_raw = props_raw
        self._split = None   # (message_id, tag, keys, properties) once asked

    def _fields(self) -> tuple:
        """UNIQ_KEY, TAGS and KEYS become the message's id, tag and keys, as on a LabMessage."""
        if self._split is None:
            props = wire.string_to_properties(self._props_raw.decode())
            keys = props.pop(wire.P_KEYS, "")
            self._split = (props.pop(wire.P_UNIQ_KEY, ""), props.pop(wire.P_TAGS, ""),
                           [k for k in keys.split(" ") if k] if keys else [], props)
        return self._split

    message_id = property(lambda self: self._fields()[0])
    tag = property(lambda self: self._fields()[1])
    keys = property(lambda self: self._fields()[2])
    properties = property(lambda self: self._fields()[3])

    def as_lab(self) -> lab.LabMessage:
        msg = lab.LabMessage(queue=self.queue, queue_offset=self.queue_offset, commit_log_offset=self.commit_log_offset,
                             born_ts=self.born_ts, store_ts=self.store_ts, reconsume_times=self.reconsume_times,
                             body=self.body, message_id=self.message_id, tag=self.tag, keys=self.keys)
        msg.properties.update(self.properties)
        return msg


def pulled_messages(raw: bytes, queue: lab.QueueRef) -> list[RemotingMessage]:
    """A pull answer's body (messages of ``queue``: the topic is not decoded) as RemotingMessages."""
    out = []
    for fixed, body, _topic, props_raw in wire.message_records(raw):
        (_size, _magic, _crc, _queue_id, _flag, queue_offset, commit_log_offset, _sys_flag, born_ts, _born_ip,
         _born_port, store_ts, _store_ip, _store_port, reconsume, _prepared, _body_len) = fixed
        out.append(RemotingMessage(queue, queue_offset, commit_log_offset, born_ts, store_ts, reconsume, body,
                                   props_raw))
    return out


class RemotingPull:
    """PullBatch's answer over remoting: lab.PullBatchResponse's fields, its messages
    RemotingMessages."""

    __slots__ = ("status", "pull_status", "messages", "next_begin_offset", "min_offset", "max_offset")

    def __init__(self, status, pull_status, messages, next_begin_offset, min_offset, max_offset):
        self.status = status
        self.pull_status = pull_status
        self.messages = messages
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
