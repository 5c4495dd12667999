"""What the answers' bodies we rely on say, read in one place: the brokers' master
addresses of a topic route (GET_ROUTEINFO_BY_TOPIC) and of the cluster info
(GET_BROKER_CLUSTER_INFO), and the queues a client holds by its running info
(GET_CONSUMER_RUNNING_INFO's mqTable). Each takes the body as ``wire.loads`` reads it."""
from __future__ import annotations

from consumers_app.message_queue import MessageQueue

from .wire import MASTER_ID


def master_address(broker_data: dict) -> str:
    """A BrokerData's master (brokerId 0) address, "" when it has none. fastjson writes the
    id as a bare key (read as "0"); a body from elsewhere may carry it as a number."""
    addrs = broker_data.get("brokerAddrs") or {}
    return addrs.get(MASTER_ID) or addrs.get(str(MASTER_ID)) or ""


def route_masters(route: dict) -> dict[str, str]:
    """TopicRouteData: logical broker -> its master's address (brokers without one left out)."""
    return {data["brokerName"]: master for data in route.get("brokerDatas") or ()
            if (master := master_address(data))}


def cluster_masters(cluster_info: dict) -> dict[str, str]:
    """ClusterInfo's brokerAddrTable: logical broker -> its master's address."""
    return {name: master for name, data in (cluster_info.get("brokerAddrTable") or {}).items()
            if (master := master_address(data))}


def held_queues(running_info) -> dict[MessageQueue, dict]:
    """ConsumerRunningInfo's mqTable: each queue the client holds -> its ProcessQueueInfo.
    A queue its ProcessQueue marks dropped ("droped", Java's spelling) is not held."""
    table = running_info.get("mqTable") if isinstance(running_info, dict) else None
    queues = {}
    for key, info in (table or {}).items():
        mq = dict(key) if isinstance(key, tuple) else {}   # fastjson writes the MessageQueue as the key
        info = info if isinstance(info, dict) else {}
        if mq.get("topic") is None or info.get("droped"):
            continue
        queues[MessageQueue(mq["topic"], mq.get("brokerName", ""), int(mq.get("queueId", 0)))] = info
    return queues
