"""MessageQueue: (topic, broker name, queue id), ordered as RocketMQ orders it."""
from dataclasses import dataclass
from functools import total_ordering

from .javastr import java_key


@total_ordering
@dataclass(frozen=True, slots=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def _key(self):
        # MessageQueue.compareTo: topic, then brokerName, then queueId.
        return (java_key(self.topic), java_key(self.broker_name), self.queue_id)

    def __lt__(self, other: "MessageQueue") -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"

    @property
    def label(self) -> str:
        """The dashboard's short form: ``BROKER:QUEUE_ID``."""
        return f"{self.broker_name}:{self.queue_id}"

    @classmethod
    def from_label(cls, topic: str, label: str) -> "MessageQueue":
        broker, _, qid = label.rpartition(":")
        if not broker or not qid.lstrip("-").isdigit():
            raise ValueError(f"not a queue label BROKER:QUEUE_ID: {label!r}")
        return cls(topic, broker, int(qid))
