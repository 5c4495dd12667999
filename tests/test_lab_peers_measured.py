"""A mixed group - ours, ali-ons and the C++ client - measured like ours: the peers'
drivers report the queue offsets their listeners are given (``consume`` events with
ranges, as client/base.py's ConsumedRanges), so every hand-off to or from a peer has its
duplicates counted, and they equal what the members' own records say. Real broker with
remoting, real workers, real peers."""
import asyncio

import pytest
import pytest_asyncio

from consumers_app.events import now_ms
from consumers_app.lab import bus
from consumers_app.lab.controller import LabController
from consumers_app.lab.scenario import Scenario

from .brokers import BrokerProcess
from .consumed import duplicates_of_move
from .remoting_peers import require_ali_ons, require_cpp
from .support import async_wait_until, produce
from .test_lab_controller import Browser

pytestmark = pytest.mark.asyncio(loop_scope="module")

GROUP, TOPIC = "GID_MEASURED", "TopicMeasured"
QUICK = {"heartbeat_interval_ms": 500, "poll_name_server_interval_ms": 1000, "pq_event_interval_ms": 200,
         "rebalance_wait_interval_ms": 3000, "persist_consumer_offset_interval_ms": 1000}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("measured"), topics=[f"{TOPIC}:8"], remoting=True,
                       # An expiry past the C++ client's 30-s heartbeat: it would otherwise leave and
                       # join all along, and on a slow machine the group then never settled in 120 s.
                       # A kill needs none: the dead member's connection closes and the broker drops
                       # it at once.
                       extra_args=["--client-expiry-ms", "45000", "--client-scan-ms", "250"]) as b:
        yield b


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser():
    from channels.layers import get_channel_layer

    await get_channel_layer().flush()
    browser = Browser()
    listening = asyncio.create_task(browser.listen())
    yield browser
    listening.cancel()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(broker, browser):
    require_ali_ons()
    require_cpp()
    controller = LabController(broker.address, client_options={"push": QUICK}, pool_size=1,
                               flush_interval=0.05, poll_interval=0.5)
    controller.namesrv = broker.namesrv
    try:
        await controller.start(Scenario(topics={}, producers={}, groups=()))
        yield controller
    finally:
        await controller.stop()


def view(lab):
    return lab.state.snapshot()["groups"][GROUP]


def live(lab) -> list[str]:
    return [c for c, s in view(lab)["clients"].items() if s["status"] == "running"]


def settled(lab) -> bool:
    """Every queue pulled by exactly one live member, all of them listed by the broker."""
    v = view(lab)
    held = [q for c in live(lab) for q in v["assignments"].get(c, ())]
    return sorted(v["members"]) == sorted(live(lab)) and len(held) == len(set(held)) == 8 \
        and not v["ownership_issues"]


def reporting(browser) -> set[str]:
    """The members whose consumed offsets the page has heard of."""
    return {e["client_id"] for e in browser.events("consume") if e.get("ranges")}


def group_picture(lab, browser) -> str:
    """What the lab shows of the group, for a failure's message."""
    v = view(lab)
    return (f"members {sorted(v['members'])}, live {sorted(live(lab))}, "
            f"clients {[(c, s['client'], s['status']) for c, s in v['clients'].items()]}, "
            f"assignments {v['assignments']}, ownership issues {v['ownership_issues']}, "
            f"reporting consumed offsets {sorted(reporting(browser))}")


async def keep_producing_until(lab, broker, browser, condition, message, timeout=120):
    """Produce while waiting: peers only report what they consume. The deadline is generous:
    in the whole suite two peers' processes start next to everything else on 2 cores."""
    async def check():
        await produce(broker.address, TOPIC, 16, batch=1)
        return condition()
    try:
        return await async_wait_until(check, timeout=timeout, interval=0.5, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the lab shows {group_picture(lab, browser)}") from None


async def test_peers_report_their_consumed_offsets(lab, broker, browser):
    ours = [(await bus.request("add_consumer", group=GROUP, mode="push", topic=TOPIC, strategy="AVG"))["client_id"]
            for _ in range(2)]
    ali = (await bus.request("add_consumer", group=GROUP, mode="push", client="ali-ons"))["client_id"]
    cpp = (await bus.request("add_consumer", group=GROUP, mode="push", client="rocketmq-cpp"))["client_id"]

    await keep_producing_until(lab, broker, browser,
                               lambda: settled(lab) and {*ours, ali, cpp} <= reporting(browser),
                               f"every member consuming (ours {ours}, ali-ons {ali}, C++ {cpp})")
    for peer in (ali, cpp):
        ranges = [r for e in browser.events("consume") if e["client_id"] == peer for r in e["ranges"].values()]
        assert all(start < end for rs in ranges for start, end in rs)


@pytest.mark.parametrize("kind", ["ours", "ali-ons", "rocketmq-cpp"])
async def test_a_kill_of_each_is_measured_and_its_duplicates_are_the_members_own(lab, broker, browser, kind):
    """In this order: ours (to ours, ali-ons and the C++ client), ali-ons, the C++ client
    (to ours). The C++ client is never a survivor of a queue it once gave up (see the README)."""
    victim = next(c for c in live(lab) if view(lab)["clients"][c]["client"] == kind)
    held = view(lab)["assignments"][victim]
    killed_at = now_ms()
    await bus.request("consumer", client_id=victim, action="kill")
    await keep_producing_until(lab, broker, browser, lambda: settled(lab), "the survivors took every queue")

    # The kill's hand-offs may share a rebalance record with another membership change
    # (hand-offs 3 s apart are one rebalance), or follow one that ended after the kill; and a
    # member that rebalanced on a stale list may have taken a queue before the kill while the
    # victim held on (an overlap the kill ended). So the kill's moves are the victim's
    # hand-offs taken or let go since the kill, in whichever records.
    seen = {}

    def by_the_kill(move):
        return victim in move["from"] and max(move["added_ts"], move["released_ts"] or 0) >= killed_at

    async def kill_moves():
        records = [r for r in view(lab)["handoffs"]["rebalances"] if r["end_ts"] >= killed_at - 120_000]
        details = [await bus.request("rebalance", group=GROUP, rebalance_id=r["id"]) for r in records]
        kills = [(d, [m for m in d["moves"] if by_the_kill(m)]) for d in details]
        seen["all"] = details
        seen["details"] = [d for d, moves in kills if moves]   # the records holding the kill's moves
        moves = seen["moves"] = [m for _, moves in kills for m in moves]
        return moves

    async def counts_agree():
        moves = await kill_moves()
        # What the page showed it holding: ali-ons' is what the broker saw it pull, maybe not all.
        if not set(held) <= {m["queue"] for m in moves} or any(m["duplicates"] is None for m in moves):
            return None
        events = browser.events("consume")
        ours = seen["ours"] = {m["queue"]: duplicates_of_move(events, m) for m in moves}
        return ours == {m["queue"]: m["duplicates"] for m in moves}

    try:
        await async_wait_until(counts_agree, timeout=30, interval=0.5,
                               message="every move from the victim measured, as the members' records say")
    except AssertionError as exc:
        held_moves = [m for d in seen.get("all", ()) for m in d["moves"] if m["queue"] in held]
        raise AssertionError(f"{exc}: held {held}, killed at {killed_at}, the lab's moves {seen.get('moves')}, "
                             f"records' {seen.get('ours')}; every move of those queues {held_moves}") from None
    assert all(d["unmeasured"] == 0 for d in seen["details"]), seen["details"]
