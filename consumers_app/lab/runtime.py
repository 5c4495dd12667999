"""The lab controller's life inside a web process: start, default scenario, stop.

Shared by ``runweb`` and ``runlab`` (which also starts the broker first, or attaches to
an existing cluster instead). Progress goes to ``out`` as the plain lines the README shows.
"""
import asyncio
import json
from pathlib import Path

from django.conf import settings

from .cluster_admin import ClusterAdmin, attachment
from .controller import LabController, Limits
from .disk import DiskPlaces
from .persistence import HandoffStory, LabMemory
from .scenario import DEFAULT, on_cluster


def parse_client_options(items) -> dict:
    """``["push.heartbeat_interval_ms=1000", ...]`` -> ``{"push": {"heartbeat_interval_ms": 1000}}``.

    KIND is a consumer mode (push, lite_pull, pop) or ``producer``; ``*`` means every
    kind. Values are JSON when they parse as JSON, else strings.
    """
    options: dict[str, dict] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        kind, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ValueError(f"client option {item!r} is not KIND.NAME=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        kinds = ("push", "lite_pull", "pop", "producer") if kind == "*" else (kind,)
        for k in kinds:
            options.setdefault(k, {})[name] = value
    return options


def disk_places(broker_data_dir: Path | None, commitlog_budget: int | None) -> DiskPlaces:
    """Where the lab's parts live, from the settings (the lab itself never reads them)."""
    database = settings.DATABASES["default"]
    sqlite = database["ENGINE"].endswith("sqlite3") and database["NAME"] not in ("", ":memory:")
    return DiskPlaces(broker_data_dir=broker_data_dir, commitlog_budget=commitlog_budget,
                      recordings=settings.DATA_DIR / "recordings", lag_history=settings.DATA_DIR / "lag",
                      database=Path(database["NAME"]) if sqlite else None)


class LabRuntime:
    """``broker``: a BrokerProcess that runlab supervises, started before the controller
    and stopped after it (None when the broker is someone else's); ``broker_data_dir``
    and ``commitlog_budget`` (bytes) are its data dir and retention, for the disk figures.
    ``cluster``: a ClusterAdmin when the lab runs on an existing cluster (no broker of its
    own); ``broker_address`` is then that cluster's proxy, for pop groups ("" = none).
    ``lag_service``: another supervised child (start/stop) runlab may add, started with
    the broker (nothing waits for it) and stopped first."""

    def __init__(self, broker_address: str, *, scenario: bool, out, url: str | None = None,
                 client_options: dict | None = None, pool_size: int = 2, broker=None,
                 memory: LabMemory | None = None, fresh: bool = False, login_url=None,
                 broker_data_dir: Path | None = None, commitlog_budget: int | None = None,
                 cluster: ClusterAdmin | None = None, lag_service=None, topic: str | None = None):
        self.cluster = cluster
        self.topic = topic   # on a cluster: an existing topic the scenario runs on (runlab --topic)
        self.controller = LabController(
            broker_address, client_options=client_options, pool_size=pool_size,
            recorder_root=settings.DATA_DIR / "recordings", memory=memory,
            observe_interval=settings.LAB_OBSERVE_INTERVAL, recordings_hours=settings.LAB_RECORDINGS_HOURS,
            limits=Limits(consumers=settings.LAB_MAX_CONSUMERS, group_consumers=settings.LAB_MAX_GROUP_CONSUMERS,
                          topic_queues=settings.LAB_MAX_TOPIC_QUEUES),
            disk=disk_places(broker_data_dir, commitlog_budget),
            handoff_story=HandoffStory(settings.DATA_DIR / "handoffs.json") if memory is not None else None,
            admin=cluster, cluster=attachment(cluster.namesrv, broker_address) if cluster is not None else None)
        self.memory = memory
        self.fresh = fresh
        self.broker = broker
        self.lag_service = lag_service
        self.scenario = scenario
        self.out = out
        self.url = url
        # async () -> the URL to print; the web app knows how to log a user in, not the lab.
        self.login_url = login_url

    def say(self, line: str) -> None:
        self.out.write(line)
        self.out.flush()

    async def start(self) -> None:
        if self.broker is not None:
            self.say("starting broker…")
            await self.broker.start()
            self.broker.on_change = self.controller.broker_process_changed
            if self.broker.namesrv:
                self.use_namesrv(self.broker.namesrv)
            self.controller.broker_process_changed(self.broker.status())
            self.say("broker ready")
        if self.cluster is not None:
            self.use_namesrv(self.cluster.namesrv)
        if self.lag_service is not None:
            await self.lag_service.start()
        scenario = await self.starting_scenario()
        self.say("starting workers…")
        await self.controller.start(scenario)
        if scenario is not None:
            self.say("scenario running")
        if self.url:
            self.say(await self.login_line())

    def use_namesrv(self, namesrv: str) -> None:
        """Our push and lite-pull consumers and the producer are RocketMQ clients: they find
        the brokers through the name server and speak remoting, as Java's do
        (--client-option=push.namesrv= opts a kind out). Pop stays on gRPC (the proxy's)."""
        self.controller.namesrv = namesrv
        for kind in ("push", "lite_pull", "producer"):
            self.controller.client_options.setdefault(kind, {}).setdefault("namesrv", namesrv)

    async def starting_scenario(self):
        """The lab as it was left (saved in the database), else the default scenario;
        ``fresh`` forgets the saved one; no scenario at all when asked for none."""
        if self.memory is not None and self.fresh:
            await self.memory.clear()
            if self.controller.handoff_story is not None:
                self.controller.handoff_story.path.unlink(missing_ok=True)
        if not self.scenario:
            return None
        saved = await self.memory.load() if self.memory is not None and not self.fresh else None
        if saved is not None:
            self.say("restoring the lab as it was left (runlab --fresh starts anew)")
            return saved
        if self.cluster is not None:
            if self.topic is not None:
                self.cluster.topics.add(self.topic)   # adopted, not created: the lab lists it
            return on_cluster(await self.cluster.broker_names(), self.topic)
        return DEFAULT

    async def login_line(self) -> str:
        url = await self.login_url() if self.login_url is not None else f"{self.url}/"
        line = f"Rebalance Lab is running: open {url}"
        if self.broker is not None and self.broker.namesrv:
            line += f"\nname server: {self.broker.namesrv}   (RocketMQ remoting clients join here)"
        if self.cluster is not None:
            line += f"\nname server: {self.cluster.namesrv} (attached)"
        return line

    async def stop(self) -> None:
        # The lag service stops alongside the lab, not before it: its pass in progress
        # (cut short, which loses nothing) must not hold the rest of the stop up.
        lag = asyncio.ensure_future(self.lag_service.stop()) if self.lag_service is not None else None
        self.say("stopping workers…")
        try:
            await self.controller.stop()
            if self.broker is not None:   # last: the consumers have said goodbye and committed
                await self.broker.stop()
            if self.cluster is not None:
                await self.cluster.close()
        finally:
            if lag is not None:
                await lag
