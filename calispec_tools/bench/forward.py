"""`python -m calispec_tools.bench.forward [--pair qwen-coder | --model DIR] [--dtype ...]`: what one
target forward costs for 1 to γ+1 new tokens after a cached context.

Speculative decoding pays off only where verifying γ+1 tokens costs about as much as decoding
one (memory-bound forwards: GPUs, CPUs with bf16 matrix units). This prints the measured
ratio on this machine, so the speedups of `bench_pair` can be read against it. Nothing about
time is asserted.

Forwards take the services' path (`calispec_core/batch_forward.py`); `--batch B` times B sessions of
different cached lengths in one forward, as a verify round at concurrency B does; `--context` sets the
cached tokens (default 200).

In float32 on CPU, and in bf16 on CPUs with bf16 units, it compares the Linear paths on one loaded
model (`--linear`): `onednn` (products on oneDNN), `packed` (products on prepacked weights, what the
services use where the memory allows, `--fp32-linear packed`), `unpadded` (packed, but bf16 products of 1-3
rows not run as 4: before wave 30) and `default` (torch's own path), interleaved
per repetition and token count so drift on a shared machine hits both alike. `--passes lean,hf` compares
the services' lean pass (calispec_core/lean_decoder.py) with Hugging Face's pass through the same
modules the same way, on `--linear`'s first path.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from pathlib import Path

import torch

from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import DTYPE_CHOICES, ModelRunner, ModelSpec
from calispec_core.onednn_linear import (
    OneDnnLinear,
    onednn_linear_available,
    padded_rows_for,
    use_default_linear,
    use_onednn_linear,
)
from calispec_core.service_cli import configure_logging
from calispec_tools.bench.compare import cpu_flags, cpu_model, gpu_model, isa_caps

CONTEXT = 200  # default cached tokens before the measured forward (the reference point)


def use_packed(model: torch.nn.Module, padded: bool = True) -> None:
    """The packed path (packed again after `default` dropped the layers); `padded=False`: bf16 products of
    1-3 rows as they are, as before wave 30 (`onednn_linear.PADDED_BF16_ROWS`), to compare."""
    use_onednn_linear(model, packed=True, bf16=True)
    for layer in model.modules():
        if isinstance(layer, OneDnnLinear):
            layer.padded_rows = padded_rows_for(layer.weight) if padded else 0


SWITCH = {
    "onednn": partial(use_onednn_linear, packed=False, bf16=True),  # bf16 layers: only on CPUs with bf16 units
    "packed": use_packed,
    "unpadded": partial(use_packed, padded=False),
    "default": use_default_linear,
}
PASSES = ("lean", "hf")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.forward", description=__doc__)
    parser.add_argument("--model", type=Path, help="HF-format model dir (default: the pair's target)")
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (auto: cuda where there is one)")
    parser.add_argument(
        "--tokens", "--new-tokens", default="1,2,4,7,11,16", help="new tokens per forward, comma-separated"
    )
    parser.add_argument(
        "--linear",
        default="onednn,packed,default",
        help="float32/bf16 Linear paths to compare, comma-separated (onednn; packed: the services'; unpadded: "
        "packed as before wave 30, bf16 only; default: torch's)",
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="sessions per forward (rows end to end, each attending to its own cache)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--context", type=int, default=CONTEXT, help="cached tokens before the measured forward")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--passes", default="lean", help="forward passes to compare, comma-separated: lean (the services'), hf"
    )
    args = parser.parse_args(argv)
    args.token_counts = [int(t) for t in args.tokens.split(",")]
    args.variants = [v for v in args.linear.split(",") if v]
    args.passes = [v for v in args.passes.split(",") if v]
    if bad := [v for v in args.variants if v not in SWITCH]:
        parser.error(f"--linear: unknown path(s) {bad}; choose from {tuple(SWITCH)}")
    if bad := [v for v in args.passes if v not in PASSES]:
        parser.error(f"--passes: unknown pass(es) {bad}; choose from {PASSES}")
    if len(args.passes) > 1:
        args.variants = args.variants[:1]  # passes compared on one Linear path
    return args


def measure(
    runner: ModelRunner,
    variants: list[str],
    token_counts: list[int],
    reps: int,
    batch: int = 1,
    context: int = CONTEXT,
) -> dict[tuple[str, int], float]:
    """Median ms per (variant, new tokens); variants interleaved within each repetition, one warm-up round.
    A variant is a Linear path (`onednn`, `packed`, `unpadded`, `default`) or a pass (`lean`, `hf`)."""
    headroom = max(token_counts)
    sessions = [context_session(runner, context + 16 * b, headroom) for b in range(batch)]  # unequal lengths
    times: dict[tuple[str, int], list[float]] = {(v, n): [] for v in variants for n in token_counts}
    lean = runner.decoder
    try:
        for rep in range(reps + 1):
            for n in token_counts:
                for variant in variants:
                    if variant in SWITCH:
                        SWITCH[variant](runner.model)
                    else:
                        runner.decoder = lean if variant == "lean" else None
                    ms = forward_ms(runner, sessions, n)
                    if rep > 0:
                        times[(variant, n)].append(ms)
    finally:
        runner.decoder = lean
    return {key: statistics.median(ms) for key, ms in times.items()}


def report(medians: dict[tuple[str, int], float], variants: list[str], token_counts: list[int]) -> list[str]:
    head = "".join(f"  {v:>10} ms (x 1 tok)" for v in variants)
    ratio_head = f"  {variants[0]}/{variants[1]}" if len(variants) == 2 else ""
    lines = [f"  new tokens{head}{ratio_head}"]
    for n in token_counts:
        row = "".join(
            f"  {medians[(v, n)]:13.1f} ({medians[(v, n)] / medians[(v, token_counts[0])]:5.2f}x)" for v in variants
        )
        ratio = f"  {medians[(variants[0], n)] / medians[(variants[1], n)]:13.2f}" if len(variants) == 2 else ""
        lines.append(f"  {n:10d}{row}{ratio}")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging("WARNING")
    if args.model is None:
        from calispec_tools.cli import ensure_pulled_pair

        _, args.model = ensure_pulled_pair(args.pair)
    spec = ModelSpec(args.model, dtype=args.dtype, device=args.device, threads=args.threads, fp32_linear="default")
    runner = ModelRunner(spec)
    if not runner.fp32_linear or not onednn_linear_available():  # "": no layer the paths apply to (int8, CUDA,
        args.variants = ["default"]  # bf16 without bf16 units): one Linear path only
    SWITCH[args.variants[0]](runner.model)
    if len(args.passes) > 1 and runner.decoder is not None:
        args.variants = args.passes  # the passes compared on that Linear path
    elif runner.decoder is not None and args.passes == ["hf"]:
        runner.decoder = None
    print(f"cpu {cpu_model()} flags {' '.join(cpu_flags()) or '-'}, isa caps {isa_caps()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; gpu {gpu_model(args.device)}")  # fmt: skip
    passes = "/".join(args.variants) if args.variants == args.passes else ("lean" if runner.decoder else "hf")
    print(f"{runner.model_id} on {runner.device} in {runner.dtype_name}, context {args.context}, batch {args.batch}, "
          f"{passes} pass, median of {args.reps} (interleaved)")  # fmt: skip
    medians = measure(runner, args.variants, args.token_counts, args.reps, args.batch, args.context)
    print("\n".join(report(medians, args.variants, args.token_counts)), flush=True)


if __name__ == "__main__":
    main()
