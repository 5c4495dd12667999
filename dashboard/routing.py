from django.urls import path

from .consumers import LabConsumer

websocket_urlpatterns = [
    path("ws/lab/", LabConsumer.as_asgi()),
]
