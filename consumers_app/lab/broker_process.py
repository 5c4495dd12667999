"""The embedded broker as a supervised child of ``runlab`` (supervised.py).

Started with ``manage.py runbroker``; ready when it prints ``broker listening on``. If
it dies, it is started again on the same port and data dir (the store recovers every
acknowledged message), after a back-off that doubles from 1 s up to 8 s; after
``max_failures`` deaths within ``failure_window_s`` it stays down and ``status()`` says
why. Consumers reconnect on their own, as RocketMQ clients do after a broker restart.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from .supervised import StartError, SupervisedProcess

log = logging.getLogger(__name__)

READY_LINE = "broker listening on"
NAMESRV_LINE = "name server listening on"   # printed before READY_LINE when remoting is on


class BrokerStartError(StartError):
    pass


class BrokerProcess(SupervisedProcess):
    name = "broker"

    def __init__(self, argv: list[str], address: str, *, cwd=None, out=None,
                 start_timeout: float = 60.0, max_failures: int = 5, failure_window_s: float = 60.0,
                 backoff_s: tuple[float, float] = (1.0, 8.0), on_change: Callable[[dict], None] | None = None):
        super().__init__(argv, cwd=cwd, out=out, max_failures=max_failures, failure_window_s=failure_window_s,
                         backoff_s=backoff_s)
        self.address = address
        self.start_timeout = start_timeout
        self.on_change = on_change or (lambda status: None)
        self.namesrv: str | None = None   # host:port of its name server, when remoting is on
        self.up = False
        self.reason = ""
        self.since_ms = 0
        self._ready: asyncio.Future | None = None

    def status(self) -> dict:
        """The snapshot's ``broker_process``."""
        return {"up": self.up, "restarts": self.restarts, "pid": self.proc.pid if self.proc else None,
                "address": self.address, "reason": self.reason, "since": self.since_ms,
                "gave_up": self.gave_up() and not self.up}

    def on_line(self, line: str) -> bool:
        if line.startswith(NAMESRV_LINE):
            self.namesrv = line.split()[-1]
        if line.startswith(READY_LINE):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(True)
            return True
        return False

    def on_output_end(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)

    async def _started(self, restart: bool) -> None:
        # Made before the relay reads a line: nothing awaits between the launch and here.
        self._ready = ready = asyncio.get_running_loop().create_future()
        try:
            ok = await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
        except asyncio.TimeoutError:
            ok = False
        if not ok:
            raise BrokerStartError(f"the broker did not start on {self.address}")
        if not restart and self.namesrv:
            # A restart keeps the name server where clients know it ("0" meant any free port once).
            port = self.namesrv.rpartition(":")[2]
            self.argv = [f"--namesrv-port={port}" if a.startswith("--namesrv-port=") else a for a in self.argv]

    def _changed(self, up: bool, reason: str = "", gave_up: bool = False) -> None:
        self.up, self.reason, self.since_ms = up, reason, int(time.time() * 1000)
        if not up:
            log.warning("%s", reason)
        if gave_up:
            self.say(f"broker down for good: {reason}")
        try:
            self.on_change(self.status())
        except Exception:  # noqa: BLE001 - a listener must not break supervision
            log.exception("broker status listener failed")

    async def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the broker persists offsets and exits 0."""
        await super().stop(timeout)
        self.up = False
