"""Units: the hand-off record (consumers_app/lab/handoff.py), the consumed ranges a client
reports, and LabState feeding one from events. The real thing against the broker is in
test_handoff.py; the page in test_browser_live.py."""
from consumers_app.client.base import ConsumedRanges
from consumers_app.events import ConsumeEvent, event_from_dict, make_event
from consumers_app.lab.handoff import GroupHandoffs
from consumers_app.lab.state import LabState
from consumers_app.message_queue import MessageQueue

T0 = 1_700_000_000_000


def test_a_queues_first_owner_is_no_hand_off():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0", "b:1"], T0)
    h.set_holding("B", ["b:2"], T0 + 10)
    assert h.snapshot(T0 + 20)["totals"]["moved"] == 0
    assert h.snapshot(T0 + 20)["rebalances"] == []


def test_overlap_and_the_duplicates_it_causes_are_exact():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0", "b:1"], T0)
    h.consumed_ranges("A", "b:1", [[0, 100]], T0 + 500)
    h.set_holding("B", ["b:1"], T0 + 1000, reason="members changed")   # B takes it, A still holds it
    assert h.consumed_ranges("B", "b:1", [[50, 150]], T0 + 1100) == 50
    h.set_holding("A", ["b:0"], T0 + 1200)                              # A lets go 200 ms later
    (summary,) = h.snapshot(T0 + 2000)["rebalances"]
    assert summary["moved"] == 1 and summary["duplicates"] == 50 and summary["reason"] == "members changed"
    move = h.detail(summary["id"], T0 + 2000)["moves"][0]
    assert (move["queue"], move["from"], move["to"]) == ("b:1", ["A"], "B")
    assert (move["overlap_ms"], move["gap_ms"], move["overlap_ongoing"]) == (200, 0, False)


def test_an_old_owner_still_holding_is_an_ongoing_overlap():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_holding("B", ["b:0"], T0 + 1000)
    move = h.detail(1, T0 + 4000)["moves"][0]
    assert move["overlap_ongoing"] and move["overlap_ms"] == 3000


def test_a_gap_is_the_time_nobody_held_the_queue():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_holding("A", [], T0 + 1000)     # killed, cut or hung: stops consuming
    h.set_holding("B", ["b:0"], T0 + 1300)
    move = h.detail(1, T0 + 2000)["moves"][0]
    assert (move["gap_ms"], move["overlap_ms"], move["from"]) == (300, 0, ["A"])


def test_the_same_owner_back_after_a_pause_is_no_move():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_holding("A", [], T0 + 1000)
    h.set_holding("A", ["b:0"], T0 + 2000)
    assert h.snapshot(T0 + 3000)["totals"]["moved"] == 0


def test_each_hand_off_counts_what_its_old_and_new_owner_both_consumed():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    assert h.consumed_ranges("A", "b:0", [[0, 10]], T0) == 0
    assert h.consumed_ranges("A", "b:0", [[5, 12]], T0) == 0        # its own again: not by two clients
    h.set_holding("A", [], T0 + 10)
    h.set_holding("B", ["b:0"], T0 + 20)
    assert h.consumed_ranges("B", "b:0", [[8, 20]], T0 + 30) == 4   # 8..11
    h.set_holding("B", [], T0 + 40)
    h.set_holding("C", ["b:0"], T0 + 50)
    # From B it got 8..19 again; 8..11 is now consumed three times: once more per hand-off.
    assert h.consumed_ranges("C", "b:0", [[0, 30]], T0 + 60) == 12
    assert h.snapshot(T0 + 100)["totals"]["duplicates"] == 16


def test_the_count_does_not_depend_on_who_reports_first():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.consumed_ranges("A", "b:0", [[0, 10]], T0)
    h.set_holding("B", ["b:0"], T0 + 20)              # overlap: both consume
    assert h.consumed_ranges("B", "b:0", [[5, 15]], T0 + 30) == 5
    assert h.consumed_ranges("A", "b:0", [[10, 12]], T0 + 40) == 2   # the old owner reports late
    h.set_holding("A", [], T0 + 50)
    assert h.consumed_ranges("A", "b:0", [[12, 13]], T0 + 60) == 1   # in flight when it let go
    assert h.detail(1, T0 + 100)["moves"][0]["duplicates"] == 8


def test_hand_offs_close_together_are_one_rebalance():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0", "b:1", "b:2"], T0)
    h.set_holding("A", ["b:0", "b:1"], T0 + 1000)
    h.set_holding("B", ["b:2"], T0 + 1500)
    h.set_holding("A", ["b:0"], T0 + 2500)
    h.set_holding("B", ["b:2", "b:1"], T0 + 3000)
    h.set_holding("B", ["b:2"], T0 + 20_000)
    h.set_holding("A", ["b:0", "b:1"], T0 + 20_100)
    rebalances = h.snapshot(T0 + 21_000)["rebalances"]
    assert [r["moved"] for r in rebalances] == [2, 1]


def test_lag_spike_is_the_peak_after_the_hand_off_less_the_lag_before():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_lag("b:0", 10, T0 + 500)
    h.set_holding("A", [], T0 + 1000)
    h.set_holding("B", ["b:0"], T0 + 1200)
    for dt, lag in [(2000, 40), (3000, 60), (9000, 5), (40_000, 500)]:   # the last is past the watch
        h.set_lag("b:0", lag, T0 + dt)
    move = h.detail(1, T0 + 41_000)["moves"][0]
    assert (move["lag_before"], move["lag_peak"], move["lag_spike"]) == (10, 60, 50)


def test_the_window_forgets_old_rebalances_and_ranges():
    h = GroupHandoffs(window_ms=60_000)
    h.set_holding("A", ["b:0"], T0)
    h.consumed_ranges("A", "b:0", [[0, 10]], T0)
    h.set_holding("A", [], T0 + 10)
    h.set_holding("B", ["b:0"], T0 + 20)
    h.forget_before(T0 + 61_000)
    assert h.snapshot(T0 + 61_000)["rebalances"] == [] and ("b:0", "A") not in h.tenures
    assert h.detail(1, T0 + 61_000) is None


def test_consumed_ranges_merge_what_threads_finish_out_of_order():
    ranges = ConsumedRanges()
    mq = MessageQueue("T", "b", 0)
    for offset in [5, 6, 7, 0, 1, 2, 3, 4, 9]:
        ranges.note(mq, offset)
    assert ranges.drain() == {mq: [[0, 8], [9, 10]]}
    assert ranges.drain() == {}


def test_a_consume_event_carries_its_ranges_both_ways():
    mq, retry = MessageQueue("T", "b", 3), MessageQueue("%RETRY%G", "b", 0)
    event = make_event("consume", "G", "c1", topic="T", ok=3, ranges={mq: [[0, 2]], retry: [[7, 8]]})
    data = event.to_dict()
    assert data["ranges"] == {"b:3": [[0, 2]], "%RETRY%G/b:0": [[7, 8]]}
    back = event_from_dict(data)
    assert isinstance(back, ConsumeEvent) and back.ranges == {mq: [[0, 2]], retry: [[7, 8]]}


def test_lab_state_follows_assignments_consumption_and_a_kill():
    state = LabState()
    state.add_group("G", "T", "push", "AVG")
    for cid in ("A", "B"):
        state.add_client(cid, "G", "push").status = "running"
    q = lambda i: MessageQueue("T", "b", i)   # noqa: E731
    state.apply(make_event("assignment", "G", "A", ts=T0, topic="T", queues=[q(0), q(1)]))
    state.apply(make_event("consume", "G", "A", ts=T0 + 900, topic="T", ranges={q(1): [[0, 40]]}))
    state.apply(make_event("fault", "G", "A", ts=T0 + 1000, fault="kill"))
    state.client_gone("A", "killed")
    state.apply(make_event("assignment", "G", "B", ts=T0 + 1100, topic="T", queues=[q(0), q(1)], reason="members changed"))
    state.apply(make_event("consume", "G", "B", ts=T0 + 1200, topic="T", ranges={q(1): [[30, 60]], q(0): [[0, 5]]}))
    handoffs = state.snapshot()["groups"]["G"]["handoffs"]
    assert handoffs["totals"]["moved"] == 2 and handoffs["totals"]["duplicates"] == 10
    (rebalance,) = handoffs["rebalances"]
    assert rebalance["clients"] == ["A", "B"] and rebalance["gap_ms"] == 100


def test_a_pop_group_has_no_hand_offs():
    state = LabState()
    state.add_group("P", "T", "pop", "AVG")
    state.add_client("A", "P", "pop").status = "running"
    state.add_client("B", "P", "pop").status = "running"
    state.apply(make_event("assignment", "P", "A", topic="T", queues=[MessageQueue("T", "b", -1)]))
    state.apply(make_event("assignment", "P", "B", topic="T", queues=[MessageQueue("T", "b", -1)]))
    assert state.snapshot()["groups"]["P"]["handoffs"]["totals"]["moved"] == 0


def test_a_group_that_never_stops_churning_is_cut_into_rebalances_of_bounded_length():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    for i in range(1, 600):   # the queue changes hands every 100 ms for a minute
        h.set_holding("AB"[i % 2], ["b:0"], T0 + i * 100)
        h.set_holding("AB"[(i + 1) % 2], [], T0 + i * 100)
    rebalances = h.snapshot(T0 + 60_000)["rebalances"]
    assert len(rebalances) >= 2 and sum(r["moved"] for r in rebalances) == 599
    assert all(r["end_ts"] - r["ts"] <= 30_000 for r in rebalances)
    assert h.snapshot(T0 + 60_000)["rebalances"][0] is rebalances[0]   # unchanged: not made again


def test_a_move_to_or_from_a_peer_is_not_measured_rather_than_zero():
    h = GroupHandoffs()
    h.silent.add("peer")
    h.set_holding("A", ["b:0", "b:1"], T0)
    h.consumed_ranges("A", "b:0", [[0, 10]], T0)
    h.set_holding("A", [], T0 + 10)
    h.set_holding("peer", ["b:0"], T0 + 20)
    h.set_holding("B", ["b:1"], T0 + 20)
    h.consumed_ranges("A", "b:1", [[0, 4]], T0 + 5)
    h.consumed_ranges("B", "b:1", [[2, 6]], T0 + 30)
    detail = h.detail(1, T0 + 100)
    assert {m["queue"]: m["duplicates"] for m in detail["moves"]} == {"b:0": None, "b:1": 2}
    assert (detail["duplicates"], detail["unmeasured"]) == (2, 1)


def test_duplicates_nobody_could_measure_are_null_in_the_summary_the_totals_and_the_api_never_0():
    from consumers_app.lab.handoff import handoff_events, rebalance_detail

    state = LabState()
    state.add_group("G", "T", "push", "AVG")
    state.add_client("A", "G", "push").status = "running"
    peer = state.add_client("P", "G", "push")
    peer.status, peer.client = "running", "ali-ons"
    mq = MessageQueue("T", "b", 0)
    state.apply(make_event("assignment", "G", "A", ts=T0, topic="T", queues=[mq]))
    state.apply(make_event("fault", "G", "A", ts=T0 + 10, fault="kill"))
    state.client_gone("A", "killed")
    state.set_assignment("G", "P", ["b:0"])
    handoffs = state.snapshot()["groups"]["G"]["handoffs"]
    (rebalance,) = handoffs["rebalances"]
    assert (rebalance["duplicates"], rebalance["unmeasured"], rebalance["moved"]) == (None, 1, 1)
    assert (handoffs["totals"]["duplicates"], handoffs["totals"]["unmeasured"]) == (None, 1)
    detail = rebalance_detail(state.groups["G"], rebalance["id"])
    assert detail["duplicates"] is None and detail["moves"][0]["duplicates"] is None
    (event,) = handoff_events(state.groups["G"], T0 + 1000)
    assert event.to_dict()["duplicates"] == -1   # the event log's "not measured" (never 0)
    # Counters that only grow count the measured ones: none here.
    state.groups["G"].totals.fold([rebalance], rebalance["end_ts"] + 60_000)
    assert state.groups["G"].totals.snapshot()["duplicates"] == 0
    # Nothing moved at all: 0 duplicates is the truth, not unknown.
    assert GroupHandoffs().snapshot(T0)["totals"]["duplicates"] == 0


def test_lab_state_knows_peers_report_no_offsets():
    state = LabState()
    state.add_group("G", "T", "push", "AVG")
    state.add_client("A", "G", "push").status = "running"
    peer = state.add_client("P", "G", "push")
    peer.status, peer.client = "running", "ali-ons"
    state.apply(make_event("assignment", "G", "A", ts=T0, topic="T", queues=[MessageQueue("T", "b", 0)]))
    state.apply(make_event("fault", "G", "A", ts=T0 + 10, fault="kill"))
    state.set_assignment("G", "P", ["b:0"])
    (rebalance,) = state.snapshot()["groups"]["G"]["handoffs"]["rebalances"]
    assert rebalance["unmeasured"] == 1


# -- an overlap ends when either side stops consuming; a move only where the owner changed


def _overlap_in_lab_state():
    """A holds b:0; B takes it while A still holds it: an overlap, ongoing."""
    state = LabState()
    state.add_group("G", "T", "push", "AVG")
    for cid in ("A", "B"):
        state.add_client(cid, "G", "push").status = "running"
    state.apply(make_event("assignment", "G", "A", ts=T0, topic="T", queues=[MessageQueue("T", "b", 0)]))
    state.apply(make_event("assignment", "G", "B", ts=T0 + 1000, topic="T", queues=[MessageQueue("T", "b", 0)]))
    (move,) = state.groups["G"].handoffs.detail(1, T0 + 1500)["moves"]
    assert move["overlap_ongoing"] and move["overlap_ms"] == 500
    return state


def _only_move(state, now=T0 + 60_000):
    (rebalance,) = state.snapshot()["groups"]["G"]["handoffs"]["rebalances"]
    (move,) = state.groups["G"].handoffs.detail(rebalance["id"], now)["moves"]
    return rebalance, move


def test_an_overlap_ends_when_the_old_owner_is_killed():
    state = _overlap_in_lab_state()
    state.apply(make_event("fault", "G", "A", ts=T0 + 3000, fault="kill"))
    state.client_gone("A", "killed")
    rebalance, move = _only_move(state)
    assert not rebalance["overlap_ongoing"] and (move["overlap_ms"], move["released_ts"]) == (2000, T0 + 3000)


def test_an_overlap_ends_when_the_old_owner_dies():
    state = _overlap_in_lab_state()
    state.clients["A"].status = "running"
    state.client_gone("A", "crashed")   # its worker died: no event of its own
    _, move = _only_move(state)
    assert not move["overlap_ongoing"] and move["released_ts"] is not None


def test_an_overlap_ends_when_the_broker_expires_the_old_owner():
    state = _overlap_in_lab_state()
    state.apply(make_event("membership", "G", "A", ts=T0 + 4000, source="broker", members=["B"], left=["A"]))
    _, move = _only_move(state)
    assert (move["overlap_ongoing"], move["overlap_ms"]) == (False, 3000)
    # Its late assignment report while expired gives it nothing back.
    state.apply(make_event("assignment", "G", "A", ts=T0 + 5000, topic="T", queues=[MessageQueue("T", "b", 0)]))
    assert "A" not in state.groups["G"].handoffs.holding["b:0"]


def test_a_new_owner_that_lets_go_while_the_old_one_held_on_is_no_move():
    state = _overlap_in_lab_state()
    state.apply(make_event("fault", "G", "B", ts=T0 + 2000, fault="kill"))   # the old owner A never let go
    state.client_gone("B", "killed")
    handoffs = state.snapshot()["groups"]["G"]["handoffs"]
    assert handoffs["totals"]["moved"] == 0 and handoffs["rebalances"] == []
    assert state.groups["G"].handoffs.take_changed(T0 + 3000) == []


def test_a_start_up_race_records_only_the_queues_whose_owner_changed():
    """c1 took every queue alone; c2, on a stale member list, took four; AVG then leaves
    a:0-a:2 with c1 and gives c2 only a:3: one move (a:3), and no overlap runs on."""
    h = GroupHandoffs()
    h.set_holding("c1", ["a:0", "a:1", "a:2", "a:3"], T0)
    h.set_holding("c2", ["a:0", "a:1", "a:2", "a:3"], T0 + 100)
    h.set_holding("c1", ["a:0", "a:1", "a:2"], T0 + 300)
    h.set_holding("c2", ["a:3"], T0 + 400)
    (rebalance,) = h.snapshot(T0 + 600_000)["rebalances"]
    assert (rebalance["moved"], rebalance["overlap_ongoing"], rebalance["overlap_ms"]) == (1, False, 200)
    assert [(m["queue"], m["from"], m["to"]) for m in h.detail(rebalance["id"], T0 + 600_000)["moves"]] == [
        ("a:3", ["c1"], "c2")]
    h.set_holding("c2", [], T0 + 700)   # c2 killed later: c1 the only owner, nothing goes on counting
    assert h.snapshot(T0 + 900_000)["totals"]["overlap_ms"] == 200


def test_an_overlap_ends_when_the_new_owner_lets_go_after_one_of_two_old_owners_did():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_holding("B", ["b:0"], T0 + 10)          # A and B both hold it (a shared queue)
    h.set_holding("A", [], T0 + 20)
    h.set_holding("C", ["b:0"], T0 + 1000)        # C takes it from B (still holding)
    h.set_holding("C", [], T0 + 1500)             # C lets go first
    moves = [m for r in h.snapshot(T0 + 5000)["rebalances"] for m in h.detail(r["id"], T0 + 5000)["moves"]]
    assert not any(m["overlap_ongoing"] for m in moves)


def _moves(h, now):
    return sorted((m["queue"], tuple(m["from"]), m["to"]) for r in h.snapshot(now)["rebalances"]
                  for m in h.detail(r["id"], now)["moves"])


def test_start_up_reports_arriving_out_of_order_record_only_the_real_moves():
    """c1 took all of a:0-a:1 and b:0-b:1 alone (T0+100); c2, on a stale member list,
    took all four (T0+150), then kept b:* (T0+300) while c1 kept a:* (T0+310). c2's
    worker is quicker: its first report arrives before c1's. AVG left a:* with c1 all
    along: only b:* moved, c1 -> c2, overlapping until c1 let go."""
    h = GroupHandoffs()
    every = ["a:0", "a:1", "b:0", "b:1"]
    h.set_holding("c2", every, T0 + 150)          # arrives first
    h.set_holding("c1", every, T0 + 100)          # older, arrives later
    h.set_holding("c2", ["b:0", "b:1"], T0 + 300)
    h.set_holding("c1", ["a:0", "a:1"], T0 + 310)
    assert _moves(h, T0 + 1000) == [("b:0", ("c1",), "c2"), ("b:1", ("c1",), "c2")]
    (rebalance,) = h.snapshot(T0 + 1000)["rebalances"]
    assert (rebalance["overlap_ms"], rebalance["overlap_ongoing"]) == (160, False)
    h.set_holding("c2", [], T0 + 2000)            # c2 killed: c1 takes b:* back, a real move again
    h.set_holding("c1", every, T0 + 2100)
    assert not any(r["overlap_ongoing"] for r in h.snapshot(T0 + 600_000)["rebalances"])


def test_a_stale_holder_that_gave_the_queue_back_before_the_owners_report_arrived_is_no_move():
    h = GroupHandoffs()
    h.set_holding("c2", ["a:0"], T0 + 150)        # stale, arrives first
    h.set_holding("c2", [], T0 + 300)             # and gives it back
    h.set_holding("c1", ["a:0"], T0 + 100)        # the owner all along, reported late
    assert _moves(h, T0 + 1000) == []


def test_a_new_owner_that_lets_go_while_an_old_owner_holds_on_is_no_move_whatever_the_others_did():
    """A holds b:0; B and then C take it on stale views; A lets go (to B); C lets go while
    B holds on: A -> B moved, C's moment was no move (the queue stayed with B)."""
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_holding("B", ["b:0"], T0 + 100)
    h.set_holding("C", ["b:0"], T0 + 200)
    h.set_holding("A", [], T0 + 300)
    h.set_holding("C", [], T0 + 400)
    assert _moves(h, T0 + 1000) == [("b:0", ("A",), "B")]
    assert h.snapshot(T0 + 1000)["totals"]["overlap_ms"] == 200


def test_the_event_log_gets_a_move_once_it_is_settled():
    h = GroupHandoffs()
    h.set_holding("A", ["b:0"], T0)
    h.set_holding("B", ["b:0"], T0 + 100)
    assert h.take_changed(T0 + 200) == []          # A still holds it: not yet a move
    h.set_holding("A", [], T0 + 300)
    (logged,) = h.take_changed(T0 + 400)
    assert (logged["queue"], logged["overlap_ms"], logged["overlap_ongoing"]) == ("b:0", 200, False)


# -- the 15-minute story survives a restart


def test_the_story_survives_a_restart_through_its_file(tmp_path):
    from consumers_app.lab.persistence import HandoffStory

    h = GroupHandoffs()
    h.set_holding("A", ["b:0", "b:1"], T0)
    h.consumed_ranges("A", "b:0", [[0, 10]], T0)
    h.set_holding("A", ["b:1"], T0 + 10)
    h.set_holding("B", ["b:0", "b:1"], T0 + 20)     # b:0 after a gap, b:1 overlapping (A still holds it)
    h.consumed_ranges("B", "b:0", [[5, 15]], T0 + 30)
    before = h.snapshot(T0 + 1000)
    story = HandoffStory(tmp_path / "handoffs.json")
    assert story.save({"G": h.saved(T0 + 1000)}) and not story.save({"G": h.saved(T0 + 1000)})

    again = GroupHandoffs()
    again.restore(HandoffStory(tmp_path / "handoffs.json").load()["G"], T0 + 60_000)
    after = again.snapshot(T0 + 60_000)
    assert after["totals"] == {**before["totals"], "overlap_ms": 980}   # the overlap ended at the stop
    assert after["rebalances"][0]["overlap_ongoing"] is False
    assert {m["queue"]: m["duplicates"] for m in again.detail(1, T0 + 60_000)["moves"]} == {"b:0": 5, "b:1": 0}
    # This run's rebalances are new ones, numbered after the saved.
    again.set_holding("C", ["b:2"], T0 + 61_000)
    again.set_holding("C", [], T0 + 61_100)
    again.set_holding("D", ["b:2"], T0 + 61_200)
    assert [r["id"] for r in again.snapshot(T0 + 62_000)["rebalances"]] == [1, 2]
    # Past the window, it is gone like any other.
    assert GroupHandoffs().snapshot(T0)["rebalances"] == []
    late = GroupHandoffs()
    late.restore(story.load()["G"], T0 + 20 * 60_000)
    assert late.snapshot(T0 + 20 * 60_000)["rebalances"] == []


def test_an_unreadable_story_file_is_ignored(tmp_path):
    from consumers_app.lab.persistence import HandoffStory

    (tmp_path / "handoffs.json").write_text("[1, 2")
    assert HandoffStory(tmp_path / "handoffs.json").load() == {}


# -- a broker going offline and back moves its queues (the route refresh)


def test_a_broker_offline_and_back_moves_its_queues_and_counts():
    state = LabState()
    state.set_topic_queues("T", ["a:0", "b:0"])
    state.brokers = {"a": True, "b": True}
    state.add_group("G", "T", "push", "AVG")
    for cid in ("A", "B"):
        state.add_client(cid, "G", "push").status = "running"
    mq = lambda label: MessageQueue.from_label("T", label)   # noqa: E731
    state.apply(make_event("assignment", "G", "A", ts=T0, topic="T", queues=[mq("a:0")]))
    state.apply(make_event("assignment", "G", "B", ts=T0, topic="T", queues=[mq("b:0")]))
    state.apply(make_event("broker", "", "", ts=T0 + 1000, broker="b", online=False, change="offline"))
    # B's route refresh no longer lists b:0: it lets go, and nobody can take it.
    state.apply(make_event("assignment", "G", "B", ts=T0 + 5000, topic="T", queues=[], reason="route"))
    gone = state.snapshot()["groups"]["G"]["handoffs"]
    assert (gone["totals"]["rebalances"], gone["totals"]["moved"]) == (1, 1)
    assert gone["rebalances"][0]["reason"] == "b offline" and gone["rebalances"][0]["clients"] == ["B"]
    state.apply(make_event("broker", "", "", ts=T0 + 60_000, broker="b", online=True, change="online"))
    state.apply(make_event("assignment", "G", "B", ts=T0 + 65_000, topic="T", queues=[mq("b:0")], reason="route"))
    back = state.snapshot()["groups"]["G"]["handoffs"]
    assert (back["totals"]["rebalances"], back["totals"]["moved"]) == (2, 2)
    assert back["totals"]["gap_ms"] == 60_000   # nobody consumed b:0 while its broker was away
    (move,) = state.groups["G"].handoffs.detail(back["rebalances"][-1]["id"], T0 + 70_000)["moves"]
    assert (move["from"], move["to"], move["queue"]) == ([], "B", "b:0")
    # The broker's own queues only: a:0 never moved.
    assert {m["queue"] for r in back["rebalances"]
            for m in state.groups["G"].handoffs.detail(r["id"], T0 + 70_000)["moves"]} == {"b:0"}


def test_a_route_refresh_that_saw_the_broker_change_before_the_lab_did_still_moves_its_queues():
    """The consumer's route refresh beat the lab's broker event: it let go of b:0 (and took
    it back) before the lab heard the broker went offline (came back)."""
    state = LabState()
    state.set_topic_queues("T", ["a:0", "b:0"])
    state.brokers = {"a": True, "b": True}
    state.add_group("G", "T", "push", "AVG")
    state.add_client("B", "G", "push").status = "running"
    mq = lambda label: MessageQueue.from_label("T", label)   # noqa: E731
    state.apply(make_event("assignment", "G", "B", ts=T0, topic="T", queues=[mq("a:0"), mq("b:0")]))
    state.apply(make_event("assignment", "G", "B", ts=T0 + 1010, topic="T", queues=[mq("a:0")], reason="route"))
    state.apply(make_event("broker", "", "", ts=T0 + 1000, broker="b", online=False, change="offline"))
    gone = state.snapshot()["groups"]["G"]["handoffs"]
    assert (gone["totals"]["rebalances"], gone["totals"]["moved"]) == (1, 1)
    assert gone["rebalances"][0]["reason"] == "b offline"
    state.apply(make_event("assignment", "G", "B", ts=T0 + 60_010, topic="T", queues=[mq("a:0"), mq("b:0")],
                           reason="route"))
    state.apply(make_event("broker", "", "", ts=T0 + 60_000, broker="b", online=True, change="online"))
    back = state.snapshot()["groups"]["G"]["handoffs"]
    assert (back["totals"]["rebalances"], back["totals"]["moved"]) == (2, 2)
    assert back["rebalances"][-1]["reason"] == "b online" and back["totals"]["gap_ms"] == 59_000


def test_a_group_dropped_when_left_empty_keeps_its_story_for_the_window_and_the_next_start():
    from consumers_app.events import now_ms
    from consumers_app.lab.controller import LabController

    controller = LabController("127.0.0.1:1", gone_grace_s=0)
    t0 = now_ms() - 60_000   # inside the window: the story is kept for 15 minutes of the clock
    group = controller.state.add_group("G", "T", "push", "AVG")
    group.handoffs.set_holding("A", ["b:0"], t0)
    group.handoffs.set_holding("A", [], t0 + 10)
    group.handoffs.set_holding("B", ["b:0"], t0 + 20)
    group.handoffs.set_holding("B", [], t0 + 30)
    moved = controller.handoff_stories()["G"]["rebalances"]
    assert len(moved) == 1
    controller.collect_garbage()
    controller.collect_garbage()   # empty since the last look, then dropped
    assert "G" not in controller.state.groups
    # Still saved (the next start restores it), and back on the page if the group comes back.
    assert [r["id"] for r in controller.handoff_stories()["G"]["rebalances"]] == [moved[0]["id"]]
    controller._watchers["G"] = None   # no membership watch in a unit test
    again = controller._create_group("G", "T", "push", "AVG")
    assert [r["id"] for r in again.handoffs.snapshot(t0 + 1000)["rebalances"]] == [moved[0]["id"]]
