"""A burst of calls larger than grpc's default backlog (1,000 calls waiting for the broker's
loop to pick them up; core then drops calls as CANCELLED) is answered in full: what a
128 x 1024 lab's rebalance sends at once. Over real gRPC to a broker process."""
from __future__ import annotations

import asyncio

import grpc

from consumers_app.protocol import v2, v2_grpc
from consumers_app.protocol import v2_service as svc

BURST = 6_000      # 2,890 of them came back CANCELLED with grpc's defaults
CHANNELS = 16


async def test_a_burst_of_calls_past_grpcs_default_backlog_is_answered_in_full(broker):
    channels = [grpc.aio.insecure_channel(broker.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(CHANNELS)]
    try:
        stubs = [v2_grpc.MessagingServiceStub(channel) for channel in channels]
        request = svc.QueryRouteRequest(topic=v2.Resource(name="TopicTest"))
        for stub in stubs:   # connected before the burst
            assert (await stub.QueryRoute(request, timeout=30)).status.code == v2.Code.OK
        answers = await asyncio.gather(*(stubs[i % CHANNELS].QueryRoute(request, timeout=120) for i in range(BURST)),
                                       return_exceptions=True)
        failed = [a for a in answers if isinstance(a, Exception)]
        assert not failed, f"{len(failed)} of {BURST} failed, e.g. {failed[0]!r}"
        assert all(a.status.code == v2.Code.OK and len(a.message_queues) == 8 for a in answers)
    finally:
        for channel in channels:
            await channel.close()
