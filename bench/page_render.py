"""The live page at real sizes: what drawing it costs the browser under churn.

    .venv/bin/python bench/page_render.py                          # 16x64, 64x256, 128x1024; 20 s each
    .venv/bin/python bench/page_render.py --sizes 64x256 --seconds 5
    .venv/bin/python bench/page_render.py --lab-js /tmp/old-lab.js  # another lab.js, to compare versions
    .venv/bin/python bench/page_render.py --sizes 4x16,64x256 --seconds 5 --screenshots docs/  # the README's pictures

For each size (consumers x queues: one group, GID_LAB, on 4 brokers, 8 from 1024 queues) this
script serves the dashboard on daphne with a churning FakeLab inside (itself, with --serve)
and opens the page in Debian's chromium at 1600x900. Every 100 ms the lab moves a few queues
between consumers (their assignment events), a tenth of the queues report ProcessQueue
figures (so each queue once a second), the lag moves, and once a second a full snapshot
rides along, as the controller sends. Over --seconds of that it prints:

- total blocking time: the sum over long tasks (PerformanceObserver "longtask") of duration − 50 ms;
- the JS heap in use before and after (each after a forced GC, over CDP);
- event-to-screen latency p50 / p99: each assignment event carries its send time (wall
  clock); the page notes the animation frame after lab.js applied it (the frame that
  draws it), minus that time;
- frames received, and how many were full snapshots.

Bounded: every wait has a deadline, each size's server is stopped after its run.
"""
import argparse
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
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

def churning_lab(consumers: int, queues: int):
    from consumers_app.events import now_ms
    from consumers_app.lab import bus
    from tests.fake_lab import TOPIC, ScaledFakeLab

    brokers, per_broker = layout(consumers, queues)

    class ChurningLab(ScaledFakeLab):
        """The run loop calls report() then publish() every tick."""

        def __init__(self):
            super().__init__(consumers=consumers, brokers=brokers, queues_per_broker=per_broker, tick=TICK_S)
            self.rng = random.Random(7)
            self.ticks = 0
            self.lag = {label: 0 for label in self.labels()}

        def report(self) -> None:
            group = self.groups["GID_LAB"]
            labels = self.labels()
            owners = self.state.owners(group)
            members = self.alive("GID_LAB")
            for _ in range(MOVES_PER_TICK):   # a queue changes hands: both sides report
                label, to = self.rng.choice(labels), self.rng.choice(members)
                if to in owners.get(label, []):
                    continue
                for holder in owners.get(label, []):
                    self.assign(holder, [x for x in group.assignments[holder] if x != label], reason="churn")
                self.assign(to, [*group.assignments.get(to, []), label], reason="churn")
                owners[label] = [to]
            for label in labels[self.ticks % SNAPSHOT_EVERY::SNAPSHOT_EVERY]:
                cached = self.rng.choice([0, 0, 10, 200, 900, 1200])
                for holder in owners.get(label, []):
                    self._emit("pq", "GID_LAB", holder, topic=TOPIC, queue=self.mq(label), cached_count=cached,
                               cached_bytes=cached * 1024, span=cached, inflight=0)
                self.lag[label] = max(0, self.lag[label] + self.rng.randint(-50, 60))
            self.state.set_offsets("GID_LAB", now_ms(), [
                {"label": label, "committed_offset": 0, "max_offset": lag, "min_offset": 0} for label, lag in self.lag.items()])
            self.ticks += 1

        @staticmethod
        def mq(label):
            from consumers_app.message_queue import MessageQueue
            return MessageQueue.from_label(TOPIC, label)

        async def publish(self) -> None:
            frames = [e.to_dict() for e in self.state.drain()]
            sent_ms = time.time() * 1000
            for frame in frames:
                if frame["type"] == "assignment":
                    frame["sent_ms"] = sent_ms   # the bench's stamp: event-to-screen latency
            if self.ticks % SNAPSHOT_EVERY == 0:
                frames.append(self.snapshot())
            await bus.publish(frames)

    return ChurningLab()


def serve_role(size: str, port: int) -> None:
    from tests.fake_lab import serve

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16x64,64x256,128x1024", help="consumers x queues, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--lab-js", help="serve this file as static/js/lab.js (compare versions)")
    parser.add_argument("--screenshots", help="save each size's page (1600x900) as DIR/live-CxQ.png")
    parser.add_argument("--serve", help=argparse.SUPPRESS)   # the server role: a size
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_role(args.serve, args.port)
        return
    if not have_chromium():
        raise SystemExit("Debian's chromium is not installed (make chromium)")

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
