"""The embedded broker as a supervised child of ``runlab``.

Started with ``manage.py runbroker``; ready when it prints ``broker listening on``. If
it dies, it is started again on the same port and data dir (the store recovers every
acknowledged message), after a back-off that doubles from 1 s up to 8 s; after
``max_failures`` deaths within ``failure_window_s`` it stays down and ``status()`` says
why, instead of restarting in a tight loop. Consumers reconnect on their own, as
RocketMQ clients do after a broker restart.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections import deque
from typing import Callable

from .lifeline import child_env

log = logging.getLogger(__name__)

READY_LINE = "broker listening on"
NAMESRV_LINE = "name server listening on"   # printed before READY_LINE when remoting is on


class BrokerStartError(Exception):
    pass


class BrokerProcess:
    def __init__(self, argv: list[str], address: str, *, cwd=None, out=None,
                 start_timeout: float = 60.0, max_failures: int = 5, failure_window_s: float = 60.0,
                 backoff_s: tuple[float, float] = (1.0, 8.0), on_change: Callable[[dict], None] | None = None):
        self.argv = argv
        self.address = address
        self.cwd = cwd
        self.out = out or sys.stdout
        self.start_timeout = start_timeout
        self.max_failures = max_failures
        self.failure_window_s = failure_window_s
        self.backoff_s = backoff_s
        self.on_change = on_change or (lambda status: None)
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.namesrv: str | None = None   # host:port of its name server, when remoting is on
        self.up = False
        self.reason = ""
        self.since_ms = 0
        self._failures: deque[float] = deque()
        self._stopping = False
        self._watcher: asyncio.Task | None = None

    def status(self) -> dict:
        """The snapshot's ``broker_process``."""
        return {"up": self.up, "restarts": self.restarts, "pid": self.proc.pid if self.proc else None,
                "address": self.address, "reason": self.reason, "since": self.since_ms,
                "gave_up": self._gave_up()}

    def _gave_up(self) -> bool:
        return len(self._failures) >= self.max_failures and not self.up

    def _set(self, up: bool, reason: str = "") -> None:
        self.up, self.reason, self.since_ms = up, reason, int(time.time() * 1000)
        try:
            self.on_change(self.status())
        except Exception:  # noqa: BLE001 - a listener must not break supervision
            log.exception("broker status listener failed")

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Start the broker and wait until it listens; raise BrokerStartError if it does not."""
        await self._launch()
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="broker-watch")

    async def _launch(self, restart: bool = False) -> None:
        # Its own session: a Ctrl-C reaches only runlab, which stops the broker last,
        # after the consumers said goodbye and committed their offsets. The lifeline
        # makes it exit if runlab dies without that chance (SIGKILL).
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.cwd, env=child_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        ready = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().create_task(self._relay(self.proc, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
        except asyncio.TimeoutError:
            pass
        if not ready.done() or not ready.result():
            await self._terminate()
            raise BrokerStartError(f"the broker did not start on {self.address}")
        if restart:
            self.restarts += 1
        elif self.namesrv:
            # A restart keeps the name server where clients know it ("0" meant any free port once).
            port = self.namesrv.rpartition(":")[2]
            self.argv = [f"--namesrv-port={port}" if a.startswith("--namesrv-port=") else a for a in self.argv]
        self._set(True)

    async def _relay(self, proc, ready: asyncio.Future) -> None:
        """Copy the broker's output, prefixed; resolve ``ready`` on its listening line."""
        async for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(NAMESRV_LINE):
                self.namesrv = line.split()[-1]
            if line.startswith(READY_LINE):
                if not ready.done():
                    ready.set_result(True)
            else:
                self.out.write(f"[broker] {line}")
                self.out.flush()
        if not ready.done():
            ready.set_result(False)

    async def _watch(self) -> None:
        while not self._stopping:
            code = await self.proc.wait()
            if self._stopping:
                return
            now = time.monotonic()
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.failure_window_s:
                self._failures.popleft()
            reason = f"the broker exited with code {code}" if code >= 0 else f"the broker was killed by signal {-code}"
            log.warning("%s", reason)
            if len(self._failures) >= self.max_failures:
                self._set(False, f"{reason}; {len(self._failures)} failures within "
                                 f"{self.failure_window_s:.0f} s: not restarting")
                self.out.write(f"broker down for good: {self.reason}\n")
                return
            self._set(False, reason)
            delay = min(self.backoff_s[1], self.backoff_s[0] * 2 ** (len(self._failures) - 1))
            self.out.write(f"broker died ({reason}); restarting in {delay:g} s\n")
            await asyncio.sleep(delay)
            while not self._stopping:
                try:
                    await self._launch(restart=True)
                    self.out.write(f"broker restarted ({self.restarts} restart(s))\n")
                    break
                except BrokerStartError as exc:
                    self._set(False, str(exc))
                    await asyncio.sleep(self.backoff_s[1])

    async def stop(self, timeout: float = 30.0) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        await self._terminate(timeout)
        self.up = False

    async def _terminate(self, timeout: float = 30.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)   # the broker persists offsets and exits 0
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
