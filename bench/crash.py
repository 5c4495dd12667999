"""Crash recovery: SIGKILL the broker 10 times under load, for each flush mode.

Each round: start the broker on the same data dir and port (timing start-up until it
listens), send batches until ``--per-round`` more are acknowledged, SIGKILL it. At the end
it is started once more and every queue is read back: how many acknowledged sends were
lost (target 0 with --flush sync; async can lose what a power loss would, a process kill
normally nothing), and how long each restart took. Bounded; stops by itself.

    .venv/bin/python bench/crash.py [--rounds 10] [--per-round 2000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from tests.brokers import FAST_BROKER_ARGS, BrokerProcess, BrokerStubs, Sender, read_all  # noqa: E402
from tests.support import wait_until  # noqa: E402

TOPIC = "CrashTopic"
QUEUES = 4


def run(flush: str, rounds: int, per_round: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"crash-{flush}-") as tmp:
        broker = BrokerProcess(Path(tmp), topics=[f"{TOPIC}:{QUEUES}"], flush=flush, extra_args=FAST_BROKER_ARGS)
        acked: list[str] = []
        restarts = []
        for i in range(rounds):
            started = time.perf_counter()
            broker.start()
            restarts.append(time.perf_counter() - started)
            sender = Sender(broker.address, TOPIC)
            sender.start()
            wait_until(lambda: len(sender.acked) >= per_round, timeout=120, message=f"{per_round} acknowledged sends")
            broker.kill()
            sender.stop.set()
            sender.join(10)
            acked += sender.acked
            print(f"  {flush} round {i + 1}/{rounds}: {len(sender.acked)} acknowledged, "
                  f"restart took {restarts[-1]:.2f} s", flush=True)
        started = time.perf_counter()
        broker.start()
        restarts.append(time.perf_counter() - started)
        try:
            stubs = BrokerStubs(broker.address)
            stored = set(read_all(stubs, TOPIC, QUEUES))
            stubs.close()
        finally:
            broker.stop()
        lost = [m for m in acked if m not in stored]
        return {"flush": flush, "acked": len(acked), "lost": len(lost), "restart_median_s": statistics.median(restarts),
                "restart_max_s": max(restarts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=2000)
    args = parser.parse_args()
    results = [run(flush, args.rounds, args.per_round) for flush in ("sync", "async")]
    print(f"\nSIGKILL x {args.rounds} under load ({args.per_round} acknowledged sends per round):")
    for r in results:
        print(f"  --flush {r['flush']:5}: {r['acked']} acknowledged, {r['lost']} lost; "
              f"restart median {r['restart_median_s']:.2f} s, max {r['restart_max_s']:.2f} s")


if __name__ == "__main__":
    main()
