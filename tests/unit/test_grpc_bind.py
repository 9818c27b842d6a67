"""Binding a service's ports: a port already served is an error, never shared (gRPC's default SO_REUSEPORT);
TLS files gRPC cannot use are named as such, not reported as a port in use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from calispec_core.credentials import TlsConfig
from calispec_core.errors import FailedPrecondition
from calispec_core.grpc_server import create_grpc_server
from calispec_tools.certs import DevCerts, make_dev_certs


def test_a_port_already_served_is_refused_not_shared() -> None:
    """With SO_REUSEPORT a second server bound the same port silently and took a share of its connections."""
    first, port, _ = create_grpc_server("127.0.0.1:0", [], [])
    first.start()
    try:
        with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{port}"):
            create_grpc_server(f"127.0.0.1:{port}", [], [])
    finally:
        first.stop(None)


def test_a_health_port_already_served_is_refused() -> None:
    first, port, _ = create_grpc_server("127.0.0.1:0", [], [])
    first.start()
    try:
        with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{port}"):
            create_grpc_server("127.0.0.1:0", [], [], health_port=port)
    finally:
        first.stop(None)


# -- TLS files gRPC cannot use: it reported each as a failed bind ("in use?"); the message names the file ----


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return make_dev_certs(tmp_path_factory.mktemp("certs"))


def _bind(tls: TlsConfig) -> None:
    server, _, _ = create_grpc_server("127.0.0.1:0", [], [], tls=tls)
    server.stop(None)


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pem"
    path.write_text("not PEM at all\n")
    return path


def _encrypted_key(tmp_path: Path, certs: DevCerts) -> Path:
    key = serialization.load_pem_private_key(certs.key("memory").read_bytes(), password=None)
    path = tmp_path / "encrypted-key.pem"
    encryption = serialization.BestAvailableEncryption(b"secret")
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return path


# (cert, key, ca) from the dev certs and a tmp dir; the TlsConfig field whose file the error names; its cause
BAD_FILES = [
    pytest.param(lambda c, t: (c.cert("memory"), c.key("draft"), c.ca), "key", "is not the key of", id="other-key"),
    pytest.param(lambda c, t: (c.cert("memory"), c.ca, c.ca), "key", "not an unencrypted PEM", id="key-is-a-cert"),
    pytest.param(
        lambda c, t: (c.cert("memory"), _encrypted_key(t, c), c.ca), "key", "not an unencrypted", id="encrypted-key"
    ),
    pytest.param(lambda c, t: (_garbage(t), c.key("memory"), c.ca), "cert", "TLS certificate", id="garbage-cert"),
    pytest.param(lambda c, t: (c.cert("memory"), c.key("memory"), _garbage(t)), "ca", "TLS CA bundle", id="garbage-ca"),
    pytest.param(
        lambda c, t: (c.cert("memory"), c.key("memory"), c.key("memory")), "ca", "no valid PEM", id="ca-is-a-key"
    ),
]


@pytest.mark.parametrize(("files", "field", "cause"), BAD_FILES)
def test_unusable_tls_files_are_named_not_reported_as_a_port_in_use(
    certs: DevCerts, tmp_path: Path, files: Callable[[DevCerts, Path], tuple[Path, Path, Path]], field: str, cause: str
) -> None:
    tls = TlsConfig(*files(certs, tmp_path))
    with pytest.raises(FailedPrecondition) as info:
        _bind(tls)
    message = str(info.value)
    assert str(getattr(tls, field)) in message and cause in message
    assert "could not bind" not in message


def test_matching_tls_files_bind(certs: DevCerts) -> None:
    _bind(certs.tls("memory"))
