"""Replacing a file atomically, the one way the project does it: write a temporary file in
the same directory, optionally fsync it, then ``os.replace`` it over the target (one
rename). A reader, or a restart after a crash, sees the old content or the new, never half.

``durable=True`` (the broker's own files: topics, offsets, consume-queue checkpoint) also
survives a power cut once the call returns, as far as the file's content goes; the caller
fsyncs the directory when the name itself must be durable. ``durable=False`` is for files
that are rewritten often and may fall back to their previous content (a client's local
offsets, like RocketMQ's MixAll.string2File).
"""
import json
import os
import threading
from pathlib import Path


def write_bytes(path, data: bytes, durable: bool = True) -> None:
    path = Path(path)
    # Same directory (a rename never crosses file systems); unique per writer thread.
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(scratch, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def write_json(path, value, durable: bool = True, **dumps) -> None:
    """``value`` as JSON (``json.dumps(value, **dumps)``), replacing ``path`` atomically."""
    write_bytes(path, json.dumps(value, **dumps).encode(), durable)
