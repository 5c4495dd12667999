"""Observing groups the lab did not start: C++-client consumers (they answer running info:
their own queues and ProcessQueues) and ali-ons consumers (they don't: shown as such),
members joining and leaving, lag from the cluster's consume stats, and refusals.
Real broker with remoting, real peers started outside the lab, a real controller."""
import pytest
import pytest_asyncio

from consumers_app.lab import bus
from consumers_app.lab.controller import LabController
from consumers_app.lab.scenario import Scenario

from .brokers import BrokerProcess
from .remoting_peers import AliOns, Cpp, require_ali_ons, require_cpp
from .support import async_wait_until, produce

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOPIC = "TopicWatched"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # The broker's default client expiry (120 s): the peers heartbeat every 30 s.
    with BrokerProcess(tmp_path_factory.mktemp("observe"), topics=[f"{TOPIC}:8"], remoting=True) as b:
        yield b


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def controller(broker):
    controller = LabController(broker.address, pool_size=1, flush_interval=0.05, poll_interval=0.5,
                               observe_interval=0.5)
    controller.namesrv = broker.namesrv
    try:
        await controller.start(Scenario(topics={}, producers={}, groups=()))
        yield controller
    finally:
        await controller.stop()


@pytest.fixture
def peers():
    started = []
    yield started
    for peer in started:
        peer.kill()


def view(controller, group):
    return controller.state.snapshot()["groups"][group]


def owned_once_by(group_view, clients) -> bool:
    owners = [q["owners"] for q in group_view["queues"].values()]
    return (len(owners) == 8 and all(len(o) == 1 for o in owners)
            and {o[0] for o in owners} == set(clients))


async def test_cpp_consumers_started_elsewhere_are_observed_with_their_own_queues(controller, broker, peers):
    require_cpp()
    group = "GID_OUTSIDE_CPP"
    for _ in range(2):
        peers.append(Cpp.consume(broker.namesrv, group, TOPIC))
    for peer in peers:
        peer.wait_ready()

    answer = await bus.request("observe", group=group)
    assert answer["group"] == group
    seen = answer["state"]["groups"][group]
    assert seen["observed"] is True and seen["topic"] == TOPIC
    # The C++ client's id is the broker's to tell (IP@pid#instance), not its own line's.
    ids = await async_wait_until(lambda: len(view(controller, group)["members"]) == 2 and view(controller, group)["members"],
                                 timeout=30, message="both members listed")
    await async_wait_until(lambda: owned_once_by(view(controller, group), ids), timeout=30,
                           message="each queue owned once, as the two C++ clients report it")
    clients = view(controller, group)["clients"]
    assert {c: (s["client"], s["language"], s["assignment_source"]) for c, s in clients.items()} == {
        c: ("outside", "CPP", "client") for c in ids}
    assert sorted(view(controller, group)["members"]) == sorted(ids)

    # Messages flow; the cluster's consume stats give each queue's lag and committed offset.
    await produce(broker.address, TOPIC, 80, batch=1)
    await async_wait_until(lambda: sum(q["committed_offset"] for q in view(controller, group)["queues"].values()) == 80,
                           timeout=30, message="the committed offsets of all 80 messages")
    assert all(q["lag"] == 0 for q in view(controller, group)["queues"].values())

    # A third joins: membership, and the queues each now reports, as events.
    events = []
    take = controller._take
    controller._take = lambda batch: (events.extend(batch), take(batch))
    peers.append(Cpp.consume(broker.namesrv, group, TOPIC))
    peers[-1].wait_ready()
    third = (await async_wait_until(lambda: set(view(controller, group)["members"]) - set(ids), timeout=30,
                                    message="the newcomer listed")).pop()
    await async_wait_until(lambda: owned_once_by(view(controller, group), ids + [third]), timeout=30,
                           message="the newcomer's queues, as it reports them")
    log = view(controller, group)["membership_log"]
    assert any(e["joined"] == [third] and e["reason"] == "observed" for e in log)
    controller._take = take
    rebalances = [e for e in events if e.type == "rebalance" and e.group == group]
    assert any(e.client_id == third and e.added and e.reason == "observed" for e in rebalances)

    # A member killed: it leaves the group on the page, as the broker saw it go (its
    # connection closed, no goodbye), and the rest hold every queue again.
    peers[0].kill()
    gone = (await async_wait_until(lambda: set(ids + [third]) - set(view(controller, group)["members"]), timeout=30,
                                   message="the killed client dropped by the broker")).pop()
    await async_wait_until(lambda: view(controller, group)["clients"][gone]["status"] == "closed", timeout=10,
                           message="the killed client shown as closed")
    staying = [c for c in ids + [third] if c != gone]
    await async_wait_until(lambda: owned_once_by(view(controller, group), staying), timeout=30,
                           message="the two left hold every queue")

    # Read-only: the lab does not steer a group it did not start.
    with pytest.raises(bus.LabError, match="observed, not run by the lab"):
        await bus.request("set_strategy", group=group, strategy="AVG_BY_CIRCLE")
    with pytest.raises(bus.LabError, match="observed, not run by the lab"):
        await bus.request("consumer", client_id=third, action="kill")
    with pytest.raises(bus.LabError, match="observed, not run by the lab"):
        await bus.request("add_consumer", group=group, mode="push")


async def test_ali_ons_consumers_are_observed_without_running_info(controller, broker, peers):
    require_ali_ons()
    group = "GID_OUTSIDE_NODE"
    peers.append(AliOns.consume(broker.namesrv, group, TOPIC))
    peers[0].wait_ready()
    await bus.request("observe", group=group)
    await async_wait_until(lambda: view(controller, group)["clients"], timeout=30, message="the ali-ons client listed")
    [client] = view(controller, group)["clients"].values()
    # ali-ons ignores GET_CONSUMER_RUNNING_INFO: the page says so instead of inventing queues.
    assert client["assignment_source"] == "unknown"
    assert "RUNNING_INFO" in client["note"]
    assert view(controller, group)["assignments"] == {}
    # Lag still comes from the cluster's stats.
    assert len(view(controller, group)["queues"]) == 8


async def test_bad_observe_requests_are_refused_and_change_nothing(controller, broker):
    before = set(controller.state.groups)
    with pytest.raises(bus.LabError, match="not online"):
        await bus.request("observe", group="GID_NOBODY")
    with pytest.raises(bus.LabError, match="'/': use only letters"):
        await bus.request("observe", group="../etc")
    assert set(controller.state.groups) == before
