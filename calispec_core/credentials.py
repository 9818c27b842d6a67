"""Credentials of a process, read here and only here.

The correction memory accepts writes only from verifiers: they hold a *writer token* (a file
only the deployment hands to target replicas and the memory service) and send it as gRPC
metadata; clients of the coordinator never see it. The memory service's file may name one
identity per token (`read_writer_tokens`); its rate limits are keyed on that identity, and a line
may confine its token to the namespaces it names (`read_writer_scopes`).
Services take `--writer-token-file PATH`; the file, not the command line, holds the secret
so that it does not show up in `ps`.
"""

from __future__ import annotations

import datetime
import hmac
import importlib.util
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calispec._channel import is_loopback_host
from calispec_core.errors import FailedPrecondition

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

# gRPC metadata keys must be lowercase.
WRITER_TOKEN_METADATA = "x-calispec-writer-token"
WRITER_ID_METADATA = "x-calispec-writer-id"
MIN_TOKEN_CHARS = 16  # shorter tokens are guessable; refuse them at startup rather than in production


def read_writer_token(path: Path | str | None) -> str | None:
    """The token in `path` (surrounding whitespace stripped); None when no path is given."""
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise FailedPrecondition(f"cannot read writer token file {path}: {exc.strerror}") from exc
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise FailedPrecondition(
            f"writer token file {path} must hold one token of >= {MIN_TOKEN_CHARS} non-space characters"
        )
    return token


DEFAULT_WRITER_IDENTITY = "writer"  # the identity of a one-token file (every holder shares it)
_IDENTITY_PATTERN = re.compile(r"[A-Za-z0-9._@:/-]{1,64}")
# a namespace's characters (memory_service/store.py) and fnmatch's: a `#` comment after a token is refused
_SCOPE_PATTERN = re.compile(r"[A-Za-z0-9._:/+*?\[\]!-]{1,256}")


def _writer_rows(path: Path | str) -> list[list[str]]:
    """The token file's rows, [identity, token, *namespace patterns], checked (FailedPrecondition)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FailedPrecondition(f"cannot read writer token file {path}: {exc.strerror}") from exc
    rows = [line.split() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if len(rows) == 1 and len(rows[0]) == 1:
        rows = [[DEFAULT_WRITER_IDENTITY, rows[0][0]]]
    if not rows or not all(_valid_writer_row(r) for r in rows):
        raise FailedPrecondition(
            f"writer token file {path} must hold one token, or lines of IDENTITY TOKEN [NAMESPACE ...] "
            f"(identity: 1-64 of [A-Za-z0-9._@:/-]; token: >= {MIN_TOKEN_CHARS} non-space characters, none of "
            "*?[; namespaces: the ones it may write, fnmatch patterns of [A-Za-z0-9._:/+-*?[]!]; comments: whole "
            "lines starting with #)"
        )
    if len({r[0] for r in rows}) != len(rows) or len({r[1] for r in rows}) != len(rows):
        raise FailedPrecondition(f"writer token file {path} repeats an identity or a token")
    return rows


def _valid_writer_row(row: list[str]) -> bool:
    """A token with a wildcard is a namespace pattern written where the token belongs (`TOKEN pair/*` for
    a one-writer file would make the secret the identity and the pattern the token)."""
    identity, token, *scopes = row if len(row) >= 2 else (row[0], "")
    return (
        _IDENTITY_PATTERN.fullmatch(identity) is not None
        and len(token) >= MIN_TOKEN_CHARS
        and not any(c in token for c in "*?[")
        and all(_SCOPE_PATTERN.fullmatch(scope) for scope in scopes)
    )


def read_writer_file(path: Path | str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """The file's tokens and scopes (`read_writer_tokens`, `read_writer_scopes`) from one read of it."""
    rows = _writer_rows(path)
    return tuple((r[0], r[1]) for r in rows), tuple((r[0], tuple(r[2:])) for r in rows if len(r) > 2)


def read_writer_tokens(path: Path | str) -> tuple[tuple[str, str], ...]:
    """(identity, token) pairs of the memory service's writer tokens file.

    Either one bare token (identity `DEFAULT_WRITER_IDENTITY`, shared by every verifier holding
    it) or one `IDENTITY TOKEN [NAMESPACE ...]` line per writer (blank lines and `#` comments
    ignored), so that each verifier has its own rate limit and a leaked token can be revoked alone.
    """
    return read_writer_file(path)[0]


def read_writer_scopes(path: Path | str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(identity, namespace patterns) of the writers whose line names the namespaces they may write
    (fnmatch patterns: `pair/draft-537d3c1b+*`); a writer not listed here may write every namespace."""
    return read_writer_file(path)[1]


def write_new_token(path: Path) -> str:
    """Create a random token file readable by its owner only (what the local stack does per run)."""
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(token + "\n", encoding="utf-8")
    return token


def writer_metadata(token: str | None, writer_id: str | None = None) -> tuple[tuple[str, str], ...]:
    """Metadata a verifier attaches to RecordEvents."""
    pairs: list[tuple[str, str]] = []
    if token is not None:
        pairs.append((WRITER_TOKEN_METADATA, token))
    if writer_id:
        pairs.append((WRITER_ID_METADATA, writer_id))
    return tuple(pairs)


def token_matches(expected: str, presented: str | None) -> bool:
    """Constant-time comparison, so response timing does not leak the token."""
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


# -- transport security ------------------------------------------------------------------------
#
# Every service has one identity: a certificate whose CN (and a DNS SAN) is its role name. It
# serves that certificate and presents it on its outbound calls (mutual TLS), and peers check the
# role name whatever address they dial (pod IPs, Ray node IPs): `grpc.ssl_target_name_override`.

COORDINATOR, DRAFT, TARGET, MEMORY = "coordinator", "draft", "target", "memory"


@dataclass(frozen=True)
class TlsConfig:
    """PEM files of one process. No cert: plaintext, allowed on a loopback bind or with `plaintext`."""

    cert: Path | None = None  # this process's certificate (served, and presented on outbound calls)
    key: Path | None = None
    ca: Path | None = None  # the CA bundle that signs its peers' certificates
    plaintext: bool = False  # explicit opt-in to plaintext on a non-loopback bind (e.g. a mesh does TLS)

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    def check(self, host: str) -> None:
        """Refuse half-given files, and plaintext on a non-loopback bind unless asked for explicitly."""
        given = [f is not None for f in (self.cert, self.key, self.ca)]
        if any(given) and not all(given):
            raise FailedPrecondition("TLS needs all three of --tls-cert, --tls-key and --tls-ca")
        if self.enabled and self.plaintext:
            raise FailedPrecondition("--plaintext contradicts --tls-cert: give one or the other")
        if not self.enabled and not self.plaintext and not is_loopback(host):
            raise FailedPrecondition(
                f"refusing to serve plaintext on {host}: give --tls-cert/--tls-key/--tls-ca "
                "(`calispec certs dev DIR` makes a local set), bind 127.0.0.1, or pass --plaintext"
            )

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(cert, key, ca) PEM bytes; read once when a server or channel is built."""
        assert self.cert is not None and self.key is not None and self.ca is not None
        return _read_pem(self.cert), _read_pem(self.key), _read_pem(self.ca)

    def read_checked(self, usage: str = "serverAuth") -> tuple[bytes, bytes, bytes]:
        """`read`, with the files checked first for a certificate used for `usage` ("serverAuth": served;
        "clientAuth": presented on calls): gRPC reports any fault in them as a failed bind, or (a certificate out
        of date or not for this use) as a handshake its peer refuses, logged by the peer only. Checked where
        `cryptography` (the serve extra) is installed: the light client install only reads them."""
        cert, key, ca = self.read()
        if importlib.util.find_spec("cryptography") is not None:
            check_pem(cert, key, ca, self, usage)
        return cert, key, ca


def is_loopback(host: str) -> bool:
    """A host (brackets allowed) of this machine's loopback: the SDK's rule, which channels dial directly too."""
    return is_loopback_host(host.strip("[]"))


def _read_pem(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise FailedPrecondition(f"cannot read {path}: {exc.strerror}") from exc


# cryptography (the serve extra) is imported in these functions: only a server checks its files, and the
# light client install, which imports this module, lacks the package.


def check_pem(cert: bytes, key: bytes, ca: bytes, tls: TlsConfig, usage: str = "serverAuth") -> None:
    """FailedPrecondition naming the file unless `cert` starts with a certificate whose public key is that of
    the private key `key` (unencrypted), valid now and for `usage` (an extended key usage: "serverAuth" or
    "clientAuth"), and `ca` holds certificates."""
    from cryptography.hazmat.primitives import serialization

    leaf = _certificates(cert, f"TLS certificate {tls.cert}")[0]
    _certificates(ca, f"TLS CA bundle {tls.ca}")
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if _private_key(key, tls.key).public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise FailedPrecondition(f"TLS key {tls.key} is not the key of the certificate in {tls.cert}")
    _check_validity(leaf, tls.cert)
    _check_usage(leaf, tls.cert, usage)


def _check_validity(leaf: x509.Certificate, path: Path | None) -> None:
    now = datetime.datetime.now(datetime.UTC)
    if now > leaf.not_valid_after_utc:
        raise FailedPrecondition(f"TLS certificate {path} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if now < leaf.not_valid_before_utc:
        raise FailedPrecondition(
            f"TLS certificate {path} is not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )


def _check_usage(leaf: x509.Certificate, path: Path | None, usage: str) -> None:
    """A certificate that lists extended key usages must list `usage` (one without the extension is for any)."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    oid = {"serverAuth": ExtendedKeyUsageOID.SERVER_AUTH, "clientAuth": ExtendedKeyUsageOID.CLIENT_AUTH}[usage]
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    if oid not in usages:
        role = "serves it" if usage == "serverAuth" else "presents it on its calls to other services"
        raise FailedPrecondition(
            f"TLS certificate {path} lacks the {usage} extended key usage: this process {role} (docs/security.md)"
        )


def _certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:  # none in the file, or a damaged one
        raise FailedPrecondition(f"{what} holds no valid PEM certificate: {exc}") from exc


def _private_key(pem: bytes, path: Path | None) -> PrivateKeyTypes:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # TypeError: an encrypted key
        raise FailedPrecondition(f"TLS key {path} is not an unencrypted PEM private key: {exc}") from exc
