"""Other people's RocketMQ clients as lab members, each in its own process.

    PEER_CLIENTS                       # name -> PeerKind, e.g. "ali-ons"
    available_clients()                # ["ours", and each peer that is installed]
    peer = PeerConsumer(PEER_CLIENTS["ali-ons"], namesrv, group, topic, on_exit)
    client_id = await peer.start()     # as the broker will list it
    await peer.stop() / peer.kill()    # SIGTERM (it says goodbye) / SIGKILL (a process death)

A peer joins through the broker's name server over remoting and rebalances on its own;
the lab shows as its assignment what it says it holds when it answers
GET_CONSUMER_RUNNING_INFO (the C++ client: its mqTable), else what the broker sees it pull
(ali-ons answers no broker request).

Its script prints every message its listener is given with the message's queue and
offset; those become ``consume`` reports as our consumers send them (counts and consumed
offset ranges per queue, every second: client/base.py's ConsumedRanges), so a hand-off to
or from a peer is measured like one between ours. The C++ client does not say a message's
broker: it is the one broker holding that queue id of the topic (``queue_labels``); where
several do, the peer cannot be measured (``measured`` turns False and nothing is reported).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from consumers_app.client.base import ConsumedRanges
from consumers_app.message_queue import MessageQueue, parse_label

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
OURS = "ours"


CPP_PACKAGE_DIR = REPO / ".venv" / "peers" / "cpp"   # make cpp-peer: kept apart (its module is "rocketmq")


@dataclass(frozen=True)
class PeerKind:
    name: str
    command: tuple[str, ...]         # the peer script, run as "<command> consume NAMESRV GROUP TOPIC"
    needs: tuple[Path, ...]          # what must exist for it to run (installed by make)
    modes: tuple[str, ...] = ("push",)
    actions: tuple[str, ...] = ("stop", "kill")
    pythonpath: Path | None = None
    running_info: bool = False       # answers GET_CONSUMER_RUNNING_INFO (its own mqTable)

    def argv(self, namesrv: str, group: str, topic: str) -> list[str]:
        return [*self.command, "consume", namesrv, group, topic]

    def env(self) -> dict | None:
        if self.pythonpath is None:
            return None
        return {**os.environ, "PYTHONPATH": str(self.pythonpath)}

    def installed(self) -> bool:
        return bool(shutil.which(self.command[0])) and all(p.exists() for p in self.needs)


PEER_CLIENTS = {kind.name: kind for kind in (
    PeerKind("ali-ons", ("node", str(REPO / "peers" / "ali_ons_peer.js")), (REPO / "node_modules" / "ali-ons",)),
    PeerKind("rocketmq-cpp", (sys.executable, str(REPO / "peers" / "cpp_peer.py")),
             (CPP_PACKAGE_DIR / "rocketmq" / "librocketmq.so",), pythonpath=CPP_PACKAGE_DIR, running_info=True),
)}


def available_clients() -> list[str]:
    return [OURS, *(name for name, kind in PEER_CLIENTS.items() if kind.installed())]


REPORT_INTERVAL_S = 1.0   # as our consumers' consume_event_interval_ms


class PeerConsumer:
    def __init__(self, kind: PeerKind, namesrv: str, group: str, topic: str,
                 on_exit: Callable[["PeerConsumer", int], None],
                 on_consumed: Callable[["PeerConsumer", int, dict], None] = lambda p, n, r: None,
                 queue_labels: Callable[[], list[str]] = list):
        self.kind, self.namesrv, self.group, self.topic = kind, namesrv, group, topic
        self.on_exit = on_exit
        self.on_consumed = on_consumed       # (peer, messages, {MessageQueue: [[start, end), ...]})
        self.queue_labels = queue_labels     # the topic's queues as BROKER:QID labels, now
        self.client_id = ""
        self.consumed = 0
        self.measured = True
        self._ranges = ConsumedRanges()
        self._unreported = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self._ready: asyncio.Future | None = None
        self._errors: list[str] = []

    async def start(self, timeout: float = 30) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            *self.kind.argv(self.namesrv, self.group, self.topic), cwd=REPO, env=self.kind.env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._ready = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().create_task(self._read())
        asyncio.get_running_loop().create_task(self._read_errors())
        asyncio.get_running_loop().create_task(self._report_every_interval())
        try:
            self.client_id = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except (TimeoutError, RuntimeError) as exc:
            self.kill()
            raise RuntimeError(f"{self.kind.name} did not start: {exc or 'timeout'}; "
                               + " | ".join(self._errors[-3:])) from None
        return self.client_id

    async def _read(self) -> None:
        async for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if line.get("ready") and not self._ready.done():
                # "" when the client does not say its id: the controller learns it from the broker.
                self._ready.set_result(str(line.get("client_id") or ""))
            elif "id" in line:
                self.consumed += 1
                self._note(line)
        code = await self.proc.wait()
        self._report()   # what it printed before it ended
        if not self._ready.done():
            self._ready.set_exception(RuntimeError(f"it exited with {code}"))
        self.on_exit(self, code)

    def _note(self, line: dict) -> None:
        """One message its listener was given: its queue offset into the ranges."""
        self._unreported += 1
        try:
            topic, queue, offset = str(line["topic"]), int(line["queue"]), int(line["offset"])
        except (KeyError, TypeError, ValueError):
            self.measured = False
            return
        broker = line.get("broker") or self._only_broker_with(queue)
        if broker is None:
            self.measured = False
            return
        self._ranges.note(MessageQueue(topic, broker, queue), offset)

    def _only_broker_with(self, queue_id: int) -> str | None:
        brokers = {broker for broker, qid in map(parse_label, self.queue_labels()) if qid == queue_id}
        return brokers.pop() if len(brokers) == 1 else None

    def _report(self) -> None:
        if not self.client_id:   # the lab learns it from the broker: hold the reports until then
            return
        count, self._unreported = self._unreported, 0
        ranges = self._ranges.drain()
        if not self.measured:
            ranges = {}
        if count or ranges:
            self.on_consumed(self, count, ranges)

    async def _report_every_interval(self) -> None:
        while self.proc.returncode is None:
            await asyncio.sleep(REPORT_INTERVAL_S)
            if self.proc.returncode is None:   # after the end, _read reports the rest
                self._report()

    async def _read_errors(self) -> None:
        async for raw in self.proc.stderr:
            self._errors = [*self._errors[-20:], raw.decode(errors="replace").rstrip()]

    async def stop(self, timeout: float = 10) -> None:
        """SIGTERM: ali-ons closes its consumer (persists offsets, unregisters)."""
        self.stopping = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.kill()

    def kill(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
