"""One gRPC channel to the broker, with the stubs and the metadata every call carries.

Each client owns its Connection (the official clients keep one channel per endpoint per
client): killing a client closes its socket, as a killed process would. Channels use a
local subchannel pool so 64 consumers in one process really get 64 connections instead
of multiplexing all their long polls over one HTTP/2 connection.
"""
from __future__ import annotations

import itertools
import os
import socket
import time

import grpc

from ..protocol import lab, lab_grpc, v2, v2_grpc
from .faults import NetworkCut

CODE_OK = v2.Code.OK
CODE_NOT_FOUND = {v2.Code.NOT_FOUND, v2.Code.TOPIC_NOT_FOUND, v2.Code.OFFSET_NOT_FOUND,
                  v2.Code.CONSUMER_GROUP_NOT_FOUND, v2.Code.MESSAGE_NOT_FOUND}

_index = itertools.count()
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = _BASE36[r] + out
    return out or "0"


def new_client_id() -> str:
    """host@pid@index@base36(time_ns), the official Python client's format."""
    return f"{socket.gethostname()}@{os.getpid()}@{next(_index)}@{_base36(time.time_ns())}"


class BrokerError(Exception):
    """The broker answered with a non-OK status."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(f"{code} {message}".strip())
        self.code = code
        self.message = message

    @property
    def is_not_found(self) -> bool:
        return self.code in CODE_NOT_FOUND


def check(status) -> None:
    """Raise BrokerError unless ``status`` (v2 or lab Status) is OK."""
    code = int(status.code)
    if code != CODE_OK and code != 0:
        raise BrokerError(code, status.message)


class Connection:
    def __init__(self, address: str, client_id: str, language: str = "PYTHON"):
        self.address = address
        self.client_id = client_id
        self.channel = grpc.aio.insecure_channel(address, options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 30_000),
        ])
        self.v2 = v2_grpc.MessagingServiceStub(self.channel)
        self.lab = lab_grpc.LabAdminStub(self.channel)
        # x-mq-client-id is how the broker (like RocketMQ 5's proxy) knows who is calling.
        self.metadata = (
            ("x-mq-client-id", client_id),
            ("x-mq-language", language),
            ("x-mq-protocol", "GRPC_V2"),
        )
        self.closed = False
        self.network = NetworkCut(self)  # the lab's "cut" fault swaps the stubs out

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.channel.close(grace=None)


def resource(name: str):
    return v2.Resource(name=name)


def queue_ref(mq) -> "lab.QueueRef":
    return lab.QueueRef(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


def v2_queue(mq):
    return v2.MessageQueue(topic=resource(mq.topic), id=mq.queue_id, broker=v2.Broker(name=mq.broker_name))
