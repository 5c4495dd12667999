"""A small recorded lab scenario and its lag history computed by hand, for the Spark
lag job's tests (tests/test_lag_job.py, tests/test_lag_spark_modes.py).

The scenario, in plain Python:

Group G1 reads TopicTest: 8 queues (broker-a:0-3, broker-b:0-3) sampled every second at
+300 ms for 5 minutes from 10:58:00Z (so the data crosses an hour boundary):

* every queue receives 10 msgs/s; healthy queues commit every 5 s, 20+q messages behind;
* broker-b:3 stalls at t=60 s: its committed offset stops while the max offset grows;
* broker-a:1 rewinds at t=200 s: its committed offset goes 500 back;
* at t=120 s consumer c3 leaves: c1 and c2 rebalance (events) and ownership moves;
* c2 reports flow control (count) at t=30..34 s and (size) at t=250 s;
* broker-b:2's oldest unconsumed store time is not known at t=150..169 s (-1, as an
  attached cluster's probe that has not answered): its time lag is unknown, not 0;
* the group is switched to AVG_BY_CIRCLE at t=60 s (a ``fault`` event), and the lab
  records the hand-offs of c3's queues to c2 (``handoff`` events, updated as c2 consumes
  duplicates: only the latest counts).

The expectation re-implements the job's definitions (dashboard/lag/snapshot_tables.py, status.py)
independently, on plain lists.
"""
from __future__ import annotations

import math
from collections import defaultdict

import pandas as pd
import pytest

from consumers_app.events import event_from_dict

T0 = 1_767_265_080_000  # 2026-01-01T10:58:00Z
SECONDS = 300
GROUP = "G1"
TOPIC = "TopicTest"
QUEUES = [("broker-a", 0), ("broker-a", 1), ("broker-a", 2), ("broker-a", 3),
          ("broker-b", 0), ("broker-b", 1), ("broker-b", 2), ("broker-b", 3)]
STALLED = ("broker-b", 3)
REWOUND = ("broker-a", 1)
UNKNOWN_STORE_TS = ("broker-b", 2)   # at t=150..169
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
            "oldest_unconsumed_store_ts": (-1 if queue == UNKNOWN_STORE_TS and 150 <= t < 170
                                           else _store_ts(i, co) if lag > 0 else 0),
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


def _time_lag(r) -> int | None:
    """0 with no lag or nothing unconsumed, None when the store time is not known."""
    if _lag(r) == 0 or r["oldest_unconsumed_store_ts"] == 0:
        return 0
    if r["oldest_unconsumed_store_ts"] < 0:
        return None
    return max(0, r["ts"] - r["oldest_unconsumed_store_ts"])


def _max_known(values):
    known = [v for v in values if v is not None]
    return max(known) if known else None


def known(value):
    """A table's value as the expectation writes it: None for null (NaN in pandas)."""
    return None if pd.isna(value) else value


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
                    a, b = _time_lag(last_r), _time_lag(nxt)
                    if nxt["ts"] - last_r["ts"] <= 2 * res_ms and b is not None:
                        tl_end = (None if a is None else
                                  _half_up(a + (b - a) * (ws + res_ms - last_r["ts"]) / (nxt["ts"] - last_r["ts"])))
                lags = [_lag(r) for r in rows]
                out["queue"][(res, broker, qid, ws)] = {
                    "broker_offset": last_r["broker_max_offset"], "consumer_offset": last_r["consumer_offset"],
                    "lag": _lag(last_r), "max_lag": max(lags), "avg_lag": sum(lags) / len(lags), "p95_lag": p95(lags),
                    "time_lag_ms": None if tl_end is None else max(0, tl_end),
                    "max_time_lag_ms": _max_known(_time_lag(r) for r in rows),
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
                                       "p95_lag": p95(lags), "time_lag_ms": _max_known(v["time_lag_ms"] for v in queue_rows),
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



def to_ms(ts) -> int:
    return int(pd.Timestamp(ts).timestamp() * 1000)


def queue_rows(df):
    return {(r.res, r.broker, int(r.queue_id), to_ms(r.window_start)): r for r in df.itertuples()}


def assert_queue_windows(df, expect):
    got = queue_rows(df)
    assert set(got) == set(expect["queue"])
    for key, e in expect["queue"].items():
        r = got[key]
        actual = {"broker_offset": r.broker_offset, "consumer_offset": r.consumer_offset, "lag": r.lag,
                  "max_lag": r.max_lag, "avg_lag": pytest.approx(r.avg_lag), "p95_lag": r.p95_lag,
                  "time_lag_ms": known(r.time_lag_ms), "max_time_lag_ms": known(r.max_time_lag_ms), "owner": r.owner,
                  "samples": r.samples, "status": r.status}
        assert actual == {**e, "avg_lag": pytest.approx(e["avg_lag"])}, key
