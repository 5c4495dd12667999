"""The checkpoint (RocketMQ's StoreCheckpoint with the consume-queue flush), so a restart
need not parse the whole log.

Every flush interval the consume-queue entries appended since the last time are written
and fsynced (after the commit log below them), then ``consumequeue/checkpoint`` is
replaced atomically: the commit-log offset P they cover plus each queue's (born, min, max
offset) at P. Start-up loads the files up to those max offsets, checks them against the
log, and scans the commit log only from P (the tail written since, torn records handled as
in the full scan). A missing, corrupt or inconsistent checkpoint falls back to the full
scan, which rewrites the files. Sends never wait for this: the log stays the only thing an
acknowledgement needs.
"""
from __future__ import annotations

import asyncio
import bisect
import json
import logging
import os
import shutil
import zlib
from pathlib import Path

from ...atomic import write_bytes

from .commit_log import HEADER
from .consume_queue import CQ_ENTRY, ConsumeQueue, QueueKey, _CQFiles, decode_entries, encode_entries

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


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


class _NoCheckpoint(Exception):
    """The checkpoint cannot be used (missing, corrupt, or its files disagree with the log)."""


class _Snapshot:
    __slots__ = ("seq", "target", "last", "items", "rows", "dropped")

    def __init__(self, seq, target, last, items, rows, dropped):
        self.seq = seq            # order of the snapshots (older ones never overwrite newer)
        self.target = target      # commit-log offset the checkpoint covers (P)
        self.last = last          # (phys, size) of the record ending at P
        self.items = items        # [(key, queue, reset, first offset, columns or None)]
        self.rows = rows          # [[topic, broker, qid, born, min, max]] at P
        self.dropped = dropped    # [(key, _CQFiles)] of queues no longer in memory


class StoreCheckpoint:
    """The MessageStore's consume-queue files and checkpoint: written off the event loop,
    loaded at recovery (part of MessageStore; see its __init__)."""

    def _init_checkpoint(self):
        self.checkpoint_path = self.cq_dir / "checkpoint"
        self._ckpt_seq = 0          # snapshots taken
        self._ckpt_written = 0      # the newest snapshot written (an older one never overwrites it)
        self.checkpoint_pos = 0     # commit-log offset the checkpoint on disk covers
        self._checkpointer: asyncio.Task | None = None

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

    async def _checkpoint_loop(self):
        """Consume-queue files and the checkpoint, every flush interval in both flush modes:
        off the send path, so sync flush acknowledges after the commit-log fsync alone."""
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.checkpoint()
            except OSError:
                log.exception("consume queue checkpoint failed (a restart scans more of the log)")
