"""The batch run's plan (dashboard/lag/plan.py plan_run) as a pure function: which windows a
run recomputes, which recording files it reads and which hour partitions it rewrites, from
file names alone. No Spark."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from consumers_app.lab.recorder import EVENTS, SNAPSHOTS
from dashboard.lag.job import JobParams
from dashboard.lag.layout import HOUR, MINUTE, list_recordings
from dashboard.lag.plan import Idle, RunPlan, plan_run

T0 = 1_767_265_080_000   # 2026-01-01T10:58:00Z, a whole minute
P = JobParams()          # status window 60 s, stop after 300 s


def minute_file(kind: str, minute: int, part: int = 0) -> str:
    return f"{kind}/date=2026-01-01/hour=10/part-{minute:02d}-{part}.parquet"


def files_of(minutes: dict[str, list[int]]) -> dict:
    """kind -> {rel: minute ts} for the given minute offsets from T0."""
    return {kind: {minute_file(kind, m): T0 + m * MINUTE for m in minutes.get(kind, [])} for kind in (SNAPSHOTS, EVENTS)}


def test_no_recordings():
    assert plan_run(files_of({}), {SNAPSHOTS: set(), EVENTS: set()}, P).state == "no-recordings"


def test_nothing_new_when_every_file_is_processed():
    files = files_of({SNAPSHOTS: [0, 1], EVENTS: [1]})
    processed = {kind: set(files[kind]) for kind in files}
    result = plan_run(files, processed, P)
    assert isinstance(result, Idle) and result.state == "nothing-new"


def test_new_minutes_recompute_one_minute_before_and_the_status_window_after():
    files = files_of({SNAPSHOTS: list(range(0, 12)), EVENTS: [11]})
    processed = {SNAPSHOTS: {minute_file(SNAPSHOTS, m) for m in range(0, 10)}, EVENTS: set()}
    plan = plan_run(files, processed, P)
    assert isinstance(plan, RunPlan)
    assert plan.new == {SNAPSHOTS: {minute_file(SNAPSHOTS, m): T0 + m * MINUTE for m in (10, 11)},
                        EVENTS: {minute_file(EVENTS, 11): T0 + 11 * MINUTE}}
    # minute 9 (interpolation towards minute 10) .. the minute after 11 plus a 60-s status window
    assert plan.range_ms == (T0 + 9 * MINUTE, T0 + 13 * MINUTE)
    # the look-back: the longer of the status rules (stop after 300 s) plus a minute; the
    # look-ahead: two minutes (a minute window's time lag interpolates that far)
    assert plan.read_ms == (T0 + 9 * MINUTE - 6 * MINUTE, T0 + 15 * MINUTE)
    assert plan.to_read[SNAPSHOTS] == sorted(minute_file(SNAPSHOTS, m) for m in range(3, 12))
    assert plan.to_read[EVENTS] == [minute_file(EVENTS, 11)]


def test_a_longer_status_window_widens_the_range_after():
    files = files_of({SNAPSHOTS: [0]})
    plan = plan_run(files, {SNAPSHOTS: set(), EVENTS: set()}, JobParams(status_window_ms=150_000, stop_after_ms=300_000))
    assert plan.range_ms == (T0 - MINUTE, T0 + MINUTE + 3 * MINUTE)


@pytest.mark.parametrize("since, until, expected", [
    (T0 + 90_000, T0 + 150_000, (T0 + MINUTE, T0 + 3 * MINUTE)),   # rounded out to whole minutes
    (None, None, (T0, T0 + 5 * MINUTE)),                            # every minute recorded
])
def test_a_targeted_run_recomputes_its_range_whatever_is_processed(since, until, expected):
    files = files_of({SNAPSHOTS: list(range(5))})
    processed = {SNAPSHOTS: set(files[SNAPSHOTS]), EVENTS: set()}
    plan = plan_run(files, processed, JobParams(since_ms=since, until_ms=until, group="G1"))
    assert plan.new == {SNAPSHOTS: {}, EVENTS: {}}
    assert plan.range_ms == expected


def test_an_empty_targeted_range_is_nothing_new():
    files = files_of({SNAPSHOTS: [0]})
    result = plan_run(files, {SNAPSHOTS: set(), EVENTS: set()}, JobParams(since_ms=T0 + MINUTE, until_ms=T0 + MINUTE))
    assert isinstance(result, Idle) and result.state == "nothing-new"


def test_the_plan_rewrites_each_table_s_hour_partitions_the_range_overlaps():
    # new minutes 10:58 and 10:59: the range 10:57 .. 11:01 crosses into hour 11
    plan = plan_run(files_of({SNAPSHOTS: [0, 1]}), {SNAPSHOTS: set(), EVENTS: set()}, P)
    assert plan.range_ms == (T0 - MINUTE, T0 + 3 * MINUTE) and (T0 + 2 * MINUTE) % HOUR == 0
    assert plan.hours == [("2026-01-01", "10"), ("2026-01-01", "11")]
    assert [p.as_posix() for p in plan.partitions("owner_windows")] == [
        "date=2026-01-01/hour=10", "date=2026-01-01/hour=11"]
    assert [p.as_posix() for p in plan.partitions("queue_windows")] == [
        "res=10s/date=2026-01-01/hour=10", "res=10s/date=2026-01-01/hour=11",
        "res=1m/date=2026-01-01/hour=10", "res=1m/date=2026-01-01/hour=11"]


def test_a_range_inside_one_hour_rewrites_that_hour_only():
    files = files_of({SNAPSHOTS: list(range(-50, -40))})   # 10:08 .. 10:17
    plan = plan_run(files, {SNAPSHOTS: set(files[SNAPSHOTS]), EVENTS: set()},
                    JobParams(since_ms=T0 - 45 * MINUTE, until_ms=T0 - 44 * MINUTE))
    assert plan.hours == [("2026-01-01", "10")]
    # the look-back reads the files before the range: 6 minutes (stop after 300 s + 1 min),
    # the look-ahead two after it
    assert plan.to_read[SNAPSHOTS] == sorted(minute_file(SNAPSHOTS, m) for m in range(-50, -42))
    assert [(c.range_ms, c.rels) for c in plan.chunks] == [(plan.range_ms, plan.to_read[SNAPSHOTS])]


def test_the_range_is_cut_into_hours_each_with_its_look_back_and_look_ahead():
    # 10:50 .. 12:10 recorded, all of it recomputed: 10:50-11:00, 11:00-12:00, 12:00-12:11
    files = files_of({SNAPSHOTS: list(range(-8, 73))})
    plan = plan_run(files, {SNAPSHOTS: set(), EVENTS: set()}, JobParams(since_ms=T0 - 8 * MINUTE))
    eleven, twelve = T0 + 2 * MINUTE, T0 + 62 * MINUTE
    assert [c.range_ms for c in plan.chunks] == [(T0 - 8 * MINUTE, eleven), (eleven, twelve), (twelve, T0 + 73 * MINUTE)]
    assert [c.read_ms for c in plan.chunks] == [(lo - 6 * MINUTE, hi + 2 * MINUTE) for lo, hi in
                                                (c.range_ms for c in plan.chunks)]
    minutes = {rel: m for rel, m in files[SNAPSHOTS].items()}
    for chunk in plan.chunks:
        read_lo, read_hi = chunk.read_ms
        assert chunk.rels == sorted(rel for rel, m in minutes.items() if read_lo < m + MINUTE and m < read_hi)
    assert [len(c.rels) for c in plan.chunks] == [10 + 2, 6 + 60 + 2, 6 + 11]


def test_planning_needs_no_spark():
    code = ("import sys; import dashboard.lag.plan, dashboard.lag.layout; "
            "assert not [m for m in sys.modules if m.startswith('pyspark')], 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


def test_listing_with_a_cache_lists_only_hours_written_to(tmp_path):
    def touch(hour: int, minute: int, part: int = 0) -> str:
        d = tmp_path / SNAPSHOTS / "date=2026-01-01" / f"hour={hour:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"part-{minute:02d}-{part}.parquet").touch()
        os.utime(d, ns=(10**18, 10**18))   # written to long ago: cacheable
        return f"{SNAPSHOTS}/date=2026-01-01/hour={hour:02d}/part-{minute:02d}-{part}.parquet"

    for hour in (10, 11):
        touch(hour, 5)
    cache: dict = {}
    assert list_recordings(tmp_path, SNAPSHOTS, cache) == list_recordings(tmp_path, SNAPSHOTS)
    assert len(cache) == 2
    # an hour nobody wrote to is not listed again: what the cache says is what comes back
    (key, (mtime, listed)), = [(k, v) for k, v in cache.items() if k.endswith("hour=10")]
    cache[key] = (mtime, {**listed, "marker": 0})
    assert "marker" in list_recordings(tmp_path, SNAPSHOTS, cache)
    # a file added (the directory's mtime moves), an hour gone: listed as without a cache
    new = touch(11, 6)   # touch() pins the mtime back; a real write moves it on:
    os.utime(tmp_path / SNAPSHOTS / "date=2026-01-01" / "hour=11", ns=(10**18 + 1, 10**18 + 1))
    shutil.rmtree(tmp_path / SNAPSHOTS / "date=2026-01-01" / "hour=10")
    got = list_recordings(tmp_path, SNAPSHOTS, cache)
    assert got == list_recordings(tmp_path, SNAPSHOTS) and new in got
    assert [k for k in cache if k.endswith("hour=10")] == [], "a pruned hour leaves the cache"


class FakeConf:
    """RuntimeConfig's get/set/unset over a dict (no Spark)."""

    def __init__(self, **values):
        self.values = dict(values)

    def get(self, key, default):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class FakeSession:
    def __init__(self, **values):
        self.conf = FakeConf(**values)


def test_a_small_run_is_interpreted_and_the_session_gets_its_settings_back():
    from dashboard.lag.spark import INTERPRETED, INTERPRETED_BELOW_ROWS, execution_mode

    session = FakeSession()   # a lagjob process: Spark's defaults
    with execution_mode(session, INTERPRETED_BELOW_ROWS - 1):
        assert session.conf.values == INTERPRETED
    assert session.conf.values == {}


def test_a_large_run_compiles_even_in_the_lag_services_interpreted_session():
    from dashboard.lag.spark import INTERPRETED, INTERPRETED_BELOW_ROWS, execution_mode

    session = FakeSession(**INTERPRETED, **{"spark.sql.shuffle.partitions": "1"})
    with execution_mode(session, INTERPRETED_BELOW_ROWS):
        assert session.conf.values == {"spark.sql.shuffle.partitions": "1"}   # Spark's defaults: generated code
    assert session.conf.values == {**INTERPRETED, "spark.sql.shuffle.partitions": "1"}


def test_the_settings_come_back_when_the_run_fails():
    from dashboard.lag.spark import INTERPRETED_BELOW_ROWS, execution_mode

    session = FakeSession(**{"spark.sql.codegen.wholeStage": "true"})
    with pytest.raises(RuntimeError):
        with execution_mode(session, INTERPRETED_BELOW_ROWS - 1):
            raise RuntimeError("the job failed")
    assert session.conf.values == {"spark.sql.codegen.wholeStage": "true"}
