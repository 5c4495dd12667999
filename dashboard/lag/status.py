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
    ``consumer_offset`` and ``lag`` of its last sample. Returns it with a ``status`` column.

    Evaluated with O(1) work per point, all over one ordering per queue (one sort): the
    points are unique per queue and ``ws``, so a window of ``k`` points is *full* when the
    point ``k - 1`` rows back starts exactly ``(k - 1) * 10 s`` earlier, and "something
    happened in the window" (a rewind, a lag decrease, a change of committed offset, a
    zero lag) is "the last point where it happened (a running max of ``ws``) lies in the
    window" - instead of sliding-frame aggregates that rescan the frame at every point."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(*keys).orderBy("ws")
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    full_points = window_ms // POINT_MS
    stop_points = stop_after_ms // POINT_MS
    ws, co, lag = F.col("ws"), F.col("consumer_offset"), F.col("lag")
    window_lo = ws - (window_ms - POINT_MS)        # first ws of the status window
    pairs_lo = ws - (window_ms - 2 * POINT_MS)     # pairs end at ws >= this
    stop_lo = ws - (stop_after_ms - POINT_MS)      # first ws of the stop window

    def last_ws(flag):
        return F.max(F.when(flag, ws)).over(running)

    prev_co, prev_lag = F.lag("consumer_offset").over(ordered), F.lag("lag").over(ordered)
    # One withColumns, not a chain: each DataFrame step is analysed on its own.
    points = points.withColumns({
        "_prev_ws": F.lag("ws").over(ordered),
        "_first_ws": F.lag("ws", full_points - 1).over(ordered),
        "_first_lag": F.lag("lag", full_points - 1).over(ordered),
        "_stop_first_ws": F.lag("ws", stop_points - 1).over(ordered),
        "_rewind_ws": last_ws((co >= 0) & (prev_co >= 0) & (co < prev_co)),
        "_lag_down_ws": last_ws(lag < prev_lag),
        "_co_change_ws": last_ws(co != prev_co),
        "_zero_ws": last_ws(lag == 0),
    })

    def none_since(col, lo):
        """no point at or after ``lo`` had the event (``col`` = the last point that had it)"""
        return F.col(col).isNull() | (F.col(col) < lo)

    def none_after(col, lo):
        return F.col(col).isNull() | (F.col(col) <= lo)

    full = F.col("_first_ws") == window_lo
    few = F.col("_prev_ws").isNull() | (F.col("_prev_ws") < window_lo)   # fewer than 2 points
    status = (F.when(~none_since("_rewind_ws", pairs_lo), "REWIND")
              .when(~none_since("_zero_ws", window_lo) | few, "OK")
              .when((F.col("_stop_first_ws") == stop_lo) & none_after("_co_change_ws", stop_lo)
                    & none_since("_zero_ws", stop_lo), "STOP")
              .when(full & none_after("_co_change_ws", window_lo), "STALL")
              .when(full & none_since("_lag_down_ws", pairs_lo) & (lag > F.col("_first_lag")), "WARN")
              .otherwise("OK"))
    return points.withColumn("status", status).drop(
        "_prev_ws", "_first_ws", "_first_lag", "_stop_first_ws", "_rewind_ws", "_lag_down_ws", "_co_change_ws",
        "_zero_ws")


def worst(statuses) -> str:
    """The worst of some statuses (plain Python, for reports)."""
    ranked = [STATUS_ORDER.index(s) for s in statuses if s in STATUS_ORDER]
    return STATUS_ORDER[max(ranked)] if ranked else "OK"
