"""``manage.py lagservice``: keep the lag history fresh (dashboard/lag/service.py).

One warm Spark session for the process's life; a pass every ``--period`` seconds. Started
by runlab (LAB_LAG_SERVICE) it dies with runlab; by hand, Ctrl-C stops it after the pass.
``--verbosity 0`` prints only when it pauses or resumes.
"""
import os
import signal

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Fold new recordings into the lag history every few seconds, in one warm Spark session."

    def add_arguments(self, parser):
        parser.add_argument("--period", type=float, default=10.0, help="seconds from one pass's start to the next")
        parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[*]; $SPARK_REMOTE wins)")

    def handle(self, *args, period, master, verbosity, **options):
        from consumers_app.lab.lifeline import die_with_parent
        from dashboard.lag.job import JobParams, LagJob
        from dashboard.lag.service import LagService
        from dashboard.lag.spark import is_connect

        die_with_parent()   # started by runlab: never outlive it
        # A small JVM for small passes: C1 only (a pass is short; C2's compiling costs more
        # than it saves) and one GC thread; one shuffle partition and no adaptive
        # re-planning (a slice is thousands of rows, not millions). A backfill (lagjob) keeps
        # Spark's defaults.
        os.environ.setdefault("LAG_SPARK_EXTRA_JAVA_OPTS",
                              "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC")

        # History is background work: the broker, the consumers and the page come first on a
        # small machine (the JVM it starts inherits this).
        os.nice(10)

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        job = LagJob(master=master)
        budget = float(os.environ.get("LAB_LAG_CPU_BUDGET", "10")) / 100
        service = LagService(job, JobParams.from_settings, period_s=period, say=say, verbose=verbosity >= 1,
                             cpu_budget=budget)
        job.spark.conf.set("spark.sql.shuffle.partitions", os.environ.get("LAG_SPARK_SHUFFLE_PARTITIONS", "1"))
        if not is_connect(job.spark):
            job.spark.conf.set("spark.sql.adaptive.enabled", "false")
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: service.stopping.set())
        say(f"lag service: a pass every {period:g} s into {job.out}")
        try:
            service.run()
        finally:
            job.close()
        say("lag service stopped")
