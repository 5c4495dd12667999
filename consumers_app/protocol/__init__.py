"""Wire protocols.

* ``apache.rocketmq.v2`` comes generated with the official ``rocketmq-python-client``
  package (``rocketmq.grpc_protocol``); we import it from there and never hand-write it.
* ``rebalancelab.v1`` (``lab.proto`` beside this file) is the lab's own service. Its
  Python modules are generated from the .proto with grpcio-tools whenever they are
  missing or older than the .proto, so the repo holds only the source.
"""
import os
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent.parent


def _stale(proto: Path, generated: Path) -> bool:
    return not generated.exists() or generated.stat().st_mtime < proto.stat().st_mtime


def ensure_generated() -> None:
    """Compile every .proto here into <name>_pb2.py / <name>_pb2_grpc.py if out of date."""
    for proto in sorted(_HERE.glob("*.proto")):
        stem = proto.stem
        outputs = [_HERE / f"{stem}_pb2.py", _HERE / f"{stem}_pb2_grpc.py"]
        if not any(_stale(proto, out) for out in outputs):
            continue
        from grpc_tools import protoc  # build-time only dependency of the import

        # Generate into a scratch tree, then rename into place: several processes
        # (broker, workers, web) may import this at the same moment.
        with tempfile.TemporaryDirectory(dir=_HERE) as scratch:
            rel = proto.relative_to(_ROOT)
            code = protoc.main([
                "grpc_tools.protoc", f"-I{_ROOT}", f"--python_out={scratch}",
                f"--grpc_python_out={scratch}", str(rel),
            ])
            if code != 0:
                raise RuntimeError(f"protoc failed on {rel} (exit {code})")
            for out in outputs:
                os.replace(Path(scratch) / rel.parent / out.name, out)


ensure_generated()

from rocketmq.grpc_protocol import definition_pb2 as v2  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as v2_service  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as v2_grpc  # noqa: E402

from . import lab_pb2 as lab  # noqa: E402
from . import lab_pb2_grpc as lab_grpc  # noqa: E402

__all__ = ["v2", "v2_service", "v2_grpc", "lab", "lab_grpc", "ensure_generated"]
