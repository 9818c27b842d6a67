"""`python -m calispec_tools.bench.forward [--pair qwen-coder | --model DIR] [--dtype ...]`: what one
target forward costs for 1 to γ+1 new tokens after a cached context.

Speculative decoding pays off only where verifying γ+1 tokens costs about as much as decoding
one (memory-bound forwards: GPUs, CPUs with bf16 matrix units). This prints the measured
ratio on this machine, so the speedups of `bench_pair` can be read against it. Nothing about
time is asserted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from calispec_core.forward_costs import forward_ms
from calispec_core.modeling import DTYPE_CHOICES, ModelRunner, ModelSpec
from calispec_core.service_cli import configure_logging

CONTEXT = 200  # cached tokens before the measured forward (the reference point)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.forward", description=__doc__)
    parser.add_argument("--model", type=Path, help="HF-format model dir (default: the pair's target)")
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--tokens", default="1,2,4,7,11,16", help="new tokens per forward, comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    if args.model is None:
        from calispec_tools.cli import ensure_pulled_pair

        _, args.model = ensure_pulled_pair(args.pair)
    runner = ModelRunner(ModelSpec(args.model, dtype=args.dtype, device="auto", threads=args.threads))
    print(f"{runner.model_id} on {runner.device} in {runner.dtype_name}, {torch.get_num_threads()} threads, "
          f"context {CONTEXT}")  # fmt: skip
    base = None
    for n in (int(t) for t in args.tokens.split(",")):
        ms = forward_ms(runner, n, args.reps, context=CONTEXT)
        base = base or ms
        print(f"  {n} new token(s): {ms:7.1f} ms  ({ms / base:.2f}x one token)", flush=True)


if __name__ == "__main__":
    main()
