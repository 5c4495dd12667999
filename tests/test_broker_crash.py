"""Crash safety: SIGKILL the broker mid-traffic and restart it on the same data dir."""
import json

import pytest

from consumers_app.protocol import lab, v2
from consumers_app.protocol import v2_service as svc

from .brokers import FAST_BROKER_ARGS, BrokerProcess, BrokerStubs, Sender, read_all
from .support import free_port, wait_until

Code = v2.Code
TOPIC = "CrashTopic"


def kill_while_sending(tmp_path, flush):
    broker = BrokerProcess(tmp_path, topics=[f"{TOPIC}:4"], flush=flush, extra_args=FAST_BROKER_ARGS).start()
    sender = Sender(broker.address, TOPIC)
    sender.start()
    try:
        wait_until(lambda: len(sender.acked) >= 400, timeout=60, message="400 acknowledged sends")
        broker.kill()
    finally:
        sender.stop.set()
        sender.join(10)
    acked = list(sender.acked)
    # Restarted on the same data dir, on a fresh port: CI twice saw the old port refuse
    # connections right after the restart was up (never reproduced alone); the data is the
    # point here, not the port. A broker that dies is reported with its output.
    broker.port = free_port()
    broker.start()
    try:
        stubs = BrokerStubs(broker.address)
        try:
            stored = set(read_all(stubs, TOPIC, 4))
        except Exception as exc:
            alive = broker.proc is not None and broker.proc.poll() is None
            raise AssertionError(f"reading back failed ({exc!r}); broker alive: {alive}\n"
                                 + "\n".join(broker.output[-40:])) from exc
        stubs.close()
    finally:
        broker.stop()
    return acked, stored


def test_sync_flush_keeps_every_acknowledged_send(tmp_path):
    acked, stored = kill_while_sending(tmp_path, "sync")
    missing = [m for m in acked if m not in stored]
    print(f"\nsync flush: {len(acked)} acknowledged before SIGKILL, {len(missing)} missing after restart")
    assert not missing


def test_async_flush_loss_window(tmp_path):
    acked, stored = kill_while_sending(tmp_path, "async")
    missing = [m for m in acked if m not in stored]
    # SIGKILL kills the process, not the kernel: written pages survive, so the measured loss is
    # normally 0. What async mode risks is an OS crash / power loss: up to one flush interval
    # (500 ms by default) of acknowledged sends not yet fsynced.
    print(f"\nasync flush: {len(acked)} acknowledged before SIGKILL, {len(missing)} lost after restart "
          f"(window on power loss: up to --flush-interval-ms, 500 ms by default)")
    assert acked, "sends were acknowledged before the kill"
    # A send is acknowledged after its write() to the commit log: a killed process
    # leaves it in the page cache, so even async flush loses nothing to a SIGKILL.
    assert not missing


def test_offsets_and_topics_survive_a_kill(tmp_path):
    broker = BrokerProcess(tmp_path, topics=[f"{TOPIC}:4"], extra_args=FAST_BROKER_ARGS).start()
    try:
        stubs = BrokerStubs(broker.address, "offset-client")
        created = stubs.admin.CreateTopic(lab.CreateTopicRequest(name="RuntimeTopic", queue_count=3,
                                                                 broker_name="broker-b"))
        assert created.status.code == Code.OK
        mq = v2.MessageQueue(id=2)
        mq.topic.name = TOPIC
        mq.broker.name = "broker-a"
        group = v2.Resource(name="offset-group")
        assert stubs.v2.UpdateOffset(svc.UpdateOffsetRequest(group=group, message_queue=mq, offset=5),
                                     metadata=stubs.md).status.code == Code.OK
        path = tmp_path / "consumerOffset.json"

        def persisted():
            try:
                rows = json.loads(path.read_text())["offsets"]
            except (OSError, ValueError):
                return None
            return next((r[4] for r in rows if r[:4] == ["offset-group", TOPIC, "broker-a", 2]), None)

        wait_until(lambda: persisted() == 5, timeout=10, message="offset 5 to be persisted")
        stubs.close()
        broker.kill()
        last_persisted = persisted()
        broker.start()
        stubs = BrokerStubs(broker.address, "offset-client")
        got = stubs.v2.GetOffset(svc.GetOffsetRequest(group=group, message_queue=mq), metadata=stubs.md)
        assert got.status.code == Code.OK and got.offset == last_persisted == 5
        topics = {t.name: t for t in stubs.admin.ListTopics(lab.ListTopicsRequest()).topics}
        assert [(q.broker_name, q.queue_id) for q in topics["RuntimeTopic"].queues] == \
            [("broker-b", 0), ("broker-b", 1), ("broker-b", 2)]
        stubs.close()
    finally:
        assert broker.stop() == 0  # SIGTERM: offsets persisted, exit 0


@pytest.mark.parametrize("flush", ["async"])
def test_restart_after_clean_stop_keeps_messages_and_offsets(tmp_path, flush):
    broker = BrokerProcess(tmp_path, topics=[f"{TOPIC}:2"], flush=flush, extra_args=FAST_BROKER_ARGS).start()
    stubs = BrokerStubs(broker.address)
    req = svc.SendMessageRequest()
    for i in range(50):
        m = req.messages.add(body=f"keep-{i}".encode())
        m.topic.name = TOPIC
    assert stubs.v2.SendMessage(req, metadata=stubs.md).status.code == Code.OK
    pulled = stubs.admin.PullBatch(lab.PullBatchRequest(
        group="g", queue=lab.QueueRef(topic=TOPIC, broker_name="broker-a", queue_id=0), offset=0,
        max_messages=10, commit_offset=7))
    assert pulled.pull_status == lab.FOUND
    stubs.close()
    assert broker.stop() == 0
    broker.start()
    try:
        stubs = BrokerStubs(broker.address)
        assert len(read_all(stubs, TOPIC, 2)) == 50
        offsets = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic=TOPIC, group="g"))
        assert offsets.queues[0].committed_offset == 7
        stubs.close()
    finally:
        broker.stop()


def test_pop_checkpoints_survive_a_restart(tmp_path):
    """Popped, un-acked messages are checkpointed: after a restart an old handle still acks,
    and what was not acked revives (attempt 2)."""
    broker = BrokerProcess(tmp_path, topics=["PopCk:1"], extra_args=FAST_BROKER_ARGS).start()
    try:
        stubs = BrokerStubs(broker.address, "ck-client")
        req = svc.SendMessageRequest()
        for b in (b"acked-later", b"never-acked"):
            m = req.messages.add(body=b)
            m.topic.name = "PopCk"
        assert stubs.v2.SendMessage(req, metadata=stubs.md).status.code == Code.OK
        rcv = svc.ReceiveMessageRequest(group=v2.Resource(name="ck"), batch_size=1,
                                        invisible_duration={"seconds": 60}, long_polling_timeout={"seconds": 1})
        rcv.message_queue.topic.name = "PopCk"

        def pop_one(invisible_s):
            rcv.invisible_duration.seconds = invisible_s
            return [r.message for r in stubs.v2.ReceiveMessage(rcv, metadata=stubs.md) if r.HasField("message")]

        got = pop_one(60) + pop_one(3)  # the second is likely still invisible when the broker stops
        assert [m.body for m in got] == [b"acked-later", b"never-acked"]
        stubs.close()
        assert broker.stop() == 0
        broker.start()
        stubs = BrokerStubs(broker.address, "ck-client")
        ack = svc.AckMessageRequest(group=v2.Resource(name="ck"), topic=v2.Resource(name="PopCk"))
        ack.entries.add(message_id=got[0].system_properties.message_id,
                        receipt_handle=got[0].system_properties.receipt_handle)
        assert stubs.v2.AckMessage(ack, metadata=stubs.md).status.code == Code.OK
        again = wait_until(lambda: pop_one(30), timeout=30, message="the un-acked message to revive")
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"never-acked", 2)]
        stubs.close()
    finally:
        broker.stop()
