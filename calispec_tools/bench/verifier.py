"""`python -m calispec_tools.bench.verifier [--quick]`: what one verification round costs.

Prints, per batch size B and draft length γ (V = 151,936, Qwen2.5's vocabulary), the median
wall time of `verify` over repetitions for greedy and sampling rows (temperature 1, no
top-k / top-p), in mode SD and in mode CSD; the time of the CSD part alone (the rescue tests:
pair-table lookup + gate, timed in isolation on the same inputs) and its share of the CSD
verify time; and, for scale, one forward pass of a small random Llama-style model whose LM
head has the same vocabulary (hidden 896, 2 layers, 14 heads / 2 KV heads, MLP 4,864, tied
embeddings, float32; input [B, γ+1] tokens, no KV cache). Nothing is downloaded; nothing
about time is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from target_service.pair_table import PairTable
from target_service.verifier import Mode, VerifyInput, _rescue_mask, verify

VOCAB = 151_936
TABLE_PAIRS = 100_000  # a warmed-up correction memory
LOG_TAU = -4.605  # log 0.01, the paper's τ
LAMBDA = 6


@dataclass(frozen=True)
class Row:
    batch: int
    gamma: int
    sampling: bool
    sd_ms: float
    csd_ms: float
    rescue_ms: float
    forward_ms: float


def median_ms(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _pair_table(device: torch.device, rng: torch.Generator) -> PairTable:
    table = PairTable(VOCAB, device)
    pairs = torch.randint(VOCAB, (3, TABLE_PAIRS), generator=rng)
    pairs[2] = torch.randint(1, 50, (TABLE_PAIRS,), generator=rng)  # counts
    table.replace_snapshot((pairs[0], pairs[1], pairs[2]), version=1)
    return table


def _input(batch: int, gamma: int, sampling: bool, mode: Mode, device: torch.device) -> VerifyInput:
    rng = torch.Generator().manual_seed(batch * 100 + gamma)
    logits = torch.randn(batch, gamma + 1, VOCAB, generator=rng) * 3  # [B, γ+1, V]
    # Half the draft tokens match the target's argmax, so rounds mix acceptances and rejections.
    matches = torch.rand(batch, gamma, generator=rng) < 0.5
    draft = torch.where(matches, logits[:, :gamma].argmax(-1), torch.randint(VOCAB, (batch, gamma), generator=rng))
    q = torch.softmax(logits[:, :gamma] + torch.randn(batch, gamma, VOCAB, generator=rng), dim=-1) if sampling else None
    full = lambda value, dtype: torch.full((batch,), value, dtype=dtype, device=device)  # noqa: E731
    return VerifyInput(
        target_logits=logits.to(device),
        draft_tokens=draft.to(device),
        num_draft=full(gamma, torch.int64),
        draft_probs=None if q is None else q.to(device),
        temperature=full(1.0 if sampling else 0.0, torch.float32),
        top_k=full(0, torch.int64),
        top_p=full(1.0, torch.float32),
        mode=full(int(mode), torch.int64),
        log_tau=full(LOG_TAU, torch.float32),
        lambda_=full(LAMBDA, torch.int64),
        generators=[torch.Generator(device).manual_seed(b) for b in range(batch)],
    )


def _rescue_only(inp: VerifyInput, table: PairTable) -> Callable[[], object]:
    """The CSD-specific work of a round on the same inputs: the OCM lookup and the SCG gate."""
    gamma = inp.draft_tokens.shape[1]
    target = inp.target_logits[:, :gamma].argmax(-1)  # [B, γ] stand-in t*; the cost does not depend on it
    return lambda: _rescue_mask(inp, inp.draft_tokens, target, table.counts)


def synthetic_llama(device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.float32).eval()


def forward_fn(model: torch.nn.Module, batch: int, gamma: int, device: torch.device) -> Callable[[], object]:
    ids = torch.randint(VOCAB, (batch, gamma + 1), device=device)  # [B, γ+1]

    @torch.inference_mode()
    def run() -> object:
        return model(input_ids=ids, use_cache=False).logits  # [B, γ+1, V]

    return run


def run(batches: list[int], gammas: list[int], reps: int, device: torch.device) -> list[Row]:
    table = _pair_table(device, torch.Generator().manual_seed(0))
    model = synthetic_llama(device)
    rows = []
    for batch in batches:
        for gamma in gammas:
            forward_ms = median_ms(forward_fn(model, batch, gamma, device), max(reps // 2, 1), device)
            for sampling in (False, True):
                sd, csd = (_input(batch, gamma, sampling, m, device) for m in (Mode.SD, Mode.CSD))
                sd_ms = median_ms(lambda sd=sd: verify(sd, table.counts), reps, device)
                csd_ms = median_ms(lambda csd=csd: verify(csd, table.counts), reps, device)
                rescue_ms = median_ms(_rescue_only(csd, table), reps, device)
                rows.append(Row(batch, gamma, sampling, sd_ms, csd_ms, rescue_ms, forward_ms))
    return rows


def format_table(rows: list[Row]) -> str:
    header = (
        f"{'B':>3} {'γ':>2} {'decode':>8} {'SD ms':>9} {'CSD ms':>9} {'CSD part ms':>12} {'CSD share':>10}"
        f" {'forward ms':>11} {'CSD/fwd':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.batch:>3} {r.gamma:>2} {'sampling' if r.sampling else 'greedy':>8} {r.sd_ms:>9.2f}"
            f" {r.csd_ms:>9.2f} {r.rescue_ms:>12.3f} {r.rescue_ms / r.csd_ms:>10.1%}"
            f" {r.forward_ms:>11.1f} {r.csd_ms / r.forward_ms:>8.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.verifier", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tiny run: B in {1, 4}, γ = 2, 2 repetitions")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per figure (median)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:n]")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    batches, gammas, reps = ([1, 4], [2], 2) if args.quick else ([1, 8, 32], [2, 4, 6], args.reps)
    started = time.perf_counter()
    rows = run(batches, gammas, reps, device)
    print(
        f"verify() on {device} ({torch.get_num_threads()} threads), V = {VOCAB:,}, median of {reps};"
        f" pair table of {TABLE_PAIRS:,} pairs; λ = {LAMBDA}, τ = 0.01"
    )
    print(
        "forward: random Llama (hidden 896, 2 layers, 14/2 heads, MLP 4864, tied embeddings, float32),"
        " input [B, γ+1], no KV cache"
    )
    print(format_table(rows))
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
