"""The lag service's pacing (dashboard/lag/service.py), without Spark: a pass waits for a
new snapshot slice, and never comes sooner than the CPU budget allows."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from dashboard.lag import service as service_module
from dashboard.lag.job import JobParams, JobResult
from dashboard.lag.service import LagService


class FakeStream:
    def __init__(self, cost_s: float, clock: dict):
        self.cost_s, self.clock, self.passes = cost_s, clock, 0
        self.state = "done"

    def run(self, params):
        self.passes += 1
        self.clock["cpu"] += self.cost_s
        return JobResult(self.state, new_files=1 if self.state == "done" else 0)


def make_service(tmp_path, monkeypatch, cost_s: float, budget: float, warmup_s: float = 0.0, monotonic=None):
    clock = {"cpu": 0.0}
    monkeypatch.setattr(service_module, "tree_cpu_seconds", lambda pid: clock["cpu"])
    job = SimpleNamespace(out=tmp_path / "lag", recordings=tmp_path / "recordings",
                          load_state=lambda: {"stream": {"newest": 1_000}})
    (tmp_path / "lag").mkdir()
    timing = {} if monotonic is None else {"clock": monotonic}
    service = LagService(job, JobParams, period_s=30.0, watch_s=0.01, cpu_budget=budget, max_pace_s=60.0,
                         warmup_s=warmup_s, **timing)
    service.stream = FakeStream(cost_s, clock)
    return service


def test_a_pass_is_paced_by_its_cost_over_the_budget(tmp_path, monkeypatch):
    service = make_service(tmp_path, monkeypatch, cost_s=2.0, budget=0.10)
    service.pass_once()                      # the first pass: not charged
    assert service._not_before == 0.0
    service.pass_once()                      # paid from the full bucket (20 s at 10 %: 2 CPU s)
    assert service._not_before <= service.cpu.samples[-1][0]
    service.pass_once()                      # 2 CPU s at 10 %: the next one 20 s after this one began
    started = service.cpu.samples[-1][0]
    assert 19.0 <= service._not_before - started <= 21.0
    assert service.status["passes"] == 3 and service.status["newest_sample_ts"] == 1_000


def test_the_cold_pass_is_not_charged_when_passes_before_it_found_nothing(tmp_path, monkeypatch):
    service = make_service(tmp_path, monkeypatch, cost_s=0.01, budget=0.25)
    service.stream.state = "no-recordings"   # started before the lab's first slice
    service.pass_once()
    service.pass_once()
    service.stream.state, service.stream.cost_s = "done", 15.0   # the cold JVM's first fold
    service.pass_once()
    assert service._not_before == 0.0        # the next slice's pass is not held back ~40 s
    service.pass_once()                      # from here on every pass is charged
    assert service._not_before > service.cpu.samples[-1][0]


def test_the_first_minutes_of_folding_are_not_charged(tmp_path, monkeypatch):
    now = {"t": 1000.0}
    service = make_service(tmp_path, monkeypatch, cost_s=5.0, budget=0.10, warmup_s=120.0,
                           monotonic=lambda: now["t"])
    service.stream.state = "no-recordings"   # before the lab's first slice: the warm-up has not begun
    service.pass_once()
    now["t"] += 200.0
    service.stream.state = "done"
    for _ in range(12):                      # the JIT's first two minutes: a dear pass every 10 s
        service.pass_once()
        assert service._not_before == 0.0
        now["t"] += 10.0
    service.pass_once()                      # 120 s after the first fold: charged from here on,
    assert service._not_before - now["t"] == 30.0   # from a full bucket: (5 - 2) CPU s at 10 %


def test_the_pace_is_capped(tmp_path, monkeypatch):
    service = make_service(tmp_path, monkeypatch, cost_s=30.0, budget=0.10)
    service.pass_once()
    service.pass_once()
    assert service._not_before - service.cpu.samples[-1][0] <= 60.5   # not 300 s


def test_a_dear_pass_after_quiet_time_does_not_hold_back_the_next(tmp_path, monkeypatch):
    service = make_service(tmp_path, monkeypatch, cost_s=1.0, budget=0.25)
    now = {"t": 1_000.0}
    service.clock = lambda: now["t"]
    service.pass_once()                      # not charged
    service.pass_once()                      # 1 CPU s of the full bucket's 5 (20 s at 25 %)
    assert service._not_before <= now["t"]
    service.pass_once()                      # 3 left, and 1 more: no wait yet
    assert service._not_before <= now["t"]
    now["t"] += 30                           # quiet: the bucket fills to 20 s worth (5 CPU s)
    service.stream.cost_s = 3.0
    service.pass_once()                      # dearer than its share: paid from the bucket
    assert service._not_before <= now["t"]
    now["t"] += 0.5
    service.pass_once()                      # 2 + 0.125 - 3: 3.5 s to wait
    assert service._not_before == now["t"] + 3.5


def test_a_new_slice_wakes_the_wait_and_a_stop_ends_it(tmp_path, monkeypatch):
    service = make_service(tmp_path, monkeypatch, cost_s=0.0, budget=0.10)
    marks = iter([("a",), ("a",), ("b",)])
    monkeypatch.setattr(service, "_watched", lambda: next(marks, ("b",)))
    service.wait_for_recordings()            # returns when the hour dir's mtime changed
    monkeypatch.setattr(service, "_watched", lambda: ("same",))
    threading.Timer(0.05, service.stopping.set).start()
    service.wait_for_recordings()            # returns on the stop, long before period_s
    assert service.stopping.is_set()


def test_a_slice_written_while_a_pass_runs_wakes_the_next_pass(tmp_path, monkeypatch):
    """A pass the period started just before the recorder wrote a slice lists the files
    without it; the wait after that pass must not take the slice as already seen."""
    service = make_service(tmp_path, monkeypatch, cost_s=0.0, budget=0.0)
    hour = {"mark": ("before",)}
    monkeypatch.setattr(service, "_watched", lambda: hour["mark"])
    calls = []

    def run(params):   # the slice lands while the pass runs, after it listed the files
        calls.append(params)
        hour["mark"] = ("after",)
        if len(calls) == 2:
            service.stopping.set()
        return JobResult("done", new_files=1)

    service.stream.run = run
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    loop.join(timeout=10)   # period_s is 30 s: a second pass within 10 s came from the new slice
    assert not loop.is_alive() and len(calls) == 2


def test_the_relay_drops_only_a_retired_pyspark_workers_broken_pipe():
    import io

    from dashboard.lag.service_process import LagServiceProcess

    out = io.StringIO()
    relay = LagServiceProcess(["true"], out=out)
    daemon = '  File "/v/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line {}, in worker'
    lines = ["pass 3: done",
             "Traceback (most recent call last):", daemon.format(264), daemon.format(95),
             "BrokenPipeError: [Errno 32] Broken pipe",
             "Traceback (most recent call last):", '  File "/repo/dashboard/lag/stream.py", line 1, in run',
             "ValueError: a real failure",
             "Traceback (most recent call last):", '  File "/repo/x.py", line 2']   # cut off: still shown
    for line in lines:
        if not relay.on_line(line):
            relay.relay(line)
    relay.on_output_end()
    assert out.getvalue().splitlines() == [
        "[lag] pass 3: done",
        "[lag] Traceback (most recent call last):", '[lag]   File "/repo/dashboard/lag/stream.py", line 1, in run',
        "[lag] ValueError: a real failure",
        "[lag] Traceback (most recent call last):", '[lag]   File "/repo/x.py", line 2']
