"""Our push consumers as the broker-lane tests drive them, and logs of what their
listeners saw (tests/test_handoff.py, test_client_push.py, test_client_orderly_broadcast.py,
test_remoting.py, test_broker_retention.py)."""
import threading
import time
from collections import Counter

from consumers_app.allocate import get_strategy
from consumers_app.client import ConsumeFromWhere, ConsumeResult, MessageModel, PushConsumer, PushConsumerConfig
from consumers_app.client.rebalance import allocate
from consumers_app.message_queue import MessageQueue

TOPIC = "TopicTest"
LABELS = [f"broker-a:{i}" for i in range(8)]


def push(addr, group, topic, cid, listener, emitter=None, orderly=False, **overrides):
    """A push consumer from the first offset, heartbeating every second, whose periodic
    rebalance (10 min) never comes: every move is caused by what the test does."""
    settings = dict(endpoints=addr, client_id=cid, heartbeat_interval_ms=1000, rebalance_wait_interval_ms=600_000,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    settings.update(overrides)
    return PushConsumer(group, topic, listener, PushConsumerConfig(**settings), emitter=emitter, orderly=orderly)


class Log:
    """Every listener call: (client, queue label, queue offset, monotonic time)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, int, float]] = []

    def listener(self, client_id, per_message_s=0.0, result=lambda m: ConsumeResult.SUCCESS):
        def listen(msgs):
            if per_message_s:
                time.sleep(per_message_s)  # noqa: sleep-ok - the listener's own work
            with self.lock:
                for m in msgs:
                    self.calls.append((client_id, m.queue.label, m.queue_offset, time.monotonic()))
            return result(msgs[0])
        return listen

    def consumed(self, client_id=None, label=None):
        return [(c, q, o, t) for c, q, o, t in list(self.calls)
                if (client_id is None or c == client_id) and (label is None or q == label)]

    def duplicates(self):
        by_message: dict[tuple[str, int], set[str]] = {}
        for c, q, o, _ in list(self.calls):
            by_message.setdefault((q, o), set()).add(c)
        return {key: who for key, who in by_message.items() if len(who) > 1}


class Recorder:
    """Thread-safe log of what listeners saw."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ids = Counter()
        self.by_consumer = Counter()
        self.sequence = []  # (label, offset, client) in consumption order

    def listener(self, client_id):
        def listen(msgs):
            with self.lock:
                for m in msgs:
                    self.ids[m.message_id] += 1
                    self.by_consumer[client_id] += 1
                    self.sequence.append((m.queue.label, m.queue_offset, client_id))
            return ConsumeResult.SUCCESS
        return listen


def recorded_push(addr, group, cid, recorder, emitter=None, **overrides):
    """A push consumer on TOPIC (300 ms heartbeats) whose listener logs into ``recorder``."""
    settings = dict(endpoints=addr, client_id=cid, heartbeat_interval_ms=300, rebalance_wait_interval_ms=600_000,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    settings.update(overrides)
    return PushConsumer(group, TOPIC, recorder.listener(cid), PushConsumerConfig(**settings), emitter=emitter)


def owners(consumers):
    return Counter(label for c in consumers for label in c.snapshot()["assignments"])


def owned_exactly_once(consumers):
    """Every queue owned by exactly one consumer, and each holds what the strategy says
    for the current members (not just a transient state that happens to cover all)."""
    counts = owners(consumers)
    if sorted(counts) != LABELS or set(counts.values()) != {1}:
        return False
    mqs = [MessageQueue(TOPIC, "broker-a", i) for i in range(8)]
    cids = [c.client_id for c in consumers]
    for c in consumers:
        strategy = get_strategy(c.snapshot()["strategy"])
        if c.message_model is MessageModel.CLUSTERING and \
                [m.label for m in allocate(strategy, c.group, c.client_id, mqs, cids)] != c.snapshot()["assignments"]:
            return False
    return True
