"""aggregate_samples()' rows made where the recordings are read: pyarrow and numpy over whole
hours of snapshot files, before Spark sees a row.

A backfill's Spark plan scanned and shuffled every raw sample (10M rows: ~230 MB through
the shuffle) only to reduce them to ~1.2M partial rows - a queue's 10-s window, a queue
and owner's minute, a group's sample ts. None of those spans an hour, and a snapshot file
holds the rows of one hour (recorder.py: a file per 10-s slice), so the rows of whole
hours reduce to exactly aggregate_samples()' rows, with nothing left to merge: ``partials``
computes them with the definitions of snapshot_tables.enrich/aggregate_samples (nulls
included), run an hour (plus look-back) at a time in Spark's Python workers (hour_tables.py)
or in the driver (partials_source.py), so the job's later steps get the rows they got from
aggregate_samples
(tests/test_lag_job.py compares the two on a real Spark; tests/test_lag_sample_partials.py
checks hand-computed values).

Exact where Spark is deterministic: a window's last sample is the greatest
(ts, broker_min_offset, broker_max_offset, consumer_offset, lag, owner, time_lag) and its
first the least (ts, time_lag), nulls first, as Spark orders structs. Rows are put in
(queue, ts) order, and by those fields too only where a queue has two samples of one ts (a
recording never has). An owner's ``last_lag`` on such a tie is one of them, as with
Spark's max_by. A window's ``lags`` are in ts order (collect_list's order is not defined;
only their p95 is used).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .layout import MINUTE, RESOLUTIONS
from .snapshot_tables import QUEUE_KEYS
from consumers_app.lab.recorder import SNAPSHOT_SCHEMA

TEN_S = RESOLUTIONS["10s"]

# aggregate_samples()' Spark schema as Arrow: the union of its three kinds of rows.
_LAST = pa.struct([("ts", pa.int64()), ("broker_min_offset", pa.int64()), ("broker_max_offset", pa.int64()),
                   ("consumer_offset", pa.int64()), ("lag", pa.int64()), ("owner", pa.string()),
                   ("time_lag", pa.int64())])
_FIRST = pa.struct([("ts", pa.int64()), ("time_lag", pa.int64())])
PARTIALS_SCHEMA = pa.schema([
    ("_kind", pa.string()), ("group", pa.string()), ("topic", pa.string()), ("broker", pa.string()),
    ("queue_id", pa.int32()), ("ws", pa.int64()), ("last", _LAST), ("first", _FIRST),
    ("max_lag", pa.int64()), ("sum_lag", pa.int64()), ("samples", pa.int64()), ("lags", pa.list_(pa.int64())),
    ("max_time_lag_ms", pa.int64()), ("owner", pa.string()), ("owned_from_ms", pa.int64()),
    ("owned_to_ms", pa.int64()), ("last_lag", pa.int64()), ("min_committed", pa.int64()),
    ("max_committed", pa.int64()), ("ts", pa.int64()), ("lag", pa.int64()), ("queues", pa.int64()),
    ("owned", pa.int64()),
])
# The snapshot columns the partials are made of.
SNAPSHOT_COLUMNS = ["ts", *QUEUE_KEYS, "owner", "broker_min_offset", "broker_max_offset", "consumer_offset",
                    "oldest_unconsumed_store_ts"]
_SNAPSHOT_FIELDS = {f.name: f for f in SNAPSHOT_SCHEMA}

_LOWEST, _HIGHEST = np.iinfo(np.int64).min, np.iinfo(np.int64).max


class Ints:
    """An int64 column as numpy arrays: its values (0 where null) and its validity."""

    def __init__(self, values: np.ndarray, valid: np.ndarray | None = None):
        self.values = values
        self.valid = np.ones(len(values), dtype=bool) if valid is None else valid

    @classmethod
    def of(cls, column) -> "Ints":
        column = pc.cast(column, pa.int64())
        if column.null_count:
            return cls(pc.fill_null(column, 0).to_numpy(zero_copy_only=False),
                       pc.is_valid(column).to_numpy(zero_copy_only=False))
        return cls(column.to_numpy(zero_copy_only=False))

    def take(self, index: np.ndarray) -> "Ints":
        return Ints(self.values[index], self.valid[index])

    def arrow(self) -> pa.Array:
        return pa.array(self.values) if self.valid.all() else pa.array(self.values, mask=~self.valid)

    def of_runs(self, ufunc, starts: np.ndarray) -> "Ints":
        """Per run starting at ``starts``: ``ufunc`` (np.maximum / np.minimum) over the valid
        values; null where a run has none."""
        neutral = _LOWEST if ufunc is np.maximum else _HIGHEST
        valid = np.logical_or.reduceat(self.valid, starts)
        best = ufunc.reduceat(np.where(self.valid, self.values, neutral), starts)
        return Ints(np.where(valid, best, 0), valid)


def window_start(ts: np.ndarray, size: int) -> np.ndarray:
    """``ts - ts % size`` with Java's remainder (the dividend's sign), as Spark computes it."""
    return ts - np.fmod(ts, size)


def run_starts(*keys: np.ndarray) -> np.ndarray:
    """Where each run of equal key tuples starts, in rows ordered by those keys."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n - 1, dtype=bool)
    for key in keys:
        change |= key[1:] != key[:-1]
    return np.concatenate(([0], np.flatnonzero(change) + 1))


def codes(column) -> tuple[np.ndarray, int]:
    """Dense int64 codes of a column's values (null has one of its own) and how many there are."""
    encoded = pc.dictionary_encode(column, null_encoding="encode").combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), len(encoded.dictionary)


@dataclass
class _Samples:
    """Enriched samples in (queue, ts) order (the struct's fields after that, on a tie); the
    string keys stay in the input's order (``keys_at`` looks a sorted position up)."""
    keys: pa.Table          # group, topic, broker, queue_id, owner: the input's rows
    order: np.ndarray       # sorted position -> input row
    queue: np.ndarray       # one code per queue
    owner: np.ndarray       # one code per owner (null has one)
    ts: np.ndarray
    bmin: Ints              # (in the input's order: only a window's last is looked up)
    bmax: Ints
    co: Ints
    lag: np.ndarray
    time_lag: Ints
    unsorted: tuple         # (ts, lag, time_lag) in the input's order

    def keys_at(self, positions: np.ndarray, columns: list[str]) -> pa.Table:
        """The key columns of the rows at these sorted positions."""
        return self.keys.select(columns).take(pa.array(self.order[positions]))

    @classmethod
    def of(cls, snapshots: pa.Table) -> "_Samples":
        n = snapshots.num_rows
        ts = Ints.of(snapshots["ts"]).values   # no nulls (partials)
        bmin, bmax, co = (Ints.of(snapshots[c]) for c in ("broker_min_offset", "broker_max_offset", "consumer_offset"))
        oldest = Ints.of(snapshots["oldest_unconsumed_store_ts"])
        # snapshot_tables.enrich: lag = max(0, max - (the commit, or min without one)); 0 where
        # a value it needs is null (greatest() skips the null difference).
        lag = np.maximum(0, bmax.values - np.where(co.values < 0, bmin.values, co.values))
        lag[~bmax.valid | ~co.valid | (~bmin.valid & (co.values < 0))] = 0
        # time lag: 0 without lag or with nothing unconsumed (or a null store time: greatest()
        # again), null while the store time is not known (< 0), else max(0, ts - oldest).
        known = oldest.valid
        time_lag = Ints(np.where((lag == 0) | ~known | (oldest.values == 0), 0, np.maximum(0, ts - oldest.values)),
                        ~((lag != 0) & known & (oldest.values < 0)))

        queue = np.zeros(n, dtype=np.int64)
        for name in QUEUE_KEYS:
            name_codes, size = codes(snapshots[name])
            queue = queue * size + name_codes
        owner, _ = codes(snapshots["owner"])
        low, span = ts.min(), int(ts.max() - ts.min()) + 1
        if int(queue.max()) < (1 << 62) // span:
            order = np.argsort(queue * span + (ts - low), kind="stable")
        else:
            order = np.lexsort((ts, queue))
        if np.any((np.diff(queue[order]) == 0) & (np.diff(ts[order]) == 0)):
            # A queue sampled twice at one ts: order such rows as Spark orders the last-sample struct.
            by = pa.table({"q": queue, "ts": ts, "bmin": bmin.arrow(), "bmax": bmax.arrow(), "co": co.arrow(),
                           "lag": lag, "owner": snapshots["owner"], "tl": time_lag.arrow()})
            order = pc.sort_indices(by, sort_keys=[(c, "ascending", "at_start") for c in by.column_names]).to_numpy()
        return cls(snapshots.select([*QUEUE_KEYS, "owner"]), order, queue[order], owner[order], ts[order],
                   bmin, bmax, co.take(order), lag[order], time_lag.take(order),
                   (ts, lag, time_lag))


def _rows(kind: str, keys: pa.Table, columns: dict) -> pa.Table:
    """One kind's rows in PARTIALS_SCHEMA (the other kinds' columns null)."""
    n = keys.num_rows
    arrays = []
    for field in PARTIALS_SCHEMA:
        if field.name == "_kind":
            arrays.append(pa.repeat(kind, n).cast(pa.string()))
        elif field.name in columns:
            arrays.append(pa.array(columns[field.name], field.type) if isinstance(columns[field.name], np.ndarray)
                          else columns[field.name].cast(field.type))
        elif field.name in keys.column_names:
            arrays.append(keys[field.name].combine_chunks().cast(field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=PARTIALS_SCHEMA)


def _queue_windows(s: _Samples) -> pa.Table:
    """Per queue and 10-s window ("q"): last and first samples, max/sum/count, the lags."""
    ws = window_start(s.ts, TEN_S)
    starts = run_starts(s.queue, ws)
    ends = np.append(starts[1:], len(ws)) - 1
    last = pa.StructArray.from_arrays(
        [pa.array(s.ts[ends]), s.bmin.take(s.order[ends]).arrow(), s.bmax.take(s.order[ends]).arrow(), s.co.take(ends).arrow(),
         pa.array(s.lag[ends]), s.keys_at(ends, ["owner"])["owner"].combine_chunks(), s.time_lag.take(ends).arrow()],
        fields=list(_LAST))
    # The first sample: the least (ts, time_lag): the run's first ts, and of the rows at that
    # ts (one, unless tied) the least time lag, null first.
    first_ts = s.ts[starts]
    run_of_row = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(ws))))
    at_first_ts = s.ts == first_ts[run_of_row]
    tl = np.where(s.time_lag.valid, s.time_lag.values, _LOWEST)
    least = np.minimum.reduceat(np.where(at_first_ts, tl, _HIGHEST), starts)
    first = pa.StructArray.from_arrays([pa.array(first_ts), pa.array(least, mask=least == _LOWEST)],
                                       fields=list(_FIRST))
    bounds = np.append(starts, len(ws))
    return _rows("q", s.keys_at(starts, QUEUE_KEYS), {
        "ws": ws[starts], "last": last, "first": first,
        "max_lag": np.maximum.reduceat(s.lag, starts), "sum_lag": np.add.reduceat(s.lag, starts),
        "samples": np.diff(bounds), "lags": pa.ListArray.from_arrays(pa.array(bounds.astype(np.int32)), pa.array(s.lag)),
        "max_time_lag_ms": s.time_lag.of_runs(np.maximum, starts).arrow(),
    })


def _owner_minutes(s: _Samples) -> pa.Table:
    """Per queue, owner and minute ("o"): the runs of one owner in ts order, then the runs of
    one key merged (an owner that held a queue, lost it and took it back within a minute)."""
    ws = window_start(s.ts, MINUTE)
    starts = run_starts(s.queue, ws, s.owner)
    ends = np.append(starts[1:], len(ws)) - 1
    committed = Ints(s.co.values, s.co.valid & (s.co.values >= 0))
    runs = s.keys_at(starts, [*QUEUE_KEYS, "owner"]).append_column("ws", pa.array(ws[starts]))
    for name, values in {
        "samples": pa.array(np.diff(np.append(starts, len(ws)))), "owned_from_ms": pa.array(s.ts[starts]),
        "owned_to_ms": pa.array(s.ts[ends]), "last_lag": pa.array(s.lag[ends]),
        "sum_lag": pa.array(np.add.reduceat(s.lag, starts)), "max_lag": pa.array(np.maximum.reduceat(s.lag, starts)),
        "min_committed": committed.of_runs(np.minimum, starts).arrow(),
        "max_committed": committed.of_runs(np.maximum, starts).arrow(),
        "max_time_lag_ms": s.time_lag.of_runs(np.maximum, starts).arrow(),
    }.items():
        runs = runs.append_column(name, values)
    merged = runs.group_by([*QUEUE_KEYS, "owner", "ws"], use_threads=False).aggregate([
        ("samples", "sum"), ("owned_from_ms", "min"), ("owned_to_ms", "max"), ("last_lag", "last"),
        ("sum_lag", "sum"), ("max_lag", "max"), ("min_committed", "min"), ("max_committed", "max"),
        ("max_time_lag_ms", "max")])
    merged = merged.rename_columns([name.rsplit("_", 1)[0] if name.endswith(("_sum", "_min", "_max", "_last"))
                                    else name for name in merged.column_names])
    return _rows("o", merged, {c: merged[c] for c in merged.column_names if c not in QUEUE_KEYS})


def _group_ts(s: _Samples) -> pa.Table:
    """Per group and sample ts ("g"): the group's lag (its queues' summed), how many queues,
    the worst time lag, how many are owned."""
    ts, lag, time_lag = s.unsorted
    rows = pa.table({"group": s.keys["group"], "ts": ts, "lag": lag, "tl": time_lag.arrow(),
                     "owner": s.keys["owner"]})
    agg = rows.group_by(["group", "ts"]).aggregate([("lag", "sum"), ("lag", "count"), ("tl", "max"),
                                                     ("owner", "count")])
    return _rows("g", agg.select(["group"]), {
        "ts": agg["ts"], "lag": agg["lag_sum"], "queues": agg["lag_count"], "max_time_lag_ms": agg["tl_max"],
        "owned": agg["owner_count"]})


def partial_kinds(snapshots: pa.Table) -> dict[str, pa.Table]:
    """aggregate_samples()' rows (PARTIALS_SCHEMA) of snapshot rows (SNAPSHOT_COLUMNS, already
    cut to the job's range and group) that hold every sample of their windows, by kind:
    "q" (a queue's 10-s window), "o" (a queue, owner and minute), "g" (a group's sample ts)."""
    if snapshots["ts"].null_count:   # never in a recording; Spark's range filter drops them too
        snapshots = snapshots.filter(pc.is_valid(snapshots["ts"]))
    if snapshots.num_rows == 0:
        return {kind: PARTIALS_SCHEMA.empty_table() for kind in "qog"}
    s = _Samples.of(snapshots)
    return {"q": _queue_windows(s), "o": _owner_minutes(s), "g": _group_ts(s)}


def partials(snapshots: pa.Table) -> pa.Table:
    """partial_kinds() as one table (aggregate_samples()' union)."""
    return pa.concat_tables(partial_kinds(snapshots).values())


def read_snapshots(paths: list[str], lo: int, hi: int, group: str | None) -> pa.Table:
    """The SNAPSHOT_COLUMNS of these snapshot files' samples in [lo, hi) of ``group`` (every
    group: None). A file deleted since it was listed (the retention) is skipped, as Spark's
    scan skips it."""
    import pyarrow.parquet as pq

    tables = []
    for path in paths:
        try:
            # (ParquetFile, not read_table: no dataset machinery for one small file)
            tables.append(pq.ParquetFile(path).read(columns=SNAPSHOT_COLUMNS))
        except FileNotFoundError:
            continue
    if not tables:
        return pa.schema([_SNAPSHOT_FIELDS[c] for c in SNAPSHOT_COLUMNS]).empty_table()
    rows = pa.concat_tables(tables)
    keep = pc.and_(pc.greater_equal(rows["ts"], lo), pc.less(rows["ts"], hi))
    if group is not None:
        keep = pc.and_(keep, pc.equal(rows["group"], group))
    if pc.all(keep, skip_nulls=False).as_py() is not True:   # a backfill's hours lie wholly in its range
        rows = rows.filter(keep)
    return rows


def read_partials(paths: list[str], lo: int, hi: int, group: str | None) -> pa.Table:
    """partials() of read_snapshots(): the files must hold every sample in [lo, hi) (whole
    hours of them, or a range's)."""
    return partials(read_snapshots(paths, lo, hi, group))


def by_hour(rels: list[str], base) -> list[list[str]]:
    """The paths of snapshot files grouped by the hour partition (directory) they are in:
    the recorder writes a file of one 10-s slice into its hour's directory."""
    hours: dict = {}
    for rel in rels:
        path = base / rel
        hours.setdefault(path.parent, []).append(str(path))
    return [sorted(paths) for _, paths in sorted(hours.items())]
