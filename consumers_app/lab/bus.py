"""The seam between web processes and the lab controller: the Channels layer.

Every web process (API views, websocket consumers) talks to the one controller the
same way, whether it shares the controller's process (in-memory layer) or not
(channels-redis, several web processes):

* requests: ``await request("set_strategy", group="GID_LAB", strategy="AVG")`` sends
  to the controller's channel and awaits its reply. The controller answers with the new
  state, or with an error message (``LabError``: HTTP 400, nothing changed).
* events: the controller ``publish()``es batches of events (DESIGN.md schema) to the
  ``lab`` group; each websocket consumer in that group forwards them one frame each.

Actions and their params (the controller validates them; see controller.py):
  state                         -> snapshot
  set_strategy  group, strategy -> snapshot
  set_mode      group, mode     -> snapshot
  add_consumer  group, mode     -> {"client_id": ..., "state": snapshot}
  consumer      client_id, action (stop|kill|hang|resume|slow|fail), ms?, ratio? -> snapshot
  producer_rate topic, rate     -> snapshot
  producer_burst topic, count   -> snapshot
  queues        topic, delta, broker? -> snapshot
  broker        broker, online  -> snapshot
  health                        -> {"ok": bool, "broker_process": {...}}

Read-only actions (state, health) are answered at once; the others one at a time, in
arrival order, so two changes never interleave. A request carries its caller's deadline:
one still queued when its caller gave up (and answered 503) is dropped, never applied late.
"""
import asyncio
import time
from typing import Awaitable, Callable

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

CONTROLLER_CHANNEL = "lab-controller"
EVENTS_GROUP = "lab"


class LabError(Exception):
    """A request the controller refused: bad input or an impossible action. Nothing changed."""


class LabUnavailable(Exception):
    """No controller answered in time."""


async def request(action: str, /, timeout: float = 15.0, **params) -> dict:
    # action is positional-only: the "consumer" action has a param named action too.
    layer = get_channel_layer()
    # The layer's default prefix, not one of our own: channels-redis reads all of a process's
    # channels through one receive loop only when they share that prefix; a reply channel
    # with another prefix starves while a websocket consumer of the same process waits.
    reply_channel = await layer.new_channel()
    try:
        await layer.send(CONTROLLER_CHANNEL, {
            "type": "lab.request", "action": action, "params": params, "reply_to": reply_channel,
            "deadline": time.time() + timeout,
        })
    except ChannelFull:
        raise LabUnavailable("the lab controller is busy (its request queue is full); try again") from None
    try:
        reply = await asyncio.wait_for(layer.receive(reply_channel), timeout)
    except asyncio.TimeoutError:
        raise LabUnavailable(f"the lab controller did not answer {action!r} within {timeout:g}s") from None
    if reply.get("error") is not None:
        raise LabError(reply["error"])
    return reply["result"]


Handler = Callable[[str, dict], Awaitable[dict]]

READ_ONLY_ACTIONS = frozenset({"state", "health"})


async def serve(handler: Handler) -> None:
    """Controller side: answer requests until cancelled.

    ``handler(action, params)`` returns the result or raises LabError. Read-only actions
    are answered as they arrive; changes go through one queue, so they never interleave,
    and a change whose caller's deadline passed while it waited is dropped unapplied.
    """
    layer = get_channel_layer()
    changes: asyncio.Queue = asyncio.Queue()

    async def answer(message) -> None:
        try:
            reply = {"result": await handler(message["action"], message.get("params") or {}), "error": None}
        except LabError as exc:
            reply = {"result": None, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the caller gets a reason, the loop lives on
            reply = {"result": None, "error": f"internal error: {type(exc).__name__}: {exc}"}
        try:
            await layer.send(message["reply_to"], {"type": "lab.reply", **reply})
        except Exception:  # noqa: BLE001 - the requester went away; nothing to do
            pass

    async def apply_changes() -> None:
        while True:
            message = await changes.get()
            deadline = message.get("deadline")
            if deadline is not None and time.time() >= deadline:
                continue   # its caller already answered 503: applying it now would surprise them
            await answer(message)

    applier = asyncio.get_running_loop().create_task(apply_changes(), name="lab-changes")
    readers: set[asyncio.Task] = set()
    try:
        while True:
            message = await layer.receive(CONTROLLER_CHANNEL)
            if message.get("action") in READ_ONLY_ACTIONS:
                task = asyncio.get_running_loop().create_task(answer(message))
                readers.add(task)
                task.add_done_callback(readers.discard)
            else:
                changes.put_nowait(message)
    finally:
        applier.cancel()
        for task in readers:
            task.cancel()


async def publish(events: list[dict]) -> None:
    """Send one batch of events to every websocket consumer of the ``lab`` group."""
    if events:
        await get_channel_layer().group_send(EVENTS_GROUP, {"type": "lab.events", "events": events})
