"""Access to the lag history pages, JSON and reports (no Spark: no history needed)."""
import pytest


@pytest.fixture
def private(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.DASHBOARD_PUBLIC_READ = False


def test_reading_needs_a_login_unless_public(private, client, settings):
    response = client.get("/history/")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=/history/")
    for url in ("/history/groups.json", "/history/data.json?group=G", "/reports/lag.csv?group=G", "/history/job/"):
        assert client.get(url).status_code == 401, url
    settings.DASHBOARD_PUBLIC_READ = True
    assert client.get("/history/").status_code == 200
    assert client.get("/history/groups.json").json()["groups"] == []
    # no history yet: any group is unknown, with a hint to run the job
    response = client.get("/reports/lag.csv", {"group": "G"})
    assert response.status_code == 400 and "lagjob" in response.json()["error"]


@pytest.mark.django_db
def test_api_token_reads_and_starts_nothing_without_a_user(private, client):
    from dashboard.auth import issue_api_token

    token = issue_api_token("reader")
    assert client.get("/history/groups.json", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200
    assert client.get("/history/groups.json", HTTP_AUTHORIZATION="Token nope").status_code == 401
    assert client.post("/history/job/", HTTP_AUTHORIZATION="Token nope").status_code == 401


@pytest.mark.django_db
def test_history_page_for_a_user_has_the_job_button_and_assets(private, client, django_user_model):
    client.force_login(django_user_model.objects.create_user("u", password="x"))
    html = client.get("/history/").content.decode()
    for needle in ('id="h-job"', "js/history.js", "css/history.css", "vendor/plotly/plotly.min.js",
                   "csrfmiddlewaretoken", 'id="chart-queue-lag"'):
        assert needle in html
    assert 'id="h-job" type="button">' in html  # enabled for a user


def test_the_job_status_names_the_recordings_the_stream_skipped(private, client, settings, tmp_path):
    import json

    settings.DASHBOARD_PUBLIC_READ = True
    (tmp_path / "lag").mkdir()
    (tmp_path / "lag" / "_state.json").write_text(json.dumps({
        "processed": {"snapshots": [], "events": []},
        "skipped": [{"file": "snapshots/date=2026-01-01/hour=10/part-58-x.parquet", "reason": "ArrowInvalid: bad"}]}))
    body = client.get("/history/job/").json()
    assert body["skipped"] == [{"file": "snapshots/date=2026-01-01/hour=10/part-58-x.parquet",
                                "reason": "ArrowInvalid: bad"}]
    html = client.get("/history/").content.decode()
    assert 'id="h-skipped"' in html
