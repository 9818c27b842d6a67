"""A stack's services go when the process that started them goes, however it ends.

`calispec up` killed with SIGKILL (or OOM-killed) left its four services serving: the next `up` took over
the directory's lock and failed on their ports, and nothing named them. Each service now reads a pipe
the launcher holds as its standard input (`--stop-when-stdin-closes`); the pipe's end drains and stops it
as SIGTERM does. The memory service is the quickest to start, so it stands for all four here (they share
the flag through calispec_core/service_cli.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT

MEMORY = ["--port", "0", "--allow-unauthenticated-writes"]

# a launcher that starts one service as the stack does, says its pid, and waits to be killed
LAUNCHER = """
import sys, threading
from pathlib import Path
from calispec_tools.stack import LocalStack, StackConfig, claim_log_dir
tmp = Path(sys.argv[1])
config = StackConfig(tmp / "d", tmp / "t", tmp / "memory.db", tmp / "logs")
config.log_dir.mkdir()
stack = LocalStack(config)
stack._dir_lock = claim_log_dir(config.log_dir)
service = stack._spawn("memory_service", ["--port", "0", "--db", str(config.memory_db),
                                          "--allow-unauthenticated-writes"])
print(service.process.pid, flush=True)
threading.Event().wait()
"""


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether process `pid` (not our child) ended within `timeout_s`: its pidfd turns readable when it does."""
    fd = os.pidfd_open(pid)
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_a_service_drains_and_stops_when_its_stdin_closes(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "memory_service", *MEMORY, "--db", str(tmp_path / "m.db"), "--stop-when-stdin-closes"]
    with subprocess.Popen(
        argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert "memory_service listening on" in proc.stdout.readline()
        proc.stdin.close()
        proc.stdin = None  # closed: communicate() must not flush it
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "standard input closed" in err


def test_the_stacks_services_stop_when_their_launcher_is_killed(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    service_pid = int(launcher.stdout.readline())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    try:
        assert wait_gone(service_pid, timeout_s=60), "the memory service outlived the stack that started it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(service_pid, signal.SIGKILL)
    log = (tmp_path / "logs" / "memory_service.log").read_text()
    assert "standard input closed" in log  # drained and stopped, not killed


def test_sigterm_with_stdin_still_open_stops_cleanly(tmp_path: Path) -> None:
    # the watcher thread still blocked in its read: a buffered read made the interpreter's exit abort (-6)
    argv = [sys.executable, "-m", "memory_service", *MEMORY, "--db", str(tmp_path / "m.db"), "--stop-when-stdin-closes"]
    with subprocess.Popen(
        argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert "memory_service listening on" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, err


def test_the_flag_needs_a_pipe_on_stdin(tmp_path: Path) -> None:
    # /dev/null (a unit file copying the stack's command line) stopped the service at once; a closed fd 0
    # killed the watch thread with a traceback and the service never stopped on its own
    argv = [sys.executable, "-m", "memory_service", *MEMORY, "--db", str(tmp_path / "m.db"), "--stop-when-stdin-closes"]
    done = subprocess.run(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--stop-when-stdin-closes needs a pipe on standard input" in done.stderr
