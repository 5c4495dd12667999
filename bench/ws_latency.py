"""Websocket latency: from an event's creation to its frame in each of 50 browsers' sockets.

    .venv/bin/python bench/ws_latency.py                 # in-memory layer (one web process, as runlab)
    .venv/bin/python bench/ws_latency.py --layer redis   # publisher and daphne in separate processes

A publisher stamps each event with the wall clock (`created_us`) just before
`bus.publish()`, the path the lab controller uses; the web process forwards it through
`ws/lab/` as in production (origin check, auth, the LabConsumer); clients note when
each frame arrives. Publishing starts once every client has its snapshot and stops
after --seconds. Loopback only, bounded by --timeout, cleans up its processes.
Target: p99 < 200 ms.
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DONE = "bench_done"


def now_us() -> int:
    return time.time_ns() // 1000


# ------------------------------------------------------------------ the publisher (server side)

async def publish_when_ready(clients: int, rate: float, seconds: float, batch_ms: float) -> None:
    """Answer the sockets' snapshot requests; once all `clients` asked, publish for `seconds`."""
    from consumers_app.events import make_event
    from consumers_app.message_queue import MessageQueue
    from consumers_app.lab import bus
    from tests.fake_lab import FakeLab

    # Like the controller, a full snapshot rides along once a second (the biggest frames):
    # a 4-consumer lab's, its controller on the tests' fake broker and never on the bus
    # (only this publisher answers there).
    lab = FakeLab(consumers=4)
    await lab.controller.run_scenario(lab.scenario)
    snapshot = lab.state.snapshot()
    await lab.stop()
    next_snapshot = 0.0

    connected = asyncio.Event()
    asked = 0

    async def handle(action, params):
        nonlocal asked
        if action == "health":   # the driver's /healthz, before any socket
            return {"ok": True, "broker_process": {"up": True}}
        asked += 1
        if asked >= clients:
            connected.set()
        return {"type": "snapshot", "groups": {}}

    server = asyncio.create_task(bus.serve(handle))
    await connected.wait()
    per_batch = max(1, round(rate * batch_ms / 1000))
    seq = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = []
        for _ in range(per_batch):
            event = make_event("pq", "GID_BENCH", "bench", topic="TopicBench",
                               queue=MessageQueue("TopicBench", "broker-a", seq % 8), cached_count=seq % 1000)
            batch.append({**event.to_dict(), "seq": seq, "created_us": now_us()})   # + the bench's stamps
            seq += 1
        if time.monotonic() >= next_snapshot:
            next_snapshot = time.monotonic() + 1.0
            batch.append(snapshot)
        await bus.publish(batch)
        await asyncio.sleep(batch_ms / 1000)   # the controller's flush interval
    await bus.publish([{**make_event("fault", "GID_BENCH", "bench", fault=DONE).to_dict(), "sent": seq}])
    server.cancel()


def serve_role(args) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    publisher = publish_when_ready(args.clients, args.rate, args.seconds, args.batch_ms)
    if args.role == "publisher":           # redis: a process of its own, like a remote controller
        asyncio.run(publisher)
        return
    from daphne.server import Server

    from dashboard.asgi import application

    started = []

    async def app(scope, receive, send):   # memory: the publisher shares daphne's loop, as in runlab
        if not started:
            started.append(asyncio.get_running_loop().create_task(publisher))
        return await application(scope, receive, send)

    Server(app, endpoints=[f"tcp:port={args.port}:interface=127.0.0.1"], verbosity=0).run()


# ------------------------------------------------------------------ the driver (browser side)

async def client(url: str, origin: str, latencies: list[float], timeline: list[tuple[int, float]]) -> int:
    """One browser's socket: note each event's latency until the publisher says it is done."""
    from tests.ws_client import LiveSocket

    ws = await LiveSocket.connect(url, origin=origin)
    try:
        first = await ws.receive_json(30)
        assert first["type"] == "snapshot", first
        while True:
            text = await ws.receive_text(60)
            arrived = now_us()
            frame = json.loads(text)
            if frame.get("fault") == DONE:
                return frame["sent"]
            if "created_us" in frame:
                latencies.append((arrived - frame["created_us"]) / 1000)
                timeline.append((frame["created_us"], latencies[-1]))
    finally:
        await ws.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(args, port: int, web_pid: int) -> None:
    import requests

    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the web process did not start")
        await asyncio.sleep(0.2)
    latencies: list[float] = []
    timeline: list[tuple[int, float]] = []
    url = f"ws://127.0.0.1:{port}/ws/lab/"
    started, cpu_before, own_before = time.monotonic(), cpu_seconds(web_pid), cpu_seconds(os.getpid())
    sent = await asyncio.wait_for(
        asyncio.gather(*(client(url, f"http://127.0.0.1:{port}", latencies, timeline) for _ in range(args.clients))), args.timeout)
    elapsed, web_cpu = time.monotonic() - started, cpu_seconds(web_pid) - cpu_before
    clients_cpu = cpu_seconds(os.getpid()) - own_before
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))]

    expected = sent[0] * args.clients
    print(f"layer={args.layer} clients={args.clients} rate={args.rate:g} events/s batch={args.batch_ms:g} ms "
          f"seconds={args.seconds:g} (run {elapsed:.1f} s)")
    print(f"frames: {len(latencies)} of {expected} ({100 * len(latencies) / max(1, expected):.1f}% delivered)")
    if args.timeline and timeline:
        t0 = min(t for t, _ in timeline)
        worst = {}
        for t, lat in timeline:
            b = int((t - t0) / 500_000)
            worst[b] = max(worst.get(b, 0), lat)
        print("worst per 0.5 s:", " ".join(f"{w:.0f}" for _, w in sorted(worst.items())))
    if latencies:
        print(f"latency ms: p50={pct(50):.1f} p90={pct(90):.1f} p99={pct(99):.1f} max={latencies[-1]:.1f} "
              f"mean={statistics.fmean(latencies):.1f}")
        print(f"target p99 < 200 ms: {'met' if pct(99) < 200 else 'NOT met'}")
    print(f"web process CPU: {web_cpu:.1f} s over {elapsed:.1f} s, {1e6 * web_cpu / max(1, len(latencies)):.0f} µs per frame; "
          f"clients' CPU: {clients_cpu:.1f} s; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layer", choices=["memory", "redis"], default="memory")
    parser.add_argument("--redis", default=os.environ.get("CHANNEL_LAYER_URL", "redis://127.0.0.1:6379/14"))
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100,
                        help="events per second (the default lab with a pop group sends about 60)")
    parser.add_argument("--batch-ms", type=float, default=100, help="publish interval (the controller's flush)")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--timeline", action="store_true", help="also print the worst latency of each 0.5 s")
    parser.add_argument("--role", choices=["web", "publisher"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return serve_role(args)

    from tests.support import free_port

    port = free_port()
    scratch = tempfile.mkdtemp(prefix="ws-latency-")
    env = {**os.environ, "DASHBOARD_PUBLIC_READ": "1", "LAB_DATA_DIR": scratch, "PYTHONUNBUFFERED": "1"}
    common = ["--clients", str(args.clients), "--rate", str(args.rate), "--seconds", str(args.seconds),
              "--batch-ms", str(args.batch_ms)]
    if args.layer == "memory":
        env.pop("CHANNEL_LAYER_URL", None)
        procs = [subprocess.Popen([sys.executable, __file__, "--role", "web", "--port", str(port), *common],
                                  cwd=REPO, env=env)]
    else:
        env["CHANNEL_LAYER_URL"] = args.redis
        procs = [
            subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                              "dashboard.asgi:application"], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            subprocess.Popen([sys.executable, __file__, "--role", "publisher", *common], cwd=REPO, env=env),
        ]
    try:
        asyncio.run(drive(args, port, procs[0].pid))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
