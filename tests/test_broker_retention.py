"""Disk retention of the commit log, as RocketMQ's CleanCommitLogService: whole segments
deleted oldest first (never the one being written) by size (--retention-mb) or age
(--retention-hours), whatever consumers still need; min offsets move and pulls below
them are corrected; restarts recover the kept segments and continue the queue offsets.

Unit tests on MessageStore first (real files, in process), then a real ``runbroker``.
"""
import asyncio
import os
import time
from pathlib import Path

import grpc
import pytest

from consumers_app.broker.store import MessageStore
from consumers_app.client import ConsumeFromWhere
from consumers_app.protocol import lab, v2, v2_grpc
from consumers_app.protocol import v2_service as svc
from consumers_app.remoting import wire

from .brokers import BrokerProcess, BrokerStubs
from .push_consumers import Log, push
from .remoting_peers import call
from .support import async_wait_until, wait_until

Code = v2.Code
SEG = 4096      # unit tests: ~3 records of 1 KiB per segment


def msg(i: int, size: int = 1000) -> lab.LabMessage:
    return lab.LabMessage(message_id=f"m{i}", body=i.to_bytes(4, "big") * (size // 4))


def filled_store(path, n=30, idle_first=3, **kw) -> MessageStore:
    """Queue 0 gets ``n`` messages; queue 1 only ``idle_first`` at the very start."""
    store = MessageStore(path, segment_size=SEG, **kw)
    store.recover()
    for i in range(idle_first):
        store.append([(("T", "broker-a", 1), msg(1000 + i))])
    for i in range(n):
        store.append([(("T", "broker-a", 0), msg(i))])
    store.flush_now()
    return store


def deleted_entries(pid, directory: Path) -> list[str]:
    """Files under ``directory`` that process ``pid`` still maps or holds open although
    they are deleted (the kernel shows them with a " (deleted)" suffix)."""
    d = str(Path(directory).resolve())
    out = [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
           if d in line and line.endswith("(deleted)")]
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith(d) and target.endswith("(deleted)"):
            out.append(f"fd {fd.name} -> {target}")
    return out


def mapped_segments(pid, directory: Path) -> list[str]:
    d = str(Path(directory).resolve() / "commitlog")
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if d in line]


# ------------------------------------------------------------------------ store units

def test_size_bound_deletes_the_oldest_segments_and_moves_min_offsets(tmp_path):
    store = filled_store(tmp_path, retention_bytes=3 * SEG)
    a, idle = ("T", "broker-a", 0), ("T", "broker-a", 1)
    before = [s.path for s in store.segments]
    first_phys = store.queue(a).phys[0]
    assert len(before) > 5
    deleted = store.delete_expired()
    # Whole files, oldest first, until the log fits; the rest untouched.
    assert deleted == before[:-3]
    assert [s.path for s in store.segments] == before[-3:]
    assert not any(p.exists() for p in deleted) and all(p.exists() for p in before[-3:])
    assert store.log_bytes() <= 3 * SEG
    cq = store.queue(a)
    low = cq.min_offset
    assert low > 0 and cq.max_offset == 30
    assert cq.phys[low] >= store.min_phys > cq.phys[low] - SEG  # the first entry of the kept log
    assert store.read(a, low - 1) is None and store.read_message(a, low).body == msg(low).body
    found, nxt = store.scan(a, 0, 4, None)     # a reader behind the min offset starts at it
    assert [off for off, _ in found] == [low, low + 1, low + 2, low + 3] and nxt == low + 4
    assert store.read_at(first_phys) is None   # what remoting's "view message by offset" asks
    assert cq.offset_for_time(0) == low
    # A queue whose every message was deleted keeps its offsets: min = max.
    assert (store.queue(idle).min_offset, store.queue(idle).max_offset) == (3, 3)
    assert store.append([(a, msg(99))])[0][0] == 30
    assert store.append([(idle, msg(98))])[0][0] == 3
    # Unmapped and closed before unlinking: this process holds no deleted file.
    assert deleted_entries(os.getpid(), tmp_path) == []
    usage = store.disk_usage()
    on_disk = sum(os.stat(s.path).st_blocks * 512 for s in store.segments)
    assert usage["commitlog"] == on_disk and usage["consumequeue"] > 0
    assert set(usage) == {"commitlog", "consumequeue", "offsets", "topics", "other"}
    store.close()


def test_the_segment_being_written_is_never_deleted(tmp_path):
    store = filled_store(tmp_path, retention_bytes=0, retention_ms=0)
    last = store.segments[-1]
    store.delete_expired()
    assert store.segments == [last] and last.path.exists()
    cq = store.queue(("T", "broker-a", 0))
    assert cq.phys[cq.min_offset] == last.base          # the oldest kept message
    store.close()


def test_age_bound_deletes_segments_last_written_too_long_ago_oldest_first(tmp_path):
    store = filled_store(tmp_path, retention_ms=3_600_000)
    segs = list(store.segments)
    old = time.time() - 7200
    for s in (segs[0], segs[1], segs[3]):   # segs[2] is young: it and all after it stay
        os.utime(s.path, (old, old))
    assert store.delete_expired() == [segs[0].path, segs[1].path]
    assert store.segments == segs[2:]
    assert store.delete_expired() == []
    store.close()


def test_segments_not_yet_fsynced_wait_for_the_flush(tmp_path):
    store = filled_store(tmp_path, retention_bytes=0)
    store.delete_expired()
    store.append([(("T", "broker-a", 0), msg(i)) for i in range(12)])   # rolls, no fsync yet
    assert len(store.segments) > 1
    assert store.delete_expired() == []   # the flusher may be syncing those fds
    store.flush_now()
    assert len(store.delete_expired()) > 0 and len(store.segments) == 1
    store.close()


def test_a_segment_still_exported_is_unlinked_only_once_unmapped(tmp_path):
    store = filled_store(tmp_path, retention_bytes=0)
    oldest = store.segments[0]
    view = memoryview(oldest.map)           # a reader still holding the mapped bytes
    deleted = store.delete_expired()
    assert oldest.path not in deleted and oldest.path.exists()
    assert oldest not in store.segments     # out of the log at once: nobody reads it again
    view.release()
    assert store.delete_expired() == [oldest.path] and not oldest.path.exists()
    assert deleted_entries(os.getpid(), tmp_path) == []
    store.close()


def test_recovery_after_deletion_continues_every_queue_offset(tmp_path):
    store = filled_store(tmp_path, retention_bytes=3 * SEG)
    store.delete_expired()
    a, idle = ("T", "broker-a", 0), ("T", "broker-a", 1)
    low = store.queue(a).min_offset
    store.close()

    again = MessageStore(tmp_path, segment_size=SEG)
    assert again.recover() == 30 - low
    assert (again.queue(a).min_offset, again.queue(a).max_offset) == (low, 30)
    assert again.read_message(a, low).queue_offset == low
    # Its messages all gone, the idle queue still goes on from 3 (saved min offsets).
    assert (again.queue(idle).min_offset, again.queue(idle).max_offset) == (3, 3)
    assert again.append([(idle, msg(7))])[0][0] == 3
    assert again.append([(a, msg(7))])[0][0] == 30
    again.close()

    # Without the saved min offsets a queue still starts at its first kept record.
    (tmp_path / "consumequeue" / "min_offsets.json").unlink()
    third = MessageStore(tmp_path, segment_size=SEG)
    third.recover()
    assert (third.queue(a).min_offset, third.queue(a).max_offset) == (low, 31)
    third.close()


def test_saved_min_offsets_do_not_apply_to_a_queue_created_again(tmp_path):
    store = filled_store(tmp_path, retention_bytes=3 * SEG)
    store.delete_expired()
    recreated_at = store.write_pos
    store.close()
    # The topic was deleted and created again at ``recreated_at``: an older record or
    # saved min offset belongs to the old incarnation.
    again = MessageStore(tmp_path, segment_size=SEG)
    again.recover(accept=lambda topic, broker, phys: phys >= recreated_at)
    assert again.queue(("T", "broker-a", 1)) is None
    assert again.append([(("T", "broker-a", 1), msg(1))])[0][0] == 0
    again.close()


# ------------------------------------------------------------------ the real broker

TOPIC = "Retained"
SEGMENT = 8 << 20
RETENTION_MB = 64
BODY = 256 << 10              # big bodies: the broker's per-message cost stays small
PER_CALL = 16                 # 4 MiB per SendMessage, as bench/broker_throughput's batched stubs
FULL_QUEUES = (0, 1, 2)       # take the 300 MiB; queue 3 gets a few messages first, then none
IDLE_QUEUE = 3


async def send_bytes(address: str, topic: str, qids, total: int, body: int = BODY,
                     per_call: int = PER_CALL) -> dict[int, int]:
    """The fastest producing path of bench/: batched v2 SendMessage, one call in flight
    per queue. Returns messages stored per queue."""
    channel = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                          ("grpc.max_receive_message_length", -1)])
    stub = v2_grpc.MessagingServiceStub(channel)
    md = (("x-mq-client-id", "retention-filler"),)
    calls = -(-total // (body * per_call))
    sent = {qid: 0 for qid in qids}

    async def one_queue(qid: int, n: int):
        req = svc.SendMessageRequest()
        for _ in range(per_call):
            m = req.messages.add(body=b"r" * body)
            m.topic.name = topic
            m.user_properties["__QUEUE"] = f"broker-a:{qid}"
        for _ in range(n):
            resp = await stub.SendMessage(req, metadata=md, timeout=120)
            assert resp.status.code == Code.OK, resp.status
            sent[qid] += len(resp.entries)

    share = [calls // len(qids) + (i < calls % len(qids)) for i in range(len(qids))]
    try:
        await asyncio.gather(*(one_queue(q, n) for q, n in zip(qids, share)))
    finally:
        await channel.close()
    return sent


def dir_bytes(path: Path) -> int:
    """What the data dir holds: per file the larger of its size and its allocated blocks."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += max(st.st_size, st.st_blocks * 512)
    return total


def settled(broker, mb: int = RETENTION_MB) -> bool:
    """Retention has caught up with the flood (it deletes behind the writes, so right after
    them min offsets may still move): the commit log is within --retention-mb."""
    total = 0
    for segment in (broker.data_dir / "commitlog").iterdir():
        try:
            total += segment.stat().st_size
        except FileNotFoundError:   # deleted by retention since the listing: what this waits for
            continue
    return total <= mb << 20


def v2_queue(qid: int) -> v2.MessageQueue:
    return v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=qid, broker=v2.Broker(name="broker-a"))


def lab_offsets(stubs, group: str = "") -> dict[int, lab.QueueOffsets]:
    resp = stubs.admin.GetQueueOffsets(lab.QueueOffsetsRequest(topic=TOPIC, group=group), metadata=stubs.md)
    assert resp.status.code == Code.OK, resp.status
    return {q.queue.queue_id: q for q in resp.queues}


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A broker with --retention-mb 64 --segment-size 8 MiB that was sent 300 MiB.

    Before the flood: 10 small messages in each queue, and group GID_BEHIND committed
    offset 5 in each (a consumer that then fell behind the deletion)."""
    data = tmp_path_factory.mktemp("retention")
    broker = BrokerProcess(data, topics=[f"{TOPIC}:4"], remoting=True, extra_args=[
        "--retention-mb", str(RETENTION_MB), "--segment-size", str(SEGMENT)]).start()
    try:
        stubs = BrokerStubs(broker.address, "retention-test")
        sent = {q: 0 for q in range(4)}
        for qid in range(4):
            sent[qid] += asyncio.run(send_bytes(broker.address, TOPIC, [qid], 10 * 100, body=100, per_call=10))[qid]
            assert stubs.v2.UpdateOffset(svc.UpdateOffsetRequest(group=v2.Resource(name="GID_BEHIND"),
                                                                 message_queue=v2_queue(qid), offset=5),
                                         metadata=stubs.md).status.code == Code.OK
        for qid, n in asyncio.run(send_bytes(broker.address, TOPIC, FULL_QUEUES, 300 << 20)).items():
            sent[qid] += n
        yield broker, stubs, sent
        stubs.close()
    finally:
        broker.stop()


def test_retention_bounds_the_data_dir_and_holds_no_deleted_file(filled):
    broker, _, _ = filled
    bound = (RETENTION_MB << 20) + 2 * SEGMENT
    wait_until(lambda: dir_bytes(broker.data_dir) <= bound, timeout=20,
               message=f"the data dir at most {RETENTION_MB} MiB plus two segments")
    assert not (broker.data_dir / "commitlog" / f"{0:020d}").exists()   # the oldest segment went
    pid = broker.proc.pid
    assert mapped_segments(pid, broker.data_dir), "the kept segments are mapped (the check can see maps)"
    assert deleted_entries(pid, broker.data_dir) == []


def test_min_offsets_move_and_every_protocol_reports_them(filled):
    broker, stubs, sent = filled
    wait_until(lambda: settled(broker), timeout=20, message="retention caught up")
    offsets = lab_offsets(stubs)
    remoting = f"127.0.0.1:{broker.remoting_port}"
    for qid in range(4):
        q = offsets[qid]
        assert 0 < q.min_offset and q.max_offset == sent[qid]  # max offsets never move back
        low = call(remoting, wire.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": qid})
        assert (low.code, int(low.ext["offset"])) == (wire.SUCCESS, q.min_offset)
        begin = stubs.v2.QueryOffset(svc.QueryOffsetRequest(message_queue=v2_queue(qid),
                                                            query_offset_policy=v2.BEGINNING), metadata=stubs.md)
        assert begin.offset == q.min_offset
    # The idle queue lost every message yet keeps its offsets.
    assert offsets[IDLE_QUEUE].min_offset == offsets[IDLE_QUEUE].max_offset == 10
    # Nothing is kept below the min offset: a new group gets no "0" from the broker
    # (queryConsumerOffset answers 0 only while the first message is still stored).
    fresh = stubs.v2.GetOffset(svc.GetOffsetRequest(group=v2.Resource(name="GID_NEVER"),
                                                    message_queue=v2_queue(0)), metadata=stubs.md)
    assert fresh.status.code == Code.OFFSET_NOT_FOUND


def test_a_pull_below_the_min_offset_is_corrected_to_it(filled):
    broker, stubs, _ = filled
    wait_until(lambda: settled(broker), timeout=20, message="retention caught up")
    low = lab_offsets(stubs)[0].min_offset
    ref = lab.QueueRef(topic=TOPIC, broker_name="broker-a", queue_id=0)
    # LabAdmin's 4.x-style pull: OFFSET_ILLEGAL with the corrected offset.
    moved = stubs.admin.PullBatch(lab.PullBatchRequest(group="GID_PULL", queue=ref, offset=0, max_messages=4),
                                  metadata=stubs.md)
    assert (moved.pull_status, moved.next_begin_offset, moved.min_offset) == (lab.OFFSET_ILLEGAL, low, low)
    # Remoting: PULL_OFFSET_MOVED, nextBeginOffset = the min offset.
    remoting = f"127.0.0.1:{broker.remoting_port}"
    answer = call(remoting, wire.PULL_MESSAGE, {"consumerGroup": "GID_PULL", "topic": TOPIC, "queueId": 0,
                                                "queueOffset": low - 1, "maxMsgNums": 4, "sysFlag": 0})
    assert (answer.code, int(answer.ext["nextBeginOffset"]), int(answer.ext["minOffset"])) \
        == (wire.PULL_OFFSET_MOVED, low, low)
    kept = call(remoting, wire.PULL_MESSAGE, {"consumerGroup": "GID_PULL", "topic": TOPIC, "queueId": 0,
                                              "queueOffset": low, "maxMsgNums": 4, "sysFlag": 0})
    assert (kept.code, int(kept.ext["nextBeginOffset"])) == (wire.SUCCESS, low + 4) and kept.body
    stats = wire.loads(call(remoting, wire.GET_TOPIC_STATS_INFO, {"topic": TOPIC}).body)["offsetTable"]
    assert sorted(int(q["minOffset"]) for q in stats.values()) \
        == sorted(q.min_offset for q in lab_offsets(stubs).values())
    # v2 PullMessage: ILLEGAL_OFFSET, then the corrected next offset.
    out = list(stubs.v2.PullMessage(svc.PullMessageRequest(group=v2.Resource(name="GID_PULL"),
                                                           message_queue=v2_queue(0), offset=0, batch_size=4),
                                    metadata=stubs.md))
    assert out[0].status.code == Code.ILLEGAL_OFFSET and out[-1].next_offset == low
    # From there on: the oldest kept message.
    found = stubs.admin.PullBatch(lab.PullBatchRequest(group="GID_PULL", queue=ref, offset=low, max_messages=4),
                                  metadata=stubs.md)
    assert found.pull_status == lab.FOUND and found.messages[0].queue_offset == low


async def test_consumers_behind_and_new_groups_start_at_the_oldest_kept_message(filled):
    broker, stubs, sent = filled
    await async_wait_until(lambda: settled(broker), timeout=20, message="retention caught up")
    low = {qid: q.min_offset for qid, q in lab_offsets(stubs).items()}
    behind, fresh = Log(), Log()
    # GID_BEHIND committed 5 before the deletion; GID_FRESH is new, from the first offset.
    consumers = [push(broker.address, "GID_BEHIND", TOPIC, "behind", behind.listener("behind")),
                 push(broker.address, "GID_FRESH", TOPIC, "fresh", fresh.listener("fresh"),
                      consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)]
    try:
        for c in consumers:
            await c.start()
        for log in (behind, fresh):
            await async_wait_until(lambda: len(log.consumed()) >= sum(sent[q] - low[q] for q in range(4)),
                                   timeout=60, message="every kept message consumed")
            for qid in FULL_QUEUES:
                offsets = sorted(o for _, _, o, _ in log.consumed(label=f"broker-a:{qid}"))
                assert offsets == list(range(low[qid], sent[qid]))   # from the oldest kept, no gap
    finally:
        for c in consumers:
            await c.shutdown()
    committed = lab_offsets(stubs, "GID_BEHIND")
    assert all(committed[q].committed_offset == sent[q] for q in range(4))
    # Each correction says what it skipped: from the committed 5 to the oldest kept message.
    moved = {e.queue.label: (e.from_offset, e.to_offset, e.skipped)
             for e in consumers[0].emitter.recent("offset_moved", client_id="behind", group="GID_BEHIND")}
    deleted = {f"broker-a:{q}": (5, low[q], low[q] - 5) for q in range(4) if low[q] > 5}
    assert deleted and {label: moved.get(label) for label in deleted} == deleted


def test_restart_after_deletion_recovers_the_kept_segments_and_continues_offsets(tmp_path):
    """Its own broker (the module's is shared): SIGKILL after retention, then start again."""
    broker = BrokerProcess(tmp_path, topics=[f"{TOPIC}:2"], extra_args=[
        "--retention-mb", "16", "--segment-size", str(SEGMENT), "--retention-interval-ms", "200"]).start()
    try:
        stubs = BrokerStubs(broker.address, "restart-test")
        asyncio.run(send_bytes(broker.address, TOPIC, [1], 10 * 100, body=100, per_call=10))
        asyncio.run(send_bytes(broker.address, TOPIC, [0], 48 << 20))
        wait_until(lambda: settled(broker, 16), timeout=20, message="retention caught up")
        before = {qid: (q.min_offset, q.max_offset) for qid, q in lab_offsets(stubs).items()}
        assert before[0][0] > 0 and before[1] == (10, 10)   # queue 1's messages went with their segment
        stubs.close()
        broker.kill()
        broker.start()
        stubs = BrokerStubs(broker.address, "restart-test")
        after = {qid: (q.min_offset, q.max_offset) for qid, q in lab_offsets(stubs).items()}
        assert after == before
        ref = lab.QueueRef(topic=TOPIC, broker_name="broker-a", queue_id=0)
        first = stubs.admin.PullBatch(lab.PullBatchRequest(group="GID_AFTER", queue=ref, offset=before[0][0],
                                                           max_messages=1), metadata=stubs.md)
        assert first.pull_status == lab.FOUND and first.messages[0].queue_offset == before[0][0]
        # New messages continue each queue's offsets, the emptied one's too.
        for qid in (0, 1):
            req = svc.SendMessageRequest()
            m = req.messages.add(body=b"after restart")
            m.topic.name = TOPIC
            m.user_properties["__QUEUE"] = f"broker-a:{qid}"
            resp = stubs.v2.SendMessage(req, metadata=stubs.md)
            assert (resp.status.code, resp.entries[0].offset) == (Code.OK, before[qid][1])
        stubs.close()
    finally:
        broker.stop()


def test_retention_hours_deletes_segments_last_written_longer_ago(tmp_path):
    """--retention-hours takes fractions: 0.0002 h (0.72 s) ages a segment out soon after
    it was written; only the segment being written stays."""
    broker = BrokerProcess(tmp_path, topics=[f"{TOPIC}:1"], extra_args=[
        "--retention-hours", "0.0002", "--segment-size", str(SEGMENT), "--retention-interval-ms", "200"]).start()
    try:
        stubs = BrokerStubs(broker.address, "age-test")
        sent = asyncio.run(send_bytes(broker.address, TOPIC, [0], 24 << 20))[0]
        segments = lambda: sorted((tmp_path / "commitlog").iterdir())  # noqa: E731
        wait_until(lambda: len(segments()) == 1, timeout=20, message="every segment but the current one aged out")
        q = lab_offsets(stubs)[0]
        assert 0 < q.min_offset < q.max_offset == sent
        assert deleted_entries(broker.proc.pid, tmp_path) == []
        stubs.close()
    finally:
        broker.stop()
