"""Start-up failures the operator must fix: one line naming the path and the cause, exit 2, no traceback."""

from __future__ import annotations

import math
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
import draft_service.__main__ as draft_cli
import target_service.__main__ as target_cli
from calispec_core.access import Quota
from calispec_core.batch_scheduler import BatchScheduler
from calispec_core.generation import Defaults
from calispec_core.modeling import ModelSpec
from coordinator.config import CoordinatorConfig
from draft_service.__main__ import parse_config as parse_draft
from memory_service.__main__ import parse_args as parse_memory
from memory_service.config import MemoryConfig
from target_service.__main__ import parse_config as parse_target
from target_service.config import TargetConfig
from target_service.memory_link import MemoryLink
from target_service.pair_table import PairTable
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
        # the cause was "cannot make its lock file: [Errno 17] File exists" (wave 50's probe)
        (lambda tmp: corrupt_database(tmp) / "memory.db", "corrupt.db is a file, not a directory"),
        (lambda tmp: corrupt_database(tmp) / "sub" / "memory.db", "corrupt.db is a file, not a directory"),
        (unwritable_path, ""),
    ],
    ids=["corrupt", "damaged-pages", "directory", "parent-is-a-file", "grandparent-is-a-file", "read-only"],
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


@pytest.mark.parametrize("interval", [0, -1, math.nan, math.inf])
def test_the_memory_link_refuses_a_sync_interval_of_zero_or_less(interval: float) -> None:
    """Its flusher waits this long between flushes: -1 spun a core (refused before it opens a channel)."""
    with pytest.raises(ValueError, match="sync_interval_s must be a finite number > 0"):
        MemoryLink("127.0.0.1:1", "default", PairTable(vocab_size=8), sync_interval_s=interval)


MODEL_FLAGS_BROKEN = [  # (flag, value): each broke a model service (a crash after the model load, a hang, a spin)
    ("--max-batch-size", "0"),
    ("--max-batch-size", "-1"),
    ("--max-sessions", "0"),
    ("--threads", "0"),
    ("--threads", "100000"),  # "can't start new thread", then SIGSEGV (found by probing)
    ("--session-idle-ttl-s", "-1"),
    ("--session-idle-ttl-s", "nan"),
    ("--session-idle-ttl-s", "inf"),  # overflowed the reaper's wait
    ("--batch-gather-ms", "inf"),  # overflowed the batcher's wait: rows queued behind it waited forever
]


@pytest.mark.parametrize(
    ("service", "flag", "value"),
    [
        *[(service, flag, value) for service in ("draft", "target") for flag, value in MODEL_FLAGS_BROKEN],
        ("draft", "--proposal-top-k", "-1"),
        ("memory", "--half-life", "-1"),
        ("memory", "--half-life", "nan"),
        ("memory", "--writer-burst", "0"),
        ("memory", "--writer-burst", "0.5"),  # a write costs at least one event: every write refused
        ("memory", "--writer-burst", "-5"),
        ("memory", "--writer-burst", "nan"),
        ("memory", "--writer-rate-limit", "-1"),
        ("memory", "--writer-rate-limit", "nan"),
        ("memory", "--writer-rate-limit", "inf"),
        ("memory", "--max-workers", "0"),
        ("memory", "--max-workers", "1"),  # the first Watch stream (anyone's) took every worker
        ("memory", "--max-watch-streams", "0"),
        ("memory", "--max-pairs-default", "0"),
        ("memory", "--max-pairs", "0"),
        ("memory", "--max-pairs-per-draft", "0"),
        ("memory", "--flush-interval", "0"),
    ],
)
def test_service_flags_that_would_break_it_are_usage_errors_naming_the_flag(
    capsys: pytest.CaptureFixture[str], service: str, flag: str, value: str
) -> None:
    assert f"argument {flag}:" in usage_error(capsys, service, f"{flag}={value}")


HUGE_WAITS = [  # (service, flag, value): finite, past threading's ~9.2e9 s; each killed a thread or broke start-up
    *[(service, flag, value) for service in ("draft", "target") for flag, value in
      (("--session-idle-ttl-s", "1e11"), ("--batch-gather-ms", "1e300"), ("--drain-timeout-s", "1e300"))],
    ("target", "--memory-sync-interval", "1e10"),  # the memory flush thread: events never shipped
    ("memory", "--flush-interval", "1e300"),
    ("memory", "--watch-max-age", "1e300"),
    ("coordinator", "--target-refresh", "1e300"),  # the DNS thread: replicas never re-resolved
    ("coordinator", "--rpc-timeout", "1e10"),  # "cannot start: draft: Deadline Exceeded"
    ("coordinator", "--connect-timeout", "1e300"),  # "timestamp out of range for platform time_t"
    ("coordinator", "--draft-timeout", "1e300"),
    ("coordinator", "--draft-max-backoff", "1e300"),
    ("coordinator", "--lockstep-wait", "1e300"),
    ("coordinator", "--http-header-timeout", "1e300"),
]  # fmt: skip


@pytest.mark.parametrize(("service", "flag", "value"), HUGE_WAITS)
def test_a_wait_past_what_threads_can_wait_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], service: str, flag: str, value: str
) -> None:
    """Found by probing: such a value passed (finite) and killed a background thread (the batcher, the reaper, the
    memory flush, the DNS refresh) with an OverflowError, or failed the start blaming another service."""
    limit = "1e+10" if flag == "--batch-gather-ms" else "1e+07"
    assert f"argument {flag}: must be at most {limit}, got {value}" in usage_error(capsys, service, f"{flag}={value}")


@pytest.mark.parametrize(
    ("service", "flag", "value"),
    [
        ("target", "--memory-addr", "127.0.0.1:99999"),  # served on local counts for good, without a word
        ("target", "--memory-addr", ""),
        ("target", "--memory-namespace", "a b"),  # every Watch refused INVALID_ARGUMENT, logged at DEBUG
        ("target", "--memory-namespace", ""),
        ("coordinator", "--draft-addr", "127.0.0.1:99999"),  # waited out --connect-timeout, then "no service"
        ("coordinator", "--draft-addr", ""),  # gRPC's channel-stack error blocks
        ("coordinator", "--target-addr", "t:0"),
        ("coordinator", "--target-dns", "dns:///target-pods:50051"),  # waited out --connect-timeout
        ("coordinator", "--target-dns", "[::1]:50051"),
        ("coordinator", "--target-dns", ":50051"),  # failed the start: "expected HOST:PORT"
        ("coordinator", "--target-dns", "target-pods"),
    ],
)
def test_addresses_and_namespaces_the_service_cannot_use_are_usage_errors(
    capsys: pytest.CaptureFixture[str], service: str, flag: str, value: str
) -> None:
    """Found by probing: each was taken, and the service started, to fail at its first use or never say why."""
    assert f"argument {flag}: must be" in usage_error(capsys, service, f"{flag}={value}")


def test_the_model_services_accept_the_edges_of_their_ranges() -> None:
    edges = ["--max-batch-size=1", "--max-sessions=1", "--threads=1", "--session-idle-ttl-s=0", "--batch-gather-ms=0"]
    for parse in (parse_draft, parse_target):
        config, _ = parse(["--model", "m", *edges, "--prefix-cache-tokens=0"])
        assert (config.max_batch_size, config.max_sessions, config.model.threads) == (1, 1, 1)
        assert config.session_idle_ttl_s == 0 and config.batch_gather_s == 0 and config.prefix_cache_tokens == 0
    assert parse_draft(["--model", "m", "--proposal-top-k=0"])[0].proposal_top_k == 0
    upper = ["--threads=1024", "--session-idle-ttl-s=1e7", "--batch-gather-ms=1e10", "--drain-timeout-s=1e7"]
    for parse in (parse_draft, parse_target):
        config, _ = parse(["--model", "m", *upper])
        assert (config.model.threads, config.session_idle_ttl_s, config.batch_gather_s) == (1024, 1e7, 1e7)


def test_the_memory_service_accepts_the_edges_of_its_ranges() -> None:
    config, _ = parse_memory(
        ["--allow-unauthenticated-writes", "--half-life=0", "--writer-rate-limit=0.05", "--writer-burst=1",
         "--max-workers=2", "--max-watch-streams=1", "--max-pairs-default=1", "--max-pairs=1",
         "--max-pairs-per-draft=1", "--flush-interval=0.001"]
    )  # fmt: skip
    assert (config.limits.half_life_s, config.writer_events_per_s, config.writer_burst_events) == (0, 0.05, 1)
    assert (config.max_workers, config.max_watch_streams, config.max_pairs_default) == (2, 1, 1)
    assert (config.limits.max_pairs, config.limits.max_pairs_per_draft) == (1, 1)
    assert parse_memory(["--allow-unauthenticated-writes", "--writer-rate-limit=0"])[0].writer_events_per_s == 0


def test_a_writer_rate_whose_default_burst_admits_no_write_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """10 s of 0.05 events/s is half an event: every write was refused as larger than the burst."""
    assert "the writer burst must be >= 1 event, got 0.5" in usage_error(capsys, "memory", "--writer-rate-limit=0.05")


# -- domain configs: values that would spin, hang or fail every request are refused where they are made ----------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Quota(requests_per_minute=-1), "requests_per_minute must be >= 0"),
        (lambda: Quota(requests_per_minute=math.nan), "requests_per_minute must be >= 0"),
        (lambda: Quota(requests_per_minute=60, burst=0.5), "burst must be >= 1"),
        (lambda: Quota(max_concurrent=-1), "max_concurrent must be >= 0"),
        (lambda: Defaults(max_new_tokens=0), "max_new_tokens must be in"),
        (lambda: Defaults(num_speculative_tokens=17), "num_speculative_tokens must be in"),
        (lambda: Defaults(tau=0.0), "tau must be in"),
        (lambda: CoordinatorConfig("d:1", ("t:1",), Path("t"), rpc_timeout_s=0), "rpc_timeout_s must be > 0"),
        (lambda: CoordinatorConfig("d:1", (), Path("t"), target_refresh_s=-1), "target_refresh_s must be > 0"),
        (lambda: CoordinatorConfig("d:1", ("t:1",), Path("t"), max_gamma=0), "max_gamma must be in"),
        (lambda: CoordinatorConfig("d:1", ("t:1",), Path("t"), max_gamma=17), "max_gamma must be in"),
        (lambda: MemoryConfig(writer_events_per_s=math.nan), "writer_events_per_s must be >= 0"),
        (lambda: MemoryConfig(writer_events_per_s=10, writer_burst_events=0.5), "writer burst must be >= 1"),
        (lambda: MemoryConfig(writer_events_per_s=0.05), "writer burst must be >= 1 event, got 0.5"),
        (lambda: BatchScheduler(lambda rows: list(rows), 1, gather_s=math.inf), "gather time must be a finite"),
    ],
)
def test_domain_configs_refuse_values_that_would_break_every_request(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_domain_configs_keep_their_meaningful_edges() -> None:
    assert Quota(requests_per_minute=0, burst=1, max_concurrent=0).limited is False
    assert Defaults(max_new_tokens=1, num_speculative_tokens=16).num_speculative_tokens == 16
    assert CoordinatorConfig("d:1", ("t:1",), Path("t"), max_gamma=16, rpc_timeout_s=0.001).max_gamma == 16
    assert MemoryConfig(writer_events_per_s=0, writer_burst_events=0.5).writer_events_per_s == 0  # no limit at all
    assert MemoryConfig(writer_events_per_s=0.1).writer_events_per_s == 0.1  # a burst of exactly one event


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
        monkeypatch.setattr(coordinator_cli, "start", lambda _config: (SimpleNamespace(), "banner", None, None))
        monkeypatch.setattr(coordinator_cli, "serve_until_signalled", interrupt)
    code, err = run_coordinator(monkeypatch, capsys, tmp_path, 1)
    assert code == 130 and err == ""


@pytest.mark.parametrize("service", ["draft", "target"])
@pytest.mark.parametrize("phase", ["load", "start"])
def test_ctrl_c_exits_a_model_service_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], service: str, phase: str
) -> None:
    """Ctrl-C while the model loads (minutes for a large one) or its forward costs are measured, before the
    SIGINT handler is in: it printed a KeyboardInterrupt traceback."""
    cli = draft_cli if service == "draft" else target_cli
    monkeypatch.setattr(cli, "configure_logging", lambda _level: None)
    if phase == "load":
        monkeypatch.setattr(cli, "ModelRunner", interrupt)
    else:
        monkeypatch.setattr(cli, "ModelRunner", lambda *_a, **_k: SimpleNamespace())
        monkeypatch.setattr(cli, "create_server", interrupt)
    with pytest.raises(SystemExit) as exit_:
        try:
            cli.main(["--model", "m", "--port", "0"])
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C escaped main: a traceback")
    assert exit_.value.code == 130 and capsys.readouterr().err == ""


def test_a_start_up_error_keeps_its_cause_on_its_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Only the first line was printed: transformers' "Class validation error for validator 'validate_architecture':"
    lost "hidden size (7) is not a multiple of the number of attention heads (32)" (found by probing)."""
    from calispec_core.service_cli import MAX_CAUSE_CHARS, startup_step

    cause = "Class validation error for validator 'validate_architecture':\n  hidden size (7) is not a multiple (32)\n"
    with pytest.raises(SystemExit) as exited, startup_step("target_service", "cannot load the model in m"):
        raise ValueError(cause)
    [line] = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2
    assert line == (
        "target_service: cannot load the model in m: Class validation error for validator 'validate_architecture': "
        "hidden size (7) is not a multiple (32)"
    )
    with pytest.raises(SystemExit), startup_step("s", "w"):
        raise ValueError("x" * 5000)
    assert len(capsys.readouterr().err.strip()) == len("s: w: ") + MAX_CAUSE_CHARS
