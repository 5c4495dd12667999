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

Retention (RocketMQ's CleanCommitLogService): every ``clean_interval_ms`` whole segments
are deleted oldest first, never the one being written, while the commit log is larger
than ``retention_bytes`` (our stand-in for diskMaxUsedSpaceRatio) or the segment was last
modified more than ``retention_ms`` ago (fileReservedTime), whatever consumers still need.
The consume queues then start at the first entry still in the log: their min offsets
move and pulls below them are corrected, as RocketMQ's. Each queue's min offset is saved
in ``DATA/consumequeue/min_offsets.json`` before the files go, so a restart continues the
queue offsets even of queues whose every message was deleted.
"""
from __future__ import annotations

import asyncio
import bisect
import json
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


class Column:
    """One consume-queue column indexed by queue offset, whatever retention cut off in front
    (``cq.phys[offset]`` keeps working for code that indexes the queue directly);
    negative indexes count from the end, as a list's."""

    __slots__ = ("_cq", "_a")

    def __init__(self, cq: "ConsumeQueue", a: array):
        self._cq = cq
        self._a = a

    def __getitem__(self, offset: int):
        if offset < 0:
            return self._a[offset]
        i = offset - self._cq.base
        if i < 0:
            raise IndexError(f"queue offset {offset} is below the min offset {self._cq.base}")
        return self._a[i]

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return iter(self._a)


class ConsumeQueue:
    """Per-queue index: queue offset -> (physical offset, size, store ts, tag hash).

    The arrays hold offsets ``base`` .. ``max_offset - 1``; ``base`` is the min offset
    (0 until retention deletes the segments holding the queue's oldest messages).
    """

    __slots__ = ("base", "phys_a", "size_a", "ts_a", "tags_a", "phys", "size", "store_ts", "tags")

    def __init__(self, base: int = 0):
        self.base = base
        self.phys_a = array("q")
        self.size_a = array("i")
        self.ts_a = array("q")
        self.tags_a = array("q")
        self.phys = Column(self, self.phys_a)
        self.size = Column(self, self.size_a)
        self.store_ts = Column(self, self.ts_a)
        self.tags = Column(self, self.tags_a)

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """Next offset to be written (RocketMQ's maxOffset)."""
        return self.base + len(self.phys_a)

    def add(self, phys: int, size: int, ts: int, tag: int) -> int:
        self.phys_a.append(phys)
        self.size_a.append(size)
        self.ts_a.append(ts)
        self.tags_a.append(tag)
        return self.base + len(self.phys_a) - 1

    def offset_for_time(self, ts: int) -> int:
        """First offset stored at or after ``ts`` (max offset if none)."""
        return self.base + bisect.bisect_left(self.ts_a, ts)

    def truncate_before(self, phys: int) -> int:
        """Forget the entries whose record lies below commit-log offset ``phys`` (their
        segment is deleted): the min offset moves up. Returns how many were dropped."""
        n = bisect.bisect_left(self.phys_a, phys)  # records of one queue are in log order
        if n:
            for a in (self.phys_a, self.size_a, self.ts_a, self.tags_a):
                del a[:n]
            self.base += n
        return n


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


class MessageStore:
    """Commit log + consume queues. All methods run on the broker's event loop."""

    def __init__(self, data_dir: Path, segment_size: int = 1 << 30, flush: str = "async",
                 flush_interval_ms: int = 500, retention_bytes: int | None = None,
                 retention_ms: int | None = None, clean_interval_ms: int = 10_000):
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / "commitlog"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.min_offsets_path = self.data_dir / "consumequeue" / "min_offsets.json"
        # None: no bound of that kind (unit tests; the broker always passes both).
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.clean_interval = clean_interval_ms / 1000
        self._cleaner: asyncio.Task | None = None
        self._clean_wakeup: asyncio.Event | None = None
        self._unmapped_later: list[Segment] = []  # deleted from the log, still mapped (see Segment.close)
        self.deleted_segments = 0
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
        self._load_min_offsets(accept)
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
                    # belongs to a deleted/re-created queue generation (or lies below a
                    # min offset saved by retention): skip it.
                    if msg.queue_offset > cq.max_offset and not cq.phys_a:
                        # The queue's first record in the kept log, its older ones deleted
                        # by retention and no saved min offset says so: it starts here.
                        cq.base = msg.queue_offset
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
                self.queues[(topic, broker, qid)] = ConsumeQueue(offset)

    def _save_min_offsets(self, commitlog_min: int, rows: list):
        self.min_offsets_path.parent.mkdir(exist_ok=True)
        tmp = self.min_offsets_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"commitlog_min": commitlog_min, "queues": rows}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.min_offsets_path)

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
                    chunk = []
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
        if cq is None or offset < cq.base or offset >= cq.max_offset:
            return None
        i = offset - cq.base
        return self.read_phys(cq.phys_a[i], cq.size_a[i])

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

    def start(self):
        loop = asyncio.get_running_loop()
        self._flush_wakeup = asyncio.Event()
        self._flusher = loop.create_task(self._flush_loop())
        if self.retention_bytes is not None or self.retention_ms is not None:
            self._clean_wakeup = asyncio.Event()
            self._cleaner = loop.create_task(self._clean_loop())

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

    def flush_now(self):
        for s in self.segments:
            os.fsync(s.fd)
        self.flushed_pos = self.write_pos

    def close(self):
        if self._flusher:
            self._flusher.cancel()
        if self._cleaner:
            self._cleaner.cancel()
        self.flush_now()
        for s in self.segments:
            s.close()

    # --------------------------------------------------------------- retention

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
                if deletion.paths or deletion.min_offsets is not None:
                    # fsync and freeing a big file's blocks take a while: off the event loop.
                    # Safe: the segments are already out of the log, unmapped and closed.
                    await asyncio.to_thread(self._finish, deletion)
            except OSError:
                log.exception("commit log retention failed")

    def _wake_cleaner_if_over(self):
        if self._clean_wakeup is not None and self.retention_bytes is not None and \
                self.log_bytes() > self.retention_bytes + self.segment_size:
            self._clean_wakeup.set()

    def log_bytes(self) -> int:
        """Commit-log size as retention counts it: whole segment files (a segment's full
        size is reserved on disk whether or not it is written to the end)."""
        return sum(s.size for s in self.segments)

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
        for cq in self.queues.values():
            cq.truncate_before(deletion.commitlog_min)
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

    def _retry_unmapped(self) -> list[Path]:
        """Deleted segments whose map could not be closed before: unlink them once it can."""
        paths, still = [], []
        for seg in self._unmapped_later:
            (paths if seg.close() else still).append(seg)
        self._unmapped_later = still
        return [seg.path for seg in paths]

    @property
    def min_phys(self) -> int:
        """Commit-log offset of the oldest byte still stored (RocketMQ's getMinPhyOffset)."""
        return self.segments[0].base if self.segments else self.write_pos

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
    __slots__ = ("paths", "commitlog_min", "min_offsets")

    def __init__(self, paths: list[Path]):
        self.paths = paths              # closed segment files to unlink
        self.commitlog_min = 0
        self.min_offsets = None         # [[topic, broker, qid, min offset], ...] to save, if any
