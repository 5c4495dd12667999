"""The allocation strategies against Apache RocketMQ's Java behaviour.

Expected values come from three places: RocketMQ's own unit tests under
client/src/test/java/org/apache/rocketmq/client/consumer/rebalance/ (ported below, named
after them), hand computation of the Java algorithm (the hash ring is rebuilt here with
hashlib, independently of the module), and results pinned from the Java algorithm.
"""
import hashlib
import string
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers_app import message_queue
from consumers_app.allocate import (
    STRATEGY_NAMES,
    ConsistentHash,
    MachineRoomNearby,
    MessageQueue,
    RoomPrefixResolver,
    get_strategy,
    md5_hash,
    sort_for_allocation,
)

GROUP = "test-group"


def queues(n, topic="TopicTest", broker="broker-a"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


def ids(mqs):
    return [mq.queue_id for mq in mqs]


def allocate_all(strategy, mq_all, cid_all):
    """Every member of the group allocating on the same lists: cid -> its queues."""
    return {cid: strategy.allocate(GROUP, cid, mq_all, cid_all) for cid in cid_all}


def owners(allocation):
    """queue -> list of consumers that took it."""
    result = {}
    for cid, mqs in allocation.items():
        for mq in mqs:
            result.setdefault(mq, []).append(cid)
    return result


def assert_partition(allocation, mq_all):
    taken = owners(allocation)
    assert set(taken) == set(mq_all), "some queue has no owner"
    assert all(len(cids) == 1 for cids in taken.values()), f"shared queues: {taken}"


# --------------------------------------------------------------------------- names and registry


def test_message_queue_is_reexported():
    assert MessageQueue is message_queue.MessageQueue


@pytest.mark.parametrize(
    "name, options",
    [
        ("AVG", {}),
        ("AVG_BY_CIRCLE", {}),
        ("CONSISTENT_HASH", {}),
        ("CONFIG", {"message_queues": queues(2)}),
        ("MACHINE_ROOM", {"consumer_idcs": {"room1"}}),
    ],
)
def test_names_are_rocketmq_get_name(name, options):
    assert get_strategy(name, **options).name == name


def test_machine_room_nearby_java_name_carries_the_inner_strategy():
    # AllocateMachineRoomNearby.getName() = "MACHINE_ROOM_NEARBY" + "-" + inner.getName()
    s = get_strategy("MACHINE_ROOM_NEARBY")
    assert s.name == "MACHINE_ROOM_NEARBY" and s.java_name == "MACHINE_ROOM_NEARBY-AVG"
    assert get_strategy("MACHINE_ROOM_NEARBY", strategy="AVG_BY_CIRCLE").java_name == "MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE"
    assert get_strategy("MACHINE_ROOM_NEARBY", allocate_strategy=ConsistentHash(3)).java_name == (
        "MACHINE_ROOM_NEARBY-CONSISTENT_HASH"
    )
    # ... and that name builds the same thing again.
    again = get_strategy("MACHINE_ROOM_NEARBY-CONSISTENT_HASH", virtual_node_count=4)
    assert again.strategy.name == "CONSISTENT_HASH" and again.strategy.virtual_node_count == 4


def test_all_names_are_known():
    assert STRATEGY_NAMES == ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY")
    for name in STRATEGY_NAMES:
        assert get_strategy(name).name.startswith(name)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        get_strategy("ROUND_ROBIN")
    for name in STRATEGY_NAMES:
        assert name in str(info.value)


def test_unknown_option_is_refused():
    with pytest.raises(TypeError):
        get_strategy("AVG", virtual_node_count=3)
    with pytest.raises(TypeError):
        get_strategy("CONSISTENT_HASH", virtual_nodes=3)


def test_consistent_hash_defaults_to_ten_virtual_nodes_and_refuses_negative():
    assert get_strategy("CONSISTENT_HASH").virtual_node_count == 10
    assert get_strategy("CONSISTENT_HASH", virtual_node_count=3).virtual_node_count == 3
    with pytest.raises(ValueError):
        get_strategy("CONSISTENT_HASH", virtual_node_count=-1)


# --------------------------------------------------------------------------- the documented example


def test_avg_eight_queues_three_consumers_contiguous_blocks():
    # The seeds' comment in RebalanceImpl: 8 queues, 3 consumers -> c1: q1-q3, c2: q4-q6, c3: q7-q8.
    mqs, cids = queues(8), ["c1", "c2", "c3"]
    got = allocate_all(get_strategy("AVG"), mqs, cids)
    assert got == {"c1": mqs[0:3], "c2": mqs[3:6], "c3": mqs[6:8]}


def test_avg_by_circle_eight_queues_three_consumers_round_robin():
    mqs, cids = queues(8), ["c1", "c2", "c3"]
    got = allocate_all(get_strategy("AVG_BY_CIRCLE"), mqs, cids)
    assert {cid: ids(v) for cid, v in got.items()} == {"c1": [0, 3, 6], "c2": [1, 4, 7], "c3": [2, 5]}


def test_avg_with_more_consumers_than_queues_leaves_the_last_ones_idle():
    mqs, cids = queues(3), ["c0", "c1", "c2", "c3", "c4"]
    got = allocate_all(get_strategy("AVG"), mqs, cids)
    assert [ids(got[c]) for c in cids] == [[0], [1], [2], [], []]
    got = allocate_all(get_strategy("AVG_BY_CIRCLE"), mqs, cids)
    assert [ids(got[c]) for c in cids] == [[0], [1], [2], [], []]


# --------------------------------------------------------------------------- ports of RocketMQ's Java tests


def java_cids(n, prefix="CID_PREFIX"):
    return [f"{prefix}{i}" for i in range(n)]


def test_java_AllocateMessageQueueAveragelyTest():
    mqs, cids = queues(10, "topic", "brokerName"), java_cids(4)
    got = allocate_all(get_strategy("AVG"), mqs, cids)
    assert [len(got[c]) for c in cids] == [3, 3, 2, 2]
    assert [ids(got[c]) for c in cids] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_java_AllocateMessageQueueAveragelyByCircleTest():
    mqs, cids = queues(10, "topic", "brokerName"), java_cids(4)
    strategy = get_strategy("AVG_BY_CIRCLE")
    assert strategy.allocate("", "CID_PREFIX", mqs, cids) == []
    got = allocate_all(strategy, mqs, cids)
    assert [ids(got[c]) for c in cids] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


def test_java_AllocateMessageQueueByConfigTest():
    mqs, cids = queues(4, "topic", "brokerName"), java_cids(2)
    got = allocate_all(get_strategy("CONFIG", message_queues=mqs), mqs, cids)
    assert [ids(got[c]) for c in cids] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_java_AllocateMessageQueueByMachineRoomTest():
    cids = java_cids(2)
    mqs = [MessageQueue("topic", "room1@broker-a" if i < 5 else "room2@broker-b", i) for i in range(10)]
    strategy = get_strategy("MACHINE_ROOM", consumer_idcs={"room1"})
    with pytest.raises(ValueError, match="mqAll is null or mqAll empty"):
        strategy.allocate("", cids[0], [], cids)
    got = allocate_all(strategy, mqs, cids)
    # 5 eligible queues, 2 consumers: blocks of 2, the leftover q4 goes to the first.
    assert ids(got["CID_PREFIX0"]) == [0, 1, 4]
    assert ids(got["CID_PREFIX1"]) == [2, 3]


class DashResolver:
    """The resolver of AllocateMachineRoomNearByTest: the room is the part before the first '-'."""

    def broker_deploy_in(self, mq):
        return mq.broker_name.split("-")[0]

    def consumer_deploy_in(self, cid):
        return cid.split("-")[0]


def nearby_fixture(broker_idcs, consumer_idcs, queue_size, consumer_size):
    mqs = [
        MessageQueue("topic_test", f"IDC{i}-brokerName", q)
        for i in range(1, broker_idcs + 1)
        for q in range(queue_size)
    ]
    cids = [f"IDC{i}-CID-{c}" for i in range(1, consumer_idcs + 1) for c in range(consumer_size)]
    return mqs, cids


@pytest.mark.parametrize("consumer_size", [10, 20, 30])
def test_java_AllocateMachineRoomNearByTest_same_rooms(consumer_size):
    # testWhenIDCSizeEquals(5, 20, n): every queue stays in its room.
    mqs, cids = nearby_fixture(5, 5, 20, consumer_size)
    resolver = DashResolver()
    got = allocate_all(MachineRoomNearby("AVG", resolver), mqs, cids)
    assert_partition(got, mqs)
    for cid, mine in got.items():
        assert all(resolver.broker_deploy_in(mq) == resolver.consumer_deploy_in(cid) for mq in mine)


@pytest.mark.parametrize("consumer_size", [10, 5, 20])
def test_java_AllocateMachineRoomNearByTest_more_consumer_rooms(consumer_size):
    # testWhenConsumerIDCIsMore(5, 1, 10, n): a consumer room without brokers takes nothing.
    mqs, cids = nearby_fixture(5, 6, 10, consumer_size)
    resolver = DashResolver()
    got = allocate_all(MachineRoomNearby("AVG", resolver), mqs, cids)
    assert_partition(got, mqs)
    for cid, mine in got.items():
        assert all(resolver.broker_deploy_in(mq) == resolver.consumer_deploy_in(cid) for mq in mine)
    assert all(got[c] == [] for c in cids if c.startswith("IDC6-"))


@pytest.mark.parametrize("consumer_size", [10, 5, 20])
def test_java_AllocateMachineRoomNearByTest_fewer_consumer_rooms(consumer_size):
    # testWhenConsumerIDCIsLess(5, 2, 10, n): rooms 4 and 5 have no consumer, everyone shares them.
    mqs, cids = nearby_fixture(5, 3, 10, consumer_size)
    resolver = DashResolver()
    got = allocate_all(MachineRoomNearby("AVG", resolver), mqs, cids)
    assert_partition(got, mqs)
    for room in ("IDC1", "IDC2", "IDC3"):
        room_got = [mq for c in cids if c.startswith(room + "-") for mq in got[c]]
        assert {mq for mq in mqs if mq.broker_name.startswith(room + "-")} <= set(room_got)


def test_java_AllocateMessageQueueConsistentHashTest_bad_input():
    cids = ["CID-0", "CID-1"]
    mqs = queues(6, "topic_test", "brokerName")
    strategy = ConsistentHash()
    assert strategy.allocate("", str(2**31 - 1), mqs, cids) == []
    with pytest.raises(ValueError):
        strategy.allocate("", "", mqs, cids)
    with pytest.raises(ValueError):
        strategy.allocate("", "0", None, cids)
    with pytest.raises(ValueError):
        strategy.allocate("", "0", mqs, None)


@pytest.mark.parametrize("queue_size, consumer_size", [(20, 10), (10, 20), (7, 3), (1, 1)])
def test_java_AllocateMessageQueueConsistentHashTest_allocate(queue_size, consumer_size):
    # testAllocate: 3 virtual nodes; remove CID-0, then add CID-NEW; only what must move moves.
    strategy = ConsistentHash(3)
    mqs = queues(queue_size, "topic_test", "brokerName")
    cids = [f"CID-{i}" for i in range(consumer_size)]
    before = allocate_all(strategy, mqs, cids)
    assert_partition(before, mqs)
    owner_before = {mq: c[0] for mq, c in owners(before).items()}

    after_leave_cids = cids[1:]
    if after_leave_cids:
        after = allocate_all(strategy, mqs, after_leave_cids)
        assert_partition(after, mqs)
        owner_after = {mq: c[0] for mq, c in owners(after).items()}
        assert all(owner_after[mq] == o for mq, o in owner_before.items() if o != "CID-0")
    else:
        owner_after = {}

    joined_cids = after_leave_cids + ["CID-NEW"]
    joined = allocate_all(strategy, mqs, joined_cids)
    assert_partition(joined, mqs)
    for mq, (o,) in owners(joined).items():
        if o != "CID-NEW" and owner_after:
            assert owner_after[mq] == o


# --------------------------------------------------------------------------- consistent hash: known answers


def by_hand_md5(key: str) -> int:
    # Java: h = 0; for i in 0..3: h <<= 8; h |= digest[i] & 0xFF  ->  first 4 bytes, big-endian, unsigned.
    digest = hashlib.md5(key.encode("utf-8")).digest()
    h = 0
    for b in digest[:4]:
        h = (h << 8) | b
    return h


def by_hand_ring_owner(cids, vnodes, key):
    ring = {}
    for cid in cids:
        for i in range(vnodes):
            ring[by_hand_md5(f"{cid}-{i}")] = cid  # TreeMap.put: a later equal key replaces
    points = sorted(ring)
    i = bisect_left(points, by_hand_md5(key))  # tailMap(h).firstKey(), else firstKey()
    return ring[points[i % len(points)]]


def test_md5_hash_matches_java_md5hash():
    for key in ["CID-0-0", "c0-9", "MessageQueue [topic=TopicTest, brokerName=broker-a, queueId=0]", "中-é-\U0001F600"]:
        assert md5_hash(key) == by_hand_md5(key)
        assert 0 <= md5_hash(key) < 2**32  # a long built from 4 bytes is never negative
    # Values printed by Java's MD5Hash (JDK 17, UTF-8):
    assert md5_hash("CID-0-0") == 1900518137
    assert md5_hash("MessageQueue [topic=topic_test, brokerName=brokerName, queueId=0]") == 2171879703
    assert md5_hash("\U0001F600-0") == 1552967531
    # String.getBytes() writes an unpaired surrogate as '?'.
    assert md5_hash("a\ud800b") == md5_hash("a?b") == 23517257


def test_queue_key_is_java_message_queue_to_string():
    assert str(MessageQueue("t", "b", 3)) == "MessageQueue [topic=t, brokerName=b, queueId=3]"


@pytest.mark.parametrize("vnodes", [1, 3, 10])
def test_consistent_hash_matches_ring_computed_by_hand(vnodes):
    mqs = queues(4, "TopicTest", "broker-a") + queues(4, "TopicTest", "broker-b")
    cids = ["c0", "c1", "c10", "c2"]
    got = allocate_all(ConsistentHash(vnodes), mqs, cids)
    for mq in mqs:
        assert got[by_hand_ring_owner(cids, vnodes, str(mq))].count(mq) == 1


def test_consistent_hash_pinned_java_results():
    # From the Java algorithm: topic_test/brokerName queues 0..9, CID-0..CID-3.
    mqs, cids = queues(10, "topic_test", "brokerName"), [f"CID-{i}" for i in range(4)]
    got = allocate_all(ConsistentHash(3), mqs, cids)
    assert [ids(got[c]) for c in cids] == [[3, 5, 8], [2], [4], [0, 1, 6, 7, 9]]
    got = allocate_all(ConsistentHash(), mqs, cids)
    assert [ids(got[c]) for c in cids] == [[1], [], [0, 3, 4, 5, 8], [2, 6, 7, 9]]
    # The lab's default topic: 8 queues over broker-a and broker-b.
    lab = queues(4, "TopicTest", "broker-a") + queues(4, "TopicTest", "broker-b")
    got = allocate_all(ConsistentHash(), lab, ["c0", "c1", "c2"])
    assert [got[c] for c in ["c0", "c1", "c2"]] == [[lab[1], lab[4]], [lab[0], lab[3], lab[6], lab[7]], [lab[2], lab[5]]]
    got = allocate_all(ConsistentHash(), lab, ["c0", "c1", "c10", "c2"])
    assert [got[c] for c in ["c0", "c1", "c10", "c2"]] == [[lab[1], lab[4]], [lab[0], lab[7]], [lab[3], lab[5], lab[6]], [lab[2]]]


def test_consistent_hash_zero_virtual_nodes_allocates_nothing():
    mqs, cids = queues(4), ["c0", "c1"]
    assert allocate_all(ConsistentHash(0), mqs, cids) == {"c0": [], "c1": []}


def test_consistent_hash_custom_hash_function_and_collisions():
    mqs, cids = queues(4), ["c0", "c1", "c2"]
    # Every virtual node lands on 0: TreeMap.put keeps the last one written, so the last id owns the ring.
    got = allocate_all(get_strategy("CONSISTENT_HASH", hash_function=lambda key: 0), mqs, cids)
    assert got == {"c0": [], "c1": [], "c2": mqs}

    class JavaStyleHash:  # RocketMQ's HashFunction interface: long hash(String key)
        def hash(self, key):
            return -md5_hash(key)

    got = allocate_all(get_strategy("CONSISTENT_HASH", customHashFunction=JavaStyleHash()), mqs, cids)
    assert_partition(got, mqs)


def test_consistent_hash_key_equal_to_a_point_routes_to_that_point():
    # tailMap(h) includes h itself: a queue hashing exactly onto c0's point is c0's.
    mq = queues(1)[0]
    table = {"c0-0": 10, "c1-0": 20, str(mq): 10}
    strategy = ConsistentHash(1, table.__getitem__)
    assert strategy.allocate(GROUP, "c0", [mq], ["c0", "c1"]) == [mq]
    table[str(mq)] = 21  # past the last point: wrap around to the first
    assert strategy.allocate(GROUP, "c0", [mq], ["c0", "c1"]) == [mq]


def test_consistent_hash_replica_numbering_after_a_collision():
    # c1-0 overwrites c0-0's point, so when c0 is listed again it has no replica left on the
    # ring (getExistingReplicas counts ring values) and numbers from 0 again.
    seen = []
    table = {"c0-0": 5, "c1-0": 5}

    def colliding(key):
        seen.append(key)
        return table.get(key, 7)

    ConsistentHash(1, colliding).allocate(GROUP, "c0", queues(1), ["c0", "c1", "c0"])
    assert seen[:3] == ["c0-0", "c1-0", "c0-0"]


def test_consistent_hash_virtual_node_keys_and_duplicate_ids():
    seen = []

    def recording(key):
        seen.append(key)
        return md5_hash(key)

    # A listed-twice id adds replicas numbered after its existing ones (getExistingReplicas).
    ConsistentHash(3, recording).allocate(GROUP, "c0", queues(1), ["c0", "c1", "c0"])
    assert seen == ["c0-0", "c0-1", "c0-2", "c1-0", "c1-1", "c1-2", "c0-3", "c0-4", "c0-5", str(queues(1)[0])]


# --------------------------------------------------------------------------- Java string ordering


def test_sort_for_allocation_sorts_ids_as_strings():
    mqs = [MessageQueue("T", "broker-b", 0), MessageQueue("T", "broker-a", 10), MessageQueue("T", "broker-a", 2)]
    mq_sorted, cid_sorted = sort_for_allocation(mqs, ["c2", "c10", "c1"])
    assert cid_sorted == ["c1", "c10", "c2"]
    assert mq_sorted == [MessageQueue("T", "broker-a", 2), MessageQueue("T", "broker-a", 10), MessageQueue("T", "broker-b", 0)]
    # c10 sorts before c2, so with AVG it takes the second block.
    got = allocate_all(get_strategy("AVG"), queues(6), cid_sorted)
    assert ids(got["c10"]) == [2, 3] and ids(got["c2"]) == [4, 5]


def test_sort_for_allocation_uses_utf16_code_units():
    astral, replacement = "\U0001F600", "\uFFFD"
    # Java compares UTF-16 code units: the surrogate 0xD83D comes before 0xFFFD; Python says otherwise.
    assert sorted([replacement, astral]) == [replacement, astral]
    _, cid_sorted = sort_for_allocation([], [replacement, astral])
    assert cid_sorted == [astral, replacement]
    mq_sorted, _ = sort_for_allocation([MessageQueue(replacement, "b", 0), MessageQueue(astral, "b", 0)], [])
    assert [mq.topic for mq in mq_sorted] == [astral, replacement]


def test_nearby_walks_rooms_in_java_string_order():
    # One consumer in room A; rooms \uFFFD and U+1F600 have queues but no consumer, so the
    # consumer takes both, room by room in TreeMap (Java String) order.
    astral, replacement = "\U0001F600", "\uFFFD"
    mqs = [MessageQueue("T", f"{replacement}@b", 0), MessageQueue("T", f"{astral}@b", 0), MessageQueue("T", "A@b", 0)]
    got = get_strategy("MACHINE_ROOM_NEARBY").allocate(GROUP, "A@10.0.0.1@1", mqs, ["A@10.0.0.1@1"])
    assert got == [mqs[2], mqs[1], mqs[0]]


# --------------------------------------------------------------------------- machine rooms


def test_machine_room_broker_names_split_like_java():
    # String.split("@") drops trailing empty strings: "r1@b@" has two parts, "r1@@x" three.
    names = ["r1@b", "r1@b@", "r1@@x", "@b", "r1", "r2@b"]
    mqs = [MessageQueue("T", name, 0) for name in names]
    got = get_strategy("MACHINE_ROOM", consumer_idcs=["r1", ""]).allocate(GROUP, "c0", mqs, ["c0"])
    assert [mq.broker_name for mq in got] == ["r1@b", "r1@b@", "@b"]


def test_machine_room_without_configured_rooms():
    mqs = [MessageQueue("T", "r1@b", 0)]
    with pytest.raises(ValueError):  # Java: NullPointerException on consumeridcs
        get_strategy("MACHINE_ROOM").allocate(GROUP, "c0", mqs, ["c0"])
    assert get_strategy("MACHINE_ROOM").allocate(GROUP, "c0", queues(2), ["c0"]) == []


def test_nearby_default_resolver_and_resolver_forms():
    resolver = RoomPrefixResolver()
    assert resolver.broker_deploy_in(MessageQueue("T", "ROOM@broker-a", 0)) == "ROOM"
    assert resolver.consumer_deploy_in("ROOM@10.0.0.1@4711") == "ROOM"
    assert resolver.consumer_deploy_in("10.0.0.1") == "DEFAULT"

    mqs = [MessageQueue("T", "east@a", i) for i in range(2)] + [MessageQueue("T", "west@b", i) for i in range(2)]
    cids = ["east@c1", "west@c2"]
    expected = {"east@c1": mqs[:2], "west@c2": mqs[2:]}
    assert allocate_all(get_strategy("MACHINE_ROOM_NEARBY"), mqs, cids) == expected

    class Camel:
        def brokerDeployIn(self, mq):
            return mq.broker_name.split("@")[0]

        def consumerDeployIn(self, cid):
            return cid.split("@")[0]

    for resolver in (Camel(), (Camel().brokerDeployIn, Camel().consumerDeployIn)):
        strategy = get_strategy("MACHINE_ROOM_NEARBY", strategy="AVG_BY_CIRCLE", machine_room_resolver=resolver)
        assert allocate_all(strategy, mqs, cids) == expected
    with pytest.raises(ValueError):
        get_strategy("MACHINE_ROOM_NEARBY", machine_room_resolver=object())


def test_nearby_refuses_queues_or_consumers_without_a_room():
    # Java throws when the resolver answers an empty room.
    no_room = (lambda mq: mq.broker_name.partition("@")[0] if "@" in mq.broker_name else "",
               lambda cid: cid.partition("@")[0] if "@" in cid else "")
    strategy = get_strategy("MACHINE_ROOM_NEARBY", machine_room_resolver=no_room)
    with pytest.raises(ValueError, match="Machine room is null for mq"):
        strategy.allocate(GROUP, "A@c", [MessageQueue("T", "broker-a", 0)], ["A@c"])
    with pytest.raises(ValueError, match="Machine room is null for consumer id"):
        strategy.allocate(GROUP, "A@c", [MessageQueue("T", "A@b", 0)], ["A@c", "nobody"])


def test_nearby_default_resolver_puts_unprefixed_names_in_one_room():
    # The lab's default scenario (broker-a, broker-b, plain client ids) can switch to
    # MACHINE_ROOM_NEARBY: everything is in room DEFAULT, so it allocates as its inner AVG.
    mqs = [MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(4)]
    cids = ["c1", "c2", "c3"]
    assert allocate_all(get_strategy("MACHINE_ROOM_NEARBY"), mqs, cids) == allocate_all(get_strategy("AVG"), mqs, cids)


# --------------------------------------------------------------------------- bad input

CHECKED = [
    lambda: get_strategy("AVG"),
    lambda: get_strategy("AVG_BY_CIRCLE"),
    lambda: get_strategy("CONSISTENT_HASH"),
    lambda: get_strategy("MACHINE_ROOM", consumer_idcs={"A"}),
    lambda: get_strategy("MACHINE_ROOM_NEARBY"),
]
GOOD_MQS = [MessageQueue("T", "A@b", 0), MessageQueue("T", "A@b", 1)]


@pytest.mark.parametrize("make", CHECKED)
@pytest.mark.parametrize(
    "current, mq_all, cid_all, message",
    [
        ("", GOOD_MQS, ["A@c"], "currentCID is empty"),
        (None, GOOD_MQS, ["A@c"], "currentCID is empty"),
        ("", [], [], "currentCID is empty"),  # the checks run in this order
        ("A@c", [], ["A@c"], "mqAll is null or mqAll empty"),
        ("A@c", None, ["A@c"], "mqAll is null or mqAll empty"),
        ("A@c", GOOD_MQS, [], "cidAll is null or cidAll empty"),
        ("A@c", GOOD_MQS, None, "cidAll is null or cidAll empty"),
    ],
)
def test_bad_input_raises_like_illegal_argument_exception(make, current, mq_all, cid_all, message):
    with pytest.raises(ValueError, match=message):
        make().allocate(GROUP, current, mq_all, cid_all)


@pytest.mark.parametrize("make", CHECKED)
def test_consumer_not_in_group_gets_nothing(make):
    assert make().allocate(GROUP, "A@stranger", GOOD_MQS, ["A@c1", "A@c2"]) == []


def test_config_ignores_its_inputs_entirely():
    configured = queues(2)
    strategy = get_strategy("CONFIG", message_queues=configured)
    assert strategy.allocate(None, None, None, None) == configured
    assert strategy.allocate(GROUP, "stranger", [], ["c0"]) == configured
    assert get_strategy("CONFIG").allocate(GROUP, "c0", queues(2), ["c0"]) == []  # Java: null


def test_strategies_do_not_sort_their_inputs():
    mqs = list(reversed(queues(4)))
    got = get_strategy("AVG").allocate(GROUP, "b", mqs, ["b", "a"])
    assert ids(got) == [3, 2]


# --------------------------------------------------------------------------- properties

ROOMS = ["A", "B", "\uFFFD", "\U0001F600"]
ID_CHARS = string.ascii_lowercase[:3] + string.digits[:3] + "é\uFFFD\U0001F600"

mq_lists = st.sets(
    st.builds(
        MessageQueue,
        topic=st.sampled_from(["TopicTest", "t\U0001F600"]),
        broker_name=st.builds(lambda r, b: f"{r}@{b}", st.sampled_from(ROOMS), st.sampled_from(["broker-a", "broker-b"])),
        queue_id=st.integers(0, 15),
    ),
    min_size=1,
    max_size=40,
)
cid_lists = st.sets(st.text(ID_CHARS, min_size=1, max_size=4), min_size=1, max_size=12)
roomed_cid_lists = st.sets(
    st.builds(lambda r, s: f"{r}@{s}", st.sampled_from(ROOMS), st.text(ID_CHARS, min_size=1, max_size=3)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(mq_set=mq_lists, cid_set=cid_lists, name=st.sampled_from(["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]))
def test_property_every_queue_has_exactly_one_owner(mq_set, cid_set, name):
    mq_all, cid_all = sort_for_allocation(mq_set, cid_set)
    assert_partition(allocate_all(get_strategy(name), mq_all, cid_all), mq_all)


@settings(max_examples=60, deadline=None)
@given(mq_set=mq_lists, cid_set=cid_lists, data=st.data())
def test_property_config_with_disjoint_lists(mq_set, cid_set, data):
    mq_all, cid_all = sort_for_allocation(mq_set, cid_set)
    owner = {mq: data.draw(st.sampled_from(cid_all)) for mq in mq_all}
    allocation = {
        cid: get_strategy("CONFIG", message_queues=[mq for mq in mq_all if owner[mq] == cid]).allocate(
            GROUP, cid, mq_all, cid_all
        )
        for cid in cid_all
    }
    assert_partition(allocation, mq_all)


@settings(max_examples=60, deadline=None)
@given(mq_set=mq_lists, cid_set=cid_lists)
def test_property_machine_room_with_all_rooms_configured(mq_set, cid_set):
    mq_all, cid_all = sort_for_allocation(mq_set, cid_set)
    strategy = get_strategy("MACHINE_ROOM", consumer_idcs=ROOMS)
    allocation = allocate_all(strategy, mq_all, cid_all)
    assert_partition(allocation, mq_all)
    # Blocks differ in size by at most one.
    sizes = [len(v) for v in allocation.values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(
    mq_set=mq_lists,
    cid_set=roomed_cid_lists,
    inner=st.sampled_from(["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]),
)
def test_property_machine_room_nearby(mq_set, cid_set, inner):
    mq_all, cid_all = sort_for_allocation(mq_set, cid_set)
    strategy = get_strategy("MACHINE_ROOM_NEARBY", strategy=inner)
    allocation = allocate_all(strategy, mq_all, cid_all)
    assert_partition(allocation, mq_all)
    consumer_rooms = {cid.split("@")[0] for cid in cid_all}
    for cid, mine in allocation.items():
        for mq in mine:
            room = mq.broker_name.split("@")[0]
            # A queue leaves its room only when the room has no consumer at all.
            assert room == cid.split("@")[0] or room not in consumer_rooms


@settings(max_examples=60, deadline=None)
@given(mq_set=mq_lists, cid_set=cid_lists, data=st.data(), vnodes=st.integers(1, 12))
def test_property_consistent_hash_moves_only_what_it_must(mq_set, cid_set, data, vnodes):
    strategy = ConsistentHash(vnodes)
    mq_all, cid_all = sort_for_allocation(mq_set, cid_set)
    before = {mq: c[0] for mq, c in owners(allocate_all(strategy, mq_all, cid_all)).items()}

    # A member leaves: only its queues move.
    if len(cid_all) > 1:
        leaver = data.draw(st.sampled_from(cid_all))
        rest = [c for c in cid_all if c != leaver]
        after = {mq: c[0] for mq, c in owners(allocate_all(strategy, mq_all, rest)).items()}
        assert all(after[mq] == o for mq, o in before.items() if o != leaver)

    # A member joins: queues either stay or go to the joiner.
    joiner = data.draw(st.text(ID_CHARS, min_size=1, max_size=5).filter(lambda c: c not in cid_all))
    _, joined_cids = sort_for_allocation([], cid_all + [joiner])
    after = {mq: c[0] for mq, c in owners(allocate_all(strategy, mq_all, joined_cids)).items()}
    assert all(after[mq] in (before[mq], joiner) for mq in mq_all)
