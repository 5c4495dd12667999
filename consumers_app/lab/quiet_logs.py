"""One line for an expected fault, not a traceback; one line for a burst of the same.

The lab injects faults on purpose (a cut, an offline broker): the consumers' rebalances
and offset commits then fail with connection errors for as long as the fault lasts. Those
are the fault working, not bugs, so the terminal says each in one line (the exception's
type and message) and a line repeated within ``REPEAT_S`` is counted, not printed: the
next one that gets through says how many were held back. Anything else keeps its
traceback. Installed as a filter of the console handler (settings.LOGGING), so the web
process and every worker process use it.
"""
import logging
import time

REPEAT_S = 10.0


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
    def __init__(self, name: str = "", repeat_s: float = REPEAT_S, clock=time.monotonic):
        super().__init__(name)
        self.repeat_s = repeat_s
        self.clock = clock
        self._last: dict[tuple, tuple[float, int]] = {}   # (logger, template) -> (last printed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and expected(exc):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args, record.exc_info, record.exc_text = None, None, None
        elif exc is not None or record.levelno >= logging.ERROR:
            return True   # unexpected: every one, in full
        key = (record.name, str(record.msg) if record.args else _without_digits(str(record.msg)))
        now = self.clock()
        printed, held = self._last.get(key, (None, 0))
        if printed is not None and now - printed < self.repeat_s:
            self._last[key] = (printed, held + 1)
            return False
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} (and {held} more like it in {self.repeat_s:.0f} s)"
            record.args = None
        if len(self._last) > 1000:   # templates are few; one-off messages must not pile up
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.repeat_s}
        return True


def _without_digits(text: str) -> str:
    """The same line but for its figures (offsets, ports, ids)."""
    return "".join("#" if ch.isdigit() else ch for ch in text)
