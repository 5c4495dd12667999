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


# What a point's status is derived from besides its own values, carried in the lag stream's
# state so that a pass evaluates only the points its new rows change (stream.py): each is
# the latest ``ws`` at or before the point where something happened - a gap before it (the
# start of the gap-free run it is in), a rewind, a lag decrease, a change of committed
# offset, a zero lag. A running maximum: the value at the next point follows from this one's.
CARRIED = ("status", "run_start_ws", "rewind_ws", "lag_down_ws", "co_change_ws", "zero_ws")


def add_status(points, keys: list[str], window_ms: int = DEFAULT_WINDOW_MS,
               stop_after_ms: int = DEFAULT_STOP_AFTER_MS, carried: bool = False):
    """``points``: one row per queue and 10-s window with ``ws`` (window start, ms),
    ``consumer_offset`` and ``lag`` of its last sample. Returns it with a ``status`` column.

    Evaluated with O(1) work per point, all over one ordering per queue (one sort): "the
    window is full" is "the gap-free run the point is in started at or before the window's
    first point", and "something happened in the window" (a rewind, a lag decrease, a
    change of committed offset, a zero lag) is "the last point where it happened (a running
    max of ``ws``) lies in the window" - instead of sliding-frame aggregates that rescan the
    frame at every point.

    ``carried``: the rows may hold the CARRIED columns of an earlier evaluation (null where
    not evaluated yet); a queue's rows before its first row without them keep them (their
    status cannot change: it depends only on points at or before them), the rest are
    evaluated from them - so a queue needs only its points from 5 before the first new one,
    not the stop window's 30. The CARRIED columns stay in the result (without ``carried``
    they are dropped)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(*keys).orderBy("ws")
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    full_points = window_ms // POINT_MS
    ws, co, lag = F.col("ws"), F.col("consumer_offset"), F.col("lag")
    window_lo = ws - (window_ms - POINT_MS)        # first ws of the status window
    pairs_lo = ws - (window_ms - 2 * POINT_MS)     # pairs end at ws >= this
    stop_lo = ws - (stop_after_ms - POINT_MS)      # first ws of the stop window

    if carried:
        first_new = F.min(F.when(F.col("status").isNull(), ws)).over(Window.partitionBy(*keys))
        kept = first_new.isNull() | (ws < first_new)
    else:
        kept = F.lit(False)

    def last_ws(flag, name):
        mark = F.when(kept, F.col(name)).when(flag, ws) if carried else F.when(flag, ws)
        return F.max(mark).over(running)

    prev_ws, prev_co, prev_lag = (F.lag(c).over(ordered) for c in ("ws", "consumer_offset", "lag"))
    # One withColumns, not a chain: each DataFrame step is analysed on its own.
    points = points.withColumns({
        "_kept": kept,
        "_prev_ws": prev_ws,
        "_first_lag": F.lag("lag", full_points - 1).over(ordered),
        "run_start_ws": last_ws(prev_ws.isNull() | (ws - prev_ws != POINT_MS), "run_start_ws"),
        "rewind_ws": last_ws((co >= 0) & (prev_co >= 0) & (co < prev_co), "rewind_ws"),
        "lag_down_ws": last_ws(lag < prev_lag, "lag_down_ws"),
        "co_change_ws": last_ws(co != prev_co, "co_change_ws"),
        "zero_ws": last_ws(lag == 0, "zero_ws"),
    })

    def none_since(col, lo):
        """no point at or after ``lo`` had the event (``col`` = the last point that had it)"""
        return F.col(col).isNull() | (F.col(col) < lo)

    def none_after(col, lo):
        return F.col(col).isNull() | (F.col(col) <= lo)

    run_start = F.col("run_start_ws")
    full = run_start <= window_lo                    # the window's points are all there
    few = F.col("_prev_ws").isNull() | (F.col("_prev_ws") < window_lo)   # fewer than 2 points
    status = (F.when(~none_since("rewind_ws", pairs_lo), "REWIND")
              .when(~none_since("zero_ws", window_lo) | few, "OK")
              .when((run_start <= stop_lo) & none_after("co_change_ws", stop_lo)
                    & none_since("zero_ws", stop_lo), "STOP")
              .when(full & none_after("co_change_ws", window_lo), "STALL")
              .when(full & none_since("lag_down_ws", pairs_lo) & (lag > F.col("_first_lag")), "WARN")
              .otherwise("OK"))
    if carried:
        status = F.when(F.col("_kept"), F.col("status")).otherwise(status)
    points = points.withColumn("status", status).drop("_kept", "_prev_ws", "_first_lag")
    return points if carried else points.drop(*CARRIED[1:])


def worst(statuses) -> str:
    """The worst of some statuses (plain Python, for reports)."""
    ranked = [STATUS_ORDER.index(s) for s in statuses if s in STATUS_ORDER]
    return STATUS_ORDER[max(ranked)] if ranked else "OK"
