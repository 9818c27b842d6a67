"""`calispec memory stats --top` and the writer token of `memory import` / `calibrate --corpus`: input the
command cannot use is a usage error (one line, exit 2) before any connection (the address is a closed port).

`--top -1` was a protobuf traceback (GetStatsRequest.top_k is a uint32) and `--top 20000` went to the server to
be refused; a writer token file missing, unreadable or holding no token exited 1, as a failed command.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calispec_core.errors import InvalidArgument
from calispec_core.limits import MAX_STATS_TOP_PAIRS
from calispec_tools import cli, cli_calibrate
from memory_service.store import CorrectionStore

CLOSED = "127.0.0.1:1"
TOKEN = "a-writer-token-long-enough-0123456789"


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    """The command's stderr lines; it must exit 2, before a connection (none could succeed)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


# -- stats --top -----------------------------------------------------------------------------------------


def stats(*flags: str) -> list[str]:
    return ["memory", "stats", "--namespace", "n", "--memory-addr", CLOSED, *flags]


@pytest.mark.parametrize("top", ["-1", str(MAX_STATS_TOP_PAIRS + 1), "20000", str(2**32)])
def test_a_top_the_service_refuses_is_a_usage_error(top: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, stats("--top", top))[-1]  # argparse's, after its usage
    assert line.endswith(f"argument --top: must be in [0, {MAX_STATS_TOP_PAIRS}], got {top}")


@pytest.mark.parametrize("top", ["0", "20", str(MAX_STATS_TOP_PAIRS)])
def test_a_top_the_service_takes_is_taken(top: str) -> None:
    assert cli.build_parser().parse_args(stats("--top", top)).top == int(top)


def test_the_service_keeps_its_own_check_on_the_same_bound(tmp_path: Path) -> None:
    """Other clients than the CLI call GetStats: the store refuses what the flag refuses."""
    with CorrectionStore(tmp_path / "memory.db", flush_interval_s=0) as store:
        assert store.table_stats("n", MAX_STATS_TOP_PAIRS).top_pairs == []
        for top_k in (-1, MAX_STATS_TOP_PAIRS + 1):
            with pytest.raises(InvalidArgument, match=rf"top_k must be in \[0, {MAX_STATS_TOP_PAIRS}\]"):
                store.table_stats("n", top_k)


@pytest.mark.parametrize("case", ["missing", "not a model dir", "a file"])
def test_a_tokenizer_that_does_not_load_is_a_usage_error(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tokenizer /nonexistent` printed transformers' traceback after the call (wave 50)."""
    (tmp_path / "a-file").write_text("x\n")
    path, problem = {
        "missing": (tmp_path / "nope", "not a directory"),
        "not a model dir": (tmp_path, "no tokenizer loads from it"),
        "a file": (tmp_path / "a-file", "not a directory"),
    }[case]
    assert cli.main(stats("--tokenizer", str(path))) == 2  # before the call: the address is a closed port
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --tokenizer {path}: {problem}"), line


# -- the writer token ------------------------------------------------------------------------------------


def bad_token_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a --writer-token-file, what the error says of it)."""
    short = tmp_path / "short"
    short.write_text("short\n")
    missing, directory = tmp_path / "missing", tmp_path
    return {
        "missing": (missing, f"cannot read writer token file {missing}: No such file or directory"),
        "a directory": (directory, f"cannot read writer token file {directory}: Is a directory"),
        "no token": (short, f"writer token file {short} must hold one token"),
    }


@pytest.fixture
def memory_export(tmp_path: Path) -> Path:
    """An import's --file: never read, the token comes first (a missing one would exit 1, as before)."""
    return tmp_path / "x.json"


def import_argv(file: Path, *flags: str) -> list[str]:
    return ["memory", "import", "--namespace", "n", "--memory-addr", CLOSED, "--file", str(file), *flags]


def calibrate_argv(tmp_path: Path, *flags: str) -> list[str]:
    """`calibrate --corpus` into the memory service, with a pair of (empty) model directories: the token is
    read before any connection and before the pair loads."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "draft").mkdir(exist_ok=True)
    (tmp_path / "target").mkdir(exist_ok=True)
    pair = ["--draft", str(tmp_path / "draft"), "--target", str(tmp_path / "target")]
    return ["calibrate", "--corpus", str(corpus), *pair, "--namespace", "n", "--memory-addr", CLOSED, *flags]


@pytest.fixture
def nothing_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    def loaded(*_args: object) -> None:
        raise AssertionError("the pair loaded before the writer token was read")

    monkeypatch.setattr(cli_calibrate, "_load", loaded)


@pytest.mark.usefixtures("nothing_loads")
@pytest.mark.parametrize("case", ["missing", "a directory", "no token"])
@pytest.mark.parametrize("command", ["memory import", "calibrate"])
def test_a_writer_token_file_the_command_cannot_use_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], memory_export: Path, command: str, case: str
) -> None:
    path, problem = bad_token_files(tmp_path)[case]
    flags = ("--writer-token-file", str(path))
    argv = import_argv(memory_export, *flags) if command == "memory import" else calibrate_argv(tmp_path, *flags)
    [line] = usage_error(capsys, argv)
    assert line.startswith(f"error: {problem}"), line


@pytest.mark.usefixtures("nothing_loads")
@pytest.mark.parametrize("command", ["memory import", "calibrate"])
def test_no_writer_token_file_and_no_stack_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], memory_export: Path, command: str
) -> None:
    argv = import_argv(memory_export) if command == "memory import" else calibrate_argv(tmp_path)
    assert usage_error(capsys, argv) == ["error: give --writer-token-file (no running `calispec up` to take it from)"]


def test_a_usable_writer_token_file_gets_past_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], memory_export: Path
) -> None:
    """The import then goes on to its file (missing here: a failed import, exit 1, as before)."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    assert cli.main(import_argv(memory_export, "--writer-token-file", str(token))) == 1
    assert "nothing was imported" in capsys.readouterr().err


def test_a_tls_stacks_certificates_it_cannot_use_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`calispec up --tls-dir D` with certificates of one's own but no client.pem: the memory tools took the stack's
    files unchecked and failed with a traceback (found by review); one line naming the file, exit 2."""
    import os

    from calispec_tools.stack_state import StackState

    (tmp_path / "tls").mkdir()
    StackState(os.getpid(), "c", CLOSED, "ns", "d", "t", "w", tls_dir=str(tmp_path / "tls")).write()
    lines = usage_error(capsys, ["memory", "stats", "--namespace", "ns"])
    assert len(lines) == 1 and "client.pem" in lines[0], lines
