"""Our push consumer over RocketMQ's remoting protocol (ClientConfig.namesrv), against the
real broker's name server and broker ports: every message delivered, queues shared with
a membership notice, failed messages back through %RETRY%, running info answered, and a
group shared with ali-ons. The same consumer code as on gRPC; only the connection differs."""
from collections import Counter

import pytest

from consumers_app.client import ConsumeFromWhere, ConsumeResult, PushConsumer, PushConsumerConfig
from consumers_app.lab.observer import Cluster
from tests.brokers import BrokerProcess
from tests.remoting_peers import AliOns, require_ali_ons
from tests.support import async_wait_until, produce

TOPIC = "TopicRemote"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("remote-clients"), topics=[f"{TOPIC}:8"], remoting=True,
                       extra_args=["--client-expiry-ms", "3000", "--client-scan-ms", "250"]) as b:
        yield b


def remoting_push(broker, group, seen: Counter, fail_first=False, **overrides):
    failed = set()

    def listen(msgs):
        for m in msgs:
            if fail_first and m.message_id not in failed:
                failed.add(m.message_id)
                return ConsumeResult.RECONSUME_LATER
            seen[m.message_id] += 1
        return ConsumeResult.SUCCESS
    settings = dict(namesrv=broker.namesrv, heartbeat_interval_ms=500, poll_name_server_interval_ms=1000,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    settings.update(overrides)
    return PushConsumer(group, TOPIC, listen, PushConsumerConfig(**settings))


def held(consumer) -> set:
    return {mq.label for mq, pq in consumer.rebalance_impl.process_queue_table.items()
            if mq.topic == TOPIC and not pq.dropped}


async def test_our_push_consumer_over_remoting_gets_every_message_and_shares_queues(broker):
    sent = await produce(broker.address, TOPIC, 300, batch=50)
    seen: Counter = Counter()
    first = remoting_push(broker, "GID_REMOTE", seen)
    await first.start()
    second, more = None, set()
    try:
        await async_wait_until(lambda: set(seen) == sent, timeout=30, message="all 300 over remoting")
        second = remoting_push(broker, "GID_REMOTE", seen)
        await second.start()
        # The broker's NOTIFY_CONSUMER_IDS_CHANGED makes both rebalance: 4 queues each, no overlap.
        await async_wait_until(lambda: len(held(first)) == 4 and len(held(second)) == 4
                               and not held(first) & held(second), timeout=30, message="8 queues shared 4/4")
        # They answer GET_CONSUMER_RUNNING_INFO with their real ProcessQueues.
        cluster = Cluster(broker.namesrv)
        try:
            look = await cluster.look("GID_REMOTE", 0)
        finally:
            await cluster.close()
        assert {c.language for c in look.clients.values()} == {"PYTHON"}
        assert {cid: {mq.label for mq in c.queues} for cid, c in look.clients.items()} == {
            first.client_id: held(first), second.client_id: held(second)}
        more = await produce(broker.address, TOPIC, 100, batch=20)
        await async_wait_until(lambda: set(seen) >= sent | more, timeout=30, message="100 more, shared")
    finally:
        for c in (first, second):
            if c is not None:
                await c.shutdown()
    # The hand-off may repeat the first consumer's uncommitted tail (at least once, as in
    # RocketMQ); what was sent after the group settled is consumed exactly once.
    assert all(seen[m] == 1 for m in more)


async def test_a_failed_message_comes_back_through_the_retry_topic(broker):
    seen: Counter = Counter()
    consumer = remoting_push(broker, "GID_REMOTE_RETRY", seen, fail_first=True,
                             consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    await consumer.start()
    try:
        await async_wait_until(lambda: len(held(consumer)) == 8, timeout=30, message="all 8 queues")
        sent = await produce(broker.address, TOPIC, 5, batch=5)
        # Each first delivery fails: sent back (CONSUMER_SEND_MSG_BACK) and redelivered.
        await async_wait_until(lambda: set(seen) >= sent, timeout=60, message="the 5 redelivered")
    finally:
        await consumer.shutdown()


async def test_ours_over_remoting_and_ali_ons_share_a_group(broker):
    require_ali_ons()
    peer = AliOns.consume(broker.namesrv, "GID_REMOTE_MIXED", TOPIC)
    seen: Counter = Counter()
    ours = remoting_push(broker, "GID_REMOTE_MIXED", seen, consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    try:
        peer.wait_ready()
        await ours.start()
        # Both use AVG over the same sorted member list: ours takes its half.
        await async_wait_until(lambda: len(held(ours)) == 4, timeout=40, message="ours holds half the queues")
        peer.kill()   # its connection closes: the broker notifies us at once
        await async_wait_until(lambda: len(held(ours)) == 8, timeout=30, message="ours takes all 8")
    finally:
        peer.kill()
        await ours.shutdown()


async def test_our_lite_pull_consumer_over_remoting_polls_every_message(broker):
    from consumers_app.client import LitePullConsumer, LitePullConsumerConfig
    sent = await produce(broker.address, TOPIC, 120, batch=40)
    consumer = LitePullConsumer("GID_REMOTE_LITE", TOPIC, config=LitePullConsumerConfig(
        namesrv=broker.namesrv, heartbeat_interval_ms=500, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET))
    await consumer.start()
    got: Counter = Counter()
    try:
        async def all_polled():
            for m in await consumer.poll(200):
                got[m.message_id] += 1
            return set(got) >= sent
        await async_wait_until(all_polled, timeout=30, message="the 120 polled over remoting")
    finally:
        await consumer.shutdown()


async def test_our_producer_over_remoting_sends_batches_and_single_messages_intact(broker):
    from consumers_app.client import Producer, ProducerConfig
    producer = Producer(ProducerConfig(namesrv=broker.namesrv, topic=TOPIC, batch_size=16, tag="TagR",
                                       keys=("k1", "k2")))
    await producer.start()
    try:
        assert len(producer.queues) == 8   # the route came from the name server
        batch = await producer.send_batch(16, body=b"batched")   # SEND_BATCH_MESSAGE
        single = await producer.send_batch(1, body=b"single")    # SEND_MESSAGE_V2
        offsets = [e.offset for e in batch]
        assert offsets == list(range(offsets[0], offsets[0] + 16))   # one queue, consecutive
        await producer.send(40, body=b"more")
    finally:
        await producer.shutdown()
    sent = {e.message_id for e in batch + single}
    got: dict = {}

    def listen(msgs):
        for m in msgs:
            got[m.message_id] = (m.body, m.tag, tuple(sorted(m.keys)))
        return ConsumeResult.SUCCESS
    consumer = PushConsumer("GID_REMOTE_PRODUCED", TOPIC, listen, PushConsumerConfig(
        namesrv=broker.namesrv, heartbeat_interval_ms=500,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET))
    await consumer.start()
    try:
        await async_wait_until(lambda: set(got) >= sent, timeout=30, message="what our producer sent over remoting")
    finally:
        await consumer.shutdown()
    assert {got[m] for m in (e.message_id for e in batch)} == {(b"batched", "TagR", ("k1", "k2"))}
    assert got[single[0].message_id] == (b"single", "TagR", ("k1", "k2"))
    assert sum(1 for body, _, _ in got.values() if body == b"more") == 40
