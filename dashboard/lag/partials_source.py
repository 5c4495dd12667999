"""The batch job's samples as Spark sees them: sample_partials.partials() of each hour of
snapshot files, computed in Spark's Python workers (``mapInArrow`` over one row per hour:
its files' paths) when the session is local, else in this process and handed over as one
in-memory relation.

Either way Spark gets aggregate_samples()' rows - ~1.2M for 10M raw samples - instead of
scanning and shuffling every sample (bench/lag_job.py). ``mapInArrow`` rather than a Python
data source: a data source is looked up, created and planned by three more Python daemons,
each importing pyspark anew from the pyspark.zip on its path (no bytecode cache there),
~2 s of a fresh session's wall. On a cluster or over Spark Connect the executors may not
import this project (the lag stream's inputs make the same choice, stream_input.py).
"""
from __future__ import annotations

from .sample_partials import PARTIALS_SCHEMA, read_partials
from .spark import runs_project_code


def _spark_schema():
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(PARTIALS_SCHEMA)


def sample_partials(spark, hours: list[list[str]], lo: int, hi: int, group: str | None):
    """A DataFrame of aggregate_samples()' rows for snapshot files grouped by hour
    (sample_partials.by_hour), their samples cut to [lo, hi) and ``group``."""
    if not runs_project_code(spark):
        import pyarrow as pa

        table = pa.concat_tables([read_partials(paths, lo, hi, group) for paths in hours]) if hours \
            else PARTIALS_SCHEMA.empty_table()
        return spark.createDataFrame(table, schema=_spark_schema())
    # One row per hour (its paths), reduced by mapInArrow in Spark's Python workers.
    listing = spark.createDataFrame([(paths,) for paths in hours] or [([],)], "paths array<string>")

    def reduce_hours(batches):
        for batch in batches:
            for paths in batch.column(0).to_pylist():
                yield from read_partials(paths, lo, hi, group).to_batches()

    return listing.mapInArrow(reduce_hours, _spark_schema())
