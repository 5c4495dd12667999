"""Disk use of the lab's parts, for the snapshot's ``"disk"`` and the page's disk line.

The controller is told where the parts live (``DiskPlaces``; runtime.py fills it from the
settings, so the lab never reads them itself) and measures them off the event loop::

    {"commitlog": bytes, "consumequeue": bytes, "recordings": bytes, "lag_history": bytes,
     "database": bytes, "total": bytes, "budget": {"commitlog": bytes}, "ts": ms}

A part with no place is left out: a broker that is someone else's has no data dir here,
so its commit log, consume queues and budget are not ours to report.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DiskPlaces:
    broker_data_dir: Path | None = None   # commitlog/ and consumequeue/ under it
    commitlog_budget: int | None = None   # bytes (runbroker --retention-mb)
    recordings: Path | None = None        # the recorder's root
    lag_history: Path | None = None       # the lag job's output
    database: Path | None = None          # the SQLite file (None for a database server)


def measure(places: DiskPlaces, now_ms: int) -> dict:
    """Bytes per part as du counts them; walks directories, so call it off the loop."""
    parts = {}
    if places.broker_data_dir is not None:
        parts["commitlog"] = tree_bytes(places.broker_data_dir / "commitlog")
        parts["consumequeue"] = tree_bytes(places.broker_data_dir / "consumequeue")
    if places.recordings is not None:
        parts["recordings"] = tree_bytes(places.recordings)
    if places.lag_history is not None:
        parts["lag_history"] = tree_bytes(places.lag_history)
    if places.database is not None:
        # SQLite's write-ahead log and journal are the database's too, and can be large.
        parts["database"] = sum(file_bytes(Path(f"{places.database}{suffix}")) for suffix in ("", "-wal", "-journal"))
    disk = {**parts, "total": sum(parts.values()), "ts": now_ms}
    if places.commitlog_budget is not None:
        disk["budget"] = {"commitlog": places.commitlog_budget}
    return disk


def tree_bytes(path: Path, seen: set | None = None) -> int:
    """Allocated bytes of a directory tree, 0 if it is not there; a file hard-linked more
    than once in the tree counts once (the lag history's generations share their files)."""
    seen = set() if seen is None else seen
    try:
        with os.scandir(path) as entries:
            return sum(_entry_bytes(entry, seen) for entry in entries)
    except FileNotFoundError:
        return 0


def file_bytes(path: Path) -> int:
    try:
        return path.lstat().st_blocks * 512
    except FileNotFoundError:
        return 0


def _entry_bytes(entry: os.DirEntry, seen: set) -> int:
    # st_blocks, not st_size (du counts the same): a commit-log segment is created at its
    # full size as a sparse file and allocated as it fills (32 MiB ahead, store.py), so
    # its size says 128 MiB while the disk holds only what was allocated.
    try:
        if entry.is_dir(follow_symlinks=False):
            return tree_bytes(Path(entry.path), seen)
        stat = entry.stat(follow_symlinks=False)
        if stat.st_nlink > 1:
            if (stat.st_dev, stat.st_ino) in seen:
                return 0
            seen.add((stat.st_dev, stat.st_ino))
        return stat.st_blocks * 512
    except FileNotFoundError:   # deleted meanwhile (retention, a prune, an atomic rename)
        return 0


def history_service(lag_dir: Path | None, now_ms: int, since_ms: int = 0) -> dict | None:
    """What the lag service says of itself (its ``_service.json``): its state, the share of
    one core it and its JVM use, and how far behind the newest recording its history is;
    None when no service has run on this data dir. A newest sample from before ``since_ms``
    (this lab's start) is none yet: after a restart it is the last run's, and "1512 s behind"
    would count the time the lab was stopped."""
    import json

    if lag_dir is None:
        return None
    try:
        status = json.loads((Path(lag_dir) / "_service.json").read_text())
    except (OSError, ValueError):
        return None
    newest = status.get("newest_sample_ts")
    if newest is not None and newest < since_ms:
        newest = None
    return {"state": status.get("state"), "cpu_pct": status.get("cpu_pct"),
            "behind_s": round(max(0, now_ms - newest) / 1000, 1) if newest else None,
            "paused": status.get("paused")}
