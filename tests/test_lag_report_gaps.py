"""A report's charts across a span with no recordings (dashboard/lag/report_gaps.py): lines
open, heatmap bricks kept to their windows, the span named - as the history page draws it.
Pure functions, and the figures build_figures makes of a history with a gap. No Spark."""
from __future__ import annotations

import pandas as pd

from dashboard.lag.report_gaps import gap_spans, heatmap_bricks, open_at_gaps
from dashboard.lag.reports import build_figures

T0 = pd.Timestamp("2026-01-01T10:00:00Z")
TEN = pd.Timedelta(seconds=10)


def at(seconds: int) -> pd.Timestamp:
    return T0 + pd.Timedelta(seconds=seconds)


def test_a_missing_window_opens_the_line_and_consecutive_ones_do_not():
    times = [at(10), at(20), at(3600), at(3610)]
    assert open_at_gaps(times, TEN, [1, 2, 3, 4], ["a", "a", "b", "b"]) == (
        [at(10), at(20), at(30), at(3600), at(3610)], [1, 2, None, 3, 4], ["a", "a", None, "b", "b"])
    assert open_at_gaps([at(10), at(20)], TEN, [1, 2]) == ([at(10), at(20)], [1, 2])
    assert open_at_gaps([], TEN, []) == ([], [])


def test_heatmap_bricks_run_from_window_start_to_end_and_a_gap_is_one_empty_brick():
    columns, edges = heatmap_bricks([at(10), at(20), at(3600), at(3610)], TEN)
    assert columns == [at(10), at(20), None, at(3600), at(3610)]
    assert edges == [at(0), at(10), at(20), at(3590), at(3600), at(3610)]
    assert heatmap_bricks([], TEN) == ([], [])


def test_a_gaps_span_runs_from_the_end_of_the_window_before_to_the_start_of_the_one_after():
    assert gap_spans([at(10), at(20), at(3600)], TEN) == [(at(20), at(3590))]
    assert gap_spans([at(10), at(20)], TEN) == []


def queue_rows(ends: list[int], status: str = "WARN") -> pd.DataFrame:
    ends_ts = [at(s) for s in ends]
    return pd.DataFrame({
        "topic": "T", "broker": "broker-a", "queue_id": 0, "window_end": ends_ts,
        "window_start": [t - TEN for t in ends_ts], "lag": [5] * len(ends), "owner": ["c1"] * len(ends),
        "time_lag_ms": [100] * len(ends), "status": [status] * len(ends)})


def test_the_report_figures_leave_the_gap_open_and_shaded():
    rows = queue_rows([10, 20, 3600])
    group = pd.DataFrame({"window_end": rows["window_end"], "lag": 5, "max_lag": 6, "avg_lag": 5.5, "p95_lag": 6})
    lag, group_fig, time_lag, status = build_figures(rows, group, [], [])
    assert lag["data"][0]["y"] == [5, 5, None, 5]
    assert time_lag["data"][0]["y"] == [100, 100, None, 100]
    assert group_fig["data"][0]["y"] == [5.0, 5.0, None, 5.0]
    heat = status["data"][0]
    assert heat["z"] == [[1, 1, None, 1]]          # WARN, WARN, nothing, WARN
    assert len(heat["x"]) == 5                      # edges: one more than the bricks
    for fig in (lag, group_fig, time_lag, status):
        spans = [s for s in fig["layout"]["shapes"] if s.get("label", {}).get("text") == "not recorded"]
        assert [(s["x0"], s["x1"]) for s in spans] == [("2026-01-01T10:00:20Z", "2026-01-01T10:59:50Z")]
