from django.contrib.auth.views import LogoutView
from django.urls import include, path, re_path

from consumers_app.lab.actions import CONSUMER_ACTIONS

from . import api, metrics, views

CONSUMER_ACTION = "|".join(CONSUMER_ACTIONS)

api_patterns = [
    path("state", api.state, name="api-state"),
    path("groups/<str:group>/strategy", api.group_strategy, name="api-group-strategy"),
    path("groups/<str:group>/strategy/preview", api.group_strategy_preview, name="api-group-strategy-preview"),
    path("groups/<str:group>/rebalances/<int:rebalance_id>", api.group_rebalance, name="api-group-rebalance"),
    path("groups/<str:group>/lag", api.group_lag_series, name="api-group-lag-series"),
    path("groups/<str:group>/at", api.group_view_at, name="api-group-view-at"),
    path("groups/<str:group>/mode", api.group_mode, name="api-group-mode"),
    path("groups/<str:group>/consumers", api.group_consumers, name="api-group-consumers"),
    re_path(rf"^consumers/(?P<client_id>[^/]+)/(?P<action>{CONSUMER_ACTION})$", api.consumer_action,
            name="api-consumer-action"),
    path("observe", api.observe, name="api-observe"),
    path("producers/rate", api.producer_rate, name="api-producer-rate"),
    path("producers/burst", api.producer_burst, name="api-producer-burst"),
    path("topics/<str:topic>/queues", api.topic_queues, name="api-topic-queues"),
    path("brokers/<str:broker>/online", api.broker_online, name="api-broker-online"),
    path("brokers/<str:broker>/offline", api.broker_offline, name="api-broker-offline"),
    re_path(r"", api.not_found),  # JSON, not Django's HTML 404, for anything else under api/
]

urlpatterns = [
    path("", views.live, name="live"),
    path("login/", views.login, name="login"),
    path("logout/", LogoutView.as_view(next_page="login"), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/", include(api_patterns)),
    path("", include("dashboard.lag.urls")),
]
