"""Prompt sets: JSONL files, one {"prompt": str, "max_new_tokens": int (optional)} object per line.

Built-in sets live in calispec_tools/data/prompts/ (code, math, prose), written for this project.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from calispec_core.errors import InvalidArgument
from calispec_core.limits import MAX_NEW_TOKENS, validate_prompt

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "data" / "prompts"


@dataclass(frozen=True)
class Prompt:
    text: str
    max_new_tokens: int | None = None  # None: the run's --max-new-tokens
    source: str = ""


def builtin_sets() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.jsonl"))


def load_jsonl(path: Path, source: str | None = None) -> list[Prompt]:
    prompts: list[Prompt] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise ValueError(f'{path}:{number}: expected {{"prompt": "<non-empty text>", ...}}')
        try:  # what the coordinator refuses, refused before the run: each request failed alone (found by probing)
            validate_prompt(obj["prompt"])
        except InvalidArgument as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        limit = obj.get("max_new_tokens")
        if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_NEW_TOKENS):  # not a bool
            raise ValueError(f"{path}:{number}: max_new_tokens must be an integer in [1, {MAX_NEW_TOKENS}]")
        prompts.append(Prompt(obj["prompt"], limit, source or path.stem))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def load_prompts(spec: str) -> list[Prompt]:
    """`spec` is comma-separated: built-in set names (code, math, prose) and/or JSONL paths."""
    prompts: list[Prompt] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        builtin = BUILTIN_DIR / f"{part}.jsonl"
        if part in builtin_sets():
            prompts += load_jsonl(builtin, part)
        elif Path(part).is_file():
            prompts += load_jsonl(Path(part))
        else:
            raise ValueError(f"{part!r} is neither a built-in prompt set ({', '.join(builtin_sets())}) nor a file")
    if not prompts:
        raise ValueError("no prompts given")
    return prompts
