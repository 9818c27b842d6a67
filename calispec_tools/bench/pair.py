"""Benchmark a real draft/target pair through the full stack: `python -m calispec_tools.bench.pair`.

One run measures, on built-in coding / math / prose prompts (greedy, one request at a time):

- target-alone tokens/s: `ar` requests through the four services;
- draft-alone tokens/s: a KV-cached greedy loop on the draft in this process (the stack has
  no draft-only mode; the services are idle meanwhile);
- `sd` and `csd` acceptance, rescues and tokens/s, and their speed-up over `ar`;
- greedy `sd` vs `ar` agreement: in float32 they must be identical; in bf16 a (γ+1)-token and
  a one-token forward can round differently at near-ties, so this is reported, not assumed.

Tokens/s is emitted tokens over client-side wall time (prefill included), so it is what a
caller sees. The correction memory starts empty and learns across the run, as in serving.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from calispec.client import CalispecClient, GenerationResult
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.models.registry import PAIRS, chat_prompt
from calispec_tools.stack import LocalStack, StackConfig

PROMPTS: dict[str, list[str]] = {
    "code": [
        "Write a Python function `merge_sorted(a, b)` that merges two sorted lists into one sorted list.",
        "Write a Python function that returns the n-th Fibonacci number iteratively.",
    ],
    "math": ["A train travels 120 km in 1.5 hours. What is its average speed in km/h? Explain step by step."],
    "prose": ["Write a short paragraph about why the sky appears blue."],
}
MODES = ("ar", "sd", "csd")


@dataclass
class Row:
    category: str
    prompt: int
    mode: str
    tokens: int
    seconds: float
    tokens_per_s: float
    acceptance: float
    rescued: int
    draft_ms: float
    target_ms: float
    token_ids: list[int]


def timed(client: CalispecClient, prompt: str, mode: str, args: argparse.Namespace) -> tuple[GenerationResult, float]:
    start = time.perf_counter()
    result = client.generate(
        prompt, max_new_tokens=args.max_new_tokens, mode=mode, num_speculative_tokens=args.gamma, timeout=600
    )
    return result, time.perf_counter() - start


def run_stack(draft: Path, target: Path, prompts: list[tuple[str, int, str]], args: argparse.Namespace) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="calispec-bench-") as tmp:
        config = StackConfig(
            draft_model=draft, target_model=target, memory_db=Path(tmp) / "memory.db", log_dir=Path(tmp) / "logs",
            coordinator_port=0, target_port=0, draft_port=0, memory_port=0, dtype=args.dtype, device="auto",
        )  # fmt: skip
        with LocalStack(config) as stack, CalispecClient(stack.coordinator_address, timeout=600) as client:
            client.generate(prompts[0][2], max_new_tokens=4, mode="sd", timeout=600)  # warm-up: first-call costs
            for category, index, prompt in prompts:
                for mode in MODES:
                    result, seconds = timed(client, prompt, mode, args)
                    s = result.stats
                    rows.append(
                        Row(category, index, mode, s.emitted, seconds, s.emitted / seconds,
                            s.acceptance_rate if mode != "ar" else float("nan"), s.rescued, s.draft_ms, s.target_ms,
                            result.token_ids)
                    )  # fmt: skip
                    print(
                        f"  {category}#{index} {mode:3s} {s.emitted} tokens {seconds:6.1f} s "
                        f"({rows[-1].tokens_per_s:5.2f} tok/s; draft {s.draft_ms / 1e3:.1f} s, "
                        f"target {s.target_ms / 1e3:.1f} s)",
                        file=sys.stderr,
                    )
    return rows


@torch.inference_mode()
def draft_alone(draft: Path, prompts: list[str], args: argparse.Namespace) -> float:
    """Greedy KV-cached decoding on the draft alone; tokens/s over all prompts."""
    runner = ModelRunner(ModelSpec(draft, dtype=args.dtype, device="auto"))
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        start = time.perf_counter()
        cache = runner.new_cache()
        logits = runner.forward(runner.tokenizer.encode(prompt), cache, 1)
        for _ in range(args.max_new_tokens):
            token = int(logits[0, -1].argmax())
            tokens += 1
            if token in runner.eos_token_ids:
                break
            logits = runner.forward([token], cache, 1)
        seconds += time.perf_counter() - start
    return tokens / seconds


def agreement(rows: list[Row]) -> dict[str, float]:
    """Greedy sd vs ar: identical outputs, and the mean fraction of ar tokens before the first divergence."""
    by_key = {(r.category, r.prompt, r.mode): r for r in rows}
    pairs = [(by_key[(c, i, "ar")], by_key[(c, i, "sd")]) for (c, i, m) in by_key if m == "ar"]
    prefix = []
    for ar, sd in pairs:
        n = next((k for k, (a, b) in enumerate(zip(ar.token_ids, sd.token_ids, strict=False)) if a != b), None)
        same = min(len(ar.token_ids), len(sd.token_ids)) if n is None else n
        prefix.append(same / max(len(ar.token_ids), 1))
    identical = sum(ar.token_ids == sd.token_ids for ar, sd in pairs)
    return {"identical": identical, "requests": len(pairs), "mean_common_prefix": sum(prefix) / len(prefix)}


def summarize(rows: list[Row], draft_tps: float) -> dict[str, object]:
    def total(mode: str, category: str | None = None) -> dict[str, float]:
        sel = [r for r in rows if r.mode == mode and category in (None, r.category)]
        tokens, seconds = sum(r.tokens for r in sel), sum(r.seconds for r in sel)
        acc = [r.acceptance for r in sel if r.mode != "ar"]
        return {"tokens_per_s": tokens / seconds, "acceptance": sum(acc) / len(acc) if acc else float("nan")}

    categories = [*PROMPTS, None]
    table = {str(c or "all"): {m: total(m, c) for m in MODES} for c in categories}
    return {"draft_alone_tokens_per_s": draft_tps, "by_category": table, "sd_vs_ar": agreement(rows)}


def print_table(summary: dict[str, object], args: argparse.Namespace) -> None:
    print(f"\npair: {args.label}  dtype: {args.dtype}  γ = {args.gamma}  max_new_tokens = {args.max_new_tokens}")
    print(f"draft alone: {summary['draft_alone_tokens_per_s']:.2f} tok/s")
    print(f"{'prompts':8s} {'ar tok/s':>9s} {'sd tok/s':>9s} {'sd acc':>7s} {'sd ×':>5s} "
          f"{'csd tok/s':>10s} {'csd acc':>8s} {'csd ×':>6s}")  # fmt: skip
    for category, modes in summary["by_category"].items():  # type: ignore[union-attr]
        ar, sd, csd = modes["ar"], modes["sd"], modes["csd"]
        print(
            f"{category:8s} {ar['tokens_per_s']:9.2f} {sd['tokens_per_s']:9.2f} {sd['acceptance']:7.1%} "
            f"{sd['tokens_per_s'] / ar['tokens_per_s']:5.2f} {csd['tokens_per_s']:10.2f} {csd['acceptance']:8.1%} "
            f"{csd['tokens_per_s'] / ar['tokens_per_s']:6.2f}"
        )
    agree = summary["sd_vs_ar"]
    print(
        f"greedy sd vs ar: {agree['identical']}/{agree['requests']} identical, "  # type: ignore[index]
        f"mean common prefix {agree['mean_common_prefix']:.1%}"  # type: ignore[index]
    )


def resolve(args: argparse.Namespace) -> tuple[Path, Path, bool]:
    """(draft, target, chat?) from --draft/--target or a pulled --pair."""
    if args.draft and args.target:
        return Path(args.draft), Path(args.target), False
    from calispec_tools.cli import ensure_pulled_pair

    draft, target = ensure_pulled_pair(args.pair)
    return draft, target, bool(PAIRS[args.pair].eos_tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.pair", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen-coder", choices=sorted(PAIRS))
    parser.add_argument("--draft", help="HF-format draft dir (with --target; overrides --pair)")
    parser.add_argument("--target", help="HF-format target dir")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gamma", type=int, default=6)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    args = parser.parse_args(argv)
    draft, target, chat = resolve(args)
    args.label = args.pair if not args.draft else f"{draft} / {target}"
    texts = [(c, i, p) for c, ps in PROMPTS.items() for i, p in enumerate(ps)]
    prompts = [(c, i, chat_prompt(PAIRS[args.pair], p) if chat else p) for c, i, p in texts]
    start = time.perf_counter()
    print(f"draft alone on {len(prompts)} prompts...", file=sys.stderr)
    draft_tps = draft_alone(draft, [p for _, _, p in prompts], args)
    print("the stack: ar, sd, csd per prompt...", file=sys.stderr)
    rows = run_stack(draft, target, prompts, args)
    summary = summarize(rows, draft_tps)
    print_table(summary, args)
    print(f"(benchmark wall time {time.perf_counter() - start:.0f} s)")
    if args.json:
        print(json.dumps({**summary, "rows": [asdict(r) for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
