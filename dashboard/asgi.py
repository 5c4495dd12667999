"""ASGI entry point: HTTP through Django, websockets through Channels."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

application = ProtocolTypeRouter({
    # Static files are served by the app itself so `make run` needs no web server in front.
    "http": ASGIStaticFilesHandler(django_asgi_app),
})
