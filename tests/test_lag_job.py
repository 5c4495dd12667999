"""The Spark lag job, its reports and pages, on a small recorded scenario (one Spark session):
the scenario and its expected history are tests/lag_scenario.py."""
import csv
import re
import io
import json
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dashboard.lag.history import LagHistory
from dashboard.lag.job import JobParams, LagJob
from dashboard.lag.layout import list_recordings
from consumers_app.lab.recorder import EVENTS, SNAPSHOTS, Recorder
from dashboard.lag.reports import CSV_COLUMNS

from .browser import chromium, require_chromium, screenshot
from .lag_scenario import (GROUP, HANDOFF_AT, QUEUES, REWOUND, SECONDS, STALLED, T0, assert_queue_windows, expected, known,
                           queue_rows, record, to_ms)
from .support import manage_py, require, wait_until

pytestmark = pytest.mark.spark
CONTRACT = "window_start,window_end,group,topic,broker,queue_id,broker_offset,consumer_offset,lag,max_lag,time_lag_ms,owner,status"
FIRST_PHASE = 240  # seconds recorded before the first run; the rest comes before the incremental run


@pytest.fixture(scope="module")
def spark():
    from dashboard.lag.spark import get_spark

    session = get_spark("local[1]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def lag_runs(tmp_path_factory, spark):
    """Record the first 4 minutes, run the job, record the 5th, run it again; keep both states."""
    data_dir = tmp_path_factory.mktemp("lagdata")
    job = LagJob(data_dir / "recordings", data_dir / "lag", spark=spark)
    with Recorder(data_dir / "recordings") as recorder:
        record(recorder, 0, FIRST_PHASE)
    first = job.run()
    history = LagHistory(data_dir / "lag", data_dir / "recordings")
    before = {t: history._dataset(t).to_table().to_pandas() for t in ("queue_windows", "group_windows")}
    with Recorder(data_dir / "recordings") as recorder:
        record(recorder, FIRST_PHASE, SECONDS)
    second = job.run()
    return {"dir": data_dir, "job": job, "first": first, "second": second, "before": before, "history": history}


def test_the_spark_jvm_maps_the_environments_class_archive(spark):
    """make install builds Spark's class archive (dashboard/lag/class_archive.py); a session's
    JVM maps it instead of loading Spark's classes one by one."""
    from pathlib import Path

    from dashboard.lag.class_archive import archive_path

    path = archive_path()
    require(path is not None, "Spark's class archive (make install builds it)")
    jvm = spark.sparkContext._gateway.proc.pid   # spark-submit execs the JVM
    assert str(path.resolve()) in Path(f"/proc/{jvm}/maps").read_text()


def test_first_run_matches_hand_computed_history(lag_runs):
    assert lag_runs["first"].state == "done"
    assert_queue_windows(lag_runs["before"]["queue_windows"], expected(0, FIRST_PHASE))


def test_job_figures_match_hand_computed_history(lag_runs):
    expect = expected(0, SECONDS)
    h = lag_runs["history"]
    assert_queue_windows(h._dataset("queue_windows").to_table().to_pandas(), expect)

    groups = h.windows("group_windows", GROUP)
    got = {(r.res, to_ms(r.window_start)): {"lag": r.lag, "max_lag": r.max_lag, "avg_lag": pytest.approx(r.avg_lag),
                                          "p95_lag": r.p95_lag, "time_lag_ms": known(r.time_lag_ms), "status": r.status}
           for r in groups.itertuples()}
    assert got == expect["group"]

    owners = h.windows("owner_windows", GROUP)
    got = {(r.broker, int(r.queue_id), r.owner, to_ms(r.window_start)): {
        "samples": r.samples, "last_lag": r.last_lag, "max_lag": r.max_lag,
        "avg_lag": pytest.approx(r.avg_lag), "consumed": r.consumed} for r in owners.itertuples()}
    assert got == expect["owner"]
    # ownership of broker-a:3 moved from c2 to c1 at the rebalance (minute 11:00)
    assert {k[2] for k in got if k[:2] == ("broker-a", 3)} == {"c1", "c2"}

    rebalances = h.windows("rebalances", GROUP, end_col="end")
    assert [{"client_id": r.client_id, "start": to_ms(r.start), "end": to_ms(r.end), "duration_ms": r.duration_ms,
             "changed": json.loads(r.changed)}
            for r in rebalances.sort_values("client_id").itertuples()] == expect["rebalances"]

    flow = h.windows("flow_control", GROUP)
    assert {(r.res, r.client_id, r.reason, to_ms(r.window_start)): r.count for r in flow.itertuples()} == expect["flow"]


def test_stalled_queue_is_stall_and_rewound_queue_rewind(lag_runs):
    expect = expected(0, SECONDS)
    last_10s = max(ws for (res, b, q, ws) in expect["queue"] if res == "10s")
    rows = queue_rows(lag_runs["history"].windows("queue_windows", GROUP, res="10s"))
    assert rows[("10s", *STALLED, last_10s)].status == "STALL"
    assert rows[("10s", "broker-a", 0, last_10s)].status == "OK"
    rewind_at = T0 + 200_000 - 200_000 % 10_000
    assert rows[("10s", *REWOUND, rewind_at)].status == "REWIND"
    assert {r.status for k, r in rows.items() if k[1:3] == STALLED and k[3] >= T0 + 140_000} == {"STALL"}


def test_incremental_rerun_adds_only_the_new_windows(lag_runs):
    second = lag_runs["second"]
    assert second.new_files == 7  # the 5th minute: six 10-s snapshot files and one event file
    # it recomputes from one minute before the new data, not from the start
    assert second.range_ms[0] == T0 + (FIRST_PHASE - 60) * 1000
    before = lag_runs["before"]["queue_windows"]
    after = lag_runs["history"]._dataset("queue_windows").to_table().to_pandas()
    for res, per_minute in (("10s", 6), ("1m", 1)):
        assert (after.res == res).sum() == (before.res == res).sum() + len(QUEUES) * per_minute
    # windows older than the recomputed range are untouched
    cutoff = pd.Timestamp(second.range_ms[0], unit="ms", tz="UTC")
    cols = sorted(before.columns)
    old = before[before.window_start < cutoff][cols].sort_values(["res", "broker", "queue_id", "window_start"])
    kept = after[after.window_start < cutoff][cols].sort_values(["res", "broker", "queue_id", "window_start"])
    pd.testing.assert_frame_equal(old.reset_index(drop=True), kept.reset_index(drop=True))
    # and a run with nothing new does nothing
    assert lag_runs["job"].run().state == "nothing-new"


def test_targeted_rerun_of_one_group_and_range_changes_nothing_else(lag_runs):
    h = lag_runs["history"]
    before = h._dataset("queue_windows").to_table().to_pandas()
    result = lag_runs["job"].run(JobParams(since_ms=T0 + 120_000, until_ms=T0 + 180_000, group=GROUP))
    assert result.state == "done" and result.range_ms == (T0 + 120_000, T0 + 180_000)
    assert result.windows["queue_windows"] == len(QUEUES) * (6 + 1)  # that minute, recomputed
    after = h._dataset("queue_windows").to_table().to_pandas()
    order = ["res", "broker", "queue_id", "window_start"]
    pd.testing.assert_frame_equal(before.sort_values(order).reset_index(drop=True)[sorted(before.columns)],
                                  after.sort_values(order).reset_index(drop=True)[sorted(before.columns)])
    assert lag_runs["job"].load_state()["runs"] == 2  # targeted runs leave the incremental state alone


def test_a_state_naming_a_deleted_recording_runs_and_forgets_it(lag_runs):
    job = lag_runs["job"]
    state = job.load_state()
    processed = state["processed"]
    job.save_state({**state, "processed": {**processed, SNAPSHOTS: processed[SNAPSHOTS] | {
        "snapshots/date=2025-12-31/hour=08/part-30-gone.parquet"}}})   # deleted by the retention
    assert job.run().state == "nothing-new"
    assert job.load_state()["processed"] == processed


def test_recordings_deleted_before_or_while_spark_reads_them_are_skipped(spark, tmp_path):
    job = LagJob(tmp_path / "recordings", tmp_path / "lag", spark=spark)
    with Recorder(job.recordings) as recorder:
        record(recorder, 0, 180)   # minutes 10:58, 10:59, 11:00
    rels = sorted(list_recordings(job.recordings, SNAPSHOTS))
    (job.recordings / rels[0]).unlink()   # gone before the read
    snapshots = job._read(spark, SNAPSHOTS, rels, T0, T0 + 180_000, None)
    (job.recordings / rels[1]).unlink()   # gone before the scan
    assert snapshots.count() == (180 - 2 * 10) * len(QUEUES)   # two 10-s slices gone


def test_a_backfill_skips_and_names_unreadable_recordings_and_computes_the_rest(spark, tmp_path):
    """The batch on its own (no lag service set them aside first): a half-written snapshot
    file, a half-written event file and a Parquet file that is not a recording are set aside
    and named; the tables are those of the good files."""
    import shutil

    clean, broken = (LagJob(tmp_path / name / "recordings", tmp_path / name / "lag", spark=spark)
                     for name in ("clean", "broken"))
    with Recorder(clean.recordings) as recorder:
        record(recorder, 0, 120)
    shutil.copytree(clean.recordings, broken.recordings)
    bad = []
    for kind in (SNAPSHOTS, EVENTS):
        good = broken.recordings / sorted(list_recordings(broken.recordings, kind))[0]
        half = good.with_name(good.name.replace(".parquet", "-half.parquet"))
        half.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
        bad.append(half)
    stranger = bad[0].with_name(bad[0].name.replace("-half", "-stranger"))
    pq.write_table(pq.read_table(bad[0].with_name(bad[0].name.replace("-half", ""))).select(["ts"]), stranger)
    bad.append(stranger)

    assert clean.run(JobParams()).state == broken.run(JobParams()).state == "done"
    skipped = broken.load_state()["skipped"]
    assert sorted(s["file"] for s in skipped) == sorted(p.relative_to(broken.recordings).as_posix() for p in bad)
    reasons = {s["file"].rsplit("/", 1)[-1]: s["reason"] for s in skipped}
    assert "not the recorder's" in reasons[stranger.name], reasons
    assert not any(str(broken.recordings) in why for why in reasons.values()), "no path of this machine on the page"
    assert all(not p.exists() and p.with_name(f".unreadable-{p.name}").exists() for p in bad), "set aside, kept"
    for table in ("queue_windows", "group_windows", "owner_windows", "rebalances", "flow_control", "marks"):
        datasets = [LagHistory(job.out, job.recordings)._dataset(table) for job in (clean, broken)]
        rows = [df.sort_values(sorted(df.columns)).reset_index(drop=True)
                for df in (d.to_table().to_pandas() for d in datasets if d is not None)]
        assert len(rows) in (0, 2), table
        if rows:
            pd.testing.assert_frame_equal(rows[1], rows[0], obj=table)
    assert broken.run(JobParams()).state == "nothing-new", "named once, not read again"
    assert len(broken.load_state()["skipped"]) == len(bad)


def test_table_events_read_in_the_driver_are_the_scans_in_range_group_and_type(spark, tmp_path):
    """The job reads the events its tables are made of with pyarrow (many small files, few
    rows): the same rows as Spark's scan of the log filtered to those types, within the range
    and group asked; a file deleted since it was listed is skipped."""
    from dashboard.lag.event_tables import table_events

    job = LagJob(tmp_path / "recordings", tmp_path / "lag", spark=spark)
    with Recorder(job.recordings) as recorder:
        record(recorder, 0, 180)
    rels = sorted(list_recordings(job.recordings, EVENTS))

    def rows(df):
        return sorted(tuple(r) for r in df.select("ts", "type", "group", "client_id", "fields").collect())

    for lo, hi, group in ((T0, T0 + 180_000, None), (T0 + 35_000, T0 + 125_000, GROUP), (T0, T0 + 180_000, "nobody")):
        scanned = rows(table_events(job._read(spark, EVENTS, rels, lo, hi, group)))
        assert rows(job._read_table_events(spark, rels, lo, hi, group)) == scanned
        assert scanned or group == "nobody"
    everything = rows(job._read_table_events(spark, rels, T0, T0 + 180_000, None))
    assert {r[1] for r in everything} == {"rebalance", "flow_control", "fault", "handoff"}   # the scenario's
    (job.recordings / rels[0]).unlink()   # deleted by the retention since listed
    assert rows(job._read_table_events(spark, rels, T0, T0 + 180_000, None)) == \
        rows(table_events(job._read(spark, EVENTS, rels[1:], T0, T0 + 180_000, None)))


def _partial_rows(df):
    """aggregate_samples()' rows as comparable tuples (a window's lags sorted: their order is
    not defined)."""
    rows = []
    for r in df.collect():
        d = r.asDict(recursive=True)
        d["lags"] = sorted(d["lags"]) if d["lags"] is not None else None
        rows.append(tuple(sorted((k, repr(v)) for k, v in d.items())))
    return sorted(rows)


def test_samples_reduced_as_they_are_read_are_sparks_aggregate_of_the_scan(spark, tmp_path):
    """The job reduces the snapshots to aggregate_samples()' rows where it reads them
    (sample_partials.py, in Spark's Python workers): the same rows as Spark's aggregation of
    the scanned samples, for the scenario (an hour boundary, owners changing, an unknown store
    time) and for rows a recording may hold: a queue sampled twice at one ts, an owner that
    comes back within its minute, nulls, no commit yet - within the range and group asked."""
    import pyarrow as pa

    from consumers_app.lab.recorder import SNAPSHOT_SCHEMA, write_part
    from dashboard.lag.partials_source import sample_partials
    from dashboard.lag.sample_partials import by_hour
    from dashboard.lag.snapshot_tables import aggregate_samples

    job = LagJob(tmp_path / "recordings", tmp_path / "lag", spark=spark)
    with Recorder(job.recordings) as recorder:
        record(recorder, 0, 180)
    base = {"group": "G2", "topic": "T", "broker": "b", "queue_id": 0, "broker_min_offset": 5,
            "broker_max_offset": 100, "consumer_offset": 40, "owner": "c1", "cached_count": 0, "cached_bytes": 0,
            "inflight": 0, "oldest_unconsumed_store_ts": T0 - 5_000}
    odd = [
        {"ts": T0 + 1_000}, {"ts": T0 + 1_000, "consumer_offset": 50},            # a tie: the greater is last
        {"ts": T0 + 1_000, "oldest_unconsumed_store_ts": -1},                     # ... and an unknown time lag first
        {"ts": T0 + 2_000, "owner": "c2"}, {"ts": T0 + 3_000, "owner": None}, {"ts": T0 + 4_000},  # c1 back
        {"ts": T0 + 5_000, "consumer_offset": -1}, {"ts": T0 + 6_000, "consumer_offset": -1, "broker_min_offset": None},
        {"ts": T0 + 7_000, "consumer_offset": None}, {"ts": T0 + 8_000, "broker_max_offset": None},
        {"ts": T0 + 9_000, "oldest_unconsumed_store_ts": None}, {"ts": T0 + 9_500, "oldest_unconsumed_store_ts": 0},
        {"ts": T0 + 11_000, "queue_id": 1, "group": None}, {"ts": T0 + 12_000, "broker_max_offset": 10},
    ]
    write_part(job.recordings, SNAPSHOTS, T0, pa.Table.from_pylist([{**base, **o} for o in odd], schema=SNAPSHOT_SCHEMA))
    rels = sorted(list_recordings(job.recordings, SNAPSHOTS))
    hours = by_hour(rels, job.recordings)
    assert len(hours) == 2   # 10:58-10:59 and 11:00
    for lo, hi, group in ((T0, T0 + 180_000, None), (T0 + 35_000, T0 + 125_000, GROUP), (T0, T0 + 60_000, "G2"),
                          (T0, T0 + 180_000, "nobody")):
        scanned = _partial_rows(aggregate_samples(job._read(spark, SNAPSHOTS, rels, lo, hi, group)))
        assert _partial_rows(sample_partials(spark, hours, lo, hi, group)) == scanned
        assert scanned or group == "nobody"


def _status_walks(seconds: int = 900) -> list[dict]:
    """Snapshot rows of queues whose offsets walk into every status and every time-lag case:
    steady with catch-ups, a stall, a stop, a rewind, falling behind, missing windows (gaps of
    exactly and more than two windows), an unknown or no store time, no or a null commit."""
    import numpy as np

    rng = np.random.default_rng(7)
    rows = []
    for q, mode in enumerate(["steady", "stall", "stop", "rewind", "behind", "gaps", "unknown", "nulls"]):
        top = co = 0
        for s in range(seconds):
            top += int(rng.integers(0, 12))
            if mode == "stop" and s > 40:
                pass
            elif mode == "stall" and 100 <= s < 400:
                pass
            elif mode == "behind":
                co += 2
            elif mode == "rewind" and s >= 400:
                co = max(0, co - 500) if s == 400 else co + 3   # back, then on from there
            elif rng.random() < 0.05:
                co = top                                   # caught up: lag 0
            else:
                co = max(co, top - int(rng.integers(0, 40)))
            if mode == "gaps" and ((s // 10) % 9 == 4 or 120 <= s < 180 or 600 <= s < 640 or 710 <= s < 729):
                continue
            oldest = T0 + s * 1000 - int(rng.integers(0, 5000))
            if mode == "unknown":
                oldest = -1 if (s // 30) % 3 == 0 else (0 if (s // 30) % 3 == 1 else oldest)
            committed = co
            if mode == "nulls":
                committed = -1 if s < 25 else (None if s % 17 == 0 else co)
            rows.append({"ts": T0 + s * 1000, "group": "W", "topic": "T", "broker": "b", "queue_id": q,
                         "broker_min_offset": 0, "broker_max_offset": top, "consumer_offset": committed,
                         "owner": f"c{(s // 200 + q) % 3}", "cached_count": 0, "cached_bytes": 0, "inflight": 0,
                         "oldest_unconsumed_store_ts": oldest})
    return rows


def test_snapshot_tables_made_by_the_hour_in_numpy_are_sparks_functions_rows(spark, tmp_path):
    """A local session makes the queue, owner and group windows an hour at a time in numpy
    and writes them from its Python workers (hour_tables.py): the same rows, statuses and
    end-of-window time lags as snapshot_tables' Spark functions over the whole range (what a
    Spark Connect session or a cluster runs), for default and other status thresholds,
    across an hour boundary (11:00, with a queue silent for the minute after it) and for one
    group of two."""
    import pyarrow as pa

    from consumers_app.lab.recorder import SNAPSHOT_SCHEMA, write_part
    from dashboard.lag.hour_tables import TABLE_SCHEMAS, stage_hour_tables
    from dashboard.lag.partials_source import sample_partials
    from dashboard.lag.plan import plan_run
    from dashboard.lag.sample_partials import by_hour
    from dashboard.lag.snapshot_tables import (QUEUE_KEYS, compute_owner_windows, compute_queue_windows,
                                               group_windows_from, per_ts_rows, queue_points)
    from dashboard.lag.table_columns import in_range

    recordings = tmp_path / "recordings"
    rows = _status_walks()
    rows += [{**r, "group": "W2", "queue_id": r["queue_id"] + 100} for r in rows if r["queue_id"] in (0, 2)]
    for minute in range(0, 900, 60):
        part = [r for r in rows if T0 + minute * 1000 <= r["ts"] < T0 + (minute + 60) * 1000]
        write_part(recordings, SNAPSHOTS, T0 + minute * 1000, pa.Table.from_pylist(part, schema=SNAPSHOT_SCHEMA))
    files = {SNAPSHOTS: list_recordings(recordings, SNAPSHOTS), EVENTS: {}}

    def table(df):
        return sorted(tuple(sorted((k, repr(v)) for k, v in r.asDict().items())) for r in df.collect())

    for params in ({}, {"status_window_ms": 30_000, "stop_after_ms": 120_000}, {"group": "W2"}):
        # a cut range (10:59-11:12): the windows before and after are not emitted
        p = JobParams(since_ms=T0 + 60_000, until_ms=T0 + 840_000, **params)
        plan = plan_run(files, {SNAPSHOTS: set(), EVENTS: set()}, p)
        assert len(plan.chunks) == 2
        windows = in_range(*plan.range_ms)
        samples = sample_partials(spark, by_hour(plan.to_read[SNAPSHOTS], recordings), *plan.read_ms,
                                  p.group).repartition(*QUEUE_KEYS)
        queue_windows = compute_queue_windows(queue_points(samples, p)).filter(windows)
        expected = {"queue_windows": queue_windows, "owner_windows": compute_owner_windows(samples).filter(windows),
                    "group_windows": group_windows_from(per_ts_rows(samples), queue_windows).filter(windows)}
        staging = tmp_path / f"staging-{len(params)}{p.group}"
        made = stage_hour_tables(spark, plan.chunks, recordings, tmp_path / "lag", staging, p.group,
                                 p.status_window_ms, p.stop_after_ms)
        for name in TABLE_SCHEMAS:
            written = spark.read.parquet(str(staging / name))
            assert sorted(written.columns) == sorted(expected[name].columns), name
            assert table(written) == table(expected[name]), name
            assert made[name] == written.count()
        # one file per partition: the hour's (10:59) and the next's (11:00-11:12)
        assert sorted(f.parent.name for f in (staging / "owner_windows").glob("**/*.parquet")) == ["hour=10", "hour=11"]
        queues = [dict(r) for r in table(expected["queue_windows"])]
        assert {r["group"] for r in queues} == ({repr("W2")} if p.group else {repr("W"), repr("W2")})
        if p.group is None:
            assert {r["status"] for r in queues} == {repr(s) for s in ("OK", "WARN", "STALL", "STOP", "REWIND")}
            assert repr(None) in [r["time_lag_ms"] for r in queues] and repr(0) in [r["time_lag_ms"] for r in queues]


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark):
    """A local session's Python workers run dashboard/lag/python_daemon.py: PySpark from the
    installed (compiled) package, not from the pyspark.zip Spark puts first on their path."""
    import pyarrow as pa

    def where(batches):
        import pyspark
        import pyspark.worker

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [pyspark.worker.__file__], "daemon": [sys.argv[0]]})

    found = spark.range(1).mapInArrow(where, "file string, daemon string").collect()[0]
    assert "pyspark.zip" not in found["file"] and found["file"].endswith("worker.py"), found
    assert found["daemon"].endswith("python_daemon.py"), found


def _report(client, fmt, **params):
    return client.get(f"/reports/lag.{fmt}", {"group": GROUP, **params})


@pytest.fixture
def web(lag_runs, settings, client):
    settings.DATA_DIR = lag_runs["dir"]
    settings.DASHBOARD_PUBLIC_READ = True
    return client


def test_csv_report_columns_and_rows(web):
    response = _report(web, "csv", **{"from": "2026-01-01T10:59:00Z", "to": "2026-01-01T11:01:00Z"})
    assert response.status_code == 200
    text = response.content.decode()
    assert text.split("\n")[0].startswith(CONTRACT + ",")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2 * len(QUEUES)  # two 1-minute windows per queue
    row = next(r for r in rows if (r["broker"], r["queue_id"]) == ("broker-b", "3") and r["window_start"] == "2026-01-01T11:00:00Z")
    e = expected(0, SECONDS)["queue"][("1m", "broker-b", 3, T0 + 120_000)]
    assert row["window_end"] == "2026-01-01T11:01:00Z"
    assert (int(row["lag"]), int(row["max_lag"]), int(row["time_lag_ms"]), row["owner"], row["status"]) == (
        e["lag"], e["max_lag"], e["time_lag_ms"], e["owner"], "STALL")
    assert int(row["broker_offset"]) - int(row["consumer_offset"]) == int(row["lag"])


def test_a_time_lag_not_known_stays_unknown_in_every_format(web):
    """broker-b:2's store time is not known at t=150..169 s: its windows there carry no time
    lag (an empty CSV cell, null in JSON), not a reassuring 0; its lag is still there."""
    window = {"from": "2026-01-01T11:00:30Z", "to": "2026-01-01T11:00:40Z", "res": "10s"}
    rows = list(csv.DictReader(io.StringIO(_report(web, "csv", **window).content.decode())))
    row = next(r for r in rows if (r["broker"], r["queue_id"]) == ("broker-b", "2"))
    assert (row["time_lag_ms"], row["max_time_lag_ms"]) == ("", "") and int(row["lag"]) > 0
    assert all(r["time_lag_ms"].isdigit() for r in rows if r is not row), "every other queue's is known"
    body = json.loads(_report(web, "json", **window).content)
    got = next(r for r in body["rows"] if (r["broker"], r["queue_id"]) == ("broker-b", 2))
    assert got["time_lag_ms"] is None
    data = web.get("/history/data.json", {"group": GROUP, **window}).json()
    assert data["queues"]["broker-b:2"]["time_lag_ms"] == [None]


def test_parquet_json_and_html_reports(web):
    response = _report(web, "parquet")
    assert response.status_code == 200
    table = pq.read_table(io.BytesIO(response.content))
    assert table.column_names[:len(CSV_COLUMNS)] == CSV_COLUMNS
    assert table.num_rows == len(QUEUES) * 5
    assert str(table.schema.field("window_start").type) == "timestamp[ms, tz=UTC]"

    body = _report(web, "json").json()
    assert body["columns"][:len(CSV_COLUMNS)] == CSV_COLUMNS and len(body["rows"]) == len(QUEUES) * 5
    stalled = next(q for q in body["queues"] if (q["broker"], q["queue_id"]) == STALLED)
    assert stalled["last_status"] == "STALL"
    assert {o["owner"] for o in body["owners"]} == {"c1", "c2", "c3"}

    html = _report(web, "html").content.decode()
    assert '<script src="http' not in html and "Plotly.newPlot" in html  # nothing fetched: opens offline
    assert len(html) > 3_000_000  # plotly.js itself is inlined
    assert "Lag per queue" in html and "Status per queue" in html
    assert "strategy AVG_BY_CIRCLE" in html   # the switch is marked and listed
    lags = [r["lag"] for r in body["rows"] if (r["broker"], r["queue_id"]) == STALLED]
    assert json.dumps(lags).replace(" ", "") in html.replace(" ", "")  # the chart's data


def test_history_page_and_data(web):
    assert web.get("/history/").status_code == 200
    groups = web.get("/history/groups.json").json()
    assert [g["group"] for g in groups["groups"]] == [GROUP]
    data = web.get("/history/data.json", {"group": GROUP}).json()
    assert data["res"] == "10s" and len(data["queues"]) == len(QUEUES)
    assert data["queues"]["broker-b:3"]["status"][-1] == "STALL"
    assert [r["client_id"] for r in data["rebalances"]] == ["c1", "c2"]
    assert len(data["flow_control"]) == 2


def test_marks_hold_faults_and_the_latest_figures_of_each_hand_off(lag_runs):
    marks = lag_runs["history"].windows("marks", GROUP, end_col="window_start")
    faults = marks[marks.kind == "fault"]
    assert [(r.name, r.client_id, to_ms(r.window_start), json.loads(r.detail)["strategy"]) for r in faults.itertuples()] == [
        ("strategy", "c1", T0 + 60_300, "AVG_BY_CIRCLE")]
    handoffs = marks[marks.kind == "handoff"]
    assert {(r.name, r.client_id, to_ms(r.window_start)): json.loads(r.detail)["duplicates"] for r in handoffs.itertuples()} == {
        ("broker-b:2", "c2", HANDOFF_AT): 12, ("broker-b:3", "c2", HANDOFF_AT): 3}


def test_history_data_marks_the_switch(web):
    data = web.get("/history/data.json", {"group": GROUP}).json()
    assert [(m["kind"], m["name"]) for m in data["marks"] if m["kind"] == "fault"] == [("fault", "strategy")]


A_RANGE = {"a_from": "2026-01-01T10:58:00Z", "a_to": "2026-01-01T11:00:00Z"}
B_RANGE = {"b_from": "2026-01-01T11:00:00Z", "b_to": "2026-01-01T11:03:00Z"}


def test_two_ranges_side_by_side_in_every_format(web):
    body = web.get("/reports/compare.json", {"group": GROUP, **A_RANGE, **B_RANGE}).json()
    a, b = body["ranges"]
    expect = expected(0, SECONDS)["group"]
    in_range = lambda lo, hi: [v for (res, ws), v in expect.items() if res == "10s" and lo <= ws < hi]  # noqa: E731
    for r, (lo, hi) in ((a, (T0, T0 + 120_000)), (b, (T0 + 120_000, T0 + 300_000))):
        windows = in_range(lo, hi)
        assert r["windows"] == len(windows)
        assert r["lag_max"] == max(w["max_lag"] for w in windows)
        assert r["lag_avg"] == pytest.approx(sum(w["avg_lag"] for w in windows) / len(windows), abs=1e-3)
    assert (a["strategy_switches"], a["faults"], a["rebalances"], a["queues_moved"], a["duplicates"]) == (1, 1, 0, 0, 0)
    assert (b["strategy_switches"], b["rebalances"], b["queues_moved"], b["duplicates"]) == (0, 2, 2, 15)

    text = web.get("/reports/compare.csv", {"group": GROUP, **A_RANGE, **B_RANGE}).content.decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["range"] for r in rows] == ["a", "b"] and rows[1]["duplicates"] == "15"
    table = pq.read_table(io.BytesIO(web.get("/reports/compare.parquet", {"group": GROUP, **A_RANGE, **B_RANGE}).content))
    assert table.num_rows == 2 and table.column("queues_moved").to_pylist() == [0, 2]
    html = web.get("/reports/compare.html", {"group": GROUP, **A_RANGE, **B_RANGE}).content.decode()
    assert "Range comparison" in html and "messages consumed twice" in html


@pytest.mark.browser
def test_the_history_page_compares_around_the_last_switch_in_a_browser(lag_runs, live_server, settings):
    """Debian's chromium on the history page: the switch is drawn, and "around the last
    switch" fills both ranges and shows them side by side (the same figures as the report).
    Its own chromium, closed within the test: Playwright's sync API keeps an event loop
    running in this thread, and Django refuses database work (the test database's flush at
    teardown) while it does."""
    from playwright.sync_api import expect

    require_chromium()
    settings.DATA_DIR = lag_runs["dir"]
    settings.DASHBOARD_PUBLIC_READ = True
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{live_server.url}/history/")
        page.wait_for_function("() => document.querySelector('#chart-queue-lag .main-svg') !== null", timeout=30_000)
        expect(page.locator("#chart-queue-lag")).to_contain_text("strategy AVG_BY_CIRCLE")
        page.click("#h-around-switch")
        table = page.locator('#h-compare-result [data-role="compare"]')
        expect(table).to_be_visible(timeout=15_000)
        expect(page.locator("#h-a-to")).to_have_value(re.compile(r"^2026-01-01T10:59(:00)?$"))   # the switch's second
        report = web_compare(live_server.url, page)
        b = report["ranges"][1]
        for figure in ("queues_moved", "duplicates", "strategy_switches"):
            expect(table.locator(f'tr[data-figure="{figure}"] td[data-range="b"]')).to_have_text(str(b[figure]))
        assert (b["queues_moved"], b["duplicates"], b["strategy_switches"]) == (2, 15, 1)
        screenshot(page, "history-compare", full_page=True)
        page.close()
        assert errors == []


def web_compare(base: str, page) -> dict:
    """The JSON report for the ranges the page's form holds (its own link)."""
    href = page.locator('.compare-downloads a[data-fmt="json"]').get_attribute("href")
    return page.evaluate("async (url) => (await fetch(url)).json()", base + href)


@pytest.mark.parametrize("params, needle", [
    ({"group": GROUP, **A_RANGE}, "range b needs both b_from and b_to"),
    ({"group": "nope", **A_RANGE, **B_RANGE}, "unknown group"),
    ({"group": GROUP, **A_RANGE, "b_from": "2026-01-01T11:03:00Z", "b_to": "2026-01-01T11:00:00Z"}, "must be before"),
    ({"group": GROUP, **A_RANGE, **B_RANGE, "c_from": "x"}, "unknown parameter(s): c_from"),
])
def test_a_bad_comparison_is_a_400_with_its_reason(web, params, needle):
    response = web.get("/reports/compare.csv", params)
    assert response.status_code == 400 and needle in response.json()["error"]


@pytest.mark.parametrize("fmt,params,needle", [
    ("csv", {"group": "nope"}, "unknown group"),
    ("csv", {"group": GROUP, "from": "2026-01-01T11:00:00Z", "to": "2026-01-01T10:00:00Z"}, "after"),
    ("csv", {"group": GROUP, "from": "yesterday"}, "ISO-8601"),
    ("xlsx", {"group": GROUP}, "unknown format"),
])
def test_bad_report_parameters_are_400(web, fmt, params, needle):
    response = web.get(f"/reports/lag.{fmt}", params)
    assert response.status_code == 400
    assert needle in response.json()["error"]
    assert web.get("/history/data.json", params if fmt == "csv" else {"group": "nope"}).status_code == 400


def test_lagreport_command(lag_runs, settings, tmp_path):
    settings.DATA_DIR = lag_runs["dir"]
    out = tmp_path / "lag.csv"
    call_command("lagreport", "--group", GROUP, "--res", "10s", "--format", "csv", "-o", str(out), "--no-job")
    lines = out.read_text().splitlines()
    assert lines[0].startswith(CONTRACT) and len(lines) == 1 + len(QUEUES) * 30
    for args in (["--group", "nope"], ["--group", GROUP, "--from", "2026-01-02", "--to", "2026-01-01"],
                 ["--group", GROUP, "--format", "xlsx"], ["--group", GROUP, "--to", "soon"]):
        bad = tmp_path / "bad.csv"
        with pytest.raises(CommandError) as error:
            call_command("lagreport", *args, "-o", str(bad))
        assert error.value.returncode == 2 and not bad.exists()


def test_lagreport_exit_code_2_from_the_command_line(lag_runs, tmp_path):
    proc = manage_py("lagreport", "--group", "nope", "--format", "csv", "-o", str(tmp_path / "x.csv"),
                     env={"LAB_DATA_DIR": str(lag_runs["dir"])})
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "unknown group" in output
    assert not (tmp_path / "x.csv").exists()


def test_lagjob_bad_dates_exit_2(lag_runs, settings):
    settings.DATA_DIR = lag_runs["dir"]
    for args in (["--since", "noon"], ["--since", "2026-01-02", "--until", "2026-01-01"]):
        with pytest.raises(CommandError) as error:
            call_command("lagjob", *args)
        assert error.value.returncode == 2


@pytest.mark.django_db
def test_job_button_needs_a_user_and_reports_progress(lag_runs, settings, client, django_user_model):
    settings.DATA_DIR = lag_runs["dir"]
    assert client.post("/history/job/").status_code == 401
    assert client.get("/history/job/").status_code == 401  # reading needs a login too
    user = django_user_model.objects.create_user("lag", password="x")
    client.force_login(user)
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/history/job/").status_code == 403  # no CSRF token
    response = client.post("/history/job/")
    assert response.status_code == 202 and response.json()["state"] == "running"
    # everything is processed already: the job process finds nothing new and ends quickly
    status = wait_until(lambda: (s := client.get("/history/job/").json())["state"] != "running" and s,
                        timeout=120, message="the lag job process to finish")
    assert status["state"] == "done", status
    assert status["result"]["state"] == "nothing-new" and status["done"] == status["total"] > 0
    assert "progress 0/9 plan" in (lag_runs["dir"] / "lag" / "_job.log").read_text()
