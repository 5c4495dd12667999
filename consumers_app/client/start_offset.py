"""computePullFromWhere: where a newly assigned queue starts (RebalancePushImpl / RebalanceLitePullImpl).

1. The offset store's offset (the broker's committed offset for clustering, the local
   file for broadcasting) if there is one. For a group without one, RocketMQ's broker
   answers 0 when the queue's min offset is 0 and its first message is still stored:
   so a new group consumes such a queue from the start whatever consume_from_where says.
2. Else by ``consume_from_where``: LAST_OFFSET -> the queue's max offset (0 for the
   %RETRY% topic: retries are never skipped); FIRST_OFFSET -> 0, and the first pull's
   OFFSET_ILLEGAL corrects it to the min offset (so a group whose first messages retention
   deleted reports the skip); TIMESTAMP -> the first offset stored at or after
   ``consume_timestamp_ms`` (now - 30 min by default; max offset for %RETRY%).
3. The broker could not be asked, or failed to answer (SYSTEM_BUSY, SYSTEM_ERROR, ...:
   anything but "not found"): skip the queue this time, never read it as "no offset";
   the rebalance is reported unbalanced and retried at minInterval
   (RebalancePushImpl.computePullFromWhereWithException).

A few queues are asked one small call each (concurrently), as RocketMQ asks per queue;
for three or more queues of a topic (a rebalance in a big group moves several at once)
one GetQueueOffsets call answers committed, min and max offsets for the whole topic,
which costs the broker less than a burst of per-queue calls from every consumer.
"""
from __future__ import annotations

import asyncio
import logging
import time

from google.protobuf.timestamp_pb2 import Timestamp

from ..protocol import v2, v2_service
from .config import ConsumeFromWhere
from .connection import check, v2_queue
from .offset_store import ReadOffsetType

log = logging.getLogger(__name__)

RETRY_PREFIX = "%RETRY%"


async def query_offset(connection, mq, policy, timestamp_ms: int = 0, timeout_s: float = 3.0) -> int:
    request = v2_service.QueryOffsetRequest(message_queue=v2_queue(mq), query_offset_policy=policy)
    if policy == v2.TIMESTAMP:
        request.timestamp.CopyFrom(Timestamp(seconds=timestamp_ms // 1000, nanos=(timestamp_ms % 1000) * 1_000_000))
    resp = await connection.v2.QueryOffset(request, metadata=connection.metadata, timeout=timeout_s)
    check(resp.status)
    return resp.offset


async def compute_pull_from_where(consumer, topic: str, mqs) -> dict:
    """{mq: start offset} for the queues that could be computed."""
    config = consumer.config
    store = consumer.offset_store
    connection = consumer.connection
    timeout_s = config.rpc_timeout_ms / 1000
    is_retry = topic.startswith(RETRY_PREFIX)

    async def one(mq):
        store.remove_offset(mq)  # removeDirtyOffset: whatever we had is stale
        last = await store.read_offset(mq, ReadOffsetType.STORE)
        if last >= 0:
            return last
        if last != -1:
            return None
        cfw = config.consume_from_where
        if cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return 0 if is_retry else await query_offset(connection, mq, v2.END, timeout_s=timeout_s)
        if cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0   # "the offset will be fixed by the OFFSET_ILLEGAL process"
        if is_retry:
            return await query_offset(connection, mq, v2.END, timeout_s=timeout_s)
        ts = config.consume_timestamp_ms
        ts = ts if ts is not None else int(time.time() * 1000) - 30 * 60 * 1000
        return await query_offset(connection, mq, v2.TIMESTAMP, ts, timeout_s)

    if len(mqs) >= 3 and hasattr(store, "fetch_offsets"):
        try:
            table = await store.fetch_offsets(topic, mqs)  # mq -> (committed, min, max); {} for local files
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: offsets of %s: %s", consumer.client_id, topic, exc)
            table = None
        if table:
            async def one(mq, _one=one):  # noqa: F811 - same rules, answers already at hand
                if mq not in table:
                    return await _one(mq)   # the broker failed to answer for it: ask alone
                committed, lo, hi = table[mq]
                store.remove_offset(mq)
                if committed < 0 and lo <= 0 < hi:
                    committed = 0  # what the broker's queryConsumerOffset answers here (see 1.)
                if committed >= 0:
                    store.mark_persisted(mq, committed)
                    return committed
                cfw = config.consume_from_where
                if cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
                    return 0 if is_retry else hi
                if cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                    return 0
                return await _one(mq)
    results = await asyncio.gather(*(one(mq) for mq in mqs), return_exceptions=True)
    out = {}
    for mq, offset in zip(mqs, results):
        if isinstance(offset, BaseException):
            log.warning("%s: start offset of %s: %s", consumer.client_id, mq.label, offset)
            continue
        if offset is not None and offset >= 0:
            store.update_offset(mq, offset, False)
            out[mq] = offset
    return out
