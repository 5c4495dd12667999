"""What the lab runs at start-up (DESIGN.md, "What a user can do" 1).

A scenario is plain data; ``LabController.run_scenario`` turns it into topics on the
broker, producers and consumer groups through the same code paths as the actions.
"""
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupSpec:
    name: str
    topic: str
    mode: str = "push"
    strategy: str = "AVG"
    consumers: int = 3


@dataclass(frozen=True)
class Scenario:
    # topic -> {logical broker name: queue count}
    topics: dict[str, dict[str, int]] = field(default_factory=dict)
    # topic -> messages per second
    producers: dict[str, float] = field(default_factory=dict)
    groups: tuple[GroupSpec, ...] = ()


DEFAULT = Scenario(
    topics={"TopicTest": {"broker-a": 4, "broker-b": 4}},
    producers={"TopicTest": 200},
    groups=(GroupSpec("GID_LAB", "TopicTest", mode="push", strategy="AVG", consumers=3),),
)
