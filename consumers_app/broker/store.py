"""Message store: an append-only commit log in segment files plus in-memory consume queues.

Layout on disk (as RocketMQ's CommitLog): ``DATA/commitlog/<20-digit base offset>``,
each segment a fixed-size file (sparse until written) mapped read-only with mmap.
A record is ``[u32 payload size][u32 crc32(payload)][payload]`` where the payload is
a serialized ``rebalancelab.v1.LabMessage`` already carrying its queue, queue offset
and store time, so a record is self-describing and the consume queues can be
rebuilt by one scan of the log at start-up (RocketMQ keeps consume-queue files;
we rebuild instead - simpler, and start-up stays fast for a lab-sized log).

A zero size marks the end of a segment's data: a record that does not fit in the
current segment rolls to a new one, leaving zeros behind. Recovery stops at the
first torn record (short, zero, or bad crc) of the last segment and truncates there.

The consume queue of (topic, broker, queue id) is a set of parallel ``array``s:
physical offset, size, store time and tag hash per queue offset, so reading offset
N is O(1); bodies stay in the mapped segment files (the OS page cache), not in our heap.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import mmap
import os
import struct
import time
import zlib
from array import array
from pathlib import Path

from ..javastr import java_hash
from ..protocol import lab

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
QueueKey = tuple  # (topic, broker_name, queue_id)


_TAG_CODES: dict[str, int] = {}


def tag_code(tag: str) -> int:
    """The consume-queue tag hash RocketMQ stores (String.hashCode of the tag), memoized:
    tags repeat, and the hash is computed in Python."""
    code = _TAG_CODES.get(tag)
    if code is None:
        code = java_hash(tag) if tag else 0
        if len(_TAG_CODES) < 100_000:
            _TAG_CODES[tag] = code
    return code


class ConsumeQueue:
    """Per-queue index: queue offset -> (physical offset, size, store ts, tag hash)."""

    __slots__ = ("phys", "size", "store_ts", "tags", "min_offset")

    def __init__(self):
        self.phys = array("q")
        self.size = array("i")
        self.store_ts = array("q")
        self.tags = array("q")
        self.min_offset = 0

    @property
    def max_offset(self) -> int:
        """Next offset to be written (RocketMQ's maxOffset)."""
        return len(self.phys)

    def add(self, phys: int, size: int, ts: int, tag: int) -> int:
        self.phys.append(phys)
        self.size.append(size)
        self.store_ts.append(ts)
        self.tags.append(tag)
        return len(self.phys) - 1

    def offset_for_time(self, ts: int) -> int:
        """First offset stored at or after ``ts`` (max offset if none)."""
        return max(self.min_offset, bisect.bisect_left(self.store_ts, ts))


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

    def close(self):
        try:
            self.map.close()
        except BufferError:  # a memoryview still alive; the OS reclaims it at exit
            pass
        os.close(self.fd)


class MessageStore:
    """Commit log + consume queues. All methods run on the broker's event loop."""

    def __init__(self, data_dir: Path, segment_size: int = 1 << 30, flush: str = "async",
                 flush_interval_ms: int = 500):
        self.dir = Path(data_dir) / "commitlog"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size
        self.sync_flush = flush == "sync"
        self.flush_interval = flush_interval_ms / 1000
        self.segments: list[Segment] = []
        self.write_pos = 0          # physical offset of the next record
        self.flushed_pos = 0        # everything below is on disk (fsynced)
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        self._refs: dict[QueueKey, lab.QueueRef] = {}  # prebuilt QueueRef per queue
        self._flush_waiters: list[tuple[int, asyncio.Future]] = []
        self._flush_wakeup: asyncio.Event | None = None
        self._flusher: asyncio.Task | None = None
        self.on_append = None  # callback(set of QueueKey) for long polling

    # ---------------------------------------------------------------- recovery

    def recover(self, accept=None) -> int:
        """Map the segments, find the end of valid data and rebuild the consume queues.

        ``accept(topic, broker, phys)`` may reject records (e.g. of a deleted topic).
        Returns the number of records indexed.
        """
        files = sorted(p for p in self.dir.iterdir() if p.name.isdigit())
        for p in files:
            self.segments.append(Segment(p, int(p.name), self.segment_size))
        count = 0
        end = 0
        for seg in self.segments:
            pos = 0
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
                q = msg.queue
                if accept is None or accept(q.topic, q.broker_name, phys):
                    cq = self._cq((q.topic, q.broker_name, q.queue_id))
                    # Offsets are dense; a record whose offset is not the next one
                    # belongs to a deleted/re-created queue generation: skip it.
                    if msg.queue_offset == cq.max_offset:
                        cq.add(phys, size, msg.store_ts, tag_code(msg.tag))
                        count += 1
                pos += HEADER.size + size
            end = seg.base + pos
        if self.segments:
            last = self.segments[-1]
            tail = end - last.base
            # Zero the torn tail so a later scan stops exactly here.
            if tail < last.size:
                os.pwrite(last.fd, b"\0" * min(4096, last.size - tail), tail)
                os.fsync(last.fd)
        self.write_pos = end
        self.flushed_pos = end
        return count

    def _cq(self, key: QueueKey) -> ConsumeQueue:
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueue()
        return cq

    def queue(self, key: QueueKey) -> ConsumeQueue | None:
        return self.queues.get(key)

    def drop_queue(self, key: QueueKey):
        self.queues.pop(key, None)

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

    def append(self, items: list[tuple[QueueKey, "lab.LabMessage"]]) -> list[tuple[int, int]]:
        """Append messages; fills in queue, queue offset and store time. Returns (queue offset, phys).

        This is the send fast path: records of one call that land in the same segment are
        written with one pwrite, and per-message work is kept to a few C calls.
        """
        now = int(time.time() * 1000)
        results = []
        chunk: list[bytes] = []
        seg = self.segments[-1] if self.segments else None
        seg_end = seg.base + seg.size if seg else -1
        chunk_start = self.write_pos
        pos = self.write_pos
        touched = set()
        refs = self._refs
        pack, crc32, hsize = HEADER.pack, zlib.crc32, HEADER.size
        for key, msg in items:
            cq = self.queues.get(key)
            if cq is None:
                cq = self._cq(key)
            ref = refs.get(key)
            if ref is None:
                ref = refs[key] = lab.QueueRef(topic=key[0], broker_name=key[1], queue_id=key[2])
            msg.queue.CopyFrom(ref)
            offset = len(cq.phys)
            msg.queue_offset = offset
            msg.store_ts = now
            payload = msg.SerializeToString()
            size = len(payload)
            if pos + hsize + size > seg_end:
                # Roll to a new segment (the rest of the old one stays zero = end of data).
                if chunk:
                    seg.reserve(pos - seg.base)
                    os.pwrite(seg.fd, b"".join(chunk), chunk_start - seg.base)
                    chunk = []
                self.write_pos = pos
                seg = self._segment_for(hsize + size)
                seg_end = seg.base + seg.size
                pos = chunk_start = self.write_pos
            chunk.append(pack(size, crc32(payload)))
            chunk.append(payload)
            cq.phys.append(pos)
            cq.size.append(size)
            cq.store_ts.append(now)
            cq.tags.append(tag_code(msg.tag))
            results.append((offset, pos))
            pos += hsize + size
            touched.add(key)
        if chunk:
            seg.reserve(pos - seg.base)
            os.pwrite(seg.fd, b"".join(chunk), chunk_start - seg.base)
        self.write_pos = pos
        if self.on_append is not None and touched:
            self.on_append(touched)
        return results

    # -------------------------------------------------------------------- read

    def read_phys(self, phys: int, size: int) -> bytes:
        # Bodies are never cached in RAM: a slice of the mapped segment is a memcpy
        # from the page cache. Segments are few; look from the end (reads are mostly recent).
        for seg in reversed(self.segments):
            if seg.base <= phys:
                start = phys - seg.base + HEADER.size
                return seg.map[start:start + size]
        raise KeyError(phys)

    def read(self, key: QueueKey, offset: int) -> bytes | None:
        cq = self.queues.get(key)
        if cq is None or offset < cq.min_offset or offset >= cq.max_offset:
            return None
        return self.read_phys(cq.phys[offset], cq.size[offset])

    def read_at(self, phys: int) -> "lab.LabMessage | None":
        """The message whose record starts at commit-log offset ``phys`` (remoting names a
        message by it), or None when no intact record starts there."""
        if not 0 <= phys < self.write_pos:
            return None
        for seg in reversed(self.segments):
            if seg.base <= phys:
                start = phys - seg.base
                if start + HEADER.size > seg.size:
                    return None
                size, crc = HEADER.unpack_from(seg.map, start)
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
        end = cq.max_offset
        off = max(offset, cq.min_offset)
        total = 0
        # Bound the filter scan so one pull never walks a huge unmatched backlog.
        limit = off + max(max_count * 64, 4096)
        phys, sizes, tags = cq.phys, cq.size, cq.tags
        while off < end and len(out) < max_count and off < limit:
            if tag_codes is None or tags[off] in tag_codes:
                size = sizes[off]
                if out and total + size > max_bytes:
                    break
                out.append((off, self.read_phys(phys[off], size)))
                total += size
            off += 1
        return out, off

    # ------------------------------------------------------------------- flush

    def start(self):
        self._flush_wakeup = asyncio.Event()
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

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
        target = self.write_pos
        if target > self.flushed_pos:
            fds = [s.fd for s in self.segments if s.base + s.size > self.flushed_pos and s.base < target]
            # fdatasync blocks; keep the event loop serving meanwhile.
            await asyncio.to_thread(lambda: [os.fdatasync(fd) for fd in fds])
            self.flushed_pos = max(self.flushed_pos, target)
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

    def flush_now(self):
        for s in self.segments:
            os.fsync(s.fd)
        self.flushed_pos = self.write_pos

    def close(self):
        if self._flusher:
            self._flusher.cancel()
        self.flush_now()
        for s in self.segments:
            s.close()
