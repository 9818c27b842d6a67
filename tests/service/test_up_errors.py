"""`calispec up` and `calispec demo` when their stack cannot start: one line and exit 2 (Ctrl-C: 130, the
services it had started stopped; SIGTERM: 143, tests/unit/test_stack_lifecycle.py), never a traceback; a
second stack never writes into a running one's log directory, and each start rotates the last run's logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec_tools import cli
from calispec_tools.stack import (
    LOG_DIR_LOCK,
    LocalStack,
    ServiceProcess,
    ServiceStartError,
    StackConfig,
    StackStartError,
    claim_log_dir,
)
from calispec_tools.stack_state import StackLock
from tests.helpers import REPO_ROOT, UP_ON_FREE_PORTS


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on (what a running stack's memory service would hold)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return path


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """cmd_up installs its own SIGINT/SIGTERM handlers: the test session keeps its own."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


OPEN_UP = ["--open", *UP_ON_FREE_PORTS]  # no API keys to write


def stack_args(tmp_path: Path, *extra: str) -> list[str]:
    """A pair nobody reads (the memory service, started first, fails before either model loads)."""
    return ["--draft", str(tmp_path / "no-draft"), "--target", str(tmp_path / "no-target"),
            "--log-dir", str(tmp_path / "logs"), "--memory-db", str(tmp_path / "memory.db"), *extra]  # fmt: skip


def calispec(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "calispec_tools.cli", *argv],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def assert_one_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    """The error is the last line, and one line (demo says "starting the stack..." before it)."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.stderr
    for text in expected:
        assert text in lines[-1], lines[-1]


def test_up_on_a_taken_port_says_so_in_one_line(tmp_path: Path, taken_port: int) -> None:
    """Before any service starts (wave 55; it was the memory service's bind error, which a stack started by another
    command still reports: test_grpc_bind)."""
    result = calispec(tmp_path, "up", *OPEN_UP, "--memory-port", str(taken_port), *stack_args(tmp_path))
    assert_one_line(result, f"--memory-port {taken_port}: 127.0.0.1:{taken_port} is taken (Address already in use)")
    assert not (tmp_path / "logs").exists()  # nothing started


@pytest.mark.parametrize("command", ["up", "demo"])
def test_an_unusable_log_dir_is_one_line(tmp_path: Path, a_file: Path, command: str) -> None:
    extra = OPEN_UP if command == "up" else []
    result = calispec(tmp_path, command, *extra, *stack_args(tmp_path), "--log-dir", str(a_file / "logs"))
    assert_one_line(result, str(a_file), "Not a directory")


@pytest.mark.parametrize("command", ["up", "demo"])
def test_an_unusable_memory_db_is_one_line(tmp_path: Path, a_file: Path, command: str) -> None:
    extra = OPEN_UP if command == "up" else []
    result = calispec(tmp_path, command, *extra, *stack_args(tmp_path), "--memory-db", str(a_file / "memory.db"))
    assert_one_line(result, "memory_service: cannot start", str(a_file))


def test_a_second_stack_on_a_running_stacks_log_dir_is_refused_before_it_writes_there(tmp_path: Path) -> None:
    """It appended its lines to the running stack's logs (interleaved with them, and quoted in its own error)
    before its bind failed, or, on free ports, ran beside it writing into the same files."""
    logs = tmp_path / "logs"
    logs.mkdir()
    running = logs / "memory_service.log"
    running.write_text("memory_service listening on 127.0.0.1:50053 (the running stack's)\n")
    with StackLock(logs / LOG_DIR_LOCK) as held:  # what the running stack holds, naming what it serves
        held.describe({"coordinator": "127.0.0.1:50050", "memory_service": "127.0.0.1:50053"})
        config = StackConfig(tmp_path / "d", tmp_path / "t", tmp_path / "memory.db", logs, memory_port=0)
        stack = LocalStack(config)
        with pytest.raises(StackStartError) as refused:
            stack.start()
    assert running.read_text() == "memory_service listening on 127.0.0.1:50053 (the running stack's)\n"
    assert sorted(p.name for p in logs.iterdir()) == ["logs.lock", "memory_service.log"] and stack.services == {}
    line = refused.value.line
    assert "\n" not in line and line.startswith(f"{logs} is the log directory of a running stack (pid {os.getpid()}:")
    assert "coordinator 127.0.0.1:50050" in line and "`calispec down`" in line and "--log-dir" in line


def test_each_start_rotates_the_last_runs_logs_and_keeps_three(tmp_path: Path, taken_port: int) -> None:
    """Logs were appended to behind a marker at every start, forever; the error quotes this run's lines only."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, text in [("", "run 4\n"), (".1", "run 3\n"), (".2", "run 2\n"), (".3", "run 1\n")]:
        (logs / f"memory_service.log{name}").write_text(text)
    config = StackConfig(tmp_path / "d", tmp_path / "t", tmp_path / "memory.db", logs, memory_port=taken_port)
    with pytest.raises(ServiceStartError) as failed:
        LocalStack(config).start()
    text = (logs / "memory_service.log").read_text()
    assert text.startswith("--- memory_service starting") and "could not bind" in text and "run 4" not in text
    kept = {n: (logs / f"memory_service.log{n}").read_text() for n in (".1", ".2", ".3")}
    assert kept == {".1": "run 4\n", ".2": "run 3\n", ".3": "run 2\n"} and not (logs / "memory_service.log.4").exists()
    assert "run 4" not in str(failed.value) and "could not bind" in failed.value.line


OPEN = ["--allow-unauthenticated-writes"]  # no writer token: this memory service fails at its bind anyway


def test_a_restart_appends_to_its_stacks_log(tmp_path: Path, taken_port: int) -> None:
    """Only a stack's first start of a service rotates: a restart keeps the crash's lines above its own."""
    config = StackConfig(tmp_path / "d", tmp_path / "t", tmp_path / "memory.db", tmp_path / "logs")
    config.log_dir.mkdir()
    stack = LocalStack(config)
    stack._dir_lock = claim_log_dir(config.log_dir)  # what start() takes before it spawns
    try:
        for _ in range(2):
            with pytest.raises(ServiceStartError):
                stack._spawn("memory_service", ["--port", str(taken_port), "--db", str(config.memory_db), *OPEN])
    finally:
        stack.stop()
    assert (config.log_dir / "memory_service.log").read_text().count("--- memory_service starting") == 2
    assert not (config.log_dir / "memory_service.log.1").exists()


@pytest.mark.parametrize("command", ["up", "demo"])
def test_ctrl_c_while_the_stack_starts_stops_what_started_and_exits_130(
    tmp_path: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signal_handlers: None,
) -> None:
    started: list[ServiceProcess] = []
    spawn = LocalStack._spawn

    def recorded(stack: LocalStack, name: str, args: list[str]) -> ServiceProcess:
        started.append(spawn(stack, name, args))
        return started[-1]

    def ctrl_c(stack: LocalStack) -> list[str]:  # the memory service serves; the draft is about to start
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStack, "_spawn", recorded)
    monkeypatch.setattr(LocalStack, "draft_args", ctrl_c)
    extra = OPEN_UP if command == "up" else []
    try:
        code = cli.main([command, *extra, *stack_args(tmp_path)])
    except KeyboardInterrupt:  # caught here: escaping, it would end the whole pytest session
        pytest.fail(f"Ctrl-C escaped `calispec {command}` as a traceback")
    assert code == 130
    assert capsys.readouterr().err.endswith(f"calispec {command}: interrupted (any service it started is stopped)\n")
    assert [s.name for s in started] == ["memory_service"]
    assert started[0].process.poll() is not None  # stopped, not left serving in its own session


def test_up_may_keep_its_logs_beside_its_state_file(tmp_path: Path) -> None:
    """`up --log-dir` on the user data dir: the log directory's lock was `stack.lock`, the file `up` itself
    holds beside stack.json there, and the stack refused to start, naming its own pid."""
    from calispec_tools.stack_state import claim_up

    with claim_up(tmp_path / "stack.json"):
        claim_log_dir(tmp_path).release()
