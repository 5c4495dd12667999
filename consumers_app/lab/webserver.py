"""Daphne, run programmatically, with the lab controller on the same asyncio loop.

Daphne drives Twisted's asyncio reactor, so the reactor's loop *is* an asyncio loop:
``on_start`` is scheduled on it once the reactor runs, and ``on_stop`` runs before the
reactor shuts down (SIGINT/SIGTERM included), with Twisted waiting for it to finish.
"""
import asyncio
import logging

from .supervised import StartError

log = logging.getLogger(__name__)

# Connections the kernel holds for daphne until it accepts them. Twisted's default is 50:
# a page's scripts, 20 open websockets and a script's 400 requests at once overflow it, and
# the overflowed connections wait out SYN retries, or are reset when the queue stays full.
# The kernel caps it at net.core.somaxconn (4096 on current Linux).
LISTEN_BACKLOG = 1024


def run_web(host: str, port: int, *, on_start=None, on_stop=None, verbosity: int = 0) -> bool:
    """Serve ``settings.ASGI_APPLICATION`` on host:port until stopped.

    Returns False when ``on_start`` failed (the server then stops at once).
    """
    # daphne.server installs the asyncio reactor: import it before anything imports
    # twisted.internet.reactor.
    from daphne.management.commands.runserver import get_default_application
    from daphne.server import Server
    from twisted.internet import defer, reactor

    server = Server(get_default_application(), endpoints=[f"tcp:port={port}:interface={host}:backlog={LISTEN_BACKLOG}"],
                    signal_handlers=True, verbosity=verbosity)
    outcome = {"ok": True}

    def started(task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            outcome["ok"] = False
            exc = None if task.cancelled() else task.exception()
            if isinstance(exc, StartError):   # a child that did not come up said why above: no traceback
                log.error("lab start-up failed: %s", exc)
            else:
                log.error("lab start-up failed", exc_info=exc)
            reactor.stop()

    if on_start is not None:
        reactor.callWhenRunning(lambda: asyncio.ensure_future(on_start()).add_done_callback(started))
    if on_stop is not None:
        reactor.addSystemEventTrigger(
            "before", "shutdown", lambda: defer.Deferred.fromFuture(asyncio.ensure_future(on_stop())))
    server.run()
    return outcome["ok"]
