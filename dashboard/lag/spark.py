"""The one place a SparkSession is made for the lag job.

* ``SPARK_REMOTE`` (e.g. ``sc://spark-connect:15002``) -> a Spark Connect session (the
  ``pyspark[connect]`` extra: grpcio, grpcio-status, zstandard, ...);
* else ``SPARK_MASTER`` (e.g. ``spark://host:7077``) or the ``master`` argument;
* else ``local[*]``.

The job uses the DataFrame API only (no SparkContext, RDDs or UDFs), so the same code runs
in all three. Offline by construction: no ``spark.jars.packages``, nothing is fetched at
run time. The UI and the console progress bar are off, logging is errors-only, the session
time zone is UTC. Over Connect only the ``spark.sql.*`` settings apply (the server owns the
rest). With a cluster or a Connect server, ``LAB_DATA_DIR`` must be on storage that every
executor (and the Connect server) sees at the same path as this process: the job reads
and writes plain paths, and renames the staged output itself.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from . import class_archive

_LOG4J = Path(__file__).resolve().parent / "log4j2.properties"
_PROJECT = Path(__file__).resolve().parents[2]
BATCH_JAVA_OPTS = "-XX:+UseParallelGC"

BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Small data per stage: a few shuffle partitions beat the default 200.
    "spark.sql.shuffle.partitions": os.environ.get("LAG_SPARK_SHUFFLE_PARTITIONS", "8"),
    # No adaptive execution: a cached plan run adaptively loses its output partitioning, so
    # every use of the job's cached 10-s points (partitioned by queue) shuffled them again;
    # with a few shuffle partitions on a few cores its coalescing buys nothing. (The lag
    # service's passes run without it too: lagservice.PASS_CONF.)
    "spark.sql.adaptive.enabled": "false",
    # collect_list per window keeps one small array per key: stay hash-based (the default
    # 128 keys falls back to a sort-based aggregation several times slower here).
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1000000",
    # The job's cached intermediates (samples, points, windows: a few hundred MB at 10M rows)
    # are read back once or twice: building the compressed columns (dictionary and run-length
    # statistics per column) cost ~10 % of a 10M-row backfill's CPU (JFR), more than it saves.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # The job reads a list of part files (hundreds; one per 10 s): list them on the driver, not
    # with a Spark job per read (the default above 32 paths; ~6 s for 650 local files).
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    # Partition values (date=..., hour=...) stay strings, as written.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.parquet.compression.codec": "zstd",
    # Standard Parquet timestamps (not INT96): pyarrow/pandas read them as UTC timestamps.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # PySpark otherwise records the Python call site of every column function for error
    # messages: three JVM round trips and a stack walk per call, thousands per plan - most of
    # what building a lag-stream pass's plan cost (bench/lag_stream_pass.py).
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # The JVM talks to its Python workers (the lag stream's input source) over a Unix socket,
    # not loopback TCP: each leaf's small request/answer exchange stalled ~90 ms on TCP
    # (both sides waiting, py-spy and jstack); a 64 x 256 stream pass went 2.1 -> 0.7 s wall.
    "spark.python.unix.domain.socket.enabled": "true",
    # Arrow batches between the JVM and Python (a lag-stream pass's toArrow of its rows, the
    # stream's input source) cut by rows only (maxRecordsPerBatch): below INT_MAX, Spark sizes
    # the batch being built after every row it adds (~4 % of a backfill's task samples when
    # the job's partials went through it, JFR; without it a default lab's stream pass cost
    # ~0.13 s more CPU: 8.6-9.2 -> 10.4-10.6 % of a core, bench/lag_service_cost.py).
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
}


# Spark's expressions interpreted, not compiled to Java per plan: a plan over few rows spends
# more compiling its generated code (Janino, then the JIT) than running it. The lag service's
# passes always run so; a batch run below INTERPRETED_BELOW_ROWS snapshot rows too (one new
# minute with its look-back, 123k rows: 14.7-16.6 -> 13.1-13.7 s in a fresh JVM, 6.5 -> 5.2 s in
# a warm one; at 1M rows it is even, 17.2 / 18.3 s, and 10M rows take 63 s interpreted against
# 42 s: bench/lag_job.py).
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
INTERPRETED_BELOW_ROWS = 500_000


@contextlib.contextmanager
def execution_mode(session, rows: int):
    """Run the block interpreted (INTERPRETED) if it reads fewer than INTERPRETED_BELOW_ROWS
    rows, else with generated code; the session's own settings come back after it (the lag
    service's batch fallback runs in the service's session). A Spark Connect server keeps
    its own settings."""
    if is_connect(session):
        yield
        return
    wanted = INTERPRETED if rows < INTERPRETED_BELOW_ROWS else {key: None for key in INTERPRETED}
    before = {key: session.conf.get(key, None) for key in wanted}
    _set_confs(session, wanted)
    try:
        yield
    finally:
        _set_confs(session, before)


def _set_confs(session, values: dict) -> None:
    """Set each key, or unset it (Spark's default) where the value is None."""
    for key, value in values.items():
        if value is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, value)


def is_connect(session) -> bool:
    """A Spark Connect session (pyspark.sql.connect), not a classic one with a local JVM."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def runs_project_code(session) -> bool:
    """Whether the session's Python workers import this project (a local classic session:
    get_spark gives them this interpreter and path); a Connect server's or a cluster's
    executors may not, so this project's Python code runs inside Spark only here (the
    stream's input source, the batch's mapInArrow)."""
    return not is_connect(session) and session.sparkContext.master.startswith("local")


def spark_schema(arrow_schema):
    """The Spark schema of a recordings' Arrow schema (recorder.py: int64, int32, string)."""
    from pyspark.sql import types as T

    kinds = {"int64": T.LongType(), "int32": T.IntegerType(), "string": T.StringType()}
    return T.StructType([T.StructField(f.name, kinds[str(f.type)], True) for f in arrow_schema])


def get_spark(master: str | None = None, app_name: str = "rebalance-lab-lag"):
    """A SparkSession configured for the lag job (reuses the active one if any)."""
    from pyspark.sql import SparkSession

    remote = os.environ.get("SPARK_REMOTE")
    builder = SparkSession.builder.appName(app_name)
    if remote:
        builder = builder.remote(remote)
        for key, value in BASE_CONF.items():
            if key.startswith("spark.sql."):  # only runtime SQL confs can be set over Connect
                builder = builder.config(key, value)
        return builder.getOrCreate()

    java_opts = f"-Dlog4j2.configurationFile=file:{_LOG4J} -Dlog4j.configurationFile=file:{_LOG4J}"
    # The lag service sets its small-JVM flags (lagservice.SERVICE_JAVA_OPTS); a backfill is a
    # batch job, so the throughput collector (10M rows: 50 -> 47 s against G1 on 2 cores).
    java_opts += " " + os.environ.get("LAG_SPARK_EXTRA_JAVA_OPTS", BATCH_JAVA_OPTS)
    # Spark's classes mapped from this environment's archive, not loaded one by one (class_archive.py).
    java_opts = f"{java_opts} {class_archive.java_options()}".rstrip()
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    builder = builder.master(master)
    for key, value in BASE_CONF.items():
        builder = builder.config(key, value)
    if master.startswith("local"):   # (a cluster's executors may not import this project)
        builder = builder.config("spark.python.daemon.module", "dashboard.lag.python_daemon")
    builder = (builder
               .config("spark.driver.memory", os.environ.get("LAG_SPARK_DRIVER_MEMORY", "2g"))
               .config("spark.driver.extraJavaOptions", java_opts)
               .config("spark.executor.extraJavaOptions", java_opts))
    # Python workers (the lag stream's input source, stream_input.py) run this interpreter
    # and import this project.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(_PROJECT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_PROJECT)] + [p for p in paths if p])
    # Keep PySpark's own launcher quiet too (it prints the "default log level" banner).
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options '{java_opts}' pyspark-shell")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _look_up_jvm_functions_once()
    return spark


_jvm_members: dict = {}


def _look_up_jvm_functions_once() -> None:
    """Classic PySpark finds ``org.apache.spark.sql.functions``, and the function on it, anew
    for every column function it builds: two py4j round trips before the call itself (and for
    the short name ``functions``, failed class loads through every jar). Building a lag-stream
    pass's plan made ~2,800 round trips, half of them these lookups (bench/lag_stream_pass.py,
    cProfile + JFR). The members are static: look each up once per gateway."""
    try:
        from pyspark.sql.classic import column
        from pyspark.sql.functions import builtin
        from pyspark.sql.utils import enum_to_value, get_active_spark_context
    except ImportError:   # another PySpark layout: keep its own lookups
        return
    if getattr(builtin._get_jvm_function, "looks_up_once", False):
        return

    def function(name: str, sc):
        client = sc._gateway._gateway_client
        found = _jvm_members.get(name)
        if found is None or found[0] is not client:
            found = _jvm_members[name] = (client, getattr(getattr(sc._jvm, "org.apache.spark.sql.functions"), name))
        return found[1]

    def column_from_name(name: str):
        return function("col", get_active_spark_context())(name)

    def column_from_literal(literal):
        return function("lit", get_active_spark_context())(enum_to_value(literal))

    function.looks_up_once = True
    builtin._get_jvm_function = function
    column._create_column_from_name = column_from_name
    column._create_column_from_literal = column_from_literal
