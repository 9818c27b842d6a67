"""Prompt KV reused across sessions (calispec_core/prefix_cache.py), on the tiny float32 target."""

from __future__ import annotations

import random

import pytest
import torch

from calispec_core.modeling import ModelRunner, Session, prefill_session
from calispec_core.prefix_cache import PrefixCache
from calispec_core.service_cli import add_model_args


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def next_logits(runner: ModelRunner, session: Session) -> torch.Tensor:
    return runner.forward(session.pending(), session.cache, logits_to_keep=1)[0, -1]


def counting_forwards(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Token counts of every forward the runner makes from now on."""
    fed: list[int] = []
    original = runner.forward

    def forward(token_ids: list[int], cache, logits_to_keep: int):  # type: ignore[no-untyped-def]
        fed.append(len(token_ids))
        return original(token_ids, cache, logits_to_keep)

    monkeypatch.setattr(runner, "forward", forward)
    return fed


def test_a_repeated_prompt_prefills_nothing_and_predicts_bit_identically(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = prompt(0, 40, target_runner.vocab_size)
    cache = PrefixCache(1024)
    first = prefill_session(target_runner, "a", tokens, cache)
    fed = counting_forwards(target_runner, monkeypatch)
    second = prefill_session(target_runner, "b", tokens, cache)
    assert fed == [] and cache.stats.hits == 1 and cache.stats.reused_tokens == 39
    assert second.cached_len == first.cached_len == 39
    assert torch.equal(next_logits(target_runner, second), next_logits(target_runner, first))


def test_a_shared_start_prefills_only_the_rest(target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    system = prompt(1, 30, target_runner.vocab_size)
    a, b = system + prompt(2, 12, target_runner.vocab_size), system + prompt(3, 9, target_runner.vocab_size)
    cache = PrefixCache(1024)
    prefill_session(target_runner, "a", a, cache)
    fed = counting_forwards(target_runner, monkeypatch)
    reused = prefill_session(target_runner, "b", b, cache)
    assert sum(fed) == len(b) - 1 - 30  # only the part after the shared start
    fresh = prefill_session(target_runner, "c", b)
    torch.testing.assert_close(next_logits(target_runner, reused), next_logits(target_runner, fresh))


def test_sessions_never_write_into_a_stored_entry(target_runner: ModelRunner) -> None:
    tokens = prompt(4, 32, target_runner.vocab_size)
    cache = PrefixCache(1024)
    session = prefill_session(target_runner, "a", tokens, cache)
    stored = [(k.clone(), v.clone()) for k, v in next(iter(cache._entries.values()))]
    user = prefill_session(target_runner, "b", tokens, cache)  # starts from a copy of the entry
    for step in range(3):  # decode, then roll back into the shared part, then decode again
        user.tokens.append(int(next_logits(target_runner, user).argmax()))
        if step == 1:
            user.truncate(20)
    entry = next(iter(cache._entries.values()))
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(entry, stored, strict=True))
    assert session.cached_len == 31


def test_the_cache_is_bounded_and_drops_the_least_recently_used(target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    cache = PrefixCache(max_tokens=70)
    a, b, c = (prompt(seed, 31, vocab) for seed in (5, 6, 7))  # 30 cached tokens each
    prefill_session(target_runner, "a", a, cache)
    prefill_session(target_runner, "b", b, cache)
    prefill_session(target_runner, "a2", a, cache)  # a is used again: b is now the oldest
    prefill_session(target_runner, "c", c, cache)
    assert cache.cached_tokens <= 70
    assert [len(k) for k in cache._entries] == [30, 30] and tuple(b[:-1]) not in cache._entries


def test_short_common_starts_and_a_disabled_cache_reuse_nothing(target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    cache = PrefixCache(1024, min_reused=16)
    base = prompt(8, 30, vocab)
    prefill_session(target_runner, "a", base, cache)
    prefill_session(target_runner, "b", base[:10] + prompt(9, 20, vocab), cache)
    assert cache.stats.hits == 0
    off = PrefixCache(0)
    prefill_session(target_runner, "c", base, off)
    prefill_session(target_runner, "d", base, off)
    assert off.stats.hits == 0 and off.cached_tokens == 0


def test_the_flag_maps_onto_both_model_services() -> None:
    import draft_service.__main__ as draft_cli
    import target_service.__main__ as target_cli

    base = ["--model", "m"]
    assert target_cli.parse_config([*base, "--prefix-cache-tokens", "0"])[0].prefix_cache_tokens == 0
    assert draft_cli.parse_config([*base, "--prefix-cache-tokens", "512"])[0].prefix_cache_tokens == 512
    parser = __import__("argparse").ArgumentParser()
    add_model_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--prefix-cache-tokens", "-1"])
