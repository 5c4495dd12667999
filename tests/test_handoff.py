"""What a rebalance does to messages, as RocketMQ 5.3 does it, against the real broker.

Each test pins one hand-off rule (README, "The engine"): the duplicates and gaps a
hand-off causes are the ones RocketMQ's rules produce, no more and no fewer. The
periodic rebalance is 10 minutes here, so every move is caused by what the test does.
"""
import time

import pytest

from consumers_app.client import ConsumeFromWhere, ConsumeResult, LitePullConsumerConfig, MessageModel, PopConsumerConfig
from consumers_app.client.connection import Connection, resource
from consumers_app.client.lite_pull_consumer import LitePullConsumer
from consumers_app.client.pop_consumer import PopConsumer
from consumers_app.client.rebalance import RebalanceImpl
from consumers_app.events import EventEmitter
from consumers_app.message_queue import MessageQueue
from consumers_app.protocol import lab, v2, v2_service
from tests.brokers import BrokerProcess
from tests.push_consumers import Log, push
from tests.support import async_wait_until, produce

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOPICS = ["HandOff:4@broker-a", "FromZero:2@broker-a", "Orderly:2@broker-a", "Lite:2@broker-a",
          "PopBack:1@broker-a", "Illegal:1@broker-a", "KillCut:4@broker-a"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """RocketMQ's own client expiry (120 s): whatever leaves sooner left by a closed connection."""
    with BrokerProcess(tmp_path_factory.mktemp("handoff"), topics=TOPICS) as b:
        yield b


def removal_times(emitter, client_id) -> dict[str, float]:
    """queue label -> when ``client_id``'s rebalance finished dropping it (emitter order)."""
    return emitter.removed_at.get(client_id, {})


class TimedEmitter(EventEmitter):
    """Notes the monotonic time each rebalance removed queues, as it happens."""

    def __init__(self):
        super().__init__()
        self.removed_at: dict[str, dict[str, float]] = {}
        self.subscribe(self._note)

    def _note(self, event):
        if event.type == "rebalance" and event.phase == "end":
            for mq in event.removed or ():
                self.removed_at.setdefault(event.client_id, {}).setdefault(mq.label, time.monotonic())


async def member_ids(addr, group) -> list[str]:
    conn = Connection(addr, "probe")
    try:
        return list((await conn.lab.ListGroupMembers(lab.GroupRequest(group=group), timeout=3)).client_ids)
    finally:
        await conn.close()


async def test_a_dropped_queue_is_not_consumed_any_more(broker):
    """1. Once rebalance drops a queue, its cached messages are not handed to the listener:
    the duplicates are only what the new owner re-pulls from the committed offset."""
    addr, log, emitter = broker.address, Log(), TimedEmitter()
    await produce(addr, "HandOff", 400)
    slow = push(addr, "GID_HANDOFF", "HandOff", "a-slow", log.listener("a-slow", 0.02), emitter,
                consume_thread_max=1)
    await slow.start()
    await async_wait_until(lambda: len(log.consumed("a-slow")) >= 10, timeout=20, message="a-slow consuming")
    assert all(pq["cached_count"] > 0 for pq in slow.snapshot()["queues"].values()), "caches filled"
    fast = push(addr, "GID_HANDOFF", "HandOff", "b-fast", log.listener("b-fast"), emitter)
    await fast.start()
    await async_wait_until(lambda: removal_times(emitter, "a-slow"), timeout=20, message="a-slow dropped queues")
    moved = removal_times(emitter, "a-slow")
    await async_wait_until(lambda: len({(q, o) for _, q, o, _ in log.calls}) >= 400, timeout=60,
                           message="all 400 consumed")
    late = [(q, o) for c, q, o, t in log.consumed("a-slow") if q in moved and t > moved[q]]
    # One consume thread: at most the message it was already running when the queue moved.
    assert len(late) <= 1, f"a-slow consumed {late} after giving the queues away"
    dups = log.duplicates()
    assert {q for q, _ in dups} <= set(moved), "duplicates only on queues that moved"
    print(f"hand-off: {len(moved)} queue(s) moved, {len(dups)} message(s) consumed twice "
          f"(re-pulled from the committed offset by b-fast)")
    await slow.shutdown()
    await fast.shutdown()


async def test_a_new_group_with_last_offset_starts_at_zero_when_the_queue_does(broker):
    """2. No committed offset, min offset 0, first message still stored: the broker answers
    0, so CONSUME_FROM_LAST_OFFSET consumes the backlog (as Java does)."""
    addr, log = broker.address, Log()
    sent = await produce(addr, "FromZero", 20)
    consumer = push(addr, "GID_FROM_ZERO", "FromZero", "z1", log.listener("z1"),
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    await consumer.start()
    await async_wait_until(lambda: len(log.consumed()) >= len(sent), timeout=20, message="the backlog consumed")
    per_queue: dict[str, list[int]] = {}
    for _, label, offset, _ in log.consumed():
        per_queue.setdefault(label, []).append(offset)
    assert sum(map(len, per_queue.values())) == len(sent)
    assert all(sorted(offs) == list(range(len(offs))) for offs in per_queue.values()), "each queue from offset 0"
    await consumer.shutdown()


async def test_orderly_unlocks_a_removed_queue_at_once_and_never_consumes_a_locked_one(broker):
    """3. A queue another client holds the lock of is not consumed; a queue rebalance
    removes is unlocked at the broker at once (5.2+), cached messages or not."""
    addr, log, emitter = broker.address, Log(), TimedEmitter()
    group = "GID_ORDERLY_HANDOFF"
    q0, q1 = (MessageQueue("Orderly", "broker-a", i) for i in (0, 1))
    probe = Connection(addr, "probe")
    locks = lambda mqs, client="probe": lab.LockQueuesRequest(  # noqa: E731
        group=group, client_id=client, queues=[lab.QueueRef(topic=m.topic, broker_name=m.broker_name,
                                                            queue_id=m.queue_id) for m in mqs])
    assert len((await probe.lab.LockQueues(locks([q1]), timeout=3)).locked) == 1
    await produce(addr, "Orderly", 100, queue=q0)
    await produce(addr, "Orderly", 100, queue=q1)
    a = push(addr, group, "Orderly", "o-a", log.listener("o-a", 0.005), emitter, orderly=True)
    await a.start()
    await async_wait_until(lambda: len(log.consumed("o-a", q0.label)) == 100, timeout=30, message="q0 consumed")
    assert log.consumed("o-a", q1.label) == [], "q1 is locked by another client"
    await probe.lab.UnlockQueues(locks([q1]), timeout=3)
    await async_wait_until(lambda: log.consumed("o-a", q1.label), timeout=30, message="q1 consumed once unlocked")

    # A member that never consumes joins: o-a's rebalance gives it q1 (AVG, sorted ids).
    ghost = Connection(addr, "o-z-ghost")
    await ghost.v2.Heartbeat(v2_service.HeartbeatRequest(group=resource(group),
                                                         client_type=v2.ClientType.PUSH_CONSUMER),
                             metadata=ghost.metadata, timeout=3)
    await produce(addr, "Orderly", 200, queue=q1)   # o-a has some cached when it lets go
    await async_wait_until(lambda: q1.label in removal_times(emitter, "o-a"), timeout=30, message="q1 removed")
    # Unlocked at once: another client can take the lock now, not 20 s later.
    got = (await probe.lab.LockQueues(locks([q1], "o-probe"), timeout=3)).locked
    assert [(r.topic, r.queue_id) for r in got] == [("Orderly", 1)]
    await a.shutdown()
    await ghost.close()
    await probe.close()


async def test_lite_pull_does_not_commit_what_it_polled_when_a_queue_moves_or_it_stops(broker):
    """4. Removal and shutdown persist only committed offsets: polled-but-uncommitted
    messages are consumed again by the next owner (Java's duplicates, exactly)."""
    addr, log = broker.address, Log()
    sent = set()
    for qid in (0, 1):
        sent |= await produce(addr, "Lite", 50, queue=MessageQueue("Lite", "broker-a", qid))

    def lite(cid):
        config = LitePullConsumerConfig(endpoints=addr, client_id=cid, auto_commit=True,
                                        auto_commit_interval_ms=600_000, rebalance_wait_interval_ms=600_000,
                                        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        return LitePullConsumer("GID_LITE_HANDOFF", "Lite", log.listener(cid), config, auto_consume=True)

    first = lite("l-a")
    await first.start()
    await async_wait_until(lambda: len(log.consumed("l-a")) == len(sent), timeout=30, message="l-a polled all")
    second = lite("l-b")
    await second.start()   # takes one queue; l-a never committed it
    await async_wait_until(lambda: second.assignments, timeout=20, message="l-b got a queue")
    moved = second.assignments[0].label
    await async_wait_until(lambda: len(log.consumed("l-b", moved)) == 50, timeout=30,
                           message="l-b re-consumes the moved queue from the start")
    await first.shutdown()  # does not commit its polls of the queue it kept either
    kept = next(q for q in ("broker-a:0", "broker-a:1") if q != moved)
    await async_wait_until(lambda: len(log.consumed("l-b", kept)) == 50, timeout=30,
                           message="l-b re-consumes the other queue after l-a stopped")
    assert len(log.duplicates()) == 100
    await second.shutdown()


async def test_a_failed_pop_message_backs_off_and_comes_back_through_the_pop_retry_topic(broker):
    """7. A failed pop message gets ChangeInvisibleDuration(popDelayLevel[reconsume times])
    instead of the full invisible time, and is revived into %RETRY%{group}_{topic}."""
    addr, log = broker.address, Log()
    await produce(addr, "PopBack", 1)
    config = PopConsumerConfig(endpoints=addr, client_id="p1", invisible_time_ms=60_000, pop_delay_level_s=(1,),
                               long_polling_timeout_ms=1_000)
    first_attempt_fails = lambda m: (ConsumeResult.RECONSUME_LATER if m.delivery_attempt == 1  # noqa: E731
                                     else ConsumeResult.SUCCESS)
    consumer = PopConsumer("GID_POP_BACKOFF", "PopBack", log.listener("p1", result=first_attempt_fails), config)
    await consumer.start()
    # Redelivered after the 1 s back-off: the 60 s invisible time would outlast this wait.
    await async_wait_until(lambda: len(log.consumed()) == 2, timeout=30, message="the retry after the back-off")
    assert consumer.pop_counts["invisible_changed"] == 1
    conn = Connection(addr, "probe")
    topics = {t.name for t in (await conn.lab.ListTopics(lab.ListTopicsRequest(), timeout=3)).topics}
    await conn.close()
    assert "%RETRY%GID_POP_BACKOFF_PopBack" in topics
    await consumer.shutdown()


async def test_empty_queue_or_member_lists_keep_the_assignment():
    """8. RebalanceImpl.rebalanceByTopic keeps what it has: an empty queue list makes the
    strategy throw (unbalanced, retried at minInterval); no member list (a 5.3 broker's
    SYSTEM_ERROR for a memberless group, findConsumerIdList -> null) is balanced: the
    next try is the periodic one, not one a second."""
    mine = MessageQueue("T", "broker-a", 0)

    class Consumer:
        group, client_id, orderly, topic = "G", "c1", False, "T"
        message_model = MessageModel.CLUSTERING
        subscriptions = {"T": "*"}
        topic_queues = {"T": []}
        members = ["c1"]

        async def list_members(self):
            return list(self.members)

        def emit(self, *a, **k):
            pass

        def emit_assignment(self, reason):
            pass

    consumer = Consumer()
    impl = RebalanceImpl(consumer)
    impl.process_queue_table[mine] = object.__new__(type("PQ", (), {"dropped": False}))
    assert await impl.do_rebalance() is False
    assert impl.assignments == [mine]
    consumer.topic_queues, consumer.members = {"T": [mine]}, []
    assert await impl.do_rebalance() is True
    assert impl.assignments == [mine]


async def test_offset_illegal_is_corrected_at_once(broker):
    """8. A committed offset beyond the queue is corrected to the broker's answer: as 5.3's
    DefaultMQPushConsumerImpl pull callback, the ProcessQueue is dropped, the correction
    persisted, and an immediate rebalance creates the queue anew from there."""
    addr, log = broker.address, Log()
    await produce(addr, "Illegal", 5)
    conn = Connection(addr, "probe")
    mq = v2.MessageQueue(topic=resource("Illegal"), id=0, broker=v2.Broker(name="broker-a"))
    await conn.v2.UpdateOffset(v2_service.UpdateOffsetRequest(group=resource("GID_ILLEGAL"), message_queue=mq,
                                                               offset=1_000), metadata=conn.metadata, timeout=3)
    consumer = push(addr, "GID_ILLEGAL", "Illegal", "i1", log.listener("i1"))
    await consumer.start()
    # Corrected before anything new arrives (else the correction rightly skips to the new end).
    await async_wait_until(lambda: consumer.snapshot()["queues"].get("broker-a:0", {}).get("pull_offset") == 5,
                           timeout=20, message="the pull offset corrected to the queue's end (5)")
    await produce(addr, "Illegal", 5)
    await async_wait_until(lambda: sorted(o for _, _, o, _ in log.consumed()) == [5, 6, 7, 8, 9], timeout=20,
                           message="consumed from the corrected offset (5) on")
    await consumer.shutdown()
    offset = await conn.v2.GetOffset(v2_service.GetOffsetRequest(group=resource("GID_ILLEGAL"), message_queue=mq),
                                     metadata=conn.metadata, timeout=3)
    assert offset.offset == 10
    await conn.close()


async def test_kill_leaves_at_once_while_a_cut_client_stays_a_member(broker):
    """5. Kill closes the connection: the broker drops the client at once (its expiry here
    is RocketMQ's 120 s) and the survivors own every queue. A cut closes nothing."""
    addr, log = broker.address, Log()
    consumers = [push(addr, "GID_KILL_CUT", "KillCut", f"k{i}", log.listener(f"k{i}")) for i in range(3)]
    for c in consumers:
        await c.start()
    cut, killed, survivor = consumers
    await async_wait_until(lambda: sorted(q for c in consumers for q in c.snapshot()["assignments"])
                           == [f"broker-a:{i}" for i in range(4)], timeout=20, message="4 queues shared by 3")
    cut.cut()
    await killed.abort()
    seen: list[list[str]] = []

    async def killed_gone():
        seen.append(await member_ids(addr, "GID_KILL_CUT"))
        return "k1" not in seen[-1]

    await async_wait_until(killed_gone, timeout=20, message="k1 dropped on its closed connection")
    # Asked after the kill's close was handled, yet the cut client is still listed: it
    # closed nothing, so only the 120 s expiry will drop it.
    assert seen[-1] == ["k0", "k2"]
    await cut.abort()
    await async_wait_until(lambda: survivor.snapshot()["assignments"] == [f"broker-a:{i}" for i in range(4)],
                           timeout=20, message="the survivor owns every queue")
    await survivor.shutdown()
