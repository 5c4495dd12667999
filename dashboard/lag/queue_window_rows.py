"""The batch job's queue windows made in numpy: compute_queue_windows(queue_points(...))'
rows - the status rules (status.py), both resolutions, p95, the end-of-window time lag -
of a chunk's partials, in Spark's Python workers (hour_tables.py).

A backfill's Spark plan for these windows (window functions for the status and the time-lag
interpolation, the minute merge's lag arrays, two sorts of every window's lags) was ~40 %
of its time, most of it code Spark generates and the JVM then compiles in every fresh
process: 1.2M windows are a few vectorised passes here (bench/lag_job.py). The lag stream
keeps the Spark functions (its pass is a few rows over a query planned once), and so does a
session whose executors may not import this project (Spark Connect, a cluster):
tests/test_lag_job.py checks that both give the same rows.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import status as rules
from .layout import RESOLUTIONS
from .sample_partials import PARTIALS_SCHEMA, Ints, codes, run_starts, window_start
from .snapshot_tables import POINT_COLUMNS, QUEUE_KEYS

POINTS_SCHEMA = pa.schema([PARTIALS_SCHEMA.field(c) for c in [*QUEUE_KEYS, "ws", *POINT_COLUMNS]])
# compute_queue_windows' columns before table_columns.with_partitions (``ws`` and the
# resolution in ms become window_start/window_end/date/hour).
WINDOWS_SCHEMA = pa.schema([
    *(PARTIALS_SCHEMA.field(c) for c in QUEUE_KEYS), ("ws", pa.int64()), ("res_ms", pa.int64()), ("res", pa.string()),
    ("broker_min_offset", pa.int64()), ("broker_offset", pa.int64()), ("consumer_offset", pa.int64()),
    ("lag", pa.int64()), ("max_lag", pa.int64()), ("avg_lag", pa.float64()), ("p95_lag", pa.int64()),
    ("time_lag_ms", pa.int64()), ("max_time_lag_ms", pa.int64()), ("owner", pa.string()),
    ("samples", pa.int64()), ("status", pa.string()),
])
_NONE = np.iinfo(np.int64).min   # "no such point" in the running maxima (Spark's null)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    """Spark's round() of a double to 0 places (HALF_UP: halves away from zero)."""
    whole = np.trunc(x)
    return (whole + np.sign(x) * (np.abs(x - whole) >= 0.5)).astype(np.int64)


def p95_of_segments(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """snapshot_tables.p95 of each segment ``values[bounds[i]:bounds[i+1]]`` (none empty):
    the k-th smallest, k = max(1, ceil(n * 0.95))."""
    n = np.diff(bounds)
    segment = np.repeat(np.arange(len(n), dtype=np.int64), n)
    low, span = (int(values.min()), int(values.max()) - int(values.min()) + 1) if len(values) else (0, 1)
    if len(n) < (1 << 62) // span:   # one sort of (segment, value) packed in an int64
        ordered = np.sort(segment * span + (values - low)) - segment * span + low
    else:
        ordered = values[np.lexsort((values, segment))]
    k = np.maximum(1, np.ceil(n * 0.95).astype(np.int64))
    return ordered[bounds[:-1] + k - 1]


def _previous(values: np.ndarray, first: np.ndarray, fill=0) -> np.ndarray:
    """The value of the queue's previous point (``fill`` at a queue's first)."""
    prev = np.empty_like(values)
    prev[1:] = values[:-1]
    prev[first] = fill
    return prev


def _statuses(queue_first: np.ndarray, queue_start: np.ndarray, ws: np.ndarray, co: Ints, lag: np.ndarray,
              window_ms: int, stop_after_ms: int) -> np.ndarray:
    """status.add_status over points in (queue, ws) order: ``queue_first`` marks a queue's
    first point, ``queue_start`` is each point's queue's first index."""
    point = rules.POINT_MS
    index = np.arange(len(ws))
    has_prev = ~queue_first
    prev_ws = _previous(ws, queue_first)
    both_co = has_prev & co.valid & _previous(co.valid, queue_first, False)
    prev_co = _previous(co.values, queue_first)
    prev_lag = _previous(lag, queue_first)

    def last_ws(flag):
        """ws of the latest point of the queue at or before each with ``flag`` (_NONE if none)."""
        at = np.maximum.accumulate(np.where(flag, index, -1))
        return np.where(at >= queue_start, ws[np.maximum(at, 0)], _NONE)

    run_start = last_ws(~has_prev | (ws - prev_ws != point))
    rewind = last_ws(both_co & (co.values >= 0) & (prev_co >= 0) & (co.values < prev_co))
    lag_down = last_ws(has_prev & (lag < prev_lag))
    co_change = last_ws(both_co & (co.values != prev_co))
    zero = last_ws(lag == 0)
    back = window_ms // point - 1
    first_lag_at = index - back
    has_first_lag = first_lag_at >= queue_start
    first_lag = lag[np.maximum(first_lag_at, 0)]

    window_lo = ws - (window_ms - point)
    pairs_lo = ws - (window_ms - 2 * point)
    stop_lo = ws - (stop_after_ms - point)
    full = run_start <= window_lo
    few = ~has_prev | (prev_ws < window_lo)
    # (_NONE < any bound: "none since" holds where nothing happened at all)
    conditions = [
        rewind >= pairs_lo,
        (zero >= window_lo) | few,
        (run_start <= stop_lo) & (co_change <= stop_lo) & (zero < stop_lo),
        full & (co_change <= window_lo),
        full & (lag_down < pairs_lo) & has_first_lag & (lag > first_lag),
    ]
    return np.select(conditions, ["REWIND", "OK", "STOP", "STALL", "WARN"], "OK").astype(object)


def _time_lag_at_end(ws: np.ndarray, res_ms: int, queue_last: np.ndarray, last_ts: np.ndarray, last_tl: Ints,
                     first_ts: np.ndarray, first_tl: Ints) -> Ints:
    """snapshot_tables._queue_output's time lag at the window end: interpolated towards the
    queue's next window's first sample (not across a gap > 2 windows, nor towards an unknown
    one), else the last sample's; never below 0; unknown stays unknown."""
    next_ts = np.append(first_ts[1:], 0)
    next_valid = np.append(first_tl.valid[1:], False) & ~queue_last
    next_tl = np.append(first_tl.values[1:], 0)
    towards = next_valid & (next_ts - last_ts <= 2 * res_ms)
    span = np.where(towards, next_ts - last_ts, 1)
    interpolated = last_tl.values + ((next_tl - last_tl.values) * (ws + res_ms - last_ts)) / span
    value = np.where(towards, _round_half_up(interpolated), last_tl.values)
    return Ints(np.maximum(value, 0), last_tl.valid)


def _windows(keys: pa.Table, res: str, ws, last, first_ts, first_tl: Ints, max_lag, sum_lag, samples,
             p95, max_tl: Ints, status, queue_last) -> pa.Table:
    res_ms = RESOLUTIONS[res]
    last_ts, last_tl = last["ts"].values, last["time_lag"]
    time_lag = _time_lag_at_end(ws, res_ms, queue_last, last_ts, last_tl, first_ts, first_tl)
    n = len(ws)
    columns = {
        **{c: keys[c] for c in QUEUE_KEYS}, "ws": pa.array(ws), "res_ms": pa.array(np.full(n, res_ms)),
        "res": pa.repeat(res, n).cast(pa.string()),
        "broker_min_offset": last["broker_min_offset"].arrow(), "broker_offset": last["broker_max_offset"].arrow(),
        "consumer_offset": last["consumer_offset"].arrow(), "lag": last["lag"].arrow(),
        "max_lag": pa.array(max_lag), "avg_lag": pa.array(sum_lag / samples), "p95_lag": pa.array(p95),
        "time_lag_ms": time_lag.arrow(), "max_time_lag_ms": max_tl.arrow(), "owner": last["owner"],
        "samples": pa.array(samples), "status": pa.array(status, pa.string()),
    }
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in WINDOWS_SCHEMA], schema=WINDOWS_SCHEMA)


def window_rows(points: pa.Table, window_ms: int = rules.DEFAULT_WINDOW_MS,
                stop_after_ms: int = rules.DEFAULT_STOP_AFTER_MS) -> pa.Table:
    """compute_queue_windows(queue_points(...))' rows (WINDOWS_SCHEMA) of aggregate_samples()'
    "q" rows (POINTS_SCHEMA) holding every point of their queues."""
    if points.num_rows == 0:
        return WINDOWS_SCHEMA.empty_table()
    queue = np.zeros(points.num_rows, dtype=np.int64)
    for name in QUEUE_KEYS:
        column_codes, size = codes(points[name])
        queue = queue * size + column_codes
    ws_in = Ints.of(points["ws"]).values
    order = np.lexsort((ws_in, queue))
    points = points.take(pa.array(order))
    queue, ws = queue[order], ws_in[order]
    n = len(ws)
    queue_first = np.ones(n, dtype=bool)
    queue_first[1:] = queue[1:] != queue[:-1]
    queue_last = np.append(queue_first[1:], True)
    queue_start = np.maximum.accumulate(np.where(queue_first, np.arange(n), 0))

    last_struct = points["last"].combine_chunks()
    last = {f.name: (Ints.of(last_struct.field(f.name)) if f.name != "owner" else last_struct.field("owner"))
            for f in last_struct.type}
    first_struct = points["first"].combine_chunks()
    first_ts, first_tl = Ints.of(first_struct.field("ts")).values, Ints.of(first_struct.field("time_lag"))
    max_lag, sum_lag, samples = (Ints.of(points[c]).values for c in ("max_lag", "sum_lag", "samples"))
    max_tl = Ints.of(points["max_time_lag_ms"])
    lags = points["lags"].combine_chunks()
    lag_values = Ints.of(lags.flatten()).values
    lag_bounds = lags.offsets.to_numpy().astype(np.int64) - lags.offsets[0].as_py()
    status = _statuses(queue_first, queue_start, ws, last["consumer_offset"], last["lag"].values, window_ms,
                       stop_after_ms)
    keys = points.select(QUEUE_KEYS)
    ten = _windows(keys, "10s", ws, last, first_ts, first_tl, max_lag, sum_lag, samples,
                   p95_of_segments(lag_values, lag_bounds), max_tl, status, queue_last)

    # Minutes: merge_windows of each queue's run of points in one minute - the last point's
    # last sample and status, the first's first sample, maxima, sums, the lags together.
    starts = run_starts(queue, window_start(ws, RESOLUTIONS["1m"]))
    ends = np.append(starts[1:], n) - 1
    minute_last = {name: (column.take(ends) if isinstance(column, Ints) else column.take(pa.array(ends)))
                   for name, column in last.items()}
    minute_bounds = lag_bounds[np.append(starts, n)]
    minute = _windows(keys.take(pa.array(starts)), "1m", window_start(ws[starts], RESOLUTIONS["1m"]), minute_last,
                      first_ts[starts], first_tl.take(starts), np.maximum.reduceat(max_lag, starts),
                      np.add.reduceat(sum_lag, starts), np.add.reduceat(samples, starts),
                      p95_of_segments(lag_values, minute_bounds), max_tl.of_runs(np.maximum, starts), status[ends],
                      queue_last[ends])
    return pa.concat_tables([ten, minute])
