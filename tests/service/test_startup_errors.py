"""Start-up failures the operator must fix: one line naming the path and the cause, exit 2, no traceback."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import coordinator.__main__ as coordinator_cli
from calispec_core.modeling import ModelSpec
from draft_service.__main__ import parse_config as parse_draft
from memory_service.__main__ import parse_args as parse_memory
from target_service.__main__ import parse_config as parse_target
from target_service.config import TargetConfig
from tests.conftest import TinyPair
from tests.helpers import REPO_ROOT


def run_service(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args, "--port", "0"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert_one_line(result.returncode, result.stderr, *expected)


def assert_one_line(code: object, stderr: str, *expected: str) -> None:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr  # no traceback
    assert "Traceback" not in stderr
    for text in expected:
        assert text in lines[0]


def corrupt_database(tmp_path: Path) -> Path:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"definitely not SQLite " * 200)
    return path


def damaged_pages(tmp_path: Path) -> Path:
    """A valid header, a damaged table page: opens, but would fail at the first flush."""
    path = tmp_path / "damaged.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 50)
    conn.close()
    data = bytearray(path.read_bytes())
    data[4096 + 16 : 4096 * 3] = b"\xff" * (4096 * 2 - 16)  # the table's pages, not the header
    path.write_bytes(bytes(data))
    return path


def unwritable_path(tmp_path: Path) -> Path:
    """A read-only place: a plain directory made read-only, or (root ignores modes) procfs."""
    if os.geteuid() == 0:
        return Path("/proc/calispec-test/memory.db")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    return ro / "memory.db"


@pytest.mark.parametrize(
    ("make_path", "cause"),
    [
        (corrupt_database, "file is not a database"),
        (damaged_pages, "malformed"),
        (lambda tmp: tmp, "unable to open database file"),  # a directory
        (lambda tmp: corrupt_database(tmp) / "memory.db", "File exists"),
        (unwritable_path, ""),
    ],
    ids=["corrupt", "damaged-pages", "directory", "parent-is-a-file", "read-only"],
)
def test_memory_service_with_a_bad_database(tmp_path: Path, make_path, cause: str) -> None:
    db = make_path(tmp_path)
    result = run_service("memory_service", "--db", str(db), "--allow-unauthenticated-writes")
    assert_one_clear_line(result, "memory_service: cannot start: cannot open the memory database", str(db), cause)


def test_memory_service_with_an_unreadable_token_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    result = run_service("memory_service", "--db", str(tmp_path / "m.db"), "--writer-token-file", str(missing))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"cannot read writer token file {missing}" in result.stderr


def test_draft_service_with_a_bad_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # a directory, but no model in it
    result = run_service("draft_service", "--model", str(tmp_path))
    assert_one_clear_line(result, f"draft_service: cannot load the model in {tmp_path}:")


def test_draft_service_with_a_draft_vocab_larger_than_the_model(tiny_pair: TinyPair) -> None:
    result = run_service("draft_service", "--model", str(tiny_pair.draft), "--draft-vocab", "100000")
    assert_one_clear_line(result, "draft_service: cannot load the model in", "--draft-vocab 100000 is larger")


def test_draft_service_with_a_negative_draft_vocab(tiny_pair: TinyPair) -> None:
    result = run_service("draft_service", "--model", str(tiny_pair.draft), "--draft-vocab", "-3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--draft-vocab must be >= 0" in result.stderr.strip().splitlines()[-1]


# -- flags out of range: usage errors (exit 2) naming the flag, before anything starts ----------------------------

Parser = Callable[[list[str]], object]
PARSERS: dict[str, tuple[Parser, list[str]]] = {  # each service's parser, with the flags it requires
    "draft": (parse_draft, ["--model", "m"]),
    "target": (parse_target, ["--model", "m"]),
    "memory": (parse_memory, ["--allow-unauthenticated-writes"]),
    "coordinator": (coordinator_cli.parse_config, ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "t"]),
}


def usage_error(capsys: pytest.CaptureFixture[str], service: str, *args: str) -> str:
    """The parser's complaint about `args` (it must exit 2 with its usage line)."""
    parse, required = PARSERS[service]
    with pytest.raises(SystemExit) as exit_:
        parse([*required, *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage:"), err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("service", PARSERS)
@pytest.mark.parametrize("flag", ["--port", "--health-port", "--metrics-port"])
def test_ports_beyond_65535_are_usage_errors_not_wrapped(
    capsys: pytest.CaptureFixture[str], service: str, flag: str
) -> None:
    """--port 70000 bound port 4464 (70000 mod 2**16) on every service but memory's."""
    assert f"argument {flag}: must be in [0, 65535], got 70000" in usage_error(capsys, service, flag, "70000")
    assert f"argument {flag}: must be in [0, 65535], got -1" in usage_error(capsys, service, f"{flag}=-1")


def test_the_coordinator_http_port_is_checked_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --http-port: must be in [0, 65535]" in usage_error(capsys, "coordinator", "--http-port", "70000")
    parse, required = PARSERS["coordinator"]
    config, _ = parse([*required, "--http-port", "65535", "--port", "0", "--health-port", "0"])
    assert (config.http_port, config.port, config.health_port) == (65535, 0, 0)


@pytest.mark.parametrize("service", PARSERS)
def test_a_negative_drain_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str], service: str) -> None:
    assert "argument --drain-timeout-s: must be >= 0, got -3" in usage_error(capsys, service, "--drain-timeout-s=-3")


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_a_memory_sync_interval_of_zero_or_less_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """The memory link's flusher waits this long between flushes: -1 spun a core."""
    assert "argument --memory-sync-interval:" in usage_error(capsys, "target", f"--memory-sync-interval={value}")


def test_the_target_config_refuses_a_memory_sync_interval_of_zero() -> None:
    with pytest.raises(ValueError, match="memory_sync_interval_s must be > 0, got 0"):
        TargetConfig(ModelSpec(Path("m")), memory_sync_interval_s=0)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--default-max-new-tokens", "-4"),
        ("--default-max-new-tokens", "0"),
        ("--default-gamma", "-1"),
        ("--default-gamma", "17"),
        ("--max-gamma", "0"),
        ("--draft-min-confidence", "5"),
        ("--draft-min-confidence", "-0.1"),
        ("--quota-rpm", "-1"),
        ("--quota-burst", "-1"),
        ("--quota-burst", "0.5"),
        ("--quota-concurrent", "-1"),
        ("--connect-timeout", "-1"),
        ("--connect-timeout", "0"),
        ("--rpc-timeout", "-1"),
        ("--rpc-timeout", "nan"),
        ("--draft-timeout", "0"),
        ("--draft-max-backoff", "-1"),
        ("--target-refresh", "0"),
        ("--lockstep-wait", "-1"),
    ],
)
def test_coordinator_defaults_that_would_fail_every_request_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    assert f"argument {flag}:" in usage_error(capsys, "coordinator", f"{flag}={value}")


def test_the_coordinator_accepts_the_bounds_of_its_ranges() -> None:
    parse, required = PARSERS["coordinator"]
    edges = ["--default-max-new-tokens=1", "--default-gamma=16", "--max-gamma=1", "--draft-min-confidence=1"]
    zeros = ["--quota-rpm=0", "--quota-concurrent=0", "--quota-burst=1", "--lockstep-wait=0", "--drain-timeout-s=0"]
    config, _ = parse([*required, *edges, *zeros])
    assert (config.defaults.max_new_tokens, config.defaults.num_speculative_tokens, config.max_gamma) == (1, 16, 1)
    assert config.draft_min_confidence == 1.0 and config.quota.burst == 1.0 and config.drain_timeout_s == 0.0


# -- the coordinator's start-up failures: one line, exit 2, no traceback -----------------------------------------


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound by nobody that listens: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other server listens on (without SO_REUSEPORT, so gRPC cannot share it)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def run_coordinator(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tokenizer: Path, backend_port: int, *args: str
) -> tuple[object, str]:
    """coordinator's main in this process: (its exit code, its stderr); logging left as the tests set it."""
    monkeypatch.setattr(coordinator_cli, "configure_logging", lambda _level: None)
    backend = f"127.0.0.1:{backend_port}"
    argv = ["--draft-addr", backend, "--target-addr", backend, "--tokenizer", str(tokenizer), "--port", "0", *args]
    try:
        coordinator_cli.main(argv)
    except SystemExit as exc:
        return exc.code, capsys.readouterr().err
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main: a traceback")
    pytest.fail("main returned: it should have exited")


def test_coordinator_with_unreachable_services(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_pair: TinyPair, closed_port: int
) -> None:
    code, err = run_coordinator(monkeypatch, capsys, tiny_pair.target, closed_port, "--connect-timeout", "0.2")
    assert_one_line(code, err, "coordinator: cannot start: no service at", f"127.0.0.1:{closed_port}")


def test_coordinator_with_a_missing_api_keys_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-keys"
    code, err = run_coordinator(monkeypatch, capsys, tmp_path, 1, "--api-keys-file", str(missing))
    assert_one_line(code, err, "coordinator: cannot start: cannot load API keys from", str(missing))


def test_coordinator_with_a_tokenizer_directory_without_a_tokenizer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Checked before the wait for the model services: this fails at once, whatever --connect-timeout says."""
    code, err = run_coordinator(monkeypatch, capsys, tmp_path, 1)
    assert_one_line(code, err, f"coordinator: cannot start: cannot load the tokenizer in {tmp_path}:")


def test_coordinator_with_a_missing_tokenizer_directory(tmp_path: Path) -> None:
    """A whole process: Hugging Face read the path as a Hub repo id ("Repo id must use alphanumeric chars")."""
    missing = tmp_path / "no-such-dir"
    result = run_service("coordinator", "--draft-addr", "127.0.0.1:1", "--target-addr", "127.0.0.1:1",
                         "--tokenizer", str(missing))  # fmt: skip
    assert_one_clear_line(result, f"coordinator: cannot start: cannot load the tokenizer: {missing} is not a directory")


def test_coordinator_on_a_port_in_use(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, busy_port: int
) -> None:
    monkeypatch.setattr(coordinator_cli, "build_orchestrator", lambda _config: SimpleNamespace())  # no services
    code, err = run_coordinator(monkeypatch, capsys, tmp_path, 1, "--port", str(busy_port))
    assert_one_line(code, err, "coordinator: cannot start: could not bind", f"127.0.0.1:{busy_port}")


def test_coordinator_with_its_http_port_in_use(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, busy_port: int
) -> None:
    monkeypatch.setattr(coordinator_cli, "build_orchestrator", lambda _config: SimpleNamespace())
    monkeypatch.setattr(coordinator_cli, "create_server", lambda *_a, **_k: (SimpleNamespace(gate=None), 1))
    code, err = run_coordinator(monkeypatch, capsys, tmp_path, 1, "--http-port", str(busy_port))
    assert_one_line(code, err, f"coordinator: cannot serve HTTP on 127.0.0.1:{busy_port}:", "in use")


def interrupt(*_args: object, **_kwargs: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("phase", ["start", "serve"])
def test_ctrl_c_exits_the_coordinator_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, phase: str
) -> None:
    """Ctrl-C while it waits for the model services (up to --connect-timeout), or at any later point."""
    if phase == "start":
        monkeypatch.setattr(coordinator_cli, "build_orchestrator", interrupt)
    else:
        monkeypatch.setattr(coordinator_cli, "start", lambda _config: (SimpleNamespace(), "banner", None))
        monkeypatch.setattr(coordinator_cli, "serve_until_signalled", interrupt)
    code, err = run_coordinator(monkeypatch, capsys, tmp_path, 1)
    assert code == 130 and err == ""
