"""Our push consumer against the real broker: delivery, rebalance on membership notices,
expiry of a killed consumer (orderly and broadcasting: test_client_orderly_broadcast.py).

The periodic rebalance is set to 10 minutes here, so every re-assignment these tests
see was triggered by a membership notice (a graceful leave or the broker's expiry).
"""
import pytest

from consumers_app.events import EventEmitter, event_from_dict
from tests.brokers import BrokerProcess
from tests.push_consumers import LABELS, TOPIC, Recorder, owned_exactly_once, recorded_push
from tests.support import async_wait_until, produce


@pytest.fixture(scope="module")
def fast_broker(tmp_path_factory):
    """Silent clients expire after 2 s (scan every 200 ms) instead of 120 s."""
    with BrokerProcess(tmp_path_factory.mktemp("broker"), topics=[f"{TOPIC}:8@broker-a"],
                       extra_args=["--client-expiry-ms", "2000", "--client-scan-ms", "200"]) as b:
        yield b


async def test_three_consumers_lose_nothing_and_graceful_leave_reowns_at_once(fast_broker):
    addr = fast_broker.address
    rec = Recorder()
    emitter = EventEmitter()
    consumers = [recorded_push(addr, "GID_PUSH_3", f"c{i}", rec, emitter) for i in range(3)]
    for c in consumers:
        await c.start()
    await async_wait_until(lambda: owned_exactly_once(consumers), timeout=20, message="8 queues shared by 3")
    assert sorted(len(c.snapshot()["assignments"]) for c in consumers) == [2, 3, 3]  # AVG

    sent = await produce(addr, TOPIC, 10_000)
    await async_wait_until(lambda: len(rec.ids) >= 5_000, timeout=30, message="half consumed")

    # Graceful leave mid-stream: the others re-own its queues at once, on the notice.
    leaving = consumers.pop(0)
    await leaving.shutdown()
    await async_wait_until(lambda: owned_exactly_once(consumers), timeout=20,
                           message="queues re-owned after a graceful leave")
    left_events = [e for e in emitter.recent("membership") if e.client_id != leaving.client_id
                   and leaving.client_id in (e.left or ())]
    assert left_events and left_events[0].reason == "left"

    sent |= await produce(addr, TOPIC, 10_000)
    await async_wait_until(lambda: sent <= set(rec.ids), timeout=60, message="all 20,000 consumed")
    assert len(sent) == 20_000
    assert not sent - set(rec.ids), "lost messages"
    duplicates = sum(n - 1 for n in rec.ids.values())
    print(f"\n20,000 messages, 3 -> 2 consumers: {duplicates} duplicates (around the rebalances)")
    for c in consumers:
        assert c.snapshot()["consumed"]["ok"] > 0
        await c.shutdown()

    # The event stream the dashboard draws from (DESIGN.md schema).
    assignment = emitter.recent("assignment", client_id="c1")[-1]
    assert assignment.strategy == "AVG" and assignment.reason == "shutdown" and assignment.queues == []
    moves = [e for e in emitter.recent("assignment", client_id="c1") if e.reason == "left"]
    assert moves and {mq.label for mq in moves[-1].queues} <= set(LABELS)
    ends = [e for e in emitter.recent("rebalance") if e.phase == "end"]
    assert ends and all({"duration_ms", "added", "removed"} <= set(e.to_dict()) for e in ends)
    pq = emitter.recent("pq")[-1]
    assert {"cached_count", "cached_bytes", "span", "inflight", "committed_offset", "pull_offset", "queue"} <= set(pq.to_dict())
    assert event_from_dict(pq.to_dict()) == pq and pq.to_dict()["queue"] == pq.queue.label   # one serializer
    assert sum(e.ok for e in emitter.recent("consume")) > 0
    assert any(e.offsets for e in emitter.recent("offset", client_id="c1"))


async def test_killed_consumer_leaves_at_once_and_a_cut_one_at_expiry(fast_broker):
    """Kill closes the connection: the broker drops the client at once ("closed"). A cut
    closes nothing: the client keeps its queues until the broker expires it ("expired")."""
    addr = fast_broker.address
    rec = Recorder()
    emitter = EventEmitter()
    consumers = [recorded_push(addr, "GID_PUSH_KILL", f"k{i}", rec, emitter) for i in range(3)]
    for c in consumers:
        await c.start()
    await async_wait_until(lambda: owned_exactly_once(consumers), timeout=20, message="shared by 3")
    killed, cut, survivor = consumers

    def left_reasons(victim):
        return {e.reason for e in emitter.recent("membership", client_id=survivor.client_id)
                if victim.client_id in (e.left or ())}

    await killed.abort()
    await async_wait_until(lambda: left_reasons(killed), timeout=10, message="the kill noticed")
    assert left_reasons(killed) == {"closed"}
    await async_wait_until(lambda: owned_exactly_once([cut, survivor]), timeout=20, message="shared by 2")

    held = cut.snapshot()["assignments"]
    cut.cut()
    await async_wait_until(lambda: left_reasons(cut), timeout=30, message="the cut client expired")
    assert left_reasons(cut) == {"expired"}
    # Partitioned, it never heard it was expired: it still holds (and would consume) its queues.
    assert cut.snapshot()["assignments"] == held
    await async_wait_until(lambda: owned_exactly_once([survivor]), timeout=30,
                           message="survivor owns every queue after the expiry")
    sent = await produce(addr, TOPIC, 1_000)
    await async_wait_until(lambda: sent <= set(rec.ids), timeout=30, message="survivor consumes everything")
    await cut.abort()
    await survivor.shutdown()


async def test_set_strategy_switches_and_rebalances_at_once(fast_broker):
    addr = fast_broker.address
    rec = Recorder()
    consumers = [recorded_push(addr, "GID_PUSH_STRATEGY", f"s{i}", rec) for i in range(3)]
    for c in consumers:
        await c.start()
    await async_wait_until(lambda: owned_exactly_once(consumers), timeout=20, message="AVG split")
    assert consumers[0].snapshot()["assignments"] == ["broker-a:0", "broker-a:1", "broker-a:2"]
    for c in consumers:
        c.set_strategy("AVG_BY_CIRCLE")
    # No periodic rebalance for 10 minutes: the switch itself must move the queues.
    await async_wait_until(lambda: owned_exactly_once(consumers), timeout=20, message="AVG_BY_CIRCLE split")
    assert consumers[0].snapshot()["assignments"] == ["broker-a:0", "broker-a:3", "broker-a:6"]
    assert consumers[0].snapshot()["strategy"] == "AVG_BY_CIRCLE"
    for c in consumers:
        await c.shutdown()
