"""Log-probabilities of the tokens a round emits, for requests that ask for them (no gRPC here)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from calispec_core.compute import on_compute_thread
from calispec_core.generation import TokenLogprob

FORBIDDEN_LOGPROB = -9999.0  # vLLM's stand-in for -inf (a structured output's forbidden tokens among the top ones)


def emitted_logprobs(
    logits: torch.Tensor, rows: Sequence[int], emitted: Sequence[list[int]], tops: Sequence[int]
) -> list[list[TokenLogprob]]:
    """For each asking row `rows[j]`: its emitted tokens' log-probabilities under the target and the `tops[j]` most
    likely tokens at each one's position; all rows at once (one log-softmax, one read to the host).

    logits: [B, G+1, V] the round's raw logits; position i of row rows[j] emitted emitted[j][i] (the kept drafts,
    then the next token). The log-softmax is taken in float32, before temperature, top-k and top-p (vLLM's default:
    what the model thinks, not what the sampler drew from); a rescued token (CSD) gets its own log-probability: how
    far from the target's choice it was. A structured output's logits are masked first (its forbidden tokens: -inf),
    as vLLM masks them before its sampler; a request's logit rules are not applied (the engine passes the logits
    from before them: vLLM's `raw_logprobs`)."""
    device = logits.device
    batch_rows = torch.tensor([b for b, tokens in zip(rows, emitted, strict=True) for _ in tokens], device=device)
    positions = torch.tensor([i for tokens in emitted for i in range(len(tokens))], device=device)  # [N]
    ids = torch.tensor([t for tokens in emitted for t in tokens], device=device).view(-1, 1)  # [N, 1]
    logp = torch.log_softmax(logits[batch_rows, positions].float(), dim=-1)  # [N, V]
    logp.clamp_(min=FORBIDDEN_LOGPROB)  # JSON has no -inf: a token a grammar forbids (its logit -inf), as vLLM's
    chosen = logp.gather(1, ids).view(-1).tolist()  # [N]
    values, top_ids = logp.topk(min(max(tops), logp.shape[-1]), dim=-1)  # [N, k_max], likeliest first
    top_values, top_tokens = values.tolist(), top_ids.tolist()
    reports, start = [], 0
    for tokens, k in zip(emitted, tops, strict=True):
        span = range(start, start + len(tokens))
        reports.append([TokenLogprob(chosen[i], tuple(top_tokens[i][:k]), tuple(top_values[i][:k])) for i in span])
        start += len(tokens)
    return reports


class PromptLogprobs:
    """Collects a prompt's log-probabilities from its prefill's logits, chunk by chunk (`prefill_session`'s
    `on_logits`): entry i is prompt token i + 1's, under the tokens before it, with the `top` most likely there."""

    def __init__(self, prompt: Sequence[int], top: int) -> None:
        self.prompt = prompt
        self.top = top
        self.entries: list[TokenLogprob] = []

    @on_compute_thread  # torch work: on the one OpenMP team, like the forward that made the logits
    def __call__(self, logits: torch.Tensor, start: int) -> None:
        """logits: [n, V], position start + i predicting prompt token start + i + 1."""
        following = list(self.prompt[start + 1 : start + 1 + logits.shape[0]])
        self.entries += emitted_logprobs(logits[None], [0], [following], [self.top])[0]
