"""RocketMQ's remoting protocol on the real broker: the name server, a logical broker's
port, an independent client (ali-ons, Node.js) producing and consuming unchanged, and
frames that cannot be read."""
from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import threading

import pytest

from consumers_app.remoting import wire
from consumers_app.remoting.codec import FLAG_ONEWAY, Command, encode
from consumers_app.client.config import ConsumeResult

from .brokers import BrokerProcess
from .remoting_peers import AliOns, Cpp, Raw, call, require_ali_ons, require_cpp
from .push_consumers import push
from .support import async_wait_until, produce, wait_until

TOPIC = "TopicTest"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("remoting"), topics=[f"{TOPIC}:8"], remoting=True,
                       extra_args=["--client-expiry-ms", "120000"]) as b:
        yield b


def broker_address(namesrv: str, topic: str = TOPIC) -> str:
    route = wire.loads(call(namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).body)
    return route["brokerDatas"][0]["brokerAddrs"]["0"]


def members(addr: str, group: str) -> list[str]:
    answer = call(addr, wire.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    return wire.loads(answer.body)["consumerIdList"] if answer.code == wire.SUCCESS else []


# ------------------------------------------------------------------ the protocol itself

@pytest.mark.parametrize("binary", [False, True], ids=["json-header", "rocketmq-header"])
def test_the_name_server_routes_a_topic_to_its_broker_port(broker, binary):
    answer = call(broker.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}, binary=binary)
    assert (answer.code, answer.flag & 1) == (wire.SUCCESS, 1)
    assert b'"brokerAddrs":{0:"' in answer.body            # fastjson's bare integer key, as real brokers send
    route = wire.loads(answer.body)
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]] \
        == [("broker-a", 8, 8, 6)]
    addr = route["brokerDatas"][0]["brokerAddrs"]["0"]
    assert addr == f"127.0.0.1:{broker.remoting_port}"
    # The broker's own answers: offsets of a queue, all extFields strings.
    offsets = call(addr, wire.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0}, binary=binary)
    assert offsets.code == wire.SUCCESS and isinstance(offsets.ext["offset"], str)


def test_unknown_topics_and_codes_get_rocketmq_answers(broker):
    missing = call(broker.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"})
    assert missing.code == wire.TOPIC_NOT_EXIST and "NoSuchTopic" in missing.remark
    unknown = call(broker_address(broker.namesrv), 9999)
    assert unknown.code == wire.REQUEST_CODE_NOT_SUPPORTED and "9999" in unknown.remark
    topics = wire.loads(call(broker.namesrv, wire.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)["topicList"]
    assert TOPIC in topics
    cluster = wire.loads(call(broker.namesrv, wire.GET_BROKER_CLUSTER_INFO).body)
    assert cluster["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}


def test_frames_that_cannot_be_read_close_only_their_connection(broker):
    """Thousands of random and mutated frames at the name server and a broker port; a
    connection opened before them, and new ones after, still get answers."""
    addr = broker_address(broker.namesrv)
    bystander = Raw(addr)
    assert bystander.call(wire.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 1}).code == wire.SUCCESS
    rng = random.Random(20261125)
    good = encode(Command(wire.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}, opaque=7))
    frames = [
        struct.pack(">I", 2) + b"xx",                                       # shorter than its header length
        struct.pack(">II", 8, 1000) + b"abcd",                              # header longer than the frame
        struct.pack(">II", 8, (7 << 24) | 2) + b"{}",                       # unknown serialize type
        struct.pack(">II", 12, 8) + b"{not json",                           # malformed JSON
        struct.pack(">I", 64 * 1024 * 1024),                                # over the 16 MiB frame limit
    ]
    for _ in range(3000):
        kind = rng.random()
        if kind < 0.4:
            frames.append(rng.randbytes(rng.randrange(1, 200)))
        elif kind < 0.8:
            mutated = bytearray(good)
            for _ in range(rng.randrange(1, 6)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            frames.append(bytes(mutated))
        else:
            frames.append(good[:rng.randrange(1, len(good))])              # cut short
    host = "127.0.0.1"
    for i, frame in enumerate(frames):
        port = broker.namesrv_port if i % 2 else broker.remoting_port
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(frame)
    assert broker.proc.poll() is None, "the broker survived"
    assert bystander.call(wire.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 1}).code == wire.SUCCESS
    bystander.close()
    assert call(broker.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}).code == wire.SUCCESS


def heartbeat(conn: Raw, client_id: str, group: str) -> None:
    body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}]}]})
    assert conn.call(wire.HEART_BEAT, body=body.encode()).code == wire.SUCCESS


def test_members_are_notified_and_what_dashboards_ask_is_answered(broker):
    addr, group = broker_address(broker.namesrv), "GID_RAW"
    first, second = Raw(addr), Raw(addr)
    try:
        heartbeat(first, "raw-1", group)
        heartbeat(second, "raw-2", group)
        # raw-1 hears of raw-2 (NOTIFY_CONSUMER_IDS_CHANGED, oneway), then of its death.
        notice = first.read_command()
        assert (notice.code, notice.ext, notice.is_oneway) == (wire.NOTIFY_CONSUMER_IDS_CHANGED,
                                                               {"consumerGroup": group}, True)
        assert members(addr, group) == ["raw-1", "raw-2"]
        second.close()
        assert first.read_command().code == wire.NOTIFY_CONSUMER_IDS_CHANGED
        wait_until(lambda: members(addr, group) == ["raw-1"], timeout=5, message="raw-2 dropped on close")

        # mqadmin's questions: per-queue stats keyed by MessageQueue objects, as fastjson writes them.
        stats = call(addr, wire.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
        assert stats.code == wire.SUCCESS
        assert stats.body.count(b'{"brokerName":"broker-a","queueId":') == 8
        assert call(addr, wire.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": TOPIC, "queueId": 3,
                                                        "commitOffset": 0}).code == wire.SUCCESS
        consume = call(addr, wire.GET_CONSUME_STATS, {"consumerGroup": group, "topic": TOPIC})
        assert consume.code == wire.SUCCESS and b'"queueId":3,"topic":"TopicTest"}:{"brokerOffset":' in consume.body
        connections = wire.loads(call(addr, wire.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}).body)
        assert [c["clientId"] for c in connections["connectionSet"]] == ["raw-1"]
        assert list(connections["subscriptionTable"]) == [TOPIC]

        # GET_CONSUMER_RUNNING_INFO goes to the client over its own connection; its answer comes back.
        asked = {}
        thread = threading.Thread(target=lambda: asked.setdefault("answer", call(
            addr, wire.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": group, "clientId": "raw-1"})))
        thread.start()
        request = first.read_command()
        assert (request.code, request.ext["clientId"]) == (wire.GET_CONSUMER_RUNNING_INFO, "raw-1")
        first.answer(request, b'{"properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY"}}')
        thread.join(10)
        assert asked["answer"].code == wire.SUCCESS and b"PROP_CONSUME_TYPE" in asked["answer"].body
        missing = call(addr, wire.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": group, "clientId": "nobody"})
        assert missing.code == wire.SYSTEM_ERROR and "not online" in missing.remark
    finally:
        first.close()
        second.close()


def test_the_lab_only_departures_request_says_how_each_member_went(broker):
    """GET_CONSUMER_DEPARTURES (20010, lab-only; a real broker does not support it): a
    goodbye (UNREGISTER_CLIENT) is "left", a connection closed without one "closed". A
    goodbye sent oneway with the close right behind it is "left" too: the broker starts each
    request it read before it notices the end of the stream, so the close finds it gone."""
    addr, group = broker_address(broker.namesrv), "GID_DEPARTURES"
    conns = {name: Raw(addr) for name in ("stay", "bye", "killed", "hasty")}
    try:
        for name, conn in conns.items():
            heartbeat(conn, f"dep-{name}", group)
        goodbye = {"clientID": "dep-bye", "consumerGroup": group, "producerGroup": ""}
        assert conns["bye"].call(wire.UNREGISTER_CLIENT, goodbye).code == wire.SUCCESS
        conns["killed"].close()
        conns["hasty"].sock.sendall(encode(Command(wire.UNREGISTER_CLIENT, {**goodbye, "clientID": "dep-hasty"},
                                                   opaque=7, flag=FLAG_ONEWAY)))
        conns["hasty"].close()
        wait_until(lambda: members(addr, group) == ["dep-stay"], timeout=5, message="three of four gone")
        answer = call(addr, wire.GET_CONSUMER_DEPARTURES, {"consumerGroup": group})
        assert answer.code == wire.SUCCESS, answer.remark
        departures = wire.loads(answer.body)["departures"]
        assert {d["clientId"]: d["reason"] for d in departures} == {
            "dep-bye": "left", "dep-killed": "closed", "dep-hasty": "left"}
        assert wire.loads(call(addr, wire.GET_CONSUMER_DEPARTURES, {"consumerGroup": "GID_NOBODY"}).body) == {
            "departures": []}
    finally:
        for conn in conns.values():
            conn.close()


# ------------------------------------------------------------------ ali-ons, unchanged

def queues_by_consumer(peers, ids: set[str]) -> dict[str, set]:
    """Which consumers received messages of each queue, among the messages ``ids``."""
    out: dict = {}
    for name, peer in peers.items():
        for m in peer.messages:
            if m["id"] in ids:
                out.setdefault((m.get("broker"), m["queue"]), set()).add(name)
    return out


PEERS = pytest.mark.parametrize("peer, require", [(AliOns, require_ali_ons), (Cpp, require_cpp)],
                                ids=["ali-ons", "rocketmq-cpp"])


@PEERS
def test_two_consumers_of_a_peer_share_the_queues_and_a_killed_one_hands_over(broker, peer, require):
    require()
    group = f"GID_{peer.__name__.upper()}_2"
    addr = broker_address(broker.namesrv)
    # "a" first, alone: it takes all 8, then gives "b" its share when "b" joins. "b" never
    # held a queue it gives up, so it is the survivor: rocketmq-client-cpp 2.1 cannot pull
    # again a queue it dropped and gets back soon after (see the README), whatever the broker.
    peers = {"a": peer.consume(broker.namesrv, group, TOPIC)}
    try:
        peers["a"].wait_ready()
        wait_until(lambda: len(members(addr, group)) == 1, timeout=20, message="the first registered")
        peers["b"] = peer.consume(broker.namesrv, group, TOPIC)
        peers["b"].wait_ready()
        wait_until(lambda: len(members(addr, group)) == 2, timeout=20, message="both registered")

        # Messages from a gRPC producer reach them; once settled (ali-ons rebalances on its
        # own 10 s timer, the C++ client on the broker's notice), each queue is pulled by
        # exactly one of the two.
        everything: set[str] = set()

        def settled_batch():
            sent = asyncio.run(produce(broker.address, TOPIC, 80, batch=1))   # one queue per send
            everything.update(sent)
            wait_until(lambda: sent <= {m["id"] for p in peers.values() for m in p.messages}, timeout=20,
                       message="a batch received")
            owners = queues_by_consumer(peers, sent)
            return len(owners) == 8 and all(len(o) == 1 for o in owners.values()) \
                and {n for o in owners.values() for n in o} == {"a", "b"}

        wait_until(settled_batch, timeout=60, interval=0.5, message="each queue pulled by exactly one consumer")
        assert everything <= {m["id"] for p in peers.values() for m in p.messages}, "nothing lost"

        # SIGKILL: the connection closes, the broker drops it at once and notifies the
        # survivor, which takes all 8 (ali-ons at its next 10 s rebalance, the C++ client at once).
        peers["a"].kill()
        wait_until(lambda: len(members(addr, group)) == 1, timeout=10, message="the killed consumer dropped at once")

        def survivor_has_all():
            sent = asyncio.run(produce(broker.address, TOPIC, 40, batch=1))
            wait_until(lambda: sent <= {m["id"] for m in peers["b"].messages}, timeout=30,
                       message="the survivor received the batch")
            return len(queues_by_consumer({"b": peers["b"]}, sent)) == 8

        wait_until(survivor_has_all, timeout=60, interval=0.5, message="the survivor pulls all 8 queues")
    finally:
        for process in peers.values():
            process.stop()


@PEERS
async def test_a_peer_producer_reaches_a_grpc_push_consumer(broker, peer, require):
    require()
    producer = peer.produce(broker.namesrv, TOPIC, 50)
    await asyncio.to_thread(producer.wait_for, lambda: any("done" in x for x in producer.lines), 30,
                            "the peer sent 50")
    results = [x for x in producer.lines if "sent" in x]
    assert len({x["sent"] for x in results}) == 50 and {x["status"] for x in results} <= {"SEND_OK", "OK"}
    # A send result's id is the client's choice: ali-ons shows the broker's msgId (the offset
    # message id, as a 5.3 broker answers), the C++ client its own UNIQ_KEY. The bodies say it all.
    prefix = "ali-ons" if peer is AliOns else "cpp"
    sent = {f"{prefix} {i}".encode() for i in range(50)}
    received = set()

    def listener(msgs):
        received.update(m.body for m in msgs)
        return ConsumeResult.SUCCESS

    consumer = push(broker.address, f"GID_FROM_{peer.__name__.upper()}", TOPIC, "g1", listener)
    await consumer.start()
    try:
        await async_wait_until(lambda: sent <= received, timeout=30, message="every message the peer sent")
    finally:
        await consumer.shutdown()


def test_the_official_v5_producer_reaches_an_ali_ons_consumer(broker, official_client_thread_loop):
    """gRPC in (the official rocketmq-python-client, unchanged), remoting out (ali-ons)."""
    require_ali_ons()
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    consumer = AliOns.consume(broker.namesrv, "GID_FROM_OFFICIAL", TOPIC)
    producer = Producer(ClientConfiguration(broker.address, Credentials()), (TOPIC,))
    producer.startup()
    try:
        consumer.wait_ready()
        sent = set()
        for i in range(30):
            m = Message()
            m.topic, m.body, m.tag = TOPIC, f"official {i}".encode(), "TagO"
            sent.add(producer.send(m).message_id)
        consumer.wait_for(lambda: sent <= {x["id"] for x in consumer.messages}, 30, "every official message")
        bodies = {x["body"] for x in consumer.messages if x["id"] in sent}
        assert bodies == {f"official {i}" for i in range(30)}
    finally:
        producer.shutdown()
        consumer.stop()


def test_orderly_locks_are_one_table_across_clients_and_protocols(broker):
    """LOCK_BATCH_MQ from one remoting client keeps the queues from another client, over
    remoting or gRPC, until UNLOCK_BATCH_MQ (RebalanceLockManager)."""
    import grpc

    from consumers_app.protocol import lab, lab_grpc

    addr, group = broker_address(broker.namesrv), "GID_LOCKS"

    def body(client_id, queues):
        return json.dumps({"consumerGroup": group, "clientId": client_id, "mqSet": [
            {"topic": TOPIC, "brokerName": "broker-a", "queueId": q} for q in queues]}).encode()

    def locked(answer):
        return sorted(q["queueId"] for q in wire.loads(answer.body)["lockOKMQSet"])

    assert locked(call(addr, wire.LOCK_BATCH_MQ, body=body("java-1", [0, 1, 2]))) == [0, 1, 2]
    assert locked(call(addr, wire.LOCK_BATCH_MQ, body=body("java-2", [1, 2, 3]))) == [3]
    with grpc.insecure_channel(broker.address) as channel:
        ours = lab_grpc.LabAdminStub(channel).LockQueues(lab.LockQueuesRequest(
            group=group, client_id="ours-1", queues=[lab.QueueRef(topic=TOPIC, broker_name="broker-a", queue_id=q)
                                                     for q in (0, 4)]), timeout=5)
        assert [q.queue_id for q in ours.locked] == [4]
    assert call(addr, wire.UNLOCK_BATCH_MQ, body=body("java-1", [0, 1, 2])).code == wire.SUCCESS
    assert locked(call(addr, wire.LOCK_BATCH_MQ, body=body("java-2", [1, 2]))) == [1, 2]
