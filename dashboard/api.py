"""The control API: JSON in, the lab's new state out.

Every view maps its URL to one of the lab's actions and checks the *shape* of its input
(JSON object, field names and types, ranges) against that action's entry in the lab's
action table (consumers_app/lab/actions.py), then hands the action to the lab controller
over the bus; the controller
decides whether it makes sense (unknown group, last queue, ...) and answers with the
new state or a `LabError`. Errors are `{"error": "reason"}`: 400 bad input (nothing
changed), 401 not authenticated, 403 CSRF, 404 unknown action, 429 too many control
requests (Retry-After; dashboard/throttle.py), 503 no controller or it is busy
(Retry-After). A 429 or 503 means nothing was or will be applied.

Callers authenticate with the page's session (and then need the CSRF token, as any
form would) or with `Authorization: Token <api token>` (no cookie, so no CSRF).
"""
import json
import logging
import math
from functools import lru_cache, wraps

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from consumers_app.lab import bus
from consumers_app.lab.actions import ACTIONS, KINDS, NOT_GIVEN

from . import auth
from .throttle import Limiter

log = logging.getLogger(__name__)


class BadRequest(Exception):
    """Input of the wrong shape: answered 400 before the controller sees it."""


def error(status: int, message: str, retry_after: float | None = None) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return response


class TooManyRequests(Exception):
    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


@lru_cache(maxsize=None)
def _limiter(rate: float, capacity: float) -> Limiter:
    return Limiter(rate, capacity)


def control_limiter() -> Limiter:
    return _limiter(settings.LAB_CONTROL_RATE, settings.LAB_CONTROL_BURST)


def burst_limiter() -> Limiter:
    per_minute = settings.LAB_BURST_MESSAGES_PER_MINUTE
    return _limiter(per_minute / 60, per_minute)


# ---------------------------------------------------------------- authentication

async def _authenticate(request, *, write: bool):
    """(caller's user id or None for an anonymous reader, None) if the caller may go on,
    else (None, the error response)."""
    try:
        user = await sync_to_async(auth.caller)(request, write=write)
    except auth.Refused as refused:
        return None, error(refused.status, refused.message)
    return (user.pk if user else None), None


def _throttle(user_id) -> None:
    """A control action spends one token of its user's bucket, or is refused (429)."""
    wait = control_limiter().take(user_id)
    if wait:
        raise TooManyRequests(f"too many control requests: at most {settings.LAB_CONTROL_RATE:g} per second "
                              f"(bursts of {settings.LAB_CONTROL_BURST}); nothing was changed", wait)


def lab_view(method: str):
    """Wrap an async view that returns the controller's answer into an authenticated JSON endpoint.

    Every answer is JSON: whatever goes wrong inside is a 4xx/503 with a reason, and an
    unexpected failure a JSON 500 (logged), never Django's HTML error page.
    """
    def decorate(view):
        @wraps(view)
        async def endpoint(request, *args, **kwargs):
            if request.method != method:
                response = error(405, f"use {method}")
                response["Allow"] = method
                return response
            write = method != "GET"
            user_id, denied = await _authenticate(request, write=write)
            if denied is not None:
                return denied
            request.lab_user_id = user_id
            try:
                if write:
                    _throttle(user_id)
                return JsonResponse(await view(request, *args, **kwargs))
            except BadRequest as exc:
                return error(400, str(exc))
            except bus.LabError as exc:
                return error(400, str(exc))
            except TooManyRequests as exc:
                return error(429, str(exc), retry_after=exc.retry_after)
            except bus.LabUnavailable as exc:
                return error(503, str(exc), retry_after=1)
            except Exception:  # noqa: BLE001 - a JSON answer, not an HTML page, whatever happened
                log.exception("%s %s failed", request.method, request.path)
                return error(500, "internal error (logged on the server)")

        endpoint.csrf_exempt = True
        return endpoint
    return decorate


# ---------------------------------------------------------------- input shape
# What each action takes, and the bounds and choices its values must keep, are the lab's
# action table (consumers_app/lab/actions.py); here is only how HTTP carries them: the
# URL's path parameters, a JSON body, a query string.

MAX_BODY_BYTES = 64 * 1024   # every body of this API is a handful of fields


def _json_object(request) -> dict:
    if len(request.body) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):   # int digits past Python's limit are ValueErrors too
        raise BadRequest("the body is not valid JSON") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def _keeps_its_bounds(param, value) -> None:
    """The value is one of the param's choices and keeps its rule, or BadRequest says which not."""
    if param.choices is not None and value not in param.choices():
        raise BadRequest(f"unknown {param.name} {value!r}; expected one of {', '.join(param.choices())}")
    if param.rule is not None and not param.rule.holds(value):
        raise BadRequest(param.rule.message.format(value=value))


def body(request, action: str, /, **path) -> dict:
    """The bus params of ``action``: the URL's ``path`` ones and the JSON body's fields,
    checked against the action's table entry (its fields, their kinds and bounds)."""
    data = _json_object(request)
    fields = ACTIONS[action].web_params("body", path)
    unknown = sorted(set(data) - {p.name for p in fields})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    missing = [p.name for p in fields if p.needed_on_the_web and p.name not in data]
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    kinds = {p.name: p.kind for p in fields}
    for name, value in data.items():
        accepts, expected = KINDS[kinds[name]]
        if not accepts(value):
            raise BadRequest(f"{name!r} must be {expected}, not {json.dumps(value)}")
    for p in fields:
        if p.name in data:
            _keeps_its_bounds(p, data[p.name])
    # A value the lab assumes anyway is not sent (add_consumer's client "ours").
    return {**path, **{name: value for name, value in data.items() if value != ACTIONS[action].param(name).default}}


def query(request, action: str, /, **path) -> dict:
    """The bus params of ``action``: the URL's ``path`` ones and its query parameters,
    checked against the action's table entry."""
    params = ACTIONS[action].web_params("query")
    unknown = sorted(set(request.GET) - {p.name for p in params})
    if unknown:
        raise BadRequest(f"unknown query parameter(s): {', '.join(unknown)}")
    found = dict(path)
    for p in params:
        text = request.GET.get(p.name)
        if not text and not (p.kind == "int" and text is not None):   # an empty name is a missing one
            if p.web_default is NOT_GIVEN:
                raise BadRequest(f"missing query parameter {p.name!r}")
            found[p.name] = p.web_default
            continue
        value = text
        if p.kind == "int":
            try:
                value = int(text)
            except ValueError:
                raise BadRequest(f"{p.name!r} must be an integer, not {text!r}") from None
        _keeps_its_bounds(p, value)
        found[p.name] = value
    return found


# ---------------------------------------------------------------- endpoints: URL -> action

@lab_view("GET")
async def state(request):
    return await bus.request("state")


@lab_view("POST")
async def group_strategy(request, group):
    return await bus.request("set_strategy", **body(request, "set_strategy", group=group))


@lab_view("GET")
async def group_strategy_preview(request, group):
    """What switching the group to ?strategy=NAME would move (read-only, so no control token spent)."""
    return await bus.request("preview_strategy", **query(request, "preview_strategy", group=group))


@lab_view("GET")
async def group_rebalance(request, group, rebalance_id):
    """One rebalance of the last 15 minutes with its hand-offs (consumers_app/lab/handoff.py)."""
    return await bus.request("rebalance", **query(request, "rebalance", group=group, rebalance_id=rebalance_id))


@lab_view("GET")
async def group_lag_series(request, group):
    """The group's lag over the last ?seconds= (300; at most 900), one point a second:
    total, largest time lag, and per queue (consumers_app/lab/timeline.py)."""
    return await bus.request("lag_series", **query(request, "lag_series", group=group))


@lab_view("GET")
async def group_view_at(request, group):
    """The assignment view as it was at ?ts= (ms since the epoch), within the last 15 minutes."""
    return await bus.request("view_at", **query(request, "view_at", group=group))


@lab_view("POST")
async def group_mode(request, group):
    return await bus.request("set_mode", **body(request, "set_mode", group=group))


@lab_view("POST")
async def group_consumers(request, group):
    return await bus.request("add_consumer", **body(request, "add_consumer", group=group))


@lab_view("POST")
async def observe(request):
    """Watch a group the lab did not start, read-only (consumers_app/lab/observer.py)."""
    return await bus.request("observe", **body(request, "observe"))


@lab_view("POST")
async def consumer_action(request, client_id, action):
    """stop, kill, hang, cut and resume take no fields (an empty body is fine); slow its ms, fail its ratio."""
    return await bus.request("consumer", **body(request, "consumer", client_id=client_id, action=action))


@lab_view("POST")
async def producer_rate(request):
    return await bus.request("producer_rate", **body(request, "producer_rate"))


@lab_view("POST")
async def producer_burst(request):
    params = body(request, "producer_burst")
    if params["count"] > settings.LAB_BURST_MESSAGES_PER_MINUTE:
        raise BadRequest(f"'count' must be at most {settings.LAB_BURST_MESSAGES_PER_MINUTE} "
                         f"(the per-user burst budget a minute)")
    wait = burst_limiter().take(request.lab_user_id, params["count"])
    if wait:
        raise TooManyRequests(f"burst budget used up: at most {settings.LAB_BURST_MESSAGES_PER_MINUTE} messages "
                              f"a minute per user (keeps the broker's disk within its retention budget)", wait)
    return await bus.request("producer_burst", **params)


@lab_view("POST")
async def topic_queues(request, topic):
    return await bus.request("queues", **body(request, "queues", topic=topic))


@lab_view("POST")
async def broker_online(request, broker):
    return await bus.request("broker", **body(request, "broker", broker=broker, online=True))


@lab_view("POST")
async def broker_offline(request, broker):
    return await bus.request("broker", **body(request, "broker", broker=broker, online=False))


@csrf_exempt  # answers 404 and changes nothing; CSRF's HTML 403 would hide the real answer
def not_found(request, *args, **kwargs):
    return error(404, f"no such API endpoint: {request.method} {request.path}")
