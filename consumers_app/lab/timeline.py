"""The live view's recent past: one sample per group per offset poll (every second).

Each sample keeps, per queue, its owners, its lag, its time lag and its cached messages
(the ProcessQueues' sum), so the page can

* draw each queue's lag over the last 5 minutes as a sparkline and the group's total lag
  and time lag as a line (``series``), and
* replay the assignment view at any second of the last 15 minutes (``at``): who held
  each queue, how deep its ProcessQueue was, how far behind it was.

Memory is bounded by the window: ``WINDOW_S`` samples per group, figures in compact
arrays, and a queue list or owner tuple shared with the previous sample while it has not
changed (owners change only on rebalances). Pure: the caller passes the timestamps.
"""
from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

from consumers_app.events import now_ms

from .bus import LabError

WINDOW_S = 15 * 60      # samples kept per group (one a second)
SERIES_S = 5 * 60       # what the sparklines show
UNKNOWN = -1            # a time lag not known (an attached cluster that has not told it yet)


@dataclass(slots=True)
class Sample:
    ts: int
    labels: tuple[str, ...]
    owners: tuple[tuple[str, ...], ...]   # per label
    lag: array
    time_lag_ms: array   # UNKNOWN where the snapshot says None
    cached: array


class GroupTimeline:
    def __init__(self, window_s: int = WINDOW_S):
        self.samples: deque[Sample] = deque(maxlen=window_s)

    def add(self, ts: int, queues: dict[str, dict]) -> None:
        """One poll's figures: label -> {"lag", "time_lag_ms", "cached_count", "owners"}."""
        labels = tuple(queues)
        owners = tuple(tuple(q.get("owners", ())) for q in queues.values())
        last = self.samples[-1] if self.samples else None
        if last is not None:
            # Two polls in one millisecond still get their own stamps, so at() finds each.
            ts = max(ts, last.ts + 1)
            # Share what did not change: most seconds, all but the figures.
            labels = last.labels if last.labels == labels else labels
            owners = last.owners if last.owners == owners else owners
        self.samples.append(Sample(
            ts, labels, owners,
            array("q", (q.get("lag", 0) for q in queues.values())),
            array("q", (UNKNOWN if q.get("time_lag_ms") is None else q["time_lag_ms"] for q in queues.values())),
            array("q", (q.get("cached_count", 0) for q in queues.values()))))

    def series(self, now_ms: int, seconds: int = SERIES_S) -> dict:
        """The last ``seconds``: timestamps, the group's total lag and largest time lag, and
        each queue's lag (a queue absent from a sample is null there)."""
        since = now_ms - seconds * 1000
        recent = [s for s in self.samples if s.ts >= since]
        labels = list(recent[-1].labels) if recent else []   # today's queues, then any gone since
        seen = set(labels)
        for sample in recent:
            for label in sample.labels:
                if label not in seen:
                    seen.add(label)
                    labels.append(label)
        per_queue: dict[str, list[int | None]] = {label: [] for label in labels}
        for s in recent:
            index = {label: i for i, label in enumerate(s.labels)}
            for label in labels:
                i = index.get(label)
                per_queue[label].append(s.lag[i] if i is not None else None)
        return {
            "ts": [s.ts for s in recent],
            "total_lag": [sum(s.lag) for s in recent],
            "time_lag_ms": [_largest_time_lag(s) for s in recent],
            "queues": per_queue,
        }

    def at(self, ts: int) -> dict | None:
        """The sample at or just before ``ts``; None before the first one kept."""
        stamps = [s.ts for s in self.samples]
        i = bisect_right(stamps, ts) - 1
        if i < 0:
            return None
        s = self.samples[i]
        return {
            "ts": s.ts,
            "oldest_ts": stamps[0],
            "queues": {label: {"owners": list(s.owners[j]), "lag": s.lag[j], "time_lag_ms": _known(s.time_lag_ms[j]),
                               "cached_count": s.cached[j]} for j, label in enumerate(s.labels)},
        }


def _known(time_lag: int) -> int | None:
    return None if time_lag == UNKNOWN else time_lag


def _largest_time_lag(sample: Sample) -> int | None:
    """The sample's largest known time lag; None when it has queues and none was known."""
    known = [t for t in sample.time_lag_ms if t != UNKNOWN]
    if known:
        return max(known)
    return None if sample.time_lag_ms else 0


def lag_series(group, seconds: int) -> dict:
    """GET /api/groups/G/lag for a GroupState."""
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not 1 <= seconds <= WINDOW_S:
        raise LabError(f"seconds must be an integer from 1 to {WINDOW_S}, not {seconds!r}")
    return {"group": group.name, **group.timeline.series(now_ms(), seconds)}


def view_at(group, ts: int) -> dict:
    """GET /api/groups/G/at?ts= for a GroupState; LabError outside what is kept."""
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise LabError(f"ts must be an integer (ms since the epoch), not {ts!r}")
    found = group.timeline.at(ts)
    if found is None:
        kept = group.timeline.samples
        raise LabError(f"group {group.name} has no sample at or before {ts}: the view keeps the last "
                       f"{kept.maxlen // 60} minutes" + (f", from {kept[0].ts}" if kept else ", and none yet"))
    return {"group": group.name, **found}
