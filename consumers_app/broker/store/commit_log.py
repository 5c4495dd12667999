"""The commit log (RocketMQ's CommitLog and its flush service): every message, appended.

Layout on disk: ``DATA/commitlog/<20-digit base offset>``, each segment a fixed-size file
(sparse until written) mapped read-only with mmap. A record is ``[u32 payload size][u32
crc32(payload)][payload]`` where the payload is a serialized ``rebalancelab.v1.LabMessage``
already carrying its queue, queue offset and store time, so a record is self-describing:
the commit log alone can rebuild every consume queue (the full scan, the fallback).

A zero size marks the end of a segment's data: a record that does not fit in the current
segment rolls to a new one, leaving zeros behind. Recovery stops at the first torn record
(short, zero, or bad crc) of the last segment and truncates there.

Flush: async mode fsyncs every flush interval; sync mode is a group commit that sends wait
for (``wait_flushed``). Appending also indexes each record in its consume queue: the send
fast path is one loop.
"""
from __future__ import annotations

import asyncio
import logging
import mmap
import os
import struct
import time
import zlib
from pathlib import Path

from ...protocol import lab
from .consume_queue import QueueKey, tag_code

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")

PREALLOCATE = 32 << 20


class Segment:
    def __init__(self, path: Path, base: int, size: int):
        self.path = path
        self.base = base
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        existing = os.fstat(self.fd).st_size
        # A segment written with a larger --segment-size keeps its own size.
        self.size = size = max(size, existing)
        if existing < size:
            os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
        self.allocated = 0

    def reserve(self, end: int):
        """Allocate disk blocks ahead of the writes (as RocketMQ warms its mapped files):
        writing into a sparse hole costs ~15x more than into allocated blocks."""
        if end > self.allocated:
            new = min(self.size, max(end, self.allocated + PREALLOCATE))
            try:
                os.posix_fallocate(self.fd, self.allocated, new - self.allocated)
            except OSError:  # filesystems without fallocate: sparse writes still work
                pass
            self.allocated = new

    def mtime(self) -> float:
        """When the segment was last written (RocketMQ ages a file by its lastModified)."""
        return os.fstat(self.fd).st_mtime

    def close(self) -> bool:
        """Unmap and close; False when the map is still exported (a live memoryview) and
        stays mapped - then the file must not be unlinked yet (it would linger as deleted)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.map.close()
        except BufferError:
            return False
        return True


class CommitLog:
    """The MessageStore's commit log: segments, appends, reads and the flush service (part
    of MessageStore; see its __init__)."""

    def _init_commit_log(self, segment_size: int, flush: str, flush_interval_ms: int):
        self.dir = self.data_dir / "commitlog"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size
        self.sync_flush = flush == "sync"
        self.flush_interval = flush_interval_ms / 1000
        self.segments: list[Segment] = []
        self.write_pos = 0          # physical offset of the next record
        self.flushed_pos = 0        # everything below is on disk (fsynced)
        self._last_record: tuple[int, int] | None = None   # (phys, size) of the newest record
        self._flushed_last: tuple[int, int] | None = None  # ... of the one ending at flushed_pos
        self._refs: dict[QueueKey, lab.QueueRef] = {}  # prebuilt QueueRef per queue
        self._flush_waiters: list[tuple[int, asyncio.Future]] = []
        self._flush_wakeup: asyncio.Event | None = None
        self._flusher: asyncio.Task | None = None
        self.on_append = None  # callback(set of QueueKey) for long polling
        # Records appended with defer_write, not in the file yet: they end at write_pos, in
        # the last segment, and start at _unwritten_from (see append).
        self._unwritten: list[bytes] = []
        self._unwritten_from = 0
        self._write_soon = False   # a write at the end of this turn of the loop is scheduled

    def _scan_log(self, start: int, accept) -> int:
        """Index the records from commit-log offset ``start`` (a record boundary) to the end of
        valid data, which becomes ``write_pos``. Returns the records read."""
        scanned = 0
        end = start
        for seg in self.segments:
            if seg.base + seg.size <= start:
                continue
            pos = max(0, start - seg.base)
            m = seg.map
            while pos + HEADER.size <= seg.size:
                size, crc = HEADER.unpack_from(m, pos)
                if size == 0 or pos + HEADER.size + size > seg.size:
                    break
                payload = m[pos + HEADER.size: pos + HEADER.size + size]
                if zlib.crc32(payload) != crc:
                    log.warning("commit log: torn record at %d, truncating", seg.base + pos)
                    break
                msg = lab.LabMessage.FromString(payload)
                phys = seg.base + pos
                self._last_record = (phys, size)
                scanned += 1
                q = msg.queue
                if accept is None or accept(q.topic, q.broker_name, phys):
                    cq = self._cq((q.topic, q.broker_name, q.queue_id), phys)
                    # Offsets are dense; a record whose offset is not the next one
                    # belongs to a deleted/re-created queue generation (or lies below a
                    # min offset saved by retention): skip it.
                    if msg.queue_offset > cq.max_offset and not cq.phys_a:
                        # The queue's first record in the kept log, its older ones deleted
                        # by retention and no saved min offset says so: it starts here.
                        cq.base = msg.queue_offset
                    if msg.queue_offset == cq.max_offset:
                        cq.add(phys, size, msg.store_ts, tag_code(msg.tag))
                pos += HEADER.size + size
            end = seg.base + pos
        self.write_pos = end
        return scanned

    # ------------------------------------------------------------------ append

    def _segment_for(self, need: int) -> Segment:
        if need > self.segment_size:
            raise ValueError(f"record of {need} bytes exceeds the segment size {self.segment_size}")
        seg = self.segments[-1] if self.segments else None
        if seg is None or self.write_pos + need > seg.base + seg.size:
            base = self.write_pos if seg is None else seg.base + seg.size
            seg = Segment(self.dir / f"{base:020d}", base, self.segment_size)
            self.segments.append(seg)
            self.write_pos = base
        return seg

    def append(self, items: list[tuple[QueueKey, "lab.LabMessage"]],
               defer_write: bool = False) -> list[tuple[int, int]]:
        """Append messages; fills in queue, queue offset and store time. Returns (queue offset, phys).

        This is the send fast path: records of one call that land in the same segment are
        written with one pwrite, and per-message work is kept to a few C calls.

        ``defer_write``: the records go to the file with the next write (of any append), at
        the end of this turn of the event loop, or before anything reads them - so the
        sends that one read of a remoting socket brings are one pwrite, not one each. The
        caller must not acknowledge them before ``write_unwritten()`` (a remoting answer
        leaves after it: broker.remoting.server.Connection).
        """
        now = int(time.time() * 1000)
        results = []
        seg = self.segments[-1] if self.segments else None
        seg_end = seg.base + seg.size if seg else -1
        chunk = self._unwritten   # the records still unwritten end at write_pos: go on from them
        chunk_start = self._unwritten_from if chunk else self.write_pos
        pos = self.write_pos
        touched = set()
        refs = self._refs
        pack, crc32, hsize = HEADER.pack, zlib.crc32, HEADER.size
        for key, msg in items:
            cq = self.queues.get(key)
            if cq is None:
                cq = self._cq(key, pos)
            ref = refs.get(key)
            if ref is None:
                ref = refs[key] = lab.QueueRef(topic=key[0], broker_name=key[1], queue_id=key[2])
            msg.queue.CopyFrom(ref)
            offset = cq.base + len(cq.phys_a)
            msg.queue_offset = offset
            msg.store_ts = now
            payload = msg.SerializeToString()
            size = len(payload)
            if pos + hsize + size > seg_end:
                # Roll to a new segment (the rest of the old one stays zero = end of data).
                if chunk:
                    seg.reserve(pos - seg.base)
                    os.pwrite(seg.fd, b"".join(chunk), chunk_start - seg.base)
                    chunk = self._unwritten = []
                self.write_pos = pos
                seg = self._segment_for(hsize + size)
                seg_end = seg.base + seg.size
                self._wake_cleaner_if_over()
                pos = chunk_start = self.write_pos
            chunk.append(pack(size, crc32(payload)))
            chunk.append(payload)
            cq.phys_a.append(pos)
            cq.size_a.append(size)
            cq.ts_a.append(now)
            cq.tags_a.append(tag_code(msg.tag))
            results.append((offset, pos))
            pos += hsize + size
            touched.add(key)
        if results:
            self._last_record = (results[-1][1], size)  # the checkpoint's proof that P is a boundary
        self.write_pos = pos
        if chunk and defer_write:
            self._unwritten, self._unwritten_from = chunk, chunk_start
            if not self._write_soon:
                self._write_soon = True
                asyncio.get_running_loop().call_soon(self._write_at_end_of_turn)
        elif chunk:
            seg.reserve(pos - seg.base)
            os.pwrite(seg.fd, b"".join(chunk), chunk_start - seg.base)
            self._unwritten = []
        if self.on_append is not None and touched:
            self.on_append(touched)
        return results

    def _write_at_end_of_turn(self) -> None:
        self._write_soon = False
        self.write_unwritten()

    def write_unwritten(self) -> None:
        """Write the records appended with ``defer_write`` (one pwrite; nothing if none)."""
        chunk, self._unwritten = self._unwritten, []
        if chunk:
            seg = self.segments[-1]
            seg.reserve(self.write_pos - seg.base)
            os.pwrite(seg.fd, b"".join(chunk), self._unwritten_from - seg.base)

    # -------------------------------------------------------------------- read

    def read_phys(self, phys: int, size: int) -> bytes:
        if self._unwritten and phys + HEADER.size + size > self._unwritten_from:
            self.write_unwritten()
        # Bodies are never cached in RAM: a slice of the mapped segment is a memcpy
        # from the page cache. Segments are few; look from the end (reads are mostly recent).
        for seg in reversed(self.segments):
            if seg.base <= phys:
                start = phys - seg.base + HEADER.size
                return seg.map[start:start + size]
        raise KeyError(phys)

    def read(self, key: QueueKey, offset: int) -> bytes | None:
        cq = self.queues.get(key)
        if cq is None or offset < cq.base or offset >= cq.max_offset:
            return None
        i = offset - cq.base
        return self.read_phys(cq.phys_a[i], cq.size_a[i])

    def read_at(self, phys: int) -> "lab.LabMessage | None":
        """The message whose record starts at commit-log offset ``phys`` (remoting names a
        message by it), or None when no intact record starts there."""
        if not 0 <= phys < self.write_pos:
            return None
        return self._record_at(phys)

    def _record_at(self, phys: int, expect_size: int | None = None) -> "lab.LabMessage | None":
        if self._unwritten:
            self.write_unwritten()
        for seg in reversed(self.segments):
            if seg.base <= phys:
                start = phys - seg.base
                if start + HEADER.size > seg.size:
                    return None
                size, crc = HEADER.unpack_from(seg.map, start)
                if expect_size is not None and size != expect_size:
                    return None
                payload = seg.map[start + HEADER.size:start + HEADER.size + size]
                if size == 0 or len(payload) != size or zlib.crc32(payload) != crc:
                    return None
                try:
                    return lab.LabMessage.FromString(payload)
                except Exception:  # noqa: BLE001 - not a record boundary after all
                    return None
        return None

    def read_message(self, key: QueueKey, offset: int) -> "lab.LabMessage | None":
        raw = self.read(key, offset)
        return None if raw is None else lab.LabMessage.FromString(raw)

    def scan(self, key: QueueKey, offset: int, max_count: int, tag_codes: set | None,
             max_bytes: int = 32 << 20):
        """Read up to ``max_count`` payloads from ``offset`` whose tag hash matches.

        Returns (list of (queue offset, payload), next offset to read).
        Non-matching entries are skipped over (their offsets consumed), as the
        broker's tag filter does on the consume queue.
        """
        cq = self.queues.get(key)
        out = []
        if cq is None:
            return out, offset
        base = cq.base
        end = cq.max_offset
        off = max(offset, base)
        total = 0
        # Bound the filter scan so one pull never walks a huge unmatched backlog.
        limit = off + max(max_count * 64, 4096)
        phys, sizes, tags = cq.phys_a, cq.size_a, cq.tags_a
        while off < end and len(out) < max_count and off < limit:
            i = off - base
            if tag_codes is None or tags[i] in tag_codes:
                size = sizes[i]
                if out and total + size > max_bytes:
                    break
                out.append((off, self.read_phys(phys[i], size)))
                total += size
            off += 1
        return out, off

    # ------------------------------------------------------------------- flush

    async def _flush_loop(self):
        """Async mode: fsync every flush interval. Sync mode: group commit on demand."""
        while True:
            if self.sync_flush:
                await self._flush_wakeup.wait()
                self._flush_wakeup.clear()
            else:
                try:
                    await asyncio.wait_for(self._flush_wakeup.wait(), self.flush_interval)
                except asyncio.TimeoutError:
                    pass
                self._flush_wakeup.clear()
            await self.flush()

    async def flush(self):
        self.write_unwritten()
        target = self.write_pos
        last = self._last_record
        if target > self.flushed_pos:
            fds = [s.fd for s in self.segments if s.base + s.size > self.flushed_pos and s.base < target]
            # fdatasync blocks; keep the event loop serving meanwhile.
            await asyncio.to_thread(lambda: [os.fdatasync(fd) for fd in fds])
            if target > self.flushed_pos:
                self.flushed_pos = target
                self._flushed_last = last
            self._wake_cleaner_if_over()  # segments retention waited for are fsynced now
        still = []
        for pos, fut in self._flush_waiters:
            if pos <= self.flushed_pos:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((pos, fut))
        self._flush_waiters = still
        if still:
            self._flush_wakeup.set()

    async def wait_flushed(self, pos: int | None = None):
        """In sync mode, return once everything appended so far is fsynced."""
        if not self.sync_flush:
            return
        pos = self.write_pos if pos is None else pos
        if pos <= self.flushed_pos:
            return
        fut = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((pos, fut))
        self._flush_wakeup.set()
        await fut

    def log_bytes(self) -> int:
        """Commit-log size as retention counts it: whole segment files (a segment's full
        size is reserved on disk whether or not it is written to the end)."""
        return sum(s.size for s in self.segments)

    @property
    def min_phys(self) -> int:
        """Commit-log offset of the oldest byte still stored (RocketMQ's getMinPhyOffset)."""
        return self.segments[0].base if self.segments else self.write_pos
