"""observer.OldestUnconsumed: which queues it probes and what it keeps between looks.
A unit: the cluster is a stand-in answering store times."""
from __future__ import annotations

import asyncio

from consumers_app.lab.observer import OldestUnconsumed
from consumers_app.message_queue import MessageQueue


class Cluster:
    """Answers the store time of ``offset`` as 1000 + offset; counts the questions."""

    def __init__(self):
        self.asked = []

    async def store_ts_at(self, address, group, mq, offset):
        self.asked.append((group, mq.label, offset))
        return 1000 + offset


def figures(*queues, committed=5, max_offset=10):
    return {MessageQueue("T", "broker-a", q): {"committed_offset": committed, "min_offset": 0, "max_offset": max_offset}
            for q in queues}


def look(oldest, group, f):
    asyncio.run(oldest.fill(group, f, {"broker-a": "127.0.0.1:1"}))
    return {mq.queue_id: v["oldest_unconsumed_store_ts"] for mq, v in f.items()}


def test_a_queue_is_probed_once_per_committed_offset():
    cluster = Cluster()
    oldest = OldestUnconsumed(cluster)
    assert look(oldest, "G", figures(0, 1)) == {0: 1005, 1: 1005}
    assert look(oldest, "G", figures(0, 1)) == {0: 1005, 1: 1005}
    assert len(cluster.asked) == 2, "the same offsets are not asked again"
    assert look(oldest, "G", figures(0, 1, committed=10)) == {0: 0, 1: 0}, "caught up: nothing unconsumed"


def test_queues_a_group_no_longer_has_are_forgotten():
    oldest = OldestUnconsumed(Cluster())
    look(oldest, "G", figures(*range(8)))
    look(oldest, "H", figures(0))
    look(oldest, "G", figures(0, 1))     # six of G's queues went (a topic shrank, a broker left)
    assert {k[1].queue_id for k in oldest.asked_at if k[0] == "G"} == {0, 1}
    assert {k[1].queue_id for k in oldest.known if k[0] == "G"} == {0, 1}
    assert [k[0] for k in oldest.known].count("H") == 1, "another group's queues stay"
