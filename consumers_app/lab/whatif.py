"""What-if: the assignment a group would get under another strategy, before switching.

Computed with the consumers' own code (consumers_app/allocate.py) on the lists every
member would feed it (RebalanceImpl's sort of the member ids and the topic's queues), so
the preview is what the members will compute, not an estimate. Pure: no I/O, nothing
changed; the controller answers with ``preview_group``.
"""
from collections.abc import Iterable, Mapping

from consumers_app.allocate import AllocateStrategy, get_strategy, sort_for_allocation
from consumers_app.message_queue import MessageQueue, broker_of

from .state import GroupState, LabState


def preview_strategy(strategy: AllocateStrategy, group: str, topic: str, queues: Iterable[str],
                     members: Iterable[str], current: Mapping[str, Iterable[str]]) -> dict:
    """``{"current", "proposed", "moves", "moved"}`` for switching ``group`` to ``strategy``.

    ``queues``: the topic's online queue labels; ``members``: the live member ids;
    ``current``: client id -> the labels it holds now (clients that are not members are
    ignored: they take no part in the next rebalance). A move is a queue whose holders
    change: ``{"queue", "from": [clients holding it now], "to": its next owner or None}``
    (a strategy without options gives each queue at most one owner).
    """
    mqs, cids = sort_for_allocation((MessageQueue.from_label(topic, label) for label in set(queues)), set(members))
    held = {cid: set(current.get(cid, ())) for cid in cids}
    given = {cid: {mq.label for mq in strategy.allocate(group, cid, mqs, cids)} if mqs else set() for cid in cids}
    moves = []
    for mq in mqs:   # in queue order; ids in RocketMQ's order, so each "from" is sorted
        before = [cid for cid in cids if mq.label in held[cid]]
        after = [cid for cid in cids if mq.label in given[cid]]
        if before != after:
            moves.append({"queue": mq.label, "from": before, "to": after[0] if after else None})
    in_order = lambda labels: [mq.label for mq in mqs if mq.label in labels]  # noqa: E731
    return {"current": {cid: in_order(held[cid]) for cid in cids},
            "proposed": {cid: in_order(given[cid]) for cid in cids},
            "moves": moves, "moved": len(moves)}


def preview_group(state: LabState, group: GroupState, strategy_name: str) -> dict:
    """The preview answer for one of the lab's groups, from what the lab knows now: the
    broker's member list (less consumers the lab already saw go), the topic's queues on
    online brokers, and each member's reported assignment."""
    members = [m for m in group.members if m not in state.clients or state.clients[m].alive]
    queues = [x for x in state.topics.get(group.topic, ()) if state.brokers.get(broker_of(x), True)]
    preview = preview_strategy(get_strategy(strategy_name), group.name, group.topic, queues, members, group.assignments)
    return {"group": group.name, "strategy": strategy_name, **preview}
