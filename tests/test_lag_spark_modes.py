"""The lag job gives the same rows in its three modes: local (the default), Spark Connect
(``SPARK_REMOTE=sc://...``) and a standalone cluster (``SPARK_MASTER=spark://...``).

Every server comes from the installed pyspark itself - its bin/ scripts and jars/ (4.x
ships the Spark Connect server jar there) - so nothing is downloaded. All of it binds to
127.0.0.1 with one core and small heaps, logs under tmp_path, and is killed (its whole
process group: the worker's executors too) when its fixture ends, failed or not.

The job runs as ``manage.py lagjob`` in a child process, as the history page starts it
(and one process can hold a classic or a Connect session, not both). Each mode gets its
own copy of one recorded data set (tests/lag_scenario.py, 3 minutes) in two
steps - a first run, then an incremental one over one more minute - so the merge with the
rows already written is exercised too.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest

from consumers_app.lab.recorder import Recorder

from .lag_scenario import assert_queue_windows, expected, record
from .support import REPO, free_port, require, wait_until

pytestmark = [
    pytest.mark.spark,
    # A mode's fixture (server start plus two job runs) is charged to its first test; on
    # a loaded 2-core machine the cluster takes minutes. The waits inside have their own.
    pytest.mark.timeout(900),
]

SPARK_HOME = Path(pyspark.__file__).resolve().parent
FIRST, LAST = 120, 180          # seconds recorded before the first run / in all
START_TIMEOUT = 180             # a JVM daemon to answer
JOB_TIMEOUT = 420               # one lagjob run
RES_TABLES = ("queue_windows", "group_windows", "flow_control")
OTHER_TABLES = ("owner_windows", "rebalances", "marks")
# What the job could pick up from the caller's environment and must not here.
FOREIGN_ENV = ("SPARK_REMOTE", "SPARK_MASTER", "PYSPARK_SUBMIT_ARGS", "SPARK_CONNECT_MODE_ENABLED",
               "SPARK_CONF_DIR", "SPARK_HOME", "LAB_DATA_DIR")

require(shutil.which("java") is not None, "no java on PATH: every Spark mode needs a JVM (Java 17)", module_level=True)


_LIBC = ctypes.CDLL(None)  # loaded here: a forked child must not dlopen (other threads' locks)


def _die_with_pytest() -> None:
    # In the child, before exec (which keeps it): SIGTERM when pytest dies, even SIGKILLed.
    _LIBC.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _spark_env(conf_dir: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    return {**env, "SPARK_HOME": str(SPARK_HOME), "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1", **extra}


class Jvm:
    """A Spark process (spark-class/spark-submit exec the JVM) in its own process group."""

    def __init__(self, name: str, args: list[str], env: dict, log_dir: Path):
        self.name, self.log = name, log_dir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(args, env=env, cwd=log_dir, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_pytest)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(self, check, what: str) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {what}; "
                                     f"{self.log}:\n{self.tail()}")
            return check()

        wait_until(ready, timeout=START_TIMEOUT, interval=0.2, message=f"{self.name}: {what} (log: {self.log})")

    def stop(self) -> None:
        # SIGTERM first (a worker then kills its executors itself), SIGKILL what is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _master_state(ui_port: int) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            return json.load(answer)
    return None


@contextlib.contextmanager
def connect_server(conf_dir: Path, log_dir: Path):
    """A Spark Connect server (local[1], 512m) from pyspark's own jars -> its sc:// URL."""
    jars = sorted((SPARK_HOME / "jars").glob("spark-connect_*.jar"))
    require(bool(jars), f"pyspark {pyspark.__version__} ships no spark-connect_*.jar in {SPARK_HOME / 'jars'}: "
                        "a Connect server would need --packages, i.e. a download")
    port = free_port()
    server = Jvm("connect-server", [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "lag-connect-test",
        "--master", "local[1]", "--driver-memory", "512m",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.ui.enabled=false",
    ], _spark_env(conf_dir), log_dir)
    try:
        server.wait_for(lambda: _accepts(port), f"gRPC port {port} open")
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def standalone_cluster(conf_dir: Path, log_dir: Path):
    """A standalone master and one worker (1 core, 512m for executors) -> (the spark:// URL,
    a callable answering the master's state)."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    env = _spark_env(conf_dir, SPARK_DAEMON_MEMORY="256m")
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    master = Jvm("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(port), "--webui-port", str(ui)], env, log_dir)
    worker = None
    try:
        master.wait_for(lambda: _master_state(ui) is not None, "web UI answering")
        work_dir = log_dir / "worker-work"
        work_dir.mkdir()
        worker = Jvm("worker", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                "--webui-port", str(free_port()), "--cores", "1", "--memory", "512m",
                                "--work-dir", str(work_dir), url], env, log_dir)
        worker.wait_for(lambda: (_master_state(ui) or {}).get("aliveworkers", 0) >= 1, "registered with the master")
        yield url, lambda: _master_state(ui) or {}
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


@dataclass
class ModeRun:
    mode: str
    out: Path
    summaries: list[dict] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    apps: list[str] = field(default_factory=list)   # cluster: the applications the master ran
    stream_out: Path | None = None                  # the lag stream's output, same recordings
    stream_summaries: list[str] = field(default_factory=list)


def _lagjob(data_dir: Path, env: dict, log: Path, *args: str) -> dict:
    """``manage.py lagjob`` (incremental, as the page runs it) -> its JSON summary."""
    # --skip-checks: Django's system checks (URLs, apps) are not what is tested here.
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "manage.py"), "lagjob", "--skip-checks", *args],
                                cwd=REPO, env={**env, "LAB_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_pytest)
        try:
            code = proc.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):   # its Spark driver JVM too
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text(errors="replace")
    assert code == 0, f"lagjob {'timed out' if code is None else f'exited {code}'} ({log}):\n{text[-4000:]}"
    return json.loads(next(line for line in reversed(text.splitlines()) if line.startswith("{")))


def _run_mode(mode: str, extra_env: dict, recorded, conf_dir: Path, base: Path) -> ModeRun:
    """The batch job in two runs, then the lag stream in two passes over the same files
    (into a data dir of its own)."""
    source, first, rest = recorded
    run = ModeRun(mode, base / "data" / "lag", stream_out=base / "stream" / "lag")
    env = _spark_env(conf_dir, LAG_SPARK_DRIVER_MEMORY="512m", **extra_env)
    for data_dir, args in ((base / "data", ()), (base / "stream", ("--stream",))):
        for step, files in enumerate((first, rest), 1):
            for rel in files:
                (data_dir / "recordings" / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / rel, data_dir / "recordings" / rel)
            summary = _lagjob(data_dir, env, base / f"lagjob-{data_dir.name}-{step}.log", *args)
            if args:
                run.stream_summaries.append(summary["state"])
            else:
                run.seconds.append(summary.pop("seconds"))
                run.summaries.append(summary)
    return run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(dir, files of the first FIRST seconds, files of the rest), relative to dir."""
    root = tmp_path_factory.mktemp("recordings")
    with Recorder(root) as recorder:
        record(recorder, 0, FIRST)
    first = sorted(p.relative_to(root) for p in root.rglob("*.parquet"))
    with Recorder(root) as recorder:
        record(recorder, FIRST, LAST)
    rest = sorted(set(p.relative_to(root) for p in root.rglob("*.parquet")) - set(first))
    return root, first, rest


@pytest.fixture(scope="module")
def conf_dir(tmp_path_factory):
    """SPARK_CONF_DIR for every Spark process here: small executors, no master REST port."""
    conf = tmp_path_factory.mktemp("spark-conf")
    (conf / "spark-defaults.conf").write_text(
        "spark.executor.memory 512m\n"
        "spark.cores.max 1\n"
        "spark.master.rest.enabled false\n")
    return conf


@pytest.fixture(scope="module")
def local_run(recorded, conf_dir, tmp_path_factory):
    return _run_mode("local", {}, recorded, conf_dir, tmp_path_factory.mktemp("local"))


@pytest.fixture(scope="module", params=["connect", "cluster"])
def other_run(request, recorded, conf_dir, tmp_path_factory):
    """The job against a server started here and stopped before the comparisons."""
    base = tmp_path_factory.mktemp(request.param)
    if request.param == "connect":
        with connect_server(conf_dir, base) as remote:
            return _run_mode("connect", {"SPARK_REMOTE": remote}, recorded, conf_dir, base)
    with standalone_cluster(conf_dir, base) as (master, state):
        run = _run_mode("cluster", {"SPARK_MASTER": master}, recorded, conf_dir, base)

        def completed():  # the master lists an application as completed once its driver is gone
            apps = state().get("completedapps", [])
            return len(apps) >= 4 and apps

        done = wait_until(completed, timeout=60, interval=0.2, message="both runs as completed applications")
        run.apps = sorted(app["name"] for app in done)
        return run


def _table(out: Path, table: str):
    """A table as readers see it: its files and its tail's (the stream's recent hours)."""
    from dashboard.lag import tail

    main, recent = tail.effective_files(out, table)
    import pyarrow as pa
    import pyarrow.dataset as ds

    parts = [ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(root.resolve())).to_table()
             for root, files in ((out / table, main), (tail.tail_of(out, table), recent)) if files]
    return pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})


def _rows(table, res: str | None) -> Counter:
    """The table's rows (of one res) as a multiset: order ignored, duplicates counted."""
    return Counter(tuple(sorted(r.items())) for r in table.to_pylist() if res is None or r["res"] == res)


def _assert_same_rows(local, other, what: str, res: str | None = None) -> None:
    def columns(t):
        return sorted((f.name, str(f.type)) for f in t.schema)

    assert columns(other) == columns(local), what
    mine, theirs = _rows(local, res), _rows(other, res)
    assert mine, f"{what}: no rows in local mode"
    assert theirs == mine, (f"{what}: only in local {list((mine - theirs).elements())[:3]}, "
                            f"only in the other mode {list((theirs - mine).elements())[:3]}")


def test_local_mode_matches_the_hand_computed_history(local_run):
    """The reference is right: both runs done, the queue windows as test_lag_job computes them."""
    assert [s["state"] for s in local_run.summaries] == ["done", "done"]
    assert_queue_windows(_table(local_run.out, "queue_windows").to_pandas(), expected(0, LAST))


@pytest.mark.parametrize("res", ["10s", "1m"])
def test_windows_match_local_mode(other_run, local_run, res):
    for table in RES_TABLES:
        _assert_same_rows(_table(local_run.out, table), _table(other_run.out, table),
                          f"{other_run.mode} {table} res={res}", res)


def test_owner_windows_and_rebalances_match_local_mode(other_run, local_run):
    for table in OTHER_TABLES:
        _assert_same_rows(_table(local_run.out, table), _table(other_run.out, table), f"{other_run.mode} {table}")


def test_run_summaries_match_local_mode(other_run, local_run, recorded):
    """Same plan: the same ranges, files and rows read, rows written per table, both runs."""
    assert other_run.summaries == local_run.summaries
    # Incremental: only the last minute's files (six 10-s snapshot parts and one event part).
    assert other_run.summaries[1]["new_files"] == len(recorded[2]) == 7
    if other_run.mode == "cluster":  # the work went to the cluster, not a local fallback
        assert other_run.apps == ["rebalance-lab-lag"] * 4   # two batch runs, two stream passes


def test_the_stream_gives_the_batchs_rows_in_every_mode(other_run, local_run):
    """The lag stream's passes (``lagjob --stream``, as the lag service runs them) against
    the same server: every table equal to local mode's batch."""
    assert other_run.stream_summaries == ["done", "done"] and local_run.stream_summaries == ["done", "done"]
    for run in (local_run, other_run):
        for table in RES_TABLES:
            for res in ("10s", "1m"):
                _assert_same_rows(_table(local_run.out, table), _table(run.stream_out, table),
                                  f"{run.mode} stream {table} res={res}", res)
        for table in OTHER_TABLES:
            _assert_same_rows(_table(local_run.out, table), _table(run.stream_out, table), f"{run.mode} stream {table}")
