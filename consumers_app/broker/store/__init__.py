"""Message store, split as RocketMQ's DefaultMessageStore splits its services:

* commit_log: the append-only commit log in segment files, reads, and the flush service;
* consume_queue: the per-queue index (queue offset -> record), in memory and its files;
* checkpoint: consume-queue files and the checkpoint, so a restart scans only the tail;
* retention: CleanCommitLogService, deleting old segments and moving min offsets.

``MessageStore`` is the facade the broker uses: one object whose parts share its state
(each part's ``_init_*`` says what it owns) and run on the broker's event loop, the file
work of checkpoint and retention in threads.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from .checkpoint import CHECKPOINT_VERSION, StoreCheckpoint, _NoCheckpoint
from .commit_log import HEADER, PREALLOCATE, CommitLog, Segment
from .consume_queue import (CQ_ENTRY, CQ_FILE_ENTRIES, CQ_ROW, Column, ConsumeQueue, ConsumeQueueStore, QueueKey,
                            decode_entries, encode_entries, fs_name, tag_code)
from .retention import CleanCommitLogService

__all__ = ["CHECKPOINT_VERSION", "CQ_ENTRY", "CQ_FILE_ENTRIES", "CQ_ROW", "HEADER", "PREALLOCATE", "Column",
           "ConsumeQueue", "MessageStore", "QueueKey", "Segment", "decode_entries", "encode_entries", "fs_name",
           "tag_code"]

log = logging.getLogger(__name__)


class MessageStore(CommitLog, ConsumeQueueStore, StoreCheckpoint, CleanCommitLogService):
    """Commit log + consume queues. All methods run on the broker's event loop."""

    def __init__(self, data_dir: Path, segment_size: int = 1 << 30, flush: str = "async",
                 flush_interval_ms: int = 500, retention_bytes: int | None = None,
                 retention_ms: int | None = None, clean_interval_ms: int = 10_000,
                 cq_file_entries: int = CQ_FILE_ENTRIES):
        self.data_dir = Path(data_dir)
        self._init_commit_log(segment_size, flush, flush_interval_ms)   # creates the data dir
        self._init_consume_queues(cq_file_entries)
        self._init_checkpoint()
        self._init_retention(retention_bytes, retention_ms, clean_interval_ms)
        self.recovery: dict = {}    # how the last recover() went (tests, logs)

    # ---------------------------------------------------------------- recovery

    def recover(self, accept=None) -> int:
        """Map the segments, find the end of valid data and rebuild the consume queues: from
        the consume-queue files and the commit log after their checkpoint, or (no usable
        checkpoint) by a scan of the whole log.

        ``accept(topic, broker, phys)`` may reject records (e.g. of a deleted topic).
        Returns the number of messages in the consume queues.
        """
        files = sorted(p for p in self.dir.iterdir() if p.name.isdigit())
        for p in files:
            self.segments.append(Segment(p, int(p.name), self.segment_size))
        self._load_min_offsets(accept)
        started = time.perf_counter()
        try:
            start, loaded = self._load_checkpoint(accept)
            reason = None
        except _NoCheckpoint as e:
            start, loaded, reason = 0, 0, str(e)
            if self.segments:
                log.warning("consume queues: %s; rebuilding them by a full scan of the commit log", reason)
            self._discard_cq_files()
        scanned = self._scan_log(start, accept)
        if self.segments:
            last = self.segments[-1]
            tail = self.write_pos - last.base
            # Zero the torn tail so a later scan stops exactly here.
            if tail < last.size:
                os.pwrite(last.fd, b"\0" * min(4096, last.size - tail), tail)
                os.fsync(last.fd)
        self.flushed_pos = self.write_pos
        self._flushed_last = self._last_record
        self.checkpoint_pos = min(start, self.write_pos)
        total = sum(len(cq.phys_a) for cq in self.queues.values())
        self.recovery = {"mode": "full" if reason else "checkpoint", "reason": reason, "scan_from": start,
                         "scanned": scanned, "loaded": loaded, "seconds": time.perf_counter() - started}
        log.info("store recovery (%s): %d entries from consume-queue files, %d records scanned from %d",
                 self.recovery["mode"], loaded, scanned, start)
        return total

    # ------------------------------------------------------------------ lifecycle

    def start(self):
        loop = asyncio.get_running_loop()
        self._flush_wakeup = asyncio.Event()
        self._flusher = loop.create_task(self._flush_loop())
        self._checkpointer = loop.create_task(self._checkpoint_loop())
        if self.retention_bytes is not None or self.retention_ms is not None:
            self._clean_wakeup = asyncio.Event()
            self._cleaner = loop.create_task(self._clean_loop())

    def flush_now(self):
        """fsync the commit log, then write the consume-queue files and checkpoint (blocking)."""
        self.write_unwritten()
        for s in self.segments:
            os.fsync(s.fd)
        self.flushed_pos = self.write_pos
        self._flushed_last = self._last_record
        self.write_checkpoint(self.checkpoint_snapshot())

    def close(self):
        for task in (self._flusher, self._cleaner, self._checkpointer):
            if task:
                task.cancel()
        try:
            self.flush_now()
        except OSError:
            # The commit log is what matters; without a checkpoint a restart scans it all.
            log.exception("flush at close failed")
        for s in self.segments:
            s.close()
