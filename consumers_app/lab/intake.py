"""What comes into the lab: events from the workers, the controller's own, membership
changes from the broker, a worker's death; and the actions' waits for their effect.

Everything is folded into the LabState by ``_take``, one path for all of them, so an
action can wait (``_wait_for``) for the state it changed. A mixin of LabController.
"""
import asyncio
import logging

import grpc

from consumers_app.events import Event, make_event, now_ms
from consumers_app.protocol import lab

from .peers import OURS
from .supervisor import WorkerLink

log = logging.getLogger(__name__)

# Figures superseded by the next report: they never settle an action.
FIGURE_TYPES = frozenset({"pq", "flow_control", "consume", "offset", "pop"})
SETTLE_TIMEOUT = 5.0      # how long an action waits for its effect before answering anyway


class EventIntake:
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
                log.info("membership watch of %s ended (%s); reconnecting", group, why_failed(exc))
            await asyncio.sleep(1.0)


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


def why_failed(exc: Exception) -> str:
    """One word or line on a failed admin call: gRPC's status code, else the error."""
    return str(exc.code()) if isinstance(exc, grpc.aio.AioRpcError) else str(exc) or type(exc).__name__
