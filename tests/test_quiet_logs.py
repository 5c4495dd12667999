"""Units: an expected fault is one line in the terminal, a burst of the same is counted
(consumers_app/lab/quiet_logs.py)."""
import logging

from consumers_app.client.faults import NetworkCutError
from consumers_app.lab.quiet_logs import ExpectedFaults


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def record(msg, *args, exc=None, level=logging.WARNING):
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("consumers_app.client.rebalance", level, __file__, 1, msg, args, exc_info)


def test_an_expected_fault_is_one_line_and_its_repeats_are_counted():
    clock = Clock()
    quiet = ExpectedFaults(clock=clock)
    first = record("rebalance failed", exc=NetworkCutError("cut by the lab"), level=logging.ERROR)
    assert quiet.filter(first)
    assert first.exc_info is None and first.getMessage() == "rebalance failed: NetworkCutError: cut by the lab"
    assert not quiet.filter(record("rebalance failed", exc=NetworkCutError("cut by the lab"), level=logging.ERROR))
    for offset in (10, 11):   # the same line with other figures
        assert not quiet.filter(record("persist offset %s=%s failed: %s", "b:0", offset, "refused")) or offset == 10
    clock.now = 11
    again = record("rebalance failed", exc=NetworkCutError("cut by the lab"), level=logging.ERROR)
    assert quiet.filter(again) and "(and 1 more like it in 11 s)" in again.getMessage()


def test_an_unexpected_error_keeps_its_traceback_every_time():
    quiet = ExpectedFaults(clock=Clock())
    for _ in range(2):
        bug = record("rebalance failed", exc=KeyError("b:9"), level=logging.ERROR)
        assert quiet.filter(bug) and bug.exc_info is not None


def test_a_long_fault_is_one_line_whatever_the_operations_it_fails_and_however_often_they_retry():
    """A 2-minute cut: rebalances, offset commits and heartbeats fail with the same error,
    each retried every second or so. One line, then one saying how many were held back
    once the fault is over and hits again."""
    clock = Clock()
    quiet = ExpectedFaults(clock=clock)
    cut = NetworkCutError("cut by the lab")
    printed = []
    for second in range(120):
        clock.now = float(second)
        for line in (record("rebalance failed", exc=cut, level=logging.ERROR),
                     record("rebalance of %s failed: %s", "TopicTest", cut),
                     record("persist offset %s=%s failed: %s", "broker-a:1", 100 + second, cut),
                     record("%s heartbeat failed: %s", "c2", cut)):
            if quiet.filter(line):
                printed.append(line.getMessage())
    assert printed == ["rebalance failed: NetworkCutError: cut by the lab"]
    clock.now = 400.0   # the next cut
    again = record("%s heartbeat failed: %s", "c2", cut)
    assert quiet.filter(again) and "(and 479 more like it in 400 s)" in again.getMessage()


def test_a_fault_that_never_ends_is_said_again_every_few_minutes():
    clock = Clock()
    quiet = ExpectedFaults(clock=clock, burst_s=300)
    said = 0
    for second in range(0, 700, 2):
        clock.now = float(second)
        said += quiet.filter(record("%s route refresh failed: %s", "c1", ConnectionRefusedError("refused")))
    assert said == 3
