"""How the CLI ends when it cannot go on: a stdout whose reader went away (`| head`: a shell's SIGPIPE status) or
that is full, Ctrl-C, a second signal while `up` stops."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from calispec_tools import cli
from calispec_tools.cli import SIGINT_EXIT, SIGPIPE_STATUS


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


def test_a_full_stdout_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """`calispec generate ... > /dev/full` (or a full disk) ended in an OSError traceback (found by probing)."""
    command = [sys.executable, "-m", "calispec_tools.cli", "models", "list", "--cache-dir", str(tmp_path)]
    with open("/dev/full", "w") as full:
        result = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == "error: cannot write the output: No space left on device\n", result.stderr


def test_ctrl_c_in_a_command_without_a_stack_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during `calispec generate` or `chat -m` printed grpc's 20-line KeyboardInterrupt traceback and died
    by SIGINT (found by probing); commands that may start a stack already said it in one line."""

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.CalispecClient, "generate", interrupted)
    assert cli.main(["generate", "--prompt", "hi", "--address", "127.0.0.1:9"]) == SIGINT_EXIT
    assert capsys.readouterr().err == "interrupted\n"


def test_a_second_signal_while_up_stops_interrupts_the_drain(capsys: pytest.CaptureFixture[str]) -> None:
    """`up`'s handlers only set its stop event and stayed in while the stack drained (up to 20 s a service): a
    second Ctrl-C or SIGTERM did nothing, and "stopping..." came after the drain (found by probing). Now the stop
    is announced first and a second signal interrupts LocalStack.stop, which kills the rest."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, lambda *_: None)  # as `up` has them while it serves
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        cli.arm_second_signal()
        assert "stopping... (Ctrl-C again" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        with pytest.raises(cli.Terminated):
            signal.raise_signal(signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
