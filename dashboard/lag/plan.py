"""What a batch run of the lag job reads and writes, decided from file names alone.

A pure function (``plan_run``: no Spark, no disk), so the rules are tested without a JVM
(tests/test_lag_plan.py). Incremental: the files not processed yet give the minutes they
touch; the run recomputes from one minute before the first (its time lag interpolates
towards the new samples) to the status window after the last (those statuses look back
at the new data), reads the recordings of that range plus the status rules' look-back
and the time lag's look-ahead, and rewrites the hour partitions the range overlaps. The
range is cut into hours (``chunks``), each with its own look-back and look-ahead: a local
session computes an hour's windows in one task (hour_tables.py). ``since``/``until``/
``group`` make a *targeted* run instead: that range for that group, from every file,
nothing marked new.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .layout import HOUR, MINUTE, TABLE_HAS_RES, hours_between, partition_dirs
from consumers_app.lab.recorder import EVENTS, SNAPSHOTS

if TYPE_CHECKING:
    from .job import JobParams


# A minute window's time lag at its end interpolates towards the queue's next minute window
# if that one's first sample is at most two windows after its last sample (snapshot_tables.
# _queue_output): a range's last minute needs the samples of two minutes after it.
LOOKAHEAD_MS = 2 * MINUTE


@dataclass
class Chunk:
    """An hour's share of a run (or less, at the range's ends): its windows and the samples
    they are made of."""
    range_ms: tuple    # [lo, hi): the windows computed, within one hour
    read_ms: tuple     # [lo, hi) of the samples read: the look-back before, the look-ahead after
    rels: list         # sorted rels of the snapshot files that hold samples of read_ms


@dataclass
class RunPlan:
    """What a batch run recomputes, reads and rewrites (plan_run)."""
    new: dict          # kind -> {rel: minute} of the files not processed yet (none when targeted)
    range_ms: tuple    # [lo, hi): the windows recomputed, whole minutes
    read_ms: tuple     # [lo, hi) of the samples read: the range, the status look-back before it
    to_read: dict      # kind -> sorted rels of the files that hold samples of read_ms
    hours: list        # (date, hour) of every hour partition the range overlaps: rewritten
    chunks: list       # the range by the hour (Chunk), each with the snapshot files it reads

    def partitions(self, table: str) -> list[Path]:
        """The table's partition dirs (relative to the table) the run rewrites."""
        return partition_dirs(Path(), TABLE_HAS_RES[table], self.hours)


@dataclass
class Idle:
    """A run with nothing to do: "no-recordings" or "nothing-new" (with the empty range of
    a targeted run, if it had one)."""
    state: str
    range_ms: tuple | None = None


def plan_run(files: dict, processed: dict, p: "JobParams") -> RunPlan | Idle:
    """A batch run's plan, from the recording files (kind -> {rel: minute}), those already
    processed (kind -> rels) and the parameters; or Idle."""
    if not files[SNAPSHOTS] and not files[EVENTS]:
        return Idle("no-recordings")
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
            return Idle("nothing-new")
        # One minute before: its time lag interpolates towards the new samples. The status
        # window after: statuses there look back at the new data.
        lo = min(new_minutes) - MINUTE
        hi = max(new_minutes) + MINUTE + -(-p.status_window_ms // MINUTE) * MINUTE
    if hi <= lo:
        return Idle("nothing-new", range_ms=(lo, hi))
    read = _read_range(lo, hi, p)
    to_read = {kind: _holding(files[kind], read) for kind in files}
    return RunPlan(new=new, range_ms=(lo, hi), read_ms=read, to_read=to_read, hours=hours_between(lo, hi),
                   chunks=_chunks(lo, hi, files[SNAPSHOTS], p))


def _read_range(lo: int, hi: int, p: "JobParams") -> tuple[int, int]:
    """The samples the windows in [lo, hi) are made of: the status rules look back at most
    max(status window, stop after) (status.py), the time lag ahead LOOKAHEAD_MS."""
    return lo - max(p.status_window_ms, p.stop_after_ms) - MINUTE, hi + LOOKAHEAD_MS


def _holding(minutes: dict, read: tuple) -> list:
    """The sorted rels of the files (rel -> minute) that hold samples of [lo, hi)."""
    return sorted(rel for rel, m in minutes.items() if m + MINUTE > read[0] and m < read[1])


def _chunks(lo: int, hi: int, snapshot_minutes: dict, p: "JobParams") -> list[Chunk]:
    chunks = []
    while lo < hi:
        end = min(hi, lo - lo % HOUR + HOUR)
        read = _read_range(lo, end, p)
        chunks.append(Chunk((lo, end), read, _holding(snapshot_minutes, read)))
        lo = end
    return chunks
