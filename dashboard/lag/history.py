"""Reading the lag job's output (job.py) with pyarrow - no Spark on the request path.

``LagHistory(lag_dir)`` answers what the history page and the reports need: the groups
that have history, and a group's windows of each table in a time range, as pandas
DataFrames sorted by time. Time ranges are half-open and select the windows that
overlap them (``window_end > from`` and ``window_start < to``).
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from . import tail
from .layout import STATE_FILE, TABLE_HAS_RES, list_recordings
from consumers_app.lab.recorder import EVENTS, SNAPSHOTS

RESOLUTIONS = ("10s", "1m")
_PARTITIONS = {
    True: ds.partitioning(pa.schema([("res", pa.string()), ("date", pa.string()), ("hour", pa.string())]), flavor="hive"),
    False: ds.partitioning(pa.schema([("date", pa.string()), ("hour", pa.string())]), flavor="hive"),
}


def default_lag_dir() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "lag"


def default_recordings_dir() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "recordings"


def _utc(ms: int) -> pd.Timestamp:
    return pd.Timestamp(ms, unit="ms", tz="UTC")


class LagHistory:
    def __init__(self, lag_dir: Path | None = None, recordings_dir: Path | None = None):
        self.lag_dir = Path(lag_dir) if lag_dir else default_lag_dir()
        self.recordings_dir = Path(recordings_dir) if recordings_dir else default_recordings_dir()

    def _dataset(self, table: str):
        # The table and its tail (the stream's recent hours, tail.py) as one; None without
        # files (every partition retired by the retention): no columns to filter on either.
        return tail.dataset(self.lag_dir, table, _PARTITIONS[TABLE_HAS_RES[table]])

    def exists(self) -> bool:
        return self._dataset("group_windows") is not None

    def groups(self) -> dict[str, tuple[pd.Timestamp, pd.Timestamp]]:
        """group -> (first window start, last window end) over the whole history."""
        dataset = self._dataset("group_windows")
        if dataset is None:
            return {}
        t = dataset.to_table(columns=["group", "window_start", "window_end"], filter=ds.field("res") == "1m")
        if t.num_rows == 0:
            return {}
        df = t.to_pandas().groupby("group").agg(first=("window_start", "min"), last=("window_end", "max"))
        return {g: (row["first"], row["last"]) for g, row in df.iterrows()}

    def newest_window_end(self, now_ms: int, res: str = "10s") -> pd.Timestamp | None:
        """The end of the newest complete window (``window_end <= now``) of any group, over
        the last day: the marker the history page polls to know there is more to draw."""
        dataset = self._dataset("group_windows")
        if dataset is None:
            return None
        now = pa.scalar(_utc(now_ms), pa.timestamp("us", "UTC"))
        f = ((ds.field("res") == res) & (ds.field("date") >= f"{_utc(now_ms - 86_400_000):%Y-%m-%d}")
             & (ds.field("window_end") <= now))
        ends = dataset.to_table(columns=["window_end"], filter=f).column("window_end")
        newest = pc.max(ends).as_py() if len(ends) else None
        return pd.Timestamp(newest) if newest is not None else None

    def windows(self, table: str, group: str, from_ms: int | None = None, to_ms: int | None = None,
                res: str | None = None, start_col: str = "window_start", end_col: str = "window_end") -> pd.DataFrame:
        """Rows of ``table`` for ``group`` overlapping [from, to), sorted by start."""
        dataset = self._dataset(table)
        if dataset is None:
            return pd.DataFrame()
        f = ds.field("group") == group
        if res is not None and TABLE_HAS_RES[table]:
            f = f & (ds.field("res") == res)
        if from_ms is not None:
            f = f & (ds.field(end_col) > pa.scalar(_utc(from_ms), pa.timestamp("us", "UTC")))
            # Partition pruning: whole days before the range are never opened (a margin
            # for rows partitioned by their start that end inside the range).
            f = f & (ds.field("date") >= f"{_utc(from_ms - 3_600_000):%Y-%m-%d}")
        if to_ms is not None:
            f = f & (ds.field(start_col) < pa.scalar(_utc(to_ms), pa.timestamp("us", "UTC")))
            f = f & (ds.field("date") <= f"{_utc(to_ms):%Y-%m-%d}")
        df = dataset.to_table(filter=f).to_pandas()
        sort = [c for c in (start_col, "topic", "broker", "queue_id", "client_id", "owner") if c in df.columns]
        return df.sort_values(sort, kind="stable").reset_index(drop=True) if len(df) else df

    def skipped_recordings(self) -> list[dict]:
        """Recording files the lag job or stream could not read: ``{"file", "reason"}``, the latest last."""
        import json

        try:
            return list(json.loads((self.lag_dir / STATE_FILE).read_text()).get("skipped", []))
        except (FileNotFoundError, ValueError, AttributeError):
            return []

    def unprocessed_recordings(self) -> int:
        """How many recording files the job has not processed yet."""
        import json

        try:
            processed = json.loads((self.lag_dir / STATE_FILE).read_text())["processed"]
        except (FileNotFoundError, ValueError, KeyError):
            processed = {}
        return sum(1 for kind in (SNAPSHOTS, EVENTS) for rel in list_recordings(self.recordings_dir, kind)
                   if rel not in set(processed.get(kind, ())))


def int_or_none(value) -> int | None:
    """A value as a JSON-ready int, None where it is not known (null: NaN in pandas), as a
    time lag whose store time the cluster has not told."""
    return None if pd.isna(value) else int(value)


def ints_or_none(values: pd.Series) -> list:
    """int_or_none of a column, at once (a call per value was a long report's hot spot)."""
    values = pd.Series(values)
    if values.dtype.kind == "f":   # int() truncates
        values = np.trunc(values)
    return values.astype("Int64").to_numpy(dtype=object, na_value=None).tolist()


def to_iso(ts) -> str:
    """A UTC timestamp as ISO-8601 with a Z (seconds, or ms when there are some)."""
    if ts is None or pd.isna(ts):
        return ""
    ts = pd.Timestamp(ts)
    ts = ts.tz_convert("UTC") if ts.tzinfo else ts.tz_localize("UTC")
    text = ts.strftime("%Y-%m-%dT%H:%M:%S")
    if ts.microsecond:
        text += f".{ts.microsecond // 1000:03d}"
    return text + "Z"


def parse_time(text: str | None, name: str) -> int | None:
    """ISO-8601 (``Z``/offset, or naive = UTC; a date alone = its midnight) -> ms. ValueError if bad."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip()
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name}: not an ISO-8601 time: {raw!r} (e.g. 2026-01-01T10:00:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)
