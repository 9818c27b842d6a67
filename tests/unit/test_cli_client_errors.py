"""The CLI's client commands given credentials or parameters they cannot use: one line, no traceback, exit 2
(the memory commands' TLS files too; their other errors exit 1).

Every case fails before a connection is tried, so no service runs (the address is a closed port).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calispec.client import CalispecClient
from calispec_tools import cli, cli_calibrate, cli_memory

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


def argparse_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """argparse's one line (after its usage) for a flag the request cannot carry: exit 2 before anything runs."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", REQUESTS)
def test_a_parameter_the_request_cannot_carry_is_one_line(capsys: pytest.CaptureFixture[str], command: str) -> None:
    line = argparse_error(capsys, request(command, "--seed", str(2**70)))
    assert "argument --seed: must be in [0, 2**63)" in line


MEMORY_COMMANDS = [
    ["memory", "namespaces"],
    ["memory", "stats", "--namespace", "n"],
    ["memory", "export", "--namespace", "n", "--out", "x.json"],
    ["memory", "import", "--namespace", "n", "--file", "x.json", "--writer-token-file", "t"],
    ["calibrate", "--prompts", "prompts.txt"],  # its memory service's TLS: the same flags
]


def memory_tls_error(capsys: pytest.CaptureFixture[str], argv: list[str], tls: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, "--memory-addr", CLOSED, *tls])
    assert exited.value.code == 2  # a usage error, as `generate --tls-ca` gives: it was 1
    return one_error_line(capsys)


@pytest.mark.parametrize("argv", MEMORY_COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_memory_commands_with_missing_tls_files_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """A FailedPrecondition traceback (the commands caught grpc.RpcError only), then one line with exit 1."""
    monkeypatch.chdir(tmp_path)
    Path("prompts.txt").write_text("def add(a, b):\n")
    missing = tmp_path / "client.pem"
    tls = ["--memory-tls-cert", str(missing), "--memory-tls-key", str(tmp_path / "k"), "--memory-tls-ca", "ca"]
    assert memory_tls_error(capsys, argv, tls) == f"error: cannot read {missing}: No such file or directory"


@pytest.mark.parametrize("argv", MEMORY_COMMANDS[:2], ids=lambda argv: " ".join(argv[:2]))
def test_memory_tls_files_that_are_no_certificates_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """gRPC logged its own lines and the command reported the memory service UNAVAILABLE (exit 1)."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    tls = ["--memory-tls-cert", str(garbage), "--memory-tls-key", str(garbage), "--memory-tls-ca", str(garbage)]
    assert f"TLS certificate {garbage} holds no valid PEM certificate" in memory_tls_error(capsys, argv, tls)


def test_half_the_memory_tls_files_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = memory_tls_error(capsys, ["memory", "namespaces"], ["--memory-tls-cert", str(tmp_path / "c.pem")])
    assert line == "error: give all three of --memory-tls-cert, --memory-tls-key and --memory-tls-ca"


def test_usable_memory_tls_files_pass_the_check(tmp_path: Path) -> None:
    from calispec_tools.certs import make_dev_certs

    certs = make_dev_certs(tmp_path / "tls")
    flags = ["--memory-tls-cert", str(certs.cert("client")), "--memory-tls-key", str(certs.key("client"))]
    args = cli.build_parser().parse_args(["memory", "namespaces", *flags, "--memory-tls-ca", str(certs.ca)])
    tls = cli_memory.memory_tls(args)
    assert tls is not None and tls.cert == certs.cert("client")


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
    assert "argument --seed" in argparse_error(capsys, ["demo", "--pair", "tiny", "--seed", str(2**70)])


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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-ca", "CA"], "--tls-ca is for an https:// --openai-url"),
        (["--tls-ca", "MISSING", "--https"], "cannot read the TLS CA bundle"),
        (["--tls-ca", "CA", "--https"], "holds no certificate ssl can load"),  # PEM-looking: it was a traceback
        (["--tls-server-name", "coordinator", "--https"], "--tls-server-name is for --address"),
    ],
)
def test_bench_against_the_http_api_takes_a_ca_for_https_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """--tls-ca was ignored with --openai-url (found by probing): now it is the https server's CA, refused where it
    cannot be one, before any request."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    scheme = "https" if "--https" in flags else "http"
    given = [{"CA": str(ca), "MISSING": str(tmp_path / "missing.pem")}.get(f, f) for f in flags if f != "--https"]
    argv = ["bench", "--openai-url", f"{scheme}://127.0.0.1:1/v1", "--prompts", "code", *given]
    assert cli.main(argv) == 2
    assert message in one_error_line(capsys)


def test_a_ca_left_in_the_environment_is_not_for_an_http_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """$CALISPEC_TLS_CA from a `calispec up --tls` session refused a plain http --openai-url (found by review): it
    applies to https ones only, as to the other commands' plaintext stacks. The run goes on (nothing listens: 1)."""
    monkeypatch.setenv("CALISPEC_TLS_CA", str(tmp_path / "missing.pem"))
    argv = ["bench", "--openai-url", "http://127.0.0.1:1/v1", "--prompts", "code", "--out", str(tmp_path / "out")]
    assert cli.main([*argv, "--no-plots", "--num-requests", "1"]) == 1
    assert "TLS CA" not in capsys.readouterr().err


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


@pytest.mark.parametrize("command", REQUESTS)
def test_requests_without_an_address_go_to_the_running_stacks_coordinator(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """They dialled 127.0.0.1:50050 whatever port `calispec up --port` had taken (found by probing the docs)."""
    import os

    from calispec_tools.stack_state import StackState

    StackState(os.getpid(), "127.0.0.2:1", CLOSED, "ns", "d", "t", "token").write()  # nothing listens there
    assert cli.main([*REQUESTS[command], "--timeout", "5"]) == 1
    assert "127.0.0.2:1" in capsys.readouterr().err
