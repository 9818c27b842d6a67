"""`python -m calispec_tools.bench.draft_head [--pair qwen-coder | --model DIR] --dtype D --draft-vocab 0,32768`:
what a draft forward costs with its output layer pruned (`--draft-vocab K`, calispec_core/vocab_pruning.py).

Every variant (0: the full layer; K: the rows of ids [0, K) plus the special tokens, quantised
like the rest of the model when it runs in int8, as the draft service builds it) is built on one
loaded model, and they take turns on one cached context (`--reps` forwards of each in turn,
`--rounds` times), so load from other processes hits them alike. It prints, per variant, the
fastest and the median wall time and the median process CPU time (all threads), each with its
ratio to the first variant: on a busy machine the CPU time (with `--threads 1`) is the steadier.
Nothing about time is asserted. The share of text a pruned layer can still propose:
`calispec_tools.bench.vocab_coverage`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from calispec_core.forward_costs import context_session
from calispec_core.modeling import DTYPE_CHOICES, INT8, ModelRunner, ModelSpec, Session, quantize_int8
from calispec_core.service_cli import configure_logging
from calispec_core.vocab_pruning import check_draft_vocab, kept_ids_for, pruned_linear

CONTEXT = 200  # cached tokens before the measured forward (the reference point)


def parse_ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


@dataclass(frozen=True)
class Head:
    label: str
    layer: torch.nn.Module


def layer_weights(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[V, H] weight and bias of a Linear, or of a dynamically quantised one (dequantised)."""
    if callable(layer.weight):  # torch.ao's dynamic quantised Linear: weight() and bias() are methods
        return layer.weight().dequantize(), layer.bias()
    return layer.weight.detach(), None if layer.bias is None else layer.bias.detach()


def head_variants(runner: ModelRunner, variants: list[int]) -> dict[int, Head]:
    """Per K, the output layer the draft service serves with --draft-vocab K (0: the runner's own): the
    kept rows, quantised like the rest of the model when the runner is int8."""
    full = runner.model.get_output_embeddings()
    weight, bias = layer_weights(full)
    vocab = runner.vocab_size
    heads = {}
    for keep in variants:
        check_draft_vocab(keep, vocab)
        kept = kept_ids_for(runner.tokenizer, keep, vocab, runner.eos_token_ids)
        if keep == 0 or len(kept) == vocab:
            heads[keep] = Head("full head", full)
            continue
        layer = pruned_linear(weight, bias, kept)
        if runner.dtype_name == INT8:
            layer = quantize_int8(torch.nn.Sequential(layer))[0]
        heads[keep] = Head(f"{len(kept)} rows", layer)
    return heads


@dataclass
class Samples:
    """One variant's forwards of one size: wall and process CPU time (all threads), ms each."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {
            "wall_min": min(self.wall),
            "wall_median": statistics.median(self.wall),
            "cpu_median": statistics.median(self.cpu),
        }


def time_forwards(runner: ModelRunner, session: Session, new_tokens: int, reps: int, out: Samples) -> None:
    """`reps` forwards of `new_tokens` after the session's cached context, cropped back after each."""
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        runner.forward(session.pending() + [5] * (new_tokens - 1), session.cache, new_tokens)
        out.wall.append((time.perf_counter() - wall) * 1000)
        out.cpu.append((time.process_time() - cpu) * 1000)
        session.cache.crop(-new_tokens)


def interleaved(
    runner: ModelRunner, heads: dict[int, Head], tokens: list[int], reps: int, rounds: int
) -> dict[tuple[int, int], dict[str, float]]:
    """{(draft vocab, new tokens): summary}; the output layers take turns on one model and one cached
    context, every round (after one warm-up round)."""
    session = context_session(runner, CONTEXT, headroom=max(tokens))
    samples = {(k, n): Samples() for k in heads for n in tokens}
    full = runner.model.get_output_embeddings()
    try:
        for r in range(rounds + 1):
            for n in tokens:
                for k, head in heads.items():
                    runner.model.set_output_embeddings(head.layer)
                    time_forwards(runner, session, n, reps, samples[(k, n)] if r else Samples())
            print(f"  round {r}/{rounds} done{' (warm-up)' if r == 0 else ''}", flush=True)
    finally:
        runner.model.set_output_embeddings(full)
    return {key: s.summary() for key, s in samples.items()}


def compare_heads(spec: ModelSpec, variants: list[int], tokens: list[int], reps: int, rounds: int) -> None:
    runner = ModelRunner(spec)
    heads = head_variants(runner, variants)
    print(f"{runner.model_id} on {runner.device} in {runner.dtype_name}, {torch.get_num_threads()} threads, "
          f"context {CONTEXT}; {rounds} interleaved rounds of {reps} forwards per output layer")  # fmt: skip
    results = interleaved(runner, heads, tokens, reps, rounds)
    for n in tokens:
        print(f"  {n} new token(s):")
        base = results[(variants[0], n)]
        for k, head in heads.items():
            row = results[(k, n)]
            cells = [f"{name} {row[name]:7.1f} ms ({row[name] / base[name]:.2f}x)" for name in row]
            print(f"    {head.label:12s} " + " | ".join(cells), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.draft_head", description=__doc__)
    parser.add_argument("--model", type=Path, help="HF-format draft model dir (default: the pair's draft)")
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--dtype", default="int8", choices=DTYPE_CHOICES, help="default: int8 (the CPU draft's)")
    parser.add_argument("--tokens", default="1,7", help="new tokens per forward, comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--draft-vocab", default="0,32768,65536", help="output layers to compare (0: the full one)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    parser.add_argument("--reps", type=int, default=12, help="forwards per variant and round")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    if args.model is None:
        from calispec_tools.cli import ensure_pulled_pair

        args.model, _ = ensure_pulled_pair(args.pair)
    spec = ModelSpec(args.model, dtype=args.dtype, device="auto", threads=args.threads)
    compare_heads(spec, parse_ints(args.draft_vocab), parse_ints(args.tokens), args.reps, args.rounds)


if __name__ == "__main__":
    main()
