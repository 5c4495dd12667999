"""Topic metadata: which logical brokers host a topic and with how many queues.

One broker process hosts several *logical* brokers (``broker-a``, ``ROOM@broker-b``...),
as RocketMQ clusters host a topic on several brokers. Persisted as ``topics.json``
(written atomically) so topics created at run time survive a restart.

Each (topic, broker) entry remembers ``since``, the commit-log position when it was
created: records older than that belong to an earlier, deleted incarnation of the
topic and are ignored when the consume queues are rebuilt.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import write_json
from ..javastr import java_key

# RocketMQ's TopicValidator: ^[%|a-zA-Z0-9_-]+$, at most 127 characters.
TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LEN = 127
# Group names follow the same character rule (up to 255 characters).
GROUP_MAX_LEN = 255

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def topic_error(name: str) -> str | None:
    """Why ``name`` is not a legal topic name, or None."""
    if not name or not name.strip():
        return "the topic name is blank"
    if len(name) > TOPIC_MAX_LEN:
        return f"the topic name is longer than {TOPIC_MAX_LEN} characters"
    if not TOPIC_RE.match(name):
        return f"the topic name {name!r} contains illegal characters (allowed: %|a-zA-Z0-9_-)"
    return None


def group_error(name: str) -> str | None:
    if not name or not name.strip():
        return "the consumer group name is blank"
    if len(name) > GROUP_MAX_LEN:
        return f"the consumer group name is longer than {GROUP_MAX_LEN} characters"
    if not TOPIC_RE.match(name):
        return f"the consumer group name {name!r} contains illegal characters (allowed: %|a-zA-Z0-9_-)"
    return None


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def pop_retry_topic(group: str, topic: str) -> str:
    """Where POP revives a message: %RETRY%{group}_{topic} (5.x KeyBuilder.buildPopRetryTopic,
    retry topic V1), one per subscribed topic, unlike push's %RETRY%{group}."""
    return f"{RETRY_PREFIX}{group}_{topic}"


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def queue_sort_key(topic: str, broker: str, qid: int):
    return (java_key(topic), java_key(broker), qid)


@dataclass
class TopicConfig:
    name: str
    # broker name -> queue count
    queues: dict[str, int] = field(default_factory=dict)
    # broker name -> commit-log position at creation
    since: dict[str, int] = field(default_factory=dict)


class TopicManager:
    def __init__(self, data_dir: Path, default_broker: str = "broker-a"):
        self.path = Path(data_dir) / "topics.json"
        self.default_broker = default_broker
        self.topics: dict[str, TopicConfig] = {}
        self.brokers: dict[str, bool] = {default_broker: True}  # name -> online
        # Group config (RocketMQ's SubscriptionGroupConfig): fifo flag, retry max times.
        self.groups: dict[str, dict] = {}
        self._sorted: dict[tuple[str, bool], list] = {}  # queues_of cache (sends call it per message)

    def load(self):
        if not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        for t in data.get("topics", []):
            self.topics[t["name"]] = TopicConfig(t["name"], dict(t["queues"]), dict(t.get("since", {})))
        for b in data.get("brokers", []):
            self.brokers.setdefault(b, True)
        self.groups.update(data.get("groups", {}))
        for t in self.topics.values():
            for b in t.queues:
                self.brokers.setdefault(b, True)

    def save(self):
        data = {
            "topics": [{"name": t.name, "queues": t.queues, "since": t.since} for t in self.topics.values()],
            "brokers": sorted(self.brokers),
            "groups": self.groups,
        }
        write_json(self.path, data)

    # ----------------------------------------------------------------- changes

    def changed(self):
        self._sorted.clear()

    def set_online(self, broker: str, online: bool):
        self.brokers[broker] = online
        self.changed()

    def create(self, name: str, queue_count: int, broker: str | None, position: int) -> TopicConfig:
        self.changed()
        broker = broker or self.default_broker
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = TopicConfig(name)
        if broker not in t.queues:
            t.since[broker] = position
        t.queues[broker] = queue_count
        self.brokers.setdefault(broker, True)
        return t

    def ensure_system_topic(self, name: str, broker: str, position: int) -> TopicConfig:
        """Retry and DLQ topics: one queue per logical broker, created on first use."""
        t = self.topics.get(name)
        if t is None or broker not in t.queues:
            t = self.create(name, 1, broker, position)
            self.save()
        return t

    def delete(self, name: str) -> bool:
        self.changed()
        return self.topics.pop(name, None) is not None

    # ------------------------------------------------------------------ lookup

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def online(self, broker: str) -> bool:
        return self.brokers.get(broker, False)

    def queues_of(self, name: str, online_only: bool = True) -> list[tuple[str, str, int]]:
        """(topic, broker, queue id) of every queue, sorted as RocketMQ sorts MessageQueue."""
        cached = self._sorted.get((name, online_only))
        if cached is not None:
            return cached
        t = self.topics.get(name)
        if t is None:
            return []
        out = [(name, b, q) for b, n in t.queues.items() if not online_only or self.online(b)
               for q in range(n)]
        out.sort(key=lambda k: queue_sort_key(*k))
        self._sorted[(name, online_only)] = out
        return out

    def has_queue(self, name: str, broker: str, qid: int) -> bool:
        t = self.topics.get(name)
        return t is not None and 0 <= qid < t.queues.get(broker, 0)

    def accept_record(self, topic: str, broker: str, phys: int) -> bool:
        """Whether a commit-log record belongs to the live incarnation of its topic."""
        t = self.topics.get(topic)
        return t is not None and broker in t.queues and phys >= t.since.get(broker, 0)

    def group_config(self, group: str) -> dict:
        return self.groups.get(group, {})
