"""RocketMQ's message-queue allocation strategies, ported from the Java client.

Each consumer of a group runs its strategy on its own, on the same two lists, and keeps
only the queues the strategy hands *it*. Nobody coordinates: the group ends up sharing the
topic correctly only because every member computes the same answer. That is why the
caller (RocketMQ's ``RebalanceImpl.rebalanceByTopic``) sorts both lists first, and why
these ports must agree with the Java classes element for element, in order:

==========================  ================================================  =========
name (``getName()``)        Java class                                        options
==========================  ================================================  =========
``AVG``                     ``AllocateMessageQueueAveragely`` (the default)
``AVG_BY_CIRCLE``           ``AllocateMessageQueueAveragelyByCircle``
``CONSISTENT_HASH``         ``AllocateMessageQueueConsistentHash``            ``virtual_node_count`` (10),
                                                                              ``hash_function``
``CONFIG``                  ``AllocateMessageQueueByConfig``                  ``message_queues``
``MACHINE_ROOM``            ``AllocateMessageQueueByMachineRoom``             ``consumer_idcs``
``MACHINE_ROOM_NEARBY``     ``AllocateMachineRoomNearby``                     ``strategy``,
                                                                              ``machine_room_resolver``
==========================  ================================================  =========

Use :func:`get_strategy` to build one by name and :func:`sort_for_allocation` to sort the
inputs as ``RebalanceImpl`` does. The strategies themselves never sort: like the Java
classes, they work on the lists exactly as given.

Errors follow the Java classes: where Java throws ``IllegalArgumentException`` (or would
fail with a ``NullPointerException``) we raise :class:`ValueError`; where Java returns an
empty list (the current consumer is not in the id list) we return ``[]``.
"""
from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from typing import Callable, Iterable, Protocol, Sequence

from .javastr import java_key
from .message_queue import MessageQueue

__all__ = [
    "MessageQueue",
    "AllocateStrategy",
    "Averagely",
    "AveragelyByCircle",
    "ConsistentHash",
    "ByConfig",
    "ByMachineRoom",
    "MachineRoomNearby",
    "RoomPrefixResolver",
    "ConsistentHashRing",
    "md5_hash",
    "get_strategy",
    "sort_for_allocation",
    "STRATEGY_NAMES",
]


def sort_for_allocation(
    mq_all: Iterable[MessageQueue], cid_all: Iterable[str]
) -> tuple[list[MessageQueue], list[str]]:
    """Sort queues and consumer ids as ``RebalanceImpl.rebalanceByTopic`` does.

    Queues by ``MessageQueue.compareTo`` (topic, broker name, queue id); ids as plain
    Java strings (UTF-16 code units), so ``"c10"`` comes before ``"c2"``.
    """
    return sorted(mq_all), sorted(cid_all, key=java_key)


class AllocateStrategy:
    """Base class: ``name`` plus ``allocate(...) -> list[MessageQueue]``."""

    #: What RocketMQ's ``getName()`` returns; also the key for :func:`get_strategy`.
    name: str = ""

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        raise NotImplementedError

    @staticmethod
    def check(current_cid, mq_all, cid_all) -> bool:
        """``AbstractAllocateMessageQueueStrategy.check``: the guard most strategies share.

        Raises ValueError (Java: IllegalArgumentException) for an empty current id, or an
        empty/None queue or id list, in that order. Returns False, meaning "allocate
        nothing", when the current consumer is not in ``cid_all`` (Java logs it as a
        ``[BUG]``: the broker's member list and this client disagree for a moment).
        """
        if not current_cid:
            raise ValueError("currentCID is empty")
        if not mq_all:
            raise ValueError("mqAll is null or mqAll empty")
        if not cid_all:
            raise ValueError("cidAll is null or cidAll empty")
        return current_cid in cid_all

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def _as_list(items):
    """Lists pass through, other iterables are copied, None stays None (Java null)."""
    if items is None or isinstance(items, list):
        return items
    return list(items)


# --------------------------------------------------------------------------- AVG


class Averagely(AllocateStrategy):
    """``AVG``: contiguous blocks, the first ``len(mq_all) % len(cid_all)`` consumers get one more.

    RocketMQ's default. With 8 queues and 3 consumers: c0 gets q0-q2, c1 q3-q5, c2 q6-q7.
    Blocks keep a consumer's queues together (often on the same broker); the catch is
    that any change in membership shifts almost every block boundary. With more
    consumers than queues the consumers past the last queue get nothing.
    """

    name = "AVG"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mq_all, cid_all = _as_list(mq_all), _as_list(cid_all)
        if not self.check(current_cid, mq_all, cid_all):
            return []
        n_mq, n_cid = len(mq_all), len(cid_all)
        index = cid_all.index(current_cid)  # Java indexOf: the first occurrence
        mod = n_mq % n_cid
        # All operands are non-negative, so Python's // and % match Java's int / and %.
        if n_mq <= n_cid:
            average_size = 1
        elif mod > 0 and index < mod:
            average_size = n_mq // n_cid + 1
        else:
            average_size = n_mq // n_cid
        if mod > 0 and index < mod:
            start = index * average_size
        else:
            start = index * average_size + mod
        # May be zero or negative (more consumers than queues): then nothing.
        count = min(average_size, n_mq - start)
        return [mq_all[(start + i) % n_mq] for i in range(count)]


# --------------------------------------------------------------------------- AVG_BY_CIRCLE


class AveragelyByCircle(AllocateStrategy):
    """``AVG_BY_CIRCLE``: deal the queues out like cards, consumer ``i`` takes every n-th.

    With 8 queues and 3 consumers: c0 gets q0, q3, q6; c1 q1, q4, q7; c2 q2, q5. Same
    counts as ``AVG`` but interleaved, so each consumer's queues spread over brokers.
    """

    name = "AVG_BY_CIRCLE"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mq_all, cid_all = _as_list(mq_all), _as_list(cid_all)
        if not self.check(current_cid, mq_all, cid_all):
            return []
        index = cid_all.index(current_cid)
        n_cid = len(cid_all)
        return [mq_all[i] for i in range(index, len(mq_all)) if i % n_cid == index]


# --------------------------------------------------------------------------- CONSISTENT_HASH


def _java_string_bytes(s: str) -> bytes:
    """``String.getBytes()`` with the default charset, UTF-8 (Linux, and every JDK since 18).

    Re-pair surrogates first (a Python str may hold a Java surrogate pair as two code
    points); Java's encoder writes an unpaired surrogate as ``?``, and so does
    Python's ``errors="replace"``.
    """
    joined = s.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")
    return joined.encode("utf-8", "replace")


def md5_hash(key: str) -> int:
    """RocketMQ's default ``ConsistentHashRouter.MD5Hash.hash``.

    The Java code folds only the first four digest bytes into a ``long``
    (``h <<= 8; h |= digest[i] & 0xFF``), so the value is the big-endian unsigned
    32-bit number they spell: always in ``[0, 2**32)``, never negative.
    """
    return int.from_bytes(hashlib.md5(_java_string_bytes(key)).digest()[:4], "big")


def _to_java_long(value: int) -> int:
    """Wrap an int into a signed 64-bit Java ``long`` (for custom hash functions)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value & (1 << 63) else value


class ConsistentHashRing:
    """``ConsistentHashRouter`` as the strategy uses it: build once, route many keys.

    Each physical node (a client id) puts ``vnode_count`` virtual nodes on the ring under
    the keys ``"<cid>-0"``, ``"<cid>-1"``, ... The ring is a ``TreeMap<Long, VirtualNode>``:
    two virtual nodes hashing to the same value collide and the later ``put`` wins.
    """

    def __init__(self, nodes: Iterable[str], vnode_count: int, hash_fn: Callable[[str], int] = md5_hash):
        if vnode_count < 0:
            raise ValueError(f"illegal virtual node counts :{vnode_count}")
        self._hash = hash_fn
        owner_by_hash: dict[int, str] = {}
        replicas: Counter[str] = Counter()  # virtual nodes of each cid currently on the ring
        for node in nodes:
            # addNode numbers new replicas after the ones already on the ring
            # (getExistingReplicas), which only matters if an id is listed twice.
            existing = replicas[node]
            for i in range(vnode_count):
                h = _to_java_long(hash_fn(f"{node}-{i + existing}"))
                previous = owner_by_hash.get(h)
                if previous is not None:
                    replicas[previous] -= 1
                owner_by_hash[h] = node
                replicas[node] += 1
        self._points = sorted(owner_by_hash)
        self._owners = [owner_by_hash[h] for h in self._points]

    def __len__(self) -> int:
        return len(self._points)

    def route(self, key: str) -> str | None:
        """``routeNode``: the first ring point at or after the key's hash, wrapping around.

        Java: ``tailMap(hash)`` (keys >= hash), its ``firstKey()``, else ``ring.firstKey()``.
        Returns None on an empty ring (zero virtual nodes).
        """
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, _to_java_long(self._hash(key)))
        return self._owners[i if i < len(self._points) else 0]


class ConsistentHash(AllocateStrategy):
    """``CONSISTENT_HASH``: a queue goes to the consumer owning the next point on an MD5 ring.

    Every consumer id gets ``virtual_node_count`` points (RocketMQ's default is 10); a
    queue hashes by its ``toString()`` (``MessageQueue [topic=..., brokerName=...,
    queueId=...]``). Balance is only statistical, but when a member joins or leaves only
    the queues that must move do move, which keeps ProcessQueues (and their cached
    messages) alive across rebalances.

    ``hash_function`` replaces MD5 as RocketMQ's ``HashFunction`` does: a callable
    ``str -> int`` (or an object with ``.hash(str)``), read as a signed Java ``long``.
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_count: int = 10, hash_function=None):
        if not isinstance(virtual_node_count, int) or isinstance(virtual_node_count, bool):
            raise ValueError(f"virtual_node_count must be an int, got {virtual_node_count!r}")
        if virtual_node_count < 0:
            raise ValueError(f"illegal virtualNodeCnt :{virtual_node_count}")
        if hash_function is not None and not callable(hash_function):
            hash_function = getattr(hash_function, "hash", None)
            if not callable(hash_function):
                raise ValueError("hash_function must be callable or have a .hash(key) method")
        self.virtual_node_count = virtual_node_count
        self.hash_function = hash_function

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mq_all, cid_all = _as_list(mq_all), _as_list(cid_all)
        if not self.check(current_cid, mq_all, cid_all):
            return []
        ring = ConsistentHashRing(cid_all, self.virtual_node_count, self.hash_function or md5_hash)
        return [mq for mq in mq_all if ring.route(str(mq)) == current_cid]


# --------------------------------------------------------------------------- CONFIG


class ByConfig(AllocateStrategy):
    """``CONFIG``: every consumer takes exactly the queues it was configured with.

    No arithmetic and no checks at all (the Java class never calls ``check``): the
    inputs are ignored. Making the group's configured lists disjoint and complete is
    the operator's job; overlaps mean double consumption, gaps mean unconsumed queues.
    """

    name = "CONFIG"

    def __init__(self, message_queues: Iterable[MessageQueue] | None = None):
        self.message_queues = None if message_queues is None else list(message_queues)

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        # Java returns its list itself (null if never set; RebalanceImpl treats null as
        # empty). A copy keeps callers from mutating our configuration.
        return list(self.message_queues or ())


# --------------------------------------------------------------------------- MACHINE_ROOM


def _java_split_at(s: str) -> list[str]:
    """``s.split("@")``: like str.split, but trailing empty strings are dropped."""
    if "@" not in s:
        return [s]  # no match: Java returns the input itself, even ""
    parts = s.split("@")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


class ByMachineRoom(AllocateStrategy):
    """``MACHINE_ROOM``: only queues of brokers named ``ROOM@name`` with ROOM in ``consumer_idcs``.

    The eligible queues (a broker name of exactly two ``@``-separated parts, the first a
    configured room) are split into equal contiguous blocks of ``len // len(cid_all)``,
    and the remainder is dealt out one each to the first consumers. Queues of other
    rooms are nobody's: this strategy is meant for a group per room (Alipay's logical
    rooms), each consuming its own rooms' brokers.
    """

    name = "MACHINE_ROOM"

    def __init__(self, consumer_idcs: Iterable[str] | None = None):
        if isinstance(consumer_idcs, str):
            consumer_idcs = [consumer_idcs]
        self.consumer_idcs = None if consumer_idcs is None else frozenset(consumer_idcs)

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mq_all, cid_all = _as_list(mq_all), _as_list(cid_all)
        # RocketMQ 5.x runs the shared check first (4.x did not: there an empty id list
        # simply gave an empty result).
        if not self.check(current_cid, mq_all, cid_all):
            return []
        current_index = cid_all.index(current_cid)
        eligible = []
        for mq in mq_all:
            parts = _java_split_at(mq.broker_name)
            if len(parts) == 2:
                if self.consumer_idcs is None:  # Java: NullPointerException
                    raise ValueError("MACHINE_ROOM needs consumer_idcs (consumeridcs is null)")
                if parts[0] in self.consumer_idcs:
                    eligible.append(mq)
        n_cid = len(cid_all)
        per_consumer, rem = divmod(len(eligible), n_cid)  # Java's names: mod, rem
        start = per_consumer * current_index
        result = eligible[start:start + per_consumer]
        if rem > current_index:
            # The leftovers sit after all full blocks; consumer i takes the i-th of them.
            result.append(eligible[current_index + per_consumer * n_cid])
        return result


# --------------------------------------------------------------------------- MACHINE_ROOM_NEARBY


class MachineRoomResolver(Protocol):
    def broker_deploy_in(self, mq: MessageQueue) -> str: ...

    def consumer_deploy_in(self, cid: str) -> str: ...


class RoomPrefixResolver:
    """The lab's default resolver: the room is what comes before the first ``@``.

    Broker ``"ROOM@broker-a"`` is in room ``ROOM``, client id ``"ROOM@10.0.0.1@4711"`` is
    in room ``ROOM``. A name without ``@`` is in room ``DEFAULT``, so a lab whose brokers
    carry no room prefix can still switch to ``MACHINE_ROOM_NEARBY`` (it then behaves
    as its inner strategy) instead of failing on RocketMQ's "machine room is null".
    """

    DEFAULT_ROOM = "DEFAULT"

    @classmethod
    def _room(cls, name: str) -> str:
        room, sep, _ = name.partition("@")
        return room if sep and room else cls.DEFAULT_ROOM

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return self._room(mq.broker_name)

    def consumer_deploy_in(self, cid: str) -> str:
        return self._room(cid)


class _CallableResolver:
    def __init__(self, broker_fn, consumer_fn):
        self.broker_deploy_in = broker_fn
        self.consumer_deploy_in = consumer_fn


def _adapt_resolver(resolver) -> MachineRoomResolver:
    """Accept snake_case or Java camelCase methods, or a ``(broker_fn, consumer_fn)`` pair."""
    if resolver is None:
        return RoomPrefixResolver()
    if isinstance(resolver, (tuple, list)) and len(resolver) == 2 and all(map(callable, resolver)):
        return _CallableResolver(*resolver)
    for broker_attr, consumer_attr in (
        ("broker_deploy_in", "consumer_deploy_in"),
        ("brokerDeployIn", "consumerDeployIn"),
    ):
        broker_fn = getattr(resolver, broker_attr, None)
        consumer_fn = getattr(resolver, consumer_attr, None)
        if callable(broker_fn) and callable(consumer_fn):
            return _CallableResolver(broker_fn, consumer_fn)
    raise ValueError(
        "machine_room_resolver needs broker_deploy_in(mq) and consumer_deploy_in(cid) "
        "(or brokerDeployIn/consumerDeployIn, or a pair of callables)"
    )


class MachineRoomNearby(AllocateStrategy):
    """``MACHINE_ROOM_NEARBY``: prefer consumers in the broker's own machine room.

    A proxy around a real strategy (``AVG`` unless told otherwise). Queues and consumers
    are grouped by room (via the resolver). This consumer first gets its share, by the
    inner strategy, of the queues in its own room among the consumers of its room; then,
    for every room (in Java string order: a ``TreeMap``) that has queues but no live
    consumer, its share of those queues among *all* consumers. So cross-room traffic
    happens only when a room has lost all its consumers.

    :attr:`name` is the strategy's name in the lab (``MACHINE_ROOM_NEARBY``, what
    ``get_strategy`` takes); :attr:`java_name` is Java's ``getName()``,
    ``"MACHINE_ROOM_NEARBY-" + inner.getName()``, e.g. ``MACHINE_ROOM_NEARBY-AVG``.
    """

    name = "MACHINE_ROOM_NEARBY"

    def __init__(self, strategy: AllocateStrategy | str | None = None, machine_room_resolver=None, **inner_options):
        if strategy is None:
            strategy = "AVG"
        if isinstance(strategy, str):
            strategy = get_strategy(strategy, **inner_options)
        elif inner_options:
            raise TypeError(f"options {sorted(inner_options)} only apply when the inner strategy is given by name")
        if not callable(getattr(strategy, "allocate", None)):
            raise ValueError(f"inner strategy {strategy!r} has no allocate()")
        self.strategy = strategy
        self.machine_room_resolver = _adapt_resolver(machine_room_resolver)

    @property
    def java_name(self) -> str:
        return f"{self.name}-{getattr(self.strategy, 'name', '')}"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mq_all, cid_all = _as_list(mq_all), _as_list(cid_all)
        if not self.check(current_cid, mq_all, cid_all):
            return []
        resolver = self.machine_room_resolver

        mqs_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mq_all:
            room = resolver.broker_deploy_in(mq)
            if not room:
                raise ValueError(f"Machine room is null for mq {mq}")
            mqs_by_room.setdefault(room, []).append(mq)

        cids_by_room: dict[str, list[str]] = {}
        for cid in cid_all:
            room = resolver.consumer_deploy_in(cid)
            if not room:
                raise ValueError(f"Machine room is null for consumer id {cid}")
            cids_by_room.setdefault(room, []).append(cid)

        result: list[MessageQueue] = []
        # 1. Our own room's queues, shared among our room's consumers.
        my_room = resolver.consumer_deploy_in(current_cid)
        my_room_mqs = mqs_by_room.pop(my_room, None)
        if my_room_mqs:
            result += self.strategy.allocate(consumer_group, current_cid, my_room_mqs, cids_by_room.get(my_room))
        # 2. Queues of rooms without any consumer, shared among everyone. TreeMap order.
        for room in sorted(mqs_by_room, key=java_key):
            if room not in cids_by_room:
                result += self.strategy.allocate(consumer_group, current_cid, mqs_by_room[room], cid_all)
        return result


# --------------------------------------------------------------------------- registry

STRATEGY_NAMES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY")

# option name -> accepted spellings (ours first, then Java-ish aliases)
_OPTIONS = {
    "AVG": {},
    "AVG_BY_CIRCLE": {},
    "CONSISTENT_HASH": {
        "virtual_node_count": ("virtual_node_count", "virtual_node_cnt", "virtualNodeCnt"),
        "hash_function": ("hash_function", "custom_hash_function", "customHashFunction"),
    },
    "CONFIG": {"message_queues": ("message_queues", "message_queue_list", "messageQueueList")},
    "MACHINE_ROOM": {"consumer_idcs": ("consumer_idcs", "consumeridcs")},
    "MACHINE_ROOM_NEARBY": {
        "strategy": ("strategy", "allocate_strategy", "allocate_message_queue_strategy",
                     "allocateMessageQueueStrategy", "inner_strategy"),
        "machine_room_resolver": ("machine_room_resolver", "resolver", "machineRoomResolver"),
    },
}

_CLASSES = {
    "AVG": Averagely,
    "AVG_BY_CIRCLE": AveragelyByCircle,
    "CONSISTENT_HASH": ConsistentHash,
    "CONFIG": ByConfig,
    "MACHINE_ROOM": ByMachineRoom,
    "MACHINE_ROOM_NEARBY": MachineRoomNearby,
}


def get_strategy(name: str, **options) -> AllocateStrategy:
    """Build a strategy from its RocketMQ name (``AVG``, ``CONSISTENT_HASH``, ...).

    ``MACHINE_ROOM_NEARBY-<INNER>`` (what that strategy's ``name`` reads) is accepted
    too and means ``MACHINE_ROOM_NEARBY`` with ``strategy=<INNER>``. For
    ``MACHINE_ROOM_NEARBY`` with the inner strategy given by name, options this
    strategy does not know go to the inner one (e.g. ``virtual_node_count``).
    Unknown names raise ValueError; unknown options raise TypeError.
    """
    key = name.strip().upper() if isinstance(name, str) else name
    if isinstance(key, str) and key.startswith("MACHINE_ROOM_NEARBY-"):
        if not any(s in options for s in _OPTIONS["MACHINE_ROOM_NEARBY"]["strategy"]):
            options["strategy"] = key[len("MACHINE_ROOM_NEARBY-"):]
        key = "MACHINE_ROOM_NEARBY"
    if key not in _CLASSES:
        raise ValueError(f"unknown allocation strategy {name!r}; valid: {', '.join(STRATEGY_NAMES)}")

    kwargs = {}
    for canonical, spellings in _OPTIONS[key].items():
        given = [s for s in spellings if s in options]
        if len(given) > 1:
            raise TypeError(f"{key}: {' and '.join(given)} are the same option")
        if given:
            kwargs[canonical] = options.pop(given[0])
    if options and key == "MACHINE_ROOM_NEARBY":
        kwargs.update(options)  # forwarded to the inner strategy
    elif options:
        known = [s for spellings in _OPTIONS[key].values() for s in spellings]
        raise TypeError(f"{key} has no option(s) {sorted(options)}; it takes {known or 'none'}")
    return _CLASSES[key](**kwargs)
