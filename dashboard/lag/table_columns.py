"""The columns every lag history table shares: ``window_start``/``window_end`` as UTC
timestamps (the window is [start, end)) and the ``date``/``hour``(/``res``) partition
columns (layout.py), from a window's start in ms - made by Spark (with_partitions) or with
numpy (window_columns: hour_tables.py); and the filter on a range of windows."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .layout import DAY, HOUR

UTC_MICROS = pa.timestamp("us", tz="UTC")   # a Spark timestamp (the session is in UTC)
_HOURS = np.array([f"{h:02d}" for h in range(24)], dtype=object)


def with_partitions(df, start_ms_col: str = "ws", res_ms: int | None = None, res: str | None = None):
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


def in_range(lo: int, hi: int):
    """The windows that start in [lo, hi) (ms)."""
    from pyspark.sql import functions as F

    col = F.col("window_start")
    return (col >= F.timestamp_millis(F.lit(lo))) & (col < F.timestamp_millis(F.lit(hi)))


def window_columns(ws: np.ndarray, res_ms=None) -> dict[str, pa.Array]:
    """with_partitions()' columns of windows that start at ``ws`` (ms), as Arrow arrays:
    window_start, window_end (with ``res_ms``: one for all or one per window), date, hour."""
    days, day_of = np.unique(ws // DAY, return_inverse=True)
    dates = np.datetime_as_string(days.astype("datetime64[D]")).astype(object)
    columns = {"window_start": pa.array(ws * 1000, UTC_MICROS)}
    if res_ms is not None:
        columns["window_end"] = pa.array((ws + res_ms) * 1000, UTC_MICROS)
    columns.update(date=pa.array(dates[day_of.reshape(-1)], pa.string()),
                   hour=pa.array(_HOURS[(ws // HOUR) % 24], pa.string()))
    return columns
