"""Credentials of a process, read here and only here.

The correction memory accepts writes only from verifiers: they hold a shared *writer token*
(a file only the deployment hands to target replicas and the memory service) and send it as
gRPC metadata; clients of the coordinator never see it. Services take `--writer-token-file
PATH`; the file, not the command line, holds the secret so that it does not show up in `ps`.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from calispec_core.errors import FailedPrecondition

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
