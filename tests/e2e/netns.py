"""Run a scenario script inside a network namespace the test makes (`unshare -n`, loopback only)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    return probe.returncode == 0


def run_scenario(scenario: Path, args: list[str], prefix: str, timeout_s: float = 540) -> dict[str, Any]:
    """Run `scenario ARGS... WORKDIR` with lo up in a fresh namespace; returns its `RESULT {json}` line."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: Ray's unix sockets live under it
    script = f"ip link set lo up && exec {sys.executable} {scenario} {' '.join(args)} {work}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(work),
           # Ray waits 30 s for its GCS server's port and for the raylet to register by default; a busy
           # 2-core box has missed both ("The current node timed out during startup", wave 11)
           "RAY_gcs_server_port_wait_time_s": "120", "RAY_raylet_start_wait_time_s": "120"}  # fmt: skip
    process = subprocess.Popen(
        ["unshare", "-n", "bash", "-c", script], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,  # one group to kill
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{scenario.name} timed out:\n{output[-6000:]}{ray_log_tails(work)}")
    else:
        if process.returncode != 0:  # before the directory goes: why Ray's node did not come up is in its logs
            output += ray_log_tails(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert process.returncode == 0, output[-9000:]
    return json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:])


def ray_log_tails(work: Path, lines: int = 15) -> str:
    """The last lines of the Ray node's own logs under `work` (the scenarios' `_temp_dir`): a raylet that
    never registered once failed a run with only "The current node timed out during startup" to show."""
    folder = work / "ray" / "session_latest" / "logs"  # through a link to the session_<time> directory
    if not folder.is_dir():
        return ""  # no Ray node was started there
    logs = sorted(folder.iterdir())  # named first: a raylet that never started left no log of its own (wave 34)
    tails = [f"--- ray/session_latest/logs holds: {', '.join(log.name for log in logs) or 'nothing'}"]
    for log in logs:
        if log.name.startswith(("raylet.", "gcs_server.")) and log.is_file():
            text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.relative_to(work)}\n" + "\n".join(text))
    return "\n" + "\n".join(tails)
