"""The live page at real sizes, in Debian's chromium against a FakeLab (no broker).

One group of 64 push consumers on 4 brokers × 64 queues, caught mid-rebalance (a few queues
with two owners, a few with none), in a 1600×900 window: its assignment view fits without
scrolling and shows every queue's owner; a kill changes exactly the victim's cells, in place;
the legend highlights one consumer's queues. A small group keeps the detailed matrix; a pop
group's Add control offers pop; the login page loads no plotly.js.

What the page shows is checked against the server's own snapshot (`GET /api/state`: each
queue's owners as LabState computes them), not against the page's JS. Each scenario's
server is this module run as a script (see the bottom).
"""
import re
import sys

import pytest
from playwright.sync_api import expect

from consumers_app.allocate import get_strategy, sort_for_allocation
from consumers_app.message_queue import MessageQueue

from .browser import VIEW, fake_lab_server, logged_in_page, screenshot, server_state, shown
from .fake_lab import TOPIC, FakeLab, serve, served_lab
from .support import wait_until

pytestmark = pytest.mark.browser

GROUP = '.group[data-group="GID_LAB"]'
# The scale scenario's rebalance under way: (who also claims it, queue), and queues let go.
CONTESTED = [("c5", "broker-b:10"), ("c5", "broker-c:20"), ("c40", "broker-d:63")]
UNOWNED = ["broker-a:7", "broker-c:33", "broker-d:0"]


# ------------------------------------------------------------------ servers and pages

@pytest.fixture(scope="module")
def scale_page(browser, tmp_path_factory):
    with fake_lab_server("scale", tmp_path_factory.mktemp("scale"), __name__) as url, \
            logged_in_page(browser, url, 1600, 900) as page:
        page.wait_for_function("(v) => document.querySelectorAll(`${v} [data-queue]`).length === 256", arg=VIEW,
                               timeout=20_000)
        yield page


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    with fake_lab_server("small", tmp_path_factory.mktemp("small"), __name__) as url:
        yield url


@pytest.fixture(scope="module")
def small_page(browser, small_server):
    with logged_in_page(browser, small_server, 1500, 1000) as page:
        page.wait_for_function("(v) => document.querySelectorAll(`${v} [data-queue]`).length === 8", arg=VIEW,
                               timeout=20_000)
        yield page


# ------------------------------------------------------------------ what the page shows, what the server says

def expected(page, group: str = "GID_LAB") -> dict[str, dict]:
    """What the view must show: each queue's owners in the server's snapshot."""
    queues = server_state(page)["groups"][group]["queues"]
    state = lambda owners: "unowned" if not owners else "owned" if len(owners) == 1 else "contested"  # noqa: E731
    return {label: {"owners": ",".join(q["owners"]), "state": state(q["owners"])} for label, q in queues.items()}


def wait_for_shown(page, want: dict, message: str) -> None:
    wait_until(lambda: shown(page) == want, timeout=20, interval=0.1, message=message)


# ------------------------------------------------------------------ 64 consumers × 256 queues

def test_the_whole_group_fits_in_the_window_and_shows_every_owner(scale_page):
    page = scale_page
    want = expected(page)
    assert len(want) == 256
    states = [q["state"] for q in want.values()]
    assert states.count("contested") >= 1 and states.count("unowned") >= 1, "the scenario is mid-rebalance"
    wait_for_shown(page, want, "every queue's owners as the server has them")

    seen = page.evaluate("""(view) => {
        const root = document.querySelector(view);
        const box = root.getBoundingClientRect();
        const entries = [...root.querySelectorAll(".legend-item")];
        const swatches = Object.fromEntries(entries.map((e) => [e.dataset.consumer, getComputedStyle(e.querySelector(".swatch")).backgroundColor]));
        const legend = Object.fromEntries(entries.map((e) => [e.dataset.consumer, e.textContent]));
        const cells = [...root.querySelectorAll("[data-queue]")].map((c) => {
            const r = c.getBoundingClientRect(), style = getComputedStyle(c);
            return {queue: c.dataset.queue, state: c.dataset.state, owner: c.dataset.owner,
                    colour: style.backgroundColor, marked: style.boxShadow !== "none",
                    inside: r.top >= box.top && r.bottom <= box.bottom && r.left >= box.left && r.right <= box.right,
                    size: Math.min(r.width, r.height)};
        });
        return {box: {top: box.top, bottom: box.bottom, left: box.left, right: box.right},
                width: innerWidth, height: innerHeight, scrolled: scrollY, swatches, legend, cells};
    }""", VIEW)
    box = seen["box"]
    assert seen["scrolled"] == 0
    assert 0 <= box["top"] and box["bottom"] <= seen["height"], f"the view {box} is taller than the window"
    assert 0 <= box["left"] and box["right"] <= seen["width"], f"the view {box} is wider than the window"
    assert all(c["inside"] and c["size"] >= 8 for c in seen["cells"]), "every cell visible in the view"

    # The legend: each consumer (all running here) and how many queues it holds.
    state = server_state(page)["groups"]["GID_LAB"]
    held = {cid: sum(cid in q["owners"] for q in state["queues"].values()) for cid in state["clients"]}
    alive = {cid for cid, c in state["clients"].items() if c["status"] == "running"}
    assert {cid: text for cid, text in seen["legend"].items() if cid in alive} == {cid: f"{cid}{held[cid]}" for cid in alive}

    # Every owner has a colour of its own, and each owned cell wears its owner's.
    assert len(seen["swatches"]) == 64 and len(set(seen["swatches"].values())) == 64
    for cell in seen["cells"]:
        if cell["state"] == "owned":
            assert cell["colour"] == seen["swatches"][cell["owner"]], cell
        # Two owners or none: outlined (lab.css), an owned cell is not.
        assert cell["marked"] == (cell["state"] != "owned"), cell
    screenshot(page, "10-scale-64x256")


def test_hovering_a_cell_tells_its_owners_and_figures(scale_page):
    page = scale_page
    label = CONTESTED[0][1]
    queue = server_state(page)["groups"]["GID_LAB"]["queues"][label]
    assert len(queue["owners"]) == 2
    page.hover(f'{VIEW} [data-queue="{label}"]')
    tip = page.locator(f"{VIEW} .qtip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(label)
    expect(tip).to_contain_text(f"2 owners: {', '.join(queue['owners'])}")
    expect(tip).to_contain_text(f"lag {queue['lag']:,}")
    page.mouse.move(1, 1)
    expect(tip).to_be_hidden()


def test_a_kill_changes_exactly_its_queues_cells_in_place(scale_page):
    page = scale_page
    before = expected(page)
    wait_for_shown(page, before, "the view in step with the server")
    holders = {}
    for label, q in before.items():
        for cid in q["owners"].split(","):
            holders.setdefault(cid, set()).add(label)
    # A consumer that holds several queues alone (none shared): after its kill they are unowned.
    victim = next(c for c, labels in sorted(holders.items()) if c and len(labels) >= 2
                  and all(before[x]["state"] == "owned" for x in labels))
    theirs = holders[victim]

    # Watch every data-state write, and keep the cell elements to see they survive.
    page.evaluate("""(view) => {
        const root = document.querySelector(view);
        const cells = new Map([...root.querySelectorAll("[data-queue]")].map((c) => [c.dataset.queue, c]));
        const writes = [];
        const observer = new MutationObserver((records) => writes.push(...records.map((r) => r.target.dataset.queue)));
        observer.observe(root, {subtree: true, attributes: true, attributeFilter: ["data-state"]});
        window.watched = {root, cells, writes, observer};
    }""", VIEW)
    page.select_option(f'{GROUP} select[name="client_id"]', victim)
    kill = page.locator(f'{GROUP} [data-action="kill"]')
    kill.click()
    page.wait_for_function("""([view, labels]) => labels.every((l) =>
        document.querySelector(`${view} [data-queue="${l}"]`).dataset.state === "unowned")""", arg=[VIEW, sorted(theirs)],
        timeout=20_000)
    expect(page.locator(f'{VIEW} .legend-item[data-consumer="{victim}"]')).to_have_attribute("data-status", "killed")
    expect(kill).to_be_enabled()   # the API's answer (a snapshot) is in too

    after = expected(page)
    assert {x for x in after if after[x] != before[x]} == theirs
    wait_for_shown(page, after, "the view in step with the server after the kill")
    watched = page.evaluate("""() => {
        const {root, cells, writes, observer} = window.watched;
        writes.push(...observer.takeRecords().map((r) => r.target.dataset.queue));
        observer.disconnect();
        const now = [...root.querySelectorAll("[data-queue]")];
        return {writes, kept: now.length === cells.size && now.every((c) => cells.get(c.dataset.queue) === c)};
    }""")
    assert sorted(watched["writes"]) == sorted(theirs), "data-state written on exactly the victim's cells, once each"
    assert watched["kept"], "no cell was rebuilt"
    screenshot(page, "11-scale-killed")


def test_the_legend_highlights_a_consumers_queues(scale_page):
    page = scale_page
    who = CONTESTED[0][0]
    now = shown(page)
    theirs = {label for label, q in now.items() if who in q["owners"].split(",")}
    assert len(theirs) >= 2
    entry = page.locator(f'{VIEW} .legend-item[data-consumer="{who}"]')
    view = page.locator(VIEW)
    highlighted = lambda: set(page.evaluate(  # noqa: E731
        "(v) => [...document.querySelectorAll(`${v} [data-queue].highlight`)].map((c) => c.dataset.queue)", VIEW))

    entry.hover()
    expect(view).to_have_class(re.compile(r"\bfocusing\b"))
    assert highlighted() == theirs
    screenshot(page, "12-scale-legend-hover")
    page.mouse.move(1, 1)
    expect(view).not_to_have_class(re.compile(r"\bfocusing\b"))
    assert highlighted() == set()

    # A click keeps the highlight after the pointer leaves; a second click lets it go.
    entry.click()
    page.mouse.move(1, 1)
    expect(entry).to_have_attribute("aria-pressed", "true")
    assert highlighted() == theirs
    entry.click()
    page.mouse.move(1, 1)
    expect(entry).to_have_attribute("aria-pressed", "false")
    expect(view).not_to_have_class(re.compile(r"\bfocusing\b"))


# ------------------------------------------------------------------ a small group, pop, the login page

def test_a_small_group_keeps_the_detailed_matrix(small_page):
    page = small_page
    wait_for_shown(page, expected(page), "8 queues' owners as the server has them")
    expect(page.locator(VIEW)).to_have_js_property("tagName", "TABLE")
    expect(page.locator(f"{VIEW} th.queue-head[data-queue]")).to_have_count(8)
    expect(page.locator(f"{VIEW} tr[data-consumer]")).to_have_count(3)
    expect(page.locator(f"{VIEW} tfoot th")).to_contain_text(["cached msgs", "cached MiB", "span", "lag", "time lag"])
    page.wait_for_function("() => document.querySelector('#pq-GID_LAB .main-svg') !== null")   # plotly is there
    screenshot(page, "13-small-matrix")


def test_a_pop_groups_add_control_offers_pop(small_page):
    page = small_page
    page.fill('#group-form input[name="group"]', "GID_POP")
    page.select_option('#group-form select[name="mode"]', "pop")
    page.click('#group-form button[type="submit"]')
    pop = '.group[data-group="GID_POP"]'
    expect(page.locator(pop)).to_have_attribute("data-mode", "pop")
    rows = page.locator('[data-assignment-group="GID_POP"] tr[data-consumer]')
    expect(rows).not_to_have_count(0)
    count = rows.count()
    expect(page.locator(f'{pop} select[data-role="add-mode"]')).to_have_value("pop")
    page.click(f'{pop} [data-action="add-consumer"]')
    expect(rows).to_have_count(count + 1)
    expect(page.locator("#lab-error")).to_be_hidden()


def test_the_login_page_loads_no_plotly(browser, small_server):
    page = browser.new_page()
    scripts: list[str] = []
    page.on("request", lambda request: scripts.append(request.url) if request.resource_type == "script" else None)
    page.goto(re.sub(r"\?.*", "", small_server), wait_until="load")   # the form, not the one-time link
    expect(page.locator('input[name="password"]')).to_be_visible()
    page.close()
    assert scripts == []


# ------------------------------------------------------------------ the servers (run as a script)

async def scale_lab() -> FakeLab:
    """64 push consumers on 4 × 64 queues with a rebalance under way, and some lag."""
    lab = await served_lab(consumers=64, brokers=4, queues_per_broker=64)
    for i, label in enumerate(lab.labels()):
        lab.world.broker.add_backlog(MessageQueue.from_label(TOPIC, label), 37 * i)
    # From here a stop or kill is the moment right after it: the broker dropped the consumer
    # and the survivors have not rebalanced yet, so its queues stay unowned.
    lab.world.hold_rebalances()
    for client_id, label in CONTESTED:
        lab.world.claim(client_id, label)
    for label in UNOWNED:
        lab.world.release(label)
    await lab.poll()
    return lab


PEER_ID = "192.0.2.2@ali-ons-13877"


async def peer_lab() -> FakeLab:
    """Three of ours and a peer whose client id is long, sharing the 8 queues."""
    lab = await served_lab()
    broker = lab.world.broker
    broker.join("GID_LAB", PEER_ID)   # ours rebalance among four
    # The lab's view of a peer it started (peer_consumers.py; its process is no fake's to
    # play): running, its queues the ones the broker sees it pull.
    peer = lab.state.add_client(PEER_ID, "GID_LAB", "push")
    peer.status, peer.client, peer.assignment_source = "running", "ali-ons", "broker"
    mqs, cids = sort_for_allocation(broker.queues(TOPIC), broker.members["GID_LAB"])
    held = get_strategy("AVG").allocate("GID_LAB", PEER_ID, mqs, cids)
    lab.state.set_assignment("GID_LAB", PEER_ID, [mq.label for mq in held])
    return lab


def test_a_long_client_id_is_shortened_and_the_matrix_stays_in_its_card(browser, tmp_path_factory):
    with fake_lab_server("peer", tmp_path_factory.mktemp("peer"), __name__) as url, \
            logged_in_page(browser, url, 1600, 900) as page:
        label = page.locator(f'{VIEW} tr[data-consumer="{PEER_ID}"] .cid')
        expect(label).to_have_attribute("title", PEER_ID)
        assert len(label.inner_text()) < len(PEER_ID) and label.inner_text().endswith(PEER_ID[-6:])
        owned = page.locator(f'{VIEW} th.queue-head[data-owner="{PEER_ID}"]').first   # its queues' heads too
        expect(owned.locator(".qnote")).to_have_text(label.inner_text())
        card, matrix = page.locator(GROUP).bounding_box(), page.locator(VIEW).bounding_box()
        assert matrix["x"] + matrix["width"] <= card["x"] + card["width"], (matrix, card)
        # broker-b's columns are in view, not pushed out of the card.
        last = page.locator(f'{VIEW} th.queue-head[data-queue="broker-b:3"]').bounding_box()
        assert last["x"] + last["width"] <= card["x"] + card["width"], (last, card)
        screenshot(page, "14-long-client-id")


SCENARIOS = {"scale": scale_lab, "small": served_lab, "peer": peer_lab}

if __name__ == "__main__":   # python -m tests.test_browser_scale SCENARIO PORT
    serve(SCENARIOS[sys.argv[1]], int(sys.argv[2]))
