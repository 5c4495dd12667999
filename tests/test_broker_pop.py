"""POP consumption over raw v2 stubs: ack, change invisible, retry topic, DLQ, fifo order,
max attempts from the client's Telemetry settings, assignment, pull-mode RPCs."""
import queue

import pytest

from consumers_app.protocol import lab, v2
from consumers_app.protocol import v2_service as svc

from .support import wait_until

Code = v2.Code


@pytest.fixture
def stubs(fast_broker, stubs_for):
    return stubs_for(fast_broker.address, client_id="pop-client")


def create(stubs, name, queues=2):
    assert stubs.admin.CreateTopic(lab.CreateTopicRequest(name=name, queue_count=queues)).status.code == Code.OK


def send(stubs, topic, bodies, group_key=None, delay_ms=None):
    req = svc.SendMessageRequest()
    for b in bodies:
        m = req.messages.add(body=b)
        m.topic.name = topic
        if group_key:
            m.system_properties.message_group = group_key
        if delay_ms is not None:
            m.system_properties.delivery_timestamp.FromMilliseconds(delay_ms)
    resp = stubs.v2.SendMessage(req, metadata=stubs.md)
    assert resp.status.code == Code.OK, resp.status
    return resp


def receive(stubs, group, topic, batch=32, invisible_s=30, poll_s=1, qid=-1, broker="broker-a"):
    req = svc.ReceiveMessageRequest(group=v2.Resource(name=group), batch_size=batch,
                                    invisible_duration={"seconds": invisible_s},
                                    long_polling_timeout={"seconds": poll_s})
    req.message_queue.topic.name = topic
    req.message_queue.broker.name = broker
    req.message_queue.id = qid
    return [r.message for r in stubs.v2.ReceiveMessage(req, metadata=stubs.md, timeout=30) if r.HasField("message")]


def ack(stubs, group, topic, m):
    req = svc.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name=topic))
    req.entries.add(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)
    return stubs.v2.AckMessage(req, metadata=stubs.md)


def test_ack_is_final_and_inflight_is_counted(stubs):
    create(stubs, "PopAck")
    send(stubs, "PopAck", [b"1", b"2", b"3"])
    got = receive(stubs, "pa", "PopAck")
    assert sorted(m.body for m in got) == [b"1", b"2", b"3"]
    m0 = got[0]
    assert m0.system_properties.delivery_attempt == 1 and m0.system_properties.body_digest.checksum
    offsets = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="PopAck", group="pa"))
    assert sum(q.inflight for q in offsets.queues) == 3
    for m in got:
        assert ack(stubs, "pa", "PopAck", m).status.code == Code.OK
    assert ack(stubs, "pa", "PopAck", got[0]).status.code == Code.OK  # acking twice is fine
    offsets = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="PopAck", group="pa"))
    assert sum(q.inflight for q in offsets.queues) == 0
    assert receive(stubs, "pa", "PopAck") == []


def test_expired_handle_is_rejected_and_message_comes_back_from_retry(stubs):
    create(stubs, "PopExpire")
    send(stubs, "PopExpire", [b"late"])
    (m,) = receive(stubs, "pe", "PopExpire", invisible_s=1)
    again = wait_until(lambda: receive(stubs, "pe", "PopExpire", invisible_s=30), timeout=20, message="revive")
    assert again[0].system_properties.delivery_attempt == 2
    assert again[0].topic.name == "PopExpire"  # the retry topic is hidden from the consumer
    assert again[0].system_properties.message_id == m.system_properties.message_id
    late = ack(stubs, "pe", "PopExpire", m)
    assert late.status.code == Code.INVALID_RECEIPT_HANDLE and "expired" in late.status.message
    assert ack(stubs, "pe", "PopExpire", again[0]).status.code == Code.OK


def test_change_invisible_duration_returns_a_new_handle(stubs):
    create(stubs, "PopChange")
    send(stubs, "PopChange", [b"c"])
    (m,) = receive(stubs, "pc", "PopChange", invisible_s=30)
    resp = stubs.v2.ChangeInvisibleDuration(svc.ChangeInvisibleDurationRequest(
        group=v2.Resource(name="pc"), topic=v2.Resource(name="PopChange"),
        receipt_handle=m.system_properties.receipt_handle, invisible_duration={"seconds": 1}), metadata=stubs.md)
    assert resp.status.code == Code.OK and resp.receipt_handle != m.system_properties.receipt_handle
    # Shortened to 1 s: it comes back soon, attempt 2 (how the push consumer nacks).
    again = wait_until(lambda: receive(stubs, "pc", "PopChange"), timeout=20, message="redelivery")
    assert again[0].system_properties.delivery_attempt == 2


def telemetry_settings(stubs, group, max_attempts):
    """Open a Telemetry stream, send consumer Settings with a backoff policy, return the answer."""
    requests = queue.Queue()
    settings = v2.Settings(client_type=v2.SIMPLE_CONSUMER)
    settings.subscription.group.name = group
    settings.backoff_policy.max_attempts = max_attempts
    requests.put(svc.TelemetryCommand(settings=settings))
    call = stubs.v2.Telemetry(iter(requests.get, None), metadata=stubs.md)
    first = next(call)
    requests.put(None)
    call.cancel()
    return first


def test_max_attempts_from_telemetry_settings_then_dlq(stubs):
    create(stubs, "PopDlq")
    answer = telemetry_settings(stubs, "pd", max_attempts=2)
    assert answer.status.code == Code.OK and answer.settings.subscription.receive_batch_size == 32
    send(stubs, "PopDlq", [b"poison"])
    attempts = []

    def in_dlq():
        for m in receive(stubs, "pd", "PopDlq", invisible_s=1):
            attempts.append(m.system_properties.delivery_attempt)
        q = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="%DLQ%pd"))
        return q.status.code == Code.OK and sum(x.max_offset for x in q.queues) == 1

    wait_until(in_dlq, timeout=30, message="DLQ")
    assert attempts == [1, 2]


def test_consumer_settings_answer(stubs):
    answer = telemetry_settings(stubs, "settings-g", max_attempts=0)
    s = answer.settings
    assert s.backoff_policy.max_attempts == 17
    assert len(s.backoff_policy.customized_backoff.next) == 5  # FAST_BROKER_ARGS' delay levels
    assert s.subscription.long_polling_timeout.seconds > 0 and not s.subscription.fifo
    requests = queue.Queue()
    prod = v2.Settings(client_type=v2.PRODUCER)
    prod.publishing.max_body_size = 1
    requests.put(svc.TelemetryCommand(settings=prod))
    call = stubs.v2.Telemetry(iter(requests.get, None), metadata=stubs.md)
    answer = next(call)
    requests.put(None)
    call.cancel()
    assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024


def test_forward_to_dead_letter_queue(stubs):
    create(stubs, "PopForward")
    send(stubs, "PopForward", [b"discard"])
    (m,) = receive(stubs, "pf", "PopForward")
    resp = stubs.v2.ForwardMessageToDeadLetterQueue(svc.ForwardMessageToDeadLetterQueueRequest(
        group=v2.Resource(name="pf"), topic=v2.Resource(name="PopForward"),
        receipt_handle=m.system_properties.receipt_handle, message_id=m.system_properties.message_id,
        delivery_attempt=1, max_delivery_attempts=16), metadata=stubs.md)
    assert resp.status.code == Code.OK
    dlq = stubs.admin.PullBatch(lab.PullBatchRequest(group="r", queue=lab.QueueRef(
        topic="%DLQ%pf", broker_name="broker-a", queue_id=0), max_messages=4))
    assert [x.body for x in dlq.messages] == [b"discard"]


def test_fifo_group_pops_in_order_and_redelivers_in_place(stubs):
    create(stubs, "PopFifo", queues=1)
    stubs.admin.UpdateGroup(lab.GroupConfigRequest(group="pfifo", fifo=True))
    send(stubs, "PopFifo", [f"o{i}".encode() for i in range(6)], group_key="order-1")
    first = receive(stubs, "pfifo", "PopFifo", batch=3, invisible_s=1, qid=0)
    assert [m.body for m in first] == [b"o0", b"o1", b"o2"]
    assert first[0].system_properties.message_group == "order-1"
    # Blocked while un-acked; after the invisible time the same messages come back, attempt 2.
    again = wait_until(lambda: receive(stubs, "pfifo", "PopFifo", batch=3, invisible_s=30, qid=0), timeout=20,
                       message="in-place redelivery")
    assert [m.body for m in again] == [b"o0", b"o1", b"o2"]
    assert [m.system_properties.delivery_attempt for m in again] == [2, 2, 2]
    for m in again:
        ack(stubs, "pfifo", "PopFifo", m)
    rest = receive(stubs, "pfifo", "PopFifo", batch=32, qid=0)
    assert [m.body for m in rest] == [b"o3", b"o4", b"o5"]


def test_delivery_timestamp_delays_a_message(stubs):
    import time
    create(stubs, "PopDelay", queues=1)
    due = int(time.time() * 1000) + 1500
    send(stubs, "PopDelay", [b"later"], delay_ms=due)
    got = wait_until(lambda: receive(stubs, "pdelay", "PopDelay"), timeout=20, message="delayed message")
    assert got[0].body == b"later"
    assert int(time.time() * 1000) >= due


def test_pull_mode_rpcs(stubs):
    create(stubs, "PullMode", queues=1)
    send(stubs, "PullMode", [b"p0", b"p1", b"p2"])
    mq = v2.MessageQueue(id=0)
    mq.topic.name = "PullMode"
    mq.broker.name = "broker-a"
    group = v2.Resource(name="pull-g")
    out = list(stubs.v2.PullMessage(svc.PullMessageRequest(group=group, message_queue=mq, offset=1, batch_size=8),
                                    metadata=stubs.md))
    assert out[0].status.code == Code.OK
    assert [r.message.body for r in out if r.HasField("message")] == [b"p1", b"p2"]
    assert out[-1].next_offset == 3
    # No offset committed, but the queue starts at 0 with its first message still stored:
    # RocketMQ's queryConsumerOffset answers 0 (a new group starts there).
    first = stubs.v2.GetOffset(svc.GetOffsetRequest(group=group, message_queue=mq), metadata=stubs.md)
    assert (first.status.code, first.offset) == (Code.OK, 0)
    empty = v2.MessageQueue(id=0)
    empty.topic.name, empty.broker.name = "PullModeEmpty", "broker-a"
    create(stubs, "PullModeEmpty", queues=1)
    assert stubs.v2.GetOffset(svc.GetOffsetRequest(group=group, message_queue=empty),
                              metadata=stubs.md).status.code == Code.OFFSET_NOT_FOUND
    stubs.v2.UpdateOffset(svc.UpdateOffsetRequest(group=group, message_queue=mq, offset=2), metadata=stubs.md)
    assert stubs.v2.GetOffset(svc.GetOffsetRequest(group=group, message_queue=mq), metadata=stubs.md).offset == 2
    end = stubs.v2.QueryOffset(svc.QueryOffsetRequest(message_queue=mq, query_offset_policy=v2.END),
                               metadata=stubs.md)
    assert end.offset == 3


def test_auto_renew_holds_while_the_client_lives(stubs, fast_broker, stubs_for):
    """auto_renew (the push consumer's receive): the broker renews the invisible time while the
    client heartbeats, the first handle still acks; once the client expires, the message revives."""
    import time
    create(stubs, "PopRenew", queues=1)
    send(stubs, "PopRenew", [b"slow", b"abandoned"])
    worker = stubs_for(fast_broker.address, client_id="renewer")
    group = v2.Resource(name="prenew")

    def beat():
        worker.v2.Heartbeat(svc.HeartbeatRequest(group=group, client_type=v2.PUSH_CONSUMER), metadata=worker.md)

    beat()
    req = svc.ReceiveMessageRequest(group=group, batch_size=2, auto_renew=True, long_polling_timeout={"seconds": 1})
    req.message_queue.topic.name = "PopRenew"
    got = [r.message for r in worker.v2.ReceiveMessage(req, metadata=worker.md) if r.HasField("message")]
    assert [m.body for m in got] == [b"slow", b"abandoned"]
    # Hold them for 3x the 2 s default invisible time while heartbeating.
    started = time.monotonic()
    wait_until(lambda: beat() or time.monotonic() > started + 6, timeout=20, message="6 s of heartbeats")
    assert receive(stubs, "prenew", "PopRenew") == []
    assert ack(worker, "prenew", "PopRenew", got[0]).status.code == Code.OK
    # The worker goes silent: it expires (1.5 s) and its remaining message revives for others.
    again = wait_until(lambda: receive(stubs, "prenew", "PopRenew"), timeout=30, message="revive after expiry")
    assert [m.body for m in again] == [b"abandoned"] and again[0].system_properties.delivery_attempt == 2
