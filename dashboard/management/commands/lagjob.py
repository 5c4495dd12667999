"""``manage.py lagjob``: run the Spark lag job (dashboard/lag/job.py).

Without options it is incremental (only recordings not processed yet); ``--since``,
``--until`` and ``--group`` recompute that range/group instead. Prints one
``progress DONE/TOTAL label`` line per stage and a JSON summary at the end.
"""
import json

from django.core.management.base import BaseCommand, CommandError

from dashboard.lag.history import parse_time


class Command(BaseCommand):
    help = "Compute lag history (Parquet under DATA_DIR/lag) from the recordings, with Spark."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="ISO-8601 start of the range to recompute (UTC if no offset)")
        parser.add_argument("--until", help="ISO-8601 end of the range to recompute")
        parser.add_argument("--group", help="recompute this consumer group only")
        parser.add_argument("--stream", action="store_true",
                            help="one pass of the lag stream (as the lag service runs it) instead of the batch")
        parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[*]; $SPARK_REMOTE wins)")
        parser.add_argument("--progress-file", help="also write progress as JSON here (the web page polls it)")
        parser.add_argument("--lock-wait", type=float, default=60.0, metavar="SECONDS",
                            help="wait this long for a running lag job (e.g. the lag service's pass) to finish")

    def handle(self, *args, **options):
        try:
            since = parse_time(options["since"], "--since")
            until = parse_time(options["until"], "--until")
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        if since is not None and until is not None and since >= until:
            raise CommandError("--since must be before --until", returncode=2)
        if options["group"] is not None and not options["group"].strip():
            raise CommandError("--group must not be empty", returncode=2)

        from dashboard.lag.job import JobBusy, JobParams, LagJob
        from dashboard.lag.runner import ProgressFile

        progress_file = ProgressFile(options["progress_file"]) if options["progress_file"] else None

        def progress(done, total, label):
            self.stdout.write(f"progress {done}/{total} {label}")
            self.stdout.flush()
            if progress_file:
                progress_file.progress(done, total, label)

        if progress_file:
            progress_file.write()
        if options["stream"] and (since is not None or until is not None or options["group"] is not None):
            raise CommandError("--stream folds what is new: no --since, --until or --group", returncode=2)
        job = LagJob(master=options["master"], progress=progress)
        try:
            if options["stream"]:
                from dashboard.lag.stream import LagStream

                result = LagStream(job).run(JobParams.from_settings(), lock_wait_s=options["lock_wait"])
            else:
                result = job.run(JobParams.from_settings(since_ms=since, until_ms=until, group=options["group"]),
                                 lock_wait_s=options["lock_wait"])
        except JobBusy as exc:
            if progress_file:
                progress_file.fail(str(exc))
            raise CommandError(str(exc), returncode=3) from None
        except Exception as exc:
            if progress_file:
                progress_file.fail(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            job.close()
        summary = result.as_dict()
        if progress_file:
            progress_file.finish(summary)
        self.stdout.write(json.dumps(summary))
