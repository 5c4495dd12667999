"""queue_window_rows: the batch's queue windows in numpy, checked against hand-computed values
(the comparison with snapshot_tables' Spark functions is in tests/test_lag_job.py)."""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dashboard.lag.queue_window_rows import WINDOWS_SCHEMA, p95_of_segments, _round_half_up, window_rows
from dashboard.lag.sample_partials import partials

T0 = 1_767_225_600_000   # 2026-01-01T00:00:00Z


def points(committed: list[int], top: list[int], queue_id: int = 0, skip: tuple = ()) -> pa.Table:
    """aggregate_samples()' "q" rows of one sample per 10-s window (the windows in ``skip`` missing)."""
    rows = [{"ts": T0 + i * 10_000 + 9_000, "group": "G", "topic": "T", "broker": "b", "queue_id": queue_id,
             "broker_min_offset": 0, "broker_max_offset": m, "consumer_offset": c, "owner": "c1",
             "oldest_unconsumed_store_ts": T0 + i * 10_000}
            for i, (c, m) in enumerate(zip(committed, top)) if i not in skip]
    table = partials(pa.Table.from_pylist(rows))
    return table.filter(pc.equal(table["_kind"], "q"))


def statuses(table: pa.Table, res: str = "10s") -> list[str]:
    rows = sorted((r for r in table.to_pylist() if r["res"] == res), key=lambda r: (r["queue_id"], r["ws"]))
    return [r["status"] for r in rows]


def test_round_half_up_andp95_of_segments_as_spark():
    assert _round_half_up(np.array([2.5, -2.5, 2.4999999999999996, 0.5, -0.4])).tolist() == [3, -3, 2, 1, 0]
    values = np.array([*range(20, 0, -1), 7, 3, 9])
    assert p95_of_segments(values, np.array([0, 20, 21, 23])).tolist() == [19, 7, 9]   # k = ceil(n * 0.95)


def test_statuses_follow_the_rules_in_their_order():
    # lag 10, 20, ... with the commit moving: falling behind (WARN) once the window is full
    behind = window_rows(points([0, 5, 10, 15, 20, 25, 30], [10, 25, 40, 55, 70, 85, 100]))
    assert behind.schema == WINDOWS_SCHEMA
    assert statuses(behind) == ["OK", "OK", "OK", "OK", "OK", "WARN", "WARN"]
    # the commit stands still with lag: STALL once the window is full
    assert statuses(window_rows(points([5] * 7, [10] * 7))) == ["OK"] * 5 + ["STALL"] * 2
    # it went back: REWIND for the window that follows, before any other rule
    assert statuses(window_rows(points([10, 20, 5, 6, 7, 8, 9, 10], [30] * 8))) == \
        ["OK", "OK", "REWIND", "REWIND", "REWIND", "REWIND", "REWIND", "OK"]
    # a gap restarts the run: the window is not full again until 6 points after it
    assert statuses(window_rows(points([5] * 9, [10] * 9, skip=(3,)))) == ["OK"] * 8
    # two queues in one table keep apart, whatever their row order
    both = pa.concat_tables([points([5] * 7, [10] * 7, queue_id=1), points([0] * 7, [0] * 7)])
    assert statuses(window_rows(both.take(pa.array(np.arange(both.num_rows)[::-1])))) == \
        ["OK"] * 7 + ["OK"] * 5 + ["STALL"] * 2


def test_minutes_take_their_last_window_and_time_lags_interpolate():
    out = window_rows(points([0, 5, 10, 15, 20, 25, 30, 35], [10, 25, 40, 55, 70, 85, 100, 115]))
    minutes = [r for r in out.to_pylist() if r["res"] == "1m"]
    assert [(m["ws"], m["samples"], m["lag"], m["max_lag"], m["status"]) for m in minutes] == \
        [(T0, 6, 60, 60, 'WARN'), (T0 + 60_000, 2, 80, 80, 'WARN')]   # (its 6th window's status)
    ten = sorted((r for r in out.to_pylist() if r["res"] == "10s"), key=lambda r: r["ws"])
    # time lag 9 s at each sample, 1 s later the next window's first sample (also 9 s): 9 s at the end
    assert ten[0]["time_lag_ms"] == 9_000 and ten[-1]["time_lag_ms"] == 9_000 and ten[-1]["avg_lag"] == 80.0
