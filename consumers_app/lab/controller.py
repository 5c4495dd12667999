"""The lab controller: runs the lab and answers the dashboard's requests.

It lives in the web process's asyncio loop (``runweb`` / ``runlab``) and

* supervises worker processes (supervisor.py) that host the consumers and producers,
  placing each new client on the least busy worker of a small pool (workers.py);
* folds everything it hears into a LabState (state.py; intake.py): events from the
  workers, membership changes from the broker (LabAdmin.WatchMembership), queue offsets
  polled every second (LabAdmin.GetQueueOffsets; polling.py), and events of its own
  (``fault`` for what it injects, ``broker`` for brokers and queues it changes);
* publishes the coalesced events to the browsers every ``flush_interval`` (bus.publish),
  plus a full snapshot once per poll, from its own task (polling.py): a slow browser or
  channel layer delays only that task, never the intake of events or the answers to requests;
* answers requests one at a time (bus.serve) through the action table (actions.py):
  every request's params are checked first, and a wrong one is a ``LabError`` with
  nothing changed; then its handler (handlers.py) acts.

Killing a consumer aborts it inside its worker (no unregister, no offset persist) and
closes its connection, as a dead process's socket closes: the broker drops it at once
and notifies the group. A *cut* leaves the connection open but silent (the broker
expires it after its channel expiry); a *hang* keeps heartbeats going and stops the
listener. The lab keeps one worker process per few consumers instead of one per
consumer. A worker process that dies takes all of its consumers with it, and the
controller marks them gone when the worker's stream ends.

The class is put together from one mixin per concern, each in a module of its own:
lifecycle.py (start, stop, scenarios), intake.py (events in, waiting for effects),
polling.py (the loops on a clock), recording.py (lag history), handlers.py (the
actions), observing.py (groups watched on a cluster), workers.py (where clients run),
peer_consumers.py (other people's clients). What they share is here: the state and
the few helpers every concern uses.
"""
import asyncio
import functools
import logging
from dataclasses import dataclass

import grpc

from consumers_app.events import Event, now_ms

from consumers_app.remoting.client import RemotingClient

from . import bus
from .disk import DiskPlaces
from .handlers import ActionHandlers
from .intake import EventIntake
from .lifecycle import LabLifecycle
from .observing import Observing
from .peer_consumers import PeerConsumers
from .peers import PeerConsumer
from .polling import PollLoops
from .recording import Recording
from .state import LabState
from .supervisor import Supervisor, WorkerLink, WorkerPool
from .workers import WorkerPlacement

log = logging.getLogger(__name__)

OK = 20000
GONE_GRACE_S = 60.0       # how long a stopped/killed/crashed consumer stays on the page


@dataclass(frozen=True)
class Limits:
    """How big the lab lets a run get (settings LAB_MAX_*; the README states them). Past
    them a request is refused with the limit's name, and nothing changes."""
    consumers: int = 128          # live consumers in the whole lab (LAB_MAX_CONSUMERS)
    group_consumers: int = 64     # live consumers in one group (LAB_MAX_GROUP_CONSUMERS)
    topic_queues: int = 1024      # queues of one topic over all brokers (LAB_MAX_TOPIC_QUEUES)


class LabController(LabLifecycle, EventIntake, PollLoops, Recording, ActionHandlers, Observing,
                    WorkerPlacement, PeerConsumers):
    def __init__(self, broker_address: str, *, pool_size: int = 2, client_options: dict | None = None,
                 adapters: str | None = None, flush_interval: float = 0.1, poll_interval: float = 1.0,
                 recorder_root=None, replace_lost_workers: bool = True, memory=None,
                 gone_grace_s: float = GONE_GRACE_S, observe_interval: float = 1.0,
                 limits: Limits = Limits(), recordings_hours: float = 24, disk: DiskPlaces | None = None,
                 admin=None, cluster: dict | None = None, handoff_story=None, workers=None):
        # The embedded broker's gRPC address; attached to a cluster, its proxy's (pop only).
        self.broker_address = broker_address
        self.limits = limits
        self.pool_size = pool_size
        # Extra constructor options per client kind ("push", "lite_pull", "pop", "producer"),
        # e.g. short heartbeat intervals for tests.
        self.client_options = client_options or {}
        self.flush_interval = flush_interval
        self.poll_interval = poll_interval
        self.started_ms = now_ms()   # what this run records starts here (the history line)
        self.recorder_root = recorder_root
        # Recordings are deleted by the hour once they are this old, so disk stays bounded.
        self.recordings_hours = recordings_hours
        self.state = LabState()
        # Where the clients run (supervisor.WorkerPool): worker processes, unless ``workers``
        # builds the pool another way, called with the two callbacks a Supervisor takes.
        make_pool = workers or functools.partial(Supervisor, adapters=adapters)
        self.supervisor: WorkerPool = make_pool(self._worker_events, self._worker_lost)
        # LabAdmin: the embedded broker's stub (made at start), or a cluster_admin.ClusterAdmin
        # answering the same calls from someone else's cluster; ``cluster`` then says so.
        self.admin = admin
        if cluster is not None:
            self.state.cluster = cluster
        self._channel: grpc.aio.Channel | None = None
        self._hosts: dict[str, WorkerLink] = {}       # client or producer id -> its worker
        # The number the next consumer's name takes (c<N>); a restored lab goes on from the
        # saved one (LabMemory.next_client): a name is never given to two consumers.
        self.next_client = 1
        self._watchers: dict[str, asyncio.Task] = {}
        self._placing = asyncio.Lock()   # concurrent starts must not each spawn a worker
        self._tasks: list[asyncio.Task] = []
        self._snapshot_due = False
        self._recorder = None            # recorder.Recorder, when recording
        self._unrecorded: list[Event] = []
        # Actions waiting for the state they changed: (condition, future), re-checked
        # whenever an event that tells a story (not a figure) has been applied.
        self._waiters: list[tuple] = []
        # A worker that dies is replaced and its consumers restarted under new ids, as an
        # operator's process manager would; the old ids stay in the log as crashed.
        self.replace_lost_workers = replace_lost_workers
        self._replacing: set[asyncio.Task] = set()
        # Where the lab's state is saved for the next start (persistence.LabMemory), if anywhere.
        self.memory = memory
        # Gone consumers and empty groups leave the snapshot after this (their story stays
        # in the membership log), so a lab running for days keeps its frames small.
        self.gone_grace_s = gone_grace_s
        # Where the lab's parts live on disk, measured for the snapshot's "disk" (None: not measured).
        self.disk_places = disk
        # Other people's clients (peers.py) need the broker's name server; runlab sets it.
        self.namesrv: str | None = None
        self._peers: dict[str, PeerConsumer] = {}     # client id -> its process
        # Attached to a cluster: clients being stopped or killed -> how they will go (left, closed).
        self._departing: dict[str, str] = {}
        self._remoting: RemotingClient | None = None   # to ask peers what only remoting carries
        # Groups watched on the cluster (observer.py) are asked this often (seconds).
        self.observe_interval = observe_interval
        # Where the groups' last 15 minutes of hand-offs are kept across restarts
        # (persistence.HandoffStory), if anywhere; what it held waits for its group to exist.
        self.handoff_story = handoff_story
        self._saved_handoffs: dict[str, dict] = {}
        self._story_cache: dict[str, tuple[int, dict]] = {}   # group -> (its hand-offs' version, saved form)

    # -- shared by the concerns ----------------------------------------------------

    @staticmethod
    def _check(response):
        """A LabAdmin answer, or LabError with the broker's reason."""
        if response.status.code not in (0, OK):
            raise bus.LabError(f"broker: {response.status.message or response.status.code}")
        return response

    def _create_group(self, name: str, topic: str, mode: str, strategy: str):
        """A group of the lab's, with its saved hand-offs back and its membership watched."""
        group = self.state.add_group(name, topic, mode, strategy)
        saved = self._saved_handoffs.pop(name, None)
        if saved is not None:
            try:
                group.handoffs.restore(saved, now_ms())
            except (KeyError, TypeError, ValueError) as exc:   # written by another version
                log.warning("ignoring the saved hand-offs of %s: %s", name, exc)
        if name not in self._watchers:
            self._watchers[name] = asyncio.create_task(self._watch_membership(name), name=f"lab-watch-{name}")
        return group

    def _live_clients(self, group: str) -> list[str]:
        return [c.client_id for c in self.state.clients.values() if c.group == group and c.alive]
