"""The worker process body: hosts consumers and producers for the lab controller.

``python manage.py runworker --controller HOST:PORT --worker-id N`` dials the
controller's WorkerHub and keeps one bidirectional stream open (worker.proto):

* up: ``Hello`` first, then every event the hosted clients emit on
  ``consumers_app.events.emitter`` (batched every 50 ms, JSON each) and a
  ``CommandReply`` per command;
* down: commands (``add_consumer``, ``consumer``, ``add_producer``, ``producer``,
  ``shutdown``), each with an id echoed in its reply.

When the stream ends the controller is gone, so the worker shuts its clients down
gracefully (the broker hears their goodbyes) and exits. The clients themselves are
built by an adapter module (``consumers_app.lab.clients`` by default) so this file
knows nothing of their constructors.
"""
import asyncio
import importlib
import json
import logging
import os
import signal
from collections import deque

import grpc

from consumers_app.events import Event, emitter
from consumers_app.lab.lifeline import die_with_parent
from consumers_app.protocol import worker_pb2 as pb
from consumers_app.protocol import worker_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

EVENT_BATCH_INTERVAL = 0.05
STOP_TIMEOUT = 5.0        # one consumer's stop or kill
SHUTDOWN_TIMEOUT = 5.0    # every client, when the worker exits (a cut one's goodbye never gets out)


class CommandError(Exception):
    """A command the worker cannot carry out; the reason goes back to the controller."""


class Worker:
    def __init__(self, worker_id: str, adapters="consumers_app.lab.clients"):
        self.worker_id = worker_id
        # A module's name (--adapters), or an object with the same functions.
        self.adapters = importlib.import_module(adapters) if isinstance(adapters, str) else adapters
        self.consumers: dict[str, object] = {}
        self.producers: dict[str, object] = {}
        self._outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._events: deque[Event] = deque()   # appended from any thread, drained by the loop
        self._stopping = asyncio.Event()
        self._running: set[asyncio.Task] = set()   # commands in progress (the loop keeps weak refs)

    # -- the stream ----------------------------------------------------------------

    async def run(self, controller_address: str) -> None:
        loop = asyncio.get_running_loop()
        unsubscribe = emitter.subscribe(self._events.append)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        self._outbox.put_nowait(pb.WorkerMessage(hello=pb.Hello(worker_id=self.worker_id, pid=os.getpid())))
        batcher = asyncio.create_task(self._batch_events())
        async with grpc.aio.insecure_channel(controller_address) as channel:
            call = pb_grpc.WorkerHubStub(channel).Connect(self._messages())
            commands = asyncio.create_task(self._take_commands(call))
            stopping = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([commands, stopping], return_when=asyncio.FIRST_COMPLETED)
            await self.shutdown_clients()
            self._flush_events()
            self._outbox.put_nowait(None)
            commands.cancel()
            stopping.cancel()
            call.cancel()
        batcher.cancel()
        unsubscribe()

    async def _messages(self):
        while (message := await self._outbox.get()) is not None:
            yield message

    async def _take_commands(self, call) -> None:
        try:
            async for command in call:
                # Concurrently: a graceful stop that takes seconds must not hold up a kill.
                task = asyncio.create_task(self._execute(command))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
        except grpc.aio.AioRpcError as exc:
            log.info("worker %s: controller stream ended: %s", self.worker_id, exc.code())

    async def _batch_events(self) -> None:
        while True:
            await asyncio.sleep(EVENT_BATCH_INTERVAL)
            self._flush_events()

    def _flush_events(self) -> None:
        events = []
        while self._events:
            events.append(self._events.popleft())
        if events:
            batch = pb.EventBatch(events_json=[json.dumps(e.to_dict()) for e in events])
            self._outbox.put_nowait(pb.WorkerMessage(events=batch))

    async def _execute(self, command: pb.ControllerCommand) -> None:
        reply = pb.CommandReply(id=command.id)
        try:
            params = json.loads(command.params_json or "{}")
            handler = getattr(self, f"do_{command.action}", None)
            if handler is None:
                raise CommandError(f"unknown worker command {command.action!r}")
            reply.result_json = json.dumps(await handler(**params), default=str)
        except CommandError as exc:
            reply.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the worker lives on
            reply.error = f"{type(exc).__name__}: {exc}"
            log.exception("worker %s: command %s failed", self.worker_id, command.action)
        # Events the command caused travel before its reply, so the controller's state
        # already holds them when the reply resumes the request.
        self._flush_events()
        self._outbox.put_nowait(pb.WorkerMessage(reply=reply))

    # -- commands ------------------------------------------------------------------

    async def do_add_consumer(self, **params) -> dict:
        consumer = self.adapters.make_consumer(**params)
        await consumer.start()
        self.consumers[consumer.client_id] = consumer
        return {"client_id": consumer.client_id, "snapshot": consumer.snapshot()}

    def _consumer(self, client_id: str):
        try:
            return self.consumers[client_id]
        except KeyError:
            raise CommandError(f"worker {self.worker_id} hosts no consumer {client_id!r}") from None

    async def do_consumer(self, client_id: str, action: str, **params) -> dict:
        consumer = self._consumer(client_id)
        if action in ("stop", "kill"):
            del self.consumers[client_id]
            # stop says goodbye (unregister, offsets persisted); kill just dies.
            try:
                await asyncio.wait_for(consumer.shutdown() if action == "stop" else consumer.abort(), STOP_TIMEOUT)
            except asyncio.TimeoutError:
                # Gone from the lab either way; if no goodbye got out, the broker expires it.
                log.warning("worker %s: %s of %s took over %gs", self.worker_id, action, client_id, STOP_TIMEOUT)
            return {"client_id": client_id}
        if action == "hang":
            consumer.hang()
        elif action == "cut":
            consumer.cut()
        elif action == "resume":
            consumer.resume()
        elif action == "slow":
            consumer.set_slow(params["ms"])
        elif action == "fail":
            consumer.set_fail_ratio(params["ratio"])
        elif action == "set_strategy":
            consumer.set_strategy(params["strategy"], **params.get("options", {}))
        else:
            raise CommandError(f"unknown consumer action {action!r}")
        return {"client_id": client_id, "snapshot": consumer.snapshot()}

    async def do_add_producer(self, **params) -> dict:
        producer = self.adapters.make_producer(**params)
        await self.adapters.start_producer(producer)
        self.producers[params["producer_id"]] = producer
        return {"producer_id": params["producer_id"]}

    async def do_producer(self, producer_id: str, action: str, **params) -> dict:
        producer = self.producers.get(producer_id)
        if producer is None:
            raise CommandError(f"worker {self.worker_id} hosts no producer {producer_id!r}")
        if action == "rate":
            self.adapters.set_rate(producer, params["rate"])
        elif action == "burst":
            self.adapters.burst(producer, params["count"])
        else:
            raise CommandError(f"unknown producer action {action!r}")
        return {"producer_id": producer_id}

    async def do_shutdown(self) -> dict:
        self._stopping.set()
        return {}

    async def shutdown_clients(self) -> None:
        clients = {**self.consumers, **self.producers}
        self.consumers.clear()
        self.producers.clear()
        if not clients:
            return
        tasks = {asyncio.ensure_future(client.shutdown()): name for name, client in clients.items()}
        done, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("worker %s: %s's shutdown failed: %r", self.worker_id, tasks[task], task.exception())
        if pending:   # named: which client's goodbye (persist, unregister) did not get through
            log.warning("worker %s: %s did not shut down within %gs", self.worker_id,
                        ", ".join(sorted(tasks[task] for task in pending)), SHUTDOWN_TIMEOUT)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=1.0)


def run(controller_address: str, worker_id: str, adapters: str = "consumers_app.lab.clients") -> None:
    die_with_parent()   # a worker never outlives the lab that started it, even a SIGKILLed one
    asyncio.run(Worker(worker_id, adapters).run(controller_address))


def main(argv=None) -> None:
    """``python -m consumers_app.lab.worker``: what the supervisor starts.

    The same as ``manage.py runworker``, which the ``channels`` app shadows with its own
    runworker as long as it comes before consumers_app in INSTALLED_APPS.
    """
    import argparse

    import django

    parser = argparse.ArgumentParser(prog="python -m consumers_app.lab.worker")
    parser.add_argument("--controller", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--adapters", default="consumers_app.lab.clients")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    run(args.controller, args.worker_id, args.adapters)


if __name__ == "__main__":
    main()
