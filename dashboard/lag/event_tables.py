"""The lag history's tables made of the event log (Spark DataFrame functions, no Python UDFs).

* ``rebalances`` - one row per finished rebalance (``rebalance`` event with phase "end"):
  start, end, duration_ms (the event's ``duration_ms``, else the time since the client's
  last "start"), changed queues (JSON), reason.
* ``flow_control`` (res 10s, 1m) - per consumer and reason: count of ``flow_control``
  events and the largest ``value`` reported.
* ``marks`` - what the history charts mark: every ``fault`` event (kind "fault", name =
  the fault: kill, hang, strategy, ...) and every hand-off (kind "handoff", name = the
  queue, at the time the new owner took it; the latest of its ``handoff`` events: gap,
  overlap, duplicates). ``detail`` is the event's fields as JSON.
"""
from __future__ import annotations

from .layout import RESOLUTIONS
from .table_columns import with_partitions

# The event types the tables are made of (the log holds more: consume, process queue, ...).
# Each event table and the event types it is made of (a stream pass makes only the tables
# its new events can change).
EVENT_TABLE_TYPES = {"rebalances": ("rebalance",), "flow_control": ("flow_control",), "marks": ("fault", "handoff")}
TABLE_EVENT_TYPES = tuple(t for types in EVENT_TABLE_TYPES.values() for t in types)


def table_events(events):
    """The events any table is made of."""
    from pyspark.sql import functions as F

    return events.filter(F.col("type").isin(*TABLE_EVENT_TYPES))


def compute_rebalances(events):
    """Finished rebalances: start, end, duration and changed queues, from ``rebalance`` events."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def queues(name):   # a JSON list of labels in the event's fields; [] when absent
        return F.coalesce(F.from_json(F.get_json_object("fields", f"$.{name}"), "array<string>"),
                          F.array().cast("array<string>"))

    r = events.filter(F.col("type") == "rebalance").select(
        "group", "client_id", "ts",
        F.lower(F.coalesce(F.get_json_object("fields", "$.phase"), F.lit("end"))).alias("phase"),
        # Clients report fractional milliseconds ("2.545"): a straight cast to long fails.
        F.round(F.get_json_object("fields", "$.duration_ms").cast("double")).cast("long").alias("duration_ms"),
        F.to_json(F.concat(queues("added"), queues("removed"))).alias("changed"),   # the queues it moved
        F.get_json_object("fields", "$.reason").alias("reason"),
    )
    ordered = Window.partitionBy("group", "client_id").orderBy("ts")
    r = r.withColumn("_prev_phase", F.lag("phase").over(ordered)).withColumn("_prev_ts", F.lag("ts").over(ordered))
    ends = r.filter(F.col("phase") == "end")
    start = F.coalesce(F.col("ts") - F.col("duration_ms"),
                       F.when(F.col("_prev_phase") == "start", F.col("_prev_ts")), F.col("ts"))
    out = ends.select("group", "client_id", start.alias("ws"), F.timestamp_millis("ts").alias("end"),
                      (F.col("ts") - start).alias("duration_ms"), "changed", "reason")
    df = with_partitions(out)
    return df.withColumn("start", F.col("window_start"))


def compute_flow_control(events):
    """Counts of ``flow_control`` events per consumer, reason and window."""
    from pyspark.sql import functions as F

    f = events.filter(F.col("type") == "flow_control").select(
        "group", "client_id", "ts",
        F.coalesce(F.get_json_object("fields", "$.reason"), F.lit("unknown")).alias("reason"),
        F.get_json_object("fields", "$.value").cast("double").alias("value"),
    )
    frames = []
    for res, res_ms in RESOLUTIONS.items():
        agg = (f.withColumn("ws", F.col("ts") - F.col("ts") % res_ms)
               .groupBy("group", "client_id", "reason", "ws")
               .agg(F.count("*").alias("count"), F.max("value").alias("max_value")))
        frames.append(with_partitions(agg, res_ms=res_ms, res=res))
    return frames[0].unionByName(frames[1])


def compute_marks(events, with_event_ts: bool = False):
    """Faults (strategy switches included) and hand-offs, for the charts' marks and the
    range comparison; a hand-off is its latest ``handoff`` event, at the time it happened.
    ``with_event_ts`` keeps ``_event_ts``: the ts of the event each mark comes from."""
    from pyspark.sql import functions as F

    faults = events.filter(F.col("type") == "fault").select(
        "group", "client_id", F.lit("fault").alias("kind"),
        F.coalesce(F.get_json_object("fields", "$.fault"), F.lit("unknown")).alias("name"),
        F.col("ts").alias("ws"), F.col("fields").alias("detail"), F.col("ts").alias("_event_ts"))
    handoffs = (events.filter(F.col("type") == "handoff")
                .withColumn("queue", F.get_json_object("fields", "$.queue"))
                .withColumn("added_ts", F.get_json_object("fields", "$.added_ts").cast("long"))
                .groupBy("group", "client_id", "queue", "added_ts")
                .agg(F.max_by("fields", "ts").alias("detail"), F.max("ts").alias("_event_ts"))
                .select("group", "client_id", F.lit("handoff").alias("kind"), F.col("queue").alias("name"),
                        F.col("added_ts").alias("ws"), "detail", "_event_ts"))
    marks = with_partitions(faults.unionByName(handoffs))
    return marks if with_event_ts else marks.drop("_event_ts")
