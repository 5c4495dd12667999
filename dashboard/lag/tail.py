"""The lag history's tail: the recent hour partitions the lag stream keeps up to date.

Every table (``<lag>/<table>``, layout.py) has a tail, ``<lag>/_tail/<table>``, with
the same ``[res=/]date=/hour=`` partitions. The stream (stream.py) upserts the rows each pass
computes into the tail's partitions - a row replaces the row with the same key (``KEYS``) -
and once an hour can no longer change (it ended more than the stream's horizon ago) the
stream *seals* it: the partition moves into the table and leaves the tail. The batch job
writes the table and takes the partitions it rewrote out of the tail.

Readers see one table (``effective_files``): a partition in the tail hides the table's
partition of the same hour. Each step is one swap (swap.py) of one side, ordered so that a
reader never sees an hour missing or doubled: sealing first swaps the hour into the table
(still hidden by the tail), then out of the tail.

Upserts run in the lag service's Python process with pyarrow (no Spark job): a pass's rows
are small, and a partition is one file.
"""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .swap import swap_in

TAIL = "_tail"
HOUR_MS = 3_600_000

# table -> the columns that identify a row (besides its res/date/hour partition)
KEYS = {
    "queue_windows": ["group", "topic", "broker", "queue_id", "window_start"],
    "group_windows": ["group", "window_start"],
    "owner_windows": ["group", "topic", "broker", "queue_id", "owner", "window_start"],
    "rebalances": ["group", "client_id", "window_start", "end"],
    "flow_control": ["group", "client_id", "reason", "window_start"],
    # A fault is its event (two faults may share a time); a hand-off is its key, its
    # figures (detail) are what an upsert replaces.
    "marks": ["group", "client_id", "kind", "name", "window_start", "_fault_detail"],
}


def tail_of(out: Path, table: str) -> Path:
    return Path(out) / TAIL / table


def partition_rel(row_res: str | None, date: str, hour: str) -> Path:
    rel = Path(f"date={date}") / f"hour={hour}"
    return Path(f"res={row_res}") / rel if row_res else rel


def partitions(base: Path) -> set[Path]:
    """Relative ``[res=/]date=/hour=`` dirs under ``base`` that hold Parquet files."""
    if not base.is_dir():
        return set()
    return {f.parent.relative_to(base) for f in base.glob("**/hour=*/*.parquet")}


def effective_files(out: Path, table: str) -> tuple[list[str], list[str]]:
    """(table files, tail files) a reader should read: the table's files of hours the tail
    does not hold, and every tail file."""
    main, tail = Path(out) / table, tail_of(out, table)
    # Resolved once: the table and the tail are symlinks that a swap may repoint meanwhile.
    main_root = main.resolve() if main.exists() else None
    tail_root = tail.resolve() if tail.exists() else None
    tail_files = sorted(str(f) for f in tail_root.glob("**/hour=*/*.parquet")) if tail_root else []
    hidden = {Path(f).parent.relative_to(tail_root) for f in tail_files}
    main_files = []
    if main_root is not None:
        main_files = sorted(str(f) for f in main_root.glob("**/hour=*/*.parquet")
                            if f.parent.relative_to(main_root) not in hidden)
    return main_files, tail_files


def _key(table: pa.Table, name: str) -> pa.Array:
    """One string per row made of its key columns (nulls included), for set membership."""
    parts = []
    for column in KEYS[name]:
        if column == "_fault_detail":
            values = pc.if_else(pc.equal(table["kind"], "fault"), table["detail"], pa.scalar("", pa.string()))
        else:
            values = table[column]
            if pa.types.is_timestamp(values.type):
                values = pc.cast(values, pa.int64())
            values = pc.cast(values, pa.string())
        parts.append(pc.fill_null(values, "\u0000"))
    return pc.binary_join_element_wise(*parts, "\u0001")


def read_partition(directory: Path, schema: pa.Schema) -> pa.Table | None:
    """A partition dir's rows in ``schema`` (None without a Parquet file)."""
    files = sorted(directory.glob("*.parquet")) if directory.is_dir() else []
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f).select(schema.names).cast(schema) for f in files])


def current_partition(out: Path, name: str, rel: Path, schema: pa.Schema) -> pa.Table | None:
    """Partition ``rel`` of table ``name`` as readers see it (effective_files): the tail's
    rows, else the table's; None if neither has a file."""
    rows = read_partition(tail_of(out, name) / rel, schema)
    return rows if rows is not None else read_partition(Path(out) / name / rel, schema)


def upsert(out: Path, name: str, rows: pa.Table, part_cols: list[str]) -> int:
    """Merge ``rows`` (with ``part_cols`` columns: [res,] date, hour) into the tail of table
    ``name``: per partition, the current rows (the tail's, else the table's) less those with
    a key in ``rows``, plus ``rows``; one swap of the tail. Returns the partitions written."""
    if rows.num_rows == 0:
        return 0
    out = Path(out)
    data_cols = sorted(c for c in rows.column_names if c not in part_cols)
    schema = rows.select(data_cols).schema
    tail = tail_of(out, name)
    staging = out / TAIL / f".staging-{name}-{uuid.uuid4().hex}"
    groups = rows.group_by(part_cols).aggregate([]).to_pylist()
    written = set()
    try:
        for values in groups:
            rel = partition_rel(values.get("res"), values["date"], values["hour"])
            mask = None
            for col in part_cols:
                eq = pc.equal(rows[col], values[col])
                mask = eq if mask is None else pc.and_(mask, eq)
            new = rows.filter(mask).select(data_cols)
            current = current_partition(out, name, rel, schema)
            if current is not None and current.num_rows:
                kept = current.filter(pc.invert(pc.is_in(_key(current, name), value_set=_key(new, name))))
                new = pa.concat_tables([kept, new])
            (staging / rel).mkdir(parents=True, exist_ok=True)
            pq.write_table(new, staging / rel / f"part-{uuid.uuid4().hex}.parquet", compression="zstd")
            written.add(rel)
        swap_in(tail, staging, written)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return len(written)


def drop(out: Path, name: str, rels: set[Path]) -> None:
    """Take partitions out of the tail (the table's own rows show again)."""
    tail = tail_of(out, name)
    present = {rel for rel in rels if (tail / rel).is_dir()}
    if present:
        empty = Path(out) / TAIL / f".empty-{uuid.uuid4().hex}"
        swap_in(tail, empty, present)


def seal(out: Path, name: str, before_ms: int) -> list[Path]:
    """Move the tail's hours that ended at or before ``before_ms`` into the table; returns them."""
    from datetime import datetime, timezone

    tail, main = tail_of(out, name), Path(out) / name
    done = []
    for rel in sorted(partitions(tail)):
        date, hour = rel.parts[-2][len("date="):], rel.parts[-1][len("hour="):]
        start = datetime.strptime(f"{date} {hour}", "%Y-%m-%d %H").replace(tzinfo=timezone.utc)
        if int(start.timestamp() * 1000) + HOUR_MS <= before_ms:
            done.append(rel)
    if not done:
        return []
    staging = Path(out) / TAIL / f".sealing-{name}-{uuid.uuid4().hex}"
    try:
        for rel in done:
            (staging / rel).mkdir(parents=True)
            for f in (tail / rel).glob("*.parquet"):
                shutil.copyfile(f, staging / rel / f.name)
        swap_in(main, staging, set(done))   # still hidden by the tail's copy
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    drop(out, name, set(done))
    return done


def dataset(out: Path, name: str, partitioning) -> ds.Dataset | None:
    """One pyarrow dataset of table ``name`` as readers see it (see effective_files)."""
    main_files, tail_files = effective_files(out, name)
    sources = [(root, files) for root, files in ((Path(out) / name, main_files), (tail_of(out, name), tail_files))
               if files]
    if not sources:
        return None

    def part(root: Path, files: list[str], schema=None):
        return ds.dataset(files, format="parquet", partitioning=partitioning, schema=schema,
                          partition_base_dir=str(root.resolve()))

    if len(sources) == 1:
        return part(*sources[0])
    # The tail's files come from the stream's Arrow rows, the table's from Spark's writer:
    # same columns and types, other nullability flags - read both as nullable.
    first = part(*sources[0])
    schema = pa.schema([f.with_nullable(True) for f in first.schema])
    return ds.dataset([part(root, files, schema) for root, files in sources])
