"""Consume queues (RocketMQ's ConsumeQueue): the index of one queue, in memory and on disk.

The consume queue of (topic, broker, queue id) is a set of parallel ``array``s:
physical offset, size, store time and tag hash per queue offset, so reading offset
N is O(1); bodies stay in the mapped segment files (the OS page cache), not in our heap.

Each queue is also written to ``DATA/consumequeue/<topic>/<broker>/<queue id>/<20-digit
first queue offset>``, files of ``cq_file_entries`` fixed-size entries (``CQ_ENTRY``:
little-endian phys int64, size int32, store ts int64, tag hash int64; entry N of a queue is
at byte (N - file base) * 28). The checkpoint (checkpoint.py) writes and loads them; this
module knows their format and where they are.
"""
from __future__ import annotations

import bisect
import os
import shutil
import struct
import sys
import threading
from array import array
from pathlib import Path

from ...javastr import java_hash

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


CQ_ENTRY = 28                     # bytes per entry: <q phys><i size><q store ts><q tag hash>
CQ_ROW = struct.Struct("<qiqq")
CQ_FILE_ENTRIES = 300_000         # entries per file, as RocketMQ's mappedFileSizeConsumeQueue
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


class _CQFiles:
    """What one queue has on disk: for which incarnation (the ConsumeQueue object), the base
    of its oldest file, and the offset up to which its entries are written."""

    __slots__ = ("cq", "first", "next")

    def __init__(self, cq: ConsumeQueue, first: int | None, next_offset: int):
        self.cq = cq
        self.first = first
        self.next = next_offset


class ConsumeQueueStore:
    """The MessageStore's consume queues: the in-memory queues by key and, per queue, what
    its files on disk hold (part of MessageStore; see its __init__)."""

    def _init_consume_queues(self, cq_file_entries: int):
        self.cq_dir = self.data_dir / "consumequeue"
        self.cq_dir.mkdir(exist_ok=True)
        self.cq_file_entries = cq_file_entries
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        # Consume-queue files: what is on disk per queue (written by one thread at a time,
        # under the lock; the event loop only reads it to build the next snapshot).
        self._cq_files: dict[QueueKey, _CQFiles] = {}
        self._cq_lock = threading.Lock()

    def _cq(self, key: QueueKey, born: int = 0) -> ConsumeQueue:
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueue(0, born)
        return cq

    def queue(self, key: QueueKey) -> ConsumeQueue | None:
        return self.queues.get(key)

    def drop_queue(self, key: QueueKey):
        self.queues.pop(key, None)

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
