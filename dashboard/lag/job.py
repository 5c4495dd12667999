"""The Spark lag job: recordings (recorder.py) -> lag history Parquet under ``DATA_DIR/lag``.

``LagJob`` runs the computations (queue, group and owner windows: in a local session an hour
at a time in numpy, hour_tables.py, else snapshot_tables.py's Spark functions over the
snapshots reduced to partial rows as they are read, partials_source.py; event_tables.py:
rebalances, flow control, marks) over what its plan (plan.py) says, and
keeps the runs' bookkeeping: the lock, ``<out>/_state.json``, the swap of the rewritten
partitions, the retention. Tables: ``<out>/<table>/[res=10s|1m/]date=YYYY-MM-DD/hour=HH/
*.parquet`` (layout.py), one row per window.

Incremental: ``<out>/_state.json`` lists the recording files already processed. A run
takes the new files, recomputes the windows they touch (plan.py) from the recordings of
that range plus a look-back (status rules need the past), and rewrites the affected hour
partitions (kept rows + new rows, staged then swapped in atomically, swap.py).
``since``/``until``/``group`` make a *targeted* run instead: recompute that range for that
group from every file, state unchanged.

Retention: the lab deletes recordings by the hour (``LAB_RECORDINGS_HOURS``), even while
this job runs: names of deleted files leave the state at the next run, and a listed file
that goes before Spark reads it is skipped. At the end of every run (after the swap, under
the lock) hour partitions of every table that ended ``LAB_HISTORY_DAYS`` before the newest
window computed (the state's ``last_ts``) are deleted: measured from the data, not the
clock, so the history of a lab left idle stays until newer data replaces it.

The merge of old and new rows assumes ``DATA_DIR`` is a local (or identically mounted)
filesystem: the staged partitions are swapped in with renames.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from . import status as status_rules
from . import tail
from .event_tables import TABLE_EVENT_TYPES, compute_flow_control, compute_marks, compute_rebalances
from .layout import DAY, STATE_FILE, TABLE_HAS_RES, list_recordings, partition_roots
from .plan import Idle, RunPlan, plan_run
from .hour_tables import stage_hour_tables
from .partials_source import sample_partials
from .sample_partials import by_hour
from .snapshot_tables import (QUEUE_KEYS, compute_owner_windows, compute_queue_windows, group_windows_from,
                              per_ts_rows, queue_points)
from .spark import execution_mode, runs_project_code, spark_schema
from .swap import swap_in
from .table_columns import in_range
from consumers_app import atomic
from consumers_app.lab.recorder import EVENT_SCHEMA, EVENTS, SCHEMAS, SNAPSHOT_SCHEMA, SNAPSHOTS, prune_hours

Progress = Callable[[int, int, str], None]
SNAPSHOT_TABLES = ("owner_windows", "queue_windows", "group_windows")
SKIPPED_KEPT = 20   # unreadable recording files named in the state (the history page shows them)


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


class JobBusy(RuntimeError):
    """Another lag job holds the output directory."""


def default_paths():
    from django.conf import settings

    return settings.DATA_DIR / "recordings", settings.DATA_DIR / "lag"


def recording_problem(kind: str, column_names, num_rows: int) -> str | None:
    """Why a readable Parquet file is still not a recording of ``kind`` (None: it is one)."""
    if not set(SCHEMAS[kind].names) <= set(column_names):
        return f"ValueError: columns {list(column_names)} are not the recorder's"
    if num_rows == 0:
        return "ValueError: no rows"
    return None


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class JobParams:
    since_ms: int | None = None
    until_ms: int | None = None
    group: str | None = None
    status_window_ms: int = status_rules.DEFAULT_WINDOW_MS
    stop_after_ms: int = status_rules.DEFAULT_STOP_AFTER_MS
    history_days: float = 7.0

    @classmethod
    def from_settings(cls, **kwargs) -> "JobParams":
        """Status thresholds from settings LAG_STATUS_WINDOW_S / LAG_STOP_AFTER_S (whole 10 s),
        the history's retention from LAB_HISTORY_DAYS."""
        from django.conf import settings

        window = int(getattr(settings, "LAG_STATUS_WINDOW_S", cls.status_window_ms // 1000))
        stop = int(getattr(settings, "LAG_STOP_AFTER_S", cls.stop_after_ms // 1000))
        if window < 20 or window % 10 or stop < window or stop % 10:
            raise ValueError("LAG_STATUS_WINDOW_S must be a multiple of 10 >= 20 and LAG_STOP_AFTER_S "
                             "a multiple of 10 >= it")
        history_days = float(getattr(settings, "LAB_HISTORY_DAYS", cls.history_days))
        if history_days <= 0:
            raise ValueError("LAB_HISTORY_DAYS must be > 0")
        return cls(status_window_ms=window * 1000, stop_after_ms=stop * 1000, history_days=history_days, **kwargs)

    @property
    def targeted(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None or self.group is not None


@dataclass
class JobResult:
    state: str                          # "done" | "nothing-new" | "no-recordings"
    range_ms: tuple[int, int] | None = None
    new_files: int = 0
    files_read: int = 0
    rows_read: int = 0
    windows: dict = field(default_factory=dict)   # table -> rows (re)computed
    pruned_partitions: int = 0          # history hour partitions deleted by the retention
    seconds: float = 0.0
    windows_landed_ms: int | None = None   # a stream pass: when its queue and group windows were upserted

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        if d["windows_landed_ms"] is None:   # only a stream pass has it
            del d["windows_landed_ms"]
        if self.range_ms:
            d["range"] = [iso(self.range_ms[0]), iso(self.range_ms[1])]
        return d


class LagJob:
    STEPS = ["plan", "read recordings", "owner windows", "queue windows", "group windows",
             "rebalances", "flow control", "marks", "commit"]

    def __init__(self, recordings: Path | None = None, out: Path | None = None, spark=None,
                 master: str | None = None, progress: Progress | None = None):
        if recordings is None or out is None:
            default_recordings, default_out = default_paths()
            recordings, out = recordings or default_recordings, out or default_out
        # Absolute: over Spark Connect the server resolves a relative path against its own cwd.
        self.recordings, self.out = Path(recordings).absolute(), Path(out).absolute()
        self._spark, self.master = spark, master
        self._own_spark = spark is None
        self.progress = progress or (lambda done, total, label: None)
        self._step = 0

    # -- orchestration -------------------------------------------------------------

    def _advance(self, label: str) -> None:
        self._step += 1
        self.progress(self._step, len(self.STEPS), label)

    @contextlib.contextmanager
    def locked(self, lock_wait_s: float = 0.0):
        """Hold the output dir's lock (one writer: a batch run or a stream pass); JobBusy if
        another holds it after ``lock_wait_s``."""
        started = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / ".lock", "w") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - started >= lock_wait_s:
                        raise JobBusy(f"another lag job is running on {self.out}") from None
                    time.sleep(0.2)
            yield

    def run(self, params: JobParams | None = None, lock_wait_s: float = 0.0) -> JobResult:
        """One run under the output dir's lock; JobBusy if another run (the lag service's
        pass, the button's lagjob) still holds it after ``lock_wait_s``."""
        params = params or JobParams.from_settings()
        started = time.monotonic()
        with self.locked(lock_wait_s):
            result = self.run_locked(params)
        result.seconds = round(time.monotonic() - started, 3)
        return result

    def run_locked(self, params: JobParams) -> JobResult:
        """A run for a caller that holds the lock: the job, then the history's retention."""
        result = self._run_locked(params)
        newest = self.load_state().get("last_ts")
        if newest:
            result.pruned_partitions = len(self.prune_history(int(params.history_days * DAY), newest))
        return result

    def _run_locked(self, p: JobParams) -> JobResult:
        self._step = 0
        self.progress(0, len(self.STEPS), "plan")
        files = {kind: list_recordings(self.recordings, kind) for kind in (SNAPSHOTS, EVENTS)}
        state = self.load_state()
        if self._forget_deleted(state, files):
            self.save_state(state)
        bad = self._unreadable({kind: [rel for rel in listed if rel not in state["processed"][kind]]
                                for kind, listed in files.items()})
        if bad:
            self.set_aside(state, bad)
            for kind, rel, _ in bad:
                del files[kind][rel]
        plan = plan_run(files, state["processed"], p)
        if isinstance(plan, Idle):
            return JobResult(plan.state, range_ms=plan.range_ms)
        self._advance("plan")
        new, to_read, (lo, hi) = plan.new, plan.to_read, plan.range_ms
        result = JobResult("done", range_ms=(lo, hi), new_files=sum(len(v) for v in new.values()),
                           files_read=sum(len(v) for v in to_read.values()))
        result.rows_read = self._count_rows(to_read[SNAPSHOTS])
        with execution_mode(self.spark, result.rows_read):
            self._compute_tables(p, plan, to_read, result)
        if not p.targeted:
            for kind in files:
                state["processed"][kind].update(new[kind])
            state["last_ts"] = max(state.get("last_ts") or 0, hi)
            state["runs"] = state.get("runs", 0) + 1
            self.save_state(state)
        self._advance("commit")
        return result

    def _compute_tables(self, p: JobParams, plan: RunPlan, to_read: dict, result: JobResult) -> None:
        """Every table of the plan's range, from its recordings (the job's steps after the plan)."""
        spark = self.spark
        staging = self.out / "_staging" / f"hours-{uuid.uuid4().hex}"
        try:
            if runs_project_code(spark):
                # Made by the hour in Spark's Python workers and written there (hour_tables.py).
                made = stage_hour_tables(spark, plan.chunks, self.recordings, self.out, staging, p.group,
                                         p.status_window_ms, p.stop_after_ms)
                snapshot_tables = None
            else:
                snapshot_tables, persisted = self._spark_snapshot_tables(spark, p, plan, to_read)
            events = self._read_table_events(spark, to_read[EVENTS], *plan.read_ms, p.group)
            self._advance("read recordings")
            for name in SNAPSHOT_TABLES:
                if snapshot_tables is None:
                    self._swap_in(name, staging / name, plan)
                    result.windows[name] = made[name]
                else:
                    result.windows[name] = self._replace(name, snapshot_tables[name], plan, p.group,
                                                         cached=name == "queue_windows")
                self._advance(name.replace("_", " "))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if snapshot_tables is not None:
            for df in persisted:
                df.unpersist()
        windows = in_range(*plan.range_ms)
        rebalances = compute_rebalances(events)
        result.windows["rebalances"] = self._replace("rebalances", rebalances.filter(windows), plan, p.group)
        self._advance("rebalances")
        flow = compute_flow_control(events)
        result.windows["flow_control"] = self._replace("flow_control", flow.filter(windows), plan, p.group)
        self._advance("flow control")
        marks = compute_marks(events)
        result.windows["marks"] = self._replace("marks", marks.filter(windows), plan, p.group)
        self._advance("marks")
        try:
            (self.out / "_staging").rmdir()  # empty once every table is swapped in
        except OSError:
            pass

    def _spark_snapshot_tables(self, spark, p: JobParams, plan: RunPlan, to_read: dict) -> tuple[dict, list]:
        """The queue, owner and group windows of the plan's range by snapshot_tables' Spark
        functions, from the partials (partials_source.py) shuffled by queue - where Spark's
        Python workers may not import this project. Returns them and what to unpersist."""
        windows = in_range(*plan.range_ms)
        hours = by_hour(to_read[SNAPSHOTS], self.recordings)
        samples = sample_partials(spark, hours, *plan.read_ms, p.group).repartition(*QUEUE_KEYS).persist()
        # Cached: the written windows are counted and summed up into the group windows.
        queue_windows = compute_queue_windows(queue_points(samples, p)).filter(windows).persist()
        tables = {"owner_windows": compute_owner_windows(samples).filter(windows), "queue_windows": queue_windows,
                  "group_windows": group_windows_from(per_ts_rows(samples), queue_windows).filter(windows)}
        return tables, [queue_windows, samples]

    @staticmethod
    def _forget_deleted(state: dict, files: dict) -> bool:
        """Drop processed names whose recordings are gone (retention); True if there were any."""
        kept = {kind: names & files[kind].keys() for kind, names in state["processed"].items()}
        forgot = kept != state["processed"]
        state["processed"] = kept
        return forgot

    def _unreadable(self, rels: dict) -> list[tuple[str, str, str]]:
        """The (kind, rel, reason) of each of these recording files whose footer cannot be
        read (half-written, corrupt) or that is not a recording (recording_problem)."""
        import pyarrow.parquet as pq

        bad = []
        for kind, names in rels.items():
            for rel in names:
                try:
                    meta = pq.read_metadata(self.recordings / rel)
                    why = recording_problem(kind, meta.schema.names, meta.num_rows)
                except FileNotFoundError:
                    continue   # deleted by the retention since listed
                except Exception as exc:  # noqa: BLE001 - a bad file is skipped, whatever is wrong with it
                    why = describe(exc)
                if why:
                    bad.append((kind, rel, why))
        return bad

    def set_aside(self, state: dict, bad: list[tuple[str, str, str]]) -> None:
        """Unreadable recording files (kind, rel, reason) renamed out of every listing
        (``.unreadable-<name>``, kept for a look) and named in the state's ``skipped``,
        which the history page's status line shows (a reason names the file by its name:
        the entry's ``file`` says where it is); the state is saved."""
        skipped = []
        for _, rel, why in bad:
            path = self.recordings / rel
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, path.with_name(f".unreadable-{path.name}"))
            skipped.append({"file": rel, "reason": why.replace(str(path), path.name)})
        state["skipped"] = (state.get("skipped", []) + skipped)[-SKIPPED_KEPT:]
        self.save_state(state)

    def prune_history(self, older_than_ms: int, newest_ms: int) -> list[Path]:
        """Delete every table's hour partitions that ended more than ``older_than_ms`` before
        ``newest_ms``; returns the deleted dirs."""
        return [d for table, has_res in TABLE_HAS_RES.items()
                for base in (self.out / table, tail.tail_of(self.out, table))
                for root in partition_roots(base, has_res)
                for d in prune_hours(root, older_than_ms, newest_ms)]

    # -- io ---------------------------------------------------------------------------

    @property
    def spark(self):
        if self._spark is None:
            from .spark import get_spark

            self._spark = get_spark(self.master)
        return self._spark

    def close(self) -> None:
        """End a Spark Connect session this job opened: the server would keep it (and what
        it holds) until its idle timeout. A classic session ends with this process."""
        from .spark import is_connect

        if self._own_spark and self._spark is not None and is_connect(self._spark):
            self._spark.stop()
            self._spark = None

    def load_state(self) -> dict:
        try:
            state = json.loads((self.out / STATE_FILE).read_text())
            state["processed"] = {kind: set(state["processed"].get(kind, ())) for kind in (SNAPSHOTS, EVENTS)}
            return state
        except (FileNotFoundError, ValueError, KeyError):
            return {"processed": {SNAPSHOTS: set(), EVENTS: set()}, "last_ts": None, "runs": 0}

    def save_state(self, state: dict) -> None:
        data = {**state, "processed": {k: sorted(v) for k, v in state["processed"].items()}}
        # Atomic (the checkpoint: a pass killed mid-write leaves the previous one), not
        # fsynced: rewritten every pass, and a lost one is only a pass done again.
        atomic.write_json(self.out / STATE_FILE, data, durable=False)

    def _count_rows(self, rels: list[str]) -> int:
        import pyarrow.parquet as pq

        rows = 0
        for rel in rels:
            try:
                rows += pq.read_metadata(self.recordings / rel).num_rows
            except FileNotFoundError:
                pass   # deleted since listed (retention); _read skips it too
        return rows

    def _read(self, spark, kind: str, rels: list[str], lo: int, hi: int, group: str | None):
        from pyspark.sql import functions as F

        schema = spark_schema(SNAPSHOT_SCHEMA if kind == SNAPSHOTS else EVENT_SCHEMA)
        # Retention may delete a listed file at any time: one gone already is left out (Spark
        # fails on a missing path), one that goes before its scan is skipped by Spark.
        paths = [str(path) for path in (self.recordings / rel for rel in rels) if path.exists()]
        if paths:
            df = spark.read.schema(schema).option("ignoreMissingFiles", "true").parquet(*paths)
        else:
            df = spark.createDataFrame([], schema)
        df = df.filter((F.col("ts") >= lo) & (F.col("ts") < hi))
        if group is not None:
            df = df.filter(F.col("group") == group)
        return df

    def _read_table_events(self, spark, rels: list[str], lo: int, hi: int, group: str | None):
        """The events the tables are made of (event_tables.TABLE_EVENT_TYPES) in [lo, hi), read
        here with pyarrow and handed to Spark as one in-memory relation. They are few, but spread
        over one small file per 10-s slice: as a Spark scan, a 10M-row backfill's 652 event files
        took ~4 s of tasks for its 4.5k such events; read here, 0.3 s (bench/lag_job.py)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        wanted = pa.array(TABLE_EVENT_TYPES)
        kept = []
        for rel in rels:
            try:
                table = pq.ParquetFile(self.recordings / rel).read(columns=EVENT_SCHEMA.names)
            except FileNotFoundError:
                continue   # deleted by the retention since listed
            ts = table["ts"]
            keep = pc.and_(pc.is_in(table["type"], wanted), pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))
            if group is not None:
                keep = pc.and_(keep, pc.equal(table["group"], group))
            kept.append(table.filter(keep).select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA))
        events = pa.concat_tables(kept) if kept else EVENT_SCHEMA.empty_table()
        return spark.createDataFrame(events, schema=spark_schema(EVENT_SCHEMA))

    def _swap_in(self, table: str, staging: Path, plan: RunPlan) -> None:
        """Every partition of ``table`` the plan rewrites becomes exactly what is staged for it
        (or disappears), in one step for readers (swap.py); then the tail stops hiding them."""
        rels = set(plan.partitions(table))
        swap_in(self.out / table, staging, rels)
        tail.drop(self.out, table, rels)

    def _replace(self, table: str, new_rows, plan: RunPlan, group: str | None, cached: bool = False) -> int:
        """Rewrite the plan's hour partitions of ``table``: kept old rows + ``new_rows``
        (the windows of the plan's range), staged then swapped."""
        from pyspark.sql import functions as F

        part_cols = (["res"] if TABLE_HAS_RES[table] else []) + ["date", "hour"]
        target = self.out / table
        rels = set(plan.partitions(table))
        if not cached:
            new_rows = new_rows.persist()  # written and counted: computed once
        merged = new_rows.select(*sorted(new_rows.columns))
        # What the partitions hold now, as readers see them: the stream's tail hides the
        # table's partition of the same hour (tail.py).
        old = None
        for base in (tail.tail_of(self.out, table), target):
            current = [base / rel for rel in rels if (base / rel).is_dir() and any((base / rel).glob("*.parquet"))
                       and not (base == target and (tail.tail_of(self.out, table) / rel).is_dir())]
            if current:
                part = self.spark.read.option("basePath", str(base)).parquet(*map(str, current))
                old = part if old is None else old.unionByName(part)
        if old is not None:
            recomputed = in_range(*plan.range_ms)
            if group is not None:
                recomputed = recomputed & (F.col("group") == group)
            kept = old.filter(~recomputed)
            merged = merged.unionByName(kept.select(*merged.columns))
        staging = self.out / "_staging" / f"{table}-{uuid.uuid4().hex}"
        # One file per partition (an hour holds ~100k windows for 256 queues at 10 s).
        merged.repartition(*part_cols).write.mode("overwrite").partitionBy(*part_cols).parquet(str(staging))
        self._swap_in(table, staging, plan)
        shutil.rmtree(staging, ignore_errors=True)
        count = new_rows.count()
        if not cached:
            new_rows.unpersist()
        return count
