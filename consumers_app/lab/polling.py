"""The lab's loops on a clock: topology and queue offsets polled from the broker, the
coalesced events published to the browsers, the disk measured.

Each runs as a task of its own, so a slow browser or channel layer delays only its
loop, never the intake of events or the answers to requests. A mixin of LabController.
"""
import asyncio
import logging
import time

import grpc

from consumers_app.events import now_ms
from consumers_app.protocol import lab

from . import bus
from .disk import history_service, measure
from .handoff import handoff_events
from .intake import why_failed

log = logging.getLogger(__name__)

DISK_INTERVAL_S = 10.0    # walking the data dirs costs I/O; retention itself acts every 10 s


class PollLoops:
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
                log.warning("offset poll failed: %s", why_failed(exc))
            self.collect_garbage()
            self.read_history_service()
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
        self._snapshot_due = True

    def read_history_service(self) -> None:
        """What the lag service says of itself, each poll (a small file): read every 10 s with
        the disk, as the service passes every 10 s, "behind" sampled one phase of its 0-10 s
        sawtooth and never moved (one lab read "3 s behind" for minutes, the next "7 s")."""
        lag_dir = self.disk_places.lag_history if self.disk_places is not None else None   # a lab with no disk: none
        self.state.history_service = history_service(lag_dir, now_ms(), self.started_ms)

    async def _disk_loop(self) -> None:
        while True:
            try:
                await self.measure_disk()
            except OSError as exc:   # e.g. a directory made unreadable: the last figures stand
                log.warning("measuring disk use failed: %s", exc)
            await asyncio.sleep(DISK_INTERVAL_S)
