"""The correction-memory export file: versioned JSON, validated as a whole before anything is written.

    {"format": "calispec-correction-memory", "format_version": 1, "namespace": "...",
     "version": 42, "exported_at": "2026-...Z", "pairs": [[draft, target, count], ...],
     "sha256": "<hex of the canonical JSON of pairs>", "vocab_size": 151936}

`vocab_size` (optional; 0 or absent: the namespace had none declared) is declared again on
import, and every id must be below it. The sha256 detects corruption, not tampering: anyone
who can edit the file can recompute it.

Domain code (no gRPC). `load_export` raises `MemoryFileError` with a message that says what is
wrong; callers write nothing unless it returns.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calispec_core.errors import InvalidArgument

FORMAT = "calispec-correction-memory"
FORMAT_VERSION = 1
MAX_TOKEN_ID = 2**32 - 1
MAX_VOCAB_SIZE = 2**32 - 1  # RecordEvents carries it as a uint32
MAX_COUNT = 2**40  # the memory service's per-event cap
MAX_EXPORT_BYTES = 64 * 2**20  # a table's 1,000,000 pairs (the service's bound) at ~40 bytes each, and room

Pair = tuple[int, int, int]


class MemoryFileError(InvalidArgument):
    """The file is not a valid export for this namespace; nothing was changed."""


@dataclass(frozen=True)
class Export:
    pairs: list[Pair]
    vocab_size: int  # 0: none declared


def _checksum(pairs: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()


def dump_export(
    path: Path, namespace: str, version: int, pairs: list[Pair], vocab_size: int = 0, exported_at: str | None = None
) -> None:
    """Write an export; `exported_at` None: now (a reproducible file passes "")."""
    rows = [[d, t, c] for d, t, c in sorted(pairs)]
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "namespace": namespace,
        "version": version,
        "exported_at": now if exported_at is None else exported_at,
        "pairs": rows,
        "sha256": _checksum(rows),
        "vocab_size": vocab_size,
    }
    if problem := export_target_problem(path):
        raise MemoryFileError(f"cannot write {path}: {problem}")
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)  # a stale one, or a link planted there: made anew ("x"), never followed
        with tmp.open("x", encoding="utf-8") as file:
            file.write(json.dumps(document, separators=(",", ":")) + "\n")
        tmp.replace(path)  # a reader never sees a half-written export
    except OSError as exc:
        with contextlib.suppress(OSError):  # its folder may be a file: nothing was made
            tmp.unlink(missing_ok=True)
        raise MemoryFileError(f"cannot write {path}: {exc.strerror}") from exc


def export_target_problem(path: Path) -> str | None:
    """Why an export cannot be written at `path`, or None. It replaces a regular file whole (a temporary file
    renamed over it), so anything else there is refused: as root, `--out /dev/null` replaced the system's /dev/null
    with a file (found by probing). A symlink is refused too: written through, another user's link in /tmp would
    point root's export at any file; renamed over, the link would be lost without a word."""
    if path.name in ("", ".", ".."):
        return "not a file name"
    if path.is_symlink():
        return "it is a symlink (give the path of the file itself)"
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file (a device, a FIFO, a socket)"
        return f"it is {kind}"
    return None


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, or MemoryFileError past `limit` (read up to it: /dev/zero, a FIFO, say nothing of their
    size; `memory import --file /dev/zero` grew to 20 GB until the kernel killed it)."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise MemoryFileError(f"{path} is larger than an export can be ({limit:,} bytes)")
    return data


def load_export(path: Path, namespace: str) -> Export:
    """The pairs (and vocabulary) of a valid export of `namespace`, or MemoryFileError."""
    try:
        data = read_bounded(path, MAX_EXPORT_BYTES)
    except OSError as exc:
        raise MemoryFileError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        document: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        # ValueError: an integer past Python's digit limit; RecursionError: nesting past the parser's depth
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise MemoryFileError(f"{path} is not a Calispec memory export (not JSON we can read: {reason})") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise MemoryFileError(f"{path} is not a Calispec memory export (format is not {FORMAT!r})")
    if document.get("format_version") != FORMAT_VERSION:
        raise MemoryFileError(
            f"{path} has format version {document.get('format_version')!r}; this calispec reads {FORMAT_VERSION}"
        )
    if document.get("namespace") != namespace:
        raise MemoryFileError(
            f"{path} holds namespace {document.get('namespace')!r}, not {namespace!r}: its token ids belong to "
            "another model pair"
        )
    rows = document.get("pairs")
    if not isinstance(rows, list) or document.get("sha256") != _checksum(rows):
        raise MemoryFileError(f"{path} is corrupted: its pairs do not match its sha256")
    vocab_size = document.get("vocab_size", 0)
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or not 0 <= vocab_size <= MAX_VOCAB_SIZE:
        raise MemoryFileError(f"{path}: vocab_size must be an integer in [0, 2**32 - 1], got {vocab_size!r}")
    pairs = [_pair(i, row) for i, row in enumerate(rows)]
    outside = next((p for p in pairs if vocab_size and max(p[0], p[1]) >= vocab_size), None)
    if outside is not None:
        raise MemoryFileError(f"{path}: pair {list(outside)} has a token id outside its vocabulary of {vocab_size}")
    return Export(pairs, vocab_size)


def _pair(i: int, row: object) -> Pair:
    ok = (
        isinstance(row, list)
        and len(row) == 3
        and all(isinstance(x, int) and not isinstance(x, bool) for x in row)
        and 0 <= row[0] <= MAX_TOKEN_ID
        and 0 <= row[1] <= MAX_TOKEN_ID
        and 1 <= row[2] <= MAX_COUNT
    )
    if not ok:
        if isinstance(row, list) and len(row) == 3 and isinstance(row[2], int) and row[2] > MAX_COUNT:
            # a table's count may pass 2**40 (writes add up); one import writes at most that much a pair
            raise MemoryFileError(f"pairs[{i}]: a count of {row[2]} is more than an import writes a pair (2**40)")
        raise MemoryFileError(f"pairs[{i}] must be [draft id, target id, count >= 1], got {row!r}")
    assert isinstance(row, list)
    if row[0] == row[1]:
        raise MemoryFileError(f"pairs[{i}] pairs token {row[0]} with itself: no rejection makes such a pair")
    return row[0], row[1], row[2]
