"""Who may read the history and start the job.

Reading (pages, JSON, reports) needs a logged-in user unless
``settings.DASHBOARD_PUBLIC_READ``; starting the job (POST) always needs a user. A
session user goes through Django's CSRF check; an ``Authorization: Token <token>``
header is accepted when ``dashboard.auth`` offers a resolver (optional: this package
works without it).
"""
from __future__ import annotations

import functools
import importlib

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

# Names a token resolver may have in dashboard.auth: (token string) -> user | None.
_TOKEN_RESOLVERS = ("user_for_api_token", "user_for_token", "user_from_token")


def token_user(request):
    header = request.headers.get("Authorization", "")
    if not header.startswith("Token "):
        return None
    token = header[len("Token "):].strip()
    try:
        auth = importlib.import_module("dashboard.auth")
    except ImportError:
        return None
    for name in _TOKEN_RESOLVERS:
        resolver = getattr(auth, name, None)
        if callable(resolver):
            try:
                user = resolver(token)
            except Exception:  # noqa: BLE001 - a bad token is just no user
                return None
            return user if getattr(user, "is_authenticated", False) else None
    return None


def _wants_json(request) -> bool:
    return not request.path.rstrip("/").endswith("/history") or "json" in request.headers.get("Accept", "")


def read_access(view):
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if getattr(settings, "DASHBOARD_PUBLIC_READ", False) or request.user.is_authenticated or token_user(request):
            return view(request, *args, **kwargs)
        if _wants_json(request):
            return JsonResponse({"error": "login required"}, status=401)
        return redirect_to_login(request.get_full_path())
    return wrapper


def write_access(view):
    """A user is required; session users pass the CSRF check, token users need none."""
    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.user.is_authenticated:
            check = CsrfViewMiddleware(lambda r: None)
            check.process_request(request)
            refused = check.process_view(request, None, (), {})
            if refused is not None:
                return JsonResponse({"error": "CSRF check failed"}, status=403)
        else:
            user = token_user(request)
            if user is None:
                return JsonResponse({"error": "login required"}, status=401)
            request.user = user
        return view(request, *args, **kwargs)
    return wrapper
