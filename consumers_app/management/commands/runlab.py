"""Start the whole lab in one command: broker, web server (daphne) and lab controller."""
import subprocess
import sys

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the dashboard (daphne) and the lab."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, host, port, **options):
        self.stdout.write(f"Rebalance Lab: open http://{host}:{port}/")
        sys.exit(subprocess.call([sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "dashboard.asgi:application"]))
