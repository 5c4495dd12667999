"""One event schema for every client, the websockets, the event log and the tests.

An event is a plain JSON-able dict: ``ts`` (ms since epoch), ``type``, ``group``,
``client_id`` and fields of its type (DESIGN.md, Events). Clients call
``emitter.emit(...)``; the lab's worker forwards what it hears to the controller,
tests read ``emitter.recent()``.
"""
import threading
import time
from collections import deque
from typing import Callable

EVENT_TYPES = frozenset({
    "assignment",    # consumer -> list of queues, strategy, reason
    "rebalance",     # phase start/end, duration_ms, changed queues
    "pq",            # per queue: cached_count, cached_bytes, span, inflight, committed/pull offset
    "flow_control",  # reason count|size|span|all, threshold, value
    "consume",       # ok/retry/fail counts per interval
    "membership",    # joined/left/expired
    "offset",        # commit
    "pop",           # received/acked/revived/dlq
    "fault",         # what was injected
    "broker",        # online/offline, queues changed
    "route",         # a consumer's route refresh saw the topic's queues change
})

Event = dict
Listener = Callable[[Event], None]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def make_event(type: str, group: str, client_id: str, **fields) -> Event:
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}; expected one of {sorted(EVENT_TYPES)}")
    event = {"ts": fields.pop("ts", None) or now_ms(), "type": type, "group": group, "client_id": client_id}
    event.update(fields)
    return event


class EventEmitter:
    """Fans events out to listeners and keeps the last few for inspection.

    Listeners run on the emitting thread and must be quick (hand off to a queue);
    a listener that raises is dropped from nothing and breaks nothing: the error is
    swallowed so one bad subscriber cannot stop a consumer.
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
        events = list(self._recent)
        if type is not None:
            events = [e for e in events if e["type"] == type]
        for key, value in match.items():
            events = [e for e in events if e.get(key) == value]
        return events

    def clear(self) -> None:
        self._recent.clear()


# The process-wide emitter: every client in a worker process emits here by default.
emitter = EventEmitter()
