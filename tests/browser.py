"""Debian's chromium for the browser tests and bench/page_render.py: where it is, how it is
launched (headless, no sandbox, nothing fetched), and the login link runlab and the test
servers print. Never a downloaded browser: it cannot be fetched here."""
import os
import re
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
LOGIN_LINE = re.compile(r"open (http://\S+/login/\?token=\S+)")


def have_chromium() -> bool:
    return os.path.exists(CHROMIUM)


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
