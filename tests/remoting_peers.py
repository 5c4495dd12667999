"""Other people's RocketMQ clients as test peers, each in its own process.

    consumer = AliOns.consume(namesrv, "GID", "TopicTest")   # node peers/ali_ons_peer.js
    consumer.wait_ready()
    consumer.messages        # every message it handed to its listener (dicts)
    consumer.kill()          # SIGKILL: a process death
    call(namesrv, GET_ROUTEINFO_BY_TOPIC, {"topic": T})   # a raw request, its answer (Command)

The peers come from the registries through ``make node-peers`` (npm into the repo's
ignored node_modules); on CI their absence fails the test, locally it skips.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

from consumers_app.remoting.codec import Command, binary_header, decode, encode

from .support import require, wait_until

ROOT = Path(__file__).resolve().parent.parent
ALI_ONS = ROOT / "node_modules" / "ali-ons"
CPP = ROOT / ".venv" / "peers" / "cpp"


def require_ali_ons() -> None:
    require(bool(shutil.which("node")) and ALI_ONS.is_dir(), "ali-ons is not installed (make node-peers)")


def require_cpp() -> None:
    require((CPP / "rocketmq" / "librocketmq.so").exists(), "rocketmq-client-cpp is not installed (make cpp-peer)")


class PeerProcess:
    """A peer printing one JSON object per line; kept in ``lines`` as they arrive."""

    def __init__(self, argv: list[str], env: dict | None = None):
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.lines: list[dict] = []
        self.errors: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.errors, False), daemon=True).start()

    @staticmethod
    def _pump(stream, into, as_json):
        for line in stream:
            line = line.rstrip("\n")
            if not line:
                continue
            if as_json:
                try:
                    into.append(json.loads(line))
                except ValueError:
                    pass
            else:
                into.append(line)

    def wait_for(self, condition, timeout: float, message: str):
        def check():
            if self.proc.poll() is not None and not condition():
                raise AssertionError(f"{message}: the peer exited ({self.proc.returncode}):\n"
                                     + "\n".join(self.errors[-20:]))
            return condition()
        return wait_until(check, timeout=timeout, message=message)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class AliOns(PeerProcess):
    SCRIPT = str(ROOT / "peers" / "ali_ons_peer.js")

    @classmethod
    def consume(cls, namesrv: str, group: str, topic: str) -> "AliOns":
        return cls(["node", cls.SCRIPT, "consume", namesrv, group, topic])

    @classmethod
    def produce(cls, namesrv: str, topic: str, count: int) -> "AliOns":
        return cls(["node", cls.SCRIPT, "produce", namesrv, topic, str(count)])

    @property
    def messages(self) -> list[dict]:
        return [x for x in list(self.lines) if "id" in x]

    @property
    def client_id(self) -> str | None:
        return next((x.get("client_id") for x in list(self.lines) if x.get("ready")), None)

    def wait_ready(self, timeout: float = 30) -> None:
        self.wait_for(lambda: any(x.get("ready") for x in list(self.lines)), timeout, "the consumer to start")


class Cpp(AliOns):
    """rocketmq-client-cpp through peers/cpp_peer.py (same lines as ali-ons' script)."""

    @staticmethod
    def _argv(*args) -> tuple[list[str], dict]:
        return [sys.executable, str(ROOT / "peers" / "cpp_peer.py"), *args], {**os.environ, "PYTHONPATH": str(CPP)}

    @classmethod
    def consume(cls, namesrv: str, group: str, topic: str) -> "Cpp":
        return cls(*cls._argv("consume", namesrv, group, topic))

    @classmethod
    def produce(cls, namesrv: str, topic: str, count: int) -> "Cpp":
        return cls(*cls._argv("produce", namesrv, topic, str(count)))


def _frame(cmd: Command, binary: bool = False) -> bytes:
    if not binary:
        return encode(cmd)
    header = binary_header(cmd)
    return struct.pack(">II", 4 + len(header) + len(cmd.body), (1 << 24) | len(header)) + header + cmd.body


class Raw:
    """A blocking remoting connection: send a request, read its answer."""

    def __init__(self, addr: str):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.received: list[Command] = []   # requests from the broker read while awaiting an answer

    def call(self, code: int, ext: dict | None = None, body: bytes = b"", binary: bool = False) -> Command:
        """Send a request; its answer (requests the broker sends meanwhile are kept)."""
        self.sock.sendall(_frame(Command(code, ext or {}, body, opaque=random.randrange(1, 1 << 30)), binary))
        while True:
            cmd = self.read_command()
            if cmd.is_response:
                return cmd
            self.received.append(cmd)

    def read_command(self) -> Command:
        return decode(self._read(int.from_bytes(self._read(4), "big")))

    def answer(self, request: Command, body: bytes) -> None:
        self.sock.sendall(encode(Command(0, {}, body, request.opaque, 1)))

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def close(self):
        self.sock.close()


def call(addr: str, code: int, ext: dict | None = None, body: bytes = b"", binary: bool = False) -> Command:
    conn = Raw(addr)
    try:
        return conn.call(code, ext, body, binary)
    finally:
        conn.close()
