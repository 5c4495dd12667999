"""The live page's pure JavaScript (its state reducer and format helpers, static/js/) under
Node's own test runner: no npm dependency, no browser."""
import shutil
import subprocess

import pytest

from tests.support import REPO, require

pytestmark = pytest.mark.unit   # lane: in-process speed, whatever runs it

JS_TESTS = REPO / "static" / "js" / "tests"


def test_js_units_pass_under_node():
    node = shutil.which("node")
    require(node is not None, "Node.js is not installed (apt-get install nodejs)")
    files = sorted(str(p) for p in JS_TESTS.glob("*.test.mjs"))
    assert files, f"no *.test.mjs under {JS_TESTS}"
    result = subprocess.run([node, "--test", *files], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"node --test failed:\n{result.stdout}\n{result.stderr}"
