"""The local stack stops every service in order however stopping goes, and `calispec up` can be interrupted
while it starts."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from calispec_tools import cli
from calispec_tools.stack import LocalStack, ServiceProcess, StackConfig, StackStartError
from tests.helpers import UP_ON_FREE_PORTS


class FakeProcess:
    def __init__(self, name: str, log: list[str], interrupt_on_wait: bool = False) -> None:
        self.name, self.log, self.interrupt_on_wait, self.code = name, log, interrupt_on_wait, None

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.log.append(f"term {self.name}")

    def wait(self, timeout: float | None = None) -> int:
        if self.interrupt_on_wait and self.code is None:
            self.interrupt_on_wait = False
            raise KeyboardInterrupt  # a second Ctrl-C while this one drains
        self.code = 0
        return 0

    def kill(self) -> None:
        self.log.append(f"kill {self.name}")


def _stack(tmp_path: Path, names: list[str], log: list[str], interrupted: str = "") -> LocalStack:
    stack = LocalStack(StackConfig(Path("d"), Path("t"), tmp_path / "m.db", tmp_path))
    for name in names:
        process = FakeProcess(name, log, interrupt_on_wait=name == interrupted)
        stack.services[name] = ServiceProcess(name, process, tmp_path / f"{name}.log", [])  # type: ignore[arg-type]
    return stack


def test_the_stack_stops_coordinator_first_and_memory_last_even_after_a_restart(tmp_path: Path) -> None:
    """A restart put the memory service last in the dict, and the reverse order then stopped it first: the
    targets' last event flushes met a memory service already gone."""
    log: list[str] = []
    names = ["draft_service", "target_service", "target_service:1", "coordinator", "memory_service"]  # restarted
    _stack(tmp_path, names, log).stop()
    assert log == ["term coordinator", "term draft_service", "term target_service", "term target_service:1",
                   "term memory_service"]  # fmt: skip


def test_an_interrupt_while_one_service_drains_still_ends_the_others(tmp_path: Path) -> None:
    """The services run in sessions of their own: skipped, they outlived the stack holding ports and memory."""
    log: list[str] = []
    stack = _stack(tmp_path, ["memory_service", "draft_service", "target_service", "coordinator"], log, "coordinator")
    with pytest.raises(KeyboardInterrupt):
        stack.stop()
    assert log[0] == "term coordinator"
    # the one draining too: out of `services` by then, the review found it left running (its ports held)
    assert {"kill coordinator", "kill draft_service", "kill target_service", "kill memory_service"} <= set(log)
    assert stack.services == {}


@pytest.mark.parametrize("command", ["up", "demo"])
def test_sigterm_interrupts_the_start_of_every_stack_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Its handlers only set an event: a pull or a model load could not be interrupted until it was done. And
    `calispec demo` left SIGTERM to its default action: the process ended alone and the services it had
    started, each in a session of its own, went on serving. The handler in place before is put back. Exit 143,
    128 + SIGTERM (it was 130, Ctrl-C's code)."""
    received: list[int] = []

    def record(sig: int, _frame: object) -> None:
        received.append(sig)

    def slow_start(*args: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)  # the user gives up during start-up
        raise AssertionError("start-up went on after SIGTERM")

    monkeypatch.setattr(cli, "stack_config", slow_start)
    monkeypatch.setattr(cli, "up_security", lambda args, secrets: (None, None, None))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, record)  # without the command's own handler, this one gets it (not pytest's end)
    try:
        try:
            code = cli.main([command, "--pair", "tiny", *(UP_ON_FREE_PORTS if command == "up" else [])])
        except KeyboardInterrupt:  # caught here: escaping, it would end the whole pytest session
            pytest.fail(f"the interrupt escaped `calispec {command}` as a traceback")
        assert code == 143 and received == []
        err = capsys.readouterr().err
        assert err.endswith(f"calispec {command}: interrupted (any service it started is stopped)\n")
        assert signal.getsignal(signal.SIGTERM) is record
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _raises(exc: BaseException) -> Callable[[], int]:
    def run() -> int:
        raise exc

    return run


def test_ctrl_c_during_the_start_still_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.stack_command("calispec up", _raises(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "calispec up: interrupted (any service it started is stopped)\n"


def test_a_service_not_ready_in_time_is_no_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A slow machine, not the user's input: exit 1 with one line (it was 2, a usage error)."""
    timeout = TimeoutError("draft_service not ready after 600s; see /logs/draft_service.log")
    assert cli.stack_command("calispec demo", _raises(timeout)) == 1
    assert capsys.readouterr().err == "error: draft_service not ready after 600s; see /logs/draft_service.log\n"


@pytest.mark.parametrize(
    "error", [BrokenPipeError(32, "Broken pipe"), PermissionError(13, "Permission denied", "/data/stack.json")]
)
def test_an_os_error_outside_the_users_paths_is_not_reported_as_one(error: OSError) -> None:
    """Any OSError, at any point (printing to a closed pipe while serving, the state file), was "cannot use a
    path", exit 2: only the start-up steps that write the user's paths are usage errors now."""
    with pytest.raises(type(error)):
        cli.stack_command("calispec up", _raises(error))


def test_an_unusable_tls_dir_is_still_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up --tls --tls-dir` under a file: the certificates cannot be written, the user's to fix (exit 2)."""

    def stack_config(*_args: object) -> None:
        raise AssertionError("the stack's start went on past its --tls-dir")

    monkeypatch.setattr(cli, "stack_config", stack_config)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    args = cli.build_parser().parse_args(["up", "--tls", "--tls-dir", str(a_file / "tls"), "--open", *UP_ON_FREE_PORTS])
    assert cli.stack_command("calispec up", lambda: cli.serve_stack(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot use {a_file}") and "Not a directory" in err and err.count("\n") == 1


def test_a_tls_dir_alone_means_tls(tmp_path: Path) -> None:
    """`up --tls-dir DIR` without `--tls` ran every service in plaintext, without a word (found by probing)."""
    args = cli.build_parser().parse_args(["up", "--tls-dir", str(tmp_path / "tls"), "--open"])
    tls_dir, keys_file, key = cli.up_security(args, tmp_path / "secrets")
    assert tls_dir == tmp_path / "tls" and (tls_dir / "ca.pem").exists()
    assert (keys_file, key) == (None, None)


def test_an_unusable_log_dir_names_it_without_starting_anything(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    stack = LocalStack(StackConfig(Path("d"), Path("t"), tmp_path / "m.db", a_file / "logs"))
    with pytest.raises(StackStartError) as failed:
        stack.start()
    assert failed.value.line == f"cannot use {a_file / 'logs'}: Not a directory" and stack.services == {}


def test_a_starting_stack_removes_the_secrets_a_killed_one_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed `calispec up` (or bench's, demo's stack) left its writer token in /tmp for good."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    left = tmp_path / f"calispec-secrets-{killed.pid}-xyz"
    left.mkdir()
    (left / "writer-token").write_text("token\n")
    stack = LocalStack(StackConfig(Path("d"), Path("t"), tmp_path / "m.db", tmp_path / "logs"))

    def no_service(name: str, args: list[str]) -> None:
        assert stack._secrets_dir is not None and stack._secrets_dir.parent == tmp_path
        raise RuntimeError("no services in this test")

    monkeypatch.setattr(stack, "_spawn", no_service)
    with pytest.raises(RuntimeError, match="no services"):
        stack.start()
    assert not left.exists()
    assert not list(tmp_path.glob("calispec-secrets-*"))  # its own went with its stop


def test_up_serves_the_services_metrics_where_metrics_port_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` put every /metrics on a free port, so no scrape configuration could name them (found by probing);
    `--metrics-port P` serves the coordinator's on P and the target's, draft's and memory's on the next three."""
    args = cli.build_parser().parse_args(["up", "--metrics-port", "19100", *UP_ON_FREE_PORTS])
    assert [port for flag, port in cli.fixed_up_ports(args) if flag.startswith("--metrics-port")] == list(
        range(19100, 19104)
    )  # checked distinct and free before anything starts
    with pytest.raises(SystemExit):
        cli.check_distinct_ports(cli.build_parser().parse_args(["up", "--port", "19102", "--metrics-port", "19100"]))
    assert "--port and --metrics-port (draft_service's: 19100 + 2) are both 19102" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["up", "--metrics-port", "65532"]).metrics_port == 65532  # 65532-65535
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--metrics-port", "65533"])
    assert "must leave room for 3 ports after it (at most 65532), got 65533" in capsys.readouterr().err
    spawned: list[list[str]] = []

    class NotStarted(Exception):
        pass

    def popen(cmd: list[str], **_kwargs: object) -> None:
        spawned.append(cmd)
        raise NotStarted

    monkeypatch.setattr("calispec_tools.stack.subprocess.Popen", popen)
    (tmp_path / "logs").mkdir()
    config = StackConfig(tmp_path / "d", tmp_path / "t", tmp_path / "m.db", tmp_path / "logs", metrics=True)
    for base, expected in ((19100, ["19100", "19101", "19102", "19103", "0"]), (0, ["0"] * 5)):
        stack = LocalStack(dataclasses.replace(config, metrics_port=base))
        for name in ("coordinator", "target_service", "draft_service", "memory_service", "target_service:1"):
            with pytest.raises(NotStarted):
                stack._spawn(name, [])
        ports = [cmd[cmd.index("--metrics-port") + 1] for cmd in spawned[-5:]]
        assert ports == expected  # a target replica's: a free one
