"""A service's certificate out of date, or without the extended key usage its use needs, is refused when its files
are read, naming the file: gRPC took it, and the peer alone logged why each handshake failed (a coordinator with an
expired certificate, or one for serverAuth only, said "no service at 127.0.0.1:... after 10.0s"; found by probing).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from calispec_core.credentials import TlsConfig
from calispec_core.errors import FailedPrecondition
from calispec_core.grpc_server import make_channel
from calispec_tools.certs import DevCerts, make_dev_certs

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return make_dev_certs(tmp_path_factory.mktemp("certs"))


def issue(
    certs: DevCerts,
    directory: Path,
    valid: tuple[datetime.datetime, datetime.datetime] = (NOW - DAY, NOW + DAY),
    usages: list[x509.ObjectIdentifier] | None = None,
) -> TlsConfig:
    """A `coordinator` certificate signed by the dev CA, valid from/to `valid`, with `usages` (None: no extension)."""
    ca_key = serialization.load_pem_private_key((certs.ca.parent / "ca-key.pem").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coordinator")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
    )
    if usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    (directory / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pkcs8 = serialization.PrivateFormat.PKCS8
    (directory / "k.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())
    )
    return TlsConfig(directory / "c.pem", directory / "k.pem", certs.ca)


def test_an_expired_certificate_is_refused_naming_its_file_and_date(certs: DevCerts, tmp_path: Path) -> None:
    tls = issue(certs, tmp_path, valid=(NOW - 3 * DAY, NOW - DAY))
    with pytest.raises(FailedPrecondition, match=f"TLS certificate {tmp_path / 'c.pem'} expired on 20"):
        tls.read_checked()


def test_a_certificate_not_valid_yet_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    tls = issue(certs, tmp_path, valid=(NOW + DAY, NOW + 3 * DAY))
    with pytest.raises(FailedPrecondition, match="is not valid before"):
        tls.read_checked()


def test_a_certificate_for_serving_only_is_refused_for_calls(certs: DevCerts, tmp_path: Path) -> None:
    """What the coordinator presents to the draft and the target: `make_channel` refuses it at once."""
    tls = issue(certs, tmp_path, usages=[ExtendedKeyUsageOID.SERVER_AUTH])
    tls.read_checked("serverAuth")  # fine to serve
    with pytest.raises(FailedPrecondition, match="lacks the clientAuth extended key usage: this process presents"):
        make_channel("127.0.0.1:1", tls, server_name="draft")


def test_a_certificate_for_calls_only_is_refused_for_serving(certs: DevCerts, tmp_path: Path) -> None:
    tls = issue(certs, tmp_path, usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
    with pytest.raises(FailedPrecondition, match="lacks the serverAuth extended key usage: this process serves it"):
        tls.read_checked()


def test_a_certificate_without_extended_key_usages_is_for_any_use(certs: DevCerts, tmp_path: Path) -> None:
    tls = issue(certs, tmp_path, usages=None)
    tls.read_checked("serverAuth")
    make_channel("127.0.0.1:1", tls, server_name="draft").close()
    make_channel("127.0.0.1:1", certs.tls("coordinator"), server_name="draft").close()  # the dev certificates
