"""The lab controller: runs the lab and answers the dashboard's requests.

It lives in the web process's asyncio loop (``runweb`` / ``runlab``) and

* supervises worker processes (supervisor.py) that host the consumers and producers,
  placing each new client on the least busy worker of a small pool;
* folds everything it hears into a LabState (state.py): events from the workers,
  membership changes from the broker (LabAdmin.WatchMembership), queue offsets polled
  every second (LabAdmin.GetQueueOffsets), and events of its own (``fault`` for what
  it injects, ``broker`` for brokers and queues it changes);
* publishes the coalesced events to the browsers every ``flush_interval`` (bus.publish),
  plus a full snapshot once per poll, from its own task: a slow browser or channel
  layer delays only that task, never the intake of events or the answers to requests;
* answers requests one at a time (bus.serve): every action validates all of its
  params first and raises ``LabError`` without changing anything when one is wrong.

Killing a consumer aborts it inside its worker (no unregister, no offset persist) and
closes its connection, as a dead process's socket closes: the broker drops it at once
and notifies the group. A *cut* leaves the connection open but silent (the broker
expires it after its channel expiry); a *hang* keeps heartbeats going and stops the
listener. The lab keeps one worker process per few consumers instead of one per
consumer. A worker process that dies takes all of its consumers with it, and the
controller marks them gone when the worker's stream ends.
"""
import asyncio
import inspect
import itertools
import logging
import math
import re
import time
from dataclasses import dataclass

import grpc

from consumers_app import allocate
from consumers_app.remoting import wire
from consumers_app.remoting.client import RemotingClient, broker_addresses
from consumers_app.events import Event, make_event, now_ms
from consumers_app.message_queue import MessageQueue, broker_of
from consumers_app.protocol import lab, lab_grpc

from . import bus
from .actions import CONSUMER_ACTIONS, MODES
from .disk import DiskPlaces, history_service, measure
from .peers import OURS, PEER_CLIENTS, REPORT_INTERVAL_S, PeerConsumer, available_clients
from .cluster_admin import oldest_ts_field
from .observer import Cluster, GroupOffline, NotObservable, Sighting, changes, departure
from .scenario import ConsumerFaults, GroupSpec, Scenario
from .state import LabState
from .supervisor import Supervisor, WorkerError, WorkerLink
from .handoff import handoff_events, rebalance_detail
from .timeline import lag_series, view_at
from .whatif import preview_group

log = logging.getLogger(__name__)

OK = 20000
GROUP_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,120}$")   # RocketMQ's valid group/topic characters
GROUP_NAME_MAX = 120   # its retry topic, %RETRY% + the name, must fit RocketMQ's 127 characters of a topic


def group_name_problem(name) -> str | None:
    """What is wrong with ``name`` as a group name, naming the rule it breaks; None: nothing."""
    if not isinstance(name, str) or not name:
        return f"a group name is 1 to {GROUP_NAME_MAX} characters, not {name!r}"
    if len(name) > GROUP_NAME_MAX:
        return (f"group name is {len(name)} characters long: at most {GROUP_NAME_MAX} "
                f"(its retry topic %RETRY%NAME must fit RocketMQ's 127)")
    bad = sorted({ch for ch in name if not GROUP_NAME.match(ch)})
    if bad:
        return (f"group name {name!r} has {' '.join(map(repr, bad))}: use only letters, digits, '_', '-', '%' or '|' "
                f"(at most {GROUP_NAME_MAX} characters)")
    return None
MAX_RATE = 50_000
MAX_BURST = 100_000
# Figures superseded by the next report: they never settle an action.
FIGURE_TYPES = frozenset({"pq", "flow_control", "consume", "offset", "pop"})
SETTLE_TIMEOUT = 5.0      # how long an action waits for its effect before answering anyway
GONE_GRACE_S = 60.0       # how long a stopped/killed/crashed consumer stays on the page
PRUNE_INTERVAL_S = 60.0   # recordings go by whole hours: checking once a minute is prompt enough
DISK_INTERVAL_S = 10.0    # walking the data dirs costs I/O; retention itself acts every 10 s


@dataclass(frozen=True)
class Limits:
    """How big the lab lets a run get (settings LAB_MAX_*; the README states them). Past
    them a request is refused with the limit's name, and nothing changes."""
    consumers: int = 128          # live consumers in the whole lab (LAB_MAX_CONSUMERS)
    group_consumers: int = 64     # live consumers in one group (LAB_MAX_GROUP_CONSUMERS)
    topic_queues: int = 1024      # queues of one topic over all brokers (LAB_MAX_TOPIC_QUEUES)


class LabController:
    def __init__(self, broker_address: str, *, pool_size: int = 2, client_options: dict | None = None,
                 adapters: str | None = None, flush_interval: float = 0.1, poll_interval: float = 1.0,
                 recorder_root=None, replace_lost_workers: bool = True, memory=None,
                 gone_grace_s: float = GONE_GRACE_S, observe_interval: float = 1.0,
                 limits: Limits = Limits(), recordings_hours: float = 24, disk: DiskPlaces | None = None,
                 admin=None, cluster: dict | None = None, handoff_story=None):
        # The embedded broker's gRPC address; attached to a cluster, its proxy's (pop only).
        self.broker_address = broker_address
        self.limits = limits
        self.pool_size = pool_size
        # Extra constructor options per client kind ("push", "lite_pull", "pop", "producer"),
        # e.g. short heartbeat intervals for tests.
        self.client_options = client_options or {}
        self.flush_interval = flush_interval
        self.poll_interval = poll_interval
        self.recorder_root = recorder_root
        # Recordings are deleted by the hour once they are this old, so disk stays bounded.
        self.recordings_hours = recordings_hours
        self.state = LabState()
        self.supervisor = Supervisor(self._worker_events, self._worker_lost, adapters=adapters)
        # LabAdmin: the embedded broker's stub (made at start), or a cluster_admin.ClusterAdmin
        # answering the same calls from someone else's cluster; ``cluster`` then says so.
        self.admin = admin
        if cluster is not None:
            self.state.cluster = cluster
        self._channel: grpc.aio.Channel | None = None
        self._hosts: dict[str, WorkerLink] = {}       # client or producer id -> its worker
        self._client_numbers = itertools.count(1)
        self._watchers: dict[str, asyncio.Task] = {}
        self._placing = asyncio.Lock()   # concurrent starts must not each spawn a worker
        self._tasks: list[asyncio.Task] = []
        self._snapshot_due = False
        self._recorder = None            # recorder.Recorder, when recording
        self._unrecorded: list[Event] = []
        # Actions waiting for the state they changed: (condition, future), re-checked
        # whenever an event that tells a story (not a figure) has been applied.
        self._waiters: list[tuple] = []
        # A worker that dies is replaced and its consumers restarted under new ids, as an
        # operator's process manager would; the old ids stay in the log as crashed.
        self.replace_lost_workers = replace_lost_workers
        self._replacing: set[asyncio.Task] = set()
        # Where the lab's state is saved for the next start (persistence.LabMemory), if anywhere.
        self.memory = memory
        # Gone consumers and empty groups leave the snapshot after this (their story stays
        # in the membership log), so a lab running for days keeps its frames small.
        self.gone_grace_s = gone_grace_s
        # Where the lab's parts live on disk, measured for the snapshot's "disk" (None: not measured).
        self.disk_places = disk
        # Other people's clients (peers.py) need the broker's name server; runlab sets it.
        self.namesrv: str | None = None
        self._peers: dict[str, PeerConsumer] = {}     # client id -> its process
        # Attached to a cluster: clients being stopped or killed -> how they will go (left, closed).
        self._departing: dict[str, str] = {}
        self._remoting: RemotingClient | None = None   # to ask peers what only remoting carries
        # Groups watched on the cluster (observer.py) are asked this often (seconds).
        self.observe_interval = observe_interval
        # Where the groups' last 15 minutes of hand-offs are kept across restarts
        # (persistence.HandoffStory), if anywhere; what it held waits for its group to exist.
        self.handoff_story = handoff_story
        self._saved_handoffs: dict[str, dict] = {}
        self._story_cache: dict[str, tuple[int, dict]] = {}   # group -> (its hand-offs' version, saved form)

    # -- life cycle ----------------------------------------------------------------

    async def start(self, scenario: Scenario | None = None) -> None:
        """Workers up, the scenario (if any) running, then requests answered."""
        if self.admin is None:
            self._channel = grpc.aio.insecure_channel(self.broker_address)
            self.admin = lab_grpc.LabAdminStub(self._channel)
        if self.handoff_story is not None:
            self._saved_handoffs = await asyncio.to_thread(self.handoff_story.load)
        await self.supervisor.start()
        await self.refresh_topology()
        await asyncio.gather(*(self.supervisor.spawn() for _ in range(self.pool_size)))
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="lab-flush"),
            asyncio.create_task(self._poll_loop(), name="lab-poll"),
        ]
        self._start_recorder()
        if self.disk_places is not None:
            self._tasks.append(asyncio.create_task(self._disk_loop(), name="lab-disk"))
        if scenario is not None:
            await self.run_scenario(scenario)
        if self.memory is not None:
            self._tasks.append(asyncio.create_task(self.memory.keep(self.desired_scenario), name="lab-memory"))
        if self.handoff_story is not None:
            self._tasks.append(asyncio.create_task(self.handoff_story.keep(self.handoff_stories), name="lab-handoffs"))
        # Only now: a request never interleaves with setting the scenario up.
        self._tasks.append(asyncio.create_task(bus.serve(self.handle), name="lab-requests"))

    async def stop(self) -> None:
        # Workers going away now are stopping with the lab (a Ctrl-C reaches them too):
        # replacing them would only start workers to kill, and hold the stop up.
        self.replace_lost_workers = False
        tasks = [*self._tasks, *self._watchers.values(), *self._replacing]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks, self._watchers = [], {}
        await asyncio.gather(*(peer.stop() for peer in list(self._peers.values())), return_exceptions=True)
        if self._remoting is not None:
            await self._remoting.close()
        await self.supervisor.stop()
        if self._recorder is not None:
            await self._record()
            await asyncio.to_thread(self._recorder.close)   # writes what is buffered
        if self._channel is not None:
            await self._channel.close()

    async def run_scenario(self, scenario: Scenario) -> None:
        existing = {t: {broker_of(x) for x in labels} for t, labels in self.state.topics.items()}
        for topic, per_broker in scenario.topics.items():
            for broker, count in per_broker.items():
                if broker not in existing.get(topic, ()):
                    self._check(await self.admin.CreateTopic(
                        lab.CreateTopicRequest(name=topic, queue_count=count, broker_name=broker), timeout=10))
        await self.refresh_topology()
        for topic, rate in scenario.producers.items():
            await self._set_producer_rate(topic, rate)
        for spec in scenario.groups:
            self._valid_mode(spec.mode)
            group = self._create_group(spec.name, spec.topic, spec.mode, spec.strategy)
            started = await asyncio.gather(*(self._start_consumer(group.name) for _ in range(spec.consumers)))
            for client_id, faults in zip(started, spec.faults):
                await self._apply_faults(client_id, faults)
            for name in spec.peers:
                await self._restore_peer(group.name, name)
        for broker in scenario.offline_brokers:
            if self.state.brokers.get(broker) and not self._disabled("broker_online"):
                await self.action_broker(broker, False)
        for spec in scenario.groups:
            await self._settle(spec.name)

    async def _apply_faults(self, client_id: str, faults: ConsumerFaults) -> None:
        if faults.slow_ms:
            await self._command(client_id, "consumer", action="slow", ms=faults.slow_ms)
        if faults.fail_ratio:
            await self._command(client_id, "consumer", action="fail", ratio=faults.fail_ratio)
        if faults.hung:
            await self._command(client_id, "consumer", action="hang")

    def desired_scenario(self) -> Scenario:
        """The lab as it stands, as a scenario to start from next time."""
        topics: dict[str, dict[str, int]] = {}
        for topic, labels in self.state.topics.items():
            for label in labels:
                broker = broker_of(label)
                topics.setdefault(topic, {}).setdefault(broker, 0)
                topics[topic][broker] += 1
        groups = []
        for name, group in self.state.groups.items():
            clients = [c for c in map(self.state.clients.get, self._live_clients(name)) if c is not None]
            live = [c for c in clients if c.client == OURS]
            peers = tuple(c.client for c in clients if c.client in PEER_CLIENTS)   # observed ones are not ours to start
            if not live and not peers:
                continue
            faults = tuple(ConsumerFaults(slow_ms=c.slow_ms, fail_ratio=c.fail_ratio, hung=c.status == "hung")
                           for c in live)
            groups.append(GroupSpec(name, group.topic, group.mode, group.strategy, len(live),
                                    faults if any(f.any for f in faults) else (), peers))
        return Scenario(topics=topics, producers={t: p["rate"] for t, p in self.state.producers.items()},
                        groups=tuple(groups),
                        offline_brokers=tuple(sorted(b for b, online in self.state.brokers.items() if not online)))

    def handoff_stories(self) -> dict[str, dict]:
        """The lab's own groups' hand-offs of the window, to save (observed groups are the
        cluster's: not ours to remember)."""
        now = now_ms()
        stories = {}
        for name, g in self.state.groups.items():
            if g.observed:
                continue
            # Made again only when a figure moved (or an overlap runs on: its end is the stop).
            cached = self._story_cache.get(name)
            ongoing = cached is not None and any(m["released_ts"] is None for r in cached[1]["rebalances"] for m in r["moves"])
            if cached is None or cached[0] != g.handoffs.version or ongoing:
                cached = self._story_cache[name] = (g.handoffs.version, g.handoffs.saved(now))
            stories[name] = cached[1]   # the same text when nothing moved: the file is not written again
        # A saved group not started again (yet) keeps its story until the window forgets it.
        return {**{n: s for n, s in self._saved_handoffs.items() if n not in stories}, **stories}

    def collect_garbage(self) -> None:
        """Forget consumers gone for longer than the grace period and groups left empty."""
        for name in self.state.collect_garbage(time.monotonic(), self.gone_grace_s):
            watcher = self._watchers.pop(name, None)
            if watcher is not None:
                watcher.cancel()

    # -- what comes in -------------------------------------------------------------

    def emit(self, type: str, group: str = "", client_id: str = "", **fields) -> Event:
        """An event of the controller's own, handled exactly like a worker's."""
        event = make_event(type, group, client_id, **fields)
        self._take([event])
        return event

    def _take(self, events: list[Event]) -> None:
        for event in events:
            self.state.apply(event)
        if self._recorder is not None:
            # A consumer's own "strategy" fault says when it switched (the live page shows
            # it); the event log keeps the group's one switch (action_set_strategy).
            self._unrecorded += [e for e in events if not (e.type == "fault" and e.fault == "strategy" and e.client_id)]
        if self._waiters and any(e.type not in FIGURE_TYPES for e in events):
            for condition, future in self._waiters:
                if not future.done() and condition():
                    future.set_result(True)

    def _worker_events(self, link: WorkerLink, events: list[Event]) -> None:
        self._take(events)

    def _worker_lost(self, link: WorkerLink) -> None:
        lost_groups, lost_rates = [], {}
        for host_id in [h for h, hosted in self._hosts.items() if hosted is link]:
            del self._hosts[host_id]
            client = self.state.clients.get(host_id)
            if client is not None and client.alive:
                self.state.client_gone(host_id, "crashed")
                self.emit("fault", client.group, host_id, fault="worker_lost", worker=link.worker_id)
                lost_groups.append(client.group)
            for topic, producer in list(self.state.producers.items()):
                if producer["producer_id"] == host_id:
                    del self.state.producers[topic]
                    lost_rates[topic] = producer["rate"]
                    self.emit("fault", "", host_id, fault="worker_lost", worker=link.worker_id, topic=topic)
        if self.replace_lost_workers and (lost_groups or lost_rates):
            task = asyncio.get_running_loop().create_task(self._replace(link, lost_groups, lost_rates))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)

    async def _replace(self, link: WorkerLink, groups: list[str], rates: dict[str, float]) -> None:
        """Bring back what a dead worker hosted: a new worker (the pool refills on demand),
        one new consumer per lost one in the same group, the producers at their rates."""
        try:
            for topic, rate in rates.items():
                await self._set_producer_rate(topic, rate)
            started = await asyncio.gather(*(self._start_consumer(g) for g in groups if g in self.state.groups))
            for group in set(groups):
                self.emit("fault", group, "", fault="worker_replaced", worker=link.worker_id,
                          clients=[c for c in started if self.state.clients[c].group == group])
            for group in set(groups):
                await self._settle(group)
        except Exception:  # noqa: BLE001 - the page shows the consumers as crashed; nothing else to do
            log.exception("replacing worker %s failed", link.worker_id)

    def broker_process_changed(self, status: dict) -> None:
        """runlab's BrokerProcess went up or down: the snapshot and /healthz say so."""
        was_up = self.state.broker_process.get("up", True)
        self.state.broker_process = {"managed": True, **status}
        self._snapshot_due = True
        if was_up != status["up"]:
            self.emit("broker", "", "", change="process", process="up" if status["up"] else "down",
                      restarts=status["restarts"], reason=status.get("reason", ""))

    def _membership_changed(self, change) -> None:
        """One event per change, in the fields the consumers use for the notices they hear;
        on an attached cluster one per reason the lab knows for the members that left."""
        joined, left = list(change.joined), list(change.left)
        parts = [(change.reason, joined, left)]
        if left and change.reason in ("left", "changed") and self.state.cluster.get("attached"):
            by_reason: dict[str, list[str]] = {}
            for client_id in left:
                by_reason.setdefault(self._why_it_left(client_id), []).append(client_id)
            parts = [("joined", joined, [])] if joined else []
            parts += [(reason, [], ids) for reason, ids in by_reason.items()]
        for reason, joined, left in parts:
            subject = (joined + left)[0] if len(joined) + len(left) == 1 else ""
            self.emit("membership", change.group, subject, ts=change.ts or now_ms(), source="broker",
                      reason=reason, members=list(change.client_ids), joined=joined, left=left)

    # How the broker lost a client of the lab's, by its status: it was cut (silent until
    # expiry), or its worker died (connections closed).
    DEPARTURES = {"stopped": "left", "killed": "closed", "crashed": "closed", "cut": "expired"}

    def _why_it_left(self, client_id: str) -> str:
        """An attached cluster lists members without saying why one went (goodbye, closed
        connection, expiry); for the lab's own clients and peers the lab knows what it did."""
        reason = self._departing.pop(client_id, None)
        if reason is None:
            reason = self.DEPARTURES.get(getattr(self.state.clients.get(client_id), "status", ""), "left")
        return reason

    def _will_depart(self, client_id: str, how: str) -> None:
        """Before a stop or kill goes out: the cluster may list the client gone before the
        action's answer marks it so."""
        if self.state.cluster.get("attached"):
            self._departing[client_id] = "left" if how == "stop" else "closed"

    async def _watch_membership(self, group: str) -> None:
        while True:
            try:
                async for change in self.admin.WatchMembership(lab.GroupRequest(group=group)):
                    self._membership_changed(change)
            except (grpc.aio.AioRpcError, OSError, TimeoutError) as exc:
                log.info("membership watch of %s ended (%s); reconnecting", group, _why(exc))
            await asyncio.sleep(1.0)

    async def refresh_topology(self) -> None:
        topics = await self.admin.ListTopics(lab.ListTopicsRequest(), timeout=5)
        for topic in topics.topics:
            labels = [f"{q.broker_name}:{q.queue_id}" for q in topic.queues]
            if labels != self.state.topics.get(topic.name):
                self.state.set_topic_queues(topic.name, labels)
        brokers = await self.admin.ListBrokers(lab.ListBrokersRequest(), timeout=5)
        for broker in brokers.brokers:
            self.state.brokers[broker.broker_name] = broker.online

    async def poll_offsets(self) -> None:
        """One GetQueueOffsets per group per tick feeds both the live view and the lag
        recording (every topic: the recording keeps a group's %RETRY% queues too)."""
        rows = []
        for name, group in list(self.state.groups.items()):
            if group.observed:   # its observer reads the cluster's own stats
                continue
            response = await self.admin.GetQueueOffsets(lab.QueueOffsetsRequest(group=name), timeout=5)
            ts = response.ts or now_ms()
            self.state.set_offsets(name, ts, [
                {"label": f"{q.queue.broker_name}:{q.queue.queue_id}", "min_offset": q.min_offset,
                 "max_offset": q.max_offset, "committed_offset": q.committed_offset,
                 "oldest_unconsumed_store_ts": q.oldest_unconsumed_store_ts, "inflight": q.inflight}
                for q in response.queues if q.queue.topic == group.topic
            ])
            await self._peer_assignments(group, response.queues)
            handoffs = handoff_events(group, ts)   # taken every poll: the changes do not pile up
            if self._recorder is not None:
                rows += self._snapshot_rows(name, ts, response.queues, self._queue_holders(name))
                self._unrecorded += handoffs
        if rows:
            try:
                await asyncio.to_thread(self._recorder.add_snapshot, rows)
            except Exception:  # noqa: BLE001 - history is optional; the live view is not
                log.exception("recording %d offset rows failed", len(rows))

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.poll_offsets()
            except (grpc.aio.AioRpcError, OSError, TimeoutError) as exc:
                log.warning("offset poll failed: %s", _why(exc))
            self.collect_garbage()
            self._snapshot_due = True
            # Ticks on the wall clock's grid (10 per 10-s slice, the last one just before it
            # ends): the recorder writes a slice right after its last tick (recorder.py).
            period = self.poll_interval
            await asyncio.sleep(period - time.time() % period + 0.005)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            batch = [e.to_dict() for e in self.state.drain()]
            if self._snapshot_due:
                self._snapshot_due = False
                batch.append(self.state.snapshot())
            if batch:
                try:
                    await bus.publish(batch)
                except Exception:  # noqa: BLE001 - a layer hiccup loses one batch, not the loop
                    log.exception("publishing %d events failed", len(batch))

    async def measure_disk(self) -> None:
        """Bytes per part into the snapshot; walking directories runs off the loop."""
        self.state.disk = await asyncio.to_thread(measure, self.disk_places, now_ms())
        self.state.history_service = history_service(self.disk_places.lag_history, now_ms())
        self._snapshot_due = True

    async def _disk_loop(self) -> None:
        while True:
            try:
                await self.measure_disk()
            except OSError as exc:   # e.g. a directory made unreadable: the last figures stand
                log.warning("measuring disk use failed: %s", exc)
            await asyncio.sleep(DISK_INTERVAL_S)

    # -- lag history (recorder.py) ----------------------------------------------------

    def _start_recorder(self) -> None:
        """Record offsets (from the offset polls) and events as Parquet, when a root is given."""
        if self.recorder_root is None:
            return
        try:
            from .recorder import Recorder, snapshot_rows
        except ImportError as exc:   # no silent "history off": say what is missing
            raise RuntimeError(f"lag history cannot be recorded: {exc} (install the project: make install)") from exc
        self._recorder = Recorder(self.recorder_root, tick_ms=int(self.poll_interval * 1000))
        self._snapshot_rows = snapshot_rows
        self._tasks.append(asyncio.create_task(self._record_loop(), name="lab-recorder"))

    def _queue_holders(self, group_name: str) -> dict:
        """The sampler's view of a group: owner and cached figures per ``TOPIC@BROKER:QID``."""
        group = self.state.groups.get(group_name)
        if group is None:
            return {}
        queues = self.state.group_snapshot(group)["queues"]
        return {f"{group.topic}@{label}": {"owner": ",".join(q["owners"]) or None,
                                           "cached_count": q["cached_count"], "cached_bytes": q["cached_bytes"]}
                for label, q in queues.items()}

    async def _record_loop(self) -> None:
        next_prune = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            await self._record()
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + PRUNE_INTERVAL_S
                await self._prune_recordings()

    async def _prune_recordings(self) -> None:
        try:
            await asyncio.to_thread(self._recorder.prune, int(self.recordings_hours * 3_600_000), now_ms())
        except Exception:  # noqa: BLE001 - history is optional; the live view is not
            log.exception("pruning recordings older than %s h failed", self.recordings_hours)

    async def _record(self) -> None:
        # Parquet writes happen in the recorder when a minute rolls over: off the loop.
        events, self._unrecorded = self._unrecorded, []
        if events:
            try:
                await asyncio.to_thread(lambda: [self._recorder.add_event(e) for e in events])
            except Exception:  # noqa: BLE001 - history is optional; the live view is not
                log.exception("recording %d events failed", len(events))

    # -- requests ------------------------------------------------------------------

    async def handle(self, action: str, params: dict) -> dict:
        handler = getattr(self, f"action_{action}", None) if isinstance(action, str) else None
        if handler is None:
            valid = sorted(name[len("action_"):] for name in dir(self) if name.startswith("action_"))
            raise bus.LabError(f"unknown action {action!r}; valid: {', '.join(valid)}")
        if not isinstance(params, dict):
            raise bus.LabError("params must be an object")
        try:
            inspect.signature(handler).bind(**params)
        except TypeError as exc:   # a missing or unexpected param
            raise bus.LabError(f"{action}: {exc}") from None
        try:
            return await handler(**params)
        except WorkerError as exc:
            raise bus.LabError(f"{action} failed in a worker: {exc}") from None

    async def action_state(self) -> dict:
        return self.state.snapshot()

    async def action_health(self) -> dict:
        """/healthz: healthy while the broker process is up (always, when runlab does not manage it)."""
        broker = self.state.broker_process
        return {"ok": bool(broker.get("up", True)), "broker_process": broker}

    async def action_set_strategy(self, group, strategy, options=None) -> dict:
        name, options = self._valid_strategy(strategy, options)
        target = self._valid_group(group)
        target.strategy = name
        clients = self._live_clients(group)
        # One switch of the group, whatever its size: the lag history counts and marks this one.
        self.emit("fault", group, "", fault="strategy", strategy=name, clients=clients)
        await asyncio.gather(*(
            self._command(client_id, "consumer", action="set_strategy", strategy=name, options=options)
            for client_id in clients))
        await self._settle(group)
        return self.state.snapshot()

    async def action_preview_strategy(self, group, strategy) -> dict:
        """What switching to ``strategy`` would do (whatif.py); read-only, nothing changes."""
        name, _ = self._valid_strategy(strategy, None)
        target = self._valid_group(group)
        if target.mode == "pop":
            raise bus.LabError(f"group {group} pops: the broker hands out its messages and pop consumers "
                               f"ignore the strategy, so nothing would move")
        return preview_group(self.state, target, name)

    async def action_rebalance(self, group, rebalance_id) -> dict:
        """One of the group's recent rebalances with its hand-offs (handoff.py); read-only."""
        return rebalance_detail(self._valid_group(group), rebalance_id)

    async def action_lag_series(self, group, seconds) -> dict:
        """The group's lag, one point a second (timeline.py); read-only."""
        return lag_series(self._valid_group(group), seconds)

    async def action_view_at(self, group, ts) -> dict:
        """The group's queues as they were at ``ts`` (timeline.py); read-only."""
        return view_at(self._valid_group(group), ts)

    async def action_set_mode(self, group, mode) -> dict:
        target = self._valid_group(group)
        mode = self._valid_mode(mode)
        if mode != target.mode:
            members = self._live_clients(group)
            await asyncio.gather(*(self._stop_consumer(c, "stop") for c in members))
            target.mode = mode
            await asyncio.gather(*(self._start_consumer(group) for _ in members))
            await self._settle(group)
        return self.state.snapshot()

    async def action_add_consumer(self, group, mode=None, topic=None, strategy=None, client=OURS) -> dict:
        if (problem := group_name_problem(group)) is not None:
            raise bus.LabError(problem)
        if client not in available_clients():
            raise bus.LabError(f"unknown or uninstalled client {client!r}; available: {', '.join(available_clients())}")
        if client != OURS:
            kind = PEER_CLIENTS[client]
            if (mode or "push") not in kind.modes:
                raise bus.LabError(f"{client} consumers play {', '.join(kind.modes)} mode only, not {mode!r}")
            if not self.namesrv:
                raise bus.LabError(f"{client} needs the broker's name server, and this lab's broker has none "
                                   f"(start it with runlab, or runbroker --namesrv-port)")
            existing = self.state.groups.get(group)
            if existing is not None and existing.mode not in kind.modes:
                raise bus.LabError(f"group {group} consumes in {existing.mode} mode; {client} plays push only")
        alive = [c for c in self.state.clients.values() if c.alive]
        if len(alive) >= self.limits.consumers:
            raise bus.LabError(f"the lab runs at most {self.limits.consumers} consumers (LAB_MAX_CONSUMERS)")
        if sum(c.group == group for c in alive) >= self.limits.group_consumers:
            raise bus.LabError(f"a group has at most {self.limits.group_consumers} consumers "
                               f"(LAB_MAX_GROUP_CONSUMERS); {group} is full")
        existing = self.state.groups.get(group)
        if existing is not None:
            self._not_observed(existing)
            if mode is not None and self._valid_mode(mode) != existing.mode:
                raise bus.LabError(f"group {group} consumes in {existing.mode} mode; use set_mode to switch it")
            if topic is not None and topic != existing.topic:
                raise bus.LabError(f"group {group} subscribes to {existing.topic}, not {topic!r}")
            if strategy is not None and self._valid_strategy(strategy, None)[0] != existing.strategy:
                raise bus.LabError(f"group {group} uses {existing.strategy}; use set_strategy to switch it")
        else:
            mode = self._valid_mode(mode if mode is not None else "push")
            strategy = self._valid_strategy(strategy if strategy is not None else "AVG", None)[0]
            topic = self._valid_topic(topic if topic is not None else self._default_topic())
            self._create_group(group, topic, mode, strategy)
        if client == OURS:
            client_id = await self._start_consumer(group)
            await self._settle(group)
        else:
            client_id = await self._start_peer(group, PEER_CLIENTS[client])
        return {"client_id": client_id, "state": self.state.snapshot()}

    async def action_consumer(self, client_id, action, ms=None, ratio=None) -> dict:
        client = self.state.clients.get(client_id) if isinstance(client_id, str) else None
        if client is None:
            raise bus.LabError(f"unknown consumer {client_id!r}")
        if not client.alive:
            raise bus.LabError(f"consumer {client_id} is {client.status}")
        self._not_observed(self.state.groups[client.group])
        if action not in CONSUMER_ACTIONS:
            raise bus.LabError(f"unknown consumer action {action!r}; valid: {', '.join(CONSUMER_ACTIONS)}")
        peer = self._peers.get(client_id)
        if peer is not None:
            return await self._peer_action(peer, action)
        detail = {}
        if action == "slow":
            detail["ms"] = self._valid_number("ms", ms, 0, 60_000, integer=True)
        elif action == "fail":
            detail["ratio"] = self._valid_number("ratio", ratio, 0.0, 1.0)
        if action in ("stop", "kill"):
            await self._stop_consumer(client_id, action)
            if action == "stop":   # the consumer reports its other faults (and its kill) itself
                self.emit("fault", client.group, client_id, fault="stop")
        else:
            await self._command(client_id, "consumer", action=action, **detail)
        if action == "stop":   # a graceful stop unregisters: the rest rebalance at once
            await self._settle(client.group)
        return self.state.snapshot()

    async def action_producer_rate(self, topic, rate) -> dict:
        topic = self._valid_topic(topic)
        rate = self._valid_number("rate", rate, 0, MAX_RATE)
        await self._set_producer_rate(topic, rate)
        producer_id = self.state.producers[topic]["producer_id"]
        self.emit("fault", "", producer_id, fault="producer_rate", topic=topic, rate=rate)
        return self.state.snapshot()

    async def action_producer_burst(self, topic, count) -> dict:
        topic = self._valid_topic(topic)
        count = self._valid_number("count", count, 1, MAX_BURST, integer=True)
        if topic not in self.state.producers:
            await self._set_producer_rate(topic, 0)
        producer_id = self.state.producers[topic]["producer_id"]
        await self._command(producer_id, "producer", action="burst", count=count)
        self.emit("fault", "", producer_id, fault="producer_burst", topic=topic, count=count)
        return self.state.snapshot()

    async def action_queues(self, topic, delta, broker=None) -> dict:
        self._refuse_if_disabled("queues")
        topic = self._valid_topic(topic)
        delta = self._valid_number("delta", delta, -1024, 1024, integer=True)
        if delta == 0:
            raise bus.LabError("delta must not be 0")
        labels = self.state.topics[topic]
        if broker is None:   # the topic's first broker, in MessageQueue order
            broker = broker_of(labels[0]) if labels else None
        if broker not in self.state.brokers:
            raise bus.LabError(f"unknown broker {broker!r}; known: {', '.join(sorted(self.state.brokers))}")
        on_broker = sum(1 for x in labels if broker_of(x) == broker)
        if delta < 0 and -delta > on_broker:
            raise bus.LabError(f"{topic} has only {on_broker} queue(s) on {broker}; cannot remove {-delta}")
        if len(labels) + delta < 1:
            raise bus.LabError(f"removing {-delta} queue(s) would leave {topic} with no queues")
        if len(labels) + delta > self.limits.topic_queues:
            raise bus.LabError(f"a topic has at most {self.limits.topic_queues} queues (LAB_MAX_TOPIC_QUEUES); "
                               f"{topic} has {len(labels)}")
        changed_at = now_ms()   # before the broker changes: a refresh may see it at once
        info = self._check(await self.admin.AddQueues(
            lab.AddQueuesRequest(topic=topic, delta=delta, broker_name=broker), timeout=10))
        queues = [MessageQueue(topic, q.broker_name, q.queue_id) for q in info.queues]
        self.emit("broker", "", "", ts=changed_at, broker=broker, topic=topic, change="queues", delta=delta,
                  queues=queues)
        await self.refresh_topology()
        # As in RocketMQ, consumers learn of it from their next route refresh
        # (pollNameServerInterval); the page shows when each one noticed.
        return self.state.snapshot()

    async def action_broker(self, broker, online) -> dict:
        self._refuse_if_disabled("broker_online")
        if broker not in self.state.brokers:
            raise bus.LabError(f"unknown broker {broker!r}; known: {', '.join(sorted(self.state.brokers))}")
        if not isinstance(online, bool):
            raise bus.LabError(f"online must be true or false, not {online!r}")
        changed_at = now_ms()
        self._check(await self.admin.SetBrokerOnline(
            lab.SetBrokerOnlineRequest(broker_name=broker, online=online), timeout=10))
        self.emit("broker", "", "", ts=changed_at, broker=broker, online=online,
                  change="online" if online else "offline")
        await self.refresh_topology()   # consumers learn of it from their next route refresh
        return self.state.snapshot()

    async def action_observe(self, group) -> dict:
        """Watch a group the lab did not start: its members, their queues and lag, as the
        cluster tells (observer.py); read-only. Watching it again changes nothing."""
        if (problem := group_name_problem(group)) is not None:
            raise bus.LabError(problem)
        existing = self.state.groups.get(group)
        if existing is not None:
            if not existing.observed:
                raise bus.LabError(f"group {group} is the lab's own: the page shows it already")
            return {"group": group, "state": self.state.snapshot()}
        if not self.namesrv:
            raise bus.LabError("observing a group needs a name server, and this lab has none "
                               "(start it with runlab, or runbroker --namesrv-port)")
        cluster = Cluster(self.namesrv)
        try:
            sighting = await cluster.look(group, now_ms())
        except NotObservable as exc:
            await cluster.close()
            raise bus.LabError(str(exc)) from None
        except (OSError, TimeoutError, ValueError) as exc:
            await cluster.close()
            raise bus.LabError(f"the cluster at {self.namesrv} did not answer: {exc or 'timeout'}") from None
        self.state.add_group(group, sighting.topic, sighting.mode, strategy="").observed = True
        self._see(group, None, sighting)
        # Its task lives with the group: garbage collection of the emptied group ends it.
        self._watchers[group] = asyncio.create_task(self._observe(group, cluster, sighting), name=f"observe-{group}")
        return {"group": group, "state": self.state.snapshot()}

    async def _observe(self, group: str, cluster: Cluster, last: Sighting) -> None:
        try:
            while True:
                await asyncio.sleep(self.observe_interval)
                try:
                    sighting = await cluster.look(group, now_ms())
                except GroupOffline:   # everyone left: the offsets stay as they were
                    sighting = Sighting(now_ms(), last.topic, last.mode, last.queues, offsets=last.offsets)
                except (NotObservable, OSError, TimeoutError, ValueError) as exc:
                    log.warning("observing %s: %s", group, exc or "timeout")   # next tick asks again
                    continue
                self._see(group, last, sighting)
                last = sighting
        finally:
            await cluster.close()

    def _see(self, group_name: str, before: Sighting | None, after: Sighting) -> None:
        """Fold one look at an observed group into the state: its clients, the events of
        what changed, the queue figures; and record it for the lag history."""
        group = self.state.groups.get(group_name)
        if group is None:
            return
        labels = [mq.label for mq in after.queues]
        if set(self.state.topics.get(after.topic, ())) != set(labels):
            self.state.set_topic_queues(after.topic, labels)
        for client_id, seen in after.clients.items():
            client = self.state.clients.get(client_id)
            if client is None or not client.alive:
                client = self.state.add_client(client_id, group_name, after.mode)
                client.status, client.client = "running", "outside"
            client.language, client.version, client.note = seen.language, seen.version, seen.unanswered
            client.assignment_source = "client" if seen.queues is not None else "unknown"
        events = changes(group_name, before, after)
        for client_id, last in (before.clients if before is not None else {}).items():
            if client_id not in after.clients:
                self.state.client_gone(client_id, departure(last))
        self._take(events)
        queues = [lab.QueueOffsets(queue=lab.QueueRef(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id),
                                   min_offset=f["min_offset"], max_offset=f.get("max_offset", 0),
                                   committed_offset=f["committed_offset"],
                                   oldest_unconsumed_store_ts=oldest_ts_field(f.get("oldest_unconsumed_store_ts")))
                  for mq, f in sorted(after.offsets.items()) if mq.topic == after.topic]
        self.state.set_offsets(group_name, after.ts, [
            {"label": f"{q.queue.broker_name}:{q.queue.queue_id}", "min_offset": q.min_offset,
             "max_offset": q.max_offset, "committed_offset": q.committed_offset,
             "oldest_unconsumed_store_ts": q.oldest_unconsumed_store_ts} for q in queues])
        # As poll_offsets does for the lab's groups: taken every look, so they do not pile up,
        # and recorded, so the lag history marks and compares an observed group's hand-offs.
        handoffs = handoff_events(group, after.ts)
        self._snapshot_due = True
        if self._recorder is not None:
            self._unrecorded += handoffs
            rows = self._snapshot_rows(group_name, after.ts, queues, self._queue_holders(group_name))
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._recorder.add_snapshot, rows))
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is None
                                   or log.warning("recording %s failed: %s", group_name, t.exception()))

    # -- validation ----------------------------------------------------------------

    def _valid_group(self, name):
        """A group the lab runs (an observed one is read-only)."""
        group = self.state.groups.get(name) if isinstance(name, str) else None
        if group is None:
            raise bus.LabError(f"unknown group {name!r}; known: {', '.join(sorted(self.state.groups)) or 'none'}")
        self._not_observed(group)
        return group

    @staticmethod
    def _not_observed(group) -> None:
        if group.observed:
            raise bus.LabError(f"group {group.name} is observed, not run by the lab: it is read-only")

    def _valid_mode(self, mode) -> str:
        if mode not in MODES:
            raise bus.LabError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if mode == "pop":
            self._refuse_if_disabled("pop")
        return mode

    def _disabled(self, control: str) -> str | None:
        """Why ``control`` is off on the cluster the lab is attached to (None: it is on)."""
        return self.state.cluster.get("disabled", {}).get(control)

    def _refuse_if_disabled(self, control: str) -> None:
        reason = self._disabled(control)
        if reason:
            raise bus.LabError(reason)

    @staticmethod
    def _valid_strategy(name, options) -> tuple[str, dict]:
        if not isinstance(options, (dict, type(None))):
            raise bus.LabError(f"options must be an object, not {options!r}")
        if not isinstance(name, str) or name.strip().upper().split("-")[0] not in allocate.STRATEGY_NAMES:
            raise bus.LabError(f"unknown strategy {name!r}; valid: {', '.join(allocate.STRATEGY_NAMES)}")
        options = dict(options or {})
        try:
            built = allocate.get_strategy(name, **dict(options))
        except (ValueError, TypeError) as exc:
            raise bus.LabError(f"strategy {name}: {exc}") from None
        # The strategy's own name (what consumers report), e.g. MACHINE_ROOM_NEARBY-AVG.
        return built.name, options

    def _valid_topic(self, topic) -> str:
        if topic not in self.state.topics:
            raise bus.LabError(f"unknown topic {topic!r}; known: {', '.join(sorted(self.state.topics)) or 'none'}")
        return topic

    @staticmethod
    def _valid_number(name, value, minimum, maximum, integer=False):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise bus.LabError(f"{name} must be a number, not {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise bus.LabError(f"{name} must be a number, not {value!r}") from None
        if not math.isfinite(number) or not minimum <= number <= maximum:
            raise bus.LabError(f"{name} must be between {minimum} and {maximum}, not {value!r}")
        if integer:
            if number != int(number):
                raise bus.LabError(f"{name} must be a whole number, not {value!r}")
            return int(number)
        return number

    def _default_topic(self) -> str:
        return "TopicTest" if "TopicTest" in self.state.topics else next(iter(sorted(self.state.topics)), "")

    @staticmethod
    def _check(response):
        if response.status.code not in (0, OK):
            raise bus.LabError(f"broker: {response.status.message or response.status.code}")
        return response

    # -- doing ---------------------------------------------------------------------

    def _create_group(self, name: str, topic: str, mode: str, strategy: str):
        group = self.state.add_group(name, topic, mode, strategy)
        saved = self._saved_handoffs.pop(name, None)
        if saved is not None:
            try:
                group.handoffs.restore(saved, now_ms())
            except (KeyError, TypeError, ValueError) as exc:   # written by another version
                log.warning("ignoring the saved hand-offs of %s: %s", name, exc)
        if name not in self._watchers:
            self._watchers[name] = asyncio.create_task(self._watch_membership(name), name=f"lab-watch-{name}")
        return group

    def _live_clients(self, group: str) -> list[str]:
        return [c.client_id for c in self.state.clients.values() if c.group == group and c.alive]

    async def _command(self, host_id: str, command: str, **params) -> dict:
        link = self._hosts.get(host_id)
        if link is None:
            raise WorkerError(f"{host_id} has no worker")
        id_param = "client_id" if command == "consumer" else "producer_id"
        reply = await link.command(command, **{id_param: host_id}, **params)
        if "snapshot" in reply:
            self.state.apply_client_snapshot(reply["snapshot"])
        return reply

    async def _pick_worker(self) -> WorkerLink:
        """The live worker hosting the fewest clients; a new one while the pool is short."""
        async with self._placing:
            links = [link for link in self.supervisor.links.values() if link.connected]
            if len(links) < self.pool_size:
                links.append(await self.supervisor.spawn())
        load = {link.worker_id: 0 for link in links}
        for link in self._hosts.values():
            if link.worker_id in load:
                load[link.worker_id] += 1
        return min(links, key=lambda link: (load[link.worker_id], link.worker_id))

    async def _start_consumer(self, group_name: str) -> str:
        group = self.state.groups[group_name]
        link = await self._pick_worker()
        proposed = f"c{next(self._client_numbers)}"
        self._hosts[proposed] = link   # counted as load at once, so concurrent starts spread out
        try:
            reply = await link.command(
                "add_consumer", mode=group.mode, group=group.name, topic=group.topic, strategy=group.strategy,
                broker=self.broker_address, client_id=proposed, options=self.client_options.get(group.mode, {}))
        finally:
            del self._hosts[proposed]
        client_id = reply["client_id"]
        self._hosts[client_id] = link
        self.state.add_client(client_id, group.name, group.mode, link.worker_id).status = "running"
        self.state.apply_client_snapshot(reply["snapshot"])
        return client_id

    # -- other people's clients (peers.py) ---------------------------------------------

    async def _start_peer(self, group_name: str, kind) -> str:
        group = self.state.groups[group_name]
        before = set(group.members)
        peer = PeerConsumer(kind, self.namesrv, group_name, group.topic, self._peer_exited, self._peer_consumed,
                            lambda: self.state.topics.get(group.topic, []))
        try:
            client_id = await peer.start()
        except RuntimeError as exc:
            raise bus.LabError(str(exc)) from None
        if not client_id:   # it did not say: the one member the broker gained is it
            def newcomer():
                new = [c for c in group.members if c not in before and c not in self.state.clients]
                return new[0] if len(new) == 1 else None
            if not await self._wait_for(lambda: newcomer() is not None, timeout=30):
                peer.kill()
                raise bus.LabError(f"{kind.name} started but never registered with the broker")
            client_id = peer.client_id = newcomer()
        self._peers[client_id] = peer
        client = self.state.add_client(client_id, group_name, group.mode, kind.name)
        client.status, client.client, client.strategy = "running", kind.name, "its own (AVG)"
        client.reports_consumed = peer.measured   # its script reports what its listener is given
        client.assignment_source = "broker"   # until it says (running info), if it ever does
        return client_id

    async def _restore_peer(self, group_name: str, name: str) -> None:
        """A peer of the saved lab started again, as our consumers are; one that cannot be
        (its client uninstalled, no name server) is left out with a log line."""
        kind = PEER_CLIENTS.get(name)
        if kind is None or not kind.installed() or not self.namesrv:
            log.warning("not restoring a %s consumer of %s: %s", name, group_name,
                        "no name server" if kind and kind.installed() else "that client is not installed")
            return
        try:
            await self._start_peer(group_name, kind)
        except bus.LabError as exc:
            log.warning("not restoring a %s consumer of %s: %s", name, group_name, exc)

    async def _peer_action(self, peer: PeerConsumer, action: str) -> dict:
        if action not in peer.kind.actions:
            raise bus.LabError(f"{peer.kind.name} consumers take only {', '.join(peer.kind.actions)} here, "
                               f"not {action!r} (the lab cannot reach inside that client)")
        self._will_depart(peer.client_id, action)
        if action == "stop":
            await peer.stop()
        else:
            peer.kill()
            await peer.proc.wait()
        self.state.client_gone(peer.client_id, "stopped" if action == "stop" else "killed")
        self.emit("fault", peer.group, peer.client_id, fault=action)
        return self.state.snapshot()

    def _peer_consumed(self, peer: PeerConsumer, count: int, ranges: dict) -> None:
        """A peer's ``consume`` report, as our consumers send theirs."""
        client = self.state.clients.get(peer.client_id)
        if client is not None and client.reports_consumed and not peer.measured:
            client.reports_consumed = False   # from now on its hand-offs are not measured
            self.state.groups[peer.group].handoffs.silent.add(peer.client_id)
        self.emit("consume", peer.group, peer.client_id, topic=peer.topic,
                  interval_ms=int(REPORT_INTERVAL_S * 1000), ok=count, ranges=ranges or None)

    def _peer_exited(self, peer: PeerConsumer, code: int) -> None:
        self._peers.pop(peer.client_id, None)
        if not peer.stopping and peer.client_id:
            log.warning("%s consumer %s exited by itself (%s)", peer.kind.name, peer.client_id, code)
            self.state.client_gone(peer.client_id, "crashed")
            self.emit("fault", peer.group, peer.client_id, fault="crashed", worker=peer.kind.name)

    async def _peer_assignments(self, group, queues) -> None:
        """A peer's assignment: what it says it holds (GET_CONSUMER_RUNNING_INFO) where it
        answers, else what the broker sees it pull (the queues it pulled last)."""
        peers = [c for c in self._live_clients(group.name) if c in self._peers]
        if not peers:
            return
        seen = {c: [] for c in peers}
        for q in queues:
            if q.last_puller in seen and q.queue.topic == group.topic:
                seen[q.last_puller].append(f"{q.queue.broker_name}:{q.queue.queue_id}")
        for client_id, labels in seen.items():
            if self._peers[client_id].kind.running_info:
                held = await self._running_info_queues(group, client_id)
                if held is not None:
                    self.state.clients[client_id].assignment_source = "client"
                    labels = held
            self.state.set_assignment(group.name, client_id, labels)

    async def _running_info_queues(self, group, client_id: str) -> list[str] | None:
        """The queues of ``group``'s topic in the client's mqTable (not dropped), or None
        when it cannot be asked (then the broker's view stands)."""
        try:
            if self._remoting is None or self._remoting.closed:
                addresses = await broker_addresses(self.namesrv, group.topic)
                self._remoting = await RemotingClient.connect(next(iter(addresses.values())))
            answer = await self._remoting.request(wire.GET_CONSUMER_RUNNING_INFO, {
                "consumerGroup": group.name, "clientId": client_id, "jstackEnable": False}, timeout=3)
            if answer.code != wire.SUCCESS:
                return None
            table = wire.loads(answer.body).get("mqTable") or {}
        except (OSError, LookupError, ValueError, TimeoutError, AttributeError) as exc:
            log.debug("running info of %s: %s", client_id, exc)   # e.g. an empty mqTable the C++ client malforms
            return None
        held = []
        for key, info in table.items():
            mq = dict(key) if isinstance(key, tuple) else {}
            if mq.get("topic") == group.topic and not (isinstance(info, dict) and info.get("droped")):
                held.append(f"{mq.get('brokerName')}:{mq.get('queueId')}")
        return held

    async def _stop_consumer(self, client_id: str, how: str) -> None:
        self._will_depart(client_id, how)
        try:
            await self._command(client_id, "consumer", action=how)
        finally:   # the worker let go of it whatever happened next: the lab cannot reach it again
            self._hosts.pop(client_id, None)
            self.state.client_gone(client_id, "stopped" if how == "stop" else "killed")

    async def _set_producer_rate(self, topic: str, rate: float) -> None:
        producer = self.state.producers.get(topic)
        if producer is None:
            link = await self._pick_worker()
            producer_id = f"producer-{topic}"
            await link.command("add_producer", producer_id=producer_id, topic=topic, rate=rate,
                               broker=self.broker_address, options=self.client_options.get("producer", {}))
            self._hosts[producer_id] = link
            self.state.producers[topic] = {"producer_id": producer_id, "topic": topic, "rate": rate,
                                           "worker": link.worker_id}
        else:
            await self._command(producer["producer_id"], "producer", action="rate", rate=rate)
            producer["rate"] = rate

    async def _settle(self, group: str) -> bool:
        """Wait (briefly) for the group's steady state: the broker lists exactly the live
        consumers, each reported an assignment with the group's strategy, and every queue
        is owned exactly once (pop: shared by design)."""
        def settled():
            g = self.state.groups[group]
            live = [self.state.clients[c] for c in self._live_clients(group)]
            if set(g.members) != {c.client_id for c in live}:
                return False
            if g.mode == "pop" or any(c.client != OURS for c in live):
                return True   # pop shares queues; a peer rebalances on its own timer, as it likes
            return (all(c.client_id in g.assignments and c.strategy == g.strategy for c in live)
                    and not self.state.group_snapshot(g)["ownership_issues"])
        return await self._wait_for(settled)

    async def _wait_for(self, condition, timeout: float = SETTLE_TIMEOUT) -> bool:
        """Wait until ``condition()`` holds, checked again after each event that changes it."""
        if condition():
            return True
        waiter = (condition, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(waiter[1], timeout)
        except TimeoutError:
            return False
        finally:
            self._waiters.remove(waiter)


def _why(exc: Exception) -> str:
    """One word or line on a failed admin call: gRPC's status code, else the error."""
    return str(exc.code()) if isinstance(exc, grpc.aio.AioRpcError) else str(exc) or type(exc).__name__
