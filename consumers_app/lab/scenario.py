"""What the lab runs at start-up (DESIGN.md, "What a user can do" 1).

A scenario is plain data; ``LabController.run_scenario`` turns it into topics on the
broker, producers and consumer groups through the same code paths as the actions. The
lab's current state is a scenario too (``LabController.desired_scenario``): runlab saves
it in the database and starts from it next time (consumers_app/lab/persistence.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ConsumerFaults:
    """The lab's knobs on one consumer, re-applied when a saved lab starts again."""
    slow_ms: float = 0
    fail_ratio: float = 0.0
    hung: bool = False

    @property
    def any(self) -> bool:
        return bool(self.slow_ms or self.fail_ratio or self.hung)


@dataclass(frozen=True)
class GroupSpec:
    name: str
    topic: str
    mode: str = "push"
    strategy: str = "AVG"
    consumers: int = 3
    faults: tuple[ConsumerFaults, ...] = ()    # per consumer, in start order; missing: none
    peers: tuple[str, ...] = ()                # other people's consumers (lab/peers.py): a kind name each


@dataclass(frozen=True)
class Scenario:
    # topic -> {logical broker name: queue count}
    topics: dict[str, dict[str, int]] = field(default_factory=dict)
    # topic -> messages per second
    producers: dict[str, float] = field(default_factory=dict)
    groups: tuple[GroupSpec, ...] = ()
    offline_brokers: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Scenario":
        groups = tuple(
            GroupSpec(**{**g, "faults": tuple(ConsumerFaults(**f) for f in g.get("faults", ())),
                         "peers": tuple(str(p) for p in g.get("peers", ()))})
            for g in data.get("groups", ()))
        return cls(topics={t: dict(b) for t, b in data.get("topics", {}).items()},
                   producers=dict(data.get("producers", {})), groups=groups,
                   offline_brokers=tuple(data.get("offline_brokers", ())))


DEFAULT = Scenario(
    topics={"TopicTest": {"broker-a": 4, "broker-b": 4}},
    producers={"TopicTest": 200},
    groups=(GroupSpec("GID_LAB", "TopicTest", mode="push", strategy="AVG", consumers=3),),
)


def on_cluster(brokers: list[str], topic: str | None = None) -> Scenario:
    """The default scenario on a cluster the lab did not start (``runlab --namesrv``): on
    ``topic`` if given (an existing topic, never created or resized), else TopicTest with
    the default's 8 queues created on the cluster's first two brokers (all 8 on one)."""
    if topic is not None:
        return Scenario(producers={topic: 200}, groups=(GroupSpec("GID_LAB", topic, mode="push", strategy="AVG",
                                                                  consumers=3),))
    first = brokers[:2]
    per_broker = 8 // len(first)
    return Scenario(topics={"TopicTest": {b: per_broker for b in first}}, producers=DEFAULT.producers,
                    groups=DEFAULT.groups)
