"""LabState: what the controller knows about the running lab, built from events.

Pure (no I/O, no clock of its own): the controller feeds it events from the workers,
broker polls and its own actions, and asks it for

* ``snapshot()``: the whole state in the shape the web side relies on
  (``{"type": "snapshot", "groups": {GROUP: {"strategy", "mode", "assignments",
  "queues": {LABEL: {"lag", "cached_count", "cached_bytes", ...}}}}, ...}``), and
* ``drain()``: the events that arrived since the last drain, coalesced so that a flood
  of per-queue figures (a hung consumer reports flow control every 50 ms per queue)
  collapses to the latest one per (type, group, client, queue), while every event that
  tells a story (assignment, rebalance, membership, fault, broker, ...) is kept.

Queue labels are ``BROKER:QUEUE_ID`` (MessageQueue.label). A pop consumer's
broker-level assignment is ``BROKER:-1`` ("any queue of that broker").
"""
import time
from collections import deque
from dataclasses import dataclass, field

from consumers_app.events import (AssignmentEvent, BrokerEvent, ConsumeEvent, Event, FaultEvent,
                                  FlowControlEvent, MembershipEvent, OffsetMovedEvent, PqEvent, RebalanceEvent,
                                  RouteEvent, now_ms, queue_text)
from consumers_app.javastr import java_key
from consumers_app.message_queue import broker_of, parse_label

from .handoff import GroupHandoffs
from .rebalance_totals import RebalanceTotals
from .timeline import GroupTimeline

# Figures that describe "now" and are superseded by the next report: only the latest
# one per (type, group, client, queue) within a flush reaches the browsers.
COALESCED = (PqEvent, FlowControlEvent)   # offset events carry only the queues that moved: never dropped

LOG_LENGTH = 50


def time_lag_ms(lag: int, oldest_store_ts: int | None, now_ms: int) -> int | None:
    """How long the oldest unconsumed message has waited: 0 with nothing unconsumed, None
    when its store time is not known (missing or negative: an attached cluster's probe
    has not answered yet)."""
    if lag == 0 or oldest_store_ts == 0:
        return 0
    if oldest_store_ts is None or oldest_store_ts < 0:
        return None
    return max(0, now_ms - oldest_store_ts)


def sort_ids(ids) -> list[str]:
    """Client ids in Java's string order, as RocketMQ sorts them before allocating."""
    return sorted(ids, key=java_key)


def sort_labels(labels) -> list[str]:
    """Queue labels in MessageQueue order (broker name, then numeric queue id)."""
    def key(label):
        broker, qid = parse_label(label)
        return (java_key(broker), qid)
    return sorted(labels, key=key)


@dataclass
class ClientState:
    client_id: str
    group: str
    mode: str
    worker_id: str = ""
    # starting | running | hung | cut | stopped | killed | crashed; an observed client that
    # went: left | closed | expired (observer.departure)
    status: str = "starting"
    strategy: str = ""         # as its latest assignment reported it
    slow_ms: int = 0
    fail_ratio: float = 0.0
    gone_at: float | None = None   # loop time when it stopped being alive
    client: str = "ours"           # which RocketMQ client: ours, or a peer's name (ali-ons)
    # Where its assignment comes from: the client itself (ours; a peer answering
    # GET_CONSUMER_RUNNING_INFO), or "broker" - the queues the broker sees it pull.
    assignment_source: str = "client"
    # A client the lab watches but did not start (observer.py): what its connection says.
    language: str = ""
    version: str = ""
    note: str = ""     # e.g. why it gave no running info
    # A peer the lab drives reports what its listener is given (peers.py); one it only
    # observes does not, and its hand-offs are not measured.
    reports_consumed: bool = False

    @property
    def alive(self) -> bool:
        return self.status in ("starting", "running", "hung", "cut")


@dataclass
class GroupState:
    name: str
    topic: str
    mode: str
    strategy: str
    members: list[str] = field(default_factory=list)          # the broker's view
    assignments: dict[str, list[str]] = field(default_factory=dict)
    pq: dict[tuple[str, str], dict] = field(default_factory=dict)   # (client, label) -> figures
    offsets: dict[str, dict] = field(default_factory=dict)          # label -> broker figures
    last_rebalance: dict | None = None   # the last one that changed an assignment
    # Rebalances that changed nothing (RocketMQ runs one every 20 s per consumer), per
    # consumer: counted, so they do not bury the ones that moved queues.
    noop_rebalances: dict[str, int] = field(default_factory=dict)
    # Messages never consumed because retention deleted them before the group got there
    # (each consumer's corrected pull offsets), per queue label.
    skipped: dict[str, int] = field(default_factory=dict)
    # The last queue/broker change of its topic and, per consumer, how long (ms) its
    # route refresh took to see it: {"ts", "change", "noticed": {client_id: ms}}.
    route_change: dict | None = None
    route_seen: dict[str, int] = field(default_factory=dict)   # client -> ts of its last route event
    empty_since: float | None = None   # loop time since when nobody is in it
    observed: bool = False             # watched on the cluster, not started by the lab (read-only)
    membership_log: deque = field(default_factory=lambda: deque(maxlen=LOG_LENGTH))
    # The other lines of the page's "Membership & faults" log: faults (strategy switches
    # included) and skipped messages, so a page opened later shows what one open then did.
    fault_log: deque = field(default_factory=lambda: deque(maxlen=LOG_LENGTH))
    flow_control: deque = field(default_factory=lambda: deque(maxlen=LOG_LENGTH))
    # What each rebalance did to messages: hand-offs, gaps, overlaps, duplicates (handoff.py).
    handoffs: GroupHandoffs = field(default_factory=GroupHandoffs)
    # Its rebalances counted since the controller started (for /metrics' counters).
    totals: RebalanceTotals = field(default_factory=RebalanceTotals)
    # One sample a second of the last 15 minutes: sparklines and replay (timeline.py).
    timeline: GroupTimeline = field(default_factory=GroupTimeline)


class LabState:
    def __init__(self):
        self.groups: dict[str, GroupState] = {}
        self.clients: dict[str, ClientState] = {}
        self.topics: dict[str, list[str]] = {}        # topic -> queue labels, sorted
        self.brokers: dict[str, bool] = {}            # broker name -> online
        self.producers: dict[str, dict] = {}          # topic -> {"rate": ..., "producer_id": ...}
        # The broker process as runlab supervises it; a broker the lab did not start is
        # reported up (its reachability shows in the offset polls).
        self.broker_process: dict = {"up": True, "restarts": 0, "managed": False}
        # Attached to someone else's cluster (runlab --namesrv): its name server and the
        # controls it disables, with why (cluster_admin.attachment).
        self.cluster: dict = {"attached": False}
        # Bytes on disk per part (disk.py), as the controller last measured them; empty until then.
        self.disk: dict = {}
        self.history_service: dict | None = None   # disk.history_service(): what keeping history fresh costs
        self._pending: list[Event] = []

    # -- structure (the controller's own bookkeeping) -------------------------------

    def add_group(self, name: str, topic: str, mode: str, strategy: str) -> GroupState:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = GroupState(name, topic, mode, strategy)
        return group

    def add_client(self, client_id: str, group: str, mode: str, worker_id: str = "") -> ClientState:
        client = self.clients[client_id] = ClientState(client_id, group, mode, worker_id)
        return client

    def client_gone(self, client_id: str, status: str) -> None:
        """A consumer stopped, was killed or lost its worker: it owns and caches nothing."""
        client = self.clients.get(client_id)
        if client is None:
            return
        client.status = status
        if client.gone_at is None:
            client.gone_at = time.monotonic()
        group = self.groups.get(client.group)
        if group is not None:
            group.assignments.pop(client_id, None)
            self._holding_changed(group, client_id, now_ms())
            for key in [k for k in group.pq if k[0] == client_id]:
                del group.pq[key]

    def collect_garbage(self, now: float, grace_s: float) -> list[str]:
        """Drop consumers gone for ``grace_s`` (the membership log keeps their story) and
        groups nobody has been in for as long; returns the names of the groups dropped.
        ``now`` is on the time.monotonic() clock."""
        for client_id, client in list(self.clients.items()):
            if not client.alive and client.gone_at is not None and now - client.gone_at >= grace_s:
                del self.clients[client_id]
                if client.group in self.groups:
                    self.groups[client.group].route_seen.pop(client_id, None)
                    self.groups[client.group].noop_rebalances.pop(client_id, None)
                    self.groups[client.group].handoffs.expired.discard(client_id)
        dropped = []
        occupied = {c.group for c in self.clients.values()}
        for name, group in list(self.groups.items()):
            if name in occupied or group.members:
                group.empty_since = None
            elif group.empty_since is None:
                group.empty_since = now
            elif now - group.empty_since >= grace_s:
                del self.groups[name]
                dropped.append(name)
        return dropped

    def set_topic_queues(self, topic: str, labels) -> None:
        self.topics[topic] = sort_labels(labels)
        for group in self.groups.values():
            if group.topic == topic:
                for label in [x for x in group.offsets if x not in labels]:
                    del group.offsets[label]

    def set_offsets(self, group_name: str, now_ms: int, queues: list[dict]) -> None:
        """Broker figures of one GetQueueOffsets poll: label, min/max/committed, oldest ts, inflight."""
        group = self.groups.get(group_name)
        if group is None:
            return
        fresh = {}
        for q in queues:
            committed, max_offset = q["committed_offset"], q["max_offset"]
            # No commit yet: everything still in the queue counts as lag.
            consumed_to = committed if committed >= 0 else q.get("min_offset", 0)
            lag = max(0, max_offset - consumed_to)
            fresh[q["label"]] = {
                "max_offset": max_offset,
                "committed_offset": committed,
                "lag": lag,
                "time_lag_ms": time_lag_ms(lag, q.get("oldest_unconsumed_store_ts"), now_ms),
                "inflight": q.get("inflight", 0),
            }
        group.offsets = fresh
        for label, figures in fresh.items():
            group.handoffs.set_lag(label, figures["lag"], now_ms)
        # Before the record forgets them: a rebalance settles well within its window.
        group.totals.fold((r.summary(now_ms, group.handoffs.silent) for r in group.handoffs.rebalances), now_ms)
        group.handoffs.forget_before(now_ms)
        group.timeline.add(now_ms, self.queue_view(group)[0])

    def _holding_changed(self, group: GroupState, client_id: str, ts: int, reason: str = "") -> None:
        """Tell the group's hand-off record what ``client_id`` consumes now: its assignment
        while it runs; nothing once it is hung, cut or gone. Pop shares queues: no hand-offs."""
        if group.mode == "pop":
            return
        client = self.clients.get(client_id)
        if client is not None and client.client != "ours" and not client.reports_consumed:
            group.handoffs.silent.add(client_id)   # an observed peer: its duplicates cannot be measured
        consuming = (client is None or client.status in ("starting", "running")) and client_id not in group.handoffs.expired
        group.handoffs.set_holding(client_id, group.assignments.get(client_id, ()) if consuming else (), ts, reason)

    # -- events ------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one event into the state and queue it for the browsers."""
        self._pending.append(event)
        if isinstance(event, BrokerEvent):
            self._apply_broker(event)
            return
        group = self.groups.get(event.group)
        if group is None:
            return
        client_id = event.client_id
        if isinstance(event, AssignmentEvent):
            client = self.clients.get(client_id)
            if client is None or client.alive:   # a late report from a dead client changes nothing
                group.assignments[client_id] = sort_labels(mq.label for mq in event.queues)
                for key in [k for k in group.pq if k[0] == client_id and k[1] not in group.assignments[client_id]]:
                    del group.pq[key]
                if client is not None and event.strategy:
                    client.strategy = event.strategy
                self._holding_changed(group, client_id, event.ts, event.reason)
        elif isinstance(event, RebalanceEvent):
            if event.phase == "end" and not (event.added or event.removed):
                group.noop_rebalances[client_id] = group.noop_rebalances.get(client_id, 0) + 1
            elif event.phase == "end":
                group.last_rebalance = {
                    "client_id": client_id, "ts": event.ts, "reason": event.reason,
                    "duration_ms": event.duration_ms,
                    "added": [queue_text(mq, group.topic) for mq in event.added or ()],
                    "removed": [queue_text(mq, group.topic) for mq in event.removed or ()],
                }
        elif isinstance(event, PqEvent):
            # Only the subscribed topic: a push consumer also holds its group's %RETRY% queues.
            if event.queue is None or event.queue.topic != group.topic:
                return
            if client_id in group.assignments or client_id not in self.clients:
                group.pq[(client_id, event.queue.label)] = {
                    "cached_count": event.cached_count, "cached_bytes": event.cached_bytes,
                    "span": event.span, "inflight": event.inflight}
        elif isinstance(event, MembershipEvent):
            if event.members is not None:
                group.members = sort_ids(event.members)
            # Every consumer repeats the notices it hears; the log keeps the broker's own.
            if event.source == "broker":
                group.membership_log.append(event)
                self._expiry(group, event)
        elif isinstance(event, FlowControlEvent):
            group.flow_control.append(event)
        elif isinstance(event, ConsumeEvent):
            for mq, ranges in (event.ranges or {}).items():
                if mq.topic == group.topic and group.mode != "pop":
                    group.handoffs.consumed_ranges(client_id, mq.label, ranges, event.ts)
        elif isinstance(event, OffsetMovedEvent):
            if event.queue is not None and event.skipped:
                label = event.queue.label
                group.skipped[label] = group.skipped.get(label, 0) + event.skipped
                group.fault_log.append(event)
        elif isinstance(event, RouteEvent):
            group.route_seen[client_id] = event.ts
            change = group.route_change
            if change is not None and client_id not in change["noticed"] and event.ts >= change["ts"]:
                change["noticed"][client_id] = event.ts - change["ts"]
        elif isinstance(event, FaultEvent):
            group.fault_log.append(event)
            client = self.clients.get(client_id)
            if client is not None:
                self._apply_fault(client, event)
                if event.fault == "kill":   # it consumes nothing from here; client_gone follows
                    group.handoffs.set_holding(client_id, (), event.ts)
                else:
                    self._holding_changed(group, client_id, event.ts)

    def _apply_broker(self, event: BrokerEvent) -> None:
        if event.online is not None and event.broker:
            self.brokers[event.broker] = event.online
        if event.queues is not None and event.topic:
            self.set_topic_queues(event.topic, [mq.label for mq in event.queues])
        if event.change not in ("queues", "online", "offline"):
            return
        for g in self.groups.values():
            if g.mode == "pop":
                continue   # pop clients ask the broker for their assignment every 5 s instead
            if event.change in ("online", "offline") and event.broker:
                g.handoffs.broker_changed([x for x in self.topics.get(g.topic, ()) if broker_of(x) == event.broker],
                                          event.change == "online", f"{event.broker} {event.change}", event.ts)
            if event.topic in (None, "", g.topic):
                # A consumer's refresh may have seen it before this event got here.
                g.route_change = {"ts": event.ts, "change": event.change, "broker": event.broker or "",
                                  "noticed": {c: ts - event.ts for c, ts in g.route_seen.items()
                                              if ts >= event.ts}}

    def _expiry(self, group: GroupState, event: MembershipEvent) -> None:
        """The broker dropped a member (expired it, or it left): whatever the lab last heard
        from it, it holds nothing for its group any more, until the broker lists it again."""
        for client_id in event.left or ():
            group.handoffs.expired.add(client_id)
            self._holding_changed(group, client_id, event.ts)
        for client_id in event.joined or ():
            if client_id in group.handoffs.expired:
                group.handoffs.expired.discard(client_id)
                self._holding_changed(group, client_id, event.ts)

    @staticmethod
    def _apply_fault(client: ClientState, event: FaultEvent) -> None:
        fault = event.fault
        if fault == "hang":
            client.status = "hung"
        elif fault == "cut":
            client.status = "cut"
        elif fault == "resume":
            client.status = "running"
        elif fault == "slow":
            client.slow_ms = event.ms or 0
        elif fault == "fail":
            client.fail_ratio = event.ratio or 0.0

    def set_assignment(self, group_name: str, client_id: str, labels) -> None:
        """An assignment learnt from outside the client (the broker's view of a peer)."""
        group, client = self.groups.get(group_name), self.clients.get(client_id)
        if group is not None and client is not None and client.alive:
            group.assignments[client_id] = sort_labels(labels)
            self._holding_changed(group, client_id, now_ms())

    def apply_client_snapshot(self, snap: dict) -> None:
        """A consumer's own ``snapshot()``: authoritative for its assignment and caches."""
        group = self.groups.get(snap.get("group", ""))
        client = self.clients.get(snap.get("client_id", ""))
        if group is None or client is None or not client.alive:
            return
        client_id = client.client_id
        # Not the strategy: a snapshot taken right after set_strategy names the new one
        # before the rebalance ran. Assignment events carry the strategy that computed them.
        client.strategy = client.strategy or snap.get("strategy", "")
        group.assignments[client_id] = sort_labels(snap.get("assignments", []))
        for key in [k for k in group.pq if k[0] == client_id]:
            del group.pq[key]
        for label, figures in (snap.get("queues") or {}).items():
            if "/" in label:   # TOPIC/BROKER:QID: another topic's queue (%RETRY%)
                continue
            group.pq[(client_id, label)] = {
                k: figures.get(k, 0) for k in ("cached_count", "cached_bytes", "span", "inflight")
            }

    def drain(self) -> list[Event]:
        """Events since the last drain, in order, with superseded figures left out."""
        pending, self._pending = self._pending, []
        latest: dict[tuple, int] = {}
        for index, event in enumerate(pending):
            if isinstance(event, COALESCED):
                latest[(event.type, event.group, event.client_id, event.queue)] = index
        keep = set(latest.values())
        return [e for i, e in enumerate(pending) if not isinstance(e, COALESCED) or i in keep]

    # -- views -------------------------------------------------------------------

    def owners(self, group: GroupState) -> dict[str, list[str]]:
        """label -> live client ids holding it; a pop ``BROKER:-1`` covers every queue of BROKER."""
        owners: dict[str, list[str]] = {}
        labels = self.topics.get(group.topic, [])
        for client_id, assigned in group.assignments.items():
            for label in assigned:
                if label.endswith(":-1"):
                    broker = broker_of(label)
                    covered = [x for x in labels if broker_of(x) == broker]
                else:
                    covered = [label]
                for x in covered:
                    owners.setdefault(x, []).append(client_id)
        return {label: sort_ids(ids) for label, ids in owners.items()}

    def queue_view(self, group: GroupState) -> tuple[dict, dict]:
        """Per queue label its figures and owners, and the queues not owned exactly once."""
        owners = self.owners(group)
        labels = sort_labels(set(self.topics.get(group.topic, [])) | set(group.offsets) | set(owners))
        queues = {}
        issues = {}
        for label in labels:
            held_by = owners.get(label, [])
            cached = [group.pq[(c, label)] for c in held_by if (c, label) in group.pq]
            broker_figures = group.offsets.get(label, {})
            queues[label] = {
                "lag": broker_figures.get("lag", 0),
                "cached_count": sum(p["cached_count"] for p in cached),
                "cached_bytes": sum(p["cached_bytes"] for p in cached),
                "span": max((p["span"] for p in cached), default=0),
                "committed_offset": broker_figures.get("committed_offset", -1),
                "max_offset": broker_figures.get("max_offset", 0),
                # None: not known yet (an attached cluster that has not told it): never a 0.
                "time_lag_ms": broker_figures.get("time_lag_ms") if broker_figures else None,
                "inflight": broker_figures.get("inflight", 0) or sum(p["inflight"] for p in cached),
                "owners": held_by,
            }
            # Exactly-once ownership holds for readable queues (of an online broker) in the
            # queue-owning modes only: pop shares queues.
            readable = label in self.topics.get(group.topic, []) and self.brokers.get(broker_of(label), True)
            if group.mode != "pop" and readable and len(held_by) != 1:
                issues[label] = "unowned" if not held_by else "shared"
        return queues, issues

    def group_snapshot(self, group: GroupState) -> dict:
        queues, issues = self.queue_view(group)
        clients = {
            c.client_id: {"status": c.status, "mode": c.mode, "worker": c.worker_id, "strategy": c.strategy,
                          "slow_ms": c.slow_ms, "fail_ratio": c.fail_ratio, "client": c.client,
                          "assignment_source": c.assignment_source, "language": c.language,
                          "version": c.version, "note": c.note,
                          # Whether it still takes part (ClientState.alive): the page's consumer
                          # lists follow this rather than guessing from the status words.
                          "alive": c.alive}
            for c in self.clients.values() if c.group == group.name
        }
        return {
            "strategy": group.strategy,
            "mode": group.mode,
            "observed": group.observed,
            "topic": group.topic,
            "members": list(group.members),
            "clients": clients,
            "assignments": {c: list(ls) for c, ls in sorted(group.assignments.items(), key=lambda kv: java_key(kv[0]))},
            "queues": queues,
            "ownership_issues": issues,
            "last_rebalance": group.last_rebalance,
            "noop_rebalances": dict(group.noop_rebalances),
            "skipped": dict(group.skipped),   # queue -> messages retention deleted before they were consumed
            "handoffs": group.handoffs.snapshot(now_ms()),
            "rebalance_totals": group.totals.snapshot(),
            "route_change": group.route_change and {**group.route_change,
                                                    "noticed": dict(group.route_change["noticed"])},
            "membership_log": [e.to_dict() for e in group.membership_log],
            "fault_log": [e.to_dict() for e in group.fault_log],
            "flow_control": [e.to_dict() for e in group.flow_control],
        }

    def snapshot(self) -> dict:
        return {
            "type": "snapshot",
            "groups": {name: self.group_snapshot(g) for name, g in self.groups.items()},
            "topics": {t: list(ls) for t, ls in self.topics.items()},
            "producers": {t: dict(p) for t, p in self.producers.items()},
            "brokers": {name: {"online": online} for name, online in sorted(self.brokers.items())},
            "broker_process": dict(self.broker_process),
            "cluster": dict(self.cluster),
            "disk": {k: dict(v) if isinstance(v, dict) else v for k, v in self.disk.items()},
            "history_service": dict(self.history_service) if self.history_service else None,
        }
