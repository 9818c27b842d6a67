"""Probability-ratio spread of the most frequent rejected pairs (the paper's second rejection finding).

The paper shows that one (draft x̃, target t*) pair can be harmless in one context and wrong in
another: its ratio p_target(x̃)/p_target(t*) ranges from near 1 to below 1e-10. The serving system
never exports that ratio (it lives inside the verifier for one round), so this is an offline,
in-process analysis: both models are loaded here and greedy standard SD runs over the prompts through
the coordinator's own `Orchestrator` over the services' engines in process (calispec_tools/inprocess.py:
the one propose/verify loop of the codebase); a round observer on the target engine records
z(x̃) − z(t*) on the target's raw logits at every rejection event. The softmax normaliser cancels, so
that difference equals log p_target(x̃) − log p_target(t*) exactly.

`aggregate` is pure (hand-built events in the unit tests); `collect_events` needs the models.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from calispec_core.generation import Defaults, GenerationParams, Mode
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from calispec_tools.inprocess import InProcessTarget, in_process_orchestrator
from target_service.verifier import VerifyInput, VerifyOutput, verify

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
LN10 = math.log(10.0)


@dataclass(frozen=True)
class RatioEvent:
    draft_token_id: int
    target_token_id: int
    log_ratio: float  # natural log of p_target(draft) / p_target(target), = z(draft) − z(target); ≤ 0 when greedy


# --- aggregation (pure) ----------------------------------------------------------------------------


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default); `ordered` sorted ascending."""
    if not ordered:
        return math.nan
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Iterable[float]) -> dict[str, float]:
    """min, quantiles, max of natural-log ratios; `decades` = (max − min) in powers of ten."""
    ordered = sorted(values)
    out = {"min": ordered[0], **{f"q{round(q * 100):02d}": quantile(ordered, q) for q in QUANTILES}}
    out["max"] = ordered[-1]
    out["decades"] = (ordered[-1] - ordered[0]) / LN10
    return out


def rank_pairs(events: Iterable[RatioEvent]) -> list[tuple[tuple[int, int], list[float]]]:
    """Pairs with their log-ratios, most frequent first; ties by ids so the ranking is reproducible."""
    by_pair: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in events:
        by_pair[(e.draft_token_id, e.target_token_id)].append(e.log_ratio)
    return sorted(by_pair.items(), key=lambda item: (-len(item[1]), item[0]))


def aggregate(
    events: Sequence[RatioEvent],
    decode: Callable[[int], str] | None = None,
    top: int = 15,
    tau: float = Defaults.tau,
) -> dict[str, Any]:
    """The JSON document: overall spread, and per top pair count, spread, share passing the gate, values."""
    finite = [e for e in events if math.isfinite(e.log_ratio)]  # -inf: a masked logit, no ratio to speak of
    log_tau = math.log(tau)
    ranked = rank_pairs(finite)

    def row(rank: int, pair: tuple[int, int], values: list[float]) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": rank, "draft_token_id": pair[0], "target_token_id": pair[1]}
        if decode is not None:
            out["draft_text"], out["target_text"] = decode(pair[0]), decode(pair[1])
        out["count"] = len(values)
        out["log_ratio"] = spread(values)
        # the share of this pair's events the SCG gate would admit: the context dependence in one number
        out["gate_pass_share"] = sum(v >= log_tau for v in values) / len(values)
        out["log_ratios"] = values  # in event order, for re-plotting
        return out

    return {
        "method": "offline greedy standard SD, in process; log_ratio = z(draft) - z(target) on raw target logits",
        "events": len(finite),
        "non_finite_events": len(events) - len(finite),
        "distinct_pairs": len(ranked),
        "tau": tau,
        "log_tau": log_tau,
        "overall_log_ratio": spread(e.log_ratio for e in finite) if finite else None,
        "overall_gate_pass_share": sum(e.log_ratio >= log_tau for e in finite) / len(finite) if finite else math.nan,
        "top_pairs": [row(i + 1, pair, values) for i, (pair, values) in enumerate(ranked[:top])],
    }


# --- collection (needs the models) -----------------------------------------------------------------

DEADLINE_S = 3600.0  # per prompt; an offline run on a slow CPU may take long, but never forever


@dataclass(frozen=True)
class SdConfig:
    gamma: int = 6
    max_new_tokens: int = 128


class RatioObserver:
    """A target-engine round observer: z(x̃) − z(t*) at every rejection event of every verified round."""

    def __init__(self) -> None:
        self.events: list[RatioEvent] = []

    def __call__(self, batch: VerifyInput, out: VerifyOutput) -> None:
        mask = out.event_mask  # [B, G]
        if not bool(mask.any()):
            return
        draft = torch.where(mask, batch.draft_tokens, 0)  # [B, G] placeholders -> 0, safe to gather
        target = torch.where(mask, out.target_tokens, 0)  # [B, G]
        z = batch.target_logits[:, : draft.shape[1]].float()  # [B, G, V] raw logits at the draft positions
        diff = z.gather(-1, draft.unsqueeze(-1)).squeeze(-1) - z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        rows = zip(draft[mask].tolist(), target[mask].tolist(), diff[mask].tolist(), strict=True)
        self.events += [RatioEvent(d, t, r) for d, t, r in rows]


def _verify_input(logits: torch.Tensor, draft: list[int]) -> VerifyInput:
    """A B=1 greedy SD round: logits [1, G+1, V] over pending + draft."""
    device = logits.device
    return VerifyInput(
        target_logits=logits,
        draft_tokens=torch.tensor([draft], dtype=torch.long, device=device),  # [1, G]
        num_draft=torch.tensor([len(draft)], device=device),
        draft_probs=None,  # greedy: the standard rule needs no q
        temperature=torch.zeros(1, device=device),
        top_k=torch.zeros(1, dtype=torch.long, device=device),
        top_p=torch.ones(1, device=device),
        mode=torch.tensor([int(Mode.SD)], device=device),
        log_tau=torch.tensor([math.log(Defaults.tau)], device=device),
        lambda_=torch.tensor([Defaults.lambda_], device=device),
        generators=[torch.Generator(device=device)],
    )


def round_events(logits: torch.Tensor, draft: list[int]) -> tuple[int, int, list[RatioEvent]]:
    """One hand-built round through the verifier and the observer: (accepted, next token, its events)."""
    inp = _verify_input(logits, draft)
    out = verify(inp, lambda d, t: torch.zeros_like(d))  # SD never rescues: the memory is never consulted
    observer = RatioObserver()
    observer(inp, out)
    return int(out.accepted_count[0]), int(out.next_token[0]), observer.events


class SdRun:
    """Greedy standard SD through the Orchestrator, both models in process, events observed per round."""

    def __init__(self, draft: ModelRunner, target: ModelRunner, config: SdConfig) -> None:
        self.config = config
        self.observer = RatioObserver()
        self.backend = InProcessTarget(target, observer=self.observer, meaning_guard=False)  # SD: no rescue
        self.orchestrator = in_process_orchestrator(draft, self.backend)

    def generate(self, prompt: str, stop: Sequence[str] = ()) -> list[int]:
        """The generated token ids of one request (its events go to self.observer)."""
        params = GenerationParams(
            self.config.max_new_tokens, SamplingConfig(), tuple(stop), self.config.gamma, Mode.SD,
            Defaults.tau, Defaults.lambda_,
        )  # fmt: skip
        chunks = self.orchestrator.generate(prompt, params, Deadline(DEADLINE_S))
        return [token for chunk in chunks for token in chunk.token_ids]

    def close(self) -> None:
        self.backend.stop()


def collect_events(
    draft: ModelRunner, target: ModelRunner, prompts: Sequence[tuple[str, Sequence[str]]], config: SdConfig
) -> list[RatioEvent]:
    """Events over (prompt text, stop strings) pairs; the Orchestrator tokenizes as the coordinator does."""
    run = SdRun(draft, target, config)
    try:
        for text, stop in prompts:
            run.generate(text, stop)
    finally:
        run.close()
    return run.observer.events


def run(
    draft_dir: Path,
    target_dir: Path,
    prompts: Sequence[tuple[str, Sequence[str]]],
    config: SdConfig,
    dtype: str = "auto",
    device: str = "auto",
    tau: float = Defaults.tau,
    top: int = 15,
) -> dict[str, Any]:
    """Load the pair, collect the events, aggregate them (token texts from the target's tokenizer)."""
    draft = ModelRunner(ModelSpec(draft_dir, dtype, device))
    target = ModelRunner(ModelSpec(target_dir, dtype, device))
    events = collect_events(draft, target, prompts, config)
    doc = aggregate(events, lambda t: target.tokenizer.decode([t]), top=top, tau=tau)
    return {**doc, "prompts": len(prompts), "gamma": config.gamma, "max_new_tokens": config.max_new_tokens,
            "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device)}  # fmt: skip
