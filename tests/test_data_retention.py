"""Retention (README "Disk retention"): recordings pruned by the hour, lag history by age.

Synthetic partition trees and a fixed ``now``; nothing here starts Spark (the lag job's
runs below have no recordings to read).
"""
import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from consumers_app.lab.controller import LabController
from consumers_app.lab.disk import DiskPlaces, measure
from consumers_app.lab.recorder import EVENTS, SNAPSHOTS, Recorder, hour_partitions, prune_hours, write_part
from dashboard.lag.history import LagHistory
from dashboard.lag.job import JobParams, LagJob
from dashboard.lag.layout import DAY, HOUR, STATE_FILE

NOW = 1_767_265_080_000  # 2026-01-01T10:58:00Z: inside hour 10


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


def _hour(base, date: str, hour: str, name: str = "part-00-x.parquet"):
    directory = base / f"date={date}" / f"hour={hour}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"")
    return directory


def _tree(base) -> list[str]:
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_dir())


def test_hour_partitions_are_listed_oldest_first_and_strangers_ignored(tmp_path):
    _hour(tmp_path, "2026-01-01", "09")
    _hour(tmp_path, "2025-12-31", "23")
    (tmp_path / "date=2026-01-01" / "hour=xx").mkdir()
    (tmp_path / "date=2026-01-01" / ".pruned-hour=08-abc").mkdir()
    assert [(start, d.relative_to(tmp_path).as_posix()) for start, d in hour_partitions(tmp_path)] == [
        (_ms("2025-12-31T23:00"), "date=2025-12-31/hour=23"), (_ms("2026-01-01T09:00"), "date=2026-01-01/hour=09")]


def test_prune_hours_deletes_hours_ended_before_the_cutoff_and_emptied_days(tmp_path):
    for date, hour in [("2025-12-31", "22"), ("2025-12-31", "23"), ("2026-01-01", "07"),
                       ("2026-01-01", "08"), ("2026-01-01", "09"), ("2026-01-01", "10")]:
        _hour(tmp_path, date, hour)
    # Keep 1 h: hour 09 ended 58 min ago, 08 ended 1 h 58 min ago.
    deleted = prune_hours(tmp_path, HOUR, NOW)
    assert [d.relative_to(tmp_path).as_posix() for d in deleted] == [
        "date=2025-12-31/hour=22", "date=2025-12-31/hour=23", "date=2026-01-01/hour=07", "date=2026-01-01/hour=08"]
    assert _tree(tmp_path) == ["date=2026-01-01", "date=2026-01-01/hour=09", "date=2026-01-01/hour=10"]


def test_prune_hours_keeps_an_hour_until_it_is_strictly_older(tmp_path):
    _hour(tmp_path, "2026-01-01", "09")
    assert prune_hours(tmp_path, HOUR, _ms("2026-01-01T11:00")) == []   # ended exactly 1 h ago
    assert len(prune_hours(tmp_path, HOUR, _ms("2026-01-01T11:00") + 1)) == 1
    assert _tree(tmp_path) == []


def test_prune_hours_never_deletes_the_current_hour(tmp_path):
    _hour(tmp_path, "2026-01-01", "10")
    assert prune_hours(tmp_path, 0, NOW) == []
    with pytest.raises(ValueError):
        prune_hours(tmp_path, -1, NOW)
    assert prune_hours(tmp_path / "missing", 0, NOW) == []


def test_recorder_prune_covers_snapshots_and_events(tmp_path):
    empty = pa.table({"ts": pa.array([], pa.int64())})
    for kind in (SNAPSHOTS, EVENTS):
        for minute in (_ms("2025-12-31T08:30"), _ms("2026-01-01T09:59"), NOW):
            write_part(tmp_path, kind, minute, empty)
    with Recorder(tmp_path) as recorder:
        deleted = recorder.prune(24 * HOUR, NOW)
    assert sorted(d.relative_to(tmp_path).as_posix() for d in deleted) == [
        "events/date=2025-12-31/hour=08", "snapshots/date=2025-12-31/hour=08"]
    for kind in (SNAPSHOTS, EVENTS):
        assert _tree(tmp_path / kind) == ["date=2026-01-01", "date=2026-01-01/hour=09", "date=2026-01-01/hour=10"]


async def test_controller_prunes_recordings_by_its_configured_hours(tmp_path):
    calls = []

    class FakeRecorder:
        def prune(self, older_than_ms, now_ms):
            calls.append(older_than_ms)

    controller = LabController("127.0.0.1:1", recorder_root=tmp_path, recordings_hours=1.5)
    controller._recorder = FakeRecorder()
    await controller._prune_recordings()
    assert calls == [int(1.5 * HOUR)]
    assert LabController("127.0.0.1:1").recordings_hours == 24


def _lag_tree(out):
    """A little history: every table, hours 2025-12-24 10 and 2026-01-01 09 (res tables at both res)."""
    for table in ("queue_windows", "group_windows", "flow_control"):
        for res in ("10s", "1m"):
            for date, hour in (("2025-12-24", "10"), ("2026-01-01", "09")):
                _hour(out / table / f"res={res}", date, hour)
    for table in ("owner_windows", "rebalances"):
        for date, hour in (("2025-12-24", "10"), ("2026-01-01", "09")):
            _hour(out / table, date, hour)


def test_prune_history_deletes_old_hours_of_every_table(tmp_path):
    _lag_tree(tmp_path)
    deleted = LagJob(tmp_path / "recordings", tmp_path).prune_history(7 * DAY, NOW)
    assert len(deleted) == 3 * 2 + 2
    assert all("date=2025-12-24/hour=10" in d.as_posix() for d in deleted)
    assert not list(tmp_path.rglob("date=2025-12-24"))
    assert len(list(tmp_path.rglob("date=2026-01-01/hour=09"))) == 3 * 2 + 2


def _state(out, **state):
    (out / STATE_FILE).write_text(json.dumps({"processed": {SNAPSHOTS: [], EVENTS: []}, "runs": 1, **state}))


def test_run_prunes_history_from_the_newest_window_not_the_clock(tmp_path):
    out = tmp_path / "lag"
    _lag_tree(out)
    _state(out, last_ts=NOW)
    result = LagJob(tmp_path / "recordings", out).run(JobParams(history_days=7))
    assert result.state == "no-recordings" and result.pruned_partitions == 8
    assert LagJob(tmp_path / "recordings", out).run(JobParams(history_days=7)).pruned_partitions == 0
    assert not list(out.rglob("date=2025-12-24"))


def test_run_forgets_recordings_deleted_since_they_were_processed(tmp_path):
    recordings, out = tmp_path / "recordings", tmp_path / "lag"
    kept = write_part(recordings, SNAPSHOTS, NOW, pa.table({"ts": pa.array([NOW], pa.int64())}))
    kept_rel = kept.relative_to(recordings).as_posix()
    gone_rel = "snapshots/date=2025-12-31/hour=08/part-30-gone.parquet"
    out.mkdir()
    _state(out, processed={SNAPSHOTS: [gone_rel, kept_rel], EVENTS: ["events/date=2025-12-31/hour=08/part-30-x.parquet"]},
           last_ts=NOW)
    job = LagJob(recordings, out)
    assert job.run(JobParams()).state == "nothing-new"   # no Spark needed: nothing to read
    assert job.load_state()["processed"] == {SNAPSHOTS: {kept_rel}, EVENTS: set()}


def test_history_of_a_table_emptied_by_retention_reads_as_none(tmp_path):
    (tmp_path / "rebalances" / "date=2026-01-01").mkdir(parents=True)
    history = LagHistory(tmp_path, tmp_path / "recordings")
    assert history.windows("rebalances", "G1", end_col="end").empty


def test_disk_use_counts_allocated_blocks_per_part_and_leaves_out_what_has_no_place(tmp_path):
    broker = tmp_path / "broker"
    (broker / "commitlog").mkdir(parents=True)
    segment = broker / "commitlog" / "00000000000000000000"
    with open(segment, "wb") as f:   # a sparse 64 MiB segment with 1 MiB written
        f.truncate(64 << 20)
        f.write(b"x" * (1 << 20))
    (tmp_path / "recordings" / "snapshots").mkdir(parents=True)
    (tmp_path / "recordings" / "snapshots" / "part.parquet").write_bytes(b"y" * 8192)
    (tmp_path / "db.sqlite3").write_bytes(b"z" * 4096)
    (tmp_path / "db.sqlite3-wal").write_bytes(b"z" * 4096)

    disk = measure(DiskPlaces(broker_data_dir=broker, commitlog_budget=64 << 20, recordings=tmp_path / "recordings",
                              lag_history=tmp_path / "lag", database=tmp_path / "db.sqlite3"), NOW)
    assert 1 << 20 <= disk["commitlog"] < 2 << 20   # what the disk holds, not the file's size
    assert disk["consumequeue"] == 0 and disk["lag_history"] == 0   # not there yet
    assert disk["recordings"] >= 8192 and disk["database"] >= 8192
    assert disk["total"] == sum(disk[p] for p in ("commitlog", "consumequeue", "recordings", "lag_history", "database"))
    assert disk["budget"] == {"commitlog": 64 << 20} and disk["ts"] == NOW

    # Someone else's broker: no data dir, so no commit log, consume queues or budget.
    assert set(measure(DiskPlaces(recordings=tmp_path / "recordings"), NOW)) == {"recordings", "total", "ts"}
