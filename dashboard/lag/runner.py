"""Starting the lag job from the web process, and reading its progress.

The job runs as its own process (``manage.py lagjob --progress-file ...``): Spark's JVM
stays out of the web server, and every web process sees the same progress through one
JSON file, ``DATA_DIR/lag/_job.json``::

    {"state": "running"|"done"|"failed", "done": 3, "total": 8, "label": "queue windows",
     "pid": 1234, "started": "...Z", "finished": "...Z"|null, "result": {...}|null, "error": "..."|null}

The command writes it (see ``ProgressFile``); a "running" file whose process is gone
reads as "failed". Output goes to ``DATA_DIR/lag/_job.log``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from .history import default_lag_dir
from consumers_app import atomic

STATUS_FILE = "_job.json"
LOG_FILE = "_job.log"
_start_lock = threading.Lock()


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) is not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def write_json(path: Path, data: dict) -> None:
    """Write ``path`` atomically (a reader sees the old content or the new, never half); a
    status file, rewritten often: not fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, data, durable=False)


class ProgressFile:
    """What the lagjob command writes as it goes (atomically: readers never see half a file)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.data = {"state": "running", "done": 0, "total": 0, "label": "starting", "pid": os.getpid(),
                     "started": utc_now_iso(), "finished": None, "result": None, "error": None}

    def write(self, **changes) -> None:
        self.data.update(changes)
        write_json(self.path, self.data)

    def progress(self, done: int, total: int, label: str) -> None:
        self.write(done=done, total=total, label=label)

    def finish(self, result: dict) -> None:
        total = self.data["total"] or 1
        self.write(state="done", finished=utc_now_iso(), result=result, label="done", done=total, total=total)

    def fail(self, error: str) -> None:
        self.write(state="failed", finished=utc_now_iso(), error=error)


def read_running(path: Path) -> dict | None:
    """A status file written by a process (``pid``); a "running" one whose process is gone
    reads as "failed". None if there is none."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if data.get("state") == "running" and not _alive(data.get("pid")):
        data.update(state="failed", error=data.get("error") or "the process ended without finishing")
    return data


def job_status(lag_dir: Path | None = None) -> dict:
    data = read_running(Path(lag_dir or default_lag_dir()) / STATUS_FILE)
    if data is None:
        return {"state": "idle", "done": 0, "total": 0, "label": "", "result": None, "error": None}
    data["fraction"] = round(data["done"] / data["total"], 3) if data.get("total") else 0.0
    return data


def start_job(lag_dir: Path | None = None, args: list[str] | None = None) -> tuple[bool, dict]:
    """Start ``manage.py lagjob`` in the background unless one is running -> (started, status)."""
    from django.conf import settings

    lag_dir = Path(lag_dir or default_lag_dir())
    with _start_lock:
        status = job_status(lag_dir)
        if status["state"] == "running":
            return False, status
        lag_dir.mkdir(parents=True, exist_ok=True)
        progress = ProgressFile(lag_dir / STATUS_FILE)
        log = open(lag_dir / LOG_FILE, "w")
        proc = subprocess.Popen(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "lagjob",
             "--progress-file", str(progress.path), *(args or [])],
            cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "LAB_DATA_DIR": str(settings.DATA_DIR)}, start_new_session=True)
        log.close()
        # Written here too so a poll right after the POST already sees "running".
        progress.data["pid"] = proc.pid
        progress.write()
        threading.Thread(target=proc.wait, name="lagjob-reaper", daemon=True).start()
        return True, job_status(lag_dir)
