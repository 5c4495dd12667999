"""The batch job's samples as Spark sees them: sample_partials.partials() of each hour of
snapshot files, computed in Spark's Python workers (a partition per hour) when the session
is local, else in this process and handed over as one in-memory relation.

Either way Spark gets aggregate_samples()' rows - ~1.2M for 10M raw samples - instead of
scanning and shuffling every sample (bench/lag_job.py). On a cluster or over Spark
Connect the executors may not import this project, which a data source's reader needs
(the lag stream's inputs make the same choice, stream_input.py).
"""
from __future__ import annotations

import json

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from .sample_partials import PARTIALS_SCHEMA, read_partials
from .spark import runs_project_code

NAME = "lag_sample_partials"


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
    spark.dataSource.register(SamplePartials)
    return (spark.read.format(NAME).schema(_spark_schema())
            .option("hours", json.dumps(hours)).option("lo", str(lo)).option("hi", str(hi))
            .option("group", json.dumps(group)).load())


class _Hour(InputPartition):
    def __init__(self, paths: list[str]):
        super().__init__(paths)
        self.paths = paths


class SamplePartials(DataSource):
    """Options: ``hours`` (JSON list of lists of paths), ``lo``, ``hi`` (ms), ``group`` (JSON
    string or null)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return _spark_schema()

    def reader(self, schema) -> "HourReader":
        o = self.options
        return HourReader(json.loads(o["hours"]), int(o["lo"]), int(o["hi"]), json.loads(o["group"]))


class HourReader(DataSourceReader):
    def __init__(self, hours: list[list[str]], lo: int, hi: int, group: str | None):
        self.hours, self.lo, self.hi, self.group = hours, lo, hi, group

    def partitions(self):
        return [_Hour(paths) for paths in self.hours] or [_Hour([])]

    def read(self, partition: _Hour):
        yield from read_partials(partition.paths, self.lo, self.hi, self.group).to_batches()
