"""The lag service (``manage.py lagservice``) as a supervised child of ``runlab``.

Like the broker (consumers_app/lab/broker_process.py): its own session (a Ctrl-C reaches
runlab only, which stops it), the lifeline (it dies with runlab, even a SIGKILLed one),
its output relayed with a prefix, and when it dies it is started again after a back-off
doubling from 1 s up to 30 s; after ``max_failures`` deaths within ``failure_window_s`` it
stays down and says why. Nothing waits for it: the lab runs without history.
"""
from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import deque

from consumers_app.lab.lifeline import child_env

PREFIX = "[lag] "


class LagServiceProcess:
    def __init__(self, argv: list[str], *, cwd=None, out=None, max_failures: int = 5,
                 failure_window_s: float = 300.0, backoff_s: tuple[float, float] = (1.0, 30.0)):
        self.argv = argv
        self.cwd = cwd
        self.out = out or sys.stdout
        self.max_failures = max_failures
        self.failure_window_s = failure_window_s
        self.backoff_s = backoff_s
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._failures: deque[float] = deque()
        self._stopping = False
        self._watcher: asyncio.Task | None = None

    async def start(self) -> None:
        await self._launch()
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="lag-service-watch")

    async def _launch(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.cwd, env=child_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        asyncio.get_running_loop().create_task(self._relay(self.proc))

    async def _relay(self, proc) -> None:
        async for raw in proc.stdout:
            self._say(raw.decode(errors="replace").rstrip("\n"))

    def _say(self, line: str) -> None:
        self.out.write(f"{PREFIX}{line}\n")
        self.out.flush()

    async def _watch(self) -> None:
        while not self._stopping:
            code = await self.proc.wait()
            if self._stopping:
                return
            now = time.monotonic()
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.failure_window_s:
                self._failures.popleft()
            reason = f"exited with code {code}" if code >= 0 else f"killed by signal {-code}"
            if len(self._failures) >= self.max_failures:
                self._say(f"lag service down for good ({reason}; {len(self._failures)} failures within "
                          f"{self.failure_window_s:.0f} s): the history stays as it is")
                return
            delay = min(self.backoff_s[1], self.backoff_s[0] * 2 ** (len(self._failures) - 1))
            self._say(f"lag service {reason}; restarting in {delay:g} s")
            await asyncio.sleep(delay)
            if not self._stopping:
                await self._launch()
                self.restarts += 1

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM: the service ends after its pass in progress (its status says "stopped")."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
