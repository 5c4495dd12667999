"""Other people's clients (peers.py) in the lab's groups: starting and stopping their
processes, their reports, and their assignments as they or the broker tell them.

A mixin of LabController.
"""
import logging


from consumers_app.remoting import wire
from consumers_app.remoting.client import RemotingClient, broker_addresses

from . import bus
from .peers import PEER_CLIENTS, REPORT_INTERVAL_S, PeerConsumer

log = logging.getLogger(__name__)


class PeerConsumers:
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
