"""The live websocket: snapshot first, then one event per frame; who may connect; slow readers."""
import asyncio

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from consumers_app.events import make_event, now_ms
from consumers_app.message_queue import MessageQueue
from consumers_app.lab import bus
from dashboard import consumers
from dashboard.asgi import application
from dashboard.auth import issue_api_token

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1:8000")
HOST = (b"host", b"127.0.0.1:8000")


@pytest.fixture
def token(db):
    return issue_api_token("script")


def communicator(query: str = "", headers=(ORIGIN, HOST), path: str = "/ws/lab/"):
    return WebsocketCommunicator(application, f"{path}{query}", headers=list(headers))


async def connected(query: str = "", headers=(ORIGIN, HOST)):
    ws = communicator(query, headers)
    ok, _ = await ws.connect()
    assert ok, "the websocket was refused"
    return ws


def events(n: int, **fields) -> list[dict]:
    """pq events as the controller publishes them (the JSON form)."""
    return [make_event("pq", "GID_LAB", "c1", topic="TopicTest", queue=MessageQueue("TopicTest", "broker-a", i),
                       cached_count=i, **fields).to_dict() for i in range(n)]


async def test_snapshot_first_then_one_event_per_frame(fake_lab, token):
    ws = await connected(f"?token={token}")
    snapshot = await ws.receive_json_from()
    assert snapshot["type"] == "snapshot"
    group = snapshot["groups"]["GID_LAB"]
    assert {"strategy", "mode", "assignments", "queues"} <= set(group)
    assert set(group["queues"]["broker-b:3"]) >= {"lag", "cached_count", "cached_bytes"}

    batch = events(3)
    await bus.publish(batch)
    frames = [await ws.receive_json_from() for _ in batch]
    assert frames == batch
    assert all({"ts", "type", "group", "client_id"} <= set(f) for f in frames)
    await ws.disconnect()


async def test_actions_reach_every_socket_as_events(fake_lab, token):
    first, second = await connected(f"?token={token}"), await connected(f"?token={token}")
    for ws in (first, second):
        assert (await ws.receive_json_from())["type"] == "snapshot"
    await bus.request("set_strategy", group="GID_LAB", strategy="AVG_BY_CIRCLE")
    for ws in (first, second):
        frame = await ws.receive_json_from()   # the lab's word of the switch, then each consumer's
        assert (frame["type"], frame["fault"], frame["clients"]) == ("fault", "strategy", ["c1", "c2", "c3"])
        while (frame := await ws.receive_json_from())["type"] != "assignment":
            pass
        assert (frame["client_id"], frame["strategy"], frame["reason"]) == ("c1", "AVG_BY_CIRCLE", "strategy")
    await first.disconnect()
    await second.disconnect()


async def test_session_cookie_authenticates(fake_lab):
    browser = Client()
    await asyncio.to_thread(browser.force_login, await get_user_model().objects.acreate(username="alice"))
    cookie = (b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())
    ws = await connected(headers=(ORIGIN, HOST, cookie))
    assert (await ws.receive_json_from())["type"] == "snapshot"
    await ws.disconnect()


async def test_anonymous_is_refused_unless_public_read(fake_lab, settings):
    settings.DASHBOARD_PUBLIC_READ = False
    ws = communicator()
    assert (await ws.connect())[0] is False
    settings.DASHBOARD_PUBLIC_READ = True
    ws = await connected()
    assert (await ws.receive_json_from())["type"] == "snapshot"
    await ws.disconnect()


async def test_unknown_token_is_refused_even_when_public(fake_lab, settings):
    settings.DASHBOARD_PUBLIC_READ = True
    assert (await communicator("?token=nope").connect())[0] is False


async def test_foreign_origin_is_refused(fake_lab, token):
    ws = communicator(f"?token={token}", headers=[(b"origin", b"http://evil.example"), HOST])
    assert (await ws.connect())[0] is False


@pytest.mark.parametrize("origin", [
    b"http://127.0.0.1:8001",      # another port on the same host: another site
    b"https://127.0.0.1:8000",     # another scheme
    b"http://localhost:8000",      # an allowed host, but not the one the page was served from
    b"null",
])
async def test_origin_must_match_scheme_host_and_port(fake_lab, token, origin):
    ws = communicator(f"?token={token}", headers=[(b"origin", origin), HOST])
    assert (await ws.connect())[0] is False


async def test_unknown_websocket_paths_close_with_a_reason(fake_lab, token):
    ws = communicator(f"?token={token}", path="/ws/nothing-here/")
    assert (await ws.connect())[0] is True
    closed = await ws.receive_output()
    assert closed["code"] == consumers.NO_SUCH_SOCKET and "/ws/lab/" in closed["reason"]


async def test_scripts_without_origin_still_need_a_token(fake_lab, token, settings):
    settings.DASHBOARD_PUBLIC_READ = False
    assert (await communicator(headers=()).connect())[0] is False
    ws = await connected(f"?token={token}", headers=())
    assert (await ws.receive_json_from())["type"] == "snapshot"
    await ws.disconnect()


async def test_no_controller_closes_with_lab_unavailable(token, monkeypatch):
    async def unavailable(action, /, **params):
        raise bus.LabUnavailable("no controller")
    monkeypatch.setattr(bus, "request", unavailable)
    ws = communicator(f"?token={token}")
    await ws.connect()
    assert (await ws.receive_output())["code"] == consumers.LAB_UNAVAILABLE


async def test_a_stale_backlog_is_replaced_by_a_fresh_snapshot(fake_lab, token):
    ws = await connected(f"?token={token}")
    await ws.receive_json_from()
    await bus.publish(events(2, ts=now_ms() - consumers.STALE_AFTER_MS - 1000))
    fresh = events(1)
    await bus.publish(fresh)
    assert (await ws.receive_json_from())["type"] == "snapshot"
    assert await ws.receive_json_from() == fresh[0]
    await ws.disconnect()


async def test_a_page_that_falls_behind_gets_a_snapshot_when_it_catches_up(fake_lab, token, monkeypatch):
    monkeypatch.setattr(consumers, "MAX_UNACKED", 3)
    ws = await connected(f"?token={token}")
    await ws.receive_json_from()
    await ws.send_json_to({"type": "ack", "received": 1})   # the page acks: it has seen the snapshot
    await ws.send_json_to({"type": "snapshot"})              # answered after the ack was taken in
    assert (await ws.receive_json_from())["type"] == "snapshot"
    await bus.publish(events(4))        # 2 + 4 sent, 1 acked: more than 3 behind, so the tap closes
    await bus.publish(events(2))        # not sent while the page is behind
    received = [await ws.receive_json_from() for _ in range(4)]
    assert [f["queue"] for f in received] == ["broker-a:0", "broker-a:1", "broker-a:2", "broker-a:3"]
    await ws.send_json_to({"type": "ack", "received": 6})   # caught up: a snapshot comes next
    assert (await ws.receive_json_from())["type"] == "snapshot"
    after = events(1)
    await bus.publish(after)
    # The second batch may still sit in the channel when the ack arrives; then it comes
    # after the snapshot (harmless), but never before it.
    while (frame := await ws.receive_json_from()) != after[0]:
        assert frame["ts"] <= after[0]["ts"]
    await ws.disconnect()


async def test_a_snapshot_on_request(fake_lab, token):
    ws = await connected(f"?token={token}")
    await ws.receive_json_from()
    await ws.send_json_to({"type": "snapshot"})
    assert (await ws.receive_json_from())["type"] == "snapshot"
    await ws.disconnect()
