"""Who may open the live websocket: origin check and `?token=` authentication.

Wraps the websocket router in asgi.py:

    ScriptFriendlyOriginValidator(AuthMiddlewareStack(QueryTokenAuthMiddleware(router)))
"""
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from .auth import user_for_api_token


class QueryTokenAuthMiddleware(BaseMiddleware):
    """`ws/lab/?token=<api token>` authenticates scripts (browsers use the session cookie).

    A token, when given, wins over the session; an unknown one leaves the user anonymous
    and sets scope["token_rejected"] so the consumer can refuse rather than fall back.
    """

    async def __call__(self, scope, receive, send):
        tokens = parse_qs(scope.get("query_string", b"").decode("latin1")).get("token")
        if tokens:
            user = await database_sync_to_async(user_for_api_token)(tokens[-1])
            scope = {**scope, "user": user or AnonymousUser(), "token_rejected": user is None}
        return await super().__call__(scope, receive, send)


class _OriginOrScriptValidator(OriginValidator):
    def valid_origin(self, parsed_origin):
        # Browsers always send Origin, so a cross-site page (the only way to ride a victim's
        # session cookie) is caught below. A client without Origin is a script: it has no
        # victim's cookie and must bring a token, so refusing it would protect nothing.
        return parsed_origin is None or super().valid_origin(parsed_origin)


def ScriptFriendlyOriginValidator(application):
    """Channels' AllowedHostsOriginValidator (Origin must be one of ALLOWED_HOSTS), but
    clients that send no Origin at all (scripts, not browsers) are let through to auth."""
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return _OriginOrScriptValidator(application, allowed_hosts)
