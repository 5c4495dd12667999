"""The history page, its JSON endpoints, the job button, and report downloads."""
from __future__ import annotations

import json
import time

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_http_methods

from ..security import REPORT_POLICY

from .access import read_access, write_access
from .history import LagHistory, default_lag_dir, ints_or_none, parse_time, to_iso
from .compare import build_compare, parse_compare
from .reports import FORMATS, ReportError, build_report, parse_query
from .runner import job_status, start_job
from .service import service_status

# Above this span the page is drawn from 1-minute windows (keeps the JSON small).
AUTO_10S_MAX_MS = 2 * 3_600_000


def _bad(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@require_GET
@read_access
def history_page(request):
    return render(request, "lag/history.html", {"formats": list(FORMATS)})


@require_GET
@read_access
def groups_json(request):
    history = LagHistory()
    groups = history.groups()
    return JsonResponse({
        "groups": [{"group": g, "first": to_iso(first), "last": to_iso(last)} for g, (first, last) in sorted(groups.items())],
        "unprocessed_recordings": history.unprocessed_recordings(),
        "job": job_status(),
    })


@require_GET
@read_access
def data_json(request):
    """Everything the page draws for one group and range."""
    history = LagHistory()
    group = request.GET.get("group", "")
    try:
        q = parse_query(group, request.GET.get("from"), request.GET.get("to"), "json", "1m", history)
    except ReportError as exc:
        return _bad(str(exc))
    res = request.GET.get("res", "auto")
    if res == "auto":
        first, last = history.groups()[group]
        lo = q.from_ms if q.from_ms is not None else int(first.timestamp() * 1000)
        hi = q.to_ms if q.to_ms is not None else int(last.timestamp() * 1000)
        res = "10s" if hi - lo <= AUTO_10S_MAX_MS else "1m"
    if res not in ("10s", "1m"):
        return _bad(f"unknown res {res!r}: use 10s, 1m or auto")
    queues = {}
    rows = history.windows("queue_windows", group, q.from_ms, q.to_ms, res=res)
    many_topics = rows["topic"].nunique() > 1 if len(rows) else False
    for (topic, broker, qid), g in (rows.groupby(["topic", "broker", "queue_id"], sort=True) if len(rows) else []):
        label = f"{topic}@{broker}:{qid}" if many_topics else f"{broker}:{qid}"
        queues[label] = {
            "t": [to_iso(t) for t in g["window_end"]], "lag": g["lag"].astype(int).tolist(),
            "max_lag": g["max_lag"].astype(int).tolist(), "time_lag_ms": ints_or_none(g["time_lag_ms"]),
            "owner": g["owner"].fillna("").tolist(), "status": g["status"].tolist(),
        }
    gw = history.windows("group_windows", group, q.from_ms, q.to_ms, res=res)
    group_series = {"t": [to_iso(t) for t in gw["window_end"]]} if len(gw) else {"t": []}
    for col in ("lag", "max_lag", "avg_lag", "p95_lag", "status"):
        group_series[col] = gw[col].tolist() if len(gw) else []
    group_series["time_lag_ms"] = ints_or_none(gw["time_lag_ms"]) if len(gw) else []
    rb = history.windows("rebalances", group, q.from_ms, q.to_ms, end_col="end")
    if len(rb):   # the periodic rebalances that moved nothing are not marked
        rb = rb[rb["changed"] != "[]"]
    fc = history.windows("flow_control", group, q.from_ms, q.to_ms, res=res)
    marks = history.windows("marks", group, q.from_ms, q.to_ms, end_col="window_start")
    return JsonResponse({
        "group": group, "res": res, "queues": queues, "group_series": group_series,
        "rebalances": [{"client_id": r.client_id, "start": to_iso(r.start), "end": to_iso(r.end),
                        "duration_ms": int(r.duration_ms), "changed": r.changed} for r in rb.itertuples()] if len(rb) else [],
        "flow_control": [{"client_id": r.client_id, "reason": r.reason, "start": to_iso(r.window_start),
                          "end": to_iso(r.window_end), "count": int(r.count)} for r in fc.itertuples()] if len(fc) else [],
        "marks": [{"kind": r.kind, "name": r.name, "client_id": r.client_id, "t": to_iso(r.window_start),
                   "detail": json.loads(r.detail or "{}")} for r in marks.itertuples()] if len(marks) else [],
    })


@read_access
def _job_status(request):
    """The button's job, the lag service ("paused": why) and the newest complete 10-s
    window: the page polls this and redraws when that marker moves."""
    newest = LagHistory().newest_window_end(int(time.time() * 1000))
    return JsonResponse({**job_status(), "service": service_status(default_lag_dir()),
                         "skipped": LagHistory().skipped_recordings(),
                         "newest_window_end": to_iso(newest) if newest is not None else None})


@write_access
def _job_start(request):
    args = []
    for name in ("since", "until", "group"):
        value = request.POST.get(name)
        if value:
            if name != "group":
                try:
                    parse_time(value, name)
                except ValueError as exc:
                    return _bad(str(exc))
            args += [f"--{name}", value]
    started, status = start_job(args=args)
    return JsonResponse({"started": started, **status}, status=202 if started else 409)


@require_http_methods(["GET", "POST"])
def job(request):
    """GET: the job's progress (done/total stages). POST: start it (a logged-in user)."""
    return _job_start(request) if request.method == "POST" else _job_status(request)


@require_GET
@read_access
def lag_report(request, fmt):
    try:
        q = parse_query(request.GET.get("group", ""), request.GET.get("from"), request.GET.get("to"), fmt,
                        request.GET.get("res", "1m"))
    except ReportError as exc:
        return _bad(str(exc))
    body = build_report(LagHistory(), q)
    response = HttpResponse(body, content_type=FORMATS[fmt])
    if fmt == "html":   # self-contained: its plotly.js and data are inline
        response["Content-Security-Policy"] = REPORT_POLICY
    if fmt != "html" or request.GET.get("download"):
        response["Content-Disposition"] = f'attachment; filename="{q.filename}"'
    return response


@require_GET
@read_access
def compare_report(request, fmt):
    """Two ranges of one group side by side (compare.py), in any report format."""
    try:
        q = parse_compare(request.GET, fmt)
    except ReportError as exc:
        return _bad(str(exc))
    response = HttpResponse(build_compare(LagHistory(), q), content_type=FORMATS[fmt])
    if fmt == "html":
        response["Content-Security-Policy"] = REPORT_POLICY
    if fmt != "html" or request.GET.get("download"):
        response["Content-Disposition"] = f'attachment; filename="{q.filename}"'
    return response
