"""Ctrl-C while `python -m draft_service` (or target_service, coordinator, memory_service) still imports
(seconds of torch, before `main()` and its own guard): exit 130 quietly, as at any later point of the
start-up. It printed Python's KeyboardInterrupt traceback (and died of the signal).

A sitecustomize holds the service in its first import of a heavy module (torch; the memory service's
SQLite layer) until a signal comes, and says so on stdout:
the test reads that line, then sends SIGINT. No sleep: the signal's wakeup fd ends the wait even when the
signal comes before it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

HOLD_IMPORT = '''
import os
import select
import signal
import sys


class HoldImport:
    """Blocks the first import of HELD until a signal arrives (the default SIGINT handler then raises there)."""

    def find_spec(self, name, path=None, target=None):
        if name != HELD:
            return None
        sys.meta_path.remove(self)
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        print("importing", name, flush=True)
        select.select([read], [], [])
        return None


# as in a terminal, even where the test runner ignores SIGINT (a child would inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.meta_path.insert(0, HoldImport())
'''


# each service's command line, {tmp} the test's directory (never parsed: the signal comes while it imports)
SERVICE_ARGS = {
    "draft_service": ["--model", "{tmp}/model", "--port", "0"],
    "target_service": ["--model", "{tmp}/model", "--port", "0"],
    "coordinator": ["--draft-addr", "127.0.0.1:1", "--target-addr", "127.0.0.1:1", "--tokenizer", "{tmp}/model"],
    "memory_service": ["--port", "0", "--db", "{tmp}/memory.db", "--allow-unauthenticated-writes"],
}
# the slow import each one is held in: the memory service does without torch (test below)
HELD = {"draft_service": "torch", "target_service": "torch", "coordinator": "torch", "memory_service": "sqlite_utils"}


@pytest.mark.parametrize("service", SERVICE_ARGS)
def test_ctrl_c_while_torch_imports_exits_130_quietly(tmp_path: Path, service: str) -> None:
    (tmp_path / "sitecustomize.py").write_text(f"HELD = {HELD[service]!r}\n{HOLD_IMPORT}")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, "-m", service, *(arg.format(tmp=tmp_path) for arg in SERVICE_ARGS[service])]
    with subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first != f"importing {HELD[service]}\n":
            proc.kill()
            pytest.fail(f"the service never reached `import {HELD[service]}`: {first!r} {proc.communicate()[1]}")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert (proc.returncode, out, err) == (130, "", "")


def test_the_memory_service_starts_without_torch() -> None:
    # it needs neither torch nor transformers; the shared metrics module pulled both in (~3 s, ~200 MB)
    probe = "import sys, memory_service.__main__; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n", done.stderr
