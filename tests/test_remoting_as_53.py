"""Our broker over remoting answering as Apache RocketMQ 5.3's broker answers the same
request (issue 24): each test names the Java class and method it follows. Real broker
process, raw remoting connections."""
from __future__ import annotations

import json

import pytest

from consumers_app.remoting import wire

from .brokers import BrokerProcess
from .remoting_peers import Raw, call
from .support import wait_until
from .test_broker_admin import Watcher

TOPIC = "TopicAs53"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # A silent client expires after 3 s (5.3: 120 s), scanned every 250 ms (5.3: 10 s).
    with BrokerProcess(tmp_path_factory.mktemp("as53"), topics=[f"{TOPIC}:4"], remoting=True,
                       extra_args=["--client-expiry-ms", "3000", "--client-scan-ms", "250"]) as b:
        yield b


@pytest.fixture(scope="module")
def addr(broker) -> str:
    route = wire.loads(call(broker.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}).body)
    return route["brokerDatas"][0]["brokerAddrs"]["0"]


def send(addr: str, body: bytes, queue: int, uniq_key: str, code: int = wire.SEND_MESSAGE_V2):
    """SEND_MESSAGE_V2 as Java's producer sends it (UNIQ_KEY set by MessageClientIDSetter)."""
    props = wire.properties_to_string({wire.P_UNIQ_KEY: uniq_key, "WAIT": "true"})
    ext = {"a": "PG_AS53", "b": TOPIC, "c": "TBW102", "d": 4, "e": queue, "f": 0, "g": 1, "h": 0,
           "i": props, "j": 0, "k": False}
    return call(addr, code, ext, body)


# ------------------------------------------------------------------ PullMessageProcessor

def test_lite_pull_message_is_served_as_pull_message(addr):
    """BrokerController.registerProcessor(LITE_PULL_MESSAGE, pullMessageProcessor): 5.3
    serves DefaultLitePullConsumerImpl's pull (sysFlag: subscription | lite pull, no
    suspend, commitOffset 0) exactly as PULL_MESSAGE."""
    for i in range(3):
        assert send(addr, f"lite {i}".encode(), 2, f"LITE-{i}").code == wire.SUCCESS
    header = {"consumerGroup": "GID_LITE_AS53", "topic": TOPIC, "queueId": 2, "queueOffset": 0,
              "maxMsgNums": 32, "sysFlag": wire.PULL_SUBSCRIPTION | 0x10, "commitOffset": 0,
              "suspendTimeoutMillis": 20000, "subscription": "*", "subVersion": 0, "expressionType": "TAG"}
    lite = call(addr, wire.LITE_PULL_MESSAGE, header)
    assert lite.code == wire.SUCCESS, lite.remark
    pulled = wire.decode_messages(lite.body)
    assert [(m["body"], m["queue_offset"], m["properties"][wire.P_UNIQ_KEY]) for m in pulled] == \
        [(f"lite {i}".encode(), i, f"LITE-{i}") for i in range(3)]
    assert lite.ext["nextBeginOffset"] == "3"
    # The same request as PULL_MESSAGE gets the same answer.
    plain = call(addr, wire.PULL_MESSAGE, header)
    assert (plain.code, plain.ext["nextBeginOffset"], plain.body) == (lite.code, lite.ext["nextBeginOffset"], lite.body)


# ------------------------------------------------------------------ ConsumerManager

def heartbeat(conn: Raw, client_id: str, group: str) -> None:
    body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}]}]})
    assert conn.call(wire.HEART_BEAT, body=body.encode()).code == wire.SUCCESS


def members(addr: str, group: str) -> list[str]:
    answer = call(addr, wire.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    return wire.loads(answer.body)["consumerIdList"] if answer.code == wire.SUCCESS else []


def notices(conn: Raw, group: str) -> int:
    return sum(1 for c in conn.received if c.code == wire.NOTIFY_CONSUMER_IDS_CHANGED
               and c.ext.get("consumerGroup") == group)


def closed_by_broker(conn: Raw) -> bool:
    """Reads what the broker sent until it closes the connection (True) or is silent for
    the socket's timeout (False)."""
    try:
        while True:
            conn.read_command()
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_an_expired_client_is_dropped_without_a_notice_and_its_channel_closed(addr, broker):
    """ConsumerManager.scanNotActiveChannel (5.3): an expired channel fires CLIENT_UNREGISTER,
    which DefaultConsumerIdsChangeListener.handle ignores (no CHANGE: no
    NOTIFY_CONSUMER_IDS_CHANGED), and RemotingHelper.closeChannel closes it. A closed
    connection is still noticed at once: ClientHousekeepingService.onChannelClose ->
    ConsumerManager.doChannelCloseEvent fires CHANGE."""
    group = "GID_EXPIRY_AS53"
    survivor, silent, killed = Raw(addr), Raw(addr), Raw(addr)
    watcher = Watcher(broker.address, group)
    watcher.start()
    try:
        assert watcher.next().reason == "initial"
        heartbeat(survivor, "as53-1", group)
        heartbeat(silent, "as53-2", group)
        heartbeat(killed, "as53-3", group)
        assert [watcher.next().reason for _ in range(3)] == ["joined"] * 3

        killed.close()   # a process death: the connection closes
        assert (watcher.next().reason, members(addr, group)) == ("closed", ["as53-1", "as53-2"])
        heartbeat(survivor, "as53-1", group)   # its answer follows every notice sent before it
        assert notices(survivor, group) == 4, "three joins (its own too) and the close"

        def silent_expired():
            heartbeat(survivor, "as53-1", group)
            return members(addr, group) == ["as53-1"]

        wait_until(silent_expired, timeout=30, interval=0.3, message="the silent client expired")
        change = watcher.next()
        assert (change.reason, list(change.left)) == ("expired", ["as53-2"])
        heartbeat(survivor, "as53-1", group)
        assert notices(survivor, group) == 4, "no NOTIFY_CONSUMER_IDS_CHANGED for an expiry"
        assert closed_by_broker(silent), "the broker closed the expired client's channel"
    finally:
        watcher.close()
        for conn in (survivor, silent, killed):
            conn.close()


def test_unregister_client_ends_the_session_so_a_returning_client_killed_is_noticed_at_once(addr, broker):
    """ConsumerManager.unregisterConsumer removes the client's channel from the group: if
    the same client id heartbeats again, that is a new registration, and closing its
    connection is doChannelCloseEvent at once, not an expiry later."""
    group = "GID_UNREGISTER_AS53"
    survivor, returning = Raw(addr), Raw(addr)
    watcher = Watcher(broker.address, group)
    watcher.start()
    try:
        assert watcher.next().reason == "initial"
        heartbeat(survivor, "as53-stay", group)
        heartbeat(returning, "as53-back", group)
        assert [watcher.next().reason for _ in range(2)] == ["joined"] * 2
        assert returning.call(wire.UNREGISTER_CLIENT, {"clientID": "as53-back", "consumerGroup": group,
                                                       "producerGroup": ""}).code == wire.SUCCESS
        assert (watcher.next().reason, members(addr, group)) == ("left", ["as53-stay"])
        heartbeat(returning, "as53-back", group)   # it comes back on the same connection
        assert watcher.next().reason == "joined"
        returning.close()
        change = watcher.next()
        assert (change.reason, list(change.left)) == ("closed", ["as53-back"])
        heartbeat(survivor, "as53-stay", group)
        assert notices(survivor, group) == 5, "two joins, the leave, the join again, the close"
    finally:
        watcher.close()
        survivor.close()
        returning.close()


# ------------------------------------------------------------------ SendMessageProcessor

def pull(addr: str, queue: int, offset: int, n: int = 32) -> list[dict]:
    answer = call(addr, wire.PULL_MESSAGE, {"consumerGroup": "GID_READ_AS53", "topic": TOPIC, "queueId": queue,
                                            "queueOffset": offset, "maxMsgNums": n, "sysFlag": 0,
                                            "commitOffset": 0, "suspendTimeoutMillis": 0})
    assert answer.code == wire.SUCCESS, answer.remark
    return wire.decode_messages(answer.body)


def offset_id(pulled: dict) -> str:
    host, port = pulled["store_host"].rsplit(":", 1)
    return wire.offset_message_id((host, int(port)), pulled["commit_log_offset"])


@pytest.mark.parametrize("code", [wire.SEND_MESSAGE, wire.SEND_MESSAGE_V2])
def test_send_answers_the_offset_message_id_and_keeps_the_uniq_key(addr, code):
    """SendMessageProcessor.handlePutMessageResult: msgId is AppendMessageResult.getMsgId(),
    MessageDecoder.createMessageId(store host, commit-log offset); transactionId is the
    client's UNIQ_KEY, which the stored message keeps."""
    uniq = f"UNIQ-AS53-{code}"
    props = wire.properties_to_string({wire.P_UNIQ_KEY: uniq, wire.P_TAGS: "TagS"})
    if code == wire.SEND_MESSAGE:
        ext = {"producerGroup": "PG_AS53", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
               "queueId": 1, "sysFlag": 0, "bornTimestamp": 1, "flag": 0, "properties": props, "reconsumeTimes": 0}
    else:
        ext = {"a": "PG_AS53", "b": TOPIC, "c": "TBW102", "d": 4, "e": 1, "f": 0, "g": 1, "h": 0, "i": props, "j": 0}
    answer = call(addr, code, ext, b"offset id")
    assert answer.code == wire.SUCCESS, answer.remark
    stored = pull(addr, 1, int(answer.ext["queueOffset"]), 1)[0]
    assert answer.ext["msgId"] == offset_id(stored) != uniq
    assert len(answer.ext["msgId"]) == 32                    # IPv4 store host: 4 + 4 + 8 bytes in hex
    assert answer.ext["transactionId"] == stored["properties"][wire.P_UNIQ_KEY] == uniq


def test_a_batch_answers_one_offset_message_id_per_message(addr):
    """CommitLog.DefaultAppendMessageCallback.doAppend (batch): the ids of every message,
    comma-joined, in the batch's order."""
    batch = wire.encode_batch([(f"batch {i}".encode(), {wire.P_UNIQ_KEY: f"UNIQ-BATCH-{i}"}, 0)
                               for i in range(3)])
    answer = call(addr, wire.SEND_BATCH_MESSAGE, {"a": "PG_AS53", "b": TOPIC, "c": "TBW102", "d": 4, "e": 3,
                                                  "f": 0, "g": 1, "h": 0, "i": "", "j": 0, "m": True}, batch)
    assert answer.code == wire.SUCCESS, answer.remark
    stored = pull(addr, 3, int(answer.ext["queueOffset"]), 3)
    assert answer.ext["msgId"].split(",") == [offset_id(m) for m in stored]
    assert [m["properties"][wire.P_UNIQ_KEY] for m in stored] == [f"UNIQ-BATCH-{i}" for i in range(3)]


# ------------------------------------------------------------------ AdminBrokerProcessor

def test_consume_stats_of_a_group_with_only_grpc_members_come_from_the_offset_table(addr, broker, stubs_for):
    """AdminBrokerProcessor.getConsumeStats: with no topic asked, the topics are the group's
    in the offset table (ConsumerOffsetManager.whichTopicByConsumer), whoever its members
    are; a group with none gets an empty table, SUCCESS."""
    from consumers_app.protocol import v2
    from consumers_app.protocol import v2_service as svc

    group = "GID_GRPC_ONLY_AS53"
    member = stubs_for(broker.address, "grpc-only-1")
    assert member.v2.Heartbeat(svc.HeartbeatRequest(group=v2.Resource(name=group), client_type=v2.PUSH_CONSUMER),
                               metadata=member.md).status.code == v2.Code.OK
    queue = v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=2, broker=v2.Broker(name="broker-a"))
    assert member.v2.UpdateOffset(svc.UpdateOffsetRequest(group=v2.Resource(name=group), message_queue=queue,
                                                          offset=1), metadata=member.md).status.code == v2.Code.OK
    assert members(addr, group) == ["grpc-only-1"]

    stats = call(addr, wire.GET_CONSUME_STATS, {"consumerGroup": group})
    assert stats.code == wire.SUCCESS, stats.remark
    table = {dict(key)["queueId"]: value for key, value in wire.loads(stats.body)["offsetTable"].items()}
    assert sorted(table) == [0, 1, 2, 3] and table[2]["consumerOffset"] == 1
    assert table[2]["brokerOffset"] >= 1 and table[0]["consumerOffset"] == 0

    nobody = call(addr, wire.GET_CONSUME_STATS, {"consumerGroup": "GID_NOBODY_AS53"})
    assert (nobody.code, wire.loads(nobody.body)["offsetTable"]) == (wire.SUCCESS, {})
