"""Correction-memory namespaces: one per model pair, so a verifier never reads another pair's table.

A pair's counts are only meaningful for the same draft model, target model and token ids, so
the namespace is derived from all three:

    pair/<draft id>+<target id>/<tokenizer fingerprint>

A model id is its directory name plus a short hash of its config.json (two checkpoints that
share a name do not share a table) without the fields that name the program that wrote the file
rather than the model (`transformers_version`, ...): `calispec models pull` writes config.json with
the installed transformers, and a patch release (5.24.0 -> 5.25.0) moved every pair's namespace, so a
fresh machine refused the shipped calibration as another pair's. The tokenizer fingerprint hashes the
tokenizer files. The local stack and a Ray deployment (`memory_namespace: auto`) derive the target's
`--memory-namespace` this way; a deployment passes the same string to every replica of the pair (and
to `calispec calibrate` / `memory export|import`).
"""

from __future__ import annotations

import hashlib
import json
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
# config.json fields about who wrote the file, not what the model computes
WRITER_FIELDS = frozenset({"transformers_version", "_name_or_path", "_model_name_or_path", "_commit_hash"})
RENAMED = {"torch_dtype": "dtype"}  # transformers 5 writes the same field under its new name


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def config_digest(config: Path) -> str:
    """sha256 of config.json's model fields, canonically serialised (key order and spacing do not count
    either); a file that is not a JSON object is hashed as it is."""
    raw = config.read_bytes()
    try:
        fields = json.loads(raw)
    except ValueError:
        fields = None
    if isinstance(fields, dict):
        model = {RENAMED.get(k, k): v for k, v in fields.items() if k not in WRITER_FIELDS}
        raw = json.dumps(model, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()


def model_id(model_dir: Path) -> str:
    """`<dir name>-<8 hex of config.json's model fields>`, restricted to namespace-safe characters."""
    name = _UNSAFE.sub("-", model_dir.resolve().name).strip("-")[:MAX_NAME_CHARS] or "model"
    config = model_dir / "config.json"
    return f"{name}-{config_digest(config)[:8]}" if config.exists() else name


def tokenizer_fingerprint(model_dir: Path) -> str:
    """16 hex of the tokenizer files' hash; equal fingerprints mean the same token ids."""
    files = [model_dir / n for n in TOKENIZER_FILES if (model_dir / n).exists()]
    return _digest(files)[:16] if files else "no-tokenizer"


def pair_namespace(draft_dir: Path, target_dir: Path) -> str:
    return f"pair/{model_id(draft_dir)}+{model_id(target_dir)}/{tokenizer_fingerprint(target_dir)}"
