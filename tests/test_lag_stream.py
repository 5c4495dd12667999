"""The lag stream (dashboard/lag/stream.py) gives exactly the batch's rows.

The scenario of test_lag_job (8 queues for 5 minutes: a stall, a rewind, a member leaving,
flow control, a strategy switch, hand-offs updated later) is recorded one 10-s slice at a
time, with a stream pass after each, as the lag service does; some events arrive late (a
second file for a slice already folded). Then a full batch recompute of the same recordings
into another directory must hold the same rows in every table, as the history's readers
see them.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from consumers_app.events import event_from_dict
from consumers_app.lab.recorder import Recorder
from dashboard.lag.history import LagHistory
from dashboard.lag.job import JobParams, LagJob
from dashboard.lag.layout import TABLE_HAS_RES
from dashboard.lag.stream import LagStream
from dashboard.lag.tail import KEYS

from . import lag_scenario as scenario

pytestmark = [
    pytest.mark.spark,
    # The module fixture streams 5 minutes a slice at a time (30 passes, then a batch): minutes on 2 cores.
    pytest.mark.timeout(1800),
]

PARAMS = JobParams()


@pytest.fixture(scope="module")
def spark():
    from dashboard.lag.spark import get_spark
    from dashboard.management.commands.lagservice import tune_for_passes

    session = get_spark("local[1]")
    tune_for_passes(session)   # as the lag service runs its passes (interpreted, one partition, ...)
    yield session
    session.stop()


def table_rows(lag_dir, table: str) -> pd.DataFrame:
    """Every row of ``table`` as readers see it (table + tail), in a stable order."""
    dataset = LagHistory(lag_dir)._dataset(table)
    if dataset is None:
        return pd.DataFrame()
    df = dataset.to_table().to_pandas()
    order = [c for c in (["res"] if TABLE_HAS_RES[table] else []) + KEYS[table] if c in df.columns]
    order += ["detail"] if table == "marks" else []
    return df.sort_values(order, kind="stable").reset_index(drop=True)[sorted(df.columns)]


def assert_same_tables(stream_dir, batch_dir, every_table_has_rows: bool = False):
    for table in TABLE_HAS_RES:
        got, want = table_rows(stream_dir, table), table_rows(batch_dir, table)
        assert len(want) or not every_table_has_rows, f"the batch computed no {table}"
        assert len(got) == len(want), f"{table}: {len(got)} rows streamed, {len(want)} in the batch"
        pd.testing.assert_frame_equal(got, want, check_dtype=False, obj=table)


def record_slice(recorder, first: int, last: int, late: list[dict]) -> None:
    """Seconds [first, last) of the scenario, then its slice written; ``late`` events are
    held back and come as a second file of the slice after the stream folded the first."""
    for t in range(first, last):
        recorder.add_snapshot(scenario.snapshot_rows(t))
        for e in scenario.events(t):
            if e["type"] == "flow_control" and t == 31:
                late.append(e)
            else:
                recorder.add_event(event_from_dict(e))
    recorder.flush()


def streaming_into(data, spark):
    """A job, its stream and a recorder over ``data``, and the list late events wait in."""
    job = LagJob(data / "recordings", data / "lag", spark=spark)
    return job, LagStream(job), Recorder(data / "recordings"), []


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, spark):
    data = tmp_path_factory.mktemp("stream")
    job = LagJob(data / "recordings", data / "lag", spark=spark)
    stream = LagStream(job)
    results, late = [], []
    recorder = Recorder(data / "recordings")
    for first in range(0, scenario.SECONDS, 10):
        record_slice(recorder, first, first + 10, late)
        results.append(stream.run(PARAMS))
        if late and first >= 40:   # a late file of a slice folded two passes ago
            for e in late:
                recorder.add_event(event_from_dict(e))
            late.clear()
            recorder.flush()
            results.append(stream.run(PARAMS))
    recorder.close()
    batch_dir = data / "batch"
    LagJob(data / "recordings", batch_dir, spark=spark).run(PARAMS)
    return {"data": data, "job": job, "stream": stream, "results": results, "batch": batch_dir}


def test_every_pass_is_a_stream_step(streamed):
    states = [r.state for r in streamed["results"]]
    assert states and all(s == "done" for s in states), states
    state = streamed["job"].load_state()
    assert state.get("runs", 0) == 0, "a pass fell back to the batch job"
    assert state["stream"]["passes"] == len(states)


def test_a_pass_with_new_snapshots_says_when_its_windows_landed(streamed):
    with_snapshots = [r for r in streamed["results"] if r.windows["queue_windows"]]
    assert with_snapshots and all(r.windows_landed_ms for r in with_snapshots)
    assert all(r.windows_landed_ms is None for r in streamed["results"] if not r.windows["queue_windows"])


def test_a_pass_reads_only_its_new_files(streamed):
    assert all(r.files_read <= 2 for r in streamed["results"]), [r.files_read for r in streamed["results"]]


def test_streamed_tables_equal_a_batch_recompute(streamed):
    assert_same_tables(streamed["data"] / "lag", streamed["batch"], every_table_has_rows=True)


def test_a_late_event_file_updates_its_windows(streamed):
    flow = table_rows(streamed["data"] / "lag", "flow_control")
    counts = flow[(flow.res == "1m") & (flow.reason == "count")]["count"].tolist()
    assert counts == [5], counts   # t=30..34, one of them recorded late


def test_recent_hours_live_in_the_tail_until_sealed(streamed, tmp_path):
    import shutil

    from dashboard.lag import tail

    lag = tmp_path / "lag"
    shutil.copytree(streamed["data"] / "lag", lag, symlinks=True)
    before = table_rows(lag, "queue_windows")
    # 10:58-11:03: both hours are within the stream's horizon, so both are still in the tail.
    assert tail.partitions(tail.tail_of(lag, "queue_windows")) == {
        __import__("pathlib").Path(f"res={r}/date=2026-01-01/hour={h}") for r in ("10s", "1m") for h in ("10", "11")}
    sealed = tail.seal(lag, "queue_windows", scenario.T0 + 2 * 3_600_000)
    assert len(sealed) == 4
    assert not tail.partitions(tail.tail_of(lag, "queue_windows"))
    pd.testing.assert_frame_equal(table_rows(lag, "queue_windows"), before)   # readers see the same rows


def test_a_corrupt_recording_is_skipped_and_named(tmp_path, spark):
    job = LagJob(tmp_path / "recordings", tmp_path / "lag", spark=spark)
    with Recorder(tmp_path / "recordings") as recorder:
        scenario.record(recorder, 0, 20)
    good = sorted((tmp_path / "recordings" / "snapshots").glob("**/*.parquet"))
    bad = good[0].with_name("part-58-0000broken.parquet")
    bad.write_bytes(good[0].read_bytes()[: len(good[0].read_bytes()) // 2])   # half a file
    result = LagStream(job).run(PARAMS)
    assert result.state == "done"
    skipped = job.load_state()["skipped"]
    assert [s["file"].rsplit("/", 1)[-1] for s in skipped] == [bad.name], skipped
    assert "ArrowInvalid" in skipped[0]["reason"] or "Error" in skipped[0]["reason"], skipped
    assert str(tmp_path) not in skipped[0]["reason"], "the page names the file, not this machine's path"
    assert len(table_rows(tmp_path / "lag", "queue_windows")), "the good files were folded in"
    assert not bad.exists() and bad.with_name(f".unreadable-{bad.name}").exists(), "set aside, not deleted"
    assert job.run(PARAMS).state in ("done", "nothing-new"), "the batch does not trip over it either"


def test_after_a_batch_run_the_stream_builds_its_state_again(tmp_path, spark):
    data = tmp_path
    job, stream, recorder, late = streaming_into(data, spark)
    for first in range(0, 90, 10):
        record_slice(recorder, first, first + 10, late)
    job.run(PARAMS)                      # the backfill: everything so far by the batch
    for first in range(90, 130, 10):     # then the stream goes on from there
        record_slice(recorder, first, first + 10, late)
        assert stream.run(PARAMS).state == "done"
    recorder.close()
    state = job.load_state()
    assert state["runs"] == 1 and state["stream"]["runs"] == 1
    batch = data / "batch"
    LagJob(data / "recordings", batch, spark=spark).run(PARAMS)
    assert_same_tables(data / "lag", batch)


def test_a_rebalance_ending_minutes_after_its_start_keeps_its_start(tmp_path, spark):
    """A pass reads the events from the minute of its first new one (stream.Cuts): a
    rebalance whose end (no duration reported) comes two minutes after its start still
    starts at its start event, one the pass did not read (rebalances_before)."""
    job, stream, recorder, late = streaming_into(tmp_path, spark)
    start, end = scenario.T0 + 55_000, scenario.T0 + 135_000
    for first in range(0, 150, 10):
        for ts, phase in ((start, "start"), (end, "end")):
            if first * 1000 <= ts - scenario.T0 < first * 1000 + 10_000:
                recorder.add_event(event_from_dict({"ts": ts, "type": "rebalance", "group": scenario.GROUP,
                                                    "client_id": "c9", "phase": phase, "reason": "slow"}))
        record_slice(recorder, first, first + 10, late)
        assert stream.run(PARAMS).state == "done"
    recorder.close()
    rebalances = table_rows(tmp_path / "lag", "rebalances")
    mine = rebalances[rebalances.client_id == "c9"]
    assert len(mine) == 1 and mine.duration_ms.tolist() == [end - start], mine
    batch = tmp_path / "batch"
    LagJob(tmp_path / "recordings", batch, spark=spark).run(PARAMS)
    assert_same_tables(tmp_path / "lag", batch)


def test_a_pass_makes_only_the_event_tables_its_events_change(tmp_path, spark):
    """A slice whose only table events are periodic rebalances (a steady lab's every slice)
    makes no flow-control or marks rows (stream.EVENT_TABLE_TYPES), and the tables still
    equal the batch's: the rows it did not make are the ones an earlier pass wrote."""
    job, stream, recorder, late = streaming_into(tmp_path, spark)
    results = []
    for first in range(0, 40, 10):   # the scenario's flow control at t=30..34
        record_slice(recorder, first, first + 10, late)
        results.append(stream.run(PARAMS))
    for first in range(40, 60, 10):
        ts = scenario.T0 + first * 1000 + 5_000
        for client in ("c1", "c2"):
            recorder.add_event(event_from_dict({"ts": ts, "type": "rebalance", "group": scenario.GROUP,
                                                "client_id": client, "phase": "end", "reason": "periodic",
                                                "duration_ms": 3}))
        record_slice(recorder, first, first + 10, late)
        results.append(stream.run(PARAMS))
    recorder.close()
    assert table_rows(tmp_path / "lag", "flow_control").shape[0], "the scenario's flow control is in the table"
    assert results[3].windows["flow_control"] > 0, "the slice with flow control made its windows"
    for result in results[4:]:
        assert result.state == "done" and result.windows["rebalances"] == 2, result.windows
        assert result.windows["flow_control"] == 0 and result.windows["marks"] == 0, result.windows
    batch = tmp_path / "batch"
    LagJob(tmp_path / "recordings", batch, spark=spark).run(PARAMS)
    assert_same_tables(tmp_path / "lag", batch)


def test_a_pass_upserts_the_queue_and_group_windows_before_the_event_tables(tmp_path, spark, monkeypatch):
    """What the history's freshness is read from lands first (stream.PASS_STAGES): each
    table's rows are upserted as soon as its stage has made them."""
    from dashboard.lag import stream as stream_module

    order: list[str] = []
    monkeypatch.setattr(stream_module, "_crash_point", order.append)
    job, stream, recorder, late = streaming_into(tmp_path, spark)
    for first in range(0, 60, 10):
        record_slice(recorder, first, first + 10, late)
        order.append("pass")
        assert stream.run(PARAMS).state == "done"
    recorder.close()
    event_tables = ("upserted rebalances", "upserted flow_control", "upserted marks")
    passes = [p.split(",") for p in ",".join(order).split("pass,") if any(t in p for t in event_tables)]
    assert passes, f"no pass upserted an event table: {order}"
    for upserts in passes:
        first_event_table = min(upserts.index(t) for t in event_tables if t in upserts)
        assert upserts.index("upserted group_windows") < first_event_table, upserts
        assert upserts.index("upserted queue_windows") < upserts.index("upserted group_windows"), upserts


def test_the_spark_fold_and_a_switch_of_fold_give_the_batchs_rows(tmp_path, spark, monkeypatch):
    """The Spark fold (what Spark Connect and clusters run), here in the local session, then
    the numpy fold from its checkpoint: the state says which fold made it, the other builds
    its own again once, and every table ends up the batch's."""
    job, stream, recorder, late = streaming_into(tmp_path, spark)
    monkeypatch.setattr(LagStream, "_fold_kind", staticmethod(lambda session: "spark"))
    for first in range(0, 40, 10):
        record_slice(recorder, first, first + 10, late)
        assert stream.run(PARAMS).state == "done"
    spark_state = job.load_state()["stream"]
    assert spark_state["fold"] == "spark"
    assert (tmp_path / "lag" / "_stream" / spark_state["state"] / "points.parquet").exists()
    monkeypatch.undo()
    for first in range(40, 80, 10):
        record_slice(recorder, first, first + 10, late)
        assert stream.run(PARAMS).state == "done"
    recorder.close()
    assert job.load_state()["stream"]["fold"] == "numpy"
    assert job.load_state()["stream"]["passes"] == 4, "the numpy fold built its state once, then stepped"
    batch = tmp_path / "batch"
    LagJob(tmp_path / "recordings", batch, spark=spark).run(PARAMS)
    assert_same_tables(tmp_path / "lag", batch)


def test_the_state_stays_within_its_horizon(streamed):
    import pyarrow.parquet as pq

    from dashboard.lag.stream import SAMPLES_BEFORE_MS

    state = streamed["job"].load_state()["stream"]
    assert state["fold"] == "numpy", "a local session folds the snapshots in numpy"
    base = streamed["data"] / "lag" / "_stream" / state["state"]
    assert sorted(p.stem for p in base.glob("*.parquet")) == ["events", "last_rebalance", "samples"]
    samples = pq.read_table(base / "samples.parquet").to_pandas()
    assert samples.ts.min() >= state["lower"] - SAMPLES_BEFORE_MS - 60_000
    assert pq.read_table(base / "events.parquet").to_pandas().ts.min() >= state["lower"]
    assert len(list((streamed["data"] / "lag" / "_stream").iterdir())) == 1, "old states are deleted"
    assert json.loads((streamed["data"] / "lag" / "_state.json").read_text())["stream"]["state"] == state["state"]


@pytest.mark.parametrize("crash_at", ["upserted group_windows", "state saved"])
def test_a_pass_killed_midway_loses_and_doubles_nothing(tmp_path, spark, crash_at):
    """SIGKILL in the middle of a pass (some tables upserted, or the state saved but not the
    checkpoint): the next pass starts from the last checkpoint and the tables end up exactly
    the batch's."""
    import os
    import subprocess
    import sys

    from .support import REPO

    data = tmp_path
    job, stream, recorder, late = streaming_into(data, spark)
    for first in range(0, 60, 10):
        record_slice(recorder, first, first + 10, late)
        assert stream.run(PARAMS).state == "done"
    record_slice(recorder, 60, 70, late)
    checkpoint = (data / "lag" / "_state.json").read_text()
    killed = subprocess.run([sys.executable, str(REPO / "manage.py"), "lagjob", "--stream", "--skip-checks",
                             "--master", "local[1]"], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "LAB_DATA_DIR": str(data), "LAG_STREAM_CRASH_AT": crash_at})
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert (data / "lag" / "_state.json").read_text() == checkpoint, "the killed pass checkpointed"
    for first in range(70, 100, 10):
        record_slice(recorder, first, first + 10, late)
        assert stream.run(PARAMS).state == "done"
    recorder.close()
    assert job.load_state().get("runs", 0) == 0, "the restart needed the batch"
    batch = data / "batch"
    LagJob(data / "recordings", batch, spark=spark).run(PARAMS)
    assert_same_tables(data / "lag", batch)
