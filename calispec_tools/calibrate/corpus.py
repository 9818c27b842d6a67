"""Calibration corpora: documents to teacher-force, prompts for the target to continue.

A corpus is a file or a directory (every *.jsonl, *.txt, *.md, *.py under it, sorted):
- `.jsonl`: one object per line, {"text": "..."} (a document) or {"prompt": "..."} (a prompt;
  `--generate` lets the target continue it, otherwise it is read as a document);
- any other file: the whole file is one document.
Long documents are cut into windows of at most `max_tokens` tokens (consecutive windows share
one token, so every position is predicted once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from calispec_core.errors import InvalidArgument
from calispec_core.limits import require_unicode

TEXT_SUFFIXES = (".txt", ".md", ".py")


@dataclass(frozen=True)
class Document:
    text: str
    is_prompt: bool  # the target may continue it (--generate)
    source: str


def load_corpus(path: Path) -> list[Document]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".jsonl", *TEXT_SUFFIXES))
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"corpus {path} is neither a file nor a directory")
    docs = [d for f in files for d in _read(f)]
    if not docs:
        raise ValueError(f"corpus {path} holds no documents")
    return docs


def _read(path: Path) -> list[Document]:
    """A file's documents; ValueError naming the file (and line) for anything it cannot use: every refusal is one
    line (non-UTF-8 bytes did not name the file; a deeply nested line or a lone surrogate was a traceback)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix != ".jsonl":
        return [Document(text, False, str(path))] if text.strip() else []
    return [_line_document(line, f"{path}:{n}") for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _line_document(line: str, source: str) -> Document:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # not JSON, nested past the parser's depth, an int past its digits
        raise ValueError(f"{source}: not JSON: {exc}") from None
    value = obj.get("text", obj.get("prompt")) if isinstance(obj, dict) else None
    if not isinstance(value, str):
        raise ValueError(f'{source}: expected {{"text": "..."}} or {{"prompt": "..."}}')
    if not value.strip():
        raise ValueError(f"{source}: the text is empty (or only whitespace)")
    try:
        require_unicode(value, source)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    return Document(value, "text" not in obj, source)


def windows(ids: list[int], max_tokens: int) -> list[list[int]]:
    """Cut a token list into windows of <= max_tokens; consecutive windows overlap by one token."""
    if len(ids) <= max_tokens:
        return [ids] if len(ids) >= 2 else []
    step = max_tokens - 1
    return [ids[i : i + max_tokens] for i in range(0, len(ids) - 1, step)]


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """As the coordinator tokenizes a prompt."""
    return list(tokenizer.encode(text))
