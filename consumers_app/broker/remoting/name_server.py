"""The name server's answers: topic routes, the cluster, the topic list (RocketMQ's
DefaultRequestProcessor). Routes name every online logical broker hosting the topic,
each at its own remoting address, so clients connect to each one as to a real broker.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from consumers_app.remoting import wire
from consumers_app.remoting.codec import Command, response

if TYPE_CHECKING:
    from .service import RemotingService

CLUSTER = "DefaultCluster"


class NameServerRequests:
    def __init__(self, service: "RemotingService"):
        self.service = service
        self.core = service.core
        self.handlers = {
            wire.GET_ROUTEINFO_BY_TOPIC: self.route,
            wire.GET_BROKER_CLUSTER_INFO: self.cluster_info,
            wire.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.topic_list,
        }

    async def handle(self, conn, cmd: Command) -> Command | None:
        handler = self.handlers.get(cmd.code)
        return None if handler is None else await handler(conn, cmd)

    def _broker_data(self, broker: str) -> dict:
        return {"cluster": CLUSTER, "brokerName": broker,
                "brokerAddrs": {wire.MASTER_ID: self.service.broker_address(broker)}}

    async def route(self, conn, cmd: Command) -> Command:
        topic = cmd.text("topic") or ""
        config = self.core.topics.get(topic)
        brokers = [b for b in sorted(config.queues if config else ()) if await self.service.listening(b)]
        if not brokers:
            return response(cmd, wire.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
        route = {
            "orderTopicConf": None,
            "queueDatas": [{"brokerName": b, "readQueueNums": config.queues[b], "writeQueueNums": config.queues[b],
                            "perm": wire.PERM_READ_WRITE, "topicSysFlag": 0} for b in brokers],
            "brokerDatas": [self._broker_data(b) for b in brokers],
            "filterServerTable": {},
        }
        return response(cmd, body=wire.dumps(route))

    async def cluster_info(self, conn, cmd: Command) -> Command:
        online = [b for b in sorted(self.core.topics.brokers) if await self.service.listening(b)]
        return response(cmd, body=wire.dumps({
            "brokerAddrTable": {b: self._broker_data(b) for b in online},
            "clusterAddrTable": {CLUSTER: online},
        }))

    async def topic_list(self, conn, cmd: Command) -> Command:
        return response(cmd, body=wire.dumps({"topicList": sorted(self.core.topics.topics)}))
