"""One line for an expected fault, not a traceback; one line for a burst of the same.

The lab injects faults on purpose (a cut, an offline broker): the consumers' rebalances,
heartbeats, route refreshes and offset commits then fail with connection errors for as
long as the fault lasts, each retried every few seconds. Those are the fault working, not
bugs, so the terminal says the fault once: the first line naming it (the exception's type
and message, no traceback), whatever the operation that hit it. Every later line failing
with the same error is held back for as long as they keep coming (a gap of ``REPEAT_S``
ends the burst), at most ``BURST_S``: a 2-minute cut is one line, not one per retry. The
next line that gets through says how many were held back. Other repeated warnings are
printed at most once per ``REPEAT_S`` per template, counted likewise; anything else (an
unexpected error) keeps its traceback every time. Installed as a filter of the console
handler (settings.LOGGING), so the web process and every worker process use it.
"""
import logging
import time

REPEAT_S = 10.0
BURST_S = 300.0   # a fault lasting longer is said again (with its count) this often


def expected(exc: BaseException | None) -> bool:
    """A network fault: a cut or refused connection, a timeout, an unreachable gRPC peer."""
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return True
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            name = getattr(code(), "name", "")
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            return False
        return name in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")
    return False


class ExpectedFaults(logging.Filter):
    def __init__(self, name: str = "", repeat_s: float = REPEAT_S, clock=time.monotonic, burst_s: float = BURST_S):
        super().__init__(name)
        self.repeat_s = repeat_s
        self.burst_s = burst_s
        self.clock = clock
        # key -> [printed at, last seen at, held back since]; a key is an expected fault's
        # error (type and message) or another line's template.
        self._last: dict[tuple, list] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = _exception_of(record)
        if exc is not None and expected(exc):
            if record.exc_info:
                record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
                record.args, record.exc_info, record.exc_text = None, None, None
            key, burst = ("fault", type(exc).__name__, _without_digits(str(exc))), True
        elif record.exc_info or record.levelno >= logging.ERROR:
            return True   # unexpected: every one, in full
        else:
            key, burst = (record.name, str(record.msg) if record.args else _without_digits(str(record.msg))), False
        now = self.clock()
        seen = self._last.get(key)
        if seen is not None:
            printed, last, held = seen
            if (now - last < self.repeat_s and now - printed < self.burst_s) if burst else now - printed < self.repeat_s:
                seen[1:] = [now, held + 1]
                return False
        self._last[key] = [now, now, 0]
        if seen is not None and seen[2]:
            record.msg = f"{record.getMessage()} (and {seen[2]} more like it in {now - seen[0]:.0f} s)"
            record.args = None
        if len(self._last) > 1000:   # templates are few; one-off messages must not pile up
            self._last = {k: v for k, v in self._last.items() if now - v[1] < max(self.repeat_s, self.burst_s)}
        return True


def _exception_of(record: logging.LogRecord) -> BaseException | None:
    """The error a line reports: its exc_info, or an exception among its arguments
    (``log.warning("persist offset %s failed: %s", label, exc)``)."""
    if record.exc_info:
        return record.exc_info[1]
    args = record.args if isinstance(record.args, tuple) else ()
    return next((a for a in args if isinstance(a, BaseException)), None)


def _without_digits(text: str) -> str:
    """The same line but for its figures (offsets, ports, ids)."""
    return "".join("#" if ch.isdigit() else ch for ch in text)
