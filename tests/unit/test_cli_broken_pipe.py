"""A CLI whose stdout reader goes away (`calispec ... | head`) ends quietly with a shell's SIGPIPE status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from calispec_tools.cli import SIGPIPE_STATUS


def test_a_closed_stdout_ends_the_command_without_a_traceback(tmp_path: Path) -> None:
    """`calispec calibrate ... | head` raised BrokenPipeError at its final summary, after the export and the memory
    writes were done: a traceback and status 1 for a finished run (or, for short output, Python's "Exception
    ignored" at exit)."""
    command = [sys.executable, "-m", "calispec_tools.cli", "models", "list", "--cache-dir", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == SIGPIPE_STATUS
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
