"""``runlab --namesrv``: the lab on an existing cluster, with no broker of its own.

A separately started broker with a name server plays the existing cluster: runlab creates
the scenario's topic there over remoting, runs the default scenario on it, refuses the
lab-only controls with their reasons, and observes a group started by someone else.
"""
import json
import socket
import subprocess
import sys
import threading
import urllib.error

import pytest

from consumers_app.lab.cluster_admin import DISABLED, POP_NEEDS_PROXY
from consumers_app.remoting import wire

from .brokers import BrokerProcess
from .remoting_peers import AliOns, call, require_ali_ons
from .runlab import Server, cookie_jar, logged_in, migrated_env, post, state, wait_for_three
from .support import REPO, free_port, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Two brokers and no TopicTest yet: runlab has to create the scenario's topic on both.
    with BrokerProcess(tmp_path_factory.mktemp("cluster"), topics=["Seed:1@broker-a", "Seed:1@broker-b"],
                       extra_args=["--client-expiry-ms=3000"], remoting=True) as broker:
        yield broker


def refused(browser, port, path, body) -> tuple[int, str]:
    try:
        post(browser, port, path, body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)["error"]
    raise AssertionError(f"{path} was accepted")


def test_runlab_attached_runs_the_scenario_on_the_cluster_and_refuses_lab_only_controls(cluster, tmp_path):
    port = free_port()
    lab = Server("runlab", "--host", "127.0.0.1", "--port", str(port), "--namesrv", cluster.namesrv,
                 "--client-option=*.heartbeat_interval_ms=1000", env=migrated_env(tmp_path))
    outside = None
    try:
        url = lab.line_starting("Rebalance Lab is running", timeout=90).split("open ", 1)[1]
        assert lab.line_starting("name server:", timeout=5) == f"name server: {cluster.namesrv} (attached)"
        assert not any("starting broker" in x for x in lab.lines)
        browser = logged_in(url)
        wait_for_three(lab, browser, port, timeout=30, message="the default scenario on the cluster")

        # The topic was created on the cluster: four queues on each of its brokers.
        route = wire.loads(call(cluster.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).body)
        assert {q["brokerName"]: q["readQueueNums"] for q in route["queueDatas"]} == {"broker-a": 4, "broker-b": 4}
        before = state(browser, port)
        assert before["cluster"] == {"attached": True, "namesrv": cluster.namesrv,
                                     "disabled": {**DISABLED, "pop": POP_NEEDS_PROXY}}
        assert set(before["topics"]) == {"TopicTest"}   # the lab's topics, not the cluster's Seed
        assert before["brokers"] == {"broker-a": {"online": True}, "broker-b": {"online": True}}

        browser.open(f"http://127.0.0.1:{port}/", timeout=10)   # the page sets the CSRF cookie
        assert any(c.name == "csrftoken" for c in cookie_jar(browser))
        assert refused(browser, port, "/api/brokers/broker-a/offline", {}) == (400, DISABLED["broker_online"])
        assert refused(browser, port, "/api/topics/TopicTest/queues", {"delta": 1}) == (400, DISABLED["queues"])
        assert refused(browser, port, "/api/groups/GID_POP/consumers", {"mode": "pop"}) == (400, POP_NEEDS_PROXY)
        assert refused(browser, port, "/api/groups/GID_LAB/mode", {"mode": "pop"}) == (400, POP_NEEDS_PROXY)
        after = state(browser, port)
        assert (after["topics"], after["brokers"]) == (before["topics"], before["brokers"])
        assert set(after["groups"]) == {"GID_LAB"} and after["groups"]["GID_LAB"]["mode"] == "push"
        route = wire.loads(call(cluster.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).body)
        assert sum(q["readQueueNums"] for q in route["queueDatas"]) == 8

        # A group someone else started on the cluster is observed there too.
        require_ali_ons()
        outside = AliOns.consume(cluster.namesrv, "GID_OUTSIDE", "TopicTest")
        outside.wait_ready()
        post(browser, port, "/api/observe", {"group": "GID_OUTSIDE"})
        wait_until(lambda: state(browser, port)["groups"]["GID_OUTSIDE"]["clients"], timeout=30,
                   message="the outside client listed")
        seen = state(browser, port)["groups"]["GID_OUTSIDE"]
        assert seen["observed"] is True and len(seen["queues"]) == 8
    finally:
        if outside is not None:
            outside.kill()
        code = lab.stop()
    assert code == 0, "".join(lab.lines)


def silent_name_server():
    """A port that accepts connections and never answers (a hung name server)."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    return server


@pytest.mark.parametrize("where", ["nothing listening", "silent", "not an address"])
def test_runlab_on_a_name_server_that_does_not_answer_exits_1_with_one_line(tmp_path, where):
    server = silent_name_server() if where == "silent" else None
    namesrv = {"nothing listening": f"127.0.0.1:{free_port()}", "not an address": "nowhere",
               "silent": f"127.0.0.1:{server.getsockname()[1] if server else 0}"}[where]
    env = {**migrated_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    try:   # it gives up by itself (a hung name server must not hang the lab): no retry loop
        done = subprocess.run([sys.executable, str(REPO / "manage.py"), "runlab", "--namesrv", namesrv,
                               "--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env=env)
    finally:
        if server is not None:
            server.close()
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cannot reach the name server at {namesrv}: "), done.stderr


def test_runlab_attached_to_an_existing_topic_runs_the_scenario_on_it(cluster, tmp_path):
    port = free_port()
    lab = Server("runlab", "--host", "127.0.0.1", "--port", str(port), "--namesrv", cluster.namesrv,
                 "--topic", "Seed", "--client-option=*.heartbeat_interval_ms=1000", env=migrated_env(tmp_path))
    try:
        url = lab.line_starting("Rebalance Lab is running", timeout=90).split("open ", 1)[1]
        browser = logged_in(url)

        def settled():
            snap = state(browser, port)
            group = snap["groups"].get("GID_LAB", {})
            owners = [q["owners"] for q in group.get("queues", {}).values()]
            return (group.get("topic") == "Seed" and len(group.get("assignments", {})) == 3
                    and sorted(group["queues"]) == ["broker-a:0", "broker-b:0"]
                    and all(len(o) == 1 for o in owners) and snap)
        snap = wait_until(settled, timeout=30, message="GID_LAB sharing Seed's two queues")
        assert "Seed" in snap["producers"]
        # Adopted, not resized: Seed still has one queue on each broker.
        route = wire.loads(call(cluster.namesrv, wire.GET_ROUTEINFO_BY_TOPIC, {"topic": "Seed"}).body)
        assert sorted((q["brokerName"], q["readQueueNums"]) for q in route["queueDatas"]) == [
            ("broker-a", 1), ("broker-b", 1)]
    finally:
        code = lab.stop()
    assert code == 0, "".join(lab.lines)


def test_runlab_attached_to_a_missing_topic_exits_1_with_one_line(cluster, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "runlab", "--namesrv", cluster.namesrv,
                           "--topic", "NoSuchTopic", "--port", str(free_port())], cwd=REPO, capture_output=True,
                          text=True, timeout=30, env={**migrated_env(tmp_path), "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"the cluster at {cluster.namesrv} has no topic 'NoSuchTopic'"), done.stderr
