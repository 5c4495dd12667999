"""consumers_app/atomic.py: a file is replaced whole or not at all, and no scratch file stays."""
import json

import pytest

from consumers_app.atomic import write_bytes, write_json


@pytest.mark.parametrize("durable", [True, False])
def test_write_json_replaces_the_file_and_leaves_no_scratch(tmp_path, durable):
    path = tmp_path / "offsets.json"
    write_json(path, {"a": 1}, durable=durable)
    write_json(path, {"a": 2}, durable=durable, indent=1)
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["offsets.json"]


def test_a_failed_write_keeps_the_old_content_and_leaves_no_scratch(tmp_path):
    path = tmp_path / "checkpoint"
    write_bytes(path, b"old")
    with pytest.raises(TypeError):
        write_bytes(path, "text, not bytes")   # fails with the scratch file open
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]
