"""The lag service: the lag stream (stream.py) in one warm Spark session.

``manage.py lagservice`` (runlab starts it, see LAB_LAG_SERVICE) runs ``LagService.run``:
a pass folds the recordings not processed yet into the history as soon as a new snapshot
slice appears (the recorder writes a slice right after its last sample), and at least every
``period_s`` - but never sooner than its CPU budget allows. The budget is a bucket of CPU
seconds (the service and its JVM): it starts full and fills at ``cpu_budget`` a second, up to
what ``burst_s`` (20 s) of filling holds, each pass takes its cost out, and the next pass waits
while it is below zero. So history costs at most ``cpu_budget`` of one core on average
(LAB_LAG_CPU_BUDGET, 25 %: the most history may cost, in a lab of 64 x 256; a pass per
slice costs ~3.5 % in the default lab and at 64 x 256) whatever a pass costs on this machine, and one pass
dearer than its share (the JIT still warming up, a burst of events) does not hold back the
next slice; a machine too slow for the budget only makes the history less fresh (the page
says how far behind it is), up to a pass a minute.
The warm-up is not charged: the first pass that folds anything in (a cold JVM and the backlog
of a start) and those of the ``warmup_s`` (2 minutes) after it, while the JIT compiles.

It notices new slices by the modification time of the current hour's snapshot directory,
a stat every ``watch_s`` (50 ms: the slice is written ~1 s before its window ends, and the
pass must land by then; a check costs ~50 us, 1 ms of CPU a second): no listing. A cold JVM costs 20-30 s; the first pass builds the stream's state once.

A pass that finds the output locked (the "Run lag job" button's run) waits for the next
period. A failing pass (Spark down, unreadable files) pauses the service: it retries with
a back-off doubling from ``period_s`` up to ``max_backoff_s``, and the status says why.
The status is ``DATA_DIR/lag/_service.json`` (the history page reads it)::

    {"state": "running"|"paused"|"stopped", "pid": 1234, "paused": "reason"|null,
     "passes": 12, "last_pass": {"finished": "...Z", "finished_ms": 1767265381200, "seconds": 2.1,
                                 "windows_landed_ms": 1767265380500, "new_files": 4, "state": "done"},
     "cpu_pct": 3.1, "newest_sample_ts": 1767265380300}

``cpu_pct`` is what the service costs: its process and its JVM, in % of one core over the
last ``cpu_window_s``; ``newest_sample_ts`` the newest sample folded in (the page shows
"history: 3 % CPU, 6 s behind").
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from .job import JobBusy, JobParams, LagJob, describe
from .runner import read_running, utc_now_iso, write_json
from .stream import LagStream
from consumers_app.lab.recorder import SNAPSHOTS, partition_dir

STATUS_FILE = "_service.json"


def service_status(lag_dir: Path) -> dict:
    """The service's status; "stopped" when none runs (a "running" file of a dead pid reads "failed")."""
    data = read_running(Path(lag_dir) / STATUS_FILE)
    if data is None or data.get("state") == "failed":
        return {"state": "stopped", "paused": None}
    return data


class TreeCpu:
    """CPU seconds a process tree has used (user + system, from /proc): every process under
    the root, each counted by its own times; one gone since the last reading keeps counting
    with what it had then. Not through the parents' cutime: Spark's Python daemon ignores
    SIGCHLD, so the kernel drops its workers' times when they exit - read that way, the sum
    fell whenever an idle worker was retired (a negative share, a pass charged too little).
    A process born and gone between two readings is not seen (the service reads before and
    after each pass)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._seen: dict[tuple[int, int], float] = {}   # (pid, start time) -> its CPU seconds
        self._gone = 0.0
        self._lock = threading.Lock()

    def seconds(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        now, todo = {}, [self.pid]
        while todo:
            current = todo.pop()
            try:
                with open(f"/proc/{current}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                now[(current, int(fields[19]))] = (int(fields[11]) + int(fields[12])) / tick   # utime stime
                for task in os.listdir(f"/proc/{current}/task"):
                    with open(f"/proc/{current}/task/{task}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except OSError:
                continue   # gone meanwhile
        with self._lock:
            self._gone += sum(cpu for key, cpu in self._seen.items() if key not in now)
            self._seen = now
            return self._gone + sum(now.values())


_trees: dict[int, TreeCpu] = {}


def tree_cpu_seconds(pid: int) -> float:
    """TreeCpu's reading of ``pid``'s tree (one tracker per root: each reading counts the
    processes gone since the one before, whoever asked)."""
    tree = _trees.get(pid)
    if tree is None:
        tree = _trees.setdefault(pid, TreeCpu(pid))
    return tree.seconds()


class CpuShare:
    """% of one core a process tree used over a sliding window of samples."""

    def __init__(self, pid: int, window_s: float = 120.0):
        self.pid, self.window_s = pid, window_s
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> float | None:
        now, cpu = time.monotonic(), tree_cpu_seconds(self.pid)
        self.samples.append((now, cpu))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.pop(0)
        (t0, c0) = self.samples[0]
        return round(100.0 * (cpu - c0) / (now - t0), 1) if now - t0 >= 1.0 else None


class LagService:
    def __init__(self, job: LagJob, params: Callable[[], JobParams], *, period_s: float = 10.0,
                 watch_s: float = 0.05, max_backoff_s: float = 120.0, say: Callable[[str], None] = print,
                 verbose: bool = True, cpu_window_s: float = 120.0, cpu_budget: float = 0.25,
                 max_pace_s: float = 60.0, burst_s: float = 20.0, warmup_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic):
        self.job = job
        self.stream = LagStream(job)
        self.params = params   # read per pass: a bad setting pauses the service, it does not end it
        self.period_s = period_s
        self.watch_s = watch_s
        self.max_backoff_s = max_backoff_s
        self.say = say
        self.verbose = verbose
        self.path = job.out / STATUS_FILE
        self.cpu = CpuShare(os.getpid(), cpu_window_s)
        self.cpu_budget = cpu_budget
        self.max_pace_s = max_pace_s
        self.burst_s = burst_s
        self.warmup_s = warmup_s
        self.clock = clock
        # The budget's bucket: CPU seconds, and when. It starts full: the first pass charged
        # after the warm-up (64 x 256: a 4-s pass, 5 CPU s) paid from an empty one held the
        # next pass 20 s - two windows late.
        self._credit, self._credit_at = cpu_budget * burst_s, None
        self._not_before = 0.0   # clock: the budget's earliest next pass
        self._warm_from = None    # clock: the first pass that folded something in
        self.status = {"state": "running", "pid": None, "paused": None, "passes": 0, "last_pass": None,
                       "cpu_pct": None, "newest_sample_ts": None}
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
                # Before the pass lists the recordings: a slice written while it runs (a pass
                # the period started just before the slice) wakes the next pass at once; seen
                # after it, that slice would wait for the next one - a window 10 s late.
                seen = self._watched()
                try:
                    self.pass_once()
                    failures = 0
                except JobBusy:
                    self._log("the lag job's lock is held (a \"Run lag job\" run): next pass after it")
                except Exception as exc:  # noqa: BLE001 - the service outlives a bad pass
                    failures += 1
                    backoff = min(self.max_backoff_s, self.period_s * 2 ** failures)
                    reason = describe(exc)
                    self._write(state="paused", paused=reason)
                    self.say(f"paused: {reason}; retrying in {backoff:g} s")
                if backoff:
                    self.stopping.wait(backoff)
                else:
                    self.wait_for_recordings(seen)
        finally:
            self._write(state="stopped")

    # -- waiting ------------------------------------------------------------------

    def _watched(self) -> tuple:
        """What changes when the recorder writes a snapshot slice: the mtime of this hour's
        (and, around the turn of the hour, the previous hour's) snapshot directory."""
        now_ms = int(time.time() * 1000)
        marks = []
        for ts in (now_ms, now_ms - 60_000):
            try:
                marks.append(os.stat(partition_dir(self.job.recordings, SNAPSHOTS, ts)).st_mtime_ns)
            except OSError:
                marks.append(None)
        return tuple(marks)

    def wait_for_recordings(self, seen: tuple | None = None) -> None:
        """Until a new snapshot slice is written (since ``seen``, a ``_watched()``; by default
        now), ``period_s`` has passed, or a stop; never before the CPU budget allows the next pass."""
        seen = self._watched() if seen is None else seen
        deadline = self.clock() + self.period_s
        if self.stopping.wait(max(0.0, self._not_before - self.clock())):
            return
        while self._watched() == seen and self.clock() < deadline:
            if self.stopping.wait(self.watch_s):
                return

    # -- a pass -------------------------------------------------------------------

    def pass_once(self) -> None:
        cpu_before = tree_cpu_seconds(os.getpid())
        result = self.stream.run(self.params())
        # The budget paces the steady state, not the warm-up: neither the first pass that folds
        # anything in (a cold JVM, the backlog of a start; passes before it found nothing, the
        # service starting before the lab's first slice) nor those of the ``warmup_s`` after it
        # (the JIT still compiling the passes' paths: each costs 2-4x a warm one) are charged.
        # Charged, they would hold the history 35-45 s behind for the first minutes after every
        # restart - what a user looks at first.
        now = self.clock()
        if self.cpu_budget > 0 and self._warm_from is not None and now - self._warm_from >= self.warmup_s:
            self._charge(tree_cpu_seconds(os.getpid()) - cpu_before)
        if self._warm_from is None and result.state == "done":
            self._warm_from = now
        resumed = self.status["state"] == "paused"
        newest = (self.job.load_state().get("stream") or {}).get("newest")
        self._write(state="running", paused=None, passes=self.status["passes"] + 1,
                    last_pass={"finished": utc_now_iso(), "finished_ms": int(time.time() * 1000),
                               "seconds": result.seconds, "windows_landed_ms": result.windows_landed_ms,
                               "new_files": result.new_files,
                               "state": result.state},
                    cpu_pct=self.cpu.sample(), newest_sample_ts=newest or self.status["newest_sample_ts"])
        if resumed:
            self.say("resumed")
        self._log(f"pass {self.status['passes']}: {result.state}, {result.new_files} new file(s), "
                  f"{result.seconds:.1f} s")

    def _charge(self, cost: float) -> None:
        """Take a pass's CPU seconds out of the budget's bucket (see the module doc); the next
        pass waits until it is back at zero, never longer than ``max_pace_s``."""
        now = self.clock()
        filled = 0.0 if self._credit_at is None else (now - self._credit_at) * self.cpu_budget
        self._credit = min(self.cpu_budget * self.burst_s, self._credit + filled) - cost
        self._credit = max(self._credit, -self.cpu_budget * self.max_pace_s)
        self._credit_at = now
        self._not_before = now + max(0.0, -self._credit / self.cpu_budget)

    def _log(self, line: str) -> None:
        if self.verbose:
            self.say(line)
