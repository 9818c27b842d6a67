"""Drafting for several sessions in one forward per step gives each session its own proposal."""

from __future__ import annotations

import pytest
import torch

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.prefix_cache import PrefixCache
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from draft_service.proposer import Proposer, _Job
from tests.conftest import TinyPair

PROMPTS = [[5, 17, 42, 8, 99], [3], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]  # different lengths, one empty cache


def proposer_with_sessions(runner: ModelRunner, prefix: str, sampling: SamplingConfig | None = None) -> Proposer:
    proposer = Proposer(runner, max_sessions=8)
    for i, prompt in enumerate(PROMPTS):
        proposer.prefill(f"{prefix}{i}", prompt, sampling or SamplingConfig(), Stopwatch())
    return proposer


def job(
    proposer: Proposer, session_id: str, num_tokens: int, min_confidence: float = 0.0, min_path_confidence: float = 0.0
) -> _Job:
    state = proposer.sessions.get(session_id)
    return _Job(state, num_tokens, min_confidence, proposer.runner.logit_columns, min_path_confidence)


@pytest.fixture(scope="module")
def pruned_draft(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu"), output_vocab=256)


@pytest.mark.parametrize("pruned", [False, True], ids=["full-layer", "pruned-layer"])
@torch.inference_mode()
def test_batched_greedy_proposals_equal_sequential_ones(request: pytest.FixtureRequest, pruned: bool) -> None:
    draft_runner: ModelRunner = request.getfixturevalue("pruned_draft" if pruned else "draft_runner")
    alone = proposer_with_sessions(draft_runner, "a")
    sequential = [alone.propose(f"a{i}", 5, None, [], Stopwatch()).token_ids for i in range(len(PROMPTS))]
    together = proposer_with_sessions(draft_runner, "b")
    jobs = [job(together, f"b{i}", 5) for i in range(len(PROMPTS))]
    batched = [p.token_ids for p in together._draft_batch(jobs)]
    assert batched == sequential
    # the sessions carry on from their own proposals: a second batched round still matches
    again = [alone.propose(f"a{i}", 3, None, [], Stopwatch()).token_ids for i in range(len(PROMPTS))]
    jobs = [job(together, f"b{i}", 3) for i in range(len(PROMPTS))]
    assert [p.token_ids for p in together._draft_batch(jobs)] == again
    alone.stop()
    together.stop()


@torch.inference_mode()
def test_an_early_stop_ends_one_sessions_proposal_while_the_batch_goes_on(draft_runner: ModelRunner) -> None:
    proposer = proposer_with_sessions(draft_runner, "c")
    jobs = [job(proposer, f"c{i}", 4, 1.0 if i == 1 else 0.0) for i in range(len(PROMPTS))]
    lengths = [len(p.token_ids) for p in proposer._draft_batch(jobs)]
    assert lengths == [4, 1, 4]  # confidence below 1.0 always: one token, then stop
    proposer.stop()


@torch.inference_mode()
@pytest.mark.parametrize(
    "sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=7)], ids=["greedy", "seeded"]
)
def test_a_failed_batch_leaves_every_session_as_it_was(
    draft_runner: ModelRunner, monkeypatch, sampling: SamplingConfig
) -> None:
    """Seeded: the rerun draws what a run without the failure draws (the generators were not rewound)."""
    import draft_service.proposer as proposer_module

    proposer = proposer_with_sessions(draft_runner, "d", sampling)
    before = [list(proposer.sessions.get(f"d{i}").session.tokens) for i in range(len(PROMPTS))]
    fresh = proposer_with_sessions(draft_runner, "e", sampling)
    expected = [fresh.propose(f"e{i}", 3, None, [], Stopwatch()).token_ids for i in range(len(PROMPTS))]
    real, steps = proposer_module.forward_rows, []

    def failing_second_step(*args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            raise RuntimeError("out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(proposer_module, "forward_rows", failing_second_step)
    jobs = [job(proposer, f"d{i}", 3, min_path_confidence=1e-30) for i in range(len(PROMPTS))]  # tracked, never met
    with pytest.raises(RuntimeError):
        proposer._draft_batch(jobs)
    assert [list(proposer.sessions.get(f"d{i}").session.tokens) for i in range(len(PROMPTS))] == before
    assert all(not job.tokens and job.path == 1.0 for job in jobs)  # the first step's probabilities forgotten
    monkeypatch.setattr(proposer_module, "forward_rows", real)
    assert [p.token_ids for p in proposer._draft_batch(jobs)] == expected  # the cache was rolled back too
    proposer.stop()


def test_a_rollback_past_the_context_is_refused_and_changes_nothing(draft_runner: ModelRunner) -> None:
    """Propose checked the context; Rollback did not: repeated appends grew a session without bound (and it
    could no longer propose)."""
    from calispec_core.errors import InvalidArgument

    proposer = proposer_with_sessions(draft_runner, "r")
    session = proposer.sessions.get("r0").session
    before = list(session.tokens)
    with pytest.raises(InvalidArgument, match="exceed the context"):
        proposer.rollback("r0", len(before), [7] * draft_runner.max_context)
    assert session.tokens == before
    assert proposer.rollback("r0", len(before), [7]) == len(before) + 1  # within the context: fine
    proposer.stop()


@pytest.fixture(scope="module")
def int8_draft(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))


@torch.inference_mode()
def test_a_seeded_sampling_row_of_an_int8_draft_drafts_the_same_beside_other_rows(int8_draft: ModelRunner) -> None:
    """An int8 layer quantises a call's activations on one scale: the seeded row's q, and the tokens drawn from it,
    hung on the rows batched with it, so a seeded `sd` request's output changed under load (found by probing)."""
    seeded = SamplingConfig(temperature=1.0, seed=7)
    alone = Proposer(int8_draft, max_sessions=8)
    alone.prefill("s", PROMPTS[0], seeded, Stopwatch())
    expected = alone.propose("s", 5, None, [], Stopwatch())
    beside = proposer_with_sessions(int8_draft, "g")  # greedy sessions, batched together
    beside.prefill("s", PROMPTS[0], seeded, Stopwatch())
    jobs = [job(beside, "s", 5), *(job(beside, f"g{i}", 5) for i in range(len(PROMPTS)))]
    got = beside._draft_batch(jobs)[0]
    assert got.token_ids == expected.token_ids and got.token_probs == expected.token_probs
    assert got.sparse is not None and expected.sparse is not None
    assert (got.sparse.probs == expected.sparse.probs).all()
    alone.stop()
    beside.stop()


@torch.inference_mode()
@pytest.mark.parametrize("ride", [128, 0], ids=["riding-prompt", "prefilled-prompt"])
def test_a_seeded_sampling_row_of_an_int8_draft_takes_no_cached_prefix(int8_draft: ModelRunner, ride: int) -> None:
    """A cached prefix holds the KV of the calls that computed it (their activation scale): a seeded row that took
    one drafted differently after other prompts had run (found by review)."""
    seeded, prompt = SamplingConfig(temperature=1.0, seed=7), [5, 17, 42, 8, 99] * 12
    cold = Proposer(int8_draft, max_sessions=8, ride_prefill_tokens=ride)
    cold.prefill("s", prompt, seeded, Stopwatch())
    expected = cold.propose("s", 5, None, [], Stopwatch()).token_ids
    warm = Proposer(int8_draft, max_sessions=8, prefix_cache=PrefixCache(min_reused=1), ride_prefill_tokens=ride)
    for i, other in enumerate([prompt[:41], [3, 4]]):  # a prefix of the prompt stored, computed beside another row
        warm.prefill(f"g{i}", other, SamplingConfig(), Stopwatch())
    warm._draft_batch([job(warm, f"g{i}", 1) for i in range(2)])
    warm.prefill("s", prompt, seeded, Stopwatch())
    assert warm.propose("s", 5, None, [], Stopwatch()).token_ids == expected
    cold.stop()
    warm.stop()


@torch.inference_mode()
def test_greedy_rows_of_an_int8_draft_still_draft_together(int8_draft: ModelRunner, monkeypatch) -> None:
    import draft_service.proposer as proposer_module

    real, widths = proposer_module.forward_rows, []

    def counting(runner, caches, pending, lengths):
        widths.append(len(caches))
        return real(runner, caches, pending, lengths)

    monkeypatch.setattr(proposer_module, "forward_rows", counting)
    together = proposer_with_sessions(int8_draft, "h")
    together._draft_batch([job(together, f"h{i}", 2) for i in range(len(PROMPTS))])
    assert widths == [3, 3]  # one forward a step for the greedy rows
    together.stop()
