"""LabState: events in, snapshot and coalesced deltas out (no processes, no I/O)."""
import pytest

from consumers_app.events import PqEvent, event_from_dict
from consumers_app.lab.state import LabState

pytestmark = pytest.mark.unit   # lane: in-process, whatever the file name says

QUEUES = [f"broker-{b}:{q}" for b in "ab" for q in range(4)]


def ev(type, group, client_id, **fields):
    """An event in the JSON form a worker sends (queues as labels), read as the controller reads it."""
    if type in ("pq", "flow_control", "assignment"):
        fields.setdefault("topic", "TopicTest")
    return event_from_dict({"type": type, "group": group, "client_id": client_id, **fields})


def lab_with_group(clients=("c1", "c2", "c3"), mode="push") -> LabState:
    state = LabState()
    state.set_topic_queues("TopicTest", reversed(QUEUES))
    state.add_group("GID_LAB", "TopicTest", mode, "AVG")
    for client_id in clients:
        state.add_client(client_id, "GID_LAB", mode, "w1").status = "running"
    return state


def assign(state, client_id, queues, strategy="AVG"):
    state.apply(ev("assignment", "GID_LAB", client_id, queues=queues, strategy=strategy, reason="test"))


def test_snapshot_has_the_contract_shape():
    state = lab_with_group()
    assign(state, "c1", QUEUES[0:3])
    assign(state, "c2", QUEUES[3:6])
    assign(state, "c3", QUEUES[6:8])
    state.apply(ev("pq", "GID_LAB", "c1", queue="broker-a:0", cached_count=7, cached_bytes=7000, span=9))
    state.set_offsets("GID_LAB", 10_000, [
        {"label": "broker-a:0", "min_offset": 0, "max_offset": 100, "committed_offset": 60,
         "oldest_unconsumed_store_ts": 9_000, "inflight": 0},
    ])

    snap = state.snapshot()

    assert snap["type"] == "snapshot"
    group = snap["groups"]["GID_LAB"]
    assert (group["strategy"], group["mode"]) == ("AVG", "push")
    assert group["assignments"] == {"c1": QUEUES[0:3], "c2": QUEUES[3:6], "c3": QUEUES[6:8]}
    assert list(group["queues"]) == QUEUES   # MessageQueue order, whatever order they came in
    a0 = group["queues"]["broker-a:0"]
    assert (a0["lag"], a0["cached_count"], a0["cached_bytes"], a0["span"]) == (40, 7, 7000, 9)
    assert (a0["time_lag_ms"], a0["owners"]) == (1_000, ["c1"])
    assert group["queues"]["broker-b:3"] == {
        "lag": 0, "cached_count": 0, "cached_bytes": 0, "span": 0, "committed_offset": -1,
        "max_offset": 0, "time_lag_ms": None, "inflight": 0, "owners": ["c3"]}   # no poll answered for it yet
    assert group["ownership_issues"] == {}


def test_lag_without_a_committed_offset_counts_the_whole_queue():
    state = lab_with_group()
    state.set_offsets("GID_LAB", 0, [{"label": "broker-a:1", "min_offset": 10, "max_offset": 25,
                                      "committed_offset": -1}])
    assert state.snapshot()["groups"]["GID_LAB"]["queues"]["broker-a:1"]["lag"] == 15


def test_a_queue_held_twice_or_by_nobody_is_flagged_until_the_rebalance_ends():
    state = lab_with_group(clients=("c1", "c2"))
    assign(state, "c1", QUEUES[:4])
    assign(state, "c2", QUEUES[4:])
    assert state.snapshot()["groups"]["GID_LAB"]["ownership_issues"] == {}

    # c1 took over broker-b:0 before c2 released it, and let go of broker-a:3.
    assign(state, "c1", QUEUES[:3] + ["broker-b:0"])
    issues = state.snapshot()["groups"]["GID_LAB"]["ownership_issues"]
    assert issues == {"broker-a:3": "unowned", "broker-b:0": "shared"}
    assert state.snapshot()["groups"]["GID_LAB"]["queues"]["broker-b:0"]["owners"] == ["c1", "c2"]

    assign(state, "c2", ["broker-a:3"] + QUEUES[5:])
    assert state.snapshot()["groups"]["GID_LAB"]["ownership_issues"] == {}


def test_a_gone_consumer_owns_nothing_and_its_late_reports_are_ignored():
    state = lab_with_group(clients=("c1", "c2"))
    assign(state, "c1", QUEUES[:4])
    assign(state, "c2", QUEUES[4:])
    state.client_gone("c2", "killed")
    assign(state, "c2", QUEUES[4:])       # still in flight when it died
    state.apply(ev("pq", "GID_LAB", "c2", queue="broker-b:0", cached_count=5))

    group = state.snapshot()["groups"]["GID_LAB"]
    assert group["assignments"] == {"c1": QUEUES[:4]}
    assert group["clients"]["c2"]["status"] == "killed"
    assert set(group["ownership_issues"]) == set(QUEUES[4:])
    assert group["queues"]["broker-b:0"]["cached_count"] == 0


def test_pop_assignments_cover_a_whole_broker_and_are_never_flagged():
    state = lab_with_group(clients=("c1", "c2"), mode="pop")
    assign(state, "c1", ["broker-a:-1", "broker-b:-1"])
    assign(state, "c2", ["broker-a:-1", "broker-b:-1"])

    group = state.snapshot()["groups"]["GID_LAB"]
    assert group["queues"]["broker-b:2"]["owners"] == ["c1", "c2"]
    assert group["ownership_issues"] == {}
    assert set(group["queues"]) == set(QUEUES)


def test_client_snapshot_replaces_its_assignment_and_caches():
    state = lab_with_group(clients=("c1",))
    assign(state, "c1", QUEUES)
    state.apply_client_snapshot({
        "client_id": "c1", "group": "GID_LAB", "mode": "push", "strategy": "AVG",
        "assignments": ["broker-a:1", "broker-a:0"],
        "queues": {"broker-a:0": {"cached_count": 3, "cached_bytes": 30, "span": 2, "inflight": 0,
                                  "committed_offset": 1, "pull_offset": 4}},
    })
    group = state.snapshot()["groups"]["GID_LAB"]
    assert group["assignments"] == {"c1": ["broker-a:0", "broker-a:1"]}
    assert group["queues"]["broker-a:0"]["cached_count"] == 3


def test_membership_sets_the_brokers_view_and_logs_the_brokers_changes():
    state = lab_with_group()
    state.apply(ev("membership", "GID_LAB", "c10", source="broker", reason="joined",
                           joined=["c10"], left=[], members=["c2", "c10", "c1"]))
    state.apply(ev("membership", "GID_LAB", "c1", reason="joined",   # c1 heard it too
                           joined=["c10"], left=[], members=["c2", "c10", "c1"]))
    group = state.snapshot()["groups"]["GID_LAB"]
    assert group["members"] == ["c1", "c10", "c2"]   # Java string order, as RocketMQ sorts ids
    assert [e["joined"] for e in group["membership_log"]] == [["c10"]]


def test_faults_and_skipped_messages_are_kept_for_a_page_opened_later():
    state = lab_with_group()
    state.apply(ev("fault", "GID_LAB", "", fault="strategy", strategy="AVG_BY_CIRCLE", clients=["c1", "c2", "c3"]))
    state.apply(ev("fault", "GID_LAB", "c2", fault="hang"))
    state.apply(ev("offset_moved", "GID_LAB", "c1", topic="TopicTest", queue="broker-a:0", from_offset=3,
                   to_offset=3, skipped=0))   # a correction that skips nothing is no line
    state.apply(ev("offset_moved", "GID_LAB", "c1", topic="TopicTest", queue="broker-a:0", from_offset=3,
                   to_offset=10, skipped=7))
    log = state.snapshot()["groups"]["GID_LAB"]["fault_log"]
    assert [(e["type"], e["client_id"], e.get("fault") or e.get("skipped")) for e in log] == [
        ("fault", "", "strategy"), ("fault", "c2", "hang"), ("offset_moved", "c1", 7)]


def test_drain_keeps_the_latest_figures_and_every_story_event():
    state = lab_with_group()
    for count in (1, 2, 3):
        state.apply(ev("pq", "GID_LAB", "c1", queue="broker-a:0", cached_count=count))
        state.apply(ev("pq", "GID_LAB", "c1", queue="broker-a:1", cached_count=10 * count))
        state.apply(ev("flow_control", "GID_LAB", "c1", queue="broker-a:0", reason="count"))
        state.apply(ev("fault", "GID_LAB", "c1", fault="hang"))
    assign(state, "c1", QUEUES)
    state.apply(ev("membership", "GID_LAB", "c2", source="broker", reason="left", members=["c1"]))

    batch = state.drain()

    pq = [(e.queue.label, e.cached_count) for e in batch if isinstance(e, PqEvent)]
    assert pq == [("broker-a:0", 3), ("broker-a:1", 30)]
    assert len([e for e in batch if e.type == "flow_control"]) == 1
    assert len([e for e in batch if e.type == "fault"]) == 3
    assert [e.type for e in batch][-2:] == ["assignment", "membership"]
    assert state.drain() == []


def test_broker_events_update_brokers_and_queues():
    state = lab_with_group()
    state.apply(ev("broker", "", "", broker="broker-b", online=False, change="offline"))
    state.apply(ev("broker", "", "", broker="broker-a", topic="TopicTest", change="queues",
                           queues=QUEUES[:5]))
    snap = state.snapshot()
    assert snap["brokers"]["broker-b"] == {"online": False}
    assert snap["topics"]["TopicTest"] == QUEUES[:5]
    assert list(snap["groups"]["GID_LAB"]["queues"]) == QUEUES[:5]


def test_queues_of_an_offline_broker_are_nobodys_and_that_is_fine():
    state = lab_with_group(clients=("c1",))
    state.apply(ev("broker", "", "", broker="broker-b", online=False, change="offline"))
    assign(state, "c1", QUEUES[:4])
    assert state.snapshot()["groups"]["GID_LAB"]["ownership_issues"] == {}


def test_the_last_rebalance_is_kept():
    state = lab_with_group()
    state.apply(ev("rebalance", "GID_LAB", "c1", phase="start", reason="joined"))
    state.apply(ev("rebalance", "GID_LAB", "c1", phase="end", reason="joined", duration_ms=3.5,
                           added=["broker-a:0"], removed=[]))
    last = state.snapshot()["groups"]["GID_LAB"]["last_rebalance"]
    assert (last["client_id"], last["reason"], last["duration_ms"], last["added"]) == ("c1", "joined", 3.5,
                                                                                      ["broker-a:0"])


def test_rebalances_that_change_nothing_are_counted_per_consumer_not_kept_as_the_last():
    state = lab_with_group()
    state.apply(ev("rebalance", "GID_LAB", "c1", phase="end", reason="joined", added=["broker-a:0"], removed=[]))
    for client_id in ("c1", "c2", "c2"):
        state.apply(ev("rebalance", "GID_LAB", client_id, phase="end", reason="periodic", added=[], removed=[]))
    group = state.snapshot()["groups"]["GID_LAB"]
    assert group["noop_rebalances"] == {"c1": 1, "c2": 2}
    assert group["last_rebalance"]["reason"] == "joined"
    state.client_gone("c2", "stopped")
    # Past the grace: gone_at + 60 - gone_at can come out a hair under 60 in floating point.
    state.collect_garbage(state.clients["c2"].gone_at + 61, grace_s=60)
    assert state.snapshot()["groups"]["GID_LAB"]["noop_rebalances"] == {"c1": 1}


def test_faults_mark_the_consumer():
    state = lab_with_group()
    state.apply(ev("fault", "GID_LAB", "c2", fault="hang"))
    state.apply(ev("fault", "GID_LAB", "c3", fault="slow", ms=200))
    clients = state.snapshot()["groups"]["GID_LAB"]["clients"]
    assert clients["c2"]["status"] == "hung"
    assert clients["c3"]["slow_ms"] == 200


def test_gone_consumers_and_empty_groups_leave_after_the_grace_period():
    state = lab_with_group()
    state.client_gone("c3", "stopped")
    gone_at = state.clients["c3"].gone_at
    assert state.collect_garbage(gone_at + 59, grace_s=60) == []
    assert "c3" in state.snapshot()["groups"]["GID_LAB"]["clients"]
    # Past the grace (+61: gone_at + 60 - gone_at can come out a hair under 60 in floating point).
    state.collect_garbage(gone_at + 61, grace_s=60)
    assert set(state.snapshot()["groups"]["GID_LAB"]["clients"]) == {"c1", "c2"}
    # The last members go: the group goes a grace period after it emptied (and the broker
    # lists nobody in it).
    for client_id in ("c1", "c2"):
        state.client_gone(client_id, "killed")
    later = state.clients["c2"].gone_at + 61
    assert state.collect_garbage(later, grace_s=60) == []          # empty from now on
    assert state.collect_garbage(later + 59, grace_s=60) == []
    assert state.collect_garbage(later + 61, grace_s=60) == ["GID_LAB"]
    assert state.snapshot()["groups"] == {}


def test_churn_does_not_grow_the_snapshot():
    """1,000 consumers come and go: once each is past the grace period the frame is as small as before."""
    import json
    state = lab_with_group()
    before = len(json.dumps(state.snapshot()))
    now = 0.0
    for i in range(1000):
        client_id = f"churn{i}"
        state.add_client(client_id, "GID_LAB", "push", "w1").status = "running"
        state.client_gone(client_id, "stopped")
        state.clients[client_id].gone_at = now
        now += 0.5
        state.collect_garbage(now, grace_s=60)
    peak = len(json.dumps(state.snapshot()))
    state.collect_garbage(now + 60, grace_s=60)
    after = len(json.dumps(state.snapshot()))
    assert after == before, (before, peak, after)


def test_messages_skipped_by_corrected_offsets_are_counted_per_queue():
    state = lab_with_group()
    state.apply(ev("offset_moved", "GID_LAB", "c1", topic="TopicTest", queue="broker-a:0",
                   from_offset=5, to_offset=905, skipped=900))
    state.apply(ev("offset_moved", "GID_LAB", "c2", topic="TopicTest", queue="broker-a:0",
                   from_offset=905, to_offset=1005, skipped=100))
    state.apply(ev("offset_moved", "GID_LAB", "c3", topic="TopicTest", queue="broker-b:1",
                   from_offset=1000, to_offset=5, skipped=0))   # corrected backwards: nothing skipped
    assert state.snapshot()["groups"]["GID_LAB"]["skipped"] == {"broker-a:0": 1000}


def test_each_client_says_whether_it_is_alive():
    # The live page lists, colours and waits for consumers by this flag, not by its own
    # reading of the status words.
    state = lab_with_group(clients=("c1", "c2", "c3", "c4"))
    state.clients["c4"].status = "starting"
    state.apply(ev("fault", "GID_LAB", "c2", fault="hang"))
    state.client_gone("c3", "killed")
    clients = state.snapshot()["groups"]["GID_LAB"]["clients"]
    assert {cid: (c["status"], c["alive"]) for cid, c in clients.items()} == {
        "c1": ("running", True), "c2": ("hung", True), "c3": ("killed", False), "c4": ("starting", True)}
