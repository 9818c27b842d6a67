"""TLS files sent to Ray actors as text: an actor's node may not have the driver's files.

The actor writes them to a private directory (0700, files 0600) for as long as it needs them: a gRPC server or
channel reads them once, when it is made."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from calispec_core.credentials import TlsConfig

PARTS = ("cert", "key", "ca")


def pem_texts(tls: TlsConfig | None) -> dict[str, str] | None:
    """{"cert", "key", "ca": PEM text} of the files `tls` names; None for plaintext."""
    if tls is None or not tls.enabled:
        return None
    return dict(zip(PARTS, (pem.decode() for pem in tls.read()), strict=True))


def write_pems(directory: Path, pems: dict[str, str]) -> dict[str, Path]:
    """{"cert", "key", "ca": file}: the PEMs written to `directory`, readable by their owner only."""
    paths = {}
    for part in PARTS:
        path = paths[part] = directory / f"tls-{part}.pem"
        path.touch(mode=0o600)
        path.write_text(pems[part], encoding="utf-8")
    return paths


@contextmanager
def pem_files(pems: dict[str, str] | None) -> Iterator[TlsConfig | None]:
    """TLS settings naming `pems` written to a private directory, removed when the block ends; None: plaintext."""
    if pems is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="calispec-pems-") as directory:
        yield TlsConfig(**write_pems(Path(directory), pems))
