"""ASGI entry point: HTTP through Django, the live websocket through Channels.

This is a web-only process (`python -m daphne dashboard.asgi:application`): it talks to
the lab controller over the channel layer (consumers_app.lab.bus), wherever that runs.
"""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from .routing import websocket_urlpatterns  # noqa: E402
from .security import SameOriginWebsocketValidator  # noqa: E402
from .ws_auth import QueryTokenAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter({
    # Static files are served by the app itself so `make run` needs no web server in front.
    "http": ASGIStaticFilesHandler(django_asgi_app),
    "websocket": SameOriginWebsocketValidator(
        AuthMiddlewareStack(QueryTokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
    ),
})
