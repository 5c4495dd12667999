"""Settings for Rebalance Lab.

Every replacement of an embedded default is an environment variable (README, "Scaling
out"): DATABASE_URL, CHANNEL_LAYER_URL, LAB_BROKER, LAB_NAMESRV / LAB_PROXY (README, "Your own
cluster"), SPARK_MASTER / SPARK_REMOTE.
"""
import os
import secrets
from pathlib import Path

import dj_database_url
import plotly

BASE_DIR = Path(__file__).resolve().parent.parent
# Everything the lab writes at run time (database, broker store, recordings, reports).
DATA_DIR = Path(os.environ.get("LAB_DATA_DIR", BASE_DIR / "var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """From the environment, else one generated per checkout and kept out of git."""
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    path = DATA_DIR / "secret_key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before channels: our runworker (a lab worker process) must win over channels' own.
    "consumers_app",
    "channels",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.security.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
ASGI_APPLICATION = "dashboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}"), conn_max_age=60
    )
}


def _owner_only(path: Path) -> None:
    """Users, sessions and token hashes live in the SQLite file: readable by its owner only."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)


if DATABASES["default"]["ENGINE"].endswith("sqlite3") and DATABASES["default"]["NAME"] not in ("", ":memory:"):
    _owner_only(Path(DATABASES["default"]["NAME"]))

if os.environ.get("CHANNEL_LAYER_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py times socket reads out after 5 s, the same as channels-redis' blocking
                # read (BZPOPMIN 5 s): an idle websocket would die with "Timeout reading".
                "hosts": [{"address": os.environ["CHANNEL_LAYER_URL"], "socket_timeout": 10}],
                "capacity": 1500,
                "expiry": 10,
            },
        }
    }
else:
    # The same per-channel capacity as on Redis: 300 requests at once must queue, not overflow.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                  "CONFIG": {"capacity": 1500}}}

AUTH_PASSWORD_VALIDATORS = []
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# plotly.js is served from the plotly package's own copy (no CDN, works offline).
STATICFILES_DIRS = [BASE_DIR / "static", ("vendor/plotly", Path(plotly.__file__).parent / "package_data")]
STATIC_ROOT = DATA_DIR / "staticfiles"

# The lab (consumers_app): where the embedded broker listens and keeps its files.
LAB_BROKER = os.environ.get("LAB_BROKER", "127.0.0.1:8081")
# runlab on an existing RocketMQ cluster instead of the embedded broker: its name server
# (HOST:PORT; runlab --namesrv overrides it), and a RocketMQ 5 proxy's gRPC endpoint for pop groups.
LAB_NAMESRV = os.environ.get("LAB_NAMESRV", "")
LAB_PROXY = os.environ.get("LAB_PROXY", "")
LAB_BROKER_DATA_DIR = Path(os.environ.get("LAB_BROKER_DATA_DIR", DATA_DIR / "broker"))
# Pages readable without login (control always needs a user).
DASHBOARD_PUBLIC_READ = os.environ.get("DASHBOARD_PUBLIC_READ", "0") == "1"

# Per-user limits of the control API (dashboard/throttle.py): actions per second and burst,
# and messages a user may send through the burst control per minute.
LAB_CONTROL_RATE = float(os.environ.get("LAB_CONTROL_RATE", "5"))
LAB_CONTROL_BURST = int(os.environ.get("LAB_CONTROL_BURST", "20"))
LAB_BURST_MESSAGES_PER_MINUTE = int(os.environ.get("LAB_BURST_MESSAGES_PER_MINUTE", "300000"))
# How often (seconds) an observed group (POST /api/observe) is asked about on the cluster.
LAB_OBSERVE_INTERVAL = float(os.environ.get("LAB_OBSERVE_INTERVAL", "1"))
# How big a run may get (refused past them with a 400 naming the limit).
LAB_MAX_CONSUMERS = int(os.environ.get("LAB_MAX_CONSUMERS", "128"))
LAB_MAX_GROUP_CONSUMERS = int(os.environ.get("LAB_MAX_GROUP_CONSUMERS", "64"))
LAB_MAX_TOPIC_QUEUES = int(os.environ.get("LAB_MAX_TOPIC_QUEUES", "1024"))
# Retention (README "Disk retention"): raw recordings are deleted by the hour once older
# than this many hours (the lab controller), lag history once this many days older than
# its newest window (the lag job, at the end of each run).
LAB_RECORDINGS_HOURS = float(os.environ.get("LAB_RECORDINGS_HOURS", "24"))
LAB_HISTORY_DAYS = float(os.environ.get("LAB_HISTORY_DAYS", "7"))
# runlab keeps the lag history fresh with a supervised `manage.py lagservice` (one more JVM); 0 turns it off.
LAB_LAG_SERVICE = os.environ.get("LAB_LAG_SERVICE", "1") != "0"
LOGIN_FAILURES_PER_MINUTE = int(os.environ.get("LOGIN_FAILURES_PER_MINUTE", "10"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Expected faults (a cut, an offline broker) in one line each, bursts counted (quiet_logs.py).
    "filters": {"expected_faults": {"()": "consumers_app.lab.quiet_logs.ExpectedFaults"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["expected_faults"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("LAB_LOG_LEVEL", "WARNING")},
}
