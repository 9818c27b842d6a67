"""The running stack's state file: telling a live `calispec up` from a stale file, one `up` at a time (its lock),
and `calispec down`."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from calispec_tools.stack_state import (
    Holder,
    StackBusy,
    StackLock,
    StackState,
    claim_up,
    private_temp_dir,
    process_start_time,
    remove_orphaned_secrets,
    running_stack,
    starting_stack,
    stop_stack,
)

# a stand-in for `calispec up`: writes the state, says so, and on SIGTERM removes it and exits
FAKE_UP = """
import os, signal, sys, threading
from pathlib import Path
from calispec_tools.stack_state import StackState, clear_state, process_start_time
path, stop = Path(sys.argv[1]), threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
StackState(os.getpid(), "c", "m", "ns", "d", "t", "w", process_start_time(os.getpid())).write(path)
print("ready", flush=True)
stop.wait()
clear_state(os.getpid(), path)
"""


def fake_up(path: Path, sigterm: str = "stop") -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", FAKE_UP, str(path), sigterm], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def state(started: int) -> StackState:
    return StackState(os.getpid(), "c", "m", "ns", "d", "t", "w", started)


def test_a_state_whose_pid_now_names_another_process_is_stale() -> None:
    """A crashed `calispec up` left its file; its pid was given to another process since."""
    me = process_start_time(os.getpid())
    assert me > 0
    state(me).write()
    assert running_stack() == state(me)
    state(me + 1).write()
    assert running_stack() is None
    state(0).write()  # a file from before start times were recorded: the pid alone decides
    assert running_stack() == state(0)


def test_a_state_a_newer_release_wrote_is_still_the_running_stack(no_running_stack: Path) -> None:
    """The reader refused a file with any key it did not know: an older CLI saw no stack beside a newer `up` (its
    memory commands dialled the default address; found by probing upgrades). A file that is no object: none."""
    me = process_start_time(os.getpid())
    recorded = asdict(state(me)) | {"a_later_field": [1, 2]}
    no_running_stack.write_text(json.dumps(recorded))  # the isolated state file (conftest)
    assert running_stack() == state(me)
    no_running_stack.write_text("[1, 2]")
    assert running_stack() is None


def test_a_zombie_is_not_a_running_stack() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    StackState(child.pid, "c", "m", "ns", "d", "t", "w", 0).write()
    assert running_stack() is None
    child.wait()


def test_down_stops_the_running_stack_and_waits_for_it(no_running_stack: Path) -> None:
    assert stop_stack(timeout_s=5) is None  # none runs
    up = fake_up(no_running_stack)
    stopped = stop_stack(timeout_s=60)
    assert stopped is not None and stopped.pid == up.pid
    assert up.wait(timeout=60) == 0 and not no_running_stack.exists()


def test_down_says_so_when_the_stack_does_not_stop(no_running_stack: Path) -> None:
    up = fake_up(no_running_stack, sigterm="ignore")
    try:
        with pytest.raises(TimeoutError, match=str(up.pid)):
            stop_stack(timeout_s=0.3)
        assert running_stack() is not None
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait()


def run_down(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from calispec_tools.cli import build_parser

    args = build_parser().parse_args(["down", "--timeout", "60"])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_calispec_down_says_what_it_did(no_running_stack: Path, capsys, monkeypatch) -> None:
    assert run_down(capsys) == (0, "no stack is running\n")
    up = fake_up(no_running_stack)
    assert run_down(capsys) == (0, f"stopped the stack of `calispec up` (pid {up.pid})\n")
    assert up.wait(timeout=60) == 0
    from calispec_tools import stack_state

    state(process_start_time(os.getpid())).write()  # "running": this process

    def refused(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(stack_state, "_kill", refused)
    code, said = run_down(capsys)
    assert code == 1 and "belongs to another user" in said


def test_a_stack_that_exits_before_the_signal_counts_as_stopped(monkeypatch) -> None:
    """Ctrl-C in its shell, or a second `down`, between finding the stack and signalling it."""
    from calispec_tools import stack_state

    monkeypatch.setattr(stack_state, "running_stack", lambda path=None: state(1))
    monkeypatch.setattr(stack_state, "_alive", lambda pid, started=0: False)

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(stack_state, "_kill", gone)
    assert stop_stack(timeout_s=5) == state(1)


def test_up_records_the_pair_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`calispec up --draft rel/d --target rel/t` recorded the relative paths: `calispec calibrate` from another
    directory then looked for the pair there (a model loader traceback)."""
    from types import SimpleNamespace
    from typing import Any

    from calispec_tools import cli, cli_calibrate

    pair = [tmp_path / "models" / "d", tmp_path / "models" / "t"]
    for model in pair:
        model.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    config: Any = SimpleNamespace(
        draft_model=Path("models/d"),
        target_model=Path("models/t"),
        dtype="auto",
        draft_dtype="int8",
        tls_dir=Path("tls"),
        device="cpu",
    )
    stack: Any = SimpleNamespace(coordinator_address="c", memory_address="m", memory_namespace="ns",
                                 writer_token_file=tmp_path / "w")  # fmt: skip
    cli.up_state(stack, config).write()
    monkeypatch.chdir(pair[0])  # another working directory
    args = cli.build_parser().parse_args(["calibrate", "--corpus", "corpus.jsonl"])
    assert cli_calibrate.model_dirs(args) == (pair[0].resolve(), pair[1].resolve())
    state = running_stack()
    assert state is not None and (state.dtype, state.draft_dtype) == ("auto", "int8")  # what calibrate defaults to
    assert state.tls_dir == str(tmp_path / "tls")  # the memory tools' certificates, absolute as well
    assert state.device == "cpu"  # calibrate's default device too (wave 58)


# a stand-in for a `calispec up` still starting: holds the lock (no state file yet), on SIGTERM exits as
# its start-up does (Terminated: what it started is stopped)
FAKE_STARTING_UP = """
import signal, sys, threading
from pathlib import Path
from calispec_tools.stack_state import claim_up
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
with claim_up(Path(sys.argv[1])):
    print("ready", flush=True)
    stop.wait()
"""


def test_a_second_up_is_refused_naming_the_running_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It started beside the first (other ports, another --log-dir) and replaced its state file: `calispec down`
    then stopped the second only, and the first ran on, unknown to every command. Refused before any pull,
    model load or write."""
    from calispec_tools import cli

    def stack_config(*_args: object) -> None:
        raise AssertionError("a second `calispec up` went on starting")

    monkeypatch.setattr(cli, "stack_config", stack_config)
    handler = signal.getsignal(signal.SIGTERM)
    with claim_up() as running:
        running.describe({"coordinator": "127.0.0.1:50050", "memory_service": "127.0.0.1:50053"})
        code = cli.main(["up", "--pair", "tiny", "--port", "0", "--log-dir", str(tmp_path / "other-logs")])
    assert signal.getsignal(signal.SIGTERM) is handler
    assert code == 2 and not (tmp_path / "other-logs").exists()
    assert capsys.readouterr().err == (
        f"error: `calispec up` already runs (pid {os.getpid()}: coordinator 127.0.0.1:50050, memory_service "
        "127.0.0.1:50053): stop it with `calispec down` first\n"
    )


def test_half_a_pair_is_a_usage_error_even_while_another_up_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The pair's flags were checked after the claim: while another `up` ran, the user was told to stop it."""
    from calispec_tools import cli

    with claim_up() as running:
        running.describe({"coordinator": "127.0.0.1:50050"})
        with pytest.raises(SystemExit) as exited:
            cli.main(["up", "--draft", "d"])
    assert exited.value.code == 2
    assert "give both --draft and --target" in capsys.readouterr().err


def test_down_stops_an_up_that_is_still_starting(no_running_stack: Path) -> None:
    """A second `up` is told to `calispec down` the first one, which answered "no stack is running" until the
    first had loaded its models and written its state file."""
    up = subprocess.Popen([sys.executable, "-c", FAKE_STARTING_UP, str(no_running_stack)], stdout=subprocess.PIPE)
    assert up.stdout is not None and up.stdout.readline() == b"ready\n"
    assert running_stack() is None and starting_stack() == Holder(up.pid, process_start_time(up.pid))
    stopped = stop_stack(timeout_s=60)
    assert stopped is not None and stopped.pid == up.pid
    assert up.wait(timeout=60) == 0 and starting_stack() is None


def test_a_crashed_holders_lock_is_taken_over(tmp_path: Path) -> None:
    """The kernel drops a flock with its process: a stack killed with SIGKILL leaves nothing to clean up."""
    lock = tmp_path / "stack.lock"
    holder = subprocess.Popen([sys.executable, "-c", FAKE_STARTING_UP, str(tmp_path / "stack.json")],
                              stdout=subprocess.PIPE)  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
    with pytest.raises(StackBusy) as busy:
        StackLock(lock).acquire()
    assert busy.value.holder is not None and busy.value.holder.pid == holder.pid
    holder.kill()
    holder.wait()
    with StackLock(lock):  # taken over
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_a_released_lock_names_no_one() -> None:
    """Its file stays; a live pid left in it (this process) would pass for a stack still starting."""
    with claim_up():
        assert starting_stack() == Holder(os.getpid(), process_start_time(os.getpid()))
    assert starting_stack() is None and stop_stack(timeout_s=5) is None


def test_secrets_of_processes_that_are_gone_are_removed_by_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed `calispec up` left its writer token and API keys in /tmp for good (found by probing)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    killed.kill()
    killed.wait()  # its pid is free now: the directory's process is gone
    gone = tmp_path / f"calispec-up-{killed.pid}-abc"
    (gone / "tls").mkdir(parents=True)
    (gone / "api-keys").write_text("key\n")
    mine = private_temp_dir("secrets")
    assert mine.parent == tmp_path and mine.name.startswith(f"calispec-secrets-{os.getpid()}-")
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    others = [tmp_path / f"calispec-secrets-{killed.pid}", tmp_path / "calispec-eval-123-x"]  # not its names
    for path in others:
        path.mkdir()
    assert remove_orphaned_secrets() == [gone]
    assert not gone.exists() and mine.exists() and all(p.exists() for p in others)


@pytest.mark.parametrize(
    ("given", "same"),
    [("127.0.0.1:5", True), ("localhost:5", True), ("LOCALHOST:5", True), ("127.0.0.1:6", False), ("[::1]:5", False),
     ("10.0.0.1:5", False)],
)  # fmt: skip
def test_a_stacks_memory_is_its_address_or_localhost_for_it(given: str, same: bool) -> None:
    """`localhost` is the loopback the stack bound; [::1] is another socket (a token sent there could be caught)."""
    state = StackState(1, "127.0.0.1:1", "127.0.0.1:5", "ns", "d", "t", "tok")
    assert state.serves_memory_at(given) is same


def test_a_plaintext_stacks_state_has_only_the_keys_the_release_before_knew(no_running_stack: Path) -> None:
    """An older CLI reads the file strictly: a key it does not know hides the stack from it (found by review)."""
    state(0).write()
    assert not {"tls_dir", "device"} & set(json.loads(no_running_stack.read_text()))
    dataclasses.replace(state(0), tls_dir="/certs", device="cpu").write()
    recorded = json.loads(no_running_stack.read_text())
    assert (recorded["tls_dir"], recorded["device"]) == ("/certs", "cpu") and running_stack() is not None


def test_up_on_a_port_another_process_listens_on_is_refused_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It found out at the coordinator, after the memory, the draft and the target had loaded (found by probing)."""
    import socket

    from calispec_tools import cli

    def stack_config(*_args: object) -> None:
        raise AssertionError("`calispec up` went on starting")

    monkeypatch.setattr(cli, "stack_config", stack_config)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        ports = ["--target-port", "0", "--draft-port", "0", "--memory-port", "0", "--port", "0"]
        with pytest.raises(SystemExit) as exited:
            cli.main(["up", "--pair", "tiny", *ports, "--http-port", str(taken)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --http-port {taken}: 127.0.0.1:{taken} is taken")
