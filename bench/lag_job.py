"""Benchmark of the Spark lag job (a script, not a test).

Synthetic offset snapshots - 256 queues sampled every second - at 1M and 10M rows,
written in the recorder's layout straight from numpy with pyarrow; then the job's wall
time and rows/s for a full run at each size on local[2], and the time of an incremental
run after one more minute of recordings. The event log holds a rebalance that moves two
queues every 10 s and a fault a minute (what the reports and marks draw). Then each report
format over a quarter, half and all of the range: its cost per hour of range and that
extrapolated to 24 hours (reports should cost linear in their range).

    .venv/bin/python bench/lag_job.py [--sizes 1000000,10000000] [--master local[2]]
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from consumers_app.lab.recorder import EVENT_SCHEMA, EVENTS, SNAPSHOT_SCHEMA, SNAPSHOTS, write_part  # noqa: E402

QUEUES = 256
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def write_minutes(root: Path, first_minute: int, minutes: int, rng: np.random.Generator, offsets: dict) -> int:
    """Write ``minutes`` minutes of snapshots (one part file each); returns the rows written."""
    brokers = np.array([f"broker-{'ab'[q % 2]}" for q in range(QUEUES)], dtype=object)
    queue_ids = (np.arange(QUEUES) // 2).astype(np.int32)
    owners = np.array([f"consumer-{q % 8}" for q in range(QUEUES)], dtype=object)
    rows = 0
    for m in range(first_minute, first_minute + minutes):
        seconds = np.arange(60, dtype=np.int64)
        ts = np.repeat(T0 + m * 60_000 + seconds * 1000, QUEUES)
        # Per queue: messages arrive ~10/s; the consumer commits every 5 s, a little behind.
        produced = rng.poisson(10, size=(60, QUEUES)).cumsum(axis=0) + offsets["max"]
        behind = rng.integers(0, 80, size=(60, QUEUES))
        committed = np.maximum(produced - behind, offsets["co"])
        committed[(seconds % 5) != 0] = 0
        committed = np.maximum.accumulate(committed, axis=0)
        offsets["max"], offsets["co"] = produced[-1], committed[-1]
        lag = (produced - committed).ravel()
        n = 60 * QUEUES
        table = pa.table({
            "ts": ts,
            "group": pa.array(["bench"] * n),
            "topic": pa.array(["BenchTopic"] * n),
            "broker": pa.array(np.tile(brokers, 60)),
            "queue_id": np.tile(queue_ids, 60),
            "broker_min_offset": np.zeros(n, dtype=np.int64),
            "broker_max_offset": produced.ravel().astype(np.int64),
            "consumer_offset": committed.ravel().astype(np.int64),
            "owner": pa.array(np.tile(owners, 60)),
            "cached_count": (lag % 1000).astype(np.int64),
            "cached_bytes": (lag % 1000 * 1024).astype(np.int64),
            "inflight": np.zeros(n, dtype=np.int32),
            "oldest_unconsumed_store_ts": np.where(lag > 0, ts - lag * 100, 0).astype(np.int64),
        }, schema=SNAPSHOT_SCHEMA)
        write_part(root, SNAPSHOTS, T0 + m * 60_000, table)
        write_part(root, EVENTS, T0 + m * 60_000, event_table(m))
        rows += n
    return rows


def event_table(minute: int) -> pa.Table:
    """A rebalance every 10 s (two queues change hands) and a strategy switch a minute."""
    import json

    rows = []
    for k in range(6):
        ts = T0 + minute * 60_000 + k * 10_000 + 500
        moved = [f"broker-a:{(minute * 6 + k) % (QUEUES // 2)}", f"broker-b:{(minute * 6 + k) % (QUEUES // 2)}"]
        rows.append((ts, "rebalance", "bench", f"consumer-{k % 8}",
                     json.dumps({"phase": "end", "duration_ms": 12.5, "added": moved, "reason": "bench"})))
    rows.append((T0 + minute * 60_000 + 30_000, "fault", "bench", "consumer-0",
                 json.dumps({"fault": "strategy", "strategy": "AVG_BY_CIRCLE"})))
    return pa.table({name: [r[i] for r in rows] for i, name in enumerate(EVENT_SCHEMA.names)}, schema=EVENT_SCHEMA)


def time_reports(lag_dir: Path, recordings: Path, minutes: int) -> None:
    """Each format over growing ranges: seconds, seconds per hour of range, 24 h extrapolated."""
    from dashboard.lag.history import LagHistory
    from dashboard.lag.reports import FORMATS, ReportQuery, build_report

    history = LagHistory(lag_dir, recordings)
    for fmt in FORMATS:
        per_hour = []
        for share in (0.25, 0.5, 1.0):
            span = int(minutes * share) * 60_000
            t = time.monotonic()
            size = len(build_report(history, ReportQuery("bench", T0, T0 + span, fmt, "1m")))
            took = time.monotonic() - t
            per_hour.append(took / (span / 3_600_000))
            print(f"  report {fmt:<7} {span / 60_000:5.0f} min: {took:6.2f} s ({size / 2**20:6.1f} MiB)")
        print(f"  report {fmt:<7} {per_hour[-1]:6.2f} s per hour of range -> 24 h ~ {per_hour[-1] * 24:5.1f} s"
              f" (per hour at 1/4, 1/2, all: {', '.join(f'{x:.2f}' for x in per_hour)})")


def jvm_cpu(spark) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by the Spark driver JVM (local mode: all of Spark)."""
    try:
        pid = spark.sparkContext._gateway.proc.pid
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick
    except (AttributeError, OSError, IndexError, ValueError):
        return float("nan"), float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--steps", action="store_true", help="print the time of each job step")
    parser.add_argument("--no-reports", action="store_true", help="skip timing the report formats")
    args = parser.parse_args()

    import django

    django.setup()
    from dashboard.lag.job import LagJob
    from dashboard.lag.spark import get_spark

    started = time.monotonic()
    spark = get_spark(args.master)
    print(f"spark session ({args.master}) up in {time.monotonic() - started:.1f} s")
    for size in (int(s) for s in args.sizes.split(",")):
        work = Path(tempfile.mkdtemp(prefix="lagbench-"))
        try:
            rng = np.random.default_rng(42)
            offsets = {"max": np.zeros(QUEUES, dtype=np.int64), "co": np.zeros(QUEUES, dtype=np.int64)}
            minutes = -(-size // (60 * QUEUES))
            t = time.monotonic()
            rows = write_minutes(work / "recordings", 0, minutes, rng, offsets)
            print(f"\n{rows:,} rows ({minutes} minutes x {QUEUES} queues at 1 s): generated in {time.monotonic() - t:.1f} s")
            marks = {"t": time.monotonic()}

            def step(done, total, label):
                now = time.monotonic()
                if args.steps and done:
                    print(f"    step {done}/{total} {label:<16} {now - marks['t']:6.1f} s")
                marks["t"] = now

            job = LagJob(work / "recordings", work / "lag", spark=spark, progress=step)
            t, cpu = time.monotonic(), jvm_cpu(spark)
            result = job.run()
            full = time.monotonic() - t
            user, system = (b - a for a, b in zip(cpu, jvm_cpu(spark)))
            print(f"  full run:        {full:6.1f} s  {rows / full:12,.0f} rows/s  "
                  f"({result.windows['queue_windows']:,} queue windows)  JVM cpu user {user:.1f} s sys {system:.1f} s")
            write_minutes(work / "recordings", minutes, 1, rng, offsets)
            t, cpu = time.monotonic(), jvm_cpu(spark)
            result = job.run()
            incremental = time.monotonic() - t
            user, system = (b - a for a, b in zip(cpu, jvm_cpu(spark)))
            print(f"  incremental run: {incremental:6.1f} s  (one new minute; {result.rows_read:,} rows read "
                  f"incl. look-back, {result.windows['queue_windows']:,} queue windows recomputed)  "
                  f"JVM cpu user {user:.1f} s sys {system:.1f} s")
            if not args.no_reports:
                time_reports(work / "lag", work / "recordings", minutes)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
