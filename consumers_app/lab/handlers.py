"""The answers to the dashboard's requests: one ``action_<name>`` per action of the table
in actions.py, through which ``handle`` dispatches.

By the time a handler runs, the table has checked its params (``checked_request``): a
handler checks only what weighs them against the running lab (limits, a group's mode),
then acts, waits for the effect where the page should see it, and answers the snapshot.
A mixin of LabController.
"""
import asyncio


from consumers_app.events import now_ms
from consumers_app.message_queue import MessageQueue, broker_of
from consumers_app.protocol import lab

from . import bus
from .actions import checked_request, known_broker, known_topic, not_observed, valid_mode, valid_strategy
from .handoff import rebalance_detail
from .observer import Cluster, NotObservable
from .peers import OURS, PEER_CLIENTS
from .supervisor import WorkerError
from .timeline import lag_series, view_at
from .whatif import preview_group


class ActionHandlers:
    async def handle(self, action: str, params: dict) -> dict:
        """The answer to one bus request (bus.serve), or LabError."""
        spec, params = checked_request(self, action, params)
        try:
            return await getattr(self, f"action_{spec.name}")(**params)
        except WorkerError as exc:
            raise bus.LabError(f"{spec.name} failed in a worker: {exc}") from None

    async def action_state(self) -> dict:
        return self.state.snapshot()

    async def action_health(self) -> dict:
        """/healthz: healthy while the broker process is up (always, when runlab does not manage it)."""
        broker = self.state.broker_process
        return {"ok": bool(broker.get("up", True)), "broker_process": broker}

    async def action_set_strategy(self, group, strategy, options=None) -> dict:
        # ``strategy`` is the strategy's own name by now (actions.valid_strategy), as consumers report it.
        self.state.groups[group].strategy = strategy
        clients = self._live_clients(group)
        # One switch of the group, whatever its size: the lag history counts and marks this one.
        self.emit("fault", group, "", fault="strategy", strategy=strategy, clients=clients)
        await asyncio.gather(*(
            self._command(client_id, "consumer", action="set_strategy", strategy=strategy, options=options)
            for client_id in clients))
        await self._settle(group)
        return self.state.snapshot()

    async def action_preview_strategy(self, group, strategy) -> dict:
        """What switching to ``strategy`` would do (whatif.py); read-only, nothing changes."""
        target = self.state.groups[group]
        if target.mode == "pop":
            raise bus.LabError(f"group {group} pops: the broker hands out its messages and pop consumers "
                               f"ignore the strategy, so nothing would move")
        return preview_group(self.state, target, strategy)

    async def action_rebalance(self, group, rebalance_id) -> dict:
        """One of the group's recent rebalances with its hand-offs (handoff.py); read-only."""
        return rebalance_detail(self.state.groups[group], rebalance_id)

    async def action_lag_series(self, group, seconds) -> dict:
        """The group's lag, one point a second (timeline.py); read-only."""
        return lag_series(self.state.groups[group], seconds)

    async def action_view_at(self, group, ts) -> dict:
        """The group's queues as they were at ``ts`` (timeline.py); read-only."""
        return view_at(self.state.groups[group], ts)

    async def action_set_mode(self, group, mode) -> dict:
        target = self.state.groups[group]
        if mode != target.mode:
            members = self._live_clients(group)
            await asyncio.gather(*(self._stop_consumer(c, "stop") for c in members))
            target.mode = mode
            await asyncio.gather(*(self._start_consumer(group) for _ in members))
            await self._settle(group)
        return self.state.snapshot()

    async def action_add_consumer(self, group, mode=None, topic=None, strategy=None, client=OURS) -> dict:
        new_group = checked_new_consumer(self, group, mode, topic, strategy, client)
        if new_group is not None:
            self._create_group(group, **new_group)
        if client == OURS:
            client_id = await self._start_consumer(group)
            await self._settle(group)
        else:
            client_id = await self._start_peer(group, PEER_CLIENTS[client])
        return {"client_id": client_id, "state": self.state.snapshot()}

    async def action_consumer(self, client_id, action, ms=None, ratio=None) -> dict:
        client = self.state.clients[client_id]
        peer = self._peers.get(client_id)
        if peer is not None:
            return await self._peer_action(peer, action)
        detail = {"ms": ms} if action == "slow" else {"ratio": ratio} if action == "fail" else {}
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
        await self._set_producer_rate(topic, rate)
        producer_id = self.state.producers[topic]["producer_id"]
        self.emit("fault", "", producer_id, fault="producer_rate", topic=topic, rate=rate)
        return self.state.snapshot()

    async def action_producer_burst(self, topic, count) -> dict:
        if topic not in self.state.producers:
            await self._set_producer_rate(topic, 0)
        producer_id = self.state.producers[topic]["producer_id"]
        await self._command(producer_id, "producer", action="burst", count=count)
        self.emit("fault", "", producer_id, fault="producer_burst", topic=topic, count=count)
        return self.state.snapshot()

    async def action_queues(self, topic, delta, broker=None) -> dict:
        broker = checked_queue_change(self, topic, delta, broker)
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


# ---------------------------------------------------------------- checks against the running lab
# What weighs a request's params against the running lab, before its handler acts.
# ``lab`` has the LabState as ``state``, the ``limits`` (controller.Limits) and ``namesrv``.

def checked_new_consumer(lab, group, mode=None, topic=None, strategy=None, client=OURS) -> dict | None:
    """LabError unless a consumer of ``client`` may join ``group`` (limits, the group's
    mode, topic and strategy); for a group that does not exist yet, its topic, mode and strategy."""
    if client != OURS:
        kind = PEER_CLIENTS[client]
        if (mode or "push") not in kind.modes:
            raise bus.LabError(f"{client} consumers play {', '.join(kind.modes)} mode only, not {mode!r}")
        if not lab.namesrv:
            raise bus.LabError(f"{client} needs the broker's name server, and this lab's broker has none "
                               f"(start it with runlab, or runbroker --namesrv-port)")
        existing = lab.state.groups.get(group)
        if existing is not None and existing.mode not in kind.modes:
            raise bus.LabError(f"group {group} consumes in {existing.mode} mode; {client} plays push only")
    alive = [c for c in lab.state.clients.values() if c.alive]
    if len(alive) >= lab.limits.consumers:
        raise bus.LabError(f"the lab runs at most {lab.limits.consumers} consumers (LAB_MAX_CONSUMERS)")
    if sum(c.group == group for c in alive) >= lab.limits.group_consumers:
        raise bus.LabError(f"a group has at most {lab.limits.group_consumers} consumers "
                           f"(LAB_MAX_GROUP_CONSUMERS); {group} is full")
    existing = lab.state.groups.get(group)
    if existing is not None:
        not_observed(existing)
        if mode is not None and valid_mode(mode, lab) != existing.mode:
            raise bus.LabError(f"group {group} consumes in {existing.mode} mode; use set_mode to switch it")
        if topic is not None and topic != existing.topic:
            raise bus.LabError(f"group {group} subscribes to {existing.topic}, not {topic!r}")
        if strategy is not None and valid_strategy(strategy)[0] != existing.strategy:
            raise bus.LabError(f"group {group} uses {existing.strategy}; use set_strategy to switch it")
        return None
    return {"mode": valid_mode(mode if mode is not None else "push", lab),
            "strategy": valid_strategy(strategy if strategy is not None else "AVG")[0],
            "topic": known_topic(topic if topic is not None else default_topic(lab.state), lab)}


def default_topic(state) -> str:
    return "TopicTest" if "TopicTest" in state.topics else next(iter(sorted(state.topics)), "")


def checked_queue_change(lab, topic, delta, broker=None) -> str:
    """The broker whose queues of ``topic`` change by ``delta`` (left out: the topic's
    first, in MessageQueue order), or LabError (too few queues there, the topic's limit)."""
    labels = lab.state.topics[topic]
    if broker is None:
        broker = broker_of(labels[0]) if labels else None
    known_broker(broker, lab)
    on_broker = sum(1 for x in labels if broker_of(x) == broker)
    if delta < 0 and -delta > on_broker:
        raise bus.LabError(f"{topic} has only {on_broker} queue(s) on {broker}; cannot remove {-delta}")
    if len(labels) + delta < 1:
        raise bus.LabError(f"removing {-delta} queue(s) would leave {topic} with no queues")
    if len(labels) + delta > lab.limits.topic_queues:
        raise bus.LabError(f"a topic has at most {lab.limits.topic_queues} queues (LAB_MAX_TOPIC_QUEUES); "
                           f"{topic} has {len(labels)}")
    return broker
