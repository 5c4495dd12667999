"""Logging in: one-time links, the password form, API tokens, and which pages need a user.

Runs on the configured database; test_web_postgres.py runs this module on PostgreSQL too.
"""
import io
import os
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from dashboard.auth import digest, issue_login_token, redeem_login_token, user_for_api_token
from dashboard.models import ApiToken, LoginToken

pytestmark = pytest.mark.django_db


def test_runs_on_the_configured_database():
    # test_web_postgres.py sets EXPECT_DB_VENDOR=postgresql when it runs this module.
    assert os.environ.get("EXPECT_DB_VENDOR", connection.vendor) == connection.vendor


def test_login_link_logs_in_once(client):
    token = issue_login_token()
    response = client.get(f"/login/?token={token}")
    assert response.status_code == 302 and response.url == "/"
    assert client.get("/").status_code == 200
    assert client.get("/").context["user"].username == "lab"

    again = type(client)().get(f"/login/?token={token}")
    assert again.status_code == 400
    assert "already used" in again.content.decode()
    # Reopened by whoever it logged in: the page, not an error under a logged-in header.
    reopened = client.get(f"/login/?token={token}")
    assert reopened.status_code == 302 and reopened.url == "/"


def test_a_logged_in_user_reopening_a_used_link_or_the_login_page_goes_to_the_page(client):
    token = issue_login_token()
    assert client.get(f"/login/?token={token}").status_code == 302
    for _ in range(3):   # a bookmark of the link, opened again and again: never the error, never the limiter
        reopened = client.get(f"/login/?token={token}")
        assert reopened.status_code == 302 and reopened.url == "/"
        assert b"already used" not in reopened.content
    form = client.get("/login/?next=/history/")
    assert form.status_code == 302 and form.url == "/history/"
    assert client.get("/login/").url == "/"
    # Logged out, the same link says what is wrong with it, under a header that says so too.
    client.post("/logout/")
    page = client.get(f"/login/?token={token}")
    assert page.status_code == 400 and b"already used" in page.content and b'id="current-user"' not in page.content


def test_unknown_and_expired_links_fail(client):
    assert client.get("/login/?token=made-up").status_code == 400
    token = issue_login_token("bob", lifetime=timedelta(seconds=-1))
    assert client.get(f"/login/?token={token}").status_code == 400
    assert client.get("/").status_code == 302


def test_a_link_is_redeemed_by_exactly_one_caller():
    token = issue_login_token("carol")
    assert redeem_login_token(token).username == "carol"
    assert redeem_login_token(token) is None


def test_only_digests_are_stored():
    token = issue_login_token("dave")
    row = LoginToken.objects.get(user__username="dave")
    assert row.digest == digest(token) and token not in row.digest
    out = io.StringIO()
    call_command("createtoken", "erin", stdout=out)
    api_token = out.getvalue().strip()
    assert ApiToken.objects.get(user__username="erin").digest == digest(api_token)
    assert user_for_api_token(api_token).username == "erin"
    assert user_for_api_token("nope") is None


def test_createtoken_creates_the_user_and_the_api_accepts_the_token(client):
    out = io.StringIO()
    call_command("createtoken", "frank", stdout=out)
    assert get_user_model().objects.filter(username="frank").exists()
    token = out.getvalue().strip()
    # A body the API refuses (400) proves the token got past authentication (401).
    def call(header):
        return client.post("/api/groups/GID_LAB/strategy", "{}", content_type="application/json",
                           headers={"Authorization": header}).status_code
    assert call(f"Token {token}") == 400
    assert call("Token wrong") == 401


def test_password_form(client):
    get_user_model().objects.create_user("grace", password="s3cret")
    page = client.get("/login/")
    assert page.status_code == 200 and b'name="password"' in page.content
    bad = client.post("/login/", {"username": "grace", "password": "nope"})
    assert bad.status_code == 200 and b"Wrong username or password" in bad.content
    good = client.post("/login/", {"username": "grace", "password": "s3cret"})
    assert good.status_code == 302 and good.url == "/"
    assert client.get("/").status_code == 200


def test_pages_need_a_user_unless_public_read(client, settings):
    settings.DASHBOARD_PUBLIC_READ = False
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/login/?next=/")
    settings.DASHBOARD_PUBLIC_READ = True
    page = client.get("/")
    assert page.status_code == 200
    assert b'data-can-control="0"' in page.content and b'id="lab-controls"' not in page.content


def test_the_page_offers_controls_and_a_csrf_token_to_users(client):
    client.get(f"/login/?token={issue_login_token()}")
    page = client.get("/")
    assert b'data-can-control="1"' in page.content and b'id="lab-controls"' in page.content
    assert b'name="csrf-token"' in page.content and "csrftoken" in page.cookies
    assert b"vendor/plotly/plotly.min.js" in page.content


def test_logout(client):
    client.get(f"/login/?token={issue_login_token()}")
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302
