"""The lab's events: one class per type, one serializer, one parser.

Every client, the controller, the websockets, the event log (Parquet) and the tests use
these classes. Inside Python a queue in an event is a ``MessageQueue``; it becomes a
string only when the event is written out (``to_dict``): ``BROKER:QID`` for a queue of
the event's own topic, ``TOPIC/BROKER:QID`` for another topic's (a push consumer's
``%RETRY%`` queues). ``from_dict`` reads that form back (DESIGN.md, Events).

Clients call ``emitter.emit(type, group, client_id, **fields)``; the fields must be ones
the type declares, so a misspelt field fails where it is written, not on the page.
"""
import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from consumers_app.message_queue import MessageQueue, parse_label


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- the edge form of queues ---------------------------------------------------------

def queue_text(mq: MessageQueue, topic: str | None) -> str:
    return mq.label if mq.topic == topic or not mq.topic else f"{mq.topic}/{mq.label}"


def queue_from_text(text: str, topic: str | None) -> MessageQueue:
    other_topic, slash, label = text.rpartition("/")
    return MessageQueue(other_topic if slash else (topic or ""), *parse_label(label))


def _out(value: Any, topic: str | None) -> Any:
    if isinstance(value, MessageQueue):
        return queue_text(value, topic)
    if isinstance(value, (list, tuple)):
        return [_out(v, topic) for v in value]
    if isinstance(value, dict):
        return {(queue_text(k, topic) if isinstance(k, MessageQueue) else k): _out(v, topic)
                for k, v in value.items()}
    return value


# -- the types ---------------------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class Event:
    """Fields every event has. ``mode`` is the emitting consumer's (push, lite_pull, pop)."""
    type: ClassVar[str] = ""
    queue_fields: ClassVar[tuple[str, ...]] = ()      # MessageQueue or list of them
    queue_key_fields: ClassVar[tuple[str, ...]] = ()  # dicts keyed by MessageQueue
    ts: int = 0
    group: str = ""
    client_id: str = ""
    mode: str | None = None

    def __post_init__(self):
        if not self.ts:
            self.ts = now_ms()

    def to_dict(self) -> dict:
        """The JSON form: ``ts``, ``type``, ``group``, ``client_id``, then the fields that are set."""
        topic = getattr(self, "topic", None)
        out = {"ts": self.ts, "type": self.type, "group": self.group, "client_id": self.client_id}
        for f in dataclasses.fields(self):
            if f.name in out:
                continue
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = _out(value, topic)
        return out

    def fields(self) -> dict:
        """The type-specific part of ``to_dict()`` (the event log's ``fields`` column)."""
        return {k: v for k, v in self.to_dict().items() if k not in ("ts", "type", "group", "client_id")}


@dataclass(kw_only=True, slots=True)
class AssignmentEvent(Event):
    """A consumer's queues after a rebalance (or, for pop, the brokers it pops from)."""
    type: ClassVar[str] = "assignment"
    queue_fields: ClassVar[tuple[str, ...]] = ("queues", "retry_queues")
    topic: str = ""
    queues: list[MessageQueue] = dataclasses.field(default_factory=list)
    retry_queues: list[MessageQueue] | None = None
    strategy: str = ""
    reason: str = ""


@dataclass(kw_only=True, slots=True)
class RebalanceEvent(Event):
    type: ClassVar[str] = "rebalance"
    queue_fields: ClassVar[tuple[str, ...]] = ("added", "removed")
    topic: str = ""                    # the subscribed topic (queues of others carry theirs)
    phase: str = ""                    # start | end
    reason: str = ""
    strategy: str = ""
    duration_ms: float | None = None   # end only
    added: list[MessageQueue] | None = None
    removed: list[MessageQueue] | None = None
    balanced: bool | None = None


@dataclass(kw_only=True, slots=True)
class PqEvent(Event):
    """One ProcessQueue's figures, sent when they change."""
    type: ClassVar[str] = "pq"
    queue_fields: ClassVar[tuple[str, ...]] = ("queue",)
    topic: str = ""
    queue: MessageQueue | None = None
    cached_count: int = 0
    cached_bytes: int = 0
    span: int = 0
    inflight: int = 0
    committed_offset: int = -1
    pull_offset: int = -1


@dataclass(kw_only=True, slots=True)
class FlowControlEvent(Event):
    type: ClassVar[str] = "flow_control"
    queue_fields: ClassVar[tuple[str, ...]] = ("queue",)
    topic: str = ""
    queue: MessageQueue | None = None
    reason: str = ""            # count | size | span | all
    threshold: float = 0
    value: float = 0
    times: int = 0              # how often this reason held back this consumer so far


@dataclass(kw_only=True, slots=True)
class ConsumeEvent(Event):
    """Messages the listener finished in the last interval; ``ranges``: the queue offsets
    it was given, per queue, as ``[start, end)`` pairs (push and lite pull; pop shares
    queues and has none)."""
    type: ClassVar[str] = "consume"
    queue_key_fields: ClassVar[tuple[str, ...]] = ("ranges",)
    topic: str | None = None          # the subscribed topic: its queues are written BROKER:QID
    interval_ms: int = 0
    ok: int = 0
    retry: int = 0
    fail: int = 0
    ranges: dict[MessageQueue, list[list[int]]] | None = None


@dataclass(kw_only=True, slots=True)
class MembershipEvent(Event):
    """A group's member list changed; ``source="broker"`` when the lab heard it itself."""
    type: ClassVar[str] = "membership"
    members: list[str] | None = None
    joined: list[str] | None = None
    left: list[str] | None = None
    reason: str = ""
    source: str | None = None


@dataclass(kw_only=True, slots=True)
class OffsetEvent(Event):
    """Committed offsets that moved since the consumer's last offset event."""
    type: ClassVar[str] = "offset"
    queue_key_fields: ClassVar[tuple[str, ...]] = ("offsets",)
    topic: str = ""
    offsets: dict[MessageQueue, int] = dataclasses.field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class PopEvent(Event):
    type: ClassVar[str] = "pop"
    queue_fields: ClassVar[tuple[str, ...]] = ("queue",)
    action: str = ""            # received | acked | nacked | ack_failed | invisible_changed
    topic: str | None = None
    queue: MessageQueue | None = None
    count: int = 0
    redelivered: int | None = None
    invisible_ms: int | None = None


@dataclass(kw_only=True, slots=True)
class FaultEvent(Event):
    """Something done to a consumer, a worker or a producer (``fault`` names it)."""
    type: ClassVar[str] = "fault"
    fault: str = ""
    ms: float | None = None          # slow
    ratio: float | None = None       # fail
    strategy: str | None = None      # strategy
    ignored: bool | None = None      # strategy, by a pop consumer
    worker: str | None = None        # worker_lost / worker_replaced
    clients: list[str] | None = None
    topic: str | None = None         # producer_rate / producer_burst / worker_lost
    rate: float | None = None
    count: int | None = None


@dataclass(kw_only=True, slots=True)
class BrokerEvent(Event):
    """A broker went online/offline, a topic's queues changed, or the broker process did."""
    type: ClassVar[str] = "broker"
    queue_fields: ClassVar[tuple[str, ...]] = ("queues",)
    change: str = ""                 # online | offline | queues | process
    broker: str | None = None
    online: bool | None = None
    topic: str | None = None
    delta: int | None = None
    queues: list[MessageQueue] | None = None
    process: str | None = None       # up | down
    restarts: int | None = None
    reason: str | None = None


@dataclass(kw_only=True, slots=True)
class RouteEvent(Event):
    """A consumer's route refresh saw its topic's queues change."""
    type: ClassVar[str] = "route"
    queue_fields: ClassVar[tuple[str, ...]] = ("queues",)
    topic: str = ""
    queues: list[MessageQueue] = dataclasses.field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class OffsetMovedEvent(Event):
    """A pull offset the broker refused (OFFSET_ILLEGAL / PULL_OFFSET_MOVED) and the offset
    it gave instead: ``skipped`` messages were never consumed (retention deleted them
    first), 0 when the correction went backwards."""
    type: ClassVar[str] = "offset_moved"
    queue_fields: ClassVar[tuple[str, ...]] = ("queue",)
    topic: str = ""
    queue: MessageQueue | None = None
    from_offset: int = 0
    to_offset: int = 0
    skipped: int = 0


@dataclass(kw_only=True, slots=True)
class HandoffEvent(Event):
    """One hand-off's figures as they stand (consumers_app/lab/handoff.py), ``client_id``
    its new owner. For the event log only (the lag history's markers and comparisons): the
    controller records one whenever a hand-off's figures change; the page asks the API."""
    type: ClassVar[str] = "handoff"
    queue_fields: ClassVar[tuple[str, ...]] = ("queue",)
    topic: str = ""
    queue: MessageQueue | None = None
    from_clients: list[str] = dataclasses.field(default_factory=list)
    rebalance: int = 0
    added_ts: int = 0
    released_ts: int | None = None
    gap_ms: int = 0
    overlap_ms: int = 0
    duplicates: int = 0               # -1: to or from a peer, which reports no consumed offsets
    lag_spike: int | None = None


EVENT_CLASSES: dict[str, type[Event]] = {cls.type: cls for cls in (
    AssignmentEvent, RebalanceEvent, PqEvent, FlowControlEvent, ConsumeEvent, MembershipEvent,
    OffsetEvent, PopEvent, FaultEvent, BrokerEvent, RouteEvent, OffsetMovedEvent, HandoffEvent)}
EVENT_TYPES = frozenset(EVENT_CLASSES)


def make_event(type: str, group: str = "", client_id: str = "", **fields) -> Event:
    cls = EVENT_CLASSES.get(type)
    if cls is None:
        raise ValueError(f"unknown event type {type!r}; expected one of {sorted(EVENT_TYPES)}")
    return cls(group=group, client_id=client_id, **fields)


def event_from_dict(data: dict) -> Event:
    """The inverse of ``Event.to_dict``; ValueError on an unknown type or field."""
    data = dict(data)
    cls = EVENT_CLASSES.get(data.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown event type in {data!r}")
    topic = data.get("topic")
    for name in cls.queue_fields:
        value = data.get(name)
        if isinstance(value, str):
            data[name] = queue_from_text(value, topic)
        elif value is not None:
            data[name] = [queue_from_text(v, topic) for v in value]
    for name in cls.queue_key_fields:
        if data.get(name) is not None:
            data[name] = {queue_from_text(k, topic): v for k, v in data[name].items()}
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"bad {cls.type} event {data!r}: {exc}") from None


Listener = Callable[[Event], None]


class EventEmitter:
    """Fans events out to listeners and keeps the last few for inspection.

    Listeners run on the emitting thread and must be quick (hand off to a queue);
    a listener that raises is swallowed so one bad subscriber cannot stop a consumer.
    """

    def __init__(self, keep: int = 10_000):
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._recent: deque[Event] = deque(maxlen=keep)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners = [*self._listeners, listener]

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = [x for x in self._listeners if x is not listener]

        return unsubscribe

    def emit(self, type: str, group: str, client_id: str, **fields) -> Event:
        event = make_event(type, group, client_id, **fields)
        self._recent.append(event)
        for listener in self._listeners:  # copy-on-write list: safe to iterate unlocked
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a broken listener must not stop a consumer
                pass
        return event

    def recent(self, type: str | None = None, **match) -> list[Event]:
        """The kept events, oldest first, of ``type`` and with the given field values."""
        events = list(self._recent)
        if type is not None:
            events = [e for e in events if e.type == type]
        for key, value in match.items():
            events = [e for e in events if getattr(e, key, None) == value]
        return events

    def clear(self) -> None:
        self._recent.clear()


# The process-wide emitter: every client in a worker process emits here by default.
emitter = EventEmitter()
