import os
import socket

import pytest


def pytest_collection_modifyitems(config, items):
    """TEST_ORDER=reversed runs each module's tests last to first: tests must not lean on
    what an earlier test left behind (module fixtures are shared, their state is not)."""
    if os.environ.get("TEST_ORDER") == "reversed":
        by_module: dict = {}
        for item in items:
            by_module.setdefault(item.module, []).append(item)
        items[:] = [item for tests in by_module.values() for item in reversed(tests)]


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _require_service(name: str, host: str, port: int) -> None:
    """Real services are part of the suite: on CI their absence fails, locally it skips."""
    if _reachable(host, port):
        return
    message = f"{name} is not reachable at {host}:{port}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: the suite needs it)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    _require_service("Redis", "127.0.0.1", 6379)
    return os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    _require_service("PostgreSQL", "127.0.0.1", 5432)
    return os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One real broker per test module (topic TopicTest with 8 queues on broker-a)."""
    from .brokers import BrokerProcess

    with BrokerProcess(tmp_path_factory.mktemp("broker"), topics=["TopicTest:8@broker-a"]) as b:
        yield b


# ---------------------------------------------------------------- broker helpers

# Short intervals so broker tests never wait RocketMQ's production timings.
FAST_BROKER_ARGS = [
    "--min-invisible-ms", "1000", "--revive-interval-ms", "100", "--offset-persist-ms", "200",
    "--client-expiry-ms", "1500", "--client-scan-ms", "200", "--delay-levels", "1s 1s 2s 2s 3s",
    "--segment-size", str(8 << 20), "--default-invisible-ms", "2000",
]


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


@pytest.fixture(scope="module")
def fast_broker(tmp_path_factory):
    """A broker with short intervals (see FAST_BROKER_ARGS), topic TopicTest:8 on broker-a."""
    from .brokers import BrokerProcess

    with BrokerProcess(tmp_path_factory.mktemp("fastbroker"), topics=["TopicTest:8@broker-a"],
                       extra_args=FAST_BROKER_ARGS) as b:
        yield b


@pytest.fixture
def stubs_for():
    """``stubs_for(address, client_id=...)`` -> BrokerStubs, closed after the test."""
    made = []

    def make(address: str, client_id: str = "test-client") -> BrokerStubs:
        s = BrokerStubs(address, client_id)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """Each test starts with full control-API buckets (user ids repeat across test databases)."""
    from dashboard.api import _limiter
    from dashboard.views import login_limiter
    _limiter.cache_clear()
    login_limiter.cache_clear()
    yield
