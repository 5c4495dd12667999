"""The lag service: the incremental lag job again and again in one warm Spark session.

``manage.py lagservice`` (runlab starts it, see LAB_LAG_SERVICE) runs ``LagService.run``:
each pass folds the recordings not processed yet into the history (LagJob, incremental),
then it waits for the next slot: ``offset_s`` after a wall-clock multiple of ``period_s``.
The recorder writes a 10-s slice about a second after it ends, so a pass starting 2 s
after it finds the slice's file: the newest complete window is then 10 s + 2 s + one pass
old at worst (a pass at an arbitrary phase would add up to 10 s). A cold JVM costs 20-30
s; kept warm, a pass over a few new files takes a few seconds.

A pass that finds the output locked (the "Run lag job" button's run) waits for the next
period. A failing pass (Spark down, unreadable files) pauses the service: it retries with
a back-off doubling from ``period_s`` up to ``max_backoff_s``, and the status says why.
The status is ``DATA_DIR/lag/_service.json`` (the history page reads it)::

    {"state": "running"|"paused"|"stopped", "pid": 1234, "paused": "reason"|null,
     "passes": 12, "last_pass": {"finished": "...Z", "seconds": 2.1, "new_files": 4, "state": "done"}}
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from .job import JobBusy, JobParams, LagJob
from .runner import read_running, utc_now_iso, write_json

STATUS_FILE = "_service.json"


def service_status(lag_dir: Path) -> dict:
    """The service's status; "stopped" when none runs (a "running" file of a dead pid reads "failed")."""
    data = read_running(Path(lag_dir) / STATUS_FILE)
    if data is None or data.get("state") == "failed":
        return {"state": "stopped", "paused": None}
    return data


def next_slot(now: float, period_s: float, offset_s: float) -> float:
    """The first wall-clock time after ``now`` that is ``offset_s`` past a multiple of ``period_s``."""
    return now - (now - offset_s) % period_s + period_s


class LagService:
    def __init__(self, job: LagJob, params: Callable[[], JobParams], *, period_s: float = 10.0,
                 offset_s: float = 2.0,
                 max_backoff_s: float = 120.0, say: Callable[[str], None] = print,
                 verbose: bool = True):
        self.job = job
        self.params = params   # read per pass: a bad setting pauses the service, it does not end it
        self.period_s = period_s
        self.offset_s = offset_s
        self.max_backoff_s = max_backoff_s
        self.say = say
        self.verbose = verbose
        self.path = job.out / STATUS_FILE
        self.status = {"state": "running", "pid": None, "paused": None, "passes": 0, "last_pass": None}
        self.stopping = threading.Event()

    def _write(self, **changes) -> None:
        self.status.update(changes, pid=os.getpid())
        write_json(self.path, self.status)

    def run(self) -> None:
        """Passes until ``stopping`` is set; the status file says "stopped" at the end."""
        self._write()
        failures = 0
        try:
            while not self.stopping.is_set():
                backoff = 0.0
                try:
                    self.pass_once()
                    failures = 0
                except JobBusy:
                    self._log("the lag job's lock is held (a \"Run lag job\" run): next pass after it")
                except Exception as exc:  # noqa: BLE001 - the service outlives a bad pass
                    failures += 1
                    backoff = min(self.max_backoff_s, self.period_s * 2 ** failures)
                    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    self._write(state="paused", paused=reason)
                    self.say(f"paused: {reason}; retrying in {backoff:g} s")
                slot = next_slot(time.time() + backoff, self.period_s, self.offset_s)
                self.stopping.wait(max(0.0, slot - time.time()))
        finally:
            self._write(state="stopped")

    def pass_once(self) -> None:
        result = self.job.run(self.params())
        resumed = self.status["state"] == "paused"
        self._write(state="running", paused=None, passes=self.status["passes"] + 1,
                    last_pass={"finished": utc_now_iso(), "seconds": result.seconds, "new_files": result.new_files,
                               "state": result.state})
        if resumed:
            self.say("resumed")
        self._log(f"pass {self.status['passes']}: {result.state}, {result.new_files} new file(s), "
                  f"{result.seconds:.1f} s")

    def _log(self, line: str) -> None:
        if self.verbose:
            self.say(line)
