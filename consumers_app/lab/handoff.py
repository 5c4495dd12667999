"""What each rebalance did to messages: the hand-offs of one group's queues.

A hand-off is one queue passing from the consumers that held it to a new one. Each
consumer rebalances on its own (RocketMQ's RebalanceImpl), so the new owner may take the
queue before the old one lets go (an *overlap*: both consume it) or after (a *gap*: nobody
does). The new owner starts from the committed offset, so whatever the old owner consumed
past its last commit is consumed again: RocketMQ's at-least-once duplicates.

Measured, not estimated:

* holding: who holds each queue since when, from the consumers' assignment events; a
  hung or cut consumer stops consuming, so it counts as letting go when the fault hits;
* duplicates: every consumer reports the queue offsets its listener was given
  (``consume`` events' ranges). A hand-off's duplicates are the offsets both the old owner
  (while it held the queue) and the new one (since it took it) consumed: each is counted
  once, when the second of the two reports it, whichever that is;
* lag spike: the highest lag the broker reported for the queue in the 30 s after the
  hand-off, less its lag just before.

Hand-offs close together (3 s) form one *rebalance*: the page draws those, and a click
shows their hand-offs. Everything older than the window (15 min) is forgotten; what is in
it is saved at the lab's stop and restored at its start (``saved``/``restore``). Pure: the
caller passes every timestamp (ms since the epoch).
"""
from collections import deque
from dataclasses import dataclass, field

from consumers_app.events import make_event, now_ms
from consumers_app.message_queue import MessageQueue
from consumers_app.offset_ranges import covered, merge_ranges

from .bus import LabError

WINDOW_MS = 15 * 60 * 1000
EPISODE_QUIET_MS = 3_000     # a hand-off this close to the last one belongs to the same rebalance
EPISODE_MAX_MS = 30_000      # ... unless that rebalance began this long ago (a group that churns
EPISODE_MAX_MOVES = 2_048    # all the time would be one endless rebalance) or is this big
LAG_WATCH_MS = 30_000        # how long after a hand-off its lag spike is watched
MAX_REBALANCES = 500         # kept per group, newest last (a floor under the window)


def measured_sum(values):
    """The sum of the figures that were measured (not None); None when none was."""
    measured = [v for v in values if v is not None]
    return sum(measured) if measured else None


class Tenure:
    """One client's time holding one queue, and the offsets it consumed meanwhile (sorted,
    disjoint [start, end) ranges). Consumption reported after it let go (results of
    messages in flight) still belongs to it, as long as it has not taken the queue again."""

    __slots__ = ("client", "ranges", "into", "out_of", "last_ts")

    def __init__(self, client: str, ts: int):
        self.client = client
        self.ranges: list[list[int]] = []
        self.into: "Handoff | None" = None        # the hand-off that started it
        self.out_of: list["Handoff"] = []         # hand-offs that passed the queue on from it
        self.last_ts = ts

    def add(self, start: int, end: int) -> list[tuple[int, int]]:
        """Record [start, end); returns the parts it did not hold yet."""
        new, reach = [], start
        for s, e in self.ranges:
            if e <= reach or s >= end:
                continue
            if s > reach:
                new.append((reach, s))
            reach = max(reach, e)
        if reach < end:
            new.append((reach, end))
        if new:
            self.ranges = merge_ranges(self.ranges + [[s, e] for s, e in new])
        return new

    def covered(self, start: int, end: int) -> int:
        return covered(start, end, self.ranges)


@dataclass
class Handoff:
    queue: str
    to: str
    from_: list[str]
    added_ts: int
    rebalance: int
    reason: str = ""                         # why the new owner rebalanced
    released_ts: int | None = None           # when the last of ``from_`` let go; None: not yet
    waiting: set[str] = field(default_factory=set)   # of ``from_``, who still holds it
    from_tenures: list[Tenure] = field(default_factory=list)   # the old owners' consumption
    to_tenure: Tenure | None = None                             # the new owner's
    duplicates: int = 0
    lag_before: int | None = None
    lag_peak: int | None = None

    def to_dict(self, now_ms: int, silent=frozenset()) -> dict:
        """``silent``: clients that report no consumed offsets (peers): a hand-off to or
        from one has ``duplicates`` None, not measured, rather than a 0 that would claim none."""
        released = self.released_ts
        # Still held by an old owner: the overlap so far (and counting).
        overlap = (released if released is not None else now_ms) - self.added_ts
        return {
            "queue": self.queue, "from": list(self.from_), "to": self.to,
            "added_ts": self.added_ts, "released_ts": released,
            "gap_ms": max(0, -overlap) if released is not None else 0,
            "overlap_ms": max(0, overlap),
            "overlap_ongoing": released is None,
            "duplicates": None if self.to in silent or any(c in silent for c in self.from_) else self.duplicates,
            "lag_before": self.lag_before, "lag_peak": self.lag_peak,
            "lag_spike": max(0, self.lag_peak - self.lag_before)
            if self.lag_peak is not None and self.lag_before is not None else None,
        }


@dataclass
class Rebalance:
    id: int
    ts: int
    last_ts: int
    reasons: list[str] = field(default_factory=list)
    moves: list[Handoff] = field(default_factory=list)
    changed: bool = True            # since its summary was last made
    _summary: dict | None = None

    def summary(self, now_ms: int, silent=frozenset()) -> dict:
        """Made again only when a move changed, or an overlap is still running (it grows
        with the clock): every snapshot asks for every rebalance of the window."""
        if self._summary is None or self.changed or self._summary["overlap_ongoing"]:
            self._summary = self._make_summary(now_ms, silent)
            self.changed = False
        return self._summary

    def _make_summary(self, now_ms: int, silent) -> dict:
        moves = [m.to_dict(now_ms, silent) for m in self.moves]
        spikes = [m["lag_spike"] for m in moves if m["lag_spike"] is not None]
        return {
            "id": self.id, "ts": self.ts, "end_ts": self.last_ts,
            "reason": ", ".join(self.reasons),
            "moved": len(moves),
            # Of the measured moves; None (not measured) when every move is to or from a peer.
            "duplicates": measured_sum(m["duplicates"] for m in moves),
            "unmeasured": sum(m["duplicates"] is None for m in moves),   # moves to or from a peer
            "gap_ms": max((m["gap_ms"] for m in moves), default=0),
            "overlap_ms": max((m["overlap_ms"] for m in moves), default=0),
            "lag_spike": max(spikes, default=None),
            "clients": sorted({c for m in self.moves for c in (m.to, *m.from_) if c}),   # "": nobody
            "overlap_ongoing": any(m["overlap_ongoing"] for m in moves),
        }

    def detail(self, now_ms: int, silent=frozenset()) -> dict:
        return {**self.summary(now_ms, silent), "moves": [m.to_dict(now_ms, silent) for m in self.moves]}


class SavedRebalance:
    """A rebalance of an earlier run of the lab (saved at its stop, see ``GroupHandoffs.saved``):
    its figures as they stood then, final. An overlap still running at the stop ended there:
    the lab's consumers let go as it stopped."""

    def __init__(self, detail: dict, stopped_ts: int):
        moves = [m if m["released_ts"] is not None else
                 {**m, "released_ts": stopped_ts, "overlap_ongoing": False, "overlap_ms": max(0, stopped_ts - m["added_ts"])}
                 for m in detail["moves"]]
        self.id, self.ts, self.last_ts = detail["id"], detail["ts"], detail["end_ts"]
        self._detail = {**detail, "moves": moves, "overlap_ongoing": False,
                        "duplicates": measured_sum(m["duplicates"] for m in moves),
                        "overlap_ms": max((m["overlap_ms"] for m in moves), default=0)}
        self._summary = {k: v for k, v in self._detail.items() if k != "moves"}

    def summary(self, now_ms: int, silent=frozenset()) -> dict:
        return self._summary

    def detail(self, now_ms: int, silent=frozenset()) -> dict:
        return self._detail


class GroupHandoffs:
    """One group's queues: holders, consumed ranges, hand-offs and rebalances."""

    def __init__(self, window_ms: int = WINDOW_MS):
        self.window_ms = window_ms
        self.holding: dict[str, dict[str, int]] = {}         # queue -> client -> since
        self.held_by: dict[str, set[str]] = {}               # client -> queues
        self.last_release: dict[str, tuple[str, int, int]] = {}   # queue -> (client, ts, since when it held it)
        self.pending: dict[str, list[Handoff]] = {}          # queue -> hand-offs whose old owner holds on
        self.tenures: dict[tuple[str, str], Tenure] = {}     # (queue, client) -> its latest tenure
        self.lag: dict[str, int] = {}
        self.rebalances: deque[Rebalance] = deque()
        self.reasons: dict[str, str] = {}                    # client -> its latest rebalance's reason
        self._changed: dict[int, Handoff] = {}               # id() -> hand-offs whose figures moved
        self._episodes: dict[int, Rebalance] = {}            # id -> the rebalances kept
        self.silent: set[str] = set()                        # clients that report no consumed offsets (peers)
        self.version = 0                                     # moves when any figure does (saving skips a still one)
        self.expired: set[str] = set()                       # clients the broker dropped: they hold nothing
        # Queues whose broker went offline, and those whose broker came back, with why: a
        # queue the route refresh takes away or gives back moves to or from nobody.
        self.gone: dict[str, str] = {}                       # queue -> cause, e.g. "broker-b offline"
        self.back: dict[str, str] = {}                       # queue -> cause, e.g. "broker-b online"
        self._next_id = 1

    # -- holding ----------------------------------------------------------------------

    def set_holding(self, client: str, queues, ts: int, reason: str = "") -> None:
        """``client`` now holds (and consumes) exactly ``queues``; ``reason``: why its
        assignment changed (the rebalance's), named on the rebalance its hand-offs join."""
        if reason:
            self.reasons[client] = reason
        now = set(queues)
        before = self.held_by.get(client, set())
        for queue in sorted(before - now):
            self._release(queue, client, ts)
        for queue in sorted(now - before):
            self._acquire(queue, client, ts)
        if now:
            self.held_by[client] = now
        else:
            self.held_by.pop(client, None)

    def broker_changed(self, queues, online: bool, cause: str, ts: int | None = None) -> None:
        """``queues`` (labels) went away with their broker, or came back with it, at ``ts``.
        A consumer's route refresh may have seen the change before this news got here: a
        queue let go (or taken back) since ``ts`` moved because of it all the same."""
        for queue in queues:
            holders = self.holding.get(queue, {})
            last = self.last_release.get(queue)
            if online:
                if self.gone.pop(queue, None) is None:
                    continue
                owner, since = next(iter(holders.items())) if len(holders) == 1 else (None, None)
                if ts is not None and owner is not None and since >= ts and (last is None or last[0] == owner):
                    self._file(Handoff(queue, owner, [], since, 0, reason=cause,
                                       released_ts=last[1] if last is not None else since))
                else:
                    self.back[queue] = cause
            else:
                self.back.pop(queue, None)
                self.gone[queue] = cause
                if ts is not None and not holders and last is not None and last[1] >= ts:
                    self._file(Handoff(queue, "", [last[0]], last[1], 0, reason=cause, released_ts=last[1]))

    def _release(self, queue: str, client: str, ts: int) -> None:
        """``client`` stopped consuming ``queue`` (let go, died, was killed, hung, cut or
        expired): an overlap it was one of the two sides of ends here."""
        since = self.holding.get(queue, {}).pop(client, ts)
        self.last_release[queue] = (client, ts, since)
        if queue in self.gone and not self.holding.get(queue):
            # Its broker went offline: the queue moved to nobody (the route refresh took it away).
            self._file(Handoff(queue, "", [client], ts, 0, reason=self.gone[queue], released_ts=ts))
        still = []
        for handoff in self.pending.get(queue, ()):
            if client == handoff.to:
                self._new_owner_let_go(handoff, ts)
                continue
            handoff.waiting.discard(client)
            if handoff.waiting:
                still.append(handoff)
            else:
                handoff.released_ts = ts
                self._touch(handoff)
        if still:
            self.pending[queue] = still
        else:
            self.pending.pop(queue, None)

    def _new_owner_let_go(self, handoff: "Handoff", ts: int) -> None:
        """The new owner let go while an old owner still held on: the queue stays with that
        old owner, as before the hand-off (a consumer's rebalance on a stale member list
        took it for a moment), so it never changed owner: no move. (An old owner that let
        go meanwhile passed it to the one still holding it: that hand-off is its own.)"""
        self._withdraw(handoff)

    def _withdraw(self, handoff: "Handoff") -> None:
        if handoff.to_tenure is not None and handoff.to_tenure.into is handoff:
            handoff.to_tenure.into = None
        for tenure in handoff.from_tenures:
            tenure.out_of = [h for h in tenure.out_of if h is not handoff]
        self._changed.pop(id(handoff), None)
        self.version += 1
        episode = self._episodes.get(handoff.rebalance)
        if episode is None:
            return
        episode.moves = [m for m in episode.moves if m is not handoff]
        if not episode.moves:
            self.rebalances.remove(episode)
            del self._episodes[episode.id]
            return
        episode.reasons = list(dict.fromkeys(m.reason for m in episode.moves if m.reason))
        episode.changed = True

    def _acquire(self, queue: str, client: str, ts: int) -> None:
        holders = self.holding.setdefault(queue, {})
        # Reports of different consumers come through different workers, so one may arrive
        # after a later one: by the clock, holders that took the queue after ``ts`` took it
        # from this client (_held_first), not this client from them.
        others = sorted(c for c, since in holders.items() if c != client and since <= ts)
        later = sorted(c for c, since in holders.items() if c != client and since > ts)
        holders[client] = ts
        last = self.last_release.get(queue)
        if last is not None and last[0] != client and last[2] > ts:
            # Its last holder took it after this client did and has let go already: it gave
            # the queue back to this client, who never let go: no move either way.
            last = None
        cause = self.back.pop(queue, None)
        if cause is not None and not others and (last is None or last[0] == client):
            # Its broker is back: the queue moves from nobody (since it went away) to its owner.
            self._file(Handoff(queue, client, [], ts, 0, reason=cause,
                               released_ts=last[1] if last is not None else ts))
        if not others and last is not None and last[0] == client and (queue, client) in self.tenures:
            tenure = self.tenures[(queue, client)]   # its owner back after a pause, nobody in between:
            self._held_first(queue, client, later, tenure)   # the same tenure goes on
            return
        tenure = self.tenures[(queue, client)] = Tenure(client, ts)
        self._held_first(queue, client, later, tenure)
        if others:
            handoff = Handoff(queue, client, others, ts, 0, waiting=set(others))
            self.pending.setdefault(queue, []).append(handoff)
        else:
            if last is None or last[0] == client:
                return   # the queue's first owner: no move
            handoff = Handoff(queue, client, [last[0]], ts, 0, reason=cause or "", released_ts=last[1])
        handoff.lag_before = self.lag.get(queue)
        tenure.into, handoff.to_tenure = handoff, tenure
        for old in handoff.from_:
            if (queue, old) in self.tenures:
                handoff.from_tenures.append(self.tenures[(queue, old)])
                self.tenures[(queue, old)].out_of.append(handoff)
        self._file(handoff)

    def _held_first(self, queue: str, client: str, later, tenure: Tenure) -> None:
        """``client``'s report, come late, says it took ``queue`` before each of ``later``
        (who still hold it) did: each of them took it from ``client`` too, while it held on.
        A hand-off into one of them still waiting for its old owners gains ``client`` as
        one more; one that took the queue as its first owner gets its hand-off now. (One
        into it that has settled already stays as it is: the event log has it.)"""
        for new in later:
            pending = next((h for h in self.pending.get(queue, ()) if h.to == new), None)
            if pending is not None:
                if client not in pending.from_:
                    pending.from_ = sorted([*pending.from_, client])
                    pending.waiting.add(client)
                    pending.from_tenures.append(tenure)
                    tenure.out_of.append(pending)
                    self._touch(pending)
                continue
            new_tenure = self.tenures.get((queue, new))
            if new_tenure is None or new_tenure.into is not None:
                continue
            handoff = Handoff(queue, new, [client], self.holding[queue][new], 0, waiting={client})
            handoff.to_tenure, new_tenure.into = new_tenure, handoff
            handoff.from_tenures.append(tenure)
            tenure.out_of.append(handoff)
            self.pending.setdefault(queue, []).append(handoff)
            self._file(handoff)

    def _touch(self, handoff: Handoff) -> None:
        """Its figures moved: report it (take_changed) and remake its rebalance's summary."""
        self._changed[id(handoff)] = handoff
        self.version += 1
        episode = self._episodes.get(handoff.rebalance)
        if episode is not None:
            episode.changed = True

    def _file(self, handoff: Handoff) -> None:
        ts = handoff.added_ts
        episode = self.rebalances[-1] if self.rebalances else None
        if (episode is None or isinstance(episode, SavedRebalance) or ts - episode.last_ts > EPISODE_QUIET_MS or ts - episode.ts > EPISODE_MAX_MS
                or len(episode.moves) >= EPISODE_MAX_MOVES):
            episode = Rebalance(self._next_id, ts, ts)
            self._next_id += 1
            self.rebalances.append(episode)
            self._episodes[episode.id] = episode
            while len(self.rebalances) > MAX_REBALANCES:
                self._episodes.pop(self.rebalances.popleft().id, None)
        episode.last_ts = max(episode.last_ts, ts)
        reason = handoff.reason = handoff.reason or self.reasons.get(handoff.to, "")
        if reason and reason not in episode.reasons:
            episode.reasons.append(reason)
        handoff.rebalance = episode.id
        episode.moves.append(handoff)
        self._touch(handoff)

    # -- what was consumed ------------------------------------------------------------

    def consumed_ranges(self, client: str, queue: str, ranges, ts: int) -> int:
        """``client``'s listener was given ``ranges`` ([start, end) offsets) of ``queue``;
        returns how many of them are duplicates of a hand-off (see the module doc)."""
        tenure = self.tenures.get((queue, client))
        if tenure is None:   # consuming a queue we never saw it take: a tenure of unknown start
            tenure = self.tenures[(queue, client)] = Tenure(client, ts)
        tenure.last_ts = ts
        total = 0
        for start, end in ranges:
            for s, e in tenure.add(start, end):
                into = tenure.into
                if into is not None and into.from_tenures:
                    twice = covered(s, e, [r for t in into.from_tenures for r in t.ranges])
                    if twice:
                        into.duplicates += twice
                        self._touch(into)
                    total += twice
                for handoff in tenure.out_of:
                    twice = handoff.to_tenure.covered(s, e) if handoff.to_tenure else 0
                    if twice:
                        handoff.duplicates += twice
                        self._touch(handoff)
                    total += twice
        return total

    # -- lag --------------------------------------------------------------------------

    def set_lag(self, queue: str, lag: int, ts: int) -> None:
        self.lag[queue] = lag
        for client in self.holding.get(queue, ()):
            tenure = self.tenures.get((queue, client))
            handoff = tenure.into if tenure is not None else None
            if handoff is not None and ts - handoff.added_ts <= LAG_WATCH_MS and (
                    handoff.lag_peak is None or lag > handoff.lag_peak):
                handoff.lag_peak = lag
                self._touch(handoff)

    # -- views ------------------------------------------------------------------------

    def forget_before(self, now_ms: int) -> None:
        horizon = now_ms - self.window_ms
        while self.rebalances and self.rebalances[0].last_ts < horizon:
            self._episodes.pop(self.rebalances.popleft().id, None)
            self.version += 1
        for key, tenure in list(self.tenures.items()):
            queue, client = key
            if tenure.last_ts < horizon and client not in self.holding.get(queue, {}):
                del self.tenures[key]
            elif tenure.into is not None and tenure.into.added_ts < horizon:
                tenure.into = None          # its hand-off is forgotten: nothing to charge
                tenure.out_of = [h for h in tenure.out_of if h.added_ts >= horizon]

    def take_changed(self, now_ms: int) -> list[dict]:
        """The settled hand-offs whose figures moved since the last call, as they stand now
        (for the event log: the lag history marks and compares them)."""
        # Only settled moves: one whose new owner lets go before its old owner did may yet
        # turn out no move at all (_new_owner_let_go), and the log cannot take it back.
        settled = {k: h for k, h in self._changed.items() if h.released_ts is not None}
        for key in settled:
            del self._changed[key]
        return [h.to_dict(now_ms, self.silent) | {"rebalance": h.rebalance} for h in settled.values()]

    def snapshot(self, now_ms: int, limit: int = 60) -> dict:
        """Totals over the window and the latest ``limit`` rebalances (summaries)."""
        summaries = [r.summary(now_ms, self.silent) for r in self.rebalances]
        spikes = [s["lag_spike"] for s in summaries if s["lag_spike"] is not None]
        return {
            "window_ms": self.window_ms,
            "totals": {
                "rebalances": len(summaries),
                "moved": sum(s["moved"] for s in summaries),
                "duplicates": measured_sum(s["duplicates"] for s in summaries) if summaries else 0,
                "unmeasured": sum(s.get("unmeasured", 0) for s in summaries),   # moves to or from a peer
                "gap_ms": max((s["gap_ms"] for s in summaries), default=0),
                "overlap_ms": max((s["overlap_ms"] for s in summaries), default=0),
                "lag_spike": max(spikes, default=None),
            },
            "rebalances": summaries[-limit:],
        }

    def saved(self, now_ms: int) -> dict:
        """The window's rebalances with their hand-offs, for the next run of the lab
        (``restore``): the 15-minute story survives a restart. ``saved_ts``: when an overlap
        still running ends (the lab stops with the save)."""
        self.forget_before(now_ms)
        return {"saved_ts": now_ms, "next_id": self._next_id,
                "rebalances": [r.detail(now_ms, self.silent) for r in self.rebalances]}

    def restore(self, saved: dict, now_ms: int) -> None:
        """Take back what ``saved`` gave (before any hand-off of this run): rebalances
        still inside the window, final; new ones are numbered after them."""
        kept = [SavedRebalance(d, saved["saved_ts"]) for d in saved.get("rebalances", ())
                if d["end_ts"] >= now_ms - self.window_ms]
        self.rebalances.extendleft(reversed(kept))
        for r in kept:
            self._episodes[r.id] = r
        self._next_id = max(self._next_id, saved.get("next_id", 1), *(r.id + 1 for r in kept))
        self.version += 1

    def detail(self, rebalance_id: int, now_ms: int) -> dict | None:
        rebalance = self._episodes.get(rebalance_id)
        return rebalance.detail(now_ms, self.silent) if rebalance is not None else None


def handoff_events(group, now_ms: int) -> list:
    """``handoff`` events for a GroupState's hand-offs whose figures moved (event log only;
    a move to or from a peer records -1 duplicates: not measured. Not null: an event's
    to_dict leaves a None field out, and the log's readers expect the field)."""
    return [make_event("handoff", group.name, h["to"], ts=now_ms, topic=group.topic,
                       queue=MessageQueue.from_label(group.topic, h["queue"]), from_clients=h["from"],
                       rebalance=h["rebalance"], added_ts=h["added_ts"], released_ts=h["released_ts"],
                       gap_ms=h["gap_ms"], overlap_ms=h["overlap_ms"],
                       duplicates=h["duplicates"] if h["duplicates"] is not None else -1,
                       lag_spike=h["lag_spike"])
            for h in group.handoffs.take_changed(now_ms)]


def rebalance_detail(group, rebalance_id) -> dict:
    """The answer to GET /api/groups/G/rebalances/ID for a GroupState; LabError when the
    rebalance is unknown or older than the window."""
    if not isinstance(rebalance_id, int) or isinstance(rebalance_id, bool):
        raise LabError(f"rebalance id must be an integer, not {rebalance_id!r}")
    now = now_ms()
    found = group.handoffs.detail(rebalance_id, now)
    if found is None:
        raise LabError(f"group {group.name} has no rebalance {rebalance_id} in the last "
                       f"{group.handoffs.window_ms // 60000} minutes (rebalances that moved no queue are not kept)")
    return {"group": group.name, **found}
