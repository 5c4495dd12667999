"""sample_partials: the snapshots reduced to aggregate_samples()' rows in pyarrow, checked
against hand-computed values (the comparison with Spark's own aggregation is in
tests/test_lag_job.py)."""
import pyarrow as pa

from consumers_app.lab.recorder import SNAPSHOT_SCHEMA, SNAPSHOTS, write_part
from dashboard.lag.layout import list_recordings
from dashboard.lag.sample_partials import PARTIALS_SCHEMA, by_hour, partials, read_partials

T0 = 1_767_225_600_000   # 2026-01-01T00:00:00Z


def snapshots(*rows) -> pa.Table:
    base = {"group": "G", "topic": "T", "broker": "b", "queue_id": 0, "broker_min_offset": 0,
            "broker_max_offset": 100, "consumer_offset": 60, "owner": "c1", "cached_count": 0, "cached_bytes": 0,
            "inflight": 0, "oldest_unconsumed_store_ts": T0 - 1_000}
    return pa.Table.from_pylist([{**base, **row} for row in rows], schema=SNAPSHOT_SCHEMA)


def of_kind(table: pa.Table, kind: str) -> list[dict]:
    return sorted((r for r in table.to_pylist() if r["_kind"] == kind),
                  key=lambda r: (r["group"] or "", r["queue_id"] or 0, r["ws"] or r["ts"], r["owner"] or ""))


def test_a_queue_window_holds_its_last_and_first_sample_and_every_lag():
    out = partials(snapshots({"ts": T0 + 1_000}, {"ts": T0 + 5_000, "consumer_offset": 90},
                             {"ts": T0 + 3_000, "consumer_offset": -1, "broker_min_offset": 30},
                             {"ts": T0 + 12_000}))
    assert out.schema == PARTIALS_SCHEMA
    first, second = of_kind(out, "q")
    assert first["ws"] == T0 and second["ws"] == T0 + 10_000
    # lags: 100-60, without a commit 100-30 (max - min), 100-90
    assert sorted(first["lags"]) == [10, 40, 70] and first["max_lag"] == 70 and first["sum_lag"] == 120
    assert first["samples"] == 3
    assert first["last"] == {"ts": T0 + 5_000, "broker_min_offset": 0, "broker_max_offset": 100,
                             "consumer_offset": 90, "lag": 10, "owner": "c1", "time_lag": 6_000}
    assert first["first"] == {"ts": T0 + 1_000, "time_lag": 2_000}
    assert first["max_time_lag_ms"] == 6_000


def test_time_lag_is_zero_without_lag_unknown_without_a_store_time_and_never_negative():
    out = partials(snapshots({"ts": T0, "consumer_offset": 100},                       # no lag
                             {"ts": T0 + 1_000, "oldest_unconsumed_store_ts": -1},    # not known
                             {"ts": T0 + 2_000, "oldest_unconsumed_store_ts": T0 + 9_000},   # a clock ahead
                             {"ts": T0 + 3_000, "oldest_unconsumed_store_ts": 0}))    # nothing unconsumed
    [window] = of_kind(out, "q")
    assert window["first"] == {"ts": T0, "time_lag": 0}
    assert window["last"]["time_lag"] == 0 and window["max_time_lag_ms"] == 0
    unknown_only = of_kind(partials(snapshots({"ts": T0, "oldest_unconsumed_store_ts": -1})), "q")[0]
    assert unknown_only["first"]["time_lag"] is None and unknown_only["max_time_lag_ms"] is None


def test_a_tie_at_one_ts_orders_as_spark_orders_the_sample_struct():
    out = partials(snapshots({"ts": T0, "consumer_offset": 50}, {"ts": T0, "consumer_offset": 70},
                             {"ts": T0, "consumer_offset": 60, "oldest_unconsumed_store_ts": -1}))
    [window] = of_kind(out, "q")
    assert window["last"]["consumer_offset"] == 70          # the greatest struct
    assert window["first"] == {"ts": T0, "time_lag": None}  # the least (ts, time_lag): null first


def test_an_owner_back_within_its_minute_is_one_row_of_its_samples():
    out = partials(snapshots({"ts": T0 + 1_000}, {"ts": T0 + 2_000, "owner": "c2"}, {"ts": T0 + 3_000, "owner": None},
                             {"ts": T0 + 4_000, "consumer_offset": 70}, {"ts": T0 + 61_000, "consumer_offset": -1}))
    rows = {(r["ws"], r["owner"]): r for r in of_kind(out, "o")}
    assert set(rows) == {(T0, "c1"), (T0, "c2"), (T0, None), (T0 + 60_000, "c1")}
    c1 = rows[(T0, "c1")]
    assert (c1["samples"], c1["owned_from_ms"], c1["owned_to_ms"]) == (2, T0 + 1_000, T0 + 4_000)
    assert (c1["last_lag"], c1["sum_lag"], c1["max_lag"]) == (30, 70, 40)
    assert (c1["min_committed"], c1["max_committed"]) == (60, 70)
    no_commit = rows[(T0 + 60_000, "c1")]
    assert no_commit["min_committed"] is None and no_commit["max_committed"] is None


def test_rows_without_a_ts_are_left_out_as_sparks_range_filter_leaves_them():
    assert partials(snapshots({"ts": None})).num_rows == 0
    assert [r["ts"] for r in of_kind(partials(snapshots({"ts": None}, {"ts": T0})), "g")] == [T0]


def test_a_groups_lag_per_ts_sums_its_queues():
    out = partials(snapshots({"ts": T0, "queue_id": 0}, {"ts": T0, "queue_id": 1, "owner": None,
                                                         "oldest_unconsumed_store_ts": -1},
                             {"ts": T0, "group": "H"}))
    rows = {r["group"]: r for r in of_kind(out, "g")}
    assert (rows["G"]["lag"], rows["G"]["queues"], rows["G"]["owned"], rows["G"]["max_time_lag_ms"]) == (80, 2, 1, 1_000)
    assert (rows["H"]["lag"], rows["H"]["queues"]) == (40, 1)


def test_files_are_read_by_hour_cut_to_the_range_and_group_and_a_deleted_one_is_skipped(tmp_path):
    for minute in (0, 1, 60):
        ts = T0 + minute * 60_000
        write_part(tmp_path, SNAPSHOTS, ts, snapshots({"ts": ts}, {"ts": ts + 1_000, "group": "H"}))
    rels = sorted(list_recordings(tmp_path, SNAPSHOTS))
    hours = by_hour(rels, tmp_path)
    assert [len(paths) for paths in hours] == [2, 1]
    out = read_partials(hours[0], T0, T0 + 60_000, "G")
    assert [r["ts"] for r in of_kind(out, "g")] == [T0]
    (tmp_path / rels[0]).unlink()
    assert read_partials(hours[0], T0, T0 + 60_000, "G").num_rows == 0
    assert read_partials([], T0, T0 + 1, None).schema == PARTIALS_SCHEMA
