"""Worker processes and the WorkerHub they dial (worker.proto).

The supervisor listens on an ephemeral 127.0.0.1 port, starts workers as
``python -m consumers_app.lab.worker --controller 127.0.0.1:PORT --worker-id wN``
(the same as ``manage.py runworker ...``) and gives
the controller one ``WorkerLink`` per connected worker to send commands through.
A worker's stream ending (it exited, crashed or was SIGKILLed) is reported once via
``on_lost(link)``: whatever it hosted is gone. Not after ``stop()``: a worker told to shut
down is not lost (replacing it would start a worker the stop then waits out and kills).

``WorkerPool`` is what the controller asks of it: the seam where the lab meets its worker
processes (the web tests put in-process workers with fake clients there).
"""
import asyncio
import itertools
import json
import logging
import sys
from typing import Callable, Protocol

import grpc
from django.conf import settings

from consumers_app.events import event_from_dict
from consumers_app.lab.lifeline import child_env
from consumers_app.protocol import worker_pb2 as pb
from consumers_app.protocol import worker_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT = 60.0
COMMAND_TIMEOUT = 30.0


class WorkerError(Exception):
    """A worker refused or failed a command (its reason), or is gone."""


class WorkerLink:
    """The controller's end of one worker's stream: send a command, await its reply."""

    def __init__(self, worker_id: str, pid: int):
        self.worker_id = worker_id
        self.pid = pid
        self.connected = True
        self._outbox: asyncio.Queue[pb.ControllerCommand | None] = asyncio.Queue()
        self._pending: dict[int, tuple[asyncio.Future, Callable | None]] = {}   # id -> (answer, on_result)
        self._ids = itertools.count(1)

    async def command(self, name: str, timeout: float = COMMAND_TIMEOUT, on_result=None, **params) -> dict:
        """Send one command and await its answer. ``on_result(answer)`` runs when the answer
        is read, in stream order: before any event the worker sent after it is applied.
        (The awaiting caller resumes later, after the reader may have applied newer events:
        a snapshot in the answer applied then would undo them.)"""
        if not self.connected:
            raise WorkerError(f"worker {self.worker_id} is gone")
        command_id = next(self._ids)
        reply = asyncio.get_running_loop().create_future()
        self._pending[command_id] = (reply, on_result)
        self._outbox.put_nowait(pb.ControllerCommand(id=command_id, action=name, params_json=json.dumps(params)))
        try:
            return await asyncio.wait_for(reply, timeout)
        except asyncio.TimeoutError:
            raise WorkerError(f"worker {self.worker_id} did not answer {name!r} within {timeout:g}s") from None
        finally:
            self._pending.pop(command_id, None)

    def _replied(self, reply: pb.CommandReply) -> None:
        future, on_result = self._pending.get(reply.id, (None, None))
        if future is None or future.done():
            return
        if reply.error:
            future.set_exception(WorkerError(reply.error))
            return
        result = json.loads(reply.result_json or "{}")
        try:
            if on_result is not None:
                on_result(result)
        except Exception as exc:  # noqa: BLE001 - the caller hears of it, the stream goes on
            future.set_exception(exc)
        else:
            future.set_result(result)

    def _disconnected(self) -> None:
        self.connected = False
        self._outbox.put_nowait(None)
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(WorkerError(f"worker {self.worker_id} is gone"))


class WorkerPool(Protocol):
    """Where the controller's clients run. Made with ``on_events(link, events)`` and
    ``on_lost(link)``; each link has ``worker_id``, ``connected`` and ``await command(name,
    on_result=None, **params)`` as WorkerLink has (a refusal or a gone worker is a WorkerError;
    ``on_result`` sees the answer before any event the worker sent after it)."""
    links: dict[str, WorkerLink]   # worker id -> its link, while connected

    async def start(self) -> None: ...

    async def spawn(self) -> WorkerLink:
        """One more worker, ready for commands."""

    async def stop(self) -> None:
        """Every worker shut down; none of them reported lost."""


class Supervisor(pb_grpc.WorkerHubServicer):
    def __init__(self, on_events: Callable[[WorkerLink, list[dict]], None],
                 on_lost: Callable[[WorkerLink], None], adapters: str | None = None):
        self.on_events = on_events
        self.on_lost = on_lost
        self.adapters = adapters
        self.links: dict[str, WorkerLink] = {}
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self._hello: dict[str, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._server: grpc.aio.Server | None = None
        self._stopping = False
        self.port = 0

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_WorkerHubServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()

    # -- the hub -------------------------------------------------------------------

    async def Connect(self, request_iterator, context):
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("hello"):
            return
        link = WorkerLink(first.hello.worker_id, first.hello.pid)
        self.links[link.worker_id] = link
        hello = self._hello.get(link.worker_id)
        if hello is not None and not hello.done():
            hello.set_result(link)
        reader = asyncio.create_task(self._read(link, request_iterator))
        try:
            while (command := await link._outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()

    async def _read(self, link: WorkerLink, request_iterator) -> None:
        try:
            async for message in request_iterator:
                if message.HasField("events"):
                    self.on_events(link, [event_from_dict(json.loads(e)) for e in message.events.events_json])
                elif message.HasField("reply"):
                    link._replied(message.reply)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception:  # noqa: BLE001 - a bad message from one worker must not kill the hub
            log.exception("worker %s: bad message on the stream", link.worker_id)
        finally:
            if link.connected:
                link._disconnected()
                self.links.pop(link.worker_id, None)
                if not self._stopping:
                    self.on_lost(link)

    # -- processes -----------------------------------------------------------------

    async def spawn(self) -> WorkerLink:
        """Start one worker process and wait until it has dialled in."""
        worker_id = f"w{next(self._ids)}"
        hello = self._hello[worker_id] = asyncio.get_running_loop().create_future()
        args = [sys.executable, "-m", "consumers_app.lab.worker",
                "--controller", f"127.0.0.1:{self.port}", "--worker-id", worker_id]
        if self.adapters:
            args += ["--adapters", self.adapters]
        # Its own session: a Ctrl-C on the lab reaches the controller, which stops the
        # workers in order; a worker whose controller vanished exits by itself, and one
        # whose parent died (even SIGKILLed) follows it (lifeline).
        process = self.processes[worker_id] = await asyncio.create_subprocess_exec(
            *args, cwd=settings.BASE_DIR, start_new_session=True, env=child_env())
        exited = asyncio.create_task(process.wait())
        try:
            done, _ = await asyncio.wait([hello, exited], timeout=WORKER_START_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
            if hello not in done:
                if process.returncode is None:
                    process.kill()
                raise WorkerError(f"worker {worker_id} did not start (exit code {process.returncode})")
            return hello.result()
        finally:
            exited.cancel()
            self._hello.pop(worker_id, None)

    async def stop(self, timeout: float = 7.0) -> None:
        """Ask every worker to shut its clients down, then make sure they exited: all at
        once, so a lab's stop takes as long as its slowest worker, not their sum."""
        self._stopping = True

        async def shutdown(link) -> None:
            try:
                await link.command("shutdown", timeout=2.0)
            except WorkerError:
                pass

        async def gone(worker_id, process) -> None:
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("worker %s did not exit; killing it", worker_id)
                process.kill()
                await process.wait()

        await asyncio.gather(*(shutdown(link) for link in list(self.links.values())))
        await asyncio.gather(*(gone(w, p) for w, p in list(self.processes.items())))
        self.processes.clear()
        if self._server is not None:
            await self._server.stop(grace=1.0)
