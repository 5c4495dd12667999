"""``manage.py lagservice``: keep the lag history fresh (dashboard/lag/service.py).

One warm Spark session for the process's life; a pass every ``--period`` seconds. Started
by runlab (LAB_LAG_SERVICE) it dies with runlab; by hand, Ctrl-C stops it after the pass.
``--verbosity 0`` prints only when it pauses or resumes.
"""
import os
import signal

from django.core.management.base import BaseCommand

from dashboard.lag.spark import INTERPRETED

# The service runs one plan again and again (stream.py): C1 alone compiles its few hot paths
# soon and cheaply, where C2's extra tier kept compiling for minutes after start (a pass
# after 10 warm ones: 0.85 s of CPU against 1.10 s with every tier, bench/lag_stream_pass.py,
# same run); one GC thread for a small heap. A backfill (lagjob) keeps the JVM's defaults.
SERVICE_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"

# A pass is thousands of rows through ~25 small stages: what costs is planning and starting
# them, not the rows. Measured per pass (bench/lag_stream_pass.py, 2 cores): compiling
# generated code for each new plan costs more than it saves (interpreted expressions: -40 %),
# and a broadcast join is one more Spark job; one shuffle partition, no adaptive re-planning.
PASS_CONF = {
    "spark.sql.shuffle.partitions": os.environ.get("LAG_SPARK_SHUFFLE_PARTITIONS", "1"),
    "spark.sql.adaptive.enabled": "false",
    **INTERPRETED,
    "spark.sql.autoBroadcastJoinThreshold": "-1",
}


def tune_for_passes(spark) -> None:
    """Settings for passes over a slice (a Spark Connect server keeps its own, but for the
    shuffle partitions)."""
    from dashboard.lag.spark import is_connect

    connect = is_connect(spark)
    for key, value in PASS_CONF.items():
        if key == "spark.sql.shuffle.partitions" or not connect:
            spark.conf.set(key, value)


class Command(BaseCommand):
    help = "Fold new recordings into the lag history every few seconds, in one warm Spark session."

    def add_arguments(self, parser):
        parser.add_argument("--period", type=float, default=10.0, help="seconds from one pass's start to the next")
        parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[*]; $SPARK_REMOTE wins)")

    def handle(self, *args, period, master, verbosity, **options):
        from consumers_app.lab.lifeline import die_with_parent
        from dashboard.lag.job import JobParams, LagJob
        from dashboard.lag.service import LagService

        die_with_parent()   # started by runlab: never outlive it
        os.environ.setdefault("LAG_SPARK_EXTRA_JAVA_OPTS", SERVICE_JAVA_OPTS)

        # History is background work: the broker, the consumers and the page come first on a
        # small machine (the JVM it starts inherits this).
        os.nice(10)

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        job = LagJob(master=master)
        budget = float(os.environ.get("LAB_LAG_CPU_BUDGET", "25")) / 100
        service = LagService(job, JobParams.from_settings, period_s=period, say=say, verbose=verbosity >= 1,
                             cpu_budget=budget)
        tune_for_passes(job.spark)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: service.stopping.set())
        say(f"lag service: a pass every {period:g} s into {job.out}")
        try:
            service.run()
        finally:
            job.close()
        say("lag service stopped")
