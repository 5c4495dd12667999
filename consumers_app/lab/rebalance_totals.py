"""A group's rebalances counted since the controller started, for counters that only grow.

The hand-off record (handoff.py) keeps the last 15 minutes, and a rebalance's figures
still move after it happened: duplicates arrive with the consumers' later reports, an
overlap grows until the old owner lets go, the lag spike is watched for 30 s. A
Prometheus counter must never go down, so a rebalance is counted once, when it has
*settled* (no overlap running and ``SETTLE_MS`` since its last move), with the figures
it has then. Its longest gap and longest overlap go into histograms (seconds).

Pure: ``fold(summaries, now_ms)`` is given the record's rebalance summaries.
"""
from dataclasses import dataclass, field

SETTLE_MS = 30_000   # handoff.LAG_WATCH_MS: a rebalance's figures settle within this
# Upper bounds (seconds) of the gap and overlap histograms: a clean hand-off is well under
# a second, a consumer that dies without saying goodbye leaves a gap of its expiry (~2 min).
BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))   # last: +Inf
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(BUCKETS_S):
            if seconds <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum_s += seconds

    def to_dict(self) -> dict:
        """Cumulative counts per upper bound, as Prometheus reads a histogram."""
        cumulative, running = [], 0
        for bound, count in zip([*map(str, BUCKETS_S), "+Inf"], self.counts):
            running += count
            cumulative.append([bound, running])
        return {"buckets": cumulative, "count": running, "sum_s": round(self.sum_s, 3)}


class RebalanceTotals:
    def __init__(self):
        self.rebalances = 0
        self.moved = 0
        self.duplicates = 0
        self.unmeasured = 0     # moves to or from a peer: their duplicates are not measured
        self.gap = Histogram()
        self.overlap = Histogram()
        self._counted: set[int] = set()   # ids of the record's rebalances already counted

    def fold(self, summaries, now_ms: int) -> None:
        """Count the settled rebalances not counted yet; forget ids the record forgot."""
        present = set()
        for s in summaries:
            present.add(s["id"])
            if s["id"] in self._counted or s["overlap_ongoing"] or now_ms - s["end_ts"] < SETTLE_MS:
                continue
            self._counted.add(s["id"])
            self.rebalances += 1
            self.moved += s["moved"]
            self.duplicates += s["duplicates"] or 0   # None: no move of it measured
            self.unmeasured += s["unmeasured"]
            self.gap.observe(s["gap_ms"] / 1000)
            self.overlap.observe(s["overlap_ms"] / 1000)
        self._counted &= present

    def snapshot(self) -> dict:
        return {"rebalances": self.rebalances, "moved": self.moved, "duplicates": self.duplicates,
                "unmeasured": self.unmeasured, "gap_s": self.gap.to_dict(), "overlap_s": self.overlap.to_dict()}
