"""The lag history as a stream: each new slice of recordings folded into the tables with
checkpointed state, at a cost proportional to the slice, not to the status look-back.

A pass (``LagStream.run``) takes the recording files not processed yet and runs its few
Spark queries (PASS_STAGES) over them and the *state* the previous pass left:

* ``points``: per queue and 10-s window, the partial aggregates the queue windows are made
  of (aggregate_samples' "q" rows: last/first sample, max, sum, count, the lags for p95);
* ``owners``: per queue, owner and minute, the owner windows' partial aggregates ("o" rows);
* ``per_ts``: per group and sample ts, the group's summed lag and queue count;
* ``events``: the rebalance, flow-control, fault and hand-off events;
* ``last_rebalance``: per client, its last rebalance event older than the state (a
  rebalance's start may be the client's previous event; a pass's query gets each
  client's last one before its events cut instead, ``rebalances_before``).

each kept for ``horizon`` before the newest sample (the status rules' look-back plus the
windows a new slice can still change). The points carry their status and what it is
derived from (status.CARRIED: running maxima), so a pass reads each state table only from
its ``Cuts`` - the oldest row the windows it emits are made of, minutes back - whatever the
status look-back: its cost follows the slice and the queues, not the horizon (at 256
queues: 2.1 s of CPU a pass, where reading the horizon cost 4.5 s and grew with it). New
rows' partials are merged into the state's (late rows of a slice merge exactly: maxima,
sums, concatenated lags; a point a new row reaches is evaluated again, and so is every
later point of its queue), and the batch job's own functions (snapshot_tables.py,
event_tables.py) compute, from state + new, those windows and the next state (the rows
before the cuts pass into it unread). Each query's result comes back as one Arrow table;
``emitted`` keeps the windows the new rows can change - the new slices', the windows whose
end-of-window time lag interpolates towards them, the minutes they fall in, the statuses
after them - which are upserted into each table's tail (tail.py), the queue and group
windows first (PASS_STAGES); ``next_state`` keeps the state from ``horizon`` on, which is
saved; then ``_state.json`` records the files as processed and names the new
state, in one rename: the checkpoint. A pass killed before that rename is done again from
the old checkpoint with the same files, and upserts by key make that idempotent: nothing
is lost, nothing doubled.

What a pass costs is Spark's fixed work, not rows: so a pass is a few stages (PASS_STAGES:
a subtree used by several outputs of one query would run once per use), each query holds
nothing of one pass (its times are applied by ``emitted``, in Arrow), planned each pass
over in-memory relations (Spark Connect, a cluster). A slice without any event a table is
made of (a steady lab's) runs a smaller variant with no event inputs.

In a local session (FOLD_STATE_TABLES) the snapshot side is no Spark query: the state keeps
the horizon's raw ``samples`` instead of points, owners and per_ts, and a pass makes the
queue, group and owner windows of state + slice with the batch's numpy functions
(hour_tables.tables_of), keeping the same windows (``emitted``); Spark makes the event tables
(FOLD_STAGES["numpy"]) in one query planned once and run again each pass: its leaves are a
data source (stream_input.py) that reads, when the query runs, the files
``_stream_inputs.json`` names - the new event slices, the state's events. A slice without
such events starts no Spark job.

The batch job (``lagjob``) computes the same rows from all recordings. When a pass cannot
be a stream step - no valid state (first start, or a batch run changed the history since),
files older than the state covers, or a backlog of more than ``max_span_ms`` - it runs the
batch's incremental run instead (or first builds the state from the recordings), so the
stream and the batch never disagree. A recording file that cannot be read is skipped and
named in ``_state.json``'s ``skipped`` (the history page says so); it never stops the stream.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import tail
from .event_tables import (EVENT_TABLE_TYPES, TABLE_EVENT_TYPES, compute_flow_control, compute_marks, compute_rebalances,
                           table_events)
from .job import JobParams, JobResult, LagJob, describe, recording_problem
from .layout import MINUTE, TABLE_HAS_RES, list_recordings
from .snapshot_tables import (POINT_COLUMNS, QUEUE_KEYS, aggregate_samples, compute_owner_windows, compute_queue_windows,
                              group_windows_from, merge_windows, per_ts_rows, queue_points)
from .hour_tables import tables_of
from .sample_partials import SNAPSHOT_COLUMNS, read_snapshots
from .spark import runs_project_code, spark_schema
from .status import CARRIED
from .stream_input import cut_rows
from consumers_app.lab.recorder import EVENTS, SCHEMAS, SNAPSHOTS

log = logging.getLogger(__name__)

STREAM_DIR = "_stream"
STATE_TABLES = ("points", "owners", "per_ts", "events", "last_rebalance")
# How a pass folds the snapshots in, and the state tables each way keeps: in Spark (the
# partial aggregates above: Spark Connect, a cluster), or - in a local session, whose Python
# is this project's - in numpy with the batch's own functions (hour_tables.tables_of) over the
# raw samples of the horizon, ``samples``: 75 ms at 64 x 256 where Spark's stages took ~1 s
# before the queue windows landed (bench/lag_stream_pass.py; the event tables stay Spark's).
FOLD_STATE_TABLES = {"spark": STATE_TABLES, "numpy": ("samples", "events", "last_rebalance")}
# The samples a numpy fold keeps before the horizon: the batch makes a window from a look-back
# of max(status window, stop after) + 1 minute (plan._read_range), and the earliest window a
# pass emits starts up to 3 minutes before its new rows (emitted), one more than Reach holds.
SAMPLES_BEFORE_MS = 2 * 60_000
# The state's layout: a checkpoint of another version or fold is built again (one batch-like pass).
STATE_VERSION = 3   # 2: points carry their status (status.CARRIED); 3: the fold's kind
# state table -> the column its pass cut applies to (Cuts)
CUT_COLUMNS = {"points": "ws", "owners": "ws", "per_ts": "ts", "events": "ts"}
TEN_S = 10_000


@dataclass
class Reach:
    """How far back a pass must see: ``need`` before the oldest new sample (statuses of the
    re-emitted windows look back that far), ``horizon`` kept before the newest."""
    need_ms: int
    horizon_ms: int

    @classmethod
    def of(cls, p: JobParams) -> "Reach":
        lookback = max(p.status_window_ms, p.stop_after_ms) + 2 * TEN_S
        # re-emitted: 10-s windows 30 s back (time-lag interpolation), minutes 2 min back
        need = lookback + 3 * MINUTE
        return cls(need_ms=need, horizon_ms=need + 2 * MINUTE)


@dataclass
class Cuts:
    """Where a pass's query starts reading each state table: the oldest row the windows it
    emits are made of (emitted), so a pass reads minutes of state, not the horizon. The points
    carry their statuses (status.CARRIED), so none is needed for the status look-back; the
    rows before a cut pass into the next state unread.

    The events from the minute of the first new one: the flow-control windows re-emitted
    start there, a mark is made of its newest event, and a rebalance needs only its client's
    previous rebalance event - which the query gets from ``rebalances_before`` (at 64
    members' periodic rebalances, the events of the horizon were most of what a pass read)."""
    points: int
    owners: int
    per_ts: int
    events: int = 0

    @classmethod
    def of(cls, snap_lo: int | None, event_lo: int | None = None) -> "Cuts":
        events = NEVER if event_lo is None else _floor(event_lo, MINUTE)
        if snap_lo is None:   # no new snapshots: no snapshot table changes, none is read
            return cls(NEVER, NEVER, NEVER, events)
        minutes_from = _floor(snap_lo - 2 * MINUTE, MINUTE)   # emitted's first minute
        return cls(points=minutes_from, owners=_floor(snap_lo, MINUTE), per_ts=minutes_from, events=events)

    def of_table(self, name: str) -> int | None:
        return getattr(self, name) if name in CUT_COLUMNS else None


NEVER = 2 ** 62


def _floor(ms: int, step: int) -> int:
    return ms - ms % step


class LagStream:
    def __init__(self, job: LagJob, max_span_ms: int = 10 * MINUTE):
        self.job = job
        self.out = job.out
        self.max_span_ms = max_span_ms
        # The state tables' Spark schemas, from the plan that wrote them: a read given its
        # schema starts no Spark job (inferring it from the Parquet footer does, per table).
        self._state_schemas: dict = {}
        self._listings: dict = {}   # list_recordings' cache: hour directories not written to since
        # The state as Arrow tables (name, table -> pa.Table): what the last pass saved, fed to
        # the next as in-memory relations - no file scans, footers or broadcasts per pass.
        self._state_tables: tuple = (None, {})
        self._slice: dict = {}   # (kind, rel) -> the new file's rows, read once by _inspect
        # A numpy fold's query (its event outputs -> FoldQuery), planned once and run again each
        # pass over other files (stream_input.py); False where that cannot be (Spark Connect, a
        # cluster, a plan with exchanges).
        self._queries: dict = {}

    # -- one pass -------------------------------------------------------------------

    def run(self, params: JobParams | None = None, lock_wait_s: float = 0.0) -> JobResult:
        params = params or JobParams.from_settings()
        started = time.monotonic()
        with self.job.locked(lock_wait_s):
            result = self._pass(params)
        result.seconds = round(time.monotonic() - started, 3)
        return result

    def _pass(self, p: JobParams) -> JobResult:
        job = self.job
        self._slice = {}
        files = {kind: list_recordings(job.recordings, kind, self._listings) for kind in (SNAPSHOTS, EVENTS)}
        state = job.load_state()
        changed = job._forget_deleted(state, files)
        new = {kind: sorted(rel for rel in files[kind] if rel not in state["processed"][kind]) for kind in files}
        if not any(new.values()):
            if changed:
                job.save_state(state)
            return JobResult("nothing-new" if any(files.values()) else "no-recordings")
        spans, bad = self._inspect(new)
        if bad:   # set aside (no job lists them again) and named on the history page
            job.set_aside(state, bad)
            new = {kind: [rel for rel in new[kind] if rel in spans[kind]] for kind in new}
            if not any(new.values()):
                return JobResult("nothing-new")
        reach = Reach.of(p)
        stream = self._valid_stream(state)
        if stream is None:
            stream = self._build_state(state, files, reach, p)
        # Where each kind's new rows start changing tables: None for event files with only
        # events no table is made of (a steady lab's consume and process-queue events).
        lows = {kind: min((spans[kind][rel][3] for rel in new[kind] if spans[kind][rel][3] is not None),
                          default=None) for kind in new}
        lo = min(spans[kind][rel][0] for kind in new for rel in new[kind])
        hi = max(spans[kind][rel][1] for kind in new for rel in new[kind])
        lower = stream["lower"]
        too_late = lower is not None and (
            (lows[SNAPSHOTS] is not None and lows[SNAPSHOTS] - reach.need_ms < lower)
            or (lows[EVENTS] is not None and lows[EVENTS] - 2 * MINUTE < lower))
        if too_late or hi - lo > self.max_span_ms:
            # Not a stream step: the batch folds them in; the state is built again next pass.
            return job.run_locked(p)
        return self._fold(state, stream, new, lows, (lo, hi), reach, p, spans)

    def _fold(self, state, stream, new, lows, span, reach: Reach, p: JobParams, spans) -> JobResult:
        job = self.job
        spark = job.spark
        lo, hi = span
        newest = max(stream["newest"] or hi, hi)
        keep_from = newest - reach.horizon_ms
        old_state = self._state_arrow(stream)
        # A slice without events any table is made of (a steady lab's) folds in its snapshots
        # only: the events state stays what it was (fewer inputs, a smaller plan); one with
        # events makes only the event tables its events can change (EVENT_TABLE_TYPES: the
        # others' rows would come out as they are - a steady lab's periodic rebalances need no
        # flow-control or marks query).
        outputs = self._event_outputs(new)
        with_events = bool(outputs)
        cuts = Cuts.of(lows[SNAPSHOTS], lows[EVENTS])
        # Only a pass with events reads them (and the last rebalances before their cut).
        last_rebalance = (rebalances_before(old_state["events"], old_state["last_rebalance"], cuts.events)
                          if with_events and old_state else _empty_events())
        # Each stage's table rows are upserted as soon as it has made them (by key: a pass
        # done again after a crash doubles nothing): the queue and group windows first.
        windows = {table: 0 for table in TABLE_HAS_RES}
        landed = []

        def land(made: dict) -> None:
            tables = emitted(made, lows, [table for table in made if table in TABLE_HAS_RES])
            self._upsert(tables, windows)
            if "group_windows" in tables and not landed:
                landed.append(int(time.time() * 1000))

        fold = self._fold_kind(spark)
        if fold == "numpy":
            samples = self._samples_with(old_state, new)
            if lows[SNAPSHOTS] is not None:
                made = snapshot_tables_of(samples, lows[SNAPSHOTS], p)
                land({name: made.pop(name) for name in ("queue_windows", "group_windows")})
                land(made)
            rows = self._run_fold(spark, new, stream, p, outputs, cuts, last_rebalance, land) if with_events else {}
        else:
            rows = self._run_fold(spark, new, stream, p, outputs, cuts, last_rebalance, land)
        if not with_events:   # the state's events pass on unread (their cut is NEVER)
            rows["events"] = _empty_events()
        result = next_state(rows, keep_from, old_state["last_rebalance"] if old_state else None, cuts, old_state)
        if fold == "numpy":
            result["samples"] = _samples_from(samples, keep_from)
        name = self._save_state_tables(result)
        _crash_point("state saved")
        for kind in new:
            state["processed"][kind].update(new[kind])
        state["stream"] = {"state": name, "runs": state.get("runs", 0), "newest": newest,
                           "lower": keep_from if stream["lower"] is not None or keep_from > 0 else None,
                           "passes": stream.get("passes", 0) + 1, "version": STATE_VERSION, "fold": fold}
        state["last_ts"] = max(state.get("last_ts") or 0, newest)
        job.save_state(state)   # the checkpoint: files processed and the state that folds them
        for old in (self.out / STREAM_DIR).iterdir():   # the previous state, and any a killed pass left
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        for table in TABLE_HAS_RES:   # hours no pass can change any more join the table
            tail.seal(self.out, table, keep_from - 10 * MINUTE)
        newest_day = state["last_ts"]
        job.prune_history(int(p.history_days * 86_400_000), newest_day)
        rows_read = sum(spans[kind][rel][2] for kind in new for rel in new[kind])
        return JobResult("done", range_ms=(lo, hi),
                         new_files=sum(len(v) for v in new.values()), files_read=sum(len(v) for v in new.values()),
                         rows_read=rows_read, windows=windows, windows_landed_ms=landed[0] if landed else None)

    def _upsert(self, tables: dict, counts: dict) -> None:
        for table, rows in tables.items():
            if rows.num_rows:
                tail.upsert(self.out, table, rows, (["res"] if TABLE_HAS_RES[table] else []) + ["date", "hour"])
            counts[table] = rows.num_rows
            _crash_point(f"upserted {table}")

    # -- state ----------------------------------------------------------------------

    def _valid_stream(self, state: dict) -> dict | None:
        """The checkpoint's stream state, if it still describes the history: no batch run since."""
        stream = state.get("stream")
        if not stream or stream.get("runs") != state.get("runs", 0) or stream.get("version") != STATE_VERSION:
            return None
        if stream.get("fold") != self._fold_kind(self.job.spark):   # a session of the other kind since
            return None
        if stream.get("state") and not (self.out / STREAM_DIR / stream["state"]).is_dir():
            return None
        return stream

    def _build_state(self, state: dict, files: dict, reach: Reach, p: JobParams) -> dict:
        """The state of what is processed, from the recordings of the horizon (once, after a
        start without a checkpoint or a batch run)."""
        processed = {kind: {rel: files[kind][rel] for rel in state["processed"][kind] if rel in files[kind]}
                     for kind in files}
        minutes = [m for kind in processed for m in processed[kind].values()]
        fold = self._fold_kind(self.job.spark)
        stream = {"state": None, "runs": state.get("runs", 0), "newest": None, "lower": None, "passes": 0,
                  "version": STATE_VERSION, "fold": fold}
        if minutes:
            last_minute = max(minutes)
            tails = [(kind, rel) for kind in processed for rel, m in processed[kind].items() if m == last_minute]
            spans, _ = self._inspect({kind: [rel for k, rel in tails if k == kind] for kind in processed})
            newest = max((s[1] for kind in spans for s in spans[kind].values()), default=last_minute)
            keep_from = newest - reach.horizon_ms
            read = {kind: sorted(rel for rel, m in processed[kind].items()
                                 if m + MINUTE > keep_from - SAMPLES_BEFORE_MS) for kind in processed}
            spark = self.job.spark
            inputs = {kind: self.job._read(spark, kind, read[kind], -2 ** 62, 2 ** 62, None) for kind in read}
            frames = fold_plan(spark, self.job, inputs, None, p)
            self._state_schemas = _state_schemas(frames)
            rows = run_stages(spark, frames, stages=FOLD_STAGES[fold])
            result = next_state(rows, keep_from, None, Cuts(0, 0, 0))
            if fold == "numpy":
                paths = [str(self.job.recordings / rel) for rel in read[SNAPSHOTS]]
                result["samples"] = _samples_from(read_snapshots(paths, -2 ** 62, 2 ** 62, None), keep_from)
            stream.update(state=self._save_state_tables(result), newest=newest, lower=keep_from)
        state["stream"] = stream
        self.job.save_state(state)
        return stream

    def _run_fold(self, spark, new: dict, stream: dict, p: JobParams, outputs: frozenset,
                  cuts: Cuts, last_rebalance: pa.Table, land) -> dict[str, pa.Table]:
        """The fold's Spark rows for the new files and the state (``last_rebalance``: what the
        query reads for it, rebalances_before's; ``outputs``: the event tables to make),
        ``land(made)`` called with each stage's own as soon as it has made them. A numpy fold's
        one query (the event tables) is planned once where it can be and run again over the
        files a manifest names; else each stage is planned for this pass over in-memory relations."""
        query = self._reusable_query(spark, p, outputs)
        if query is not None:
            base = self.out / STREAM_DIR / stream["state"] if stream.get("state") else None
            manifest = {f"new/{kind}": [str(self.job.recordings / rel) for rel in new[kind]] for kind in new}
            if base:   # the state's events through the new events' leaf, from their cut
                manifest["new/events"] = {"files": manifest["new/events"] + [str(base / "events.parquet")],
                                          "column": "ts", "from": cuts.events}
            pq.write_table(last_rebalance, self._last_rebalance_path(), compression="none")
            manifest["state/last_rebalance"] = [str(self._last_rebalance_path())]
            path = self._manifest_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path.with_suffix(".tmp"), "w") as f:
                json.dump(manifest, f)
            os.replace(path.with_suffix(".tmp"), path)
            made = query.run()
            land(made)
            self._last_rebalance_path().unlink(missing_ok=True)
            return made
        inputs = {kind: self._slice_frame(spark, kind, [self._slice[(kind, rel)] for rel in new[kind]
                                                        if (kind, rel) in self._slice])
                  for kind in new}
        state = self._state_frames(spark, stream, cuts)
        if state is not None:
            state["last_rebalance"] = _frame(spark, last_rebalance, self._state_schemas.get("last_rebalance"))
        frames = fold_plan(spark, self.job, inputs, state, p, outputs)
        if outputs:
            self._state_schemas = _state_schemas(frames)
        return run_stages(spark, frames, land, FOLD_STAGES[self._fold_kind(spark)])

    def _manifest_path(self):
        return self.out / "_stream_inputs.json"   # beside _state.json; _stream/ holds only states

    def _last_rebalance_path(self):
        return self.out / "_stream_last_rebalance.parquet"

    def _reusable_query(self, spark, p: JobParams, outputs: frozenset) -> "FoldQuery | None":
        """A numpy fold's query (the event tables: FOLD_STAGES["numpy"]) over stream_input
        leaves, planned once per session, params and variant (the event tables it makes).
        Only a local classic session - the one that folds in numpy: a Connect server or a
        cluster's executors may not import this project (they get in-memory relations
        instead). Only a plan without exchanges: a second run of a plan reuses its shuffle
        outputs (stale rows)."""
        key = (id(spark), repr(p))
        query = self._queries.get(outputs)
        if query is False or (query is not None and query.key == key):
            return query or None
        self._queries[outputs] = False
        if self._fold_kind(spark) != "numpy":
            return None
        try:
            from .stream_input import NAME, LagStreamInput

            spark.dataSource.register(LagStreamInput)
            manifest = str(self._manifest_path())

            def leaf(table: str, schema):
                return (spark.read.format(NAME).option("manifest", manifest).option("table", table)
                        .option("schema", schema.json()).load())

            inputs = {kind: leaf(f"new/{kind}", spark_schema(SCHEMAS[kind])) for kind in (SNAPSHOTS, EVENTS)}
            empty = _empty_state(spark, self.job)
            # The state's events come through the new events' leaf (_run_fold lists both): a leaf is
            # read once per use, and the events have six uses.
            state = {**empty, "last_rebalance": leaf("state/last_rebalance", empty["events"].schema)}
            (stage,) = FOLD_STAGES["numpy"]
            query = FoldQuery(stage_frames(stage, fold_plan(spark, self.job, inputs, state, p, outputs), None), key)
            plan = query.df._jdf.queryExecution().executedPlan().toString()
        except Exception as exc:  # noqa: BLE001 - any failure: plan each pass, as before
            log.warning("lag stream: planning each pass (the reusable query failed: %s)", str(exc).splitlines()[0])
            return None
        if "Exchange" in plan or "AdaptiveSparkPlan" in plan:
            log.warning("lag stream: planning each pass (the query has exchanges)")
            log.debug("%s", plan)
            return None
        self._queries[outputs] = query
        return query

    def _state_arrow(self, stream: dict) -> dict | None:
        """The state tables as Arrow tables (None when there is no state yet): the last pass's
        result, or the checkpoint's files after a start."""
        if not stream.get("state"):
            return None
        if self._state_tables[0] != stream["state"]:
            base = self.out / STREAM_DIR / stream["state"]
            self._state_tables = (stream["state"], {name: pq.read_table(base / f"{name}.parquet")
                                                    for name in FOLD_STATE_TABLES[stream["fold"]]})
        return self._state_tables[1]

    def _state_frames(self, spark, stream: dict, cuts: Cuts) -> dict | None:
        """The state tables from their cuts as in-memory DataFrames (None when there is no state yet)."""
        tables = self._state_arrow(stream)
        if tables is None:
            return None
        frames = {name: _frame(spark, cut_rows(tables[name], CUT_COLUMNS.get(name), cuts.of_table(name)),
                               self._state_schemas.get(name))
                  for name in STATE_TABLES if name in tables}
        # (a numpy fold's query makes only the event tables: no snapshot state to read)
        return {**_empty_state(spark, self.job), **frames} if len(frames) < len(STATE_TABLES) else frames

    def _slice_frame(self, spark, kind: str, tables: list):
        """One kind's new recordings (read by ``_inspect``) as one DataFrame."""
        schema = SCHEMAS[kind]
        table = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables]) if tables \
            else schema.empty_table()
        return _frame(spark, table, spark_schema(schema))

    def _save_state_tables(self, result: dict) -> str:
        name = f"state-{uuid.uuid4().hex}"
        scratch = self.out / STREAM_DIR / f".{name}"
        scratch.mkdir(parents=True)
        for table, rows in result.items():
            pq.write_table(rows, scratch / f"{table}.parquet", compression="zstd")
        scratch.rename(self.out / STREAM_DIR / name)
        self._state_tables = (name, dict(result))
        return name

    @staticmethod
    def _fold_kind(spark) -> str:
        """"numpy" in a local session (its Python workers and this process import this
        project), else "spark" (FOLD_STATE_TABLES)."""
        return "numpy" if runs_project_code(spark) else "spark"

    def _samples_with(self, old_state: dict | None, new: dict) -> pa.Table:
        """A numpy fold's samples: the state's and the new snapshot files' (read by ``_inspect``)."""
        parts = [old_state["samples"]] if old_state else []
        parts += [self._slice[(SNAPSHOTS, rel)] for rel in new[SNAPSHOTS] if (SNAPSHOTS, rel) in self._slice]
        return pa.concat_tables([t.select(SNAPSHOT_COLUMNS).cast(_SAMPLES_SCHEMA) for t in parts]) if parts \
            else _SAMPLES_SCHEMA.empty_table()

    def _event_outputs(self, new: dict) -> frozenset:
        """The event tables (EVENT_TABLE_TYPES) the new event files' rows can change."""
        present = set()
        for rel in new[EVENTS]:
            table = self._slice.get((EVENTS, rel))
            if table is not None:
                present.update(pc.unique(table["type"]).to_pylist())
        return frozenset(name for name, types in EVENT_TABLE_TYPES.items() if present.intersection(types))

    def _inspect(self, new: dict) -> tuple[dict, list]:
        """Per kind, rel -> (min ts, max ts, rows, min ts of the rows tables are made of) of
        each readable file; and the unreadable ones as (kind, rel, reason). A file is read
        whole: a slice is small."""
        spans, bad = {kind: {} for kind in new}, []
        for kind, rels in new.items():
            for rel in rels:
                try:
                    table = pq.read_table(self.job.recordings / rel)
                    problem = recording_problem(kind, table.column_names, table.num_rows)
                    if problem:
                        bad.append((kind, rel, problem))
                        continue
                    bounds = pc.min_max(table["ts"]).as_py()
                    changes_from = bounds["min"]
                    if kind == EVENTS:
                        kept = table.filter(pc.is_in(table["type"], pa.array(TABLE_EVENT_TYPES)))
                        changes_from = pc.min(kept["ts"]).as_py() if kept.num_rows else None
                    spans[kind][rel] = (bounds["min"], bounds["max"], table.num_rows, changes_from)
                    self._slice[(kind, rel)] = table
                except FileNotFoundError:
                    continue   # deleted by the retention since listed
                except Exception as exc:  # noqa: BLE001 - a bad file is skipped, whatever is wrong with it
                    bad.append((kind, rel, describe(exc)))
        return spans, bad


def _crash_point(where: str) -> None:
    """Tests kill a pass here (LAG_STREAM_CRASH_AT=where): SIGKILL, as a crash would."""
    import os
    import signal

    if os.environ.get("LAG_STREAM_CRASH_AT") == where:
        os.kill(os.getpid(), signal.SIGKILL)


# -- the plan (DataFrame functions; the batch job's computations) --------------------------

def _frame(spark, table: pa.Table, schema=None):
    """An Arrow table as a DataFrame (an in-memory relation: a pass's inputs are small); its
    schema from the Arrow one when not given (Spark Connect infers none from no rows)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(table, schema=schema or from_arrow_schema(table.schema))


def _empty_state(spark, job: LagJob) -> dict:
    empty_snapshots = job._read(spark, SNAPSHOTS, [], 0, 0, None)
    empty_events = job._read(spark, EVENTS, [], 0, 0, None)
    partial = aggregate_samples(empty_snapshots)
    return {"points": _points(partial), "owners": _owners(partial), "per_ts": per_ts_rows(partial),
            "events": empty_events, "last_rebalance": empty_events}


def _points(partial):
    from pyspark.sql import functions as F

    # New points carry no status yet (status.add_status evaluates them).
    return partial.filter(F.col("_kind") == "q").select(
        *QUEUE_KEYS, "ws", *POINT_COLUMNS, F.lit(None).cast("string").alias("status"),
        *[F.lit(None).cast("long").alias(c) for c in CARRIED[1:]])


def _owners(partial):
    from pyspark.sql import functions as F

    return partial.filter(F.col("_kind") == "o").select(
        *QUEUE_KEYS, "owner", "ws", "samples", "owned_from_ms", "owned_to_ms", "last_lag", "sum_lag", "max_lag",
        "min_committed", "max_committed", "max_time_lag_ms")


def _merge_owners(rows):
    from pyspark.sql import functions as F

    return rows.groupBy(*QUEUE_KEYS, "owner", "ws").agg(
        F.sum("samples").alias("samples"), F.min("owned_from_ms").alias("owned_from_ms"),
        F.max("owned_to_ms").alias("owned_to_ms"), F.max_by("last_lag", "owned_to_ms").alias("last_lag"),
        F.sum("sum_lag").alias("sum_lag"), F.max("max_lag").alias("max_lag"),
        F.min("min_committed").alias("min_committed"), F.max("max_committed").alias("max_committed"),
        F.max("max_time_lag_ms").alias("max_time_lag_ms"))


def _since(col: str, ms: int):
    from pyspark.sql import functions as F

    return F.col(col) >= F.timestamp_millis(F.lit(ms))


def _one(df):
    """``df`` in one partition, without a shuffle: a pass's rows are few, and on one
    partition every grouping, window and join after it needs no exchange - the pass runs as
    one or two stages instead of ~25 (each stage's task serialising and scheduling cost
    more than its rows)."""
    return df.coalesce(1)


def fold_plan(spark, job: LagJob, new: dict, state: dict | None, p: JobParams,
              outputs: frozenset = frozenset(EVENT_TABLE_TYPES)) -> dict:
    """name -> DataFrame: every row the state and the new recordings (kind -> DataFrame)
    make, for each table and for the next state; ``emitted`` keeps those a pass writes. Nothing
    of one pass (its times) is in the plan, so one plan serves every pass. Of the event
    tables, only ``outputs`` (EVENT_TABLE_TYPES' names); with none, only what the snapshots make
    (no event input, no "events" state)."""
    from pyspark.sql import functions as F

    state = {name: _one(frame) for name, frame in (state or _empty_state(spark, job)).items()}
    snapshots = _one(new[SNAPSHOTS])
    partial = aggregate_samples(snapshots, shuffle=False)
    # A point a new row merges into is evaluated again: its carried status goes (null).
    unchanged = F.count("status") == F.count(F.lit(1))
    points = merge_windows(_one(state["points"].unionByName(_points(partial))), TEN_S,
                            *[F.when(unchanged, F.max(c)).alias(c) for c in CARRIED])
    owners = _merge_owners(_one(state["owners"].unionByName(_owners(partial))))
    per_ts = (_one(state["per_ts"].unionByName(per_ts_rows(partial)))
              .groupBy("group", "ts").agg(F.sum("lag").alias("lag"), F.sum("queues").alias("queues")))
    points = queue_points(points.withColumn("_kind", F.lit("q")), p, carried=True)
    frames = {"points": points.select(*QUEUE_KEYS, "ws", *POINT_COLUMNS, *CARRIED), "owners": owners, "per_ts": per_ts}
    if outputs:
        events = _one(table_events(new[EVENTS]))
        every_event = _one(state["events"].unionByName(events))
        frames["events"] = every_event
        if "rebalances" in outputs:
            frames["rebalances"] = compute_rebalances(state["last_rebalance"].unionByName(every_event))
        if "flow_control" in outputs:
            frames["flow_control"] = compute_flow_control(every_event)
        if "marks" in outputs:
            frames["marks"] = compute_marks(every_event, with_event_ts=True)
    return frames


# A pass's stages: its queries, in order, each one Spark job. A fold stage takes some of
# fold_plan's frames (``plan`` None: those of ``names`` the variant has); a later stage is
# ``plan`` over rows of the stages before it (``names``: what it reads). Spark runs a subtree
# once per use within a query (with no exchange, nothing shares it): as one query, the
# points' merge and status ran once for the state and again for each output made of them.
# As stages, once each (their rows go over as Parquet files, or in-memory relations over
# Spark Connect); the stages' own leaves are cheap to run twice. Each stage's table rows are
# upserted as soon as it has made them, so the order is what lands first: the queue and
# group windows - what the history's freshness is read from - then the owners and event
# tables, then the owner windows. (The 10-s windows apart from the minutes, in stages of
# their own, landed ~6 % sooner for ~15 % more CPU a pass: not worth it.)
def _queue_windows_stage(rows: dict) -> dict:
    return {"queue_windows": compute_queue_windows(_one(rows["points"]))}


def _groups_stage(rows: dict) -> dict:
    return {"group_windows": group_windows_from(_one(rows["per_ts"]), _one(rows["queue_windows"]), one_partition=True)}


def _owner_windows_stage(rows: dict) -> dict:
    from pyspark.sql import functions as F

    return {"owner_windows": compute_owner_windows(_one(rows["owners"]).withColumn("_kind", F.lit("o")))}


PASS_STAGES = (
    (None, ("points", "per_ts")),
    (_queue_windows_stage, ("points",)),
    (_groups_stage, ("per_ts", "queue_windows")),
    (None, ("owners", "events", "rebalances", "flow_control", "marks")),
    (_owner_windows_stage, ("owners",)),
)
# A numpy fold makes the snapshot tables itself (snapshot_tables_of): Spark makes the event tables.
FOLD_STAGES = {"spark": PASS_STAGES, "numpy": ((None, ("events", "rebalances", "flow_control", "marks")),)}
_SAMPLES_SCHEMA = pa.schema([SCHEMAS[SNAPSHOTS].field(name) for name in SNAPSHOT_COLUMNS])


def snapshot_tables_of(samples: pa.Table, low: int, p: JobParams) -> dict[str, pa.Table]:
    """A numpy fold's queue, group and owner windows that rows from ``low`` on can change
    (a superset: ``emitted`` keeps those), made by the batch's functions from the samples."""
    return tables_of(samples, (_floor(low - 2 * MINUTE, MINUTE), NEVER), p.status_window_ms, p.stop_after_ms)


def _samples_from(samples: pa.Table, keep_from: int) -> pa.Table:
    """The samples a numpy fold keeps: whole minutes from SAMPLES_BEFORE_MS before ``keep_from``."""
    return samples.filter(_at_least(samples, "ts", _floor(keep_from - SAMPLES_BEFORE_MS, MINUTE)))


def stage_frames(stage, frames: dict, read) -> dict:
    """name -> DataFrame of one of PASS_STAGES: fold_plan's ``frames`` it takes, or its plan
    over ``read(name)`` (a DataFrame of an earlier stage's rows)."""
    plan_stage, names = stage
    if plan_stage is None:
        return {name: frames[name] for name in names if name in frames}
    return plan_stage({name: read(name) for name in names})


def _stage_schemas(frames: dict) -> dict:
    """The schemas of fold_plan's rows the later stages read."""
    return {name: frames[name].schema for name in ("points", "owners", "per_ts")}


def run_stages(spark, frames: dict, land=None, stages=PASS_STAGES) -> dict:
    """Every stage's rows, each stage planned over in-memory relations of the rows before
    it; ``land(made)`` with each stage's own as soon as it has made them."""
    rows, schemas = {}, _stage_schemas(frames)
    for stage in stages:
        frames_of_stage = stage_frames(stage, frames, lambda name: _frame(spark, rows[name], schemas[name]))
        schemas.update({name: frame.schema for name, frame in frames_of_stage.items()})
        made = FoldQuery(frames_of_stage).run()
        if land is not None:
            land(made)
        rows.update(made)
    return rows


def _state_schemas(frames: dict) -> dict:
    """The state tables' Spark schemas, from fold_plan's frames."""
    schemas = {name: frames[name].schema for name in ("points", "owners", "per_ts", "events")}
    schemas["last_rebalance"] = schemas["events"]
    return schemas


def _empty_events() -> pa.Table:
    return SCHEMAS[EVENTS].empty_table()


def _at_least(table: pa.Table, column: str, ms: int):
    """``column >= ms`` (a timestamp or an ms count) as a mask."""
    col = table[column]
    bound = pa.scalar(ms, pa.timestamp("ms", tz="UTC")).cast(col.type) if pa.types.is_timestamp(col.type) \
        else pa.scalar(ms, col.type)
    return pc.greater_equal(col, bound)


def rebalances_before(events: pa.Table, known: pa.Table | None, cut: int) -> pa.Table:
    """Per client, its last rebalance event before ``cut``, of ``events`` and the ``known``
    last ones (a state's ``last_rebalance``): what a rebalance from the cut on may start
    from (compute_rebalances pairs an end with its client's previous event). A pass's query
    gets them at its events cut; next_state keeps them at the state's horizon."""
    before = events.filter(pc.and_(pc.equal(events["type"], "rebalance"), pc.invert(_at_least(events, "ts", cut))))
    if known is not None:
        before = pa.concat_tables([known.select(before.column_names).cast(before.schema), before])
    return _latest_per_client(before)


def emitted(rows: dict[str, pa.Table], lows: dict, tables) -> dict:
    """Of ``tables``, the rows a pass writes: those its new recordings change (only for the
    kinds with a low in ``lows``)."""
    out = {}
    for table in tables:
        lo = lows.get(SNAPSHOTS if table in SNAPSHOT_TABLES else EVENTS)
        if lo is not None:
            t = rows[table]
            out[table] = t.filter(_changed_by(table, t, lo))
    return {table: t.drop_columns(["_event_ts"]) if table == "marks" else t for table, t in out.items()}


SNAPSHOT_TABLES = ("queue_windows", "group_windows", "owner_windows")


def _changed_by(table: str, t: pa.Table, lo: int):
    """The mask of ``table``'s rows that new recordings from ``lo`` on change."""
    if table in ("queue_windows", "group_windows"):
        # the new 10-s windows and the three before them (time lag interpolates towards the
        # next window's first sample); the minutes from two before (a status looks back)
        ten_from = lo - lo % TEN_S - 3 * TEN_S
        minute_from = _floor(lo - 2 * MINUTE, MINUTE)
        return pc.or_(pc.and_(pc.equal(t["res"], "10s"), _at_least(t, "window_start", ten_from)),
                      pc.and_(pc.equal(t["res"], "1m"), _at_least(t, "window_start", minute_from)))
    if table in ("owner_windows", "flow_control"):
        return _at_least(t, "window_start", _floor(lo, MINUTE))
    if table == "rebalances":
        return _at_least(t, "end", lo)
    return _at_least(t, "_event_ts", lo)   # marks


def next_state(rows: dict[str, pa.Table], keep_from: int, last_rebalance: pa.Table | None,
               cuts: Cuts, old_state: dict | None = None) -> dict:
    """The state after a pass: each state table's rows from ``keep_from`` - the old state's
    rows before each cut, which the query did not read, and the query's."""
    out = {}
    whole = {}   # each cut table: the old state's rows before its cut (unread) and the query's
    for name, column in CUT_COLUMNS.items():
        if name not in rows:   # a numpy fold keeps samples instead (FOLD_STATE_TABLES)
            continue
        fresh = rows[name]
        if old_state is not None:
            unread = old_state[name].filter(pc.invert(_at_least(old_state[name], column, cuts.of_table(name))))
            fresh = pa.concat_tables([unread.select(fresh.column_names).cast(fresh.schema), fresh])
        whole[name] = fresh
        since = keep_from - keep_from % MINUTE if name == "owners" else keep_from
        out[name] = fresh.filter(_at_least(fresh, column, since))
    # Each client's last rebalance event that leaves the state (its next one may start from it).
    out["last_rebalance"] = rebalances_before(whole["events"], last_rebalance, keep_from)
    return out


def _latest_per_client(events: pa.Table) -> pa.Table:
    """Per (group, client_id), the row with the largest ts."""
    ordered = events.sort_by([("ts", "ascending")])
    latest = {key: i for i, key in enumerate(zip(ordered["group"].to_pylist(), ordered["client_id"].to_pylist()))}
    return ordered.take(pa.array(sorted(latest.values()), pa.int64()))


class FoldQuery:
    """fold_plan's frames as one Spark job (one wide union, tagged by name); run() -> name
    -> Arrow table. Run again, the same plan reads the files its leaves are given then."""

    def __init__(self, frames: dict, key=None):
        from pyspark.sql import functions as F

        self.key = key
        self.columns = {name: frame.columns for name, frame in frames.items()}
        union = None
        for name, frame in frames.items():
            tagged = frame.withColumn("_out", F.lit(name))
            union = tagged if union is None else union.unionByName(tagged, allowMissingColumns=True)
        self.df = union

    def run(self) -> dict[str, pa.Table]:
        table = self.df.toArrow()
        return {name: table.filter(pc.equal(table["_out"], name)).select(columns)
                for name, columns in self.columns.items()}
