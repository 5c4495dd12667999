"""Lag status per queue, in the spirit of Burrow's consumer-lag evaluation rules.

Statuses are evaluated at the end of every 10-second window of every queue, from that
queue's *points*: the last sample (committed offset ``co``, ``lag``) of each 10-s window.
The *status window* is the points of the last ``window`` seconds (default 60 s, i.e. 6
points) ending at the evaluated window; it is *full* when it holds all of them (no gap).
A *pair* is two consecutive points of the queue whose second point lies in the status
window and is not its first point.

Rules, in this order (the first that applies wins):

1. **REWIND** - in some pair the committed offset went back (``co`` decreased, both >= 0).
   A rewind shows for the ``window`` seconds that follow it.
2. **OK** - the lag was 0 at some point of the status window (Burrow's rule 1: a consumer
   that caught up even once in the window is not in trouble), or the window has fewer
   than 2 points.
3. **STOP** - the committed offset has not changed for ``stop_after`` seconds (default
   300 s, ``stop_after / 10`` points, all present, lag > 0 at each of them): nobody has
   committed for a long time, never-committed (``co`` = -1) included.
4. **STALL** - the window is full and the committed offset is the same at every point
   (lag > 0 throughout, by rule 2): the consumer is there but not progressing.
5. **WARN** - the window is full, the committed offset moves, and the lag never decreased
   in any pair and is higher at the last point than at the first: the group is falling
   behind.
6. **OK** - otherwise.

The thresholds come from settings ``LAG_STATUS_WINDOW_S`` (60) and ``LAG_STOP_AFTER_S``
(300). A 1-minute window takes the status of its last 10-s window. The group's
status in a window is the worst of its queues' (OK < WARN < STALL < STOP < REWIND).
"""
from __future__ import annotations

STATUS_ORDER = ["OK", "WARN", "STALL", "STOP", "REWIND"]
POINT_MS = 10_000
DEFAULT_WINDOW_MS = 60_000
DEFAULT_STOP_AFTER_MS = 300_000


def add_status(points, keys: list[str], window_ms: int = DEFAULT_WINDOW_MS,
               stop_after_ms: int = DEFAULT_STOP_AFTER_MS):
    """``points``: one row per queue and 10-s window with ``ws`` (window start, ms),
    ``consumer_offset`` and ``lag`` of its last sample. Returns it with a ``status`` column."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(*keys).orderBy("ws")
    points = (points
              .withColumn("_prev_co", F.lag("consumer_offset").over(ordered))
              .withColumn("_prev_lag", F.lag("lag").over(ordered))
              .withColumn("_rewind", ((F.col("consumer_offset") >= 0) & (F.col("_prev_co") >= 0)
                                      & (F.col("consumer_offset") < F.col("_prev_co"))).cast("int"))
              .withColumn("_lag_down", (F.col("lag") < F.col("_prev_lag")).cast("int")))

    def frame(span_ms):
        # rangeBetween over ws (ms): the points whose window starts in [ws - span, ws]
        return ordered.rangeBetween(-span_ms, 0)

    in_window = frame(window_ms - POINT_MS)
    pairs = frame(window_ms - 2 * POINT_MS)
    stop_range = frame(stop_after_ms - POINT_MS)
    full_points = window_ms // POINT_MS
    stop_points = stop_after_ms // POINT_MS

    n = F.count("*").over(in_window)
    rewinds = F.sum(F.coalesce("_rewind", F.lit(0))).over(pairs)
    lag_downs = F.sum(F.coalesce("_lag_down", F.lit(0))).over(pairs)
    min_lag = F.min("lag").over(in_window)
    co_min, co_max = F.min("consumer_offset").over(in_window), F.max("consumer_offset").over(in_window)
    first_lag = F.min_by("lag", "ws").over(in_window)
    stop_n = F.count("*").over(stop_range)
    stop_co_min = F.min("consumer_offset").over(stop_range)
    stop_co_max = F.max("consumer_offset").over(stop_range)
    stop_min_lag = F.min("lag").over(stop_range)

    status = (F.when(rewinds > 0, "REWIND")
              .when((min_lag == 0) | (n < 2), "OK")
              .when((stop_n == stop_points) & (stop_co_min == stop_co_max) & (stop_min_lag > 0), "STOP")
              .when((n == full_points) & (co_min == co_max), "STALL")
              .when((n == full_points) & (lag_downs == 0) & (F.col("lag") > first_lag), "WARN")
              .otherwise("OK"))
    return points.withColumn("status", status).drop("_prev_co", "_prev_lag", "_rewind", "_lag_down")


def worst(statuses) -> str:
    """The worst of some statuses (plain Python, for reports)."""
    ranked = [STATUS_ORDER.index(s) for s in statuses if s in STATUS_ORDER]
    return STATUS_ORDER[max(ranked)] if ranked else "OK"
