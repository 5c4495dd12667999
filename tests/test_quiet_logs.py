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
    assert quiet.filter(again) and "(and 1 more like it in 10 s)" in again.getMessage()


def test_an_unexpected_error_keeps_its_traceback_every_time():
    quiet = ExpectedFaults(clock=Clock())
    for _ in range(2):
        bug = record("rebalance failed", exc=KeyError("b:9"), level=logging.ERROR)
        assert quiet.filter(bug) and bug.exc_info is not None
