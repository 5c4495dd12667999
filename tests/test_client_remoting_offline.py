"""A broker taken offline while our remoting consumers share a topic on two brokers (the
real broker, its name server and broker ports): the survivors keep rebalancing, the
offline broker's queues leave the assignment, and come back when it does.

The member list is asked where 5.3's MQClientInstance.findConsumerIdList asks it
(findBrokerAddrByTopic): a broker of the topic's current route. A broker once seen and
now offline is never asked again; asking it would refuse the connection, and with no
member list a rebalance keeps what it has (the offline queues stay, a newcomer gets
nothing).
"""
import grpc
import pytest

from consumers_app.client import ConsumeFromWhere, ConsumeResult, PushConsumer, PushConsumerConfig
from consumers_app.protocol import lab, lab_grpc, v2
from tests.brokers import BrokerProcess
from tests.support import async_wait_until

TOPIC = "TopicOffline"
GROUP = "GID_OFFLINE"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("offline"), topics=[f"{TOPIC}:4@broker-a", f"{TOPIC}:4@broker-b"],
                       remoting=True, extra_args=["--client-expiry-ms", "3000", "--client-scan-ms", "250"]) as b:
        yield b


def consumer(broker) -> PushConsumer:
    return PushConsumer(GROUP, TOPIC, lambda msgs: ConsumeResult.SUCCESS, PushConsumerConfig(
        namesrv=broker.namesrv, heartbeat_interval_ms=500, poll_name_server_interval_ms=500,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET))


def held(c) -> set[str]:
    return {f"{mq.broker_name}:{mq.queue_id}" for mq, pq in c.rebalance_impl.process_queue_table.items()
            if mq.topic == TOPIC and not pq.dropped}


def shared(consumers, queues: set[str]) -> bool:
    """Each queue held by exactly one consumer, every consumer holding one."""
    holdings = [held(c) for c in consumers]
    return all(holdings) and sum(map(len, holdings)) == len(queues) and set().union(*holdings) == queues


async def set_online(admin, name: str, online: bool) -> None:
    answer = await admin.SetBrokerOnline(lab.SetBrokerOnlineRequest(broker_name=name, online=online))
    assert answer.status.code == v2.Code.OK, answer.status.message


async def test_the_survivors_rebalance_while_a_broker_is_offline_and_take_its_queues_back(broker):
    everything = {f"{b}:{q}" for b in ("broker-a", "broker-b") for q in range(4)}
    first, second = consumer(broker), consumer(broker)
    third = None
    channel = grpc.aio.insecure_channel(broker.address)
    admin = lab_grpc.LabAdminStub(channel)
    offline = None
    try:
        await first.start()
        await second.start()
        await async_wait_until(lambda: shared([first, second], everything), timeout=30, message="8 queues shared")
        # Offline goes the broker a client that asks any broker it ever saw would ask first
        # (lowest address): the one that refused every member list before.
        by_address = {address: name for name, address in first.connection.brokers.items()}
        offline = by_address[sorted(by_address)[0]]
        survivor = ({"broker-a", "broker-b"} - {offline}).pop()
        remaining = {q for q in everything if q.startswith(survivor)}
        await set_online(admin, offline, False)
        await async_wait_until(lambda: shared([first, second], remaining), timeout=30,
                               message=f"{offline}'s queues leave, {survivor}'s shared")
        # A newcomer while it is offline: everybody's member list has three clients.
        third = consumer(broker)
        await third.start()
        await async_wait_until(lambda: shared([first, second, third], remaining), timeout=30,
                               message=f"{survivor}'s 4 queues shared by three while {offline} is offline")
        assert {len(c.members) for c in (first, second, third)} == {3}
        await set_online(admin, offline, True)
        offline = None
        await async_wait_until(lambda: shared([first, second, third], everything), timeout=30,
                               message="all 8 queues shared by three once it is back")
    finally:
        if offline is not None:
            await set_online(admin, offline, True)
        for c in (first, second, third):
            if c is not None:
                await c.shutdown()
        await channel.close()
