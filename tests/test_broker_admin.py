"""The lab's admin service (rebalancelab.v1.LabAdmin): every RPC over real gRPC."""
import queue
import threading
import time
import types

import pytest

from consumers_app.broker import membership
from consumers_app.protocol import lab, v2
from consumers_app.protocol import v2_service as svc

from .brokers import FAST_BROKER_ARGS, BrokerProcess, BrokerStubs
from .support import wait_until

Code = v2.Code
OK = Code.OK


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("admin"), topics=["TopicTest:4@broker-a", "TopicTest:4@broker-b",
                                                                  "Rooms:2@ROOM1@broker-c"],
                       extra_args=FAST_BROKER_ARGS + ["--client-expiry-ms", "4000"]) as b:
        yield b


@pytest.fixture
def stubs(broker, stubs_for):
    return stubs_for(broker.address, client_id="admin-test")


def qref(topic, qid, broker="broker-a"):
    return lab.QueueRef(topic=topic, broker_name=broker, queue_id=qid)


def send(stubs, topic, bodies, qid=None, broker="broker-a", tag=None):
    req = svc.SendMessageRequest()
    for b in bodies:
        m = req.messages.add(body=b)
        m.topic.name = topic
        if tag:
            m.system_properties.tag = tag
        if qid is not None:
            m.user_properties["__QUEUE"] = f"{broker}:{qid}"
    resp = stubs.v2.SendMessage(req, metadata=stubs.md)
    return resp


def route(stubs, topic):
    resp = stubs.v2.QueryRoute(svc.QueryRouteRequest(topic=v2.Resource(name=topic)), metadata=stubs.md)
    return resp, [(q.broker.name, q.id) for q in resp.message_queues]


def test_topics_create_list_add_queues_delete(stubs):
    info = stubs.admin.CreateTopic(lab.CreateTopicRequest(name="AdminTopic", queue_count=2))
    assert info.status.code == OK
    assert [(q.broker_name, q.queue_id) for q in info.queues] == [("broker-a", 0), ("broker-a", 1)]
    info = stubs.admin.CreateTopic(lab.CreateTopicRequest(name="AdminTopic", queue_count=1, broker_name="broker-b"))
    assert [(q.broker_name, q.queue_id) for q in info.queues] == [("broker-a", 0), ("broker-a", 1), ("broker-b", 0)]
    bad = stubs.admin.CreateTopic(lab.CreateTopicRequest(name="bad name", queue_count=1))
    assert bad.status.code == Code.ILLEGAL_TOPIC and bad.status.message

    info = stubs.admin.AddQueues(lab.AddQueuesRequest(topic="AdminTopic", delta=2, broker_name="broker-a"))
    assert [q.queue_id for q in info.queues if q.broker_name == "broker-a"] == [0, 1, 2, 3]
    info = stubs.admin.AddQueues(lab.AddQueuesRequest(topic="AdminTopic", delta=-3, broker_name="broker-a"))
    assert [(q.broker_name, q.queue_id) for q in info.queues] == [("broker-a", 0), ("broker-b", 0)]
    assert route(stubs, "AdminTopic")[1] == [("broker-a", 0), ("broker-b", 0)]

    listed = stubs.admin.ListTopics(lab.ListTopicsRequest())
    names = [t.name for t in listed.topics]
    assert "AdminTopic" in names and "TopicTest" in names and "Rooms" in names
    rooms = next(t for t in listed.topics if t.name == "Rooms")
    assert {q.broker_name for q in rooms.queues} == {"ROOM1@broker-c"}

    assert send(stubs, "AdminTopic", [b"x"]).status.code == OK
    assert stubs.admin.DeleteTopic(lab.DeleteTopicRequest(name="AdminTopic")).status.code == OK
    assert send(stubs, "AdminTopic", [b"x"]).status.code == Code.TOPIC_NOT_FOUND
    assert stubs.admin.DeleteTopic(lab.DeleteTopicRequest(name="AdminTopic")).status.code == Code.TOPIC_NOT_FOUND
    # Re-created, the topic starts empty (the old incarnation's messages are gone).
    stubs.admin.CreateTopic(lab.CreateTopicRequest(name="AdminTopic", queue_count=1))
    offsets = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="AdminTopic"))
    assert [q.max_offset for q in offsets.queues] == [0]


def test_brokers_offline_and_back(stubs):
    brokers = stubs.admin.ListBrokers(lab.ListBrokersRequest())
    assert {(b.broker_name, b.online) for b in brokers.brokers} >= {("broker-a", True), ("broker-b", True),
                                                                    ("ROOM1@broker-c", True)}
    off = stubs.admin.SetBrokerOnline(lab.SetBrokerOnlineRequest(broker_name="broker-b", online=False))
    assert off.status.code == OK and not off.online
    try:
        _, queues = route(stubs, "TopicTest")
        assert {b for b, _ in queues} == {"broker-a"}
        req = svc.QueryAssignmentRequest(topic=v2.Resource(name="TopicTest"), group=v2.Resource(name="g-off"))
        assigned = stubs.v2.QueryAssignment(req, metadata=stubs.md)
        assert [(a.message_queue.broker.name, a.message_queue.id) for a in assigned.assignments] == [("broker-a", -1)]
        resp = send(stubs, "TopicTest", [b"x"], qid=0, broker="broker-b")
        assert resp.status.code == Code.FORBIDDEN and "offline" in resp.status.message
        pulled = stubs.admin.PullBatch(lab.PullBatchRequest(group="g", queue=qref("TopicTest", 0, "broker-b")))
        assert pulled.status.code == Code.FORBIDDEN
        rcv = svc.ReceiveMessageRequest(group=v2.Resource(name="g-off"), batch_size=1,
                                        invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 1})
        rcv.message_queue.topic.name = "TopicTest"
        rcv.message_queue.broker.name = "broker-b"
        (answer,) = list(stubs.v2.ReceiveMessage(rcv, metadata=stubs.md))
        assert answer.status.code == Code.FORBIDDEN and "offline" in answer.status.message
        # Untargeted sends go to the brokers still online.
        assert send(stubs, "TopicTest", [b"x"] * 8).status.code == OK
    finally:
        stubs.admin.SetBrokerOnline(lab.SetBrokerOnlineRequest(broker_name="broker-b", online=True))
    assert {b for b, _ in route(stubs, "TopicTest")[1]} == {"broker-a", "broker-b"}
    assert stubs.admin.SetBrokerOnline(lab.SetBrokerOnlineRequest(broker_name="nope", online=True)).status.code \
        == Code.NOT_FOUND


def test_queue_offsets_search_and_pull_batch(stubs):
    stubs.admin.CreateTopic(lab.CreateTopicRequest(name="OffsetTopic", queue_count=2))
    before = int(time.time() * 1000)
    assert send(stubs, "OffsetTopic", [f"a{i}".encode() for i in range(10)], qid=0, tag="A").status.code == OK
    assert send(stubs, "OffsetTopic", [f"b{i}".encode() for i in range(5)], qid=0, tag="B").status.code == OK

    # Tag filter: only B, after skipping the As.
    pulled = stubs.admin.PullBatch(lab.PullBatchRequest(group="og", queue=qref("OffsetTopic", 0), offset=0,
                                                        max_messages=32, tag_expression="B"))
    assert pulled.pull_status == lab.FOUND
    assert [m.body for m in pulled.messages] == [f"b{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in pulled.messages] == list(range(10, 15))
    assert pulled.next_begin_offset == 15 and pulled.max_offset == 15
    m = pulled.messages[0]
    assert m.tag == "B" and m.store_ts >= before and m.queue.topic == "OffsetTopic"

    # Pull with a piggy-backed commit.
    pulled = stubs.admin.PullBatch(lab.PullBatchRequest(group="og", queue=qref("OffsetTopic", 0), offset=4,
                                                        max_messages=3, commit_offset=4))
    assert [m.body for m in pulled.messages] == [b"a4", b"a5", b"a6"] and pulled.next_begin_offset == 7
    illegal = stubs.admin.PullBatch(lab.PullBatchRequest(group="og", queue=qref("OffsetTopic", 0), offset=99))
    assert illegal.pull_status == lab.OFFSET_ILLEGAL and illegal.next_begin_offset == 15

    offsets = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="OffsetTopic", group="og"))
    q0, q1 = offsets.queues
    assert (q0.min_offset, q0.max_offset, q0.committed_offset) == (0, 15, 4)
    assert q0.oldest_unconsumed_store_ts >= before and q0.inflight == 0
    assert (q1.max_offset, q1.committed_offset, q1.oldest_unconsumed_store_ts) == (0, -1, 0)
    # Only the queues asked for (a rebalance's few), with the same figures.
    asked = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="OffsetTopic", group="og",
                                                                queues=[qref("OffsetTopic", 1)]))
    assert [(q.queue.queue_id, q.max_offset, q.committed_offset) for q in asked.queues] == [(1, 0, -1)]
    # A queue the topic does not have, or one of another topic: a clear error.
    missing = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="OffsetTopic", queues=[qref("OffsetTopic", 7)]))
    assert missing.status.code == Code.NOT_FOUND and "no queue 7" in missing.status.message and not missing.queues
    other = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic="OffsetTopic", queues=[qref("TopicTest", 0)]))
    assert other.status.code == Code.BAD_REQUEST and not other.queues

    search = stubs.admin.SearchOffset(lab.SearchOffsetRequest(queue=qref("OffsetTopic", 0), timestamp=before))
    assert search.status.code == OK and search.offset == 0
    search = stubs.admin.SearchOffset(lab.SearchOffsetRequest(queue=qref("OffsetTopic", 0),
                                                              timestamp=int(time.time() * 1000) + 60_000))
    assert search.offset == 15


def test_send_back_to_retry_then_dlq(stubs):
    stubs.admin.CreateTopic(lab.CreateTopicRequest(name="BackTopic", queue_count=1))
    send(stubs, "BackTopic", [b"fail me"], qid=0)
    pulled = stubs.admin.PullBatch(lab.PullBatchRequest(group="sb", queue=qref("BackTopic", 0), max_messages=1))
    msg = pulled.messages[0]
    back = stubs.admin.SendBack(lab.SendBackRequest(group="sb", message=msg, delay_level=1))
    assert back.status.code == OK and back.destination_topic == "%RETRY%sb"
    retry_q = qref("%RETRY%sb", 0)

    def retried():
        r = stubs.admin.PullBatch(lab.PullBatchRequest(group="sb", queue=retry_q, max_messages=4))
        return r.messages if r.pull_status == lab.FOUND else None

    (again,) = wait_until(retried, timeout=15, message="the delayed retry message")
    assert again.body == b"fail me" and again.reconsume_times == 1 and again.message_id == msg.message_id
    assert again.properties["RETRY_TOPIC"] == "BackTopic"
    # Reconsume times at the max: straight to the DLQ.
    again.reconsume_times = 3
    dead = stubs.admin.SendBack(lab.SendBackRequest(group="sb", message=again, max_reconsume_times=3))
    assert dead.destination_topic == "%DLQ%sb"
    dlq = stubs.admin.PullBatch(lab.PullBatchRequest(group="x", queue=qref("%DLQ%sb", 0), max_messages=4))
    assert [m.body for m in dlq.messages] == [b"fail me"]
    assert dlq.messages[0].properties["DLQ_ORIGIN_TOPIC"] == "BackTopic"


def test_queue_locks(stubs):
    queues = [qref("TopicTest", 0), qref("TopicTest", 1)]
    a = stubs.admin.LockQueues(lab.LockQueuesRequest(group="lockers", client_id="c1", queues=queues))
    assert [q.queue_id for q in a.locked] == [0, 1]
    b = stubs.admin.LockQueues(lab.LockQueuesRequest(group="lockers", client_id="c2", queues=queues))
    assert list(b.locked) == []
    other_group = stubs.admin.LockQueues(lab.LockQueuesRequest(group="others", client_id="c2", queues=queues))
    assert len(other_group.locked) == 2
    released = stubs.admin.UnlockQueues(lab.LockQueuesRequest(group="lockers", client_id="c1", queues=queues[:1]))
    assert released.status.code == OK and list(released.locked) == []
    b = stubs.admin.LockQueues(lab.LockQueuesRequest(group="lockers", client_id="c2", queues=queues))
    assert [q.queue_id for q in b.locked] == [0]


def test_fifo_group_gets_every_queue(stubs):
    req = svc.QueryAssignmentRequest(topic=v2.Resource(name="TopicTest"), group=v2.Resource(name="normal-g"))
    normal = stubs.v2.QueryAssignment(req, metadata=stubs.md)
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in normal.assignments] == \
        [("broker-a", -1), ("broker-b", -1)]
    cfg = stubs.admin.UpdateGroup(lab.GroupConfigRequest(group="fifo-g", fifo=True))
    assert cfg.status.code == OK and cfg.fifo
    req.group.name = "fifo-g"
    fifo = stubs.v2.QueryAssignment(req, metadata=stubs.md)
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in fifo.assignments] == \
        [("broker-a", q) for q in range(4)] + [("broker-b", q) for q in range(4)]


class Watcher(threading.Thread):
    def __init__(self, address, group):
        super().__init__(daemon=True)
        self.stubs = BrokerStubs(address)
        self.group = group
        self.changes = queue.Queue()
        self.call = None

    def run(self):
        self.call = self.stubs.admin.WatchMembership(lab.GroupRequest(group=self.group))
        try:
            for change in self.call:
                self.changes.put(change)
        except Exception:
            pass

    def next(self, timeout=15):
        return self.changes.get(timeout=timeout)

    def close(self):
        if self.call is not None:
            self.call.cancel()
        self.stubs.close()


def heartbeat(stubs, group):
    return stubs.v2.Heartbeat(svc.HeartbeatRequest(group=v2.Resource(name=group), client_type=v2.PUSH_CONSUMER),
                              metadata=stubs.md)


def test_membership_watch_join_leave_expire(broker, stubs_for):
    group = "watched-group"
    watcher = Watcher(broker.address, group)
    watcher.start()
    try:
        first = watcher.next()
        assert first.reason == "initial" and list(first.client_ids) == []
        c10, c2 = stubs_for(broker.address, "c10"), stubs_for(broker.address, "c2")
        assert heartbeat(c2, group).status.code == OK
        change = watcher.next()
        assert (change.reason, list(change.joined), list(change.client_ids)) == ("joined", ["c2"], ["c2"])
        heartbeat(c10, group)
        change = watcher.next()
        assert list(change.client_ids) == ["c10", "c2"]  # sorted as Java sorts strings
        members = c2.admin.ListGroupMembers(lab.GroupRequest(group=group))
        assert members.status.code == OK and list(members.client_ids) == ["c10", "c2"]

        bye = c10.v2.NotifyClientTermination(svc.NotifyClientTerminationRequest(group=v2.Resource(name=group)),
                                             metadata=c10.md)
        assert bye.status.code == OK
        change = watcher.next()
        assert (change.reason, list(change.left), list(change.client_ids)) == ("left", ["c10"], ["c2"])

        # c2 goes silent: expired after --client-expiry-ms (4 s here), scanned every 200 ms.
        change = watcher.next(timeout=20)
        assert (change.reason, list(change.left), list(change.client_ids)) == ("expired", ["c2"], [])
        assert change.ts > 0
    finally:
        watcher.close()


def test_session_watches_answers_by_id_and_its_close_is_the_members_leave(broker, stubs_for):
    group = "session-group"
    member = stubs_for(broker.address, "s1")
    requests = queue.Queue()
    call = member.admin.Session(iter(requests.get, None), metadata=member.md)
    try:
        requests.put(lab.SessionRequest(watch=lab.GroupRequest(group=group)))
        first = next(call)
        assert first.change.reason == "initial" and first.id == 0
        assert heartbeat(member, group).status.code == OK
        joined = next(call).change
        assert (joined.reason, list(joined.client_ids)) == ("joined", ["s1"])
        asked = lab.QueueOffsetsRequest(topic="TopicTest", group=group, queues=[qref("TopicTest", 2)])
        requests.put(lab.SessionRequest(id=7, queue_offsets=asked))
        answer = next(call)
        assert answer.id == 7 and answer.queue_offsets.status.code == OK
        assert [(q.queue.queue_id, q.committed_offset) for q in answer.queue_offsets.queues] == [(2, -1)]
        wrong = lab.QueueOffsetsRequest(topic="TopicTest", queues=[qref("TopicTest", 9)])
        requests.put(lab.SessionRequest(id=8, queue_offsets=wrong))
        answer = next(call)
        assert answer.id == 8 and answer.queue_offsets.status.code == Code.NOT_FOUND
    finally:
        call.cancel()
        requests.put(None)
    # The session was the member's connection: closing it is the member leaving at once.
    wait_until(lambda: list(member.admin.ListGroupMembers(lab.GroupRequest(group=group)).client_ids) == [],
               message="the member whose session closed is gone")


def test_membership_keeps_each_groups_recent_departures_with_how_they_went(monkeypatch):
    """What the lab-only GET_CONSUMER_DEPARTURES answers (pure, on a clock of the test's):
    a goodbye, a closed connection and an expiry each kept with its reason, oldest first,
    per group; at most DEPARTURES_KEPT of a group, for DEPARTURE_TTL_S; a group whose
    departures all aged out is forgotten, so groups coming and going hold it flat."""
    now = [1000.0]
    monkeypatch.setattr(membership, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    m = membership.Membership(channel_expired_ms=10_000)
    for group, client_id in (("G", "bye"), ("G", "killed"), ("G", "silent"), ("H", "other")):
        m.heartbeat(group, client_id)
    m.open_session("G", "killed")
    now[0] += 6
    m.heartbeat("H", "other")
    m.unregister("G", "bye", "left")
    m.close_session("G", "killed")
    assert not m.unregister("G", "never-there", "left")
    now[0] += 6   # "silent" 12 s without a heartbeat: past the 10 s expiry
    m.scan_expired()
    got = m.departures("G")
    assert [(d["clientId"], d["reason"]) for d in got] == [("bye", "left"), ("killed", "closed"), ("silent", "expired")]
    assert all(d["ts"] > 0 for d in got) and m.departures("H") == [] and m.members("H") == ["other"]
    m.unregister("H", "other", "left")

    for i in range(membership.DEPARTURES_KEPT + 5):
        m.heartbeat("G", f"c{i}")
        m.unregister("G", f"c{i}", "left")
    kept = [d["clientId"] for d in m.departures("G")]
    assert kept == [f"c{i}" for i in range(5, membership.DEPARTURES_KEPT + 5)]

    now[0] += membership.DEPARTURE_TTL_S + 1
    m.scan_expired()
    assert m.departures("G") == [] and m._departures == {}
