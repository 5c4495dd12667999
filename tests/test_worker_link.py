"""The controller's end of a worker's stream (supervisor.py): a command's answer takes
effect in stream order, before the events the worker sent after it.

The answer to ``set_strategy`` carries the consumer's snapshot taken when the command
ran; the rebalance it started reports the new assignment in the next event batch. If
the snapshot were applied when the awaiting request resumes, the reader could already
have applied that newer batch, and the old assignment would stand until the consumer's
next change (the page would show a queue owned twice for good).
"""
import asyncio
import json

import pytest

from consumers_app.events import AssignmentEvent
from consumers_app.lab.state import LabState
from consumers_app.lab.supervisor import Supervisor, WorkerError, WorkerLink
from consumers_app.message_queue import MessageQueue
from consumers_app.protocol import worker_pb2 as pb

pytestmark = pytest.mark.asyncio


def assignment_event(client_id: str, labels: list[str], strategy: str) -> str:
    queues = [MessageQueue("TopicTest", label.split(":")[0], int(label.split(":")[1])) for label in labels]
    return json.dumps(AssignmentEvent(group="GID_LAB", client_id=client_id, mode="push", topic="TopicTest",
                                      queues=queues, strategy=strategy, reason="strategy").to_dict())


async def messages(*items):
    for item in items:
        yield item


def hub_with_state():
    state = LabState()
    state.add_group("GID_LAB", "TopicTest", "push", "AVG")
    state.add_client("c1", "GID_LAB", "push", "w1").status = "running"
    state.groups["GID_LAB"].assignments["c1"] = ["broker-a:0", "broker-a:1"]
    hub = Supervisor(on_events=lambda link, events: [state.apply(e) for e in events], on_lost=lambda link: None)
    return hub, state


async def test_an_answer_is_applied_before_the_events_sent_after_it():
    hub, state = hub_with_state()
    link = WorkerLink("w1", 0)
    hub.links["w1"] = link
    old_snapshot = {"client_id": "c1", "group": "GID_LAB", "strategy": "AVG",
                    "assignments": ["broker-a:0", "broker-a:1"], "queues": {}}
    answer = asyncio.create_task(link.command(
        "consumer", client_id="c1", action="set_strategy",
        on_result=lambda reply: state.apply_client_snapshot(reply["snapshot"])))
    command = await link._outbox.get()
    stream = messages(
        pb.WorkerMessage(reply=pb.CommandReply(id=command.id, result_json=json.dumps(
            {"client_id": "c1", "snapshot": old_snapshot}))),
        pb.WorkerMessage(events=pb.EventBatch(events_json=[
            assignment_event("c1", ["broker-a:0", "broker-a:3"], "AVG_BY_CIRCLE")])),
    )
    await hub._read(link, stream)   # reads both, then the stream ends (the worker is gone)
    reply = await answer
    assert reply["snapshot"]["assignments"] == ["broker-a:0", "broker-a:1"]
    # The newer report stands: the answer's snapshot did not undo it.
    assert state.groups["GID_LAB"].assignments["c1"] == ["broker-a:0", "broker-a:3"]
    assert state.clients["c1"].strategy == "AVG_BY_CIRCLE"


async def test_a_failing_on_result_fails_the_command_not_the_stream():
    hub, state = hub_with_state()
    link = WorkerLink("w1", 0)
    hub.links["w1"] = link

    def broken(reply):
        raise KeyError("snapshot")

    answer = asyncio.create_task(link.command("consumer", client_id="c1", action="hang", on_result=broken))
    command = await link._outbox.get()
    stream = messages(
        pb.WorkerMessage(reply=pb.CommandReply(id=command.id, result_json="{}")),
        pb.WorkerMessage(events=pb.EventBatch(events_json=[
            assignment_event("c1", ["broker-b:2"], "AVG")])),
    )
    await hub._read(link, stream)
    with pytest.raises(KeyError):
        await answer
    assert state.groups["GID_LAB"].assignments["c1"] == ["broker-b:2"]   # the stream went on


async def test_a_gone_worker_fails_what_is_pending():
    hub, _ = hub_with_state()
    link = WorkerLink("w1", 0)
    hub.links["w1"] = link
    answer = asyncio.create_task(link.command("consumer", client_id="c1", action="hang"))
    await link._outbox.get()
    await hub._read(link, messages())   # the stream ends with no answer
    with pytest.raises(WorkerError, match="gone"):
        await answer
