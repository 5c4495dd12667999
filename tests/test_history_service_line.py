"""The live page's history line ("history: 3 % CPU, 6 s behind"): what the lab reads of the
lag service's status file (consumers_app/lab/disk.py) and how often (polling.py). No broker:
the poll loop runs with its offset poll stubbed out."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from consumers_app.lab.disk import history_service
from consumers_app.lab.polling import PollLoops
from tests.support import async_wait_until


def write_status(lag_dir, **status) -> None:
    (lag_dir / "_service.json").write_text(json.dumps({"state": "running", "paused": None, **status}))


def test_the_line_says_how_far_behind_the_newest_folded_sample_the_history_is(tmp_path):
    assert history_service(None, 0) is None                 # no lag service in this lab
    assert history_service(tmp_path, 0) is None             # none has run on this data dir yet
    write_status(tmp_path, cpu_pct=3.1, newest_sample_ts=1_000_000)
    assert history_service(tmp_path, 1_006_040) == {"state": "running", "cpu_pct": 3.1, "behind_s": 6.0,
                                                   "paused": None}
    write_status(tmp_path, cpu_pct=None, newest_sample_ts=None)   # started, nothing folded in yet
    assert history_service(tmp_path, 1_006_040)["behind_s"] is None
    write_status(tmp_path, cpu_pct=2.0, newest_sample_ts=1_000_000)   # the last run's, read after a restart
    assert history_service(tmp_path, 2_512_000, since_ms=2_500_000)["behind_s"] is None
    assert history_service(tmp_path, 2_512_000, since_ms=900_000)["behind_s"] == 1512.0
    (tmp_path / "_service.json").write_text("{half")        # caught mid-write: no line, no error
    assert history_service(tmp_path, 0) is None


async def test_every_poll_reads_the_service_anew(tmp_path):
    # The service passes every 10 s: read every 10 s too (with the disk), "behind" showed one
    # phase of its sawtooth for minutes. Each 1-s poll reads it.
    lab = SimpleNamespace(state=SimpleNamespace(history_service=None), disk_places=SimpleNamespace(lag_history=tmp_path),
                          poll_interval=0.05, _snapshot_due=False, started_ms=0)

    async def no_offsets():
        return None

    lab.poll_offsets, lab.collect_garbage = no_offsets, lambda: None
    lab.read_history_service = lambda: PollLoops.read_history_service(lab)
    loop = asyncio.create_task(PollLoops._poll_loop(lab))
    try:
        write_status(tmp_path, cpu_pct=4.0, newest_sample_ts=1)
        await async_wait_until(lambda: (lab.state.history_service or {}).get("cpu_pct") == 4.0, timeout=5,
                               message="the first status read")
        write_status(tmp_path, cpu_pct=5.0, newest_sample_ts=2)
        await async_wait_until(lambda: lab.state.history_service["cpu_pct"] == 5.0, timeout=5,
                               message="the next pass's status read by a poll, not 10 s later")
        assert lab._snapshot_due
        lab.disk_places = None   # a lab told of no data dirs (tests, a bare controller): no line, no crash
        await async_wait_until(lambda: lab.state.history_service is None, timeout=5, message="no line")
        assert not loop.done()
    finally:
        loop.cancel()
