"""The lab's state survives a restart of runlab (saved in the database) unless --fresh."""
import json
import time

from .runlab import Server, logged_in, migrated_env, post, state, wait_for_three
from .support import free_port, wait_until


def start(port, env, *extra):
    lab = Server("runlab", "--host", "127.0.0.1", "--port", str(port), "--namesrv-port=0", "--remoting-port=0",
                 "--broker-arg=--client-expiry-ms=3000",
                 "--client-option=*.heartbeat_interval_ms=1000", *extra, env=env)
    url = lab.line_starting("Rebalance Lab is running", timeout=90).split("open ", 1)[1]
    return lab, logged_in(url)


def live(group):
    return sorted(c for c, info in group["clients"].items() if info["status"] in ("running", "hung"))


def final_rebalances(browser, port) -> dict:
    """id -> (ts, moved) of GID_LAB's rebalances whose last hand-off is over 4 s old."""
    now = time.time() * 1000
    return {r["id"]: (r["ts"], r["moved"]) for r in state(browser, port)["groups"]["GID_LAB"]["handoffs"]["rebalances"]
            if r.get("end_ts") is not None and now - r["end_ts"] > 4000}


def test_the_lab_comes_back_as_it_was_left_unless_fresh(tmp_path):
    env = migrated_env(tmp_path)
    port = free_port()
    lab, browser = start(port, env)
    try:
        wait_for_three(lab, browser, port, timeout=30, message="the scenario")
        browser.open(f"http://127.0.0.1:{port}/", timeout=10)   # the page sets the CSRF cookie
        post(browser, port, "/api/groups/GID_LAB/strategy", {"strategy": "AVG_BY_CIRCLE"})
        post(browser, port, "/api/producers/rate", {"topic": "TopicTest", "rate": 77})
        added = post(browser, port, "/api/groups/GID_LAB/consumers", {"mode": "push"})["client_id"]
        post(browser, port, f"/api/consumers/{added}/slow", {"ms": 5})
        # Saved within a couple of seconds of the last change.
        wait_until(lambda: saved_scenario(env), timeout=10, message="the lab state saved")
        wait_until(lambda: (s := saved_scenario(env)) and s["groups"][0]["consumers"] == 4
                   and any(f["slow_ms"] == 5 for f in s["groups"][0]["faults"]), timeout=10,
                   message="the last change saved")
        # The switch moved queues: the hand-offs' 15-minute story, as it stands before the stop.
        wait_until(lambda: state(browser, port)["groups"]["GID_LAB"]["handoffs"]["totals"]["moved"] > 0,
                   timeout=15, message="a rebalance that moved queues")
        # Compared are the rebalances already final: hand-offs within 3 s of a rebalance's last
        # one still join it (one read right after the switch saw 15 moves, the stop saved 16).
        wait_until(lambda: final_rebalances(browser, port), timeout=30, message="a rebalance final")
    finally:
        before = final_rebalances(browser, port)
        named = set(state(browser, port)["groups"]["GID_LAB"]["clients"])
        assert lab.stop() == 0, "".join(lab.lines)

    lab, browser = start(port, env)
    try:
        assert any("restoring the lab" in x for x in lab.lines)
        def restored():
            snap = state(browser, port)
            group = snap["groups"].get("GID_LAB")
            return (group and group["strategy"] == "AVG_BY_CIRCLE" and len(live(group)) == 4
                    and sorted(group["clients"][c]["slow_ms"] for c in live(group)) == [0, 0, 0, 5]
                    and snap["producers"]["TopicTest"]["rate"] == 77)
        wait_until(restored, timeout=30, message="strategy, consumers, faults and producer rate restored")
        # The restored consumers are new ones: their names go on from the last run's, so the
        # history never shows two consumers under one name.
        restarted = live(state(browser, port)["groups"]["GID_LAB"])
        assert not set(restarted) & named, (named, restarted)
        assert min(int(c[1:]) for c in restarted) > max(int(c[1:]) for c in named if c[1:].isdigit())
        # The last 15 minutes of hand-offs survive the restart, their overlaps ended.
        story = {r["id"]: r for r in state(browser, port)["groups"]["GID_LAB"]["handoffs"]["rebalances"]}
        assert {i: (r["ts"], r["moved"]) for i, r in story.items() if i in before} == before, (before, story)
        assert not any(story[i]["overlap_ongoing"] for i in before)
        first = min(before)
        detail = json.load(browser.open(f"http://127.0.0.1:{port}/api/groups/GID_LAB/rebalances/{first}", timeout=30))
        assert detail["moved"] == before[first][1] == len(detail["moves"])
    finally:
        assert lab.stop() == 0, "".join(lab.lines)

    lab, browser = start(port, env, "--fresh")
    try:
        def default():
            snap = state(browser, port)
            group = snap["groups"]["GID_LAB"]
            return group["strategy"] == "AVG" and len(live(group)) == 3 and snap["producers"]["TopicTest"]["rate"] == 200
        wait_until(default, timeout=30, message="--fresh starts from the default scenario")
        # --fresh forgets the hand-offs too: what this run shows started with it.
        started = min(ts for ts, _ in before.values()) + 1
        shown = state(browser, port)["groups"]["GID_LAB"]["handoffs"]["rebalances"]
        assert not [r for r in shown if r["ts"] < started and (r["id"], r["ts"]) in {(i, t) for i, (t, _) in before.items()}]
    finally:
        assert lab.stop() == 0, "".join(lab.lines)


def saved_scenario(env):
    import sqlite3
    from pathlib import Path
    db = Path(env["LAB_DATA_DIR"]) / "db.sqlite3"
    with sqlite3.connect(db) as conn:
        row = conn.execute("select scenario from consumers_app_savedlab where name='default'").fetchone()
    return json.loads(row[0]) if row else None
