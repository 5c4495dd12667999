"""The login and token flows on a real PostgreSQL (DATABASE_URL), not only on SQLite.

pytest-django builds its test database once per session from the settings, so the auth
tests run again in a child pytest whose DATABASE_URL names PostgreSQL.
"""
import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest

from .support import REPO

pytestmark = pytest.mark.lab   # lane: Django on the real PostgreSQL


def test_auth_flows_on_postgresql(postgres_url):
    # Our own database name, so parallel suites on the same server do not collide
    # (pytest-django creates and drops test_<name>).
    url = urlunsplit(urlsplit(postgres_url)._replace(path="/rebalance_web"))
    env = {**os.environ, "DATABASE_URL": url, "EXPECT_DB_VENDOR": "postgresql"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_web_auth.py", "-q", "-p", "no:cacheprovider", "--create-db"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout
