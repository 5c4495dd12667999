"""Pages: the live dashboard and the login (one-time link or username/password)."""
from functools import wraps

from django.conf import settings
from django.contrib.auth import login as auth_login
from django.contrib.auth.views import LoginView, redirect_to_login
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import ensure_csrf_cookie

from consumers_app.allocate import STRATEGY_NAMES

from .api import MODES
from .auth import redeem_login_token


def healthz(request):
    return JsonResponse({"ok": True})


def readable(view):
    """Login required, unless DASHBOARD_PUBLIC_READ=1 opens the pages (control still needs a user)."""
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if settings.DASHBOARD_PUBLIC_READ or request.user.is_authenticated:
            return view(request, *args, **kwargs)
        return redirect_to_login(request.get_full_path())
    return wrapper


@readable
@ensure_csrf_cookie
def live(request):
    return render(request, "live.html", {
        "strategies": STRATEGY_NAMES,
        "modes": MODES,
        "can_control": request.user.is_authenticated,
    })


_password_login = LoginView.as_view(template_name="login.html")


def login(request):
    """`/login/?token=T` redeems a one-time link (printed by runlab); otherwise Django's form."""
    token = request.GET.get("token")
    if token is None or request.method != "GET":
        return _password_login(request)
    user = redeem_login_token(token)
    if user is None:
        return render(request, "login.html", {
            "form": LoginView.form_class(request),
            "link_error": "This login link is unknown, expired or already used.",
        }, status=400)
    auth_login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("live")
