"""Long polling: a held receive/pull wakes when a message arrives, and ends at its timeout."""
import threading
import time

from consumers_app.protocol import lab, v2
from consumers_app.protocol import v2_service as svc

from .support import wait_until

Code = v2.Code


def send_to(stubs, topic, qid, body=b"wake up"):
    req = svc.SendMessageRequest()
    m = req.messages.add(body=body)
    m.topic.name = topic
    m.user_properties["__QUEUE"] = f"broker-a:{qid}"
    resp = stubs.v2.SendMessage(req, metadata=stubs.md)
    assert resp.status.code == Code.OK, resp.status
    return time.monotonic()


def create_topic(stubs, name, queues=2):
    info = stubs.admin.CreateTopic(lab.CreateTopicRequest(name=name, queue_count=queues))
    assert info.status.code == Code.OK, info.status


def test_pull_batch_wakes_on_arrival(fast_broker, stubs_for):
    stubs = stubs_for(fast_broker.address)
    create_topic(stubs, "LongPollPull")
    req = lab.PullBatchRequest(group="lp", queue=lab.QueueRef(topic="LongPollPull", broker_name="broker-a", queue_id=1),
                               offset=0, max_messages=32, suspend_timeout_ms=10_000)
    started = time.monotonic()
    future = stubs.admin.PullBatch.future(req, timeout=30)
    assert not future.done()
    # Let the pull be held for a while so the figure measures a real wake-up (not a sync point:
    # the test passes either way).
    wait_until(lambda: time.monotonic() > started + 0.3, message="0.3 s to pass")
    sent_at = send_to(stubs, "LongPollPull", 1)
    resp = future.result()
    returned_at = time.monotonic()
    assert resp.pull_status == lab.FOUND and resp.messages[0].body == b"wake up"
    print(f"\nPullBatch long-poll wake latency: {(returned_at - sent_at) * 1000:.1f} ms after the send returned "
          f"(held {(sent_at - started) * 1000:.0f} ms)")
    assert returned_at - started < 10  # well before the 10 s hold


def test_receive_wakes_on_arrival(fast_broker, stubs_for):
    stubs = stubs_for(fast_broker.address)
    create_topic(stubs, "LongPollPop")
    req = svc.ReceiveMessageRequest(group=v2.Resource(name="lp-pop"), batch_size=4,
                                    invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 10})
    req.message_queue.topic.name = "LongPollPop"
    req.message_queue.broker.name = "broker-a"
    req.message_queue.id = -1
    result = {}

    def receive():
        result["responses"] = list(stubs.v2.ReceiveMessage(req, metadata=stubs.md, timeout=30))
        result["at"] = time.monotonic()

    started = time.monotonic()
    t = threading.Thread(target=receive)
    t.start()
    wait_until(lambda: time.monotonic() > started + 0.3, message="0.3 s to pass")
    sent_at = send_to(stubs, "LongPollPop", 0)
    t.join(30)
    messages = [r.message for r in result["responses"] if r.HasField("message")]
    assert [m.body for m in messages] == [b"wake up"]
    print(f"\nReceiveMessage long-poll wake latency: {(result['at'] - sent_at) * 1000:.1f} ms after the send "
          f"returned (held {(sent_at - started) * 1000:.0f} ms)")
    assert result["at"] - started < 10


def test_held_requests_end_cleanly_at_their_timeout(fast_broker, stubs_for):
    stubs = stubs_for(fast_broker.address)
    create_topic(stubs, "LongPollQuiet")
    resp = stubs.admin.PullBatch(lab.PullBatchRequest(
        group="lp", queue=lab.QueueRef(topic="LongPollQuiet", broker_name="broker-a", queue_id=0),
        offset=0, max_messages=32, suspend_timeout_ms=500), timeout=30)
    assert resp.status.code == Code.OK and resp.pull_status == lab.NO_NEW_MSG
    req = svc.ReceiveMessageRequest(group=v2.Resource(name="lp-quiet"), batch_size=4,
                                    invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 1})
    req.message_queue.topic.name = "LongPollQuiet"
    responses = list(stubs.v2.ReceiveMessage(req, metadata=stubs.md, timeout=30))
    assert [r.status.code for r in responses] == [Code.MESSAGE_NOT_FOUND]


def test_concurrent_pops_never_share_a_message(fast_broker, stubs_for):
    """Four receivers pop one topic at once: every message is delivered exactly once."""
    stubs = stubs_for(fast_broker.address)
    create_topic(stubs, "PopRace", queues=4)
    req = svc.SendMessageRequest()
    for i in range(400):
        m = req.messages.add(body=f"m{i}".encode())
        m.topic.name = "PopRace"
    assert stubs.v2.SendMessage(req, metadata=stubs.md).status.code == Code.OK
    seen = []
    lock = threading.Lock()

    def receiver(n):
        s = stubs_for(fast_broker.address, client_id=f"racer-{n}")
        r = svc.ReceiveMessageRequest(group=v2.Resource(name="pop-race"), batch_size=7,
                                      invisible_duration={"seconds": 60}, long_polling_timeout={"seconds": 1})
        r.message_queue.topic.name = "PopRace"
        while True:
            got = [x.message for x in s.v2.ReceiveMessage(r, metadata=s.md, timeout=30) if x.HasField("message")]
            if not got:
                return
            with lock:
                seen.extend(m.body for m in got)

    threads = [threading.Thread(target=receiver, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 400 and len(set(seen)) == 400
    offsets = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="PopRace", group="pop-race"))
    assert sum(q.inflight for q in offsets.queues) == 400
    assert all(q.committed_offset == q.max_offset for q in offsets.queues)
