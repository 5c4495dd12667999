"""Committed consumer offsets per (group, topic, broker, queue id).

Persisted as ``consumerOffset.json`` every ``persist interval`` (RocketMQ's
flushConsumerOffsetInterval, 5 s) and on shutdown, by atomic rename, so a killed
broker restarts with the offsets of its last persist. Other components (pop
checkpoints, the delay scheduler) register their state as *sections* of the same
file, so offsets and the pop state that depends on them are always persisted together.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..atomic import write_json


class OffsetStore:
    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / "consumerOffset.json"
        # group -> {(topic, broker, qid): offset}
        self.offsets: dict[str, dict[tuple, int]] = {}
        self._sections: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {}
        self._loaded_sections: dict = {}
        self.dirty = False

    def register_section(self, name: str, dump: Callable[[], object], restore: Callable[[object], None]):
        self._sections[name] = (dump, restore)
        if name in self._loaded_sections:
            restore(self._loaded_sections.pop(name))

    def load(self):
        if not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        for row in data.get("offsets", []):
            group, topic, broker, qid, off = row
            self.offsets.setdefault(group, {})[(topic, broker, qid)] = off
        for name, value in data.get("sections", {}).items():
            if name in self._sections:
                self._sections[name][1](value)
            else:
                self._loaded_sections[name] = value

    def persist(self):
        rows = [[g, t, b, q, off] for g, qs in self.offsets.items() for (t, b, q), off in qs.items()]
        sections = {name: dump() for name, (dump, _) in self._sections.items()}
        write_json(self.path, {"offsets": rows, "sections": sections})
        self.dirty = False

    # ------------------------------------------------------------------------

    def get(self, group: str, key: tuple) -> int:
        """Committed offset, or -1 when the group has none for the queue."""
        return self.offsets.get(group, {}).get(key, -1)

    def commit(self, group: str, key: tuple, offset: int):
        self.offsets.setdefault(group, {})[key] = offset
        self.dirty = True

    def has_group(self, group: str) -> bool:
        return group in self.offsets

    def drop_topic(self, topic: str):
        for qs in self.offsets.values():
            for k in [k for k in qs if k[0] == topic]:
                del qs[k]
