"""γ for the members of a lockstep round: wave 6's cap, the shared draft phase, and the group's phase."""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.cost_model import MIN_GAIN, CostCurve, CostModel, GammaPolicy
from coordinator.round_plan import Wish, alone, group_phase, median_cap, phase_length, shared_phase


def adaptive(gamma: int, limit: int = 10, floor: int = 0, reach: int = 0) -> Wish:
    return Wish(gamma, True, limit, floor, reach)


def test_the_phase_is_the_drafting_members_lower_median_wish() -> None:
    assert phase_length([adaptive(1), adaptive(3), adaptive(10), Wish.fixed(6), adaptive(0)]) == 3
    assert phase_length([adaptive(0), Wish.fixed(0)]) == 0  # nobody drafts: no phase
    assert phase_length([adaptive(4)]) == 4  # alone: its own wish


def test_wave6_rule_caps_only_the_adaptive_members() -> None:
    wishes = [adaptive(1), adaptive(3), adaptive(10), Wish.fixed(6), adaptive(0)]
    assert median_cap(wishes) == [1, 3, 3, 6, 0]


def test_every_adaptive_member_drafts_the_shared_phase_within_its_bounds() -> None:
    """Rows that would sit the phase out (or stop short) draft its length: wave 29's trace at concurrency 8 had
    rows whose drafts passed 70-80 % of the time at γ = 0 while code rows drafted 3 for the whole group."""
    wishes = [adaptive(3), adaptive(3), adaptive(0), adaptive(1), adaptive(0, limit=1), Wish.fixed(6), Wish.fixed(0)]
    assert shared_phase(wishes) == [3, 3, 3, 3, 1, 6, 0]  # the last adaptive row has one token of room left
    assert shared_phase([adaptive(0, limit=0), adaptive(2)]) == [0, 2]  # the draft circuit skips the first
    assert shared_phase([adaptive(0, floor=2), adaptive(1), adaptive(1)]) == [2, 1, 1]  # a probe keeps its floor


def test_nobody_drafts_unless_some_member_chose_to() -> None:
    assert shared_phase([adaptive(0)] * 8) == [0] * 8
    assert shared_phase([adaptive(0)] * 7 + [Wish.fixed(0)]) == [0] * 8


def test_a_fixed_gamma_member_draws_nobody_into_drafting() -> None:
    """A request that fixed γ (a seeded one gets 6) drafts what it asked; the adaptive rows' phase comes from their
    own wishes (counting it, seven rows whose cost model said no would have drafted 6 each)."""
    assert shared_phase([adaptive(0)] * 7 + [Wish.fixed(6)]) == [0] * 7 + [6]
    assert shared_phase([adaptive(2), adaptive(0), Wish.fixed(6)]) == [2, 2, 6]
    assert median_cap([adaptive(0)] * 7 + [Wish.fixed(6)]) == [0] * 7 + [6]  # wave 6: the same here


def test_a_lone_member_drafts_what_it_chose() -> None:
    for gamma in range(11):
        assert shared_phase([adaptive(gamma)]) == median_cap([adaptive(gamma)]) == [gamma]


def test_a_lone_member_that_drafts_reaches_as_far_as_its_path_floor_may_take_it() -> None:
    """Wave 33: alone, an adaptive member that chose to draft drafts up to its reach (within its limit) and lets
    the path floor stop the proposal; one that chose not to stays at 0; a fixed γ and any group keep the rule."""
    for plan in (median_cap, shared_phase, partial(group_phase, amx_like())):
        assert plan([adaptive(3, reach=10)]) == [10]
        assert plan([adaptive(3, limit=5, reach=10)]) == [5]  # its room
        assert plan([adaptive(0, reach=10)]) == [0]  # its cost model said no
        assert plan([adaptive(6, reach=4)]) == [6]  # never below its own choice
        assert plan([Wish(3, False, 3, 3, 10)]) == [3]  # a fixed γ is what the request asked
    for plan in (median_cap, shared_phase):  # (the group phase plans a group by its costs: tests below)
        assert plan([adaptive(3, reach=10), adaptive(3, reach=10)]) == [3, 3]  # a group waits for nobody's reach
    assert alone(adaptive(2, reach=0)) == 2  # no reach: its γ


def test_a_round_the_group_drafted_counts_as_measured_acceptance() -> None:
    """A member whose own policy said γ = 0 but whose round drafted for it learnt its acceptance there: its next
    probe waits a whole interval again."""
    costs = CostModel(CostCurve.of({1: 147.0, 8: 160.0, 17: 210.0}), CostCurve.of({1: 29.0}), draft_call_ms=3.0)
    policy = GammaPolicy(costs, max_gamma=10)
    policy.tracker.prior = 0.05  # alone it would not draft; better acceptance would pay: it probes now and then
    policy.tracker.examined = 8
    assert [policy.next_gamma() for _ in range(5)] == [0] * 5
    policy.observe(drafted=2, accepted=0)  # the shared phase drafted for it (both rejected)
    assert [policy.next_gamma() for _ in range(8)] == [0] * 8  # without the reset it probed after 3 more


def amx_like() -> CostModel:
    """Wave 37's AMX CPU at concurrency 8: a verify of 8 rows 213-290 ms for 8-64 tokens, a draft step of 8 rows 50."""
    return CostModel(CostCurve.of({1: 213.0, 16: 215.0, 64: 290.0}), CostCurve.of({1: 35.0, 8: 50.0}))


def avx2_like() -> CostModel:
    """A CPU without bf16 units in float32: every verified token costs about as much as the first."""
    return CostModel(CostCurve.of({1: 380.0, 16: 5600.0}), CostCurve.of({1: 60.0}))


def sure(alpha: float, limit: int = 10) -> Wish:
    """An adaptive member whose drafts pass with probability alpha."""
    return Wish(1, True, limit, 0, 0, alpha)


def test_the_group_phase_has_the_length_with_the_most_tokens_per_ms_for_the_whole_round() -> None:
    """Wave 37 (AMX, concurrency 8): every row drafting 3 ran 1.48x `ar`, wave 6's rule 1.12-1.15x. With members
    alike the plan is everyone drafting the length that maximises the group's rate (the formula, by hand)."""
    costs, wishes = amx_like(), [sure(0.8)] * 8
    rate = {n: _rate(costs, [0.8] * 8, [n] * 8) for n in range(11)}
    assert group_phase(costs, wishes) == [max(rate, key=rate.__getitem__)] * 8
    assert 2 <= group_phase(costs, wishes)[0] <= 6  # a flat verify and a cheap batched step: drafting pays, not to 10
    assert group_phase(costs, [sure(0.95)] * 8)[0] > group_phase(costs, [sure(0.6)] * 8)[0]  # better drafts: longer


def test_members_whose_drafts_rarely_pass_sit_the_phase_out() -> None:
    """Wave 29's trace: rows at 0.5 drafting beside rows at 0.9 cost the group draft rows and verified tokens for
    little; the plan drafts with the best members first and adds a member only where that raises the group's rate."""
    costs = amx_like()
    alphas = [0.95, 0.9, 0.9, 0.85, 0.3, 0.2, 0.1, 0.05]
    plan = group_phase(costs, [sure(a) for a in alphas])
    length = plan[0]
    assert length >= 2 and plan[:4] == [length] * 4 and plan[-1] == 0
    drafting = [g for g in plan if g]
    assert all(g == length for g in drafting)  # one phase length
    assert plan == sorted(plan, reverse=True)  # the better a member's drafts, the likelier it drafts
    everyone = _rate(costs, alphas, [length] * 8)
    assert _rate(costs, alphas, plan) >= everyone
    best = max(_rate(costs, alphas, [n] * k + [0] * (8 - k)) for n in range(1, 11) for k in range(1, 9))
    assert _rate(costs, alphas, plan) == best  # the best (L, k) by hand


def test_the_group_phase_is_a_plain_round_where_verifying_more_tokens_costs_as_much_as_decoding_them() -> None:
    assert group_phase(avx2_like(), [sure(0.8)] * 8) == [0] * 8
    assert group_phase(amx_like(), [sure(0.05)] * 8) == [0] * 8  # drafts that never pass


def test_the_group_phase_keeps_bounds_probes_and_fixed_members() -> None:
    costs = amx_like()
    wishes = [sure(0.8), sure(0.8, limit=1), Wish(0, True, 0, 0, 0), Wish.fixed(6), Wish(0, True, 10, 4, 0, 0.1)]
    plan = group_phase(costs, wishes)
    assert plan[0] >= 2
    assert plan[1:4] == [1, 0, 6]  # its room, a skipped draft, a fixed γ
    assert plan[4] >= 4  # a probe drafts at least its floor


def test_the_group_drafts_only_where_that_beats_a_plain_round_by_min_gain() -> None:
    """As alone (CostModel.best_gamma): a plan that drafts must beat the plain round's rate by MIN_GAIN, so an
    acceptance whose best drafting plan is only 0-3 % better than a plain round drafts nothing."""
    costs = amx_like()
    plain = _rate(costs, [0.0] * 8, [0] * 8)  # 8 tokens, whatever the acceptance

    def best(alpha: float) -> float:  # the best plan: the first k members drafting L
        return max(_rate(costs, [alpha] * 8, [n] * k + [0] * (8 - k)) for n in range(1, 11) for k in range(1, 9))

    alphas = [x / 200 for x in range(1, 200)]
    gap = [a for a in alphas if plain < best(a) <= plain * MIN_GAIN]
    assert gap  # the case is reachable on these costs
    assert all(group_phase(costs, [sure(a)] * 8) == [0] * 8 for a in gap)
    assert all(group_phase(costs, [sure(a)] * 8) != [0] * 8 for a in alphas if best(a) > plain * MIN_GAIN)


def test_a_member_without_an_acceptance_is_priced_at_the_pairs() -> None:
    costs = amx_like()
    costs.acceptance = 0.8
    assert group_phase(costs, [Wish(1, True, 10)] * 8) == group_phase(costs, [sure(0.8)] * 8)


def _rate(costs: CostModel, alphas: list[float], plan: list[int]) -> float:
    """The group's expected tokens per ms (round_plan._Tally.rate's formula, by hand)."""
    tokens = sum(1 + sum(a ** (k + 1) for k in range(g)) for a, g in zip(alphas, plan, strict=True))
    drafting = sum(costs.draft_ms(1, sum(1 for g in plan if g >= k)) for k in range(1, max(plan) + 1))
    call = costs.draft_call_ms if max(plan) else 0.0
    verify = costs.target_ms(sum(g + 1 for g in plan), len(plan))
    return tokens / (drafting + call + verify + costs.overhead_ms)


def _best_plan_by_hand(costs: CostModel, wishes: list[Wish]) -> list[int]:
    """Wave 37's search, every candidate (L, k) priced from scratch by `_rate`."""
    alphas = [costs.acceptance if w.alpha is None else w.alpha for w in wishes]
    plain = [w.floor if w.adaptive else w.gamma for w in wishes]
    best, best_rate = plain, _rate(costs, alphas, plain) * MIN_GAIN
    ranked = sorted((i for i, w in enumerate(wishes) if w.adaptive), key=lambda i: -alphas[i])
    for length in range(1, max((wishes[i].limit for i in ranked), default=0) + 1):
        plan = list(plain)
        for i in ranked:
            plan[i] = max(min(length, wishes[i].limit), wishes[i].floor)
            if (rate := _rate(costs, alphas, plan)) > best_rate:
                best, best_rate = list(plan), rate
    return best


member = st.one_of(
    st.builds(Wish.fixed, st.integers(0, 10)),
    st.builds(
        lambda limit, floor, alpha: Wish(1, True, limit, floor, 0, alpha),  # a probe's floor may pass its limit
        st.integers(0, 10), st.integers(0, 3), st.one_of(st.none(), st.floats(0.0, 1.0)),
    ),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(member, min_size=2, max_size=12), st.sampled_from(["amx", "avx2"]))
def test_the_group_phase_kept_up_to_date_member_by_member_plans_what_pricing_each_plan_afresh_does(
    wishes: list[Wish], machine: str
) -> None:
    """Wave 38 made the group phase the default and keeps each candidate's sums up to date as members join
    (round_plan._Tally) instead of summing every member again for each of ~γ_max × members candidates."""
    costs = amx_like() if machine == "amx" else avx2_like()
    plan = group_phase(costs, wishes)
    expected = _best_plan_by_hand(costs, wishes)
    if plan != expected:  # only a tie within rounding may differ: then both plans price the same
        alphas = [costs.acceptance if w.alpha is None else w.alpha for w in wishes]
        assert _rate(costs, alphas, plan) == pytest.approx(_rate(costs, alphas, expected), rel=1e-12)
