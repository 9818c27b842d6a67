"""Prefills that ride: a short prompt computes nothing at Prefill, its KV comes with the session's first batched
forward (calispec_core/modeling.py `prefill_session`, `settle_riders`, `store_riders`), on the tiny float32 pair."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from calispec_core.generation import Mode
from calispec_core.modeling import ModelRunner, prefill_session
from calispec_core.prefix_cache import PrefixCache
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from draft_service.proposer import Proposer
from target_service.engine import RescueConfig, TargetEngine
from target_service.pair_table import PairTable
from tests.helpers import bench_compare_service_flag
from tests.unit.test_prefix_cache import counting_forwards, prompt

SD = RescueConfig(Mode.SD, 0.01, 6)


def test_a_short_prompt_computes_nothing_at_prefill_and_a_long_one_all_but_its_last_token(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = counting_forwards(target_runner, monkeypatch)
    tokens = prompt(0, 12, target_runner.vocab_size)
    riding = prefill_session(target_runner, "r", tokens, ride_tokens=12)
    assert fed == [] and riding.pending() == tokens and riding.riding_prefix == tokens[:-1]
    eager = prefill_session(target_runner, "e", tokens, ride_tokens=11)  # one token longer than rides
    assert fed == [11] and eager.pending() == tokens[-1:] and eager.riding_prefix is None
    asked = prefill_session(target_runner, "p", tokens, on_logits=lambda logits, start: None, ride_tokens=12)
    assert fed == [11, 11] and asked.riding_prefix is None  # prompt log-probabilities need the prompt's own forward


@contextmanager
def _eager_and_riding(runner: ModelRunner) -> Iterator[tuple[TargetEngine, TargetEngine, PrefixCache]]:
    """A target engine that prefills every prompt on its own, and one whose short prompts ride (with a prefix cache)."""
    eager = TargetEngine(runner, 4, PairTable(runner.vocab_size), ride_prefill_tokens=0)
    cache = PrefixCache(min_reused=1)
    riding = TargetEngine(runner, 4, PairTable(runner.vocab_size), prefix_cache=cache)
    try:
        yield eager, riding, cache
    finally:
        eager.stop()
        riding.stop()


def _greedy_tokens(engine: TargetEngine, session_id: str, tokens: list[int], rounds: int) -> list[int]:
    engine.prefill(session_id, tokens, SamplingConfig(), SD, Stopwatch())
    return [engine.verify(session_id, [], None, Stopwatch()).next_token for _ in range(rounds)]


def test_a_riding_prompt_decodes_as_a_prefilled_one_and_fills_the_prefix_cache(target_runner: ModelRunner) -> None:
    tokens = prompt(1, 30, target_runner.vocab_size)
    with _eager_and_riding(target_runner) as (eager, riding, cache):
        reference = _greedy_tokens(eager, "e", tokens, 6)
        assert _greedy_tokens(riding, "first", tokens, 6) == reference
        assert cache.cached_tokens == len(tokens) - 1 and cache.stats.hits == 0  # stored by its first round
        (stored,) = cache._entries.values()  # the prompt's KV only, not the round's tokens after it
        assert {keys.shape[-2] for keys, _ in stored} == {len(tokens) - 1}
        assert _greedy_tokens(riding, "again", tokens, 6) == reference  # attached in its first round
        assert cache.stats.hits == 1 and cache.stats.reused_tokens == len(tokens) - 1


@pytest.mark.parametrize("failing", ["attach", "store"])
def test_a_failing_prefix_cache_neither_fails_nor_corrupts_a_riding_round(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The cache only saves work: a copy that fails (out of memory) inside a round must cost the reuse, not the round
    (before: the error failed the round after its forward had extended the caches, or left a cache part-filled)."""
    tokens = prompt(5, 30, target_runner.vocab_size)
    with _eager_and_riding(target_runner) as (eager, riding, cache):
        reference = _greedy_tokens(eager, "e", tokens, 4)
        if failing == "attach":
            assert _greedy_tokens(riding, "warm", tokens, 1) == reference[:1]  # stored: the next one attaches
        real = getattr(cache, failing)

        def fails(prompt_ids: list[int], kv_cache: object) -> None:
            real(prompt_ids, kv_cache)  # an attach that fills the cache's layers, then fails
            raise MemoryError("no room for the copy")

        monkeypatch.setattr(cache, failing, fails)
        assert _greedy_tokens(riding, "s", tokens, 4) == reference


def test_a_draft_rollback_before_the_first_proposal_rides_only_what_is_left_of_the_prompt(
    draft_runner: ModelRunner,
) -> None:
    """A rollback into a riding prompt: its first Propose must attach (from the prefix cache) and compute only the
    tokens the session still has. Before: the whole prompt's stored prefix was attached to a shorter session."""
    tokens = prompt(2, 20, draft_runner.vocab_size)
    kept, appended = 8, [7]
    riding = Proposer(draft_runner, max_sessions=4, prefix_cache=PrefixCache(min_reused=1))
    eager = Proposer(draft_runner, max_sessions=4, ride_prefill_tokens=0)
    try:
        riding.prefill("warm", tokens, SamplingConfig(), Stopwatch())
        riding.propose("warm", 3, None, [], Stopwatch())  # its prompt rode, and went into the prefix cache
        riding.prefill("x", tokens, SamplingConfig(), Stopwatch())
        got = riding.propose("x", 4, kept, appended, Stopwatch())
        eager.prefill("y", tokens[:kept] + appended, SamplingConfig(), Stopwatch())
        assert got.token_ids == eager.propose("y", 4, None, [], Stopwatch()).token_ids
    finally:
        riding.stop()
        eager.stop()


def test_a_draft_step_that_computes_a_riding_prompt_is_reported_to_every_row_of_it(draft_runner: ModelRunner) -> None:
    """The coordinator learns the draft's per-token cost from each proposal's forward time: a step that also
    computed a riding prompt is reported apart (prefill_ns), for every session that waited for it."""
    from draft_service.proposer import _Job

    proposer = Proposer(draft_runner, max_sessions=4)
    try:
        proposer.prefill("old", prompt(3, 20, draft_runner.vocab_size), SamplingConfig(), Stopwatch())
        first = proposer.propose("old", 3, None, [], Stopwatch())  # its own prompt rides in its first step
        assert 0 < first.prefill_ns < first.forward_ns
        assert proposer.propose("old", 3, None, [], Stopwatch()).prefill_ns == 0  # nothing rides any more
        proposer.prefill("new", prompt(4, 20, draft_runner.vocab_size), SamplingConfig(), Stopwatch())
        jobs = [_Job(proposer.sessions.get(s), 3, 0.0, draft_runner.logit_columns) for s in ("old", "new")]
        beside, riding = proposer._draft_batch(jobs)
        assert 0 < beside.prefill_ns == riding.prefill_ns < beside.forward_ns  # "old" waited for "new"'s prompt
    finally:
        proposer.stop()


def test_the_flag_maps_onto_both_model_services_and_bench_compare(tmp_path: Path) -> None:
    import draft_service.__main__ as draft_cli
    import target_service.__main__ as target_cli
    from calispec_core.limits import DEFAULT_RIDE_PREFILL_TOKENS

    base = ["--model", "m"]
    assert target_cli.parse_config(base)[0].ride_prefill_tokens == DEFAULT_RIDE_PREFILL_TOKENS
    assert target_cli.parse_config([*base, "--ride-prefill-tokens", "0"])[0].ride_prefill_tokens == 0
    assert draft_cli.parse_config([*base, "--ride-prefill-tokens", "64"])[0].ride_prefill_tokens == 64
    with pytest.raises(SystemExit):
        draft_cli.parse_config([*base, "--ride-prefill-tokens", "-1"])
    assert bench_compare_service_flag(tmp_path, "--ride-prefill-tokens") is None  # the services' own default
    assert bench_compare_service_flag(tmp_path, "--ride-prefill-tokens", "--ride-prefill-tokens", "0") == "0"
