"""The lab the web tests run against: the real LabController on a fake outside world.

    lab = FakeLab()        # GID_LAB: 3 push consumers of TopicTest, 4 queues on broker-a and on broker-b
    await lab.start()      # the scenario runs and the lab answers the bus
    ...
    await lab.stop()

Only the broker and the clients are fakes (tests/fake_world.py, given to the controller as
its ``admin`` and ``workers``): every action, check, refusal, event and snapshot is the
lab's own. ``requests`` lists what the bus brought the controller, before any check (so a
test can tell that a refusal of the web side never reached it). The lab polls the broker's
offsets once as it starts and then only when asked (``poll()``), unless given a clock.

Served (``serve``), the dashboard runs on daphne with a lab inside, for the browser tests
and benchmarks. As a process (``python -m tests.fake_lab``) it serves whatever channel layer
the settings name: with CHANNEL_LAYER_URL, several web processes share it.
"""
import asyncio
import os

from channels.layers import get_channel_layer

from consumers_app.lab import bus
from consumers_app.lab.controller import LabController
from consumers_app.lab.scenario import GroupSpec, Scenario

from .fake_world import FakeWorld

TOPIC = "TopicTest"
NO_CLOCK = 10**9    # an offset poll interval no test outlives: the lab polls when asked
SERVED_POLL_S = 1.0   # a served lab polls as runlab's does
START_TIMEOUT = 30.0


def broker_names(n: int) -> list[str]:
    return [f"broker-{chr(ord('a') + i)}" for i in range(n)]


class FakeLab:
    def __init__(self, consumers: int = 3, brokers: int = 2, queues_per_broker: int = 4,
                 groups: tuple[GroupSpec, ...] = (), poll_interval: float = NO_CLOCK):
        self.world = FakeWorld()
        self.scenario = Scenario(
            topics={TOPIC: {b: queues_per_broker for b in broker_names(brokers)}}, producers={TOPIC: 100},
            groups=(GroupSpec("GID_LAB", TOPIC, "push", "AVG", consumers), *groups))
        self.controller = LabController("fake-broker:8081", admin=self.world.broker, workers=self.world.workers,
                                        flush_interval=0.05, poll_interval=poll_interval)
        self.controller.state.broker_process.update(managed=True)   # as runlab's own broker
        self.requests: list[tuple[str, dict]] = []
        self._answer = self.controller.handle
        self.controller.handle = self._recorded   # what lifecycle.start gives bus.serve

    async def _recorded(self, action: str, params: dict) -> dict:
        self.requests.append((action, params))
        return await self._answer(action, params)

    async def start(self) -> "FakeLab":
        """The scenario set up and published: from here the lab says only what happens next."""
        layer = get_channel_layer()
        listener = await layer.new_channel()
        await layer.group_add(bus.EVENTS_GROUP, listener)
        try:
            await self.controller.start(self.scenario)
            self.state.drain()   # the start's story: no page was there to see it
            await asyncio.wait_for(_snapshot_published(layer, listener), START_TIMEOUT)
        finally:
            await layer.group_discard(bus.EVENTS_GROUP, listener)
        return self

    async def stop(self) -> None:
        await self.controller.stop()

    async def ask(self, action: str, **params) -> dict:
        """A request as the bus brings it, not counted in ``requests`` (a scenario's step)."""
        return await self._answer(action, params)

    async def poll(self) -> None:
        """One offset poll, as the lab's clock would make it."""
        await self.controller.poll_offsets()

    @property
    def state(self):
        return self.controller.state

    @property
    def groups(self):
        return self.state.groups

    @property
    def broker_process(self) -> dict:
        return self.state.broker_process

    def labels(self) -> list[str]:
        """TopicTest's readable queues, in MessageQueue order."""
        return [mq.label for mq in self.world.broker.queues(TOPIC, online_only=True)]


async def served_lab(**options) -> FakeLab:
    """A started FakeLab that polls on runlab's clock (for ``serve``)."""
    return await FakeLab(poll_interval=SERVED_POLL_S, **options).start()


async def _snapshot_published(layer, channel) -> None:
    """Until a batch with a snapshot reaches ``channel`` (the one the start's offset poll made due)."""
    while not any(e.get("type") == "snapshot" for e in (await layer.receive(channel))["events"]):
        pass


def serve(build, port: int, host: str = "127.0.0.1") -> None:
    """Serve the dashboard on daphne with the lab ``await build()`` makes and starts, and
    print a one-time login line as runlab does (``open http://HOST:PORT/login/?token=...``).
    The lab is built in daphne's loop on the first connection (the loop exists only then);
    every connection waits for it. In a process of its own with a scratch LAB_DATA_DIR."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    from daphne.server import Server
    from django.core.management import call_command

    from dashboard.asgi import application
    from dashboard.auth import issue_login_token

    call_command("migrate", verbosity=0)
    built: list[asyncio.Task] = []

    async def build_unseen() -> FakeLab:
        lab = await build()
        lab.state.drain()   # what happened before any page was there: its first snapshot has it
        return lab

    async def with_lab(scope, receive, send):
        if not built:
            built.append(asyncio.get_running_loop().create_task(build_unseen()))
        await asyncio.shield(built[0])
        return await application(scope, receive, send)

    print(f"Rebalance Lab (fake): open http://{host}:{port}/login/?token={issue_login_token()}", flush=True)
    Server(with_lab, endpoints=[f"tcp:port={port}:interface={host}"], verbosity=0).run()


async def _serve_the_layer(tick: float) -> None:
    lab = await FakeLab(poll_interval=tick or NO_CLOCK).start()
    print("fake lab serving", flush=True)
    if not tick:
        await asyncio.Event().wait()
    while True:
        await asyncio.sleep(tick)  # noqa: sleep-ok - the world's report interval, not a wait
        lab.world.tick()


if __name__ == "__main__":  # python -m tests.fake_lab  (a controller process on the configured layer)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    asyncio.run(_serve_the_layer(float(os.environ.get("FAKE_LAB_TICK", "0.2"))))
