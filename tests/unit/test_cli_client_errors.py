"""The CLI's client commands given credentials or parameters they cannot use: one line, no traceback (exit 2;
the memory commands exit 1, as for each of their errors).

Every case fails before a connection is tried, so no service runs (the address is a closed port).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calispec.client import CalispecClient
from calispec_tools import cli, cli_calibrate

CLOSED = "127.0.0.1:1"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


REQUESTS = {"generate": ["generate", "--prompt", "hi"], "chat": ["chat", "-m", "hi"]}


def request(command: str, *flags: str) -> list[str]:
    return [*REQUESTS[command], "--address", CLOSED, *flags]


@pytest.mark.parametrize("command", REQUESTS)
def test_a_missing_tls_ca_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """It was a FileNotFoundError traceback."""
    missing = tmp_path / "ca.pem"
    assert cli.main(request(command, "--tls-ca", str(missing))) == 2
    assert str(missing) in one_error_line(capsys)


@pytest.mark.parametrize("command", REQUESTS)
def test_a_missing_tls_ca_from_the_environment_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv("CALISPEC_TLS_CA", str(tmp_path / "env-ca.pem"))
    assert cli.main(request(command)) == 2
    assert "env-ca.pem (tls_ca / CALISPEC_TLS_CA)" in one_error_line(capsys)


@pytest.mark.parametrize("command", REQUESTS)
def test_a_token_with_a_newline_is_one_line(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """It reached gRPC, which failed the call with INTERNAL "Invalid metadata"."""
    assert cli.main(request(command, "--token", "csk_bad\ntoken")) == 2
    line = one_error_line(capsys)
    assert "token (API key) must be printable ASCII" in line and "csk_" not in line


@pytest.mark.parametrize("command", REQUESTS)
def test_a_parameter_the_request_cannot_carry_is_one_line(capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert cli.main(request(command, "--seed", str(2**70))) == 2
    assert "out of range" in one_error_line(capsys)


@pytest.mark.parametrize(
    "argv", [["namespaces"], ["stats", "--namespace", "n"], ["export", "--namespace", "n", "--out", "x.json"]]
)
def test_memory_commands_with_missing_tls_files_are_one_line(tmp_path: Path, argv: list[str]) -> None:
    """A FailedPrecondition traceback: the commands caught grpc.RpcError only."""
    missing = tmp_path / "client.pem"
    tls = ["--memory-tls-cert", str(missing), "--memory-tls-key", str(tmp_path / "k"), "--memory-tls-ca", "ca"]
    with pytest.raises(SystemExit, match=f"^error: cannot read {missing}: No such file or directory$"):
        cli.main(["memory", *argv, "--memory-addr", CLOSED, *tls])  # SystemExit(message): one line, exit 1


@pytest.mark.parametrize("method", ["generate", "chat"])  # `calispec generate`; the chat of `calispec demo`
def test_a_value_error_from_the_call_itself_is_not_a_usage_error(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Parameters are checked before the call; a ValueError the call raises (e.g. a finish reason this SDK does
    not know, from a newer coordinator) is no input of the user's: it was printed as one, exit 2."""

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ValueError("7 is not a valid FinishReason")

    monkeypatch.setattr(CalispecClient, method, broken)
    args = cli.build_parser().parse_args(request("generate"))
    messages = [{"role": "user", "content": "hi"}] if method == "chat" else None
    with pytest.raises(ValueError, match="FinishReason"):
        cli.run_request(CLOSED, args, messages)


def test_demo_checks_its_request_before_the_stack_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The request was checked when it was sent: after the stack had started (minutes of model loads)."""

    def stack_config(*_args: object) -> None:
        raise AssertionError("the stack started before the request was checked")

    monkeypatch.setattr(cli, "stack_config", stack_config)
    assert cli.main(["demo", "--pair", "tiny", "--seed", str(2**70)]) == 2
    assert "out of range" in one_error_line(capsys)


# bench and eval against --address build their clients' credentials from the same flags and environment
LOADS = {
    "bench": lambda out: ["bench", "--address", CLOSED, "--prompts", "code", "--out", str(out)],
    "eval": lambda out: ["eval", "--address", CLOSED, "--limit", "1", "--out", str(out)],
}


@pytest.mark.parametrize("command", LOADS)
def test_bench_and_eval_name_a_missing_tls_ca_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A ValueError traceback from the SDK (generate/chat printed one line); the output directory is not made."""
    missing, out = tmp_path / "ca.pem", tmp_path / "out"
    assert cli.main([*LOADS[command](out), "--tls-ca", str(missing)]) == 2
    assert str(missing) in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("command", LOADS)
def test_bench_and_eval_name_a_ca_from_the_environment_that_is_no_pem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    monkeypatch.setenv("CALISPEC_TLS_CA", str(not_pem))
    assert cli.main(LOADS[command](tmp_path / "out")) == 2
    assert "holds no PEM certificate" in one_error_line(capsys)


def test_bench_against_the_http_api_names_a_bad_token_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--openai-url", "http://127.0.0.1:1/v1", "--prompts", "code", "--token", "csk_bad\ntoken"]
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert "token (API key) must be printable ASCII" in line and "csk_" not in line


def test_calibrate_by_sd_names_a_missing_tls_ca_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`calibrate --prompts` sends its requests to the coordinator: the same ValueError traceback."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\n")
    missing = tmp_path / "ca.pem"
    argv = ["calibrate", "--prompts", str(prompts), "--memory-addr", CLOSED, "--tls-ca", str(missing)]
    assert cli.main(argv) == 2
    assert str(missing) in one_error_line(capsys)


class CalibrationRan(Exception):
    pass


def test_calibrate_corpus_ignores_a_stale_tls_ca_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teacher-forced calibration talks to no coordinator: a stale CALISPEC_TLS_CA must not stop it."""

    def calibration_ran(*_args: object) -> None:
        raise CalibrationRan

    monkeypatch.setenv("CALISPEC_TLS_CA", str(tmp_path / "stale-ca.pem"))
    monkeypatch.setattr(cli_calibrate, "_load", calibration_ran)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n')
    (tmp_path / "d").mkdir()
    (tmp_path / "t").mkdir()
    pair = ["--draft", str(tmp_path / "d"), "--target", str(tmp_path / "t")]
    argv = ["calibrate", "--corpus", str(corpus), *pair, "--export", str(tmp_path / "x")]
    with pytest.raises(CalibrationRan):
        cli.main(argv)
