"""The Spark lag job: recordings (recorder.py) -> lag history Parquet under ``DATA_DIR/lag``.

Tables (each ``<out>/<table>/[res=10s|1m/]date=YYYY-MM-DD/hour=HH/*.parquet``, one row per
window; ``window_start``/``window_end`` are UTC timestamps, the window is [start, end)):

* ``queue_windows`` (res 10s, 1m) - per group/topic/broker/queue: ``broker_offset`` (max
  offset), ``consumer_offset`` and ``lag`` of the last sample, ``max_lag``, ``avg_lag``,
  ``p95_lag`` over the window's samples, ``time_lag_ms`` at the window end and
  ``max_time_lag_ms``, ``owner`` of the last sample, ``status`` (status.py).
* ``group_windows`` (res 10s, 1m) - per group: the group's lag is the sum of its queues'
  lags at each sample ts; last/max/avg/p95 of it; ``time_lag_ms`` = the worst queue's;
  ``status`` = the worst queue's.
* ``owner_windows`` (1m) - lag attributed to each owner over the samples in which it
  owned each queue: samples, owned_from/owned_to, last/avg/max lag, messages consumed.
* ``rebalances`` - one row per finished rebalance (``rebalance`` event with phase "end"):
  start, end, duration_ms (the event's ``duration_ms``, else the time since the client's
  last "start"), changed queues (JSON), reason.
* ``flow_control`` (res 10s, 1m) - per consumer and reason: count of ``flow_control``
  events and the largest ``value`` reported.
* ``marks`` - what the history charts mark: every ``fault`` event (kind "fault", name =
  the fault: kill, hang, strategy, ...) and every hand-off (kind "handoff", name = the
  queue, at the time the new owner took it; the latest of its ``handoff`` events: gap,
  overlap, duplicates). ``detail`` is the event's fields as JSON.

Definitions: ``lag = broker_max_offset - consumer_offset``; when the group has no commit
on the queue (``consumer_offset < 0``) it is ``broker_max_offset - broker_min_offset``;
never below 0. Time lag of a sample = ``ts - oldest_unconsumed_store_ts`` when there is
lag and a store time; 0 with no lag or nothing unconsumed (store time 0); unknown (null)
when the store time is not known (-1: an attached cluster's probe has not answered). At a
window end it is interpolated linearly between the window's last sample and the next
sample (not across a gap > 2 windows, nor towards an unknown one).
p95 is exact: the smallest sample v with at least 95 % of the window's samples <= v (a
sorted array per window - at most a minute of samples; percentile_approx is no cheaper,
being an object aggregate too, and the minute's p95 needs the raw values anyway).

Incremental: ``<out>/_state.json`` lists the recording files already processed. A run
takes the new files, derives from their minutes (file names) the range of windows they
touch - from one minute before the first to the status window after the last - reads
the recordings of that range plus a look-back (status rules need the past), recomputes
those windows only, and rewrites the affected hour partitions (kept rows + new rows,
staged then swapped in atomically, swap.py). ``since``/``until``/``group`` make a *targeted* run instead:
recompute that range for that group from every file, state unchanged.

Retention: the lab deletes recordings by the hour (``LAB_RECORDINGS_HOURS``), even while
this job runs: names of deleted files leave the state at the next run, and a listed file
that goes before Spark reads it is skipped. At the end of every run (after the swap, under
the lock) hour partitions of every table that ended ``LAB_HISTORY_DAYS`` before the newest
window computed (the state's ``last_ts``) are deleted: measured from the data, not the
clock, so the history of a lab left idle stays until newer data replaces it.

Cost: the samples are scanned and shuffled by queue once (no partial aggregation: the
lag arrays are cheaper to build in one final aggregation), then aggregated per queue and
10 s (max_by per column, the lags as an array) and, off the same reused shuffle, per
queue/owner/minute; the later steps group and window per queue (the status rules with
O(1)-per-point window functions, status.py). The 1-minute queue windows are merged up
from the 10-s rows (last of last, max of max, sums, the arrays concatenated for p95).
One more (narrow) pass for the group's per-ts sums. No Python UDFs. The merge of old
and new rows assumes ``DATA_DIR`` is a local (or identically mounted) filesystem: the
staged partitions are swapped in with renames.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from . import status as status_rules
from . import tail
from .swap import swap_in
from consumers_app import atomic
from consumers_app.lab.recorder import EVENT_SCHEMA, EVENTS, SNAPSHOT_SCHEMA, SNAPSHOTS, prune_hours

MINUTE = 60_000
HOUR = 3_600_000
DAY = 24 * HOUR
RESOLUTIONS = {"10s": 10_000, "1m": 60_000}
QUEUE_KEYS = ["group", "topic", "broker", "queue_id"]
# A queue's 10-s point besides its keys and ``ws`` (aggregate_samples' "q" rows).
POINT_COLUMNS = ["last", "first", "max_lag", "sum_lag", "samples", "lags", "max_time_lag_ms"]
# table -> has a res partition level
TABLE_HAS_RES = {"queue_windows": True, "group_windows": True, "owner_windows": False,
                 "rebalances": False, "flow_control": True, "marks": False}
STATE_FILE = "_state.json"
_PART = re.compile(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})/part-(\d{2})-[^/]+\.parquet$")

Progress = Callable[[int, int, str], None]


class JobBusy(RuntimeError):
    """Another lag job holds the output directory."""


def default_paths():
    from django.conf import settings

    return settings.DATA_DIR / "recordings", settings.DATA_DIR / "lag"


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def list_recordings(recordings: Path, kind: str, cache: dict | None = None) -> dict[str, int]:
    """rel path -> minute ts (ms) of every finished part file of ``kind``.

    ``cache`` (a dict the caller keeps between calls, as the lag stream does) holds each
    hour directory's listing with its modification time: an hour nobody wrote to since is
    not listed again, so a pass lists the current hour, not the day of recordings retention
    keeps (17k files per kind). A directory changed in the last seconds is always listed
    (a file created within the mtime's granularity)."""
    base = Path(recordings) / kind
    found: dict[str, int] = {}
    if not base.is_dir():
        return found
    fresh = time.time_ns() - 2_000_000_000
    seen = set()
    for day_dir in _subdirs(base, "date="):
        for hour_dir in _subdirs(day_dir, "hour="):
            try:
                mtime = hour_dir.stat().st_mtime_ns
            except FileNotFoundError:
                continue   # pruned meanwhile
            key = str(hour_dir)
            seen.add(key)
            hit = cache.get(key) if cache is not None else None
            if hit is not None and hit[0] == mtime:
                found.update(hit[1])
                continue
            listed = {}
            for path in hour_dir.glob("part-*.parquet"):
                rel = path.relative_to(recordings).as_posix()
                m = _PART.search(rel)
                if m:
                    day, hour, minute = m.groups()
                    start = datetime.strptime(f"{day} {hour}:{minute}", "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)
                    listed[rel] = int(start.timestamp() * 1000)
            if cache is not None and mtime < fresh:
                cache[key] = (mtime, listed)
            found.update(listed)
    if cache is not None:
        for key in [k for k in cache if k.startswith(str(base) + os.sep) and k not in seen]:
            del cache[key]   # pruned by the retention
    return found


def _subdirs(path: Path, prefix: str) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.name.startswith(prefix) and e.is_dir()]
    except FileNotFoundError:
        return []


def hours_between(lo: int, hi: int) -> list[tuple[str, str]]:
    """(date, hour) partition values of every hour overlapping [lo, hi)."""
    out, t = [], lo - lo % HOUR
    while t < hi:
        d = datetime.fromtimestamp(t / 1000, tz=timezone.utc)
        out.append((f"{d:%Y-%m-%d}", f"{d:%H}"))
        t += HOUR
    return out


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

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        if self.range_ms:
            d["range"] = [iso(self.range_ms[0]), iso(self.range_ms[1])]
        return d


@dataclass
class RunPlan:
    """What a batch run recomputes and reads (plan_run)."""
    new: dict          # kind -> {rel: minute} of the files not processed yet (none when targeted)
    range_ms: tuple    # [lo, hi): the windows recomputed, whole minutes
    read_ms: tuple     # [lo, hi) of the samples read: the range, the status look-back before it
    to_read: dict      # kind -> sorted rels of the files that hold samples of read_ms


def plan_run(files: dict, processed: dict, p: JobParams) -> RunPlan | JobResult:
    """A batch run's plan, from the recording files (kind -> {rel: minute}), those already
    processed (kind -> rels) and the parameters; or the JobResult of a run with nothing to
    do. Pure: no Spark, no disk."""
    if not files[SNAPSHOTS] and not files[EVENTS]:
        return JobResult("no-recordings")
    every_minute = [m for kind in files for m in files[kind].values()]
    if p.targeted:
        new = {kind: {} for kind in files}
        lo = p.since_ms - p.since_ms % MINUTE if p.since_ms is not None else min(every_minute)
        hi = p.until_ms if p.until_ms is not None else max(every_minute) + MINUTE
        hi = -(-hi // MINUTE) * MINUTE
    else:
        new = {kind: {rel: m for rel, m in files[kind].items() if rel not in processed[kind]} for kind in files}
        new_minutes = [m for kind in new for m in new[kind].values()]
        if not new_minutes:
            return JobResult("nothing-new")
        # One minute before: its time lag interpolates towards the new samples. The status
        # window after: statuses there look back at the new data.
        lo = min(new_minutes) - MINUTE
        hi = max(new_minutes) + MINUTE + -(-p.status_window_ms // MINUTE) * MINUTE
    if hi <= lo:
        return JobResult("nothing-new", range_ms=(lo, hi))
    lookback = max(p.status_window_ms, p.stop_after_ms) + MINUTE
    read_lo, read_hi = lo - lookback, hi + MINUTE
    to_read = {kind: sorted(rel for rel, m in files[kind].items() if m + MINUTE > read_lo and m < read_hi)
               for kind in files}
    return RunPlan(new=new, range_ms=(lo, hi), read_ms=(read_lo, read_hi), to_read=to_read)


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
        plan = plan_run(files, state["processed"], p)
        if isinstance(plan, JobResult):
            return plan
        self._advance("plan")
        new, to_read, (lo, hi), (read_lo, read_hi) = plan.new, plan.to_read, plan.range_ms, plan.read_ms
        result = JobResult("done", range_ms=(lo, hi), new_files=sum(len(v) for v in new.values()),
                           files_read=sum(len(v) for v in to_read.values()))
        result.rows_read = self._count_rows(to_read[SNAPSHOTS])
        spark = self.spark
        snapshots = self._read(spark, SNAPSHOTS, to_read[SNAPSHOTS], read_lo, read_hi, p.group)
        events = self._read(spark, EVENTS, to_read[EVENTS], read_lo, read_hi, p.group)
        self._advance("read recordings")

        in_range = _range_filter(lo, hi)
        samples = aggregate_samples(snapshots).persist()
        owner_windows = compute_owner_windows(samples)
        result.windows["owner_windows"] = self._replace("owner_windows", owner_windows.filter(in_range), lo, hi, p.group)
        self._advance("owner windows")
        # Cached: both resolutions come from the 10-s points; the written windows are
        # counted and summed up into the group windows.
        points = queue_points(samples, p).persist()
        queue_windows = compute_queue_windows(points).filter(in_range).persist()
        result.windows["queue_windows"] = self._replace("queue_windows", queue_windows, lo, hi, p.group, cached=True)
        points.unpersist()
        samples.unpersist()
        self._advance("queue windows")
        group_windows = compute_group_windows(snapshots, queue_windows)
        result.windows["group_windows"] = self._replace("group_windows", group_windows.filter(in_range), lo, hi, p.group)
        self._advance("group windows")
        rebalances = compute_rebalances(events)
        result.windows["rebalances"] = self._replace("rebalances", rebalances.filter(in_range), lo, hi, p.group)
        self._advance("rebalances")
        flow = compute_flow_control(events)
        result.windows["flow_control"] = self._replace("flow_control", flow.filter(in_range), lo, hi, p.group)
        self._advance("flow control")
        marks = compute_marks(events)
        result.windows["marks"] = self._replace("marks", marks.filter(in_range), lo, hi, p.group)
        self._advance("marks")
        queue_windows.unpersist()
        try:
            (self.out / "_staging").rmdir()  # empty once every table is swapped in
        except OSError:
            pass

        if not p.targeted:
            for kind in files:
                state["processed"][kind].update(new[kind])
            state["last_ts"] = max(state.get("last_ts") or 0, hi)
            state["runs"] = state.get("runs", 0) + 1
            self.save_state(state)
        self._advance("commit")
        return result

    @staticmethod
    def _forget_deleted(state: dict, files: dict) -> bool:
        """Drop processed names whose recordings are gone (retention); True if there were any."""
        kept = {kind: names & files[kind].keys() for kind, names in state["processed"].items()}
        forgot = kept != state["processed"]
        state["processed"] = kept
        return forgot

    def prune_history(self, older_than_ms: int, newest_ms: int) -> list[Path]:
        """Delete every table's hour partitions that ended more than ``older_than_ms`` before
        ``newest_ms``; returns the deleted dirs."""
        return [d for table, has_res in TABLE_HAS_RES.items()
                for base in (self.out / table, tail.tail_of(self.out, table))
                for root in self._partition_roots(base, has_res)
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

        schema = _spark_schema(SNAPSHOT_SCHEMA if kind == SNAPSHOTS else EVENT_SCHEMA)
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

    def _replace(self, table: str, new_rows, lo: int, hi: int, group: str | None, cached: bool = False) -> int:
        """Rewrite the hour partitions of [lo, hi): kept old rows + ``new_rows``, staged then swapped."""
        from pyspark.sql import functions as F

        has_res = TABLE_HAS_RES[table]
        part_cols = (["res"] if has_res else []) + ["date", "hour"]
        hours = hours_between(lo, hi)
        target = self.out / table
        rels = {d.relative_to(target) for d in self._partition_dirs(target, has_res, hours)}
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
            recomputed = _range_filter(lo, hi)
            if group is not None:
                recomputed = recomputed & (F.col("group") == group)
            kept = old.filter(~recomputed)
            merged = merged.unionByName(kept.select(*merged.columns))
        staging = self.out / "_staging" / f"{table}-{uuid.uuid4().hex}"
        # One file per partition (an hour holds ~100k windows for 256 queues at 10 s).
        merged.repartition(*part_cols).write.mode("overwrite").partitionBy(*part_cols).parquet(str(staging))
        # Every affected partition becomes exactly what was staged (or disappears), in one
        # step for readers (swap.py); then the tail stops hiding them.
        swap_in(target, staging, rels)
        tail.drop(self.out, table, rels)
        shutil.rmtree(staging, ignore_errors=True)
        count = new_rows.count()
        if not cached:
            new_rows.unpersist()
        return count

    @staticmethod
    def _partition_roots(base: Path, has_res: bool) -> list[Path]:
        """Where a table's ``date=/hour=`` partitions are: under each ``res=``, or the table."""
        return [base / f"res={r}" for r in RESOLUTIONS] if has_res else [base]

    @classmethod
    def _partition_dirs(cls, base: Path, has_res: bool, hours) -> list[Path]:
        return [root / f"date={d}" / f"hour={h}" for root in cls._partition_roots(base, has_res) for d, h in hours]


# -- the computations (pure DataFrame functions: easy to test, no Python UDFs) ----------

def _spark_schema(arrow_schema):
    from pyspark.sql import types as T

    kinds = {"int64": T.LongType(), "int32": T.IntegerType(), "string": T.StringType()}
    return T.StructType([T.StructField(f.name, kinds[str(f.type)], True) for f in arrow_schema])


def _range_filter(lo: int, hi: int):
    from pyspark.sql import functions as F

    col = F.col("window_start")
    return (col >= F.timestamp_millis(F.lit(lo))) & (col < F.timestamp_millis(F.lit(hi)))


def _with_partitions(df, start_ms_col: str = "ws", res_ms: int | None = None, res: str | None = None):
    """ms columns -> window_start/window_end timestamps + date/hour(/res) partition columns."""
    from pyspark.sql import functions as F

    start = F.timestamp_millis(F.col(start_ms_col))
    columns = {"window_start": start}
    if res_ms is not None:
        columns["window_end"] = F.timestamp_millis(F.col(start_ms_col) + F.lit(res_ms))
    columns.update(date=F.date_format(start, "yyyy-MM-dd"), hour=F.date_format(start, "HH"))
    if res is not None:
        columns["res"] = F.lit(res)
    return df.withColumns(columns).drop(start_ms_col)   # one step: each is analysed on its own


def enrich(snapshots):
    """Add ``lag`` and the sample's ``time_lag`` (see the module doc)."""
    from pyspark.sql import functions as F

    co = F.col("consumer_offset")
    base = F.when(co < 0, F.col("broker_min_offset")).otherwise(co)
    lag = F.greatest(F.lit(0).cast("long"), F.col("broker_max_offset") - base)
    oldest = F.col("oldest_unconsumed_store_ts")
    zero = F.lit(0).cast("long")
    # As the live page (consumers_app.lab.state.time_lag_ms): not known stays not known (null;
    # maxima skip it), never a reassuring 0.
    time_lag = (F.when((lag == 0) | (oldest == 0), zero)
                .when(oldest < 0, F.lit(None).cast("long"))
                .otherwise(F.greatest(zero, F.col("ts") - oldest)))
    return snapshots.withColumns({"lag": lag, "time_lag": time_lag})


def aggregate_samples(snapshots, shuffle: bool = True):
    """The one pass over the raw samples: per queue and 10-s window (``_kind`` "q") and,
    from the same shuffled rows, per queue, owner and minute (``_kind`` "o").

    Everything windowed per queue is merged up from the "q" rows (exact p95 included: the
    window's lags are carried as an array); the owner windows are the "o" rows. One plan
    (a union) so the samples are scanned and shuffled once for both. ``shuffle=False`` for
    samples already in one partition (a stream pass's)."""
    from pyspark.sql import functions as F

    # Shuffle the (projected) samples by queue once, before aggregating: every later step
    # (the 1 min merge, the status and time-lag windows) groups or partitions by queue, so
    # the rows stay where they are from here on; and the lag arrays are built in one
    # final aggregation, without a partial one (ObjectHashAggregate's partial buffers and
    # their serialization cost more than shuffling the raw columns).
    raw = snapshots.select("ts", *QUEUE_KEYS, "owner", "broker_min_offset", "broker_max_offset",
                           "consumer_offset", "oldest_unconsumed_store_ts")
    if shuffle:
        raw = raw.repartition(*QUEUE_KEYS)
    s = enrich(raw)
    ts = F.col("ts")
    # max_by per primitive column, not over one struct: cheaper aggregation buffers; the
    # structs are assembled on the (10x fewer) results.
    last_fields = ["broker_min_offset", "broker_max_offset", "consumer_offset", "lag", "owner", "time_lag"]
    queue = s.groupBy(*QUEUE_KEYS, (ts - ts % 10_000).alias("ws")).agg(
        F.max("ts").alias("last_ts"), *[F.max_by(c, "ts").alias(f"last_{c}") for c in last_fields],
        F.min("ts").alias("first_ts"), F.min_by("time_lag", "ts").alias("first_time_lag"),
        F.max("lag").alias("max_lag"), F.sum("lag").alias("sum_lag"), F.count("*").alias("samples"),
        F.collect_list("lag").alias("lags"), F.max("time_lag").alias("max_time_lag_ms"),
    )
    last = F.struct(F.col("last_ts").alias("ts"), *[F.col(f"last_{c}").alias(c) for c in last_fields])
    first = F.struct(F.col("first_ts").alias("ts"), F.col("first_time_lag").alias("time_lag"))
    queue = queue.select(F.lit("q").alias("_kind"), *QUEUE_KEYS, "ws", last.alias("last"), first.alias("first"),
                         "max_lag", "sum_lag", "samples", "lags", "max_time_lag_ms")
    committed = F.when(F.col("consumer_offset") >= 0, F.col("consumer_offset"))
    # Same input columns and no filter before the aggregation, so both branches sit on one
    # (reused) exchange: compute_owner_windows drops the null owners afterwards, and
    # max_time_lag_ms (unused) keeps oldest_unconsumed_store_ts in this branch's input.
    owner = s.groupBy(*QUEUE_KEYS, "owner", (ts - ts % MINUTE).alias("ws")).agg(
        F.count("*").alias("samples"), F.min("ts").alias("owned_from_ms"), F.max("ts").alias("owned_to_ms"),
        F.max_by("lag", "ts").alias("last_lag"), F.sum("lag").alias("sum_lag"), F.max("lag").alias("max_lag"),
        F.min(committed).alias("min_committed"), F.max(committed).alias("max_committed"),
        F.max("time_lag").alias("max_time_lag_ms"),
    ).withColumn("_kind", F.lit("o"))
    return queue.unionByName(owner, allowMissingColumns=True)


def _p95(lags):
    """Exact p95 of an array: the smallest v with at least 95 % of the values <= v."""
    from pyspark.sql import functions as F

    # sort_array, not array_sort: array_sort evaluates a comparator lambda per comparison
    # (interpreted), sort_array compares natively - several times cheaper on 1M+ arrays.
    return F.element_at(F.sort_array(lags), F.greatest(F.lit(1), F.ceil(F.size(lags) * 0.95).cast("int")))


def _merge_windows(rows, res_ms: int, *extra):
    """Merge per-queue rows carrying last/first samples, sums and lag arrays into windows of ``res_ms``."""
    from pyspark.sql import functions as F

    return (rows.withColumn("ws", F.col("ws") - F.col("ws") % res_ms)
            .groupBy(*QUEUE_KEYS, "ws").agg(
                F.max_by("last", "last.ts").alias("last"),
                F.min_by("first", "first.ts").alias("first"),
                F.max("max_lag").alias("max_lag"),
                F.sum("sum_lag").alias("sum_lag"),
                F.sum("samples").alias("samples"),
                F.flatten(F.collect_list("lags")).alias("lags"),
                F.max("max_time_lag_ms").alias("max_time_lag_ms"),
                *extra))


def queue_points(samples, p: JobParams, carried: bool = False):
    """Per queue and 10-s window: aggregate_samples()'s "q" rows plus ``status``
    (status.py), still carrying what the 1-minute windows are merged from. ``carried``:
    the rows hold status.CARRIED from an earlier evaluation (the lag stream's state)."""
    from pyspark.sql import functions as F

    columns = [*QUEUE_KEYS, "ws", *POINT_COLUMNS] + (list(status_rules.CARRIED) if carried else [])
    ten = samples.filter(F.col("_kind") == "q").select(*columns)
    ten = ten.withColumns({"consumer_offset": F.col("last.consumer_offset"), "lag": F.col("last.lag")})
    return status_rules.add_status(ten, QUEUE_KEYS, p.status_window_ms, p.stop_after_ms, carried=carried)


def compute_queue_windows(points):
    """One row per queue per window at both resolutions, from queue_points()'s rows.

    A minute takes the status of its last 10-s window."""
    from pyspark.sql import functions as F

    minute = _merge_windows(points, 60_000, F.max_by("status", "last.ts").alias("status"))
    return (_queue_output(points, 10_000, "10s")
            .unionByName(_queue_output(minute, 60_000, "1m")))


def _queue_output(agg, res_ms: int, res: str):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Time lag at the window end, interpolated towards the next window's first sample.
    ordered = Window.partitionBy(*QUEUE_KEYS).orderBy("ws")
    next_ts = F.lead("first.ts").over(ordered)
    next_tl = F.lead("first.time_lag").over(ordered)
    last_ts, last_tl = F.col("last.ts"), F.col("last.time_lag")
    end = F.col("ws") + F.lit(res_ms)
    interpolated = last_tl + (next_tl - last_tl) * (end - last_ts) / (next_ts - last_ts)
    time_lag_end = (F.when(next_tl.isNotNull() & (next_ts - last_ts <= 2 * res_ms),
                           F.round(interpolated).cast("long")).otherwise(last_tl))
    out = agg.select(
        *QUEUE_KEYS, "ws",
        F.col("last.broker_min_offset").alias("broker_min_offset"),
        F.col("last.broker_max_offset").alias("broker_offset"),
        F.col("last.consumer_offset").alias("consumer_offset"),
        F.col("last.lag").alias("lag"),
        "max_lag", (F.col("sum_lag") / F.col("samples")).alias("avg_lag"), _p95(F.col("lags")).alias("p95_lag"),
        # (not greatest(0, ...): it would turn an unknown time lag into 0)
        F.when(time_lag_end < 0, F.lit(0).cast("long")).otherwise(time_lag_end).alias("time_lag_ms"),
        "max_time_lag_ms",
        F.col("last.owner").alias("owner"), "samples", "status",
    )
    return _with_partitions(out, res_ms=res_ms, res=res)


def group_per_ts(snapshots):
    """A group's lag at each sample ts: the sum of its queues' lags (and how many queues)."""
    from pyspark.sql import functions as F

    return (enrich(snapshots.select("group", "ts", "broker_min_offset", "broker_max_offset",
                                    "consumer_offset", "oldest_unconsumed_store_ts"))
            .groupBy("group", "ts").agg(F.sum("lag").alias("lag"), F.count("*").alias("queues")))


def compute_group_windows(snapshots, queue_windows):
    """A group's lag = the sum of its queues' lags at each sample ts, then windowed."""
    return group_windows_from(group_per_ts(snapshots), queue_windows)


def group_windows_from(per_ts, queue_windows, one_partition: bool = False):
    """Group windows from group_per_ts() rows and the same windows' queue rows.
    ``one_partition`` for rows already in one partition (a stream pass's): every step
    stays in it, without an exchange."""
    from pyspark.sql import functions as F

    frames = []
    for res, res_ms in RESOLUTIONS.items():
        w = per_ts.withColumn("ws", F.col("ts") - F.col("ts") % res_ms)
        agg = w.groupBy("group", "ws").agg(
            F.max_by(F.struct("lag", "queues"), "ts").alias("last"),
            F.max("lag").alias("max_lag"), F.avg("lag").alias("avg_lag"),
            _p95(F.collect_list("lag")).alias("p95_lag"),
        ).select("group", "ws", F.col("last.lag").alias("lag"), F.col("last.queues").alias("queues"),
                 "max_lag", "avg_lag", "p95_lag")
        frames.append(_with_partitions(agg, res_ms=res_ms, res=res))
    windows = frames[0].unionByName(frames[1])
    if one_partition:
        queue_windows = queue_windows.coalesce(1)
    order = F.array(*map(F.lit, status_rules.STATUS_ORDER))
    keys = ["group", "res", "window_start"]
    from_queues = queue_windows.groupBy(*keys).agg(
        F.max("time_lag_ms").alias("time_lag_ms"), F.max("max_time_lag_ms").alias("max_time_lag_ms"),
        F.max(F.array_position(order, F.col("status"))).alias("_rank"),
        *[F.sum((F.col("status") == s_).cast("int")).alias(f"queues_{s_.lower()}") for s_ in status_rules.STATUS_ORDER],
    ).withColumn("status", F.element_at(order, F.col("_rank").cast("int"))).drop("_rank")
    # windows LEFT JOIN from_queues USING (keys), as one aggregation: each side has one row
    # per key and its own columns. (A join shuffles even two one-partition sides on string
    # keys; the stream's plan must have no exchange to be run again - stream.py.)
    left = [c for c in windows.columns if c not in keys]
    right = [c for c in from_queues.columns if c not in keys]
    both = windows.withColumn("_window", F.lit(True)).unionByName(from_queues, allowMissingColumns=True)
    if one_partition:
        both = both.coalesce(1)
    merged = both.groupBy(*keys).agg(*[F.first(c, ignorenulls=True).alias(c) for c in left + right],
                                     F.max("_window").alias("_window"))
    return merged.filter(F.col("_window")).select(*keys, *left, *right)


def compute_owner_windows(samples):
    """Lag attributed to each owner, per queue and minute, over the samples it owned the queue."""
    from pyspark.sql import functions as F

    agg = samples.filter((F.col("_kind") == "o") & F.col("owner").isNotNull()).select(
        *QUEUE_KEYS, "owner", "ws", "samples",
        F.timestamp_millis("owned_from_ms").alias("owned_from"), F.timestamp_millis("owned_to_ms").alias("owned_to"),
        "last_lag", (F.col("sum_lag") / F.col("samples")).alias("avg_lag"), "max_lag",
        (F.col("max_committed") - F.col("min_committed")).alias("consumed"))
    return _with_partitions(agg, res_ms=MINUTE)


def compute_rebalances(events):
    """Finished rebalances: start, end, duration and changed queues, from ``rebalance`` events."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def queues(name):   # a JSON list of labels in the event's fields; [] when absent
        return F.coalesce(F.from_json(F.get_json_object("fields", f"$.{name}"), "array<string>"),
                          F.array().cast("array<string>"))

    r = events.filter(F.col("type") == "rebalance").select(
        "group", "client_id", "ts",
        F.lower(F.coalesce(F.get_json_object("fields", "$.phase"), F.lit("end"))).alias("phase"),
        # Clients report fractional milliseconds ("2.545"): a straight cast to long fails.
        F.round(F.get_json_object("fields", "$.duration_ms").cast("double")).cast("long").alias("duration_ms"),
        F.to_json(F.concat(queues("added"), queues("removed"))).alias("changed"),   # the queues it moved
        F.get_json_object("fields", "$.reason").alias("reason"),
    )
    ordered = Window.partitionBy("group", "client_id").orderBy("ts")
    r = r.withColumn("_prev_phase", F.lag("phase").over(ordered)).withColumn("_prev_ts", F.lag("ts").over(ordered))
    ends = r.filter(F.col("phase") == "end")
    start = F.coalesce(F.col("ts") - F.col("duration_ms"),
                       F.when(F.col("_prev_phase") == "start", F.col("_prev_ts")), F.col("ts"))
    out = ends.select("group", "client_id", start.alias("ws"), F.timestamp_millis("ts").alias("end"),
                      (F.col("ts") - start).alias("duration_ms"), "changed", "reason")
    df = _with_partitions(out)
    return df.withColumn("start", F.col("window_start"))


def compute_flow_control(events):
    """Counts of ``flow_control`` events per consumer, reason and window."""
    from pyspark.sql import functions as F

    f = events.filter(F.col("type") == "flow_control").select(
        "group", "client_id", "ts",
        F.coalesce(F.get_json_object("fields", "$.reason"), F.lit("unknown")).alias("reason"),
        F.get_json_object("fields", "$.value").cast("double").alias("value"),
    )
    frames = []
    for res, res_ms in RESOLUTIONS.items():
        agg = (f.withColumn("ws", F.col("ts") - F.col("ts") % res_ms)
               .groupBy("group", "client_id", "reason", "ws")
               .agg(F.count("*").alias("count"), F.max("value").alias("max_value")))
        frames.append(_with_partitions(agg, res_ms=res_ms, res=res))
    return frames[0].unionByName(frames[1])


def compute_marks(events, with_event_ts: bool = False):
    """Faults (strategy switches included) and hand-offs, for the charts' marks and the
    range comparison; a hand-off is its latest ``handoff`` event, at the time it happened.
    ``with_event_ts`` keeps ``_event_ts``: the ts of the event each mark comes from."""
    from pyspark.sql import functions as F

    faults = events.filter(F.col("type") == "fault").select(
        "group", "client_id", F.lit("fault").alias("kind"),
        F.coalesce(F.get_json_object("fields", "$.fault"), F.lit("unknown")).alias("name"),
        F.col("ts").alias("ws"), F.col("fields").alias("detail"), F.col("ts").alias("_event_ts"))
    handoffs = (events.filter(F.col("type") == "handoff")
                .withColumn("queue", F.get_json_object("fields", "$.queue"))
                .withColumn("added_ts", F.get_json_object("fields", "$.added_ts").cast("long"))
                .groupBy("group", "client_id", "queue", "added_ts")
                .agg(F.max_by("fields", "ts").alias("detail"), F.max("ts").alias("_event_ts"))
                .select("group", "client_id", F.lit("handoff").alias("kind"), F.col("queue").alias("name"),
                        F.col("added_ts").alias("ws"), "detail", "_event_ts"))
    marks = _with_partitions(faults.unionByName(handoffs))
    return marks if with_event_ts else marks.drop("_event_ts")
