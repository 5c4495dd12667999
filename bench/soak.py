"""Soak: a real ``runlab`` at 5,000 msgs/s with consumer churn, watched for growth.

Starts ``manage.py runlab`` on free loopback ports with a temp LAB_DATA_DIR and a small
commit-log budget (--retention-mb 64, 8 MiB segments), sets the producer to --rate msgs/s
and adds/stops consumers through the API (up to --churn of each, spread over the run;
each add waits for its rebalance, so a busy machine gets through fewer). Every 10 s it
prints disk use per part (the snapshot's "disk"), the RSS of every process in runlab's
tree (/proc), the size of a snapshot's JSON (GET /api/state: what each websocket frame
carries) and the messages stored since the last line. At the end it stops runlab and
times a second one starting on the same data dir. What must stay flat once retention
is reached: disk, RSS, frame size. Bounded; stops by itself.

    .venv/bin/python bench/soak.py [--minutes 5] [--churn 1000] [--rate 5000]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from tests.support import free_port, manage_py  # noqa: E402
from tests.runlab import Server, migrated_env  # noqa: E402

MIB = 1 << 20
SAMPLE_S = 10
RETENTION_MB = 64
BROKER_ARGS = [f"--broker-arg=--retention-mb={RETENTION_MB}", "--broker-arg=--segment-size=8388608"]
CHURN_GROUP = "GID_SOAK"
DISK_PARTS = ("commitlog", "consumequeue", "recordings", "lag_history", "database")


def start_runlab(env: dict) -> tuple[Server, str, float]:
    """runlab on free ports; its URL and how long it took until it said it was running."""
    port = free_port()
    started = time.perf_counter()
    lab = Server("runlab", "--host", "127.0.0.1", "--port", str(port), "--namesrv-port=0", "--remoting-port=0",
                 *BROKER_ARGS, env=env)
    try:
        lab.line_starting("Rebalance Lab is running", timeout=120)
    except BaseException:
        lab.stop()
        raise
    return lab, f"http://127.0.0.1:{port}", time.perf_counter() - started


def process_tree(root: int) -> dict[int, str]:
    """pid -> a name saying what it is, for ``root`` and everything below it."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                pass
    tree, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        tree[pid] = process_name(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    return tree


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except FileNotFoundError:
        return "?"
    if any(a.endswith("manage.py") for a in argv):   # runlab, runbroker
        return argv[[a.endswith("manage.py") for a in argv].index(True) + 1]
    if "--worker-id" in argv:
        return f"worker {argv[argv.index('--worker-id') + 1]}"
    return Path(argv[0]).name


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


class Churn(threading.Thread):
    """Adds a consumer to GID_SOAK, then stops the one added before it, at a steady pace:
    the group keeps one member while the gone ones pile up until the lab forgets them."""

    def __init__(self, api: requests.Session, base: str, total: int, seconds: float):
        super().__init__(daemon=True)
        self.api, self.base, self.total = api, base, total
        self.pause = seconds / max(total, 1)
        self.stop = threading.Event()
        self.added = self.stopped = self.refused = 0

    def post(self, path: str, body: dict | None = None) -> dict | None:
        while not self.stop.is_set():
            response = self.api.post(f"{self.base}/api/{path}", data=json.dumps(body or {}), timeout=60)
            if response.status_code in (429, 503):   # throttled or busy: not applied, so ask again
                self.refused += 1
                self.stop.wait(float(response.headers.get("Retry-After", 1)))
                continue
            response.raise_for_status()
            return response.json()
        return None

    def run(self) -> None:
        previous = None
        while self.added < self.total and not self.stop.is_set():
            due = time.monotonic() + self.pause
            added = self.post(f"groups/{CHURN_GROUP}/consumers", {"mode": "push"})
            if added is None:
                break
            self.added += 1
            if previous is not None and self.post(f"consumers/{previous}/stop") is not None:
                self.stopped += 1
            previous = added["client_id"]
            self.stop.wait(max(0.0, due - time.monotonic()))
        if previous is not None and not self.stop.is_set() and self.post(f"consumers/{previous}/stop") is not None:
            self.stopped += 1


def stored(snapshot: dict) -> int:
    """Messages stored in TopicTest so far: the max offsets of its queues, as the default
    group (GID_LAB subscribes to it) shows them."""
    queues = snapshot["groups"].get("GID_LAB", {}).get("queues", {})
    return sum(q["max_offset"] for q in queues.values())


def disk_line(disk: dict) -> str:
    if not disk:
        return "disk: not measured yet"
    parts = [f"{name} {disk[name] / MIB:.1f}" for name in DISK_PARTS if name in disk]
    budget = disk.get("budget", {}).get("commitlog")
    return f"disk MiB: {' '.join(parts)} total {disk['total'] / MIB:.1f}" + (f" (budget {budget / MIB:.0f})" if budget else "")


def soak(minutes: float, churn_total: int, rate: float) -> None:
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        env = migrated_env(Path(tmp), LAB_CONTROL_RATE="50")   # the churn outpaces the per-user default of 5/s
        maker = manage_py("createtoken", "soak", env=env)
        token = maker.communicate(timeout=60)[0].strip().splitlines()[-1]
        api = requests.Session()
        api.headers["Authorization"] = f"Token {token}"

        lab, base, first_start = start_runlab(env)
        print(f"runlab up in {first_start:.1f} s at {base} (data dir {tmp}); "
              f"producer {rate:g} msgs/s, churn up to {churn_total}, {minutes:g} min", flush=True)
        churn = None
        samples = []
        try:
            api.post(f"{base}/api/producers/rate", data=json.dumps({"topic": "TopicTest", "rate": rate}),
                     timeout=60).raise_for_status()
            churn = Churn(api, base, churn_total, minutes * 60)
            churn.start()
            began = time.monotonic()
            last_count, last_at = None, began
            while time.monotonic() - began < minutes * 60:
                time.sleep(min(SAMPLE_S, max(0.0, began + minutes * 60 - time.monotonic())))
                response = api.get(f"{base}/api/state", timeout=60)
                snapshot, now = response.json(), time.monotonic()
                count = stored(snapshot)
                rss = {f"{name}[{pid}]": rss_mib(pid) for pid, name in process_tree(lab.process.pid).items()}
                produced = "" if last_count is None else f" | stored {(count - last_count) / (now - last_at):,.0f}/s"
                last_count, last_at = count, now
                samples.append({"disk": snapshot.get("disk", {}), "rss": rss, "frame": len(response.content)})
                print(f"t={now - began:4.0f}s {disk_line(snapshot.get('disk', {}))} | rss MiB: "
                      + " ".join(f"{k} {v:.0f}" for k, v in rss.items())
                      + f" | frame {len(response.content) / 1024:.1f} KiB | churn +{churn.added}/-{churn.stopped}"
                      + produced, flush=True)
        finally:
            if churn is not None:
                churn.stop.set()
                churn.join(70)
            stopping = time.perf_counter()
            code = lab.stop()
            print(f"runlab stopped (exit {code}) in {time.perf_counter() - stopping:.1f} s", flush=True)

        second, _, second_start = start_runlab(env)
        second_code = second.stop()
        first, last = samples[0], samples[-1]
        print(f"\nsoak {minutes:g} min at {rate:g} msgs/s, churn {churn.added} adds / {churn.stopped} stops "
              f"({churn.refused} answers 429/503 retried):")
        print(f"  {disk_line(first['disk'])}  ->  {disk_line(last['disk'])}")
        print("  rss MiB: " + ", ".join(f"{name} {first['rss'].get(name, 0):.0f} -> {mib:.0f}"
                                        for name, mib in last["rss"].items()))
        print(f"  frame: {first['frame'] / 1024:.1f} KiB -> {last['frame'] / 1024:.1f} KiB "
              f"(max {max(s['frame'] for s in samples) / 1024:.1f})")
        print(f"  start-up of a second runlab on the same data dir: {second_start:.1f} s "
              f"(the first, on an empty one: {first_start:.1f} s); it stopped with exit {second_code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5, help="how long to soak (at most 10)")
    parser.add_argument("--churn", type=int, default=1000, help="consumers to add and stop over the run")
    parser.add_argument("--rate", type=float, default=5000, help="producer msgs/s")
    args = parser.parse_args()
    if not 0 < args.minutes <= 10:
        parser.error("--minutes must be in (0, 10]")
    soak(args.minutes, args.churn, args.rate)


if __name__ == "__main__":
    main()
