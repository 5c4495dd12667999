"""Our lite pull consumer against the real broker: poll, commit, seek, pause/resume,
and the pullThresholdForAll limit on the consume-request cache."""
import pytest

from consumers_app.client import ConsumeFromWhere, LitePullConsumerConfig
from consumers_app.client.lite_pull_consumer import LitePullConsumer
from consumers_app.events import EventEmitter
from consumers_app.message_queue import MessageQueue
from tests.brokers import BrokerProcess
from tests.support import async_wait_until, produce


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("broker"), topics=["LiteA:2@broker-a", "LiteB:4@broker-a"]) as b:
        yield b




def config(addr, cid, **overrides):
    settings = dict(endpoints=addr, client_id=cid, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                    auto_commit=False, flow_control_event_interval_ms=50)
    settings.update(overrides)
    return LitePullConsumerConfig(**settings)


async def poll_until(consumer, want: int, timeout_ms=1000, rounds=200):
    got = []
    for _ in range(rounds):
        got += await consumer.poll(timeout_ms)
        if len(got) >= want:
            break
    return got


async def test_poll_commit_seek_pause_resume(broker):
    q0, q1 = MessageQueue("LiteA", "broker-a", 0), MessageQueue("LiteA", "broker-a", 1)
    sent0 = await produce(broker.address, "LiteA", 100, queue=q0)
    sent1 = await produce(broker.address, "LiteA", 100, queue=q1)
    consumer = LitePullConsumer("GID_LITE", "LiteA", config=config(broker.address, "l1"))
    await consumer.start()
    await async_wait_until(lambda: consumer.assignments == [q0, q1], timeout=20, message="both queues assigned")

    got = await poll_until(consumer, 200)
    assert {m.message_id for m in got} == sent0 | sent1
    assert all(len(batch) <= 10 for batch in [got[i:i + 10] for i in range(0, len(got), 10)])  # pullBatchSize 10

    # commit() persists what poll() handed out.
    await consumer.commit()
    assert await consumer.committed(q0) == 100 and await consumer.committed(q1) == 100

    # seek(): the queue is read again from the given offset.
    consumer.seek(q0, 90)
    again = await poll_until(consumer, 10)
    assert sorted(m.queue_offset for m in again if m.queue == q0) == list(range(90, 100))

    # pause(): q0 is not pulled again (a long poll already in flight may still deliver
    # one batch, as in RocketMQ), q1 keeps flowing; resume(): the rest of q0 arrives.
    consumer.pause([q0])
    new0 = await produce(broker.address, "LiteA", 50, queue=q0)
    new1 = await produce(broker.address, "LiteA", 20, queue=q1)
    got = []
    for _ in range(200):
        got += await consumer.poll(200)
        if new1 <= {m.message_id for m in got}:
            break
    during = {m.message_id for m in got if m.queue == q0}
    assert new1 <= {m.message_id for m in got}
    assert len(during) <= consumer.config.pull_batch_size
    assert consumer.snapshot()["paused"] == ["broker-a:0"]
    consumer.resume([q0])
    rest = await poll_until(consumer, len(new0) - len(during))
    assert during | {m.message_id for m in rest} == new0
    await consumer.shutdown()
    assert consumer.state == "stopped"


async def test_pull_threshold_for_all_holds(broker):
    await produce(broker.address, "LiteB", 2_000)
    emitter = EventEmitter()
    consumer = LitePullConsumer("GID_LITE_ALL", "LiteB",
                                config=config(broker.address, "l2", pull_threshold_for_all=100), emitter=emitter)
    await consumer.start()
    # Nobody polls: the pull tasks fill the cache, then stop at the limit.
    await async_wait_until(lambda: len(emitter.recent("flow_control", reason="all")) >= 4, timeout=20,
                           message="flow control on the whole cache")
    batch = consumer.config.pull_batch_size
    cached = consumer.snapshot()["cached_requests"]
    # Each of the 4 pull tasks checks "cached requests x pullBatchSize > pullThresholdForAll"
    # before pulling, so the cache ends at most one request per task past the limit.
    assert 100 < cached * batch <= 100 + 4 * batch
    event = emitter.recent("flow_control", reason="all")[-1]
    assert event.threshold == 100 and event.value == cached * batch
    got = await poll_until(consumer, 2_000, timeout_ms=2000)
    assert len({m.message_id for m in got}) == 2_000  # drains completely once polled
    await consumer.shutdown()


async def test_subscribe_rebalances_between_two_lite_consumers(broker):
    a = LitePullConsumer("GID_LITE_GROUP", "LiteB", config=config(broker.address, "la"))
    b = LitePullConsumer("GID_LITE_GROUP", "LiteB", config=config(broker.address, "lb"))
    await a.start()
    await b.start()

    def split():
        la, lb = a.snapshot()["assignments"], b.snapshot()["assignments"]
        return sorted(la + lb) == [f"broker-a:{i}" for i in range(4)] and len(la) == len(lb) == 2

    await async_wait_until(split, timeout=20, message="4 queues split 2/2")
    await b.shutdown()
    await async_wait_until(lambda: len(a.snapshot()["assignments"]) == 4, timeout=20, message="a takes all")
    await a.shutdown()
