"""Peers come back when the lab restarts, as ours do: the lab's description of itself
(``desired_scenario``, what persistence.LabMemory saves) names each peer consumer by its
client, and a lab started from it starts them again. Real broker with remoting, real
workers, real peers; the saved form goes through to_dict/from_dict as the database's does."""
import pytest

from consumers_app.lab import bus
from consumers_app.lab.controller import LabController
from consumers_app.lab.scenario import Scenario

from .brokers import BrokerProcess
from .remoting_peers import require_ali_ons, require_cpp
from .support import async_wait_until

GROUP, TOPIC = "GID_PEERS_BACK", "TopicPeersBack"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("peers-back"), topics=[f"{TOPIC}:4"], remoting=True) as b:
        yield b


def lab_on(broker) -> LabController:
    controller = LabController(broker.address, pool_size=1, flush_interval=0.05, poll_interval=0.5)
    controller.namesrv = broker.namesrv
    return controller


def running(lab, kind: str) -> list[str]:
    group = lab.state.snapshot()["groups"].get(GROUP) or {"clients": {}}
    return [c for c, s in group["clients"].items() if s["client"] == kind and s["status"] == "running"]


@pytest.mark.asyncio
async def test_a_restarted_lab_starts_its_peers_again(broker):
    require_ali_ons()
    require_cpp()
    first = lab_on(broker)
    await first.start(Scenario(topics={}, producers={}, groups=()))
    try:
        await bus.request("add_consumer", group=GROUP, mode="push", topic=TOPIC)
        for kind in ("ali-ons", "rocketmq-cpp"):
            await bus.request("add_consumer", group=GROUP, mode="push", client=kind)
        saved = first.desired_scenario().to_dict()
    finally:
        await first.stop()
    spec, = Scenario.from_dict(saved).groups
    assert (spec.name, spec.consumers, sorted(spec.peers)) == (GROUP, 1, ["ali-ons", "rocketmq-cpp"])

    second = lab_on(broker)
    await second.start(Scenario.from_dict(saved))
    try:
        await async_wait_until(lambda: [len(running(second, k)) for k in ("ours", "ali-ons", "rocketmq-cpp")]
                               == [1, 1, 1], timeout=60, message="ours and both peers back")
        running_ids = sorted(c for k in ("ours", "ali-ons", "rocketmq-cpp") for c in running(second, k))
        await async_wait_until(lambda: sorted(second.state.snapshot()["groups"][GROUP]["members"]) == running_ids,
                               timeout=30, message="the broker lists the three")
    finally:
        await second.stop()
