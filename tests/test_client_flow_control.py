"""Push-consumer flow control and retries against the real broker.

Small thresholds keep these quick; the rules are RocketMQ's: stop pulling a queue while
its ProcessQueue holds more than pullThresholdForQueue messages, or (concurrently)
spans more than consumeConcurrentlyMaxSpan offsets; failed messages go back through
%RETRY%{group} and, after maxReconsumeTimes, to %DLQ%{group}.
"""
import threading
from collections import Counter

import grpc
import pytest

from consumers_app.client import (ConsumeFromWhere, ConsumeResult, PushConsumer,
                                  PushConsumerConfig)
from consumers_app.events import EventEmitter
from consumers_app.protocol import lab, lab_grpc
from tests.brokers import BrokerProcess
from tests.support import async_wait_until, produce

ONE_SECOND_LEVELS = " ".join(["1s"] * 18)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("broker"),
                       topics=["FlowCount:1@broker-a", "FlowSpan:1@broker-a", "RetryTopic:2@broker-a"],
                       extra_args=["--delay-levels", ONE_SECOND_LEVELS]) as b:
        yield b




def config(addr, cid, **overrides):
    settings = dict(endpoints=addr, client_id=cid, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                    flow_control_event_interval_ms=100, pq_event_interval_ms=100)
    settings.update(overrides)
    return PushConsumerConfig(**settings)


class Seen:
    def __init__(self):
        self.lock = threading.Lock()
        self.ids = Counter()

    def add(self, msgs):
        with self.lock:
            for m in msgs:
                self.ids[m.message_id] += 1


async def test_hung_listener_stops_the_queue_at_pull_threshold_for_queue(broker):
    seen = Seen()
    emitter = EventEmitter()

    def listener(msgs):
        seen.add(msgs)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer("GID_FC_COUNT", "FlowCount", listener,
                            config(broker.address, "fc1", pull_threshold_for_queue=50), emitter=emitter)
    consumer.hang()
    await consumer.start()
    sent = await produce(broker.address, "FlowCount", 500)
    await async_wait_until(lambda: len(emitter.recent("flow_control", reason="count")) >= 3, timeout=20,
                           message="repeated count flow control")
    figures = consumer.snapshot()["queues"]["broker-a:0"]
    # Pulling stops once the cache exceeds the threshold: at most one batch beyond it.
    assert 50 < figures["cached_count"] <= 50 + consumer.config.pull_batch_size
    event = emitter.recent("flow_control", reason="count")[-1]
    assert event.threshold == 50 and event.value == figures["cached_count"]
    assert consumer.snapshot()["queues"]["broker-a:0"]["cached_count"] == figures["cached_count"], "stopped growing"
    assert consumer.snapshot()["flow_control_counts"]["count"] >= 3

    consumer.resume()
    await async_wait_until(lambda: sent <= set(seen.ids), timeout=30, message="all consumed after resume")
    await consumer.shutdown()


async def test_one_stuck_message_stops_the_queue_at_max_span(broker):
    """The span is lastKey - firstKey of the messages still cached: a stuck message
    stops pulling once the messages behind it are cached 100 offsets deep (long before
    the 1000-message count limit); the commit offset cannot pass it meanwhile."""
    seen = Seen()
    emitter = EventEmitter()
    release_stuck = threading.Event()
    release_rest = threading.Event()
    stuck_offset = []
    lock = threading.Lock()

    def listener(msgs):
        m = msgs[0]
        with lock:
            if not stuck_offset:
                stuck_offset.append(m.queue_offset)
        (release_stuck if m.queue_offset == stuck_offset[0] else release_rest).wait(60)
        seen.add(msgs)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer("GID_FC_SPAN", "FlowSpan", listener,
                            config(broker.address, "fs1", consume_concurrently_max_span=100), emitter=emitter)
    await consumer.start()
    sent = await produce(broker.address, "FlowSpan", 1_000)
    batch = consumer.config.pull_batch_size
    try:
        await async_wait_until(lambda: len(emitter.recent("flow_control", reason="span")) >= 3, timeout=20,
                               message="span flow control")
        event = emitter.recent("flow_control", reason="span")[-1]
        assert event.threshold == 100 and 100 < event.value <= 100 + batch
        figures = consumer.snapshot()["queues"]["broker-a:0"]
        assert figures["pull_offset"] <= 100 + 2 * batch  # stopped one batch past the span
        assert figures["cached_count"] < 1_000 and not emitter.recent("flow_control", reason="count")

        # The rest may go now; the stuck one still holds the commit offset back.
        release_rest.set()
        await async_wait_until(lambda: len(seen.ids) >= 999, timeout=30, message="all but the stuck one")
        assert consumer.snapshot()["queues"]["broker-a:0"]["committed_offset"] <= stuck_offset[0]
    finally:
        release_stuck.set()
        release_rest.set()
    await async_wait_until(lambda: sent <= set(seen.ids), timeout=30, message="all consumed once unstuck")
    await async_wait_until(lambda: consumer.snapshot()["queues"]["broker-a:0"]["committed_offset"] == 1_000,
                           timeout=30, message="commit offset moves past the unstuck message")
    await consumer.shutdown()


async def test_failed_messages_are_retried_then_dead_lettered(broker):
    """RECONSUME_LATER -> SendBack -> %RETRY%group (delay level) -> again; after
    maxReconsumeTimes -> %DLQ%group."""
    attempts = Counter()
    lock = threading.Lock()
    poison = set()
    topics_seen = set()

    def listener(msgs):
        m = msgs[0]
        with lock:
            attempts[m.message_id if m.reconsume_times == 0 else m.properties.get("ORIGIN_MESSAGE_ID", m.message_id)] += 1
            first = m.reconsume_times == 0
            if first and not poison:
                poison.add(m.message_id)
        topics_seen.add(m.topic)   # asserted below: an assert in here would just be a failure
        key = m.properties.get("ORIGIN_MESSAGE_ID", m.message_id)
        if key in poison:
            return ConsumeResult.RECONSUME_LATER  # always fails: ends in the DLQ
        return ConsumeResult.RECONSUME_LATER if first else ConsumeResult.SUCCESS

    consumer = PushConsumer("GID_RETRY", "RetryTopic", listener,
                            config(broker.address, "r1", max_reconsume_times=2, poll_name_server_interval_ms=300))
    await consumer.start()
    sent = await produce(broker.address, "RetryTopic", 50)
    await async_wait_until(lambda: len(attempts) == 50 and all(
        attempts[i] >= 2 for i in sent if i not in poison), timeout=30, message="every message retried once")
    channel = grpc.aio.insecure_channel(broker.address)
    admin = lab_grpc.LabAdminStub(channel)

    async def dlq_size():
        resp = await admin.ListTopics(lab.ListTopicsRequest())
        if "%DLQ%GID_RETRY" not in {t.name for t in resp.topics}:
            return 0
        offsets = await admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="%DLQ%GID_RETRY"))
        return sum(q.max_offset for q in offsets.queues)

    await async_wait_until(dlq_size, timeout=30, message="the poison message in the DLQ")
    await channel.close()
    assert attempts[next(iter(poison))] == 3  # first try + maxReconsumeTimes (2) retries
    assert topics_seen == {"RetryTopic"}  # a retried message shows its original topic
    assert consumer.snapshot()["consumed"]["retry"] >= 50
    assert "%RETRY%GID_RETRY/broker-a:0" in consumer.snapshot()["queues"]
    await consumer.shutdown()
