"""A worker's last step (Worker.shutdown_clients): every client's graceful shutdown at
once, bounded; the log names the client whose goodbye did not get through, or failed."""
import asyncio
import logging

from consumers_app.lab import worker as worker_module
from consumers_app.lab.worker import Worker


class Client:
    def __init__(self, how: str):
        self.how, self.stopped, self.cancelled = how, False, False

    async def shutdown(self) -> None:
        if self.how == "stuck":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.how == "fails":
            raise RuntimeError("broker gone")
        self.stopped = True


async def test_the_log_names_the_client_that_did_not_shut_down(caplog, monkeypatch):
    monkeypatch.setattr(worker_module, "SHUTDOWN_TIMEOUT", 0.2)
    w = Worker("w7")
    w.consumers = {"c1": Client("ok"), "c2": Client("stuck"), "c3": Client("fails")}
    w.producers = {"producer-T": Client("ok")}
    clients = {**w.consumers, **w.producers}
    with caplog.at_level(logging.WARNING, logger=worker_module.__name__):
        await w.shutdown_clients()
    assert clients["c1"].stopped and clients["producer-T"].stopped
    assert clients["c2"].cancelled, "the one that did not finish is cancelled, not left running"
    lines = [r.getMessage() for r in caplog.records]
    assert any("c2 did not shut down within 0.2s" in line for line in lines), lines
    assert any("c3's shutdown failed" in line and "broker gone" in line for line in lines), lines
    assert not any("c1" in line or "producer-T" in line for line in lines), lines
    assert not w.consumers and not w.producers


async def test_nothing_to_shut_down_logs_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger=worker_module.__name__):
        await Worker("w8").shutdown_clients()
    assert not caplog.records
