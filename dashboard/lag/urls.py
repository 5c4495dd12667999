"""Lag history pages, JSON and reports (included at the root by dashboard/urls.py)."""
from django.urls import path, re_path

from . import views

app_name = "lag"

urlpatterns = [
    path("history/", views.history_page, name="history"),
    path("history/groups.json", views.groups_json, name="groups"),
    path("history/data.json", views.data_json, name="data"),
    path("history/job/", views.job, name="job"),
    # Any extension reaches the view so an unknown format is a 400 with a message, not a 404.
    re_path(r"^reports/lag\.(?P<fmt>[A-Za-z0-9]+)$", views.lag_report, name="report"),
    re_path(r"^reports/compare\.(?P<fmt>[A-Za-z0-9]+)$", views.compare_report, name="compare"),
]
