"""A stand-in lab controller for the web tests: same bus, same snapshot shape, no broker.

    lab = FakeLab()
    task = asyncio.create_task(lab.run())         # answer bus requests (and tick, if asked)

Only the *backend* is fake: what the controller's handlers would do to workers and
brokers. Which actions exist, their params and every check and refusal are the real
ones (the action table in consumers_app/lab/actions.py, the handlers' checks against the
running lab), and the read-only actions are the controller's own handlers on this lab's
real LabState. It allocates with the real strategies (consumers_app.allocate) so a page
switched to AVG_BY_CIRCLE shows what RocketMQ would, and publishes the events a real lab
would (assignment, membership, fault, pq, flow_control). As a process
(`python -m tests.fake_lab`) it serves whatever channel layer the settings name: with
CHANNEL_LAYER_URL, several web processes share it; `tests/fake_lab_server.py` runs it
inside one daphne instead.
"""
import asyncio
import os

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.events import make_event, now_ms
from consumers_app.lab import bus
from consumers_app.lab.actions import checked_request
from consumers_app.lab.controller import Limits
from consumers_app.lab.handlers import ActionHandlers, checked_new_consumer, checked_queue_change
from consumers_app.lab.peers import OURS
from consumers_app.lab.state import LabState
from consumers_app.message_queue import MessageQueue

TOPIC = "TopicTest"
PQ_LIMIT = 1000   # pullThresholdForQueue


class FakeLab:
    """Keeps a real LabState: every event it makes is applied there, so its snapshot is
    the real snapshot (one builder) and its events the real event types."""

    limits = Limits()
    namesrv = "127.0.0.1:9876"   # what the real checks want before a peer client joins; nothing listens

    def __init__(self, consumers: int = 3, queues_per_broker: int = 4, tick: float | None = None):
        self.tick = tick
        self.state = LabState()
        self.queues = {"broker-a": queues_per_broker, "broker-b": queues_per_broker}
        self.state.brokers = {b: True for b in self.queues}
        self.state.producers[TOPIC] = {"rate": 100, "producer_id": "producer-1"}
        self.state.broker_process.update(managed=True)
        mib = 1 << 20
        self.state.disk = {"commitlog": 312 * mib, "consumequeue": 4 * mib, "recordings": 20 * mib,
                           "lag_history": 3 * mib, "database": mib, "total": 340 * mib,
                           "budget": {"commitlog": 1024 * mib}, "ts": now_ms()}
        self.state.set_topic_queues(TOPIC, self.labels())
        self.cached: dict[tuple[str, str], int] = {}
        self.next_id = 1
        self.requests: list[tuple[str, dict]] = []
        self.state.add_group("GID_LAB", TOPIC, "push", "AVG")
        for _ in range(consumers):
            self._add("GID_LAB")
        self._rebalanced("GID_LAB", "start")
        self.state.drain()

    @property
    def groups(self):
        return self.state.groups

    @property
    def broker_process(self) -> dict:
        return self.state.broker_process

    # -- model -------------------------------------------------------------------

    def labels(self) -> list[str]:
        mqs = [MessageQueue(TOPIC, b, q) for b, n in self.queues.items() if self.state.brokers[b]
               for q in range(n)]
        return [mq.label for mq in sorted(mqs)]

    def _emit(self, type: str, group: str = "", client_id: str = "", **fields) -> None:
        self.state.apply(make_event(type, group, client_id, **fields))

    def _add(self, group: str, client: str = OURS) -> str:
        """A new member of ``group``: one of ours, or another client's (a peer, whose
        queues the broker tells)."""
        client_id = f"c{self.next_id}" if client == OURS else f"192.0.2.{self.next_id}@{client}"
        self.next_id += 1
        added = self.state.add_client(client_id, group, self.groups[group].mode)
        added.status = "running"
        if client != OURS:
            added.client, added.assignment_source = client, "broker"
        self._emit("membership", group, client_id, source="broker", reason="joined", joined=[client_id],
                   members=self.alive(group))
        return client_id

    def alive(self, group: str) -> list[str]:
        return [c.client_id for c in self.state.clients.values() if c.group == group and c.alive]

    def assignments(self, group: str) -> dict[str, list[MessageQueue]]:
        g = self.groups[group]
        mqs, cids = sort_for_allocation([MessageQueue.from_label(TOPIC, x) for x in self.labels()], self.alive(group))
        if g.mode == "pop":  # one assignment per broker, queue id -1: "pop from any queue"
            return {c: [MessageQueue(TOPIC, b, -1) for b, on in self.state.brokers.items() if on] for c in cids}
        if not mqs or not cids:
            return {c: [] for c in cids}
        strategy = get_strategy(g.strategy)
        return {c: list(strategy.allocate(group, c, mqs, cids)) for c in cids}

    def snapshot(self) -> dict:
        return self.state.snapshot()

    # -- requests (bus.serve handler) -----------------------------------------------

    async def handle(self, action: str, params: dict) -> dict:
        """As LabController.handle: the real table checks the request, then the fake
        backend (``do_<action>``) acts, or the controller's own handler answers a read."""
        self.requests.append((action, params))
        spec, params = checked_request(self, action, params)
        backend = getattr(self, f"do_{spec.name}", None)
        if backend is not None:
            result = backend(**params)
        else:
            result = await getattr(ActionHandlers, f"action_{spec.name}")(self, **params)
        await self.publish()
        return result

    async def publish(self) -> None:
        await bus.publish([e.to_dict() for e in self.state.drain()])

    def _rebalanced(self, group, reason):
        """Every member rebalances, as a real one reports it: what it added and removed
        (nothing at all, when the allocation did not change)."""
        g = self.groups[group]
        for client_id, mqs in self.assignments(group).items():
            before = set(g.assignments.get(client_id, ()))
            added = [mq for mq in mqs if mq.label not in before]
            removed = sorted(set(before) - {mq.label for mq in mqs})
            self._emit("assignment", group, client_id, topic=TOPIC, queues=mqs, strategy=g.strategy, reason=reason)
            self._emit("rebalance", group, client_id, topic=TOPIC, phase="end", reason=reason, strategy=g.strategy,
                       duration_ms=3, added=added, removed=[MessageQueue.from_label(TOPIC, x) for x in removed])

    # -- the backend: what the controller's handlers do to workers and brokers ----------
    # Called with checked params (they are also the scenario builders' shortcuts).

    def do_set_strategy(self, group, strategy, options=None):
        self.groups[group].strategy = strategy
        self._rebalanced(group, "strategy changed")
        return self.snapshot()

    def do_set_mode(self, group, mode):
        self.groups[group].mode = mode
        for client in self.state.clients.values():
            if client.group == group:
                client.mode = mode
        self._rebalanced(group, "mode changed")
        return self.snapshot()

    def do_add_consumer(self, group, mode=None, topic=None, strategy=None, client=OURS):
        new_group = checked_new_consumer(self, group, mode, topic, strategy, client)
        if new_group is not None:
            self.state.add_group(group, **new_group)
        client_id = self._add(group, client)
        self._rebalanced(group, "membership changed")
        return {"client_id": client_id, "state": self.snapshot()}

    def do_consumer(self, client_id, action, ms=None, ratio=None):
        group = self.state.clients[client_id].group
        detail = {"ms": ms} if action == "slow" else {"ratio": ratio} if action == "fail" else {}
        self._emit("fault", group, client_id, fault=action, **detail)
        if action in ("stop", "kill"):
            self.state.client_gone(client_id, {"stop": "stopped", "kill": "killed"}[action])
            self._emit("membership", group, client_id, source="broker",
                       reason="unregistered" if action == "stop" else "closed", left=[client_id],
                       members=self.alive(group))
            self._rebalanced(group, "membership changed")
        return self.snapshot()

    def do_producer_rate(self, topic, rate):
        self.state.producers[topic]["rate"] = rate
        return self.snapshot()

    def do_producer_burst(self, topic, count):
        return self.snapshot()

    def do_queues(self, topic, delta, broker=None):
        broker = checked_queue_change(self, topic, delta, broker)
        self.queues[broker] += delta
        self._emit("broker", broker=broker, topic=topic, change="queues", delta=delta,
                   queues=[MessageQueue.from_label(TOPIC, x) for x in self.labels()])
        for group in list(self.groups):
            self._rebalanced(group, "queues changed")
        return self.snapshot()

    def do_broker(self, broker, online):
        self._emit("broker", broker=broker, online=online, change="online" if online else "offline")
        self.state.set_topic_queues(TOPIC, self.labels())
        for group in list(self.groups):
            self._rebalanced(group, "broker changed")
        return self.snapshot()

    def do_observe(self, group):
        """The fake cluster has every group asked for, on TopicTest, with no one online."""
        existing = self.groups.get(group)
        if existing is not None and not existing.observed:
            raise bus.LabError(f"group {group} is the lab's own: the page shows it already")
        if existing is None:
            self.state.add_group(group, TOPIC, "push", strategy="").observed = True
        return {"group": group, "state": self.snapshot()}

    # -- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Answer requests; with ``tick``, also report ProcessQueues (hung consumers fill up)."""
        server = asyncio.create_task(bus.serve(self.handle))
        try:
            while self.tick:
                await asyncio.sleep(self.tick)  # noqa: sleep-ok - the fake's report interval, not a wait
                self.report()
                await self.publish()
            await server
        finally:
            server.cancel()

    def report(self) -> None:
        """One tick: each queue's cache (growing while its owner hangs) and the broker's lag."""
        for group in list(self.groups):
            offsets = {}
            for client_id, mqs in self.assignments(group).items():
                hung = self.state.clients[client_id].status == "hung"
                for mq in mqs:
                    key = (client_id, mq.label)
                    self.cached[key] = cached = min(PQ_LIMIT, self.cached.get(key, 0) + 250) if hung else 0
                    offsets[mq.label] = cached
                    self._emit("pq", group, client_id, topic=TOPIC, queue=mq, cached_count=cached,
                               cached_bytes=cached * 1024, span=cached, inflight=0)
                    if cached >= PQ_LIMIT:
                        self._emit("flow_control", group, client_id, topic=TOPIC, queue=mq, reason="count",
                                   threshold=PQ_LIMIT, value=cached)
            self.state.set_offsets(group, now_ms(), [
                {"label": label, "committed_offset": 0, "max_offset": lag, "min_offset": 0}
                for label, lag in offsets.items()])


# ---------------------------------------------------------------- real sizes (browser tests, bench)

def broker_names(n: int) -> list[str]:
    return [f"broker-{chr(ord('a') + i)}" for i in range(n)]


class ScaledFakeLab(FakeLab):
    """GID_LAB at real sizes: ``consumers`` push consumers on ``brokers`` × ``queues_per_broker``
    queues (broker-a, broker-b, ...). ``claim`` and ``release`` make what a rebalance under way
    shows (a queue with two owners, one with none). A stop or kill is the moment right after
    a real one: the broker dropped the consumer and the survivors have not rebalanced yet,
    so its queues stay unowned."""

    def __init__(self, consumers: int = 64, brokers: int = 4, queues_per_broker: int = 64, tick: float | None = None):
        self._leaving = False   # inside a stop or kill (see _rebalanced)
        super().__init__(consumers=0, queues_per_broker=0, tick=tick)
        self.queues = {b: queues_per_broker for b in broker_names(brokers)}
        self.state.brokers = {b: True for b in self.queues}
        self.state.set_topic_queues(TOPIC, self.labels())
        for _ in range(consumers):
            self._add("GID_LAB")
        self._rebalanced("GID_LAB", "start")
        self.state.drain()

    def assign(self, client_id: str, labels, group: str = "GID_LAB", reason: str = "rebalance under way") -> None:
        """``client_id`` reports holding ``labels`` (an assignment event, as the client sends it)."""
        self._emit("assignment", group, client_id, topic=TOPIC, queues=[MessageQueue.from_label(TOPIC, x) for x in labels],
                   strategy=self.groups[group].strategy, reason=reason)

    def claim(self, client_id: str, label: str, group: str = "GID_LAB") -> None:
        """``client_id`` takes ``label`` too, before its owner has let it go: two owners."""
        self.assign(client_id, [*self.groups[group].assignments.get(client_id, []), label], group)

    def release(self, label: str, group: str = "GID_LAB") -> None:
        """Whoever holds ``label`` lets it go, before anyone takes it: unowned."""
        for client_id, held in list(self.groups[group].assignments.items()):
            if label in held:
                self.assign(client_id, [x for x in held if x != label], group)

    def do_consumer(self, client_id, action, ms=None, ratio=None):
        self._leaving = action in ("stop", "kill")
        try:
            return super().do_consumer(client_id, action, ms=ms, ratio=ratio)
        finally:
            self._leaving = False

    def _rebalanced(self, group, reason):
        if not self._leaving:   # a leave: the survivors rebalance later
            super()._rebalanced(group, reason)


def serve(make_lab, port: int, host: str = "127.0.0.1") -> None:
    """Serve the dashboard on daphne with the lab ``make_lab()`` builds inside, and print a
    one-time login line as runlab does (``open http://HOST:PORT/login/?token=...``). For
    browser tests and benchmarks, in a process of its own with a scratch LAB_DATA_DIR."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    from daphne.server import Server
    from django.core.management import call_command

    from dashboard.asgi import application
    from dashboard.auth import issue_login_token
    from tests.fake_lab_server import with_fake_lab

    call_command("migrate", verbosity=0)
    lab = make_lab()
    print(f"Rebalance Lab (fake): open http://{host}:{port}/login/?token={issue_login_token()}", flush=True)
    Server(with_fake_lab(application, lab), endpoints=[f"tcp:port={port}:interface={host}"], verbosity=0).run()


if __name__ == "__main__":  # python -m tests.fake_lab  (a controller process on the configured layer)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    print("fake lab serving", flush=True)
    asyncio.run(FakeLab(tick=float(os.environ.get("FAKE_LAB_TICK", "0.2"))).run())
