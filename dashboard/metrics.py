"""GET /metrics: the lab's figures for Prometheus, built from the controller's snapshot.

Every scrape asks the controller for the same snapshot ``/api/state`` answers and turns
it into metric families (``SnapshotCollector``), so a scrape and an ``/api/state`` taken
at the same moment say the same. prometheus_client writes the text exposition format
(or OpenMetrics, when the scraper asks for it).

Names follow RocketMQ 5's broker metrics where one exists (``rocketmq_consumer_lag_messages``,
``rocketmq_consumer_lag_latency`` in milliseconds, ``rocketmq_consumer_inflight_messages``;
labels ``consumer_group`` and ``topic``), per queue here, hence ``broker`` and ``queue_id``
too. What no exporter has is ``rebalance_lab_*``: queue owners, and per group the
rebalances, queues moved, duplicates, and each rebalance's longest gap and overlap.

A queue whose time lag is unknown (an attached cluster that has not answered yet) has no
``rocketmq_consumer_lag_latency`` sample: absent, never a 0 that would claim "caught up".

Access as the JSON API's reads: ``Authorization: Token <api token>``, a logged-in
session, or anyone when ``DASHBOARD_PUBLIC_READ=1``. Refusals and failures are JSON
(``{"error": ...}``): 401 (with ``WWW-Authenticate``), 405 (not GET), 503 while no controller answers
(a restart), 500 for the unexpected; never an HTML page or a stack trace.
"""
import logging

from asgiref.sync import sync_to_async
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder

from consumers_app.lab import bus
from consumers_app.message_queue import parse_label

from . import auth
from .api import error

log = logging.getLogger(__name__)

# Prometheus' default scrape timeout is 10 s: answer 503 before the scraper gives up.
SCRAPE_TIMEOUT_S = 5.0
QUEUE_LABELS = ["consumer_group", "topic", "broker", "queue_id"]
GROUP_LABELS = ["consumer_group", "topic"]


class SnapshotCollector:
    """The metric families of one controller snapshot (``/api/state``'s answer)."""

    def __init__(self, snapshot: dict):
        self.snapshot = snapshot

    def collect(self):
        groups = sorted((self.snapshot.get("groups") or {}).items())
        yield from self._queues(groups)
        yield from self._groups(groups)
        yield from self._brokers()

    @staticmethod
    def _queues(groups):
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages",
                                "Messages of the queue the group has not consumed (max offset - committed offset)",
                                labels=QUEUE_LABELS)
        latency = GaugeMetricFamily("rocketmq_consumer_lag_latency",
                                    "Age of the oldest unconsumed message of the queue, in milliseconds "
                                    "(absent while unknown)", labels=QUEUE_LABELS)
        inflight = GaugeMetricFamily("rocketmq_consumer_inflight_messages",
                                     "Messages of the queue handed to the group's consumers and not yet acknowledged",
                                     labels=QUEUE_LABELS)
        owners = GaugeMetricFamily("rebalance_lab_queue_owners",
                                   "Consumers holding the queue (1 in push and lite-pull modes, when all is well)",
                                   labels=QUEUE_LABELS)
        cached = GaugeMetricFamily("rebalance_lab_queue_cached_messages",
                                   "Messages of the queue in its owners' process queues", labels=QUEUE_LABELS)
        for name, group in groups:
            for label, q in sorted(group.get("queues", {}).items()):
                broker, queue_id = parse_label(label)
                values = [name, group.get("topic", ""), broker, str(queue_id)]
                lag.add_metric(values, q["lag"])
                if q.get("time_lag_ms") is not None:
                    latency.add_metric(values, q["time_lag_ms"])
                inflight.add_metric(values, q["inflight"])
                owners.add_metric(values, len(q["owners"]))
                cached.add_metric(values, q["cached_count"])
        yield from (lag, latency, inflight, owners, cached)

    @staticmethod
    def _groups(groups):
        info = GaugeMetricFamily("rebalance_lab_group_info", "A group on the page: its mode, strategy, and whether "
                                 "the lab only observes it (1)", labels=[*GROUP_LABELS, "mode", "strategy", "observed"])
        members = GaugeMetricFamily("rebalance_lab_group_members", "Consumers the broker lists in the group",
                                    labels=GROUP_LABELS)
        rebalances = CounterMetricFamily("rebalance_lab_rebalances",
                                         "Rebalances that moved queues, counted once settled", labels=GROUP_LABELS)
        moved = CounterMetricFamily("rebalance_lab_queues_moved", "Queue hand-offs of the counted rebalances",
                                    labels=GROUP_LABELS)
        duplicates = CounterMetricFamily("rebalance_lab_duplicates",
                                         "Messages consumed twice because of the counted rebalances' hand-offs",
                                         labels=GROUP_LABELS)
        unmeasured = CounterMetricFamily("rebalance_lab_unmeasured_moves",
                                         "Hand-offs to or from a peer client, whose duplicates are not measured",
                                         labels=GROUP_LABELS)
        gap = HistogramMetricFamily("rebalance_lab_rebalance_gap_seconds",
                                    "Per counted rebalance, its longest gap (a queue nobody consumed)",
                                    labels=GROUP_LABELS)
        overlap = HistogramMetricFamily("rebalance_lab_rebalance_overlap_seconds",
                                        "Per counted rebalance, its longest overlap (a queue two consumers consumed)",
                                        labels=GROUP_LABELS)
        longest_gap = GaugeMetricFamily("rebalance_lab_window_longest_gap_seconds",
                                        "Longest gap of the rebalances of the last 15 minutes", labels=GROUP_LABELS)
        longest_overlap = GaugeMetricFamily("rebalance_lab_window_longest_overlap_seconds",
                                            "Longest overlap of the rebalances of the last 15 minutes (a running "
                                            "one included)", labels=GROUP_LABELS)
        for name, group in groups:
            values = [name, group.get("topic", "")]
            info.add_metric([*values, group.get("mode", ""), group.get("strategy", ""),
                             "1" if group.get("observed") else "0"], 1)
            members.add_metric(values, len(group.get("members", ())))
            totals = group.get("rebalance_totals")
            if totals:
                rebalances.add_metric(values, totals["rebalances"])
                moved.add_metric(values, totals["moved"])
                duplicates.add_metric(values, totals["duplicates"])
                unmeasured.add_metric(values, totals["unmeasured"])
                gap.add_metric(values, totals["gap_s"]["buckets"], totals["gap_s"]["sum_s"])
                overlap.add_metric(values, totals["overlap_s"]["buckets"], totals["overlap_s"]["sum_s"])
            window = (group.get("handoffs") or {}).get("totals")
            if window:
                longest_gap.add_metric(values, window["gap_ms"] / 1000)
                longest_overlap.add_metric(values, window["overlap_ms"] / 1000)
        yield from (info, members, rebalances, moved, duplicates, unmeasured, gap, overlap,
                    longest_gap, longest_overlap)

    def _brokers(self):
        online = GaugeMetricFamily("rebalance_lab_broker_online", "A broker of the lab's topics is online (1)",
                                   labels=["broker"])
        for name, broker in sorted((self.snapshot.get("brokers") or {}).items()):
            online.add_metric([name], 1 if broker.get("online") else 0)
        yield online


def exposition(snapshot: dict, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) of ``snapshot`` in the format ``accept`` asks for."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


@csrf_exempt   # read-only; CSRF's HTML 403 would hide the real answer
async def metrics(request):
    if request.method != "GET":
        response = error(405, "use GET")
        response["Allow"] = "GET"
        return response
    try:
        await sync_to_async(auth.caller)(request, write=False)
    except auth.Refused as refused:
        response = error(refused.status, refused.message)
        if refused.status == 401:
            response["WWW-Authenticate"] = 'Token realm="metrics"'
        return response
    try:
        snapshot = await bus.request("state", timeout=SCRAPE_TIMEOUT_S)
        body, content_type = exposition(snapshot, request.headers.get("Accept", ""))
    except (bus.LabUnavailable, bus.LabError, OSError) as exc:
        # No controller (runlab restarting), or the channel layer is down: try again shortly.
        return error(503, f"no figures right now: {exc or type(exc).__name__}", retry_after=SCRAPE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - a JSON answer, not a stack trace, whatever happened
        log.exception("GET /metrics failed")
        return error(500, "internal error (logged on the server)")
    return HttpResponse(body, content_type=content_type)
