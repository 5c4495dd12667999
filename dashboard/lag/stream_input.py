"""The lag stream's inputs as a Spark data source whose files are chosen at run time.

A stream pass is the same query every time over different files: the new recording
slices and the state the last pass saved. Built with ordinary leaves (file scans, or
in-memory relations), Spark analyses and optimises the whole plan again each pass - most
of what a pass cost (bench/lag_stream_pass.py, JFR). With this source as the leaves, the
plan is built once: each leaf reads, when the query runs, the files a small manifest
(``_stream_inputs.json``, written by the pass before it runs the query) lists for its table.
stream.py runs the one physical plan again each pass (only where that is safe: a plan
without exchanges, whose output a second run would otherwise reuse).

A state table's entry may name a column and a lower bound (``{"files": [...], "column":
"ws", "from": ms}``): only its rows from there are read (stream.Cuts).

The reader runs in a Spark Python worker (the same interpreter: get_spark sets it); it
reads each listed Parquet file with pyarrow and hands its rows over as Arrow batches in
the leaf's schema. A file deleted since it was listed (the retention) is skipped, as the
batch job's reads skip it.
"""
from __future__ import annotations

import gc
import json

from pyspark.sql.datasource import DataSource, DataSourceReader

NAME = "lag_stream_input"

_frozen = False


def _freeze_once() -> None:
    """A reused Python worker runs gc.collect() after every task it serves (PySpark's
    daemon): with PySpark, pyarrow and pandas loaded that is a full collection over their
    ~10^6 objects each time - ~20 per pass, most of a pass's worker CPU (py-spy). The
    objects alive once the worker is set up (its modules) are moved out of the collector's
    view; what a read allocates is still collected."""
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True


class LagStreamInput(DataSource):
    """Options: ``manifest`` (path of the JSON table -> files), ``table``, ``schema`` (a
    Spark schema as JSON)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema) -> "ManifestReader":
        return ManifestReader(self.options["manifest"], self.options["table"], schema)


class ManifestReader(DataSourceReader):
    def __init__(self, manifest: str, table: str, schema):
        self.manifest, self.table, self.schema = manifest, table, schema

    def read(self, partition):
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        _freeze_once()
        with open(self.manifest) as f:
            entry = json.load(f).get(self.table, [])
        if isinstance(entry, list):
            entry = {"files": entry}
        target = to_arrow_schema(self.schema, timezone="UTC")
        for path in entry["files"]:
            try:
                rows = pq.read_table(path, columns=target.names)
            except FileNotFoundError:
                continue
            yield from cut_rows(rows, entry.get("column"), entry.get("from")).cast(target).to_batches()


def cut_rows(table, column: str | None, since: int | None):
    """``table``'s rows whose ``column`` (an ms count) is at least ``since`` (all without
    one): a state table from where a pass starts reading it (stream.Cuts)."""
    import pyarrow.compute as pc

    if column is None or since is None:
        return table
    return table.filter(pc.greater_equal(table[column], since))
