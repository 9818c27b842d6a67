"""`calispec calibrate --ray`: a local Ray cluster in a network namespace the test makes (loopback only)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import TinyPair
from tests.e2e.test_ray import _can_unshare

SCENARIO = Path(__file__).with_name("calibrate_ray_scenario.py")
REPO = SCENARIO.parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -n` (root or user namespaces) and `ip`")
def test_calibrate_on_ray_writes_through_the_memory_service(tiny_pair: TinyPair) -> None:
    pytest.importorskip("ray", reason="`make test-slow` installs the ray extra")
    work = Path(tempfile.mkdtemp(prefix="cc-", dir="/tmp"))  # short: Ray's unix sockets live under it
    script = f"ip link set lo up && exec {sys.executable} {SCENARIO} {tiny_pair.draft} {tiny_pair.target} {work}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(work)}
    process = subprocess.Popen(
        ["unshare", "-n", "bash", "-c", script], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the Ray calibration scenario timed out:\n{output[-6000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert process.returncode == 0, output[-6000:]
    result = json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:])
    assert result["events"] > 0 and len(result["workers"]) == 2
