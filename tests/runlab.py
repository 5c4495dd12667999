"""``manage.py runlab`` (and other manage.py servers) as tests and benches drive them.

    env = migrated_env(tmp_path)              # a data dir with a migrated database
    lab, browser = start_lab(port, env)       # runlab up, an HTTP client logged in
    wait_for_three(lab, browser, port)        # the default scenario settled
    state(browser, port); post(browser, port, "/api/...", body)
    lab.stop()

One ``migrate`` per process: the first ``migrated_env`` migrates a template database, every
later one copies that file (a migrate costs seconds of Django start-up and SQL per lab).
"""
import atexit
import http.cookiejar
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from consumers_app.remoting import wire

from .remoting_peers import call
from .support import free_port, manage_py, wait_until

_template: Path | None = None


def _migrated_database() -> Path:
    """The template: a database file as ``manage.py migrate`` leaves a fresh data dir."""
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="migrated-"))
        atexit.register(shutil.rmtree, folder, True)
        migrate = manage_py("migrate", "--noinput", "-v", "0", env={"LAB_DATA_DIR": str(folder)})
        assert migrate.wait(120) == 0, migrate.stdout.read()
        _template = folder / "db.sqlite3"
    return _template


def migrated_env(tmp_path, **extra) -> dict:
    """A data dir with a migrated database; the lag service off (a JVM per lab would slow the
    suite) unless ``extra`` says 1."""
    env = {"LAB_DATA_DIR": str(tmp_path), "LAB_BROKER": f"127.0.0.1:{free_port()}", "LAB_LAG_SERVICE": "0", **extra}
    if "DATABASE_URL" in env or "DATABASE_URL" in os.environ:   # not the SQLite file: migrate it
        migrate = manage_py("migrate", "--noinput", "-v", "0", env=env)
        assert migrate.wait(120) == 0, migrate.stdout.read()
    else:
        Path(tmp_path).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_database(), Path(tmp_path) / "db.sqlite3")
        os.chmod(Path(tmp_path) / "db.sqlite3", 0o600)   # users and token hashes: owner only
    return env


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:   # a zombie has exited too
        return f.read().split(")")[-1].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().split(")")[-1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


class Server:
    """A manage.py server process whose output lines are collected as they come."""

    def __init__(self, *args, env):
        self.process = manage_py(*args, env=env)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def line_starting(self, prefix: str, timeout: float) -> str:
        found = wait_until(lambda: next((x for x in self.lines if x.startswith(prefix)), None)
                           or self.process.poll() is not None, timeout=timeout, message=repr(prefix))
        assert isinstance(found, str), "".join(self.lines)
        return found.strip()

    def stop(self) -> int:
        # SIGTERM, not SIGINT: a suite started in the background (nohup, `&` without job
        # control) hands its children SIGINT ignored, and runlab keeps it so, as it should.
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()   # a stuck lab fails its test, but leaves nothing running
            raise


def logged_in(url: str) -> urllib.request.OpenerDirector:
    """An HTTP client with a cookie jar, logged in through runlab's one-time URL."""
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    assert browser.open(url, timeout=10).status == 200
    return browser


def start_lab(port: int, env: dict) -> tuple[Server, urllib.request.OpenerDirector]:
    """runlab up, and a browser logged in through the URL it printed."""
    namesrv_port = free_port()
    lab = Server("runlab", "--host", "127.0.0.1", "--port", str(port), "--broker-arg=--client-expiry-ms=3000",
                 "--client-option=*.heartbeat_interval_ms=1000", f"--namesrv-port={namesrv_port}",
                 "--remoting-port=0", env=env)
    try:
        url = lab.line_starting("Rebalance Lab is running", timeout=90).split("open ", 1)[1]
        # Remoting clients are told where to go, and find the lab's topic there.
        assert lab.line_starting("name server:", timeout=5).split()[2] == f"127.0.0.1:{namesrv_port}"
        route = call(f"127.0.0.1:{namesrv_port}", wire.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
        assert route.code == wire.SUCCESS
        assert url.startswith(f"http://127.0.0.1:{port}/login/?token=")
        browser = logged_in(url)
    except BaseException:
        lab.stop()
        raise
    return lab, browser


def cookie_jar(browser):
    return next(h.cookiejar for h in browser.handlers if isinstance(h, urllib.request.HTTPCookieProcessor))


def post(browser, port, path, body):
    """POST JSON to the control API as the logged-in page does (CSRF token and Referer)."""
    csrf = next(c.value for c in cookie_jar(browser) if c.name == "csrftoken")
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "X-CSRFToken": csrf,
                                                             "Referer": f"http://127.0.0.1:{port}/"})
    return json.load(browser.open(request, timeout=30))


def state(browser, port):
    return json.load(browser.open(f"http://127.0.0.1:{port}/api/state", timeout=30))


def shared_by_three(browser, port: int) -> bool:
    group = state(browser, port)["groups"]["GID_LAB"]
    owners = [q["owners"] for q in group["queues"].values()]
    return len(group["assignments"]) == 3 and len(owners) == 8 and all(len(o) == 1 for o in owners)


def wait_for_three(lab, browser, port: int, timeout: float = 30, message: str = "the scenario") -> None:
    """wait_until(shared_by_three), failing with what the lab showed and printed instead."""
    try:
        wait_until(lambda: shared_by_three(browser, port), timeout=timeout, message=message)
    except AssertionError as exc:
        group = state(browser, port)["groups"].get("GID_LAB", {})
        seen = {"assignments": group.get("assignments"),
                "owners": {q: v["owners"] for q, v in group.get("queues", {}).items()}}
        raise AssertionError(f"{exc}; the lab showed {seen}; it printed:\n" + "".join(lab.lines[-40:])) from None


def newest_complete_window(browser, port: int) -> tuple[int, float | None, float | None]:
    """(HTTP status, newest window_end <= now in s since the epoch, its age in s) of lag.json
    for GID_LAB at 10 s from 5 minutes ago."""
    now = time.time()
    since = datetime.fromtimestamp(now - 300, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    url = f"http://127.0.0.1:{port}/reports/lag.json?group=GID_LAB&res=10s&from={since}"
    try:
        body = json.load(browser.open(url, timeout=10))
    except urllib.error.HTTPError as exc:
        return exc.code, None, None
    ends = [datetime.fromisoformat(r["window_end"].replace("Z", "+00:00")).timestamp() for r in body["rows"]]
    complete = [end for end in ends if end <= now]
    return (200, max(complete), now - max(complete)) if complete else (200, None, None)
