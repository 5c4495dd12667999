"""The suite's lanes, its real services and the fixtures several modules share.

Lanes, run in this order by one ``pytest`` (``make test``): ``unit`` (in-process; at
most a short-lived helper process), ``broker`` (a real broker process and clients
on it), ``lab`` (lab controllers, runlab stacks, web servers on real Redis/PostgreSQL),
``spark`` (a JVM), ``browser`` (Debian's chromium). A module's lane is its own lane mark
(``pytestmark``) if it has one, else the one its name says (``LANE_BY_NAME``), else
``unit``; every test gets its lane's mark, so ``pytest -m unit`` runs one lane.
"""
import os
import socket

import pytest

from .support import require

LANES = ("unit", "broker", "lab", "spark", "browser")
# With test processes (make test) the spark lane, two long units (see the scheduler below),
# starts first and runs beside the others; the browser lane still comes last in a process.
LANES_IN_PROCESSES = ("spark", "unit", "broker", "lab", "browser")
LANE_BY_NAME = (   # module name prefix -> lane, first match wins
    ("test_broker_", "broker"), ("test_client_", "broker"), ("test_remoting", "broker"),
    ("test_handoff.py", "broker"), ("test_lab_", "lab"), ("test_browser_", "browser"),
    # Only names place a module in the spark lane: make test's scheduler sees names only.
    ("test_lag_fresh.py", "spark"), ("test_lag_job.py", "spark"), ("test_lag_spark_", "spark"),
    ("test_lag_stream.py", "spark"),
)


SPARK_SERVERS = "test_lag_spark_"   # the spark lane's modules that start their own Spark servers


def lane_by_name(file_name: str) -> str:
    return next((lane for prefix, lane in LANE_BY_NAME if file_name.startswith(prefix)), "unit")


def module_lane(module: pytest.Module) -> str:
    marked = [m.name for m in module.iter_markers() if m.name in LANES]
    if marked:
        return marked[0]
    return lane_by_name(module.path.name)


def pytest_itemcollected(item):
    """Every test gets its module's lane mark (before ``-m`` selects)."""
    module = item.getparent(pytest.Module)
    lane = module_lane(module)
    if (lane == "spark") != (lane_by_name(module.path.name) == "spark"):
        raise pytest.UsageError(f"{module.path.name}: the spark lane is given by name only (LANE_BY_NAME)")
    item.add_marker(lane)


def pytest_xdist_make_scheduler(config, log):
    """``make test``'s test processes (pytest-xdist) take whole work units in lane order: a
    module (its module fixtures - brokers, labs, servers - are made once), except the spark
    lane, which is two: the Spark servers' module (Connect, a standalone cluster) and the
    local-session modules together - more JVMs side by side on two cores slow each other
    past their deadlines. Grouped here from the test ids, as xdist's own ``loadgroup`` can
    no longer rename them (pytest 9.2)."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = path.rsplit("/", 1)[-1]
            if lane_by_name(name) != "spark":
                return path
            return "spark servers" if name.startswith(SPARK_SERVERS) else "spark lane"

    config.option.loadscopereorder = False   # lane order, not the biggest unit first
    return LaneScheduling(config, log)


@pytest.hookimpl(trylast=True)   # after pytest-django's database ordering, which splits modules
def pytest_collection_modifyitems(config, items):
    """Lane order (the spark lane first with test processes); a module's tests together (its
    module fixtures are made once), in the order pytest-django left them.
    TEST_ORDER=reversed runs each module's tests last to first: tests must not lean on what
    an earlier test left behind (module fixtures are shared, their state is not); CI runs
    the modules that share a running lab that way too (.ci/run)."""
    modules = [item.getparent(pytest.Module) for item in items]
    first_seen = {module: i for i, module in reversed(list(enumerate(modules)))}
    lanes = LANES_IN_PROCESSES if os.environ.get("PYTEST_XDIST_WORKER") else LANES
    lane = {module: lanes.index(module_lane(module)) for module in first_seen}
    order = sorted(range(len(items)), key=lambda i: (lane[modules[i]], first_seen[modules[i]]))
    items[:] = [items[i] for i in order]
    if os.environ.get("TEST_ORDER") == "reversed":
        by_module: dict = {}
        for item in items:
            by_module.setdefault(item.getparent(pytest.Module), []).append(item)
        items[:] = [item for tests in by_module.values() for item in reversed(tests)]


def pytest_report_collectionfinish(config, start_path, items):
    counts = {lane: 0 for lane in LANES}
    for item in items:
        counts[module_lane(item.getparent(pytest.Module))] += 1
    return "lanes: " + ", ".join(f"{lane} {n}" for lane, n in counts.items())


# ---------------------------------------------------------------- real services

def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _require_service(name: str, host: str, port: int) -> None:
    require(_reachable(host, port), f"{name} is not reachable at {host}:{port}")


@pytest.fixture(scope="session")
def redis_url() -> str:
    _require_service("Redis", "127.0.0.1", 6379)
    return os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_database(redis_url):
    """``redis_database(k)``: the URL of a Redis database of this test process's own (k = 0
    or 1 for two uses), so a controller of another pytest worker (xdist) never answers ours."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0

    def url(k: int = 0) -> str:
        return redis_url.rsplit("/", 1)[0] + f"/{1 + (2 * index + k) % 15}"
    return url


@pytest.fixture(scope="session")
def postgres_url() -> str:
    _require_service("PostgreSQL", "127.0.0.1", 5432)
    return os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")


# ---------------------------------------------------------------- brokers

@pytest.fixture
def official_client_thread_loop():
    """The official v5 client opens its telemetry stream from the thread that starts it, and
    grpc.aio binds that call to the thread's current event loop; a test process whose main
    thread was left without one (``asyncio.run`` and async tests set it to None when they
    end) made a consumer's start fail once in CI ("There is no current event loop in thread
    'MainThread'"). Give the thread a loop for the test if it has none."""
    import asyncio

    try:
        asyncio.get_event_loop_policy().get_event_loop()
        loop = None
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    yield
    if loop is not None:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One real broker per test module (topic TopicTest with 8 queues on broker-a)."""
    from .brokers import BrokerProcess

    with BrokerProcess(tmp_path_factory.mktemp("broker"), topics=["TopicTest:8@broker-a"]) as b:
        yield b


@pytest.fixture(scope="module")
def fast_broker(tmp_path_factory):
    """A broker with short intervals (see FAST_BROKER_ARGS), topic TopicTest:8 on broker-a."""
    from .brokers import FAST_BROKER_ARGS, BrokerProcess

    with BrokerProcess(tmp_path_factory.mktemp("fastbroker"), topics=["TopicTest:8@broker-a"],
                       extra_args=FAST_BROKER_ARGS) as b:
        yield b


@pytest.fixture
def stubs_for():
    """``stubs_for(address, client_id=...)`` -> BrokerStubs, closed after the test."""
    from .brokers import BrokerStubs

    made = []

    def make(address: str, client_id: str = "test-client") -> BrokerStubs:
        s = BrokerStubs(address, client_id)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# ---------------------------------------------------------------- the web side

@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """Each test starts with full control-API buckets (user ids repeat across test databases)."""
    from dashboard.api import _limiter
    from dashboard.views import login_limiter
    _limiter.cache_clear()
    login_limiter.cache_clear()
    yield


@pytest.fixture
async def fake_lab():
    """A FakeLab (tests/fake_lab.py: the real controller on a fake broker and clients)
    answering the bus over the in-memory channel layer."""
    from channels.layers import get_channel_layer

    from .fake_lab import FakeLab

    layer = get_channel_layer()
    await layer.flush()  # the in-memory layer outlives a test's event loop
    lab = await FakeLab().start()
    yield lab
    await lab.stop()
    await layer.flush()


@pytest.fixture
def user(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("alice")  # no password: hashing one is slow


@pytest.fixture
async def async_client(user):
    """Django's AsyncClient logged in as ``user``."""
    from django.test import AsyncClient

    client = AsyncClient()
    await client.aforce_login(user)
    return client


# ---------------------------------------------------------------- the browser

@pytest.fixture(scope="session")
def browser():
    """One headless Debian chromium (Playwright's Browser) for the browser lane, which runs
    last: Playwright's sync API keeps an event loop running in this thread, and Django then
    refuses database work here. Its absence skips locally and fails on CI."""
    from .browser import chromium, require_chromium

    require_chromium()
    with chromium() as browser:
        yield browser
