"""The controller request/reply seam over the (in-memory) channel layer."""
import asyncio

import pytest

from consumers_app.lab import bus


async def test_request_reply_and_errors():
    async def handler(action, params):
        if action == "echo":
            return {"echo": params}
        raise bus.LabError(f"unknown action {action!r}")

    server = asyncio.create_task(bus.serve(handler))
    try:
        assert await bus.request("echo", x=1) == {"echo": {"x": 1}}
        with pytest.raises(bus.LabError, match="unknown action 'nope'"):
            await bus.request("nope")
    finally:
        server.cancel()


async def test_request_without_controller_times_out():
    with pytest.raises(bus.LabUnavailable):
        await bus.request("state", timeout=0.2)
