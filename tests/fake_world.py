"""The lab's outside world, in-process: what the web tests put around the real LabController.

The controller meets the world at two seams: ``admin`` (the LabAdmin calls it makes of the
broker) and ``workers`` (a supervisor.WorkerPool: where its clients run). Here

* ``FakeBroker`` answers those LabAdmin calls from a few dicts: topics and their queues,
  brokers online or not, each group's members (watched, as WatchMembership streams them),
  queue offsets; and tells the consumers of a group when its members or routes change;
* ``FakeWorkers`` is a WorkerPool of in-process workers: the real ``Worker`` (worker.py)
  carries out each command, on ``FakeClients`` instead of RocketMQ clients;
* ``FakeConsumer`` plays one consumer: it joins and leaves the broker's group, rebalances
  with the real strategies (consumers_app.allocate) on each notice and emits what a real
  one emits (rebalance, assignment, membership, route, fault, pq, flow_control).

So actions, checks, state, events and snapshots are the lab's own code. Deterministic:
nothing waits on a clock, a consumer acts on a notice at once, and the events a command
causes reach the controller before its answer (as a worker sends them before its reply).
``tick()`` plays one report interval (hung consumers fill up and hit flow control) and
``hold_rebalances()`` catches a group between a notice and the rebalances it would cause.
"""
import asyncio
import itertools
import json

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.events import make_event, now_ms
from consumers_app.lab.supervisor import WorkerError
from consumers_app.lab.worker import CommandError, Worker
from consumers_app.message_queue import MessageQueue
from consumers_app.protocol import lab, v2

OK = v2.Code.OK
PQ_LIMIT = 1000          # pullThresholdForQueue: a hung consumer's queue stops filling here
MESSAGES_PER_TICK = 250  # what each queue receives per tick


def _status(code=OK, message: str = "OK") -> lab.Status:
    return lab.Status(code=code, message=message)


def _ref(mq: MessageQueue) -> lab.QueueRef:
    return lab.QueueRef(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


class FakeBroker:
    """The LabAdmin calls the controller makes (each takes the stub's ``timeout``)."""

    def __init__(self):
        self.queue_counts: dict[str, dict[str, int]] = {}   # topic -> broker -> queues
        self.online: dict[str, bool] = {}                   # broker -> online
        self.members: dict[str, list[str]] = {}             # group -> client ids, in join order
        self.consumers: dict[str, "FakeConsumer"] = {}      # client id -> the consumer told of changes
        self.max_offsets: dict[MessageQueue, int] = {}
        self.committed: dict[tuple[str, MessageQueue], int] = {}   # (group, queue) -> offset
        self._watches: dict[str, list[asyncio.Queue]] = {}
        # Sorted queues and members, until the next change: Java's sort of a few hundred
        # queues, for each of 64 consumers' rebalances, is most of a big lab's start otherwise.
        self._sorted: dict[tuple, tuple] = {}

    # -- what the world looks like ---------------------------------------------------

    def queues(self, topic: str, online_only: bool = False) -> list[MessageQueue]:
        """The topic's queues in MessageQueue order; a route has the online brokers' only."""
        key = ("queues", topic, online_only)
        if key not in self._sorted:
            counts = self.queue_counts.get(topic, {})
            self._sorted[key] = tuple(sorted(MessageQueue(topic, b, q) for b, n in counts.items()
                                             if not online_only or self.online[b] for q in range(n)))
        return list(self._sorted[key])

    def allocation_inputs(self, group: str, topic: str) -> tuple[list[MessageQueue], list[str]]:
        """The route's queues and the group's members, sorted as a rebalance sorts them."""
        key = ("allocation", group, topic)
        if key not in self._sorted:
            self._sorted[key] = sort_for_allocation(self.queues(topic, online_only=True), self.members.get(group, []))
        return self._sorted[key]

    def add_backlog(self, mq: MessageQueue, count: int) -> None:
        """``count`` more messages in ``mq`` (its lag, for every group not past them)."""
        self.max_offsets[mq] = self.max_offsets.get(mq, 0) + count

    def _topic_info(self, topic: str) -> lab.TopicInfo:
        return lab.TopicInfo(status=_status(), name=topic, queues=[_ref(mq) for mq in self.queues(topic)])

    # -- membership ------------------------------------------------------------------

    def join(self, group: str, client_id: str, consumer: "FakeConsumer | None" = None) -> None:
        """A member registers (``consumer`` None: someone else's client, only listed)."""
        self.members.setdefault(group, []).append(client_id)
        self._sorted.clear()
        if consumer is not None:
            self.consumers[client_id] = consumer
        self._changed(group, [client_id], [], "joined")

    def leave(self, client_id: str, reason: str) -> None:
        """A member goes: ``left`` (its goodbye), ``closed`` (its connection), ``expired``."""
        self.consumers.pop(client_id, None)
        for group, members in self.members.items():
            if client_id in members:
                members.remove(client_id)
                self._sorted.clear()
                self._changed(group, [], [client_id], reason)

    def _changed(self, group: str, joined: list[str], left: list[str], reason: str) -> None:
        change = lab.MembershipChange(group=group, client_ids=self.members[group], joined=joined, left=left,
                                      reason=reason, ts=now_ms())
        for watch in self._watches.get(group, ()):
            watch.put_nowait(change)
        for client_id in list(self.members[group]):
            consumer = self.consumers.get(client_id)
            if consumer is not None and client_id not in joined:   # a newcomer rebalances as it starts
                consumer.notice(change)

    def _route_changed(self, topic: str) -> None:
        self._sorted.clear()
        for consumer in list(self.consumers.values()):
            if consumer.topic == topic:
                consumer.route_changed()

    async def WatchMembership(self, request: lab.GroupRequest):
        watch: asyncio.Queue = asyncio.Queue()
        self._watches.setdefault(request.group, []).append(watch)
        try:
            yield lab.MembershipChange(group=request.group, client_ids=self.members.get(request.group, []),
                                       reason="initial", ts=now_ms())
            while True:
                yield await watch.get()
        finally:
            self._watches[request.group].remove(watch)

    # -- topics and brokers ------------------------------------------------------------

    async def CreateTopic(self, request: lab.CreateTopicRequest, timeout=None) -> lab.TopicInfo:
        self.queue_counts.setdefault(request.name, {})[request.broker_name] = request.queue_count
        self.online.setdefault(request.broker_name, True)
        self._sorted.clear()
        return self._topic_info(request.name)

    async def AddQueues(self, request: lab.AddQueuesRequest, timeout=None) -> lab.TopicInfo:
        counts = self.queue_counts.get(request.topic)
        if counts is None:
            return lab.TopicInfo(status=_status(v2.Code.TOPIC_NOT_FOUND, f"no topic {request.topic}"))
        new = counts.get(request.broker_name, 0) + request.delta
        if not 0 <= new <= 1024:
            return lab.TopicInfo(status=_status(v2.Code.BAD_REQUEST, f"queue count would become {new}, "
                                                                      f"outside [0, 1024]"))
        if new:
            counts[request.broker_name] = new
        else:
            counts.pop(request.broker_name, None)
        self._route_changed(request.topic)
        return self._topic_info(request.topic)

    async def ListTopics(self, request: lab.ListTopicsRequest, timeout=None) -> lab.ListTopicsResponse:
        return lab.ListTopicsResponse(status=_status(), topics=[self._topic_info(t) for t in sorted(self.queue_counts)])

    async def SetBrokerOnline(self, request: lab.SetBrokerOnlineRequest, timeout=None) -> lab.BrokerInfo:
        if request.broker_name not in self.online:
            return lab.BrokerInfo(status=_status(v2.Code.NOT_FOUND, f"no logical broker named {request.broker_name!r}"))
        self.online[request.broker_name] = request.online
        for topic in sorted(self.queue_counts):
            self._route_changed(topic)
        return lab.BrokerInfo(status=_status(), broker_name=request.broker_name, online=request.online)

    async def ListBrokers(self, request: lab.ListBrokersRequest, timeout=None) -> lab.ListBrokersResponse:
        return lab.ListBrokersResponse(status=_status(), brokers=[
            lab.BrokerInfo(status=_status(), broker_name=b, online=on) for b, on in sorted(self.online.items())])

    # -- offsets -----------------------------------------------------------------------

    async def GetQueueOffsets(self, request: lab.QueueOffsetsRequest, timeout=None) -> lab.QueueOffsetsResponse:
        response = lab.QueueOffsetsResponse(status=_status(), ts=now_ms())
        for topic in [request.topic] if request.topic else sorted(self.queue_counts):
            for mq in self.queues(topic):
                top = self.max_offsets.get(mq, 0)
                committed = self.committed.get((request.group, mq), 0)
                response.queues.add(queue=_ref(mq), min_offset=0, max_offset=top, committed_offset=committed,
                                    # No store times here: a backlog is a second old.
                                    oldest_unconsumed_store_ts=response.ts - 1000 if committed < top else 0)
        return response


class FakeConsumer:
    """One consumer as the worker drives it (the interface of consumers_app.client's)."""

    def __init__(self, world: "FakeWorld", report, *, mode: str, group: str, topic: str, strategy: str,
                 client_id: str, **_connection):
        self.world, self.report = world, report
        self.mode, self.group, self.topic, self.client_id = mode, group, topic, client_id
        self.strategy_name = strategy
        self.strategy = get_strategy(strategy or "AVG")
        self.state = "created"
        self.held: list[MessageQueue] = []
        self.cached: dict[MessageQueue, int] = {}
        self.hung = self.cut_off = False
        self.slow_ms, self.fail_ratio = 0.0, 0.0
        self.members: list[str] = []

    @property
    def broker(self) -> FakeBroker:
        return self.world.broker

    def emit(self, type: str, **fields) -> None:
        self.report([make_event(type, self.group, self.client_id, **fields)])

    # -- life ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.state = "running"
        self.broker.join(self.group, self.client_id, self)
        self.members = list(self.broker.members[self.group])
        if self.mode == "pop":
            self._pop_assignment(started=True)
        else:
            self.rebalance("start")

    async def shutdown(self) -> None:
        """Graceful: its queues let go, goodbye said (the broker tells the group at once)."""
        if self.state != "running":
            return
        self.state = "stopped"
        self.held, self.cached = [], {}
        self.emit_assignment("shutdown")
        self.broker.leave(self.client_id, "left")

    async def abort(self) -> None:
        """A kill: no goodbye; its connection closes, so the broker drops it at once."""
        if self.state != "running":
            return
        self.state = "aborted"
        self.held, self.cached = [], {}
        self.emit("fault", fault="kill")
        self.broker.leave(self.client_id, "closed")

    # -- the lab's controls ----------------------------------------------------------------

    def hang(self) -> None:
        self.hung = True
        self.emit("fault", fault="hang")

    def cut(self) -> None:
        self.cut_off = True
        self.emit("fault", fault="cut")

    def resume(self) -> None:
        self.hung = self.cut_off = False
        self.emit("fault", fault="resume")

    def set_slow(self, ms: float) -> None:
        self.slow_ms = max(0.0, float(ms))
        self.emit("fault", fault="slow", ms=self.slow_ms)

    def set_fail_ratio(self, ratio: float) -> None:
        self.fail_ratio = min(1.0, max(0.0, float(ratio)))
        self.emit("fault", fault="fail", ratio=self.fail_ratio)

    def set_strategy(self, name: str, **options) -> None:
        if self.mode == "pop":   # the broker hands pop's messages out: the strategy changes nothing
            self.strategy_name = name
            self.emit("fault", fault="strategy", strategy=name, ignored=True)
            return
        self.strategy = get_strategy(name, **options)
        self.strategy_name = self.strategy.name
        self.emit("fault", fault="strategy", strategy=self.strategy.name)
        if self.state == "running":
            self.rebalance("strategy")

    def snapshot(self) -> dict:
        return {"client_id": self.client_id, "group": self.group, "mode": self.mode, "state": self.state,
                "strategy": self.strategy_name, "assignments": [mq.label for mq in self.held],
                "queues": {mq.label: self._figures(mq) for mq in self.held},
                "hung": self.hung, "slow_ms": self.slow_ms, "fail_ratio": self.fail_ratio,
                "members": list(self.members)}

    # -- what it hears -----------------------------------------------------------------------

    def notice(self, change: lab.MembershipChange) -> None:
        """The broker's "consumer ids changed": repeated as an event, then a rebalance."""
        if self.cut_off:
            return   # partitioned: the notice never reaches it
        self.members = list(change.client_ids)
        self.emit("membership", members=self.members, joined=list(change.joined), left=list(change.left),
                  reason=change.reason)
        if self.mode != "pop":
            self.rebalance(change.reason)

    def route_changed(self) -> None:
        """Its route refresh saw the topic's queues change (here: at once)."""
        if self.state != "running" or self.cut_off:
            return
        self.emit("route", topic=self.topic, queues=self.broker.queues(self.topic, online_only=True))
        if self.mode == "pop":
            self._pop_assignment()
        else:
            self.rebalance("route")

    # -- rebalancing ---------------------------------------------------------------------------

    def rebalance(self, reason: str) -> None:
        """RebalanceImpl.doRebalance with the broker's member list and route, as a real one runs it."""
        if self.world.rebalances_held and reason != "start":
            return
        self.emit("rebalance", topic=self.topic, phase="start", reason=reason, strategy=self.strategy.name)
        mqs, cids = self.broker.allocation_inputs(self.group, self.topic)
        # As Java's: nothing to allocate from (no queue, no member list) keeps what it holds.
        mine = sorted(self.strategy.allocate(self.group, self.client_id, mqs, cids)) if mqs and cids else self.held
        before, after = set(self.held), set(mine)
        added = [mq for mq in mine if mq not in before]
        removed = [mq for mq in self.held if mq not in after]
        self.held = list(mine)
        for mq in removed:
            self.cached.pop(mq, None)
        self.emit("rebalance", topic=self.topic, phase="end", reason=reason, strategy=self.strategy.name,
                  duration_ms=1.0, added=added, removed=removed, balanced=True)
        if added or removed or reason in ("start", "strategy"):
            self.emit_assignment(reason)

    def emit_assignment(self, reason: str) -> None:
        retry = [] if self.mode == "push" else None   # a push consumer also holds %RETRY% queues (none yet)
        self.emit("assignment", topic=self.topic, queues=list(self.held), retry_queues=retry,
                  strategy=self.strategy_name, reason=reason)

    def report_assignment(self, labels, reason: str = "rebalance under way") -> None:
        """It holds ``labels`` now, whatever the others hold: a rebalance caught half done."""
        self.held = sorted(MessageQueue.from_label(self.topic, x) for x in labels)
        self.emit_assignment(reason)

    def _pop_assignment(self, started: bool = False) -> None:
        """Pop: one assignment per online broker, queue id -1 ("pop from any of its queues"),
        told when it starts and when it changes."""
        brokers = sorted({mq.broker_name for mq in self.broker.queues(self.topic, online_only=True)})
        held = [MessageQueue(self.topic, b, -1) for b in brokers]
        if started or held != self.held:
            self.held = held
            self.emit_assignment("assignment")

    # -- figures ---------------------------------------------------------------------------------

    def _figures(self, mq: MessageQueue) -> dict:
        cached = self.cached.get(mq, 0)
        return {"cached_count": cached, "cached_bytes": cached * 1024, "span": cached, "inflight": 0}

    def report_cached(self, mq: MessageQueue, count: int) -> None:
        """Its ProcessQueue of ``mq`` holds ``count`` messages now."""
        self.cached[mq] = count
        self.emit("pq", topic=self.topic, queue=mq, **self._figures(mq))

    def tick(self) -> None:
        """One report interval: messages arrive on its queues; it consumes them, or (hung)
        caches them until flow control holds the pulls back."""
        if self.state != "running" or self.mode == "pop":
            return
        for mq in self.held:
            self.broker.add_backlog(mq, MESSAGES_PER_TICK)
            before = self.cached.get(mq, 0)
            if self.hung:
                self.cached[mq] = min(PQ_LIMIT, before + MESSAGES_PER_TICK)
            else:
                self.cached[mq] = 0
                self.broker.committed[(self.group, mq)] = self.broker.max_offsets[mq]
            if self.cached[mq] != before:
                self.emit("pq", topic=self.topic, queue=mq, **self._figures(mq))
            if self.cached[mq] >= PQ_LIMIT:
                self.emit("flow_control", topic=self.topic, queue=mq, reason="count", threshold=PQ_LIMIT,
                          value=self.cached[mq])


class FakeProducer:
    def __init__(self, world: "FakeWorld", *, producer_id: str, topic: str, rate: float, **_connection):
        self.world, self.producer_id, self.topic, self.rate = world, producer_id, topic, rate

    def burst(self, count: int) -> None:
        """``count`` messages spread over the topic's writable queues, as the producer's round robin."""
        queues = self.world.broker.queues(self.topic, online_only=True)
        for i, mq in enumerate(queues):
            self.world.broker.add_backlog(mq, count // len(queues) + (i < count % len(queues)))

    async def shutdown(self) -> None:
        pass


class FakeClients:
    """The adapters a Worker builds its clients with (consumers_app/lab/clients.py's functions),
    making fakes that report their events through ``report``."""

    def __init__(self, world: "FakeWorld", report):
        self.world, self.report = world, report

    def make_consumer(self, **params) -> FakeConsumer:
        consumer = FakeConsumer(self.world, self.report, **params)
        self.world.consumers[consumer.client_id] = consumer
        return consumer

    def make_producer(self, **params) -> FakeProducer:
        return FakeProducer(self.world, **params)

    async def start_producer(self, producer: FakeProducer) -> None:
        pass

    def set_rate(self, producer: FakeProducer, rate: float) -> None:
        producer.rate = rate

    def burst(self, producer: FakeProducer, count: int) -> None:
        producer.burst(count)


class InProcessLink:
    """A WorkerLink to a Worker in this process: each command is the Worker's own, its
    params and answer through JSON as over the stream."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.worker_id = worker.worker_id
        self.pid = 0
        self.connected = True

    async def command(self, name: str, timeout: float = 30.0, on_result=None, **params) -> dict:
        if not self.connected:
            raise WorkerError(f"worker {self.worker_id} is gone")
        handler = getattr(self.worker, f"do_{name}", None)
        if handler is None:
            raise WorkerError(f"unknown worker command {name!r}")
        try:
            result = await handler(**json.loads(json.dumps(params)))
        except CommandError as exc:
            raise WorkerError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - as a worker reports any failure
            raise WorkerError(f"{type(exc).__name__}: {exc}") from None
        result = json.loads(json.dumps(result, default=str))
        if on_result is not None:
            on_result(result)
        return result


class FakeWorkers:
    """A WorkerPool (supervisor.py) of in-process workers on the fake world."""

    def __init__(self, world: "FakeWorld", on_events, on_lost):
        self.world, self.on_events, self.on_lost = world, on_events, on_lost
        self.links: dict[str, InProcessLink] = {}
        self._ids = itertools.count(1)

    async def start(self) -> None:
        pass

    async def spawn(self) -> InProcessLink:
        link = None   # the clients report through the link made next
        clients = FakeClients(self.world, lambda events: self.on_events(link, events))
        link = InProcessLink(Worker(f"w{next(self._ids)}", adapters=clients))
        self.links[link.worker_id] = link
        return link

    async def stop(self) -> None:
        links, self.links = list(self.links.values()), {}
        for link in links:
            await link.worker.shutdown_clients()
            link.connected = False



class FakeWorld:
    """One broker and the worker pools the controllers on it make (``workers`` is the
    controller's ``workers`` argument)."""

    def __init__(self):
        self.broker = FakeBroker()
        self.consumers: dict[str, FakeConsumer] = {}   # every consumer ever made, by client id
        self.rebalances_held = False

    def workers(self, on_events, on_lost) -> FakeWorkers:
        return FakeWorkers(self, on_events, on_lost)

    def running(self) -> list[FakeConsumer]:
        return [c for c in self.consumers.values() if c.state == "running"]

    def hold_rebalances(self) -> None:
        """From now the consumers hear notices but do not rebalance: a kill leaves its
        queues unowned, as in the moment before the survivors' rebalances."""
        self.rebalances_held = True

    def claim(self, client_id: str, label: str) -> None:
        """``client_id`` takes ``label`` too, before its owner has let it go: two owners."""
        consumer = self.consumers[client_id]
        consumer.report_assignment([*(mq.label for mq in consumer.held), label])

    def release(self, label: str) -> None:
        """Whoever holds ``label`` lets it go, before anyone takes it: unowned."""
        for consumer in self.running():
            if label in (held := [mq.label for mq in consumer.held]):
                consumer.report_assignment([x for x in held if x != label])

    def tick(self) -> None:
        for consumer in self.running():
            consumer.tick()
