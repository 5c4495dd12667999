"""The lag history's tables made of the offset snapshots (Spark DataFrame functions, no
Python UDFs): per queue, per group and per owner, in windows.

* ``queue_windows`` (res 10s, 1m) - per group/topic/broker/queue: ``broker_offset`` (max
  offset), ``consumer_offset`` and ``lag`` of the last sample, ``max_lag``, ``avg_lag``,
  ``p95_lag`` over the window's samples, ``time_lag_ms`` at the window end and
  ``max_time_lag_ms``, ``owner`` of the last sample, ``status`` (status.py).
* ``group_windows`` (res 10s, 1m) - per group: the group's lag is the sum of its queues'
  lags at each sample ts; last/max/avg/p95 of it; ``time_lag_ms`` = the worst queue's;
  ``status`` = the worst queue's.
* ``owner_windows`` (1m) - lag attributed to each owner over the samples in which it
  owned each queue: samples, owned_from/owned_to, last/avg/max lag, messages consumed.

Definitions: ``lag = broker_max_offset - consumer_offset``; when the group has no commit
on the queue (``consumer_offset < 0``) it is ``broker_max_offset - broker_min_offset``;
never below 0. Time lag of a sample = ``ts - oldest_unconsumed_store_ts`` when there is
lag and a store time; 0 with no lag or nothing unconsumed (store time 0); unknown (null)
when the store time is not known (-1: an attached cluster's probe has not answered). At a
window end it is interpolated linearly between the window's last sample and the next
sample (not across a gap > 2 windows, nor towards an unknown one).
p95 is exact: the smallest sample v with at least 95 % of the window's samples <= v (a
sorted array per window - at most a minute of samples; percentile_approx is no cheaper,
being an object aggregate too, and the minute's p95 needs the raw values anyway).

Cost: aggregate_samples() scans the samples and shuffles them by queue once (no partial
aggregation: the lag arrays are cheaper to build in one final aggregation), then aggregates
off that one (reused) shuffle per queue and 10 s (last and first samples as struct extrema, the lags as an array), per
queue/owner/minute and per group and sample ts (the group's sums: no second scan). The batch
job gets the same rows reduced as the files are read (sample_partials.py) and shuffles only
those by queue - or, in a local session, makes all three tables of them in numpy, an hour at
a time (hour_tables.py); the stream runs aggregate_samples over each slice. The
later steps group and window per queue (the status rules with O(1)-per-point window
functions, status.py). The 1-minute queue windows are merged up from the 10-s rows (last
of last, max of max, sums, the arrays concatenated for p95). The lag stream (stream.py)
runs the same functions over its state and each new slice.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import status as status_rules
from .layout import MINUTE, RESOLUTIONS
from .table_columns import with_partitions

if TYPE_CHECKING:
    from .job import JobParams

QUEUE_KEYS = ["group", "topic", "broker", "queue_id"]
# A queue's 10-s point besides its keys and ``ws`` (aggregate_samples' "q" rows).
POINT_COLUMNS = ["last", "first", "max_lag", "sum_lag", "samples", "lags", "max_time_lag_ms"]


def enrich(snapshots):
    """Add ``lag`` and the sample's ``time_lag`` (see the module doc)."""
    from pyspark.sql import functions as F

    co = F.col("consumer_offset")
    base = F.when(co < 0, F.col("broker_min_offset")).otherwise(co)
    lag = F.greatest(F.lit(0).cast("long"), F.col("broker_max_offset") - base)
    oldest = F.col("oldest_unconsumed_store_ts")
    zero = F.lit(0).cast("long")
    # As the live page (consumers_app.lab.state.time_lag_ms): not known stays not known (null;
    # maxima skip it), never a reassuring 0.
    time_lag = (F.when((lag == 0) | (oldest == 0), zero)
                .when(oldest < 0, F.lit(None).cast("long"))
                .otherwise(F.greatest(zero, F.col("ts") - oldest)))
    return snapshots.withColumns({"lag": lag, "time_lag": time_lag})


def aggregate_samples(snapshots, shuffle: bool = True):
    """The one pass over the raw samples, three aggregates of the same rows: per queue and
    10-s window (``_kind`` "q"), per queue, owner and minute ("o") and per group and sample
    ts ("g": the group's lag, the sum of its queues', and how many queues).

    Everything windowed per queue is merged up from the "q" rows (exact p95 included: the
    window's lags are carried as an array); the owner windows are the "o" rows, the group
    windows are made of the "g" rows. One plan (a union) so the samples are scanned and
    shuffled once for all three. ``shuffle=False`` for samples already in one partition (a
    stream pass's)."""
    from pyspark.sql import functions as F

    # Shuffle the (projected) samples by queue once, before aggregating: every later step
    # (the 1 min merge, the status and time-lag windows) groups or partitions by queue, so
    # the rows stay where they are from here on; and the lag arrays are built in one
    # final aggregation, without a partial one (ObjectHashAggregate's partial buffers and
    # their serialization cost more than shuffling the raw columns).
    raw = snapshots.select("ts", *QUEUE_KEYS, "owner", "broker_min_offset", "broker_max_offset",
                           "consumer_offset", "oldest_unconsumed_store_ts")
    if shuffle:
        raw = raw.repartition(*QUEUE_KEYS)
    s = enrich(raw)
    ts = F.col("ts")
    # The window's last and first samples as the max and min of a struct led by ts (ties
    # broken by the following fields, so deterministic): in this object aggregation (the lag
    # array) every function is interpreted, and two struct extrema cost less than eight
    # max_by/min_by (10M rows: ~1 s less).
    last_fields = ["broker_min_offset", "broker_max_offset", "consumer_offset", "lag", "owner", "time_lag"]
    queue = s.groupBy(*QUEUE_KEYS, (ts - ts % 10_000).alias("ws")).agg(
        F.max(F.struct("ts", *last_fields)).alias("last"), F.min(F.struct("ts", "time_lag")).alias("first"),
        F.max("lag").alias("max_lag"), F.sum("lag").alias("sum_lag"), F.count("*").alias("samples"),
        F.collect_list("lag").alias("lags"), F.max("time_lag").alias("max_time_lag_ms"),
    )
    # Every struct field nullable (``lag`` is not, as computed): the stream reads its state
    # back through Arrow, which rejects a non-nullable field under a null struct.
    last_type = ",".join(f"{c}:{'string' if c == 'owner' else 'bigint'}" for c in ["ts", *last_fields])
    last = F.col("last").cast(f"struct<{last_type}>")
    queue = queue.select(F.lit("q").alias("_kind"), *QUEUE_KEYS, "ws", last.alias("last"), "first",
                         "max_lag", "sum_lag", "samples", "lags", "max_time_lag_ms")
    committed = F.when(F.col("consumer_offset") >= 0, F.col("consumer_offset"))
    # Same input columns and no filter before the aggregation, so every branch sits on one
    # (reused) exchange: compute_owner_windows drops the null owners afterwards, and
    # max_time_lag_ms (unused) keeps oldest_unconsumed_store_ts in this branch's input.
    owner = s.groupBy(*QUEUE_KEYS, "owner", (ts - ts % MINUTE).alias("ws")).agg(
        F.count("*").alias("samples"), F.min("ts").alias("owned_from_ms"), F.max("ts").alias("owned_to_ms"),
        F.max_by("lag", "ts").alias("last_lag"), F.sum("lag").alias("sum_lag"), F.max("lag").alias("max_lag"),
        F.min(committed).alias("min_committed"), F.max(committed).alias("max_committed"),
        F.max("time_lag").alias("max_time_lag_ms"),
    ).withColumn("_kind", F.lit("o"))
    # The group's sums off the same exchange: no second scan of the samples (grouped by
    # group and ts, they shuffle again, but as one partial sum per ts and partition). Its
    # unused max_time_lag_ms and owned keep the branch's input the exchange's columns.
    per_ts = s.groupBy("group", "ts").agg(
        F.sum("lag").alias("lag"), F.count("*").alias("queues"),
        F.max("time_lag").alias("max_time_lag_ms"), F.count("owner").alias("owned"),
    ).withColumn("_kind", F.lit("g"))
    return (queue.unionByName(owner, allowMissingColumns=True)
            .unionByName(per_ts, allowMissingColumns=True))


def per_ts_rows(samples):
    """aggregate_samples()'s "g" rows: a group's lag at each sample ts (the sum of its
    queues' lags) and how many queues."""
    from pyspark.sql import functions as F

    return samples.filter(F.col("_kind") == "g").select("group", "ts", "lag", "queues")


def p95(lags):
    """Exact p95 of an array: the smallest v with at least 95 % of the values <= v."""
    from pyspark.sql import functions as F

    # sort_array, not array_sort: array_sort evaluates a comparator lambda per comparison
    # (interpreted), sort_array compares natively - several times cheaper on 1M+ arrays.
    return F.element_at(F.sort_array(lags), F.greatest(F.lit(1), F.ceil(F.size(lags) * 0.95).cast("int")))


def merge_windows(rows, res_ms: int, *extra):
    """Merge per-queue rows carrying last/first samples, sums and lag arrays into windows of ``res_ms``."""
    from pyspark.sql import functions as F

    return (rows.withColumn("ws", F.col("ws") - F.col("ws") % res_ms)
            .groupBy(*QUEUE_KEYS, "ws").agg(
                F.max("last").alias("last"),     # structs led by ts (aggregate_samples)
                F.min("first").alias("first"),
                F.max("max_lag").alias("max_lag"),
                F.sum("sum_lag").alias("sum_lag"),
                F.sum("samples").alias("samples"),
                F.flatten(F.collect_list("lags")).alias("lags"),
                F.max("max_time_lag_ms").alias("max_time_lag_ms"),
                *extra))


def queue_points(samples, p: "JobParams", carried: bool = False):
    """Per queue and 10-s window: aggregate_samples()'s "q" rows plus ``status``
    (status.py), still carrying what the 1-minute windows are merged from. ``carried``:
    the rows hold status.CARRIED from an earlier evaluation (the lag stream's state)."""
    from pyspark.sql import functions as F

    columns = [*QUEUE_KEYS, "ws", *POINT_COLUMNS] + (list(status_rules.CARRIED) if carried else [])
    ten = samples.filter(F.col("_kind") == "q").select(*columns)
    ten = ten.withColumns({"consumer_offset": F.col("last.consumer_offset"), "lag": F.col("last.lag")})
    return status_rules.add_status(ten, QUEUE_KEYS, p.status_window_ms, p.stop_after_ms, carried=carried)


def compute_queue_windows(points):
    """One row per queue per window at both resolutions, from queue_points()'s rows.

    A minute takes the status of its last 10-s window."""
    from pyspark.sql import functions as F

    minute = merge_windows(points, 60_000, F.max_by("status", "last.ts").alias("status"))
    return (_queue_output(points, 10_000, "10s")
            .unionByName(_queue_output(minute, 60_000, "1m")))


def _queue_output(agg, res_ms: int, res: str):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Time lag at the window end, interpolated towards the next window's first sample.
    ordered = Window.partitionBy(*QUEUE_KEYS).orderBy("ws")
    next_ts = F.lead("first.ts").over(ordered)
    next_tl = F.lead("first.time_lag").over(ordered)
    last_ts, last_tl = F.col("last.ts"), F.col("last.time_lag")
    end = F.col("ws") + F.lit(res_ms)
    interpolated = last_tl + (next_tl - last_tl) * (end - last_ts) / (next_ts - last_ts)
    time_lag_end = (F.when(next_tl.isNotNull() & (next_ts - last_ts <= 2 * res_ms),
                           F.round(interpolated).cast("long")).otherwise(last_tl))
    out = agg.select(
        *QUEUE_KEYS, "ws",
        F.col("last.broker_min_offset").alias("broker_min_offset"),
        F.col("last.broker_max_offset").alias("broker_offset"),
        F.col("last.consumer_offset").alias("consumer_offset"),
        F.col("last.lag").alias("lag"),
        "max_lag", (F.col("sum_lag") / F.col("samples")).alias("avg_lag"), p95(F.col("lags")).alias("p95_lag"),
        # (not greatest(0, ...): it would turn an unknown time lag into 0)
        F.when(time_lag_end < 0, F.lit(0).cast("long")).otherwise(time_lag_end).alias("time_lag_ms"),
        "max_time_lag_ms",
        F.col("last.owner").alias("owner"), "samples", "status",
    )
    return with_partitions(out, res_ms=res_ms, res=res)


def group_windows_from(per_ts, queue_windows, one_partition: bool = False):
    """Group windows from per_ts_rows() (a group's lag at each sample ts) and the same
    windows' queue rows.
    ``one_partition`` for rows already in one partition (a stream pass's): every step
    stays in it, without an exchange."""
    from pyspark.sql import functions as F

    frames = []
    for res, res_ms in RESOLUTIONS.items():
        w = per_ts.withColumn("ws", F.col("ts") - F.col("ts") % res_ms)
        agg = w.groupBy("group", "ws").agg(
            F.max_by(F.struct("lag", "queues"), "ts").alias("last"),
            F.max("lag").alias("max_lag"), F.avg("lag").alias("avg_lag"),
            p95(F.collect_list("lag")).alias("p95_lag"),
        ).select("group", "ws", F.col("last.lag").alias("lag"), F.col("last.queues").alias("queues"),
                 "max_lag", "avg_lag", "p95_lag")
        frames.append(with_partitions(agg, res_ms=res_ms, res=res))
    windows = frames[0].unionByName(frames[1])
    if one_partition:
        queue_windows = queue_windows.coalesce(1)
    order = F.array(*map(F.lit, status_rules.STATUS_ORDER))
    keys = ["group", "res", "window_start"]
    from_queues = queue_windows.groupBy(*keys).agg(
        F.max("time_lag_ms").alias("time_lag_ms"), F.max("max_time_lag_ms").alias("max_time_lag_ms"),
        F.max(F.array_position(order, F.col("status"))).alias("_rank"),
        *[F.sum((F.col("status") == s_).cast("int")).alias(f"queues_{s_.lower()}") for s_ in status_rules.STATUS_ORDER],
    ).withColumn("status", F.element_at(order, F.col("_rank").cast("int"))).drop("_rank")
    # windows LEFT JOIN from_queues USING (keys), as one aggregation: each side has one row
    # per key and its own columns. (A join shuffles even two one-partition sides on string
    # keys; the stream's plan must have no exchange to be run again - stream.py.)
    left = [c for c in windows.columns if c not in keys]
    right = [c for c in from_queues.columns if c not in keys]
    both = windows.withColumn("_window", F.lit(True)).unionByName(from_queues, allowMissingColumns=True)
    if one_partition:
        both = both.coalesce(1)
    merged = both.groupBy(*keys).agg(*[F.first(c, ignorenulls=True).alias(c) for c in left + right],
                                     F.max("_window").alias("_window"))
    return merged.filter(F.col("_window")).select(*keys, *left, *right)


def compute_owner_windows(samples):
    """Lag attributed to each owner, per queue and minute, over the samples it owned the queue."""
    from pyspark.sql import functions as F

    agg = samples.filter((F.col("_kind") == "o") & F.col("owner").isNotNull()).select(
        *QUEUE_KEYS, "owner", "ws", "samples",
        F.timestamp_millis("owned_from_ms").alias("owned_from"), F.timestamp_millis("owned_to_ms").alias("owned_to"),
        "last_lag", (F.col("sum_lag") / F.col("samples")).alias("avg_lag"), "max_lag",
        (F.col("max_committed") - F.col("min_committed")).alias("consumed"))
    return with_partitions(agg, res_ms=MINUTE)
