"""`calispec certs dev DIR`: a local CA and one certificate per service, for development and tests.

Each service's certificate names its role (CN and DNS SAN: coordinator, draft, target, memory),
which peers check whatever address they dial, plus localhost/127.0.0.1/::1 and the Kubernetes
Service names (`<role>`, `<role>.<namespace>`, `<role>.<namespace>.svc`,
`<role>.<namespace>.svc.cluster.local`). It is valid for both server and client authentication:
one identity per service, served and presented on its outbound calls (mutual TLS).
A `client` certificate is made for operator tools that talk to internal services.
Production deployments should use their own CA (e.g. cert-manager); see docs/security.md.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from calispec_core.credentials import COORDINATOR, DRAFT, MEMORY, TARGET, TlsConfig

ROLES = (COORDINATOR, DRAFT, TARGET, MEMORY, "client")
EXTRA_NAMES = {TARGET: ("target-pods",)}  # the headless Service the coordinator resolves
VALID_DAYS = 365
LOOPBACK_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class DevCerts:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def cert(self, role: str) -> Path:
        return self.directory / f"{role}.pem"

    def key(self, role: str) -> Path:
        return self.directory / f"{role}-key.pem"

    def tls(self, role: str) -> TlsConfig:
        """The TlsConfig of a service (or of the `client` tools) using these files."""
        return TlsConfig(cert=self.cert(role), key=self.key(role), ca=self.ca)


def make_dev_certs(directory: Path, namespace: str = "calispec") -> DevCerts:
    """Write ca.pem (+ ca-key.pem) and <role>.pem / <role>-key.pem for every role; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    out = DevCerts(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key)
    _write_key(directory / "ca-key.pem", ca_key)
    out.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(role, _dns_names(role, namespace), key, ca_key, ca_cert)
        _write_key(out.key(role), key)
        out.cert(role).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return out


def _dns_names(role: str, namespace: str) -> list[str]:
    names = [role, *EXTRA_NAMES.get(role, ())]
    cluster = [f"{n}.{namespace}{suffix}" for n in names for suffix in ("", ".svc", ".svc.cluster.local")]
    return [*names, *cluster, "localhost"]


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=VALID_DAYS)
    )


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "calispec dev CA")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital_signature, key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return _validity(builder).sign(key, hashes.SHA256())


def _leaf_certificate(
    role: str,
    dns_names: list[str],
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
) -> x509.Certificate:
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOOPBACK_IPS]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    return _validity(builder).sign(ca_key, hashes.SHA256())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Private keys readable by their owner only."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
