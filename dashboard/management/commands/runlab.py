"""Start the whole lab in one command: broker, web server (daphne) and lab controller.

0. Take the data directory (one lab per data dir: a second one exits 1 naming the first).
1. ``runbroker`` as a supervised child process on settings.LAB_BROKER (data in
   settings.LAB_BROKER_DATA_DIR), restarted if it dies (consumers_app/lab/broker_process.py).
   With LAB_LAG_SERVICE (on by default), ``lagservice`` too: the lag history keeps itself
   fresh (dashboard/lag/service_process.py).
2. ``runweb`` in this process: daphne plus the controller, which starts the workers
   and the default scenario (unless --no-scenario), then prints a one-time login URL.
3. SIGINT/SIGTERM: the lag service, workers, then web, then the broker stop cleanly. If this process is
   SIGKILLed, every child follows it (consumers_app/lab/lifeline.py).

With ``--namesrv HOST:PORT`` (or LAB_NAMESRV) step 1 is replaced: the lab runs on that
existing cluster (consumers_app/lab/cluster_admin.py), after checking that its name server
answers; pop groups use LAB_PROXY, a RocketMQ 5 proxy, when set.
"""
import asyncio
import re
import socket
import sys

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from consumers_app.lab.broker_process import BrokerProcess
from consumers_app.lab.cluster_admin import ClusterAdmin, ClusterUnreachable, reach
from consumers_app.lab.lifeline import DataDirInUse, DataDirLock
from consumers_app.lab.persistence import LabMemory
from consumers_app.lab.runtime import LabRuntime, parse_client_options
from consumers_app.lab.webserver import run_web
from consumers_app.management.commands.runbroker import Command as RunBroker
from dashboard.auth import issue_login_token
from dashboard.lag.service_process import LagServiceProcess


class Command(BaseCommand):
    help = "Run the broker (or attach to a cluster), the dashboard (daphne) and the lab with its default scenario."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=None,
                            help="the dashboard's port (default 8000, or the next free one)")
        parser.add_argument("--no-scenario", action="store_true", help="start with no topics, producers or consumers")
        parser.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                            help="extra argument for runbroker, e.g. --broker-arg=--client-expiry-ms=3000")
        parser.add_argument("--client-option", action="append", default=[], metavar="KIND.NAME=VALUE",
                            help="client config override, e.g. push.heartbeat_interval_ms=1000 (KIND * = all)")
        parser.add_argument("--workers", type=int, default=2, help="worker processes hosting the clients")
        parser.add_argument("--namesrv-port", type=int, default=None,
                            help="the broker's RocketMQ name server port, for remoting clients "
                                 "(default 9876, or the next free one; 0: any free port)")
        parser.add_argument("--remoting-port", type=int, default=None,
                            help="first remoting port of the logical brokers (default 10911, or the next free "
                                 "ones; 0: any free ports)")
        parser.add_argument("--fresh", action="store_true",
                            help="forget the saved lab state and start from the default scenario")
        parser.add_argument("--namesrv", default=settings.LAB_NAMESRV, metavar="HOST:PORT",
                            help="run on the existing RocketMQ cluster of this name server instead of "
                                 "starting a broker (env LAB_NAMESRV)")
        parser.add_argument("--topic", metavar="TOPIC",
                            help="with --namesrv: run the default scenario on this existing topic instead "
                                 "of creating TopicTest")

    def handle(self, *args, host, port, no_scenario, broker_arg, client_option, workers, fresh, namesrv_port,
               remoting_port, namesrv, topic, **options):
        self.lag_lines = JavaTraceLines(self.stdout)   # the lag service's output, as the terminal gets it
        try:
            client_options = parse_client_options(client_option)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if topic is not None and not namesrv:
            raise CommandError("--topic names an existing topic of a cluster: use it with --namesrv")
        if namesrv:
            self.check_cluster(namesrv, topic)
        port = self.free_port(host, "--port", port, 8000)
        if not namesrv:
            namesrv_port = self.free_port("127.0.0.1", "--namesrv-port", namesrv_port, 9876)
            remoting_port = self.free_port("127.0.0.1", "--remoting-port", remoting_port, 10911, span=BROKERS_SPAN)
            broker_host, _, broker_port = settings.LAB_BROKER.rpartition(":")
            free = self.free_port(broker_host, "LAB_BROKER", None, int(broker_port))
            settings.LAB_BROKER = f"{broker_host}:{free}"
        url = f"http://{host}:{port}"
        lock = DataDirLock(settings.DATA_DIR)
        try:
            lock.acquire(url=url)
        except DataDirInUse as exc:
            self.stderr.write(str(exc))
            sys.exit(1)
        try:
            # The login URL needs the auth tables: a fresh data dir must work on its own.
            self.say("migrating database…")
            call_command("migrate", interactive=False, verbosity=0)
            common = dict(scenario=not no_scenario, out=self.stdout, url=url, client_options=client_options,
                          pool_size=workers, memory=LabMemory(), fresh=fresh, login_url=lambda: self.login_url(url),
                          lag_service=self.lag_service_process() if settings.LAB_LAG_SERVICE else None)
            if namesrv:
                runtime = LabRuntime(settings.LAB_PROXY, cluster=ClusterAdmin(namesrv), topic=topic, **common)
            else:
                broker_args = self.broker_args([f"--namesrv-port={namesrv_port}", f"--remoting-port={remoting_port}",
                                                *broker_arg])
                # As runbroker will read them (a --broker-arg may override the data dir): the disk figures need them.
                broker_options = RunBroker().create_parser("manage.py", "runbroker").parse_args(broker_args)
                runtime = LabRuntime(settings.LAB_BROKER, broker=self.broker_process(broker_args),
                                     broker_data_dir=settings.BASE_DIR / broker_options.data_dir,
                                     commitlog_budget=broker_options.retention_mb << 20, **common)

            async def stop() -> None:
                # What Spark says while it is being stopped is the stop working, not news.
                self.lag_lines.stopping = True
                await runtime.stop()

            ok = run_web(host, port, on_start=runtime.start, on_stop=stop)
        finally:
            lock.release()
        self.stdout.write("Rebalance Lab stopped")
        if not ok:
            sys.exit(1)

    def free_port(self, host: str, flag: str, asked: int | None, default: int, span: int = 1) -> int:
        """The port to use for ``flag``: the one asked for, which must be free (else exit 1
        naming the port and the flag), or the default, or past it the next free one, said
        as Jupyter says it. ``span``: ports taken upward from it (one per logical broker)."""
        if asked == 0:
            return 0
        port = default if asked is None else asked
        taken = self.__dict__.setdefault("_ports_taken", set())   # by the flags checked before this one
        for candidate in range(port, port + (1 if asked is not None else 50)):
            ports = range(candidate, candidate + span)
            if not taken.intersection(ports) and all(_free(host, p) for p in ports):
                if candidate != port:
                    self.say(f"port {port} ({flag}) is in use, using {candidate}")
                taken.update(ports)
                return candidate
        if asked is not None:
            raise CommandError(f"port {port} is in use: pick another with {flag}=PORT (0: any free port)")
        raise CommandError(f"ports {port}-{port + 49} are in use: pick one with {flag}=PORT")

    def check_cluster(self, namesrv: str, topic: str | None) -> None:
        """Exit 1 with one line on stderr unless the name server answers with its brokers
        (and has ``topic``, when one is named)."""
        # A loop of its own, not asyncio.run: that would leave no current loop for daphne's reactor.
        loop = asyncio.new_event_loop()
        try:
            brokers = loop.run_until_complete(reach(namesrv, topic=topic))
        except ClusterUnreachable as exc:
            self.stderr.write(str(exc))
            sys.exit(1)
        finally:
            loop.close()
        self.say(f"name server {namesrv} answers: brokers {', '.join(brokers)}")

    @staticmethod
    def broker_args(extra_args) -> list[str]:
        """runbroker's arguments: the lab's broker address and data dir, then the extras."""
        broker_host, _, broker_port = settings.LAB_BROKER.rpartition(":")
        return ["--host", broker_host, "--port", broker_port, "--data-dir", str(settings.LAB_BROKER_DATA_DIR),
                *extra_args]

    def broker_process(self, broker_args) -> BrokerProcess:
        argv = [sys.executable, str(settings.BASE_DIR / "manage.py"), "runbroker", *broker_args]
        return BrokerProcess(argv, settings.LAB_BROKER, cwd=settings.BASE_DIR, out=self.stdout)

    def lag_service_process(self) -> LagServiceProcess:
        # Verbosity 0: runlab's output shows when the service pauses or resumes, not every pass.
        argv = [sys.executable, str(settings.BASE_DIR / "manage.py"), "lagservice", "--verbosity", "0"]
        return LagServiceProcess(argv, cwd=settings.BASE_DIR, out=self.lag_lines)

    @staticmethod
    async def login_url(url: str) -> str:
        token = await sync_to_async(issue_login_token)()   # it writes to the database
        return f"{url}/login/?token={token}"

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()


BROKERS_SPAN = 2   # the embedded broker's logical brokers (broker-a, broker-b): a remoting port each


def _free(host: str, port: int) -> bool:
    """Nobody listens on host:port (binding it now succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class JavaTraceLines:
    """The lag service's output with Java stack traces cut to their first line. Once the
    lab is ``stopping``, its errors go too: Spark says RejectedExecutionException (and logs
    an ERROR per task it drops) when it is stopped mid-job, and that is the stop working,
    not news. Everything else passes as it is."""

    FRAME = re.compile(r"^(\[[\w-]+\] )?(\s+at \S|\s*\.\.\. \d+ more|Caused by: |\s+Suppressed: )")
    # An exception's first line (java.util.concurrent.RejectedExecutionException: ...,
    # py4j.protocol.Py4JError: ...) or a Spark log line of level ERROR or WARN.
    ERROR = re.compile(r"^(\[[\w-]+\] )?([\w$]+\.)*[\w$]*(Exception|Error)(: |$)"
                       r"|^(\[[\w-]+\] )?(\d\d:\d\d:\d\d )?(ERROR|WARN) ")

    def __init__(self, out):
        self.out = out
        self.stopping = False

    def write(self, text: str) -> None:
        kept = [line for line in text.splitlines(keepends=True)
                if not self.FRAME.match(line) and not (self.stopping and self.ERROR.match(line))]
        if kept:
            self.out.write("".join(kept))

    def flush(self) -> None:
        self.out.flush()
