"""Remoting throughput: send and pull through our broker's RocketMQ remoting port, and each
remoting peer's push consumer next to ours on the same broker in the same run.

The script starts its own broker (free loopback ports, temp data dir, remoting on) and
measures, with 1 KiB messages:

1. remoting send: SEND_MESSAGE_V2 from one connection, --window requests in flight;
2. remoting pull: PULL_MESSAGE (32 per pull) over the 8 queues until the backlog is read;
3. each peer's push consumer draining the backlog in a fresh group: ali-ons (Node.js) and
   rocketmq-client-cpp (peers/cpp_peer.py), where installed, in their ``count`` role: a
   bare line per message, counted here - as our listener only counts (their ``consume``
   role JSON-encodes each 1 KiB body, which cost ali-ons ~40 % of its CPU a message);
4. our PushConsumer draining the same backlog in a fresh group, over gRPC, then over
   remoting (ClientConfig.namesrv) in another fresh group.

Every line carries the CPU the measured processes used over the phase, in cores (1.00 =
one core busy the whole phase): the broker's, and the consumer's (a peer's process; ours
is this process); a peer at ~1 core and a broker well under it means the peer is its own
limit. And the load average when the phase ended: the machine is shared.

Then a second broker with ``--flush sync`` (group commit: a send is answered once fsynced)
for the same send and pull (--no-sync to skip).

Bounded: every phase stops at --seconds. Target: the broker is never the limit for a peer.

    .venv/bin/python bench/remoting_throughput.py [--messages 50000]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from consumers_app.remoting import wire  # noqa: E402
from consumers_app.remoting.client import RemotingClient, broker_addresses  # noqa: E402
from consumers_app.client import ConsumeFromWhere, ConsumeResult, PushConsumer, PushConsumerConfig  # noqa: E402
from tests.brokers import BrokerProcess  # noqa: E402
from tests.remoting_peers import ALI_ONS, CPP, AliOns, Cpp  # noqa: E402

TOPIC, QUEUES = "BenchRemoting", 8
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process (all its threads) so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Phase:
    """Wall time and the CPU of some processes over one phase."""

    def __init__(self, **pids: int):
        self.pids = pids
        self.start()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def end(self, messages: int) -> str:
        """What each process used: cores over the phase and CPU microseconds per message (the
        figure a busy machine moves least)."""
        wall = time.perf_counter() - self.t0
        used = {name: cpu_seconds(pid) - self.cpu0[name] for name, pid in self.pids.items()}
        cpu = ", ".join(f"{name} {s / wall:.2f} ({s * 1e6 / max(messages, 1):.0f} us/msg)" for name, s in used.items())
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        return f"CPU in cores: {cpu}; load average {load}"


async def route_address(namesrv: str) -> str:
    return (await broker_addresses(namesrv, TOPIC))["broker-a"]


async def send(addr: str, total: int, window: int, deadline: float) -> tuple[int, float]:
    """SEND_MESSAGE_V2 as a Java producer sends it (UNIQ_KEY, TAGS, WAIT), ``window`` in flight:
    each answer lets the next request go."""
    client = await RemotingClient.connect(addr)
    body = b"x" * 1024
    done = asyncio.get_running_loop().create_future()
    state = {"sent": 0, "answered": 0, "bad": set()}

    def one() -> None:
        n = state["sent"]
        state["sent"] += 1
        props = wire.properties_to_string({"UNIQ_KEY": f"BENCH{n:028X}", "TAGS": "bench", "WAIT": "true"})
        ext = {"a": "PG_BENCH", "b": TOPIC, "c": "TBW102", "d": 4, "e": n % QUEUES, "f": 0,
               "g": int(time.time() * 1000), "h": 0, "i": props, "j": 0, "k": False}
        client.send(wire.SEND_MESSAGE_V2, ext, body).add_done_callback(answered)

    def answered(future: asyncio.Future) -> None:
        state["answered"] += 1
        if future.cancelled() or future.exception() is not None or future.result().code != wire.SUCCESS:
            state["bad"].add("closed" if future.cancelled() or future.exception() else future.result().code)
        if state["sent"] < total and time.monotonic() < deadline and not state["bad"]:
            one()
        elif state["answered"] == state["sent"] and not done.done():
            done.set_result(None)

    started = time.perf_counter()
    for _ in range(min(window, total)):
        one()
    await done
    elapsed = time.perf_counter() - started
    await client.close()
    if state["bad"]:
        raise RuntimeError(f"send failed with {state['bad']}")
    return state["answered"], elapsed


async def pull(addr: str, total: int, deadline: float) -> tuple[int, float]:
    client = await RemotingClient.connect(addr)
    offsets, got = [0] * QUEUES, 0
    started = time.perf_counter()

    async def one_queue(qid):
        nonlocal got
        while time.monotonic() < deadline and got < total:
            answer = await client.request(wire.PULL_MESSAGE, {
                "consumerGroup": "GID_BENCH_PULL", "topic": TOPIC, "queueId": qid, "queueOffset": offsets[qid],
                "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": "*", "subVersion": 0})
            if answer.code != wire.SUCCESS:
                return
            offsets[qid] = int(answer.ext["nextBeginOffset"])
            got += answer.body.count(wire.MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True))

    await asyncio.gather(*(one_queue(q) for q in range(QUEUES)))
    elapsed = time.perf_counter() - started
    await client.close()
    return got, elapsed


class PeerConsumer:
    """A peer's consumer process, its stdout counted in lines (one per message after the
    ready line), not parsed."""

    def __init__(self, argv: list[str], env: dict | None = None):
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.lines = 0
        self.first: float | None = None    # when the first message line arrived
        self.last: float | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._count, daemon=True).start()

    def _count(self) -> None:
        while chunk := self.proc.stdout.read1(1 << 16):
            now = time.perf_counter()
            self.lines += chunk.count(b"\n")
            if self.lines >= 1:
                self.ready.set()
            if self.lines > 1:
                self.first = self.first or now
                self.last = now
        self.ready.set()

    @property
    def messages(self) -> int:
        return max(0, self.lines - 1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def peer_consume(argv_env: tuple[list[str], dict | None], broker_pid: int, total: int,
                 seconds: float) -> tuple[int, float, str]:
    peer = PeerConsumer(*argv_env)
    try:
        if not peer.ready.wait(60) or peer.proc.poll() is not None:
            raise RuntimeError(f"the peer did not start: {argv_env[0]}")
        phase = Phase(broker=broker_pid, peer=peer.proc.pid)
        deadline = time.monotonic() + seconds
        while peer.messages < total and time.monotonic() < deadline and peer.proc.poll() is None:
            if peer.first is None:
                phase.start()   # the clock starts with the first message, as the rate's does
            time.sleep(0.05)  # noqa: sleep-ok - the bench samples a counter
        got = peer.messages
        cpu = phase.end(got)
        return got, (peer.last - peer.first) if peer.first and peer.last else 0.0, cpu
    finally:
        peer.stop()


async def our_consume(group: str, total: int, seconds: float, broker_pid: int, **connect) -> tuple[int, float, str]:
    """Our PushConsumer draining the backlog in a fresh group; ``connect``: endpoints= (gRPC)
    or namesrv= (remoting)."""
    seen = {"n": 0, "first": None, "last": None}

    def listener(msgs):
        now = time.perf_counter()
        seen["first"] = seen["first"] or now
        seen["n"] += len(msgs)
        seen["last"] = now
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(group, TOPIC, listener, PushConsumerConfig(
        client_id=f"bench-{group}", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **connect))
    await consumer.start()
    phase = Phase(broker=broker_pid, ours=os.getpid())
    deadline = time.monotonic() + seconds
    while seen["n"] < total and time.monotonic() < deadline:
        if seen["first"] is None:
            phase.start()
        await asyncio.sleep(0.05)  # noqa: sleep-ok - the bench samples a counter
    cpu = phase.end(seen["n"])
    await consumer.shutdown()
    return seen["n"], (seen["last"] - seen["first"]) if seen["first"] else 0.0, cpu


def rate(n, s) -> str:
    return f"{n / s:,.0f} msgs/s ({n:,} in {s:.2f} s)" if s > 0 else f"{n:,} messages, no rate"


def send_and_pull(broker: BrokerProcess, args, flush: str) -> int:
    addr = asyncio.run(route_address(broker.namesrv))
    phase = Phase(broker=broker.proc.pid, bench=os.getpid())
    n, s = asyncio.run(send(addr, args.messages, args.window, time.monotonic() + args.seconds))
    print(f"remoting send, {flush} flush (1 KiB, {args.window} in flight): {rate(n, s)}; {phase.end(n)}", flush=True)
    phase = Phase(broker=broker.proc.pid, bench=os.getpid())
    got, s = asyncio.run(pull(addr, n, time.monotonic() + args.seconds))
    print(f"remoting pull, {flush} flush (32 per pull, 8 queues): {rate(got, s)}; {phase.end(got)}", flush=True)
    return n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=256, help="sends in flight")
    parser.add_argument("--seconds", type=float, default=120, help="bound of each phase")
    parser.add_argument("--no-consumers", action="store_true", help="send and pull only")
    parser.add_argument("--no-sync", action="store_true", help="skip the --flush sync broker")
    args = parser.parse_args()
    print(f"load average at start {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp), topics=[f"{TOPIC}:{QUEUES}"],
                                                             remoting=True) as broker:
        total = send_and_pull(broker, args, "async")
        pid = broker.proc.pid
        if not args.no_consumers:
            peers = [("ali-ons", ALI_ONS.is_dir(), "make node-peers",
                      lambda: (["node", AliOns.SCRIPT, "count", broker.namesrv, "GID_BENCH_ALI_ONS", TOPIC], None)),
                     ("rocketmq-client-cpp", (CPP / "rocketmq" / "librocketmq.so").exists(), "make cpp-peer",
                      lambda: Cpp._argv("count", broker.namesrv, "GID_BENCH_CPP", TOPIC))]
            for name, installed, how, argv_env in peers:
                if not installed:
                    print(f"{name} push consumer: not installed ({how})", flush=True)
                    continue
                n, s, cpu = peer_consume(argv_env(), pid, total, args.seconds)
                print(f"{name} push consumer (remoting): {rate(n, s)}; {cpu}", flush=True)
            n, s, cpu = asyncio.run(our_consume("GID_BENCH_OURS", total, args.seconds, pid, endpoints=broker.address))
            print(f"our push consumer (gRPC): {rate(n, s)}; {cpu}", flush=True)
            n, s, cpu = asyncio.run(our_consume("GID_BENCH_OURS_REMOTING", total, args.seconds, pid,
                                                namesrv=broker.namesrv))
            print(f"our push consumer (remoting): {rate(n, s)}; {cpu}", flush=True)
    if not args.no_sync:
        with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp), topics=[f"{TOPIC}:{QUEUES}"],
                                                                 flush="sync", remoting=True) as broker:
            send_and_pull(broker, args, "sync")


if __name__ == "__main__":
    main()
