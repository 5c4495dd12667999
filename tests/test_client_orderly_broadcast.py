"""Orderly and broadcasting push consumers against the real broker (the suite's default
broker: clients expire after RocketMQ's 120 s, so a slow machine cannot expire anyone
mid-test and blur the hand-over being checked)."""
from collections import Counter

from consumers_app.client import ConsumeFromWhere, MessageModel, PushConsumer, PushConsumerConfig
from tests.support import async_wait_until, produce
from tests.push_consumers import LABELS, TOPIC, Recorder, owned_exactly_once, recorded_push


async def test_orderly_per_queue_order_holds_across_rebalance(broker):
    addr = broker.address
    rec = Recorder()

    def orderly(cid):
        config = PushConsumerConfig(endpoints=addr, client_id=cid, heartbeat_interval_ms=300,
                                    rebalance_wait_interval_ms=600_000, unlock_delay_time_ms=200,
                                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        return PushConsumer("GID_ORDERLY", TOPIC, rec.listener(cid), config, orderly=True)

    first = [orderly("o0"), orderly("o1")]
    for c in first:
        c.set_slow(5)  # slow enough that the rebalance lands mid-stream
        await c.start()
    await async_wait_until(lambda: owned_exactly_once(first), timeout=20, message="orderly shared by 2")
    sent = await produce(addr, TOPIC, 4_000)
    await async_wait_until(lambda: len(rec.ids) >= 500, timeout=30, message="some consumed")
    joiner = orderly("o2")
    await joiner.start()
    everyone = first + [joiner]
    await async_wait_until(lambda: owned_exactly_once(everyone), timeout=30, message="orderly shared by 3")
    for c in first:
        c.set_slow(0)
    sent |= await produce(addr, TOPIC, 2_000)
    await async_wait_until(lambda: sent <= set(rec.ids), timeout=60, message="all consumed")
    assert rec.by_consumer["o2"] > 0, "the joiner took queues over"

    # Per queue, messages are first seen in offset order; a redelivery after the hand-over
    # restarts from the committed offset and never jumps ahead.
    first_seen = {}
    for label, offset, _ in rec.sequence:
        if (label, offset) not in first_seen:
            first_seen[(label, offset)] = len(first_seen)
    for label in LABELS:
        offsets = [o for (lb, o) in first_seen if lb == label]
        assert offsets == sorted(offsets) == list(range(len(offsets)))
    # Never two consumers on one queue at once: each hand-over is a clean switch.
    switches = Counter()
    points = []
    last_owner = {}
    for label, offset, cid in rec.sequence:
        if last_owner.get(label) not in (None, cid):
            switches[label] += 1
            points.append((label, offset, last_owner[label], cid))
        last_owner[label] = cid
    assert all(n <= 1 for n in switches.values()), points
    for c in everyone:
        await c.shutdown()


async def test_broadcasting_every_consumer_gets_every_message(broker, tmp_path):
    addr = broker.address
    recs = [Recorder(), Recorder()]
    consumers = [recorded_push(addr, "GID_BROADCAST", f"b{i}", recs[i], message_model=MessageModel.BROADCASTING,
                      consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                      offset_store_dir=str(tmp_path)) for i in range(2)]
    for c in consumers:
        await c.start()
    await async_wait_until(lambda: all(len(c.snapshot()["assignments"]) == 8 for c in consumers),
                           timeout=20, message="each owns all 8 queues")
    sent = await produce(addr, TOPIC, 2_000)
    for rec in recs:
        await async_wait_until(lambda rec=rec: sent <= set(rec.ids), timeout=30, message="every message to each")
    for c in consumers:
        await c.shutdown()
    assert list(tmp_path.glob("*/GID_BROADCAST/offsets.json")), "local offset files written"
