"""The lag recorder (Parquet per 10-s slice named by its minute, bounded memory, flush on close), and the rows of one offset poll."""
import json

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from consumers_app.events import make_event
from consumers_app.lab.recorder import Recorder, snapshot_rows
from consumers_app.message_queue import MessageQueue

T0 = 1_767_265_080_000  # 2026-01-01T10:58:00Z


def _row(ts, qid=0, **extra):
    return {"ts": ts, "group": "G", "topic": "T", "broker": "broker-a", "queue_id": qid, "broker_min_offset": 0,
            "broker_max_offset": 10, "consumer_offset": 5, "owner": "c1", **extra}


def _files(root, kind):
    return sorted(p.relative_to(root).as_posix() for p in (root / kind).rglob("*") if p.is_file())


def test_files_roll_every_ten_seconds_named_by_minute_in_date_hour_partitions(tmp_path):
    recorder = Recorder(tmp_path)
    recorder.add_snapshot([_row(T0 + s * 1000, q) for s in range(10) for q in range(2)])  # 10:58:00-09
    recorder.add_event(make_event("membership", "G", "c1", ts=T0 + 9_500))
    assert _files(tmp_path, "snapshots") == []  # the slice is still open
    recorder.add_snapshot([_row(T0 + 10_000)])  # 10:58:10 starts: 10:58:00-10 is written, events too
    assert len(files := _files(tmp_path, "snapshots")) == 1
    assert files[0].startswith("snapshots/date=2026-01-01/hour=10/part-58-") and files[0].endswith(".parquet")
    assert len(_files(tmp_path, "events")) == 1  # rolled by the snapshots' later slice
    recorder.add_snapshot([_row(T0 + s * 1000) for s in range(20, 61)])  # up to 10:59:00
    assert len(_files(tmp_path, "snapshots")) == 6  # 10:58:00, :10, :20, :30, :40, :50
    recorder.add_snapshot([_row(T0 + 120_000)])  # 11:00, the next hour
    recorder.close()  # writes 11:00
    names = _files(tmp_path, "snapshots")
    assert [n.split("/")[2] + "/" + n.split("/")[3][:7] for n in names].count("hour=10/part-58") == 6
    assert [n.split("/")[2] + "/" + n.split("/")[3][:7] for n in names][-2:] == ["hour=10/part-59", "hour=11/part-00"]
    table = ds.dataset(tmp_path / "snapshots", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 20 + 1 + 41 + 1
    assert table.column("cached_count").to_pylist()[0] == 0  # defaults filled
    assert not list(tmp_path.rglob(".*.tmp"))  # written under a dot-name, then renamed


def test_memory_is_bounded_and_events_keep_their_fields(tmp_path):
    recorder = Recorder(tmp_path, max_rows=100)
    recorder.add_snapshot([_row(T0 + i, i % 8) for i in range(250)])  # one minute, 250 rows
    assert len(_files(tmp_path, "snapshots")) == 1  # a full buffer is written before the minute ends
    recorder.add_event(make_event("rebalance", "G", "c1", ts=T0 + 5, topic="T", phase="end", duration_ms=12,
                                  added=[MessageQueue("T", "broker-a", 1)], removed=[]))
    recorder.close()
    assert sum(pq.read_metadata(tmp_path / f).num_rows for f in _files(tmp_path, "snapshots")) == 250
    [event_file] = _files(tmp_path, "events")
    row = pq.read_table(tmp_path / event_file).to_pylist()[0]
    assert (row["ts"], row["type"], row["group"], row["client_id"]) == (T0 + 5, "rebalance", "G", "c1")
    assert json.loads(row["fields"]) == {"topic": "T", "phase": "end", "reason": "", "strategy": "", "duration_ms": 12,
                                         "added": ["broker-a:1"], "removed": []}


def test_sampler_rows_keep_the_groups_topics_and_merge_consumer_state():
    from consumers_app.protocol import lab

    queues = [lab.QueueOffsets(queue=lab.QueueRef(topic="T", broker_name="broker-a", queue_id=i), min_offset=0,
                               max_offset=10, committed_offset=4 if i == 0 else -1) for i in range(2)]
    queues.append(lab.QueueOffsets(queue=lab.QueueRef(topic="Other", broker_name="broker-a", queue_id=0),
                                   max_offset=7, committed_offset=-1))
    rows = snapshot_rows("G", 99, queues, {"broker-a:1": {"owner": "c2", "cached_count": 3, "cached_bytes": 9}})
    assert [(r["topic"], r["queue_id"], r["consumer_offset"], r["owner"], r["cached_count"]) for r in rows] == [
        ("T", 0, 4, None, 0), ("T", 1, -1, "c2", 3)]


def test_with_its_tick_a_slice_is_written_at_its_last_tick_and_late_events_in_one_more_file(tmp_path):
    from consumers_app.events import event_from_dict

    t0 = 1_767_265_080_000   # a minute's start
    recorder = Recorder(tmp_path, tick_ms=1000)

    def files():
        return sorted(tmp_path.rglob("*.parquet"))

    for second in range(10):
        recorder.add_snapshot([{"ts": t0 + second * 1000 + 5, "group": "G", "topic": "T", "broker": "b",
                                "queue_id": 0, "broker_min_offset": 0, "broker_max_offset": 1, "consumer_offset": 0}])
        if second == 8:
            assert files() == [], "not before its last tick"
    assert len(files()) == 1, "the slice's snapshots, right after its last tick"
    for k in range(3):   # events of the slice's last second, after its file
        recorder.add_event(event_from_dict({"ts": t0 + 9_300 + k * 200, "type": "fault", "group": "G",
                                            "client_id": "c", "fault": "x"}))
    assert len(files()) == 1, "they wait for the roll"
    recorder.add_snapshot([{"ts": t0 + 10_005, "group": "G", "topic": "T", "broker": "b", "queue_id": 0,
                            "broker_min_offset": 0, "broker_max_offset": 1, "consumer_offset": 0}])
    assert len(files()) == 2, "one more file for all three"
    # Events of that slice that reach the lab after the next one began: one more file at the
    # next slice's last tick, not one each.
    recorder.add_events([event_from_dict({"ts": t0 + 9_500 + k, "type": "fault", "group": "G", "client_id": "c",
                                          "fault": "late"}) for k in range(2)])
    recorder.add_event(event_from_dict({"ts": t0 + 9_900, "type": "fault", "group": "G", "client_id": "c",
                                        "fault": "late"}))
    assert len(files()) == 2, "late rows wait for the next roll"
    for second in range(1, 10):
        recorder.add_snapshot([{"ts": t0 + 10_005 + second * 1000, "group": "G", "topic": "T", "broker": "b",
                                "queue_id": 0, "broker_min_offset": 0, "broker_max_offset": 1, "consumer_offset": 0}])
    assert len(files()) == 4, "the next slice's snapshots and one file of the three late events"
    late = [f for f in files() if pq.read_table(f).num_rows == 3 and "late" in str(pq.read_table(f)["fields"])]
    assert len(late) == 1
    recorder.close()
