"""Retention (RocketMQ's CleanCommitLogService): old commit-log segments deleted.

Every ``clean_interval_ms`` whole segments are deleted oldest first, never the one being
written, while the commit log is larger than ``retention_bytes`` (our stand-in for
diskMaxUsedSpaceRatio) or the segment was last modified more than ``retention_ms`` ago
(fileReservedTime), whatever consumers still need. The consume queues then start at the
first entry still in the log: their min offsets move and pulls below them are corrected,
as RocketMQ's. Each queue's min offset is saved in ``DATA/consumequeue/min_offsets.json``
before the files go, so a restart continues the queue offsets even of queues whose every
message was deleted. Consume-queue files whose entries all lie in deleted segments go after
them (the last one of a queue always stays).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

from ...atomic import write_json

from .commit_log import Segment
from .consume_queue import ConsumeQueue

log = logging.getLogger(__name__)


class CleanCommitLogService:
    """The MessageStore's retention and the min offsets it saves (part of MessageStore;
    see its __init__)."""

    def _init_retention(self, retention_bytes: int | None, retention_ms: int | None, clean_interval_ms: int):
        self.min_offsets_path = self.cq_dir / "min_offsets.json"
        # None: no bound of that kind (unit tests; the broker always passes both).
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.clean_interval = clean_interval_ms / 1000
        self._cleaner: asyncio.Task | None = None
        self._clean_wakeup: asyncio.Event | None = None
        self._unmapped_later: list[Segment] = []  # deleted from the log, still mapped (see Segment.close)
        self.deleted_segments = 0

    def _load_min_offsets(self, accept):
        """Queues start at the min offsets retention saved (their older records are gone),
        so offsets continue after a restart, even of a queue with no message left."""
        try:
            data = json.loads(self.min_offsets_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            log.warning("consume queue min offsets unreadable, ignored: %s", self.min_offsets_path)
            return
        # Saved when the log started at ``since``: a queue re-created after that is a new one.
        since = data.get("commitlog_min", 0)
        for topic, broker, qid, offset in data.get("queues", []):
            if accept is None or accept(topic, broker, since):
                self.queues[(topic, broker, qid)] = ConsumeQueue(offset, since)

    def _save_min_offsets(self, commitlog_min: int, rows: list):
        self.min_offsets_path.parent.mkdir(exist_ok=True)
        write_json(self.min_offsets_path, {"commitlog_min": commitlog_min, "queues": rows})
    async def _clean_loop(self):
        """RocketMQ's CleanCommitLogService: a check every 10 s; also woken when a roll or
        a flush finds the log a whole segment over its size bound, so a fast producer
        does not fill the disk between two checks."""
        while True:
            try:
                await asyncio.wait_for(self._clean_wakeup.wait(), self.clean_interval)
            except asyncio.TimeoutError:
                pass
            self._clean_wakeup.clear()
            try:
                deletion = self._expire()
                if deletion.paths or deletion.min_offsets is not None or deletion.cq_cuts:
                    # fsync and freeing a big file's blocks take a while: off the event loop.
                    # Safe: the segments are already out of the log, unmapped and closed.
                    await asyncio.to_thread(self._finish, deletion)
            except OSError:
                log.exception("commit log retention failed")

    def _wake_cleaner_if_over(self):
        if self._clean_wakeup is not None and self.retention_bytes is not None and \
                self.log_bytes() > self.retention_bytes + self.segment_size:
            self._clean_wakeup.set()
    def expired_count(self, now: float | None = None) -> int:
        """How many of the oldest segments retention deletes now (a prefix of the log)."""
        now = time.time() if now is None else now
        segs = self.segments
        total = self.log_bytes()
        n = 0
        while n < len(segs) - 1:  # never the segment being written
            seg = segs[n]
            if seg.base + seg.size > self.flushed_pos:
                # Not fsynced yet: the flusher may be syncing its fd right now.
                break
            over = self.retention_bytes is not None and total > self.retention_bytes
            old = self.retention_ms is not None and (now - seg.mtime()) * 1000 >= self.retention_ms
            if not (over or old):
                break  # oldest first: a younger segment never goes before an older one
            total -= seg.size
            n += 1
        return n

    def delete_expired(self, now: float | None = None) -> list[Path]:
        """Delete the segments retention no longer keeps, and what indexes them; returns
        the files unlinked. (The broker's clean loop does the same with the file work off
        the event loop.)"""
        deletion = self._expire(now)
        self._finish(deletion)
        return deletion.paths

    def _expire(self, now: float | None = None) -> "_Deletion":
        """The in-memory half, on the event loop: the segments leave the log and the
        consume queues are cut (readers see the new min offsets at once); then each
        segment is unmapped and closed, so it is never held once unlinked."""
        deletion = _Deletion(self._retry_unmapped())
        n = self.expired_count(now)
        if not n:
            return deletion
        gone, self.segments = self.segments[:n], self.segments[n:]
        deletion.commitlog_min = self.segments[0].base
        for key, cq in self.queues.items():
            cq.truncate_before(deletion.commitlog_min)
            deletion.cq_cuts.append((key, cq, cq.base))
        deletion.min_offsets = [[*key, cq.base] for key, cq in self.queues.items() if cq.base > 0]
        for seg in gone:
            if seg.close():
                deletion.paths.append(seg.path)
            else:
                self._unmapped_later.append(seg)
        self.deleted_segments += n
        log.info("retention: deleting %d commit-log segment(s); the log now starts at %d (%d bytes)",
                 n, deletion.commitlog_min, self.log_bytes())
        return deletion

    def _finish(self, deletion: "_Deletion"):
        """The file half: the min offsets are made durable before any file goes, so a
        crash in between restarts with offsets that never point into a deleted file."""
        if deletion.min_offsets is not None:
            self._save_min_offsets(deletion.commitlog_min, deletion.min_offsets)
        for p in deletion.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        # Consume-queue files after the segments: a crash in between leaves files whose
        # entries point below the log's start, which a restart skips.
        self._delete_cq_files(deletion.cq_cuts)

    def _retry_unmapped(self) -> list[Path]:
        """Deleted segments whose map could not be closed before: unlink them once it can."""
        paths, still = [], []
        for seg in self._unmapped_later:
            (paths if seg.close() else still).append(seg)
        self._unmapped_later = still
        return [seg.path for seg in paths]
    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk (allocated blocks, as du counts) per part of the data dir:
        commitlog, consumequeue (the saved min offsets), offsets (consumerOffset.json),
        topics (topics.json) and other."""
        parts = {"commitlog": 0, "consumequeue": 0, "offsets": 0, "topics": 0, "other": 0}
        names = {"commitlog": "commitlog", "consumequeue": "consumequeue",
                 "consumerOffset": "offsets", "topics": "topics"}
        try:
            entries = list(os.scandir(self.data_dir))
        except FileNotFoundError:
            return parts
        for entry in entries:
            part = names.get(entry.name.split(".", 1)[0], "other")
            parts[part] += _du(entry)
        return parts

def _du(entry: os.DirEntry) -> int:
    try:
        if entry.is_dir(follow_symlinks=False):
            return sum(_du(e) for e in os.scandir(entry.path))
        return entry.stat(follow_symlinks=False).st_blocks * 512
    except FileNotFoundError:  # deleted meanwhile (retention, an atomic rename)
        return 0


class _Deletion:
    __slots__ = ("paths", "commitlog_min", "min_offsets", "cq_cuts")

    def __init__(self, paths: list[Path]):
        self.paths = paths              # closed segment files to unlink
        self.commitlog_min = 0
        self.min_offsets = None         # [[topic, broker, qid, min offset], ...] to save, if any
        self.cq_cuts = []               # [(key, queue, new min offset)]: consume-queue files to prune
