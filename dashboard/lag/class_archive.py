"""Spark's JVM classes as a class-data-sharing archive (AppCDS), made once per environment.

A fresh Spark JVM reads, verifies and links thousands of classes from PySpark's jars
before it does any work, and again in every new process: the lag service at each start,
each ``lagjob``, each test module's session. A dynamic CDS archive (JDK 13+) holds those
classes already parsed and verified; a JVM started with it maps them instead. Measured on
2 cores (bench/lag_job.py, fresh JVM each): session up 4.4 -> 2.7 s, the 10M-row run itself
within its run-to-run noise; with the lag service's JVM flags, session up 4.7 -> 2.3 s and
its first pass 11.3 -> 9.0 s of CPU (bench/lag_stream_pass.py).

``python -m dashboard.lag.class_archive`` builds it (the Makefile's install does): a JVM
started with ``-XX:ArchiveClassesAtExit`` runs a small lag job over synthetic recordings
and writes the classes it loaded as it exits. The archive belongs to this Python
environment (PySpark's jars are the JVM's class path) and to this JDK, so it lives under
``sys.prefix``; a JVM whose JDK or class path no longer matches ignores it (``-Xshare:auto``),
and without the file there is no option at all. A truncated archive crashes the JVM that
maps it (SIGBUS), so it is written under a scratch name, tried by a JVM, then renamed into
place. ``LAG_SPARK_CLASS_ARCHIVE`` names another archive; empty turns it off.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARCHIVE = Path(sys.prefix) / "share" / "rebalance-lab" / "spark-classes.jsa"
# Quiet: a JDK update makes an archive stale, which is not worth a warning per JVM start.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path | None:
    """The archive this environment's JVMs use, or None (off, or not built)."""
    chosen = os.environ.get("LAG_SPARK_CLASS_ARCHIVE", str(ARCHIVE))
    return Path(chosen) if chosen and Path(chosen).is_file() else None


def java_options() -> str:
    """JVM options that map the archive ("" without one)."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {_QUIET}" if path else ""


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def build(say=print) -> bool:
    """Build the archive (replacing an old one); False, with a line on stderr, if it cannot be."""
    java = _java()
    if java is None:
        print("class archive: no java found (PySpark needs one): not built", file=sys.stderr)
        return False
    ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
    scratch = ARCHIVE.with_name(f".{ARCHIVE.name}.{os.getpid()}.tmp")
    from .spark import BATCH_JAVA_OPTS

    env = dict(os.environ, LAG_SPARK_CLASS_ARCHIVE="",   # a dump must not start from an archive
               LAG_SPARK_EXTRA_JAVA_OPTS=f"{BATCH_JAVA_OPTS} -XX:ArchiveClassesAtExit={scratch} {_QUIET}")
    env.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    started = time.monotonic()
    say(f"class archive: running a small lag job to record Spark's classes into {ARCHIVE} ...")
    try:
        workload = subprocess.run([sys.executable, "-m", "dashboard.lag.class_archive", "--workload"],
                                  env=env, cwd=Path(__file__).resolve().parents[2],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        tried = scratch.is_file() and subprocess.run(
            [java, f"-XX:SharedArchiveFile={scratch}", "-Xshare:auto", *_QUIET.split(), "-version"],
            capture_output=True, timeout=60).returncode == 0
        if workload.returncode != 0 or not tried:
            tail = "\n".join(workload.stdout.strip().splitlines()[-5:])
            print(f"class archive: not built (workload exit {workload.returncode}, archive usable: {tried})\n{tail}",
                  file=sys.stderr)
            return False
        os.replace(scratch, ARCHIVE)
    finally:
        scratch.unlink(missing_ok=True)
    say(f"class archive: {ARCHIVE.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - started:.0f} s")
    return True


def _workload() -> None:
    """A lag job's life in small: a full run and an incremental one over a few minutes of
    synthetic recordings (every table, both resolutions), then a clean JVM exit (the dump)."""
    import django

    django.setup()
    import pyarrow as pa

    from consumers_app.lab.recorder import EVENT_SCHEMA, EVENTS, SNAPSHOT_SCHEMA, SNAPSHOTS, write_part

    from .job import LagJob
    from .spark import get_spark

    t0, queues = 1_767_225_600_000, 8
    with tempfile.TemporaryDirectory(prefix="lab-class-archive-") as work:
        recordings = Path(work) / "recordings"

        def write_minute(minute: int) -> None:
            ts = [t0 + minute * 60_000 + s * 1000 for s in range(60) for _ in range(queues)]
            offsets = [(minute * 60 + i // queues) * 10 for i in range(len(ts))]
            write_part(recordings, SNAPSHOTS, ts[0], pa.table({
                "ts": ts, "group": ["GID"] * len(ts), "topic": ["T"] * len(ts),
                "broker": [f"broker-{'ab'[i % 2]}" for i in range(len(ts))],
                "queue_id": [(i % queues) // 2 for i in range(len(ts))],
                "broker_min_offset": [0] * len(ts), "broker_max_offset": [o + 5 for o in offsets],
                "consumer_offset": offsets, "owner": [f"c{i % 3}" for i in range(len(ts))],
                "cached_count": [5] * len(ts), "cached_bytes": [5120] * len(ts), "inflight": [0] * len(ts),
                "oldest_unconsumed_store_ts": [t - 500 for t in ts],
            }, schema=SNAPSHOT_SCHEMA))
            events = [(t0 + minute * 60_000 + 1500, "rebalance", "GID", "c0",
                       json.dumps({"phase": "end", "duration_ms": 3.0, "added": ["broker-a:0"], "reason": "start"})),
                      (t0 + minute * 60_000 + 2500, "flow_control", "GID", "c1",
                       json.dumps({"queue": "broker-b:1", "reason": "count", "cached_count": 1000})),
                      (t0 + minute * 60_000 + 3500, "fault", "GID", "c2",
                       json.dumps({"fault": "strategy", "strategy": "AVG_BY_CIRCLE"}))]
            write_part(recordings, EVENTS, events[0][0], pa.table(
                {name: [e[i] for e in events] for i, name in enumerate(EVENT_SCHEMA.names)}, schema=EVENT_SCHEMA))

        spark = get_spark("local[2]")
        job = LagJob(recordings, Path(work) / "lag", spark=spark)
        for minute in range(3):
            write_minute(minute)
        job.run()
        write_minute(3)
        job.run()
        spark.stop()


def main(argv: list[str]) -> int:
    if argv == ["--workload"]:
        _workload()
        return 0
    if argv:
        print("usage: python -m dashboard.lag.class_archive", file=sys.stderr)
        return 2
    return 0 if build() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
