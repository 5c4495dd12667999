"""The lag history keeps itself fresh while runlab runs (the lag service, issue 14's contract):
the newest complete 10-s window served by /reports/lag.json ends at most 30 s ago, and
keeps doing so as windows advance, with no empty or failed answer in between."""
import json
import time
import urllib.error
from datetime import datetime, timezone

import pytest

from .support import free_port, wait_until
from .test_lab_runlab import children_of, migrated_env, pid_alive, start_lab

pytestmark = pytest.mark.spark

FRESH_S = 30


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


def test_history_stays_within_30_s_while_the_lab_runs(tmp_path):
    env = migrated_env(tmp_path, LAB_LAG_SERVICE="1", SPARK_MASTER="local[1]")
    port = free_port()
    started = time.monotonic()
    lab, browser = start_lab(port, env)
    helpers = []
    try:
        def fresh():
            status, end, age = newest_complete_window(browser, port)
            return age is not None and age <= FRESH_S and (end, age)
        # A cold JVM and the first pass over everything recorded so far.
        end, age = wait_until(fresh, timeout=150, interval=1, message="a window ended within 30 s")
        warm_up = time.monotonic() - started

        ages = []
        for _ in range(3):   # each time the newest window has moved on
            def advanced():
                status, newest, age = newest_complete_window(browser, port)
                assert status == 200 and newest is not None, f"an answer in between: {status}"
                ages.append(age)
                return newest > end and newest
            end = wait_until(advanced, timeout=40, interval=1, message="the newest window to advance")
        status = json.load(browser.open(f"http://127.0.0.1:{port}/history/job/", timeout=10))
        print(f"\nlag service: fresh {warm_up:.0f} s after runlab's start; then the newest complete window's "
              f"age over {len(ages)} answers: max {max(ages):.1f} s, mean {sum(ages) / len(ages):.1f} s; "
              f"service {status['service']}")
        assert max(ages) <= FRESH_S, ages
        assert status["service"]["state"] == "running" and status["service"]["paused"] is None, status
        assert status["newest_window_end"]
        helpers = children_of(lab.process.pid)   # broker, 2 workers, the lag service
        assert len(helpers) == 4
    finally:
        code = lab.stop()
    assert code == 0, "".join(lab.lines)
    assert not [pid for pid in helpers if pid_alive(pid)], "the lag service stopped with the lab"
