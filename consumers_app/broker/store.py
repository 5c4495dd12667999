"""Message store: an append-only commit log in segment files plus in-memory consume queues.

Layout on disk (as RocketMQ's CommitLog): ``DATA/commitlog/<20-digit base offset>``,
each segment a fixed-size file (sparse until written) mapped read-only with mmap.
A record is ``[u32 payload size][u32 crc32(payload)][payload]`` where the payload is
a serialized ``rebalancelab.v1.LabMessage`` already carrying its queue, queue offset
and store time, so a record is self-describing: the commit log alone can rebuild
every consume queue (the full scan, the fallback).

A zero size marks the end of a segment's data: a record that does not fit in the
current segment rolls to a new one, leaving zeros behind. Recovery stops at the
first torn record (short, zero, or bad crc) of the last segment and truncates there.

The consume queue of (topic, broker, queue id) is a set of parallel ``array``s:
physical offset, size, store time and tag hash per queue offset, so reading offset
N is O(1); bodies stay in the mapped segment files (the OS page cache), not in our heap.

Consume-queue files and the checkpoint (RocketMQ's ConsumeQueue files + StoreCheckpoint), so
a restart need not parse the whole log: each queue is also written to
``DATA/consumequeue/<topic>/<broker>/<queue id>/<20-digit first queue offset>``, files of
``cq_file_entries`` fixed-size entries (``CQ_ENTRY``: little-endian phys int64, size int32,
store ts int64, tag hash int64; entry N of a queue is at byte (N - file base) * 28).
Every flush interval the entries appended since the last time are written and fsynced (after
the commit log below them), then ``consumequeue/checkpoint`` is replaced atomically: the
commit-log offset P they cover plus each queue's (born, min, max offset) at P. Start-up
loads the files up to those max offsets, checks them against the log, and scans the commit
log only from P (the tail written since, torn records handled as in the full scan). A
missing, corrupt or inconsistent checkpoint falls back to the full scan, which rewrites the
files. Sends never wait for this: the log stays the only thing an acknowledgement needs.

Retention (RocketMQ's CleanCommitLogService): every ``clean_interval_ms`` whole segments
are deleted oldest first, never the one being written, while the commit log is larger
than ``retention_bytes`` (our stand-in for diskMaxUsedSpaceRatio) or the segment was last
modified more than ``retention_ms`` ago (fileReservedTime), whatever consumers still need.
The consume queues then start at the first entry still in the log: their min offsets
move and pulls below them are corrected, as RocketMQ's. Each queue's min offset is saved
in ``DATA/consumequeue/min_offsets.json`` before the files go, so a restart continues the
queue offsets even of queues whose every message was deleted. Consume-queue files whose
entries all lie in deleted segments go after them (the last one of a queue always stays).
"""
from __future__ import annotations

import asyncio
import bisect
import json
import logging
import mmap
import os
import shutil
import struct
import sys
import threading
import time
import zlib
from array import array
from pathlib import Path

from ..atomic import write_bytes, write_json
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


# ------------------------------------------------------------ consume-queue files

CQ_ENTRY = 28                     # bytes per entry: <q phys><i size><q store ts><q tag hash>
CQ_ROW = struct.Struct("<qiqq")
CQ_FILE_ENTRIES = 300_000         # entries per file, as RocketMQ's mappedFileSizeConsumeQueue
CHECKPOINT_VERSION = 1
_LITTLE = sys.byteorder == "little"
_FS_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_@")


def fs_name(name: str) -> str:
    """A topic or broker name as one path component: other characters (``%``, ``|``, ``/``,
    ``.``) as %XX of their UTF-8 bytes, so ``..`` or ``a/b`` never leave the directory and
    two names never share one."""
    return "".join(c if c in _FS_SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def encode_entries(phys: array, size: array, ts: array, tags: array) -> bytes:
    """Interleave the four columns into CQ_ENTRY rows. No numpy: strided slice assignment of
    int32 words (an int64 is two of them) runs in C, ~0.1 s per million entries."""
    n = len(phys)
    if not _LITTLE:  # the files are little-endian; word tricks would need swapping too
        return b"".join(CQ_ROW.pack(*row) for row in zip(phys, size, ts, tags))
    w = array("i", [0]) * (7 * n)
    w[2::7] = size
    for col, at in ((phys, 0), (ts, 3), (tags, 5)):
        c = array("i")
        c.frombytes(memoryview(col).cast("B"))
        w[at::7] = c[0::2]
        w[at + 1::7] = c[1::2]
    return w.tobytes()


def decode_entries(buf) -> tuple[array, array, array, array]:
    """CQ_ENTRY rows -> (phys, size, store ts, tag hash) arrays (the inverse of encode_entries)."""
    n = len(buf) // CQ_ENTRY
    if not _LITTLE:
        cols = (array("q"), array("i"), array("q"), array("q"))
        for row in CQ_ROW.iter_unpack(bytes(buf[:n * CQ_ENTRY])):
            for c, v in zip(cols, row):
                c.append(v)
        return cols
    w = array("i")
    w.frombytes(buf[:n * CQ_ENTRY])

    def wide(at: int) -> array:
        c = array("i", [0]) * (2 * n)
        c[0::2] = w[at::7]
        c[1::2] = w[at + 1::7]
        q = array("q")
        q.frombytes(memoryview(c).cast("B"))
        return q

    return wide(0), w[2::7], wide(3), wide(5)


def _pwrite_all(fd: int, data, offset: int):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _read_into(path: Path, view: memoryview) -> int:
    """Fill ``view`` from the start of the file; returns the bytes read (less at EOF)."""
    got = 0
    with open(path, "rb", buffering=0) as f:
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    return got


def _fsync_dir(path: Path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    __slots__ = ("base", "born", "phys_a", "size_a", "ts_a", "tags_a", "phys", "size", "store_ts", "tags")

    def __init__(self, base: int = 0, born: int = 0):
        self.base = base
        # Commit-log position this queue's incarnation began at: a checkpointed queue is
        # accepted on restart as its records would be (a topic deleted and re-created since
        # is a new queue; its old files are dropped).
        self.born = born
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
                 retention_ms: int | None = None, clean_interval_ms: int = 10_000,
                 cq_file_entries: int = CQ_FILE_ENTRIES):
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / "commitlog"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cq_dir = self.data_dir / "consumequeue"
        self.cq_dir.mkdir(exist_ok=True)
        self.min_offsets_path = self.cq_dir / "min_offsets.json"
        self.checkpoint_path = self.cq_dir / "checkpoint"
        self.cq_file_entries = cq_file_entries
        # Consume-queue files: what is on disk per queue (written by one thread at a time,
        # under the lock; the event loop only reads it to build the next snapshot).
        self._cq_files: dict[QueueKey, _CQFiles] = {}
        self._cq_lock = threading.Lock()
        self._ckpt_seq = 0          # snapshots taken
        self._ckpt_written = 0      # the newest snapshot written (an older one never overwrites it)
        self.checkpoint_pos = 0     # commit-log offset the checkpoint on disk covers
        self._checkpointer: asyncio.Task | None = None
        self._last_record: tuple[int, int] | None = None   # (phys, size) of the newest record
        self._flushed_last: tuple[int, int] | None = None  # ... of the one ending at flushed_pos
        self.recovery: dict = {}    # how the last recover() went (tests, logs)
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

    # ------------------------------------------------------- consume-queue files

    def cq_path(self, key: QueueKey) -> Path:
        return self.cq_dir / fs_name(key[0]) / fs_name(key[1]) / str(key[2])

    def _cq_dirs(self) -> list[Path]:
        """Every queue directory on disk (topic/broker/queue id)."""
        out = []
        for topic in self.cq_dir.iterdir():
            if topic.is_dir():
                for broker in topic.iterdir():
                    if broker.is_dir():
                        out.extend(q for q in broker.iterdir() if q.is_dir())
        return out

    def _discard_cq_files(self):
        """Before a full scan: the checkpoint goes first (so a crash meanwhile cannot pair it
        with half-rewritten files), then every queue directory; the scan's queues are all
        written afresh by the next checkpoint."""
        self._cq_files.clear()
        try:
            self.checkpoint_path.unlink()
        except FileNotFoundError:
            pass
        for d in self.cq_dir.iterdir():
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)

    def _load_checkpoint(self, accept) -> tuple[int, int]:
        """Load the consume queues the checkpoint describes; returns (commit-log offset to
        scan from, entries loaded). Raises _NoCheckpoint when it cannot be trusted: nothing
        is changed then (the full scan starts from the min offsets alone)."""
        try:
            raw = self.checkpoint_path.read_bytes()
        except FileNotFoundError:
            raise _NoCheckpoint("no checkpoint") from None
        except OSError as e:
            raise _NoCheckpoint(f"checkpoint unreadable ({e})") from None
        body, _, crc = raw.rstrip(b"\n").rpartition(b"\n")
        if not crc.isdigit() or int(crc) != zlib.crc32(body):
            raise _NoCheckpoint("checkpoint corrupt (crc mismatch)")
        try:
            data = json.loads(body)
            if data["version"] != CHECKPOINT_VERSION:
                raise ValueError(f"version {data['version']}")
            pos, last, per_file, rows = data["commitlog"], data["last"], data["file_entries"], data["queues"]
        except (ValueError, KeyError, TypeError) as e:
            raise _NoCheckpoint(f"checkpoint corrupt ({e})") from None
        if per_file != self.cq_file_entries:
            raise _NoCheckpoint(f"consume-queue files of {per_file} entries, configured {self.cq_file_entries}")
        min_phys = self.segments[0].base if self.segments else 0
        log_end = self.segments[-1].base + self.segments[-1].size if self.segments else 0
        if pos > log_end:
            raise _NoCheckpoint(f"checkpoint at {pos} is past the end of the commit log ({log_end})")
        if pos > min_phys:
            # The scan resumes at ``pos``: it must be where a record ends (or a segment
            # starts), never inside one, or the torn-record check would cut the log there.
            if not last or self._record_at(last[0], last[1]) is None:
                raise _NoCheckpoint(f"checkpoint's last record at {last and last[0]} is not in the commit log")
            if last[0] + HEADER.size + last[1] != pos and not any(s.base == pos for s in self.segments):
                raise _NoCheckpoint(f"checkpoint at {pos} is not a record boundary")
        start = max(pos, min_phys)
        loaded: dict[QueueKey, tuple[ConsumeQueue, int | None]] = {}
        fixes = []
        try:
            for topic, broker, qid, born, lo, hi in rows:
                key = (topic, broker, qid)
                if accept is not None and not accept(topic, broker, born):
                    continue  # a deleted (maybe re-created) topic's queue: its files go below
                saved = self.queues.get(key)
                cq, first, fix = self._load_cq(key, born, lo, hi, saved.base if saved else 0, min_phys, start)
                loaded[key] = (cq, first)
                fixes.extend(fix)
        except (OSError, ValueError, TypeError) as e:
            raise _NoCheckpoint(f"consume-queue files unreadable ({e})") from None
        # Trusted: adopt the queues, then tidy the files (entries past the checkpoint, left by
        # a checkpoint that never completed; directories of queues that no longer exist).
        count = 0
        for key, (cq, first) in loaded.items():
            self.queues[key] = cq
            self._cq_files[key] = _CQFiles(cq, first, cq.max_offset)
            count += len(cq.phys_a)
        try:
            for path, size in fixes:
                if size == 0:
                    path.unlink()
                else:
                    os.truncate(path, size)
            keep = {self.cq_path(key) for key in loaded}
            for d in self._cq_dirs():
                if d not in keep:
                    shutil.rmtree(d, ignore_errors=True)
        except OSError:  # only tidying: loads never read past a checkpoint's max offsets
            log.exception("consume queue files: tidying after load failed")
        self._last_record = tuple(last) if last else None
        return start, count

    def _load_cq(self, key, born, lo, hi, saved_min, min_phys, start):
        """One queue's entries ``[lo, hi)`` as the checkpoint describes them, less those whose
        segment retention deleted (or below the min offset it saved). Returns (queue, first
        file base, [(file, size to truncate to)]) or raises _NoCheckpoint."""
        per_file = self.cq_file_entries
        d = self.cq_path(key)
        try:
            bases = sorted(int(n) for n in os.listdir(d) if n.isdigit())
        except FileNotFoundError:
            bases = []
        fix = []   # entries past ``hi`` (a checkpoint that never completed wrote them)
        for b in bases:
            want = max(0, hi - b) * CQ_ENTRY
            p = d / f"{b:020d}"
            if os.stat(p).st_size > want:
                fix.append((p, want))
        bases = [b for b in bases if b < hi]
        cq = ConsumeQueue(max(hi, saved_min), born)
        if lo >= hi or (not bases and saved_min >= hi):
            # Empty at the checkpoint, or every entry deleted by retention since: offsets only.
            return cq, (bases[0] if bases else None), fix
        if not bases:
            raise _NoCheckpoint(f"consume queue {key} has no file")
        first = bases[0]
        if first % per_file:
            raise _NoCheckpoint(f"consume queue {key}: file {first} is not at a file boundary")
        n = max(0, hi - first)
        buf = bytearray(n * CQ_ENTRY)
        view = memoryview(buf)
        for b in bases:
            if b >= hi:
                break
            at = (b - first) * CQ_ENTRY
            # A short or missing file leaves zeros: checked below if they fall in the kept range.
            _read_into(d / f"{b:020d}", view[at:at + min(per_file, hi - b) * CQ_ENTRY])
        phys, size, ts, tags = decode_entries(buf)
        # Entries below the commit log's start (deleted segments; zeros where retention cut
        # a queue before its entries were written) come first: skip them.
        i = max(0, saved_min - first)
        if min_phys > 0:
            i = max(i, bisect.bisect_left(phys, True, key=lambda p: p >= min_phys))
        if first > max(lo, saved_min) and i == 0:
            raise _NoCheckpoint(f"consume queue {key}: entries {lo}..{first} are missing")
        cq.base = first + i
        if i < n:
            for a in (phys, size, ts, tags):
                del a[:i]
            if min(size) <= 0:
                raise _NoCheckpoint(f"consume queue {key}: a hole in entries {cq.base}..{hi}")
            if phys[-1] + HEADER.size + size[-1] > start:
                raise _NoCheckpoint(f"consume queue {key}: entry {hi - 1} lies past the checkpoint")
            # The first and last entries must name records of this queue at those offsets.
            for off, j in ((cq.base, 0), (hi - 1, -1)):
                msg = self._record_at(phys[j], size[j])
                if msg is None or msg.queue_offset != off or \
                        (msg.queue.topic, msg.queue.broker_name, msg.queue.queue_id) != key:
                    raise _NoCheckpoint(f"consume queue {key}: entry {off} does not match the commit log")
            cq.phys_a.extend(phys)
            cq.size_a.extend(size)
            cq.ts_a.extend(ts)
            cq.tags_a.extend(tags)
        else:
            cq.base = max(cq.base, hi)
        return cq, first, fix

    def checkpoint_snapshot(self) -> "_Snapshot | None":
        """On the event loop: what the next checkpoint writes, or None when nothing changed.

        It covers the commit log up to ``flushed_pos`` only - what the flusher already made
        durable, so a checkpoint never points past the log after a power loss and never
        waits for an fsync of its own. The entries below it appended since the last
        checkpoint are copied (the arrays go on growing meanwhile)."""
        target = self.flushed_pos
        files = dict(self._cq_files)   # a thread may write it: copy (atomic under the GIL)
        items, rows = [], []
        for key, cq in self.queues.items():
            st = files.get(key)
            reset = st is None or st.cq is not cq   # new queue, or a new incarnation of one
            start = cq.base if reset else max(st.next, cq.base)
            phys = cq.phys_a
            n = len(phys)
            # A queue's entries are in log order: those below the target are a prefix.
            j = n if not n or phys[-1] < target else bisect.bisect_left(phys, target)
            end = cq.base + j
            if reset or end > start:
                i = start - cq.base
                cols = (phys[i:j], cq.size_a[i:j], cq.ts_a[i:j], cq.tags_a[i:j]) if end > start else None
                items.append((key, cq, reset, start, cols))
            rows.append([*key, cq.born, cq.base, end])
        dropped = [(key, st) for key, st in files.items() if self.queues.get(key) is not st.cq]
        if not items and not dropped and target == self.checkpoint_pos and self._ckpt_seq:
            return None  # (the first one is always written: recovery may have dropped queues)
        self._ckpt_seq += 1
        return _Snapshot(self._ckpt_seq, target, self._flushed_last, items, rows, dropped)

    async def checkpoint(self):
        """Write the consume-queue entries appended (and fsynced in the log) since the last
        checkpoint, then the checkpoint, in a thread."""
        snap = self.checkpoint_snapshot()
        if snap is not None:
            await asyncio.to_thread(self.write_checkpoint, snap)

    def write_checkpoint(self, snap: "_Snapshot | None"):
        """The file half (any thread). Snapshots are applied in the order they were taken: an
        older one that lost the race to the lock is dropped, the newer one already wrote more."""
        if snap is None:
            return
        per_file = self.cq_file_entries
        with self._cq_lock:
            if snap.seq <= self._ckpt_written:
                return
            for key, st in snap.dropped:
                if self._cq_files.get(key) is st:
                    del self._cq_files[key]
                    shutil.rmtree(self.cq_path(key), ignore_errors=True)
            for key, cq, reset, start, cols in snap.items:
                st = self._cq_files.get(key)
                d = self.cq_path(key)
                if reset or st is None or st.cq is not cq:
                    shutil.rmtree(d, ignore_errors=True)
                    st = self._cq_files[key] = _CQFiles(cq, None, start)
                if not cols:
                    continue
                data = memoryview(encode_entries(*cols))
                n = len(cols[0])
                new_dir = not d.is_dir()
                if new_dir:
                    d.mkdir(parents=True, exist_ok=True)
                created = False
                off, done = start, 0
                while done < n:
                    base = off - off % per_file
                    k = min(n - done, base + per_file - off)
                    path = d / f"{base:020d}"
                    created |= not path.exists()
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                    try:
                        _pwrite_all(fd, data[done * CQ_ENTRY:(done + k) * CQ_ENTRY], (off - base) * CQ_ENTRY)
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
                    if st.first is None or base < st.first:
                        st.first = base
                    off += k
                    done += k
                st.next = max(st.next, start + n)
                if created:  # the new file's (and directory's) name must be durable too
                    _fsync_dir(d)
                    if new_dir:
                        _fsync_dir(d.parent)
                        _fsync_dir(d.parent.parent)
                        _fsync_dir(self.cq_dir)
            body = json.dumps({"version": CHECKPOINT_VERSION, "commitlog": snap.target, "last": snap.last,
                               "file_entries": per_file, "queues": snap.rows}, separators=(",", ":")).encode()
            write_bytes(self.checkpoint_path, body + b"\n" + str(zlib.crc32(body)).encode() + b"\n")
            _fsync_dir(self.cq_dir)
            self._ckpt_written = snap.seq
            self.checkpoint_pos = snap.target

    def _delete_cq_files(self, cuts):
        """After retention deleted segments: the files whose entries are all below a queue's
        new min offset go, except the last one written (it keeps the queue's max offset)."""
        per_file = self.cq_file_entries
        with self._cq_lock:
            for key, cq, base in cuts:
                st = self._cq_files.get(key)
                if st is None or st.cq is not cq or st.first is None:
                    continue
                d = self.cq_path(key)
                while st.first + per_file <= base and st.first + per_file < st.next:
                    try:
                        os.unlink(d / f"{st.first:020d}")
                    except FileNotFoundError:   # a file never written (its entries went first)
                        pass
                    st.first += per_file

    def _cq(self, key: QueueKey, born: int = 0) -> ConsumeQueue:
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueue(0, born)
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
        if results:
            self._last_record = (results[-1][1], size)  # the checkpoint's proof that P is a boundary
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
        return self._record_at(phys)

    def _record_at(self, phys: int, expect_size: int | None = None) -> "lab.LabMessage | None":
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

    def start(self):
        loop = asyncio.get_running_loop()
        self._flush_wakeup = asyncio.Event()
        self._flusher = loop.create_task(self._flush_loop())
        self._checkpointer = loop.create_task(self._checkpoint_loop())
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

    async def _checkpoint_loop(self):
        """Consume-queue files and the checkpoint, every flush interval in both flush modes:
        off the send path, so sync flush acknowledges after the commit-log fsync alone."""
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.checkpoint()
            except OSError:
                log.exception("consume queue checkpoint failed (a restart scans more of the log)")

    async def flush(self):
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

    def flush_now(self):
        """fsync the commit log, then write the consume-queue files and checkpoint (blocking)."""
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
    __slots__ = ("paths", "commitlog_min", "min_offsets", "cq_cuts")

    def __init__(self, paths: list[Path]):
        self.paths = paths              # closed segment files to unlink
        self.commitlog_min = 0
        self.min_offsets = None         # [[topic, broker, qid, min offset], ...] to save, if any
        self.cq_cuts = []               # [(key, queue, new min offset)]: consume-queue files to prune


class _NoCheckpoint(Exception):
    """The checkpoint cannot be used (missing, corrupt, or its files disagree with the log)."""


class _CQFiles:
    """What one queue has on disk: for which incarnation (the ConsumeQueue object), the base
    of its oldest file, and the offset up to which its entries are written."""

    __slots__ = ("cq", "first", "next")

    def __init__(self, cq: ConsumeQueue, first: int | None, next_offset: int):
        self.cq = cq
        self.first = first
        self.next = next_offset


class _Snapshot:
    __slots__ = ("seq", "target", "last", "items", "rows", "dropped")

    def __init__(self, seq, target, last, items, rows, dropped):
        self.seq = seq            # order of the snapshots (older ones never overwrite newer)
        self.target = target      # commit-log offset the checkpoint covers (P)
        self.last = last          # (phys, size) of the record ending at P
        self.items = items        # [(key, queue, reset, first offset, columns or None)]
        self.rows = rows          # [[topic, broker, qid, born, min, max]] at P
        self.dropped = dropped    # [(key, _CQFiles)] of queues no longer in memory
