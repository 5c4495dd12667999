"""``manage.py lagreport``: write a lag report (dashboard/lag/reports.py) to a file.

Bad parameters exit with code 2 and a line on stderr, writing nothing. When recordings
are waiting to be processed the lag job runs first (incrementally), unless --no-job.
Progress lines go to stderr (stdout may be the report itself with ``-o -``).
"""
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dashboard.lag.reports import FORMATS, ReportError, build_report, parse_query


class Command(BaseCommand):
    help = "Write a lag report (csv, parquet, html or json) for a consumer group."

    def add_arguments(self, parser):
        parser.add_argument("--group", required=True)
        parser.add_argument("--from", dest="from_", metavar="ISO", help="ISO-8601 start (UTC if no offset)")
        parser.add_argument("--to", metavar="ISO", help="ISO-8601 end")
        parser.add_argument("--format", dest="fmt", help=f"one of {', '.join(FORMATS)} (default: -o's extension)")
        parser.add_argument("--res", default="1m", help="window size: 10s or 1m (default 1m)")
        parser.add_argument("-o", "--output", required=True, help="file to write, - for stdout")
        parser.add_argument("--no-job", action="store_true", help="do not run the lag job for waiting recordings")

    def handle(self, *args, **options):
        from dashboard.lag.history import LagHistory

        output = options["output"]
        fmt = options["fmt"] or (Path(output).suffix.lstrip(".").lower() if output != "-" else "")
        history = LagHistory()
        try:
            # Everything checkable without the history first: a bad call changes nothing.
            parse_query(options["group"], options["from_"], options["to"], fmt, options["res"], check_group=False)
            if not options["no_job"] and history.unprocessed_recordings():
                self._run_job()
            query = parse_query(options["group"], options["from_"], options["to"], fmt, options["res"], history)
        except ReportError as exc:
            raise CommandError(str(exc), returncode=2) from None

        def progress(done, total, label):
            self.stderr.write(f"report {done}/{total} {label}")

        body = build_report(history, query, progress)
        if output == "-":
            sys.stdout.buffer.write(body)
            sys.stdout.flush()
        else:
            Path(output).write_bytes(body)
            self.stderr.write(f"wrote {output} ({len(body):,} bytes)")

    def _run_job(self):
        from dashboard.lag.job import JobBusy, LagJob

        def progress(done, total, label):
            self.stderr.write(f"lag job {done}/{total} {label}")

        try:
            LagJob(progress=progress).run()
        except JobBusy as exc:
            self.stderr.write(f"{exc}; reporting from the history as it is")
