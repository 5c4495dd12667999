"""Recording offset snapshots and the event log as Parquet, for the Spark lag job.

Layout under ``root`` (``DATA_DIR/recordings`` by default)::

    snapshots/date=YYYY-MM-DD/hour=HH/part-MM-<uuid>.parquet   one row per (group, topic, broker, queue) per sample
    events/date=YYYY-MM-DD/hour=HH/part-MM-<uuid>.parquet      one row per event (consumers_app/events.py)

``MM`` is the minute (UTC) of every row in the file. Rows are bucketed by the 10-second
slice of their ``ts`` (``ROLL_MS``) and a slice's buffer is written once a row of a later
slice arrives, of either kind (files roll every 10 s, so the lag service sees a slice a
second or so after it ends; events are sparse, snapshots tick every second and roll them
too) - or, with the snapshots' ``tick_ms``, as soon as a snapshot row is the slice's last
tick (the next would fall in the next slice): the lag stream then folds a 10-s window in
before it ends; an event of the slice's last second, or one that reaches the lab after the
next slice began, comes in one more file at the next roll - when a buffer reaches ``max_rows`` (bounded memory: another part file of the same
slice), on ``flush()`` and on ``close()`` (nothing is lost on a clean stop). A slice never
spans two minutes, so the file name's minute still covers every row (the lag job relies on
it to know which windows new files touch). A file is written under a dot-name and renamed
into place, so a reader (Spark ignores dot-files) never sees half a file.

Retention: ``Recorder.prune(older_than_ms, now_ms)`` deletes whole hour partitions (both
kinds) that ended more than ``older_than_ms`` ago, oldest first, never the current hour;
the lab controller calls it once a minute with ``LAB_RECORDINGS_HOURS``. ``prune_hours``
does the same for any ``date=/hour=`` tree (the lag job prunes its history with it).

The lab controller owns a Recorder and feeds it from its own once-a-tick offset poll::

    recorder = Recorder(settings.DATA_DIR / "recordings")
    recorder.add_event(event)                # every event it hears (consumers_app.events)
    recorder.add_snapshot(snapshot_rows(group, ts, GetQueueOffsets(group=G).queues, holders))

Each tick calls ``LabAdmin.GetQueueOffsets(group=G)`` once per group and writes one
row per queue with one ``ts`` for the whole tick (the job sums a group's queues per
``ts``). A group's rows keep only topics it has committed on or holds queues of (the
broker answers for every topic), so unrelated topics do not show as lag.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from consumers_app.events import Event


SNAPSHOTS = "snapshots"
EVENTS = "events"
HOUR_MS = 3_600_000
ROLL_MS = 10_000   # a slice per part file: divides a minute, so one file = one minute's name

SNAPSHOT_SCHEMA = pa.schema([
    ("ts", pa.int64()),                          # ms since epoch (UTC)
    ("group", pa.string()),
    ("topic", pa.string()),
    ("broker", pa.string()),
    ("queue_id", pa.int32()),
    ("broker_min_offset", pa.int64()),
    ("broker_max_offset", pa.int64()),           # next offset to be written
    ("consumer_offset", pa.int64()),             # committed offset; -1 = no commit yet
    ("owner", pa.string()),                      # client id holding the queue; null = nobody
    ("cached_count", pa.int64()),                # ProcessQueue depth
    ("cached_bytes", pa.int64()),
    ("inflight", pa.int32()),                    # pop: received, not yet acked
    ("oldest_unconsumed_store_ts", pa.int64()),  # ms; 0 = nothing unconsumed, -1 = not known
])

EVENT_SCHEMA = pa.schema([
    ("ts", pa.int64()),
    ("type", pa.string()),
    ("group", pa.string()),
    ("client_id", pa.string()),
    ("fields", pa.string()),  # the type-specific fields as one JSON object
])

SCHEMAS = {SNAPSHOTS: SNAPSHOT_SCHEMA, EVENTS: EVENT_SCHEMA}


def slice_of(ts_ms: int) -> int:
    """The ts (ms) of the start of the 10-second slice holding ``ts_ms``."""
    return ts_ms - ts_ms % ROLL_MS


def partition_dir(root: Path, kind: str, minute_ts_ms: int) -> Path:
    t = datetime.fromtimestamp(minute_ts_ms / 1000, tz=timezone.utc)
    return Path(root) / kind / f"date={t:%Y-%m-%d}" / f"hour={t:%H}"


def hour_partitions(base: Path) -> list[tuple[int, Path]]:
    """(start ms, dir) of every ``date=YYYY-MM-DD/hour=HH`` dir under ``base``, oldest first."""
    found = []
    for directory in Path(base).glob("date=*/hour=*"):
        try:
            start = datetime.strptime(f"{directory.parent.name} {directory.name}", "date=%Y-%m-%d hour=%H")
        except ValueError:
            continue   # not a partition
        found.append((int(start.replace(tzinfo=timezone.utc).timestamp() * 1000), directory))
    return sorted(found)


def prune_hours(base: Path, older_than_ms: int, now_ms: int) -> list[Path]:
    """Delete the hour partitions under ``base`` whose hour ended more than ``older_than_ms``
    before ``now_ms``, oldest first, and the ``date=`` dirs they leave empty; returns them.

    Each partition is first renamed to a dot-name (one atomic step; the lag job, Spark and
    pyarrow skip dot-names), so a reader listing the tree sees it whole or not at all."""
    if older_than_ms < 0:
        raise ValueError("older_than_ms must be >= 0: the current hour is never deleted")
    for trash in Path(base).glob("date=*/.pruned-*"):   # left by a stop in the middle of a prune
        shutil.rmtree(trash, ignore_errors=True)
    deleted = []
    for start, directory in hour_partitions(base):
        if start + HOUR_MS + older_than_ms >= now_ms:
            break   # oldest first: every later hour is newer
        trash = directory.with_name(f".pruned-{directory.name}-{uuid.uuid4().hex}")
        os.replace(directory, trash)
        shutil.rmtree(trash, ignore_errors=True)
        deleted.append(directory)
        try:
            directory.parent.rmdir()   # the day, once its last hour is gone
        except OSError:
            pass   # it still has hours
    return deleted


def write_part(root: Path, kind: str, ts_ms: int, table: pa.Table) -> Path:
    """Write one part file named by the minute of ``ts_ms``, atomically; returns its path."""
    directory = partition_dir(root, kind, ts_ms)
    directory.mkdir(parents=True, exist_ok=True)
    minute = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).minute
    name = f"part-{minute:02d}-{uuid.uuid4().hex}.parquet"
    scratch = directory / f".{name}.tmp"
    pq.write_table(table, scratch, compression="zstd")
    os.replace(scratch, directory / name)
    return directory / name


def _snapshot_row(row: dict) -> dict:
    out = {name: row.get(name) for name in SNAPSHOT_SCHEMA.names}
    for name in ("cached_count", "cached_bytes", "inflight"):
        if out[name] is None:
            out[name] = 0
    if out["oldest_unconsumed_store_ts"] is None:   # not known (an attached cluster's probe): not "none"
        out["oldest_unconsumed_store_ts"] = -1
    if out["consumer_offset"] is None:
        out["consumer_offset"] = -1
    if out["owner"] == "":
        out["owner"] = None
    return out


def _event_row(event: Event) -> dict:
    return {
        "ts": event.ts, "type": event.type, "group": event.group, "client_id": event.client_id,
        "fields": json.dumps(event.fields(), separators=(",", ":")),
    }


@dataclass
class _SliceBuffer:
    """A slice's buffered rows of one kind. ``opened_at``: the newest slice when the buffer
    was opened; it rolls once a later slice than that shows up, so late rows of a slice
    already written (events reach the lab a little after they happen) wait for the next
    roll together: one more file, not one each."""
    opened_at: int
    rows: list[dict] = field(default_factory=list)


class Recorder:
    """Buffers snapshot rows and events per 10-s slice and writes them as Parquet. Thread-safe."""

    def __init__(self, root: Path | str, max_rows: int = 200_000, tick_ms: int | None = None):
        self.root = Path(root)
        self.max_rows = max_rows
        # With the snapshots' tick: a slice is written right after its last tick (the next
        # tick would fall in the next slice), a tick sooner than waiting for that tick.
        self.tick_ms = tick_ms
        self._lock = threading.Lock()
        # kind -> slice start ts -> its buffer
        self._buffers: dict[str, dict[int, _SliceBuffer]] = {SNAPSHOTS: {}, EVENTS: {}}
        self._newest_slice: int | None = None   # over both kinds
        self._closed = False
        self.files_written = 0

    def add_snapshot(self, rows) -> None:
        """Buffer snapshot rows (dicts with SNAPSHOT_SCHEMA's names; ``ts`` in ms)."""
        self._add(SNAPSHOTS, [_snapshot_row(r) for r in rows])

    def add_event(self, event: Event) -> None:
        """Buffer one event; its type-specific fields go into one JSON column."""
        self._add(EVENTS, [_event_row(event)])

    def add_events(self, events) -> None:
        """Buffer some events at once (what the lab heard since its last record)."""
        self._add(EVENTS, [_event_row(e) for e in events])

    def _add(self, kind: str, rows: list[dict]) -> None:
        if not rows:
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("recorder is closed")
            buffers = self._buffers[kind]
            before = self._newest_slice
            for row in rows:
                start = slice_of(row["ts"])
                buffer = buffers.get(start)
                if buffer is None:
                    buffer = buffers[start] = _SliceBuffer(start if before is None else max(start, before))
                buffer.rows.append(row)
            newest = max(slice_of(row["ts"]) for row in rows)
            self._newest_slice = newest if before is None else max(before, newest)
            # The slice's last tick: it is complete now (rows of it that still come, events of
            # its last second, wait for the usual roll: one more file, not one each).
            complete = (kind == SNAPSHOTS and self.tick_ms
                        and max(row["ts"] for row in rows) + self.tick_ms >= newest + ROLL_MS)
            # Roll: a slice is complete once a later slice shows up in either kind (the
            # once-a-second snapshots roll the sparse events); a full buffer is written
            # early so memory stays bounded whatever the rate.
            for buffered_kind, kind_buffers in self._buffers.items():
                for start in sorted(kind_buffers):
                    buffer = kind_buffers[start]
                    if (buffer.opened_at < self._newest_slice
                            or len(buffer.rows) >= self.max_rows or (complete and start <= newest)):
                        self._write(buffered_kind, start, kind_buffers.pop(start).rows)

    def flush(self) -> None:
        """Write every buffered row now (partial slices become part files of their own)."""
        with self._lock:
            for kind, buffers in self._buffers.items():
                for start in sorted(buffers):
                    self._write(kind, start, buffers.pop(start).rows)

    def prune(self, older_than_ms: int, now_ms: int) -> list[Path]:
        """Delete the hour partitions of both kinds that ended more than ``older_than_ms``
        before ``now_ms`` (see prune_hours); returns the deleted dirs."""
        with self._lock:   # a late slice's part file never lands in an hour being deleted
            return [d for kind in SCHEMAS for d in prune_hours(self.root / kind, older_than_ms, now_ms)]

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True

    def _write(self, kind: str, slice_start: int, rows: list[dict]) -> None:
        table = pa.Table.from_pylist(rows, schema=SCHEMAS[kind])
        write_part(self.root, kind, slice_start, table)
        self.files_written += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def snapshot_rows(group: str, ts: int, queues, state: dict) -> list[dict]:
    """One tick's rows for a group: GetQueueOffsets' queues joined with who holds them."""
    def queue_state(q):
        ref = q.queue
        return state.get(f"{ref.topic}@{ref.broker_name}:{ref.queue_id}") or state.get(
            f"{ref.broker_name}:{ref.queue_id}")

    topics = {q.queue.topic for q in queues if q.committed_offset >= 0 or queue_state(q)}
    rows = []
    for q in queues:
        if q.queue.topic not in topics:
            continue
        s = queue_state(q) or {}
        rows.append({
            "ts": ts, "group": group, "topic": q.queue.topic, "broker": q.queue.broker_name,
            "queue_id": q.queue.queue_id, "broker_min_offset": q.min_offset,
            "broker_max_offset": q.max_offset, "consumer_offset": q.committed_offset,
            "owner": s.get("owner") or None, "cached_count": int(s.get("cached_count") or 0),
            "cached_bytes": int(s.get("cached_bytes") or 0), "inflight": q.inflight,
            "oldest_unconsumed_store_ts": q.oldest_unconsumed_store_ts,
        })
    return rows
