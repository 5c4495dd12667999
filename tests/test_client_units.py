"""Unit tests of the client's pieces, with fakes (no broker)."""
import asyncio
import types

import pytest

from consumers_app.client.config import MessageModel, PopConsumerConfig, PushConsumerConfig
from consumers_app.client.consume_service import _ListenerTimer
from consumers_app.client.flow_control import MiB, check_lite, check_push, per_queue_threshold
from consumers_app.client.message import MessageExt
from consumers_app.client.offset_store import LocalFileOffsetStore, ReadOffsetType, RemoteBrokerOffsetStore
from consumers_app.client.process_queue import ProcessQueue
from consumers_app.client.rebalance import RebalanceImpl, RebalanceService, allocate, diff_assignment
from consumers_app.allocate import get_strategy
from consumers_app.message_queue import MessageQueue
from consumers_app.protocol import lab
from tests.support import async_wait_until

pytestmark = pytest.mark.unit   # lane: in-process, whatever the file name says

MQ = MessageQueue("T", "broker-a", 0)


def msgs(offsets, size=100):
    return [MessageExt(lab.LabMessage(queue_offset=o, body=b"x" * size), MQ) for o in offsets]


# ---------------------------------------------------------------- ProcessQueue


def test_process_queue_accounting():
    pq = ProcessQueue()
    assert pq.remove_messages([1]) == -1  # empty cache: nothing to commit
    assert pq.put_messages(msgs(range(10, 20))) is True  # first put dispatches
    assert pq.put_messages(msgs(range(20, 25))) is False  # already consuming
    assert (pq.msg_count, pq.msg_size, pq.max_span) == (15, 1500, 14)
    pq.put_messages(msgs([24]))  # duplicate offset: not counted twice
    assert pq.msg_count == 15
    # Consuming out of order: the commit offset stays at the lowest cached offset.
    assert pq.remove_messages([12, 13]) == 10
    assert pq.remove_messages([10, 11]) == 14
    assert (pq.msg_count, pq.msg_size, pq.max_span) == (11, 1100, 10)
    assert pq.remove_messages(range(14, 25)) == 25  # all consumed: queueOffsetMax + 1
    assert (pq.msg_count, pq.msg_size, pq.max_span) == (0, 0, 0)


def test_process_queue_orderly_take_commit_and_again():
    pq = ProcessQueue()
    pq.put_messages(msgs(range(0, 5)))
    taken = pq.take_messages(2)
    assert [m.queue_offset for m in taken] == [0, 1]
    assert pq.commit() == 2 and pq.msg_count == 3
    taken = pq.take_messages(2)
    pq.make_message_to_consume_again(taken)  # failure: back at the front, in order
    assert [m.queue_offset for m in pq.take_messages(10)] == [2, 3, 4]
    assert pq.commit() == 5 and pq.msg_count == 0
    assert pq.take_messages(1) == [] and pq.consuming is False


# ---------------------------------------------------------------- flow control


def test_push_flow_control_order_and_reasons():
    pq = ProcessQueue()
    pq.put_messages(msgs(range(0, 11), size=10))
    assert check_push(pq, 10, 100, 2000, orderly=False).reason == "count"
    assert check_push(pq, 11, 100, 2000, orderly=False) is None
    big = ProcessQueue()
    big.put_messages(msgs([0, 1], size=MiB))
    fc = check_push(big, 1000, 1, 2000, orderly=False)
    assert (fc.reason, fc.threshold, fc.value) == ("size", 1, 2)
    span = ProcessQueue()
    span.put_messages(msgs([0, 5000]))
    assert check_push(span, 1000, 100, 2000, orderly=False).reason == "span"
    assert check_push(span, 1000, 100, 2000, orderly=True) is None  # span is concurrently-only


def test_lite_flow_control_all_first():
    pq = ProcessQueue()
    pq.put_messages(msgs(range(0, 3)))
    assert check_lite(11, 10, 100, pq, 1000, 100, 2000).reason == "all"
    assert check_lite(10, 10, 100, pq, 1000, 100, 2000) is None
    assert check_lite(0, 10, 100, pq, 2, 100, 2000).reason == "count"
    assert check_lite(0, 10, 100, pq, 1000, 100, 1).reason == "span"


def test_topic_threshold_split():
    assert per_queue_threshold(-1, 1000, 4) == 1000
    assert per_queue_threshold(100, 1000, 4) == 25
    assert per_queue_threshold(3, 1000, 4) == 1


def test_config_defaults_are_rocketmq_defaults():
    c = PushConsumerConfig()
    assert (c.pull_threshold_for_queue, c.pull_threshold_size_for_queue_mib, c.consume_concurrently_max_span,
            c.pull_batch_size, c.rebalance_wait_interval_ms, c.rebalance_min_interval_ms,
            c.broker_suspend_max_time_ms, c.persist_consumer_offset_interval_ms) == \
        (1000, 100, 2000, 32, 20_000, 1_000, 15_000, 5_000)
    assert (c.pull_time_delay_ms_when_cache_flow_control, c.pull_time_delay_ms_when_broker_flow_control,
            c.pull_time_delay_ms_when_exception) == (50, 20, 1000)
    assert c.effective_max_reconsume_times(False) == 16
    assert c.effective_max_reconsume_times(True) == 2**31 - 1
    assert PopConsumerConfig(invisible_time_ms=1000).effective_invisible_time_ms() == 60_000
    assert PopConsumerConfig(invisible_time_ms=7000).effective_invisible_time_ms() == 7000


def test_listener_timer_amortises_fast_listeners_only():
    t = _ListenerTimer()
    assert t.chunk(2.0, 32) == 32
    for _ in range(50):
        t.observe(0.000_002 * 32, 32)  # 2 us per message
    assert t.chunk(2.0, 32) == 32
    for _ in range(50):
        t.observe(0.010, 1)  # 10 ms per message: one per task
    assert t.chunk(2.0, 32) == 1


# ---------------------------------------------------------------- offset stores


class FakeConnection:
    def __init__(self):
        self.updates = []
        self.metadata = ()
        outer = self

        class V2:
            async def UpdateOffset(self, req, metadata=None, timeout=None):
                outer.updates.append((req.message_queue.id, req.offset))
                return types.SimpleNamespace(status=types.SimpleNamespace(code=20000, message=""))

        self.v2 = V2()


async def test_remote_offset_store_persists_changed_offsets_of_owned_queues():
    conn = FakeConnection()
    store = RemoteBrokerOffsetStore("G", conn)
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    store.update_offset(q0, 10, True)
    store.update_offset(q0, 5, True)  # increase-only ignores going back
    assert store.read_memory(q0) == 10
    store.update_offset(q0, 5, False)
    assert await store.read_offset(q0, ReadOffsetType.MEMORY) == 5
    store.update_offset(q1, 7, False)
    await store.persist_all([q0])
    assert conn.updates == [(0, 5)]
    assert q1 not in store.table  # no longer ours: forgotten
    await store.persist_all([q0])
    assert conn.updates == [(0, 5)]  # unchanged since: not sent again


async def test_local_offset_store_round_trip(tmp_path):
    store = LocalFileOffsetStore("G", "c1", str(tmp_path))
    store.update_offset(MQ, 42, False)
    await store.persist_all([MQ])
    again = LocalFileOffsetStore("G", "c1", str(tmp_path))
    await again.load()
    assert await again.read_offset(MQ, ReadOffsetType.STORE) == 42
    assert await LocalFileOffsetStore("G", "c2", str(tmp_path)).read_offset(MQ) == -1


# ---------------------------------------------------------------- rebalance


def test_diff_and_sorting_like_java():
    a = [MessageQueue("T", "b", i) for i in range(4)]
    assert diff_assignment(a[:2], a[1:3]) == ([a[2]], [a[0]])
    # Ids sort as Java strings: "c10" < "c2"; queue order is MessageQueue order.
    strategy = get_strategy("AVG")
    mine = allocate(strategy, "G", "c10", list(reversed(a)), ["c2", "c10"])
    assert mine == a[:2]


class FakeConsumer:
    def __init__(self, client_id, members, queues, orderly=False, lockable=None):
        self.group = "G"
        self.topic = "T"
        self.client_id = client_id
        self.message_model = MessageModel.CLUSTERING
        self.orderly = orderly
        self.subscriptions = {"T": "*"}
        self.topic_queues = {"T": queues}
        self._members = members
        self.lockable = lockable
        self.events = []
        self.removed = []
        self.added = []

    def emit(self, type, **fields):
        self.events.append((type, fields))

    def emit_assignment(self, reason):
        self.events.append(("assignment", {"reason": reason}))

    async def list_members(self):
        return list(self._members)

    async def compute_pull_from_where(self, topic, mqs):
        return {mq: 0 for mq in mqs}

    def create_process_queue(self, mq):
        return ProcessQueue()

    def is_pull_expired(self, pq):
        return False

    async def remove_unnecessary(self, mq, pq):
        self.removed.append(mq)
        return True

    async def lock(self, mq):
        return self.lockable is None or mq in self.lockable

    def on_queues_added(self, new):
        self.added += [mq for mq, _, _ in new]

    def on_queues_changed(self, topic, mq_all, mine):
        pass


async def test_rebalance_adds_and_drops_queues():
    queues = [MessageQueue("T", "b", i) for i in range(6)]
    c = FakeConsumer("c1", ["c1"], queues)
    impl = RebalanceImpl(c)
    assert await impl.do_rebalance("start") is True
    assert impl.assignments == queues
    old = dict(impl.process_queue_table)
    c._members = ["c1", "c2"]
    await impl.do_rebalance("joined")
    assert impl.assignments == queues[:3]
    assert c.removed == queues[3:]
    assert all(old[mq].dropped for mq in queues[3:])  # the pull loop and consume results stop
    assert not any(old[mq].dropped for mq in queues[:3])
    end = [f for t, f in c.events if t == "rebalance" and f["phase"] == "end"][-1]
    assert end["removed"] == queues[3:] and end["added"] == []   # MessageQueues until written out


async def test_orderly_rebalance_skips_unlockable_queue_and_reports_unbalanced():
    queues = [MessageQueue("T", "b", i) for i in range(2)]
    c = FakeConsumer("c1", ["c1"], queues, orderly=True, lockable={queues[0]})
    impl = RebalanceImpl(c)
    assert await impl.do_rebalance("start") is False  # RebalanceService retries at minInterval
    assert impl.assignments == [queues[0]]
    c.lockable = None
    assert await impl.do_rebalance("periodic") is True
    assert impl.assignments == queues


async def test_rebalance_service_runs_on_wakeup():
    runs = []

    async def rebalance():
        runs.append(1)
        return True

    service = RebalanceService(rebalance, wait_interval_ms=600_000, min_interval_ms=0)
    task = asyncio.get_running_loop().create_task(service.run())
    try:
        service.wakeup()
        await async_wait_until(lambda: len(runs) == 1, message="first run")
        service.wakeup()
        await async_wait_until(lambda: len(runs) == 2, message="run on wakeup")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_removed_queue_offset_sent_only_when_the_broker_lacks_it():
    from consumers_app.client import PushConsumer

    conn = FakeConnection()
    c = PushConsumer("G", "T", config=PushConsumerConfig(endpoints="unused:0"))
    c.offset_store = RemoteBrokerOffsetStore("G", conn)
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    c.offset_store.update_offset(q0, 10, False)
    c.offset_store.mark_persisted(q0, 10)  # e.g. read from the broker, or piggy-backed on a pull
    c.offset_store.update_offset(q1, 7, False)  # consumed since the last persist
    for mq in (q0, q1):
        assert await c.remove_unnecessary(mq, ProcessQueue()) is True
        assert mq not in c.offset_store.table
    await asyncio.gather(*list(c._tasks))
    assert conn.updates == [(1, 7)]  # the dirty one only, even though the table forgot both


async def test_rebalance_follows_route_changes_with_its_sorted_cache():
    queues = [MessageQueue("T", "b", i) for i in range(6)]
    c = FakeConsumer("c1", ["c1", "c2"], queues)
    impl = RebalanceImpl(c)
    await impl.do_rebalance("start")
    assert impl.assignments == queues[:3]
    c.topic_queues = {"T": queues + [MessageQueue("T", "b", 6), MessageQueue("T", "b", 7)]}  # route grew
    await impl.do_rebalance("route")
    assert impl.assignments == [MessageQueue("T", "b", i) for i in range(4)]
    c.topic_queues["T"].pop()  # even edited in place
    c.topic_queues["T"].pop()
    c._members = ["c0", "c1", "c2"]
    await impl.do_rebalance("joined")
    assert impl.assignments == queues[2:4]


async def test_clients_of_one_topic_share_its_queue_objects():
    """Every client's route holds the process's one MessageQueue per queue (not a copy each:
    128 consumers of 1,024 queues held 131k), equal and ordered as before."""
    from consumers_app.client.base import ConsumerBase
    from consumers_app.protocol import v2, v2_service

    class V2:
        async def QueryRoute(self, req, metadata=None, timeout=None):
            resp = v2_service.QueryRouteResponse(status=v2.Status(code=v2.Code.OK))
            for i in (2, 0, 1):
                resp.message_queues.add(topic=v2.Resource(name="T"), id=i, broker=v2.Broker(name="b"),
                                        permission=v2.Permission.READ_WRITE)
            return resp

    def client():
        return types.SimpleNamespace(connection=types.SimpleNamespace(v2=V2(), metadata=()),
                                     _timeout=lambda: 3.0, topic_queues={})

    first, second = [await ConsumerBase.query_route(client(), "T") for _ in range(2)]
    assert first == [MessageQueue("T", "b", i) for i in range(3)]
    assert all(a is b for a, b in zip(first, second)) and len(second) == 3


async def test_fetch_offsets_asks_and_decodes_only_the_asked_queues():
    asked = []

    class Lab:
        async def GetQueueOffsets(self, req, metadata=None, timeout=None):
            asked.append([(q.topic, q.broker_name, q.queue_id) for q in req.queues])
            # answers for the whole topic, as an adapter may: the store still picks its rows
            resp = lab.QueueOffsetsResponse(status=lab.Status(code=20000))
            for i in range(8):
                resp.queues.add(queue=lab.QueueRef(topic="T", broker_name="b", queue_id=i),
                                committed_offset=i * 10 - 1 if i else -1, min_offset=0, max_offset=100 + i)
            return resp

    conn = types.SimpleNamespace(lab=Lab(), metadata=())
    store = RemoteBrokerOffsetStore("G", conn)
    q = [MessageQueue("T", "b", i) for i in range(8)]
    everything = await store.fetch_offsets("T")
    assert len(everything) == 8 and everything[q[3]] == (29, 0, 103)
    some = await store.fetch_offsets("T", [q[0], q[3], MessageQueue("T", "other", 3)])
    assert some == {q[0]: (-1, 0, 100), q[3]: (29, 0, 103)}
    assert asked == [[], [("T", "b", 0), ("T", "b", 3), ("T", "other", 3)]]
    assert await store.fetch_offsets("T", [MessageQueue("U", "b", 0)]) == {} and len(asked) == 2


async def test_fetch_offsets_asks_on_the_open_session_else_by_a_call():
    from consumers_app.client.session import SessionClosed

    row = lab.QueueOffsetsResponse(status=lab.Status(code=20000))
    row.queues.add(queue=lab.QueueRef(topic="T", broker_name="b", queue_id=1), committed_offset=5, max_offset=9)
    calls, on_session = [], []

    class Lab:
        async def GetQueueOffsets(self, req, metadata=None, timeout=None):
            calls.append(req)
            return row

    class Session:
        usable = True
        ended = False

        async def queue_offsets(self, req, timeout):
            if self.ended:
                raise SessionClosed("ended meanwhile")
            on_session.append(req)
            return row

    session = Session()
    store = RemoteBrokerOffsetStore("G", types.SimpleNamespace(lab=Lab(), metadata=()), session=session)
    mq = MessageQueue("T", "b", 1)
    assert await store.fetch_offsets("T", [mq]) == {mq: (5, 0, 9)}
    assert (len(on_session), len(calls)) == (1, 0)
    session.ended = True          # the stream ended between the check and the request
    assert await store.fetch_offsets("T", [mq]) == {mq: (5, 0, 9)}
    session.usable = False        # closed (or the network cut): a call of its own
    assert await store.fetch_offsets("T", [mq]) == {mq: (5, 0, 9)}
    assert (len(on_session), len(calls)) == (1, 2)


async def test_a_request_cancelled_on_the_session_never_cancels_the_stream():
    """gRPC ends a whole stream when one of its writes is cancelled (checked against the
    broker: StatusCode.CANCELLED), so a pull cancelled at shutdown must not be writing: the
    stream would close before the goodbye and the broker would read 'closed', not 'left'.
    Answers still come back by id, whatever order they come in."""
    from consumers_app.client.session import MemberSession

    class Stream:
        """A session stream whose writes wait for ``gate``; cancelling one cancels us."""
        def __init__(self):
            self.cancelled = False
            self.gate = asyncio.Event()
            self.gate.set()
            self.writing = 0          # writes begun
            self.written: list = []
            self.incoming: asyncio.Queue = asyncio.Queue()

        async def write(self, request):
            self.writing += 1
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            self.written.append(request)

        def cancel(self):
            self.cancelled = True

        def __aiter__(self):
            return self

        async def __anext__(self):
            return await self.incoming.get()

    stream = Stream()
    conn = types.SimpleNamespace(lab=types.SimpleNamespace(Session=lambda metadata: stream), metadata=(),
                                 network=types.SimpleNamespace(active=False))
    session = MemberSession(conn, "G")
    watching = asyncio.ensure_future(anext(session.changes()))
    await async_wait_until(lambda: session.usable, timeout=5, message="the session open")

    stream.gate.clear()           # the next write stays under way until we let it go
    pulls = [asyncio.ensure_future(session.pull(lab.PullBatchRequest(offset=o), timeout=5)) for o in (1, 2, 3)]
    await async_wait_until(lambda: stream.writing >= 2, timeout=5, message="the first pull being written")
    pulls[0].cancel()             # as a consumer's shutdown cancels its pull tasks
    stream.gate.set()
    await async_wait_until(lambda: len(stream.written) == 4, timeout=5, message="every request written")
    assert not stream.cancelled
    assert [r.pull.offset for r in stream.written[1:]] == [1, 2, 3]
    ids = {r.pull.offset: r.id for r in stream.written[1:]}
    for offset in (3, 2):         # answered out of order, as held pulls are
        stream.incoming.put_nowait(lab.SessionMessage(id=ids[offset], pull=lab.PullBatchResponse(next_begin_offset=offset)))
    assert [(await p).next_begin_offset for p in pulls[1:]] == [2, 3]
    assert pulls[0].cancelled()
    watching.cancel()
