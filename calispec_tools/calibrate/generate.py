"""The target's own greedy continuations of prompts, many sessions per forward.

Uses the target service's own pieces (`prefill_session`, `forward_rows`: the batched forward
over per-session KV caches that serves concurrent Verify calls), so a continuation is what
the serving target would emit. It never stops at EOS: a greedy SD run's last round may verify
draft tokens past the EOS it emits (see teacher.py), so the text must go on for the whole budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from calispec_core.modeling import ModelRunner, prefill_session
from target_service.batch_forward import forward_rows


def budget_for(runner: ModelRunner, prompt: Sequence[int], max_new_tokens: int) -> int:
    """The coordinator's rule: a request never runs past the context."""
    return max(0, min(max_new_tokens, runner.max_context - len(prompt) - 1))


@torch.inference_mode()
def continue_greedy(runner: ModelRunner, prompts: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations (budget_for tokens each) of every prompt, all prompts in one batch."""
    sessions = [prefill_session(runner, f"calibrate-{i}", list(p)) for i, p in enumerate(prompts)]
    budgets = [budget_for(runner, p, max_new_tokens) for p in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    while live := [b for b, out in enumerate(outputs) if len(out) < budgets[b]]:
        rows = [sessions[b] for b in live]
        logits, caches = forward_rows(runner, [s.cache for s in rows], [s.pending() for s in rows], [1] * len(rows))
        for b, session, cache, row_logits in zip(live, rows, caches, logits, strict=True):
            token = int(row_logits[-1].argmax())
            session.cache = cache
            session.tokens.append(token)
            outputs[b].append(token)
    return outputs
