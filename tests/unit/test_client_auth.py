"""The SDK's credentials: explicit arguments, "" included, win over the environment; unusable ones are refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from calispec._channel import ClientAuth
from calispec.client import AsyncCalispecClient, CalispecClient


def test_an_empty_credential_means_none_whatever_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALISPEC_TOKEN", "env-key")
    monkeypatch.setenv("CALISPEC_TLS_CA", "/env/ca.pem")
    assert ClientAuth.resolve() == ClientAuth("env-key", Path("/env/ca.pem"))  # None: the environment's
    assert ClientAuth.resolve(token="", tls_ca="") == ClientAuth(None, None)  # "": none (plaintext, no key)
    assert ClientAuth.resolve(token="k", tls_ca="/my/ca.pem") == ClientAuth("k", Path("/my/ca.pem"))


# -- credentials the SDK cannot use: a clear ValueError at construction, not a traceback or INTERNAL ----------


def test_a_missing_ca_bundle_is_a_value_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It escaped as a bare FileNotFoundError from the channel's construction."""
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ValueError, match=f"cannot read the TLS CA bundle {missing}.*No such file"):
        CalispecClient("127.0.0.1:1", tls_ca=missing)
    monkeypatch.setenv("CALISPEC_TLS_CA", str(missing))
    with pytest.raises(ValueError, match=f"{missing} \\(tls_ca / CALISPEC_TLS_CA\\)"):
        CalispecClient("127.0.0.1:1")


def test_a_ca_bundle_without_a_certificate_is_a_value_error(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=f"{not_pem} .*holds no PEM certificate"):
        CalispecClient("127.0.0.1:1", tls_ca=not_pem)


def test_the_async_client_refuses_a_missing_ca_bundle_too(tmp_path: Path) -> None:
    async def construct() -> None:
        AsyncCalispecClient("127.0.0.1:1", tls_ca=tmp_path / "none.pem")

    with pytest.raises(ValueError, match="cannot read the TLS CA bundle"):
        asyncio.run(construct())


@pytest.mark.parametrize("token", ["csk_bad\ntoken", "csk_bad token", "csk_tök", "csk_\x7f", "csk_tab\t"])
def test_a_token_grpc_metadata_cannot_carry_is_a_value_error(token: str) -> None:
    """gRPC failed every call with INTERNAL "Invalid metadata"; the message must not echo the secret."""
    with pytest.raises(ValueError, match="token \\(API key\\) must be printable ASCII") as info:
        CalispecClient("127.0.0.1:1", token=token)
    assert "csk_" not in str(info.value)


def test_a_bad_token_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALISPEC_TOKEN", "csk_key-with-newline\n")
    with pytest.raises(ValueError, match="position 20"):
        ClientAuth.resolve()


def test_a_server_name_with_a_control_character_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="tls_server_name 'coord\\\\ninator' must be printable ASCII"):
        ClientAuth.resolve(tls_server_name="coord\ninator")


def test_usable_credentials_are_accepted() -> None:
    auth = ClientAuth.resolve(token="csk_Ab-_9.~+/=", tls_ca="", tls_server_name="coordinator.calispec.svc")
    assert auth.metadata == (("authorization", "Bearer csk_Ab-_9.~+/="),)
    assert ClientAuth.resolve(token="", tls_ca="", tls_server_name="") == ClientAuth(None, None, "")
