"""The lab's state in the database, so a restarted runlab comes back as it was left;
its hand-off story (the last 15 minutes) in a file under the data dir.

The controller describes itself as a Scenario (``desired_scenario``) and the number its
next consumer's name takes; ``LabMemory`` writes them when they changed (checked every
``interval`` seconds, so a burst of actions is one write) and reads them back at start-up.
"""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from asgiref.sync import sync_to_async

from .. import atomic
from .scenario import Scenario

log = logging.getLogger(__name__)


class LabMemory:
    def __init__(self, name: str = "default", interval: float = 2.0):
        self.name = name
        self.interval = interval
        self._saved: dict | None = None
        self.next_client = 1   # as saved (load): where the restarted lab's consumer names go on

    @sync_to_async
    def load(self) -> Scenario | None:
        from consumers_app.models import SavedLab
        row = SavedLab.objects.filter(name=self.name).first()
        if row is None:
            return None
        self._saved = {"scenario": row.scenario, "next_client": row.next_client}
        self.next_client = row.next_client
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
        self.next_client = 1

    async def save(self, scenario: Scenario, next_client: int) -> bool:
        # As the database gives it back (tuples become lists): a lab as loaded is not rewritten.
        data = json.loads(json.dumps({"scenario": scenario.to_dict(), "next_client": next_client}))
        if data == self._saved:
            return False
        await self._write(data)
        self._saved = data
        return True

    @sync_to_async
    def _write(self, data: dict) -> None:
        from consumers_app.models import SavedLab
        SavedLab.objects.update_or_create(name=self.name, defaults=data)

    async def keep(self, describe, next_client) -> None:
        """Save ``describe()`` and ``next_client()`` whenever they change, until cancelled; a
        last save on the way out."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    await self.save(describe(), next_client())
                except Exception:  # noqa: BLE001 - the live lab matters more than its memory
                    log.exception("saving the lab state failed")
        except asyncio.CancelledError:
            try:
                await asyncio.shield(self.save(describe(), next_client()))
            except Exception:  # noqa: BLE001
                log.exception("saving the lab state on stop failed")
            raise


class HandoffStory:
    """The last 15 minutes of each group's hand-offs (handoff.py), in a JSON file, so that a
    restarted lab still tells what the rebalances before the restart did. Written when it
    changed (checked every ``interval`` seconds) and once more on the way out; an unreadable
    file (another version's) is ignored with a warning."""

    def __init__(self, path, interval: float = 5.0):
        self.path = Path(path)
        self.interval = interval
        self._written: str | None = None

    def load(self) -> dict[str, dict]:
        """group name -> its saved story (GroupHandoffs.saved); {} when there is none."""
        try:
            text = self.path.read_text()
            data = json.loads(text)
            if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
                raise ValueError("not an object of groups")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring the saved hand-offs in %s: %s", self.path, exc)
            return {}
        self._written = text
        return data

    def save(self, stories: dict[str, dict]) -> bool:
        text = json.dumps(stories, separators=(",", ":"))
        if text == self._written:
            return False
        atomic.write_bytes(self.path, text.encode(), durable=False)   # a reader never sees half a file
        self._written = text
        return True

    async def keep(self, describe) -> None:
        """Save ``describe()`` whenever it changes, until cancelled; a last save on the way out."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    await asyncio.to_thread(self.save, describe())
                except Exception:  # noqa: BLE001 - the live lab matters more than its memory
                    log.exception("saving the hand-offs to %s failed", self.path)
        except asyncio.CancelledError:
            try:
                self.save(describe())
            except Exception:  # noqa: BLE001
                log.exception("saving the hand-offs to %s on stop failed", self.path)
            raise
