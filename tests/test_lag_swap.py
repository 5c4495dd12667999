"""The lag job's output swap (dashboard/lag/swap.py): a reader never sees a partition missing."""
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from consumers_app.lab.disk import tree_bytes
from dashboard.lag import swap
from dashboard.lag.swap import swap_in

HOURS = [f"date=2026-01-01/hour={h:02d}" for h in range(3)]


def _stage(root, rels, value):
    for rel in rels:
        (root / rel).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"v": [value]}), root / rel / "part-0.parquet")


def _values(table):
    dataset = ds.dataset(table, format="parquet", partitioning="hive")
    return sorted(dataset.to_table()["hour"].to_pylist())


def test_swap_replaces_only_the_affected_partitions_and_adopts_a_plain_dir(tmp_path):
    table = tmp_path / "lag" / "t"
    _stage(table, HOURS, 1)   # history written before generations: a plain dir
    _stage(tmp_path / "staging", HOURS[1:2], 2)
    swap_in(table, tmp_path / "staging", {Path(h) for h in HOURS[1:]})
    assert table.is_symlink()
    assert _values(table) == [0, 1]   # hour 02 was recomputed to nothing
    assert pq.read_table(table / HOURS[1] / "part-0.parquet")["v"].to_pylist() == [2]
    assert pq.read_table(table / HOURS[0] / "part-0.parquet")["v"].to_pylist() == [1]


def test_a_reader_during_many_swaps_always_sees_every_partition_once(tmp_path, monkeypatch):
    # While the reader reads, retired generations stay (their grace outlasts the loop): a
    # reader sees exactly every partition, never "gone". Their deletion is checked after.
    monkeypatch.setattr(swap, "RETIRED_GRACE_S", 3600.0)
    table = tmp_path / "lag" / "t"
    _stage(tmp_path / "s0", HOURS, 0)
    swap_in(table, tmp_path / "s0", {Path(h) for h in HOURS})
    seen, done = [], threading.Event()

    def read():
        while not done.is_set():
            seen.append(_values(table))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(1, 40):
        _stage(tmp_path / f"s{i}", HOURS[2:], i)
        swap_in(table, tmp_path / f"s{i}", {Path(HOURS[2])})
    done.set()
    reader.join()
    assert seen and all(s == [0, 1, 2] for s in seen), [s for s in seen if s != [0, 1, 2]][:3]
    assert len(list((tmp_path / "lag" / swap.GENERATIONS).iterdir())) == 40
    monkeypatch.setattr(swap, "RETIRED_GRACE_S", 0.0)
    _stage(tmp_path / "s40", HOURS[2:], 40)
    swap_in(table, tmp_path / "s40", {Path(HOURS[2])})
    assert len(list((tmp_path / "lag" / swap.GENERATIONS).iterdir())) <= 2   # retired ones go
    # The disk figure counts the shared files once.
    size = sum(os.stat(p).st_blocks * 512 for p in table.rglob("*.parquet"))
    assert tree_bytes(tmp_path / "lag") <= size + 3 * 4096 * 8
