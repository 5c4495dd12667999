"""What one lag-stream pass costs (issue 19), without the lab around it.

Records the lag job's test scenario (8 queues, a stall, a rewind, a member leaving, flow
control, hand-offs: tests/lag_scenario.py), with a consume event per member and second as
the lab records them, one 10-s slice at a time into a temp directory and
runs a stream pass after each, as the lag service does, in one warm session with the lag
service's JVM flags and settings. Prints, per pass, its wall time and the CPU seconds of this
process and its JVM; then the median and the mean over the passes after ``--warm`` (the
JVM's first passes compile most of Spark). The lag service's CPU share is about
pass CPU / period (10 s).

With ``--queues N`` (64 x 256: ``--queues 256 --consumers 64``) the slices are synthetic
instead: N queues sampled every second and, every slice, one member's rebalance that hands
two queues over (a lab under churn), so the pass's cost at that size can be profiled alone.

    .venv/bin/python bench/lag_stream_pass.py [--slices 30] [--warm 6] [--queues 256 --consumers 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=30, help="10-s slices to record and fold (at most 30)")
    parser.add_argument("--warm", type=int, default=6, help="passes not counted in the summary")
    parser.add_argument("--queues", type=int, default=0, help="synthetic slices of this many queues")
    parser.add_argument("--consumers", type=int, default=64, help="members owning the synthetic queues")
    parser.add_argument("--lab-events", action="store_true",
                        help="with --queues: also the events a real lab of that size records (every "
                             "member's periodic rebalance each 20 s, ProcessQueue figures)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark SQL setting to try on top of the service's (repeatable)")
    args = parser.parse_args()
    if not 0 <= args.warm < args.slices <= (120 if args.queues else 30):
        print("lag_stream_pass: need 0 <= --warm < --slices <= 30 (120 with --queues)", file=sys.stderr)
        return 2

    from dashboard.management.commands.lagservice import SERVICE_JAVA_OPTS, tune_for_passes
    os.environ.setdefault("LAG_SPARK_EXTRA_JAVA_OPTS", SERVICE_JAVA_OPTS)

    import django
    django.setup()

    from consumers_app.events import ConsumeEvent
    from consumers_app.lab.recorder import Recorder
    from dashboard.lag.job import JobParams, LagJob
    from dashboard.lag.service import tree_cpu_seconds
    from dashboard.lag.spark import get_spark
    from tests import lag_scenario as scenario
    from tests.test_lag_stream import record_slice

    from dashboard.lag.stream import LagStream

    spark = get_spark("local[1]")
    tune_for_passes(spark)
    for setting in args.conf:
        key, _, value = setting.partition("=")
        spark.conf.set(key, value)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lag-pass-") as tmp:
        data = Path(tmp)
        job = LagJob(data / "recordings", data / "lag", spark=spark)
        stream = LagStream(job)
        late: list = []
        with Recorder(data / "recordings") as recorder:
            for i in range(args.slices):
                if args.queues:
                    record_synthetic(recorder, 10 * i, args.queues, args.consumers, args.lab_events)
                else:
                    record_slice(recorder, 10 * i, 10 * i + 10, late)
                for t in range(10 * i, 10 * i + 10):   # as in the lab: events no table is made of
                    for client in ("c1", "c2"):
                        recorder.add_event(ConsumeEvent(ts=scenario.T0 + t * 1000 + 500, group=scenario.GROUP,
                                                        client_id=client, topic=scenario.TOPIC,
                                                        interval_ms=1000, ok=10))
                recorder.flush()
                cpu, own, wall = tree_cpu_seconds(os.getpid()), time.process_time(), time.monotonic()
                result = stream.run(JobParams())
                cpu, own = tree_cpu_seconds(os.getpid()) - cpu, time.process_time() - own
                wall = time.monotonic() - wall
                rows.append((cpu, wall))
                print(f"pass {i + 1:2d}: {result.state:12s} {wall:6.2f} s wall {cpu:6.2f} s CPU "
                      f"({own:.2f} s in Python)", flush=True)
    spark.stop()
    counted = rows[args.warm:]
    cpus, walls = [c for c, _ in counted], [w for _, w in counted]
    print(f"after {args.warm} warm passes ({len(counted)} counted): CPU median {statistics.median(cpus):.2f} s, "
          f"mean {statistics.mean(cpus):.2f} s; wall median {statistics.median(walls):.2f} s; "
          f"at a pass per 10 s: {100 * statistics.mean(cpus) / 10:.0f} % of one core")
    return 0


def record_synthetic(recorder, first: int, queues: int, consumers: int, lab_events: bool = False) -> None:
    """Seconds [first, first + 10) of a lab with ``queues`` queues over two brokers: 10 msgs/s
    a queue, commits every 5 s; at +5 s one member's rebalance hands two queues to the next.
    ``lab_events``: also what the real lab records at that size besides (runlab at 64 x 256,
    2026-11-28: ~14 rebalance events, ~21 hand-offs and ~36 ProcessQueue events a second while
    it grew, then fewer): each member's periodic rebalance every 20 s (a row of the
    rebalances table each, moving nothing) and a ProcessQueue event per member per second."""
    from consumers_app.events import event_from_dict
    from tests import lag_scenario as scenario

    mover = (first // 10) % consumers
    moved = [(mover + k * consumers) % queues for k in (0, 1)]

    def owner(q: int, t: int) -> str:
        return f"c{(q + (1 if q in moved and t >= first + 5 else 0)) % consumers}"

    for t in range(first, first + 10):
        ts = scenario.T0 + t * 1000 + 300
        rows = []
        for q in range(queues):
            mx = 1000 + 10 * t + q
            co = 1000 + 10 * (t - t % 5) + q - 20
            rows.append({"ts": ts, "group": scenario.GROUP, "topic": scenario.TOPIC,
                         "broker": f"broker-{'ab'[q % 2]}", "queue_id": q // 2, "broker_min_offset": 0,
                         "broker_max_offset": mx, "consumer_offset": co, "owner": owner(q, t),
                         "cached_count": mx - co, "cached_bytes": (mx - co) * 100, "inflight": 0,
                         "oldest_unconsumed_store_ts": ts - 2000})
        recorder.add_snapshot(rows)
        if lab_events:
            for m in range(consumers):
                client = f"c{m}"
                if m % 20 == t % 20:   # its periodic rebalance: start and end, nothing moved
                    for e in ({"ts": ts + 10, "type": "rebalance", "group": scenario.GROUP, "client_id": client,
                               "phase": "start", "reason": "periodic"},
                              {"ts": ts + 12, "type": "rebalance", "group": scenario.GROUP, "client_id": client,
                               "phase": "end", "reason": "periodic", "duration_ms": 2.1, "added": [],
                               "removed": []}):
                        recorder.add_event(event_from_dict(e))
                q = (m + t) % queues
                recorder.add_event(event_from_dict({
                    "ts": ts + 20, "type": "pq", "group": scenario.GROUP, "client_id": client,
                    "topic": scenario.TOPIC, "queue": f"broker-{'ab'[q % 2]}:{q // 2}", "cached_count": 3,
                    "cached_bytes": 300, "span": 3, "inflight": 0}))
        if t == first + 5:
            labels = [f"broker-{'ab'[q % 2]}:{q // 2}" for q in moved]
            taker = f"c{(mover + 1) % consumers}"
            for e in ({"ts": ts - 100, "type": "rebalance", "group": scenario.GROUP, "client_id": taker,
                       "phase": "start"},
                      {"ts": ts + 200, "type": "rebalance", "group": scenario.GROUP, "client_id": taker,
                       "phase": "end", "added": labels, "removed": []},
                      *({"ts": ts + 300, "type": "handoff", "group": scenario.GROUP, "client_id": taker,
                         "topic": scenario.TOPIC, "queue": label, "from_clients": [f"c{mover}"], "rebalance": 1,
                         "added_ts": ts + 200, "released_ts": ts + 100, "gap_ms": 100, "duplicates": 0}
                        for label in labels)):
                recorder.add_event(event_from_dict(e))
    recorder.flush()


if __name__ == "__main__":
    sys.exit(main())
