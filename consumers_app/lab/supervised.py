"""A child process runlab keeps running: the broker (broker_process.py) and the lag
service (dashboard/lag/service_process.py) are the two kinds.

Each runs in its own session (a Ctrl-C reaches runlab only, which stops its children in
order), with the lifeline (it exits when runlab dies, even a SIGKILLed one), its output
relayed line by line. When it dies it is started again after a back-off that doubles
from ``backoff_s[0]`` up to ``backoff_s[1]``; after ``max_failures`` deaths within
``failure_window_s`` it stays down and says why, instead of restarting in a tight loop.

A kind says what its lines mean (``on_line``), what a start must wait for (``_started``)
and what to tell the world (``_changed``): everything else is here, once.
"""
from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import deque

from .lifeline import child_env


class StartError(Exception):
    """The child did not come up."""


class SupervisedProcess:
    name = "child"      # in the messages ("the broker exited with code 1")

    def __init__(self, argv: list[str], *, cwd=None, out=None, max_failures: int = 5,
                 failure_window_s: float = 60.0, backoff_s: tuple[float, float] = (1.0, 8.0)):
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

    # -- what a kind fills in ---------------------------------------------------------

    def on_line(self, line: str) -> bool:
        """A line of the child's output; True when it was handled (not relayed)."""
        return False

    def on_output_end(self) -> None:
        """The child closed its output (it is exiting)."""

    async def _started(self, restart: bool) -> None:
        """Wait until a fresh child is ready; raise StartError if it is not."""

    def _changed(self, up: bool, reason: str = "", gave_up: bool = False) -> None:
        """The child went down (``reason``), came back, or will not be restarted."""

    def say(self, line: str) -> None:
        self.out.write(line if line.endswith("\n") else line + "\n")
        self.out.flush()

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        await self._launch()
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name=f"{self.name}-watch")

    def gave_up(self) -> bool:
        return len(self._failures) >= self.max_failures

    async def _launch(self, restart: bool = False) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.cwd, env=child_env(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        asyncio.get_running_loop().create_task(self._relay(self.proc))
        try:
            await self._started(restart)
        except StartError:
            await self._terminate()
            raise
        if restart:
            self.restarts += 1
        self._changed(True)

    async def _relay(self, proc) -> None:
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if not self.on_line(line):
                self.relay(line)
        self.on_output_end()

    def relay(self, line: str) -> None:
        self.say(f"[{self.name}] {line}")

    async def _watch(self) -> None:
        while not self._stopping:
            code = await self.proc.wait()
            if self._stopping:
                return
            now = time.monotonic()
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.failure_window_s:
                self._failures.popleft()
            reason = f"the {self.name} exited with code {code}" if code >= 0 else f"the {self.name} was killed by signal {-code}"
            if self.gave_up():
                self._changed(False, f"{reason}; {len(self._failures)} failures within "
                                     f"{self.failure_window_s:.0f} s: not restarting", gave_up=True)
                return
            self._changed(False, reason)
            delay = min(self.backoff_s[1], self.backoff_s[0] * 2 ** (len(self._failures) - 1))
            self.say(f"{self.name} died ({reason}); restarting in {delay:g} s")
            await asyncio.sleep(delay)
            while not self._stopping:
                try:
                    await self._launch(restart=True)
                    self.say(f"{self.name} restarted ({self.restarts} restart(s))")
                    break
                except StartError as exc:
                    self._changed(False, str(exc))
                    await asyncio.sleep(self.backoff_s[1])

    async def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (each kind ends cleanly on it), then SIGKILL after ``timeout``."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        await self._terminate(timeout)

    async def _terminate(self, timeout: float = 30.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
