"""ConsumePool: the consume thread pool, without one future per message.

RocketMQ submits one ConsumeRequest per message to a 20-thread pool. In Python a
future + a loop wake-up per message costs more than a fast listener, so this pool keeps
RocketMQ's semantics (any idle thread takes the next message, one listener call per
message, a slow or stuck message holds up nobody else) with cheaper plumbing:

* work is one shared deque of items; ``submit`` extends it and wakes only as many
  threads as the measured listener time calls for (a fast listener: one thread
  drains a whole pull; a slow one: one thread per message, up to the pool size);
* idle threads also look at the deque every ``idle_check_s``, so messages queued
  behind a stuck one are picked up by another thread soon after;
* results go back to the event loop through one shared list and at most one pending
  ``call_soon_threadsafe`` at a time, so a busy loop drains many results per wake-up.
"""
from __future__ import annotations

import threading
import time
from collections import deque


class ConsumePool:
    def __init__(self, loop, size: int, call, on_results, name: str = "consume",
                 budget_ms: float = 2.0, idle_check_s: float = 0.05):
        self.loop = loop
        self.size = size
        self.call = call                  # call(item) -> status (run on a thread)
        self.on_results = on_results      # on_results([(item, status), ...]) (run on the loop)
        self.name = name
        self.budget_s = budget_ms / 1000
        self.idle_check_s = idle_check_s
        self._work: deque = deque()
        self._done: deque = deque()
        self._flush_pending = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._stopped = False
        self.per_message_s = 0.0          # EWMA of the listener's time per message

    # ------------------------------------------------------------------ loop side

    def submit(self, items) -> None:
        """Queue items (whatever ``call`` takes) and wake enough threads for them."""
        n = len(items)
        self._work.extend(items)
        if self.per_message_s > 0:
            wanted = min(n, max(1, int(n * self.per_message_s / self.budget_s)))
        else:
            wanted = 1
        with self._cond:
            if self._idle < wanted and len(self._threads) < self.size:
                for _ in range(min(wanted - self._idle, self.size - len(self._threads))):
                    t = threading.Thread(target=self._worker, name=f"{self.name}-{len(self._threads)}", daemon=True)
                    self._threads.append(t)
                    t.start()
            self._cond.notify(wanted)

    def _drain(self) -> None:
        self._flush_pending = False   # clear first: a result appended after this schedules again
        pending = self._done
        done = []
        while True:  # popleft is atomic: never loses a result appended meanwhile
            try:
                done.append(pending.popleft())
            except IndexError:
                break
        if done:
            self.on_results(done)

    def shutdown(self) -> None:
        self._stopped = True
        self._work.clear()
        with self._cond:
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        return len(self._work)

    # ------------------------------------------------------------------ thread side

    def _worker(self) -> None:
        work = self._work
        call = self.call
        cond = self._cond
        while not self._stopped:
            try:
                item = work.popleft()
            except IndexError:
                with cond:
                    if work or self._stopped:
                        continue
                    self._idle += 1
                    cond.wait(self.idle_check_s)
                    self._idle -= 1
                continue
            started = time.perf_counter()
            status = call(item)
            self.per_message_s = 0.9 * self.per_message_s + 0.1 * (time.perf_counter() - started)
            self._done.append((item, status))   # deque.append is atomic under the GIL
            if not self._flush_pending:
                self._flush_pending = True
                try:
                    self.loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # loop closed: we are shutting down
                    return
