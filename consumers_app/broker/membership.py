"""Consumer-group membership: heartbeats, expiry, termination notices, change watchers.

As RocketMQ's ConsumerManager: a client is registered by its heartbeat (client id
from the ``x-mq-client-id`` gRPC metadata header), refreshed by every heartbeat or
telemetry message, removed by NotifyClientTermination, removed at once when its
connection closes (doChannelCloseEvent; here: when the last of its session streams -
the membership watch our clients keep open for life, LabAdmin.Session or WatchMembership -
ends), and expired when silent for ``channel_expired_ms`` (120 s) - checked every ``scan_interval_ms`` (10 s), like
ClientHousekeepingService. So a killed process leaves at once; a hung one or one cut
off the network (no close) only after the expiry. Every change is pushed to the group's watchers (the
lab's Session and WatchMembership streams: 4.x's "consumer ids changed" notice).

A member gone is kept a while with how it went (``departures``: "left", "closed" or
"expired"), for whoever sees it gone later by polling the member list (the lab observing
over remoting asks with a lab-only request); RocketMQ's ConsumerManager forgets it at once.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from ..javastr import java_key

log = logging.getLogger(__name__)


@dataclass
class ClientInfo:
    client_id: str
    group: str
    client_type: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    settings: object = None  # the client's v2 Settings from Telemetry, if any


def now_ms() -> int:
    return int(time.time() * 1000)


# Departures kept per group: enough for a poller a few seconds behind (the lab looks every
# second), bounded however many members churn or groups come and go.
DEPARTURES_KEPT = 64
DEPARTURE_TTL_S = 300.0


class Membership:
    def __init__(self, channel_expired_ms: int = 120_000, scan_interval_ms: int = 10_000):
        self.expired_s = channel_expired_ms / 1000
        self.scan_s = scan_interval_ms / 1000
        self.groups: dict[str, dict[str, ClientInfo]] = {}
        self.producers: dict[str, ClientInfo] = {}
        self._watchers: dict[str, set[asyncio.Queue]] = {}
        self.listeners = []  # callables (group, joined, left, reason) for other components
        self._sessions: dict[tuple[str, str], int] = {}  # (group, client id) -> open session streams
        # group -> (monotonic time, ts ms, client id, reason) of its recent departures, oldest first
        self._departures: dict[str, deque] = {}
        self._task = None

    # ------------------------------------------------------------------ queries

    def members(self, group: str) -> list[str]:
        """Live client ids, sorted as Java sorts strings (what allocation expects)."""
        return sorted(self.groups.get(group, {}), key=java_key)

    def client(self, group: str, client_id: str) -> ClientInfo | None:
        return self.groups.get(group, {}).get(client_id)

    def is_alive(self, group: str, client_id: str) -> bool:
        return client_id in self.groups.get(group, {})

    def known_group(self, group: str) -> bool:
        return group in self.groups

    def departures(self, group: str) -> list[dict]:
        """The group's members gone in the last ``DEPARTURE_TTL_S`` (at most ``DEPARTURES_KEPT``),
        oldest first: {"clientId", "reason", "ts"}."""
        self._forget_departures(time.monotonic())
        return [{"clientId": cid, "reason": reason, "ts": ts} for _, ts, cid, reason in self._departures.get(group, ())]

    # ------------------------------------------------------------------ changes

    def heartbeat(self, group: str | None, client_id: str, client_type: int = 0, settings=None) -> ClientInfo:
        if not group:
            info = self.producers.get(client_id)
            if info is None:
                info = self.producers[client_id] = ClientInfo(client_id, "", client_type)
            info.last_seen = time.monotonic()
            if settings is not None:
                info.settings = settings
            return info
        members = self.groups.setdefault(group, {})
        info = members.get(client_id)
        if info is None:
            info = members[client_id] = ClientInfo(client_id, group, client_type)
            self._changed(group, joined=[client_id], left=[], reason="joined")
        info.last_seen = time.monotonic()
        if client_type:
            info.client_type = client_type
        if settings is not None:
            info.settings = settings
        return info

    def unregister(self, group: str | None, client_id: str, reason: str = "left") -> bool:
        if not group:
            return self.producers.pop(client_id, None) is not None
        members = self.groups.get(group)
        if not members or client_id not in members:
            return False
        del members[client_id]
        # Its sessions end with it: if the id comes back, its new sessions are counted
        # afresh, so a later close of them is noticed at once (not at expiry).
        self._sessions.pop((group, client_id), None)
        self._departures.setdefault(group, deque(maxlen=DEPARTURES_KEPT)).append(
            (time.monotonic(), now_ms(), client_id, reason))
        self._changed(group, joined=[], left=[client_id], reason=reason)
        return True

    def open_session(self, group: str, client_id: str) -> None:
        key = (group, client_id)
        self._sessions[key] = self._sessions.get(key, 0) + 1

    def close_session(self, group: str, client_id: str) -> None:
        """A session stream ended: the last one closing means the connection is gone."""
        key = (group, client_id)
        left = self._sessions.get(key, 0) - 1
        if left > 0:
            self._sessions[key] = left
            return
        self._sessions.pop(key, None)
        if self.unregister(group, client_id, reason="closed"):
            log.info("client %s of group %s closed its connection", client_id, group)

    def unregister_everywhere(self, client_id: str, reason: str = "left"):
        self.producers.pop(client_id, None)
        for group in list(self.groups):
            self.unregister(group, client_id, reason)

    def scan_expired(self):
        now = time.monotonic()
        for group, members in list(self.groups.items()):
            gone = [cid for cid, info in members.items() if now - info.last_seen > self.expired_s]
            for cid in gone:
                log.info("client %s of group %s expired", cid, group)
                self.unregister(group, cid, reason="expired")
        for cid in [c for c, i in self.producers.items() if now - i.last_seen > self.expired_s]:
            del self.producers[cid]
        self._forget_departures(now)

    def _forget_departures(self, now: float) -> None:
        for group, gone in list(self._departures.items()):
            while gone and now - gone[0][0] > DEPARTURE_TTL_S:
                gone.popleft()
            if not gone:
                del self._departures[group]

    def _changed(self, group, joined, left, reason):
        change = {"group": group, "client_ids": self.members(group), "joined": joined,
                  "left": left, "reason": reason, "ts": now_ms()}
        for q in self._watchers.get(group, ()):
            q.put_nowait(change)
        for listener in self.listeners:
            try:
                listener(group, joined, left, reason)
            except Exception:  # a listener bug must not break membership
                log.exception("membership listener failed")

    # ----------------------------------------------------------------- watchers

    def watch(self, group: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait({"group": group, "client_ids": self.members(group), "joined": [], "left": [],
                      "reason": "initial", "ts": now_ms()})
        self._watchers.setdefault(group, set()).add(q)
        return q

    def unwatch(self, group: str, q: asyncio.Queue):
        watchers = self._watchers.get(group)
        if watchers:
            watchers.discard(q)
            if not watchers:
                del self._watchers[group]

    # --------------------------------------------------------------- lifecycle

    def start(self):
        self._task = asyncio.get_running_loop().create_task(self._scan_loop())

    async def _scan_loop(self):
        while True:
            await asyncio.sleep(self.scan_s)
            self.scan_expired()

    def stop(self):
        if self._task:
            self._task.cancel()
