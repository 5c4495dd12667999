"""A flood against a real runlab: every answer is JSON 2xx, 429 or 503, every websocket
stays open (issue: runs for days, overload answered, never crashed)."""
import asyncio
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests

from .runlab import migrated_env, start_lab, wait_for_three
from .support import free_port, manage_py
from .ws_client import LiveSocket


def test_300_reads_and_100_changes_at_once_with_20_websockets_open(tmp_path):
    env = migrated_env(tmp_path)
    token_maker = manage_py("createtoken", "flood", env=env)
    token = token_maker.communicate(timeout=60)[0].strip().splitlines()[-1]
    port = free_port()
    lab, browser = start_lab(port, env)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Token {token}"}
    answers: Counter = Counter()
    odd: list[str] = []

    def call(i: int) -> None:
        if i < 300:
            response = requests.get(f"{base}/api/state", headers=headers, timeout=60)
        else:
            strategy = "AVG_BY_CIRCLE" if i % 2 else "AVG"
            response = requests.post(f"{base}/api/groups/GID_LAB/strategy", headers=headers,
                                     data=json.dumps({"strategy": strategy}), timeout=60)
        is_json = response.headers.get("Content-Type", "").startswith("application/json")
        answers[(response.status_code, is_json)] += 1
        if not is_json or response.status_code not in (200, 429, 503):
            odd.append(f"{response.status_code} {response.text[:120]}")

    async def flood() -> None:
        sockets = [await LiveSocket.connect(f"ws://127.0.0.1:{port}/ws/lab/?token={token}", origin=base)
                   for _ in range(20)]
        for ws in sockets:
            assert (await ws.receive_json(timeout=30))["type"] == "snapshot"
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(400) as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, call, i) for i in range(400)))
        for ws in sockets:   # still open: each answers a snapshot request
            ws.send_json({"type": "snapshot"})
            while (await ws.receive_json(timeout=30))["type"] != "snapshot":
                pass
            await ws.close()

    try:
        wait_for_three(lab, browser, port, timeout=30, message="the scenario")
        asyncio.run(flood())
        print(dict(answers))
        assert not odd, odd[:5]
        assert sum(answers.values()) == 400
        assert answers[(200, True)] >= 300   # reads are never throttled
        assert answers[(429, True)] > 0      # 100 changes at once from one user exceed its budget
    finally:
        assert lab.stop() == 0, "".join(lab.lines)
