"""The γ policy on hand-given costs and acceptance: when speculation pays, and how far."""

from __future__ import annotations

import pytest

from coordinator.cost_model import (
    MAX_PROBE_INTERVAL,
    PROBE_EVERY,
    AcceptanceTracker,
    CostCurve,
    CostModel,
    CurvesByRows,
    GammaPolicy,
    LearnedCurve,
    expected_tokens,
)


def model(target: dict[int, float], draft_per_token: float, overhead: float = 0.0) -> CostModel:
    costs = CostModel(CostCurve.of(target), CostCurve.of({1: draft_per_token}), draft_call_ms=0.0)
    costs.overhead_ms = overhead
    return costs


# the README's measured shapes: bf16 on AVX512-BF16 (flat) and float32 on the same CPU (3.2x for 7 tokens)
FLAT = {1: 192.0, 7: 215.0, 17: 260.0}
STEEP = {1: 382.0, 7: 1224.0, 17: 2600.0}


def test_expected_tokens_is_the_truncated_geometric_sum() -> None:
    assert expected_tokens(0, 0.5) == 1.0
    assert expected_tokens(2, 0.5) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(3, 1.0) == 4.0


def test_curve_interpolates_and_extrapolates_linearly() -> None:
    curve = CostCurve.of({1: 10.0, 5: 30.0})
    assert curve.at(1) == 10.0 and curve.at(3) == 20.0 and curve.at(9) == 50.0
    assert CostCurve.of({1: 4.0}).at(3) == 12.0  # one point: a per-token cost


def test_curve_never_falls_with_more_tokens() -> None:
    noisy = CostCurve.of({1: 48.6, 2: 38.5})  # a start-up timing with a dip (measured on the real draft)
    assert noisy.at(2) == 48.6 and noisy.at(6) == 48.6  # not extrapolated down to ~0
    assert CostCurve.of({1: 10.0, 4: 8.0, 8: 20.0}).at(4) == 10.0


def test_drafting_costs_one_draft_forward_per_token_whatever_the_reported_curve() -> None:
    """Regression: the draft reports one forward of 1 and of 2 new tokens; drafting γ tokens is γ
    one-token forwards. Read as one γ-token forward, a noisy {1: 48.6, 2: 38.5} extrapolated to ~0
    for γ >= 6, the online scale grew to ~1e8, and γ flipped between 0 and 10 (measured)."""
    costs = CostModel(CostCurve.of(FLAT), CostCurve.of({1: 48.6, 2: 38.5}), draft_call_ms=0.0)
    assert costs.draft_ms(6) == pytest.approx(6 * 48.6)
    for _ in range(30):
        costs.observe_draft(tokens=6, forward_ms=6 * 45.0, service_ms=6 * 45.0, call_ms=6 * 45.0)
    assert costs.draft_ms(1) == pytest.approx(45.0, rel=0.01)
    assert costs.draft_ms(3) == pytest.approx(135.0, rel=0.01)
    assert costs.best_gamma(alpha=0.5, max_gamma=10) > 0  # drafting pays here (target(7) ≈ target(1))


def test_flat_verification_and_good_acceptance_speculate_far() -> None:
    assert model(FLAT, draft_per_token=40.0).best_gamma(alpha=0.8, max_gamma=10) >= 4


def test_verification_linear_in_tokens_never_pays_even_with_a_cheap_draft() -> None:
    costs = model({1: 100.0, 17: 1700.0}, draft_per_token=5.0)
    assert costs.best_gamma(alpha=1.0, max_gamma=16) == 0


def test_steep_verification_pays_only_with_a_cheap_draft_and_high_acceptance() -> None:
    assert model(STEEP, draft_per_token=382.0).best_gamma(alpha=0.95, max_gamma=10) == 0
    assert model(STEEP, draft_per_token=40.0).best_gamma(alpha=0.5, max_gamma=10) == 0
    assert model(STEEP, draft_per_token=40.0).best_gamma(alpha=0.95, max_gamma=10) > 0


def test_low_acceptance_turns_drafting_off_even_where_verification_is_cheap() -> None:
    costs = model(FLAT, draft_per_token=80.0)
    assert costs.best_gamma(alpha=0.9, max_gamma=10) > 0
    assert costs.best_gamma(alpha=0.1, max_gamma=10) == 0


def test_gamma_grows_with_acceptance() -> None:
    costs = model(FLAT, draft_per_token=40.0)
    gammas = [costs.best_gamma(alpha, 16) for alpha in (0.5, 0.7, 0.9)]
    assert gammas == sorted(gammas) and gammas[0] < gammas[-1]


def test_online_observations_rescale_the_curve_towards_what_is_measured() -> None:
    costs = model(FLAT, draft_per_token=40.0)
    for _ in range(30):  # under load the draft got 4x dearer than at start-up
        costs.observe_draft(tokens=4, forward_ms=640.0, service_ms=640.0, call_ms=640.0)
    assert costs.draft_ms(1) == pytest.approx(160.0, rel=0.01)
    assert costs.best_gamma(alpha=0.7, max_gamma=10) < model(FLAT, 40.0).best_gamma(alpha=0.7, max_gamma=10)


def test_a_proposal_that_waited_for_its_batch_is_priced_by_its_own_forwards() -> None:
    """Regression: a one-token proposal in a batch whose longest proposal took 6 steps spends 6 steps
    in the service. Priced by service time, the draft looked 6x dearer and γ fell to 0."""
    costs = model(FLAT, draft_per_token=40.0)
    for _ in range(30):
        costs.observe_draft(tokens=1, forward_ms=40.0, service_ms=6 * 40.0, call_ms=6 * 40.0 + 1.0)
    assert costs.draft_ms(1) == pytest.approx(40.0, rel=0.01)
    assert costs.draft_call_ms == pytest.approx(1.0, rel=0.01)


def test_acceptance_tracker_counts_the_failed_position_and_leans_on_the_prior_early() -> None:
    tracker = AcceptanceTracker(prior=0.5)
    assert tracker.alpha == 0.5
    for _ in range(40):
        tracker.observe(drafted=4, accepted=1)  # one pass, one failure per round
    assert tracker.alpha == pytest.approx(0.5, abs=0.05)
    for _ in range(40):
        tracker.observe(drafted=4, accepted=4)  # recent rounds weigh more: the text got easier
    assert tracker.alpha > 0.9


def test_policy_probes_after_target_only_rounds_only_where_acceptance_could_change_the_answer() -> None:
    payable = GammaPolicy(model(FLAT, draft_per_token=80.0), max_gamma=10)
    payable.tracker.prior = 0.05  # looks hopeless now, but good acceptance would pay: probe now and then
    payable.tracker.examined = PROBE_EVERY  # on enough evidence (else it probes sooner: the next test)
    chosen = [payable.next_gamma() for _ in range(PROBE_EVERY + 1)]
    assert chosen[:PROBE_EVERY] == [0] * PROBE_EVERY and chosen[-1] > 0
    hopeless = GammaPolicy(model(STEEP, draft_per_token=382.0), max_gamma=10)
    assert [hopeless.next_gamma() for _ in range(3 * PROBE_EVERY)] == [0] * (3 * PROBE_EVERY)


def probe_intervals(policy: GammaPolicy, rounds: int, accepted: int = 0) -> list[int]:
    """Target-only rounds before each probe over `rounds` rounds, every probe keeping `accepted` drafts."""
    intervals, streak = [], 0
    for _ in range(rounds):
        gamma = policy.next_gamma()
        streak += 1
        if gamma:
            intervals.append(streak - 1)
            streak = 0
        policy.observe(drafted=gamma, accepted=min(accepted, gamma))
    return intervals


def test_a_request_probes_sooner_while_its_acceptance_rests_on_few_drafts() -> None:
    policy = GammaPolicy(model(FLAT, draft_per_token=80.0), max_gamma=10)
    policy.tracker.prior = 0.05  # looks hopeless, on one examined draft: probe after two plain rounds
    policy.observe(drafted=3, accepted=0)
    assert [policy.next_gamma() for _ in range(3)] == [0, 0, 2]


def test_fruitless_probes_back_off_and_a_paying_one_resets_the_interval() -> None:
    """Prose on the coder pair (wave 16): probes every <= 8 rounds that never paid cost it 5-10 % of `ar`."""
    policy = GammaPolicy(model(FLAT, draft_per_token=80.0), max_gamma=10)
    policy.tracker.prior = 0.05
    intervals = probe_intervals(policy, 400)  # every probe fails
    assert intervals == sorted(intervals) and intervals[0] < PROBE_EVERY
    assert intervals[-1] == MAX_PROBE_INTERVAL and len(intervals) < 400 // PROBE_EVERY
    while not (gamma := policy.next_gamma()):
        policy.observe(drafted=0, accepted=0)
    policy.tracker = AcceptanceTracker(prior=0.95)  # the text turned draftable: the probe passes, drafting pays
    policy.observe(drafted=gamma, accepted=gamma)
    assert policy.next_gamma() > 0
    policy.tracker = AcceptanceTracker(prior=0.05)
    assert probe_intervals(policy, 40)[0] < PROBE_EVERY  # hopeless again: probes start over on evidence


def test_a_probe_that_keeps_every_draft_ends_the_backoff() -> None:
    policy = GammaPolicy(model(FLAT, draft_per_token=80.0), max_gamma=10)
    policy.tracker.prior = 0.05
    assert probe_intervals(policy, 400)[-1] == MAX_PROBE_INTERVAL  # backed off all the way
    while not (gamma := policy.next_gamma()):
        policy.observe(drafted=0, accepted=0)
    policy.observe(drafted=gamma, accepted=gamma)  # kept every draft; one probe is not enough to pay
    assert policy.next_gamma() == 0
    policy.observe(drafted=0, accepted=0)
    assert probe_intervals(policy, 40)[0] < PROBE_EVERY  # the next probe comes on evidence, not after 32


def test_only_a_failed_probe_backs_off() -> None:
    """A probe that drafted nothing (the draft's circuit open, the last token) or kept every draft (acceptance
    climbing back towards paying, which takes a few) leaves the interval alone; a normal round's failure too."""
    policy = GammaPolicy(model(FLAT, draft_per_token=80.0), max_gamma=10)
    policy.tracker.prior, policy.tracker.examined = 0.05, PROBE_EVERY
    for outcome in ("none drafted", "all kept"):
        chosen = []
        for _ in range(3 * (PROBE_EVERY + 1)):
            gamma = policy.next_gamma()
            chosen.append(gamma)
            drafted = 0 if outcome == "none drafted" else gamma
            policy.observe(drafted=drafted, accepted=drafted)
        drafting = [i for i, g in enumerate(chosen) if g]
        assert drafting[:2] == [PROBE_EVERY, 2 * PROBE_EVERY + 1]  # the interval did not double
        if outcome == "none drafted":
            assert drafting[2] == 3 * PROBE_EVERY + 2
        else:  # two probes that kept everything, and drafting pays on its own
            assert drafting[2:] == list(range(drafting[1] + 1, len(chosen)))
        policy.tracker = AcceptanceTracker(prior=0.05)
        policy.tracker.examined = PROBE_EVERY
    policy.observe(drafted=4, accepted=0)  # not a probe: the request's own drafting round failed
    assert [policy.next_gamma() for _ in range(PROBE_EVERY + 1)][-1] > 0


def test_a_proposal_that_first_catches_up_after_target_only_rounds_does_not_inflate_the_draft_cost() -> None:
    from calispec_core.sampling import SamplingConfig
    from calispec_core.timing import Deadline
    from coordinator.engine import Orchestrator
    from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
    from tests.unit.test_orchestrator import alphabet_target, params

    class CatchUpDraft(FakeDraft):
        """A catch-up (many appended tokens) takes a second; a normal proposal 2 µs."""

        def propose(self, session_id, num_tokens, rollback_to, append, timeout, *early_stop, **hints):
            proposal = super().propose(session_id, num_tokens, rollback_to, append, timeout, *early_stop, **hints)
            return type(proposal)(proposal.token_ids, b"", 128, 10**9 if len(append) > 1 else 2_000)

    costs = model(FLAT, draft_per_token=40.0)
    orchestrator = Orchestrator(
        CharTokenizer(), CatchUpDraft(alphabet_target), [FakeTarget(alphabet_target)], (EOS,), 4096, costs=costs
    )
    script = iter([3, 0, 0, 0, 0] + [3] * 40)  # drafting, target-only rounds, drafting again (a catch-up)
    orchestrator._gamma = lambda request: next(script)  # type: ignore[method-assign]
    list(orchestrator.generate("c", params(max_new_tokens=40, num_speculative_tokens=None,
                                           sampling=SamplingConfig()), Deadline(60)))  # fmt: skip
    assert costs.draft_ms(1) < 1.0  # observed: microseconds per token, not the catch-up's second


def test_a_proposal_whose_step_computed_a_riding_prompt_does_not_inflate_the_draft_cost() -> None:
    """A short prompt's draft prefill rides in its session's first Propose (calispec_core/modeling.py
    prefill_session), in a step every session of the batch waits for: the draft reports that step's time as
    prefill_ns, and such a proposal, the session's own first or another's beside it, is no per-token cost."""
    from dataclasses import replace

    from calispec_core.sampling import SamplingConfig
    from calispec_core.timing import Deadline
    from coordinator.engine import Orchestrator
    from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
    from tests.unit.test_orchestrator import alphabet_target, params

    class RidingDraft(FakeDraft):
        """The first two proposals share a step with a riding prompt (their own, then another session's): a second
        each, reported as prefill_ns; the others 2 µs."""

        def propose(self, session_id, num_tokens, rollback_to, append, timeout, *early_stop, **hints):
            proposal = super().propose(session_id, num_tokens, rollback_to, append, timeout, *early_stop, **hints)
            riding = len(self.proposals) <= 2
            ns = 10**9 if riding else 2_000
            return replace(proposal, service_ns=ns, forward_ns=ns, prefill_ns=ns if riding else 0)

    costs = model(FLAT, draft_per_token=40.0)
    orchestrator = Orchestrator(
        CharTokenizer(), RidingDraft(alphabet_target), [FakeTarget(alphabet_target)], (EOS,), 4096, costs=costs
    )
    orchestrator._gamma = lambda request: 3  # type: ignore[method-assign]
    list(orchestrator.generate("c", params(max_new_tokens=40, num_speculative_tokens=None,
                                           sampling=SamplingConfig()), Deadline(60)))  # fmt: skip
    assert costs.draft_ms(1) < 1.0  # microseconds per token, not the riding steps' second


def test_a_finished_request_moves_the_pair_wide_acceptance_towards_its_own() -> None:
    """Wave 33: since wave 16 the engine fed every finished request's `stats.acceptance_rate` before `_final_stats`
    set it, so each request taught the pair-wide prior an acceptance of 0 (0.6, 0.48, 0.38, ... in a DEBUG trace)
    and new requests started their rounds expecting their drafts to fail."""
    from calispec_core.timing import Deadline
    from coordinator.cost_model import COST_EMA, PRIOR_ACCEPTANCE
    from coordinator.engine import Orchestrator
    from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
    from tests.unit.test_orchestrator import alphabet_target, params

    costs = model(FLAT, draft_per_token=40.0)
    orchestrator = Orchestrator(
        CharTokenizer(), FakeDraft(alphabet_target), [FakeTarget(alphabet_target)], (EOS,), 4096, costs=costs
    )
    for prompt in ("a", "b", "c"):  # a perfect draft: every request's acceptance is 1
        list(orchestrator.generate(prompt, params(max_new_tokens=12, num_speculative_tokens=3), Deadline(60)))
    assert costs.acceptance == pytest.approx(1 - (1 - PRIOR_ACCEPTANCE) * (1 - COST_EMA) ** 3)  # three steps to 1


def test_acceptance_by_position_follows_where_rounds_fail() -> None:
    tracker = AcceptanceTracker(prior=0.6)
    for _ in range(40):  # every other round fails at its first draft, the others pass all four
        tracker.observe(drafted=4, accepted=0)
        tracker.observe(drafted=4, accepted=4)
    first, *later = tracker.alphas(4)
    assert first < 0.7  # 0.5 seen over ~10 rounds (the decay), shrunk towards the overall ~0.9
    assert all(alpha > first + 0.15 for alpha in later)  # 1.0 seen, shrunk towards the position before


def test_a_position_never_reached_inherits_the_last_reached_one() -> None:
    tracker = AcceptanceTracker(prior=0.6)
    for _ in range(10):
        tracker.observe(drafted=2, accepted=2)
    alphas = tracker.alphas(6)
    assert alphas[2:] == pytest.approx([alphas[1]] * 4)


def test_bursty_acceptance_speculates_further_than_one_overall_alpha_would() -> None:
    """A request whose drafts, once past the first, almost always pass: a single α (the overall
    rate) predicts short rounds; the per-position estimate sees the long runs."""
    policy = GammaPolicy(model(FLAT, draft_per_token=40.0), max_gamma=10)
    for _ in range(30):
        policy.tracker.observe(drafted=6, accepted=0)
        policy.tracker.observe(drafted=6, accepted=6)
        policy.tracker.observe(drafted=6, accepted=5)
    overall = policy.costs.best_gamma(policy.tracker.alpha, max_gamma=10)
    assert policy.next_gamma() > overall


# bf16 1.5B target on 2 AVX512-BF16 cores: flat to ~8 new tokens, then compute-bound (start-up curve
# to 64 tokens); the int8 draft's batched step by sessions
LOADED_TARGET = {1: 231.0, 8: 259.0, 12: 317.0, 17: 349.0, 32: 520.0, 64: 900.0}
BATCHED_DRAFT = {1: 33.0, 8: 60.0}


def test_a_batch_of_rows_is_priced_as_one_forward_of_all_their_tokens() -> None:
    costs = CostModel(CostCurve.of(LOADED_TARGET), CostCurve.of(BATCHED_DRAFT), draft_call_ms=0.0)
    assert costs.round_ms(3, batch=8) == pytest.approx(3 * 60.0 + 520.0 + costs.overhead_ms)
    assert costs.round_ms(0, batch=8) == pytest.approx(259.0 + costs.overhead_ms)


def test_a_loaded_compute_bound_target_drafts_shorter_but_still_drafts() -> None:
    costs = CostModel(CostCurve.of(LOADED_TARGET), CostCurve.of(BATCHED_DRAFT), draft_call_ms=0.0)
    alone, loaded = costs.best_gamma(0.8, 10, batch=1), costs.best_gamma(0.8, 10, batch=8)
    assert 0 < loaded < alone


def test_the_batch_follows_what_the_target_reports() -> None:
    costs = CostModel(CostCurve.of(LOADED_TARGET), CostCurve.of(BATCHED_DRAFT), draft_call_ms=0.0)
    alone = costs.best_gamma(0.8, 10)
    for _ in range(30):  # eight sessions per verify forward, each verifying 3 tokens in 520 ms
        costs.observe_target(tokens=3, ms=520.0 * 24 / 32 + 259.0 * 8 / 32, batch=8)
    assert costs.batch == pytest.approx(8.0, rel=0.02)
    assert costs.best_gamma(0.8, 10) == costs.best_gamma(0.8, 10, batch=8) < alone


# the float32 1.5B target on the AVX2 EPYC (2 threads): start-up timed 2 new tokens at 1.39x one token
# (and 4 no dearer than 2), rounds and `bench forward` at ~1.15x
STARTUP_AVX2 = {1: 480.0, 2: 667.0, 4: 667.0, 8: 777.0}


def test_rounds_correct_a_start_up_point_that_timed_badly() -> None:
    curve = LearnedCurve(CostCurve.of(STARTUP_AVX2))
    for _ in range(60):
        curve.observe(1, 450.0)
        curve.observe(2, 520.0)
    assert curve.at(1) == pytest.approx(450.0, rel=0.03)
    assert curve.at(2) / curve.at(1) == pytest.approx(520.0 / 450.0, rel=0.03)


def test_observations_at_one_count_move_the_level_and_keep_the_measured_shape() -> None:
    curve = LearnedCurve(CostCurve.of(STARTUP_AVX2))
    for _ in range(30):  # the host got twice as slow; rounds only ever measured one token
        curve.observe(1, 960.0)
    assert curve.at(1) == pytest.approx(960.0, rel=0.01)
    assert curve.at(8) == pytest.approx(2 * 777.0, rel=0.01)


def test_observations_between_points_bend_both_and_beyond_the_last_only_the_last() -> None:
    curve = LearnedCurve(CostCurve.of({1: 100.0, 2: 200.0, 4: 400.0}))
    curve.observe(1, 100.0)  # the level, seen
    curve.observe(3, 150.0)  # half of what the curve predicts, between the points 2 and 4
    assert curve.shape[0] == 1.0 and curve.shape[1] < 1.0 and curve.shape[2] < 1.0
    beyond = LearnedCurve(CostCurve.of({1: 100.0, 2: 200.0, 4: 400.0}))
    beyond.observe(1, 100.0)
    beyond.observe(9, 450.0)
    assert beyond.shape[:2] == [1.0, 1.0] and beyond.shape[2] < 1.0


def test_a_corrected_curve_drafts_where_the_start_up_timing_said_drafting_loses() -> None:
    """Measured on the AVX2 EPYC: a code prompt ran 16 of its first 20 rounds target-only at an
    acceptance near 0.5 because the start-up curve priced 2-4 new tokens at 1.39x one token."""
    costs = CostModel(CostCurve.of(STARTUP_AVX2), CostCurve.of({1: 75.0}), draft_call_ms=0.0)
    costs.overhead_ms = 1.0
    assert costs.best_gamma(alpha=0.45, max_gamma=10) == 0
    for _ in range(40):
        costs.observe_target(tokens=1, ms=450.0)
        costs.observe_target(tokens=2, ms=520.0)
        costs.observe_target(tokens=3, ms=540.0)
    assert costs.best_gamma(alpha=0.45, max_gamma=10) > 0


def test_a_batch_is_priced_by_the_tokens_the_target_reports_for_it() -> None:
    """In lockstep a row verifying 4 tokens shares its forward with rows that drafted nothing: 8 rows
    of 1 + 3 + ... tokens, not 8 x 4. The count the target reports is where the curve learns."""
    reported = LearnedCurve(CostCurve.of(LOADED_TARGET))
    costs = CostModel(CostCurve.of(LOADED_TARGET), CostCurve.of(BATCHED_DRAFT), draft_call_ms=0.0)
    costs.observe_target(tokens=1, ms=231.0)  # the level, seen (the 8-row class starts as a copy of it)
    reported.observe(1, 231.0)
    for _ in range(30):  # 8 rows, 12 new tokens in all, as fast as the start-up curve's 12 points
        costs.observe_target(tokens=4, ms=317.0, batch=8, batch_tokens=12)
        reported.observe(12, 317.0)
    assert costs.target_ms(12, rows=8) == pytest.approx(reported.at(12)) == pytest.approx(317.0, rel=0.02)
    assert costs.target_ms(32, rows=8) == pytest.approx(520.0, rel=0.02)  # 8 x 4 tokens: not what was measured


def test_a_lone_row_and_a_batch_of_the_same_tokens_learn_apart() -> None:
    """One row of 12 tokens is a cheaper forward than 8 rows of 12 tokens in all (each row has its own attention
    and cache writes): each size class of batch learns its own, so a lone request's verifies leave the price of
    an 8-row round alone; a class no forward has reported yet is priced by the nearest measured one."""
    costs = CostModel(CostCurve.of(LOADED_TARGET), CostCurve.of(BATCHED_DRAFT), draft_call_ms=0.0)
    for _ in range(30):
        costs.observe_target(tokens=12, ms=317.0 * 1.2, batch=8, batch_tokens=12)  # 8 rows: dearer than one row
    group = costs.target_ms(12, rows=8)
    assert group == pytest.approx(317.0 * 1.2, rel=0.02)
    assert costs.target_ms(12, rows=6) == group  # 5-8 rows: one class
    assert costs.target_ms(12, rows=2) == group  # only 5-8 rows measured: not the start-up curve (317)
    assert costs.target_ms(12) == group  # a lone row too, before its first forward
    for _ in range(30):
        costs.observe_target(tokens=12, ms=317.0 * 0.9, batch=1)  # a lone request's verifies of 12 tokens
    assert costs.target_ms(12, rows=8) == group  # did not move the 8-row price
    assert costs.target_ms(12) == pytest.approx(317.0 * 0.9, rel=0.02)
    for _ in range(30):
        costs.observe_target(tokens=6, ms=317.0, batch=2, batch_tokens=12)  # 2 rows
    assert costs.target_ms(12, rows=2) == pytest.approx(317.0, rel=0.02)
    assert costs.target_ms(12, rows=3) == group  # 3-4 rows: as near to 2 rows as to 5-8; the larger, dearer class


def test_a_new_size_class_starts_from_the_nearest_measured_one() -> None:
    """A class's first forward moves a copy of its neighbour's learned curve by the usual step, instead of setting
    the class's price from that one forward alone."""
    costs = CostModel(CostCurve.of(LOADED_TARGET), CostCurve.of(BATCHED_DRAFT), draft_call_ms=0.0)
    for _ in range(30):
        costs.observe_target(tokens=12, ms=317.0 * 2.0, batch=8, batch_tokens=12)
    costs.observe_target(tokens=6, ms=317.0, batch=3, batch_tokens=12)  # one fast forward of 3 rows
    three_rows = costs.target_ms(12, rows=3)
    assert 317.0 * 1.5 < three_rows < 317.0 * 2.0  # moved from the 8-row price, not set to the one forward's 317


def test_batch_sizes_round_half_up_to_their_class() -> None:
    assert [CurvesByRows.size_class(r) for r in (0, 1, 1.4, 1.5, 2, 2.5, 3, 4, 4.5, 5, 8, 8.5, 9, 16)] == [
        0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4,
    ]  # fmt: skip
