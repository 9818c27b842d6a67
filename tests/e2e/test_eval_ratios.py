"""The offline ratio analysis on the tiny pair: its in-process SD is the real SD, and its report is sane."""

from __future__ import annotations

import math

import torch

from calispec_core.modeling import ModelRunner, prefill_session
from calispec_tools.eval.ratios import SdConfig, SdRun, collect_events


def target_greedy(target: ModelRunner, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    session = prefill_session(target, "ar", prompt_ids)
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits = target.forward(session.pending(), session.cache, logits_to_keep=1)
        token = int(torch.argmax(logits[0, -1]))
        session.tokens.append(token)
        out.append(token)
        if token in target.eos_token_ids:
            break
    return out


def test_in_process_sd_emits_target_greedy_and_ratios_below_one(
    draft_runner: ModelRunner, target_runner: ModelRunner
) -> None:
    prompts = ["def fibonacci(n):", "The robot counted"]
    sd = SdRun(draft_runner, target_runner, SdConfig(gamma=4, max_new_tokens=24))
    try:
        for text in prompts:
            tokens = sd.generate(text)
            assert tokens == target_greedy(target_runner, target_runner.tokenizer.encode(text), 24)  # lossless
    finally:
        sd.close()
    rejections = len(sd.observer.events)
    assert rejections > 0  # the tiny draft disagrees with its target somewhere in 48 tokens
    events = collect_events(draft_runner, target_runner, [(p, ()) for p in prompts], SdConfig(4, 24))
    assert len(events) == rejections  # the same run, through the public entry
    # greedy: a rejected draft token's logit is at most the argmax's, and never the argmax itself
    assert all(math.isfinite(e.log_ratio) and e.log_ratio <= 0 for e in events)
    assert all(e.draft_token_id != e.target_token_id for e in events)
