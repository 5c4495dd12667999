"""MessageQueue: (topic, broker name, queue id), ordered as RocketMQ orders it.

Inside Python a queue is a MessageQueue; the string ``BROKER:QUEUE_ID`` (its ``label``)
exists only at the edges (JSON, Parquet, the page) and is parsed here, in
``parse_label``, and nowhere else.
"""
from dataclasses import dataclass
from functools import lru_cache, total_ordering

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
        return cls(topic, *parse_label(label))


@lru_cache(maxsize=1 << 16)
def shared_queue(topic: str, broker_name: str, queue_id: int) -> MessageQueue:
    """The process's one MessageQueue for a queue, for what every client of a topic holds
    (its route): 128 consumers of a 1,024-queue topic in one process held 131k equal copies,
    over a quarter of the objects each full garbage collection walked (profiled: its
    300-450 ms pauses are most of the tail of bench/rebalance_convergence.py at 128 x 1024)."""
    return MessageQueue(topic, broker_name, queue_id)


def parse_label(label: str) -> tuple[str, int]:
    """``"BROKER:QUEUE_ID"`` -> (broker name, queue id); ValueError if it is not one."""
    broker, _, qid = label.rpartition(":")
    if not broker or not qid.lstrip("-").isdigit():
        raise ValueError(f"not a queue label BROKER:QUEUE_ID: {label!r}")
    return broker, int(qid)


def broker_of(label: str) -> str:
    return parse_label(label)[0]
