"""The live page in a real browser (Debian's chromium) against the whole lab (`manage.py runlab`).

Log in with the URL runlab prints, see 8 queues shared by 3 push consumers, switch the
group to AVG_BY_CIRCLE (previewed, then applied) and see RocketMQ's allocation, kill a consumer and see its
queues move, hang one and see flow control, add a pop group. Screenshots go to
test-output/screenshots/.
"""
import re
import signal
import math
import threading
import time

import pytest
from playwright.sync_api import expect

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.message_queue import MessageQueue

from .browser import login_url, require_chromium, screenshot
from .consumed import duplicates_of_move
from .runlab import migrated_env
from .support import free_port, manage_py, wait_until

pytestmark = pytest.mark.browser

GROUP = '.group[data-group="GID_LAB"]'
# Short lab timings so a killed consumer is expired in seconds, not RocketMQ's 120 s.
FAST_LAB = ["--namesrv-port=0", "--remoting-port=0",
            "--broker-arg=--client-expiry-ms=3000", "--broker-arg=--client-scan-ms=500",
            "--client-option=*.heartbeat_interval_ms=1000"]


# The consumers' own records, as they reach the page: every `consume` event (with the
# offsets each consumer's listener was given) kept in window.consumeEvents, to check the
# hand-off panel's duplicate count against.
KEEP_CONSUME_EVENTS = """(() => {
  window.consumeEvents = [];
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (m) => {
        const e = JSON.parse(m.data);
        if (e.type === "consume") window.consumeEvents.push(e);
      });
    }
  };
})();"""


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    require_chromium()   # before a lab is started for nothing
    env = migrated_env(tmp_path_factory.mktemp("lab"))
    process = manage_py("runlab", "--host", "127.0.0.1", "--port", str(free_port()), *FAST_LAB, env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    try:
        found = wait_until(lambda: login_url(lines) or process.poll() is not None, timeout=120,
                           message="runlab's login URL")
        assert not isinstance(found, bool), "".join(lines)
        yield found
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)   # SIGINT may be ignored (a background suite)
        try:
            process.wait(60)
        except Exception:  # noqa: BLE001 - a stuck lab must not hang the suite
            process.kill()


@pytest.fixture(scope="module")
def page(lab_url, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.add_init_script(KEEP_CONSUME_EVENTS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"{exc}\n{exc.stack}"))
    page.goto(lab_url)
    page.wait_for_url(re.compile(r"/$"))
    yield page
    assert errors == [], errors[0]


def owners(page, group: str = GROUP) -> dict[str, str]:
    """queue label -> its one owner, or 'contested' / 'unowned' while a rebalance is under way."""
    return page.evaluate("""(group) => Object.fromEntries(
        [...document.querySelectorAll(`${group} th.queue-head`)].map((th) =>
            [th.dataset.queue, th.dataset.state === "owned" ? th.dataset.owner : th.dataset.state]))""", group)


def wait_for_owners(page, condition, message: str, timeout: float = 30):
    return wait_until(lambda: (lambda o: o if condition(o) else None)(owners(page)), timeout=timeout,
                      interval=0.1, message=message)


def expected(strategy: str, queues, consumers) -> dict[str, str]:
    """What RocketMQ's strategy gives, on the queue and id lists sorted as RebalanceImpl sorts them."""
    mqs, cids = sort_for_allocation([MessageQueue.from_label("TopicTest", q) for q in queues], consumers)
    allocate = get_strategy(strategy).allocate
    return {mq.label: cid for cid in cids for mq in allocate("GID_LAB", cid, mqs, cids)}


def test_the_default_scenario_is_shared_and_rebalanced_live(page):
    expect(page.locator("#ws-status")).to_have_attribute("data-state", "live", timeout=20_000)
    start = wait_for_owners(page, lambda o: len(o) == 8 and len(set(o.values()) - {"contested", "unowned"}) == 3
                            and "contested" not in o.values() and "unowned" not in o.values(),
                            "8 queues owned by 3 consumers")
    consumers = sorted(set(start.values()))
    assert start == expected("AVG", start, consumers)
    expect(page.locator(GROUP)).to_have_attribute("data-strategy", "AVG")
    # runlab's own broker: its parts and budget are on the disk line, with the lab's files.
    expect(page.locator("#disk-use")).to_have_text(re.compile(
        r"^disk: commit log \d+ MiB of 1024 · consume queues .+ · recordings .+ · history .+ · db .+$"))
    screenshot(page, "01-default-avg", full_page=True)

    # Switch the strategy live: previewed first (what moves), applied on confirm.
    page.select_option(f'{GROUP} [data-control="strategy"]', "AVG_BY_CIRCLE")
    circle = expected("AVG_BY_CIRCLE", start, consumers)
    assert circle != start
    moving = sum(circle[q] != start[q] for q in start)
    expect(page.locator(f'{GROUP} [data-role="preview-summary"]')).to_have_attribute("data-moved", str(moving))
    page.click(f'{GROUP} [data-action="apply-strategy"]')
    wait_for_owners(page, lambda o: o == circle, "AVG_BY_CIRCLE's owners")
    circled_at = time.time() * 1000
    expect(page.locator(GROUP)).to_have_attribute("data-strategy", "AVG_BY_CIRCLE")
    screenshot(page, "02-avg-by-circle", full_page=True)

    # Kill the consumer that owns broker-a:0: its queues go to the other two. Slowed first,
    # its messages finish out of order, so some it consumed are not committed yet.
    victim, survivors = circle["broker-a:0"], [c for c in consumers if c != circle["broker-a:0"]]
    page.select_option(f'{GROUP} select[name="client_id"]', victim)
    page.fill(f'{GROUP} input[name="ms"]', "100")
    page.click(f'{GROUP} [data-action="slow"]')
    expect(page.locator(f'{GROUP} tr[data-consumer="{victim}"] .faults')).to_have_text("slow 100 ms")
    # The lab keeps a sample a second: let it keep a few of this assignment (the replay below).
    wait_until(lambda: page.evaluate("async () => (await (await fetch('/api/groups/GID_LAB/lag?seconds=60')).json()).ts.at(-1)")
               >= circled_at + 5000, timeout=20, interval=0.5, message="samples of the switched assignment")
    killed_at = time.time() * 1000
    page.click(f'{GROUP} [data-action="kill"]')
    after = expected("AVG_BY_CIRCLE", start, survivors)
    wait_for_owners(page, lambda o: o == after, f"{victim}'s queues moved to {survivors}", timeout=60)
    expect(page.locator(f'{GROUP} tr[data-consumer="{victim}"]')).not_to_have_attribute("data-status", "running")
    expect(page.locator("#membership-log")).to_contain_text(victim)
    screenshot(page, "03-killed", full_page=True)
    check_the_kills_hand_off(page, victim, [q for q in start if circle[q] == victim], killed_at)
    check_the_replay_before_the_kill(page, victim, [q for q in start if circle[q] == victim], circled_at, killed_at)

    # Hang a survivor and flood the topic: its ProcessQueues fill to the threshold.
    hung = survivors[0]
    page.select_option(f'{GROUP} select[name="client_id"]', hung)
    page.click(f'{GROUP} [data-action="hang"]')
    expect(page.locator(f'{GROUP} tr[data-consumer="{hung}"]')).to_have_attribute("data-status", "hung")
    page.fill('#producer-form input[name="count"]', "12000")
    page.click('#producer-form [data-api="burst"]')
    wait_until(lambda: int(page.get_attribute("#flow-count", "data-count")) > 0, timeout=60, interval=0.2,
               message="flow-control events on the timeline")
    page.wait_for_function("() => [...document.querySelectorAll('#flow-chart .point')].length > 0", timeout=10_000)
    screenshot(page, "04-hung-flow-control", full_page=True)


def check_the_kills_hand_off(page, victim: str, its_queues: list[str], killed_at: float) -> None:
    """The kill's rebalance is on the strip: its panel lists the victim's queues moving to the survivors, and says how many messages were consumed twice - the count
    computed here from the consumers' own consume events, exactly."""
    marks = f'{GROUP} [data-role="rebalances"] .rebalance-mark'
    rebalance_id = wait_until(lambda: page.eval_on_selector_all(marks, """(marks, killedAt) =>
        marks.filter((m) => Number(m.dataset.endTs) >= killedAt).map((m) => m.dataset.rebalanceId).at(-1)""", killed_at),
        timeout=20, interval=0.2, message="the kill's rebalance on the strip")
    mark = page.locator(f'{marks}[data-rebalance-id="{rebalance_id}"]')
    expect(mark).to_have_attribute("title", re.compile(victim))
    cluster = page.locator(f'{GROUP} .rebalance-cluster.closed:has([data-rebalance-id="{rebalance_id}"])')
    if cluster.count():   # close to another rebalance: listed in their cluster
        cluster.locator(".rebalance-cluster-head").click()
    mark.click()
    summary = page.locator(f'{GROUP} [data-role="handoff-summary"]')
    expect(summary).to_be_visible()
    rebalance_id = summary.get_attribute("data-rebalance-id")

    def agreed():
        shown = int(summary.get_attribute("data-duplicates"))
        detail = page.evaluate("async (url) => (await fetch(url)).json()", f"/api/groups/GID_LAB/rebalances/{rebalance_id}")
        events = page.evaluate("window.consumeEvents")
        counted = sum(duplicates_of_move(events, m) for m in detail["moves"])
        return counted > 0 and shown == counted == detail["duplicates"] and detail

    detail = wait_until(agreed, timeout=30, interval=0.5, message="the panel's duplicates = the consumers' own count")
    moved_from_victim = {m["queue"] for m in detail["moves"] if m["from"] == [victim] and m["added_ts"] >= killed_at}
    assert moved_from_victim == set(its_queues)
    for queue in its_queues:
        expect(page.locator(f'{GROUP} [data-role="handoff"] tr[data-handoff-queue="{queue}"]').filter(
            has_text=f"{victim} →")).to_have_count(1)
    screenshot(page, "03b-hand-off", full_page=True)
    page.click(f'{GROUP} [data-action="close-handoff"]')
    expect(summary).to_have_count(0)


def check_the_replay_before_the_kill(page, victim: str, its_queues: list[str], circled_at: float,
                                     killed_at: float) -> None:
    """The lag lines are drawn; the Replay slider set halfway between the switch and the
    kill (5 s or more apart, a sample a second) shows the victim owning its queues again,
    and Back to live shows the survivors."""
    expect(page.locator(f'{GROUP} [data-role="total-lag"]')).to_contain_text("total lag")
    expect(page.locator(f'{GROUP} tr.trend svg.spark').first).to_be_attached()
    seconds_ago = math.ceil((time.time() * 1000 - (circled_at + killed_at) / 2) / 1000)
    page.eval_on_selector(f'{GROUP} [data-role="replay"]',
                          "(slider, v) => { slider.value = String(v); slider.dispatchEvent(new Event('input')); }", -seconds_ago)
    expect(page.locator(GROUP)).to_have_attribute("data-replay", re.compile(r"^\d+$"))
    try:
        wait_for_owners(page, lambda o: all(o[q] == victim for q in its_queues), f"{victim} owning its queues in the replay")
    except AssertionError as exc:   # say what the page replayed
        raise AssertionError(f"{exc}: {page.text_content(f'{GROUP} [data-role=replay-state]')}, owners {owners(page)}, "
                             f"replayed sample {page.get_attribute(GROUP, 'data-replay')}, killed at {killed_at:.0f}") from None
    screenshot(page, "03c-replay", full_page=True)
    page.click(f'{GROUP} [data-action="live"]')
    wait_for_owners(page, lambda o: victim not in o.values(), "the live owners again")
    expect(page.locator(GROUP)).not_to_have_attribute("data-replay", re.compile(".*"))


def test_a_pop_group_shows_who_received_each_queues_messages(page):
    page.fill('#group-form input[name="group"]', "GID_POP")
    page.select_option('#group-form select[name="mode"]', "pop")
    page.click('#group-form button[type="submit"]')
    pop = '.group[data-group="GID_POP"]'
    expect(page.locator(pop)).to_have_attribute("data-mode", "pop", timeout=30_000)
    page.wait_for_function(
        "(g) => document.querySelectorAll(`${g} th.queue-head[data-state=received]`).length > 0", arg=pop,
        timeout=60_000)
    screenshot(page, "05-push-and-pop", full_page=True)


def test_api_errors_are_shown(page):
    page.select_option(f'{GROUP} select[name="client_id"]', index=0)
    page.fill(f'{GROUP} input[name="ratio"]', "2")
    page.click(f'{GROUP} [data-action="fail"]')
    # Next to the control, not in the box at the top of the page.
    error = page.locator(f'{GROUP} [data-role="consumer-controls"] [data-role="control-error"]')
    expect(error).to_be_visible()
    expect(error).to_contain_text("between 0 and 1")
    expect(page.locator("#lab-error")).to_be_hidden()
    screenshot(page, "06-error")


def test_a_login_link_works_once(lab_url, browser):
    other = browser.new_page()
    other.goto(lab_url)
    expect(other.locator("#login-link-error")).to_contain_text("already used")
    expect(other.locator('input[name="password"]')).to_be_visible()
    other.close()
