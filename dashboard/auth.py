"""Tokens: one-time login links for people, API tokens for scripts.

    issue_login_token("lab")          -> "…"   (runlab prints /login/?token=…)
    redeem_login_token(token)         -> User | None   (works once, before it expires)
    issue_api_token("alice")          -> "…"   (manage.py createtoken alice)
    user_for_api_token(token)         -> User | None

Users are created on demand (without a usable password) so a fresh lab needs no setup.
"""
import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
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
