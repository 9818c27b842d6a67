"""Calispec on a local Ray cluster, inside a network namespace the test makes (loopback only)."""

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

SCENARIO = Path(__file__).with_name("ray_scenario.py")
REPO = SCENARIO.parents[2]


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -n` (root or user namespaces) and `ip`")
def test_ray_up_scale_down(tiny_pair: TinyPair) -> None:
    pytest.importorskip("ray", reason="`make test-slow` installs the ray extra")
    # A short path: Ray's unix sockets live under its temp dir and have a ~107-byte limit.
    work = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
    script = f"ip link set lo up && exec {sys.executable} {SCENARIO} {tiny_pair.draft} {tiny_pair.target} {work}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(work)}
    process = subprocess.Popen(
        ["unshare", "-n", "bash", "-c", script], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,  # one group to kill
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the Ray scenario timed out:\n{output[-6000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert process.returncode == 0, output[-6000:]
    result = json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:])
    assert len(result["picks"]) == 2 and all(result["events"].values())
    assert result["memory_events"] == sum(result["events"].values())
