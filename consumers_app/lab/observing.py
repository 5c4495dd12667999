"""Groups the lab did not start, watched read-only on the cluster (observer.py): each
look at one folded into the state, its events and its lag recorded like a lab group's.

A mixin of LabController; ``action_observe`` (handlers.py) starts the watch.
"""
import asyncio
import logging


from consumers_app.events import now_ms
from consumers_app.protocol import lab

from .cluster_admin import oldest_ts_field
from .handoff import handoff_events
from .observer import Cluster, GroupOffline, NotObservable, Sighting, changes, departure

log = logging.getLogger(__name__)


class Observing:
    async def _observe(self, group: str, cluster: Cluster, last: Sighting) -> None:
        try:
            while True:
                await asyncio.sleep(self.observe_interval)
                try:
                    sighting = await cluster.look(group, now_ms())
                except GroupOffline:   # everyone left: the offsets stay as they were
                    sighting = Sighting(now_ms(), last.topic, last.mode, last.queues, offsets=last.offsets,
                                        address=last.address)
                except (NotObservable, OSError, TimeoutError, ValueError) as exc:
                    log.warning("observing %s: %s", group, exc or "timeout")   # next tick asks again
                    continue
                await cluster.tell_departures(group, last, sighting)
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
                self.state.client_gone(client_id, departure(last, after.departures.get(client_id, "")))
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
