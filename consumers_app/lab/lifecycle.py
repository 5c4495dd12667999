"""The lab's life cycle: starting its workers and loops, setting a scenario up, stopping,
and what it keeps for the next start (the lab as a scenario, the groups' hand-offs).

A mixin of LabController (controller.py), apart so the order things start and stop in
reads in one place.
"""
import asyncio
import time

import grpc

from consumers_app.events import now_ms
from consumers_app.message_queue import broker_of
from consumers_app.protocol import lab, lab_grpc

from . import bus
from .handoff import WINDOW_MS
from .actions import disabled, valid_mode
from .peers import OURS, PEER_CLIENTS
from .scenario import ConsumerFaults, GroupSpec, Scenario


class LabLifecycle:
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
        if self.memory is not None:   # names go on from the last run's (a fresh one's are 1 on)
            self.next_client = max(self.next_client, self.memory.next_client)
        if scenario is not None:
            await self.run_scenario(scenario)
        if self.memory is not None:
            self._tasks.append(asyncio.create_task(self.memory.keep(self.desired_scenario, lambda: self.next_client),
                                                   name="lab-memory"))
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
            valid_mode(spec.mode, self)
            group = self._create_group(spec.name, spec.topic, spec.mode, spec.strategy)
            started = await asyncio.gather(*(self._start_consumer(group.name) for _ in range(spec.consumers)))
            for client_id, faults in zip(started, spec.faults):
                await self._apply_faults(client_id, faults)
            for name in spec.peers:
                await self._restore_peer(group.name, name)
        for broker in scenario.offline_brokers:
            if self.state.brokers.get(broker) and not disabled(self, "broker_online"):
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
        # A saved group not started again (yet), or dropped when it was left empty, keeps its
        # story until the window forgets it.
        horizon = now - WINDOW_MS
        for name, story in list(self._saved_handoffs.items()):
            if name in stories or not any(r.get("end_ts", 0) >= horizon for r in story.get("rebalances", ())):
                del self._saved_handoffs[name]
        return {**self._saved_handoffs, **stories}

    def collect_garbage(self) -> None:
        """Forget consumers gone for longer than the grace period and groups left empty (a
        group's hand-off story stays: the page shows it again if the group comes back, and
        it is saved for the next start, until the window forgets it)."""
        groups = dict(self.state.groups)
        for name in self.state.collect_garbage(time.monotonic(), self.gone_grace_s):
            group = groups[name]
            if not group.observed and group.handoffs.rebalances:
                self._saved_handoffs[name] = group.handoffs.saved(now_ms())
            self._story_cache.pop(name, None)
            watcher = self._watchers.pop(name, None)
            if watcher is not None:
                watcher.cancel()
