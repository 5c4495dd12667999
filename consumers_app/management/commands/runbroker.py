"""``manage.py runbroker``: the embedded RocketMQ-5-compatible broker.

Every interval is a flag (defaults are RocketMQ's) so tests and demos need not wait.
"""
import logging
import os
import re
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from consumers_app.broker.core import DEFAULT_DELAY_LEVELS, BrokerConfig
from consumers_app.broker.delay import parse_delay_levels


class Command(BaseCommand):
    help = "Run the embedded broker (apache.rocketmq.v2.MessagingService + rebalancelab.v1.LabAdmin)."

    def add_arguments(self, parser):
        d = BrokerConfig()

        def a(*names, help="", **kw):
            if "default" in kw and kw.get("action") != "append":
                help = f"{help} (default: %(default)s)".strip()
            parser.add_argument(*names, help=help, **kw)

        a("--host", default="127.0.0.1")
        a("--port", type=int, default=8081)
        a("--data-dir", default="var/broker")
        a("--topic", action="append", default=[], metavar="NAME:QUEUES[@BROKER]",
          help="create/resize a topic at start-up (repeatable); BROKER defaults to --broker-name")
        a("--broker-name", default=d.default_broker, help="default logical broker name")
        a("--flush", choices=["async", "sync"], default="async",
          help="async: fsync every --flush-interval-ms; sync: fsync before a send is acknowledged")
        a("--flush-interval-ms", type=int, default=d.flush_interval_ms)
        a("--client-expiry-ms", type=int, default=d.channel_expired_ms, help="expire a silent client")
        a("--client-scan-ms", type=int, default=d.client_scan_ms, help="how often silent clients are looked for")
        a("--long-poll-max-ms", type=int, default=d.long_poll_max_ms, help="longest hold of a pull/pop")
        a("--long-poll-default-ms", type=int, default=d.long_poll_default_ms,
          help="hold of a v2 receive that names no long_polling_timeout")
        a("--revive-interval-ms", type=int, default=d.revive_interval_ms)
        a("--min-invisible-ms", type=int, default=d.min_invisible_ms)
        a("--max-invisible-ms", type=int, default=d.max_invisible_ms)
        a("--default-invisible-ms", type=int, default=d.default_invisible_ms,
          help="invisible time of auto-renewed (push consumer) receives")
        a("--delay-levels", default=DEFAULT_DELAY_LEVELS)
        a("--offset-persist-ms", type=int, default=d.offset_persist_ms)
        a("--max-body-size", type=int, default=d.max_body_size)
        a("--pop-max-attempts", type=int, default=d.pop_max_attempts,
          help="deliveries before a pop message goes to %%DLQ%% (unless the client's settings say)")
        a("--max-reconsume-times", type=int, default=d.max_reconsume_times, help="send-back default")
        a("--pop-retry-probability", type=int, default=d.pop_retry_probability)
        a("--segment-size", type=int, default=d.segment_size, help="commit-log segment file size (bytes)")
        a("--retention-mb", type=int, default=d.retention_mb,
          help="delete the oldest commit-log segments while the log is larger (MiB)")
        a("--retention-hours", type=float, default=d.retention_hours,
          help="delete commit-log segments last written longer ago (fileReservedTime)")
        a("--retention-interval-ms", type=int, default=d.retention_interval_ms,
          help="how often retention looks for segments to delete")
        a("--lock-expiry-ms", type=int, default=d.lock_expiry_ms)
        a("--namesrv-port", type=int, default=None,
          help="also speak RocketMQ's remoting protocol: a name server on --host:N (0 = any free port)")
        a("--remoting-port", type=int, default=d.remoting_port,
          help="first remoting port of the logical brokers (one each, upward); with --namesrv-port")
        a("--log-level", default="WARNING")

    def handle(self, *args, **o):
        logging.basicConfig(level=o["log_level"].upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            parse_delay_levels(o["delay_levels"])
        except ValueError as e:
            raise CommandError(str(e))
        cfg = BrokerConfig(
            host=o["host"], port=o["port"], data_dir=Path(o["data_dir"]), topics=o["topic"], flush=o["flush"],
            default_broker=o["broker_name"], flush_interval_ms=o["flush_interval_ms"],
            channel_expired_ms=o["client_expiry_ms"], client_scan_ms=o["client_scan_ms"],
            long_poll_max_ms=o["long_poll_max_ms"], long_poll_default_ms=o["long_poll_default_ms"],
            revive_interval_ms=o["revive_interval_ms"], min_invisible_ms=o["min_invisible_ms"],
            max_invisible_ms=o["max_invisible_ms"], default_invisible_ms=o["default_invisible_ms"],
            delay_levels=o["delay_levels"], offset_persist_ms=o["offset_persist_ms"],
            max_body_size=o["max_body_size"], pop_max_attempts=o["pop_max_attempts"],
            max_reconsume_times=o["max_reconsume_times"], pop_retry_probability=o["pop_retry_probability"],
            segment_size=o["segment_size"], lock_expiry_ms=o["lock_expiry_ms"],
            retention_mb=o["retention_mb"], retention_hours=o["retention_hours"],
            retention_interval_ms=o["retention_interval_ms"],
            namesrv_port=o["namesrv_port"], remoting_port=o["remoting_port"],
        )
        from consumers_app.broker.server import run
        from consumers_app.lab.lifeline import die_with_parent
        die_with_parent()   # started by runlab: never outlive it (SIGTERM persists offsets)
        try:
            code = run(cfg)
        except (OSError, ValueError) as e:
            taken = port_named(o, str(e)) if "in use" in str(e) else None
            # One line naming the port and the flag that moves it (runlab passes its own
            # --namesrv-port and --remoting-port through), then out at once: the half-built
            # gRPC server would print a traceback of its own when collected after the loop closed.
            sys.stderr.write(f"CommandError: port {taken[0]} is in use: pick another with {taken[1]}=PORT "
                             f"(0: any free port)\n" if taken is not None else f"CommandError: {e}\n")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)
        sys.exit(code)


def port_named(o: dict, message: str) -> tuple[int, str] | None:
    """The port of ours a bind error names (``cannot bind 127.0.0.1:8081``, ``...on address
    ('127.0.0.1', 9876)...``), with the flag that sets it."""
    ports = {o["port"]: "--port"}
    if o["namesrv_port"] is not None:
        if o["remoting_port"]:
            ports |= {o["remoting_port"] + i: "--remoting-port" for i in range(REMOTING_PORTS)}
        ports[o["namesrv_port"]] = "--namesrv-port"
    ports.pop(0, None)   # any free port: never in use
    for number in map(int, re.findall(r"[:,]\s*(\d+)\b", message)):
        if number in ports:
            return number, ports[number]
    return None


REMOTING_PORTS = 8   # the logical brokers' remoting ports, one each upward from --remoting-port
