"""Two time ranges of one group side by side (e.g. before and after a strategy switch).

Per range, from the lag history (the lag job's tables, read with pyarrow):

* lag: the average of the group's lag over the range's samples (``avg_lag`` of its 10-s
  windows), its 95th percentile over the 10-s windows' ``p95_lag``, and the largest lag;
* time lag: the average at the windows' ends and the largest;
* rebalances that changed an assignment (per consumer, as the charts mark them: queues
  taken or released, a start-up's from nobody included), the queues handed off from one
  consumer to another and the messages consumed twice because of them (the hand-offs'
  exact duplicates, handoff.py), and the faults injected (strategy switches included).
  So a range holding a lab's start can count rebalances with no queue handed off.

The same rows serve the history page and every report format (``/reports/compare.FMT``).
"""
from __future__ import annotations

import html
import io
import json
import math
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .history import LagHistory, parse_time, to_iso
from .reports import FORMATS, ReportError

COLUMNS = ["range", "from", "to", "windows", "lag_avg", "lag_p95", "lag_max", "time_lag_avg_ms", "time_lag_max_ms",
           "rebalances", "queues_moved", "duplicates", "faults", "strategy_switches"]
RANGES = ("a", "b")


@dataclass
class CompareQuery:
    group: str
    ranges: list[tuple[str, int, int]]   # (name, from ms, to ms)
    fmt: str

    @property
    def filename(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.group)
        return f"compare-{safe}.{self.fmt}"


def parse_compare(params, fmt: str, history: LagHistory | None = None) -> CompareQuery:
    """``group``, ``a_from``, ``a_to``, ``b_from``, ``b_to`` (ISO-8601); ReportError says what is wrong."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    unknown = sorted(set(params) - {"group", "download", *(f"{r}_{end}" for r in RANGES for end in ("from", "to"))})
    if unknown:
        raise ReportError(f"unknown parameter(s): {', '.join(unknown)}")
    group = params.get("group", "")
    if not group:
        raise ReportError("group is required")
    ranges = []
    for name in RANGES:
        try:
            lo, hi = parse_time(params.get(f"{name}_from"), f"{name}_from"), parse_time(params.get(f"{name}_to"), f"{name}_to")
        except ValueError as exc:
            raise ReportError(str(exc)) from None
        if lo is None or hi is None:
            raise ReportError(f"range {name} needs both {name}_from and {name}_to")
        if lo >= hi:
            raise ReportError(f"range {name}: {name}_from must be before {name}_to")
        ranges.append((name, lo, hi))
    history = history or LagHistory()
    groups = history.groups()
    if group not in groups:
        raise ReportError(f"unknown group {group!r}: no lag history for it (groups with history: "
                          f"{', '.join(sorted(groups)) or 'none yet'})")
    return CompareQuery(group, ranges, fmt)


def compare(history: LagHistory, q: CompareQuery) -> list[dict]:
    return [range_figures(history, q.group, name, lo, hi) for name, lo, hi in q.ranges]


def range_figures(history: LagHistory, group: str, name: str, lo: int, hi: int) -> dict:
    gw = history.windows("group_windows", group, lo, hi, res="10s")
    rb = history.windows("rebalances", group, lo, hi, end_col="end")
    marks = history.windows("marks", group, lo - 1, hi, end_col="window_start")   # instants in [lo, hi)
    moved = rb[rb["changed"] != "[]"] if len(rb) else rb
    handoffs = marks[marks["kind"] == "handoff"] if len(marks) else marks
    faults = marks[marks["kind"] == "fault"] if len(marks) else marks
    # -1: a move to or from a peer, whose duplicates nobody can count
    duplicates = sum(max(0, json.loads(d).get("duplicates", 0)) for d in handoffs["detail"]) if len(handoffs) else 0

    def figure(series, how):
        values = series.dropna() if len(gw) else pd.Series(dtype=float)
        if values.empty:
            return None
        value = how(values)
        return round(float(value), 3) if not math.isnan(value) else None

    return {
        "range": name, "from": to_iso(pd.Timestamp(lo, unit="ms")), "to": to_iso(pd.Timestamp(hi, unit="ms")),
        "windows": int(len(gw)),
        "lag_avg": figure(gw.get("avg_lag"), lambda v: v.mean()),
        "lag_p95": figure(gw.get("p95_lag"), lambda v: v.quantile(0.95, interpolation="higher")),
        "lag_max": figure(gw.get("max_lag"), lambda v: v.max()),
        "time_lag_avg_ms": figure(gw.get("time_lag_ms"), lambda v: v.mean()),
        "time_lag_max_ms": figure(gw.get("max_time_lag_ms"), lambda v: v.max()),
        "rebalances": int(len(moved)),
        "queues_moved": int(len(handoffs)),
        "duplicates": int(duplicates),
        "faults": int(len(faults)),
        "strategy_switches": int((faults["name"] == "strategy").sum()) if len(faults) else 0,
    }


def build_compare(history: LagHistory, q: CompareQuery) -> bytes:
    rows = compare(history, q)
    if q.fmt == "json":
        return json.dumps({"group": q.group, "columns": COLUMNS, "ranges": rows}).encode()
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if q.fmt == "csv":
        return frame.to_csv(index=False, lineterminator="\n").encode()
    if q.fmt == "parquet":
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
        return sink.getvalue()
    return render_compare_html(q, rows).encode()


def render_compare_html(q: CompareQuery, rows: list[dict]) -> str:
    def cell(v):
        return "–" if v is None else html.escape(f"{v:,}" if isinstance(v, (int, float)) else str(v))

    head = "".join(f"<th>range {html.escape(r['range'].upper())}<br><small>{html.escape(r['from'])} - "
                   f"{html.escape(r['to'])}</small></th>" for r in rows)
    body = "".join(f"<tr><th>{html.escape(c)}</th>" + "".join(f"<td>{cell(r[c])}</td>" for r in rows) + "</tr>"
                   for c in COLUMNS[3:])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Range comparison - {html.escape(q.group)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }}
table {{ border-collapse: collapse; font-size: .9rem; }}
th, td {{ border: 1px solid #ccc; padding: .25rem .6rem; text-align: right; }}
thead th, tbody th {{ background: #f3f3f3; text-align: left; }}
</style></head><body>
<h1>Range comparison - group {html.escape(q.group)}</h1>
<p>Lag from the 10-s windows of the lag history (avg over the samples, p95 of the windows' p95, max);
time lag at the windows' ends; rebalances that changed an assignment, per consumer (queues taken
or released, a start-up's from nobody included); queues handed off from one consumer to another
and the messages consumed twice by those hand-offs (exact, from the consumers' own consumed
offsets).</p>
<table><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>
</body></html>
"""
