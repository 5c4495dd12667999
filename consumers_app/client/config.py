"""Every knob of our clients, with Apache RocketMQ's default (see rocketmq-defaults.md).

Field names are the Java names in snake_case; the comment says where the default comes
from. Intervals are in milliseconds like the Java code, so a lab scenario can shorten
any of them (a demo should not wait 120 s for an expiry).
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"      # each message to one consumer of the group
    BROADCASTING = "BROADCASTING"  # each message to every consumer of the group


class ConsumeFromWhere(enum.Enum):
    """Where a queue with no committed offset starts (RebalancePushImpl.computePullFromWhere)."""
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class ConsumeResult(enum.Enum):
    """What a listener returns for its messages (ConsumeConcurrentlyStatus).

    For an orderly listener RECONSUME_LATER means SUSPEND_CURRENT_QUEUE_A_MOMENT: the
    queue pauses ``suspend_current_queue_time_ms`` and the same message is retried.
    """
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


#: The broker's delay levels (MessageStoreConfig.messageDelayLevel); level 1 = 1 s.
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".split()


@dataclass
class ClientConfig:
    """ClientConfig: what every client shares."""
    endpoints: str = "127.0.0.1:8081"
    #: A name server (HOST:PORT): speak RocketMQ's remoting protocol, as Java clients do,
    #: instead of gRPC to ``endpoints`` (push and lite-pull consumers; see remoting_connection.py).
    namesrv: str = ""
    #: None = generated like the official client: host@pid@index@base36(time).
    client_id: str | None = None
    #: 4.x heartbeatBrokerInterval (30 s). Our push/lite-pull consumers are 4.x-style
    #: clients, so we keep 4.x's figure; the broker expires a client after 120 s silent.
    heartbeat_interval_ms: int = 30_000
    #: pollNameServerInterval: how often the topic route (queue list) is refreshed.
    poll_name_server_interval_ms: int = 30_000
    #: persistConsumerOffsetInterval.
    persist_consumer_offset_interval_ms: int = 5_000
    #: pullTimeDelayMillsWhenException (ClientConfig, effective since 4.6).
    pull_time_delay_ms_when_exception: int = 1_000
    #: mqClientApiTimeout: deadline of ordinary (non long-polling) calls.
    rpc_timeout_ms: int = 3_000
    #: Lab: how often per-queue ``pq`` figures are emitted (only queues that changed).
    pq_event_interval_ms: int = 500
    #: Lab: how often ``consume`` counts are emitted (ok/retry/fail in the interval).
    consume_event_interval_ms: int = 1_000
    #: Lab: at most one ``flow_control`` event per queue and reason in this interval
    #: (RocketMQ logs only every 1000th flow-control; we count every one).
    flow_control_event_interval_ms: int = 1_000


@dataclass
class PushConsumerConfig(ClientConfig):
    """DefaultMQPushConsumer + DefaultMQPushConsumerImpl + RebalanceService."""
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    #: ms since epoch for CONSUME_FROM_TIMESTAMP; None = now - 30 min (RocketMQ's default).
    consume_timestamp_ms: int | None = None
    allocate_strategy: str = "AVG"
    consume_thread_min: int = 20
    consume_thread_max: int = 20
    consume_concurrently_max_span: int = 2_000
    pull_threshold_for_queue: int = 1_000
    pull_threshold_size_for_queue_mib: int = 100
    pull_threshold_for_topic: int = -1
    pull_threshold_size_for_topic_mib: int = -1
    pull_interval_ms: int = 0
    consume_message_batch_max_size: int = 1
    pull_batch_size: int = 32
    #: -1 => 16 for concurrently, unlimited for orderly (getMaxReconsumeTimes).
    max_reconsume_times: int = -1
    suspend_current_queue_time_ms: int = 1_000
    pull_time_delay_ms_when_cache_flow_control: int = 50
    pull_time_delay_ms_when_broker_flow_control: int = 20
    pull_time_delay_ms_when_suspend: int = 1_000
    #: BROKER_SUSPEND_MAX_TIME_MILLIS: long-poll hold the broker may apply to a pull.
    broker_suspend_max_time_ms: int = 15_000
    #: CONSUMER_TIMEOUT_MILLIS_WHEN_SUSPEND: client deadline of a long-polling pull.
    consumer_timeout_ms_when_suspend: int = 30_000
    #: RebalanceService waitInterval / minInterval.
    rebalance_wait_interval_ms: int = 20_000
    rebalance_min_interval_ms: int = 1_000
    #: RocketMQ 5's updateProcessQueueTableInRebalance dispatches a new queue's first pull
    #: this much later (dispatchPullRequest(pullRequestList, 500)); 4.x pulled at once.
    dispatch_pull_delay_ms: int = 500
    #: ProcessQueue.PULL_MAX_IDLE_TIME: a queue not pulled for this long is dropped.
    pull_max_idle_time_ms: int = 120_000
    #: Orderly: REBALANCE_LOCK_INTERVAL (re-lock every 20 s), REBALANCE_LOCK_MAX_LIVE_TIME,
    #: MAX_TIME_CONSUME_CONTINUOUSLY, and UNLOCK_DELAY_TIME_MILLS: how old a removed
    #: queue's lock must be before it is force-unlocked while still consuming (5.2+).
    rebalance_lock_interval_ms: int = 20_000
    rebalance_lock_max_live_time_ms: int = 30_000
    max_time_consume_continuously_ms: int = 60_000
    unlock_delay_time_ms: int = 20_000
    #: Where failed send-backs are retried locally (submitConsumeRequestLater: 5 s).
    consume_request_later_delay_ms: int = 5_000
    #: BROADCASTING: LocalFileOffsetStore directory (RocketMQ: ~/.rocketmq_offsets).
    offset_store_dir: str = field(default_factory=lambda: os.environ.get(
        "ROCKETMQ_OFFSETS_DIR", os.path.join(os.path.expanduser("~"), ".rocketmq_offsets")))
    #: Lab: hand the consume pool batches of this many ms of listener time instead of one
    #: task per message. The listener still gets one message per call
    #: (consume_message_batch_max_size); only the dispatch to threads is amortised.
    consume_dispatch_budget_ms: float = 2.0

    def effective_max_reconsume_times(self, orderly: bool) -> int:
        if self.max_reconsume_times != -1:
            return self.max_reconsume_times
        return 2**31 - 1 if orderly else 16


@dataclass
class LitePullConsumerConfig(ClientConfig):
    """DefaultLitePullConsumer."""
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    consume_timestamp_ms: int | None = None
    allocate_strategy: str = "AVG"
    auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    pull_batch_size: int = 10
    pull_threshold_for_all: int = 10_000
    consume_max_span: int = 2_000
    pull_threshold_for_queue: int = 1_000
    pull_threshold_size_for_queue_mib: int = 100
    poll_timeout_ms: int = 5_000
    broker_suspend_max_time_ms: int = 20_000
    consumer_timeout_ms_when_suspend: int = 30_000
    #: PullTaskImpl: 50 ms on flow control, 1 s while paused.
    pull_time_delay_ms_when_flow_control: int = 50
    pull_time_delay_ms_when_pause: int = 1_000
    rebalance_wait_interval_ms: int = 20_000
    rebalance_min_interval_ms: int = 1_000
    offset_store_dir: str = field(default_factory=lambda: os.environ.get(
        "ROCKETMQ_OFFSETS_DIR", os.path.join(os.path.expanduser("~"), ".rocketmq_offsets")))


@dataclass
class PopConsumerConfig(ClientConfig):
    """The 5.x POP consumer (DefaultMQPushConsumer in pop mode / SimpleConsumer)."""
    #: popInvisibleTime; outside [5 s, 300 s] RocketMQ falls back to 60 s.
    invisible_time_ms: int = 60_000
    #: popBatchNums (1..32).
    batch_size: int = 32
    #: popThresholdForQueue: received and not yet acked, per assignment.
    pop_threshold_for_queue: int = 96
    long_polling_timeout_ms: int = 15_000
    consume_thread_max: int = 20
    #: How often QueryAssignment is repeated (the official clients scan every 5 s).
    query_assignment_interval_ms: int = 5_000
    heartbeat_interval_ms: int = 10_000  # 5.x clients heartbeat every 10 s
    #: popDelayLevel (s): a failed message's next invisible time, by its reconsume
    #: times (ChangeInvisibleDuration), instead of waiting out the whole invisible time.
    pop_delay_level_s: tuple = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
    #: Lab: allow invisible times outside [5 s, 300 s] (a broker started with a smaller
    #: minimum makes the hung-consumer demo quick). False = RocketMQ's clamp to 60 s.
    allow_any_invisible_time: bool = False

    def effective_invisible_time_ms(self) -> int:
        if self.allow_any_invisible_time:
            return self.invisible_time_ms
        if not 5_000 <= self.invisible_time_ms <= 300_000:
            return 60_000  # DefaultMQPushConsumerImpl.popMessage clamp
        return self.invisible_time_ms

    def retry_backoff_ms(self, reconsume_times: int) -> int:
        """changePopInvisibleTime: popDelayLevel[reconsumeTimes], the last level beyond the table."""
        levels = self.pop_delay_level_s
        return levels[min(max(0, reconsume_times), len(levels) - 1)] * 1000


@dataclass
class ProducerConfig(ClientConfig):
    topic: str = "TopicTest"
    #: Messages per v2 SendMessage call (all to one queue, as a RocketMQ batch is).
    batch_size: int = 64
    #: Lab: steady rate in msgs/s (0 = paused); burst() adds on top.
    rate: float = 0.0
    message_size: int = 1_024
    tag: str = ""
    keys: tuple[str, ...] = ()
    #: How long a broker whose send failed is skipped (the official producer's isolation).
    isolate_broker_ms: int = 5_000
