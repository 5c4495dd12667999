"""Our own RocketMQ-style clients (push, lite pull, pop) and producer, for the lab.

Faithful to Apache RocketMQ's client (DefaultMQPushConsumer, DefaultLitePullConsumer,
the 5.x POP consumer); every constant is a config field with RocketMQ's default.
"""
from .config import (ConsumeFromWhere, ConsumeResult, LitePullConsumerConfig, MessageModel,
                     PopConsumerConfig, ProducerConfig, PushConsumerConfig)
from .message import MessageExt, PopMessage
from .producer import Producer
from .push_consumer import PushConsumer

__all__ = [
    "ConsumeFromWhere", "ConsumeResult", "MessageModel", "MessageExt", "PopMessage",
    "PushConsumerConfig", "LitePullConsumerConfig", "PopConsumerConfig", "ProducerConfig",
    "PushConsumer", "LitePullConsumer", "PopConsumer", "Producer",
]


def __getattr__(name):  # lazy: keep importing the package cheap
    if name == "LitePullConsumer":
        from .lite_pull_consumer import LitePullConsumer
        return LitePullConsumer
    if name == "PopConsumer":
        from .pop_consumer import PopConsumer
        return PopConsumer
    raise AttributeError(name)
