"""Lag history freshness while runlab runs, measured as issue 14's contract states it.

Starts ``manage.py runlab`` (default scenario, the lag service on) on free loopback ports
with a temp LAB_DATA_DIR, waits --after seconds from its running line, then every 10 s for
--seconds asks ``GET /reports/lag.json?group=GID_LAB&res=10s&from=<5 minutes ago>`` and
prints the age of the newest complete window (window_end <= now) and any answer that is
empty or not 200. Target: every age <= 30 s (aim 10 s). Bounded; stops by itself.

    .venv/bin/python bench/lag_freshness.py [--after 120] [--seconds 60] [--master local[*]]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import free_port  # noqa: E402
from tests.runlab import migrated_env, newest_complete_window, start_lab  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--after", type=float, default=120, help="seconds after runlab's running line")
    parser.add_argument("--seconds", type=float, default=60, help="how long to ask, every 10 s")
    parser.add_argument("--master", default="local[*]", help="SPARK_MASTER for the lag service")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="freshness-") as data:
        env = migrated_env(Path(data), LAB_LAG_SERVICE="1", SPARK_MASTER=args.master)
        port = free_port()
        lab, browser = start_lab(port, env)
        try:
            running = time.monotonic()
            print(f"runlab running; asking from {args.after:g} s on, every 10 s for {args.seconds:g} s", flush=True)
            ages, bad = [], []
            at = running + args.after
            while at <= running + args.after + args.seconds:
                time.sleep(max(0.0, at - time.monotonic()))  # noqa: sleep-ok - a bench samples on a clock
                status, _, age = newest_complete_window(browser, port)
                if status != 200 or age is None:
                    bad.append(status)
                    print(f"  t={at - running:5.0f} s: answer {status}, no complete window", flush=True)
                else:
                    ages.append(age)
                    print(f"  t={at - running:5.0f} s: newest complete window ended {age:5.1f} s ago", flush=True)
                at += 10
            if ages:
                print(f"freshness ({args.master}): max {max(ages):.1f} s, mean {sum(ages) / len(ages):.1f} s over "
                      f"{len(ages)} answers; {len(bad)} empty or failed (target: max <= 30 s, none empty)")
        finally:
            lab.stop()


if __name__ == "__main__":
    main()
