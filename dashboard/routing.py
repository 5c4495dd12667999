from django.urls import path, re_path

from .consumers import LabConsumer, UnknownWebsocket

websocket_urlpatterns = [
    path("ws/lab/", LabConsumer.as_asgi()),
    # Anything else gets a close with a reason, not the router's exception (a 500).
    re_path(r"", UnknownWebsocket.as_asgi()),
]
