"""What the page tells of rebalances, in the browser (Debian's chromium) against a FakeLab.

What-if: picking another strategy first previews it. The panel's count of moving queues is
what whatif.py computes from the server's own state (`GET /api/state`), the view outlines
exactly those queues, Cancel changes nothing and Apply switches. And only rebalances that
moved queues are shown; those that changed nothing are counted per consumer, as the server
counts them. GID_LAB (3 consumers × 8 queues) shows the matrix, GID_BIG (13 consumers) the
dense grid.
"""
import sys

import pytest
from playwright.sync_api import expect

from consumers_app.allocate import get_strategy
from consumers_app.lab.scenario import GroupSpec
from consumers_app.lab.whatif import preview_strategy

from .browser import fake_lab_server, logged_in_page, server_state, shown
from .fake_lab import TOPIC, FakeLab, serve, served_lab
from .support import wait_until

pytestmark = pytest.mark.browser

# group -> a strategy that moves some of its queues away from AVG
SWITCHES = {"GID_LAB": "AVG_BY_CIRCLE", "GID_BIG": "CONSISTENT_HASH"}


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    with fake_lab_server("whatif", tmp_path_factory.mktemp("whatif"), module=__name__) as url, \
            logged_in_page(browser, url, 1500, 1000) as page:
        for group, kind in (("GID_LAB", "TABLE"), ("GID_BIG", "DIV")):
            expect(page.locator(f'[data-assignment-group="{group}"]')).to_have_js_property("tagName", kind, timeout=20_000)
        yield page


def card(group: str) -> str:
    return f'.group[data-group="{group}"]'


def view(group: str) -> str:
    return f'[data-assignment-group="{group}"]'


def server_preview(page, group: str, strategy: str) -> dict:
    """The preview computed here, from the server's snapshot (every broker is online)."""
    g = server_state(page)["groups"][group]
    return preview_strategy(get_strategy(strategy), group, TOPIC, g["queues"], g["members"], g["assignments"])


def outlined(page, group: str) -> list[str]:
    return sorted(page.evaluate("(v) => [...document.querySelectorAll(`${v} [data-queue][data-would-move]`)]"
                                ".map((c) => c.dataset.queue)", view(group)))


@pytest.mark.parametrize("group", SWITCHES)
def test_a_preview_shows_the_moves_and_cancel_changes_nothing(page, group):
    strategy = SWITCHES[group]
    want = server_preview(page, group, strategy)
    assert want["moved"] > 0
    before = shown(page, view(group))

    page.select_option(f'{card(group)} [data-control="strategy"]', strategy)
    summary = page.locator(f'{card(group)} [data-role="preview-summary"]')
    expect(summary).to_have_attribute("data-moved", str(want["moved"]))
    expect(summary).to_contain_text(f"{want['moved']} queues would move")
    expect(page.locator(f'{card(group)} [data-role="preview-moves"] li').first).to_contain_text(
        f"{want['moves'][0]['queue']}: {' + '.join(want['moves'][0]['from'])} → {want['moves'][0]['to']}")
    wait_until(lambda: outlined(page, group) == sorted(m["queue"] for m in want["moves"]), timeout=10,
               interval=0.1, message="the moving queues outlined in the view")

    page.click(f'{card(group)} [data-action="cancel-strategy"]')
    expect(page.locator(f'{card(group)} [data-role="strategy-preview"]')).to_be_hidden()
    expect(page.locator(f'{card(group)} [data-control="strategy"]')).to_have_value("AVG")
    assert outlined(page, group) == []
    assert server_state(page)["groups"][group]["strategy"] == "AVG"
    assert shown(page, view(group)) == before


def noop_text(n: int) -> str:
    return f"{n} no-op rebalance{'' if n == 1 else 's'}"


@pytest.mark.parametrize("group", SWITCHES)
def test_rebalances_that_changed_nothing_are_counted_not_shown(page, group):
    noops = server_state(page)["groups"][group]["noop_rebalances"]
    assert noops, "the scenario has rebalances that changed nothing"
    total = page.locator(f'{card(group)} [data-role="noop-rebalances"]')
    expect(total).to_have_attribute("data-count", str(sum(noops.values())))
    expect(total).to_have_attribute("title", "\n".join(f"{cid}: {noop_text(n)}" for cid, n in sorted(noops.items())))
    # Per consumer: the matrix row's head, or the grid legend's entry, says it on hover.
    titles = page.evaluate("""(v) => Object.fromEntries([...document.querySelectorAll(
        `${v} tr[data-consumer] > th, ${v} .legend-item`)].map((e) => [e.closest("[data-consumer]").dataset.consumer, e.title]))""",
        view(group))
    for cid, n in noops.items():
        assert noop_text(n) in titles[cid], (cid, titles[cid])
    # The strategy "switched" to the one it had, and changed nothing: the last shown is still the
    # last that moved a queue (none, when every queue kept its first owner), as the totals say.
    header = page.locator(f'{card(group)} [data-role="last-rebalance"]')
    if server_state(page)["groups"][group]["handoffs"]["totals"]["rebalances"]:
        expect(header).to_contain_text("Last rebalance that moved queues")
        expect(page.locator(f'{card(group)} [data-role="handoff-totals"]')).not_to_contain_text("no rebalance moved")
    else:
        expect(header).to_contain_text("No rebalance has moved a queue in the last 15 min")
        expect(page.locator(f'{card(group)} [data-role="handoff-totals"]')).to_contain_text("no rebalance moved a queue")
    expect(header).not_to_contain_text("strategy")


def test_apply_switches_to_the_previewed_assignment(page):
    group, strategy = "GID_LAB", SWITCHES["GID_LAB"]
    want = server_preview(page, group, strategy)
    page.select_option(f'{card(group)} [data-control="strategy"]', strategy)
    expect(page.locator(f'{card(group)} [data-role="preview-summary"]')).to_have_attribute("data-moved", str(want["moved"]))
    page.click(f'{card(group)} [data-action="apply-strategy"]')

    expect(page.locator(card(group))).to_have_attribute("data-strategy", strategy)
    expect(page.locator(f'{card(group)} [data-role="strategy-preview"]')).to_be_hidden()
    owners = {label: {"owners": cid, "state": "owned"} for cid, labels in want["proposed"].items() for label in labels}
    wait_until(lambda: shown(page, view(group)) == owners, timeout=10, interval=0.1,
               message="the view showing the previewed assignment")
    assert server_state(page)["groups"][group]["assignments"] == want["proposed"]
    assert outlined(page, group) == []
    expect(page.locator(f'{card(group)} [data-role="last-rebalance"]')).to_contain_text("strategy")


# ------------------------------------------------------------------ the server (run as a script)

async def whatif_lab() -> FakeLab:
    lab = await served_lab(groups=(GroupSpec("GID_BIG", TOPIC, "push", "AVG", 13),))
    for group in SWITCHES:   # each member rebalances, and nothing changes
        await lab.ask("set_strategy", group=group, strategy="AVG")
    return lab


if __name__ == "__main__":   # python -m tests.test_browser_whatif SCENARIO PORT
    serve({"whatif": whatif_lab}[sys.argv[1]], int(sys.argv[2]))
