"""What one lag-stream pass costs (issue 19), without the lab around it.

Records the lag job's test scenario (8 queues, a stall, a rewind, a member leaving, flow
control, hand-offs: tests/lag_scenario.py), with a consume event per member and second as
the lab records them, one 10-s slice at a time into a temp directory and
runs a stream pass after each, as the lag service does, in one warm session with the lag
service's JVM flags and settings. Prints, per pass, its wall time and the CPU seconds of this
process and its JVM; then the median and the mean over the passes after ``--warm`` (the
JVM's first passes compile most of Spark). The lag service's CPU share is about
pass CPU / period (10 s).

    .venv/bin/python bench/lag_stream_pass.py [--slices 30] [--warm 6]
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
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark SQL setting to try on top of the service's (repeatable)")
    args = parser.parse_args()
    if not 0 <= args.warm < args.slices <= 30:
        print("lag_stream_pass: need 0 <= --warm < --slices <= 30", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
