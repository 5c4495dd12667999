"""``manage.py runlab`` as a user runs it: broker, web and lab up, a login URL, a clean stop."""
import http.cookiejar
import json
import os
import signal
import threading
import urllib.request

from consumers_app.remoting import wire

from .remoting_peers import call
from .support import free_port, manage_py, wait_until


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


def migrated_env(tmp_path, **extra) -> dict:
    """A migrated data dir; the lag service off (a JVM per lab would slow the suite) unless ``extra`` says 1."""
    env = {"LAB_DATA_DIR": str(tmp_path), "LAB_BROKER": f"127.0.0.1:{free_port()}", "LAB_LAG_SERVICE": "0", **extra}
    migrate = manage_py("migrate", "--noinput", "-v", "0", env=env)
    assert migrate.wait(120) == 0, migrate.stdout.read()
    return env


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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(60)


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
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        assert browser.open(url, timeout=10).status == 200
    except BaseException:
        lab.stop()
        raise
    return lab, browser


def shared_by_three(browser, port: int) -> bool:
    state = json.load(browser.open(f"http://127.0.0.1:{port}/api/state", timeout=10))
    group = state["groups"]["GID_LAB"]
    owners = [q["owners"] for q in group["queues"].values()]
    return len(group["assignments"]) == 3 and len(owners) == 8 and all(len(o) == 1 for o in owners)


def wait_for_three(lab, browser, port: int, timeout: float = 30, message: str = "the scenario") -> None:
    """wait_until(shared_by_three), failing with what the lab showed and printed instead."""
    try:
        wait_until(lambda: shared_by_three(browser, port), timeout=timeout, message=message)
    except AssertionError as exc:
        state = json.load(browser.open(f"http://127.0.0.1:{port}/api/state", timeout=10))
        group = state["groups"].get("GID_LAB", {})
        seen = {"assignments": group.get("assignments"),
                "owners": {q: v["owners"] for q, v in group.get("queues", {}).items()}}
        raise AssertionError(f"{exc}; the lab showed {seen}; it printed:\n" + "".join(lab.lines[-40:])) from None


def test_runlab_starts_everything_prints_a_login_url_and_stops_cleanly(tmp_path):
    port = free_port()
    lab, browser = start_lab(port, migrated_env(tmp_path))
    helpers = []
    try:
        progress = [x.strip() for x in lab.lines if not x.startswith("[broker]")]
        assert progress[:5] == ["migrating database…", "starting broker…", "broker ready", "starting workers…",
                                "scenario running"]
        wait_for_three(lab, browser, port, timeout=30, message="the default scenario via the API")
        helpers = children_of(lab.process.pid)   # the broker and the worker processes
        assert len(helpers) == 3
    finally:
        code = lab.stop()
    assert code == 0, "".join(lab.lines)
    assert "Rebalance Lab stopped" in "".join(lab.lines)
    assert not [pid for pid in helpers if pid_alive(pid)], "broker and workers stopped with the lab"


def test_a_second_web_process_reaches_the_controller_over_redis(tmp_path, redis_url):
    # Its own Redis database: another suite's controller must not answer ours.
    env = migrated_env(tmp_path, CHANNEL_LAYER_URL=redis_url.rsplit("/", 1)[0] + "/11")
    port, other_port = free_port(), free_port()
    lab, browser = start_lab(port, env)
    web = Server("runweb", "--no-controller", "--host", "127.0.0.1", "--port", str(other_port), env=env)
    try:
        web.line_starting("web listening on", timeout=30)
        wait_for_three(lab, browser, other_port, timeout=60, message="the default scenario through the second web process")
    finally:
        assert web.stop() == 0, "".join(web.lines)
        lab.stop()
