"""The live websocket `ws/lab/`: one snapshot, then the lab's events, one per frame.

    -> {"type": "snapshot", "groups": {...}, ...}       the controller's state on connect
    -> {"ts": ..., "type": "assignment", "group": ..., "client_id": ..., ...}   one event per frame
    <- {"type": "ack", "received": N}   (optional) frames received so far, see below
    <- {"type": "snapshot"}             (optional) ask for a fresh snapshot

Nobody waits for a slow reader. The controller's group_send never blocks: the channel
layer drops messages for a consumer whose channel is full. A consumer that falls behind
skips the backlog and sends a fresh snapshot instead of replaying stale events:
* its own backlog: a batch whose newest event is older than STALE_AFTER_MS;
* a slow browser: a page that acks (lab.js does) and is more than MAX_UNACKED frames
  behind gets no events until it has caught up, then a fresh snapshot.
"""
import json

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from consumers_app.events import now_ms
from consumers_app.lab import bus

STALE_AFTER_MS = 5_000
MAX_UNACKED = 2_000
# Close code when the controller does not answer: 1013 "try again later" would say it,
# but daphne (autobahn) only sends 1000 or 3000-4999.
LAB_UNAVAILABLE = 4503
NO_SUCH_SOCKET = 4404


class UnknownWebsocket(AsyncWebsocketConsumer):
    """Any other websocket path: accepted only to say why it is closed at once."""

    async def connect(self):
        await self.accept()
        await self.close(code=NO_SUCH_SOCKET, reason=f"no websocket at {self.scope['path']}; use /ws/lab/"[:120])


class LabConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        allowed = settings.DASHBOARD_PUBLIC_READ or (user is not None and user.is_authenticated)
        if self.scope.get("token_rejected") or not allowed:
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        self.sent = 0           # frames sent
        self.acked = None       # frames the page says it received; None: a script that never acks
        self.waiting_for_page = False
        self.skipped_stale = False
        self.has_snapshot = False
        # Join before asking for the state, so no event falls between the two.
        await self.channel_layer.group_add(bus.EVENTS_GROUP, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(bus.EVENTS_GROUP, self.channel_name)

    async def send_snapshot(self) -> bool:
        try:
            snapshot = await bus.request("state")
        except (bus.LabUnavailable, bus.LabError) as exc:
            if not self.has_snapshot:   # nothing to show without a first state
                await self.close(code=LAB_UNAVAILABLE, reason=str(exc)[:100])
            else:                       # a busy moment: keep the page, catch up on the next batch
                self.skipped_stale = True
            return False
        await self._send({**snapshot, "type": "snapshot"})
        self.has_snapshot = True
        return True

    async def _send(self, frame: dict) -> None:
        await self.send(text_data=json.dumps(frame, separators=(",", ":")))
        self.sent += 1

    async def lab_events(self, message):
        """A batch from bus.publish(): forward each event as its own frame."""
        events = message.get("events") or []
        if not events or self.waiting_for_page:
            return
        stamps = [e["ts"] for e in events if isinstance(e.get("ts"), int)]  # a snapshot has none
        if stamps and now_ms() - max(stamps) > STALE_AFTER_MS:
            self.skipped_stale = True
            return
        if self.skipped_stale:
            self.skipped_stale = False
            if not await self.send_snapshot():
                return
        for event in events:
            await self._send(event)
        if self.acked is not None and self.sent - self.acked > MAX_UNACKED:
            self.waiting_for_page = True

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "ack" and isinstance(message.get("received"), int):
            self.acked = message["received"]
            if self.waiting_for_page and self.acked >= self.sent:
                self.waiting_for_page = False
                await self.send_snapshot()
        elif message.get("type") == "snapshot":
            await self.send_snapshot()
