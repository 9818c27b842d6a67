"""Correction-memory namespaces: one per model pair, so a verifier never reads another pair's table.

A pair's counts are only meaningful for the same draft model, target model and token ids, so
the namespace is derived from all three:

    pair/<draft id>+<target id>/<tokenizer fingerprint>

A model id is its directory name plus a short hash of its config.json (two checkpoints that
share a name do not share a table); the tokenizer fingerprint hashes the tokenizer files. The
local stack derives the target's `--memory-namespace` this way; a deployment passes the same
string to every replica of the pair (and to `calispec calibrate` / `memory export|import`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "special_tokens_map.json",
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_NAME_CHARS = 40  # two ids + fingerprint + separators stay under the 128-character namespace limit


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def model_id(model_dir: Path) -> str:
    """`<dir name>-<8 hex of config.json>`, restricted to namespace-safe characters."""
    name = _UNSAFE.sub("-", model_dir.resolve().name).strip("-")[:MAX_NAME_CHARS] or "model"
    config = model_dir / "config.json"
    return f"{name}-{_digest([config])[:8]}" if config.exists() else name


def tokenizer_fingerprint(model_dir: Path) -> str:
    """16 hex of the tokenizer files' hash; equal fingerprints mean the same token ids."""
    files = [model_dir / n for n in TOKENIZER_FILES if (model_dir / n).exists()]
    return _digest(files)[:16] if files else "no-tokenizer"


def pair_namespace(draft_dir: Path, target_dir: Path) -> str:
    return f"pair/{model_id(draft_dir)}+{model_id(target_dir)}/{tokenizer_fingerprint(target_dir)}"
