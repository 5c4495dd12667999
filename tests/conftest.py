import os
import socket

import pytest


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
