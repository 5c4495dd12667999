"""The dashboard's central contrast, for real: one hung consumer out of three.

* POP: the two healthy consumers drain the topic; the hung one's received messages
  come back after the invisible time and are consumed by the others.
* PUSH: the hung consumer keeps its queues (it still heartbeats, so no rebalance takes
  them away); its ProcessQueues fill to pullThresholdForQueue and the lag on its queues
  grows while the others' queues drain.
"""
import threading
from collections import Counter

import grpc
import pytest

from consumers_app.client import (ConsumeFromWhere, ConsumeResult, PopConsumerConfig,
                                  PushConsumer, PushConsumerConfig)
from consumers_app.client.pop_consumer import PopConsumer
from consumers_app.events import EventEmitter
from consumers_app.protocol import lab, lab_grpc
from tests.brokers import BrokerProcess
from tests.support import async_wait_until, produce


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("broker"), topics=["PopTopic:4@broker-a", "PushTopic:6@broker-a"],
                       extra_args=["--min-invisible-ms", "500", "--revive-interval-ms", "100"]) as b:
        yield b




class Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_consumer: dict[str, set] = {}
        self.counts = Counter()

    def listener(self, cid):
        seen = self.by_consumer.setdefault(cid, set())

        def listen(msgs):
            with self.lock:
                for m in msgs:
                    seen.add(m.message_id)
                    self.counts[m.message_id] += 1
            return ConsumeResult.SUCCESS
        return listen


async def test_pop_hung_consumer_messages_come_back_to_the_others(broker):
    log = Log()
    emitter = EventEmitter()
    consumers = [PopConsumer("GID_POP", "PopTopic", log.listener(f"p{i}"),
                             PopConsumerConfig(endpoints=broker.address, client_id=f"p{i}", invisible_time_ms=1500,
                                               allow_any_invisible_time=True, pop_threshold_for_queue=40),
                             emitter=emitter)
                 for i in range(3)]
    hung = consumers[0]
    hung.hang()
    for c in consumers:
        await c.start()
    assert all(c.snapshot()["assignments"] == ["broker-a:-1"] for c in consumers)  # any member, any queue
    sent = await produce(broker.address, "PopTopic", 2_000)
    healthy = set()

    def drained():
        healthy.clear()
        healthy.update(log.by_consumer["p1"] | log.by_consumer["p2"])
        return sent <= healthy

    await async_wait_until(lambda: hung.snapshot()["inflight"] > 0, timeout=20, message="the hung consumer holds some")
    held = hung.snapshot()["inflight"]
    await async_wait_until(drained, timeout=60, message="the healthy two consume everything")
    assert not log.by_consumer["p0"], "the hung listener never returned"
    redelivered = sum(c.snapshot()["pop"].get("redelivered", 0) for c in consumers[1:])
    assert redelivered >= held > 0  # the hung one's messages came back after the invisible time
    assert any(e.redelivered for e in emitter.recent("pop", action="received"))
    print(f"\nPOP: hung consumer held {held} messages; the others got {redelivered} redeliveries; "
          f"{sum(n - 1 for n in log.counts.values())} duplicates")
    for c in consumers:
        await c.shutdown()


async def test_push_hung_consumer_queues_back_up(broker):
    log = Log()
    consumers = [PushConsumer("GID_PUSH_HUNG", "PushTopic", log.listener(f"h{i}"),
                              PushConsumerConfig(endpoints=broker.address, client_id=f"h{i}", pull_threshold_for_queue=50,
                                                 consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET))
                 for i in range(3)]
    hung = consumers[0]
    hung.hang()
    for c in consumers:
        await c.start()

    def shared():
        labels = sorted(label for c in consumers for label in c.snapshot()["assignments"])
        return labels == [f"broker-a:{i}" for i in range(6)] and all(c.snapshot()["assignments"] for c in consumers)

    await async_wait_until(shared, timeout=20, message="6 queues shared by 3")
    hung_queues = set(hung.snapshot()["assignments"])
    sent = await produce(broker.address, "PushTopic", 3_000)

    channel = grpc.aio.insecure_channel(broker.address)
    admin = lab_grpc.LabAdminStub(channel)

    async def lag():
        resp = await admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="PushTopic", group="GID_PUSH_HUNG"))
        return {f"{q.queue.broker_name}:{q.queue.queue_id}": q.max_offset - max(q.committed_offset, 0)
                for q in resp.queues}

    others = log.by_consumer["h1"] | log.by_consumer["h2"]

    async def others_drained():
        others.update(log.by_consumer["h1"] | log.by_consumer["h2"])
        lags = await lag()
        return all(lags[q] == 0 for q in lags if q not in hung_queues)

    await async_wait_until(others_drained, timeout=60, message="the healthy consumers' queues drain")
    lags = await lag()
    assert all(lags[q] > 0 for q in hung_queues), lags  # the hung consumer's queues keep their backlog
    figures = hung.snapshot()["queues"]
    for q in hung_queues:
        assert figures[q]["cached_count"] > 50  # its ProcessQueues are full (pullThresholdForQueue)
    assert hung.snapshot()["flow_control_counts"].get("count", 0) > 0
    assert len(others) < len(sent)  # nobody else may take the hung consumer's queues

    # More traffic: the lag on the hung consumer's queues grows, the others' stays drained.
    before = {q: lags[q] for q in hung_queues}
    await produce(broker.address, "PushTopic", 600)
    await async_wait_until(others_drained, timeout=60, message="the others drain the new messages too")
    after = await lag()
    assert all(after[q] > before[q] for q in hung_queues), (before, after)
    print(f"\nPUSH: lag on the hung consumer's queues {before} -> {dict((q, after[q]) for q in hung_queues)}")

    hung.resume()
    await async_wait_until(lambda: sent <= (log.by_consumer["h0"] | log.by_consumer["h1"] | log.by_consumer["h2"]),
                           timeout=60, message="everything consumed once it resumes")
    await channel.close()
    for c in consumers:
        await c.shutdown()
