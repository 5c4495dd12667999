"""GET /metrics: who may scrape, what a scrape says when there is nothing to say, and that
a real lab's scrape says what /api/state says at the same moment."""
import asyncio

import pytest
import requests
from channels.layers import get_channel_layer
from django.test import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

from consumers_app.lab.rebalance_totals import RebalanceTotals
from dashboard.auth import issue_api_token

from .support import free_port, manage_py, wait_until
from .test_lab_runlab import migrated_env, start_lab, wait_for_three

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def lab(fake_lab):
    return fake_lab


def samples(text: str) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, as Prometheus' own parser reads the page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def queue_key(name, group, topic, label):
    broker, queue_id = label.rsplit(":", 1)
    return (name, tuple(sorted({"consumer_group": group, "topic": topic, "broker": broker,
                                "queue_id": queue_id}.items())))


def group_key(name, group, topic, **extra):
    return (name, tuple(sorted({"consumer_group": group, "topic": topic, **extra}.items())))


def expected(snapshot: dict) -> dict[tuple, float]:
    """What a scrape of ``snapshot`` must say, from /api/state's figures."""
    want = {}
    for name, g in snapshot["groups"].items():
        topic = g["topic"]
        for label, q in g["queues"].items():
            want[queue_key("rocketmq_consumer_lag_messages", name, topic, label)] = q["lag"]
            if q["time_lag_ms"] is not None:
                want[queue_key("rocketmq_consumer_lag_latency", name, topic, label)] = q["time_lag_ms"]
            want[queue_key("rocketmq_consumer_inflight_messages", name, topic, label)] = q["inflight"]
            want[queue_key("rebalance_lab_queue_owners", name, topic, label)] = len(q["owners"])
        totals = g["rebalance_totals"]
        for metric, key in [("rebalances", "rebalances"), ("queues_moved", "moved"), ("duplicates", "duplicates")]:
            want[group_key(f"rebalance_lab_{metric}_total", name, topic)] = totals[key]
        for kind in ("gap", "overlap"):
            for le, count in totals[f"{kind}_s"]["buckets"]:
                le = le if le == "+Inf" else str(float(le))
                want[group_key(f"rebalance_lab_rebalance_{kind}_seconds_bucket", name, topic, le=le)] = count
            want[group_key(f"rebalance_lab_window_longest_{kind}_seconds", name, topic)] = \
                g["handoffs"]["totals"][f"{kind}_ms"] / 1000
        want[group_key("rebalance_lab_group_members", name, topic)] = len(g["members"])
    return want


# ---------------------------------------------------------------- who may scrape

async def test_without_a_token_a_scrape_is_a_json_401_that_names_the_scheme(lab):
    response = await AsyncClient().get("/metrics")
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")
    assert "Token" in response.json()["error"] and response["WWW-Authenticate"].startswith("Token")
    bad = await AsyncClient().get("/metrics", headers={"Authorization": "Token not-a-token"})
    assert bad.status_code == 401 and "unknown API token" in bad.json()["error"]
    assert lab.requests == []


async def test_a_token_or_public_read_may_scrape(lab, settings):
    token = await asyncio.to_thread(issue_api_token, "prometheus")
    scraped = await AsyncClient().get("/metrics", headers={"Authorization": f"Token {token}"})
    assert scraped.status_code == 200 and scraped["Content-Type"].startswith("text/plain; version=0.0.4")
    assert any(name == "rocketmq_consumer_lag_messages" for name, _ in samples(scraped.content.decode()))
    settings.DASHBOARD_PUBLIC_READ = True
    assert (await AsyncClient().get("/metrics")).status_code == 200


async def test_openmetrics_is_answered_when_asked_for(lab, settings):
    settings.DASHBOARD_PUBLIC_READ = True
    response = await AsyncClient().get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.status_code == 200 and response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


async def test_a_post_is_a_json_405(lab, settings):
    settings.DASHBOARD_PUBLIC_READ = True
    response = await AsyncClient().post("/metrics")
    assert response.status_code == 405 and response["Allow"] == "GET" and "GET" in response.json()["error"]


async def test_no_controller_is_a_json_503_not_a_stack_trace(settings):
    await get_channel_layer().flush()   # nobody serves the controller's channel
    settings.DASHBOARD_PUBLIC_READ = True
    response = await AsyncClient().get("/metrics")
    assert response.status_code == 503 and response["Retry-After"]
    assert response["Content-Type"].startswith("application/json")
    assert "did not answer" in response.json()["error"] and "Traceback" not in response.content.decode()


# ---------------------------------------------------------------- counters that only grow

def summary(id, end_ts, moved=2, duplicates=1, gap_ms=0, overlap_ms=300, ongoing=False):
    return {"id": id, "end_ts": end_ts, "moved": moved, "duplicates": duplicates, "unmeasured": 0,
            "gap_ms": gap_ms, "overlap_ms": overlap_ms, "overlap_ongoing": ongoing}


def test_a_rebalance_counts_once_when_settled_and_stays_counted_when_forgotten():
    totals = RebalanceTotals()
    totals.fold([summary(1, 0, ongoing=True), summary(2, 1_000, gap_ms=1_500, overlap_ms=0)], 20_000)
    assert totals.rebalances == 0                       # neither settled yet
    totals.fold([summary(1, 0, ongoing=True), summary(2, 1_000, gap_ms=1_500, overlap_ms=0)], 40_000)
    assert (totals.rebalances, totals.moved, totals.duplicates) == (1, 2, 1)   # 2 settled; 1 still overlapping
    totals.fold([summary(1, 0, overlap_ms=45_000), summary(2, 1_000)], 50_000)
    totals.fold([summary(1, 0, overlap_ms=45_000)], 60_000)                    # 2 forgotten: still counted
    totals.fold([], 70_000)
    snap = totals.snapshot()
    assert (snap["rebalances"], snap["moved"], snap["duplicates"]) == (2, 4, 2)
    assert dict(snap["gap_s"]["buckets"])["2.5"] == 2 and dict(snap["gap_s"]["buckets"])["1.0"] == 1
    assert dict(snap["overlap_s"]["buckets"])["30.0"] == 1 and snap["overlap_s"]["count"] == 2
    assert snap["overlap_s"]["sum_s"] == 45.0


# ---------------------------------------------------------------- a real lab

def test_a_real_labs_scrape_says_what_api_state_says(tmp_path):
    env = migrated_env(tmp_path)
    token_maker = manage_py("createtoken", "prometheus", env=env)
    token = token_maker.communicate(timeout=60)[0].strip().splitlines()[-1]
    port = free_port()
    lab, browser = start_lab(port, env)
    base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Token {token}"}
    try:
        wait_for_three(lab, browser, port)
        # A backlog, so lag, time lag and owners are not all zero.
        requests.post(f"{base}/api/producers/burst", headers=headers, json={"topic": "TopicTest", "count": 400},
                      timeout=30).raise_for_status()

        def consistent():
            """A scrape between two equal /api/state answers (the figures move once a second)."""
            before = requests.get(f"{base}/api/state", headers=headers, timeout=10).json()
            scrape = requests.get(f"{base}/metrics", headers=headers, timeout=10)
            after = requests.get(f"{base}/api/state", headers=headers, timeout=10).json()
            assert scrape.status_code == 200, scrape.text
            figures = [expected(s) for s in (before, after)]
            return figures[0] == figures[1] and (figures[0], samples(scrape.text))

        want, got = wait_until(consistent, timeout=30, message="two equal /api/state answers around a scrape")
        assert want and {key: got.get(key) for key in want} == want
        lag_keys = [k for k in want if k[0] == "rocketmq_consumer_lag_messages"]
        assert len(lag_keys) == 8 and all(dict(k[1])["consumer_group"] == "GID_LAB" for k in lag_keys)
        assert all(got[k] == 1 for k in want if k[0] == "rebalance_lab_queue_owners")
    finally:
        assert lab.stop() == 0, "".join(lab.lines[-40:])


def test_the_sample_grafana_dashboard_asks_for_metrics_the_lab_exports():
    import json
    import re

    from consumers_app.lab.state import LabState
    from dashboard.metrics import exposition

    from .support import REPO

    state = LabState()
    state.add_group("G", "T", "push", "AVG")
    state.set_topic_queues("T", ["b:0"])
    state.set_offsets("G", 1_000, [{"label": "b:0", "committed_offset": 1, "max_offset": 3,
                                    "oldest_unconsumed_store_ts": 900}])
    exported = {name for name, _ in samples(exposition(state.snapshot())[0].decode())}
    dashboard = json.loads((REPO / "docs" / "grafana-rebalance-lab.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    asked = {name for expr in exprs for name in re.findall(r"\b(?:rocketmq|rebalance_lab)_\w+", expr)}
    assert len(asked) >= 8 and asked <= exported, asked - exported
