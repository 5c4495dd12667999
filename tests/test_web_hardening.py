"""What a flood or hostile input gets from the web side: JSON answers, nothing applied
that was refused, rate limits per user and per address (issue: runs for days)."""
import asyncio

import pytest
from channels.layers import get_channel_layer
from django.test import AsyncClient, override_settings

from consumers_app.lab import bus

from .web import actions, post

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(LAB_CONTROL_RATE=1, LAB_CONTROL_BURST=3)
async def test_control_actions_past_the_users_budget_get_429_and_are_not_applied(async_client, fake_lab):
    answers = [await post(async_client, "/api/groups/GID_LAB/strategy", {"strategy": "AVG_BY_CIRCLE"}) for _ in range(6)]
    codes = [a.status_code for a in answers]
    assert codes[:3] == [200, 200, 200] and set(codes[3:]) == {429}, codes
    refused = answers[3]
    assert "too many control requests" in refused.json()["error"]
    assert int(refused["Retry-After"]) >= 1
    assert len(actions(fake_lab, "set_strategy")) == 3
    # Reading is not a control action: never throttled.
    assert (await async_client.get("/api/state")).status_code == 200


@override_settings(LAB_BURST_MESSAGES_PER_MINUTE=1000)
async def test_bursts_spend_a_per_user_message_budget(async_client, fake_lab):
    assert (await post(async_client, "/api/producers/burst", {"topic": "TopicTest", "count": 800})).status_code == 200
    again = await post(async_client, "/api/producers/burst", {"topic": "TopicTest", "count": 800})
    assert again.status_code == 429 and "burst budget" in again.json()["error"]
    too_big = await post(async_client, "/api/producers/burst", {"topic": "TopicTest", "count": 1001})
    assert too_big.status_code == 400 and "at most 1000" in too_big.json()["error"]
    assert [p["count"] for p in actions(fake_lab, "producer_burst")] == [800]


@pytest.mark.parametrize("raw, reason", [
    ("[" * 20_000 + "]" * 20_000, "nested too deeply"),
    ('{"topic": "TopicTest", "rate": ' + "1" + "0" * 400 + "}", "at most 10**15"),
    ('{"topic": "TopicTest", "rate": 1e400}', "a number (finite"),
    ('{"topic": "TopicTest", "rate": ' + "9" * 5000 + "}", "not valid JSON"),
    ('{"topic": "TopicTest", "rate": 1, "x": "' + "a" * 70_000 + '"}', "larger than"),
])
async def test_hostile_bodies_are_400_with_a_reason(async_client, fake_lab, raw, reason):
    response = await post(async_client, "/api/producers/rate", raw)
    assert response.status_code == 400, response.content[:200]
    assert reason in response.json()["error"]
    assert actions(fake_lab, "producer_rate") == []


async def test_a_full_controller_queue_is_503_json_with_retry_after(async_client):
    """No controller reads its channel and the queue is full: the caller learns at once."""
    layer = get_channel_layer()
    await layer.flush()
    try:
        for i in range(layer.capacity):
            await layer.send(bus.CONTROLLER_CHANNEL, {"type": "lab.request", "action": "state", "params": {},
                                                      "reply_to": f"nobody.{i}"})
        response = await asyncio.wait_for(async_client.get("/api/state"), 5)
        assert response.status_code == 503
        assert "busy" in response.json()["error"] and response["Retry-After"] == "1"
    finally:
        await layer.flush()


@override_settings(LOGIN_FAILURES_PER_MINUTE=3)
async def test_failed_logins_are_throttled_per_address():
    browser = AsyncClient()
    for _ in range(3):
        response = await browser.post("/login/", {"username": "mallory", "password": "guess"})
        assert response.status_code == 200   # the form again, with its error
    response = await browser.post("/login/", {"username": "mallory", "password": "guess"})
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    # A bad one-time link counts as a failure too, and is refused the same way now.
    assert (await browser.get("/login/?token=nope")).status_code == 429


def test_the_database_file_and_secret_key_are_the_owners_only(tmp_path):
    import os
    import stat
    import subprocess
    import sys

    from .support import REPO
    env = {**os.environ, "LAB_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    env.pop("DJANGO_SECRET_KEY", None)
    subprocess.run([sys.executable, str(REPO / "manage.py"), "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
    for name in ("db.sqlite3", "secret_key"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == 0o600, f"{name}: {oct(mode)}"


async def test_pages_carry_a_content_security_policy(async_client):
    page = await async_client.get("/")
    policy = page["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    login = await AsyncClient().get("/login/")
    assert "default-src 'self'" in login["Content-Security-Policy"]
