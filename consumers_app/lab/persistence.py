"""The lab's state in the database, so a restarted runlab comes back as it was left.

The controller describes itself as a Scenario (``desired_scenario``); ``LabMemory``
writes it when it changed (checked every ``interval`` seconds, so a burst of actions is
one write) and reads it back at start-up.
"""
from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async

from .scenario import Scenario

log = logging.getLogger(__name__)


class LabMemory:
    def __init__(self, name: str = "default", interval: float = 2.0):
        self.name = name
        self.interval = interval
        self._saved: dict | None = None

    @sync_to_async
    def load(self) -> Scenario | None:
        from consumers_app.models import SavedLab
        row = SavedLab.objects.filter(name=self.name).first()
        if row is None:
            return None
        self._saved = row.scenario
        try:
            return Scenario.from_dict(row.scenario)
        except (TypeError, ValueError, AttributeError) as exc:   # written by another version
            log.warning("ignoring the saved lab state: %s", exc)
            return None

    @sync_to_async
    def clear(self) -> None:
        from consumers_app.models import SavedLab
        SavedLab.objects.filter(name=self.name).delete()
        self._saved = None

    async def save(self, scenario: Scenario) -> bool:
        data = scenario.to_dict()
        if data == self._saved:
            return False
        await self._write(data)
        self._saved = data
        return True

    @sync_to_async
    def _write(self, data: dict) -> None:
        from consumers_app.models import SavedLab
        SavedLab.objects.update_or_create(name=self.name, defaults={"scenario": data})

    async def keep(self, describe) -> None:
        """Save ``describe()`` whenever it changes, until cancelled; a last save on the way out."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    await self.save(describe())
                except Exception:  # noqa: BLE001 - the live lab matters more than its memory
                    log.exception("saving the lab state failed")
        except asyncio.CancelledError:
            try:
                await asyncio.shield(self.save(describe()))
            except Exception:  # noqa: BLE001
                log.exception("saving the lab state on stop failed")
            raise
