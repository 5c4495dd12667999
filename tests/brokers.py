"""The real embedded broker as a child process, for integration tests and benches.

    with BrokerProcess(tmp_path, topics=["TopicTest:8"]) as broker:
        broker.address   # "127.0.0.1:PORT"
        stubs = BrokerStubs(broker.address)   # sync gRPC: stubs.v2, stubs.admin

It runs ``manage.py runbroker`` and waits for the one line ``broker listening on
HOST:PORT``; ``stop()`` sends SIGTERM (offsets persisted), ``kill()`` SIGKILL, and
``start()`` again reuses the same data dir and port. ``FAST_BROKER_ARGS`` shortens its
intervals so tests never wait RocketMQ's production timings.
"""
import signal
import subprocess
import threading
from pathlib import Path

from consumers_app.protocol import lab, v2
from consumers_app.protocol import v2_service as svc

from .support import free_port, free_port_run, manage_py

FAST_BROKER_ARGS = [
    "--min-invisible-ms", "1000", "--revive-interval-ms", "100", "--offset-persist-ms", "200",
    "--client-expiry-ms", "1500", "--client-scan-ms", "200", "--delay-levels", "1s 1s 2s 2s 3s",
    "--segment-size", str(8 << 20), "--default-invisible-ms", "2000",
]


class BrokerProcess:
    def __init__(self, data_dir: Path, topics=("TopicTest:8",), flush: str = "async",
                 extra_args=(), port: int | None = None, startup_timeout: float = 60.0, remoting: bool = False):
        self.data_dir = Path(data_dir)
        self.topics = list(topics)
        self.flush = flush
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        # RocketMQ's remoting protocol too: a name server port, brokers' ports from remoting_port
        # (one per logical broker, upward: room for the topics' brokers and two more).
        brokers = {"broker-a"} | {t.split("@", 1)[1] for t in self.topics if "@" in t}
        self.namesrv_port = free_port() if remoting else None
        self.remoting_port = free_port_run(len(brokers) + 2) if remoting else None
        self.proc: subprocess.Popen | None = None
        self.output: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def start(self) -> "BrokerProcess":
        # --skip-checks: Django's system checks import the whole web side (pandas with it),
        # nothing a broker uses; about 40% of a broker's start-up CPU.
        args = ["runbroker", "--skip-checks", "--host", "127.0.0.1", "--port", str(self.port),
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
        if not ready.wait(self.startup_timeout) or self.proc.poll() is not None or not self._connectable():
            self.kill()
            raise RuntimeError("broker did not start:\n" + "\n".join(self.output[-40:]))
        return self

    def _connectable(self) -> bool:
        """The gRPC port takes a connection (once seen refused right after a restart's
        "listening" line in CI: a broker that died after it is reported with its output)."""
        import grpc

        with grpc.insecure_channel(self.address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=self.startup_timeout)
            except grpc.FutureTimeoutError:
                return False
        return self.proc.poll() is None

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


class BrokerStubs:
    """Sync gRPC stubs on one broker: ``v2`` (MessagingService) and ``admin`` (LabAdmin)."""

    def __init__(self, address: str, client_id: str = "test-client"):
        import grpc

        from consumers_app.protocol import lab_grpc, v2_grpc

        self.address = address
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                                ("grpc.max_send_message_length", -1)])
        self.v2 = v2_grpc.MessagingServiceStub(self.channel)
        self.admin = lab_grpc.LabAdminStub(self.channel)
        self.client_id = client_id

    @property
    def md(self):
        return (("x-mq-client-id", self.client_id),)

    def close(self):
        self.channel.close()


class Sender(threading.Thread):
    """Sends small batches to ``topic`` until stopped; remembers every message id
    acknowledged OK (a broker killed mid-send ends it)."""

    def __init__(self, address, topic):
        super().__init__(daemon=True)
        self.topic = topic
        self.stubs = BrokerStubs(address, "crash-producer")
        self.acked: list[str] = []
        self.stop = threading.Event()

    def run(self):
        n = 0
        while not self.stop.is_set():
            req = svc.SendMessageRequest()
            for _ in range(4):
                m = req.messages.add(body=f"crash-{n}".encode())
                m.topic.name = self.topic
                n += 1
            try:
                resp = self.stubs.v2.SendMessage(req, metadata=self.stubs.md, timeout=5)
            except Exception:
                return  # the broker died: whatever was not acknowledged does not count
            if resp.status.code == v2.Code.OK:
                self.acked.extend(e.message_id for e in resp.entries)
        self.stubs.close()


def read_all(stubs, topic, queues):
    """Every message id stored in ``topic``'s queues 0..queues-1 on broker-a, in queue order."""
    ids = []
    for qid in range(queues):
        offset = 0
        while True:
            resp = stubs.admin.PullBatch(lab.PullBatchRequest(
                group="crash-reader", queue=lab.QueueRef(topic=topic, broker_name="broker-a", queue_id=qid),
                offset=offset, max_messages=256))
            assert resp.status.code == v2.Code.OK, resp.status
            if resp.pull_status != lab.FOUND:
                break
            ids.extend(m.message_id for m in resp.messages)
            offset = resp.next_begin_offset
    return ids
