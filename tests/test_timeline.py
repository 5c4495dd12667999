"""The live view's recent past (consumers_app/lab/timeline.py): lag sparklines and replay,
as units and through the web API against a FakeLab (the lab's controller on a fake broker)."""
import pytest

from consumers_app.lab.timeline import GroupTimeline

from .fake_lab import TOPIC

T0 = 1_700_000_000_000


def poll(timeline, ts, lags, owners):
    timeline.add(ts, {label: {"lag": lag, "time_lag_ms": lag * 10, "cached_count": lag // 2, "owners": owners[label]}
                      for label, lag in lags.items()})


def test_series_gives_each_queue_its_lag_and_the_group_its_total():
    t = GroupTimeline()
    owners = {"b:0": ["c1"], "b:1": ["c2"]}
    for i in range(10):
        poll(t, T0 + i * 1000, {"b:0": i, "b:1": 2 * i}, owners)
    series = t.series(T0 + 9000, seconds=5)
    assert series["ts"] == [T0 + i * 1000 for i in range(4, 10)]
    assert series["queues"] == {"b:0": [4, 5, 6, 7, 8, 9], "b:1": [8, 10, 12, 14, 16, 18]}
    assert series["total_lag"] == [12, 15, 18, 21, 24, 27]
    assert series["time_lag_ms"] == [80, 100, 120, 140, 160, 180]


def test_a_queue_that_came_later_is_null_before():
    t = GroupTimeline()
    poll(t, T0, {"b:0": 1}, {"b:0": ["c1"]})
    poll(t, T0 + 1000, {"b:0": 1, "b:1": 5}, {"b:0": ["c1"], "b:1": ["c1"]})
    assert t.series(T0 + 1000)["queues"] == {"b:0": [1, 1], "b:1": [None, 5]}


def test_at_replays_the_second_asked_for_and_shares_unchanged_owners():
    t = GroupTimeline()
    poll(t, T0, {"b:0": 3, "b:1": 0}, {"b:0": ["c1"], "b:1": ["c2"]})
    poll(t, T0 + 1000, {"b:0": 4, "b:1": 0}, {"b:0": ["c1"], "b:1": ["c2"]})
    poll(t, T0 + 2000, {"b:0": 9, "b:1": 1}, {"b:0": ["c1", "c2"], "b:1": []})
    assert t.samples[1].owners is t.samples[0].owners
    assert t.at(T0 - 1) is None
    at = t.at(T0 + 1500)
    assert at["ts"] == T0 + 1000 and at["oldest_ts"] == T0
    assert at["queues"]["b:0"] == {"owners": ["c1"], "lag": 4, "time_lag_ms": 40, "cached_count": 2}
    assert t.at(T0 + 99_000)["queues"]["b:0"]["owners"] == ["c1", "c2"]


def test_the_window_is_bounded():
    t = GroupTimeline(window_s=60)
    for i in range(200):
        poll(t, T0 + i * 1000, {"b:0": i}, {"b:0": ["c1"]})
    assert len(t.samples) == 60 and t.at(T0 + 139_999) is None and t.at(T0 + 140_000)["oldest_ts"] == T0 + 140_000


# ------------------------------------------------------------------ through the API

pytestmark_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def lagging_fake_lab(fake_lab):
    """Three offset polls: the start's (no lag), then two more, each with 10 more messages a queue."""
    for _ in range(2):
        for mq in fake_lab.world.broker.queues(TOPIC):
            fake_lab.world.broker.add_backlog(mq, 10)
        await fake_lab.poll()
    return fake_lab


@pytestmark_db
async def test_the_lag_series_and_a_past_second_through_the_api(async_client, lagging_fake_lab):
    series = (await async_client.get("/api/groups/GID_LAB/lag", {"seconds": "60"})).json()
    assert len(series["ts"]) == 3 and series["total_lag"] == [0, 80, 160]
    assert set(series["queues"]) == set(lagging_fake_lab.labels())
    at = await async_client.get("/api/groups/GID_LAB/at", {"ts": str(series["ts"][1])})
    assert at.status_code == 200
    queues = at.json()["queues"]
    assert queues["broker-a:0"]["lag"] == 10 and len(queues["broker-a:0"]["owners"]) == 1


@pytestmark_db
@pytest.mark.parametrize("url, reason", [
    ("/api/groups/GID_LAB/lag?seconds=0", "'seconds' must be between 1 and 900, not 0"),
    ("/api/groups/GID_LAB/lag?seconds=soon", "'seconds' must be an integer, not 'soon'"),
    ("/api/groups/GID_LAB/lag?since=1", "unknown query parameter(s): since"),
    ("/api/groups/GID_LAB/at", "missing query parameter 'ts'"),
    ("/api/groups/GID_LAB/at?ts=5", "has no sample at or before 5"),
    ("/api/groups/NOPE/lag", "unknown group 'NOPE'"),
    ("/api/groups/GID_LAB/rebalances/7", "has no rebalance 7"),
])
async def test_bad_requests_are_400s_with_their_reason(async_client, lagging_fake_lab, url, reason):
    response = await async_client.get(url)
    assert response.status_code == 400
    assert reason in response.json()["error"]
