"""rocketmq-client-cpp 2.1 (its library ships in the PyPI package rocketmq-python-cvs) as a
lab peer: one JSON object per line on stdout, like peers/ali_ons_peer.js.

    python peers/cpp_peer.py consume NAMESRV GROUP TOPIC   -> {"ready": true}, then per message
        {"id", "topic", "queue", "offset", "reconsume", "body"}; SIGTERM: shut down, exit 0
    python peers/cpp_peer.py count NAMESRV GROUP TOPIC     -> the same, but a bare "." line per
        message: what a benchmark counts, without JSON-encoding each body
    python peers/cpp_peer.py produce NAMESRV TOPIC COUNT    -> per message {"sent", "status",
        "offset"}, then {"done": COUNT}

Run it with PYTHONPATH naming where ``make cpp-peer`` installed the package (it is kept
apart: its module is called ``rocketmq``, as the official v5 client's is).
"""
import ctypes
import json
import os
import signal
import sys
import threading


def out(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def consume(namesrv: str, group: str, topic: str, count_only: bool = False) -> None:
    from rocketmq.client import PushConsumer

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.set_thread_count(2)
    # 2.1's DefaultMQPushConsumerImpl::shutdown() first shuts the message-trace producer down
    # without checking it exists: with tracing off (the default) it dereferences null and the
    # process dies (SIGSEGV) before it commits offsets and unregisters, so the broker only
    # sees the connection close. Tracing on at start creates that producer; off again after
    # start, so no trace is sent per message, and a SIGTERM is a goodbye: offsets committed,
    # UNREGISTER_CLIENT answered, then the close.
    _message_trace(consumer, True)

    def on_message(msg):
        out({"id": msg.id, "topic": msg.topic, "queue": msg.queue_id, "offset": msg.queue_offset,
             "reconsume": msg.reconsume_times, "body": msg.body.decode(errors="replace")})

    def on_message_counted(_msg):
        sys.stdout.write(".\n")
        sys.stdout.flush()

    consumer.subscribe(topic, on_message_counted if count_only else on_message)
    consumer.start()
    _message_trace(consumer, False)
    out({"ready": True, "pid": os.getpid()})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    consumer.shutdown()


def _message_trace(consumer, on: bool) -> None:
    """SetPushConsumerMessageTrace, which the Python binding does not wrap (CTraceModel: OPEN 0, CLOSE 1)."""
    from rocketmq.ffi import dll

    dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
    if dll.SetPushConsumerMessageTrace(consumer._handle, 0 if on else 1) != 0:
        raise RuntimeError("SetPushConsumerMessageTrace failed")


def produce(namesrv: str, topic: str, count: int) -> None:
    from rocketmq.client import Message, Producer

    producer = Producer("PG_CPP")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    for i in range(count):
        msg = Message(topic)
        msg.set_tags("TagA")
        msg.set_body(f"cpp {i}")
        result = producer.send_sync(msg)
        out({"sent": result.msg_id, "status": result.status.name, "offset": result.offset})
    out({"done": count})
    producer.shutdown()


if __name__ == "__main__":
    role, *args = sys.argv[1:] or [""]
    if role in ("consume", "count") and len(args) == 3:
        consume(*args, count_only=role == "count")
    elif role == "produce" and len(args) == 3:
        produce(args[0], args[1], int(args[2]))
    else:
        sys.stderr.write("usage: cpp_peer.py consume|count NAMESRV GROUP TOPIC | produce NAMESRV TOPIC COUNT\n")
        sys.exit(2)
