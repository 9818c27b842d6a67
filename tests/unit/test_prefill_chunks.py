"""Prefill in chunks: a long prompt no longer holds the model for a whole round."""

from __future__ import annotations

import torch

from calispec_core import modeling
from calispec_core.modeling import ModelRunner, prefill_session


@torch.inference_mode()
def test_chunked_prefill_feeds_every_prefix_token_once_and_continues_alike(
    target_runner: ModelRunner, monkeypatch
) -> None:
    prompt = [(7 * i) % 200 + 3 for i in range(23)]
    whole = prefill_session(target_runner, "whole", prompt)
    calls: list[int] = []
    forward = target_runner.forward

    def counting(token_ids, cache, logits_to_keep):
        calls.append(len(token_ids))
        return forward(token_ids, cache, logits_to_keep)

    monkeypatch.setattr(modeling, "PREFILL_CHUNK", 5)
    monkeypatch.setattr(target_runner, "forward", counting)
    chunked = prefill_session(target_runner, "chunked", prompt)
    assert calls == [5, 5, 5, 5, 2] and chunked.cached_len == whole.cached_len == len(prompt) - 1
    a = forward(whole.pending(), whole.cache, 1)[0, -1]
    b = forward(chunked.pending(), chunked.cache, 1)[0, -1]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
