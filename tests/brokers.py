"""The real embedded broker as a child process, for integration tests.

    with BrokerProcess(tmp_path, topics=["TopicTest:8"]) as broker:
        broker.address   # "127.0.0.1:PORT"

It runs ``manage.py runbroker`` and waits for the one line ``broker listening on
HOST:PORT``; ``stop()`` sends SIGTERM (offsets persisted), ``kill()`` SIGKILL, and
``start()`` again reuses the same data dir and port.
"""
import signal
import subprocess
import threading
from pathlib import Path

from .support import free_port, manage_py


class BrokerProcess:
    def __init__(self, data_dir: Path, topics=("TopicTest:8",), flush: str = "async",
                 extra_args=(), port: int | None = None, startup_timeout: float = 60.0, remoting: bool = False):
        self.data_dir = Path(data_dir)
        self.topics = list(topics)
        self.flush = flush
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        # RocketMQ's remoting protocol too: a name server port, brokers' ports from remoting_port.
        self.namesrv_port = free_port() if remoting else None
        self.remoting_port = free_port() if remoting else None
        self.proc: subprocess.Popen | None = None
        self.output: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def start(self) -> "BrokerProcess":
        args = ["runbroker", "--host", "127.0.0.1", "--port", str(self.port),
                "--data-dir", str(self.data_dir), "--flush", self.flush]
        for topic in self.topics:
            args += ["--topic", topic]
        if self.namesrv_port is not None:
            args += ["--namesrv-port", str(self.namesrv_port), "--remoting-port", str(self.remoting_port)]
        self.proc = manage_py(*args, *self.extra_args)
        ready = threading.Event()
        lines = self.output

        def pump(stream):
            for line in stream:
                lines.append(line.rstrip("\n"))
                if line.startswith("broker listening on"):
                    ready.set()
            ready.set()  # EOF: the process died; let start() report it

        threading.Thread(target=pump, args=(self.proc.stdout,), daemon=True).start()
        if not ready.wait(self.startup_timeout) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError("broker did not start:\n" + "\n".join(self.output[-40:]))
        return self

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
