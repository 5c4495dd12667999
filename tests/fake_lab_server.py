"""`python -m tests.fake_lab_server --port P`: the dashboard on daphne with a FakeLab inside.

Prints the one-time login URL like `runlab` does, so browser tests can drive the page
without a broker. LAB_DATA_DIR should point at a scratch directory (its own SQLite).
"""
import argparse
import asyncio
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

from daphne.server import Server  # noqa: E402
from django.core.management import call_command  # noqa: E402

from dashboard.asgi import application  # noqa: E402
from dashboard.auth import issue_login_token  # noqa: E402
from tests.fake_lab import FakeLab  # noqa: E402


def with_fake_lab(app, lab: FakeLab):
    """Start the lab in daphne's loop on the first connection (the loop exists only then)."""
    started = []

    async def wrapper(scope, receive, send):
        if not started:
            started.append(asyncio.get_running_loop().create_task(lab.run()))
        return await app(scope, receive, send)
    return wrapper


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tick", type=float, default=0.2)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    print(f"Rebalance Lab (fake): open http://{args.host}:{args.port}/login/?token={issue_login_token()}", flush=True)
    Server(with_fake_lab(application, FakeLab(tick=args.tick)),
           endpoints=[f"tcp:port={args.port}:interface={args.host}"], verbosity=0).run()


if __name__ == "__main__":
    main()
