"""Flow-control decisions: should this queue be pulled now, or later?

Pure functions over a ProcessQueue's figures, so the rules are testable on their own.
They follow DefaultMQPushConsumerImpl.pullMessage and DefaultLitePullConsumerImpl's
PullTaskImpl.run, in the same order (the first limit hit is the reason reported).
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FlowControl:
    reason: str        # "count" | "size" | "span" | "all"
    threshold: int
    value: int


def check_push(pq, threshold_count: int, threshold_size_mib: int, max_span: int, orderly: bool):
    """Push consumer: cached count, cached MiB, then (concurrently only) offset span."""
    if pq.msg_count > threshold_count:
        return FlowControl("count", threshold_count, pq.msg_count)
    size_mib = pq.msg_size // MiB
    if size_mib > threshold_size_mib:
        return FlowControl("size", threshold_size_mib, size_mib)
    if not orderly:
        # consumeConcurrentlyMaxSpan: one slow (or stuck) message holds back the commit
        # offset; stop pulling before the redelivery window after a crash grows huge.
        span = pq.max_span
        if span > max_span:
            return FlowControl("span", max_span, span)
    return None


def check_lite(cached_requests: int, pull_batch_size: int, threshold_for_all: int,
               pq, threshold_count: int, threshold_size_mib: int, max_span: int):
    """Lite pull: the whole consumeRequestCache first, then the queue's count/size/span."""
    estimated = cached_requests * pull_batch_size
    if estimated > threshold_for_all:
        return FlowControl("all", threshold_for_all, estimated)
    if pq.msg_count > threshold_count:
        return FlowControl("count", threshold_count, pq.msg_count)
    size_mib = pq.msg_size // MiB
    if size_mib > threshold_size_mib:
        return FlowControl("size", threshold_size_mib, size_mib)
    span = pq.max_span
    if span > max_span:
        return FlowControl("span", max_span, span)
    return None


def per_queue_threshold(for_topic: int, per_queue: int, queue_count: int) -> int:
    """RebalancePushImpl.messageQueueChanged: a topic-wide limit split over the queues."""
    if for_topic == -1 or queue_count <= 0:
        return per_queue
    return max(1, for_topic // queue_count)
