"""The control API: JSON in, the lab's new state out.

Every view checks the *shape* of its input (JSON object, field names and types,
ranges) and hands the action to the lab controller over the bus; the controller
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

from consumers_app.allocate import STRATEGY_NAMES
from consumers_app.lab import bus
from consumers_app.lab.actions import MODES
from consumers_app.lab.peers import OURS, available_clients

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

# Past this a number is not a rate or a count but an attack on float conversion (10**400).
MAX_MAGNITUDE = 10**15


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_MAGNITUDE


def _is_number(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE
    return _is_int(value)


def _is_name(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


MAX_BODY_BYTES = 64 * 1024   # every body of this API is a handful of fields

_KINDS = {
    "name": (_is_name, "a non-empty string"),
    "int": (_is_int, "an integer (at most 10**15 in size)"),
    "number": (_is_number, "a number (finite, at most 10**15 in size)"),
}


def body(request, required: dict[str, str] | None = None, optional: dict[str, str] | None = None) -> dict:
    """The request's JSON object, checked: field name -> kind ('name', 'int', 'number')."""
    required, optional = required or {}, optional or {}
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
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    missing = [name for name in required if name not in data]
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    for name, value in data.items():
        accepts, expected = _KINDS[required.get(name) or optional[name]]
        if not accepts(value):
            raise BadRequest(f"{name!r} must be {expected}, not {json.dumps(value)}")
    return data


def _one_of(name: str, value: str, choices) -> str:
    if value not in choices:
        raise BadRequest(f"unknown {name} {value!r}; expected one of {', '.join(choices)}")
    return value


# ---------------------------------------------------------------- endpoints

@lab_view("GET")
async def state(request):
    return await bus.request("state")


@lab_view("POST")
async def group_strategy(request, group):
    strategy = body(request, {"strategy": "name"})["strategy"]
    return await bus.request("set_strategy", group=group, strategy=_one_of("strategy", strategy, STRATEGY_NAMES))


@lab_view("GET")
async def group_strategy_preview(request, group):
    """What switching the group to ?strategy=NAME would move (read-only, so no control token spent)."""
    unknown = sorted(set(request.GET) - {"strategy"})
    if unknown:
        raise BadRequest(f"unknown query parameter(s): {', '.join(unknown)}")
    strategy = request.GET.get("strategy", "")
    if not strategy:
        raise BadRequest("missing query parameter 'strategy'")
    return await bus.request("preview_strategy", group=group, strategy=_one_of("strategy", strategy, STRATEGY_NAMES))


@lab_view("GET")
async def group_rebalance(request, group, rebalance_id):
    """One rebalance of the last 15 minutes with its hand-offs (consumers_app/lab/handoff.py)."""
    if request.GET:
        raise BadRequest(f"unknown query parameter(s): {', '.join(sorted(request.GET))}")
    return await bus.request("rebalance", group=group, rebalance_id=rebalance_id)


def _query_int(request, name: str, default: int | None, low: int, high: int) -> int:
    """An integer query parameter within [low, high]; 400 naming it otherwise."""
    text = request.GET.get(name)
    if text is None:
        if default is None:
            raise BadRequest(f"missing query parameter {name!r}")
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name!r} must be an integer, not {text!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name!r} must be between {low} and {high}, not {value}")
    return value


def _only(request, *names: str) -> None:
    unknown = sorted(set(request.GET) - set(names))
    if unknown:
        raise BadRequest(f"unknown query parameter(s): {', '.join(unknown)}")


@lab_view("GET")
async def group_lag_series(request, group):
    """The group's lag over the last ?seconds= (300; at most 900), one point a second:
    total, largest time lag, and per queue (consumers_app/lab/timeline.py)."""
    _only(request, "seconds")
    return await bus.request("lag_series", group=group, seconds=_query_int(request, "seconds", 300, 1, 900))


@lab_view("GET")
async def group_view_at(request, group):
    """The assignment view as it was at ?ts= (ms since the epoch), within the last 15 minutes."""
    _only(request, "ts")
    return await bus.request("view_at", group=group, ts=_query_int(request, "ts", None, 0, 2**53))


@lab_view("POST")
async def group_mode(request, group):
    mode = body(request, {"mode": "name"})["mode"]
    return await bus.request("set_mode", group=group, mode=_one_of("mode", mode, MODES))


@lab_view("POST")
async def group_consumers(request, group):
    data = body(request, {"mode": "name"}, {"client": "name"})
    mode = _one_of("mode", data["mode"], MODES)
    client = _one_of("client", data.get("client", OURS), available_clients())
    return await bus.request("add_consumer", group=group, mode=mode, **({} if client == OURS else {"client": client}))


@lab_view("POST")
async def observe(request):
    """Watch a group the lab did not start, read-only (consumers_app/lab/observer.py)."""
    group = body(request, {"group": "name"})["group"]
    return await bus.request("observe", group=group)


@lab_view("POST")
async def consumer_action(request, client_id, action):
    if action == "slow":
        ms = body(request, {"ms": "int"})["ms"]
        if ms < 0:
            raise BadRequest("'ms' must be >= 0")
        return await bus.request("consumer", client_id=client_id, action=action, ms=ms)
    if action == "fail":
        ratio = body(request, {"ratio": "number"})["ratio"]
        if not 0 <= ratio <= 1:
            raise BadRequest("'ratio' must be between 0 and 1")
        return await bus.request("consumer", client_id=client_id, action=action, ratio=ratio)
    body(request)  # stop, kill, hang, cut, resume take no fields (an empty body is fine)
    return await bus.request("consumer", client_id=client_id, action=action)


@lab_view("POST")
async def producer_rate(request):
    data = body(request, {"topic": "name", "rate": "number"})
    if data["rate"] < 0:
        raise BadRequest("'rate' must be >= 0 (messages per second)")
    return await bus.request("producer_rate", topic=data["topic"], rate=data["rate"])


@lab_view("POST")
async def producer_burst(request):
    data = body(request, {"topic": "name", "count": "int"})
    if data["count"] < 1:
        raise BadRequest("'count' must be >= 1")
    if data["count"] > settings.LAB_BURST_MESSAGES_PER_MINUTE:
        raise BadRequest(f"'count' must be at most {settings.LAB_BURST_MESSAGES_PER_MINUTE} "
                         f"(the per-user burst budget a minute)")
    wait = burst_limiter().take(request.lab_user_id, data["count"])
    if wait:
        raise TooManyRequests(f"burst budget used up: at most {settings.LAB_BURST_MESSAGES_PER_MINUTE} messages "
                              f"a minute per user (keeps the broker's disk within its retention budget)", wait)
    return await bus.request("producer_burst", topic=data["topic"], count=data["count"])


@lab_view("POST")
async def topic_queues(request, topic):
    data = body(request, {"delta": "int"}, {"broker": "name"})
    if data["delta"] == 0:
        raise BadRequest("'delta' must not be 0 (positive adds queues, negative removes them)")
    return await bus.request("queues", topic=topic, **data)


@lab_view("POST")
async def broker_online(request, broker):
    body(request)
    return await bus.request("broker", broker=broker, online=True)


@lab_view("POST")
async def broker_offline(request, broker):
    body(request)
    return await bus.request("broker", broker=broker, online=False)


@csrf_exempt  # answers 404 and changes nothing; CSRF's HTML 403 would hide the real answer
def not_found(request, *args, **kwargs):
    return error(404, f"no such API endpoint: {request.method} {request.path}")
