"""Where the lag history's inputs and outputs are on disk, and the time grid they are cut on.

Recordings (recorder.py): ``<recordings>/<kind>/date=YYYY-MM-DD/hour=HH/part-MM-*.parquet``,
named by their minute. History tables: ``<lag>/<table>/[res=10s|1m/]date=YYYY-MM-DD/hour=HH/``,
one row per window; ``<lag>/_state.json`` is the runs' bookkeeping (job.py). No Spark here:
the history's readers (history.py) use it on the request path.
"""
from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

MINUTE = 60_000
HOUR = 3_600_000
DAY = 24 * HOUR
RESOLUTIONS = {"10s": 10_000, "1m": 60_000}
# table -> has a res partition level
TABLE_HAS_RES = {"queue_windows": True, "group_windows": True, "owner_windows": False,
                 "rebalances": False, "flow_control": True, "marks": False}
STATE_FILE = "_state.json"
_PART = re.compile(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})/part-(\d{2})-[^/]+\.parquet$")


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


def partition_roots(base: Path, has_res: bool) -> list[Path]:
    """Where a table's ``date=/hour=`` partitions are: under each ``res=``, or the table."""
    return [base / f"res={r}" for r in RESOLUTIONS] if has_res else [base]


def partition_dirs(base: Path, has_res: bool, hours) -> list[Path]:
    """A table's partition directories (under ``base``) of the (date, hour) ``hours``."""
    return [root / f"date={d}" / f"hour={h}" for root in partition_roots(base, has_res) for d, h in hours]
