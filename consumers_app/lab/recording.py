"""The glue between the lab and its lag history (recorder.py): offsets and events
recorded as Parquet when a recorder root is given, and pruned by the hour.

A mixin of LabController; history is optional, so its failures are logged, never raised.
"""
import asyncio
import logging
import time


from consumers_app.events import now_ms


log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 60.0   # recordings go by whole hours: checking once a minute is prompt enough


class Recording:
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
                await asyncio.to_thread(self._recorder.add_events, events)
            except Exception:  # noqa: BLE001 - history is optional; the live view is not
                log.exception("recording %d events failed", len(events))
