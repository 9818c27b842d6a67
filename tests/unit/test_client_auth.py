"""The SDK's credentials: explicit arguments, "" included, win over the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from calispec._channel import ClientAuth


def test_an_empty_credential_means_none_whatever_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALISPEC_TOKEN", "env-key")
    monkeypatch.setenv("CALISPEC_TLS_CA", "/env/ca.pem")
    assert ClientAuth.resolve() == ClientAuth("env-key", Path("/env/ca.pem"))  # None: the environment's
    assert ClientAuth.resolve(token="", tls_ca="") == ClientAuth(None, None)  # "": none (plaintext, no key)
    assert ClientAuth.resolve(token="k", tls_ca="/my/ca.pem") == ClientAuth("k", Path("/my/ca.pem"))
