"""Other people's clients as lab members: an ali-ons consumer (Node.js, remoting) in a group
with ours, its queues as the broker sees it pull, a mixed group's ownership trouble, and
stop/kill of its process. Real broker with remoting, real workers, real ali-ons."""
import pytest
import pytest_asyncio

from consumers_app.lab import bus
from consumers_app.lab.controller import LabController
from consumers_app.lab.scenario import Scenario

from .brokers import BrokerProcess
from .remoting_peers import require_ali_ons, require_cpp
from .support import async_wait_until, produce

pytestmark = pytest.mark.asyncio(loop_scope="module")

GROUP, TOPIC = "GID_MIXED", "TopicTest"
QUICK = {"heartbeat_interval_ms": 500, "poll_name_server_interval_ms": 1000, "pq_event_interval_ms": 200,
         "rebalance_wait_interval_ms": 3000}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("peers"), topics=[f"{TOPIC}:8"], remoting=True,
                       extra_args=["--client-expiry-ms", "3000", "--client-scan-ms", "250"]) as b:
        yield b


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def controller(broker):
    require_ali_ons()
    controller = LabController(broker.address, client_options={"push": QUICK}, pool_size=1,
                               flush_interval=0.05, poll_interval=0.5)
    controller.namesrv = broker.namesrv
    try:
        await controller.start(Scenario(topics={}, producers={}, groups=()))
        yield controller
    finally:
        await controller.stop()


def view(controller, group=GROUP):
    return controller.state.snapshot()["groups"][group]


async def test_an_ali_ons_consumer_joins_a_group_of_ours_and_shows_what_the_broker_sees(controller, broker):
    for _ in range(2):
        await bus.request("add_consumer", group=GROUP, mode="push", topic=TOPIC, strategy="AVG_BY_CIRCLE")
    answer = await bus.request("add_consumer", group=GROUP, mode="push", client="ali-ons")
    peer = answer["client_id"]
    assert "@" in peer   # its own client id (IP@instance), as the broker lists it
    clients = view(controller)["clients"]
    assert (clients[peer]["client"], clients[peer]["assignment_source"]) == ("ali-ons", "broker")
    assert {c["client"] for cid, c in clients.items() if cid != peer} == {"ours"}
    await async_wait_until(lambda: sorted(view(controller)["members"]) == sorted(clients), timeout=20,
                           message="the broker lists all three")

    # Messages flow; the broker sees ali-ons pull, and the page gets that as its assignment.
    await produce(broker.address, TOPIC, 200, batch=1)
    await async_wait_until(lambda: view(controller)["assignments"].get(peer), timeout=30,
                           message="ali-ons' queues as the broker sees them")
    # ali-ons allocates with AVG, ours with AVG_BY_CIRCLE: they disagree, and the page says where.
    await async_wait_until(lambda: view(controller)["ownership_issues"], timeout=30,
                           message="queues double-owned or unowned in the mixed group")

    with pytest.raises(bus.LabError, match="ali-ons consumers take only stop, kill"):
        await bus.request("consumer", client_id=peer, action="hang")


async def test_killing_the_ali_ons_process_hands_its_queues_to_ours(controller, broker):
    group = "GID_MIXED_KILL"   # its own group: whatever the other tests did, two of ours and one ali-ons
    ours = [(await bus.request("add_consumer", group=group, mode="push", topic=TOPIC))["client_id"] for _ in range(2)]
    peer = (await bus.request("add_consumer", group=group, mode="push", client="ali-ons"))["client_id"]
    await async_wait_until(lambda: sorted(view(controller, group)["members"]) == sorted(ours + [peer]), timeout=20,
                           message="the broker lists all three")
    snapshot = await bus.request("consumer", client_id=peer, action="kill")
    assert snapshot["groups"][group]["clients"][peer]["status"] == "killed"
    # The connection closed: the broker drops it at once; ours take every queue exactly once.
    await async_wait_until(lambda: sorted(view(controller, group)["members"]) == sorted(ours), timeout=10,
                           message="ali-ons dropped by the broker")
    await async_wait_until(lambda: not view(controller, group)["ownership_issues"]
                           and sum(len(view(controller, group)["assignments"].get(c, [])) for c in ours) == 8,
                           timeout=30, message="ours own all 8 queues")


async def test_peers_are_refused_what_they_cannot_do(controller):
    with pytest.raises(bus.LabError, match="push mode only"):
        await bus.request("add_consumer", group="GID_PEER_POP", mode="pop", client="ali-ons")
    with pytest.raises(bus.LabError, match="unknown or uninstalled client"):
        await bus.request("add_consumer", group=GROUP, mode="push", client="rocketmq-cobol")


async def test_a_cpp_consumer_joins_under_the_id_the_broker_gives_it_says_what_it_holds_and_stops(controller):
    require_cpp()
    group = "GID_MIXED_CPP"   # its own group, next to one of ours: whatever the other tests did
    ours = (await bus.request("add_consumer", group=group, mode="push", topic=TOPIC))["client_id"]
    await async_wait_until(lambda: view(controller, group)["members"] == [ours], timeout=20,
                           message="the broker lists ours")
    answer = await bus.request("add_consumer", group=group, mode="push", client="rocketmq-cpp")
    peer = answer["client_id"]
    # Learnt from the broker: the client does not say.
    assert peer != ours and peer in view(controller, group)["members"]
    assert view(controller, group)["clients"][peer]["client"] == "rocketmq-cpp"
    # It answers GET_CONSUMER_RUNNING_INFO: the page shows what it says it holds (its mqTable).
    await async_wait_until(lambda: view(controller, group)["clients"][peer]["assignment_source"] == "client"
                           and view(controller, group)["assignments"].get(peer), timeout=30,
                           message="the C++ client's own assignment")
    snapshot = await bus.request("consumer", client_id=peer, action="stop")   # SIGTERM: it shuts down
    assert snapshot["groups"][group]["clients"][peer]["status"] == "stopped"
    await async_wait_until(lambda: peer not in view(controller, group)["members"], timeout=10,
                           message="the broker let it go")
    # It said goodbye (UNREGISTER_CLIENT) before its connection closed: the broker says "left".
    assert [e["reason"] for e in view(controller, group)["membership_log"] if peer in e["left"]] == ["left"]
