"""A page a user can trust (issue 21), in a real browser (Debian's chromium, 1600x900) against
the whole lab (`manage.py runlab`): a control's error is written next to it, names the
limit broken and stays until the next action on that control; an empty box is never sent
as 0; two groups side by side with a peer's long client id keep their matrices inside
their cards, and c1 keeps the palette's first colour whoever joins; the lag history's
mark labels never overprint each other and its freshness line never contradicts itself.

The history page is drawn from made-up JSON (Playwright answers its three endpoints): its
layout is the subject here, not the lag job (tests/test_lag_job.py runs that on Spark).
"""
import re
from datetime import datetime, timedelta, timezone

import pytest
from playwright.sync_api import expect

from .browser import api, screenshot
from .support import wait_until
from .test_browser_live import lab_url  # noqa: F401 - a lab of this module's own

pytestmark = pytest.mark.browser

LAB = '.group[data-group="GID_LAB"]'
C1_BLUE = "rgb(47, 111, 223)"   # live/colours.js PALETTE[0]

# Every frame the page receives, counted: "after N more frames" is a wait on a condition.
COUNT_FRAMES = """(() => {
  window.framesSeen = 0;
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) { super(...args); this.addEventListener("message", () => { window.framesSeen += 1; }); }
  };
})();"""


@pytest.fixture(scope="module")
def page(lab_url, browser):  # noqa: F811 - lab_url imported above, browser the session's (conftest)
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    page.add_init_script(COUNT_FRAMES)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"{exc}\n{exc.stack}"))
    page.goto(lab_url)
    page.wait_for_url(re.compile(r"/$"))
    expect(page.locator("#ws-status")).to_have_attribute("data-state", "live", timeout=20_000)
    expect(page.locator(f"{LAB} th.queue-head")).to_have_count(8, timeout=30_000)
    yield page
    assert errors == [], errors[0]


def frames_pass(page, n: int) -> None:
    """Wait until the page has received ``n`` more websocket frames (renders happened)."""
    seen = page.evaluate("window.framesSeen")
    page.wait_for_function("(n) => window.framesSeen >= n", arg=seen + n, timeout=20_000)


def inside(inner: dict, outer: dict) -> bool:
    return (outer["x"] - 0.5 <= inner["x"] and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5
            and outer["y"] - 0.5 <= inner["y"] and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 0.5)


def test_an_error_stays_next_to_its_control_names_the_limit_and_goes_with_the_next_action(page):
    form = page.locator("#producer-form")
    rate = form.locator('input[name="rate"]')
    error = form.locator('[data-role="control-error"]')
    rate.fill("60000")
    form.locator('[data-api="rate"]').click()
    expect(error).to_contain_text("between 0 and 50000")
    expect(page.locator("#lab-error")).to_be_hidden()
    assert inside(error.bounding_box(), form.bounding_box())
    frames_pass(page, 10)   # the page went on rendering: the error and the user's value stay
    expect(error).to_have_count(1)
    expect(error).to_be_visible()
    expect(rate).to_have_value("60000")
    screenshot(page, "20-error-stays-next-to-its-control")

    rate.fill("")   # an empty box is said so, never sent as a rate of 0
    form.locator('[data-api="rate"]').click()
    expect(error).to_have_text("Enter a rate in messages per second: a number from 0 to 50000.")
    assert api(page, "GET", "/api/state")["body"]["producers"]["TopicTest"]["rate"] > 0

    rate.fill("180")   # the next action on the control: its error goes, the value in force shows
    form.locator('[data-api="rate"]').click()
    expect(error).to_have_count(0)
    expect(form.locator("#producer-rate")).to_have_text("now 180 msg/s")
    expect(rate).to_have_value("180")
    api(page, "POST", "/api/producers/rate", {"topic": "TopicTest", "rate": 200})
    expect(rate).to_have_value("200")   # a change from elsewhere shows too, once the user's edit was sent

    group = page.locator("#group-form")
    group.locator('input[name="group"]').fill("my group")
    group.locator('button[type="submit"]').click()
    expect(group.locator('[data-role="control-error"]')).to_contain_text("use only letters")
    expect(group.locator('[data-role="control-error"]')).to_contain_text("at most 120 characters")
    expect(error).to_have_count(0)   # each control has its own


def test_an_edited_box_is_not_overwritten_before_it_is_sent(page):
    rate = page.locator('#producer-form input[name="rate"]')
    rate.fill("321")
    page.locator("h2").first.click()   # focus leaves the box: the edit is still the user's
    assert api(page, "POST", "/api/producers/rate", {"topic": "TopicTest", "rate": 190})["status"] == 200
    expect(page.locator("#producer-rate")).to_have_text("now 190 msg/s")
    frames_pass(page, 5)
    expect(rate).to_have_value("321")
    page.locator('#producer-form [data-api="rate"]').click()
    expect(page.locator("#producer-rate")).to_have_text("now 321 msg/s")
    api(page, "POST", "/api/producers/rate", {"topic": "TopicTest", "rate": 200})
    expect(rate).to_have_value("200")


def swatch_colours(page, group: str) -> dict[str, str]:
    return page.evaluate("""(group) => Object.fromEntries([...document.querySelectorAll(`${group} tr[data-consumer] > th .swatch`)]
        .map((s) => [s.closest("[data-consumer]").dataset.consumer, getComputedStyle(s).backgroundColor]))""", group)


def test_two_groups_and_a_peer_fit_their_cards_and_c1_keeps_its_colour(page):
    expect(page.locator(f'{LAB} tr[data-consumer="c1"] .swatch')).to_have_css("background-color", C1_BLUE)
    form = page.locator("#group-form")
    form.locator('input[name="group"]').fill("GID_POP")
    form.locator('select[name="mode"]').select_option("pop")
    form.locator('button[type="submit"]').click()
    expect(page.locator('.group[data-group="GID_POP"]')).to_be_visible(timeout=30_000)
    added = api(page, "POST", "/api/groups/GID_LAB/consumers", {"mode": "push", "client": "ali-ons"})
    assert added["status"] == 200, added
    peer_row = page.locator(f'{LAB} tr[data-consumer*="@"]')
    expect(peer_row).to_have_count(1, timeout=60_000)
    peer = peer_row.get_attribute("data-consumer")
    label = peer_row.locator(".cid")
    expect(label).to_have_attribute("title", peer)
    assert len(label.inner_text()) <= 16, label.inner_text()

    colours = swatch_colours(page, LAB)
    assert colours["c1"] == C1_BLUE, colours
    assert len(set(colours.values())) == len(colours), colours   # the peer wears a colour of its own
    for name in ("GID_LAB", "GID_POP"):
        card = page.locator(f'.group[data-group="{name}"]')
        wrap = card.locator(".matrix-wrap")
        widths = wrap.evaluate("(w) => [w.scrollWidth, w.clientWidth]")
        assert widths[0] <= widths[1], f"{name}'s matrix is wider than its card: {widths}"
        last = card.locator('th.queue-head[data-queue="broker-b:3"]')
        assert inside(last.bounding_box(), card.bounding_box()), name
    cards = [page.locator(f'.group[data-group="{n}"]').bounding_box() for n in ("GID_LAB", "GID_POP")]
    assert abs(cards[0]["y"] - cards[1]["y"]) < 1, "the two groups side by side"
    screenshot(page, "21-two-groups-and-a-peer", full_page=True)

    # Consumers come and go: nobody's colour changes.
    gone = api(page, "POST", "/api/consumers/c2/kill", {})
    assert gone["status"] == 200, gone
    added = api(page, "POST", "/api/groups/GID_LAB/consumers", {"mode": "push"})["body"]["client_id"]
    wait_until(lambda: added in swatch_colours(page, LAB), timeout=30, message=f"{added} on the page")
    after = swatch_colours(page, LAB)
    assert {cid: after[cid] for cid in colours} == colours, (colours, after)
    assert after[added] not in colours.values(), after


# ---------------------------------------------------------------- the lag history page

T0 = datetime(2026, 1, 1, 10, 58, tzinfo=timezone.utc)
PEER = "192.0.2.2@ali-ons-13877"


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def history_data() -> dict:
    """Ten minutes of two topics' 16 queues, with churn: a kill and a peer's rebalance every
    5 s for a minute, then a strategy switch."""
    times = [iso(T0 + timedelta(seconds=10 * i)) for i in range(60)]
    queues = {f"{topic}@{broker}:{q}": {"t": times, "lag": [i * q for i in range(60)], "max_lag": [0] * 60,
                                         "time_lag_ms": [100] * 60, "owner": ["c1"] * 60,
                                         "status": ["OK"] * 30 + ["STALL"] * 30}
              for topic in ("TopicTest", "TopicOther") for broker in ("broker-a", "broker-b") for q in range(4)}
    churn = [T0 + timedelta(seconds=120 + 5 * k) for k in range(12)]
    return {"group": "GID_LAB", "res": "10s", "queues": queues,
            "group_series": {"t": times, **{k: list(range(60)) for k in ("lag", "max_lag", "avg_lag", "p95_lag")},
                             "status": ["OK"] * 60, "time_lag_ms": [1] * 60},
            "rebalances": [{"client_id": PEER, "start": iso(t), "end": iso(t + timedelta(seconds=1)),
                            "duration_ms": 1000, "changed": "[1]"} for t in churn],
            "flow_control": [],
            "marks": [{"kind": "fault", "name": "kill", "client_id": f"c{k + 4}", "t": iso(t), "detail": {}}
                      for k, t in enumerate(churn)]
            + [{"kind": "fault", "name": "strategy", "client_id": None, "t": iso(T0 + timedelta(seconds=400)),
                "detail": {"strategy": "AVG_BY_CIRCLE"}}]}


def history_job(service: dict) -> dict:
    return {"state": "idle", "done": 0, "total": 0, "label": "", "error": None, "service": service, "skipped": [],
            "newest_window_end": iso(T0 + timedelta(seconds=590))}


def open_history(page, service: dict, unprocessed: int = 37):
    """The history page, its endpoints answered with history_data() and ``service``."""
    groups = {"groups": [{"group": "GID_LAB", "first": iso(T0), "last": iso(T0 + timedelta(seconds=590))}],
              "unprocessed_recordings": unprocessed, "job": history_job(service)}
    page.unroute("**/history/**")
    page.route("**/history/groups.json*", lambda route: route.fulfill(json=groups))
    page.route("**/history/data.json*", lambda route: route.fulfill(json=history_data()))
    page.route("**/history/job/*", lambda route: route.fulfill(json=history_job(service)))
    page.goto(re.match(r"https?://[^/]+", page.url).group(0) + "/history/")
    page.wait_for_function("""() => new Set([...document.querySelectorAll('#chart-status .ytick text')]
        .map((t) => t.textContent)).size === 16""", timeout=20_000)


def boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(selector, """(es) => es.map((e) => {
        const r = e.getBoundingClientRect(); return {x: r.left, y: r.top, width: r.width, height: r.height, text: e.textContent};
    })""")


def overlap(a: dict, b: dict) -> bool:
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


def test_history_labels_never_overprint_and_its_freshness_is_one_story(page):
    """(The module's page, logged in: the login link works once.) It goes back to the live
    page at the end, for whichever test runs next."""
    origin = re.match(r"https?://[^/]+", page.url).group(0)
    now_ms = page.evaluate("Date.now()")
    open_history(page, {"state": "running", "paused": None, "newest_sample_ts": now_ms - 5_000})
    for chart in ("#chart-queue-lag", "#chart-group-lag"):
        # The page redraws a chart when its data refreshes, and Plotly lays annotations out
        # after drawing them (0x0 until then): the labels and the plot are measured in one
        # go, at a moment every label has its size.
        measured = page.wait_for_function("""(chart) => {
            const box = (e) => { const r = e.getBoundingClientRect();
                                 return {x: r.left, y: r.top, width: r.width, height: r.height, text: e.textContent}; };
            const labels = [...document.querySelectorAll(chart + ' .annotation')].map(box);
            const plot = document.querySelector(chart + ' .main-svg');
            return labels.length > 0 && plot && labels.every((l) => l.width > 0) ? {labels, plot: box(plot)} : null;
        }""", arg=chart, timeout=20_000).json_value()
        labels, plot = measured["labels"], measured["plot"]
        texts = [label["text"] for label in labels]
        assert any(t.startswith("kill c4 +") or t.startswith("rebalance") for t in texts), texts
        assert "strategy AVG_BY_CIRCLE" in texts, texts
        clashes = [(a["text"], b["text"]) for i, a in enumerate(labels) for b in labels[i + 1:] if overlap(a, b)]
        assert not clashes, f"{chart}: labels overprint each other: {clashes}"
        assert all(inside(label, plot) for label in labels), labels
    # The status chart's queue labels are whole, inside the chart (TopicOther@broker-b:3).
    status = page.locator("#chart-status .main-svg").first.bounding_box()
    ticks = boxes(page, "#chart-status .ytick text")
    assert all(t["x"] >= status["x"] for t in ticks), ticks
    assert {t["text"] for t in ticks} >= {"TopicOther@broker-b:3", "TopicTest@broker-a:0"}
    # Live and fresh: the backlog is not news; nothing says "not processed" beside "live".
    expect(page.locator("#h-service")).to_have_text(re.compile(r"^live: new windows every ~10 s"))
    expect(page.locator("#h-pending")).to_have_text("")
    screenshot(page, "22-history-marks", full_page=True)

    open_history(page, {"state": "running", "paused": None, "newest_sample_ts": now_ms - 600_000})
    expect(page.locator("#h-service")).to_have_text(re.compile(r"^live, but \d+ min behind$"))
    expect(page.locator("#h-pending")).to_have_text("37 recording files not processed yet: the lag service is catching up")
    open_history(page, {"state": "stopped", "paused": None})
    expect(page.locator("#h-service")).to_have_text("")
    expect(page.locator("#h-pending")).to_have_text("37 recording files not processed yet: run the lag job")
    page.unroute("**/history/**")
    page.goto(origin + "/")
    expect(page.locator("#ws-status")).to_have_attribute("data-state", "live", timeout=20_000)
