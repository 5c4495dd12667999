"""The Spark lag job, its reports and pages, on a small recorded scenario (one Spark session).

The scenario and its expected lag history, in plain Python:

Group G1 reads TopicTest: 8 queues (broker-a:0-3, broker-b:0-3) sampled every second at
+300 ms for 5 minutes from 10:58:00Z (so the data crosses an hour boundary):

* every queue receives 10 msgs/s; healthy queues commit every 5 s, 20+q messages behind;
* broker-b:3 stalls at t=60 s: its committed offset stops while the max offset grows;
* broker-a:1 rewinds at t=200 s: its committed offset goes 500 back;
* at t=120 s consumer c3 leaves: c1 and c2 rebalance (events) and ownership moves;
* c2 reports flow control (count) at t=30..34 s and (size) at t=250 s;
* the group is switched to AVG_BY_CIRCLE at t=60 s (a ``fault`` event), and the lab
  records the hand-offs of c3's queues to c2 (``handoff`` events, updated as c2 consumes
  duplicates: only the latest counts).

The expectation re-implements the job's definitions (dashboard/lag/job.py, status.py)
independently, on plain lists.
"""
from __future__ import annotations

import math
from collections import defaultdict

T0 = 1_767_265_080_000  # 2026-01-01T10:58:00Z
SECONDS = 300
GROUP = "G1"
TOPIC = "TopicTest"
QUEUES = [("broker-a", 0), ("broker-a", 1), ("broker-a", 2), ("broker-a", 3),
          ("broker-b", 0), ("broker-b", 1), ("broker-b", 2), ("broker-b", 3)]
STALLED = ("broker-b", 3)
REWOUND = ("broker-a", 1)
STATUS_ORDER = ["OK", "WARN", "STALL", "STOP", "REWIND"]
HANDOFF_AT = T0 + 120_000 + 300 + 600   # c2 took c3's queues when its rebalance ended


def _max_offset(i: int, t: int) -> int:
    return 1000 + 10 * t + i


def _store_ts(i: int, offset: int) -> int:
    return T0 + (offset - 1000 - i) * 100  # 10 msgs/s since T0


def _owner(queue, t: int) -> str:
    if t < 120:
        return {"broker-a": ["c1", "c1", "c1", "c2"], "broker-b": ["c2", "c2", "c3", "c3"]}[queue[0]][queue[1]]
    return "c1" if queue[0] == "broker-a" else "c2"


def snapshot_rows(t: int) -> list[dict]:
    ts = T0 + t * 1000 + 300
    rows = []
    for i, queue in enumerate(QUEUES):
        healthy = _max_offset(i, t - t % 5) - (20 + i)
        co = healthy
        if queue == STALLED and t >= 60:
            co = _max_offset(i, 60) - (20 + i)
        if queue == REWOUND and t >= 200:
            co = healthy - 500
        mx = _max_offset(i, t)
        lag = mx - co
        rows.append({
            "ts": ts, "group": GROUP, "topic": TOPIC, "broker": queue[0], "queue_id": queue[1],
            "broker_min_offset": 0, "broker_max_offset": mx, "consumer_offset": co, "owner": _owner(queue, t),
            "cached_count": lag, "cached_bytes": lag * 100, "inflight": 0,
            "oldest_unconsumed_store_ts": _store_ts(i, co) if lag > 0 else 0,
        })
    return rows


def events(t: int) -> list[dict]:
    ts = T0 + t * 1000 + 300
    out = []
    if t == 120:
        out += [
            {"ts": ts - 200, "type": "membership", "group": GROUP, "client_id": "c3", "reason": "left",
             "left": ["c3"], "source": "broker"},
            {"ts": ts - 100, "type": "rebalance", "group": GROUP, "client_id": "c1", "phase": "start"},
            {"ts": ts - 100, "type": "rebalance", "group": GROUP, "client_id": "c2", "phase": "start"},
            {"ts": ts + 400, "type": "rebalance", "group": GROUP, "client_id": "c1", "phase": "end",
             "duration_ms": 500.4, "added": ["broker-a:3"], "removed": []},   # live clients report fractional ms
            {"ts": ts + 600, "type": "rebalance", "group": GROUP, "client_id": "c2", "phase": "end",
             "added": [], "removed": ["broker-b:2", "broker-b:3"]},
        ]
    if t == 60:
        out.append({"ts": ts, "type": "fault", "group": GROUP, "client_id": "c1", "fault": "strategy",
                    "strategy": "AVG_BY_CIRCLE"})
    if t in (121, 123):   # the lab's hand-off figures, then the same hand-offs later on
        for queue, dupes in (("broker-b:2", 5 if t == 121 else 12), ("broker-b:3", 3)):
            out.append({"ts": ts, "type": "handoff", "group": GROUP, "client_id": "c2", "topic": TOPIC,
                        "queue": queue, "from_clients": ["c3"], "rebalance": 1, "added_ts": HANDOFF_AT,
                        "released_ts": HANDOFF_AT - 150, "gap_ms": 150, "duplicates": dupes})
    if 30 <= t < 35:
        out.append({"ts": ts, "type": "flow_control", "group": GROUP, "client_id": "c2", "reason": "count",
                    "threshold": 1000, "value": 1000 + t})
    if t == 250:
        out.append({"ts": ts, "type": "flow_control", "group": GROUP, "client_id": "c2", "reason": "size",
                    "threshold": 100, "value": 150})
    return out


def record(recorder, first: int, last: int) -> None:
    """Feed seconds [first, last) through a Recorder."""
    for t in range(first, last):
        recorder.add_snapshot(snapshot_rows(t))
        for e in events(t):
            recorder.add_event(event_from_dict(e))


# -- expectation ---------------------------------------------------------------------

def _lag(r) -> int:
    base = r["broker_min_offset"] if r["consumer_offset"] < 0 else r["consumer_offset"]
    return max(0, r["broker_max_offset"] - base)


def _time_lag(r) -> int:
    if _lag(r) > 0 and r["oldest_unconsumed_store_ts"] > 0:
        return max(0, r["ts"] - r["oldest_unconsumed_store_ts"])
    return 0


def p95(values) -> int:
    s = sorted(values)
    return s[max(1, math.ceil(len(s) * 0.95)) - 1]


def _half_up(x: float) -> int:
    return math.floor(x + 0.5)


def _windows(samples, res_ms):
    """samples sorted by ts -> {window start: [samples]}"""
    out = defaultdict(list)
    for r in samples:
        out[r["ts"] - r["ts"] % res_ms].append(r)
    return dict(sorted(out.items()))


def _status(points, k, window_ms=60_000, stop_after_ms=300_000):
    """status.py's rules at point k of one queue's 10-s points [(ws, co, lag)]."""
    ws = points[k][0]
    win = [p for p in points[:k + 1] if p[0] >= ws - (window_ms - 10_000)]
    pair_ends = [j for j in range(1, k + 1) if points[j][0] >= ws - (window_ms - 20_000)]
    rewind = any(points[j][1] >= 0 and points[j - 1][1] >= 0 and points[j][1] < points[j - 1][1] for j in pair_ends)
    if rewind:
        return "REWIND"
    if min(p[2] for p in win) == 0 or len(win) < 2:
        return "OK"
    stop = [p for p in points[:k + 1] if p[0] >= ws - (stop_after_ms - 10_000)]
    if (len(stop) == stop_after_ms // 10_000 and len({p[1] for p in stop}) == 1 and min(p[2] for p in stop) > 0):
        return "STOP"
    full = len(win) == window_ms // 10_000
    if full and len({p[1] for p in win}) == 1:
        return "STALL"
    if full and not any(points[j][2] < points[j - 1][2] for j in pair_ends) and points[k][2] > win[0][2]:
        return "WARN"
    return "OK"


def expected(first: int, last: int) -> dict:
    """The lag history of seconds [first, last): {"queue": {(res, broker, qid, ws): {...}},
    "group": {(res, ws): {...}}, "owner": {(broker, qid, owner, ws): {...}}, "rebalances": [...],
    "flow": {(res, client, reason, ws): count}}."""
    per_queue = defaultdict(list)
    for t in range(first, last):
        for r in snapshot_rows(t):
            per_queue[(r["broker"], r["queue_id"])].append(r)
    out = {"queue": {}, "group": {}, "owner": {}, "rebalances": [], "flow": {}}
    statuses = {}
    for res, res_ms in (("10s", 10_000), ("1m", 60_000)):
        for (broker, qid), samples in per_queue.items():
            wins = _windows(samples, res_ms)
            starts = list(wins)
            points = []
            for n, ws in enumerate(starts):
                rows = wins[ws]
                last_r = rows[-1]
                tl_end = _time_lag(last_r)
                if n + 1 < len(starts):
                    nxt = wins[starts[n + 1]][0]
                    if nxt["ts"] - last_r["ts"] <= 2 * res_ms:
                        a, b = _time_lag(last_r), _time_lag(nxt)
                        tl_end = _half_up(a + (b - a) * (ws + res_ms - last_r["ts"]) / (nxt["ts"] - last_r["ts"]))
                lags = [_lag(r) for r in rows]
                out["queue"][(res, broker, qid, ws)] = {
                    "broker_offset": last_r["broker_max_offset"], "consumer_offset": last_r["consumer_offset"],
                    "lag": _lag(last_r), "max_lag": max(lags), "avg_lag": sum(lags) / len(lags), "p95_lag": p95(lags),
                    "time_lag_ms": max(0, tl_end), "max_time_lag_ms": max(_time_lag(r) for r in rows),
                    "owner": last_r["owner"], "samples": len(rows),
                }
                points.append((ws, last_r["consumer_offset"], _lag(last_r)))
            if res == "10s":
                for k, p in enumerate(points):
                    statuses[(broker, qid, p[0] + 10_000)] = _status(points, k)
    for (res, broker, qid, ws), row in out["queue"].items():
        row["status"] = statuses.get((broker, qid, ws + (10_000 if res == "10s" else 60_000)), "OK")
    # group: sum over queues per ts, then windows
    per_ts = defaultdict(int)
    for samples in per_queue.values():
        for r in samples:
            per_ts[r["ts"]] += _lag(r)
    for res, res_ms in (("10s", 10_000), ("1m", 60_000)):
        wins = defaultdict(list)
        for ts in sorted(per_ts):
            wins[ts - ts % res_ms].append(per_ts[ts])
        for ws, lags in wins.items():
            queue_rows = [v for (r, b, q, w), v in out["queue"].items() if r == res and w == ws]
            out["group"][(res, ws)] = {"lag": lags[-1], "max_lag": max(lags), "avg_lag": sum(lags) / len(lags),
                                       "p95_lag": p95(lags), "time_lag_ms": max(v["time_lag_ms"] for v in queue_rows),
                                       "status": max((v["status"] for v in queue_rows), key=STATUS_ORDER.index)}
    # owners: per queue, owner and minute
    for (broker, qid), samples in per_queue.items():
        groups = defaultdict(list)
        for r in samples:
            groups[(r["owner"], r["ts"] - r["ts"] % 60_000)].append(r)
        for (owner, ws), rows in groups.items():
            lags = [_lag(r) for r in rows]
            cos = [r["consumer_offset"] for r in rows]
            out["owner"][(broker, qid, owner, ws)] = {"samples": len(rows), "last_lag": lags[-1], "max_lag": max(lags),
                                                     "avg_lag": sum(lags) / len(lags), "consumed": max(cos) - min(cos)}
    evs = [e for t in range(first, last) for e in events(t)]
    starts = {}
    for e in sorted(evs, key=lambda e: e["ts"]):
        if e["type"] == "rebalance" and e["phase"] == "start":
            starts[e["client_id"]] = e["ts"]
        elif e["type"] == "rebalance":
            start = e["ts"] - round(e["duration_ms"]) if "duration_ms" in e else starts[e["client_id"]]
            out["rebalances"].append({"client_id": e["client_id"], "start": start, "end": e["ts"],
                                      "duration_ms": e["ts"] - start, "changed": e["added"] + e["removed"]})
        elif e["type"] == "flow_control":
            for res, res_ms in (("10s", 10_000), ("1m", 60_000)):
                key = (res, e["client_id"], e["reason"], e["ts"] - e["ts"] % res_ms)
                out["flow"][key] = out["flow"].get(key, 0) + 1
    return out


# -- the tests -------------------------------------------------------------------------

import csv  # noqa: E402
import re  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402

import pandas as pd  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402

from dashboard.lag.history import LagHistory  # noqa: E402
from dashboard.lag.job import JobParams, LagJob, list_recordings  # noqa: E402
from consumers_app.events import event_from_dict  # noqa: E402
from consumers_app.lab.recorder import SNAPSHOTS, Recorder  # noqa: E402
from dashboard.lag.reports import CSV_COLUMNS  # noqa: E402

from .support import REPO, manage_py, wait_until  # noqa: E402

pytestmark = pytest.mark.spark
CONTRACT = "window_start,window_end,group,topic,broker,queue_id,broker_offset,consumer_offset,lag,max_lag,time_lag_ms,owner,status"
SHOTS = REPO / "test-output" / "screenshots"
FIRST_PHASE = 240  # seconds recorded before the first run; the rest comes before the incremental run


@pytest.fixture(scope="module")
def spark():
    from dashboard.lag.spark import get_spark

    session = get_spark("local[1]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, spark):
    """Record the first 4 minutes, run the job, record the 5th, run it again; keep both states."""
    data_dir = tmp_path_factory.mktemp("lagdata")
    job = LagJob(data_dir / "recordings", data_dir / "lag", spark=spark)
    with Recorder(data_dir / "recordings") as recorder:
        record(recorder, 0, FIRST_PHASE)
    first = job.run()
    history = LagHistory(data_dir / "lag", data_dir / "recordings")
    before = {t: history._dataset(t).to_table().to_pandas() for t in ("queue_windows", "group_windows")}
    with Recorder(data_dir / "recordings") as recorder:
        record(recorder, FIRST_PHASE, SECONDS)
    second = job.run()
    return {"dir": data_dir, "job": job, "first": first, "second": second, "before": before, "history": history}


def _ms(ts) -> int:
    return int(pd.Timestamp(ts).timestamp() * 1000)


def _queue_rows(df):
    return {(r.res, r.broker, int(r.queue_id), _ms(r.window_start)): r for r in df.itertuples()}


def _assert_queue_windows(df, expect):
    got = _queue_rows(df)
    assert set(got) == set(expect["queue"])
    for key, e in expect["queue"].items():
        r = got[key]
        actual = {"broker_offset": r.broker_offset, "consumer_offset": r.consumer_offset, "lag": r.lag,
                  "max_lag": r.max_lag, "avg_lag": pytest.approx(r.avg_lag), "p95_lag": r.p95_lag,
                  "time_lag_ms": r.time_lag_ms, "max_time_lag_ms": r.max_time_lag_ms, "owner": r.owner,
                  "samples": r.samples, "status": r.status}
        assert actual == {**e, "avg_lag": pytest.approx(e["avg_lag"])}, key


def test_first_run_matches_hand_computed_history(lab):
    assert lab["first"].state == "done"
    _assert_queue_windows(lab["before"]["queue_windows"], expected(0, FIRST_PHASE))


def test_job_figures_match_hand_computed_history(lab):
    expect = expected(0, SECONDS)
    h = lab["history"]
    _assert_queue_windows(h._dataset("queue_windows").to_table().to_pandas(), expect)

    groups = h.windows("group_windows", GROUP)
    got = {(r.res, _ms(r.window_start)): {"lag": r.lag, "max_lag": r.max_lag, "avg_lag": pytest.approx(r.avg_lag),
                                          "p95_lag": r.p95_lag, "time_lag_ms": r.time_lag_ms, "status": r.status}
           for r in groups.itertuples()}
    assert got == expect["group"]

    owners = h.windows("owner_windows", GROUP)
    got = {(r.broker, int(r.queue_id), r.owner, _ms(r.window_start)): {
        "samples": r.samples, "last_lag": r.last_lag, "max_lag": r.max_lag,
        "avg_lag": pytest.approx(r.avg_lag), "consumed": r.consumed} for r in owners.itertuples()}
    assert got == expect["owner"]
    # ownership of broker-a:3 moved from c2 to c1 at the rebalance (minute 11:00)
    assert {k[2] for k in got if k[:2] == ("broker-a", 3)} == {"c1", "c2"}

    rebalances = h.windows("rebalances", GROUP, end_col="end")
    assert [{"client_id": r.client_id, "start": _ms(r.start), "end": _ms(r.end), "duration_ms": r.duration_ms,
             "changed": json.loads(r.changed)}
            for r in rebalances.sort_values("client_id").itertuples()] == expect["rebalances"]

    flow = h.windows("flow_control", GROUP)
    assert {(r.res, r.client_id, r.reason, _ms(r.window_start)): r.count for r in flow.itertuples()} == expect["flow"]


def test_stalled_queue_is_stall_and_rewound_queue_rewind(lab):
    expect = expected(0, SECONDS)
    last_10s = max(ws for (res, b, q, ws) in expect["queue"] if res == "10s")
    rows = _queue_rows(lab["history"].windows("queue_windows", GROUP, res="10s"))
    assert rows[("10s", *STALLED, last_10s)].status == "STALL"
    assert rows[("10s", "broker-a", 0, last_10s)].status == "OK"
    rewind_at = T0 + 200_000 - 200_000 % 10_000
    assert rows[("10s", *REWOUND, rewind_at)].status == "REWIND"
    assert {r.status for k, r in rows.items() if k[1:3] == STALLED and k[3] >= T0 + 140_000} == {"STALL"}


def test_incremental_rerun_adds_only_the_new_windows(lab):
    second = lab["second"]
    assert second.new_files == 7  # the 5th minute: six 10-s snapshot files and one event file
    # it recomputes from one minute before the new data, not from the start
    assert second.range_ms[0] == T0 + (FIRST_PHASE - 60) * 1000
    before = lab["before"]["queue_windows"]
    after = lab["history"]._dataset("queue_windows").to_table().to_pandas()
    for res, per_minute in (("10s", 6), ("1m", 1)):
        assert (after.res == res).sum() == (before.res == res).sum() + len(QUEUES) * per_minute
    # windows older than the recomputed range are untouched
    cutoff = pd.Timestamp(second.range_ms[0], unit="ms", tz="UTC")
    cols = sorted(before.columns)
    old = before[before.window_start < cutoff][cols].sort_values(["res", "broker", "queue_id", "window_start"])
    kept = after[after.window_start < cutoff][cols].sort_values(["res", "broker", "queue_id", "window_start"])
    pd.testing.assert_frame_equal(old.reset_index(drop=True), kept.reset_index(drop=True))
    # and a run with nothing new does nothing
    assert lab["job"].run().state == "nothing-new"


def test_targeted_rerun_of_one_group_and_range_changes_nothing_else(lab):
    h = lab["history"]
    before = h._dataset("queue_windows").to_table().to_pandas()
    result = lab["job"].run(JobParams(since_ms=T0 + 120_000, until_ms=T0 + 180_000, group=GROUP))
    assert result.state == "done" and result.range_ms == (T0 + 120_000, T0 + 180_000)
    assert result.windows["queue_windows"] == len(QUEUES) * (6 + 1)  # that minute, recomputed
    after = h._dataset("queue_windows").to_table().to_pandas()
    order = ["res", "broker", "queue_id", "window_start"]
    pd.testing.assert_frame_equal(before.sort_values(order).reset_index(drop=True)[sorted(before.columns)],
                                  after.sort_values(order).reset_index(drop=True)[sorted(before.columns)])
    assert lab["job"].load_state()["runs"] == 2  # targeted runs leave the incremental state alone


def test_a_state_naming_a_deleted_recording_runs_and_forgets_it(lab):
    job = lab["job"]
    state = job.load_state()
    processed = state["processed"]
    job.save_state({**state, "processed": {**processed, SNAPSHOTS: processed[SNAPSHOTS] | {
        "snapshots/date=2025-12-31/hour=08/part-30-gone.parquet"}}})   # deleted by the retention
    assert job.run().state == "nothing-new"
    assert job.load_state()["processed"] == processed


def test_recordings_deleted_before_or_while_spark_reads_them_are_skipped(spark, tmp_path):
    job = LagJob(tmp_path / "recordings", tmp_path / "lag", spark=spark)
    with Recorder(job.recordings) as recorder:
        record(recorder, 0, 180)   # minutes 10:58, 10:59, 11:00
    rels = sorted(list_recordings(job.recordings, SNAPSHOTS))
    (job.recordings / rels[0]).unlink()   # gone before the read
    snapshots = job._read(spark, SNAPSHOTS, rels, T0, T0 + 180_000, None)
    (job.recordings / rels[1]).unlink()   # gone before the scan
    assert snapshots.count() == (180 - 2 * 10) * len(QUEUES)   # two 10-s slices gone


def _report(client, fmt, **params):
    return client.get(f"/reports/lag.{fmt}", {"group": GROUP, **params})


@pytest.fixture
def web(lab, settings, client):
    settings.DATA_DIR = lab["dir"]
    settings.DASHBOARD_PUBLIC_READ = True
    return client


def test_csv_report_columns_and_rows(web):
    response = _report(web, "csv", **{"from": "2026-01-01T10:59:00Z", "to": "2026-01-01T11:01:00Z"})
    assert response.status_code == 200
    text = response.content.decode()
    assert text.split("\n")[0].startswith(CONTRACT + ",")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2 * len(QUEUES)  # two 1-minute windows per queue
    row = next(r for r in rows if (r["broker"], r["queue_id"]) == ("broker-b", "3") and r["window_start"] == "2026-01-01T11:00:00Z")
    e = expected(0, SECONDS)["queue"][("1m", "broker-b", 3, T0 + 120_000)]
    assert row["window_end"] == "2026-01-01T11:01:00Z"
    assert (int(row["lag"]), int(row["max_lag"]), int(row["time_lag_ms"]), row["owner"], row["status"]) == (
        e["lag"], e["max_lag"], e["time_lag_ms"], e["owner"], "STALL")
    assert int(row["broker_offset"]) - int(row["consumer_offset"]) == int(row["lag"])


def test_parquet_json_and_html_reports(web):
    response = _report(web, "parquet")
    assert response.status_code == 200
    table = pq.read_table(io.BytesIO(response.content))
    assert table.column_names[:len(CSV_COLUMNS)] == CSV_COLUMNS
    assert table.num_rows == len(QUEUES) * 5
    assert str(table.schema.field("window_start").type) == "timestamp[ms, tz=UTC]"

    body = _report(web, "json").json()
    assert body["columns"][:len(CSV_COLUMNS)] == CSV_COLUMNS and len(body["rows"]) == len(QUEUES) * 5
    stalled = next(q for q in body["queues"] if (q["broker"], q["queue_id"]) == STALLED)
    assert stalled["last_status"] == "STALL"
    assert {o["owner"] for o in body["owners"]} == {"c1", "c2", "c3"}

    html = _report(web, "html").content.decode()
    assert '<script src="http' not in html and "Plotly.newPlot" in html  # nothing fetched: opens offline
    assert len(html) > 3_000_000  # plotly.js itself is inlined
    assert "Lag per queue" in html and "Status per queue" in html
    assert "strategy AVG_BY_CIRCLE" in html   # the switch is marked and listed
    lags = [r["lag"] for r in body["rows"] if (r["broker"], r["queue_id"]) == STALLED]
    assert json.dumps(lags).replace(" ", "") in html.replace(" ", "")  # the chart's data


def test_history_page_and_data(web):
    assert web.get("/history/").status_code == 200
    groups = web.get("/history/groups.json").json()
    assert [g["group"] for g in groups["groups"]] == [GROUP]
    data = web.get("/history/data.json", {"group": GROUP}).json()
    assert data["res"] == "10s" and len(data["queues"]) == len(QUEUES)
    assert data["queues"]["broker-b:3"]["status"][-1] == "STALL"
    assert [r["client_id"] for r in data["rebalances"]] == ["c1", "c2"]
    assert len(data["flow_control"]) == 2


def test_marks_hold_faults_and_the_latest_figures_of_each_hand_off(lab):
    marks = lab["history"].windows("marks", GROUP, end_col="window_start")
    faults = marks[marks.kind == "fault"]
    assert [(r.name, r.client_id, _ms(r.window_start), json.loads(r.detail)["strategy"]) for r in faults.itertuples()] == [
        ("strategy", "c1", T0 + 60_300, "AVG_BY_CIRCLE")]
    handoffs = marks[marks.kind == "handoff"]
    assert {(r.name, r.client_id, _ms(r.window_start)): json.loads(r.detail)["duplicates"] for r in handoffs.itertuples()} == {
        ("broker-b:2", "c2", HANDOFF_AT): 12, ("broker-b:3", "c2", HANDOFF_AT): 3}


def test_history_data_marks_the_switch(web):
    data = web.get("/history/data.json", {"group": GROUP}).json()
    assert [(m["kind"], m["name"]) for m in data["marks"] if m["kind"] == "fault"] == [("fault", "strategy")]


A_RANGE = {"a_from": "2026-01-01T10:58:00Z", "a_to": "2026-01-01T11:00:00Z"}
B_RANGE = {"b_from": "2026-01-01T11:00:00Z", "b_to": "2026-01-01T11:03:00Z"}


def test_two_ranges_side_by_side_in_every_format(web):
    body = web.get("/reports/compare.json", {"group": GROUP, **A_RANGE, **B_RANGE}).json()
    a, b = body["ranges"]
    expect = expected(0, SECONDS)["group"]
    in_range = lambda lo, hi: [v for (res, ws), v in expect.items() if res == "10s" and lo <= ws < hi]  # noqa: E731
    for r, (lo, hi) in ((a, (T0, T0 + 120_000)), (b, (T0 + 120_000, T0 + 300_000))):
        windows = in_range(lo, hi)
        assert r["windows"] == len(windows)
        assert r["lag_max"] == max(w["max_lag"] for w in windows)
        assert r["lag_avg"] == pytest.approx(sum(w["avg_lag"] for w in windows) / len(windows), abs=1e-3)
    assert (a["strategy_switches"], a["faults"], a["rebalances"], a["queues_moved"], a["duplicates"]) == (1, 1, 0, 0, 0)
    assert (b["strategy_switches"], b["rebalances"], b["queues_moved"], b["duplicates"]) == (0, 2, 2, 15)

    text = web.get("/reports/compare.csv", {"group": GROUP, **A_RANGE, **B_RANGE}).content.decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["range"] for r in rows] == ["a", "b"] and rows[1]["duplicates"] == "15"
    table = pq.read_table(io.BytesIO(web.get("/reports/compare.parquet", {"group": GROUP, **A_RANGE, **B_RANGE}).content))
    assert table.num_rows == 2 and table.column("queues_moved").to_pylist() == [0, 2]
    html = web.get("/reports/compare.html", {"group": GROUP, **A_RANGE, **B_RANGE}).content.decode()
    assert "Range comparison" in html and "messages consumed twice" in html


def test_the_history_page_compares_around_the_last_switch_in_a_browser(lab, live_server, settings):
    """Debian's chromium on the history page: the switch is drawn, and "around the last
    switch" fills both ranges and shows them side by side (the same figures as the report)."""
    from playwright.sync_api import expect

    from .browser import chromium, have_chromium

    if not have_chromium():
        pytest.skip("Debian's chromium is not installed (make chromium)")
    settings.DATA_DIR = lab["dir"]
    settings.DASHBOARD_PUBLIC_READ = True
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{live_server.url}/history/")
        page.wait_for_function("() => document.querySelector('#chart-queue-lag .main-svg') !== null", timeout=30_000)
        expect(page.locator("#chart-queue-lag")).to_contain_text("strategy AVG_BY_CIRCLE")
        page.click("#h-around-switch")
        table = page.locator('#h-compare-result [data-role="compare"]')
        expect(table).to_be_visible(timeout=15_000)
        expect(page.locator("#h-a-to")).to_have_value(re.compile(r"^2026-01-01T10:59(:00)?$"))   # the switch's second
        report = web_compare(live_server.url, page)
        b = report["ranges"][1]
        for figure in ("queues_moved", "duplicates", "strategy_switches"):
            expect(table.locator(f'tr[data-figure="{figure}"] td[data-range="b"]')).to_have_text(str(b[figure]))
        assert (b["queues_moved"], b["duplicates"], b["strategy_switches"]) == (2, 15, 1)
        page.screenshot(path=str(SHOTS / "history-compare.png"), full_page=True)
        assert errors == []


def web_compare(base: str, page) -> dict:
    """The JSON report for the ranges the page's form holds (its own link)."""
    href = page.locator('.compare-downloads a[data-fmt="json"]').get_attribute("href")
    return page.evaluate("async (url) => (await fetch(url)).json()", base + href)


@pytest.mark.parametrize("params, needle", [
    ({"group": GROUP, **A_RANGE}, "range b needs both b_from and b_to"),
    ({"group": "nope", **A_RANGE, **B_RANGE}, "unknown group"),
    ({"group": GROUP, **A_RANGE, "b_from": "2026-01-01T11:03:00Z", "b_to": "2026-01-01T11:00:00Z"}, "must be before"),
    ({"group": GROUP, **A_RANGE, **B_RANGE, "c_from": "x"}, "unknown parameter(s): c_from"),
])
def test_a_bad_comparison_is_a_400_with_its_reason(web, params, needle):
    response = web.get("/reports/compare.csv", params)
    assert response.status_code == 400 and needle in response.json()["error"]


@pytest.mark.parametrize("fmt,params,needle", [
    ("csv", {"group": "nope"}, "unknown group"),
    ("csv", {"group": GROUP, "from": "2026-01-01T11:00:00Z", "to": "2026-01-01T10:00:00Z"}, "after"),
    ("csv", {"group": GROUP, "from": "yesterday"}, "ISO-8601"),
    ("xlsx", {"group": GROUP}, "unknown format"),
])
def test_bad_report_parameters_are_400(web, fmt, params, needle):
    response = web.get(f"/reports/lag.{fmt}", params)
    assert response.status_code == 400
    assert needle in response.json()["error"]
    assert web.get("/history/data.json", params if fmt == "csv" else {"group": "nope"}).status_code == 400


def test_lagreport_command(lab, settings, tmp_path):
    settings.DATA_DIR = lab["dir"]
    out = tmp_path / "lag.csv"
    call_command("lagreport", "--group", GROUP, "--res", "10s", "--format", "csv", "-o", str(out), "--no-job")
    lines = out.read_text().splitlines()
    assert lines[0].startswith(CONTRACT) and len(lines) == 1 + len(QUEUES) * 30
    for args in (["--group", "nope"], ["--group", GROUP, "--from", "2026-01-02", "--to", "2026-01-01"],
                 ["--group", GROUP, "--format", "xlsx"], ["--group", GROUP, "--to", "soon"]):
        bad = tmp_path / "bad.csv"
        with pytest.raises(CommandError) as error:
            call_command("lagreport", *args, "-o", str(bad))
        assert error.value.returncode == 2 and not bad.exists()


def test_lagreport_exit_code_2_from_the_command_line(lab, tmp_path):
    proc = manage_py("lagreport", "--group", "nope", "--format", "csv", "-o", str(tmp_path / "x.csv"),
                     env={"LAB_DATA_DIR": str(lab["dir"])})
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "unknown group" in output
    assert not (tmp_path / "x.csv").exists()


def test_lagjob_bad_dates_exit_2(lab, settings):
    settings.DATA_DIR = lab["dir"]
    for args in (["--since", "noon"], ["--since", "2026-01-02", "--until", "2026-01-01"]):
        with pytest.raises(CommandError) as error:
            call_command("lagjob", *args)
        assert error.value.returncode == 2


@pytest.mark.django_db
def test_job_button_needs_a_user_and_reports_progress(lab, settings, client, django_user_model):
    settings.DATA_DIR = lab["dir"]
    assert client.post("/history/job/").status_code == 401
    assert client.get("/history/job/").status_code == 401  # reading needs a login too
    user = django_user_model.objects.create_user("lag", password="x")
    client.force_login(user)
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/history/job/").status_code == 403  # no CSRF token
    response = client.post("/history/job/")
    assert response.status_code == 202 and response.json()["state"] == "running"
    # everything is processed already: the job process finds nothing new and ends quickly
    status = wait_until(lambda: (s := client.get("/history/job/").json())["state"] != "running" and s,
                        timeout=120, message="the lag job process to finish")
    assert status["state"] == "done", status
    assert status["result"]["state"] == "nothing-new" and status["done"] == status["total"] > 0
    assert "progress 0/9 plan" in (lab["dir"] / "lag" / "_job.log").read_text()
