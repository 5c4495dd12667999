"""Unit tests of the store, topics, delay levels and receipt handles (in process, real files)."""
import os

import pytest

from consumers_app.broker.delay import parse_delay_levels
from consumers_app.broker.pop import Handle, HandleError
from consumers_app.broker.store import HEADER, MessageStore
from consumers_app.broker.topics import group_error, topic_error
from consumers_app.protocol import lab

pytestmark = pytest.mark.unit   # lane: the store in-process, no broker process


def msg(body: bytes, tag: str = "") -> lab.LabMessage:
    return lab.LabMessage(message_id=body.hex(), body=body, tag=tag)


def test_append_read_and_roll_segments(tmp_path):
    store = MessageStore(tmp_path, segment_size=4096)
    store.recover()
    key = ("T", "broker-a", 0)
    results = store.append([(key, msg(b"x" * 1000 + bytes([i]))) for i in range(10)])
    assert [r[0] for r in results] == list(range(10))
    assert len(store.segments) > 2  # 10 records of ~1 KiB cannot fit in 4 KiB segments
    for i in range(10):
        assert store.read_message(key, i).body == b"x" * 1000 + bytes([i])
    store.close()

    again = MessageStore(tmp_path, segment_size=4096)
    assert again.recover() == 10
    assert again.queue(key).max_offset == 10
    assert again.read_message(key, 9).queue_offset == 9
    # Appends continue after the recovered end.
    assert again.append([(key, msg(b"more"))])[0][0] == 10
    again.close()


def test_torn_tail_is_truncated(tmp_path):
    store = MessageStore(tmp_path, segment_size=1 << 20)
    store.recover()
    key = ("T", "broker-a", 1)
    store.append([(key, msg(b"a" * 100)), (key, msg(b"b" * 100))])
    end = store.write_pos
    store.close()
    # Simulate a crash in the middle of a third record: a header promising more than was written.
    seg = sorted((tmp_path / "commitlog").iterdir())[0]
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(HEADER.pack(500, 12345) + b"partial")
    again = MessageStore(tmp_path, segment_size=1 << 20)
    assert again.recover() == 2
    assert again.write_pos == end
    assert again.append([(key, msg(b"c"))])[0][0] == 2
    again.close()
    third = MessageStore(tmp_path, segment_size=1 << 20)
    assert third.recover() == 3
    third.close()


def test_scan_filters_by_tag_and_bounds(tmp_path):
    store = MessageStore(tmp_path)
    store.recover()
    key = ("T", "broker-a", 0)
    store.append([(key, msg(bytes([i]), tag="A" if i % 2 else "B")) for i in range(20)])
    from consumers_app.broker.store import tag_code
    found, nxt = store.scan(key, 0, 4, {tag_code("A")})
    assert [off for off, _ in found] == [1, 3, 5, 7] and nxt == 8
    found, nxt = store.scan(key, 18, 32, None)
    assert [off for off, _ in found] == [18, 19] and nxt == 20
    assert store.queue(key).offset_for_time(0) == 0
    store.close()


def test_delay_levels():
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[-1] == 7_200_000
    with pytest.raises(ValueError):
        parse_delay_levels("1s 5x")


def test_receipt_handles_round_trip_and_reject_tampering():
    h = Handle("TopicTest", "ROOM@broker-a", 3, 42, 7, 1_700_000_000_000, 30_000)
    text = h.encode()
    assert Handle.decode(text) == h
    tampered = text.replace(" 42 ", " 43 ")
    with pytest.raises(HandleError):
        Handle.decode(tampered)
    for junk in ("", "x", os.urandom(8).hex()):
        with pytest.raises(HandleError):
            Handle.decode(junk)


def test_name_rules():
    assert topic_error("TopicTest") is None and topic_error("%RETRY%g|x-y_1") is None
    assert topic_error("") and topic_error("a b") and topic_error("t" * 128)
    assert topic_error("t" * 127) is None
    assert group_error("GID_1") is None and group_error("bad group")


def file_bytes(store, phys: int, n: int) -> bytes:
    """What the commit log's file holds at ``phys`` (not the store's view of it)."""
    seg = store.segments[-1]
    return os.pread(seg.fd, n, phys - seg.base)


async def test_deferred_records_are_written_at_the_end_of_the_turn_or_when_read(tmp_path):
    import asyncio

    store = MessageStore(tmp_path, segment_size=1 << 20)
    store.recover()
    key = ("T", "broker-a", 0)
    (_, first), = store.append([(key, msg(b"one"))], defer_write=True)
    (_, second), = store.append([(key, msg(b"two"))], defer_write=True)
    assert file_bytes(store, first, HEADER.size) == bytes(HEADER.size)   # not written yet
    # The turn ends: a callback queued now runs after the write the appends queued.
    loop = asyncio.get_running_loop()
    turn_ended = loop.create_future()
    loop.call_soon(turn_ended.set_result, None)
    await turn_ended
    assert file_bytes(store, second, HEADER.size) != bytes(HEADER.size)
    assert store.read_message(key, 1).body == b"two"

    (_, third), = store.append([(key, msg(b"three"))], defer_write=True)
    assert store.read_message(key, 2).body == b"three"                  # a read writes first
    assert file_bytes(store, third, HEADER.size) != bytes(HEADER.size)

    store.append([(key, msg(b"four"))], defer_write=True)
    (_, fifth), = store.append([(key, msg(b"five"))])                   # a plain append writes both
    assert file_bytes(store, fifth, HEADER.size) != bytes(HEADER.size)
    store.append([(key, msg(b"six"))], defer_write=True)
    store.close()                                                       # and so does a close
    again = MessageStore(tmp_path, segment_size=1 << 20)
    assert again.recover() == 6
    assert [again.read_message(key, i).body for i in range(6)] == [b"one", b"two", b"three", b"four", b"five", b"six"]
    again.close()


async def test_deferred_records_roll_into_the_next_segment_in_order(tmp_path):
    store = MessageStore(tmp_path, segment_size=4096)
    store.recover()
    key = ("T", "broker-a", 0)
    for i in range(10):   # ~1 KiB each: the log rolls while records wait to be written
        store.append([(key, msg(b"x" * 1000 + bytes([i])))], defer_write=True)
    assert len(store.segments) > 2
    store.close()
    again = MessageStore(tmp_path, segment_size=4096)
    assert again.recover() == 10
    assert [again.read_message(key, i).body[-1] for i in range(10)] == list(range(10))
    again.close()
