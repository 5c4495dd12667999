"""Pages: the live dashboard and the login (one-time link or username/password)."""
import math
from functools import lru_cache, wraps

from django.conf import settings
from django.contrib.auth import login as auth_login
from django.contrib.auth.views import LoginView, redirect_to_login
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import ensure_csrf_cookie

from consumers_app.allocate import STRATEGY_NAMES
from consumers_app.lab import bus
from consumers_app.lab.actions import CONSUMER_ACTIONS, GROUP_NAME_MAX, MAX_BURST, MAX_RATE, MODES
from consumers_app.lab.peers import available_clients

from . import auth
from .auth import redeem_login_token
from .throttle import Limiter


HEALTH_TIMEOUT_S = 2.0


async def healthz(request):
    """200 while the lab controller answers and its broker process is up; 503 with the
    reason otherwise (a supervisor or load balancer acts on the status alone)."""
    try:
        health = await bus.request("health", timeout=HEALTH_TIMEOUT_S)
    except bus.LabUnavailable as exc:
        return JsonResponse({"ok": False, "error": str(exc)}, status=503)
    except bus.LabError as exc:   # a controller that predates the health action
        return JsonResponse({"ok": False, "error": str(exc)}, status=503)
    return JsonResponse(health, status=200 if health.get("ok") else 503)


def readable(view):
    """Who may read is dashboard.auth.caller's decision (a user, or anyone when
    DASHBOARD_PUBLIC_READ=1; control still needs a user); a refused page goes to the login."""
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            auth.caller(request, write=False)
        except auth.Refused:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)
    return wrapper


@readable
@ensure_csrf_cookie
def live(request):
    return render(request, "live.html", {
        "strategies": STRATEGY_NAMES,
        "modes": MODES,
        "consumer_actions": CONSUMER_ACTIONS,
        "clients": available_clients(),
        "can_control": request.user.is_authenticated,
        # The action table's limits, for the controls' boxes (the server checks them anyway).
        "limits": {"rate": MAX_RATE, "burst": MAX_BURST, "group_name": GROUP_NAME_MAX},
    })


# A user already logged in who opens the login page goes to the page they came for (or the
# live page), not to a form under a header saying they are logged in.
_password_login = LoginView.as_view(template_name="login.html", redirect_authenticated_user=True)


@lru_cache(maxsize=None)
def login_limiter() -> Limiter:
    """Failed logins per client address: LOGIN_FAILURES_PER_MINUTE, refilled over a minute."""
    per_minute = settings.LOGIN_FAILURES_PER_MINUTE
    return Limiter(per_minute / 60, per_minute)


def login(request):
    """`/login/?token=T` redeems a one-time link (printed by runlab); otherwise Django's form.

    Failed attempts (wrong password, unknown link) are limited per address: past the limit
    the page answers 429 with Retry-After until the bucket refills.
    """
    address = request.META.get("REMOTE_ADDR", "")
    attempt = request.method == "POST" or "token" in request.GET
    wait = login_limiter().blocked(address) if attempt else 0.0
    if wait:
        response = render(request, "login.html", {
            "form": LoginView.form_class(request),
            "link_error": f"Too many failed logins from your address; try again in {math.ceil(wait)} s.",
        }, status=429)
        response["Retry-After"] = str(math.ceil(wait))
        return response
    token = request.GET.get("token")
    if token is None or request.method != "GET":
        response = _password_login(request)
        if request.method == "POST" and response.status_code == 200:   # the form came back: it failed
            login_limiter().take(address)
        return response
    user = redeem_login_token(token)
    if user is None and request.user.is_authenticated:
        return redirect("live")   # a used link reopened while logged in: the page, not an error
    if user is None:
        login_limiter().take(address)
        return render(request, "login.html", {
            "form": LoginView.form_class(request),
            "link_error": "This login link is unknown, expired or already used.",
        }, status=400)
    auth_login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("live")
