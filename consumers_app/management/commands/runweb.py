"""The web server (daphne) and, unless --no-controller, the lab controller in one process.

Extra web processes run with --no-controller: they serve pages, the API and websockets
and reach the one controller through the Redis channel layer (CHANNEL_LAYER_URL).
"""
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from consumers_app.lab.webserver import run_web


class Command(BaseCommand):
    help = "Serve the dashboard with daphne, with the lab controller on the same loop."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-controller", action="store_true",
                            help="only serve; the controller runs in another process")
        parser.add_argument("--broker", default=settings.LAB_BROKER, help="HOST:PORT of the broker")
        parser.add_argument("--scenario", action="store_true", help="start the default scenario")

    def handle(self, *args, host, port, no_controller, broker, scenario, **options):
        from consumers_app.lab.runtime import LabRuntime

        url = f"http://{host}:{port}"
        runtime = None if no_controller else LabRuntime(broker, scenario=scenario, out=self.stdout, url=url)

        async def start():
            self.stdout.write(f"web listening on {url}/")
            self.stdout.flush()
            if runtime is not None:
                await runtime.start()

        ok = run_web(host, port, on_start=start, on_stop=runtime and runtime.stop)
        self.stdout.write(f"web on http://{host}:{port}/ stopped")
        if not ok:
            sys.exit(1)
