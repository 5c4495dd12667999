"""Debian's chromium for the browser tests and bench/page_render.py: where it is, how it is
launched (headless, no sandbox, nothing fetched), the login link runlab and the test
servers print, and the page helpers the browser tests share (a FakeLab server run from a
test module, a logged-in page, what a view shows, what the server says). Never a
downloaded browser: it cannot be fetched here."""
import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager

from .support import REPO, free_port, require, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
LOGIN_LINE = re.compile(r"open (http://\S+/login/\?token=\S+)")
SHOTS = REPO / "test-output" / "screenshots"
VIEW = '[data-assignment-group="GID_LAB"]'


def have_chromium() -> bool:
    return os.path.exists(CHROMIUM)


def require_chromium() -> None:
    """Skip without chromium locally; fail on CI (CI=true), where it must be installed."""
    require(have_chromium(), f"Debian's chromium is not installed at {CHROMIUM} (make chromium)")


@contextmanager
def chromium():
    """A headless chromium (Playwright's Browser), closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def login_url(lines) -> str | None:
    """The login link among a server's output lines, if it printed one yet."""
    found = next((m for m in map(LOGIN_LINE.search, lines) if m), None)
    return found.group(1) if found else None


@contextmanager
def fake_lab_server(scenario: str, data_dir, module: str):
    """A test module as a script (``python -m MODULE SCENARIO PORT``): the dashboard on
    daphne with the scenario's FakeLab inside -> its login URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, scenario, str(free_port())], cwd=REPO,
        env={**os.environ, "LAB_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    try:
        found = wait_until(lambda: login_url(lines) or process.poll() is not None, timeout=60,
                           message=f"the {scenario} server's login URL")
        assert not isinstance(found, bool), "".join(lines)
        yield found
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def logged_in_page(browser, login_url: str, width: int, height: int):
    """A page of ``browser`` logged in through ``login_url``, its websocket live; no page error."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # (60 s, not Playwright's 30: on a slow 2-core machine the CI's Spark clusters beside it
    # once held a login page's load past 30 s; alone it takes ~1 s)
    page.goto(login_url, timeout=60_000)
    page.wait_for_url(re.compile(r"/$"), timeout=60_000)
    expect(page.locator("#ws-status")).to_have_attribute("data-state", "live", timeout=20_000)
    yield page
    page.close()
    assert errors == [], errors


def screenshot(page, name: str, full_page: bool = False) -> None:
    """test-output/screenshots/NAME.png"""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


def shown(page, view: str = VIEW) -> dict[str, dict]:
    """queue -> the view's data-owners and data-state for it."""
    return page.evaluate("""(view) => Object.fromEntries([...document.querySelectorAll(`${view} [data-queue]`)]
        .map((c) => [c.dataset.queue, {owners: c.dataset.owners, state: c.dataset.state}]))""", view)


def server_state(page) -> dict:
    """The page's server's own snapshot (GET /api/state, with the page's session)."""
    origin = re.match(r"https?://[^/]+", page.url).group(0)
    response = page.request.get(f"{origin}/api/state")
    assert response.ok, response.text()
    return response.json()


def api(page, method: str, path: str, body=None) -> dict:
    """A control-API call from the page itself (its session and CSRF token): status and JSON body."""
    return page.evaluate("""async ([method, path, body]) => {
        const token = document.querySelector('meta[name="csrf-token"]').content;
        const r = await fetch(path, { method, credentials: "same-origin", body: body === null ? undefined : JSON.stringify(body),
          headers: { "Content-Type": "application/json", "X-CSRFToken": token } });
        return { status: r.status, body: await r.json() };
    }""", [method, path, body])
