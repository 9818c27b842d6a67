"""Log-probabilities of the emitted tokens: the target's log-softmax at the positions that emitted them."""

from __future__ import annotations

import pytest
import torch

from calispec_core.errors import InvalidArgument
from calispec_core.generation import Mode, SessionOutput
from calispec_core.logit_rules import LogitRules
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from target_service.engine import RescueConfig, TargetEngine, _Row
from target_service.logprobs import emitted_logprobs
from target_service.pair_table import PairTable


def test_emitted_logprobs_are_the_log_softmax_of_the_raw_logits() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    tokens = [4, 7, 49]
    reference = torch.log_softmax(logits, dim=-1)
    padded = torch.stack([logits.to(torch.bfloat16), torch.zeros(3, 50, dtype=torch.bfloat16)])  # [2, 3, 50]
    got, flat = emitted_logprobs(padded, [0, 1], [tokens, [9]], [5, 0])  # a bf16 target's logits, in float32
    assert flat[0].top_token_ids == () and flat[0].logprob == pytest.approx(-torch.log(torch.tensor(50.0)).item())
    for row, (token, lp) in enumerate(zip(tokens, got, strict=True)):
        exact = torch.log_softmax(logits.to(torch.bfloat16).float()[row], dim=-1)
        assert lp.logprob == pytest.approx(exact[token].item(), abs=1e-6)
        assert list(lp.top_token_ids) == exact.topk(5).indices.tolist()
        assert list(lp.top_logprobs) == sorted(lp.top_logprobs, reverse=True)
        assert lp.logprob == pytest.approx(reference[row, token].item(), abs=0.05)  # bf16's rounding of the logits
    assert [lp.top_token_ids for lp in emitted_logprobs(logits[None], [0], [tokens], [0])[0]] == [(), (), ()]


def _greedy(runner: ModelRunner, ids: list[int], steps: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            out.append(int(runner.model(input_ids=torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def test_a_round_reports_each_emitted_token_where_one_forward_over_the_text_puts_it(target_runner: ModelRunner) -> None:
    """Kept drafts, then the token that ended the round: each at its own position of the sequence."""
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size))
    prompt = target_runner.tokenizer("def add(a, b):")["input_ids"]
    greedy = _greedy(target_runner, prompt, 4)
    wrong = next(t for t in range(target_runner.vocab_size) if t != greedy[3])
    try:
        engine.prefill("s", prompt, SamplingConfig(), RescueConfig(Mode.SD, 0.01, 6), Stopwatch())
        result = engine.verify("s", [*greedy[:3], wrong], None, Stopwatch(), logprobs=2)
        assert (result.accepted_count, result.next_token) == (3, greedy[3])
        with torch.no_grad():
            logits = target_runner.model(input_ids=torch.tensor([prompt + greedy[:3]])).logits[0]  # [T, V]
        reference = torch.log_softmax(logits[len(prompt) - 1 :].float(), dim=-1)  # [4, V]
        assert result.logprobs is not None and len(result.logprobs) == 4
        for row, (token, lp) in enumerate(zip(greedy, result.logprobs, strict=True)):
            assert lp.logprob == pytest.approx(reference[row, token].item(), abs=1e-4)
            assert lp.top_token_ids[0] == token  # greedy: the emitted token is the most likely
            assert len(lp.top_token_ids) == 2
        assert engine.verify("s", [], None, Stopwatch()).logprobs is None  # not asked: none
        with pytest.raises(InvalidArgument, match="logprobs"):
            engine.verify("s", [], None, Stopwatch(), logprobs=21)
    finally:
        engine.stop()


def test_a_sampling_rows_logprobs_are_the_raw_distributions_not_the_warped_one(target_runner: ModelRunner) -> None:
    """vLLM's default: log-probabilities of the model's own distribution, before temperature (here 5)."""
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size))
    prompt = target_runner.tokenizer("def add(a, b):")["input_ids"]
    try:
        hot = SamplingConfig(temperature=5.0, seed=3)
        engine.prefill("s", prompt, hot, RescueConfig(Mode.AR, 0.01, 6), Stopwatch())
        result = engine.verify("s", [], None, Stopwatch(), logprobs=1)
        with torch.no_grad():
            logits = target_runner.model(input_ids=torch.tensor([prompt])).logits[0, -1]  # [V]
        raw = torch.log_softmax(logits.float(), dim=-1)
        assert result.logprobs is not None
        (lp,) = result.logprobs
        assert lp.logprob == pytest.approx(raw[result.next_token].item(), abs=1e-4)
        assert lp.top_token_ids == (int(raw.argmax()),)
        warped = torch.log_softmax(logits.float() / 5.0, dim=-1)[result.next_token].item()
        assert abs(lp.logprob - warped) > 1e-2  # not what the sampler drew from
    finally:
        engine.stop()


def test_a_round_mixing_rows_with_and_without_rules_reports_each_rows_raw_logprobs(target_runner: ModelRunner) -> None:
    """One batched round of four rows: logit rules with log-probabilities (twice, different biases), the same
    prompt without rules, rules without log-probabilities. Each reporting row's numbers are the raw logits' (vLLM's
    `raw_logprobs`: before its rules), under its own index (wave 61: the raw copies are a batch of their own)."""
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size))
    prompt = target_runner.tokenizer("def add(a, b):")["input_ids"]
    rescue = RescueConfig(Mode.AR, 0.01, 6)
    biases = {"a": ((7, 100.0),), "b": None, "c": ((9, 100.0),), "d": ((11, 100.0),)}
    try:
        for name, bias in biases.items():
            output = SessionOutput.of(None, LogitRules(logit_bias=bias) if bias else None, 0)
            engine.prefill(name, prompt, SamplingConfig(), rescue, Stopwatch(), output=output)
        asks = {"a": 3, "b": 3, "c": None, "d": 3}
        rows = [_Row(engine.sessions.get(name), [], None, Stopwatch(), asks[name]) for name in biases]
        results = dict(zip(biases, engine._round(rows), strict=True))
        with torch.no_grad():
            raw = torch.log_softmax(target_runner.model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
        assert [results[name].next_token for name in biases] == [7, int(raw.argmax()), 9, 11]  # the rules held
        assert results["c"].logprobs is None
        for name in ("a", "b", "d"):
            logprobs = results[name].logprobs
            assert logprobs is not None
            (lp,) = logprobs
            assert lp.logprob == pytest.approx(raw[results[name].next_token].item(), abs=1e-4), name
            assert lp.top_token_ids == tuple(raw.topk(3).indices.tolist()), name
    finally:
        engine.stop()


def _prompt_reference(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    """[T-1, V]: each prompt token's distribution from one forward over the whole prompt (position i predicts i+1)."""
    with torch.no_grad():
        logits = runner.model(input_ids=torch.tensor([prompt])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("chunk", [None, 3])  # the prompt's forward in one piece, or in chunks of 3 positions
def test_prompt_logprobs_are_one_forward_over_the_prompt_and_ignore_a_cached_prefix(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, chunk: int | None
) -> None:
    """Each prompt token from the second, under the tokens before it; a prefix cache that holds the prompt (its
    logits never kept) is not used for a session that asks, and the session then decodes as any other."""
    from calispec_core import modeling
    from calispec_core.prefix_cache import PrefixCache

    if chunk is not None:
        monkeypatch.setattr(modeling, "PREFILL_CHUNK", chunk)
    cache = PrefixCache(min_reused=1)
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size), prefix_cache=cache)
    prompt = target_runner.tokenizer("def add(a, b):\n    return")["input_ids"]
    reference = _prompt_reference(target_runner, prompt)
    sd = RescueConfig(Mode.SD, 0.01, 6)
    try:
        assert engine.prefill("warm", prompt, SamplingConfig(), sd, Stopwatch()) is None  # not asked: none
        engine.verify("warm", [], None, Stopwatch())  # its prompt rode in this round, which stored it
        hits = cache.stats.hits
        got = engine.prefill("s", prompt, SamplingConfig(), sd, Stopwatch(), prompt_logprobs=3)
        assert cache.stats.hits == hits  # computed whole, not attached
        engine.prefill("hit", prompt, SamplingConfig(), sd, Stopwatch())
        engine.verify("hit", [], None, Stopwatch())  # its prompt rides: attached in its first round
        assert cache.stats.hits == hits + 1  # where a session that does not ask reuses it
        assert got is not None and len(got) == len(prompt) - 1
        for row, (token, lp) in enumerate(zip(prompt[1:], got, strict=True)):
            assert lp.logprob == pytest.approx(reference[row, token].item(), abs=1e-4)
            assert list(lp.top_token_ids) == reference[row].topk(3).indices.tolist()
            assert lp.top_logprobs == pytest.approx(reference[row].topk(3).values.tolist(), abs=1e-4)
        step = engine.verify("s", [], None, Stopwatch())
        assert step.next_token == _greedy(target_runner, prompt, 1)[0]
        assert engine.prefill("one", prompt[:1], SamplingConfig(), sd, Stopwatch(), prompt_logprobs=0) == []
        with pytest.raises(InvalidArgument, match="prompt_logprobs"):
            engine.prefill("bad", prompt, SamplingConfig(), sd, Stopwatch(), prompt_logprobs=21)
        assert "bad" not in engine.sessions
    finally:
        engine.stop()
