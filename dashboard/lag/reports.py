"""Lag reports (CSV, Parquet, self-contained HTML, JSON) from the lag history.

One row per window per queue; the first columns, in this order, are a contract checked
from outside (keep them):

    window_start,window_end,group,topic,broker,queue_id,broker_offset,consumer_offset,
    lag,max_lag,time_lag_ms,owner,status

then ``avg_lag, p95_lag, max_time_lag_ms, broker_min_offset, samples, res``. Times are
ISO-8601 UTC (``2026-01-01T10:00:00Z``). ``res`` (10s or 1m, default 1m) picks the
window size.

Reports read what the lag job wrote; they never start Spark themselves. A group
without history is "unknown" (HTTP 400 / exit 2, with a hint to run ``lagjob``); the
``lagreport`` command first runs the job incrementally when recordings are waiting
(``--no-job`` skips that). The HTML report inlines plotly.js (opens offline) and holds
the charts and a summary table per queue and per owner.
"""
from __future__ import annotations

import html
import io
import json
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .history import LagHistory, int_or_none, ints_or_none, parse_time, to_iso
from .report_gaps import gap_spans, heatmap_bricks, open_at_gaps
from .status import STATUS_ORDER, worst

CSV_COLUMNS = ["window_start", "window_end", "group", "topic", "broker", "queue_id", "broker_offset",
               "consumer_offset", "lag", "max_lag", "time_lag_ms", "owner", "status"]
EXTRA_COLUMNS = ["avg_lag", "p95_lag", "max_time_lag_ms", "broker_min_offset", "samples", "res"]
FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "parquet": "application/vnd.apache.parquet",
    "html": "text/html; charset=utf-8",
    "json": "application/json",
}
STATUS_COLORS = {"OK": "#2e9e44", "WARN": "#e0a800", "STALL": "#e8590c", "STOP": "#c92a2a", "REWIND": "#7048e8"}


ROWS_SLOT = "\u0000rows\u0000"   # where the JSON report's rows go (no real value looks like it)


class ReportError(ValueError):
    """A bad request: shown to the user as is (HTTP 400, exit code 2)."""


@dataclass
class ReportQuery:
    group: str
    from_ms: int | None
    to_ms: int | None
    fmt: str
    res: str = "1m"

    @property
    def filename(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.group)
        return f"lag-{safe}.{self.fmt}"


def parse_query(group, from_, to, fmt, res="1m", history: LagHistory | None = None,
                check_group: bool = True) -> ReportQuery:
    """Validate everything a report needs; ReportError says what is wrong. Changes nothing."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if res not in ("10s", "1m"):
        raise ReportError(f"unknown res {res!r}: use 10s or 1m")
    if not group:
        raise ReportError("group is required")
    try:
        from_ms, to_ms = parse_time(from_, "from"), parse_time(to, "to")
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        raise ReportError(f"from ({from_}) is after to ({to})")
    query = ReportQuery(group, from_ms, to_ms, fmt, res)
    if check_group:
        history = history or LagHistory()
        groups = history.groups()
        if group not in groups:
            known = ", ".join(sorted(groups)) or "none yet"
            raise ReportError(f"unknown group {group!r}: no lag history for it (groups with history: {known}); "
                              "run `manage.py lagjob` (or the history page's button) after recording")
    return query


def report_frame(history: LagHistory, q: ReportQuery) -> pd.DataFrame:
    """The report's rows: CSV_COLUMNS + EXTRA_COLUMNS, one per queue per window."""
    df = history.windows("queue_windows", q.group, q.from_ms, q.to_ms, res=q.res)
    if df.empty:
        return pd.DataFrame(columns=CSV_COLUMNS + EXTRA_COLUMNS)
    df["owner"] = df["owner"].fillna("")
    df["avg_lag"] = df["avg_lag"].round(3)
    for col in ("time_lag_ms", "max_time_lag_ms"):   # ints, empty/null where not known (not 123.0)
        df[col] = df[col].astype("Int64")
    return df[CSV_COLUMNS + EXTRA_COLUMNS].reset_index(drop=True)


def queue_summary(rows: pd.DataFrame) -> list[dict]:
    out = []
    for (topic, broker, qid), g in rows.groupby(["topic", "broker", "queue_id"], sort=True):
        last = g.iloc[-1]
        counts = g["status"].value_counts()
        out.append({
            "topic": topic, "broker": broker, "queue_id": int(qid),
            "owners": sorted(o for o in g["owner"].unique() if o),
            "last_lag": int(last["lag"]), "max_lag": int(g["max_lag"].max()),
            "avg_lag": round(float((g["avg_lag"] * g["samples"]).sum() / max(1, g["samples"].sum())), 3),
            "max_p95_lag": int(g["p95_lag"].max()), "max_time_lag_ms": int_or_none(g["max_time_lag_ms"].max()),
            "last_status": last["status"], "worst_status": worst(g["status"]),
            **{f"windows_{s.lower()}": int(counts.get(s, 0)) for s in STATUS_ORDER},
        })
    return out


def owner_summary(history: LagHistory, q: ReportQuery) -> list[dict]:
    df = history.windows("owner_windows", q.group, q.from_ms, q.to_ms)
    out = []
    for owner, g in (df.groupby("owner", sort=True) if len(df) else []):
        out.append({
            "owner": owner, "queues": int(g[["topic", "broker", "queue_id"]].drop_duplicates().shape[0]),
            "samples": int(g["samples"].sum()),
            "avg_lag": round(float((g["avg_lag"] * g["samples"]).sum() / max(1, g["samples"].sum())), 3),
            "max_lag": int(g["max_lag"].max()), "consumed": int(g["consumed"].fillna(0).sum()),
            "from": to_iso(g["owned_from"].min()), "to": to_iso(g["owned_to"].max()),
        })
    return out


def fault_list(history: LagHistory, q: ReportQuery) -> list[dict]:
    """Faults injected in the range (event_tables.py's marks), strategy switches among them."""
    df = history.windows("marks", q.group, q.from_ms, q.to_ms, end_col="window_start")
    out = []
    for r in (df[df["kind"] == "fault"].itertuples() if len(df) else ()):
        detail = json.loads(r.detail or "{}")
        what = f"strategy {detail.get('strategy', '')}" if r.name == "strategy" else f"{r.name} {r.client_id}"
        out.append({"t": to_iso(r.window_start), "name": r.name, "client_id": r.client_id, "text": what.strip()})
    return out


def rebalance_list(history: LagHistory, q: ReportQuery) -> list[dict]:
    """The rebalances that moved queues (the periodic ones that changed nothing are left out)."""
    df = history.windows("rebalances", q.group, q.from_ms, q.to_ms, end_col="end")
    if len(df):
        df = df[df["changed"] != "[]"]
    return [{"client_id": r.client_id, "start": to_iso(r.start), "end": to_iso(r.end),
             "duration_ms": int(r.duration_ms), "changed": r.changed, "reason": r.reason}
            for r in df.itertuples()] if len(df) else []


def flow_control_list(history: LagHistory, q: ReportQuery) -> list[dict]:
    df = history.windows("flow_control", q.group, q.from_ms, q.to_ms, res=q.res)
    return [{"client_id": r.client_id, "reason": r.reason, "start": to_iso(r.window_start),
             "end": to_iso(r.window_end), "count": int(r.count)} for r in df.itertuples()] if len(df) else []


def _iso_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The window times as to_iso writes them, formatted a column at a time by numpy (a call
    per value, and then pandas' strftime, were most of a long CSV or JSON report's time)."""
    out = rows.copy()
    for col in ("window_start", "window_end"):
        out[col] = iso_strings(out[col]) if len(out) else out[col].astype(str)
    return out


def iso_strings(times: pd.Series) -> np.ndarray:
    """to_iso of every value, each distinct time formatted once: a report has a window time
    per queue, hundreds of queues a time."""
    codes, distinct = pd.factorize(_ms(times))
    return np.array(_iso_of_ms(distinct), dtype=object)[codes]


def _ms(times: pd.Series) -> np.ndarray:
    """Timestamps as ms since the epoch."""
    return pd.to_datetime(times, utc=True).dt.tz_convert(None).to_numpy().astype("datetime64[ms]").astype(np.int64)


def _iso_of_ms(ms) -> list[str]:
    """ms counts as to_iso writes them: seconds, or milliseconds where there are some."""
    ms = np.asarray(ms, dtype=np.int64)
    at = ms.astype("datetime64[ms]")
    text = np.where(ms % 1000 == 0, np.datetime_as_string(at, unit="s"), np.datetime_as_string(at, unit="ms"))
    return [t + "Z" for t in text.tolist()]


def build_report(history: LagHistory, q: ReportQuery,
                 progress: Callable[[int, int, str], None] | None = None) -> bytes:
    """The report's bytes in ``q.fmt``."""
    progress = progress or (lambda done, total, label: None)
    total = 3
    progress(0, total, "reading lag history")
    rows = report_frame(history, q)
    progress(1, total, "summaries")
    if q.fmt == "csv":
        body = _iso_rows(rows).to_csv(index=False, lineterminator="\n").encode()
    elif q.fmt == "parquet":
        table = pa.Table.from_pandas(rows, preserve_index=False)
        for col in ("window_start", "window_end"):
            i = table.schema.get_field_index(col)
            table = table.set_column(i, col, table[col].cast(pa.timestamp("ms", "UTC")))
        sink = io.BytesIO()
        pq.write_table(table, sink)
        body = sink.getvalue()
    elif q.fmt == "json":
        # The rows as pandas writes them, spliced in: parsing them back only to write them
        # again cost more than the rest of the report.
        rows_json = _iso_rows(rows).to_json(orient="records")
        body = json.dumps({
            "group": q.group, "from": to_iso(pd.Timestamp(q.from_ms, unit="ms")) if q.from_ms is not None else None,
            "to": to_iso(pd.Timestamp(q.to_ms, unit="ms")) if q.to_ms is not None else None, "res": q.res,
            "columns": CSV_COLUMNS + EXTRA_COLUMNS,
            "rows": ROWS_SLOT,
            "queues": queue_summary(rows), "owners": owner_summary(history, q),
            "rebalances": rebalance_list(history, q), "flow_control": flow_control_list(history, q),
        }).replace(json.dumps(ROWS_SLOT), rows_json, 1).encode()
    else:
        progress(2, total, "charts")
        body = render_html(history, q, rows).encode()
    progress(total, total, "done")
    return body


# -- the HTML report ---------------------------------------------------------------

def _queue_label(topic, broker, qid, many_topics: bool) -> str:
    return f"{topic}@{broker}:{qid}" if many_topics else f"{broker}:{qid}"


def build_figures(rows: pd.DataFrame, group_rows: pd.DataFrame, rebalances: list[dict], flow: list[dict],
                  faults: list[dict] = ()) -> list[dict]:
    """Plotly figures as plain dicts: lag per queue (with rebalance markers and flow-control
    bands), group lag, time lag per queue, status per queue. Plain lists (readable in the
    HTML); dicts rather than graph objects, whose validation of every trace cost more than
    the rest of a long report."""
    many_topics = rows["topic"].nunique() > 1 if len(rows) else False
    lag, time_lag = [], []
    status_z, labels = [], []
    # Times as ms counts (a pandas Timestamp per row and queue, compared and hashed, was most
    # of a long report's time). The windows' size (every row of a report has one resolution),
    # and every window end; the charts stay open where nothing was recorded (report_gaps.py).
    ends = _ms(rows["window_end"]) if len(rows) else np.zeros(0, np.int64)
    step = int(ends[0] - _ms(rows["window_start"].iloc[:1])[0]) if len(rows) else 0
    times = np.unique(ends).tolist()
    # each window end formatted once, not per row (reports stay linear)
    iso = dict(zip(times, _iso_of_ms(times)))

    def iso_of(ts: list) -> list[str]:
        return [iso[t] if t in iso else _iso_of_ms([t])[0] for t in ts]   # a gap's null point is no window

    columns, edges = heatmap_bricks(times, step)
    rows = rows.assign(_end_ms=ends)
    for (topic, broker, qid), g in rows.groupby(["topic", "broker", "queue_id"], sort=True):
        label = _queue_label(topic, broker, qid, many_topics)
        x, y, owner, tl = open_at_gaps(g["_end_ms"].tolist(), step, g["lag"].astype(int).tolist(),
                                       g["owner"].tolist(), ints_or_none(g["time_lag_ms"]))
        x = iso_of(x)
        lag.append({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": label,
                    "customdata": owner, "hovertemplate": "%{y} (owner %{customdata})"})
        time_lag.append({"type": "scatter", "x": x, "y": tl, "mode": "lines", "name": label})
        by_time = dict(zip(g["_end_ms"].tolist(), g["status"]))
        status_z.append([STATUS_ORDER.index(by_time[t]) if t in by_time else None for t in columns])
        labels.append(label)
    # Spans with no recordings, shaded in every chart: the axis's zero line through them
    # would read as lag 0.
    not_recorded = [{"type": "rect", "x0": x0, "x1": x1, "yref": "paper", "y0": 0, "y1": 1,
                     "fillcolor": "#adb5bd", "opacity": 0.25, "line": {"width": 0}, "layer": "above",
                     "label": {"text": "not recorded", "font": {"size": 10, "color": "#495057"},
                               "textposition": "bottom center"}}
                    for x0, x1 in (_iso_of_ms(span) for span in gap_spans(times, step))]
    shapes = [{"type": "line", "x0": r["end"], "x1": r["end"], "yref": "paper", "y0": 0, "y1": 1,
               "line": {"dash": "dot", "color": "#555"}} for r in rebalances]
    shapes += [{"type": "rect", "x0": f["start"], "x1": f["end"], "yref": "paper", "y0": 0, "y1": 1,
                "fillcolor": "#e8590c", "opacity": 0.12, "line": {"width": 0}} for f in flow]
    annotations = [{"x": r["end"], "y": 1, "yref": "paper", "text": f"rebalance {r['client_id']} {r['duration_ms']} ms",
                    "showarrow": False, "textangle": -90, "xanchor": "right", "font": {"size": 9}} for r in rebalances]
    # Injected faults, strategy switches among them: solid lines, named at the bottom.
    shapes += [{"type": "line", "x0": f["t"], "x1": f["t"], "yref": "paper", "y0": 0, "y1": 1,
                "line": {"color": "#7048e8" if f["name"] == "strategy" else "#c92a2a", "width": 1.5}} for f in faults]
    annotations += [{"x": f["t"], "y": 0, "yref": "paper", "text": f["text"], "showarrow": False, "textangle": -90,
                     "xanchor": "left", "yanchor": "bottom", "font": {"size": 9}} for f in faults]
    group = []
    if len(group_rows):
        keys = ("lag", "max_lag", "avg_lag", "p95_lag")
        gx, *gy = open_at_gaps(_ms(group_rows["window_end"]).tolist(), step,
                               *[[round(float(v), 3) for v in group_rows[col]] for col in keys])
        gx = iso_of(gx)
        for col, y in zip(keys, gy):
            # p95 dotted: over a 10-s window of 10 samples it is the max, which a solid line hid.
            group.append({"type": "scatter", "x": gx, "y": y, "mode": "lines", "name": col,
                          **({"line": {"dash": "dot", "width": 2.5}} if col == "p95_lag" else {})})
    n = len(STATUS_ORDER) - 1
    status = {"type": "heatmap", "z": status_z, "x": iso_of(edges), "y": labels, "zmin": 0, "zmax": n,
              "colorscale": [[i / n, STATUS_COLORS[s]] for i, s in enumerate(STATUS_ORDER)],
              "colorbar": {"tickvals": list(range(n + 1)), "ticktext": STATUS_ORDER}}
    return [
        {"data": lag, "layout": {"title": {"text": "Lag per queue (messages)"}, "height": 380,
                                 "shapes": shapes + not_recorded, "annotations": annotations}},
        {"data": group, "layout": {"title": {"text": "Group lag (sum over queues)"}, "height": 320,
                                   "shapes": not_recorded}},
        {"data": time_lag, "layout": {"title": {"text": "Time lag per queue (ms behind)"}, "height": 320,
                                      "shapes": not_recorded}},
        {"data": [status], "layout": {"title": {"text": "Status per queue"}, "height": max(240, 24 * len(labels) + 120),
                                      "shapes": not_recorded}},
    ]


def _table(records: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns) + "</tr>"
                   for r in records)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(history: LagHistory, q: ReportQuery, rows: pd.DataFrame) -> str:
    import plotly.io as pio

    group_rows = history.windows("group_windows", q.group, q.from_ms, q.to_ms, res=q.res)
    rebalances, flow = rebalance_list(history, q), flow_control_list(history, q)
    faults = fault_list(history, q)
    figures = build_figures(rows, group_rows, rebalances, flow, faults)
    # plotly.js once, inlined: the file opens offline.
    charts = "".join(pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False, validate=False)
                     for i, fig in enumerate(figures))
    queues = queue_summary(rows)
    for r in queues:
        r["owners"] = ", ".join(r["owners"])
    span = f"{to_iso(rows['window_start'].min())} - {to_iso(rows['window_end'].max())}" if len(rows) else "no windows"
    queue_cols = ["topic", "broker", "queue_id", "owners", "last_lag", "max_lag", "avg_lag", "max_p95_lag",
                  "max_time_lag_ms", "last_status", "worst_status", *[f"windows_{s.lower()}" for s in STATUS_ORDER]]
    owner_cols = ["owner", "queues", "samples", "avg_lag", "max_lag", "consumed", "from", "to"]
    rebalance_cols = ["client_id", "start", "end", "duration_ms", "changed", "reason"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Lag report - {html.escape(q.group)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }}
table {{ border-collapse: collapse; margin: .5rem 0 1.5rem; font-size: .85rem; }}
th, td {{ border: 1px solid #ccc; padding: .2rem .5rem; text-align: right; }}
th {{ background: #f3f3f3; }}
</style></head><body>
<h1>Lag report - group {html.escape(q.group)}</h1>
<p>Windows of {q.res}, {html.escape(span)} (UTC). Lag = broker max offset - committed offset.</p>
<h2>Queues</h2>
{_table(queues, queue_cols)}
<h2>Owners (lag attributed over the time each owned a queue)</h2>
{_table(owner_summary(history, q), owner_cols)}
<h2>Rebalances that moved queues</h2>
{_table(rebalances, rebalance_cols)}
<h2>Faults and strategy switches</h2>
{_table(faults, ["t", "name", "client_id", "text"])}
<h2>Charts</h2>
{charts}
</body></html>
"""
