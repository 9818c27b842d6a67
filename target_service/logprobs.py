"""Log-probabilities of the tokens a round emits, for requests that ask for them (no gRPC here)."""

from __future__ import annotations

import torch

from calispec_core.generation import TokenLogprob


def emitted_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Each emitted token's log-probability under the target and the `top` most likely tokens at its position.

    logits: [n, V] raw logits at the n positions that emitted `tokens` ([n]); the log-softmax is taken in float32,
    before temperature, top-k and top-p (vLLM's default: what the model thinks, not what the sampler drew from).
    A rescued token (CSD) gets its own log-probability: how far from the target's choice it was."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
    ids = torch.tensor(tokens, dtype=torch.long, device=logp.device).view(-1, 1)  # [n, 1]
    chosen = logp.gather(1, ids).view(-1).tolist()  # [n]
    if top == 0:
        return [TokenLogprob(c) for c in chosen]
    values, top_ids = logp.topk(min(top, logp.shape[-1]), dim=-1)  # [n, top], most likely first
    return [
        TokenLogprob(c, tuple(i), tuple(v)) for c, i, v in zip(chosen, top_ids.tolist(), values.tolist(), strict=True)
    ]
