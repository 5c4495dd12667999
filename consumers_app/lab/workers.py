"""Where the lab's clients run: each new consumer or producer on the least busy worker
process of a small pool (supervisor.py), and the commands that reach them there.

A mixin of LabController.
"""


from .supervisor import WorkerError, WorkerLink


class WorkerPlacement:
    async def _command(self, host_id: str, command: str, **params) -> dict:
        link = self._hosts.get(host_id)
        if link is None:
            raise WorkerError(f"{host_id} has no worker")
        id_param = "client_id" if command == "consumer" else "producer_id"
        return await link.command(command, on_result=self._apply_reply_snapshot, **{id_param: host_id}, **params)

    def _apply_reply_snapshot(self, reply: dict) -> None:
        """A consumer's snapshot in a worker's answer, applied in stream order (WorkerLink.command):
        the events it sent after that answer are newer and must not be undone by it."""
        if "snapshot" in reply:
            self.state.apply_client_snapshot(reply["snapshot"])

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
        proposed = f"c{self.next_client}"
        self.next_client += 1
        self._hosts[proposed] = link   # counted as load at once, so concurrent starts spread out

        def added(reply: dict) -> None:   # in stream order, as _apply_reply_snapshot
            self.state.add_client(reply["client_id"], group.name, group.mode, link.worker_id).status = "running"
            self.state.apply_client_snapshot(reply["snapshot"])

        try:
            reply = await link.command(
                "add_consumer", on_result=added, mode=group.mode, group=group.name, topic=group.topic,
                strategy=group.strategy, broker=self.broker_address, client_id=proposed,
                options=self.client_options.get(group.mode, {}))
        finally:
            del self._hosts[proposed]
        client_id = reply["client_id"]
        self._hosts[client_id] = link
        return client_id


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
