"""The control API against a fake controller on the in-memory bus: every action, every bad input."""
import asyncio
import time

import pytest
from channels.layers import get_channel_layer
from django.test import AsyncClient, override_settings

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.lab import bus
from consumers_app.lab.whatif import preview_strategy
from consumers_app.message_queue import MessageQueue
from dashboard.auth import issue_api_token

from .fake_lab import TOPIC
from .web import actions, post

pytestmark = pytest.mark.django_db(transaction=True)


async def test_state_is_the_snapshot(async_client, fake_lab):
    response = await async_client.get("/api/state")
    assert response.status_code == 200
    group = response.json()["groups"]["GID_LAB"]
    assert (group["strategy"], group["mode"]) == ("AVG", "push")
    assert sorted(group["assignments"]) == ["c1", "c2", "c3"]
    assert sum(len(qs) for qs in group["assignments"].values()) == 8
    assert set(group["queues"]["broker-a:0"]) >= {"lag", "cached_count", "cached_bytes"}


async def test_set_strategy_answers_the_new_state(async_client, fake_lab):
    response = await post(async_client, "/api/groups/GID_LAB/strategy", {"strategy": "AVG_BY_CIRCLE"})
    assert response.status_code == 200, response.content
    group = response.json()["groups"]["GID_LAB"]
    mqs, cids = sort_for_allocation([MessageQueue.from_label(TOPIC, x) for x in group["queues"]], ["c1", "c2", "c3"])
    strategy = get_strategy("AVG_BY_CIRCLE")
    assert group["assignments"] == {c: [mq.label for mq in strategy.allocate("GID_LAB", c, mqs, cids)] for c in cids}
    assert actions(fake_lab, "set_strategy") == [{"group": "GID_LAB", "strategy": "AVG_BY_CIRCLE"}]


async def test_a_strategy_preview_answers_the_moves_and_changes_nothing(async_client, fake_lab):
    before = (await async_client.get("/api/state")).json()
    response = await async_client.get("/api/groups/GID_LAB/strategy/preview", {"strategy": "AVG_BY_CIRCLE"})
    assert response.status_code == 200, response.content
    group = before["groups"]["GID_LAB"]
    want = preview_strategy(get_strategy("AVG_BY_CIRCLE"), "GID_LAB", TOPIC, group["queues"], group["members"],
                            group["assignments"])
    assert response.json() == {"group": "GID_LAB", "strategy": "AVG_BY_CIRCLE", **want}
    assert response.json()["moved"] > 0
    assert actions(fake_lab, "preview_strategy") == [{"group": "GID_LAB", "strategy": "AVG_BY_CIRCLE"}]
    assert (await async_client.get("/api/state")).json() == before


@override_settings(LAB_CONTROL_RATE=1, LAB_CONTROL_BURST=1)
async def test_previews_spend_no_control_budget(async_client, fake_lab):
    for _ in range(3):
        assert (await async_client.get("/api/groups/GID_LAB/strategy/preview?strategy=AVG")).status_code == 200
    assert (await post(async_client, "/api/groups/GID_LAB/strategy", {"strategy": "AVG_BY_CIRCLE"})).status_code == 200


@pytest.mark.parametrize("url, reason", [
    ("/api/groups/GID_LAB/strategy/preview", "missing query parameter 'strategy'"),
    ("/api/groups/GID_LAB/strategy/preview?strategy=FASTEST", "unknown strategy 'FASTEST'"),
    ("/api/groups/GID_LAB/strategy/preview?strategy=AVG&apply=1", "unknown query parameter(s): apply"),
    ("/api/groups/NOPE/strategy/preview?strategy=AVG", "unknown group 'NOPE'"),
    ("/api/groups/GID_WATCHED/strategy/preview?strategy=AVG", "observed"),
])
async def test_a_bad_preview_is_a_400_with_its_reason(async_client, fake_lab, url, reason):
    fake_lab.state.add_group("GID_WATCHED", TOPIC, "push", "").observed = True
    response = await async_client.get(url)
    assert response.status_code == 400
    assert reason in response.json()["error"]


async def test_set_mode(async_client, fake_lab):
    response = await post(async_client, "/api/groups/GID_LAB/mode", {"mode": "lite_pull"})
    assert response.status_code == 200
    assert response.json()["groups"]["GID_LAB"]["mode"] == "lite_pull"


async def test_add_consumer_answers_its_client_id(async_client, fake_lab):
    response = await post(async_client, "/api/groups/GID_LAB/consumers", {"mode": "push"})
    assert response.status_code == 200
    body = response.json()
    assert body["client_id"] == "c4"
    assert "c4" in body["state"]["groups"]["GID_LAB"]["assignments"]


@pytest.mark.parametrize("action, body, params", [
    ("stop", None, {}),
    ("kill", None, {}),
    ("hang", {}, {}),
    ("resume", None, {}),
    ("slow", {"ms": 250}, {"ms": 250}),
    ("fail", {"ratio": 0.25}, {"ratio": 0.25}),
    ("fail", {"ratio": 1}, {"ratio": 1}),
])
async def test_consumer_actions(async_client, fake_lab, action, body, params):
    response = await post(async_client, f"/api/consumers/c2/{action}", body)
    assert response.status_code == 200, response.content
    assert "groups" in response.json()
    assert actions(fake_lab, "consumer") == [{"client_id": "c2", "action": action, **params}]


async def test_an_empty_body_is_fine_for_plain_actions(async_client, fake_lab):
    response = await async_client.generic("POST", "/api/consumers/c1/hang")  # no body at all
    assert response.status_code == 200
    assert response.json()["groups"]["GID_LAB"]["clients"]["c1"]["status"] == "hung"


async def test_producer_and_topology_actions(async_client, fake_lab):
    assert (await post(async_client, "/api/producers/rate", {"topic": TOPIC, "rate": 50})).status_code == 200
    assert (await post(async_client, "/api/producers/rate", {"topic": TOPIC, "rate": 12.5})).status_code == 200
    assert (await post(async_client, "/api/producers/burst", {"topic": TOPIC, "count": 1000})).status_code == 200
    response = await post(async_client, f"/api/topics/{TOPIC}/queues", {"delta": 2, "broker": "broker-b"})
    assert response.status_code == 200
    assert "broker-b:5" in response.json()["groups"]["GID_LAB"]["queues"]
    assert (await post(async_client, f"/api/topics/{TOPIC}/queues", {"delta": -1})).status_code == 200
    response = await post(async_client, "/api/brokers/broker-a/offline")
    assert response.status_code == 200
    assert response.json()["brokers"]["broker-a"] == {"online": False}
    assert (await post(async_client, "/api/brokers/broker-a/online")).status_code == 200
    assert [a for a, _ in fake_lab.requests] == ["producer_rate", "producer_rate", "producer_burst", "queues", "queues",
                                           "broker", "broker"]
    assert fake_lab.requests[3][1] == {"topic": TOPIC, "delta": 2, "broker": "broker-b"}
    assert fake_lab.requests[5][1] == {"broker": "broker-a", "online": False}


@pytest.mark.parametrize("url, body, reason", [
    ("/api/groups/GID_LAB/strategy", "{not json", "not valid JSON"),
    ("/api/groups/GID_LAB/strategy", b"\xff\xfe", "not valid JSON"),
    ("/api/groups/GID_LAB/strategy", [1, 2], "JSON object"),
    ("/api/groups/GID_LAB/strategy", {}, "missing field(s): strategy"),
    ("/api/groups/GID_LAB/strategy", {"strategy": 3}, "'strategy' must be a non-empty string"),
    ("/api/groups/GID_LAB/strategy", {"strategy": ""}, "'strategy' must be a non-empty string"),
    ("/api/groups/GID_LAB/strategy", {"strategy": "FASTEST"}, "unknown strategy 'FASTEST'"),
    ("/api/groups/GID_LAB/strategy", {"strategy": "AVG", "x": 1}, "unknown field(s): x"),
    ("/api/groups/GID_LAB/mode", {"mode": "broadcast"}, "unknown mode 'broadcast'"),
    ("/api/groups/GID_LAB/mode", {"mode": None}, "'mode' must be a non-empty string"),
    ("/api/groups/GID_LAB/consumers", {}, "missing field(s): mode"),
    ("/api/groups/GID_LAB/consumers", {"mode": "pull"}, "unknown mode 'pull'"),
    ("/api/groups/GID_LAB/consumers", {"mode": "push", "client": "rocketmq-cobol"}, "unknown client 'rocketmq-cobol'"),
    ("/api/groups/GID_LAB/consumers", {"mode": "push", "client": 3}, "'client' must be a non-empty string"),
    ("/api/consumers/c1/slow", {}, "missing field(s): ms"),
    ("/api/consumers/c1/slow", {"ms": "100"}, "'ms' must be an integer"),
    ("/api/consumers/c1/slow", {"ms": True}, "'ms' must be an integer"),
    ("/api/consumers/c1/slow", {"ms": 1.5}, "'ms' must be an integer"),
    ("/api/consumers/c1/slow", {"ms": -1}, "'ms' must be >= 0"),
    ("/api/consumers/c1/fail", {"ratio": 1.5}, "between 0 and 1"),
    ("/api/consumers/c1/fail", {"ratio": "half"}, "'ratio' must be a number"),
    ("/api/consumers/c1/stop", {"now": True}, "unknown field(s): now"),
    ("/api/producers/rate", {"topic": TOPIC}, "missing field(s): rate"),
    ("/api/producers/rate", {"topic": TOPIC, "rate": -5}, "'rate' must be >= 0"),
    ("/api/producers/rate", {"topic": 7, "rate": 5}, "'topic' must be a non-empty string"),
    ("/api/producers/burst", {"topic": TOPIC, "count": 0}, "'count' must be >= 1"),
    ("/api/producers/burst", {"topic": TOPIC, "count": 2.0}, "'count' must be an integer"),
    (f"/api/topics/{TOPIC}/queues", {"delta": 0}, "'delta' must not be 0"),
    (f"/api/topics/{TOPIC}/queues", {"delta": 1, "broker": ""}, "'broker' must be a non-empty string"),
    ("/api/brokers/broker-a/offline", {"force": True}, "unknown field(s): force"),
])
async def test_bad_input_is_refused_before_the_controller(async_client, fake_lab, url, body, reason):
    response = await post(async_client, url, body)
    assert response.status_code == 400
    assert reason in response.json()["error"]
    assert fake_lab.requests == []


@pytest.mark.parametrize("url, body, reason", [
    ("/api/groups/NOPE/strategy", {"strategy": "AVG"}, "unknown group 'NOPE'"),
    ("/api/consumers/c99/kill", None, "unknown consumer 'c99'"),
    ("/api/producers/rate", {"topic": "Other", "rate": 1}, "unknown topic 'Other'"),
    ("/api/brokers/broker-z/offline", None, "unknown broker 'broker-z'"),
    ("/api/topics/TopicTest/queues", {"delta": -9}, "has only 4 queue(s)"),
])
async def test_the_controllers_refusal_is_a_400_with_its_reason(async_client, fake_lab, url, body, reason):
    before = (await async_client.get("/api/state")).json()
    response = await post(async_client, url, body)
    assert response.status_code == 400
    assert reason in response.json()["error"]
    assert (await async_client.get("/api/state")).json() == before


async def test_a_hung_consumers_queues_fill_up_to_flow_control_and_fall_behind(async_client, fake_lab):
    assert (await post(async_client, "/api/consumers/c1/hang")).status_code == 200
    for _ in range(4):   # four report intervals: 250 messages a queue each
        fake_lab.world.tick()
    await fake_lab.poll()
    group = (await async_client.get("/api/state")).json()["groups"]["GID_LAB"]
    hung = group["assignments"]["c1"]
    assert hung and all(group["queues"][x]["cached_count"] == 1000 and group["queues"][x]["lag"] == 1000 for x in hung)
    assert {e["queue"] for e in group["flow_control"] if e["client_id"] == "c1"} == set(hung)
    others = [x for x in group["queues"] if x not in hung]
    assert all(group["queues"][x]["cached_count"] == 0 and group["queues"][x]["lag"] == 0 for x in others)


async def test_a_consumer_that_is_gone_is_refused(async_client, fake_lab):
    assert (await post(async_client, "/api/consumers/c1/kill")).status_code == 200
    response = await post(async_client, "/api/consumers/c1/hang")
    assert response.status_code == 400
    assert response.json() == {"error": "consumer c1 is killed"}


@pytest.mark.parametrize("method, url, status", [
    ("post", "/api/consumers/c1/explode", 404),
    ("post", "/api/nothing/here", 404),
    ("get", "/api/groups/GID_LAB/strategy", 405),
    ("post", "/api/state", 405),
])
async def test_unknown_endpoints_and_methods(async_client, fake_lab, method, url, status):
    response = await getattr(async_client, method)(url)
    assert response.status_code == status
    assert "error" in response.json()


async def test_no_controller_is_a_503(async_client, monkeypatch):
    async def unavailable(action, /, **params):
        raise bus.LabUnavailable("the lab controller did not answer 'state' within 15s")
    monkeypatch.setattr(bus, "request", unavailable)
    response = await async_client.get("/api/state")
    assert response.status_code == 503
    assert "did not answer" in response.json()["error"]


# ---------------------------------------------------------------- who may call

async def test_anonymous_callers_are_refused(fake_lab, settings):
    settings.DASHBOARD_PUBLIC_READ = False
    anonymous = AsyncClient()
    assert (await anonymous.get("/api/state")).status_code == 401
    response = await post(anonymous, "/api/consumers/c1/kill")
    assert response.status_code == 401
    assert "authentication required" in response.json()["error"]
    assert fake_lab.requests == []


async def test_public_read_opens_state_but_not_control(fake_lab, settings):
    settings.DASHBOARD_PUBLIC_READ = True
    anonymous = AsyncClient()
    assert (await anonymous.get("/api/state")).status_code == 200
    assert (await post(anonymous, "/api/groups/GID_LAB/strategy", {"strategy": "AVG"})).status_code == 401


async def test_api_token_authenticates_without_csrf(fake_lab, user):
    token = await asyncio.to_thread(issue_api_token, "script")
    scripted = AsyncClient(enforce_csrf_checks=True)
    response = await post(scripted, "/api/consumers/c1/hang", None, Authorization=f"Token {token}")
    assert response.status_code == 200
    assert (await scripted.get("/api/state", headers={"Authorization": f"Token {token}"})).status_code == 200
    # An unknown action is a JSON 404 for a script too, not CSRF's HTML 403.
    response = await post(scripted, "/api/consumers/c1/explode", None, Authorization=f"Token {token}")
    assert response.status_code == 404 and "error" in response.json()


@pytest.mark.parametrize("header, reason", [
    ("Token not-a-token", "unknown API token"),
    ("Bearer abc", "must read 'Token <api token>'"),
    ("Token ", "must read 'Token <api token>'"),
])
async def test_bad_tokens_are_a_401(fake_lab, header, reason):
    response = await AsyncClient().get("/api/state", headers={"Authorization": header})
    assert response.status_code == 401
    assert reason in response.json()["error"]


async def test_session_callers_need_the_csrf_token(fake_lab, user):
    browser = AsyncClient(enforce_csrf_checks=True)
    await browser.aforce_login(user)
    page = await browser.get("/")
    assert page.status_code == 200
    csrf = browser.cookies["csrftoken"].value
    refused = await post(browser, "/api/consumers/c1/hang")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["error"]
    assert fake_lab.requests == []
    accepted = await post(browser, "/api/consumers/c1/hang", None, X_CSRFToken=csrf)
    assert accepted.status_code == 200


async def test_healthz_follows_the_broker_process(fake_lab):
    async_client = AsyncClient()   # no login: a load balancer asks it
    response = await async_client.get("/healthz")
    assert (response.status_code, response.json()["ok"]) == (200, True)
    fake_lab.broker_process.update(up=False, restarts=2, reason="the broker was killed by signal 9")
    response = await async_client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["broker_process"]["restarts"] == 2


async def test_a_change_whose_caller_gave_up_is_never_applied(fake_lab):
    """The bus drops a queued change once its caller's deadline passed (that caller got a 503)."""
    layer = get_channel_layer()
    reply_channel = await layer.new_channel()
    await layer.send(bus.CONTROLLER_CHANNEL, {
        "type": "lab.request", "action": "set_strategy", "params": {"group": "GID_LAB", "strategy": "AVG_BY_CIRCLE"},
        "reply_to": reply_channel, "deadline": time.time() - 1})
    # A later request is answered, so the expired one was seen (and dropped) first.
    await bus.request("set_mode", group="GID_LAB", mode="push")
    assert actions(fake_lab, "set_strategy") == []
    assert fake_lab.groups["GID_LAB"].strategy == "AVG"
