"""Start the whole lab in one command: broker, web server (daphne) and lab controller.

1. ``runbroker`` as a child process on settings.LAB_BROKER (data in
   settings.LAB_BROKER_DATA_DIR); wait for its ``broker listening on`` line.
2. ``runweb`` in this process: daphne plus the controller, which starts the workers
   and the default scenario (unless --no-scenario), then prints a one-time login URL.
3. SIGINT/SIGTERM: workers, then web, then the broker stop cleanly.
"""
import signal
import subprocess
import sys
import threading

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from consumers_app.lab.runtime import LabRuntime, parse_client_options
from consumers_app.lab.webserver import run_web

BROKER_START_TIMEOUT = 60.0


class Command(BaseCommand):
    help = "Run the broker, the dashboard (daphne) and the lab with its default scenario."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-scenario", action="store_true", help="start with no topics, producers or consumers")
        parser.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                            help="extra argument for runbroker, e.g. --broker-arg=--client-expiry-ms=3000")
        parser.add_argument("--client-option", action="append", default=[], metavar="KIND.NAME=VALUE",
                            help="client config override, e.g. push.heartbeat_interval_ms=1000 (KIND * = all)")
        parser.add_argument("--workers", type=int, default=2, help="worker processes hosting the clients")

    def handle(self, *args, host, port, no_scenario, broker_arg, client_option, workers, **options):
        try:
            client_options = parse_client_options(client_option)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # The login URL needs the auth tables: a fresh data dir must work on its own.
        self.say("migrating database…")
        call_command("migrate", interactive=False, verbosity=0)
        broker = self.start_broker(broker_arg)
        try:
            runtime = LabRuntime(settings.LAB_BROKER, scenario=not no_scenario, out=self.stdout,
                                 url=f"http://{host}:{port}", client_options=client_options, pool_size=workers)
            ok = run_web(host, port, on_start=runtime.start, on_stop=runtime.stop)
        finally:
            self.stop_broker(broker)
        self.stdout.write("Rebalance Lab stopped")
        if not ok:
            sys.exit(1)

    def start_broker(self, extra_args) -> subprocess.Popen:
        self.say("starting broker…")
        broker_host, _, broker_port = settings.LAB_BROKER.rpartition(":")
        # Its own session: a Ctrl-C reaches only us, and we stop the broker last, after
        # the consumers said goodbye and committed their offsets.
        process = subprocess.Popen(
            [sys.executable, str(settings.BASE_DIR / "manage.py"), "runbroker", "--host", broker_host,
             "--port", broker_port, "--data-dir", str(settings.LAB_BROKER_DATA_DIR), *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        listening = False
        decided = threading.Event()   # listening, or the broker's output ended (it died)

        def relay():
            nonlocal listening
            for line in process.stdout:
                if line.startswith("broker listening on"):
                    listening = True
                    decided.set()
                else:
                    sys.stdout.write(f"[broker] {line}")
            decided.set()

        threading.Thread(target=relay, daemon=True).start()
        decided.wait(BROKER_START_TIMEOUT)
        if not listening:
            self.stop_broker(process)
            raise CommandError(f"the broker did not start on {settings.LAB_BROKER}")
        self.say("broker ready")
        return process

    def stop_broker(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
