"""SubscriptionData as a Java consumer holds and sends it (heartbeats, running info).

FilterAPI.buildSubscriptionData: ``"*"`` (or an empty expression) subscribes to every
tag and leaves ``tagsSet``/``codeSet`` empty; otherwise the expression is split on
``||``, each tag trimmed, and ``codeSet`` holds each tag's ``String.hashCode()`` - what a
5.3 broker filters pulls by. ``subVersion`` is the time the subscription was built
(``System.currentTimeMillis()``), so it changes only when the consumer subscribes anew:
a broker replaces a group's subscription only when a heartbeat brings a newer version.
"""
from __future__ import annotations

import time

from ..javastr import java_hash

SUB_ALL = "*"


def tags_of(expression: str | None) -> list[str]:
    """The tags of a TAG expression in their order; [] for ``*``."""
    if not expression or expression == SUB_ALL:
        return []
    tags: list[str] = []
    for tag in expression.split("||"):
        tag = tag.strip()
        if tag and tag not in tags:
            tags.append(tag)
    return tags


def subscription_data(topic: str, expression: str | None, sub_version: int) -> dict:
    """One SubscriptionData in Java's JSON field names."""
    tags = tags_of(expression)
    return {"classFilterMode": False, "topic": topic,
            "subString": SUB_ALL if not expression or expression == SUB_ALL else expression,
            "tagsSet": tags, "codeSet": sorted({java_hash(t) for t in tags}),
            "subVersion": sub_version, "expressionType": "TAG"}


class SubscriptionVersions:
    """Each topic's subVersion: stamped when its expression is first seen or changes."""

    def __init__(self):
        self._seen: dict[str, tuple[str, int]] = {}   # topic -> (expression, subVersion)

    def version(self, topic: str, expression: str | None) -> int:
        expression = expression or SUB_ALL
        seen = self._seen.get(topic)
        if seen is None or seen[0] != expression:
            # Strictly newer than the last one, even within the same millisecond.
            stamp = max(time.time_ns() // 1_000_000, seen[1] + 1 if seen else 0)
            seen = self._seen[topic] = (expression, stamp)
        return seen[1]

    def data(self, subscriptions: dict[str, str]) -> list[dict]:
        """subscriptionDataSet of ``{topic: expression}``, topics in order."""
        return [subscription_data(topic, expression, self.version(topic, expression))
                for topic, expression in sorted(subscriptions.items())]
