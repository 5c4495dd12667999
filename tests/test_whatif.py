"""The what-if preview (consumers_app/lab/whatif.py) against allocate.py, and the controller's
read-only action that answers it (no broker: the action needs only the lab's state)."""
import pytest

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.events import make_event
from consumers_app.lab import bus
from consumers_app.lab.controller import LabController
from consumers_app.lab.state import LabState
from consumers_app.lab.whatif import preview_group, preview_strategy
from consumers_app.message_queue import MessageQueue

TOPIC = "TopicTest"
QUEUES = [f"broker-{b}:{q}" for b in "ab" for q in range(4)]   # 8 queues
MEMBERS = ["c1", "c2", "c3"]


def allocation(strategy: str, members=MEMBERS, queues=QUEUES) -> dict[str, list[str]]:
    mqs, cids = sort_for_allocation([MessageQueue.from_label(TOPIC, x) for x in queues], members)
    allocate = get_strategy(strategy).allocate
    return {cid: [mq.label for mq in allocate("GID", cid, mqs, cids)] for cid in cids}


def preview(strategy: str, current: dict, members=MEMBERS, queues=QUEUES) -> dict:
    return preview_strategy(get_strategy(strategy), "GID", TOPIC, queues, members, current)


def test_avg_to_avg_by_circle_moves_the_queues_whose_owner_changes():
    avg, circle = allocation("AVG"), allocation("AVG_BY_CIRCLE")
    # AVG: c1 a0 a1 a2 · c2 a3 b0 b1 · c3 b2 b3; by circle: c1 a0 a3 b2 · c2 a1 b0 b3 · c3 a2 b1
    assert avg == {"c1": ["broker-a:0", "broker-a:1", "broker-a:2"], "c2": ["broker-a:3", "broker-b:0", "broker-b:1"],
                   "c3": ["broker-b:2", "broker-b:3"]}
    owner_before = {x: c for c, xs in avg.items() for x in xs}
    owner_after = {x: c for c, xs in circle.items() for x in xs}
    moving = [x for x in QUEUES if owner_before[x] != owner_after[x]]

    answer = preview("AVG_BY_CIRCLE", avg)
    assert answer["current"] == avg
    assert answer["proposed"] == circle
    assert answer["moved"] == len(moving) == 6   # a0 and b0 stay
    assert answer["moves"] == [{"queue": x, "from": [owner_before[x]], "to": owner_after[x]} for x in moving]


def test_the_same_strategy_moves_nothing():
    avg = allocation("AVG")
    answer = preview("AVG", avg)
    assert (answer["moved"], answer["moves"], answer["proposed"]) == (0, [], avg)


def test_an_absent_member_is_ignored():
    # c4 still reports queues but left the group: it takes no part, and its queues are no one's now.
    current = {**allocation("AVG", MEMBERS[:2]), "c4": ["broker-b:3"]}
    answer = preview("AVG", current, members=MEMBERS[:2])
    assert set(answer["current"]) == set(answer["proposed"]) == {"c1", "c2"}
    assert answer["moved"] == 0


def test_a_contested_or_unowned_queue_counts_as_a_move():
    avg = allocation("AVG")
    current = {**avg, "c1": avg["c1"] + ["broker-a:3"], "c3": ["broker-b:2"]}   # a3 held twice, b3 by nobody
    answer = preview("AVG", current)
    assert answer["moves"] == [{"queue": "broker-a:3", "from": ["c1", "c2"], "to": "c2"},
                               {"queue": "broker-b:3", "from": [], "to": "c3"}]


def test_a_strategy_that_gives_nothing_leaves_every_queue_unowned():
    answer = preview("CONFIG", allocation("AVG"))   # no configured queues: nobody takes any
    assert answer["moved"] == len(QUEUES)
    assert {m["to"] for m in answer["moves"]} == {None}


def test_ids_sort_as_java_strings():
    members = [f"c{i}" for i in range(1, 12)]   # c10 and c11 come before c2, as RocketMQ sorts them
    answer = preview("AVG", {}, members=members)
    assert answer["proposed"] == allocation("AVG", members)
    assert answer["proposed"]["c10"] == ["broker-a:1"]


@pytest.fixture
def state() -> LabState:
    state = LabState()
    state.set_topic_queues(TOPIC, QUEUES)
    state.brokers = {"broker-a": True, "broker-b": True}
    state.add_group("GID", TOPIC, "push", "AVG")
    for cid in [*MEMBERS, "c4"]:
        state.add_client(cid, "GID", "push").status = "running"
    state.apply(make_event("membership", "GID", "", source="broker", members=[*MEMBERS, "c4"]))
    for cid, labels in allocation("AVG", [*MEMBERS, "c4"]).items():
        state.apply(make_event("assignment", "GID", cid, topic=TOPIC, strategy="AVG",
                               queues=[MessageQueue.from_label(TOPIC, x) for x in labels]))
    return state


def test_a_groups_preview_takes_live_members_and_online_queues(state):
    state.client_gone("c4", "killed")        # before the broker says so: already out
    state.brokers["broker-b"] = False         # its queues are in no one's route
    answer = preview_group(state, state.groups["GID"], "AVG")
    assert (answer["group"], answer["strategy"]) == ("GID", "AVG")
    assert answer["proposed"] == allocation("AVG", MEMBERS, QUEUES[:4])
    assert set(answer["current"]) == set(MEMBERS)


# ---------------------------------------------------------------- the controller's read-only action

@pytest.fixture
def controller(state) -> LabController:
    controller = LabController("127.0.0.1:1")   # never started: the action needs only its state
    controller.state = state
    return controller


async def test_the_controller_answers_a_preview_and_changes_nothing(controller):
    before = controller.state.snapshot()
    answer = await controller.handle("preview_strategy", {"group": "GID", "strategy": "AVG_BY_CIRCLE"})
    assert answer == preview_group(controller.state, controller.state.groups["GID"], "AVG_BY_CIRCLE")
    assert answer["moved"] > 0
    assert controller.state.snapshot() == before


@pytest.mark.parametrize("params, reason", [
    ({"group": "NOPE", "strategy": "AVG"}, "unknown group 'NOPE'"),
    ({"group": "GID", "strategy": "FASTEST"}, "unknown strategy 'FASTEST'"),
    ({"group": "GID_WATCHED", "strategy": "AVG"}, "observed, not run by the lab"),
    ({"group": "GID_POP", "strategy": "AVG"}, "pop consumers ignore the strategy"),
])
async def test_the_controller_refuses_a_preview_it_cannot_make(controller, params, reason):
    controller.state.add_group("GID_WATCHED", TOPIC, "push", "").observed = True
    controller.state.add_group("GID_POP", TOPIC, "pop", "AVG")
    with pytest.raises(bus.LabError, match=reason):
        await controller.handle("preview_strategy", params)
