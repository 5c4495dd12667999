"""Wiring: BrokerCore + the two gRPC services on one grpc.aio server (and, with
``namesrv_port``, the remoting name server and brokers), signal handling.

Start-up: open (load topics/offsets, recover the commit log), bind, start, then print
``name server listening on HOST:PORT`` when remoting is on and, last, exactly one line
``broker listening on HOST:PORT`` (flushed) - tests and the lab wait for it. SIGTERM/SIGINT: stop accepting, persist offsets and topics, fsync, exit 0.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import grpc

from ..protocol import lab_grpc, v2_grpc
from .admin_service import LabAdminService
from .core import BrokerConfig, BrokerCore
from .messaging_service import MessagingService

log = logging.getLogger(__name__)

# Room for a batch of max-size bodies in one request/response.
MAX_MESSAGE = 256 * 1024 * 1024


async def serve(cfg: BrokerConfig, ready=None) -> int:
    core = BrokerCore(cfg)
    core.open()
    server = grpc.aio.server(options=[
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.so_reuseport", 0),
        # Calls that reached grpc's core before our loop picked them up: above 1,000 core
        # drops them at random, above 3,000 all (its defaults), as CANCELLED, which the
        # client cannot tell from a cancel of its own. A 128 x 1024 lab's rebalance bursts
        # past that (the members' new long polls, offsets, routes at once): start-up waited
        # 30 s for the route poll of a member whose route query was dropped. The proxy's
        # thread pools each queue 10,000 (ProxyConfig.grpc*ThreadQueueCapacity).
        ("grpc.server.max_pending_requests", 10_000),
        ("grpc.server.max_pending_requests_hard_limit", 20_000),
    ])
    v2_grpc.add_MessagingServiceServicer_to_server(MessagingService(core, (cfg.host, cfg.port)), server)
    lab_grpc.add_LabAdminServicer_to_server(LabAdminService(core), server)
    try:
        # grpcio reports a failed bind by returning 0 in old releases, raising in new ones.
        bound = server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind {cfg.host}:{cfg.port} (address in use?)")
    await core.start()
    await server.start()
    remoting = None
    if cfg.namesrv_port is not None:
        from .remoting.service import RemotingService
        remoting = RemotingService(core, cfg.host, cfg.namesrv_port, cfg.remoting_port)
        namesrv_port = await remoting.start()
        # Printed before the "listening" line, which callers wait for: both are known then.
        sys.stdout.write(f"name server listening on {cfg.host}:{namesrv_port}\n")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(f"broker listening on {cfg.host}:{bound}\n")
    sys.stdout.flush()
    if ready is not None:
        ready(core, bound)
    await stop.wait()
    log.info("broker stopping")
    # Wake held long polls first so the grace period is not spent waiting on them.
    core.longpoll.wake_all()
    if remoting is not None:
        await remoting.stop()
    await server.stop(grace=1.0)
    await core.shutdown()
    return 0


def run(cfg: BrokerConfig) -> int:
    profile = os.environ.get("BROKER_PROFILE")  # dev aid: cProfile stats written at shutdown
    if not profile:
        return asyncio.run(serve(cfg))
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        return asyncio.run(serve(cfg))
    finally:
        prof.disable()
        prof.dump_stats(profile)
