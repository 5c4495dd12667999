"""Who may read the history and start the job: dashboard.auth.caller decides, as for
the API. Reading (pages, JSON, reports) needs a user unless ``DASHBOARD_PUBLIC_READ``;
starting the job (POST) always needs one. A refused page request goes to the login page,
a refused JSON request gets the reason with its status.
"""
from __future__ import annotations

import functools

from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from dashboard import auth


def _wants_json(request) -> bool:
    return not request.path.rstrip("/").endswith("/history") or "json" in request.headers.get("Accept", "")


def _guarded(view, write: bool):
    @csrf_exempt   # auth.caller makes the CSRF check for session users; token users need none
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            user = auth.caller(request, write=write)
        except auth.Refused as refused:
            if refused.status == 401 and not write and not _wants_json(request):
                return redirect_to_login(request.get_full_path())
            return JsonResponse({"error": refused.message}, status=refused.status)
        if user is not None:
            request.user = user
        return view(request, *args, **kwargs)
    return wrapper


def read_access(view):
    return _guarded(view, write=False)


def write_access(view):
    return _guarded(view, write=True)
