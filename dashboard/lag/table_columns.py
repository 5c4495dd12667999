"""The columns every lag history table shares (Spark): ``window_start``/``window_end`` as
UTC timestamps (the window is [start, end)) and the ``date``/``hour``(/``res``) partition
columns (layout.py), from a window's start in ms; and the filter on a range of windows."""
from __future__ import annotations


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
