"""The samples as a Spark DataFrame of sample_partials.partials() rows, for a session whose
executors may not import this project (Spark Connect, a cluster: spark.runs_project_code):
each hour of snapshot files is reduced in this process and handed to Spark as one
in-memory relation - ~1.2M rows for 10M raw samples - instead of Spark scanning and
shuffling every sample (bench/lag_job.py). snapshot_tables' functions make the tables of
it. A local session makes the tables themselves in its Python workers (hour_tables.py).
"""
from __future__ import annotations

from .sample_partials import PARTIALS_SCHEMA, read_partials


def sample_partials(spark, hours: list[list[str]], lo: int, hi: int, group: str | None):
    """A DataFrame of aggregate_samples()' rows for snapshot files grouped by hour
    (sample_partials.by_hour), their samples cut to [lo, hi) and ``group``."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    table = pa.concat_tables([read_partials(paths, lo, hi, group) for paths in hours]) if hours \
        else PARTIALS_SCHEMA.empty_table()
    return spark.createDataFrame(table, schema=from_arrow_schema(PARTIALS_SCHEMA))
