"""Who may open the live websocket: `?token=` authentication (the origin check is in
security.py). Wraps the websocket router in asgi.py:

    SameOriginWebsocketValidator(AuthMiddlewareStack(QueryTokenAuthMiddleware(router)))
"""
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
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
