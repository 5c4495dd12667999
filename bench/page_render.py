"""The live page at real sizes: what drawing it costs the browser under churn.

    .venv/bin/python bench/page_render.py                          # 16x64, 64x256, 128x1024; 20 s each
    .venv/bin/python bench/page_render.py --sizes 64x256 --seconds 5
    .venv/bin/python bench/page_render.py --lab-js /tmp/old-lab.js  # another lab.js, to compare versions
    .venv/bin/python bench/page_render.py --sizes 4x16,64x256 --seconds 5 --screenshots docs/  # the README's pictures
    .venv/bin/python bench/page_render.py --real                   # a real runlab grown to 64x256, 20 s of churn

For each size (consumers x queues: one group, GID_LAB, on 4 brokers, 8 from 1024 queues) this
script serves the dashboard on daphne with a churning FakeLab inside (itself, with --serve:
the lab's controller on the tests' fake broker and consumers) and opens the page in Debian's
chromium at 1600x900. Every 100 ms a few queues move between consumers (their assignment
events), a tenth of the queues report ProcessQueue figures (so each queue once a second),
the lag moves; the controller sends the events every flush and, once a second, a full
snapshot. Over --seconds of that it prints:

- total blocking time: the sum over long tasks (PerformanceObserver "longtask") of duration − 50 ms;
- the JS heap in use before and after (each after a forced GC, over CDP);
- event-to-screen latency p50 / p99: each assignment event carries its send time (wall
  clock); the page notes the animation frame after lab.js applied it (the frame that
  draws it), minus that time;
- frames received, and how many were full snapshots.

With --real the page is served by a real ``runlab`` (broker, workers, real consumers, the lag
service as ``make run`` has it; ``--no-lag-service`` without it) in a temp data dir, grown through the API to 64 consumers x 256 queues
(TopicTest 128 + 128 on broker-a and broker-b, GID_LAB 64 push consumers), and the churn is
real too: the script kills a consumer, adds one, kills, adds, switches GID_LAB's strategy
(AVG <-> AVG_BY_CIRCLE), and again, one action at a time and at most one a second, as a user
would through the API; it prints how many of each the lab carried out in the time. The
lab runs on the same cores as chromium (the point: what the page costs while the lab
works). No event carries a send stamp there, so latency is not measured.

Bounded: every wait has a deadline, each size's server is stopped after its run.
"""
import argparse
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser import chromium, have_chromium, login_url  # noqa: E402

TICK_S = 0.1
MOVES_PER_TICK = 2          # queues that change owner every tick (two assignment events each)
SNAPSHOT_EVERY = 10         # ticks: once a second, as the controller


def layout(consumers: int, queues: int) -> tuple[int, int]:
    """(brokers, queues per broker) for a size."""
    brokers = 8 if queues >= 1024 else 4
    return brokers, queues // brokers


# ------------------------------------------------------------------ the server (--serve)

async def churning_lab(consumers: int, queues: int):
    """The lab (its controller on the tests' fake broker and consumers, tests/fake_lab.py) with
    a task that churns its world every tick: consumers report queues moving between them
    and ProcessQueue figures, the lag moves. The controller does the rest as it would:
    events out every flush, a snapshot a second with its offset poll."""
    import asyncio

    from consumers_app.message_queue import MessageQueue
    from tests.fake_lab import TOPIC, served_lab

    brokers, per_broker = layout(consumers, queues)
    lab = await served_lab(consumers=consumers, brokers=brokers, queues_per_broker=per_broker)
    world, rng = lab.world, random.Random(7)
    labels = lab.labels()

    def churn(tick: int) -> None:
        holders = {label: [] for label in labels}
        for consumer in world.running():
            for mq in consumer.held:
                holders[mq.label].append(consumer)
        for _ in range(MOVES_PER_TICK):   # a queue changes hands: both sides report
            label, to = rng.choice(labels), world.consumers[rng.choice(lab.groups["GID_LAB"].members)]
            if to in holders[label]:
                continue
            for holder in holders[label]:
                holder.report_assignment([mq.label for mq in holder.held if mq.label != label], reason="churn")
            to.report_assignment([*(mq.label for mq in to.held), label], reason="churn")
            holders[label] = [to]
        for label in labels[tick % SNAPSHOT_EVERY::SNAPSHOT_EVERY]:
            mq = MessageQueue.from_label(TOPIC, label)
            for holder in holders[label]:
                holder.report_cached(mq, rng.choice([0, 0, 10, 200, 900, 1200]))
            move = rng.randint(-50, 60)   # the lag moves: messages arrive, or the group catches up
            if move > 0:
                world.broker.add_backlog(mq, move)
            else:
                key = ("GID_LAB", mq)
                world.broker.committed[key] = min(world.broker.max_offsets.get(mq, 0),
                                                  world.broker.committed.get(key, 0) - move)

    async def churning() -> None:
        for tick in itertools.count():
            await asyncio.sleep(TICK_S)   # noqa: sleep-ok - the churn's pace, not a wait
            churn(tick)

    lab.churn = asyncio.get_running_loop().create_task(churning())   # lives as long as the lab
    return lab


def stamping_publish(publish):
    """bus.publish, stamping each assignment frame with its send time (wall clock): the
    bench's event-to-screen latency starts there."""
    async def stamped(events: list[dict]) -> None:
        sent_ms = time.time() * 1000
        await publish([{**e, "sent_ms": sent_ms} if e.get("type") == "assignment" else e for e in events])
    return stamped


def serve_role(size: str, port: int) -> None:
    from consumers_app.lab import bus
    from tests.fake_lab import serve

    bus.publish = stamping_publish(bus.publish)   # what the controller's flush loop calls
    consumers, queues = map(int, size.split("x"))
    serve(lambda: churning_lab(consumers, queues), port)


# ------------------------------------------------------------------ the browser side

# Runs in the page before lab.js: long tasks, and for each stamped event the animation
# frame after lab.js handled it (lab.js schedules its render in a frame callback from
# the handler, so ours, registered after, runs once that render is done).
PROBE = r"""
(() => {
  const bench = window.bench = { blocking: 0, longTasks: 0, latencies: [], frames: 0, snapshots: 0 };
  new PerformanceObserver((list) => {
    for (const task of list.getEntries()) { bench.blocking += Math.max(0, task.duration - 50); bench.longTasks += 1; }
  }).observe({ type: "longtask" });
  const onmessage = Object.getOwnPropertyDescriptor(WebSocket.prototype, "onmessage");
  Object.defineProperty(WebSocket.prototype, "onmessage", {
    get() { return onmessage.get.call(this); },
    set(handler) {
      onmessage.set.call(this, (message) => {
        handler(message);
        bench.frames += 1;
        const data = message.data;
        if (data.length > 4096) { if (data.includes('"type":"snapshot"')) bench.snapshots += 1; return; }
        const stamp = /"sent_ms":([0-9.]+)/.exec(data);
        if (stamp) requestAnimationFrame(() => bench.latencies.push(performance.timeOrigin + performance.now() - Number(stamp[1])));
      });
    },
  });
})();
"""

RESET = "() => Object.assign(window.bench, { blocking: 0, longTasks: 0, latencies: [], frames: 0, snapshots: 0 })"


def start_server(size: str, data_dir: str):
    process = subprocess.Popen([sys.executable, __file__, "--serve", size, "--port", str(free_port())], cwd=REPO,
                               env={**os.environ, "LAB_DATA_DIR": data_dir, "PYTHONUNBUFFERED": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and process.poll() is None:
        found = login_url(lines)
        if found:
            return process, found
        time.sleep(0.1)  # noqa: sleep-ok - polling the server's output, bounded by the deadline
    process.kill()
    raise SystemExit(f"the {size} server did not start:\n{''.join(lines)}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def heap_used(cdp) -> float:
    """MiB of JS heap in use after a full GC."""
    cdp.send("HeapProfiler.collectGarbage")
    return cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)] if ordered else float("nan")


def measure(browser, size: str, seconds: float, lab_js: str | None, screenshots: str | None = None) -> dict:
    consumers, queues = map(int, size.split("x"))
    with tempfile.TemporaryDirectory(prefix="page-render-") as data_dir:
        process, url = start_server(size, data_dir)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            if lab_js:
                page.route("**/static/js/lab.js", lambda route: route.fulfill(path=lab_js, content_type="text/javascript"))
            page.add_init_script(PROBE)
            page.goto(url)
            page.wait_for_function("(n) => document.querySelectorAll('[data-group=GID_LAB] [data-queue], "
                                   "[data-group=GID_LAB] th.queue-head').length >= n", arg=queues, timeout=60_000)
            page.wait_for_function("() => window.bench.snapshots >= 2", timeout=60_000)   # warmed up: two churned seconds
            cdp = page.context.new_cdp_session(page)
            before = heap_used(cdp)
            page.evaluate(RESET)
            page.wait_for_timeout(seconds * 1000)   # the measured churn
            seen = page.evaluate("() => window.bench")
            after = heap_used(cdp)
            if screenshots:   # what a user sees at this size, mid-churn (the viewport, no scrolling)
                page.screenshot(path=str(Path(screenshots) / f"live-{size}.png"))
            page.close()
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
    latencies = seen["latencies"]
    return {"size": f"{consumers}x{queues}", "tbt_ms": seen["blocking"], "long_tasks": seen["longTasks"],
            "heap_before": before, "heap_after": after, "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99), "samples": len(latencies), "frames": seen["frames"],
            "snapshots": seen["snapshots"]}


# ------------------------------------------------------------------ a real lab (--real)

REAL_CONSUMERS, REAL_QUEUES_PER_BROKER = 64, 128
REAL_BROKERS = ("broker-a", "broker-b")


class RealLab:
    """``manage.py runlab`` in a temp data dir, and its API with a token."""

    def __init__(self, data_dir: str, lag_service: bool = True):
        self.env = {**os.environ, "LAB_DATA_DIR": data_dir, "LAB_LAG_SERVICE": "1" if lag_service else "0",
                    "PYTHONUNBUFFERED": "1",
                    "LAB_BROKER": f"127.0.0.1:{free_port()}"}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.process = None
        self.token = None

    def manage(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> str:
        """Migrate, make a token, start runlab; its login URL."""
        self.manage("migrate", "--noinput", "-v", "0")
        self.token = self.manage("createtoken", "bench").strip().splitlines()[-1]
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "runlab", "--host", "127.0.0.1", "--port", str(self.port),
             "--namesrv-port", "0", "--remoting-port", "0"], cwd=REPO, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            found = login_url(self.lines)
            if found:
                return found
            time.sleep(0.2)  # noqa: sleep-ok - polling runlab's output, bounded by the deadline
        self.stop()
        raise SystemExit("runlab did not start:\n" + "".join(self.lines[-40:]))

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def api(self, path: str, body: dict | None = None, deadline_s: float = 60) -> dict:
        """One call; a 429 or 503 is waited out (its Retry-After) and sent again, within the deadline."""
        deadline = time.monotonic() + deadline_s
        while True:
            request = urllib.request.Request(self.base + path, headers={"Authorization": f"Token {self.token}"},
                                             data=json.dumps(body).encode() if body is not None else None)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.load(response)
            except urllib.error.HTTPError as exc:
                if exc.code not in (429, 503) or time.monotonic() > deadline:
                    raise SystemExit(f"{path}: {exc.code} {exc.read()[:200]!r}") from None
                wait = float(exc.headers.get("Retry-After") or 1)
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))  # noqa: sleep-ok - the server's Retry-After

    @staticmethod
    def live(state: dict, statuses=("starting", "running", "hung", "cut")) -> list[str]:
        """GID_LAB's consumers in the lab's count (what its 64 limit counts), by id."""
        clients = state["groups"]["GID_LAB"]["clients"]
        return sorted((c for c, info in clients.items() if info.get("status") in statuses), key=lambda c: (len(c), c))

    def grow(self) -> None:
        """TopicTest to 128 queues on each broker, GID_LAB to 64 consumers; wait (bounded)
        until every queue has one owner."""
        state = self.api("/api/state")
        for broker in REAL_BROKERS:
            have = sum(1 for q in state["topics"]["TopicTest"] if q.startswith(broker + ":"))
            if have < REAL_QUEUES_PER_BROKER:
                state = self.api("/api/topics/TopicTest/queues", {"delta": REAL_QUEUES_PER_BROKER - have, "broker": broker})
        deadline = time.monotonic() + 420   # each add waits for the group to settle: seconds at 64 on 2 busy cores
        while len(self.live(state)) < REAL_CONSUMERS and time.monotonic() < deadline:
            try:
                self.api("/api/groups/GID_LAB/consumers", {"mode": "push"})
            except SystemExit as exc:   # a busy worker's start-up timed out: the next state tells
                print(f"(an add failed, tried again: {exc})", flush=True)
            state = self.api("/api/state")
        queues = REAL_QUEUES_PER_BROKER * len(REAL_BROKERS)
        deadline = time.monotonic() + 120   # the consumers see new queues at their route refresh (30 s)
        while time.monotonic() < deadline:
            state = self.api("/api/state")
            owners = [q["owners"] for q in state["groups"]["GID_LAB"]["queues"].values()]
            if len(self.live(state)) >= REAL_CONSUMERS and len(owners) >= queues and all(len(o) == 1 for o in owners):
                return
            time.sleep(1)  # noqa: sleep-ok - polling the lab's state, bounded by the deadline
        print(f"(not settled after 120 s: {len(self.live(state))} consumers, "
              f"{sum(len(o) == 1 for o in owners)} of {queues} queues with one owner; measuring anyway)", flush=True)

    def churn(self, seconds: float, stop: threading.Event, done: list) -> None:
        """One action a second: kill, add, kill, add, strategy switch, and again (a kill
        before each add keeps GID_LAB within its 64). One at a time: an answer can take
        seconds (a change waits for the group to settle), and changes sent on top of it
        would wait in the controller's queue until their callers gave up (503, dropped)."""
        rng = random.Random(7)
        cycle = ["kill", "add", "kill", "add", "strategy"]
        started = time.monotonic()
        step = 0
        while not stop.is_set() and time.monotonic() - started < seconds:
            action = cycle[step % len(cycle)]
            try:
                if action == "strategy":
                    self.api("/api/groups/GID_LAB/strategy",
                             {"strategy": "AVG_BY_CIRCLE" if step // len(cycle) % 2 == 0 else "AVG"}, deadline_s=10)
                elif action == "kill":
                    live = self.live(self.api("/api/state"), statuses=("running",))
                    self.api(f"/api/consumers/{rng.choice(live)}/kill", {}, deadline_s=10)
                else:
                    self.api("/api/groups/GID_LAB/consumers", {"mode": "push"}, deadline_s=10)
                done.append(action)
            except (SystemExit, OSError) as exc:   # said in the result, the measurement goes on
                done.append(f"failed {action}: {exc}")
            step += 1
            stop.wait(max(0.0, started + step - time.monotonic()))


def measure_real(browser, seconds: float, lab_js: str | None, screenshots: str | None = None,
                 lag_service: bool = True) -> dict:
    queues = REAL_QUEUES_PER_BROKER * len(REAL_BROKERS)
    with tempfile.TemporaryDirectory(prefix="page-render-real-") as data_dir:
        lab = RealLab(data_dir, lag_service)
        try:
            url = lab.start()
            lab.grow()
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            if lab_js:
                page.route("**/static/js/lab.js", lambda route: route.fulfill(path=lab_js, content_type="text/javascript"))
            page.add_init_script(PROBE)
            page.goto(url)
            page.wait_for_function("(n) => document.querySelectorAll('[data-group=GID_LAB] [data-queue]').length >= n",
                                   arg=queues, timeout=60_000)
            page.wait_for_timeout(2000)   # warmed up: the first frames after the snapshot drawn
            cdp = page.context.new_cdp_session(page)
            before = heap_used(cdp)
            page.evaluate(RESET)
            stop, done = threading.Event(), []
            churn = threading.Thread(target=lab.churn, args=(seconds, stop, done), daemon=True)
            load_before = os.getloadavg()[0]
            churn.start()
            page.wait_for_timeout(seconds * 1000)   # the measured churn
            seen = page.evaluate("() => window.bench")
            stop.set()
            churn.join(90)
            after = heap_used(cdp)
            if screenshots:
                page.screenshot(path=str(Path(screenshots) / "live-real-64x256.png"))
            page.close()
        finally:
            lab.stop()
    return {"size": f"{REAL_CONSUMERS}x{queues}", "tbt_ms": seen["blocking"], "long_tasks": seen["longTasks"],
            "heap_before": before, "heap_after": after, "p50": float("nan"), "p99": float("nan"), "samples": 0,
            "frames": seen["frames"], "snapshots": seen["snapshots"], "actions": done,
            "load": (load_before, os.getloadavg()[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16x64,64x256,128x1024", help="consumers x queues, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--lab-js", help="serve this file as static/js/lab.js (compare versions)")
    parser.add_argument("--screenshots", help="save each size's page (1600x900) as DIR/live-CxQ.png")
    parser.add_argument("--real", action="store_true",
                        help="a real runlab grown to 64x256 with real churn (kills, adds, strategy switches), not the FakeLab")
    parser.add_argument("--no-lag-service", action="store_true",
                        help="with --real: the lab without its lag service (one JVM less on the cores)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)   # the server role: a size
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_role(args.serve, args.port)
        return
    if not have_chromium():
        raise SystemExit("Debian's chromium is not installed (make chromium)")

    if args.real:
        print(f"load average {os.getloadavg()[0]:.1f} (a shared machine: the lab runs on the same cores); a real runlab "
              f"grown to {REAL_CONSUMERS}x{REAL_QUEUES_PER_BROKER * len(REAL_BROKERS)}, {args.seconds:g} s of churn: "
              "kill, add, kill, add, strategy switch, ... one at a time, at most one a second", flush=True)
        with chromium() as browser:
            r = measure_real(browser, args.seconds, args.lab_js, args.screenshots, not args.no_lag_service)
        print(f"{r['size']:>9} real  TBT {r['tbt_ms']:.0f} ms  long tasks {r['long_tasks']}  "
              f"heap {r['heap_before']:.1f} → {r['heap_after']:.1f} MiB  frames {r['frames']} ({r['snapshots']} snapshots)  "
              f"actions {', '.join(f'{n}x {a}' for a, n in sorted(Counter(r['actions']).items()))}  "
              f"load average {r['load'][0]:.1f} → {r['load'][1]:.1f}", flush=True)
        return
    print(f"load average {os.getloadavg()[0]:.1f}; {args.seconds:g} s of churn per size: every {TICK_S * 1000:.0f} ms "
          f"{MOVES_PER_TICK} queues change owner, 1/{SNAPSHOT_EVERY} of the queues report pq figures; a snapshot a second"
          + (f"; lab.js from {args.lab_js}" if args.lab_js else ""), flush=True)
    print(f"{'size':>9}  {'TBT':>9}  {'long tasks':>10}  {'heap before → after':>20}  {'latency p50 / p99 (n)':>24}  {'frames':>7}  snapshots")
    with chromium() as browser:
        for size in args.sizes.split(","):
            r = measure(browser, size.strip(), args.seconds, args.lab_js, args.screenshots)
            print(f"{r['size']:>9}  {r['tbt_ms']:>7.0f} ms  {r['long_tasks']:>10}  "
                  f"{r['heap_before']:>7.1f} → {r['heap_after']:>5.1f} MiB  "
                  f"{r['p50']:>7.0f} / {r['p99']:>5.0f} ms ({r['samples']:>4})  {r['frames']:>7}  {r['snapshots']:>9}", flush=True)


if __name__ == "__main__":
    main()
