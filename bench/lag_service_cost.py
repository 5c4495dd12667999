"""What keeping the lag history fresh costs, and how fresh it is, while runlab runs (issue 19).

Starts ``manage.py runlab`` with the lag service on (temp LAB_DATA_DIR, free loopback
ports); in ``--size 64x256`` it first grows TopicTest to 256 queues and GID_LAB to 64
consumers through the API. From ``--after`` seconds after the running line, for
``--seconds``, every 10 s it reads the CPU seconds of the lag service and its JVM (from
/proc: the ``lagservice`` process and every descendant) and asks
``GET /reports/lag.json?group=GID_LAB&res=10s&from=<5 min ago>`` for the newest complete
window's age. Prints each poll, then the average CPU share over the whole span (% of one
core) and the ages. Targets: <= 10 % (default), <= 25 % (64x256); every age <= 10 s.

    .venv/bin/python bench/lag_service_cost.py [--size default|64x256] [--after 120] [--seconds 120] [--poll 1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from dashboard.lag.service import tree_cpu_seconds  # noqa: E402
from tests.support import free_port, manage_py  # noqa: E402
from tests.runlab import children_of, migrated_env, newest_complete_window, start_lab  # noqa: E402


def lag_service_pid(root: int) -> int | None:
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"lagservice" in f.read():
                    return pid
        except OSError:
            continue
        todo += children_of(pid)
    return None


def grow(base: str, token: str, queues: int, consumers: int) -> None:
    """TopicTest to ``queues`` queues and GID_LAB to ``consumers`` members, through the API."""
    api = requests.Session()
    api.headers["Authorization"] = f"Token {token}"

    def post(path: str, body: dict | None = None) -> None:
        while True:
            response = api.post(f"{base}/api/{path}", data=json.dumps(body or {}), timeout=60)
            if response.status_code in (429, 503):
                time.sleep(float(response.headers.get("Retry-After", 1)))  # noqa: sleep-ok - a bench paces itself
                continue
            response.raise_for_status()
            return

    state = api.get(f"{base}/api/state", timeout=60).json()
    have = len(state["groups"]["GID_LAB"]["queues"])
    per_broker = (queues - have) // 2
    for broker in ("broker-a", "broker-b"):
        post("topics/TopicTest/queues", {"delta": per_broker, "broker": broker})
    for _ in range(consumers - len(state["groups"]["GID_LAB"]["assignments"])):
        post("groups/GID_LAB/consumers", {"mode": "push"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=["default", "64x256"], default="default")
    parser.add_argument("--after", type=float, default=120, help="seconds after runlab's running line")
    parser.add_argument("--seconds", type=float, default=120, help="how long to measure")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls of lag.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lagcost-") as data:
        env = migrated_env(Path(data), LAB_LAG_SERVICE="1", LAB_CONTROL_RATE="50", LAB_CONTROL_BURST="100")
        port = free_port()
        lab, browser = start_lab(port, env)
        try:
            running = time.monotonic()
            if args.size == "64x256":
                maker = manage_py("createtoken", "bench", env=env)
                token = maker.communicate(timeout=60)[0].strip().splitlines()[-1]
                grow(f"http://127.0.0.1:{port}", token, 256, 64)
                print(f"grown to 64 consumers x 256 queues in {time.monotonic() - running:.0f} s", flush=True)
            pid = None
            while pid is None and time.monotonic() - running < args.after:
                pid = lag_service_pid(lab.process.pid)
                time.sleep(1)  # noqa: sleep-ok - a bench samples on a clock
            assert pid, "no lag service under runlab"
            time.sleep(max(0.0, running + args.after - time.monotonic()))  # noqa: sleep-ok
            print(f"measuring the lag service (pid {pid}) from {args.after:g} s for {args.seconds:g} s "
                  f"({args.size}); load average {os.getloadavg()[0]:.1f}", flush=True)
            service_status = Path(data) / "lag" / "_service.json"
            start_cpu, start_at, start_passes = tree_cpu_seconds(pid), time.monotonic(), passes(service_status)
            # Polled every ``--poll`` s (not once a slice: a poll locked to the slices' phase
            # would see the same age every time); a line per 10 s with the worst age in it.
            ages, bad, last_cpu, last_at, shown = [], 0, start_cpu, start_at, []
            said = [len(lab.lines)]   # how many lines runlab had printed at each of the last 20 polls
            landings: dict[int, tuple[float, float]] = {}   # pass finished -> (s after its window's end, wall s)
            at = start_at
            while at <= start_at + args.seconds:
                time.sleep(max(0.0, at - time.monotonic()))  # noqa: sleep-ok - a bench paces its polls
                status, _, age = newest_complete_window(browser, port)
                now = time.monotonic()
                note_pass(service_status, landings)
                if status != 200 or age is None:
                    bad += 1
                    print(f"  t={now - running:5.0f} s: answer {status}, no complete window", flush=True)
                else:
                    ages.append(age)
                    shown.append(age)
                    if age > 10:
                        print(f"  t={now - running:5.0f} s: {age:4.1f} s old; {late_why(Path(data), service_status)}",
                              flush=True)
                        # What runlab said in the 20 s before (a failed offset poll skips a tick).
                        for line in lab.lines[said[0]:][-5:]:
                            print(f"    runlab: {line.rstrip()[:200]}", flush=True)
                said = (said + [len(lab.lines)])[-20:]
                if now - last_at >= 10:
                    cpu = tree_cpu_seconds(pid)
                    share = 100 * (cpu - last_cpu) / (now - last_at)
                    last_cpu, last_at = cpu, now
                    print(f"  t={now - running:5.0f} s: newest complete window {min(shown, default=0):4.1f}-"
                          f"{max(shown, default=0):4.1f} s old over {len(shown)} polls; cpu {share:4.1f} % of a core",
                          flush=True)
                    shown = []
                at += args.poll
            spent, folded = tree_cpu_seconds(pid) - start_cpu, passes(service_status) - start_passes
            total = 100 * spent / (time.monotonic() - start_at)
            print(f"{folded} passes: {spent / max(folded, 1):.2f} s of CPU a pass (idle JVM included)", flush=True)
            if landings:
                late = sorted(x for x, _ in landings.values())
                walls = sorted(w for _, w in landings.values())
                print(f"{len(late)} passes seen: the windows of each landed {late[0]:+.2f} / {late[len(late) // 2]:+.2f} / "
                      f"{late[-1]:+.2f} s (min / median / max) from the end of the window it completed, "
                      f"passes of {walls[0]:.2f} / {walls[len(walls) // 2]:.2f} / {walls[-1]:.2f} s wall "
                      f"(a window is served once its pass upserts it: after its end means a poll "
                      f"just before sees the previous one, > 10 s old)", flush=True)
            target = 25 if args.size == "64x256" else 10
            print(f"lag service ({args.size}): {total:.1f} % of one core on average over "
                  f"{time.monotonic() - start_at:.0f} s (target <= {target} %); newest complete window "
                  f"max {max(ages, default=float('nan')):.1f} s / mean "
                  f"{sum(ages) / max(len(ages), 1):.1f} s old over {len(ages)} answers, {bad} empty or failed "
                  f"(target <= 10 s, none); load average {os.getloadavg()[0]:.1f}")
        finally:
            lab.stop()


def note_pass(status_file: Path, landings: dict) -> None:
    """The service's last pass, once: when its windows landed relative to the 10-s grid (the
    end of the window whose slice it folded in: -0.3 is 0.3 s before that end) and its wall time."""
    try:
        last = json.loads(status_file.read_text()).get("last_pass") or {}
    except (OSError, ValueError):
        return
    finished = last.get("finished_ms")
    if not finished or finished in landings:
        return
    # A pass upserts its queue and group windows before it makes the rest (stream.PASS_STAGES).
    landed = last.get("windows_landed_ms") or finished
    offset = landed / 1000 % 10
    landings[finished] = (offset if offset < 5 else offset - 10, float(last.get("seconds") or 0))


def late_why(data: Path, status_file: Path) -> str:
    """What a late window waits for: the newest snapshot slice written (s ago) and the service's
    last pass (finished s ago, its wall time, what it found)."""
    now = time.time()
    written = []
    for hour in (data / "recordings" / "snapshots").glob("date=*/hour=*"):
        written += [f.stat().st_mtime for f in os.scandir(hour) if f.name.startswith("part-")]
    try:
        last = json.loads(status_file.read_text()).get("last_pass") or {}
    except (OSError, ValueError):
        last = {}
    slice_age = f"{now - max(written):.1f} s ago" if written else "none"
    finished = last.get("finished_ms")
    pass_age = f"{now - finished / 1000:.1f} s ago" if finished else "none"
    return (f"newest snapshot slice written {slice_age}, last pass finished {pass_age} "
            f"({last.get('seconds')} s, {last.get('new_files')} new files, {last.get('state')})")


def passes(status_file: Path) -> int:
    """How many passes the lag service has made (its status file; 0 before the first)."""
    try:
        return int(json.loads(status_file.read_text()).get("passes") or 0)
    except (OSError, ValueError):
        return 0


if __name__ == "__main__":
    main()
