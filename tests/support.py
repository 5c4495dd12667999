"""Helpers for tests: real dependencies required, waits on conditions with deadlines, free
ports, subprocesses."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(present: bool, message: str, module_level: bool = False) -> None:
    """A real dependency (service, browser, JVM, peer) the test needs: locally its absence
    skips, on CI (CI=true, set by .ci/run) it fails, so CI never passes by skipping."""
    import pytest

    if present:
        return
    if on_ci():
        pytest.fail(f"{message} (CI=true: the suite needs it)", pytrace=False)
    pytest.skip(message, allow_module_level=module_level)


def wait_until(condition, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    """Poll ``condition()`` until it returns a truthy value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)  # noqa: sleep-ok - polling interval of a deadline wait


async def async_wait_until(condition, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)  # noqa: sleep-ok - polling interval of a deadline wait


# Ports for the servers tests start come from below the kernel's ephemeral range (32768+
# here), a slice per test process (pytest-xdist): a port the kernel handed out for bind(0)
# and that was closed again may become, before our server binds it, the source port of any
# outgoing connection or another process's pick - "port in use" under a busy suite.
_PORTS_FROM, _PORTS_PER_PROCESS = 20_000, 3_000


def _process_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) % 4 if worker[2:].isdigit() else 0


_next_port = _PORTS_FROM + _process_index() * _PORTS_PER_PROCESS + (os.getpid() % 100) * 10


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports (a broker's remoting ports: one per
    logical broker, upward from the first), from this test process's slice."""
    global _next_port
    first_of_slice = _PORTS_FROM + _process_index() * _PORTS_PER_PROCESS
    for _ in range(_PORTS_PER_PROCESS):
        if _next_port + count > first_of_slice + _PORTS_PER_PROCESS:
            _next_port = first_of_slice
        first, _next_port = _next_port, _next_port + count
        if all(_bindable(first + i) for i in range(count)):
            return first
    raise RuntimeError(f"no run of {count} free ports found in {first_of_slice}-{first_of_slice + _PORTS_PER_PROCESS}")


def free_port() -> int:
    """A port no server holds now, from this test process's slice (see above)."""
    return free_port_run(1)


def manage_py(*args: str, env: dict | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start ``python manage.py ARGS`` as a child process with stdout piped."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        **popen_kwargs,
    )


async def produce(addr: str, topic: str, n: int, queue=None, batch: int = 100) -> set[str]:
    """Send ``n`` messages to ``topic`` (optionally one queue) with our producer; their ids."""
    from consumers_app.client import Producer, ProducerConfig

    producer = Producer(ProducerConfig(endpoints=addr, topic=topic, batch_size=batch))
    await producer.start()
    ids: set[str] = set()
    sent = 0
    try:
        while sent < n:
            k = min(batch, n - sent)
            ids.update(e.message_id for e in await producer.send_batch(k, queue=queue))
            sent += k
    finally:
        await producer.shutdown()
    return ids
