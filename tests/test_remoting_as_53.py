"""Our broker over remoting answering as Apache RocketMQ 5.3's broker answers the same
request (issue 24): each test names the Java class and method it follows. Real broker
process, raw remoting connections."""
from __future__ import annotations

import json

import pytest

from consumers_app.remoting import wire

from .brokers import BrokerProcess
from .remoting_peers import Raw, call

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
