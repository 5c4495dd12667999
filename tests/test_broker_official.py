"""The official rocketmq-python-client (unchanged) against our broker, over real gRPC."""
import threading
import time

import pytest
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer, PushConsumer,
                      SimpleConsumer)
from rocketmq.v5.consumer.push.message_listener import ConsumeResult, MessageListener

from consumers_app.protocol import lab

from .brokers import FAST_BROKER_ARGS, BrokerProcess
from .support import wait_until

pytestmark = pytest.mark.usefixtures("official_client_thread_loop")

TOPICS = ["TopicTest:8", "Redeliver:2", "Extend:2", "DeadLetter:2", "PushTopic:4"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # --pop-max-attempts 3: the official client sends no backoff policy, so the default applies.
    # The official clients heartbeat every 10 s: keep them registered (the fast 1.5 s expiry
    # would drop them between heartbeats and stop auto-renewing the push consumer's messages).
    with BrokerProcess(tmp_path_factory.mktemp("official"), topics=TOPICS,
                       extra_args=FAST_BROKER_ARGS + ["--pop-max-attempts", "3", "--client-expiry-ms", "30000"]) as b:
        yield b


@pytest.fixture(scope="module")
def config(broker):
    return ClientConfiguration(broker.address, Credentials())


@pytest.fixture(scope="module")
def producer(config):
    p = Producer(config, ("TopicTest",))
    p.startup()
    yield p
    p.shutdown()


def send(producer, topic, body, tag=None, keys=None):
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    return producer.send(m)


def simple_consumer(config, group, topic, await_duration=2):
    c = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=await_duration)
    c.startup()
    return c


def test_producer_and_simple_consumer_2000_messages(config, producer):
    sent = {}
    for i in range(2000):
        receipt = send(producer, "TopicTest", f"body-{i}".encode(), tag=f"Tag{i % 3}", keys=f"key-{i}")
        sent[receipt.message_id] = i
    assert len(sent) == 2000

    consumer = simple_consumer(config, "official-simple", "TopicTest")
    try:
        seen = {}
        deadline = time.monotonic() + 120
        while len(seen) < 2000 and time.monotonic() < deadline:
            for m in consumer.receive(32, 30):  # 30 s invisible: nothing may come twice
                assert m.message_id not in seen, "a message was delivered twice while invisible"
                i = sent[m.message_id]
                seen[m.message_id] = i
                assert m.body == f"body-{i}".encode()
                assert m.tag == f"Tag{i % 3}"
                assert m.keys == {f"key-{i}"}
                assert m.delivery_attempt == 1
                consumer.ack(m)
        assert len(seen) == 2000
        # Everything acked: nothing comes back.
        assert consumer.receive(32, 30) == []
    finally:
        consumer.shutdown()


def test_unacked_message_comes_back_with_next_attempt(config, producer):
    receipt = send(producer, "Redeliver", b"again")
    consumer = simple_consumer(config, "official-redeliver", "Redeliver")
    try:
        first = wait_until(lambda: consumer.receive(1, 1), timeout=30, message="first delivery")
        assert first[0].message_id == receipt.message_id and first[0].delivery_attempt == 1
        # Not acked: after its 1 s invisible time it is revived (via %RETRY%) with attempt 2.
        again = wait_until(lambda: consumer.receive(1, 30), timeout=30, message="redelivery")
        assert again[0].message_id == receipt.message_id
        assert again[0].delivery_attempt == 2
        assert again[0].body == b"again"
        consumer.ack(again[0])
    finally:
        consumer.shutdown()


def test_change_invisible_duration_extends_the_time(config, producer):
    receipt = send(producer, "Extend", b"extend me")
    consumer = simple_consumer(config, "official-extend", "Extend", await_duration=1)
    try:
        got = wait_until(lambda: consumer.receive(1, 3), timeout=30, message="delivery")[0]
        received_at = time.monotonic()
        old_handle = got.receipt_handle
        consumer.change_invisible_duration(got, 30)
        assert got.receipt_handle != old_handle  # a new handle comes back
        # Well past the original 3 s invisible time (plus revive passes), it stays invisible.
        wait_until(lambda: time.monotonic() > received_at + 5, timeout=10, message="5 s to pass")
        assert consumer.receive(1, 30) == []
        consumer.ack(got)  # the new handle acks
        assert got.message_id == receipt.message_id
    finally:
        consumer.shutdown()


def test_dead_letter_after_max_attempts(broker, config, producer, stubs_for):
    receipt = send(producer, "DeadLetter", b"poison")
    group = "official-dlq"
    consumer = simple_consumer(config, group, "DeadLetter", await_duration=1)
    attempts = []
    try:
        def dead_lettered():
            for m in consumer.receive(1, 1):  # never acked
                attempts.append(m.delivery_attempt)
            offsets = stubs_for(broker.address).admin.GetQueueOffsets(
                lab.QueueOffsetsRequest(topic=f"%DLQ%{group}"))
            return offsets.status.code == 20000 and sum(q.max_offset for q in offsets.queues) == 1

        wait_until(dead_lettered, timeout=60, message="the message to reach the DLQ")
    finally:
        consumer.shutdown()
    assert attempts == [1, 2, 3]
    admin = stubs_for(broker.address).admin
    pulled = admin.PullBatch(lab.PullBatchRequest(
        group="dlq-reader", queue=lab.QueueRef(topic=f"%DLQ%{group}", broker_name="broker-a", queue_id=0),
        offset=0, max_messages=8))
    assert pulled.pull_status == lab.FOUND
    (dead,) = pulled.messages
    assert dead.message_id == receipt.message_id and dead.body == b"poison"
    assert dead.properties["DLQ_ORIGIN_TOPIC"] == "DeadLetter"


def test_push_consumer_consumes_a_batch(config, producer):
    bodies = {f"push-{i}".encode() for i in range(200)}
    for b in bodies:
        send(producer, "PushTopic", b, tag="push")
    consumed = set()
    failed_once = []
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                # Fail one message once: it must come back (nack -> retry) with attempt 2.
                if message.body == b"push-7" and not failed_once:
                    failed_once.append(message.delivery_attempt)
                    return ConsumeResult.FAILURE
                if message.body == b"push-7":
                    failed_once.append(message.delivery_attempt)
                consumed.add(message.body)
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(config, "official-push", Listener(), {"PushTopic": FilterExpression("push")})
    consumer.startup()
    try:
        wait_until(lambda: consumed >= bodies, timeout=60, message="the push consumer to consume all")
    finally:
        consumer.shutdown()
    assert consumed == bodies
    assert failed_once == [1, 2]
