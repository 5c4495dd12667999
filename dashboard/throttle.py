"""Per-caller rate limits: token buckets kept in the web process.

A control action costs one token of its user's bucket (``LAB_CONTROL_RATE`` per second,
bursts of ``LAB_CONTROL_BURST``); producer bursts also spend their message count from a
per-user message budget (``LAB_BURST_MESSAGES_PER_MINUTE``) so the broker's retention
budget stays meaningful. A refused call learns when to come back (429 + Retry-After).
Failed logins are limited per client address the same way.

The buckets are per web process: with several web processes behind one Redis layer the
effective limit is that many times higher, which is fine for a guard against floods.
"""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict


class TokenBucket:
    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: float, capacity: float):
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.stamp = time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, cost: float = 1.0) -> float:
        """0.0 if ``cost`` tokens were taken, else the seconds until they would be there."""
        now = time.monotonic()
        self._refill(now)
        if cost > self.capacity:
            return math.inf
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate


class Limiter:
    """One bucket per key (user id, address), the least recently used forgotten first."""

    def __init__(self, rate: float, capacity: float, max_keys: int = 10_000):
        self.rate = rate
        self.capacity = capacity
        self.max_keys = max_keys
        self._buckets: OrderedDict[object, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()   # sync views (login) and async ones share it

    def take(self, key, cost: float = 1.0) -> float:
        with self._lock:
            bucket = self._buckets.pop(key, None) or TokenBucket(self.rate, self.capacity)
            self._buckets[key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
            return bucket.take(cost)

    def blocked(self, key, cost: float = 1.0) -> float:
        """Like take(), without taking: the seconds until ``cost`` tokens are there (0.0: now)."""
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                return 0.0
            bucket._refill(time.monotonic())
            return 0.0 if bucket.tokens >= cost else (cost - bucket.tokens) / bucket.rate

    def reset(self) -> None:
        with self._lock:
            self._buckets.clear()
