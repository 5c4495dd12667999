"""The Lab controls in a real browser (Debian's chromium) against the whole lab (`manage.py
runlab`): a control's error is written next to it, the topic menus offer the user's topics
only, inputs show the values in force, a consumer keeps its colour while others come and
go, and close rebalance marks are one cluster that lists them.
"""
import re

import pytest
from playwright.sync_api import expect

from .support import wait_until
from .browser import api, screenshot
from .test_browser_live import GROUP, lab_url  # noqa: F401 - the same kind of lab (a module of its own)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(lab_url, browser):  # noqa: F811 - lab_url imported above, browser the session's (conftest)
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"{exc}\n{exc.stack}"))
    page.goto(lab_url)
    page.wait_for_url(re.compile(r"/$"))
    expect(page.locator("#ws-status")).to_have_attribute("data-state", "live", timeout=20_000)
    yield page
    assert errors == [], errors[0]


def state(page) -> dict:
    return api(page, "GET", "/api/state")["body"]


def live_consumers(page) -> list[str]:
    clients = state(page)["groups"]["GID_LAB"]["clients"]
    return sorted(c for c, info in clients.items() if info["status"] == "running")


def test_a_controls_error_is_next_to_it_and_names_the_limit(page):
    form = page.locator("#group-form")
    form.locator('input[name="group"]').fill("G" * 121)
    form.locator('button[type="submit"]').click()
    error = form.locator('[data-role="control-error"]')
    expect(error).to_be_visible()
    expect(error).to_contain_text("at most 120")
    expect(page.locator("#lab-error")).to_be_hidden()
    # In view where the user looks: inside the form's own box, under its controls.
    box, shown = form.bounding_box(), error.bounding_box()
    assert box["y"] <= shown["y"] and shown["y"] + shown["height"] <= box["y"] + box["height"] + 1
    screenshot(page, "10-error-next-to-its-control")
    form.locator('input[name="group"]').fill("GID_POP")
    form.locator('select[name="mode"]').select_option("pop")
    form.locator('button[type="submit"]').click()
    expect(error).to_have_count(0)   # a good request clears it
    wait_until(lambda: "GID_POP" in state(page)["groups"], timeout=30, message="the pop group")


def test_topic_menus_offer_the_users_topics_only_and_inputs_the_values_in_force(page):
    # Failing consumers send messages back: the broker makes the group's %RETRY% topic.
    victim = live_consumers(page)[0]
    assert api(page, "POST", f"/api/consumers/{victim}/fail", {"ratio": 1})["status"] == 200
    try:
        # The lab lists topics again when a broker changes: "bring online" an online one (a no-op) to ask.
        wait_until(lambda: "%RETRY%GID_LAB" in api(page, "POST", "/api/brokers/broker-a/online", {})["body"]["topics"],
                   timeout=60, interval=2, message="a %RETRY% topic")
        page.reload()
        expect(page.locator("#ws-status")).to_have_attribute("data-state", "live", timeout=20_000)
        for form in ("#producer-form", "#queues-form"):
            select = page.locator(f"{form} .topic-select")
            expect(select.locator("option").first).to_have_attribute("value", "TopicTest")
            offered = select.locator("option").evaluate_all("(os) => os.map((o) => o.value)")
            assert offered and not [t for t in offered if t.startswith("%")], offered
            assert select.input_value() == "TopicTest"
        # The fail ratio in force on that consumer, not the preset.
        card = page.locator(GROUP)
        card.locator('select[name="client_id"]').select_option(victim)
        expect(card.locator('input[name="ratio"]')).to_have_value("1")
    finally:
        api(page, "POST", f"/api/consumers/{victim}/fail", {"ratio": 0})
    assert api(page, "POST", "/api/producers/rate", {"topic": "TopicTest", "rate": 150})["status"] == 200
    expect(page.locator('#producer-form input[name="rate"]')).to_have_value("150")
    api(page, "POST", "/api/producers/rate", {"topic": "TopicTest", "rate": 200})
    expect(page.locator('#producer-form input[name="rate"]')).to_have_value("200")


def swatches(page) -> dict[str, str]:
    return page.evaluate("""(group) => Object.fromEntries([...document.querySelectorAll(
        `${group} tr[data-consumer] > th .swatch`)].map((s) => [s.closest("[data-consumer]").dataset.consumer, s.style.background]))""",
        GROUP)


def test_a_consumer_keeps_its_colour_while_others_come_and_go_and_close_marks_cluster(page):
    before = wait_until(lambda: (s := swatches(page)) and len([c for c in s if c in live_consumers(page)]) >= 3 and s,
                        timeout=30, message="the consumers' swatches")
    first, *others = live_consumers(page)
    strip = f'{GROUP} [data-role="rebalances"]'

    def newest_mark(since: float):
        """The newest rebalance on the strip that began at or after ``since`` (ms), if any."""
        marks = page.eval_on_selector_all(f"{strip} .rebalance-mark", """(ms) => ms.map((m) =>
            ({ ts: Number(m.dataset.ts), end: Number(m.dataset.endTs) }))""")
        return max((m for m in marks if m["ts"] >= since), key=lambda m: m["ts"], default=None)

    now = lambda: page.evaluate("Date.now()")   # noqa: E731 - the page's clock, as the strip's
    # A kill, then (once its rebalance is over: 3 s quiet, handoff.py) an add: consumers come
    # and go, and two rebalances follow each other within a cluster's gap (18 px of the strip: ~10 s here).
    victim = others[0]
    killed_at = now()
    assert api(page, "POST", f"/api/consumers/{victim}/kill", {})["status"] == 200
    kill = wait_until(lambda: newest_mark(killed_at), timeout=30, message="the kill's rebalance")
    wait_until(lambda: now() - newest_mark(killed_at)["end"] > 3_100, timeout=30, message="the kill's rebalance over")
    kill = newest_mark(killed_at)
    added = api(page, "POST", "/api/groups/GID_LAB/consumers", {"mode": "push"})["body"]["client_id"]
    wait_until(lambda: added in swatches(page), timeout=30, message=f"{added} on the page")
    wait_until(lambda: newest_mark(kill["end"] + 1), timeout=30, message="the add's rebalance")
    after = swatches(page)
    assert after[first] == before[first], (before, after)
    survivors = [c for c in after if c in live_consumers(page)]
    assert len({after[c] for c in survivors}) == len(survivors), after   # each its own colour

    def close_pair():
        """Two neighbours closer than the strip's cluster gap (its width's 18 px) - in one cluster."""
        gap = int(page.get_attribute(strip, "data-cluster-ms"))
        marks = page.eval_on_selector_all(f"{strip} .rebalance-mark", """(ms) => ms.map((m) => ({
            id: m.dataset.rebalanceId, ts: Number(m.dataset.ts),
            cluster: m.closest(".rebalance-cluster")?.dataset.ids || null }))""")
        marks.sort(key=lambda m: m["ts"])
        return next(([a, b] for a, b in zip(marks, marks[1:]) if b["ts"] - a["ts"] < gap), None)

    pair = wait_until(close_pair, timeout=30, message="two rebalances close together")
    assert pair[0]["cluster"] and pair[0]["cluster"] == pair[1]["cluster"], pair
    cluster = page.locator(f'{strip} .rebalance-cluster[data-ids="{pair[0]["cluster"]}"]')
    members = pair[0]["cluster"].split(",")
    expect(cluster.locator(".rebalance-cluster-head")).to_have_text(str(len(members)))
    cluster.locator(".rebalance-cluster-head").click()
    listed = cluster.locator(".rebalance-cluster-list .rebalance-mark")
    expect(listed).to_have_count(len(members))
    screenshot(page, "11-rebalance-cluster")
    listed.nth(len(members) - 1).click()
    summary = page.locator(f'{GROUP} [data-role="handoff-summary"]')
    expect(summary).to_have_attribute("data-rebalance-id", members[-1])
    # The strip's marks and clusters never sit on top of each other.
    spans = sorted(page.eval_on_selector_all(f"{strip} > *", """(es) => es.map((e) =>
        (e.classList.contains("rebalance-cluster") ? e.querySelector(".rebalance-cluster-head") : e).getBoundingClientRect())
        .map((r) => [r.left, r.right])"""))
    assert all(a[1] <= b[0] + 0.5 for a, b in zip(spans, spans[1:])), spans
