"""`python -m calispec_tools.bench.vocab_coverage [--pair qwen-coder] [--draft-vocab 32768,65536] [--generate N]`:
how much text a pruned draft output layer can still propose.

A draft whose output layer keeps ids [0, K) plus the special tokens (calispec_core/vocab_pruning.py)
can never propose any other token; wherever the target emits one, that round's draft is rejected.
This counts, per K, the share of tokens inside the kept set over the shipped texts: the prompt sets,
the eval tasks (prompts and reference solutions) and the calibration corpus, tokenised; and with
`--generate N`, the target's own greedy output for the first N prompts of each prompt set (the
tokens SD must actually emit). Only the tokenizer is loaded unless --generate is given.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoConfig

from calispec_core.modeling import ModelRunner, ModelSpec, load_tokenizer
from calispec_core.service_cli import configure_logging
from calispec_core.vocab_pruning import kept_token_ids, special_token_ids
from calispec_tools.bench.prompts import BUILTIN_DIR, builtin_sets, load_jsonl

DATA = BUILTIN_DIR.parent


def shipped_texts() -> dict[str, list[str]]:
    """{source: texts} of the repository's own prompt sets, eval tasks and calibration corpus."""
    texts = {f"prompts/{name}": [p.text for p in load_jsonl(BUILTIN_DIR / f"{name}.jsonl")] for name in builtin_sets()}
    for path in sorted((DATA / "eval").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        texts[f"eval/{path.stem}"] = [eval_text(r) for r in rows]
    corpus = sorted(p for p in (DATA / "calibration" / "corpus").iterdir() if p.is_file())
    texts["calibration corpus"] = [p.read_text(encoding="utf-8") for p in corpus]
    return texts


def eval_text(task: dict[str, object]) -> str:
    """An eval task's prompt (or question) and its reference solution (or answer)."""
    parts = (task.get(key, "") for key in ("prompt", "question", "canonical_solution", "answer"))
    return "\n".join(str(part) for part in parts if part != "")


def coverage(tokens: Iterable[int], kept: torch.Tensor, vocab_rows: int) -> tuple[float, int]:
    """(share of tokens inside the kept set, number of tokens)."""
    ids = torch.tensor(list(tokens), dtype=torch.long)
    inside = torch.zeros(vocab_rows, dtype=torch.bool)
    inside[kept] = True
    return (float(inside[ids].float().mean()) if len(ids) else 1.0), len(ids)


def generated_tokens(target: Path, per_set: int, max_new_tokens: int, chat: bool) -> dict[str, list[int]]:
    """The target's greedy output (up to its first EOS) for the first `per_set` prompts of each shipped set."""
    from calispec_tools.calibrate.generate import continue_greedy
    from calispec_tools.models.registry import QWEN_CHAT

    runner = ModelRunner(ModelSpec(target))
    out: dict[str, list[int]] = {}
    for name in builtin_sets():
        prompts = [p.text for p in load_jsonl(BUILTIN_DIR / f"{name}.jsonl")[:per_set]]
        ids = [runner.tokenizer.encode(QWEN_CHAT.format(prompt=p) if chat else p) for p in prompts]
        tokens: list[int] = []
        for row in continue_greedy(runner, ids, max_new_tokens):
            ends = [i for i, t in enumerate(row) if t in runner.eos_token_ids]
            tokens += row[: ends[0] + 1] if ends else row
        out[f"target greedy output, {name}"] = tokens
        print(f"  generated {name}: {len(tokens)} tokens", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.vocab_coverage", description=__doc__)
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--draft", type=Path, help="draft model dir (default: the pair's)")
    parser.add_argument("--target", type=Path, help="target model dir for --generate (default: the pair's)")
    parser.add_argument("--draft-vocab", default="32768,65536", help="K values, comma-separated")
    parser.add_argument("--generate", type=int, default=0, help="greedy target output for N prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    if args.draft is None or (args.generate and args.target is None):
        from calispec_tools.cli import ensure_pulled_pair

        draft, target = ensure_pulled_pair(args.pair)
        args.draft, args.target = args.draft or draft, args.target or target
    tokenizer = load_tokenizer(args.draft)
    vocab_rows = int(AutoConfig.from_pretrained(str(args.draft), local_files_only=True).vocab_size)
    streams = {name: [t for text in texts for t in tokenizer.encode(text)] for name, texts in shipped_texts().items()}
    if args.generate:
        streams |= generated_tokens(args.target, args.generate, args.max_new_tokens, chat=args.pair != "tiny")
    specials = special_token_ids(tokenizer, [])
    print(f"vocabulary {vocab_rows} rows, regular tokens {tokenizer.vocab_size}, special ids {len(specials)}")
    for k in (int(v) for v in args.draft_vocab.split(",")):
        kept = kept_token_ids(k, vocab_rows, tokenizer.vocab_size, specials)
        print(f"K = {k} ({len(kept)} rows kept, {len(kept) / vocab_rows:.1%} of the layer):")
        for name, tokens in streams.items():
            share, count = coverage(tokens, kept, vocab_rows)
            print(f"  {name:40s} {share:8.4%} of {count} tokens inside")
        everything = [t for tokens in streams.values() for t in tokens]
        share, count = coverage(everything, kept, vocab_rows)
        print(f"  {'all':40s} {share:8.4%} of {count} tokens inside", flush=True)


if __name__ == "__main__":
    main()
