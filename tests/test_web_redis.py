"""Two web processes on one Redis channel layer serve the same live lab.

A lab runs in a process of its own (no web server; tests/fake_lab.py: the controller on a
fake broker), two daphne processes serve the dashboard, all three meet on Redis: both
answer /api/state, and an event the controller publishes reaches the websockets of both.
"""
import os
import subprocess
import sys

import pytest
import requests

from .runlab import migrated_env
from .support import REPO, free_port, manage_py, wait_until
from .ws_client import LiveSocket

pytestmark = pytest.mark.lab   # lane: web servers on the real Redis


def _start(args, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _serving(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok
    except requests.RequestException:
        return False


@pytest.fixture
def web_pair(redis_database, tmp_path):
    # A database of our own on the shared Redis, so other test processes' controllers never answer us.
    layer_url = redis_database(0)
    env = {**os.environ, **migrated_env(tmp_path), "CHANNEL_LAYER_URL": layer_url,
           "PYTHONUNBUFFERED": "1", "FAKE_LAB_TICK": "0"}
    token_maker = manage_py("createtoken", "script", env=env)
    token = token_maker.communicate(timeout=60)[0].strip().splitlines()[-1]
    controller = _start(["-m", "tests.fake_lab"], env)
    ports = [free_port(), free_port()]
    webs = [_start(["-m", "daphne", "-b", "127.0.0.1", "-p", str(p), "dashboard.asgi:application"], env)
            for p in ports]
    try:
        assert controller.stdout.readline().strip() == "fake lab serving"
        for port in ports:
            wait_until(lambda: _serving(port), timeout=60, message=f"daphne on {port}")
        yield ports, token
    finally:
        for proc in (controller, *webs):
            proc.terminate()
        for name, proc in (("controller", controller), ("web 1", webs[0]), ("web 2", webs[1])):
            try:
                output = proc.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                proc.kill()
                output = proc.communicate()[0]
            print(f"--- {name} ---\n{output}")  # shown when the test fails


async def frames_until(ws, last) -> list[dict]:
    """The socket's next frames, up to the first that ``last(frame)`` is true of."""
    frames = [await ws.receive_json()]
    while not last(frames[-1]):
        frames.append(await ws.receive_json())
    return frames


async def test_two_web_processes_share_the_lab(web_pair):
    import asyncio

    ports, token = web_pair
    auth = {"Authorization": f"Token {token}"}
    states = [await asyncio.to_thread(requests.get, f"http://127.0.0.1:{p}/api/state", headers=auth, timeout=20)
              for p in ports]
    assert [s.status_code for s in states] == [200, 200]
    assert states[0].json() == states[1].json()

    sockets = [await LiveSocket.connect(f"ws://127.0.0.1:{p}/ws/lab/?token={token}") for p in ports]
    try:
        for ws in sockets:
            assert (await ws.receive_json())["type"] == "snapshot"
        # An action through the first process; the controller publishes, both processes forward.
        response = await asyncio.to_thread(
            requests.post, f"http://127.0.0.1:{ports[0]}/api/groups/GID_LAB/strategy",
            json={"strategy": "AVG_BY_CIRCLE"}, headers=auth, timeout=20)
        assert response.status_code == 200, response.text
        # The lab's word of the switch, then each member's (its fault, rebalance, assignment): c1, c2, c3.
        last = lambda f: (f["type"], f["client_id"]) == ("assignment", "c3")   # noqa: E731
        frames = [await frames_until(ws, last) for ws in sockets]
        assert frames[0] == frames[1]
        assert [(f["client_id"], f["strategy"]) for f in frames[0] if f["type"] == "assignment"] == [
            (cid, "AVG_BY_CIRCLE") for cid in ("c1", "c2", "c3")]
        second = await asyncio.to_thread(requests.get, f"http://127.0.0.1:{ports[1]}/api/state", headers=auth, timeout=20)
        assert second.json()["groups"]["GID_LAB"]["strategy"] == "AVG_BY_CIRCLE"

        # A quiet spell longer than channels-redis' 5 s blocking read must not break the sockets
        # (it did while redis-py's socket timeout equalled it: settings give the layer a longer one).
        with pytest.raises(asyncio.TimeoutError):
            await sockets[0].receive_json(timeout=7)
        response = await asyncio.to_thread(
            requests.post, f"http://127.0.0.1:{ports[1]}/api/consumers/c1/hang", headers=auth, timeout=20)
        assert response.status_code == 200, response.text
        for ws in sockets:
            frame = await ws.receive_json()
            assert (frame["type"], frame["fault"], frame["client_id"]) == ("fault", "hang", "c1")
    finally:
        for ws in sockets:
            await ws.close()
