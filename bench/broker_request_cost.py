"""What one remoting request costs the broker's own code, without the sockets: SEND_MESSAGE_V2
and PULL_MESSAGE (32 a pull) run in this process through the broker's frame decoder, its
request handler (consumers_app/broker/remoting/broker_requests.py) and the answer's encoder,
on a temporary store, one at a time, on one core.

`remoting_throughput.py` measures the rate a peer gets over a real connection, where the
broker is a whole core: its microseconds a message are this figure plus the event loop's and
the socket's share. This one moves only with the broker's per-request code, so it is the
figure to compare before and after a change to that code (best of --rounds, the machine's
noise mostly above it).

    .venv/bin/python bench/broker_request_cost.py [--messages 50000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django  # noqa: E402

django.setup()

from consumers_app.broker.core import BrokerConfig, BrokerCore  # noqa: E402
from consumers_app.broker.remoting.broker_requests import BrokerRequests  # noqa: E402
from consumers_app.broker.remoting.service import RemotingService  # noqa: E402
from consumers_app.remoting import wire  # noqa: E402
from consumers_app.remoting.codec import Command, decode, encode  # noqa: E402

TOPIC, QUEUES, BROKER = "BenchRequestCost", 8, "broker-a"


class Connection:
    """What a handler reads of the connection a request came on."""
    address = "127.0.0.1:40000"
    client_id = "127.0.0.1@bench"


def answered(handling) -> Command:
    """Run a handler that answers at once (async flush, no long poll) to its answer."""
    try:
        handling.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the handler waited: this bench measures requests answered at once")


def send_frames(count: int) -> list[bytes]:
    """SEND_MESSAGE_V2 frames (without their length field) as a Java producer sends them."""
    frames = []
    for n in range(count):
        props = wire.properties_to_string({wire.P_UNIQ_KEY: f"BENCH{n:028X}", wire.P_TAGS: "bench", wire.P_WAIT: "true"})
        ext = {"a": "PG_BENCH", "b": TOPIC, "c": "TBW102", "d": 4, "e": n % QUEUES, "f": 0,
               "g": int(time.time() * 1000), "h": 0, "i": props, "j": 0, "k": False}
        frames.append(encode(Command(wire.SEND_MESSAGE_V2, ext, b"x" * 1024, n + 1))[4:])
    return frames


def pull_frame(group: str, queue: int, offset: int) -> bytes:
    ext = {"consumerGroup": group, "topic": TOPIC, "queueId": queue, "queueOffset": offset, "maxMsgNums": 32,
           "sysFlag": wire.PULL_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*"}
    return encode(Command(wire.PULL_MESSAGE, ext, b"", 1))[4:]


def send_round(requests: BrokerRequests, core: BrokerCore, frames: list[bytes]) -> float:
    conn = Connection()
    started = time.perf_counter()
    for i, frame in enumerate(frames):
        answer = answered(requests.handle(conn, decode(frame)))
        assert answer.code == wire.SUCCESS, answer.remark
        encode(answer)
        if i % 256 == 255:   # what the end of a turn of the loop does with 256 in flight
            core.store.write_unwritten()
    core.store.write_unwritten()
    return time.perf_counter() - started


def pull_round(requests: BrokerRequests, group: str, expected: int) -> float:
    conn, pulled = Connection(), 0
    started = time.perf_counter()
    for queue in range(QUEUES):
        offset = 0
        while True:
            answer = answered(requests.handle(conn, decode(pull_frame(group, queue, offset))))
            if answer.code != wire.SUCCESS:
                break
            encode(answer)
            following = int(answer.ext["nextBeginOffset"])
            pulled, offset = pulled + following - offset, following
    elapsed = time.perf_counter() - started
    assert pulled == expected, f"pulled {pulled} of {expected}"
    return elapsed


async def measure(messages: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="request-cost-") as data:
        core = BrokerCore(BrokerConfig(data_dir=Path(data), topics=[f"{TOPIC}:{QUEUES}"], flush="async"))
        core.open()
        await core.start()
        try:
            requests = BrokerRequests(RemotingService(core, "127.0.0.1", 0, 0), BROKER)
            frames = send_frames(messages)
            sends = min(send_round(requests, core, frames) for _ in range(rounds))
            stored = messages * rounds
            pulls = min(pull_round(requests, f"GID_BENCH_{r}", stored) for r in range(rounds))
        finally:
            await core.shutdown()
    print(f"SEND_MESSAGE_V2, 1 KiB, async flush: {sends / messages * 1e6:.2f} us of broker CPU a send "
          f"(best of {rounds} rounds of {messages:,}; {messages / sends:,.0f} sends/s on one core without sockets)")
    print(f"PULL_MESSAGE, 32 a pull: {pulls / stored * 1e6:.2f} us a pulled message "
          f"(best of {rounds} rounds of {stored:,}; {stored / pulls:,.0f} msgs/s on one core without sockets)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="sends a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.messages < 1 or args.rounds < 1:
        parser.error("--messages and --rounds must be at least 1")
    asyncio.run(measure(args.messages, args.rounds))


if __name__ == "__main__":
    main()
