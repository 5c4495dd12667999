"""The batch job's snapshot tables - queue, group and owner windows - made and written an
hour at a time in Spark's Python workers (a local session; where the executors may not
import this project, snapshot_tables' Spark functions make them from the partials and Spark
writes them: job.py).

No window spans an hour, and what a window depends on besides its own samples is bounded: a
queue's status looks back at most the longer of the status and stop windows (status.py), its
end-of-window time lag ahead at most two windows (snapshot_tables._queue_output). So an
hour's windows are made from that hour's recordings plus a look-back and a look-ahead
(plan.Chunk) - as an incremental run makes its range - and one task makes all three tables
of a chunk in numpy: its partials (sample_partials.py), the queue windows of the "q" rows
(queue_window_rows.py), the owner windows of the "o" rows, the group windows of the "g"
rows and of the queue windows. The task then writes the hour's partition of each table
with pyarrow, one file each (as the lag stream's tail is written, tail.py), merged with
the partition's rows it does not recompute, into the job's staging; the job swaps them in.

Before, the job made the partials by the hour too, but then shuffled them by queue, cached
them and made each table in stages of its own (the queue windows by a second mapInArrow),
and Spark wrote them: 10M rows took 32-41 s on local[2], ~40 % of the JVM's CPU compiling
those plans' code, and handing 1.2M windows over from Python and writing them ~15 s of task
time (bench/lag_job.py; per-thread CPU, Spark's stage metrics). tests/test_lag_job.py checks
the rows are the Spark functions' rows.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import status as rules
from . import tail
from .layout import MINUTE, RESOLUTIONS, TABLE_HAS_RES
from .queue_window_rows import POINTS_SCHEMA, p95_of_segments, window_rows
from .sample_partials import Ints, codes, partial_kinds, read_snapshots, run_starts, window_start
from .table_columns import UTC_MICROS, window_columns

_KEYS = [("group", pa.string()), ("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32())]
_WINDOW = [("window_start", UTC_MICROS), ("window_end", UTC_MICROS), ("date", pa.string()), ("hour", pa.string())]
_LONG = pa.int64()
# Each table's columns, as snapshot_tables' functions make them.
TABLE_SCHEMAS = {
    "queue_windows": pa.schema([
        *_KEYS, ("broker_min_offset", _LONG), ("broker_offset", _LONG), ("consumer_offset", _LONG), ("lag", _LONG),
        ("max_lag", _LONG), ("avg_lag", pa.float64()), ("p95_lag", _LONG), ("time_lag_ms", _LONG),
        ("max_time_lag_ms", _LONG), ("owner", pa.string()), ("samples", _LONG), ("status", pa.string()), *_WINDOW,
        ("res", pa.string())]),
    "owner_windows": pa.schema([
        *_KEYS, ("owner", pa.string()), ("samples", _LONG), ("owned_from", UTC_MICROS), ("owned_to", UTC_MICROS),
        ("last_lag", _LONG), ("avg_lag", pa.float64()), ("max_lag", _LONG), ("consumed", _LONG), *_WINDOW]),
    "group_windows": pa.schema([
        ("group", pa.string()), ("res", pa.string()), ("lag", _LONG), ("queues", _LONG), ("max_lag", _LONG),
        ("avg_lag", pa.float64()), ("p95_lag", _LONG), ("time_lag_ms", _LONG), ("max_time_lag_ms", _LONG),
        *[(f"queues_{s.lower()}", _LONG) for s in rules.STATUS_ORDER], ("status", pa.string()), *_WINDOW]),
}
# What a chunk's task answers: the windows it made per table.
_MADE = pa.schema([("table", pa.string()), ("windows", pa.int64())])


def chunk_tables(paths: list[str], range_ms: tuple, read_ms: tuple, group: str | None, window_ms: int,
                 stop_after_ms: int) -> dict[str, pa.Table]:
    """Each table's windows (TABLE_SCHEMAS) that start in ``range_ms``, made of the samples of
    ``read_ms`` in these snapshot files (a plan.Chunk's)."""
    return tables_of(read_snapshots(paths, *read_ms, group), range_ms, window_ms, stop_after_ms)


def tables_of(samples: pa.Table, range_ms: tuple, window_ms: int, stop_after_ms: int) -> dict[str, pa.Table]:
    """Each table's windows (TABLE_SCHEMAS) that start in ``range_ms``, made of these snapshot
    rows (read_snapshots' columns): a chunk's, or the lag stream's samples (stream.py)."""
    lo, hi = range_ms
    kinds = partial_kinds(samples)
    windows = _in_range(window_rows(kinds["q"].select(POINTS_SCHEMA.names), window_ms, stop_after_ms), lo, hi)
    return {"queue_windows": queue_rows(windows), "owner_windows": owner_rows(kinds["o"], lo, hi),
            "group_windows": group_rows(kinds["g"], windows, lo, hi)}


def _in_range(table: pa.Table, lo: int, hi: int) -> pa.Table:
    ws = table["ws"].to_numpy()
    keep = (ws >= lo) & (ws < hi)
    return table if keep.all() else table.filter(pa.array(keep))


def _table(name: str, columns: dict) -> pa.Table:
    """The table's columns from Arrow or numpy arrays (by name; extra ones left out)."""
    def typed(values, kind):
        return values.cast(kind) if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, kind)

    schema = TABLE_SCHEMAS[name]
    return pa.Table.from_arrays([typed(columns[f.name], f.type) for f in schema], schema=schema)


def queue_rows(windows: pa.Table) -> pa.Table:
    """The queue_windows table's rows of window_rows()' windows."""
    ws = windows["ws"].to_numpy()
    columns = {name: windows[name] for name in windows.column_names}
    return _table("queue_windows", {**columns, **window_columns(ws, windows["res_ms"].to_numpy())})


def owner_rows(minutes: pa.Table, lo: int, hi: int) -> pa.Table:
    """The owner_windows table's rows (compute_owner_windows) of the "o" partials: the
    owned ones whose minute starts in [lo, hi)."""
    minutes = _in_range(minutes.filter(pc.is_valid(minutes["owner"])), lo, hi)
    samples = minutes["samples"].to_numpy()
    return _table("owner_windows", {
        **{name: minutes[name] for name in ("group", "topic", "broker", "queue_id", "owner", "last_lag", "max_lag")},
        "samples": samples,
        "owned_from": pa.array(minutes["owned_from_ms"].to_numpy() * 1000, UTC_MICROS),
        "owned_to": pa.array(minutes["owned_to_ms"].to_numpy() * 1000, UTC_MICROS),
        "avg_lag": minutes["sum_lag"].to_numpy() / samples,
        "consumed": pc.subtract(minutes["max_committed"], minutes["min_committed"]),   # null with either
        **window_columns(minutes["ws"].to_numpy(), MINUTE),
    })


def group_rows(per_ts: pa.Table, windows: pa.Table, lo: int, hi: int) -> pa.Table:
    """The group_windows table's rows (group_windows_from) of the "g" partials (a group's lag
    at each sample ts) and its queues' windows (window_rows(), cut to [lo, hi)): the lag's
    last/max/avg/p95 in each window, the worst queue's time lag and status, the queues in
    each status."""
    if per_ts.num_rows == 0:
        return TABLE_SCHEMAS["group_windows"].empty_table()
    own = _in_range(pa.concat_tables([_group_lag(per_ts, res, res_ms) for res, res_ms in RESOLUTIONS.items()]), lo, hi)
    if own.num_rows == 0:   # (else the range has samples, so queue windows)
        return TABLE_SCHEMAS["group_windows"].empty_table()
    both = own.join(_from_queues(windows), keys=["group", "res", "ws"], join_type="left outer", use_threads=False)
    ws = both["ws"].to_numpy()
    res_ms = np.where(pc.equal(both["res"], "10s").to_numpy(zero_copy_only=False), RESOLUTIONS["10s"],
                      RESOLUTIONS["1m"])
    return _table("group_windows", {**{name: both[name] for name in both.column_names},
                                    **window_columns(ws, res_ms)})


def _group_lag(per_ts: pa.Table, res: str, res_ms: int) -> pa.Table:
    """Per group and window: the lag and queues at its last sample ts, max, avg and p95 of the lag."""
    group, _ = codes(per_ts["group"])
    ts = per_ts["ts"].to_numpy()
    ws = window_start(ts, res_ms)
    order = np.lexsort((ts, ws, group))
    lag, queues, ws = per_ts["lag"].to_numpy()[order], per_ts["queues"].to_numpy()[order], ws[order]
    starts = run_starts(group[order], ws)
    bounds = np.append(starts, len(ws))
    ends = bounds[1:] - 1
    return pa.table({
        "group": per_ts["group"].take(pa.array(order[starts])), "res": pa.repeat(res, len(starts)).cast(pa.string()),
        "ws": ws[starts], "lag": lag[ends], "queues": queues[ends], "max_lag": np.maximum.reduceat(lag, starts),
        "avg_lag": np.add.reduceat(lag, starts) / np.diff(bounds), "p95_lag": p95_of_segments(lag, bounds),
    })


def _from_queues(windows: pa.Table) -> pa.Table:
    """Per group, resolution and window, of its queues' windows: the worst time lags and
    status, how many queues are in each status."""
    group, _ = codes(windows["group"])
    res, _ = codes(windows["res"])
    ws = windows["ws"].to_numpy()
    order = np.lexsort((ws, res, group))
    starts = run_starts(group[order], res[order], ws[order])
    rank = pc.index_in(windows["status"], value_set=pa.array(rules.STATUS_ORDER)).to_numpy()[order]
    worst = np.maximum.reduceat(rank, starts)
    at = pa.array(order[starts])
    return pa.table({
        "group": windows["group"].take(at), "res": windows["res"].take(at), "ws": ws[order][starts],
        "time_lag_ms": Ints.of(windows["time_lag_ms"]).take(order).of_runs(np.maximum, starts).arrow(),
        "max_time_lag_ms": Ints.of(windows["max_time_lag_ms"]).take(order).of_runs(np.maximum, starts).arrow(),
        **{f"queues_{s.lower()}": np.add.reduceat((rank == k).astype(np.int64), starts)
           for k, s in enumerate(rules.STATUS_ORDER)},
        "status": pa.array(np.array(rules.STATUS_ORDER, dtype=object)[worst], pa.string()),
    })


def write_chunk(chunk: dict, group: str | None, window_ms: int, stop_after_ms: int, out: Path,
                staging: Path) -> dict[str, int]:
    """chunk_tables() of a chunk (a plan.Chunk as a dict: paths, lo, hi, read_lo, read_hi)
    written as its hour's partitions of each table under ``staging/<table>``: its windows
    plus the rows of the partition as readers see it now (the tail's, else the table's,
    tail.py) that it does not recompute - as job._replace merges them. Returns the windows
    made per table."""
    lo, hi = chunk["lo"], chunk["hi"]
    tables = chunk_tables(chunk["paths"], (lo, hi), (chunk["read_lo"], chunk["read_hi"]), group, window_ms,
                          stop_after_ms)
    start = datetime.fromtimestamp(lo / 1000, tz=timezone.utc)
    for name, rows in tables.items():
        data = sorted(c for c in rows.column_names if c not in ("res", "date", "hour"))
        schema = rows.select(data).schema
        for res in (RESOLUTIONS if TABLE_HAS_RES[name] else [None]):
            rel = tail.partition_rel(res, start.strftime("%Y-%m-%d"), start.strftime("%H"))
            new = rows.filter(pc.equal(rows["res"], res)) if res else rows
            current = tail.current_partition(out, name, rel, schema)
            parts = [new.select(data)]
            if current is not None:
                ws = pc.cast(current["window_start"], pa.int64())
                recomputed = pc.and_(pc.greater_equal(ws, lo * 1000), pc.less(ws, hi * 1000))
                if group is not None:
                    recomputed = pc.and_(recomputed, pc.equal(current["group"], group))
                parts.insert(0, current.filter(pc.invert(recomputed)))
            merged = pa.concat_tables(parts)
            if merged.num_rows:
                # Named after the chunk: a task run again replaces its file, never adds one.
                (staging / name / rel).mkdir(parents=True, exist_ok=True)
                path = staging / name / rel / f"part-{lo}.zstd.parquet"
                pq.write_table(merged, f"{path}.tmp", compression="zstd")
                os.replace(f"{path}.tmp", path)
    return {name: rows.num_rows for name, rows in tables.items()}


def stage_hour_tables(spark, chunks: list, recordings: Path, out: Path, staging: Path, group: str | None,
                      window_ms: int, stop_after_ms: int) -> dict[str, int]:
    """write_chunk() of every plan.Chunk (its snapshot files under ``recordings``), in
    Spark's Python workers, one task per chunk at a time; returns the windows made per table."""
    listing = spark.createDataFrame(
        [([str(recordings / rel) for rel in c.rels], *c.range_ms, *c.read_ms) for c in chunks],
        "paths array<string>, lo long, hi long, read_lo long, read_hi long")

    def write(batches):
        for batch in batches:
            for chunk in batch.to_pylist():
                made = write_chunk(chunk, group, window_ms, stop_after_ms, out, staging)
                yield pa.RecordBatch.from_pydict({"table": list(made), "windows": list(made.values())},
                                                 schema=_MADE)

    counts = dict.fromkeys(TABLE_SCHEMAS, 0)
    for row in listing.mapInArrow(write, "table string, windows long").collect():
        counts[row["table"]] += row["windows"]
    return counts
