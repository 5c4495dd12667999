"""Gaps in a report's charts: spans with no windows (the lab was stopped), as the history
page draws them (static/js/history/gaps.js). Plotly joins the points either side of a gap
unless a null lies between them, stretches a heatmap's cells halfway to their neighbours,
and runs the axis's zero line through an empty span - each would show lag or a status
nobody measured. Times are the windows' ends (ms counts or Timestamps), ``step`` their size."""
from __future__ import annotations

import pandas as pd


def _after_gap(times: list, step: pd.Timedelta) -> set[int]:
    """The indices of the windows that follow a gap (the one before ended over a window earlier)."""
    return {i for i in range(1, len(times)) if times[i] - times[i - 1] > step}


def open_at_gaps(times: list, step: pd.Timedelta, *columns: list) -> tuple[list, ...]:
    """``times`` and each column with a null point (at the missing window's end) wherever the
    next window is more than one window later: the line stays open there."""
    gaps = _after_gap(times, step)
    out_times, out_columns = [], [[] for _ in columns]
    for i, t in enumerate(times):
        if i in gaps:
            out_times.append(times[i - 1] + step)
            for out in out_columns:
                out.append(None)
        out_times.append(t)
        for out, column in zip(out_columns, columns):
            out.append(column[i])
    return (out_times, *out_columns)


def heatmap_bricks(times: list, step: pd.Timedelta) -> tuple[list, list]:
    """(columns, edges) of a heatmap over the windows ending at ``times`` (sorted): a column
    per window (its end) and None for each gap; the edges (one more) make plotly draw each
    brick exactly from window start to end - from cell centres it stretches each cell
    halfway to its neighbour, over a gap too."""
    if not times:
        return [], []
    gaps = _after_gap(times, step)
    columns, edges = [], [times[0] - step]
    for i, t in enumerate(times):
        if i in gaps:
            columns.append(None)
            edges.append(t - step)
        columns.append(t)
        edges.append(t)
    return columns, edges


def gap_spans(times: list, step: pd.Timedelta) -> list[tuple]:
    """(from, to) of each span with no window: from the end of the window before the gap to
    the start of the one after it."""
    return [(times[i - 1], times[i] - step) for i in sorted(_after_gap(times, step))]
