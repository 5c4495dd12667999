"""How a report writes its values (dashboard/lag/reports.py, history.py): every window time
as to_iso writes it, and nullable integer columns as ints or null - done a column at a time,
which must not change a character. Pure functions, no Spark."""
from __future__ import annotations

import pandas as pd

from dashboard.lag.history import ints_or_none, to_iso
from dashboard.lag.reports import iso_strings


def test_window_times_are_written_as_to_iso_writes_each_one():
    ms = [1_767_225_600_000, 1_767_225_600_123, 1_767_225_659_999, 0, 1_767_225_600_000]
    for unit in ("ms", "us", "ns"):   # a history read gives us; a frame built here ns
        times = pd.Series(pd.to_datetime(ms, unit="ms", utc=True)).astype(f"datetime64[{unit}, UTC]")
        assert list(iso_strings(times)) == [to_iso(t) for t in times] == [
            "2026-01-01T00:00:00Z", "2026-01-01T00:00:00.123Z", "2026-01-01T00:00:59.999Z",
            "1970-01-01T00:00:00Z", "2026-01-01T00:00:00Z"]


def test_unknown_integers_are_null_and_known_ones_plain_ints():
    assert ints_or_none(pd.Series([1, None, 3], dtype="Int64")) == [1, None, 3]
    assert ints_or_none(pd.Series([1.9, float("nan"), -2.7])) == [1, None, -2]   # as int() truncates
    values = ints_or_none(pd.Series([2**40, 5], dtype="int64"))
    assert values == [2**40, 5] and all(type(v) is int for v in values)   # JSON-ready, not numpy ints
    assert ints_or_none(pd.Series([], dtype="float64")) == []
