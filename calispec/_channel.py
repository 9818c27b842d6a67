"""Client-side channels and credentials of the SDK (grpcio only: no serving code).

A client reaches the coordinator over TLS when it is given a CA bundle (`tls_ca`, or the
CALISPEC_TLS_CA environment variable), else plaintext; it presents an API key (`token`, or
CALISPEC_TOKEN) as `authorization: Bearer <key>` metadata on every call.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "CALISPEC_TOKEN"
TLS_CA_ENV = "CALISPEC_TLS_CA"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_reconnect_backoff_ms", 2000),  # find a restarted coordinator within ~2 s (gRPC default: up to 120 s)
]
# gRPC dials through an HTTP proxy named by grpc_proxy, https_proxy or http_proxy for any address no_proxy does not
# list, loopback included: with such a variable set (as on many CI runners and corporate hosts) no client reached a
# service on this host, and `calispec up`'s services never reached each other (found by probing). A proxy cannot
# reach this host's loopback: those addresses are dialled directly; others follow the environment as gRPC does.
_NO_PROXY = ("grpc.enable_http_proxy", 0)
# gRPC refuses metadata values outside printable ASCII (0x20-0x7E) with an opaque INTERNAL "Invalid metadata";
# a space cannot be part of a bearer token (the server strips it) or of a certificate's name either.
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class ClientAuth:
    token: str | None = None  # API key
    tls_ca: Path | None = None  # CA bundle that signs the coordinator's certificate; None: plaintext
    tls_server_name: str | None = None  # name the certificate must carry (default: the address's host)

    def __post_init__(self) -> None:
        _check_visible("token (API key)", self.token, secret=True)
        _check_visible("tls_server_name", self.tls_server_name)

    @classmethod
    def resolve(
        cls, token: str | None = None, tls_ca: str | Path | None = None, tls_server_name: str | None = None
    ) -> ClientAuth:
        """Explicit arguments win, "" included (no key, plaintext); None falls back to CALISPEC_TOKEN /
        CALISPEC_TLS_CA from the environment."""
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        ca = tls_ca if tls_ca is not None else os.environ.get(TLS_CA_ENV)
        return cls(token or None, Path(ca) if ca else None, tls_server_name)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _secure(self) -> tuple[grpc.ChannelCredentials, list[tuple[str, Any]]] | None:
        if self.tls_ca is None:
            return None
        credentials = grpc.ssl_channel_credentials(root_certificates=read_ca_bundle(self.tls_ca))
        options = (
            [*_OPTIONS, ("grpc.ssl_target_name_override", self.tls_server_name)] if self.tls_server_name else _OPTIONS
        )
        return credentials, options

    def channel(self, address: str) -> grpc.Channel:
        secure = self._secure()
        if secure is None:
            return grpc.insecure_channel(address, options=channel_options(address, _OPTIONS))
        return grpc.secure_channel(address, secure[0], options=channel_options(address, secure[1]))

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        secure = self._secure()
        if secure is None:
            return grpc.aio.insecure_channel(address, options=channel_options(address, _OPTIONS))
        return grpc.aio.secure_channel(address, secure[0], options=channel_options(address, secure[1]))


def channel_options(address: str, options: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`options`, and for a loopback address no HTTP proxy (_NO_PROXY above)."""
    return [*options, _NO_PROXY] if is_loopback(address) else options


def is_loopback(address: str) -> bool:
    """Whether a gRPC target (HOST:PORT, [V6]:PORT, ipv4:/ipv6:/dns: forms) names this host's loopback."""
    host = address.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:").rpartition(":")[0]
    return is_loopback_host(host.removeprefix("[").removesuffix("]"))


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback IP address (no brackets)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_visible(what: str, value: str | None, secret: bool = False) -> None:
    """ValueError unless `value` is printable ASCII without spaces (None or "": not given); a secret is not echoed."""
    if not value or _VISIBLE_ASCII.fullmatch(value):
        return
    index = next(i for i, c in enumerate(value) if not _VISIBLE_ASCII.fullmatch(c))
    shown = "" if secret else f" {value!r}"
    raise ValueError(
        f"{what}{shown} must be printable ASCII without spaces or control characters: "
        f"it has {value[index]!r} at position {index}"
    )


def read_ca_bundle(path: Path) -> bytes:
    """The CA bundle's PEM bytes; ValueError naming the path when it cannot be read or holds no certificate
    (gRPC would only fail each call's handshake, or the read would escape as a bare FileNotFoundError)."""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise ValueError(
            f"cannot read the TLS CA bundle {path} (tls_ca / {TLS_CA_ENV}): {exc.strerror or exc}"
        ) from exc
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(f"the TLS CA bundle {path} (tls_ca / {TLS_CA_ENV}) holds no PEM certificate")
    return pem
