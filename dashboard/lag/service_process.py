"""The lag service (``manage.py lagservice``) as a supervised child of ``runlab``
(consumers_app/lab/supervised.py, as the broker): restarted after a back-off doubling
from 1 s up to 30 s; after ``max_failures`` deaths within ``failure_window_s`` it stays
down and says why. Nothing waits for it: the lab runs without history.
"""
from __future__ import annotations

from consumers_app.lab.supervised import SupervisedProcess

PREFIX = "[lag] "


class LagServiceProcess(SupervisedProcess):
    name = "lag service"

    def __init__(self, argv: list[str], *, cwd=None, out=None, max_failures: int = 5,
                 failure_window_s: float = 300.0, backoff_s: tuple[float, float] = (1.0, 30.0)):
        super().__init__(argv, cwd=cwd, out=out, max_failures=max_failures, failure_window_s=failure_window_s,
                         backoff_s=backoff_s)
        self._traceback: list[str] = []

    def on_line(self, line: str) -> bool:
        """A traceback is held until its last line. PySpark's daemon prints one when the
        JVM retires a Python worker idle for a minute (the planning workers, once per
        start): over the Unix socket (spark.py) the worker meets the closed end as a
        BrokenPipeError in pyspark/daemon.py - housekeeping, not a failure, so it is
        dropped; any other traceback is relayed whole."""
        if not self._traceback and not line.startswith("Traceback (most recent call last):"):
            return False
        self._traceback.append(line)
        if line.startswith(("Traceback", " ", "\t")):
            return True
        block, self._traceback = self._traceback, []
        retired_worker = line.startswith("BrokenPipeError") and any("pyspark/daemon.py" in b for b in block)
        if not retired_worker:
            for held in block:
                self.relay(held)
        return True

    def on_output_end(self) -> None:
        held, self._traceback = self._traceback, []
        for line in held:
            self.relay(line)

    def relay(self, line: str) -> None:
        self.say(f"{PREFIX}{line}")

    def _changed(self, up: bool, reason: str = "", gave_up: bool = False) -> None:
        if gave_up:
            self.say(f"{PREFIX}lag service down for good ({reason}): the history stays as it is")

    async def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM: the service ends after its pass in progress (its status says "stopped");
        a pass still running after ``timeout`` is killed with it, which loses and doubles
        nothing (test_lag_stream), so a lab's stop stays within seconds."""
        await super().stop(timeout)
