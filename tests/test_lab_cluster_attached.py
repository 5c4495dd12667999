"""A cluster the lab did not start (``runlab --namesrv``): a separately started broker with
a name server plays the cluster, a real controller is attached to it through ClusterAdmin,
C++-client consumers started outside the lab form observed groups.

* Time lag: the cluster tells none by itself, so the lab pulls the message at each
  queue's committed offset (one, committing nothing) and reads its store time. A hung
  consumer of the lab's own group, and an observed group frozen with SIGSTOP, both show
  their backlog aging; a queue never shows 0 while its time lag is unknown.
* Why a member went: the cluster only lists members; the lab names its own clients'
  departures (stop: left, kill: closed, cut: expired), and for an observed one asks the
  broker (a lab-only request): a goodbye is left, a killed process closed, a frozen one
  expired. A real RocketMQ broker cannot say: the lab infers (silent: expired, else left)."""
import os
import signal

import pytest
import pytest_asyncio

from consumers_app.lab import bus
from consumers_app.lab.cluster_admin import ClusterAdmin, attachment
from consumers_app.lab.controller import LabController
from consumers_app.lab.observer import Cluster
from consumers_app.lab.scenario import GroupSpec, Scenario

from .brokers import BrokerProcess
from .remoting_peers import Cpp, require_cpp
from .support import async_wait_until, produce

pytestmark = pytest.mark.asyncio(loop_scope="module")

OWN, WATCHED = "TopicOwn", "TopicWatched"
# Past the C++ client's heartbeat interval (30 s): a live C++ consumer never expires, a
# frozen one does; the lab's consumers heartbeat every second.
EXPIRY_MS = 35_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("cluster"), topics=[f"{WATCHED}:4@broker-a"], remoting=True,
                       extra_args=[f"--client-expiry-ms={EXPIRY_MS}", "--client-scan-ms=500"]) as broker:
        yield broker


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    return tmp_path_factory.mktemp("recordings")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(cluster, recordings):
    namesrv = cluster.namesrv
    options = {"push": {"namesrv": namesrv, "heartbeat_interval_ms": 1000}, "producer": {"namesrv": namesrv}}
    controller = LabController("", pool_size=1, flush_interval=0.05, poll_interval=0.5, observe_interval=0.5,
                               client_options=options, recorder_root=recordings, admin=ClusterAdmin(namesrv), cluster=attachment(namesrv, ""))
    controller.namesrv = namesrv
    try:
        await controller.start(Scenario(topics={OWN: {"broker-a": 4}}, producers={},
                                        groups=(GroupSpec("GID_LAB", OWN, consumers=2),)))
        yield controller
    finally:
        await controller.stop()
        await controller.admin.close()


@pytest.fixture
def peers():
    started = []
    yield started
    for peer in started:
        peer.kill()   # SIGKILL ends a stopped (SIGSTOP) process too


def view(lab, group):
    return lab.state.snapshot()["groups"][group]


async def test_a_hung_consumer_of_the_labs_own_group_shows_its_backlog_aging(lab, cluster):
    await async_wait_until(lambda: len([q for q in view(lab, "GID_LAB")["queues"].values() if len(q["owners"]) == 1])
                           == 4, timeout=30, message="GID_LAB's two consumers holding the four queues")
    await produce(cluster.address, OWN, 40, batch=1)
    await async_wait_until(lambda: all(q["lag"] == 0 and q["time_lag_ms"] == 0
                                       for q in view(lab, "GID_LAB")["queues"].values()),
                           timeout=30, message="everything consumed: no lag, a time lag of 0 (known)")
    hung = sorted(view(lab, "GID_LAB")["assignments"])[0]
    await bus.request("consumer", client_id=hung, action="hang")
    held = view(lab, "GID_LAB")["assignments"][hung]
    assert held
    await produce(cluster.address, OWN, 40, batch=1)

    def aged():
        queues = view(lab, "GID_LAB")["queues"]
        behind = [queues[label] for label in held if queues[label]["lag"] > 0]
        return behind and all((q["time_lag_ms"] or 0) >= 5_000 for q in behind)

    await async_wait_until(aged, timeout=30, message="the hung consumer's queues 5 s behind")
    others = [q for label, q in view(lab, "GID_LAB")["queues"].items() if label not in held]
    assert all(q["time_lag_ms"] is not None and q["time_lag_ms"] < 5_000 for q in others)
    await bus.request("consumer", client_id=hung, action="resume")


async def test_a_frozen_observed_group_with_a_backlog_shows_it_aging(lab, cluster, peers):
    require_cpp()
    group = "GID_FROZEN"
    for _ in range(2):
        peers.append(Cpp.consume(cluster.namesrv, group, WATCHED))
    for peer in peers:
        peer.wait_ready()
    await bus.request("observe", group=group)
    # Both hold their queues before anything is sent (a new group starts from the last offset).
    await async_wait_until(lambda: len(view(lab, group)["members"]) == 2
                           and all(len(q["owners"]) == 1 for q in view(lab, group)["queues"].values()),
                           timeout=30, message="the two C++ consumers holding the four queues")
    await produce(cluster.address, WATCHED, 20, batch=1)
    await async_wait_until(lambda: sum(q["committed_offset"] for q in view(lab, group)["queues"].values()) == 20
                           and all(q["time_lag_ms"] == 0 for q in view(lab, group)["queues"].values()),
                           timeout=30, message="all 20 consumed and committed: time lag 0")
    for peer in peers:
        os.kill(peer.proc.pid, signal.SIGSTOP)
    await produce(cluster.address, WATCHED, 20, batch=1)

    def aged():
        queues = view(lab, group)["queues"].values()
        return all(q["lag"] > 0 and (q["time_lag_ms"] or 0) >= 5_000 for q in queues)

    await async_wait_until(aged, timeout=30, message="every queue of the frozen group 5 s behind")

    # Silent, then dropped by the broker after its channel expiry: expired, not left.
    log = await async_wait_until(lambda: [e for e in view(lab, group)["membership_log"] if e["left"]],
                                 timeout=EXPIRY_MS / 1000 + 30, message="the frozen members dropped")
    assert {e["reason"] for e in log} == {"expired"}, log
    assert {c["status"] for c in view(lab, group)["clients"].values()} == {"expired"}


def departures(lab, group):
    return {c: e["reason"] for e in view(lab, group)["membership_log"] for c in e["left"]}


async def test_the_labs_own_members_read_left_closed_or_expired_as_they_went(lab):
    added = [(await bus.request("add_consumer", group="GID_LAB", mode="push"))["client_id"] for _ in range(3)]
    await async_wait_until(lambda: set(added) <= set(view(lab, "GID_LAB")["members"]), timeout=30,
                           message="the three newcomers listed by the cluster")
    said_goodbye, killed, cut = added
    await bus.request("consumer", client_id=said_goodbye, action="stop")
    await bus.request("consumer", client_id=killed, action="kill")
    await bus.request("consumer", client_id=cut, action="cut")
    gone = await async_wait_until(lambda: set(added) <= set(departures(lab, "GID_LAB"))
                                  and departures(lab, "GID_LAB"), timeout=EXPIRY_MS / 1000 + 30,
                                  message="all three dropped (the cut one after the expiry)")
    assert {c: gone[c] for c in added} == {said_goodbye: "left", killed: "closed", cut: "expired"}


async def test_an_observed_member_reads_left_after_its_goodbye_and_closed_when_killed(lab, cluster, peers):
    require_cpp()
    group = "GID_GOODBYE"
    peers.extend(Cpp.consume(cluster.namesrv, group, WATCHED) for _ in range(2))
    for peer in peers:
        peer.wait_ready()
    await bus.request("observe", group=group)
    members = await async_wait_until(lambda: len(view(lab, group)["members"]) == 2 and view(lab, group)["members"],
                                     timeout=30, message="both listed")
    await async_wait_until(lambda: all(c["assignment_source"] == "client"
                                       for c in view(lab, group)["clients"].values()),
                           timeout=30, message="both answering running info")
    peers[0].stop()   # SIGTERM: the C++ client commits, unregisters (UNREGISTER_CLIENT), then closes
    assert peers[0].proc.returncode == 0, "a clean shutdown (peers/cpp_peer.py: 2.1's shutdown segfault)"
    gone = await async_wait_until(lambda: departures(lab, group), timeout=30, message="one member gone")
    [said_goodbye] = gone
    assert gone == {said_goodbye: "left"} and said_goodbye in members
    assert view(lab, group)["clients"][said_goodbye]["status"] == "left"

    peers[1].kill()   # SIGKILL: no goodbye, only its connection closing
    [killed] = set(members) - {said_goodbye}
    gone = await async_wait_until(lambda: killed in departures(lab, group) and departures(lab, group),
                                  timeout=30, message="the killed member gone")
    assert gone == {said_goodbye: "left", killed: "closed"}
    assert view(lab, group)["clients"][killed]["status"] == "closed"


class DeparturesCluster(Cluster):
    """An observer's Cluster whose brokers answer every request with ``answer``."""

    def __init__(self, answer):
        super().__init__("namesrv:9876")
        self.answer, self.asked = answer, []

    async def ask(self, address, code, ext=None):
        self.asked.append((address, code, dict(ext or {})))
        return self.answer


async def test_an_observed_departure_is_the_brokers_word_and_inferred_where_a_real_broker_cannot_say():
    from consumers_app.lab.observer import ClientSighting, Sighting, changes, departure
    from consumers_app.remoting import wire
    from consumers_app.remoting.codec import Command

    def looks():
        before = Sighting(1, WATCHED, "push", [], address="broker:10911", clients={
            "stays": ClientSighting("stays", queues={}, answered=True),
            "bye": ClientSighting("bye", queues={}, answered=True),
            "quiet": ClientSighting("quiet", queues=None, answered=True)})   # silent at its last look
        return before, Sighting(2, WATCHED, "push", [], address="broker:10911",
                                clients={"stays": ClientSighting("stays", queues={})})

    # Our broker: its word, the latest for a member that came back and went again; a member
    # still listed and a reason it does not know are ignored.
    told = [{"clientId": "bye", "reason": "closed", "ts": 1}, {"clientId": "bye", "reason": "left", "ts": 2},
            {"clientId": "quiet", "reason": "closed", "ts": 3}, {"clientId": "stays", "reason": "left", "ts": 4},
            {"clientId": "quiet", "reason": "vanished", "ts": 5}]
    ours = DeparturesCluster(Command(wire.SUCCESS, body=wire.dumps({"departures": told}), flag=1))
    before, after = looks()
    await ours.tell_departures("G", before, after)
    assert ours.asked == [("broker:10911", wire.GET_CONSUMER_DEPARTURES, {"consumerGroup": "G"})]
    assert after.departures == {"bye": "left", "quiet": "closed"}
    assert {c: departure(before.clients[c], after.departures.get(c, "")) for c in ("bye", "quiet")} == {
        "bye": "left", "quiet": "closed"}
    del after.departures["bye"], before.clients["bye"]
    [membership] = [e for e in changes("G", before, after) if e.type == "membership"]
    assert (membership.left, membership.reason) == (["quiet"], "closed")
    await ours.tell_departures("G", after, after)   # nobody gone: nothing asked
    assert len(ours.asked) == 1

    # A real RocketMQ broker: REQUEST_CODE_NOT_SUPPORTED, once; then inferred, never asked again.
    real = DeparturesCluster(Command(wire.REQUEST_CODE_NOT_SUPPORTED, remark=" request type 20010 not supported",
                                     flag=1))
    for _ in range(2):
        before, after = looks()
        await real.tell_departures("G", before, after)
        assert after.departures == {}
    assert len(real.asked) == 1
    assert {c: departure(before.clients[c]) for c in ("bye", "quiet")} == {"bye": "left", "quiet": "expired"}


class FakeCluster:
    """Answers store_ts_at from a table; counts what it was asked."""

    def __init__(self, store_ts: dict, failing=()):
        self.store_ts, self.failing, self.asked = store_ts, set(failing), []

    async def store_ts_at(self, address, group, mq, offset):
        self.asked.append((mq.label, offset))
        if mq.label in self.failing:
            raise TimeoutError()
        return self.store_ts.get((mq.label, offset))


async def test_the_oldest_unconsumed_is_probed_once_per_offset_and_unknown_is_none_never_0():
    from consumers_app.lab.observer import OldestUnconsumed
    from consumers_app.message_queue import MessageQueue

    a0, a1, a2 = (MessageQueue("T", "broker-a", i) for i in range(3))
    fake = FakeCluster({("broker-a:0", 5): 1_000}, failing={"broker-a:2"})
    oldest = OldestUnconsumed(fake)

    def figures():
        return {a0: {"min_offset": 0, "max_offset": 9, "committed_offset": 5},    # behind: probed
                a1: {"min_offset": 0, "max_offset": 7, "committed_offset": 7},    # caught up: 0, not asked
                a2: {"min_offset": 0, "max_offset": 3, "committed_offset": 1}}    # its probe fails: None
    first = figures()
    await oldest.fill("G", first, {"broker-a": "addr"})
    assert {mq.label: f["oldest_unconsumed_store_ts"] for mq, f in first.items()} == {
        "broker-a:0": 1_000, "broker-a:1": 0, "broker-a:2": None}
    again = figures()
    await oldest.fill("G", again, {"broker-a": "addr"})
    assert again[a0]["oldest_unconsumed_store_ts"] == 1_000
    # The committed offset did not move: asked once; the failed one is asked again.
    assert fake.asked == [("broker-a:0", 5), ("broker-a:2", 1), ("broker-a:2", 1)]


def recorded(root, kind: str, group: str) -> list[dict]:
    import pyarrow.parquet as pq

    files = sorted((root / kind).rglob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist() if row["group"] == group]


async def test_an_observed_group_is_recorded_like_the_labs_own(lab, cluster, peers, recordings):
    """Offsets with their owners, membership, assignments and hand-offs go into the
    recordings the lag history computes from, as GID_LAB's do."""
    import asyncio
    import json

    require_cpp()
    group = "GID_RECORDED"
    peers.append(Cpp.consume(cluster.namesrv, group, WATCHED))
    peers[0].wait_ready()
    await bus.request("observe", group=group)
    [first] = await async_wait_until(lambda: view(lab, group)["members"], timeout=30, message="listed")
    await async_wait_until(lambda: len(view(lab, group)["assignments"].get(first, ())) == 4, timeout=30,
                           message="the one member holding all four queues")
    peers.append(Cpp.consume(cluster.namesrv, group, WATCHED))
    peers[1].wait_ready()
    await async_wait_until(lambda: view(lab, group)["handoffs"]["totals"]["moved"] >= 1, timeout=60,
                           message="queues handed to the newcomer")
    await produce(cluster.address, WATCHED, 20, batch=1)
    await async_wait_until(lambda: all(q["lag"] == 0 for q in view(lab, group)["queues"].values()), timeout=30,
                           message="the 20 consumed")
    looks = len(lab.state.groups[group].timeline.samples)
    await async_wait_until(lambda: len(lab.state.groups[group].timeline.samples) >= looks + 3, timeout=30,
                           message="three more looks")
    looked_at = [s.ts for s in lab.state.groups[group].timeline.samples]
    members = set(view(lab, group)["members"])

    async def written(kind, ready):
        """The group's rows of ``kind`` once ``ready(rows)``: the recording loop may hold some
        on their way to the recorder when a flush comes."""
        async def check():
            await lab._record()
            await asyncio.to_thread(lab._recorder.flush)
            rows = recorded(recordings, kind, group)
            return ready(rows) and rows
        return await async_wait_until(check, timeout=10, message=f"the {kind} recorded")

    # A row per queue every look (the last one's may still be on its way to the recorder).
    rows = await written("snapshots", lambda rows: set(looked_at[:-1]) <= {r["ts"] for r in rows})
    assert {(r["topic"], r["broker"], r["queue_id"]) for r in rows} == {(WATCHED, "broker-a", i) for i in range(4)}
    assert all(sum(r["ts"] == ts for r in rows) == 4 for ts in looked_at[:-1])
    assert {r["owner"] for r in rows if r["owner"]} == members
    events = await written("events", lambda rows: {"membership", "assignment", "rebalance", "handoff"}
                           <= {e["type"] for e in rows})
    assert members <= {e["client_id"] for e in events if e["type"] == "assignment"}
    handoffs = [e for e in events if e["type"] == "handoff"]
    assert {e["client_id"] for e in handoffs} <= members
    assert all(set(json.loads(e["fields"])["from_clients"]) <= members for e in handoffs)

    # ... and the lag history computes them: the group's report has its queues, owned by its members.
    report = await asyncio.to_thread(lag_report_of, recordings, group)
    assert {(r["topic"], r["broker"], r["queue_id"]) for r in report} == {(WATCHED, "broker-a", i) for i in range(4)}
    assert {r["owner"] for r in report if r["owner"]} <= members and any(r["owner"] for r in report)


def lag_report_of(recordings, group: str) -> list[dict]:
    """The lag job (real Spark, local[1]) over the recordings, then the group's CSV report's
    rows, as the history page's download builds them."""
    import csv
    import io
    import tempfile

    from dashboard.lag.history import LagHistory
    from dashboard.lag.job import JobParams, LagJob
    from dashboard.lag.reports import build_report, parse_query
    from dashboard.lag.spark import get_spark

    spark = get_spark("local[1]")
    try:
        with tempfile.TemporaryDirectory() as lag_dir:
            assert LagJob(recordings, lag_dir, spark=spark).run(JobParams()).state == "done"
            history = LagHistory(lag_dir, recordings)
            body = build_report(history, parse_query(group, None, None, "csv", "10s", history))
    finally:
        spark.stop()
    return [{**r, "queue_id": int(r["queue_id"])} for r in csv.DictReader(io.StringIO(body.decode()))]
