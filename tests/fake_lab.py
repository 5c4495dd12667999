"""A stand-in lab controller for the web tests: same bus, same snapshot shape, no broker.

    lab = FakeLab()
    task = asyncio.create_task(lab.run())         # answer bus requests (and tick, if asked)

It allocates with the real strategies (consumers_app.allocate) so a page switched to
AVG_BY_CIRCLE shows what RocketMQ would, publishes the events a real lab would
(assignment, membership, fault, pq, flow_control), and refuses what the real
controller refuses with LabError. As a process (`python -m tests.fake_lab`) it serves
whatever channel layer the settings name: with CHANNEL_LAYER_URL, several web
processes share it; `tests/fake_lab_asgi.py` runs it inside one daphne instead.
"""
import asyncio
import os

from consumers_app.allocate import STRATEGY_NAMES, get_strategy, sort_for_allocation
from consumers_app.events import make_event
from consumers_app.lab import bus
from consumers_app.message_queue import MessageQueue

TOPIC = "TopicTest"
PQ_LIMIT = 1000   # pullThresholdForQueue


class FakeLab:
    def __init__(self, consumers: int = 3, queues_per_broker: int = 4, tick: float | None = None):
        self.tick = tick
        self.brokers = {"broker-a": True, "broker-b": True}
        self.queues = {b: queues_per_broker for b in self.brokers}
        self.rate = 100
        self.groups = {"GID_LAB": {"strategy": "AVG", "mode": "push", "clients": {}}}
        self.cached: dict[tuple[str, str], int] = {}
        self.next_id = 1
        self.log: list[dict] = []
        for _ in range(consumers):
            self._add("GID_LAB")
        self.requests: list[tuple[str, dict]] = []
        self.broker_process = {"up": True, "restarts": 0, "managed": True}

    # -- model -------------------------------------------------------------------

    def labels(self) -> list[str]:
        mqs = [MessageQueue(TOPIC, b, q) for b, n in self.queues.items() if self.brokers[b] for q in range(n)]
        return [mq.label for mq in sorted(mqs)]

    def _add(self, group: str) -> str:
        client_id = f"c{self.next_id}"
        self.next_id += 1
        self.groups[group]["clients"][client_id] = {"status": "running", "mode": self.groups[group]["mode"],
                                                     "slow_ms": 0, "fail_ratio": 0.0}
        return client_id

    def alive(self, group: str) -> list[str]:
        return [c for c, s in self.groups[group]["clients"].items() if s["status"] in ("running", "hung")]

    def assignments(self, group: str) -> dict[str, list[str]]:
        g = self.groups[group]
        mqs, cids = sort_for_allocation([MessageQueue.from_label(TOPIC, x) for x in self.labels()], self.alive(group))
        if g["mode"] == "pop":  # one assignment per broker, queue id -1: "pop from any queue"
            return {c: [f"{b}:-1" for b in self.brokers if self.brokers[b]] for c in cids}
        if not mqs or not cids:
            return {c: [] for c in cids}
        strategy = get_strategy(g["strategy"])
        return {c: [mq.label for mq in strategy.allocate(group, c, mqs, cids)] for c in cids}

    def snapshot(self) -> dict:
        groups = {}
        for name, g in self.groups.items():
            assignments = self.assignments(name)
            queues = {}
            for label in self.labels():
                owners = [c for c, ls in assignments.items() if label in ls]
                cached = sum(self.cached.get((c, label), 0) for c in owners)
                queues[label] = {"lag": cached, "cached_count": cached, "cached_bytes": cached * 1024,
                                 "span": cached, "time_lag_ms": cached * 10, "owners": owners}
            groups[name] = {"strategy": g["strategy"], "mode": g["mode"], "topic": TOPIC,
                            "clients": {c: dict(s) for c, s in g["clients"].items()},
                            "assignments": assignments, "queues": queues,
                            "membership_log": [e for e in self.log if e["group"] == name]}
        return {"type": "snapshot", "groups": groups, "topics": {TOPIC: self.labels()},
                "brokers": {b: {"online": on} for b, on in self.brokers.items()},
                "producers": {TOPIC: {"rate": self.rate}}, "broker_process": dict(self.broker_process)}

    # -- requests (bus.serve handler) -----------------------------------------------

    async def handle(self, action: str, params: dict) -> dict:
        self.requests.append((action, params))
        method = getattr(self, f"do_{action}", None)
        if method is None:
            raise bus.LabError(f"unknown action {action!r}")
        events: list[dict] = []
        result = method(events, **params)
        await bus.publish(events)
        return result

    def _group(self, group):
        if group not in self.groups:
            raise bus.LabError(f"unknown group {group!r}")
        return self.groups[group]

    def _rebalanced(self, events, group, reason):
        for client_id, labels in self.assignments(group).items():
            events.append(make_event("assignment", group, client_id, queues=labels,
                                     strategy=self.groups[group]["strategy"], reason=reason))
        events.append(make_event("rebalance", group, "", phase="end", reason=reason, duration_ms=3, changed=[]))

    def do_state(self, events):
        return self.snapshot()

    def do_health(self, events):
        return {"ok": self.broker_process["up"], "broker_process": dict(self.broker_process)}

    def do_set_strategy(self, events, group, strategy):
        if strategy not in STRATEGY_NAMES:
            raise bus.LabError(f"unknown strategy {strategy!r}")
        self._group(group)["strategy"] = strategy
        self._rebalanced(events, group, "strategy changed")
        return self.snapshot()

    def do_set_mode(self, events, group, mode):
        self._group(group)["mode"] = mode
        self._rebalanced(events, group, "mode changed")
        return self.snapshot()

    def do_add_consumer(self, events, group, mode):
        if group not in self.groups:
            self.groups[group] = {"strategy": "AVG", "mode": mode, "clients": {}}
        elif self.groups[group]["mode"] != mode:
            raise bus.LabError(f"group {group} consumes in {self.groups[group]['mode']} mode")
        client_id = self._add(group)
        event = make_event("membership", group, client_id, change="joined", members=self.alive(group))
        self.log.append(event)
        events.append(event)
        self._rebalanced(events, group, "membership changed")
        return {"client_id": client_id, "state": self.snapshot()}

    def do_consumer(self, events, client_id, action, ms=None, ratio=None):
        group = next((n for n, g in self.groups.items() if client_id in g["clients"]), None)
        if group is None:
            raise bus.LabError(f"unknown consumer {client_id!r}")
        client = self.groups[group]["clients"][client_id]
        if client["status"] not in ("running", "hung"):
            raise bus.LabError(f"consumer {client_id} is {client['status']}")
        detail = {"ms": ms} if action == "slow" else {"ratio": ratio} if action == "fail" else {}
        events.append(make_event("fault", group, client_id, fault=action, **detail))
        if action in ("stop", "kill"):
            client["status"] = {"stop": "stopped", "kill": "killed"}[action]
            change = make_event("membership", group, client_id, change="left" if action == "stop" else "expired",
                                members=self.alive(group))
            self.log.append(change)
            events.append(change)
            self._rebalanced(events, group, "membership changed")
        elif action == "hang":
            client["status"] = "hung"
        elif action == "resume":
            client["status"] = "running"
        elif action == "slow":
            client["slow_ms"] = ms
        elif action == "fail":
            client["fail_ratio"] = ratio
        return self.snapshot()

    def do_producer_rate(self, events, topic, rate):
        if topic != TOPIC:
            raise bus.LabError(f"unknown topic {topic!r}")
        self.rate = rate
        return self.snapshot()

    def do_producer_burst(self, events, topic, count):
        if topic != TOPIC:
            raise bus.LabError(f"unknown topic {topic!r}")
        return self.snapshot()

    def do_queues(self, events, topic, delta, broker=None):
        broker = broker or "broker-a"
        if topic != TOPIC or broker not in self.queues:
            raise bus.LabError(f"unknown topic or broker {topic!r}/{broker!r}")
        if self.queues[broker] + delta < 0:
            raise bus.LabError(f"{broker} has only {self.queues[broker]} queue(s)")
        self.queues[broker] += delta
        events.append(make_event("broker", "", "", broker=broker, topic=topic, change="queues", delta=delta,
                                 queues=self.labels()))
        for group in self.groups:
            self._rebalanced(events, group, "queues changed")
        return self.snapshot()

    def do_broker(self, events, broker, online):
        if broker not in self.brokers:
            raise bus.LabError(f"unknown broker {broker!r}")
        self.brokers[broker] = online
        events.append(make_event("broker", "", "", broker=broker, online=online,
                                 change="online" if online else "offline", topic=TOPIC, queues=self.labels()))
        for group in self.groups:
            self._rebalanced(events, group, "broker changed")
        return self.snapshot()

    # -- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Answer requests; with ``tick``, also report ProcessQueues (hung consumers fill up)."""
        server = asyncio.create_task(bus.serve(self.handle))
        try:
            while self.tick:
                await asyncio.sleep(self.tick)  # noqa: sleep-ok - the fake's report interval, not a wait
                await bus.publish(self.tick_events())
            await server
        finally:
            server.cancel()

    def tick_events(self) -> list[dict]:
        events = []
        for group, g in self.groups.items():
            for client_id, labels in self.assignments(group).items():
                hung = g["clients"][client_id]["status"] == "hung"
                for label in labels:
                    key = (client_id, label)
                    self.cached[key] = min(PQ_LIMIT, self.cached.get(key, 0) + 250) if hung else 0
                    cached = self.cached[key]
                    events.append(make_event("pq", group, client_id, queue=label, cached_count=cached,
                                             cached_bytes=cached * 1024, span=cached, inflight=0))
                    if cached >= PQ_LIMIT:
                        events.append(make_event("flow_control", group, client_id, queue=label, reason="count",
                                                 threshold=PQ_LIMIT, value=cached))
        return events


if __name__ == "__main__":  # python -m tests.fake_lab  (a controller process on the configured layer)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    print("fake lab serving", flush=True)
    asyncio.run(FakeLab(tick=float(os.environ.get("FAKE_LAB_TICK", "0.2"))).run())
