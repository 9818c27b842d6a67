"""The target's own greedy continuations of prompts, many prompts per forward.

One left-padded batch with one KV cache, an attention mask and explicit position ids (so every
row is exactly its own sequence), through the runner's batched forward, as the target service
batches sessions. It never stops at EOS: a greedy SD run's last round may verify draft tokens past
the EOS it emits (see teacher.py), so the text must go on for the whole budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from calispec_core.argmax import argmax_last
from calispec_core.compute import on_compute_thread
from calispec_core.modeling import ModelRunner


def budget_for(runner: ModelRunner, prompt: Sequence[int], max_new_tokens: int) -> int:
    """The coordinator's rule: a request never runs past the context."""
    return max(0, min(max_new_tokens, runner.max_context - len(prompt) - 1))


@on_compute_thread
@torch.inference_mode()
def continue_greedy(runner: ModelRunner, prompts: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations (budget_for tokens each) of every prompt, all prompts in one batch. On the compute
    thread, all of it: its argmax and concatenations on another thread started a second OpenMP team, whose idle
    threads then slowed every later forward of the process (the draft's teacher-forced pass over the corpus text
    10.4 → 13.5 s after a 2-token continuation; calispec_core/compute.py says why)."""
    device = runner.device
    budgets = [budget_for(runner, p, max_new_tokens) for p in prompts]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)  # [B, P] left-padded
    mask = torch.zeros_like(ids)  # [B, P]
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=device)
        mask[b, width - len(p) :] = 1
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, P] each row counts from its first real token
    cache = runner.new_cache()
    outputs: list[list[int]] = [[] for _ in prompts]
    for step in range(max(budgets, default=0)):
        logits = runner.forward_batch(ids, mask, positions, cache, 1, first_tokens=step == 0)  # [B, 1, V]
        ids = argmax_last(logits[:, -1]).unsqueeze(-1)  # [B, 1]
        for b, token in enumerate(ids.view(-1).tolist()):
            if len(outputs[b]) < budgets[b]:
                outputs[b].append(token)
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)  # [B, P + t]
        positions = positions[:, -1:] + 1  # [B, 1]
    return outputs
