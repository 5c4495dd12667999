"""The lab's action table (consumers_app/lab/actions.py) is the one contract: the API's
checks, the controller's dispatch and its handlers' signatures all follow it."""
import inspect
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from consumers_app.lab import actions, bus
from consumers_app.lab.actions import ACTIONS, NOT_GIVEN, Param, Rule, checked_request
from consumers_app.lab.controller import LabController
from consumers_app.lab.state import LabState
from dashboard import api


def web_request(body=None, query=None):
    """What dashboard.api's checks read of a request: its raw body and its query."""
    return SimpleNamespace(body=json.dumps(body).encode() if body is not None else b"", GET=query or {})


@pytest.fixture
def jitter(monkeypatch):
    """producer_rate with one more body field, added to the table only."""
    spec = ACTIONS["producer_rate"]
    extra = Param("jitter", "number", required=False, default=None, web="body",
                  rule=Rule(lambda v: v <= 5, "'jitter' must be at most 5, not {value}"))
    monkeypatch.setitem(ACTIONS, "producer_rate", replace(spec, params=(*spec.params, extra)))


def test_a_field_added_to_the_table_is_taken_and_checked_by_the_api(jitter):
    given = {"topic": "T", "rate": 5, "jitter": 2}
    assert api.body(web_request(given), "producer_rate") == given
    with pytest.raises(api.BadRequest, match=r"^'jitter' must be at most 5, not 9$"):
        api.body(web_request({"topic": "T", "rate": 5, "jitter": 9}), "producer_rate")
    with pytest.raises(api.BadRequest, match=r"^'jitter' must be a number \(finite"):
        api.body(web_request({"topic": "T", "rate": 5, "jitter": "lots"}), "producer_rate")


def test_a_field_the_table_does_not_offer_is_refused_by_the_api(monkeypatch):
    assert api.body(web_request({"topic": "T", "rate": 5}), "producer_rate") == {"topic": "T", "rate": 5}
    spec = ACTIONS["producer_rate"]
    hidden = tuple(replace(p, web=None) if p.name == "rate" else p for p in spec.params)
    monkeypatch.setitem(ACTIONS, "producer_rate", replace(spec, params=hidden))
    with pytest.raises(api.BadRequest, match=r"^unknown field\(s\): rate$"):
        api.body(web_request({"topic": "T", "rate": 5}), "producer_rate")


def test_query_parameters_and_their_defaults_come_from_the_table(monkeypatch):
    assert api.query(web_request(), "lag_series", group="G") == {"group": "G", "seconds": 300}
    spec = ACTIONS["lag_series"]
    longer = tuple(replace(p, web_default=60, rule=Rule(lambda v: v <= 60, "at most {value}?"))
                   if p.name == "seconds" else p for p in spec.params)
    monkeypatch.setitem(ACTIONS, "lag_series", replace(spec, params=longer))
    assert api.query(web_request(), "lag_series", group="G") == {"group": "G", "seconds": 60}
    with pytest.raises(api.BadRequest, match=r"^at most 61\?$"):
        api.query(web_request(query={"seconds": "61"}), "lag_series", group="G")


def test_choices_come_from_the_table():
    with pytest.raises(api.BadRequest, match=r"^unknown mode 'pull'; expected one of push, lite_pull, pop$"):
        api.body(web_request({"mode": "pull"}), "set_mode", group="G")


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_every_action_has_a_handler_taking_exactly_its_params(name):
    handler = getattr(LabController, f"action_{name}")
    signature = [(p.name, p.default) for p in list(inspect.signature(handler).parameters.values())[1:]]
    table = [(p.name, inspect.Parameter.empty if p.required else p.default) for p in ACTIONS[name].params]
    assert signature == table
    assert all(p.required or p.default is not NOT_GIVEN for p in ACTIONS[name].params)


def test_the_controller_answers_no_action_the_table_lacks():
    handlers = {n[len("action_"):] for n in dir(LabController) if n.startswith("action_")}
    assert handlers == set(ACTIONS)


def lab():
    state = LabState()
    state.topics["TopicTest"] = ["broker-a:0"]
    state.brokers["broker-a"] = True
    return SimpleNamespace(state=state)


@pytest.mark.parametrize("action, params, reason", [
    ("explode", {}, "unknown action 'explode'; valid: add_consumer, broker, consumer, "),
    (["state"], {}, "unknown action ['state']"),
    ("state", [], "params must be an object"),
    ("set_strategy", {"group": "G"}, "set_strategy: missing a required argument: 'strategy'"),
    ("state", {"x": 1}, "state: got an unexpected keyword argument 'x'"),
    ("producer_rate", {"topic": "TopicTest", "rate": -1}, "rate must be between 0 and 50000, not -1"),
    ("producer_rate", {"topic": "Nope", "rate": 1}, "unknown topic 'Nope'; known: TopicTest"),
    ("queues", {"topic": "TopicTest", "delta": 0}, "delta must not be 0"),
    ("broker", {"broker": "broker-a", "online": "no"}, "online must be true or false, not 'no'"),
    ("observe", {"group": "a b"}, "group name 'a b' has ' ': use only letters"),
])
def test_the_lab_refuses_by_the_table(action, params, reason):
    with pytest.raises(bus.LabError) as refused:
        checked_request(lab(), action, params)
    assert str(refused.value).startswith(reason)


def test_the_lab_checks_a_consumer_actions_own_params_only():
    state = lab()
    _, checked = checked_request(state, "producer_burst", {"topic": "TopicTest", "count": "12"})
    assert checked["count"] == 12   # a number's text is taken as the number
    state.state.add_group("G", "TopicTest", "push", "AVG")
    state.state.add_client("c1", "G", "push").status = "running"
    assert checked_request(state, "consumer", {"client_id": "c1", "action": "hang", "ms": "x"})[1]["ms"] == "x"
    with pytest.raises(bus.LabError, match="ms must be a number"):
        checked_request(state, "consumer", {"client_id": "c1", "action": "slow", "ms": "x"})


def test_a_control_the_attached_cluster_turned_off_is_refused_first():
    state = lab()
    state.state.cluster = {"disabled": {"queues": "this cluster's queues are not ours to change"}}
    with pytest.raises(bus.LabError, match="^this cluster's queues are not ours to change$"):
        checked_request(state, "queues", {"topic": "Nope", "delta": 0})
    assert actions.disabled(state, "broker_online") is None


# ---------------------------------------------------------------- the web tests' lab: the controller on a fake world

async def test_the_web_tests_lab_refuses_as_the_controller_does(fake_lab):
    for action, params, reason in [
        ("explode", {}, "unknown action 'explode'; valid: add_consumer, broker, consumer, "),
        ("set_strategy", {"group": "GID_LAB"}, "set_strategy: missing a required argument: 'strategy'"),
        ("producer_rate", {"topic": "TopicTest", "rate": 10**6}, "rate must be between 0 and 50000"),
        ("add_consumer", {"group": "GID_LAB", "mode": "pop"}, "group GID_LAB consumes in push mode; use set_mode"),
        ("queues", {"topic": "TopicTest", "delta": -5, "broker": "broker-a"}, "TopicTest has only 4 queue(s) on broker-a"),
        # Its world has no name server: no cluster to observe.
        ("observe", {"group": "GID_THEIRS"}, "observing a group needs a name server"),
    ]:
        with pytest.raises(bus.LabError) as refused:
            await fake_lab.ask(action, **params)
        assert str(refused.value).startswith(reason)


async def test_the_web_tests_lab_takes_what_the_table_offers(fake_lab):
    await fake_lab.ask("set_strategy", group="GID_LAB", strategy="avg_by_circle", options={})
    assert fake_lab.groups["GID_LAB"].strategy == "AVG_BY_CIRCLE"
    added = await fake_lab.ask("add_consumer", group="GID_NEW", strategy="AVG_BY_CIRCLE")
    assert added["state"]["groups"]["GID_NEW"]["strategy"] == "AVG_BY_CIRCLE"
    assert added["state"]["groups"]["GID_NEW"]["assignments"] == {added["client_id"]: fake_lab.labels()}
