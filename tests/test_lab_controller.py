"""The lab controller end to end: real broker, real worker processes, real consumers.

One lab per module (starting workers costs seconds on 2 cores): the tests run in file
order on one event loop and each leaves the lab as the next one expects. Requests go
through the bus over the in-memory channel layer, as the web side sends them.
"""
import asyncio
import os
import signal

import pytest
import pytest_asyncio
from channels.layers import get_channel_layer

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.events import EVENT_TYPES, event_from_dict, now_ms
from consumers_app.lab import bus
from consumers_app.lab.controller import LabController, Limits
from consumers_app.lab.disk import DiskPlaces
from consumers_app.lab.scenario import DEFAULT
from consumers_app.message_queue import MessageQueue, broker_of

from .brokers import BrokerProcess
from .consumed import duplicates_of_move
from .support import async_wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Short intervals so that an expiry or a rebalance takes a second, not minutes.
BROKER_ARGS = ["--client-expiry-ms", "2500", "--client-scan-ms", "250"]
QUICK = {"heartbeat_interval_ms": 500, "poll_name_server_interval_ms": 1000, "pq_event_interval_ms": 200,
         "flow_control_event_interval_ms": 200, "persist_consumer_offset_interval_ms": 1000}
CLIENT_OPTIONS = {
    "push": {**QUICK, "rebalance_wait_interval_ms": 5000, "pull_threshold_for_queue": 20},
    "lite_pull": {**QUICK, "rebalance_wait_interval_ms": 5000},
    "pop": {k: v for k, v in QUICK.items() if k != "flow_control_event_interval_ms"},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("lab-broker"), topics=[], extra_args=BROKER_ARGS) as b:
        yield b


class Browser:
    """A stand-in websocket consumer: a member of the ``lab`` group keeping every batch."""

    def __init__(self):
        self.batches: list[list[dict]] = []

    async def listen(self):
        layer = get_channel_layer()
        channel = await layer.new_channel("test-browser.")
        await layer.group_add(bus.EVENTS_GROUP, channel)
        while True:
            self.batches.append((await layer.receive(channel))["events"])

    def events(self, type=None) -> list[dict]:
        return [e for batch in self.batches for e in batch if type is None or e["type"] == type]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def listener():
    await get_channel_layer().flush()   # queues bound to another test's loop must not linger
    listener = Browser()
    listening = asyncio.create_task(listener.listen())
    yield listener
    listening.cancel()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def controller(broker, listener):
    controller = LabController(broker.address, client_options=CLIENT_OPTIONS, pool_size=2,
                               flush_interval=0.05, poll_interval=0.5,
                               disk=DiskPlaces(broker_data_dir=broker.data_dir, commitlog_budget=64 << 20))
    try:
        await controller.start(DEFAULT)
        yield controller
    finally:
        await controller.stop()


def expected_assignments(strategy: str, members, labels, group="GID_LAB") -> dict:
    """What RocketMQ's strategy gives each member (consumers_app.allocate is bit-exact)."""
    mq_all, cid_all = sort_for_allocation([MessageQueue.from_label("TopicTest", x) for x in labels], members)
    allocator = get_strategy(strategy)
    return {cid: sorted(mq.label for mq in allocator.allocate(group, cid, mq_all, cid_all)) for cid in cid_all}


def group_view(snapshot, group="GID_LAB") -> dict:
    return snapshot["groups"][group]


def live_members(controller, group="GID_LAB") -> list[str]:
    return [c for c, s in group_view(controller.state.snapshot(), group)["clients"].items()
            if s["status"] in ("running", "hung", "cut")]


def balanced_as(controller, strategy=None, group="GID_LAB"):
    """The group's assignments as ``strategy`` (default: the group's own) computes them
    for its live members."""
    view = group_view(controller.state.snapshot(), group)
    strategy = strategy or view["strategy"]
    members = live_members(controller, group)
    labels = [x for x in controller.state.topics["TopicTest"] if controller.state.brokers[broker_of(x)]]
    assignments = {c: sorted(q) for c, q in view["assignments"].items()}
    return (sorted(view["members"]) == sorted(members) and not view["ownership_issues"]
            and assignments == expected_assignments(strategy, members, labels))


async def test_default_scenario_shares_eight_queues_among_three_push_consumers(controller):
    snapshot = await bus.request("state")
    view = group_view(snapshot)
    assert (view["strategy"], view["mode"]) == ("AVG", "push")
    assert snapshot["topics"]["TopicTest"] == [f"broker-{b}:{q}" for b in "ab" for q in range(4)]
    assert snapshot["producers"]["TopicTest"]["rate"] == 200
    assert len(live_members(controller)) == 3

    await async_wait_until(lambda: balanced_as(controller, "AVG"), timeout=20, message="AVG over 3 consumers")
    owners = {label: q["owners"] for label, q in group_view(controller.state.snapshot())["queues"].items()}
    assert len(owners) == 8 and all(len(o) == 1 for o in owners.values())
    # Messages flow and get consumed: the broker's offsets move for the group.
    await async_wait_until(
        lambda: all(q["committed_offset"] > 0 for q in group_view(controller.state.snapshot())["queues"].values()),
        timeout=20, message="committed offsets on every queue")


async def test_set_strategy_switches_every_member_at_once(controller, listener):
    snapshot = await bus.request("set_strategy", group="GID_LAB", strategy="AVG_BY_CIRCLE")
    assert group_view(snapshot)["strategy"] == "AVG_BY_CIRCLE"
    # The answer is the new state: the owners already as AVG_BY_CIRCLE computes them.
    members = live_members(controller)
    labels = controller.state.topics["TopicTest"]
    answered = {c: sorted(q) for c, q in group_view(snapshot)["assignments"].items()}
    assert answered == expected_assignments("AVG_BY_CIRCLE", members, labels)
    try:
        await async_wait_until(lambda: balanced_as(controller, "AVG_BY_CIRCLE"), timeout=15, message="AVG_BY_CIRCLE")
        clients = group_view(controller.state.snapshot())["clients"]
        assert {c["strategy"] for c in clients.values() if c["status"] == "running"} == {"AVG_BY_CIRCLE"}
        # AVG and AVG_BY_CIRCLE really differ here: contiguous blocks vs every third queue.
        members = live_members(controller)
        assert expected_assignments("AVG", members, labels) != expected_assignments("AVG_BY_CIRCLE", members, labels)
        # One Apply is one switch of the group (the lag history counts and marks it once).
        await async_wait_until(lambda: any(e.get("fault") == "strategy" for e in listener.events("fault")),
                               timeout=5, message="the switch's event")
        switches = [e for e in listener.events("fault") if e.get("fault") == "strategy" and not e["client_id"]]
        assert len(switches) == 1 and switches[0]["strategy"] == "AVG_BY_CIRCLE"
        assert sorted(switches[0]["clients"]) == sorted(members)
    finally:
        await bus.request("set_strategy", group="GID_LAB", strategy="AVG")   # as the scenario started


async def test_the_event_log_keeps_the_groups_switch_not_each_consumers():
    controller = LabController("127.0.0.1:1")
    controller._recorder = object()   # recording: events queue up in _unrecorded
    controller.state.add_group("G", "T", "push", "AVG")
    controller.emit("fault", "G", "", fault="strategy", strategy="AVG_BY_CIRCLE", clients=["c1", "c2"])
    controller._take([event_from_dict({"type": "fault", "group": "G", "client_id": c, "ts": now_ms(),
                                       "fault": "strategy", "strategy": "AVG_BY_CIRCLE"}) for c in ("c1", "c2")])
    assert [(e.fault, e.client_id) for e in controller._unrecorded] == [("strategy", "")]


def comparable(snapshot) -> dict:
    """What a refused request must leave alone."""
    return {
        "groups": {g: (v["strategy"], v["mode"], sorted(v["clients"]), v["assignments"])
                   for g, v in snapshot["groups"].items()},
        "topics": snapshot["topics"], "brokers": snapshot["brokers"], "producers": snapshot["producers"],
    }


LIVE = object()   # stands for a consumer that is alive when the test runs


@pytest.mark.parametrize("action, params, reason", [
    ("explode", {}, "unknown action 'explode'"),
    ("set_strategy", {"group": "GID_NOPE", "strategy": "AVG"}, "unknown group 'GID_NOPE'"),
    ("set_strategy", {"group": "GID_LAB", "strategy": "FASTEST"}, "unknown strategy 'FASTEST'; valid: AVG, "),
    ("set_strategy", {"group": "GID_LAB"}, "missing a required argument: 'strategy'"),
    ("set_mode", {"group": "GID_LAB", "mode": "push_pull"}, "unknown mode 'push_pull'"),
    ("add_consumer", {"group": "GID_LAB", "mode": "pop"}, "use set_mode"),
    ("add_consumer", {"group": "bad group!"}, "has ' ' '!': use only letters, digits, '_', '-', '%' or '|' (at most 120 characters)"),
    ("add_consumer", {"group": "G" * 121}, "group name is 121 characters long: at most 120"),
    ("add_consumer", {"group": ""}, "a group name is 1 to 120 characters"),
    ("add_consumer", {"group": "GID_NEW", "topic": "NoSuchTopic"}, "unknown topic 'NoSuchTopic'"),
    ("consumer", {"client_id": "c999", "action": "hang"}, "unknown consumer 'c999'"),
    ("consumer", {"client_id": LIVE, "action": "explode"}, "unknown consumer action 'explode'"),
    ("consumer", {"client_id": LIVE, "action": "slow", "ms": "fast"}, "ms must be a number"),
    ("consumer", {"client_id": LIVE, "action": "slow", "ms": -5}, "ms must be between"),
    ("consumer", {"client_id": LIVE, "action": "fail", "ratio": 1.5}, "ratio must be between"),
    ("producer_rate", {"topic": "TopicTest", "rate": -1}, "rate must be between"),
    ("producer_rate", {"topic": "TopicTest", "rate": "lots"}, "rate must be a number"),
    ("producer_rate", {"topic": "TopicTest", "rate": True}, "rate must be a number"),
    ("producer_rate", {"topic": "Nope", "rate": 10}, "unknown topic 'Nope'"),
    ("producer_burst", {"topic": "TopicTest", "count": 2.5}, "count must be a whole number"),
    ("queues", {"topic": "TopicTest", "delta": 0}, "delta must not be 0"),
    ("queues", {"topic": "TopicTest", "delta": -5, "broker": "broker-a"}, "only 4 queue(s) on broker-a"),
    ("queues", {"topic": "TopicTest", "delta": 1, "broker": "broker-z"}, "unknown broker 'broker-z'"),
    ("broker", {"broker": "broker-z", "online": False}, "unknown broker 'broker-z'"),
    ("broker", {"broker": "broker-a", "online": "no"}, "online must be true or false"),
])
async def test_bad_requests_are_refused_and_change_nothing(controller, action, params, reason):
    params = {k: live_members(controller)[0] if v is LIVE else v for k, v in params.items()}
    before = comparable(controller.state.snapshot())
    with pytest.raises(bus.LabError) as refused:
        await bus.request(action, **params)
    assert reason in str(refused.value)
    assert comparable(controller.state.snapshot()) == before


async def test_runs_past_the_limits_are_refused_by_the_limits_name(controller):
    alive = sum(c.alive for c in controller.state.clients.values())
    in_group = len(live_members(controller))
    queues = len(controller.state.topics["TopicTest"])
    before = comparable(controller.state.snapshot())
    saved = controller.limits
    try:
        controller.limits = Limits(consumers=alive, group_consumers=64, topic_queues=1024)
        with pytest.raises(bus.LabError, match=f"at most {alive} consumers \\(LAB_MAX_CONSUMERS\\)"):
            await bus.request("add_consumer", group="GID_OTHER")
        controller.limits = Limits(consumers=128, group_consumers=in_group, topic_queues=queues)
        with pytest.raises(bus.LabError, match=f"at most {in_group} consumers \\(LAB_MAX_GROUP_CONSUMERS\\)"):
            await bus.request("add_consumer", group="GID_LAB")
        with pytest.raises(bus.LabError, match=f"at most {queues} queues \\(LAB_MAX_TOPIC_QUEUES\\)"):
            await bus.request("queues", topic="TopicTest", delta=1)
    finally:
        controller.limits = saved
    assert comparable(controller.state.snapshot()) == before


async def test_removing_every_queue_is_refused(controller, broker):
    # Leave broker-b only, then try to empty it: the topic would have no queues.
    await bus.request("queues", topic="TopicTest", delta=-4, broker="broker-a")
    try:
        with pytest.raises(bus.LabError, match="would leave TopicTest with no queues"):
            await bus.request("queues", topic="TopicTest", delta=-4, broker="broker-b")
        assert controller.state.topics["TopicTest"] == [f"broker-b:{q}" for q in range(4)]
    finally:
        await bus.request("queues", topic="TopicTest", delta=4, broker="broker-a")
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="8 queues again")


async def test_added_queues_are_shared_after_each_route_refresh(controller, listener):
    snapshot = await bus.request("queues", topic="TopicTest", delta=2, broker="broker-b")
    assert snapshot["topics"]["TopicTest"][-2:] == ["broker-b:4", "broker-b:5"]
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="10 queues shared")
    # Nobody was told: each consumer saw it in its own route refresh (1 s here, 30 s by
    # default), and the page says when.
    def noticed_by_all():
        change = group_view(controller.state.snapshot())["route_change"]
        return change if set(change["noticed"]) == set(live_members(controller)) else None

    change = await async_wait_until(noticed_by_all, timeout=15, message="every consumer noticed the change")
    assert change["change"] == "queues" and all(0 <= ms for ms in change["noticed"].values())
    await async_wait_until(lambda: [e for e in listener.events("broker") if e.get("delta") == 2],
                           timeout=5, message="the broker event published")
    await bus.request("queues", topic="TopicTest", delta=-2, broker="broker-b")
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="back to 8 queues")


async def test_an_offline_broker_leaves_the_group_to_the_other_brokers_queues(controller, listener):
    snapshot = await bus.request("broker", broker="broker-b", online=False)
    assert snapshot["brokers"]["broker-b"] == {"online": False}
    try:
        await async_wait_until(lambda: balanced_as(controller), timeout=15, message="broker-a only")
        owned = [q for qs in group_view(controller.state.snapshot())["assignments"].values() for q in qs]
        assert sorted(owned) == [f"broker-a:{q}" for q in range(4)]
        await async_wait_until(lambda: [e for e in listener.events("broker") if e.get("change") == "offline"],
                               timeout=5, message="the offline event published")
    finally:
        await bus.request("broker", broker="broker-b", online=True)
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="both brokers again")


async def test_a_hung_consumer_hits_flow_control(controller):
    victim = live_members(controller)[0]
    snapshot = await bus.request("consumer", client_id=victim, action="hang")
    assert group_view(snapshot)["clients"][victim]["status"] == "hung"

    def flow_controlled():
        return [e for e in group_view(controller.state.snapshot())["flow_control"] if e["client_id"] == victim]

    events = await async_wait_until(flow_controlled, timeout=20, message=f"flow control on {victim}")
    # pullThresholdForQueue is 20 here: the hung consumer's cache outgrew it.
    assert (events[-1]["reason"], events[-1]["threshold"]) == ("count", 20)
    assert events[-1]["value"] > 20
    owned = group_view(controller.state.snapshot())["assignments"][victim]
    await async_wait_until(lambda: any(group_view(controller.state.snapshot())["queues"][q]["cached_count"] > 20
                                       for q in owned), timeout=5, message="its ProcessQueues full")

    snapshot = await bus.request("consumer", client_id=victim, action="resume")
    assert group_view(snapshot)["clients"][victim]["status"] == "running"


async def test_a_killed_consumer_leaves_at_once(controller):
    victim = live_members(controller)[-1]
    killed_at = now_ms()
    snapshot = await bus.request("consumer", client_id=victim, action="kill")
    view = group_view(snapshot)
    assert view["clients"][victim]["status"] == "killed"
    assert victim not in view["assignments"]
    # Its connection closed: the broker drops it at once and the survivors take over.
    await async_wait_until(lambda: balanced_as(controller), timeout=20, message="survivors rebalanced")
    left = [e for e in group_view(controller.state.snapshot())["membership_log"]
            if victim in e.get("left", []) and e["ts"] >= killed_at]
    assert [e["reason"] for e in left] == ["closed"]
    with pytest.raises(bus.LabError, match=f"consumer {victim} is killed"):
        await bus.request("consumer", client_id=victim, action="hang")
    await bus.request("add_consumer", group="GID_LAB")   # three again, as the scenario started
    await async_wait_until(lambda: balanced_as(controller), timeout=20, message="a newcomer took its share")


async def test_a_kill_hands_its_queues_over_and_counts_the_duplicates_exactly(controller, listener):
    """The victim, slowed so that messages finish out of order (a concurrent consumer commits
    only up to its oldest unfinished one) and so are not all committed yet, is killed: the
    survivors take its queues from the committed offset and consume part of it again. The
    lab's rebalance shows each move from the victim, and its duplicate count is the one
    computed here from the consumers' own consume events."""
    # A member consuming now: one whose queues get no messages (or one another test just cut
    # and healed, its pulls backing off) would leave nothing consumed to repeat.
    since = now_ms()

    def consuming():
        recent = {e["client_id"] for e in listener.events("consume") if e.get("ranges") and e["ts"] >= since}
        return [c for c in live_members(controller) if c in recent]

    victim = (await async_wait_until(consuming, timeout=20, message="a member consuming"))[0]
    held = group_view(controller.state.snapshot())["assignments"][victim]
    slowed_at = now_ms()
    await bus.request("consumer", client_id=victim, action="slow", ms=100)
    # Consuming since it was slowed (not only before: a member the previous test cut and
    # healed may still be backing off its pulls - then the kill would leave nothing to repeat).
    await async_wait_until(lambda: any(e["client_id"] == victim and e.get("ranges") and e["ts"] >= slowed_at
                                       for e in listener.events("consume")),
                           timeout=30, message="the victim consuming since it was slowed")
    killed_at = now_ms()
    seen: dict = {}
    try:
        await bus.request("consumer", client_id=victim, action="kill")
        await async_wait_until(lambda: balanced_as(controller), timeout=20, message="survivors rebalanced")

        def kill_rebalance():
            handoffs = group_view(controller.state.snapshot())["handoffs"]
            return next((r for r in reversed(handoffs["rebalances"])
                         if r["end_ts"] >= killed_at and victim in r["clients"]), None)

        rebalance = await async_wait_until(kill_rebalance, timeout=10, message="the kill's rebalance")
        detail = await bus.request("rebalance", group="GID_LAB", rebalance_id=rebalance["id"])
        from_victim = [m for m in detail["moves"] if m["from"] == [victim] and m["added_ts"] >= killed_at]
        assert sorted(m["queue"] for m in from_victim) == sorted(held)
        assert all(m["gap_ms"] >= 0 and not m["overlap_ongoing"] for m in from_victim)

        async def counts_agree():
            detail = await bus.request("rebalance", group="GID_LAB", rebalance_id=rebalance["id"])
            events = listener.events("consume")
            # The kill's moves: a rebalance just before it (the module's last switch) can fall
            # in the same episode, and the records' count (everything the old owner ever
            # consumed) would charge its moves with what the next move of the queue duplicated.
            moves = [m for m in detail["moves"] if m["added_ts"] >= killed_at]
            ours = seen["records"] = {m["queue"]: duplicates_of_move(events, m) for m in moves}
            theirs = seen["lab"] = {m["queue"]: m["duplicates"] for m in moves}
            # (Whether the kill left anything to repeat depends on when it lands against the
            # victim's last offset commit: what must hold is that the lab counts what happened.)
            return ours == theirs and detail

        try:
            detail = await async_wait_until(counts_agree, timeout=30,
                                            message="the lab's duplicates = the consumers' own")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: the lab's {seen.get('lab')}, the records' {seen.get('records')}") from None
        assert detail["duplicates"] == sum(m["duplicates"] for m in detail["moves"])
    finally:   # the module's lab has three members again, whatever failed above
        await bus.request("add_consumer", group="GID_LAB")
        await async_wait_until(lambda: balanced_as(controller), timeout=20, message="three consumers again")


async def test_a_cut_consumer_keeps_its_queues_until_the_broker_expires_it(controller):
    victim = live_members(controller)[-1]
    held = group_view(controller.state.snapshot())["assignments"][victim]
    snapshot = await bus.request("consumer", client_id=victim, action="cut")
    assert group_view(snapshot)["clients"][victim]["status"] == "cut"

    def expired():
        log = group_view(controller.state.snapshot())["membership_log"]
        return [e for e in log if victim in e.get("left", [])]

    await async_wait_until(expired, timeout=20, message="the broker expires the silent consumer")
    assert [e["reason"] for e in expired()] == ["expired"]
    others = [c for c in live_members(controller) if c != victim]
    # The others take its queues; partitioned, it still holds them: both show on the page.
    await async_wait_until(lambda: set(held) <= {q for c in others
                                                 for q in group_view(controller.state.snapshot())["assignments"][c]},
                           timeout=20, message="the others took its queues")
    view = group_view(controller.state.snapshot())
    assert view["assignments"][victim] == held
    assert {q: "shared" for q in held}.items() <= view["ownership_issues"].items()
    # Healed, it heartbeats again, rejoins and the group rebalances.
    await bus.request("consumer", client_id=victim, action="resume")
    await async_wait_until(lambda: balanced_as(controller), timeout=20, message="rejoined")


async def test_add_and_stop_a_consumer(controller):
    reply = await bus.request("add_consumer", group="GID_LAB")
    new = reply["client_id"]
    assert new in group_view(reply["state"])["members"]
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message=f"{new} got queues")
    assert group_view(controller.state.snapshot())["assignments"][new]

    snapshot = await bus.request("consumer", client_id=new, action="stop")
    # A graceful stop says goodbye: the broker drops it at once, no expiry needed.
    assert new not in group_view(snapshot)["members"]
    assert group_view(snapshot)["clients"][new]["status"] == "stopped"
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="rebalanced after stop")


async def test_producer_rate_and_burst(controller):
    snapshot = await bus.request("producer_rate", topic="TopicTest", rate=50)
    assert snapshot["producers"]["TopicTest"]["rate"] == 50
    before = sum(q["max_offset"] for q in group_view(controller.state.snapshot())["queues"].values())
    await bus.request("producer_burst", topic="TopicTest", count=500)
    await async_wait_until(
        lambda: sum(q["max_offset"] for q in group_view(controller.state.snapshot())["queues"].values()) >= before + 500,
        timeout=15, message="the burst stored")
    await bus.request("producer_rate", topic="TopicTest", rate=200)


async def test_the_snapshot_reports_disk_use_per_part(controller):
    await controller.measure_disk()
    disk = (await bus.request("state"))["disk"]
    # The broker's parts and their budget only: this lab was given no recordings or database.
    assert set(disk) == {"commitlog", "consumequeue", "total", "budget", "ts"}
    assert disk["commitlog"] >= 0 and disk["consumequeue"] >= 0
    assert disk["total"] == disk["commitlog"] + disk["consumequeue"]
    assert disk["budget"] == {"commitlog": 64 << 20}

    def stored():
        return sum(q["max_offset"] for q in group_view(controller.state.snapshot())["queues"].values())
    before = stored()
    await bus.request("producer_burst", topic="TopicTest", count=2000)
    await async_wait_until(lambda: stored() >= before + 2000, timeout=15, message="the burst stored")
    # Segments are allocated 32 MiB ahead of the writes: the figure covers every 1 KiB message.
    await controller.measure_disk()
    assert controller.state.snapshot()["disk"]["commitlog"] >= stored() * 1024


async def test_set_mode_replaces_the_consumers(controller):
    before = live_members(controller)
    snapshot = await bus.request("set_mode", group="GID_LAB", mode="lite_pull")
    view = group_view(snapshot)
    assert view["mode"] == "lite_pull"
    now = live_members(controller)
    assert len(now) == len(before) and not set(now) & set(before)
    assert {view["clients"][c]["mode"] for c in now} == {"lite_pull"}
    assert {view["clients"][c]["status"] for c in before} == {"stopped"}
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="lite pull balanced")

    snapshot = await bus.request("set_mode", group="GID_LAB", mode="push")
    assert group_view(snapshot)["mode"] == "push"
    await async_wait_until(lambda: balanced_as(controller), timeout=15, message="push again")


async def test_a_pop_group_side_by_side(controller):
    first = await bus.request("add_consumer", group="GID_POP", mode="pop")
    second = await bus.request("add_consumer", group="GID_POP")
    view = group_view(second["state"], "GID_POP")
    assert view["mode"] == "pop" and view["topic"] == "TopicTest"
    pop_clients = sorted([first["client_id"], second["client_id"]])

    def broker_level_assignments():
        view = group_view(controller.state.snapshot(), "GID_POP")
        return all(view["assignments"].get(c) == ["broker-a:-1", "broker-b:-1"] for c in pop_clients) and view

    view = await async_wait_until(broker_level_assignments, timeout=15, message="pop assignments")
    # Any pop consumer may take from any queue: every queue lists both, and that is no fault.
    assert {tuple(q["owners"]) for q in view["queues"].values()} == {tuple(pop_clients)}
    assert view["ownership_issues"] == {}
    # The push group next to it is untouched.
    assert group_view(controller.state.snapshot())["mode"] == "push"


async def test_a_dead_worker_is_replaced_with_its_consumers(controller, listener):
    link = next(iter(controller.supervisor.links.values()))
    clients = group_view(controller.state.snapshot())["clients"]
    before = live_members(controller)
    hosted = [c for c in before if clients[c]["worker"] == link.worker_id]
    assert hosted, "the pool spreads consumers over both workers"
    os.kill(link.pid, signal.SIGKILL)

    def all_crashed():
        clients = group_view(controller.state.snapshot())["clients"]
        return all(clients[c]["status"] == "crashed" for c in hosted)

    await async_wait_until(all_crashed, timeout=10, message="consumers of the dead worker marked crashed")
    await async_wait_until(
        lambda: {e["client_id"] for e in listener.events("fault") if e["fault"] == "worker_lost"} >= set(hosted),
        timeout=5, message="worker_lost faults published")
    # As many new consumers as were lost, on a fresh worker, without anyone asking.
    await async_wait_until(lambda: len(live_members(controller)) == len(before) and not set(live_members(controller)) & set(hosted),
                           timeout=10, message="replacement consumers running")
    clients = group_view(controller.state.snapshot())["clients"]
    assert all(clients[c]["worker"] != link.worker_id for c in live_members(controller))
    await async_wait_until(lambda: any(e["fault"] == "worker_replaced" for e in listener.events("fault")),
                           timeout=5, message="worker_replaced fault published")
    await async_wait_until(lambda: balanced_as(controller), timeout=20, message="recovered")


async def test_browsers_get_coalesced_batches_and_snapshots(controller, listener):
    await async_wait_until(lambda: len(listener.batches) > 20, timeout=10, message="batches")
    for batch in listener.batches:
        keys = [(e["group"], e["client_id"], e["queue"]) for e in batch if e["type"] == "pq"]
        assert len(keys) == len(set(keys)), "one pq event per queue and consumer per batch"
    # A fault of our own (whatever ran before), then: every kind of story event reached
    # the browser in its JSON form, and a periodic snapshot too.
    victim = live_members(controller)[0]
    await controller.handle("consumer", {"client_id": victim, "action": "slow", "ms": 0})
    await async_wait_until(lambda: any(e["client_id"] == victim for e in listener.events("fault")),
                           timeout=5, message="the fault published")
    kinds = {e["type"] for e in listener.events()}
    assert {"assignment", "rebalance", "membership", "pq", "fault", "snapshot"} <= kinds
    assert kinds <= EVENT_TYPES | {"snapshot"}
    assert all(event_from_dict(e).to_dict() == e for e in listener.events() if e["type"] != "snapshot")
    snapshots = listener.events("snapshot")
    assert "GID_LAB" in snapshots[-1]["groups"]
