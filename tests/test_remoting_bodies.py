"""The answers' bodies read once (consumers_app.remoting.bodies): broker masters of a route
and of the cluster info, and the queues a running info says its client holds."""
from __future__ import annotations

from consumers_app.message_queue import MessageQueue
from consumers_app.remoting import wire
from consumers_app.remoting.bodies import cluster_masters, held_queues, master_address, route_masters


def test_masters_of_a_route_as_fastjson_writes_it():
    route = wire.loads(b'{"brokerDatas":[{"brokerName":"broker-a","brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"}},'
                       b'{"brokerName":"broker-b","brokerAddrs":{1:"127.0.0.1:10931"}}],"queueDatas":[]}')
    assert route_masters(route) == {"broker-a": "127.0.0.1:10911"}   # broker-b has only a slave
    assert route_masters({}) == {}
    assert master_address({"brokerAddrs": {0: "10.0.0.1:10911"}}) == "10.0.0.1:10911"   # a number key
    assert master_address({}) == ""


def test_masters_of_the_cluster_info():
    info = wire.loads(b'{"brokerAddrTable":{"broker-a":{"brokerName":"broker-a","brokerAddrs":{0:"h:1"}},'
                      b'"broker-b":{"brokerName":"broker-b","brokerAddrs":{}}},"clusterAddrTable":{}}')
    assert cluster_masters(info) == {"broker-a": "h:1"}
    assert cluster_masters({}) == {}


def test_held_queues_are_the_mq_table_without_dropped_ones():
    body = wire.dumps({"properties": {}, "mqTable": {
        wire.message_queue_key("T", "broker-a", 0): {"cachedMsgCount": 3, "droped": False},
        wire.message_queue_key("T", "broker-a", 1): {"cachedMsgCount": 0, "droped": True},
        wire.message_queue_key("U", "broker-b", 2): {"cachedMsgCount": 1}}})
    held = held_queues(wire.loads(body))
    assert held == {MessageQueue("T", "broker-a", 0): {"cachedMsgCount": 3, "droped": False},
                    MessageQueue("U", "broker-b", 2): {"cachedMsgCount": 1}}
    assert held_queues({"mqTable": {}}) == {} == held_queues(None) == held_queues({})
