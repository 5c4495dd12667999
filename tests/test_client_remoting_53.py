"""Our remoting clients as a RocketMQ 5.3 broker sees them (issue 24), against the real
broker over remoting. Each test names the Java class and method of rocketmq-all-5.3.3 it
follows.

A ``Tap`` sits between our client and the real name server / broker: it passes every
frame on unchanged, keeps the requests our client sent (to check what goes over the
wire), and can answer a chosen request with an error code (SYSTEM_BUSY, SYSTEM_ERROR) in
place of the broker, as a loaded 5.3 broker does.
"""
import asyncio
import time
from collections import Counter

import pytest

from consumers_app.client import (ConsumeFromWhere, ConsumeResult, LitePullConsumer, LitePullConsumerConfig,
                                  PushConsumer, PushConsumerConfig)
from consumers_app.events import EventEmitter
from consumers_app.message_queue import MessageQueue
from consumers_app.remoting import wire
from consumers_app.remoting.codec import MAX_FRAME, decode, encode, response
from tests.brokers import BrokerProcess
from tests.remoting_peers import call
from tests.support import async_wait_until, produce, wait_until

V5_3_3 = 479   # MQVersion.Version.V5_3_3.ordinal(), counted in common/MQVersion.java
TOPIC = "Topic53"
OFFSETS = "Offsets53"
ORDERLY = "Orderly53"
AGED = "Aged53"


# ---------------------------------------------------------------------------- the tap

class Tap:
    """A frame relay to ``target`` that records our requests and can fail answers."""

    def __init__(self, target: str, rewrite: tuple[bytes, bytes] | None = None):
        self.target = target
        self.rewrite = rewrite            # (old, new) bytes replaced in answer bodies
        self.requests = []                # (monotonic time, Command) of every request we sent
        self.answers = []                 # (monotonic time, request Command, answer code)
        self._failures = []               # [code, times left, predicate, answer code]
        self._server = None
        self._tasks = set()

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    def fail(self, code: int, times: int, answer: int = wire.SYSTEM_BUSY, when=lambda cmd: True) -> None:
        """Answer the next ``times`` requests ``code`` (matching ``when``) with ``answer``."""
        self._failures.append([code, times, when, answer])

    def sent(self, code: int, when=lambda cmd: True) -> list:
        return [cmd for _, cmd in self.requests if cmd.code == code and when(cmd)]

    async def start(self) -> "Tap":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_FRAME + 8)
        return self

    async def close(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _failure_for(self, cmd):
        for failure in self._failures:
            if failure[0] == cmd.code and failure[1] > 0 and failure[2](cmd):
                failure[1] -= 1
                return failure[3]
        return None

    async def _serve(self, reader, writer) -> None:
        host, _, port = self.target.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port), limit=MAX_FRAME + 8)
        asked: dict[int, object] = {}   # opaque -> our request

        async def ours():
            while True:
                n = int.from_bytes(await reader.readexactly(4), "big")
                raw = await reader.readexactly(n)
                cmd = decode(raw)
                if not cmd.is_response:
                    self.requests.append((time.monotonic(), cmd))
                    error = self._failure_for(cmd)
                    if error is not None:   # answered here, in the broker's place
                        self.answers.append((time.monotonic(), cmd, error))
                        writer.write(encode(response(cmd, error, f"tap: answered {error}")))
                        continue
                    asked[cmd.opaque] = cmd
                up_writer.write(n.to_bytes(4, "big") + raw)

        async def theirs():
            while True:
                n = int.from_bytes(await up_reader.readexactly(4), "big")
                raw = await up_reader.readexactly(n)
                cmd = decode(raw)
                request = asked.pop(cmd.opaque, None) if cmd.is_response else None
                if request is not None:
                    self.answers.append((time.monotonic(), request, cmd.code))
                if self.rewrite and self.rewrite[0] in cmd.body:
                    cmd.body = cmd.body.replace(*self.rewrite)
                    writer.write(encode(cmd))
                else:
                    writer.write(n.to_bytes(4, "big") + raw)

        tasks = [asyncio.ensure_future(ours()), asyncio.ensure_future(theirs())]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            for t in tasks:
                t.cancel()
                self._tasks.discard(t)
            writer.close()
            up_writer.close()


class Taps:
    """A tap on the name server and one on the broker; routes name the broker's tap."""

    def __init__(self, broker: BrokerProcess):
        self.broker_address = f"127.0.0.1:{broker.remoting_port}"
        self.broker = Tap(self.broker_address)
        self.namesrv = None
        self._namesrv_target = broker.namesrv

    async def __aenter__(self) -> "Taps":
        await self.broker.start()
        self.namesrv = await Tap(self._namesrv_target,
                                 (self.broker_address.encode(), self.broker.address.encode())).start()
        return self

    async def __aexit__(self, *exc):
        await self.namesrv.close()
        await self.broker.close()


def queue_id(cmd) -> int:
    return int(cmd.ext.get("queueId", -1))


# ---------------------------------------------------------------------------- brokers

@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("remote-53"), remoting=True,
                       topics=[f"{TOPIC}:4", f"{OFFSETS}:8", f"{ORDERLY}:2"],
                       extra_args=["--client-expiry-ms", "3000", "--client-scan-ms", "250"]) as b:
        yield b


@pytest.fixture(scope="module")
def aged(tmp_path_factory):
    """Retention by age (0.72 s) over 128 KiB segments: after 800 messages of 1 KiB every
    segment but the one being written is gone, so each queue's min offset is > 0."""
    b = BrokerProcess(tmp_path_factory.mktemp("remote-53-aged"), remoting=True, topics=[f"{AGED}:4"],
                      extra_args=["--retention-hours", "0.0002", "--segment-size", str(128 << 10),
                                  "--max-body-size", str(16 << 10), "--retention-interval-ms", "200"]).start()
    try:
        asyncio.run(produce(b.address, AGED, 800, batch=50))
        # Settled: only the segment being written is left, so min offsets stay where they are.
        wait_until(lambda: len(list((b.data_dir / "commitlog").iterdir())) == 1, timeout=30,
                   message="every segment but the current one aged out")
        remoting = f"127.0.0.1:{b.remoting_port}"
        assert all(0 < min_offset(remoting, AGED, q) for q in range(4))
        yield b
    finally:
        b.stop()


def min_offset(remoting: str, topic: str, qid: int) -> int:
    return int(call(remoting, wire.GET_MIN_OFFSET, {"topic": topic, "queueId": qid}).ext["offset"])


def max_offset(remoting: str, topic: str, qid: int) -> int:
    return int(call(remoting, wire.GET_MAX_OFFSET, {"topic": topic, "queueId": qid}).ext["offset"])


def committed(remoting: str, group: str, topic: str, qid: int):
    answer = call(remoting, wire.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": qid})
    return int(answer.ext["offset"]) if answer.code == wire.SUCCESS else None


class Seen:
    """Every message the listener got: (queue id, queue offset)."""

    def __init__(self):
        self.offsets: Counter = Counter()

    def listener(self, msgs):
        for m in msgs:
            self.offsets[(m.queue.queue_id, m.queue_offset)] += 1
        return ConsumeResult.SUCCESS

    def of(self, qid: int) -> list[int]:
        return sorted(o for q, o in self.offsets if q == qid)


def push(namesrv: str, group: str, topic: str, listener, emitter=None, orderly=False, tags="*", **overrides):
    settings = dict(namesrv=namesrv, heartbeat_interval_ms=500, poll_name_server_interval_ms=1000,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    settings.update(overrides)
    return PushConsumer(group, topic, listener, PushConsumerConfig(**settings), emitter=emitter,
                        orderly=orderly, tag_expression=tags)


def held(consumer, topic) -> set[int]:
    return {mq.queue_id for mq, pq in consumer.rebalance_impl.process_queue_table.items()
            if mq.topic == topic and not pq.dropped}


async def ask(address: str, code: int, ext: dict):
    """One request on our own loop (the broker may forward it to a client on this loop)."""
    from consumers_app.remoting.client import RemotingClient
    client = await RemotingClient.connect(address)
    try:
        return await client.request(code, ext, timeout=10)
    finally:
        await client.close()


# ---------------------------------------------------------------------------- the tests

async def test_every_request_announces_5_3_3_and_python_and_every_pull_carries_both_offsets(broker):
    """RemotingCommand.createRequestCommand stamps MQVersion.CURRENT_VERSION (V5_3_3) and the
    client's LanguageCode on every request; PullAPIWrapper.pullKernelImpl always fills
    PullMessageRequestHeader's commitOffset and suspendTimeoutMillis (the lite pull's
    commitOffset is 0, DefaultLitePullConsumerImpl.pull)."""
    from consumers_app.client import Producer, ProducerConfig
    await produce(broker.address, TOPIC, 40, batch=20)
    async with Taps(broker) as taps:
        pushed, polled = Seen(), Counter()
        ours = push(taps.namesrv.address, "GID_53_VERSION", TOPIC, pushed.listener,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        lite = LitePullConsumer("GID_53_VERSION_LITE", TOPIC, config=LitePullConsumerConfig(
            namesrv=taps.namesrv.address, heartbeat_interval_ms=500,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET))
        producer = Producer(ProducerConfig(namesrv=taps.namesrv.address, topic=TOPIC, batch_size=1))
        await ours.start()
        await lite.start()
        await producer.start()
        try:
            await producer.send_batch(1)
            await producer.send_batch(3)

            async def polled_all():
                for m in await lite.poll(200):
                    polled[m.message_id] += 1
                return len(polled) >= 44
            await async_wait_until(lambda: len(pushed.offsets) >= 44, timeout=30, message="push got all 44")
            await async_wait_until(polled_all, timeout=30, message="lite pull polled all 44")
            # The broker keeps what the heartbeat announced: mqadmin's consumerConnection shows it.
            connections = wire.loads((await ask(taps.broker_address, wire.GET_CONSUMER_CONNECTION_LIST,
                                                {"consumerGroup": "GID_53_VERSION"})).body)
            assert [(c["language"], int(c["version"])) for c in connections["connectionSet"]] == [("PYTHON", V5_3_3)]
        finally:
            await producer.shutdown()
            await lite.shutdown()
            await ours.shutdown()
    requests = [cmd for _, cmd in taps.namesrv.requests + taps.broker.requests]
    codes = {cmd.code for cmd in requests}
    assert {wire.GET_ROUTEINFO_BY_TOPIC, wire.HEART_BEAT, wire.PULL_MESSAGE, wire.SEND_MESSAGE_V2,
            wire.SEND_BATCH_MESSAGE, wire.QUERY_CONSUMER_OFFSET, wire.UPDATE_CONSUMER_OFFSET,
            wire.UNREGISTER_CLIENT} <= codes
    assert {(cmd.language, cmd.version) for cmd in requests} == {("PYTHON", V5_3_3)}
    pulls = taps.broker.sent(wire.PULL_MESSAGE)
    by_group = {group: [p for p in pulls if p.ext["consumerGroup"] == group]
                for group in ("GID_53_VERSION", "GID_53_VERSION_LITE")}
    assert all(by_group.values())
    for group, group_pulls in by_group.items():
        for p in group_pulls:
            assert "commitOffset" in p.ext and "suspendTimeoutMillis" in p.ext, (group, p.ext)
            flags = int(p.ext["sysFlag"])
            assert bool(flags & wire.PULL_COMMIT_OFFSET) == (int(p.ext["commitOffset"]) > 0)
            assert int(p.ext["suspendTimeoutMillis"]) > 0 and flags & wire.PULL_SUSPEND
    assert {int(p.ext["commitOffset"]) for p in by_group["GID_53_VERSION_LITE"]} == {0}
    assert any(int(p.ext["commitOffset"]) > 0 for p in by_group["GID_53_VERSION"])   # the piggyback


async def test_heartbeats_carry_javas_subscription_data_with_a_sub_version_that_moves_only_on_resubscribe(broker):
    """FilterAPI.buildSubscriptionData: tags split on ``||`` and trimmed, codeSet their
    String.hashCode(), ``*`` empty sets; SubscriptionData.subVersion is stamped when the
    subscription is built, so heartbeats repeat it until the consumer subscribes anew
    (and a push pull carries it, DefaultMQPushConsumerImpl.pullMessage)."""
    async with Taps(broker) as taps:
        ours = push(taps.namesrv.address, "GID_53_SUBS", TOPIC, Seen().listener, tags="TagA || TagB")
        lite = LitePullConsumer("GID_53_SUBS_LITE", TOPIC, config=LitePullConsumerConfig(
            namesrv=taps.namesrv.address, heartbeat_interval_ms=500), tag_expression="TagA")
        await ours.start()
        await lite.start()

        def heartbeats(group):
            out = []
            for cmd in taps.broker.sent(wire.HEART_BEAT):
                for data in wire.loads(cmd.body)["consumerDataSet"]:
                    if data["groupName"] == group:
                        out.append({s["topic"]: s for s in data["subscriptionDataSet"]})
            return out
        try:
            await async_wait_until(lambda: len(heartbeats("GID_53_SUBS")) >= 3 and len(heartbeats("GID_53_SUBS_LITE")) >= 3,
                                   timeout=20, message="three heartbeats of each")
            await async_wait_until(lambda: taps.broker.sent(wire.PULL_MESSAGE,
                                                            lambda c: c.ext["consumerGroup"] == "GID_53_SUBS"),
                                   timeout=20, message="a pull of the push consumer")
            lite.subscribe(TOPIC, "TagC")
            await async_wait_until(lambda: heartbeats("GID_53_SUBS_LITE")[-1][TOPIC]["subString"] == "TagC",
                                   timeout=20, message="the new subscription heartbeated")
        finally:
            await lite.shutdown()
            await ours.shutdown()
    beats = heartbeats("GID_53_SUBS")
    first = beats[0][TOPIC]
    assert {k: first[k] for k in ("topic", "subString", "expressionType", "classFilterMode")} == {
        "topic": TOPIC, "subString": "TagA || TagB", "expressionType": "TAG", "classFilterMode": False}
    assert sorted(first["tagsSet"]) == ["TagA", "TagB"]
    assert sorted(first["codeSet"]) == [2598919, 2598920]   # "TagA".hashCode(), "TagB".hashCode()
    retry = beats[0]["%RETRY%GID_53_SUBS"]
    assert (retry["subString"], retry["tagsSet"], retry["codeSet"]) == ("*", [], [])
    assert len({b[TOPIC]["subVersion"] for b in beats}) == 1          # the same on every heartbeat
    pulls = taps.broker.sent(wire.PULL_MESSAGE, lambda c: c.ext["consumerGroup"] == "GID_53_SUBS"
                             and c.ext["topic"] == TOPIC)
    assert {int(p.ext["subVersion"]) for p in pulls} == {first["subVersion"]}
    lite_beats = [b[TOPIC] for b in heartbeats("GID_53_SUBS_LITE")]
    versions = {}
    for s in lite_beats:
        versions.setdefault(s["subString"], set()).add(s["subVersion"])
    assert set(versions) == {"TagA", "TagC"} and all(len(v) == 1 for v in versions.values())
    assert versions["TagC"].pop() > versions["TagA"].pop()           # re-subscribing moves it
    assert [s["codeSet"] for s in lite_beats if s["subString"] == "TagC"][0] == [2598921]


async def test_running_info_has_wall_clock_process_queue_times_and_javas_properties(broker):
    """DefaultMQPushConsumerImpl.consumerRunningInfo (+ MQClientInstance.consumerRunningInfo,
    ProcessQueue.fillProcessQueueInfo): PROP_CONSUMER_START_TIMESTAMP, the thread pool,
    orderly, consume type, name server ``addr;`` and client version; ProcessQueue times are
    System.currentTimeMillis(), so ConsumerRunningInfo.analyzeSubscription can read them."""
    before = time.time_ns() // 1_000_000
    ours = push(broker.namesrv, "GID_53_INFO", TOPIC, Seen().listener)
    await ours.start()
    started = time.time_ns() // 1_000_000
    try:
        await async_wait_until(lambda: len(held(ours, TOPIC)) == 4, timeout=20, message="all 4 queues")
        answer = await ask(f"127.0.0.1:{broker.remoting_port}", wire.GET_CONSUMER_RUNNING_INFO,
                           {"consumerGroup": "GID_53_INFO", "clientId": ours.client_id})
        asked = time.time_ns() // 1_000_000
    finally:
        await ours.shutdown()
    assert answer.code == wire.SUCCESS, answer.remark
    info = wire.loads(answer.body)
    props = info["properties"]
    assert before <= int(props["PROP_CONSUMER_START_TIMESTAMP"]) <= started
    assert {k: props[k] for k in ("PROP_CONSUME_TYPE", "PROP_CONSUMEORDERLY", "PROP_THREADPOOL_CORE_SIZE",
                                  "PROP_NAMESERVER_ADDR", "PROP_CLIENT_VERSION", "consumerGroup",
                                  "messageModel", "consumeFromWhere")} == {
        "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY", "PROP_CONSUMEORDERLY": "false", "PROP_THREADPOOL_CORE_SIZE": "20",
        "PROP_NAMESERVER_ADDR": f"{broker.namesrv};", "PROP_CLIENT_VERSION": "V5_3_3",
        "consumerGroup": "GID_53_INFO", "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET"}
    assert all(isinstance(v, str) for v in props.values())   # java.util.Properties
    rows = list(info["mqTable"].values())
    assert len(rows) == 4   # the topic's queues (%RETRY% has no route before a send-back)
    for row in rows:
        for name in ("lastPullTimestamp", "lastConsumeTimestamp", "lastLockTimestamp"):
            assert before <= row[name] <= asked, (name, row[name])
    assert {s["topic"] for s in info["subscriptionSet"]} == {TOPIC, "%RETRY%GID_53_INFO"}


async def test_a_busy_broker_s_offset_answer_skips_the_queue_for_a_round_not_to_its_end(broker):
    """RebalancePushImpl.computePullFromWhereWithException: a QUERY_CONSUMER_OFFSET that
    fails with anything but QUERY_NOT_FOUND is no "no offset" (RemoteBrokerOffsetStore.
    readOffset -> -2): the queue is not added this round (updateProcessQueueTableInRebalance,
    unbalanced) and the next round starts it at the committed offset."""
    remoting = f"127.0.0.1:{broker.remoting_port}"
    await produce(broker.address, OFFSETS, 80, batch=10)   # 10 in each queue
    ends = {q: max_offset(remoting, OFFSETS, q) for q in range(8)}
    assert all(end > 2 for end in ends.values())
    for q in range(8):   # the group consumed the first 2 of every queue
        assert call(remoting, wire.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "GID_53_BUSY", "topic": OFFSETS,
                                                            "queueId": q, "commitOffset": 2}).code == wire.SUCCESS
    seen, emitter = Seen(), EventEmitter()
    async with Taps(broker) as taps:
        # Queue 3's offset: SYSTEM_BUSY twice (the topic-wide read and the one retried alone).
        taps.broker.fail(wire.QUERY_CONSUMER_OFFSET, 2, when=lambda c: c.ext["topic"] == OFFSETS and queue_id(c) == 3)
        ours = push(taps.namesrv.address, "GID_53_BUSY", OFFSETS, seen.listener, emitter=emitter)
        await ours.start()
        try:
            await async_wait_until(lambda: all(seen.of(q) == list(range(2, ends[q])) for q in range(8)),
                                   timeout=30, message="every queue from its committed offset 2")
        finally:
            await ours.shutdown()
    answers = [(cmd, code) for _, cmd, code in taps.broker.answers
               if cmd.code == wire.QUERY_CONSUMER_OFFSET and queue_id(cmd) == 3 and cmd.ext["topic"] == OFFSETS]
    assert [code for _, code in answers][:3] == [wire.SYSTEM_BUSY, wire.SYSTEM_BUSY, wire.SUCCESS]
    ends_ = [e for e in emitter.recent("rebalance", client_id=ours.client_id) if e.phase == "end"]
    first_add = next(e for e in ends_ if e.added)
    assert MessageQueue(OFFSETS, "broker-a", 3) not in first_add.added and first_add.balanced is False
    assert any(MessageQueue(OFFSETS, "broker-a", 3) in (e.added or ()) for e in ends_)
    assert not seen.of(3) or min(seen.of(3)) == 2 and all(n == 1 for n in seen.offsets.values())


async def test_a_failed_max_offset_answer_is_not_read_as_zero_while_not_found_means_no_offset(aged):
    """RebalancePushImpl.computePullFromWhereWithException, CONSUME_FROM_LAST_OFFSET: a new
    group's QUERY_CONSUMER_OFFSET answers QUERY_NOT_FOUND (no offset: start at the max), but
    a failed GET_MAX_OFFSET (MQAdminImpl.maxOffset throws) skips the queue this round; it is
    never read as offset 0 (which would replay, then skip, what retention kept)."""
    remoting = f"127.0.0.1:{aged.remoting_port}"
    ends = {q: max_offset(remoting, AGED, q) for q in range(4)}
    seen, emitter = Seen(), EventEmitter()
    async with Taps(aged) as taps:
        taps.broker.fail(wire.GET_MAX_OFFSET, 2, answer=wire.SYSTEM_ERROR, when=lambda c: queue_id(c) == 1)
        ours = push(taps.namesrv.address, "GID_53_MAXFAIL", AGED, seen.listener, emitter=emitter)
        await ours.start()
        try:
            await async_wait_until(lambda: held(ours, AGED) == {0, 1, 2, 3}, timeout=30, message="all 4 queues")
            await async_wait_until(lambda: all(committed(remoting, "GID_53_MAXFAIL", AGED, q) == ends[q]
                                               for q in range(4)), timeout=30, message="every queue started at its end")
        finally:
            await ours.shutdown()
    assert not seen.offsets   # nothing old replayed
    assert not emitter.recent("offset_moved", client_id=ours.client_id)
    codes = [code for _, cmd, code in taps.broker.answers if cmd.code == wire.GET_MAX_OFFSET and queue_id(cmd) == 1]
    assert codes[:3] == [wire.SYSTEM_ERROR, wire.SYSTEM_ERROR, wire.SUCCESS]
    not_found = {queue_id(cmd) for _, cmd, code in taps.broker.answers
                 if cmd.code == wire.QUERY_CONSUMER_OFFSET and code == wire.QUERY_NOT_FOUND}
    assert not_found == {0, 1, 2, 3}


async def test_first_offset_starts_at_zero_and_offset_illegal_recreates_the_queue_from_the_persisted_correction(aged):
    """RebalancePushImpl.computePullFromWhereWithException, CONSUME_FROM_FIRST_OFFSET: 0,
    "fixed by the OFFSET_ILLEGAL process"; DefaultMQPushConsumerImpl.pullMessage's callback,
    OFFSET_ILLEGAL: drop the ProcessQueue, updateAndFreezeOffset + persist the broker's
    nextBeginOffset, RebalanceImpl.removeProcessQueue, rebalanceImmediately - the new
    ProcessQueue reads the corrected offset back and pulls from it. The skip is reported."""
    remoting = f"127.0.0.1:{aged.remoting_port}"
    lows = {q: min_offset(remoting, AGED, q) for q in range(4)}
    ends = {q: max_offset(remoting, AGED, q) for q in range(4)}
    seen, emitter = Seen(), EventEmitter()
    async with Taps(aged) as taps:
        ours = push(taps.namesrv.address, "GID_53_FIRST", AGED, seen.listener, emitter=emitter,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        await ours.start()
        try:
            await async_wait_until(lambda: all(seen.of(q) == list(range(lows[q], ends[q])) for q in range(4)),
                                   timeout=30, message="every kept message, from each queue's min offset")
        finally:
            await ours.shutdown()
    moved = {e.queue.queue_id: (e.from_offset, e.to_offset, e.skipped)
             for e in emitter.recent("offset_moved", client_id=ours.client_id)}
    assert moved == {q: (0, lows[q], lows[q]) for q in range(4)}
    # Per queue, on the wire: pull at 0, the correction persisted, read back, pulled from.
    for q in range(4):
        trace = [(cmd.code, cmd.ext) for _, cmd in taps.broker.requests
                 if cmd.ext.get("topic") == AGED and queue_id(cmd) == q
                 and cmd.code in (wire.PULL_MESSAGE, wire.UPDATE_CONSUMER_OFFSET, wire.QUERY_CONSUMER_OFFSET)]
        pulls = [i for i, (code, _) in enumerate(trace) if code == wire.PULL_MESSAGE]
        assert int(trace[pulls[0]][1]["queueOffset"]) == 0
        fixed = next(i for i, (code, ext) in enumerate(trace)
                     if code == wire.UPDATE_CONSUMER_OFFSET and int(ext["commitOffset"]) == lows[q])
        reread = next(i for i, (code, _) in enumerate(trace) if code == wire.QUERY_CONSUMER_OFFSET and i > fixed)
        again = next(i for i in pulls if i > reread)
        assert pulls[0] < fixed and int(trace[again][1]["queueOffset"]) == lows[q], trace
    # The next rebalance reports each queue's ProcessQueue replaced (removed and added).
    ends_ = [e for e in emitter.recent("rebalance", client_id=ours.client_id) if e.phase == "end"]
    replaced = {mq.queue_id for e in ends_ for mq in (e.removed or ()) if mq in (e.added or ())}
    assert replaced == {0, 1, 2, 3}


async def test_no_member_list_keeps_the_queues_and_waits_for_the_periodic_rebalance(broker):
    """RebalanceImpl.rebalanceByTopic: a 5.3 broker answers GET_CONSUMER_LIST_BY_GROUP for a
    memberless group with SYSTEM_ERROR, MQClientInstance.findConsumerIdList returns null,
    and the topic is left as it is, balanced: RebalanceService waits its full period, it
    does not ask again every second."""
    seen, emitter = Seen(), EventEmitter()
    async with Taps(broker) as taps:
        ours = push(taps.namesrv.address, "GID_53_NOLIST", TOPIC, seen.listener, emitter=emitter)

        def rebalances():
            return [e for e in emitter.recent("rebalance", client_id=ours.client_id) if e.phase == "end"]
        await ours.start()
        try:
            await async_wait_until(lambda: held(ours, TOPIC) == {0, 1, 2, 3}, timeout=20, message="all 4 queues")
            taps.broker.fail(wire.GET_CONSUMER_LIST_BY_GROUP, 1_000, answer=wire.SYSTEM_ERROR)
            before = len(rebalances())
            runs = ours.rebalance_service.runs
            ours.rebalance_now("test")
            await async_wait_until(lambda: ours.rebalance_service.runs > runs, timeout=20, message="a rebalance")
        finally:
            await ours.shutdown()
    during = rebalances()[before:]
    assert during and all((e.balanced, e.added, e.removed) == (True, [], []) for e in during)
    assert any(code == wire.SYSTEM_ERROR for _, cmd, code in taps.broker.answers
               if cmd.code == wire.GET_CONSUMER_LIST_BY_GROUP)


async def test_a_removed_orderly_queue_that_comes_back_waits_for_its_dropped_process_queue_to_expire(broker):
    """RebalanceImpl.updateProcessQueueTableInRebalance (5.3): an orderly queue whose removal
    had to wait (RebalancePushImpl.tryRemoveOrderMessageQueue: a consume in progress) stays
    in the table, dropped; when it is allocated to us again it is not created anew until
    the dropped ProcessQueue's pull has expired (ProcessQueue.isPullExpired)."""
    import threading
    await produce(broker.address, ORDERLY, 40, batch=10)
    gate = threading.Event()
    emitter = EventEmitter()

    def stuck(msgs):   # holds each queue's consume lock until the gate opens
        gate.wait(60)
        return ConsumeResult.SUCCESS
    settings = dict(consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, unlock_delay_time_ms=600_000)
    a = push(broker.namesrv, "GID_53_ORDERLY", ORDERLY, stuck, emitter=emitter, orderly=True,
             pull_max_idle_time_ms=4_000, **settings)
    b = push(broker.namesrv, "GID_53_ORDERLY", ORDERLY, Seen().listener, orderly=True, **settings)
    await a.start()
    try:
        await async_wait_until(lambda: held(a, ORDERLY) == {0, 1}, timeout=20, message="a holds both queues")
        await b.start()
        # a must give one queue to b but cannot: it is consuming it. It stays, dropped.
        await async_wait_until(lambda: any(pq.dropped for mq, pq in a.rebalance_impl.process_queue_table.items()
                                           if mq.topic == ORDERLY), timeout=20, message="a dropped queue kept")
        gone = next(mq for mq, pq in a.rebalance_impl.process_queue_table.items() if mq.topic == ORDERLY and pq.dropped)
        kept_pq = a.rebalance_impl.process_queue_table[gone]
        await b.shutdown()
        # Ours again: rebalances run (unbalanced, every second) and leave the dropped one be.
        runs = a.rebalance_service.runs
        await async_wait_until(lambda: a.rebalance_service.runs >= runs + 2, timeout=20, message="two rebalances")
        assert a.rebalance_impl.process_queue_table.get(gone) is kept_pq and kept_pq.dropped
        gate.set()   # the consume ends; once the pull has expired the queue is created anew
        await async_wait_until(lambda: gone.queue_id in held(a, ORDERLY), timeout=30, message="the queue re-created")
        assert a.rebalance_impl.process_queue_table[gone] is not kept_pq
        assert kept_pq.is_pull_expired(4_000)
    finally:
        gate.set()
        await b.shutdown()
        await a.shutdown()
