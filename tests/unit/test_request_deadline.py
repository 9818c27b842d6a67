"""The coordinator's deadline for a request: the client's, or the server default when it set none."""

from __future__ import annotations

from coordinator.__main__ import parse_config
from coordinator.server import request_timeout


def test_no_client_deadline_gets_the_server_default() -> None:
    assert request_timeout(None, 60.0) == 60.0
    assert request_timeout(9.223372035e18, 60.0) == 60.0  # what grpc reports for a call without a deadline


def test_a_client_deadline_is_honoured_shorter_or_longer() -> None:
    assert request_timeout(0.5, 60.0) == 0.5
    assert request_timeout(600.0, 60.0) == 600.0


def test_the_default_is_configurable() -> None:
    config, _ = parse_config(["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "x", "--rpc-timeout", "9"])
    assert config.rpc_timeout_s == 9.0
