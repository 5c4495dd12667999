"""Consume-queue files + checkpoint: a restart loads the queues from their files and scans the
commit log only after the checkpoint; whatever happened (clean stop, SIGKILL mid-write, torn
tail, a checkpoint that never completed, a corrupt or missing checkpoint, retention), the
queues come back exactly as a scan of the whole commit log rebuilds them.

In process on real files; one test SIGKILLs a child process that appends and checkpoints.
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from consumers_app.broker.store import (CQ_ENTRY, CQ_ROW, HEADER, MessageStore, decode_entries,
                                        encode_entries)
from consumers_app.protocol import lab

from .support import REPO, async_wait_until, wait_until

pytestmark = pytest.mark.unit   # lane: the store in-process, no broker process

SEG = 8192          # a few 1 KiB records per segment: many segments, segment rolls
PER_FILE = 8        # entries per consume-queue file: many files per queue
A, B, IDLE = ("T", "broker-a", 0), ("T", "broker-a", 1), ("T", "broker-a", 2)


def msg(i: int, size: int = 1000, tag: str = "") -> lab.LabMessage:
    return lab.LabMessage(message_id=f"m{i}", body=i.to_bytes(4, "big") * (size // 4), tag=tag)


def open_store(path, **kw) -> MessageStore:
    store = MessageStore(path, segment_size=SEG, cq_file_entries=PER_FILE, **kw)
    store.recover()
    return store


def fill(store, n: int, start: int = 0):
    """``n`` messages spread over queues A and B (tags alternate), one IDLE at the start."""
    if start == 0:
        store.append([(IDLE, msg(10_000))])
    for i in range(start, start + n, 4):
        store.append([((A if j % 3 else B), msg(j, tag="x" if j % 2 else "y")) for j in range(i, min(i + 4, start + n))])


def state(store) -> dict:
    """Everything recovery rebuilds: per queue its offsets and entries, and the log's end."""
    queues = {key: (cq.base, list(cq.phys_a), list(cq.size_a), list(cq.ts_a), list(cq.tags_a))
              for key, cq in store.queues.items()}
    return {"write_pos": store.write_pos, "queues": queues}


def full_scan_state(path, tmp_path, **kw) -> dict:
    """What the existing full scan rebuilds from the same files (on a copy, no checkpoint)."""
    copy = tmp_path / f"fullscan-{time.monotonic_ns()}"
    shutil.copytree(path, copy)
    (copy / "consumequeue" / "checkpoint").unlink(missing_ok=True)
    store = open_store(copy, **kw)
    assert store.recovery["mode"] == "full" and store.recovery["scan_from"] == 0
    out = state(store)
    for seg in store.segments:   # no close(): that would write every file of the copy
        seg.close()
    shutil.rmtree(copy)
    return out


def cq_file_entries_on_disk(store, key) -> dict[int, tuple]:
    """queue offset -> entry, read back from the queue's files."""
    d = store.cq_path(key)
    out = {}
    for name in sorted(os.listdir(d)):
        phys, size, ts, tags = decode_entries((d / name).read_bytes())
        for j, entry in enumerate(zip(phys, size, ts, tags)):
            out[int(name) + j] = entry
    return out


def assert_files_match_memory(store):
    """Every entry a queue still holds is in its files, byte for byte."""
    for key, cq in store.queues.items():
        if cq.max_offset == cq.base:
            continue
        disk = cq_file_entries_on_disk(store, key)
        for off in range(cq.base, cq.max_offset):
            assert disk[off] == (cq.phys[off], cq.size[off], cq.store_ts[off], cq.tags[off]), (key, off)


# ---------------------------------------------------------------------------- format

def test_entries_round_trip_and_the_on_disk_layout(tmp_path):
    store = open_store(tmp_path)
    fill(store, 40)
    store.close()
    cq = store.queues[A]
    phys, size, ts, tags = decode_entries(encode_entries(cq.phys_a, cq.size_a, cq.ts_a, cq.tags_a))
    assert (phys, size, ts, tags) == (cq.phys_a, cq.size_a, cq.ts_a, cq.tags_a)
    # DATA/consumequeue/TOPIC/BROKER/QID/<20-digit first offset>, PER_FILE entries of 28 bytes each
    d = tmp_path / "consumequeue" / "T" / "broker-a" / "0"
    files = sorted(os.listdir(d))
    assert files == [f"{b:020d}" for b in range(0, cq.max_offset, PER_FILE)]
    first = (d / files[0]).read_bytes()
    assert len(first) == PER_FILE * CQ_ENTRY
    assert CQ_ROW.unpack_from(first, 3 * CQ_ENTRY) == (cq.phys[3], cq.size[3], cq.store_ts[3], cq.tags[3])
    assert (d / files[-1]).stat().st_size == (cq.max_offset - int(files[-1])) * CQ_ENTRY
    # Names that are not safe path components are escaped, never interpreted.
    weird = ("%RETRY%g|x", "../b/c", 0)
    assert store.cq_path(weird).relative_to(tmp_path / "consumequeue").parts == ("%25RETRY%25g%7Cx", "%2E%2E%2Fb%2Fc", "0")


# ----------------------------------------------------------------------- clean restart

def test_clean_restart_reads_only_after_the_checkpoint(tmp_path):
    store = open_store(tmp_path)
    fill(store, 100)
    before = state(store)
    store.close()

    again = open_store(tmp_path)
    # Nothing parsed from the commit log: the scan starts at its end and finds no record.
    assert again.recovery["mode"] == "checkpoint"
    assert again.recovery["scan_from"] == before["write_pos"] and again.recovery["scanned"] == 0
    assert again.recovery["loaded"] == 101
    assert state(again) == before == full_scan_state(tmp_path, tmp_path)
    assert again.read_message(A, 4).body == msg(7).body        # queue A holds j % 3 != 0
    # Appends continue where they were; a crash before the next checkpoint (no close: the
    # process just goes away) costs a scan of what was appended since, nothing more.
    again.flush_now()
    ckpt = again.write_pos
    fill(again, 9, start=100)
    after = state(again)
    third = open_store(tmp_path)
    assert third.recovery["mode"] == "checkpoint"
    assert (third.recovery["scan_from"], third.recovery["scanned"]) == (ckpt, 9)
    assert state(third) == after == full_scan_state(tmp_path, tmp_path)
    third.close()


def test_a_checkpoint_that_never_completed_and_a_torn_tail(tmp_path):
    """The files got entries past the checkpoint (its rename never happened), and the log
    ends in a torn record: both cut back, the tail after the checkpoint scanned again."""
    store = open_store(tmp_path)
    fill(store, 30)
    store.flush_now()
    ckpt_pos = store.write_pos
    ckpt_bytes = store.checkpoint_path.read_bytes()
    max_at_ckpt = store.queues[A].max_offset
    fill(store, 21, start=30)
    store.flush_now()                                   # files now hold more entries...
    store.checkpoint_path.write_bytes(ckpt_bytes)      # ...than the checkpoint that survived
    end = store.write_pos
    seg = store.segments[-1]
    os.pwrite(seg.fd, HEADER.pack(900, 12345) + b"partial", end - seg.base)   # SIGKILL mid-write
    expected = full_scan_state(tmp_path, tmp_path)
    assert expected["write_pos"] == end
    for s in store.segments:
        s.close()

    again = open_store(tmp_path)
    assert again.recovery["mode"] == "checkpoint"
    assert (again.recovery["scan_from"], again.recovery["scanned"]) == (ckpt_pos, 21)
    assert state(again) == expected
    # The entries past the checkpoint were cut from the files (rewritten by the next one).
    d = again.cq_path(A)
    assert sum(f.stat().st_size for f in d.iterdir()) == max_at_ckpt * CQ_ENTRY
    again.close()
    assert_files_match_memory(again)
    third = open_store(tmp_path)
    assert third.recovery["scanned"] == 0 and state(third) == expected
    third.close()


CHILD = textwrap.dedent("""
    import asyncio, sys
    from consumers_app.broker.store import MessageStore
    from consumers_app.protocol import lab

    async def main(path):
        store = MessageStore(path, segment_size=8192, cq_file_entries=8, flush_interval_ms=5)
        store.recover()
        store.start()                       # the flusher and the checkpoint task, as the broker runs them
        print("ready", flush=True)
        i = 0
        while True:
            batch = [(("T", "broker-a", j % 3), lab.LabMessage(message_id=str(j), body=b"k" * (200 + j % 900)))
                     for j in range(i, i + 1 + i % 7)]
            store.append(batch)
            i += len(batch)
            await asyncio.sleep(0.0005 * (i % 3))  # noqa: sleep-ok - paces a writer that is killed mid-write

    asyncio.run(main(sys.argv[1]))
""")


def checkpoints_seen(data, seen: set) -> int:
    """How many distinct checkpoint files (by mtime and size) ``seen`` has collected so far."""
    try:
        st = (data / "consumequeue" / "checkpoint").stat()
    except FileNotFoundError:
        return len(seen)
    seen.add((st.st_mtime_ns, st.st_size))
    return len(seen)


def test_sigkill_mid_write_recovers_what_a_full_scan_does(tmp_path):
    """A child appends and checkpoints (every 5 ms, in a thread, as the broker does) until
    SIGKILL; each time the checkpoint path must rebuild exactly what the full scan does."""
    data = tmp_path / "data"
    modes = []
    for round_ in range(5):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(data)], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            # Killed once this round's writing has been checkpointed a few times (more each
            # round), so the kill lands between checkpoints with a tail after the last.
            seen: set = set()
            checkpoints_seen(data, seen)   # the one left by the previous round
            wait_until(lambda: checkpoints_seen(data, seen) >= 3 + round_, timeout=30, interval=0.002,
                       message="checkpoints written while the child appends")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        expected = full_scan_state(data, tmp_path)
        store = open_store(data)
        modes.append(store.recovery["mode"])
        assert state(store) == expected
        assert store.recovery["scanned"] < sum(len(q[1]) for q in expected["queues"].values())
        for s in store.segments:    # as killed: no checkpoint at close, the next round goes on
            s.close()
    assert modes == ["checkpoint"] * 5


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_the_checkpoint_task_follows_the_flusher(tmp_path, flush):
    """As the broker runs it: the checkpoint task covers only what the flusher fsynced
    (sync flush: each acknowledged batch), and catches up with it within an interval."""
    store = open_store(tmp_path, flush=flush, flush_interval_ms=20)
    store.start()
    try:
        for round_ in range(3):
            fill(store, 12, start=12 * round_)
            await store.wait_flushed()    # what a sync-flush send waits for (async: nothing)
            assert store.checkpoint_pos <= store.flushed_pos
            await async_wait_until(lambda: store.checkpoint_pos == store.write_pos, timeout=10,
                                   message="the checkpoint to cover every append")
        assert_files_match_memory(store)
        expected = state(store)
        again = open_store(tmp_path)      # as after a SIGKILL now: nothing left to scan
        assert (again.recovery["mode"], again.recovery["scanned"]) == ("checkpoint", 0)
        assert state(again) == expected
        for seg in again.segments:
            seg.close()
    finally:
        store.close()


# -------------------------------------------------------------------------- fallback

def _corrupt(kind, store, tmp_path):
    ck = store.checkpoint_path
    if kind == "missing":
        ck.unlink()
    elif kind == "garbage":
        ck.write_bytes(os.urandom(200))
    elif kind == "bit flip":
        raw = bytearray(ck.read_bytes())
        raw[20] ^= 0x04
        ck.write_bytes(bytes(raw))
    elif kind == "cq file missing":
        os.unlink(store.cq_path(A) / f"{PER_FILE:020d}")
    elif kind == "cq file short":
        os.truncate(store.cq_path(B) / f"{0:020d}", 3 * CQ_ENTRY)
    elif kind == "cq entry wrong":
        last = max(os.listdir(store.cq_path(A)))
        path = store.cq_path(A) / last
        raw = bytearray(path.read_bytes())
        CQ_ROW.pack_into(raw, len(raw) - CQ_ENTRY, store.queues[B].phys[0], 1000, 0, 0)
        path.write_bytes(bytes(raw))
    elif kind == "commit log shorter":
        last = store.segments[-1].path
        os.truncate(last, 0)


@pytest.mark.parametrize("kind", ["missing", "garbage", "bit flip", "cq file missing", "cq file short",
                                  "cq entry wrong", "commit log shorter"])
def test_an_unusable_checkpoint_falls_back_to_the_full_scan(tmp_path, kind):
    store = open_store(tmp_path)
    fill(store, 60)
    store.close()
    _corrupt(kind, store, tmp_path)
    expected = full_scan_state(tmp_path, tmp_path)
    if kind != "commit log shorter":
        assert expected["queues"] == state(store)["queues"]

    again = open_store(tmp_path)
    assert again.recovery["mode"] == "full" and again.recovery["reason"]
    assert again.recovery["scan_from"] == 0
    assert state(again) == expected
    # The fallback rewrote the files: the next start uses them again.
    again.close()
    third = open_store(tmp_path)
    assert third.recovery["mode"] == "checkpoint" and third.recovery["scanned"] == 0
    assert state(third) == expected
    assert_files_match_memory(third)
    third.close()


# ------------------------------------------------------------------------- retention

def test_cq_files_follow_retention_and_a_restart_agrees_with_a_full_scan(tmp_path):
    store = open_store(tmp_path, retention_bytes=4 * SEG)
    fill(store, 120)
    store.flush_now()
    files_before = sorted(os.listdir(store.cq_path(A)))
    deleted = store.delete_expired()
    assert deleted
    cq = store.queues[A]
    low = cq.min_offset
    assert low > PER_FILE
    files = sorted(int(n) for n in os.listdir(store.cq_path(A)))
    # Files entirely below the min offset went; the one holding it stays, and all after it.
    assert files[0] <= low < files[0] + PER_FILE
    assert len(files) < len(files_before)
    assert files == list(range(files[0], cq.max_offset, PER_FILE))
    # The idle queue lost its only message: its last (only) file stays, its offsets go on.
    assert (store.queues[IDLE].min_offset, store.queues[IDLE].max_offset) == (1, 1)
    assert os.listdir(store.cq_path(IDLE)) == [f"{0:020d}"]
    assert_files_match_memory(store)
    before = state(store)
    store.close()

    again = open_store(tmp_path)
    assert again.recovery["mode"] == "checkpoint" and again.recovery["scanned"] == 0
    assert state(again) == before == full_scan_state(tmp_path, tmp_path)
    # Continue: more, a restart from the checkpoint, retention again, a crash before the
    # checkpoint caught up; every time the same as the full scan.
    fill(again, 40, start=120)
    again.close()
    third = open_store(tmp_path, retention_bytes=4 * SEG)
    third.delete_expired()
    fill(third, 17, start=160)
    third.flush_now()
    after = state(third)
    fourth = open_store(tmp_path)
    assert fourth.recovery["mode"] == "checkpoint" and state(fourth) == after
    assert state(fourth) == full_scan_state(tmp_path, tmp_path)
    fourth.close()


def test_retention_before_the_entries_reached_their_files(tmp_path):
    """The flusher fsynced the log and retention deleted segments before the checkpoint
    task wrote their entries (async, each on its own timer): the files get a hole in front,
    which a restart skips."""
    store = open_store(tmp_path, retention_bytes=3 * SEG)
    fill(store, 20)
    store.flush_now()
    fill(store, 80, start=20)
    for s in store.segments:     # what the flusher does; the checkpoint task has not run yet
        os.fsync(s.fd)
    store.flushed_pos = store.write_pos
    store.delete_expired()
    low = store.queues[A].min_offset
    assert low > store._cq_files[A].next     # entries were cut before ever being written
    store.flush_now()
    assert_files_match_memory(store)
    before = state(store)
    store.close()
    again = open_store(tmp_path)
    assert again.recovery["mode"] == "checkpoint" and again.recovery["scanned"] == 0
    assert state(again) == before == full_scan_state(tmp_path, tmp_path)
    again.close()


def test_a_queue_dropped_and_created_again_starts_new_files(tmp_path):
    store = open_store(tmp_path)
    fill(store, 30)
    store.flush_now()
    recreated_at = store.write_pos
    old_files = set(os.listdir(store.cq_path(A)))
    assert len(old_files) > 1
    store.drop_queue(A)                       # DeleteTopic / AddQueues to 0, then created again
    assert store.append([(A, msg(1))])[0][0] == 0
    store.flush_now()
    assert os.listdir(store.cq_path(A)) == [f"{0:020d}"]
    assert_files_match_memory(store)
    store.close()

    again = MessageStore(tmp_path, segment_size=SEG, cq_file_entries=PER_FILE)
    # As TopicManager.accept_record once the topic was created again at ``recreated_at``.
    again.recover(accept=lambda topic, broker, phys: phys >= recreated_at)
    assert again.recovery["mode"] == "checkpoint"
    assert set(again.queues) == {A} and (again.queues[A].base, again.queues[A].max_offset) == (0, 1)
    assert again.read_message(A, 0).body == msg(1).body
    # Queues the accept function rejects lose their directories.
    assert not again.cq_path(B).exists() and not again.cq_path(IDLE).exists()
    again.close()
