"""Putting a table's recomputed partitions in place, atomically for readers.

A table ``<lag>/<table>`` is a symlink to one generation ``<lag>/.tables/<table>-<id>``.
A swap builds the next generation - hard links to every file of the current one except
the partitions being replaced, plus the staged partitions moved in - then points the
symlink at it with one rename. A reader resolves the link once per listing: it sees the
old table or the new one, never a partition missing (the old swap moved the old partition
aside before renaming the new one in) nor doubled. A retired generation is deleted once it
has been retired ``RETIRED_GRACE_S``, so a reader that listed it can still open its files.
Generations live under a dot-name: Spark, pyarrow and the disk figures' walk see the table
through its link only (the walk counts a hard-linked file once).
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

GENERATIONS = ".tables"
RETIRED_GRACE_S = 60.0


def swap_in(target: Path, staging: Path, replaced: set[Path]) -> None:
    """Make the table at ``target`` hold ``staging``'s partitions in place of ``replaced``
    (partition dirs relative to both; one missing from ``staging`` disappears)."""
    generations = target.parent / GENERATIONS
    generations.mkdir(parents=True, exist_ok=True)
    current = _current(target, generations)
    _delete_retired(generations, target.name, current)
    new = generations / f"{target.name}-{uuid.uuid4().hex}"
    if current is None:
        new.mkdir()
    else:
        shutil.copytree(current, new, copy_function=os.link, ignore=_skipping(current, replaced))
    for rel in replaced:
        if (staging / rel).is_dir():
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, new / rel)
    link = target.with_name(f".{target.name}.link-{uuid.uuid4().hex}")
    os.symlink(os.path.relpath(new, target.parent), link)
    os.replace(link, target)   # the one step a reader can observe
    if current is not None:
        os.utime(current)      # its grace period starts now


def _current(target: Path, generations: Path) -> Path | None:
    """The generation ``target`` points at; a plain directory (history written before
    generations existed) is first moved in as one - the only swap with a (brief) gap."""
    if target.is_symlink():
        return target.resolve()
    if not target.is_dir():
        return None
    adopted = generations / f"{target.name}-{uuid.uuid4().hex}"
    os.replace(target, adopted)
    os.symlink(os.path.relpath(adopted, target.parent), target)
    return adopted


def _skipping(current: Path, replaced: set[Path]):
    """copytree's ignore: dot-names (scratch, checksums) and the partitions being replaced."""
    def ignore(directory: str, names: list[str]) -> set[str]:
        here = Path(directory).relative_to(current)
        return {n for n in names if n.startswith(".") or here / n in replaced}
    return ignore


def _delete_retired(generations: Path, table: str, current: Path | None) -> None:
    cutoff = time.time() - RETIRED_GRACE_S
    for generation in generations.glob(f"{table}-*"):
        try:
            if generation != current and generation.stat().st_mtime < cutoff:
                shutil.rmtree(generation, ignore_errors=True)
        except FileNotFoundError:
            pass
