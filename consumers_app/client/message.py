"""MessageExt: what a listener receives.

A thin view over the wire message (the lab's ``LabMessage`` for gRPC pulls, a
``RemotingMessage`` with the same fields for remoting pulls, v2 ``Message`` for pops). Fields are read lazily from the protobuf: at 50k+ msgs/s copying every field
of every message into a Python object would cost more than the listener itself.
"""
from __future__ import annotations

from ..message_queue import MessageQueue

#: Property the broker sets on a message re-delivered through %RETRY%{group}: the
#: original topic (MessageConst.PROPERTY_RETRY_TOPIC).
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"

#: User property our producer aims a message at a queue with ("BROKER:QUEUE_ID"): the
#: lab's broker routes a v2 SendMessage by it; over remoting it becomes the queue id.
TARGET_QUEUE_PROPERTY = "__QUEUE"


class MessageExt:
    """A pulled message (RocketMQ's MessageExt). ``queue`` is the queue it came from."""

    __slots__ = ("pb", "queue")

    def __init__(self, pb, queue: MessageQueue):
        self.pb = pb
        self.queue = queue

    @property
    def topic(self) -> str:
        # resetRetryAndNamespace: a message of %RETRY%group shows its original topic.
        return self.pb.properties.get(PROPERTY_RETRY_TOPIC) or self.queue.topic

    @property
    def queue_offset(self) -> int:
        return self.pb.queue_offset

    @property
    def message_id(self) -> str:
        return self.pb.message_id

    @property
    def tag(self) -> str:
        return self.pb.tag

    @property
    def keys(self) -> list[str]:
        return list(self.pb.keys)

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.pb.properties)

    @property
    def body(self) -> bytes:
        return self.pb.body

    @property
    def born_ts(self) -> int:
        return self.pb.born_ts

    @property
    def store_ts(self) -> int:
        return self.pb.store_ts

    @property
    def reconsume_times(self) -> int:
        return self.pb.reconsume_times

    def lab_message(self):
        """The message as a LabMessage (what a SendBackRequest carries)."""
        as_lab = getattr(self.pb, "as_lab", None)
        return self.pb if as_lab is None else as_lab()

    def __repr__(self) -> str:
        return f"MessageExt({self.queue.label}@{self.queue_offset}, id={self.message_id})"


class PopMessage:
    """A message received by POP: carries the receipt handle needed to ack it."""

    __slots__ = ("pb", "queue", "receipt_handle")

    def __init__(self, pb, queue: MessageQueue):
        self.pb = pb
        self.queue = queue
        self.receipt_handle = pb.system_properties.receipt_handle

    topic = property(lambda self: self.pb.topic.name)
    queue_offset = property(lambda self: self.pb.system_properties.queue_offset)
    message_id = property(lambda self: self.pb.system_properties.message_id)
    tag = property(lambda self: self.pb.system_properties.tag)
    body = property(lambda self: self.pb.body)
    delivery_attempt = property(lambda self: self.pb.system_properties.delivery_attempt)
    properties = property(lambda self: dict(self.pb.user_properties))

    @property
    def keys(self) -> list[str]:
        return list(self.pb.system_properties.keys)

    def __repr__(self) -> str:
        return f"PopMessage({self.queue.label}@{self.queue_offset}, attempt={self.delivery_attempt})"
