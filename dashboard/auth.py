"""Tokens: one-time login links for people, API tokens for scripts.

    issue_login_token("lab")          -> "…"   (runlab prints /login/?token=…)
    redeem_login_token(token)         -> User | None   (works once, before it expires)
    issue_api_token("alice")          -> "…"   (manage.py createtoken alice)
    user_for_api_token(token)         -> User | None
    caller(request, write=...)        -> User | None, or raises Refused(status, message)

Users are created on demand (without a usable password) so a fresh lab needs no setup.
"""
import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone

from .models import ApiToken, LoginToken

LOGIN_TOKEN_LIFETIME = timedelta(hours=24)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _user(username: str):
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def issue_login_token(username: str = "lab", lifetime: timedelta = LOGIN_TOKEN_LIFETIME) -> str:
    token = secrets.token_urlsafe(32)
    LoginToken.objects.create(user=_user(username), digest=digest(token), expires_at=timezone.now() + lifetime)
    return token


def redeem_login_token(token: str):
    """The token's user if the token is known, unexpired and unused; it is used up either way."""
    now = timezone.now()
    # One conditional UPDATE: of two concurrent redemptions exactly one wins.
    won = LoginToken.objects.filter(digest=digest(token), used_at__isnull=True, expires_at__gt=now).update(used_at=now)
    if not won:
        return None
    return LoginToken.objects.select_related("user").get(digest=digest(token)).user


def issue_api_token(username: str) -> str:
    token = secrets.token_urlsafe(32)
    ApiToken.objects.create(user=_user(username), digest=digest(token))
    return token


def user_for_api_token(token: str):
    row = ApiToken.objects.select_related("user").filter(digest=digest(token), user__is_active=True).first()
    return row.user if row else None


# ---------------------------------------------------------------- who is calling

class Refused(Exception):
    """The caller may not go on: ``status`` (401/403) and a message saying what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# The CSRF check Django's middleware would have made, run by hand for session callers
# only (the views are csrf_exempt so that token callers, who send no cookie, pass).
_csrf_check = CsrfViewMiddleware(lambda request: None)


def caller(request, *, write: bool):
    """The user behind a request to the API or the history pages (sync: run it in a
    thread from async views). ``Authorization: Token <api token>`` names a user and needs
    no CSRF token; a session user needs one to write. None: an anonymous reader, allowed
    when ``DASHBOARD_PUBLIC_READ``. Anything else raises Refused."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "token" or not token.strip():
            raise Refused(401, "the Authorization header must read 'Token <api token>'")
        user = user_for_api_token(token.strip())
        if user is None:
            raise Refused(401, "unknown API token (create one with: manage.py createtoken USERNAME)")
        return user
    user = request.user
    if not user.is_authenticated:
        if not write and settings.DASHBOARD_PUBLIC_READ:
            return None
        raise Refused(401, "authentication required: log in, or send 'Authorization: Token <api token>'")
    if write and _csrf_check.process_view(request, None, (), {}) is not None:
        raise Refused(403, "CSRF check failed: send the csrftoken cookie's value as X-CSRFToken")
    return user
