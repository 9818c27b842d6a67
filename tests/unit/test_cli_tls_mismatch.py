"""A client command that talks plaintext to a TLS coordinator, or TLS to a plaintext one: gRPC says only
"Socket closed" or names an SSL record error; the CLI's line now hints at `--tls-ca` (wave 50's probe: no hint).

The servers are bare gRPC servers on loopback (no service: the handshake is what fails)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from calispec.client import CalispecRpcError
from calispec_tools import cli, cli_chat
from calispec_tools.certs import DevCerts, make_dev_certs
from calispec_tools.cli_auth import rpc_error_line

PLAINTEXT_HINT = "if the coordinator serves TLS, give --tls-ca or set CALISPEC_TLS_CA"
TLS_HINT = "the coordinator may not serve TLS"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return make_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_server(certs: DevCerts) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(1))
    pair = (Path(certs.key("coordinator")).read_bytes(), Path(certs.cert("coordinator")).read_bytes())
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture
def plaintext_server() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture(autouse=True)
def no_ca_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CALISPEC_TLS_CA", raising=False)


def last_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi"], ["chat", "-m", "hi"]], ids=["generate", "chat"])
def test_plaintext_to_a_tls_coordinator_hints_at_the_ca(
    tls_server: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert cli.main([*argv, "--address", tls_server, "--timeout", "30"]) == 1
    line = last_error_line(capsys)
    assert line.startswith("error: UNAVAILABLE") and line.endswith(f"({PLAINTEXT_HINT})")


def test_tls_to_a_plaintext_coordinator_hints_that_it_may_not_serve_tls(
    plaintext_server: str, certs: DevCerts, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--prompt", "hi", "--address", plaintext_server, "--tls-ca", str(certs.ca), "--timeout", "30"]
    assert cli.main(argv) == 1
    assert TLS_HINT in last_error_line(capsys)


def test_grpcs_own_handshake_log_line_stays_off_the_commands_stderr(plaintext_server: str, certs: DevCerts) -> None:
    """gRPC's C core printed "I1206 ... Handshake failed ..." above the command's one line (found by probing)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_VERBOSITY", "CALISPEC_TLS_CA")}
    argv = ["generate", "--prompt", "hi", "--address", plaintext_server, "--tls-ca", str(certs.ca), "--timeout", "30"]
    result = subprocess.run(
        [sys.executable, "-m", "calispec_tools.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: UNAVAILABLE"), result.stderr


def test_a_failed_chat_turn_hints_too() -> None:
    closed = CalispecRpcError("UNAVAILABLE", "failed to connect to all addresses; last error: Socket closed")

    class Failing:
        def chat_stream(self, *_args: object, **_kwargs: object) -> Iterator[object]:
            raise closed

    turns = ["hi"]

    def read(_prompt: str) -> str:
        if not turns:
            raise EOFError
        return turns.pop()

    out: list[str] = []
    writer = type("W", (), {"write": lambda _self, text: out.append(text), "flush": lambda _self: None})()
    code = cli_chat.repl(Failing(), [], {}, 30, read=read, out=writer)  # type: ignore[arg-type]
    assert code == 1 and PLAINTEXT_HINT in "".join(out)


def test_other_failures_get_no_hint() -> None:
    refused = CalispecRpcError("UNAVAILABLE", "failed to connect to all addresses; last error: Connection refused")
    assert rpc_error_line(refused, tls=False) == f"error: {refused}"
    assert rpc_error_line(CalispecRpcError("INVALID_ARGUMENT", "Socket closed"), tls=False).endswith("Socket closed")
    # a coordinator gone mid-reply (killed): the connection had come up, so no TLS hint (found by probing)
    gone = CalispecRpcError("UNAVAILABLE", "Stream removed (Socket closed)")
    assert rpc_error_line(gone, tls=False) == f"error: {gone}"
