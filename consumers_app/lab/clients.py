"""How a worker builds the lab's clients: the one place that knows their constructors.

The worker (worker.py) calls these with plain JSON params from the controller;
``options`` are config fields of the client's config dataclass (consumers_app.client.
config), e.g. ``{"heartbeat_interval_ms": 1000}`` for a quick demo or test.
"""
import asyncio

from consumers_app.client import config as client_config


def make_consumer(*, mode: str, group: str, topic: str, strategy: str, broker: str, client_id: str,
                  options: dict):
    if mode == "push":
        from consumers_app.client.push_consumer import PushConsumer

        config = client_config.PushConsumerConfig(
            endpoints=broker, client_id=client_id, allocate_strategy=strategy, **options)
        return PushConsumer(group, topic, config=config)
    if mode == "lite_pull":
        from consumers_app.client.lite_pull_consumer import LitePullConsumer

        config = client_config.LitePullConsumerConfig(
            endpoints=broker, client_id=client_id, allocate_strategy=strategy, **options)
        # auto_consume: the lab has no application calling poll(); consume as the listener does.
        return LitePullConsumer(group, topic, config=config, auto_consume=True)
    if mode == "pop":
        from consumers_app.client.pop_consumer import PopConsumer

        config = client_config.PopConsumerConfig(endpoints=broker, client_id=client_id, **options)
        return PopConsumer(group, topic, config=config)
    raise ValueError(f"unknown consumer mode {mode!r}")


def make_producer(*, producer_id: str, topic: str, rate: float, broker: str, options: dict):
    from consumers_app.client.producer import Producer

    config = client_config.ProducerConfig(endpoints=broker, client_id=producer_id, topic=topic, rate=rate,
                                          **options)
    return Producer(config)


async def start_producer(producer) -> None:
    await producer.start()
    producer.start_steady()


def set_rate(producer, rate: float) -> None:
    producer.set_rate(rate)


_bursts: set[asyncio.Task] = set()


def burst(producer, count: int) -> None:
    """Send ``count`` messages on top of the steady rate, in the background: the lab's
    request returns at once while the burst lands."""
    task = asyncio.get_running_loop().create_task(producer.burst(count))
    _bursts.add(task)
    task.add_done_callback(_bursts.discard)
